"""A fifth training-program style for the generalisation fixtures (tests/fixtures/real/fourth-*):
a config dataclass and a Trainer with hooks (progress, evaluation, checkpoints, early stopping),
gradient accumulation under DDP's no_sync() or FSDP2's set_requires_gradient_sync(), Python
logging through a custom Formatter (`<ISO time with ms>Z <host> [worker N] LEVEL logger | msg`,
ranks other than 0 at WARNING only), a `step 20/60 | loss 0.53 | 9.1 it/s` progress line, an
@record-decorated main, a 15 s collective timeout; one real fault per --mode. The faults are
named by what they do, never by the --mode label, so no traceback quotes the label. Captured by
tests/fixtures/real/capture_fourth.sh: re-capture after any edit (the fixtures quote its lines)."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F

log = logging.getLogger("fourth.trainer")


@dataclass(frozen=True)
class Faults:
    """What goes wrong and on which rank (None: nowhere)."""

    scary_warnings: bool = False
    fsdp: bool = False
    patience: int = 0  # early stopping after this many evaluations without improvement
    eval_samples: int = 256  # rank 0's quick evaluation set; too few samples divide by zero
    padded_batch_rank: int | None = None  # a batch of padding only: loss 0/0
    swapped_sync_rank: int | None = None  # syncs its metrics in the other order
    gather_on_main: bool = False  # all_gather_object inside the main process's branch
    spike_rank: int | None = None  # skips the backward of a batch whose loss spikes
    trace_rank: int | None = None  # records per-layer metrics: its writer flushes first
    cache_miss_rank: int | None = None  # rebuilds its token index in the loop
    upload_kbps: int = 64_000  # checkpoint upload rate limit of rank 0
    kill_rank: int | None = None
    abort_rank: int | None = None
    device_ids: bool = False  # DDP(device_ids=[local_rank]) on a CPU module
    static_graph: bool = False  # DDP(static_graph=True) with no_sync() accumulation


MODES: dict[str, Faults] = {
    "noisy-ok": Faults(scary_warnings=True),
    "sharded-ok": Faults(fsdp=True),
    "patience-stop": Faults(patience=1),
    "eval-zero-div": Faults(eval_samples=2),
    "padded-batch-nan": Faults(padded_batch_rank=2),
    "swapped-sync": Faults(swapped_sync_rank=1),
    "gather-on-main": Faults(fsdp=True, gather_on_main=True),
    "spike-skip": Faults(spike_rank=1),
    "relock": Faults(trace_rank=2),
    "cache-rebuild": Faults(cache_miss_rank=1),
    "throttled-upload": Faults(upload_kbps=16),
    "truncated-resume": Faults(),  # capture_fourth.sh passes --resume with a truncated file
    "self-kill": Faults(kill_rank=1),
    "self-abort": Faults(abort_rank=3),
    "cpu-device-ids": Faults(device_ids=True),
    "static-accum": Faults(static_graph=True),
    "no-launcher": Faults(),  # started with plain python
    "apex-one-node": Faults(),  # TRAIN_OPTIM=fused on one node, where apex is not installed
}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 60
    accum: int = 2
    batch: int = 8
    hidden: int = 256
    lr: float = 0.05
    log_every: int = 10
    eval_every: int = 20
    ckpt_every: int = 20
    timeout_s: float = 15.0
    ckpt_dir: str = ""
    resume: str = ""
    optimizer: str = "sgd"


class HostRankFormatter(logging.Formatter):
    """ISO time in UTC with milliseconds, then host, then the worker's rank, as our dashboards
    parse them."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s | %(message)s")
        self.host = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        worker = os.environ.get("RANK", "?")
        return f"{ts.replace('+00:00', 'Z')} {self.host} [worker {worker}] {super().format(record)}"


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(HostRankFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logging.captureWarnings(True)


class Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Linear(16, hidden)
        self.block = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.block(F.gelu(self.embed(x)))))


class MetricsWriter:
    """Buffers metric records and writes them in blocks to a per-rank file."""

    def __init__(self, path: str, flush_every: int) -> None:
        self.path = path
        self.flush_every = flush_every
        self.buffer: list[str] = []
        self._lock = threading.Lock()

    def write(self, **kv: float) -> None:
        with self._lock:
            self.buffer.append(" ".join(f"{k}={v:.5g}" for k, v in kv.items()))
            if len(self.buffer) >= self.flush_every:
                self.flush()

    def flush(self) -> None:
        with self._lock:
            with open(self.path, "a") as f:
                f.write("\n".join(self.buffer) + "\n")
            self.buffer.clear()


class Hook:
    """Called by the Trainer; every method is optional."""

    def on_step_end(self, trainer: Trainer, step: int, loss: float) -> None: ...
    def on_fit_end(self, trainer: Trainer) -> None: ...


class Trainer:
    def __init__(self, cfg: TrainConfig, faults: Faults, hooks: list[Hook]) -> None:
        self.cfg, self.faults, self.hooks = cfg, faults, hooks
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.is_main = self.rank == 0
        torch.manual_seed(0)
        net = Net(cfg.hidden)
        if faults.fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in (net.embed, net.block, net.head):
                fully_shard(layer)
            self.model: nn.Module = fully_shard(net)
        elif faults.device_ids:
            self.model = nn.parallel.DistributedDataParallel(net, device_ids=[self.local_rank])
        else:
            self.model = nn.parallel.DistributedDataParallel(
                net, bucket_cap_mb=1, gradient_as_bucket_view=True, static_graph=faults.static_graph
            )
        self.net = net
        if cfg.optimizer == "fused":
            from apex.optimizers import FusedSGD

            self.opt: torch.optim.Optimizer = FusedSGD(self.model.parameters(), lr=cfg.lr)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=0.9)
        self.gen = torch.Generator().manual_seed(1000 + self.rank)
        self.stop = False
        self.start_step = self.step = 1
        self.writer = MetricsWriter(  # per-layer tracing writes 7x more: flush more often
            os.path.join(cfg.ckpt_dir, f"metrics-{self.rank}.txt"),
            flush_every=50 if faults.trace_rank == self.rank else 1000,
        )

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.cfg.batch, 16, generator=self.gen)
        y = (x[:, :4].argmax(1)).long()
        if self.faults.padded_batch_rank == self.rank and step == 23:
            y = torch.full_like(y, -100)  # the shard's tail: padding only
        if self.faults.spike_rank == self.rank and step == 17 and micro == self.cfg.accum - 1:
            x = x * 1e4  # an unnormalised record
        return x, y

    def sync_context(self, last: bool) -> object:
        if self.faults.fsdp:
            self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
            return _Null()
        return _Null() if last else self.model.no_sync()  # type: ignore[operator]

    def train_step(self, step: int) -> float:
        total = 0.0
        for micro in range(self.cfg.accum):
            x, y = self.batch(step, micro)
            with self.sync_context(micro == self.cfg.accum - 1):  # type: ignore[attr-defined]
                logits = self.model(x)
                n_valid = (y != -100).sum()
                loss = F.cross_entropy(logits, y, ignore_index=-100, reduction="sum") / n_valid
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step}")
                if loss.item() > 50.0:
                    log.warning(
                        "loss spike %.1f at step %d (micro %d), skipping this batch",
                        loss.item(),
                        step,
                        micro,
                    )
                    continue
                (loss / self.cfg.accum).backward()
            total += loss.item() / self.cfg.accum
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.faults.trace_rank == self.rank:
            for name, p in self.net.named_parameters():
                self.writer.write(step=step, norm=float(p.detach().norm()), layer=len(name))
        self.writer.write(step=step, loss=total)
        return total

    def sync_metrics(self, loss: float, step: int) -> tuple[float, float]:
        """Mean loss over ranks, and rank 0's learning-rate scale for everyone."""
        stats = torch.tensor([loss, float(self.cfg.batch * self.cfg.accum), 1.0])
        scale = torch.tensor([1.0 if step < 40 else 0.5])
        if self.faults.swapped_sync_rank == self.rank:
            dist.broadcast(scale, src=0)
            dist.all_reduce(stats)
        else:
            dist.all_reduce(stats)
            dist.broadcast(scale, src=0)
        return float(stats[0] / stats[2]), float(scale)

    def fit(self) -> None:
        t0 = time.monotonic()
        for step in range(self.start_step, self.cfg.steps + 1):
            self.step = step
            if self.faults.cache_miss_rank == self.rank and step == 30:
                rebuild_token_index(self.rank)
            if self.faults.kill_rank == self.rank and step == 25:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.faults.abort_rank == self.rank and step == 20:
                ctypes.CDLL(None).abort()
            loss = self.train_step(step)
            for hook in self.hooks:
                hook.on_step_end(self, step, loss)
            if self.stop:
                break
            if self.is_main and step % self.cfg.log_every == 0:
                rate = step / (time.monotonic() - t0)
                log.info("step %d/%d | loss %.4f | %.1f it/s", step, self.cfg.steps, loss, rate)
        for hook in self.hooks:
            hook.on_fit_end(self)


class _Null:
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> None: ...


def rebuild_token_index(rank: int) -> None:
    log.warning("token index cache of shard %d is stale, rebuilding it (takes a while)", rank)
    h = hashlib.sha256()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        for _ in range(10_000):
            h.update(b"token")
    log.warning("token index rebuilt: %s", h.hexdigest()[:12])


class MetricSync(Hook):
    def on_step_end(self, trainer: Trainer, step: int, loss: float) -> None:
        if step % trainer.cfg.log_every == 0:
            mean, scale = trainer.sync_metrics(loss, step)
            for group in trainer.opt.param_groups:
                group["lr"] = trainer.cfg.lr * scale
            trainer.writer.write(step=step, mean_loss=mean)


class Evaluator(Hook):
    """DDP: the main process evaluates its replica while the others go on. FSDP: every rank
    evaluates (the forward needs them all) and the losses are averaged."""

    def __init__(self) -> None:
        self.history: list[float] = []

    def on_step_end(self, trainer: Trainer, step: int, loss: float) -> None:
        if step % trainer.cfg.eval_every:
            return
        if trainer.faults.fsdp:
            val = torch.tensor([self.evaluate(trainer, trainer.model, 64)])
            dist.all_reduce(val)
            self.history.append(float(val) / trainer.world)
            if trainer.is_main:
                log.info("eval step %d | val_loss %.4f", step, self.history[-1])
            if trainer.faults.gather_on_main and trainer.is_main:
                seen: list[object] = [None] * trainer.world
                dist.all_gather_object(seen, {"rank": trainer.rank, "step": step})
                log.info("samples seen per rank: %s", seen)
        elif trainer.is_main:
            self.history.append(self.evaluate(trainer, trainer.net, trainer.faults.eval_samples))
            log.info("eval step %d | val_loss %.4f", step, self.history[-1])

    def evaluate(self, trainer: Trainer, model: nn.Module, n: int) -> float:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(n, 16, generator=g)
        y = x[:, :4].argmax(1)
        with torch.no_grad():
            logits = model(x)
        pred = logits.argmax(1)
        precision = {
            c: int(((pred == c) & (y == c)).sum()) / int((pred == c).sum()) for c in range(4)
        }
        if trainer.is_main:
            log.info("eval precision per class: %s", {c: round(p, 3) for c, p in precision.items()})
        return float(F.cross_entropy(logits, y))


class EarlyStopping(Hook):
    """Rank 0 decides from its evaluations; the decision is broadcast so every rank stops."""

    def __init__(self, evaluator: Evaluator, patience: int, min_delta: float = 1.0) -> None:
        self.evaluator, self.patience, self.min_delta = evaluator, patience, min_delta

    def on_step_end(self, trainer: Trainer, step: int, loss: float) -> None:
        if not self.patience or step % trainer.cfg.eval_every:
            return
        h = self.evaluator.history
        p = self.patience
        worse = trainer.is_main and len(h) > p and min(h[-p:]) > min(h[:-p]) - self.min_delta
        flag = torch.tensor([1.0 if worse else 0.0])
        dist.broadcast(flag, src=0)
        if flag.item() > 0:
            log.info("early stopping at step %d: no improvement in %d evals", step, self.patience)
            trainer.stop = True


class Checkpointer(Hook):
    def on_step_end(self, trainer: Trainer, step: int, loss: float) -> None:
        if step % trainer.cfg.ckpt_every:
            return
        if trainer.faults.fsdp:
            state = {k: v.to_local() for k, v in trainer.model.state_dict().items()}
            torch.save(state, os.path.join(trainer.cfg.ckpt_dir, f"step{step}-r{trainer.rank}.pt"))
        elif trainer.is_main:
            path = os.path.join(trainer.cfg.ckpt_dir, f"step{step:06d}.pt")
            state = {
                "model": trainer.net.state_dict(),
                "opt": trainer.opt.state_dict(),
                "step": step,
            }
            torch.save(state, path)
            upload(path, trainer.faults.upload_kbps)
            log.info(
                "checkpoint saved: %s (%d kB)", os.path.basename(path), os.path.getsize(path) >> 10
            )
        dist.barrier()


def upload(path: str, kbps: int) -> None:
    """Copies the checkpoint to the 'remote' folder at most kbps kB/s, not to saturate the link."""
    remote = os.path.join(os.path.dirname(path), "remote")
    os.makedirs(remote, exist_ok=True)
    chunk = 16 << 10
    with open(path, "rb") as src, open(os.path.join(remote, os.path.basename(path)), "wb") as dst:
        while block := src.read(chunk):
            dst.write(block)
            time.sleep(len(block) / 1024 / kbps)


class Summary(Hook):
    def on_fit_end(self, trainer: Trainer) -> None:
        trainer.writer.flush()
        if trainer.is_main:
            log.info("training finished after %d steps", trainer.step)


def parse() -> tuple[TrainConfig, Faults]:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="noisy-ok", choices=sorted(MODES))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--resume", default="")
    a = p.parse_args()
    cfg = TrainConfig(
        steps=a.steps,
        resume=a.resume,
        ckpt_dir=tempfile.mkdtemp(prefix="ckpt-"),
        optimizer=os.environ.get("TRAIN_OPTIM", "sgd"),
    )
    return cfg, MODES[a.mode]


@record
def main() -> None:
    cfg, faults = parse()
    local_rank = int(os.environ["LOCAL_RANK"])
    setup_logging(int(os.environ.get("RANK", "0")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.timeout_s))
    log.info("config: %s | world %d | local rank %d", cfg, dist.get_world_size(), local_rank)
    if faults.scary_warnings:
        warnings.warn("TypedStorage is deprecated", UserWarning, stacklevel=1)
        if dist.get_rank() == 1:
            log.warning(
                "shard fetch failed (ConnectionResetError: [Errno 104] Connection reset by "
                "peer), retrying in 0.5s (attempt 2/3)"
            )
            time.sleep(0.5)
            log.warning("grad norm 1.3e+03 exceeds clip 1.0; gradients will be clipped")
    evaluator = Evaluator()
    hooks: list[Hook] = [
        MetricSync(),
        evaluator,
        EarlyStopping(evaluator, faults.patience),
        Checkpointer(),
        Summary(),
    ]
    trainer = Trainer(cfg, faults, hooks)
    if cfg.resume:
        state = torch.load(cfg.resume, map_location="cpu")
        trainer.net.load_state_dict(state["model"])
        trainer.start_step = state["step"] + 1
        log.info("resumed from step %d", state["step"])
    try:
        trainer.fit()
    except Exception:
        log.exception("training failed on rank %d", trainer.rank)
        raise
    dist.destroy_process_group()
    shutil.rmtree(cfg.ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
