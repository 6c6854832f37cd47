"""A thirty-third training-program style: the main process alone logs ("only log on rank 0",
logging.basicConfig with '%(asctime)s - %(levelname)s - %(name)s - %(message)s', every other
rank's logger at ERROR), raw DDP on gloo with a 12 s collective timeout, a per-rank list of
samples (a hand-rolled split of a file list, not a DistributedSampler), a validation every
epoch and an early-stopping rule. One fault per run, chosen by $T33_CASE (an opaque code the
program never prints).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("T33_CASE", "")
log = logging.getLogger("trainer")


def files_of(rank: int, world: int, root: Path) -> list[Path]:
    """The rank's part of the file list: every world-th file from its own index."""
    names = sorted(root.glob("part-*.pt"))
    return names[rank::world]


def make_parts(root: Path, count: int) -> None:
    gen = torch.Generator().manual_seed(5)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        x = torch.randn(32, 10, generator=gen)
        torch.save({"x": x, "y": (x[:, 1] > 0).long()}, root / f"part-{i:03d}.pt")


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=12))
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        level=logging.INFO if rank == 0 else logging.ERROR,
    )
    root = Path(os.environ.get("T33_DATA", "data"))
    if rank == 0:
        # 7 files over 3 ranks leave rank 2 one short in the uneven case
        make_parts(root, 7 if CASE == "b3" else 6)
        log.info("prepared the data parts in %s", root)
    dist.barrier()
    parts = files_of(rank, world, root)
    batches = [torch.load(p) for p in parts]
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.Tanh(), torch.nn.Linear(24, 2))
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    log.info("start training: %d ranks, %d parts on rank 0", world, len(parts))
    best, bad_epochs = float("inf"), 0
    for epoch in range(3):
        for step, batch in enumerate(batches):
            loss = F.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
            if CASE == "r6" and rank == 1 and epoch == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer takes rank 1
            if CASE == "z4" and rank == 2 and epoch == 1 and step == 1:
                raise IndexError("list index out of range in the label map")
        if CASE == "h2" and rank == 0 and epoch == 1:
            time.sleep(40)  # rank 0 writes a large sample grid to a slow disk
        with torch.no_grad():
            val = torch.tensor(
                [sum(F.cross_entropy(model(b["x"]), b["y"]).item() for b in batches)]
            )
        dist.all_reduce(val)
        val_loss = val.item() / world
        log.info("epoch %d validation loss %.4f", epoch, val_loss)
        if val_loss < best - 1e-3:
            best, bad_epochs = val_loss, 0
        else:
            bad_epochs += 1
        if CASE == "s5" and rank == 0 and epoch == 0:
            log.info("early stopping: the validation loss is good enough")
            break  # only rank 0 decides it: the others go on to epoch 1
        # patience 0 in the stopping case: every rank votes, the vote is all-reduced
        stop = torch.tensor([1.0 if CASE == "a7" and (bad_epochs or epoch == 0) else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            log.info("early stopping after epoch %d", epoch)
            break
    log.info("finished training, best validation loss %.4f", best)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
