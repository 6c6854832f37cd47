"""A twentieth training-program style for the generalisation fixtures (tests/fixtures/real/
twentieth-*): a sensor-event classifier trained with Lightning Fabric the way its examples do it.
`Fabric(accelerator="cpu", devices=N, num_nodes=M, strategy=DDPStrategy(gloo, timeout))`,
`fabric.launch()` (its own subprocess launcher under plain python, or joining torchrun's
processes), `fabric.setup`/`setup_dataloaders`, gradient accumulation under
`fabric.no_backward_sync`, `fabric.backward`, `fabric.all_reduce`/`all_gather` of validation
metrics, `fabric.barrier`, `fabric.save`/`fabric.load` of a state dict, `fabric.log_dict` to a
CSVLogger and `fabric.print` on rank 0. One real fault per value of the TRAIN_VARIANT environment
variable (short codes, never printed); re-capture with tests/fixtures/real/capture_twentieth.sh
after any edit.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger
from lightning.fabric.strategies import DDPStrategy
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

FEATURES = 12
CLASSES = 4
CATEGORIES = {"pump": 0, "valve": 1, "motor": 2}


@dataclass(frozen=True)
class Variant:
    """What goes wrong in the code, the data or the machine (the defaults: nothing)."""

    loud: bool = False  # real torch warnings such a script triggers (workers, scheduler order)
    barrier_on_zero: bool = False  # rank 0 writes the epoch summary and calls barrier inside
    sum_on_zero: bool = False  # the validation correct-count is all_reduced on rank 0 only
    unseen_category_rank: int = -1  # this rank's shard holds a device category the map lacks
    cache_kill_rank: int = -1  # this rank caches batches until it is SIGKILLed (OOM killer)
    segv_rank: int = -1  # this rank's native feature decoder dereferences NULL
    own_shards: bool = False  # each rank reads its own shard file; the last rank's is shorter
    slow_export_rank: int = -1  # this rank exports predictions slowly before the epoch barrier
    local_stop: bool = False  # the early stop is decided on each rank's own validation loss
    voted_stop: bool = False  # the early stop is decided on the all-reduced validation loss
    spare_head: bool = False  # an auxiliary head forward never uses (find_unused_parameters off)
    stale_lock_rank: int = -1  # this rank waits on the feature-cache lock before training
    per_class_log: bool = False  # rank 0 logs its per-class accuracy tensor with log_dict
    worker_kill_rank: int = -1  # a DataLoader worker of this rank is SIGKILLed (OOM killer)


VARIANTS: dict[str, Variant] = {
    "": Variant(),
    "a": Variant(loud=True),
    "b": Variant(barrier_on_zero=True),
    "c": Variant(sum_on_zero=True),
    "d": Variant(unseen_category_rank=1),
    "e": Variant(cache_kill_rank=2),
    "f": Variant(segv_rank=3),
    "g": Variant(own_shards=True),
    "h": Variant(slow_export_rank=0),
    "i": Variant(local_stop=True),
    "j": Variant(voted_stop=True),
    "k": Variant(spare_head=True),
    "l": Variant(stale_lock_rank=1),
    "m": Variant(per_class_log=True),
    "n": Variant(worker_kill_rank=1),
}


class SensorEvents(Dataset[dict[str, torch.Tensor | str]]):
    """Seeded synthetic sensor windows with a device category and a class label."""

    def __init__(
        self, size: int, seed: int, odd_category_at: int = -1, kill_rank: int = -1, rank: int = 0
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=gen)
        self.y = (self.x[:, :CLASSES].argmax(dim=1) + (self.x[:, 5] > 1.5).long()) % CLASSES
        names = list(CATEGORIES)
        self.category = [names[i % len(names)] for i in range(size)]
        if 0 <= odd_category_at < size:
            self.category[odd_category_at] = "compressor"  # a device type added after the map
        self.kill_rank = kill_rank
        self.rank = rank

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor | str]:
        info = get_worker_info()
        if info is not None and self.rank == self.kill_rank and i >= 40:
            # the worker's decoded-window cache has grown past the container's memory
            os.kill(os.getpid(), signal.SIGKILL)
        return {"x": self.x[i], "y": self.y[i], "category": self.category[i]}


class EventNet(nn.Module):
    def __init__(self, spare_head: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(CATEGORIES), 4)
        self.body = nn.Sequential(nn.Linear(FEATURES + 4, 32), nn.ReLU(), nn.Linear(32, CLASSES))
        # the anomaly head of the next paper: created, never used in forward yet
        self.anomaly = nn.Linear(32, 1) if spare_head else None

    def forward(self, x: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(torch.cat([x, self.embed(cat)], dim=1))
        return out


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train the sensor-event classifier with Fabric")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--out", default="runs")
    p.add_argument("--resume", default="")
    p.add_argument("--data", default="", help="folder of per-rank shard files")
    p.add_argument("--stop-below", type=float, default=0.0, help="early-stop validation loss")
    return p.parse_args()


def encode(fabric: Fabric, categories: list[str]) -> torch.Tensor:
    return torch.tensor([CATEGORIES[c] for c in categories], device=fabric.device)


def native_decode(buf: bytes, broken: bool) -> None:
    """The vendor decoder of the raw sensor format (here: a NULL read when it is broken)."""
    if broken:
        ctypes.string_at(0)


def main() -> None:
    args = parse()
    v = VARIANTS[os.environ.get("TRAIN_VARIANT", "")]
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=args.timeout))
    logger = CSVLogger(root_dir=args.out, name="events")
    fabric = Fabric(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy=strategy,
        loggers=logger,
    )
    fabric.launch()
    fabric.seed_everything(1234)
    rank, world = fabric.global_rank, fabric.world_size

    if rank == v.stale_lock_rank:
        # the feature cache is shared by the jobs of this machine; a crashed job kept its lock
        lock = open(Path(args.out).parent / "feature-cache.lock", "w")  # noqa: SIM115
        fcntl.flock(lock, fcntl.LOCK_EX)

    if v.own_shards:
        # each rank trains on its own pre-split shard; the last shard got fewer rows
        lines = (Path(args.data) / f"shard-{rank:02d}.csv").read_text().splitlines()
        train_set = SensorEvents(len(lines), seed=100 + rank)
    else:
        # the sampler deals index i to rank i % world: this one reaches that rank at batch 5
        odd = world * 8 * 4 + v.unseen_category_rank if v.unseen_category_rank >= 0 else -1
        train_set = SensorEvents(
            256, seed=7, odd_category_at=odd, kill_rank=v.worker_kill_rank, rank=rank
        )
    val_set = SensorEvents(64, seed=8)
    workers = 4 if v.loud else args.workers
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=False, num_workers=workers
    )
    val_loader = DataLoader(val_set, batch_size=16)
    train_loader, val_loader = fabric.setup_dataloaders(
        train_loader, val_loader, use_distributed_sampler=not v.own_shards
    )

    model = EventNet(v.spare_head)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "epoch": 0}
    if args.resume:
        fabric.load(args.resume, state)
        fabric.print(f"Resumed from {args.resume} at epoch {state['epoch']}")
    fabric.print(f"Training on {world} processes, {len(train_loader)} batches per epoch")

    if v.loud:
        scheduler.step()  # stepped before the first optimizer.step()
    cache: list[torch.Tensor] = []
    step = 0
    for epoch in range(int(state["epoch"]), args.epochs):
        model.train()
        for i, batch in enumerate(train_loader):
            if rank == v.segv_rank and epoch == 1:
                native_decode(b"\x00" * 64, broken=True)
            if rank == v.cache_kill_rank:
                cache.append(torch.ones(16 * 1024 * 1024))  # 64 MiB a batch
                if len(cache) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
            x = torch.tensor(batch["x"]) if v.loud else batch["x"]
            cat = encode(fabric, list(batch["category"]))
            accumulating = (i + 1) % args.accumulate != 0
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = F.cross_entropy(model(x, cat), batch["y"])
                fabric.backward(loss / args.accumulate)
            if not accumulating:
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                fabric.log_dict({"train/loss": loss.item()}, step=step)
            if i % 4 == 0:
                fabric.print(f"epoch {epoch} batch {i}/{len(train_loader)} loss {loss.item():.4f}")
        scheduler.step()

        model.eval()
        total, correct, count = torch.zeros(1), torch.zeros(CLASSES), torch.zeros(CLASSES)
        with torch.no_grad():
            for batch in val_loader:
                logits = model(batch["x"], encode(fabric, list(batch["category"])))
                total += F.cross_entropy(logits, batch["y"], reduction="sum")
                hit = logits.argmax(1) == batch["y"]
                for c in range(CLASSES):
                    correct[c] += hit[batch["y"] == c].sum()
                    count[c] += (batch["y"] == c).sum()
        local_loss = total.item() / len(val_loader.dataset) * world  # type: ignore[arg-type]
        if v.sum_on_zero:
            if fabric.is_global_zero:  # the accuracy is only printed on rank 0
                correct = fabric.all_reduce(correct, reduce_op="sum")
        else:
            correct = fabric.all_reduce(correct, reduce_op="sum")
        count = fabric.all_reduce(count, reduce_op="sum")
        val_loss = float(fabric.all_reduce(total, reduce_op="mean").item()) / len(val_set) * world
        losses = fabric.all_gather(torch.tensor([local_loss]))
        acc = correct / count.clamp(min=1)
        fabric.print(
            f"epoch {epoch} val_loss {val_loss:.4f} acc {acc.mean().item():.3f} "
            f"per-rank {[round(float(x), 3) for x in losses.flatten()]}"
        )
        fabric.log_dict({"val/loss": val_loss, "val/acc": acc.mean()}, step=step)
        if v.per_class_log and fabric.is_global_zero:
            fabric.log_dict({"val/acc_per_class": acc}, step=step)

        if rank == v.slow_export_rank and epoch == 0:
            # predictions for the dashboard, written by one rank in chunks to network storage
            dest = Path(args.out) / "predictions.bin"
            with open(dest, "wb") as fh:
                for chunk in range(8):
                    fh.write(os.urandom(4 * 1024 * 1024))
                    fh.flush()
                    os.fsync(fh.fileno())
                    time.sleep(4)
                    fabric.print(f"exported {4 * (chunk + 1)} MiB of predictions")
        if v.barrier_on_zero:
            if fabric.is_global_zero:
                (Path(args.out) / "summary.txt").write_text(f"{epoch} {val_loss}\n")
                fabric.barrier()  # wait until every rank has finished the epoch
        else:
            fabric.barrier()

        state["epoch"] = epoch + 1
        fabric.save(Path(args.out) / "last.ckpt", state)
        if args.stop_below:
            if v.local_stop and local_loss < args.stop_below:
                print(f"[rank {rank}] validation loss {local_loss:.4f} below target, stopping")
                break
            if v.voted_stop:
                flag = torch.tensor([1.0 if val_loss < args.stop_below else 0.0])
                if fabric.all_reduce(flag, reduce_op="max").item() > 0:
                    fabric.print(f"validation loss {val_loss:.4f} below target, stopping early")
                    break
    fabric.print(f"Training finished after epoch {state['epoch']}")


if __name__ == "__main__":
    main()
