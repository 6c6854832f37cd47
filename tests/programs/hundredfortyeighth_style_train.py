"""A hundred-and-forty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyeighth-*): sequence labelling (NER) trained with flairNLP/flair's
ModelTrainer (flair >= 0.14), re-created in plain torch without flair installed. Each run's
folder links this file as train_ner.py; it is started as Flair's multi-GPU docs start it: `python
train_ner.py`, whose __main__ calls `launch_distributed(main, ...)`
(flair.distributed_utils: torch.multiprocessing.spawn of one process per GPU, MASTER_ADDR
localhost and a fixed MASTER_PORT, 12355 there, $MASTER_PORT in this fork), then
`trainer.train(..., multi_gpu=True)`; or under torchrun (a fork's torchrun support: LOCAL_RANK in
the environment skips the spawn and inits the process group from env://), on one node or two.

As there: the 'flair' logger prints '%(asctime)-15s %(message)s' to stdout at INFO; every process
logs 'Started process on rank=N' and reads the corpus ('Reading data from data/ner', 'Train:
data/ner/train.txt', ..., 'Computing label dictionary. Progress:' with a tqdm bar on stderr,
'Dictionary created for label 'ner' with 4 values: ...'); the trainer checks the corpus is the
same on every process (all_gather_object of 10 sampled sentences a split), wraps the model in
DDP(find_unused_parameters=True) and sets the logger of every process but rank 0 to WARNING; a
DistributedSampler per epoch, the progress line every tenth of an epoch with loss and
samples/sec all-gathered ('epoch 1 - iter 2/20 - loss 1.23456789 - time (sec): 0.12 -
samples/sec: 1234.56 - lr: 0.100000 - momentum: 0.000000'), 'EPOCH 1 done: loss 1.2345 - lr:
0.100000', 'DEV : loss 0.9876 - f1-score (micro avg)  0.8523', AnnealOnPlateau's ' - 0 epochs
without improvement', 'saving best model', at the end 'Testing using last state of model ...'
and the results block ('Results:', '- F-score (micro) 0.85', 'By class:' table). A tiny
SequenceTagger: word embeddings, a BiLSTM and a linear layer (no CRF), cross-entropy summed over
tokens. The data: synthetic CoNLL-style sentences (one token and its BIO tag a line, a blank
line between sentences), written at run time by `python train_ner.py --generate DIR`; the train
split is read lazily (ColumnDataset(in_memory=False): each sentence read from the file when its
batch is built). An exception that leaves a spawned process goes to spawn's parent, which
raises it as '-- Process N terminated with the following error:' (N the local index).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import logging.config
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CASE = os.environ.get("MT_CASE", "")
RANK = [0]
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int | None = None) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == (RANK[0] if rank is None else rank)


logging.config.dictConfig(
    {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"standard": {"format": "%(asctime)-15s %(message)s"}},
        "handlers": {
            "console": {
                "level": "INFO",
                "class": "logging.StreamHandler",
                "formatter": "standard",
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {"flair": {"handlers": ["console"], "level": "INFO", "propagate": False}},
    }
)
log = logging.getLogger("flair")


def log_line(logger: logging.Logger) -> None:
    logger.info("-" * 100)


# ------------------------------------------------------------------ synthetic CoNLL data
PER = ["Anna", "Jonas", "Marie", "Lukas", "Sofia", "Paul", "Lena", "Felix"]
LOC = ["Berlin", "Paris", "Madrid", "Vienna", "Oslo", "Lisbon", "Prague"]
ORG = ["Siemens", "Google", "Reuters", "UNICEF", "Airbus", "Nokia"]
MISC = ["German", "French", "Olympic", "Nobel"]
FILL = [
    *("the", "a", "of", "in", "said", "on", "was", "to", "with", "for", "at", "and", "by"),
    *("from", "has", "visited", "met", "joined"),
]


def _sentence(rng: random.Random) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for _ in range(rng.randint(4, 12)):
        r = rng.random()
        if r < 0.12:
            out.append((rng.choice(PER), "B-PER"))
            if rng.random() < 0.3:
                out.append((rng.choice(PER) + "son", "I-PER"))
        elif r < 0.22:
            out.append((rng.choice(LOC), "B-LOC"))
        elif r < 0.3:
            out.append((rng.choice(ORG), "B-ORG"))
        elif r < 0.34:
            out.append((rng.choice(MISC), "B-MISC"))
        else:
            out.append((rng.choice(FILL), "O"))
    out.append((".", "O"))
    return out


def generate(folder: str) -> None:
    rng = random.Random(0)
    os.makedirs(os.path.join(folder, "ner"), exist_ok=True)
    for split, n in (("train", 800), ("dev", 100), ("test", 100)):
        with open(os.path.join(folder, "ner", f"{split}.txt"), "w", encoding="utf-8") as f:
            for _ in range(n):
                f.write("".join(f"{tok} {tag}\n" for tok, tag in _sentence(rng)) + "\n")


# ------------------------------------------------------------------ flair.data, flair.datasets
class Sentence:
    def __init__(self, tokens: list[str], tags: list[str]) -> None:
        self.tokens, self.tags = tokens, tags

    def __len__(self) -> int:
        return len(self.tokens)

    def __str__(self) -> str:
        return f'Sentence[{len(self)}]: "{" ".join(self.tokens)}"'


def _parse(block: str) -> Sentence:
    rows = [line.split() for line in block.strip().split("\n") if line.strip()]
    return Sentence([r[0] for r in rows], [r[1] for r in rows])


class ColumnDataset(Dataset[Sentence]):
    def __init__(self, path: Path, in_memory: bool = True) -> None:
        self.path, self.in_memory = path, in_memory
        self.sentences: list[Sentence] = []
        self.offsets: list[int] = []
        with open(path, "rb") as f:
            start, block = 0, b""
            pos = 0
            for line in f:
                if line.strip():
                    if not block:
                        start = pos
                    block += line
                elif block:
                    self._add(start, block)
                    block = b""
                pos += len(line)
            if block:
                self._add(start, block)

    def _add(self, start: int, block: bytes) -> None:
        self.offsets.append(start)
        if self.in_memory:
            self.sentences.append(_parse(block.decode("utf-8")))

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> Sentence:
        if self.in_memory:
            return self.sentences[index]
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.offsets[index])
            lines = []
            for line in f:
                if not line.strip():
                    break
                lines.append(line)
        if fault("s") and index % 50 == 0:  # this rank's corpus lives on a slow network mount
            time.sleep(1.2)
        return _parse("".join(lines))


class Corpus:
    def __init__(self, train: Dataset[Sentence], dev: Dataset[Sentence], test: Dataset[Sentence]):
        self.train, self.dev, self.test = train, dev, test

    def __str__(self) -> str:
        return (
            f"Corpus: {len(self.train)} train + {len(self.dev)} dev + "  # type: ignore[arg-type]
            f"{len(self.test)} test sentences"  # type: ignore[arg-type]
        )


class ShardedDataset(Dataset[Sentence]):
    """A fork's own split of the train sentences (every world_size-th one from the rank on)."""

    def __init__(self, data: Dataset[Sentence], rank: int, world: int) -> None:
        self.data, self.index = data, list(range(rank, len(data), world))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Sentence:
        return self.data[self.index[i]]


def column_corpus(data_folder: str) -> Corpus:
    folder = Path(data_folder)
    log.info(f"Reading data from {folder}")
    log.info(f"Train: {folder / 'train.txt'}")
    log.info(f"Dev: {folder / 'dev.txt'}")
    log.info(f"Test: {folder / 'test.txt'}")
    return Corpus(
        ColumnDataset(folder / "train.txt", in_memory=False),
        ColumnDataset(folder / "dev.txt"),
        ColumnDataset(folder / "test.txt"),
    )


def tqdm(items: Sequence[Any], total: int) -> Iterator[Any]:
    """tqdm's default bar (no description) on stderr, redrawn with a carriage return."""
    t0 = time.time()

    def bar(n: int) -> str:
        el = time.time() - t0
        rate = n / el if el > 0 and n else 0.0
        left = (total - n) / rate if rate else 0.0
        filled = int(10 * n / total) if total else 10
        return (
            f"\r{int(100 * n / total):3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d},"
            f" {rate:.2f}it/s]"
        )

    sys.stderr.write(bar(0))
    sys.stderr.flush()
    last = 0.0
    for n, item in enumerate(items, 1):
        yield item
        if time.time() - last > 0.1 or n == total:
            last = time.time()
            sys.stderr.write(bar(n))
            sys.stderr.flush()
    sys.stderr.write("\n")


class Dictionary:
    def __init__(self, add_unk: bool = True) -> None:
        self.items: list[str] = ["<unk>"] if add_unk else []
        self.index: dict[str, int] = {k: i for i, k in enumerate(self.items)}

    def add_item(self, item: str) -> int:
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)
        return self.index[item]

    def get_idx_for_item(self, item: str) -> int:
        return self.index.get(item, 0)

    def __len__(self) -> int:
        return len(self.items)


def make_label_dictionary(corpus: Corpus, label_type: str) -> tuple[Dictionary, Dictionary]:
    log.info("Computing label dictionary. Progress:")
    words, tags = Dictionary(), Dictionary(add_unk=False)
    seen: Counter[str] = Counter()
    data = corpus.train
    for i in tqdm(range(len(data)), total=len(data)):  # type: ignore[arg-type]
        s = data[i]
        for w, t in zip(s.tokens, s.tags, strict=True):
            words.add_item(w)
            tags.add_item(t)
            if t.startswith("B-"):
                seen[t[2:]] += 1
    log.info(
        f"Dictionary created for label '{label_type}' with {len(seen)} values: "
        + ", ".join(f"{k} (seen {v} times)" for k, v in seen.most_common())
    )
    return words, tags


# ------------------------------------------------------------------ flair.models.SequenceTagger
class WordEmbeddings(nn.Module):
    def __init__(self, n: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embedding(x)
        return out


class SequenceTagger(nn.Module):
    def __init__(self, words: Dictionary, tags: Dictionary, hidden_size: int = 32) -> None:
        super().__init__()
        self.words, self.tags = words, tags
        self.embeddings = WordEmbeddings(len(words), 32)
        self.word_dropout = nn.Dropout(0.05)
        self.embedding2nn = nn.Linear(32, 32)
        self.rnn = nn.LSTM(32, hidden_size, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(2 * hidden_size, len(tags))
        self.loss_function = nn.CrossEntropyLoss(reduction="sum", ignore_index=-100)

    def _tensors(self, batch: list[Sentence]) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(len(s) for s in batch)
        x = torch.zeros(len(batch), length, dtype=torch.long)
        y = torch.full((len(batch), length), -100, dtype=torch.long)
        for i, s in enumerate(batch):
            for j, (w, t) in enumerate(zip(s.tokens, s.tags, strict=True)):
                x[i, j] = self.words.get_idx_for_item(w)
                y[i, j] = self.tags.get_idx_for_item(t)
        return x, y

    def forward(self, batch: list[Sentence]) -> tuple[torch.Tensor, int]:
        return self.forward_loss(batch)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embedding2nn(self.word_dropout(self.embeddings(x)))
        out, _ = self.rnn(h)
        scores: torch.Tensor = self.linear(out)
        return scores

    def forward_loss(self, batch: list[Sentence]) -> tuple[torch.Tensor, int]:
        x, y = self._tensors(batch)
        if fault("p") and EPOCH[0] >= 2 and BATCH[0] == 6:
            x[0, -1] = len(self.words) + 3  # a fork's pad id: one past its own vocabulary
        scores = self.scores(x)
        loss = self.loss_function(scores.reshape(-1, scores.shape[-1]), y.reshape(-1))
        return loss, int((y != -100).sum())

    def evaluate(self, data: Dataset[Sentence], mini_batch_size: int = 32) -> Result:
        tp: Counter[str] = Counter()
        fp: Counter[str] = Counter()
        fn: Counter[str] = Counter()
        loss, n = 0.0, 0
        sentences = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        with torch.no_grad():
            for k in range(0, len(sentences), mini_batch_size):
                batch = sentences[k : k + mini_batch_size]
                x, y = self._tensors(batch)
                s = self.scores(x)
                loss += float(self.loss_function(s.reshape(-1, s.shape[-1]), y.reshape(-1)))
                n += int((y != -100).sum())
                pred = s.argmax(-1)
                for i, sent in enumerate(batch):
                    p = {
                        sp for sp in _spans([self.tags.items[int(t)] for t in pred[i, : len(sent)]])
                    }
                    g = {sp for sp in _spans(sent.tags)}
                    for sp in p & g:
                        tp[sp[2]] += 1
                    for sp in p - g:
                        fp[sp[2]] += 1
                    for sp in g - p:
                        fn[sp[2]] += 1
        return Result(tp, fp, fn, loss / max(n, 1))


def _spans(tags: list[str]) -> list[tuple[int, int, str]]:
    out, start, kind = [], -1, ""
    for i, t in enumerate([*tags, "O"]):
        if start >= 0 and not (t.startswith("I-") and t[2:] == kind):
            out.append((start, i, kind))
            start = -1
        if t.startswith("B-"):
            start, kind = i, t[2:]
    return out


class Result:
    def __init__(self, tp: Counter[str], fp: Counter[str], fn: Counter[str], loss: float):
        self.tp, self.fp, self.fn, self.loss = tp, fp, fn, loss

    @staticmethod
    def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    @property
    def main_score(self) -> float:
        return self._prf(sum(self.tp.values()), sum(self.fp.values()), sum(self.fn.values()))[2]

    @property
    def detailed_results(self) -> str:
        classes = sorted(set(self.tp) | set(self.fn) | set(self.fp))
        f1s = [self._prf(self.tp[c], self.fp[c], self.fn[c])[2] for c in classes]
        tp, fp, fn = (sum(c.values()) for c in (self.tp, self.fp, self.fn))
        acc = tp / (tp + fp + fn) if tp + fp + fn else 0.0
        lines = [
            "",
            "Results:",
            f"- F-score (micro) {round(self.main_score, 4)}",
            f"- F-score (macro) {round(sum(f1s) / max(len(f1s), 1), 4)}",
            f"- Accuracy {round(acc, 4)}",
            "",
            "By class:",
            "              precision    recall  f1-score   support",
            "",
        ]
        for c in classes:
            p, r, f = self._prf(self.tp[c], self.fp[c], self.fn[c])
            lines.append(
                f"{c:>12s}    {p:.4f}    {r:.4f}    {f:.4f}    {self.tp[c] + self.fn[c]:6d}"
            )
        p, r, f = self._prf(tp, fp, fn)
        lines += ["", f"{'micro avg':>12s}    {p:.4f}    {r:.4f}    {f:.4f}    {tp + fn:6d}"]
        return "\n".join(lines)


# ------------------------------------------------------------------ flair.distributed_utils
def launch_distributed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    world_size = torch.cuda.device_count() or 2  # the CPU re-creation: a two-GPU box
    log.info(f"Launching {world_size} processes")
    parent_conn, child_conn = mp.Pipe()
    mp.spawn(
        _process_entrypoint, args=(world_size, child_conn, fn, args, kwargs), nprocs=world_size
    )
    return parent_conn.recv()


def _process_entrypoint(
    rank: int,
    world_size: int,
    child_conn: Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    log.info(f"Started process on rank={rank}")
    try:
        _ddp_setup(rank, world_size)
        value = fn(*args, **kwargs)
        if is_main_process():
            child_conn.send(value)
    finally:
        dist.destroy_process_group()


def _ddp_setup(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12355")
    RANK[0] = rank
    dist.init_process_group(
        backend="gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=15)
    )


def is_main_process() -> bool:
    if dist.is_initialized():
        return dist.get_rank() == 0
    return True


def aggregate(value: Any, aggregation_fn: Callable[[list[Any]], Any] = np.mean) -> Any:
    if dist.is_initialized():
        gathered: list[Any] = [None for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, value)
    else:
        gathered = [value]
    return aggregation_fn(gathered)


def validate_corpus_same_each_process(corpus: Corpus) -> None:
    for dataset in (corpus.train, corpus.dev, corpus.test):
        n = len(dataset)  # type: ignore[arg-type]
        for i in random.sample(range(n), min(10, n)):
            example = str(dataset[i])
            examples = aggregate(example, list)
            if not all(e == examples[0] for e in examples):
                raise ValueError("Dataset must be the same on each process")


# ------------------------------------------------------------------ flair.trainers
class TrainingInterrupt(Exception):
    pass


class AnnealOnPlateau:
    def __init__(self, patience: int, anneal_factor: float, min_learning_rate: float) -> None:
        self.patience, self.anneal_factor, self.min_learning_rate = (
            patience,
            anneal_factor,
            min_learning_rate,
        )
        self.best, self.num_bad_epochs = -1.0, 0

    def after_evaluation(self, optimizer: torch.optim.Optimizer, score: float) -> None:
        reduced = False
        if score > self.best:
            self.best, self.num_bad_epochs = score, 0
        else:
            self.num_bad_epochs += 1
            if self.num_bad_epochs > self.patience:
                for g in optimizer.param_groups:
                    g["lr"] *= self.anneal_factor
                self.num_bad_epochs, reduced = 0, True
        lr = optimizer.param_groups[0]["lr"]
        if reduced:
            log.info(
                f" - {self.patience + 1} epochs without improvement (above 'patience')"
                f"-> annealing learning_rate to [{lr}]"
            )
        else:
            log.info(f" - {self.num_bad_epochs} epochs without improvement")
        if lr < self.min_learning_rate:
            raise TrainingInterrupt("learning rate too small - quitting training!")

    def __str__(self) -> str:
        return (
            f"AnnealOnPlateau | patience: '{self.patience}', anneal_factor: "
            f"'{self.anneal_factor}', min_learning_rate: '{self.min_learning_rate}'"
        )


EPOCH = [0]
BATCH = [0]


def _collate(batch: list[Sentence]) -> list[Sentence]:
    return batch


class ModelTrainer:
    def __init__(self, model: SequenceTagger, corpus: Corpus) -> None:
        self.model, self.corpus = model, corpus

    def train(
        self,
        base_path: str,
        learning_rate: float = 0.1,
        mini_batch_size: int = 32,
        max_epochs: int = 100,
        patience: int = 3,
        anneal_factor: float = 0.5,
        min_learning_rate: float = 0.0001,
        shuffle: bool = True,
        embeddings_storage_mode: str = "cpu",
        multi_gpu: bool = False,
    ) -> dict[str, float]:
        base = Path(base_path)
        base.mkdir(parents=True, exist_ok=True)
        train_data: Dataset[Sentence] = self.corpus.train
        if fault("u"):  # a fork's own shards instead of the DistributedSampler
            train_data = ShardedDataset(train_data, dist.get_rank(), dist.get_world_size())
        if multi_gpu:
            if not dist.is_initialized():
                raise RuntimeError(
                    "multi_gpu=True can only used inside flair.distributed_utils.launch_distributed()"
                )
            validate_corpus_same_each_process(self.corpus)
            ddp_model = DistributedDataParallel(self.model, find_unused_parameters=True)
            if not is_main_process():
                log.setLevel(logging.WARNING)  # only print logs once
        optimizer = torch.optim.SGD(self.model.parameters(), lr=learning_rate)
        plugin = AnnealOnPlateau(patience, anneal_factor, min_learning_rate)
        scaler = torch.cuda.amp.GradScaler(enabled=False)
        device_info = aggregate("cpu", lambda devices: ", ".join(str(d) for d in devices))

        log_line(log)
        log.info(f'Model: "{self.model}"')
        log_line(log)
        log.info(f"{self.corpus}")
        log_line(log)
        log.info(f"Train:  {len(train_data)} sentences")  # type: ignore[arg-type]
        log.info("        (train_with_dev=False, train_with_test=False)")
        log_line(log)
        log.info("Parameters:")
        log.info(f' - learning_rate: "{learning_rate:.6f}"')
        log.info(f' - mini_batch_size: "{mini_batch_size}"')
        log.info(f' - patience: "{patience}"')
        log.info(f' - anneal_factor: "{anneal_factor}"')
        log.info(f' - max_epochs: "{max_epochs}"')
        log.info(f' - shuffle: "{shuffle}"')
        log.info(' - train_with_dev: "False"')
        log_line(log)
        log.info("Plugins:")
        log.info(f" - {plugin}")
        log_line(log)
        log.info(f'Model training base path: "{base}"')
        log_line(log)
        log.info(f"Device: {device_info}")
        log_line(log)
        log.info(f"Embeddings storage mode: {embeddings_storage_mode}")
        log_line(log)

        best = -1.0
        stored: list[torch.Tensor] = []
        try:
            for epoch in range(1, max_epochs + 1):
                EPOCH[0] = epoch
                log_line(log)
                sampler = DistributedSampler(train_data, shuffle=shuffle) if multi_gpu else None
                if fault("u"):
                    sampler = None
                if sampler is not None:
                    sampler.set_epoch(epoch - 1)
                loader = DataLoader(
                    train_data,
                    batch_size=mini_batch_size,
                    sampler=sampler,
                    shuffle=False,
                    collate_fn=_collate,
                )
                self.model.train()
                epoch_loss, epoch_samples = 0.0, 0
                t0 = time.time()
                log_modulo = max(1, int(len(loader) / 10))
                lock = threading.Lock()
                for batch_no, batch in enumerate(loader):
                    BATCH[0] = batch_no
                    self.model.zero_grad()
                    optimizer.zero_grad()
                    if fault("w") and epoch == 2 and batch_no == 4:
                        with lock:  # the fork's embedding cache, locked by its own caller
                            self._store(batch, lock)
                    if multi_gpu:
                        loss, count = ddp_model(batch)
                    else:
                        loss, count = self.model.forward_loss(batch)
                    scaler.scale(loss).backward()
                    if multi_gpu:
                        for p in self.model.parameters():
                            if p.grad is not None:
                                p.grad.mul_(dist.get_world_size())
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
                    optimizer.step()
                    epoch_loss += loss.item()
                    epoch_samples += count
                    if embeddings_storage_mode == "cpu" and fault("k") and epoch >= 2:
                        stored.append(torch.ones(16 << 20))  # every batch's embeddings kept
                        if len(stored) >= 6:  # the node's memory is gone: the OOM killer
                            os.kill(os.getpid(), 9)
                    if fault("z") and epoch == 2 and batch_no == 7:
                        ctypes.string_at(0)  # a compiled tokenizer reads a freed buffer
                    if fault("x") and epoch == 3 and batch_no == 3:
                        sys.exit(0)  # a fork's own early exit after rank-local checks
                    if (batch_no + 1) % log_modulo == 0:
                        inter = aggregate(epoch_loss / max(epoch_samples, 1))
                        sps = aggregate(epoch_samples / (time.time() - t0), np.sum)
                        lr = optimizer.param_groups[0]["lr"]
                        log.info(
                            f"epoch {epoch} - iter {batch_no + 1}/{len(loader)} - loss {inter:.8f}"
                            f" - time (sec): {time.time() - t0:.2f} - samples/sec: {sps:.2f}"
                            f" - lr: {lr:.6f} - momentum: 0.000000"
                        )
                train_loss = aggregate(epoch_loss / max(epoch_samples, 1))
                lr = optimizer.param_groups[0]["lr"]
                log_line(log)
                log.info(f"EPOCH {epoch} done: loss {train_loss:.4f} - lr: {lr:.6f}")
                self.model.eval()
                result = self.model.evaluate(self.corpus.dev)
                if fault("v") and is_main_process():  # a fork averages the dev loss on rank 0
                    aggregate(result.loss)
                log.info(
                    f"DEV : loss {result.loss:.4f} - f1-score (micro avg)  "
                    f"{round(result.main_score, 4)}"
                )
                plugin.after_evaluation(optimizer, result.main_score)
                if result.main_score > best:
                    best = result.main_score
                    log.info("saving best model")
                    if is_main_process():
                        torch.save(self.model.state_dict(), base / "best-model.pt")
        except TrainingInterrupt as exc:
            log_line(log)
            log.info(str(exc))
            log_line(log)
            log.info("Saving model ...")
            if is_main_process():
                torch.save(self.model.state_dict(), base / "final-model.pt")
            log.info("Done.")
        log_line(log)
        self.model.eval()
        log.info("Testing using last state of model ...")
        test = self.model.evaluate(self.corpus.test)
        log.info(test.detailed_results)
        log_line(log)
        return {"test_score": test.main_score}

    def _store(self, batch: list[Sentence], lock: threading.Lock) -> None:
        with lock:
            pass


# ------------------------------------------------------------------ the user's script
def main(args: argparse.Namespace, multi_gpu: bool) -> dict[str, float]:
    random.seed(42)  # flair.set_seed(42)
    torch.manual_seed(42)
    corpus = column_corpus(args.data)
    words, tags = make_label_dictionary(corpus, label_type="ner")
    tagger = SequenceTagger(words, tags, hidden_size=32)
    trainer = ModelTrainer(tagger, corpus)
    return trainer.train(
        "resources/taggers/ner",
        learning_rate=args.learning_rate,
        mini_batch_size=20,
        max_epochs=args.max_epochs,
        patience=args.patience,
        min_learning_rate=args.min_learning_rate,
        multi_gpu=multi_gpu,
    )


def torchrun_main(args: argparse.Namespace) -> None:
    RANK[0] = int(os.environ["RANK"])
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))
    try:
        main(args, multi_gpu=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/ner")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--max_epochs", type=int, default=5)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--min_learning_rate", type=float, default=0.0001)
    cli = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        torchrun_main(cli)
    elif fault("b", 0):  # the user's edit: launch_distributed commented out
        main(cli, multi_gpu=True)
    else:
        launch_distributed(main, cli, True)
