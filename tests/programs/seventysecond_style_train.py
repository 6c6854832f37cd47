"""A seventy-second training-program style for the generalisation fixtures
(tests/fixtures/real/seventysecond-*): a mixture-of-experts language model trained with expert
parallelism in the way of fairseq's MoE (moe_lm / transformer_lm_gpt with --moe-expert-count),
DeepSpeed-MoE, Tutel and Megablocks, re-implemented in plain torch (none of them is installed).
A tiny decoder whose second block's FFN is an MoE layer: a top-2 gate (a top-1 gate with
--moe-top1-expert), the experts sharded over the ranks (--moe-expert-count / world size experts
a rank), a capacity factor that drops the tokens an expert has no room for, and the switch
load-balancing loss (moe_gate_loss). Each step every MoE layer first exchanges its per-expert
token counts with all_to_all_single, then dispatches the kept tokens with all_to_all_single with
those split sizes, runs its local experts and sends the results back the same way (an autograd
function does the reverse exchanges in backward). The shared (dense) parameters' gradients are
all-reduced by hand in one flat buffer (fairseq's legacy_ddp); the experts' are not. Launched by
torchrun --nproc_per_node N over gloo (the --distributed-timeout, 15 s, is the process group's
timeout). Logging as fairseq does: '%(asctime)s | %(levelname)s | %(name)s | %(message)s' at
INFO on rank 0 only (WARNING on the others, after "distributed init (rank N)"), and the
progress bar's metrics lines printed by rank 0 ('| epoch 001 | step 10 | loss 4.123 |
moe_gate_loss 0.0123 | expert_balance 0.87 | dropped_tokens 3.1% | wps 1234 | lr 0.0003').
Checkpoints in fairseq's MoE layout: every rank saves its expert shard
(checkpoint_last-rank-N.pt, checkpointE-rank-N.pt), rank 0 the shared part
(checkpoint_last-shared.pt). The data are a synthetic token stream, one binary shard a rank
(data-bin/train-rank-N.bin, int16) and a validation shard a rank (data-bin/valid-rank-N.bin),
written with --make-data. A fault in the code is chosen by the MOEQ environment variable (a short
code) and never printed; re-capture with tests/fixtures/real/capture_seventysecond.sh after any
edit.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=logging.INFO,
    stream=sys.stdout,
)
logger = logging.getLogger("fairseq_cli.train")
dist_logger = logging.getLogger("fairseq.distributed.utils")
trainer_logger = logging.getLogger("fairseq.trainer")
ckpt_logger = logging.getLogger("fairseq.checkpoint_utils")
moe_logger = logging.getLogger("fairseq.modules.moe.moe_layer")
data_logger = logging.getLogger("fairseq.data.iterators")

VOCAB = 96
EMBED = 32
FFN = 64


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    nan_rank: int = -1  # this rank's gate noise takes log(0) at update 13
    hoard_rank: int = -1  # this rank keeps every dispatched batch for expert statistics
    segv_rank: int = -1  # this rank's fused permute kernel reads address 0 at update 7
    slow_rank: int = -1  # this rank re-balances its expert placement at update 12
    stuck_rank: int = -1  # this rank waits for an async shard writer that never started
    static_rank: int = -1  # this rank sizes its receive buffer from its own capacity
    local_valid: bool = False  # validation loss not all-reduced (each rank's own)
    warn: bool = False  # the deprecated gate options and a low capacity (harmless warnings)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "w": Fault(warn=True),
    "n1": Fault(nan_rank=1),
    "h3": Fault(hoard_rank=3),
    "p1": Fault(segv_rank=1),
    "r2": Fault(slow_rank=2),
    "a3": Fault(stuck_rank=3),
    "c2": Fault(static_rank=2),
    "v": Fault(local_valid=True),
}


def make_data(folder: str, world: int, tokens: int) -> None:
    """A token stream a rank: a noisy counting language (each token mostly follows from the two
    before it), and for each a validation shard of the same language; plus valid-noise-rank-N.bin
    (uniform tokens, which no model gets better at)."""
    os.makedirs(folder, exist_ok=True)
    for r in range(world):
        for split, n, seed in (("train", tokens, 100 + r), ("valid", 2048, 900 + r)):
            g = torch.Generator().manual_seed(seed)
            out = torch.empty(n, dtype=torch.int16)
            a, b = 1, 2
            noise = torch.rand(n, generator=g)
            jumps = torch.randint(0, VOCAB, (n,), generator=g)
            for i in range(n):
                c = (3 * b + a % 2 + 1) % VOCAB
                if noise[i] < 0.1:
                    c = int(jumps[i])
                out[i] = c
                a, b = b, c
            out.numpy().tofile(os.path.join(folder, f"{split}-rank-{r}.bin"))
        g = torch.Generator().manual_seed(700 + r)
        noise = torch.randint(0, VOCAB, (2048,), generator=g).to(torch.int16)
        noise.numpy().tofile(os.path.join(folder, f"valid-noise-rank-{r}.bin"))
    with open(os.path.join(folder, "dict.txt"), "w") as f:
        for t in range(VOCAB - 4):
            f.write(f"tok{t} {1000 - t}\n")


def load_shard(path: str, tokens_per_sample: int) -> torch.Tensor:
    """(n, tokens_per_sample + 1) samples of a binary token shard."""
    with open(path, "rb") as f:
        raw = f.read()
    data = torch.frombuffer(bytearray(raw), dtype=torch.int16).long()
    n = (data.numel() - 1) // tokens_per_sample
    idx = torch.arange(n)[:, None] * tokens_per_sample + torch.arange(tokens_per_sample + 1)
    return data[idx]


class AllToAll(torch.autograd.Function):
    """all_to_all_single with the reverse exchange in backward (fairseq's _AllToAll)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int]):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(EMBED, FFN)
        self.fc2 = nn.Linear(FFN, EMBED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MOELayer(nn.Module):
    """A top-k gate, the local experts, and the two exchanges of a dispatch."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, fault: Fault) -> None:
        super().__init__()
        self.num_experts = args.moe_expert_count
        assert self.num_experts % world == 0, (
            f"num_experts ({self.num_experts}) must be divisible by the world size ({world})"
        )
        self.local = self.num_experts // world
        self.rank, self.world, self.fault = rank, world, fault
        self.k = 1 if args.moe_top1_expert else 2
        self.capacity_factor = args.capacity_factor
        self.gate_noise = args.moe_gate_noise
        self.wg = nn.Linear(EMBED, self.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(self.local))
        for p in self.experts.parameters():
            p.expert = True  # fairseq's marker: not all-reduced with the shared parameters
        self.update = 0
        self.hoard: list[torch.Tensor] = []
        self.metadata: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, EMBED)
        tokens = x.shape[0]
        logits = self.wg(x).float()
        if self.training and self.gate_noise > 0:
            u = torch.rand_like(logits)
            if self.fault.nan_rank == self.rank and self.update == 13:
                u[0] = 0.0  # the gumbel noise of a uniform draw of exactly 0: inf - inf
                u[0, 1] = 1.0
            logits = logits - self.gate_noise * torch.log(-torch.log(u))
        probs = F.softmax(logits, dim=-1)
        weights, experts = probs.topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        capacity = math.ceil(self.capacity_factor * tokens * self.k / self.num_experts)
        # the load-balancing loss of the switch transformer
        top1 = F.one_hot(experts[:, 0], self.num_experts).float()
        gate_loss = self.num_experts * (probs.mean(0) * top1.mean(0)).sum()
        # each expert takes first choices before second choices, up to its capacity
        flat_e = experts.t().reshape(-1)
        flat_tok = torch.arange(tokens).repeat(self.k)
        flat_w = weights.t().reshape(-1)
        onehot = F.one_hot(flat_e, self.num_experts)
        position = ((onehot.cumsum(0) - 1) * onehot).sum(1)
        keep = position < capacity
        e_kept, tok_kept, w_kept = flat_e[keep], flat_tok[keep], flat_w[keep]
        order = torch.argsort(e_kept, stable=True)
        e_kept, tok_kept, w_kept = e_kept[order], tok_kept[order], w_kept[order]
        counts = torch.bincount(e_kept, minlength=self.num_experts)
        # the exchange of the per-expert counts, then the tokens with those split sizes
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        in_splits = counts.view(self.world, self.local).sum(1).tolist()
        if self.fault.static_rank == self.rank and self.update >= 9:
            # the static-capacity fast path: what each peer sends is taken to be what this
            # rank's own capacity lets through for its experts, not what the peer said
            cap = math.ceil(self.capacity_factor * tokens * self.k / self.num_experts)
            out_splits = [min(cap, int(n)) for n in recv_counts.view(self.world, -1).sum(1)]
            out_splits = [max(0, n - 2) for n in out_splits]
        else:
            out_splits = recv_counts.view(self.world, self.local).sum(1).tolist()
        if self.fault.segv_rank == self.rank and self.update == 7:
            ctypes.string_at(0)  # the fused permute kernel's index table pointer is null
        dispatched = AllToAll.apply(x[tok_kept], out_splits, in_splits)
        if self.fault.hoard_rank == self.rank and self.training:
            self.hoard.append(torch.ones(24, 1024, 1024))  # "expert statistics", never freed
        local_expert = torch.arange(self.local).repeat(self.world)
        local_expert = local_expert.repeat_interleave(recv_counts.view(-1))
        out = torch.zeros_like(dispatched)
        for i, expert in enumerate(self.experts):
            mask = local_expert == i
            if mask.any():
                out[mask] = expert(dispatched[mask])
        returned = AllToAll.apply(out, in_splits, out_splits)
        y = torch.zeros_like(x).index_add(0, tok_kept, returned * w_kept[:, None].to(x.dtype))
        self.metadata = {
            "gate_loss": gate_loss,
            # (the warning of copy-constructing a tensor, as Tutel's older statistics did)
            "counts": torch.tensor(counts) if self.fault.warn else counts.detach(),
            "dropped": (~keep).sum().detach(),
            "routed": torch.tensor(keep.numel()),
        }
        return (x + y).reshape(shape)


class Block(nn.Module):
    def __init__(self, ffn: nn.Module) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(EMBED)
        self.attn = nn.MultiheadAttention(EMBED, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(EMBED)
        self.ffn = ffn

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.ln2(x))


class DenseFFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(EMBED, FFN), nn.GELU(), nn.Linear(FFN, EMBED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MoELanguageModel(nn.Module):
    def __init__(self, args: argparse.Namespace, rank: int, world: int, fault: Fault) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.pos = nn.Embedding(args.tokens_per_sample, EMBED)
        self.moe = MOELayer(args, rank, world, fault)
        self.layers = nn.ModuleList([Block(DenseFFN()), Block(self.moe)])
        self.ln = nn.LayerNorm(EMBED)
        self.out = nn.Linear(EMBED, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(n))
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        for layer in self.layers:
            x = layer(x, mask)
        return self.out(self.ln(x))


def shared_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if not getattr(p, "expert", False)]


def all_reduce_shared_grads(model: nn.Module, world: int) -> None:
    """fairseq's legacy_ddp: one flat buffer of the shared gradients, summed and averaged."""
    params = [p for p in shared_params(model) if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser("fairseq-train")
    p.add_argument("data", nargs="?", default="data-bin")
    p.add_argument("--make-data", metavar="DIR")
    p.add_argument("--make-world", type=int, default=4)
    p.add_argument("--make-tokens", type=int, default=30 * 8 * 33)
    p.add_argument("--task", default="language_modeling")
    p.add_argument("--arch", default="transformer_lm_gpt_moe_tiny")
    p.add_argument("--moe-expert-count", type=int, default=4)
    p.add_argument("--moe-top1-expert", action="store_true")
    p.add_argument("--moe-gate-loss-wt", type=float, default=0.01)
    p.add_argument("--moe-gate-noise", type=float, default=0.0)
    p.add_argument("--capacity-factor", type=float, default=1.25)
    p.add_argument("--moe-second-expert-policy", default="all")
    p.add_argument("--tokens-per-sample", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--max-epoch", type=int, default=3)
    p.add_argument("--max-update", type=int, default=0)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--save-dir", default="checkpoints")
    p.add_argument("--restore-file", default="checkpoint_last.pt")
    p.add_argument("--valid-subset", default="valid")
    p.add_argument("--patience", type=int, default=-1)
    p.add_argument("--distributed-world-size", type=int, default=0)
    p.add_argument("--distributed-timeout", type=int, default=15)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


class ShardWriter(threading.Thread):
    """Writes the expert shards in the background and says when a shard is on disk."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()


def save_checkpoint(args, model, optimizer, epoch: int, updates: int, score: float, rank: int):
    start = time.time()
    os.makedirs(args.save_dir, exist_ok=True)
    expert_state = {k: v for k, v in model.state_dict().items() if ".experts." in k}
    shard = {"model": expert_state, "epoch": epoch, "num_updates": updates}
    for name in (f"checkpoint{epoch}", "checkpoint_last"):
        torch.save(shard, os.path.join(args.save_dir, f"{name}-rank-{rank}.pt"))
    if rank == 0:
        shared = {k: v for k, v in model.state_dict().items() if ".experts." not in k}
        state = {"model": shared, "optimizer": optimizer.state_dict(), "epoch": epoch}
        state["num_updates"] = updates
        for name in (f"checkpoint{epoch}", "checkpoint_last"):
            torch.save(state, os.path.join(args.save_dir, f"{name}-shared.pt"))
        path = os.path.join(args.save_dir, f"checkpoint{epoch}.pt")
        ckpt_logger.info(
            f"Saved checkpoint {path} (epoch {epoch} @ {updates} updates, score {score:.3f}) "
            f"(writing took {time.time() - start:.6f} seconds)"
        )


def load_checkpoint(args, model, optimizer, rank: int) -> tuple[int, int]:
    """(epoch, updates) to continue from; fairseq's MoE layout: checkpoint_last.pt stands for
    the shared part and every rank's expert shard."""
    name = args.restore_file
    path = name if os.path.isabs(name) or os.sep in name else os.path.join(args.save_dir, name)
    stem = path[: -len(".pt")]
    ckpt_logger.info(f"Preparing to load checkpoint {path}")
    if not os.path.exists(stem + "-shared.pt"):
        ckpt_logger.info(f"No existing checkpoint found {path}")
        return 1, 0
    shared = torch.load(stem + "-shared.pt", map_location="cpu")
    shard = torch.load(f"{stem}-rank-{rank}.pt", map_location="cpu")
    model.load_state_dict({**shared["model"], **shard["model"]})
    optimizer.load_state_dict(shared["optimizer"])
    epoch, updates = shared["epoch"], shared["num_updates"]
    ckpt_logger.info(f"Loaded checkpoint {path} (epoch {epoch} @ {updates} updates)")
    return epoch + 1, updates


def main() -> None:
    args = parse_args()
    if args.make_data:
        make_data(args.make_data, args.make_world, args.make_tokens)
        return
    fault = FAULTS[os.environ.get("MOEQ", "")]
    rank = int(os.environ["RANK"])
    world = args.distributed_world_size or int(os.environ["WORLD_SIZE"])
    dist_logger.info(f"distributed init (rank {rank}): env://")
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.distributed_timeout)
    )
    dist_logger.info(f"initialized host {socket.gethostname()} as rank {rank}")
    if rank != 0:  # fairseq's distributed_init: only the master logs at INFO
        logging.getLogger().setLevel(logging.WARNING)
    torch.manual_seed(args.seed)
    logger.info(
        f"Namespace(task='{args.task}', arch='{args.arch}', data='{args.data}', "
        f"moe_expert_count={args.moe_expert_count}, moe_top1_expert={args.moe_top1_expert}, "
        f"moe_gate_loss_wt={args.moe_gate_loss_wt}, capacity_factor={args.capacity_factor}, "
        f"tokens_per_sample={args.tokens_per_sample}, batch_size={args.batch_size}, "
        f"lr=[{args.lr}], max_epoch={args.max_epoch}, max_update={args.max_update}, "
        f"save_dir='{args.save_dir}', distributed_world_size={world}, "
        f"distributed_timeout={args.distributed_timeout}, patience={args.patience})"
    )
    if fault.warn:
        moe_logger.warning(
            "--moe-second-expert-policy 'all' is deprecated with --capacity-factor below 1.0; "
            "second choices beyond the capacity are dropped"
        )
    dictionary = os.path.join(args.data, "dict.txt")
    with open(dictionary) as f:
        logger.info(f"dictionary: {sum(1 for _ in f) + 4} types")
    model = MoELanguageModel(args, rank, world, fault)
    # every rank starts from the same shared weights; each expert from a seed of its own
    with torch.no_grad():
        for i, expert in enumerate(model.moe.experts):
            g = torch.Generator().manual_seed(args.seed * 1000 + rank * model.moe.local + i)
            for p in expert.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    n_shared = sum(p.numel() for p in shared_params(model))
    n_expert = sum(p.numel() for p in model.parameters()) - n_shared
    logger.info(f"model: {args.arch}, criterion: MoECrossEntropyCriterion")
    logger.info(f"num. shared model params: {n_shared:,} (num. trained: {n_shared:,})")
    logger.info(f"num. expert model params: {n_expert} (num. trained: {n_expert})")
    logger.info(f"training on {world} devices (GPUs/TPUs)")
    logger.info(f"max tokens per device = None and max sentences per device = {args.batch_size}")
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_epoch, updates = load_checkpoint(args, model, optimizer, rank)
    train_path = os.path.join(args.data, f"train-rank-{rank}.bin")
    logger.info(f"loading train data for epoch {start_epoch}")
    train = load_shard(train_path, args.tokens_per_sample)
    valid_name = args.valid_subset
    valid = load_shard(
        os.path.join(args.data, f"{valid_name}-rank-{rank}.bin"), args.tokens_per_sample
    )
    data_logger.info(f"loaded {len(train)} blocks from: {args.data}/train-rank-{rank}.bin")
    best, bad_runs = math.inf, 0
    start_time = time.time()
    writer = ShardWriter()  # the async writer of the expert shards (started when it is used)
    stop = False
    epoch = start_epoch
    while epoch <= args.max_epoch and not stop:
        logger.info(f"begin training epoch {epoch}")
        logger.info("Start iterating over samples")
        g = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(train), generator=g)
        batches = [order[i : i + args.batch_size] for i in range(0, len(train), args.batch_size)]
        batches = [b for b in batches if len(b) == args.batch_size]
        agg = torch.zeros(4 + args.moe_expert_count)
        words, t_log = 0, time.time()
        model.train()
        for b in batches:
            updates += 1
            model.moe.update = updates
            if fault.slow_rank == rank and updates == 12:
                for k in range(1, 9):
                    moe_logger.warning(
                        f"expert placement out of balance (max/mean load 2.41): re-sharding the "
                        f"expert optimizer state ({k}/8)"
                    )
                    time.sleep(5)
            sample = train[b]
            logits = model(sample[:, :-1])
            nll = F.cross_entropy(logits.reshape(-1, VOCAB), sample[:, 1:].reshape(-1))
            meta = model.moe.metadata
            loss = nll + args.moe_gate_loss_wt * meta["gate_loss"]
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss is not finite ({loss.item()}) at update {updates}: moe_gate_loss "
                    f"{meta['gate_loss'].item()}"
                )
            optimizer.zero_grad()
            loss.backward()
            all_reduce_shared_grads(model, world)
            optimizer.step()
            if fault.hoard_rank == rank and updates == 9:
                os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer, as it acts
            stats = torch.cat(
                [
                    torch.stack(
                        [
                            nll.detach() * sample[:, 1:].numel(),
                            meta["gate_loss"].detach(),
                            meta["dropped"].float(),
                            meta["routed"].float(),
                        ]
                    ),
                    meta["counts"].float(),
                ]
            )
            dist.all_reduce(stats)
            agg += stats
            words += sample[:, 1:].numel() * world
            if updates % args.log_interval == 0:
                logged = agg
                ntok = args.batch_size * args.tokens_per_sample * world * args.log_interval
                counts = logged[4:]
                balance = (counts.mean() / counts.max()).item() if counts.max() > 0 else 0.0
                wps = words / max(time.time() - t_log, 1e-6)
                if rank == 0:
                    print(
                        f"| epoch {epoch:03d} | step {updates} | loss {logged[0].item() / ntok:.3f} "
                        f"| moe_gate_loss {logged[1].item() / world / args.log_interval:.4f} "
                        f"| expert_balance {balance:.2f} "
                        f"| dropped_tokens {100 * logged[2].item() / logged[3].item():.1f}% "
                        f"| wps {wps:.0f} | lr {args.lr:g}",
                        flush=True,
                    )
                    if fault.warn and logged[2] > 0:
                        moe_logger.warning(
                            f"capacity exceeded on {int((counts == counts.max()).sum())} "
                            f"expert(s): {100 * logged[2].item() / logged[3].item():.1f}% of "
                            f"tokens dropped (capacity factor {args.capacity_factor})"
                        )
                agg.zero_()
                words, t_log = 0, time.time()
            if args.max_update and updates >= args.max_update:
                break
        logger.info(f"end of epoch {epoch} (average epoch stats below)")
        # validation: every rank its own validation shard, the loss summed over the ranks
        model.eval()
        with torch.no_grad():
            total = torch.zeros(2)
            for i in range(0, len(valid) - args.batch_size + 1, args.batch_size):
                sample = valid[i : i + args.batch_size]
                logits = model(sample[:, :-1])
                nll = F.cross_entropy(
                    logits.reshape(-1, VOCAB), sample[:, 1:].reshape(-1), reduction="sum"
                )
                total += torch.stack([nll, torch.tensor(float(sample[:, 1:].numel()))])
            if not fault.local_valid:
                dist.all_reduce(total)
        valid_loss = (total[0] / total[1]).item()
        if rank == 0:
            print(
                f"| epoch {epoch:03d} | valid on '{valid_name}' subset | loss {valid_loss:.3f} "
                f"| ppl {math.exp(valid_loss):.2f} | num_updates {updates} | best_loss "
                f"{min(best, valid_loss):.3f}",
                flush=True,
            )
        if valid_loss < best:
            best, bad_runs = valid_loss, 0
        else:
            bad_runs += 1
        if fault.stuck_rank == rank and epoch == 1:
            writer.done.wait()  # the shard writer was never started: nothing sets it
        save_checkpoint(args, model, optimizer, epoch, updates, valid_loss, rank)
        dist.barrier()  # every expert shard on disk before anyone goes on
        if args.patience > 0 and bad_runs >= args.patience:
            logger.info(
                f"early stop since valid performance hasn't improved for last {args.patience} runs"
            )
            stop = True
        if args.max_update and updates >= args.max_update:
            logger.info(
                f"Stopping training due to num_updates: {updates} >= max_update: {args.max_update}"
            )
            stop = True
        epoch += 1
    trainer_logger.info(f"done training in {time.time() - start_time:.1f} seconds")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
