"""A hundred-twenty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentyseventh-*): object detection with OpenMMLab's MMDetection 2.x
on mmcv 1.x, started the way its README starts it on one machine, `bash ./tools/dist_train.sh
configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.py 2 --seed 42`, whose script runs `python -m
torch.distributed.launch --nproc_per_node=2 --master_port=$PORT tools/train.py $CONFIG
--launcher pytorch ...` (the legacy launcher without --use_env: every process is given
--local-rank=K, which tools/train.py accepts as --local_rank / --local-rank). Re-created in plain
torch without mmdet or mmcv; copied into each run's folder as tools/train.py.

What it re-creates: mmcv's Config (python config files with _base_ inheritance, --cfg-options,
pretty_text), get_root_logger ('2026-12-06 12:00:00,123 - mmdet - INFO - ...' on the console of
rank 0 and its work_dir/<timestamp>.log, ERROR level on the other ranks), collect_env's
environment block, init_dist('pytorch') with the config's dist_params, a tiny two-stage detector
(a frozen-BN backbone loaded from checkpoints/resnet50.pth, an FPN-like neck, an RPN head, a RoI
head with a shared-FC bbox head), CocoDataset over a COCO-style JSON with PNG images (pycocotools'
'loading annotations into memory...' prints on every rank), the pipeline LoadImageFromFile /
LoadAnnotations / RandomFlip / Normalize / Pad, DistributedGroupSampler (aspect-ratio groups),
the collate that pads a batch, MMDistributedDataParallel (broadcast_buffers=False), the
detector's _parse_losses with its all_reduce of every log variable and its check 'loss log
variables are different across GPUs!', EpochBasedRunner with its hooks (StepLrUpdaterHook with
a linear warmup, OptimizerHook, CheckpointHook 'Saving checkpoint at N epochs' epoch_N.pth and
latest.pth, NumClassCheckHook, DistSamplerSeedHook, IterTimerHook, TextLoggerHook
'Epoch [1][5/16]\tlr: ..., eta: ..., time: ..., data_time: ..., memory: 0, loss_rpn_cls: ...',
DistEvalHook with multi_gpu_test's ProgressBar, collect_results_cpu through
work_dir/.eval_hook with its barrier, CocoDataset.evaluate's 'Evaluating bbox...', the COCOeval
prints and summary table and 'Epoch(val) [1][21]\tbbox_mAP: ...'), runner.resume ('resumed
epoch 2, iter 32'). The data (a train and a val split, six categories of which the config names
four) and the pretrained backbone are written by `python tools/train.py --prepare data/coco`.

A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredtwentyseventh.sh after any edit).
"""

from __future__ import annotations

import argparse
import ast
import copy
import ctypes
import datetime
import json
import math
import os
import os.path as osp
import pickle
import random
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    legacy_parser: bool = False  # tools/train.py of mmdet < 2.28: only --local_rank
    hoard_rank: int = -1  # this rank keeps every decoded image in a cache of its own
    segv_rank: int = -1  # this rank's compiled nms reads address 0
    aux_loss: bool = False  # a head adds loss_iou only when its batch holds a 'dog'
    shard_ann: bool = False  # each rank parses its own slice of the images, no padding
    slow_eval_rank: int = -1  # this rank's per-image COCO evaluation crawls
    stall_rank: int = -1  # this rank's loader worker waits on a lock forked while held


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "a": Fault(legacy_parser=True),
    "m1": Fault(hoard_rank=1),
    "z0": Fault(segv_rank=0),
    "x": Fault(aux_loss=True),
    "u": Fault(shard_ann=True),
    "s0": Fault(slow_eval_rank=0),
    "w1": Fault(stall_rank=1),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

ALL_CLASSES = ("person", "car", "bicycle", "dog", "truck", "bus")


###############################################################################
# mmcv.utils: Config
###############################################################################
class ConfigDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


def _to_cfg(obj):
    if isinstance(obj, dict):
        return ConfigDict({k: _to_cfg(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [_to_cfg(v) for v in obj]
    return obj


def _merge(base, child):
    out = copy.deepcopy(base)
    for k, v in child.items():
        if isinstance(v, dict) and not v.pop("_delete_", False) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _read_config(filename):
    filename = osp.abspath(filename)
    namespace: dict = {}
    with open(filename) as f:
        exec(compile(f.read(), filename, "exec"), namespace)
    cfg = {k: v for k, v in namespace.items() if not k.startswith("__")}
    bases = cfg.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    merged: dict = {}
    for b in bases:
        merged = _merge(merged, _read_config(osp.join(osp.dirname(filename), b)))
    return _merge(merged, cfg)


def _fmt(v, indent):
    pad = " " * (indent + 4)
    if isinstance(v, dict):
        if not v:
            return "dict()"
        items = [f"{pad}{k}={_fmt(x, indent + 4)}" for k, x in v.items()]
        return "dict(\n" + ",\n".join(items) + ")"
    if isinstance(v, list) and any(isinstance(x, dict) for x in v):
        return "[\n" + ",\n".join(pad + _fmt(x, indent + 4) for x in v) + "\n" + " " * indent + "]"
    return repr(v)


class Config:
    @staticmethod
    def fromfile(filename):
        return _to_cfg(_read_config(filename))

    @staticmethod
    def merge_from_dict(cfg, options):
        for key, value in options.items():
            d = cfg
            parts = key.split(".")
            for p in parts[:-1]:
                d = d.setdefault(p, ConfigDict())
            d[parts[-1]] = _to_cfg(value)

    @staticmethod
    def pretty_text(cfg):
        return "\n".join(f"{k} = {_fmt(v, 0)}" for k, v in cfg.items()) + "\n"


class DictAction(argparse.Action):
    @staticmethod
    def _parse(val):
        try:
            return ast.literal_eval(val)
        except (ValueError, SyntaxError):
            return val

    def __call__(self, parser, namespace, values, option_string=None):
        options = {}
        for kv in values:
            key, val = kv.split("=", maxsplit=1)
            options[key] = self._parse(val)
        setattr(namespace, self.dest, options)


###############################################################################
# mmcv.utils.logging / mmdet.utils
###############################################################################
import logging  # noqa: E402

logger_initialized: dict = {}


def get_logger(name, log_file=None, log_level=logging.INFO, file_mode="w"):
    logger = logging.getLogger(name)
    if name in logger_initialized:
        return logger
    stream_handler = logging.StreamHandler()
    handlers = [stream_handler]
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank == 0 and log_file is not None:
        handlers.append(logging.FileHandler(log_file, file_mode))
    formatter = logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(log_level)
        logger.addHandler(handler)
    logger.setLevel(log_level if rank == 0 else logging.ERROR)
    logger.propagate = False
    logger_initialized[name] = True
    return logger


def get_root_logger(log_file=None, log_level=logging.INFO):
    return get_logger("mmdet", log_file=log_file, log_level=log_level)


def print_log(msg, logger=None):
    if logger is None:
        print(msg)
    else:
        logger.info(msg)


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collect_env():
    env = {}
    env["sys.platform"] = sys.platform
    env["Python"] = sys.version.replace("\n", "")
    env["CUDA available"] = torch.cuda.is_available()
    env["GCC"] = "gcc (Ubuntu 9.4.0-1ubuntu1~20.04.2) 9.4.0"
    env["PyTorch"] = torch.__version__
    env["PyTorch compiling details"] = torch.__config__.show()
    env["TorchVision"] = "0.28.0+cpu"
    env["OpenCV"] = "4.8.1"
    env["MMCV"] = "1.7.2"
    env["MMCV Compiler"] = "GCC 9.3"
    env["MMCV CUDA Compiler"] = "not available"
    env["MMDetection"] = "2.28.2+"
    return env


###############################################################################
# small PNG reader / writer (what cv2.imdecode / imwrite do for the pipeline)
###############################################################################
def png_encode(img):
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def imfrombytes(content):
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(content):
        (n,) = struct.unpack(">I", content[pos : pos + 4])
        tag = content[pos + 4 : pos + 8]
        data = content[pos + 8 : pos + 8 + n]
        if tag == b"IHDR":
            w, h = struct.unpack(">II", data[:8])
        elif tag == b"IDAT":
            idat += data
        pos += 12 + n
    raw = zlib.decompress(idat)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(h, 1 + w * 3)
    return rows[:, 1:].reshape(h, w, 3).copy()


###############################################################################
# pycocotools (what the style touches of it)
###############################################################################
class COCO:
    def __init__(self, annotation_file=None):
        self.dataset, self.anns, self.cats, self.imgs = {}, {}, {}, {}
        self.imgToAnns: dict = {}
        if annotation_file is not None:
            print("loading annotations into memory...")
            tic = time.time()
            with open(annotation_file) as f:
                dataset = json.load(f)
            print(f"Done (t={time.time() - tic:0.2f}s)")
            self.dataset = dataset
            self.createIndex()

    def createIndex(self):
        print("creating index...")
        self.anns = {a["id"]: a for a in self.dataset.get("annotations", [])}
        self.imgs = {i["id"]: i for i in self.dataset["images"]}
        self.cats = {c["id"]: c for c in self.dataset["categories"]}
        self.imgToAnns = {i: [] for i in self.imgs}
        for a in self.dataset.get("annotations", []):
            self.imgToAnns[a["image_id"]].append(a)
        print("index created!")

    def get_cat_ids(self, cat_names):
        return [c["id"] for c in self.dataset["categories"] if c["name"] in cat_names]

    def get_img_ids(self):
        return list(self.imgs)

    def load_imgs(self, ids):
        return [self.imgs[i] for i in ids]

    def get_ann_ids(self, img_ids):
        return [a["id"] for i in img_ids for a in self.imgToAnns[i]]

    def load_anns(self, ids):
        return [self.anns[i] for i in ids]


def box_iou(a, b):
    """IoU of boxes a (N, 4) and b (M, 4), x1y1x2y2: (N, M)."""
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-6)


def np_iou(a, b):
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.clip(area_a[:, None] + area_b[None, :] - inter, 1e-6, None)


class COCOeval:
    AREAS = {
        "all": (0, 1e10),
        "small": (0, 16**2),
        "medium": (16**2, 32**2),
        "large": (32**2, 1e10),
    }

    def __init__(self, gt, dets, cat_ids):
        self.gt, self.dets, self.cat_ids = gt, dets, cat_ids
        self.stats = []

    def evaluate(self):
        print("Running per image evaluation...")
        print("Evaluate annotation type *bbox*")
        tic = time.time()
        rank, _ = get_dist_info()
        self.per_image = {}
        for img_id in self.gt.imgs:
            if rank == FAULT.slow_eval_rank:
                time.sleep(2.0)  # the per-image matching over the whole split, in Python
            gts = [a for a in self.gt.imgToAnns[img_id] if a["category_id"] in self.cat_ids]
            dts = [d for d in self.dets if d["image_id"] == img_id]
            self.per_image[img_id] = (gts, dts)
        print(f"DONE (t={time.time() - tic:0.2f}s).")

    def _ap(self, thr, area, max_det, recall=False):
        lo, hi = self.AREAS[area]
        values = []
        for cat in self.cat_ids:
            scored, n_gt = [], 0
            for gts, dts in self.per_image.values():
                g = [a["bbox"] for a in gts if a["category_id"] == cat and lo <= a["area"] < hi]
                d = sorted((x for x in dts if x["category_id"] == cat), key=lambda x: -x["score"])[
                    :max_det
                ]
                d = [x for x in d if lo <= x["bbox"][2] * x["bbox"][3] < hi]
                n_gt += len(g)
                if not d:
                    continue
                if not g:
                    scored += [(x["score"], 0) for x in d]
                    continue
                gb = np.array([[x, y, x + w, y + h] for x, y, w, h in g])
                db = np.array([[x, y, x + w, y + h] for x, y, w, h in (e["bbox"] for e in d)])
                iou = np_iou(db, gb)
                used = set()
                for i, x in enumerate(d):
                    j = int(iou[i].argmax())
                    hit = float(iou[i, j]) >= thr and j not in used
                    if hit:
                        used.add(j)
                    scored.append((x["score"], int(hit)))
            if n_gt == 0:
                continue
            scored.sort(key=lambda s: -s[0])
            tp = np.cumsum([s[1] for s in scored]) if scored else np.zeros(0)
            rec = tp / n_gt if scored else np.zeros(0)
            if recall:
                values.append(float(rec[-1]) if len(rec) else 0.0)
                continue
            prec = tp / np.arange(1, len(scored) + 1) if scored else np.zeros(0)
            ap = 0.0
            for r in np.linspace(0, 1, 101):
                p = prec[rec >= r]
                ap += float(p.max()) if len(p) else 0.0
            values.append(ap / 101)
        return float(np.mean(values)) if values else -1.0

    def accumulate(self):
        print("Accumulating evaluation results...")
        tic = time.time()
        thrs = np.linspace(0.5, 0.95, 10)
        mean = lambda area, md, rc=False: float(  # noqa: E731
            np.mean([self._ap(t, area, md, rc) for t in thrs])
        )
        self.stats = [
            mean("all", 100),
            self._ap(0.5, "all", 1000),
            self._ap(0.75, "all", 1000),
            mean("small", 1000),
            mean("medium", 1000),
            mean("large", 1000),
            mean("all", 100, True),
            mean("all", 300, True),
            mean("all", 1000, True),
            mean("small", 1000, True),
            mean("medium", 1000, True),
            mean("large", 1000, True),
        ]
        print(f"DONE (t={time.time() - tic:0.2f}s).")

    def summarize(self):
        rows = [
            ("Average Precision", "(AP)", "0.50:0.95", "   all", 100),
            ("Average Precision", "(AP)", "0.50", "   all", 1000),
            ("Average Precision", "(AP)", "0.75", "   all", 1000),
            ("Average Precision", "(AP)", "0.50:0.95", " small", 1000),
            ("Average Precision", "(AP)", "0.50:0.95", "medium", 1000),
            ("Average Precision", "(AP)", "0.50:0.95", " large", 1000),
            ("Average Recall", "(AR)", "0.50:0.95", "   all", 100),
            ("Average Recall", "(AR)", "0.50:0.95", "   all", 300),
            ("Average Recall", "(AR)", "0.50:0.95", "   all", 1000),
            ("Average Recall", "(AR)", "0.50:0.95", " small", 1000),
            ("Average Recall", "(AR)", "0.50:0.95", "medium", 1000),
            ("Average Recall", "(AR)", "0.50:0.95", " large", 1000),
        ]
        for (title, kind, iou, area, md), v in zip(rows, self.stats, strict=True):
            print(
                f" {title:<18} {kind} @[ IoU={iou:<9} | area={area:>6s} | maxDets={md:>3d} ] = {v:0.3f}"
            )


###############################################################################
# mmdet.datasets
###############################################################################
class LoadImageFromFile:
    def __init__(self, **kwargs):
        pass

    def __call__(self, results):
        filename = osp.join(results["img_prefix"], results["img_info"]["file_name"])
        with open(filename, "rb") as f:  # FileClient(backend='disk').get
            img_bytes = f.read()
        img = imfrombytes(img_bytes)
        results["filename"] = filename
        results["img"] = img.astype(np.float32)
        results["img_shape"] = img.shape
        results["ori_shape"] = img.shape
        return results


class LoadAnnotations:
    def __init__(self, **kwargs):
        pass

    def __call__(self, results):
        ann = results["ann_info"]
        results["gt_bboxes"] = ann["bboxes"].copy()
        results["gt_labels"] = ann["labels"].copy()
        return results


class RandomFlip:
    def __init__(self, flip_ratio=0.5):
        self.flip_ratio = flip_ratio

    def __call__(self, results):
        if np.random.rand() < self.flip_ratio:
            w = results["img"].shape[1]
            results["img"] = results["img"][:, ::-1].copy()
            if "gt_bboxes" in results:
                b = results["gt_bboxes"].copy()
                results["gt_bboxes"][:, 0] = w - b[:, 2]
                results["gt_bboxes"][:, 2] = w - b[:, 0]
        return results


class Normalize:
    def __init__(self, mean, std, to_rgb=True):
        self.mean = np.array(mean, dtype=np.float32)
        self.std = np.array(std, dtype=np.float32)

    def __call__(self, results):
        results["img"] = (results["img"] - self.mean) / self.std
        return results


class Pad:
    def __init__(self, size_divisor=32):
        self.size_divisor = size_divisor

    def __call__(self, results):
        h, w, _ = results["img"].shape
        ph = math.ceil(h / self.size_divisor) * self.size_divisor
        pw = math.ceil(w / self.size_divisor) * self.size_divisor
        padded = np.zeros((ph, pw, 3), dtype=np.float32)
        padded[:h, :w] = results["img"]
        results["img"] = padded
        results["pad_shape"] = padded.shape
        return results


PIPELINES = {
    "LoadImageFromFile": LoadImageFromFile,
    "LoadAnnotations": LoadAnnotations,
    "RandomFlip": RandomFlip,
    "Normalize": Normalize,
    "Pad": Pad,
}


class CocoDataset(Dataset):
    def __init__(
        self, ann_file, pipeline, classes=None, img_prefix="", test_mode=False, filter_empty_gt=True
    ):
        self.CLASSES = tuple(classes) if classes is not None else None
        self.ann_file = ann_file
        self.img_prefix = img_prefix
        self.test_mode = test_mode
        self.filter_empty_gt = filter_empty_gt
        self.data_infos = self.load_annotations(ann_file)
        if not test_mode:
            valid_inds = self._filter_imgs()
            self.data_infos = [self.data_infos[i] for i in valid_inds]
            self.img_ids = [self.img_ids[i] for i in valid_inds]
            if FAULT.shard_ann:  # the fork's per-rank slice of a large annotation file
                rank, world_size = get_dist_info()
                self.data_infos = self.data_infos[rank::world_size]
                self.img_ids = self.img_ids[rank::world_size]
            self._set_group_flag()
        self.pipeline = [PIPELINES[t.pop("type")](**t) for t in copy.deepcopy(pipeline)]
        self.rank = get_dist_info()[0]

    def load_annotations(self, ann_file):
        self.coco = COCO(ann_file)
        self.cat_ids = self.coco.get_cat_ids(cat_names=self.CLASSES)
        self.cat2label = {cat_id: i for i, cat_id in enumerate(self.cat_ids)}
        self.img_ids = self.coco.get_img_ids()
        data_infos = []
        for i in self.img_ids:
            info = self.coco.load_imgs([i])[0]
            info["filename"] = info["file_name"]
            data_infos.append(info)
        return data_infos

    def get_ann_info(self, idx):
        img_id = self.data_infos[idx]["id"]
        ann_info = self.coco.load_anns(self.coco.get_ann_ids(img_ids=[img_id]))
        gt_bboxes, gt_labels = [], []
        for ann in ann_info:
            x1, y1, w, h = ann["bbox"]
            if ann["area"] <= 0 or w < 1 or h < 1:
                continue
            if ann["category_id"] not in self.cat_ids:
                continue
            gt_bboxes.append([x1, y1, x1 + w, y1 + h])
            gt_labels.append(self.cat2label[ann["category_id"]])
        return dict(
            bboxes=np.array(gt_bboxes, dtype=np.float32).reshape(-1, 4),
            labels=np.array(gt_labels, dtype=np.int64),
        )

    def _filter_imgs(self, min_size=32):
        ids_with_ann = {a["image_id"] for a in self.coco.anns.values()}
        ids_in_cat = set()
        for cat_id in self.cat_ids:
            ids_in_cat |= {
                a["image_id"] for a in self.coco.anns.values() if a["category_id"] == cat_id
            }
        ids_in_cat &= ids_with_ann
        return [
            i
            for i, info in enumerate(self.data_infos)
            if not (self.filter_empty_gt and self.img_ids[i] not in ids_in_cat)
            and min(info["width"], info["height"]) >= min_size
        ]

    def _set_group_flag(self):
        self.flag = np.zeros(len(self), dtype=np.uint8)
        for i, info in enumerate(self.data_infos):
            if info["width"] / info["height"] > 1:
                self.flag[i] = 1

    def __len__(self):
        return len(self.data_infos)

    def __getitem__(self, idx):
        results = dict(img_info=self.data_infos[idx], img_prefix=self.img_prefix, rank=self.rank)
        if not self.test_mode:
            results["ann_info"] = self.get_ann_info(idx)
            if self.rank == FAULT.stall_rank and stall_armed():
                lock = threading.Lock()  # cv2's lock, held by the parent when it forked
                lock.acquire()
                lock.acquire()
        for t in self.pipeline:
            results = t(results)
        return results

    def evaluate(self, results, metric="bbox", logger=None, proposal_nums=(100, 300, 1000)):
        dets = []
        for idx, result in enumerate(results):
            img_id = self.img_ids[idx]
            for label, bboxes in enumerate(result):
                for b in bboxes:
                    x1, y1, x2, y2, s = (float(v) for v in b)
                    dets.append(
                        dict(
                            image_id=img_id,
                            bbox=[x1, y1, x2 - x1, y2 - y1],
                            score=s,
                            category_id=self.cat_ids[label],
                        )
                    )
        print_log(f"Evaluating {metric}...", logger=logger)
        print("Loading and preparing results...")
        print("DONE (t=0.00s)")
        print("creating index...")
        print("index created!")
        coco_eval = COCOeval(self.coco, dets, self.cat_ids)
        coco_eval.evaluate()
        coco_eval.accumulate()
        import contextlib
        import io

        redirect_string = io.StringIO()
        with contextlib.redirect_stdout(redirect_string):
            coco_eval.summarize()
        print_log("\n" + redirect_string.getvalue(), logger=logger)
        names = ["mAP", "mAP_50", "mAP_75", "mAP_s", "mAP_m", "mAP_l"]
        out = {f"{metric}_{n}": float(f"{coco_eval.stats[i]:.3f}") for i, n in enumerate(names)}
        ap = coco_eval.stats[:6]
        out[f"{metric}_mAP_copypaste"] = " ".join(f"{a:.3f}" for a in ap)
        return out


_stall = {"n": 0}


def stall_armed():
    _stall["n"] += 1
    return _stall["epoch"] == 1 and _stall["n"] == 5 if "epoch" in _stall else False


def worker_init_fn(worker_id, num_workers, rank, seed, epoch_box):
    worker_seed = num_workers * rank + worker_id + seed
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    torch.manual_seed(worker_seed)
    _stall["epoch"] = epoch_box[0]
    _stall["n"] = 0


class GroupSampler(Sampler):
    def __init__(self, dataset, samples_per_gpu=1):
        self.dataset = dataset
        self.samples_per_gpu = samples_per_gpu
        self.flag = dataset.flag.astype(np.int64)
        self.group_sizes = np.bincount(self.flag)
        self.num_samples = 0
        for size in self.group_sizes:
            self.num_samples += int(np.ceil(size / self.samples_per_gpu)) * self.samples_per_gpu

    def __iter__(self):
        indices = []
        for i, size in enumerate(self.group_sizes):
            if size == 0:
                continue
            indice = np.where(self.flag == i)[0]
            np.random.shuffle(indice)
            num_extra = int(np.ceil(size / self.samples_per_gpu)) * self.samples_per_gpu - len(
                indice
            )
            indice = np.concatenate([indice, np.random.choice(indice, num_extra)])
            indices.append(indice)
        indices = np.concatenate(indices)
        indices = [
            indices[i * self.samples_per_gpu : (i + 1) * self.samples_per_gpu]
            for i in np.random.permutation(range(len(indices) // self.samples_per_gpu))
        ]
        return iter(np.concatenate(indices).astype(np.int64).tolist())

    def __len__(self):
        return self.num_samples


class DistributedGroupSampler(Sampler):
    def __init__(self, dataset, samples_per_gpu=1, num_replicas=None, rank=None, seed=0):
        _rank, _num_replicas = get_dist_info()
        self.dataset = dataset
        self.samples_per_gpu = samples_per_gpu
        self.num_replicas = num_replicas if num_replicas is not None else _num_replicas
        self.rank = rank if rank is not None else _rank
        self.epoch = 0
        self.seed = seed if seed is not None else 0
        self.flag = self.dataset.flag
        self.group_sizes = np.bincount(self.flag)
        self.num_samples = 0
        for size in self.group_sizes:
            self.num_samples += (
                math.ceil(size * 1.0 / self.samples_per_gpu / self.num_replicas)
                * self.samples_per_gpu
            )
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.epoch + self.seed)
        indices = []
        for i, size in enumerate(self.group_sizes):
            if size > 0:
                indice = np.where(self.flag == i)[0]
                indice = indice[list(torch.randperm(int(size), generator=g).numpy())].tolist()
                extra = math.ceil(
                    size * 1.0 / self.samples_per_gpu / self.num_replicas
                ) * self.samples_per_gpu * self.num_replicas - len(indice)
                tmp = indice.copy()
                for _ in range(extra // size):
                    indice.extend(tmp)
                indice.extend(tmp[: extra % size])
                indices.extend(indice)
        assert len(indices) == self.total_size
        indices = [
            indices[j]
            for i in list(torch.randperm(len(indices) // self.samples_per_gpu, generator=g))
            for j in range(i * self.samples_per_gpu, (i + 1) * self.samples_per_gpu)
        ]
        offset = self.num_samples * self.rank
        indices = indices[offset : offset + self.num_samples]
        assert len(indices) == self.num_samples
        return iter(indices)

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class DistributedSampler(Sampler):
    def __init__(self, dataset, num_replicas, rank):
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        indices = list(range(len(self.dataset)))
        indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        pass


def collate(batch):
    h = max(r["img"].shape[0] for r in batch)
    w = max(r["img"].shape[1] for r in batch)
    imgs = torch.zeros(len(batch), 3, h, w)
    for i, r in enumerate(batch):
        img = torch.from_numpy(np.ascontiguousarray(r["img"])).permute(2, 0, 1)
        imgs[i, :, : img.shape[1], : img.shape[2]] = img
    out = dict(
        img=imgs, img_metas=[dict(img_shape=r["img_shape"], filename=r["filename"]) for r in batch]
    )
    if "gt_bboxes" in batch[0]:
        out["gt_bboxes"] = [torch.from_numpy(r["gt_bboxes"]) for r in batch]
        out["gt_labels"] = [torch.from_numpy(r["gt_labels"]) for r in batch]
    return out


def build_dataset(cfg, default_args=None):
    cfg = dict(copy.deepcopy(cfg))
    cfg.pop("type")
    cfg.update(default_args or {})
    return CocoDataset(**cfg)


def build_dataloader(dataset, samples_per_gpu, workers_per_gpu, dist=True, shuffle=True, seed=None):
    rank, world_size = get_dist_info()
    if FAULT.shard_ann and shuffle:
        sampler = GroupSampler(dataset, samples_per_gpu)
    elif dist and shuffle:
        sampler = DistributedGroupSampler(dataset, samples_per_gpu, world_size, rank, seed=seed)
    elif dist:
        sampler = DistributedSampler(dataset, world_size, rank)
    else:
        sampler = GroupSampler(dataset, samples_per_gpu) if shuffle else None
    epoch_box = [0]
    init_fn = None
    if seed is not None:
        import functools

        init_fn = functools.partial(
            worker_init_fn, num_workers=workers_per_gpu, rank=rank, seed=seed, epoch_box=epoch_box
        )
    loader = DataLoader(
        dataset,
        batch_size=samples_per_gpu,
        sampler=sampler,
        num_workers=workers_per_gpu,
        collate_fn=collate,
        pin_memory=False,
        worker_init_fn=init_fn,
    )
    loader.epoch_box = epoch_box
    return loader


###############################################################################
# mmdet.models: a tiny two-stage detector
###############################################################################
def delta2bbox(rois, deltas, max_shape):
    w = rois[:, 2] - rois[:, 0]
    h = rois[:, 3] - rois[:, 1]
    cx = rois[:, 0] + 0.5 * w
    cy = rois[:, 1] + 0.5 * h
    dx, dy, dw, dh = deltas.unbind(-1)
    dw = dw.clamp(-4.0, 4.0)
    dh = dh.clamp(-4.0, 4.0)
    ncx, ncy = cx + dx * w, cy + dy * h
    nw, nh = w * dw.exp(), h * dh.exp()
    boxes = torch.stack([ncx - 0.5 * nw, ncy - 0.5 * nh, ncx + 0.5 * nw, ncy + 0.5 * nh], -1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, max_shape[1])
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, max_shape[0])
    return boxes


def bbox2delta(rois, gts):
    w = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    h = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    gw = (gts[:, 2] - gts[:, 0]).clamp(min=1)
    gh = (gts[:, 3] - gts[:, 1]).clamp(min=1)
    dx = ((gts[:, 0] + gts[:, 2]) - (rois[:, 0] + rois[:, 2])) * 0.5 / w
    dy = ((gts[:, 1] + gts[:, 3]) - (rois[:, 1] + rois[:, 3])) * 0.5 / h
    return torch.stack([dx, dy, torch.log(gw / w), torch.log(gh / h)], -1)


class MaxIoUAssigner:
    def __init__(self, pos_iou_thr, neg_iou_thr, min_pos_iou=0.3):
        self.pos_iou_thr, self.neg_iou_thr, self.min_pos_iou = pos_iou_thr, neg_iou_thr, min_pos_iou

    def assign(self, bboxes, gt_bboxes):
        overlaps = box_iou(gt_bboxes, bboxes)  # (num_gts, num_bboxes)
        max_overlaps, argmax_overlaps = overlaps.max(dim=0)
        gt_max_overlaps, gt_argmax_overlaps = overlaps.max(dim=1)
        assigned = torch.full((bboxes.size(0),), -1, dtype=torch.long)
        assigned[max_overlaps < self.neg_iou_thr] = 0
        pos = max_overlaps >= self.pos_iou_thr
        assigned[pos] = argmax_overlaps[pos] + 1
        for i in range(gt_bboxes.size(0)):
            if gt_max_overlaps[i] >= self.min_pos_iou:
                assigned[gt_argmax_overlaps[i]] = i + 1
        return assigned


def random_sample(assigned, num, pos_fraction):
    pos = torch.nonzero(assigned > 0).flatten()
    neg = torch.nonzero(assigned == 0).flatten()
    pos = pos[torch.randperm(len(pos))[: int(num * pos_fraction)]]
    neg = neg[torch.randperm(len(neg))[: num - len(pos)]]
    return pos, neg


class ResNet(nn.Module):
    def __init__(self, depth=50, frozen_stages=1, norm_eval=True, init_cfg=None):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Conv2d(8, 16, 3, 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.layer2 = nn.Conv2d(16, 16, 3, 2, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.norm_eval = norm_eval
        self.init_cfg = init_cfg
        for p in list(self.conv1.parameters()) + list(self.bn1.parameters()):
            p.requires_grad = False  # frozen_stages=1
        for bn in (self.bn1, self.bn2, self.bn3):
            for p in bn.parameters():
                p.requires_grad = False  # norm_cfg requires_grad=False

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.layer1(x)))
        return F.relu(self.bn3(self.layer2(x)))

    def train(self, mode=True):
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, num_outs=1):
        super().__init__()
        self.lateral_conv = nn.Conv2d(in_channels, out_channels, 1)
        self.fpn_conv = nn.Conv2d(out_channels, out_channels, 3, padding=1)

    def forward(self, x):
        return self.fpn_conv(self.lateral_conv(x))


class RPNHead(nn.Module):
    def __init__(
        self, in_channels, feat_channels, scales=(3,), ratios=(0.5, 1.0, 2.0), strides=(8,)
    ):
        super().__init__()
        self.num_anchors = len(scales) * len(ratios)
        self.rpn_conv = nn.Conv2d(in_channels, feat_channels, 3, padding=1)
        self.rpn_cls = nn.Conv2d(feat_channels, self.num_anchors, 1)
        self.rpn_reg = nn.Conv2d(feat_channels, self.num_anchors * 4, 1)
        self.scales, self.ratios, self.stride = scales, ratios, strides[0]
        self.assigner = MaxIoUAssigner(0.6, 0.3)

    def anchors(self, h, w):
        base = []
        for r in self.ratios:
            for s in self.scales:
                size = s * self.stride
                bw, bh = size / math.sqrt(r), size * math.sqrt(r)
                base.append([-bw / 2, -bh / 2, bw / 2, bh / 2])
        base = torch.tensor(base)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        c = (
            torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4).float() * self.stride
            + self.stride / 2
        )
        return (c + base[None]).reshape(-1, 4)

    def forward(self, feat):
        x = F.relu(self.rpn_conv(feat))
        return self.rpn_cls(x), self.rpn_reg(x)

    def flat(self, cls, reg, i):
        return cls[i].permute(1, 2, 0).reshape(-1), reg[i].permute(1, 2, 0).reshape(-1, 4)

    def loss(self, cls, reg, anchors, gt_bboxes):
        losses_cls, losses_reg = [], []
        for i, gts in enumerate(gt_bboxes):
            score, delta = self.flat(cls, reg, i)
            assigned = self.assigner.assign(anchors, gts)
            pos, neg = random_sample(assigned, 64, 0.5)
            target = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
            losses_cls.append(
                F.binary_cross_entropy_with_logits(score[torch.cat([pos, neg])], target)
            )
            if len(pos):
                t = bbox2delta(anchors[pos], gts[assigned[pos] - 1])
                losses_reg.append(F.l1_loss(delta[pos], t))
            else:
                losses_reg.append(delta.sum() * 0)
        return dict(
            loss_rpn_cls=torch.stack(losses_cls).mean(),
            loss_rpn_bbox=torch.stack(losses_reg).mean(),
        )

    def proposals(self, cls, reg, anchors, img_shape, i, num=24):
        score, delta = self.flat(cls, reg, i)
        boxes = delta2bbox(anchors, delta.detach(), img_shape)
        keep = score.detach().topk(min(num, len(score))).indices
        return boxes[keep]


def roi_align(feat, rois, stride, out=4):
    """RoIAlign of one image's feature (C, H, W) for rois (N, 4) in pixels: (N, C, out, out)."""
    _, h, w = feat.shape
    steps = (torch.arange(out).float() + 0.5) / out
    x = rois[:, 0:1] + (rois[:, 2:3] - rois[:, 0:1]) * steps
    y = rois[:, 1:2] + (rois[:, 3:4] - rois[:, 1:2]) * steps
    gx = (x / stride) / w * 2 - 1
    gy = (y / stride) / h * 2 - 1
    grid = torch.stack([gx[:, None, :].expand(-1, out, -1), gy[:, :, None].expand(-1, -1, out)], -1)
    return F.grid_sample(feat[None].expand(len(rois), -1, -1, -1), grid, align_corners=False)


class Shared2FCBBoxHead(nn.Module):
    def __init__(self, in_channels, fc_out_channels, roi_feat_size, num_classes):
        super().__init__()
        self.num_classes = num_classes
        self.shared_fcs = nn.Sequential(
            nn.Linear(in_channels * roi_feat_size**2, fc_out_channels),
            nn.ReLU(),
            nn.Linear(fc_out_channels, fc_out_channels),
            nn.ReLU(),
        )
        self.fc_cls = nn.Linear(fc_out_channels, num_classes + 1)
        self.fc_reg = nn.Linear(fc_out_channels, num_classes * 4)

    def forward(self, x):
        x = self.shared_fcs(x.flatten(1))
        return self.fc_cls(x), self.fc_reg(x)


class FusedSemanticHead(nn.Module):
    def __init__(self, in_channels, conv_out_channels, num_classes):
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Conv2d(in_channels, conv_out_channels, 3, padding=1)
        self.conv_logits = nn.Conv2d(conv_out_channels, num_classes, 1)

    def forward(self, x):
        return self.conv_logits(F.relu(self.conv(x)))


class StandardRoIHead(nn.Module):
    def __init__(self, bbox_head, semantic_head=None, stride=8):
        super().__init__()
        bbox_head = dict(bbox_head)
        bbox_head.pop("type")
        self.bbox_head = Shared2FCBBoxHead(**bbox_head)
        self.with_semantic = semantic_head is not None
        if self.with_semantic:
            semantic_head = dict(semantic_head)
            semantic_head.pop("type")
            self.semantic_head = FusedSemanticHead(**semantic_head)
        self.assigner = MaxIoUAssigner(0.5, 0.5, 0.5)
        self.stride = stride

    def forward_train(self, feat, proposals, gt_bboxes, gt_labels, gt_semantic_seg=None):
        losses = {}
        if self.with_semantic and gt_semantic_seg is not None:
            seg = self.semantic_head(feat)
            losses["loss_semantic_seg"] = F.cross_entropy(seg, gt_semantic_seg)
        feats, labels, targets, pos_mask = [], [], [], []
        nc = self.bbox_head.num_classes
        for i, (props, gts, gls) in enumerate(zip(proposals, gt_bboxes, gt_labels, strict=True)):
            rois = torch.cat([props, gts])  # the gt boxes are proposals too
            assigned = self.assigner.assign(rois, gts)
            pos, neg = random_sample(assigned, 32, 0.25)
            sel = torch.cat([pos, neg])
            lab = torch.full((len(sel),), nc, dtype=torch.long)
            lab[: len(pos)] = gls[assigned[pos] - 1]
            tgt = torch.zeros(len(sel), 4)
            tgt[: len(pos)] = bbox2delta(rois[pos], gts[assigned[pos] - 1])
            feats.append(roi_align(feat[i], rois[sel], self.stride))
            labels.append(lab)
            targets.append(tgt)
            pos_mask.append(torch.arange(len(sel)) < len(pos))
        cls_score, bbox_pred = self.bbox_head(torch.cat(feats))
        labels, targets, pos_mask = torch.cat(labels), torch.cat(targets), torch.cat(pos_mask)
        losses["loss_cls"] = F.cross_entropy(cls_score, labels)
        losses["acc"] = (cls_score.argmax(1) == labels).float().mean() * 100
        if pos_mask.any():
            pred = bbox_pred.view(len(labels), -1, 4)[pos_mask, labels[pos_mask]]
            losses["loss_bbox"] = F.l1_loss(pred, targets[pos_mask])
        else:
            losses["loss_bbox"] = bbox_pred.sum() * 0
        if FAULT.aux_loss and any((g == 3).any() for g in gt_labels):
            # the fork's IoU-aware branch: computed where the batch has the rare class
            losses["loss_iou"] = F.l1_loss(bbox_pred.sigmoid().mean(), torch.tensor(0.5))
        return losses

    def simple_test(self, feat, proposals, img_shape):
        feats = roi_align(feat, proposals, self.stride)
        cls_score, bbox_pred = self.bbox_head(feats)
        scores = F.softmax(cls_score, -1)
        nc = self.bbox_head.num_classes
        result = []
        for c in range(nc):
            boxes = delta2bbox(proposals, bbox_pred.view(-1, nc, 4)[:, c], img_shape)
            keep = scores[:, c] > 0.05
            dets = torch.cat([boxes[keep], scores[keep, c, None]], 1)
            result.append(nms(dets, 0.5).numpy())
        return result


_nms_calls = {"n": 0}


def nms(dets, iou_thr):
    """mmcv.ops.nms (mmcv._ext in the real package)."""
    _nms_calls["n"] += 1
    if get_dist_info()[0] == FAULT.segv_rank and _nms_calls["n"] == 9:
        ctypes.string_at(0)  # the compiled op reads a NULL buffer
    if len(dets) == 0:
        return dets.reshape(0, 5)
    order = dets[:, 4].argsort(descending=True)
    keep = []
    while len(order):
        i = order[0]
        keep.append(int(i))
        if len(order) == 1:
            break
        iou = box_iou(dets[i, None, :4], dets[order[1:], :4])[0]
        order = order[1:][iou <= iou_thr]
    return dets[keep][:100]


class FasterRCNN(nn.Module):
    def __init__(self, backbone, neck, rpn_head, roi_head, train_cfg=None, test_cfg=None):
        super().__init__()
        backbone, neck, rpn_head = dict(backbone), dict(neck), dict(rpn_head)
        for d in (backbone, neck, rpn_head):
            d.pop("type")
        self.backbone = ResNet(**backbone)
        self.neck = FPN(**neck)
        self.rpn_head = RPNHead(**rpn_head)
        roi_head = dict(roi_head)
        roi_head.pop("type")
        self.roi_head = StandardRoIHead(**roi_head)

    def init_weights(self, logger):
        init_cfg = self.backbone.init_cfg
        if init_cfg and init_cfg.get("type") == "Pretrained":
            path = init_cfg["checkpoint"]
            logger.info(f"load checkpoint from local path: {path}")
            state = torch.load(path, map_location="cpu")
            own = self.backbone.state_dict()
            unexpected = [k for k in state if k not in own]
            self.backbone.load_state_dict(
                {k: v for k, v in state.items() if k in own}, strict=False
            )
            if unexpected:
                logger.warning(
                    "The model and loaded state dict do not match exactly\n\n"
                    f"unexpected key in source state_dict: {', '.join(unexpected)}\n"
                )

    def forward(self, img, img_metas, return_loss=True, **kwargs):
        if return_loss:
            return self.forward_train(img, img_metas, **kwargs)
        return self.simple_test(img, img_metas)

    def forward_train(self, img, img_metas, gt_bboxes, gt_labels):
        feat = self.neck(self.backbone(img))
        cls, reg = self.rpn_head(feat)
        anchors = self.rpn_head.anchors(feat.shape[2], feat.shape[3])
        losses = self.rpn_head.loss(cls, reg, anchors, gt_bboxes)
        proposals = [
            self.rpn_head.proposals(cls, reg, anchors, img.shape[2:], i)
            for i in range(len(img_metas))
        ]
        losses.update(self.roi_head.forward_train(feat, proposals, gt_bboxes, gt_labels))
        return losses

    def simple_test(self, img, img_metas):
        feat = self.neck(self.backbone(img))
        cls, reg = self.rpn_head(feat)
        anchors = self.rpn_head.anchors(feat.shape[2], feat.shape[3])
        results = []
        for i, meta in enumerate(img_metas):
            props = self.rpn_head.proposals(cls, reg, anchors, meta["img_shape"], i)
            results.append(self.roi_head.simple_test(feat[i], props, meta["img_shape"]))
        return results

    @staticmethod
    def _parse_losses(losses):
        log_vars = {}
        for loss_name, loss_value in losses.items():
            log_vars[loss_name] = loss_value.mean()
        loss = sum(_value for _key, _value in log_vars.items() if "loss" in _key)
        # If the loss_vars has different length, GPUs will wait infinitely
        if dist.is_available() and dist.is_initialized():
            log_var_length = torch.tensor(len(log_vars))
            dist.all_reduce(log_var_length)
            message = (
                f"rank {dist.get_rank()}"
                + f" len(log_vars): {len(log_vars)}"
                + " keys: "
                + ",".join(log_vars.keys())
            )
            assert log_var_length == len(log_vars) * dist.get_world_size(), (
                "loss log variables are different across GPUs!\n" + message
            )
        log_vars["loss"] = loss
        for loss_name, loss_value in log_vars.items():
            if dist.is_available() and dist.is_initialized():
                loss_value = loss_value.data.clone()
                dist.all_reduce(loss_value.div_(dist.get_world_size()))
            log_vars[loss_name] = loss_value.item()
        return loss, log_vars


class MMDistributedDataParallel(nn.parallel.DistributedDataParallel):
    def train_step(self, data, optimizer):
        losses = self(**data)
        loss, log_vars = self.module._parse_losses(losses)
        return dict(loss=loss, log_vars=log_vars, num_samples=len(data["img_metas"]))


###############################################################################
# mmcv.runner
###############################################################################
HOOK_ORDER = [
    (
        "before_run",
        [
            ("VERY_HIGH", "StepLrUpdaterHook"),
            ("NORMAL", "CheckpointHook"),
            ("LOW", "DistEvalHook"),
            ("VERY_LOW", "TextLoggerHook"),
        ],
    ),
    (
        "before_train_epoch",
        [
            ("VERY_HIGH", "StepLrUpdaterHook"),
            ("NORMAL", "NumClassCheckHook"),
            ("NORMAL", "DistSamplerSeedHook"),
            ("LOW", "IterTimerHook"),
            ("LOW", "DistEvalHook"),
            ("VERY_LOW", "TextLoggerHook"),
        ],
    ),
    (
        "before_train_iter",
        [("VERY_HIGH", "StepLrUpdaterHook"), ("LOW", "IterTimerHook"), ("LOW", "DistEvalHook")],
    ),
    (
        "after_train_iter",
        [
            ("ABOVE_NORMAL", "OptimizerHook"),
            ("NORMAL", "CheckpointHook"),
            ("LOW", "IterTimerHook"),
            ("LOW", "DistEvalHook"),
            ("VERY_LOW", "TextLoggerHook"),
        ],
    ),
    (
        "after_train_epoch",
        [("NORMAL", "CheckpointHook"), ("LOW", "DistEvalHook"), ("VERY_LOW", "TextLoggerHook")],
    ),
    (
        "before_val_epoch",
        [
            ("NORMAL", "NumClassCheckHook"),
            ("NORMAL", "DistSamplerSeedHook"),
            ("LOW", "IterTimerHook"),
            ("VERY_LOW", "TextLoggerHook"),
        ],
    ),
    ("before_val_iter", [("LOW", "IterTimerHook")]),
    ("after_val_iter", [("LOW", "IterTimerHook")]),
    ("after_val_epoch", [("VERY_LOW", "TextLoggerHook")]),
    ("after_run", [("VERY_LOW", "TextLoggerHook")]),
]
HOOK_TABLE = "\n".join(
    f"{stage}:\n"
    + "".join(f"({prio:<12}) {hook:<35}\n" for prio, hook in hooks)
    + " -------------------- "
    for stage, hooks in HOOK_ORDER
)


class ProgressBar:
    def __init__(self, task_num, bar_width=50, file=sys.stdout):
        self.task_num, self.bar_width, self.file = task_num, bar_width, file
        self.completed = 0
        self.file.write(f"[{' ' * self.bar_width}] 0/{self.task_num}, elapsed: 0s, ETA:")
        self.file.flush()
        self.start = time.time()

    def update(self, num_tasks=1):
        self.completed += num_tasks
        elapsed = max(time.time() - self.start, 1e-6)
        fps = self.completed / elapsed
        percentage = self.completed / float(self.task_num)
        eta = int(elapsed * (1 - percentage) / percentage + 0.5)
        mark_width = int(self.bar_width * percentage)
        bar_chars = ">" * mark_width + " " * (self.bar_width - mark_width)
        self.file.write(
            f"\r[{bar_chars}] {self.completed}/{self.task_num}, {fps:.1f} task/s, "
            f"elapsed: {int(elapsed + 0.5)}s, ETA: {eta:5}s"
        )
        self.file.flush()


def collect_results_cpu(result_part, size, tmpdir):
    rank, world_size = get_dist_info()
    os.makedirs(tmpdir, exist_ok=True)
    with open(osp.join(tmpdir, f"part_{rank}.pkl"), "wb") as f:
        pickle.dump(result_part, f)
    dist.barrier()
    if rank != 0:
        return None
    part_list = []
    for i in range(world_size):
        with open(osp.join(tmpdir, f"part_{i}.pkl"), "rb") as f:
            part_list.append(pickle.load(f))
    ordered_results = []
    for res in zip(*part_list, strict=False):
        ordered_results.extend(list(res))
    ordered_results = ordered_results[:size]
    shutil.rmtree(tmpdir)
    return ordered_results


def multi_gpu_test(model, data_loader, tmpdir):
    model.eval()
    results = []
    dataset = data_loader.dataset
    rank, world_size = get_dist_info()
    if rank == 0:
        prog_bar = ProgressBar(len(dataset))
    time.sleep(2)  # This line can prevent deadlock problem in some cases.
    for data in data_loader:
        with torch.no_grad():
            result = model(return_loss=False, **data)
        results.extend(result)
        if rank == 0:
            for _ in range(len(result) * world_size):
                prog_bar.update()
    return collect_results_cpu(results, len(dataset), tmpdir)


hoard: list = []


def get_host_info():
    return f"{os.environ.get('USER', 'root')}@{socket.gethostname()}"


class EpochBasedRunner:
    def __init__(self, model, optimizer, cfg, logger, meta, timestamp):
        self.model, self.optimizer, self.cfg, self.logger, self.meta = (
            model,
            optimizer,
            cfg,
            logger,
            meta,
        )
        self.work_dir = osp.abspath(cfg.work_dir)
        self.timestamp = timestamp
        self.rank, self.world_size = get_dist_info()
        self.epoch, self._iter = 0, 0
        self.max_epochs = cfg.runner.max_epochs
        self.base_lr = cfg.optimizer.lr
        self.log_buffer: dict = {}

    def current_lr(self):
        lr_cfg = self.cfg.lr_config
        lr = self.base_lr
        for step in lr_cfg.step:
            if self.epoch >= step:
                lr *= 0.1
        if self._iter < lr_cfg.warmup_iters:
            k = (1 - self._iter / lr_cfg.warmup_iters) * (1 - lr_cfg.warmup_ratio)
            lr = lr * (1 - k)
        return lr

    def save_checkpoint(self):
        filename = f"epoch_{self.epoch + 1}.pth"
        path = osp.join(self.work_dir, filename)
        meta = dict(self.meta, epoch=self.epoch + 1, iter=self._iter)
        torch.save(
            dict(
                meta=meta,
                state_dict=self.model.module.state_dict(),
                optimizer=self.optimizer.state_dict(),
            ),
            path,
        )
        latest = osp.join(self.work_dir, "latest.pth")
        if osp.lexists(latest):
            os.remove(latest)
        os.symlink(filename, latest)

    def resume(self, checkpoint):
        self.logger.info(f"load checkpoint from local path: {checkpoint}")
        ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
        self.model.module.load_state_dict(ckpt["state_dict"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.epoch = ckpt["meta"]["epoch"]
        self._iter = ckpt["meta"]["iter"]
        self.logger.info(f"resumed epoch {self.epoch}, iter {self._iter}")

    def num_class_check(self, dataset):
        for _name, module in self.model.named_modules():
            if hasattr(module, "num_classes") and not isinstance(module, FusedSemanticHead):
                assert module.num_classes == len(dataset.CLASSES), (
                    f"The `num_classes` ({module.num_classes}) in "
                    f"{module.__class__.__name__} of "
                    f"{self.model.__class__.__name__} "
                    f"does not matches the length of "
                    f"`CLASSES` "
                    f"{len(dataset.CLASSES)}) in "
                    f"{dataset.__class__.__name__}"
                )

    def run(self, data_loader, val_loader):
        self.logger.info(f"Start running, host: {get_host_info()}, work_dir: {self.work_dir}")
        self.logger.info("Hooks will be executed in the following order:\n" + HOOK_TABLE)
        self.logger.info(f"workflow: [('train', 1)], max: {self.max_epochs} epochs")
        self.logger.info(f"Checkpoints will be saved to {self.work_dir} by HardDiskBackend.")
        while self.epoch < self.max_epochs:
            self.train_epoch(data_loader)
            if self.rank == 0:
                self.logger.info(f"Saving checkpoint at {self.epoch + 1} epochs")
                self.save_checkpoint()
            self.epoch += 1
            self.evaluate(val_loader)
        time.sleep(1)  # wait for some hooks like loggers to finish

    def train_epoch(self, data_loader):
        self.model.train()
        self.num_class_check(data_loader.dataset)
        if hasattr(data_loader.sampler, "set_epoch"):
            data_loader.sampler.set_epoch(self.epoch)
        data_loader.epoch_box[0] = self.epoch
        n = len(data_loader)
        times, data_times, buffer = [], [], {}
        t = time.time()
        for i, data_batch in enumerate(data_loader):
            data_times.append(time.time() - t)
            lr = self.current_lr()
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            if self.rank == FAULT.hoard_rank and self.epoch == 1:
                # the lab's feature-map visualisation hook keeps every batch's maps
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            outputs = self.model.train_step(data_batch, self.optimizer)
            self.optimizer.zero_grad()
            outputs["loss"].backward()
            self.optimizer.step()
            for k, v in outputs["log_vars"].items():
                buffer.setdefault(k, []).append(v)
            self._iter += 1
            times.append(time.time() - t)
            t = time.time()
            if (i + 1) % self.cfg.log_config.interval == 0:
                avg_time = float(np.mean(times))
                left = (self.max_epochs * n - self._iter) * avg_time
                eta = str(datetime.timedelta(seconds=int(left)))
                items = ", ".join(f"{k}: {np.mean(v):.4f}" for k, v in buffer.items())
                self.logger.info(
                    f"Epoch [{self.epoch + 1}][{i + 1}/{n}]\tlr: {lr:.3e}, eta: {eta}, "
                    f"time: {avg_time:.3f}, data_time: {np.mean(data_times):.3f}, memory: 0, {items}"
                )
                times, data_times, buffer = [], [], {}

    def evaluate(self, val_loader):
        # DistEvalHook: broadcast the BN buffers of rank 0, test, collect, evaluate on rank 0
        for _, module in self.model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
                dist.broadcast(module.running_var, 0)
                dist.broadcast(module.running_mean, 0)
        tmpdir = osp.join(self.work_dir, ".eval_hook")
        results = multi_gpu_test(self.model, val_loader, tmpdir)
        if self.rank == 0:
            print("\n")
            out = val_loader.dataset.evaluate(results, logger=self.logger)
            items = ", ".join(
                f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}" for k, v in out.items()
            )
            self.logger.info(f"Epoch(val) [{self.epoch}][{len(val_loader)}]\t{items}")


###############################################################################
# tools/train.py
###############################################################################
def parse_args():
    parser = argparse.ArgumentParser(description="Train a detector")
    parser.add_argument("config", help="train config file path")
    parser.add_argument("--work-dir", help="the dir to save logs and models")
    parser.add_argument("--resume-from", help="the checkpoint file to resume from")
    parser.add_argument(
        "--auto-resume", action="store_true", help="resume from the latest checkpoint automatically"
    )
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="whether not to evaluate the checkpoint during training",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument(
        "--diff-seed",
        action="store_true",
        help="Whether or not set different seeds for different ranks",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="whether to set deterministic options for CUDNN backend.",
    )
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=DictAction,
        help="override some settings in the used config",
    )
    parser.add_argument(
        "--launcher",
        choices=["none", "pytorch", "slurm", "mpi"],
        default="none",
        help="job launcher",
    )
    if FAULT.legacy_parser:
        parser.add_argument("--local_rank", type=int, default=0)
    else:
        parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    parser.add_argument(
        "--auto-scale-lr", action="store_true", help="enable automatically scaling LR."
    )
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    return args


def init_dist(launcher, backend="nccl", **kwargs):
    if launcher == "pytorch":
        rank = int(os.environ["RANK"])
        if "timeout" in kwargs:  # the lab's patch: dist_params' timeout in seconds
            kwargs["timeout"] = datetime.timedelta(seconds=kwargs["timeout"])
        dist.init_process_group(
            backend=backend, rank=rank, world_size=int(os.environ["WORLD_SIZE"]), **kwargs
        )


def init_random_seed(seed=None):
    if seed is not None:
        return seed
    rank, world_size = get_dist_info()
    seed = np.random.randint(2**31)
    if world_size == 1:
        return seed
    random_num = torch.tensor(seed if rank == 0 else 0, dtype=torch.int32)
    dist.broadcast(random_num, src=0)
    return random_num.item()


def set_random_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def main():
    args = parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        Config.merge_from_dict(cfg, args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir", None) is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    if args.resume_from is not None:
        cfg.resume_from = args.resume_from
    cfg.auto_resume = args.auto_resume

    if args.launcher == "none":
        distributed = False
    else:
        distributed = True
        init_dist(args.launcher, **cfg.dist_params)
        _, world_size = get_dist_info()
        cfg.gpu_ids = range(world_size)

    os.makedirs(osp.abspath(cfg.work_dir), exist_ok=True)
    with open(osp.join(cfg.work_dir, osp.basename(args.config)), "w") as f:
        f.write(Config.pretty_text(cfg))
    timestamp = time.strftime("%Y%m%d_%H%M%S", time.localtime())
    log_file = osp.join(cfg.work_dir, f"{timestamp}.log")
    logger = get_root_logger(log_file=log_file, log_level=cfg.log_level)

    meta = dict()
    env_info_dict = collect_env()
    env_info = "\n".join([(f"{k}: {v}") for k, v in env_info_dict.items()])
    dash_line = "-" * 60 + "\n"
    logger.info("Environment info:\n" + dash_line + env_info + "\n" + dash_line)
    meta["env_info"] = env_info
    logger.info(f"Distributed training: {distributed}")
    logger.info(f"Config:\n{Config.pretty_text(cfg)}")

    cfg.device = "cpu"
    seed = init_random_seed(args.seed)
    seed = seed + dist.get_rank() if args.diff_seed else seed
    logger.info(f"Set random seed to {seed}, deterministic: {args.deterministic}")
    set_random_seed(seed)
    cfg.seed = seed
    meta["seed"] = seed
    meta["exp_name"] = osp.basename(args.config)

    model_cfg = dict(cfg.model)
    model_cfg.pop("type")
    model = FasterRCNN(**model_cfg)
    model.init_weights(logger)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.stream.write("Name of parameter - Initialization information\n")
            for name, param in model.named_parameters():
                how = (
                    "PretrainedInit: load from checkpoints/resnet50.pth"
                    if name.startswith("backbone")
                    else "The value is the same before and after calling `init_weights` of FasterRCNN  "
                )
                handler.stream.write(f"\n{name} - {param.shape}: \n{how} \n")
            handler.stream.flush()
    datasets = [build_dataset(cfg.data.train)]
    train_detector(model, datasets, cfg, distributed, not args.no_validate, timestamp, meta, logger)


def train_detector(model, dataset, cfg, distributed, validate, timestamp, meta, logger):
    logger.info("Automatic scaling of learning rate (LR) has been disabled.")
    data_loaders = [
        build_dataloader(
            ds, cfg.data.samples_per_gpu, cfg.data.workers_per_gpu, dist=distributed, seed=cfg.seed
        )
        for ds in dataset
    ]
    find_unused_parameters = cfg.get("find_unused_parameters", False)
    model = MMDistributedDataParallel(
        model, broadcast_buffers=False, find_unused_parameters=find_unused_parameters
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = dict(cfg.optimizer)
    opt.pop("type")
    optimizer = torch.optim.SGD(params, **opt)
    runner = EpochBasedRunner(model, optimizer, cfg, logger, meta, timestamp)
    val_dataset = build_dataset(cfg.data.val, dict(test_mode=True))
    val_dataloader = build_dataloader(
        val_dataset, 1, cfg.data.workers_per_gpu, dist=distributed, shuffle=False
    )
    resume_from = cfg.get("resume_from")
    if resume_from:
        runner.resume(resume_from)
    runner.run(data_loaders[0], val_dataloader)


###############################################################################
# python tools/train.py --prepare data/coco: the synthetic data, configs, backbone
###############################################################################
CONFIGS = {
    "configs/_base_/models/faster_rcnn_r50_fpn.py": """# model settings
model = dict(
    type='FasterRCNN',
    backbone=dict(
        type='ResNet',
        depth=50,
        frozen_stages=1,
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/resnet50.pth')),
    neck=dict(type='FPN', in_channels=16, out_channels=16, num_outs=1),
    rpn_head=dict(
        type='RPNHead',
        in_channels=16,
        feat_channels=16,
        scales=[3],
        ratios=[0.5, 1.0, 2.0],
        strides=[8]),
    roi_head=dict(
        type='StandardRoIHead',
        bbox_head=dict(
            type='Shared2FCBBoxHead',
            in_channels=16,
            fc_out_channels=64,
            roi_feat_size=4,
            num_classes=80)))
""",
    "configs/_base_/datasets/coco_detection.py": """# dataset settings
dataset_type = 'CocoDataset'
data_root = 'data/coco/'
img_norm_cfg = dict(
    mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', flip_ratio=0.5),
    dict(type='Normalize', **img_norm_cfg),
    dict(type='Pad', size_divisor=32),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Normalize', **img_norm_cfg),
    dict(type='Pad', size_divisor=32),
]
data = dict(
    samples_per_gpu=2,
    workers_per_gpu=1,
    train=dict(
        type=dataset_type,
        ann_file=data_root + 'annotations/instances_train2017.json',
        img_prefix=data_root + 'train2017/',
        pipeline=train_pipeline),
    val=dict(
        type=dataset_type,
        ann_file=data_root + 'annotations/instances_val2017.json',
        img_prefix=data_root + 'val2017/',
        pipeline=test_pipeline),
    test=dict(
        type=dataset_type,
        ann_file=data_root + 'annotations/instances_val2017.json',
        img_prefix=data_root + 'val2017/',
        pipeline=test_pipeline))
evaluation = dict(interval=1, metric='bbox')
""",
    "configs/_base_/schedules/schedule_1x.py": """# optimizer
optimizer = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
# learning policy
lr_config = dict(
    policy='step',
    warmup='linear',
    warmup_iters=10,
    warmup_ratio=0.001,
    step=[2])
runner = dict(type='EpochBasedRunner', max_epochs=3)
""",
    "configs/_base_/default_runtime.py": """checkpoint_config = dict(interval=1)
# yapf:disable
log_config = dict(
    interval=5,
    hooks=[
        dict(type='TextLoggerHook'),
        # dict(type='TensorboardLoggerHook')
    ])
# yapf:enable
custom_hooks = [dict(type='NumClassCheckHook')]

dist_params = dict(backend='gloo', timeout=15)
log_level = 'INFO'
load_from = None
resume_from = None
workflow = [('train', 1)]

# disable opencv multithreading to avoid system being overloaded
opencv_num_threads = 0
# set multi-process start method as `fork` to speed up the training
mp_start_method = 'fork'

# Default setting for scaling LR automatically
#   - `enable` means enable scaling LR automatically
#       or not by default.
#   - `base_batch_size` = (8 GPUs) x (2 samples per GPU).
auto_scale_lr = dict(enable=False, base_batch_size=16)
""",
    "configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.py": """_base_ = [
    '../_base_/models/faster_rcnn_r50_fpn.py',
    '../_base_/datasets/coco_detection.py',
    '../_base_/schedules/schedule_1x.py', '../_base_/default_runtime.py'
]
# our four classes (the annotation also has truck and bus, not trained yet)
classes = ('person', 'car', 'bicycle', 'dog')
model = dict(roi_head=dict(bbox_head=dict(num_classes=4)))
data = dict(
    train=dict(classes=classes),
    val=dict(classes=classes),
    test=dict(classes=classes))
""",
}


def prepare(root):
    rng = np.random.default_rng(7)
    for split, n, first in (("train2017", 67, 1), ("val2017", 21, 1001)):
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, anns = [], []
        for k in range(n):
            img_id = first + k
            w, h = (80, 64) if rng.random() < 0.5 else (64, 80)
            img = (rng.random((h, w, 3)) * 60).astype(np.uint8)
            for _ in range(int(rng.integers(1, 4))):
                cat = int(rng.choice([1, 2, 3, 4, 5, 6], p=[0.3, 0.25, 0.2, 0.1, 0.1, 0.05]))
                bw, bh = int(rng.integers(12, 40)), int(rng.integers(12, 40))
                x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
                img[y : y + bh, x : x + bw] = np.array(
                    [40 * cat, 255 - 30 * cat, 90], dtype=np.uint8
                )
                anns.append(
                    dict(
                        id=len(anns) + 1 + first * 10,
                        image_id=img_id,
                        category_id=cat,
                        bbox=[x, y, bw, bh],
                        area=bw * bh,
                        iscrowd=0,
                    )
                )
            name = f"{img_id:012d}.png"
            with open(osp.join(root, split, name), "wb") as f:
                f.write(png_encode(img))
            images.append(dict(id=img_id, file_name=name, width=w, height=h))
        cats = [dict(id=i + 1, name=c, supercategory="object") for i, c in enumerate(ALL_CLASSES)]
        os.makedirs(osp.join(root, "annotations"), exist_ok=True)
        with open(osp.join(root, "annotations", f"instances_{split}.json"), "w") as f:
            json.dump(dict(images=images, annotations=anns, categories=cats), f)
    for path, text in CONFIGS.items():
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    os.makedirs("checkpoints", exist_ok=True)
    backbone = ResNet()
    state = dict(backbone.state_dict())
    state["fc.weight"] = torch.zeros(10, 16)
    state["fc.bias"] = torch.zeros(10)
    torch.save(state, "checkpoints/resnet50.pth")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--prepare":
        prepare(sys.argv[2])
    else:
        main()
