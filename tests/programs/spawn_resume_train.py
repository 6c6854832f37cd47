"""An mp.spawn job whose every process resumes from the same checkpoint with torch.load's default
(weights_only=True since torch 2.6), which rejects the numpy scalar in it; only rank 0 says that it
resumes. Recorded as tests/fixtures/real/spawn-resume-said/console.log: `ddpdoctor run --
python spawn_resume_train.py PORT` in an empty folder, paths rewritten."""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load_checkpoint(path: str) -> dict[str, object]:
    return torch.load(path, map_location="cpu")


def worker(rank: int, world: int, port: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    if rank == 0:
        print(f"rank {rank}: resuming from ckpt.pt", flush=True)
    load_checkpoint("ckpt.pt")
    dist.barrier()


if __name__ == "__main__":
    torch.save({"step": 10, "best": np.float64(0.5)}, "ckpt.pt")
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
