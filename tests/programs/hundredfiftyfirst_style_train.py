"""A hundred-and-fifty-first training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyfirst-*): a PyTorch command job on Azure Machine Learning, the
way the azureml-examples' distributed PyTorch job trains (`distribution: type: pytorch,
process_count_per_instance: 2`, one or two instances), re-created in plain torch without the
Azure ML SDK or mlflow installed. Each run's code folder links this file as train.py; the
platform's execution wrapper (tests/programs/hundredfiftyfirst_execution_wrapper.py) starts it
once per process with MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE and NODE_RANK set
and each process's stdout and stderr in the job folder's user_logs/std_log_process_<rank>.txt.

As there: argparse arguments ('--data-dir ${{inputs.train_data}}'), the PyTorch environment
variables read from os.environ (`int(os.environ["WORLD_SIZE"])`), init_process_group(env://,
gloo here, a 15 s timeout); the data input's shards (train/part-0000K.npz: tiny synthetic 8x8
'digits', ten classes) listed with os.listdir and divided among the ranks (shards[rank::world]),
validation (val/val.npy, val/val_labels.npy) split the same way and its loss and accuracy
all-reduced; a small CNN in DDP, SGD with momentum and a StepLR; rank 0 writes a checkpoint to
the checkpoints output every epoch and the model to ./outputs at the end. Prints: rank 0's
config dump ('Arguments: Namespace(...)', the environment), 'Rank 0: Starting epoch 1', 'Rank 1:
[1,     4] loss: 2.291' every --print-freq steps, rank 0's tqdm bar on stderr ('Epoch 1/4:
100%|██████████| 16/16 [00:00<00:00, 41.02it/s, loss=0.512]'), mlflow metrics as printed lines
("mlflow.log_metric('train_loss', 0.5123, step=16)"), Python logging's default format
('INFO:__main__:epoch 2 train_loss=0.512', 'INFO:__main__:epoch 2 val_loss=0.401 val_acc=0.875')
and 'Rank 0: Finished Training'. stdout is block-buffered in a file (no PYTHONUNBUFFERED), so
print() lines arrive late or, for a killed process, never; logging (stderr) arrives at once.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyfirst.sh after any edit).
`python train.py --generate DIR SHARDS` writes the synthetic data input.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

CASE = os.environ.get("MT_CASE", "")
logger = logging.getLogger(__name__)


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the data input
def generate(folder: str, shards: int, per_shard: int = 64, val: int = 128) -> None:
    rng = np.random.default_rng(0)
    protos = rng.normal(0, 1, size=(10, 8, 8)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n)
        x = protos[y] + rng.normal(0, 2.6, size=(n, 8, 8)).astype(np.float32)
        return x[:, None].astype(np.float32), y.astype(np.int64)

    os.makedirs(os.path.join(folder, "train"), exist_ok=True)
    os.makedirs(os.path.join(folder, "val"), exist_ok=True)
    for k in range(shards):
        x, y = draw(per_shard)
        np.savez(os.path.join(folder, "train", f"part-{k:05d}.npz"), x=x, y=y)
    x, y = draw(val)
    np.save(os.path.join(folder, "val", "val.npy"), x)
    np.save(os.path.join(folder, "val", "val_labels.npy"), y)


# ------------------------------------------------------------------ mlflow (azureml-mlflow)
class _MlflowPrinter:
    """What the job's metrics calls show in its log: mlflow is not installed here."""

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        print(f"mlflow.log_metric('{key}', {value:.4f}, step={step})")

    def log_params(self, params: dict[str, Any]) -> None:
        print(f"mlflow.log_params({params})")


mlflow = _MlflowPrinter()


# ------------------------------------------------------------------ tqdm
def tqdm(items: Iterable[Any], desc: str, total: int, disable: bool) -> Iterator[Any]:
    """tqdm's default bar on stderr, redrawn with a carriage return at most every 0.1 s (its
    mininterval), with a loss postfix."""
    if disable:
        yield from items
        return
    t0 = time.time()
    post = [""]

    def bar(n: int) -> str:
        el = time.time() - t0
        rate = n / el if el > 0 and n else 0.0
        left = (total - n) / rate if rate else 0.0
        filled = int(10 * n / total) if total else 10
        pct = int(100 * n / total) if total else 100
        rate_s = f"{rate:.2f}it/s" if rate else "?it/s"
        return (
            f"\r{desc}: {pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d},"
            f" {rate_s}{post[0]}]"
        )

    sys.stderr.write(bar(0))
    sys.stderr.flush()
    drawn = t0
    for n, item in enumerate(items, 1):
        yield item
        post[0] = f", loss={LAST_LOSS[0]:.3f}"
        if time.time() - drawn >= 0.1 or n == total:  # tqdm's mininterval
            drawn = time.time()
            sys.stderr.write(bar(n))
            sys.stderr.flush()
    sys.stderr.write("\n")


# ------------------------------------------------------------------ model and helpers
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.fc1 = nn.Linear(8 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        out: torch.Tensor = self.fc2(x)
        return out


class MetricsBuffer:
    """Keeps the step losses and hands them to mlflow in batches."""

    def __init__(self, rank: int, size: int = 8) -> None:
        self.rank, self.size = rank, size
        self.items: list[tuple[int, float]] = []
        self.lock = threading.Lock()

    def add(self, step: int, value: float, epoch: int) -> None:
        with self.lock:
            self.items.append((step, value))
            if fault("w", self.rank) and epoch >= 2 and len(self.items) >= self.size:
                self.flush()  # a fork flushes from inside add: the lock is not reentrant
            elif len(self.items) >= self.size:
                self._drain()

    def flush(self) -> None:
        with self.lock:
            self._drain()

    def _drain(self) -> None:
        if self.rank == 0:
            step, value = self.items[-1]
            mlflow.log_metric("train_loss_step", value, step=step)
        self.items.clear()


def load_shards(folder: str, rank: int, world: int) -> tuple[TensorDataset, list[str]]:
    train_dir = os.path.join(folder, "train")
    shards = sorted(os.listdir(train_dir))
    mine = shards[rank::world]
    xs, ys = [], []
    for name in mine:
        with np.load(os.path.join(train_dir, name)) as z:
            xs.append(z["x"])
            ys.append(z["y"])
    data = TensorDataset(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))
    return data, mine


def load_val(folder: str, rank: int, world: int, mmap: bool) -> TensorDataset:
    x = np.load(os.path.join(folder, "val", "val.npy"), mmap_mode="r" if mmap else None)
    y = np.load(os.path.join(folder, "val", "val_labels.npy"))
    return TensorDataset(torch.as_tensor(x[rank::world]), torch.as_tensor(y[rank::world]))


def evaluate(model: nn.Module, loader: DataLoader[Any]) -> tuple[float, float]:
    model.eval()
    total = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            total[0] += float(F.cross_entropy(out, y, reduction="sum"))
            total[1] += float((out.argmax(1) == y).sum())
            total[2] += len(y)
    dist.all_reduce(total)
    return float(total[0] / total[2]), float(total[1] / total[2])


def save_checkpoint(state: dict[str, Any], folder: str, epoch: int, rank: int) -> None:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"checkpoint_epoch{epoch}.pt")
    logger.info("Saving checkpoint to %s", path)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        for k in range(0, len(data), 4096):
            f.write(data[k : k + 4096])
            if fault("s", rank) and epoch >= 2:  # the output mount flushes each block to blob
                f.flush()
                time.sleep(2.5)


LAST_LOSS = [0.0]
LEAK: list[np.ndarray] = []


# ------------------------------------------------------------------ the job's script
def main(args: argparse.Namespace) -> None:
    # get PyTorch environment variables
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    distributed = world_size > 1

    if rank == 0:
        print(f"Arguments: {args}")
        print(
            f"Environment: MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
            f"MASTER_PORT={os.environ.get('MASTER_PORT')} WORLD_SIZE={world_size} "
            f"NODE_RANK={os.environ.get('NODE_RANK')} torch {torch.__version__}"
        )
        mlflow.log_params(
            {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.learning_rate}
        )

    # initialize distributed process group using default env:// method
    if distributed:
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))
    logger.info(
        "Rank %d of %d (local rank %d) joined the process group", rank, world_size, local_rank
    )

    train_set, mine = load_shards(args.data_dir, rank, world_size)
    logger.info("Rank %d: %d samples from %s", rank, len(train_set), ", ".join(mine))
    val_set = load_val(args.data_dir, rank, world_size, args.val_mmap)
    gen = torch.Generator().manual_seed(rank)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=gen,
    )
    val_loader = DataLoader(val_set, batch_size=args.batch_size)

    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=args.find_unused)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    metrics = MetricsBuffer(rank)

    step = 0
    for epoch in range(1, args.epochs + 1):
        print("Rank %d: Starting epoch %d" % (rank, epoch))  # noqa: UP031
        model.train()
        running, seen = 0.0, 0
        n_batches = len(train_loader)
        for i, (x, y) in enumerate(
            tqdm(train_loader, f"Epoch {epoch}/{args.epochs}", n_batches, disable=rank != 0)
        ):
            if fault("k", rank) and epoch >= 2:  # a fork keeps every batch for replay
                LEAK.append(np.ones(12 << 20, dtype=np.float32))
                if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), 9)
            if fault("z", rank) and epoch >= 2 and i == 5:
                ctypes.string_at(0)  # a compiled augmentation reads a freed buffer
            optimizer.zero_grad()
            outputs = model(x)
            loss = criterion(outputs, y)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            step += 1
            LAST_LOSS[0] = loss.item()
            running += loss.item() * len(y)
            seen += len(y)
            metrics.add(step, loss.item(), epoch)
            if (i + 1) % args.print_freq == 0:  # print every print_freq mini-batches
                print("Rank %d: [%d, %5d] loss: %.3f" % (rank, epoch, i + 1, running / seen))  # noqa: UP031
        scheduler.step()
        if fault("x", rank) and epoch >= 2:  # a fork reports the learning rate from one rank
            print(f"Rank {rank}: learning rate now {scheduler.get_last_lr():.5f}")
        t = torch.tensor([running, float(seen)], dtype=torch.float64)
        dist.all_reduce(t)
        train_loss = float(t[0] / t[1])
        logger.info("epoch %d train_loss=%.3f", epoch, train_loss)
        if fault("e", rank) and epoch >= 2:  # a fork's stopping rule on the rank's own loss
            logger.info("Rank %d: training loss has stopped improving, exiting", rank)
            sys.exit(0)
        if fault("v", rank) and rank != 0:
            continue  # a fork validates on rank 0 only
        val_loss, val_acc = evaluate(model, val_loader)
        logger.info("epoch %d val_loss=%.3f val_acc=%.3f", epoch, val_loss, val_acc)
        if rank == 0:
            mlflow.log_metric("train_loss", train_loss, step=epoch)
            mlflow.log_metric("val_loss", val_loss, step=epoch)
            mlflow.log_metric("val_acc", val_acc, step=epoch)
            state = {
                "epoch": epoch,
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            save_checkpoint(state, args.checkpoint_dir, epoch, rank)
        if args.target_acc and val_acc >= args.target_acc:
            logger.info(
                "val_acc %.3f reached the target %.3f, stopping training", val_acc, args.target_acc
            )
            break

    print("Rank %d: Finished Training" % (rank))  # noqa: UP031
    if not distributed or rank == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        model_path = os.path.join(args.model_dir, "model.pt")
        torch.save(model.module.state_dict(), model_path)
        logger.info("Saved the model to %s", model_path)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    logging.basicConfig(level=logging.INFO)
    # setup argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=str, help="directory containing the training data")
    parser.add_argument("--checkpoint-dir", type=str, default="./outputs/checkpoints")
    parser.add_argument("--model-dir", type=str, default="./outputs", help="output directory")
    parser.add_argument("--epochs", default=4, type=int, help="number of epochs")
    parser.add_argument("--batch-size", default=16, type=int, help="mini batch size per rank")
    parser.add_argument("--workers", default=0, type=int, help="data loading workers")
    parser.add_argument("--learning-rate", default=0.05, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--print-freq", default=4, type=int, help="frequency of printing")
    parser.add_argument("--target-acc", default=0.0, type=float, help="stop at this accuracy")
    parser.add_argument("--find-unused", action="store_true")
    parser.add_argument("--val-mmap", action="store_true", help="memory-map the validation set")
    args = parser.parse_args()

    main(args)
