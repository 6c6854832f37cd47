"""A hundred-second training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsecond-*): a DDP image classifier written the way the TorchX example
apps are (torchx/examples/apps/lightning/train.py, the older examples/apps/dist_cifar): argparse
with --epochs, --batch_size, --lr, --data_path, --output_path, --log_path; `@record` on main;
`dist.init_process_group(backend=...)` from the environment torchrun gives; `print(model)` on rank
0; a tiny CNN on 3x8x8 synthetic 'CIFAR' images of 10 classes. The training set is a folder of
shards (train-0000k-of-0000N.pt) streamed by an IterableDataset that gives every rank the shards
shards[rank::world] (the webdataset/torchdata way); the validation set is one file read through
a DistributedSampler, its accuracy all-reduced. Rank 0 prints tensorboard-like scalars
('[epoch 1] step  16 | train/loss 1.2345 | train/lr 0.0500 | 812 img/s') and writes them to
--log_path/scalars.jsonl, saves --output_path/epoch_<n>.pt after every epoch and exports
model.pt at the end ('train acc: 0.8125, val acc: 0.7969').

Started the way its users start it on one machine: `torchx run -s local_cwd dist.ddp -j 1x2
--script train.py -- --epochs 3 ...` (tests/programs/hundredsecond_torchx.py re-creates that
launcher), after `python train.py --prepare --data_path data/cifar_tiny` wrote the data. A fault
in the code is chosen by $TQ_CASE (a short code, never printed); the others are in what a run is
given (re-capture with tests/fixtures/real/capture_hundredsecond.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import queue
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CASE = os.environ.get("TQ_CASE", "")
CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


def case(code: str, rank: int) -> bool:
    """The hidden fault switch: code letter plus the rank it hits."""
    return f"{code}{rank}" == CASE


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="distributed cifar TorchX example app")
    parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size per worker")
    parser.add_argument("--data_path", type=str, default="data/cifar_tiny")
    parser.add_argument("--output_path", type=str, help="where checkpoints and the model go")
    parser.add_argument("--log_path", type=str, default="/tmp/cifar_logs")
    parser.add_argument("--backend", type=str, default="gloo")
    parser.add_argument("--target_acc", type=float, default=0.0, help="stop once val acc >= it")
    parser.add_argument("--eval_every", type=int, default=0, help="mid-epoch eval (steps)")
    parser.add_argument("--lr_warmup_epochs", type=int, default=0)
    parser.add_argument("--cache_decoded", action="store_true", help="keep images in memory")
    parser.add_argument("--skip_export", action="store_true")
    parser.add_argument("--prepare", action="store_true", help="write the synthetic dataset")
    parser.add_argument("--num_samples", type=int, default=1024)
    parser.add_argument("--num_shards", type=int, default=4)
    return parser.parse_args(argv)


def prepare(args: argparse.Namespace) -> None:
    """A synthetic 'CIFAR': every class a fixed 3x8x8 pattern, the images noisy copies of it."""
    gen = torch.Generator().manual_seed(0)
    protos = torch.randn(10, 3, 8, 8, generator=gen)
    root = Path(args.data_path)
    root.mkdir(parents=True, exist_ok=True)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 10, (n,), generator=gen)
        images = protos[labels] + 1.5 * torch.randn(n, 3, 8, 8, generator=gen)
        return images, labels

    per = args.num_samples // args.num_shards
    for k in range(args.num_shards):
        images, labels = sample(per)
        name = f"train-{k:05d}-of-{args.num_shards:05d}.pt"
        torch.save({"images": images, "labels": labels}, root / name)
    images, labels = sample(256)
    torch.save({"images": images, "labels": labels}, root / "val.pt")
    print(f"wrote {args.num_shards} shards of {per} images and val.pt to {root}")


class ShardStream(IterableDataset):
    """The training shards of this rank (shards[rank::world]), shuffled per epoch."""

    def __init__(self, root: Path, rank: int, world: int) -> None:
        shards = sorted(root.glob("train-*-of-*.pt"))
        self.shards = shards[rank::world]
        self.rank = rank
        self.epoch = 0
        self.cache: dict[object, torch.Tensor] = {}
        self.cache_decoded = False
        self.cache_bytes = 0

    def load_shard(self, path: Path) -> dict:
        if case("r", self.rank) and self.epoch == 1 and path == self.shards[-1]:
            # the dataset sits on an NFS mount that was remounted under the job
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), str(path))
        return torch.load(path)

    def __iter__(self):
        gen = torch.Generator().manual_seed(1000 * self.epoch + self.rank)
        order = torch.randperm(len(self.shards), generator=gen).tolist()
        for k in order:
            shard = self.load_shard(self.shards[k])
            perm = torch.randperm(len(shard["labels"]), generator=gen)
            for i in perm.tolist():
                image = shard["images"][i]
                if self.cache_decoded:
                    key = (k, i, self.epoch) if case("m", self.rank) else (k, i)
                    if key not in self.cache:
                        # the 'decoded' image at the resolution the augmentations work on
                        self.cache[key] = image.repeat(1, 24, 24).contiguous()
                        self.cache_bytes += self.cache[key].numel() * 4
                        if self.cache_bytes > 450 * 2**20:  # the kernel's OOM killer
                            os.kill(os.getpid(), signal.SIGKILL)
                yield image, shard["labels"][i]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class ScalarWriter:
    """A SummaryWriter stand-in: rank 0 prints the scalars and appends them to a jsonl file."""

    def __init__(self, log_path: str) -> None:
        Path(log_path).mkdir(parents=True, exist_ok=True)
        self.file = Path(log_path) / "scalars.jsonl"

    def add_scalars(self, step: int, **values: float) -> None:
        with self.file.open("a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")


def native_augment(images: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """The random-crop 'extension' the app ships (a C helper in the original)."""
    if case("z", rank) and step == 20:
        ctypes.memmove(ctypes.create_string_buffer(64), 8, 64)  # a stale pointer
    shift = step % 3 - 1
    return torch.roll(images, shifts=(shift, -shift), dims=(2, 3))


def evaluate(model: nn.Module, loader: DataLoader, rank: int, epoch: int) -> tuple[float, float]:
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    worst: list[int] = []
    with torch.no_grad():
        for images, labels in loader:
            out = model(images)
            loss_sum += F.cross_entropy(out, labels, reduction="sum").item()
            correct += (out.argmax(1) == labels).sum().item()
            total += len(labels)
            worst.append(int(F.cross_entropy(out, labels, reduction="none").argmax()))
    if case("k", rank) and epoch >= 1:
        # the hardest validation image for the image panel: a batch position taken as an index
        # into the list of the rank's worst positions
        hardest = worst[max(worst)]
        print(f"hardest val image: {CLASSES[hardest % 10]}")
    stats = torch.tensor([correct, total, loss_sum], dtype=torch.float64)
    dist.all_reduce(stats)
    model.train()
    return stats[0].item() / stats[1].item(), stats[2].item() / stats[1].item()


def upload(path: Path, dest: str) -> None:
    """Rank 0's copy of a checkpoint to the remote output path (fsspec in the original)."""
    parts = 6
    for k in range(parts):
        print(f"uploading {path.name} to {dest}: part {k + 1}/{parts}", flush=True)
        time.sleep(5)


@record
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.prepare:
        prepare(args)
        return
    dist.init_process_group(backend=args.backend, timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)

    root = Path(args.data_path)
    train_set = ShardStream(root, rank, world)
    train_set.cache_decoded = args.cache_decoded
    val = torch.load(root / "val.pt")
    val_set = TensorDataset(val["images"], val["labels"])
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size)
    val_loader = DataLoader(val_set, batch_size=64, sampler=val_sampler)
    print(
        f"rank {rank} (local {local_rank}) of {world}: {len(train_set.shards)} training "
        f"shards, {len(val_sampler)} validation images",
        flush=True,
    )

    model = Net()
    if rank == 0:
        print(model, flush=True)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = None
    if args.lr_warmup_epochs:
        scheduler = torch.optim.lr_scheduler.LinearLR(
            optimizer, start_factor=0.2, total_iters=args.lr_warmup_epochs
        )
    writer = ScalarWriter(args.log_path) if rank == 0 else None
    out_dir = Path(args.output_path) if args.output_path else None
    if out_dir and rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    prefetch: queue.Queue = queue.Queue()

    step = 0
    val_acc = train_acc = 0.0
    for epoch in range(args.epochs):
        train_set.epoch = epoch
        if scheduler is not None:
            scheduler.step()  # the warm-up schedule, advanced at the start of each epoch
        correct = seen = 0
        t0, n0 = time.time(), 0
        for i, (images, labels) in enumerate(train_loader):
            if case("q", rank) and epoch == 1 and i == 6:
                # the next batch from a prefetch queue whose producer was never started
                images, labels = prefetch.get()
            images = native_augment(images, rank, step)
            out = model(images)
            loss = F.cross_entropy(out, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            correct += (out.argmax(1) == labels).sum().item()
            seen += len(labels)
            n0 += len(labels)
            if rank == 0 and step % 8 == 0:
                lr = optimizer.param_groups[0]["lr"]
                rate = n0 * world / max(time.time() - t0, 1e-6)
                print(
                    f"[epoch {epoch}] step {step:>3} | train/loss {loss.item():.4f} | "
                    f"train/lr {lr:.4f} | {rate:.0f} img/s",
                    flush=True,
                )
                writer.add_scalars(step, loss=loss.item(), lr=lr)
                t0, n0 = time.time(), 0
            if args.eval_every and step % args.eval_every == 0 and rank == 0:
                # a quick look at the validation accuracy without stopping the other workers
                acc, _ = evaluate(model, val_loader, rank, epoch)
                print(f"[epoch {epoch}] step {step:>3} | val/acc {acc:.4f} (mid-epoch)")
        train_acc = correct / max(seen, 1)
        val_acc, val_loss = evaluate(model, val_loader, rank, epoch)
        if rank == 0:
            print(
                f"[epoch {epoch}] val/acc {val_acc:.4f} | val/loss {val_loss:.4f} | "
                f"train/acc {train_acc:.4f}",
                flush=True,
            )
            writer.add_scalars(step, val_acc=val_acc, val_loss=val_loss)
            if out_dir:
                path = out_dir / f"epoch_{epoch}.pt"
                torch.save(
                    {
                        "epoch": epoch,
                        "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    path,
                )
                print(f"saved checkpoint {path}", flush=True)
                if case("u", rank) and epoch == 1:
                    upload(path, "s3://cifar-runs/ckpt")
        if args.target_acc and val_acc >= args.target_acc:
            if rank == 0:
                print(
                    f"val/acc {val_acc:.4f} >= target {args.target_acc:.2f} after epoch "
                    f"{epoch}, stopping",
                    flush=True,
                )
            break

    if rank == 0:
        print(f"train acc: {train_acc:.4f}, val acc: {val_acc:.4f}", flush=True)
        if out_dir and not args.skip_export:
            torch.save(model.module.state_dict(), out_dir / "model.pt")
            print(f"exported model to {out_dir / 'model.pt'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
