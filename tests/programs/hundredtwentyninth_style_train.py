"""A hundred-and-twenty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentyninth-*): LLM pre-training / supervised fine-tuning in the way of
InternLM's InternEvo (InternLM-train, train.py), re-created in plain torch. Copied into each run's
folder as train.py and started as its docs start it on one node, `torchrun --nproc_per_node=2
train.py --config ./configs/7B_sft.py --launcher torch` (`--launcher slurm` reads SLURM_PROCID,
SLURM_NPROCS and the master from `--host`/`--port`, as under `srun -p llm -n 2 python train.py
--config ./configs/7B_sft.py --launcher slurm`).

What is re-created: the python config module (JOB_NAME, data=dict(seq_len, micro_num, micro_bsz,
total_steps, train_folder, num_worker, ...), model=dict(..., use_flash_attn), parallel=dict(zero1=
dict(size=...), tensor=1, pipeline=dict(size=1)), ckpt=dict(save_ckpt_folder, load_ckpt_folder,
checkpoint_every), hybrid_zero_optimizer, grad_scaler, adam, monitor=dict(alert=...)), the logger
('%(asctime)s\\t%(levelname)s %(filename)s:%(lineno)s in %(funcName)s -- %(message)s' on every
rank), initialize_distributed_env ('Distributed environment is initialized, data parallel size:
2, pipeline parallel size: 1, tensor parallel size: 1', 'Set random seed to 1024', the parallel
sizes checked), a tokenized dataset of .bin files (one JSON object with "tokens" a line) and their
.bin.meta (an np array of (offset, num_tokens) a sample) written by `python train.py --prepare DIR`
(tools/tokenizer.py's output), read by a packed dataset (seq_len * micro_bsz tokens a pack,
cu_seqlens), one file per data-parallel rank; a tiny InternLM-like decoder (RMSNorm, rotary
attention, SwiGLU); the hybrid ZeRO-1 optimizer (flat fp32 master weights, each rank owns a shard
and its Adam state, gradients all-reduced, the global grad norm all-reduced, inf/nan steps skipped
with the loss scale backed off, the updated shards broadcast from their owners); the per-step
metrics line ('tflops=... step=... loss=... tgs (tokens/gpu/second)=... lr=... loss_scale=...
grad_norm={'0_default': ...} micro_num=... num_consumed_tokens=... inf_nan_skip_batches=...
...'), the checkpoint manager (local:llm_ckpts/<step>/model_tp0_pp0.pt, context.pt, one
optimizer_tp0_pp0_zo<rank>.pt a ZeRO rank; 'Saving checkpoint to local at step N'; load from
ckpt.load_ckpt_folder), the monitor's stuck check (a timer thread: 'Training may be in stuck
status, please check it.'), and train.py's exception handling: an exception in main is logged
('Raise exception from <host> with rank id: N' and the traceback) and swallowed, so the rank
exits 0.

gloo on CPU, 15 s collective timeout. A fault in the code is chosen by the TQ_CASE environment
variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import mmap
import os
import random
import runpy
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset


def fault():
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:]) if len(case) > 1 else -1


FAULT, FAULT_RANK = fault()


# ------------------------------------------------------------------ internlm/utils/logger.py
LOGGER_FORMAT = "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s in %(funcName)s -- %(message)s"


def get_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOGGER_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


logger = get_logger(__file__)


# ------------------------------------------------------------- internlm/core/context (gpc)
class GlobalContext:
    def __init__(self) -> None:
        self.config = None
        self.rank = 0
        self.world_size = 1
        self.zero1_size = 1

    def get_global_rank(self) -> int:
        return self.rank

    def is_rank_for_log(self) -> bool:
        return self.rank == 0


gpc = GlobalContext()


def to_namespace(obj):
    if isinstance(obj, dict):
        return SimpleNamespace(**{k: to_namespace(v) for k, v in obj.items()})
    return obj


def load_config(path: str) -> SimpleNamespace:
    """Config.from_file: the module's public names (the dicts and the constants)."""
    names = runpy.run_path(path)
    return to_namespace({k: v for k, v in names.items() if not k.startswith("_")})


def initialize_distributed_env(config: str, launcher: str, master_port: int, host: str, seed: int):
    gpc.config = load_config(config)
    if launcher == "torch":
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    elif launcher == "slurm":
        rank = int(os.environ["SLURM_PROCID"])
        world_size = int(os.environ["SLURM_NPROCS"])
        os.environ["MASTER_ADDR"] = host
        os.environ["MASTER_PORT"] = str(master_port)
    else:
        raise AssertionError(f"launcher {launcher} is not supported, only torch and slurm")
    dist.init_process_group(
        backend="gloo",
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=15),
    )
    gpc.rank, gpc.world_size = rank, world_size
    parallel = gpc.config.parallel
    tensor = parallel.tensor if isinstance(parallel.tensor, int) else parallel.tensor.size
    pipeline = parallel.pipeline.size
    data_parallel = world_size // (tensor * pipeline)
    zero1 = parallel.zero1.size
    if zero1 == -1:
        zero1 = data_parallel
    assert data_parallel % zero1 == 0, (
        f"zero1 parallel size ({zero1}) must divide data parallel size ({data_parallel})"
    )
    gpc.zero1_size = zero1
    if gpc.is_rank_for_log():
        logger.info(
            f"Distributed environment is initialized, data parallel size: {data_parallel}, "
            f"pipeline parallel size: {pipeline}, tensor parallel size: {tensor}"
        )
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    logger.info(f"Set random seed to {seed}")


# -------------------------------------------------------------- internlm/monitor/monitor.py
class MonitorTracker(threading.Thread):
    """The light monitor: alerts when no step was reported within alert_hang_trigger_sec."""

    def __init__(self, hang_sec: float) -> None:
        super().__init__(daemon=True)
        self.hang_sec = hang_sec
        self.last_active = time.time()
        self.last_step = -1
        self.alerted = False
        self.stopped = False

    def step(self, step: int) -> None:
        self.last_active = time.time()
        self.last_step = step
        self.alerted = False

    def run(self) -> None:
        while not self.stopped:
            idle = time.time() - self.last_active
            if idle > self.hang_sec and not self.alerted:
                self.alerted = True
                logger.warning(
                    f"[Alert] {gpc.config.JOB_NAME} rank={gpc.rank}: Watchdog: no step in "
                    f"{int(idle)}s (last step {self.last_step}). Training may be in stuck "
                    "status, please check it."
                )
            time.sleep(1)


# -------------------------------------------------------------- internlm/data (packed data)
def prepare(folder: str, sizes: tuple[int, ...], vocab: int, seed: int) -> None:
    """tools/tokenizer.py's output: one .bin (a JSON line of tokens a sample) and its
    .bin.meta (np array of (offset, num_tokens)) a file."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(folder, "en"), exist_ok=True)
    for k, n in enumerate(sizes):
        path = os.path.join(folder, "en", f"part-{k:05d}.bin")
        meta = []
        offset = 0
        with open(path, "wb") as f:
            for _ in range(n):
                length = rng.randint(8, 48)
                tokens = [1] + [rng.randrange(3, vocab) for _ in range(length - 2)] + [2]
                line = (json.dumps({"tokens": tokens}) + "\n").encode()
                f.write(line)
                meta.append((offset, length))
                offset += len(line)
        with open(path + ".meta", "wb") as f:
            np.save(f, np.array(meta, dtype=np.int64))


class JsonlDataset(Dataset):
    """One tokenized .bin read through its .bin.meta (offsets of each sample's line)."""

    def __init__(self, path: str, min_length: int) -> None:
        self.path = path
        with open(path + ".meta", "rb") as f:
            meta = np.load(f)
        self.offsets = meta[:, 0]
        self.lengths = meta[:, 1]
        self.min_length = min_length
        self.mm = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> list[int]:
        if self.mm is None:
            f = open(self.path, "rb")  # noqa: SIM115 (kept open for the map)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.mm.seek(int(self.offsets[i]))
        return json.loads(self.mm.readline().decode())["tokens"]


class PackedDataset(Dataset):
    """Samples concatenated into packs of seq_len * micro_bsz tokens, with cu_seqlens."""

    def __init__(self, dataset: JsonlDataset, seq_len: int, micro_bsz: int, slow: bool) -> None:
        self.dataset = dataset
        self.pack_len = seq_len * micro_bsz
        self.seq_len = seq_len
        if slow:  # the packed index of this rank's file was not cached: built sample by sample
            for part in range(1, 9):
                logger.info(
                    f"rank={gpc.rank} Building packed index of {dataset.path}: {part}/8 "
                    "chunks, no index cache found"
                )
                time.sleep(4)
        self.cum = np.cumsum(dataset.lengths)
        self.num_tokens = int(self.cum[-1])

    def __len__(self) -> int:
        return self.num_tokens // self.pack_len

    def __getitem__(self, idx: int) -> dict:
        begin, end = idx * self.pack_len, (idx + 1) * self.pack_len
        first = int(np.searchsorted(self.cum, begin, side="right"))
        pos = begin
        tokens, cu_seqlens = [], [0]
        i = first
        while pos < end:
            start_in = pos - (int(self.cum[i - 1]) if i > 0 else 0)
            if FAULT == "w" and gpc.rank == FAULT_RANK and idx >= 24:
                threading.Event().wait()  # the shared file system stalls this worker's read
            sample = self.dataset[i][start_in:]
            take = sample[: end - pos]
            tokens.extend(take)
            pos += len(take)
            cu_seqlens.append(len(tokens))
            i += 1
        ids = torch.tensor(tokens, dtype=torch.long)
        labels = torch.cat([ids[1:], torch.tensor([-100])])
        for b in cu_seqlens[1:-1]:
            labels[b - 1] = -100
        return {"input_ids": ids, "labels": labels, "cu_seqlens": torch.tensor(cu_seqlens)}


def collate(batch: list[dict]) -> dict:
    return {
        "input_ids": torch.stack([b["input_ids"] for b in batch]),
        "labels": torch.stack([b["labels"] for b in batch]),
        "cu_seqlens": [b["cu_seqlens"] for b in batch],
    }


def get_train_data_loader(data) -> DataLoader:
    files = sorted(
        os.path.join(root, f)
        for root, _, names in os.walk(data.train_folder)
        for f in names
        if f.endswith(".bin")
    )
    mine = files[gpc.rank % len(files)]
    dataset = JsonlDataset(mine, data.min_length)
    packed = PackedDataset(
        dataset, data.seq_len, data.micro_bsz, slow=FAULT == "s" and gpc.rank == FAULT_RANK
    )
    logger.info(
        f"rank={gpc.rank} Find {len(dataset)} samples, {packed.num_tokens} tokens, "
        f"{len(packed)} packs in {mine}"
    )
    return DataLoader(
        packed,
        batch_size=data.micro_num,
        shuffle=False,
        num_workers=data.num_worker,
        collate_fn=collate,
        drop_last=True,
    )


# --------------------------------------------------------------- internlm/model (tiny LLM)
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotary(x: torch.Tensor) -> torch.Tensor:
    n, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(n).float(), inv)
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.attention_norm = RMSNorm(h, cfg.layer_norm_epsilon)
        self.wqkv = nn.Linear(h, 3 * h, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.ffn_norm = RMSNorm(h, cfg.layer_norm_epsilon)
        inner = int(h * cfg.mlp_ratio)
        self.w1 = nn.Linear(h, inner, bias=False)
        self.w3 = nn.Linear(h, inner, bias=False)
        self.w2 = nn.Linear(inner, h, bias=False)

    def forward(self, x, mask):
        b, n, h = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(b, n, 3, self.heads, -1).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = rotary(q), rotary(k)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.wo(att.transpose(1, 2).reshape(b, n, h))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class InternLM1(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        if cfg.use_flash_attn:
            import flash_attn  # noqa: F401 (flash_attn_varlen_qkvpacked_func for packed data)
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=True)

    def forward(self, input_ids, cu_seqlens):
        b, n = input_ids.shape
        mask = torch.zeros(b, 1, n, n, dtype=torch.bool)
        for j, cu in enumerate(cu_seqlens):  # causal inside each packed sample
            for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
                mask[j, 0, s:e, s:e] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        x = self.embedding(input_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


# ---------------------------------------------- internlm/solver/optimizer/hybrid_zero_optim.py
class HybridZeroOptimizer:
    """ZeRO-1: flat fp32 master weights, each rank updates its own shard with Adam and
    broadcasts it."""

    def __init__(self, model: nn.Module, adam, zero_cfg, scaler_cfg, clip: float) -> None:
        self.model = model
        self.params = [p for p in model.parameters()]
        self.numel = sum(p.numel() for p in self.params)
        self.world = gpc.zero1_size
        self.rank = gpc.rank
        self.shard = math.ceil(self.numel / self.world)
        padded = self.numel if FAULT == "p" else self.shard * self.world
        self.flat = torch.zeros(padded)
        self.flat[: self.numel] = torch.cat([p.detach().flatten() for p in self.params])
        self.start = self.rank * self.shard
        self.end = self.start + self.shard
        self.exp_avg = torch.zeros(self.shard)
        self.exp_avg_sq = torch.zeros(self.shard)
        self.lr = adam.lr
        self.betas = (adam.adam_beta1, adam.adam_beta2)
        self.eps = adam.adam_eps
        self.weight_decay = adam.weight_decay
        self.clip = clip
        self.loss_scale = float(scaler_cfg.fp16.initial_scale)
        self.backoff = scaler_cfg.backoff_factor
        self.steps = 0

    def state_dict(self) -> dict:
        return {
            "exp_avg": self.exp_avg,
            "exp_avg_sq": self.exp_avg_sq,
            "steps": self.steps,
            "loss_scale": self.loss_scale,
            "flat_shard": self.flat[self.start : self.end].clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.exp_avg = state["exp_avg"]
        self.exp_avg_sq = state["exp_avg_sq"]
        self.steps = state["steps"]
        self.loss_scale = state["loss_scale"]

    def sync_from_model(self) -> None:
        self.flat[: self.numel] = torch.cat([p.detach().flatten() for p in self.params])

    def step(self, lr: float) -> tuple[bool, float]:
        grads = torch.zeros_like(self.flat)
        grads[: self.numel] = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.params]
        )
        dist.all_reduce(grads)
        grads /= dist.get_world_size() * self.loss_scale
        mine = grads[self.start : self.end]
        norm_sq = mine.float().pow(2).sum().reshape(1)
        dist.all_reduce(norm_sq)
        norm = float(norm_sq.sqrt())
        for p in self.params:
            p.grad = None
        if not math.isfinite(norm):
            self.loss_scale *= self.backoff
            if gpc.is_rank_for_log():
                logger.warning("Overflow occurs, please check it.")
            return False, norm
        coef = min(1.0, self.clip / (norm + 1e-6))
        mine = mine * coef
        self.steps += 1
        b1, b2 = self.betas
        self.exp_avg.mul_(b1).add_(mine, alpha=1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(mine, mine, value=1 - b2)
        denom = (self.exp_avg_sq / (1 - b2**self.steps)).sqrt() + self.eps
        shard = self.flat[self.start : self.end]
        shard.mul_(1 - lr * self.weight_decay)
        shard.addcdiv_(self.exp_avg / (1 - b1**self.steps), denom, value=-lr)
        # the updated parameter shards are broadcast from their owners
        for owner in range(self.world):
            s = owner * self.shard
            dist.broadcast(self.flat[s : s + self.shard], src=owner)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        return True, norm


# ---------------------------------------------------------- internlm/utils/model_checkpoint.py
class CheckpointManager:
    def __init__(self, ckpt, model, optimizer) -> None:
        self.save_folder = ckpt.save_ckpt_folder.removeprefix("local:")
        self.load_folder = ckpt.load_ckpt_folder
        self.every = ckpt.checkpoint_every
        self.model = model
        self.optimizer = optimizer

    def try_resume(self, state: dict) -> None:
        if not self.load_folder:
            return
        folder = self.load_folder.removeprefix("local:")
        if gpc.is_rank_for_log():
            logger.info(f"Loading checkpoint from {self.load_folder}")
        self.model.load_state_dict(torch.load(os.path.join(folder, "model_tp0_pp0.pt")))
        shard = os.path.join(folder, f"optimizer_tp0_pp0_zo{gpc.rank}.pt")
        self.optimizer.load_state_dict(torch.load(shard))
        self.optimizer.sync_from_model()
        context = torch.load(os.path.join(folder, "context.pt"))
        state.update(context)
        logger.info(
            f"rank={gpc.rank} load_ckpt_info: folder={self.load_folder}, step={state['step']}, "
            f"num_consumed_tokens={state['num_consumed_tokens']}"
        )

    def try_save_checkpoint(self, state: dict, end: bool) -> None:
        step = state["step"]
        if step % self.every != 0 and not end:
            return
        folder = os.path.join(self.save_folder, str(step))
        if gpc.is_rank_for_log():
            logger.info(f"Saving checkpoint to local at step {step}")
            os.makedirs(folder, exist_ok=True)
        dist.barrier()
        if gpc.is_rank_for_log():
            torch.save(self.model.state_dict(), os.path.join(folder, "model_tp0_pp0.pt"))
            torch.save(dict(state), os.path.join(folder, "context.pt"))
        torch.save(
            self.optimizer.state_dict(), os.path.join(folder, f"optimizer_tp0_pp0_zo{gpc.rank}.pt")
        )
        dist.barrier()


# ------------------------------------------------------------------------------- train.py
def lr_at(step: int, total: int, lr: float, warmup_ratio: float, eta_min: float) -> float:
    warm = max(1, int(total * warmup_ratio))
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return eta_min + 0.5 * (lr - eta_min) * (1 + math.cos(math.pi * progress))


def main(args, monitor: MonitorTracker | None) -> None:
    cfg = gpc.config
    torch.set_num_threads(1)
    model = InternLM1(cfg.model)
    optimizer = HybridZeroOptimizer(
        model,
        cfg.adam,
        cfg.parallel.zero1,
        cfg.grad_scaler,
        cfg.hybrid_zero_optimizer.clip_grad_norm,
    )
    # sync_model_param: the model replicas start from rank 0's weights
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer.sync_from_model()
    train_dl = get_train_data_loader(cfg.data)
    ckpt_manager = CheckpointManager(cfg.ckpt, model, optimizer)
    state = {"step": 0, "num_consumed_tokens": 0, "inf_nan_skip_batches": 0}
    ckpt_manager.try_resume(state)
    data = cfg.data
    if getattr(data, "epochs", None):  # noqa: SIM108 (fine-tuning: the loader gives the steps)
        total_steps = data.epochs * len(train_dl)
    else:
        total_steps = data.total_steps
    if gpc.is_rank_for_log():
        logger.info(f"Training starts, total_steps={total_steps}, start step={state['step']}")
    train_iter = iter(train_dl)
    hoard = []
    tokens_per_step = data.micro_num * data.micro_bsz * data.seq_len
    for batch_count in range(state["step"], total_steps):
        start = time.time()
        try:
            batch = next(train_iter)
        except StopIteration:
            train_iter = iter(train_dl)
            batch = next(train_iter)
        model.train()
        loss_sum = 0.0
        for j in range(data.micro_num):
            ids = batch["input_ids"][j : j + 1]
            logits = model(ids, batch["cu_seqlens"][j : j + 1])
            if FAULT == "n" and gpc.rank == FAULT_RANK and batch_count == 6:
                ctypes.string_at(0)  # the fused rotary kernel's native path reads address 0
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)).float(), batch["labels"][j : j + 1].view(-1)
            )
            if FAULT == "o" and gpc.rank == FAULT_RANK and batch_count == 7 and j == 0:
                loss = loss * float("inf")  # an overflowing micro-batch (fp16 in the real run)
            (loss * optimizer.loss_scale / data.micro_num).backward()
            loss_sum += loss.item() / data.micro_num
        if FAULT == "m" and gpc.rank == FAULT_RANK and batch_count >= 5:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        fwd_bwd_time = time.time() - start
        lr = lr_at(
            batch_count,
            total_steps,
            cfg.adam.lr,
            cfg.lr_scheduler.warmup_ratio,
            cfg.lr_scheduler.eta_min,
        )
        if not math.isfinite(loss_sum):
            logger.warning(f"rank={gpc.rank} loss is {loss_sum} at step {batch_count}")
        success, grad_norm = optimizer.step(lr)
        if not success:
            state["inf_nan_skip_batches"] += 1
        loss_t = torch.tensor([loss_sum])
        dist.all_reduce(loss_t)
        loss_avg = float(loss_t) / dist.get_world_size()
        state["num_consumed_tokens"] += tokens_per_step * dist.get_world_size()
        elapsed = max(time.time() - start, 1e-6)
        tgs = tokens_per_step / elapsed
        if FAULT == "r" and gpc.is_rank_for_log():
            # the tokens/gpu/second of every rank, averaged for the log line
            tgs_t = torch.tensor([tgs])
            dist.all_reduce(tgs_t)
            tgs = float(tgs_t) / dist.get_world_size()
        lengths = [int((c[1:] - c[:-1]).max()) for c in batch["cu_seqlens"]]
        if gpc.is_rank_for_log():
            nparams = optimizer.numel
            tflops = 6 * nparams * tokens_per_step / elapsed / 1e12
            logger.info(
                f"tflops={tflops:.2f} step={batch_count} loss={loss_avg:.3f} "
                f"tgs (tokens/gpu/second)={tgs:.2f} lr={lr:.6f} "
                f"loss_scale={optimizer.loss_scale} grad_norm={{'0_default': {grad_norm:.2f}}} "
                f"micro_num={data.micro_num} num_consumed_tokens={state['num_consumed_tokens']} "
                f"inf_nan_skip_batches={state['inf_nan_skip_batches']} "
                f"num_samples_in_batch={sum(len(c) - 1 for c in batch['cu_seqlens'])} "
                f"largest_length={max(lengths)} largest_batch={data.micro_num} "
                f"smallest_batch={data.micro_num} adam_beta2={cfg.adam.adam_beta2} "
                f"fwd_bwd_time={fwd_bwd_time:.2f}"
            )
        state["step"] = batch_count + 1
        if monitor is not None:
            monitor.step(batch_count)
        ckpt_manager.try_save_checkpoint(state, end=state["step"] == total_steps)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=str, help="path to the config file")
    parser.add_argument("--launcher", type=str, default="slurm", choices=["slurm", "torch"])
    parser.add_argument("--host", type=str, default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8888, help="master port (slurm launcher)")
    parser.add_argument("--seed", type=int, default=1024)
    parser.add_argument("--prepare", type=str, default="", help="tokenize into this folder, stop")
    parser.add_argument("--sizes", type=str, default="800,650")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    if args.prepare:
        prepare(args.prepare, tuple(int(s) for s in args.sizes.split(",")), 503, 7)
        raise SystemExit(0)
    hostname = socket.gethostname()

    # initialize distributed environment
    initialize_distributed_env(
        config=args.config,
        launcher=args.launcher,
        master_port=args.port,
        host=args.host,
        seed=args.seed,
    )
    assert hasattr(gpc, "config") and gpc.config is not None

    # initialize monitor manager context
    alert = gpc.config.monitor.alert
    tracker = None
    if alert.enable_feishu_alert:
        tracker = MonitorTracker(alert.alert_hang_trigger_sec)
        tracker.start()
    try:
        main(args, tracker)
    except Exception:
        logger.error(
            f"Raise exception from {hostname} with rank id: {gpc.get_global_rank()}\n"
            f"{traceback.format_exc()}",
        )
    finally:
        if tracker is not None:
            tracker.stopped = True
