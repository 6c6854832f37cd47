"""An eighty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/eightyfourth-*): torch's built-in distributed-training algorithms in one
image-classification train.py, the way the PyTorch DDP documentation and tutorials teach them:
DistributedDataParallel(static_graph=True, gradient_as_bucket_view=True), a communication hook
chosen by --comm-hook (PowerSGD with PowerSGDState(matrix_approximation_rank=1,
start_powerSGD_iter=...), fp16_compress_hook, or none), ZeroRedundancyOptimizer wrapping AdamW,
and every epoch's loop inside `with Join([model, optimizer], throw_on_early_termination=...)` so
that ranks with fewer batches finish early. A tiny residual CNN on synthetic 3x16x16 images (10
classes) in per-rank shards of different sizes (data/train_<rank>.pt and data/val.pt, written by
`train.py --prepare`); validation is all-reduced; Python logging on rank 0 only ('%(asctime)s |
%(levelname)s | %(name)s | %(message)s'; the other ranks log warnings only); the optimizer state
is consolidated with optimizer.consolidate_state_dict(to=0) and rank 0 saves
checkpoints/final.pt. gloo on CPU, 15 s collective timeout. Launched with `torchrun
--nproc_per_node=N --master_port=PORT --log-dir logs [--tee 3] train.py ...`. A fault in the
code is chosen by the TQ_CASE environment variable (a letter and a rank) and never printed
(re-capture with tests/fixtures/real/capture_eightyfourth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger(__name__)

NUM_CLASSES = 10


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


def prepare(data: Path, sizes: list[int], val: int = 96) -> None:
    """Synthetic 16x16 RGB images: each class a colour and a stripe orientation, plus noise."""
    g = torch.Generator().manual_seed(84)
    colours = torch.rand(NUM_CLASSES, 3, 1, 1, generator=g)
    ramp = torch.linspace(-1, 1, 16)

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
        horizontal = (y % 2 == 0).float().view(n, 1, 1, 1)
        stripes = torch.sin(3.0 * (y.float().view(n, 1, 1, 1) + 1) * ramp.view(1, 1, 16, 1))
        stripes = horizontal * stripes + (1 - horizontal) * stripes.transpose(2, 3)
        x = colours[y] + 0.3 * stripes + 0.4 * torch.randn(n, 3, 16, 16, generator=g)
        return x, y

    data.mkdir(parents=True, exist_ok=True)
    for rank, n in enumerate(sizes):
        x, y = make(n)
        torch.save({"images": x, "labels": y}, data / f"train_{rank}.pt")
    x, y = make(val)
    torch.save({"images": x, "labels": y}, data / "val.pt")


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(x)))


class SmallResNet(nn.Module):
    def __init__(self, drop_block: float = 0.0) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block1 = ResidualBlock(16)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.block2 = ResidualBlock(32)
        self.head = nn.Linear(32, NUM_CLASSES)
        self.drop_block = drop_block  # stochastic depth: skip a residual block now and then

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = self.block1(x)
        x = F.relu(self.down(x))
        if not (self.training and self.drop_block > 0 and random.random() < self.drop_block):
            x = self.block2(x)
        return self.head(x.mean(dim=(2, 3)))


def augment(x: torch.Tensor, letter: str, who: int, rank: int, step: int) -> torch.Tensor:
    """Random horizontal flips (the fast native path in production)."""
    if letter == "n" and rank == who and step == 4:
        ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"flip"), 4)
    flip = torch.rand(x.shape[0]) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP + ZeroRedundancyOptimizer + Join image classifier")
    p.add_argument("--prepare", action="store_true", help="write the synthetic data set and exit")
    p.add_argument("--sizes", default="160,128", help="training images per rank (--prepare)")
    p.add_argument("--data", default="data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--comm-hook", choices=["powersgd", "fp16", "none"], default="powersgd")
    p.add_argument("--start-powersgd-iter", type=int, default=10)
    p.add_argument("--throw-on-early-termination", action="store_true")
    p.add_argument("--drop-block", type=float, default=0.0, help="stochastic depth of block2")
    p.add_argument("--amp", action="store_true", help="mixed precision with a GradScaler")
    p.add_argument("--target-acc", type=float, default=None, help="stop once val acc reaches it")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N epochs")
    p.add_argument("--log-interval", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="checkpoints")
    return p.parse_args()


def evaluate(model: DDP, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.eval()
    stats = torch.zeros(3)  # loss sum, correct, count
    with torch.no_grad():
        for i in range(0, len(images), 32):
            logits = model.module(images[i : i + 32])
            y = labels[i : i + 32]
            stats[0] += F.cross_entropy(logits, y, reduction="sum")
            stats[1] += (logits.argmax(1) == y).sum()
            stats[2] += len(y)
    model.train()
    dist.all_reduce(stats)
    return stats


def save_checkpoint(
    model: DDP, optimizer: ZeroRedundancyOptimizer, epoch: int, path: Path, rank: int
) -> None:
    """The periodic checkpoint: the optimizer's shards gathered on rank 0, which saves."""
    optimizer.consolidate_state_dict(to=0)
    state = {
        "epoch": epoch,
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    if rank == 0:
        torch.save(state, path)
        logger.info("Saved checkpoint %s", path)


def main() -> None:
    args = parse()
    if args.prepare:
        prepare(Path(args.data), [int(n) for n in args.sizes.split(",")])
        return

    letter, who = fault()
    rank = int(os.environ["RANK"])
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    )
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    random.seed(args.seed + rank)  # per-rank augmentation and stochastic depth

    shard = torch.load(Path(args.data) / f"train_{rank}.pt")
    val = torch.load(Path(args.data) / "val.pt")
    val_x, val_y = val["images"][rank::world], val["labels"][rank::world]
    loader = DataLoader(
        TensorDataset(shard["images"], shard["labels"]),
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed + rank),
    )

    model = DDP(
        SmallResNet(drop_block=args.drop_block),
        static_graph=True,
        gradient_as_bucket_view=True,
    )
    if rank == 0:
        logger.info(
            "World size %d, backend gloo, %d parameters, DDP(static_graph=True, "
            "gradient_as_bucket_view=True)",
            world,
            sum(p.numel() for p in model.parameters()),
        )
    if args.comm_hook == "powersgd":
        state = powerSGD.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=1,
            start_powerSGD_iter=args.start_powersgd_iter,
        )
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
    elif args.comm_hook == "fp16" and letter != "h":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if rank == 0:
        if letter == "h" and args.comm_hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        logger.info("Communication hook: %s", args.comm_hook)

    optimizer = ZeroRedundancyOptimizer(
        model.parameters(),
        optimizer_class=torch.optim.AdamW,
        lr=args.lr,
        weight_decay=args.weight_decay,
    )
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    if rank == 0:
        logger.info(
            "ZeroRedundancyOptimizer(AdamW, lr=%g): rank 0 holds %d of %d parameter tensors",
            args.lr,
            len(optimizer.optim.param_groups[0]["params"]),
            len(list(model.parameters())),
        )
        logger.info(
            "Rank 0: %d training images, %d batches per epoch", len(shard["labels"]), len(loader)
        )

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    hoard: list[torch.Tensor] = []
    for epoch in range(1, args.epochs + 1):
        if letter == "s" and rank == who and epoch == 2:
            for k in range(1, 9):  # 8 passes of 4 s against the others' 15 s timeout
                logger.warning(
                    "Recomputing per-channel normalisation statistics of train_%d.pt (pass %d/8)",
                    rank,
                    k,
                )
                time.sleep(4)
        t0 = time.time()
        running, steps = 0.0, 0
        with Join([model, optimizer], throw_on_early_termination=args.throw_on_early_termination):
            for step, (x, y) in enumerate(loader, start=1):
                if letter == "w" and rank == who and epoch == 2 and step == 3:
                    ready = threading.Event()  # set by a prefetch thread that was never started
                    ready.wait()
                if letter == "m" and rank == who and epoch == 2:
                    hoard.append(torch.ones(16 << 20))  # 64 MiB a step
                    if len(hoard) >= 6:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                x = augment(x, letter, who, rank, step if epoch == 2 else 0)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                running += loss.item()
                steps = step
                if rank == 0 and step % args.log_interval == 0:
                    logger.info(
                        "Epoch [%d/%d] Step [%d/%d] loss %.4f",
                        epoch,
                        args.epochs,
                        step,
                        len(loader),
                        running / step,
                    )
        stats = evaluate(model, val_x, val_y)
        val_loss, val_acc = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()
        if rank == 0:
            logger.info(
                "Epoch %d done in %.1fs | train_loss %.4f | val_loss %.4f | val_acc %.3f",
                epoch,
                time.time() - t0,
                running / max(steps, 1),
                val_loss,
                val_acc,
            )
        if args.save_every and epoch % args.save_every == 0:
            save_checkpoint(model, optimizer, epoch, output / f"epoch_{epoch}.pt", rank)
        if args.target_acc is not None and val_acc >= args.target_acc:
            if rank == 0:
                logger.info(
                    "Target accuracy %.3f reached at epoch %d (val_acc %.3f), stopping",
                    args.target_acc,
                    epoch,
                    val_acc,
                )
            break

    if letter != "c":
        optimizer.consolidate_state_dict(to=0)
    if rank == 0:
        if letter == "c":
            optimizer.consolidate_state_dict(to=0)
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
            output / "final.pt",
        )
        logger.info("Saved consolidated checkpoint to %s", output / "final.pt")
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        logger.info("Training complete")


if __name__ == "__main__":
    main()
