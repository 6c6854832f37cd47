"""A 3-rank DDP training on gloo whose checkpoint housekeeping runs on every rank, as scripts
copied from single-GPU code do. MODE (argv[1]):
  rotate: after each epoch rank 0 saves ckpt-<epoch>/ and every rank then deletes the previous
          epoch's folder ("keep only the last checkpoint"); the ranks that come after the
          first find it gone (FileNotFoundError in shutil.rmtree).
  mkdir:  every rank creates the run's output folder with os.makedirs(path) before training;
          the ranks after the first find it there (FileExistsError).
  guarded: the rotation on rank 0 only, behind a barrier: healthy.
The output folder is argv[2]."""

import os
import shutil
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    torch.manual_seed(0)
    if mode == "mkdir":
        time.sleep(0.3 * rank)  # ranks reach this line at their own pace
        os.makedirs(os.path.join(out, "run-0001"))
        print(f"rank {rank}: output folder ready", flush=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for epoch in range(3):
        for _step in range(5):
            x = torch.randn(16, 8)
            loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            folder = os.path.join(out, f"ckpt-{epoch}")
            os.makedirs(folder, exist_ok=True)
            torch.save(ddp.module.state_dict(), os.path.join(folder, "model.pt"))
        dist.barrier()
        previous = os.path.join(out, f"ckpt-{epoch - 1}")
        housekeeping = mode == "rotate" or (mode == "guarded" and rank == 0)
        if epoch > 0 and housekeeping and os.path.isdir(previous):
            time.sleep(0.3 * rank)  # ranks reach this line at their own pace
            shutil.rmtree(previous)
            print(f"rank {rank}: removed {previous}", flush=True)
        if mode == "guarded":
            dist.barrier()
    print(f"rank {rank}: training complete", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
