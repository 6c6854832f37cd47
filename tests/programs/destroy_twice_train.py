"""A DDP run (gloo, CPU) whose clean-up runs twice, as when a framework tears the process group
down at the end of training and the script's own clean-up does it again: three epochs of five
steps, 'rank R epoch E/3 loss L' after each, then destroy_process_group() and a second clean-up
chosen by the argument: `default` destroys the default group again (torch 2.13: 'AssertionError:
Process group cannot be None'), `subgroup` destroys a subgroup made at start-up, which the first
call already destroyed with every other group ('ValueError: Invalid process group specified').
Captured as tests/fixtures/real/teardown-destroyed-twice-{default,subgroup}/console.log with
`torchrun --nproc-per-node 2 destroy_twice_train.py MODE` (torch 2.13.0, CPU), paths rewritten
to /repo."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    side = dist.new_group([0, 1])
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for _step in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch + 1}/3 loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()  # the framework's clean-up at the end of training
    if mode == "default":
        dist.destroy_process_group()  # ... and the script's own
    else:
        dist.destroy_process_group(side)


if __name__ == "__main__":
    main()
