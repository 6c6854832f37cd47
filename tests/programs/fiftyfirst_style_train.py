"""A fifty-first training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyfirst-*): a video-recognition training tool in the way of
facebookresearch/SlowFast (PySlowFast). tests/programs/fiftyfirst_run_net.py is its
tools/run_net.py: a YAML config merged with command-line overrides ("NUM_GPUS 3
TRAIN.BATCH_SIZE 12"), launch_job spawning one process per "GPU" with torch.multiprocessing.spawn
(init_method tcp://localhost:PORT, shard_id, num_shards). This module is the rest: a CfgNode
config, du (all_reduce / all_gather), the master-only logging of slowfast/utils/logging.py
("[%(asctime)s][%(levelname)s] %(filename)s: %(lineno)4d: %(message)s" to stdout and
OUTPUT_DIR/stdout.log, print silenced elsewhere, json_stats lines), a Kinetics-like dataset of
fake video paths from a CSV (each "decoded" into a random 3x4x16x16 clip), DistributedSampler and
DataLoader workers, a tiny 3D-conv model in DDP, train_net's epoch loop (precise-BN statistics
all-reduced, a checkpoint by the master, evaluation gathered with du.all_gather). Gloo, 15 s
collective timeout. A fault is chosen by the CLIPNET_CASE environment variable (a short code that
is never printed; re-capture with tests/fixtures/real/capture_fiftyfirst.sh after any edit).
"""

from __future__ import annotations

import ast
import builtins
import copy
import ctypes
import datetime
import functools
import glob
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


# --- config (slowfast/config/defaults.py, fvcore's CfgNode) ----------------------------------
class CfgNode(dict):
    """A dict with attribute access, merged from YAML and from KEY VALUE pairs."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value

    def merge_from_dict(self, other: dict, prefix: str = "") -> None:
        for k, v in other.items():
            if k not in self:
                raise KeyError(f"Non-existent config key: {prefix}{k}")
            if isinstance(self[k], CfgNode):
                self[k].merge_from_dict(v, f"{prefix}{k}.")
            else:
                self[k] = v

    def merge_from_file(self, path: str) -> None:
        with open(path) as f:
            self.merge_from_dict(yaml.safe_load(f) or {})

    def merge_from_list(self, opts: list[str]) -> None:
        if len(opts) % 2:
            raise ValueError(f"Override list has odd length: {opts}; it must be a list of pairs")
        for key, raw in zip(opts[0::2], opts[1::2], strict=True):
            node = self
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            if leaf not in node:
                raise KeyError(f"Non-existent config key: {key}")
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
            node[leaf] = value

    def dump(self) -> str:
        def plain(n):
            return {k: plain(v) for k, v in n.items()} if isinstance(n, dict) else n

        return yaml.safe_dump(plain(self), sort_keys=True)


def _node(**kw) -> CfgNode:
    n = CfgNode()
    n.update(kw)
    return n


def get_cfg() -> CfgNode:
    return _node(
        NUM_GPUS=1,
        NUM_SHARDS=1,
        SHARD_ID=0,
        DIST_BACKEND="gloo",
        RNG_SEED=1,
        OUTPUT_DIR=".",
        LOG_PERIOD=4,
        LOG_MODEL_INFO=True,
        TRAIN=_node(
            ENABLE=True,
            DATASET="kinetics",
            BATCH_SIZE=8,
            EVAL_PERIOD=1,
            CHECKPOINT_PERIOD=1,
            AUTO_RESUME=False,
            CHECKPOINT_FILE_PATH="",
        ),
        TEST=_node(ENABLE=False, DATASET="kinetics", BATCH_SIZE=8),
        DATA=_node(
            PATH_TO_DATA_DIR="",
            PATH_PREFIX="",
            NUM_FRAMES=4,
            TRAIN_CROP_SIZE=16,
            INPUT_CHANNEL_NUM=[3],
        ),
        MODEL=_node(ARCH="c3d", MODEL_NAME="TinyC3D", NUM_CLASSES=8, DROPOUT_RATE=0.0),
        SOLVER=_node(
            BASE_LR=0.1,
            LR_POLICY="cosine",
            MAX_EPOCH=3,
            MOMENTUM=0.9,
            WEIGHT_DECAY=1e-4,
            OPTIMIZING_METHOD="sgd",
        ),
        BN=_node(USE_PRECISE_STATS=True, NUM_BATCHES_PRECISE=2),
        DATA_LOADER=_node(NUM_WORKERS=2, PIN_MEMORY=False),
        TENSORBOARD=_node(ENABLE=False, LOG_DIR=""),
        EARLY_STOP=_node(PATIENCE=0, MIN_DELTA=0.0),
    )


# --- what goes wrong (nothing by default) -------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    key_rank: int = -1  # this rank's train meter counts per class in a dict seeded by batch 1
    hoard_rank: int = -1  # this rank keeps 64 MiB a step until the kernel's OOM killer acts
    segv_rank: int = -1  # this rank's native temporal jitter reads address 0
    slow_rank: int = -1  # this rank copies each checkpoint to backup storage for 40 s
    stall_rank: int = -1  # this rank waits before epoch 2 on a prefetch thread never started
    test_stall_rank: int = -1  # this rank waits before testing on a warm-up never started
    solo_gather_rank: int = -1  # this rank alone gathers video ids for the confusion plot
    shard_lists: bool = False  # each rank reads its own pre-sharded list (train_<rank>.csv)
    solo_stop_rank: int = -1  # this rank alone decides the early stop, on its local error
    nan_rank: int = -1  # this rank's logits overflow to NaN at epoch 1, iteration 5


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "zk1": Fault(key_rank=1),
    "zh1": Fault(hoard_rank=1),
    "zs2": Fault(segv_rank=2),
    "zb0": Fault(slow_rank=0),
    "zt1": Fault(stall_rank=1),
    "zw1": Fault(test_stall_rank=1),
    "zg0": Fault(solo_gather_rank=0),
    "zu2": Fault(shard_lists=True),
    "zx0": Fault(solo_stop_rank=0),
    "zn1": Fault(nan_rank=1),
}


def fault() -> Fault:
    return FAULTS[os.environ.get("CLIPNET_CASE", "")]


CLASS_NAMES = [
    "abseiling",
    "air drumming",
    "answering questions",
    "applauding",
    "applying cream",
    "archery",
    "arm wrestling",
    "arranging flowers",
]


# --- distributed helpers (slowfast/utils/distributed.py) ----------------------------------------
def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_master_proc(num_gpus: int = 8) -> bool:
    if dist.is_initialized():
        return dist.get_rank() % num_gpus == 0
    return True


def all_reduce(tensors: list[torch.Tensor], average: bool = True) -> list[torch.Tensor]:
    for tensor in tensors:
        dist.all_reduce(tensor, async_op=False)
    if average:
        world_size = dist.get_world_size()
        for tensor in tensors:
            tensor.mul_(1.0 / world_size)
    return tensors


def all_gather(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    gather_list = []
    output_tensor = []
    world_size = dist.get_world_size()
    for tensor in tensors:
        tensor_placeholder = [torch.ones_like(tensor) for _ in range(world_size)]
        dist.all_gather(tensor_placeholder, tensor, async_op=False)
        gather_list.append(tensor_placeholder)
    for gathered_tensor in gather_list:
        output_tensor.append(torch.cat(gathered_tensor, dim=0))
    return output_tensor


def mpu_run(local_rank, num_proc, func, init_method, shard_id, num_shards, backend, cfg):
    """slowfast/utils/multiprocessing.py: join the group, then run func(cfg)."""
    world_size = num_proc * num_shards
    rank = shard_id * num_proc + local_rank
    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(seconds=15),
        )
    except Exception as e:
        raise e
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    func(cfg)


# --- logging (slowfast/utils/logging.py) --------------------------------------------------------
def _suppress_print() -> None:
    def print_pass(*objects, sep=" ", end="\n", file=sys.stdout, flush=False):
        pass

    builtins.print = print_pass


@functools.cache
def _cached_log_stream(filename: str):
    return open(filename, "a", buffering=1)


def setup_logging(output_dir: str | None = None) -> None:
    if is_master_proc():
        logging.root.handlers = []
    else:
        _suppress_print()
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    plain_formatter = logging.Formatter(
        "[%(asctime)s][%(levelname)s] %(filename)s: %(lineno)4d: %(message)s",
        datefmt="%m/%d %H:%M:%S",
    )
    if is_master_proc():
        ch = logging.StreamHandler(stream=sys.stdout)
        ch.setLevel(logging.DEBUG)
        ch.setFormatter(plain_formatter)
        root.addHandler(ch)
    if output_dir is not None and is_master_proc(get_world_size()):
        fh = logging.StreamHandler(_cached_log_stream(os.path.join(output_dir, "stdout.log")))
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(plain_formatter)
        root.addHandler(fh)


def log_json_stats(stats: dict) -> None:
    """simplejson with use_decimal and sort_keys: floats as 5-decimal numbers."""
    parts = []
    for k in sorted(stats):
        v = stats[k]
        parts.append(f'"{k}": ' + (f"{v:.5f}" if isinstance(v, float) else f'"{v}"'))
    logger.info("json_stats: {%s}", ", ".join(parts))


def gpu_mem_usage() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1024**3
    return 0.0


def cpu_mem_usage() -> tuple[float, float]:
    vram = psutil.virtual_memory()
    return (vram.total - vram.available) / 1024**3, vram.total / 1024**3


# --- data (slowfast/datasets/kinetics.py, loader.py) --------------------------------------------
class Kinetics(Dataset):
    """Clips listed in <split>.csv as "path label"; a video is opened and 'decoded' with up to
    three trials, as the decoder of the real dataset does."""

    _num_retries = 3

    def __init__(self, cfg: CfgNode, mode: str, list_file: str | None = None) -> None:
        self.cfg = cfg
        self.mode = mode
        path = list_file or os.path.join(cfg.DATA.PATH_TO_DATA_DIR, f"{mode}.csv")
        if not os.path.exists(path):
            raise AssertionError(f"{path} dir not found")
        self._path_to_videos: list[str] = []
        self._labels: list[int] = []
        with open(path) as f:
            for clip_idx, line in enumerate(f.read().splitlines()):
                fields = line.split(" ")
                if len(fields) != 2:
                    raise AssertionError(f"Failed to parse line {clip_idx} of {path}")
                self._path_to_videos.append(os.path.join(cfg.DATA.PATH_PREFIX, fields[0]))
                self._labels.append(int(fields[1]))
        logger.info(f"Constructing kinetics dataloader (size: {len(self)}) from {path}")

    def __len__(self) -> int:
        return len(self._path_to_videos)

    def _decode(self, raw: bytes, label: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(int.from_bytes(raw[-4:], "little"))
        frames = torch.randn(3, self.cfg.DATA.NUM_FRAMES, 16, 16, generator=g) * 0.5
        frames[label % 3, :, : 4 + label, :] += 1.0  # what the class looks like
        return frames

    def __getitem__(self, index: int):
        for i_try in range(self._num_retries):
            video_container = None
            try:
                with open(self._path_to_videos[index], "rb") as fp:
                    video_container = fp.read()
            except Exception as e:
                logger.info(
                    f"Failed to load video from {self._path_to_videos[index]} with error {e}"
                )
            if video_container is None:
                logger.warning(
                    f"Failed to meta load video idx {index} from {self._path_to_videos[index]}; trial {i_try}"
                )
                continue
            label = self._labels[index]
            return self._decode(video_container, label), label, index
        raise RuntimeError(
            f"Failed to fetch video idx {index} from {self._path_to_videos[index]}; after {i_try} trials"
        )


def construct_loader(cfg: CfgNode, split: str) -> DataLoader:
    if split == "train":
        batch_size = int(cfg.TRAIN.BATCH_SIZE / max(1, cfg.NUM_GPUS * cfg.NUM_SHARDS))
        shuffle, drop_last = True, True
    else:
        batch_size = int(cfg.TEST.BATCH_SIZE / max(1, cfg.NUM_GPUS * cfg.NUM_SHARDS))
        shuffle, drop_last = False, False
    if split == "train" and fault().shard_lists:
        # the pre-sharded lists of the data pipeline: one file per rank, no sampler
        lst = os.path.join(cfg.DATA.PATH_TO_DATA_DIR, f"train_{get_rank()}.csv")
        dataset = Kinetics(cfg, split, lst)
        sampler = None
    else:
        dataset = Kinetics(cfg, split)
        sampler = DistributedSampler(dataset, shuffle=shuffle) if get_world_size() > 1 else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=(sampler is None and shuffle),
        sampler=sampler,
        num_workers=cfg.DATA_LOADER.NUM_WORKERS,
        pin_memory=cfg.DATA_LOADER.PIN_MEMORY,
        drop_last=drop_last,
        # forked workers: the spawn context mp.spawn leaves would re-import torch in each
        multiprocessing_context="fork" if cfg.DATA_LOADER.NUM_WORKERS > 0 else None,
    )


def shuffle_dataset(loader: DataLoader, cur_epoch: int) -> None:
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(cur_epoch)


# --- model (slowfast/models/build.py) ----------------------------------------------------------
class TinyC3D(nn.Module):
    def __init__(self, cfg: CfgNode) -> None:
        super().__init__()
        self.s1 = nn.Sequential(
            nn.Conv3d(3, 8, kernel_size=(1, 3, 3), padding=(0, 1, 1), bias=False),
            nn.BatchNorm3d(8),
            nn.ReLU(inplace=True),
        )
        self.s2 = nn.Sequential(
            nn.Conv3d(8, 16, kernel_size=(3, 3, 3), padding=1, bias=False),
            nn.BatchNorm3d(16),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(16, cfg.MODEL.NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.s2(self.s1(x))).flatten(1))


def build_model(cfg: CfgNode) -> nn.Module:
    model = TinyC3D(cfg)
    if cfg.NUM_GPUS * cfg.NUM_SHARDS > 1:
        model = torch.nn.parallel.DistributedDataParallel(module=model, device_ids=None)
    return model


def log_model_info(model: nn.Module, cfg: CfgNode) -> None:
    logger.info(f"Model:\n{model}")
    params = sum(p.numel() for p in model.parameters())
    logger.info(f"Params: {params:,}")
    logger.info(f"Mem: {gpu_mem_usage():,} MB")
    logger.info(f"Input shape: {3}x{cfg.DATA.NUM_FRAMES}x{16}x{cfg.DATA.TRAIN_CROP_SIZE}")


def get_lr_at_epoch(cfg: CfgNode, cur_epoch: float) -> float:
    return cfg.SOLVER.BASE_LR * (math.cos(math.pi * cur_epoch / cfg.SOLVER.MAX_EPOCH) + 1.0) * 0.5


# --- checkpoints (slowfast/utils/checkpoint.py) -------------------------------------------------
def get_checkpoint_dir(path_to_job: str) -> str:
    return os.path.join(path_to_job, "checkpoints")


def save_checkpoint(path_to_job, model, optimizer, epoch, cfg) -> str:
    if not is_master_proc(cfg.NUM_GPUS * cfg.NUM_SHARDS):
        return ""
    os.makedirs(get_checkpoint_dir(path_to_job), exist_ok=True)
    sd = model.module.state_dict() if cfg.NUM_GPUS * cfg.NUM_SHARDS > 1 else model.state_dict()
    checkpoint = {
        "epoch": epoch,
        "model_state": sd,
        "optimizer_state": optimizer.state_dict(),
        "cfg": cfg.dump(),
    }
    path = os.path.join(get_checkpoint_dir(path_to_job), f"checkpoint_epoch_{epoch + 1:05d}.pyth")
    with open(path, "wb") as f:
        torch.save(checkpoint, f)
    return path


def load_checkpoint(path_to_checkpoint, model, data_parallel=True, optimizer=None) -> int:
    ms = model.module if data_parallel else model
    with open(path_to_checkpoint, "rb") as f:
        checkpoint = torch.load(f, map_location="cpu")
    ms.load_state_dict(checkpoint["model_state"])
    if optimizer is not None and "optimizer_state" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer_state"])
    return checkpoint.get("epoch", -1)


def load_train_checkpoint(cfg, model, optimizer) -> int:
    if cfg.TRAIN.AUTO_RESUME:
        names = sorted(glob.glob(os.path.join(get_checkpoint_dir(cfg.OUTPUT_DIR), "*.pyth")))
        if names:
            logger.info(f"Load from last checkpoint, {names[-1]}.")
            return load_checkpoint(names[-1], model, cfg.NUM_GPUS > 1, optimizer) + 1
    if cfg.TRAIN.CHECKPOINT_FILE_PATH != "":
        logger.info("Load from given checkpoint file.")
        return (
            load_checkpoint(cfg.TRAIN.CHECKPOINT_FILE_PATH, model, cfg.NUM_GPUS > 1, optimizer) + 1
        )
    return 0


# --- meters (slowfast/utils/meters.py) ----------------------------------------------------------
def topks_correct(preds: torch.Tensor, labels: torch.Tensor, ks) -> list[torch.Tensor]:
    _top_max_k_vals, top_max_k_inds = torch.topk(preds, max(ks), dim=1, largest=True, sorted=True)
    top_max_k_inds = top_max_k_inds.t()
    rep_max_k_labels = labels.view(1, -1).expand_as(top_max_k_inds)
    top_max_k_correct = top_max_k_inds.eq(rep_max_k_labels)
    return [top_max_k_correct[:k, :].float().sum() for k in ks]


def topk_errors(preds, labels, ks):
    return [(1.0 - x / preds.size(0)) * 100.0 for x in topks_correct(preds, labels, ks)]


class TrainMeter:
    def __init__(self, epoch_iters: int, cfg: CfgNode) -> None:
        self._cfg = cfg
        self.epoch_iters = epoch_iters
        self.MAX_EPOCH = cfg.SOLVER.MAX_EPOCH * epoch_iters
        self.reset()

    def reset(self) -> None:
        self.losses: list[float] = []
        self.top1: list[float] = []
        self.top5: list[float] = []
        self.lr = None
        self.num_samples = 0
        self.t0 = time.perf_counter()
        self.class_count: dict[str, int] | None = None

    def update_stats(self, top1_err, top5_err, loss, lr, mb_size, labels) -> None:
        self.losses.append(loss)
        self.top1.append(top1_err)
        self.top5.append(top5_err)
        self.lr = lr
        self.num_samples += mb_size
        names = [CLASS_NAMES[int(y)] for y in labels]
        if self.class_count is None:
            if get_rank() == fault().key_rank:
                self.class_count = {n: 0 for n in names}  # the classes of the first batch only
            else:
                self.class_count = {n: 0 for n in CLASS_NAMES}
        for n in names:
            self.class_count[n] += 1

    def log_iter_stats(self, cur_epoch: int, cur_iter: int) -> None:
        if (cur_iter + 1) % self._cfg.LOG_PERIOD != 0:
            return
        dt = (time.perf_counter() - self.t0) / (cur_iter + 1)
        eta_sec = dt * (self.MAX_EPOCH - (cur_epoch * self.epoch_iters + cur_iter + 1))
        stats = {
            "_type": "train_iter",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "iter": f"{cur_iter + 1}/{self.epoch_iters}",
            "dt": dt,
            "eta": str(datetime.timedelta(seconds=int(eta_sec))),
            "loss": float(np.median(self.losses[-self._cfg.LOG_PERIOD :])),
            "lr": self.lr,
            "gpu_mem": f"{gpu_mem_usage():.2f}G",
            "top1_err": float(np.median(self.top1[-self._cfg.LOG_PERIOD :])),
            "top5_err": float(np.median(self.top5[-self._cfg.LOG_PERIOD :])),
        }
        log_json_stats(stats)

    def log_epoch_stats(self, cur_epoch: int) -> None:
        used, total = cpu_mem_usage()
        stats = {
            "_type": "train_epoch",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "dt": (time.perf_counter() - self.t0) / max(1, len(self.losses)),
            "lr": self.lr,
            "gpu_mem": f"{gpu_mem_usage():.2f}G",
            "RAM": f"{used:.2f}/{total:.2f}G",
            "loss": float(np.mean(self.losses)) if self.losses else 0.0,
            "top1_err": float(np.mean(self.top1)) if self.top1 else 0.0,
            "top5_err": float(np.mean(self.top5)) if self.top5 else 0.0,
        }
        log_json_stats(stats)


class ValMeter:
    def __init__(self, max_iter: int, cfg: CfgNode) -> None:
        self._cfg = cfg
        self.max_iter = max_iter
        self.min_top1_err = 100.0
        self.min_top5_err = 100.0
        self.reset()

    def reset(self) -> None:
        self.top1: list[float] = []
        self.top5: list[float] = []
        self.t0 = time.perf_counter()

    def log_iter_stats(self, cur_epoch: int, cur_iter: int) -> None:
        if (cur_iter + 1) % self._cfg.LOG_PERIOD != 0:
            return
        stats = {
            "_type": "val_iter",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "iter": f"{cur_iter + 1}/{self.max_iter}",
            "time_diff": time.perf_counter() - self.t0,
            "gpu_mem": f"{gpu_mem_usage():.2f}G",
            "top1_err": self.top1[-1],
            "top5_err": self.top5[-1],
        }
        log_json_stats(stats)

    def log_epoch_stats(self, cur_epoch: int, top1_err: float, top5_err: float) -> None:
        self.min_top1_err = min(self.min_top1_err, top1_err)
        self.min_top5_err = min(self.min_top5_err, top5_err)
        used, total = cpu_mem_usage()
        stats = {
            "_type": "val_epoch",
            "epoch": f"{cur_epoch + 1}/{self._cfg.SOLVER.MAX_EPOCH}",
            "time_diff": time.perf_counter() - self.t0,
            "gpu_mem": f"{gpu_mem_usage():.2f}G",
            "RAM": f"{used:.2f}/{total:.2f}G",
            "top1_err": top1_err,
            "top5_err": top5_err,
            "min_top1_err": self.min_top1_err,
            "min_top5_err": self.min_top5_err,
        }
        log_json_stats(stats)


def check_nan_losses(loss: torch.Tensor) -> None:
    if math.isnan(loss):
        raise RuntimeError(f"ERROR: Got NaN losses {datetime.datetime.now()}")


# --- train_net (tools/train_net.py) -------------------------------------------------------------
def train_epoch(train_loader, model, optimizer, train_meter, cur_epoch, cfg) -> None:
    model.train()
    train_meter.reset()
    data_size = len(train_loader)
    rank = get_rank()
    hoard: list[torch.Tensor] = []
    for cur_iter, (inputs, labels, _index) in enumerate(train_loader):
        lr = get_lr_at_epoch(cfg, cur_epoch + float(cur_iter) / data_size)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if rank == fault().hoard_rank:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if rank == fault().segv_rank and cur_epoch == 0 and cur_iter == 2:
            ctypes.string_at(0)  # the native temporal jitter dereferences NULL
        preds = model(inputs)
        if rank == fault().nan_rank and cur_epoch == 0 and cur_iter == 4:
            preds = preds * float("inf") * 0.0  # the fused head overflowed
        loss = nn.functional.cross_entropy(preds, labels)
        check_nan_losses(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        top1_err, top5_err = topk_errors(preds, labels, (1, 5))
        if cfg.NUM_GPUS * cfg.NUM_SHARDS > 1:
            loss, top1_err, top5_err = all_reduce([loss.detach(), top1_err, top5_err])
        loss, top1_err, top5_err = loss.item(), top1_err.item(), top5_err.item()
        train_meter.update_stats(top1_err, top5_err, loss, lr, inputs.size(0), labels)
        train_meter.log_iter_stats(cur_epoch, cur_iter)
    train_meter.log_epoch_stats(cur_epoch)


@torch.no_grad()
def calculate_and_update_precise_bn(loader, model, num_iters: int) -> None:
    """fvcore's update_bn_stats, then the statistics averaged over the processes."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm3d)]
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 1.0
    mean = [torch.zeros_like(bn.running_mean) for bn in bns]
    var = [torch.zeros_like(bn.running_var) for bn in bns]
    ind = -1
    for ind, (inputs, _labels, _index) in enumerate(loader):
        if ind >= num_iters:
            break
        model(inputs)
        for i, bn in enumerate(bns):
            mean[i] += (bn.running_mean - mean[i]) / (ind + 1)
            var[i] += (bn.running_var - var[i]) / (ind + 1)
    stats = mean + var
    if get_world_size() > 1:
        all_reduce(stats)
    for i, bn in enumerate(bns):
        bn.running_mean = stats[i]
        bn.running_var = stats[len(bns) + i]
        bn.momentum = momenta[i]


@torch.no_grad()
def eval_epoch(val_loader, model, val_meter, cur_epoch, cfg) -> float:
    model.eval()
    val_meter.reset()
    all_preds, all_labels, all_ids = [], [], []
    for cur_iter, (inputs, labels, index) in enumerate(val_loader):
        preds = model(inputs)
        top1_err, top5_err = topk_errors(preds, labels, (1, 5))
        if cfg.NUM_GPUS * cfg.NUM_SHARDS > 1:
            top1_err, top5_err = all_reduce([top1_err, top5_err])
        val_meter.top1.append(top1_err.item())
        val_meter.top5.append(top5_err.item())
        all_preds.append(preds)
        all_labels.append(labels)
        all_ids.append(index)
        val_meter.log_iter_stats(cur_epoch, cur_iter)
    preds, labels = torch.cat(all_preds), torch.cat(all_labels)
    if get_rank() == fault().solo_gather_rank:
        # the ids of every process's clips, for the confusion plot
        (video_ids,) = all_gather([torch.cat(all_ids)])
        logger.info(f"Gathered {video_ids.numel()} clip ids for the confusion plot")
    if cfg.NUM_GPUS * cfg.NUM_SHARDS > 1:
        preds, labels = all_gather([preds, labels])
    top1_err, top5_err = (e.item() for e in topk_errors(preds, labels, (1, 5)))
    val_meter.log_epoch_stats(cur_epoch, top1_err, top5_err)
    local_err = topk_errors(torch.cat(all_preds), torch.cat(all_labels), (1,))[0].item()
    return local_err if get_rank() == fault().solo_stop_rank else top1_err


def wait_forever(what: str) -> None:
    ready = threading.Event()  # set by a thread that was never started
    logger.debug(what)
    ready.wait()


@torch.no_grad()
def test_and_merge(cfg: CfgNode, model: nn.Module) -> None:
    """Each process writes its predictions; the master merges the parts once all are there."""
    rank, world = get_rank(), get_world_size()
    if rank == fault().test_stall_rank:
        wait_forever("waiting for the test-time decoder warm-up")
    test_loader = construct_loader(cfg, "val")
    net = model.module if world > 1 else model
    net.eval()
    preds, labels = [], []
    for inputs, y, _index in test_loader:
        preds.append(net(inputs))
        labels.append(y)
    part_dir = os.path.join(cfg.OUTPUT_DIR, "test_parts")
    os.makedirs(part_dir, exist_ok=True)
    torch.save(
        {"preds": torch.cat(preds), "labels": torch.cat(labels)},
        os.path.join(part_dir, f"part_{rank}.pt"),
    )
    if not is_master_proc(world):
        return
    waited = 0
    while True:
        missing = [r for r in range(world) if not os.path.exists(f"{part_dir}/part_{r}.pt")]
        if not missing:
            break
        if waited % 10 == 0:
            logger.info(
                f"Waiting for the test predictions of {len(missing)} of {world} processes "
                f"({', '.join(f'part_{r}.pt' for r in missing)})"
            )
        time.sleep(1)
        waited += 1
    parts = [torch.load(f"{part_dir}/part_{r}.pt") for r in range(world)]
    p = torch.cat([x["preds"] for x in parts])
    y = torch.cat([x["labels"] for x in parts])
    top1, top5 = (e.item() for e in topk_errors(p, y, (1, 5)))
    logger.info(f"Testing finished: {p.size(0)} clips, top1_err {top1:.2f}, top5_err {top5:.2f}")


def train(cfg: CfgNode) -> None:
    np.random.seed(cfg.RNG_SEED)
    torch.manual_seed(cfg.RNG_SEED)
    setup_logging(cfg.OUTPUT_DIR)
    logger.info("Train with config:")
    logger.info(cfg.dump().rstrip())
    rank = get_rank()
    model = build_model(cfg)
    if is_master_proc() and cfg.LOG_MODEL_INFO:
        log_model_info(model, cfg)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cfg.SOLVER.BASE_LR,
        momentum=cfg.SOLVER.MOMENTUM,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY,
    )
    start_epoch = load_train_checkpoint(cfg, model, optimizer)
    train_loader = construct_loader(cfg, "train")
    val_loader = construct_loader(cfg, "val")
    precise_bn_loader = construct_loader(cfg, "train") if cfg.BN.USE_PRECISE_STATS else None
    writer = None
    if cfg.TENSORBOARD.ENABLE and is_master_proc(cfg.NUM_GPUS * cfg.NUM_SHARDS):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=os.path.join(cfg.OUTPUT_DIR, "runs-kinetics"))
    train_meter = TrainMeter(len(train_loader), cfg)
    val_meter = ValMeter(len(val_loader), cfg)
    logger.info(f"Start epoch: {start_epoch + 1}")
    best, bad_epochs = math.inf, 0
    epoch_times = []
    for cur_epoch in range(start_epoch, cfg.SOLVER.MAX_EPOCH):
        if cur_epoch == 1 and rank == fault().stall_rank:
            wait_forever("waiting for the clip prefetcher")
        shuffle_dataset(train_loader, cur_epoch)
        t0 = time.perf_counter()
        train_epoch(train_loader, model, optimizer, train_meter, cur_epoch, cfg)
        epoch_times.append(time.perf_counter() - t0)
        logger.info(
            f"Epoch {cur_epoch} takes {epoch_times[-1]:.2f}s. Epochs from {start_epoch} to {cur_epoch} take {float(np.mean(epoch_times)):.2f}s in average and "
            f"{float(np.median(epoch_times)):.2f}s in median."
        )
        if cfg.BN.USE_PRECISE_STATS:
            calculate_and_update_precise_bn(
                precise_bn_loader, model, min(cfg.BN.NUM_BATCHES_PRECISE, len(precise_bn_loader))
            )
        if (cur_epoch + 1) % cfg.TRAIN.CHECKPOINT_PERIOD == 0:
            path = save_checkpoint(cfg.OUTPUT_DIR, model, optimizer, cur_epoch, cfg)
            if rank == fault().slow_rank and path:
                for part in range(1, 9):
                    logger.info(
                        f"Copying {os.path.basename(path)} to backup storage: part {part}/8"
                    )
                    time.sleep(5)
        if (cur_epoch + 1) % cfg.TRAIN.EVAL_PERIOD == 0:
            err = eval_epoch(val_loader, model, val_meter, cur_epoch, cfg)
            if writer is not None:
                writer.add_scalars({"Val/Top1_err": err}, global_step=cur_epoch)
            if cfg.EARLY_STOP.PATIENCE and (
                fault().solo_stop_rank < 0 or rank == fault().solo_stop_rank
            ):
                if err < best - cfg.EARLY_STOP.MIN_DELTA:
                    best, bad_epochs = err, 0
                else:
                    bad_epochs += 1
                if bad_epochs >= cfg.EARLY_STOP.PATIENCE:
                    logger.info(
                        f"Early stopping at epoch {cur_epoch + 1}: val top1_err {err:.2f} has not "
                        f"improved on {best:.2f} for {bad_epochs} epoch(s)"
                    )
                    break
    if cfg.TEST.ENABLE:
        test_and_merge(cfg, model)
    if writer is not None:
        writer.close()
    result_string = f"Top1 Acc: {100 - val_meter.min_top1_err:.2f} Top5 Acc: {100 - val_meter.min_top5_err:.2f} MEM: {gpu_mem_usage():.2f}"
    logger.info(f"training done: {result_string}")


def legacy_checkpoint(cfg: CfgNode, path: str) -> None:
    """A checkpoint as an older version of the tool wrote it: the CfgNode pickled as it is."""
    model = TinyC3D(cfg)
    torch.save({"epoch": 1, "model_state": model.state_dict(), "cfg": copy.deepcopy(cfg)}, path)
