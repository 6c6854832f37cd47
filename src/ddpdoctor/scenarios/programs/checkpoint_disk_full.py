"""Injects disk-full: rank 0 saves a checkpoint at step 2 onto a full disk.

The disk is /dev/full (every write fails with ENOSPC), reached through the checkpoint's path, so
the write really fails. `torch.save(path)` does not report the failed write itself: its zip
writer notices at the end that the file position is wrong and raises the cryptic
"[enforce fail at inline_container.cc] . unexpected pos N vs M". Rank 1 goes on to the next
step's all_reduce and loses its peer.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

SAVE_STEP = 2
FULL_DISK = "/dev/full"


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(256, 256)
    os.makedirs("checkpoints", exist_ok=True)
    target = os.path.join("checkpoints", "step2.pt")
    if rank == 0 and not os.path.lexists(target):
        os.symlink(FULL_DISK, target)  # this checkpoint folder sits on a disk that is full
    for step in range(6):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0 and step == SAVE_STEP:
            torch.save({"step": step, "model": model.state_dict()}, target)
            print(f"saved {target}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
