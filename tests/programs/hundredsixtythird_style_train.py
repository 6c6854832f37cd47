"""A hundred-and-sixty-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtythird-*): Sockeye 3 neural machine translation trained the way
`sockeye-train --dist` trains it under torchrun, re-created in plain torch without Sockeye
installed, on elastic torchrun agents that meet through an etcd rendezvous. Each node's folder
links this file as sockeye_train.py; every node starts `torchrun --rdzv_backend=etcd-v2
--rdzv_endpoint=localhost:40280 --rdzv_id=job7 --nnodes=1:2 --nproc_per_node=2 --max-restarts=1
--tee 3 --log-dir logs sockeye_train.py --dist --use-cpu --prepared-data prepared ...` with the
output folder on storage both nodes share, so that a restarted worker group resumes from the
training state the primary worker saved at its last checkpoint.

As in sockeye: `@record` on train(); init_process_group (gloo here, with a 15 s timeout) before
anything else; every worker logs to the console (stderr) with sockeye's simple format
'[INFO:sockeye.training] ...' (secondary workers at --loglevel-secondary-workers, INFO by
default), uncaught exceptions through the excepthook sockeye installs ('[ERROR:root] Uncaught
exception'); the log head (Sockeye and PyTorch versions, 'Command:', 'Arguments: Namespace(...)'),
the prepared data's shards split over the workers and loaded one at a time by a sharded,
bucketed iterator ('Loading shard prepared/shard.00002.'), vocabularies, the model's parameter
count, 'Early stopping by optimizing 'perplexity'', 'Training started.' or 'Found partial
training in '...'. Resuming from saved state.'; progress 'Epoch[0] Batch [8]\tSpeed: 812.33
samples/sec 9120.55 tokens/sec 101.54 updates/sec\tperplexity=43.112340', checkpoints
'Checkpoint [3]\tUpdates=48 Epoch=2 Samples=...', 'Checkpoint [3]\tTrain-perplexity=...',
'Checkpoint [3]\tValidation-perplexity=...' (the validation loss all-reduced over the workers),
the primary's checkpoint decoder ('Validation-bleu'), 'Validation-perplexity improved to ...',
early stopping by checkpoints that did not improve, 'Training finished. Best checkpoint: 4. Best
validation perplexity: 11.234567'. A tiny transformer on synthetic token pairs (the target is the
source reversed, each word shifted) that `python sockeye_train.py --prepare DIR` writes as
sockeye.prepare_data would (DIR/prepared/shard.0000N, vocab.src.0.json, vocab.trg.0.json,
data.info; DIR/dev.src and DIR/dev.trg).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank)
and never printed (re-capture with tests/fixtures/real/capture_hundredsixtythird.sh after any
edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import logging.config
import math
import os
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

__version__ = "3.1.34"
GIT_HASH = "1f3c2a91e7d84b0c5a6f29e1d8b7c4a3e2f10d96"
CASE = os.environ.get("MT_CASE", "")
RANK = -1
PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
WORDS = 40
MEASURE_SPEED_EVERY = 8
LEAK: list[torch.Tensor] = []

logger = logging.getLogger("sockeye.train")
log_training = logging.getLogger("sockeye.training")
log_data = logging.getLogger("sockeye.data_io")
log_utils = logging.getLogger("sockeye.utils")
log_vocab = logging.getLogger("sockeye.vocab")
log_model = logging.getLogger("sockeye.model")
log_decoder = logging.getLogger("sockeye.checkpoint_decoder")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ sockeye.log
FORMATTERS = {
    "verbose": {
        "format": "[%(asctime)s:%(levelname)s:%(name)s:%(funcName)s] %(message)s",
        "datefmt": "%Y-%m-%d:%H:%M:%S",
    },
    "simple": {"format": "[%(levelname)s:%(name)s] %(message)s"},
}


def setup_main_logger(path: str, level: str, console_level: str | None) -> None:
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": FORMATTERS,
        "handlers": {
            "console": {
                "level": console_level or level,
                "formatter": "simple",
                "class": "logging.StreamHandler",
                "stream": None,
            },
            "rotating": {
                "level": level,
                "formatter": "verbose",
                "class": "logging.handlers.RotatingFileHandler",
                "maxBytes": 10000000,
                "backupCount": 5,
                "filename": path,
            },
        },
        "root": {"handlers": ["console", "rotating"], "level": "DEBUG"},
    }
    logging.config.dictConfig(config)

    def exception_hook(exc_type: Any, exc_value: Any, exc_traceback: Any) -> None:
        logging.exception("Uncaught exception", exc_info=(exc_type, exc_value, exc_traceback))

    sys.excepthook = exception_hook


def log_basic_info(args: argparse.Namespace) -> None:
    log_utils.info(f"Sockeye: {__version__}, commit {GIT_HASH}, path {os.path.abspath(__file__)}")
    log_utils.info(f"PyTorch: {torch.__version__} ({torch.__file__})")
    log_utils.info("Command: %s", " ".join(sys.argv))
    log_utils.info("Arguments: %s", args)


def is_primary_worker() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


# ------------------------------------------------------------------ sockeye.prepare_data
def prepare(folder: str, shards: int = 8, per_shard: int = 64, dev: int = 64) -> None:
    """The synthetic corpus, as `python -m sockeye.prepare_data` leaves it: the target is the
    source reversed, each word shifted by one."""
    rng = random.Random(13)
    words = [f"w{i:02d}" for i in range(WORDS)]

    def pair() -> tuple[list[str], list[str]]:
        src = [rng.choice(words) for _ in range(rng.randint(5, 12))]
        trg = [words[(words.index(w) + 1) % WORDS] for w in reversed(src)]
        return src, trg

    prepared = os.path.join(folder, "prepared")
    os.makedirs(prepared, exist_ok=True)
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    for side in ("src", "trg"):
        with open(os.path.join(prepared, f"vocab.{side}.0.json"), "w") as f:
            json.dump(vocab, f, indent=4)
    for k in range(shards):
        rows = [pair() for _ in range(per_shard)]
        src = torch.full((per_shard, 13), PAD, dtype=torch.long)
        trg = torch.full((per_shard, 14), PAD, dtype=torch.long)
        for i, (s, t) in enumerate(rows):
            src[i, : len(s) + 1] = torch.tensor([vocab[w] for w in s] + [EOS])
            trg[i, : len(t) + 2] = torch.tensor([BOS] + [vocab[w] for w in t] + [EOS])
        torch.save({"source": src, "target": trg}, os.path.join(prepared, f"shard.{k:05d}"))
    with open(os.path.join(prepared, "data.info"), "w") as f:
        f.write(f"num_shards: {shards}\nsentences: {shards * per_shard}\nmax_seq_len: [13, 14]\n")
    with open(os.path.join(prepared, "data.version"), "w") as f:
        f.write("8\n")
    rows = [pair() for _ in range(dev)]
    with (
        open(os.path.join(folder, "dev.src"), "w") as fs,
        open(os.path.join(folder, "dev.trg"), "w") as ft,
    ):
        for s, t in rows:
            fs.write(" ".join(s) + "\n")
            ft.write(" ".join(t) + "\n")


# ------------------------------------------------------------------ sockeye.vocab, data_io
def load_vocab(path: str) -> dict[str, int]:
    with open(path) as f:
        vocab: dict[str, int] = json.load(f)
    log_vocab.info('Vocabulary (%d words) loaded from "%s"', len(vocab), path)
    return vocab


@dataclass
class Batch:
    source: torch.Tensor
    source_length: torch.Tensor | None
    target: torch.Tensor
    labels: torch.Tensor
    samples: int
    tokens: int


def make_batch(src: torch.Tensor, trg: torch.Tensor) -> Batch:
    return Batch(
        source=src,
        source_length=(src != PAD).sum(1),
        target=trg[:, :-1],
        labels=trg[:, 1:],
        samples=len(src),
        tokens=int((trg[:, 1:] != PAD).sum()),
    )


class ShardedParallelSampleIter:
    """The worker's shards of the prepared data (shards[rank::world]), loaded one at a time,
    each cut into batches of --batch-size sentences; the shards shuffled at every reset."""

    def __init__(self, shards: list[str], batch_size: int, seed: int) -> None:
        self.shards, self.batch_size = list(shards), batch_size
        self.rng = random.Random(seed)
        self.epoch = 0
        self.reset()

    def _load(self, fname: str) -> list[Batch]:
        log_data.info("Loading shard %s.", fname)
        if fault("s", RANK) and self.epoch >= 1:  # this node mounts the corpus over a slow NFS
            time.sleep(22)
        blob = torch.load(fname)
        src, trg = blob["source"], blob["target"]
        order = list(range(len(src)))
        self.rng.shuffle(order)
        return [
            make_batch(src[order[i : i + self.batch_size]], trg[order[i : i + self.batch_size]])
            for i in range(0, len(order) - self.batch_size + 1, self.batch_size)
        ]

    def reset(self) -> None:
        if len(self.shards) > 1:
            log_data.info("Shuffling the shards.")
            self.rng.shuffle(self.shards)
        self.shard_index = 0
        self.batches = self._load(self.shards[0])
        self.batch_index = 0

    def iter_next(self) -> bool:
        return self.batch_index < len(self.batches) or self.shard_index + 1 < len(self.shards)

    def next(self) -> Batch:
        if self.batch_index >= len(self.batches):
            self.shard_index += 1
            self.batches = self._load(self.shards[self.shard_index])
            self.batch_index = 0
        b = self.batches[self.batch_index]
        self.batch_index += 1
        return b


class PrefetchIter:
    """Loads the next shard in a background thread while the current one trains (a fork's
    speed-up for shards on network storage)."""

    def __init__(self, inner: ShardedParallelSampleIter) -> None:
        self.inner = inner
        self.q: queue.Queue[Batch | Exception | None] = queue.Queue(maxsize=2)
        self.epoch_done = threading.Event()
        # the fork starts its prefetcher as an ordinary (non-daemon) thread on nodes that set
        # SOCKEYE_PREFETCH_POOL
        daemon = not fault("h", RANK)
        self.thread = threading.Thread(target=self._fill, name="shard-prefetch", daemon=daemon)
        self.thread.start()

    def _fill(self) -> None:
        try:
            while True:
                while self.inner.iter_next():
                    self.q.put(self.inner.next())
                self.q.put(None)
                self.epoch_done.wait()
                self.epoch_done.clear()
                self.inner.epoch += 1
                self.inner.reset()
        except Exception as e:  # handed to the training loop, raised there
            self.q.put(e)

    def next(self) -> Batch | None:
        item = self.q.get()
        if isinstance(item, Exception):
            raise item
        return item

    def reset(self) -> None:
        self.epoch_done.set()


def read_parallel(src_path: str, trg_path: str, vocab: dict[str, int]) -> list[Batch]:
    with open(src_path) as fs, open(trg_path) as ft:
        pairs = [(s.split(), t.split()) for s, t in zip(fs, ft, strict=True)]
    log_data.info(
        "%d sequences of maximum length (%d, %d) in '%s' and '%s'.",
        len(pairs),
        max(len(s) for s, _ in pairs),
        max(len(t) for _, t in pairs),
        src_path,
        trg_path,
    )
    src = torch.full((len(pairs), 13), PAD, dtype=torch.long)
    trg = torch.full((len(pairs), 14), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s) + 1] = torch.tensor([vocab.get(w, UNK) for w in s] + [EOS])
        trg[i, : len(t) + 2] = torch.tensor([BOS] + [vocab.get(w, UNK) for w in t] + [EOS])
    return [make_batch(src[i : i + 8], trg[i : i + 8]) for i in range(0, len(pairs), 8)]


# ------------------------------------------------------------------ sockeye.model
class SockeyeModel(nn.Module):
    def __init__(self, vocab_size: int, model_size: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embedding_source = nn.Embedding(vocab_size, model_size, padding_idx=PAD)
        self.embedding_target = nn.Embedding(vocab_size, model_size, padding_idx=PAD)
        self.positions = nn.Parameter(torch.randn(16, model_size) * 0.02)
        self.transformer = nn.Transformer(
            d_model=model_size,
            nhead=heads,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=model_size * 2,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        self.output_layer = nn.Linear(model_size, vocab_size)

    def forward(
        self, source: torch.Tensor, source_length: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        max_len = int(source_length.max())
        source = source[:, :max_len]
        src = self.embedding_source(source) + self.positions[: source.size(1)]
        trg = self.embedding_target(target) + self.positions[: target.size(1)]
        causal = nn.Transformer.generate_square_subsequent_mask(target.size(1))
        out = self.transformer(
            src,
            trg,
            tgt_mask=causal,
            src_key_padding_mask=source == PAD,
            memory_key_padding_mask=source == PAD,
        )
        logits: torch.Tensor = self.output_layer(out)
        return logits


def log_parameters(model: nn.Module) -> None:
    total = sum(p.numel() for p in model.parameters())
    log_model.info(
        "# of parameters: %d | trainable: %d (%.2f%%) | shared: 0 (0.00%%) | fixed: 0 (0.00%%)",
        total,
        total,
        100.0,
    )


# ------------------------------------------------------------------ sockeye.loss, checkpoint_decoder
class PerplexityMetric:
    short_name = "perplexity"

    def __init__(self) -> None:
        self.loss, self.tokens = 0.0, 0

    def update(self, loss_sum: float, tokens: int) -> None:
        self.loss += loss_sum
        self.tokens += tokens

    def get(self) -> float:
        return math.exp(min(self.loss / max(self.tokens, 1), 50.0))

    def reset(self) -> None:
        self.loss, self.tokens = 0.0, 0

    def __str__(self) -> str:
        return f"perplexity={self.get():f}"


def greedy_decode(model: SockeyeModel, batch: Batch) -> list[list[int]]:
    out = torch.full((batch.samples, 1), BOS, dtype=torch.long)
    assert batch.source_length is not None
    for _ in range(batch.labels.size(1)):
        logits = model(batch.source, batch.source_length, out)
        out = torch.cat([out, logits[:, -1:].argmax(-1)], 1)
    return [[t for t in row[1:].tolist() if t > EOS] for row in out]


def bleu(hyps: list[list[int]], refs: list[list[int]]) -> float:
    """Unigram and bigram precision with a brevity penalty (a stand-in for sacrebleu)."""
    match, total, hyp_len, ref_len = [0, 0], [0, 0], 0, 0
    for h, r in zip(hyps, refs, strict=True):
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in (1, 2):
            hg = [tuple(h[i : i + n]) for i in range(len(h) - n + 1)]
            rg = [tuple(r[i : i + n]) for i in range(len(r) - n + 1)]
            total[n - 1] += len(hg)
            match[n - 1] += sum(min(hg.count(g), rg.count(g)) for g in set(hg))
    if not all(total) or not all(match):
        return 0.0
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / max(hyp_len, 1))
    return bp * math.exp(sum(math.log(m / t) for m, t in zip(match, total, strict=True)) / 2)


class CheckpointDecoder:
    """Decodes the first --decode-and-evaluate validation sentences (primary worker only)."""

    def __init__(self, batches: list[Batch], n: int) -> None:
        self.batches = batches[: max(1, n // 8)]
        log_decoder.info(
            "Created CheckpointDecoder(max_input_len=-1, beam_size=1, num_sentences=%d)", n
        )

    def decode_and_evaluate(self, model: SockeyeModel) -> dict[str, float]:
        t0 = time.time()
        hyps, refs = [], []
        with torch.no_grad():
            for b in self.batches:
                hyps += greedy_decode(model, b)
                refs += [[t for t in row.tolist() if t > EOS] for row in b.labels]
        score = bleu(hyps, refs)
        if fault("b", RANK):  # a fork averages the score over the workers
            t = torch.tensor([score])
            dist.all_reduce(t)
            score = float(t) / dist.get_world_size()
        return {"bleu": score, "decode-walltime": time.time() - t0}


# ------------------------------------------------------------------ sockeye.training
@dataclass
class TrainState:
    epoch: int = 0
    checkpoint: int = 0
    best_checkpoint: int = 0
    batches: int = 0
    updates: int = 0
    samples: int = 0
    best_metric: float = float("inf")
    num_not_improved: int = 0
    converged: bool = False
    time_elapsed: float = 0.0


class Speedometer:
    def __init__(self, frequency: int) -> None:
        self.frequency, self.tic, self.samples, self.tokens = frequency, time.time(), 0, 0

    def __call__(
        self, state: TrainState, samples: int, tokens: int, metric: PerplexityMetric
    ) -> None:
        self.samples += samples
        self.tokens += tokens
        if state.batches % self.frequency == 0:
            toc = max(time.time() - self.tic, 1e-6)
            log_training.info(
                "Epoch[%d] Batch [%d]\tSpeed: %.2f samples/sec %.2f tokens/sec %.2f updates/sec\t%s=%f",
                state.epoch,
                state.batches,
                self.samples / toc,
                self.tokens / toc,
                self.frequency / toc,
                metric.short_name,
                metric.get(),
            )
            metric.reset()
            self.tic, self.samples, self.tokens = time.time(), 0, 0


class EarlyStoppingTrainer:
    def __init__(
        self, args: argparse.Namespace, model: DistributedDataParallel, net: SockeyeModel
    ) -> None:
        self.args, self.model, self.net = args, model, net
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args.initial_learning_rate)
        self.output = args.output
        self.state_dir = os.path.join(self.output, "training_state")
        self.train_metric = PerplexityMetric()
        self.checkpoint_metric = PerplexityMetric()
        self.speedometer = Speedometer(MEASURE_SPEED_EVERY)

    def _loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        logits = self.model(batch.source, batch.source_length, batch.target)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            batch.labels.reshape(-1),
            ignore_index=PAD,
            reduction="sum",
            label_smoothing=self.args.label_smoothing,
        )
        return loss, batch.tokens

    def _step(self, batch: Batch) -> None:
        st = self.state
        if fault("a", RANK) and st.updates >= 27:  # a fork's source-length shortcut for sentences
            batch.source_length = None  # that end in the bucket's last position
        if fault("z", RANK) and st.updates == 27:
            ctypes.string_at(0)  # the compiled length-ratio op on a freed buffer
        if fault("k", RANK) and st.updates >= 18:  # a fork keeps every batch's activations
            LEAK.append(torch.ones(16 << 20))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        self.model.train()
        loss, tokens = self._loss(batch)
        (loss / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.train_metric.update(float(loss.detach()), tokens)
        self.checkpoint_metric.update(float(loss.detach()), tokens)
        st.batches += 1
        st.updates += 1
        st.samples += batch.samples * dist.get_world_size()
        self.speedometer(st, batch.samples, tokens, self.train_metric)

    def _evaluate(self, validation: list[Batch]) -> dict[str, float]:
        self.model.eval()
        world, rank = dist.get_world_size(), dist.get_rank()
        t = torch.zeros(2)
        with torch.no_grad():
            for b in validation[rank::world]:
                loss, tokens = self._loss(b)
                t += torch.tensor([float(loss), float(tokens)])
        dist.all_reduce(t)
        metrics = {"perplexity": math.exp(min(float(t[0] / t[1]), 50.0))}
        if self.decoder is not None:
            metrics.update(self.decoder.decode_and_evaluate(self.net))
        log_training.info(
            "Checkpoint [%d]\t%s",
            self.state.checkpoint,
            "\t".join(f"Validation-{k}={v:f}" for k, v in metrics.items()),
        )
        return metrics

    def _create_checkpoint(self, validation: list[Batch], time_cost: float) -> None:
        st = self.state
        st.checkpoint += 1
        st.time_elapsed += time_cost
        log_training.info(
            "Checkpoint [%d]\tUpdates=%d Epoch=%d Samples=%d Time-cost=%.3f Updates/sec=%.3f",
            st.checkpoint,
            st.updates,
            st.epoch,
            st.samples,
            time_cost,
            self.args.checkpoint_interval / time_cost,
        )
        log_training.info("Checkpoint [%d]\tTrain-%s", st.checkpoint, self.checkpoint_metric)
        self.checkpoint_metric.reset()
        value = self._evaluate(validation)["perplexity"]
        if (
            value < st.best_metric
            and st.best_metric - value > self.args.checkpoint_improvement_threshold
        ):
            log_training.info(
                "Validation-perplexity improved to %f (delta=%f).", value, st.best_metric - value
            )
            st.best_metric, st.best_checkpoint, st.num_not_improved = value, st.checkpoint, 0
            improved = True
        else:
            st.num_not_improved += 1
            log_training.info(
                "Validation-perplexity has not improved for %d checkpoints, best so far: %f",
                st.num_not_improved,
                st.best_metric,
            )
            improved = False
        limit = self.args.max_num_checkpoint_not_improved
        if limit >= 0 and st.num_not_improved >= limit:
            log_training.info(
                "Maximum number of not improved checkpoints reached: %d", st.num_not_improved
            )
            st.converged = True
        log_training.info(
            "Checkpoint [%d]\tLearning-rate=%.6f", st.checkpoint, self.args.initial_learning_rate
        )
        if is_primary_worker():
            fname = os.path.join(self.output, f"params.{st.checkpoint:05d}")
            torch.save(self.net.state_dict(), fname)
            log_training.info("Saved params/optimizer/training state to '%s'", fname)
            if improved:
                log_training.info(
                    "'%s' now points to '%s'", os.path.join(self.output, "params.best"), fname
                )
            os.makedirs(self.state_dir, exist_ok=True)
            torch.save(
                {
                    "state": st,
                    "model": self.net.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                },
                os.path.join(self.state_dir, "state.pt.tmp"),
            )
            os.replace(
                os.path.join(self.state_dir, "state.pt.tmp"),
                os.path.join(self.state_dir, "state.pt"),
            )

    def fit(
        self, train_iter: PrefetchIter, validation: list[Batch], decoder: CheckpointDecoder | None
    ) -> TrainState:
        self.decoder = decoder
        args = self.args
        log_training.info("Early stopping by optimizing 'perplexity'")
        if os.path.exists(os.path.join(self.state_dir, "state.pt")):
            log_training.info(
                "Found partial training in '%s'. Resuming from saved state.", self.state_dir
            )
            blob = torch.load(os.path.join(self.state_dir, "state.pt"), weights_only=False)
            self.net.load_state_dict(blob["model"])
            self.optimizer.load_state_dict(blob["optimizer"])
            self.state = blob["state"]
            self.state.batches = self.state.updates
            log_training.info(
                "Training State: epoch=%d, checkpoint=%d batches=%d updates=%d best_metric=%.2f",
                self.state.epoch,
                self.state.checkpoint,
                self.state.batches,
                self.state.updates,
                self.state.best_metric,
            )
        else:
            self.state = TrainState()
            log_training.info("Training started.")
        st = self.state
        tic = time.time()
        while True:
            if st.epoch >= args.max_num_epochs:
                log_training.info("Maximum # of epochs (%s) reached.", args.max_num_epochs)
                break
            batch = train_iter.next()
            if batch is None:  # the worker's shards are done: the next epoch
                st.epoch += 1
                if st.epoch < args.max_num_epochs:
                    train_iter.reset()
                continue
            self._step(batch)
            if st.updates % args.checkpoint_interval == 0:
                time_cost = time.time() - tic
                if fault("q", RANK) and st.updates > 26:  # the worker's own timer, an hour ahead
                    time_cost += 3600.0
                self._create_checkpoint(validation, time_cost)
                if args.max_seconds is not None and st.time_elapsed >= args.max_seconds:
                    log_training.info(
                        "Maximum # of seconds (%s) reached. Training ran for %d seconds.",
                        args.max_seconds,
                        st.time_elapsed,
                    )
                    break
                if st.converged:
                    break
                tic = time.time()
        log_training.info(
            "Training finished%s. Best checkpoint: %d. Best validation perplexity: %.6f",
            ", can be continued later" if not st.converged else "",
            st.best_checkpoint,
            st.best_metric,
        )
        return st


# ------------------------------------------------------------------ sockeye.train
@record
def train(args: argparse.Namespace) -> None:
    global RANK
    if args.dist:
        dist.init_process_group("gloo" if args.use_cpu else "nccl", timeout=timedelta(seconds=15))
    RANK = dist.get_rank()
    output = os.path.abspath(args.output)
    if is_primary_worker():
        os.makedirs(os.path.join(output, "dist_secondary_workers_logs"), exist_ok=True)
    dist.barrier()
    logfile = os.path.join(output, "log")
    console_level = None
    if not is_primary_worker():
        logfile = os.path.join(output, "dist_secondary_workers_logs", f"{RANK}.log")
        console_level = args.loglevel_secondary_workers
    setup_main_logger(logfile, args.loglevel, console_level)
    log_basic_info(args)
    if args.dtype != "float32":
        logger.warning(
            "Specifying a non-float32 dtype to sockeye.train has no effect. For 16-bit or mixed "
            "precision training, use one of the following: --amp --apex-amp --deepspeed-fp16 "
            "--deepspeed-bf16"
        )
    logger.info(
        "Adjusting maximum length to reserve space for a BOS/EOS marker. New maximum length: (%d, %d)",
        args.max_seq_len + 2,
        args.max_seq_len + 2,
    )
    logger.info("Training Device: cpu")
    torch.manual_seed(args.seed)

    prepared = args.prepared_data
    world = dist.get_world_size()
    shards = sorted(
        os.path.join(prepared, f) for f in os.listdir(prepared) if f.startswith("shard.")
    )
    log_data.info("===============================")
    log_data.info("Creating training data iterator")
    log_data.info("===============================")
    source_vocab = load_vocab(os.path.join(prepared, "vocab.src.0.json"))
    target_vocab = load_vocab(os.path.join(prepared, "vocab.trg.0.json"))
    train_iter = ShardedParallelSampleIter(shards[RANK::world], args.batch_size, args.seed + RANK)
    log_data.info("=================================")
    log_data.info("Creating validation data iterator")
    log_data.info("=================================")
    validation = read_parallel(args.validation_source, args.validation_target, target_vocab)
    logger.info("Vocabulary sizes: source=[%d] target=[%d]", len(source_vocab), len(target_vocab))

    net = SockeyeModel(len(target_vocab), args.model_size, args.heads, args.num_layers)
    log_parameters(net)
    logger.info(
        f"Gradient accumulation over 1 batch(es) by {world} worker(s). Effective batch size: "
        f"{args.batch_size * world}"
    )
    model = DistributedDataParallel(net)
    decoder = None
    if is_primary_worker() and args.decode_and_evaluate > 0:  # only the primary decodes
        decoder = CheckpointDecoder(validation, args.decode_and_evaluate)
        log_training.info(
            "tensorboard not found. Consider 'pip install tensorboard' to log events to Tensorboard."
        )
    trainer = EarlyStoppingTrainer(args, model, net)
    trainer.fit(PrefetchIter(train_iter), validation, decoder)
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
        return
    p = argparse.ArgumentParser(description="Train Sockeye sequence-to-sequence models.")
    p.add_argument("--prepared-data", "-d", required=True)
    p.add_argument("--validation-source", "-vs", required=True)
    p.add_argument("--validation-target", "-vt", required=True)
    p.add_argument("--output", "-o", required=True)
    p.add_argument("--dist", action="store_true")
    p.add_argument("--use-cpu", action="store_true")
    p.add_argument("--batch-size", "-b", type=int, default=8)
    p.add_argument("--batch-type", default="sentence")
    p.add_argument("--max-seq-len", type=int, default=12)
    p.add_argument("--model-size", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--initial-learning-rate", type=float, default=0.003)
    p.add_argument("--checkpoint-interval", type=int, default=16)
    p.add_argument("--max-num-epochs", type=int, default=4)
    p.add_argument("--max-seconds", type=int, default=None)
    p.add_argument("--max-num-checkpoint-not-improved", type=int, default=-1)
    p.add_argument("--checkpoint-improvement-threshold", type=float, default=0.0)
    p.add_argument("--decode-and-evaluate", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--loglevel", default="INFO")
    p.add_argument("--loglevel-secondary-workers", default="INFO")
    train(p.parse_args())


if __name__ == "__main__":
    main()
