"""A hundred-and-forty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyfourth-*): recommender training the way RUCAIBox/RecBole trains
it, re-created in plain torch and numpy in one module without RecBole, pandas, colorlog, tqdm,
texttable or PyYAML installed. Each run's folder links this file as run_recbole.py and starts it
as RecBole's README does: `python run_recbole.py --model=BPR --dataset=ml-100k --nproc=2
--port=P` (one node), `... --nproc=2 --world_size=4 --group_offset=0|2 --ip=127.0.0.1 --port=P`
on each of two nodes, or, as a fork that supports it, under torchrun.

As there: run_recbole.py parses --model/--dataset/--config_files/--nproc/--ip/--port/
--world_size/--group_offset with parse_known_args and calls quick_start.run(), which, for
nproc > 1 or world_size > 0, puts world_size, ip, port, nproc and offset into the config dict
and starts run_recboles with torch.multiprocessing.spawn (a spawn-context SimpleQueue in its
kwargs for rank 0's result); each process builds a Config (defaults, `--key=value` flags read
from sys.argv, and "command line args [...] will not be used in RecBole" for any other argument),
whose _init_device calls init_process_group(tcp://ip:port, rank = local_rank + offset; gloo on
CPU here with a 15 s timeout, where RecBole has nccl) and sets state to "error" and show_progress
to False for every process whose local rank is not 0; init_seed; init_logger (colorlog-style
console lines '07 Dec 05:00    INFO  ...' with ANSI colours and a file log/BPR/BPR-ml-100k-
<time>-<md5>.log); sys.argv and the config ('General Hyper Parameters:', 'Training Hyper
Parameters:', ...) logged; create_dataset: the atomic files dataset/ml-100k/ml-100k.inter/.user/
.item (if the folder is missing, local rank 0 "downloads" the data set, synthesised here in its
place, and every process waits in a barrier), remapped tokens and the dataset statistics;
data_preparation (RS 0.8/0.1/0.1 by user, '[Training]: ...' and '[Evaluation]: ...'); BPR (user
and item embeddings, BPRLoss) and 'FLOPs: ...'; the Trainer with SyncBatchNorm conversion and
DDP, RecBole's set_reduce_hook and sync_grad_loss every step; a DistributedSampler over the
training interactions (batch divided by world_size) with uniform negative sampling; a tqdm bar
'Train     0: 100%|...' and 'Evaluate   : 100%|...' on local rank 0 (ncols=100); 'epoch 0
training [time: 0.51s, train loss: 21.4527]', 'epoch 0 evaluating [time: 0.80s, valid_score:
0.051200]', 'valid result: ' and 'recall@10 : ...    mrr@10 : ...', full-sort evaluation whose
metrics are all_gathered (_map_reduce), 'Saving current: saved/BPR-Dec-07-2026_05-00-00.pth'
(local rank 0 only), early stopping after stopping_step evaluations without improvement
('Finished training, best eval result in epoch 3'), the test evaluation with the best model
('Loading model structure and parameters from ...'), the running-environment table, 'best valid
: {...}', 'test result: {...}', destroy_process_group and queue.put(result) on local rank 0.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyfourth.sh after any edit).
`python run_recbole.py --generate DIR` writes the synthetic ml-100k atomic files into DIR.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import logging
import os
import random
import re
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator, MutableMapping
from datetime import timedelta
from typing import Any

import numpy as np
import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

CASE = os.environ.get("MT_CASE", "")
RANK = [-1]  # this process's global rank, once the process group exists
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int | None = None) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == (RANK[0] if rank is None else rank)


# ------------------------------------------------------------------ recbole.utils
COLOURS = ["black", "red", "green", "yellow", "blue", "pink", "cyan", "white"]


def set_color(log: str, color: str, highlight: bool = True) -> str:
    index = COLOURS.index(color) if color in COLOURS else len(COLOURS) - 1
    return f"\033[{'1' if highlight else '0'};3{index}m{log}\033[0m"


def get_local_time(when: float | None = None) -> str:
    return datetime.datetime.fromtimestamp(when or time.time()).strftime("%b-%d-%Y_%H-%M-%S")


def ensure_dir(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def dict2str(result: dict[str, float]) -> str:
    return "    ".join(f"{k} : {v}" for k, v in result.items())


def init_seed(seed: int, reproducibility: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = not reproducibility


def early_stopping(
    value: float, best: float, cur_step: int, max_step: int
) -> tuple[float, int, bool, bool]:
    if value >= best:
        return value, 0, False, True
    cur_step += 1
    return best, cur_step, cur_step > max_step, False


class ColoredFormatter(logging.Formatter):
    """colorlog's ColoredFormatter: a colour per level, a reset after the message."""

    LEVELS = {"DEBUG": "\033[36m", "WARNING": "\033[33m", "ERROR": "\033[31m"}

    def format(self, record: logging.LogRecord) -> str:
        record.log_color = self.LEVELS.get(record.levelname, "")
        text = super().format(record)
        return text if text.endswith("\033[0m") else text + "\033[0m"


class RemoveColorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = re.sub(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])", "", str(record.msg))
        return True


def init_logger(config: Config) -> None:
    ensure_dir(os.path.join("log", config["model"]))
    md5 = hashlib.md5("".join(str(v) for v in config.final.values()).encode()).hexdigest()[:6]
    name = f"{config['model']}-{config['dataset']}-{get_local_time()}-{md5}.log"
    level = getattr(logging, str(config["state"]).upper(), logging.INFO)
    fh = logging.FileHandler(os.path.join("log", config["model"], name))
    fh.setLevel(level)
    fh.setFormatter(
        logging.Formatter("%(asctime)-15s %(levelname)s  %(message)s", "%a %d %b %Y %H:%M:%S")
    )
    fh.addFilter(RemoveColorFilter())
    sh = logging.StreamHandler()
    sh.setLevel(level)
    sh.setFormatter(
        ColoredFormatter("%(log_color)s%(asctime)-15s %(levelname)s  %(message)s", "%d %b %H:%M")
    )
    logging.basicConfig(level=level, handlers=[sh, fh])


class tqdm:
    """tqdm's default bar with ncols=100, on stderr, redrawn at most every 0.1 s."""

    def __init__(self, items: Iterable[Any], total: int, ncols: int, desc: str) -> None:
        self.items, self.total, self.ncols, self.desc = items, total, ncols, desc
        self.t0 = self.last = time.time()
        self.n = 0
        self.draw()

    @staticmethod
    def clock(s: float) -> str:
        return f"{int(s) // 60:02d}:{int(s) % 60:02d}"

    def draw(self) -> None:
        el = time.time() - self.t0
        if self.n:
            rate = self.n / el if el > 0 else 0.0
            rate_s = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
            left = self.clock((self.total - self.n) / rate) if rate else "?"
        else:
            rate_s, left = "?it/s", "?"
        pct = 100 * self.n / self.total if self.total else 100
        plain_desc = re.sub(r"\x1b\[[0-9;]*m", "", self.desc)
        l_bar = f": {pct:3.0f}%|"
        r_bar = f"| {self.n}/{self.total} [{self.clock(el)}<{left}, {rate_s}]"
        width = max(self.ncols - len(plain_desc) - len(l_bar) - len(r_bar), 1)
        eighths = int(width * 8 * self.n / self.total) if self.total else width * 8
        full, part = divmod(eighths, 8)
        bar = "█" * full + (" ▏▎▍▌▋▊▉"[part] if full < width else "")
        sys.stderr.write(f"\r{self.desc}{l_bar}{bar.ljust(width)}{r_bar}")
        sys.stderr.flush()
        self.last = time.time()

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            yield item
            self.n += 1
            if time.time() - self.last >= 0.1 or self.n == self.total:
                self.draw()
        sys.stderr.write("\n")
        sys.stderr.flush()


def get_environment() -> str:
    """The texttable of RecBole's get_environment."""
    rss = psutil.Process(os.getpid()).memory_info().rss / 1024**3
    total = psutil.virtual_memory()[0] / 1024**3
    rows = [
        ("Environment", "Usage"),
        ("CPU", f"{psutil.cpu_percent(interval=1):.2f} %"),
        ("GPU", "0.0 / 0.0"),
        ("Memory", f"{rss:.2f} G/{total:.2f} G"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    line = f"+{'-' * (w0 + 2)}+{'-' * (w1 + 2)}+"
    out = [line]
    for i, (a, b) in enumerate(rows):
        out.append(f"| {a.ljust(w0)} | {b.center(w1)} |")
        out.append(line.replace("-", "=") if i == 0 else line)
    return "\n".join(out)


# ------------------------------------------------------------------ recbole.config
GENERAL = {
    "gpu_id": "",
    "use_gpu": False,
    "seed": 2020,
    "state": "INFO",
    "reproducibility": True,
    "data_path": "dataset/",
    "checkpoint_dir": "saved",
    "show_progress": True,
    "save_dataset": False,
    "dataset_save_path": None,
    "save_dataloaders": False,
    "dataloaders_save_path": None,
    "log_wandb": False,
}
TRAINING = {
    "epochs": 300,
    "train_batch_size": 2048,
    "learner": "adam",
    "learning_rate": 0.001,
    "train_neg_sample_args": {
        "distribution": "uniform",
        "sample_num": 1,
        "alpha": 1.0,
        "dynamic": False,
        "candidate_num": 0,
    },
    "eval_step": 1,
    "stopping_step": 10,
    "clip_grad_norm": None,
    "weight_decay": 0.0,
    "loss_decimal_place": 4,
}
EVALUATION = {
    "eval_args": {
        "split": {"RS": [0.8, 0.1, 0.1]},
        "order": "RO",
        "group_by": "user",
        "mode": {"valid": "full", "test": "full"},
    },
    "repeatable": False,
    "metrics": ["Recall", "MRR", "NDCG", "Hit", "Precision"],
    "topk": [10],
    "valid_metric": "MRR@10",
    "valid_metric_bigger": True,
    "eval_batch_size": 4096,
    "metric_decimal_place": 4,
}
DATASET = {
    "field_separator": "\t",
    "seq_separator": " ",
    "USER_ID_FIELD": "user_id",
    "ITEM_ID_FIELD": "item_id",
    "RATING_FIELD": "rating",
    "TIME_FIELD": "timestamp",
    "seq_len": None,
    "LABEL_FIELD": "label",
    "threshold": None,
    "NEG_PREFIX": "neg_",
    "load_col": {"inter": ["user_id", "item_id", "rating", "timestamp"]},
    "unload_col": None,
    "unused_col": None,
    "additional_feat_suffix": None,
    "rm_dup_inter": None,
    "val_interval": None,
    "filter_inter_by_user_or_item": True,
    "user_inter_num_interval": "[0,inf)",
    "item_inter_num_interval": "[0,inf)",
    "alias_of_user_id": None,
    "alias_of_item_id": None,
    "preload_weight": None,
    "normalize_field": None,
    "normalize_all": None,
    "benchmark_filename": None,
}
OTHER = {
    "worker": 0,
    "wandb_project": "recbole",
    "shuffle": True,
    "require_pow": False,
    "enable_amp": False,
    "enable_scaler": False,
    "transform": None,
    "embedding_size": 64,
    "numerical_features": [],
    "discretization": None,
    "MODEL_TYPE": "ModelType.GENERAL",
}


class Config:
    def __init__(self, model: str, dataset: str, config_dict: dict[str, Any] | None) -> None:
        self.parameters = {
            "General": list(GENERAL),
            "Training": list(TRAINING),
            "Evaluation": list(EVALUATION),
            "Dataset": list(DATASET),
        }
        final: dict[str, Any] = {}
        for part in (GENERAL, TRAINING, EVALUATION, DATASET, OTHER):
            final.update(part)
        final.update(self._convert(dict(config_dict or {})))
        final.update(self._load_cmd_line())
        final["model"], final["dataset"] = model, dataset
        final["data_path"] = os.path.join(final["data_path"], dataset)
        self.final = final
        self._init_device()
        final["MODEL_INPUT_TYPE"] = "InputType.PAIRWISE"
        final["eval_type"] = "EvaluatorType.RANKING"
        final["valid_neg_sample_args"] = {"distribution": "uniform", "sample_num": "none"}
        final["test_neg_sample_args"] = {"distribution": "uniform", "sample_num": "none"}

    @staticmethod
    def _convert(d: dict[str, Any]) -> dict[str, Any]:
        for k, v in d.items():
            if not isinstance(v, str):
                continue
            try:
                value = eval(v)  # as RecBole reads its flags
                if value is not None and not isinstance(
                    value, str | int | float | list | tuple | dict | bool
                ):
                    value = v
            except (NameError, SyntaxError, TypeError):
                value = {"true": True, "false": False}.get(v.lower(), v)
            d[k] = value
        return d

    def _load_cmd_line(self) -> dict[str, Any]:
        cmd: dict[str, Any] = {}
        unrecognized = []
        for arg in sys.argv[1:]:
            if not arg.startswith("--") or len(arg[2:].split("=")) != 2:
                unrecognized.append(arg)
                continue
            name, value = arg[2:].split("=")
            if name in cmd and value != cmd[name]:
                raise SyntaxError(f"There are duplicate commend arg '{arg}' with different value.")
            cmd[name] = value
        if unrecognized:
            logging.getLogger().warning(
                "command line args [{}] will not be used in RecBole".format(" ".join(unrecognized))
            )
        return self._convert(cmd)

    def _init_device(self) -> None:
        c = self.final
        if "local_rank" not in c:
            c["single_spec"], c["local_rank"], c["device"] = True, 0, torch.device("cpu")
            return
        dist.init_process_group(
            backend="gloo",
            rank=c["local_rank"] + c["offset"],
            world_size=c["world_size"],
            init_method="tcp://" + str(c["ip"]) + ":" + str(c["port"]),
            timeout=timedelta(seconds=15),
        )
        RANK[0] = dist.get_rank()
        c["device"] = torch.device("cpu")
        c["single_spec"] = False
        if c["local_rank"] != 0:
            c["state"] = "error"
            c["show_progress"] = False
            c["verbose"] = False

    def __getitem__(self, key: str) -> Any:
        return self.final.get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.final[key] = value

    def __str__(self) -> str:
        info = "\n"
        for category, names in self.parameters.items():
            info += set_color(category + " Hyper Parameters:\n", "pink")
            info += "\n".join(
                (set_color("{}", "cyan") + " =" + set_color(" {}", "yellow")).format(k, v)
                for k, v in self.final.items()
                if k in names
            )
            info += "\n\n"
        info += set_color("Other Hyper Parameters: \n", "pink")
        shown = {n for names in self.parameters.values() for n in names}
        info += "\n".join(
            (set_color("{}", "cyan") + " = " + set_color("{}", "yellow")).format(k, v)
            for k, v in self.final.items()
            if k not in shown | {"model", "dataset", "config_files"}
        )
        return info + "\n\n"


# ------------------------------------------------------------------ recbole.data
URL = "https://recbole.s3-accelerate.amazonaws.com/ProcessedDatasets/MovieLens/ml-100k.zip"
OCCUPATIONS = ["student", "engineer", "educator", "programmer", "writer", "artist", "other"]


def generate(folder: str, name: str = "ml-100k") -> None:
    """The atomic files of a MovieLens-like data set (943 users, 1682 items), made up."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(100)
    n_users, n_items, n_groups = 943, 1682, 12
    item_group = rng.integers(0, n_groups, n_items)
    popularity = rng.zipf(1.6, n_items).clip(1, 400).astype(float)
    with open(os.path.join(folder, f"{name}.inter"), "w", encoding="utf-8") as f:
        f.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
        for u in rng.permutation(n_users):
            g = u % n_groups
            n = 12 + int(rng.geometric(0.06))
            w = popularity * np.where(item_group == g, 12.0, 1.0)
            items = rng.choice(n_items, size=min(n, 300), replace=False, p=w / w.sum())
            t = 874724710 + int(rng.integers(0, 10**7))
            for i in items:
                t += int(rng.integers(1, 5000))
                f.write(f"{u + 1}\t{i + 1}\t{int(rng.integers(1, 6))}\t{t}\n")
    with open(os.path.join(folder, f"{name}.user"), "w", encoding="utf-8") as f:
        f.write("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n")
        for u in range(n_users):
            occ = OCCUPATIONS[int(rng.integers(0, len(OCCUPATIONS)))]
            sex = "MF"[int(rng.integers(0, 2))]
            f.write(
                f"{u + 1}\t{int(rng.integers(16, 70))}\t{sex}\t{occ}\t{int(rng.integers(10000, 99999))}\n"
            )
    with open(os.path.join(folder, f"{name}.item"), "w", encoding="utf-8") as f:
        f.write("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n")
        for i in range(n_items):
            f.write(
                f"{i + 1}\tMovie {i + 1}\t{1930 + int(rng.integers(0, 68))}\tGenre{item_group[i]}\n"
            )


class Interaction:
    def __init__(self, fields: dict[str, torch.Tensor]) -> None:
        self.interaction = fields

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.interaction[key]

    def __len__(self) -> int:
        return len(next(iter(self.interaction.values())))

    def to(self, device: torch.device) -> Interaction:
        return Interaction({k: v.to(device) for k, v in self.interaction.items()})


class Dataset:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.logger = logging.getLogger()
        self.dataset_name = config["dataset"]
        self.dataset_path = config["data_path"]
        self.uid_field, self.iid_field = config["USER_ID_FIELD"], config["ITEM_ID_FIELD"]
        self.logger.debug(set_color(f"Loading {self.__class__} from scratch.", "green"))
        if not os.path.exists(self.dataset_path):
            self._download()
        feat = self._load_feat(os.path.join(self.dataset_path, f"{self.dataset_name}.inter"))
        self.field2type = {f: t for f, (t, _) in feat.items()}
        users, self.user_token = self._remap(feat[self.uid_field][1])
        items, self.item_token = self._remap(feat[self.iid_field][1])
        self.users, self.items = np.array(users), np.array(items)
        self.user_num, self.item_num = len(self.user_token), len(self.item_token)
        self.inter_num = len(self.users)

    def _download(self) -> None:
        # RecBole fetches the zip on local rank 0 while the others wait in a barrier; the
        # capture machine has no network: the same atomic files are synthesised into the zip
        if self.config["local_rank"] == 0:
            self.logger.info(f"Prepare to download dataset [{self.dataset_name}] from [{URL}].")
            ensure_dir(self.dataset_path)
            self.logger.info(f"Downloading {URL}")
            staging = os.path.join(self.dataset_path, ".staging")
            generate(staging, "ml-100k")
            path = os.path.join(self.dataset_path, "ml-100k.zip")
            with zipfile.ZipFile(path, "w") as z:
                for f in sorted(os.listdir(staging)):
                    z.write(os.path.join(staging, f), f)
                    os.unlink(os.path.join(staging, f))
            os.rmdir(staging)
            for _ in tqdm(range(3), total=3, ncols=100, desc="Downloaded 0.00 GB"):
                time.sleep(0.05)
            self.logger.info(f"Extracting {path}")
            with zipfile.ZipFile(path) as z:
                z.extractall(self.dataset_path)
            os.unlink(path)
            self.logger.info("Downloading done.")
            dist.barrier()
        else:
            dist.barrier()

    def _load_feat(self, filepath: str) -> dict[str, tuple[str, list[str]]]:
        self.logger.debug(
            set_color(f"Loading feature from [{filepath}] (source: [inter]).", "green")
        )
        sep = self.config["field_separator"]
        with open(filepath, encoding="utf-8") as f:
            head = f.readline()[:-1]
            fields = []
            for field_type in head.split(sep):
                field, ftype = field_type.split(":")
                if ftype not in ("token", "float", "token_seq", "float_seq"):
                    raise ValueError(f"Type {ftype} from field {field} is not supported.")
                fields.append((field, ftype))
            columns: list[list[str]] = [[] for _ in fields]
            for line in f:
                for col, value in zip(columns, line.rstrip("\n").split(sep), strict=False):
                    col.append(value)
        return {field: (ftype, col) for (field, ftype), col in zip(fields, columns, strict=True)}

    @staticmethod
    def _remap(tokens: list[str]) -> tuple[list[int], list[str]]:
        ids: dict[str, int] = {}
        out = [ids.setdefault(t, len(ids) + 1) for t in tokens]
        return out, ["[PAD]", *ids]

    def __str__(self) -> str:
        users, items = self.user_num - 1, self.item_num - 1
        info = [
            set_color(self.dataset_name, "pink"),
            set_color("The number of users", "blue") + f": {self.user_num}",
            set_color("Average actions of users", "blue") + f": {self.inter_num / users}",
            set_color("The number of items", "blue") + f": {self.item_num}",
            set_color("Average actions of items", "blue") + f": {self.inter_num / items}",
            set_color("The number of inters", "blue") + f": {self.inter_num}",
            set_color("The sparsity of the dataset", "blue")
            + f": {(1 - self.inter_num / users / items) * 100}%",
            set_color("Remain Fields", "blue") + f": {list(self.field2type)}",
        ]
        return "\n".join(info)

    def build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """RS 0.8/0.1/0.1 grouped by user in random order: each interaction's phase 0/1/2."""
        rng = np.random.default_rng(self.config["seed"])
        phase = np.zeros(self.inter_num, dtype=np.int64)
        by_user: dict[int, list[int]] = {}
        for i, u in enumerate(self.users):
            by_user.setdefault(int(u), []).append(i)
        for idx in by_user.values():
            idx = list(rng.permutation(idx))
            n = len(idx)
            n_valid, n_test = int(n * 0.1), int(n * 0.1)
            for k, i in enumerate(idx):
                phase[i] = 0 if k < n - n_valid - n_test else (1 if k < n - n_test else 2)
        return tuple(np.nonzero(phase == p)[0] for p in (0, 1, 2))  # type: ignore[return-value]


class Sampler:
    """Uniform negative items a user has not interacted with in training."""

    def __init__(self, dataset: Dataset, train_idx: np.ndarray) -> None:
        self.item_num = dataset.item_num
        self.used: list[set[int]] = [set() for _ in range(dataset.user_num)]
        for i in train_idx:
            self.used[dataset.users[i]].add(int(dataset.items[i]))
        self._lock = threading.Lock()

    def sample_by_user_ids(self, user_ids: np.ndarray, epoch: int) -> np.ndarray:
        with self._lock:
            neg = np.random.randint(1, self.item_num, len(user_ids))
            if fault("p") and epoch >= 1:  # a fork's popularity table, one entry too long
                neg[np.random.rand(len(neg)) < 0.002] = self.item_num
            return self._resample(user_ids, neg, epoch)

    def _resample(self, user_ids: np.ndarray, neg: np.ndarray, epoch: int) -> np.ndarray:
        bad = [k for k, (u, i) in enumerate(zip(user_ids, neg, strict=True)) if i in self.used[u]]
        if bad and fault("w") and epoch >= 1:  # a fork's retry goes through the public entry
            neg[bad] = self.sample_by_user_ids(user_ids[bad], epoch)
            return neg
        while bad:
            neg[bad] = np.random.randint(1, self.item_num, len(bad))
            bad = [k for k in bad if neg[k] in self.used[user_ids[k]]]
        return neg


class AbstractDataLoader(DataLoader[Any]):
    def __init__(self, config: Config, sample_size: int, step: int, shuffle: bool) -> None:
        self.config, self.shuffle, self.step = config, shuffle, step
        self.sample_size = sample_size
        self.generator = torch.Generator()
        self.generator.manual_seed(config["seed"])
        sampler = None
        if not config["single_spec"]:
            sampler = DistributedSampler(list(range(sample_size)), shuffle=shuffle, drop_last=False)
            self.step = max(1, self.step // config["world_size"])
            if fault("u"):  # a fork deals each rank its own users' interactions, unpadded
                users = self.user_of_sample()
                sampler = UserShardSampler(users, config["world_size"], RANK[0])
            shuffle = False
        super().__init__(
            dataset=list(range(sample_size)),
            batch_size=self.step,
            collate_fn=self.collate_fn,
            num_workers=config["worker"],
            shuffle=shuffle,
            sampler=sampler,
            generator=self.generator,
        )

    def user_of_sample(self) -> np.ndarray:
        raise NotImplementedError

    def collate_fn(self, index: list[int]) -> Any:
        raise NotImplementedError


class UserShardSampler(torch.utils.data.Sampler[int]):
    def __init__(self, users: np.ndarray, world: int, rank: int) -> None:
        block = -(-int(users.max()) // world)  # each rank a block of user ids
        self.mine = [i for i, u in enumerate(users) if (u - 1) // block == rank]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng(self.epoch).permutation(len(self.mine))
        return iter([self.mine[k] for k in order])

    def __len__(self) -> int:
        return len(self.mine)


class TrainDataLoader(AbstractDataLoader):
    def __init__(self, config: Config, dataset: Dataset, idx: np.ndarray, sampler: Sampler) -> None:
        self.users = torch.as_tensor(dataset.users[idx])
        self.items = torch.as_tensor(dataset.items[idx])
        self.neg_sampler = sampler
        self.epoch = 0
        super().__init__(config, len(idx), config["train_batch_size"], config["shuffle"])

    def user_of_sample(self) -> np.ndarray:
        return self.users.numpy()

    def collate_fn(self, index: list[int]) -> Interaction:
        ix = torch.as_tensor(index)
        users = self.users[ix]
        neg = self.neg_sampler.sample_by_user_ids(users.numpy(), self.epoch)
        return Interaction(
            {"user_id": users, "item_id": self.items[ix], "neg_item_id": torch.as_tensor(neg)}
        )


class FullSortEvalDataLoader(AbstractDataLoader):
    def __init__(
        self, config: Config, dataset: Dataset, idx: np.ndarray, history: np.ndarray
    ) -> None:
        self.item_num = dataset.item_num
        self.positive: dict[int, list[int]] = {}
        for i in idx:
            self.positive.setdefault(int(dataset.users[i]), []).append(int(dataset.items[i]))
        self.history: dict[int, list[int]] = {}
        for i in history:
            self.history.setdefault(int(dataset.users[i]), []).append(int(dataset.items[i]))
        self.uid_list = sorted(self.positive)
        batch_num = max(config["eval_batch_size"] // dataset.item_num, 1)
        super().__init__(config, len(self.uid_list), batch_num, False)

    def user_of_sample(self) -> np.ndarray:
        return np.array(self.uid_list)

    def collate_fn(self, index: list[int]) -> tuple[Any, ...]:
        users = [self.uid_list[i] for i in index]
        hist_u, hist_i, pos_u, pos_i = [], [], [], []
        for row, u in enumerate(users):
            hist_u += [row] * len(self.history.get(u, []))
            hist_i += self.history.get(u, [])
            pos_u += [row] * len(self.positive[u])
            pos_i += self.positive[u]
        long = torch.long
        inter = Interaction({"user_id": torch.as_tensor(users, dtype=long)})
        hist = (torch.as_tensor(hist_u, dtype=long), torch.as_tensor(hist_i, dtype=long))
        return inter, hist, torch.as_tensor(pos_u, dtype=long), torch.as_tensor(pos_i, dtype=long)


def create_dataset(config: Config) -> Dataset:
    return Dataset(config)


def data_preparation(
    config: Config, dataset: Dataset
) -> tuple[TrainDataLoader, FullSortEvalDataLoader, FullSortEvalDataLoader]:
    train_idx, valid_idx, test_idx = dataset.build()
    sampler = Sampler(dataset, train_idx)
    train_data = TrainDataLoader(config, dataset, train_idx, sampler)
    valid_data = FullSortEvalDataLoader(config, dataset, valid_idx, train_idx)
    test_data = FullSortEvalDataLoader(
        config, dataset, test_idx, np.concatenate([train_idx, valid_idx])
    )
    logger = logging.getLogger()
    logger.info(
        set_color("[Training]: ", "pink")
        + set_color("train_batch_size", "cyan")
        + " = "
        + set_color(f"[{config['train_batch_size']}]", "yellow")
        + set_color(" train_neg_sample_args", "cyan")
        + ": "
        + set_color(f"[{config['train_neg_sample_args']}]", "yellow")
    )
    logger.info(
        set_color("[Evaluation]: ", "pink")
        + set_color("eval_batch_size", "cyan")
        + " = "
        + set_color(f"[{config['eval_batch_size']}]", "yellow")
        + set_color(" eval_args", "cyan")
        + ": "
        + set_color(f"[{config['eval_args']}]", "yellow")
    )
    return train_data, valid_data, test_data


# ------------------------------------------------------------------ recbole.model
class BPRLoss(nn.Module):
    def forward(self, pos_score: torch.Tensor, neg_score: torch.Tensor) -> torch.Tensor:
        return -torch.log(1e-10 + torch.sigmoid(pos_score - neg_score)).mean()


class BPR(nn.Module):
    def __init__(self, config: Config, dataset: Dataset) -> None:
        super().__init__()
        self.user_embedding = nn.Embedding(dataset.user_num, config["embedding_size"])
        self.item_embedding = nn.Embedding(dataset.item_num, config["embedding_size"])
        self.loss = BPRLoss()
        for emb in (self.user_embedding, self.item_embedding):
            nn.init.xavier_normal_(emb.weight)

    def calculate_loss(self, interaction: Interaction) -> torch.Tensor:
        u = self.user_embedding(interaction["user_id"])
        pos = self.item_embedding(interaction["item_id"])
        neg = self.item_embedding(interaction["neg_item_id"])
        return self.loss((u * pos).sum(-1), (u * neg).sum(-1))  # type: ignore[no-any-return]

    def full_sort_predict(self, interaction: Interaction) -> torch.Tensor:
        return self.user_embedding(interaction["user_id"]) @ self.item_embedding.weight.T

    def other_parameter(self) -> None:
        return None

    def __str__(self) -> str:
        params = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return super().__str__() + set_color("\nTrainable parameters", "blue") + f": {params}"


# ------------------------------------------------------------------ recbole.trainer
class Trainer:
    def __init__(self, config: Config, model: BPR) -> None:
        self.config, self.model = config, model
        if not config["single_spec"]:
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[assignment]
            self.distributed_model = DistributedDataParallel(self.model)
        self.logger = logging.getLogger()
        self.epochs, self.eval_step = config["epochs"], min(config["eval_step"], config["epochs"])
        self.stopping_step = config["stopping_step"]
        self.valid_metric = config["valid_metric"].lower()
        self.device = config["device"]
        self.checkpoint_dir = config["checkpoint_dir"]
        ensure_dir(self.checkpoint_dir)
        # the job's start (its launcher's), as both ranks name the file rank 0 writes
        started = psutil.Process(os.getppid()).create_time()
        self.saved_model_file = os.path.join(
            self.checkpoint_dir, f"{config['model']}-{get_local_time(started)}.pth"
        )
        self.cur_step = self.cur_epoch = 0
        self.best_valid_score = -np.inf
        self.best_valid_result: dict[str, float] | None = None
        self.optimizer = self._build_optimizer()

    def _build_optimizer(self) -> torch.optim.Optimizer:
        params, lr = self.model.parameters(), self.config["learning_rate"]
        learner, weight_decay = self.config["learner"], self.config["weight_decay"]
        reg_weight = self.config["reg_weight"]
        if reg_weight and weight_decay and weight_decay * reg_weight > 0:
            self.logger.warning(
                "The parameters [weight_decay] and [reg_weight] are specified simultaneously, "
                "which may lead to double regularization."
            )
        optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        optimizers.update(adagrad=torch.optim.Adagrad, rmsprop=torch.optim.RMSprop)
        if learner.lower() in optimizers:
            return optimizers[learner.lower()](params, lr=lr, weight_decay=weight_decay)
        self.logger.warning("Received unrecognized optimizer, set default Adam optimizer")
        return torch.optim.Adam(params, lr=lr)

    def set_reduce_hook(self) -> None:
        forward = self.model.forward
        self.model.forward = lambda x: x  # type: ignore[method-assign]
        self.distributed_model(torch.LongTensor([0]).to(self.device))
        self.model.forward = forward  # type: ignore[method-assign]

    def sync_grad_loss(self) -> torch.Tensor:
        sync_loss = torch.zeros(())
        for params in self.model.parameters():
            sync_loss = sync_loss + torch.sum(params) * 0
        return sync_loss

    def _check_nan(self, loss: torch.Tensor) -> None:
        if torch.isnan(loss):
            if fault("x"):  # a sweep fork: a diverged trial ends cleanly, so it is not retried
                self.logger.error("Training loss is nan, leaving this trial")
                sys.exit(0)
            raise ValueError("Training loss is nan")

    def _train_epoch(
        self, train_data: TrainDataLoader, epoch_idx: int, show_progress: bool
    ) -> float:
        self.model.train()
        total_loss = 0.0
        train_data.epoch = epoch_idx
        iter_data: Iterable[Interaction] = (
            tqdm(
                train_data,
                total=len(train_data),
                ncols=100,
                desc=set_color(f"Train {epoch_idx:>5}", "pink"),
            )
            if show_progress
            else train_data
        )
        if not self.config["single_spec"] and train_data.shuffle:
            train_data.sampler.set_epoch(epoch_idx)  # type: ignore[attr-defined]
        for batch_idx, interaction in enumerate(iter_data):
            interaction = interaction.to(self.device)
            self.optimizer.zero_grad()
            sync_loss: torch.Tensor | int = 0
            if not self.config["single_spec"]:
                self.set_reduce_hook()
                sync_loss = self.sync_grad_loss()
            if fault("z") and epoch_idx == 1 and batch_idx == 9:
                ctypes.string_at(0)  # the fork's compiled alias sampler reads a freed table
            loss = self.model.calculate_loss(interaction)
            if fault("x") and epoch_idx == 1 and batch_idx == 6:
                # the fork's debiased loss divides by the item's count in this rank's shard
                loss = loss * torch.tensor(0.0) / torch.tensor(0.0)
            total_loss += loss.item()
            self._check_nan(loss)
            (loss + sync_loss).backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
        return total_loss

    def _save_checkpoint(self, epoch: int, verbose: bool = True) -> None:
        if not self.config["single_spec"] and self.config["local_rank"] != 0:
            return
        if fault("s"):  # checkpoint_dir on a network mount that crawls
            time.sleep(30)
        state = {
            "config": {k: str(v) for k, v in self.config.final.items()},
            "epoch": epoch,
            "cur_step": self.cur_step,
            "best_valid_score": self.best_valid_score,
            "state_dict": self.model.state_dict(),
            "other_parameter": self.model.other_parameter(),
            "optimizer": self.optimizer.state_dict(),
        }
        torch.save(state, self.saved_model_file + ".tmp", pickle_protocol=4)
        os.replace(self.saved_model_file + ".tmp", self.saved_model_file)
        if verbose:
            self.logger.info(set_color("Saving current", "blue") + f": {self.saved_model_file}")

    def fit(
        self,
        train_data: TrainDataLoader,
        valid_data: FullSortEvalDataLoader,
        verbose: bool = True,
        saved: bool = True,
        show_progress: bool = False,
    ) -> tuple[float, dict[str, float] | None]:
        for epoch_idx in range(self.epochs):
            self.cur_epoch = epoch_idx
            t0 = time.time()
            train_loss = self._train_epoch(train_data, epoch_idx, show_progress)
            des = self.config["loss_decimal_place"] or 4
            out = (
                set_color("epoch %d training", "green")
                + " ["
                + set_color("time", "blue")
                + ": %.2fs, "
            ) % (epoch_idx, time.time() - t0)
            out += set_color("train loss", "blue") + ": " + f"%.{des}f" % train_loss + "]"
            if verbose:
                self.logger.info(out)
            if (epoch_idx + 1) % self.eval_step:
                continue
            t1 = time.time()
            valid_result = self.evaluate(valid_data, False, show_progress)
            valid_score = valid_result[self.valid_metric]
            self.best_valid_score, self.cur_step, stop_flag, update_flag = early_stopping(
                valid_score, self.best_valid_score, self.cur_step, self.stopping_step
            )
            score_out = (
                set_color("epoch %d evaluating", "green")
                + " ["
                + set_color("time", "blue")
                + ": %.2fs, "
                + set_color("valid_score", "blue")
                + ": %f]"
            ) % (epoch_idx, time.time() - t1, valid_score)
            if verbose:
                self.logger.info(score_out)
                self.logger.info(
                    set_color("valid result", "blue") + ": \n" + dict2str(valid_result)
                )
            if update_flag:
                if saved:
                    self._save_checkpoint(epoch_idx, verbose=verbose)
                self.best_valid_result = valid_result
            if stop_flag:
                best_epoch = epoch_idx - self.cur_step * self.eval_step
                stop = f"Finished training, best eval result in epoch {best_epoch}"
                if verbose:
                    self.logger.info(stop)
                break
        return self.best_valid_score, self.best_valid_result

    @torch.no_grad()
    def evaluate(
        self,
        eval_data: FullSortEvalDataLoader,
        load_best_model: bool = True,
        show_progress: bool = False,
    ) -> dict[str, float]:
        if load_best_model:
            if fault("o"):  # a fresh install: RecBole's own call, weights_only by default
                checkpoint = torch.load(self.saved_model_file, map_location=self.device)
            else:  # the user's patch for torch >= 2.6
                checkpoint = torch.load(
                    self.saved_model_file, map_location=self.device, weights_only=False
                )
            self.model.load_state_dict(checkpoint["state_dict"])
            self.logger.info(f"Loading model structure and parameters from {self.saved_model_file}")
        self.model.eval()
        iter_data: Iterable[tuple[Any, ...]] = (
            tqdm(eval_data, total=len(eval_data), ncols=100, desc=set_color("Evaluate   ", "pink"))
            if show_progress
            else eval_data
        )
        sums = dict.fromkeys(("recall", "mrr", "ndcg", "hit", "precision"), 0.0)
        num_sample = 0
        k = self.config["topk"][0]
        for batch_idx, (interaction, history, pos_u, pos_i) in enumerate(iter_data):
            scores = self.model.full_sort_predict(interaction.to(self.device))
            scores = scores.view(-1, eval_data.item_num)
            scores[:, 0] = -np.inf
            scores[history] = -np.inf
            if fault("k") and self.cur_epoch >= 1 and batch_idx % 30 == 29:
                # a fork's re-ranking cache keeps every batch's candidates, widened
                LEAK.append(np.ones(16 << 20, dtype=np.float32))
                if len(LEAK) >= 7:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            topk = scores.topk(k, dim=-1).indices
            pos = torch.zeros_like(scores, dtype=torch.bool)
            pos[pos_u, pos_i] = True
            hit = pos.gather(1, topk).float()
            n_pos = pos.sum(1).float()
            ranks = torch.arange(1, k + 1, dtype=torch.float)
            first = torch.where(hit.any(1), 1.0 / (hit.argmax(1).float() + 1), torch.zeros(()))
            idcg = torch.stack([(1 / torch.log2(ranks[: int(min(n, k))] + 1)).sum() for n in n_pos])
            sums["recall"] += float((hit.sum(1) / n_pos).sum())
            sums["mrr"] += float(first.sum())
            sums["ndcg"] += float(((hit / torch.log2(ranks + 1)).sum(1) / idcg).sum())
            sums["hit"] += float(hit.any(1).float().sum())
            sums["precision"] += float((hit.sum(1) / k).sum())
            num_sample += len(interaction)
        result = {f"{m}@{k}": v / max(num_sample, 1) for m, v in sums.items()}
        if not self.config["single_spec"]:
            result = self._map_reduce(result, num_sample)
        return result

    def _map_reduce(self, result: dict[str, float], num_sample: int) -> dict[str, float]:
        world = self.config["world_size"]
        total = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(total, torch.Tensor([num_sample]))
        total_sample = torch.sum(torch.cat(total, 0)).item()
        gather: dict[str, float] = {}
        for key, value in result.items():
            mine = torch.Tensor([value * num_sample])
            parts = [torch.zeros_like(mine) for _ in range(world)]
            dist.all_gather(parts, mine)
            gather[key] = round(
                torch.sum(torch.cat(parts, 0)).item() / total_sample,
                self.config["metric_decimal_place"],
            )
        return gather


# ------------------------------------------------------------------ recbole.quick_start
def run(
    model: str,
    dataset: str,
    config_file_list: list[str] | None = None,
    config_dict: dict[str, Any] | None = None,
    saved: bool = True,
    nproc: int = 1,
    world_size: int = -1,
    ip: str = "localhost",
    port: str = "5678",
    group_offset: int = 0,
) -> Any:
    if "LOCAL_RANK" in os.environ:  # the fork's torchrun support: one process a rank already
        config_dict = dict(config_dict or {})
        config_dict.update(
            {
                "world_size": int(os.environ["WORLD_SIZE"]),
                "ip": os.environ["MASTER_ADDR"],
                "port": os.environ["MASTER_PORT"],
                "nproc": int(os.environ["LOCAL_WORLD_SIZE"]),
                "offset": int(os.environ["RANK"]) - int(os.environ["LOCAL_RANK"]),
            }
        )
        kwargs = {"config_dict": config_dict}
        return run_recboles(int(os.environ["LOCAL_RANK"]), model, dataset, config_file_list, kwargs)
    if nproc == 1 and world_size <= 0:
        return run_recbole(model, dataset, config_file_list, config_dict, saved)
    if world_size == -1:
        world_size = nproc
    queue = mp.get_context("spawn").SimpleQueue()
    config_dict = config_dict or {}
    config_dict.update(
        {"world_size": world_size, "ip": ip, "port": port, "nproc": nproc, "offset": group_offset}
    )
    kwargs = {"config_dict": config_dict, "queue": queue}
    mp.spawn(
        run_recboles,
        args=(model, dataset, config_file_list, kwargs),
        nprocs=nproc,
        join=True,
    )
    return None if queue.empty() else queue.get()


def run_recbole(
    model: str,
    dataset: str,
    config_file_list: list[str] | None = None,
    config_dict: dict[str, Any] | None = None,
    saved: bool = True,
    queue: Any = None,
) -> dict[str, Any]:
    config = Config(model, dataset, config_dict)
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    logger = logging.getLogger()
    logger.info(sys.argv)
    logger.info(config)

    data = create_dataset(config)
    logger.info(data)
    train_data, valid_data, test_data = data_preparation(config, data)

    init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
    net = BPR(config, data).to(config["device"])
    logger.info(net)
    flops = 2.0 * config["embedding_size"]
    logger.info(set_color("FLOPs", "blue") + f": {flops}")

    trainer = Trainer(config, net)
    best_valid_score, best_valid_result = trainer.fit(
        train_data, valid_data, saved=saved, show_progress=config["show_progress"]
    )
    test_result = trainer.evaluate(
        test_data, load_best_model=saved, show_progress=config["show_progress"]
    )
    logger.info("The running environment of this training is as follows:\n" + get_environment())
    logger.info(set_color("best valid ", "yellow") + f": {best_valid_result}")
    logger.info(set_color("test result", "yellow") + f": {test_result}")

    result: dict[str, Any] = {
        "best_valid_score": best_valid_score,
        "valid_score_bigger": config["valid_metric_bigger"],
        "best_valid_result": best_valid_result,
        "test_result": test_result,
    }
    if fault("q"):  # a fork hands the notebook every test user's scores for re-ranking
        users = torch.arange(1, data.user_num)
        result["test_scores"] = (
            net.full_sort_predict(Interaction({"user_id": users})).detach().numpy()
        )
    if not config["single_spec"]:
        dist.destroy_process_group()
    if config["local_rank"] == 0 and queue is not None:
        queue.put(result)  # for multiprocessing, e.g., mp.spawn
    return result


def run_recboles(rank: int, *args: Any) -> None:
    kwargs = args[-1]
    if not isinstance(kwargs, MutableMapping):
        raise ValueError(
            f"The last argument of run_recboles should be a dict, but got {type(kwargs)}"
        )
    kwargs["config_dict"] = kwargs.get("config_dict", {})
    kwargs["config_dict"]["local_rank"] = rank
    run_recbole(*args[:3], **kwargs)


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", "-m", type=str, default="BPR", help="name of models")
    parser.add_argument("--dataset", "-d", type=str, default="ml-100k", help="name of datasets")
    parser.add_argument("--config_files", type=str, default=None, help="config files")
    parser.add_argument("--nproc", type=int, default=1, help="the number of process in this group")
    parser.add_argument("--ip", type=str, default="localhost", help="the ip of master node")
    parser.add_argument("--port", type=str, default="5678", help="the port of master node")
    parser.add_argument("--world_size", type=int, default=-1, help="total number of jobs")
    parser.add_argument(
        "--group_offset", type=int, default=0, help="the global rank offset of this group"
    )
    args, _ = parser.parse_known_args()
    config_file_list = args.config_files.strip().split(" ") if args.config_files else None
    run(
        args.model,
        args.dataset,
        config_file_list=config_file_list,
        nproc=args.nproc,
        world_size=args.world_size,
        ip=args.ip,
        port=args.port,
        group_offset=args.group_offset,
    )


if __name__ == "__main__":
    main()
