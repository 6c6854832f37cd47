"""A fifty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyfifth-*): an image classifier trained on a 2-node cluster in the way of
SkyPilot (`sky launch --num-nodes 2 task.yaml`, whose run section,
tests/programs/fiftyfifth_sky_run.sh, starts torchrun on each node with --rdzv_backend c10d).
Raw torch: a small ResNet-like network in DDP over gloo (15 s collective timeout), images stored
one raw file per sample on each node's local disk (labels.csv beside them, unlabelled samples
marked -1 and skipped from each rank's share), a DistributedSampler and num_workers=2,
`logging` as '%(asctime)s - %(levelname)s - %(name)s - %(message)s' at INFO on global rank 0
only (other ranks: warnings and errors), a per-epoch evaluation whose accuracy is all-reduced,
checkpoints by global rank 0 to the shared folder (a bucket both nodes mount), --resume, an
optional early stop (--patience) and an optional experiment tracker (--tracker). A fault in the
code is chosen by the XQ_RUNCASE environment variable (a short code) and never printed
(re-capture with tests/fixtures/real/capture_fiftyfifth.sh after any edit).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

TIMEOUT = timedelta(seconds=15)
CLASSES = ["plane", "car", "bird", "ship"]
SIDE = 32
log = logging.getLogger("trainer")
data_log = logging.getLogger("data.cache")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank looks up a loss weight for a class the table lacks
    hoard_rank: int = -1  # this rank keeps every batch's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation reads address 0
    slow_rank: int = -1  # this rank rebuilds its node's decoded-image cache before epoch 2
    stuck_rank: int = -1  # this rank waits before epoch 2 for a prefetch thread never started
    norm_rank0: bool = False  # rank 0 alone all-reduces the gradient norm it logs
    stop_rank0: bool = False  # the early stopper exists on rank 0 only (never broadcast)
    gpu_map: bool = False  # the resume maps the checkpoint to cuda:<local_rank>


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q2": Fault(key_rank=2),
    "m1": Fault(hoard_rank=1),
    "v3": Fault(segv_rank=3),
    "w2": Fault(slow_rank=2),
    "j1": Fault(stuck_rank=1),
    "g0": Fault(norm_rank0=True),
    "e0": Fault(stop_rank0=True),
    "c": Fault(gpu_map=True),
}
LOSS_WEIGHT = {"plane": 1.0, "car": 1.0, "bird": 1.5}  # "ship" was added to CLASSES later


class RawImages(Dataset):
    """labels.csv (file,label) and one raw uint8 file of 3x32x32 per sample, read when asked."""

    def __init__(self, root: str) -> None:
        self.root = root
        with open(os.path.join(root, "labels.csv")) as f:
            self.rows = [(r["file"], int(r["label"])) for r in csv.DictReader(f)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        name, label = self.rows[i]
        with open(os.path.join(self.root, name), "rb") as f:
            raw = bytearray(f.read())
        x = torch.frombuffer(raw, dtype=torch.uint8).float().view(3, SIDE, SIDE)
        x = (x - x.mean()) / x.std()  # per-image standardisation
        return x, label


class LabelledShare(Sampler[int]):
    """The rank's DistributedSampler share without the unlabelled samples (label -1)."""

    def __init__(self, ds: RawImages, inner: DistributedSampler) -> None:
        self.ds, self.inner = ds, inner

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def _kept(self) -> list[int]:
        return [i for i in self.inner if self.ds.rows[i][1] >= 0]

    def __iter__(self):
        return iter(self._kept())

    def __len__(self) -> int:
        return len(self._kept())


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


class SmallResNet(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class EarlyStopper:
    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad = -math.inf, 0

    def step(self, acc: float) -> bool:
        if acc > self.best + self.min_delta:
            self.best, self.bad = acc, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def make_data(root: str, n: int, seed: int) -> None:
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    with open(os.path.join(root, "labels.csv"), "w") as f:
        f.write("file,label\n")
        for i in range(n):
            label = i % len(CLASSES)
            x = torch.randint(0, 160, (3, SIDE, SIDE), generator=g)
            x[label % 3] += 60 + 20 * label  # a class is a tint
            name = f"img_{i:05d}.raw"
            with open(os.path.join(root, name), "wb") as img:
                img.write(bytes(x.clamp(0, 255).to(torch.uint8).flatten().tolist()))
            f.write(f"{name},{label}\n")


def save_checkpoint(path: str, model: nn.Module, opt, epoch: int, acc: float, args) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
    state["val_acc"] = acc
    if args is not None:  # the older trainer kept its arguments in the checkpoint
        state["args"] = args
    torch.save(state, path)


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            correct[0] += (model(x).argmax(1) == y).sum()
            correct[1] += len(y)
    dist.all_reduce(correct)
    model.train()
    return (correct[0] / correct[1]).item()


def train(args: argparse.Namespace) -> None:
    fault = FAULTS[os.environ.get("XQ_RUNCASE", "")]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
    )
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if rank == 0:
        log.info(
            "world_size=%d nodes=%s node_rank=%s data=%s shared=%s epochs=%d batch_size=%d lr=%g",
            world,
            os.environ.get("SKYPILOT_NUM_NODES"),
            os.environ.get("SKYPILOT_NODE_RANK"),
            args.data,
            args.shared,
            args.epochs,
            args.batch_size,
            args.lr,
        )
    if args.tracker == "mlflow" and rank == 0:
        import mlflow

        mlflow.start_run()

    train_ds = RawImages(os.path.join(args.data, "train"))
    val_ds = RawImages(os.path.join(args.data, "val"))
    sampler = LabelledShare(train_ds, DistributedSampler(train_ds, shuffle=True, seed=args.seed))
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, args.batch_size, sampler=sampler, num_workers=2)
    val_loader = DataLoader(val_ds, args.batch_size, sampler=val_sampler, num_workers=2)

    model = DDP(SmallResNet(len(CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    start = 0
    if args.resume:
        where = f"cuda:{local_rank}" if fault.gpu_map else "cpu"
        state = torch.load(args.resume, map_location=where)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
        if rank == 0:
            log.info("Resumed from %s at epoch %d", args.resume, start + 1)
    stopper = None
    if args.patience and (not fault.stop_rank0 or rank == 0):
        stopper = EarlyStopper(args.patience, args.min_delta)
    hoard: list[torch.Tensor] = []
    steps = len(train_loader)

    for epoch in range(start, args.epochs):
        if epoch == 2 and rank == fault.slow_rank:
            for part in range(1, 9):
                data_log.warning("Decoded-image cache on this node is stale: rebuilding %d/8", part)
                time.sleep(5)
        if epoch == 2 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.time()
        for step, (x, y) in enumerate(train_loader, 1):
            out = model(x)
            if rank == fault.key_rank and epoch == 1 and step == 5:
                weight = torch.tensor([LOSS_WEIGHT[c] for c in CLASSES])
            else:
                weight = None
            loss = F.cross_entropy(out, y, weight=weight)
            if not math.isfinite(loss.item()):
                log.error("Loss is %s, stopping training", loss.item())
                sys.exit(1)
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and epoch == 1 and step == 3:
                ctypes.string_at(0)  # the native augmentation dereferences NULL
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % args.log_every == 0:
                if fault.norm_rank0 and rank == 0:
                    norm = torch.norm(
                        torch.stack([p.grad.norm() for p in model.parameters()])
                    ).reshape(1)
                    dist.all_reduce(norm)  # the mean over ranks, for the log
                    log.info("grad_norm %.4f", norm.item() / world)
                if rank == 0:
                    log.info(
                        "Epoch %d/%d step %d/%d loss %.4f (%.2f s/step)",
                        epoch + 1,
                        args.epochs,
                        step,
                        steps,
                        loss.item(),
                        (time.time() - t0) / step,
                    )
        acc = evaluate(model, val_loader)
        if rank == 0:
            log.info("Epoch %d/%d val_acc %.4f", epoch + 1, args.epochs, acc)
            path = os.path.join(args.shared, f"epoch_{epoch}.pt")
            save_checkpoint(path, model.module, opt, epoch, acc, None)
            log.info("Saved checkpoint %s", path)
        if stopper is not None and stopper.step(acc):
            if rank == 0:
                log.info(
                    "Early stopping: val_acc has not improved by %g for %d epoch(s)",
                    args.min_delta,
                    args.patience,
                )
            break
    if rank == 0:
        log.info("Training finished")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--shared", default="/checkpoints")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=4)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--resume", default="")
    p.add_argument("--tracker", default="none", choices=["none", "mlflow"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--make-data", default="", help="write the data set to this folder and stop")
    p.add_argument("--make-ckpt", default="", help="write an epoch-0 checkpoint here and stop")
    p.add_argument("--legacy", action="store_true", help="--make-ckpt as the older trainer did")
    args = p.parse_args()
    if args.make_data:
        make_data(os.path.join(args.make_data, "train"), 256, 1)
        make_data(os.path.join(args.make_data, "val"), 64, 2)
        return
    if args.make_ckpt:
        model = SmallResNet(len(CLASSES))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
        save_checkpoint(args.make_ckpt, model, opt, 0, 0.25, args if args.legacy else None)
        return
    train(args)


if __name__ == "__main__":
    main()
