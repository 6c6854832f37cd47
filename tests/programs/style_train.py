"""A DDP job in a common repo style (logging module, DistributedSampler, eval each epoch), one
fault per MODE. Captured by tests/fixtures/real/capture_style.sh: keep its line numbers."""
import argparse
import ctypes
import logging
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger("trainer")


class Toy(Dataset):
    def __init__(self, n, mode, rank):
        self.n, self.mode, self.rank = n, mode, rank

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.mode == "worker-oom" and self.rank == 1 and i > 20:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "bad-file" and self.rank == 2 and i > 30:
            open(f"/data/shards/part-{i:05d}.npy", "rb")
        x = torch.randn(16)
        return x, (x.sum() > 0).long()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ok")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    dist.init_process_group("gloo", timeout=timedelta(seconds=4))
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = args.mode
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    n = 96 if not (mode == "uneven" and rank == 1) else 64
    ds = Toy(n, mode, rank)
    if mode == "uneven":
        loader = DataLoader(ds, batch_size=8)
    else:
        loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds), num_workers=2 if mode in ("worker-oom", "bad-file") else 0)
    best = 1e9
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            if mode == "skip-backward" and rank == 1 and epoch == 1 and step == 2:
                log.warning(f"[rank {rank}] skipping batch {step}: loss is nan")
                continue
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.info(f"[rank {rank}] epoch {epoch} step {step + 1}/{len(loader)} loss {loss.item():.4f}")
            if mode == "leave" and rank == 1 and epoch == 1 and step == 1:
                log.info(f"[rank {rank}] target reached, leaving the loop")
                return
            if mode == "sigkill" and rank == 2 and epoch == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "segv" and rank == 0 and epoch == 1 and step == 2:
                ctypes.string_at(0)
            if mode == "keyerror" and rank == 1 and epoch == 1 and step == 3:
                stats = {"loss": loss.item()}
                log.info("acc %s", stats["accuracy"])
        # evaluation
        val = torch.tensor([loss.item()])
        if mode == "metric-main" and rank == 0:
            dist.all_reduce(val)  # only the main process syncs its metric
        elif mode != "metric-main":
            dist.all_reduce(val)
        val /= world
        if mode == "slow-eval" and rank == 0 and epoch == 1:
            log.info("running evaluation on the full validation set")
            time.sleep(12)
        if rank == 0:
            log.info(f"epoch {epoch} val_loss {val.item():.4f}")
        stop = val.item() >= best - 1e-3 and epoch >= 1
        best = min(best, val.item())
        if mode == "early-stop-main" and rank == 0 and epoch == 1:
            log.info("Early stopping: val_loss did not improve")
            break
        if mode == "early-stop-all" and epoch == 1:
            log.info(f"[rank {rank}] Early stopping at epoch {epoch}")
            break
        dist.barrier()
    if mode == "barrier-main" and rank == 0:
        log.info("saving final checkpoint")
        dist.barrier()  # wait_for_everyone() inside `if is_main_process`
    log.info(f"[rank {rank}] training finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
