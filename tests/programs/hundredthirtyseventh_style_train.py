"""A hundred-and-thirty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyseventh-*): text classification trained with AllenNLP (2.10)'s
`allennlp train config.jsonnet -s SERIALIZATION_DIR`, re-created in plain torch and the standard
library in one module, without allennlp (nor tqdm) installed. Each run's folder links this file as
allennlp.py and has an `allennlp` console script (as pip installs it) that calls run(); the folder
is on PYTHONPATH the way site-packages is.

As there: the config's "distributed": {"cuda_devices": [-1, -1]} block switches the command to
distributed training (devices -1: gloo on CPU; a "timeout" of 15 s stands for the default 30
minutes). The launching process logs its params and builds the vocabulary from the training data
(a 'building vocab' bar), writes SERIALIZATION_DIR/vocabulary/, logs 'Switching to distributed
training mode since multiple GPUs are configured | Primary is at: 127.0.0.1:P | ...' and starts
one worker per device with torch.multiprocessing.spawn (no torchrun): a worker's uncaught error
comes back to it as spawn's ProcessRaisedException ('-- Process 1 terminated with the following
error:'), a worker killed by a signal as ProcessExitedException, and the other workers are
terminated. Each worker calls prepare_global_logging: every record goes to
SERIALIZATION_DIR/out_worker<rank>.log with the '<rank> | %(asctime)s - %(levelname)s - %(name)s
- %(message)s' format, and only worker 0 also logs to the console (stdout, errors to stderr). Worker
0 draws the tqdm bars (description 'accuracy: 0.5100, batch_loss: 0.6931, loss: 0.7012 ||') on
stderr and logs them through the 'tqdm' logger into its file every 10 s and at 100%; the
'loading instances' bar of the data loader is drawn by every worker. The trainer (gradient
descent) logs 'Epoch 0/2', every worker's peak memory ('Worker 1 memory usage: 301M', gathered
with all_gather), checks before every batch whether another worker has run out of data (the
'done' all_reduce: 'Worker 0 finishing training early! ...', 'Worker 1 completed its entire
epoch (training).'), validates, keeps a metric tracker with patience ('Ran out of patience.
Stopping training.'), and worker 0 saves model_state_e<N>_b0.th, training_state_e<N>_b0.th and
best.th, logs the metrics table and at the end writes metrics.json; the launching process then
archives model.tar.gz.

The model is a bag of embeddings (with a positional table of max_length rows) and a linear layer
over two labels; an optional topic head. A fault in the code is chosen by the AX_CASE environment
variable (a letter and a rank) and never printed; the others are in what a run is given (the
config, the data files, a port held by another process). `python allennlp.py --prepare DIR`
writes the synthetic data (data/train.jsonl, data/dev.jsonl).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import sys
import tarfile
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

CASE = os.environ.get("AX_CASE", "")
RANK = -1
FORMAT = "%(asctime)s - %(levelname)s - %(name)s - %(message)s"
FILE_FRIENDLY_LOGGING = False


def fault(letter: str) -> bool:
    """The case's letter, and its rank where it names one."""
    if not CASE.startswith(letter):
        return False
    rank = CASE[len(letter) :]
    return rank == "" or int(rank) == RANK


class ConfigurationError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------- allennlp/common/tqdm.py
tqdm_logger = logging.getLogger("tqdm")
tqdm_logger.propagate = False


def replace_cr_with_newline(message: str) -> str:
    message = message.replace("\r", "").replace("\n", "").replace("\x1b[A", "")
    if message and message[-1] != "\n":
        message += "\n"
    return message


class TqdmToLogsWriter:
    def __init__(self) -> None:
        self.last_message_written_time = 0.0

    def write(self, message: str) -> None:
        file_friendly_message: str | None = None
        if FILE_FRIENDLY_LOGGING:
            file_friendly_message = replace_cr_with_newline(message)
            if file_friendly_message.strip():
                sys.stderr.write(file_friendly_message)
        else:
            sys.stderr.write(message)
        # Every 10 seconds we also log the message.
        now = time.time()
        if now - self.last_message_written_time >= 10 or "100%" in message:
            if file_friendly_message is None:
                file_friendly_message = replace_cr_with_newline(message)
            for line in file_friendly_message.split("\n"):
                line = line.strip()
                if len(line) > 0:
                    tqdm_logger.info(line)
                    self.last_message_written_time = now

    def flush(self) -> None:
        sys.stderr.flush()


def _fmt_time(t: float) -> str:
    m, s = divmod(int(t), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Tqdm:
    """tqdm 4.64's default bar as it draws into a file without an encoding (ASCII '#')."""

    def __init__(self, iterable: Any, total: float | None = None, desc: str = "") -> None:
        self.iterable = iterable
        if total is None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        self.total = total
        self.desc = desc
        self.n = 0
        self.file = TqdmToLogsWriter()
        self.mininterval = 2.0 if FILE_FRIENDLY_LOGGING else 0.1
        self.start = time.time()
        self.last_print = 0.0
        self.closed = False
        self.display()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc
        if refresh:
            self.display()

    def format(self) -> str:
        elapsed = time.time() - self.start
        rate = self.n / elapsed if elapsed > 0 else None
        if rate is None or self.n == 0:
            rate_fmt = "?it/s"
        elif rate >= 1:
            rate_fmt = f"{rate:5.2f}it/s"
        else:
            rate_fmt = f"{1 / rate:5.2f}s/it"
        prefix = f"{self.desc}: " if self.desc else ""
        if self.total is None or self.total == float("inf"):
            return f"{prefix}{self.n}it [{_fmt_time(elapsed)}, {rate_fmt}]"
        total = int(self.total)
        frac = self.n / total if total else 1.0
        filled = int(frac * 10)
        digit = int(frac * 100) % 10
        bar = "#" * filled + (str(digit) if digit and filled < 10 else "")
        bar = bar.ljust(10)
        remaining = "?" if not rate else _fmt_time((total - self.n) / rate)
        return (
            f"{prefix}{frac * 100:3.0f}%|{bar}| {self.n}/{total} "
            f"[{_fmt_time(elapsed)}<{remaining}, {rate_fmt}]"
        )

    def display(self) -> None:
        self.file.write("\r" + self.format())
        self.file.flush()
        self.last_print = time.time()

    def __iter__(self) -> Any:
        try:
            for item in self.iterable:
                yield item
                self.n += 1
                if time.time() - self.last_print >= self.mininterval:
                    self.display()
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.display()
            self.file.write("\n")


# ---------------------------------------------------------------- allennlp/common/logging.py
class ErrorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def prepare_global_logging(serialization_dir: str, rank: int = 0, world_size: int = 1) -> None:
    root_logger = logging.getLogger()
    if world_size == 1:
        log_file = os.path.join(serialization_dir, "out.log")
        formatter = logging.Formatter(FORMAT)
    else:
        log_file = os.path.join(serialization_dir, f"out_worker{rank}.log")
        formatter = logging.Formatter(f"{rank} | {FORMAT}")
    file_handler = logging.FileHandler(log_file)
    stdout_handler = logging.StreamHandler(sys.stdout)
    stderr_handler = logging.StreamHandler(sys.stderr)
    for handler in (file_handler, stdout_handler, stderr_handler):
        handler.setFormatter(formatter)
    for old in list(root_logger.handlers):
        root_logger.removeHandler(old)
    level = logging.INFO
    file_handler.setLevel(level)
    stdout_handler.setLevel(level)
    stdout_handler.addFilter(ErrorFilter())
    stderr_handler.setLevel(logging.ERROR)
    root_logger.setLevel(level)
    root_logger.addHandler(file_handler)
    if rank == 0:
        root_logger.addHandler(stdout_handler)
        root_logger.addHandler(stderr_handler)

    def excepthook(exctype: Any, value: Any, traceback: Any) -> None:
        if issubclass(exctype, KeyboardInterrupt):
            sys.__excepthook__(exctype, value, traceback)
            return
        root_logger.critical("Uncaught exception", exc_info=(exctype, value, traceback))

    sys.excepthook = excepthook
    tqdm_logger.addHandler(file_handler)


# ---------------------------------------------------------------- allennlp/common/params.py, util.py
params_logger = logging.getLogger("allennlp.common.params")
util_logger = logging.getLogger("allennlp.common.util")


def log_params(prefix: str, d: dict[str, Any]) -> None:
    for k, v in d.items():
        if isinstance(v, dict):
            log_params(f"{prefix}{k}.", v)
        else:
            params_logger.info("%s%s = %s", prefix, k, v)


def format_size(size: int) -> str:
    gbs = size / (1024 * 1024 * 1024)
    if gbs >= 10:
        return f"{round(gbs):d}G"
    if gbs >= 1:
        return f"{round(gbs, 1):.1f}G"
    mbs = size / (1024 * 1024)
    if mbs >= 10:
        return f"{round(mbs):d}M"
    if mbs >= 1:
        return f"{round(mbs, 1):.1f}M"
    return f"{size}B"


def peak_cpu_memory() -> dict[int, int]:
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        mine = torch.tensor([dist.get_rank(), peak_bytes])
        gather_results = [torch.tensor([0, 0]) for _ in range(world_size)]
        dist.all_gather(gather_results, mine)
        return {int(t[0]): int(t[1]) for t in gather_results}
    return {0: peak_bytes}


def prepare_environment(params: dict[str, Any]) -> None:
    seed = params.get("random_seed", 13370)
    params_logger.info("random_seed = %s", seed)
    params_logger.info("numpy_seed = %s", params.get("numpy_seed", 1337))
    params_logger.info("pytorch_seed = %s", params.get("pytorch_seed", 133))
    random.seed(seed)
    torch.manual_seed(params.get("pytorch_seed", 133))


def dump_metrics(file_path: str, metrics: dict[str, Any], log: bool = False) -> None:
    metrics_json = json.dumps(metrics, indent=2)
    with open(file_path, "w") as f:
        f.write(metrics_json)
    if log:
        util_logger.info("Metrics: %s", metrics_json)


# ---------------------------------------------------------------- allennlp/data
vocab_logger = logging.getLogger("allennlp.data.vocabulary")
reader_logger = logging.getLogger("allennlp.data.dataset_readers.dataset_reader")
loader_logger = logging.getLogger("allennlp.data.data_loaders.multiprocess_data_loader")
DEFAULT_PADDING, DEFAULT_OOV = "@@PADDING@@", "@@UNKNOWN@@"
_READ_LOCK = threading.Lock()


class Vocabulary:
    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, int]] = {
            "tokens": {DEFAULT_PADDING: 0, DEFAULT_OOV: 1},
            "labels": {},
            "topics": {},
        }
        self.non_padded = {"labels", "topics"}

    def add(self, namespace: str, token: str) -> None:
        space = self.tokens[namespace]
        if token not in space:
            space[token] = len(space)

    def get_token_index(self, token: str, namespace: str) -> int:
        try:
            return self.tokens[namespace][token]
        except KeyError:
            try:
                return self.tokens[namespace][DEFAULT_OOV]
            except KeyError:
                vocab_logger.error("Namespace: %s", namespace)
                vocab_logger.error("Token: %s", token)
                raise KeyError(
                    f"'{token}' not found in vocab namespace '{namespace}', and namespace "
                    f"does not contain the default OOV token ('{DEFAULT_OOV}')"
                ) from None

    def get_vocab_size(self, namespace: str) -> int:
        return len(self.tokens[namespace])

    def save_to_files(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "non_padded_namespaces.txt"), "w") as f:
            f.write("*tags\n*labels\n")
        for namespace, space in self.tokens.items():
            with open(os.path.join(directory, f"{namespace}.txt"), "w") as f:
                for token in space:
                    if namespace in self.non_padded or token != DEFAULT_PADDING:
                        f.write(token + "\n")

    @classmethod
    def from_files(cls, directory: str) -> Vocabulary:
        vocab_logger.info("Loading token dictionary from %s.", directory)
        vocab = cls()
        for namespace in vocab.tokens:
            with open(os.path.join(directory, f"{namespace}.txt")) as f:
                for line in f:
                    vocab.add(namespace, line.rstrip("\n"))
        return vocab


class TextClassificationJsonReader:
    """Reads 'sentence'/'label' (and an optional 'topic') JSON lines; in a distributed run each
    worker keeps every world_size-th line from its rank on (DatasetReader._multi_worker_islice)."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size

    def read(self, file_path: str) -> Any:
        reader_logger.info("Reading instances from lines in file at: %s", file_path)
        with open(file_path) as f:
            for i, line in enumerate(f):
                if i % self.world_size != self.rank:
                    continue
                if fault("v"):  # a worker whose copy of the data sits on a slow mount
                    time.sleep(0.6)
                if fault("l"):  # a worker whose reader waits on a lock it already holds
                    with _READ_LOCK, _READ_LOCK:
                        pass
                item = json.loads(line)
                yield {
                    "tokens": item["sentence"].split(),
                    "label": item["label"],
                    "topic": item.get("topic"),
                }


class MultiProcessDataLoader:
    def __init__(self, reader: Any, data_path: str, batch_size: int, shuffle: bool) -> None:
        self.reader, self.data_path = reader, data_path
        self.batch_size, self.shuffle = batch_size, shuffle
        self.vocab: Vocabulary | None = None
        self.instances: list[dict[str, Any]] | None = None

    def index_with(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    def _load(self) -> list[dict[str, Any]]:
        if self.instances is None:
            assert self.vocab is not None
            instances = []
            for inst in Tqdm(self.reader.read(self.data_path), desc="loading instances"):
                inst["token_ids"] = [
                    self.vocab.get_token_index(t, "tokens") for t in inst["tokens"]
                ]
                inst["label_id"] = self.vocab.get_token_index(inst["label"], "labels")
                if inst["topic"] is not None:
                    inst["topic_id"] = self.vocab.get_token_index(inst["topic"], "topics")
                instances.append(inst)
            self.instances = instances
        return self.instances

    def __len__(self) -> int:
        return math.ceil(len(self._load()) / self.batch_size)

    def __iter__(self) -> Any:
        instances = list(self._load())
        if self.shuffle:
            random.shuffle(instances)
        for k in range(0, len(instances), self.batch_size):
            chunk = instances[k : k + self.batch_size]
            width = max(len(i["token_ids"]) for i in chunk)
            tokens = torch.zeros(len(chunk), width, dtype=torch.long)
            for row, inst in enumerate(chunk):
                tokens[row, : len(inst["token_ids"])] = torch.tensor(inst["token_ids"])
            batch = {"tokens": tokens, "label": torch.tensor([i["label_id"] for i in chunk])}
            topics = [i["topic_id"] for i in chunk if "topic_id" in i]
            if topics:
                batch["topic"] = torch.tensor(topics)
                batch["topic_rows"] = torch.tensor(
                    [r for r, i in enumerate(chunk) if "topic_id" in i]
                )
            yield batch


# ---------------------------------------------------------------- allennlp/training/metrics
def _reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


class CategoricalAccuracy:
    def __init__(self) -> None:
        self.correct, self.total = 0.0, 0.0

    def __call__(self, logits: torch.Tensor, gold: torch.Tensor) -> None:
        self.correct += float((logits.argmax(-1) == gold).sum())
        self.total += float(gold.numel())

    def get_metric(self, reset: bool) -> float:
        t = _reduce(torch.tensor([self.correct, self.total]))
        acc = float(t[0] / t[1]) if t[1] > 0 else 0.0
        if reset:
            self.correct, self.total = 0.0, 0.0
        return acc


class SeenLabelF1:
    """A fork's per-label F1: it reduces the counts of the labels this worker has seen."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.counts: dict[int, list[float]] = {}

    def __call__(self, logits: torch.Tensor, gold: torch.Tensor) -> None:
        pred = logits.argmax(-1)
        for g, p in zip(gold.tolist(), pred.tolist(), strict=True):
            self.counts.setdefault(g, [0.0, 0.0, 0.0])
            if g == p:
                self.counts[g][0] += 1
            else:
                if p in self.counts:
                    self.counts[p][1] += 1
                self.counts[g][2] += 1

    def get_metric(self, reset: bool) -> dict[str, float]:
        out = {}
        for label in sorted(self.counts):
            t = _reduce(torch.tensor(self.counts[label]))
            tp, fp, fn = (float(x) for x in t)
            out[f"{self.labels[label]}-f1"] = 2 * tp / max(2 * tp + fp + fn, 1.0)
        if reset:
            self.counts = {}
        return out


# ---------------------------------------------------------------- allennlp/models/basic_classifier.py
class BasicClassifier(nn.Module):
    def __init__(
        self,
        vocab: Vocabulary,
        embedding_dim: int = 16,
        max_length: int = 64,
        topic_head: bool = False,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self._embedder = nn.Embedding(vocab.get_vocab_size("tokens"), embedding_dim, padding_idx=0)
        self._positions = nn.Embedding(max_length, embedding_dim)
        num_labels = vocab.get_vocab_size("labels")
        self._classification_layer = nn.Linear(embedding_dim, num_labels)
        self._topic_layer = (
            nn.Linear(embedding_dim, max(vocab.get_vocab_size("topics"), 1)) if topic_head else None
        )
        self._accuracy = CategoricalAccuracy()
        labels = list(vocab.tokens["labels"])
        self._f1 = SeenLabelF1(labels) if fault("f") else None

    def forward(
        self,
        tokens: torch.Tensor,
        label: torch.Tensor,
        topic: torch.Tensor | None = None,
        topic_rows: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        mask = (tokens != 0).float().unsqueeze(-1)
        positions = torch.arange(tokens.size(1))
        embedded = self._embedder(tokens) + self._positions(positions).unsqueeze(0)
        encoded = (embedded * mask).sum(1) / mask.sum(1).clamp(min=1)
        logits = self._classification_layer(encoded)
        loss = F.cross_entropy(logits, label)
        if self._topic_layer is not None and topic is not None and topic_rows is not None:
            loss = loss + 0.5 * F.cross_entropy(self._topic_layer(encoded[topic_rows]), topic)
        self._accuracy(logits, label)
        if self._f1 is not None:
            self._f1(logits, label)
        return {"logits": logits, "loss": loss}

    def get_metrics(self, reset: bool = False) -> dict[str, float]:
        metrics = {"accuracy": self._accuracy.get_metric(reset)}
        if self._f1 is not None:
            metrics.update(self._f1.get_metric(reset))
        return metrics


# ---------------------------------------------------------------- allennlp/training
trainer_logger = logging.getLogger("allennlp.training.gradient_descent_trainer")
console_logger = logging.getLogger("allennlp.training.callbacks.console_logger")
checkpoint_logger = logging.getLogger("allennlp.training.checkpointer")


def get_metrics(
    model: BasicClassifier,
    total_loss: float,
    batch_loss: float | None,
    num_batches: int,
    reset: bool = False,
    world_size: int = 1,
    reduce_loss: bool = True,
) -> dict[str, float]:
    metrics = model.get_metrics(reset=reset)
    if batch_loss is not None:
        metrics["batch_loss"] = batch_loss
    if world_size > 1 and reduce_loss:
        t = _reduce(torch.tensor([total_loss, float(num_batches)]))
        total_loss, num_batches = float(t[0]), int(t[1])
    metrics["loss"] = float(total_loss / num_batches) if num_batches > 0 else 0.0
    return metrics


def description_from_metrics(metrics: dict[str, float]) -> str:
    return (
        ", ".join(f"{name}: {value:.4f}" for name, value in metrics.items() if name[0] != "_")
        + " ||"
    )


class MetricTracker:
    def __init__(self, metric_name: str, patience: int | None) -> None:
        self.sign = -1.0 if metric_name.startswith("-") else 1.0
        self.name = metric_name[1:]
        self.patience = patience
        self.best: float | None = None
        self.best_epoch = 0
        self.epochs_with_no_improvement = 0
        self.is_best_so_far = False

    def add_metrics(self, metrics: dict[str, float], epoch: int) -> None:
        value = self.sign * metrics[self.name]
        if self.best is None or value > self.best:
            self.best, self.best_epoch = value, epoch
            self.epochs_with_no_improvement = 0
            self.is_best_so_far = True
        else:
            self.epochs_with_no_improvement += 1
            self.is_best_so_far = False

    def should_stop_early(self) -> bool:
        return self.patience is not None and self.epochs_with_no_improvement >= self.patience


class GradientDescentTrainer:
    def __init__(
        self,
        model: BasicClassifier,
        serialization_dir: str,
        data_loader: MultiProcessDataLoader,
        validation_data_loader: MultiProcessDataLoader,
        num_epochs: int,
        patience: int | None,
        validation_metric: str,
        lr: float,
        world_size: int,
    ) -> None:
        self.model = model
        self._serialization_dir = serialization_dir
        self.data_loader = data_loader
        self._validation_data_loader = validation_data_loader
        self._num_epochs = num_epochs
        self._world_size = world_size
        self._distributed = world_size > 1
        self._rank = dist.get_rank() if self._distributed else 0
        self._primary = self._rank == 0
        self._pytorch_model: nn.Module = (
            DistributedDataParallel(model, find_unused_parameters=False)
            if self._distributed
            else model
        )
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self._metric_tracker = MetricTracker(validation_metric, patience)
        self._grab: list[torch.Tensor] = []  # a cache that only grows

    def _done(self, value: int) -> int:
        done = torch.tensor(value)
        dist.all_reduce(done, dist.ReduceOp.SUM)
        return int(done.item())

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        trainer_logger.info("Epoch %d/%d", epoch, self._num_epochs - 1)
        for worker, memory in peak_cpu_memory().items():
            trainer_logger.info(f"Worker {worker} memory usage: {format_size(memory)}")
        train_loss = 0.0
        self._pytorch_model.train()
        trainer_logger.info("Training")
        num_training_batches = len(self.data_loader)
        batches: Any = self.data_loader
        if self._primary:
            batches = Tqdm(self.data_loader, total=num_training_batches)
        batches_this_epoch = 0
        done_early = False
        check = self._distributed and not fault("d")  # a fork without the 'done' handshake
        for k, batch in enumerate(batches):
            if check and self._done(0) > 0:
                done_early = True
                trainer_logger.warning(
                    f"Worker {dist.get_rank()} finishing training early! "
                    "This implies that there is an imbalance in your training "
                    "data across the workers and that some amount of it will be "
                    "ignored. A small amount of this is fine, but a major imbalance "
                    "should be avoided. Note: This warning will appear unless your "
                    "data is perfectly balanced."
                )
                break
            if fault("m") and epoch >= 1:  # a RAM cache that keeps every batch's features
                self._grab.append(torch.ones(16 * 1024 * 1024))
                if len(self._grab) >= 4:
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault("s") and epoch == 1 and k == 3:  # a compiled tokenizer extension
                ctypes.string_at(0)
            batches_this_epoch += 1
            self.optimizer.zero_grad()
            output = self._pytorch_model(**batch)
            loss = output["loss"]
            if torch.isnan(loss):
                raise ValueError("nan loss encountered")
            loss.backward()
            batch_loss = loss.item()
            train_loss += batch_loss
            self.optimizer.step()
            metrics = get_metrics(
                self.model, train_loss, batch_loss, batches_this_epoch, world_size=1
            )
            if self._primary:
                batches.set_description(description_from_metrics(metrics), refresh=False)
        if check and not done_early:
            trainer_logger.warning(
                f"Worker {dist.get_rank()} completed its entire epoch (training)."
            )
            assert self._done(1)
        if self._distributed:
            dist.barrier()
        metrics = get_metrics(
            self.model,
            train_loss,
            None,
            batches_this_epoch,
            reset=True,
            world_size=self._world_size,
        )
        for worker, memory in peak_cpu_memory().items():
            metrics["worker_" + str(worker) + "_memory_MB"] = memory / (1024 * 1024)
        return metrics

    def _validation_loss(self) -> tuple[float, int]:
        trainer_logger.info("Validating")
        self._pytorch_model.eval()
        batches: Any = self._validation_data_loader
        if self._primary:
            batches = Tqdm(self._validation_data_loader)
        val_loss, n = 0.0, 0
        done_early = False
        check = self._distributed and not fault("d")
        with torch.no_grad():
            for batch in batches:
                if check and self._done(0) > 0:
                    done_early = True
                    trainer_logger.warning(
                        f"Worker {dist.get_rank()} finishing validation early! "
                        "This implies that there is an imbalance in your validation "
                        "data across the workers and that some amount of it will be "
                        "ignored. A small amount of this is fine, but a major imbalance "
                        "should be avoided. Note: This warning will appear unless your "
                        "data is perfectly balanced."
                    )
                    break
                loss = self._pytorch_model(**batch)["loss"]
                val_loss += loss.item()
                n += 1
                metrics = get_metrics(self.model, val_loss, loss.item(), n, world_size=1)
                if self._primary:
                    batches.set_description(description_from_metrics(metrics), refresh=False)
            if check and not done_early:
                trainer_logger.warning(
                    f"Worker {dist.get_rank()} completed its entire epoch (validation)."
                )
                assert self._done(1)
        return val_loss, n

    def _save(self, epoch: int, is_best: bool) -> None:
        d = self._serialization_dir
        model_path = os.path.join(d, f"model_state_e{epoch}_b0.th")
        torch.save(self.model.state_dict(), model_path)
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "epoch": epoch},
            os.path.join(d, f"training_state_e{epoch}_b0.th"),
        )
        if is_best:
            trainer_logger.info(
                "Best validation performance so far. Copying weights to '%s/best.th'.", d
            )
            shutil.copyfile(model_path, os.path.join(d, "best.th"))
        for old in range(epoch - 1):
            for kind in ("model_state", "training_state"):
                path = os.path.join(d, f"{kind}_e{old}_b0.th")
                if os.path.exists(path):
                    os.remove(path)

    def _log_table(self, train: dict[str, float], val: dict[str, float]) -> None:
        names = sorted(set(train) | set(val))
        width = max(len(x) for x in names)
        console_logger.info("%s |  %-10s", "Training".rjust(width + 13), "Validation")
        for name in names:
            t, v = train.get(name), val.get(name)
            if t is not None and v is not None:
                console_logger.info("%s |  %8.3f  |  %8.3f", name.ljust(width), t, v)
            elif t is not None:
                console_logger.info("%s |  %8.3f  |  %8s", name.ljust(width), t, "N/A")

    def train(self) -> dict[str, Any]:
        trainer_logger.info("Beginning training.")
        metrics: dict[str, Any] = {}
        training_start = time.time()
        epoch = 0
        for epoch in range(self._num_epochs):
            epoch_start = time.time()
            train_metrics = self._train_epoch(epoch)
            val_loss, n = self._validation_loss()
            if self._distributed:
                dist.barrier()
            local = fault("p")  # a fork's tracker fed with the worker's own validation loss
            val_metrics = get_metrics(
                self.model,
                val_loss,
                None,
                n,
                reset=True,
                world_size=self._world_size,
                reduce_loss=not local,
            )
            self._metric_tracker.add_metrics(val_metrics, epoch)
            metrics["training_duration"] = str(timedelta(seconds=time.time() - training_start))
            metrics["epoch"] = epoch
            for key, value in train_metrics.items():
                metrics["training_" + key] = value
            for key, value in val_metrics.items():
                metrics["validation_" + key] = value
            if self._metric_tracker.is_best_so_far:
                metrics["best_epoch"] = epoch
                for key, value in val_metrics.items():
                    metrics["best_validation_" + key] = value
            if self._primary:
                self._log_table(train_metrics, val_metrics)
                dump_metrics(
                    os.path.join(self._serialization_dir, f"metrics_epoch_{epoch}.json"), metrics
                )
                self._save(epoch, self._metric_tracker.is_best_so_far)
            trainer_logger.info("Epoch duration: %s", timedelta(seconds=time.time() - epoch_start))
            if self._metric_tracker.should_stop_early():
                trainer_logger.info("Ran out of patience. Stopping training.")
                break
            if epoch < self._num_epochs - 1:
                elapsed = time.time() - training_start
                remaining = elapsed / (epoch + 1) * (self._num_epochs - epoch - 1)
                trainer_logger.info(
                    "Estimated training time remaining: %s", timedelta(seconds=int(remaining))
                )
        best = os.path.join(self._serialization_dir, "best.th")
        if self._primary and os.path.exists(best):
            trainer_logger.info("Loading best weights from '%s'", best)
            self.model.load_state_dict(torch.load(best, map_location="cpu"))
        return metrics


# ---------------------------------------------------------------- allennlp/commands/train.py
train_logger = logging.getLogger("allennlp.commands.train")


def read_config(path: str) -> dict[str, Any]:
    with open(path) as f:
        lines = [ln for ln in f if not ln.lstrip().startswith("//")]
    params: dict[str, Any] = json.loads("".join(lines))
    return params


def make_vocab_from_params(params: dict[str, Any], serialization_dir: str) -> Vocabulary:
    sources = params.get("datasets_for_vocab_creation", ["train", "validation"])
    train_logger.info(
        "From dataset instances, %s will be considered for vocabulary creation.",
        ", ".join(sources),
    )
    vocab_logger.info("Fitting token dictionary from dataset.")
    vocab = Vocabulary()
    reader = TextClassificationJsonReader()
    paths = {"train": params["train_data_path"], "validation": params["validation_data_path"]}
    instances: list[dict[str, Any]] = []
    for source in sources:
        instances.extend(Tqdm(reader.read(paths[source]), desc="loading instances"))
    for inst in Tqdm(instances, desc="building vocab"):
        for t in inst["tokens"]:
            vocab.add("tokens", t)
        vocab.add("labels", inst["label"])
        if inst["topic"] is not None:
            vocab.add("topics", inst["topic"])
    vocab.save_to_files(os.path.join(serialization_dir, "vocabulary"))
    return vocab


def _train_worker(
    process_rank: int,
    params: dict[str, Any],
    serialization_dir: str,
    primary_addr: str,
    primary_port: int,
    world_size: int,
    device_ids: list[int],
) -> None:
    global RANK
    RANK = process_rank
    prepare_global_logging(serialization_dir, rank=process_rank, world_size=world_size)
    prepare_environment(params)
    timeout = timedelta(seconds=params["distributed"].get("timeout", 1800))
    os.environ["ALLENNLP_PROCS_PER_NODE"] = str(len(device_ids))
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://{primary_addr}:{primary_port}",
        world_size=world_size,
        rank=process_rank,
        timeout=timeout,
    )
    logging.info(
        f"Process group of world size {world_size} initialized "
        f"for distributed training in worker {process_rank}"
    )
    vocab = Vocabulary.from_files(os.path.join(serialization_dir, "vocabulary"))
    reader = TextClassificationJsonReader(process_rank, world_size)
    loader_params = params["data_loader"]
    train_loader = MultiProcessDataLoader(
        reader, params["train_data_path"], loader_params["batch_size"], shuffle=True
    )
    val_loader = MultiProcessDataLoader(
        reader, params["validation_data_path"], loader_params["batch_size"], shuffle=False
    )
    train_loader.index_with(vocab)
    val_loader.index_with(vocab)
    m = params["model"]
    model = BasicClassifier(
        vocab,
        embedding_dim=m.get("embedding_dim", 16),
        max_length=m.get("max_length", 64),
        topic_head=m.get("topic_head", False),
    )
    t = params["trainer"]
    trainer = GradientDescentTrainer(
        model,
        serialization_dir,
        train_loader,
        val_loader,
        num_epochs=t["num_epochs"],
        patience=t.get("patience"),
        validation_metric=t.get("validation_metric", "-loss"),
        lr=t["optimizer"]["lr"],
        world_size=world_size,
    )
    dist.barrier()
    metrics = trainer.train()
    if process_rank == 0:
        dump_metrics(os.path.join(serialization_dir, "metrics.json"), metrics, log=True)


def archive_model(serialization_dir: str) -> None:
    archive = os.path.join(serialization_dir, "model.tar.gz")
    logging.getLogger("allennlp.models.archival").info(
        "archiving weights and vocabulary to %s", archive
    )
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(os.path.join(serialization_dir, "config.json"), arcname="config.json")
        tar.add(os.path.join(serialization_dir, "best.th"), arcname="weights.th")
        tar.add(os.path.join(serialization_dir, "vocabulary"), arcname="vocabulary")


def train_model(params: dict[str, Any], serialization_dir: str, force: bool) -> None:
    if os.path.exists(serialization_dir) and os.listdir(serialization_dir) and not force:
        raise ConfigurationError(
            f"Serialization directory ({serialization_dir}) already exists and is "
            f"not empty. Specify --recover to recover from an existing output folder."
        )
    os.makedirs(serialization_dir, exist_ok=True)
    with open(os.path.join(serialization_dir, "config.json"), "w") as f:
        json.dump(params, f, indent=4)
    log_params("", {k: v for k, v in params.items() if k != "distributed"})
    distributed = params.get("distributed")
    if distributed is None:
        raise ConfigurationError("this re-creation trains distributed only")
    device_ids = distributed.get("cuda_devices")
    if not (isinstance(device_ids, list) and len(device_ids) > 1):
        raise ConfigurationError(
            "Multiple cuda devices/nodes need to be configured to run distributed training."
        )
    primary_addr = distributed.get("primary_address", "127.0.0.1")
    primary_port = distributed.get("primary_port", 29500)
    num_procs = len(device_ids)
    world_size = num_procs
    make_vocab_from_params(params, serialization_dir)
    logging.info(
        "Switching to distributed training mode since multiple GPUs are configured | "
        f"Primary is at: {primary_addr}:{primary_port} | Rank of this node: 0 | "
        f"Number of workers in this node: {num_procs} | Number of nodes: 1 | "
        f"World size: {world_size}"
    )
    mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        _train_worker,
        args=(params, serialization_dir, primary_addr, primary_port, world_size, device_ids),
        nprocs=num_procs,
    )
    archive_model(serialization_dir)


def main(prog: str = "allennlp") -> None:
    parser = argparse.ArgumentParser(prog=prog, description="Run AllenNLP")
    parser.add_argument("--version", action="version", version=f"{prog} 2.10.1")
    sub = parser.add_subparsers(title="Commands", metavar="")
    train = sub.add_parser(
        "train", description="Train the specified model on the specified dataset."
    )
    train.add_argument("param_path", type=str)
    train.add_argument("-s", "--serialization-dir", required=True, type=str)
    train.add_argument("-f", "--force", action="store_true")
    train.add_argument("--file-friendly-logging", action="store_true")
    args = parser.parse_args()
    if not hasattr(args, "param_path"):
        parser.print_help()
        return
    global FILE_FRIENDLY_LOGGING
    FILE_FRIENDLY_LOGGING = args.file_friendly_logging
    params = read_config(args.param_path)
    train_model(params, args.serialization_dir, args.force)


def run() -> None:
    logging.basicConfig(format=FORMAT, level=logging.INFO)
    mp.set_start_method("spawn", force=True)
    main(prog="allennlp")


# ---------------------------------------------------------------- the synthetic data
POS = ["great", "good", "fun", "lovely", "superb", "warm", "moving", "clever"]
NEG = ["bad", "dull", "awful", "boring", "poor", "cold", "flat", "clumsy"]
FILL = ["the", "movie", "film", "plot", "cast", "was", "a", "very", "and", "it", "story", "ending"]


def prepare(root: str, n_train: int = 208, n_dev: int = 64) -> None:
    rng = random.Random(0)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    for name, n in (("train", n_train), ("dev", n_dev)):
        with open(os.path.join(root, "data", f"{name}.jsonl"), "w") as f:
            for _ in range(n):
                label = rng.choice(["pos", "neg"])
                words = rng.sample(FILL, rng.randint(4, 8))
                words += rng.sample(POS if label == "pos" else NEG, rng.randint(1, 3))
                if rng.random() < 0.2:
                    words.append(rng.choice(NEG if label == "pos" else POS))
                rng.shuffle(words)
                f.write(json.dumps({"sentence": " ".join(words), "label": label}) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
        sys.exit(0)
    run()
