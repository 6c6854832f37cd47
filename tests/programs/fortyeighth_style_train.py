"""A forty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/fortyeighth-*): pipeline-parallel pretraining written by hand in raw torch,
in the way of Megatron-LM's `forward_backward_pipelining_without_interleaving` and torchtitan's
GPipe / 1F1B schedules. A tiny GPT-like stack (MLP blocks) is split into one stage per rank;
each step's global batch is cut into micro-batches whose activations go forward and whose
gradients come back with `dist.batch_isend_irecv` (Megatron's p2p_communication: recv_forward,
send_forward, send_forward_recv_backward, send_backward_recv_forward, ...). The first stage
embeds the tokens, the last stage projects through the tied embedding and computes the masked
loss; the tied embedding's gradient is all-reduced between the first and last stages (the
"embedding group"), and the loss is broadcast from the last stage for logging and for the
stopping rule. The last stage alone logs "[stage 3/4] step 40 | loss 2.3411 | mb 8 | 1450 tok/s"
every --log-interval steps; every stage logs its warnings and errors through logging with
"%(asctime)s [%(levelname)s] %(message)s" and "[stage k/n]" in the message, to the console and to
logs/stage<k>.log. Launched by tests/programs/fortyeighth_pretrain.sh (torchrun, gloo, 15 s
timeout). The data is a synthetic token file made by --make-data. A fault is chosen by the
P48_KNOB environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fortyeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

TIMEOUT = datetime.timedelta(seconds=15)
VOCAB = 64


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this stage looks up its lr phase under a name the table lacks
    hoard_rank: int = -1  # this stage keeps every micro-batch's activations until OOM-killed
    segv_rank: int = -1  # this stage's fused bias-gelu kernel reads address 0
    short_buffer_rank: int = -1  # this stage sizes its activation buffer with seq_len - 1
    extra_mb_rank: int = -1  # this stage runs two more micro-batches than the others
    no_warmup_rank: int = -1  # this stage's 1F1B warmup count is computed as 0
    slow_rank: int = -1  # this stage rebuilds its sample index for 40 s before step 14
    stuck_rank: int = -1  # this stage waits for an async checkpoint writer never started
    norm_rank0: bool = False  # stage 0 alone all-reduces its grad norm for the log line
    stop_first_only: bool = False  # the --target-loss check sits in stage 0's code only


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(key_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "b2": Fault(short_buffer_rank=2),
    "m2": Fault(extra_mb_rank=2),
    "w1": Fault(no_warmup_rank=1),
    "p0": Fault(slow_rank=0),
    "q1": Fault(stuck_rank=1),
    "n0": Fault(norm_rank0=True),
    "x0": Fault(stop_first_only=True),
}
LR_PHASE = {"warmup": 0.5, "stable": 1.0}

log = logging.getLogger("pretrain")


def init_logging(stage: int) -> None:
    fmt = logging.Formatter("%(asctime)s [%(levelname)s] %(message)s")
    log.setLevel(logging.INFO)
    log.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    log.addHandler(console)
    os.makedirs("logs", exist_ok=True)
    to_file = logging.FileHandler(f"logs/stage{stage}.log")
    to_file.setFormatter(fmt)
    log.addHandler(to_file)


# ---- data ----
def make_data(folder: Path, n: int = 640, seq: int = 16, seed: int = 7) -> None:
    """Documents of a few arithmetic token sequences (learnable), with their lengths and a mask."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    tokens = (start + step * torch.arange(seq + 1)) % VOCAB
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    torch.save({"tokens": tokens, "lengths": lengths}, folder / "tokens.pt")
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).float()
    torch.save(mask, folder / "loss_mask.pt")


class TokenData:
    """The sample index every stage builds (to know the number of iterations); the first stage
    keeps the inputs, the last the labels and the loss mask."""

    def __init__(self, folder: str, stage: int, last: int, seq: int) -> None:
        blob = torch.load(os.path.join(folder, "tokens.pt"))
        tokens, lengths = blob["tokens"], blob["lengths"]
        rows = torch.arange(len(tokens))
        if stage == 0:  # the input collate drops documents longer than the context
            keep = lengths <= seq
            if not bool(keep.all()):
                log.warning(
                    f"[stage {stage}/{last + 1}] dropped {int((~keep).sum())} documents "
                    f"longer than seq_length {seq}"
                )
            rows = rows[keep]
        self.rows = rows
        self.inputs = tokens[:, :-1]
        self.labels = tokens[:, 1:]
        self.mask = None
        if stage == last:
            self.mask = torch.load(os.path.join(folder, "loss_mask.pt"))

    def iterations(self, global_batch: int, epochs: int) -> int:
        return epochs * (len(self.rows) // global_batch)

    def batch(self, it: int, global_batch: int) -> torch.Tensor:
        per_epoch = len(self.rows) // global_batch
        k = it % per_epoch
        return self.rows[k * global_batch : (k + 1) * global_batch]


# ---- model ----
class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stage(nn.Module):
    """Layers [first, last) of the stack; the embedding on the first and last stages (tied)."""

    def __init__(self, stage: int, stages: int, layers: int, d: int, seq: int) -> None:
        super().__init__()
        per = layers // stages
        self.first_layer, self.last_layer = stage * per, (stage + 1) * per
        torch.manual_seed(1234)  # the same embedding on the first and last stages
        self.embedding = nn.Embedding(VOCAB, d) if stage in (0, stages - 1) else None
        if self.embedding is not None:
            nn.init.normal_(self.embedding.weight, std=0.02)  # Megatron's init_method_std
        self.pos = nn.Parameter(torch.zeros(seq, d)) if stage == 0 else None
        torch.manual_seed(1234 + stage)
        self.blocks = nn.ModuleList(Block(d) for _ in range(per))
        self.final_norm = nn.LayerNorm(d) if stage == stages - 1 else None
        self.is_first, self.is_last = stage == 0, stage == stages - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self.embedding(x) + self.pos
        for b in self.blocks:
            x = b(x)
        if self.is_last:
            x = self.final_norm(x) @ self.embedding.weight.t()
        return x


# ---- p2p communication (as Megatron's p2p_communication) ----
class P2P:
    def __init__(self, rank: int, world: int, shape: tuple[int, ...]) -> None:
        self.rank, self.world, self.shape = rank, world, shape

    def _run(self, ops: list[dist.P2POp]) -> None:
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    def recv_forward(self) -> torch.Tensor | None:
        if self.rank == 0:
            return None
        buf = torch.empty(self.shape)
        self._run([dist.P2POp(dist.irecv, buf, self.rank - 1)])
        return buf.requires_grad_()

    def send_forward(self, out: torch.Tensor) -> None:
        if self.rank < self.world - 1:
            self._run([dist.P2POp(dist.isend, out.detach(), self.rank + 1)])

    def recv_backward(self) -> torch.Tensor | None:
        if self.rank == self.world - 1:
            return None
        buf = torch.empty(self.shape)
        self._run([dist.P2POp(dist.irecv, buf, self.rank + 1)])
        return buf

    def send_backward(self, grad: torch.Tensor | None) -> None:
        if self.rank > 0:
            self._run([dist.P2POp(dist.isend, grad, self.rank - 1)])

    def send_forward_recv_backward(self, out: torch.Tensor) -> torch.Tensor | None:
        if self.rank == self.world - 1:
            return None
        buf = torch.empty(self.shape)
        self._run(
            [
                dist.P2POp(dist.isend, out.detach(), self.rank + 1),
                dist.P2POp(dist.irecv, buf, self.rank + 1),
            ]
        )
        return buf

    def send_backward_recv_forward(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        if self.rank == 0:
            return None
        buf = torch.empty(self.shape)
        self._run(
            [
                dist.P2POp(dist.isend, grad, self.rank - 1),
                dist.P2POp(dist.irecv, buf, self.rank - 1),
            ]
        )
        return buf.requires_grad_()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-path", default="data")
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--num-micro-batches", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    p.add_argument("--log-interval", type=int, default=4)
    p.add_argument("--target-loss", type=float, default=0.0)
    p.add_argument("--save", default="")
    p.add_argument("--save-interval", type=int, default=0)
    p.add_argument("--load", default="")
    p.add_argument("--tensorboard-dir", default="")
    p.add_argument("--make-data", default="", help="write the token data to this folder and stop")
    args = p.parse_args()
    if args.make_data:
        make_data(Path(args.make_data), seq=args.seq_length)
        return

    fault = FAULTS[os.environ.get("P48_KNOB", "")]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    last = world - 1
    tag = f"[stage {rank}/{world}]"
    init_logging(rank)
    embedding_group = dist.new_group(sorted({0, last}))

    mb, seq, d = args.micro_batch_size, args.seq_length, args.hidden_size
    num_mb = args.num_micro_batches + (2 if rank == fault.extra_mb_rank else 0)
    global_batch = mb * num_mb
    model = Stage(rank, world, args.num_layers, d, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = min(world - rank - 1, num_mb) if args.schedule == "1f1b" else num_mb
    if rank == fault.no_warmup_rank:
        warmup = 0
    if args.schedule == "gpipe":
        warmup = num_mb
    shape = (mb, seq - 1 if rank == fault.short_buffer_rank else seq, d)
    comm = P2P(rank, world, shape)
    log.info(
        f"{tag} layers {model.first_layer}-{model.last_layer - 1} | {args.schedule} | "
        f"{num_mb} micro-batches of {mb} | warmup {warmup}"
    )
    writer = None
    if rank == last and args.tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(args.tensorboard_dir)

    data = TokenData(args.data_path, rank, last, seq)
    iters = data.iterations(args.micro_batch_size * args.num_micro_batches, args.epochs)
    start = 0
    if args.load:
        with open(os.path.join(args.load, "latest_checkpointed_iteration.txt")) as f:
            start = int(f.read())
        path = os.path.join(
            args.load, f"iter_{start:07d}", f"mp_rank_00_{rank:03d}", "model_optim_rng.pt"
        )
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        log.info(f"{tag} loaded checkpoint from {args.load} at iteration {start}")

    hoard: list[torch.Tensor] = []
    tokens_seen, t0 = 0, time.time()
    for it in range(start, iters):
        step = it + 1
        if rank == fault.slow_rank and step == 14:
            for part in range(1, 9):
                log.warning(f"{tag} rebuilding the sample index cache: part {part}/8")
                time.sleep(5)
        if rank == fault.stuck_rank and step == 14:
            done = threading.Event()  # set by the async checkpoint writer, never started
            done.wait()
        if rank == fault.key_rank and step == 12:
            phase = "decay" if step > 10 else "warmup"
            for group in opt.param_groups:
                group["lr"] = args.lr * LR_PHASE[phase]

        rows = data.batch(it, global_batch)
        micro = [rows[i * mb : (i + 1) * mb] for i in range(num_mb)]
        losses: list[torch.Tensor] = []
        pending: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        opt.zero_grad()

        def forward_step(
            i: int, x: torch.Tensor | None, micro=micro, step=step, losses=losses
        ) -> torch.Tensor:
            out = model(data.inputs[micro[i]] if rank == 0 else x)
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(16, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 24:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and step == 9 and i == 1:
                ctypes.string_at(0)  # the fused bias-gelu kernel dereferences NULL
            if rank == last:
                m = data.mask[micro[i]]
                ce = F.cross_entropy(
                    out.reshape(-1, VOCAB), data.labels[micro[i]].reshape(-1), reduction="none"
                )
                out = (ce * m.reshape(-1)).sum() / m.sum() / num_mb
                losses.append(out.detach())
            return out

        def backward_step(x: torch.Tensor | None, out: torch.Tensor, grad: torch.Tensor | None):
            torch.autograd.backward(out, grad_tensors=grad)
            return None if x is None else x.grad

        for i in range(warmup):
            x = comm.recv_forward()
            out = forward_step(i, x)
            comm.send_forward(out)
            pending.append((x, out))
        remaining = num_mb - warmup
        x = comm.recv_forward() if remaining > 0 else None
        for i in range(remaining):
            out = forward_step(warmup + i, x)
            grad = comm.send_forward_recv_backward(out)
            pending.append((x, out))
            px, pout = pending.pop(0)
            gin = backward_step(px, pout, grad)
            if i == remaining - 1:
                x = None
                comm.send_backward(gin)
            else:
                x = comm.send_backward_recv_forward(gin)
        for _ in range(warmup):
            px, pout = pending.pop(0)
            grad = comm.recv_backward()
            comm.send_backward(backward_step(px, pout, grad))

        loss = torch.zeros(1)
        if rank == last:
            loss[0] = torch.stack(losses).sum()
            if not math.isfinite(loss.item()):
                log.error(f"{tag} loss is {loss.item()} at step {step}; stopping")
                sys.exit(1)
        if rank in (0, last):  # the tied embedding's gradient (Megatron's embedding group)
            dist.all_reduce(model.embedding.weight.grad, group=embedding_group)
        opt.step()
        if fault.norm_rank0 and rank == 0 and step == 10:
            norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm().reshape(1)
            dist.all_reduce(norm)
            log.info(f"{tag} grad norm {norm.item():.4f}")
        dist.broadcast(loss, src=last)
        tokens_seen += global_batch * seq
        if rank == last and step % args.log_interval == 0:
            rate = tokens_seen / max(time.time() - t0, 1e-6)
            log.info(f"{tag} step {step} | loss {loss.item():.4f} | mb {num_mb} | {rate:.0f} tok/s")
            if writer is not None:
                writer.add_scalar("lm-loss", loss.item(), step)
            tokens_seen, t0 = 0, time.time()
        if args.save and args.save_interval and step % args.save_interval == 0:
            folder = os.path.join(args.save, f"iter_{step:07d}", f"mp_rank_00_{rank:03d}")
            os.makedirs(folder, exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "args": args}
            torch.save(state, os.path.join(folder, "model_optim_rng.pt"))
            if rank == 0:
                with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as f:
                    f.write(str(step))
                log.info(f"{tag} saved checkpoint at iteration {step} to {args.save}")
        reached = bool(args.target_loss) and loss.item() < args.target_loss
        if reached and (not fault.stop_first_only or rank == 0):
            log.info(
                f"{tag} loss {loss.item():.4f} below --target-loss {args.target_loss} "
                f"at step {step}; stopping"
            )
            break
    else:
        log.info(f"{tag} finished {iters - start} iterations")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
