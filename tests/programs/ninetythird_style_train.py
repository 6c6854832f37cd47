"""A ninety-third training-program style for the generalisation fixtures
(tests/fixtures/real/ninetythird-*): 3-D medical image segmentation in the way of MONAI's
distributed tutorials (brats_training_ddp.py, unet_training_ddp.py), re-implemented in plain
torch (monai is not installed). Synthetic 3-D volumes and their labels
(data/imagesTr/case_NNN.npy, data/labelsTr/case_NNN.npy) and a Decathlon-style datalist
(data/dataset.json with 'training' and 'validation' lists whose paths are relative to the
datalist's folder) are written by `train.py --prepare`. Every rank takes its part of the
datalist the way monai.data.partition_dataset does (shuffled and even_divisible=True for
training, in order and even_divisible=False for validation) and caches a cache_rate fraction of
it at start, loaded and preprocessed, behind a tqdm bar ('Loading dataset: 100%|...| 6/6'),
as CacheDataset does; random 32^3 crops and flips are applied by the DataLoader's worker. A tiny
3-D UNet (instance norm, PReLU) in DistributedDataParallel, DiceLoss(to_onehot_y=True,
softmax=True), Adam; validation every --val-interval epochs with sliding-window inference (32^3
windows, overlap 0.25) and a foreground Dice per case all-reduced across ranks (or, with
--val-rank0-only, validation of the whole list on rank 0 only, as some tutorials do); rank 0
saves best_metric_model.pth and prints the tutorials' lines ('epoch 2/5', '1/3, train_loss:
0.6712, step time: 0.1203', 'current epoch: 3 current mean dice: 0.4123 best mean dice: 0.4123
at epoch: 3', 'train completed, best_metric: ...'). --patience stops once the mean dice has
not improved for that many validations (an early stop every rank agrees on, the metric being
all-reduced). gloo on CPU, 15 s collective timeout. Launched with `torchrun --nproc_per_node N
--master_port PORT train.py ...`. A fault in the code is chosen by the TQ_CASE environment
variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import queue
import signal
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate
from tqdm import tqdm

ROI = (32, 32, 32)


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ----------------------------------------------------------------------------- data
def prepare(data_dir: str, num_train: int, num_val: int, size: int = 48, seed: int = 0) -> None:
    """Synthetic 'scans': a bright ellipsoid (the foreground, label 1) in a noisy background."""
    rs = np.random.RandomState(seed)
    os.makedirs(os.path.join(data_dir, "imagesTr"), exist_ok=True)
    os.makedirs(os.path.join(data_dir, "labelsTr"), exist_ok=True)
    grid = np.stack(np.meshgrid(*[np.arange(size)] * 3, indexing="ij")).astype(np.float32)
    items = []
    for i in range(num_train + num_val):
        centre = rs.uniform(15, size - 15, 3).reshape(3, 1, 1, 1)
        radii = rs.uniform(7, 13, 3).reshape(3, 1, 1, 1)
        label = (((grid - centre) / radii) ** 2).sum(0) <= 1.0
        image = 200.0 * label + rs.normal(100.0, 40.0, (size,) * 3)
        name = f"case_{i:03d}.npy"
        np.save(os.path.join(data_dir, "imagesTr", name), image.astype(np.float32))
        np.save(os.path.join(data_dir, "labelsTr", name), label.astype(np.uint8))
        items.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    datalist = {
        "name": "SynthTumour",
        "tensorImageSize": "3D",
        "labels": {"0": "background", "1": "tumour"},
        "numTraining": num_train,
        "training": items[:num_train],
        "validation": items[num_train:],
    }
    with open(os.path.join(data_dir, "dataset.json"), "w") as f:
        json.dump(datalist, f, indent=2)


def load_decathlon_datalist(path: str, key: str) -> list[dict[str, str]]:
    """As monai.data.load_decathlon_datalist: paths relative to the datalist's folder."""
    with open(path) as f:
        items = json.load(f)[key]
    base = os.path.dirname(path)
    return [{k: os.path.normpath(os.path.join(base, v)) for k, v in d.items()} for d in items]


def partition_dataset(data, num_partitions, shuffle=False, seed=0, even_divisible=False):
    """As monai.data.partition_dataset (drop_last=False)."""
    indices = list(range(len(data)))
    if shuffle:
        np.random.RandomState(seed).shuffle(indices)
    if even_divisible and len(indices) % num_partitions:
        indices += indices[: num_partitions - len(indices) % num_partitions]
    return [[data[j] for j in indices[i::num_partitions]] for i in range(num_partitions)]


def load_and_preprocess(item: dict[str, str], slow: bool) -> dict[str, torch.Tensor]:
    """LoadImaged + EnsureChannelFirstd + NormalizeIntensityd(nonzero=True)."""
    if slow:
        time.sleep(4.0)
    image = np.load(item["image"])
    label = np.load(item["label"])
    image = torch.as_tensor(image)[None]
    mask = image > 0
    image = torch.where(mask, (image - image[mask].mean()) / image[mask].std(), image)
    return {"image": image, "label": torch.as_tensor(label.astype(np.int64))[None]}


class CacheDataset(Dataset):
    """The cache_rate fraction of the items loaded and preprocessed once, the rest on access."""

    def __init__(self, data, transform=None, cache_rate=1.0, slow=False):
        self.data = data
        self.transform = transform
        self.slow = slow
        n = min(int(len(data) * cache_rate), len(data))
        self.cache = [
            load_and_preprocess(item, slow)
            for item in tqdm(data[:n], total=n, desc="Loading dataset")
        ]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        if index < len(self.cache):
            item = dict(self.cache[index])
        else:
            item = load_and_preprocess(self.data[index], self.slow)
        return self.transform(item) if self.transform else item


def random_crop_flip(item: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """RandSpatialCropd(roi_size=ROI, random_size=False) + RandFlipd(prob=0.5, spatial_axis=0)."""
    shape = item["image"].shape[1:]
    start = [int(np.random.randint(0, max(s - r, 0) + 1)) for s, r in zip(shape, ROI, strict=True)]
    sl = (slice(None), *(slice(b, b + r) for b, r in zip(start, ROI, strict=True)))
    out = {k: v[sl] for k, v in item.items()}
    if np.random.rand() < 0.5:
        out = {k: v.flip(1) for k, v in out.items()}
    return out


def list_data_collate(batch):
    """As monai.data.list_data_collate: torch's collate with MONAI's hint on a shape error."""
    try:
        return default_collate(batch)
    except RuntimeError as re:
        re_str = str(re)
        if "equal size" in re_str:
            re_str += (
                "\n\nMONAI hint: if your transforms intentionally create images of different "
                "shapes, creating your `DataLoader` with `collate_fn=pad_list_data_collate` "
                "might solve this problem (check its documentation)."
            )
        raise RuntimeError(re_str) from re


# ----------------------------------------------------------------------------- model
def block(cin: int, cout: int, stride: int = 1, up: bool = False) -> nn.Sequential:
    conv = (
        nn.ConvTranspose3d(cin, cout, 3, stride=stride, padding=1, output_padding=stride - 1)
        if up
        else nn.Conv3d(cin, cout, 3, stride=stride, padding=1)
    )
    return nn.Sequential(conv, nn.InstanceNorm3d(cout), nn.PReLU())


class UNet(nn.Module):
    """monai.networks.nets.UNet(spatial_dims=3, channels=(8, 16, 32), strides=(2, 2)), small."""

    def __init__(self, in_channels: int = 1, out_channels: int = 2) -> None:
        super().__init__()
        self.down1 = block(in_channels, 8, 2)
        self.down2 = block(8, 16, 2)
        self.bottom = block(16, 32)
        self.up2 = block(48, 8, 2, up=True)
        self.up1 = nn.ConvTranspose3d(16, out_channels, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(d1)
        u2 = self.up2(torch.cat([self.bottom(d2), d2], 1))
        return self.up1(torch.cat([u2, d1], 1))


def one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """As monai.networks.utils.one_hot: labels [B, 1, ...] to [B, C, ...] with scatter_."""
    shape = list(labels.shape)
    shape[1] = num_classes
    return torch.zeros(shape, dtype=torch.float32).scatter_(1, labels.long(), 1.0)


class DiceLoss(nn.Module):
    """monai.losses.DiceLoss(to_onehot_y=True, softmax=True)."""

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits, 1)
        target = one_hot(target, logits.shape[1])
        dims = tuple(range(2, logits.ndim))
        inter = (probs * target).sum(dims)
        denom = probs.sum(dims) + target.sum(dims)
        return (1.0 - (2.0 * inter + 1e-5) / (denom + 1e-5)).mean()


def dice_metric(pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """DiceMetric(include_background=False) per case of argmax one-hot predictions: [B, C-1]."""
    p = one_hot(pred.argmax(1, keepdim=True), pred.shape[1])[:, 1:]
    y = one_hot(label, pred.shape[1])[:, 1:]
    dims = tuple(range(2, p.ndim))
    inter = (p * y).sum(dims)
    return 2.0 * inter / (p.sum(dims) + y.sum(dims)).clamp(min=1e-8)


def sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, overlap=0.25, hook=None):
    """monai.inferers.sliding_window_inference, mode='constant'."""
    shape = inputs.shape[2:]
    starts = []
    for s, r in zip(shape, roi_size, strict=True):
        step = max(int(r * (1 - overlap)), 1)
        pos = list(range(0, max(s - r, 0) + 1, step))
        if pos[-1] != max(s - r, 0):
            pos.append(max(s - r, 0))
        starts.append(pos)
    windows = [(a, b, c) for a in starts[0] for b in starts[1] for c in starts[2]]
    out = torch.zeros(inputs.shape[0], 2, *shape)
    count = torch.zeros(1, 1, *shape)
    for k in range(0, len(windows), sw_batch_size):
        chunk = windows[k : k + sw_batch_size]
        sls = [tuple(slice(b, b + r) for b, r in zip(w, roi_size, strict=True)) for w in chunk]
        batch = torch.cat([inputs[(slice(None), slice(None), *sl)] for sl in sls])
        preds = predictor(batch)
        if hook is not None:
            hook(k // sw_batch_size)
        for j, sl in enumerate(sls):
            out[(slice(None), slice(None), *sl)] += preds[j : j + 1]
            count[(slice(None), slice(None), *sl)] += 1
    return out / count


# ----------------------------------------------------------------------------- train
def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="3-D segmentation with DDP, the MONAI tutorial way")
    p.add_argument("--prepare", action="store_true", help="write the synthetic data and exit")
    p.add_argument("--num-train", type=int, default=12)
    p.add_argument("--num-val", type=int, default=6)
    p.add_argument("-d", "--dir", default="data", help="data folder (--prepare)")
    p.add_argument("--datalist", default="data/dataset.json")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--cache-rate", type=float, default=1.0)
    p.add_argument("--val-interval", type=int, default=1)
    p.add_argument("--val-rank0-only", action="store_true", help="validate on rank 0 only")
    p.add_argument("--patience", type=int, default=0, help="early stop after N bad validations")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--output-dir", default=".")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def evaluate(model, loader, world, letter, who, rank, epoch):
    model.eval()
    metric_sum, metric_count = 0.0, 0
    hoard = []

    def hook(window_batch: int) -> None:
        if letter == "m" and rank == who and epoch == 2:
            hoard.append(torch.ones(16 << 20))  # every window kept at full size: 64 MiB a step
            if len(hoard) >= 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if letter == "n" and rank == who and epoch == 2 and window_batch == 1:
            ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"stitch"), 6)  # native stitch

    with torch.no_grad():
        for case, val_data in enumerate(loader):
            val_inputs, val_labels = val_data["image"], val_data["label"]
            val_outputs = sliding_window_inference(val_inputs, ROI, 4, model, hook=hook)
            dice = dice_metric(val_outputs, val_labels)
            if letter == "w" and rank == who and epoch == 2 and case == 1:
                # the per-case result written by an async saver thread that was never started
                queue.Queue().get()
            dist.all_reduce(dice)
            dice /= world
            metric_sum += dice.sum().item()
            metric_count += dice.numel()
    model.train()
    return metric_sum / max(metric_count, 1)


def main() -> None:
    args = parse()
    if args.prepare:
        prepare(args.dir, args.num_train, args.num_val)
        return

    letter, who = fault()
    dist.init_process_group(
        backend="gloo", init_method="env://", timeout=datetime.timedelta(seconds=15)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed + rank)

    train_files = load_decathlon_datalist(args.datalist, "training")
    val_files = load_decathlon_datalist(args.datalist, "validation")
    train_part = partition_dataset(
        train_files, world, shuffle=True, seed=args.seed, even_divisible=True
    )[rank]
    if args.val_rank0_only:
        val_part = val_files
    else:
        val_part = partition_dataset(val_files, world, shuffle=False, even_divisible=False)[rank]

    slow = letter == "s" and rank == who
    train_ds = CacheDataset(train_part, random_crop_flip, cache_rate=args.cache_rate, slow=slow)
    train_loader = DataLoader(
        train_ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        collate_fn=list_data_collate,
    )
    val_loader = None
    if rank == 0 or not args.val_rank0_only:
        val_ds = CacheDataset(val_part, cache_rate=1.0)
        val_loader = DataLoader(val_ds, batch_size=1, num_workers=0)

    model = DistributedDataParallel(UNet(in_channels=1, out_channels=2))
    loss_function = DiceLoss()
    optimizer = torch.optim.Adam(model.parameters(), args.lr)
    scaler = torch.cuda.amp.GradScaler() if args.amp else None

    best_metric, best_metric_epoch, bad = -1.0, -1, 0
    total_start = time.time()
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.time()
        if rank == 0:
            print("-" * 10)
            print(f"epoch {epoch}/{args.epochs}")
        model.train()
        epoch_loss, step, epoch_len = 0.0, 0, len(train_loader)
        step_start = time.time()
        for batch_data in train_loader:
            step += 1
            inputs, labels = batch_data["image"], batch_data["label"]
            optimizer.zero_grad()
            if scaler is not None:
                with torch.cuda.amp.autocast():
                    loss = loss_function(model(inputs), labels)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss = loss_function(model(inputs), labels)
                loss.backward()
                optimizer.step()
            epoch_loss += loss.item()
            if rank == 0:
                print(
                    f"{step}/{epoch_len}, train_loss: {loss.item():.4f}, "
                    f"step time: {(time.time() - step_start):.4f}"
                )
            step_start = time.time()
        epoch_loss /= max(step, 1)
        if rank == 0:
            print(f"epoch {epoch} average loss: {epoch_loss:.4f}")

        stop = False
        if epoch % args.val_interval == 0:
            metric = -1.0
            if val_loader is not None:
                metric = evaluate(model, val_loader, world, letter, who, rank, epoch)
            if metric > best_metric:
                best_metric, best_metric_epoch, bad = metric, epoch, 0
                if rank == 0:
                    torch.save(
                        model.module.state_dict(),
                        os.path.join(args.output_dir, "best_metric_model.pth"),
                    )
                    print("saved new best metric model")
            else:
                bad += 1
            if rank == 0:
                print(
                    f"current epoch: {epoch} current mean dice: {metric:.4f}"
                    f" best mean dice: {best_metric:.4f} at epoch: {best_metric_epoch}"
                )
            if args.patience and bad >= args.patience:
                if rank == 0:
                    print(
                        f"early stopping: no improvement of mean dice for {bad} validations, "
                        f"best {best_metric:.4f} at epoch: {best_metric_epoch}"
                    )
                stop = True
        if rank == 0:
            print(f"time consuming of epoch {epoch} is: {(time.time() - epoch_start):.4f}")
        if stop:
            break

    if rank == 0:
        print(
            f"train completed, best_metric: {best_metric:.4f} at epoch: {best_metric_epoch}, "
            f"total time: {(time.time() - total_start):.4f}."
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
