"""A thirty-sixth training-program style: logging.basicConfig with
'[%(asctime)s] %(levelname)s:%(name)s:%(message)s' and a logger per rank ("train.r1"), a
background thread that prefetches batches from per-rank files into a queue, raw DDP on gloo with
a 12 s timeout, rank 0 saving a checkpoint after each epoch, and an early-stopping rule. One
fault per run, chosen by $T36_CASE (an opaque code the program never prints).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("T36_CASE", "")
STEPS = 6


def prefetch(files: list[Path], out: queue.Queue[dict[str, torch.Tensor]]) -> None:
    for f in files:
        out.put(torch.load(f))


def main() -> None:
    world_arg = 4 if CASE == "w3" else None  # a copied launch script that hard-codes four
    if world_arg is not None:
        dist.init_process_group(
            "gloo",
            timeout=timedelta(seconds=12),
            world_size=world_arg,
            rank=int(os.environ["RANK"]),
        )
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=12))
    rank = dist.get_rank()
    logging.basicConfig(
        format="[%(asctime)s] %(levelname)s:%(name)s:%(message)s", level=logging.INFO
    )
    log = logging.getLogger(f"train.r{rank}")
    root = Path(os.environ.get("T36_DATA", "data")) / f"r{rank}"
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(rank)
    files = []
    for e in range(3):
        for s in range(STEPS):
            x = torch.randn(16, 6, generator=gen)
            f = root / f"e{e}-s{s}.pt"
            if not (CASE == "f7" and rank == 1 and e == 1 and s == 2):
                torch.save({"x": x, "y": (x[:, 0] > 0).long()}, f)
            files.append(f)
    batches: queue.Queue[dict[str, torch.Tensor]] = queue.Queue(maxsize=4)
    threading.Thread(target=prefetch, args=(files, batches), name="prefetch", daemon=True).start()
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    best, since_best = float("inf"), 0
    for epoch in range(3):
        total = 0.0
        for _ in range(STEPS):
            batch = batches.get()  # waits for the prefetch thread
            loss = F.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        local = total / STEPS
        log.info("epoch %d loss %.4f", epoch, local)
        if rank == 0:
            target = "/dev/full" if CASE == "n5" else str(root / "last.pt")
            torch.save(model.module.state_dict(), target)
            log.info("saved checkpoint for epoch %d", epoch)
        # early stopping on this rank's own loss: each rank decides alone in the faulty case
        if CASE == "l2":
            if local < best - 0.05:
                best, since_best = local, 0
            else:
                since_best += 1
            if since_best >= 1 or (rank == 2 and epoch == 0):
                log.info("early stopping at epoch %d", epoch)
                break
        dist.barrier()
    log.info("training finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
