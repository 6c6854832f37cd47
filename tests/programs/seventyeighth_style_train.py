"""A seventy-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/seventyeighth-*): a tiny causal language model on synthetic token shards,
trained with infrequent communication in the two ways PyTorch users write it. `--algo diloco`
(the default) in the way of OpenDiLoCo and torchft's DiLoCo: every worker starts from rank 0's
weights, runs `local_steps` (H) inner AdamW steps on its own shard without any collective, then
the pseudo-gradient (outer params - inner params) is all-reduced in one flat buffer and an outer
Nesterov-SGD step applied; a worker whose pseudo-gradient is not finite skips the outer
all-reduce and falls back to the outer weights; the held-out loss is all-reduced after every
sync. `--algo post_local_sgd`: torch.distributed.algorithms' post-local SGD: DDP with
`post_localSGD_hook` (PostLocalSGDState, start_localSGD_iter = warmup_steps) and
PostLocalSGDOptimizer wrapping AdamW with a PeriodicModelAverager(period, warmup_steps);
`--algo ddp` the same loop with plain DDP (the warm-up runs users start from). Launched with
torchrun; the run's settings from a JSON file (--config configs/diloco_tiny.json) overridden by
flags; the shards data/shard_RRR.bin (a 16-byte header: magic, version, vocab size, token count;
uint16 tokens) read by each worker for its rank. Logs as OpenDiLoCo's workers do, every worker
its own inner-step lines, worker 0 the outer steps and checkpoints:
'Dec 05 22:40:01.123 [INFO] [worker 1/2] inner step 37/50 loss 2.31',
'outer step 3 | pseudo-grad norm 0.84 | sync took 0.12s | eval loss 2.31'. Checkpoints in
checkpoints/outer_K/ (model.pt and outer_opt.pt by worker 0, inner_opt_rank_R.pt by every
worker). A fault in the code is chosen by the DLQ environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_seventyeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import random
import signal
import struct
import threading
import time
import zlib
from datetime import datetime, timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MAGIC = b"TOKS"
HEADER = struct.Struct("<4sHHII")  # magic, version, pad, vocab size, token count
PAD = 0

log = logging.getLogger("diloco")


class WorkerFormatter(logging.Formatter):
    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        self.tag = f"[worker {rank}/{world}]"

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%b %d %H:%M:%S.%f")[:-3]
        return f"{stamp} [{record.levelname}] {self.tag} {record.getMessage()}"


def setup_logging(rank: int, world: int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(WorkerFormatter(rank, world))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


# ---------------------------------------------------------------------------------------------
# data


def write_shard(path: str, tokens: list[int], vocab: int) -> None:
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, 1, 0, vocab, len(tokens)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def make_data(folder: str, shards: int, n: int, vocab: int) -> None:
    """Tokens of a fixed random Markov chain (a learnable synthetic language), one shard a
    worker, and a held-out shard."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(0)
    table = [[rng.randrange(1, vocab) for _ in range(3)] for _ in range(vocab)]
    for k in [*range(shards), "val"]:
        r = random.Random(zlib.crc32(str(k).encode()))
        tok, out = 1, []
        for _ in range(n if k != "val" else 4096):
            tok = rng.choice(table[tok]) if r.random() < 0.1 else table[tok][r.randrange(3)]
            out.append(tok)
        name = f"shard_{k:03d}.bin" if k != "val" else "val.bin"
        write_shard(os.path.join(folder, name), out, vocab)


def read_shard(path: str) -> tuple[torch.Tensor, int]:
    with open(path, "rb") as f:
        magic, _version, _pad, vocab, count = HEADER.unpack(f.read(HEADER.size))
        if magic != MAGIC:
            raise ValueError(f"{path}: not a token shard (magic {magic!r})")
        data = torch.frombuffer(bytearray(f.read(count * 2)), dtype=torch.int16)
    return data.to(torch.long) & 0xFFFF, vocab


def batches(tokens: torch.Tensor, batch: int, ctx: int, cycle: bool = False):
    """Contiguous (input, target) batches over the shard, one pass (or round and round)."""
    span = batch * ctx
    while True:
        for i in range(0, len(tokens) - span - 1, span):
            chunk = tokens[i : i + span + 1]
            yield chunk[:-1].view(batch, ctx), chunk[1:].view(batch, ctx)
        if not cycle:
            return


# ---------------------------------------------------------------------------------------------
# model


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, ctx: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(ctx, dim))
        self.block = nn.TransformerEncoderLayer(dim, 2, dim * 2, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        h = self.block(h, src_mask=self.mask, is_causal=True)
        logits = self.head(self.norm(h))
        # each sequence's mean over its non-padding targets, then the batch's mean
        tok = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="none")
        mask = (y != PAD).float()
        return ((tok.view_as(mask) * mask).sum(1) / mask.sum(1)).mean()


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor, cfg: dict) -> float:
    model.eval()
    losses = [model(x, y).item() for x, y in list(batches(val, cfg["batch_size"], cfg["ctx"]))[:4]]
    model.train()
    return sum(losses) / len(losses)


# ---------------------------------------------------------------------------------------------
# faults (chosen by DLQ, never printed)

CASE = os.environ.get("DLQ", "")


def fault(code: str, rank: int) -> bool:
    return f"{code}{rank}" == CASE


class SnapshotWriter:
    """Writes a worker's local snapshot before it syncs (cheap unless it re-validates)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def write(self, rank: int, model: nn.Module, outer: int) -> None:
        with self.lock:
            if fault("h", rank) and outer == 3:
                self.flush_index(rank)  # takes the same (non-reentrant) lock again
            if fault("s", rank) and outer == 3:
                for k in range(1, 9):
                    log.info("re-validating local snapshot before sync (%d/8)", k)
                    time.sleep(5)

    def flush_index(self, rank: int) -> None:
        with self.lock:
            pass


def native_nesterov(rank: int) -> None:
    """The fused outer Nesterov kernel's C entry point."""
    if fault("v", rank):
        ctypes.string_at(0)


# ---------------------------------------------------------------------------------------------
# training


def load_config(args: argparse.Namespace) -> dict:
    with open(args.config) as f:
        cfg = json.load(f)
    for key, value in vars(args).items():
        if value is not None and key not in ("config", "make_data"):
            cfg[key] = value
    return cfg


def train_diloco(cfg: dict, rank: int, world: int, model: TinyLM, shard, val) -> None:
    H = cfg["local_steps"]
    total = cfg["total_steps"]
    for p in model.parameters():  # every worker starts from worker 0's weights
        dist.broadcast(p.data, src=0)
    outer_params = [p.detach().clone() for p in model.parameters()]
    outer_opt = torch.optim.SGD(
        outer_params, lr=cfg["outer_lr"], momentum=cfg["outer_momentum"], nesterov=True
    )
    inner_opt = torch.optim.AdamW(
        model.parameters(), lr=cfg["inner_lr"], weight_decay=cfg["weight_decay"]
    )
    scheduler = None
    if rank == 0:
        log.info("DiLoCo: %d workers, H=%d inner steps per outer step", world, H)
        if CASE == "a":  # the inner lr's cosine decay, built in worker 0's logging block
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(inner_opt, T_max=total)
    if CASE != "a":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(inner_opt, T_max=total)
    start = 0
    if cfg.get("resume"):
        folder = cfg["resume"]
        log.info("resuming from %s", folder)
        state = torch.load(os.path.join(folder, "model.pt"), map_location="cpu")
        model.load_state_dict(state["model"])
        for op, p in zip(outer_params, model.parameters(), strict=True):
            op.copy_(p.detach())
        outer_opt.load_state_dict(torch.load(os.path.join(folder, "outer_opt.pt")))
        inner_opt.load_state_dict(torch.load(os.path.join(folder, f"inner_opt_rank_{rank}.pt")))
        start = state["step"]
        log.info("resumed at step %d (outer step %d)", start, start // H)
    it = batches(shard, cfg["batch_size"], cfg["ctx"], cfg.get("cycle_data", False))
    for _ in range(start):
        next(it)
    snapshots = SnapshotWriter()
    hoard: list[torch.Tensor] = []
    t_sync = time.time()
    for step in range(start + 1, total + 1):
        try:
            x, y = next(it)
        except StopIteration:
            log.warning("data shard exhausted at step %d, leaving the training loop", step)
            break
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        inner_opt.step()
        inner_opt.zero_grad(set_to_none=True)
        if step > cfg["lr_warmup_steps"]:
            scheduler.step()
        if fault("m", rank) and step > H:  # the pseudo-gradient EMA keeps every inner state
            hoard.append(torch.ones(48, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        inner = (step - 1) % H + 1
        if inner % cfg["log_every"] == 0:
            log.info("inner step %d/%d loss %.2f", inner, H, loss.item())
        if inner != H:
            continue
        # outer step: all-reduce the pseudo-gradient, one flat buffer
        outer = step // H
        snapshots.write(rank, model, outer)
        t0 = time.time()
        pseudo = [op - p.detach() for op, p in zip(outer_params, model.parameters(), strict=True)]
        flat = torch.cat([g.reshape(-1) for g in pseudo])
        norm = flat.norm().item()
        if not math.isfinite(norm):
            log.warning(
                "pseudo-gradient is not finite (norm %s) at outer step %d, skipping the outer "
                "all-reduce and restarting from the outer weights",
                norm,
                outer,
            )
            for op, p in zip(outer_params, model.parameters(), strict=True):
                p.data.copy_(op)
            inner_opt.state.clear()
        else:
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for op, g in zip(outer_params, pseudo, strict=True):
                op.grad = flat[offset : offset + g.numel()].view_as(g).clone()
                offset += g.numel()
            native_nesterov(rank)
            outer_opt.step()
            outer_opt.zero_grad()
            for op, p in zip(outer_params, model.parameters(), strict=True):
                p.data.copy_(op)
        sync = time.time() - t0
        local_eval = evaluate(model, val, cfg)
        ev = torch.tensor([local_eval])
        dist.all_reduce(ev)
        eval_loss = ev.item() / world
        if rank == 0:
            log.info(
                "outer step %d | pseudo-grad norm %.2f | sync took %.2fs | eval loss %.2f | "
                "%.1fs since last sync",
                outer,
                norm,
                sync,
                eval_loss,
                time.time() - t_sync,
            )
        t_sync = time.time()
        if outer % cfg["ckpt_every"] == 0:
            save(cfg, rank, model, outer_opt, inner_opt, step, outer)
        target = cfg.get("stop_eval_loss")
        if target:
            if CASE == "e0":  # the stop decided on worker 0's own held-out loss
                if rank == 0 and local_eval < target:
                    log.info(
                        "eval loss %.2f below %.2f, stopping at outer step %d",
                        local_eval,
                        target,
                        outer,
                    )
                    break
            elif eval_loss < target:
                if rank == 0:
                    log.info(
                        "eval loss %.2f below %.2f, stopping at outer step %d",
                        eval_loss,
                        target,
                        outer,
                    )
                break
    if rank == 0:
        log.info("training finished, waiting for the other workers")
    dist.barrier()


def save(cfg, rank, model, outer_opt, inner_opt, step, outer) -> None:
    folder = os.path.join(cfg["checkpoint_dir"], f"outer_{outer}")
    os.makedirs(folder, exist_ok=True)
    if rank == 0:
        torch.save({"model": model.state_dict(), "step": step}, os.path.join(folder, "model.pt"))
        torch.save(outer_opt.state_dict(), os.path.join(folder, "outer_opt.pt"))
    torch.save(inner_opt.state_dict(), os.path.join(folder, f"inner_opt_rank_{rank}.pt"))
    if rank == 0:
        log.info("saved checkpoint %s", folder)


def train_post_local_sgd(cfg: dict, rank: int, world: int, model: TinyLM, shard, val) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    inner = torch.optim.AdamW(
        model.parameters(), lr=cfg["inner_lr"], weight_decay=cfg["weight_decay"]
    )
    warmup = cfg["warmup_steps"]
    if cfg["algo"] == "post_local_sgd":
        state = PostLocalSGDState(
            process_group=None,
            subgroup=None,
            start_localSGD_iter=warmup,
            post_local_gradient_allreduce=cfg["post_local_gradient_allreduce"],
        )
        ddp.register_comm_hook(state, post_localSGD_hook)
        opt = PostLocalSGDOptimizer(
            optim=inner, averager=PeriodicModelAverager(period=cfg["period"], warmup_steps=warmup)
        )
        if rank == 0:
            log.info(
                "post-local SGD: %d warm-up steps, then averaging every %d steps",
                warmup,
                cfg["period"],
            )
    else:
        opt = inner
    start = 0
    if cfg.get("resume"):
        state_dict = torch.load(cfg["resume"], map_location="cpu")
        model.load_state_dict(state_dict["model"])
        opt.load_state_dict(state_dict["optimizer"])
        start = state_dict["step"]
        log.info("resumed from %s at step %d", cfg["resume"], start)
    total = cfg["total_steps"]
    it = batches(shard, cfg["batch_size"], cfg["ctx"])
    for _ in range(start):
        next(it)
    for step in range(start + 1, total + 1):
        x, y = next(it)
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg["log_every"] == 0:
            log.info("step %d/%d loss %.2f", step, total, loss.item())
        if cfg["algo"] == "post_local_sgd" and rank == 0:
            done = opt.averager.step - 1
            if done >= warmup and (done - warmup) % cfg["period"] == 0:
                log.info("averaged parameters at step %d (averager step %d)", step, done)
    ev = torch.tensor([evaluate(model, val, cfg)])
    dist.all_reduce(ev)
    if rank == 0:
        log.info("eval loss %.2f after %d steps", ev.item() / world, total)
        os.makedirs(cfg["checkpoint_dir"], exist_ok=True)
        path = os.path.join(cfg["checkpoint_dir"], f"{cfg['algo']}_step_{total}.pt")
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": total}, path
        )
        log.info("saved checkpoint %s", path)
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/diloco_tiny.json")
    parser.add_argument("--make-data", dest="make_data")
    for key in ("algo", "resume", "checkpoint_dir"):
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key)
    for key in ("local_steps", "total_steps", "log_every", "ckpt_every", "warmup_steps", "period"):
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int)
    parser.add_argument("--stop-eval-loss", dest="stop_eval_loss", type=float)
    parser.add_argument(
        "--post-local-gradient-allreduce",
        dest="post_local_gradient_allreduce",
        action="store_const",
        const=True,
    )
    parser.add_argument("--cycle-data", dest="cycle_data", action="store_const", const=True)
    args = parser.parse_args()
    if args.make_data:
        make_data(args.make_data, shards=4, n=80000, vocab=128)
        return
    cfg = load_config(args)
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg["timeout"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    setup_logging(rank, world)
    torch.manual_seed(1234 + rank)
    shard, vocab = read_shard(os.path.join(cfg["data_dir"], f"shard_{rank:03d}.bin"))
    val, _ = read_shard(os.path.join(cfg["data_dir"], "val.bin"))
    log.info("shard %s: %d tokens, vocab %d", f"shard_{rank:03d}.bin", len(shard), vocab)
    if rank == 0:
        log.info("config: %s", json.dumps(cfg, sort_keys=True))
    model = TinyLM(vocab, cfg["dim"], cfg["ctx"])
    if cfg["algo"] == "diloco":
        train_diloco(cfg, rank, world, model, shard, val)
    else:
        train_post_local_sgd(cfg, rank, world, model, shard, val)
    if rank == 0:
        log.info("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
