"""A hundred-and-sixty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyseventh-*): an image classifier trained with timm's train.py
(huggingface/pytorch-image-models, its `Task` era), re-created in plain torch without timm,
torchvision or PIL installed, on two machines launched by hand: each node's checkout links this
file as train.py and a person types `torchrun --nnodes 2 --node_rank N --nproc_per_node 2
--master_addr $MASTER_ADDR --master_port $MASTER_PORT train.py data/imagenette-mini ...` in one
terminal per node (tests/fixtures/real/capture_hundredsixtyseventh.sh records both with `script`).

As in timm's train.py: the `--config` pre-parser and timm's argument groups (names and defaults as
timm has them; the subset this re-creation honours); `setup_default_logging` (INFO bare, other
levels 'LEVEL: '); `init_distributed_device` from torchrun's environment (gloo for --device cpu,
init_process_group without a timeout, so gloo's default 30 minutes); 'Training in distributed
mode with multiple processes, 1 device per process.Process 1, total 4, device cpu.' from every
process; then, from the primary only, 'Model resnet10t created, param count:N', the data
configuration, 'AMP not enabled. Training in torch.float32.', the learning rate scaled from
--lr-base by the global batch, 'ClassificationTask: criterion=LabelSmoothingCrossEntropy', the
optimizer's defaults, 'Preparing task for distributed training', 'Scheduled epochs: ...'; the
image folder reader (folders are classes, natural sort), timm's ImageDataset (an image it cannot
identify is skipped with 'WARNING: Skipped sample (index N). ...', the next one taken; a truncated
one fails in convert()), the DistributedSampler and OrderedDistributedSampler, a persistent
DataLoader, the prefetcher's normalisation; progress 'Train: 1 [   4/7 ( 71%)]  Loss: 2.05 (2.19)
Time: ...  LR: ...  Data: ...' every --log-interval updates with the loss all-reduced,
'Distributing BatchNorm running means and vars', 'Test: [   1/1]  Time: ...  Acc@1: ...', the
CheckpointSaver on the primary ('Current checkpoints:', last/model_best/checkpoint-N.pth.tar,
summary.csv, args.yaml), `--resume` ('Restoring model state from checkpoint...', 'Loaded
checkpoint '...' (epoch 2)'), the KeyboardInterrupt that ends the epoch loop quietly,
destroy_process_group, '*** Best metric: 56.66 (epoch 2)' and '--result' with the epochs' JSON.
Differences a CPU run needs: DDP without device_ids (timm passes [device], which DDP refuses for a
CPU module), images are 32x32 PNG files decoded here with zlib (the 'image library' below stands
in for PIL: its messages are PIL's), a tiny `resnet10t`.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank) and
never printed; the others come from what each node is given. `python train.py --prepare DIR`
writes the data set (DIR/imagenette-mini/{train,val}/<wnid>/*.png) and an earlier run's finished
checkpoint (DIR/output/train/20261206-181532-resnet10t-32/last.pth.tar). Re-capture with
tests/fixtures/real/capture_hundredsixtyseventh.sh after any edit.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import logging
import math
import operator
import os
import re
import shutil
import signal
import struct
import sys
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import datetime
from typing import Any, BinaryIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

CASE = os.environ.get("MT_CASE", "")
IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
IMG_EXTENSIONS = (".png", ".jpg", ".jpeg")
WNIDS = (
    "n01440764",
    "n02102040",
    "n02979186",
    "n03000684",
    "n03028079",
    "n03394916",
    "n03417042",
    "n03425413",
    "n03445777",
    "n03888605",
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESUMED_RUN = "20261206-181532-resnet10t-32"
HOLD: list[torch.Tensor] = []

_logger = logging.getLogger("train")
_data_logger = logging.getLogger("timm.data.dataset")
_config_logger = logging.getLogger("timm.data.config")
_saver_logger = logging.getLogger("timm.utils.checkpoint_saver")
_task_logger = logging.getLogger("timm.task.classification")
_resume_logger = logging.getLogger("timm.task._helpers")


def fault(letter: str, rank: int, args: argparse.Namespace) -> bool:
    return f"{letter}{rank}" == CASE and args.rank == rank


# --- the image library (PIL's part of the work, for the PNG files this data set has) ----------


class UnidentifiedImageError(OSError):
    """PIL.UnidentifiedImageError: the file is no image this library can read."""


class PngImage:
    """Image.open(fp): reads the header at once, the pixels when convert() needs them."""

    def __init__(self, fp: BinaryIO) -> None:
        self.fp = fp
        head = fp.read(8 + 8 + 13 + 4)
        if len(head) < 33 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
            raise UnidentifiedImageError(f"cannot identify image file {fp!r}")
        self.width, self.height, depth, color = struct.unpack(">IIBB", head[16:26])
        if depth != 8 or color != 2:
            raise UnidentifiedImageError(f"cannot identify image file {fp!r}")
        self.mode = "RGB"

    def convert(self, mode: str) -> torch.Tensor:
        """The decoded pixels (H, W, 3) as uint8; a file cut short fails as PIL's load() does."""
        data = b""
        while True:
            head = self.fp.read(8)
            if len(head) < 8:
                raise OSError(f"image file is truncated ({len(head)} bytes not processed)")
            length, kind = struct.unpack(">I4s", head)
            chunk = self.fp.read(length + 4)
            if len(chunk) < length + 4:
                raise OSError(f"image file is truncated ({len(chunk)} bytes not processed)")
            if kind == b"IDAT":
                data += chunk[:length]
            elif kind == b"IEND":
                break
        self.fp.close()
        raw = zlib.decompress(data)
        stride = self.width * 3 + 1
        rows = [raw[i * stride + 1 : (i + 1) * stride] for i in range(self.height)]
        pixels = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8)
        return pixels.view(self.height, self.width, 3)


def write_png(path: str, pixels: torch.Tensor) -> None:
    height, width, _ = pixels.shape
    flat = bytes(pixels.flatten().tolist())
    raw = b"".join(b"\x00" + flat[r * width * 3 : (r + 1) * width * 3] for r in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


# --- timm.utils ---------------------------------------------------------------------------------


class FormatterNoInfo(logging.Formatter):
    def __init__(self, fmt: str = "%(levelname)s: %(message)s") -> None:
        logging.Formatter.__init__(self, fmt)

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO:
            return str(record.getMessage())
        return logging.Formatter.format(self, record)


def setup_default_logging(default_level: int = logging.INFO) -> None:
    console_handler = logging.StreamHandler()
    console_handler.setFormatter(FormatterNoInfo())
    logging.root.addHandler(console_handler)
    logging.root.setLevel(default_level)


class AverageMeter:
    def __init__(self) -> None:
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0


def accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)) -> list:
    maxk = min(max(topk), output.size()[1])
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.reshape(1, -1).expand_as(pred))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / batch_size for k in topk]


def natural_key(string_: str) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", string_.lower())]


def is_primary(args: argparse.Namespace) -> bool:
    return bool(args.rank == 0)


def reduce_tensor(tensor: torch.Tensor, n: int) -> torch.Tensor:
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    rt /= n
    return rt


def distribute_bn(model: nn.Module, world_size: int, reduce: bool = False) -> None:
    for bn_name, bn_buf in unwrap_model(model).named_buffers(recurse=True):
        if ("running_mean" in bn_name) or ("running_var" in bn_name):
            if reduce:
                dist.all_reduce(bn_buf, op=dist.ReduceOp.SUM)
                bn_buf /= float(world_size)
            else:
                dist.broadcast(bn_buf, 0)


def unwrap_model(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def is_distributed_env() -> bool:
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"]) > 1
    return False


def init_distributed_device(args: argparse.Namespace) -> torch.device:
    args.distributed = False
    args.world_size = 1
    args.rank = 0
    args.local_rank = 0
    device_type = args.device.split(":", maxsplit=1)[0]
    dist_backend = {"cuda": "nccl"}.get(device_type, "gloo")
    if is_distributed_env():
        args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        dist.init_process_group(backend=dist_backend, init_method="env://")
        args.world_size = dist.get_world_size()
        args.rank = dist.get_rank()
        args.distributed = True
    if device_type == "cuda":
        assert torch.cuda.is_available(), f"CUDA is not available but {args.device} was specified."
    return torch.device(args.device)


def get_outdir(path: str, *paths: str) -> str:
    outdir = os.path.join(path, *paths)
    if not os.path.exists(outdir):
        os.makedirs(outdir)
    return outdir


def update_summary(
    epoch: int,
    train_metrics: OrderedDict,
    eval_metrics: OrderedDict | None,
    filename: str,
    lr: float,
    write_header: bool,
) -> None:
    import csv

    rowd: OrderedDict[str, Any] = OrderedDict(epoch=epoch)
    rowd.update([("train_" + k, v) for k, v in train_metrics.items()])
    if eval_metrics:
        rowd.update([("eval_" + k, v) for k, v in eval_metrics.items()])
    rowd["lr"] = lr
    with open(filename, mode="a") as cf:
        dw = csv.DictWriter(cf, fieldnames=rowd.keys())
        if write_header:
            dw.writeheader()
        dw.writerow(rowd)


class CheckpointSaver:
    """timm.utils.CheckpointSaver, on the primary only."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        args: argparse.Namespace,
        checkpoint_dir: str,
        decreasing: bool = False,
        max_history: int = 10,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.args = args
        self.checkpoint_files: list[tuple[str, float]] = []
        self.best_epoch: int | None = None
        self.best_metric: float | None = None
        self.checkpoint_dir = checkpoint_dir
        self.save_prefix = "checkpoint"
        self.extension = ".pth.tar"
        self.decreasing = decreasing
        self.cmp = operator.lt if decreasing else operator.gt
        self.max_history = max_history
        assert self.max_history >= 1

    def _save(self, save_path: str, epoch: int, metric: float | None = None) -> None:
        save_state = {
            "epoch": epoch,
            "arch": self.args.model,
            "optimizer": self.optimizer.state_dict(),
            "version": 2,
            "args": self.args,
            "state_dict": unwrap_model(self.model).state_dict(),
        }
        if metric is not None:
            save_state["metric"] = metric
        torch.save(save_state, save_path)

    def _duplicate(self, src: str, dst: str) -> None:
        if os.path.exists(dst):
            os.unlink(dst)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    def _cleanup_checkpoints(self, trim: int = 0) -> None:
        trim = min(len(self.checkpoint_files), trim)
        delete_index = self.max_history - trim
        if delete_index < 0 or len(self.checkpoint_files) <= delete_index:
            return
        for d in self.checkpoint_files[delete_index:]:
            os.remove(d[0])
        self.checkpoint_files = self.checkpoint_files[:delete_index]

    def save_checkpoint(self, epoch: int, metric: float | None = None) -> tuple[Any, Any]:
        assert epoch >= 0
        tmp_save_path = os.path.join(self.checkpoint_dir, "tmp" + self.extension)
        last_save_path = os.path.join(self.checkpoint_dir, "last" + self.extension)
        self._save(tmp_save_path, epoch, metric)
        os.replace(tmp_save_path, last_save_path)
        worst_file = self.checkpoint_files[-1] if self.checkpoint_files else None
        if (
            len(self.checkpoint_files) < self.max_history
            or metric is None
            or (worst_file is not None and self.cmp(metric, worst_file[1]))
        ):
            if len(self.checkpoint_files) >= self.max_history:
                self._cleanup_checkpoints(1)
            filename = "-".join([self.save_prefix, str(epoch)]) + self.extension
            save_path = os.path.join(self.checkpoint_dir, filename)
            self._duplicate(last_save_path, save_path)
            self.checkpoint_files.append((save_path, metric if metric is not None else 0.0))
            self.checkpoint_files = sorted(
                self.checkpoint_files, key=lambda x: x[1], reverse=not self.decreasing
            )
            checkpoints_str = "Current checkpoints:\n"
            for c in self.checkpoint_files:
                checkpoints_str += f" {c}\n"
            _saver_logger.info(checkpoints_str)
            if metric is not None and (
                self.best_metric is None or self.cmp(metric, self.best_metric)
            ):
                self.best_epoch = epoch
                self.best_metric = metric
                best_save_path = os.path.join(self.checkpoint_dir, "model_best" + self.extension)
                self._duplicate(last_save_path, best_save_path)
        return (None, None) if self.best_metric is None else (self.best_metric, self.best_epoch)


# --- timm.data ----------------------------------------------------------------------------------


def find_images_and_targets(folder: str) -> tuple[list[tuple[str, int]], dict[str, int]]:
    labels = []
    filenames = []
    for root, _subdirs, files in os.walk(folder, topdown=False, followlinks=True):
        rel_path = os.path.relpath(root, folder) if (root != folder) else ""
        label = os.path.basename(rel_path)
        for f in files:
            _base, ext = os.path.splitext(f)
            if ext.lower() in IMG_EXTENSIONS:
                filenames.append(os.path.join(root, f))
                labels.append(label)
    sorted_labels = sorted(set(labels), key=natural_key)
    class_to_idx = {c: idx for idx, c in enumerate(sorted_labels)}
    images_and_targets = [(f, class_to_idx[lb]) for f, lb in zip(filenames, labels, strict=True)]
    images_and_targets = sorted(images_and_targets, key=lambda k: natural_key(k[0]))
    return images_and_targets, class_to_idx


def _search_split(root: str, split: str) -> str:
    try_root = os.path.join(root, split)
    if os.path.exists(try_root):
        return try_root
    synonyms = ("train", "training") if split in ("train", "training") else ("val", "valid")
    for s in (*synonyms, "validation", "eval", "evaluation"):
        try_root = os.path.join(root, s)
        if os.path.exists(try_root):
            return try_root
    return root


class ReaderImageFolder:
    def __init__(self, root: str) -> None:
        self.root = root
        self.samples, self.class_to_idx = find_images_and_targets(root)
        if len(self.samples) == 0:
            raise RuntimeError(
                f"Found 0 images in subfolders of {root}. "
                f"Supported image extensions are {', '.join(IMG_EXTENSIONS)}"
            )

    def __getitem__(self, index: int) -> tuple[BinaryIO, int]:
        path, target = self.samples[index]
        return open(path, "rb"), target

    def __len__(self) -> int:
        return len(self.samples)


_ERROR_RETRY = 20


class ImageDataset(Dataset):
    def __init__(self, root: str, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.reader = ReaderImageFolder(root)
        self.transform = transform
        self._max_retries = _ERROR_RETRY

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for _attempt in range(self._max_retries):
            try:
                fp, target = self.reader[index]
                img = PngImage(fp)
                break
            except OSError as e:
                _data_logger.warning(f"Skipped sample (index {index}). {e}")
                index = (index + 1) % len(self.reader)
        else:
            raise RuntimeError(f"Failed to load {self._max_retries} consecutive samples")
        pixels = img.convert("RGB")
        return self.transform(pixels), target

    def __len__(self) -> int:
        return len(self.reader)


def create_dataset(root: str, split: str, is_training: bool) -> ImageDataset:
    def train_tf(x: torch.Tensor) -> torch.Tensor:  # ToNumpy after the random flip
        x = x.permute(2, 0, 1)
        return x.flip(2) if torch.rand(1).item() < 0.5 else x

    def eval_tf(x: torch.Tensor) -> torch.Tensor:
        return x.permute(2, 0, 1)

    return ImageDataset(_search_split(root, split), train_tf if is_training else eval_tf)


class OrderedDistributedSampler(Sampler[int]):
    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_samples = math.ceil(len(dataset) * 1.0 / self.num_replicas)  # type: ignore[arg-type]
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(range(len(self.dataset)))  # type: ignore[arg-type]
        indices += indices[: (self.total_size - len(indices))]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def fast_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    targets = torch.tensor([b[1] for b in batch], dtype=torch.int64)
    return torch.stack([b[0] for b in batch]), targets


class PrefetchLoader:
    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader = loader
        self.device = device
        self.mean = torch.tensor([x * 255 for x in IMAGENET_DEFAULT_MEAN]).view(1, 3, 1, 1)
        self.std = torch.tensor([x * 255 for x in IMAGENET_DEFAULT_STD]).view(1, 3, 1, 1)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first = True
        inp = target = torch.empty(0)
        for next_input, next_target in self.loader:
            next_input = next_input.to(device=self.device).float().sub_(self.mean).div_(self.std)
            if not first:
                yield inp, target
            else:
                first = False
            inp, target = next_input, next_target
        if not first:
            yield inp, target

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self) -> Any:
        return self.loader.sampler


def create_loader(
    dataset: ImageDataset, batch_size: int, is_training: bool, args: argparse.Namespace
) -> PrefetchLoader:
    sampler: Sampler[int] | None = None
    if args.distributed:
        if is_training:
            sampler = DistributedSampler(dataset)
        else:
            sampler = OrderedDistributedSampler(dataset, args.world_size, args.rank)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None and is_training,
        num_workers=args.workers,
        sampler=sampler,
        collate_fn=fast_collate,
        pin_memory=args.pin_mem,
        drop_last=is_training,
        persistent_workers=args.workers > 0,
    )
    return PrefetchLoader(loader, torch.device(args.device))


def epoch_order(n: int, world: int, epoch: int) -> dict[int, tuple[int, int]]:
    """sample index -> (rank, position in that rank's epoch) under DistributedSampler(seed 0):
    what the capture uses to know which rank reads a file in an epoch."""
    g = torch.Generator()
    g.manual_seed(0 + epoch)
    indices = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    indices += indices[: total - len(indices)]
    owner: dict[int, tuple[int, int]] = {}
    for rank in range(world):
        for pos, idx in enumerate(indices[rank:total:world]):
            owner.setdefault(idx, (rank, pos))
    return owner


def train_samples(root: str) -> list[str]:
    return [p for p, _ in find_images_and_targets(_search_split(root, "train"))[0]]


# --- timm.models, timm.loss, timm.scheduler -----------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.AvgPool2d(2, 2, ceil_mode=True) if stride != 1 else nn.Identity(),
                nn.Conv2d(inplanes, planes, 1, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.act2(x + shortcut)


class ResNet(nn.Module):
    """timm's resnet10t (deep-tiered stem, avg-down shortcuts), narrow enough for a CPU."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_chans, 12, 3, 1, 1, bias=False),
            nn.BatchNorm2d(12),
            nn.ReLU(inplace=True),
            nn.Conv2d(12, 16, 3, 1, 1, bias=False),
        )
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.layer4 = BasicBlock(64, 64, 2)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


def create_model(name: str, num_classes: int, in_chans: int = 3) -> nn.Module:
    if name not in ("resnet10t", "resnet14t"):
        raise RuntimeError(f"Unknown model ({name})")
    return ResNet(num_classes=num_classes, in_chans=in_chans)


class LabelSmoothingCrossEntropy(nn.Module):
    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logprobs = F.log_softmax(x, dim=-1)
        nll_loss = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        smooth_loss = -logprobs.mean(dim=-1)
        loss = self.confidence * nll_loss + self.smoothing * smooth_loss
        return loss.mean()


class CosineLRScheduler:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        t_initial: int,
        lr_min: float,
        warmup_lr_init: float,
        warmup_t: int,
    ) -> None:
        self.optimizer = optimizer
        self.t_initial = t_initial
        self.lr_min = lr_min
        self.warmup_t = warmup_t
        self.warmup_lr_init = warmup_lr_init
        self.t_in_epochs = True
        self.base_values = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        if warmup_t:
            self.warmup_steps = [(v - warmup_lr_init) / warmup_t for v in self.base_values]
            self._set(self.warmup_lr_init)

    def _set(self, value: float | list[float]) -> None:
        values = value if isinstance(value, list) else [value] * len(self.optimizer.param_groups)
        for group, v in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = v

    def step(self, epoch: int, metric: float | None = None) -> None:
        if epoch < self.warmup_t:
            self._set([self.warmup_lr_init + epoch * s for s in self.warmup_steps])
            return
        self._set(
            [
                self.lr_min
                + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * epoch / self.t_initial))
                for v in self.base_values
            ]
        )


# --- train.py -----------------------------------------------------------------------------------

config_parser = argparse.ArgumentParser(description="Training Config", add_help=False)
config_parser.add_argument(
    "-c", "--config", default="", type=str, metavar="FILE", help="YAML config file"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    group = parser.add_argument_group("Dataset parameters")
    parser.add_argument("data", nargs="?", metavar="DIR", const=None, help="path to dataset")
    group.add_argument("--data-dir", metavar="DIR", help="path to dataset (root dir)")
    group.add_argument("--dataset", metavar="NAME", default="", help="dataset type + name")
    group.add_argument("--train-split", metavar="NAME", default="train")
    group.add_argument("--val-split", metavar="NAME", default="validation")
    group.add_argument("--class-map", default="", type=str, metavar="FILENAME")
    group = parser.add_argument_group("Model parameters")
    group.add_argument("--model", default="resnet50", type=str, metavar="MODEL")
    group.add_argument("--pretrained", action="store_true", default=False)
    group.add_argument("--initial-checkpoint", default="", type=str, metavar="PATH")
    group.add_argument("--resume", default="", type=str, metavar="PATH")
    group.add_argument("--no-resume-opt", action="store_true", default=False)
    group.add_argument("--num-classes", type=int, default=None, metavar="N")
    group.add_argument("--img-size", type=int, default=None, metavar="N")
    group.add_argument("--in-chans", type=int, default=None, metavar="N")
    group.add_argument("--crop-pct", default=None, type=float, metavar="N")
    group.add_argument("--interpolation", default="", type=str, metavar="NAME")
    group.add_argument("-b", "--batch-size", type=int, default=128, metavar="N")
    group.add_argument("-vb", "--validation-batch-size", type=int, default=None, metavar="N")
    group.add_argument("--channels-last", action="store_true", default=False)
    group.add_argument("--grad-accum-steps", type=int, default=1, metavar="N")
    group = parser.add_argument_group("Device parameters")
    group.add_argument("--device", default="cuda", type=str)
    group.add_argument("--amp", action="store_true", default=False)
    group.add_argument("--amp-dtype", default="float16", type=str)
    group.add_argument("--model-dtype", default=None, type=str)
    group.add_argument("--no-ddp-bb", action="store_true", default=False)
    group.add_argument("--local_rank", "--local-rank", default=0, type=int)
    group = parser.add_argument_group("Optimizer parameters")
    group.add_argument("--opt", default="sgd", type=str, metavar="OPTIMIZER")
    group.add_argument("--momentum", type=float, default=0.9, metavar="M")
    group.add_argument("--weight-decay", type=float, default=2e-5)
    group.add_argument("--clip-grad", type=float, default=None, metavar="NORM")
    group = parser.add_argument_group("Learning rate schedule parameters")
    group.add_argument("--sched", type=str, default="cosine", metavar="SCHEDULER")
    group.add_argument("--lr", type=float, default=None, metavar="LR")
    group.add_argument("--lr-base", type=float, default=0.1, metavar="LR")
    group.add_argument("--lr-base-size", type=int, default=256, metavar="DIV")
    group.add_argument("--lr-base-scale", type=str, default="", metavar="SCALE")
    group.add_argument("--warmup-lr", type=float, default=1e-5, metavar="LR")
    group.add_argument("--min-lr", type=float, default=0, metavar="LR")
    group.add_argument("--epochs", type=int, default=300, metavar="N")
    group.add_argument("--start-epoch", default=None, type=int, metavar="N")
    group.add_argument("--warmup-epochs", type=int, default=5, metavar="N")
    group.add_argument("--warmup-prefix", action="store_true", default=False)
    group.add_argument("--cooldown-epochs", type=int, default=0, metavar="N")
    group = parser.add_argument_group("Augmentation and regularization parameters")
    group.add_argument("--no-aug", action="store_true", default=False)
    group.add_argument("--hflip", type=float, default=0.5)
    group.add_argument("--smoothing", type=float, default=0.1)
    group.add_argument("--drop", type=float, default=0.0, metavar="PCT")
    group = parser.add_argument_group("Batch norm parameters")
    group.add_argument("--sync-bn", action="store_true")
    group.add_argument("--dist-bn", type=str, default="reduce")
    group = parser.add_argument_group("Miscellaneous parameters")
    group.add_argument("--seed", type=int, default=42, metavar="S")
    group.add_argument("--log-interval", type=int, default=50, metavar="N")
    group.add_argument("--val-interval", type=int, default=1, metavar="N")
    group.add_argument("--recovery-interval", type=int, default=0, metavar="N")
    group.add_argument("--checkpoint-hist", type=int, default=10, metavar="N")
    group.add_argument("-j", "--workers", type=int, default=4, metavar="N")
    group.add_argument("--pin-mem", action="store_true", default=False)
    group.add_argument("--no-prefetcher", action="store_true", default=False)
    group.add_argument("--output", default="", type=str, metavar="PATH")
    group.add_argument("--experiment", default="", type=str, metavar="NAME")
    group.add_argument("--eval-metric", default="top1", type=str, metavar="EVAL_METRIC")
    group.add_argument("--log-wandb", action="store_true", default=False)
    return parser


parser = build_parser()


def _parse_args() -> tuple[argparse.Namespace, str]:
    args_config, remaining = config_parser.parse_known_args()
    if args_config.config:
        with open(args_config.config) as f:
            cfg = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            parser.set_defaults(**{k.strip(): v.strip() for k, v in cfg.items()})
    args = parser.parse_args(remaining)
    args_text = "".join(f"{k}: {v}\n" for k, v in sorted(args.__dict__.items()))
    return args, args_text


def resume_task_checkpoint(
    model: nn.Module, checkpoint_path: str, optimizer: torch.optim.Optimizer | None, log_info: bool
) -> int | None:
    resume_epoch = None
    if not os.path.isfile(checkpoint_path):
        _resume_logger.error(f"No checkpoint found at '{checkpoint_path}'")
        raise FileNotFoundError()
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    if log_info:
        _resume_logger.info("Restoring model state from checkpoint...")
    model.load_state_dict(checkpoint["state_dict"])
    if optimizer is not None and "optimizer" in checkpoint:
        if log_info:
            _resume_logger.info("Restoring optimizer state from checkpoint...")
        optimizer.load_state_dict(checkpoint["optimizer"])
    resume_epoch = checkpoint["epoch"]
    if checkpoint.get("version", 1) > 1:
        resume_epoch += 1
    if log_info:
        _resume_logger.info(f"Loaded checkpoint '{checkpoint_path}' (epoch {checkpoint['epoch']})")
    return resume_epoch


def main() -> None:
    setup_default_logging()
    args, args_text = _parse_args()
    args.prefetcher = not args.no_prefetcher
    args.grad_accum_steps = max(1, args.grad_accum_steps)
    device = init_distributed_device(args)
    if args.distributed:
        _logger.info(
            "Training in distributed mode with multiple processes, 1 device per process."
            f"Process {args.rank}, total {args.world_size}, device {args.device}."
        )
    else:
        _logger.info(f"Training with a single process on 1 device ({args.device}).")
    assert args.rank >= 0

    torch.manual_seed(args.seed + args.rank)
    model = create_model(args.model, num_classes=args.num_classes or 1000)
    if is_primary(args):
        _logger.info(
            f"Model {args.model} created, param count:{sum([m.numel() for m in model.parameters()])}"
        )
    size = args.img_size or 224
    data_config = {
        "input_size": (3, size, size),
        "interpolation": args.interpolation or "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "crop_pct": args.crop_pct or 0.95,
        "crop_mode": "center",
    }
    if is_primary(args):
        _config_logger.info("Data processing configuration for current model + dataset:")
        for n, v in data_config.items():
            _config_logger.info(f"\t{n}: {v}")
    model.to(device=device)
    amp_autocast = suppress
    if is_primary(args):
        _logger.info("AMP not enabled. Training in torch.float32.")

    if args.data and not args.data_dir:
        args.data_dir = args.data
    dataset_train = create_dataset(args.data_dir, args.train_split, is_training=True)
    dataset_eval = create_dataset(args.data_dir, args.val_split, is_training=False)
    loader_train = create_loader(dataset_train, args.batch_size, True, args)

    if not args.lr:
        global_batch_size = float(args.batch_size) * args.world_size * args.grad_accum_steps
        batch_ratio = global_batch_size / args.lr_base_size
        if not args.lr_base_scale:
            on = args.opt.lower()
            args.lr_base_scale = "sqrt" if any([o in on for o in ("ada", "lamb")]) else "linear"
        if args.lr_base_scale == "sqrt":
            batch_ratio = batch_ratio**0.5
        args.lr = args.lr_base * batch_ratio
        if is_primary(args):
            _logger.info(
                f"Learning rate ({args.lr}) calculated from base learning rate ({args.lr_base}) "
                f"and effective global batch size ({global_batch_size:g}) with "
                f"{args.lr_base_scale} scaling."
            )
    loader_eval = create_loader(
        dataset_eval, args.validation_batch_size or args.batch_size, False, args
    )
    train_loss_fn: nn.Module = (
        LabelSmoothingCrossEntropy(smoothing=args.smoothing)
        if args.smoothing
        else nn.CrossEntropyLoss()
    )
    validate_loss_fn = nn.CrossEntropyLoss()
    if is_primary(args):
        _task_logger.info(f"ClassificationTask: criterion={type(train_loss_fn).__name__}")

    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        nesterov=True,
    )
    if is_primary(args):
        defaults = copy.deepcopy(optimizer.defaults)
        defaults["weight_decay"] = args.weight_decay
        logging.info(
            f"Created {type(optimizer).__name__} ({args.opt}) optimizer: "
            + ", ".join([f"{k}: {v}" for k, v in defaults.items()])
        )

    resume_epoch = None
    if args.resume:
        resume_epoch = resume_task_checkpoint(
            model,
            args.resume,
            optimizer=None if args.no_resume_opt else optimizer,
            log_info=is_primary(args),
        )

    if args.distributed:
        if is_primary(args):
            _logger.info("Preparing task for distributed training")
        model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=not args.no_ddp_bb)

    eval_metric = args.eval_metric
    decreasing_metric = eval_metric == "loss"
    best_metric = None
    best_epoch = None
    saver = None
    output_dir = None
    if is_primary(args):
        exp_name = args.experiment or "-".join(
            [datetime.now().strftime("%Y%m%d-%H%M%S"), args.model, str(size)]
        )
        output_dir = get_outdir(args.output if args.output else "./output/train", exp_name)
        saver = CheckpointSaver(
            model=model,
            optimizer=optimizer,
            args=args,
            checkpoint_dir=output_dir,
            decreasing=decreasing_metric,
            max_history=args.checkpoint_hist,
        )
        with open(os.path.join(output_dir, "args.yaml"), "w") as f:
            f.write(args_text)
        if args.log_wandb:
            _logger.warning(
                "You've requested to log metrics to wandb but package not found. "
                "Metrics not being logged to wandb, try `pip install wandb`"
            )

    updates_per_epoch = (len(loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
    num_epochs = args.epochs + args.cooldown_epochs
    lr_scheduler = CosineLRScheduler(
        optimizer,
        t_initial=num_epochs,
        lr_min=args.min_lr,
        warmup_lr_init=args.warmup_lr,
        warmup_t=args.warmup_epochs,
    )
    start_epoch = 0
    if args.start_epoch is not None:
        start_epoch = args.start_epoch
    elif resume_epoch is not None:
        start_epoch = resume_epoch
    if start_epoch > 0:
        lr_scheduler.step(start_epoch)
    if is_primary(args):
        sched_explain = "(epochs + cooldown_epochs). Warmup within epochs when warmup_prefix=False"
        _logger.info(
            f"Scheduled epochs: {num_epochs} {sched_explain}. "
            f"LR stepped per {'epoch' if lr_scheduler.t_in_epochs else 'update'}."
        )

    results = []
    try:
        for epoch in range(start_epoch, num_epochs):
            if hasattr(loader_train.sampler, "set_epoch"):
                loader_train.sampler.set_epoch(epoch)
            train_metrics = train_one_epoch(
                epoch, model, loader_train, optimizer, train_loss_fn, args, amp_autocast,
                updates_per_epoch,
            )  # fmt: skip
            if args.distributed and args.dist_bn in ("broadcast", "reduce"):
                if is_primary(args):
                    _logger.info("Distributing BatchNorm running means and vars")
                distribute_bn(model, args.world_size, args.dist_bn == "reduce")

            eval_metrics = validate(model, loader_eval, validate_loss_fn, args, amp_autocast)
            if output_dir is not None:
                lrs = [param_group["lr"] for param_group in optimizer.param_groups]
                update_summary(
                    epoch,
                    train_metrics,
                    eval_metrics,
                    filename=os.path.join(output_dir, "summary.csv"),
                    lr=sum(lrs) / len(lrs),
                    write_header=best_metric is None,
                )
            latest_metric = eval_metrics[eval_metric]
            if saver is not None:
                best_metric, best_epoch = saver.save_checkpoint(epoch, metric=latest_metric)
            lr_scheduler.step(epoch + 1, latest_metric)
            results.append({"epoch": epoch, "train": train_metrics, "validation": eval_metrics})
            if fault("q", 1, args) and epoch == 1:
                # a fork's patience check on the process's own running train loss (its
                # losses_m.avg before the all-reduce): this rank alone finds no improvement
                _logger.info(
                    f"Train loss {train_metrics['local_loss']:.4f} did not improve for 1 "
                    "epoch(s), stopping training."
                )
                break
    except KeyboardInterrupt:
        pass

    if args.distributed:
        dist.destroy_process_group()

    if best_metric is not None:
        _logger.info(f"*** Best metric: {best_metric} (epoch {best_epoch})")

    if is_primary(args):
        display_results = sorted(
            results,
            key=lambda x: x.get("validation", x.get("train")).get(eval_metric, 0),
            reverse=decreasing_metric,
        )
        for r in display_results:
            r["train"].pop("local_loss", None)
        print(f"--result\n{json.dumps(display_results[-10:], indent=4)}")


def train_one_epoch(
    epoch: int,
    model: nn.Module,
    loader: PrefetchLoader,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    args: argparse.Namespace,
    amp_autocast: Callable[[], Any],
    updates_per_epoch: int,
) -> OrderedDict:
    update_time_m = AverageMeter()
    data_time_m = AverageMeter()
    losses_m = AverageMeter()
    correct_m = AverageMeter()
    model.train()
    last_batch_idx = len(loader) - 1
    data_start_time = update_start_time = time.time()
    optimizer.zero_grad()
    update_sample_count = 0
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        update_idx = batch_idx
        data_time_m.update(time.time() - data_start_time)
        if epoch == 1 and update_idx >= 1 and fault("k", 1, args):
            # a fork's in-memory cache of decoded batches, 64 MiB more every update: the
            # host's OOM killer ends the process (SIGKILL, no Python traceback)
            HOLD.append(torch.ones(16 * 1024 * 1024))
            if len(HOLD) >= 5:
                os.kill(os.getpid(), signal.SIGKILL)
        if epoch == 1 and update_idx == 3 and fault("z", 2, args):
            ctypes.string_at(0)  # a native decoder's null read: SIGSEGV, no Python traceback
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        batch_size = input.shape[0]
        global_batch_size = batch_size * args.world_size if args.distributed else batch_size
        losses_m.update(loss.item(), batch_size)
        correct_m.update(accuracy(output.detach(), target)[0].item(), batch_size)
        update_sample_count += global_batch_size
        optimizer.zero_grad()
        time_now = time.time()
        update_time_m.update(time.time() - update_start_time)
        update_start_time = time_now

        if update_idx % args.log_interval == 0 or last_batch:
            lrl = [param_group["lr"] for param_group in optimizer.param_groups]
            lr = sum(lrl) / len(lrl)
            loss_avg, loss_now = losses_m.avg, losses_m.val
            if args.distributed:
                loss_avg = reduce_tensor(loss.new([loss_avg]), args.world_size).item()
                loss_now = reduce_tensor(loss.new([loss_now]), args.world_size).item()
            if is_primary(args):
                _logger.info(
                    f"Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} "
                    f"({100.0 * (update_idx + 1) / updates_per_epoch:>3.0f}%)]  "
                    f"Loss: {loss_now:#.3g} ({loss_avg:#.3g})  "
                    f"Time: {update_time_m.val:.3f}s, "
                    f"{update_sample_count / update_time_m.val:>7.2f}/s  "
                    f"({update_time_m.avg:.3f}s, "
                    f"{update_sample_count / update_time_m.avg:>7.2f}/s)  "
                    f"LR: {lr:.3e}  "
                    f"Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})"
                )
        update_sample_count = 0
        data_start_time = time.time()

    if fault("b", 0, args) and is_primary(args):
        # a fork's train top-1, averaged over the processes inside the primary's logging
        # block: the primary's all_reduce is one the others never issue
        train_top1 = reduce_tensor(torch.tensor([correct_m.avg]), args.world_size).item()
        _logger.info(f"Train: {epoch} Acc@1: {train_top1:>7.3f}")

    local_loss = losses_m.avg
    loss_avg_t = torch.tensor([local_loss], dtype=torch.float32)
    if args.distributed:
        loss_avg_t = reduce_tensor(loss_avg_t, args.world_size)
    return OrderedDict([("loss", loss_avg_t.item()), ("local_loss", local_loss)])


def validate(
    model: nn.Module,
    loader: PrefetchLoader,
    loss_fn: nn.Module,
    args: argparse.Namespace,
    amp_autocast: Callable[[], Any],
) -> OrderedDict:
    batch_time_m = AverageMeter()
    losses_m = AverageMeter()
    top1_m = AverageMeter()
    top5_m = AverageMeter()
    model.eval()
    end = time.time()
    last_idx = len(loader) - 1
    with torch.inference_mode():
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_idx
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            if args.distributed:
                reduced_loss = reduce_tensor(loss.data, args.world_size)
                acc1 = reduce_tensor(acc1, args.world_size)
                acc5 = reduce_tensor(acc5, args.world_size)
            else:
                reduced_loss = loss.data
            batch_size = output.shape[0]
            losses_m.update(reduced_loss.item(), batch_size)
            top1_m.update(acc1.item(), batch_size)
            top5_m.update(acc5.item(), batch_size)
            batch_time_m.update(time.time() - end)
            end = time.time()
            if is_primary(args) and (last_batch or batch_idx % args.log_interval == 0):
                _logger.info(
                    f"Test: [{batch_idx:>4d}/{last_idx}]  "
                    f"Time: {batch_time_m.val:.3f} ({batch_time_m.avg:.3f})  "
                    f"Loss: {losses_m.val:>7.3f} ({losses_m.avg:>6.3f})  "
                    f"Acc@1: {top1_m.val:>7.3f} ({top1_m.avg:>7.3f})  "
                    f"Acc@5: {top5_m.val:>7.3f} ({top5_m.avg:>7.3f})"
                )
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg), ("top5", top5_m.avg)])


# --- what the capture prepares (never run by the person at the terminals) -----------------------


def prepare(root: str) -> None:
    """The data set every node gets a copy of, and a finished earlier run's checkpoint."""
    g = torch.Generator().manual_seed(2026)
    for split, per_class in (("train", 24), ("val", 6)):
        for c, wnid in enumerate(WNIDS):
            folder = os.path.join(root, "imagenette-mini", split, wnid)
            os.makedirs(folder, exist_ok=True)
            # each class a colour and a stripe direction, under noise
            base = torch.tensor([(c * 37) % 90 + 80, (c * 71) % 90 + 80, (c * 113) % 90 + 80])
            for i in range(per_class):
                noise = torch.randint(-80, 81, (32, 32, 3), generator=g)
                img = base.view(1, 1, 3) + noise
                stripe = (torch.arange(32) // 4) % 2 == 0
                if c % 2:
                    img[stripe, :, :] += 12
                else:
                    img[:, stripe, :] += 12
                num = 1000 + 97 * i + 13 * c + (500 if split == "val" else 0)
                write_png(os.path.join(folder, f"{wnid}_{num}.png"), img.clamp(0, 255).byte())
    args = build_parser().parse_args(
        [
            *("data/imagenette-mini", "--model", "resnet10t", "--num-classes", "10"),
            *("--img-size", "32", "-b", "8", "--epochs", "3", "--warmup-epochs", "1"),
            *("--device", "cpu", "-j", "1", "--log-interval", "2"),
        ]
    )
    args.lr = 0.0125
    model = create_model("resnet10t", num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.0125, momentum=0.9, nesterov=True)
    out = os.path.join(root, "output", "train", RESUMED_RUN)
    os.makedirs(out, exist_ok=True)
    saver = CheckpointSaver(model, opt, args, out)
    logging.disable(logging.INFO)
    for epoch, metric in enumerate((23.333333969116211, 41.66666793823242, 48.33333206176758)):
        saver.save_checkpoint(epoch, metric)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
    else:
        main()
