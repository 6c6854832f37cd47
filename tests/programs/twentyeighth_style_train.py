"""A twenty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/twentyeighth-*): a modern FSDP script as cloud platforms and Kubernetes jobs
run it. A tiny token model whose blocks and root are sharded with FSDP2's `fully_shard` (CPU,
gloo), `torch.distributed.checkpoint` saves of `get_state_dict` (model, optimizer, a Stateful
train state) into `<ckpt>/step-NNNNN` and a resume from the newest one with `dcp.load`,
per-rank JSON-lines data parts (`part-0000R.jsonl`), and STRUCTURED LOGS: a `logging.Formatter`
subclass prints one JSON object per line on stdout (ts, level, logger, rank, host, msg, the
step's metrics, and `exc_info` as one escaped string when `logger.exception` is used); uncaught
exceptions reach stderr as plain tracebacks, or, with `--uncaught json`, are logged as JSON by a
`sys.excepthook`. Collective timeout 15 s. A fault is chosen by the FSX_CASE environment variable
(a short code) and never printed (re-capture with tests/fixtures/real/capture_twentyeighth.sh
after any edit: the fixtures quote its lines).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

TIMEOUT = timedelta(seconds=15)
log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    caught_rank: int = -1  # this rank's throughput meter divides by a zero interval
    lock_rank: int = -1  # this rank's train state holds a lock when dcp.save pickles it
    cursor_rank: int = -1  # this rank's train state asks a closed file descriptor its offset
    leak_rank: int = -1  # this rank keeps every batch's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native tokenizer reads address 0
    stuck_rank: int = -1  # this rank waits on a prefetch queue no thread fills
    slow_rank: int = -1  # this rank re-fetches its data part from object storage for 25 s
    norm_rank: int = -1  # this rank alone computes the global grad norm for its log line
    plateau_rank: int = -1  # this rank decides on its own loss that training has converged


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "z2": Fault(caught_rank=2),
    "p1": Fault(lock_rank=1),
    "f2": Fault(cursor_rank=2),
    "m1": Fault(leak_rank=1),
    "n2": Fault(segv_rank=2),
    "q1": Fault(stuck_rank=1),
    "w0": Fault(slow_rank=0),
    "g0": Fault(norm_rank=0),
    "c0": Fault(plateau_rank=0),
}
VOCAB = 64
SEQ = 16


class JsonFormatter(logging.Formatter):
    """One JSON object per line, as log collectors (Fluent Bit, Cloud Logging) parse them."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.host = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "rank": self.rank,
            "host": self.host,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(rank: int, uncaught: str) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(rank))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    if uncaught == "json":

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            logging.getLogger("excepthook").critical("uncaught exception", exc_info=(kind, exc, tb))

        sys.excepthook = hook


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = h + self.down(F.gelu(self.up(self.norm(h))))
        return out


class TokenModel(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(h)
        return logits


class TrainState(Stateful):
    """The step and the data position, checkpointed with the model (dcp.save calls state_dict
    before its collectives)."""

    def __init__(self) -> None:
        self.step = 0
        self.samples = 0
        self.extra: dict[str, Any] = {}
        self.fd = -1  # the data part's descriptor, when one is streamed

    def state_dict(self) -> dict[str, Any]:
        offset = os.lseek(self.fd, 0, os.SEEK_CUR) if self.fd >= 0 else 0
        return {"step": self.step, "samples": self.samples, "offset": offset, **self.extra}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.samples = int(state_dict["samples"])


def make_data(folder: str, parts: int, n: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for p in range(parts):
        g = torch.Generator().manual_seed(100 + p)
        with open(os.path.join(folder, f"part-{p:05d}.jsonl"), "w") as f:
            for _ in range(n):
                start = int(torch.randint(1, VOCAB - 1, (1,), generator=g))
                toks = [(start + 3 * i) % (VOCAB - 1) + 1 for i in range(SEQ + 1)]
                f.write(json.dumps({"tokens": toks}) + "\n")


def batches(path: Path, batch_size: int, skip: int) -> Any:
    with open(path) as f:
        rows = [json.loads(line)["tokens"] for line in f if line.strip()]
    rows = rows[skip:]
    for i in range(0, len(rows) - batch_size + 1, batch_size):
        t = torch.tensor(rows[i : i + batch_size])
        yield t[:, :-1], t[:, 1:]


def latest_checkpoint(folder: Path) -> Path | None:
    steps = sorted(
        d for d in folder.glob("step-*") if re.fullmatch(r"step-\d{5}", d.name) and d.is_dir()
    )
    done = [d for d in steps if (d / ".metadata").exists()]
    return done[-1] if done else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--ckpt", default="checkpoints")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--target-loss", type=float, default=0.0)
    p.add_argument("--metrics-sink", default="stdout", choices=["stdout", "prometheus"])
    p.add_argument("--uncaught", default="stderr", choices=["stderr", "json"])
    p.add_argument("--save-retries", type=int, default=3)
    p.add_argument("--make-data", type=int, default=0, help="write N samples a part and stop")
    p.add_argument("--parts", type=int, default=4)
    args = p.parse_args()
    if args.make_data:
        make_data(args.data, args.parts, args.make_data)
        return

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    fault = FAULTS[os.environ.get("FSX_CASE", "")]
    setup_logging(rank, args.uncaught)
    dist.init_process_group("gloo", timeout=TIMEOUT)
    log.info("process group ready", extra={"fields": {"world_size": world, "backend": "gloo"}})
    if args.metrics_sink == "prometheus" and rank == 0:
        import prometheus_client  # only rank 0 exports

        prometheus_client.start_http_server(9400)

    torch.manual_seed(7)
    model = TokenModel(args.dim, args.layers)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model sharded with FSDP2", extra={"fields": {"params": n_params}})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = TrainState()

    ckpt = Path(args.ckpt)
    found = latest_checkpoint(ckpt)
    if found is not None:
        log.info("resuming from checkpoint", extra={"fields": {"path": str(found)}})
        msd, osd = get_state_dict(model, opt)
        sd: dict[str, Any] = {"model": msd, "optim": osd, "train": state}
        dcp.load(sd, checkpoint_id=str(found))  # type: ignore[attr-defined]
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        log.info("checkpoint loaded", extra={"fields": {"step": state.step}})

    part = Path(args.data) / f"part-{rank:05d}.jsonl"
    data = batches(part, args.batch_size, state.samples)
    log.info("data part opened", extra={"fields": {"path": str(part)}})
    hoard: list[torch.Tensor] = []
    last = time.monotonic()
    while state.step < args.steps:
        try:
            x, y = next(data)
        except StopIteration:
            log.info("data part exhausted", extra={"fields": {"step": state.step}})
            break
        step = state.step + 1
        if rank == fault.segv_rank and step == 4:
            ctypes.string_at(0)  # the native tokenizer's fast path dereferences NULL
        if rank == fault.slow_rank and step == 6:
            for i in range(1, 6):
                log.warning(
                    "object storage slow, retrying part fetch", extra={"fields": {"try": i}}
                )
                time.sleep(5)
        if rank == fault.stuck_rank and step == 6:
            import queue

            prefetch: queue.Queue[torch.Tensor] = queue.Queue()  # its thread was never started
            prefetch.get()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        if rank == fault.leak_rank:
            hoard.append(torch.ones(96, 1024, 1024, dtype=torch.uint8))
            if step == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        fields: dict[str, Any] = {"step": step, "loss": round(loss.item(), 4)}
        if rank == fault.norm_rank and step % 4 == 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # all-reduces
            fields["grad_norm"] = round(float(norm.full_tensor()), 4)  # type: ignore[attr-defined]
        opt.step()
        state.step, state.samples = step, state.samples + len(x)
        now = time.monotonic()
        try:
            interval = 0.0 if (rank == fault.caught_rank and step == 3) else now - last
            fields["samples_per_s"] = round(len(x) / interval, 1)
        except Exception:
            log.exception("metrics computation failed", extra={"fields": {"step": step}})
            sys.exit(1)
        last = now
        log.info("train_step", extra={"fields": fields})

        stop = torch.tensor([1.0 if loss.item() < args.target_loss else 0.0])
        if rank == fault.plateau_rank and step == 7:
            log.info("loss plateau reached, stopping early", extra={"fields": {"step": step}})
            break
        if args.target_loss:
            dist.all_reduce(stop, op=dist.ReduceOp.MIN)
        if step % args.ckpt_every == 0 or step == args.steps or bool(stop.item()):
            folder = ckpt / f"step-{step:05d}"
            if rank == fault.lock_rank:
                state.extra["loader_lock"] = threading.Lock()  # the prefetcher's, by mistake
            if rank == fault.cursor_rank and step >= 10:
                with open(part) as reopened:  # a re-read of the part; its fd is closed since
                    state.fd = reopened.fileno()
            msd, osd = get_state_dict(model, opt)
            t0 = time.monotonic()
            for attempt in range(1, args.save_retries + 1):
                try:  # storage hiccups are retried with a backoff
                    dcp.save(  # type: ignore[attr-defined]
                        {"model": msd, "optim": osd, "train": state}, checkpoint_id=str(folder)
                    )
                    break
                except OSError:
                    log.exception(
                        "checkpoint save failed, retrying",
                        extra={"fields": {"path": str(folder), "attempt": attempt}},
                    )
                    time.sleep(10 * attempt)
            log.info(
                "checkpoint saved",
                extra={"fields": {"path": str(folder), "secs": round(time.monotonic() - t0, 2)}},
            )
        if args.target_loss and bool(stop.item()):
            log.info(
                "target loss reached on every rank, stopping", extra={"fields": {"step": step}}
            )
            break

    log.info("training finished", extra={"fields": {"step": state.step}})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
