"""Injects dataloader-worker-killed: rank 1's DataLoader worker dies from SIGBUS.

A worker that touches shared memory beyond a too-small /dev/shm gets SIGBUS; here the worker
sends it to itself at sample 5. The main process of rank 1 raises "DataLoader worker (pid N) is
killed by signal: Bus error"; rank 0 then loses its peer in all_reduce.
"""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

FAIL_RANK = 1
FAIL_SAMPLE = 5


class Samples(Dataset[torch.Tensor]):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.rank == FAIL_RANK and i == FAIL_SAMPLE:
            os.kill(os.getpid(), signal.SIGBUS)  # what a full /dev/shm does to a worker
        return torch.randn(8)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    loader = DataLoader(Samples(rank), batch_size=2, num_workers=1)
    for step, batch in enumerate(loader):
        loss = model(batch).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
