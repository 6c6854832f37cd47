"""A healthy 2-rank DDP training on gloo, for "a healthy run is ok" fixtures. It prints what
real runs print: per-step losses, a tqdm-like progress line, DDP's own INFO/warning output
(TORCH_DISTRIBUTED_DEBUG=INFO, find_unused_parameters=True with every parameter used), and a
checkpoint saved and loaded back. MODE (argv[1]): plain | noisy."""

import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=(mode == "noisy"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = 20
    for step in range(steps):
        x = torch.randn(32, 8)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            pct = int(100 * (step + 1) / steps)
            print(
                f"rank {rank} step {step + 1}/{steps} loss {loss.item():.4f} ({pct}%)", flush=True
            )
    if rank == 0:
        path = os.path.join(tempfile.gettempdir(), f"healthy-ckpt-{os.getpid()}.pt")
        torch.save(ddp.module.state_dict(), path)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        os.remove(path)
        print("saved and reloaded checkpoint; training complete", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
