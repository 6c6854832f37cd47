"""Injects ddp-mark-ready-twice: a block run twice under reentrant activation checkpointing in a
DDP model built with find_unused_parameters=True. The reentrant backward fires the autograd hook
of the shared weights twice per iteration: "Expected to mark a variable ready only once"."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.Linear(8, 8)  # shared: applied twice per forward
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = checkpoint(self.block, x, use_reentrant=True)
        out: torch.Tensor = self.head(x)
        return out


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = DDP(Net(), find_unused_parameters=True)
    for step in range(3):
        loss = model(torch.randn(4, 8, requires_grad=True)).pow(2).mean()
        loss.backward()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
