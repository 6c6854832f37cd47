#!/usr/bin/env python3
"""A sixty-second training-program style for the generalisation fixtures
(tests/fixtures/real/sixtysecond-*): a speech recipe in the way of SpeechBrain's (speechbrain is
not installed: its structure is written here in plain torch). The recipe folder holds train.py
(this file) and hparams/train.yaml (tests/programs/sixtysecond_hparams.yaml); it is started as
`python -m torch.distributed.run --nproc_per_node=3 train.py hparams/train.yaml --device=cpu
--distributed_backend=gloo --precision=fp32 --data_folder=DATA [--key=value overrides]`.
What it keeps of SpeechBrain: parse_arguments (run options and YAML overrides), a YAML with
!ref and !PLACEHOLDER, ddp_init_group, create_experiment_directory (logging set up on the main
process only: the console as '%(name)s - %(levelname)s - %(message)s', the experiment folder's
log.txt with times, its excepthook), run_on_main data preparation (CSV manifests from a
Kaldi-style feature folder) followed by a barrier, a dynamic batch sampler by length wrapped for
DDP, a Brain with fit / fit_batch / on_stage_end, every module wrapped in its own DDP, tqdm
progress bars on the main process, a FileTrainLogger writing 'epoch: 1, lr: ... - train loss:
... - valid loss: ..., valid error_rate: ...' to train_log.txt, a Checkpointer with CKPT+<date>
folders (save_and_keep_only, recover_if_possible) and an EpochCounter with an early stopper.
The task: keyword classification of synthetic 'fbank' features (a tiny CNN). A fault in the code
is chosen by the TQ_CASE environment variable (a short code), never printed; the other faults
are in what a run is given (its data folder, its experiment folder). `--make-data DIR` writes
the synthetic data set (tests/fixtures/real/capture_sixtysecond.sh).
"""

from __future__ import annotations

import bisect
import csv
import ctypes
import datetime
import logging
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from enum import Enum, auto

import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, get_worker_info
from tqdm import tqdm

logger = logging.getLogger(__name__)
core_logger = logging.getLogger("speechbrain.core")
ckpt_logger = logging.getLogger("speechbrain.utils.checkpoints")
epoch_logger = logging.getLogger("speechbrain.utils.epoch_loop")
stats_logger = logging.getLogger("speechbrain.utils.train_logger")
prep_logger = logging.getLogger("tiny_commands_prepare")
noise_logger = logging.getLogger("speechbrain.augment.preparation")

KEYWORDS = ["yes", "no", "up", "down", "left", "right"]


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    stopper_on_main: bool = False  # the early stopper is updated in the main-only stage end
    hoard_rank: int = -1  # this rank caches every batch until the OOM killer acts
    segv_rank: int = -1  # this rank's native SpecAugment kernel reads address 0
    slow_rank: int = -1  # this rank re-creates its noise cache before epoch 2
    shard_first: bool = False  # the sampler shards utterances per rank before batching
    bus_rank: int = -1  # a DataLoader worker of this rank dies of SIGBUS (/dev/shm full)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "L": Fault(stopper_on_main=True),
    "m1": Fault(hoard_rank=1),
    "v2": Fault(segv_rank=2),
    "s2": Fault(slow_rank=2),
    "u": Fault(shard_first=True),
    "b1": Fault(bus_rank=1),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]


# ----------------------------------------------------------------------------- data set
def make_data(folder: str, clicks: bool = False) -> None:
    """A Kaldi-style feature folder: feats/<utt>.pt ([frames, 20] float32), utt2num_frames and
    text (the keyword). spk1-spk4 speak slowly (40-110 frames), spk5-spk6 fast (16-40), spk7 and
    spk8 (the validation speakers) both. With clicks, four 2-4 frame recordings of spk3."""
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    os.makedirs(os.path.join(folder, "feats"), exist_ok=True)
    lengths, text = [], []
    for s in range(1, 9):
        for u in range(24):
            utt = f"spk{s}-{u:04d}"
            lo, hi = (40, 110) if s <= 4 else (16, 40) if s <= 6 else (16, 110)
            frames = rng.randint(lo, hi)
            if clicks and s == 3 and u < 4:
                frames = 2 + u % 3
            kw = rng.randrange(len(KEYWORDS))
            feats = torch.randn(frames, 20, generator=gen) * 0.5
            feats[:, 3 * kw : 3 * kw + 3] += 1.5
            torch.save(feats, os.path.join(folder, "feats", f"{utt}.pt"))
            lengths.append(f"{utt} {frames}\n")
            text.append(f"{utt} {KEYWORDS[kw]}\n")
    with open(os.path.join(folder, "utt2num_frames"), "w") as f:
        f.writelines(lengths)
    with open(os.path.join(folder, "text"), "w") as f:
        f.writelines(text)


def prepare_tiny_commands(data_folder, save_csv_train, save_csv_valid, valid_speakers, skip_prep):
    """Writes the CSV manifests (ID, duration in frames, feature file, keyword) from the data
    folder's utt2num_frames and text; an earlier run's manifests are kept."""
    if skip_prep:
        return
    if os.path.isfile(save_csv_train) and os.path.isfile(save_csv_valid):
        prep_logger.info("Preparation completed in previous run, skipping.")
        return
    with open(os.path.join(data_folder, "utt2num_frames")) as f:
        frames = dict(line.split() for line in f)
    with open(os.path.join(data_folder, "text")) as f:
        words = dict(line.split() for line in f)
    prep_logger.info(f"Creating {save_csv_train} and {save_csv_valid}")
    splits = {save_csv_train: [], save_csv_valid: []}
    for utt in sorted(frames):
        spk = utt.split("-")[0]
        dest = save_csv_valid if spk in valid_speakers else save_csv_train
        path = os.path.join("$data_root", "feats", f"{utt}.pt")
        splits[dest].append([utt, frames[utt], path, spk, words[utt]])
    for dest, rows in splits.items():
        with open(dest, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ID", "duration", "feats", "spk_id", "command"])
            w.writerows(rows)
        prep_logger.info(f"{dest} successfully created!")


class FeatureDataset(Dataset):
    """A CSV manifest's rows; an item's features are loaded when it is asked for."""

    def __init__(self, csv_path: str, data_root: str) -> None:
        with open(csv_path, newline="") as f:
            self.rows = list(csv.DictReader(f))
        self.data_root = data_root
        self.lengths = [int(r["duration"]) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        path = row["feats"].replace("$data_root", self.data_root)
        feats = torch.load(path)
        return {"id": row["ID"], "feats": feats, "label": KEYWORDS.index(row["command"])}


@dataclass
class PaddedBatch:
    id: list[str]
    feats: torch.Tensor
    lens: torch.Tensor  # relative lengths, as SpeechBrain's PaddedBatch
    label: torch.Tensor


class Collate:
    """PaddedBatch of a list of items (and the fault of a worker that runs out of /dev/shm)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.epoch = 0
        self.calls = 0

    def __call__(self, items: list[dict]) -> PaddedBatch:
        self.calls += 1
        info = get_worker_info()
        worker = info.id if info is not None else -1
        if self.rank == FAULT.bus_rank and self.epoch == 2 and worker == 1 and self.calls == 2:
            os.kill(os.getpid(), signal.SIGBUS)  # the batch no longer fits in /dev/shm
        longest = max(it["feats"].shape[0] for it in items)
        dim = items[0]["feats"].shape[1]
        feats = torch.zeros(len(items), longest, dim)
        for k, it in enumerate(items):
            feats[k, : it["feats"].shape[0]] = it["feats"]
        lens = torch.tensor([it["feats"].shape[0] / longest for it in items])
        label = torch.tensor([it["label"] for it in items])
        return PaddedBatch([it["id"] for it in items], feats, lens, label)


class DynamicBatchSampler:
    """Batches of similar length (buckets by bucket_boundaries), at most max_batch_length padded
    frames each, shuffled by epoch."""

    def __init__(self, lengths, max_batch_length, bucket_boundaries, shuffle, seed) -> None:
        self.lengths = lengths
        self.max_batch_length = max_batch_length
        self.boundaries = bucket_boundaries
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, indices: list[int] | None = None) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths))) if indices is None else list(indices)
        if self.shuffle:
            rng.shuffle(order)
        buckets: list[list[int]] = [[] for _ in range(len(self.boundaries) + 1)]
        for i in order:
            buckets[bisect.bisect_left(self.boundaries, self.lengths[i])].append(i)
        out = []
        for items in buckets:
            cur: list[int] = []
            longest = 0
            for i in items:
                if cur and max(longest, self.lengths[i]) * (len(cur) + 1) > self.max_batch_length:
                    out.append(cur)
                    cur, longest = [], 0
                cur.append(i)
                longest = max(longest, self.lengths[i])
            if cur:
                out.append(cur)
        if self.shuffle:
            rng.shuffle(out)
        return out

    def __iter__(self):
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


class DistributedSamplerWrapper:
    """This process's share of the batches: every world-th batch, the list padded to a multiple
    of the world size (or, with the shard_first fault, the batches of its own share of the
    utterances)."""

    def __init__(self, sampler: DynamicBatchSampler, rank: int, world: int) -> None:
        self.sampler = sampler
        self.rank = rank
        self.world = world

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def batches(self) -> list[list[int]]:
        if FAULT.shard_first:
            n = len(self.sampler.lengths)
            share = range(self.rank * n // self.world, (self.rank + 1) * n // self.world)
            return self.sampler.batches(list(share))
        batches = self.sampler.batches()
        while len(batches) % self.world:
            batches.append(batches[len(batches) % len(batches)])
        return batches[self.rank :: self.world]

    def __iter__(self):
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


# ----------------------------------------------------------------------------- hparams
class _Ref(str):
    pass


def _loader() -> type:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ref", lambda ld, node: _Ref(ld.construct_scalar(node)))

    def placeholder(ld, node):
        return _Placeholder()

    Loader.add_constructor("!PLACEHOLDER", placeholder)
    return Loader


class _Placeholder:
    pass


def load_hyperpyyaml(stream, overrides: dict) -> dict:
    """The YAML with overrides applied, then every !ref <key> resolved."""
    hparams = yaml.load(stream, Loader=_loader())
    hparams.update(overrides)
    for key, value in hparams.items():
        if isinstance(value, _Placeholder):
            raise ValueError(f"'{key}' is a !PLACEHOLDER and must be replaced.")

    def resolve(value):
        if isinstance(value, _Ref):
            out = str(value)
            while "<" in out:
                start = out.index("<")
                end = out.index(">", start)
                out = out[:start] + str(resolve(hparams[out[start + 1 : end]])) + out[end + 1 :]
            return out
        return value

    return {k: resolve(v) for k, v in hparams.items()}


RUN_OPTS = {
    "device": "cuda:0",
    "distributed_backend": "nccl",
    "precision": "fp32",
    "find_unused_parameters": False,
    "ddp_timeout": 7200,
    "debug": False,
}


def parse_arguments(argv: list[str]) -> tuple[str, dict, dict]:
    """hparams file, run options, YAML overrides (--key=value, the value read as YAML)."""
    hparams_file, run_opts, overrides = argv[0], dict(RUN_OPTS), {}
    for arg in argv[1:]:
        key, _, value = arg.removeprefix("--").partition("=")
        parsed = yaml.safe_load(value) if value else True
        if key in RUN_OPTS:
            run_opts[key] = parsed
        else:
            overrides[key] = parsed
    return hparams_file, run_opts, overrides


# ----------------------------------------------------------------------------- distributed
def if_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def ddp_barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def run_on_main(func, args=None, kwargs=None) -> None:
    """func on the main process only, the others wait for it at a barrier."""
    if if_main_process():
        func(*(args or []), **(kwargs or {}))
    ddp_barrier()


def ddp_init_group(run_opts: dict) -> None:
    if "RANK" not in os.environ:
        return
    dist.init_process_group(
        backend=run_opts["distributed_backend"],
        timeout=datetime.timedelta(seconds=run_opts["ddp_timeout"]),
    )


class TqdmCompatibleStreamHandler(logging.StreamHandler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:
            self.handleError(record)


def _logging_excepthook(exc_type, exc_value, exc_traceback) -> None:
    core_logger.error("Exception:", exc_info=(exc_type, exc_value, exc_traceback))


def create_experiment_directory(experiment_directory, hyperparams_to_save, overrides) -> None:
    try:
        if if_main_process():
            os.makedirs(experiment_directory, exist_ok=True)
            shutil.copy(hyperparams_to_save, os.path.join(experiment_directory, "hyperparams.yaml"))
            shutil.copy(__file__, os.path.join(experiment_directory, "train.py"))
            root = logging.getLogger()
            root.setLevel(logging.DEBUG)
            console = TqdmCompatibleStreamHandler(sys.stdout)
            console.setLevel(logging.INFO)
            console.setFormatter(logging.Formatter("%(name)s - %(levelname)s - %(message)s"))
            log_file = logging.FileHandler(os.path.join(experiment_directory, "log.txt"))
            log_file.setLevel(logging.DEBUG)
            log_file.setFormatter(
                logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s")
            )
            root.addHandler(console)
            root.addHandler(log_file)
            sys.excepthook = _logging_excepthook
            core_logger.info("Beginning experiment!")
            core_logger.info(f"Experiment folder: {experiment_directory}")
            with open(os.path.join(experiment_directory, "env.log"), "w") as f:
                f.write(f"torch=={torch.__version__}\nPython version:\n{sys.version}\n")
    finally:
        ddp_barrier()


# ----------------------------------------------------------------------------- training
class Stage(Enum):
    TRAIN = auto()
    VALID = auto()


class FileTrainLogger:
    """The experiment folder's train_log.txt, one line of stats an epoch."""

    def __init__(self, save_file: str) -> None:
        self.save_file = save_file

    @staticmethod
    def _item(key, value, dataset=None) -> str:
        if isinstance(value, float) and 1.0 < value < 100.0:
            value = f"{value:.2f}"
        elif isinstance(value, float):
            value = f"{value:.2e}"
        return f"{dataset} {key}: {value}" if dataset else f"{key}: {value}"

    def log_stats(self, stats_meta, train_stats=None, valid_stats=None) -> None:
        parts = [", ".join(self._item(k, v) for k, v in stats_meta.items())]
        for dataset, stats in (("train", train_stats), ("valid", valid_stats)):
            if stats:
                parts.append(", ".join(self._item(k, v, dataset) for k, v in stats.items()))
        line = " - ".join(parts)
        with open(self.save_file, "a") as f:
            f.write(line + "\n")
        stats_logger.info(line)


class EpochCounterWithStopper:
    def __init__(self, limit: int, limit_to_stop: int, limit_warmup: int) -> None:
        self.current = 0
        self.limit = limit
        self.limit_to_stop = limit_to_stop
        self.limit_warmup = limit_warmup
        self.best = None
        self.best_epoch = 0
        self.should_stop = False

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.current < self.limit and not self.should_stop:
            self.current += 1
            epoch_logger.info(f"Going into epoch {self.current}")
            return self.current
        raise StopIteration

    def update_metric(self, metric: float) -> None:
        if not self.limit_to_stop or self.current <= self.limit_warmup:
            return
        if self.best is None or metric < self.best:
            self.best, self.best_epoch = metric, self.current
        elif self.current - self.best_epoch >= self.limit_to_stop:
            self.should_stop = True
            epoch_logger.info(
                f"No improvement of the valid error_rate for {self.current - self.best_epoch} "
                f"epoch(s) (best {self.best:.2e} at epoch {self.best_epoch}): stopping."
            )

    def state(self) -> dict:
        return {"current": self.current, "best": self.best, "best_epoch": self.best_epoch}

    def load(self, state: dict) -> None:
        self.current, self.best, self.best_epoch = (
            state["current"],
            state["best"],
            state["best_epoch"],
        )


class Checkpointer:
    """CKPT+<date>+NN folders in save_folder: CKPT.yaml (meta) and one file a recoverable."""

    def __init__(self, checkpoints_dir: str, recoverables: dict) -> None:
        self.checkpoints_dir = checkpoints_dir
        self.recoverables = recoverables
        os.makedirs(checkpoints_dir, exist_ok=True)

    def list_checkpoints(self) -> list[tuple[str, dict]]:
        found = []
        for name in sorted(os.listdir(self.checkpoints_dir)):
            meta = os.path.join(self.checkpoints_dir, name, "CKPT.yaml")
            if name.startswith("CKPT+") and os.path.isfile(meta):
                with open(meta) as f:
                    found.append((os.path.join(self.checkpoints_dir, name), yaml.safe_load(f)))
        return found

    def recover_if_possible(self) -> None:
        found = self.list_checkpoints()
        if not found:
            ckpt_logger.info("Would load a checkpoint here, but none found yet.")
            return
        path, _meta = max(found, key=lambda c: c[1]["unixtime"])
        ckpt_logger.info(f"Loading a checkpoint from {path}")
        for name, (_save, load) in self.recoverables.items():
            load(torch.load(os.path.join(path, f"{name}.ckpt"), weights_only=False))

    def save_and_keep_only(self, meta: dict, min_keys: list[str], keep: int) -> None:
        stamp = time.strftime("%Y-%m-%d+%H-%M-%S")
        index = 0
        while os.path.exists(os.path.join(self.checkpoints_dir, f"CKPT+{stamp}+{index:02d}")):
            index += 1
        path = os.path.join(self.checkpoints_dir, f"CKPT+{stamp}+{index:02d}")
        os.makedirs(path)
        for name, (save, _load) in self.recoverables.items():
            torch.save(save(), os.path.join(path, f"{name}.ckpt"))
        with open(os.path.join(path, "CKPT.yaml"), "w") as f:
            yaml.safe_dump({**meta, "end-of-epoch": True, "unixtime": time.time()}, f)
        ckpt_logger.info(f"Saved an end-of-epoch checkpoint in {path}")
        found = self.list_checkpoints()
        key = min_keys[0]
        best = sorted(found, key=lambda c: (c[1][key], -c[1]["unixtime"]))[:keep]
        newest = max(found, key=lambda c: c[1]["unixtime"])
        for ckpt_path, _meta in found:
            if ckpt_path != newest[0] and all(ckpt_path != b[0] for b in best):
                shutil.rmtree(ckpt_path)
                ckpt_logger.info(f"Deleted checkpoint in {ckpt_path}")


class Encoder(nn.Module):
    def __init__(self, n_mels: int, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, channels, 5, stride=2)
        self.conv2 = nn.Conv1d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, F] -> [B, C]
        h = torch.relu(self.conv1(x.transpose(1, 2)))
        h = torch.relu(self.conv2(h))
        return h.mean(dim=2)


def format_order_of_magnitude(n: int) -> str:
    return f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


class KWSBrain:
    """SpeechBrain's Brain, reduced to what this recipe uses."""

    def __init__(self, modules, hparams, run_opts, checkpointer_dir) -> None:
        self.hparams = hparams
        self.rank = int(os.environ.get("RANK", "0"))
        self.distributed = dist.is_initialized()
        core_logger.info(
            f"Info: precision arg overridden by command line input to: {run_opts['precision']}"
        )
        core_logger.info(f"Gradscaler enabled: False. Using precision: {run_opts['precision']}.")
        total = sum(p.numel() for m in modules.values() for p in m.parameters())
        core_logger.info(
            f"{type(self).__name__} Model Statistics:\n"
            f"* Total Number of Trainable Parameters: {format_order_of_magnitude(total)}\n"
            f"* Total Number of Parameters: {format_order_of_magnitude(total)}\n"
            "* Trainable Parameters represent 100.0000% of the total size."
        )
        self.raw_modules = nn.ModuleDict(modules)
        self.optimizer = torch.optim.Adam(self.raw_modules.parameters(), lr=hparams["lr"])
        if self.distributed:
            self.modules = nn.ModuleDict(
                {
                    name: DDP(m, find_unused_parameters=run_opts["find_unused_parameters"])
                    for name, m in modules.items()
                }
            )
        else:
            self.modules = self.raw_modules
        self.epoch_counter = EpochCounterWithStopper(
            hparams["number_of_epochs"], hparams["limit_to_stop"], hparams["limit_warmup"]
        )
        self.train_logger = FileTrainLogger(hparams["train_log"])
        self.step = 0
        self.avg_train_loss = 0.0
        self.nonfinite_count = 0
        self.hoard: list[torch.Tensor] = []
        self.checkpointer = Checkpointer(
            checkpointer_dir,
            {
                "model": (self.raw_modules.state_dict, self.raw_modules.load_state_dict),
                "optimizer": (self.optimizer.state_dict, self.optimizer.load_state_dict),
                "counter": (self.epoch_counter.state, self.epoch_counter.load),
            },
        )

    def lr_at(self, epoch: int) -> float:
        hp = self.hparams
        frac = (epoch - 1) / max(1, hp["number_of_epochs"] - 1)
        return hp["lr"] * (hp["lr_final"] / hp["lr"]) ** frac

    def compute_forward(self, batch: PaddedBatch, stage: Stage) -> torch.Tensor:
        emb = self.modules["encoder"](batch.feats)
        return torch.log_softmax(self.modules["classifier"](emb), dim=-1)

    def compute_objectives(self, predictions, batch: PaddedBatch, stage: Stage) -> torch.Tensor:
        loss = nn.functional.nll_loss(predictions, batch.label)
        if stage != Stage.TRAIN:
            self.errors += (predictions.argmax(-1) != batch.label).sum().item()
            self.seen += len(batch.label)
        return loss

    def check_loss_isfinite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            self.nonfinite_count += 1
            if self.nonfinite_count > self.hparams["nonfinite_patience"]:
                raise ValueError(
                    "Loss is not finite and patience is exhausted. To debug, wrap `fit()` with "
                    "autograd's `detect_anomaly()`, e.g.\n\nwith torch.autograd.detect_anomaly():"
                    "\n\tbrain.fit(...)"
                )
            logger.warning("Patience not yet exhausted.")

    def fit_batch(self, batch: PaddedBatch, epoch: int) -> torch.Tensor:
        if self.rank == FAULT.segv_rank and epoch == 2 and self.step == 3:
            ctypes.string_at(0)  # the native SpecAugment kernel dereferences NULL
        predictions = self.compute_forward(batch, Stage.TRAIN)
        loss = self.compute_objectives(predictions, batch, Stage.TRAIN)
        if self.rank == FAULT.hoard_rank and epoch == 2:
            self.hoard.append(torch.ones(96, 1024, 1024, dtype=torch.uint8))  # a batch cache
            if len(self.hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        self.check_loss_isfinite(loss)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()

    def on_stage_start(self, stage: Stage, epoch: int) -> None:
        if stage == Stage.TRAIN and epoch == 2 and self.rank == FAULT.slow_rank:
            for part in range(1, 9):
                noise_logger.warning(f"Noise cache is stale, re-creating it ({part}/8)")
                time.sleep(5)
        if stage != Stage.TRAIN:
            self.errors, self.seen = 0, 0

    def on_stage_end(self, stage: Stage, stage_loss: float, epoch: int, error_rate=None) -> None:
        """VALID runs on the main process only (run_on_main)."""
        if stage == Stage.TRAIN:
            self.train_stats = {"loss": stage_loss}
            return
        stage_stats = {"loss": stage_loss, "error_rate": error_rate}
        old_lr = self.optimizer.param_groups[0]["lr"]
        self.train_logger.log_stats(
            stats_meta={"epoch": epoch, "lr": old_lr},
            train_stats=self.train_stats,
            valid_stats=stage_stats,
        )
        self.checkpointer.save_and_keep_only(
            meta={"error_rate": error_rate}, min_keys=["error_rate"], keep=self.hparams["ckpt_keep"]
        )
        if FAULT.stopper_on_main:
            self.epoch_counter.update_metric(error_rate)

    def make_loader(self, dataset: FeatureDataset, train: bool) -> tuple[DataLoader, Collate]:
        hp = self.hparams
        sampler = DynamicBatchSampler(
            dataset.lengths,
            hp["max_batch_length"],
            hp["bucket_boundaries"],
            shuffle=train and hp["shuffle"],
            seed=hp["seed"],
        )
        if self.distributed:
            sampler = DistributedSamplerWrapper(sampler, self.rank, dist.get_world_size())
        collate = Collate(self.rank)
        loader = DataLoader(
            dataset, batch_sampler=sampler, collate_fn=collate, num_workers=hp["num_workers"]
        )
        return loader, collate

    def fit(self, train_set: FeatureDataset, valid_set: FeatureDataset) -> None:
        train_loader, train_collate = self.make_loader(train_set, True)
        valid_loader, _ = self.make_loader(valid_set, False)
        self.checkpointer.recover_if_possible()
        main = if_main_process()
        for epoch in self.epoch_counter:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(epoch)
            self.on_stage_start(Stage.TRAIN, epoch)
            self.modules.train()
            train_loader.batch_sampler.set_epoch(epoch)
            train_collate.epoch = epoch
            self.avg_train_loss, self.step = 0.0, 0
            with tqdm(train_loader, initial=self.step, dynamic_ncols=True, disable=not main) as t:
                for batch in t:
                    self.step += 1
                    loss = self.fit_batch(batch, epoch)
                    self.avg_train_loss += (loss.item() - self.avg_train_loss) / self.step
                    t.set_postfix(train_loss=self.avg_train_loss)
            self.on_stage_end(Stage.TRAIN, self.avg_train_loss, epoch)

            self.on_stage_start(Stage.VALID, epoch)
            self.modules.eval()
            total, steps = 0.0, 0
            with torch.no_grad():
                for batch in tqdm(valid_loader, dynamic_ncols=True, disable=not main):
                    steps += 1
                    out = self.compute_forward(batch, Stage.VALID)
                    total += self.compute_objectives(out, batch, Stage.VALID).item()
            stats = torch.tensor([total, steps, self.errors, self.seen], dtype=torch.float64)
            if self.distributed:
                dist.all_reduce(stats)
            avg_valid_loss = stats[0].item() / stats[1].item()
            error_rate = stats[2].item() / stats[3].item()
            run_on_main(self.on_stage_end, args=[Stage.VALID, avg_valid_loss, epoch, error_rate])
            if not FAULT.stopper_on_main:
                self.epoch_counter.update_metric(error_rate)  # every process: the same metric


def dataio_prep(hparams: dict) -> dict:
    root = hparams["data_folder"]
    datasets = {
        "train": FeatureDataset(hparams["train_annotation"], root),
        "valid": FeatureDataset(hparams["valid_annotation"], root),
    }
    # the feature dimension is read from the data: the first utterance this process trains on
    sampler = DynamicBatchSampler(
        datasets["train"].lengths,
        hparams["max_batch_length"],
        hparams["bucket_boundaries"],
        hparams["shuffle"],
        hparams["seed"],
    )
    sampler.set_epoch(1)
    if dist.is_initialized():
        sampler = DistributedSamplerWrapper(sampler, dist.get_rank(), dist.get_world_size())
    first = datasets["train"][sampler.batches()[0][0]]["feats"]
    if first.shape[1] != hparams["n_mels"]:
        logger.warning(
            f"n_mels is {hparams['n_mels']} in the hparams, the features have {first.shape[1]} "
            "dimensions: using the features'"
        )
        hparams["n_mels"] = first.shape[1]
    return datasets


def main() -> None:
    if sys.argv[1:2] == ["--make-data"]:
        make_data(sys.argv[2], clicks="--clicks" in sys.argv)
        return
    hparams_file, run_opts, overrides = parse_arguments(sys.argv[1:])
    torch.set_num_threads(1)
    ddp_init_group(run_opts)
    with open(hparams_file) as fin:
        hparams = load_hyperpyyaml(fin, overrides)
    torch.manual_seed(hparams["seed"])
    create_experiment_directory(hparams["output_folder"], hparams_file, overrides)
    run_on_main(
        prepare_tiny_commands,
        kwargs={
            "data_folder": hparams["data_folder"],
            "save_csv_train": hparams["train_annotation"],
            "save_csv_valid": hparams["valid_annotation"],
            "valid_speakers": hparams["valid_speakers"],
            "skip_prep": hparams["skip_prep"],
        },
    )
    datasets = dataio_prep(hparams)
    classifier = nn.Linear(hparams["cnn_channels"], hparams["n_keywords"])
    if hparams["weight_norm"]:
        classifier = nn.utils.weight_norm(classifier)
    modules = {
        "encoder": Encoder(hparams["n_mels"], hparams["cnn_channels"]),
        "classifier": classifier,
    }
    brain = KWSBrain(modules, hparams, run_opts, hparams["save_folder"])
    brain.fit(datasets["train"], datasets["valid"])


if __name__ == "__main__":
    main()
