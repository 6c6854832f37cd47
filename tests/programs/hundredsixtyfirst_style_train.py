"""A hundred-and-sixty-first training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyfirst-*): a remote-sensing segmentation trainer in the style of
torchgeo's scripts without Lightning, run as a Grid Engine batch job. Each job's folder links this
file as train.py; its job script (job.sh) runs `torchrun --standalone --nproc_per_node $NSLOTS
train.py --data-root chips ...` on the `smp` parallel environment, or, on the `mpi` one, reads
$PE_HOSTFILE and starts one torchrun agent per granted host (the first in the background, the
others with `qrsh -inherit`) with --rdzv-endpoint on the first host.

As such scripts do: the argparse Namespace printed by every process before anything else; plain
`logging` ('%(asctime)s [%(levelname)s] %(name)s: %(message)s', INFO on rank 0, WARNING on the
others); init_process_group(env://, gloo here, a 15 s timeout); the chips (4-band 32x32 .npy
tiles and their masks) listed in chips/index.csv (chip_id, scene, split, image, mask, transform)
and normalised with the band statistics in chips/stats.json (computed by rank 0 while the
others wait in a barrier when that file is missing); a DistributedSampler over the training chips
(or, with --shard scene, whole scenes dealt to the ranks in turn); a tqdm bar on rank 0 only
('Epoch 3: 100%|██████████| 6/6 [00:01<00:00, 4.11it/s, loss=0.512]'); a small U-Net in DDP,
cross-entropy, AdamW; the validation confusion matrix all-reduced into a mean IoU; per epoch
'epoch 3/10 train_loss=0.4312 val_mIoU=0.5521 (41.2s)' and 'saved checkpoint to
ckpt/epoch_003.pt'; with --patience an early stop when val_mIoU stops improving; on SIGUSR2 (Grid
Engine's -notify warning before a SIGKILL, forwarded by torchrun's --signals-to-handle) the ranks
agree to stop at the next step and rank 0 saves ckpt/last.pt; every uncaught error logged with
its traceback ('training failed on rank 1') and raised again.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredsixtyfirst.sh after any edit).
`python train.py --generate DIR N` writes the synthetic chips.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

CASE = os.environ.get("MT_CASE", "")
BANDS, SIZE, CLASSES = 4, 64, 3
log = logging.getLogger("segtrain")
data_log = logging.getLogger("segtrain.data")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


RANK = -1
EPOCH = [0]
KEEP: list[np.ndarray] = []


# ------------------------------------------------------------------ tqdm (rank 0 only)
class tqdm:  # as the library spells it
    """tqdm's default bar on stderr, redrawn with a carriage return after each item."""

    def __init__(self, items: Iterable[Any], desc: str, total: int, disable: bool) -> None:
        self.items, self.desc, self.total, self.disable = items, desc, total, disable
        self.postfix = ""

    def set_postfix(self, **kw: str) -> None:
        self.postfix = ", " + ", ".join(f"{k}={v}" for k, v in kw.items())

    def _bar(self, n: int, t0: float) -> str:
        el = time.time() - t0
        rate = n / el if el > 0 and n else 0.0
        left = (self.total - n) / rate if rate else 0.0
        filled = math.floor(10 * n / self.total) if self.total else 10
        pct = int(100 * n / self.total) if self.total else 100
        rate_s = f"{rate:.2f}it/s" if rate else "?it/s"
        return (
            f"\r{self.desc}: {pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{self.total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d},"
            f" {rate_s}{self.postfix}]"
        )

    def __iter__(self) -> Iterator[Any]:
        if self.disable:
            yield from self.items
            return
        t0 = time.time()
        sys.stderr.write(self._bar(0, t0))
        sys.stderr.flush()
        for n, item in enumerate(self.items, 1):
            yield item
            sys.stderr.write(self._bar(n, t0))
            sys.stderr.flush()
        sys.stderr.write("\n")
        sys.stderr.flush()


# ------------------------------------------------------------------ the chips
def generate(folder: str, n: int) -> None:
    """n chips of 4 bands over 3 classes (water, field, built-up), 8 chips a scene (5 in every
    third: the cloudy chips dropped), the last quarter of the scenes for validation."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    scenes = [s for s in range(n) for _ in range(5 if s % 4 == 3 else 8)][:n]
    rows = []
    for i, scene in enumerate(scenes):
        mask = np.zeros((SIZE, SIZE), dtype=np.uint8)
        for cls in (1, 2):
            for _ in range(2):
                y, x = rng.integers(0, SIZE - 20, 2)
                h, w = rng.integers(10, 28, 2)
                mask[y : y + h, x : x + w] = cls
        means = np.array([[0.1, 0.3, 0.2, 0.05], [0.2, 0.4, 0.3, 0.6], [0.5, 0.5, 0.5, 0.3]])
        img = means[mask].transpose(2, 0, 1) + rng.normal(0, 0.9, (BANDS, SIZE, SIZE))
        img = (img * 10000).astype(np.float32)  # reflectance scaled as Sentinel-2 L2A
        np.save(os.path.join(folder, f"img_{i:04d}.npy"), img)
        np.save(os.path.join(folder, f"mask_{i:04d}.npy"), mask)
        k = i - scenes.index(scene)
        x0, y0 = 399960 + 320 * k, 5800020 - 320 * scene
        rows.append(
            {
                "chip_id": f"T32UPU_{scene:03d}_{k}",
                "scene": f"S2B_MSIL2A_2021{scene:04d}",
                "split": "val" if scene >= 3 * (scenes[-1] + 1) // 4 else "train",
                "image": f"img_{i:04d}.npy",
                "mask": f"mask_{i:04d}.npy",
                "transform": f"10.0,0.0,{x0}.0,0.0,-10.0,{y0}.0",
            }
        )
    with open(os.path.join(folder, "index.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    stats = band_stats(folder, [r["image"] for r in rows if r["split"] == "train"])
    with open(os.path.join(folder, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)


def band_stats(folder: str, images: list[str]) -> dict[str, list[float]]:
    s = np.zeros(BANDS)
    sq = np.zeros(BANDS)
    count = 0
    for name in images:
        if fault("s", RANK):  # the chips sit on a slow NFS mount
            time.sleep(0.5)
        a = np.load(os.path.join(folder, name)).astype(np.float64)
        s += a.sum((1, 2))
        sq += (a * a).sum((1, 2))
        count += a.shape[1] * a.shape[2]
    mean = s / count
    return {"mean": mean.round(3).tolist(), "std": np.sqrt(sq / count - mean**2).round(3).tolist()}


class NotGeoreferencedWarning(UserWarning):
    """rasterio.errors.NotGeoreferencedWarning."""


class ChipDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, root: str, split: str, stats: dict[str, list[float]], mmap: bool) -> None:
        self.root, self.mmap = root, mmap
        with open(os.path.join(root, "index.csv"), newline="") as f:
            self.rows = [r for r in csv.DictReader(f) if r["split"] == split]
        self.mean = torch.tensor(stats["mean"]).view(BANDS, 1, 1)
        self.std = torch.tensor(stats["std"]).view(BANDS, 1, 1)
        self.augment = split == "train"

    def __len__(self) -> int:
        return len(self.rows)

    def _read(self, name: str) -> np.ndarray:
        path = os.path.join(self.root, name)
        if fault("z", RANK) and EPOCH[0] >= 2 and "img_" in name:
            ctypes.string_at(0)  # the compiled tile decoder reads a freed buffer
        return np.load(path, mmap_mode="r" if self.mmap else None)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[i]
        if not row["transform"]:
            warnings.warn(
                "Dataset has no geotransform, gcps, or rpcs. The identity matrix will be returned.",
                NotGeoreferencedWarning,
                stacklevel=2,
            )
        img = torch.from_numpy(self._read(row["image"])).float()
        mask = torch.from_numpy(np.asarray(self._read(row["mask"]), dtype=np.int64))
        img = (img - self.mean) / self.std
        if self.augment:
            if random.random() < 0.5:
                img, mask = img.flip(-1), mask.flip(-1)
            if random.random() < 0.5:
                img, mask = img.flip(-2), mask.flip(-2)
            if fault("x", RANK) and EPOCH[0] >= 2:
                # a fork's band dropout: one band zeroed, drawn from 0..BANDS inclusive
                img[random.randint(1, BANDS) if random.random() < 0.3 else 0] = 0
        return img, mask


class SceneSampler(Sampler[int]):
    """Whole scenes dealt to the ranks in turn (no chip of a scene seen by two ranks)."""

    def __init__(self, ds: ChipDataset, rank: int, world: int) -> None:
        scenes = sorted({r["scene"] for r in ds.rows})
        mine = set(scenes[rank::world])
        self.idx = [i for i, r in enumerate(ds.rows) if r["scene"] in mine]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        idx = list(self.idx)
        random.Random(self.epoch).shuffle(idx)
        return iter(idx)

    def __len__(self) -> int:
        return len(self.idx)


class Prefetcher:
    """Batches read ahead in a background thread (the script's own, for NFS-backed chips)."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        slots: list[Any] = []
        ready = threading.Condition(self.lock)
        done = [False]

        error: list[BaseException] = []

        def fill() -> None:
            try:
                for b in self.loader:
                    with ready:
                        slots.append(b)
                        ready.notify()
            except Exception as e:
                error.append(e)
            with ready:
                done[0] = True
                ready.notify()

        threading.Thread(target=fill, daemon=True).start()
        while True:
            with ready:
                while not slots and not done[0]:
                    ready.wait()
                if slots:
                    b = slots.pop(0)
                elif error:
                    raise error[0]
                else:
                    return
            yield b


# ------------------------------------------------------------------ the model
def block(ci: int, co: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1), nn.BatchNorm2d(co), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, in_channels: int, classes: int, width: int = 24) -> None:
        super().__init__()
        self.enc1, self.enc2 = block(in_channels, width), block(width, 2 * width)
        self.mid = block(2 * width, 2 * width)
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec = block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        m = self.mid(self.enc2(F.max_pool2d(e1, 2)))
        out: torch.Tensor = self.head(self.dec(torch.cat([e1, self.up(m)], 1)))
        return out


def confusion(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.bincount(target.flatten() * CLASSES + pred.flatten(), minlength=CLASSES**2).view(
        CLASSES, CLASSES
    )


def miou(cm: torch.Tensor) -> tuple[float, list[float]]:
    cm = cm.double()
    inter = cm.diag()
    union = cm.sum(0) + cm.sum(1) - inter
    iou = (inter / union.clamp(min=1)).tolist()
    return float(np.mean(iou)), iou


# ------------------------------------------------------------------ the script
STOP = [False]


def on_usr2(signum: int, frame: Any) -> None:
    STOP[0] = True
    log.warning("caught SIGUSR2 (job will be killed soon), stopping after this step")


def train(args: argparse.Namespace) -> None:
    global RANK
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))
    RANK, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(
        level=logging.INFO if RANK == 0 else logging.WARNING,
        format="%(asctime)s [%(levelname)s] %(name)s: %(message)s",
    )
    signal.signal(signal.SIGUSR2, on_usr2)
    log.info("world size %d, rank %d on %s", world, RANK, os.uname().nodename)
    random.seed(args.seed + RANK)
    torch.manual_seed(args.seed)

    stats_path = os.path.join(args.data_root, "stats.json")
    if not os.path.exists(stats_path):
        if RANK == 0:
            with open(os.path.join(args.data_root, "index.csv"), newline="") as f:
                images = [r["image"] for r in csv.DictReader(f) if r["split"] == "train"]
            log.info("no %s, computing band statistics over %d chips", stats_path, len(images))
            with open(stats_path, "w") as f:
                json.dump(band_stats(args.data_root, images), f)
        dist.barrier()
    with open(stats_path) as f:
        stats = json.load(f)
    log.info("band mean %s std %s", stats["mean"], stats["std"])

    train_ds = ChipDataset(args.data_root, "train", stats, args.mmap)
    val_ds = ChipDataset(args.data_root, "val", stats, args.mmap)
    sampler: DistributedSampler[int] | SceneSampler
    if args.shard == "scene":
        sampler = SceneSampler(train_ds, RANK, world)
    else:
        sampler = DistributedSampler(train_ds, num_replicas=world, rank=RANK, seed=args.seed)
    val_sampler = DistributedSampler(val_ds, num_replicas=world, rank=RANK, shuffle=False)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    val_dl = DataLoader(val_ds, batch_size=args.batch_size, sampler=val_sampler)
    log.info(
        "%d training chips, %d validation chips, %d steps per epoch",
        len(train_ds),
        len(val_ds),
        len(train_dl),
    )

    model = DistributedDataParallel(
        UNet(BANDS, CLASSES), find_unused_parameters=args.find_unused_parameters
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    best, best_epoch, stale = -1.0, 0, 0
    for epoch in range(1, args.epochs + 1):
        EPOCH[0] = epoch
        t0 = time.time()
        sampler.set_epoch(epoch)
        model.train()
        total, steps = 0.0, 0
        bar = tqdm(Prefetcher(train_dl), f"Epoch {epoch}", len(train_dl), disable=RANK != 0)
        for x, y in bar:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if fault("k", RANK) and epoch >= 2:  # a fork keeps each batch's activations
                KEEP.append(np.ones(6 << 20, dtype=np.float32))
            total += loss.item()
            steps += 1
            bar.set_postfix(loss=f"{loss.item():.3f}")
            flag = torch.tensor([1.0 if STOP[0] else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                break
        if STOP[0] or flag.item():
            if RANK == 0:
                path = os.path.join(args.ckpt_dir, "last.pt")
                torch.save({"epoch": epoch, "model": model.module.state_dict()}, path)
                log.info("saved checkpoint to %s (epoch %d, step %d)", path, epoch, steps)
            log.warning(
                "stopped at epoch %d step %d on request; resume from ckpt/last.pt", epoch, steps
            )
            break

        model.eval()
        cm = torch.zeros(CLASSES, CLASSES, dtype=torch.int64)
        with torch.no_grad():
            for x, y in val_dl:
                cm += confusion(model(x).argmax(1), y)
        if fault("v", RANK):  # a fork logs per-class IoU over the whole set from rank 0
            per_class = cm.sum(1).double()
            dist.all_reduce(per_class)
            log.info("pixels per class %s", per_class.tolist())
        dist.all_reduce(cm)
        val_miou, per_iou = miou(cm)
        if fault("q", RANK) and epoch >= 2:
            # a fork's early stop on the rank's own shard, before the others agree
            local = miou(cm // world)[0]
            if local < best + 0.5:
                sys.exit(0)
        log.info(
            "epoch %d/%d train_loss=%.4f val_mIoU=%.4f (%.1fs)",
            epoch,
            args.epochs,
            total / max(steps, 1),
            val_miou,
            time.time() - t0,
        )
        log.debug("per-class IoU %s", per_iou)
        if RANK == 0:
            path = os.path.join(args.ckpt_dir, f"epoch_{epoch:03d}.pt")
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, path)
            log.info("saved checkpoint to %s", path)
        if val_miou > best + args.min_delta:
            best, best_epoch, stale = val_miou, epoch, 0
        else:
            stale += 1
            if args.patience and stale >= args.patience:
                log.info(
                    "val_mIoU has not improved for %d epochs (best %.4f at epoch %d), stopping early",
                    stale,
                    best,
                    best_epoch,
                )
                break
    log.info("done: best val_mIoU=%.4f at epoch %d", best, best_epoch)
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description="Train a U-Net on Sentinel-2 chips")
    parser.add_argument("--data-root", default="chips")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", choices=["chip", "scene"], default="chip")
    parser.add_argument("--patience", type=int, default=0)
    parser.add_argument("--min-delta", type=float, default=0.002)
    parser.add_argument("--ckpt-dir", default="ckpt")
    parser.add_argument("--mmap", action="store_true", help="memory-map the chips")
    parser.add_argument("--find-unused-parameters", action="store_true")
    args = parser.parse_args()
    print(args, flush=True)
    try:
        train(args)
    except Exception:
        log.exception("training failed on rank %d", RANK)
        raise


if __name__ == "__main__":
    main()
