"""Injects ddp-unused-parameters: a DDP model whose `aux_head` never takes part in the loss.

DDP waits for a gradient of every parameter; at the next forward the reducer sees that the last
reduction never finished and raises "Expected to have finished reduction in the prior iteration"
on every rank. Run with TORCH_DISTRIBUTED_DEBUG=INFO so the message names the parameter.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)
        self.aux_head = torch.nn.Linear(8, 1)  # built but never used in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.backbone(x)))
        return out


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
