"""An eighteenth training-program style for the generalisation fixtures
(tests/fixtures/real/eighteenth-*): a DDP script launched by OpenMPI's mpirun, the way
Horovod-era and HPC-centre code does it. Rank, world size and local rank come from
OMPI_COMM_WORLD_*, MASTER_ADDR/MASTER_PORT from the job script (`mpirun -x`), env://
init on gloo with a 15 s timeout, a small MLP under raw DDP on CPU, pre-sharded tensor files
staged to node-local scratch by each node's first process, a DistributedSampler (or one file
list per rank), bare print() progress on rank 0 plus a few per-rank lines, a checkpoint saved
by rank 0 and loaded by every rank. A fault is chosen by a short code in TRAIN_SIM and named
by what it does, never printed (re-capture with tests/fixtures/real/capture_eighteenth.sh).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES = 32
CLASSES = 10
TRAIN_FILES = 10
PER_FILE = 32


@dataclass(frozen=True)
class Sim:
    """What goes wrong in the code (the defaults: nothing)."""

    loud: bool = False  # old-style scheduler order and too many loader workers
    bad_label_rank: int = -1  # this rank meets a label its class map lacks
    kill_rank: int = -1  # this rank hoards memory until SIGKILL (the OOM killer's way)
    segv_rank: int = -1  # this rank's native feature hook reads address 0
    leave_rank: int = -1  # this rank decides its sample budget is spent and exits 0
    metric_on_zero: bool = False  # the validation accuracy is all-reduced on rank 0 only
    index_rank: int = -1  # this rank builds a token index after init, before DDP
    stage_by_global: bool = False  # node-local staging keyed on the global rank


SIMS: dict[str, Sim] = {
    "": Sim(),
    "w": Sim(loud=True),
    "kr": Sim(bad_label_rank=2),
    "k9": Sim(kill_rank=1),
    "sv": Sim(segv_rank=3),
    "ex": Sim(leave_rank=2),
    "mz": Sim(metric_on_zero=True),
    "ix": Sim(index_rank=0),
    "sg": Sim(stage_by_global=True),
}


def make_data(root: Path) -> None:
    """Writes the synthetic, seeded set: train-NNN.pt files and one val-R.pt per rank of 4."""
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(18)
    proj = torch.randn(FEATURES, CLASSES, generator=gen)
    for i in range(TRAIN_FILES + 4):
        x = torch.randn(PER_FILE, FEATURES, generator=gen)
        y = (x @ proj).argmax(dim=1)
        name = f"train-{i:03d}.pt" if i < TRAIN_FILES else f"val-{i - TRAIN_FILES}.pt"
        torch.save({"x": x, "y": y}, root / name)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="MLP classifier, data parallel over MPI ranks")
    p.add_argument("--data", default="data")
    p.add_argument("--make-data", action="store_true")
    p.add_argument("--distributed", action="store_true", help="take ranks from mpirun")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stage", action="store_true", help="copy the data to $LOCAL_SCRATCH")
    p.add_argument("--shard-files", action="store_true", help="one file list per rank")
    p.add_argument("--feature-cache", default="", help="per-rank cache dir, locked")
    p.add_argument("--log-every", type=int, default=5)
    return p.parse_args()


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) as OpenMPI exports them."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    return rank, size, local


def stage(src: Path, stager: bool) -> Path:
    """The node's first process copies the set to node-local scratch; the others wait."""
    dst = Path(os.environ.get("LOCAL_SCRATCH", "/tmp")) / "mlp-data"
    if stager:
        shutil.copytree(src, dst, dirs_exist_ok=True)
        print(f"staged {len(list(dst.iterdir()))} files to {dst}")
    dist.barrier()
    return dst


def build_index(docs: int) -> dict[int, int]:
    """A token index built in Python, slow for a large corpus (done before training starts)."""
    index: dict[int, int] = {}
    for d in range(docs):
        for t in range(d % 97, d % 97 + 40):
            index[t] = index.get(t, 0) + 1
    return index


def read_cache(cache: Path, rank: int) -> None:
    """Takes this rank's cache lock (another job may hold it) before reading its features."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"shard-{rank}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fcntl.flock(fh, fcntl.LOCK_UN)


def load(files: list[Path]) -> TensorDataset:
    parts = [torch.load(f) for f in files]
    return TensorDataset(torch.cat([p["x"] for p in parts]), torch.cat([p["y"] for p in parts]))


def main() -> int:
    args = parse()
    if args.make_data:
        make_data(Path(args.data))
        return 0
    sim = SIMS[os.environ.get("TRAIN_SIM", "")]
    rank, size, local = world() if args.distributed else (0, 1, 0)
    host = socket.gethostname()
    if size > 1:
        dist.init_process_group(
            backend="gloo", init_method="env://", rank=rank, world_size=size,
            timeout=timedelta(seconds=15),
        )  # fmt: skip
        if rank == 0:
            print(f"Initialized gloo process group: {size} processes")
    data = Path(args.data)
    if args.stage:
        data = stage(data, (rank if sim.stage_by_global else local) == 0)
    if args.feature_cache:
        read_cache(Path(args.feature_cache), rank)
    if rank == sim.index_rank:
        print("building token index for the vocabulary ...")
        t0 = time.time()
        idx = build_index(10_000_000)
        print(f"token index: {len(idx)} entries in {time.time() - t0:.1f} s")

    train_files = sorted(data.glob("train-*.pt"))
    if not train_files:
        raise FileNotFoundError(f"no training files (train-*.pt) in {data}")
    if args.shard_files:
        train_set = load(train_files[rank::size])
        sampler = None
    else:
        train_set = load(train_files)
        sampler = (
            DistributedSampler(train_set, size, rank, shuffle=True, seed=18) if size > 1 else None
        )
    val_set = load([data / f"val-{rank}.pt"])
    workers = 3 if sim.loud else 0
    loader = DataLoader(
        train_set, batch_size=args.batch_size, sampler=sampler,
        shuffle=sampler is None and not args.shard_files, num_workers=workers,
    )  # fmt: skip
    print(f"worker {rank}/{size} (local {local}) on {host}: {len(loader)} batches per epoch")

    torch.manual_seed(18)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    if size > 1:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    loss_fn = nn.CrossEntropyLoss()
    class_map = {c: c for c in range(CLASSES)}

    ckpt = Path(args.ckpt_dir) / "last.pt"
    start = 1
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu")
        (model.module if size > 1 else model).load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["epoch"]) + 1
        print(f"worker {rank}: resumed from {ckpt} at epoch {start}")

    t_start = time.time()
    for epoch in range(start, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        if sim.loud:
            sched.step()  # the pre-1.1 order: schedule first
        model.train()
        t0 = time.time()
        seen = 0
        for step, (x, y) in enumerate(loader, 1):
            if rank == sim.bad_label_rank and epoch == 1 and step == 7:
                y = y.clone()
                y[3] = CLASSES  # a sample labelled with a class the map was not built with
            y = torch.tensor([class_map[int(v)] for v in y])
            if rank == sim.segv_rank and step == 6:
                ctypes.string_at(0)
            if rank == sim.kill_rank and step == 8:
                hoard = [torch.ones(16 * 1024 * 1024) for _ in range(4)]
                os.kill(os.getpid(), signal.SIGKILL)
                del hoard
            if rank == sim.leave_rank and step == 4:
                print(f"sample budget of {seen} reached, stopping")
                sys.exit(0)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            seen += len(x)
            if rank == 0 and step % args.log_every == 0:
                rate = seen * size / max(time.time() - t0, 1e-6)
                print(
                    f"Epoch {epoch} | step {step}/{len(loader)} | loss {loss.item():.4f}"
                    f" | {rate:.0f} img/s"
                )
        if not sim.loud:
            sched.step()
        model.eval()
        with torch.no_grad():
            correct = torch.tensor([0.0, 0.0])
            for x, y in DataLoader(val_set, batch_size=16):
                correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
            if size > 1 and (rank == 0 or not sim.metric_on_zero):
                dist.all_reduce(correct)
        if rank == 0:
            print(
                f"Epoch {epoch} | val acc {correct[0] / correct[1]:.4f} | {time.time() - t0:.1f} s"
            )
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            inner = model.module if size > 1 else model
            torch.save(
                {"epoch": epoch, "model": inner.state_dict(), "optim": opt.state_dict()}, ckpt
            )
            print(f"saved {ckpt}")
        if size > 1:
            dist.barrier()
    if rank == 0:
        print(f"Training complete in {time.time() - t_start:.1f} s")
    if size > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
