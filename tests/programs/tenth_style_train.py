"""A tenth training-program style for the generalisation fixtures (tests/fixtures/real/tenth-*):
model-parallel research code in the way of Megatron-LM and torchtitan, raw torch on CPU with gloo.
The world is split into data-parallel x tensor-parallel x pipeline-parallel groups built with
`dist.new_group` on every rank (Megatron's order: tp fastest, then dp, then pp), a tiny GPT-like
model is cut into pipeline stages that pass activations and their gradients with
`batch_isend_irecv`, each MLP is a column/row-parallel pair whose partial outputs are all-reduced
in the tp group, gradients are all-reduced in the dp group, losses averaged over the dp group,
Megatron-like log lines (` iteration   10/   30 | consumed samples: ... | lm loss: ... |`) come
from the last rank, each (tp, pp) rank saves and loads its own `mp_rank_XX[_YYY]/
model_optim_rng.pt`, and main is wrapped in torchelastic's `@record` (error files). One real
fault per `--mode`; a fault is named by what it does, never by the mode, and the mode is never
printed (tests/fixtures/real/capture_tenth.sh: re-capture after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import math
import os
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    loud: bool = False  # the usual scary warnings of a fresh environment
    long_doc_rank: int = -1  # this rank's data holds a document longer than --seq-length
    skip_last_grad_send: bool = False  # the last stage's schedule skips one backward send
    loss_group_rank: int = -1  # this rank averages its loss over the tp group, not dp
    group_order_rank: int = -1  # this rank creates its groups tp-first
    eval_forward_bug: bool = False  # the last stage's eval forward passes a stale argument
    kill_rank: int = -1
    abort_rank: int = -1
    slow_index_rank: int = -1  # this rank tokenizes its shard itself (slowly)
    lock_index: bool = False  # rank 0 builds the index cache under a file lock
    empty_sample_rank: int = -1  # this rank's data has a micro-batch of padding only
    log_key_bug: bool = False  # training_log reads a throughput key nobody set


MODES: dict[str, Fault] = {
    "plain": Fault(),
    "noisy-ok": Fault(loud=True),
    "train-done": Fault(),
    "legacy-resume": Fault(),
    "p2p-longer-seq": Fault(long_doc_rank=0),
    "grad-skip": Fault(skip_last_grad_send=True),
    "wrong-group": Fault(loss_group_rank=3),
    "group-order": Fault(group_order_rank=1),
    "tp-skew": Fault(),
    "stage-raise": Fault(eval_forward_bug=True),
    "shard-missing": Fault(),
    "legacy-indivisible": Fault(),
    "oom-kill-mid": Fault(kill_rank=2),
    "libc-abort": Fault(abort_rank=1),
    "slow-index": Fault(slow_index_rank=3),
    "flock-wait": Fault(lock_index=True),
    "nan-loss": Fault(empty_sample_rank=3),
    "error-file": Fault(log_key_bug=True),
    "bare-python": Fault(),
    "one-proc": Fault(),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="tiny Megatron-style GPT trainer", allow_abbrev=False)
    g = p.add_argument_group("distributed")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=2)
    g.add_argument("--distributed-backend", default="gloo")
    g.add_argument("--distributed-timeout-seconds", type=int, default=15)
    g.add_argument("--local-rank", "--local_rank", type=int, default=None)  # legacy launcher
    g = p.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=32)
    g.add_argument("--seq-length", type=int, default=16)
    g.add_argument("--max-position-embeddings", type=int, default=64)
    g.add_argument("--vocab-size", type=int, default=64)
    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=2)
    g.add_argument("--global-batch-size", type=int, default=8)
    g.add_argument("--train-iters", type=int, default=30)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--log-interval", type=int, default=5)
    g.add_argument("--eval-interval", type=int, default=10)
    g.add_argument("--eval-iters", type=int, default=2)
    g.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group("checkpointing and data")
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-interval", type=int, default=0)
    g.add_argument("--data-cache-path", default=None)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    return p.parse_args()


# -----------------------------------------------------------------------------
# parallel state (megatron.core.parallel_state, much smaller)


@dataclass
class Parallel:
    rank: int
    world: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None
    mp_group: dist.ProcessGroup | None

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def global_rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)


def print_rank_0(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def print_rank_last(msg: str) -> None:
    if dist.get_rank() == dist.get_world_size() - 1:
        print(msg, flush=True)


def initialize_model_parallel(tp: int, pp: int, timeout: timedelta, fault: Fault) -> Parallel:
    """Every rank creates every group, in the same order (new_group is collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % (tp * pp) != 0:
        raise RuntimeError(
            f"world_size ({world}) is not divisible by tensor_model_parallel_size ({tp}) "
            f"x pipeline_model_parallel_size ({pp})"
        )
    dp = world // (tp * pp)
    tp_rank, dp_rank, pp_rank = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    state = Parallel(rank, world, tp, pp, dp, tp_rank, pp_rank, dp_rank, None, None, None)
    layouts: list[tuple[str, list[list[int]]]] = [
        (
            "data",
            [[state.global_rank(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
        ),
        (
            "model",
            [
                sorted(state.global_rank(t, d, p) for t in range(tp) for p in range(pp))
                for d in range(dp)
            ],
        ),
        (
            "tensor",
            [[state.global_rank(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
        ),
    ]
    if rank == fault.group_order_rank:
        # the layout table came from a node-local config that lists the tensor groups first
        layouts.reverse()
    for name, groups in layouts:
        for ranks in groups:
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                setattr(
                    state,
                    {"data": "dp_group", "model": "mp_group", "tensor": "tp_group"}[name],
                    group,
                )
    print_rank_0(f"> initialized tensor model parallel with size {tp}")
    print_rank_0(f"> initialized pipeline model parallel with size {pp}")
    print_rank_0(f"> initialized data parallel with size {dp}")
    return state


# -----------------------------------------------------------------------------
# tensor parallel layers (megatron.core.tensor_parallel, column and row parallel linear)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        return grad, None


class ParallelMLP(nn.Module):
    def __init__(self, hidden: int, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.fc1 = nn.Linear(hidden, 4 * hidden // ps.tp)  # column parallel
        self.fc2 = nn.Linear(4 * hidden // ps.tp, hidden, bias=False)  # row parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ps.tp > 1:
            x = _CopyToTP.apply(x, self.ps.tp_group)
        y = self.fc2(F.gelu(self.fc1(x)))
        if self.ps.tp > 1:
            y = _ReduceFromTP.apply(y, self.ps.tp_group)
        return y


class Layer(nn.Module):
    def __init__(self, hidden: int, ps: Parallel) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = ParallelMLP(hidden, ps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Stage(nn.Module):
    """The layers of one pipeline stage; the first embeds, the last computes the loss."""

    def __init__(self, args: argparse.Namespace, ps: Parallel) -> None:
        super().__init__()
        self.pre_process, self.post_process = ps.first_stage, ps.last_stage
        h = args.hidden_size
        if self.pre_process:
            self.word_embeddings = nn.Embedding(args.vocab_size, h)
            self.position_embeddings = nn.Embedding(args.max_position_embeddings, h)
        self.layers = nn.ModuleList(Layer(h, ps) for _ in range(args.num_layers // ps.pp))
        if self.post_process:
            self.final_norm = nn.LayerNorm(h)
            self.output_layer = nn.Linear(h, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        if self.pre_process:
            pos = torch.arange(tokens.size(1))
            hidden = (self.word_embeddings(tokens) + self.position_embeddings(pos)).transpose(
                0, 1
            )  # [s, b, h] as Megatron keeps it
        assert hidden is not None
        for layer in self.layers:
            hidden = layer(hidden)
        if self.post_process:
            return self.output_layer(self.final_norm(hidden))
        return hidden


# -----------------------------------------------------------------------------
# data: a synthetic corpus, one stream per data-parallel rank


PAD = 0


def get_batch(
    args: argparse.Namespace, ps: Parallel, fault: Fault, it: int, mb: int, split: str = "train"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens, labels and loss mask of one micro-batch; both stages of a replica draw the same."""
    gen = torch.Generator().manual_seed(
        args.seed + 1000 * it + 10 * mb + 7 * ps.dp_rank + (1 << 20) * (split != "train")
    )
    seq = args.seq_length
    if ps.rank == fault.long_doc_rank and it == 3 and mb == 1:
        seq = args.seq_length + 9  # a document longer than seq-length; "pad to longest"
    start = torch.randint(1, args.vocab_size, (args.micro_batch_size, 1), generator=gen)
    steps = torch.arange(seq + 1)
    text = (start + 5 * steps) % (args.vocab_size - 1) + 1
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    mask = torch.ones(labels.shape)
    if ps.dp_rank == 1 and fault.empty_sample_rank >= 0 and it == 6 and mb == 0:
        mask.zero_()  # a micro-batch of padding only: nothing to learn from
    return tokens, labels, mask


def build_index_cache(args: argparse.Namespace, ps: Parallel, fault: Fault) -> None:
    """Megatron builds the dataset index on rank 0 while the others wait at a barrier."""
    print_rank_0("> building train, validation, and test datasets ...")
    if ps.rank == fault.slow_index_rank:
        print(f"> rank {ps.rank}: no cached index for its shard, tokenizing it (may take a while)")
        deadline = time.time() + 60
        n = 0
        while time.time() < deadline:
            n += sum(hash(str(i)) & 1 for i in range(20000))
    if fault.lock_index and ps.rank == 0:
        cache = args.data_cache_path or "/tmp"
        lock = os.path.join(cache, "index-cache.lock")
        print(f" > building index cache under {lock}")
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another job on the shared cache holds it
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
            fcntl.flock(f, fcntl.LOCK_UN)
    dist.barrier()
    print_rank_0("> finished creating datasets ...")


# -----------------------------------------------------------------------------
# pipeline communication and schedule (megatron.core.pipeline_parallel, 1 fwd then 1 bwd)


def _communicate(
    send: torch.Tensor | None, send_to: int | None, recv_shape: tuple[int, ...] | None, peer: int
) -> torch.Tensor | None:
    ops = []
    buf = None
    if send is not None and send_to is not None:
        ops.append(dist.P2POp(dist.isend, send.contiguous(), send_to))
    if recv_shape is not None:
        buf = torch.empty(recv_shape, requires_grad=True)
        ops.append(dist.P2POp(dist.irecv, buf, peer))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return buf


def forward_backward(
    args: argparse.Namespace,
    ps: Parallel,
    fault: Fault,
    model: Stage,
    it: int,
    forward_only: bool = False,
) -> list[float]:
    """One iteration's micro-batches through the pipeline; returns the last stage's losses."""
    n_micro = (
        args.eval_iters
        if forward_only
        else args.global_batch_size // (args.micro_batch_size * ps.dp)
    )
    shape = (args.seq_length, args.micro_batch_size, args.hidden_size)
    prev = ps.global_rank(ps.tp_rank, ps.dp_rank, ps.pp_rank - 1) if not ps.first_stage else None
    nxt = ps.global_rank(ps.tp_rank, ps.dp_rank, ps.pp_rank + 1) if not ps.last_stage else None
    losses = []
    for mb in range(n_micro):
        tokens, labels, mask = get_batch(
            args, ps, fault, it, mb, "valid" if forward_only else "train"
        )
        inp = None if ps.first_stage else _communicate(None, None, shape, prev)  # type: ignore[arg-type]
        with torch.set_grad_enabled(not forward_only):
            if forward_only and ps.last_stage and fault.eval_forward_bug:
                out = model(tokens, inp, None)  # type: ignore[call-arg]  # inference_params
            else:
                out = model(tokens, inp)
        if not ps.last_stage:
            _communicate(out.detach(), nxt, None, nxt)  # type: ignore[arg-type]
            if not forward_only:
                grad = _communicate(None, None, tuple(out.shape), nxt)  # type: ignore[arg-type]
                out.backward(grad)
        else:
            per_token = F.cross_entropy(
                out.transpose(0, 1).reshape(-1, args.vocab_size), labels.view(-1), reduction="none"
            )
            loss = (per_token * mask.view(-1)).sum() / mask.sum()
            if not forward_only:
                if torch.isnan(loss):
                    raise RuntimeError(
                        f"Rank {ps.rank}: found NaN in local forward loss calculation. "
                        f"Device: cpu, node: {socket.gethostname()}"
                    )
                (loss / n_micro).backward()
            losses.append(loss.item())
        if not ps.first_stage and not forward_only:
            if fault.skip_last_grad_send and mb == n_micro - 1:
                continue  # (the bug) the cooldown phase was meant to send this one
            assert inp is not None and inp.grad is not None
            _communicate(inp.grad, prev, None, prev)  # type: ignore[arg-type]
    return losses


def average_losses(losses: list[float], ps: Parallel, fault: Fault) -> float:
    """Megatron's average_losses_across_data_parallel_group."""
    t = torch.tensor([sum(losses) / max(len(losses), 1)])
    group = ps.tp_group if ps.rank == fault.loss_group_rank else ps.dp_group
    dist.all_reduce(t, group=group)
    return float(t) / ps.dp


def reduce_grads_and_step(
    model: Stage, opt: torch.optim.Optimizer, ps: Parallel, args: argparse.Namespace
) -> float:
    """Gradients all-reduced in the dp group as one flat buffer, clipped by the model-parallel
    norm, then the optimizer step."""
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.view(-1) for p in params])  # type: ignore[union-attr]
    dist.all_reduce(flat, group=ps.dp_group)
    flat /= ps.dp
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off : off + n].view_as(p))  # type: ignore[union-attr]
        off += n
    norm_sq = torch.tensor([float(flat.pow(2).sum())])
    dist.all_reduce(norm_sq, group=ps.mp_group)
    norm = math.sqrt(float(norm_sq))
    if norm > args.clip_grad:
        for p in params:
            p.grad.mul_(args.clip_grad / (norm + 1e-6))  # type: ignore[union-attr]
    opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


# -----------------------------------------------------------------------------
# checkpoints: one file per (tp, pp) rank, written by dp rank 0


def ckpt_dir(root: str, it: int, ps: Parallel) -> str:
    name = (
        f"mp_rank_{ps.tp_rank:02d}" if ps.pp == 1 else f"mp_rank_{ps.tp_rank:02d}_{ps.pp_rank:03d}"
    )
    return os.path.join(root, f"iter_{it:07d}", name)


def save_checkpoint(
    it: int, model: Stage, opt: torch.optim.Optimizer, ps: Parallel, root: str
) -> None:
    print_rank_0(f"saving checkpoint at iteration {it:7d} to {root} in torch format")
    if ps.dp_rank == 0:
        path = ckpt_dir(root, it, ps)
        os.makedirs(path, exist_ok=True)
        state = {
            "iteration": it,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "rng_state": torch.get_rng_state(),
        }
        torch.save(state, os.path.join(path, "model_optim_rng.pt"))
    dist.barrier()
    if ps.rank == 0:
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(it))
    print_rank_0(f"  successfully saved checkpoint from iteration {it:7d} to {root}")


def load_checkpoint(model: Stage, opt: torch.optim.Optimizer, ps: Parallel, root: str) -> int:
    tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        print_rank_0(
            f"WARNING: could not find the metadata file {tracker}\n"
            "    will not load any checkpoints and will start from random"
        )
        return 0
    with open(tracker) as f:
        it = int(f.read().strip())
    print_rank_0(f" loading checkpoint from {root} at iteration {it}")
    state = torch.load(
        os.path.join(ckpt_dir(root, it, ps), "model_optim_rng.pt"), weights_only=False
    )
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng_state"])
    print(
        f"  successfully loaded checkpoint from {root} [ t {ps.tp_rank + 1}/{ps.tp}, "
        f"p {ps.pp_rank + 1}/{ps.pp} ] at iteration {it}",
        flush=True,
    )
    return it


# -----------------------------------------------------------------------------


def training_log(
    args: argparse.Namespace,
    it: int,
    loss: float,
    norm: float,
    dt: float,
    fault: Fault,
    ps: Parallel,
    throughput: dict[str, float],
) -> None:
    if it % args.log_interval != 0 or ps.rank != ps.world - 1:
        return  # only the last rank (it holds the loss) builds and prints the line
    line = (
        f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {it:8d}/{args.train_iters:8d} |"
        f" consumed samples: {it * args.global_batch_size:12d} |"
        f" elapsed time per iteration (ms): {dt * 1000:.1f} |"
        f" learning rate: {args.lr:.6E} | global batch size: {args.global_batch_size:5d} |"
        f" lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {norm:.3f} |"
        f" number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    if fault.log_key_bug and it >= 10:
        line += f" tokens per sec: {throughput['tokens-per-sec']:.1f} |"
    print(line, flush=True)


@record
def main() -> None:
    args = parse_args()
    fault = MODES[args.mode]
    if fault.loud:
        warnings.warn(
            "Apex is not installed. Falling back to Torch Norm", UserWarning, stacklevel=1
        )
        print(
            "WARNING: Setting args.overlap_p2p_comm and args.align_param_gather to False since "
            "non-interleaved schedule does not support overlapping p2p communication"
        )
    timeout = timedelta(seconds=args.distributed_timeout_seconds)
    print(f"> initializing torch distributed ... (rank {os.environ.get('RANK')})", flush=True)
    dist.init_process_group(backend=args.distributed_backend, timeout=timeout)
    ps = initialize_model_parallel(
        args.tensor_model_parallel_size, args.pipeline_model_parallel_size, timeout, fault
    )
    if ps.rank == 0:
        print("------------------------ arguments ------------------------")
        for k, v in sorted(vars(args).items()):
            if k != "mode":  # the fault selector is the capture's, not a setting
                print(f"  {k} {'.' * (40 - len(k))} {v}")
        print("-------------------- end of arguments ---------------------", flush=True)
    torch.manual_seed(args.seed + 100 * ps.pp_rank + 10 * ps.tp_rank)
    model = Stage(args, ps)
    if ps.dp_rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(
            f" > number of parameters on (tensor, pipeline) model parallel rank "
            f"({ps.tp_rank}, {ps.pp_rank}): {n}",
            flush=True,
        )
    if fault.loud and ps.rank == 0:
        warnings.warn(
            "torch.distributed.new_group: some groups have a single member; consider "
            "use_local_synchronization=True",
            UserWarning,
            stacklevel=1,
        )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = load_checkpoint(model, opt, ps, args.load) if args.load else 0
    build_index_cache(args, ps, fault)
    print_rank_0("training ...")
    throughput: dict[str, float] = {}
    t0 = time.time()
    it = start
    while it < args.train_iters:
        if ps.rank == fault.kill_rank and it == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        if ps.rank == fault.abort_rank and it == 7:
            ctypes.CDLL(None).abort()  # a fused kernel's native assertion
        losses = forward_backward(args, ps, fault, model, it)
        norm = reduce_grads_and_step(model, opt, ps, args)
        loss = average_losses(losses, ps, fault) if ps.last_stage else 0.0
        it += 1
        t1 = time.time()
        training_log(args, it, loss, norm, t1 - t0, fault, ps, throughput)
        t0 = t1
        if args.eval_interval and it % args.eval_interval == 0:
            vloss = forward_backward(args, ps, fault, model, it, forward_only=True)
            if ps.last_stage:
                v = average_losses(vloss, ps, fault)
                msg = (
                    f" validation loss at iteration {it} | lm loss value: {v:.6E} |"
                    f" lm loss PPL: {math.exp(min(v, 20)):.6E} |"
                )
                print_rank_last("-" * (len(msg) + 1) + "\n" + msg + "\n" + "-" * (len(msg) + 1))
        if args.save and args.save_interval and it % args.save_interval == 0:
            save_checkpoint(it, model, opt, ps, args.save)
    if args.save and it > start and not (args.save_interval and it % args.save_interval == 0):
        save_checkpoint(it, model, opt, ps, args.save)
    dist.barrier()
    print_rank_0(f"[after training is done] datetime: {datetime.now():%Y-%m-%d %H:%M:%S}")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
