"""A thirty-fifth training-program style: code ported from a JAX/TF codebase that keeps absl's
glog-like log lines ("I1204 00:22:01.123456 21714 train.py:42] message": severity letter, date,
time, the writing thread's id (the process id for the main thread), file:line), raw DDP on gloo
with a 12 s timeout, flags parsed by hand, an error logged with logging.error then sys.exit(1)
where the original code used absl's app.run. One fault per run, chosen by $T35_CASE (an opaque
code the program never prints).
"""

from __future__ import annotations

import ctypes
import datetime as dt
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("T35_CASE", "")


def log(severity: str, msg: str) -> None:
    """absl's format: IMMDD HH:MM:SS.micros THREAD file:line] msg, on stderr."""
    now = dt.datetime.now()
    frame = sys._getframe(1)
    where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
    stamp = now.strftime("%m%d %H:%M:%S.%f")
    print(
        f"{severity}{stamp} {threading.get_native_id()} {where}] {msg}", file=sys.stderr, flush=True
    )


def main() -> None:
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=12))
    rank, world = dist.get_rank(), dist.get_world_size()
    log("I", f"process {rank} of {world} started")
    shard = Path(os.environ.get("T35_DATA", "data")) / f"shard-{rank}.txt"
    shard.parent.mkdir(parents=True, exist_ok=True)
    if not (CASE == "p4" and rank == 1):  # the sync that wrote the shards skipped rank 1's
        shard.write_text("\n".join(str(i) for i in range(40)))
    try:
        values = [float(v) for v in shard.read_text().split()]
    except OSError as e:
        log("E", f"could not read {shard}: {e}")
        sys.exit(1)
    x = torch.tensor(values).reshape(-1, 4)
    y = (x.sum(1) % 2 > 0.5).long()
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lock = threading.Lock()
    for epoch in range(3):
        for step in range(5):
            loss = F.cross_entropy(model(x / 40), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 2 == 0:
                log("I", f"epoch {epoch} step {step} loss {loss.item():.4f}")
            if CASE == "t1" and rank == 1 and epoch == 1 and step == 3:
                config = {"lr": 0.01}
                log("I", f"decayed lr {config['lr_decay']}")
            if CASE == "g2" and rank == 2 and epoch == 1 and step == 1:
                ctypes.string_at(0)
            if CASE == "d8" and rank == 0 and epoch == 2 and step == 0:
                lock.acquire()
                lock.acquire()  # a second acquire of a lock this thread holds: a deadlock
        log("I", f"epoch {epoch} finished")
    log("I", "Training finished after 3 epochs.")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
