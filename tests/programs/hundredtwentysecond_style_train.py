"""A hundredtwenty-second training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentysecond-*): speech recognition trained in the way of the
k2-fsa/icefall recipes, pruned_transducer_stateless7/train.py, re-created in plain torch on CPU
(no k2, lhotse, sentencepiece or icefall installed; copied into each run's folder as
pruned_transducer_stateless7/train.py beside asr_datamodule.py, tests/programs/
hundredtwentysecond_asr_datamodule.py). `./pruned_transducer_stateless7/train.py --world-size 2
--num-epochs 2 --start-epoch 1 --use-fp16 1 --exp-dir pruned_transducer_stateless7/exp
--full-libri 0 --max-duration 12 --master-port PORT`: main() spawns the ranks itself with
torch.multiprocessing.spawn(run, args=(world_size, args), nprocs=world_size); run() calls
setup_dist(rank, world_size, params.master_port) (MASTER_ADDR localhost, MASTER_PORT from
--master-port; gloo with this port's 15 s timeout where icefall has nccl) and icefall's
setup_logger (console and exp/log/log-train-<date>-<rank>, '%(asctime)s %(levelname)s
[%(filename)s:%(lineno)d] (rank/world_size) %(message)s'), logs the params dict, builds a tiny
transducer-like model (a conv encoder with 4x subsampling, a stateless decoder, a joiner; the
"simple" loss is CTC over the encoder, the "pruned" loss the joiner's cross-entropy at a uniform
alignment), keeps a float64 model_avg on rank 0, loads exp/epoch-(start_epoch-1).pt when
--start-epoch > 1, wraps the model in DDP(find_unused_parameters=True), runs icefall's
scan_pessimistic_batches_for_oom, then trains with autocast(float16) and a GradScaler (on the CPU
device), Eden's learning rate, icefall's MetricsTracker lines ('Epoch 1, batch 4,
loss[loss=..., simple_loss=..., pruned_loss=..., over N frames. ], tot_loss[...], batch size: 6,
lr: 5.00e-02, grad_scale: 1.0'), its grad-scale check ('grad_scale is too small, exiting'),
validation at batch_idx % valid_interval == 0 with the MetricsTracker all-reduced, rank 0's
epoch-N.pt, 'Done!', a barrier and destroy_process_group. Intervals are scaled to the tiny data
(log_interval 4, valid_interval 8). A fault in the code is chosen by the TQ_CASE environment
variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentysecond.sh after any edit).
"""
# ruff: noqa: UP006, UP035, UP031, UP045, B007, B905, SIM102, SIM300, SIM401, RUF100 (icefall's own code, as it is written)

import argparse
import collections
import copy
import ctypes
import io
import logging
import os
import resource
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from shutil import copyfile
from typing import Any, Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from asr_datamodule import LibriSpeechAsrDataModule, find_pessimistic_batches, str2bool
from torch.nn.parallel import DistributedDataParallel as DDP

LRSchedulerType = Union[torch.optim.lr_scheduler._LRScheduler, "Eden"]


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    hoard_rank: int = -1  # this rank keeps every batch's features until the OOM killer acts
    segv_rank: int = -1  # this rank's native pruned-loss kernel reads address 0
    valid_rank0_only: bool = False  # validation (and its all_reduce) on rank 0 only
    slow_save: bool = False  # rank 0's exp dir is on a throttled network mount


FAULTS = {
    "": Fault(),
    "m1": Fault(hoard_rank=1),
    "s1": Fault(segv_rank=1),
    "v0": Fault(valid_rank0_only=True),
    "w0": Fault(slow_save=True),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]


# ---------------------------------------------------------------- icefall/utils.py, dist.py
class AttributeDict(dict):
    def __getattr__(self, key):
        if key in self:
            return self[key]
        raise AttributeError(f"No such attribute '{key}'")

    def __setattr__(self, key, value):
        self[key] = value

    def __delattr__(self, key):
        if key in self:
            del self[key]
            return
        raise AttributeError(f"No such attribute '{key}'")


def setup_dist(rank, world_size, master_port=None, use_ddp_launch=False, master_addr=None):
    """rank and world_size are used only if use_ddp_launch is False."""
    if "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = "localhost" if master_addr is None else str(master_addr)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = "12354" if master_port is None else str(master_port)
    if use_ddp_launch is False:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=15))  # fmt: skip
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=15))


def cleanup_dist():
    dist.destroy_process_group()


def setup_logger(log_filename: str, log_level: str = "info", use_console: bool = True) -> None:
    now = datetime.now()
    date_time = now.strftime("%Y-%m-%d-%H-%M-%S")
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        rank = dist.get_rank()
        formatter = f"%(asctime)s %(levelname)s [%(filename)s:%(lineno)d] ({rank}/{world_size}) %(message)s"  # noqa  # fmt: skip
        log_filename = f"{log_filename}-{date_time}-{rank}"
    else:
        formatter = "%(asctime)s %(levelname)s [%(filename)s:%(lineno)d] %(message)s"
        log_filename = f"{log_filename}-{date_time}"

    os.makedirs(os.path.dirname(log_filename), exist_ok=True)

    level = logging.ERROR
    if log_level == "debug":
        level = logging.DEBUG
    elif log_level == "info":
        level = logging.INFO
    elif log_level == "warning":
        level = logging.WARNING
    elif log_level == "critical":
        level = logging.CRITICAL

    logging.basicConfig(filename=log_filename, format=formatter, level=level, filemode="w")
    if use_console:
        console = logging.StreamHandler()
        console.setLevel(level)
        console.setFormatter(logging.Formatter(formatter))
        logging.getLogger("").addHandler(console)


def get_env_info() -> Dict[str, Any]:
    return {
        "torch-version": str(torch.__version__),
        "torch-cuda-available": torch.cuda.is_available(),
        "torch-cuda-version": torch.version.cuda,
        "python-version": ".".join(map(str, sys.version_info[:2])),
        "icefall-git-branch": None,
        "icefall-git-sha1": None,
        "k2-version": None,
        "lhotse-version": None,
    }


def fix_random_seed(random_seed: int):
    import random

    random.seed(random_seed)
    torch.manual_seed(random_seed)


class MetricsTracker(collections.defaultdict):
    def __init__(self):
        # Passing the type 'int' to the base-class constructor makes undefined items default
        # to int() which is zero.
        super().__init__(int)

    def __add__(self, other: "MetricsTracker") -> "MetricsTracker":
        ans = MetricsTracker()
        for k, v in self.items():
            ans[k] = v
        for k, v in other.items():
            ans[k] = ans[k] + v
        return ans

    def __mul__(self, alpha: float) -> "MetricsTracker":
        ans = MetricsTracker()
        for k, v in self.items():
            ans[k] = v * alpha
        return ans

    def __str__(self) -> str:
        ans_frames = ""
        for k, v in self.norm_items():
            norm_value = "%.4g" % v
            ans_frames += str(k) + "=" + str(norm_value) + ", "
        ans_frames += "over " + "%.2f" % self["frames"] + " frames. "
        return ans_frames

    def norm_items(self):
        num_frames = self["frames"] if "frames" in self else 1
        ans = []
        for k, v in self.items():
            if k == "frames" or k == "utterances":
                continue
            norm_value = float(v) / num_frames
            ans.append((k, norm_value))
        return ans

    def reduce(self, device):
        """Reduce using torch.distributed, which I believe ensures that all processes get the
        total."""
        keys = sorted(self.keys())
        s = torch.tensor([float(self[k]) for k in keys], device=device)
        dist.all_reduce(s, op=dist.ReduceOp.SUM)
        for k, v in zip(keys, s.cpu().tolist()):
            self[k] = v


class SentencePieceProcessor:
    """This port's stand-in for sentencepiece: one piece a line, letters and the word
    boundary."""

    def load(self, path: str) -> None:
        with open(path) as f:
            self.pieces = [line.rstrip("\n") for line in f]

    def piece_to_id(self, piece: str) -> int:
        return self.pieces.index(piece)

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def encode(self, texts, out_type=int):
        out = []
        for text in texts:
            ids = []
            for w in text.split():
                ids.append(self.pieces.index("\u2581"))
                ids.extend(self.pieces.index(ch) if ch in self.pieces else 2 for ch in w)
            out.append(ids if out_type is int else [self.pieces[i] for i in ids])
        return out


# ---------------------------------------------------------------- optim.py (Eden)
class Eden:
    """lr = base_lr * (((batch**2 + lr_batches**2) / lr_batches**2) ** -0.25 *
    (((epoch**2 + lr_epochs**2) / lr_epochs**2) ** -0.25))"""

    def __init__(self, optimizer, lr_batches: float, lr_epochs: float) -> None:
        self.optimizer = optimizer
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.lr_batches = lr_batches
        self.lr_epochs = lr_epochs
        self.batch = 0
        self.epoch = 0
        self._set_lrs()

    def _set_lrs(self) -> None:
        factor = ((self.batch**2 + self.lr_batches**2) / self.lr_batches**2) ** -0.25 * (
            ((self.epoch**2 + self.lr_epochs**2) / self.lr_epochs**2) ** -0.25
        )
        self._last_lr = [lr * factor for lr in self.base_lrs]
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr

    def get_last_lr(self):
        return self._last_lr

    def step_batch(self, batch: int) -> None:
        self.batch = batch
        self._set_lrs()

    def step_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._set_lrs()

    def state_dict(self):
        return {"batch": self.batch, "epoch": self.epoch, "base_lrs": self.base_lrs}

    def load_state_dict(self, state):
        self.batch, self.epoch, self.base_lrs = state["batch"], state["epoch"], state["base_lrs"]
        self._set_lrs()


# ---------------------------------------------------------------- model
class Conv1dSubsampling(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(in_channels, out_channels, 3, stride=2),
            nn.ReLU(),
            nn.Conv1d(out_channels, out_channels, 3, stride=2),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor):
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        x_lens = ((x_lens - 3) // 2 + 1 - 3) // 2 + 1
        return x, x_lens


class ConvEncoder(nn.Module):
    def __init__(self, num_features: int, d_model: int, num_layers: int) -> None:
        super().__init__()
        self.encoder_embed = Conv1dSubsampling(num_features, d_model)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Conv1d(d_model, d_model, 5, padding=2), nn.GELU())
            for _ in range(num_layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(num_layers))

    def forward(self, x, x_lens):
        x, x_lens = self.encoder_embed(x, x_lens)
        for layer, norm in zip(self.layers, self.norms):
            x = norm(x + layer(x.transpose(1, 2)).transpose(1, 2))
        return x, x_lens


class Decoder(nn.Module):
    """Stateless decoder: an embedding of the previous context_size tokens."""

    def __init__(self, vocab_size: int, decoder_dim: int, blank_id: int, context_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, decoder_dim, padding_idx=blank_id)
        self.conv = nn.Conv1d(decoder_dim, decoder_dim, context_size, groups=decoder_dim // 4)
        self.context_size = context_size

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        emb = self.embedding(y).transpose(1, 2)
        emb = F.pad(emb, (self.context_size - 1, 0))
        return F.relu(self.conv(emb).transpose(1, 2))


class Joiner(nn.Module):
    def __init__(self, encoder_dim: int, decoder_dim: int, joiner_dim: int, vocab_size: int):
        super().__init__()
        self.encoder_proj = nn.Linear(encoder_dim, joiner_dim)
        self.decoder_proj = nn.Linear(decoder_dim, joiner_dim)
        self.output_linear = nn.Linear(joiner_dim, vocab_size)

    def forward(self, encoder_out, decoder_out):
        return self.output_linear(
            torch.tanh(self.encoder_proj(encoder_out) + self.decoder_proj(decoder_out))
        )


def _pruned_rnnt_native(logits: torch.Tensor) -> torch.Tensor:
    """The pruned loss's native kernel (k2.rnnt_loss_pruned in icefall)."""
    if FAULT.segv_rank == _RANK[0] and _STEP[0] == 5:
        ctypes.string_at(0)  # reads a NULL pointer on this rank
    return logits


_RANK = [0]
_STEP = [0]


class Transducer(nn.Module):
    def __init__(self, encoder, decoder, joiner, encoder_dim, vocab_size, blank_id=0):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.joiner = joiner
        self.blank_id = blank_id
        self.simple_am_proj = nn.Linear(encoder_dim, vocab_size)

    def forward(self, x, x_lens, y, y_lens):
        encoder_out, x_lens = self.encoder(x, x_lens)
        # the simple loss: CTC over the encoder's projection
        lprobs = self.simple_am_proj(encoder_out).float().log_softmax(-1)
        targets = torch.cat([t[:n] for t, n in zip(y, y_lens)])
        simple_loss = F.ctc_loss(
            lprobs.transpose(0, 1), targets, x_lens, y_lens, blank=self.blank_id, reduction="sum"
        )
        # the pruned loss: the joiner at a uniform alignment of the tokens over the frames
        sos_y = F.pad(y, (1, 0), value=self.blank_id)[:, :-1]
        decoder_out = self.decoder(sos_y)
        u = torch.arange(y.size(1))
        t = ((u[None, :] * 2 + 1) * x_lens[:, None]) // (2 * y_lens[:, None].clamp(min=1))
        t = t.clamp(max=encoder_out.size(1) - 1)
        enc = torch.gather(encoder_out, 1, t[..., None].expand(-1, -1, encoder_out.size(2)))
        logits = _pruned_rnnt_native(self.joiner(enc, decoder_out).float())
        mask = u[None, :] < y_lens[:, None]
        pruned_loss = F.cross_entropy(logits[mask], y[mask], reduction="sum")
        return simple_loss, pruned_loss


def get_transducer_model(params: AttributeDict) -> nn.Module:
    encoder = ConvEncoder(params.feature_dim, params.encoder_dim, params.num_encoder_layers)
    decoder = Decoder(params.vocab_size, params.decoder_dim, params.blank_id, params.context_size)
    joiner = Joiner(params.encoder_dim, params.decoder_dim, params.joiner_dim, params.vocab_size)
    return Transducer(encoder, decoder, joiner, params.encoder_dim, params.vocab_size)


# ---------------------------------------------------------------- train.py
def get_parser():
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world-size", type=int, default=1,
                        help="Number of GPUs for DDP training.")  # fmt: skip
    parser.add_argument("--master-port", type=int, default=12354,
                        help="Master port to use for DDP training.")  # fmt: skip
    parser.add_argument("--tensorboard", type=str2bool, default=False,
                        help="Should various information be logged in tensorboard.")  # fmt: skip
    parser.add_argument("--num-epochs", type=int, default=30, help="Number of epochs to train.")
    parser.add_argument(
        "--start-epoch",
        type=int,
        default=1,
        help="""Resume training from this epoch. It should be positive.
        If larger than 1, it will load checkpoint from
        exp-dir/epoch-{start_epoch-1}.pt
        """,
    )
    parser.add_argument("--start-batch", type=int, default=0)
    parser.add_argument("--exp-dir", type=str, default="pruned_transducer_stateless7/exp")
    parser.add_argument("--bpe-model", type=str, default="data/lang_bpe_500/bpe.model")
    parser.add_argument("--base-lr", type=float, default=0.005,
                        help="The base learning rate (this port's Adam).")  # fmt: skip
    parser.add_argument("--lr-batches", type=float, default=5000)
    parser.add_argument("--lr-epochs", type=float, default=3.5)
    parser.add_argument("--context-size", type=int, default=2)
    parser.add_argument("--prune-range", type=int, default=5)
    parser.add_argument("--lm-scale", type=float, default=0.25)
    parser.add_argument("--am-scale", type=float, default=0.0)
    parser.add_argument("--simple-loss-scale", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42, help="The seed for random generators.")
    parser.add_argument("--print-diagnostics", type=str2bool, default=False)
    parser.add_argument("--inf-check", type=str2bool, default=False)
    parser.add_argument("--save-every-n", type=int, default=2000)
    parser.add_argument("--keep-last-k", type=int, default=30)
    parser.add_argument("--average-period", type=int, default=4,
                        help="Update the averaged model, namely `model_avg`, after processing "
                        "this number of batches. `model_avg` is a separate version of model, "
                        "in which each floating-point parameter is the average of all the "
                        "parameters from the start of training.")  # fmt: skip
    parser.add_argument("--use-fp16", type=str2bool, default=False,
                        help="Whether to use half precision training.")  # fmt: skip
    return parser


def get_params() -> AttributeDict:
    params = AttributeDict(
        {
            "best_train_loss": float("inf"),
            "best_valid_loss": float("inf"),
            "best_train_epoch": -1,
            "best_valid_epoch": -1,
            "batch_idx_train": 0,
            "log_interval": 4,
            "reset_interval": 20,
            "valid_interval": 16,
            # parameters for the model
            "feature_dim": 16,
            "subsampling_factor": 4,
            "encoder_dim": 48,
            "num_encoder_layers": 2,
            "decoder_dim": 32,
            "joiner_dim": 48,
            # parameters for Noam
            "warm_step": 40,
            "env_info": get_env_info(),
        }
    )
    return params


def load_checkpoint(filename, model, model_avg=None, optimizer=None, scheduler=None,
                    scaler=None, sampler=None, strict=False) -> Dict[str, Any]:  # fmt: skip
    logging.info(f"Loading checkpoint from {filename}")
    checkpoint = torch.load(filename, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["model"], strict=strict)
    checkpoint.pop("model")
    if model_avg is not None and "model_avg" in checkpoint:
        logging.info("Loading averaged model")
        model_avg.load_state_dict(checkpoint["model_avg"], strict=strict)
        checkpoint.pop("model_avg")
    return checkpoint


def load_checkpoint_if_available(params, model, model_avg=None, optimizer=None,
                                 scheduler=None) -> Optional[Dict[str, Any]]:  # fmt: skip
    if params.start_batch > 0:
        filename = params.exp_dir / f"checkpoint-{params.start_batch}.pt"
    elif params.start_epoch > 1:
        filename = params.exp_dir / f"epoch-{params.start_epoch-1}.pt"  # fmt: skip
    else:
        return None

    assert filename.is_file(), f"{filename} does not exist!"

    saved_params = load_checkpoint(filename, model=model, model_avg=model_avg)

    keys = ["best_train_epoch", "best_valid_epoch", "batch_idx_train", "best_train_loss",
            "best_valid_loss"]  # fmt: skip
    for k in keys:
        params[k] = saved_params[k]

    if params.start_batch > 0:
        if "cur_epoch" in saved_params:
            params["start_epoch"] = saved_params["cur_epoch"]

    return saved_params


def _write_to_exp_dir(checkpoint: Dict[str, Any], filename: Path, rank: int) -> None:
    if not FAULT.slow_save:
        torch.save(checkpoint, filename)
        return
    # the exp dir is on a throttled network mount: the bytes trickle out
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    data = buf.getvalue()
    chunk = 16384
    pause = 45.0 / max(1, len(data) // chunk)
    with open(filename, "wb") as f:
        for k in range(0, len(data), chunk):
            f.write(data[k : k + chunk])
            f.flush()
            time.sleep(pause)


def save_checkpoint(params, model, model_avg=None, optimizer=None, scheduler=None,
                    sampler=None, scaler=None, rank: int = 0) -> None:  # fmt: skip
    """Save model, optimizer, scheduler and training stats to file."""
    if rank != 0:
        return
    filename = params.exp_dir / f"epoch-{params.cur_epoch}.pt"
    logging.info(f"Saving checkpoint to {filename}")
    if isinstance(model, DDP):
        model = model.module
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "grad_scaler": scaler.state_dict() if scaler is not None else None,
        "sampler": sampler.state_dict() if sampler is not None else None,
    }
    if model_avg is not None:
        checkpoint["model_avg"] = model_avg.to(torch.float32).state_dict()
    for k, v in params.items():
        assert k not in checkpoint
        checkpoint[k] = v
    _write_to_exp_dir(checkpoint, filename, rank)
    if params.best_train_epoch == params.cur_epoch:
        best_train_filename = params.exp_dir / "best-train-loss.pt"
        copyfile(src=filename, dst=best_train_filename)
    if params.best_valid_epoch == params.cur_epoch:
        best_valid_filename = params.exp_dir / "best-valid-loss.pt"
        copyfile(src=filename, dst=best_valid_filename)


def update_averaged_model(params, model_cur, model_avg) -> None:
    weight_cur = params.average_period / params.batch_idx_train
    weight_avg = 1 - weight_cur
    cur = model_cur.module.state_dict() if isinstance(model_cur, DDP) else model_cur.state_dict()
    avg = model_avg.state_dict()
    for k in avg:
        if avg[k].is_floating_point():
            avg[k].mul_(weight_avg).add_(cur[k].to(avg[k].dtype), alpha=weight_cur)


def compute_loss(params, model, sp, batch, is_training: bool) -> Tuple[torch.Tensor, MetricsTracker]:  # fmt: skip
    device = model.device if isinstance(model, DDP) else next(model.parameters()).device
    feature = batch["inputs"]
    # at entry, feature is (N, T, C)
    assert feature.ndim == 3
    feature = feature.to(device)

    supervisions = batch["supervisions"]
    feature_lens = supervisions["num_frames"].to(device)

    batch_idx_train = params.batch_idx_train
    warm_step = params.warm_step

    texts = batch["supervisions"]["text"]
    ids = sp.encode(texts, out_type=int)
    y_lens = torch.tensor([len(t) for t in ids])
    y = torch.zeros(len(ids), int(y_lens.max()), dtype=torch.long)
    for k, t in enumerate(ids):
        y[k, : len(t)] = torch.tensor(t)

    with torch.set_grad_enabled(is_training):
        simple_loss, pruned_loss = model(x=feature, x_lens=feature_lens, y=y, y_lens=y_lens)

        s = params.simple_loss_scale
        # take down the scale on the simple loss from 1.0 at the start to params.simple_loss
        # scale by warm_step.
        simple_loss_scale = (
            s
            if batch_idx_train >= warm_step
            else 1.0 - (batch_idx_train / warm_step) * (1.0 - s)
        )  # fmt: skip
        pruned_loss_scale = (
            1.0 if batch_idx_train >= warm_step else 0.1 + 0.9 * (batch_idx_train / warm_step)
        )

        loss = simple_loss_scale * simple_loss + pruned_loss_scale * pruned_loss

    assert loss.requires_grad == is_training

    info = MetricsTracker()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info["frames"] = (feature_lens // params.subsampling_factor).sum().item()

    # Note: We use reduction=sum while computing the loss.
    info["loss"] = loss.detach().cpu().item()
    info["simple_loss"] = simple_loss.detach().cpu().item()
    info["pruned_loss"] = pruned_loss.detach().cpu().item()

    return loss, info


def compute_validation_loss(params, model, sp, valid_dl, world_size: int = 1) -> MetricsTracker:
    """Run the validation process."""
    model.eval()

    tot_loss = MetricsTracker()

    for batch_idx, batch in enumerate(valid_dl):
        loss, loss_info = compute_loss(params=params, model=model, sp=sp, batch=batch,
                                       is_training=False)  # fmt: skip
        assert loss.requires_grad is False
        tot_loss = tot_loss + loss_info

    if world_size > 1:
        tot_loss.reduce(loss.device)

    loss_value = tot_loss["loss"] / tot_loss["frames"]
    if loss_value < params.best_valid_loss:
        params.best_valid_epoch = params.cur_epoch
        params.best_valid_loss = loss_value

    return tot_loss


def max_memory_mb() -> int:
    """This CPU port's torch.cuda.max_memory_allocated(): the peak resident set."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1000


def train_one_epoch(params, model, optimizer, scheduler, sp, train_dl, valid_dl, scaler,
                    model_avg=None, tb_writer=None, world_size: int = 1,
                    rank: int = 0) -> None:  # fmt: skip
    model.train()

    tot_loss = MetricsTracker()
    hoard = []

    for batch_idx, batch in enumerate(train_dl):
        params.batch_idx_train += 1
        batch_size = len(batch["supervisions"]["text"])
        _STEP[0] = batch_idx

        if rank == FAULT.hoard_rank and params.cur_epoch == 1 and batch_idx >= 2:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

        try:
            with torch.autocast("cpu", dtype=torch.float16, enabled=params.use_fp16):
                loss, loss_info = compute_loss(params=params, model=model, sp=sp, batch=batch,
                                               is_training=True)  # fmt: skip
            # summary stats
            tot_loss = (tot_loss * (1 - 1 / params.reset_interval)) + loss_info

            # NOTE: We use reduction==sum and loss is computed over utterances in the batch
            # and there is no normalization to it so far.
            scaler.scale(loss).backward()
            scheduler.step_batch(params.batch_idx_train)

            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        except:  # noqa
            display_and_save_batch(batch, params=params, sp=sp)
            raise

        if (
            rank == 0
            and params.batch_idx_train > 0
            and params.batch_idx_train % params.average_period == 0
        ):
            update_averaged_model(params=params, model_cur=model, model_avg=model_avg)

        if batch_idx % 100 == 0 and params.use_fp16:
            # If the grad scale was less than 1, try increasing it. The _growth_interval of
            # the grad scaler is configurable, but we can't configure it to have different
            # behavior depending on the current grad scale.
            cur_grad_scale = scaler._scale.item()
            if cur_grad_scale < 1.0 or (cur_grad_scale < 8.0 and batch_idx % 400 == 0):
                scaler.update(cur_grad_scale * 2.0)
            if cur_grad_scale < 0.01:
                logging.warning(f"Grad scale is small: {cur_grad_scale}")
            if cur_grad_scale < 1.0e-05:
                raise RuntimeError(f"grad_scale is too small, exiting: {cur_grad_scale}")

        if batch_idx % params.log_interval == 0:
            cur_lr = scheduler.get_last_lr()[0]
            cur_grad_scale = scaler._scale.item() if params.use_fp16 else 1.0

            logging.info(
                f"Epoch {params.cur_epoch}, "
                f"batch {batch_idx}, loss[{loss_info}], "
                f"tot_loss[{tot_loss}], batch size: {batch_size}, "
                f"lr: {cur_lr:.2e}, " + (f"grad_scale: {cur_grad_scale}" if params.use_fp16 else "")
            )

        if batch_idx % params.valid_interval == 0 and not params.print_diagnostics:
            if rank == 0 or not FAULT.valid_rank0_only:
                logging.info("Computing validation loss")
                valid_info = compute_validation_loss(params=params, model=model, sp=sp,
                                                     valid_dl=valid_dl,
                                                     world_size=world_size)  # fmt: skip
                model.train()
                logging.info(f"Epoch {params.cur_epoch}, validation: {valid_info}")
                logging.info(f"Maximum memory allocated so far is {max_memory_mb()}MB")

    loss_value = tot_loss["loss"] / tot_loss["frames"]
    params.train_loss = loss_value
    if params.train_loss < params.best_train_loss:
        params.best_train_epoch = params.cur_epoch
        params.best_train_loss = params.train_loss


def display_and_save_batch(batch: dict, params: AttributeDict, sp) -> None:
    """Display the batch statistics and save the batch into disk."""
    from uuid import uuid4  # lhotse.utils.uuid4 in icefall

    filename = f"{params.exp_dir}/batch-{uuid4()}.pt"
    logging.info(f"Saving batch to {filename}")
    torch.save(batch, filename)

    supervisions = batch["supervisions"]
    features = batch["inputs"]

    logging.info(f"features shape: {features.shape}")

    y = sp.encode(supervisions["text"], out_type=int)
    num_tokens = sum(len(i) for i in y)
    logging.info(f"num tokens: {num_tokens}")


def scan_pessimistic_batches_for_oom(model, train_dl, optimizer, sp, params) -> None:
    logging.info("Sanity check -- see if any of the batches in epoch 1 would cause OOM.")
    batches, crit_values = find_pessimistic_batches(train_dl.sampler)
    for criterion, cuts in batches.items():
        batch = train_dl.dataset[cuts]
        try:
            with torch.autocast("cpu", dtype=torch.float16, enabled=params.use_fp16):
                loss, _ = compute_loss(params=params, model=model, sp=sp, batch=batch,
                                       is_training=True)  # fmt: skip
            loss.backward()
            optimizer.zero_grad()
        except Exception as e:
            if "CUDA out of memory" in str(e):
                logging.error(
                    "Your GPU ran out of memory with the current max_duration setting. We "
                    "recommend decreasing max_duration and trying again.\n"
                    f"Failing criterion: {criterion} (={crit_values[criterion]}) ..."
                )
            raise
        logging.info(f"Maximum memory allocated so far is {max_memory_mb()}MB")


def run(rank, world_size, args):
    """
    Args:
      rank:
        It is a value between 0 and `world_size-1`, which is passed automatically by
        `mp.spawn()` in :func:`main`. The node with rank 0 is responsible for saving checkpoint.
      world_size:
        Number of GPUs for DDP training.
      args:
        The return value of get_parser().parse_args()
    """
    params = get_params()
    params.update(vars(args))
    if params.full_libri is False:
        params.valid_interval = 16
    _RANK[0] = rank

    fix_random_seed(params.seed)
    if world_size > 1:
        setup_dist(rank, world_size, params.master_port)

    setup_logger(f"{params.exp_dir}/log/log-train")
    logging.info("Training started")

    if args.tensorboard and rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        tb_writer = SummaryWriter(log_dir=f"{params.exp_dir}/tensorboard")
    else:
        tb_writer = None

    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", rank)
    logging.info(f"Device: {device}")

    sp = SentencePieceProcessor()
    sp.load(params.bpe_model)

    # <blk> is defined in local/train_bpe_model.py
    params.blank_id = sp.piece_to_id("<blk>")
    params.vocab_size = sp.get_piece_size()

    logging.info(params)

    logging.info("About to create model")
    model = get_transducer_model(params)

    num_param = sum([p.numel() for p in model.parameters()])
    logging.info(f"Number of model parameters: {num_param}")

    assert params.save_every_n >= params.average_period
    model_avg: Optional[nn.Module] = None
    if rank == 0:
        # model_avg is only used with rank 0
        model_avg = copy.deepcopy(model).to(torch.float64)

    assert params.start_epoch > 0, params.start_epoch
    checkpoints = load_checkpoint_if_available(params=params, model=model, model_avg=model_avg)

    model.to(device)
    if world_size > 1:
        logging.info("Using DDP")
        model = DDP(model, find_unused_parameters=True)

    optimizer = torch.optim.Adam(model.parameters(), lr=params.base_lr)
    scheduler = Eden(optimizer, params.lr_batches, params.lr_epochs)

    if checkpoints and "optimizer" in checkpoints:
        logging.info("Loading optimizer state dict")
        optimizer.load_state_dict(checkpoints["optimizer"])

    if checkpoints and "scheduler" in checkpoints and checkpoints["scheduler"] is not None:
        logging.info("Loading scheduler state dict")
        scheduler.load_state_dict(checkpoints["scheduler"])

    librispeech = LibriSpeechAsrDataModule(args)

    train_cuts = librispeech.train_clean_100_cuts()
    if params.full_libri:
        train_cuts += librispeech.train_clean_360_cuts()

    def remove_short_and_long_utt(c):
        # Keep only utterances with duration between 1 second and 20 seconds
        if c.duration < 1.0 or c.duration > 20.0:
            logging.warning(f"Exclude cut with ID {c.id} from training. Duration: {c.duration}")
            return False

        # In pruned RNN-T, we require that T >= S where T is the number of feature frames
        # after subsampling and S is the number of tokens in the utterance
        T = ((c.num_frames - 3) // 2 + 1 - 3) // 2 + 1
        tokens = sp.encode([c.supervisions[0].text], out_type=str)[0]

        if T < len(tokens):
            logging.warning(
                f"Exclude cut with ID {c.id} from training. "
                f"Number of frames (before subsampling): {c.num_frames}. "
                f"Number of frames (after subsampling): {T}. "
                f"Text: {c.supervisions[0].text}. "
                f"Tokens: {tokens}. "
                f"Number of tokens: {len(tokens)}"
            )
            return False

        return True

    train_cuts = train_cuts.filter(remove_short_and_long_utt)

    if params.start_batch > 0 and checkpoints and "sampler" in checkpoints:
        # We only load the sampler's state dict when it loads a checkpoint saved in the middle
        # of an epoch
        sampler_state_dict = checkpoints["sampler"]
    else:
        sampler_state_dict = None

    train_dl = librispeech.train_dataloaders(train_cuts, sampler_state_dict=sampler_state_dict)

    valid_cuts = librispeech.dev_clean_cuts()
    valid_cuts += librispeech.dev_other_cuts()
    valid_dl = librispeech.valid_dataloaders(valid_cuts)

    if not params.print_diagnostics:
        scan_pessimistic_batches_for_oom(model=model, train_dl=train_dl, optimizer=optimizer,
                                         sp=sp, params=params)  # fmt: skip

    scaler = torch.amp.GradScaler("cpu", enabled=params.use_fp16, init_scale=1.0)
    if checkpoints and "grad_scaler" in checkpoints and checkpoints["grad_scaler"]:
        logging.info("Loading grad scaler state dict")
        scaler.load_state_dict(checkpoints["grad_scaler"])

    for epoch in range(params.start_epoch, params.num_epochs + 1):
        scheduler.step_epoch(epoch - 1)
        fix_random_seed(params.seed + epoch - 1)
        train_dl.sampler.set_epoch(epoch - 1)

        if tb_writer is not None:
            tb_writer.add_scalar("train/epoch", epoch, params.batch_idx_train)

        params.cur_epoch = epoch

        train_one_epoch(params=params, model=model, model_avg=model_avg, optimizer=optimizer,
                        scheduler=scheduler, sp=sp, train_dl=train_dl, valid_dl=valid_dl,
                        scaler=scaler, tb_writer=tb_writer, world_size=world_size,
                        rank=rank)  # fmt: skip

        if params.print_diagnostics:
            break

        save_checkpoint(params=params, model=model, model_avg=model_avg, optimizer=optimizer,
                        scheduler=scheduler, sampler=train_dl.sampler, scaler=scaler,
                        rank=rank)  # fmt: skip
        if model_avg is not None:
            model_avg.to(torch.float64)

    logging.info("Done!")

    if world_size > 1:
        torch.distributed.barrier()
        cleanup_dist()


def main():
    parser = get_parser()
    LibriSpeechAsrDataModule.add_arguments(parser)
    args = parser.parse_args()
    args.exp_dir = Path(args.exp_dir)

    world_size = args.world_size
    assert world_size >= 1
    if world_size > 1:
        mp.spawn(run, args=(world_size, args), nprocs=world_size, join=True)
    else:
        run(rank=0, world_size=1, args=args)


torch.set_num_threads(1)
torch.set_num_interop_threads(1)

if __name__ == "__main__":
    main()
