"""A hundred-and-thirty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyeighth-*): ImageNet trained the way the ffcv ImageNet example
(libffcv/ffcv-imagenet, train_imagenet.py) trains it, re-created in plain torch and numpy in one
module without ffcv, fastargs, torchvision, torchmetrics or tqdm installed. Each run's folder links
this file as train_imagenet.py, next to its rn18.yaml, and starts it as the README does:
`python train_imagenet.py --config-file rn18.yaml --data.train_dataset=.../train_40_0.50_90.beton
--data.val_dataset=.../val_40_0.50_90.beton --data.num_workers=2 --data.in_memory=1
--logging.folder=logs --dist.world_size=2 --training.distributed=1 --dist.port=P`.

As there: fastargs sections (model, resolution, data, lr, logging, validation, training, dist)
filled from the YAML file and `--section.param=value` flags, validated, and printed by the parent
as the 'Arguments defined' table; ImageNetTrainer.launch_from_args() starts world_size workers
with torch.multiprocessing.spawn from the script itself; each re-parses the config quietly, sets
MASTER_ADDR/MASTER_PORT from --dist.address/--dist.port and calls init_process_group with
rank=gpu (gloo on CPU here with a 15 s timeout, where ffcv-imagenet has nccl and cuda:gpu; the
model stays on the CPU and DDP gets no device_ids). The data are .beton files read by a loader of
the module's own (a header, a table of samples, raw RGB pages; RANDOM order in distributed mode:
a permutation per epoch seeded with 0 and padded like PyTorch's DistributedSampler, 'Warning: no
ordering seed was specified with distributed=True. Setting seed to 0 to match PyTorch distributed
sampler.' from every rank), the RandomResizedCrop decoder whose output size follows the
progressive-resizing schedule (min_res..max_res between start_ramp and end_ramp, multiples of
32), a cyclic learning rate, torch.cuda.amp's GradScaler and autocast as the example uses them
(on CPU they warn and disable themselves), a tqdm bar per epoch on every rank ('ep=0, iter=3,
shape=(16, 3, 32, 32), lrs=['0.250', '0.250']') and per validation, rank 0's '=> Logging in
<folder>/<uuid>', params.json, '=> Log: {...}' after each epoch's validation (top_1 and top_5 from
meters whose compute() all-reduces their state, as torchmetrics' does) and a JSON line per
evaluation in <folder>/<uuid>/log, final_weights.pt, destroy_process_group. Output goes where the
user sends it, buffered as Python buffers a file (the bars on stderr are not). The model is a tiny
ResNet-like network named resnet18 (two strided convolutions with batch norm, 10 classes).

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredthirtyeighth.sh after any edit).
`python train_imagenet.py --write-beton OUT N SEED` writes a .beton of N 40x40 images (as
write_imagenet.py does for ImageNet); the forks' flags --dist.node_rank and --training.resume
(a checkpoint loaded with torch.load) are those users add.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import struct
import sys
import threading
import time
import warnings
from argparse import ArgumentParser
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
import torch as ch
import torch.distributed as dist
import torch.nn.functional as F

CASE = os.environ.get("TQ_CASE", "")


def _case(letter: str, rank: int | None = None) -> bool:
    if not CASE.startswith(letter):
        return False
    return rank is None or CASE[len(letter) :] == str(rank)


# ---------------------------------------------------------------- fastargs, as it behaves
class Param:
    def __init__(
        self, kind: Any, desc: str = "", default: Any = None, required: bool = False
    ) -> None:
        self.kind, self.desc, self.default, self.required = kind, desc, default, required


class Config:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], Param] = {}
        self.content: dict[tuple[str, str], Any] = {}

    def __getitem__(self, key: tuple[str, str]) -> Any:
        return self.content.get(key, self.entries[key].default)

    def augment_argparse(self, parser: ArgumentParser) -> None:
        parser.add_argument("--config-file", type=str, action="append", default=[])
        for sec, name in self.entries:
            parser.add_argument(f"--{sec}.{name}", type=str)

    def collect_argparse_args(self, parser: ArgumentParser) -> None:
        args = vars(parser.parse_args())
        for fname in args.pop("config_file"):
            self._load_yaml(Path(fname).read_text())
        for key, value in args.items():
            if value is not None:
                sec, name = key.split(".", 1)
                self.content[(sec, name)] = value

    def _load_yaml(self, text: str) -> None:
        section = ""
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line.startswith(" "):
                section = line.rstrip(":").strip()
                continue
            name, value = line.strip().split(":", 1)
            self.content[(section, name.strip())] = value.strip()

    def validate(self, mode: str = "stderr") -> None:
        errors = []
        for key, p in self.entries.items():
            value = self.content.get(key)
            if value is None:
                if p.required:
                    errors.append((".".join(key), "Missing"))
                continue
            try:
                if p.kind is int and isinstance(value, str) and value in ("true", "false"):
                    value = int(value == "true")
                self.content[key] = p.kind(value)
            except ValueError as e:
                errors.append((".".join(key), str(e)))
        if errors:
            rows = [("Parameter", "Error"), *errors]
            print(_table(" Errors", rows), file=sys.stderr)
            sys.exit(1)

    def summary(self) -> None:
        rows = [("Parameter", "Value")]
        for key in sorted(self.entries):
            if key in self.content:
                rows.append((".".join(key), str(self.content[key])))
        print(_table(" Arguments defined", rows))


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    w0 = max(len(r[0]) for r in rows) + 2
    w1 = max(len(r[1]) for r in rows) + 2
    top = "┌" + (title + "─" * w0)[:w0] + "┬" + "─" * w1 + "┐"
    lines = [top]
    for k, (a, b) in enumerate(rows):
        lines.append(f"│ {a.ljust(w0 - 2)} │ {b.ljust(w1 - 2)} │")
        if k == 0:
            lines.append("├" + "─" * w0 + "┼" + "─" * w1 + "┤")
    lines.append("└" + "─" * w0 + "┴" + "─" * w1 + "┘")
    return "\n".join(lines)


_CONFIG = Config()


def get_current_config() -> Config:
    return _CONFIG


class Section:
    def __init__(self, name: str, desc: str = "") -> None:
        self.name = name

    def params(self, **params: Param) -> None:
        for k, p in params.items():
            _CONFIG.entries[(self.name, k)] = p


def param(path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    sec, name = path.split(".")

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault(name, _CONFIG[(sec, name)])
            return func(*args, **kwargs)

        return inner

    return deco


# ---------------------------------------------------------------- tqdm, as it writes to a file
class tqdm:
    def __init__(self, iterable: Any, desc: str = "", mininterval: float = 0.1) -> None:
        self.iterable, self.desc, self.mininterval = iterable, desc, mininterval
        self.total = len(iterable)
        self.n, self.start, self.last_print, self.last_len = 0, time.time(), 0.0, 0

    def _fmt(self, t: float) -> str:
        m, s = divmod(int(t), 60)
        return f"{m:02d}:{s:02d}"

    def display(self) -> None:
        elapsed = time.time() - self.start
        pct = 100 * self.n / self.total if self.total else 100
        fill = int(10 * self.n / self.total) if self.total else 10
        bar = "█" * fill + " " * (10 - fill)
        if self.n and elapsed > 0:
            rate = self.n / elapsed
            rate_s = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
            remaining = self._fmt((self.total - self.n) / rate)
        else:
            rate_s, remaining = "?it/s", "?"
        left = f"{self.desc}: " if self.desc else ""
        s = f"{left}{pct:3.0f}%|{bar}| {self.n}/{self.total} [{self._fmt(elapsed)}<{remaining}, {rate_s}]"
        sys.stderr.write("\r" + s + " " * max(self.last_len - len(s), 0))
        sys.stderr.flush()
        self.last_len, self.last_print = len(s), time.time()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.display()

    def __iter__(self) -> Iterator[Any]:
        self.display()
        for obj in self.iterable:
            yield obj
            self.n += 1
            if time.time() - self.last_print >= self.mininterval:
                self.display()
        self.display()
        sys.stderr.write("\n")
        sys.stderr.flush()


# ---------------------------------------------------------------- the .beton format and Loader
HEADER = struct.Struct("<HHIQQ")  # version, num_fields, page_size, num_samples, alloc_table_ptr
ENTRY = struct.Struct("<HHqQQ")  # height, width, label, data_ptr, data_size
PAGE = 4096


def write_beton(out: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table, blobs, ptr = [], [], HEADER.size + n * ENTRY.size
    for _ in range(n):
        label = int(rng.integers(10))
        img = rng.integers(0, 60, (40, 40, 3), dtype=np.uint8)
        img[:, :, label % 3] += np.uint8(100 + 10 * label)
        blob = img.tobytes()
        table.append(ENTRY.pack(40, 40, label, ptr, len(blob)))
        blobs.append(blob)
        ptr += len(blob)
    with open(out, "wb") as f:
        f.write(HEADER.pack(2, 2, PAGE, n, HEADER.size))
        f.write(b"".join(table) + b"".join(blobs))


_PAGE_LOCK = threading.Lock()


def _hold(lock: threading.Lock) -> None:
    with lock:
        while True:
            time.sleep(60)


class OrderOption:
    RANDOM = "random"
    QUASI_RANDOM = "quasi_random"
    SEQUENTIAL = "sequential"


def sample_order(n: int, order: str, seed: int, epoch: int, rank: int, world: int) -> list[int]:
    """RANDOM in distributed mode: the DistributedSampler's permutation and padding."""
    if order == OrderOption.SEQUENTIAL:
        idx = list(range(n))
    else:
        g = ch.Generator()
        g.manual_seed(seed + epoch)
        idx = ch.randperm(n, generator=g).tolist()
    if world == 1:
        return idx
    if _case("u"):  # a fork's page-aware order: each rank its slice, no padding
        return idx[rank::world]
    total = -(-n // world) * world
    idx += idx[: total - n]
    return idx[rank:total:world]


class RandomResizedCropRGBImageDecoder:
    def __init__(self, output_size: tuple[int, int]) -> None:
        self.output_size = output_size

    def __call__(self, img: ch.Tensor, rng: np.random.Generator) -> ch.Tensor:
        h, w = img.shape[1:]
        s = int(rng.integers(h // 2, h + 1))
        y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        crop = img[None, :, y : y + s, x : x + s].float()
        return F.interpolate(crop, size=self.output_size, mode="bilinear")[0]


class CenterCropRGBImageDecoder:
    def __init__(self, output_size: tuple[int, int], ratio: float) -> None:
        self.output_size, self.ratio = output_size, ratio

    def __call__(self, img: ch.Tensor, rng: np.random.Generator) -> ch.Tensor:
        h = img.shape[1]
        s = int(h * self.ratio)
        o = (h - s) // 2
        crop = img[None, :, o : o + s, o : o + s].float()
        return F.interpolate(crop, size=self.output_size, mode="bilinear")[0]


class Loader:
    def __init__(
        self,
        fname: str,
        batch_size: int,
        num_workers: int,
        order: str,
        os_cache: int = 1,
        drop_last: bool = True,
        decoder: Any = None,
        distributed: bool = False,
        seed: int | None = None,
    ) -> None:
        self.fname, self.batch_size, self.order = fname, batch_size, order
        self.drop_last, self.decoder, self.distributed = drop_last, decoder, distributed
        with open(fname, "rb") as f:
            raw = f.read()
        self.data = np.frombuffer(raw, dtype=np.uint8)
        _, _, _, self.n, table = HEADER.unpack_from(raw)
        self.entries = [ENTRY.unpack_from(raw, table + k * ENTRY.size) for k in range(self.n)]
        if distributed and order == OrderOption.RANDOM and seed is None:
            print(
                "Warning: no ordering seed was specified with distributed=True. "
                "Setting seed to 0 to match PyTorch distributed sampler."
            )
            seed = 0
        self.seed = seed or 0
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1
        self.epoch = 0
        self.cache: list[ch.Tensor] = []

    def _indices(self) -> list[int]:
        return sample_order(self.n, self.order, self.seed, self.epoch, self.rank, self.world)

    def __len__(self) -> int:
        k = len(self._indices())
        if self.drop_last and not _case("u"):
            return k // self.batch_size
        return -(-k // self.batch_size)

    def _decode(self, i: int, rng: np.random.Generator) -> tuple[ch.Tensor, int]:
        h, w, label, ptr, size = self.entries[i]
        page = ch.from_numpy(self.data[ptr : ptr + size].copy())
        img = page.reshape(h, w, 3).permute(2, 0, 1)
        return self.decoder(img, rng), label

    def _batch(self, chunk: list[int], rng: np.random.Generator) -> tuple[ch.Tensor, ch.Tensor]:
        if _case("z", self.rank) and self.order != OrderOption.SEQUENTIAL and self.epoch == 1:
            ctypes.string_at(0)  # the compiled decoder reads through a null page pointer
        out = [self._decode(i, rng) for i in chunk]
        images = ch.stack([o[0] for o in out]).contiguous(memory_format=ch.channels_last)
        mean = ch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
        std = ch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
        return ((images - mean) / std).half().float(), ch.tensor([o[1] for o in out])

    def __iter__(self) -> Iterator[tuple[ch.Tensor, ch.Tensor]]:
        idx = self._indices()
        rng = np.random.default_rng(self.seed + 1000 * self.epoch + self.rank)
        chunks = [idx[k : k + self.batch_size] for k in range(0, len(idx), self.batch_size)]
        chunks = chunks[: len(self)]
        q: queue.Queue[tuple[ch.Tensor, ch.Tensor] | None] = queue.Queue(maxsize=2)
        train = self.order != OrderOption.SEQUENTIAL
        wedged = _case("w", self.rank) and train and self.epoch == 1
        if wedged:  # the page reader takes the page-table lock and never gives it back
            threading.Thread(target=_hold, args=(_PAGE_LOCK,), daemon=True).start()
            time.sleep(0.2)

        def produce() -> None:
            for b, chunk in enumerate(chunks):
                if wedged and b == 2:
                    with _PAGE_LOCK:
                        pass
                q.put(self._batch(chunk, rng))
            q.put(None)

        errors: list[BaseException] = []

        def run() -> None:
            try:
                produce()
            except BaseException as e:  # handed to the consumer, as ffcv's EpochIterator does
                errors.append(e)
                q.put(None)

        threading.Thread(target=run, daemon=True).start()
        for _ in chunks:
            item = q.get()
            if item is None:
                break
            if _case("m", self.rank) and train and self.epoch >= 1:
                self.cache.append(ch.ones(16 * 1024 * 1024))  # 64 MiB kept a batch
                if len(self.cache) >= 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if _case("s", self.rank) and self.order == OrderOption.SEQUENTIAL:
                time.sleep(8.0)  # this rank's validation pages come from a slow mount
            yield item
        if errors:
            raise errors[0]
        self.epoch += 1


# ---------------------------------------------------------------- torchvision / torchmetrics
class BasicBlock(ch.nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = ch.nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = ch.nn.BatchNorm2d(cout)

    def forward(self, x: ch.Tensor) -> ch.Tensor:
        return F.relu(self.bn1(self.conv1(x)))


class ResNet(ch.nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.layer1 = BasicBlock(3, 8)
        self.layer2 = BasicBlock(8, 16)
        self.fc = ch.nn.Linear(16, num_classes)

    def forward(self, x: ch.Tensor) -> ch.Tensor:
        x = self.layer2(self.layer1(x))
        out: ch.Tensor = self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
        return out


def resnet18(pretrained: int = 0) -> ResNet:
    if pretrained:
        warnings.warn(
            "The parameter 'pretrained' is deprecated since 0.13 and may be removed in the "
            "future, please use 'weights' instead.",
            UserWarning,
            stacklevel=2,
        )
    return ResNet()


class Metric(ch.nn.Module):
    """torchmetrics' Metric: states summed over the ranks in compute() (dist_reduce_fx)."""

    def __init__(self) -> None:
        super().__init__()
        self.sum = ch.tensor(0.0)
        self.count = ch.tensor(0.0)

    def reset(self) -> None:
        self.sum, self.count = ch.tensor(0.0), ch.tensor(0.0)

    def compute(self) -> ch.Tensor:
        state = ch.stack([self.sum, self.count])
        if dist.is_initialized():
            dist.all_reduce(state)
        return state[0] / state[1]


class Accuracy(Metric):
    def __init__(self, top_k: int = 1) -> None:
        super().__init__()
        self.top_k = top_k

    def __call__(self, output: ch.Tensor, target: ch.Tensor) -> None:
        top = output.topk(self.top_k, dim=1).indices
        self.sum += (top == target[:, None]).any(dim=1).sum().float()
        self.count += target.numel()


class MeanScalarMetric(Metric):
    def __call__(self, sample: ch.Tensor) -> None:
        self.sum += sample.sum().float()
        self.count += sample.numel()


# ---------------------------------------------------------------- train_imagenet.py
Section("model", "model details").params(
    arch=Param(str, default="resnet18"),
    pretrained=Param(int, "is pretrained? (1/0)", default=0),
)
Section("resolution", "resolution scheduling").params(
    min_res=Param(int, "the minimum (starting) resolution", default=160),
    max_res=Param(int, "the maximum (starting) resolution", default=160),
    end_ramp=Param(int, "when to stop interpolating resolution", default=0),
    start_ramp=Param(int, "when to start interpolating resolution", default=0),
)
Section("data", "data related stuff").params(
    train_dataset=Param(str, ".dat file to use for training", required=True),
    val_dataset=Param(str, ".dat file to use for validation", required=True),
    num_workers=Param(int, "The number of workers", required=True),
    in_memory=Param(int, "does the dataset fit in memory? (1/0)", required=True),
)
Section("lr", "lr scheduling").params(
    step_ratio=Param(float, "learning rate step ratio", default=0.1),
    step_length=Param(int, "learning rate step length", default=30),
    lr_schedule_type=Param(str, default="cyclic"),
    lr=Param(float, "learning rate", default=0.5),
    lr_peak_epoch=Param(int, "Epoch at which LR peaks", default=2),
)
Section("logging", "how to log stuff").params(
    folder=Param(str, "log location", required=True),
    log_level=Param(int, "0 if only at end 1 otherwise", default=1),
)
Section("validation", "Validation parameters stuff").params(
    batch_size=Param(int, "The batch size for validation", default=512),
    resolution=Param(int, "final resized validation image size", default=224),
    lr_tta=Param(int, "should do lr flipping/avging at test time", default=1),
)
Section("training", "training hyper param stuff").params(
    eval_only=Param(int, "eval only?", default=0),
    batch_size=Param(int, "The batch size", default=512),
    optimizer=Param(str, "The optimizer", default="sgd"),
    momentum=Param(float, "SGD momentum", default=0.9),
    weight_decay=Param(float, "weight decay", default=4e-5),
    epochs=Param(int, "number of epochs", default=30),
    label_smoothing=Param(float, "label smoothing parameter", default=0.1),
    distributed=Param(int, "is distributed?", default=0),
    use_blurpool=Param(int, "use blurpool?", default=0),
    resume=Param(str, "checkpoint to resume from", default=""),
)
Section("dist", "distributed training options").params(
    world_size=Param(int, "number gpus", default=1),
    address=Param(str, "address", default="localhost"),
    port=Param(str, "port", default="12355"),
    node_rank=Param(int, "this node's rank", default=0),
    gpus_per_node=Param(int, "processes on this node", default=0),
)

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406]) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225]) * 255
DEFAULT_CROP_RATIO = 224 / 256


@param("lr.lr")
@param("training.epochs")
@param("lr.lr_peak_epoch")
def get_cyclic_lr(epoch: int, lr: float, epochs: int, lr_peak_epoch: int) -> float:
    xs = [0, lr_peak_epoch, epochs]
    ys = [1e-4 * lr, lr, 0]
    return float(np.interp([epoch], xs, ys)[0])


class BlurPoolConv2d(ch.nn.Module):
    def __init__(self, conv: ch.nn.Conv2d) -> None:
        super().__init__()
        default_filter = ch.tensor([[[[1, 2, 1], [2, 4, 2], [1, 2, 1]]]]) / 16.0
        filt = default_filter.repeat(conv.in_channels, 1, 1, 1)
        self.conv = conv
        self.register_buffer("blur_filter", filt)

    def forward(self, x: ch.Tensor) -> ch.Tensor:
        blurred = F.conv2d(
            x,
            self.get_buffer("blur_filter"),
            stride=1,
            padding=(1, 1),
            groups=self.conv.in_channels,
        )
        out: ch.Tensor = self.conv.forward(blurred)
        return out


class ImageNetTrainer:
    @param("training.distributed")
    def __init__(self, gpu: int, distributed: int) -> None:
        self.all_params = get_current_config()
        self.gpu = gpu
        self.uid = str(uuid4())
        if distributed:
            self.setup_distributed()
        self.train_loader = self.create_train_loader()
        self.val_loader = self.create_val_loader()
        self.model, self.scaler = self.create_model_and_scaler()
        self.create_optimizer()
        self.initialize_logger()
        self.resume()

    @param("dist.address")
    @param("dist.port")
    @param("dist.world_size")
    @param("dist.node_rank")
    @param("dist.gpus_per_node")
    def setup_distributed(
        self, address: str, port: str, world_size: int, node_rank: int, gpus_per_node: int
    ) -> None:
        os.environ["MASTER_ADDR"] = address
        os.environ["MASTER_PORT"] = port
        self.rank = node_rank * gpus_per_node + self.gpu if gpus_per_node else self.gpu
        dist.init_process_group(
            "gloo", rank=self.rank, world_size=world_size, timeout=timedelta(seconds=15)
        )

    def cleanup_distributed(self) -> None:
        dist.destroy_process_group()

    def get_lr(self, epoch: int) -> float:
        lr: float = get_cyclic_lr(epoch)
        return lr

    @param("resolution.min_res")
    @param("resolution.max_res")
    @param("resolution.end_ramp")
    @param("resolution.start_ramp")
    def get_resolution(
        self, epoch: int, min_res: int, max_res: int, end_ramp: int, start_ramp: int
    ) -> int:
        assert min_res <= max_res
        if epoch <= start_ramp:
            return min_res
        if epoch >= end_ramp:
            return max_res
        interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
        return int(np.round(interp[0] / 32)) * 32

    @param("training.momentum")
    @param("training.weight_decay")
    @param("training.label_smoothing")
    def create_optimizer(
        self, momentum: float, weight_decay: float, label_smoothing: float
    ) -> None:
        all_params = list(self.model.named_parameters())
        bn_params = [v for k, v in all_params if ("bn" in k)]
        other_params = [v for k, v in all_params if "bn" not in k]
        param_groups = [
            {"params": bn_params, "weight_decay": 0.0},
            {"params": other_params, "weight_decay": weight_decay},
        ]
        self.optimizer = ch.optim.SGD(param_groups, lr=1, momentum=momentum)
        self.loss = ch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    @param("data.train_dataset")
    @param("data.num_workers")
    @param("training.batch_size")
    @param("training.distributed")
    @param("data.in_memory")
    def create_train_loader(
        self,
        train_dataset: str,
        num_workers: int,
        batch_size: int,
        distributed: int,
        in_memory: int,
    ) -> Loader:
        train_path = Path(train_dataset)
        assert train_path.is_file()
        res = self.get_resolution(epoch=0)
        self.decoder = RandomResizedCropRGBImageDecoder((res, res))
        order = OrderOption.RANDOM if distributed else OrderOption.QUASI_RANDOM
        return Loader(
            train_dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            order=order,
            os_cache=in_memory,
            drop_last=True,
            decoder=self.decoder,
            distributed=bool(distributed),
        )

    @param("data.val_dataset")
    @param("data.num_workers")
    @param("validation.batch_size")
    @param("validation.resolution")
    @param("training.distributed")
    def create_val_loader(
        self, val_dataset: str, num_workers: int, batch_size: int, resolution: int, distributed: int
    ) -> Loader:
        val_path = Path(val_dataset)
        assert val_path.is_file()
        cropper = CenterCropRGBImageDecoder((resolution, resolution), ratio=DEFAULT_CROP_RATIO)
        return Loader(
            val_dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            order=OrderOption.SEQUENTIAL,
            drop_last=False,
            decoder=cropper,
            distributed=bool(distributed),
        )

    @param("training.epochs")
    @param("logging.log_level")
    def train(self, epochs: int, log_level: int) -> None:
        for epoch in range(epochs):
            res = self.get_resolution(epoch)
            self.decoder.output_size = (res, res)
            train_loss = self.train_loop(epoch)
            if _case("c"):  # a fork keeps a checkpoint of every epoch
                ch.save(self.model.state_dict(), self.log_folder / f"epoch_{epoch}.pt")
            if log_level > 0:
                extra_dict = {"train_loss": train_loss, "epoch": epoch}
                self.eval_and_log(extra_dict)
        self.eval_and_log({"epoch": epoch})
        if self.gpu == 0:
            ch.save(self.model.state_dict(), self.log_folder / "final_weights.pt")

    def eval_and_log(self, extra_dict: dict[str, Any] | None = None) -> dict[str, float]:
        start_val = time.time()
        if _case("v") and self.gpu != 0:  # a fork validates on the logging rank only
            return {}
        stats: dict[str, float] = self.val_loop()
        val_time = time.time() - start_val
        if self.gpu == 0:
            self.log(
                dict(
                    {
                        "current_lr": self.optimizer.param_groups[0]["lr"],
                        "top_1": stats["top_1"],
                        "top_5": stats["top_5"],
                        "val_time": val_time,
                    },
                    **(extra_dict or {}),
                )
            )
        return stats

    @param("model.arch")
    @param("model.pretrained")
    @param("training.distributed")
    @param("training.use_blurpool")
    def create_model_and_scaler(
        self, arch: str, pretrained: int, distributed: int, use_blurpool: int
    ) -> tuple[ch.nn.Module, Any]:
        scaler = ch.cuda.amp.GradScaler()
        model: ch.nn.Module = resnet18(pretrained=pretrained)

        def apply_blurpool(mod: ch.nn.Module) -> None:
            for name, child in mod.named_children():
                if isinstance(child, ch.nn.Conv2d) and (
                    np.max(child.stride) > 1 and child.in_channels >= 8
                ):
                    setattr(mod, name, BlurPoolConv2d(child))
                else:
                    apply_blurpool(child)

        if use_blurpool:
            apply_blurpool(model)
        model = model.to(memory_format=ch.channels_last)  # type: ignore[call-overload]
        if distributed:
            model = ch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=_case("f"))
        return model, scaler

    @param("training.resume")
    def resume(self, resume: str) -> None:
        if resume:
            ckpt = ch.load(resume)
            self.model.load_state_dict(ckpt["model"])

    @param("logging.log_level")
    def train_loop(self, epoch: int, log_level: int) -> None:
        model = self.model
        model.train()
        losses = []
        lr_start, lr_end = self.get_lr(epoch), self.get_lr(epoch + 1)
        iters = len(self.train_loader)
        lrs = np.interp(np.arange(iters), [0, iters], [lr_start, lr_end])
        iterator = tqdm(self.train_loader)
        for ix, (images, target) in enumerate(iterator):
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = lrs[ix]
            self.optimizer.zero_grad(set_to_none=True)
            with ch.cuda.amp.autocast():
                output = self.model(images)
                loss_train = self.loss(output, target)
            self.scaler.scale(loss_train).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if log_level > 0:
                losses.append(loss_train.detach())
                group_lrs = []
                for _, group in enumerate(self.optimizer.param_groups):
                    group_lrs.append(f"{group['lr']:.3f}")
                names = ["ep", "iter", "shape", "lrs"]
                values = [epoch, ix, tuple(images.shape), group_lrs]
                if log_level > 1:
                    names += ["loss"]
                    values += [f"{loss_train.item():.3f}"]
                msg = ", ".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
                iterator.set_description(msg)

    @param("validation.lr_tta")
    def val_loop(self, lr_tta: int) -> dict[str, float]:
        model = self.model
        model.eval()
        with ch.no_grad(), ch.cuda.amp.autocast():
            for images, target in tqdm(self.val_loader):
                output = self.model(images)
                if lr_tta:
                    output += self.model(ch.flip(images, dims=[3]))
                for k in ["top_1", "top_5"]:
                    self.val_meters[k](output, target)
                loss_val = self.loss(output, target)
                self.val_meters["loss"](loss_val)
        stats = {k: m.compute().item() for k, m in self.val_meters.items()}
        [meter.reset() for meter in self.val_meters.values()]
        return stats

    @param("logging.folder")
    def initialize_logger(self, folder: str) -> None:
        self.val_meters: dict[str, Any] = {
            "top_1": Accuracy(top_k=1),
            "top_5": Accuracy(top_k=5),
            "loss": MeanScalarMetric(),
        }
        if self.gpu == 0:
            log_folder = (Path(folder) / str(self.uid)).absolute()
            log_folder.mkdir(parents=True)
            self.log_folder = log_folder
            self.start_time = time.time()
            print(f"=> Logging in {self.log_folder}")
            params = {".".join(k): self.all_params[k] for k in self.all_params.entries}
            with open(log_folder / "params.json", "w+") as handle:
                json.dump(params, handle)

    def log(self, content: dict[str, Any]) -> None:
        print(f"=> Log: {content}")
        if self.gpu != 0:
            return
        cur_time = time.time()
        with open(self.log_folder / "log", "a+") as fd:
            fd.write(
                json.dumps(
                    {"timestamp": cur_time, "relative_time": cur_time - self.start_time, **content}
                )
                + "\n"
            )
            fd.flush()

    @classmethod
    @param("training.distributed")
    @param("dist.world_size")
    @param("dist.gpus_per_node")
    def launch_from_args(cls, distributed: int, world_size: int, gpus_per_node: int) -> None:
        if distributed:
            ch.multiprocessing.spawn(  # type: ignore[attr-defined, no-untyped-call]
                cls._exec_wrapper, nprocs=gpus_per_node or world_size, join=True
            )
        else:
            cls.exec(0)

    @classmethod
    def _exec_wrapper(cls, *args: Any, **kwargs: Any) -> None:
        make_config(quiet=True)
        cls.exec(*args, **kwargs)

    @classmethod
    @param("training.distributed")
    @param("training.eval_only")
    def exec(cls, gpu: int, distributed: int, eval_only: int) -> None:
        trainer = cls(gpu=gpu)
        if eval_only:
            trainer.eval_and_log()
        else:
            trainer.train()
        if distributed:
            trainer.cleanup_distributed()
        if _case("x", gpu):
            # the loader's page-reader pool, torn down at exit, touches a page already unmapped
            threading.Thread(target=ctypes.string_at, args=(0,)).start()
            time.sleep(1)


def make_config(quiet: bool = False) -> None:
    config = get_current_config()
    parser = ArgumentParser(description="Fast imagenet training")
    config.augment_argparse(parser)
    config.collect_argparse_args(parser)
    config.validate(mode="stderr")
    if not quiet:
        config.summary()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-beton"]:
        write_beton(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    make_config()
    ImageNetTrainer.launch_from_args()
