"""An eleventh training-program style for the generalisation fixtures (tests/fixtures/real/eleventh-*):
a Ray Train script written the way its users write one. `ray.init` starts a local Ray (no
cluster), a `TorchTrainer` runs `train_loop_per_worker` on 2-4 Ray actors (gloo on CPU,
`TorchConfig(timeout_s=15)`), the loop asks `ray.train.get_context()` for its world rank, wraps
its model with `ray.train.torch.prepare_model` and its DataLoader with `prepare_data_loader`,
reports metrics every epoch with a checkpoint from rank 0 (`Checkpoint.from_directory`), and
resumes from `ray.train.get_checkpoint()`. The user's own lines are `print` and `logging`.

One real fault per `--mode`; the driver maps it to a `Fault` the loop closes over, so neither Ray's
printed configuration nor any traceback quotes the mode's name. Many faults are in what the
capture gives the program (a checkpoint folder that was rotated away, a data folder without one
shard, more shard files than workers). Ray needs no GPU here; it is not a dependency of the
project: tests/fixtures/real/capture_eleventh.sh installs nothing and runs this with the venv's
ray (pip install "ray[train]==2.40.0" -c constraints.txt). Re-capture after any edit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

FEATURES, CLASSES = 16, 4


@dataclass(frozen=True)
class Fault:
    """What goes wrong, and on which world rank (-1: nowhere)."""

    workers: int = 2
    epochs: int = 3
    layout: str = "sampler"  # "sampler": one dataset + Ray's DistributedSampler; "files": shards
    raise_on: int = -1  # a label check raises ValueError in this rank's loop
    solo_sync_on: int = -1  # this rank alone all_reduces its validation loss
    stall_on: int = -1  # this rank rebuilds a cache for 45 s before training
    sigkill_on: int = -1  # this rank SIGKILLs itself in epoch 1
    segv_on: int = -1  # this rank reads address 0 in epoch 1
    local_patience: bool = False  # early stopping on each rank's own validation loss
    report_main_only: bool = False  # ray.train.report on rank 0 only
    loader_kill_on: int = -1  # a DataLoader worker of this rank SIGKILLs itself
    relock_on: int = -1  # this rank's metrics logger takes its own lock twice
    find_unused: bool = False  # DDP searches for unused parameters (it warns: there are none)
    noisy: bool = False  # the user's own warnings on every epoch
    extra: dict[str, Any] = field(default_factory=dict)


MODES: dict[str, Fault] = {
    "scary-but-fine": Fault(find_unused=True, noisy=True),
    "all-epochs-done": Fault(workers=4, epochs=4),
    "label-check-raise": Fault(workers=3, raise_on=1),
    "metric-sync-on-zero": Fault(solo_sync_on=0),
    "slow-tokenize": Fault(workers=3, stall_on=1),
    "killed-worker": Fault(workers=3, sigkill_on=1),
    "null-deref": Fault(workers=3, segv_on=2),
    "local-early-stop": Fault(workers=3, epochs=6, local_patience=True),
    "report-on-zero": Fault(report_main_only=True),
    "shard-missing": Fault(workers=3, layout="files"),
    "loader-sigkill": Fault(loader_kill_on=1),
    "lock-twice": Fault(workers=3, relock_on=2),
    "shards-vs-workers": Fault(workers=3, layout="files"),
    "resume-rotated": Fault(),
    "ckpt-prep": Fault(epochs=3),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def synthetic(n: int, seed: int) -> TensorDataset:
    """A learnable toy problem: the label is the argmax of a fixed projection."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x @ w).argmax(1))


def write_shards(folder: str, count: int, rows: int = 256) -> None:
    """The preprocessed data set as a user keeps it: shard-0000.pt ... one file per shard."""
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        ds = synthetic(rows, seed=100 + i)
        torch.save({"x": ds.tensors[0], "y": ds.tensors[1]}, f"{folder}/shard-{i:04d}.pt")
    with open(f"{folder}/manifest.json", "w") as f:
        json.dump({"shards": [f"shard-{i:04d}.pt" for i in range(count)], "rows": rows}, f)


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Adds noise in the loader's worker processes (the reason the user runs num_workers=2)."""

    def __init__(self, base: TensorDataset, die_at: int) -> None:
        self.base, self.die_at = base, die_at

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.die_at:  # the kernel's OOM killer picks this loader process
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = self.base[i]
        return x + 0.01 * torch.randn_like(x), y


class MetricsLog:
    """The user's metrics file writer; flush() takes the lock write() already holds."""

    def __init__(self, path: str) -> None:
        self.path, self.lock, self.rows = path, threading.Lock(), []  # type: ignore[var-annotated]

    def write(self, row: str, flush: bool) -> None:
        with self.lock:
            self.rows.append(row)
            if flush:
                self.flush()

    def flush(self) -> None:
        with self.lock:
            with open(self.path, "a") as f:
                f.writelines(r + "\n" for r in self.rows)
            self.rows.clear()


def make_loop(fault: Fault) -> Callable[[dict[str, Any]], None]:
    def train_loop_per_worker(config: dict[str, Any]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        log = logging.getLogger("train")
        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        torch.manual_seed(config["seed"])

        if rank == fault.stall_on:
            print(f"worker {rank}: token cache is stale, rebuilding it (this can take a minute)")
            time.sleep(45)

        if config["layout"] == "files":
            with open(f"{config['data_dir']}/manifest.json") as f:
                shards = json.load(f)["shards"]
            mine = [f"{config['data_dir']}/{name}" for name in shards[rank::world]]
            print(f"worker {rank}: reading {len(mine)} of {len(shards)} shards")
            parts = [torch.load(p) for p in mine]
            train = TensorDataset(
                torch.cat([p["x"] for p in parts]), torch.cat([p["y"] for p in parts])
            )
            loader = DataLoader(train, batch_size=config["batch_size"], shuffle=True)
            loader = ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False)
        else:
            train = synthetic(512, seed=1)
            data: Dataset[Any] = train
            workers = 0
            if fault.loader_kill_on >= 0:
                data, workers = Augmented(train, 300 if rank == fault.loader_kill_on else -1), 2
            elif fault.noisy:  # more loader processes than this machine has cores
                data, workers = Augmented(train, -1), 4
            loader = DataLoader(
                data, batch_size=config["batch_size"], shuffle=True, num_workers=workers
            )
            loader = ray.train.torch.prepare_data_loader(loader)
        val = synthetic(128, seed=2 + (rank if fault.local_patience else 0))
        if fault.local_patience and rank == 2:  # this rank's held-out split is mislabelled
            val = TensorDataset(val.tensors[0], torch.randint(0, CLASSES, (128,)))

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        start = 0
        checkpoint = ray.train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                state = torch.load(os.path.join(d, "model.pt"))
                model.load_state_dict(state["model"])
                start = state["epoch"] + 1
            log.info("resumed from epoch %d", start)
        kwargs = {"find_unused_parameters": True} if fault.find_unused else {}
        model = ray.train.torch.prepare_model(model, parallel_strategy_kwargs=kwargs)
        loss_fn = nn.CrossEntropyLoss()
        metrics = MetricsLog(f"{tempfile.gettempdir()}/metrics-{rank}.txt")
        best, bad = float("inf"), 0

        for epoch in range(start, fault.epochs):
            if world > 1 and config["layout"] != "files":
                loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            model.train()
            total, steps = 0.0, 0
            for step, (x, y) in enumerate(loader):
                if rank == fault.raise_on and epoch == 1 and step == 5:
                    bad_label = int(y.max()) + CLASSES
                    raise ValueError(f"label {bad_label} out of range for {CLASSES} classes")
                if rank == fault.sigkill_on and epoch == 1 and step == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                if rank == fault.segv_on and epoch == 1 and step == 2:
                    ctypes.string_at(0)
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, steps = total + loss.item(), steps + 1
            model.eval()
            with torch.no_grad():
                val_loss = loss_fn(model(val.tensors[0]), val.tensors[1]).item()
            if rank == fault.solo_sync_on:  # average the validation loss for the log
                t = torch.tensor([val_loss])
                dist.all_reduce(t)
                val_loss = t.item() / world
            if rank == fault.relock_on and epoch == 1:
                metrics.write(f"{epoch},{val_loss}", flush=True)
            else:
                metrics.write(f"{epoch},{val_loss}", flush=False)
            if fault.noisy and rank == 0:
                log.warning("validation loss %.3f is above the 0.2 target, keep training", val_loss)
            if rank == 0:
                print(f"epoch {epoch}: train_loss={total / max(steps, 1):.4f} val_loss={val_loss:.4f}")  # fmt: skip
            if fault.local_patience:
                if val_loss < best - 1e-3:
                    best, bad = val_loss, 0
                else:
                    bad += 1
                if bad >= 2:
                    print(f"worker {rank}: val_loss has not improved for 2 epochs, stopping early")
                    return

            out = {"epoch": epoch, "train_loss": total / max(steps, 1), "val_loss": val_loss}
            if rank == 0:
                with tempfile.TemporaryDirectory() as d:
                    torch.save(
                        {"model": model.module.state_dict(), "epoch": epoch},  # type: ignore
                        os.path.join(d, "model.pt"),
                    )
                    ray.train.report(out, checkpoint=Checkpoint.from_directory(d))
            elif not fault.report_main_only:
                ray.train.report(out)
        print(f"worker {rank}: done after {fault.epochs - start} epochs")

    return train_loop_per_worker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="all-epochs-done")
    p.add_argument("--storage", default=tempfile.gettempdir())
    p.add_argument("--name", default="mlp")
    p.add_argument("--data-dir", default="")
    p.add_argument("--resume-from", default="")
    p.add_argument("--keep", type=int, default=0)
    args = p.parse_args()
    fault = MODES[args.mode]
    if args.data_dir:
        fault = replace(fault, layout="files")

    ray.init(num_cpus=fault.workers + 1, include_dashboard=False)
    trainer = TorchTrainer(
        make_loop(fault),
        train_loop_config={
            "lr": 0.1, "batch_size": 16, "seed": 0,
            "layout": fault.layout, "data_dir": args.data_dir,
        },
        scaling_config=ScalingConfig(num_workers=fault.workers, use_gpu=False),
        run_config=RunConfig(
            storage_path=args.storage,
            name=args.name,
            failure_config=FailureConfig(max_failures=0),
            checkpoint_config=CheckpointConfig(num_to_keep=args.keep or None),
        ),
        torch_config=TorchConfig(backend="gloo", timeout_s=15),
        resume_from_checkpoint=Checkpoint.from_directory(args.resume_from)
        if args.resume_from
        else None,
    )  # fmt: skip
    result = trainer.fit()
    print(f"Training finished: {result.metrics}")
    print(f"Last checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main()
