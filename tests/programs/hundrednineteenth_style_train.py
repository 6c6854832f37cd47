"""A hundred-and-nineteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundrednineteenth-*): object detection trained in the way of
ultralytics/yolov5's train.py (v7.0), re-created in plain torch in one file without ultralytics
or yolov5 installed. Started as yolov5's README starts multi-GPU training: `python -m
torch.distributed.run --nproc_per_node 2 train.py --batch 16 --data coco128.yaml --weights
yolov5s.pt --img 64 --device cpu --epochs 3`, after `python train.py --prepare .` wrote the
synthetic dataset (datasets/coco128: 128 PNG images of coloured boxes, 126 label txt files in
YOLO format, two backgrounds), data/coco128.yaml, data/hyps/hyp.scratch-low.yaml and a
'pretrained' yolov5s.pt of the tiny detector. As there: LOCAL_RANK/RANK/WORLD_SIZE from the
environment; LOGGER 'yolov5' at INFO on RANK in {-1, 0} and ERROR elsewhere (the other ranks
are silent unless they raise), its colorstr prefixes as plain text ('train: ', 'github: ',
'hyperparameters: ', 'AutoAnchor: ', 'optimizer: '), print_args, select_device's banner, the
model table and 'Model summary: ...', torch_distributed_zero_first(LOCAL_RANK) around
check_dataset, the weights load and the train dataset (rank 0 scans the images and labels and
writes labels/train2017.cache; the others load the cache after the barrier; a cache whose hash
of paths and sizes matches is trusted), verify_image_label's warnings ('ignoring corrupt
image/label: labels require 5 columns, 6 columns detected', 'N duplicate labels removed'),
InfiniteDataLoader with a DistributedSampler, smart_DDP, gradient accumulation to a nominal
batch of 64 with warmup, ModelEMA and val.run on rank 0 only, the tqdm tables of training and
validation, EarlyStopping(patience) whose decision rank 0 broadcasts with broadcast_object_list,
last.pt/best.pt, strip_optimizer, --resume (get_latest_run, opt.yaml of the run). The detector is
three strided convolutions and a one-level Detect head with three anchors; the loss has box,
obj and cls terms; mosaic and HSV augmentation are not re-created (flips only). gloo on CPU, 15 s
collective timeout. A fault in the code is chosen by the TQ_CASE environment variable (a letter
and a rank) and never printed (re-capture with tests/fixtures/real/capture_hundrednineteenth.sh
after any edit).
"""

# ruff: noqa: B007, B905, E741, F841, RUF059, SIM115 (yolov5's own code, as it is written)

from __future__ import annotations

import argparse
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
import struct
import sys
import threading
import time
import zlib
from copy import deepcopy
from datetime import datetime, timedelta
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, distributed
from tqdm import tqdm

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))
NUM_THREADS = min(8, max(1, os.cpu_count() - 1))
TQDM_BAR_FORMAT = "{l_bar}{bar:10}{r_bar}"
HELP_URL = "See https://docs.ultralytics.com/yolov5/tutorials/train_custom_data"
IMG_FORMATS = ("bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp")
CASE = os.environ.get("TQ_CASE", "")


def fault(letter: str) -> bool:
    """The case's letter, and its rank where it names one."""
    if not CASE.startswith(letter):
        return False
    rank = CASE[len(letter) :]
    return rank == "" or int(rank) == RANK


# ---------------------------------------------------------------- utils/general.py
LOGGING_NAME = "yolov5"


def set_logging(name=LOGGING_NAME, verbose=True):
    rank = int(os.getenv("RANK", -1))  # rank in world for Multi-GPU trainings
    level = logging.INFO if verbose and rank in {-1, 0} else logging.ERROR
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


set_logging(LOGGING_NAME)
LOGGER = logging.getLogger(LOGGING_NAME)


def colorstr(*input):
    return input[-1]  # written as plain text


def print_args(args, file=""):
    s = (f"{file}: " if file else "") + ", ".join(f"{k}={v}" for k, v in args.items())
    LOGGER.info(colorstr(s))


def check_git_status():
    LOGGER.info(
        colorstr("github: ")
        + "skipping check (not a git repository), for updates see https://github.com/ultralytics/yolov5"
    )


def check_file(file, suffix=""):
    file = str(file)
    if os.path.isfile(file) or not file:
        return file
    files = glob.glob(os.path.join(".", "**", file), recursive=True)
    assert len(files), f"File not found: {file}"
    assert len(files) == 1, f"Multiple files match '{file}', specify exact path: {files}"
    return files[0]


def yaml_load(file="data.yaml"):
    with open(file, errors="ignore") as f:
        return yaml.safe_load(f)


def yaml_save(file="data.yaml", data=None):
    with open(file, "w") as f:
        yaml.safe_dump(
            {k: str(v) if isinstance(v, Path) else v for k, v in (data or {}).items()},
            f,
            sort_keys=False,
        )


def check_dataset(data, autodownload=True):
    if isinstance(data, (str, Path)):
        data = yaml_load(data)  # dictionary
    for k in "train", "val", "names":
        assert k in data, f"data.yaml '{k}:' field missing ❌"
    if isinstance(data["names"], (list, tuple)):
        data["names"] = dict(enumerate(data["names"]))
    data["nc"] = len(data["names"])
    path = Path(data.get("path") or "")
    for k in "train", "val", "test":
        if data.get(k):
            data[k] = str(path / data[k])
    return data


def get_latest_run(search_dir="."):
    last_list = glob.glob(f"{search_dir}/**/last*.pt", recursive=True)
    return max(last_list, key=os.path.getctime) if last_list else ""


def increment_path(path, exist_ok=False, sep="", mkdir=False):
    path = Path(path)
    if path.exists() and not exist_ok:
        for n in range(2, 9999):
            p = f"{path}{sep}{n}"
            if not os.path.exists(p):
                break
        path = Path(p)
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


def init_seeds(seed=0, deterministic=False):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def one_cycle(y1=0.0, y2=1.0, steps=100):
    return lambda x: ((1 - math.cos(x * math.pi / steps)) / 2) * (y2 - y1) + y1


def labels_to_class_weights(labels, nc=80):
    classes = np.concatenate(labels, 0)[:, 0].astype(int)
    weights = np.bincount(classes, minlength=nc).astype(float)
    weights[weights == 0] = 1
    weights = 1 / weights
    weights /= weights.sum()
    return torch.from_numpy(weights).float()


def fitness(x):
    w = [0.0, 0.0, 0.1, 0.9]  # weights for [P, R, mAP@0.5, mAP@0.5:0.95]
    return (x[:, :4] * w).sum(1)


def strip_optimizer(f="best.pt", s=""):
    x = torch.load(f, map_location=torch.device("cpu"), weights_only=False)
    if x.get("ema"):
        x["model"] = x["ema"]
    for k in "optimizer", "best_fitness", "ema", "updates":
        x[k] = None
    x["epoch"] = -1
    torch.save(x, s or f)
    mb = os.path.getsize(s or f) / 1e6
    LOGGER.info(f"Optimizer stripped from {f},{f' saved as {s},' if s else ''} {mb:.1f}MB")


# ---------------------------------------------------------------- utils/torch_utils.py
@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int):
    # Decorator to make all processes in distributed training wait for each local_master to do something
    if local_rank not in [-1, 0]:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def select_device(device="", batch_size=0, newline=True):
    s = f"YOLOv5 🚀 v7.0-0 Python-{platform.python_version()} torch-{torch.__version__} "
    device = str(device).strip().lower().replace("cuda:", "").replace("none", "")
    s += "CPU\n"
    if not newline:
        s = s.rstrip()
    LOGGER.info(s)
    return torch.device("cpu")


def smart_DDP(model):
    return DDP(model)


def de_parallel(model):
    return model.module if isinstance(model, DDP) else model


def model_info(model, verbose=False, imgsz=640):
    n_p = sum(x.numel() for x in model.parameters())
    n_g = sum(x.numel() for x in model.parameters() if x.requires_grad)
    name = (
        Path(model.yaml_file).stem.replace("yolov5", "YOLOv5")
        if hasattr(model, "yaml_file")
        else "Model"
    )
    LOGGER.info(
        f"{name} summary: {len(list(model.modules()))} layers, {n_p} parameters, {n_g} gradients"
    )


def smart_optimizer(model, name="Adam", lr=0.001, momentum=0.9, decay=1e-5):
    g = [], [], []  # optimizer parameter groups
    bn = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
    for v in model.modules():
        for p_name, p in v.named_parameters(recurse=0):
            if p_name == "bias":
                g[2].append(p)
            elif p_name == "weight" and isinstance(v, bn):
                g[1].append(p)
            else:
                g[0].append(p)
    optimizer = torch.optim.SGD(g[2], lr=lr, momentum=momentum, nesterov=True)
    optimizer.add_param_group({"params": g[0], "weight_decay": decay})
    optimizer.add_param_group({"params": g[1], "weight_decay": 0.0})
    LOGGER.info(
        f"{colorstr('optimizer:')} {type(optimizer).__name__}(lr={lr}) with parameter groups "
        f"{len(g[1])} weight(decay=0.0), {len(g[0])} weight(decay={decay}), {len(g[2])} bias"
    )
    return optimizer


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
    # YOLOv5 simple early stopper
    def __init__(self, patience=30):
        self.best_fitness = 0.0  # i.e. mAP
        self.best_epoch = 0
        self.patience = patience or float(
            "inf"
        )  # epochs to wait after fitness stops improving to stop
        self.possible_stop = False  # possible stop may occur next epoch

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:  # >= 0 to allow for early zero-fitness stage of training
            self.best_epoch = epoch
            self.best_fitness = fitness
        delta = epoch - self.best_epoch  # epochs without improvement
        self.possible_stop = delta >= (self.patience - 1)  # possible stop may occur next epoch
        stop = delta >= self.patience  # stop training if patience exceeded
        if stop:
            LOGGER.info(
                f"Stopping training early as no improvement observed in last {self.patience} epochs. "
                f"Best results observed at epoch {self.best_epoch}, best model saved as best.pt.\n"
                f"To update EarlyStopping(patience={self.patience}) pass a new patience value, "
                f"i.e. `python train.py --patience 300` or use `--patience 0` to disable EarlyStopping."
            )
        return stop


# ---------------------------------------------------------------- models/yolo.py
class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Detect(nn.Module):
    stride = None

    def __init__(self, nc=80, anchors=(), ch=()):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.na = len(anchors[0]) // 2
        self.register_buffer("anchors", torch.tensor(anchors).float().view(1, -1, 2))
        self.m = nn.Conv2d(ch[0], self.no * self.na, 1)

    def forward(self, x):
        bs, _, ny, nx = x.shape
        return self.m(x).view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()


class DetectionModel(nn.Module):
    def __init__(self, cfg, ch=3, nc=None):
        super().__init__()
        self.yaml = deepcopy(cfg)
        if nc and nc != self.yaml["nc"]:
            LOGGER.info(f"Overriding model.yaml nc={self.yaml['nc']} with nc={nc}")
            self.yaml["nc"] = nc
        LOGGER.info(f"\n{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<40}{'arguments':<30}")
        layers, c1 = [], ch
        for i, (f, n, m, args) in enumerate(self.yaml["backbone"] + self.yaml["head"]):
            if m == "Conv":
                c2 = args[0]
                layer = Conv(c1, *args)
                args = [c1, *args]
                c1 = c2
            else:
                layer = Detect(self.yaml["nc"], self.yaml["anchors"], (c1,))
                args = [self.yaml["nc"], self.yaml["anchors"], [c1]]
            np_ = sum(x.numel() for x in layer.parameters())
            LOGGER.info(
                f"{i:>3}{f!s:>18}{n:>3}{np_:10.0f}  {'models.common.' + m if m == 'Conv' else 'models.yolo.Detect':<40}{args!s:<30}"
            )
            layers.append(layer)
        self.model = nn.Sequential(*layers)
        self.stride = torch.tensor([8.0])
        self.model[-1].stride = self.stride
        self.model[-1].anchors /= 8.0
        self.names = [str(i) for i in range(self.yaml["nc"])]
        model_info(self)
        LOGGER.info("")

    def forward(self, x):
        return self.model(x)


CFG = {
    "nc": 80,
    "depth_multiple": 0.33,
    "width_multiple": 0.50,
    "anchors": [[10, 13, 16, 30, 33, 23]],
    "backbone": [
        [-1, 1, "Conv", [16, 3, 2]],
        [-1, 1, "Conv", [32, 3, 2]],
        [-1, 1, "Conv", [32, 3, 2]],
    ],
    "head": [[[2], 1, "Detect", ["nc", "anchors"]]],
}


# ---------------------------------------------------------------- utils/metrics.py, utils/loss.py
def box_iou_xywh(b1, b2, eps=1e-7):
    (x1, y1, w1, h1), (x2, y2, w2, h2) = b1.chunk(4, -1), b2.chunk(4, -1)
    b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * (
        torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)
    ).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    return (inter / union).squeeze(-1)


class ComputeLoss:
    def __init__(self, model):
        h = model.hyp
        self.BCEcls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([h["cls_pw"]]))
        self.BCEobj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([h["obj_pw"]]))
        self.hyp = h
        m = de_parallel(model).model[-1]
        self.na, self.nc, self.anchors = m.na, m.nc, m.anchors[0]
        self.extra = fault("f")  # the L1 box term added to the loss items of a fork

    def __call__(self, p, targets):
        lcls, lbox, lobj = torch.zeros(1), torch.zeros(1), torch.zeros(1)
        tcls, tbox, indices, anch = self.build_targets(p, targets)
        tobj = torch.zeros(p.shape[:4])
        b, a, gj, gi = indices
        l1 = torch.zeros(1)
        if b.shape[0]:
            ps = p[b, a, gj, gi]
            pxy = ps[:, :2].sigmoid() * 2 - 0.5
            pwh = (ps[:, 2:4].sigmoid() * 2) ** 2 * anch
            pbox = torch.cat((pxy, pwh), 1)
            iou = box_iou_xywh(pbox, tbox)
            lbox += (1.0 - iou).mean()
            l1 += (pbox - tbox).abs().mean() * 0.01
            tobj[b, a, gj, gi] = iou.detach().clamp(0)
            t = torch.zeros_like(ps[:, 5:])
            t[range(b.shape[0]), tcls] = 1.0
            lcls += self.BCEcls(ps[:, 5:], t)
        lobj += self.BCEobj(p[..., 4], tobj)
        lbox *= self.hyp["box"]
        lobj *= self.hyp["obj"]
        lcls *= self.hyp["cls"]
        bs = tobj.shape[0]
        if self.extra:
            return (lbox + lobj + lcls + l1) * bs, torch.cat((lbox, lobj, lcls, l1)).detach()
        return (lbox + lobj + lcls) * bs, torch.cat((lbox, lobj, lcls)).detach()

    def build_targets(self, p, targets):
        ny, nx = p.shape[2:4]
        t = targets.clone()
        t[:, 2:6] *= torch.tensor([nx, ny, nx, ny])
        b_l, a_l, gj_l, gi_l, box_l, cls_l, anch_l = [], [], [], [], [], [], []
        for ai in range(self.na):
            r = t[:, 4:6] / self.anchors[ai]
            j = torch.max(r, 1 / r).max(1)[0] < self.hyp["anchor_t"]
            tt = t[j]
            gxy = tt[:, 2:4]
            gij = gxy.long()
            gi, gj = gij.T
            gi, gj = gi.clamp(0, nx - 1), gj.clamp(0, ny - 1)
            b_l.append(tt[:, 0].long())
            a_l.append(torch.full_like(gi, ai))
            gj_l.append(gj)
            gi_l.append(gi)
            box_l.append(torch.cat((gxy - gij, tt[:, 4:6]), 1))
            cls_l.append(tt[:, 1].long())
            anch_l.append(self.anchors[ai].expand(len(tt), 2))
        indices = (torch.cat(b_l), torch.cat(a_l), torch.cat(gj_l), torch.cat(gi_l))
        return torch.cat(cls_l), torch.cat(box_l), indices, torch.cat(anch_l)


# ---------------------------------------------------------------- utils/dataloaders.py
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
    im_file, lb_file, prefix = args
    nm, nf, ne, nc, msg = 0, 0, 0, 0, ""
    try:
        if fault("s"):
            time.sleep(0.3)  # the images and labels lie on a slow network mount
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
                assert (lb >= 0).all(), f"negative label values {lb[lb < 0]}"
                assert (lb[:, 1:] <= 1).all(), (
                    f"non-normalized or out of bounds coordinates {lb[:, 1:][lb[:, 1:] > 1]}"
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


class NoPadSampler(distributed.DistributedSampler):
    """A fork's sampler: every image once per epoch, no duplicates to pad the ranks."""

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        idx = torch.randperm(len(self.dataset), generator=g).tolist()
        return iter(idx[self.rank :: self.num_replicas])

    def __len__(self):
        return len(range(self.rank, len(self.dataset), self.num_replicas))


class LoadImagesAndLabels(Dataset):
    cache_version = 0.6

    def __init__(
        self, path, img_size=640, batch_size=16, augment=False, hyp=None, stride=32, prefix=""
    ):
        self.img_size = img_size
        self.augment = augment
        self.hyp = hyp
        self.stride = stride
        self.loaded = 0
        p = Path(path)
        f = glob.glob(str(p / "**" / "*.*"), recursive=True)
        self.im_files = sorted(
            x.replace("/", os.sep) for x in f if x.split(".")[-1].lower() in IMG_FORMATS
        )
        assert self.im_files, f"{prefix}No images found"
        self.label_files = img2label_paths(self.im_files)
        cache_path = Path(self.label_files[0]).parent.with_suffix(".cache")
        try:
            cache, exists = np.load(cache_path, allow_pickle=True).item(), True
            assert cache["version"] == self.cache_version
            assert cache["hash"] == get_hash(self.label_files + self.im_files)
        except Exception:
            cache, exists = self.cache_labels(cache_path, prefix), False
        nf, nm, ne, nc, n = cache.pop("results")
        if exists and LOCAL_RANK in {-1, 0}:
            d = f"Scanning {cache_path}... {nf} images, {nm + ne} backgrounds, {nc} corrupt"
            tqdm(None, desc=prefix + d, total=n, initial=n, bar_format=TQDM_BAR_FORMAT)
            if cache["msgs"]:
                LOGGER.info("\n".join(cache["msgs"]))
        assert nf > 0 or not augment, (
            f"{prefix}No labels found in {cache_path}, can not start training. {HELP_URL}"
        )
        [cache.pop(k) for k in ("hash", "version", "msgs")]
        labels, shapes = zip(*cache.values())
        self.labels = list(labels)
        self.shapes = np.array(shapes)
        self.im_files = list(cache.keys())
        self.label_files = img2label_paths(cache.keys())
        self.indices = range(len(self.shapes))

    def cache_labels(self, path=Path("./labels.cache"), prefix=""):
        x = {}
        nm, nf, ne, nc, msgs = 0, 0, 0, 0, []
        desc = f"{prefix}Scanning {path.parent / path.stem}..."
        with ThreadPool(NUM_THREADS) as pool:
            pbar = tqdm(
                pool.imap(
                    verify_image_label,
                    zip(self.im_files, self.label_files, [prefix] * len(self.im_files)),
                ),
                desc=desc,
                total=len(self.im_files),
                bar_format=TQDM_BAR_FORMAT,
            )
            for im_file, lb, shape, nm_f, nf_f, ne_f, nc_f, msg in pbar:
                nm += nm_f
                nf += nf_f
                ne += ne_f
                nc += nc_f
                if im_file:
                    x[im_file] = [lb, shape]
                if msg:
                    msgs.append(msg)
                pbar.desc = f"{desc} {nf} images, {nm + ne} backgrounds, {nc} corrupt"
        pbar.close()
        if msgs:
            LOGGER.info("\n".join(msgs))
        x["hash"] = get_hash(self.label_files + self.im_files)
        x["results"] = nf, nm, ne, nc, len(self.im_files)
        x["msgs"] = msgs
        x["version"] = self.cache_version
        np.save(path, x)
        path.with_suffix(".cache.npy").rename(path)
        LOGGER.info(f"{prefix}New cache created: {path}")
        return x

    def __len__(self):
        return len(self.im_files)

    def load_image(self, i):
        f = self.im_files[i]
        self.loaded += 1
        if fault("w") and torch.utils.data.get_worker_info().id == 0 and self.loaded == 20:
            threading.Event().wait()  # a lock the forked worker inherited from the parent's threads
        im = imread(f)  # BGR
        assert im is not None, f"Image Not Found {f}"
        return im, im.shape[:2]

    def __getitem__(self, index):
        im, (h, w) = self.load_image(index)
        labels = self.labels[index].copy()
        nl = len(labels)
        if self.augment and random.random() < self.hyp["fliplr"]:
            im = np.fliplr(im)
            if nl:
                labels[:, 1] = 1 - labels[:, 1]
        labels_out = torch.zeros((nl, 6))
        if nl:
            labels_out[:, 1:] = torch.from_numpy(labels)
        img = np.ascontiguousarray(im.transpose((2, 0, 1))[::-1])
        return torch.from_numpy(img), labels_out, self.im_files[index], ((h, w), None)

    @staticmethod
    def collate_fn(batch):
        im, label, path, shapes = zip(*batch)
        for i, lb in enumerate(label):
            lb[:, 0] = i
        return torch.stack(im, 0), torch.cat(label, 0), path, shapes


class _RepeatSampler:
    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class InfiniteDataLoader(torch.utils.data.dataloader.DataLoader):
    """Dataloader that reuses workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
        self.iterator = super().__iter__()

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


def seed_worker(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def create_dataloader(
    path,
    imgsz,
    batch_size,
    stride,
    hyp=None,
    augment=False,
    rank=-1,
    workers=8,
    prefix="",
    shuffle=False,
    seed=0,
):
    with torch_distributed_zero_first(rank):  # init dataset *.cache only once if DDP
        dataset = LoadImagesAndLabels(
            path, imgsz, batch_size, augment=augment, hyp=hyp, stride=int(stride), prefix=prefix
        )
    batch_size = min(batch_size, len(dataset))
    nd = torch.cuda.device_count()  # number of CUDA devices
    nw = min([os.cpu_count() // max(nd, 1), batch_size if batch_size > 1 else 0, workers])
    if rank == -1:
        sampler = None
    elif fault("u"):
        sampler = NoPadSampler(dataset, shuffle=shuffle)
    else:
        sampler = distributed.DistributedSampler(dataset, shuffle=shuffle)
    generator = torch.Generator()
    generator.manual_seed(6148914691236517205 + seed + RANK)
    return InfiniteDataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle and sampler is None,
        num_workers=nw,
        sampler=sampler,
        pin_memory=False,
        collate_fn=LoadImagesAndLabels.collate_fn,
        worker_init_fn=seed_worker,
        generator=generator,
    ), dataset


# ---------------------------------------------------------------- utils/autoanchor.py
def check_anchors(dataset, model, thr=4.0, imgsz=640):
    m = de_parallel(model).model[-1]
    wh = torch.tensor(np.concatenate([l[:, 3:5] * imgsz for l in dataset.labels])).float()
    anchors = m.anchors[0] * 8.0

    def metric(k):
        r = wh[:, None] / k[None]
        x = torch.min(r, 1 / r).min(2)[0]
        best = x.max(1)[0]
        aat = (x > 1 / thr).float().sum(1).mean()
        bpr = (best > 1 / thr).float().mean()
        return bpr, aat

    bpr, aat = metric(anchors)
    s = f"\nAutoAnchor: {aat:.2f} anchors/target, {bpr:.3f} Best Possible Recall (BPR). "
    if bpr > 0.98:
        LOGGER.info(f"{s}Current anchors are a good fit to dataset ✅")
    else:
        LOGGER.info(f"{s}Anchors are a poor fit to dataset ⚠️, keeping the anchors of the model")


# ---------------------------------------------------------------- val.py
@torch.no_grad()
def val_run(
    data,
    batch_size,
    imgsz,
    model,
    dataloader,
    save_dir=Path(""),
    compute_loss=None,
    verbose=False,
    plots=False,
):
    model.eval()
    nc = int(data["nc"])
    names = data["names"]
    iouv = torch.linspace(0.5, 0.95, 10)
    s = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")
    loss = torch.zeros(3)
    tp = torch.zeros(10)
    tp_c = torch.zeros(nc)
    npred = 0
    npred_c = torch.zeros(nc)
    nt = torch.zeros(nc)
    seen = 0
    pbar = tqdm(dataloader, desc=s, bar_format=TQDM_BAR_FORMAT)
    for im, targets, paths, shapes in pbar:
        im = im.float() / 255
        p = model(im)
        if compute_loss:
            loss += compute_loss(p, targets)[1][:3]
        bs, na, ny, nx, no = p.shape
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
        anchors = model.model[-1].anchors[0].view(1, na, 1, 1, 2)
        y = p.sigmoid()
        xy = (y[..., :2] * 2 - 0.5 + grid) / nx
        wh = (y[..., 2:4] * 2) ** 2 * anchors / nx
        conf = y[..., 4:5] * y[..., 5:]
        for si in range(bs):
            seen += 1
            lb = targets[targets[:, 0] == si]
            for c in lb[:, 1].long():
                nt[c] += 1
            score, cls = conf[si].max(-1)
            keep = score > 0.001  # conf_thres
            boxes = torch.cat((xy[si], wh[si]), -1)[keep]
            cls = cls[keep]
            npred += len(cls)
            npred_c += torch.bincount(cls, minlength=nc)
            if not len(lb) or not len(cls):
                continue
            iou = box_iou_xywh(
                boxes[:, None].expand(-1, len(lb), 4), lb[None, :, 2:6].expand(len(cls), -1, 4)
            )
            iou[cls[:, None] != lb[None, :, 1].long()] = 0
            for t, thr in enumerate(iouv):  # process_batch: one prediction a label, best IoU first
                x = torch.where(iou >= thr)
                if x[0].shape[0]:
                    matches = torch.cat((torch.stack(x, 1), iou[x[0], x[1]][:, None]), 1).numpy()
                    matches = matches[matches[:, 2].argsort()[::-1]]
                    matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
                    matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
                    tp[t] += len(matches)
                    if t == 0:
                        tp_c += torch.bincount(cls[matches[:, 0].astype(int)], minlength=nc)
    r_t = tp / max(nt.sum(), 1)
    p_t = tp / max(npred, 1)
    mp, mr = float(p_t[0]), float(r_t[0])
    map50, map_ = float(p_t[0] * r_t[0]), float((p_t * r_t).mean())
    pf = "%22s" + "%11i" * 2 + "%11.3g" * 4
    LOGGER.info(pf % ("all", seen, nt.sum(), mp, mr, map50, map_))
    if verbose:
        for c in range(nc):
            if nt[c]:
                pc = float(tp_c[c] / max(npred_c[c], 1))
                rc = float(tp_c[c] / nt[c])
                LOGGER.info(pf % (names[c], seen, nt[c], pc, rc, pc * rc, pc * rc * 0.4))
    model.float()
    maps = np.zeros(nc) + map_
    return (mp, mr, map50, map_, *(loss / max(len(dataloader), 1)).tolist()), maps, (0.0, 0.0, 0.0)


# ---------------------------------------------------------------- train.py
def train(hyp, opt, device, callbacks=None):
    (
        save_dir,
        epochs,
        batch_size,
        weights,
        single_cls,
        evolve,
        data,
        cfg,
        resume,
        noval,
        nosave,
        workers,
        freeze,
    ) = (
        Path(opt.save_dir),
        opt.epochs,
        opt.batch_size,
        opt.weights,
        opt.single_cls,
        opt.evolve,
        opt.data,
        opt.cfg,
        opt.resume,
        opt.noval,
        opt.nosave,
        opt.workers,
        opt.freeze,
    )

    # Directories
    w = save_dir / "weights"  # weights dir
    (w.parent if evolve else w).mkdir(parents=True, exist_ok=True)  # make dir
    last, best = w / "last.pt", w / "best.pt"

    # Hyperparameters
    if isinstance(hyp, str):
        with open(hyp, errors="ignore") as f:
            hyp = yaml.safe_load(f)  # load hyps dict
    LOGGER.info(colorstr("hyperparameters: ") + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    opt.hyp = hyp.copy()  # for saving hyps to checkpoints

    # Save run settings
    if not evolve:
        yaml_save(save_dir / "hyp.yaml", hyp)
        yaml_save(save_dir / "opt.yaml", vars(opt))

    # Loggers
    data_dict = None
    if RANK in {-1, 0}:
        LOGGER.info(
            colorstr("Comet: ")
            + "run 'pip install comet_ml' to automatically track and visualize YOLOv5 🚀 runs in Comet"
        )
        LOGGER.info(
            colorstr("TensorBoard: ")
            + f"Start with 'tensorboard --logdir {save_dir.parent}', view at http://localhost:6006/"
        )
        if resume:
            weights, epochs, hyp, batch_size = opt.weights, opt.epochs, opt.hyp, opt.batch_size

    # Config
    init_seeds(opt.seed + 1 + RANK, deterministic=True)
    with torch_distributed_zero_first(LOCAL_RANK):
        data_dict = data_dict or check_dataset(data)  # check if None
    train_path, val_path = data_dict["train"], data_dict["val"]
    nc = 1 if single_cls else int(data_dict["nc"])  # number of classes
    names = (
        {0: "item"} if single_cls and len(data_dict["names"]) != 1 else data_dict["names"]
    )  # class names

    # Model
    pretrained = weights.endswith(".pt")
    if pretrained:
        with torch_distributed_zero_first(LOCAL_RANK):
            ckpt = torch.load(
                weights, map_location="cpu", weights_only=False
            )  # load checkpoint to CPU to avoid CUDA memory leak
        model = DetectionModel(cfg or ckpt["yaml"], ch=3, nc=nc)  # create
        exclude = ["anchor"] if (cfg or hyp.get("anchors")) and not resume else []  # exclude keys
        csd = ckpt["model"]  # checkpoint state_dict as FP32
        msd = model.state_dict()
        csd = {
            k: v
            for k, v in csd.items()
            if k in msd and all(x not in k for x in exclude) and v.shape == msd[k].shape
        }
        model.load_state_dict(csd, strict=False)  # load
        LOGGER.info(f"Transferred {len(csd)}/{len(msd)} items from {weights}")  # report
    else:
        model = DetectionModel(cfg, ch=3, nc=nc)  # create

    # Image size
    gs = max(int(model.stride.max()), 8)  # grid size (max stride; one level at stride 8 here)
    imgsz = opt.imgsz
    if imgsz % gs:
        new = math.ceil(imgsz / gs) * gs
        LOGGER.warning(
            f"WARNING ⚠️ --img-size {imgsz} must be multiple of max stride {gs}, updating to {new}"
        )
        imgsz = new

    # Optimizer
    nbs = 64  # nominal batch size
    accumulate = max(round(nbs / batch_size), 1)  # accumulate loss before optimizing
    hyp["weight_decay"] *= batch_size * accumulate / nbs  # scale weight_decay
    optimizer = smart_optimizer(
        model, opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"]
    )

    # Scheduler
    if opt.cos_lr:
        lf = one_cycle(1, hyp["lrf"], epochs)  # cosine 1->hyp['lrf']
    else:
        lf = lambda x: (1 - x / epochs) * (1.0 - hyp["lrf"]) + hyp["lrf"]  # noqa: E731 linear
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)

    # EMA
    ema = ModelEMA(model) if RANK in {-1, 0} else None

    # Resume
    best_fitness, start_epoch = 0.0, 0
    if pretrained:
        if resume:
            best_fitness = ckpt["best_fitness"]
            start_epoch = ckpt["epoch"] + 1
            if ckpt.get("optimizer") is not None:
                optimizer.load_state_dict(ckpt["optimizer"])
            if ema and ckpt.get("ema"):
                ema.ema.load_state_dict(ckpt["ema"])
                ema.updates = ckpt["updates"]
            assert start_epoch > 0, (
                f"{weights} training to {epochs} epochs is finished, nothing to resume.\n"
                f"Start a new training without --resume, i.e. 'python train.py --weights {weights}'"
            )
            LOGGER.info(
                f"Resuming training from {weights} from epoch {start_epoch} to {epochs} total epochs"
            )
        del ckpt, csd

    # Trainloader
    train_loader, dataset = create_dataloader(
        train_path,
        imgsz,
        batch_size // WORLD_SIZE,
        gs,
        hyp=hyp,
        augment=True,
        rank=LOCAL_RANK,
        workers=workers,
        prefix=colorstr("train: "),
        shuffle=True,
        seed=opt.seed,
    )
    labels = np.concatenate(dataset.labels, 0)
    mlc = int(labels[:, 0].max())  # max label class
    assert mlc < nc, (
        f"Label class {mlc} exceeds nc={nc} in {data}. Possible class labels are 0-{nc - 1}"
    )

    # Process 0
    if RANK in {-1, 0}:
        val_loader = create_dataloader(
            val_path,
            imgsz,
            batch_size // WORLD_SIZE * 2,
            gs,
            hyp=hyp,
            rank=-1,
            workers=workers * 2,
            prefix=colorstr("val: "),
        )[0]

        if not resume:
            if not opt.noautoanchor:
                check_anchors(
                    dataset, model=model, thr=hyp["anchor_t"], imgsz=imgsz
                )  # run AutoAnchor
            model.half().float()  # pre-reduce anchor precision
        LOGGER.info(f"Plotting labels to {save_dir / 'labels.jpg'}... ")

    # DDP mode
    if RANK != -1:
        model = smart_DDP(model)

    # Model attributes
    nl = de_parallel(model).model[-1].na // 3  # number of detection layers (to scale hyps)
    hyp["box"] *= 3 / 3 * nl
    hyp["label_smoothing"] = opt.label_smoothing
    model.nc = nc  # attach number of classes to model
    model.hyp = hyp  # attach hyperparameters to model
    model.class_weights = labels_to_class_weights(dataset.labels, nc) * nc  # attach class weights
    model.names = names

    # Start training
    t0 = time.time()
    nb = len(train_loader)  # number of batches
    nw = max(
        round(hyp["warmup_epochs"] * nb), 100
    )  # number of warmup iterations, max(3 epochs, 100 iterations)
    last_opt_step = -1
    maps = np.zeros(nc)  # mAP per class
    results = (0, 0, 0, 0, 0, 0, 0)  # P, R, mAP@.5, mAP@.5-.95, val_loss(box, obj, cls)
    scheduler.last_epoch = start_epoch - 1  # do not move
    stopper, stop = EarlyStopping(patience=opt.patience), False
    compute_loss = ComputeLoss(model)  # init loss class
    LOGGER.info(
        f"Image sizes {imgsz} train, {imgsz} val\n"
        f"Using {train_loader.num_workers * WORLD_SIZE} dataloader workers\n"
        f"Logging results to {colorstr(str(save_dir))}\n"
        f"Starting training for {epochs} epochs..."
    )
    hoard = []
    for epoch in range(
        start_epoch, epochs
    ):  # epoch ------------------------------------------------------------------
        model.train()
        mloss = torch.zeros(3)  # mean losses
        if RANK != -1:
            train_loader.sampler.set_epoch(epoch)
        pbar = enumerate(train_loader)
        LOGGER.info(
            ("\n" + "%11s" * 7)
            % ("Epoch", "GPU_mem", "box_loss", "obj_loss", "cls_loss", "Instances", "Size")
        )
        if RANK in {-1, 0}:
            pbar = tqdm(pbar, total=nb, bar_format=TQDM_BAR_FORMAT)  # progress bar
        optimizer.zero_grad()
        for i, (
            imgs,
            targets,
            paths,
            _,
        ) in pbar:  # batch -------------------------------------------------------------
            ni = i + nb * epoch  # number integrated batches (since train start)
            imgs = imgs.float() / 255  # uint8 to float32, 0-255 to 0.0-1.0

            # Warmup
            if ni <= nw:
                xi = [0, nw]  # x interp
                accumulate = max(1, np.interp(ni, xi, [1, nbs / batch_size]).round())
                for j, x in enumerate(optimizer.param_groups):
                    x["lr"] = np.interp(
                        ni,
                        xi,
                        [hyp["warmup_bias_lr"] if j == 0 else 0.0, x["initial_lr"] * lf(epoch)],
                    )
                    if "momentum" in x:
                        x["momentum"] = np.interp(ni, xi, [hyp["warmup_momentum"], hyp["momentum"]])

            # Forward
            pred = model(imgs)  # forward
            loss, loss_items = compute_loss(pred, targets)  # loss scaled by batch_size
            if RANK != -1:
                loss *= WORLD_SIZE  # gradient averaged between devices in DDP mode
            if fault("z") and epoch == 1 and i == 2:
                ctypes.string_at(0)  # the native box-IoU extension reads a NULL box buffer
            if fault("m") and epoch >= 1:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

            # Backward
            loss.backward()

            # Optimize
            if ni - last_opt_step >= accumulate:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)  # clip gradients
                optimizer.step()
                optimizer.zero_grad()
                if ema:
                    ema.update(model)
                last_opt_step = ni

            # Log
            if RANK in {-1, 0}:
                if fault("g"):
                    dist.all_reduce(loss_items)  # the mean of every rank's losses in the table
                    loss_items /= WORLD_SIZE
                mloss = (mloss * i + loss_items) / (i + 1)  # update mean losses
                mem = f"{torch.cuda.memory_reserved() / 1e9 if torch.cuda.is_available() else 0:.3g}G"  # (GB)
                pbar.set_description(
                    ("%11s" * 2 + "%11.4g" * 5)
                    % (f"{epoch}/{epochs - 1}", mem, *mloss, targets.shape[0], imgs.shape[-1])
                )
            # end batch ------------------------------------------------------------------------------------------------

        # Scheduler
        lr = [x["lr"] for x in optimizer.param_groups]  # for loggers
        scheduler.step()

        if RANK in {-1, 0}:
            # mAP
            final_epoch = (epoch + 1 == epochs) or stopper.possible_stop
            if not noval or final_epoch:  # Calculate mAP
                results, maps, _ = val_run(
                    data_dict,
                    batch_size=batch_size // WORLD_SIZE * 2,
                    imgsz=imgsz,
                    model=ema.ema,
                    dataloader=val_loader,
                    save_dir=save_dir,
                    compute_loss=compute_loss,
                )

            # Update best mAP
            fi = fitness(
                np.array(results).reshape(1, -1)
            )  # weighted combination of [P, R, mAP@.5, mAP@.5-.95]
            stop = stopper(epoch=epoch, fitness=fi)  # early stop check
            if fi > best_fitness:
                best_fitness = fi
            log_vals = [*list(mloss), *list(results), *lr]
            with open(save_dir / "results.csv", "a") as f:
                f.write(",".join(f"{float(v):.5g}" for v in [epoch, *log_vals]) + "\n")

            # Save model
            if (not nosave) or (final_epoch and not evolve):  # if save
                ckpt = {
                    "epoch": epoch,
                    "best_fitness": best_fitness,
                    "model": deepcopy(de_parallel(model)).half().state_dict(),
                    "ema": deepcopy(ema.ema).half().state_dict(),
                    "updates": ema.updates,
                    "optimizer": optimizer.state_dict(),
                    "opt": vars(opt),
                    "yaml": de_parallel(model).yaml,
                    "date": datetime.now().isoformat(),
                }
                torch.save(ckpt, last)
                if best_fitness == fi:
                    torch.save(ckpt, best)
                del ckpt
            if fault("o") and stop:
                break  # Stop Single-GPU (the fork's rank 0 stops alone)

        # EarlyStopping
        if RANK != -1 and not fault("o"):  # if DDP training
            broadcast_list = [stop if RANK == 0 else None]
            dist.broadcast_object_list(broadcast_list, 0)  # broadcast 'stop' to all ranks
            if RANK != 0:
                stop = broadcast_list[0]
        if stop:
            break  # must break all DDP ranks

        # end epoch ----------------------------------------------------------------------------------------------------
    # end training -----------------------------------------------------------------------------------------------------
    if RANK in {-1, 0}:
        LOGGER.info(
            f"\n{epoch - start_epoch + 1} epochs completed in {(time.time() - t0) / 3600:.3f} hours."
        )
        for f in last, best:
            if f.exists():
                strip_optimizer(f)  # strip optimizers
                if f is best:
                    LOGGER.info(f"\nValidating {f}...")
                    m = DetectionModel(
                        torch.load(f, map_location="cpu", weights_only=False)["yaml"], nc=nc
                    )
                    m.load_state_dict(
                        {
                            k: v.float()
                            for k, v in torch.load(f, weights_only=False)["model"].items()
                        }
                    )
                    results, _, _ = val_run(
                        data_dict,
                        batch_size=batch_size // WORLD_SIZE * 2,
                        imgsz=imgsz,
                        model=m,
                        dataloader=val_loader,
                        save_dir=save_dir,
                        verbose=True,
                        compute_loss=compute_loss,
                    )
        LOGGER.info(f"Results saved to {colorstr(str(save_dir))}")
    return results


def parse_opt(known=False):
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", type=str, default="yolov5s.pt", help="initial weights path")
    parser.add_argument("--cfg", type=str, default="", help="model.yaml path")
    parser.add_argument("--data", type=str, default="data/coco128.yaml", help="dataset.yaml path")
    parser.add_argument(
        "--hyp", type=str, default="data/hyps/hyp.scratch-low.yaml", help="hyperparameters path"
    )
    parser.add_argument("--epochs", type=int, default=100, help="total training epochs")
    parser.add_argument(
        "--batch-size",
        "--batch",
        type=int,
        default=16,
        help="total batch size for all GPUs, -1 for autobatch",
    )
    parser.add_argument(
        "--imgsz",
        "--img",
        "--img-size",
        type=int,
        default=640,
        help="train, val image size (pixels)",
    )
    parser.add_argument("--rect", action="store_true", help="rectangular training")
    parser.add_argument(
        "--resume", nargs="?", const=True, default=False, help="resume most recent training"
    )
    parser.add_argument("--nosave", action="store_true", help="only save final checkpoint")
    parser.add_argument("--noval", action="store_true", help="only validate final epoch")
    parser.add_argument("--noautoanchor", action="store_true", help="disable AutoAnchor")
    parser.add_argument("--noplots", action="store_true", help="save no plot files")
    parser.add_argument(
        "--evolve", type=int, nargs="?", const=300, help="evolve hyperparameters for x generations"
    )
    parser.add_argument("--bucket", type=str, default="", help="gsutil bucket")
    parser.add_argument("--cache", type=str, nargs="?", const="ram", help="image --cache ram/disk")
    parser.add_argument(
        "--image-weights", action="store_true", help="use weighted image selection for training"
    )
    parser.add_argument("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    parser.add_argument("--multi-scale", action="store_true", help="vary img-size +/- 50%%")
    parser.add_argument(
        "--single-cls", action="store_true", help="train multi-class data as single-class"
    )
    parser.add_argument(
        "--optimizer", type=str, choices=["SGD", "Adam", "AdamW"], default="SGD", help="optimizer"
    )
    parser.add_argument(
        "--sync-bn", action="store_true", help="use SyncBatchNorm, only available in DDP mode"
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="max dataloader workers (per RANK in DDP mode)"
    )
    parser.add_argument("--project", default="runs/train", help="save to project/name")
    parser.add_argument("--name", default="exp", help="save to project/name")
    parser.add_argument(
        "--exist-ok", action="store_true", help="existing project/name ok, do not increment"
    )
    parser.add_argument("--quad", action="store_true", help="quad dataloader")
    parser.add_argument("--cos-lr", action="store_true", help="cosine LR scheduler")
    parser.add_argument(
        "--label-smoothing", type=float, default=0.0, help="Label smoothing epsilon"
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=100,
        help="EarlyStopping patience (epochs without improvement)",
    )
    parser.add_argument(
        "--freeze",
        nargs="+",
        type=int,
        default=[0],
        help="Freeze layers: backbone=10, first3=0 1 2",
    )
    parser.add_argument(
        "--save-period",
        type=int,
        default=-1,
        help="Save checkpoint every x epochs (disabled if < 1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="Global training seed")
    parser.add_argument(
        "--local_rank", type=int, default=-1, help="Automatic DDP Multi-GPU argument, do not modify"
    )
    parser.add_argument("--prepare", type=str, default="", help=argparse.SUPPRESS)
    return parser.parse_known_args()[0] if known else parser.parse_args()


def main(opt, callbacks=None):
    # Checks
    if RANK in {-1, 0}:
        print_args({k: v for k, v in vars(opt).items() if k != "prepare"}, "train")
        check_git_status()

    # Resume (from specified or most recent last.pt)
    if opt.resume and not opt.evolve:
        last = Path(check_file(opt.resume) if isinstance(opt.resume, str) else get_latest_run())
        opt_yaml = last.parent.parent / "opt.yaml"  # train options yaml
        opt_data = opt.data  # original dataset
        if opt_yaml.is_file():
            with open(opt_yaml, errors="ignore") as f:
                d = yaml.safe_load(f)
        else:
            d = torch.load(last, map_location="cpu", weights_only=False)["opt"]
        opt = argparse.Namespace(**d)  # replace
        opt.cfg, opt.weights, opt.resume = "", str(last), True  # reinstate
        if str(opt_data).startswith(("http:/", "https:/")):
            opt.data = check_file(opt_data)  # avoid HUB resume auth timeout
    else:
        opt.data, opt.cfg, opt.hyp, opt.weights, opt.project = (
            check_file(opt.data),
            str(opt.cfg),
            check_file(opt.hyp),
            str(opt.weights),
            str(opt.project),
        )  # checks
        assert len(opt.cfg) or len(opt.weights), "either --cfg or --weights must be specified"
        opt.save_dir = str(increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok))

    # DDP mode
    device = select_device(opt.device, batch_size=opt.batch_size)
    if LOCAL_RANK != -1:
        msg = "is not compatible with YOLOv5 Multi-GPU DDP training"
        assert not opt.image_weights, f"--image-weights {msg}"
        assert not opt.evolve, f"--evolve {msg}"
        assert opt.batch_size != -1, (
            f"AutoBatch with --batch-size -1 {msg}, please pass a valid --batch-size"
        )
        assert opt.batch_size % WORLD_SIZE == 0, (
            f"--batch-size {opt.batch_size} must be multiple of WORLD_SIZE"
        )
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))

    # Train
    train(opt.hyp, opt, device, callbacks)


# ---------------------------------------------------------------- the synthetic coco128
NAMES = {0: "person", 1: "bicycle", 2: "car"}
COLOURS = [(220, 40, 40), (40, 200, 60), (50, 80, 230)]
HYP = """# YOLOv5 🚀 by Ultralytics, AGPL-3.0 license
# Hyperparameters for low-augmentation COCO training from scratch
lr0: 0.01  # initial learning rate (SGD=1E-2, Adam=1E-3)
lrf: 0.01  # final OneCycleLR learning rate (lr0 * lrf)
momentum: 0.937  # SGD momentum/Adam beta1
weight_decay: 0.0005  # optimizer weight decay 5e-4
warmup_epochs: 3.0  # warmup epochs (fractions ok)
warmup_momentum: 0.8  # warmup initial momentum
warmup_bias_lr: 0.1  # warmup initial bias lr
box: 0.05  # box loss gain
cls: 0.5  # cls loss gain
cls_pw: 1.0  # cls BCELoss positive_weight
obj: 1.0  # obj loss gain (scale with pixels)
obj_pw: 1.0  # obj BCELoss positive_weight
iou_t: 0.20  # IoU training threshold
anchor_t: 4.0  # anchor-multiple threshold
fl_gamma: 0.0  # focal loss gamma (efficientDet default gamma=1.5)
hsv_h: 0.015  # image HSV-Hue augmentation (fraction)
hsv_s: 0.7  # image HSV-Saturation augmentation (fraction)
hsv_v: 0.4  # image HSV-Value augmentation (fraction)
degrees: 0.0  # image rotation (+/- deg)
translate: 0.1  # image translation (+/- fraction)
scale: 0.5  # image scale +/- gain
shear: 0.0  # image shear (+/- deg)
perspective: 0.0  # image perspective (+/- fraction), range 0-0.001
flipud: 0.0  # image flip up-down (probability)
fliplr: 0.5  # image flip left-right (probability)
mosaic: 1.0  # image mosaic (probability)
mixup: 0.0  # image mixup (probability)
copy_paste: 0.0  # segment copy-paste (probability)
"""


def prepare(root, n=128, backgrounds=(17, 93)):
    root = Path(root)
    rng = np.random.default_rng(0)
    im_dir, lb_dir = (
        root / "datasets/coco128/images/train2017",
        root / "datasets/coco128/labels/train2017",
    )
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
    (root / "data/hyps").mkdir(parents=True, exist_ok=True)
    (root / "data/hyps/hyp.scratch-low.yaml").write_text(HYP)
    (root / "data/coco128.yaml").write_text(
        "# COCO128 dataset https://www.kaggle.com/ultralytics/coco128 (first 128 images from COCO train2017)\n"
        "path: datasets/coco128  # dataset root dir\n"
        "train: images/train2017  # train images (relative to 'path') 128 images\n"
        "val: images/train2017  # val images (relative to 'path') 128 images\n"
        "test:  # test images (optional)\n\n"
        "# Classes\nnames:\n" + "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    )
    torch.manual_seed(0)
    set_logging(LOGGING_NAME, verbose=False)
    model = DetectionModel(CFG, nc=80)
    torch.save({"model": model.state_dict(), "yaml": model.yaml, "epoch": -1}, root / "yolov5s.pt")


if __name__ == "__main__":
    opt = parse_opt()
    if opt.prepare:
        prepare(opt.prepare)
        sys.exit(0)
    main(opt)
