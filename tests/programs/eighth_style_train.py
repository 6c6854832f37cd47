"""An eighth training-program style for the generalisation fixtures (tests/fixtures/real/eighth-*):
a single-file research script in the way of nanoGPT's train.py, raw torch and no framework.
Configuration is module globals overridden by `--key=value` (nanoGPT's configurator, inlined), DDP
is on when torchrun set RANK, a tiny GPT (causal self-attention through SDPA) trains on per-rank
shards of a uint16 token file read through np.memmap at random offsets, with gradient
accumulation through `model.require_backward_grad_sync`, estimate_loss on every rank (averaged by
all_reduce), a checkpoint dict saved by the master, `init_from="resume"`, `print` on the master
only (`iter 10: loss 3.21, time 12.3ms, mfu -100.00%`), optional JSON metric lines, a 20 s
collective timeout. One real fault per `--mode=...`; the faults are named by what they do, never
by the mode, so no traceback quotes it. Many modes need no fault in the code at all: their cause
is the data, the checkpoint or the arguments the capture gives them
(tests/fixtures/real/capture_eighth.sh: re-capture after any edit, the fixtures quote its lines).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import pickle
import signal
import sys
import tempfile
import time
from ast import literal_eval
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
from torch import nn
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values; `--key=value` overrides any of them
out_dir = ""  # empty: a fresh temporary folder
data_root = ""  # empty: the corpus is written into a temporary folder at start
eval_interval = 20
log_interval = 5
eval_iters = 4
always_save_checkpoint = True
overwrite = False
init_from = "scratch"  # or "resume"
log_json = False
# model
n_layer = 2
n_head = 2
n_embd = 32
block_size = 32
dropout = 0.0
bias = False
# data and optimisation
shard_tokens = 6000
batch_size = 4
gradient_accumulation_steps = 12  # divided by the world size
learning_rate = 3e-3
max_iters = 60
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 10
lr_decay_iters = 60
min_lr = 3e-4
# system
backend = "gloo"
distributed = "auto"  # "on": always join a process group (the multi-node configs say so)
ddp_timeout_s = 20
dtype = "bfloat16"
use_autocast = False
find_unused = False
seed = 1337
mode = "plain"
# -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    ragged_last_shard: int = 0  # the corpus loses this many tokens at its end (dedup)
    padded_tail: float = 0.0  # this fraction of the corpus's end is padding
    eval_main_only: bool = False  # the evaluation (and its all_reduce) moved under master
    remote_kbps: int = 0  # master mirrors each checkpoint to remote storage at this rate
    clip_main_only: bool = False
    kill_rank: int = -1
    segv_rank: int = -1
    save_wrapper_state: bool = False  # saves model.state_dict() of the DDP wrapper


MODES: dict[str, Fault] = {
    "plain": Fault(),
    "loud-but-fine": Fault(),
    "iters-done": Fault(),
    "memmap-overrun": Fault(ragged_last_shard=60),
    "solo-eval": Fault(eval_main_only=True),
    "ckpt-stall": Fault(remote_kbps=6),
    "prefix-prep": Fault(save_wrapper_state=True),  # writes the checkpoint prefix-resume reads
    "prefix-resume": Fault(),
    "half-resume": Fault(),
    "vocab-skew": Fault(),
    "uneven-accum": Fault(),
    "nan-break": Fault(padded_tail=0.15),
    "clip-on-master": Fault(clip_main_only=True),
    "sigkill-step": Fault(kill_rank=1),
    "null-deref": Fault(segv_rank=3),
    "ask-overwrite": Fault(),
    "no-torchrun": Fault(),
    "solo-run": Fault(),
    "legacy-env-ok": Fault(),
    "legacy-argv": Fault(),
}


def configure(argv: list[str]) -> None:
    """nanoGPT's configurator: every `--key=value` must name an existing global of the same type."""
    for arg in argv:
        if "=" not in arg or not arg.startswith("--"):
            raise ValueError(f"expected --key=value, got {arg!r}")
        key, val = arg[2:].split("=", 1)
        if key not in globals() or key.startswith("_"):
            raise ValueError(f"Unknown config key: {key}")
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        if type(attempt) is not type(globals()[key]):
            raise TypeError(f"config key {key} expects {type(globals()[key]).__name__}")
        if key != "mode":  # the fault selector is the capture's, not a setting
            print(f"Overriding: {key} = {attempt}")
        globals()[key] = attempt


# -----------------------------------------------------------------------------
# the model: nanoGPT's, smaller


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = nn.Sequential(
            nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias),
            nn.GELU(),
            nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(c.vocab_size, c.n_embd),
                "wpe": nn.Embedding(c.block_size, c.n_embd),
                "h": nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
                "ln_f": nn.LayerNorm(c.n_embd, bias=c.bias),
            }
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        print(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")

    def get_num_params(self) -> int:
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        nodecay = [p for p in params if p.dim() < 2]
        print(
            f"num decayed parameter tensors: {len(decay)}, with "
            f"{sum(p.numel() for p in decay):,} parameters"
        )
        print(
            f"num non-decayed parameter tensors: {len(nodecay)}, with "
            f"{sum(p.numel() for p in nodecay):,} parameters"
        )
        print("using fused AdamW: False")  # no fused AdamW on CPU
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": nodecay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2))

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float) -> float:
        """Model flops utilisation in units of A100 bfloat16 peak FLOPS (PaLM appendix B)."""
        c = self.config
        L, H, Q, T = c.n_layer, c.n_head, c.n_embd // c.n_head, c.block_size
        flops_per_token = 6 * self.get_num_params() + 12 * L * H * Q * T
        return flops_per_token * T * fwdbwd_per_iter / dt / 312e12


# -----------------------------------------------------------------------------
# data: one uint16 shard per rank, as our tokenizer script writes them


PAD = 64  # the packer pads the last document with this id; targets of padding are ignored


def write_corpus(root: str, world: int, fault: Fault = MODES["plain"]) -> None:
    """Tokens of a small synthetic language (ids 0-63, each token depends on the one before),
    cut into one train and one val shard per rank, and meta.pkl with the vocabulary."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    total = shard_tokens * world
    noise = rng.integers(0, 4, total)
    tokens = np.zeros(total, dtype=np.uint16)
    for i in range(1, total):
        tokens[i] = (tokens[i - 1] * 5 + 3 + noise[i]) % PAD
    if fault.padded_tail:
        tokens[int(total * (1 - fault.padded_tail)) :] = PAD
    tokens = tokens[: total - fault.ragged_last_shard]
    cut = shard_tokens * 9 // 10  # a full shard's train part
    for r in range(world):  # fixed-size shards, 9:1 train:val; the last holds what is left
        shard = tokens[r * shard_tokens : (r + 1) * shard_tokens]
        shard[: len(shard) * 9 // 10].tofile(os.path.join(root, f"train_{r:02d}.bin"))
        shard[len(shard) * 9 // 10 :].tofile(os.path.join(root, f"val_{r:02d}.bin"))
    with open(os.path.join(root, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": PAD + 1, "train_tokens": cut}, f)


def main() -> None:
    configure(sys.argv[1:])
    fault = MODES[mode]
    ddp = int(os.environ.get("RANK", -1)) != -1 or distributed == "on"
    if ddp:
        init_process_group(backend=backend, timeout=timedelta(seconds=ddp_timeout_s))
        ddp_rank = int(os.environ["RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        master_process = ddp_rank == 0
        seed_offset = ddp_rank
        assert gradient_accumulation_steps % ddp_world_size == 0
        accum = gradient_accumulation_steps // ddp_world_size
    else:
        ddp_rank, ddp_world_size = 0, 1
        master_process, seed_offset = True, 0
        accum = gradient_accumulation_steps
    tokens_per_iter = accum * ddp_world_size * batch_size * block_size
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
    out = out_dir or tempfile.mkdtemp(prefix="out-")
    if master_process:
        os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed + seed_offset)
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    ctx = torch.autocast("cpu", dtype=ptdtype) if use_autocast else nullcontext()

    root = data_root
    if not root:
        root = tempfile.mkdtemp(prefix="tokens-")
        write_corpus(root, ddp_world_size, fault)
    meta_path = os.path.join(root, "meta.pkl")
    meta_vocab_size = None
    train_tokens = None
    if os.path.exists(meta_path):
        with open(meta_path, "rb") as f:
            meta = pickle.load(f)
        meta_vocab_size, train_tokens = meta["vocab_size"], meta["train_tokens"]
        print(f"found vocab_size = {meta_vocab_size} (inside {meta_path})")

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        # recreate np.memmap every batch to avoid a memory leak, as per
        # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
        path = os.path.join(root, f"{split}_{ddp_rank:02d}.bin")
        data = np.memmap(path, dtype=np.uint16, mode="r")
        n = (train_tokens if split == "train" else None) or len(data)  # all train shards alike
        ix = torch.randint(n - block_size - 1, (batch_size,))
        x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
        )
        x[x == PAD] = 0
        y[y == PAD] = -1
        return x, y

    iter_num = 0
    best_val_loss = 1e9
    model_args = {
        "n_layer": n_layer,
        "n_head": n_head,
        "n_embd": n_embd,
        "block_size": block_size,
        "bias": bias,
        "dropout": dropout,
        "vocab_size": 0,
    }
    checkpoint = None
    if init_from == "scratch":
        ckpt_path = os.path.join(out, "ckpt.pt")
        if master_process and os.path.exists(ckpt_path) and not overwrite:
            answer = input(f"{ckpt_path} exists and will be overwritten. Continue? [y/N] ")
            if answer.strip().lower() != "y":
                sys.exit("aborted: pass --overwrite=True or another --out_dir")
        print("Initializing a new model from scratch")
        if meta_vocab_size is None:
            print("defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)")
        model_args["vocab_size"] = meta_vocab_size if meta_vocab_size is not None else 50304
        model = GPT(GPTConfig(**model_args))
    else:
        print(f"Resuming training from {out}")
        checkpoint = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu")
        for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"):
            model_args[k] = checkpoint["model_args"][k]
        model = GPT(GPTConfig(**model_args))
        state_dict = checkpoint["model"]
        unwanted_prefix = "_orig_mod."
        for k in list(state_dict):
            if k.startswith(unwanted_prefix):
                state_dict[k[len(unwanted_prefix) :]] = state_dict.pop(k)
        model.load_state_dict(state_dict)
        iter_num = checkpoint["iter_num"]
        best_val_loss = checkpoint["best_val_loss"]

    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers()
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None
    raw_model = model
    if ddp:
        model = DDP(model, find_unused_parameters=find_unused)

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        """Mean loss over eval_iters batches of each split, averaged over the ranks."""
        out_losses = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            mean = losses.mean()
            if ddp:
                torch.distributed.all_reduce(mean)
                mean /= ddp_world_size
            out_losses[split] = float(mean)
        model.train()
        return out_losses

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    X, Y = get_batch("train")
    t0 = t_start = time.time()
    local_iter_num = 0
    running_mfu = -1.0
    stop = False
    while True:
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for group in optimizer.param_groups:
            group["lr"] = lr

        if iter_num % eval_interval == 0 and (master_process or not fault.eval_main_only):
            losses = estimate_loss()
            if master_process:
                print(
                    f"step {iter_num}: train loss {losses['train']:.4f}, "
                    f"val loss {losses['val']:.4f}"
                )
            if (
                master_process
                and iter_num > 0
                and (losses["val"] < best_val_loss or always_save_checkpoint)
            ):
                best_val_loss = min(best_val_loss, losses["val"])
                state = model.state_dict() if fault.save_wrapper_state else raw_model.state_dict()
                checkpoint = {
                    "model": state,
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                }
                print(f"saving checkpoint to {out}")
                torch.save(checkpoint, os.path.join(out, "ckpt.pt"))
                if fault.remote_kbps:
                    mirror(os.path.join(out, "ckpt.pt"), fault.remote_kbps)
        if iter_num % eval_interval == 0 and iter_num > 0 and ddp:
            barrier()  # nobody goes on (or resumes) before the checkpoint is complete

        if ddp_rank == fault.kill_rank and iter_num == 12:
            hoard = [torch.ones(1 << 20) for _ in range(8)]  # the batch cache grows
            del hoard
            os.kill(os.getpid(), signal.SIGKILL)
        if ddp_rank == fault.segv_rank and iter_num == 8:
            ctypes.string_at(0)  # the tokenizer's native helper dereferences NULL

        for micro_step in range(accum):
            if ddp:
                # only sync gradients at the last micro step
                model.require_backward_grad_sync = micro_step == accum - 1
            with ctx:
                _, loss = model(X, Y)
                loss = loss / accum
            if not torch.isfinite(loss):
                print(f"rank {ddp_rank}: loss is {loss.item()} at iter {iter_num}, stopping")
                stop = True
                break
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        if stop:
            break
        if grad_clip != 0.0 and (master_process or not fault.clip_main_only):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        t1 = time.time()
        dt = t1 - t0
        t0 = t1
        if iter_num % log_interval == 0 and master_process:
            lossf = loss.item() * accum
            if local_iter_num >= 5:
                mfu = raw_model.estimate_mfu(batch_size * accum, dt)
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            print(
                f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, "
                f"mfu {running_mfu * 100:.2f}%"
            )
            if log_json:
                print(json.dumps({"iter": iter_num, "loss": round(lossf, 4), "lr": lr}))
        iter_num += 1
        local_iter_num += 1
        if iter_num > max_iters:
            break

    if master_process and not stop:
        print(f"finished {iter_num} iters in {time.time() - t_start:.1f}s")
    if ddp:
        destroy_process_group()


def mirror(path: str, kbps: int) -> None:
    """Copies the checkpoint to the remote folder at most kbps kB/s (not to saturate the link)."""
    remote = os.path.join(os.path.dirname(path), "remote")
    os.makedirs(remote, exist_ok=True)
    print(f"mirroring {os.path.basename(path)} to {remote}")
    with open(path, "rb") as src, open(os.path.join(remote, os.path.basename(path)), "wb") as dst:
        while block := src.read(32 << 10):
            dst.write(block)
            time.sleep(len(block) / 1024 / kbps)


if __name__ == "__main__":
    main()
