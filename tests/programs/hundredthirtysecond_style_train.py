#!/usr/bin/env python
"""A hundredthirtysecond training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtysecond-*): molecular representation learning in the way of
dptech-corp/Uni-Mol on Uni-Core, re-created in plain torch (neither unicore nor lmdb is
installed). This file stands in for Uni-Core's `unicore-train` console script (each run's
bin/unicore-train links to it) and holds, in one file, what Uni-Core and Uni-Mol's --user-dir
plugin give it: Uni-Core's (fairseq-derived) options, `distributed init (rank N): env://` and
non-master ranks at WARNING, fairseq's log format ('%(asctime)s | %(levelname)s | %(name)s |
%(message)s'), the simple progress bar's train_inner lines, validation and 'valid' lines,
checkpoint_utils' checkpointN.pt / checkpoint_best.pt / checkpoint_last.pt (rank 0) and the
restore of save_dir/checkpoint_last.pt on every rank, --max-update / --max-epoch / --patience,
--fp16 with a dynamic loss scaler (activations of the attention scores pass through half
precision; 'Minimum loss scale reached'), c10d DDP over gloo (15 s timeout) and the stats
all-reduce of every step; the unimol task (atom tokens + 3-D conformers from an "lmdb" that is a
folder of pickled shards with an index, written by hundredthirtysecond_write_lmdb.py; hydrogens
removed, atoms masked, coordinates noised), a per-rank DataLoader over the shards r::world, a
tiny Uni-Mol-like transformer with a Gaussian distance pair bias, and the unimol loss
(masked_token_loss, masked_coord_loss, masked_dist_loss, masked_acc). Started as Uni-Mol's
README starts it: `python -m torch.distributed.launch --nproc_per_node=N --master_port=PORT
$(which unicore-train) ./example_data --user-dir ./unimol --train-subset train --valid-subset
valid --ddp-backend=c10d --task unimol --loss unimol --arch unimol_base ...`. A fault in the
code is chosen by the TQ_CASE environment variable (a short code) and never printed; re-capture
with tests/fixtures/real/capture_hundredthirtysecond.sh after any edit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import math
import os
import pickle
import queue
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=os.environ.get("LOGLEVEL", "INFO").upper(),
    stream=sys.stdout,
)
logger = logging.getLogger("unicore_cli.train")
dist_logger = logging.getLogger("unicore.distributed.utils")
task_logger = logging.getLogger("unicore.tasks.unicore_task")
unimol_logger = logging.getLogger("unimol.tasks.unimol")
trainer_logger = logging.getLogger("unicore.trainer")
ckpt_logger = logging.getLogger("unicore.checkpoint_utils")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    hoard_rank: int = -1  # this rank's conformer cache keeps every expanded batch (OOM killer)
    segv_rank: int = -1  # this rank's native featurizer reads address 0
    slow_rank: int = -1  # this rank builds a distance-matrix cache before validating
    stuck_rank: int = -1  # this rank waits on a prefetch buffer whose thread never started
    skip_nonfinite: bool = False  # the task skips a batch whose loss is not finite (no backward)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "m1": Fault(hoard_rank=1),
    "v0": Fault(segv_rank=0),
    "s1": Fault(slow_rank=1),
    "q0": Fault(stuck_rank=0),
    "n": Fault(skip_nonfinite=True),
}

ARCHS = {
    "unimol_base": {"encoder_layers": 2, "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 64,
                    "encoder_attention_heads": 4},
    "unimol_large": {"encoder_layers": 3, "encoder_embed_dim": 48, "encoder_ffn_embed_dim": 96,
                     "encoder_attention_heads": 4},
}  # fmt: skip


# ----------------------------------------------------------------------------- options
def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unicore-train")
    p.add_argument("data", help="colon separated path to data directories list")
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--log-format", default="simple")
    p.add_argument("--tensorboard-logdir", default=None)
    p.add_argument("--wandb-project", default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16-init-scale", type=int, default=4)
    p.add_argument("--fp16-scale-window", type=int, default=256)
    p.add_argument("--min-loss-scale", type=float, default=1e-4)
    p.add_argument("--threshold-loss-scale", type=float, default=None)
    p.add_argument("--user-dir", default=None)
    p.add_argument("--empty-cache-freq", type=int, default=0)
    p.add_argument("--all-gather-list-size", type=int, default=16384)
    p.add_argument("--suppress-crashes", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--ema-decay", type=float, default=-1.0)
    p.add_argument("--loss", default="unimol")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--lr-scheduler", default="polynomial_decay")
    p.add_argument("--task", default="unimol")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--skip-invalid-size-inputs-valid-test", action="store_true")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--required-batch-size-multiple", type=int, default=1)
    p.add_argument("--data-buffer-size", type=int, default=10)
    p.add_argument("--train-subset", default="train")
    p.add_argument("--valid-subset", default="valid")
    p.add_argument("--validate-interval", type=int, default=1)
    p.add_argument("--validate-interval-updates", type=int, default=0)
    p.add_argument("--validate-after-updates", type=int, default=0)
    p.add_argument("--fixed-validation-seed", type=int, default=None)
    p.add_argument("--disable-validation", action="store_true")
    p.add_argument("--batch-size-valid", type=int, default=None)
    p.add_argument("--max-valid-steps", type=int, default=None)
    p.add_argument("--curriculum", type=int, default=0)
    p.add_argument("--distributed-world-size", type=int, default=max(1, torch.cuda.device_count()))
    p.add_argument("--distributed-rank", type=int, default=0)
    p.add_argument("--distributed-backend", default="nccl")
    p.add_argument("--distributed-init-method", default=None)
    p.add_argument("--distributed-port", type=int, default=-1)
    p.add_argument("--device-id", "--local_rank", "--local-rank", type=int, default=0)
    p.add_argument("--distributed-no-spawn", action="store_true")
    p.add_argument("--ddp-backend", default="c10d", choices=["c10d", "apex", "no_c10d"])
    p.add_argument("--bucket-cap-mb", type=int, default=25)
    p.add_argument("--fix-batches-to-gpus", action="store_true")
    p.add_argument("--find-unused-parameters", action="store_true")
    p.add_argument("--fast-stat-sync", action="store_true")
    p.add_argument("--broadcast-buffers", action="store_true")
    p.add_argument("--nprocs-per-node", type=int, default=max(1, torch.cuda.device_count()))
    p.add_argument("--arch", "-a", default="unimol_base", choices=sorted(ARCHS))
    p.add_argument("--max-epoch", type=int, default=0)
    p.add_argument("--max-update", type=int, default=0)
    p.add_argument("--stop-time-hours", type=float, default=0)
    p.add_argument("--clip-norm", type=float, default=0.0)
    p.add_argument("--per-sample-clip-norm", type=float, default=0)
    p.add_argument("--update-freq", default="1")
    p.add_argument("--lr", type=float, default=0.25)
    p.add_argument("--stop-min-lr", type=float, default=-1)
    p.add_argument("--save-dir", default="checkpoints")
    p.add_argument("--tmp-save-dir", default="./")
    p.add_argument("--restore-file", default="checkpoint_last.pt")
    p.add_argument("--finetune-from-model", default=None)
    p.add_argument("--load-from-ema", action="store_true")
    p.add_argument("--reset-dataloader", action="store_true")
    p.add_argument("--reset-lr-scheduler", action="store_true")
    p.add_argument("--reset-meters", action="store_true")
    p.add_argument("--reset-optimizer", action="store_true")
    p.add_argument("--optimizer-overrides", default="{}")
    p.add_argument("--save-interval", type=int, default=1)
    p.add_argument("--save-interval-updates", type=int, default=0)
    p.add_argument("--keep-interval-updates", type=int, default=-1)
    p.add_argument("--keep-last-epochs", type=int, default=-1)
    p.add_argument("--keep-best-checkpoints", type=int, default=-1)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--no-epoch-checkpoints", action="store_true")
    p.add_argument("--no-last-checkpoints", action="store_true")
    p.add_argument("--no-save-optimizer-state", action="store_true")
    p.add_argument("--best-checkpoint-metric", default="loss")
    p.add_argument("--maximize-best-checkpoint-metric", action="store_true")
    p.add_argument("--patience", type=int, default=-1)
    p.add_argument("--checkpoint-suffix", default="")
    # the unimol task, loss and optimizer (Uni-Mol's --user-dir plugin)
    p.add_argument("--mask-prob", type=float, default=0.15)
    p.add_argument("--leave-unmasked-prob", type=float, default=0.05)
    p.add_argument("--random-token-prob", type=float, default=0.05)
    p.add_argument(
        "--noise-type", default="uniform", choices=["trunc_normal", "uniform", "normal", "none"]
    )
    p.add_argument("--noise", type=float, default=1.0)
    p.add_argument("--remove-hydrogen", action="store_true")
    p.add_argument("--remove-polar-hydrogen", action="store_true")
    p.add_argument("--max-atoms", type=int, default=256)
    p.add_argument("--dict-name", default="dict.txt")
    p.add_argument("--only-polar", type=int, default=1)
    p.add_argument("--masked-token-loss", type=float, default=1.0)
    p.add_argument("--masked-coord-loss", type=float, default=1.0)
    p.add_argument("--masked-dist-loss", type=float, default=1.0)
    p.add_argument("--x-norm-loss", type=float, default=-1.0)
    p.add_argument("--delta-pair-repr-norm-loss", type=float, default=-1.0)
    p.add_argument("--adam-betas", default="(0.9, 0.99)")
    p.add_argument("--adam-eps", type=float, default=1e-6)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--warmup-updates", type=int, default=0)
    p.add_argument("--end-learning-rate", type=float, default=0.0)
    p.add_argument("--power", type=float, default=1.0)
    p.add_argument("--total-num-update", type=int, default=1000000)
    return p  # fmt: skip


# ----------------------------------------------------------------------------- data
class Dictionary:
    def __init__(self, symbols: list[str]) -> None:
        self.symbols = list(symbols)
        self.index = {s: i for i, s in enumerate(self.symbols)}

    @classmethod
    def load(cls, path: str) -> Dictionary:
        with open(path) as f:
            return cls([line.split()[0] for line in f if line.strip()])

    def add_symbol(self, s: str) -> int:
        if s not in self.index:
            self.index[s] = len(self.symbols)
            self.symbols.append(s)
        return self.index[s]

    def __len__(self) -> int:
        return len(self.symbols)

    def pad(self) -> int:
        return self.index["[PAD]"]


@contextlib.contextmanager
def numpy_seed(seed: int, *addl_seeds: int):
    """Uni-Core's data_utils.numpy_seed: seeds numpy's PRNG with a tuple, restores it after."""
    state = np.random.get_state()
    np.random.seed(int(hash((seed, *addl_seeds)) % 1e6))
    try:
        yield
    finally:
        np.random.set_state(state)


class ShardedLMDBDataset(Dataset):
    """Uni-Core's LMDBDataset over a folder of pickled shards; this rank reads shards r::world."""

    def __init__(self, path: str, rank: int, world: int) -> None:
        with open(os.path.join(path, "index.pkl"), "rb") as f:
            index = pickle.load(f)
        self.items: list[dict] = []
        self.shards = []
        for k, (name, _count) in enumerate(index):
            if k % world != rank:
                continue
            with open(os.path.join(path, name), "rb") as f:
                self.items.extend(pickle.load(f))
            self.shards.append(k)
        self.num_shards = len(index)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


class UniMolDataset(Dataset):
    """Conformer sampling, hydrogen removal, cropping, tokenizing and masking, as the unimol
    task's dataset stack does (ConformerSample, RemoveHydrogen, Cropping, Tokenize,
    MaskPoints), seeded per (seed, epoch, index) as Uni-Core's numpy_seed does."""

    def __init__(self, raw: ShardedLMDBDataset, dictionary: Dictionary, args, seed: int) -> None:
        self.raw, self.dictionary, self.args, self.seed = raw, dictionary, args, seed
        self.epoch = 1
        self.mask_idx = dictionary.index["[MASK]"]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, i: int) -> dict:
        mol = self.raw[i]
        with numpy_seed(self.seed, self.epoch, i):
            conf = mol["coordinates"][np.random.randint(len(mol["coordinates"]))]
            atoms = np.array(mol["atoms"])
            coordinates = np.asarray(conf, dtype=np.float32)
            if self.args.remove_hydrogen:
                keep = atoms != "H"
                atoms, coordinates = atoms[keep], coordinates[keep]
            if len(atoms) > self.args.max_atoms:
                idx = np.random.choice(len(atoms), self.args.max_atoms, replace=False)
                atoms, coordinates = atoms[idx], coordinates[idx]
            tokens = np.array([self.dictionary.index.get(a, 3) for a in atoms], dtype=np.int64)
            sz = len(tokens)
            num_mask = int(self.args.mask_prob * sz + np.random.rand())
            mask = np.zeros(sz, dtype=bool)
            if num_mask:
                mask[np.random.choice(sz, num_mask, replace=False)] = True
            target = np.full(sz, self.dictionary.pad(), dtype=np.int64)
            target[mask] = tokens[mask]
            src = tokens.copy()
            src[mask] = self.mask_idx
            noisy = coordinates.copy()
            if self.args.noise_type == "uniform":
                noisy[mask] += np.random.uniform(
                    -self.args.noise, self.args.noise, size=(int(mask.sum()), 3)
                )
        return {"src_tokens": src, "src_coord": noisy, "tokens_target": target,
                "coord_target": coordinates}  # fmt: skip


class Collater:
    """Pads a batch the way Uni-Mol's RightPad/PrependAndAppend datasets do: [CLS] atoms [SEP],
    each molecule's coordinates centred on its first heavy atom, the distance matrix and the
    edge types of every pair."""

    def __init__(self, dictionary: Dictionary) -> None:
        self.d = dictionary

    def __call__(self, samples: list[dict]) -> dict:
        size = max(len(s["src_tokens"]) for s in samples) + 2
        b = len(samples)
        pad, cls, sep = self.d.pad(), self.d.index["[CLS]"], self.d.index["[SEP]"]
        tokens = torch.full((b, size), pad, dtype=torch.long)
        target = torch.full((b, size), pad, dtype=torch.long)
        coord = torch.zeros(b, size, 3)
        coord_target = torch.zeros(b, size, 3)
        for k, s in enumerate(samples):
            n = len(s["src_tokens"])
            origin = s["coord_target"][0]
            tokens[k, : n + 2] = torch.tensor([cls, *s["src_tokens"].tolist(), sep])
            target[k, 1 : n + 1] = torch.from_numpy(s["tokens_target"])
            coord[k, 1 : n + 1] = torch.from_numpy(s["src_coord"] - origin)
            coord_target[k, 1 : n + 1] = torch.from_numpy(s["coord_target"] - origin)
        dist_ = torch.cdist(coord, coord)
        edge_type = tokens.unsqueeze(-1) * len(self.d) + tokens.unsqueeze(-2)
        return {
            "net_input": {"src_tokens": tokens, "src_coord": coord, "src_distance": dist_,
                          "src_edge_type": edge_type},
            "target": {"tokens_target": target, "coord_target": coord_target,
                       "distance_target": torch.cdist(coord_target, coord_target)},
        }  # fmt: skip


# ----------------------------------------------------------------------------- model
class GaussianLayer(nn.Module):
    def __init__(self, k: int, edge_types: int) -> None:
        super().__init__()
        self.means = nn.Embedding(1, k)
        self.stds = nn.Embedding(1, k)
        self.mul = nn.Embedding(edge_types, 1)
        self.bias = nn.Embedding(edge_types, 1)
        nn.init.uniform_(self.means.weight, 0, 3)
        nn.init.uniform_(self.stds.weight, 0, 3)
        nn.init.constant_(self.bias.weight, 0)
        nn.init.constant_(self.mul.weight, 1)

    def forward(self, x: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        mul = self.mul(edge_type).squeeze(-1)
        bias = self.bias(edge_type).squeeze(-1)
        x = (mul * x + bias).unsqueeze(-1)
        mean = self.means.weight.view(-1)
        std = self.stds.weight.view(-1).abs() + 1e-5
        return torch.exp(-0.5 * ((x - mean) / std) ** 2) / (math.sqrt(2 * math.pi) * std)


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int, half: bool) -> None:
        super().__init__()
        self.heads, self.half = heads, half
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x, bias, pad_mask):
        b, n, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias
        if self.half:  # --fp16: the attention scores are computed in half precision
            scores = scores.half().float()
        scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))
        a = scores.softmax(-1)
        x = x + self.out((a @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)))), scores


class UniMolModel(nn.Module):
    def __init__(self, args, dictionary: Dictionary) -> None:
        super().__init__()
        cfg = ARCHS[args.arch]
        dim, heads = cfg["encoder_embed_dim"], cfg["encoder_attention_heads"]
        self.padding_idx = dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), dim, self.padding_idx)
        n_edge = len(dictionary) * len(dictionary)
        self.gbf = GaussianLayer(16, n_edge)
        self.gbf_proj = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, heads))
        self.layers = nn.ModuleList(
            EncoderLayer(dim, cfg["encoder_ffn_embed_dim"], heads, args.fp16)
            for _ in range(cfg["encoder_layers"])
        )
        self.final_ln = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, len(dictionary))
        self.pair2coord = nn.Linear(heads, 1)
        self.dist_head = nn.Linear(heads, 1)

    def forward(self, src_tokens, src_coord, src_distance, src_edge_type):
        pad_mask = src_tokens.eq(self.padding_idx)
        x = self.embed_tokens(src_tokens)
        bias = self.gbf_proj(self.gbf(src_distance, src_edge_type)).permute(0, 3, 1, 2)
        for layer in self.layers:
            x, bias = layer(x, bias, pad_mask)
        x = self.final_ln(x)
        pair = bias.permute(0, 2, 3, 1).masked_fill(pad_mask[:, None, :, None], 0.0)
        pair = pair.clamp(-1e4, 1e4)
        delta = src_coord.unsqueeze(2) - src_coord.unsqueeze(1)
        attn = self.pair2coord(pair)
        coord = src_coord + (delta * attn).sum(2) / (1 + (~pad_mask).sum(1))[:, None, None]
        dist_ = self.dist_head(pair).squeeze(-1)
        dist_ = (dist_ + dist_.transpose(1, 2)) * 0.5 + src_distance
        return self.lm_head(x), coord, dist_


class UniMolLoss:
    """masked_token_loss + masked_coord_loss + masked_dist_loss; masked_acc for the log."""

    def __init__(self, args, padding_idx: int) -> None:
        self.args, self.padding_idx = args, padding_idx

    def __call__(self, model, sample):
        target = sample["target"]["tokens_target"]
        masked_tokens = target.ne(self.padding_idx)
        sample_size = masked_tokens.long().sum().item()
        logits, coord, dist_ = model(**sample["net_input"])
        logits = logits[masked_tokens]
        masked_token_loss = F.cross_entropy(logits.float(), target[masked_tokens])
        masked_hit = (logits.argmax(dim=-1) == target[masked_tokens]).long().sum().item()
        masked_acc = masked_hit / sample_size
        coord_target = sample["target"]["coord_target"][masked_tokens]
        masked_coord_loss = F.smooth_l1_loss(coord[masked_tokens], coord_target, beta=1.0)
        dist_target = sample["target"]["distance_target"][masked_tokens]
        non_pad = sample["net_input"]["src_tokens"].ne(self.padding_idx)
        rows = dist_[masked_tokens][non_pad.unsqueeze(1).expand_as(dist_)[masked_tokens]]
        masked_dist_loss = F.smooth_l1_loss(
            rows, dist_target[non_pad.unsqueeze(1).expand_as(dist_)[masked_tokens]]
        )
        loss = (
            self.args.masked_token_loss * masked_token_loss
            + self.args.masked_coord_loss * masked_coord_loss
            + self.args.masked_dist_loss * masked_dist_loss
        )
        logging_output = {
            "loss": loss.item(),
            "masked_token_loss": masked_token_loss.item(),
            "masked_acc": masked_acc,
            "masked_coord_loss": masked_coord_loss.item(),
            "masked_dist_loss": masked_dist_loss.item(),
            "bsz": float(target.size(0)),
        }
        return loss, sample_size, logging_output


# ----------------------------------------------------------------------------- trainer
class DynamicLossScaler:
    def __init__(self, init_scale: float, scale_window: int, min_loss_scale: float) -> None:
        self.loss_scale = float(init_scale)
        self.scale_window = scale_window
        self.min_loss_scale = min_loss_scale
        self._since_rescale = 0

    def check_overflow(self, grad_norm: float) -> None:
        if grad_norm == float("inf") or grad_norm != grad_norm:
            prev_scale = self.loss_scale
            self.loss_scale /= 2.0
            self._since_rescale = 0
            if self.loss_scale <= self.min_loss_scale:
                self.loss_scale = prev_scale
                raise FloatingPointError(
                    f"Minimum loss scale reached ({self.min_loss_scale}). Your loss is probably "
                    "exploding. Try lowering the learning rate, using gradient clipping or "
                    "increasing the batch size."
                )
            raise OverflowError("setting loss scale to: " + str(self.loss_scale))
        self._since_rescale += 1
        if self._since_rescale % self.scale_window == 0:
            self.loss_scale *= 2.0


KEYS = ["loss", "masked_token_loss", "masked_acc", "masked_coord_loss", "masked_dist_loss", "bsz"]


def all_reduce_stats(logging_output: dict, sample_size: int) -> tuple[dict, int]:
    """Uni-Core's _fast_stat_sync_sum: one all-reduce of every step's numbers."""
    buf = torch.tensor([logging_output[k] for k in KEYS] + [float(sample_size), 1.0],
                       dtype=torch.float64)  # fmt: skip
    if dist.is_initialized():
        dist.all_reduce(buf)
    n = buf[-1].item()
    out = {k: buf[i].item() / (n if k != "bsz" else 1) for i, k in enumerate(KEYS)}
    return out, int(buf[-2].item())


class Trainer:
    def __init__(self, args, model, loss, fault: Fault, rank: int, world: int) -> None:
        self.args, self.loss, self.fault, self.rank = args, loss, fault, rank
        self.model = model
        if world > 1:
            self.model = nn.parallel.DistributedDataParallel(
                model,
                bucket_cap_mb=args.bucket_cap_mb,
                find_unused_parameters=args.find_unused_parameters,
                broadcast_buffers=args.broadcast_buffers,
            )
        betas = eval(args.adam_betas)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.lr, betas=betas, eps=args.adam_eps,
            weight_decay=args.weight_decay,
        )  # fmt: skip
        self.scaler = (
            DynamicLossScaler(args.fp16_init_scale, args.fp16_scale_window, args.min_loss_scale)
            if args.fp16
            else None
        )
        self.num_updates = 0

    def get_lr(self) -> float:
        a = self.args
        if a.warmup_updates > 0 and self.num_updates <= a.warmup_updates:
            return a.lr * max(self.num_updates, 1) / a.warmup_updates
        frac = 1 - (self.num_updates - a.warmup_updates) / max(1, a.total_num_update)
        return (a.lr - a.end_learning_rate) * frac**a.power + a.end_learning_rate

    def train_step(self, sample) -> dict | None:
        self.model.train()
        self.optimizer.zero_grad()
        loss, sample_size, logging_output = self.loss(self.model, sample)
        if self.fault.skip_nonfinite and not torch.isfinite(loss):
            unimol_logger.warning(
                f"loss is {loss.item()} at update {self.num_updates + 1}, skip this batch"
            )
        else:
            scale = self.scaler.loss_scale if self.scaler else 1.0
            (loss * scale).backward()
        logging_output, sample_size = all_reduce_stats(logging_output, sample_size)
        params = [p for p in self.model.parameters() if p.grad is not None]
        overflow = False
        grad_norm = 0.0
        try:
            if self.scaler:
                half_norm = torch.stack([p.grad.half().float().norm() for p in params]).norm()
                self.scaler.check_overflow(half_norm.item())
                for p in params:
                    p.grad.div_(self.scaler.loss_scale)
            max_norm = self.args.clip_norm if self.args.clip_norm > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
            if not math.isfinite(grad_norm):
                raise FloatingPointError("gradients are Nan/Inf")
            for group in self.optimizer.param_groups:
                group["lr"] = self.get_lr()
            self.optimizer.step()
            self.num_updates += 1
        except OverflowError as e:
            overflow = True
            trainer_logger.info(f"NOTE: gradient overflow detected, ignoring gradient, {e}")
            self.optimizer.zero_grad()
        if overflow:
            return None
        logging_output["gnorm"] = grad_norm
        return logging_output

    def state_dict(self, epoch: int) -> dict:
        model = self.model.module if hasattr(self.model, "module") else self.model
        return {
            "args": self.args,
            "model": model.state_dict(),
            "optimizer_history": [{"num_updates": self.num_updates}],
            "last_optimizer_state": self.optimizer.state_dict(),
            "extra_state": {"epoch": epoch, "num_updates": self.num_updates},
        }

    def load_checkpoint(self, filename: str) -> int:
        trainer_logger.info(f"Preparing to load checkpoint {filename}")
        if not os.path.exists(filename):
            trainer_logger.info(f"No existing checkpoint found {filename}")
            return 1
        state = torch.load(filename, map_location="cpu", weights_only=False)
        model = self.model.module if hasattr(self.model, "module") else self.model
        try:
            model.load_state_dict(state["model"], strict=True)
        except Exception:
            raise Exception(  # noqa: B904 (Uni-Core's own: the chained traceback shows both)
                f"Cannot load model parameters from checkpoint {filename}; "
                "please ensure that the architectures match."
            )
        self.optimizer.load_state_dict(state["last_optimizer_state"])
        extra = state["extra_state"]
        self.num_updates = extra["num_updates"]
        trainer_logger.info(
            f"Loaded checkpoint {filename} (epoch {extra['epoch']} @ {self.num_updates} updates)"
        )
        return extra["epoch"] + 1


def fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e-3 and v != 0 else f"{round(v, 3):g}"


class Meter:
    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.n = 0

    def add(self, out: dict) -> None:
        self.n += 1
        for k, v in out.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def avg(self) -> dict:
        return {k: v / max(1, self.n) for k, v in self.sums.items()}


# ----------------------------------------------------------------------------- main
def distributed_init(args) -> tuple[int, int]:
    if "WORLD_SIZE" not in os.environ:
        return 0, 1
    args.distributed_world_size = int(os.environ["WORLD_SIZE"])
    args.distributed_rank = int(os.environ["RANK"])
    args.distributed_init_method = "env://"
    args.distributed_backend = "gloo" if args.cpu else args.distributed_backend
    dist_logger.info(
        f"distributed init (rank {args.distributed_rank}): {args.distributed_init_method}"
    )
    dist.init_process_group(
        backend=args.distributed_backend,
        init_method=args.distributed_init_method,
        world_size=args.distributed_world_size,
        rank=args.distributed_rank,
        timeout=timedelta(seconds=15),
    )
    dist_logger.info(f"initialized host {socket.gethostname()} as rank {args.distributed_rank}")
    dist.all_reduce(torch.zeros(1))  # Uni-Core's warm-up all-reduce
    if args.distributed_rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    return args.distributed_rank, args.distributed_world_size


def save_checkpoint(args, trainer: Trainer, epoch: int, end_of_epoch: bool, val_loss, best):
    if args.no_save or trainer.rank != 0:
        return
    os.makedirs(args.save_dir, exist_ok=True)
    names = []
    if end_of_epoch and not args.no_epoch_checkpoints and epoch % args.save_interval == 0:
        names.append(f"checkpoint{epoch}.pt")
    if val_loss is not None and val_loss <= best:
        names.append("checkpoint_best.pt")
    if not args.no_last_checkpoints:
        names.append("checkpoint_last.pt")
    t0 = time.time()
    first = os.path.join(args.save_dir, names[0])
    torch.save(trainer.state_dict(epoch), first)
    for other in names[1:]:
        shutil.copyfile(first, os.path.join(args.save_dir, other))
    ckpt_logger.info(
        f"Saved checkpoint {first} (epoch {epoch} @ {trainer.num_updates} updates, score "
        f"{fmt(val_loss)}) (writing took {time.time() - t0:.6f} seconds)"
    )


def main() -> None:
    args = get_parser().parse_args()
    fault = FAULTS[os.environ.get("TQ_CASE", "")]
    args.cpu = args.cpu or not torch.cuda.is_available()
    rank, world = distributed_init(args)
    logger.info(args)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    dictionary = Dictionary.load(os.path.join(args.data, args.dict_name))
    dictionary.add_symbol("[MASK]")
    unimol_logger.info(f"dictionary: {len(dictionary)} types")
    datasets = {}
    for split in (args.train_subset, args.valid_subset):
        path = os.path.join(args.data, split + ".lmdb")
        raw = ShardedLMDBDataset(path, rank, world)
        seed = args.seed if split == args.train_subset else args.seed + 1000
        datasets[split] = UniMolDataset(raw, dictionary, args, seed)
        task_logger.info(f"loaded {len(raw)} samples from {path}")

    model = UniMolModel(args, dictionary)
    loss = UniMolLoss(args, dictionary.pad())
    logger.info(f"task: UniMolTask, model: UniMolModel ({args.arch}), loss: UniMolLoss")
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(f"num. model params: {n_params} (num. trained: {n_params})")
    trainer = Trainer(args, model, loss, fault, rank, world)
    logger.info(f"training on {world} devices (GPUs/TPUs)")
    logger.info(f"batch size per device = {args.batch_size}")
    epoch = trainer.load_checkpoint(os.path.join(args.save_dir, args.restore_file))

    collater = Collater(dictionary)
    max_epoch = args.max_epoch or math.inf
    max_update = args.max_update or math.inf
    best, prev_best, bad_runs = math.inf, math.inf, 0
    hoard: list[torch.Tensor] = []
    start = time.time()
    should_stop = False
    while epoch <= max_epoch and trainer.num_updates < max_update and not should_stop:
        train_ds = datasets[args.train_subset]
        train_ds.set_epoch(epoch)
        g = torch.Generator()
        g.manual_seed(args.seed + epoch)
        loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, generator=g,
                            collate_fn=collater, num_workers=args.num_workers)  # fmt: skip
        trainer_logger.info(f"begin training epoch {epoch}")
        logger.info("Start iterating over samples")
        if rank == fault.stuck_rank and epoch == 2:
            buffer: queue.Queue = queue.Queue(args.data_buffer_size)  # no thread fills it
            buffer.get()
        meter, inner = Meter(), Meter()
        epoch_start = time.time()
        n_batches = len(loader)
        for i, sample in enumerate(loader):
            if rank == fault.segv_rank and epoch == 2 and i == 2:
                ctypes.string_at(0)  # the native featurizer dereferences NULL
            if rank == fault.hoard_rank and epoch == 2:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            out = trainer.train_step(sample)
            if out is None:
                continue
            meter.add(out)
            inner.add(out)
            if trainer.num_updates % args.log_interval == 0:
                stats = inner.avg()
                line = ", ".join(
                    f"{k}={fmt(stats[k])}"
                    for k in ["loss", "masked_token_loss", "masked_acc", "masked_coord_loss",
                              "masked_dist_loss"]
                )  # fmt: skip
                extra = f", loss_scale={fmt(trainer.scaler.loss_scale)}" if trainer.scaler else ""
                logging.getLogger("train_inner").info(
                    f"epoch {epoch:03d}:  {i + 1:5d} / {n_batches} {line}, "
                    f"bsz={fmt(stats['bsz'])}, num_updates={trainer.num_updates}, "
                    f"lr={fmt(trainer.get_lr())}, gnorm={fmt(stats['gnorm'])}{extra}, "
                    f"train_wall={round(time.time() - epoch_start)}, gb_free=0, "
                    f"wall={round(time.time() - start)}"
                )
                inner = Meter()
            if trainer.num_updates >= max_update:
                logger.info(
                    f"Stopping training due to num_updates: {trainer.num_updates} >= "
                    f"max_update: {args.max_update}"
                )
                should_stop = True
                break
        end_of_epoch = not should_stop

        # validation
        if rank == fault.slow_rank and epoch == 2:
            for part in range(1, 9):
                unimol_logger.warning(
                    f"building the distance-matrix cache for subset '{args.valid_subset}' "
                    f"({part}/8)"
                )
                time.sleep(4)
        logger.info(f'begin validation on "{args.valid_subset}" subset')
        valid_ds = datasets[args.valid_subset]
        trainer.model.eval()
        vmeter = Meter()
        valid_loader = DataLoader(valid_ds, batch_size=args.batch_size, shuffle=False,
                                  collate_fn=collater, num_workers=args.num_workers)  # fmt: skip
        with torch.no_grad():
            for sample in valid_loader:
                _, sample_size, out = loss(trainer.model, sample)
                out, _ = all_reduce_stats(out, sample_size)
                vmeter.add(out)
        v = vmeter.avg()
        val_loss = v["loss"]
        best = min(best, val_loss)
        parts = " | ".join(
            f"{k} {fmt(v[k])}"
            for k in ["loss", "masked_token_loss", "masked_acc", "masked_coord_loss",
                      "masked_dist_loss"]
        )  # fmt: skip
        logging.getLogger("valid").info(
            f"epoch {epoch:03d} | valid on '{args.valid_subset}' subset | {parts} | "
            f"bsz {fmt(v['bsz'])} | num_updates {trainer.num_updates} | best_loss {fmt(best)}"
        )
        if args.patience > 0:
            if val_loss < prev_best:
                prev_best, bad_runs = val_loss, 0
            else:
                bad_runs += 1
            if bad_runs >= args.patience:
                logger.info(
                    "early stop since valid performance hasn't improved for last "
                    f"{args.patience} runs"
                )
                should_stop = True
        save_checkpoint(args, trainer, epoch, end_of_epoch, val_loss, best)
        logger.info(f"end of epoch {epoch} (average epoch stats below)")
        s = meter.avg()
        if s:
            logging.getLogger("train").info(
                f"epoch {epoch:03d} | loss {fmt(s['loss'])} | masked_token_loss "
                f"{fmt(s['masked_token_loss'])} | masked_acc {fmt(s['masked_acc'])} | "
                f"masked_coord_loss {fmt(s['masked_coord_loss'])} | masked_dist_loss "
                f"{fmt(s['masked_dist_loss'])} | bsz {fmt(s['bsz'])} | num_updates "
                f"{trainer.num_updates} | lr {fmt(trainer.get_lr())} | gnorm {fmt(s['gnorm'])}"
                f" | train_wall {round(time.time() - epoch_start)} | wall "
                f"{round(time.time() - start)}"
            )
        epoch += 1
    logger.info(f"done training in {time.time() - start:.1f} seconds")


def cli_main() -> None:
    main()


if __name__ == "__main__":
    cli_main()
