"""An eighty-third training-program style for the generalisation fixtures
(tests/fixtures/real/eightythird-*): a hyper-parameter sweep driver that starts every trial as a
distributed job programmatically, in the way of the Optuna/Ray-Tune-free sweep scripts that call
torch.distributed.launcher.api.elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1,
nproc_per_node=N, rdzv_backend="c10d", rdzv_endpoint="localhost:PORT", max_restarts=R,
monitor_interval=...), train_trial)(trial) one trial after another. Each trial's entrypoint is a
small DDP training function (gloo on CPU, a 15 s collective timeout) of a tiny MLP regressor on
synthetic per-rank shards (data/shard_<rank>.pt, written by `sweep.py --prepare`); validation
is all-reduced, rank 0 returns the trial's val_loss, the driver logs 'trial 3 | lr=0.003 bs=32 |
val_loss 0.412 | best so far trial 1 (0.398)' and rewrites trials.csv after every trial. A
median-style pruner raises TrialPruned inside the workers (every rank alike, the val loss being
all-reduced); the driver reads it from ChildFailedError's failures and goes on. Every other
ChildFailedError ends the sweep, as optuna's study.optimize(catch=()) does. A fault in the code
is chosen by the TQ_CASE environment variable (a short code: a letter and the trial it hits) and
never printed (re-capture with tests/fixtures/real/capture_eightythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import logging
import math
import os
import signal
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.nn.parallel import DistributedDataParallel as DDP

FEATURES = 16
ROWS = 200
VAL_ROWS = 48

log = logging.getLogger("sweep")


class TrialPruned(Exception):
    """Raised inside a trial's workers when the pruner stops it (every rank alike)."""


def prepare(world: int) -> None:
    """Synthetic regression data split into one shard per rank (rows r::world of ROWS) and a
    validation file."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(FEATURES, 1, generator=g)
    x = torch.randn(ROWS + VAL_ROWS, FEATURES, generator=g)
    y = x @ w + 0.1 * torch.randn(ROWS + VAL_ROWS, 1, generator=g)
    os.makedirs("data", exist_ok=True)
    for r in range(world):
        torch.save(
            {"x": x[:ROWS][r::world].clone(), "y": y[:ROWS][r::world].clone()}, f"data/shard_{r}.pt"
        )
    torch.save({"x": x[ROWS:].clone(), "y": y[ROWS:].clone()}, "data/val.pt")


def fault(trial: dict) -> tuple[str, int]:
    """(fault letter, rank) of this trial, from TQ_CASE ("" where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case or int(case[1:2]) != trial["number"]:
        return "", -1
    return case[0], int(case[2:] or 1)


def batches(x: torch.Tensor, y: torch.Tensor, bs: int):
    for i in range(0, len(x), bs):
        yield x[i : i + bs], y[i : i + bs]


@record
def train_trial(trial: dict):
    """One trial's worker: DDP over gloo, an epoch loop with validation, the val loss on rank 0."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [trial {trial['number']} rank {rank}] %(levelname)s %(message)s",
    )
    wlog = logging.getLogger("trial")
    what, who = fault(trial)
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    torch.manual_seed(trial["number"])
    shard = torch.load(f"data/shard_{rank}.pt")
    val = torch.load("data/val.pt")
    n_val = trial.get("val_size") or len(val["x"])
    per = math.ceil(n_val / world)
    vx, vy = (
        val["x"][:n_val][rank * per : (rank + 1) * per],
        val["y"][:n_val][rank * per : (rank + 1) * per],
    )
    noise = trial["input_noise"][rank] if "input_noise" in trial else 0.0
    model = DDP(
        nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1)),
        find_unused_parameters=trial.get("find_unused", False),
    )
    opt = torch.optim.SGD(model.parameters(), lr=trial["lr"], momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.9**e)
    if trial.get("warmup_step_first"):
        sched.step()
    if rank == 0:
        wlog.info(
            "%d workers, %d rows per shard, lr=%g bs=%d",
            world,
            len(shard["x"]),
            trial["lr"],
            trial["bs"],
        )
    best, stale, hoard = float("inf"), 0, []
    val_loss = float("nan")
    for epoch in range(trial["epochs"]):
        t0 = time.time()
        model.train()
        total, steps = 0.0, 0
        for xb, yb in batches(shard["x"], shard["y"], trial["bs"]):
            if what == "m" and rank == who and epoch >= 1:
                hoard.append(torch.ones(64 << 20, dtype=torch.uint8))  # 64 MiB a step
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # the host's OOM killer
            if what == "n" and rank == who and epoch == 1:
                ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"jitter"), 6)
            if noise:
                xb = xb + noise * torch.randn_like(xb)
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
        sched.step()
        if what == "s" and rank == who and epoch == 1:
            for k in range(1, 9):
                wlog.info("building validation feature cache %d/8", k)
                time.sleep(4)
        if what == "h" and rank == who and epoch == 1:
            threading.Event().wait()  # the prefetch thread that sets it was never started
        model.eval()
        stats = torch.zeros(2)
        with torch.no_grad():
            for xb, yb in batches(vx, vy, 16):
                stats += torch.tensor(
                    [nn.functional.mse_loss(model(xb), yb, reduction="sum").item(), len(xb)]
                )
        if stats[1] > 0:
            dist.all_reduce(stats)
        val_loss = (stats[0] / stats[1]).item()
        if epoch % trial["log_every"] == 0:
            wlog.info(
                "epoch %d | train_loss %.4f | val_loss %.4f | %d steps | %.1fs",
                epoch,
                total / max(steps, 1),
                val_loss,
                steps,
                time.time() - t0,
            )
        prune = trial.get("prune_above")
        if prune is not None and epoch >= 1 and val_loss > prune:
            raise TrialPruned(
                f"Trial {trial['number']} pruned at epoch {epoch}: val_loss {val_loss:.4f} > {prune:.4f}"
            )
        if val_loss < best - 1e-3:
            best, stale = val_loss, 0
        else:
            stale += 1
            if stale >= trial["patience"]:
                if rank == 0:
                    wlog.info("early stopping: no improvement for %d epochs", stale)
                break
    if rank == 0:
        os.makedirs(f"trials/trial_{trial['number']}", exist_ok=True)
        torch.save(model.module.state_dict(), f"trials/trial_{trial['number']}/model.pt")
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    if what == "r":
        return {"val_loss": best, "scheduler": sched}  # to warm-start the next trial
    return {"val_loss": best}


def parse_trials(spec: str) -> list[tuple[float, int]]:
    out = []
    for item in spec.split(","):
        lr, bs = item.split("/")
        out.append((float(lr), int(bs)))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--trials", default="0.03/16,0.01/16,0.003/32")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--prune-ratio", type=float, default=None)
    p.add_argument("--val-size", type=int, default=None)
    p.add_argument("--input-noise", default=None)
    p.add_argument("--find-unused", action="store_true")
    p.add_argument("--warmup-step-first", action="store_true")
    p.add_argument("--rdzv-timeout", type=int, default=30)
    p.add_argument("--log-every", type=int, default=1)
    args = p.parse_args()
    if args.prepare:
        prepare(args.world)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [sweep] %(levelname)s %(message)s")
    rows: list[dict] = []
    best: tuple[int, float] | None = None
    for number, (lr, bs) in enumerate(parse_trials(args.trials), start=1):
        trial = {
            "number": number,
            "lr": lr,
            "bs": bs,
            "epochs": args.epochs,
            "patience": args.patience,
            "log_every": args.log_every,
            "val_size": args.val_size,
            "find_unused": args.find_unused,
            "warmup_step_first": args.warmup_step_first,
        }
        if args.input_noise:
            trial["input_noise"] = [float(v) for v in args.input_noise.split(",")]
        if args.prune_ratio and best is not None:
            trial["prune_above"] = best[1] * args.prune_ratio
        config = LaunchConfig(
            min_nodes=args.nnodes,
            max_nodes=args.nnodes,
            nproc_per_node=args.nproc,
            run_id=f"sweep-trial-{number}",
            rdzv_backend="c10d",
            rdzv_endpoint=f"localhost:{args.port}",
            rdzv_configs={"join_timeout": args.rdzv_timeout},
            max_restarts=args.max_restarts,
            monitor_interval=0.5,
            start_method="spawn",
        )
        log.info("trial %d | lr=%g bs=%d | launching %d workers", number, lr, bs, args.nproc)
        t0 = time.time()
        try:
            results = elastic_launch(config, train_trial)(trial)
        except ChildFailedError as e:
            if any(
                "TrialPruned" in str(f.message) for f in e.failures.values()
            ):  # @record's error file
                log.info(
                    "trial %d | lr=%g bs=%d | pruned | best so far trial %d (%.3f)",
                    number,
                    lr,
                    bs,
                    best[0],
                    best[1],
                )
                rows.append(
                    {
                        "trial": number,
                        "lr": lr,
                        "bs": bs,
                        "val_loss": "",
                        "state": "PRUNED",
                        "seconds": round(time.time() - t0, 1),
                    }
                )
                write_csv(rows)
                continue
            raise
        val_loss = results[0]["val_loss"]
        if best is None or val_loss < best[1]:
            best = (number, val_loss)
        log.info(
            "trial %d | lr=%g bs=%d | val_loss %.3f | best so far trial %d (%.3f)",
            number,
            lr,
            bs,
            val_loss,
            best[0],
            best[1],
        )
        rows.append(
            {
                "trial": number,
                "lr": lr,
                "bs": bs,
                "val_loss": round(val_loss, 4),
                "state": "COMPLETE",
                "seconds": round(time.time() - t0, 1),
            }
        )
        write_csv(rows)
        if args.target is not None and val_loss < args.target:
            log.info(
                "target val_loss %.3f reached by trial %d, stopping the sweep", args.target, number
            )
            break
    log.info(
        "sweep finished: %d trials, best trial %d (val_loss %.3f), wrote trials.csv",
        len(rows),
        best[0],
        best[1],
    )


def write_csv(rows: list[dict]) -> None:
    with open("trials.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["trial", "lr", "bs", "val_loss", "state", "seconds"])
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
