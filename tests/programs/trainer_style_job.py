"""A Trainer-like script (metrics dicts, a banner), one fault per MODE; tests/fixtures/real/trainer-*."""
import ctypes
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


class Net(nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head_a = nn.Linear(8, 2)
        self.head_b = nn.Linear(8, 2)
        if extra:
            self.more = nn.Linear(8, 8)

    def forward(self, x, skip_b: bool = False):
        h = torch.relu(self.body(x))
        if getattr(self, "more", None) is not None:
            h = self.more(h)
        return self.head_a(h) if skip_b else self.head_a(h) + self.head_b(h)


class Blob:
    pass


def main():
    mode = sys.argv[1]
    if mode == "pg-missing":
        dist.barrier()
    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("***** Running training *****", flush=True)
        print(f"  Num processes = {world}", flush=True)
    model = Net(extra=(mode == "model-mismatch" and rank == 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    if mode == "weights-only":
        path = f"/tmp/holdout2-ckpt-{os.getpid()}.pt"
        torch.save({"model": model.state_dict(), "extra": Blob()}, path)
        torch.load(path)
    total = 12
    for step in range(total):
        x = torch.randn(4, 8)
        skip_b = mode == "unused" and step % 2 == 1
        loss = ddp(x, skip_b=skip_b).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 0:
            print(f"{{'loss': {loss.item():.4f}, 'learning_rate': 0.001, 'epoch': {step / total:.2f}}}", flush=True)
        if mode == "exit" and rank == 1 and step == 5:
            print("rank 1: reached max_steps for this shard", flush=True)
            sys.exit(0)
        if mode == "segv" and rank == 2 and step == 4:
            ctypes.string_at(0)
        if mode == "shape" and step == 6:
            t = torch.zeros(10 if rank == 1 else 1000)
            dist.all_reduce(t)
        if mode == "missing-file" and rank == 3 and step == 7:
            open("/datasets/shards/train-00003-of-00004.arrow", "rb")
    # evaluation
    acc = torch.tensor([0.5])
    if mode == "eval-assert" and rank == 1:
        assert acc.item() > 0.9, f"eval accuracy {acc.item()} below threshold"
    if mode == "gather-main" and rank == 0:
        out = [None] * world
        dist.all_gather_object(out, {"acc": acc.item()})
    if mode == "slow-save" and rank == 0:
        print("Saving model checkpoint to ./output/checkpoint-12", flush=True)
        time.sleep(15)
    if mode == "sigterm":
        print(f"rank {rank}: long evaluation", flush=True)
        time.sleep(30)
    dist.all_reduce(acc)
    dist.barrier()
    if rank == 0:
        print(f"{{'train_runtime': 1.23, 'train_loss': {loss.item():.4f}}}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
