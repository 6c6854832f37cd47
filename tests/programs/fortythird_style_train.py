"""A forty-third training-program style for the generalisation fixtures
(tests/fixtures/real/fortythird-*): a medical-image segmentation trainer in the way of
MIC-DKFZ/nnU-Net v2, written here in plain PyTorch (nnU-Net itself is not used). Started by
tests/programs/fortythird_cli.py (as `nnUNetv2_train DATASET 2d FOLD -num_gpus N`), which spawns
the ranks with torch.multiprocessing.spawn; `run_ddp(rank, ...)` joins gloo (env://, MASTER_ADDR
and MASTER_PORT from the CLI, 15 s collective timeout) and runs the trainer. As nnU-Net's
nnUNetTrainer does: every line is printed by rank 0 only through `print_to_log_file` (a
timestamp and a colon, no rank) and also written to
nnUNet_results/<dataset>/<trainer>__nnUNetPlans__2d/fold_N/training_log_<date>.txt; the banner,
the configuration dict, "unpacking dataset..." by rank 0 (the others poll for its marker file),
a fixed number of iterations per epoch drawn from a DataLoader with two background workers
(foreground oversampling on the last rank only, as nnU-Net distributes it), train/val loss and
pseudo Dice all-gathered at each epoch's end, an EMA of the pseudo Dice with checkpoint_best.pth,
checkpoint_final.pth, "Training done." and a validation of whole cases split over the ranks.
The data are synthetic volumes written at capture time (--make-data). A fault is chosen by the
T43_CASE environment variable (an opaque code) and never printed (re-capture with
tests/fixtures/real/capture_fortythird.sh after any edit).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

TIMEOUT = timedelta(seconds=15)
DATASET = "Dataset317_ToyAbdomen"
LABELS = {"background": 0, "liver": 1, "lesion": 2}
SLICES, SIZE = 6, 32


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    all_classes: bool = False  # oversampling assumes every case holds every foreground label
    hoard_rank: int = -1  # this rank keeps every batch's logits until the OOM killer acts
    segv_rank: int = -1  # this rank's native elastic deformation reads address 0
    slow_val_rank: int = -1  # this rank's second validation case takes 25 s to predict
    freeze_unpack: bool = False  # rank 0's unpacking blocks forever on one case
    fg_log_rank0: bool = False  # rank 0 alone all-reduces the foreground fraction for its log
    shard_epochs: bool = False  # one pass over the rank's own shard per epoch (uneven shards)
    stop_rank0: bool = False  # the patience check is made on rank 0 only
    nan_check: bool = False  # a non-finite loss raises (the trainer variant that checks)
    resume_cuda: bool = False  # the checkpoint is mapped to cuda:<local rank> on resume
    resume_safe: bool = False  # torch.load with its default weights_only on resume
    plot_rank0: bool = False  # rank 0 plots progress.png each epoch (imports seaborn)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q7": Fault(all_classes=True),
    "m3": Fault(hoard_rank=1),
    "z4": Fault(segv_rank=2),
    "w9": Fault(slow_val_rank=1),
    "f2": Fault(freeze_unpack=True),
    "c5": Fault(fg_log_rank0=True),
    "u6": Fault(shard_epochs=True),
    "e1": Fault(stop_rank0=True),
    "n8": Fault(nan_check=True),
    "r3": Fault(resume_cuda=True),
    "r4": Fault(resume_safe=True),
    "p5": Fault(plot_rank0=True),
}
FAULT = FAULTS[os.environ.get("T43_CASE", "")]


# --- the data: synthetic volumes, preprocessed as nnU-Net stores them ---------------------------


def make_data(root: str, n_cases: int = 25, seed: int = 43) -> None:
    """nnUNet_preprocessed/<dataset>/: dataset.json, splits_final.json and, in nnUNetPlans_2d/,
    case_XXXX.npz (data, seg) with case_XXXX.json (its properties: class_locations)."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, DATASET)
    planned = os.path.join(folder, "nnUNetPlans_2d")
    os.makedirs(planned, exist_ok=True)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    for c in range(n_cases):
        img = rng.normal(0, 0.3, (1, SLICES, SIZE, SIZE)).astype(np.float32)
        seg = np.zeros((1, SLICES, SIZE, SIZE), dtype=np.int8)
        cy, cx, r = rng.integers(10, 22), rng.integers(10, 22), rng.integers(5, 9)
        organ = (yy - cy) ** 2 + (xx - cx) ** 2 < r**2
        lesion = (yy - cy - 1) ** 2 + (xx - cx + 1) ** 2 < (r // 2) ** 2
        for z in range(SLICES):
            seg[0, z][organ] = 1
            if c != 11 and 1 <= z <= 4:  # case_0011 has no lesion
                seg[0, z][lesion] = 2
        img[0] += seg[0] * 0.8
        name = f"case_{c:04d}"
        np.savez_compressed(os.path.join(planned, name + ".npz"), data=img, seg=seg)
        locations = {
            str(k): np.argwhere(seg[0] == k)[:50].tolist() for k in (1, 2) if (seg[0] == k).any()
        }
        with open(os.path.join(planned, name + ".json"), "w") as f:
            json.dump({"spacing": [3.0, 0.8, 0.8], "class_locations": locations}, f)
    cases = [f"case_{c:04d}" for c in range(n_cases)]
    splits = [
        {"train": [k for i, k in enumerate(cases) if i % 5 != f], "val": cases[f::5]}
        for f in range(5)
    ]
    with open(os.path.join(folder, "splits_final.json"), "w") as f:
        json.dump(splits, f, indent=1)
    with open(os.path.join(folder, "dataset.json"), "w") as f:
        json.dump(
            {"channel_names": {"0": "CT"}, "labels": LABELS, "numTraining": n_cases}, f, indent=1
        )


class CaseLoader(Dataset):
    """nnU-Net's data loader with its augmenter, one batch of 2D slices per index: sample a case
    of this rank's part, then a slice; force foreground for the oversampled samples."""

    def __init__(self, folder: str, cases: list[str], batch: int, oversample: float, rank: int):
        self.folder, self.cases, self.batch, self.rank = folder, cases, batch, rank
        self.oversample = oversample
        self.draws: list[int] = []

    def properties(self, case: str) -> dict:
        with open(os.path.join(self.folder, case + ".json")) as f:
            props = json.load(f)
        props["class_locations"] = {int(k): v for k, v in props["class_locations"].items()}
        return props

    def __len__(self) -> int:
        return len(self.draws)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng(self.draws[i])
        xs, ys = [], []
        for j in range(self.batch):
            case = self.cases[rng.integers(len(self.cases))]
            data = np.load(os.path.join(self.folder, case + ".npy"))
            seg = np.load(os.path.join(self.folder, case + "_seg.npy"))
            z = rng.integers(SLICES)
            if j >= round(self.batch * (1 - self.oversample)):  # force a foreground class
                locs = self.properties(case)["class_locations"]
                if FAULT.all_classes:  # a label the case may not hold (case_0011 has no lesion)
                    cls = [1, 2][rng.integers(2)]
                else:
                    cls = sorted(locs)[rng.integers(len(locs))]
                z = locs[cls][rng.integers(len(locs[cls]))][0]
            xs.append(torch.from_numpy(data[:, z].copy()))
            ys.append(torch.from_numpy(seg[0, z].astype(np.int64)))
        return {"data": torch.stack(xs), "target": torch.stack(ys)}


class TinyUNet(nn.Module):
    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.LeakyReLU(0.01))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.LeakyReLU(0.01))
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.head = nn.Conv2d(16, n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.enc(x)
        return self.head(torch.cat([e, self.up(self.down(e))], 1))


def dc_and_ce_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Soft Dice (negative, over the foreground classes) plus cross-entropy, as nnU-Net's."""
    probs = logits.softmax(1)
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).float()
    inter = (probs * onehot).sum((0, 2, 3))
    dice = (2 * inter + 1e-5) / (probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3)) + 1e-5)
    return F.cross_entropy(logits, target) - dice[1:].mean()


# --- the trainer ----------------------------------------------------------------------------------


class ToyTrainer:
    """nnUNetTrainer's shape: initialize, on_train_start, per-epoch hooks, on_train_end,
    perform_actual_validation; prints through print_to_log_file on local rank 0 only."""

    def __init__(self, trainer_name: str, fold: int, num_epochs: int) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = self.rank
        self.is_ddp = self.world > 1
        self.trainer_name, self.fold = trainer_name, fold
        self.num_epochs = num_epochs
        self.initial_lr = 5e-2
        self.batch_size = 6
        self.num_iterations_per_epoch = 10
        self.num_val_iterations_per_epoch = 3
        self.save_every = 50
        self.patience = 1 if "EarlyStop" in trainer_name else 0
        self.min_delta = 0.5
        self.current_epoch = 0
        # nnU-Net's own (lower-case) environment variables
        self.preprocessed = os.path.join(os.environ["nnUNet_preprocessed"], DATASET)  # noqa: SIM112
        self.planned = os.path.join(self.preprocessed, "nnUNetPlans_2d")
        results = os.environ["nnUNet_results"]  # noqa: SIM112
        self.output_folder = os.path.join(
            results, DATASET, f"{trainer_name}__nnUNetPlans__2d", f"fold_{fold}"
        )
        os.makedirs(self.output_folder, exist_ok=True)
        t = datetime.now()
        self.log_file = os.path.join(
            self.output_folder,
            f"training_log_{t.year}_{t.month}_{t.day}_{t.hour:02d}_{t.minute:02d}_{t.second:02d}.txt",
        )
        self.logging: dict[str, list[float]] = {k: [] for k in ("train", "val", "dice", "ema")}
        self._best_ema: np.float64 | None = None
        self.print_to_log_file(
            "\n#######################################################################\n"
            "Please cite the following paper when using nnU-Net:\n"
            "(this toy trainer stands in for it; it is not nnU-Net and cites nothing)\n"
            "#######################################################################\n",
            add_timestamp=False,
        )

    def print_to_log_file(self, *args: object, add_timestamp: bool = True) -> None:
        if self.local_rank != 0:
            return
        if add_timestamp:
            args = (f"{datetime.now()}:", *args)
        with open(self.log_file, "a+") as f:
            for a in args:
                f.write(str(a))
                f.write(" ")
            f.write("\n")
        print(*args)

    # -- set-up --

    def do_split(self) -> tuple[list[str], list[str]]:
        splits_file = os.path.join(self.preprocessed, "splits_final.json")
        self.print_to_log_file("Using splits from existing split file:", splits_file)
        with open(splits_file) as f:
            splits = json.load(f)
        self.print_to_log_file(f"The split file contains {len(splits)} splits.")
        self.print_to_log_file(f"Desired fold for training: {self.fold}")
        tr, val = splits[self.fold]["train"], splits[self.fold]["val"]
        self.print_to_log_file(
            f"This split has {len(tr)} training and {len(val)} validation cases."
        )
        return tr, val

    def initialize(self) -> None:
        torch.manual_seed(12345 + self.rank)
        self.network = DDP(TinyUNet())
        self.optimizer = torch.optim.SGD(
            self.network.parameters(), self.initial_lr, momentum=0.99, nesterov=True
        )
        config = {
            "data_identifier": "nnUNetPlans_2d",
            "preprocessor_name": "DefaultPreprocessor",
            "batch_size": self.batch_size,
            "patch_size": [SIZE, SIZE],
            "median_image_size_in_voxels": [SIZE, SIZE],
            "spacing": [0.8, 0.8],
            "normalization_schemes": ["CTNormalization"],
            "UNet_class_name": "PlainConvUNet",
            "n_conv_per_stage_encoder": [1, 1],
            "batch_dice": True,
            "num_epochs": self.num_epochs,
            "num_iterations_per_epoch": self.num_iterations_per_epoch,
        }
        if self.patience:
            config["patience"] = self.patience
            config["min_delta"] = self.min_delta
        self.print_to_log_file(
            "\nThis is the configuration used by this training:\nConfiguration name: 2d\n",
            config,
            "\n",
            add_timestamp=False,
        )
        self.print_to_log_file(
            "These are the global plan.json settings:\n",
            {
                "dataset_name": DATASET,
                "plans_name": "nnUNetPlans",
                "image_reader_writer": "NumpyIO",
            },
            "\n",
            add_timestamp=False,
        )

    def unpack_dataset(self) -> None:
        marker = os.path.join(self.planned, ".unpacked")
        if self.local_rank == 0:
            self.print_to_log_file("unpacking dataset...")
            for n, name in enumerate(sorted(os.listdir(self.planned))):
                if not name.endswith(".npz"):
                    continue
                if (
                    FAULT.freeze_unpack and n > 12
                ):  # a read from the network mount that never returns
                    threading.Event().wait()
                arrays = np.load(os.path.join(self.planned, name))
                np.save(os.path.join(self.planned, name[:-4] + ".npy"), arrays["data"])
                np.save(os.path.join(self.planned, name[:-4] + "_seg.npy"), arrays["seg"])
            open(marker, "w").close()
            self.print_to_log_file("unpacking done...")
        else:  # wait for rank 0 by its marker: a long unpacking never trips the collective timeout
            while not os.path.exists(marker):
                time.sleep(0.2)

    def get_dataloaders(self, tr: list[str], val: list[str]) -> None:
        per_rank = self.batch_size // self.world
        # nnU-Net forces foreground on the last third of the global batch: the last rank's part
        oversample = 1.0 if self.rank == self.world - 1 else 0.0
        if FAULT.shard_epochs:
            mine = np.array_split(np.array(tr), self.world)[self.rank].tolist()
            iters = -(-len(mine) // per_rank)
        else:
            mine, iters = tr[self.rank :: self.world], self.num_iterations_per_epoch
        self.iters = iters
        self.train_ds = CaseLoader(self.planned, mine, per_rank, oversample, self.rank)
        self.val_ds = CaseLoader(self.planned, val, per_rank, oversample, self.rank)
        self.train_ds.draws = list(range(1000 * self.rank, 1000 * self.rank + 100 * iters))
        self.val_ds.draws = list(range(7000 + 1000 * self.rank, 7000 + 1000 * self.rank + 100))
        self.print_to_log_file("using pin_memory on device 0")
        kw = {"batch_size": None, "num_workers": 2, "persistent_workers": True}
        self.dataloader_train = iter(DataLoader(self.train_ds, **kw))
        self.dataloader_val = iter(DataLoader(self.val_ds, **kw))

    def on_train_start(self) -> tuple[list[str], list[str]]:
        self.unpack_dataset()
        tr, val = self.do_split()
        self.get_dataloaders(tr, val)
        return tr, val

    # -- epochs --

    def train_step(self, batch: dict[str, torch.Tensor], it: int) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.network(batch["data"])
        loss = dc_and_ce_loss(logits, batch["target"])
        if FAULT.nan_check and not torch.isfinite(loss):
            raise RuntimeError(
                f"Non-finite training loss ({loss.item()}) at epoch {self.current_epoch}, "
                f"iteration {it}. Stopping training."
            )
        if self.rank == FAULT.hoard_rank and self.current_epoch == 1:
            self.hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(self.hoard) == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if self.rank == FAULT.segv_rank and self.current_epoch == 1 and it == 2:
            ctypes.string_at(0)  # the native elastic deformation dereferences NULL
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
        self.optimizer.step()
        return loss.item()

    def validation_step(self, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            logits = self.network(batch["data"])
            loss = dc_and_ce_loss(logits, batch["target"])
        pred = logits.argmax(1)
        tp, fp, fn = [], [], []
        for k in (1, 2):
            p, t = pred == k, batch["target"] == k
            tp.append((p & t).sum().item())
            fp.append((p & ~t).sum().item())
            fn.append((~p & t).sum().item())
        return {"loss": loss.item(), "tp": np.array(tp), "fp": np.array(fp), "fn": np.array(fn)}

    def gather(self, value: object) -> list:
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def run_epoch(self) -> None:
        e = self.current_epoch
        start = time.time()
        lr = self.initial_lr * (1 - e / self.num_epochs) ** 0.9
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.print_to_log_file("")
        self.print_to_log_file(f"Epoch {e}")
        self.print_to_log_file(f"Current learning rate: {np.round(lr, decimals=5)}")
        self.network.train()
        losses = [self.train_step(next(self.dataloader_train), i) for i in range(self.iters)]
        train_loss = float(np.mean(self.gather(float(np.mean(losses)))))
        self.network.eval()
        outs = [
            self.validation_step(next(self.dataloader_val))
            for _ in range(self.num_val_iterations_per_epoch)
        ]
        tp, fp, fn = (sum(o[k] for o in outs) for k in ("tp", "fp", "fn"))
        everyone = self.gather((float(np.mean([o["loss"] for o in outs])), tp, fp, fn))
        val_loss = float(np.mean([x[0] for x in everyone]))
        tp, fp, fn = (sum(x[i] for x in everyone) for i in (1, 2, 3))
        dice = [round(float(d), 4) for d in 2 * tp / np.maximum(2 * tp + fp + fn, 1)]
        mean = float(np.mean(dice))
        ema = mean if not self.logging["ema"] else 0.9 * self.logging["ema"][-1] + 0.1 * mean
        for k, v in (("train", train_loss), ("val", val_loss), ("dice", mean), ("ema", ema)):
            self.logging[k].append(v)
        if FAULT.fg_log_rank0 and self.rank == 0:  # the foreground fraction, for the log
            fg = torch.tensor([float(tp.sum() + fn.sum()), float(self.iters)])
            dist.all_reduce(fg)
            self.print_to_log_file("foreground voxels seen", int(fg[0]))
        self.print_to_log_file("train_loss", np.round(train_loss, decimals=4))
        self.print_to_log_file("val_loss", np.round(val_loss, decimals=4))
        self.print_to_log_file("Pseudo dice", dice)
        self.print_to_log_file(f"Epoch time: {np.round(time.time() - start, decimals=2)} s")
        if FAULT.plot_rank0 and self.local_rank == 0:
            self.plot_progress_png()
        if self._best_ema is None or ema > self._best_ema:
            self._best_ema = np.float64(ema)
            self.print_to_log_file(f"Yayy! New best EMA pseudo Dice: {np.round(ema, decimals=4)}")
            self.save_checkpoint("checkpoint_best.pth")
        if (e + 1) % self.save_every == 0 and e != self.num_epochs - 1:
            self.save_checkpoint("checkpoint_latest.pth")

    def plot_progress_png(self) -> None:
        import seaborn as sns  # nnU-Net's progress plot style

        sns.set(font_scale=2.5)

    def should_stop(self) -> bool:
        """Patience on the EMA pseudo Dice (every rank holds the same, from all-gathered values)."""
        if not self.patience or len(self.logging["ema"]) <= self.patience:
            return False
        best_before = max(self.logging["ema"][: -self.patience])
        return max(self.logging["ema"][-self.patience :]) < best_before + self.min_delta

    def save_checkpoint(self, name: str) -> None:
        if self.local_rank != 0:
            return
        torch.save(
            {
                "network_weights": self.network.module.state_dict(),
                "optimizer_state": self.optimizer.state_dict(),
                "grad_scaler_state": None,
                "logging": self.logging,
                "_best_ema": self._best_ema,
                "current_epoch": self.current_epoch + 1,
                "init_args": {"fold": self.fold, "trainer": self.trainer_name},
                "trainer_name": self.trainer_name,
                "inference_allowed_mirroring_axes": (0, 1),
            },
            os.path.join(self.output_folder, name),
        )

    def load_checkpoint(self, path: str) -> None:
        if FAULT.resume_cuda:  # the checkpoints come from the GPU cluster
            ckpt = torch.load(path, map_location=f"cuda:{self.local_rank}", weights_only=False)
        elif FAULT.resume_safe:
            ckpt = torch.load(path, map_location="cpu")
        else:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        self.network.module.load_state_dict(ckpt["network_weights"])
        self.optimizer.load_state_dict(ckpt["optimizer_state"])
        self.logging = ckpt["logging"]
        self._best_ema = ckpt["_best_ema"]
        self.current_epoch = ckpt["current_epoch"]

    def run_training(self) -> None:
        self.hoard: list[torch.Tensor] = []
        while self.current_epoch < self.num_epochs:
            self.run_epoch()
            self.current_epoch += 1
            stop = self.should_stop() if (not FAULT.stop_rank0 or self.rank == 0) else False
            if stop:
                self.print_to_log_file(
                    f"Early stopping: EMA pseudo Dice did not improve by {self.min_delta} "
                    f"for {self.patience} epoch(s). Best: {np.round(self._best_ema, decimals=4)}"
                )
                break
        self.on_train_end()

    def on_train_end(self) -> None:
        self.current_epoch -= 1
        self.save_checkpoint("checkpoint_final.pth")
        self.current_epoch += 1
        self.print_to_log_file("Training done.")

    def perform_actual_validation(self, val: list[str]) -> None:
        folder = os.path.join(self.output_folder, "validation")
        os.makedirs(folder, exist_ok=True)
        self.network.eval()
        mine = val[self.rank :: self.world]
        for i, case in enumerate(mine):
            self.print_to_log_file(f"predicting {case}")
            data = torch.from_numpy(np.load(os.path.join(self.planned, case + ".npy")))
            if self.rank == FAULT.slow_val_rank and i == 1:
                time.sleep(25)  # a large case: the sliding window takes its time
            with torch.no_grad():
                pred = self.network.module(data.permute(1, 0, 2, 3)).argmax(1)
            np.savez_compressed(os.path.join(folder, case + ".npz"), seg=pred.numpy())
        if self.is_ddp:
            dist.barrier()
        if self.local_rank == 0:
            scores = []
            for case in val:
                pred = np.load(os.path.join(folder, case + ".npz"))["seg"]
                ref = np.load(os.path.join(self.planned, case + "_seg.npy"))[0]
                for k in (1, 2):
                    p, t = pred == k, ref == k
                    if t.any() or p.any():
                        scores.append(2 * (p & t).sum() / (p.sum() + t.sum()))
            mean = float(np.mean(scores))
            with open(os.path.join(folder, "summary.json"), "w") as f:
                json.dump({"foreground_mean": {"Dice": mean}}, f)
            self.print_to_log_file("Validation complete")
            self.print_to_log_file("Mean Validation Dice: ", np.round(mean, decimals=4))


def run_ddp(rank: int, trainer_name: str, fold: int, num_epochs: int, cont: bool, world: int):
    """What each spawned process runs (nnU-Net's run_ddp)."""
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=TIMEOUT)
    torch.set_num_threads(1)
    trainer = ToyTrainer(trainer_name, fold, num_epochs)
    trainer.initialize()
    if cont:  # nnU-Net's maybe_load_checkpoint: final, else latest, else best
        names = ("checkpoint_final.pth", "checkpoint_latest.pth", "checkpoint_best.pth")
        found = [n for n in names if os.path.isfile(os.path.join(trainer.output_folder, n))]
        if found:
            trainer.load_checkpoint(os.path.join(trainer.output_folder, found[0]))
        else:
            print(
                "WARNING: Cannot continue training because there seems to be no checkpoint "
                "available to continue from. Starting a new training..."
            )
    _, val = trainer.on_train_start()
    trainer.run_training()
    trainer.perform_actual_validation(val)
    dist.destroy_process_group()


if __name__ == "__main__":
    make_data(sys.argv[1])
