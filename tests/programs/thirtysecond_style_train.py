"""A thirty-second training-program style: a research repo's train.py that prints its own
header on every line, "[2026-12-04 00:07:01,123][rank 1/3] message" (print with flush), reads a
small config from the environment, wraps a model with an auxiliary head in DDP (gloo, 15 s
timeout), loads data through a DataLoader with two workers, and can resume from a checkpoint.
One fault per run, chosen by $T32_CASE (an opaque code the program never prints).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("T32_CASE", "")
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def say(msg: str) -> None:
    now = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"[{now}][rank {RANK}/{WORLD}] {msg}", flush=True)


class Config:
    """What a YAML file would hold; a run may carry a stale override."""

    def __init__(self) -> None:
        self.hidden = 32
        if CASE == "w4" and RANK == 2:
            self.hidden = 48  # this node's copy of the config is an older one
        self.epochs = 2
        self.aux_from_epoch = 99 if CASE == "u1" else 0


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 12, generator=gen)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if CASE == "d6" and RANK == 1 and i == 37:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker process, as the OOM killer does
        return self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(12, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, 2)
        self.aux = torch.nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        h = self.body(x)
        out = self.head(h)
        return out + 0.1 * self.aux(h) if use_aux else out


class Stamp:
    """What the old code saved besides the weights."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch


def main() -> None:
    if CASE == "i2":
        import apex  # noqa: F401  # the old mixed-precision package, not installed here
    if CASE == "g7":
        say(f"world rank {dist.get_rank()}")  # asked before the process group exists
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=15))
    cfg = Config()
    say(f"config hidden={cfg.hidden} epochs={cfg.epochs}")
    torch.manual_seed(0)
    model = DDP(Net(cfg.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = Path(os.environ.get("T32_OUT", "out"))
    start_epoch = 0
    if CASE == "o5":
        if RANK == 0:
            out.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "stamp": Stamp(1)}, out / "ckpt.pt")
        dist.barrier()
        state = torch.load(out / "ckpt.pt")
        model.module.load_state_dict(state["model"])
        start_epoch = state["stamp"].epoch
        say(f"resumed from epoch {start_epoch}")
    data = Points(64, seed=RANK)
    loader = DataLoader(data, batch_size=8, num_workers=2, shuffle=False)
    for epoch in range(start_epoch, cfg.epochs):
        total = 0.0
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x, epoch >= cfg.aux_from_epoch), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            if step % 4 == 0:
                say(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f}")
            if CASE == "n3" and RANK == 0 and epoch == 1 and step == 2:
                raise FloatingPointError(f"loss diverged at epoch {epoch} step {step}")
        mean = torch.tensor([total / len(loader)])
        dist.all_reduce(mean)
        say(f"epoch {epoch} done, mean loss {mean.item() / WORLD:.4f}")
    say("Done!")
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
