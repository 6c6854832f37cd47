"""A twenty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/twentyninth-*): a research codebase run on a Slurm cluster the way HPC users
do it. An sbatch script runs `srun python train.py ...` with one task per rank; the program
reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (or torchrun's RANK / WORLD_SIZE / LOCAL_RANK
when `srun torchrun` started it), takes MASTER_ADDR from `scontrol show hostnames` and
MASTER_PORT from the environment, and joins gloo itself with a tcp:// init method (15 s
collective timeout). A small argparse config; a tiny MLP in DDP over a CSV dataset stored as
shard files (each row parsed when read), a DistributedSampler, an all-reduced validation loss,
early stopping on it (--patience), a checkpoint each epoch by rank 0, --resume, and a SIGUSR1
handler (sbatch --signal=USR1@N: save and exit so the job can be requeued). Output is plain
print() with f-strings ("[rank 2] epoch 1 it 40 loss 0.51"). A fault is chosen by the
EXP_VARIANT environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_twentyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler

TIMEOUT = timedelta(seconds=15)
FEATURES = 12


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank looks up per-class statistics under a key never stored
    zero_rank: int = -1  # this rank averages a running sum over a bucket that stayed empty
    hoard_rank: int = -1  # this rank keeps every batch's features until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation reads address 0
    stuck_rank: int = -1  # this rank waits for a prefetch thread that was never started
    slow_rank: int = -1  # this rank rebuilds a feature cache for 25 s before epoch 2
    branch_rank: int = -1  # only this rank all-reduces a gradient-norm metric for logging
    shard_split: bool = False  # each rank takes whole shard files (8 files, not divisible)
    tracker_rank: int = -1  # this rank imports an experiment tracker that is not installed


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q1": Fault(key_rank=1),
    "z2": Fault(zero_rank=2),
    "k1": Fault(hoard_rank=1),
    "g2": Fault(segv_rank=2),
    "w1": Fault(stuck_rank=1),
    "s0": Fault(slow_rank=0),
    "b0": Fault(branch_rank=0),
    "f3": Fault(shard_split=True),
    "m0": Fault(tracker_rank=0),
}


class CsvShard(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One sample per line: 12 comma-separated features, then the target; parsed when read."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.lines = [line for line in f.read().splitlines() if line]

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        vals = [float(v) for v in self.lines[i].split(",")]
        return torch.tensor(vals[:-1]), torch.tensor(vals[-1:])


def make_data(folder: str, shards: int = 8, rows: int = 48, seed: int = 11) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, 1, generator=g)
    os.makedirs(folder, exist_ok=True)
    for name, count in [(f"train-{k:02d}.csv", rows) for k in range(shards)] + [("val.csv", 96)]:
        x = torch.randn(count, FEATURES, generator=g)
        y = x @ w + 0.1 * torch.randn(count, 1, generator=g)
        with open(os.path.join(folder, name), "w") as f:
            for row, t in zip(x.tolist(), y.tolist(), strict=True):
                f.write(",".join(f"{v:.4f}" for v in row + t) + "\n")


def dist_env() -> tuple[int, int, int]:
    """rank, world size, local rank: torchrun's variables first, then Slurm's."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return (
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            int(os.environ.get("LOCAL_RANK", "0")),
        )
    return (
        int(os.environ["SLURM_PROCID"]),
        int(os.environ["SLURM_NTASKS"]),
        int(os.environ["SLURM_LOCALID"]),
    )


def master_addr() -> str:
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    nodes = subprocess.check_output(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], text=True
    )
    return nodes.split()[0]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="toy regression on Slurm")
    p.add_argument("--data", default="data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--patience", type=int, default=0, help="0: no early stopping")
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--resume", default="")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (I/O stand-in)")
    p.add_argument("--make-data", action="store_true")
    return p.parse_args()


usr1 = threading.Event()


def on_usr1(signum: int, frame: object) -> None:
    usr1.set()


def main() -> None:
    args = parse_args()
    if args.make_data:
        make_data(args.data)
        return
    fault = FAULTS[os.environ.get("EXP_VARIANT", "")]
    rank, world, local_rank = dist_env()
    addr, port = master_addr(), os.environ.get("MASTER_PORT", "29500")
    signal.signal(signal.SIGUSR1, on_usr1)
    print(f"[rank {rank}] world {world} local_rank {local_rank} master {addr}:{port}")
    if rank == 0:
        print(f"config: {vars(args)}")
    dist.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    if rank == fault.tracker_rank:
        import wandb

        wandb.init(project="toy-regression", config=vars(args))
    torch.manual_seed(0)

    shards = sorted(glob.glob(os.path.join(args.data, "train-*.csv")))
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] | None = None
    if fault.shard_split:  # whole files per rank: 8 files over 3 ranks
        mine = shards[rank::world]
        train_ds: ConcatDataset[tuple[torch.Tensor, torch.Tensor]] = ConcatDataset(
            [CsvShard(s) for s in mine]
        )
        print(f"[rank {rank}] {len(mine)} shard files, {len(train_ds)} samples")
    else:
        train_ds = ConcatDataset([CsvShard(s) for s in shards])
        sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    val_ds = CsvShard(os.path.join(args.data, "val.csv"))
    val_loader = DataLoader(
        val_ds,
        batch_size=args.batch_size,
        sampler=DistributedSampler(val_ds, num_replicas=world, rank=rank, shuffle=False),
    )

    net = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    model: nn.Module = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    if args.resume:
        state = torch.load(args.resume, map_location="cpu")
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch = state["epoch"] + 1
        print(f"[rank {rank}] resumed from {args.resume} at epoch {start_epoch}")
    class_stats = {"low": 0.0, "mid": 0.0}
    bucket_sum, bucket_n = 0.0, 0
    hoard: list[torch.Tensor] = []
    prefetched = threading.Event()
    best, bad_epochs = float("inf"), 0
    os.makedirs(args.ckpt_dir, exist_ok=True)

    def save(epoch: int, name: str) -> str:
        path = os.path.join(args.ckpt_dir, name)
        torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, path)
        return path

    for epoch in range(start_epoch, args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        if epoch == 1 and rank == fault.stuck_rank:
            prefetched.wait()  # the prefetch thread that sets it was never started
        if epoch == 1 and rank == fault.slow_rank:
            for part in range(5):
                print(f"[rank {rank}] rebuilding feature cache part {part + 1}/5")
                time.sleep(5)
        model.train()
        for it, (x, y) in enumerate(train_loader):
            if rank == fault.key_rank and epoch == 0 and it == 12:
                bucket = "high" if y.max() > y.min() else "low"
                class_stats[bucket] += float(y.mean())  # "high" was never a key
            if rank == fault.zero_rank and epoch == 0 and it == 10:
                print(f"[rank {rank}] mean target {bucket_sum / bucket_n:.3f}")
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and epoch == 0 and it == 9:
                ctypes.string_at(0)  # the native augmentation dereferences NULL
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            if rank == fault.branch_rank and it == 6:
                norms = torch.stack([p.grad.norm() for p in net.parameters() if p.grad is not None])
                dist.all_reduce(norms)  # only this rank logs, only this rank reduces
                print(f"[rank {rank}] grad norms {(norms / world).tolist()}")
            opt.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if it % args.log_every == 0:
                print(f"[rank {rank}] epoch {epoch} it {it} loss {loss.item():.4f}")
            flag = torch.tensor([1.0 if usr1.is_set() else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                print(f"[rank {rank}] caught SIGUSR1 at epoch {epoch} it {it}")
                if rank == 0:
                    path = save(epoch - 1, "last.pt")
                    print(f"saved {path}; exiting so the job can be requeued")
                dist.barrier()
                dist.destroy_process_group()
                return
        model.eval()
        tot = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                tot += torch.tensor([nn.functional.mse_loss(model(x), y, reduction="sum"), len(y)])
        dist.all_reduce(tot)
        val = (tot[0] / tot[1]).item()
        if rank == 0:
            print(f"epoch {epoch} val_loss {val:.4f}")
            print(f"saved {save(epoch, f'epoch{epoch}.pt')}")
        if args.patience:
            if val < best - args.min_delta:
                best, bad_epochs = val, 0
            else:
                bad_epochs += 1
                if bad_epochs >= args.patience:
                    print(f"[rank {rank}] early stopping: no improvement for {bad_epochs} epoch(s)")
                    break
        dist.barrier()
    print(f"[rank {rank}] done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
