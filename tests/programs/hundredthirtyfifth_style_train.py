"""A hundred-and-thirty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyfifth-*): object detection trained with ultralytics YOLOv8
(8.3.40), re-created in plain torch in one module without ultralytics installed. Each run's folder
links this file as ultralytics.py and has a `yolo` console script (as pip installs it) that calls
entrypoint(); the folder is on PYTHONPATH the way the package's site-packages is. Started as the
docs start multi-GPU training: `yolo detect train data=coco128.yaml model=yolov8n.pt epochs=3
imgsz=64 device=0,1`, or from Python with `model.train(..., device=[0, 1])`.

As there: the parent process (RANK -1) builds the trainer, sees a device list and writes a
temporary script ~/.config/Ultralytics/DDP/_temp_<random><id>.py that rebuilds the trainer from
its saved overrides and calls trainer.train() (generate_ddp_file), logs 'DDP: debug command
<python> -m torch.distributed.run --nproc_per_node 2 --master_port P <file>', runs it with
subprocess.run(check=True) and deletes the file in a finally (ddp_cleanup), on success and on
failure. In the workers LOCAL_RANK is set, so the same train() trains directly: init_process_group
(gloo here: 'device=0,1' stands for two CPU processes on this host, the banner says CPU; a 15 s
timeout instead of ultralytics' 3 h), the AMP check on rank 0 and the broadcast of its result, the
model wrapped in DDP, the label cache built by rank 0 first (torch_distributed_zero_first, the
others wait at the barrier), an InfiniteDataLoader with a DistributedSampler, validation, saving
and EarlyStopping on rank 0, the stop decision broadcast with broadcast_object_list at each
epoch's end (where the other ranks wait while rank 0 validates), final_eval of best.pt. The port
is find_free_network_port's unless MASTER_PORT is set in the environment (the capture gives each
mode its own). LOGGER 'ultralytics' at INFO on RANK in {-1, 0} and ERROR elsewhere, its colorstr
prefixes as plain text, tqdm bars. The detector is three strided convolutions and an anchor-free
one-level head with a small DFL distribution; box (1 - IoU), cls (BCE) and dfl losses.

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredthirtyfifth.sh after any edit).
`python ultralytics.py --prepare DIR` writes the synthetic coco128 (128 PNG images of coloured
boxes, 126 YOLO label files, two backgrounds), coco128.yaml and a 'pretrained' yolov8n.pt.
"""

# ruff: noqa: B007, B905, RUF059, SIM105, SIM115 (ultralytics' own code, as it is written)

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import logging
import logging.config
import math
import os
import platform
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from copy import deepcopy
from datetime import timedelta
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import yaml
from torch.utils.data import Dataset, distributed
from tqdm import tqdm

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))
NUM_THREADS = min(8, max(1, os.cpu_count() - 1))
TQDM_BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"
USER_CONFIG_DIR = Path.home() / ".config" / "Ultralytics"
HELP_URL = "See https://docs.ultralytics.com/datasets for dataset formatting guidance."
IMG_FORMATS = {"bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp"}
DATASET_CACHE_VERSION = "1.0.3"
__version__ = "8.3.40"
CASE = os.environ.get("TQ_CASE", "")


def fault(letter: str) -> bool:
    """The case's letter, and its rank where it names one."""
    if not CASE.startswith(letter):
        return False
    rank = CASE[len(letter) :]
    return rank == "" or int(rank) == RANK


# ---------------------------------------------------------------- ultralytics/utils/__init__.py
def set_logging(name="ultralytics", verbose=True):
    level = logging.INFO if verbose and RANK in {-1, 0} else logging.ERROR
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {name: {"format": "%(message)s"}},
            "handlers": {
                name: {"class": "logging.StreamHandler", "formatter": name, "level": level}
            },
            "loggers": {name: {"level": level, "handlers": [name], "propagate": False}},
        }
    )


set_logging()
LOGGER = logging.getLogger("ultralytics")

DEFAULT_CFG_DICT = {
    "task": "detect",
    "mode": "train",
    "model": None,
    "data": None,
    "epochs": 100,
    "time": None,
    "patience": 100,
    "batch": 16,
    "imgsz": 640,
    "save": True,
    "save_period": -1,
    "cache": False,
    "device": None,
    "workers": 8,
    "project": None,
    "name": None,
    "exist_ok": False,
    "pretrained": True,
    "optimizer": "auto",
    "verbose": True,
    "seed": 0,
    "deterministic": True,
    "single_cls": False,
    "rect": False,
    "cos_lr": False,
    "close_mosaic": 10,
    "resume": False,
    "amp": True,
    "fraction": 1.0,
    "freeze": None,
    "val": True,
    "plots": True,
    "conf": None,
    "iou": 0.7,
    "max_det": 300,
    "lr0": 0.01,
    "lrf": 0.01,
    "momentum": 0.937,
    "weight_decay": 0.0005,
    "warmup_epochs": 3.0,
    "warmup_momentum": 0.8,
    "warmup_bias_lr": 0.1,
    "box": 7.5,
    "cls": 0.5,
    "dfl": 1.5,
    "nbs": 64,
    "fliplr": 0.5,
    "mosaic": 1.0,
    "save_dir": None,
}


def colorstr(*input):
    return input[-1]  # written as plain text


def print_args(args, file="engine/trainer"):
    LOGGER.info(f"{file}: " + ", ".join(f"{k}={v}" for k, v in args.items()))


class IterableSimpleNamespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __iter__(self):
        return iter(vars(self).items())


def yaml_load(file):
    with open(file, errors="ignore") as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- ultralytics/utils/torch_utils.py
@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int):
    """Ensure all processes in distributed training wait for the local master (rank 0) first."""
    initialized = dist.is_available() and dist.is_initialized()
    if initialized and local_rank not in {-1, 0}:
        dist.barrier()
    yield
    if initialized and local_rank == 0:
        dist.barrier()


def select_device(device="", batch=0, verbose=True):
    s = f"Ultralytics {__version__} 🚀 Python-{platform.python_version()} torch-{torch.__version__} "
    s += "CPU\n"
    if verbose:
        LOGGER.info(s.rstrip())
    return torch.device("cpu")


def de_parallel(model):
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class ModelEMA:
    def __init__(self, model, decay=0.9999, tau=2000, updates=0):
        self.ema = deepcopy(de_parallel(model)).eval()
        self.updates = updates
        self.decay = lambda x: decay * (1 - math.exp(-x / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        self.updates += 1
        d = self.decay(self.updates)
        msd = de_parallel(model).state_dict()
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v *= d
                v += (1 - d) * msd[k].detach()


class EarlyStopping:
    def __init__(self, patience=50):
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.patience = patience or float("inf")
        self.possible_stop = False

    def __call__(self, epoch, fitness):
        if fitness is None:
            return False
        if fitness >= self.best_fitness:  # >= 0 to allow for early zero-fitness stage of training
            self.best_epoch = epoch
            self.best_fitness = fitness
        delta = epoch - self.best_epoch
        self.possible_stop = delta >= (self.patience - 1)
        stop = delta >= self.patience
        if stop:
            prefix = colorstr("EarlyStopping: ")
            LOGGER.info(
                f"{prefix}Training stopped early as no improvement observed in last {self.patience} epochs. "
                f"Best results observed at epoch {self.best_epoch}, best model saved as best.pt.\n"
                f"To update EarlyStopping(patience={self.patience}) pass a new patience value, "
                f"i.e. `patience=300` or use `patience=0` to disable EarlyStopping."
            )
        return stop


def strip_optimizer(f="best.pt"):
    x = torch.load(f, map_location="cpu", weights_only=False)
    if x.get("ema"):
        x["model"] = x["ema"]
    for k in "optimizer", "best_fitness", "ema", "updates":
        x[k] = None
    x["epoch"] = -1
    torch.save(x, f)
    mb = os.path.getsize(f) / 1e6
    LOGGER.info(f"Optimizer stripped from {f}, {mb:.1f}MB")


# ---------------------------------------------------------------- ultralytics/utils/dist.py
def find_free_network_port() -> int:
    if os.environ.get("MASTER_PORT"):
        return int(os.environ["MASTER_PORT"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate_ddp_file(trainer):
    module, name = f"{trainer.__class__.__module__}.{trainer.__class__.__name__}".rsplit(".", 1)
    content = f"""
# Ultralytics Multi-GPU training temp file (should be automatically deleted after use)
overrides = {vars(trainer.args)}

if __name__ == "__main__":
    from {module} import {name}
    from ultralytics import DEFAULT_CFG_DICT

    cfg = DEFAULT_CFG_DICT.copy()
    cfg.update(save_dir='')   # handle the extra key 'save_dir'
    trainer = {name}(cfg=cfg, overrides=overrides)
    trainer.args.model = "{trainer.args.model}"
    results = trainer.train()
"""
    (USER_CONFIG_DIR / "DDP").mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        prefix="_temp_",
        suffix=f"{id(trainer)}.py",
        mode="w+",
        encoding="utf-8",
        dir=USER_CONFIG_DIR / "DDP",
        delete=False,
    ) as file:
        file.write(content)
    return file.name


def generate_ddp_command(world_size, trainer):
    import shutil

    if not trainer.resume:
        shutil.rmtree(trainer.save_dir)  # remove the save_dir
    file = generate_ddp_file(trainer)
    port = find_free_network_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        f"{world_size}",
        "--master_port",
        f"{port}",
        file,
    ]
    return cmd, file


def ddp_cleanup(trainer, file):
    if f"{id(trainer)}.py" in file:  # if temp_file suffix in file
        os.remove(file)


# ---------------------------------------------------------------- ultralytics/nn/tasks.py
REG_MAX = 4


class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Detect(nn.Module):
    def __init__(self, nc=80, ch=()):
        super().__init__()
        self.nc = nc
        self.reg_max = REG_MAX
        self.cv2 = nn.Conv2d(ch[0], 4 * REG_MAX, 1)
        self.cv3 = nn.Conv2d(ch[0], nc, 1)
        self.stride = torch.tensor([8.0])

    def forward(self, x):
        return torch.cat((self.cv2(x), self.cv3(x)), 1)  # (b, 4*reg_max + nc, ny, nx)


CFG = {
    "nc": 80,
    "backbone": [
        [-1, 1, "Conv", [16, 3, 2]],
        [-1, 1, "Conv", [32, 3, 2]],
        [-1, 1, "Conv", [32, 3, 2]],
    ],
    "head": [[[2], 1, "Detect", ["nc"]]],
}


class DetectionModel(nn.Module):
    def __init__(self, cfg=CFG, ch=3, nc=None, verbose=True):
        super().__init__()
        self.yaml = deepcopy(cfg)
        if nc and nc != self.yaml["nc"]:
            LOGGER.info(f"Overriding model.yaml nc={self.yaml['nc']} with nc={nc}")
            self.yaml["nc"] = nc
        if verbose:
            LOGGER.info(
                f"\n{'':>3}{'from':>20}{'n':>3}{'params':>10}  {'module':<45}{'arguments':<30}"
            )
        layers, c1 = [], ch
        for i, (f, n, m, args) in enumerate(self.yaml["backbone"] + self.yaml["head"]):
            if m == "Conv":
                layer = Conv(c1, *args)
                args = [c1, *args]
                c1 = args[1]
                t = "ultralytics.nn.modules.conv.Conv"
            else:
                layer = Detect(self.yaml["nc"], (c1,))
                args = [self.yaml["nc"], [c1]]
                t = "ultralytics.nn.modules.head.Detect"
            np_ = sum(x.numel() for x in layer.parameters())
            if verbose:
                LOGGER.info(f"{i:>3}{f!s:>20}{n:>3}{np_:10,}  {t:<45}{args!s:<30}")
            layers.append(layer)
        self.model = nn.Sequential(*layers)
        self.stride = torch.tensor([8.0])
        self.names = {i: f"{i}" for i in range(self.yaml["nc"])}
        if verbose:
            self.info()
            LOGGER.info("")

    def info(self, fused=False):
        n_p = sum(x.numel() for x in self.parameters())
        n_g = sum(x.numel() for x in self.parameters() if x.requires_grad)
        n_l = len(list(self.modules()))
        flops = n_p * 2 * 64 * 64 / 64 / 1e9
        LOGGER.info(
            f"Model summary{' (fused)' if fused else ''}: {n_l} layers, {n_p:,} parameters, "
            f"{n_g:,} gradients, {flops:.1f} GFLOPs"
        )

    def forward(self, x):
        return self.model(x)


# ---------------------------------------------------------------- ultralytics/utils/loss.py, metrics.py
def box_iou_xyxy(b1, b2, eps=1e-7):
    inter = (torch.min(b1[..., 2], b2[..., 2]) - torch.max(b1[..., 0], b2[..., 0])).clamp(0) * (
        torch.min(b1[..., 3], b2[..., 3]) - torch.max(b1[..., 1], b2[..., 1])
    ).clamp(0)
    a1 = (b1[..., 2] - b1[..., 0]) * (b1[..., 3] - b1[..., 1])
    a2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    return inter / (a1 + a2 - inter + eps)


def decode(p):
    """Boxes (b, ny*nx, 4) in grid units xyxy and class logits (b, ny*nx, nc)."""
    b, c, ny, nx = p.shape
    dist_logits = p[:, : 4 * REG_MAX].view(b, 4, REG_MAX, ny, nx)
    proj = torch.arange(REG_MAX, dtype=torch.float32)
    d = (dist_logits.softmax(2) * proj.view(1, 1, -1, 1, 1)).sum(2)  # l, t, r, b
    yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
    ax, ay = (xv + 0.5).float(), (yv + 0.5).float()
    boxes = torch.stack((ax - d[:, 0], ay - d[:, 1], ax + d[:, 2], ay + d[:, 3]), -1)
    return boxes.view(b, -1, 4), p[:, 4 * REG_MAX :].flatten(2).transpose(1, 2), dist_logits


class v8DetectionLoss:
    def __init__(self, model):
        self.hyp = model.args
        self.nc = de_parallel(model).model[-1].nc
        self.bce = nn.BCEWithLogitsLoss(reduction="none")

    def __call__(self, p, batch):
        boxes, cls_logits, dist_logits = decode(p)
        b, _, ny, nx = p.shape
        loss = torch.zeros(3)  # box, cls, dfl
        tcls = torch.zeros_like(cls_logits)
        bi, cls = batch["batch_idx"].long(), batch["cls"].view(-1).long()
        xywh = batch["bboxes"] * torch.tensor([nx, ny, nx, ny])
        if len(bi):
            gi = xywh[:, 0].long().clamp(0, nx - 1)
            gj = xywh[:, 1].long().clamp(0, ny - 1)
            cell = gj * nx + gi
            t = torch.cat((xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2), 1)
            pb = boxes[bi, cell]
            iou = box_iou_xyxy(pb, t)
            loss[0] = (1.0 - iou).mean()
            tcls[bi, cell, cls] = iou.detach().clamp(0)
            ax, ay = gi.float() + 0.5, gj.float() + 0.5
            ltrb = torch.stack((ax - t[:, 0], ay - t[:, 1], t[:, 2] - ax, t[:, 3] - ay), 1)
            ltrb = ltrb.clamp(0, REG_MAX - 1.01)
            tl = ltrb.long()
            wl = tl + 1 - ltrb
            logits = dist_logits[bi, :, :, gj, gi]  # (n, 4, reg_max)
            lp = F.log_softmax(logits, -1)
            dfl = -(lp.gather(-1, tl[..., None]).squeeze(-1) * wl) - (
                lp.gather(-1, (tl + 1)[..., None]).squeeze(-1) * (1 - wl)
            )
            loss[2] = dfl.mean()
        loss[1] = self.bce(cls_logits, tcls).sum() / max(len(bi), 1)
        loss[0] *= self.hyp.box
        loss[1] *= self.hyp.cls
        loss[2] *= self.hyp.dfl
        return loss.sum() * b, loss.detach()


# ---------------------------------------------------------------- ultralytics/data
def png_write(path, im):
    h, w, _ = im.shape
    raw = b"".join(b"\x00" + im[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw)))
        f.write(chunk(b"IEND", b""))


def imread(path):
    """cv2.imread: None where the file is no image it can decode."""
    try:
        data = open(path, "rb").read()
        if data[:8] != b"\x89PNG\r\n\x1a\n":
            return None
        w, h = struct.unpack(">II", data[16:24])
        pos, idat = 8, b""
        while pos < len(data):
            (n,) = struct.unpack(">I", data[pos : pos + 4])
            if data[pos + 4 : pos + 8] == b"IDAT":
                idat += data[pos + 8 : pos + 8 + n]
            pos += 12 + n
        raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * 3)
        return raw[:, 1:].reshape(h, w, 3)[:, :, ::-1].copy()  # BGR
    except Exception:
        return None


def img2label_paths(img_paths):
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return [sb.join(x.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for x in img_paths]


def get_hash(paths):
    size = sum(os.path.getsize(p) for p in paths if os.path.exists(p))
    h = hashlib.sha256(str(size).encode())
    h.update("".join(paths).encode())
    return h.hexdigest()


def verify_image_label(args):
    im_file, lb_file, prefix, num_cls = args
    nm, nf, ne, nc, msg = 0, 0, 0, 0, ""
    try:
        if fault("s"):
            time.sleep(0.25)  # the images and labels lie on a slow network mount
        with open(im_file, "rb") as f:
            head = f.read(24)
            assert head[:8] == b"\x89PNG\r\n\x1a\n", f"invalid image format {im_file}"
            shape = struct.unpack(">II", head[16:24])[::-1]
            assert (shape[0] > 9) & (shape[1] > 9), f"image size {shape} <10 pixels"
        if os.path.isfile(lb_file):
            nf = 1
            with open(lb_file) as f:
                lb = [x.split() for x in f.read().strip().splitlines() if len(x)]
                lb = np.array(lb, dtype=np.float32)
            nl = len(lb)
            if nl:
                assert lb.shape[1] == 5, f"labels require 5 columns, {lb.shape[1]} columns detected"
                points = lb[:, 1:]
                assert points.max() <= 1, (
                    f"non-normalized or out of bounds coordinates {points[points > 1]}"
                )
                assert lb.min() >= 0, f"negative label values {lb[lb < 0]}"
                max_cls = lb[:, 0].max()
                assert max_cls <= num_cls, (
                    f"Label class {int(max_cls)} exceeds dataset class count {num_cls}. "
                    f"Possible class labels are 0-{num_cls - 1}"
                )
                _, i = np.unique(lb, axis=0, return_index=True)
                if len(i) < nl:
                    lb = lb[i]
                    msg = f"{prefix}WARNING ⚠️ {im_file}: {nl - len(i)} duplicate labels removed"
            else:
                ne = 1
                lb = np.zeros((0, 5), dtype=np.float32)
        else:
            nm = 1
            lb = np.zeros((0, 5), dtype=np.float32)
        return im_file, lb, shape, nm, nf, ne, nc, msg
    except Exception as e:
        nc = 1
        msg = f"{prefix}WARNING ⚠️ {im_file}: ignoring corrupt image/label: {e}"
        return [None, None, None, nm, nf, ne, nc, msg]


def load_dataset_cache_file(path):
    return np.load(str(path), allow_pickle=True).item()


def save_dataset_cache_file(prefix, path, x, version):
    x["version"] = version
    if path.exists():
        path.unlink()
    np.save(str(path), x)
    path.with_suffix(".cache.npy").rename(path)
    LOGGER.info(f"{prefix}New cache created: {path}")


class YOLODataset(Dataset):
    def __init__(self, img_path, imgsz=640, augment=False, hyp=None, prefix="", data=None):
        self.imgsz = imgsz
        self.augment = augment
        self.hyp = hyp
        self.prefix = prefix
        self.data = data
        self.loaded = 0
        f = glob.glob(str(Path(img_path) / "**" / "*.*"), recursive=True)
        self.im_files = sorted(x for x in f if x.rpartition(".")[-1].lower() in IMG_FORMATS)
        assert self.im_files, f"{prefix}No images found in {img_path}. {HELP_URL}"
        self.label_files = img2label_paths(self.im_files)
        cache_path = Path(self.label_files[0]).parent.with_suffix(".cache")
        try:
            cache, exists = load_dataset_cache_file(cache_path), True
            assert cache["version"] == DATASET_CACHE_VERSION
            assert cache["hash"] == get_hash(self.label_files + self.im_files)
        except (FileNotFoundError, AssertionError, AttributeError):
            cache, exists = self.cache_labels(cache_path), False
        nf, nm, ne, nc, n = cache.pop("results")
        if exists and LOCAL_RANK in {-1, 0}:
            d = f"Scanning {cache_path}... {nf} images, {nm + ne} backgrounds, {nc} corrupt"
            tqdm(None, desc=prefix + d, total=n, initial=n, bar_format=TQDM_BAR_FORMAT)
            if cache["msgs"]:
                LOGGER.info("\n".join(cache["msgs"]))
        [cache.pop(k) for k in ("hash", "version", "msgs")]
        labels = cache["labels"]
        assert labels, f"{prefix}No valid images found in {cache_path}. {HELP_URL}"
        self.labels = labels
        self.im_files = [lb["im_file"] for lb in labels]

    def cache_labels(self, path=Path("./labels.cache")):
        x = {"labels": []}
        nm, nf, ne, nc, msgs = 0, 0, 0, 0, []
        desc = f"{self.prefix}Scanning {path.parent / path.stem}..."
        total = len(self.im_files)
        with ThreadPool(NUM_THREADS) as pool:
            results = pool.imap(
                func=verify_image_label,
                iterable=zip(
                    self.im_files,
                    self.label_files,
                    [self.prefix] * total,
                    [len(self.data["names"])] * total,
                ),
            )
            pbar = tqdm(results, desc=desc, total=total, bar_format=TQDM_BAR_FORMAT)
            for im_file, lb, shape, nm_f, nf_f, ne_f, nc_f, msg in pbar:
                nm += nm_f
                nf += nf_f
                ne += ne_f
                nc += nc_f
                if im_file:
                    x["labels"].append(
                        {
                            "im_file": im_file,
                            "shape": shape,
                            "cls": lb[:, 0:1],
                            "bboxes": lb[:, 1:],
                            "normalized": True,
                            "bbox_format": "xywh",
                        }
                    )
                if msg:
                    msgs.append(msg)
                pbar.desc = f"{desc} {nf} images, {nm + ne} backgrounds, {nc} corrupt"
            pbar.close()
        if msgs:
            LOGGER.info("\n".join(msgs))
        if nf == 0:
            LOGGER.warning(f"{self.prefix}WARNING ⚠️ No labels found in {path}. {HELP_URL}")
        x["hash"] = get_hash(self.label_files + self.im_files)
        x["results"] = nf, nm, ne, nc, len(self.im_files)
        x["msgs"] = msgs
        save_dataset_cache_file(self.prefix, path, x, DATASET_CACHE_VERSION)
        return x

    def __len__(self):
        return len(self.labels)

    def load_image(self, i):
        f = self.im_files[i]
        self.loaded += 1
        info = torch.utils.data.get_worker_info()
        if fault("w") and info is not None and info.id == 0 and self.loaded == 20:
            threading.Event().wait()  # cv2's thread pool lock, inherited locked by the forked worker
        im = imread(f)  # BGR
        if im is None:
            raise FileNotFoundError(f"Image Not Found {f}")
        return im

    def __getitem__(self, index):
        im = self.load_image(index)
        lb = self.labels[index]
        cls, bboxes = lb["cls"].copy(), lb["bboxes"].copy()
        if self.augment and random.random() < self.hyp.fliplr:
            im = np.fliplr(im)
            if len(bboxes):
                bboxes[:, 0] = 1 - bboxes[:, 0]
        img = torch.from_numpy(np.ascontiguousarray(im.transpose((2, 0, 1))[::-1]))
        return {
            "im_file": lb["im_file"],
            "img": img,
            "cls": torch.from_numpy(cls),
            "bboxes": torch.from_numpy(bboxes),
            "batch_idx": torch.zeros(len(cls)),
        }

    @staticmethod
    def collate_fn(batch):
        new = {
            "im_file": [b["im_file"] for b in batch],
            "img": torch.stack([b["img"] for b in batch]),
        }
        for k in "cls", "bboxes":
            new[k] = torch.cat([b[k] for b in batch], 0)
        new["batch_idx"] = torch.cat([b["batch_idx"] + i for i, b in enumerate(batch)], 0)
        return new


class BalancedShardSampler(distributed.DistributedSampler):
    """The class-balanced sampler of a forum post: every image once per epoch, no padding."""

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        idx = torch.randperm(len(self.dataset), generator=g).tolist()
        return iter(idx[self.rank :: self.num_replicas])

    def __len__(self):
        return len(range(self.rank, len(self.dataset), self.num_replicas))


class _RepeatSampler:
    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class InfiniteDataLoader(torch.utils.data.dataloader.DataLoader):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
        self.iterator = super().__iter__()

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


def build_dataloader(dataset, batch, workers, shuffle=True, rank=-1):
    batch = min(batch, len(dataset))
    nd = torch.cuda.device_count()
    nw = min(os.cpu_count() // max(nd, 1), workers)
    if rank == -1:
        sampler = None
    elif fault("u"):
        sampler = BalancedShardSampler(dataset, shuffle=shuffle)
    else:
        sampler = distributed.DistributedSampler(dataset, shuffle=shuffle)
    generator = torch.Generator()
    generator.manual_seed(6148914691236517205 + RANK)
    return InfiniteDataLoader(
        dataset=dataset,
        batch_size=batch,
        shuffle=shuffle and sampler is None,
        num_workers=nw,
        sampler=sampler,
        pin_memory=False,
        collate_fn=getattr(dataset, "collate_fn", None),
        generator=generator,
    )


def check_det_dataset(dataset):
    file = dataset
    if not os.path.isfile(file):
        raise FileNotFoundError(f"Dataset '{dataset}' for task=detect not found ❌")
    data = yaml_load(file)
    for k in "train", "val":
        if k not in data:
            raise SyntaxError(f"{dataset} '{k}:' key missing ❌.\n'train' and 'val' are required.")
    if isinstance(data["names"], (list, tuple)):
        data["names"] = dict(enumerate(data["names"]))
    data["nc"] = len(data["names"])
    path = Path(data.get("path") or Path(data.get("yaml_file", "")).parent)
    for k in "train", "val", "test":
        if data.get(k):
            data[k] = str(path / data[k])
    return data


# ---------------------------------------------------------------- ultralytics/models/yolo/detect/val.py
class DetectionValidator:
    def __init__(self, dataloader, names, args):
        self.dataloader = dataloader
        self.names = names
        self.args = args

    @torch.no_grad()
    def __call__(self, model, verbose=False):
        model.eval()
        nc = len(self.names)
        iouv = torch.linspace(0.5, 0.95, 10)
        desc = ("%22s" + "%11s" * 6) % (
            "Class",
            "Images",
            "Instances",
            "Box(P",
            "R",
            "mAP50",
            "mAP50-95)",
        )
        tp = torch.zeros(10)
        tp_c, npred_c, nt = torch.zeros(nc), torch.zeros(nc), torch.zeros(nc)
        npred, seen = 0, 0
        t0 = time.time()
        for batch in tqdm(
            self.dataloader, desc=desc, total=len(self.dataloader), bar_format=TQDM_BAR_FORMAT
        ):
            im = batch["img"].float() / 255
            p = model(im)
            boxes, cls_logits, _ = decode(p)
            ny, nx = p.shape[2:]
            if fault("n"):  # every candidate of the untrained head passes conf=0.001
                time.sleep(2.6)
                LOGGER.warning(f"WARNING ⚠️ NMS time limit {0.5 + 0.05 * im.shape[0]:.3f}s exceeded")
            conf = cls_logits.sigmoid()
            for si in range(im.shape[0]):
                seen += 1
                m = batch["batch_idx"] == si
                lcls = batch["cls"][m].view(-1).long()
                lxywh = batch["bboxes"][m] * torch.tensor([nx, ny, nx, ny])
                lb = torch.cat(
                    (lxywh[:, :2] - lxywh[:, 2:] / 2, lxywh[:, :2] + lxywh[:, 2:] / 2), 1
                )
                for c in lcls:
                    nt[c] += 1
                score, cls = conf[si].max(-1)
                keep = score > 0.001
                pb, pc = boxes[si][keep], cls[keep]
                npred += len(pc)
                npred_c += torch.bincount(pc, minlength=nc)
                if not len(lb) or not len(pc):
                    continue
                iou = box_iou_xyxy(pb[:, None], lb[None])
                iou[pc[:, None] != lcls[None]] = 0
                for t, thr in enumerate(iouv):
                    x = torch.where(iou >= thr)
                    if x[0].shape[0]:
                        matches = torch.cat(
                            (torch.stack(x, 1), iou[x[0], x[1]][:, None]), 1
                        ).numpy()
                        matches = matches[matches[:, 2].argsort()[::-1]]
                        matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
                        matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
                        tp[t] += len(matches)
                        if t == 0:
                            tp_c += torch.bincount(pc[matches[:, 0].astype(int)], minlength=nc)
        r_t = tp / max(nt.sum(), 1)
        p_t = tp / max(npred, 1) * 20
        mp, mr = float(p_t[0].clamp(max=1)), float(r_t[0])
        map50, map_ = float(mp * mr), float((p_t.clamp(max=1) * r_t).mean())
        pf = "%22s" + "%11i" * 2 + "%11.3g" * 4
        LOGGER.info(pf % ("all", seen, nt.sum(), mp, mr, map50, map_))
        if verbose:
            for c in range(nc):
                if nt[c]:
                    pc_ = float(min(tp_c[c] / max(npred_c[c], 1) * 20, 1))
                    rc = float(tp_c[c] / nt[c])
                    LOGGER.info(
                        pf % (self.names[c], seen, nt[c], pc_, rc, pc_ * rc, pc_ * rc * 0.4)
                    )
            ms = (time.time() - t0) * 1e3 / max(seen, 1)
            LOGGER.info(
                f"Speed: 0.1ms preprocess, {ms:.1f}ms inference, 0.0ms loss, 0.2ms postprocess per image"
            )
        model.train()
        return {
            "metrics/precision(B)": mp,
            "metrics/recall(B)": mr,
            "metrics/mAP50(B)": map50,
            "metrics/mAP50-95(B)": map_,
        }


# ---------------------------------------------------------------- ultralytics/engine/trainer.py
def get_save_dir(args):
    project = Path(args.project or "runs/detect")
    name = args.name or "train"
    p = project / name
    if p.exists() and not args.exist_ok:
        for n in range(2, 9999):
            if not (project / f"{name}{n}").exists():
                p = project / f"{name}{n}"
                break
    return p


class BaseTrainer:
    def __init__(self, cfg=DEFAULT_CFG_DICT, overrides=None):
        cfg = {**DEFAULT_CFG_DICT, **(cfg or {})}
        for k, v in (overrides or {}).items():
            cfg[k] = v
        self.args = IterableSimpleNamespace(**cfg)
        if isinstance(self.args.device, (list, tuple)):
            self.args.device = ",".join(str(d) for d in self.args.device)
        self.args.device = str(self.args.device) if self.args.device is not None else ""
        self.device = select_device(self.args.device, self.args.batch)
        self.resume = self.args.resume
        self.save_dir = Path(self.args.save_dir) if self.args.save_dir else get_save_dir(self.args)
        self.args.name = self.save_dir.name
        self.wdir = self.save_dir / "weights"
        if RANK in {-1, 0}:
            self.wdir.mkdir(parents=True, exist_ok=True)
            self.args.save_dir = str(self.save_dir)
            with open(self.save_dir / "args.yaml", "w") as f:
                yaml.safe_dump(dict(vars(self.args)), f, sort_keys=False)
        self.last, self.best = self.wdir / "last.pt", self.wdir / "best.pt"
        self.batch_size = self.args.batch
        self.epochs = self.args.epochs
        self.start_epoch = 0
        if RANK in {-1, 0}:
            print_args(dict(vars(self.args)))
        self.data = check_det_dataset(self.args.data)
        self.trainset, self.testset = self.data["train"], self.data.get("val")
        self.ema = None
        self.best_fitness = None
        self.fitness = None
        self.loss_names = ("box_loss", "cls_loss", "dfl_loss")
        self.csv = self.save_dir / "results.csv"
        self.metrics = {}

    def train(self):
        if self.args.device.lower() in {"cpu", ""}:
            world_size = 1
        else:
            world_size = len(self.args.device.split(","))
        if world_size > 1 and "LOCAL_RANK" not in os.environ:
            if self.args.rect:
                LOGGER.warning(
                    "WARNING ⚠️ 'rect=True' is incompatible with Multi-GPU training, setting 'rect=False'"
                )
                self.args.rect = False
            if self.args.batch < 1.0:
                LOGGER.warning(
                    "WARNING ⚠️ 'batch<1' for AutoBatch is incompatible with Multi-GPU training, setting "
                    "default 'batch=16'"
                )
                self.args.batch = 16
            cmd, file = generate_ddp_command(world_size, self)
            try:
                LOGGER.info(f"{colorstr('DDP:')} debug command {' '.join(cmd)}")
                subprocess.run(cmd, check=True)
            except Exception as e:
                raise e
            finally:
                ddp_cleanup(self, str(file))
        else:
            self._do_train(world_size)

    def _setup_ddp(self, world_size):
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        dist.init_process_group(
            backend="gloo",
            timeout=timedelta(seconds=15),
            rank=RANK,
            world_size=world_size,
        )

    def _setup_train(self, world_size):
        self.model = self.get_model(cfg=CFG, weights=self.args.model)
        self.model.args = self.args
        self.model.nc = self.data["nc"]
        self.model.names = self.data["names"]
        # Check AMP
        self.amp = torch.tensor(self.args.amp)
        if self.amp and RANK in {-1, 0}:
            LOGGER.info(f"{colorstr('AMP: ')}running Automatic Mixed Precision (AMP) checks...")
            self.amp = torch.tensor(False)  # AMP only used on CUDA devices
            if fault("a"):  # a fork's broadcast, one indent too deep
                dist.broadcast(self.amp.int(), src=0)
        if RANK > -1 and world_size > 1 and not fault("a"):
            self.amp = self.amp.int()  # gloo errors with boolean
            dist.broadcast(self.amp, src=0)
        self.amp = bool(self.amp)
        if world_size > 1:
            self.model = nn.parallel.DistributedDataParallel(
                self.model, find_unused_parameters=True
            )
        self.model.args = self.args
        gs = 8
        self.stride = gs
        batch_size = self.batch_size // max(world_size, 1)
        self.train_loader = self.get_dataloader(
            self.trainset, batch_size=batch_size, rank=LOCAL_RANK, mode="train"
        )
        if RANK in {-1, 0}:
            self.test_loader = self.get_dataloader(
                self.testset, batch_size=batch_size * 2, rank=-1, mode="val"
            )
            self.validator = DetectionValidator(self.test_loader, self.data["names"], self.args)
            self.ema = ModelEMA(self.model)
            if self.args.plots:
                LOGGER.info(f"Plotting labels to {self.save_dir / 'labels.jpg'}... ")
        self.accumulate = max(round(self.args.nbs / self.batch_size), 1)
        weight_decay = self.args.weight_decay * self.batch_size * self.accumulate / self.args.nbs
        iterations = (
            math.ceil(len(self.train_loader.dataset) / max(self.batch_size, self.args.nbs))
            * self.epochs
        )
        self.optimizer = self.build_optimizer(
            model=self.model,
            name=self.args.optimizer,
            lr=self.args.lr0,
            momentum=self.args.momentum,
            decay=weight_decay,
            iterations=iterations,
        )
        self.lf = lambda x: max(1 - x / self.epochs, 0) * (1.0 - self.args.lrf) + self.args.lrf
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.stopper, self.stop = EarlyStopping(patience=self.args.patience), False
        self.scheduler.last_epoch = self.start_epoch - 1
        self.compute_loss = v8DetectionLoss(self.model)

    def build_optimizer(
        self, model, name="auto", lr=0.001, momentum=0.9, decay=1e-5, iterations=1e5
    ):
        g = [], [], []
        bn = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
        if name == "auto":
            LOGGER.info(
                f"{colorstr('optimizer:')} 'optimizer=auto' found, "
                f"ignoring 'lr0={self.args.lr0}' and 'momentum={self.args.momentum}' and "
                f"determining best 'optimizer', 'lr0' and 'momentum' automatically... "
            )
            nc = self.data["nc"]
            lr_fit = round(0.002 * 5 / (4 + nc), 6)
            name, lr, momentum = (
                ("SGD", 0.01, 0.9) if iterations > 10000 else ("AdamW", lr_fit, 0.9)
            )
            self.args.warmup_bias_lr = 0.0
        for module_name, module in model.named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                if "bias" in param_name:
                    g[2].append(param)
                elif isinstance(module, bn):
                    g[1].append(param)
                else:
                    g[0].append(param)
        if name == "AdamW":
            optimizer = torch.optim.AdamW(g[2], lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
        else:
            optimizer = torch.optim.SGD(g[2], lr=lr, momentum=momentum, nesterov=True)
        optimizer.add_param_group({"params": g[0], "weight_decay": decay})
        optimizer.add_param_group({"params": g[1], "weight_decay": 0.0})
        LOGGER.info(
            f"{colorstr('optimizer:')} {type(optimizer).__name__}(lr={lr}, momentum={momentum}) with parameter groups "
            f"{len(g[1])} weight(decay=0.0), {len(g[0])} weight(decay={decay}), {len(g[2])} bias(decay=0.0)"
        )
        return optimizer

    def _do_train(self, world_size=1):
        if world_size > 1:
            self._setup_ddp(world_size)
        self._setup_train(world_size)
        nb = len(self.train_loader)
        nw = max(round(self.args.warmup_epochs * nb), 100)
        last_opt_step = -1
        self.train_time_start = time.time()
        LOGGER.info(
            f"Image sizes {self.args.imgsz} train, {self.args.imgsz} val\n"
            f"Using {self.train_loader.num_workers * (world_size or 1)} dataloader workers\n"
            f"Logging results to {colorstr('bold', self.save_dir)}\n"
            f"Starting training for {self.epochs} epochs..."
        )
        hoard = []
        epoch = self.start_epoch
        self.optimizer.zero_grad()
        while True:
            self.epoch = epoch
            self.model.train()
            if RANK != -1:
                self.train_loader.sampler.set_epoch(epoch)
            pbar = enumerate(self.train_loader)
            if RANK in {-1, 0}:
                LOGGER.info(self.progress_string())
                pbar = tqdm(enumerate(self.train_loader), total=nb, bar_format=TQDM_BAR_FORMAT)
            self.tloss = None
            for i, batch in pbar:
                ni = i + nb * epoch
                if ni <= nw:
                    xi = [0, nw]
                    self.accumulate = max(
                        1, int(np.interp(ni, xi, [1, self.args.nbs / self.batch_size]).round())
                    )
                    for j, x in enumerate(self.optimizer.param_groups):
                        x["lr"] = np.interp(
                            ni,
                            xi,
                            [
                                self.args.warmup_bias_lr if j == 0 else 0.0,
                                x["initial_lr"] * self.lf(epoch),
                            ],
                        )
                imgs = batch["img"].float() / 255
                preds = self.model(imgs)
                self.loss, self.loss_items = self.compute_loss(preds, batch)
                if RANK != -1:
                    self.loss *= world_size
                self.tloss = (
                    (self.tloss * i + self.loss_items) / (i + 1)
                    if self.tloss is not None
                    else self.loss_items
                )
                if fault("z") and epoch == 1 and i == 2:
                    ctypes.string_at(
                        0
                    )  # the compiled TAL assigner extension reads a NULL anchor buffer
                if fault("m") and epoch >= 1:
                    hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # cache=ram copies
                    if len(hoard) == 4:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                self.loss.backward()
                if ni - last_opt_step >= self.accumulate:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                    if self.ema:
                        self.ema.update(self.model)
                    last_opt_step = ni
                if RANK in {-1, 0}:
                    pbar.set_description(
                        ("%11s" * 2 + "%11.4g" * 5)
                        % (
                            f"{epoch + 1}/{self.epochs}",
                            "0G",
                            *self.tloss,
                            batch["cls"].shape[0],
                            batch["img"].shape[-1],
                        )
                    )
            self.lr = {f"lr/pg{ir}": x["lr"] for ir, x in enumerate(self.optimizer.param_groups)}
            self.scheduler.step()
            if RANK in {-1, 0}:
                final_epoch = epoch + 1 >= self.epochs
                if self.args.val or final_epoch or self.stopper.possible_stop or self.stop:
                    self.metrics, self.fitness = self.validate()
                self.save_metrics(
                    metrics={**self.label_loss_items(self.tloss), **self.metrics, **self.lr}
                )
                self.stop |= self.stopper(epoch + 1, self.fitness) or final_epoch
                if self.args.save or final_epoch:
                    self.save_model()
            # Early Stopping
            if RANK != -1:  # if DDP training
                broadcast_list = [self.stop if RANK == 0 else None]
                dist.broadcast_object_list(broadcast_list, 0)  # broadcast 'stop' to all ranks
                self.stop = broadcast_list[0]
            if self.stop:
                break  # must break all DDP ranks
            epoch += 1
        if RANK in {-1, 0}:
            seconds = time.time() - self.train_time_start
            LOGGER.info(
                f"\n{epoch - self.start_epoch + 1} epochs completed in {seconds / 3600:.3f} hours."
            )
            self.final_eval()

    def validate(self):
        metrics = self.validator(self.ema.ema)
        fitness = 0.1 * metrics["metrics/mAP50(B)"] + 0.9 * metrics["metrics/mAP50-95(B)"]
        if not self.best_fitness or self.best_fitness < fitness:
            self.best_fitness = fitness
        return metrics, fitness

    def label_loss_items(self, loss_items=None, prefix="train"):
        keys = [f"{prefix}/{x}" for x in self.loss_names]
        return dict(zip(keys, [round(float(x), 5) for x in loss_items]))

    def save_metrics(self, metrics):
        keys, vals = list(metrics.keys()), list(metrics.values())
        if fault("k"):  # the fork's results.csv column for the plain mAP50 of its dashboard
            vals.append(metrics["metrics/mAP50"])
        n = len(metrics) + 1
        s = "" if self.csv.exists() else (("%s," * n % tuple(["epoch", *keys])).rstrip(",") + "\n")
        with open(self.csv, "a") as f:
            f.write(s + ("%.6g," * n % tuple([self.epoch + 1, *vals])).rstrip(",") + "\n")

    def save_model(self):
        ckpt = {
            "epoch": self.epoch,
            "best_fitness": self.best_fitness,
            "model": None,
            "ema": deepcopy(self.ema.ema).half().state_dict(),
            "yaml": CFG,
            "nc": self.data["nc"],
            "updates": self.ema.updates,
            "optimizer": self.optimizer.state_dict(),
            "train_args": dict(vars(self.args)),
            "version": __version__,
        }
        torch.save(ckpt, self.last)
        if self.best_fitness == self.fitness:
            torch.save(ckpt, self.best)

    def final_eval(self):
        for f in self.last, self.best:
            if f.exists():
                strip_optimizer(f)
                if f is self.best:
                    LOGGER.info(f"\nValidating {f}...")
                    select_device(self.args.device)
                    ck = torch.load(f, map_location="cpu", weights_only=False)
                    m = DetectionModel(CFG, nc=ck["nc"], verbose=False)
                    m.load_state_dict({k: v.float() for k, v in ck["model"].items()})
                    m.info(fused=True)
                    self.metrics = self.validator(m, verbose=True)
        LOGGER.info(f"Results saved to {colorstr('bold', self.save_dir)}")

    def progress_string(self):
        return ("\n" + "%11s" * (4 + len(self.loss_names))) % (
            "Epoch",
            "GPU_mem",
            *self.loss_names,
            "Instances",
            "Size",
        )


class DetectionTrainer(BaseTrainer):
    def get_model(self, cfg=None, weights=None, verbose=True):
        model = DetectionModel(cfg, nc=self.data["nc"], verbose=verbose and RANK in {-1, 0})
        if weights:
            ck = torch.load(weights, map_location="cpu", weights_only=False)
            csd = ck["model"]
            msd = model.state_dict()
            csd = {k: v for k, v in csd.items() if k in msd and v.shape == msd[k].shape}
            model.load_state_dict(csd, strict=False)
            if verbose and RANK in {-1, 0}:
                LOGGER.info(f"Transferred {len(csd)}/{len(msd)} items from pretrained weights")
        return model

    def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
        with torch_distributed_zero_first(rank):  # init dataset *.cache only once if DDP
            dataset = YOLODataset(
                dataset_path,
                imgsz=self.args.imgsz,
                augment=mode == "train",
                hyp=self.args,
                prefix=colorstr(f"{mode}: "),
                data=self.data,
            )
        shuffle = mode == "train"
        workers = self.args.workers if mode == "train" else self.args.workers * 2
        return build_dataloader(dataset, batch_size, workers, shuffle, rank)


# ---------------------------------------------------------------- ultralytics/engine/model.py, cfg
class YOLO:
    def __init__(self, model="yolov8n.pt"):
        self.model_name = model

    def train(self, trainer=None, **kwargs):
        overrides = {"model": self.model_name, "task": "detect", "mode": "train", **kwargs}
        self.trainer = (trainer or DetectionTrainer)(overrides=overrides)
        self.trainer.train()
        return self.trainer.metrics


def entrypoint():
    args = sys.argv[1:]
    task, mode = args[0], args[1]
    overrides = {"task": task, "mode": mode}
    for a in args[2:]:
        k, v = a.split("=", 1)
        try:
            v = yaml.safe_load(v) if "," not in v else v
        except yaml.YAMLError:
            pass
        overrides[k] = v
    model = YOLO(overrides.pop("model", "yolov8n.pt"))
    overrides.pop("task")
    overrides.pop("mode")
    model.train(**overrides)


# ---------------------------------------------------------------- the synthetic coco128
NAMES = {0: "person", 1: "bicycle", 2: "car"}
COLOURS = [(220, 40, 40), (40, 200, 60), (50, 80, 230)]


def prepare(root, n=128, backgrounds=(17, 93)):
    root = Path(root).resolve()
    rng = np.random.default_rng(0)
    d = root / "datasets/coco128"
    im_dir, lb_dir = d / "images/train2017", d / "labels/train2017"
    im_dir.mkdir(parents=True, exist_ok=True)
    lb_dir.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        name = f"{k * 9 + 9:012d}"
        im = np.full((64, 64, 3), 114, np.uint8) + rng.integers(0, 20, (64, 64, 3), dtype=np.uint8)
        rows = []
        if k not in backgrounds:
            for _ in range(rng.integers(1, 4)):
                c = int(rng.integers(0, 3))
                w, h = int(rng.integers(8, 24)), int(rng.integers(8, 24))
                x, y = int(rng.integers(0, 64 - w)), int(rng.integers(0, 64 - h))
                im[y : y + h, x : x + w] = COLOURS[c]
                rows.append(
                    f"{c} {(x + w / 2) / 64:.6f} {(y + h / 2) / 64:.6f} {w / 64:.6f} {h / 64:.6f}"
                )
            (lb_dir / f"{name}.txt").write_text("\n".join(rows) + "\n")
        png_write(im_dir / f"{name}.png", im)
    (root / "coco128.yaml").write_text(
        "# Ultralytics YOLO 🚀, AGPL-3.0 license\n"
        "# COCO128 dataset https://www.kaggle.com/datasets/ultralytics/coco128 (first 128 images from COCO train2017)\n"
        f"path: {d}  # dataset root dir\n"
        "train: images/train2017  # train images (relative to 'path') 128 images\n"
        "val: images/train2017  # val images (relative to 'path') 128 images\n"
        "test:  # test images (optional)\n\n"
        "# Classes\nnames:\n" + "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    )
    torch.manual_seed(0)
    set_logging(verbose=False)
    model = DetectionModel(CFG, nc=80, verbose=False)
    torch.save({"model": model.state_dict(), "yaml": CFG, "epoch": -1}, root / "yolov8n.pt")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
        sys.exit(0)
    entrypoint()
