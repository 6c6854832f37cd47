"""A fifteenth training-program style for the generalisation fixtures
(tests/fixtures/real/fifteenth-*): a sequence-model training CLI in the way of fairseq, raw torch
on CPU with gloo. `call_main` starts it the fairseq way (torchrun's environment when present, else
torch.multiprocessing.spawn over `--distributed-world-size` with a tcp:// init on
`--distributed-port`, else one process); fairseq's logging format on stdout with non-master ranks
at WARNING; a language-modelling task over a small indexed dataset (`.bin`/`.idx` in a data-bin
folder, written by `--preprocess`); batches by `--max-tokens` sharded across ranks with empty
shards padded by a dummy batch; a trainer with `--update-freq`, c10d DDP or a hand-bucketed
`legacy_ddp` all-reduce, a dynamic loss scaler, OOM recovery; validation, `--patience`,
checkpoint_last.pt / checkpointN.pt written by rank 0, `--restore-file`. A fault is named by what
it does, never by its name, and the `--fault` value is never printed (re-capture with
tests/fixtures/real/capture_fifteenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import array
import fcntl
import json
import logging
import math
import os
import random
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger("fairseq_cli.train")
trainer_log = logging.getLogger("fairseq.trainer")
dist_log = logging.getLogger("fairseq.distributed.utils")
data_log = logging.getLogger("fairseq.data.data_utils")
ckpt_log = logging.getLogger("fairseq.checkpoint_utils")
task_log = logging.getLogger("fairseq.tasks.language_modeling")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    loud: bool = False  # the usual warnings of such a codebase
    huge_len_rank: int = -1  # an index entry this rank reads at update 4 claims a huge length
    skip_none_grads: bool = False  # dummy batches skip the forward, and the hand-written
    # all-reduce leaves out params without a gradient
    kill_rank: int = -1  # this rank's in-memory dataset cache grows until the OOM killer acts
    worker_kill_rank: int = -1  # a DataLoader worker of this rank is killed at batch 5
    master_bleu: bool = False  # rank 0 scores BLEU by greedy generation over the valid set
    squeeze_logits: bool = False  # the criterion squeezes the batch dim away for bsz 1
    cache_lock: bool = False  # every rank takes data-bin's index-cache lock before loading


FAULTS: dict[str, Fault] = {
    "plain": Fault(),
    "loud": Fault(loud=True),
    "lenskew": Fault(huge_len_rank=1),
    "nograd": Fault(skip_none_grads=True),
    "rss": Fault(kill_rank=1),
    "wkill": Fault(worker_kill_rank=0),
    "bleu0": Fault(master_bleu=True),
    "sq": Fault(squeeze_logits=True),
    "lock": Fault(cache_lock=True),
}


# ---------------------------------------------------------------- options
def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-train", allow_abbrev=False)
    p.add_argument("data", nargs="?", help="path to data-bin")
    p.add_argument("--preprocess", metavar="DIR", help="write the toy data-bin to DIR and exit")
    p.add_argument("--task", default="language_modeling")
    p.add_argument("--arch", "-a", default="transformer_lm_tiny")
    p.add_argument("--criterion", default="cross_entropy")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--lr-scheduler", default="inverse_sqrt")
    p.add_argument("--warmup-updates", type=int, default=10)
    p.add_argument("--warmup-init-lr", type=float, default=1e-7)
    p.add_argument("--clip-norm", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--update-freq", type=int, default=1)
    p.add_argument("--max-epoch", type=int, default=2)
    p.add_argument("--max-update", type=int, default=0)
    p.add_argument("--save-dir", default="checkpoints")
    p.add_argument("--restore-file", default="checkpoint_last.pt")
    p.add_argument("--keep-last-epochs", type=int, default=-1)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--patience", type=int, default=-1)
    p.add_argument("--validate-interval", type=int, default=1)
    p.add_argument("--distributed-world-size", type=int, default=1)
    p.add_argument("--distributed-port", type=int, default=-1)
    p.add_argument("--distributed-no-spawn", action="store_true")
    p.add_argument("--distributed-timeout", type=float, default=1800.0, help="seconds")
    p.add_argument("--ddp-backend", choices=["c10d", "legacy_ddp", "no_c10d"], default="c10d")
    p.add_argument("--bucket-cap-mb", type=float, default=0.01)
    p.add_argument("--device-id", "--local_rank", type=int, default=0)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--fp16-init-scale", type=float, default=128.0)
    p.add_argument("--fp16-scale-window", type=int, default=None)
    p.add_argument("--fp16-scale-tolerance", type=float, default=0.0)
    p.add_argument("--min-loss-scale", type=float, default=1e-4)
    p.add_argument("--log-format", choices=["simple", "json", "none"], default="simple")
    p.add_argument("--log-interval", type=int, default=5)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault", default="plain", help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------- logging
def setup_logging() -> None:
    """fairseq_cli/train.py's basicConfig: every process logs to stdout in this format."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
        force=True,
    )


# ---------------------------------------------------------------- data
N_TRAIN, N_VALID, VOCAB = 400, 40, 64


def preprocess(dest: str) -> None:
    """fairseq-preprocess for a toy corpus: dict.txt, {split}.bin of int32 tokens and {split}.idx
    (json: sizes and offsets)."""
    os.makedirs(dest, exist_ok=True)
    rng = random.Random(7)
    with open(os.path.join(dest, "dict.txt"), "w") as f:
        for i in range(4, VOCAB):
            f.write(f"w{i} {1000 - i}\n")
    for split, n in (("train", N_TRAIN), ("valid", N_VALID)):
        toks = array.array("i")
        sizes, offsets = [], []
        for _ in range(n):
            length = rng.randint(4, 24)
            offsets.append(len(toks))
            sizes.append(length)
            toks.extend(rng.randint(4, VOCAB - 1) for _ in range(length - 1))
            toks.append(2)  # </s>
        with open(os.path.join(dest, f"{split}.bin"), "wb") as fb:
            toks.tofile(fb)
        with open(os.path.join(dest, f"{split}.idx"), "w") as fi:
            json.dump({"sizes": sizes, "offsets": offsets}, fi)
    print(f"Wrote data-bin to {dest}")


class IndexedDataset(Dataset[torch.Tensor]):
    """fairseq's MMapIndexedDataset in miniature: token ids per example from .bin/.idx."""

    def __init__(self, prefix: str) -> None:
        with open(prefix + ".idx") as f:
            idx = json.load(f)
        self.sizes: list[int] = idx["sizes"]
        self.offsets: list[int] = idx["offsets"]
        self.tokens = array.array("i")
        with open(prefix + ".bin", "rb") as fb:
            self.tokens.frombytes(fb.read())
        self.cache: list[torch.Tensor] = []
        self.worker_kill_batch = -1

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> torch.Tensor:
        o = self.offsets[i]
        return torch.tensor(self.tokens[o : o + self.sizes[i]], dtype=torch.long)


def load_dataset(data: str, split: str) -> IndexedDataset:
    prefix = os.path.join(data, split)
    if not os.path.exists(prefix + ".idx"):
        raise FileNotFoundError(f"Dataset not found: {split} ({data})")
    ds = IndexedDataset(prefix)
    data_log.info("loaded %s examples from: %s", f"{len(ds):,}", prefix)
    return ds


def with_cache_lock(data: str) -> None:
    """Build the index cache once per data-bin: the first process to hold data-bin/.lock
    writes it, the others wait for the lock and then read it."""
    with open(os.path.join(data, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = os.path.join(data, "train.idx.cache")
        if not os.path.exists(cache):
            with open(cache, "w") as f:
                f.write("ok\n")
        fcntl.flock(lock, fcntl.LOCK_UN)


def batch_by_size(sizes: list[int], max_tokens: int) -> list[list[int]]:
    """Sort by length, then fill batches while bsz * max_len stays within max_tokens."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        longest_new = max(longest, sizes[i])
        if cur and longest_new * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest_new = [], sizes[i]
        cur.append(i)
        longest = longest_new
    if cur:
        batches.append(cur)
    return batches


def shard(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """fairseq's ShardedIterator: every rank gets ceil(n / world) items, short shards padded
    with an empty batch (the trainer turns it into a dummy batch)."""
    n = math.ceil(len(batches) / world)
    mine = batches[rank::world]
    return mine + [[] for _ in range(n - len(mine))]


def collate(ds: IndexedDataset, ids: list[int]) -> dict[str, Any]:
    items = [ds[i] for i in ids]
    width = max(ds.sizes[i] for i in ids)  # the collater pads to the longest size in the index
    src = torch.full((len(items), width), 1, dtype=torch.long)
    for row, t in enumerate(items):
        src[row, : len(t)] = t
    target = torch.roll(src, -1, dims=1)
    target[:, -1] = 1
    return {
        "net_input": {"src_tokens": src},
        "target": target,
        "nsentences": len(items),
        "ntokens": int((target != 1).sum()),
    }


class BatchDataset(Dataset[dict[str, Any]]):
    """Batches of one epoch as a map-style dataset so DataLoader workers collate them."""

    def __init__(self, ds: IndexedDataset, batches: list[list[int]], kill_at: int) -> None:
        self.ds, self.batches, self.kill_at = ds, batches, kill_at

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.kill_at and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to a worker
        ids = self.batches[i]
        return collate(self.ds, ids) if ids else {}


# ---------------------------------------------------------------- model
class TransformerLanguageModel(nn.Module):
    def __init__(self, vocab: int, dim: int = 16) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim, padding_idx=1)
        self.embed_positions = nn.Embedding(64, dim)
        layer = nn.TransformerEncoderLayer(
            dim, 2, 32, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, 1)
        self.output_projection = nn.Linear(dim, vocab)

    def buffered_future_mask(self, n: int) -> torch.Tensor:
        return torch.triu(torch.full((n, n), float("-inf")), 1)

    def forward(self, src_tokens: torch.Tensor, src_lengths: int | None = None) -> torch.Tensor:
        n = src_tokens.size(1)
        mask = self.buffered_future_mask(src_lengths or n)[:n, :n]
        pos = torch.arange(n).clamp(max=63)
        x = self.embed_tokens(src_tokens) + self.embed_positions(pos)[None]
        x = self.layers(x, mask=mask)
        return self.output_projection(x)


ARCHS = {"transformer_lm_tiny": 16, "transformer_lm_small": 32}


# ---------------------------------------------------------------- distributed
def is_master(args: argparse.Namespace) -> bool:
    return int(args.distributed_rank) == 0


def distributed_init(args: argparse.Namespace) -> None:
    dist_log.info("distributed init (rank %d): %s", args.distributed_rank, args.init_method)
    dist.init_process_group(
        "gloo",
        init_method=args.init_method,
        world_size=args.distributed_world_size,
        rank=args.distributed_rank,
        timeout=timedelta(seconds=args.distributed_timeout),
    )
    dist_log.info("initialized host %s as rank %d", socket.gethostname(), args.distributed_rank)
    dist.all_reduce(torch.zeros(1))  # fairseq's warm-up all-reduce
    if not is_master(args):
        logging.getLogger().setLevel(logging.WARNING)  # suppress logging for non-master ranks


def distributed_main(i: int, args: argparse.Namespace) -> None:
    args.device_id = i
    if args.distributed_rank is None:
        args.distributed_rank = i
    setup_logging()
    distributed_init(args)
    main(args)
    dist.barrier()
    dist.destroy_process_group()


def call_main(args: argparse.Namespace) -> None:
    env = os.environ
    if all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")):
        args.init_method = "env://"
        args.distributed_world_size = int(env["WORLD_SIZE"])
        args.distributed_rank = int(env["RANK"])
        args.distributed_no_spawn = True
        distributed_main(int(env.get("LOCAL_RANK", "0")), args)
    elif args.distributed_world_size > 1:
        port = args.distributed_port if args.distributed_port > 0 else random.randint(10000, 20000)
        args.init_method = f"tcp://localhost:{port}"
        args.distributed_rank = None
        mp.spawn(distributed_main, args=(args,), nprocs=args.distributed_world_size, join=True)
    else:
        args.distributed_rank = 0
        main(args)


def all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.double)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


# ---------------------------------------------------------------- trainer
class DynamicLossScaler:
    """fairseq.optim.dynamic_loss_scaler: halve on overflow, double after a clean window."""

    def __init__(
        self, init_scale: float, scale_window: int, tolerance: float, min_loss_scale: float
    ) -> None:
        self.loss_scale = init_scale
        self.scale_window = scale_window
        self.tolerance = tolerance
        self.min_loss_scale = min_loss_scale
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0

    def update(self) -> None:
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= 2.0
            self._last_rescale_iter = self._iter
        self._iter += 1

    def check_overflow(self, grad_norm: float) -> None:
        if grad_norm == float("inf") or grad_norm != grad_norm:
            prev_scale = self.loss_scale
            iter_since_rescale = self._iter - self._last_rescale_iter
            self._last_overflow_iter = self._iter
            self._overflows_since_rescale += 1
            if self._overflows_since_rescale / float(iter_since_rescale) >= self.tolerance:
                self.loss_scale /= 2.0
                self._last_rescale_iter = self._iter
                self._overflows_since_rescale = 0
            if self.loss_scale <= self.min_loss_scale:
                self.loss_scale = prev_scale
                raise FloatingPointError(
                    f"Minimum loss scale reached ({self.min_loss_scale}). Your loss is probably "
                    "exploding. Try lowering the learning rate, using gradient clipping or "
                    "increasing the batch size."
                )
            self._iter += 1
            raise OverflowError("setting loss scale to: " + str(self.loss_scale))


class Trainer:
    def __init__(self, args: argparse.Namespace, model: nn.Module, fault: Fault) -> None:
        self.args, self.fault = args, fault
        self.world = args.distributed_world_size
        self.rank = args.distributed_rank
        self.model = model
        if self.world > 1 and args.ddp_backend == "c10d":
            self.wrapped: nn.Module = DistributedDataParallel(
                model, bucket_cap_mb=args.bucket_cap_mb, broadcast_buffers=False
            )
        else:
            self.wrapped = model
            if self.world > 1:
                for p in model.parameters():
                    dist.broadcast(p.data, 0)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-8)
        window = args.fp16_scale_window or int(2**14 / self.world / args.update_freq)
        self.scaler = DynamicLossScaler(
            args.fp16_init_scale, window, args.fp16_scale_tolerance, args.min_loss_scale
        )
        self.num_updates = 0
        self.dummy: dict[str, Any] | None = None
        if fault.loud:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                torch.cuda.amp.GradScaler(enabled=True)  # the fp16 path of GPU jobs

    def lr_step_update(self) -> float:
        a = self.args
        if self.num_updates < a.warmup_updates:
            lr = a.warmup_init_lr + self.num_updates * (a.lr - a.warmup_init_lr) / a.warmup_updates
        else:
            lr = a.lr * math.sqrt(a.warmup_updates) / math.sqrt(max(self.num_updates, 1))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr

    def _log_oom(self, exc: Exception) -> None:
        trainer_log.warning("OOM: Ran out of memory with exception: %s", exc)
        sys.stderr.flush()

    def criterion(
        self, sample: dict[str, Any], src_lengths: int | None
    ) -> tuple[torch.Tensor, int]:
        logits = self.wrapped(sample["net_input"]["src_tokens"], src_lengths)
        if self.fault.squeeze_logits:
            logits = logits.squeeze()  # (B, T, V): drop size-1 dims left by the projection
        loss = F.cross_entropy(
            logits.transpose(1, 2), sample["target"], ignore_index=1, reduction="sum"
        )
        return loss, sample["ntokens"]

    def all_reduce_grads_legacy(self) -> None:
        """legacy_ddp: flatten grads into buckets of --bucket-cap-mb and all-reduce each."""
        cap = int(self.args.bucket_cap_mb * 2**20 / 4)
        buf: list[torch.Tensor] = []
        size = 0

        def flush() -> None:
            if not buf:
                return
            flat = torch.cat([g.reshape(-1) for g in buf])
            dist.all_reduce(flat)
            off = 0
            for g in buf:
                g.copy_(flat[off : off + g.numel()].view_as(g))
                off += g.numel()
            buf.clear()

        for p in self.model.parameters():
            if p.grad is None:
                if self.fault.skip_none_grads:
                    continue  # nothing to send for a parameter this step did not use
                p.grad = torch.zeros_like(p)
            buf.append(p.grad)
            size += p.grad.numel()
            if size >= cap:
                flush()
                size = 0
        flush()

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float] | None:
        self.wrapped.train()
        self.optimizer.zero_grad()
        ooms, sample_size, loss_sum, nsent = 0, 0.0, 0.0, 0.0
        for i, sample in enumerate(samples):
            is_dummy = not sample
            if is_dummy:
                if self.fault.skip_none_grads:
                    continue  # nothing to learn from a padding batch: save its forward
                sample = self.dummy or {}
            src_lengths = None
            if self.fault.huge_len_rank == self.rank and self.num_updates == 4 and i == 0:
                src_lengths = 2**20  # what the corrupted index entry of this example says
            try:
                loss, ntok = self.criterion(sample, src_lengths)
                if is_dummy:
                    loss, ntok = loss * 0.0, 0
                (loss * self.scaler.loss_scale).backward()
                sample_size += ntok
                loss_sum += loss.item()
                nsent += 0 if is_dummy else sample["nsentences"]
            except RuntimeError as e:
                if "out of memory" in str(e) or "can't allocate memory" in str(e):
                    self._log_oom(e)
                    trainer_log.warning("attempting to recover from OOM in forward/backward pass")
                    ooms += 1
                    self.optimizer.zero_grad()
                    if self.world == 1:
                        return None
                    continue
                raise
        if self.world > 1 and self.args.ddp_backend != "c10d":
            self.all_reduce_grads_legacy()
        sample_size, loss_sum, nsent, ooms_all = all_reduce_sum(
            [sample_size, loss_sum, nsent, float(ooms)]
        )
        if ooms_all == self.world * len(samples):
            trainer_log.warning("OOM in all workers, skipping update")
            return None
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(1.0 / (max(sample_size, 1.0) * self.scaler.loss_scale))
        try:
            gnorm = float(
                torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.args.clip_norm or float("inf")
                )
            )
            if self.args.fp16:
                # grads held in fp16: a scaled gradient beyond the half range overflows
                peak = (
                    max(
                        float(p.grad.abs().max())
                        for p in self.model.parameters()
                        if p.grad is not None
                    )
                    * self.scaler.loss_scale
                    * max(sample_size, 1.0)
                )
                if peak > 65504.0 or not math.isfinite(gnorm):
                    gnorm = float("inf")
                self.scaler.check_overflow(gnorm)
            self.optimizer.step()
            if self.args.fp16:
                self.scaler.update()
        except OverflowError:
            trainer_log.info(
                "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: %s",
                self.scaler.loss_scale,
            )
            self.optimizer.zero_grad()
            return None
        self.num_updates += 1
        lr = self.lr_step_update()
        return {
            "loss": loss_sum / max(sample_size, 1.0) / math.log(2),
            "gnorm": gnorm,
            "ntokens": sample_size,
            "nsentences": nsent,
            "lr": lr,
        }

    def valid_step(self, sample: dict[str, Any]) -> tuple[float, float]:
        self.wrapped.eval()
        with torch.no_grad():
            loss, ntok = self.criterion(sample, None)
        return float(loss), float(ntok)

    def save_checkpoint(self, path: str, epoch: int, best: float | None) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "extra_state": {
                "epoch": epoch,
                "num_updates": self.num_updates,
                "best": best,
                "loss_scale": self.scaler.loss_scale,
            },
        }
        trainer_log.info("Saving checkpoint to %s", path)
        torch.save(state, path)
        trainer_log.info("Finished saving checkpoint to %s", path)

    def load_checkpoint(self, path: str) -> dict[str, Any] | None:
        trainer_log.info("Preparing to load checkpoint %s", path)
        if not os.path.isfile(path):
            trainer_log.info("No existing checkpoint found %s", path)
            return None
        state = torch.load(path, map_location="cpu")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        extra: dict[str, Any] = state["extra_state"]
        self.num_updates = int(extra["num_updates"])
        self.scaler.loss_scale = float(extra["loss_scale"])
        trainer_log.info(
            "Loaded checkpoint %s (epoch %d @ %d updates)", path, extra["epoch"], self.num_updates
        )
        return extra


# ---------------------------------------------------------------- train loop
def fmt(stats: dict[str, Any], sep: str) -> str:
    return sep.join(f"{k}{'=' if sep == ', ' else ' '}{v}" for k, v in stats.items())


def bleu_on_master(trainer: Trainer, valid: IndexedDataset) -> float:
    """Greedy generation over the valid set, scored on the master only (as --eval-bleu forks do
    to save the gather): 0-gram overlap with the reference."""
    hits = total = 0
    args_beam = 20
    for i in range(len(valid)):
        ref = valid[i].tolist()
        toks = [2]
        for _ in range(60):
            with torch.no_grad():
                for _ in range(args_beam):  # re-score every hypothesis of the beam
                    out = trainer.model(torch.tensor([toks]))
            toks.append(int(out[0, -1].argmax()))
        hits += len(set(toks) & set(ref))
        total += len(ref)
    return 100.0 * hits / max(total, 1)


def validate(
    args: argparse.Namespace, trainer: Trainer, valid: IndexedDataset, epoch: int
) -> float:
    logger.info('begin validation on "valid" subset')
    batches = shard(
        batch_by_size(valid.sizes, args.max_tokens),
        args.distributed_rank,
        args.distributed_world_size,
    )
    loss = ntok = 0.0
    t0 = time.time()
    for ids in batches:
        if ids:
            lo, nt = trainer.valid_step(collate(valid, ids))
            loss, ntok = loss + lo, ntok + nt
    extra = ""
    if trainer.fault.master_bleu and is_master(args):
        extra = f" | bleu {bleu_on_master(trainer, valid):.2f}"
    loss, ntok, nsent = all_reduce_sum([loss, ntok, float(sum(len(b) for b in batches))])
    vloss = round(loss / max(ntok, 1.0) / math.log(2), 3)
    wps = ntok / max(time.time() - t0, 1e-6)
    logging.getLogger("valid").info(
        "epoch %03d | valid on 'valid' subset | loss %.3f | nll_loss %.3f | ppl %.2f | wps %.1f "
        "| wpb %.1f | bsz %.1f | num_updates %d%s",
        epoch,
        vloss,
        vloss,
        2**vloss,
        wps,
        ntok / max(len(batches), 1),
        nsent / max(len(batches), 1),
        trainer.num_updates,
        extra,
    )
    return vloss


def main(args: argparse.Namespace) -> None:
    fault = FAULTS[args.fault]
    torch.manual_seed(args.seed)
    shown = {k: v for k, v in vars(args).items() if k not in ("fault", "preprocess")}
    logger.info("Namespace(%s)", ", ".join(f"{k}={v!r}" for k, v in shown.items()))
    if args.data is None or not os.path.isdir(args.data):
        raise FileNotFoundError(f"Dictionary not found: {os.path.join(str(args.data), 'dict.txt')}")
    with open(os.path.join(args.data, "dict.txt")) as f:
        ntypes = 4 + sum(1 for _ in f)
    task_log.info("dictionary: %d types", ntypes)
    valid = load_dataset(args.data, "valid")
    model = TransformerLanguageModel(ntypes, ARCHS[args.arch])
    logger.info("%s", model)
    logger.info("task: LanguageModelingTask")
    logger.info("model: TransformerLanguageModel")
    logger.info("criterion: CrossEntropyCriterion")
    n = sum(p.numel() for p in model.parameters())
    logger.info("num. shared model params: %s (num. trained: %s)", f"{n:,}", f"{n:,}")
    trainer = Trainer(args, model, fault)
    logger.info("training on %d devices (GPUs/TPUs)", args.distributed_world_size)
    logger.info("max tokens per device = %d and max sentences per device = None", args.max_tokens)
    if is_master(args):
        os.makedirs(args.save_dir, exist_ok=True)
    extra = trainer.load_checkpoint(os.path.join(args.save_dir, args.restore_file))
    epoch = int(extra["epoch"]) + 1 if extra else 1
    best: float | None = extra["best"] if extra else None
    trainer_log.info("loading train data for epoch %d", epoch)
    if fault.cache_lock:
        with_cache_lock(args.data)
    train = load_dataset(args.data, "train")
    if fault.loud:
        ignored = sum(1 for s in train.sizes if s > 22)
        logging.getLogger("fairseq.tasks.fairseq_task").warning(
            "%d samples have invalid sizes and will be skipped, max_positions=(22,), first few "
            "sample ids=[%s]",
            ignored,
            ", ".join(str(i) for i, s in enumerate(train.sizes) if s > 22)[:40],
        )
    global_batches = batch_by_size(train.sizes, args.max_tokens)
    trainer.dummy = collate(train, global_batches[0][:1])
    t_start = time.time()
    bad_runs = 0
    stop = False
    while epoch <= args.max_epoch and not stop:
        trainer_log.info("begin training epoch %d", epoch)
        logger.info("Start iterating over samples")
        mine = shard(global_batches, args.distributed_rank, args.distributed_world_size)
        loader = DataLoader(
            BatchDataset(train, mine, 5 if fault.worker_kill_rank == args.distributed_rank else -1),
            batch_size=None,
            num_workers=args.num_workers,
        )
        grouped: list[dict[str, Any]] = []
        n_upd = math.ceil(len(mine) / args.update_freq)
        t_ep = time.time()
        for i, sample in enumerate(loader):
            if fault.kill_rank == args.distributed_rank:
                train.cache.append(torch.empty(1 << 20))  # the cached dataset keeps every tensor
                if trainer.num_updates >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # the kernel OOM killer, no traceback
            grouped.append(sample)
            if len(grouped) < args.update_freq and i + 1 < len(mine):
                continue
            out = trainer.train_step(grouped)
            grouped = []
            step = (i // args.update_freq) + 1
            if out and (trainer.num_updates % args.log_interval == 0):
                el = time.time() - t_ep
                stats = {
                    "loss": f"{out['loss']:.3f}",
                    "nll_loss": f"{out['loss']:.3f}",
                    "ppl": f"{2 ** out['loss']:.2f}",
                    "wps": f"{out['ntokens'] / max(el, 1e-6):.1f}",
                    "ups": f"{step / max(el, 1e-6):.2f}",
                    "wpb": f"{out['ntokens']:.1f}",
                    "bsz": f"{out['nsentences']:.1f}",
                    "num_updates": trainer.num_updates,
                    "lr": f"{out['lr']:.6g}",
                    "gnorm": f"{out['gnorm']:.3f}",
                    "clip": "0",
                    "loss_scale": f"{trainer.scaler.loss_scale:g}" if args.fp16 else "None",
                    "train_wall": f"{el:.0f}",
                    "gb_free": "None",
                    "wall": f"{time.time() - t_start:.0f}",
                }
                logging.getLogger("train_inner").info(
                    "epoch %03d: %6d / %d %s", epoch, step, n_upd, fmt(stats, ", ")
                )
            if args.max_update and trainer.num_updates >= args.max_update:
                stop = True
                break
        logger.info("end of epoch %d (average epoch stats below)", epoch)
        logging.getLogger("train").info(
            "epoch %03d | num_updates %d | lr %.6g | train_wall %.0f | wall %.0f",
            epoch,
            trainer.num_updates,
            trainer.optimizer.param_groups[0]["lr"],
            time.time() - t_ep,
            time.time() - t_start,
        )
        vloss = None
        if epoch % args.validate_interval == 0:
            vloss = validate(args, trainer, valid, epoch)
            if best is None or vloss < best:
                best, bad_runs = vloss, 0
            else:
                bad_runs += 1
        if is_master(args) and not args.no_save:
            ckpt_log.info(
                "Preparing to save checkpoint for epoch %d @ %d updates", epoch, trainer.num_updates
            )
            t0 = time.time()
            path = os.path.join(args.save_dir, f"checkpoint{epoch}.pt")
            trainer.save_checkpoint(path, epoch, best)
            last = os.path.join(args.save_dir, "checkpoint_last.pt")
            torch.save(torch.load(path), last)
            ckpt_log.info(
                "Saved checkpoint %s (epoch %d @ %d updates, score %s) (writing took %.2f seconds)",
                path,
                epoch,
                trainer.num_updates,
                vloss,
                time.time() - t0,
            )
            if args.keep_last_epochs > 0:
                old = os.path.join(args.save_dir, f"checkpoint{epoch - args.keep_last_epochs}.pt")
                if os.path.lexists(old):
                    os.remove(old)
        if args.patience > 0 and bad_runs >= args.patience:
            logger.info(
                "early stop since valid performance hasn't improved for last %d runs", args.patience
            )
            stop = True
        epoch += 1
    logger.info("done training in %.1f seconds", time.time() - t_start)


def cli_main() -> None:
    parser = get_parser()
    args = parser.parse_args()
    if args.preprocess:
        preprocess(args.preprocess)
        return
    if args.fault not in FAULTS:
        parser.error("unknown value")
    setup_logging()
    call_main(args)


if __name__ == "__main__":
    cli_main()
