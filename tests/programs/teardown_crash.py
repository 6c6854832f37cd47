"""Training completes on both ranks and says so; then rank 1 exits at once without
destroy_process_group, while rank 0 still runs a final all_reduce (e.g. to average a metric
for its log): rank 0 loses its peer after training was already done."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    t = torch.ones(2)
    for step in range(3):
        dist.all_reduce(t)
        print(f"rank {rank} step {step}", flush=True)
    print(f"rank {rank}: Training complete", flush=True)
    if rank == 1:
        os._exit(0)
    time.sleep(0.5)
    dist.all_reduce(t)  # final metric average, only on rank 0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
