"""A seventh training-program style for the generalisation fixtures (tests/fixtures/real/sixth-*):
a tabular classifier trained the way PyTorch Lightning users write it (a LightningModule and a
LightningDataModule, `Trainer(accelerator="cpu", devices=N, num_nodes=M,
strategy=DDPStrategy(process_group_backend="gloo", timeout=20 s))`, ModelCheckpoint,
EarlyStopping and a custom Callback, `self.log` with and without `sync_dist`, `self.all_gather`,
`rank_zero_info`/`rank_zero_only`, `trainer.strategy.barrier()`, validation every epoch, the
TQDM progress bar and Lightning's own console lines as they come). Started with plain python
(Lightning's subprocess launcher), torchrun, two torchrun agents as two nodes, or Slurm-like
variables. One real fault per --mode, named by what it does so no output ever quotes the label.
Captured by tests/fixtures/real/capture_sixth.sh: re-capture after any edit (the fixtures quote
its lines)."""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset, Subset

log = logging.getLogger("tabclf")

FEATURES = 16
CLASSES = 4
CLASS_NAMES = ["low", "mid", "high"]  # the fourth class was added to the data later


@dataclass(frozen=True)
class Plan:
    """What goes wrong, where (rank None: nowhere)."""

    noisy: bool = False  # a deprecation, an optional tracker missing, metrics not synced
    stop_below: float | None = None  # EarlyStopping's stopping_threshold on val_loss
    report_rank0: bool = False  # rank 0 writes a per-class report after validation
    inf_sample_rank: int | None = None  # rows of NaNs in this rank's shard, a NaN guard
    swapped_rank: int | None = None  # broadcasts the lr before reducing throughput
    hard_examples_rank: int | None = None  # shares its hard examples with all_gather_object
    skip_bad_rank: int | None = None  # manual optimisation: skips backward on a bad batch
    relock_rank: int | None = None  # takes the stats lock again inside the locked refresh
    vocab_rank: int | None = None  # rebuilds its vocabulary cache in a busy loop
    slow_export: bool = False  # rank 0 exports the model to slow storage after validation
    resume_from: str = ""  # fit(ckpt_path=...)
    kill_rank: int | None = None  # keeps every batch's activations until the kernel kills it
    abort_rank: int | None = None  # a C helper aborts
    pin_cuda: bool = False  # torch.cuda.set_device(local rank) in setup, as on a GPU box
    scale_lr_by_world: bool = False  # reads WORLD_SIZE before the Trainer exists
    profiler_env: bool = False  # TRAIN_PROFILER=1 imports an optional profiler
    last_shard_rate_rank: int | None = None  # throughput over zero samples on the last shard
    file_shards: bool = False  # each rank reads its own file, no DistributedSampler
    short_train_rank: int | None = None  # ... and this rank's training file is shorter


PLANS: dict[str, Plan] = {
    "baseline": Plan(),  # only capture_sixth.sh's checkpoint for the resume mode
    "calm-warnings": Plan(noisy=True),
    "plateau-halt": Plan(stop_below=100.0),
    "summary-crash": Plan(report_rank0=True),
    "nan-guard": Plan(inf_sample_rank=1),
    "order-swap": Plan(swapped_rank=2),
    "object-gossip": Plan(hard_examples_rank=1),
    "skipped-backward": Plan(skip_bad_rank=1),
    "lock-twice": Plan(relock_rank=1),
    "busy-prep": Plan(vocab_rank=3),
    "slow-ckpt": Plan(slow_export=True),
    "torn-resume": Plan(),  # capture_sixth.sh passes --resume-from a truncated checkpoint
    "self-kill": Plan(kill_rank=1),
    "abort-native": Plan(abort_rank=2),
    "cuda-pin": Plan(pin_cuda=True),
    "no-env": Plan(scale_lr_by_world=True),
    "profiler-node": Plan(profiler_env=True),
    "record-fail": Plan(last_shard_rate_rank=2),
    "gather-shape": Plan(file_shards=True),
    "uneven-shard": Plan(file_shards=True, short_train_rank=2),
}


class Table(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic rows: the class is the quadrant of two linear scores."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        w = torch.randn(FEATURES, 2, generator=g)
        s = self.x @ w
        self.y = (s[:, 0] > 0).long() * 2 + (s[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class TableData(L.LightningDataModule):
    """Train/validation tables; with file shards each rank reads its own slice."""

    def __init__(self, plan: Plan, batch_size: int) -> None:
        super().__init__()
        self.plan = plan
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train = Table(192, 0)
        self.val = Table(68, 1)
        rank = self.trainer.global_rank if self.trainer else 0
        if self.plan.inf_sample_rank is not None and rank == self.plan.inf_sample_rank:
            self.train.x[60:80] = float("nan")  # rows with missing values in this copy
        if self.plan.file_shards:
            world = self.trainer.world_size if self.trainer else 1
            # shard files: train.0, train.1, ...; the last validation file is the remainder
            per = len(self.train) // world
            stop = (rank + 1) * per
            if rank == self.plan.short_train_rank:
                stop -= 2 * self.batch_size
            self.train_part = Subset(self.train, range(rank * per, stop))
            vper = 24
            self.val_part = Subset(self.val, range(rank * vper, min((rank + 1) * vper, 68)))

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        data = self.train_part if self.plan.file_shards else self.train
        return DataLoader(data, batch_size=self.batch_size, shuffle=not self.plan.file_shards)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        data = self.val_part if self.plan.file_shards else self.val
        return DataLoader(data, batch_size=self.batch_size)


class Classifier(L.LightningModule):
    def __init__(self, plan: Plan, lr: float) -> None:
        super().__init__()
        self.plan = plan
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
        self.kept: list[torch.Tensor] = []
        self.val_preds: list[torch.Tensor] = []
        if plan.skip_bad_rank is not None:
            self.automatic_optimization = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        if self.plan.inf_sample_rank is not None and not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.global_step}")
        if self.plan.kill_rank == self.global_rank:
            self.kept.append(torch.empty(16 << 20).fill_(1.0))  # 64 MiB kept per step
            if len(self.kept) == 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if self.plan.abort_rank == self.global_rank and self.current_epoch == 1 and idx == 2:
            ctypes.CDLL(None).abort()  # the fast C path of the histogram helper
        if not self.automatic_optimization:
            opt = self.optimizers()
            assert isinstance(opt, L.pytorch.core.optimizer.LightningOptimizer)
            bad = self.global_rank == self.plan.skip_bad_rank and idx == 5
            if bad:
                # a batch whose labels are all one class: skip it rather than overfit
                print(f"[rank {self.global_rank}] skipping degenerate batch {idx}", flush=True)
            else:
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> None:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        acc = (logits.argmax(-1) == y).float().mean()
        self.log("val_loss", loss, sync_dist=True, prog_bar=True)
        self.log("val_acc", acc, sync_dist=not self.plan.noisy)
        if self.plan.file_shards:
            preds = self.all_gather(logits.argmax(-1))  # every rank's predictions, for the report
            assert isinstance(preds, torch.Tensor)
            self.val_preds.append(preds.flatten())
        else:
            self.val_preds.append(logits.argmax(-1))

    def on_validation_epoch_end(self) -> None:
        preds = torch.cat(self.val_preds)
        self.val_preds.clear()
        counts = torch.bincount(preds, minlength=CLASSES)
        self.log("val_pred_spread", counts.float().std())
        if self.plan.hard_examples_rank == self.global_rank and self.current_epoch == 0:
            hard = [int(i) for i in torch.nonzero(counts == 0).flatten()]
            gathered: list[object] = [None] * self.trainer.world_size
            dist.all_gather_object(gathered, {"rank": self.global_rank, "missing": hard})
            rank_zero_info(f"classes never predicted: {gathered}")
        if self.plan.report_rank0 and not self.trainer.sanity_checking:
            write_report(counts, self.current_epoch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


@rank_zero_only
def write_report(counts: torch.Tensor, epoch: int) -> None:
    """Per-class prediction counts, on the main process only."""
    lines = [f"epoch {epoch}"]
    for c in range(CLASSES):
        lines.append(f"{CLASS_NAMES[c]:>6}: {int(counts[c])}")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "val_report.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines))


class Housekeeping(Callback):
    """Throughput, learning-rate agreement, the vocabulary cache, the model export."""

    def __init__(self, plan: Plan, out_dir: str) -> None:
        self.plan = plan
        self.out_dir = out_dir
        self.lock = threading.Lock()
        self.seen = 0
        self.logged = 0
        self.started = time.monotonic()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.plan.pin_cuda:
            torch.cuda.set_device(trainer.local_rank)  # one GPU per process
        if self.plan.noisy and trainer.is_global_zero:
            try:
                importlib.import_module("wandb")
            except ImportError:
                log.warning("wandb is not installed: metrics stay in the CSV logger only")

    def refresh_stats(self) -> None:
        with self.lock:
            self.seen = 0
            self.started = time.monotonic()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, idx: int
    ) -> None:
        if trainer.global_rank == self.plan.relock_rank and idx == 4:
            with self.lock:  # the stats are read and reset together
                self.refresh_stats()
        self.seen += 8

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: object,
        batch: object,
        idx: int,
    ) -> None:
        if idx != 3:
            return
        rate = torch.tensor([self.seen / (time.monotonic() - self.started)])
        lr = torch.tensor([pl_module.lr, 0.9, 0.999])  # lr and the Adam betas
        if trainer.global_rank == self.plan.swapped_rank:
            dist.broadcast(lr, src=0)  # the schedule first, then the throughput
            dist.all_reduce(rate)
        else:
            dist.all_reduce(rate)
            dist.broadcast(lr, src=0)
        if trainer.global_rank == self.plan.last_shard_rate_rank and trainer.current_epoch == 1:
            self.logged = self.seen  # where the next report starts
            per_sample = (time.monotonic() - self.started) / (self.seen - self.logged)
            log.info("last shard: %.4f s per sample", per_sample)
        rank_zero_info(f"throughput {float(rate):.1f} samples/s over all ranks")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == self.plan.vocab_rank and trainer.current_epoch == 1:
            print(f"[rank {trainer.global_rank}] vocabulary cache is stale, rebuilding", flush=True)
            end = time.monotonic() + 60
            n = 0
            while time.monotonic() < end:
                n = (n * 31 + 7) % 1_000_003
            print(f"[rank {trainer.global_rank}] vocabulary cache rebuilt", flush=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.plan.slow_export or trainer.sanity_checking:
            return
        if trainer.is_global_zero:
            path = os.path.join(self.out_dir, "export.pt")
            rank_zero_info(f"exporting the model to {path}")
            with open(path, "wb") as f:
                for _ in range(8):
                    f.write(os.urandom(1 << 20))
                    os.fsync(f.fileno())
                    time.sleep(5)  # the shared filesystem takes its time
            rank_zero_info("export done")
        trainer.strategy.barrier("export")


@record
def recorded_main() -> None:
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description="tabular classifier with Lightning")
    parser.add_argument("--mode", default="baseline", choices=sorted(PLANS))
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out-dir", default=os.environ.get("TMPDIR", "/tmp") + "/tabclf")
    parser.add_argument("--resume-from", default="")
    args = parser.parse_args()
    plan = PLANS[args.mode]
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level="INFO")

    lr = 3e-3
    if plan.scale_lr_by_world:
        lr *= int(os.environ["WORLD_SIZE"])  # linear scaling with the number of processes
    if plan.noisy:
        warnings.warn(
            "`lr_schedule='cosine'` is deprecated, use `scheduler='cosine'`", stacklevel=1
        )
    if plan.profiler_env and os.environ.get("TRAIN_PROFILER") == "1":
        importlib.import_module("torch_tb_profiler")

    L.seed_everything(7)
    # under torchrun, Lightning takes the processes it was given
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", args.devices))
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=args.out_dir, monitor="val_loss", save_last=True),
        Housekeeping(plan, args.out_dir),
    ]
    if plan.stop_below is not None:
        callbacks.append(
            EarlyStopping(monitor="val_loss", stopping_threshold=plan.stop_below, verbose=True)
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=args.nodes,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=20)),
        max_epochs=args.epochs,
        callbacks=callbacks,
        log_every_n_steps=4,
        default_root_dir=args.out_dir,
        use_distributed_sampler=not plan.file_shards,
    )
    model = Classifier(plan, lr)
    data = TableData(plan, batch_size=8)
    trainer.fit(model, data, ckpt_path=args.resume_from or None)
    rank_zero_info(f"best checkpoint: {trainer.checkpoint_callback.best_model_path}")  # type: ignore[union-attr]


if __name__ == "__main__":
    if os.environ.get("TRAIN_RECORD_ERRORS") == "1":
        recorded_main()
    else:
        main()
