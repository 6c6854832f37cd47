"""Injects slow-rank-timeout: rank 0 builds a cache alone (6 s) while rank 1 waits in a barrier
with a 3 s process-group timeout. Nothing is broken except the timeout: rank 1 times out first,
then torchrun stops rank 0 with SIGTERM in the middle of its work."""

import time
from datetime import timedelta

import torch.distributed as dist


def build_cache() -> None:
    for shard in range(6):
        print(f"rank 0: tokenizing shard {shard}/6", flush=True)
        time.sleep(1)  # stands in for real preprocessing


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    if rank == 0:
        build_cache()
    dist.barrier()  # the others wait here for rank 0's cache
    print(f"rank {rank}: cache ready, training", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
