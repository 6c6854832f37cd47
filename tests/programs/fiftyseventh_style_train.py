"""A fifty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyseventh-*): an image classifier in the way of NVIDIA's
DeepLearningExamples (PyTorch/Classification/ConvNets main.py), started with the legacy launcher
`python -m torch.distributed.launch --nproc_per_node=N [--use_env] main.py ...`.
Raw torch: a tiny ResNet in DDP over gloo (15 s collective timeout), an ImageNet-like folder of
one raw file per sample split into per-rank shard lists (train/shard-K.txt, as DALI's
shard_id/num_shards reads them), a DataLoader with workers ("the pytorch data backend"), AMP
flags (torch.cuda.amp, which disable themselves on a CPU), dllogger-like logging on rank 0 only
("DLL <datetime> - Epoch: E Iteration: I  key : value ..." on stdout, "DLLL {json}" lines into
--raport-file), the ImageNet example's "Epoch: [E][I/N]" progress, "=> creating model" /
"=> loading checkpoint" on every rank, checkpoint-N.pth.tar by rank 0, --resume, an optional
target top1 that ends training early. The script declares --local_rank (the old launcher's
argument). A fault in the code is chosen by the DLE_TRAIN_CASE environment variable (a short
code) and never printed (re-capture with tests/fixtures/real/capture_fiftyseventh.sh after any
edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

DATA_BACKEND_CHOICES = ["pytorch", "synthetic"]
try:  # as DeepLearningExamples' image_classification/dataloaders.py
    from nvidia.dali.plugin.pytorch import DALIClassificationIterator  # noqa: F401

    DATA_BACKEND_CHOICES += ["dali-gpu", "dali-cpu"]
except ImportError:
    print("Please install DALI from https://www.github.com/NVIDIA/DALI to run this example.")

TIMEOUT = timedelta(seconds=15)
NUM_CLASSES = 4
SIDE = 24


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    mixup_rank: int = -1  # this rank's mixup one-hot takes its width from the batch's labels
    hoard_rank: int = -1  # this rank keeps every batch's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native jitter reads address 0
    slow_save: bool = False  # rank 0 writes its checkpoint to a crawling mount
    feeder_rank: int = -1  # this rank's prefetcher thread dies before epoch 2: get() waits
    solo_reduce: bool = False  # rank 0 alone all-reduces the best top1 before saving


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(mixup_rank=1),
    "r1": Fault(hoard_rank=1),
    "n2": Fault(segv_rank=2),
    "s0": Fault(slow_save=True),
    "f1": Fault(feeder_rank=1),
    "b0": Fault(solo_reduce=True),
}


class DLLogger:
    """dllogger's StdOutBackend ("DLL ...") and JSONStreamBackend ("DLLL {...}"), rank 0 only."""

    def __init__(self, enabled: bool, json_path: str) -> None:
        self.enabled = enabled
        self.start = time.time()
        self.file = open(json_path, "w") if enabled and json_path else None  # noqa: SIM115

    def _emit(self, kind: str, step: Any, data: dict[str, Any], units: dict[str, str]) -> None:
        if not self.enabled:
            return
        now = datetime.now()
        if kind == "PARAMETER":
            head = "PARAMETER"
        elif step == ():
            head = "Summary:"
        elif isinstance(step, tuple):
            head = f"Epoch: {step[0]}" + (f" Iteration: {step[1]}" if len(step) > 1 else "")
        else:
            head = str(step)
        parts = []
        for k, v in data.items():
            shown = f"{v:.5f}" if isinstance(v, float) else str(v)
            parts.append(f"{k} : {shown}" + (f" {units[k]}" if k in units else ""))
        print(f"DLL {now:%Y-%m-%d %H:%M:%S.%f} - {head} " + " ".join(parts), flush=True)
        if self.file is not None:
            rec: dict[str, Any] = {
                "timestamp": str(time.time()),
                "datetime": f"{now:%Y-%m-%d %H:%M:%S.%f}",
                "elapsedtime": str(time.time() - self.start),
                "type": kind,
            }
            if kind != "PARAMETER":
                rec["step"] = list(step) if isinstance(step, tuple) else step
            rec["data"] = data
            self.file.write("DLLL " + json.dumps(rec) + "\n")
            self.file.flush()

    def metadata(self, *_: Any) -> None:
        pass

    def log(self, step: Any, data: dict[str, Any], units: dict[str, str] | None = None) -> None:
        self._emit("LOG", step, data, units or {})

    def parameters(self, data: dict[str, Any]) -> None:
        self._emit("PARAMETER", None, data, {})


class ShardFolder(Dataset[tuple[torch.Tensor, int]]):
    """The samples listed in this rank's shard list ('img_NNNNN.raw LABEL' per line)."""

    def __init__(self, root: str, shard: int) -> None:
        self.root = root
        with open(os.path.join(root, f"shard-{shard}.txt")) as f:
            self.rows = [(n, int(c)) for n, c in (line.split() for line in f if line.strip())]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        name, label = self.rows[i]
        with open(os.path.join(self.root, name), "rb") as f:
            raw = bytearray(f.read())
        x = torch.frombuffer(raw, dtype=torch.uint8).float().view(3, SIDE, SIDE) / 255.0
        return (x - 0.45) / 0.225, label


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNetTiny(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = Bottleneck(8, 16, 2)
        self.layer2 = Bottleneck(16, 32, 2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Prefetcher:
    """Batches from a loader through a queue fed by a thread (the example's data_prefetcher)."""

    def __init__(self, loader: DataLoader[Any], start: bool = True) -> None:
        self.loader, self.q = loader, queue.Queue[Any](maxsize=4)
        if start:
            threading.Thread(target=self._feed, daemon=True).start()

    def _feed(self) -> None:
        try:
            for batch in self.loader:
                self.q.put(batch)
        except Exception as e:  # raised again in the training loop
            self.q.put(e)
        self.q.put(None)

    def __iter__(self) -> Any:
        while (batch := self.q.get()) is not None:
            if isinstance(batch, Exception):
                raise batch
            yield batch


def make_data(root: str, shards: int, per_shard: int, seed: int) -> None:
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    for s in range(shards):
        with open(os.path.join(root, f"shard-{s}.txt"), "w") as lst:
            for j in range(per_shard):
                i = s * per_shard + j
                label = i % NUM_CLASSES
                x = torch.randint(0, 150, (3, SIDE, SIDE), generator=g)
                x[label % 3] += 50 + 25 * label  # a class is a tint
                name = f"img_{i:05d}.raw"
                with open(os.path.join(root, name), "wb") as img:
                    img.write(bytes(x.clamp(0, 255).to(torch.uint8).flatten().tolist()))
                lst.write(f"{name} {label}\n")


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output.argmax(1) == target).float().mean() * 100.0


def reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    rt = t.clone()
    dist.all_reduce(rt)
    return rt / dist.get_world_size()


def save_checkpoint(state: dict[str, Any], path: str, slow: bool) -> None:
    if slow:  # the workspace is a network mount that crawls today
        for part in range(1, 9):
            print(f"=> writing '{path}' to the workspace: part {part}/8", flush=True)
            time.sleep(5)
    torch.save(state, path)


def mixup_target(target: torch.Tensor, lam: float, fault: bool) -> torch.Tensor:
    width = int(target.max()) + 1 if fault else NUM_CLASSES
    one_hot = F.one_hot(target, width).float()
    return lam * one_hot + (1 - lam) * one_hot.flip(0)


def train(args: argparse.Namespace) -> None:
    fault = FAULTS[os.environ.get("DLE_TRAIN_CASE", "")]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed + rank)
    logger = DLLogger(rank == 0, args.raport_file)
    logger.parameters({k: v for k, v in vars(args).items() if k != "make_data"})
    if args.amp:  # noqa: SIM108 (as the example writes it)
        scaler = torch.cuda.amp.GradScaler(init_scale=args.static_loss_scale)
    else:
        scaler = None

    print(f"=> creating model '{args.arch}'", flush=True)
    model = ResNetTiny(NUM_CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.875, weight_decay=3.05e-5)
    start_epoch, best_prec1 = 0, 0.0
    if args.resume:
        print(f"=> loading checkpoint '{args.resume}'", flush=True)
        checkpoint = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(checkpoint["state_dict"])
        opt.load_state_dict(checkpoint["optimizer"])
        start_epoch, best_prec1 = checkpoint["epoch"], float(checkpoint["best_prec1"])
        print(f"=> loaded checkpoint '{args.resume}' (epoch {start_epoch})", flush=True)
    model = DDP(model)

    train_ds = ShardFolder(os.path.join(args.data, "train"), rank)
    val_ds = ShardFolder(os.path.join(args.data, "val"), rank)
    train_loader = DataLoader(train_ds, args.batch_size, shuffle=True, num_workers=args.workers)
    val_loader = DataLoader(val_ds, args.batch_size, num_workers=args.workers)
    steps = len(train_loader)
    hoard: list[torch.Tensor] = []

    for epoch in range(start_epoch, args.epochs):
        model.train()
        feeder = Prefetcher(train_loader, start=not (epoch == 2 and rank == fault.feeder_rank))
        t0 = time.time()
        for i, (x, y) in enumerate(feeder, 1):
            with torch.cuda.amp.autocast(enabled=args.amp):
                out = model(x)
                if args.mixup > 0.0:
                    lam = 1.0 - args.mixup
                    soft = mixup_target(y, lam, rank == fault.mixup_rank and epoch >= 1)
                    loss = torch.sum(-soft * F.log_softmax(out, -1), -1).mean()
                else:
                    loss = F.cross_entropy(out, y)
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(48, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and epoch == 1 and i == 3:
                ctypes.string_at(0)  # the native colour jitter dereferences NULL
            opt.zero_grad()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            if i % args.print_freq == 0:
                prec1 = reduce_tensor(accuracy(out.detach(), y))
                reduced_loss = reduce_tensor(loss.detach())
                ips = world * args.batch_size * i / (time.time() - t0)
                if rank == 0:
                    print(
                        f"Epoch: [{epoch}][{i}/{steps}]\tLoss {reduced_loss.item():.4f}"
                        f"\tPrec@1 {prec1.item():.3f}",
                        flush=True,
                    )
                logger.log(
                    (epoch, i),
                    {
                        "train.loss": reduced_loss.item(),
                        "train.top1": prec1.item(),
                        "train.compute_ips": ips,
                        "train.lr": args.lr,
                    },
                    {"train.compute_ips": "img/s"},
                )
        model.eval()
        top1 = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                top1[0] += (model(x).argmax(1) == y).sum()
                top1[1] += len(y)
        if not fault.solo_reduce:
            dist.all_reduce(top1)
        if rank == 0:
            if fault.solo_reduce:  # the best-top1 bookkeeping, only where it is saved
                dist.all_reduce(top1)
            prec1_val = (top1[0] / top1[1]).item() * 100.0
            logger.log((epoch,), {"val.top1": prec1_val, "val.compute_ips": 0.0})
            best_prec1 = max(best_prec1, prec1_val)
            path = os.path.join(args.workspace, f"checkpoint-{epoch}.pth.tar")
            state = {
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": model.module.state_dict(),
                "best_prec1": best_prec1,
                "optimizer": opt.state_dict(),
            }
            save_checkpoint(state, path, fault.slow_save)
            print(f"=> saved checkpoint '{path}'", flush=True)
        else:
            prec1_val = (top1[0] / top1[1]).item() * 100.0
        if args.target_top1 > 0 and prec1_val >= args.target_top1:
            if rank == 0:
                print(
                    f"=> target top1 {args.target_top1:.2f} reached "
                    f"(val.top1 {prec1_val:.2f}) after epoch {epoch}: stopping",
                    flush=True,
                )
            break
    logger.log((), {"train.loss": loss.item(), "val.top1": best_prec1})
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("Experiment ended", flush=True)


def make_checkpoint(path: str, kind: str) -> None:
    """An earlier run's checkpoint: 'numpy' kept best_prec1 as a numpy float (the older
    example's np.mean of the batch accuracies); 'ddp' saved the DDP wrapper's state_dict."""
    import numpy as np

    model = ResNetTiny(NUM_CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.875)
    best: Any = 41.5
    sd = model.state_dict()
    if kind == "numpy":
        best = np.float64(41.5)
    elif kind == "ddp":
        sd = {f"module.{k}": v for k, v in sd.items()}
    state = {"epoch": 1, "arch": "resnet-tiny", "state_dict": sd, "best_prec1": best}
    state["optimizer"] = opt.state_dict()
    torch.save(state, path)


def main() -> None:
    p = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    p.add_argument("data", metavar="DIR", help="path to dataset")
    p.add_argument("--data-backend", default="pytorch", choices=DATA_BACKEND_CHOICES)
    p.add_argument("--arch", "-a", default="resnet-tiny")
    p.add_argument("-j", "--workers", default=2, type=int)
    p.add_argument("--epochs", default=3, type=int)
    p.add_argument("-b", "--batch-size", default=8, type=int)
    p.add_argument("--lr", default=0.05, type=float)
    p.add_argument("--mixup", default=0.0, type=float)
    p.add_argument("--print-freq", "-p", default=4, type=int)
    p.add_argument("--resume", default="", type=str)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--static-loss-scale", type=float, default=128.0)
    p.add_argument("--target-top1", type=float, default=0.0)
    p.add_argument("--workspace", type=str, default="./")
    p.add_argument("--raport-file", type=str, default="experiment_raport.json")
    p.add_argument("--seed", default=0, type=int)
    p.add_argument("--local_rank", default=int(os.getenv("LOCAL_RANK", "0")), type=int)
    p.add_argument("--make-data", action="store_true", help="write the data set to DIR and stop")
    p.add_argument("--make-ckpt", default="", help="write DIR as an earlier run's checkpoint")
    args = p.parse_args()
    if args.make_data:
        make_data(os.path.join(args.data, "train"), 4, 64, 1)
        make_data(os.path.join(args.data, "val"), 4, 16, 2)
        return
    if args.make_ckpt:
        make_checkpoint(args.data, args.make_ckpt)
        return
    if not args.amp and args.static_loss_scale != 1.0:
        print("Warning: if --amp is not used, static_loss_scale will be ignored.")
    train(args)


if __name__ == "__main__":
    main()
