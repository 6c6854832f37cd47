"""An eightieth training-program style for the generalisation fixtures
(tests/fixtures/real/eightieth-*): GPT pre-training in the way of Megatron-LM's `pretrain_gpt.py`
with its own data-parallel machinery written by hand, as Megatron's
megatron/core/distributed/{distributed_data_parallel,param_and_grad_buffer}.py and its
distributed optimizer do it, in plain torch on gloo (CPU):

- the parameters and their gradients live in two contiguous flat buffers (`param_data`,
  `grad_data`), split into buckets of about --ddp-bucket-size elements in reverse order of
  registration, each bucket padded to a multiple of lcm(dp, 128);
- `--overlap-grad-reduce`: a post-accumulate-grad hook per parameter adds the grad into its
  `main_grad` view and registers it ready with its bucket; when every parameter of a bucket is
  ready (last micro-batch only: the others run under `no_sync()`), the bucket launches its
  collective with async_op=True and keeps the Work handle; `finish_grad_sync()` waits on every
  handle (and asserts that every bucket's communication was issued) before the optimizer step;
- `--use-distributed-optimizer` (ZeRO-1 by hand): each bucket is reduce-scattered
  (`reduce_scatter_single`; torch 2.13's gloo implements it, and the older
  `reduce_scatter_tensor` / `all_gather_into_tensor` as deprecated aliases) into the rank's
  shard, the rank keeps Adam's state for its shard only, steps it, and the updated parameters
  are all-gathered back bucket by bucket (`all_gather_single`);
- a tiny GPT (learned positions, pre-LN blocks, optional top-1 MoE MLP in a hand-written loop
  over local experts) on a synthetic Megatron indexed dataset (`<prefix>.bin` / `.idx`, written
  by --make-data in the way of tools/preprocess_data.py), GPTDataset's document / sample /
  shuffle indices built on rank 0 and cached in --data-cache-path, Megatron's pretraining
  sampler; Megatron's logs: the arguments table, print_rank_0 / print_rank_last, the iteration
  line, validation lines, `iter_XXXXXXX/mp_rank_00/...` checkpoints and
  latest_checkpointed_iteration.txt, --exit-duration-in-mins, --exit-signal-handler,
  --check-for-nan-in-loss-and-grad, --log-params-norm.

Launched by tests/programs/eightieth_train_gpt.sh (torchrun, as Megatron's examples do). A fault
in the code is chosen by $MGQ (a short code) and never printed; the others are in what a run is
given (re-capture with tests/fixtures/real/capture_eightieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import logging
import math
import os
import signal
import socket
import struct
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

logging.basicConfig(level=logging.INFO)
logger = logging.getLogger("megatron")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    old_names: bool = False  # the deprecated collective names, a fallback import warning
    solo_clock: int = -1  # this rank alone checks --exit-duration-in-mins, without the all-reduce
    eod_batch: int = -1  # this rank's micro-batches are all end-of-document from iteration 7
    drop_expert: int = -1  # this rank's expert loop skips an expert given no token
    solo_norm: int = -1  # the params norm computed (an all-reduce) on the last rank only
    hoard: int = -1  # this rank keeps fp32 copies of the grad buffer until the OOM killer acts
    null_kernel: int = -1  # this rank's fused-kernel loader reads address 0
    reap_worker: int = -1  # this rank's DataLoader worker is SIGKILLed at iteration 8


FAULTS = {
    "": Fault(),
    "w": Fault(old_names=True),
    "c0": Fault(solo_clock=0),
    "z1": Fault(eod_batch=1),
    "x1": Fault(drop_expert=1),
    "p1": Fault(solo_norm=1),
    "h1": Fault(hoard=1),
    "s1": Fault(null_kernel=1),
    "k1": Fault(reap_worker=1),
}
FAULT = FAULTS[os.environ.get("MGQ", "")]

# --------------------------------------------------------------------------- arguments


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    g = p.add_argument_group("network size")
    g.add_argument("--num-layers", type=int, default=2)
    g.add_argument("--hidden-size", type=int, default=64)
    g.add_argument("--ffn-hidden-size", type=int, default=None)
    g.add_argument("--num-attention-heads", type=int, default=4)
    g.add_argument("--seq-length", type=int, default=32)
    g.add_argument("--max-position-embeddings", type=int, default=32)
    g.add_argument("--num-experts", type=int, default=None)
    g.add_argument("--moe-router-topk", type=int, default=1)
    g.add_argument("--tokenizer-type", default="NullTokenizer")
    g.add_argument("--vocab-size", type=int, default=500)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--global-batch-size", type=int, default=16)
    g.add_argument("--train-iters", type=int, default=30)
    g.add_argument("--lr", type=float, default=3e-3)
    g.add_argument("--min-lr", type=float, default=3e-4)
    g.add_argument("--lr-decay-style", default="cosine")
    g.add_argument("--lr-warmup-iters", type=int, default=5)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--exit-duration-in-mins", type=float, default=None)
    g.add_argument("--exit-signal-handler", action="store_true")
    g.add_argument("--check-for-nan-in-loss-and-grad", action="store_true")
    g.add_argument("--eod-mask-loss", action="store_true")
    g = p.add_argument_group("distributed")
    g.add_argument("--distributed-backend", default="nccl")
    g.add_argument("--distributed-timeout-minutes", type=float, default=10)
    g.add_argument("--overlap-grad-reduce", action="store_true")
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--ddp-bucket-size", type=int, default=None)
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g = p.add_argument_group("data and dataloader")
    g.add_argument("--data-path", default=None)
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--split", default="969,30,1")
    g.add_argument("--num-workers", type=int, default=2)
    g.add_argument("--make-data", default=None, help=argparse.SUPPRESS)
    g = p.add_argument_group("logging and checkpointing")
    g.add_argument("--log-interval", type=int, default=100)
    g.add_argument("--log-params-norm", action="store_true")
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--no-load-optim", action="store_true")
    args = p.parse_args()
    args.rank = int(os.getenv("RANK", "0"))
    args.world_size = int(os.getenv("WORLD_SIZE", "1"))
    args.local_rank = int(os.getenv("LOCAL_RANK", "0"))
    args.data_parallel_size = args.world_size // (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    )
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if args.ddp_bucket_size is None:
        args.ddp_bucket_size = max(40000000, 1000000 * args.data_parallel_size)
    assert args.global_batch_size % (args.micro_batch_size * args.data_parallel_size) == 0, (
        f"global batch size ({args.global_batch_size}) is not divisible by micro batch size "
        f"({args.micro_batch_size}) times data parallel size ({args.data_parallel_size})"
    )
    args.num_micro_batches = args.global_batch_size // (
        args.micro_batch_size * args.data_parallel_size
    )
    args.params_dtype = torch.float32
    return args


def print_rank_0(message: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def print_rank_last(message: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1:
        print(message, flush=True)


def log_single_rank(log: logging.Logger, level: int, message: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.log(level, message)


def print_datetime(string: str) -> None:
    print_rank_0(f"[{string}] datetime: {datetime.now().strftime('%Y-%m-%d %H:%M:%S')} ")


# --------------------------------------------------------------------------- data


def make_data(prefix: str, vocab: int = 500, docs: int = 1200) -> None:
    """tools/preprocess_data.py's output for a synthetic corpus: <prefix>.bin (uint16 token
    ids, every document ends with the end-of-document token 0) and <prefix>.idx (the
    MMIDIDX index: sequence lengths, byte pointers, document indices)."""
    rng = np.random.default_rng(7)
    trans = rng.integers(1, vocab, size=(vocab, 3))
    seqs = []
    for _ in range(docs):
        n = int(rng.integers(20, 90))
        t = [int(rng.integers(1, vocab))]
        for _ in range(n - 1):
            t.append(int(trans[t[-1], rng.integers(0, 3)]))
        seqs.append(np.array([*t, 0], dtype=np.uint16))
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(s.tobytes())
    sizes = np.array([len(s) for s in seqs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 2]).astype(np.int64)
    doc_idx = np.arange(len(seqs) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


class IndexedDataset:
    def __init__(self, prefix: str) -> None:
        log = logging.getLogger("megatron.core.datasets.indexed_dataset")
        log_single_rank(log, logging.INFO, f"Load the _IndexReader from {prefix}.idx")
        with open(prefix + ".idx", "rb") as f:
            assert f.read(9) == b"MMIDIDX\x00\x00", "bad index file"
            (_version,) = struct.unpack("<Q", f.read(8))
            (_code,) = struct.unpack("<B", f.read(1))
            (n,) = struct.unpack("<Q", f.read(8))
            (nd,) = struct.unpack("<Q", f.read(8))
            log_single_rank(log, logging.INFO, "\tExtract the sequence lengths")
            self.sizes = np.frombuffer(f.read(4 * n), dtype=np.int32)
            log_single_rank(log, logging.INFO, "\tExtract the sequence pointers")
            self.pointers = np.frombuffer(f.read(8 * n), dtype=np.int64)
            log_single_rank(log, logging.INFO, "\tExtract the document indices")
            self.doc_idx = np.frombuffer(f.read(8 * nd), dtype=np.int64)
        log_single_rank(log, logging.INFO, f"> total number of sequences: {n}")
        log_single_rank(log, logging.INFO, f"> total number of documents: {nd - 1}")
        self.bin = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        start = self.pointers[i] // 2 + offset
        end = self.pointers[i] // 2 + (self.sizes[i] if length is None else offset + length)
        return np.asarray(self.bin[start:end])


class GPTDataset(torch.utils.data.Dataset):
    """Megatron's GPTDataset: documents of the split shuffled over as many epochs as the
    samples need, a sample index of (document position, offset) every seq_length tokens, a
    shuffle index over the samples; built on rank 0 and cached in the data cache path."""

    def __init__(self, ds, args, split: str, documents: np.ndarray, num_samples: int) -> None:
        self.ds, self.seq, self.split = ds, args.seq_length, split
        log = logging.getLogger("megatron.core.datasets.gpt_dataset")
        key = f"{args.data_path}-{split}-{documents[0]}-{documents[-1]}-{num_samples}-{self.seq}"
        h = hashlib.md5(key.encode()).hexdigest()
        cache = args.data_cache_path or os.path.join(os.path.dirname(args.data_path), "cache")
        cache = os.path.join(cache, "GPTDataset_indices")
        names = {
            k: os.path.join(cache, f"{h}-GPTDataset-{split}-{k}_index.npy")
            for k in ("document", "sample", "shuffle")
        }
        hit = all(os.path.isfile(p) for p in names.values())
        if not hit and dist.get_rank() == 0:
            log_single_rank(log, logging.INFO, f"Build and save the GPTDataset {split} indices")
            os.makedirs(cache, exist_ok=True)
            rng = np.random.RandomState(args.seed)
            tokens_per_epoch = int(ds.sizes[documents].sum())
            epochs = max(1, math.ceil((num_samples * self.seq + 1) / tokens_per_epoch))
            t0 = time.time()
            log_single_rank(
                log,
                logging.INFO,
                f"\tBuild and save the document index to {os.path.basename(names['document'])}",
            )
            doc_idx = np.concatenate([rng.permutation(documents) for _ in range(epochs)])
            np.save(names["document"], doc_idx)
            log_single_rank(log, logging.INFO, f"\t> time elapsed: {time.time() - t0:4f} seconds")
            t0 = time.time()
            log_single_rank(
                log,
                logging.INFO,
                f"\tBuild and save the sample index to {os.path.basename(names['sample'])}",
            )
            sample_idx = self._build_sample_idx(doc_idx, num_samples, log)
            np.save(names["sample"], sample_idx)
            log_single_rank(log, logging.INFO, f"\t> time elapsed: {time.time() - t0:4f} seconds")
            t0 = time.time()
            log_single_rank(
                log,
                logging.INFO,
                f"\tBuild and save the shuffle index to {os.path.basename(names['shuffle'])}",
            )
            np.save(names["shuffle"], rng.permutation(len(sample_idx) - 1))
            log_single_rank(log, logging.INFO, f"\t> time elapsed: {time.time() - t0:4f} seconds")
            with open(os.path.join(cache, f"{h}-GPTDataset-{split}-description.txt"), "w") as f:
                f.write(key + "\n")
        elif dist.get_rank() == 0:
            log_single_rank(log, logging.INFO, f"Load the GPTDataset {split} indices")
        dist.barrier()
        self.doc_idx = np.load(names["document"], allow_pickle=True, mmap_mode="r")
        self.sample_idx = np.load(names["sample"], allow_pickle=True, mmap_mode="r")
        self.shuffle_idx = np.load(names["shuffle"], allow_pickle=True, mmap_mode="r")
        log_single_rank(log, logging.INFO, f"> total number of samples: {len(self.shuffle_idx)}")

    def _build_sample_idx(self, doc_idx, num_samples, log) -> np.ndarray:
        """helpers.build_sample_idx, in Python (the C++ helpers are not compiled here)."""
        sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
        sizes = self.ds.sizes
        pos, off = 0, 0
        step = max(1, num_samples // 8)
        for s in range(1, num_samples + 1):
            remaining = self.seq + 1
            while remaining > 0:
                left = int(sizes[doc_idx[pos]]) - off
                if left >= remaining:
                    off += remaining - 1
                    remaining = 0
                else:
                    remaining -= left
                    pos += 1
                    off = 0
            sample_idx[s] = (pos, off)
            if s % step == 0 and num_samples >= 1_000_000:
                log_single_rank(log, logging.INFO, f"\t> sample index: {s}/{num_samples} samples")
        return sample_idx

    def __len__(self) -> int:
        return len(self.shuffle_idx)

    def __getitem__(self, idx: int) -> dict:
        i = int(self.shuffle_idx[idx % len(self.shuffle_idx)])
        (d0, o0), (d1, o1) = self.sample_idx[i], self.sample_idx[i + 1]
        if d0 == d1:
            t = self.ds.get(int(self.doc_idx[d0]), int(o0), int(o1 - o0 + 1))
        else:
            parts = [self.ds.get(int(self.doc_idx[d0]), int(o0))]
            for d in range(d0 + 1, d1):
                parts.append(self.ds.get(int(self.doc_idx[d])))
            parts.append(self.ds.get(int(self.doc_idx[d1]), 0, int(o1 + 1)))
            t = np.concatenate(parts)
        return {"text": torch.from_numpy(t.astype(np.int64))}


class PretrainingSampler:
    """MegatronPretrainingSampler: the global order, each rank its micro-batch slice."""

    def __init__(self, total, consumed, mbs, rank, dp) -> None:
        self.total, self.consumed, self.mbs, self.rank, self.dp = total, consumed, mbs, rank, dp

    def __iter__(self):
        batch = []
        for idx in range(self.consumed, self.total):
            batch.append(idx)
            if len(batch) == self.mbs * self.dp:
                yield batch[self.rank * self.mbs : (self.rank + 1) * self.mbs]
                batch = []


class ReapingDataset(torch.utils.data.Dataset):
    """The train split as the workers see it (the fault: a worker killed from outside)."""

    def __init__(self, inner, kill_at: int) -> None:
        self.inner, self.kill_at = inner, kill_at

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, idx: int) -> dict:
        if self.kill_at >= 0 and idx >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner[idx]


# --------------------------------------------------------------------------- model


class Attention(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.linear_qkv = nn.Linear(h, 3 * h)
        self.linear_proj = nn.Linear(h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.linear_qkv(x).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.linear_proj(o.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(h, f)
        self.linear_fc2 = nn.Linear(f, h)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class LocalExperts(nn.Module):
    def __init__(self, n: int, h: int, f: int) -> None:
        super().__init__()
        self.local_experts = nn.ModuleList(MLP(h, f) for _ in range(n))


class MoELayer(nn.Module):
    """Top-k routing, the local experts in a loop (an expert given no token still runs, on an
    empty input, so that its parameters get a grad)."""

    def __init__(self, n: int, h: int, f: int, topk: int) -> None:
        super().__init__()
        self.router = nn.Linear(h, n, bias=False)
        self.experts = LocalExperts(n, h, f)
        self.topk = topk

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        probs, idx = torch.topk(torch.softmax(logits, dim=-1), self.topk, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts.local_experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0 and FAULT.drop_expert == dist.get_rank():
                continue  # (the fault) an expert given no token skipped: its params get no grad
            out.index_add_(0, rows, expert(x[rows]) * probs[rows, slot, None])
        return out.view(shape)


class TransformerLayer(nn.Module):
    def __init__(self, args, moe: bool) -> None:
        super().__init__()
        h = args.hidden_size
        self.input_layernorm = nn.LayerNorm(h)
        self.self_attention = Attention(h, args.num_attention_heads)
        self.pre_mlp_layernorm = nn.LayerNorm(h)
        if moe:
            self.mlp = MoELayer(args.num_experts, h, args.ffn_hidden_size, args.moe_router_topk)
        else:
            self.mlp = MLP(h, args.ffn_hidden_size)

    def forward(self, x):
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp(self.pre_mlp_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, vocab: int, h: int, positions: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, h)
        self.position_embeddings = nn.Embedding(positions, h)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1])
        return self.word_embeddings(tokens) + self.position_embeddings(pos)[None]


class TransformerBlock(nn.Module):
    def __init__(self, args) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerLayer(args, moe=bool(args.num_experts) and i % 2 == 1)
            for i in range(args.num_layers)
        )
        self.final_layernorm = nn.LayerNorm(args.hidden_size)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)


class GPTModel(nn.Module):
    def __init__(self, args) -> None:
        super().__init__()
        self.embedding = Embedding(
            args.padded_vocab_size, args.hidden_size, args.max_position_embeddings
        )
        self.decoder = TransformerBlock(args)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        x = self.decoder(self.embedding(tokens))
        return x @ self.embedding.word_embeddings.weight.t()  # tied output layer


# --------------------------------------------------------------------------- DDP by hand


class Bucket:
    def __init__(self, params, param_data, grad_data, index, dp) -> None:
        self.params = params
        self.params_set = set(params)
        self.param_data, self.grad_data = param_data, grad_data
        self.index = index
        self.dp = dp
        self.params_with_grad: set = set()
        self.handle = None
        self.shard = torch.zeros(grad_data.numel() // dp)


class DistributedDataParallel(nn.Module):
    """megatron.core.distributed.DistributedDataParallel, reduced to what a CPU run needs."""

    def __init__(self, args, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.args = args
        self.overlap_grad_reduce = args.overlap_grad_reduce
        self.use_distributed_optimizer = args.use_distributed_optimizer
        self.check_for_nan = args.check_for_nan_in_loss_and_grad
        self.dp = dist.get_world_size()
        self.rank = dist.get_rank()
        self.is_last_microbatch = True
        log = logging.getLogger("megatron.core.distributed.distributed_data_parallel")
        log_single_rank(
            log,
            logging.INFO,
            "Setting up DistributedDataParallel with config DistributedDataParallelConfig("
            f"grad_reduce_in_fp32=False, overlap_grad_reduce={args.overlap_grad_reduce}, "
            f"overlap_param_gather=False, align_param_gather=False, use_distributed_optimizer="
            f"{args.use_distributed_optimizer}, num_distributed_optimizer_instances=1, "
            f"check_for_nan_in_grad={args.check_for_nan_in_loss_and_grad}, bucket_size="
            f"{args.ddp_bucket_size}, average_in_collective=False, fp8_param_gather=False)",
        )
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        pad = math.lcm(self.dp, 128)
        groups, cur, count = [], [], 0
        for name, p in reversed(named):
            cur.append((name, p))
            count += p.numel()
            if count >= args.ddp_bucket_size:
                groups.append(cur)
                cur, count = [], 0
        if cur:
            groups.append(cur)
        sizes = [math.ceil(sum(p.numel() for _, p in g) / pad) * pad for g in groups]
        if FAULT.hoard == self.rank:
            _hoard_until_killed()
        self.param_buffer = torch.zeros(sum(sizes))
        self.grad_buffer = torch.zeros(sum(sizes))
        log = logging.getLogger("megatron.core.distributed.param_and_grad_buffer")
        log_single_rank(
            log,
            logging.INFO,
            f"Number of buckets for gradient all-reduce / reduce-scatter: {len(groups)}",
        )
        self.buckets: list[Bucket] = []
        self.param_to_bucket = {}
        start = 0
        for k, (g, size) in enumerate(zip(groups, sizes, strict=True)):
            lines = [
                f"Params for bucket {k + 1} ({sum(p.numel() for _, p in g)} elements, "
                f"{size} padded size):"
            ]
            off = start
            for name, p in g:
                n = p.numel()
                self.param_buffer[off : off + n].copy_(p.data.view(-1))
                p.data = self.param_buffer[off : off + n].view_as(p)
                p.main_grad = self.grad_buffer[off : off + n].view_as(p)
                off += n
                lines.append(f"\tmodule.{name}")
            log_single_rank(log, logging.INFO, "\n".join(lines))
            bucket = Bucket(
                [p for _, p in g],
                self.param_buffer[start : start + size],
                self.grad_buffer[start : start + size],
                k,
                self.dp,
            )
            for _, p in g:
                self.param_to_bucket[p] = bucket
            self.buckets.append(bucket)
            start += size
        for _, p in named:
            p.register_post_accumulate_grad_hook(self._make_hook())

    def _make_hook(self):
        def hook(param):
            param.main_grad.add_(param.grad)
            param.grad = None
            if self.overlap_grad_reduce and self.is_last_microbatch:
                self.register_grad_ready(param)

        return hook

    def register_grad_ready(self, param) -> None:
        bucket = self.param_to_bucket[param]
        assert param in bucket.params_set, "Param is not in the bucket"
        assert param not in bucket.params_with_grad, "Cannot set grad twice"
        bucket.params_with_grad.add(param)
        if len(bucket.params_with_grad) == len(bucket.params):
            self.start_grad_sync(bucket)

    def start_grad_sync(self, bucket: Bucket) -> None:
        assert bucket.handle is None, (
            "Should not have multiple communication calls outstanding at once"
        )
        if self.check_for_nan:
            norm = bucket.grad_data.norm(p=2)
            assert not norm.isnan(), (
                f"Rank {self.rank}: found NaN in local grad norm in backward pass before "
                f"data-parallel communication collective. Device: cpu, node: "
                f"{socket.gethostname()}"
            )
        bucket.grad_data *= 1.0 / self.dp
        async_op = self.overlap_grad_reduce
        if self.use_distributed_optimizer:
            if FAULT.old_names:
                bucket.handle = dist.reduce_scatter_tensor(
                    bucket.shard, bucket.grad_data, async_op=async_op
                )
            else:
                bucket.handle = dist.reduce_scatter_single(
                    bucket.shard, bucket.grad_data, async_op=async_op
                )
        else:
            bucket.handle = dist.all_reduce(bucket.grad_data, async_op=async_op)

    def finish_grad_sync(self) -> None:
        for bucket in self.buckets:
            if not self.overlap_grad_reduce:
                self.start_grad_sync(bucket)  # synchronous: no handle to wait on
                bucket.handle = None
                bucket.params_with_grad.clear()
                continue
            assert bucket.handle is not None, (
                f"Communication call has not been issued for this bucket "
                f"({len(bucket.params_with_grad)}/{len(bucket.params)} params have grad "
                f"available)"
            )
            bucket.handle.wait()
            bucket.handle = None
            bucket.params_with_grad.clear()

    def zero_grad_buffer(self) -> None:
        self.grad_buffer.zero_()
        for bucket in self.buckets:
            bucket.handle = None
            bucket.params_with_grad.clear()

    @contextmanager
    def no_sync(self):
        self.is_last_microbatch = False
        try:
            yield
        finally:
            self.is_last_microbatch = True

    def forward(self, *a):
        return self.module(*a)


class DistributedOptimizer:
    """Adam over this rank's shard of every bucket (ZeRO-1 by hand)."""

    def __init__(self, args, ddp: DistributedDataParallel) -> None:
        self.args, self.ddp = args, ddp
        self.rank, self.dp = ddp.rank, ddp.dp
        self.shards = [b.param_data.view(self.dp, -1)[self.rank] for b in ddp.buckets]
        self.exp_avg = [torch.zeros_like(s) for s in self.shards]
        self.exp_avg_sq = [torch.zeros_like(s) for s in self.shards]
        self.step_count = 0
        self.lr = args.lr

    def step(self) -> tuple[float, int]:
        """-> (grad norm, skipped 0/1)"""
        args = self.args
        sq = torch.zeros(1)
        for b in self.ddp.buckets:
            sq += b.shard.double().pow(2).sum().float()
        dist.all_reduce(sq)
        norm = float(sq.sqrt())
        if not math.isfinite(norm):
            return norm, 1
        clip = min(1.0, args.clip_grad / (norm + 1e-6))
        self.step_count += 1
        b1, b2 = args.adam_beta1, args.adam_beta2
        for s, g0, m, v in zip(
            self.shards,
            [b.shard for b in self.ddp.buckets],
            self.exp_avg,
            self.exp_avg_sq,
            strict=True,
        ):
            g = g0 * clip
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            mhat = m / (1 - b1**self.step_count)
            vhat = v / (1 - b2**self.step_count)
            s.mul_(1 - self.lr * args.weight_decay)
            s.add_(-self.lr * mhat / (vhat.sqrt() + 1e-8))
        for b, s in zip(self.ddp.buckets, self.shards, strict=True):
            if FAULT.old_names:
                dist.all_gather_into_tensor(b.param_data, s.clone())
            else:
                dist.all_gather_single(b.param_data, s.clone())
        return norm, 0

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "exp_avg": self.exp_avg,
            "exp_avg_sq": self.exp_avg_sq,
            "param_shards": [s.clone() for s in self.shards],
        }

    def load_state_dict(self, sd: dict) -> None:
        self.step_count = sd["step"]
        for dst, src in zip(self.exp_avg, sd["exp_avg"], strict=True):
            dst.copy_(src)
        for dst, src in zip(self.exp_avg_sq, sd["exp_avg_sq"], strict=True):
            dst.copy_(src)


def _hoard_until_killed() -> None:
    """fp32 copies of the grad buffer kept per bucket size probe, until the OOM killer acts."""
    kept = []
    for _ in range(12):
        kept.append(torch.ones(16 * 1024 * 1024))  # 64 MiB each
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- training


class OptimizerParamScheduler:
    def __init__(self, args) -> None:
        self.args = args
        self.num_steps = 0

    def step(self) -> float:
        a = self.args
        self.num_steps += 1
        if self.num_steps <= a.lr_warmup_iters:
            return a.lr * self.num_steps / a.lr_warmup_iters
        ratio = (self.num_steps - a.lr_warmup_iters) / max(1, a.train_iters - a.lr_warmup_iters)
        ratio = min(1.0, ratio)
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * ratio))


class DistributedSignalHandler:
    def __init__(self, sig=signal.SIGTERM) -> None:
        self.sig = sig
        self._signal_received = False
        signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        self._signal_received = True

    def signals_received(self) -> list[bool]:
        flag = torch.tensor([int(self._signal_received)])
        out = torch.zeros(dist.get_world_size(), dtype=flag.dtype)
        dist.all_gather_single(out, flag)
        return [bool(x) for x in out.tolist()]


def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}", "mp_rank_00")


def save_checkpoint(args, iteration, ddp, opt, sched, consumed) -> None:
    print_rank_0(f"saving checkpoint at iteration {iteration:7d} to {args.save} in torch format")
    d = checkpoint_dir(args.save, iteration)
    os.makedirs(d, exist_ok=True)
    if dist.get_rank() == 0:
        torch.save(
            {
                "args": vars(args),
                "checkpoint_version": 3.0,
                "iteration": iteration,
                "model": ddp.module.state_dict(),
                "opt_param_scheduler": {"num_steps": sched.num_steps},
                "consumed_train_samples": consumed,
                "rng_state": [{"random_rng_state": torch.get_rng_state()}],
            },
            os.path.join(d, "model_optim_rng.pt"),
        )
    torch.save(opt.state_dict(), os.path.join(d, f"distrib_optim_rank_{dist.get_rank():03d}.pt"))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    print_rank_0(
        f"  successfully saved checkpoint from iteration {iteration:7d} to {args.save} "
        "[ t 1/1, p 1/1 ]"
    )


def load_checkpoint(args, ddp, opt, sched) -> tuple[int, int]:
    if not args.load:
        return 0, 0
    tracker = os.path.join(args.load, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        print_rank_0(f"WARNING: could not find the metadata file {tracker}")
        print_rank_0("    will not load any checkpoints and will start from random")
        return 0, 0
    with open(tracker) as f:
        iteration = int(f.read().strip())
    d = checkpoint_dir(args.load, iteration)
    print_rank_0(f" loading checkpoint from {args.load} at iteration {iteration}")
    state = torch.load(os.path.join(d, "model_optim_rng.pt"), weights_only=False)
    ddp.module.load_state_dict(state["model"])
    sched.num_steps = state["opt_param_scheduler"]["num_steps"]
    if not args.no_load_optim:
        sd = torch.load(
            os.path.join(d, f"distrib_optim_rank_{dist.get_rank():03d}.pt"), weights_only=False
        )
        opt.load_state_dict(sd)
    print_rank_0(
        f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] at iteration "
        f"{iteration}"
    )
    return iteration, state["consumed_train_samples"]


def load_fused_kernels(args) -> None:
    """megatron.legacy.fused_kernels.load: torch.utils.cpp_extension.load(verbose=True) of the
    softmax kernels into the extensions root (a FileBaton guards a build in progress)."""
    from torch.utils.file_baton import FileBaton

    root = os.environ.get(
        "TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache/torch_extensions")
    )
    root = os.path.join(root, "py311_cpu")
    print(f"Using {root} as PyTorch extensions root...", flush=True)
    for name in ("scaled_upper_triang_masked_softmax_cpu", "scaled_masked_softmax_cpu"):
        build = os.path.join(root, name)
        os.makedirs(build, exist_ok=True)
        so = os.path.join(build, name + ".so")
        if not os.path.exists(so):
            baton = FileBaton(os.path.join(build, "lock"))
            if baton.try_acquire():
                try:
                    with open(so, "wb") as f:
                        f.write(b"\x7fELF")
                finally:
                    baton.release()
            else:
                baton.wait()
        if FAULT.null_kernel == dist.get_rank():
            ctypes.string_at(0)
        print(f"Loading extension module {name}...", flush=True)


def get_batch(it, args, iteration: int):
    data = next(it)["text"]
    if FAULT.eod_batch == dist.get_rank() and iteration >= 7:
        data = torch.zeros_like(data)
    tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    loss_mask = torch.ones_like(labels, dtype=torch.float)
    if args.eod_mask_loss:
        loss_mask[labels == 0] = 0.0
    return tokens, labels, loss_mask


def loss_func(args, labels, loss_mask, output):
    losses = F.cross_entropy(output.float().transpose(1, 2), labels, reduction="none")
    loss = torch.sum(losses.view(-1) * loss_mask.view(-1)) / loss_mask.sum()
    if args.check_for_nan_in_loss_and_grad:
        assert not loss.isnan(), (
            f"Rank {dist.get_rank()}: found NaN in local forward loss calculation. "
            f"Device: cpu, node: {socket.gethostname()}"
        )
    return loss


def forward_backward(args, ddp, it, iteration: int, forward_only: bool = False):
    losses = []
    for mb in range(args.num_micro_batches):
        tokens, labels, loss_mask = get_batch(it, args, iteration)
        last = mb == args.num_micro_batches - 1
        ctx = ddp.no_sync() if not last else _null()
        with ctx:
            if forward_only:
                with torch.no_grad():
                    loss = loss_func(args, labels, loss_mask, ddp(tokens))
            else:
                loss = loss_func(args, labels, loss_mask, ddp(tokens))
                (loss / args.num_micro_batches).backward()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


@contextmanager
def _null():
    yield


def calc_params_l2_norm(opt: DistributedOptimizer) -> float:
    sq = torch.zeros(1)
    for s in opt.shards:
        sq += s.double().pow(2).sum().float()
    dist.all_reduce(sq)
    return float(sq.sqrt())


def evaluate(args, ddp, it, iteration, name) -> None:
    total = torch.zeros(2)
    for _ in range(args.eval_iters):
        total[0] += forward_backward(args, ddp, it, iteration, forward_only=True)
        total[1] += 1
    dist.all_reduce(total)
    loss = float(total[0] / total[1])
    string = (
        f" validation loss at iteration {iteration}{name} | lm loss value: {loss:.6E} | "
        f"lm loss PPL: {math.exp(min(20, loss)):.6E} | "
    )
    print_rank_last("-" * (len(string) + 1))
    print_rank_last(string)
    print_rank_last("-" * (len(string) + 1))


def cyclic(loader):
    while True:
        yield from loader


def main() -> None:
    args = parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    start = time.time()
    if args.rank == 0:
        print(
            f"using world size: {args.world_size}, data-parallel size: "
            f"{args.data_parallel_size}, context-parallel size: 1, hierarchical "
            "context-parallel sizes: Nonetensor-model-parallel size: "
            f"{args.tensor_model_parallel_size}, encoder-tensor-model-parallel size: 0, "
            f"pipeline-model-parallel size: {args.pipeline_model_parallel_size}, "
            "encoder-pipeline-model-parallel size: 0",
            flush=True,
        )
        print("using torch.float32 for parameters ...", flush=True)
        if FAULT.old_names:
            warnings.warn(
                "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
                stacklevel=1,
            )
        print("------------------------ arguments ------------------------", flush=True)
        for arg in sorted(vars(args)):
            if arg == "make_data":
                continue
            print(f"  {arg} {'.' * (48 - len(arg))} {getattr(args, arg)}", flush=True)
        print("-------------------- end of arguments ---------------------", flush=True)
        print(f"setting number of micro-batches to constant {args.num_micro_batches}", flush=True)
        print(f"> building {args.tokenizer_type} tokenizer ...", flush=True)
    m = args.make_vocab_size_divisible_by
    args.padded_vocab_size = math.ceil(args.vocab_size / m) * m
    if args.rank == 0:
        print(
            f" > padded vocab (size: {args.vocab_size}) with "
            f"{args.padded_vocab_size - args.vocab_size} dummy tokens (new size: "
            f"{args.padded_vocab_size})",
            flush=True,
        )
        print("> initializing torch distributed ...", flush=True)
    dist.init_process_group(
        backend=args.distributed_backend,
        world_size=args.world_size,
        rank=args.rank,
        timeout=timedelta(minutes=args.distributed_timeout_minutes),
    )
    print_rank_0("> initialized tensor model parallel with size 1")
    print_rank_0("> initialized pipeline model parallel with size 1")
    print_rank_0(f"> setting random seeds to {args.seed} ...")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    print_rank_0("> compiling dataset index builder ...")
    print_rank_0(">>> done with dataset index builder. Compilation time: 0.048 seconds")
    print_rank_0("> compiling and loading fused kernels ...")
    t0 = time.time()
    if dist.get_rank() == 0:
        load_fused_kernels(args)
    dist.barrier()
    if dist.get_rank() > 0:
        load_fused_kernels(args)
    dist.barrier()
    print_rank_0(
        f">>> done with compiling and loading fused kernels. Compilation time: "
        f"{time.time() - t0:.3f} seconds"
    )
    start_t = torch.tensor([start], dtype=torch.double)
    dist.all_reduce(start_t, op=dist.ReduceOp.MIN)
    print_rank_0(f"time to initialize megatron (seconds): {time.time() - float(start_t):.3f}")
    print_datetime("after megatron is initialized")
    if FAULT.old_names and dist.get_rank() == 0:
        warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=1)

    print_rank_0("building GPT model ...")
    model = GPTModel(args)
    nparams = sum(p.numel() for p in model.parameters())
    print_rank_0(
        f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {nparams}"
    )
    ddp = DistributedDataParallel(args, model)
    log = logging.getLogger("megatron.core.optimizer")
    log_single_rank(
        log,
        logging.INFO,
        f"Setting up optimizer with config OptimizerConfig(optimizer='adam', lr={args.lr}, "
        f"min_lr={args.min_lr}, decoupled_lr=None, decoupled_min_lr=None, weight_decay="
        f"{args.weight_decay}, fp16=False, bf16=False, params_dtype=torch.float32, "
        f"use_distributed_optimizer={args.use_distributed_optimizer}, clip_grad="
        f"{args.clip_grad}, adam_beta1={args.adam_beta1}, adam_beta2={args.adam_beta2})",
    )
    opt = DistributedOptimizer(args, ddp)
    sched = OptimizerParamScheduler(args)
    print_rank_0(f"> learning rate decay style: {args.lr_decay_style}")
    iteration, consumed = load_checkpoint(args, ddp, opt, sched)
    print_datetime("after model, optimizer, and learning rate scheduler are built")

    print_rank_0("> building train, validation, and test datasets ...")
    train_samples = args.train_iters * args.global_batch_size
    eval_samples = (
        (args.train_iters // args.eval_interval + 1) * args.eval_iters * (args.global_batch_size)
    )
    print_rank_0(" > datasets target sizes (minimum size):")
    print_rank_0(f"    train:      {train_samples}")
    print_rank_0(f"    validation: {eval_samples}")
    print_rank_0(f"    test:       {args.eval_iters * args.global_batch_size}")
    blog = logging.getLogger("megatron.core.datasets.blended_megatron_dataset_builder")
    log_single_rank(
        blog,
        logging.INFO,
        f"Building dataset splits with cls=GPTDataset, sizes=({train_samples}, {eval_samples}, "
        f"{args.eval_iters * args.global_batch_size}), and config=GPTDatasetConfig(random_seed="
        f"{args.seed}, sequence_length={args.seq_length}, blend=(['{args.data_path}'], None), "
        f"split='{args.split}', path_to_cache={args.data_cache_path}, mmap_bin_files=True, "
        f"mock=False, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss="
        f"{args.eod_mask_loss})",
    )
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    ds = IndexedDataset(args.data_path)
    n = len(ds.sizes)
    w = [float(x) for x in args.split.split(",")]
    b1 = round(n * w[0] / sum(w))
    b2 = round(n * (w[0] + w[1]) / sum(w))
    train_ds = GPTDataset(ds, args, "train", np.arange(0, b1), train_samples)
    valid_ds = GPTDataset(ds, args, "valid", np.arange(b1, b2), eval_samples)
    print_rank_0("> finished creating GPT datasets ...")
    rank, dp = dist.get_rank(), dist.get_world_size()
    kill_at = -1
    if FAULT.reap_worker == rank:
        kill_at = 8 * args.global_batch_size
    train_loader = torch.utils.data.DataLoader(
        ReapingDataset(train_ds, kill_at),
        batch_sampler=PretrainingSampler(train_samples, consumed, args.micro_batch_size, rank, dp),
        num_workers=args.num_workers,
        pin_memory=False,
        persistent_workers=args.num_workers > 0,
    )
    valid_loader = torch.utils.data.DataLoader(
        valid_ds,
        batch_sampler=PretrainingSampler(len(valid_ds), 0, args.micro_batch_size, rank, dp),
        num_workers=0,
    )
    train_it, valid_it = iter(cyclic(train_loader)), iter(cyclic(valid_loader))
    print_datetime("after dataloaders are built")
    print_rank_0("done with setup ...")
    print_rank_0("training ...")
    handler = DistributedSignalHandler() if args.exit_signal_handler else None
    train_start = time.time()
    print_datetime("before the start of training step")
    skipped = nan_iters = 0
    t_log = time.time()
    loss_acc = torch.zeros(1)
    acc_n = 0
    exit_reason = None
    while iteration < args.train_iters:
        lr = sched.step()
        opt.lr = lr
        ddp.zero_grad_buffer()
        loss = forward_backward(args, ddp, train_it, iteration)
        ddp.finish_grad_sync()
        grad_norm, skip = opt.step()
        skipped += skip
        red = torch.stack([loss, torch.ones(())])
        dist.all_reduce(red)
        loss_avg = float(red[0] / red[1])
        iteration += 1
        consumed += args.global_batch_size
        if not math.isfinite(loss_avg):
            nan_iters += 1
        loss_acc += loss_avg
        acc_n += 1
        params_norm = None
        if (
            args.log_params_norm
            and iteration % args.log_interval == 0
            and (FAULT.solo_norm < 0 or dist.get_rank() == FAULT.solo_norm)
        ):
            params_norm = calc_params_l2_norm(opt)
        if iteration % args.log_interval == 0:
            ms = (time.time() - t_log) * 1000 / args.log_interval
            t_log = time.time()
            line = (
                f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}] iteration {iteration:8d}/"
                f"{args.train_iters:8d} | consumed samples: {consumed:12d} | elapsed time per "
                f"iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | global batch size: "
                f"{args.global_batch_size:5d} | lm loss: {float(loss_acc) / acc_n:.6E} | "
                f"loss scale: 1.0 | grad norm: {grad_norm:.3f} | "
            )
            if params_norm is not None:
                line += f"params norm: {params_norm:.3f} | "
            line += (
                f"number of skipped iterations: {skipped:3d} | number of nan iterations: "
                f"{nan_iters:3d} |"
            )
            print_rank_last(line)
            loss_acc.zero_()
            acc_n = 0
            skipped = nan_iters = 0
        if handler is not None and any(handler.signals_received()):
            if args.save:
                save_checkpoint(args, iteration, ddp, opt, sched, consumed)
            print_datetime("exiting program after receiving SIGTERM.")
            exit_reason = "signal"
            break
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            save_checkpoint(args, iteration, ddp, opt, sched, consumed)
        if args.eval_interval and iteration % args.eval_interval == 0:
            evaluate(args, ddp, valid_it, iteration, "")
        if args.exit_duration_in_mins:
            train_time = (time.time() - train_start) / 60.0
            if FAULT.solo_clock >= 0:
                done = dist.get_rank() == FAULT.solo_clock and (
                    train_time > args.exit_duration_in_mins
                )
            else:
                done_t = torch.tensor([int(train_time > args.exit_duration_in_mins)])
                dist.all_reduce(done_t, op=dist.ReduceOp.MAX)
                done = bool(done_t.item())
            if done:
                if args.save:
                    save_checkpoint(args, iteration, ddp, opt, sched, consumed)
                print_datetime(f"exiting program after {train_time} minutes")
                sys.exit()
    if exit_reason is None:
        print_datetime("after training is done")
        if args.save and iteration % (args.save_interval or 1) != 0:
            save_checkpoint(args, iteration, ddp, opt, sched, consumed)
        evaluate(args, ddp, valid_it, iteration, " on validation set")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
