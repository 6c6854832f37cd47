"""Injects early-stop: all ranks agree to stop early, then leave with sys.exit("...").

The stop decision is all_reduced, so every rank stops at the same step on purpose. But
sys.exit(<string>) prints the string and exits with status 1, a common idiom that makes torchrun
and the scheduler report a failed job although the training ended as intended.
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

PATIENCE = 2


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    best, bad_epochs = float("inf"), 0
    for epoch in range(20):
        val_loss = torch.tensor([max(0.5, 1.0 - 0.2 * epoch)])  # plateaus from epoch 3
        dist.all_reduce(val_loss)
        val_loss /= dist.get_world_size()
        print(f"rank {rank} epoch {epoch} val_loss {val_loss.item():.3f}", flush=True)
        bad_epochs = bad_epochs + 1 if val_loss.item() >= best else 0
        best = min(best, val_loss.item())
        if bad_epochs >= PATIENCE:
            dist.destroy_process_group()
            sys.exit(f"Early stopping at epoch {epoch}: no improvement for {PATIENCE} epochs")


if __name__ == "__main__":
    main()
