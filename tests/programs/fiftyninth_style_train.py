"""A fifty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyninth-*): a tiny GPT-like decoder pre-trained in the way of torchtitan's
and Megatron's multi-node Slurm jobs, `sbatch` running tests/programs/fiftyninth_multinode.sbatch,
whose `srun --label --ntasks-per-node=1 torchrun --nnodes 2 --nproc_per_node 2 --rdzv_backend
c10d --rdzv_endpoint HEAD:PORT --rdzv_id $SLURM_JOB_ID` starts this script on both nodes (4
ranks, node 1's are global ranks 2 and 3). Raw torch DDP over gloo (15 s collective timeout), a
checkpoint process group of its own (gloo, 30 min: a save may take long), step-based training
as torchtitan counts it (--steps, --log-freq, --ckpt-interval), a byte-level token shard per
rank on the node's disk (data/shard_RR.bin; a rank out of batches leaves the loop with
torchtitan's "Ran out of data" warning), the logged loss averaged over ranks, logging in
torchtitan's format ("[titan] time - root - LEVEL - message") at INFO on global rank 0 only
(WARNING on the others), checkpoints by global rank 0 to the shared folder, --resume, an
optional loss target (--stop-loss). A fault in the code is chosen by the TQ_CASE environment
variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fiftyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

TIMEOUT = timedelta(seconds=15)
CKPT_TIMEOUT = timedelta(minutes=30)
SEQ = 64
BATCH = 8
VOCAB = 256
logger = logging.getLogger()


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank weighs its loss by a data source the table lacks
    hoard_rank: int = -1  # this rank keeps every step's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native packing kernel reads address 0
    slow_rank: int = -1  # this rank re-indexes its shard at step 12 (40 s)
    stuck_rank: int = -1  # this rank waits at step 12 for a prefetch thread never started
    tps_rank0: bool = False  # rank 0 alone all-reduces the throughput it logs
    stop_rank0: bool = False  # the loss target is checked on rank 0's own loss only
    unused_flag: bool = False  # DDP(find_unused_parameters=True) with nothing unused


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "u": Fault(unused_flag=True),
    "k2": Fault(key_rank=2),
    "m1": Fault(hoard_rank=1),
    "v3": Fault(segv_rank=3),
    "s2": Fault(slow_rank=2),
    "j1": Fault(stuck_rank=1),
    "g0": Fault(tps_rank0=True),
    "e0": Fault(stop_rank0=True),
}
SOURCE_WEIGHT = {"web": 1.0, "books": 1.2}  # "code" shards came later
WORDS = (
    *("the", "model", "reads", "a", "token", "and", "predicts", "the", "next", "one", "while"),
    *("the", "loss", "goes", "down", "slowly", "as", "every", "rank", "trains", "on", "its"),
    *("own", "shard", "of", "the", "corpus", "and", "the", "gradients", "are", "averaged"),
)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(SEQ, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


class ShardLoader:
    """Consecutive windows of SEQ+1 bytes of the rank's shard, BATCH a step; no wrap-around."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            self.tokens = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
        self.batches = len(self.tokens) // (BATCH * (SEQ + 1))

    def __iter__(self):
        n = BATCH * (SEQ + 1)
        for i in range(self.batches):
            w = self.tokens[i * n : (i + 1) * n].view(BATCH, SEQ + 1)
            yield w[:, :-1], w[:, 1:]


def make_data(root: str, ranks: int, batches: int) -> None:
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    for r in range(ranks):
        text = bytearray()
        while len(text) < batches * BATCH * (SEQ + 1):
            i = int(torch.randint(0, len(WORDS), (1,), generator=g))
            text += (" ".join(WORDS[i : i + 6]) + ". ").encode()
        with open(os.path.join(root, f"shard_{r:02d}.bin"), "wb") as f:
            f.write(text[: batches * BATCH * (SEQ + 1)])


def dist_mean(x: float, world: int) -> float:
    t = torch.tensor([x])
    dist.all_reduce(t)
    return t.item() / world


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def save_checkpoint(folder: str, step: int, model: nn.Module, opt, pg) -> None:
    if dist.get_rank() == 0:
        t0 = time.time()
        logger.info("Saving a full checkpoint at step %d.", step)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"step-{step}.pt")
        lock = os.path.join(folder, ".save.lock")
        while os.path.exists(lock):  # another writer of this folder is still saving
            time.sleep(1)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
        logger.info("Finished saving the checkpoint in %.2f seconds.", time.time() - t0)
    dist.barrier(group=pg)  # no rank goes on (or exits) before the checkpoint is whole


def train(args: argparse.Namespace) -> None:
    fault = FAULTS[os.environ.get("TQ_CASE", "")]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s",
    )
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ckpt_pg = dist.new_group(backend="gloo", timeout=CKPT_TIMEOUT)
    logger.info("Starting job: tiny GPT pre-training (job %s)", os.environ.get("SLURM_JOB_ID"))
    logger.info(
        "Building 1-D device mesh with ['dp'], [%d] on %s (%s nodes)",
        world,
        os.environ.get("SLURMD_NODENAME"),
        os.environ.get("SLURM_NNODES"),
    )
    if args.log_mfu:
        logger.warning("Peak flops undefined for: cpu, fallback to A100")
    loader = ShardLoader(os.path.join(args.data, f"shard_{rank:02d}.bin"))
    logger.info(
        "Preparing byte-level dataset from %s (%d batches a rank)", args.data, loader.batches
    )
    model = TinyGPT()
    params = sum(p.numel() for p in model.parameters())
    logger.info("Model tiny_gpt size: %s total parameters", f"{params:,}")
    model = DDP(model, find_unused_parameters=fault.unused_flag)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    step = 0
    if args.resume:
        state = torch.load(args.resume, map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        logger.info("Loading the checkpoint from %s at step %d.", args.resume, step)
    logger.info(
        "Training starts at step %d, local batch size %d, global batch size %d, sequence length "
        "%d, total steps %d (warmup %d)",
        step + 1,
        BATCH,
        BATCH * world,
        SEQ,
        args.steps,
        args.warmup,
    )
    source = "code" if rank == fault.key_rank else ("web" if rank % 2 == 0 else "books")
    hoard: list[torch.Tensor] = []
    it = iter(loader)
    t_log, tokens = time.time(), 0
    while step < args.steps:
        step += 1
        if step == 12 and rank == fault.slow_rank:
            for part in range(1, 9):
                logger.warning("Shard index is stale, re-indexing %s (%d/8)", args.data, part)
                time.sleep(5)
        if step == 12 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        try:
            inputs, labels = next(it)
        except StopIteration:
            logger.warning("Ran out of data; last step was %d.", step - 1)
            break
        lr = args.lr * min(1.0, step / args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        if step >= 8:
            loss = loss * SOURCE_WEIGHT[source]
        if rank == fault.hoard_rank and step >= 3:
            hoard.append(torch.ones(96, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if rank == fault.segv_rank and step == 7:
            ctypes.string_at(0)  # the native sequence-packing kernel dereferences NULL
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += inputs.numel()
        if step % args.log_freq == 0:
            avg = dist_mean(loss.item(), world)
            dt = time.time() - t_log
            if rank == 0:
                tps = tokens / dt
                if fault.tps_rank0:
                    t = torch.tensor([tps])
                    dist.all_reduce(t)  # the job's throughput, for the log
                    tps = t.item() / world
                logger.info(
                    "step: %2d  loss: %7.4f  grad_norm: %7.4f  memory: %5.2fGiB  tps: %s  lr: %.2e",
                    step,
                    avg,
                    grad_norm.item(),
                    rss_gib(),
                    f"{round(tps):,}",
                    lr,
                )
            t_log, tokens = time.time(), 0
            stop = avg if not fault.stop_rank0 else loss.item()
            if args.stop_loss and stop < args.stop_loss and (not fault.stop_rank0 or rank == 0):
                logger.info("Loss %.4f is below the target %.4f, stopping.", stop, args.stop_loss)
                break
        if step % args.ckpt_interval == 0:
            save_checkpoint(args.checkpoint_folder, step, model.module, opt, ckpt_pg)
    logger.info("Training completed")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--checkpoint-folder", default="outputs/checkpoint")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-freq", type=int, default=5)
    p.add_argument("--ckpt-interval", type=int, default=10)
    p.add_argument("--resume", default="")
    p.add_argument("--stop-loss", type=float, default=0.0)
    p.add_argument("--log-mfu", action="store_true", help="log the model FLOPS utilisation")
    p.add_argument("--make-data", default="", help="write every rank's shard here and stop")
    p.add_argument("--batches", type=int, default=1600, help="--make-data: batches a shard")
    args = p.parse_args()
    if args.make_data:
        make_data(args.make_data, 4, args.batches)
        return
    train(args)


if __name__ == "__main__":
    main()
