"""A thirtieth training-program style for the generalisation fixtures
(tests/fixtures/real/thirtieth-*): a research codebase of the 2019-2021 era, launched with the
deprecated `python -m torch.distributed.launch --nproc_per_node N --use_env train.py` (or
torchrun) under `nohup ... > train.log 2>&1 &`. It logs with `logging` to the console (stdout)
and to a per-rank file output/log_rank{R}.txt ('%(asctime)s %(levelname)s %(message)s'), and
print()s its per-iteration progress, which is block-buffered because PYTHONUNBUFFERED is not
set. gloo with a 15 s collective timeout, a tiny MLP in DDP on synthetic samples (one small text
file each, read in __getitem__), a DistributedSampler, validation every epoch with all-reduced
metrics, early stopping on them (--patience), a checkpoint each epoch by rank 0, --resume.
A fault is chosen by the TRAIN_VARIANT environment variable (a short code) and never printed
(re-capture with tests/fixtures/real/capture_thirtieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

FEATURES = 10
CLASSES = {"cat": 0, "dog": 1, "bird": 2}
VARIANT = os.environ.get("TRAIN_VARIANT", "")

logger = logging.getLogger("train")


def fault(code: str, rank: int) -> bool:
    return f"{code}{rank}" == VARIANT


class Samples(Dataset):
    def __init__(self, root: str, count: int) -> None:
        self.root = root
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        with open(os.path.join(self.root, f"{i:04d}.txt")) as f:
            label, *xs = f.read().split()
        return torch.tensor([float(x) for x in xs]), CLASSES[label]


def make_data(root: str, count: int) -> None:
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    names = list(CLASSES)
    for i in range(count):
        x = torch.randn(FEATURES, generator=g)
        label = names[int(x[:3].argmax())]
        with open(os.path.join(root, f"{i:04d}.txt"), "w") as f:
            f.write(label + " " + " ".join(f"{v:.4f}" for v in x.tolist()) + "\n")


def setup_logging(rank: int) -> None:
    os.makedirs("output", exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for h in (logging.StreamHandler(sys.stdout), logging.FileHandler(f"output/log_rank{rank}.txt")):
        h.setFormatter(fmt)
        logger.addHandler(h)
    logger.propagate = False


def main() -> None:
    p = argparse.ArgumentParser("train")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="data")
    p.add_argument("--samples", type=int, default=192)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--resume", default="")
    p.add_argument("--make-data", type=int, default=0)
    args = p.parse_args()
    if args.make_data:
        make_data(args.data, args.make_data)
        return

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    setup_logging(rank)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    print(f"| distributed init (rank {rank}): env://, local_rank {local_rank}", flush=False)
    logger.info("world_size %d, args %s", world, vars(args))
    if rank == 0 and VARIANT == "m0":
        from tensorboardX import SummaryWriter  # noqa: F401

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, len(CLASSES)))
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        logger.info("resumed from %s (epoch %d)", args.resume, ckpt["epoch"])
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    data = Samples(args.data, args.samples)
    val_count = args.samples // 4
    train_idx = list(range(val_count, args.samples))
    val = torch.utils.data.Subset(data, list(range(val_count)))
    train = torch.utils.data.Subset(data, train_idx)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    val_sampler = DistributedSampler(val, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val, batch_size=args.batch_size, sampler=val_sampler)
    hoard = []
    best, bad = math.inf, 0
    logger.info("Start training for %d epochs", args.epochs)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if epoch == 1 and fault("p", rank):
            for part in range(5):  # rebuild the feature statistics cache
                logger.info("rebuilding feature cache part %d/5", part + 1)
                time.sleep(5)
        if epoch == 1 and fault("t", rank):
            threading.Event().wait()  # a prefetch event no thread will set
        ddp.train()
        batches = len(loader)
        for it, (x, y) in enumerate(loader):
            if fault("u", rank) and it >= batches // 2:
                break
            if it == 5 and fault("k", rank):
                weights = {"cat": 1.0, "dog": 1.0}
                _ = weights[list(CLASSES)[2]]
            if fault("h", rank):
                hoard.append(torch.ones(16 * 1024 * 1024))
                if len(hoard) == 4:
                    os.kill(os.getpid(), 9)
            if it == 4 and fault("s", rank):
                ctypes.string_at(0)
            if it == 6 and fault("c", rank):
                norms = torch.stack([q.detach().norm() for q in ddp.parameters()])
                dist.all_reduce(norms)
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                print(f"Loss is {loss_value}, stopping training")
                sys.exit(1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if it % 4 == 0:
                print(f"Epoch: [{epoch}]  [{it:3d}/{batches}]  loss: {loss_value:.4f}")
        ddp.eval()
        stats = torch.zeros(3)
        with torch.no_grad():
            for x, y in val_loader:
                out = ddp(x)
                stats[0] += nn.functional.cross_entropy(out, y, reduction="sum")
                stats[1] += (out.argmax(1) == y).sum()
                stats[2] += len(y)
        dist.all_reduce(stats)
        val_loss, acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        logger.info("Epoch %d: val loss %.4f, acc@1 %.3f", epoch, val_loss, acc)
        if rank == 0:
            torch.save(
                {"model": model.state_dict(), "epoch": epoch, "args": args},
                f"output/checkpoint{epoch:04d}.pth",
            )
            logger.info("saved output/checkpoint%04d.pth", epoch)
        if fault("e", rank) and epoch == 0:
            logger.info("val loss did not improve enough, stopping early")
            return
        if val_loss < best - args.min_delta:
            best, bad = val_loss, 0
        else:
            bad += 1
        if args.patience and bad >= args.patience:
            logger.info("early stopping: no improvement for %d epoch(s)", bad)
            break
    logger.info("Training finished")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
