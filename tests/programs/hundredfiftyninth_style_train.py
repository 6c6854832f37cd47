"""A hundred-and-fifty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyninth-*): distributed PyTorch started by MPICH's / Intel MPI's
Hydra process manager the way Intel-based clusters run it (the Intel Extension for PyTorch CPU
DDP examples, Habana/Gaudi and Aurora-era scripts, oneCCL-style set-ups), re-created in plain
torch (CPU, gloo). Each run's folder links this file as train.py; it is started as `mpiexec.hydra
-n 4 -ppn 2 -hosts node01,node02 -genv MASTER_ADDR <head> -genv MASTER_PORT <port> python
train.py` (Intel MPI's mpiexec.hydra; one mode MPICH's mpiexec; one mode plain python).

As there: the rank, the world size and the local rank come from the process manager's
variables (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), the program sets RANK, WORLD_SIZE and
LOCAL_RANK by hand and calls init_process_group(env://, a 15 s timeout): 'ccl' when asked for
and oneccl_bindings_for_pytorch imports (it never does here: a UserWarning, then gloo), else
gloo. Its own '[rank] ' prefix on every line it prints (print(), flushed); every rank prints its
start-up line ('[2] rank 2/4 on node02 local_rank 0/2 pid 1234') and its data line, rank 0 the
config dump ('[0] ---------- config ----------', '[0]   batch_size     : 32'), the progress lines
('[0] epoch 1/5 step 4/16 loss 2.2781 lr 0.0500 ips 1456.2 img/s'), the epoch summary ('[0]
epoch 1 done: train loss 2.1031 | val loss 1.8712 | val acc 41.02% (210/512) | 1.31 s') and
the checkpoint lines ('[0] saving checkpoint ckpt/resnet_epoch2.pt', '[0] checkpoint saved in
0.01 s'). With I_MPI_DEBUG >= 5 rank 0 prints the Intel MPI library's start-up lines the way the
library does when the script's oneCCL/MPI bindings initialise it ('[0] MPI startup(): Intel(R)
MPI Library, Version 2021.10  Build 20230619 (id: c2e19c2f3e)', the 'Rank    Pid      Node name
Pin cpu' table, the I_MPI_* settings), simulated here since no MPI library is installed. The data:
tiny synthetic 3x16x16 images of 10 classes (class templates and noise) in shards of 512,
$TMPDIR/synth/shard_NN.npz on each node's local scratch (rank r reads shard r) and val.npz
(rank r takes every 4th sample); a two-block ResNet in DDP; a background thread prefetches the
batches.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyninth.sh after any edit).
`python train.py --generate DIR TOTAL` writes the synthetic data set.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import socket
import sys
import threading
import time
import warnings
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
CLASSES = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
_print = functools.partial(print, flush=True)


def log(msg: str) -> None:
    _print(f"[{RANK}] {msg}")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the synthetic data set
def generate(folder: str, total: int, per_shard: int = 512, n_val: int = 512) -> None:
    """Shards of `per_shard` samples (the last one holds the rest) and a validation file."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(159)
    templates = np.kron(rng.random((10, 3, 4, 4)), np.ones((4, 4))).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        x = templates[y] * 180 + rng.normal(40, 70, (n, 3, 16, 16))
        y = np.where(rng.random(n) < 0.1, rng.integers(0, 10, n), y)  # labelling errors
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    for i, start in enumerate(range(0, total, per_shard)):
        x, y = draw(min(per_shard, total - start))
        np.savez(os.path.join(folder, f"shard_{i:02d}.npz"), x=x, y=y)
    x, y = draw(n_val)
    np.savez(os.path.join(folder, "val.npz"), x=x, y=y)


def load(path: str, rank: int | None = None, world: int = 1) -> TensorDataset:
    with np.load(path) as f:
        x, y = f["x"], f["y"]
    if rank is not None:
        x, y = x[rank::world], y[rank::world]
    data = torch.from_numpy(x).float() / 127.5 - 1.0
    return TensorDataset(data, torch.from_numpy(y))


# ------------------------------------------------------------------ the model
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.layer1 = Block(16, 16, 1)
        self.layer2 = Block(16, 32, 2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(F.relu(self.stem(x))))
        out: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return out


class Prefetcher:
    """Overlaps loading with compute: a thread fills a queue with the loader's batches."""

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
                        if fault("w", RANK) and EPOCH[0] >= 3 and n == 6:
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


# ------------------------------------------------------------------ the process manager's variables
def pmi_env() -> tuple[int, int, int, int]:
    """Rank, size, local rank, ranks on this node: Hydra's PMI_RANK, PMI_SIZE,
    MPI_LOCALRANKID, MPI_LOCALNRANKS (Intel MPI and MPICH alike)."""
    rank = int(os.environ["PMI_RANK"])
    size = int(os.environ["PMI_SIZE"])
    local_rank = int(os.environ["MPI_LOCALRANKID"])
    local_size = int(os.environ.get("MPI_LOCALNRANKS", "1"))
    return rank, size, local_rank, local_size


def pick_backend(wanted: str) -> str:
    if wanted == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            warnings.warn(
                "oneccl_bindings_for_pytorch is not available: falling back from backend 'ccl' "
                "to 'gloo' (collectives will not use oneCCL)",
                stacklevel=2,
            )
            return "gloo"
        return "ccl"
    return wanted


def mpi_startup_lines(host: str, world: int) -> None:
    """The Intel MPI library's start-up lines at I_MPI_DEBUG >= 5, printed by rank 0 (simulated:
    the table of ranks is gathered over the process group)."""
    level = int(os.environ.get("I_MPI_DEBUG", "0") or 0)
    if level < 5:
        return
    cpus = sorted(os.sched_getaffinity(0))
    rows: list[Any] = [None] * world
    dist.all_gather_object(rows, (os.getpid(), host, cpus))
    if RANK != 0:
        return
    root = "/opt/intel/oneapi/mpi/2021.10.0"
    lines = [
        "Intel(R) MPI Library, Version 2021.10  Build 20230619 (id: c2e19c2f3e)",
        "Copyright (C) 2003-2023 Intel Corporation.  All rights reserved.",
        "library kind: release",
        "libfabric version: 1.18.0-impi",
        "libfabric provider: tcp;ofi_rxm",
    ]
    if os.environ.get("I_MPI_PMI_LIBRARY"):
        lines.append(
            "Warning: I_MPI_PMI_LIBRARY will be ignored since the hydra process manager was found"
        )
    lines += [
        f'File "{root}/etc/tuning_icx_shm-ofi_tcp-ofi-rxm_100.dat" not found',
        f'Load tuning file: "{root}/etc/tuning_icx_shm-ofi_tcp-ofi-rxm.dat"',
        "Rank    Pid      Node name  Pin cpu",
    ]
    for r, (pid, node, pin) in enumerate(rows):
        lines.append(f"{r:<7} {pid:<8} {node:<10} {{{','.join(str(c) for c in pin)}}}")
    lines += [
        f"I_MPI_ROOT={root}",
        "I_MPI_MPIRUN=mpiexec.hydra",
        "I_MPI_HYDRA_TOPOLIB=hwloc",
        "I_MPI_INTERNAL_MEM_POLICY=default",
        f"I_MPI_DEBUG={level}",
    ]
    for line in lines:
        _print(f"[0] MPI startup(): {line}")


# ------------------------------------------------------------------ training
def train_epoch(
    args: argparse.Namespace,
    model: DDP,
    loader: Prefetcher,
    optimizer: torch.optim.Optimizer,
    epoch: int,
) -> tuple[float, int]:
    model.train()
    total, seen = 0.0, 0
    t0 = time.time()
    for step, (data, target) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target, label_smoothing=args.label_smoothing)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        total += loss.item() * len(data)
        seen += len(data)
        if fault("k", RANK) and epoch >= 2:  # a fork keeps every batch's activations
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        if fault("z", RANK) and epoch >= 2 and step == 5:
            ctypes.string_at(0)  # the compiled augmentation reads a freed buffer
        if RANK == 0 and (step % args.log_interval == 0 or step == len(loader)):
            ips = seen / max(time.time() - t0, 1e-6)
            log(
                f"epoch {epoch}/{args.epochs} step {step}/{len(loader)} loss {loss.item():.4f} "
                f"lr {optimizer.param_groups[0]['lr']:.4f} ips {ips:.1f} img/s"
            )
    return total, seen


def class_report(model: DDP, loader: DataLoader[Any]) -> str:
    """The rank's own worst class on its validation part (printed by rank 0 only)."""
    names = CLASSES[:-1] if fault("x", RANK) and EPOCH[0] >= 3 else CLASSES  # a fork's table
    hits, count = [0] * 10, [0] * 10
    with torch.no_grad():
        for data, target in loader:
            pred = model(data).argmax(1)
            for p, t in zip(pred.tolist(), target.tolist(), strict=True):
                count[t] += 1
                hits[t] += int(p == t)
    rates = {names[c]: hits[c] / max(count[c], 1) for c in range(10)}
    worst = min(rates, key=lambda k: rates[k])
    return f"worst class {worst} ({100 * rates[worst]:.1f}%)"


def validate(model: DDP, loader: DataLoader[Any]) -> tuple[float, int, int]:
    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for data, target in loader:
            out = model(data)
            loss += F.cross_entropy(out, target, reduction="sum").item()
            correct += int((out.argmax(1) == target).sum())
            n += len(target)
    t = torch.tensor([loss, float(correct), float(n)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[2]), int(t[1]), int(t[2])


def save_checkpoint(model: DDP, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    os.makedirs("ckpt", exist_ok=True)
    path = f"ckpt/resnet_epoch{epoch}.pt"
    log(f"saving checkpoint {path}")
    t0 = time.time()
    state = {"epoch": epoch, "model": model.module.state_dict(), "opt": optimizer.state_dict()}
    if fault("s", RANK) and epoch == 2:
        time.sleep(40)  # the shared file system stalls under the write
    torch.save(state, path)
    log(f"checkpoint saved in {time.time() - t0:.2f} s")


def main() -> None:
    global RANK
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description="ResNet DDP on CPU (Intel MPI / Hydra)")
    parser.add_argument("--batch_size", type=int, default=32, help="per rank")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--label_smoothing", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log_interval", type=int, default=4)
    parser.add_argument("--save_every", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "ccl"])
    parser.add_argument("--find_unused", action="store_true")
    parser.add_argument("--target_acc", type=float, default=0.0, help="stop at this val %%")
    parser.add_argument("--data", default="", help="default: $TMPDIR/synth (node-local)")
    parser.add_argument("--timeout", type=int, default=15, help="collective timeout, s")
    args = parser.parse_args()

    rank, size, local_rank, local_size = pmi_env()
    RANK = rank
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(size)
    os.environ["LOCAL_RANK"] = str(local_rank)
    log(f"rank {rank}/{size} on {host} local_rank {local_rank}/{local_size} pid {os.getpid()}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = pick_backend(args.backend)
    dist.init_process_group(
        backend=backend, init_method="env://", timeout=timedelta(seconds=args.timeout)
    )
    world = dist.get_world_size()
    mpi_startup_lines(host, world)
    if RANK == 0:
        log("---------- config ----------")
        for k, v in sorted(vars(args).items()):
            log(f"  {k:<15}: {v}")
        log(f"  {'world_size':<15}: {world} ({backend}), torch {torch.__version__}")
        log("----------------------------")

    data_dir = args.data or os.path.join(os.environ.get("TMPDIR", "/tmp"), "synth")
    torch.manual_seed(args.seed)
    shard = os.path.join(data_dir, f"shard_{RANK:02d}.npz")
    train_set = load(shard)
    val_set = load(os.path.join(data_dir, "val.npz"), RANK, world)
    g = torch.Generator()
    g.manual_seed(args.seed + RANK)
    loader = Prefetcher(
        DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=g)
    )
    val_loader = DataLoader(val_set, batch_size=128)
    log(f"{shard}: {len(train_set)} samples, {len(loader)} steps/epoch, val {len(val_set)}")
    model = DDP(TinyResNet(), find_unused_parameters=args.find_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    start, best = time.time(), 0.0
    for epoch in range(1, args.epochs + 1):
        EPOCH[0] = epoch
        t0 = time.time()
        total, seen = train_epoch(args, model, loader, optimizer, epoch)
        scheduler.step()
        t = torch.tensor([total, float(seen)], dtype=torch.float64)
        dist.all_reduce(t)
        if fault("e", RANK) and epoch == 2:
            log(f"early stopping: local loss {total / seen:.4f} did not improve, leaving")
            sys.exit(0)  # a fork's patience on the rank's own loss
        report = class_report(model, val_loader)
        if not fault("v", RANK) or RANK == 0:  # a fork validates on rank 0 only
            val_loss, correct, n = validate(model, val_loader)
            acc = 100.0 * correct / n
        else:
            val_loss, correct, n, acc = 0.0, 0, 0, 0.0
        best = max(best, acc)
        if RANK == 0:
            log(
                f"epoch {epoch} done: train loss {t[0] / t[1]:.4f} | val loss {val_loss:.4f} | "
                f"val acc {acc:.2f}% ({correct}/{n}) | {time.time() - t0:.2f} s | {report}"
            )
            if epoch % args.save_every == 0:
                save_checkpoint(model, optimizer, epoch)
        if args.target_acc and acc >= args.target_acc:
            if RANK == 0:
                log(f"target val acc {args.target_acc:.1f}% reached ({acc:.2f}%), stopping")
            break
    if RANK == 0:
        log(f"training finished in {time.time() - start:.1f} s, best val acc {best:.2f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
