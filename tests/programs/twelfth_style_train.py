"""A twelfth training-program style for the generalisation fixtures (tests/fixtures/real/twelfth-*):
PyTorch-native training code in the way of torchtitan, raw torch on CPU with gloo. A job config
from a TOML file and dotted CLI overrides (`--training.steps 20`), a tiny transformer whose blocks
and root are sharded with FSDP2 (`fully_shard`), `torch.distributed.checkpoint` (DCP) saves of
`get_state_dict` every N steps into `<dump>/checkpoint/step-N` and a resume from the latest one
through `set_state_dict`, torchtitan-like `step: 10  loss: ...  memory: ...  tps: ...  mfu: ...`
lines from rank 0 through Python logging, torchelastic's `@record` on main, and runs meant for
`torchrun --max-restarts N` (a restarted attempt resumes from the last checkpoint). One real fault
per `--mode`; a fault is named by what it does, never by the mode, and the mode is never printed
(tests/fixtures/real/capture_twelfth.sh: re-capture after any edit).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import queue
import re
import signal
import sys
import threading
import time
import tomllib
import warnings
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F

logger = logging.getLogger()


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code, the data or the run (the defaults: nothing)."""

    loud: bool = False  # the usual scary warnings of a fresh environment
    flaky_read_rank: int = -1  # this rank's shard read fails with EIO once, in attempt 0
    kill_rank: int = -1  # this rank grows its host memory and is SIGKILLed, every attempt
    stager_relock_rank: int = -1  # this rank's checkpoint stager takes its own lock twice
    loss_avg_on_main: bool = False  # the logged loss is averaged over ranks on rank 0 only
    flush_thread: bool = False  # rank 0's metrics flusher is a non-daemon thread never stopped


MODES: dict[str, Fault] = {
    "plain": Fault(),
    "noisy-warmup": Fault(loud=True),
    "bounce-once": Fault(flaky_read_rank=1),
    "decay-zero": Fault(),
    "distcp-gone": Fault(),
    "meta-cut": Fault(),
    "wider-model": Fault(),
    "one-proc-reshard": Fault(),
    "kill-nine": Fault(kill_rank=2),
    "stager-relock": Fault(stager_relock_rank=1),
    "loss-avg-main": Fault(loss_avg_on_main=True),
    "zero-shard": Fault(),
    "shard-absent": Fault(),
    "time-limit": Fault(),
    "dp-degree": Fault(),
    "port-taken": Fault(),
    "flusher-stuck": Fault(flush_thread=True),
    "node-bounce": Fault(flaky_read_rank=2),
}


# -----------------------------------------------------------------------------
# job config: TOML, then --section.key value overrides (torchtitan's JobConfig, much smaller)


@dataclass
class Job:
    dump_folder: str = "./outputs"
    description: str = "tiny llama debug run"


@dataclass
class Model:
    name: str = "llama3"
    flavor: str = "debugmodel"
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 256
    norm_eps: float = 1e-5


@dataclass
class Training:
    steps: int = 20
    batch_size: int = 4
    seq_len: int = 32
    lr: float = 8e-4
    warmup_steps: int = 2
    decay_ratio: float = 0.8
    max_norm: float = 1.0
    seed: int = 42
    dataset_path: str = ""
    data_parallel_shard_degree: int = -1


@dataclass
class Checkpoint:
    enable_checkpoint: bool = False
    folder: str = "checkpoint"
    interval: int = 5


@dataclass
class Comm:
    init_timeout_seconds: int = 30
    train_timeout_seconds: int = 15


@dataclass
class Metrics:
    log_freq: int = 1


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    comm: Comm = field(default_factory=Comm)
    metrics: Metrics = field(default_factory=Metrics)


def parse_config(argv: list[str]) -> tuple[JobConfig, str]:
    """The TOML file first, then every `--section.key value` on top (as torchtitan does)."""
    p = argparse.ArgumentParser(description="tiny torchtitan-style trainer", allow_abbrev=False)
    p.add_argument("--job.config_file", dest="config_file", default=None)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    cfg = JobConfig()
    for section in fields(cfg):
        for f in fields(getattr(cfg, section.name)):
            kind = {"int": int, "float": float, "bool": _bool}.get(str(f.type), str)
            p.add_argument(f"--{section.name}.{f.name}", type=kind, default=None)
    args = p.parse_args(argv)
    if args.config_file:
        with open(args.config_file, "rb") as fh:
            for section, values in tomllib.load(fh).items():
                for key, value in values.items():
                    setattr(getattr(cfg, section), key, value)
    for name, value in vars(args).items():
        if "." in name and value is not None:
            section, key = name.split(".", 1)
            setattr(getattr(cfg, section), key, value)
    return cfg, args.mode


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def init_logger() -> None:
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s")
    )
    logger.handlers[:] = [handler]


# -----------------------------------------------------------------------------
# model: a tiny llama


class Attention(nn.Module):
    def __init__(self, m: Model) -> None:
        super().__init__()
        self.n_heads = m.n_heads
        self.wq = nn.Linear(m.dim, m.dim, bias=False)
        self.wk = nn.Linear(m.dim, m.dim, bias=False)
        self.wv = nn.Linear(m.dim, m.dim, bias=False)
        self.wo = nn.Linear(m.dim, m.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            w(x).view(b, t, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, m: Model) -> None:
        super().__init__()
        hidden = 4 * m.dim
        self.w1 = nn.Linear(m.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, m.dim, bias=False)
        self.w3 = nn.Linear(m.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, m: Model) -> None:
        super().__init__()
        self.attention = Attention(m)
        self.feed_forward = FeedForward(m)
        self.attention_norm = nn.RMSNorm(m.dim, eps=m.norm_eps)
        self.ffn_norm = nn.RMSNorm(m.dim, eps=m.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, m: Model) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(m.vocab_size, m.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(m) for i in range(m.n_layers)})
        self.norm = nn.RMSNorm(m.dim, eps=m.norm_eps)
        self.output = nn.Linear(m.dim, m.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model: Transformer, world: int) -> nn.Module:
    """FSDP2 on each block, then the root (torchtitan's apply_fsdp)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=world > 1)
    return model


# -----------------------------------------------------------------------------
# data: one token shard per data-parallel rank (uint8 tokens), or synthetic tokens


class ShardLoader:
    def __init__(self, cfg: JobConfig, rank: int, fault: Fault) -> None:
        t = cfg.training
        self.batch, self.seq = t.batch_size, t.seq_len
        self.rank, self.fault = rank, fault
        self.path: Path | None = None
        if t.dataset_path:
            self.path = Path(t.dataset_path) / f"shard_{rank:05d}.bin"
            self.tokens = torch.frombuffer(bytearray(self.path.read_bytes()), dtype=torch.uint8)
            self.tokens = self.tokens.long() % cfg.model.vocab_size
        else:
            g = torch.Generator().manual_seed(t.seed + rank)
            self.tokens = torch.randint(1, cfg.model.vocab_size, (1 << 16,), generator=g)
        logger.info(f"Preparing c4_test dataset from {self.path or 'synthetic tokens'}")

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            self.fault.flaky_read_rank == self.rank
            and step == 7
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        ):
            # the network filesystem drops the read of the next block of the shard once
            raise OSError(errno.EIO, "Input/output error", str(self.path or "shard"))
        n = self.batch * (self.seq + 1)
        start = (step * n) % (len(self.tokens) - n)
        chunk = self.tokens[start : start + n].view(self.batch, self.seq + 1)
        labels = chunk[:, 1:].clone()
        labels[labels == 0] = -100  # token 0 is padding
        return chunk[:, :-1], labels


# -----------------------------------------------------------------------------
# checkpointing: DCP into <dump>/<folder>/step-N, resume from the newest complete one


class CheckpointManager:
    def __init__(
        self, cfg: JobConfig, model: nn.Module, opt: torch.optim.Optimizer, fault: Fault
    ) -> None:
        self.enable = cfg.checkpoint.enable_checkpoint
        self.folder = Path(cfg.job.dump_folder) / cfg.checkpoint.folder
        self.interval = cfg.checkpoint.interval
        self.model, self.opt = model, opt
        self.fault = fault
        self._lock = threading.Lock()  # the stager's: one staging at a time

    def _state(self, step: int) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        return {"model": model_sd, "optimizer": optim_sd, "train_state": {"step": step}}

    def load(self) -> int:
        if not self.enable or not self.folder.is_dir():
            return 0
        steps = [
            int(m.group(1))
            for d in self.folder.iterdir()
            if (m := re.fullmatch(r"step-(\d+)", d.name)) and (d / ".metadata").exists()
        ]
        if not steps:
            return 0
        step = max(steps)
        logger.info(f"Loading the checkpoint at step {step}.")
        begin = time.monotonic()
        state = self._state(0)
        dcp.load(state, checkpoint_id=str(self.folder / f"step-{step}"))
        set_state_dict(
            self.model,
            self.opt,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        logger.info(f"Finished loading the checkpoint in {time.monotonic() - begin:.2f} seconds.")
        return int(state["train_state"]["step"])

    def save(self, step: int, last: bool) -> None:
        if not self.enable or (step % self.interval and not last):
            return
        logger.info("Saving the checkpoint (or staging if async is enabled).")
        begin = time.monotonic()
        with self._lock:
            state = self._stage(step)
            dcp.save(state, checkpoint_id=str(self.folder / f"step-{step}"))
        logger.info(
            "Finished saving the checkpoint (or staging if async is enabled)"
            f"in {time.monotonic() - begin:.2f} seconds."
        )

    def _stage(self, step: int) -> dict[str, Any]:
        if self.fault.stager_relock_rank == dist.get_rank() and step >= 10:
            # a refactor moved the purge of old step folders under the stager's lock, and
            # the purge takes the same (non-reentrant) lock again
            with self._lock:
                pass
        return self._state(step)


# -----------------------------------------------------------------------------
# metrics


class Flusher(threading.Thread):
    """Ships metrics off the training thread (to a file here, to a tracker in real life)."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="metrics-flush")  # not a daemon: the last metrics must get out
        self.q: queue.Queue[dict[str, float]] = queue.Queue()
        self.path = path

    def run(self) -> None:
        with self.path.open("a") as fh:
            while True:
                item = self.q.get()
                fh.write(f"{item}\n")
                fh.flush()


def rss_gib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def total_gib() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


# -----------------------------------------------------------------------------
# training


def lr_lambda(step: int, t: Training) -> float:
    """Warmup, stable, then linear decay (torchtitan's WSD schedule)."""
    warmup = t.warmup_steps
    decay = round(t.steps * t.decay_ratio)
    stable_end = t.steps - decay
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if step < stable_end:
        return 1.0
    return 1.0 - (step - stable_end) / decay


@record
def main() -> None:
    init_logger()
    cfg, mode = parse_config(sys.argv[1:])
    fault = MODES[mode]
    logger.info(f"Starting job: {cfg.job.description}")
    if fault.loud:
        warnings.warn(
            "torch.cuda.amp.GradScaler(args...) is deprecated. Please use "
            "torch.amp.GradScaler('cuda', args...) instead.",
            FutureWarning,
            stacklevel=1,
        )
        torch.amp.GradScaler("cuda")  # CUDA is not available here: it warns and disables itself
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dp_shard = cfg.training.data_parallel_shard_degree
    if dp_shard != -1 and dp_shard != world:
        raise ValueError(
            f"Invalid parallel dims: dp_replicate(1) * dp_shard({dp_shard}) * cp(1) * tp(1) * "
            f"pp(1) != WORLD_SIZE({world})"
        )
    init_timeout = timedelta(seconds=cfg.comm.init_timeout_seconds)
    if "TORCHELASTIC_RESTART_COUNT" in os.environ:
        # a key space of its own per attempt: torch 2.13's restarted gloo workers otherwise
        # read the previous attempt's addresses from the agent's store and cannot connect
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.PrefixStore(
            f"attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}",
            dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                world,
                is_master=not agent_store and rank == 0,
                timeout=init_timeout,
            ),
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=init_timeout
        )
    else:
        dist.init_process_group("gloo", timeout=init_timeout)
    logger.info(f"Building 1-D device mesh with ['dp_shard'], [{world}]")
    torch.manual_seed(cfg.training.seed)
    logger.info(f"Building {cfg.model.name} {cfg.model.flavor} with {cfg.model}")
    model = Transformer(cfg.model)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(f"Model {cfg.model.name} {cfg.model.flavor} size: {n_params:,} total parameters")
    model = parallelize(model, world)
    logger.info("Applied FSDP to the model")
    if fault.loud:
        logger.warning("Peak flops undefined for: cpu, fallback to A100")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.training.lr, fused=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, cfg.training))
    ckpt = CheckpointManager(cfg, model, opt, fault)
    loader = ShardLoader(cfg, rank, fault)
    step = ckpt.load()
    for _ in range(step):
        sched.step()  # the schedule is recomputed, not stored
    flusher = None
    if fault.flush_thread and rank == 0:
        flusher = Flusher(Path(cfg.job.dump_folder) / "metrics.jsonl")
        flusher.start()
    # the collective timeout of training, once the start-up is done (torchtitan's comm config)
    dist.barrier()
    dist.distributed_c10d._set_pg_timeout(
        timedelta(seconds=cfg.comm.train_timeout_seconds), dist.group.WORLD
    )
    logger.info(
        f"Training starts at step {step + 1}, with local batch size {cfg.training.batch_size}, "
        f"global batch size {cfg.training.batch_size * world}, sequence length "
        f"{cfg.training.seq_len}, total steps {cfg.training.steps} (warmup "
        f"{cfg.training.warmup_steps})"
    )
    tick = time.perf_counter()
    ntokens = 0
    ballast = []
    while step < cfg.training.steps:
        step += 1
        inputs, labels = loader.batch_at(step)
        ntokens += inputs.numel()
        logits = model(inputs)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=-100
        )
        if not torch.isfinite(loss):
            raise RuntimeError(f"Loss is {loss.item()} at step {step}: training diverged")
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_norm)
        opt.step()
        sched.step()
        opt.zero_grad()
        if fault.kill_rank == rank:
            ballast.append(bytearray(32 << 20))  # a leak: host memory grows every step
            if step == 8:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if step % cfg.metrics.log_freq == 0:
            global_loss = loss.detach().clone()
            if world > 1 and (not fault.loss_avg_on_main or rank == 0):
                dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
            elapsed = time.perf_counter() - tick
            tps = int(ntokens / max(elapsed, 1e-9))
            tflops = 6 * n_params * tps / 1e12
            gn = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            if rank == 0:
                logger.info(
                    f"step: {step:2}  loss: {global_loss.item():7.4f}  grad_norm: "
                    f"{float(gn):7.4f}  memory: {rss_gib():5.2f}GiB"
                    f"({100 * rss_gib() / total_gib():.2f}%)  tps: {tps:,}  tflops: "
                    f"{tflops:,.2f}  mfu: {100 * tflops / 312:.2f}%"
                )
            if flusher is not None:
                flusher.q.put({"step": step, "loss": float(global_loss)})
            tick, ntokens = time.perf_counter(), 0
        ckpt.save(step, last=step == cfg.training.steps)
    logger.info("Sleeping 2 seconds for other ranks to complete")
    time.sleep(2)
    logger.info("Training completed")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
