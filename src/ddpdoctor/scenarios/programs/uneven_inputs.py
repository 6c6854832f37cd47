"""Injects uneven-inputs: rank 1's shard has fewer batches (6 vs 8), so it leaves the DDP loop
early and waits in the end-of-epoch barrier while rank 0 is still in a gradient all_reduce. The
collectives no longer pair up; the ranks fail in timeouts or in a gloo size mismatch."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    batches = 6 if rank == 1 else 8  # no DistributedSampler(drop_last): shards are uneven
    model = DDP(torch.nn.Linear(8, 1))
    for step in range(batches):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        print(f"rank {rank} step {step}/{batches}", flush=True)
    print(f"rank {rank}: epoch done, waiting for the others", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
