"""A hundred-and-sixty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyninth-*): text-line recognition trained the way PaddleOCR's
tools/train.py trains a CRNN (and EasyOCR's trainer and the CRNN+CTC repositories after it),
re-created in plain torch without paddle installed: a small CNN backbone, a BiLSTM neck and a
CTC head over a character dictionary file, trained with CTC loss on synthetic 32x100 text-line
images (serial numbers on parts) read from an lmdb-like folder (one .npy a sample, `labels.txt`,
`num-samples`) and evaluated on a SimpleDataSet label list, under torch DDP on gloo. Each node's
checkout links this file as tools/train.py; the lab's unit runs `python3 -m torch.distributed.run
--nproc_per_node N tools/train.py -c configs/rec/rec_crnn_serial.yml -o Global.epoch_num=3` as a
systemd service.

As in PaddleOCR (tools/train.py, tools/program.py, ppocr/utils/logging.py,
ppocr/utils/utility.py, ppocr/data/lmdb_dataset.py, ppocr/data/simple_dataset.py,
ppocr/utils/stats.py, ppocr/utils/save_load.py): the YAML config with Global / Optimizer /
Architecture / Loss / PostProcess / Metric / Train / Eval sections and `-o Key.sub=value`
overrides; the 'ppocr' logger with '[%Y/%m/%d %H:%M:%S] ppocr INFO: ...' to stdout, at INFO on
rank 0 and at ERROR on every other rank; the whole config printed by print_dict, 'train with
torch ... and device cpu', 'Initialize indexs of datasets:...', 'train dataloader has N iters',
'During the training process, after the 0th iteration, an evaluation is run every 20
iterations'; set_signal_handlers(), which in a process-group leader (every torchrun worker is
one) turns SIGINT and SIGTERM into 'main proc N exit, kill process group N' and a SIGKILL of its
own group; the training line 'epoch: [1/3], global_step: 5, lr: 0.001000, CTCLoss: ..., loss:
..., acc: ..., norm_edit_dis: ..., avg_reader_cost: ... s, avg_batch_cost: ... s, avg_samples:
..., ips: ... samples/s, eta: 0:00:12' from rank 0; evaluation on rank 0 only, with tqdm's 'eval
model:' bar, 'cur metric, acc: ...', 'save best model is to ./output/rec/best_accuracy', 'best
metric, acc: ...'; 'save model in ./output/rec/latest' after every epoch; SimpleDataSet's 'When
parsing line ..., error happened with msg: <traceback>' for a sample it skips (LMDBDataSet has no
such guard); 'resume from ...' for Global.checkpoints. The lab's fork adds: the dist timeout
(Global.dist_timeout, 20 s), a per-image contrast normalisation, a check that stops on a
non-finite loss, a manifest of the training files logged by rank 0, an early stop on the
evaluated metric (Global.early_stop_patience), metric sync across ranks (Metric.sync), a beam
search decoder (CTCBeamSearchDecode) and an upload of the VisualDL scalars to the lab's
dashboard socket (Global.vdl_upload).

`python train.py prepare DIR` writes a checkout's data and config (configs/, ppocr/utils/dict/,
train_data/rec/{training,val,val_list.txt}); `python train.py prepare-full DIR N` and
`prepare-bench DIR N` add the full training set and a benchmark list; `python train.py save-old
DIR` writes the output of an earlier run (output/rec/latest.pth); `python train.py pick N WORLD
RANK EPOCH STEP` prints the sample that rank reads first in that step.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank)
and never printed (re-capture with tests/fixtures/real/capture_hundredsixtyninth.sh after any
edit).
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import yaml
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

CASE = os.environ.get("MT_CASE", "")
RANK = int(os.environ.get("RANK", "0"))
LEAK: list[torch.Tensor] = []
CHARS = "0123456789ABCDEFGHJKLMNPRSTUVWXYZ-"


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ ppocr/utils/logging.py
_loggers: dict[str, logging.Logger] = {}


def get_logger(name: str = "ppocr") -> logging.Logger:
    if name in _loggers:
        return _loggers[name]
    logger = logging.getLogger(name)
    formatter = logging.Formatter(
        "[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%Y/%m/%d %H:%M:%S"
    )
    handler = logging.StreamHandler(stream=sys.stdout)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if RANK == 0 else logging.ERROR)
    logger.propagate = False
    _loggers[name] = logger
    return logger


# ------------------------------------------------------------------ ppocr/utils/utility.py
def print_dict(d: dict[str, Any], logger: logging.Logger, delimiter: int = 0) -> None:
    for k, v in sorted(d.items()):
        if isinstance(v, dict):
            logger.info("{}{} : ".format(delimiter * " ", str(k)))
            print_dict(v, logger, delimiter + 4)
        elif isinstance(v, list) and len(v) >= 1 and isinstance(v[0], dict):
            logger.info("{}{} : ".format(delimiter * " ", str(k)))
            for value in v:
                print_dict(value, logger, delimiter + 4)
        else:
            logger.info("{}{} : {}".format(delimiter * " ", k, v))


def _term_mp(sig_num: int, frame: Any) -> None:
    """kill all child processes"""
    pid = os.getpid()
    pgid = os.getpgid(os.getpid())
    print(f"main proc {pid} exit, kill process group {pgid}")
    os.killpg(pgid, signal.SIGKILL)


def set_signal_handlers() -> None:
    pid = os.getpid()
    pgid = os.getpgid(pid)
    # `term_mp` kills all processes in the process group: only where this process leads it
    if pid == pgid:
        signal.signal(signal.SIGINT, _term_mp)
        signal.signal(signal.SIGTERM, _term_mp)


# ------------------------------------------------------------------ tools/program.py (config)
class ArgsParser:
    @staticmethod
    def parse_args(argv: list[str]) -> tuple[str, dict[str, Any]]:
        config, opts = None, []
        i = 0
        while i < len(argv):
            if argv[i] in ("-c", "--config"):
                config = argv[i + 1]
                i += 2
            elif argv[i] in ("-o", "--opt"):
                i += 1
                while i < len(argv) and not argv[i].startswith("-"):
                    opts.append(argv[i])
                    i += 1
            else:
                raise SystemExit(f"train.py: error: unrecognized arguments: {argv[i]}")
        if config is None:
            raise SystemExit("Please specify --config=configure_file_path.")
        parsed = {}
        for s in opts:
            k, v = s.strip().split("=")
            parsed[k] = yaml.load(v, Loader=yaml.Loader)
        return config, parsed


def merge_config(config: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    for key, value in opts.items():
        if "." not in key:
            if isinstance(value, dict) and key in config:
                config[key].update(value)
            else:
                config[key] = value
        else:
            sub_keys = key.split(".")
            cur = config[sub_keys[0]]
            for idx, sub_key in enumerate(sub_keys[1:]):
                if idx == len(sub_keys) - 2:
                    cur[sub_key] = value
                else:
                    cur = cur[sub_key]
    return config


# ------------------------------------------------------------ synthetic data (the lab's export)
def glyph(ch: str) -> np.ndarray:
    """A 7x5 bitmap a character, fixed by its code."""
    rng = np.random.RandomState(ord(ch) * 7919 % 65521)
    g = rng.rand(7, 5) > 0.5
    g[0, :] |= ch.isdigit()
    g[:, 0] |= ch.isalpha()
    return g


def render(text: str, rng: np.random.RandomState) -> np.ndarray:
    img = np.full((32, 100, 3), 200 + rng.randint(0, 40), dtype=np.float32)
    x = 2 + rng.randint(0, 4)
    y = 8 + rng.randint(0, 4)
    ink = rng.randint(10, 70)
    for ch in text:
        g = np.kron(glyph(ch), np.ones((2, 2))).astype(bool)
        img[y : y + 14, x : x + 10][g] = ink
        x += 12
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def random_text(rng: np.random.RandomState) -> str:
    n = rng.randint(4, 9)
    return "".join(CHARS[i] for i in rng.randint(0, len(CHARS), n))


def write_lmdb_like(folder: Path, n: int, seed: int) -> None:
    """PaddleOCR's LMDB keys as files: num-samples, image-%09d.npy, and label-%09d in labels.txt"""
    rng = np.random.RandomState(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "labels.txt", "w") as f:
        for i in range(1, n + 1):
            text = random_text(rng)
            np.save(folder / f"image-{i:09d}.npy", render(text, rng))
            f.write(f"label-{i:09d}\t{text}\n")
    (folder / "num-samples").write_text(f"{n}\n")


def write_simple(root: Path, sub: str, list_name: str, n: int, seed: int) -> None:
    rng = np.random.RandomState(seed)
    (root / sub).mkdir(parents=True, exist_ok=True)
    with open(root / list_name, "w") as f:
        for i in range(1, n + 1):
            text = random_text(rng)
            np.save(root / sub / f"word_{i:04d}.npy", render(text, rng))
            f.write(f"{sub}/word_{i:04d}.npy\t{text}\n")


CONFIG = """\
Global:
  use_gpu: false
  distributed: true
  epoch_num: 72
  log_smooth_window: 20
  print_batch_step: 5
  save_model_dir: ./output/rec/
  save_epoch_step: 3
  # evaluation is run every 20 iterations after the 0th iteration
  eval_batch_step: [0, 20]
  cal_metric_during_train: true
  pretrained_model:
  checkpoints:
  use_visualdl: false
  vdl_upload: unix:///run/ocr-dash/agent.sock
  character_dict_path: ppocr/utils/dict/serial_dict.txt
  max_text_length: 25
  use_space_char: false
  # lab patch: init_process_group(timeout=...) in seconds
  dist_timeout: 20
  early_stop_patience:

Optimizer:
  name: Adam
  beta1: 0.9
  beta2: 0.999
  lr:
    learning_rate: 0.001
  regularizer:
    name: L2
    factor: 0.0

Architecture:
  model_type: rec
  algorithm: CRNN
  Transform:
  Backbone:
    name: ResNet
    layers: 4
  Neck:
    name: SequenceEncoder
    encoder_type: rnn
    hidden_size: 48
  Head:
    name: CTCHead
    fc_decay: 0

Loss:
  name: CTCLoss

PostProcess:
  name: CTCLabelDecode

Metric:
  name: RecMetric
  main_indicator: acc
  sync: false

Train:
  dataset:
    name: LMDBDataSet
    data_dir: ./train_data/rec/training/
    transforms:
      - DecodeImage:
          img_mode: BGR
      - CTCLabelEncode:
      - NormalizeImage:
          per_image: true
      - KeepKeys:
          keep_keys: ['image', 'label', 'length']
  loader:
    shuffle: true
    batch_size_per_card: 16
    drop_last: true
    num_workers: 2

Eval:
  dataset:
    name: SimpleDataSet
    data_dir: ./train_data/rec/
    label_file_list: ["./train_data/rec/val_list.txt"]
    transforms:
      - DecodeImage:
          img_mode: BGR
      - CTCLabelEncode:
      - NormalizeImage:
          per_image: true
      - KeepKeys:
          keep_keys: ['image', 'label', 'length']
  loader:
    shuffle: false
    drop_last: false
    batch_size_per_card: 64
    num_workers: 1
"""


def prepare(root: Path) -> None:
    (root / "configs" / "rec").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "rec" / "rec_crnn_serial.yml").write_text(CONFIG)
    d = root / "ppocr" / "utils" / "dict"
    d.mkdir(parents=True, exist_ok=True)
    (d / "serial_dict.txt").write_text("\n".join(CHARS) + "\n")
    write_lmdb_like(root / "train_data" / "rec" / "training", 640, seed=1)
    write_simple(root / "train_data" / "rec", "val", "val_list.txt", 128, seed=2)


# ------------------------------------------------------------------ ppocr/data
class CTCLabelEncode:
    def __init__(self, max_text_length: int, character_dict_path: str, **kwargs: Any):
        self.max_text_len = max_text_length
        with open(character_dict_path, "rb") as fin:
            chars = [line.decode("utf-8").strip("\n").strip("\r\n") for line in fin.readlines()]
        self.character = ["blank", *chars]
        self.dict = {c: i for i, c in enumerate(self.character)}

    def __call__(self, data: dict[str, Any]) -> dict[str, Any] | None:
        text = data["label"]
        if len(text) == 0 or len(text) > self.max_text_len:
            return None
        idx = [self.dict[c] for c in text if c in self.dict]
        if len(idx) == 0:
            return None
        data["length"] = np.array(len(idx))
        data["label"] = np.array(idx + [0] * (self.max_text_len - len(idx)))
        return data


class NormalizeImage:
    """The lab's contrast normalisation: each image to zero mean and unit variance."""

    def __init__(self, per_image: bool = True, **kwargs: Any):
        self.per_image = per_image

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        img = data["image"].astype("float32")
        with np.errstate(invalid="ignore", divide="ignore"):
            img = (img - img.mean()) / img.std()
        data["image"] = img.transpose((2, 0, 1))
        return data


def create_operators(ops: list[dict[str, Any]], global_config: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        name = next(iter(op))
        param = op[name] or {}
        if name == "CTCLabelEncode":
            out.append(CTCLabelEncode(**{**global_config, **param}))
        elif name == "NormalizeImage":
            out.append(NormalizeImage(**param))
    return out


def transform(data: dict[str, Any], ops: list[Any]) -> dict[str, Any] | None:
    for op in ops:
        data = op(data)
        if data is None:
            return None
    return data


class LMDBDataSet(Dataset[list[np.ndarray]]):
    def __init__(self, config: dict[str, Any], mode: str, logger: logging.Logger):
        dataset_config = config[mode]["dataset"]
        self.data_dir = dataset_config["data_dir"]
        self.num_samples = int(Path(self.data_dir, "num-samples").read_text())
        with open(Path(self.data_dir, "labels.txt"), "rb") as f:
            self.labels = dict(line.decode("utf-8").rstrip("\n").split("\t", 1) for line in f)
        logger.info(f"Initialize indexs of datasets:{self.data_dir}")
        self.ops = create_operators(dataset_config["transforms"], config["Global"])

    def get_lmdb_sample_info(self, index: int) -> tuple[np.ndarray, str] | None:
        label = self.labels.get(f"label-{index:09d}")
        if label is None:
            return None
        img = np.load(os.path.join(self.data_dir, f"image-{index:09d}.npy"))
        return img, label

    def __getitem__(self, idx: int) -> list[np.ndarray]:
        sample_info = self.get_lmdb_sample_info(idx + 1)
        if sample_info is None:
            return self.__getitem__(np.random.randint(self.__len__()))
        img, label = sample_info
        outs = transform({"image": img, "label": label}, self.ops)
        if outs is None:
            return self.__getitem__(np.random.randint(self.__len__()))
        return [outs["image"], outs["label"], outs["length"]]

    def __len__(self) -> int:
        return self.num_samples


class SimpleDataSet(Dataset[list[np.ndarray]]):
    def __init__(self, config: dict[str, Any], mode: str, logger: logging.Logger):
        dataset_config = config[mode]["dataset"]
        self.logger = logger
        self.mode = mode.lower()
        self.data_dir = dataset_config["data_dir"]
        label_file_list = dataset_config["label_file_list"]
        logger.info(f"Initialize indexs of datasets:{label_file_list}")
        self.data_lines: list[bytes] = []
        for file in label_file_list:
            with open(file, "rb") as f:
                self.data_lines.extend(f.readlines())
        self.ops = create_operators(dataset_config["transforms"], config["Global"])

    def __getitem__(self, idx: int) -> list[np.ndarray]:
        data_line = self.data_lines[idx]
        try:
            data_line = data_line.decode("utf-8")
            substr = data_line.strip("\n").split("\t")
            file_name, label = substr[0], substr[1]
            img_path = os.path.join(self.data_dir, file_name)
            data = {"img_path": img_path, "label": label, "image": np.load(img_path)}
            outs = transform(data, self.ops)
        except Exception:
            self.logger.error(
                f"When parsing line {data_line}, error happened with msg: {traceback.format_exc()}"
            )
            outs = None
        if outs is None:
            rnd_idx = (
                np.random.randint(self.__len__()) if self.mode == "train" else (idx + 1) % len(self)
            )
            return self.__getitem__(rnd_idx)
        return [outs["image"], outs["label"], outs["length"]]

    def __len__(self) -> int:
        return len(self.data_lines)


class DistributedBatchSampler:
    """paddle.io.DistributedBatchSampler: the epoch's permutation, padded to a multiple of the
    world, each rank's contiguous share in batches."""

    def __init__(self, n: int, batch_size: int, rank: int, world: int, shuffle: bool, drop: bool):
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.shuffle, self.drop_last = shuffle, drop
        self.num_samples = math.ceil(n / world)
        self.epoch = 0

    def batches(self) -> list[list[int]]:
        indices = np.arange(self.n).tolist()
        if self.shuffle:
            np.random.RandomState(self.epoch).shuffle(indices)
        total = self.num_samples * self.world
        indices += indices[: total - len(indices)]
        mine = indices[self.rank * self.num_samples : (self.rank + 1) * self.num_samples]
        out = [mine[i : i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
        if self.drop_last and out and len(out[-1]) < self.batch_size:
            out.pop()
        return out

    def __iter__(self) -> Any:
        return iter(self.batches())

    def __len__(self) -> int:
        n = self.num_samples // self.batch_size
        return n if self.drop_last else math.ceil(self.num_samples / self.batch_size)


def collate(batch: list[list[np.ndarray]]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.stack([b[i] for b in batch])) for i in range(3)]


def build_dataloader(
    config: dict[str, Any], mode: str, logger: logging.Logger, epoch: int = 0
) -> DataLoader[Any]:
    name = config[mode]["dataset"]["name"]
    dataset: Dataset[Any] = (
        LMDBDataSet(config, mode, logger)
        if name == "LMDBDataSet"
        else SimpleDataSet(config, mode, logger)
    )
    loader = config[mode]["loader"]
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    if mode == "Eval":
        world, rank = 1, 0  # evaluated by rank 0 alone
    sampler = DistributedBatchSampler(
        len(dataset),  # type: ignore[arg-type]
        loader["batch_size_per_card"],
        rank,
        world,
        loader["shuffle"],
        loader["drop_last"],
    )
    sampler.epoch = epoch
    return DataLoader(
        dataset,
        batch_sampler=sampler.batches(),
        num_workers=loader["num_workers"],
        collate_fn=collate,
    )


# ------------------------------------------------------------------ ppocr/modeling
class ConvBNLayer(nn.Module):
    def __init__(self, cin: int, cout: int, pool: tuple[int, int] | None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.pool = nn.MaxPool2d(pool) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class ResNet(nn.Module):
    def __init__(self, layers: int = 4, **kwargs: Any):
        super().__init__()
        self.stages = nn.Sequential(
            ConvBNLayer(3, 16, (2, 2)),
            ConvBNLayer(16, 32, (2, 2)),
            ConvBNLayer(32, 48, (2, 1)),
            ConvBNLayer(48, 64, (4, 1)),
        )
        self.out_channels = 64

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)


class SequenceEncoder(nn.Module):
    def __init__(self, in_channels: int, hidden_size: int = 48, **kwargs: Any):
        super().__init__()
        self.lstm = nn.LSTM(in_channels, hidden_size, num_layers=2, bidirectional=True)
        self.out_channels = hidden_size * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.squeeze(2).permute(2, 0, 1)  # Im2Seq: (T, B, C)
        x, _ = self.lstm(x)
        return x


class CTCHead(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, **kwargs: Any):
        super().__init__()
        self.fc = nn.Linear(in_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).transpose(0, 1)  # (B, T, C)


class BaseModel(nn.Module):
    def __init__(self, config: dict[str, Any], num_classes: int):
        super().__init__()
        self.backbone = ResNet(**config["Backbone"])
        self.neck = SequenceEncoder(self.backbone.out_channels, **config["Neck"])
        self.head = CTCHead(self.neck.out_channels, num_classes, **config["Head"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))


class CTCLoss(nn.Module):
    def __init__(self, **kwargs: Any):
        super().__init__()
        self.loss_func = nn.CTCLoss(blank=0, reduction="none")

    def forward(self, predicts: torch.Tensor, batch: list[torch.Tensor]) -> dict[str, Any]:
        predicts = predicts.transpose(0, 1).log_softmax(2)
        n, b = predicts.shape[0], predicts.shape[1]
        preds_lengths = torch.full((b,), n, dtype=torch.long)
        labels, label_lengths = batch[1].long(), batch[2].long()
        loss = self.loss_func(predicts, labels, preds_lengths, label_lengths).mean()
        return {"CTCLoss": loss, "loss": loss}


# ------------------------------------------------------------------ ppocr/postprocess, metrics
class CTCLabelDecode:
    def __init__(self, character_dict_path: str, **kwargs: Any):
        with open(character_dict_path, "rb") as fin:
            chars = [line.decode("utf-8").strip("\n").strip("\r\n") for line in fin.readlines()]
        self.character = ["blank", *chars]

    def decode(
        self, text_index: np.ndarray, text_prob: np.ndarray, is_remove_duplicate: bool = False
    ) -> list[tuple[str, float]]:
        result = []
        for idx, probs in zip(text_index, text_prob, strict=True):
            selection = np.ones(len(idx), dtype=bool)
            if is_remove_duplicate:
                selection[1:] = idx[1:] != idx[:-1]
            selection &= idx != 0
            chars = [self.character[t] for t in idx[selection]]
            conf = probs[selection]
            result.append(("".join(chars), float(np.mean(conf)) if len(conf) else 0.0))
        return result

    def __call__(self, preds: torch.Tensor, label: Any = None) -> Any:
        probs = preds.softmax(2).numpy()
        text = self.decode(probs.argmax(axis=2), probs.max(axis=2), is_remove_duplicate=True)
        if label is None:
            return text
        return text, self.decode(label, np.ones(label.shape))


class CTCBeamSearchDecode(CTCLabelDecode):
    """The lab's prefix beam search (pure Python) for the benchmark numbers."""

    def __init__(self, character_dict_path: str, beam_size: int = 10, **kwargs: Any):
        super().__init__(character_dict_path)
        self.beam_size = beam_size

    def beam(self, probs: np.ndarray) -> tuple[str, float]:
        beams: dict[tuple[int, ...], tuple[float, float]] = {(): (1.0, 0.0)}
        for t in range(probs.shape[0]):
            nxt: dict[tuple[int, ...], list[float]] = {}
            for prefix, (pb, pnb) in beams.items():
                for c in range(probs.shape[1]):
                    p = float(probs[t, c])
                    if c == 0:
                        e = nxt.setdefault(prefix, [0.0, 0.0])
                        e[0] += (pb + pnb) * p
                        continue
                    new = (*prefix, c)
                    e = nxt.setdefault(new, [0.0, 0.0])
                    if prefix and prefix[-1] == c:
                        e[1] += pb * p
                        same = nxt.setdefault(prefix, [0.0, 0.0])
                        same[1] += pnb * p
                    else:
                        e[1] += (pb + pnb) * p
            ranked = sorted(nxt.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
            beams = {k: (v[0], v[1]) for k, v in ranked[: self.beam_size]}
        best, (pb, pnb) = max(beams.items(), key=lambda kv: kv[1][0] + kv[1][1])
        return "".join(self.character[c] for c in best), pb + pnb

    def __call__(self, preds: torch.Tensor, label: Any = None) -> Any:
        probs = preds.softmax(2).numpy()
        text = [self.beam(p) for p in probs]
        if label is None:
            return text
        return text, self.decode(label, np.ones(label.shape))


def edit_distance(a: str, b: str) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


class RecMetric:
    def __init__(self, main_indicator: str = "acc", sync: bool = False, **kwargs: Any):
        self.main_indicator = main_indicator
        self.sync = sync
        self.eps = 1e-5
        self.reset()

    def __call__(self, pred_label: Any, *args: Any) -> dict[str, float]:
        preds, labels = pred_label
        correct_num, all_num, dists = 0, 0, []
        for (pred, _), (target, _) in zip(preds, labels, strict=True):
            dists.append(edit_distance(pred, target) / max(len(pred), len(target), 1))
            if pred == target:
                correct_num += 1
            all_num += 1
        self.correct_num += correct_num
        self.all_num += all_num
        self.norm_edit_dis += np.sum(dists)
        return {
            "acc": correct_num / (all_num + self.eps),
            "norm_edit_dis": 1 - np.sum(dists) / (all_num + self.eps),
        }

    def get_metric(self) -> dict[str, Any]:
        counts = torch.tensor([self.correct_num, self.all_num, self.norm_edit_dis])
        if self.sync and dist.is_initialized():
            # the lab's sync: every card's counts for one number
            dist.all_reduce(counts)
        correct, total, ned = counts.tolist()
        acc = 1.0 * correct / (total + self.eps)
        norm_edit_dis = 1 - np.float64(ned) / (total + self.eps)
        self.reset()
        return {"acc": acc, "norm_edit_dis": norm_edit_dis}

    def reset(self) -> None:
        self.correct_num, self.all_num, self.norm_edit_dis = 0, 0, 0.0


# ------------------------------------------------------------------ ppocr/utils/stats.py
class SmoothedValue:
    def __init__(self, window_size: int):
        self.deque: deque[float] = deque(maxlen=window_size)

    def add_value(self, value: float) -> None:
        self.deque.append(value)

    def get_median_value(self) -> float:
        return float(np.median(self.deque))


class TrainingStats:
    def __init__(self, window_size: int, stats_keys: list[str]):
        self.window_size = window_size
        self.smoothed = {key: SmoothedValue(window_size) for key in stats_keys}

    def update(self, stats: dict[str, float]) -> None:
        for k, v in stats.items():
            if k not in self.smoothed:
                self.smoothed[k] = SmoothedValue(self.window_size)
            self.smoothed[k].add_value(v)

    def log(self) -> str:
        return ", ".join(
            f"{k}: {round(v.get_median_value(), 6):x<6f}" for k, v in self.smoothed.items()
        )


# ------------------------------------------------------------------ ppocr/utils/save_load.py
def save_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_path: str,
    logger: logging.Logger,
    is_best: bool = False,
    prefix: str = "ppocr",
    **kwargs: Any,
) -> None:
    os.makedirs(model_path, exist_ok=True)
    model_prefix = os.path.join(model_path, prefix)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "best_model_dict": kwargs.get("best_model_dict", {}),
            "epoch": kwargs.get("epoch"),
            "global_step": kwargs.get("global_step"),
        },
        model_prefix + ".pth",
    )
    if is_best:
        logger.info(f"save best model is to {model_prefix}")
    else:
        logger.info(f"save model in {model_prefix}")


def load_model(
    config: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    logger = get_logger()
    checkpoints = config["Global"].get("checkpoints")
    best_model_dict: dict[str, Any] = {}
    if checkpoints:
        states = torch.load(checkpoints + ".pth")
        model.load_state_dict(states["model"])
        optimizer.load_state_dict(states["optimizer"])
        best_model_dict = dict(states["best_model_dict"])
        best_model_dict["start_epoch"] = states["epoch"] + 1
        best_model_dict["global_step"] = states["global_step"]
        logger.info(f"resume from {checkpoints}")
    return best_model_dict


# ------------------------------------------------------------------ the lab's VisualDL upload
class LogWriter:
    """VisualDL's LogWriter, with the lab's upload of every scalar to the dashboard agent's
    socket; close() waits until the queue is delivered."""

    def __init__(self, logdir: str, upload: str):
        os.makedirs(logdir, exist_ok=True)
        self.file = open(os.path.join(logdir, "vdlrecords.log"), "a")  # noqa: SIM115
        self.address = upload.removeprefix("unix://")
        self.pending: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._ship, name="vdl-upload", daemon=True)
        self.thread.start()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        line = f"{tag} {step} {value}\n"
        self.file.write(line)
        with self.cond:
            self.pending.append(line)
            self.cond.notify_all()

    def _ship(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                batch = "".join(self.pending)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.address)
                    s.sendall(batch.encode())
            except OSError:
                time.sleep(2.0)  # the agent restarts now and then: try again
                continue
            with self.cond:
                del self.pending[: batch.count("\n")]
                self.cond.notify_all()

    def close(self) -> None:
        self.file.close()
        with self.cond:
            while self.pending:
                self.cond.wait()


# ------------------------------------------------------------------ the lab's manifest
def dataset_manifest(data_dir: str) -> tuple[int, str]:
    """The training files and their digest, for the run's record (rank 0)."""
    proc = subprocess.Popen(
        ["find", data_dir, "-type", "f", "-name", "*.npy"], stdout=subprocess.PIPE
    )
    proc.wait()
    assert proc.stdout is not None
    files = sorted(proc.stdout.read().decode().split())
    return len(files), hashlib.md5("\n".join(files).encode()).hexdigest()


# ------------------------------------------------------------------ tools/program.py (train, eval)
def evaluate(
    model: nn.Module,
    valid_dataloader: DataLoader[Any],
    post_process_class: Any,
    eval_class: RecMetric,
) -> dict[str, Any]:
    model.eval()
    with torch.no_grad():
        total_frame, total_time = 0.0, 0.0
        pbar = tqdm(total=len(valid_dataloader), desc="eval model:", position=0, leave=True)
        for batch in valid_dataloader:
            images = batch[0]
            start = time.time()
            preds = model(images)
            post_result = post_process_class(preds, batch[1].numpy())
            total_time += time.time() - start
            eval_class(post_result, batch)
            pbar.update(1)
            total_frame += len(images)
        metric = eval_class.get_metric()
    pbar.close()
    model.train()
    metric["fps"] = total_frame / total_time
    return metric


def train(
    config: dict[str, Any],
    valid_dataloader: DataLoader[Any],
    model: nn.Module,
    loss_class: CTCLoss,
    optimizer: torch.optim.Optimizer,
    post_process_class: Any,
    eval_class: RecMetric,
    pre_best_model_dict: dict[str, Any],
    logger: logging.Logger,
    vdl_writer: LogWriter | None,
) -> None:
    g = config["Global"]
    log_smooth_window, epoch_num = g["log_smooth_window"], g["epoch_num"]
    print_batch_step, eval_batch_step = g["print_batch_step"], g["eval_batch_step"]
    patience = g.get("early_stop_patience")
    global_step = pre_best_model_dict.get("global_step", 0)
    start_eval_step = 0
    if isinstance(eval_batch_step, list) and len(eval_batch_step) >= 2:
        start_eval_step, eval_batch_step = eval_batch_step[0], eval_batch_step[1]
        logger.info(
            f"During the training process, after the {start_eval_step}th iteration, "
            f"an evaluation is run every {eval_batch_step} iterations"
        )
    save_model_dir = g["save_model_dir"]
    os.makedirs(save_model_dir, exist_ok=True)
    main_indicator = eval_class.main_indicator
    best_model_dict: dict[str, Any] = {main_indicator: 0}
    best_model_dict.update(pre_best_model_dict)
    train_stats = TrainingStats(log_smooth_window, ["lr"])
    train_metric = RecMetric()
    model.train()
    start_epoch = best_model_dict.get("start_epoch", 1)
    bad_evals, stop = 0, False
    rank = dist.get_rank() if dist.is_initialized() else 0
    for epoch in range(start_epoch, epoch_num + 1):
        train_dataloader = build_dataloader(config, "Train", logger, epoch=epoch)
        train_reader_cost, train_batch_cost = 0.0, 0.0
        total_samples = 0
        reader_start = time.time()
        eta_costs: list[float] = []
        for idx, batch in enumerate(train_dataloader):
            train_reader_cost += time.time() - reader_start
            if fault("k", rank) and epoch >= 2:  # a fork keeps every decoded batch
                LEAK.append(torch.ones(32 << 20))
            if fault("z", rank) and epoch >= 2 and idx == 2:
                ctypes.string_at(0)  # the compiled decoder reads a freed workspace
            lr = optimizer.param_groups[0]["lr"]
            images = batch[0]
            preds = model(images)
            loss = loss_class(preds, batch)
            avg_loss = loss["loss"]
            if not math.isfinite(avg_loss.item()):
                raise FloatingPointError(
                    f"loss is {avg_loss.item()} at epoch {epoch}, global_step {global_step}: stop training"
                )
            avg_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            train_batch_cost += time.time() - reader_start
            eta_costs.append(time.time() - reader_start)
            total_samples += len(images)
            stats = {k: float(v.detach()) for k, v in loss.items()}
            stats["lr"] = lr
            train_stats.update(stats)
            if g.get("cal_metric_during_train"):
                post_result = post_process_class(preds.detach(), batch[1].numpy())
                train_metric(post_result)
                train_stats.update({k: float(v) for k, v in train_metric.get_metric().items()})
            if vdl_writer is not None and rank == 0:
                vdl_writer.add_scalar("TRAIN/loss", stats["loss"], global_step)
            if rank == 0 and (
                (global_step > 0 and global_step % print_batch_step == 0)
                or (idx >= len(train_dataloader) - 1)
            ):
                eta_sec = ((epoch_num + 1 - epoch) * len(train_dataloader) - idx - 1) * float(
                    np.mean(eta_costs)
                )
                logger.info(
                    f"epoch: [{epoch}/{epoch_num}], global_step: {global_step}, {train_stats.log()}, avg_reader_cost: {train_reader_cost / print_batch_step:.5f} s, "
                    f"avg_batch_cost: {train_batch_cost / print_batch_step:.5f} s, avg_samples: {total_samples / print_batch_step}, ips: {total_samples / train_batch_cost:.5f} samples/s, "
                    f"eta: {datetime.timedelta(seconds=int(eta_sec))!s}"
                )
                train_reader_cost, train_batch_cost, total_samples = 0.0, 0.0, 0
            if (
                global_step > start_eval_step
                and (global_step - start_eval_step) % eval_batch_step == 0
                and rank == 0
            ):
                cur_metric = evaluate(model, valid_dataloader, post_process_class, eval_class)
                logger.info(
                    "cur metric, {}".format(", ".join([f"{k}: {v}" for k, v in cur_metric.items()]))
                )
                if vdl_writer is not None:
                    vdl_writer.add_scalar("EVAL/acc", cur_metric["acc"], global_step)
                improved = cur_metric[main_indicator] > best_model_dict[main_indicator]
                if cur_metric[main_indicator] >= best_model_dict[main_indicator]:
                    best_model_dict.update(cur_metric)
                    best_model_dict["best_epoch"] = epoch
                    save_model(
                        model,
                        optimizer,
                        save_model_dir,
                        logger,
                        is_best=True,
                        prefix="best_accuracy",
                        best_model_dict=best_model_dict,
                        epoch=epoch,
                        global_step=global_step,
                    )
                logger.info(
                    "best metric, {}".format(
                        ", ".join([f"{k}: {v}" for k, v in best_model_dict.items()])
                    )
                )
                bad_evals = 0 if improved else bad_evals + 1
                if patience and bad_evals >= patience:
                    logger.info(
                        f"{main_indicator} has not improved for {bad_evals} evaluations, stop training"
                    )
                    stop = True
            global_step += 1
            reader_start = time.time()
            if stop:
                break
        if rank == 0:
            save_model(
                model,
                optimizer,
                save_model_dir,
                logger,
                is_best=False,
                prefix="latest",
                best_model_dict=best_model_dict,
                epoch=epoch,
                global_step=global_step,
            )
        if rank == 0 and epoch > 0 and epoch % g["save_epoch_step"] == 0:
            save_model(
                model,
                optimizer,
                save_model_dir,
                logger,
                is_best=False,
                prefix=f"iter_epoch_{epoch}",
                best_model_dict=best_model_dict,
                epoch=epoch,
                global_step=global_step,
            )
        if stop:
            break
    logger.info(
        "best metric, {}".format(", ".join([f"{k}: {v}" for k, v in best_model_dict.items()]))
    )
    if rank == 0 and vdl_writer is not None:
        vdl_writer.close()


def build_post_process(config: dict[str, Any], global_config: dict[str, Any]) -> Any:
    params = {k: v for k, v in config.items() if k != "name"}
    if config["name"] == "CTCBeamSearchDecode":
        return CTCBeamSearchDecode(global_config["character_dict_path"], **params)
    return CTCLabelDecode(global_config["character_dict_path"], **params)


def preprocess(argv: list[str]) -> tuple[dict[str, Any], logging.Logger, LogWriter | None]:
    config_path, opts = ArgsParser.parse_args(argv)
    with open(config_path, "rb") as f:
        config = yaml.load(f, Loader=yaml.Loader)
    config = merge_config(config, opts)
    config["profiler_options"] = None
    g = config["Global"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if g["distributed"] and world > 1:
        dist.init_process_group(
            backend="gloo", timeout=datetime.timedelta(seconds=g["dist_timeout"])
        )
    logger = get_logger()
    print_dict(config, logger)
    logger.info("train with torch {} and device {}".format(torch.__version__, "cpu"))
    vdl_writer = None
    if g["use_visualdl"] and RANK == 0:
        vdl_writer = LogWriter(os.path.join(g["save_model_dir"], "vdl"), g["vdl_upload"])
    return config, logger, vdl_writer


def main(argv: list[str]) -> None:
    config, logger, vdl_writer = preprocess(argv)
    global_config = config["Global"]
    set_signal_handlers()
    if RANK == 0:
        files, digest = dataset_manifest(config["Train"]["dataset"]["data_dir"])
        logger.info(f"train set manifest: {files} files, md5 {digest}")
    probe = build_dataloader(config, "Train", logger, epoch=1)
    valid_dataloader = build_dataloader(config, "Eval", logger)
    if len(probe) == 0:
        logger.error("No Images in train dataset, please ensure ...")
        return
    logger.info(f"train dataloader has {len(probe)} iters")
    logger.info(f"valid dataloader has {len(valid_dataloader)} iters")
    post_process_class = build_post_process(config["PostProcess"], global_config)
    num_classes = len(post_process_class.character)
    model: nn.Module = BaseModel(config["Architecture"], num_classes)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    loss_class = CTCLoss()
    o = config["Optimizer"]
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=o["lr"]["learning_rate"],
        betas=(o["beta1"], o["beta2"]),
        weight_decay=o["regularizer"]["factor"],
    )
    metric = {k: v for k, v in config["Metric"].items() if k != "name"}
    eval_class = RecMetric(**metric)
    pre_best_model_dict = load_model(config, model, optimizer)
    train(
        config,
        valid_dataloader,
        model,
        loss_class,
        optimizer,
        post_process_class,
        eval_class,
        pre_best_model_dict,
        logger,
        vdl_writer,
    )


# ------------------------------------------------------------------ helpers of the capture
def pick(n: int, world: int, rank: int, epoch: int, step: int) -> int:
    """The sample key (1-based) that rank reads first in that step of the epoch."""
    sampler = DistributedBatchSampler(n, 16, rank, world, True, True)
    sampler.epoch = epoch
    return sampler.batches()[step][0] + 1


def save_old(root: Path) -> None:
    """An earlier run's output/rec/latest.pth: its first epoch, with an evaluation, saved by
    rank 0 of the same two-process DDP training (parameters under 'module.')."""
    config = yaml.load(CONFIG, Loader=yaml.Loader)
    os.chdir(root)
    post = CTCLabelDecode(config["Global"]["character_dict_path"])
    torch.manual_seed(5)
    model = nn.Module()
    model.module = BaseModel(config["Architecture"], len(post.character))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    metric = RecMetric()
    metric(([("3K-7Q", 0.5)], [("3K-7QA", 1.0)]))
    best = {"acc": 0, **metric.get_metric(), "fps": 412.7, "best_epoch": 1}
    logger = logging.getLogger("save-old")
    save_model(
        model, optimizer, "./output/rec/", logger, prefix="latest",
        best_model_dict=best, epoch=1, global_step=20,
    )  # fmt: skip


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["prepare"]:
        prepare(Path(sys.argv[2]))
    elif cmd == ["prepare-full"]:
        write_lmdb_like(Path(sys.argv[2]), int(sys.argv[3]), seed=3)
    elif cmd == ["prepare-bench"]:
        write_simple(Path(sys.argv[2]), "bench", "bench_list.txt", int(sys.argv[3]), seed=4)
    elif cmd == ["pick"]:
        print(pick(*(int(a) for a in sys.argv[2:7])))
    elif cmd == ["save-old"]:
        save_old(Path(sys.argv[2]))
    else:
        main(sys.argv[1:])
