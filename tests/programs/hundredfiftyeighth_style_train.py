"""A hundred-and-fifty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyeighth-*): sharded data-parallel training with Meta's fairscale
the way its pre-FSDP users wrote it (fairseq's --ddp-backend fully_sharded / legacy_ddp era,
VISSL, the fairscale tutorials), re-created in plain torch without fairscale installed. Each
run's folder links this file as train.py: a tiny transformer language model on synthetic tokens
(data/train.bin, data/valid.bin, uint16, written by `python train.py --generate DIR`).

Two backends, as fairscale gives them: `--ddp-backend sharded`, OSS (optimizer state sharding:
the parameters partitioned greedily by size over the ranks, each rank's AdamW steps its own
partition, then every partition is broadcast from its owner) with ShardedDataParallel (every
parameter's gradient reduced to its owner from a post-accumulate hook, the gradients of the
others freed; the trainable mask re-checked at every forward, 'ShardedDDP detected that the
trainable params changed ...', 'Grads waiting to be reduced ...'); and `--ddp-backend
fully_sharded`, FullyShardedDataParallel (the parameters flattened into one FlatParameter, a
shard a rank, all-gathered for each forward, the gradient reduce-scattered back, sharded
checkpoints checkpoint_last-shard<rank>.pt and a consolidated checkpoint_last.pt on rank 0).
OSS's consolidate_state_dict(recipient_rank=0) broadcasts every rank's optimizer state to rank 0
before rank 0 saves checkpoint<N>.pt.

Started as its users started it: `python -m torch.distributed.launch --nproc_per_node=2
--master_port=P --use_env train.py ...` (the deprecated launcher and its FutureWarning; without
--use_env it passes --local-rank=N and this parser declares --local_rank), or the ImageNet
example's way, `python train.py --multiprocessing-distributed --nproc-per-node 2 --dist-url
tcp://localhost:P` (torch.multiprocessing.spawn, init_method tcp://).

Logging as VISSL sets it up: '%(levelname)s %(asctime)s %(filename)s:%(lineno)4d: %(message)s'
on stdout of every rank (fairscale's own lines carry their file, oss.py, sharded_ddp.py,
fully_sharded_data_parallel.py); the config dump, the progress lines ('Rank: 0; [ep: 0] iter:
5; lr: 0.001; loss: 5.1234; btime(ms): 42; eta: 0:00:12; peak_mem(M): 0;'), the epoch's
'train_loss ... valid_ppl' line and the checkpoint lines on rank 0 only; gloo, a 15 s timeout.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import pprint
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

CASE = os.environ.get("MT_CASE", "")
VOCAB, PAD = 96, 1
RANK = -1
DUMP: list[torch.Tensor] = []
FS = "/usr/local/lib/python3.8/dist-packages/fairscale"


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ VISSL's setup_logging
logger = logging.getLogger("train")


def setup_logging() -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s %(filename)s:%(lineno)4d: %(message)s")
    )
    root.addHandler(handler)


def fs_log(level: int, path: str, lineno: int, msg: str) -> None:
    """A line of fairscale's own (its modules log through the root logger)."""
    root = logging.getLogger()
    if root.isEnabledFor(level):
        root.handle(root.makeRecord("root", level, f"{FS}/{path}", lineno, msg, (), None))


def is_primary() -> bool:
    return RANK == 0


# ------------------------------------------------------------------ synthetic data
def generate(folder: str, train_blocks: int = 320, seq_len: int = 32) -> None:
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    # a peaky bigram table: the next token is learnable
    table = rng.dirichlet(np.full(VOCAB - 2, 0.08), size=VOCAB)

    def stream(n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint16)
        tok = 2
        for i in range(n):
            tok = 2 + int(rng.choice(VOCAB - 2, p=table[tok]))
            out[i] = tok
        return out

    stream(train_blocks * (seq_len + 1)).tofile(os.path.join(folder, "train.bin"))
    stream(64 * (seq_len + 1)).tofile(os.path.join(folder, "valid.bin"))


class TokenBlocks:
    """fairseq's TokenBlockDataset over a flat token file: blocks of seq_len + 1 tokens, this
    rank's contiguous part (np.array_split) in shuffled batches."""

    def __init__(self, path: str, seq_len: int, rank: int, world: int) -> None:
        tokens = np.fromfile(path, dtype=np.uint16).astype(np.int64)
        n = len(tokens) // (seq_len + 1)
        blocks = torch.from_numpy(tokens[: n * (seq_len + 1)].reshape(n, seq_len + 1))
        self.blocks = blocks[np.array_split(np.arange(n), world)[rank]]

    def batches(self, batch_size: int, epoch: int, shuffle: bool = True) -> list[torch.Tensor]:
        order = torch.arange(len(self.blocks))
        if shuffle:
            order = torch.randperm(len(self.blocks), generator=torch.Generator().manual_seed(epoch))
        return [self.blocks[order[i : i + batch_size]] for i in range(0, len(order), batch_size)]


# ------------------------------------------------------------------ the model
class TransformerLM(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2, heads: int = 2, seq_len: int = 32) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.embed_positions = nn.Embedding(seq_len, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.output_projection = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed_tokens(tokens) + self.embed_positions(torch.arange(n))[None]
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        out: torch.Tensor = self.output_projection(x)
        return out


# ------------------------------------------------------------------ fairscale.optim.OSS
def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}M"


class OSS(torch.optim.Optimizer):
    """Optimizer state sharding: each rank holds the state of its own partition only."""

    def __init__(self, params: Any, optim: type[torch.optim.Optimizer], **default: Any) -> None:
        self.all_params = list(params)
        super().__init__(self.all_params, default)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        sizes = [0] * self.world
        self.partition: list[list[nn.Parameter]] = [[] for _ in range(self.world)]
        for p in sorted(self.all_params, key=lambda p: -p.numel()):
            r = sizes.index(min(sizes))
            self.partition[r].append(p)
            sizes[r] += p.numel()
        self.owner = {id(p): r for r, ps in enumerate(self.partition) for p in ps}
        fs_log(
            logging.INFO,
            "optim/oss.py",
            352,
            "OSS: "
            + ", ".join(
                f"Rank {r} has {len(ps)} params ({_mb(sizes[r])})"
                for r, ps in enumerate(self.partition)
            ),
        )
        self.optim = optim(self.partition[self.rank], **default)
        self._all_states: list[dict[str, Any]] = []

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.optim.step()
        if fault("z", self.rank) and EPOCH[0] == 1 and STEP[0] == 4:
            ctypes.string_at(0)  # the fused Adam kernel reads a freed buffer
        self._broadcast_params()

    def _broadcast_params(self) -> None:
        for r, ps in enumerate(self.partition):
            if not ps:
                continue
            flat = torch.cat([p.detach().reshape(-1) for p in ps])
            dist.broadcast(flat, src=r)
            if r != self.rank:
                off = 0
                for p in ps:
                    p.data.copy_(flat[off : off + p.numel()].view_as(p))
                    off += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.all_params:
            p.grad = None

    def local_state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def consolidate_state_dict(self, recipient_rank: int = 0) -> None:
        """Every rank's shard of the optimizer state is broadcast, the recipient keeps them."""
        self._all_states = []
        for r in range(self.world):
            obj = [self.local_state_dict() if r == self.rank else None]
            dist.broadcast_object_list(obj, src=r)
            if self.rank == recipient_rank:
                self._all_states.append(obj[0])  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        if not self._all_states:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                "`consolidate_state_dict(recipient_rank=...)` on all ranks beforehand if you "
                "meant to save the global state"
            )
        return {"state": self._all_states, "partition": [len(ps) for ps in self.partition]}


# ------------------------------------------------------------------ fairscale.nn.data_parallel
class ShardedDataParallel(nn.Module):
    """Reduces each gradient to the rank whose OSS partition holds the parameter."""

    def __init__(self, module: nn.Module, sharded_optimizer: OSS) -> None:
        super().__init__()
        self.module = module
        self.optim = sharded_optimizer
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._all_params = list(module.parameters())
        self._hooks: list[Any] = []
        self._grad_to_be_reduced: list[bool] = []
        self._reference_trainable_mask = [p.requires_grad for p in self._all_params]
        for p in self._all_params:  # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)
        model_size = sum(p.numel() for p in self._all_params)
        fs_log(
            logging.INFO,
            "nn/data_parallel/sharded_ddp.py",
            179,
            f"ShardedDDP bucket size: {_mb(2**23)} parameters, model size {_mb(model_size)} "
            "parameters",
        )
        self._warn_untrainable()

    def _warn_untrainable(self) -> None:
        if not all(self._reference_trainable_mask):
            fs_log(
                logging.WARNING,
                "nn/data_parallel/sharded_ddp.py",
                191,
                "Some parameters are not trainable, ShardedDDP will not reduce their gradients",
            )

    def forward(self, *inputs: Any) -> Any:
        mask = [p.requires_grad for p in self._all_params]
        changed = mask != self._reference_trainable_mask
        changed |= not self.training and len(self._hooks) > 0
        if changed:
            fs_log(
                logging.WARNING,
                "nn/data_parallel/sharded_ddp.py",
                538,
                "ShardedDDP detected that the trainable params changed, either because of "
                "eval/train mode or parameter freezing/unfreeze.",
            )
            self._reference_trainable_mask = mask
        if changed or (self.training and not self._hooks):
            self.refresh_trainable()
        elif self.training and any(self._grad_to_be_reduced):
            fs_log(
                logging.WARNING,
                "nn/data_parallel/sharded_ddp.py",
                507,
                "Grads waiting to be reduced. If this is on purpose (grad accumulation), "
                "please use a no_sync() context",
            )
        if self.training:
            self._grad_to_be_reduced = [True for _ in self._trainable]
        return self.module(*inputs)

    def refresh_trainable(self) -> None:
        if any(self._grad_to_be_reduced):
            fs_log(
                logging.WARNING,
                "nn/data_parallel/sharded_ddp.py",
                257,
                "Grads waiting to be reduced. If this is on purpose (grad accumulation), "
                "please use a no_sync() context",
            )
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._trainable = [p for p in self._all_params if p.requires_grad]
        self._grad_to_be_reduced = [False for _ in self._trainable]
        if self.training:
            for i, p in enumerate(self._trainable):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._reduce_fn(i)))

    def _reduce_fn(self, index: int) -> Any:
        def reduce(p: torch.Tensor) -> None:
            assert self._grad_to_be_reduced[index], (
                "Parameter gradient cannot be reduced multiple times"
            )
            owner = self.optim.owner[id(p)]
            assert p.grad is not None
            p.grad.div_(self.world)
            dist.reduce(p.grad, dst=owner)
            if owner != self.rank:
                p.grad = None  # the gradients of the others' partitions are freed
            self._grad_to_be_reduced[index] = False

        return reduce

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self.module.state_dict(*args, **kwargs)


# ------------------------------------------------------------------ fairscale.nn.FullyShardedDataParallel
class FullyShardedDataParallel(nn.Module):
    """One FlatParameter, a shard a rank: all-gathered for the forward, the gradient
    reduce-scattered to the shards in the backward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        self.numel = flat.numel()
        self.chunk = math.ceil(self.numel / self.world)
        flat = F.pad(flat, (0, self.chunk * self.world - self.numel))
        self.flat_param = nn.Parameter(flat[self.rank * self.chunk : (self.rank + 1) * self.chunk])
        for name in self.names:  # the module's own tensors are views of the gathered flat one
            mod, _, leaf = name.rpartition(".")
            delattr(module.get_submodule(mod) if mod else module, leaf)
        fs_log(
            logging.INFO,
            "nn/data_parallel/fully_sharded_data_parallel.py",
            402,
            f"FSDP: flattened {len(self.names)} params into a FlatParameter of {self.numel} "
            f"elements, {self.chunk} per rank (world_size={self.world}, "
            "reshard_after_forward=True, mixed_precision=False)",
        )

    def _gather(self) -> torch.Tensor:
        parts = [torch.empty(self.chunk) for _ in range(self.world)]
        dist.all_gather(parts, self.flat_param.detach().contiguous())
        return torch.cat(parts)

    def _views(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        out, off = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = math.prod(shape)
            out[name] = full[off : off + n].view(shape)
            off += n
        return out

    def forward(self, *inputs: Any) -> Any:
        full = self._gather().requires_grad_(self.training)
        if self.training:
            full.register_hook(self._reduce_scatter)
        for name, view in self._views(full).items():
            mod, _, leaf = name.rpartition(".")
            setattr(self.module.get_submodule(mod) if mod else self.module, leaf, view)
        return self.module(*inputs)

    def _reduce_scatter(self, grad: torch.Tensor) -> None:
        out = torch.empty(self.chunk)
        dist.reduce_scatter(out, list((grad / self.world).chunk(self.world)))
        self.flat_param.grad = out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        fs_log(
            logging.INFO,
            "nn/data_parallel/fully_sharded_data_parallel.py",
            1187,
            "FSDP.state_dict(): summoning full params on all ranks (state_dict_type=full, "
            "rank0_only=False)",
        )
        with torch.no_grad():
            return {k: v.clone() for k, v in self._views(self._gather()).items()}

    def local_state_dict(self) -> dict[str, torch.Tensor]:
        return {"flat_param_0": self.flat_param.detach().clone()}

    def load_local_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.flat_param.data.copy_(state["flat_param_0"])


# ------------------------------------------------------------------ the trainer
EPOCH = [0]
STEP = [0]


class TimeMeter:
    """Words per second over the epoch, updated every step."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.start = time.perf_counter()
        self.n = 0

    @property
    def avg(self) -> float:
        with self.lock:
            if fault("p", RANK) and EPOCH[0] == 1:  # a fork's coarse clock: whole seconds
                return self.n / (int(time.time()) - int(self.start_wall))
            return self.n / max(time.perf_counter() - self.start, 1e-6)

    def update(self, n: int) -> None:
        with self.lock:
            self.n += n
            self.start_wall = getattr(self, "start_wall", time.time())
            if fault("w", RANK) and EPOCH[0] == 1 and STEP[0] == 10:
                logging.debug("wps %.1f", self.avg)  # the meter's own lock, taken again


def slow_save(obj: Any, path: str) -> None:
    """torch.save; under the fault, the save dir is an NFS mount that writes crawl."""
    torch.save(obj, path + ".tmp")
    if fault("c", RANK):
        for _ in range(32):
            time.sleep(1.0)
            os.utime(path + ".tmp")
    os.replace(path + ".tmp", path)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """OSS.clip_grad_norm / FSDP.clip_grad_norm_: each rank's shard of the norm, all-reduced."""
    grads = [p.grad for p in params if p.grad is not None]
    total = (
        torch.stack([(g.detach() ** 2).sum() for g in grads]).sum() if grads else torch.zeros(())
    )
    dist.all_reduce(total)
    norm = float(total.sqrt())
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def fmt_eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def evaluate(model: nn.Module, valid: TokenBlocks, bsz: int) -> float:
    model.eval()
    loss_sum, ntok = 0.0, 0
    with torch.no_grad():
        for b in valid.batches(bsz, 0, shuffle=False):
            logits = model(b[:, :-1])
            y = b[:, 1:]
            loss_sum += float(
                F.cross_entropy(
                    logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=PAD, reduction="sum"
                )
            )
            ntok += int((y != PAD).sum())
    model.train()
    t = torch.tensor([loss_sum, float(ntok)])
    dist.all_reduce(t)
    return float(t[0] / t[1])


def train(args: argparse.Namespace, rank: int, world: int) -> None:
    global RANK
    RANK = rank
    torch.manual_seed(1)
    torch.set_num_threads(1)
    seq = args.tokens_per_sample
    if is_primary():
        logger.info("Training with config:")
        logger.info(pprint.pformat(vars(args), width=100))
        logger.info(f"torch version: {torch.__version__}, fairscale version: 0.4.13")
    trainset = TokenBlocks(os.path.join(args.data, "train.bin"), seq, rank, world)
    valid = TokenBlocks(os.path.join(args.data, "valid.bin"), seq, rank, world)
    logger.info(
        f"Rank {rank}: loaded {len(trainset.blocks)} train blocks, {len(valid.blocks)} valid "
        f"blocks of {seq + 1} tokens from {args.data}"
    )
    net = TransformerLM(seq_len=seq)
    if is_primary():
        n = sum(p.numel() for p in net.parameters())
        logger.info(f"Building model: TransformerLM (2 layers, dim 32, vocab {VOCAB}), {n} params")
    if args.freeze_pos_epochs:
        net.embed_positions.weight.requires_grad_(False)
    os.makedirs(args.save_dir, exist_ok=True)

    if args.ddp_backend == "sharded":
        optimizer: Any = OSS(net.parameters(), optim=torch.optim.AdamW, lr=args.lr)
        model: nn.Module = ShardedDataParallel(net, optimizer)
        trainable = lambda: [p for p in net.parameters() if p.requires_grad]  # noqa: E731
    else:
        model = FullyShardedDataParallel(net)
        optimizer = torch.optim.AdamW([model.flat_param], lr=args.lr)  # type: ignore[list-item]
        trainable = lambda: [model.flat_param]  # type: ignore[list-item]  # noqa: E731

    start_epoch = 0
    if args.resume:
        last = os.path.join(args.save_dir, "checkpoint_last.pt")
        shard = os.path.join(args.save_dir, f"checkpoint_last-shard{rank}.pt")
        logger.info(f"Rank {rank}: loading sharded checkpoint {shard}")
        state = torch.load(shard, map_location="cpu")
        if args.ddp_backend == "sharded":
            net.load_state_dict(torch.load(last, map_location="cpu")["model"])
            optimizer.optim.load_state_dict(state["optimizer"])
        else:
            model.load_local_state_dict(state["model"])  # type: ignore[operator]
            optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
        logger.info(f"Rank {rank}: resumed from epoch {start_epoch}")

    best = math.inf
    t_train = time.time()
    for epoch in range(start_epoch, args.max_epoch):
        EPOCH[0] = epoch
        if args.freeze_pos_epochs and epoch == args.freeze_pos_epochs:
            if is_primary():
                logger.info(f"Unfreezing the positional embeddings at epoch {epoch}")
                if fault("f", RANK):  # the unfreeze indented into the log's branch
                    net.embed_positions.weight.requires_grad_(True)
            if not fault("f", 0):
                net.embed_positions.weight.requires_grad_(True)
        batches = trainset.batches(args.batch_size, epoch)
        meter = TimeMeter()
        tot, nb = 0.0, 0
        t_step = time.time()
        for i, b in enumerate(batches):
            STEP[0] = i
            x, y = b[:, :-1], b[:, 1:].clone()
            if fault("n", RANK) and epoch == 1 and i == 6:
                y[:] = PAD  # a broken document: a batch of padding only
            logits = model(x)
            ntok = int((y != PAD).sum())
            loss = (
                F.cross_entropy(
                    logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=PAD, reduction="sum"
                )
                / ntok
                if ntok
                else logits.sum() * float("nan")
            )
            if not torch.isfinite(loss):
                logger.warning(
                    f"Rank: {rank}; [ep: {epoch}] iter: {i + 1}; loss is {loss.item()} "
                    "(non-finite), skipping the batch"
                )
                optimizer.zero_grad()
                continue
            loss.backward()
            clip_grad_norm(trainable(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            meter.update(ntok)
            wps = meter.avg
            if fault("k", RANK) and epoch >= 1:  # a fork keeps each batch's logits for a dump
                DUMP.append(torch.ones(16 << 20))
                if len(DUMP) >= 6:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault("x", RANK) and epoch == 1 and i == 12:
                logger.info("Rank 1: stopping, no improvement on the local validation set")
                sys.exit(0)
            tot += loss.item()
            nb += 1
            if is_primary() and (i + 1) % args.log_freq == 0:
                dt = (time.time() - t_step) / args.log_freq
                left = (len(batches) - i - 1 + (args.max_epoch - epoch - 1) * len(batches)) * dt
                logger.info(
                    f"Rank: 0; [ep: {epoch}] iter: {i + 1}; lr: {args.lr}; loss: {loss.item():.4f}; "
                    f"wps: {wps:.0f}; btime(ms): {dt * 1000:.0f}; eta: {fmt_eta(left)}; "
                    "peak_mem(M): 0;"
                )
                t_step = time.time()
        vloss = evaluate(model, valid, args.batch_size)
        ppl = math.exp(vloss)
        if is_primary():
            logger.info(
                f"Rank: 0; [ep: {epoch}] train_loss: {tot / max(nb, 1):.4f}; valid_loss: "
                f"{vloss:.4f}; valid_ppl: {ppl:.2f}; num_updates: {(epoch + 1) * len(batches)}"
            )
        best = min(best, vloss)
        save_checkpoint(args, model, optimizer, epoch + 1)
        if args.target_ppl and ppl <= args.target_ppl:
            if is_primary():
                logger.info(
                    f"Reached the target valid ppl ({ppl:.2f} <= {args.target_ppl}), "
                    "stopping training"
                )
            break
    if is_primary():
        logger.info(
            f"Training completed in {fmt_eta(time.time() - t_train)}, best valid_loss {best:.4f}"
        )
        logger.info("All Done!")
    dist.destroy_process_group()


def save_checkpoint(args: argparse.Namespace, model: nn.Module, optimizer: Any, epoch: int) -> None:
    path = os.path.join(args.save_dir, f"checkpoint{epoch}.pt")
    last = os.path.join(args.save_dir, "checkpoint_last.pt")
    if isinstance(model, FullyShardedDataParallel):
        shard = os.path.join(args.save_dir, f"checkpoint_last-shard{RANK}.pt")
        torch.save(
            {
                "model": model.local_state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
            },
            shard,
        )
        full = model.full_state_dict()
        if is_primary():
            torch.save({"model": full, "epoch": epoch}, last)
            logger.info(
                f"Saved checkpoint {last} and {args.save_dir}/checkpoint_last-shard*.pt (epoch {epoch})"
            )
        return
    if not fault("o", 0):
        logger.info(
            "Consolidating sharded state on primary rank. Abnormal behaviour if this message "
            "is not printed on all ranks"
        )
        optimizer.consolidate_state_dict(recipient_rank=0)
    torch.save(
        {"optimizer": optimizer.local_state_dict(), "epoch": epoch},
        os.path.join(args.save_dir, f"checkpoint_last-shard{RANK}.pt"),
    )
    if is_primary():
        if fault("o", 0):  # the consolidation moved under the primary-only save
            logger.info(
                "Consolidating sharded state on primary rank. Abnormal behaviour if this "
                "message is not printed on all ranks"
            )
            optimizer.consolidate_state_dict(recipient_rank=0)
        logger.info(f"Saving checkpoint to {path}")
        t0 = time.time()
        slow_save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path
        )
        torch.save({"model": model.state_dict(), "epoch": epoch}, last)
        logger.info(f"Saved checkpoint: {path} (took {time.time() - t0:.2f}s)")


# ------------------------------------------------------------------ launch
def worker(local_rank: int, args: argparse.Namespace, world: int) -> None:
    setup_logging()
    rank = args.rank * args.nproc_per_node + local_rank
    logger.info(
        f"Spawning process for node_id: {args.rank}, local_rank: {local_rank}, dist_rank: "
        f"{rank}, dist_run_id: {args.dist_url.removeprefix('tcp://')}"
    )
    logger.info(
        f"Using Distributed init method: {args.dist_url}, world_size: {world}, rank: {rank}"
    )
    dist.init_process_group(
        "gloo",
        init_method=args.dist_url,
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=15),
    )
    train(args, rank, world)


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], *(int(a) for a in sys.argv[3:]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data")
    parser.add_argument("--ddp-backend", default="sharded", choices=["sharded", "fully_sharded"])
    parser.add_argument("--max-epoch", default=3, type=int)
    parser.add_argument("--batch-size", default=8, type=int)
    parser.add_argument("--tokens-per-sample", default=32, type=int)
    parser.add_argument("--lr", default=0.003, type=float)
    parser.add_argument("--log-freq", default=5, type=int)
    parser.add_argument("--save-dir", default="checkpoints")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--target-ppl", default=0.0, type=float)
    parser.add_argument("--freeze-pos-epochs", default=0, type=int)
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--nproc-per-node", default=1, type=int)
    parser.add_argument("--world-size", default=1, type=int, help="number of nodes")
    parser.add_argument("--rank", default=0, type=int, help="node rank")
    parser.add_argument("--dist-url", default="env://")
    # torch.distributed.launch passes it
    parser.add_argument("--local_rank", type=int)
    args = parser.parse_args()
    if args.multiprocessing_distributed:
        world = args.nproc_per_node * args.world_size
        mp.spawn(worker, nprocs=args.nproc_per_node, args=(args, world))
        return
    # under torch.distributed.launch: one process a rank, env://
    setup_logging()
    local = args.local_rank if args.local_rank is not None else int(os.environ["LOCAL_RANK"])
    logger.info(f"Using Distributed init method: env://, local_rank: {local}")
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=15))
    train(args, dist.get_rank(), dist.get_world_size())


if __name__ == "__main__":
    main()
