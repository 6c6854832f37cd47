"""A sixtieth training-program style for the generalisation fixtures
(tests/fixtures/real/sixtieth-*): 2-D parallel training (tensor parallel + data parallel) of a
tiny Llama-like decoder in the way of PyTorch's own examples/distributed/tensor_parallelism
(fsdp_tp_example.py, log_utils.py, run_example.sh). tests/programs/sixtieth_run_example.sh
starts it with `torchrun --nnodes=1 --nproc_per_node=N --rdzv_id=101
--rdzv_endpoint=localhost:PORT`; the script builds `init_device_mesh("cpu", (dp, tp),
mesh_dim_names=("dp", "tp"))` (TP size 2, as the example asserts), parallelizes the attention
and feed-forward projections with ColwiseParallel / RowwiseParallel (the embedding Rowwise with
Replicate input, the output head Colwise with Replicate output; no sequence parallel) on the
"tp" dimension and shards every block and the whole model with FSDP2's fully_shard on the "dp"
dimension, AdamW(foreach=True). gloo on CPU, a 15 s collective timeout. Both ranks of a TP pair
read the same token shard (data/dp_shard_K.bin for dp rank K) at the same cursor. Only global
rank 0 logs, through the examples' rank_log (sixtieth_log_utils.py: '%(asctime)s %(message)s'
at INFO); every rank prints the example's "Starting PyTorch 2D (FSDP + TP) example on rank R."
DCP checkpoints (torch.distributed.checkpoint) every --save-every iterations into
--checkpoint-dir/step_N, --resume from one; an optional loss target (--stop-loss) on the loss
averaged over the dp dimension. A fault in the code is chosen by the TQ_CASE environment
variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_sixtieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sixtieth_log_utils import get_logger, rank_log

TIMEOUT = timedelta(seconds=15)
VOCAB = 64
SEQ = 16
BATCH = 4


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    local_rank_view: int = -1  # this rank debug-prints the logits' local shard (.to_local())
    drift_rank: int = -1  # this rank's shard cursor slips by one token at iteration 9
    hoard_rank: int = -1  # this rank keeps every iteration's activations, then the OOM killer
    segv_rank: int = -1  # this rank's native fused-kernel probe reads address 0
    slow_rank: int = -1  # this rank rebuilds its shard cache at iteration 12 (40 s)
    stuck_rank: int = -1  # this rank waits at iteration 12 for a prefetch thread never started
    norm_rank0: bool = False  # rank 0 alone all-reduces the grad norm it logs over "tp"
    local_stop: bool = False  # the loss target is checked on the rank's own (dp-local) loss


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "a3": Fault(local_rank_view=3),
    "d3": Fault(drift_rank=3),
    "h1": Fault(hoard_rank=1),
    "v2": Fault(segv_rank=2),
    "s3": Fault(slow_rank=3),
    "w1": Fault(stuck_rank=1),
    "n0": Fault(norm_rank0=True),
    "l": Fault(local_stop=True),
}


@dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = VOCAB
    multiple_of: int = 16
    norm_eps: float = 1e-5


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        # -1: the heads this TP rank holds (n_heads // tp after ColwiseParallel)
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 2 * args.dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    @classmethod
    def from_model_args(cls, args: ModelArgs) -> Transformer:
        return cls(args)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def make_data(folder: str, shards: int = 2, batches: int = 400) -> None:
    """A byte-level token shard per dp rank: batches of BATCH sequences of SEQ + 1 tokens."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        g = torch.Generator().manual_seed(100 + k)
        # a learnable pattern: each sequence counts up from a random start (mod VOCAB)
        start = torch.randint(VOCAB, (batches * BATCH, 1), generator=g)
        seqs = (start + torch.arange(SEQ + 1)) % VOCAB
        noise = torch.rand(seqs.shape, generator=g) < 0.1
        seqs = torch.where(noise, torch.randint(VOCAB, seqs.shape, generator=g), seqs)
        Path(folder, f"dp_shard_{k}.bin").write_bytes(seqs.to(torch.uint8).numpy().tobytes())


def batches(path: str, drift_at: int = -1):
    """(input, target) batches of a shard, in order; `drift_at`: the cursor slips a token."""
    data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    per = BATCH * (SEQ + 1)
    for i in range(len(data) // per):
        rows = data[i * per : (i + 1) * per].view(BATCH, SEQ + 1)
        if i >= drift_at >= 0:
            rows = rows[:, 1:]
        yield rows[:, :-1], rows[:, 1:]


def gloo_options() -> dist.ProcessGroupGloo._Options:
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = TIMEOUT
    return opts


def native_probe() -> None:
    """The fused kernel's capability probe (a null pointer where the kernel is missing)."""
    ctypes.string_at(0)


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch 2D (FSDP + TP) example")
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--resume", default="")
    parser.add_argument("--stop-loss", type=float, default=0.0)
    parser.add_argument("--make-data", default="")
    args = parser.parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    fault = FAULTS[os.environ.get("TQ_CASE", "")]

    tp_size = args.tp_size
    logger = get_logger()

    # understand world topology
    _rank = int(os.environ["RANK"])
    _world_size = int(os.environ["WORLD_SIZE"])

    print(f"Starting PyTorch 2D (FSDP + TP) example on rank {_rank}.")
    assert _world_size % tp_size == 0, (
        f"World size {_world_size} needs to be divisible by TP size {tp_size}"
    )

    # create a sharding plan based on the given world_size.
    dp_size = _world_size // tp_size

    dist.init_process_group("gloo", timeout=TIMEOUT)
    # Create a device mesh with 2 dimensions.
    # First dim is the data parallel dimension
    # Second dim is the tensor parallel dimension.
    # (the mesh's dp and tp groups do not inherit the default group's timeout: 30 min on gloo)
    device_mesh = init_device_mesh(
        "cpu",
        (dp_size, tp_size),
        mesh_dim_names=("dp", "tp"),
        backend_override={"dp": ("gloo", gloo_options()), "tp": ("gloo", gloo_options())},
    )

    rank_log(_rank, logger, f"Device Mesh created: {device_mesh=}")
    tp_mesh = device_mesh["tp"]
    dp_mesh = device_mesh["dp"]

    # For TP, input needs to be same across all TP ranks.
    # while for SP, input can be different across all ranks.
    # We will use dp_rank for setting the random seed
    # to mimic the behavior of the dataloader.
    dp_rank = dp_mesh.get_local_rank()

    # create model (on the CPU: the mesh is a "cpu" one)
    torch.manual_seed(0)
    simple_llama2_config = ModelArgs()
    model = Transformer.from_model_args(simple_llama2_config)

    # parallelize the first embedding and the last linear out projection
    model = parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        },
    )

    for transformer_block in model.layers:
        layer_tp_plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
        }
        # Custom parallelization plan for the model
        parallelize_module(
            module=transformer_block, device_mesh=tp_mesh, parallelize_plan=layer_tp_plan
        )
        fully_shard(transformer_block, mesh=dp_mesh)

    # Init FSDP using the dp device mesh
    sharded_model = fully_shard(model, mesh=dp_mesh)

    rank_log(_rank, logger, f"Model after parallelization {sharded_model=}\n")

    # Create an optimizer for the parallelized and sharded model.
    lr = args.lr
    optimizer = torch.optim.AdamW(sharded_model.parameters(), lr=lr, foreach=True)

    start = 0
    if args.resume:
        rank_log(_rank, logger, f"Resuming from checkpoint {args.resume}")
        model_sd, optim_sd = get_state_dict(sharded_model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "iter": torch.tensor(0)}
        dcp.load(state, checkpoint_id=args.resume)
        set_state_dict(
            sharded_model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )
        start = int(state["iter"])
        rank_log(_rank, logger, f"Resumed at iter {start}")

    # Training loop:
    # Perform a num of iterations of forward/backward
    # and optimizations for the sharded module.
    rank_log(_rank, logger, "Starting 2D training...")
    num_iterations = args.iters
    data = batches(
        os.path.join(args.data_dir, f"dp_shard_{dp_rank}.bin"),
        drift_at=9 - start if _rank == fault.drift_rank else -1,
    )
    for _ in range(start):
        next(data, None)
    hoard = []
    prefetched = threading.Event()

    for i, (inp, tgt) in zip(range(start, num_iterations), data, strict=False):
        if _rank == fault.segv_rank and i == 7:
            native_probe()
        if _rank == fault.slow_rank and i == 12:
            for k in range(1, 9):
                print(f"rank {_rank}: rebuilding dp shard {dp_rank} cache ({k}/8)", flush=True)
                time.sleep(5)
        if _rank == fault.stuck_rank and i == 12:
            prefetched.wait()
        output = sharded_model(inp)
        loss = F.cross_entropy(output.flatten(0, 1), tgt.flatten())
        if _rank == fault.local_rank_view and i == 7:
            print(f"rank {_rank} local logits {tuple(output.to_local().shape)}")
        if _rank == fault.hoard_rank and i >= 4:
            hoard.append(torch.ones(16 * 2**20))  # 64 MiB an iteration, kept
            if i == 9:
                os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        if fault.norm_rank0 and _rank == 0 and i == 10:
            grads = [p.grad.to_local() for p in sharded_model.parameters() if p.grad is not None]
            norm_sq = sum(g.pow(2).sum() for g in grads)
            dist.all_reduce(norm_sq, group=tp_mesh.get_group())
            rank_log(_rank, logger, f"2D iter {i} grad norm {norm_sq.sqrt().item():.4f}")
        optimizer.step()
        optimizer.zero_grad()
        # the loss, averaged over the data-parallel dimension (the same on both TP ranks)
        avg = loss.detach().clone()
        dist.all_reduce(avg, group=dp_mesh.get_group())
        avg /= dp_size
        rank_log(_rank, logger, f"2D iter {i} complete, loss {avg.item():.4f}")
        if args.stop_loss:
            watched = loss.item() if fault.local_stop else avg.item()
            if watched < args.stop_loss:
                rank_log(_rank, logger, f"Loss below {args.stop_loss}, stopping at iter {i}")
                break
        if args.save_every and (i + 1) % args.save_every == 0:
            ckpt = os.path.join(args.checkpoint_dir, f"step_{i + 1}")
            model_sd, optim_sd = get_state_dict(sharded_model, optimizer)
            dcp.save(
                {"model": model_sd, "optim": optim_sd, "iter": torch.tensor(i + 1)},
                checkpoint_id=ckpt,
            )
            rank_log(_rank, logger, f"Saved checkpoint to {ckpt}")

    rank_log(_rank, logger, "2D training successfully completed!")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
