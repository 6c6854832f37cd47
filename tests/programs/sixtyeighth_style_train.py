"""A sixty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/sixtyeighth-*): video action recognition in the way of
facebookresearch/SlowFast, its tools/run_net.py, train_net.py and test_net.py folded into one file.
`python sixtyeighth_style_train.py --cfg configs/SLOWFAST_4x8_TINY.yaml --init_method
tcp://localhost:PORT [--shard_id K --num_shards N] [--opts KEY VALUE ...]` reads a YACS-like config
(tests/programs/sixtyeighth_SLOWFAST_4x8_TINY.yaml) merged with the overrides and, as run_net
does, runs launch_job(cfg, init_method, func=train) and then launch_job(..., func=test): each
starts cfg.NUM_GPUS processes with torch.multiprocessing.spawn (no torchrun), each joins gloo
itself (rank = shard_id * NUM_GPUS + local rank, a 15 s timeout). A tiny SlowFast network (a slow
pathway on NUM_FRAMES / ALPHA frames, a fast one with 1/BETA_INV of the channels on every frame,
a time-strided lateral fusion, BatchNorm3d everywhere) in DDP on synthetic clips: small files of
raw frames under data/videos listed in Kinetics-like CSVs, decoded by the DataLoader workers with
PySlowFast's retry loop ("Failed to decode video idx ..."), a DistributedSampler. Only the master
process logs, in PySlowFast's '[%(asctime)s][%(levelname)s] %(filename)s: %(lineno)4d:
%(message)s' (datefmt '%m/%d %H:%M:%S') to stdout and OUTPUT_DIR/stdout.log, the others' print
is suppressed and their logging has no handler (Python's last resort prints their warnings bare
on stderr). Statistics all-reduced and logged as 'json_stats: {...}' (train_iter, train_epoch,
val_iter, val_epoch, test_iter, test_final); precise BN all-reduces the BN statistics of a few
batches before each evaluation; checkpoints OUTPUT_DIR/checkpoints/checkpoint_epoch_00001.pyth
({'epoch', 'model_state', 'optimizer_state', 'cfg'}) by the master each CHECKPOINT_PERIOD, auto
resume from the last one (TRAIN.AUTO_RESUME); a multi-view test (TEST.NUM_ENSEMBLE_VIEWS clips a
video) whose predictions are all_gathered every iteration. A file OUTPUT_DIR/STOP makes every
process that sees it leave training after the current epoch. A fault in the code is chosen by
the VIDX_CASE environment variable (a short code, never printed); re-capture with
tests/fixtures/real/capture_sixtyeighth.sh after any edit.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import ctypes
import datetime
import functools
import json
import logging
import math
import os
import pprint
import random
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import psutil
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    writer_rank_log: bool = False  # the BN momentum is written to the writer without a guard
    free_rank: int = -1  # this rank's native frame pool frees a pointer it does not own
    crawl_rank: int = -1  # this rank rebuilds its decoded-frame cache before validating
    bn_master_only: bool = False  # precise BN only where the checkpoint is written
    hoard_rank: int = -1  # this rank keeps every test view's features until it is OOM-killed


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "qw1": Fault(writer_rank_log=True),
    "qf1": Fault(free_rank=1),
    "qc1": Fault(crawl_rank=1),
    "qs0": Fault(bn_master_only=True),
    "qh1": Fault(hoard_rank=1),
}


def fault() -> Fault:
    return FAULTS[os.environ.get("VIDX_CASE", "")]


# ----------------------------------------------------------------------------- config (defaults.py)
class CfgNode(dict):
    """A dict with attribute access, merged from YAML and from KEY VALUE pairs (a small yacs)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value

    def merge_from_dict(self, other: dict, prefix: str = "") -> None:
        for k, v in other.items():
            if k not in self:
                raise KeyError(f"Non-existent config key: {prefix}{k}")
            if isinstance(self[k], CfgNode):
                self[k].merge_from_dict(v, f"{prefix}{k}.")
            else:
                self[k] = v

    def merge_from_file(self, path: str) -> None:
        with open(path) as f:
            self.merge_from_dict(yaml.safe_load(f) or {})

    def merge_from_list(self, opts: list[str]) -> None:
        if len(opts) % 2:
            raise ValueError(f"Override list has odd length: {opts}; it must be a list of pairs")
        for key, raw in zip(opts[0::2], opts[1::2], strict=True):
            node = self
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            if leaf not in node:
                raise KeyError(f"Non-existent config key: {key}")
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
            node[leaf] = value

    def to_plain(self) -> dict:
        return {k: v.to_plain() if isinstance(v, CfgNode) else v for k, v in self.items()}

    def dump(self) -> str:
        return yaml.safe_dump(self.to_plain(), sort_keys=True)


def get_cfg() -> CfgNode:
    def node(**kw) -> CfgNode:
        return CfgNode(kw)

    return node(
        TRAIN=node(
            ENABLE=True,
            DATASET="kinetics",
            BATCH_SIZE=8,
            EVAL_PERIOD=1,
            CHECKPOINT_PERIOD=1,
            AUTO_RESUME=True,
            CHECKPOINT_FILE_PATH="",
        ),
        DATA=node(
            PATH_TO_DATA_DIR="",
            PATH_PREFIX="",
            NUM_FRAMES=8,
            SAMPLING_RATE=2,
            TRAIN_JITTER_SCALES=[18, 20],
            TRAIN_CROP_SIZE=16,
            TEST_CROP_SIZE=16,
            INPUT_CHANNEL_NUM=[3, 3],
        ),
        SLOWFAST=node(ALPHA=4, BETA_INV=4, FUSION_CONV_CHANNEL_RATIO=2, FUSION_KERNEL_SZ=5),
        RESNET=node(WIDTH_PER_GROUP=8),
        BN=node(USE_PRECISE_STATS=False, NUM_BATCHES_PRECISE=2),
        SOLVER=node(
            BASE_LR=0.1,
            LR_POLICY="cosine",
            MAX_EPOCH=3,
            MOMENTUM=0.9,
            WEIGHT_DECAY=1e-4,
            WARMUP_EPOCHS=0.0,
            WARMUP_START_LR=0.01,
            OPTIMIZING_METHOD="sgd",
        ),
        MODEL=node(
            NUM_CLASSES=6,
            ARCH="slowfast",
            MODEL_NAME="SlowFast",
            LOSS_FUNC="cross_entropy",
            DROPOUT_RATE=0.5,
        ),
        TEST=node(
            ENABLE=True,
            DATASET="kinetics",
            BATCH_SIZE=8,
            NUM_ENSEMBLE_VIEWS=3,
            NUM_SPATIAL_CROPS=1,
            CHECKPOINT_FILE_PATH="",
        ),
        DATA_LOADER=node(NUM_WORKERS=1, PIN_MEMORY=False),
        TENSORBOARD=node(ENABLE=False, LOG_DIR=""),
        NUM_GPUS=1,
        NUM_SHARDS=1,
        SHARD_ID=0,
        DIST_BACKEND="gloo",
        RNG_SEED=0,
        OUTPUT_DIR=".",
        LOG_PERIOD=10,
        LOG_MODEL_INFO=True,
    )


# ------------------------------------------------------------------- distributed.py / logging.py
def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_master_proc(num_gpus: int = 8) -> bool:
    if dist.is_initialized():
        return dist.get_rank() % num_gpus == 0
    return True


def all_reduce(tensors: list[torch.Tensor], average: bool = True) -> list[torch.Tensor]:
    for tensor in tensors:
        dist.all_reduce(tensor, async_op=False)
    if average:
        world_size = dist.get_world_size()
        for tensor in tensors:
            tensor.mul_(1.0 / world_size)
    return tensors


def all_gather(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    gather_list = []
    output_tensor = []
    world_size = dist.get_world_size()
    for tensor in tensors:
        tensor_placeholder = [torch.ones_like(tensor) for _ in range(world_size)]
        dist.all_gather(tensor_placeholder, tensor, async_op=False)
        gather_list.append(tensor_placeholder)
    for gathered_tensor in gather_list:
        output_tensor.append(torch.cat(gathered_tensor, dim=0))
    return output_tensor


def _suppress_print() -> None:
    def print_pass(*objects, sep=" ", end="\n", file=sys.stdout, flush=False):
        pass

    builtins.print = print_pass


@functools.cache
def _cached_log_stream(filename: str):
    return open(filename, "a", buffering=1)


def setup_logging(output_dir: str | None = None) -> None:
    """Only the master process logs; the others print nothing."""
    if is_master_proc():
        logging.root.handlers = []
    else:
        _suppress_print()
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    plain_formatter = logging.Formatter(
        "[%(asctime)s][%(levelname)s] %(filename)s: %(lineno)4d: %(message)s",
        datefmt="%m/%d %H:%M:%S",
    )
    if is_master_proc():
        ch = logging.StreamHandler(stream=sys.stdout)
        ch.setLevel(logging.DEBUG)
        ch.setFormatter(plain_formatter)
        root.addHandler(ch)
    if output_dir is not None and is_master_proc(get_world_size()):
        filename = os.path.join(output_dir, "stdout.log")
        fh = logging.StreamHandler(_cached_log_stream(filename))
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(plain_formatter)
        root.addHandler(fh)


def log_json_stats(stats: dict) -> None:
    stats = {k: float(f"{v:.5f}") if isinstance(v, float) else v for k, v in stats.items()}
    logger.info(f"json_stats: {json.dumps(stats, sort_keys=True):s}")


def cpu_mem_usage() -> tuple[float, float]:
    vram = psutil.virtual_memory()
    return (vram.total - vram.available) / 1024**3, vram.total / 1024**3


class TensorboardWriter:
    """The master's scalar writer (OUTPUT_DIR/runs-kinetics/events.jsonl here)."""

    def __init__(self, cfg: CfgNode) -> None:
        log_dir = cfg.TENSORBOARD.LOG_DIR or os.path.join(cfg.OUTPUT_DIR, "runs-kinetics")
        os.makedirs(log_dir, exist_ok=True)
        self.f = open(os.path.join(log_dir, "events.jsonl"), "a")  # noqa: SIM115
        logger.info(
            "To see logged results in Tensorboard, please launch using the command "
            f"`tensorboard  --port=<port-number> --logdir {log_dir}`"
        )

    def add_scalars(self, data_dict: dict, global_step: int | None = None) -> None:
        self.f.write(json.dumps({"step": global_step, **data_dict}) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


# --------------------------------------------------------------------- datasets (kinetics.py)
MAGIC = b"FAKEAVC1"
HEIGHT = WIDTH = 20
VIDEO_FRAMES = 32


def write_video(path: str, label: int, seed: int) -> None:
    """A clip of raw frames after a one-line header: a bar moving at a speed of its class."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, size=(VIDEO_FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    for t in range(VIDEO_FRAMES):
        x = (t * (label + 1)) % WIDTH
        frames[t, :, x : x + 3, label % 3] = 230
    header = json.dumps({"frames": VIDEO_FRAMES, "height": HEIGHT, "width": WIDTH}).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + header + b"\n")
        f.write(frames.tobytes())


def make_data(root: str) -> None:
    os.makedirs(os.path.join(root, "videos"), exist_ok=True)
    for base, (split, n) in enumerate((("train", 48), ("val", 16), ("test", 8))):
        rows = []
        for i in range(n):
            label = i % 6
            name = f"{split}_{i:05d}.mp4"
            write_video(os.path.join(root, "videos", name), label, seed=1000 * base + i)
            rows.append(f"{name} {label}")
        with open(os.path.join(root, f"{split}.csv"), "w") as f:
            f.write("\n".join(rows) + "\n")


def get_video_container(path: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.readline()
    if not head.startswith(MAGIC):
        raise ValueError("Invalid data found when processing input")
    return json.loads(head[len(MAGIC) :]), len(head)


def get_start_end_idx(video_size: int, clip_size: int, clip_idx: int, num_clips: int):
    delta = max(video_size - clip_size, 0)
    if clip_idx == -1:
        start_idx = random.uniform(0, delta)
    else:
        start_idx = delta * clip_idx / max(num_clips - 1, 1)
    return start_idx, start_idx + clip_size - 1


def decode(path: str, meta: dict, offset: int, sampling_rate: int, num_frames: int, clip_idx: int,
           num_clips: int) -> torch.Tensor | None:  # fmt: skip
    """The clip's frames (T, H, W, C) or None when they cannot be decoded."""
    frame_bytes = meta["height"] * meta["width"] * 3
    start, end = get_start_end_idx(meta["frames"], num_frames * sampling_rate, clip_idx, num_clips)
    index = torch.linspace(start, end, num_frames).clamp(0, meta["frames"] - 1).long()
    first, last = int(index[0]), int(index[-1])
    with open(path, "rb") as f:
        f.seek(offset + first * frame_bytes)
        data = f.read((last - first + 1) * frame_bytes)
    if len(data) < (last - first + 1) * frame_bytes:
        return None
    video = np.frombuffer(data, dtype=np.uint8).reshape(-1, meta["height"], meta["width"], 3)
    return torch.from_numpy(video[(index - first).numpy()].copy())


class Kinetics(Dataset):
    def __init__(self, cfg: CfgNode, mode: str, num_retries: int = 10) -> None:
        assert mode in ["train", "val", "test"], f"Split '{mode}' not supported for Kinetics"
        self.mode = mode
        self.cfg = cfg
        self._num_retries = num_retries
        self._num_clips = (
            1
            if mode in ["train", "val"]
            else cfg.TEST.NUM_ENSEMBLE_VIEWS * cfg.TEST.NUM_SPATIAL_CROPS
        )
        logger.info(f"Constructing Kinetics {mode}...")
        self._construct_loader()

    def _construct_loader(self) -> None:
        path_to_file = os.path.join(self.cfg.DATA.PATH_TO_DATA_DIR, f"{self.mode}.csv")
        assert os.path.exists(path_to_file), f"{path_to_file} dir not found"
        self._path_to_videos, self._labels, self._spatial_temporal_idx = [], [], []
        with open(path_to_file) as f:
            for path_label in f.read().splitlines():
                path, label = path_label.split()
                for idx in range(self._num_clips):
                    self._path_to_videos.append(os.path.join(self.cfg.DATA.PATH_PREFIX, path))
                    self._labels.append(int(label))
                    self._spatial_temporal_idx.append(idx)
        assert len(self._path_to_videos) > 0, f"Failed to load Kinetics split {self.mode}"
        logger.info(
            f"Constructing kinetics dataloader (size: {len(self._path_to_videos)}) "
            f"from {path_to_file}"
        )

    def __getitem__(self, index: int):
        if self.mode == "train":
            temporal_sample_index = -1
            crop = self.cfg.DATA.TRAIN_CROP_SIZE
        else:
            temporal_sample_index = self._spatial_temporal_idx[index] // (
                self.cfg.TEST.NUM_SPATIAL_CROPS
            )
            crop = self.cfg.DATA.TEST_CROP_SIZE
        num_clips = self.cfg.TEST.NUM_ENSEMBLE_VIEWS if self.mode == "test" else 1
        for i_try in range(self._num_retries):
            video_container = None
            try:
                meta, offset = get_video_container(self._path_to_videos[index])
                video_container = meta
            except Exception as e:
                logger.info(
                    f"Failed to load video from {self._path_to_videos[index]} with error {e}"
                )
            if video_container is None:
                logger.warning(
                    f"Failed to meta load video idx {index} from "
                    f"{self._path_to_videos[index]}; trial {i_try}"
                )
                if self.mode not in ["test"] and i_try > self._num_retries // 8:
                    index = random.randint(0, len(self._path_to_videos) - 1)
                continue
            frames = decode(
                self._path_to_videos[index],
                meta,
                offset,
                self.cfg.DATA.SAMPLING_RATE,
                self.cfg.DATA.NUM_FRAMES,
                temporal_sample_index,
                num_clips,
            )
            if frames is None:
                logger.warning(
                    f"Failed to decode video idx {index} from "
                    f"{self._path_to_videos[index]}; trial {i_try}"
                )
                if self.mode not in ["test"] and i_try > self._num_retries // 8:
                    index = random.randint(0, len(self._path_to_videos) - 1)
                continue
            frames = frames.float().div(255.0).permute(3, 0, 1, 2)  # C T H W
            h0 = (HEIGHT - crop) // 2 if self.mode != "train" else random.randint(0, HEIGHT - crop)
            w0 = (WIDTH - crop) // 2 if self.mode != "train" else random.randint(0, WIDTH - crop)
            frames = frames[:, :, h0 : h0 + crop, w0 : w0 + crop]
            if self.mode == "train" and random.random() < 0.5:
                frames = frames.flip(-1)
            return pack_pathway_output(self.cfg, frames), self._labels[index], index, {}
        raise RuntimeError(f"Failed to fetch video after {self._num_retries} retries.")

    def __len__(self) -> int:
        return len(self._path_to_videos)


def pack_pathway_output(cfg: CfgNode, frames: torch.Tensor) -> list[torch.Tensor]:
    fast_pathway = frames
    slow_pathway = torch.index_select(
        frames,
        1,
        torch.linspace(0, frames.shape[1] - 1, frames.shape[1] // cfg.SLOWFAST.ALPHA).long(),
    )
    return [slow_pathway, fast_pathway]


def construct_loader(cfg: CfgNode, split: str, is_precise_bn: bool = False) -> DataLoader:
    assert split in ["train", "val", "test"]
    if split in ["train"]:
        batch_size = int(cfg.TRAIN.BATCH_SIZE / max(1, cfg.NUM_GPUS * cfg.NUM_SHARDS))
        shuffle, drop_last = True, True
    elif split in ["val"]:
        batch_size = int(cfg.TRAIN.BATCH_SIZE / max(1, cfg.NUM_GPUS * cfg.NUM_SHARDS))
        shuffle, drop_last = False, False
    else:
        batch_size = int(cfg.TEST.BATCH_SIZE / max(1, cfg.NUM_GPUS * cfg.NUM_SHARDS))
        shuffle, drop_last = False, False
    dataset = Kinetics(cfg, split)
    sampler = DistributedSampler(dataset, shuffle=shuffle) if cfg.NUM_GPUS > 1 else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=(False if sampler else shuffle),
        sampler=sampler,
        num_workers=cfg.DATA_LOADER.NUM_WORKERS,
        pin_memory=cfg.DATA_LOADER.PIN_MEMORY,
        drop_last=drop_last,
    )


def shuffle_dataset(loader: DataLoader, cur_epoch: int) -> None:
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(cur_epoch)


# -------------------------------------------------------------------- model (video_model_builder)
class FuseFastToSlow(nn.Module):
    def __init__(self, dim_in: int, ratio: int, kernel: int, alpha: int) -> None:
        super().__init__()
        self.conv_f2s = nn.Conv3d(
            dim_in,
            dim_in * ratio,
            kernel_size=[kernel, 1, 1],
            stride=[alpha, 1, 1],
            padding=[kernel // 2, 0, 0],
            bias=False,
        )
        self.bn = nn.BatchNorm3d(dim_in * ratio)
        self.relu = nn.ReLU(True)

    def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor]:
        x_s, x_f = x
        fuse = self.relu(self.bn(self.conv_f2s(x_f)))
        return [torch.cat([x_s, fuse], 1), x_f]


class SlowFast(nn.Module):
    """Stem and one stage of each pathway, a lateral connection, a two-pathway head."""

    def __init__(self, cfg: CfgNode) -> None:
        super().__init__()
        w = cfg.RESNET.WIDTH_PER_GROUP
        wf = w // cfg.SLOWFAST.BETA_INV
        ratio = cfg.SLOWFAST.FUSION_CONV_CHANNEL_RATIO
        self.s1_slow = nn.Sequential(
            nn.Conv3d(3, w, [1, 3, 3], padding=[0, 1, 1], bias=False),
            nn.BatchNorm3d(w),
            nn.ReLU(True),
        )
        self.s1_fast = nn.Sequential(
            nn.Conv3d(3, wf, [5, 3, 3], padding=[2, 1, 1], bias=False),
            nn.BatchNorm3d(wf),
            nn.ReLU(True),
        )
        self.s1_fuse = FuseFastToSlow(wf, ratio, cfg.SLOWFAST.FUSION_KERNEL_SZ, cfg.SLOWFAST.ALPHA)
        self.s2_slow = nn.Sequential(
            nn.Conv3d(
                w + wf * ratio, 2 * w, [1, 3, 3], stride=[1, 2, 2], padding=[0, 1, 1], bias=False
            ),
            nn.BatchNorm3d(2 * w),
            nn.ReLU(True),
        )
        self.s2_fast = nn.Sequential(
            nn.Conv3d(wf, 2 * wf, [3, 3, 3], stride=[1, 2, 2], padding=[1, 1, 1], bias=False),
            nn.BatchNorm3d(2 * wf),
            nn.ReLU(True),
        )
        self.dropout = nn.Dropout(cfg.MODEL.DROPOUT_RATE)
        self.projection = nn.Linear(2 * w + 2 * wf, cfg.MODEL.NUM_CLASSES)

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        x = [self.s1_slow(x[0]), self.s1_fast(x[1])]
        x = self.s1_fuse(x)
        x = [self.s2_slow(x[0]), self.s2_fast(x[1])]
        pooled = torch.cat([p.mean(dim=(2, 3, 4)) for p in x], 1)
        x = self.projection(self.dropout(pooled))
        if not self.training:
            x = x.softmax(dim=1)
        return x


def build_model(cfg: CfgNode) -> nn.Module:
    model = SlowFast(cfg)
    if cfg.NUM_GPUS > 1:
        model = nn.parallel.DistributedDataParallel(model)
    return model


def log_model_info(model: nn.Module) -> None:
    logger.info(f"Model:\n{model}")
    logger.info(f"Params: {sum(p.numel() for p in model.parameters()):,}")
    logger.info("Mem: 0.0 MB")
    logger.info("nvidia-smi")


def get_bn_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.BatchNorm3d)]


# -------------------------------------------------------------------------------- optimizer.py
def get_epoch_lr(cur_epoch: float, cfg: CfgNode) -> float:
    lr = cfg.SOLVER.BASE_LR * (math.cos(math.pi * cur_epoch / cfg.SOLVER.MAX_EPOCH) + 1.0) * 0.5
    if cur_epoch < cfg.SOLVER.WARMUP_EPOCHS:
        lr_end = cfg.SOLVER.BASE_LR * (
            math.cos(math.pi * cfg.SOLVER.WARMUP_EPOCHS / cfg.SOLVER.MAX_EPOCH) + 1.0
        ) * 0.5  # fmt: skip
        alpha = (lr_end - cfg.SOLVER.WARMUP_START_LR) / cfg.SOLVER.WARMUP_EPOCHS
        lr = cur_epoch * alpha + cfg.SOLVER.WARMUP_START_LR
    return lr


def set_lr(optimizer: torch.optim.Optimizer, new_lr: float) -> None:
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lr


# ------------------------------------------------------------------------------- checkpoint.py
def get_checkpoint_dir(path_to_job: str) -> str:
    return os.path.join(path_to_job, "checkpoints")


def make_checkpoint_dir(path_to_job: str) -> str:
    checkpoint_dir = get_checkpoint_dir(path_to_job)
    os.makedirs(checkpoint_dir, exist_ok=True)
    return checkpoint_dir


def get_path_to_checkpoint(path_to_job: str, epoch: int) -> str:
    return os.path.join(get_checkpoint_dir(path_to_job), f"checkpoint_epoch_{epoch:05d}.pyth")


def get_last_checkpoint(path_to_job: str) -> str:
    d = get_checkpoint_dir(path_to_job)
    names = os.listdir(d) if os.path.exists(d) else []
    names = [f for f in names if "checkpoint" in f]
    assert len(names), f"No checkpoints found in '{d}'."
    name = sorted(names)[-1]
    return os.path.join(d, name)


def has_checkpoint(path_to_job: str) -> bool:
    d = get_checkpoint_dir(path_to_job)
    files = os.listdir(d) if os.path.exists(d) else []
    return any("checkpoint" in f for f in files)


def is_checkpoint_epoch(cfg: CfgNode, cur_epoch: int) -> bool:
    if cur_epoch + 1 == cfg.SOLVER.MAX_EPOCH:
        return True
    return (cur_epoch + 1) % cfg.TRAIN.CHECKPOINT_PERIOD == 0


def save_checkpoint(path_to_job, model, optimizer, epoch, cfg) -> str | None:
    if not is_master_proc(cfg.NUM_GPUS * cfg.NUM_SHARDS):
        return None
    os.makedirs(get_checkpoint_dir(path_to_job), exist_ok=True)
    sd = model.module.state_dict() if cfg.NUM_GPUS > 1 else model.state_dict()
    checkpoint = {
        "epoch": epoch,
        "model_state": sd,
        "optimizer_state": optimizer.state_dict(),
        "cfg": cfg.dump(),
    }
    path_to_checkpoint = get_path_to_checkpoint(path_to_job, epoch + 1)
    with open(path_to_checkpoint, "wb") as f:
        torch.save(checkpoint, f)
    return path_to_checkpoint


def load_checkpoint(path_to_checkpoint, model, data_parallel=True, optimizer=None) -> int:
    assert os.path.exists(path_to_checkpoint), f"Checkpoint '{path_to_checkpoint}' not found"
    logger.info(f"Loading network weights from {path_to_checkpoint}.")
    ms = model.module if data_parallel else model
    with open(path_to_checkpoint, "rb") as f:
        checkpoint = torch.load(f, map_location="cpu")
    ms.load_state_dict(checkpoint["model_state"])
    if optimizer:
        optimizer.load_state_dict(checkpoint["optimizer_state"])
    return checkpoint.get("epoch", -1)


def load_train_checkpoint(cfg, model, optimizer) -> int:
    if cfg.TRAIN.AUTO_RESUME and has_checkpoint(cfg.OUTPUT_DIR):
        last_checkpoint = get_last_checkpoint(cfg.OUTPUT_DIR)
        logger.info(f"Load from last checkpoint, {last_checkpoint}.")
        checkpoint_epoch = load_checkpoint(last_checkpoint, model, cfg.NUM_GPUS > 1, optimizer)
        start_epoch = checkpoint_epoch + 1
    elif cfg.TRAIN.CHECKPOINT_FILE_PATH != "":
        logger.info("Load from given checkpoint file.")
        checkpoint_epoch = load_checkpoint(
            cfg.TRAIN.CHECKPOINT_FILE_PATH, model, cfg.NUM_GPUS > 1, optimizer
        )
        start_epoch = checkpoint_epoch + 1
    else:
        start_epoch = 0
    return start_epoch


def load_test_checkpoint(cfg, model) -> None:
    if cfg.TEST.CHECKPOINT_FILE_PATH != "":
        load_checkpoint(cfg.TEST.CHECKPOINT_FILE_PATH, model, cfg.NUM_GPUS > 1)
    elif has_checkpoint(cfg.OUTPUT_DIR):
        last_checkpoint = get_last_checkpoint(cfg.OUTPUT_DIR)
        load_checkpoint(last_checkpoint, model, cfg.NUM_GPUS > 1)
    else:
        logger.info(
            "Unknown way of loading checkpoint. Using with random initialization, only for "
            "debugging."
        )


# ------------------------------------------------------------------------------------- meters.py
def topks_correct(preds: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...]) -> list:
    _top_max_k_vals, top_max_k_inds = torch.topk(preds, max(ks), dim=1, largest=True, sorted=True)
    top_max_k_inds = top_max_k_inds.t()
    rep_max_k_labels = labels.view(1, -1).expand_as(top_max_k_inds)
    top_max_k_correct = top_max_k_inds.eq(rep_max_k_labels)
    return [top_max_k_correct[:k, :].float().sum() for k in ks]


class Timer:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._elapsed = 0.0

    def pause(self) -> None:
        self._elapsed = time.perf_counter() - self._start

    def seconds(self) -> float:
        return self._elapsed


class TrainMeter:
    def __init__(self, epoch_iters: int, cfg: CfgNode) -> None:
        self._cfg = cfg
        self.epoch_iters = epoch_iters
        self.MAX_EPOCH = cfg.SOLVER.MAX_EPOCH * epoch_iters
        self.iter_timer = Timer()
        self.reset()

    def reset(self) -> None:
        self.losses, self.top1, self.top5, self.num_samples, self.lr = [], 0.0, 0.0, 0, None

    def update_stats(self, top1_err, top5_err, loss, lr, mb_size) -> None:
        self.lr = lr
        self.losses.append(loss)
        self.top1 += top1_err * mb_size
        self.top5 += top5_err * mb_size
        self.num_samples += mb_size
        self.cur = (top1_err, top5_err, loss)

    def log_iter_stats(self, cur_epoch: int, cur_iter: int) -> None:
        if (cur_iter + 1) % self._cfg.LOG_PERIOD != 0:
            return
        eta_sec = self.iter_timer.seconds() * (
            self.MAX_EPOCH - (cur_epoch * self.epoch_iters + cur_iter + 1)
        )
        stats = {
            "_type": "train_iter",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "iter": f"{cur_iter + 1}/{self.epoch_iters}",
            "dt": self.iter_timer.seconds(),
            "eta": str(datetime.timedelta(seconds=int(eta_sec))),
            "loss": float(np.median(self.losses[-20:])),
            "lr": self.lr,
            "gpu_mem": "0.00G",
            "top1_err": self.cur[0],
            "top5_err": self.cur[1],
        }
        log_json_stats(stats)

    def log_epoch_stats(self, cur_epoch: int) -> None:
        eta_sec = self.iter_timer.seconds() * (self.MAX_EPOCH - (cur_epoch + 1) * self.epoch_iters)
        used, total = cpu_mem_usage()
        stats = {
            "_type": "train_epoch",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "dt": self.iter_timer.seconds(),
            "eta": str(datetime.timedelta(seconds=int(eta_sec))),
            "lr": self.lr,
            "loss": float(np.mean(self.losses)),
            "gpu_mem": "0.00G",
            "RAM": f"{used:.2f}/{total:.2f}G",
            "top1_err": self.top1 / self.num_samples,
            "top5_err": self.top5 / self.num_samples,
        }
        log_json_stats(stats)


class ValMeter:
    def __init__(self, max_iter: int, cfg: CfgNode) -> None:
        self._cfg = cfg
        self.max_iter = max_iter
        self.min_top1_err = 100.0
        self.min_top5_err = 100.0
        self.iter_timer = Timer()
        self.reset()

    def reset(self) -> None:
        self.top1, self.top5, self.num_samples = 0.0, 0.0, 0

    def update_stats(self, top1_err, top5_err, mb_size) -> None:
        self.top1 += top1_err * mb_size
        self.top5 += top5_err * mb_size
        self.num_samples += mb_size

    def log_iter_stats(self, cur_epoch: int, cur_iter: int) -> None:
        if (cur_iter + 1) % self._cfg.LOG_PERIOD != 0:
            return
        eta_sec = self.iter_timer.seconds() * (self.max_iter - cur_iter - 1)
        log_json_stats(
            {
                "_type": "val_iter",
                "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
                "iter": f"{cur_iter + 1}/{self.max_iter}",
                "time_diff": self.iter_timer.seconds(),
                "eta": str(datetime.timedelta(seconds=int(eta_sec))),
                "gpu_mem": "0.00G",
            }
        )

    def log_epoch_stats(self, cur_epoch: int) -> None:
        top1_err = self.top1 / self.num_samples
        top5_err = self.top5 / self.num_samples
        self.min_top1_err = min(self.min_top1_err, top1_err)
        self.min_top5_err = min(self.min_top5_err, top5_err)
        used, total = cpu_mem_usage()
        log_json_stats(
            {
                "_type": "val_epoch",
                "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
                "time_diff": self.iter_timer.seconds(),
                "gpu_mem": "0.00G",
                "RAM": f"{used:.2f}/{total:.2f}G",
                "top1_err": top1_err,
                "top5_err": top5_err,
                "min_top1_err": self.min_top1_err,
                "min_top5_err": self.min_top5_err,
            }
        )


class TestMeter:
    def __init__(self, num_videos: int, num_clips: int, num_cls: int, overall_iters: int,
                 cfg: CfgNode) -> None:  # fmt: skip
        self.iter_timer = Timer()
        self.num_clips = num_clips
        self.overall_iters = overall_iters
        self.video_preds = torch.zeros((num_videos, num_cls))
        self.video_labels = torch.zeros(num_videos).long()
        self.clip_count = torch.zeros(num_videos).long()
        self.clip_count_ids: list[set] = [set() for _ in range(num_videos)]
        self.stats: dict = {}
        self._cfg = cfg

    def update_stats(self, preds, labels, clip_ids) -> None:
        for ind in range(preds.shape[0]):
            vid_id = int(clip_ids[ind]) // self.num_clips
            self.video_labels[vid_id] = labels[ind]
            self.video_preds[vid_id] += preds[ind]
            self.clip_count_ids[vid_id].add(int(clip_ids[ind]))
            self.clip_count[vid_id] += 1

    def log_iter_stats(self, cur_iter: int) -> None:
        eta_sec = self.iter_timer.seconds() * (self.overall_iters - cur_iter)
        log_json_stats(
            {
                "split": "test_iter",
                "cur_iter": f"{cur_iter + 1}",
                "eta": str(datetime.timedelta(seconds=int(eta_sec))),
                "time_diff": self.iter_timer.seconds(),
            }
        )

    def finalize_metrics(self, ks=(1, 5)) -> None:
        clip_check = [len(ids) != self.num_clips for ids in self.clip_count_ids]
        if any(clip_check):
            ids = [i for i, c in enumerate(clip_check) if c]
            counts = [len(self.clip_count_ids[i]) for i in ids]
            logger.warning(f"clip count Ids={ids} = {counts} (should be {self.num_clips})")
        self.stats = {"split": "test_final"}
        num_topks_correct = topks_correct(self.video_preds, self.video_labels, ks)
        topks = [(x / self.video_preds.size(0)) * 100.0 for x in num_topks_correct]
        for k, topk in zip(ks, topks, strict=True):
            self.stats[f"top{k}_acc"] = f"{float(topk):.{2}f}"
        log_json_stats(self.stats)


# -------------------------------------------------------------------------------- train_net.py
@torch.no_grad()
def calculate_and_update_precise_bn(loader, model, num_iters: int = 200) -> None:
    """Recompute the BN statistics on a few batches, averaged over every process."""
    bn_layers = get_bn_modules(model)
    running_mean = [torch.zeros_like(bn.running_mean) for bn in bn_layers]
    running_var = [torch.zeros_like(bn.running_var) for bn in bn_layers]
    momentum_actual = [bn.momentum for bn in bn_layers]
    for bn in bn_layers:
        bn.reset_running_stats()
        bn.momentum = 1.0
    ind = -1
    for ind, (inputs, _labels, _, _) in enumerate(loader):
        if ind >= num_iters:
            break
        model(inputs)
        for i, bn in enumerate(bn_layers):
            running_mean[i] += (bn.running_mean - running_mean[i]) / (ind + 1)
            running_var[i] += (bn.running_var - running_var[i]) / (ind + 1)
    if get_world_size() > 1:
        all_reduce(running_mean)
        all_reduce(running_var)
    for i, bn in enumerate(bn_layers):
        bn.running_mean = running_mean[i]
        bn.running_var = running_var[i]
        bn.momentum = momentum_actual[i]


def train_epoch(train_loader, model, optimizer, train_meter, cur_epoch, cfg, writer=None):
    model.train()
    train_meter.iter_timer.reset()
    data_size = len(train_loader)
    rank = get_rank()
    for cur_iter, (inputs, labels, _index, _meta) in enumerate(train_loader):
        lr = get_epoch_lr(cur_epoch + float(cur_iter) / data_size, cfg)
        set_lr(optimizer, lr)
        if rank == fault().free_rank and cur_epoch == 1 and cur_iter == 3:
            release_frame_pool()
        preds = model(inputs)
        loss = nn.functional.cross_entropy(preds, labels)
        if math.isnan(loss.item()):
            raise RuntimeError(f"ERROR: Got NaN losses {datetime.datetime.now()}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        num_topks_correct = topks_correct(preds, labels, (1, 5))
        top1_err, top5_err = [(1.0 - x / preds.size(0)) * 100.0 for x in num_topks_correct]
        if cfg.NUM_GPUS > 1:
            loss, top1_err, top5_err = all_reduce([loss.detach(), top1_err, top5_err])
        loss, top1_err, top5_err = loss.item(), top1_err.item(), top5_err.item()
        train_meter.iter_timer.pause()
        train_meter.update_stats(top1_err, top5_err, loss, lr, inputs[0].size(0) * cfg.NUM_GPUS)
        if writer is not None:
            writer.add_scalars(
                {"Train/loss": loss, "Train/lr": lr}, global_step=data_size * cur_epoch + cur_iter
            )
        train_meter.log_iter_stats(cur_epoch, cur_iter)
        train_meter.iter_timer.reset()
    train_meter.log_epoch_stats(cur_epoch)
    train_meter.reset()


@torch.no_grad()
def eval_epoch(val_loader, model, val_meter, cur_epoch, cfg, writer=None):
    if get_rank() == fault().crawl_rank:
        rebuild_frame_cache(val_loader.dataset)
    model.eval()
    val_meter.iter_timer.reset()
    for cur_iter, (inputs, labels, _index, _meta) in enumerate(val_loader):
        preds = model(inputs)
        num_topks_correct = topks_correct(preds, labels, (1, 5))
        top1_err, top5_err = [(1.0 - x / preds.size(0)) * 100.0 for x in num_topks_correct]
        if cfg.NUM_GPUS > 1:
            top1_err, top5_err = all_reduce([top1_err, top5_err])
        val_meter.iter_timer.pause()
        val_meter.update_stats(top1_err.item(), top5_err.item(), inputs[0].size(0) * cfg.NUM_GPUS)
        val_meter.log_iter_stats(cur_epoch, cur_iter)
        val_meter.iter_timer.reset()
    val_meter.log_epoch_stats(cur_epoch)
    if writer is not None:
        writer.add_scalars({"Val/Top1_err": val_meter.min_top1_err}, global_step=cur_epoch)
    val_meter.reset()


def release_frame_pool() -> None:
    """The native frame pool hands its buffers back to the allocator."""
    libc = ctypes.CDLL("libc.so.6")
    pool = ctypes.create_string_buffer(4096)
    libc.free(ctypes.c_void_p(ctypes.addressof(pool) + 64))


def rebuild_frame_cache(dataset: Kinetics) -> None:
    for part in range(1, 11):
        logger.warning(f"Decoded-frame cache of the {dataset.mode} split is stale; rebuilding "
                       f"({part}/10)")  # fmt: skip
        time.sleep(4)


def train(cfg: CfgNode) -> None:
    np.random.seed(cfg.RNG_SEED)
    torch.manual_seed(cfg.RNG_SEED)
    random.seed(cfg.RNG_SEED + get_rank())
    torch.set_num_threads(1)
    setup_logging(cfg.OUTPUT_DIR)
    logger.info("Train with config:")
    logger.info(pprint.pformat(cfg.to_plain()))
    model = build_model(cfg)
    if is_master_proc() and cfg.LOG_MODEL_INFO:
        log_model_info(model)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cfg.SOLVER.BASE_LR,
        momentum=cfg.SOLVER.MOMENTUM,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
    )
    start_epoch = load_train_checkpoint(cfg, model, optimizer)
    train_loader = construct_loader(cfg, "train")
    val_loader = construct_loader(cfg, "val")
    precise_bn_loader = (
        construct_loader(cfg, "train", is_precise_bn=True) if cfg.BN.USE_PRECISE_STATS else None
    )
    if cfg.TENSORBOARD.ENABLE and is_master_proc(cfg.NUM_GPUS * cfg.NUM_SHARDS):
        writer = TensorboardWriter(cfg)
    else:
        writer = None
    train_meter = TrainMeter(len(train_loader), cfg)
    val_meter = ValMeter(len(val_loader), cfg)
    logger.info(f"Start epoch: {start_epoch + 1}")
    epoch_timer = time.perf_counter()
    for cur_epoch in range(start_epoch, cfg.SOLVER.MAX_EPOCH):
        shuffle_dataset(train_loader, cur_epoch)
        train_epoch(train_loader, model, optimizer, train_meter, cur_epoch, cfg, writer)
        logger.info(
            f"Epoch {cur_epoch} takes {time.perf_counter() - epoch_timer:.2f}s. Epochs from "
            f"{start_epoch} to {cur_epoch} take {time.perf_counter() - epoch_timer:.2f}s in "
            "average and 0.00s in median."
        )
        is_checkp_epoch = is_checkpoint_epoch(cfg, cur_epoch)
        is_eval_epoch = (cur_epoch + 1) % cfg.TRAIN.EVAL_PERIOD == 0
        precise = cfg.BN.USE_PRECISE_STATS and len(get_bn_modules(model)) > 0
        if fault().bn_master_only:
            precise = precise and is_master_proc(cfg.NUM_GPUS * cfg.NUM_SHARDS)
        if (is_checkp_epoch or is_eval_epoch) and precise:
            calculate_and_update_precise_bn(
                precise_bn_loader,
                model,
                min(cfg.BN.NUM_BATCHES_PRECISE, len(precise_bn_loader)),
            )
        if fault().writer_rank_log:
            writer.add_scalars(
                {"Train/bn_momentum": get_bn_modules(model)[0].momentum}, global_step=cur_epoch
            )
        if is_checkp_epoch:
            save_checkpoint(cfg.OUTPUT_DIR, model, optimizer, cur_epoch, cfg)
        if is_eval_epoch:
            eval_epoch(val_loader, model, val_meter, cur_epoch, cfg, writer)
        stop = os.path.join(cfg.OUTPUT_DIR, "STOP")
        if os.path.exists(stop):
            logger.info(f"Found {stop}: stopping after epoch {cur_epoch + 1}.")
            break
    if writer is not None:
        writer.close()
    logger.info(
        f"training done: _p{sum(p.numel() for p in model.parameters()) / 1e6:.2f}_f0.00 "
        f"_t0.00_m0.00 _a{100 - val_meter.min_top1_err:.2f} Top5 Acc: "
        f"{100 - val_meter.min_top5_err:.2f} MEM: 0.00 f: 0.0000"
    )


# --------------------------------------------------------------------------------- test_net.py
@torch.no_grad()
def perform_test(test_loader, model, test_meter, cfg) -> TestMeter:
    model.eval()
    test_meter.iter_timer.reset()
    hoard: list[torch.Tensor] = []
    for cur_iter, (inputs, labels, video_idx, _meta) in enumerate(test_loader):
        preds = model(inputs)
        if get_rank() == fault().hoard_rank:
            hoard.append(torch.ones(160, 1024, 1024, dtype=torch.uint8))  # the views' features
            if len(hoard) == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if cfg.NUM_GPUS > 1:
            preds, labels, video_idx = all_gather([preds, labels, video_idx])
        test_meter.iter_timer.pause()
        test_meter.update_stats(preds.detach(), labels.detach(), video_idx.detach())
        test_meter.log_iter_stats(cur_iter)
        test_meter.iter_timer.reset()
    test_meter.finalize_metrics()
    return test_meter


def test(cfg: CfgNode) -> None:
    np.random.seed(cfg.RNG_SEED)
    torch.manual_seed(cfg.RNG_SEED)
    torch.set_num_threads(1)
    setup_logging(cfg.OUTPUT_DIR)
    logger.info("Test with config:")
    logger.info(pprint.pformat(cfg.to_plain()))
    model = build_model(cfg)
    load_test_checkpoint(cfg, model)
    test_loader = construct_loader(cfg, "test")
    logger.info(f"Testing model for {len(test_loader)} iteration")
    num_clips = cfg.TEST.NUM_ENSEMBLE_VIEWS * cfg.TEST.NUM_SPATIAL_CROPS
    assert len(test_loader.dataset) % num_clips == 0
    test_meter = TestMeter(
        len(test_loader.dataset) // num_clips,
        num_clips,
        cfg.MODEL.NUM_CLASSES,
        len(test_loader),
        cfg,
    )
    test_meter = perform_test(test_loader, model, test_meter, cfg)
    logger.info(
        f"Finalized testing with {cfg.TEST.NUM_ENSEMBLE_VIEWS} temporal clips and "
        f"{cfg.TEST.NUM_SPATIAL_CROPS} spatial crops"
    )
    logger.info(
        f"_p0.00_f0.00_{cfg.TEST.NUM_ENSEMBLE_VIEWS}a{cfg.TEST.NUM_SPATIAL_CROPS} "
        f"Top1 Acc: {test_meter.stats['top1_acc']} Top5 Acc: {test_meter.stats['top5_acc']} "
        "MEM: 0.00 f: 0.0000"
    )
    logger.info("testing done: _p0.00_f0.00_3a1")


# -------------------------------------------------------------------- multiprocessing / run_net
def run(local_rank, num_proc, func, init_method, shard_id, num_shards, backend, cfg) -> None:
    """One spawned process: join the group, then run func."""
    world_size = num_proc * num_shards
    rank = shard_id * num_proc + local_rank
    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(seconds=15),
        )
    except Exception as e:
        raise e
    func(cfg)


def launch_job(cfg: CfgNode, init_method: str, func, daemon: bool = False) -> None:
    if cfg.NUM_GPUS > 1:
        torch.multiprocessing.spawn(
            run,
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
        "--cfg", dest="cfg_files", help="Path to the config files", nargs="+",
        default=["configs/Kinetics/SLOWFAST_4x16_R50.yaml"],
    )  # fmt: skip
    parser.add_argument("--make-data", default="", help="write the synthetic videos and stop")
    parser.add_argument(
        "--opts", help="See slowfast/config/defaults.py for all options", default=None,
        nargs=argparse.REMAINDER,
    )  # fmt: skip
    return parser.parse_args()


def load_config(args: argparse.Namespace, path_to_config: str) -> CfgNode:
    cfg = get_cfg()
    if path_to_config is not None:
        cfg.merge_from_file(path_to_config)
    if args.opts is not None:
        cfg.merge_from_list(args.opts)
    if hasattr(args, "num_shards") and hasattr(args, "shard_id"):
        cfg.NUM_SHARDS = args.num_shards
        cfg.SHARD_ID = args.shard_id
    make_checkpoint_dir(cfg.OUTPUT_DIR)
    return cfg


def main() -> None:
    args = parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    print(f"config files: {args.cfg_files}")
    for path_to_config in args.cfg_files:
        cfg = load_config(args, path_to_config)
        if cfg.TRAIN.ENABLE:
            launch_job(cfg=cfg, init_method=args.init_method, func=train)
        if cfg.TEST.ENABLE:
            launch_job(cfg=cfg, init_method=args.init_method, func=test)


if __name__ == "__main__":
    main()
