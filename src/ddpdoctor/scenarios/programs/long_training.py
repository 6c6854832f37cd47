"""A healthy training loop that runs for about a minute. The preempted scenario sends SIGTERM to
torchrun while it runs, as Slurm or Kubernetes do on preemption or at the time limit: torchrun
logs "Received 15 death signal, shutting down workers" and stops every rank with SIGTERM."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    for step in range(60):
        model(torch.randn(16, 8)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step}/60", flush=True)
        time.sleep(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
