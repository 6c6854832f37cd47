"""A twenty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/twentyfifth-*): a modern CLI script built on `rich`. `rich.traceback.install`
at import (uncaught exceptions print rich's boxed tracebacks; torch's process group wraps that
hook with its "[rankN]: " prefix once it is initialised), `logging.basicConfig` with a
`RichHandler(rich_tracebacks=True)` ("[12/03/26 05:40:11] INFO     message    train.py:42",
wrapped at the console's width), a `rich.progress.Progress` bar on rank 0 only, a `console.rule()`
per epoch, and "[rank N]" in a message only where the program writes it. A tiny classifier read
from CSV (each row parsed in `__getitem__`), DDP on gloo, DistributedSampler (or per-rank shard
files with --shards), a checkpoint written by rank 0 each epoch, evaluation whose counts are
all-reduced, an early-stopping rule (--patience/--min-delta, --target-acc), a SIGTERM handler.
Its own launcher: --nprocs N spawns the ranks with torch.multiprocessing.spawn; without it the
script runs under torchrun. Collective timeout 15 s. A fault is chosen by the TRAIN_FX
environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_twentyfifth.sh after any edit).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.traceback import install
from torch import nn
from torch.multiprocessing.spawn import spawn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

install(show_locals=False)
console = Console()
logging.basicConfig(
    level="INFO",
    format="%(message)s",
    datefmt="[%x %X]",
    handlers=[RichHandler(console=console, rich_tracebacks=True)],
)
log = logging.getLogger("train")

TIMEOUT = timedelta(seconds=15)
FEATURES = 16


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    cat_rank: int = -1  # this rank's feature mixing concatenates mismatched halves
    pickle_rank0: bool = False  # rank 0's checkpoint also holds the Progress (an RLock inside)
    hoard_rank: int = -1  # this rank keeps every batch's features until the OOM killer acts
    null_rank: int = -1  # this rank's native augmentation reads address 0
    wait_rank: int = -1  # this rank waits before epoch 2 for a prefetch thread never started
    mirror_rank0: bool = False  # rank 0 mirrors its epoch-1 checkpoint for 25 s
    gate_rank0: bool = False  # rank 0 alone waits at a barrier before writing its checkpoint
    local_metric: bool = False  # the evaluation counts are not all-reduced: each rank decides


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q1": Fault(cat_rank=1),
    "w0": Fault(pickle_rank0=True),
    "m1": Fault(hoard_rank=1),
    "z2": Fault(null_rank=2),
    "y3": Fault(wait_rank=3),
    "b0": Fault(mirror_rank0=True),
    "g0": Fault(gate_rank0=True),
    "n": Fault(local_metric=True),
}


def current_fault() -> Fault:
    return FAULTS[os.environ.get("TRAIN_FX", "")]


class CsvRows(Dataset[tuple[torch.Tensor, int]]):
    """A header, then FEATURES floats and a class name a row; a row is parsed when read."""

    def __init__(self, path: str, classes: list[str]) -> None:
        with open(path, newline="") as f:
            self.rows = list(csv.reader(f))[1:]
        self.classes = classes

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.rows[i]
        x = torch.tensor([float(v) for v in row[:FEATURES]])
        return x, self.classes.index(row[FEATURES])


def make_data(folder: str, n: int) -> None:
    os.makedirs(folder, exist_ok=True)
    classes = ["heron", "finch", "wren", "kite"]
    with open(os.path.join(folder, "classes.json"), "w") as f:
        json.dump(classes, f)
    for name, count, seed in (("train.csv", n, 5), ("val.csv", n // 4, 6)):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(count, FEATURES, generator=g)
        y = (x[:, :4] + 0.8 * torch.randn(count, 4, generator=g)).argmax(1).tolist()
        with open(os.path.join(folder, name), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([f"f{i}" for i in range(FEATURES)] + ["label"])
            for row, label in zip(x.tolist(), y, strict=True):
                w.writerow([f"{v:.4f}" for v in row] + [classes[label]])


class EarlyStopping:
    """Stop when the score reaches the target, or has not improved by min_delta for patience
    evaluations."""

    def __init__(self, patience: int, min_delta: float, target: float) -> None:
        self.patience, self.min_delta, self.target = patience, min_delta, target
        self.best = -1.0
        self.bad = 0

    def step(self, score: float) -> str:
        if self.target and score >= self.target:
            return f"accuracy {score:.3f} reached the target {self.target:.3f}"
        if score > self.best + self.min_delta:
            self.best, self.bad = score, 0
            return ""
        self.bad += 1
        if self.patience and self.bad >= self.patience:
            return f"no improvement for {self.bad} epoch(s), best {self.best:.3f}"
        return ""


def evaluate(
    model: nn.Module, loader: DataLoader[tuple[torch.Tensor, int]], reduce: bool
) -> tuple[float, float]:
    model.eval()
    counts = torch.zeros(3)
    crit = nn.CrossEntropyLoss(reduction="sum")
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            counts += torch.tensor(
                [float((out.argmax(1) == y).sum()), float(len(y)), float(crit(out, y))]
            )
    if reduce:
        dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1]), float(counts[2] / counts[1])


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except Exception:
        log.exception(f"could not write checkpoint {path}")
        raise


def worker(local_rank: int, args: argparse.Namespace) -> None:
    fault = current_fault()
    if args.nprocs:  # spawned by this script
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=local_rank,
            world_size=args.nprocs,
            timeout=TIMEOUT,
        )
    else:  # under torchrun
        dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    mix_step = 3 if rank == fault.cat_rank else -1
    keep_features = rank == fault.hoard_rank
    native_aug_step = 3 if rank == fault.null_rank else -1
    prefetch_epoch = 2 if rank == fault.wait_rank else -1
    mirror = fault.mirror_rank0
    sync_before_save = fault.gate_rank0
    keep_bar = fault.pickle_rank0
    reduce_metrics = not fault.local_metric

    def on_term(signum: int, frame: FrameType | None) -> None:
        log.warning(f"[rank {rank}] SIGTERM received, stopping")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)

    with open(os.path.join(args.data, "classes.json")) as f:
        classes = json.load(f)
    if args.shards:
        train_ds = CsvRows(os.path.join(args.shards, f"part-{rank}.csv"), classes)
        sampler: DistributedSampler[tuple[torch.Tensor, int]] | None = None
        loader = DataLoader(train_ds, batch_size=args.batch_size, drop_last=True)
    else:
        train_ds = CsvRows(os.path.join(args.data, "train.csv"), classes)
        sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed, drop_last=True)
        loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_ds = CsvRows(os.path.join(args.data, "val.csv"), classes)
    val_loader = DataLoader(
        val_ds, batch_size=args.batch_size, sampler=DistributedSampler(val_ds, shuffle=False)
    )
    log.info(f"[rank {rank}] {len(loader)} batches an epoch")

    model = DDP(nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, len(classes))))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    if rank == 0:
        log.info(f"world size {world}, backend {dist.get_backend()}, {args.epochs} epochs")
        if args.report_to == "wandb":
            import wandb

            wandb.init(project="birds", config=vars(args))
        os.makedirs(args.output, exist_ok=True)
    stopper = EarlyStopping(args.patience, args.min_delta, args.target_acc)
    progress = Progress(
        TextColumn("[bold blue]epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
    )
    hoard: list[torch.Tensor] = []
    prev_x = torch.zeros(args.batch_size, FEATURES)
    for epoch in range(1, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        if rank == 0:
            console.rule(f"Epoch {epoch}/{args.epochs}")
        if epoch == prefetch_epoch:
            threading.Event().wait()  # set by a prefetch thread that was never started
        live = progress if rank == 0 else contextlib.nullcontext()
        with live:
            task = progress.add_task("train", total=len(loader), epoch=epoch, loss=0.0)
            for step, (x, y) in enumerate(loader, 1):
                if epoch == 1 and step == mix_step:
                    x = torch.cat([x, prev_x[:, : FEATURES // 2]], dim=0)  # mix with last batch
                if keep_features:
                    hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                    if len(hoard) == 4:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if epoch == 1 and step == native_aug_step:
                    ctypes.string_at(0)  # the native augmentation dereferences NULL
                prev_x = x
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                progress.update(task, advance=1, loss=loss.item())
                if rank == 0 and step % args.log_every == 0:
                    log.info(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f}")
        progress.remove_task(task)
        acc, vloss = evaluate(model, val_loader, reduce_metrics)
        if rank == 0:
            log.info(f"epoch {epoch}: val accuracy {acc:.3f}, val loss {vloss:.4f}")
            if sync_before_save:
                dist.barrier()  # every rank has finished the epoch before the checkpoint
            state: dict[str, Any] = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "accuracy": acc,
            }
            if keep_bar:
                state["progress"] = progress  # resume the bar where it was
            path = os.path.join(args.output, f"epoch{epoch:03d}.pt")
            save_checkpoint(path, state)
            log.info(f"saved {path}")
            if mirror and epoch == 1:
                for part in range(1, 6):
                    log.info(f"mirroring {path} to the model store: part {part}/5")
                    time.sleep(5)
        why = stopper.step(acc)
        if why:
            log.info(f"[rank {rank}] early stopping after epoch {epoch}: {why}")
            break
    if rank == 0:
        console.rule("done")
        log.info(f"training finished, best accuracy {stopper.best:.3f}")
    dist.destroy_process_group()


def spawn_ranks(args: argparse.Namespace) -> None:
    """The script's own launcher: --nprocs ranks as child processes of this one."""
    start: Callable[..., object] = spawn
    start(worker, args=(args,), nprocs=args.nprocs, join=True)


def main() -> None:
    p = argparse.ArgumentParser(description="Train the bird classifier.")
    p.add_argument("--nprocs", type=int, default=0, help="spawn N ranks here (no torchrun)")
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--data", default="data")
    p.add_argument("--shards", default="", help="a folder of per-rank part-<rank>.csv files")
    p.add_argument("--output", default="checkpoints")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=4)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--target-acc", type=float, default=0.0)
    p.add_argument("--report-to", default="none", choices=["none", "wandb"])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--make-data", type=int, default=0, help="write N samples to --data and stop")
    args = p.parse_args()
    if args.make_data:
        make_data(args.data, args.make_data)
        return
    if args.nprocs:
        log.info(f"launching {args.nprocs} processes on port {args.port}")
        spawn_ranks(args)
    else:
        worker(int(os.environ["LOCAL_RANK"]), args)


if __name__ == "__main__":
    main()
