"""A hundred-and-sixty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyfourth-*): a DNA-sequence CNN that predicts chromatin features
from 200 bp of sequence, trained the way Selene (FunctionLab/selene, selene_sdk 0.6) trains a
DeepSEA model, in a lab's fork that runs it under torchrun as the `train` rule of a Snakemake
workflow (tests/programs/hundredsixtyfourth_workflow/Snakefile): `torchrun --nnodes 1
--nproc_per_node 4 --master_addr 127.0.0.1 --master_port P --tee 3 scripts/selene_ddp.py
config/train_deepsea.yml --lr 0.08 > logs/train.log 2>&1`. Re-created in plain torch without
selene installed. Each run's workflow folder links this file as scripts/selene_ddp.py.

As in selene: `load_and_parse_configs_and_run` prints 'Running with selene_sdk version 0.6.0',
'Outputs and logs saved to outputs/deepsea' and 'Setting random seed = 1447' (or the warning
when the config has none); the "selene" logger writes '%(asctime)s - %(message)s' to stdout at
INFO (and '%(asctime)s - %(levelname)s - %(message)s' with DEBUG to the output folder's
selene_sdk.train_model.log); TrainModel logs 'Training parameters set: batch size 16, number of
steps per 'epoch': 16, maximum number of steps: 64', 'Creating validation dataset.', '0.41 s to
load 128 validation examples (8 validation batches) to evaluate after each training step.',
'[STEP 16] average number of steps per second: 14.2', 'training loss: 0.3811', 'validation
roc_auc: 0.71', 'validation average_precision: 0.33', 'validation loss: 0.35', then the test
op: 'Creating test dataset.', 'test roc_auc: ...'. Early stopping by `stopping_criteria: [roc_auc,
N]` ('Patience ran out. Stopping early.' is a DEBUG line: the console never shows it). The
fork's additions: init_process_group (gloo, the config's dist_timeout_s), DDP, each rank trains on
its own chromosomes (train_chromosomes[rank::world]) read lazily from the gzipped per-chromosome
FASTA files (resources/genome/chrN.fa.gz, as UCSC distributes them), the validation predictions
gathered from every rank so that every rank computes the same metrics and takes the same
early-stopping decision, rank 0 alone saves checkpoints and runs the test op. The sampler's
batches come from a torch DataLoader (selene's SamplerDataLoader) when the config sets
num_workers. Every rank logs, and no line names its rank.

`python selene_ddp.py --make-resources DIR` writes the synthetic genome (10 chromosomes with
planted motifs, chrom.sizes, peaks.bed, distinct_features.txt); `python selene_ddp.py --prepare
RESOURCES OUT` (the workflow's prepare rule) writes each chromosome's labelled intervals.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank)
and never printed (re-capture with tests/fixtures/real/capture_hundredsixtyfourth.sh after any
edit).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, Dataset

__version__ = "0.6.0"
CASE = os.environ.get("MT_CASE", "")
RANK = 0
STEP = -1
WINDOW = 200
STRIDE = 100
CHROM_LEN = 26000
N_CHROMS = 10
FEATURES = [
    "K562|CTCF|None",
    "GM12878|EP300|None",
    "HepG2|FOXA1|None",
    "H1-hESC|POU5F1|None",
    "K562|DNase|None",
    "HeLa-S3|CEBPB|None",
    "A549|H3K27ac|None",
    "GM12878|H3K4me3|None",
]
LEAK: list[torch.Tensor] = []

logger = logging.getLogger("selene")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the synthetic genome
def make_resources(folder: str) -> None:
    """Ten chromosomes of random sequence with each feature's motif planted at random places
    (peaks.bed), as gzipped FASTA files of 60-column lines."""
    rng = random.Random(7)
    motifs = ["".join(rng.choice("ACGT") for _ in range(10)) for _ in FEATURES]
    genome = os.path.join(folder, "genome")
    os.makedirs(genome, exist_ok=True)
    peaks = []
    for c in range(1, N_CHROMS + 1):
        seq = [rng.choice("ACGT") for _ in range(CHROM_LEN)]
        for _ in range(400):
            j = rng.randrange(len(FEATURES))
            pos = rng.randrange(0, CHROM_LEN - 10)
            seq[pos : pos + 10] = motifs[j]
            peaks.append((f"chr{c}", pos, pos + 10, FEATURES[j]))
        text = "".join(seq)
        with gzip.open(os.path.join(genome, f"chr{c}.fa.gz"), "wt") as f:
            f.write(f">chr{c}\n")
            for i in range(0, len(text), 60):
                f.write(text[i : i + 60] + "\n")
    with open(os.path.join(genome, "chrom.sizes"), "w") as f:
        for c in range(1, N_CHROMS + 1):
            f.write(f"chr{c}\t{CHROM_LEN}\n")
    with open(os.path.join(folder, "peaks.bed"), "w") as f:
        for chrom, start, end, name in sorted(peaks, key=lambda p: (int(p[0][3:]), p[1])):
            f.write(f"{chrom}\t{start}\t{end}\t{name}\n")
    with open(os.path.join(folder, "distinct_features.txt"), "w") as f:
        f.write("\n".join(FEATURES) + "\n")


def prepare(resources: str, out: str) -> None:
    """The workflow's prepare rule: every chromosome's 200 bp windows (stride 100) and the
    features whose peak lies in the window's centre (selene's GenomicFeatures query)."""
    os.makedirs(out, exist_ok=True)
    sizes = {}
    with open(os.path.join(resources, "genome", "chrom.sizes")) as f:
        for line in f:
            chrom, size = line.split()
            sizes[chrom] = int(size)
    peaks: dict[str, list[tuple[int, int]]] = {c: [] for c in sizes}
    with open(os.path.join(resources, "peaks.bed")) as f:
        for line in f:
            chrom, start, _end, name = line.rstrip("\n").split("\t")
            peaks[chrom].append((int(start), FEATURES.index(name)))
    for chrom, size in sizes.items():
        rows, positive = [], 0
        for start in range(0, size - WINDOW + 1, STRIDE):
            labels = ["0"] * len(FEATURES)
            for pos, j in peaks[chrom]:
                if start + 40 <= pos <= start + WINDOW - 50:
                    labels[j] = "1"
            positive += "1" in labels
            rows.append(f"{chrom}\t{start}\t{start + WINDOW}\t{''.join(labels)}")
        with open(os.path.join(out, f"{chrom}.intervals.tsv"), "w") as f:
            f.write("\n".join(rows) + "\n")
        print(f"{chrom}: {len(rows)} intervals, {positive} with at least one feature")
    with open(os.path.join(out, "distinct_features.txt"), "w") as f:
        f.write("\n".join(FEATURES) + "\n")
    print(f"Wrote {len(sizes)} interval files and {len(FEATURES)} features to {out}")


# ------------------------------------------------------------------ selene_sdk.sequences
BASE_TO_INDEX = np.full(256, -1, dtype=np.int64)
for _i, _b in enumerate("ACGT"):
    BASE_TO_INDEX[ord(_b)] = _i
    BASE_TO_INDEX[ord(_b.lower())] = _i


def sequence_to_encoding(sequence: str) -> np.ndarray:
    """One-hot (L, 4), N as 0.25 everywhere (selene's _fast_sequence_to_encoding)."""
    if fault("z", RANK) and STEP == 27:  # the compiled encoder on a freed buffer
        ctypes.string_at(0)
    idx = BASE_TO_INDEX[np.frombuffer(sequence.encode(), dtype=np.uint8)]
    out = np.full((len(sequence), 4), 0.25, dtype=np.float32)
    known = idx >= 0
    out[known] = 0.0
    out[np.nonzero(known)[0], idx[known]] = 1.0
    return out


class Genome:
    """Per-chromosome gzipped FASTA files, each read on first use and kept."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.chroms: dict[str, str] = {}
        self._lock = threading.Lock()

    def _load(self, chrom: str) -> str:
        path = os.path.join(self.folder, f"{chrom}.fa.gz")
        if fault("s", RANK) and chrom == "chr7":  # this node reads the genome over a slow mount
            time.sleep(25)
        parts = []
        with gzip.open(path, "rt") as f:
            for line in f:
                if not line.startswith(">"):
                    parts.append(line.rstrip())
        return "".join(parts)

    def warm(self, chroms: list[str], started: threading.Event) -> None:
        """The fork's warm-up: reads the rank's chromosomes in a thread while training starts."""
        with self._lock:
            started.set()
            for chrom in chroms:
                if chrom not in self.chroms:
                    self.chroms[chrom] = self._load(chrom)
            time.sleep(2)

    def get_encoding_from_coords(self, chrom: str, start: int, end: int) -> np.ndarray:
        with self._lock:
            if chrom not in self.chroms:
                self.chroms[chrom] = self._load(chrom)
            seq = self.chroms[chrom]
        return sequence_to_encoding(seq[start:end])


# ------------------------------------------------------------------ selene_sdk.samplers
def read_intervals(folder: str, chrom: str) -> list[tuple[str, int, int, np.ndarray]]:
    rows = []
    with open(os.path.join(folder, f"{chrom}.intervals.tsv")) as f:
        for line in f:
            c, s, e, labels = line.rstrip("\n").split("\t")
            rows.append((c, int(s), int(e), np.array([float(x) for x in labels], np.float32)))
    return rows


class IntervalsSampler(Dataset[tuple[np.ndarray, np.ndarray]]):
    """The rank's training windows in chromosome order (each chromosome's windows shuffled),
    cycled: a chromosome's sequence is read when its first window is sampled."""

    def __init__(self, genome: Genome, folder: str, chroms: list[str], seed: int) -> None:
        self.genome = genome
        rng = random.Random(seed)
        self.rows: list[tuple[str, int, int, np.ndarray]] = []
        for chrom in chroms:
            rows = read_intervals(folder, chrom)[:256]
            rng.shuffle(rows)
            self.rows += rows

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        chrom, start, end, labels = self.rows[i % len(self.rows)]
        shift = 0
        if fault("t", RANK) and STEP >= 20:  # the fork's shift augmentation
            shift = len(labels) / 2  # type: ignore[assignment]
        return self.genome.get_encoding_from_coords(chrom, start + shift, end + shift), labels


def collate(rows: list[tuple[np.ndarray, np.ndarray]], as_list: bool) -> tuple[Any, Any]:
    if as_list:  # the fork's collate before its numpy fix (a slow path torch warns about)
        return torch.Tensor([r[0] for r in rows]), torch.Tensor([r[1] for r in rows])
    return torch.from_numpy(np.stack([r[0] for r in rows])), torch.from_numpy(
        np.stack([r[1] for r in rows])
    )


def fixed_set(
    genome: Genome, folder: str, chrom: str, n: int, batch_size: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], np.ndarray]:
    rows = read_intervals(folder, chrom)[:n]
    batches = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        x = np.stack([genome.get_encoding_from_coords(c, s, e) for c, s, e, _ in chunk])
        y = np.stack([r[3] for r in chunk])
        batches.append((torch.from_numpy(x), torch.from_numpy(y)))
    return batches, np.concatenate([b[1].numpy() for b in batches])


# ------------------------------------------------------------------ the model (DeeperDeepSEA)
class DeeperDeepSEA(nn.Module):
    def __init__(self, sequence_length: int, n_targets: int) -> None:
        super().__init__()
        k = 8
        self.conv_net = nn.Sequential(
            nn.Conv1d(4, 32, kernel_size=k),
            nn.ReLU(inplace=True),
            nn.Conv1d(32, 32, kernel_size=k),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(kernel_size=4, stride=4),
            nn.Dropout(p=0.2),
            nn.Conv1d(32, 48, kernel_size=k),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(kernel_size=4, stride=4),
        )
        reduce_by = 2 * (k - 1)
        n_channels = int(((sequence_length - reduce_by) / 4 - (k - 1)) / 4)
        self.classifier = nn.Sequential(
            nn.Linear(48 * n_channels, n_targets),
            nn.ReLU(inplace=True),
            nn.Linear(n_targets, n_targets),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_net(x)
        out = out.view(out.size(0), -1)
        result: torch.Tensor = self.classifier(out)
        return result


class NonStrandSpecific(nn.Module):
    """selene_sdk.utils.NonStrandSpecific(mode='mean'): the mean over both strands."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reverse = torch.flip(x, [1, 2])
        result: torch.Tensor = (self.model(x) + self.model(reverse)) / 2
        return result


# ------------------------------------------------------------------ selene_sdk.utils
def initialize_logger(output_path: str, verbosity: int = 2) -> None:
    if logger.handlers:
        return
    logger.setLevel({0: logging.WARN, 1: logging.INFO, 2: logging.DEBUG}[verbosity])
    file_handle = logging.FileHandler(output_path)
    file_handle.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
    logger.addHandler(file_handle)
    stdout_handle = logging.StreamHandler(sys.stdout)
    stdout_handle.setFormatter(logging.Formatter("%(asctime)s - %(message)s"))
    stdout_handle.setLevel(logging.INFO)
    logger.addHandler(stdout_handle)


def metrics_logger(name: str, output_dir: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.propagate = False
    if RANK == 0:
        handle = logging.FileHandler(os.path.join(output_dir, f"{name}.txt"))
        handle.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handle)
    else:
        log.addHandler(logging.NullHandler())
    return log


def roc_auc(y: np.ndarray, p: np.ndarray) -> float:
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_precision(y: np.ndarray, p: np.ndarray) -> float:
    order = np.argsort(-p, kind="mergesort")
    hits = (y[order] > 0.5).astype(np.float64)
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / max(hits.sum(), 1))


class PerformanceMetrics:
    def __init__(self, report_gt_feature_n_positives: int) -> None:
        self.n_positives = report_gt_feature_n_positives
        self.metrics: dict[str, list[float]] = {"roc_auc": [], "average_precision": []}

    def update(self, predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
        keep = [j for j in range(targets.shape[1]) if targets[:, j].sum() >= self.n_positives]
        scores = {}
        for name, fn in (("roc_auc", roc_auc), ("average_precision", average_precision)):
            values = [fn(targets[:, j], predictions[:, j]) for j in keep]
            score = float(np.average(values)) if values else float("nan")
            self.metrics[name].append(score)
            scores[name] = score
        return scores


# ------------------------------------------------------------------ selene_sdk.TrainModel
class TrainModel:
    def __init__(self, cfg: dict[str, Any], model: nn.Module, net: nn.Module, genome: Genome):
        tm = cfg["train_model"]
        self.model, self.net, self.genome = model, net, genome
        self.criterion = nn.BCELoss()
        self.optimizer = torch.optim.SGD(
            model.parameters(), lr=cfg["lr"], momentum=0.9, weight_decay=1e-6
        )
        self.batch_size = tm["batch_size"]
        self.max_steps = tm["max_steps"]
        self.nth_step_report_stats = tm["report_stats_every_n_steps"]
        self.nth_step_save_checkpoint = tm.get("save_checkpoint_every_n_steps", 1000)
        self.output_dir = cfg["output_dir"]
        os.makedirs(self.output_dir, exist_ok=True)
        log_name = "selene_sdk.train_model.log"
        if RANK:
            log_name = f"selene_sdk.train_model.rank{RANK}.log"
        initialize_logger(os.path.join(self.output_dir, log_name), tm.get("logging_verbosity", 2))
        logger.info(
            f"Training parameters set: batch size {self.batch_size}, number of steps per 'epoch': {self.nth_step_report_stats}, "
            f"maximum number of steps: {self.max_steps}"
        )
        torch.set_num_threads(tm.get("cpu_n_threads", 1))
        self.cfg = cfg
        self.world = dist.get_world_size()
        sampler_cfg = cfg["sampler"]
        self.data_dir = sampler_cfg["intervals_dir"]
        chroms = sampler_cfg["train_chromosomes"][RANK :: self.world]
        self.dataset = IntervalsSampler(genome, self.data_dir, chroms, cfg["seed"] + RANK)
        as_list = bool(sampler_cfg.get("legacy_collate", False))
        workers = int(sampler_cfg.get("num_workers", 0))
        self.chroms = chroms
        self.loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=workers,
            collate_fn=lambda rows: collate(rows, as_list),
        )
        self._train_logger = metrics_logger("selene_sdk.train_model.train", self.output_dir)
        self._train_logger.info("loss")
        self.scheduler = ReduceLROnPlateau(self.optimizer, "min", patience=16, factor=0.8)
        self._time_per_step: list[float] = []
        self._train_loss: list[float] = []
        self._min_loss = float("inf")
        self.n_validation = tm.get("n_validation_samples", 128)
        self._create_validation_set(sampler_cfg["validation_chromosome"])
        self._validation_metrics = PerformanceMetrics(tm.get("report_gt_feature_n_positives", 2))
        self._validation_logger = metrics_logger(
            "selene_sdk.train_model.validation", self.output_dir
        )
        self._validation_logger.info("loss\taverage_precision\troc_auc")
        stopping = cfg.get("stopping_criteria")
        self._early_stopping = False
        if isinstance(stopping, list) and len(stopping) == 2:
            if stopping[0] in self._validation_metrics.metrics:
                self._early_stopping = True
                self._stopping_metric, self._stopping_patience = stopping
                self._stopping_reached = False
            else:
                logger.warning("Did not recognize stopping metric. Not performing early stopping.")
        self._local_metrics = PerformanceMetrics(10)

    def _create_validation_set(self, chrom: str) -> None:
        logger.info("Creating validation dataset.")
        t_i = time.time()
        batches, targets = fixed_set(
            self.genome, self.data_dir, chrom, self.n_validation, self.batch_size
        )
        self._validation_data = batches[RANK :: self.world]
        self._all_validation_targets = targets
        logger.info(
            f"{time.time() - t_i} s to load {len(targets)} validation examples ({len(batches)} validation batches) to evaluate after "
            "each training step."
        )

    def _checkpoint(self, step: int, is_best: bool) -> None:
        if RANK != 0:
            return
        state = {
            "step": step,
            "arch": self.net.__class__.__name__,
            "state_dict": self.net.state_dict(),
            "min_loss": self._min_loss,
            "optimizer": self.optimizer.state_dict(),
        }
        logger.debug(f"[TRAIN] {step}: Saving model state to file.")
        path = os.path.join(self.output_dir, "checkpoint.pth.tar")
        torch.save(state, path)
        if is_best:
            torch.save(state, os.path.join(self.output_dir, "best_model.pth.tar"))
            logger.debug("Updating `best_model.pth.tar`")

    def train_and_validate(self) -> None:
        global STEP
        if self.loader.num_workers:  # read the rank's chromosomes while the workers start
            started = threading.Event()
            threading.Thread(
                target=self.genome.warm, args=(self.chroms, started), daemon=True
            ).start()
            started.wait()
        batches = iter(self.loader)
        for step in range(self.max_steps):
            self.step = STEP = step
            self.train(next(batches))
            if step % self.nth_step_save_checkpoint == 0:
                self._checkpoint(step, False)
            if step and step % self.nth_step_report_stats == 0:
                self.validate()
            if self._early_stopping and self._stopping_reached:
                logger.debug("Patience ran out. Stopping early.")
                break

    def train(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        t_i = time.time()
        self.model.train()
        inputs, targets = batch
        if fault("k", RANK) and self.step >= 18:  # the fork keeps every batch's activations
            LEAK.append(torch.ones(16 << 20))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        predictions = self.model(inputs.transpose(1, 2))
        loss = self.criterion(predictions, targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self._train_loss.append(loss.item())
        self._time_per_step.append(time.time() - t_i)
        if self.step and self.step % self.nth_step_report_stats == 0:
            logger.info(
                f"[STEP {self.step}] average number of steps per second: {1.0 / np.average(self._time_per_step):.1f}"
            )
            self._train_logger.info(np.average(self._train_loss))
            logger.info(f"training loss: {np.average(self._train_loss)}")
            self._time_per_step = []
            self._train_loss = []

    def _evaluate_on_data(
        self, data: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[float, np.ndarray, np.ndarray]:
        self.model.eval()
        losses, predictions = [], []
        with torch.no_grad():
            for inputs, targets in data:
                out = self.net(inputs.transpose(1, 2))
                losses.append(self.criterion(out, targets).item())
                predictions.append(out)
        mine = torch.cat(predictions)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        loss = torch.tensor([float(np.average(losses))])
        dist.all_reduce(loss)
        everything = np.concatenate(
            [
                np.stack(
                    [g.numpy()[i * self.batch_size : (i + 1) * self.batch_size] for g in gathered]
                ).reshape(-1, mine.size(1))
                for i in range(len(predictions))
            ]
        )
        return float(loss) / self.world, everything, mine.numpy()

    def validate(self) -> None:
        validation_loss, all_predictions, mine = self._evaluate_on_data(self._validation_data)
        valid_scores = self._validation_metrics.update(
            all_predictions, self._all_validation_targets
        )
        if fault("c", RANK):  # the fork's per-feature positives count, summed over the ranks
            counts = torch.tensor(self._all_validation_targets.sum(0))
            dist.all_reduce(counts)
        for name, score in valid_scores.items():
            logger.info(f"validation {name}: {score}")
        self._validation_logger.info(
            "\t".join(
                [str(validation_loss)]
                + [str(valid_scores[k]) for k in ("average_precision", "roc_auc")]
            )
        )
        self.scheduler.step(math.ceil(validation_loss * 1000.0) / 1000.0)
        if validation_loss < self._min_loss:
            self._min_loss = validation_loss
            self._checkpoint(self.step, True)
        logger.info(f"validation loss: {validation_loss}")
        if self._early_stopping:
            history = self._validation_metrics.metrics[self._stopping_metric]
            if fault("u", RANK):  # a fork's early stop on the rank's own validation share
                local = np.concatenate([b[1].numpy() for b in self._validation_data])
                self._local_metrics.update(mine, local)
                history = self._local_metrics.metrics[self._stopping_metric]
            index = int(np.argmax(history))
            if self._stopping_patience - (len(history) - index - 1) <= 0:
                self._stopping_reached = True

    def evaluate(self) -> None:
        logger.info("Creating test dataset.")
        t_i = time.time()
        data, targets = fixed_set(
            self.genome,
            self.data_dir,
            self.cfg["sampler"]["test_chromosome"],
            self.cfg["train_model"].get("n_test_samples", 128),
            self.batch_size,
        )
        logger.info(
            f"{time.time() - t_i} s to load {len(targets)} test examples ({len(data)} test batches) to evaluate after all "
            "training steps."
        )
        self.net.eval()
        with torch.no_grad():
            predictions = np.concatenate([self.net(x.transpose(1, 2)).numpy() for x, _ in data])
        scores = PerformanceMetrics(2).update(predictions, targets)
        for name, score in scores.items():
            logger.info(f"test {name}: {score}")
        with open(os.path.join(self.output_dir, "test_performance.txt"), "w") as f:
            for name, score in scores.items():
                f.write(f"{name}\t{score}\n")


# ------------------------------------------------------------------ selene_sdk.utils.config_utils
def load_and_parse_configs_and_run(path: str, lr: float | None) -> None:
    global RANK
    with open(path) as f:
        cfg: dict[str, Any] = yaml.safe_load(f)
    print(f"Running with selene_sdk version {__version__}")
    if lr is not None:
        cfg["lr"] = lr
    if "lr" not in cfg:
        raise ValueError("Learning rate not specified, cannot fit model. Exiting.")
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.get("dist_timeout_s", 1800)))
    RANK = dist.get_rank()
    output_dir = cfg["output_dir"]
    os.makedirs(output_dir, exist_ok=True)
    print(f"Outputs and logs saved to {output_dir}")
    if "random_seed" in cfg:
        seed = cfg["random_seed"]
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        print(f"Setting random seed = {seed}")
    else:
        seed = 0
        torch.manual_seed(0)
        print(
            "Warning: no random seed specified in config file. Using a random seed ensures "
            "results are reproducible."
        )
    cfg["seed"] = seed
    targets = cfg["sampler"].get("targets", "intervals")
    if targets == "bigwig":  # coverage tracks instead of peak calls
        import pyBigWig  # noqa: F401

    genome = Genome(cfg["sampler"]["reference_sequence"])
    net = NonStrandSpecific(DeeperDeepSEA(**cfg["model"]["class_args"]))
    model = DistributedDataParallel(net)
    trainer = TrainModel(cfg, model, net, genome)
    if "train" in cfg["ops"]:
        trainer.train_and_validate()
    if "evaluate" in cfg["ops"] and RANK == 0:
        trainer.evaluate()
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--make-resources"]:
        make_resources(sys.argv[2])
        return
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description="Run Selene.")
    p.add_argument("path", help="path to the configuration file")
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    args = p.parse_args()
    load_and_parse_configs_and_run(args.path, args.lr)


if __name__ == "__main__":
    main()
