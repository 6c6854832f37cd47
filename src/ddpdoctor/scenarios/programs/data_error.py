"""Injects a data-error: rank 1 cannot open its data shard at step 3 (FileNotFoundError).

Rank 1 raises, but first starts a non-daemon thread to report the bad shard to a (slow) data
service, so its process and gloo sockets stay alive a few seconds after the traceback. Rank 0 waits
in the all_reduce of step 3 until the 3 s process-group timeout fires and exits first, so torchrun
names rank 0 as the root cause; rank 1 then gets SIGTERM. The real cause is rank 1's missing file.
"""

import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

FAIL_RANK = 1
FAIL_STEP = 3


def report_bad_shard(path: str) -> None:
    time.sleep(8)  # stands in for an HTTP call to a data service that answers slowly


def read_shard(rank: int, step: int, root: str) -> torch.Tensor:
    path = os.path.join(root, f"shard-{rank:05d}-step{step:03d}.bin")
    if not (rank == FAIL_RANK and step == FAIL_STEP):  # this shard was never staged
        with open(path, "wb") as f:
            f.write(os.urandom(64))
    try:
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).float() / 255
    except OSError:
        threading.Thread(target=report_bad_shard, args=(path,), name="report").start()
        raise


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(64, 1)
    root = os.path.abspath(f"shards/rank{rank}")
    os.makedirs(root, exist_ok=True)
    for step in range(6):
        loss = model(read_shard(rank, step, root)).sum()
        loss.backward()
        for p in model.parameters():  # hand-rolled gradient averaging
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
