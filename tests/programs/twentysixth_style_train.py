"""A twenty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/twentysixth-*): a Hydra application. `@hydra.main(config_path=
"twentysixth_conf", config_name="config", version_base="1.3")` composes the config (a `model`
config group whose entries name their class in `_target_`, built with `hydra.utils.instantiate`;
dotted overrides on the command line: `trainer.epochs=2 data.num_workers=2 model=resmlp`), and
torchrun starts the app once per rank. Each rank's Hydra run folder is its own
(`hydra.run.dir: outputs/${name}/rank${oc.env:RANK,0}`, as teams do so that the ranks'
`train.log` files do not interleave; a run may override it with one folder for all). Hydra's job
logging writes the console ("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s") and the run
folder's train.log; an exception in the task function is Hydra's to report ("Error executing job
with overrides: [...]", the trimmed traceback, "Set the environment variable HYDRA_FULL_ERROR=1
for a complete stack trace.", exit 1). Inside: raw DDP over a tiny MLP on gloo (collective
timeout from the config, 15 s), a CSV dataset parsed lazily in `__getitem__`, a
DistributedSampler, a validation loss and accuracy all-reduced across ranks, a rank-0
checkpoint each epoch and an early stop on the all-reduced validation loss. A fault in the code
is chosen by the HX_FAULT environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_twentysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import logging
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger(__name__)
FEATURES = 16


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    weight_rank: int = -1  # this rank weights classes by the counts of a 3-sample slice
    hoard_rank: int = -1  # this rank keeps every batch's features until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation reads address 0
    stuck_rank: int = -1  # this rank waits before epoch 2 for a marker file nobody writes
    upload_rank: int = -1  # this rank uploads each checkpoint to a store that keeps timing out
    fence_rank: int = -1  # the barrier after saving sits inside this rank's save branch
    stop_rank: int = -1  # the early stopper is consulted on this rank only


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "z1": Fault(weight_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "t1": Fault(stuck_rank=1),
    "u0": Fault(upload_rank=0),
    "b0": Fault(fence_rank=0),
    "e0": Fault(stop_rank=0),
}


class MLP(nn.Module):
    def __init__(
        self, in_features: int, num_classes: int, hidden: int, depth: int, dropout: float
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_features, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout)]
        layers.append(nn.Linear(hidden, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class ResMLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(blocks))
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = h + torch.relu(block(h))
        out: torch.Tensor = self.out(h)
        return out


class CsvRows(Dataset[tuple[torch.Tensor, int]]):
    """One sample per row: f0..f15, label (a class name); a row is parsed when it is read."""

    def __init__(self, path: str, classes: list[str]) -> None:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        self.header, self.rows, self.classes = rows[0], rows[1:], classes

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.rows[i]
        x = torch.tensor([float(v) for v in row[:FEATURES]])
        return x, self.classes.index(row[FEATURES])


def make_data(folder: str, n: int, world: int, classes: list[str]) -> None:
    """train.csv, val.csv and train.csv cut in `world` shards (train-RR-of-WW.csv)."""
    os.makedirs(folder, exist_ok=True)
    header = [f"f{i}" for i in range(FEATURES)] + ["label"]
    for name, count, seed in (("train", n, 3), ("val", n // 4, 4)):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(count, FEATURES, generator=g)
        y = x[:, : len(classes)].argmax(1).tolist()
        rows = [[f"{v:.4f}" for v in r] + [classes[c]] for r, c in zip(x.tolist(), y, strict=True)]
        parts = [(f"{name}.csv", rows)]
        if name == "train":
            parts += [(f"train-{r:02d}-of-{world:02d}.csv", rows[r::world]) for r in range(world)]
        for fname, part in parts:
            with open(os.path.join(folder, fname), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(part)


def evaluate(model: nn.Module, loader: DataLoader[tuple[torch.Tensor, int]]) -> tuple[float, float]:
    """Validation loss and accuracy over every rank's part (all-reduced sums)."""
    model.eval()
    sums = torch.zeros(3)
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            sums[0] += nn.functional.cross_entropy(out, y, reduction="sum")
            sums[1] += (out.argmax(1) == y).sum()
            sums[2] += len(y)
    dist.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


@hydra.main(config_path="twentysixth_conf", config_name="config", version_base="1.3")  # type: ignore[untyped-decorator]
def main(cfg: DictConfig) -> float:
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.trainer.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    fault = FAULTS[os.environ.get("HX_FAULT", "")]
    log.info(f"rank {rank}/{world} on {os.uname().nodename}, run dir {HydraConfig.get().run.dir}")
    if rank == 0:
        log.info("config:\n" + OmegaConf.to_yaml(cfg).rstrip())
    torch.manual_seed(cfg.seed)

    classes = list(cfg.data.classes)
    model = instantiate(cfg.model, in_features=FEATURES, num_classes=len(classes))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.trainer.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    if cfg.data.sharded:  # this rank's shard, written by the preprocessing job
        train_ds = CsvRows(
            os.path.join(cfg.data.path, f"train-{rank:02d}-of-{world:02d}.csv"), classes
        )
        sampler: DistributedSampler[tuple[torch.Tensor, int]] | None = None
    else:
        train_ds = CsvRows(os.path.join(cfg.data.path, "train.csv"), classes)
        sampler = DistributedSampler(train_ds, shuffle=False, drop_last=True)
    val_ds = CsvRows(os.path.join(cfg.data.path, "val.csv"), classes)
    loader = DataLoader(
        train_ds, batch_size=cfg.data.batch_size, sampler=sampler,
        num_workers=cfg.data.num_workers, drop_last=True,
    )  # fmt: skip
    val_loader = DataLoader(
        val_ds, batch_size=cfg.data.batch_size, sampler=DistributedSampler(val_ds, shuffle=False)
    )
    log.info(f"rank {rank}: {len(train_ds)} training rows, {len(loader)} batches an epoch")

    start, best, stale = 0, float("inf"), 0
    if cfg.trainer.resume:
        state = torch.load(cfg.trainer.resume, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, best = state["epoch"] + 1, state["best"]
        log.info(f"resumed from {cfg.trainer.resume} at epoch {start}")
    hoard: list[torch.Tensor] = []
    stop_here = fault.stop_rank < 0 or rank == fault.stop_rank

    for epoch in range(start, cfg.trainer.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        if epoch == 1 and rank == fault.stuck_rank:
            while not os.path.exists(os.path.join(cfg.data.path, ".prefetched")):
                time.sleep(0.5)  # the prefetcher that writes it was never started
        for step, (x, y) in enumerate(loader):
            if rank == fault.weight_rank and step == 3:
                counts = Counter(y[:3].tolist())
                criterion.weight = torch.tensor([len(y) / counts[c] for c in range(len(classes))])
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and step == 3:
                ctypes.string_at(0)  # the native augmentation dereferences NULL
            optimizer.zero_grad()
            loss = criterion(ddp(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % cfg.trainer.log_every == 0:
                log.info(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f}")

        val_loss, val_acc = evaluate(ddp, val_loader)
        if rank == 0:
            log.info(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.3f}")
            os.makedirs(cfg.trainer.ckpt_dir, exist_ok=True)
            path = os.path.join(cfg.trainer.ckpt_dir, f"epoch{epoch}.pt")
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epoch": epoch, "best": min(best, val_loss)}, path)
            log.info(f"saved checkpoint {path}")
            if rank == fault.upload_rank:
                for attempt in range(1, 6):
                    log.info(f"uploading {path} to the artifact store (attempt {attempt}/5)")
                    time.sleep(5)
                log.warning("artifact store unreachable, keeping the local checkpoint only")
            if rank == fault.fence_rank:
                dist.barrier()  # wait until every rank sees the new checkpoint
        if val_loss < best - cfg.trainer.min_delta:
            best, stale = val_loss, 0
        else:
            best, stale = min(best, val_loss), stale + 1
        if cfg.trainer.patience and stop_here and stale >= cfg.trainer.patience:
            log.info(
                f"early stopping at epoch {epoch}: val_loss has not improved by "
                f"{cfg.trainer.min_delta} for {stale} epoch(s), best {best:.4f}"
            )
            break

    log.info(f"rank {rank} finished, best val_loss {best:.4f}")
    dist.destroy_process_group()
    return best


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-data"]:
        p = argparse.ArgumentParser()
        p.add_argument("--make-data", type=int, required=True, help="N training samples")
        p.add_argument("--data", default="data")
        p.add_argument("--world", type=int, default=3)
        args = p.parse_args()
        make_data(args.data, args.make_data, args.world, ["cat", "dog", "owl", "fox"])
    else:
        main()
