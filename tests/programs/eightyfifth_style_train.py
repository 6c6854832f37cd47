"""An eighty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/eightyfifth-*): long-context language-model training with context
parallelism (ring attention) written by hand over point-to-point communication, in the way of
zhuzilin/ring-flash-attention and Megatron's context parallel. Every rank holds a contiguous
slice of every sequence (`x.chunk(world_size, dim=1)[rank]`); in each attention layer the
key/value block travels around the ring with dist.batch_isend_irecv([P2POp(dist.isend, ...),
P2POp(dist.irecv, ...)]) for world_size - 1 hops, merged with an online softmax (log-sum-exp);
the backward pass sends the key/value block and its gradient accumulators around the ring once
more so that every block's dK/dV comes home. The gradients of the (replicated) parameters are
all-reduced by hand at the end of every step. A tiny decoder (2 layers, learned positions) on
synthetic token sequences (data/tokens.bin of uint16 and data/meta.json, written by
`train.py prepare`, read memory-mapped in the way of Megatron's indexed dataset). Output as such
repos print it: '[rank0] step 20/100 | loss 5.12 | seq 512 (cp=2, 256/rank) | 1.9k tok/s' from
rank 0 (every rank with --log-all-ranks). gloo on CPU, a 15 s process-group timeout. A fault in
the code is chosen by the TQ_CASE environment variable (a letter and the rank it hits) and never
printed (re-capture with tests/fixtures/real/capture_eightyfifth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import queue
import signal
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB = 256


def fault() -> tuple[str, int]:
    """(fault letter, rank) from TQ_CASE ("" where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 1)


WHAT, WHO = fault()


class RingComm:
    """The ring of the context-parallel group: send to rank + 1, receive from rank - 1."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.send_rank = (self.rank + 1) % self.world
        self.recv_rank = (self.rank - 1) % self.world

    def send_recv(self, to_send: torch.Tensor):
        recv = torch.empty_like(to_send)
        if WHAT == "b":  # the ring rewritten with plain blocking calls
            dist.send(to_send, self.send_rank)
            dist.recv(recv, self.recv_rank)
            return recv, []
        ops = [
            dist.P2POp(dist.isend, to_send, self.send_rank),
            dist.P2POp(dist.irecv, recv, self.recv_rank),
        ]
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(reqs) -> None:
        for req in reqs:
            req.wait()


def _scores(q, k, scale, causal):
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm):
        scale = q.shape[-1] ** -0.5
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"))
        kv = torch.stack([k, v])
        for step in range(comm.world):
            if step + 1 < comm.world:
                nxt, reqs = comm.send_recv(kv)
            src = (comm.rank - step) % comm.world
            if src <= comm.rank:  # blocks of later ranks are masked out (causal)
                s = _scores(q, kv[0], scale, causal=src == comm.rank)
                block_lse = torch.logsumexp(s, dim=-1)
                block_out = torch.softmax(s, dim=-1) @ kv[1]
                new_lse = torch.logaddexp(lse, block_lse)
                out = (
                    out * torch.exp(lse - new_lse)[..., None]
                    + block_out * torch.exp(block_lse - new_lse)[..., None]
                )
                lse = new_lse
            if step + 1 < comm.world:
                comm.wait(reqs)
                kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm = comm
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm = ctx.comm
        scale = q.shape[-1] ** -0.5
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        buf = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(comm.world):  # world hops: every dK/dV block comes home
            src = (comm.rank - step) % comm.world
            if src <= comm.rank:
                kk, vv = buf[0], buf[1]
                p = torch.exp(_scores(q, kk, scale, causal=src == comm.rank) - lse[..., None])
                buf[3] += p.transpose(-1, -2) @ dout
                ds = p * (dout @ vv.transpose(-1, -2) - delta)
                dq += ds @ kk * scale
                buf[2] += ds.transpose(-1, -2) @ q * scale
            nxt, reqs = comm.send_recv(buf)
            comm.wait(reqs)
            buf = nxt
        return dq, buf[2].clone(), buf[3].clone(), None


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, comm):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = RingAttnFunc.apply(q.contiguous(), k.contiguous(), v.contiguous(), comm)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class RingLM(nn.Module):
    def __init__(self, d: int, heads: int, layers: int, max_position: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(max_position, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx, positions, comm):
        x = self.tok(idx) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x, comm)
        return self.head(self.ln_f(x))


def prepare(data_dir: str, num_tokens: int) -> None:
    """Synthetic 'text': a noisy walk through a fixed permutation of the vocabulary (a bigram
    table a tiny model can learn), uint16, with Megatron's kind of meta file beside it."""
    rng = np.random.default_rng(0)
    perm = rng.permutation(VOCAB)
    noise = rng.random(num_tokens) < 0.2
    rand = rng.integers(0, VOCAB, num_tokens)
    toks = np.empty(num_tokens, dtype=np.uint16)
    toks[0] = rand[0]
    for i in range(1, num_tokens):
        toks[i] = rand[i] if noise[i] else perm[toks[i - 1]]
    os.makedirs(data_dir, exist_ok=True)
    toks.tofile(os.path.join(data_dir, "tokens.bin"))
    with open(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump({"num_tokens": num_tokens, "dtype": "uint16", "vocab_size": VOCAB}, f)
    print(f"wrote {num_tokens:,} tokens to {data_dir}/tokens.bin")


class TokenData:
    """data/tokens.bin read memory-mapped, its length from data/meta.json (the index)."""

    def __init__(self, data_dir: str, no_copy: bool) -> None:
        with open(os.path.join(data_dir, "meta.json")) as f:
            self.num_tokens = json.load(f)["num_tokens"]
        self.mmap = np.memmap(os.path.join(data_dir, "tokens.bin"), dtype=np.uint16, mode="r")
        self.buffer = memoryview(self.mmap)
        self.no_copy = no_copy

    def read(self, start: int, count: int) -> torch.Tensor:
        count = min(count, self.num_tokens - start)
        arr = np.frombuffer(self.buffer, dtype=np.uint16, count=count, offset=2 * start)
        if self.no_copy:
            return torch.from_numpy(arr)
        return torch.from_numpy(arr.astype(np.int64))


def local_batches(data: TokenData, seq_len: int, bs: int, lo: int, hi: int, rank: int):
    """This rank's slice [lo, hi) of every sequence of one pass over the data, with the next
    token as target; a batch with an incomplete sequence (the file's tail) is dropped."""
    samples = math.ceil((data.num_tokens - 1) / seq_len)
    for b0 in range(0, samples, bs):
        rows = []
        for i in range(b0, min(b0 + bs, samples)):
            rows.append(data.read(i * seq_len + lo, hi - lo + 1))
        if any(len(r) < hi - lo + 1 for r in rows):
            continue  # drop_last: an incomplete batch at the end of the data
        x = torch.stack(rows).long()
        yield x[:, :-1], x[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["prepare", "train"])
    p.add_argument("--data-dir", default="data")
    p.add_argument("--num-tokens", type=int, default=204_801)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--epochs", type=int, default=None, help="passes over the data (no max-steps)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-position", type=int, default=2048)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--log-all-ranks", action="store_true")
    p.add_argument("--target-loss", type=float, default=None)
    p.add_argument("--no-copy-tokens", action="store_true", help="feed the memmap, no copy")
    p.add_argument("--out", default="checkpoints/ring_lm.pt")
    args = p.parse_args()
    if args.command == "prepare":
        prepare(args.data_dir, args.num_tokens)
        return

    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = RingComm()
    torch.manual_seed(0)
    data = TokenData(args.data_dir, args.no_copy_tokens)
    # this rank's contiguous slice of every sequence, as x.chunk(world_size, dim=1)[rank] gives
    sizes = [len(c) for c in torch.arange(args.seq_len).chunk(world)]
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    print(f"[rank{rank}] cp rank {rank}/{world}: tokens {lo}-{hi - 1} of every {args.seq_len}")
    model = RingLM(args.d_model, args.heads, args.layers, args.max_position)
    for prm in model.parameters():  # the same weights on every rank
        dist.broadcast(prm.data, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    n_params = sum(prm.numel() for prm in model.parameters())
    if rank == 0:
        print(
            f"[rank0] model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
            f"{n_params / 1e6:.2f}M params | data: {data.num_tokens:,} tokens in "
            f"{args.data_dir}/tokens.bin"
        )
    positions = torch.arange(lo, hi)
    max_steps = args.max_steps if args.epochs is None else 10**9
    epochs = args.epochs or 10**9
    step, t0, tokens_seen, hoard = 0, time.time(), 0, []
    loss_val, stop = float("nan"), False
    for epoch in range(epochs):
        for x, y in local_batches(data, args.seq_len, args.batch_size, lo, hi, rank):
            step += 1
            if WHAT == "s" and rank == WHO and step == 30:
                for k in range(1, 9):
                    print(f"[rank{rank}] rebuilding sample index for data/tokens.bin ({k}/8)")
                    time.sleep(4)
            if WHAT == "h" and rank == WHO and step == 30:
                queue.Queue().get()  # the prefetch thread that fills it was never started
            logits = model(x, positions, comm)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad(set_to_none=False)
            loss.backward()
            if WHAT == "m" and rank == WHO and step >= 20:
                hoard.append(torch.ones(64 << 20, dtype=torch.uint8))  # kv blocks kept for a dump
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # the host's OOM killer
            if WHAT == "z" and rank == WHO and step == 20:
                ctypes.memmove(ctypes.c_void_p(0), ctypes.c_char_p(b"lse"), 3)  # fused kernel
            log_now = step % args.log_every == 0
            loss_t = loss.detach().clone()
            if WHAT == "l" and log_now and rank == 0:
                dist.all_reduce(loss_t)  # the logged loss averaged over the ring
                loss_t /= world
            flat = torch.cat([prm.grad.reshape(-1) for prm in model.parameters()])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for prm in model.parameters():
                prm.grad.copy_(flat[off : off + prm.numel()].view_as(prm))
                off += prm.numel()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tokens_seen += x.numel() * world
            if args.target_loss is not None:
                dist.all_reduce(loss_t)
                loss_t /= world
            loss_val = loss_t.item()
            if log_now and (rank == 0 or args.log_all_ranks):
                rate = tokens_seen / (time.time() - t0)
                print(
                    f"[rank{rank}] step {step}/{args.max_steps if args.epochs is None else '-'} "
                    f"| loss {loss_val:.2f} | seq {args.seq_len} (cp={world}, {hi - lo}/rank) "
                    f"| {rate / 1000:.1f}k tok/s"
                )
            if args.target_loss is not None and loss_val < args.target_loss:
                if rank == 0:
                    print(
                        f"[rank0] target loss {args.target_loss:.2f} reached at step {step} "
                        f"(loss {loss_val:.2f}), stopping"
                    )
                stop = True
            if stop or step >= max_steps:
                break
        if args.epochs is not None:
            print(f"[rank{rank}] epoch {epoch} done: {step} steps")
        if stop or step >= max_steps:
            break
    if rank == 0:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        torch.save(model.state_dict(), args.out)
        print(
            f"[rank0] done: {step} steps in {time.time() - t0:.1f}s, final loss {loss_val:.2f}, "
            f"saved {args.out}"
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
