"""A seventeenth training-program style for the generalisation fixtures
(tests/fixtures/real/seventeenth-*): an image-classification training script in the way of timm's
train.py, raw torch on CPU with gloo. timm's flags and `--config` file merged into argparse
defaults, `init_distributed_device` from torchrun's (or the legacy launcher's) environment, timm's
log lines (INFO bare, other levels prefixed), a tiny BatchNorm convnet (`resnet10t`/`resnet14t`),
a seeded synthetic image set kept as encoded bytes and decoded per sample, DistributedSampler for
training and an ordered sampler for validation, native AMP (bf16 autocast on CPU), a model EMA,
`distribute_bn` at each epoch end, `reduce_tensor` of validation metrics, and a CheckpointSaver
on rank 0 (last / model_best / checkpoint-N with --checkpoint-hist). A fault is named by what it
does, never by its name, and the `--fault` value is never printed (re-capture with
tests/fixtures/real/capture_seventeenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import logging
import math
import operator
import os
import signal
import sys
import time
import warnings
from collections import OrderedDict
from contextlib import nullcontext
from copy import deepcopy
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

_logger = logging.getLogger("train")
_ckpt_logger = logging.getLogger("timm.utils.checkpoint_saver")
_model_logger = logging.getLogger("timm.models._helpers")

IMG = 16


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    loud: bool = False  # the deprecation and performance warnings such a script prints
    extra_bn_rank: int = -1  # this rank attaches a feature-stats BatchNorm after DDP wraps
    val_unpadded: bool = False  # the validation sampler deals indices[rank::world], no padding
    corrupt_for_rank: int = -1  # the sample this rank's sampler gives at position 3 is cut short
    blank_for_rank: int = -1  # ... is a blank image (per-image standardisation divides by 0)
    worker_segv_rank: int = -1  # a DataLoader worker of this rank crashes in a native decoder
    rss_kill_rank: int = -1  # this rank caches decoded batches until the OOM killer acts
    quantile_rank: int = -1  # this rank's loss-spike filter runs (torch.quantile on bf16 logits)
    index_tmp: bool = False  # rank 0 leaves the shard index as .tmp; the others wait for it
    old_ckpt: bool = False  # the saver stores args as an argparse.Namespace (older versions)


FAULTS: dict[str, Fault] = {
    "plain": Fault(),
    "w": Fault(loud=True),
    "xb": Fault(extra_bn_rank=0),
    "vu": Fault(val_unpadded=True),
    "cs": Fault(corrupt_for_rank=1),
    "bk": Fault(blank_for_rank=1),
    "sg": Fault(worker_segv_rank=0),
    "rk": Fault(rss_kill_rank=2),
    "qt": Fault(quantile_rank=1),
    "ix": Fault(index_tmp=True),
    "ns": Fault(old_ckpt=True),
}

config_parser = argparse.ArgumentParser(description="Training Config", add_help=False)
config_parser.add_argument(
    "-c",
    "--config",
    default="",
    type=str,
    metavar="FILE",
    help="YAML config file specifying default arguments",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    group = parser.add_argument_group("Dataset parameters")
    parser.add_argument("data", nargs="?", metavar="DIR", const=None, help="path to dataset")
    group.add_argument("--dataset", metavar="NAME", default="synthetic")
    group.add_argument("--train-split", default="train")
    group.add_argument("--val-split", default="validation")
    group = parser.add_argument_group("Model parameters")
    group.add_argument("--model", default="resnet10t", type=str, metavar="MODEL")
    group.add_argument("--pretrained", action="store_true", default=False)
    group.add_argument("--initial-checkpoint", default="", type=str, metavar="PATH")
    group.add_argument("--resume", default="", type=str, metavar="PATH")
    group.add_argument("--no-resume-opt", action="store_true", default=False)
    group.add_argument("--num-classes", type=int, default=10, metavar="N")
    group.add_argument("-b", "--batch-size", type=int, default=8, metavar="N")
    group.add_argument("-vb", "--validation-batch-size", type=int, default=None, metavar="N")
    group.add_argument("--channels-last", action="store_true", default=False)
    group = parser.add_argument_group("Optimizer parameters")
    group.add_argument("--opt", default="sgd", type=str, metavar="OPTIMIZER")
    group.add_argument("--momentum", type=float, default=0.9, metavar="M")
    group.add_argument("--weight-decay", type=float, default=2e-5)
    group.add_argument("--clip-grad", type=float, default=None, metavar="NORM")
    group = parser.add_argument_group("Learning rate schedule parameters")
    group.add_argument("--sched", type=str, default="cosine", metavar="SCHEDULER")
    group.add_argument("--lr", type=float, default=0.05, metavar="LR")
    group.add_argument("--min-lr", type=float, default=0, metavar="LR")
    group.add_argument("--epochs", type=int, default=2, metavar="N")
    group.add_argument("--start-epoch", default=None, type=int, metavar="N")
    group.add_argument("--warmup-epochs", type=int, default=0, metavar="N")
    group.add_argument("--warmup-lr", type=float, default=1e-5, metavar="LR")
    group = parser.add_argument_group("Batch norm parameters")
    group.add_argument("--sync-bn", action="store_true", default=False)
    group.add_argument("--dist-bn", type=str, default="reduce")
    group = parser.add_argument_group("Model exponential moving average parameters")
    group.add_argument("--model-ema", action="store_true", default=False)
    group.add_argument("--model-ema-decay", type=float, default=0.9998)
    group = parser.add_argument_group("Miscellaneous parameters")
    group.add_argument("--seed", type=int, default=42, metavar="S")
    group.add_argument("--log-interval", type=int, default=50, metavar="N")
    group.add_argument("--recovery-interval", type=int, default=0, metavar="N")
    group.add_argument("--checkpoint-hist", type=int, default=10, metavar="N")
    group.add_argument("-j", "--workers", type=int, default=0, metavar="N")
    group.add_argument("--amp", action="store_true", default=False)
    group.add_argument("--amp-dtype", default="bfloat16", type=str)
    group.add_argument("--no-prefetcher", action="store_true", default=False)
    group.add_argument("--output", default="", type=str, metavar="PATH")
    group.add_argument("--experiment", default="", type=str, metavar="NAME")
    group.add_argument("--eval-metric", default="top1", type=str, metavar="EVAL_METRIC")
    group.add_argument("--dist-timeout", type=float, default=1800.0, help=argparse.SUPPRESS)
    group.add_argument("--local_rank", "--local-rank", default=0, type=int)
    group.add_argument("--fault", default="plain", help=argparse.SUPPRESS)
    return parser


def read_config(path: str) -> dict[str, Any]:
    """timm's yaml.safe_load of a flat `key: value` file (PyYAML is not in this venv)."""
    cfg: dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, value = line.partition(":")
            value = value.strip()
            parsed: Any = value
            if value in ("true", "false"):
                parsed = value == "true"
            else:
                for cast in (int, float):
                    try:
                        parsed = cast(value)
                        break
                    except ValueError:
                        pass
            cfg[key.strip()] = parsed
    return cfg


def _parse_args() -> tuple[argparse.Namespace, str]:
    parser = build_parser()
    args_config, remaining = config_parser.parse_known_args()
    if args_config.config:
        parser.set_defaults(**read_config(args_config.config))
    args = parser.parse_args(remaining)
    args_text = "\n".join(f"{k}: {v}" for k, v in sorted(vars(args).items()) if k != "fault")
    return args, args_text


class FormatterNoInfo(logging.Formatter):
    """timm's formatter: INFO lines bare, other levels prefixed by their level name."""

    def __init__(self, fmt: str = "%(levelname)s: %(message)s") -> None:
        logging.Formatter.__init__(self, fmt)

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO:
            return str(record.getMessage())
        return logging.Formatter.format(self, record)


def setup_default_logging(default_level: int = logging.INFO) -> None:
    console_handler = logging.StreamHandler()
    console_handler.setFormatter(FormatterNoInfo())
    logging.root.addHandler(console_handler)
    logging.root.setLevel(default_level)


def is_primary(args: argparse.Namespace) -> bool:
    return bool(args.rank == 0)


def init_distributed_device(args: argparse.Namespace) -> torch.device:
    args.distributed = False
    args.world_size = 1
    args.rank = 0
    args.local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(
            backend="gloo", init_method="env://", timeout=timedelta(seconds=args.dist_timeout)
        )
        args.world_size = dist.get_world_size()
        args.rank = dist.get_rank()
        args.distributed = True
    args.device = "cpu"
    return torch.device("cpu")


# ---------------------------------------------------------------- model
class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)) + shortcut)


class ResNet(nn.Module):
    """A 'tiered stem' resnet, tiny: timm's resnet10t/14t shapes scaled down."""

    def __init__(self, widths: list[int], num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks = []
        inplanes = widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(inplanes, w, 1 if i == 0 else 2))
            inplanes = w
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, num_classes)
        self.num_features = inplanes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = x.mean((2, 3))
        if hasattr(self, "feature_stats"):
            x = self.feature_stats(x)
        return self.fc(x)


MODELS = {"resnet10t": [8, 16], "resnet14t": [8, 16, 24]}


def create_model(name: str, num_classes: int) -> ResNet:
    if name not in MODELS:
        raise RuntimeError(f"Unknown model ({name})")
    return ResNet(MODELS[name], num_classes)


# ---------------------------------------------------------------- data
class SyntheticImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Seeded 3x16x16 images kept encoded (uint8 bytes) as an image folder keeps files; decoded
    and standardised per image in __getitem__."""

    def __init__(self, n: int, seed: int, num_classes: int, bad: dict[int, bytes]) -> None:
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, num_classes, (n,), generator=g).tolist()
        self.samples: list[bytes] = []
        for t in self.targets:
            img = torch.randint(0, 256, (3, IMG, IMG), generator=g, dtype=torch.uint8)
            img[t % 3] //= 2  # a class-dependent tint, so there is something to learn
            self.samples.append(bytes(img.flatten().tolist()))
        for i, raw in bad.items():
            self.samples[i] = raw
        self.fault: Fault = Fault()
        self.decoded: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raw = self.samples[index]
        info = torch.utils.data.get_worker_info()
        on_victim = self.fault.worker_segv_rank == int(os.environ.get("RANK", "0"))
        if info is not None and on_victim and index % 7 == 5:
            os.kill(os.getpid(), signal.SIGSEGV)  # the native decoder reads past its buffer
        img = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, IMG, IMG).float()
        img = (img - img.mean()) / img.std()
        return img, self.targets[index]


class OrderedDistributedSampler(Sampler[int]):
    """timm's validation sampler: every rank gets the same number of indices (padded)."""

    def __init__(self, dataset: Dataset[Any], num_replicas: int, rank: int, pad: bool) -> None:
        self.n = len(dataset)  # type: ignore[arg-type]
        self.num_replicas, self.rank, self.pad = num_replicas, rank, pad
        self.num_samples = math.ceil(self.n / num_replicas)

    def __iter__(self) -> Any:
        indices = list(range(self.n))
        if self.pad:
            indices += indices[: self.num_samples * self.num_replicas - len(indices)]
        return iter(indices[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return len(
            range(
                self.rank,
                self.num_samples * self.num_replicas if self.pad else self.n,
                self.num_replicas,
            )
        )


def bad_samples(args: argparse.Namespace, fault: Fault, n: int) -> dict[int, bytes]:
    """The sample a rank's sampler yields at position 3 of epoch 0 (every rank computes it)."""
    bad: dict[int, bytes] = {}
    for victim, raw in (
        (fault.corrupt_for_rank, b"\xff" * 512),
        (fault.blank_for_rank, b"\x80" * (3 * IMG * IMG)),
    ):
        if victim >= 0 and victim < args.world_size:
            s = DistributedSampler(
                range(n),
                num_replicas=args.world_size,
                rank=victim,
                shuffle=True,
                seed=args.seed,
                drop_last=True,
            )
            bad[list(s)[3]] = raw
    return bad


def wait_for_shard_index(args: argparse.Namespace, fault: Fault, output_dir: str) -> None:
    """Each node's local rank 0 writes the shard index once; its other ranks wait for it."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "shard_index.txt")
    if args.local_rank == 0:
        with open(path + ".tmp", "w") as f:
            f.write("train 96\nvalidation 32\n")
        if not fault.index_tmp:
            os.replace(path + ".tmp", path)
        return
    while not os.path.exists(path):
        time.sleep(0.5)


# ---------------------------------------------------------------- utilities
class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(
    output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)
) -> list[torch.Tensor]:
    maxk = min(max(topk), output.size()[1])
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.reshape(1, -1).expand_as(pred))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / batch_size for k in topk]


def reduce_tensor(tensor: torch.Tensor, n: int) -> torch.Tensor:
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    rt /= n
    return rt


def distribute_bn(model: nn.Module, world_size: int, reduce: bool = False) -> None:
    # ensure every node has the same running bn stats
    for bn_name, bn_buf in unwrap_model(model).named_buffers(recurse=True):
        if ("running_mean" in bn_name) or ("running_var" in bn_name):
            if reduce:
                dist.all_reduce(bn_buf, op=dist.ReduceOp.SUM)
                bn_buf /= float(world_size)
            else:
                dist.broadcast(bn_buf, 0)


def unwrap_model(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, NativeDDP) else model


class ModelEmaV2(nn.Module):
    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for ema_v, model_v in zip(
            self.module.state_dict().values(), model.state_dict().values(), strict=True
        ):
            ema_v.copy_(self.decay * ema_v + (1.0 - self.decay) * model_v)


class CosineLRScheduler:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        t_initial: int,
        lr_min: float,
        warmup_t: int,
        warmup_lr_init: float,
    ) -> None:
        self.optimizer, self.t_initial, self.lr_min = optimizer, t_initial, lr_min
        self.warmup_t, self.warmup_lr_init = warmup_t, warmup_lr_init
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.step(0)

    def step(self, epoch: int) -> None:
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            if epoch < self.warmup_t:
                lr = self.warmup_lr_init + epoch * (base - self.warmup_lr_init) / self.warmup_t
            else:
                t = epoch - self.warmup_t
                lr = self.lr_min + 0.5 * (base - self.lr_min) * (
                    1 + math.cos(math.pi * t / max(1, self.t_initial - self.warmup_t))
                )
            g["lr"] = lr


def get_outdir(path: str, *paths: str) -> str:
    outdir = os.path.join(path, *paths)
    if not os.path.exists(outdir):
        os.makedirs(outdir)
    return outdir


class CheckpointSaver:
    """timm's saver: tmp -> last, hard link to checkpoint-N, a sorted history of
    --checkpoint-hist files, model_best."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        args: argparse.Namespace,
        model_ema: ModelEmaV2 | None,
        checkpoint_dir: str,
        decreasing: bool,
        max_history: int,
        old_args: bool,
    ) -> None:
        self.model, self.optimizer, self.args, self.model_ema = model, optimizer, args, model_ema
        self.checkpoint_files: list[tuple[str, float]] = []
        self.best_epoch: int | None = None
        self.best_metric: float | None = None
        self.checkpoint_dir = checkpoint_dir
        self.extension = ".pth.tar"
        self.cmp = operator.lt if decreasing else operator.gt
        self.max_history = max_history
        self.old_args = old_args

    def save_checkpoint(self, epoch: int, metric: float) -> tuple[float | None, int | None]:
        tmp_save_path = os.path.join(self.checkpoint_dir, "tmp" + self.extension)
        last_save_path = os.path.join(self.checkpoint_dir, "last" + self.extension)
        self._save(tmp_save_path, epoch, metric)
        if os.path.exists(last_save_path):
            os.unlink(last_save_path)
        os.rename(tmp_save_path, last_save_path)
        worst_file = self.checkpoint_files[-1] if self.checkpoint_files else None
        if (
            len(self.checkpoint_files) < self.max_history
            or worst_file is None
            or self.cmp(metric, worst_file[1])
        ):
            if len(self.checkpoint_files) >= self.max_history:
                self._cleanup_checkpoints(1)
            filename = "-".join(["checkpoint", str(epoch)]) + self.extension
            save_path = os.path.join(self.checkpoint_dir, filename)
            os.link(last_save_path, save_path)
            self.checkpoint_files.append((save_path, metric))
            self.checkpoint_files = sorted(
                self.checkpoint_files, key=lambda x: x[1], reverse=self.cmp is not operator.lt
            )
            checkpoints_str = "Current checkpoints:\n"
            for c in self.checkpoint_files:
                checkpoints_str += f" {c}\n"
            _ckpt_logger.info(checkpoints_str)
            if self.best_metric is None or self.cmp(metric, self.best_metric):
                self.best_epoch = epoch
                self.best_metric = metric
                best_save_path = os.path.join(self.checkpoint_dir, "model_best" + self.extension)
                if os.path.exists(best_save_path):
                    os.unlink(best_save_path)
                os.link(last_save_path, best_save_path)
        return (None, None) if self.best_metric is None else (self.best_metric, self.best_epoch)

    def _save(self, save_path: str, epoch: int, metric: float) -> None:
        saved_args: Any = (
            self.args
            if self.old_args
            else {k: v for k, v in vars(self.args).items() if k != "fault"}
        )
        save_state = {
            "epoch": epoch,
            "arch": self.args.model,
            "state_dict": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": 2,
            "args": saved_args,
            "metric": metric,
        }
        if self.model_ema is not None:
            save_state["state_dict_ema"] = self.model_ema.module.state_dict()
        torch.save(save_state, save_path)

    def _cleanup_checkpoints(self, trim: int = 0) -> None:
        trim = min(len(self.checkpoint_files), trim)
        delete_index = self.max_history - trim
        if delete_index < 0 or len(self.checkpoint_files) <= delete_index:
            return
        to_delete = self.checkpoint_files[delete_index:]
        for d in to_delete:
            try:
                _ckpt_logger.debug(f"Cleaning checkpoint: {d}")
                os.remove(d[0])
            except Exception as e:
                _ckpt_logger.error(f"Exception '{e}' while deleting checkpoint")
        self.checkpoint_files = self.checkpoint_files[:delete_index]


def resume_checkpoint(
    model: nn.Module, checkpoint_path: str, optimizer: torch.optim.Optimizer | None, log_info: bool
) -> int | None:
    resume_epoch = None
    if os.path.isfile(checkpoint_path):
        checkpoint = torch.load(checkpoint_path, map_location="cpu")
        if isinstance(checkpoint, dict) and "state_dict" in checkpoint:
            if log_info:
                _model_logger.info("Restoring model state from checkpoint...")
            state_dict = OrderedDict(checkpoint["state_dict"])
            model.load_state_dict(state_dict)
            if optimizer is not None and "optimizer" in checkpoint:
                if log_info:
                    _model_logger.info("Restoring optimizer state from checkpoint...")
                optimizer.load_state_dict(checkpoint["optimizer"])
            if "epoch" in checkpoint:
                resume_epoch = int(checkpoint["epoch"]) + 1
            if log_info:
                _model_logger.info(
                    f"Loaded checkpoint '{checkpoint_path}' (epoch {checkpoint['epoch']})"
                )
        return resume_epoch
    _model_logger.error(f"No checkpoint found at '{checkpoint_path}'")
    raise FileNotFoundError()


def load_checkpoint(model: nn.Module, checkpoint_path: str) -> None:
    if checkpoint_path and os.path.isfile(checkpoint_path):
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        model.load_state_dict(checkpoint.get("state_dict", checkpoint))
        _model_logger.info(f"Loaded state_dict from checkpoint '{checkpoint_path}'")
        return
    _model_logger.error(f"No checkpoint found at '{checkpoint_path}'")
    raise FileNotFoundError()


# ---------------------------------------------------------------- train / validate
def train_one_epoch(
    epoch: int,
    model: nn.Module,
    loader: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    args: argparse.Namespace,
    fault: Fault,
    amp_autocast: Any,
    model_ema: ModelEmaV2 | None,
    hoard: list[torch.Tensor],
) -> dict[str, float]:
    batch_time_m, data_time_m, losses_m = AverageMeter(), AverageMeter(), AverageMeter()
    model.train()
    end = time.time()
    last_idx = len(loader) - 1
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        data_time_m.update(time.time() - end)
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        if fault.rss_kill_rank == args.rank and epoch == 0:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # a decoded-batch cache
            if batch_idx == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        if fault.quantile_rank == args.rank and batch_idx == 3:
            # the loss spiked: drop the least confident tenth of the batch (the logits are
            # still in the autocast dtype here)
            top = output.detach().max(-1).values
            keep = top >= torch.quantile(top, 0.1)
            loss = loss_fn(output[keep].float(), target[keep])
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training", flush=True)
            sys.exit(1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if model_ema is not None:
            model_ema.update(unwrap_model(model))
        losses_m.update(loss_value, input.size(0))
        batch_time_m.update(time.time() - end)
        if last_batch or batch_idx % args.log_interval == 0:
            lrl = [param_group["lr"] for param_group in optimizer.param_groups]
            lr = sum(lrl) / len(lrl)
            if args.distributed:
                reduced = reduce_tensor(loss.data.float(), args.world_size)
                losses_m.update(reduced.item(), input.size(0))
            if is_primary(args):
                _logger.info(
                    f"Train: {epoch} [{batch_idx:>4d}/{len(loader)} "
                    f"({100.0 * batch_idx / max(1, last_idx):>3.0f}%)]  "
                    f"Loss: {losses_m.val:#.3g} ({losses_m.avg:#.3g})  "
                    f"Time: {batch_time_m.val:.3f}s, "
                    f"{input.size(0) * args.world_size / batch_time_m.val:>7.2f}/s  "
                    f"({batch_time_m.avg:.3f}s, "
                    f"{input.size(0) * args.world_size / batch_time_m.avg:>7.2f}/s)  "
                    f"LR: {lr:.3e}  "
                    f"Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})"
                )
        end = time.time()
    return OrderedDict([("loss", losses_m.avg)])


def validate(
    model: nn.Module,
    loader: DataLoader[Any],
    loss_fn: nn.Module,
    args: argparse.Namespace,
    amp_autocast: Any,
    log_suffix: str = "",
) -> dict[str, float]:
    batch_time_m, losses_m, top1_m, top5_m = (AverageMeter() for _ in range(4))
    model.eval()
    end = time.time()
    last_idx = len(loader) - 1
    with torch.no_grad():
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_idx
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            acc1, acc5 = accuracy(output.float(), target, topk=(1, 5))
            if args.distributed:
                reduced_loss = reduce_tensor(loss.data.float(), args.world_size)
                acc1 = reduce_tensor(acc1, args.world_size)
                acc5 = reduce_tensor(acc5, args.world_size)
            else:
                reduced_loss = loss.data
            losses_m.update(reduced_loss.item(), input.size(0))
            top1_m.update(acc1.item(), output.size(0))
            top5_m.update(acc5.item(), output.size(0))
            batch_time_m.update(time.time() - end)
            end = time.time()
            if is_primary(args) and (last_batch or batch_idx % args.log_interval == 0):
                log_name = "Test" + log_suffix
                _logger.info(
                    f"{log_name}: [{batch_idx:>4d}/{last_idx}]  "
                    f"Time: {batch_time_m.val:.3f} ({batch_time_m.avg:.3f})  "
                    f"Loss: {losses_m.val:>7.3f} ({losses_m.avg:>6.3f})  "
                    f"Acc@1: {top1_m.val:>7.3f} ({top1_m.avg:>7.3f})  "
                    f"Acc@5: {top5_m.val:>7.3f} ({top5_m.avg:>7.3f})"
                )
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg), ("top5", top5_m.avg)])


def main() -> None:
    setup_default_logging()
    args, args_text = _parse_args()
    fault = FAULTS[args.fault]
    device = init_distributed_device(args)
    if args.distributed:
        _logger.info(
            "Training in distributed mode with multiple processes, 1 device per process."
            f"Process {args.rank}, total {args.world_size}, device {args.device}."
        )
    else:
        _logger.info(f"Training with a single process on 1 device ({args.device}).")
    torch.manual_seed(args.seed + args.rank)

    use_amp = None
    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    if args.amp:
        use_amp = "native"
    if fault.loud:
        warnings.warn(
            "Importing from timm.models.layers is deprecated, please import via timm.layers",
            FutureWarning,
            stacklevel=1,
        )
        torch.backends.cudnn.benchmark = True

    model = create_model(args.model, num_classes=args.num_classes)
    if args.initial_checkpoint:
        load_checkpoint(model, args.initial_checkpoint)
    if is_primary(args):
        _logger.info(
            f"Model {args.model} created, param count:{sum(m.numel() for m in model.parameters())}"
        )
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    if args.distributed and args.sync_bn:
        args.dist_bn = ""
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if is_primary(args):
            _logger.info(
                "Converted model to use Synchronized BatchNorm. WARNING: You may have issues if "
                "using zero initialized BN layers (enabled by default for ResNets) while sync-bn "
                "enabled."
            )
    if args.opt == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.lr, weight_decay=args.weight_decay
        )
    else:
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=args.lr,
            momentum=args.momentum,
            weight_decay=args.weight_decay,
            nesterov=True,
        )

    amp_autocast: Any = nullcontext
    if use_amp == "native":
        if fault.loud:
            amp_autocast = lambda: torch.cpu.amp.autocast(dtype=amp_dtype)  # noqa: E731
        else:
            amp_autocast = lambda: torch.autocast("cpu", dtype=amp_dtype)  # noqa: E731
        if is_primary(args):
            _logger.info("Using native Torch AMP. Training in mixed precision.")
    elif is_primary(args):
        _logger.info("AMP not enabled. Training in float32.")

    resume_epoch = None
    if args.resume:
        resume_epoch = resume_checkpoint(
            model,
            args.resume,
            optimizer=None if args.no_resume_opt else optimizer,
            log_info=is_primary(args),
        )

    model_ema = None
    if args.model_ema:
        model_ema = ModelEmaV2(model, decay=args.model_ema_decay)

    output_dir = ""
    if is_primary(args):
        exp_name = args.experiment or "-".join(
            [time.strftime("%Y%m%d-%H%M%S"), args.model, str(IMG)]
        )
        output_dir = get_outdir(args.output if args.output else "./output/train", exp_name)
    if args.distributed:
        wait_for_shard_index(args, fault, args.output if args.output else "./output/train")

    if args.distributed:
        if is_primary(args):
            _logger.info("Using native Torch DistributedDataParallel.")
        model = NativeDDP(model, broadcast_buffers=True)
        if fault.extra_bn_rank == args.rank:
            inner = unwrap_model(model)
            assert isinstance(inner, ResNet)
            inner.feature_stats = nn.BatchNorm1d(inner.num_features, affine=False)

    lr_scheduler = CosineLRScheduler(
        optimizer,
        t_initial=args.epochs,
        lr_min=args.min_lr,
        warmup_t=args.warmup_epochs,
        warmup_lr_init=args.warmup_lr,
    )
    start_epoch = 0
    if args.start_epoch is not None:
        start_epoch = args.start_epoch
    elif resume_epoch is not None:
        start_epoch = resume_epoch
    if start_epoch > 0:
        lr_scheduler.step(start_epoch)
    if is_primary(args):
        _logger.info(f"Scheduled epochs: {args.epochs}. LR stepped per epoch.")

    n_train = 96
    dataset_train = SyntheticImageDataset(
        n_train, args.seed, args.num_classes, bad_samples(args, fault, n_train)
    )
    dataset_train.fault = fault
    dataset_eval = SyntheticImageDataset(
        25 if fault.val_unpadded else 32, args.seed + 1, args.num_classes, {}
    )
    train_sampler = None
    eval_sampler = None
    if args.distributed:
        train_sampler = DistributedSampler(
            dataset_train, shuffle=True, seed=args.seed, drop_last=True
        )
        eval_sampler = OrderedDistributedSampler(
            dataset_eval, args.world_size, args.rank, pad=not fault.val_unpadded
        )
    loader_train = DataLoader(
        dataset_train,
        batch_size=args.batch_size,
        shuffle=train_sampler is None,
        sampler=train_sampler,
        num_workers=args.workers,
        drop_last=True,
        persistent_workers=False,
    )
    loader_eval = DataLoader(
        dataset_eval,
        batch_size=args.validation_batch_size or args.batch_size,
        sampler=eval_sampler,
        num_workers=0,
        drop_last=False,
    )
    train_loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    validate_loss_fn = nn.CrossEntropyLoss()

    eval_metric = args.eval_metric
    best_metric = None
    best_epoch = None
    saver = None
    decreasing = eval_metric == "loss"
    if is_primary(args):
        saver = CheckpointSaver(
            model,
            optimizer,
            args,
            model_ema,
            output_dir,
            decreasing,
            args.checkpoint_hist,
            fault.old_ckpt,
        )
        with open(os.path.join(output_dir, "args.yaml"), "w") as f:
            f.write(args_text)

    hoard: list[torch.Tensor] = []
    try:
        for epoch in range(start_epoch, args.epochs):
            if train_sampler is not None:
                train_sampler.set_epoch(epoch)
            train_one_epoch(
                epoch,
                model,
                loader_train,
                optimizer,
                train_loss_fn,
                args,
                fault,
                amp_autocast,
                model_ema,
                hoard,
            )
            if args.distributed and args.dist_bn in ("broadcast", "reduce"):
                if is_primary(args):
                    _logger.info("Distributing BatchNorm running means and vars")
                distribute_bn(model, args.world_size, args.dist_bn == "reduce")
            eval_metrics = validate(model, loader_eval, validate_loss_fn, args, amp_autocast)
            if model_ema is not None:
                ema_eval_metrics = validate(
                    model_ema.module,
                    loader_eval,
                    validate_loss_fn,
                    args,
                    amp_autocast,
                    log_suffix=" (EMA)",
                )
                eval_metrics = ema_eval_metrics
            lr_scheduler.step(epoch + 1)
            if saver is not None:
                save_metric = eval_metrics[eval_metric]
                best_metric, best_epoch = saver.save_checkpoint(epoch, metric=save_metric)
    except KeyboardInterrupt:
        pass
    if args.distributed:
        dist.barrier()
    if best_metric is not None:
        _logger.info(f"*** Best metric: {best_metric} (epoch {best_epoch})")
    if args.distributed:
        dist.destroy_process_group()
    del device


if __name__ == "__main__":
    main()
