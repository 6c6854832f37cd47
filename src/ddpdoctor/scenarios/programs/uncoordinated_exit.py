"""Injects uncoordinated-exit: rank 1 decides alone to stop early and leaves the training loop.

argv[1] picks how rank 1 leaves: `break` (destroy the process group, then exit 0: torchrun sees
rank 1 succeed and names rank 0, the victim, as the root cause) or `exit` (sys.exit(0) without
destroying the process group: gloo's threads abort the process with SIGABRT on the way out).
Either way rank 0's next all_reduce loses its peer ("Connection closed by peer").
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "break"
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
            if mode == "exit":
                sys.exit(0)
            break
        best = min(best, val_loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
