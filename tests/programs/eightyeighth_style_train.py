"""An eighty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/eightyeighth-*): a text-recognition (OCR) trainer in the way of PaddleOCR's
tools/train.py and its torch ports (the CRNN/SVTR repos, MMOCR's older tools), re-implemented
in plain torch. One YAML config (configs/rec_tiny.yml) with Global / Optimizer / Architecture /
Loss / PostProcess / Metric / Train / Eval sections, overridden from the command line with
PaddleOCR's `-o Global.epoch_num=3 Train.loader.batch_size_per_card=16`; PaddleOCR's logger
('[%(asctime)s] ppocr %(levelname)s: %(message)s', rank 0 at INFO, the other ranks at ERROR)
and its messages (the dumped config, 'epoch: [1/3], global_step: 10, lr: ..., loss: ...,
avg_reader_cost: ... s, avg_batch_cost: ... s, avg_samples: 16.0, ips: ... samples/s, eta:
...', 'cur metric, acc: ..., norm_edit_dis: ...', 'best metric, ...', 'save model in ...');
SimpleDataSet's label files ('train/word_0001.pgm\\tlabel') whose unreadable lines are logged
('When parsing line ..., error happened with msg: ...') and replaced by a random other line;
crnn.pytorch's strLabelConverter over the character dictionary ppocr/utils/ppocr_keys.txt; a
tiny CRNN (conv + BN, a BiLSTM, CTC head) on synthetic 8x32 glyph images of short strings;
torch's CTCLoss (zero_infinity off) with a guard that skips a batch whose loss is not finite;
evaluation on rank 0 only (PaddleOCR's `dist.get_rank() == 0` evaluation) with a tqdm bar. Each
card reads its own slice of the label list (lines[rank::world]). gloo on CPU, a 15 s collective
timeout (Global.dist_timeout). Launched the old way:
`python -m torch.distributed.launch --nproc_per_node N --master_port PORT tools/train.py -c
configs/rec_tiny.yml -o ...` (the launcher passes --local-rank=K). `python tools/train.py
--prepare` writes the config, the dictionary and the data. A fault in the code is chosen by the
TQ_CASE environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_eightyeighth.sh after any edit).
"""

# ruff: noqa: B905, SIM115, SIM118, UP031, UP032 (PaddleOCR's own ways of writing, kept)
from __future__ import annotations

import ctypes
import datetime
import logging
import os
import random
import signal
import sys
import threading
import time
from argparse import ArgumentParser, RawDescriptionHelpFormatter
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"

CONFIG = """\
Global:
  use_gpu: false
  epoch_num: 6
  log_smooth_window: 20
  print_batch_step: 5
  save_model_dir: ./output/rec_tiny/
  save_epoch_step: 3
  eval_batch_step: [0, 20]
  cal_metric_during_train: true
  pretrained_model:
  checkpoints:
  character_dict_path: ppocr/utils/ppocr_keys.txt
  max_text_length: 25
  use_space_char: false
  seed: 2026
  dist_timeout: 15

Optimizer:
  name: Adam
  beta1: 0.9
  beta2: 0.999
  lr:
    name: Cosine
    learning_rate: 0.003
  regularizer:
    name: L2
    factor: 0.00001

Architecture:
  model_type: rec
  algorithm: CRNN
  Transform:
  Backbone:
    name: TinyConvNet
    channels: [16, 32, 48]
  Neck:
    name: SequenceEncoder
    encoder_type: rnn
    hidden_size: 32
  Head:
    name: CTCHead

Loss:
  name: CTCLoss

PostProcess:
  name: CTCLabelDecode

Metric:
  name: RecMetric
  main_indicator: acc

Train:
  dataset:
    name: SimpleDataSet
    data_dir: ./train_data/rec/
    label_file_list: [./train_data/rec/rec_gt_train.txt]
  loader:
    shuffle: true
    batch_size_per_card: 32
    drop_last: false
    num_workers: 1

Eval:
  dataset:
    name: SimpleDataSet
    data_dir: ./train_data/rec/
    label_file_list: [./train_data/rec/rec_gt_test.txt]
  loader:
    shuffle: false
    drop_last: false
    batch_size_per_card: 64
    num_workers: 1
"""


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ----------------------------------------------------------------------------- data preparation
def glyphs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(88)
    return {c: (rng.random((6, 4)) < 0.5).astype(np.float32) for c in CHARS}


def render(text: str, rng: np.random.Generator, table: dict[str, np.ndarray]) -> np.ndarray:
    img = np.zeros((8, 32), np.float32)
    x = int(rng.integers(0, 32 - 5 * len(text) + 1))
    for c in text:
        img[1:7, x : x + 4] = table[c]
        x += 5
    img = 0.8 * img + 0.2 * rng.random((8, 32))
    return (255 * img).clip(0, 255).astype(np.uint8)


def write_pgm(path: Path, img: np.ndarray) -> None:
    path.write_bytes(b"P5\n%d %d\n255\n" % (img.shape[1], img.shape[0]) + img.tobytes())


def read_pgm(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        raw = f.read()
    magic, size, _, pixels = raw.split(b"\n", 3)
    if magic != b"P5":
        raise ValueError(f"not a binary PGM: {path}")
    w, h = (int(v) for v in size.split())
    return np.frombuffer(pixels, np.uint8, count=w * h).reshape(h, w)


def make_split(root: Path, name: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = glyphs()
    (root / name).mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        text = "".join(rng.choice(list(CHARS), size=int(rng.integers(2, 6))))
        write_pgm(root / name / f"word_{i:05d}.pgm", render(text, rng, table))
        lines.append(f"{name}/word_{i:05d}.pgm\t{text}")
    (root / f"rec_gt_{name}.txt").write_text("\n".join(lines) + "\n")


def prepare(argv: list[str]) -> None:
    """--prepare [train=N] [test=N] [pretrained=CLASSES]: the config, dictionary and data."""
    opts = dict(a.split("=", 1) for a in argv)
    Path("configs").mkdir(exist_ok=True)
    Path("configs/rec_tiny.yml").write_text(CONFIG)
    Path("ppocr/utils").mkdir(parents=True, exist_ok=True)
    Path("ppocr/utils/ppocr_keys.txt").write_text("\n".join(CHARS) + "\n")
    root = Path("train_data/rec")
    if "train" in opts or not (root / "rec_gt_train.txt").exists():
        make_split(root, "train", int(opts.get("train", 640)), 1)
    if "test" in opts or not (root / "rec_gt_test.txt").exists():
        make_split(root, "test", int(opts.get("test", 128)), 2)
    if "pretrained" in opts:  # a model of the same recipe trained with another dictionary
        config = yaml.safe_load(CONFIG)
        model = build_model(config["Architecture"], int(opts["pretrained"]))
        Path("pretrain_models").mkdir(exist_ok=True)
        torch.save(model.state_dict(), "pretrain_models/rec_tiny_en_train.pth")


# ----------------------------------------------------------------------------- config and logging
class ArgsParser(ArgumentParser):
    def __init__(self, old: bool = False) -> None:
        super().__init__(formatter_class=RawDescriptionHelpFormatter)
        self.add_argument("-c", "--config", help="configuration file to use")
        self.add_argument("-o", "--opt", nargs="+", help="set configuration options")
        if old:
            self.add_argument("--local_rank", type=int, default=0)
        else:
            self.add_argument("--local_rank", "--local-rank", type=int, default=0)

    def parse_args(self, argv=None):  # type: ignore[override]
        args = super().parse_args(argv)
        assert args.config is not None, "Please specify --config=configure_file_path."
        args.opt = self._parse_opt(args.opt)
        return args

    @staticmethod
    def _parse_opt(opts: list[str] | None) -> dict:
        config = {}
        for s in opts or []:
            s = s.strip()
            k, v = s.split("=", 1)
            config[k] = yaml.load(v, Loader=yaml.Loader)
        return config


def merge_config(config: dict, opts: dict) -> dict:
    for key, value in opts.items():
        if "." not in key:
            if isinstance(value, dict) and key in config:
                config[key].update(value)
            else:
                config[key] = value
        else:
            sub_keys = key.split(".")
            assert sub_keys[0] in config, (
                f"the sub_keys can only be one of global_config: {config.keys()}, but get: "
                f"{sub_keys[0]}, please check your running command"
            )
            cur = config[sub_keys[0]]
            for idx, sub_key in enumerate(sub_keys[1:]):
                if idx == len(sub_keys) - 2:
                    cur[sub_key] = value
                else:
                    cur = cur[sub_key]
    return config


def get_logger(rank: int) -> logging.Logger:
    logger = logging.getLogger("ppocr")
    formatter = logging.Formatter(
        "[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%Y/%m/%d %H:%M:%S"
    )
    handler = logging.StreamHandler(stream=sys.stdout)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    logger.propagate = False
    return logger


def print_dict(d: dict, logger: logging.Logger, delimiter: int = 0) -> None:
    for k, v in sorted(d.items()):
        if isinstance(v, dict):
            logger.info("{}{} : ".format(delimiter * " ", str(k)))
            print_dict(v, logger, delimiter + 4)
        else:
            logger.info("{}{} : {}".format(delimiter * " ", k, v))


# ----------------------------------------------------------------------------- data
class SimpleDataSet(Dataset):
    def __init__(self, config: dict, mode: str, logger: logging.Logger, rank: int, world: int):
        dataset = config[mode]["dataset"]
        self.logger = logger
        self.data_dir = dataset["data_dir"]
        self.max_text_len = config["Global"]["max_text_length"]
        label_file_list = dataset["label_file_list"]
        logger.info("Initialize indexs of datasets:%s" % label_file_list)
        lines: list[str] = []
        for file in label_file_list:
            with open(file, "rb") as f:
                lines.extend(line.decode("utf-8").rstrip("\n") for line in f if line.strip())
        # each card reads its own slice of the label list
        self.data_lines = lines[rank::world] if mode == "Train" else lines
        self.rank = rank
        self.epoch = 0
        self.letter, self.who = fault()

    def __len__(self) -> int:
        return len(self.data_lines)

    def __getitem__(self, idx: int):
        data_line = self.data_lines[idx]
        if self.letter == "k" and self.rank == self.who and self.epoch == 2 and idx % 7 == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer picks this worker
        try:
            file_name, label = data_line.split("\t")
            img = read_pgm(os.path.join(self.data_dir, file_name))
            if len(label) == 0 or len(label) > self.max_text_len:
                outs = None
            else:
                image = torch.from_numpy(img.astype(np.float32) / 127.5 - 1.0)[None]
                outs = (image, label)
        except Exception:
            import traceback

            self.logger.error(
                "When parsing line {}, error happened with msg: {}".format(
                    data_line, traceback.format_exc()
                )
            )
            outs = None
        if outs is None:
            rnd_idx = np.random.randint(self.__len__())
            return self.__getitem__(rnd_idx)
        return outs


def collate(batch):
    images, labels = zip(*batch)
    return torch.stack(images), list(labels)


class strLabelConverter:  # crnn.pytorch's name
    """Convert between str and label (index 0 is the CTC blank)."""

    def __init__(self, alphabet: list[str]) -> None:
        self.alphabet = alphabet
        self.dict = {char: i + 1 for i, char in enumerate(alphabet)}

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        length = [len(s) for s in texts]
        text = [self.dict[char] for s in texts for char in s]
        return torch.IntTensor(text), torch.IntTensor(length)

    def decode(self, preds: torch.Tensor) -> list[str]:
        out = []
        for seq in preds.argmax(2).tolist():
            chars, prev = [], 0
            for i in seq:
                if i != 0 and i != prev:
                    chars.append(self.alphabet[i - 1])
                prev = i
            out.append("".join(chars))
        return out


def load_dict(config: dict) -> list[str]:
    path = config["Global"]["character_dict_path"]
    with open(path, "rb") as fin:
        chars = [line.decode("utf-8").strip("\n").strip("\r\n") for line in fin]
    if config["Global"]["use_space_char"]:
        chars.append(" ")
    return chars


# ----------------------------------------------------------------------------- model
class TinyConvNet(nn.Module):
    def __init__(self, channels: list[int]) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.conv1 = nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU())
        self.conv2 = nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU())
        self.conv3 = nn.Sequential(nn.Conv2d(c2, c3, 3, padding=1), nn.BatchNorm2d(c3), nn.ReLU())
        self.out_channels = c3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv1(x), (2, 1))  # 8x32 -> 4x32
        x = F.max_pool2d(self.conv2(x), (2, 2))  # -> 2x16
        return self.conv3(x).mean(2)  # N, C, 16


class SequenceEncoder(nn.Module):
    def __init__(self, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(in_channels, hidden_size, bidirectional=True, batch_first=True)
        self.out_channels = 2 * hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x.transpose(1, 2))[0]


class CRNN(nn.Module):
    def __init__(self, arch: dict, out_channels: int) -> None:
        super().__init__()
        self.backbone = TinyConvNet(arch["Backbone"]["channels"])
        self.neck = SequenceEncoder(self.backbone.out_channels, arch["Neck"]["hidden_size"])
        self.head = nn.Linear(self.neck.out_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))  # N, T, C


def build_model(arch: dict, out_channels: int) -> CRNN:
    return CRNN(arch, out_channels)


def load_pretrained_params(model: nn.Module, path: str, logger: logging.Logger) -> None:
    params = torch.load(path if path.endswith(".pth") else path + ".pth")
    state_dict = model.state_dict()
    new_state_dict = {}
    for k1 in params.keys():
        if k1 not in state_dict.keys():
            logger.warning("The pretrained params {} not in model".format(k1))
        elif list(state_dict[k1].shape) == list(params[k1].shape):
            new_state_dict[k1] = params[k1]
        else:
            logger.warning(
                "The shape of model params {} {} not matched with loaded params {} {} !".format(
                    k1, list(state_dict[k1].shape), k1, list(params[k1].shape)
                )
            )
    model.load_state_dict(new_state_dict, strict=False)
    logger.info("load pretrain successful from {}".format(path))


# ----------------------------------------------------------------------------- metric and eval
def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


class RecMetric:
    def __init__(self, main_indicator: str = "acc") -> None:
        self.main_indicator = main_indicator
        self.reset()

    def __call__(self, preds: list[str], labels: list[str]) -> dict:
        correct, norm = 0, 0.0
        for p, t in zip(preds, labels):
            norm += edit_distance(p, t) / max(len(p), len(t), 1)
            correct += p == t
        self.correct_num += correct
        self.all_num += len(labels)
        self.norm_edit_dis += norm
        return {
            "acc": correct / max(len(labels), 1),
            "norm_edit_dis": 1 - norm / max(len(labels), 1),
        }

    def get_metric(self) -> dict:
        acc = 1.0 * self.correct_num / (self.all_num + 1e-5)
        norm_edit_dis = 1 - self.norm_edit_dis / (self.all_num + 1e-5)
        self.reset()
        return {"acc": acc, "norm_edit_dis": norm_edit_dis}

    def reset(self) -> None:
        self.correct_num, self.all_num, self.norm_edit_dis = 0, 0, 0.0


def evaluate(model: nn.Module, loader: DataLoader, converter, eval_class: RecMetric) -> dict:
    model.eval()
    with torch.no_grad():
        total_frame, total_time = 0.0, 0.0
        pbar = tqdm(total=len(loader), desc="eval model:", position=0, leave=True)
        for images, labels in loader:
            start = time.time()
            preds = converter.decode(model(images))
            total_time += time.time() - start
            eval_class(preds, labels)
            pbar.update(1)
            total_frame += len(images)
        metric = eval_class.get_metric()
    pbar.close()
    model.train()
    metric["fps"] = total_frame / max(total_time, 1e-6)
    return metric


def save_model(model: nn.Module, optimizer, model_path: str, logger, prefix: str, **kwargs):
    os.makedirs(model_path, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(model_path, prefix + ".pdparams"))
    torch.save(optimizer.state_dict(), os.path.join(model_path, prefix + ".pdopt"))
    torch.save(kwargs, os.path.join(model_path, prefix + ".states"))
    if prefix == "best_accuracy":
        logger.info("save best model is to {}".format(os.path.join(model_path, prefix)))
    else:
        logger.info("save model in {}".format(os.path.join(model_path, prefix)))


# ----------------------------------------------------------------------------- training
def main() -> None:
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2:])
        return
    letter, who = fault()
    args = ArgsParser(old=letter == "a").parse_args()
    config = yaml.load(open(args.config, "rb"), Loader=yaml.Loader)
    config = merge_config(config, args.opt)
    global_config = config["Global"]

    dist.init_process_group(
        backend="gloo", timeout=datetime.timedelta(seconds=global_config["dist_timeout"])
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = get_logger(rank)
    print_dict(config, logger)
    logger.info("train with torch {} and device cpu".format(torch.__version__))

    seed = global_config["seed"]
    random.seed(seed)
    np.random.seed(seed + rank)
    torch.manual_seed(seed)

    train_dataset = SimpleDataSet(config, "Train", logger, rank, world)
    train_loader = DataLoader(
        train_dataset,
        batch_size=config["Train"]["loader"]["batch_size_per_card"],
        shuffle=config["Train"]["loader"]["shuffle"],
        drop_last=config["Train"]["loader"]["drop_last"],
        num_workers=config["Train"]["loader"]["num_workers"],
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed + rank),
    )
    valid_dataset = SimpleDataSet(config, "Eval", logger, rank, world)
    valid_loader = DataLoader(
        valid_dataset,
        batch_size=config["Eval"]["loader"]["batch_size_per_card"],
        shuffle=False,
        num_workers=config["Eval"]["loader"]["num_workers"],
        collate_fn=collate,
    )
    logger.info("train dataloader has {} iters".format(len(train_loader)))
    logger.info("valid dataloader has {} iters".format(len(valid_loader)))

    character = load_dict(config)
    converter = strLabelConverter(character)
    model = build_model(config["Architecture"], len(character) + 1)
    if global_config.get("pretrained_model"):
        load_pretrained_params(model, global_config["pretrained_model"], logger)
    model = DDP(model)
    ctc = nn.CTCLoss(blank=0, reduction="mean", zero_infinity=False)
    opt_cfg = config["Optimizer"]
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=opt_cfg["lr"]["learning_rate"],
        betas=(opt_cfg["beta1"], opt_cfg["beta2"]),
        weight_decay=opt_cfg["regularizer"]["factor"],
    )
    epoch_num = global_config["epoch_num"]
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=epoch_num * len(train_loader)
    )
    eval_class = RecMetric(**{k: v for k, v in config["Metric"].items() if k != "name"})
    train_metric = RecMetric()

    start_eval_step, eval_batch_step = global_config["eval_batch_step"]
    print_batch_step = global_config["print_batch_step"]
    save_model_dir = global_config["save_model_dir"]
    main_indicator = eval_class.main_indicator
    best_model_dict = {main_indicator: 0}
    logger.info(
        "During the training process, after the {}th iteration, an evaluation is run every {} "
        "iterations".format(start_eval_step, eval_batch_step)
    )

    global_step = 0
    total_samples, train_reader_cost, train_batch_cost = 0, 0.0, 0.0
    cache: dict[int, torch.Tensor] = {}
    cache_lock = threading.Lock()
    model.train()
    for epoch in range(1, epoch_num + 1):
        train_dataset.epoch = epoch
        reader_start = time.time()
        max_iter = len(train_loader)
        for idx, (images, labels) in enumerate(train_loader):
            train_reader_cost += time.time() - reader_start
            if letter == "w" and rank == who and epoch == 2 and idx == 2:
                with cache_lock:  # the glyph-width cache, then its getter takes the lock again
                    cache_lock.acquire()
            if letter == "m" and rank == who and epoch == 2:
                cache[idx] = torch.ones(16 << 20)  # decoded images kept, 64 MiB a step
                if len(cache) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if letter == "n" and rank == who and epoch == 2 and idx == 3:
                ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"resize"), 6)
            targets, target_lengths = converter.encode(labels)
            preds = model(images)
            log_probs = preds.log_softmax(2).permute(1, 0, 2)
            input_lengths = torch.full((images.shape[0],), log_probs.shape[0], dtype=torch.int32)
            loss = ctc(log_probs, targets, input_lengths, target_lengths)
            if not torch.isfinite(loss):
                logger.warning(
                    "loss is {} at global_step {}, skip this batch".format(loss.item(), global_step)
                )
                optimizer.zero_grad()
                continue
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            global_step += 1
            train_batch_cost += time.time() - reader_start
            total_samples += len(images)
            if global_config["cal_metric_during_train"]:
                metric = train_metric(converter.decode(preds.detach()), labels)
            if rank == 0 and (
                (global_step > 0 and global_step % print_batch_step == 0) or idx >= max_iter - 1
            ):
                loss_value = loss.detach().clone()
                if letter == "r":
                    dist.all_reduce(loss_value)  # the mean loss over the cards, for the log
                    loss_value /= world
                eta_sec = (
                    ((epoch_num + 1 - epoch) * max_iter - idx - 1)
                    * train_batch_cost
                    / max(total_samples / len(images), 1)
                )
                logger.info(
                    "epoch: [{}/{}], global_step: {}, lr: {:.6f}, acc: {:.6f}, "
                    "norm_edit_dis: {:.6f}, loss: {:.6f}, avg_reader_cost: {:.5f} s, "
                    "avg_batch_cost: {:.5f} s, avg_samples: {}, ips: {:.5f} samples/s, "
                    "eta: {}".format(
                        epoch,
                        epoch_num,
                        global_step,
                        scheduler.get_last_lr()[0],
                        metric["acc"],
                        metric["norm_edit_dis"],
                        loss_value.item(),
                        train_reader_cost / print_batch_step,
                        train_batch_cost / print_batch_step,
                        total_samples / print_batch_step,
                        total_samples / max(train_batch_cost, 1e-6),
                        str(datetime.timedelta(seconds=int(eta_sec))),
                    )
                )
                total_samples, train_reader_cost, train_batch_cost = 0, 0.0, 0.0
            if (
                global_step > start_eval_step
                and (global_step - start_eval_step) % eval_batch_step == 0
                and rank == 0
            ):
                cur_metric = evaluate(model.module, valid_loader, converter, eval_class)
                cur_metric_str = "cur metric, {}".format(
                    ", ".join(["{}: {}".format(k, v) for k, v in cur_metric.items()])
                )
                logger.info(cur_metric_str)
                if cur_metric[main_indicator] >= best_model_dict[main_indicator]:
                    best_model_dict.update(cur_metric)
                    best_model_dict["best_epoch"] = epoch
                    save_model(
                        model.module,
                        optimizer,
                        save_model_dir,
                        logger,
                        prefix="best_accuracy",
                        best_model_dict=best_model_dict,
                        epoch=epoch,
                        global_step=global_step,
                    )
                best_str = "best metric, {}".format(
                    ", ".join(["{}: {}".format(k, v) for k, v in best_model_dict.items()])
                )
                logger.info(best_str)
            reader_start = time.time()
        if rank == 0:
            save_model(
                model.module,
                optimizer,
                save_model_dir,
                logger,
                prefix="latest",
                best_model_dict=best_model_dict,
                epoch=epoch,
                global_step=global_step,
            )
            if epoch > 0 and epoch % global_config["save_epoch_step"] == 0:
                save_model(
                    model.module,
                    optimizer,
                    save_model_dir,
                    logger,
                    prefix="iter_epoch_{}".format(epoch),
                    best_model_dict=best_model_dict,
                    epoch=epoch,
                    global_step=global_step,
                )
    best_str = "best metric, {}".format(
        ", ".join(["{}: {}".format(k, v) for k, v in best_model_dict.items()])
    )
    logger.info(best_str)


if __name__ == "__main__":
    main()
