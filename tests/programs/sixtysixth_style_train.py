"""A sixty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/sixtysixth-*): a fastai-like image classifier script, as fastai's
distributed docs train one (`with learn.distrib_ctx(): learn.fit_one_cycle(n, lr)`, then
`learn.export()`), launched with `accelerate launch --multi_gpu --num_processes 3 train.py`.
fastai is not installed here: the small layer fastai gives (DataLoaders, Learner, callbacks,
Recorder, the console progress table, SaveModelCallback, EarlyStoppingCallback,
TerminateOnNaNCallback, distrib_ctx, export) is written below in raw torch, printing what fastai
prints: rank 0 alone shows the progress table ('epoch     train_loss  valid_loss  accuracy  time')
and fastprogress's console bars (fastai's distrib_ctx removes ProgressCallback where
rank_distrib() is not 0), while the callbacks' own print()s ("Better model found at epoch 0 with
valid_loss value: ...", "No improvement since epoch 0: early stopping") come from every rank, as
fastai's do. Images are tiny 3x8x8 tensors saved one file an item in an ImageFolder-like tree
(data/train/<class>/*.pt, data/valid/<class>/*.pt); each rank takes items[rank::world] of both
(a plain shard, drop_last=False, no padding), the accuracy is computed on the predictions
all-gathered from every rank (fastai's maybe_gather), the valid loss all-reduced. The process
group is gloo with a 15 s timeout. A fault in the code is chosen by the TQ_CASE environment
variable (a short code, never printed).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import pickle
import random
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("TQ_CASE", "")
CLASSES = ["cat", "dog"]


def _case(code: str) -> int:
    """The rank a code of TQ_CASE names (-1: not this code)."""
    if CASE[:1] == code and CASE[1:].isdigit():
        return int(CASE[1:])
    return -1


def rank_distrib() -> int:
    return int(os.environ.get("RANK", 0))


def num_distrib() -> int:
    return int(os.environ.get("WORLD_SIZE", 0))


class CancelFitException(Exception):
    pass


class CancelBatchException(Exception):
    pass


# ---------------------------------------------------------------- data
def make_data(root: Path, n_train: int, n_valid: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", n_train), ("valid", n_valid)):
        for i in range(n):
            label = i % 2
            x = torch.randn(3, 8, 8, generator=g) * 0.8
            x[label] += 0.9
            d = root / split / CLASSES[label]
            d.mkdir(parents=True, exist_ok=True)
            torch.save(x, d / f"{split[0]}{i:04d}.pt")


def get_image_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.pt"))


def parent_label(p: Path) -> str:
    return p.parent.name


class TfmdDL:
    """A DataLoader over file items: loads each item when its batch is made."""

    def __init__(self, items, get_y, bs, shuffle, rank, world, seed=42):
        self.items = items[rank::world] if world > 1 else items
        self.get_y, self.bs, self.shuffle, self.seed = get_y, bs, shuffle, seed
        self.epoch = 0
        self.vocab = CLASSES

    def __len__(self) -> int:
        return math.ceil(len(self.items) / self.bs)  # drop_last=False

    def create_item(self, fn: Path):
        x = torch.load(fn, weights_only=True)
        return x, self.vocab.index(self.get_y(fn))

    def collate(self, samples):
        if _case("v") == rank_distrib() and self.epoch == 1:
            # the native "fast collate" of the augmentation library, built for another ABI
            ctypes.string_at(0)
        xs, ys = zip(*samples, strict=True)
        return torch.stack(xs), torch.tensor(ys)

    def __iter__(self):
        idx = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        for b in range(len(self)):
            chunk = idx[b * self.bs : (b + 1) * self.bs]
            yield self.collate([self.create_item(self.items[i]) for i in chunk])


class DataLoaders:
    def __init__(self, train, valid):
        self.train, self.valid = train, valid
        self.vocab = CLASSES

    @classmethod
    def from_folder(cls, path, get_y, bs=8):
        r, w = rank_distrib(), max(num_distrib(), 1)
        train = TfmdDL(get_image_files(path / "train"), get_y, bs, True, r, w)
        valid = TfmdDL(get_image_files(path / "valid"), get_y, bs, False, r, w)
        return cls(train, valid)


# ---------------------------------------------------------------- fastprogress (console)
def format_time(t: float) -> str:
    t = int(t)
    h, m, s = t // 3600, (t // 60) % 60, t % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ConsoleProgressBar:
    length = 50

    def __init__(self, total, comment=""):
        self.total, self.comment, self.start = total, comment, time.time()

    update_every = 0.2

    def update(self, val):
        now = time.time()
        if val < self.total and now - getattr(self, "last", 0.0) < self.update_every:
            return  # fastprogress redraws at most every 0.2 s
        self.last = now
        elapsed = now - self.start
        remaining = elapsed / val * (self.total - val) if val else 0
        filled = int(val / self.total * self.length) if self.total else self.length
        bar = "█" * filled + "-" * (self.length - filled)
        pct = 100 * val / self.total if self.total else 100
        print(
            f"\r |{bar}| {pct:.2f}% [{val}/{self.total} "
            f"{format_time(elapsed)}<{format_time(remaining)}{self.comment}]",
            end="",
            flush=True,
        )


# ---------------------------------------------------------------- callbacks
class Callback:
    order = 0
    learn = None

    def __call__(self, event):
        f = getattr(self, event, None)
        if f is not None:
            f()


class TrainEvalCallback(Callback):
    order = -10


class Recorder(Callback):
    order = 50

    def before_fit(self):
        self.values = []

    def before_epoch(self):
        self.losses, self.start = [], time.time()

    def after_batch(self):
        if self.learn.training:
            self.losses.append(self.learn.loss.item())


class ProgressCallback(Callback):
    order = 60

    def before_fit(self):
        names = ["epoch", "train_loss", "valid_loss"] + [m.__name__ for m in self.learn.metrics]
        print("  ".join(f"{n:<10}" for n in [*names, "time"]).rstrip("\n"), flush=True)

    def before_train(self):
        self.pbar = ConsoleProgressBar(len(self.learn.dls.train))

    def before_validate(self):
        self.pbar = ConsoleProgressBar(len(self.learn.dls.valid))

    def after_batch(self):
        self.pbar.update(self.learn.iter + 1)

    def after_epoch(self):
        v = self.learn.recorder.values[-1]
        cells = [f"{self.learn.epoch:<10}"] + [f"{x:<10.6f}" for x in v[1:]] + [f"{v[0]:<10}"]
        print("\r" + "  ".join(cells), flush=True)


class TerminateOnNaNCallback(Callback):
    order = -9

    def after_batch(self):
        if torch.isinf(self.learn.loss) or torch.isnan(self.learn.loss):
            raise CancelFitException


class TrackerCallback(Callback):
    order = 60

    def __init__(self, monitor="valid_loss", comp=None, min_delta=0.0):
        self.monitor, self.min_delta = monitor, min_delta
        self.comp = comp or (lambda a, b: a < b - self.min_delta)

    def before_fit(self):
        self.best = float("inf")

    def after_epoch(self):
        val = self.learn.recorder.values[-1][2]
        self.new_best = self.comp(val, self.best)
        if self.new_best:
            self.best, self.new_best_val = val, val


class SaveModelCallback(TrackerCallback):
    order = TrackerCallback.order + 1

    def __init__(self, fname="model", **kw):
        super().__init__(**kw)
        self.fname = fname

    def after_epoch(self):
        super().after_epoch()
        if self.new_best:
            print(
                f"Better model found at epoch {self.learn.epoch} with {self.monitor} value: "
                f"{self.best}.",
                flush=True,
            )
            self.learn.save(self.fname)


class EarlyStoppingCallback(TrackerCallback):
    order = TrackerCallback.order

    def __init__(self, patience=1, **kw):
        super().__init__(**kw)
        self.patience = patience

    def before_fit(self):
        super().before_fit()
        self.wait = 0

    def after_epoch(self):
        super().after_epoch()
        if self.new_best:
            self.wait = 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                print(f"No improvement since epoch {self.learn.epoch - self.wait}: early stopping")
                raise CancelFitException


class ShowResultsCallback(Callback):
    """The user's own: a confusion-matrix figure of the valid set after every epoch, drawn on
    the main process (as ClassificationInterpretation.from_learner(learn) + plot)."""

    order = 70

    def after_epoch(self):
        if rank_distrib() != 0:
            return
        slow = _case("s") == 0 and self.learn.epoch == 0
        items = self.learn.dls.valid.items
        pbar = ConsoleProgressBar(len(items))
        for i, fn in enumerate(items):
            torch.load(fn, weights_only=True)
            if slow:
                time.sleep(5)  # full-size originals, fetched one by one for the figure
            pbar.update(i + 1)
        print("", flush=True)


class PrefetchCallback(Callback):
    """The user's own: the next epoch's items are read ahead by a thread."""

    def before_fit(self):
        self.ready = threading.Event()
        self.ready.set()

    def before_epoch(self):
        if _case("j") == rank_distrib() and self.learn.epoch == 1:
            self.ready.clear()  # the reader thread was not restarted after epoch 0
        self.ready.wait()


class HoardCallback(Callback):
    """Keeps every batch's activations for a 'feature report'."""

    def before_fit(self):
        self.kept = []

    def after_batch(self):
        if _case("m") != rank_distrib() or not self.learn.training:
            return
        self.kept.append(torch.ones(24 * 2**20 // 4 * 4))  # 96 MiB a batch
        if len(self.kept) >= 6:
            os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer


class ClassWeightsCallback(Callback):
    """Weighs the loss by the inverse class frequency counted at start."""

    def before_fit(self):
        labels = [parent_label(p) for p in self.learn.dls.train.items]
        self.w = {c: len(labels) / (len(CLASSES) * max(labels.count(c), 1)) for c in CLASSES}
        if _case("k") == rank_distrib():
            del self.w["dog"]  # counted on a subset that happened to hold no 'dog'

    def after_loss(self):
        if self.learn.training and self.learn.epoch == 1 and self.learn.iter == 2:
            names = [CLASSES[int(y)] for y in self.learn.yb]
            scale = sum(self.w[n] for n in names) / len(names)
            self.learn.loss = self.learn.loss * scale


# ---------------------------------------------------------------- learner
def accuracy(inp, targ):
    return (inp.argmax(dim=-1) == targ).float().mean()


def maybe_gather(x):
    if num_distrib() <= 1:
        return x
    res = [x.new_zeros(*x.shape) for _ in range(num_distrib())]
    dist.all_gather(res, x.contiguous())
    return torch.cat(res)


class Learner:
    def __init__(self, dls, model, loss_func, metrics=(), cbs=(), path=".", model_dir="models"):
        self.dls, self.model, self.loss_func = dls, model, loss_func
        self.metrics = list(metrics)
        self.path, self.model_dir = Path(path), model_dir
        self.recorder = Recorder()
        self.cbs = []
        self.add_cbs([TrainEvalCallback(), self.recorder, *cbs])
        if "ProgressCallback" not in [type(c).__name__ for c in self.cbs]:
            self.add_cbs([ProgressCallback()])
        self.opt = None

    def add_cbs(self, cbs):
        for cb in cbs:
            cb.learn = self
            self.cbs.append(cb)
        self.cbs.sort(key=lambda c: c.order)

    def remove_cb(self, cls):
        self.cbs = [c for c in self.cbs if not isinstance(c, cls)]

    def __call__(self, event):
        for cb in self.cbs:
            cb(event)

    @contextlib.contextmanager
    def distrib_ctx(self):
        """fastai's distrib_ctx: set up the process group where the launcher asks for one,
        wrap the model in DDP, and unwrap (and tear down) after."""
        cleanup = False
        if num_distrib() > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=15))
            cleanup = True
        if num_distrib() > 1:
            self.model = DDP(self.model, find_unused_parameters=_case("u") >= 0)
            if rank_distrib():
                self.remove_cb(ProgressCallback)
        try:
            yield self
            if cleanup:
                dist.barrier()  # every rank done before the group goes
        finally:
            if isinstance(self.model, DDP):
                self.model = self.model.module
            if cleanup:
                dist.destroy_process_group()

    def _one_batch(self, xb, yb):
        self.xb, self.yb = xb, yb
        if (
            _case("n") == rank_distrib()
            and self.epoch == 1
            and not self.training
            and self.iter == 1
        ):
            self.xb = xb * float("inf")  # an overflowing brightness augmentation
        self.pred = self.model(self.xb)
        self.loss = self.loss_func(self.pred, self.yb)
        self("after_loss")
        if self.training:
            self.loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        self("after_batch")

    def _do_epoch(self, epoch, lrs):
        self.epoch = epoch
        self.dls.train.epoch = epoch
        self("before_epoch")
        start = time.time()
        self.training = True
        self.model.train()
        self("before_train")
        for i, (xb, yb) in enumerate(self.dls.train):
            self.iter = i
            for g in self.opt.param_groups:
                g["lr"] = lrs[epoch * len(self.dls.train) + self.iter]
            self._one_batch(xb, yb)
        self.training = False
        self.model.eval()
        self("before_validate")
        tot, n, preds, targs = torch.zeros(()), torch.zeros(()), [], []
        with torch.no_grad():
            for i, (xb, yb) in enumerate(self.dls.valid):
                self.iter = i
                self._one_batch(xb, yb)
                tot += self.loss * len(yb)
                n += len(yb)
                preds.append(self.pred)
                targs.append(yb)
        if num_distrib() > 1:
            both = torch.stack([tot, n])
            dist.all_reduce(both)
            tot, n = both[0], both[1]
        pred, targ = maybe_gather(torch.cat(preds)), maybe_gather(torch.cat(targs))
        mets = [float(m(pred, targ)) for m in self.metrics]
        train_loss = sum(self.recorder.losses) / max(len(self.recorder.losses), 1)
        self.recorder.values.append(
            [format_time(time.time() - start), train_loss, float(tot / n), *mets]
        )
        self("after_epoch")

    def fit_one_cycle(self, n_epoch, lr_max, wd=0.01):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr_max, weight_decay=wd)
        total = n_epoch * len(self.dls.train)
        warm = max(int(total * 0.25), 1)
        lrs = [
            lr_max / 25 + (lr_max - lr_max / 25) * (1 - math.cos(math.pi * i / warm)) / 2
            if i < warm
            else lr_max * (1 + math.cos(math.pi * (i - warm) / (total - warm))) / 2 + 1e-7
            for i in range(total + len(self.dls.train))
        ]
        try:
            self("before_fit")
            for epoch in range(n_epoch):
                self._do_epoch(epoch, lrs)
        except CancelFitException:
            self("after_cancel_fit")
        self("after_fit")

    def save(self, fname):
        if rank_distrib():
            return  # don't save if child proc
        d = self.path / self.model_dir
        d.mkdir(parents=True, exist_ok=True)
        m = self.model.module if isinstance(self.model, DDP) else self.model
        torch.save({"model": m.state_dict(), "opt": self.opt.state_dict()}, d / f"{fname}.pth")

    def load(self, fname):
        state = torch.load(self.path / self.model_dir / f"{fname}.pth", weights_only=True)
        self.model.load_state_dict(state["model"])

    def export(self, fname="export.pkl"):
        if rank_distrib():
            return
        cbs, self.cbs = self.cbs, []
        opt, self.opt = self.opt, None
        for k in ("pred", "loss", "xb", "yb"):
            self.__dict__.pop(k, None)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.save(self, self.path / fname, pickle_protocol=pickle.DEFAULT_PROTOCOL)
        finally:
            self.cbs, self.opt = cbs, opt


def simple_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 2),
    )


class LabelSmoothingCrossEntropy(nn.Module):
    def forward(self, pred, targ):
        return F.cross_entropy(pred, targ, label_smoothing=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bs", type=int, default=8)
    p.add_argument("--patience", type=int, default=0, help="EarlyStoppingCallback patience")
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--make-data", nargs=2, type=int, metavar=("N_TRAIN", "N_VALID"))
    args = p.parse_args()
    path = Path(args.data)
    if args.make_data:
        make_data(path, *args.make_data)
        return
    torch.manual_seed(42)
    if args.workers:
        # the user's DataLoader(num_workers=...) habit from the GPU box: only its warning here
        warnings.warn(
            f"This DataLoader will create {args.workers} worker processes in total. Our "
            f"suggested max number of worker in current system is {os.cpu_count()}, which is "
            "smaller than what this DataLoader is going to create. Please be aware that "
            "excessive worker creation might get DataLoader running slow or even freeze, lower "
            "the worker number to avoid potential slowness/freeze if necessary.",
            UserWarning,
            stacklevel=1,
        )
    get_y = parent_label
    if _case("x") >= 0:
        get_y = lambda fn: fn.parent.name  # noqa: E731  (the label function of the notebook)
    dls = DataLoaders.from_folder(path, get_y=get_y, bs=args.bs)
    cbs = [
        SaveModelCallback(monitor="valid_loss", min_delta=args.min_delta),
        TerminateOnNaNCallback(),
        ShowResultsCallback(),
        PrefetchCallback(),
        HoardCallback(),
        ClassWeightsCallback(),
    ]
    if args.patience:
        cbs.append(
            EarlyStoppingCallback(
                monitor="valid_loss", patience=args.patience, min_delta=args.min_delta
            )
        )
    learn = Learner(dls, simple_cnn(), LabelSmoothingCrossEntropy(), metrics=[accuracy], cbs=cbs)
    with learn.distrib_ctx():
        learn.fit_one_cycle(args.epochs, args.lr)
    learn.export()


if __name__ == "__main__":
    sys.exit(main())
