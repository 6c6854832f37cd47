# %% [markdown]
# # Leaf tiles: a small CNN on Kaggle's 2x T4, trained from the notebook
#
# A hundred-and-sixtieth training-program style for the generalisation fixtures
# (tests/fixtures/real/hundredsixtieth-*): multi-GPU training from a Kaggle / Colab notebook
# (the "two T4s on Kaggle" set-up), re-created in plain torch (CPU, gloo, a 15 s collective
# timeout) without accelerate installed. This file is the notebook's source in percent format,
# one `# %% <name>` cell after another; tests/programs/hundredsixtieth_notebooks/notebook.py
# builds the three notebooks of the style from it (fork.ipynb, spawn.ipynb, torchrun.ipynb in
# that folder) and runs one with nbclient on a real Jupyter kernel:
#
# - fork.ipynb: the cells as they are; the training function is launched as accelerate's
#   notebook_launcher does it (the `accelerate` cell: torch.multiprocessing.start_processes
#   with start_method="fork", MASTER_ADDR/MASTER_PORT set in the kernel, a child's
#   ProcessRaisedException re-raised in the cell as "RuntimeError: An issue was found when
#   launching the training: ...");
# - spawn.ipynb: a `%%writefile ddp_train.py` cell with the code cells and the `spawn_entry`
#   cell, then `mp.spawn(ddp_train.main, args=(2, cfg), nprocs=2)` in a cell;
# - torchrun.ipynb: a `%%writefile train.py` cell with the code cells and the `script_entry`
#   cell, then `!torchrun --nproc_per_node 2 train.py ...` in a cell (the shell escape).
#
# What the processes print is what such a notebook prints: accelerator.print (the main process
# only), a tqdm bar per epoch on the local main process (tqdm.auto, which falls back to the text
# bar where ipywidgets is missing), Python's warnings from every process, torch's own C++ lines.
#
# A fault in the code is chosen by the MT_CASE environment variable of the kernel (a letter and
# a rank) and never printed; the others are in what a run is given (the launch cell, the data,
# the kernel's limits). Re-capture with tests/fixtures/real/capture_hundredsixtieth.sh after any
# edit.

# %% imports
import argparse
import contextlib
import csv
import ctypes
import glob
import json
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.multiprocessing import start_processes
from torch.multiprocessing.spawn import ProcessRaisedException
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm.auto import tqdm

CASE = os.environ.get("MT_CASE", "")


def fault(letter, rank):
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# %% config
@dataclass
class Config:
    data_dir: str = "../input/leaf-tiles-32"
    epochs: int = 5
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 42
    valid_fold: int = 0
    num_workers: int = 0
    mixed_precision: str = "no"
    target_acc: float = 0.0  # stop once the validation accuracy reaches it (0: never)
    split: str = "sampler"  # "folds": each process trains on its own folds
    normalize: bool = False  # per-channel mean/std from the notebook (STATS)
    use_cache: bool = False  # read the tiles through the notebook's TileCache
    find_unused: bool = False
    tta: int = 2


CFG = Config()
STATS = None  # (mean, std) per channel, set from the notebook


# %% accelerate
# The parts of accelerate 0.2x this notebook uses (the image has no accelerate): its
# notebook_launcher, PrepareForLaunch, patch_environment, and an Accelerator for one CPU each.
@contextlib.contextmanager
def patch_environment(**kwargs):
    for key, value in kwargs.items():
        os.environ[key.upper()] = str(value)
    try:
        yield
    finally:
        for key in kwargs:
            os.environ.pop(key.upper(), None)


class PrepareForLaunch:
    def __init__(self, launcher, distributed_type="NO"):
        self.launcher = launcher
        self.distributed_type = distributed_type

    def __call__(self, index, *args):
        if self.distributed_type == "MULTI_GPU":
            # Prepare the environment for torch.distributed
            os.environ["LOCAL_RANK"] = str(index)
            nproc = int(os.environ.get("NPROC", 1))
            node_rank = int(os.environ.get("NODE_RANK", 0))
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = str(1)
        self.launcher(*args)


def notebook_launcher(
    function, args=(), num_processes=None, mixed_precision="no", use_port="29500"
):
    if num_processes is None:
        raise ValueError("You have to specify the number of GPUs you would like to use.")
    if torch.cuda.is_initialized():
        raise ValueError(
            "To launch a multi-GPU training from your notebook, you need to avoid running any "
            "instruction using `torch.cuda` in any cell. Restart your notebook and make sure no "
            "cells use any CUDA function."
        )
    # torch.distributed will expect a few environment variable to be here. We set the ones
    # common to each process here (the other ones will be set be the launcher).
    with patch_environment(
        world_size=num_processes,
        master_addr="127.0.0.1",
        master_port=use_port,
        mixed_precision=mixed_precision,
    ):
        launcher = PrepareForLaunch(function, distributed_type="MULTI_GPU")
        print(f"Launching training on {num_processes} GPUs.")
        try:
            start_processes(launcher, args=args, nprocs=num_processes, start_method="fork")
        except ProcessRaisedException as e:
            if "Cannot re-initialize CUDA in forked subprocess" in e.args[0]:
                raise RuntimeError(
                    "CUDA has been initialized before the `notebook_launcher` could create a "
                    "forked subprocess. This likely stems from an outside import causing issues "
                    "once the `notebook_launcher()` is called. Please review your imports and "
                    "test them when running the `notebook_launcher()` to identify which one is "
                    "problematic."
                ) from e
            else:
                raise RuntimeError(f"An issue was found when launching the training: {e}") from e


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Accelerator:
    def __init__(self, mixed_precision="no"):
        self.mixed_precision = mixed_precision
        self.num_processes = int(os.environ.get("WORLD_SIZE", 1))
        self.process_index = int(os.environ.get("RANK", 0))
        self.local_process_index = int(os.environ.get("LOCAL_RANK", 0))
        self.device = torch.device("cpu")
        if self.num_processes > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=15))

    @property
    def is_main_process(self):
        return self.process_index == 0

    @property
    def is_local_main_process(self):
        return self.local_process_index == 0

    def print(self, *args, **kwargs):
        if self.is_local_main_process:
            print(*args, **kwargs)

    def prepare(self, *objects, find_unused_parameters=False):
        out = []
        for obj in objects:
            if isinstance(obj, nn.Module) and self.num_processes > 1:
                obj = DistributedDataParallel(obj, find_unused_parameters=find_unused_parameters)
            elif isinstance(obj, DataLoader) and self.num_processes > 1:
                sampler = DistributedSampler(
                    obj.dataset,
                    shuffle=not isinstance(obj.sampler, torch.utils.data.SequentialSampler),
                )
                obj = DataLoader(
                    obj.dataset,
                    batch_size=obj.batch_size,
                    sampler=sampler,
                    num_workers=obj.num_workers,
                    drop_last=obj.drop_last,
                )
            out.append(obj)
        return tuple(out) if len(out) > 1 else out[0]

    def backward(self, loss):
        loss.backward()

    def gather(self, tensor):
        if isinstance(tensor, tuple | list):
            return type(tensor)(self.gather(t) for t in tensor)
        if self.num_processes == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def gather_for_metrics(self, tensor):
        return self.gather(tensor)

    def wait_for_everyone(self):
        if self.num_processes > 1:
            dist.barrier()

    def unwrap_model(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model

    def save(self, obj, f):
        if self.is_main_process:
            torch.save(obj, f)


# %% data
def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def feature_stats(cfg):
    tiles = np.stack(
        [
            np.load(os.path.join(cfg.data_dir, "train_images", f"{r['image_id']}.npy"))
            for r in read_csv(os.path.join(cfg.data_dir, "train.csv"))
        ]
    )
    return tiles.mean(axis=(0, 2, 3)), tiles.std(axis=(0, 2, 3))


class LeafTiles(Dataset):
    def __init__(self, rows, folder, cfg, train=True):
        self.rows, self.folder, self.train = rows, folder, train
        self.read = np.load
        if cfg.use_cache:
            self.read = cache.get
        self.mean, self.std = np.zeros(3, np.float32), np.ones(3, np.float32)
        if cfg.normalize:
            mean, std = STATS
            self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        tile = self.read(os.path.join(self.folder, f"{row['image_id']}.npy"))
        tile = (tile - self.mean[:, None, None]) / self.std[:, None, None]
        if self.train and random.random() < 0.5:
            tile = tile[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(tile)), int(row.get("label", -1))


# %% cache
class TileCache:
    """Decoded tiles kept in memory for every epoch; a background thread fills it while the
    notebook goes on (one decoder, its mutex held while it decodes)."""

    def __init__(self):
        self._libc = ctypes.CDLL(None)
        self._mutex = ctypes.create_string_buffer(64)
        self._libc.pthread_mutex_init(self._mutex, None)
        self._tiles = {}

    def _decode(self, path):
        self._libc.pthread_mutex_lock(self._mutex)
        try:
            tile = np.load(path)
            time.sleep(0.05)  # the decoder's own work
            self._tiles[path] = tile
        finally:
            self._libc.pthread_mutex_unlock(self._mutex)
        return tile

    def get(self, path):
        tile = self._tiles.get(path)
        return tile if tile is not None else self._decode(path)

    def warm(self, paths):
        def fill():
            for p in paths:
                self._decode(p)

        threading.Thread(target=fill, daemon=True).start()


cache = TileCache()
cache.warm(sorted(glob.glob(os.path.join(CFG.data_dir, "train_images", "*.npy"))) * 4)


# %% model
class LeafNet(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


# %% training
def training_function(cfg):
    accelerator = Accelerator(mixed_precision=cfg.mixed_precision)
    rank = accelerator.process_index
    set_seed(cfg.seed)
    rows = read_csv(os.path.join(cfg.data_dir, "train.csv"))
    train_rows = [r for r in rows if int(r["fold"]) != cfg.valid_fold]
    valid_rows = [r for r in rows if int(r["fold"]) == cfg.valid_fold]
    images = os.path.join(cfg.data_dir, "train_images")
    if cfg.split == "folds":  # each process its own folds, as in the single-GPU fold loop
        train_rows = [r for r in train_rows if int(r["fold"]) % accelerator.num_processes == rank]
    train_ds = LeafTiles(train_rows, images, cfg, train=True)
    valid_ds = LeafTiles(valid_rows, images, cfg, train=False)
    train_dl = DataLoader(
        train_ds, batch_size=cfg.batch_size, shuffle=True, num_workers=cfg.num_workers
    )
    valid_dl = DataLoader(valid_ds, batch_size=32, num_workers=cfg.num_workers)

    model = LeafNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    if cfg.split == "folds":
        model, optimizer, valid_dl = accelerator.prepare(
            model, optimizer, valid_dl, find_unused_parameters=cfg.find_unused
        )
    else:
        model, optimizer, train_dl, valid_dl = accelerator.prepare(
            model, optimizer, train_dl, valid_dl, find_unused_parameters=cfg.find_unused
        )
    accelerator.print(json.dumps(asdict(cfg)))
    accelerator.print(
        f"{accelerator.num_processes} processes, {len(train_dl)} steps per epoch, "
        f"{len(valid_ds)} validation tiles"
    )

    best_acc, kept = 0.0, []
    for epoch in range(cfg.epochs):
        model.train()
        if fault("h", rank) and epoch == 1:
            train_dl.dataset.read = cache.get
        total = 0.0
        bar = tqdm(
            train_dl,
            desc=f"Epoch {epoch + 1}/{cfg.epochs}",
            disable=not accelerator.is_local_main_process,
        )
        for step, (x, y) in enumerate(bar):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if fault("k", rank) and epoch == 1:  # every batch's activations kept for a plot
                kept.append(np.ones(16 << 20, dtype=np.float32))
                if len(kept) >= 6:  # the VM's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault("z", rank) and epoch == 1 and step == 3:
                ctypes.string_at(0)  # the image codec's C extension reads a freed buffer

        model.eval()
        correct = count = 0
        for x, y in valid_dl:
            with torch.no_grad():
                logits = model(x)
            preds, refs = accelerator.gather_for_metrics((logits.argmax(-1), y))
            correct += int((preds == refs).sum())
            count += len(refs)
        acc = correct / count
        train_loss = total / (step + 1)
        accelerator.print(
            f"epoch {epoch + 1}: train_loss {train_loss:.4f} valid_acc {acc:.4f}", flush=True
        )
        if fault("j", rank) and accelerator.is_main_process:
            losses = accelerator.gather(torch.tensor([train_loss]))
            print(f"train_loss per process: {losses.tolist()}")
        if fault("o", rank) and epoch >= 1:
            # patience on this process's own validation tiles
            return
        if acc > best_acc:
            best_acc = acc
            accelerator.wait_for_everyone()
            accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pth")
            accelerator.print(f"saved model.pth (valid_acc {acc:.4f})")
        if cfg.target_acc and acc >= cfg.target_acc:
            accelerator.print(f"valid_acc {acc:.4f} >= {cfg.target_acc}, stopping training")
            break

    if accelerator.is_main_process:
        test_rows = read_csv(os.path.join(cfg.data_dir, "test.csv"))
        test_ds = LeafTiles(test_rows, os.path.join(cfg.data_dir, "test_images"), cfg, False)
        net = accelerator.unwrap_model(model)
        with open("submission.csv", "w") as f:
            f.write("image_id,label\n")
            for i in tqdm(range(len(test_ds)), desc="Predicting"):
                x = test_ds[i][0][None]
                with torch.no_grad():
                    p = sum(
                        net(x if t % 2 == 0 else x.flip(-1)).softmax(-1) for t in range(cfg.tta)
                    )
                if fault("s", rank):
                    time.sleep(0.5)  # the whole-slide tiles of the real test set
                f.write(f"{test_rows[i]['image_id']},{int(p.argmax())}\n")
        print("wrote submission.csv")
    accelerator.wait_for_everyone()
    accelerator.print(f"Training finished, best valid_acc {best_acc:.4f}")
    dist.destroy_process_group()


# %% spawn_entry
def main(rank, world_size, cfg):
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    training_function(cfg)


# %% script_entry
def parse_args():
    parser = argparse.ArgumentParser(description="Leaf tiles on every GPU of the machine")
    for name, value in asdict(Config()).items():
        if isinstance(value, bool):
            parser.add_argument(f"--{name}", action="store_true")
        else:
            parser.add_argument(f"--{name}", type=type(value), default=value)
    return Config(**vars(parser.parse_args()))


if __name__ == "__main__":
    training_function(parse_args())

# %% launch
args = (CFG,)
notebook_launcher(training_function, args, num_processes=2)
