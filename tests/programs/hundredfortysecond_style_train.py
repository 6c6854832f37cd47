"""A hundred-and-forty-second training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortysecond-*): MONAI medical-imaging segmentation, the way the
tutorials' acceleration/distributed_training/unet_training_ddp.py trains it, re-created in plain
torch without MONAI installed. Each run's folder links this file as unet_training_ddp.py; it is
started as the tutorial's usage comment says: `python -m torch.distributed.launch
--nproc_per_node=2 --use_env unet_training_ddp.py -d ./testdata` (the legacy launcher and its
FutureWarning), or with torchrun, or on two nodes with --nnodes/--node_rank.

As there: `--local_rank` on the command line for the legacy launcher, LOCAL_RANK from the
environment with --use_env; every process whose local rank is not 0 sends its stdout and stderr
to os.devnull ("disable logging for processes except 0 on every node"), so a second node's local
rank 0 prints too; init_process_group(env://, gloo here, a 15 s timeout); the file lists of
./testdata (img*.npy, seg*.npy: tiny synthetic 3-D volumes of spheres, create_test_image_3d)
split with partition_dataset(shuffle, even_divisible) into a CacheDataset per rank ('Loading
dataset: 100%|...') and a ThreadDataLoader over it; Compose'd dict transforms (LoadImaged,
EnsureChannelFirstd, ScaleIntensityd, RandCropByPosNegLabeld, RandRotate90d); validation over a
DistributedSampler(even_divisible=False) with sliding_window_inference and a DiceMetric whose
sum and count are all-reduced; a UNet (two levels, instance norm) in DDP; DiceLoss(sigmoid).
Prints '----------', 'epoch 1/5', '1/8, train_loss: 0.6931', 'epoch 1 average loss: 0.6800',
'saved new best metric model', 'current epoch: 2 current mean dice: 0.4012 best mean dice:
0.4012 at epoch: 2', 'train completed, best_metric: 0.4012 at epoch: 2'.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortysecond.sh after any edit).
`python unet_training_ddp.py --generate DIR N` writes the synthetic data set.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from queue import Queue
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("MT_CASE", "")
ROI = (16, 16, 16)


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ tqdm (as MONAI uses it)
def tqdm(items: Sequence[Data], desc: str, total: int) -> Iterator[Data]:
    """tqdm's default bar on stderr, redrawn with a carriage return after each item."""
    t0 = time.time()

    def bar(n: int) -> str:
        el = time.time() - t0
        rate = n / el if el > 0 and n else 0.0
        left = (total - n) / rate if rate else 0.0
        filled = int(10 * n / total) if total else 10
        pct = int(100 * n / total) if total else 100
        return (
            f"\r{desc}: {pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d},"
            f" {rate:6.2f}it/s]"
        )

    sys.stderr.write(bar(0))
    sys.stderr.flush()
    for n, item in enumerate(items, 1):
        yield item
        sys.stderr.write(bar(n))
        sys.stderr.flush()
    sys.stderr.write("\n")


# ------------------------------------------------------------------ monai.data.synthetic
def create_test_image_3d(
    height: int, width: int, depth: int, num_objs: int = 6, rad_max: int = 6, rad_min: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    image = np.zeros((height, width, depth), dtype=np.float32)
    for _ in range(num_objs):
        x, y, z = (np.random.randint(rad_max, d - rad_max) for d in (height, width, depth))
        rad = np.random.randint(rad_min, rad_max)
        sx, sy, sz = np.ogrid[-x : height - x, -y : width - y, -z : depth - z]
        image[sx * sx + sy * sy + sz * sz <= rad * rad] = np.random.random() * 0.5 + 0.5
    seg = np.ceil(image).astype(np.float32)
    noise = np.random.uniform(0, 0.3, size=image.shape).astype(np.float32)
    return np.maximum(image, noise), seg


def generate(folder: str, n: int) -> None:
    os.makedirs(folder, exist_ok=True)
    np.random.seed(seed=0)
    for i in range(n):
        im, seg = create_test_image_3d(24, 24, 24)
        np.save(os.path.join(folder, f"img{i}.npy"), im)
        np.save(os.path.join(folder, f"seg{i}.npy"), seg)


# ------------------------------------------------------------------ monai.transforms
Data = dict[str, Any]


class LoadImaged:
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys

    def __call__(self, d: Data) -> Data:
        d = dict(d)
        for k in self.keys:
            if fault("c", RANK):  # this rank's volumes come from a slow network mount
                time.sleep(2.5)
            d[k] = np.load(d[k])
        return d


class EnsureChannelFirstd:
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys

    def __call__(self, d: Data) -> Data:
        return {k: (v[None] if k in self.keys else v) for k, v in d.items()}


class ScaleIntensityd:
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys

    def __call__(self, d: Data) -> Data:
        d = dict(d)
        for k in self.keys:
            v = d[k]
            d[k] = (v - v.min()) / max(float(v.max() - v.min()), 1e-8)
        return d


class RandCropByPosNegLabeld:
    def __init__(self, keys: Sequence[str], label_key: str, spatial_size: Sequence[int]) -> None:
        self.keys, self.label_key, self.size = keys, label_key, spatial_size

    def __call__(self, d: Data) -> Data:
        label = d[self.label_key][0]
        fg = np.argwhere(label > 0)
        if len(fg) == 0:
            raise ValueError("No sampling location available.")
        centre = fg[random.randrange(len(fg))] if random.random() < 0.5 else None
        start = []
        for axis, s in enumerate(self.size):
            hi = label.shape[axis] - s
            c = random.randint(0, hi) if centre is None else int(centre[axis]) - s // 2
            start.append(min(max(c, 0), hi))
        sl = (slice(None), *(slice(b, b + s) for b, s in zip(start, self.size, strict=True)))
        d = dict(d)
        for k in self.keys:
            d[k] = d[k][sl]
        return d


class RandRotate90d:
    def __init__(self, keys: Sequence[str], prob: float, spatial_axes: tuple[int, int]) -> None:
        self.keys, self.prob, self.axes = keys, prob, spatial_axes
        self.max_k = 3

    def __call__(self, d: Data) -> Data:
        if random.random() >= self.prob:
            return d
        k = random.randint(0, self.max_k)
        axes = (self.axes[0] + 1, self.axes[1] + 1)
        if fault("r", RANK) and EPOCH[0] >= 2:  # a fork's axes counted with the batch dimension
            axes = (self.axes[0] + 2, self.axes[1] + 2)
        return {
            key: (np.rot90(v, k, axes).copy() if key in self.keys else v) for key, v in d.items()
        }


class EnsureTyped:
    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys

    def __call__(self, d: Data) -> Data:
        return {
            k: (torch.as_tensor(np.ascontiguousarray(v)) if k in self.keys else v)
            for k, v in d.items()
        }


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Data], Data]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, d: Data, start: int = 0, end: int | None = None) -> Data:
        for t in self.transforms[start:end]:
            try:
                d = t(d)
            except Exception as e:
                raise RuntimeError(f"applying transform {t}") from e
        return d


RANDOM = (RandCropByPosNegLabeld, RandRotate90d)


# ------------------------------------------------------------------ monai.data
def partition_dataset(
    data: list[Data], num_partitions: int, shuffle: bool, even_divisible: bool, seed: int = 0
) -> list[list[Data]]:
    idx = list(range(len(data)))
    if shuffle:
        random.Random(seed).shuffle(idx)
    if even_divisible:
        total = math.ceil(len(idx) / num_partitions) * num_partitions
        idx += idx[: total - len(idx)]
    return [[data[i] for i in idx[r::num_partitions]] for r in range(num_partitions)]


class CacheDataset(Dataset[Data]):
    def __init__(self, data: list[Data], transform: Compose, cache_rate: float = 1.0) -> None:
        self.data, self.transform = data, transform
        first_random = next(
            (i for i, t in enumerate(transform.transforms) if isinstance(t, RANDOM)),
            len(transform.transforms),
        )
        self.first_random = first_random
        n = min(int(len(data) * cache_rate), len(data))
        self._cache = [
            transform(dict(d), end=first_random)
            for d in tqdm(data[:n], desc="Loading dataset", total=n)
        ]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Data:
        if i < len(self._cache):
            start, item = self.first_random, self._cache[i]
        else:
            start, item = 0, dict(self.data[i])
        if fault("k", RANK) and EPOCH[0] >= 2:  # a fork keeps every sample it hands out
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), 9)
        if fault("z", RANK) and EPOCH[0] >= 2 and i == len(self.data) - 1:
            ctypes.string_at(0)  # the compiled resampler reads a freed buffer
        return self.transform(item, start=start)


class DistributedSampler(torch.utils.data.DistributedSampler[int]):
    def __init__(self, dataset: Dataset[Any], even_divisible: bool = True, **kw: Any) -> None:
        super().__init__(dataset, **kw)
        if not even_divisible:
            n = len(dataset)  # type: ignore[arg-type]
            extra = self.total_size - n
            if self.rank < self.num_replicas - extra:
                self.num_samples = math.ceil(n / self.num_replicas)
            else:
                self.num_samples = n // self.num_replicas
            self.total_size = n

    def __iter__(self) -> Iterator[int]:
        return iter(list(range(len(self.dataset)))[self.rank : self.total_size : self.num_replicas])  # type: ignore[arg-type]


def list_data_collate(batch: list[Data]) -> Data:
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


class ThreadDataLoader(DataLoader[Data]):
    """Iterates the DataLoader in a background thread (monai.data.ThreadBuffer)."""

    def __iter__(self) -> Iterator[Data]:  # type: ignore[override]
        q: Queue[tuple[str, Any]] = Queue(maxsize=1)
        lock = threading.Lock()

        def enqueue() -> None:
            try:
                for n, b in enumerate(DataLoader.__iter__(self)):
                    if fault("w", RANK) and EPOCH[0] >= 3 and n == 2:
                        lock.acquire()
                        lock.acquire()  # the buffer's lock, taken twice
                    q.put(("b", b))
                q.put(("end", None))
            except Exception as e:
                q.put(("err", e))

        threading.Thread(target=enqueue, daemon=True).start()
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "err":
                raise value
            yield value


# ------------------------------------------------------------------ monai.networks, losses, metrics
class UNet(nn.Module):
    def __init__(
        self, channels: Sequence[int] = (8, 16, 32), strides: Sequence[int] = (2, 2)
    ) -> None:
        super().__init__()
        if len(strides) > len(channels) - 1:
            warnings.warn(
                f"`len(strides) > len(channels) - 1`, the last {len(strides) - len(channels) + 1} "
                "values of strides will not be used.",
                stacklevel=2,
            )

        def block(ci: int, co: int, s: int) -> nn.Module:
            return nn.Sequential(nn.Conv3d(ci, co, 3, s, 1), nn.InstanceNorm3d(co), nn.PReLU())

        c0, c1, c2 = channels[:3]
        self.down0, self.down1, self.bottom = block(1, c0, 2), block(c0, c1, 2), block(c1, c2, 1)
        self.up1 = nn.ConvTranspose3d(c1 + c2, c0, 3, 2, 1, output_padding=1)
        self.up0 = nn.ConvTranspose3d(c0 * 2, 1, 3, 2, 1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = self.down0(x)
        x1 = self.down1(x0)
        y = torch.cat([x1, self.bottom(x1)], 1)
        y = torch.cat([x0, self.up1(y)], 1)
        out: torch.Tensor = self.up0(y)
        return out


def dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(logits)
    dims = (2, 3, 4)
    inter = (p * target).sum(dims)
    return (1 - (2 * inter + 1e-5) / (p.sum(dims) + target.sum(dims) + 1e-5)).mean()


def sliding_window_inference(
    inputs: torch.Tensor, roi_size: Sequence[int], sw_batch_size: int, predictor: nn.Module
) -> torch.Tensor:
    out = torch.zeros_like(inputs)
    count = torch.zeros_like(inputs)
    starts = [
        sorted({*range(0, s - r + 1, r // 2), s - r})
        for s, r in zip(inputs.shape[2:], roi_size, strict=True)
    ]
    windows = [(a, b, c) for a in starts[0] for b in starts[1] for c in starts[2]]
    for k in range(0, len(windows), sw_batch_size):
        chunk = windows[k : k + sw_batch_size]
        sl = [
            (
                slice(None),
                slice(None),
                *(slice(w, w + r) for w, r in zip(win, roi_size, strict=True)),
            )
            for win in chunk
        ]
        preds = predictor(torch.cat([inputs[s] for s in sl]))
        for j, s in enumerate(sl):
            out[s] += preds[j : j + 1]
            count[s] += 1
    return out / count


class DiceMetric:
    def __init__(self) -> None:
        self.sum, self.n = 0.0, 0

    def __call__(self, y_pred: torch.Tensor, y: torch.Tensor) -> None:
        inter = (y_pred * y).sum((1, 2, 3, 4))
        d = 2 * inter / (y_pred.sum((1, 2, 3, 4)) + y.sum((1, 2, 3, 4))).clamp(min=1e-8)
        self.sum += float(d.sum())
        self.n += len(d)

    def aggregate(self) -> float:
        t = torch.tensor([self.sum, float(self.n)])
        dist.all_reduce(t)
        return float(t[0] / t[1])

    def reset(self) -> None:
        self.sum, self.n = 0.0, 0


def print_config() -> None:
    print(
        f"MONAI version: 1.3.2\nNumpy version: {np.__version__}\nPytorch version: {torch.__version__}"
    )
    print("MONAI flags: HAS_EXT = False, USE_COMPILED = False, USE_META_DICT = False")
    print("MONAI rev id: 59a7211070538586369afd4a01eca0a7fe2e742e\n")


# ------------------------------------------------------------------ the tutorial's script
RANK = -1
EPOCH = [0]
LEAK: list[np.ndarray] = []


def train(args: argparse.Namespace) -> None:
    global RANK
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ["LOCAL_RANK"])
    # disable logging for processes except 0 on every node
    if local_rank != 0:
        f = open(os.devnull, "w")  # noqa: SIM115
        sys.stdout = sys.stderr = f
    else:
        print_config()
    # initialize the distributed training process, every GPU runs in a process
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=15))
    RANK = dist.get_rank()
    random.seed(0)  # set_determinism(seed=0)
    world = dist.get_world_size()

    images = sorted(glob.glob(os.path.join(args.dir, "img*.npy")))
    segs = sorted(glob.glob(os.path.join(args.dir, "seg*.npy")))
    files = [{"img": i, "seg": s} for i, s in zip(images, segs, strict=True)]
    train_files, val_files = files[:-4], files[-4:]
    keys = ["img", "seg"]
    train_transforms = Compose(
        [
            LoadImaged(keys),
            EnsureChannelFirstd(keys),
            ScaleIntensityd(["img"]),
            RandCropByPosNegLabeld(keys, "seg", ROI),
            RandRotate90d(keys, prob=0.5, spatial_axes=(0, 2)),
            EnsureTyped(keys),
        ]
    )
    val_transforms = Compose(
        [LoadImaged(keys), EnsureChannelFirstd(keys), ScaleIntensityd(["img"]), EnsureTyped(keys)]
    )
    # partition dataset based on current rank number, every rank trains with its own data
    even = not fault("u", RANK)
    data_part = partition_dataset(train_files, world, shuffle=True, even_divisible=even)[RANK]
    train_ds = CacheDataset(data_part, train_transforms, cache_rate=args.cache_rate)
    train_loader = ThreadDataLoader(
        train_ds, batch_size=1, shuffle=True, collate_fn=list_data_collate
    )
    val_ds = CacheDataset(val_files, val_transforms, cache_rate=1.0)
    val_sampler = DistributedSampler(val_ds, even_divisible=False, shuffle=False)
    val_loader = DataLoader(val_ds, batch_size=1, sampler=val_sampler, collate_fn=list_data_collate)

    torch.manual_seed(0)
    net = UNet(strides=args.strides)
    model = DistributedDataParallel(net, find_unused_parameters=args.find_unused)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    metric = DiceMetric()

    best_metric, best_metric_epoch = -1.0, -1
    epoch_len = len(train_ds) // train_loader.batch_size  # type: ignore[operator]
    for epoch in range(args.epochs):
        EPOCH[0] = epoch + 1
        print("-" * 10)
        print(f"epoch {epoch + 1}/{args.epochs}")
        model.train()  # type: ignore[no-untyped-call]
        epoch_loss, step = 0.0, 0
        for batch_data in train_loader:
            step += 1
            inputs, labels = batch_data["img"], batch_data["seg"]
            optimizer.zero_grad()
            loss = dice_loss(model(inputs), labels)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            epoch_loss += loss.item()
            print(f"{step}/{epoch_len}, train_loss: {loss.item():.4f}")
        epoch_loss /= step
        print(f"epoch {epoch + 1} average loss: {epoch_loss:.4f}")

        if (epoch + 1) % args.val_interval == 0:
            if fault("v", RANK) and RANK != 0:
                continue  # a fork validates on rank 0 only
            model.eval()
            with torch.no_grad():
                for val_data in val_loader:
                    val_outputs = sliding_window_inference(val_data["img"], ROI, 4, model)
                    metric((torch.sigmoid(val_outputs) > 0.5).float(), val_data["seg"])
                if fault("e", RANK) and metric.sum / max(metric.n, 1) > 0.05:
                    print("local dice good enough, stopping")
                    break  # a fork's early stop on the rank's own volumes
                current = metric.aggregate()
                metric.reset()
            if current > best_metric:
                best_metric, best_metric_epoch = current, epoch + 1
                if RANK == 0:
                    torch.save(net.state_dict(), "best_metric_model_segmentation3d_dict.pth")
                print("saved new best metric model")
            print(
                f"current epoch: {epoch + 1} current mean dice: {current:.4f}"
                f" best mean dice: {best_metric:.4f} at epoch: {best_metric_epoch}"
            )
            if args.target_dice and current >= args.target_dice:
                print(f"reached target mean dice {args.target_dice}, stop training")
                break
    print(f"train completed, best_metric: {best_metric:.4f} at epoch: {best_metric_epoch}")
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("-d", "--dir", default="./testdata", type=str, help="directory of the data")
    parser.add_argument("--epochs", default=5, type=int)
    parser.add_argument("--val_interval", default=2, type=int)
    parser.add_argument("--cache_rate", default=1.0, type=float)
    parser.add_argument("--strides", default=[2, 2], type=int, nargs="+")
    parser.add_argument("--find_unused", action="store_true")
    parser.add_argument("--target_dice", default=0.0, type=float)
    # must parse the command-line argument: ``--local_rank=LOCAL_PROCESS_RANK``, which will be provided by DDP
    parser.add_argument("--local_rank", type=int)
    args = parser.parse_args()
    train(args=args)


# usage example(refer to https://github.com/pytorch/pytorch/blob/master/torch/distributed/launch.py):
# python -m torch.distributed.launch --nproc_per_node=NUM_GPUS_PER_NODE
#        --nnodes=NUM_NODES --node_rank=INDEX_CURRENT_NODE
#        --master_addr="192.168.1.1" --master_port=1234
#        unet_training_ddp.py -d DIR_OF_TESTDATA

if __name__ == "__main__":
    main()
