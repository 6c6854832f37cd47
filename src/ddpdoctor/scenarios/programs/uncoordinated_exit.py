"""Injects uncoordinated-exit: rank 1 decides alone to stop early and leaves the training loop.

Rank 1 breaks out, destroys its process group and exits 0 while rank 0 trains on; rank 0's next
all_reduce loses its peer ("Connection closed by peer"). torchrun names rank 0, the victim, as the
root cause: rank 1 either exited 0 already (<NO_OTHER_FAILURES>) or gets SIGTERM on its way out.
"""

from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    best = float("inf")
    for step in range(8):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        val_loss = 1.0 + step * 0.1 if rank == 1 else 1.0 - step * 0.1  # rank 1 gets worse
        print(f"rank {rank} step {step} val_loss {val_loss:.2f}", flush=True)
        if val_loss > best:  # decided on local metrics only: the other ranks never hear of it
            print(f"rank {rank}: early stopping at step {step}", flush=True)
            break
        best = min(best, val_loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
