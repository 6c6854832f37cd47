"""A forty-ninth program style for the generalisation fixtures (tests/fixtures/real/fortyninth-*):
a distributed evaluation / batch-inference harness in the way of lm-evaluation-harness,
detectron2's `inference_on_dataset` and torchmetrics-based eval scripts. Every rank loads the same
small classifier checkpoint (trained for a few steps by --make-checkpoint at capture time), takes
its shard of a JSONL evaluation set by hand (`lines[rank::world]`, each line parsed by the rank
that owns it), runs its batches under `torch.no_grad()` and keeps predictions and per-example
metrics; the counts are all-reduced (MAX), each rank pads its rows to that count and the padded
tensors are all-gathered to rank 0, which alone computes the metrics (accuracy and its bootstrap
stderr, mean NLL; F1 through scikit-learn with --metrics acc,f1), writes predictions.jsonl and
results.json and prints lm-eval's markdown table; a final barrier ends the run. With
--running-metrics the running accuracy is all-reduced every batch (torchmetrics'
dist_sync_on_step) for the progress bar, and --target-stderr stops early once the accuracy's
stderr is small enough. Logging in lm-eval's format on every rank (rank 0 at INFO, the others at
WARNING, "rank N:" before a warning or an error); rank 0 alone shows a tqdm bar. Launched by
tests/programs/fortyninth_eval.sh (torchrun, gloo, 15 s timeout). A fault is chosen by the
E49_CASE environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fortyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

TIMEOUT = datetime.timedelta(seconds=15)
FEATURES = 8
CLASSES = 3
TASKS = ("toy_parity", "toy_majority")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank's per-task tally is a plain dict seeded from its first batch
    hoard_rank: int = -1  # this rank keeps a copy of every batch's activations until OOM-killed
    segv_rank: int = -1  # this rank's native feature extractor reads address 0
    slow_metrics: bool = False  # rank 0's bootstrap stderr runs 40 s before the final barrier
    stuck_rank: int = -1  # this rank waits before batch 4 for a prefetch thread never started
    total_rank0: bool = False  # rank 0 alone all-reduces the example count for its bar's total
    local_pad: bool = False  # each rank pads to its own count instead of the all-reduced one
    chunked: bool = False  # contiguous chunks of ceil(n / world) instead of lines[rank::world]
    every_rank_writes: bool = False  # the results are written by every rank, not rank 0 only
    stop_rank0: bool = False  # the --target-stderr check sits in rank 0's progress-bar code
    cuda_map: bool = False  # the checkpoint is mapped to f"cuda:{local_rank}"


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(key_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "b0": Fault(slow_metrics=True),
    "w1": Fault(stuck_rank=1),
    "t0": Fault(total_rank0=True),
    "p0": Fault(local_pad=True),
    "c2": Fault(chunked=True),
    "r1": Fault(every_rank_writes=True),
    "x0": Fault(stop_rank0=True),
    "g0": Fault(cuda_map=True),
}

eval_logger = logging.getLogger("lm-eval")


class RankFilter(logging.Filter):
    """Puts "rank N: " before the message of a warning or an error."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and not str(record.msg).startswith("rank "):
            record.msg = f"rank {self.rank}: {record.msg}"
        return True


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s,%(msecs)03d %(levelname)-8s [%(filename)s:%(lineno)d] %(message)s",
            datefmt="%Y-%m-%d:%H:%M:%S",
        )
    )
    handler.addFilter(RankFilter(rank))
    eval_logger.addHandler(handler)
    eval_logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    eval_logger.propagate = False


@dataclass
class ModelConfig:
    """The classifier's shape (an older trainer pickled this object into its checkpoints)."""

    features: int = FEATURES
    hidden: int = 16
    classes: int = CLASSES


def build_model(cfg: ModelConfig) -> nn.Module:
    return nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.classes)
    )


def label_of(x: list[float], task: str) -> int:
    if task == "toy_parity":
        return int(sum(v > 0 for v in x[:4]) % CLASSES)
    return int(max(range(CLASSES), key=lambda k: x[k]))


def make_data(path: Path, n: int, seed: int = 7) -> None:
    """n examples, the tasks in blocks of 24 documents."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, row in enumerate(x.tolist()):
            task = TASKS[(i // 24) % 2]
            rec = {"doc_id": i, "task": task, "x": [round(v, 4) for v in row]}
            rec["label"] = label_of(rec["x"], task)
            f.write(json.dumps(rec) + "\n")


def make_checkpoint(path: Path, data: Path, style: str, steps: int = 60) -> None:
    """Trains the classifier for a few steps on the eval data's distribution (one process)."""
    torch.manual_seed(0)
    cfg = ModelConfig()
    model = build_model(cfg)
    recs = [json.loads(line) for line in data.read_text().splitlines()]
    x = torch.tensor([r["x"] for r in recs])
    y = torch.tensor([r["label"] for r in recs])
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for step in range(steps):
        idx = torch.arange(step * 32, step * 32 + 32) % len(recs)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if style == "ddp":  # saved by the trainer from its DistributedDataParallel wrapper
        store = dist.FileStore(str(path.parent / ".store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        state = nn.parallel.DistributedDataParallel(model).state_dict()
        dist.destroy_process_group()
        os.remove(path.parent / ".store")
    if style == "config":  # the older trainer's layout: the config object pickled alongside
        torch.save({"model": state, "config": cfg, "steps": steps}, path)
    else:
        torch.save({"model": state, "steps": steps}, path)


def bootstrap_stderr(correct: list[int], iters: int, slow: bool) -> float:
    g = torch.Generator().manual_seed(1234)
    c = torch.tensor(correct, dtype=torch.float32)
    means = []
    chunk = max(iters // 8, 1)
    for part in range(8):
        idx = torch.randint(0, len(c), (chunk, len(c)), generator=g)
        means.append(c[idx].mean(1))
        if slow:  # the bootstrap over every resample, done in Python on one core
            time.sleep(5)
            eval_logger.info(f"bootstrapping for stddev: acc: {part + 1}/8 done")
    return float(torch.cat(means).std())


def main() -> None:
    p = argparse.ArgumentParser(description="distributed evaluation harness")
    p.add_argument("--model", default="ckpt/model.pt")
    p.add_argument("--data", default="data/eval.jsonl")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--metrics", default="acc,nll")
    p.add_argument("--bootstrap-iters", type=int, default=100000)
    p.add_argument("--running-metrics", action="store_true")
    p.add_argument("--target-stderr", type=float, default=0.0)
    p.add_argument("--min-docs", type=int, default=20, help="before --target-stderr is checked")
    p.add_argument("--output-path", default="results")
    p.add_argument("--make-data", type=int, default=0)
    p.add_argument("--make-checkpoint", default="", choices=["", "plain", "ddp", "config"])
    args = p.parse_args()
    if args.make_data:
        make_data(Path(args.data), args.make_data)
        return
    if args.make_checkpoint:
        make_checkpoint(Path(args.model), Path(args.data), args.make_checkpoint)
        return

    fault = FAULTS[os.environ.get("E49_CASE", "")]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    setup_logging(rank)
    eval_logger.info(f"Initialized torch.distributed: world_size {world}, backend gloo")
    eval_logger.info(f"Loading model from {args.model}")

    cfg = ModelConfig()
    model = build_model(cfg)
    where = f"cuda:{local_rank}" if fault.cuda_map else "cpu"
    state = torch.load(args.model, map_location=where)
    model.load_state_dict(state["model"])
    model.eval()
    eval_logger.info(f"Model loaded: {sum(p.numel() for p in model.parameters())} parameters")

    with open(args.data) as f:
        lines = f.read().splitlines()
    if args.limit:
        lines = lines[: args.limit]
    if fault.chunked:
        chunk = math.ceil(len(lines) / world)
        mine = lines[rank * chunk : (rank + 1) * chunk]
    else:
        mine = lines[rank::world]
    docs = [json.loads(line) for line in mine]  # each rank parses only its own lines
    eval_logger.info(
        f"Building contexts for {','.join(TASKS)} on rank {rank}: {len(lines)} docs in total"
    )
    batches = [docs[i : i + args.batch_size] for i in range(0, len(docs), args.batch_size)]

    total = torch.tensor([len(batches)])
    if fault.total_rank0 and rank == 0:  # the bar's total is the number of batches of all ranks
        dist.all_reduce(total)
    bar = tqdm(
        total=int(total) if rank == 0 else len(batches),
        desc="Running eval",
        ascii=True,
        disable=rank != 0,
    )

    rows: list[list[float]] = []
    logits_list: list[torch.Tensor] = []
    tally: dict[str, dict[str, float]] = {}
    hoard: list[torch.Tensor] = []
    seen = correct_sum = 0
    stopped = False
    for b, batch in enumerate(batches):
        if b == 4 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by the prefetch thread, which was never started
            ready.wait()
        if b == 3 and rank == fault.segv_rank:
            ctypes.string_at(0)  # the native feature extractor dereferences NULL
        x = torch.tensor([d["x"] for d in batch])
        y = torch.tensor([d["label"] for d in batch])
        with torch.no_grad():
            time.sleep(0.05)  # stands in for a real model's forward over real inputs
            logits = model(x)
            nll = nn.functional.cross_entropy(logits, y, reduction="none")
        pred = logits.argmax(-1)
        if rank == fault.hoard_rank:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # a copy of the batch
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if not torch.isfinite(nll).all():
            bad = [d["doc_id"] for d, v in zip(batch, nll.tolist(), strict=True) if v != v]
            eval_logger.error(f"nll is nan for doc_id {bad} at batch {b}; stopping")
            sys.exit(1)
        if rank == fault.key_rank and not tally:
            tally = {d["task"]: {"n": 0, "correct": 0} for d in batch}
        for d, pr, v in zip(batch, pred.tolist(), nll.tolist(), strict=True):
            if rank == fault.key_rank:
                tally[d["task"]]["n"] += 1
            else:
                tally.setdefault(d["task"], {"n": 0, "correct": 0})["n"] += 1
            tally[d["task"]]["correct"] += int(pr == d["label"])
            rows.append([d["doc_id"], TASKS.index(d["task"]), pr, d["label"], v])
        logits_list.append(logits)
        seen += len(batch)
        correct_sum += int((pred == y).sum())
        bar.update(1)
        if args.running_metrics:  # torchmetrics' dist_sync_on_step
            running = torch.tensor([correct_sum, seen], dtype=torch.float64)
            dist.all_reduce(running)
            acc = running[0].item() / running[1].item()
            bar.set_postfix(acc=f"{acc:.3f}")
            if args.target_stderr:
                se = math.sqrt(acc * (1 - acc) / running[1].item())
                if se < args.target_stderr and running[1].item() >= args.min_docs:
                    eval_logger.warning(
                        f"stopping early: acc stderr {se:.4f} below --target-stderr "
                        f"{args.target_stderr} after {b + 1} batches "
                        f"({int(running[1].item())} docs)"
                    )
                    stopped = True
                    break
        elif fault.stop_rank0 and rank == 0 and args.target_stderr:
            acc = correct_sum / seen
            se = math.sqrt(acc * (1 - acc) / seen)
            if se < args.target_stderr and seen >= args.min_docs:
                eval_logger.warning(
                    f"stopping early: acc stderr {se:.4f} below --target-stderr "
                    f"{args.target_stderr} after {b + 1} batches ({seen} docs)"
                )
                stopped = True
                break
    bar.close()
    if stopped and fault.stop_rank0:  # rank 0 writes what it has and leaves
        eval_logger.info(f"Partial results of rank 0 ({seen} docs) kept; exiting")
        sys.exit(0)

    all_logits = torch.cat(logits_list)  # kept for calibration metrics
    eval_logger.info(f"rank {rank} done: {len(rows)} docs, logits {tuple(all_logits.shape)}")

    # gather: every rank pads its rows to the largest count, rank 0 keeps the real ones
    count = torch.tensor([len(rows)])
    if not fault.local_pad:
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    padded = torch.full((int(count), 5), -1.0)
    if rows:
        padded[: len(rows)] = torch.tensor(rows)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)

    if rank == 0 or fault.every_rank_writes:
        table = torch.cat(gathered) if rank == 0 else padded
        table = table[table[:, 0] >= 0]
        order = table[:, 0].argsort()
        table = table[order]
        results: dict[str, dict[str, float]] = {}
        for t, task in enumerate(TASKS):
            part = table[table[:, 1] == t]
            if not len(part):
                continue
            correct = (part[:, 2] == part[:, 3]).int().tolist()
            res = {"acc": sum(correct) / len(correct), "nll": float(part[:, 4].mean())}
            res["acc_stderr"] = bootstrap_stderr(correct, args.bootstrap_iters, fault.slow_metrics)
            if "f1" in args.metrics.split(","):
                from sklearn.metrics import f1_score

                res["f1"] = float(
                    f1_score(part[:, 3].int().tolist(), part[:, 2].int().tolist(), average="macro")
                )
            results[task] = res
        out = Path(args.output_path)
        out.mkdir(parents=True, exist_ok=True)
        res_path = out / "results.json"
        if res_path.exists():
            raise FileExistsError(f"{res_path} already exists; refusing to overwrite it")
        res_path.write_text(json.dumps({"results": results, "n_docs": len(table)}, indent=2))
        with open(out / "predictions.jsonl", "w") as f:
            for row in table.tolist():
                f.write(
                    json.dumps({"doc_id": int(row[0]), "pred": int(row[2]), "nll": row[4]}) + "\n"
                )
        eval_logger.info(f"Saving results to {res_path} ({len(table)} docs)")
        if rank == 0:
            print("|    task    |metric|value |   |stderr|")
            print("|------------|------|-----:|---|-----:|")
            for task, res in results.items():
                print(f"|{task:<12}|acc   |{res['acc']:.4f}|±  |{res['acc_stderr']:.4f}|")
                print(f"|{'':<12}|nll   |{res['nll']:.4f}|   |      |")
                if "f1" in res:
                    print(f"|{'':<12}|f1    |{res['f1']:.4f}|   |      |")
            sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
