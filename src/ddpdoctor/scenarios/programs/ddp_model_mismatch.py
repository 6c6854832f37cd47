"""Injects ddp-model-mismatch: rank 1 builds its model from a different config (wider hidden
layer). DDP compares parameter shapes across ranks when it is constructed and raises on every
rank ("DDP expects same model across all ranks")."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    hidden = 48 if rank == 1 else 32  # rank 1 read a stale config file
    model = torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )
    print(f"rank {rank} model hidden={hidden}", flush=True)
    ddp = DDP(model)
    ddp(torch.randn(4, 8)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
