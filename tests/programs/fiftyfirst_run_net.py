"""The launcher of the fifty-first training-program style (tests/programs/fiftyfirst_style_train.py),
in the way of PySlowFast's tools/run_net.py: --cfg YAML files, --init_method, --shard_id,
--num_shards, then KEY VALUE overrides merged into the config; launch_job runs train in
NUM_GPUS processes started by torch.multiprocessing.spawn (one process without it), each joining
the group itself (slowfast/utils/multiprocessing.py). --make-data and --make-legacy-checkpoint
write what a capture gives its runs (tests/fixtures/real/capture_fiftyfirst.sh)."""

from __future__ import annotations

import argparse
import os
import sys

import fiftyfirst_style_train as tn
import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Provide SlowFast video training and testing pipeline."
    )
    parser.add_argument("--shard_id", help="The shard id of current node", default=0, type=int)
    parser.add_argument(
        "--num_shards", help="Number of shards using by the job", default=1, type=int
    )
    parser.add_argument(
        "--init_method",
        help="Initialization method, includes TCP or shared file-system",
        default="tcp://localhost:9999",
        type=str,
    )
    parser.add_argument(
        "--cfg", dest="cfg_files", help="Path to the config files", default=[], nargs="+"
    )
    parser.add_argument("--make-data", default="", help="write fake clips and lists there, stop")
    parser.add_argument("--make-legacy-checkpoint", default="", help="write one there, stop")
    parser.add_argument(
        "opts",
        help="See slowfast/config/defaults.py for all options",
        default=None,
        nargs=argparse.REMAINDER,
    )
    if len(sys.argv) == 1:
        parser.print_help()
    return parser.parse_args()


def load_config(args: argparse.Namespace, path_to_config: str | None = None) -> tn.CfgNode:
    cfg = tn.get_cfg()
    if path_to_config is not None:
        cfg.merge_from_file(path_to_config)
    if args.opts is not None:
        cfg.merge_from_list(args.opts)
    cfg.NUM_SHARDS = args.num_shards
    cfg.SHARD_ID = args.shard_id
    if cfg.OUTPUT_DIR:
        os.makedirs(tn.get_checkpoint_dir(cfg.OUTPUT_DIR), exist_ok=True)
    return cfg


def launch_job(cfg: tn.CfgNode, init_method: str, func, daemon: bool = False) -> None:
    if cfg.NUM_GPUS > 1:
        torch.multiprocessing.spawn(
            tn.mpu_run,
            nprocs=cfg.NUM_GPUS,
            args=(
                cfg.NUM_GPUS,
                func,
                init_method,
                cfg.SHARD_ID,
                cfg.NUM_SHARDS,
                cfg.DIST_BACKEND,
                cfg,
            ),
            daemon=daemon,
        )
    else:
        func(cfg=cfg)


def make_data(folder: str, n_train: int = 100, n_val: int = 24) -> None:
    """Fake videos (a few bytes each) and the lists that name them, as Kinetics' CSVs do;
    train_<r>.csv: the same clips pre-sharded in three uneven lists."""
    g = torch.Generator().manual_seed(5)
    vids = os.path.join(folder, "videos")
    os.makedirs(vids, exist_ok=True)
    rows = {}
    for split, n in (("train", n_train), ("val", n_val)):
        labels = torch.randint(0, len(tn.CLASS_NAMES), (n,), generator=g).tolist()
        rows[split] = []
        for i, y in enumerate(labels):
            path = os.path.join(vids, f"{split}_{i:05d}.mp4")
            with open(path, "wb") as f:
                f.write(b"\x00\x00\x00\x18ftypmp42" + (i * 7919 + y).to_bytes(4, "little"))
            rows[split].append(f"videos/{split}_{i:05d}.mp4 {y}")
        with open(os.path.join(folder, f"{split}.csv"), "w") as f:
            f.write("\n".join(rows[split]) + "\n")
    cuts = [0, 36, 72, n_train]  # the pipeline's shards: 36, 36 and 28 clips
    for r in range(3):
        with open(os.path.join(folder, f"train_{r}.csv"), "w") as f:
            f.write("\n".join(rows["train"][cuts[r] : cuts[r + 1]]) + "\n")


def main() -> None:
    args = parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    if args.make_legacy_checkpoint:
        cfg = load_config(args, args.cfg_files[0] if args.cfg_files else None)
        tn.legacy_checkpoint(cfg, args.make_legacy_checkpoint)
        return
    for path_to_config in args.cfg_files:
        cfg = load_config(args, path_to_config)
        if cfg.TRAIN.ENABLE:
            launch_job(cfg=cfg, init_method=args.init_method, func=tn.train)


if __name__ == "__main__":
    main()
