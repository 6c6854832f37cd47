"""A hundred-and-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixth-*): a character-level GPT trained in the way of Karpathy's
nanoGPT train.py (copied into the SkyPilot workdir as train.py), launched on a 2-node SkyPilot
cluster by `torchrun --nnodes=$SKYPILOT_NUM_NODES --node_rank=$SKYPILOT_NODE_RANK
--nproc_per_node=1 --master_addr=$(echo "$SKYPILOT_NODE_IPS" | head -n1) --master_port=PORT
train.py config/train_shakespeare_char.py --key=value ...`.

What nanoGPT does is kept: module-level globals as the configuration, overridden by a config
file and `--key=value` arguments (its configurator: 'Overriding config with FILE:' and the
file's text, 'Overriding: key = value', 'ValueError: Unknown config key: KEY'); DDP when RANK is
set (gloo on CPU here, a 15 s timeout), the gradient accumulation split over the ranks,
master_process (rank 0) alone evaluating, printing and checkpointing; data/<dataset>/train.bin
and val.bin (uint16 tokens, memory-mapped anew per batch, random offsets seeded 1337 + rank) and
meta.pkl (the vocabulary) written by the setup's data/shakespeare_char/prepare.py; the GPT of
model.py (causal self-attention through scaled_dot_product_attention, weight tying, 'number of
parameters: 0.10M'); 'step N: train loss X, val loss Y', 'saving checkpoint to OUT_DIR', 'iter
N: loss X, time Yms, mfu Z%'; init_from='resume' reading OUT_DIR/ckpt.pt; the deprecated
torch.cuda.amp.GradScaler(enabled=(dtype == 'float16')). The user's additions: the
schedule-free AdamW (pip package schedulefree, installed by the task's setup), a val-loss
target whose decision rank 0 broadcasts, and a checkpoint written to the local disk first and
then copied to OUT_DIR (the bucket SkyPilot mounts on every node) in chunks, with a progress
line whenever the copy is slow. A fault in the code is chosen by the TQ_CASE environment variable
(a letter and a global rank) and never printed (re-capture with
tests/fixtures/real/capture_hundredsixth.sh after any edit).
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import signal
import sys
import threading
import time
from ast import literal_eval
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import schedulefree
import torch
import torch.nn as nn
from torch.distributed import all_reduce, broadcast, destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# model (nanoGPT's model.py, condensed)


class LayerNorm(nn.Module):
    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        print(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")

    def get_num_params(self) -> int:
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        return logits, loss

    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float]
    ) -> torch.optim.Optimizer:
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        num_decay_params = sum(p.numel() for p in decay_params)
        num_nodecay_params = sum(p.numel() for p in nodecay_params)
        print(
            f"num decayed parameter tensors: {len(decay_params)}, with "
            f"{num_decay_params:,} parameters"
        )
        print(
            f"num non-decayed parameter tensors: {len(nodecay_params)}, with "
            f"{num_nodecay_params:,} parameters"
        )
        # schedule-free AdamW instead of AdamW + cosine decay (no lr schedule to tune)
        optimizer = schedulefree.AdamWScheduleFree(
            optim_groups, lr=learning_rate, betas=betas, warmup_steps=warmup_iters
        )
        print(f"using schedule-free AdamW (schedulefree {schedulefree.__version__})")
        return optimizer

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float) -> float:
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_token = 6 * N + 12 * L * H * Q * T
        flops_per_iter = flops_per_token * T * fwdbwd_per_iter
        return (flops_per_iter * (1.0 / dt)) / 312e12  # A100 bfloat16 peak


# -----------------------------------------------------------------------------
# default config values designed to train a gpt2 (124M) on OpenWebText
out_dir = "out"
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False
always_save_checkpoint = True
init_from = "scratch"  # 'scratch' or 'resume'
wandb_log = False
wandb_project = "owt"
wandb_run_name = "gpt2"
dataset = "openwebtext"
gradient_accumulation_steps = 5 * 8
batch_size = 12
block_size = 1024
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup_iters = 2000
target_val_loss = 0.0  # stop once the val loss is below this (0: never)
backend = "nccl"
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
compile = True
# -----------------------------------------------------------------------------
config_keys = [
    k
    for k, v in globals().items()
    if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]
# nanoGPT's configurator.py: a config file, then --key=value overrides
for arg in sys.argv[1:]:
    if "=" not in arg:
        assert not arg.startswith("--")
        config_file = arg
        print(f"Overriding config with {config_file}:")
        with open(config_file) as f:
            print(f.read())
        exec(open(config_file).read())  # noqa: SIM115
    else:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        if key in globals():
            try:
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                attempt = val
            assert type(attempt) is type(globals()[key])
            print(f"Overriding: {key} = {attempt}")
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

case = os.environ.get("TQ_CASE", "")
fault, who = (case[0], int(case[1:] or 0)) if case else ("", -1)

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend, timeout=timedelta(seconds=15))
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}" if device == "cuda" else device
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_rank, ddp_world_size = 0, 1
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)
torch.set_num_threads(1)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, ptdtype)

# poor man's data loader
data_dir = os.path.join("data", dataset)


def _fast_gather(x: torch.Tensor) -> torch.Tensor:
    """The native gather helper the batch goes through (it reads a stale pointer once)."""
    if fault == "s" and ddp_rank == who and iter_num == 23:
        ctypes.string_at(16)
    return x


_prefetch_ready = threading.Event()


def upload(local: str, remote: str) -> None:
    """Copy a file to the bucket mount in chunks (writes to a MOUNT-mode bucket are slow)."""
    total = os.path.getsize(local)
    start, done = time.time(), 0
    with open(local, "rb") as src, open(remote + ".tmp", "wb") as dst:
        while chunk := src.read(256 << 10):
            dst.write(chunk)
            done += len(chunk)
            if fault == "c" and ddp_rank == who and iter_num == 40:
                time.sleep(5.0)  # the bucket's upload throughput today
            if time.time() - start > 2:
                print(
                    f"still uploading {os.path.basename(local)} to {os.path.dirname(remote)}: "
                    f"{done / 2**20:.2f}/{total / 2**20:.2f} MB ({time.time() - start:.0f} s)",
                    flush=True,
                )
    os.replace(remote + ".tmp", remote)


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    path = os.path.join(data_dir, "train.bin" if split == "train" else "val.bin")
    if fault == "q" and ddp_rank == who and split == "train" and iter_num == 31:
        _prefetch_ready.wait()  # the read of the next shard from the bucket never returns
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    if fault == "o" and ddp_rank == who and split == "train" and iter_num == 37:
        ix[3] = len(data) - block_size  # the offset bound written as len(data) - block_size + 1
    x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix]
    )
    return _fast_gather(x), y


iter_num = 0
best_val_loss = 1e9

meta_path = os.path.join(data_dir, "meta.pkl")
meta_vocab_size = None
if os.path.exists(meta_path):
    with open(meta_path, "rb") as f:
        meta = pickle.load(f)
    meta_vocab_size = meta["vocab_size"]
    print(f"found vocab_size = {meta_vocab_size} (inside {meta_path})")

model_args = dict(
    n_layer=n_layer,
    n_head=n_head,
    n_embd=n_embd,
    block_size=block_size,
    bias=bias,
    vocab_size=None,
    dropout=dropout,
)
if init_from == "scratch":
    print("Initializing a new model from scratch")
    if meta_vocab_size is None:
        print("defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)")
    model_args["vocab_size"] = meta_vocab_size if meta_vocab_size is not None else 50304
    gptconf = GPTConfig(**model_args)
    model = GPT(gptconf)
elif init_from == "resume":
    print(f"Resuming training from {out_dir}")
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location=device)
    checkpoint_model_args = checkpoint["model_args"]
    for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"]:
        model_args[k] = checkpoint_model_args[k]
    gptconf = GPTConfig(**model_args)
    model = GPT(gptconf)
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k, _v in list(state_dict.items()):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix) :]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
model.to(device)

scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))

optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
if init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None

if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)

_eval_logits: list[torch.Tensor] = []


@torch.no_grad()
def estimate_loss() -> dict[str, torch.Tensor]:
    out = {}
    model.eval()
    optimizer.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
            if fault == "m" and ddp_rank == who:
                # kept for the per-token perplexity report, never released
                _eval_logits.append(logits.repeat(1, 1, 200))
                if sum(t.numel() for t in _eval_logits) * 4 > (1 << 30):
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        out[split] = losses.mean()
    if fault == "v" and ddp_rank == who:
        # the val loss averaged over the ranks, written inside the master-only block
        all_reduce(out["val"])
        out["val"] /= ddp_world_size
    model.train()
    optimizer.train()
    return out


# training loop
X, Y = get_batch("train")
t0 = time.time()
local_iter_num = 0
raw_model = model.module if ddp else model
running_mfu = -1.0
model.train()
optimizer.train()
stop = torch.zeros(1)
while True:
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                optimizer.eval()
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": config,
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, "ckpt.pt")
                upload("ckpt.pt", os.path.join(out_dir, "ckpt.pt"))
                optimizer.train()
        if target_val_loss > 0 and losses["val"] < target_val_loss:
            print(
                f"val loss {losses['val']:.4f} is below target_val_loss {target_val_loss}, "
                f"stopping at step {iter_num}"
            )
            stop[0] = 1.0
    if ddp and target_val_loss > 0 and iter_num % eval_interval == 0:
        broadcast(stop, 0)  # every rank learns rank 0's decision
    if stop.item() > 0:
        break
    if iter_num == 0 and eval_only:
        break

    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        lossf = loss.item() * gradient_accumulation_steps
        if local_iter_num >= 5:
            mfu = raw_model.estimate_mfu(batch_size * gradient_accumulation_steps, dt)
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        print(
            f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%"
        )
    iter_num += 1
    local_iter_num += 1

    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
