"""A hundred-and-fifty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyfifth-*): a PyTorch DDP job on a PBS Pro supercomputer the way
ALCF's Polaris user guide and the HPC centres' DDP examples run one, re-created in plain torch
(CPU, gloo). Each run's job folder links this file as train.py; a PBS job script (#PBS -l
select=2:system=polaris, -l walltime=..., -q debug, -A project) exports MASTER_ADDR (`head -n 1
$PBS_NODEFILE`) and MASTER_PORT, stages the data set onto each node's local SSD (/local/scratch)
and starts `mpiexec -n 4 --ppn 2 --depth 8 --cpu-bind depth --env OMP_NUM_THREADS=1 python
train.py` (Cray PALS), one mode OpenMPI's `mpirun -np 4 --npernode 2`, one mode plain `python
train.py`.

As there: the rank, the world size and the local rank come from the MPI launcher's variables
(PMI_RANK, PMI_SIZE, PALS_LOCAL_RANKID; else OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), the
program sets RANK, WORLD_SIZE and LOCAL_RANK by hand and calls init_process_group(env://, gloo
here, a 15 s timeout); every rank prints 'rank 2/4 on x3005c0s19b1n0 local 0' at start (print(),
flushed: PBS keeps the job's stdout in a file, train.o<jobid>, and its stderr in another,
train.e<jobid>, so a rank's prints and its tracebacks part ways); rank 0 prints the config
block, the pytorch/examples MNIST progress lines ('Train Epoch: 1 [128/512 (25%)]\tLoss:
2.301234'), the all-reduced epoch summary ('Epoch 1: train loss 1.2345, 0.98 s, 2089.7
samples/s'), the per-class accuracy of its last 256 samples, the test set line ('Test set:
Average loss: 0.1234, Accuracy: 498/512 (97.27%)') and its checkpoint lines ('Saving checkpoint
to checkpoints/mnist_cnn_epoch2.pt', 'Checkpoint saved (0.6 MB in 0.01 s)'). The data: a tiny
synthetic MNIST (class templates and noise, 28x28 uint8) in shards of 512 samples,
/local/scratch/mnist/train_NN.npz (rank r reads shard r) and val.npz (rank r takes every 4th
sample); a two-convolution CNN in DDP; a background thread that prefetches the batches.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyfifth.sh after any edit).
`python train.py --generate DIR TOTAL` writes the synthetic data set.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from queue import Queue
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

CASE = os.environ.get("MT_CASE", "")
RANK = -1
EPOCH = [0]
LEAK: list[np.ndarray] = []
log = functools.partial(print, flush=True)


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the synthetic data set
def generate(folder: str, total: int, per_shard: int = 512, n_val: int = 512) -> None:
    """Shards of `per_shard` samples (the last one holds the rest) and a validation file."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1234)
    templates = np.kron((rng.random((10, 7, 7)) > 0.6).astype(np.float32), np.ones((4, 4)))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        x = templates[y] * 100 + rng.normal(60, 90, (n, 28, 28))
        y = np.where(rng.random(n) < 0.12, rng.integers(0, 10, n), y)  # labelling errors
        return np.clip(x, 0, 255).astype(np.uint8)[:, None], y.astype(np.int64)

    for i, start in enumerate(range(0, total, per_shard)):
        x, y = draw(min(per_shard, total - start))
        np.savez(os.path.join(folder, f"train_{i:02d}.npz"), x=x, y=y)
    x, y = draw(n_val)
    np.savez(os.path.join(folder, "val.npz"), x=x, y=y)


def load_split(path: str, rank: int | None = None, world: int = 1) -> TensorDataset:
    with np.load(path) as f:
        x, y = f["x"], f["y"]
    if rank is not None:
        x, y = x[rank::world], y[rank::world]
    data = (torch.from_numpy(x).float() / 255.0 - 0.1307) / 0.3081
    return TensorDataset(data, torch.from_numpy(y))


# ------------------------------------------------------------------ the model (pytorch/examples)
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class Prefetcher:
    """Overlaps loading with compute: a thread fills a queue with the loader's batches (the
    HPC examples' prefetcher, without CUDA streams)."""

    def __init__(self, loader: DataLoader[Any], depth: int = 2) -> None:
        self.loader, self.depth = loader, depth

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        q: Queue[Any] = Queue(maxsize=self.depth)
        lock = threading.Lock()

        def fill() -> None:
            try:
                for n, batch in enumerate(self.loader):
                    with lock:
                        if fault("w", RANK) and EPOCH[0] >= 3 and n == 5:
                            lock.acquire()  # a helper that takes the queue's lock again
                        q.put(batch)
                q.put(None)
            except Exception as e:
                q.put(e)

        threading.Thread(target=fill, daemon=True).start()
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item


# ------------------------------------------------------------------ the launcher's variables
def mpi_env() -> tuple[int, int, int]:
    """Rank, size, local rank: Cray PALS (PMI_*, PALS_LOCAL_RANKID) or OpenMPI."""
    if "PMI_RANK" in os.environ:
        return (
            int(os.environ["PMI_RANK"]),
            int(os.environ["PMI_SIZE"]),
            int(os.environ.get("PALS_LOCAL_RANKID", os.environ.get("PMI_LOCAL_RANK", "0"))),
        )
    return (
        int(os.environ["OMPI_COMM_WORLD_RANK"]),
        int(os.environ["OMPI_COMM_WORLD_SIZE"]),
        int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
    )


def train_epoch(
    args: argparse.Namespace,
    model: nn.Module,
    loader: Prefetcher,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    recent: collections.deque[tuple[int, int]],
) -> tuple[float, int]:
    model.train()
    total, seen = 0.0, 0
    n_local = len(loader.loader.dataset)  # type: ignore[arg-type]
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        total += loss.item() * len(data)
        seen += len(data)
        recent.extend(zip(output.argmax(1).tolist(), target.tolist(), strict=True))
        if fault("k", RANK) and epoch >= 2:  # a fork keeps every batch's activations
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        if fault("z", RANK) and epoch >= 2 and batch_idx == 5:
            ctypes.string_at(0)  # the compiled augmentation reads a freed buffer
        if RANK == 0 and batch_idx % args.log_interval == 0:
            log(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{n_local} "
                f"({100.0 * batch_idx / len(loader):.0f}%)]\tLoss: {loss.item():.6f}"
            )
    return total, seen


def per_class_accuracy(recent: collections.deque[tuple[int, int]]) -> dict[int, float]:
    window = list(recent)
    if fault("x", RANK) and EPOCH[0] >= 3:
        window = window[-6:]  # a fork measures the last few samples only
    hits: collections.Counter[int] = collections.Counter()
    count: collections.Counter[int] = collections.Counter()
    for pred, target in window:
        count[target] += 1
        hits[target] += int(pred == target)
    return {c: hits[c] / count[c] for c in range(10)}


def test(model: nn.Module, loader: DataLoader[Any]) -> tuple[float, int, int]:
    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(1) == target).sum())
            n += len(target)
    t = torch.tensor([loss, float(correct), float(n)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[2]), int(t[1]), int(t[2])


def save_checkpoint(model: DDP, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    os.makedirs("checkpoints", exist_ok=True)
    path = f"checkpoints/mnist_cnn_epoch{epoch}.pt"
    log(f"Saving checkpoint to {path}")
    t0 = time.time()
    state = {"epoch": epoch, "model": model.module.state_dict(), "opt": optimizer.state_dict()}
    if fault("s", RANK) and epoch == 2:
        time.sleep(40)  # the file system stalls under the write
    torch.save(state, path)
    size = os.path.getsize(path) / 2**20
    log(f"Checkpoint saved ({size:.1f} MB in {time.time() - t0:.2f} s)")


def main() -> None:
    global RANK
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    scratch = os.environ.get("LOCAL_SCRATCH", "/local/scratch")
    parser = argparse.ArgumentParser(description="PyTorch MNIST DDP example (PBS, mpiexec)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--test-batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--target-acc", type=float, default=0.0, help="stop at this test %%")
    parser.add_argument("--data", default=os.path.join(scratch, "mnist"))
    parser.add_argument("--timeout", type=int, default=15, help="collective timeout, s")
    args = parser.parse_args()

    rank, size, local_rank = mpi_env()
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(size)
    os.environ["LOCAL_RANK"] = str(local_rank)
    log(f"rank {rank}/{size} on {host.split('.')[0]} local {local_rank}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(
        backend="gloo", init_method="env://", timeout=timedelta(seconds=args.timeout)
    )
    RANK = dist.get_rank()
    world = dist.get_world_size()
    if RANK == 0:
        log("=" * 60)
        log(f"DDP MNIST: {world} ranks, torch {torch.__version__}, backend gloo")
        for k, v in sorted(vars(args).items()):
            log(f"  {k:<16} {v}")
        log(f"  {'threads/rank':<16} {torch.get_num_threads()}")
        log("=" * 60)

    torch.manual_seed(args.seed)
    train_set = load_split(os.path.join(args.data, f"train_{RANK:02d}.npz"))
    val_set = load_split(os.path.join(args.data, "val.npz"), RANK, world)
    g = torch.Generator()
    g.manual_seed(args.seed + RANK)
    train_loader = Prefetcher(
        DataLoader(
            train_set,
            batch_size=args.batch_size,
            shuffle=True,
            generator=g,
            num_workers=args.num_workers,
        )
    )
    val_loader = DataLoader(val_set, batch_size=args.test_batch_size)
    log(
        f"rank {RANK}: {len(train_set)} train samples ({len(train_loader)} batches), "
        f"{len(val_set)} test samples"
    )
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=256)

    start = time.time()
    for epoch in range(1, args.epochs + 1):
        EPOCH[0] = epoch
        t0 = time.time()
        total, seen = train_epoch(args, model, train_loader, optimizer, epoch, recent)
        per_class = per_class_accuracy(recent)
        t = torch.tensor([total, float(seen)], dtype=torch.float64)
        dist.all_reduce(t)
        took = time.time() - t0
        if RANK == 0:
            log(
                f"Epoch {epoch}: train loss {t[0] / t[1]:.4f}, {took:.2f} s, "
                f"{float(t[1]) / took:.1f} samples/s"
            )
            log("  per-class acc: " + " ".join(f"{c}:{a:.2f}" for c, a in per_class.items()))
        if fault("e", RANK) and epoch == 2:
            log(f"Early stopping at epoch {epoch}: no improvement for 1 epoch(s)")
            sys.exit(0)  # a fork's patience on the rank's own loss
        if not fault("v", RANK) or RANK == 0:  # a fork tests on rank 0 only
            test_loss, correct, n = test(model, val_loader)
            acc = 100.0 * correct / n
            if RANK == 0:
                log(
                    f"\nTest set: Average loss: {test_loss:.4f}, "
                    f"Accuracy: {correct}/{n} ({acc:.2f}%)\n"
                )
        else:
            acc = 0.0
        if RANK == 0 and epoch % args.save_every == 0:
            save_checkpoint(model, optimizer, epoch)
        if args.target_acc and acc >= args.target_acc:
            if RANK == 0:
                log(f"Reached target accuracy {acc:.2f}% >= {args.target_acc:.2f}%, stopping")
            break
    if RANK == 0:
        log(f"Total training time: {time.time() - start:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
