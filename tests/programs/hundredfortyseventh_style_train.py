"""A hundred-and-forty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyseventh-*): 3-D point-cloud semantic segmentation trained the
way Pointcept/Pointcept trains it (the PointTransformerV3 era), re-created in plain torch without
Pointcept, spconv, flash-attn, torch-scatter, tensorboardX, termcolor or yapf installed. Each
run's folder links this file as tools/train.py; it is started as Pointcept's scripts/train.sh
starts it (`sh scripts/train.sh -g 2 -d scannet -c semseg-pt-v3m1-0-base -n exp`, which runs
`python tools/train.py --config-file configs/scannet/semseg-pt-v3m1-0-base.py --num-gpus 2
--num-machines 1 --machine-rank 0 --dist-url URL --options save_path=exp/scannet/exp`), on two
nodes with --num-machines 2 --machine-rank K --dist-url tcp://HOST:PORT, or (a fork's torchrun
support: LOCAL_RANK in the environment skips the spawn) under torchrun.

As there: launch() (detectron2's) starts one process per "GPU" with
torch.multiprocessing.spawn and a tcp:// dist_url ('auto': a free port on 127.0.0.1), global
rank = machine_rank * num_gpus + local_rank, a local process group per machine, a barrier;
init_process_group(gloo here, a 15 s timeout). The config is a Python file
(configs/scannet/semseg-pt-v3m1-0-base.py) read into a Config, merged with --options key=value,
dumped to the save path's config.py and printed as Python source after 'Config:'. The root
logger 'pointcept' prints '[2026-12-07 08:00:00,123 INFO train.py line 123 4567] message' (time,
level, file, line, pid) at INFO on rank 0 (and into save_path/train.log) and at ERROR on every
other rank; the trainer's ExceptionWriter logs any exception that leaves training as one ERROR
record (the whole traceback) and calls sys.exit(1), so a worker that fails in training exits 1
and spawn's parent says only 'process N terminated with exit code 1' (N the local index).
Hooks print '>>>>>>>>>>>>>>>> Start Training >>>>>>>>>>>>>>>>', 'Train: [1/3][1/8] Data 0.001
(0.002) Batch 0.512 (0.600) Remain 00:00:12 loss: 2.9957 Lr: 0.00100', 'Train result: loss:
...', '>>>>>>>>>>>>>>>> Start Evaluation >>>>>>>>>>>>>>>>', 'Test: [1/3] Loss 2.9957 ', 'Val
result: mIoU/mAcc/allAcc 0.1234/0.2345/0.3456.', 'Class_0-wall Result: iou/accuracy ...',
'<<<<<<<<<<<<<<<<< End Evaluation <<<<<<<<<<<<<<<<<', 'Best validation mIoU updated to: ...',
'Currently Best mIoU: ...', 'Saving checkpoint to: exp/scannet/exp/model/model_last.pth'. The
data: ScanNet-like scenes preprocessed as one folder of .npy files per scene (coord, color,
normal, segment20), written at run time by `python tools/train.py --generate DIR`; the transform
pipeline CenterShift, RandomRotate, RandomFlip, GridSample(grid_size=0.05, hash_type='fnv',
mode='train', return_grid_coord=True), SphereCrop(point_max), NormalizeColor, ToTensor,
Collect(feat_keys=('color', 'normal')); point_collate_fn concatenates the variable-size scenes
and their cumulative offsets; a tiny "PT-v3m1" (per-point embedding, grid pooling over a coarser
voxel and unpooling, a seg head) in a DefaultSegmentorV2 with cross-entropy (ignore_index -1).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyseventh.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("MT_CASE", "")
DEFAULT_TIMEOUT = datetime.timedelta(seconds=15)
RANK = [0]
EPOCH = [0]
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int | None = None) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    r = RANK[0] if rank is None else rank
    return which == "" or int(which) == r


# ------------------------------------------------------------------ pointcept.utils.comm
_LOCAL_PROCESS_GROUP: Any = None


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    if get_world_size() > 1:
        dist.barrier()


# ------------------------------------------------------------------ pointcept.utils.logger
_initialized: dict[str, bool] = {}


def get_root_logger(log_file: str | None = None, file_mode: str = "a") -> logging.Logger:
    logger = logging.getLogger("pointcept")
    if "pointcept" in _initialized:
        return logger
    logger.propagate = False
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    rank = get_rank()
    if rank == 0 and log_file is not None:
        handlers.append(logging.FileHandler(log_file, file_mode))
    fmt = logging.Formatter(
        "[%(asctime)s %(levelname)s %(filename)s line %(lineno)d %(process)d] %(message)s"
    )
    for h in handlers:
        h.setFormatter(fmt)
        h.setLevel(logging.INFO)
        logger.addHandler(h)
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    _initialized["pointcept"] = True
    return logger


class ExceptionWriter:
    def __init__(self) -> None:
        self.logger = logging.getLogger("pointcept.utils.events")

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if exc_type:
            tb = traceback.format_exception(exc_type, exc_val, exc_tb)
            self.logger.error("".join(tb))
            sys.exit(1)  # This prevents double logging the error to the console


# ------------------------------------------------------------------ pointcept.utils.config
class ConfigDict(dict[str, Any]):
    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def _to_cd(v: Any) -> Any:
    if isinstance(v, dict):
        return ConfigDict({k: _to_cd(x) for k, x in v.items()})
    if isinstance(v, list):
        return [_to_cd(x) for x in v]
    return v


def _fmt(v: Any, indent: int) -> str:
    pad = " " * (indent + 4)
    if isinstance(v, dict):
        if not v:
            return "dict()"
        items = [f"{pad}{k}={_fmt(x, indent + 4)}" for k, x in v.items()]
        return "dict(\n" + ",\n".join(items) + ")"
    if isinstance(v, (list, tuple)):
        if v and any(isinstance(x, dict) for x in v):
            items = [f"{pad}{_fmt(x, indent + 4)}" for x in v]
            o, c = ("[", "]") if isinstance(v, list) else ("(", ")")
            return o + "\n" + ",\n".join(items) + c
        return repr(list(v) if isinstance(v, list) else tuple(v))
    return repr(v)


class Config:
    def __init__(self, d: dict[str, Any], filename: str) -> None:
        self._cfg = _to_cd(d)
        self.filename = filename

    @staticmethod
    def fromfile(path: str) -> Config:
        ns: dict[str, Any] = {}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)
        d: dict[str, Any] = {}
        for base in ns.get("_base_", []):
            d.update(Config.fromfile(os.path.join(os.path.dirname(path), base))._cfg)
        d.update({k: v for k, v in ns.items() if not k.startswith("_") and not callable(v)})
        return Config(d, path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_cfg" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_cfg"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_cfg", "filename"):
            self.__dict__[name] = value
        else:
            self._cfg[name] = value

    def merge_from_dict(self, options: dict[str, Any]) -> None:
        for key, value in options.items():
            d = self._cfg
            *parents, last = key.split(".")
            for p in parents:
                d = d.setdefault(p, ConfigDict())
            d[last] = _to_cd(value)

    @property
    def pretty_text(self) -> str:
        return "\n".join(f"{k} = {_fmt(v, 0)}" for k, v in self._cfg.items())

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.pretty_text + "\n")


class DictAction(argparse.Action):
    @staticmethod
    def _parse(val: str) -> Any:
        for conv in (int, float):
            try:
                return conv(val)
            except ValueError:
                pass
        if val.lower() in ("true", "false"):
            return val.lower() == "true"
        if val == "None":
            return None
        if val[:1] in "[(" and val[-1:] in ")]":
            return [DictAction._parse(v.strip()) for v in val[1:-1].split(",") if v.strip()]
        return val

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        options = {}
        for kv in values:
            key, val = kv.split("=", maxsplit=1)
            options[key] = self._parse(val)
        setattr(namespace, self.dest, options)


# ------------------------------------------------------------------ the data (ScanNet-like)
CLASS_NAMES = [
    "wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf",
    "picture", "counter", "desk", "curtain", "refridgerator", "shower curtain", "toilet", "sink",
    "bathtub", "otherfurniture",
]  # fmt: skip

CONFIG_SOURCE = """_base_ = ["../_base_/default_runtime.py"]

# misc custom setting
batch_size = 4  # bs: total bs in all gpus
num_worker = 2
mix_prob = 0.0
empty_cache = False
enable_amp = False
find_unused_parameters = False
seed = 38873367
epoch = 6
eval_epoch = 3
sync_bn = False
evaluate = True
resume = False
weight = None
save_path = "exp/default"
early_stop = None

# model settings
model = dict(
    type="DefaultSegmentorV2",
    num_classes=20,
    backbone_out_channels=32,
    backbone=dict(
        type="PT-v3m1",
        in_channels=6,
        order=("z", "z-trans", "hilbert", "hilbert-trans"),
        stride=(2,),
        enc_depths=(1, 1),
        enc_channels=(16, 32),
        dec_depths=(1,),
        dec_channels=(32,),
        mlp_ratio=4,
        enable_flash=False,
    ),
    criteria=[dict(type="CrossEntropyLoss", loss_weight=1.0, ignore_index=-1)],
)

# scheduler settings
optimizer = dict(type="AdamW", lr=0.002, weight_decay=0.05)
scheduler = dict(type="OneCycleLR", max_lr=[0.002], pct_start=0.05, anneal_strategy="cos",
                 div_factor=10.0, final_div_factor=1000.0)

# dataset settings
dataset_type = "ScanNetDataset"
data_root = "data/scannet"

data = dict(
    num_classes=20,
    ignore_index=-1,
    names=NAMES,
    train=dict(
        type=dataset_type,
        split="train",
        data_root=data_root,
        transform=[
            dict(type="CenterShift", apply_z=True),
            dict(type="RandomRotate", angle=[-1, 1], axis="z", center=[0, 0, 0], p=0.5),
            dict(type="RandomFlip", p=0.5),
            dict(type="GridSample", grid_size=0.05, hash_type="fnv", mode="train",
                 return_grid_coord=True),
            dict(type="SphereCrop", point_max=2048, mode="random"),
            dict(type="CenterShift", apply_z=False),
            dict(type="NormalizeColor"),
            dict(type="ToTensor"),
            dict(type="Collect", keys=("coord", "grid_coord", "segment"),
                 feat_keys=("color", "normal")),
        ],
        test_mode=False,
    ),
    val=dict(
        type=dataset_type,
        split="val",
        data_root=data_root,
        transform=[
            dict(type="CenterShift", apply_z=True),
            dict(type="GridSample", grid_size=0.05, hash_type="fnv", mode="train",
                 return_grid_coord=True),
            dict(type="CenterShift", apply_z=False),
            dict(type="NormalizeColor"),
            dict(type="ToTensor"),
            dict(type="Collect", keys=("coord", "grid_coord", "segment"),
                 feat_keys=("color", "normal")),
        ],
        test_mode=False,
    ),
)

hooks = [
    dict(type="CheckpointLoader"),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter"),
    dict(type="SemSegEvaluator"),
    dict(type="CheckpointSaver", save_freq=None),
    dict(type="EarlyStopper"),
]
""".replace("NAMES", repr(CLASS_NAMES))


def make_scene(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = int(rng.integers(2500, 4000))
    coord = rng.uniform([0, 0, 0], [3.0, 3.0, 2.0], size=(n, 3)).astype(np.float32)
    seg = np.full(n, 19, dtype=np.int16)
    seg[coord[:, 2] < 0.2] = 1  # floor
    near = (np.minimum(coord[:, :2], 3.0 - coord[:, :2]).min(1) < 0.3) & (coord[:, 2] >= 0.2)
    seg[near] = 0  # wall
    for _ in range(4):  # furniture boxes
        c = rng.uniform([0.5, 0.5, 0.2], [2.5, 2.5, 1.0])
        inside = (np.abs(coord - c) < [0.3, 0.3, 0.3]).all(1)
        seg[inside] = int(rng.integers(2, 19))
    seg[rng.random(n) < 0.02] = -1
    color = (seg[:, None] * 12 % 255 + rng.normal(0, 20, (n, 3))).clip(0, 255).astype(np.uint8)
    normal = rng.normal(0, 1, (n, 3)).astype(np.float32)
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    return {"coord": coord, "color": color, "normal": normal, "segment20": seg}


def generate(root: str) -> None:
    rng = np.random.default_rng(0)
    for split, count, first in (("train", 16, 0), ("val", 5, 600)):
        for i in range(count):
            folder = os.path.join(root, "data", "scannet", split, f"scene{first + i:04d}_00")
            os.makedirs(folder, exist_ok=True)
            for key, arr in make_scene(rng).items():
                np.save(os.path.join(folder, f"{key}.npy"), arr)
    cfg_dir = os.path.join(root, "configs", "scannet")
    os.makedirs(os.path.join(root, "configs", "_base_"), exist_ok=True)
    os.makedirs(cfg_dir, exist_ok=True)
    with open(os.path.join(root, "configs", "_base_", "default_runtime.py"), "w") as f:
        f.write("weight = None\nresume = False\nevaluate = True\n")
    with open(os.path.join(cfg_dir, "semseg-pt-v3m1-0-base.py"), "w") as f:
        f.write(CONFIG_SOURCE)


# ------------------------------------------------------------------ pointcept.datasets.transform
Data = dict[str, Any]


def fnv_hash_vec(arr: np.ndarray) -> np.ndarray:
    arr = arr.copy().astype(np.uint64)
    hashed = np.full(arr.shape[0], 14695981039346656037, dtype=np.uint64)
    for j in range(arr.shape[1]):
        hashed *= np.uint64(1099511628211)
        hashed = np.bitwise_xor(hashed, arr[:, j])
    return hashed


class CenterShift:
    def __init__(self, apply_z: bool = True) -> None:
        self.apply_z = apply_z

    def __call__(self, d: Data) -> Data:
        lo, hi = d["coord"].min(0), d["coord"].max(0)
        shift = (lo + hi) / 2
        if self.apply_z:
            shift[2] = lo[2]
        else:
            shift[2] = 0
        d["coord"] = d["coord"] - shift
        return d


class RandomRotate:
    def __init__(self, angle: Sequence[float], axis: str, center: Any, p: float) -> None:
        self.angle, self.p = angle, p

    def __call__(self, d: Data) -> Data:
        if np.random.rand() > self.p:
            return d
        a = np.random.uniform(self.angle[0], self.angle[1]) * np.pi
        c, s = np.cos(a), np.sin(a)
        rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=np.float32)
        d["coord"] = d["coord"] @ rot.T
        d["normal"] = d["normal"] @ rot.T
        return d


class RandomFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, d: Data) -> Data:
        if np.random.rand() < self.p:
            d["coord"][:, 0] = -d["coord"][:, 0]
            d["normal"][:, 0] = -d["normal"][:, 0]
        return d


_HASH_LOCK = threading.Lock()
_CALLS = [0]


class GridSample:
    def __init__(
        self, grid_size: float, hash_type: str, mode: str, return_grid_coord: bool
    ) -> None:
        self.grid_size, self.mode, self.return_grid_coord = grid_size, mode, return_grid_coord

    def __call__(self, d: Data) -> Data:
        scaled = d["coord"] / np.array(self.grid_size)
        grid_coord = np.floor(scaled).astype(int)
        min_coord = grid_coord.min(0)
        grid_coord -= min_coord
        _CALLS[0] += 1
        if fault("w") and _CALLS[0] > 20:  # a fork's hash-table cache, its lock taken twice
            _HASH_LOCK.acquire()
            _HASH_LOCK.acquire()
        key = fnv_hash_vec(grid_coord)
        idx_sort = np.argsort(key)
        key_sort = key[idx_sort]
        _, count = np.unique(key_sort, return_counts=True)
        idx_select = (
            np.cumsum(np.insert(count, 0, 0)[0:-1])
            + np.random.randint(0, count.max(), count.size) % count
        )
        idx_unique = idx_sort[idx_select]
        out = {k: (v[idx_unique] if isinstance(v, np.ndarray) else v) for k, v in d.items()}
        if self.return_grid_coord:
            out["grid_coord"] = grid_coord[idx_unique]
        return out


class SphereCrop:
    def __init__(self, point_max: int, mode: str) -> None:
        self.point_max = point_max

    def __call__(self, d: Data) -> Data:
        n = d["coord"].shape[0]
        if n <= self.point_max:
            return d
        center = d["coord"][np.random.randint(n)]
        idx = np.argsort(np.sum(np.square(d["coord"] - center), 1))[: self.point_max]
        return {k: (v[idx] if isinstance(v, np.ndarray) else v) for k, v in d.items()}


class NormalizeColor:
    def __call__(self, d: Data) -> Data:
        d["color"] = d["color"].astype(np.float32) / 127.5 - 1
        return d


class ToTensor:
    def __call__(self, d: Data) -> Data:
        out: Data = {}
        for k, v in d.items():
            if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.integer):
                out[k] = torch.from_numpy(v.astype(np.int64))
            elif isinstance(v, np.ndarray):
                out[k] = torch.from_numpy(v.astype(np.float32))
            else:
                out[k] = v
        return out


class Collect:
    def __init__(self, keys: Sequence[str], feat_keys: Sequence[str]) -> None:
        self.keys, self.feat_keys = keys, feat_keys

    def __call__(self, d: Data) -> Data:
        out = {k: d[k] for k in self.keys}
        out["offset"] = torch.tensor([d["coord"].shape[0]])
        out["feat"] = torch.cat([d[k].float() for k in self.feat_keys], dim=1)
        return out


TRANSFORMS: dict[str, Callable[..., Callable[[Data], Data]]] = {
    "CenterShift": CenterShift,
    "RandomRotate": RandomRotate,
    "RandomFlip": RandomFlip,
    "GridSample": GridSample,
    "SphereCrop": SphereCrop,
    "NormalizeColor": NormalizeColor,
    "ToTensor": ToTensor,
    "Collect": Collect,
}


class Compose:
    def __init__(self, cfg: list[dict[str, Any]]) -> None:
        self.transforms = []
        for t in cfg:
            t = dict(t)
            self.transforms.append(TRANSFORMS[t.pop("type")](**t))

    def __call__(self, d: Data) -> Data:
        for t in self.transforms:
            d = t(d)
        return d


class ScanNetDataset(Dataset[Data]):
    def __init__(
        self,
        split: str,
        data_root: str,
        transform: list[dict[str, Any]],
        test_mode: bool,
        loop: int = 1,
    ) -> None:
        self.data_root, self.split, self.loop = data_root, split, loop
        self.transform = Compose(transform)
        self.data_list = sorted(
            os.path.join(data_root, split, s) for s in os.listdir(os.path.join(data_root, split))
        )
        logger = get_root_logger()
        logger.info(f"Totally {len(self.data_list)} x {self.loop} samples in scannet {split} set.")

    def get_data(self, idx: int) -> Data:
        path = self.data_list[idx % len(self.data_list)]
        d: Data = {}
        for asset in ("coord", "color", "normal", "segment20"):
            d[asset] = np.load(os.path.join(path, f"{asset}.npy"))
        d["segment"] = d.pop("segment20").reshape([-1]).astype(np.int32)
        d["name"] = os.path.basename(path)
        return d

    def __getitem__(self, idx: int) -> Data:
        return self.transform(self.get_data(idx))

    def __len__(self) -> int:
        return len(self.data_list) * self.loop


def worker_init_fn(worker_id: int, num_workers: int, rank: int, seed: int) -> None:
    """The seed of each worker equals to num_worker * rank + worker_id + user_seed (a worker is
    a spawned process: it learns its rank here)."""
    RANK[0] = rank
    worker_seed = num_workers * rank + worker_id + seed
    np.random.seed(worker_seed)
    torch.manual_seed(worker_seed)


def point_collate_fn(batch: list[Data], mix_prob: float = 0.0) -> Data:
    out: Data = {}
    for k in batch[0]:
        if k == "offset":
            out[k] = torch.cumsum(torch.cat([b[k] for b in batch]), dim=0)
        else:
            out[k] = torch.cat([b[k] for b in batch])
    return out


class UnpaddedDistributedSampler(torch.utils.data.Sampler[int]):
    """A fork's exact validation split: each scene once, no padding to equal shares."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.n = len(dataset)  # type: ignore[arg-type]
        self.rank, self.world = get_rank(), get_world_size()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


# ------------------------------------------------------------------ pointcept.models
class Block(nn.Module):
    def __init__(self, c: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Sequential(
            nn.Linear(c, c * mlp_ratio), nn.GELU(), nn.Linear(c * mlp_ratio, c)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class PointTransformerV3(nn.Module):
    def __init__(
        self, in_channels: int, enc_channels: Sequence[int], mlp_ratio: int, **kw: Any
    ) -> None:
        super().__init__()
        c0, c1 = enc_channels
        self.embedding = nn.Sequential(nn.Linear(in_channels, c0), nn.LayerNorm(c0), nn.GELU())
        self.enc0 = Block(c0, mlp_ratio)
        self.down = nn.Linear(c0, c1)
        self.enc1 = Block(c1, mlp_ratio)
        self.up = nn.Linear(c1 + c0, c1)
        self.dec0 = Block(c1, mlp_ratio)

    def forward(self, data: Data) -> torch.Tensor:
        feat, grid, offset = data["feat"], data["grid_coord"], data["offset"]
        counts = torch.diff(offset, prepend=offset.new_zeros(1))
        batch = torch.repeat_interleave(torch.arange(len(counts)), counts)
        x = self.enc0(self.embedding(feat))
        # grid pooling: points of one coarser voxel (stride 2) of one scene share a cluster
        coarse = grid // 2
        key = ((batch * 4096 + coarse[:, 0]) * 4096 + coarse[:, 1]) * 4096 + coarse[:, 2]
        _, cluster = torch.unique(key, return_inverse=True)
        n = int(cluster.max()) + 1
        if fault("p") and EPOCH[0] >= 2:  # a fork's pooling counts voxels per scene, not per batch
            n = int(counts.max() // 8)
        if fault("z") and EPOCH[0] >= 2:
            ctypes.string_at(0)  # the compiled serialization kernel reads a freed buffer
        pooled = torch.zeros(n, self.down.out_features).index_add_(0, cluster, self.down(x))
        size = torch.zeros(n).index_add_(0, cluster, torch.ones(len(cluster))).clamp(min=1)
        y = self.enc1(pooled / size[:, None])
        return self.dec0(self.up(torch.cat([y[cluster], x], 1)))


class DefaultSegmentorV2(nn.Module):
    def __init__(
        self, num_classes: int, backbone_out_channels: int, backbone: dict[str, Any], criteria: Any
    ) -> None:
        super().__init__()
        backbone = dict(backbone)
        backbone.pop("type")
        self.backbone = PointTransformerV3(**backbone)
        self.seg_head = nn.Linear(backbone_out_channels, num_classes)
        self.criteria = nn.CrossEntropyLoss(ignore_index=-1)

    def forward(self, input_dict: Data) -> dict[str, torch.Tensor]:
        seg_logits = self.seg_head(self.backbone(input_dict))
        loss = self.criteria(seg_logits, input_dict["segment"])
        if self.training:
            return dict(loss=loss)
        return dict(loss=loss, seg_logits=seg_logits)


def intersection_and_union(
    output: torch.Tensor, target: torch.Tensor, k: int, ignore_index: int = -1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    output = output.clone()
    output[target == ignore_index] = ignore_index
    intersection = output[output == target]
    area_intersection = torch.histc(intersection.float(), bins=k, min=0, max=k - 1)
    area_output = torch.histc(output.float(), bins=k, min=0, max=k - 1)
    area_target = torch.histc(target.float(), bins=k, min=0, max=k - 1)
    return area_intersection, area_output + area_target - area_intersection, area_target


# ------------------------------------------------------------------ pointcept.utils.events
class History:
    def __init__(self) -> None:
        self.values: list[Any] = []

    @property
    def val(self) -> Any:
        return self.values[-1]

    @property
    def avg(self) -> Any:
        return sum(self.values) / len(self.values)

    @property
    def total(self) -> Any:
        return sum(self.values)

    def reset(self) -> None:
        self.values = []


class EventStorage:
    def __init__(self) -> None:
        self.h: dict[str, History] = {}

    def put_scalar(self, name: str, value: Any) -> None:
        self.h.setdefault(name, History()).values.append(value)

    def history(self, name: str) -> History:
        return self.h[name]

    def reset_histories(self) -> None:
        for h in self.h.values():
            h.reset()


# ------------------------------------------------------------------ pointcept.engines.hooks
class HookBase:
    trainer: Trainer

    def before_train(self) -> None: ...
    def before_epoch(self) -> None: ...
    def before_step(self) -> None: ...
    def after_step(self) -> None: ...
    def after_epoch(self) -> None: ...
    def after_train(self) -> None: ...


class CheckpointLoader(HookBase):
    def before_train(self) -> None:
        self.trainer.logger.info("=> Loading checkpoint & weight ...")
        if self.trainer.cfg.weight:
            self.trainer.logger.info(f"Loading weight at: {self.trainer.cfg.weight}")
        else:
            self.trainer.logger.info(f"No weight found at: {self.trainer.cfg.weight}")


class IterationTimer(HookBase):
    def __init__(self, warmup_iter: int = 1) -> None:
        self._warmup_iter = warmup_iter
        self._t = time.perf_counter()
        self._remain_iter = 0

    def before_train(self) -> None:
        t = self.trainer
        self._remain_iter = (t.max_epoch - t.start_epoch) * len(t.train_loader)

    def before_epoch(self) -> None:
        self._t = time.perf_counter()

    def before_step(self) -> None:
        now = time.perf_counter()
        self.trainer.storage.put_scalar("data_time", now - self._t)
        self._t = now

    def after_step(self) -> None:
        st = self.trainer.storage
        now = time.perf_counter()
        st.put_scalar("batch_time", now - self._t + st.history("data_time").val)
        self._t = now
        self._remain_iter -= 1
        remain = self._remain_iter * st.history("batch_time").avg
        m, s = divmod(remain, 60)
        h, m = divmod(m, 60)
        self.trainer.comm_info["iter_info"] += (
            f"Data {st.history('data_time').val:.3f} ({st.history('data_time').avg:.3f}) "
            f"Batch {st.history('batch_time').val:.3f} ({st.history('batch_time').avg:.3f}) "
            f"Remain {int(h):02d}:{int(m):02d}:{int(s):02d} "
        )
        if self.trainer.comm_info["iter"] <= self._warmup_iter:
            st.history("data_time").reset()
            st.history("batch_time").reset()


class InformationWriter(HookBase):
    def before_train(self) -> None:
        self.trainer.comm_info["iter_info"] = ""

    def before_step(self) -> None:
        t = self.trainer
        t.comm_info["iter_info"] += (
            f"Train: [{t.epoch + 1}/{t.max_epoch}][{t.comm_info['iter'] + 1}/{len(t.train_loader)}] "
        )

    def after_step(self) -> None:
        t = self.trainer
        out = t.comm_info["model_output_dict"]
        for key, v in out.items():
            t.storage.put_scalar(key, v.item())
        info = t.comm_info["iter_info"]
        for key in out:
            info += f"{key}: {t.storage.history(key).val:.4f} "
        lr = t.optimizer.state_dict()["param_groups"][0]["lr"]
        info += f"Lr: {lr:.5f}"
        t.logger.info(info)
        t.comm_info["iter_info"] = ""

    def after_epoch(self) -> None:
        self.trainer.logger.info(
            f"Train result: loss: {self.trainer.storage.history('loss').avg:.4f} "
        )


class SemSegEvaluator(HookBase):
    def after_epoch(self) -> None:
        if not self.trainer.cfg.evaluate:
            return
        if fault("v") and not is_main_process():
            return  # a fork evaluates on the main process only
        self.eval()

    def eval(self) -> None:
        t = self.trainer
        t.logger.info(">>>>>>>>>>>>>>>> Start Evaluation >>>>>>>>>>>>>>>>")
        t.model.eval()
        k = t.cfg.data.num_classes
        for i, input_dict in enumerate(t.val_loader):
            with torch.no_grad():
                output_dict = t.model(input_dict)
            pred = output_dict["seg_logits"].max(1)[1]
            intersection, union, target = intersection_and_union(pred, input_dict["segment"], k)
            if get_world_size() > 1:
                dist.all_reduce(intersection), dist.all_reduce(union), dist.all_reduce(target)
            t.storage.put_scalar("val_intersection", intersection.numpy())
            t.storage.put_scalar("val_union", union.numpy())
            t.storage.put_scalar("val_target", target.numpy())
            t.storage.put_scalar("val_loss", output_dict["loss"].item())
            t.logger.info(
                f"Test: [{i + 1}/{len(t.val_loader)}] Loss {output_dict['loss'].item():.4f} "
            )
        intersection = t.storage.history("val_intersection").total
        union = t.storage.history("val_union").total
        target = t.storage.history("val_target").total
        iou_class = intersection / (union + 1e-10)
        acc_class = intersection / (target + 1e-10)
        m_iou, m_acc = float(np.mean(iou_class)), float(np.mean(acc_class))
        all_acc = float(sum(intersection) / (sum(target) + 1e-10))
        t.logger.info(f"Val result: mIoU/mAcc/allAcc {m_iou:.4f}/{m_acc:.4f}/{all_acc:.4f}.")
        for i in range(k):
            t.logger.info(
                f"Class_{i}-{t.cfg.data.names[i]} Result: iou/accuracy "
                f"{iou_class[i]:.4f}/{acc_class[i]:.4f}"
            )
        t.logger.info("<<<<<<<<<<<<<<<<< End Evaluation <<<<<<<<<<<<<<<<<")
        t.comm_info["current_metric_value"] = m_iou
        t.comm_info["current_metric_name"] = "mIoU"

    def after_train(self) -> None:
        self.trainer.logger.info(f"Best mIoU: {self.trainer.best_metric_value:.4f}")


class CheckpointSaver(HookBase):
    def __init__(self, save_freq: int | None = None) -> None:
        self.save_freq = save_freq

    def after_epoch(self) -> None:
        t = self.trainer
        if not is_main_process():
            return
        if t.cfg.evaluate:
            value = t.comm_info["current_metric_value"]
            name = t.comm_info["current_metric_name"]
            if value > t.best_metric_value:
                t.best_metric_value = value
                t.logger.info(f"Best validation {name} updated to: {value:.4f}")
            t.logger.info(f"Currently Best {name}: {t.best_metric_value:.4f}")
        filename = os.path.join(t.cfg.save_path, "model", "model_last.pth")
        t.logger.info("Saving checkpoint to: " + filename)
        torch.save(
            {
                "epoch": t.epoch + 1,
                "state_dict": t.model.state_dict(),
                "optimizer": t.optimizer.state_dict(),
                "best_metric_value": t.best_metric_value,
            },
            filename + ".tmp",
        )
        if fault("s"):  # save_path sits on a congested NFS mount: the write crawls
            time.sleep(40)
        os.replace(filename + ".tmp", filename)


class EarlyStopper(HookBase):
    """A fork's early stop: cfg.early_stop = (patience, min_delta) on the all-reduced mIoU, the
    same on every rank; or, in the fault below, on the rank's own training loss."""

    def __init__(self) -> None:
        self.best, self.bad = -np.inf, 0

    def after_epoch(self) -> None:
        t = self.trainer
        if fault("x") and t.epoch >= 0:  # a fork's stop on the rank's own loss plateau
            sys.exit(0)
        if not t.cfg.early_stop or not t.cfg.evaluate:
            return
        patience, min_delta = t.cfg.early_stop
        value = t.comm_info["current_metric_value"]
        if value > self.best + min_delta:
            self.best, self.bad = value, 0
            return
        self.bad += 1
        if self.bad >= patience:
            t.logger.info(
                f"Early stopping: mIoU has not improved by {min_delta} for {self.bad} "
                f"evaluation(s), stop at epoch {t.epoch + 1}/{t.max_epoch}"
            )
            t.stop_training = True


HOOKS: dict[str, Callable[..., HookBase]] = {
    "CheckpointLoader": CheckpointLoader,
    "IterationTimer": IterationTimer,
    "InformationWriter": InformationWriter,
    "SemSegEvaluator": SemSegEvaluator,
    "CheckpointSaver": CheckpointSaver,
    "EarlyStopper": EarlyStopper,
}


# ------------------------------------------------------------------ pointcept.engines.train
class Trainer:
    def __init__(self, cfg: Config) -> None:
        self.epoch, self.start_epoch = 0, 0
        self.max_epoch = cfg.eval_epoch
        self.best_metric_value = -torch.inf
        self.stop_training = False
        self.comm_info: dict[str, Any] = {}
        self.logger = get_root_logger(
            log_file=os.path.join(cfg.save_path, "train.log"),
            file_mode="a" if cfg.resume else "w",
        )
        self.logger.info("=> Loading config ...")
        self.cfg = cfg
        self.logger.info(f"Save path: {cfg.save_path}")
        self.logger.info(f"Config:\n{cfg.pretty_text}")
        self.logger.info("=> Building model ...")
        self.model = self.build_model()
        self.logger.info("=> Building writer ...")
        self.logger.info(f"Tensorboard writer logging dir: {cfg.save_path}")
        self.init_fn = partial(
            worker_init_fn, num_workers=cfg.num_worker_per_gpu, rank=get_rank(), seed=cfg.seed
        )
        self.logger.info("=> Building train dataset & dataloader ...")
        self.train_loader = self.build_train_loader()
        self.logger.info("=> Building val dataset & dataloader ...")
        self.val_loader = self.build_val_loader()
        self.logger.info("=> Building optimize, scheduler, scaler(amp) ...")
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer,
            max_lr=cfg.scheduler.max_lr,
            total_steps=max(cfg.eval_epoch * len(self.train_loader), 1),
            pct_start=cfg.scheduler.pct_start,
            anneal_strategy=cfg.scheduler.anneal_strategy,
            div_factor=cfg.scheduler.div_factor,
            final_div_factor=cfg.scheduler.final_div_factor,
        )
        self.scaler = torch.amp.GradScaler("cuda") if cfg.enable_amp else None
        self.logger.info("=> Building hooks ...")
        self.hooks: list[HookBase] = []
        for h in cfg.hooks:
            h = dict(h)
            hook = HOOKS[h.pop("type")](**h)
            hook.trainer = self
            self.hooks.append(hook)

    def build_model(self) -> nn.Module:
        m = dict(self.cfg.model)
        m.pop("type")
        model = DefaultSegmentorV2(**m)
        n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.logger.info(f"Num params: {n_parameters}")
        if get_world_size() == 1:
            return model
        return DistributedDataParallel(
            model, broadcast_buffers=False, find_unused_parameters=self.cfg.find_unused_parameters
        )

    def build_train_loader(self) -> DataLoader[Data]:
        d = dict(self.cfg.data.train)
        d.pop("type")
        train_data = ScanNetDataset(**d)
        sampler = (
            torch.utils.data.distributed.DistributedSampler(train_data)
            if get_world_size() > 1
            else None
        )
        return DataLoader(
            train_data,
            batch_size=self.cfg.batch_size_per_gpu,
            shuffle=sampler is None,
            num_workers=self.cfg.num_worker_per_gpu,
            sampler=sampler,
            collate_fn=partial(point_collate_fn, mix_prob=self.cfg.mix_prob),
            worker_init_fn=self.init_fn,
            drop_last=len(train_data) > self.cfg.batch_size,
            persistent_workers=True,
        )

    def build_val_loader(self) -> DataLoader[Data]:
        d = dict(self.cfg.data.val)
        d.pop("type")
        val_data = ScanNetDataset(**d)
        sampler: Any = None
        if get_world_size() > 1:
            if fault("u"):  # a fork's exact split for the metric: each scene once, no padding
                sampler = UnpaddedDistributedSampler(val_data)
            else:
                sampler = torch.utils.data.distributed.DistributedSampler(val_data)
        return DataLoader(
            val_data,
            batch_size=self.cfg.batch_size_val_per_gpu,
            shuffle=False,
            num_workers=self.cfg.num_worker_per_gpu,
            sampler=sampler,
            collate_fn=point_collate_fn,
            worker_init_fn=self.init_fn,
        )

    def train(self) -> None:
        self.storage = EventStorage()
        with ExceptionWriter():
            for h in self.hooks:
                h.before_train()
            self.logger.info(">>>>>>>>>>>>>>>> Start Training >>>>>>>>>>>>>>>>")
            for self.epoch in range(self.start_epoch, self.max_epoch):  # noqa: B020
                EPOCH[0] = self.epoch + 1
                if get_world_size() > 1:
                    self.train_loader.sampler.set_epoch(self.epoch)  # type: ignore[attr-defined]
                self.model.train()
                for h in self.hooks:
                    h.before_epoch()
                for self.comm_info["iter"], self.comm_info["input_dict"] in enumerate(  # noqa: B020
                    self.train_loader
                ):
                    for h in self.hooks:
                        h.before_step()
                    self.run_step()
                    for h in self.hooks:
                        h.after_step()
                for h in self.hooks:
                    h.after_epoch()
                self.storage.reset_histories()
                if self.stop_training:
                    break
            synchronize()
            for h in self.hooks:
                h.after_train()

    def run_step(self) -> None:
        input_dict = self.comm_info["input_dict"]
        self.optimizer.zero_grad()
        with torch.amp.autocast(device_type="cuda", enabled=self.cfg.enable_amp):
            output_dict = self.model(input_dict)
            loss = output_dict["loss"]
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.scheduler.step()
        if fault("k") and EPOCH[0] >= 2:  # a fork keeps every batch for its visualiser
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        self.comm_info["model_output_dict"] = output_dict


# ------------------------------------------------------------------ pointcept.engines.defaults
def default_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        epilog=f"""
    Examples:
    Run on single machine:
        $ {sys.argv[0]} --num-gpus 8 --config-file cfg.yaml
    Run on multiple machines:
        (machine0)$ {sys.argv[0]} --machine-rank 0 --num-machines 2 --dist-url <URL> [--other-flags]
        (machine1)$ {sys.argv[0]} --machine-rank 1 --num-machines 2 --dist-url <URL> [--other-flags]
    """,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to config file")
    parser.add_argument("--num-gpus", type=int, default=1, help="number of gpus *per machine*")
    parser.add_argument("--num-machines", type=int, default=1, help="total number of machines")
    parser.add_argument(
        "--machine-rank", type=int, default=0, help="the rank of this machine (unique per machine)"
    )
    parser.add_argument(
        "--dist-url",
        default="auto",
        help="initialization URL for pytorch distributed backend. See "
        "https://pytorch.org/docs/stable/distributed.html for details.",
    )
    parser.add_argument("--options", nargs="+", action=DictAction, help="custom options")
    return parser


def default_config_parser(file_path: str, options: dict[str, Any] | None) -> Config:
    cfg = Config.fromfile(file_path)
    if options is not None:
        cfg.merge_from_dict(options)
    cfg.data.train.loop = cfg.epoch // cfg.eval_epoch
    os.makedirs(os.path.join(cfg.save_path, "model"), exist_ok=True)
    if not cfg.resume:
        cfg.dump(os.path.join(cfg.save_path, "config.py"))
    return cfg


def default_setup(cfg: Config) -> Config:
    world_size = get_world_size()
    cfg.num_worker_per_gpu = cfg.num_worker // world_size
    assert cfg.batch_size % world_size == 0
    cfg.batch_size_per_gpu = cfg.batch_size // world_size
    cfg.batch_size_val_per_gpu = 1
    assert cfg.epoch % cfg.eval_epoch == 0
    rank = get_rank()
    seed = cfg.seed + rank * cfg.num_worker_per_gpu
    np.random.seed(seed)
    torch.manual_seed(cfg.seed)
    return cfg


# ------------------------------------------------------------------ pointcept.engines.launch
def _find_free_port() -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def launch(
    main_func: Callable[..., None],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    cfg: tuple[Any, ...] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a fork's torchrun support
        _distributed_worker(
            int(os.environ["LOCAL_RANK"]), main_func, int(os.environ["WORLD_SIZE"]),
            int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["GROUP_RANK"]), "env://", cfg,
            timeout,
        )  # fmt: skip
        return
    world_size = num_machines * num_gpus_per_machine
    if world_size > 1:
        if dist_url == "auto":
            assert num_machines == 1, "dist_url=auto not supported in multi-machine jobs."
            port = _find_free_port()
            dist_url = f"tcp://127.0.0.1:{port}"
        mp.spawn(
            _distributed_worker,
            nprocs=num_gpus_per_machine,
            args=(
                main_func, world_size, num_gpus_per_machine, machine_rank, dist_url, cfg, timeout,
            ),
            daemon=False,
        )  # fmt: skip
    else:
        main_func(*cfg)


def _distributed_worker(
    local_rank: int,
    main_func: Callable[..., None],
    world_size: int,
    num_gpus_per_machine: int,
    machine_rank: int,
    dist_url: str,
    cfg: tuple[Any, ...],
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    global _LOCAL_PROCESS_GROUP
    global_rank = machine_rank * num_gpus_per_machine + local_rank
    RANK[0] = global_rank
    try:
        dist.init_process_group(
            backend="gloo",
            init_method=dist_url,
            world_size=world_size,
            rank=global_rank,
            timeout=timeout,
        )
    except Exception as e:
        logger = logging.getLogger(__name__)
        logger.error(f"Process group URL: {dist_url}")
        raise e
    assert _LOCAL_PROCESS_GROUP is None
    num_machines = world_size // num_gpus_per_machine
    for i in range(num_machines):
        ranks_on_i = list(range(i * num_gpus_per_machine, (i + 1) * num_gpus_per_machine))
        pg = dist.new_group(ranks_on_i)
        if i == machine_rank:
            _LOCAL_PROCESS_GROUP = pg
    synchronize()
    main_func(*cfg)


# ------------------------------------------------------------------ tools/train.py
def main_worker(cfg: Config) -> None:
    cfg = default_setup(cfg)
    trainer = Trainer(cfg)
    trainer.train()


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
        return
    args = default_argument_parser().parse_args()
    cfg = default_config_parser(args.config_file, args.options)
    launch(
        main_worker,
        num_gpus_per_machine=args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        cfg=(cfg,),
    )


if __name__ == "__main__":
    main()
