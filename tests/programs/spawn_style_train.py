"""A fourth DDP job style for the generalisation fixtures (tests/fixtures/real/spawn-*): started
without torchrun, by torch.multiprocessing.spawn (--launch spawn, tcp:// rendezvous) or under the
legacy `python -m torch.distributed.launch --use_env` (--launch env, env:// rendezvous); Python
logging per process ("%(asctime)s %(levelname)s [proc %(process)d] %(message)s", the rank only in
the text as "gpu N | ..."), tqdm bars from rank 0 only, a 20 s collective timeout; one real fault
per --mode. Captured by tests/fixtures/real/capture_spawn.sh: re-capture after any edit."""

import argparse
import ctypes
import logging
import math
import os
import signal
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

BATCH = 8
FORMAT = "%(asctime)s %(levelname)s [proc %(process)d] %(message)s"
log = logging.getLogger("train")


def setup_logging() -> None:
    """Each process configures its own logging, as research repos do in their worker."""
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stdout, force=True)


class Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.inp = nn.Linear(16, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor, skip_mid: bool = False) -> torch.Tensor:
        h = F.relu(self.inp(x))
        if not skip_mid:  # a sample without the auxiliary features skips the middle block
            h = F.relu(self.mid(h))
        return self.out(h)


def worker(rank: int, world: int, args: argparse.Namespace) -> None:
    setup_logging()
    fault = args.mode
    t0 = time.monotonic()
    init = f"tcp://127.0.0.1:{args.port}" if args.launch == "spawn" else "env://"
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=20)
    )
    log.info("gpu %d | process group ready (gloo, %d processes, %s)", rank, world, init)
    if fault == "missing-file":
        path = os.path.join(args.shards, f"shard-{rank:02d}.bin")
        with open(path, "rb") as f:
            log.info("gpu %d | shard %s holds %d bytes", rank, path, len(f.read()))
    if fault == "healthy":
        ckpt = "checkpoints/last.pt"
        if not os.path.exists(ckpt):
            log.warning("gpu %d | no checkpoint at %s, training from scratch", rank, ckpt)
        warnings.warn("label_smoothing=0.1 has no effect with 2 classes", stacklevel=1)

    torch.manual_seed(0)
    hidden = 48 if fault == "model-mismatch" and rank == 1 else 32
    find_unused = fault == "healthy"
    model = Net(hidden)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    n = 7 if fault == "uneven" and rank == 1 else 10
    g = torch.Generator().manual_seed(1000 + rank)
    xs = torch.randn(n * BATCH, 16, generator=g)
    ys = (xs.sum(1) > 0).long()
    log.info("gpu %d | %d samples, %d batches of %d per epoch", rank, len(xs), n, BATCH)

    kill_at = (1, 5) if fault == "sigkill" and rank == 1 else None
    segv_at = (1, 2) if fault == "segv" and rank == 1 else None
    stop_at = (1, 3) if fault == "leave" and rank == 1 else None
    skip_every = 3 if fault == "unused" and rank == 1 else 0
    step = 0
    best = math.inf
    stopped = False
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xs), generator=g)
        if fault == "index-error" and rank == 1 and epoch == 1:
            perm[4 * BATCH + 2] = len(xs)  # an off-by-one in this rank's shuffled order
        total = 0.0
        bar = tqdm(range(n), desc=f"epoch {epoch}", disable=rank != 0)
        for it in bar:
            idx = perm[it * BATCH : (it + 1) * BATCH]
            xb, yb = xs[idx], ys[idx]
            skip = skip_every > 0 and it % skip_every == 2
            out = ddp(xb, skip_mid=skip)
            loss = F.cross_entropy(out, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step % 4 == 0:
                log.info("gpu %d | epoch %d step %d loss %.4f", rank, epoch, step, loss.item())
            if kill_at == (epoch, it):
                os.kill(os.getpid(), signal.SIGKILL)
            if segv_at == (epoch, it):
                ctypes.string_at(0)
            if stop_at == (epoch, it):
                log.info("gpu %d | loss %.4f is under the 0.9 target, stopping", rank, loss.item())
                stopped = True
                break
        bar.close()
        if stopped:
            break
        mean = torch.tensor([total / n])
        dist.all_reduce(mean)
        val = mean.item() / world
        if rank == 0:
            log.info("gpu 0 | epoch %d mean train loss %.4f (best %.4f)", epoch, val, best)
        if fault == "rank0-collective" and rank == 0 and epoch == 1:
            log.info("gpu 0 | new best, sending the save flag to the other processes")
            flag = torch.ones(1)
            dist.broadcast(flag, src=0)
        if fault == "slow-rank" and rank == 1 and epoch == 1:
            log.info("gpu 1 | evaluating on the full held-out set")
            time.sleep(40)
        if fault == "early-stop-all":
            vote = torch.tensor([1.0 if epoch == 1 else 0.0])
            dist.all_reduce(vote, op=dist.ReduceOp.MAX)
            if vote.item() > 0:
                log.info(
                    "gpu %d | early stopping after epoch %d: patience 1 used up, "
                    "all %d processes stop together",
                    rank,
                    epoch,
                    world,
                )
                dist.barrier()
                break
        best = min(best, val)
        dist.barrier()
    log.info("gpu %d | training finished: %d steps in %.1fs", rank, step, time.monotonic() - t0)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="healthy")
    parser.add_argument("--launch", choices=["spawn", "env"], default="spawn")
    parser.add_argument("--nprocs", type=int, default=3)
    parser.add_argument("--port", type=int, default=29700)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--shards", default="/tmp/spawn-shards")
    args = parser.parse_args()
    if args.launch == "env":  # the launcher started this process: one rank, from the env
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    setup_logging()
    log.info("spawning %d processes, rendezvous on 127.0.0.1:%d", args.nprocs, args.port)
    mp.spawn(worker, args=(args.nprocs, args), nprocs=args.nprocs, join=True)
    log.info("all %d processes finished", args.nprocs)


if __name__ == "__main__":
    main()
