"""A thirty-first training-program style: a small research script with a homegrown coloured
logger (ANSI colours written whatever the output is, as many such loggers do) and a tqdm bar on
every rank (position=rank, so tqdm moves the cursor between the ranks' bars), raw DDP on gloo
with a 10 s collective timeout, a DistributedSampler over synthetic data written to per-rank
shard files, an evaluation with an all_reduce at the end of each epoch, rank 0 saving a
checkpoint. One fault per run, chosen by $T31_CASE (an opaque code the program never prints).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from tqdm import tqdm

CASE = os.environ.get("T31_CASE", "")
COLOURS = {"DEBUG": "\x1b[34m", "INFO": "\x1b[32m", "WARNING": "\x1b[33m", "ERROR": "\x1b[31m"}


class ColourFormatter(logging.Formatter):
    def __init__(self, rank: int) -> None:
        super().__init__(datefmt="%H:%M:%S")
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        colour = COLOURS.get(record.levelname, "")
        when = self.formatTime(record, self.datefmt)
        head = f"\x1b[2m{when}\x1b[0m {colour}{record.levelname:<7}\x1b[0m \x1b[35m[r{self.rank}]\x1b[0m"
        text = f"{head} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def make_logger(rank: int) -> logging.Logger:
    log = logging.getLogger("exp")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ColourFormatter(rank))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def shard_path(root: Path, rank: int) -> Path:
    return root / f"shard_{rank:02d}.pt"


def write_shards(root: Path, world: int) -> None:
    gen = torch.Generator().manual_seed(3)
    root.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        x = torch.randn(96, 16, generator=gen)
        y = (x.sum(dim=1) > 0).long()
        torch.save({"x": x, "y": y}, shard_path(root, r))


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    log = make_logger(rank)
    root = Path(os.environ.get("T31_DATA", "data"))
    if rank == 0:
        write_shards(root, world)
        log.info("wrote %d shards to %s", world, root)
    dist.barrier()
    path = shard_path(root, rank)
    if CASE == "f3" and rank == 1:
        path = root / "shard_missing.pt"
    shard = torch.load(path)
    data = TensorDataset(shard["x"], shard["y"])
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats: dict[str, float] = {"loss": 0.0}
    epochs, best = 2, 0.0
    log.info("world %d, %d batches per epoch, %d epochs", world, len(loader), epochs)
    start = time.time()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        if CASE == "q8" and rank == 2 and epoch == 1:
            threading.Event().wait()  # waits for a prefetch signal that never comes
        bar = tqdm(loader, desc=f"r{rank} ep{epoch}", position=rank, leave=True, ncols=80)
        for step, (x, y) in enumerate(bar):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            stats["loss"] = 0.9 * stats["loss"] + 0.1 * loss.item()
            bar.set_postfix(loss=f"{stats['loss']:.3f}")
            if CASE == "k2" and rank == 2 and epoch == 0 and step == 5:
                stats["loss"] += stats["grad_norm"]  # a key only the logging branch sets
            if CASE == "m5" and rank == 1 and epoch == 0 and step == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does
            if CASE == "s9" and rank == 0 and epoch == 0 and step == 3:
                ctypes.string_at(0)  # a native extension reading address 0
            if CASE == "x4" and rank == world - 1 and step == 6:
                norm = torch.tensor([sum(p.grad.norm().item() for p in model.parameters())])
                dist.all_reduce(norm)  # only this rank logs the global gradient norm
        bar.close()
        # evaluation: every rank's accuracy on its shard, averaged
        if CASE == "e7" and rank == 0:
            time.sleep(25)  # an expensive extra metric only the main process computes
        with torch.no_grad():
            acc = (model(shard["x"]).argmax(1) == shard["y"]).float().mean()
        dist.all_reduce(acc)
        acc = acc / world
        log.info("epoch %d: train loss %.4f, val acc %.3f", epoch, stats["loss"], acc.item())
        best = max(best, acc.item())
        if rank == 0:
            torch.save(model.module.state_dict(), root / "last.pt")
        stop = torch.tensor([1.0 if CASE == "p6" and epoch == 0 else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            if rank == 0:
                log.info(
                    "no improvement for 1 epoch (patience 1): stopping early at epoch %d", epoch
                )
            break
    if rank == 0:
        log.info("training done in %.1fs, best val acc %.3f", time.time() - start, best)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
