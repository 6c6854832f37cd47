"""A fortieth training-program style: a Keras-like `fit()` loop in the way of poutyne and the
small trainer libraries people write for themselves: every rank prints a carriage-return
progress line ('\\rEpoch: 2/4 Step: 7/10  70.00% |██████████████      | 0.31s loss: 0.693147')
and an epoch summary ('Epoch: 2/4 Train steps: 10 Val steps: 4 0.52s loss: 0.69 acc: 51.25
val_loss: 0.70 val_acc: 49.50'), callbacks on rank 0 in Keras' words ('Epoch 2: val_loss
improved from 0.71 to 0.70, saving file to ckpt/best.pt', 'Epoch 4: early stopping'), raw DDP on
gloo with a 15 s timeout, per-rank shard files. One fault per run, chosen by $T40_CASE (an
opaque code the program never prints).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("T40_CASE", "")
DATA = Path(os.environ.get("T40_DATA", "data"))
EPOCHS = 4
BATCH = 8


def progress(epoch: int, step: int, steps: int, start: float, loss: float) -> None:
    done = int(20 * step / steps)
    bar = "█" * done + " " * (20 - done)
    pct = 100.0 * step / steps
    line = f"\rEpoch: {epoch}/{EPOCHS} Step: {step}/{steps} {pct:6.2f}% |{bar}| "
    print(f"{line}{time.perf_counter() - start:.2f}s loss: {loss:.6f}", end="", flush=True)


class EarlyStopping:
    def __init__(self, patience: int, on_own_loss: bool, min_delta: float = 0.12) -> None:
        self.min_delta = min_delta
        self.best = float("inf")
        self.wait = 0
        self.patience = patience
        self.on_own_loss = on_own_loss

    def should_stop(self, epoch: int, val_loss: float) -> bool:
        if val_loss < self.best - self.min_delta:
            self.best, self.wait = val_loss, 0
            return False
        self.wait += 1
        if self.wait >= self.patience:
            print(f"Epoch {epoch}: early stopping", flush=True)
            return True
        return False


def write_summary(lock: threading.Lock) -> None:
    with lock:
        pass


def load_shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    shard = torch.load(DATA / f"shard_{rank:02d}.pt")
    return shard["x"], shard["y"]


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_shard(rank)
    if CASE == "u6" and rank == 2:
        x, y = x[: 7 * BATCH], y[: 7 * BATCH]  # this node's shard was cut by a failed copy
    val_x, val_y = x[-4 * BATCH :], y[-4 * BATCH :]
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 2))
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    stopper = EarlyStopping(patience=1, on_own_loss=CASE == "e7") if CASE in ("e7", "a8") else None
    best = float("inf")
    ckpt = Path(os.environ.get("T40_CKPT", "ckpt"))
    lock = threading.Lock()
    for epoch in range(1, EPOCHS + 1):
        start = time.perf_counter()
        steps = len(x) // BATCH
        total = 0.0
        for step in range(1, steps + 1):
            if CASE == "k4" and rank == 1 and epoch == 2 and step == 5:
                hog = [torch.ones(1 << 20) for _ in range(48)]
                os.kill(os.getpid(), 9)
                print(len(hog))
            xb, yb = x[(step - 1) * BATCH : step * BATCH], y[(step - 1) * BATCH : step * BATCH]
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            progress(epoch, step, steps, start, total / step)
        with torch.no_grad():
            logits = model(val_x)
            val_loss = F.cross_entropy(logits, val_y).item()
            val_acc = 100.0 * (logits.argmax(1) == val_y).float().mean().item()
        logs = {"loss": total / steps, "val_loss": val_loss, "val_acc": val_acc}
        if CASE == "k2" and rank == 1 and epoch == 2:
            logs.pop("val_acc")  # this rank's validation returned no accuracy
        print(
            f"\rEpoch: {epoch}/{EPOCHS} Train steps: {steps} Val steps: 4 "
            f"{time.perf_counter() - start:.2f}s loss: {logs['loss']:.6f} "
            f"val_loss: {logs['val_loss']:.6f} val_acc: {logs['val_acc']:.2f}",
            flush=True,
        )
        if rank == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
            if val_loss < best:
                print(
                    f"Epoch {epoch}: val_loss improved from {best:.5f} to {val_loss:.5f}, "
                    f"saving file to {ckpt}/best.pt"
                )
                best = val_loss
                torch.save(model.module.state_dict(), ckpt / "best.pt")
            print(f"Epoch {epoch}: saving file to {ckpt}/last.pt")
            if CASE == "s5" and epoch == 2:
                time.sleep(25.0)  # the network file system takes its time with this write
            torch.save(model.module.state_dict(), ckpt / "last.pt")
        if CASE == "m3" and rank == 0:
            metrics = torch.tensor([val_loss, val_acc])
            dist.all_reduce(metrics)  # "average the validation metrics for the report"
        if CASE == "w9" and rank == 2 and epoch == 2:
            with lock:  # a callback's guard, taken again by the writer it calls
                write_summary(lock)
        if stopper is not None:
            seen = torch.tensor([val_loss])
            if not stopper.on_own_loss:
                dist.all_reduce(seen)
                seen /= world
            if stopper.should_stop(epoch, float(seen)):
                trace = os.environ.get("T40_TRACE")
                if trace:  # the capture's own record of who stopped, kept out of the output
                    with open(trace, "a") as fh:
                        fh.write(f"rank {rank} stopped after epoch {epoch}\n")
                break
    if rank == 0:
        print(f"Test: loss: {val_loss:.6f} acc: {val_acc:.2f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
