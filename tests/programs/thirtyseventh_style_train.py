"""A thirty-seventh training-program style: the local/train.py of a Kaldi/ESPnet-era speech recipe
(tests/programs/thirtyseventh_recipe: run.sh's stage 3 runs it under torchrun through
utils/run.pl, its output in exp/train/train.log). logging with ESPnet's format on every rank
(no rank in it), ESPnet's reporter lines on rank 0, gloo with a 15 s timeout, a sampler that
splits sorted utterance batches across ranks, validation stats all-reduced each epoch, rank 0
writing exp/train/N.pth and checkpoint.pth. One fault per run, chosen by $S37_PICK (an opaque
code the program never prints).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PICK = os.environ.get("S37_PICK", "")


def str2bool(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train an utterance classifier")
    parser.add_argument("--train_data", required=True)
    parser.add_argument("--valid_data", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_epoch", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--log_interval", type=int, default=4)
    parser.add_argument("--patience", type=int, default=None)
    parser.add_argument("--early_stopping_delta", type=float, default=0.0)
    parser.add_argument("--resume", type=str2bool, default=False)
    parser.add_argument("--use_wandb", type=str2bool, default=False)
    return parser


def read_table(path: Path) -> dict[str, str]:
    table = {}
    for line in path.read_text().splitlines():
        key, value = line.split(maxsplit=1)
        table[key] = value
    return table


def make_batches(data_dir: Path, batch_size: int) -> list[list[str]]:
    """Utterances sorted by length, then cut into batches (ESPnet's sorted batch sampler)."""
    shape = {k: int(v.split(",")[0]) for k, v in read_table(data_dir / "feats_shape").items()}
    utts = sorted(shape, key=lambda u: (shape[u], u))
    return [utts[i : i + batch_size] for i in range(0, len(utts), batch_size)]


def split_for_rank(data_dir: Path, batch_size: int, rank: int, world: int) -> list[list[str]]:
    if PICK == "u":
        # Kaldi's split_data.sh way: whole speakers per job, so per-job sizes differ
        u2s = read_table(data_dir / "utt2spk")
        speakers = sorted(set(u2s.values()))[rank::world]
        mine = {u for u, s in u2s.items() if s in speakers}
        utts = [u for b in make_batches(data_dir, batch_size) for u in b if u in mine]
        return [utts[i : i + batch_size] for i in range(0, len(utts), batch_size)]
    return make_batches(data_dir, batch_size)[rank::world]


def load_batch(
    utts: list[str], scp: dict[str, str], text: dict[str, str]
) -> tuple[torch.Tensor, torch.Tensor]:
    feats = []
    for utt in utts:
        x = torch.from_numpy(np.load(scp[utt]))
        feats.append(torch.cat([x.mean(0), x.std(0)]))
    return torch.stack(feats), torch.tensor([int(text[u]) for u in utts])


class Reporter:
    """ESPnet's reporter: per-iteration stats, averaged every log_interval iterations."""

    def __init__(self) -> None:
        self.stats: dict[str, list[float]] = {}

    def register(self, **kw: float) -> None:
        for k, v in kw.items():
            self.stats.setdefault(k, []).append(v)

    def flush(self) -> str:
        text = ", ".join(
            f"{k}={np.mean(v):.3e}" if k == "iter_time" else f"{k}={np.mean(v):.3f}"
            for k, v in self.stats.items()
        )
        self.stats = {}
        return text


def compute_feats_stats(output_dir: Path, data_dir: Path, rank: int) -> None:
    """Global mean/variance normalisation stats: rank 0 writes them, the others wait for the file."""
    stats = output_dir / "feats_stats.npz"
    if rank == 0:
        logging.info(f"rank {rank}: computing feature statistics for {data_dir}")
        if PICK == "h0":
            done = threading.Event()  # the worker thread that sets it is never started
            done.wait()
        scp = read_table(data_dir / "feats.scp")
        x = np.concatenate([np.load(p) for p in list(scp.values())[:16]])
        np.savez(stats, mean=x.mean(0), var=x.var(0))
    else:
        logging.info(f"rank {rank}: waiting for {stats}")
        while not stats.exists():
            time.sleep(0.5)


def main() -> None:
    args = get_parser().parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s",
    )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.info(f"rank {rank}: world_size={world}, local_rank={local_rank}, pid={os.getpid()}")
    logging.info(f"pytorch.version={torch.__version__}, cuda.available={torch.cuda.is_available()}")
    if args.use_wandb and rank == 0:
        import wandb

        wandb.init(project="asr-utt-cls", dir=args.output_dir)

    torch.manual_seed(0)
    output_dir = Path(args.output_dir)
    train_dir, valid_dir = Path(args.train_data), Path(args.valid_data)
    scp = {**read_table(train_dir / "feats.scp"), **read_table(valid_dir / "feats.scp")}
    text = {**read_table(train_dir / "text"), **read_table(valid_dir / "text")}
    utt2spk = read_table(train_dir / "utt2spk")
    spk2id = {s: i for i, s in enumerate(sorted(set(utt2spk.values())))}
    spk_count = torch.zeros(len(spk2id))

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if rank == 0:
        logging.info(f"Model structure:\n{model}")
        n = sum(p.numel() for p in model.parameters())
        logging.info(f"Model summary: Number of parameters: {n}")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start_epoch = 1
    ckpt = output_dir / "checkpoint.pth"
    if args.resume and ckpt.exists():
        device = f"cuda:{local_rank}" if PICK == "d" else "cpu"
        states = torch.load(ckpt, map_location=device)
        model.load_state_dict(states["model"])
        optimizer.load_state_dict(states["optimizers"][0])
        start_epoch = states["reporter"]["epoch"] + 1
        logging.info(f"The training was resumed using {ckpt}")
    model = DDP(model)
    compute_feats_stats(output_dir, train_dir, rank)

    train_batches = split_for_rank(train_dir, args.batch_size, rank, world)
    valid_batches = make_batches(valid_dir, args.batch_size)[rank::world]
    logging.info(
        f"[train] dataset: {train_dir}, number of batches on this process: {len(train_batches)}"
    )
    best, bad_epochs = float("inf"), 0
    epoch = start_epoch
    for epoch in range(start_epoch, args.max_epoch + 1):
        logging.info(f"{epoch}/{args.max_epoch}epoch started")
        if PICK == "w0" and rank == 0 and epoch == 2:
            for part in range(5):  # attention plots of the last epoch, written before training on
                logging.info(f"writing attention plots: part {part + 1}/5")
                time.sleep(5)
        model.train()
        reporter, t0, start_it = Reporter(), time.perf_counter(), 1
        train_loss = []
        for it, utts in enumerate(train_batches, 1):
            t_iter = time.perf_counter()
            x, y = load_batch(utts, scp, text)
            if PICK == "k1" and rank == 1 and epoch == 2 and it == 5:
                spk2id.pop(utt2spk[utts[0]])  # an id table rebuilt from a partial spk2utt
            for u in utts:
                spk_count[spk2id[utt2spk[u]]] += 1
            if PICK == "s2" and rank == 2 and epoch == 1 and it == 3:
                ctypes.string_at(0)  # a native feature reader dereferences NULL
            if PICK == "m1" and rank == 1 and epoch == 2 and it == 4:
                hoard = [torch.ones(64 << 18) for _ in range(4)]  # noqa: F841
                os.kill(os.getpid(), 9)
            t_fwd = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            forward_time = time.perf_counter() - t_fwd
            optimizer.zero_grad()
            t_bwd = time.perf_counter()
            loss.backward()
            backward_time = time.perf_counter() - t_bwd
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            if PICK == "r0" and rank == 0 and it % args.log_interval == 0:
                dist.all_reduce(grad_norm)  # the reporter's global grad norm, on rank 0 only
                grad_norm /= world
            optimizer.step()
            train_loss.append(loss.item())
            reporter.register(
                iter_time=time.perf_counter() - t_iter,
                forward_time=forward_time,
                loss=loss.item(),
                grad_norm=float(grad_norm),
                backward_time=backward_time,
                optim0_lr0=args.lr,
            )
            if rank == 0 and it % args.log_interval == 0:
                logging.info(f"{epoch}epoch:train:{start_it}-{it}batch: {reporter.flush()}")
                start_it = it + 1
        train_time = time.perf_counter() - t0

        model.eval()
        t1 = time.perf_counter()
        stats = torch.zeros(3)
        with torch.no_grad():
            for utts in valid_batches:
                x, y = load_batch(utts, scp, text)
                out = model(x)
                stats += torch.tensor(
                    [
                        F.cross_entropy(out, y, reduction="sum").item(),
                        (out.argmax(-1) == y).sum().item(),
                        len(utts),
                    ]
                )
        dist.all_reduce(stats)
        valid_loss, valid_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        if rank == 0:
            logging.info(
                f"{epoch}epoch results: [train] loss={np.mean(train_loss):.3f}, "
                f"train_time={train_time:.3f}, total_count={len(train_batches)}, "
                f"[valid] loss={valid_loss:.3f}, acc={valid_acc:.3f}, "
                f"time={time.perf_counter() - t1:.3f} seconds, total_count={int(stats[2])}"
            )
            torch.save(model.module.state_dict(), output_dir / f"{epoch}.pth")
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "optimizers": [optimizer.state_dict()],
                    "reporter": {"epoch": epoch, "valid.loss": np.float64(valid_loss)},
                },
                ckpt,
            )
            logging.info(f"Saving {output_dir / f'{epoch}.pth'}")
        if valid_loss < best - args.early_stopping_delta:
            if rank == 0:
                logging.info("The best model has been updated: valid.loss")
            best, bad_epochs = valid_loss, 0
        else:
            bad_epochs += 1
        decides = rank == 0 or PICK != "e0"  # with e0 the stopper lives in rank 0's reporter
        if args.patience is not None and decides and bad_epochs >= args.patience:
            logging.info(
                f"[Early stopping] valid.loss has not been improved {bad_epochs} epochs "
                f"continuously. The training was stopped at {epoch}epoch"
            )
            break
    if rank == 0:
        logging.info(f"The training was finished at {epoch} epochs ")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
