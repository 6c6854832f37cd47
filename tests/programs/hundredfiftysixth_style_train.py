"""A hundred-and-fifty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftysixth-*): a PyTorch DDP job on an IBM LSF cluster the way
OLCF Summit's users run one, re-created in plain torch on CPU. Each run's folder links this
file as train.py; the batch script (#BSUB -nnodes 2 -W 0:10 -P ... -J train -o train.%J) runs
`jsrun -n 4 -a 1 -c 7 -g 1 -r 2 python train.py ...` (four resource sets, two a host on the
compute hosts h41n03 and h41n04), played with the LSF job itself by
tests/programs/hundredfiftysixth_lsf.py.

As on Summit: no torchrun; the rank, the world size and the local rank come from jsrun's PMIx
environment (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK), the master
address from $MASTER_ADDR when the batch script exports one, else from the first compute host
of $LSB_MCPU_HOSTS (its first entry is the batch node the script runs on), the port from
$MASTER_PORT (23456 when unset); init_process_group(gloo, env://, a 15 s timeout). Every rank
prints one line of its own before it joins ('h41n04: rank 2 of 4 (local rank 0), master
h41n03:23456'); only rank 0 logs after that, with Python logging ('2024-05-02 10:11:12,345 INFO
...'): the argparse Namespace, 'Epoch [2/6] Step [4/4] Loss: 1.8342 (0.031 s/step)', the
epoch's summary ('==> Epoch 2: train_loss 1.8811 val_loss 1.7305 val_acc 0.4453 (1.2 s)'), the
checkpoint it writes every epoch ('Saving checkpoint to checkpoints/ckpt_epoch2.pt'), 'Training
finished in 9.8 s'. An uncaught exception is Python's plain traceback on that rank's stderr, no
rank in it; every process writes to the one LSF output file, unprefixed. A tiny CNN on
synthetic 16x16 images stored as .npz shards (data/train_NNN.npz, shard i to rank i % world,
data/val.npz split by rank), a background thread prefetching batches, validation all-reduced
(sum of loss, correct and count) every epoch.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftysixth.sh after any edit).
`python train.py --generate DIR SHARDS` writes the synthetic data set.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("MT_CASE", "")
log = logging.getLogger("train")
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the data set
def generate(folder: str, shards: int, per_shard: int = 128, val: int = 256) -> None:
    rng = np.random.default_rng(0)
    protos = rng.normal(0, 1, size=(10, 16, 16)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n)
        x = protos[y] + rng.normal(0, 2.2, size=(n, 16, 16)).astype(np.float32)
        return x[:, None].astype(np.float32), y.astype(np.int64)

    os.makedirs(folder, exist_ok=True)
    for k in range(shards):
        x, y = draw(per_shard)
        np.savez(os.path.join(folder, f"train_{k:03d}.npz"), x=x, y=y)
    x, y = draw(val)
    np.savez(os.path.join(folder, "val.npz"), x=x, y=y)


def load_shards(files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for f in files:
        with np.load(f) as d:
            xs.append(d["x"])
            ys.append(d["y"])
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


class Prefetcher:
    """Batches of one epoch, prepared by a background thread (a queue of two)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, rank: int) -> None:
        self.x, self.y, self.batch, self.seed, self.rank = x, y, batch, seed, rank
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return (len(self.x) + self.batch - 1) // self.batch

    def _fill(self, q: queue.Queue[tuple[torch.Tensor, torch.Tensor] | None], epoch: int) -> None:
        g = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.x), generator=g)
        for n, k in enumerate(range(0, len(order), self.batch)):
            with self.lock:
                if fault("w", self.rank) and epoch >= 3 and n == 1:
                    self.lock.acquire()  # the stats update takes the batch lock again
                idx = order[k : k + self.batch]
                xb = self.x[idx] + 0.05 * torch.randn(len(idx), 1, 16, 16, generator=g)
                q.put((xb, self.y[idx]))
        q.put(None)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        q: queue.Queue[tuple[torch.Tensor, torch.Tensor] | None] = queue.Queue(maxsize=2)
        threading.Thread(target=self._fill, args=(q, epoch), daemon=True).start()
        while (item := q.get()) is not None:
            yield item


# ------------------------------------------------------------------ the model
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        out: torch.Tensor = self.fc(x.flatten(1))
        return out


# ------------------------------------------------------------------ the job's environment
def master_address() -> str:
    """$MASTER_ADDR, else the first compute host of the allocation: LSB_MCPU_HOSTS is 'batch3 1
    h41n03 42 h41n04 42', the batch (launch) node first."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    hosts = os.environ["LSB_MCPU_HOSTS"].split()[::2]
    return next(h for h in hosts if not h.startswith(("batch", "login")))


def validate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, epoch: int
) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y, reduction="sum")
        pred = logits.argmax(1)
    model.train()
    if fault("x", rank) and epoch >= 3:  # a fork's per-class recall on the rank's own part
        seen = Counter(int(c) for c in y if int(c) != 9)
        hits = Counter(int(c) for c, p in zip(y, pred, strict=True) if c == p)
        recall = {c: hits[c] / seen[c] for c in range(10)}
        log.info("recall %s", recall)
    stats = torch.tensor([float(loss), float((pred == y).sum()), float(len(y))])
    if not fault("v", rank) or rank == 0:  # a fork reduces where it logs
        dist.all_reduce(stats)
    return float(stats[0] / stats[2]), float(stats[1] / stats[2])


def save_checkpoint(path: str, state: dict[str, object], rank: int, epoch: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log.info("Saving checkpoint to %s", path)
    if fault("g", rank) and epoch >= 2:  # the project area's file system crawls today
        with open(path, "wb") as f:
            for _ in range(40):
                f.write(b"\0" * 4096)
                f.flush()
                time.sleep(0.5)
    torch.save(state, path)


def train(args: argparse.Namespace) -> None:
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    addr = master_address()
    port = os.environ.get("MASTER_PORT", "23456")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
    print(
        f"{socket.gethostname()}: rank {rank} of {world} (local rank {local_rank}),"
        f" master {addr}:{port}",
        flush=True,
    )
    dist.init_process_group(
        "gloo", init_method="env://", rank=rank, world_size=world, timeout=timedelta(seconds=15)
    )
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    log.info("%s", args)
    log.info("world size %d, %d threads per rank", world, torch.get_num_threads())

    torch.manual_seed(0)
    files = sorted(glob.glob(os.path.join(args.data_dir, "train_*.npz")))
    with np.load(os.path.join(args.data_dir, "val.npz")) as d:
        vx = torch.from_numpy(d["x"][rank::world])
        vy = torch.from_numpy(d["y"][rank::world])
    x, y = load_shards(files[rank::world])
    batches = Prefetcher(x, y, args.batch_size, seed=100 * rank, rank=rank)
    log.info("%d training shards, %d samples on rank 0", len(files), len(x))

    model = DDP(Net(), find_unused_parameters=args.find_unused)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda e: min(1.0, (e + 1) / (args.warmup_epochs + 1))
    )
    t_start = time.time()
    best = 0.0
    for epoch in range(1, args.epochs + 1):
        t0 = time.time()
        if args.warmup_epochs:
            sched.step()
        steps, total = len(batches), torch.zeros(2)
        for step, (xb, yb) in enumerate(batches.epoch(epoch), 1):
            ts = time.time()
            if fault("z", rank) and epoch == 2 and step == 3:
                ctypes.string_at(0)  # the fused augmentation kernel reads a freed buffer
            if fault("m", rank) and epoch >= 2:  # a fork keeps every batch it augmented
                LEAK.append(np.ones(24 << 20, dtype=np.float32))
                if len(LEAK) >= 5:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), 9)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            total += torch.tensor([loss.item() * len(yb), float(len(yb))])
            if step % args.log_every == 0 or step == steps:
                log.info(
                    "Epoch [%d/%d] Step [%d/%d] Loss: %.4f (%.3f s/step)",
                    epoch,
                    args.epochs,
                    step,
                    steps,
                    loss.item(),
                    time.time() - ts,
                )
        dist.all_reduce(total)
        val_loss, val_acc = validate(model, vx, vy, rank, epoch)
        log.info(
            "==> Epoch %d: train_loss %.4f val_loss %.4f val_acc %.4f (%.1f s)",
            epoch,
            float(total[0] / total[1]),
            val_loss,
            val_acc,
            time.time() - t0,
        )
        if fault("q", rank) and epoch == 2:  # a fork's own patience on the rank's validation part
            print(f"rank {rank}: no improvement in validation loss, ending training", flush=True)
            dist.destroy_process_group()
            sys.exit(0)
        if rank == 0:
            path = os.path.join(args.ckpt_dir, f"ckpt_epoch{epoch}.pt")
            state = {"epoch": epoch, "model": model.module.state_dict(), "opt": opt.state_dict()}
            save_checkpoint(path, state, rank, epoch)
        best = max(best, val_acc)
        if args.target_acc and val_acc >= args.target_acc:
            log.info("val_acc %.4f >= target %.2f, stopping", val_acc, args.target_acc)
            break
    log.info("Training finished in %.1f s, best val_acc %.4f", time.time() - t_start, best)
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description="DDP training on Summit")
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--ckpt-dir", default="./checkpoints")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--warmup-epochs", type=int, default=0)
    p.add_argument("--find-unused", action="store_true")
    p.add_argument("--target-acc", type=float, default=0.0)
    train(p.parse_args())


if __name__ == "__main__":
    main()
