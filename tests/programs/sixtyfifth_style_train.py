"""A sixty-fifth training-program style for the generalisation fixtures (tests/fixtures/real/
sixtyfifth-*): a demand forecaster trained with PyTorch Lightning in the way of pytorch-forecasting
and Darts users: a LightningModule around a small LSTM encoder-decoder on windows of synthetic
daily store-sales series, a LightningDataModule that reads data/sales.csv, builds the windows
(encoder 28 days, horizon 7) and caches them in data/cache/, a categorical encoder of store ids
that raises on unknown categories as pytorch-forecasting's NaNLabelEncoder does, EarlyStopping
on val_loss, ModelCheckpoint (lightning_logs/version_N/checkpoints/epoch=E-step=S.ckpt, last.ckpt),
a CSVLogger, Lightning's model summary table and progress bar. Started with plain `python
sixtyfifth_style_train.py --max-epochs N ...`: `Trainer(accelerator="cpu", devices=N,
strategy=DDPStrategy(start_method="spawn", process_group_backend="gloo", timeout=15 s))` is
Lightning's ddp_spawn, whose launcher (torch.multiprocessing.start_processes) spawns every rank
as a child of this process; the parent only joins them and, at the end, loads rank 0's weights
and prints the best checkpoint (ModelCheckpoint.best_model_path).

One real fault per value of the TQ_CASE environment variable (short codes, never printed); the
others are in what a run is given (its data folder, its environment, its arguments).
Re-capture with tests/fixtures/real/capture_sixtyfifth.sh after any edit.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset

ENCODER_LENGTH = 28
HORIZON = 7


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    unseen_rank: int = -1  # this rank's validation meets a store the encoder was not fitted on
    race: bool = False  # the window cache is built in setup() on global rank 0, read by all
    hoard_rank: int = -1  # this rank keeps every batch's lag features until the OOM killer acts
    segv_rank: int = -1  # this rank's native lag-feature kernel reads address 0
    slow_rank: int = -1  # this rank re-runs a seasonal decomposition before validating
    stuck_rank: int = -1  # this rank waits for a feature-store refresh thread never started
    zero_gather: bool = False  # the rank-zero plot callback gathers the predictions alone
    per_rank_series: bool = False  # every rank reads its own stores (no DistributedSampler)
    budget_rank: int = -1  # this rank's wall-clock budget callback exits the process
    unpicklable: bool = False  # the data module keeps a lambda (the transform of the target)
    no_guard: bool = False  # the script calls main() without the __main__ guard


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "u1": Fault(unseen_rank=1),
    "r": Fault(race=True),
    "m1": Fault(hoard_rank=1),
    "v0": Fault(segv_rank=0),
    "d1": Fault(slow_rank=1),
    "j0": Fault(stuck_rank=0),
    "z": Fault(zero_gather=True),
    "p": Fault(per_rank_series=True),
    "b0": Fault(budget_rank=0),
    "l": Fault(unpicklable=True),
    "g": Fault(no_guard=True),
}


def fault() -> Fault:
    return FAULTS[os.environ.get("TQ_CASE", "")]


# --------------------------------------------------------------------------- data


def make_data(folder: str, stores: int, days: int, seed: int = 7) -> None:
    """Daily sales of `stores` stores: level, trend, weekly season, noise; one CSV."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    with open(os.path.join(folder, "sales.csv"), "w") as f:
        f.write("store_id,time_idx,sales\n")
        for s in range(stores):
            level = rng.uniform(20, 80)
            trend = rng.uniform(-0.02, 0.05)
            amp = rng.uniform(2, 10)
            for t in range(days):
                y = level + trend * t + amp * math.sin(2 * math.pi * t / 7) + rng.gauss(0, 1.5)
                f.write(f"S{s:02d},{t},{y:.3f}\n")


def read_sales(path: str) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    with open(path) as f:
        next(f)
        for line in f:
            store, _, value = line.rstrip("\n").split(",")
            series.setdefault(store, []).append(float(value))
    return series


class NaNLabelEncoder:
    """Store ids to integers, as pytorch-forecasting's encoder without add_nan."""

    def __init__(self) -> None:
        self.classes_: dict[str, int] = {}

    def fit(self, values: list[str]) -> NaNLabelEncoder:
        self.classes_ = {v: i for i, v in enumerate(sorted(set(values)))}
        return self

    def transform(self, value: str) -> int:
        if value not in self.classes_:
            raise KeyError(
                f"Unknown category '{value}' encountered. Set `add_nan=True` to allow unknown "
                "categories"
            )
        return self.classes_[value]


def build_windows(series: dict[str, list[float]], encoder: NaNLabelEncoder) -> dict:
    """Sliding windows, the last HORIZON * 4 days of every store held out for validation."""
    out: dict[str, list] = {"train": [], "val": []}
    for store, values in sorted(series.items()):
        x = torch.tensor(values)
        scale = x[: -HORIZON * 4].mean().clamp(min=1.0)
        x = x / scale
        sid = encoder.transform(store)
        cut = len(values) - HORIZON * 4
        for t in range(ENCODER_LENGTH, len(values) - HORIZON + 1):
            split = "train" if t + HORIZON <= cut else "val"
            out[split].append((sid, x[t - ENCODER_LENGTH : t], x[t : t + HORIZON]))
    return {
        k: (
            torch.tensor([w[0] for w in v]),
            torch.stack([w[1] for w in v]),
            torch.stack([w[2] for w in v]),
        )
        for k, v in out.items()
    }


class WindowDataset(Dataset):
    def __init__(self, tensors) -> None:
        self.ids, self.x, self.y = tensors

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return {"store": self.ids[i], "encoder_target": self.x[i], "decoder_target": self.y[i]}


class SalesDataModule(pl.LightningDataModule):
    def __init__(self, data_dir: str, batch_size: int, num_workers: int) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache = os.path.join(data_dir, "cache", f"windows-enc{ENCODER_LENGTH}-h{HORIZON}.pt")
        if fault().unpicklable:
            self.target_transform = lambda y: torch.log1p(y)

    def _build_cache(self) -> None:
        series = read_sales(os.path.join(self.data_dir, "sales.csv"))
        encoder = NaNLabelEncoder().fit(list(series))
        windows = build_windows(series, encoder)
        os.makedirs(os.path.dirname(self.cache), exist_ok=True)
        torch.save({"windows": windows, "classes": encoder.classes_}, self.cache)

    def prepare_data(self) -> None:
        # called on local rank 0 only, before setup(); Lightning waits for it on every rank
        if not fault().race and not os.path.exists(self.cache):
            self._build_cache()

    def setup(self, stage: str) -> None:
        rank = self.trainer.global_rank if self.trainer else 0
        if fault().race and rank == 0 and not os.path.exists(self.cache):
            self._build_cache()
        cached = torch.load(self.cache)
        self.classes = cached["classes"]
        self.train_set = WindowDataset(cached["windows"]["train"])
        self.val_set = WindowDataset(cached["windows"]["val"])
        if fault().per_rank_series and self.trainer is not None:
            self.train_set = self._own_stores(self.train_set, rank, self.trainer.world_size)
            self.val_set = self._own_stores(self.val_set, rank, self.trainer.world_size)

    def _own_stores(self, ds: WindowDataset, rank: int, world: int) -> WindowDataset:
        """Each rank trains on its own stores: store k on rank k % world."""
        keep = ds.ids % world == rank
        return WindowDataset((ds.ids[keep], ds.x[keep], ds.y[keep]))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            drop_last=True,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)


# --------------------------------------------------------------------------- model


class LSTMForecaster(pl.LightningModule):
    """An LSTM encoder over the past 28 days and a linear head for the next 7, a store embedding."""

    def __init__(self, n_stores: int, hidden_size: int = 32, learning_rate: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.store_embedding = nn.Embedding(n_stores + 1, 4)
        self.encoder = nn.LSTM(input_size=5, hidden_size=hidden_size, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, HORIZON)
        )
        self.loss = nn.L1Loss()
        self.hoard: list[torch.Tensor] = []

    def forward(self, store: torch.Tensor, encoder_target: torch.Tensor) -> torch.Tensor:
        emb = self.store_embedding(store)[:, None, :].expand(-1, encoder_target.shape[1], -1)
        x = torch.cat([encoder_target[..., None], emb], dim=-1)
        out, _ = self.encoder(x)
        return self.head(out[:, -1])

    def _lag_features(self, batch: dict) -> None:
        f = fault()
        if f.segv_rank == self.global_rank and self.current_epoch == 1:
            # the "fast" native lag kernel of a feature library, handed a null buffer
            ctypes.string_at(0)
        if f.hoard_rank == self.global_rank and self.current_epoch >= 1:
            # every batch's lag matrix kept for a feature-importance plot: 64 MiB a batch
            self.hoard.append(torch.ones(16 * 1024 * 1024))
            if len(self.hoard) >= 12:  # the kernel's OOM killer, as it acts: SIGKILL, no message
                os.kill(os.getpid(), signal.SIGKILL)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._lag_features(batch)
        pred = self(batch["store"], batch["encoder_target"])
        loss = self.loss(pred, batch["decoder_target"])
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        f = fault()
        if f.slow_rank == self.global_rank and self.current_epoch == 1:
            # the seasonal decomposition of the validation stores is re-run on this rank
            for k in range(1, 9):
                print(f"Seasonal decomposition of validation stores: {k}/8 stores done", flush=True)
                time.sleep(5)
        if f.stuck_rank == self.global_rank and self.current_epoch == 1:
            # waits for the feature store's refresh thread, which was never started
            threading.Event().wait()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        f = fault()
        if f.unseen_rank == self.global_rank and self.current_epoch == 1 and batch_idx == 2:
            encoder = NaNLabelEncoder()
            encoder.classes_ = self.trainer.datamodule.classes
            encoder.transform(f"S{len(encoder.classes_) + 3:02d}")  # a store opened in May
        pred = self(batch["store"], batch["encoder_target"])
        loss = self.loss(pred, batch["decoder_target"])
        smape = (2 * (pred - batch["decoder_target"]).abs()).div(
            pred.abs() + batch["decoder_target"].abs() + 1e-8
        )
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        self.log("val_SMAPE", smape.mean(), sync_dist=True)
        if f.zero_gather:
            self.val_preds = [*getattr(self, "val_preds", []), pred.detach()]

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=2)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"},
        }


class PredictionPlotCallback(pl.Callback):
    """Plots validation predictions on global rank 0 at the end of every validation."""

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not fault().zero_gather or trainer.sanity_checking:
            return
        if trainer.is_global_zero:
            preds = torch.cat(pl_module.val_preds)
            gathered = pl_module.all_gather(preds)  # every rank's predictions for the figure
            print(f"Plotting {gathered.shape[0] * gathered.shape[1]} validation forecasts")
        pl_module.val_preds = []


class WallClockBudget(pl.Callback):
    """Stops the run after a wall-clock budget, saving a last checkpoint first."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.start = time.time()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if fault().budget_rank != trainer.global_rank or time.time() - self.start < self.budget_s:
            return
        print(
            f"Wall-clock budget of {self.budget_s:.0f} s used up, exiting after epoch "
            f"{trainer.current_epoch}.",
            flush=True,
        )
        sys.exit(0)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an LSTM demand forecaster.")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--make-data", action="store_true", help="write data/sales.csv and exit")
    parser.add_argument("--stores", type=int, default=12)
    parser.add_argument("--days", type=int, default=730)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--log-every-n-steps", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.0, help="wall-clock budget (s)")
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    if args.make_data:
        make_data(args.data_dir, args.stores, args.days)
        return

    pl.seed_everything(args.seed)
    dm = SalesDataModule(args.data_dir, args.batch_size, args.num_workers)
    model = LSTMForecaster(
        n_stores=args.stores,
        hidden_size=args.hidden_size,
        learning_rate=args.learning_rate,
    )
    callbacks: list[pl.Callback] = [
        EarlyStopping(monitor="val_loss", patience=args.patience, mode="min", verbose=True),
        ModelCheckpoint(monitor="val_loss", save_top_k=1, save_last=True, verbose=True),
        TQDMProgressBar(refresh_rate=10),
        PredictionPlotCallback(),
    ]
    if args.budget:
        callbacks.append(WallClockBudget(args.budget))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=DDPStrategy(
            start_method="spawn", process_group_backend="gloo", timeout=timedelta(seconds=15)
        ),
        max_epochs=args.max_epochs,
        gradient_clip_val=0.1,
        callbacks=callbacks,
        logger=CSVLogger("lightning_logs", name=""),
        log_every_n_steps=args.log_every_n_steps,
        use_distributed_sampler=not fault().per_rank_series,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=args.ckpt_path)
    print(f"Best model: {trainer.checkpoint_callback.best_model_path}")


if fault().no_guard or __name__ == "__main__":  # no_guard: main() runs on every import
    main()
