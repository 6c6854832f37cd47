"""A hundred-and-forty-first training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyfirst-*): image classification trained with torchvision's
classification reference scripts (references/classification/train.py and utils.py, v0.15 era),
re-created in plain torch in one module without torchvision or PIL installed. Each run's folder
links this file as train.py and starts it as the README does:
`torchrun --nproc_per_node=2 train.py --model resnet18 --data-path DATA --epochs 3 --batch-size 8
--workers 2 --output-dir out` (some users still use the older `python -m torch.distributed.launch`).

As there: utils.init_distributed_mode reads RANK/WORLD_SIZE/LOCAL_RANK, prints '| distributed
init (rank 1): env://' with flush, init_process_group (gloo on CPU here, with a 15 s timeout
instead of the default 30 min), a barrier, then setup_for_distributed silences the builtin print
on every rank but 0 (print(..., force=True) still prints); warnings and tracebacks are not
silenced. main() prints its args Namespace, 'Loading data', 'Took ...', 'Creating data loaders',
'Creating model', 'Start training', MetricLogger lines every --print-freq batches ('Epoch: [0]
[ 0/7]  eta: ...  lr: 0.1  img/s: ...  loss: ... (...)  acc1: ... (...)  acc5: ...  time: ...
data: ...'), 'Epoch: [0] Total time: ...', evaluate()'s 'Test:  Total time: ...' and ' * Acc@1
... Acc@5 ...', checkpoint.pth and model_N.pth written by utils.save_on_master (rank 0 only),
'Training time 0:00:12'. --resume (torch.load(args.resume, map_location="cpu"), as that version
wrote it), --test-only, --sync-bn, --amp (torch.cuda.amp), --weights (a state dict from
$TORCH_HOME/hub/checkpoints). The data is an ImageFolder of tiny PNG files (DATA/train/<wnid>/,
DATA/val/<wnid>/), decoded with zlib; a DistributedSampler per split. The model is a ResNet-18
shaped network (BasicBlock, one block a stage, narrow) for 16x16 images.

A fault in the code is chosen by the TV_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyfirst.sh after any edit).
`python train.py --prepare DIR` writes the synthetic data (DIR/data) and the 'pretrained'
weights (DIR/hub).
"""

# ruff: noqa: B028, SIM113, SIM115 (torchvision's own code, as it is written)

from __future__ import annotations

import argparse
import builtins
import ctypes
import datetime
import os
import random
import struct
import sys
import threading
import time
import warnings
import zlib
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.data

CASE = os.environ.get("TV_CASE", "")
CLASSES = [f"n0{1440764 + 17 * k}" for k in range(10)]


def fault(letter: str) -> bool:
    """The case's letter, and its rank where it names one."""
    if not CASE.startswith(letter):
        return False
    rank = CASE[len(letter) :]
    return rank == "" or int(rank) == int(os.environ.get("RANK", "0"))


# ---------------------------------------------------------------- a PNG codec (PIL's place)
class UnidentifiedImageError(OSError):
    pass


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def write_png(path: Path, rgb: bytes, size: int) -> None:
    rows = b"".join(b"\x00" + rgb[y * size * 3 : (y + 1) * size * 3] for y in range(size))
    head = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    data = _chunk(b"IHDR", head) + _chunk(b"IDAT", zlib.compress(rows))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + data + _chunk(b"IEND", b""))


def pil_loader(path: str) -> torch.Tensor:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        raise UnidentifiedImageError(f"cannot identify image file {path!r}")
    pos, idat, w = 8, b"", 0
    while pos < len(raw):
        (n,) = struct.unpack(">I", raw[pos : pos + 4])
        kind = raw[pos + 4 : pos + 8]
        if kind == b"IHDR":
            w = struct.unpack(">I", raw[pos + 8 : pos + 12])[0]
        elif kind == b"IDAT":
            idat += raw[pos + 8 : pos + 8 + n]
        pos += 12 + n
    try:
        rows = zlib.decompress(idat)
    except zlib.error:
        raise OSError(f"image file is truncated ({len(raw)} bytes not processed)") from None
    pix = b"".join(rows[y * (3 * w + 1) + 1 : (y + 1) * (3 * w + 1)] for y in range(w))
    return torch.frombuffer(bytearray(pix), dtype=torch.uint8).view(w, w, 3).permute(2, 0, 1)


class ImageFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, root: str, transform: Any = None) -> None:
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [
            (os.path.join(root, c, f), self.class_to_idx[c])
            for c in self.classes
            for f in sorted(os.listdir(os.path.join(root, c)))
            if f.lower().endswith((".png", ".jpeg", ".jpg"))
        ]
        self.transform = transform
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        if fault("w") and index == self.stall_at:
            # a fork's cache lookup takes a lock it already holds
            with self.lock, self.lock:
                pass
        sample = pil_loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target

    stall_at = -1


class Normalize:
    def __init__(self, mean: list[float], std: list[float]) -> None:
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return (img.float() / 255 - self.mean) / self.std


class ClassificationPresetTrain:
    def __init__(self) -> None:
        self.norm = Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if random.random() < 0.5:
            img = img.flip(-1)
        return self.norm(img)


class ClassificationPresetEval:
    def __init__(self) -> None:
        self.norm = Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return self.norm(img)


# ---------------------------------------------------------------- torchvision/models/resnet.py
class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        res: torch.Tensor = self.relu(out + identity)
        return res


class ResNet(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, width * 2, 2)
        self.layer3 = BasicBlock(width * 2, width * 4, 2)
        self.layer4 = BasicBlock(width * 4, width * 8, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        out: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return out


def get_model(name: str, weights: str | None, num_classes: int) -> nn.Module:
    if name != "resnet18":
        raise ValueError(f"Unknown model {name}")
    model = ResNet(num_classes=1000 if weights else num_classes)
    if weights:
        hub = Path(os.environ.get("TORCH_HOME", "~/.cache/torch")).expanduser()
        f = hub / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
        print(f"Loading weights {weights} from {f}")
        model.load_state_dict(torch.load(f, map_location="cpu"))
    return model


# ---------------------------------------------------------------- references/classification/utils.py
class SmoothedValue:
    """Track a series of values and provide access to smoothed values over a
    window or the global series average."""

    def __init__(self, window_size: int = 20, fmt: str | None = None) -> None:
        if fmt is None:
            fmt = "{median:.4f} ({global_avg:.4f})"
        self.deque: deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt

    def update(self, value: float, n: int = 1) -> None:
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self) -> None:
        t = reduce_across_processes([self.count, self.total]).tolist()
        self.count = int(t[0])
        self.total = t[1]

    @property
    def median(self) -> float:
        return torch.tensor(list(self.deque)).median().item()

    @property
    def avg(self) -> float:
        return torch.tensor(list(self.deque), dtype=torch.float32).mean().item()

    @property
    def global_avg(self) -> float:
        return self.total / self.count

    @property
    def max(self) -> float:
        return max(self.deque)

    @property
    def value(self) -> float:
        return self.deque[-1]

    def __str__(self) -> str:
        return self.fmt.format(
            median=self.median,
            avg=self.avg,
            global_avg=self.global_avg,
            max=self.max,
            value=self.value,
        )


class MetricLogger:
    def __init__(self, delimiter: str = "\t") -> None:
        self.meters: defaultdict[str, SmoothedValue] = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs: float) -> None:
        for k, v in kwargs.items():
            self.meters[k].update(v)

    def __getattr__(self, attr: str) -> SmoothedValue:
        if attr in self.meters:
            return self.meters[attr]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")

    def __str__(self) -> str:
        return self.delimiter.join(f"{name}: {meter!s}" for name, meter in self.meters.items())

    def synchronize_between_processes(self) -> None:
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def add_meter(self, name: str, meter: SmoothedValue) -> None:
        self.meters[name] = meter

    def log_every(self, iterable: Any, print_freq: int, header: str = "") -> Any:
        i = 0
        start_time = time.time()
        end = time.time()
        iter_time = SmoothedValue(fmt="{avg:.4f}")
        data_time = SmoothedValue(fmt="{avg:.4f}")
        space_fmt = ":" + str(len(str(len(iterable)))) + "d"
        log_msg = self.delimiter.join(
            [
                header,
                "[{0" + space_fmt + "}/{1}]",
                "eta: {eta}",
                "{meters}",
                "time: {time}",
                "data: {data}",
            ]
        )
        for obj in iterable:
            data_time.update(time.time() - end)
            yield obj
            iter_time.update(time.time() - end)
            if i % print_freq == 0:
                eta_seconds = iter_time.global_avg * (len(iterable) - i)
                eta_string = str(datetime.timedelta(seconds=int(eta_seconds)))
                print(
                    log_msg.format(
                        i,
                        len(iterable),
                        eta=eta_string,
                        meters=str(self),
                        time=str(iter_time),
                        data=str(data_time),
                    )
                )
            i += 1
            end = time.time()
        total_time = time.time() - start_time
        total_time_str = str(datetime.timedelta(seconds=int(total_time)))
        print(f"{header} Total time: {total_time_str}")


def accuracy(
    output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)
) -> list[torch.Tensor]:
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])
        res = []
        for k in topk:
            correct_k = correct[:k].flatten().sum(dtype=torch.float32)
            res.append(correct_k * (100.0 / batch_size))
        return res


def setup_for_distributed(is_master: bool) -> None:
    """This function disables printing when not in master process"""
    builtin_print = builtins.print

    def print(*args: Any, **kwargs: Any) -> None:
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    if not is_dist_avail_and_initialized():
        return 0
    return dist.get_rank()


def is_main_process() -> bool:
    return get_rank() == 0


class SlowMountFile:
    """The output folder on a slow network mount: each write takes its time."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "wb")

    def write(self, b: bytes) -> int:
        time.sleep(2.0)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def save_on_master(*args: Any, **kwargs: Any) -> None:
    if is_main_process():
        if fault("s") and args[1].endswith("checkpoint.pth"):
            f = SlowMountFile(args[1])
            torch.save(args[0], f, _use_new_zipfile_serialization=False)  # type: ignore[arg-type]
            f.close()
            return
        torch.save(*args, **kwargs)


def init_distributed_mode(args: argparse.Namespace) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.gpu = args.rank % max(1, torch.cuda.device_count())
    elif hasattr(args, "rank"):
        pass
    else:
        print("Not using distributed mode")
        args.distributed = False
        return

    args.distributed = True

    args.dist_backend = "gloo"
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(
        backend=args.dist_backend,
        init_method=args.dist_url,
        world_size=args.world_size,
        rank=args.rank,
        timeout=datetime.timedelta(seconds=15),
    )
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def reduce_across_processes(val: Any) -> torch.Tensor:
    if not is_dist_avail_and_initialized():
        # nothing to sync, but we still convert to tensor for consistency with the distributed case.
        return torch.tensor(val)

    t = torch.tensor(val, dtype=torch.float64)
    dist.barrier()
    dist.all_reduce(t)
    return t


# ---------------------------------------------------------------- a fork's sampler
class ClassShardSampler(torch.utils.data.Sampler[int]):
    """A fork's 'locality' sampler: each rank reads whole classes (class k on rank k % world),
    every image once, shuffled per epoch; no padding."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        self.indices = [i for i, (_, t) in enumerate(dataset.samples) if t % num_replicas == rank]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        g = torch.Generator()
        g.manual_seed(self.epoch)
        return iter([self.indices[i] for i in torch.randperm(len(self.indices), generator=g)])

    def __len__(self) -> int:
        return len(self.indices)


# ---------------------------------------------------------------- references/classification/train.py
def train_one_epoch(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: Any,
    device: torch.device,
    epoch: int,
    args: argparse.Namespace,
    scaler: Any = None,
) -> None:
    model.train()
    metric_logger = MetricLogger(delimiter="  ")
    metric_logger.add_meter("lr", SmoothedValue(window_size=1, fmt="{value}"))
    metric_logger.add_meter("img/s", SmoothedValue(window_size=10, fmt="{value}"))

    header = f"Epoch: [{epoch}]"
    kept = []
    for i, (image, target) in enumerate(
        metric_logger.log_every(data_loader, args.print_freq, header)
    ):
        start_time = time.time()
        image, target = image.to(device), target.to(device)
        with torch.cuda.amp.autocast(enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)

        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()

        if fault("m") and epoch >= 1:  # a fork's in-RAM cache of augmented batches
            kept.append(torch.ones(48 * 2**20 // 4))
            if len(kept) >= 4:  # what the kernel's OOM killer does to the biggest process
                os.kill(os.getpid(), 9)
        if fault("z") and epoch == 1 and i == 3:  # a compiled augmentation op reads address 0
            ctypes.string_at(0)

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        batch_size = image.shape[0]
        metric_logger.update(loss=loss.item(), lr=optimizer.param_groups[0]["lr"])
        metric_logger.meters["acc1"].update(acc1.item(), n=batch_size)
        metric_logger.meters["acc5"].update(acc5.item(), n=batch_size)
        metric_logger.meters["img/s"].update(batch_size / (time.time() - start_time))


def evaluate(
    model: nn.Module,
    criterion: nn.Module,
    data_loader: Any,
    device: torch.device,
    print_freq: int = 100,
    log_suffix: str = "",
) -> float:
    model.eval()
    metric_logger = MetricLogger(delimiter="  ")
    header = f"Test: {log_suffix}"

    num_processed_samples = 0
    with torch.inference_mode():
        for image, target in metric_logger.log_every(data_loader, print_freq, header):
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)

            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            # FIXME need to take into account that the datasets
            # could have been padded in distributed setup
            batch_size = image.shape[0]
            metric_logger.update(loss=loss.item())
            metric_logger.meters["acc1"].update(acc1.item(), n=batch_size)
            metric_logger.meters["acc5"].update(acc5.item(), n=batch_size)
            num_processed_samples += batch_size
    # gather the stats from all processes

    num_processed_samples = int(reduce_across_processes(num_processed_samples))
    if (
        hasattr(data_loader.dataset, "__len__")
        and len(data_loader.dataset) != num_processed_samples
        and dist.get_rank() == 0
    ):
        # See FIXME above
        warnings.warn(
            f"It looks like the dataset has {len(data_loader.dataset)} samples, but {num_processed_samples} "
            "samples were used for the validation, which might bias the results. "
            "Try adjusting the batch size and / or the world size. "
            "Setting the world size to 1 is always a safe bet."
        )

    metric_logger.synchronize_between_processes()

    print(f" * Acc@1 {metric_logger.acc1.global_avg:.3f} Acc@5 {metric_logger.acc5.global_avg:.3f}")
    return metric_logger.acc1.global_avg


def load_data(traindir: str, valdir: str, args: argparse.Namespace) -> tuple[Any, ...]:
    # Data loading code
    print("Loading data")
    print("Loading training data")
    st = time.time()
    dataset = ImageFolder(traindir, ClassificationPresetTrain())
    print("Took", time.time() - st)

    print("Loading validation data")
    dataset_test = ImageFolder(valdir, ClassificationPresetEval())

    print("Creating data loaders")
    if args.distributed:
        if fault("u"):
            train_sampler: Any = ClassShardSampler(dataset, dist.get_world_size(), dist.get_rank())
        else:
            train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
        test_sampler: Any = torch.utils.data.distributed.DistributedSampler(
            dataset_test, shuffle=False
        )
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.SequentialSampler(dataset_test)

    return dataset, dataset_test, train_sampler, test_sampler


def main(args: argparse.Namespace) -> None:
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)

    init_distributed_mode(args)
    print(args)

    device = torch.device(args.device)
    torch.manual_seed(0)

    train_dir = os.path.join(args.data_path, "train")
    val_dir = os.path.join(args.data_path, "val")
    dataset, dataset_test, train_sampler, test_sampler = load_data(train_dir, val_dir, args)
    if fault("w"):
        dataset.stall_at = list(iter(train_sampler))[19]

    num_classes = len(dataset.classes)
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=False,
    )
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test,
        batch_size=args.batch_size,
        sampler=test_sampler,
        num_workers=args.workers,
        pin_memory=False,
    )

    print("Creating model")
    model = get_model(args.model, weights=args.weights, num_classes=num_classes)
    model.to(device)

    if args.distributed and args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]

    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    lr_scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma
    )

    model_without_ddp = model
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")
        model_without_ddp.load_state_dict(checkpoint["model"])
        if not args.test_only:
            optimizer.load_state_dict(checkpoint["optimizer"])
            lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1
        if scaler:
            scaler.load_state_dict(checkpoint["scaler"])

    if args.test_only:
        # We disable the cudnn benchmarking because it can noticeably affect the accuracy
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        evaluate(model, criterion, data_loader_test, device=device)
        return

    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, scaler)
        lr_scheduler.step()
        if fault("e"):  # a fork validates on the main process only, 'to save time'
            if is_main_process():
                evaluate(model, criterion, data_loader_test, device=device)
        else:
            evaluate(model, criterion, data_loader_test, device=device)
        if args.output_dir:
            checkpoint = {
                "model": model_without_ddp.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
                "args": args,
            }
            if scaler:
                checkpoint["scaler"] = scaler.state_dict()
            save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))

    total_time = time.time() - start_time
    total_time_str = str(datetime.timedelta(seconds=int(total_time)))
    print(f"Training time {total_time_str}")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="PyTorch Classification Training", add_help=add_help
    )

    parser.add_argument(
        "--data-path",
        default="/datasets01/imagenet_full_size/061417/",
        type=str,
        help="dataset path",
    )
    parser.add_argument("--model", default="resnet18", type=str, help="model name")
    parser.add_argument(
        "--device", default="cpu", type=str, help="device (Use cuda or cpu Default: cuda)"
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        default=32,
        type=int,
        help="images per gpu, the total batch size is $NGPU x batch_size",
    )
    parser.add_argument(
        "--epochs", default=90, type=int, metavar="N", help="number of total epochs to run"
    )
    parser.add_argument(
        "-j",
        "--workers",
        default=16,
        type=int,
        metavar="N",
        help="number of data loading workers (default: 16)",
    )
    parser.add_argument("--opt", default="sgd", type=str, help="optimizer")
    parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate")
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument(
        "--wd",
        "--weight-decay",
        default=1e-4,
        type=float,
        metavar="W",
        help="weight decay (default: 1e-4)",
        dest="weight_decay",
    )
    parser.add_argument(
        "--label-smoothing",
        default=0.0,
        type=float,
        help="label smoothing (default: 0.0)",
        dest="label_smoothing",
    )
    parser.add_argument(
        "--lr-step-size", default=30, type=int, help="decrease lr every step-size epochs"
    )
    parser.add_argument(
        "--lr-gamma", default=0.1, type=float, help="decrease lr by a factor of lr-gamma"
    )
    parser.add_argument("--print-freq", default=10, type=int, help="print frequency")
    parser.add_argument("--output-dir", default=".", type=str, help="path to save outputs")
    parser.add_argument("--resume", default="", type=str, help="path of checkpoint")
    parser.add_argument("--start-epoch", default=0, type=int, metavar="N", help="start epoch")
    parser.add_argument(
        "--sync-bn",
        dest="sync_bn",
        help="Use sync batch norm",
        action="store_true",
    )
    parser.add_argument(
        "--test-only",
        dest="test_only",
        help="Only test the model",
        action="store_true",
    )
    # Mixed precision training parameters
    parser.add_argument(
        "--amp", action="store_true", help="Use torch.cuda.amp for mixed precision training"
    )

    # distributed training parameters
    parser.add_argument("--world-size", default=1, type=int, help="number of distributed processes")
    parser.add_argument(
        "--dist-url", default="env://", type=str, help="url used to set up distributed training"
    )
    parser.add_argument("--weights", default=None, type=str, help="the weights enum name to load")
    return parser


def prepare(root: Path) -> None:
    """The synthetic ImageNet-shaped folder: 10 classes, 10 train and 4 val PNGs each, 16x16;
    and the 'pretrained' resnet18 state dict under hub/checkpoints."""
    rng = random.Random(0)
    for split, n in (("train", 10), ("val", 4)):
        for k, wnid in enumerate(CLASSES):
            d = root / "data" / split / wnid
            d.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                base = [(k * 25 + 40 * c) % 256 for c in range(3)]
                px = bytes(
                    min(255, max(0, base[i % 3] + rng.randint(-30, 30))) for i in range(16 * 16 * 3)
                )
                write_png(d / f"{wnid}_{1000 * k + j:08d}.png", px, 16)
    hub = root / "hub" / "hub" / "checkpoints"
    hub.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    torch.save(ResNet(num_classes=1000).state_dict(), hub / "resnet18-f37072fd.pth")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(Path(sys.argv[2]))
        sys.exit(0)
    args = get_args_parser().parse_args()
    main(args)
