"""A sixty-first training-program style for the generalisation fixtures
(tests/fixtures/real/sixtyfirst-*): a small recommender (a wide-and-deep click model: user, item
and genre embeddings, a dwell-time feature, an MLP) trained data-parallel in the way of PyTorch's
tutorials "Distributed Training with Uneven Inputs Using the Join Context Manager" and "Shard
Optimizer States with ZeroRedundancyOptimizer": DDP on CPU (gloo, 15 s collective timeout), a
DDP communication hook (PowerSGD by default, fp16 compression with --comm-hook fp16) registered
with register_comm_hook, ZeroRedundancyOptimizer(optimizer_class=Adam), and each epoch's loop
inside `with Join([model, optim])`, so that ranks whose part of the data is shorter join early
and shadow the others' collectives. Each rank reads its own part of the interactions
(data/train/part-0000N.csv, parsed row by row as the DataLoader asks for it) and writes its own
log file, logs/rankN.log, through Python logging (a FileHandler, '%(asctime)s [%(levelname)s]
%(name)s: %(message)s', no rank in the line); rank 0 alone prints a short summary per epoch to
stdout. Each epoch ends with a validation pass whose loss is all-reduced, then
optim.consolidate_state_dict(to=0) on every rank and rank 0's torch.save of checkpoints/epoch_E.pt;
the run ends with a barrier (without it, torch 2.13 may deadlock in the DDP reducer's gloo group
destructor at exit) and destroy_process_group.
Launched with torchrun --nproc_per_node 3 --master_port PORT. A fault in the code is chosen by
the RECSYS_XP environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_sixtyfirst.sh after any edit).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import json
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger("recsys")

GENRES = {"drama": 0, "comedy": 1, "action": 2, "documentary": 3, "kids": 4, "horror": 5}
FIELDS = ["user_id", "item_id", "genre", "dwell", "clicked"]


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    momentum_rank: int = -1  # this rank logs Adam's (absent) momentum with the learning rate
    hoard_rank: int = -1  # this rank keeps every batch's item embeddings until the OOM killer acts
    segv_rank: int = -1  # this rank's native feature hasher reads address 0
    slow_rank: int = -1  # this rank rebuilds its negative-sampling table before epoch 1
    stuck_rank: int = -1  # this rank waits for a prefetch thread that was never started
    local_vocab_rank: int = -1  # this rank sizes the item table from its own part
    solo_stop: bool = False  # the early-stop check sits in rank 0's summary block
    solo_consolidate: bool = False  # consolidate_state_dict is called in rank 0's save block
    solo_hook: bool = False  # the comm hook is registered in rank 0's set-up block
    join_model_only: bool = False  # Join([model]): the optimizer is not given to Join
    metric_in_join: bool = False  # a running click-rate all-reduce inside the Join loop
    no_final_barrier: bool = False  # the ranks tear down without the final barrier


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "a2": Fault(momentum_rank=2),
    "b1": Fault(hoard_rank=1),
    "c2": Fault(segv_rank=2),
    "d1": Fault(slow_rank=1),
    "e2": Fault(stuck_rank=2),
    "f1": Fault(local_vocab_rank=1),
    "g0": Fault(solo_stop=True),
    "h0": Fault(solo_consolidate=True),
    "i0": Fault(solo_hook=True),
    "j": Fault(join_model_only=True),
    "k": Fault(metric_in_join=True),
    "l": Fault(no_final_barrier=True),
}


def make_data(folder: Path, rows: list[int], n_users: int = 200, n_items: int = 300) -> None:
    """Synthetic interactions: one CSV part per rank for training and for validation, and
    meta.json with the vocabulary sizes (the item ids of a part stay below its own maximum)."""
    rng = random.Random(61)
    genres = list(GENRES)
    for split, counts in (("train", rows), ("val", [64] * len(rows))):
        (folder / split).mkdir(parents=True, exist_ok=True)
        for part, count in enumerate(counts):
            top = n_items - 1 - 40 * part  # the later parts hold older (lower-numbered) items
            with open(folder / split / f"part-{part:05d}.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(FIELDS)
                for _ in range(count):
                    user, item = rng.randrange(n_users), rng.randint(0, top)
                    genre = genres[item % len(genres)]
                    dwell = round(rng.expovariate(1 / 40), 1)
                    p = 0.15 + 0.6 * ((user * 7 + item * 3) % 10 >= 6) + 0.1 * (dwell > 30)
                    w.writerow([user, item, genre, dwell, int(rng.random() < p)])
    (folder / "meta.json").write_text(json.dumps({"n_users": n_users, "n_items": n_items}))


class Interactions(Dataset):
    """One part's rows, each parsed when the DataLoader asks for it."""

    def __init__(self, path: Path) -> None:
        with open(path) as f:
            self.lines = f.read().splitlines()[1:]
        self.path = path

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = dict(zip(FIELDS, self.lines[i].split(","), strict=False))
        return {
            "user": torch.tensor(int(row["user_id"])),
            "item": torch.tensor(int(row["item_id"])),
            "genre": torch.tensor(GENRES[row["genre"]]),
            "dwell": torch.tensor([float(row["dwell"]) / 60.0]),
            "clicked": torch.tensor(float(row["clicked"])),
        }


class WideDeep(nn.Module):
    def __init__(self, n_users: int, n_items: int, dim: int = 16) -> None:
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        self.genre = nn.Embedding(len(GENRES), 4)
        self.wide = nn.Linear(4 + 1, 1)
        self.deep = nn.Sequential(
            nn.Linear(2 * dim + 4 + 1, 64),
            nn.ReLU(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, 1),
        )

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        g = self.genre(b["genre"])
        x = torch.cat([self.user(b["user"]), self.item(b["item"]), g, b["dwell"]], dim=1)
        return (self.deep(x) + self.wide(torch.cat([g, b["dwell"]], dim=1))).squeeze(1)


def hash_features(items: torch.Tensor, fault: Fault, rank: int, step: int) -> torch.Tensor:
    """The feature-hashing fast path (a native routine in production)."""
    if rank == fault.segv_rank and step == 7:
        ctypes.string_at(0)  # the native hasher dereferences NULL
    return items


def setup_logging(rank: int) -> None:
    Path("logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(f"logs/rank{rank}.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def evaluate(model: DDP, loader: DataLoader, loss_fn: nn.Module) -> torch.Tensor:
    model.eval()
    total = torch.zeros(3)  # loss sum, correct, count
    with torch.no_grad():
        for b in loader:
            logits = model.module(b)
            total[0] += loss_fn(logits, b["clicked"]).item() * len(logits)
            total[1] += ((logits > 0).float() == b["clicked"]).sum()
            total[2] += len(logits)
    model.train()
    return total


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Wide-and-deep click model, DDP + ZeRO + Join")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--comm-hook", choices=["powersgd", "fp16", "none"], default="powersgd")
    p.add_argument("--start-powersgd-iter", type=int, default=10)
    p.add_argument("--target-val-loss", type=float, default=None)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--make-data", metavar="DIR", default=None)
    p.add_argument("--rows", default="384,384,384")
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.make_data:
        make_data(Path(args.make_data), [int(r) for r in args.rows.split(",")])
        return
    fault = FAULTS[os.environ.get("RECSYS_XP", "")]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    setup_logging(rank)
    torch.manual_seed(0)
    logger.info("Process group ready: backend=gloo world_size=%d", world)

    data = Path(args.data_dir)
    meta = json.loads((data / "meta.json").read_text())
    train_set = Interactions(data / "train" / f"part-{rank:05d}.csv")
    val_set = Interactions(data / "val" / f"part-{rank:05d}.csv")
    logger.info(
        "Loaded %d training and %d validation rows from %s",
        len(train_set),
        len(val_set),
        train_set.path,
    )
    n_items = meta["n_items"]
    if rank == fault.local_vocab_rank:  # sized from this part's own items
        n_items = 1 + max(int(line.split(",")[1]) for line in train_set.lines)
    model = DDP(WideDeep(meta["n_users"], n_items))
    logger.info(
        "Model: %d parameters, item table %d x 16",
        sum(p.numel() for p in model.parameters()),
        n_items,
    )

    if args.comm_hook != "none" and (rank == 0 or not fault.solo_hook):
        if args.comm_hook == "powersgd":
            state = powerSGD.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=1,
                start_powerSGD_iter=args.start_powersgd_iter,
                min_compression_rate=0.5,
            )
            model.register_comm_hook(state, powerSGD.powerSGD_hook)
        else:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        logger.info("Registered the %s communication hook", args.comm_hook)

    optim = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr
    )
    owned = sum(p.numel() for g in optim.optim.param_groups for p in g["params"])
    logger.info(
        "ZeroRedundancyOptimizer: this rank owns %d of %d parameter elements",
        owned,
        sum(p.numel() for p in model.parameters()),
    )
    loss_fn = nn.BCEWithLogitsLoss()
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers
    )
    val_loader = DataLoader(val_set, batch_size=64)
    ckpt_dir = Path(args.ckpt_dir)
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        print(
            f"Training WideDeep on {world} ranks: ZeroRedundancyOptimizer(Adam), "
            f"{args.comm_hook} comm hook, Join for uneven inputs",
            flush=True,
        )

    hoard: list[torch.Tensor] = []
    for epoch in range(args.epochs):
        if epoch == 1 and rank == fault.slow_rank:
            for k in range(1, 9):  # 8 passes of 5 s: 40 s against the others' 15 s timeout
                logger.warning("Negative-sampling table is stale, rebuilding (pass %d/8)", k)
                time.sleep(5)
        t0 = time.time()
        running, steps = 0.0, 0
        joinables = [model] if fault.join_model_only else [model, optim]
        with Join(joinables):
            for step, batch in enumerate(train_loader, start=1):
                if epoch == 0 and rank == fault.stuck_rank and step == 12:
                    ready = threading.Event()  # set by a prefetch thread that was never started
                    ready.wait()
                batch["item"] = hash_features(batch["item"], fault, rank, step)
                optim.zero_grad(set_to_none=True)
                loss = loss_fn(model(batch), batch["clicked"])
                loss.backward()
                optim.step()
                running += loss.item()
                steps = step
                if fault.metric_in_join:
                    rate = torch.tensor([batch["clicked"].mean().item(), 1.0])
                    dist.all_reduce(rate)
                if rank == fault.hoard_rank:
                    hoard.append(torch.ones(16 * 1024 * 1024))  # 64 MiB a step
                    if step == 6:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if rank == fault.momentum_rank and step == 20:
                    group = optim.param_groups[0]
                    logger.info("lr %.5f momentum %.3f", group["lr"], group["momentum"])
                if step % args.log_every == 0:
                    logger.info(
                        "epoch %d step %d/%d loss %.4f",
                        epoch,
                        step,
                        len(train_loader),
                        running / step,
                    )
        logger.info(
            "epoch %d: finished after %d batches (train loss %.4f)",
            epoch,
            steps,
            running / max(steps, 1),
        )

        local = evaluate(model, val_loader, loss_fn)
        total = local.clone()
        dist.all_reduce(total)
        val_loss, acc = (total[0] / total[2]).item(), (total[1] / total[2]).item()
        logger.info("epoch %d: validation loss %.4f accuracy %.3f", epoch, val_loss, acc)

        if not fault.solo_consolidate:
            optim.consolidate_state_dict(to=0)
        if rank == 0:
            if fault.solo_consolidate:
                optim.consolidate_state_dict(to=0)
            path = ckpt_dir / f"epoch_{epoch}.pt"
            torch.save(
                {
                    "epoch": epoch,
                    "model": model.module.state_dict(),
                    "optimizer": optim.state_dict(),
                },
                path,
            )
            logger.info("Saved checkpoint %s", path)
            print(
                f"epoch {epoch}: train_loss={running / max(steps, 1):.4f} "
                f"val_loss={val_loss:.4f} val_acc={acc:.3f} ({time.time() - t0:.1f}s)",
                flush=True,
            )
            if fault.solo_stop and args.target_val_loss and val_loss < args.target_val_loss:
                print(
                    f"val_loss {val_loss:.4f} < {args.target_val_loss}: stopping early", flush=True
                )
                return
        if not fault.solo_stop and args.target_val_loss and val_loss < args.target_val_loss:
            logger.info(
                "Validation loss %.4f below %.4f: stopping early", val_loss, args.target_val_loss
            )
            if rank == 0:
                print(
                    f"val_loss {val_loss:.4f} < {args.target_val_loss}: stopping early", flush=True
                )
            break

    logger.info("Training done")
    if rank == 0:
        print("Done.", flush=True)
    if not fault.no_final_barrier:
        dist.barrier()  # every rank's last ZeRO broadcast done before the group goes away
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
