"""A twenty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/twentyfourth-*): a PyTorch-Ignite script. `ignite.distributed` starts it:
`idist.Parallel(backend="gloo", nproc_per_node=N)` spawns the ranks itself when --nproc-per-node
is given, and the same script runs under torchrun (the group is then joined with
`idist.initialize("gloo", timeout=...)` and `idist.Parallel(backend=None)` runs the function in
place). A tiny MLP wrapped by `idist.auto_model`, `idist.auto_dataloader` over a JSON-lines
file read lazily (each sample parsed in `__getitem__`), an `Engine` with a
`create_supervised_trainer`-like step, `Events.ITERATION_COMPLETED(every=k)` logging, an
evaluator with ignite metrics (Accuracy, Loss: they all-reduce) at EPOCH_COMPLETED,
`Checkpoint` with `DiskSaver` (rank 0 saves), `EarlyStopping` (--patience), `TerminateOnNan`, a
`ProgressBar` on rank 0, `setup_logger` (ignite's format; silent on ranks > 0, as ignite makes
it), and optionally a TensorboardLogger on rank 0. Collective timeout 15 s. A fault is chosen by
the IGN_FAULT environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_twentyfourth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import (
    Checkpoint,
    DiskSaver,
    EarlyStopping,
    ProgressBar,
    TerminateOnNan,
    global_step_from_engine,
)
from ignite.metrics import Accuracy, Loss
from ignite.utils import manual_seed, setup_logger
from torch import nn
from torch.utils.data import Dataset, Subset

TIMEOUT = timedelta(seconds=15)


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank looks up a class weight under a name the table lacks
    hoard_rank: int = -1  # this rank keeps every batch's features until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation reads address 0
    local_stop_rank0: bool = False  # EarlyStopping attached on rank 0 only
    eval_rank0: bool = False  # the evaluator is run on rank 0 only (its metrics all-reduce)
    short_rank: int = -1  # this rank's part of the data is cut to half (no DistributedSampler)
    slow_rank: int = -1  # this rank rebuilds a lookup index for 25 s before epoch 2
    stuck_rank: int = -1  # this rank waits for a prefetch thread that never signals


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(key_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "e0": Fault(local_stop_rank0=True),
    "v0": Fault(eval_rank0=True),
    "u1": Fault(short_rank=1),
    "p0": Fault(slow_rank=0),
    "t1": Fault(stuck_rank=1),
}
CLASSES = ["cat", "dog", "owl", "fox"]
FEATURES = 16


class JsonLines(Dataset):
    """One sample per line: {"x": [16 floats], "y": class name}; parsed when read."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.lines = f.read().splitlines()

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rec = json.loads(self.lines[i])
        return torch.tensor(rec["x"], dtype=torch.float32), CLASSES.index(rec["y"])


def make_data(path: str, n: int, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x[:, :4].argmax(1)).tolist()
    with open(path, "w") as f:
        for row, label in zip(x.tolist(), y, strict=True):
            f.write(json.dumps({"x": [round(v, 4) for v in row], "y": CLASSES[label]}) + "\n")


def training(local_rank: int, cfg: dict) -> None:
    rank, world = idist.get_rank(), idist.get_world_size()
    fault = FAULTS[os.environ.get("IGN_FAULT", "")]
    logger = setup_logger(name="Toy-Training", distributed_rank=rank)
    logger.info(f"rank {rank} of {world}, backend {idist.backend()}, config {cfg}")
    manual_seed(cfg["seed"] + rank)

    train_ds = JsonLines(os.path.join(cfg["data"], "train.jsonl"))
    val_ds = JsonLines(os.path.join(cfg["data"], "val.jsonl"))
    if fault.short_rank >= 0:  # each rank takes its own slice (no sampler): one is cut short
        part = list(range(rank, len(train_ds), world))
        if rank == fault.short_rank:
            part = part[: len(part) // 2]
        train_loader = torch.utils.data.DataLoader(
            Subset(train_ds, part), batch_size=cfg["batch_size"]
        )
    else:
        train_loader = idist.auto_dataloader(
            train_ds, batch_size=cfg["batch_size"] * world, shuffle=False, drop_last=True
        )
    val_loader = idist.auto_dataloader(val_ds, batch_size=cfg["batch_size"] * world, shuffle=False)

    model = idist.auto_model(
        nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, len(CLASSES)))
    )
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9))
    criterion = nn.CrossEntropyLoss()
    class_weight = {"cat": 1.0, "dog": 1.0, "owl": 1.2}
    hoard: list[torch.Tensor] = []

    def train_step(engine: Engine, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        model.train()
        x, y = batch
        it = engine.state.iteration
        if rank == fault.key_rank and it == 3:
            w = torch.tensor([class_weight[c] for c in CLASSES])  # "fox" was never weighted
            criterion.weight = w
        if rank == fault.hoard_rank:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if rank == fault.segv_rank and it == 3:
            ctypes.string_at(0)  # the native augmentation dereferences NULL
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    trainer = Engine(train_step)
    trainer.logger = setup_logger("trainer", distributed_rank=rank)
    metrics = {"accuracy": Accuracy(), "loss": Loss(criterion)}

    def eval_step(engine: Engine, batch: tuple[torch.Tensor, torch.Tensor]):
        model.eval()
        with torch.no_grad():
            x, y = batch
            return model(x), y

    evaluator = Engine(eval_step)
    evaluator.logger = setup_logger("evaluator", distributed_rank=rank)
    for name, metric in metrics.items():
        metric.attach(evaluator, name)

    trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())

    @trainer.on(Events.ITERATION_COMPLETED(every=cfg["log_every"]))
    def log_training_loss(engine: Engine) -> None:
        logger.info(
            f"Epoch[{engine.state.epoch}] Iteration[{engine.state.iteration}] "
            f"Loss: {engine.state.output:.4f}"
        )

    @trainer.on(Events.EPOCH_STARTED)
    def before_epoch(engine: Engine) -> None:
        if engine.state.epoch == 2 and rank == fault.slow_rank:
            for part in range(1, 6):
                logger.info(f"Rebuilding nearest-neighbour index: part {part}/5")
                time.sleep(5)
        if engine.state.epoch == 2 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()

    @trainer.on(Events.EPOCH_COMPLETED)
    def run_validation(engine: Engine) -> None:
        if fault.eval_rank0 and rank != 0:
            return
        evaluator.run(val_loader)
        m = evaluator.state.metrics
        logger.info(
            f"Validation Results - Epoch[{engine.state.epoch}] "
            f"Avg accuracy: {m['accuracy']:.3f} Avg loss: {m['loss']:.4f}"
        )

    if rank == 0:
        ProgressBar(persist=True).attach(
            trainer, metric_names="all", output_transform=lambda o: {"loss": o}
        )
        if cfg["logger"] == "tensorboard":
            from ignite.handlers import TensorboardLogger

            tb_logger = TensorboardLogger(log_dir=os.path.join(cfg["output"], "tb"))
            tb_logger.attach_output_handler(
                trainer,
                Events.ITERATION_COMPLETED,
                tag="training",
                output_transform=lambda o: {"loss": o},
            )

    to_save = {"model": model, "optimizer": optimizer, "trainer": trainer}
    checkpoint = Checkpoint(
        to_save,
        DiskSaver(cfg["output"]),
        n_saved=2,
        filename_prefix="best",
        score_function=Checkpoint.get_default_score_fn("accuracy"),
        score_name="accuracy",
        global_step_transform=global_step_from_engine(trainer),
    )
    evaluator.add_event_handler(Events.COMPLETED, checkpoint)
    if cfg["patience"] and (not fault.local_stop_rank0 or rank == 0):
        stopper = EarlyStopping(
            patience=cfg["patience"],
            score_function=lambda e: e.state.metrics["accuracy"],
            trainer=trainer,
            min_delta=1.0,
        )
        evaluator.add_event_handler(Events.COMPLETED, stopper)
    if cfg["resume"]:
        state = torch.load(cfg["resume"], map_location="cpu")
        Checkpoint.load_objects(to_load=to_save, checkpoint=state)
        logger.info(f"Resumed from {cfg['resume']} at epoch {trainer.state.epoch}")

    trainer.run(train_loader, max_epochs=cfg["epochs"])
    logger.info(
        f"Training done: epoch {trainer.state.epoch}, last checkpoint {checkpoint.last_checkpoint}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--data", default="data")
    p.add_argument("--output", default="output")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=4)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--logger", default="none", choices=["none", "tensorboard"])
    p.add_argument("--resume", default="")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--make-data", type=int, default=0, help="write N samples to --data and stop")
    args = p.parse_args()
    if args.make_data:
        os.makedirs(args.data, exist_ok=True)
        make_data(os.path.join(args.data, "train.jsonl"), args.make_data)
        make_data(os.path.join(args.data, "val.jsonl"), args.make_data // 4, seed=4)
        return
    cfg = {
        k: v
        for k, v in vars(args).items()
        if k not in ("nproc_per_node", "master_port", "make_data")
    }
    if args.nproc_per_node:  # ignite spawns the ranks itself
        spawn = {
            "nproc_per_node": args.nproc_per_node,
            "master_port": args.master_port,
            "timeout": TIMEOUT,
        }
        with idist.Parallel(backend="gloo", **spawn) as parallel:
            parallel.run(training, cfg)
    else:  # under torchrun: join the group with a short timeout, run in place
        idist.initialize("gloo", timeout=TIMEOUT)
        with idist.Parallel(backend=None) as parallel:
            parallel.run(training, cfg)
        idist.finalize()


if __name__ == "__main__":
    main()
