"""An eighth training-program style for the generalisation fixtures (tests/fixtures/real/seventh-*):
a tiny next-token model trained the way DeepSpeed users write it: `deepspeed.init_distributed(
dist_backend="gloo", timeout=20 s)`, `deepspeed.initialize` with a config dict (ZeRO stage 1,
gradient accumulation, steps_per_print, DeepSpeed's own AdamW), `engine.backward`/`engine.step`,
`engine.save_checkpoint`/`load_checkpoint` every epoch, `deepspeed.comm` collectives, `log_dist`
and DeepSpeed's own log lines as they come. Data are JSONL shards, one per rank, written by
`--prepare`; the model and DeepSpeed configs may come from files (a node's stale copy is a fault).
Started with the `deepspeed` launcher, torchrun, two torchrun agents as two nodes, or plain
python. One real fault per --mode (or LM_MODE, since the deepspeed launcher prints its command
line), named by what it does so no output ever quotes the label.
Captured by tests/fixtures/real/capture_seventh.sh: re-capture after any edit (the fixtures
quote its lines)."""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.utils import log_dist, logger
from deepspeed.utils.logging import set_log_level_from_string
from torch import nn
from torch.utils.data import DataLoader, Dataset

CONTEXT = 16  # positions the model has embeddings for
VOCAB = 64


@dataclass(frozen=True)
class Plan:
    """What goes wrong, where (rank None: nowhere)."""

    noisy: bool = False  # a deprecation, a missing optional tracker, the timers' breakdown
    stop_below: float | None = None  # stop when the validation loss is under this
    stop_agreed: bool = True  # ... decided together (all_reduce of the flag) or on rank 0 only
    tokens_rank0: bool = False  # rank 0 sums the tokens seen over all ranks at each print
    dump_rank: int | None = None  # writes its samples and waits for the others in a barrier
    ack_logger: bool = False  # an async metrics writer started on the main process only
    retokenize_rank: int | None = None  # rebuilds its token cache in a busy loop
    hoard_rank: int | None = None  # keeps each step's activations until the kernel kills it
    native_rank: int | None = None  # a C helper reads through a null pointer
    strict_args: bool = False  # the argument parser written for torchrun: no --local_rank


PLANS: dict[str, Plan] = {
    "baseline": Plan(),  # capture_seventh.sh's checkpoints and the data modes
    "noisy-ok": Plan(noisy=True),
    "agreed-stop": Plan(stop_below=50.0),
    "main-stop": Plan(stop_below=50.0, stop_agreed=False),
    "main-allreduce": Plan(tokens_rank0=True),
    "extra-barrier": Plan(dump_rank=1),
    "ack-wait": Plan(ack_logger=True),
    "busy-retok": Plan(retokenize_rank=1),
    "hoard-kill": Plan(hoard_rank=1),
    "null-read": Plan(native_rank=1),
    "strict-args": Plan(strict_args=True),
}
# modes whose fault is in their inputs (capture_seventh.sh prepares them): the program is the
# baseline one
for _name in ("long-doc", "cut-record", "short-shard", "torn-ckpt", "tag-one-node"):
    PLANS[_name] = Plan()
for _name in ("accum-skew", "width-skew", "no-launcher"):
    PLANS[_name] = Plan()


def prepare(data_dir: str, world: int, docs: int, long_shard: int, cut_shard: int) -> None:
    """Writes the corpus as one JSONL shard per rank (contiguous, the last one holds the
    remainder) and a validation file. Each document is an arithmetic sequence of tokens."""
    os.makedirs(data_dir, exist_ok=True)
    rnd = random.Random(11)

    def doc(length: int) -> list[int]:
        start, step = rnd.randrange(VOCAB), rnd.choice([1, 2, 3])
        return [(start + i * step) % VOCAB for i in range(length)]

    corpus = [doc(CONTEXT + 1) for _ in range(docs)]
    per = math.ceil(docs / world)
    for r in range(world):
        part = corpus[r * per : (r + 1) * per]
        lines = [json.dumps({"id": r * per + i, "tokens": t}) for i, t in enumerate(part)]
        if r == long_shard:  # a document the export's length filter let through
            lines[5] = json.dumps({"id": r * per + 5, "tokens": doc(CONTEXT + 9)})
        if r == cut_shard:  # the export was interrupted while writing this record
            lines[9] = lines[9][: len(lines[9]) // 2]
        with open(os.path.join(data_dir, f"shard-{r}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(data_dir, "valid.jsonl"), "w") as f:
        for i in range(16):
            f.write(json.dumps({"id": i, "tokens": doc(CONTEXT + 1)}) + "\n")


class Shard(Dataset[list[int]]):
    """One JSONL file of token documents."""

    def __init__(self, path: str) -> None:
        self.docs: list[list[int]] = []
        with open(path) as f:
            for line in f:
                self.docs.append(json.loads(line)["tokens"])

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> list[int]:
        return self.docs[i]


def collate(docs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pads to the longest document of the batch; inputs and next-token targets."""
    width = max(len(d) for d in docs)
    t = torch.full((len(docs), width), -100, dtype=torch.long)
    for i, d in enumerate(docs):
        t[i, : len(d)] = torch.tensor(d)
    return t[:, :-1].clamp(min=0), t[:, 1:]


class TinyLM(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(CONTEXT, hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, VOCAB)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1])
        out: torch.Tensor = self.mlp(self.tok(x) + self.pos(positions))
        return out


def ds_config(path: str, world: int, plan: Plan) -> dict[str, object]:
    if path:
        with open(path) as f:
            loaded: dict[str, object] = json.load(f)
        return loaded
    return {
        "train_batch_size": 4 * 2 * world,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 2,
        "wall_clock_breakdown": plan.noisy,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True},
        },
        "zero_optimization": {"stage": 1},
    }


class MetricsWriter:
    """Sends metrics to a writer thread and waits until they are flushed (the main process
    writes the metrics file)."""

    def __init__(self, path: str, start: bool) -> None:
        self.todo: queue.Queue[str] = queue.Queue()
        self.done: queue.Queue[int] = queue.Queue()
        self.path = path
        if start:
            threading.Thread(target=self._write, daemon=True).start()

    def _write(self) -> None:
        while True:
            line = self.todo.get()
            with open(self.path, "a") as f:
                f.write(line + "\n")
            self.done.put(1)

    def log(self, line: str) -> None:
        self.todo.put(line)
        self.done.get()  # flushed


def evaluate(engine: deepspeed.DeepSpeedEngine, loader: DataLoader[list[int]]) -> float:
    """Mean validation loss over every rank."""
    engine.eval()
    total = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            logits = engine(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            total += torch.tensor([loss.item() * len(x), len(x)])
    dist.all_reduce(total)
    engine.train()
    return float(total[0] / total[1])


def parse(argv: list[str]) -> tuple[Plan, argparse.Namespace]:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--mode", default=os.environ.get("LM_MODE", "baseline"))
    known, rest = first.parse_known_args(argv)
    plan = PLANS.get(known.mode)
    if plan is None:
        sys.exit(f"unknown mode {known.mode!r}")
    parser = argparse.ArgumentParser(description="tiny next-token model with DeepSpeed")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out-dir", default=os.environ.get("TMPDIR", "/tmp") + "/tinylm")
    parser.add_argument("--ckpt-dir", default=os.environ.get("LM_CKPT_DIR", ""))
    parser.add_argument("--resume-tag", default="")
    parser.add_argument("--ds-config", default=os.environ.get("LM_DS_CONFIG", ""))
    parser.add_argument("--model-config", default=os.environ.get("LM_MODEL_CONFIG", ""))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--prepare", action="store_true", help="write the shards and exit")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--docs", type=int, default=0)
    parser.add_argument("--long-doc-shard", type=int, default=-1)
    parser.add_argument("--cut-record-shard", type=int, default=-1)
    if not plan.strict_args:
        parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    parser = deepspeed.add_config_arguments(parser)
    return plan, parser.parse_args(rest)


def main() -> None:
    plan, args = parse(sys.argv[1:])
    if args.prepare:
        prepare(
            args.data_dir,
            args.world,
            args.docs or 32 * args.world,
            args.long_doc_shard,
            args.cut_record_shard,
        )
        return
    if plan.noisy:
        warnings.warn(
            "`--lr-warmup` is deprecated, use `--warmup-steps`", FutureWarning, stacklevel=1
        )
    set_log_level_from_string("info")  # DeepSpeed's config dump and step lines, as users see them
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if plan.noisy and rank == 0:
        try:
            __import__("tensorboardX")
        except ImportError:
            logger.warning("tensorboardX is not installed: metrics are only printed")

    hidden = 32
    if args.model_config:
        with open(args.model_config) as f:
            hidden = int(json.load(f)["hidden"])
    model = TinyLM(hidden)
    train = Shard(os.path.join(args.data_dir, f"shard-{rank}.jsonl"))
    valid = Shard(os.path.join(args.data_dir, "valid.jsonl"))
    config = ds_config(args.ds_config, world, plan)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    micro = engine.train_micro_batch_size_per_gpu()
    order = torch.Generator()
    loader = DataLoader(train, batch_size=micro, shuffle=True, generator=order, collate_fn=collate)
    val_loader = DataLoader(valid, batch_size=micro, collate_fn=collate)
    log_dist(f"{len(train)} documents, {len(loader)} micro-batches per epoch", ranks=[-1])

    start_epoch = 0
    if args.resume_tag:
        path, client = engine.load_checkpoint(args.ckpt_dir, tag=args.resume_tag)
        start_epoch = int((client or {}).get("epoch", -1)) + 1
        log_dist(f"resumed from {path} at epoch {start_epoch}", ranks=[-1])

    os.makedirs(args.out_dir, exist_ok=True)
    metrics = MetricsWriter(os.path.join(args.out_dir, "metrics.txt"), start=rank == 0)
    hoard: list[torch.Tensor] = []
    tokens = torch.zeros(1)
    for epoch in range(start_epoch, args.epochs):
        if epoch == 1 and rank == plan.retokenize_rank:
            print(f"[rank {rank}] token cache is stale, re-tokenizing the shard", flush=True)
            end, n = time.monotonic() + 60, 0
            while time.monotonic() < end:
                n = (n * 31 + 7) % 1_000_003
            print(f"[rank {rank}] token cache rebuilt", flush=True)
        seed = torch.tensor([random.Random(epoch).randrange(1 << 30) if rank == 0 else 0])
        dist.broadcast(seed, src=0)  # the epoch's shuffle, the same on every rank
        order.manual_seed(int(seed))
        for i, (x, y) in enumerate(loader):
            logits = engine(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            tokens += (y >= 0).sum()
            step = engine.global_steps
            if not engine.was_step_applied() or i % 2 == 0:
                continue
            if rank == plan.hoard_rank:
                hoard.append(torch.empty(16 << 20).fill_(1.0))  # 64 MiB kept per step
                if len(hoard) == 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == plan.native_rank and epoch == 1 and i == 3:
                ctypes.string_at(0)  # the C tokenizer's fast path on an empty buffer
            if step % 2 == 0:
                if plan.tokens_rank0 and rank == 0:
                    seen = tokens.clone()
                    dist.all_reduce(seen)  # tokens seen by all ranks, for the progress line
                    log_dist(f"step {step}: {int(seen)} tokens so far", ranks=[0])
                if plan.ack_logger and epoch == 1:
                    metrics.log(f"{step} {loss.item():.4f}")
            if rank == plan.dump_rank and epoch == 1 and i == 3:
                path = os.path.join(args.out_dir, f"samples-{rank}.pt")
                torch.save(x, path)
                print(f"[rank {rank}] wrote {path}", flush=True)
                dist.barrier()  # until every rank has written its samples
        val = evaluate(engine, val_loader)
        log_dist(f"epoch {epoch} validation loss {val:.4f}", ranks=[0])
        stop = plan.stop_below is not None and val < plan.stop_below
        if plan.stop_below is not None and not plan.stop_agreed:
            if rank == 0 and stop:
                log_dist(f"validation loss {val:.4f} below target, stopping", ranks=[0])
                return
            continue
        if plan.stop_below is not None:
            flag = torch.tensor([float(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                log_dist(
                    f"validation loss {val:.4f} below target on some rank, stopping", ranks=[0]
                )
                break
        if args.ckpt_dir:
            engine.save_checkpoint(args.ckpt_dir, client_state={"epoch": epoch})
    log_dist("training done", ranks=[0])


if __name__ == "__main__":
    main()
