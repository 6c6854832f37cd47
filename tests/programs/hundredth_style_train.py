"""A hundredth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredth-*): audio compression training in the way of facebookresearch's
audiocraft (the EnCodec CompressionSolver) run through dora and flashy, re-implemented in plain
torch in one file. Linked into a run's folder as dora.py, it is at once

* the checkout's data preparation, `python dora.py prepare`: the Hydra config tree (config/
  config.yaml, config/model/encodec/default.yaml, config/solver/compression/
  encodec_base_24khz.yaml, config/dset/audio/example.yaml), thirteen synthetic 1-second 24 kHz
  WAV clips of notes under dataset/example/ and their manifest egs/example/data.jsonl (one
  AudioMeta JSON object a line, as audiocraft.data.audio_dataset writes it);
* dora's launcher, `python dora.py run -d [--ddp_workers N] solver=... dset=... [key=value ...]`:
  the config is composed from the YAML files and the overrides, the experiment's signature is the
  SHA-1 of the overrides that dora.exclude does not exclude (8 hex digits, a config file's own
  edits are not part of it), its folder <AUDIOCRAFT_DORA_DIR>/xps/<sig>; the launcher writes
  .argv.json there and starts one `python dora.py run -- ...` process per worker with RANK,
  LOCAL_RANK, WORLD_SIZE and MASTER_ADDR in its environment (dora's executor.py: rank 0 keeps
  the console, worker K writes to <xp>/worker_K.log), prints 'Executor: Starting N worker
  processes for DDP.', waits, and on a worker's non-zero exit prints 'Executor: Worker K died,
  killing all workers', terminates the others and exits 1 ('Executor: All workers completed
  successfully' otherwise; 'Received keyboard interrupt, trying to kill all workers.' on Ctrl-C);
* a worker (RANK set): Hydra's chdir into the xp folder and its .hydra/ files, flashy's logging
  set-up ('[%(asctime)s][%(name)s][%(levelname)s] - %(message)s' in colorlog's colours, date
  '%m-%d %H:%M:%S', to stderr and <xp>/solver.log.<rank>, on every rank), dora.distrib.init
  (gloo, env://, a 15 s timeout), and audiocraft's StandardSolver/CompressionSolver: restore
  from <xp>/checkpoint.th with the history replayed, then per epoch the stages train and valid
  (evaluate and generate on the last epoch), flashy's progress lines ('Train | Epoch 1 | 2/4 |
  1.31 it/sec | bandwidth 6.000 | ...') and bold summaries ('Valid Summary | Epoch 2 | ...'),
  history.json, 'Checkpoint saved to <xp>/checkpoint.th' from rank 0.

The model is a tiny causal SEANet encoder/decoder with weight_norm convolutions and an 8-codebook
residual vector quantizer (EMA codebooks, k-means init on the first batch and dead-code expiry,
both broadcast with flashy.distrib.broadcast_tensors); the losses are l1 and a multi-scale
spectral loss, plus hinge adversarial and feature-matching losses from a small multi-scale STFT
discriminator trained in train_adv under flashy.distrib.eager_sync_model; audiocraft's Balancer
(gradient norms averaged across ranks) weights them; the model's gradients and buffers are
averaged by flashy.distrib.sync_model (no DDP). The train split samples random 1 s segments
(DistributedSampler), valid/evaluate/generate use flashy's manual shard (rank::world); a clip
that cannot be read during segment sampling is logged ('Error opening file ...: ...') and
another one drawn, up to max_read_retry times; the evaluate stage reads whole files.

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and
never printed (re-capture with tests/fixtures/real/capture_hundredth.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import fnmatch
import hashlib
import json
import logging
import math
import os
import queue
import random
import signal
import subprocess as sp
import sys
import threading
import time
import typing as tp
import wave
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial, wraps
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from torch.utils.data.distributed import DistributedSampler


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# --------------------------------------------------------------------------------------------
# the checkout: config tree, example data set and its manifest
# --------------------------------------------------------------------------------------------

CONFIG_FILES = {
    "config/config.yaml": """\
# WARNING: This is the base configuration file shared across ALL solvers in AudioCraft
# Please don't update this file directly. Instead use distinct configuration files
# to override the below configuration.
device: cpu
dtype: float32
seed: 2036
show: false
continue_from: null
label: null
num_threads: 1
mp_start_method: forkserver

logging:
  level: INFO
  log_updates: 4
  log_tensorboard: false

tensorboard:
  with_media_logging: false
  name: null

dora:
  # Output folder for all artifacts of an experiment ($AUDIOCRAFT_DORA_DIR when set).
  dir: /tmp/audiocraft/outputs
  # The following entries will be ignored by dora when computing the unique XP signature.
  # Note that slurm.* and dora.* are automatically ignored.
  exclude: ['device', 'tensorboard.*', 'logging.*', 'dataset.num_workers',
            'num_threads', 'mp_start_method', 'deadlock.*']
  use_rendezvous: false
""",
    "config/model/encodec/default.yaml": """\
compression_model: encodec
encodec:
  autoencoder: seanet
  quantizer: rvq
  causal: true
seanet:
  dimension: 16
  channels: 1
  n_filters: 4
  n_residual_layers: 1
  ratios: [8, 5, 4, 2]
  kernel_size: 7
  residual_kernel_size: 3
  norm: weight_norm
rvq:
  n_q: 8
  bins: 1024
  decay: 0.99
  kmeans_init: true
  kmeans_iters: 4
  threshold_ema_dead_code: 2
""",
    "config/solver/compression/encodec_base_24khz.yaml": """\
# @package __global__
defaults:
  - /model: encodec/default

solver: compression
sample_rate: 24000
channels: 1

# loss balancing
losses:
  adv: 4.
  feat: 4.
  l1: 0.1
  msspec: 2.
balancer:
  balance_grads: true
  ema_decay: 0.999
  per_batch_item: true
  total_norm: 1.

adversarial:
  every: 1
  adversaries: [msstftd]
  adv_loss: hinge
  feat_loss: l1

msspec:
  range_start: 6
  range_end: 11

msstftd:
  filters: 8
  n_ffts: [256, 128]
  hop_lengths: [64, 32]

# data hyperparameters
dataset:
  batch_size: 4
  num_workers: 0
  segment_duration: 1
  min_segment_ratio: 0.5
  max_read_retry: 10
  train:
    num_samples: null
    shuffle: true
  valid:
    num_samples: null
    shuffle: false
  evaluate:
    batch_size: 2
    segment_duration: null
    shuffle: false
  generate:
    batch_size: 2
    num_samples: 4
    shuffle: false

evaluate:
  every: null
  metrics:
    sisnr: true
generate:
  every: null
  path: samples

checkpoint:
  save_last: true
  save_every: null

optim:
  epochs: 3
  updates_per_epoch: null
  lr: 3.0e-4
  optimizer: adam
  adam:
    betas: [0.5, 0.9]
    weight_decay: 0.
""",
    "config/dset/audio/example.yaml": """\
# @package __global__
datasource:
  max_sample_rate: 48000
  max_channels: 2

  train: egs/example
  valid: egs/example
  evaluate: egs/example
  generate: egs/example
""",
}


def write_wav(path: Path, wav: torch.Tensor, sample_rate: int) -> None:
    pcm = (wav.clamp(-1, 1) * 32767).round().to(torch.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.numpy().tobytes() if hasattr(pcm, "numpy") else bytes(pcm))


def synth_clip(g: torch.Generator, sample_rate: int, seconds: float) -> torch.Tensor:
    """Two or three notes with harmonics and a decay, over a little noise."""
    n = int(sample_rate * seconds)
    t = torch.arange(n) / sample_rate
    wav = 0.01 * torch.randn(n, generator=g)
    notes = int(torch.randint(2, 4, (1,), generator=g))
    for k in range(notes):
        f0 = 110.0 * 2 ** (int(torch.randint(0, 24, (1,), generator=g)) / 12)
        start = k * seconds / notes
        env = torch.where(t >= start, torch.exp(-4.0 * (t - start)), torch.zeros(()))
        for h in range(1, 4):
            wav += 0.2 / h * env * torch.sin(2 * math.pi * f0 * h * t)
    return wav


def prepare(root: Path, clips: int) -> None:
    for name, text in CONFIG_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    data = root / "dataset" / "example"
    data.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(100)
    metas = []
    for k in range(clips):
        path = data / f"clip_{k:02d}.wav"
        write_wav(path, synth_clip(g, 24000, 1.0), 24000)
        metas.append(
            {
                "path": f"dataset/example/{path.name}",
                "duration": 1.0,
                "sample_rate": 24000,
                "amplitude": None,
                "weight": None,
                "info_path": None,
            }
        )
    manifest = root / "egs" / "example" / "data.jsonl"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("".join(json.dumps(m) + "\n" for m in metas))


# --------------------------------------------------------------------------------------------
# dora: config composition, signature, xp folder, launcher
# --------------------------------------------------------------------------------------------


def bold(text: str) -> str:
    return f"\033[1m{text}\033[0m"


def simple_log(first: str, *args: tp.Any) -> None:
    print(bold(first), *args, file=sys.stderr, flush=True)


def deep_merge(base: dict, other: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Config(dict):
    """An attribute view of a composed config (what omegaconf's DictConfig gives the solver)."""

    def __getattr__(self, name: str) -> tp.Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: tp.Any) -> None:
        self[name] = value


def to_config(value: tp.Any) -> tp.Any:
    if isinstance(value, dict):
        return Config({k: to_config(v) for k, v in value.items()})
    return value


def to_plain(value: tp.Any) -> tp.Any:
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def load_yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f) or {}


def compose(root: Path, overrides: list[str]) -> tuple[Config, list[tuple[str, tp.Any]]]:
    """config.yaml, then the groups chosen (solver=, dset=, the solver's /model default), then
    the key=value overrides; returns the config and the overrides as (key, value) pairs."""
    groups = {"solver": None, "dset": None, "model": None}
    values: list[tuple[str, tp.Any]] = []
    for arg in overrides:
        key, _, raw = arg.partition("=")
        if key in groups:
            groups[key] = raw
        values.append((key, yaml.safe_load(raw) if key not in groups else raw))
    cfg = load_yaml(root / "config" / "config.yaml")
    solver = load_yaml(root / "config" / "solver" / f"{groups['solver']}.yaml")
    for default in solver.pop("defaults", []):
        for group, choice in default.items():
            group = group.strip("/")
            if groups.get(group) is None:
                groups[group] = choice
    if groups["model"]:
        cfg = deep_merge(cfg, load_yaml(root / "config" / "model" / f"{groups['model']}.yaml"))
    cfg = deep_merge(cfg, solver)
    if groups["dset"]:
        cfg = deep_merge(cfg, load_yaml(root / "config" / "dset" / f"{groups['dset']}.yaml"))
    for key, value in values:
        if key in groups:
            continue
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    if os.environ.get("AUDIOCRAFT_DORA_DIR"):
        cfg["dora"]["dir"] = os.environ["AUDIOCRAFT_DORA_DIR"]
    return to_config(cfg), values


@dataclass
class XP:
    cfg: Config
    argv: list[str]
    delta: list[tuple[str, tp.Any]]
    root: Path
    sig: str = ""
    history: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        exclude = ["dora.*", "slurm.*", *self.cfg.dora.exclude]
        kept = [[k, v] for k, v in self.delta if not any(fnmatch.fnmatch(k, p) for p in exclude)]
        self.sig = hashlib.sha1(json.dumps(sorted(kept)).encode("utf8")).hexdigest()[:8]

    @property
    def folder(self) -> Path:
        return Path(self.cfg.dora.dir) / "xps" / self.sig

    def load_history(self) -> None:
        path = self.folder / "history.json"
        self.history = json.loads(path.read_text()) if path.exists() else []

    def update_history(self, history: list[dict]) -> None:
        tmp = self.folder / "history.json.tmp"
        tmp.write_text(json.dumps(history, indent=2))
        tmp.rename(self.folder / "history.json")


log = partial(simple_log, "Executor:")


class ChildrenManager:
    """dora.executor's: wait for the workers, kill them all as soon as one fails."""

    def __init__(self) -> None:
        self.children: list[sp.Popen] = []
        self.failed = False

    def add(self, child: sp.Popen) -> None:
        child.rank = len(self.children)  # type: ignore[attr-defined]
        self.children.append(child)

    def __enter__(self) -> ChildrenManager:
        return self

    def __exit__(self, exc_type: tp.Any, exc_value: tp.Any, traceback: tp.Any) -> None:
        if exc_value is not None:
            log(f"An exception happened while starting workers {exc_value}")
            self.failed = True
        try:
            while self.children and not self.failed:
                for child in list(self.children):
                    try:
                        exitcode = child.wait(0.05)
                    except sp.TimeoutExpired:
                        continue
                    else:
                        self.children.remove(child)
                        if exitcode:
                            log(f"Worker {child.rank} died, killing all workers")  # type: ignore[attr-defined]
                            self.failed = True
        except KeyboardInterrupt:
            log("Received keyboard interrupt, trying to kill all workers.")
            self.failed = True
        for child in self.children:
            child.terminate()
        if not self.failed:
            log("All workers completed successfully")


def start_ddp_workers(xp: XP, argv: list[str], num_workers: int | None) -> None:
    world_size = num_workers or torch.cuda.device_count()
    if not world_size:
        simple_log(
            "FATAL:",
            "DDP is only available on GPU. Make sure GPUs are properly configured with cuda.",
        )
        sys.exit(1)
    xp.folder.mkdir(exist_ok=True, parents=True)
    (xp.folder / ".argv.json").write_text(json.dumps(argv))
    rendezvous_file = xp.folder / "rendezvous.txt"
    if rendezvous_file.exists():
        rendezvous_file.unlink()
    log(f"Starting {world_size} worker processes for DDP.")
    with ChildrenManager() as manager:
        for rank in range(world_size):
            kwargs: dict[str, tp.Any] = {}
            env = dict(os.environ)
            env["RANK"] = str(rank)
            env["LOCAL_RANK"] = str(rank)
            env["WORLD_SIZE"] = str(world_size)
            env["MASTER_ADDR"] = "127.0.0.1"
            args = [sys.argv[0], "run", "--", *argv]
            if rank > 0:
                kwargs["stdin"] = sp.DEVNULL
                kwargs["stdout"] = open(xp.folder / f"worker_{rank}.log", "w")  # noqa: SIM115
                kwargs["stderr"] = sp.STDOUT
            manager.add(sp.Popen([sys.executable, *args], env=env, **kwargs))
    sys.exit(int(manager.failed))


def get_distrib_spec() -> tuple[int, int, int]:
    if "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        return rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank))
    return 0, 1, 0


def set_distrib_env(xp: XP) -> None:
    if "MASTER_PORT" not in os.environ:
        # dora: a port drawn from the signature (running twice the same XP on a node collides)
        os.environ["MASTER_PORT"] = str(random.Random(xp.sig).randint(20000, 60000))


# --------------------------------------------------------------------------------------------
# flashy: logging, distrib, utils
# --------------------------------------------------------------------------------------------

COLORS = {"DEBUG": "\033[37m", "INFO": "\033[32m", "WARNING": "\033[33m", "ERROR": "\033[31m"}
RESET = "\033[0m"


class ColoredFormatter(logging.Formatter):
    """colorlog's ColoredFormatter with flashy's format: its colours are written whatever the
    stream (flashy gives colorlog no stream to test for a terminal)."""

    def format(self, record: logging.LogRecord) -> str:
        record.log_color = COLORS.get(record.levelname, "")
        return super().format(record)


def setup_logging(folder: Path, rank: int, level: int = logging.INFO) -> None:
    root_logger = logging.getLogger()
    root_logger.setLevel(level)
    root_logger.handlers.clear()
    log_format = (
        "[\033[36m%(asctime)s\033[0m][\033[34m%(name)s\033[0m]"
        "[%(log_color)s%(levelname)s\033[0m] - %(message)s"
    )
    formatter = ColoredFormatter(log_format, datefmt="%m-%d %H:%M:%S")
    sh = logging.StreamHandler(sys.stderr)
    sh.setLevel(level)
    sh.setFormatter(formatter)
    root_logger.addHandler(sh)
    fh = logging.FileHandler(folder / f"solver.log.{rank}")
    fh.setLevel(level)
    fh.setFormatter(formatter)
    root_logger.addHandler(fh)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank_zero() -> bool:
    return rank() == 0


def is_distributed() -> bool:
    return world_size() > 1


def rank_zero_only(fn: tp.Callable) -> tp.Callable:
    @wraps(fn)
    def wrapped_fn(*args: tp.Any, **kwargs: tp.Any) -> tp.Any:
        if is_rank_zero():
            return fn(*args, **kwargs)
        return None

    return wrapped_fn


def distrib_init(xp: XP) -> None:
    """dora.distrib.init (the 15 s timeout is this port's, for the gloo runs)."""
    rank_, world, local_rank = get_distrib_spec()
    if world == 1:
        logging.getLogger("dora.distrib").info("world_size is 1, skipping init.")
        return
    set_distrib_env(xp)
    dist.init_process_group(
        backend="gloo",
        init_method="env://",
        world_size=world,
        rank=rank_,
        timeout=datetime.timedelta(seconds=15),
    )
    logging.getLogger("dora.distrib").info(
        "Distributed init: %d/%d (local %d) from %s", rank_, world, local_rank, "env"
    )


def all_reduce(tensor: torch.Tensor) -> None:
    if is_distributed():
        dist.all_reduce(tensor)


def average_metrics(metrics: dict[str, float], count: float = 1.0) -> dict[str, float]:
    if not is_distributed():
        return metrics
    keys, values = zip(*metrics.items(), strict=True)
    tensor = torch.tensor([*values, 1], dtype=torch.float32)
    tensor *= count
    all_reduce(tensor)
    averaged = (tensor[:-1] / tensor[-1]).tolist()
    return dict(zip(keys, averaged, strict=True))


def _check_number_of_params(params: list[torch.Tensor]) -> None:
    if not is_distributed() or not params:
        return
    tensor = torch.tensor([len(params)], dtype=torch.long)
    all_reduce(tensor)
    if tensor.item() != len(params) * world_size():
        raise RuntimeError(
            f"Mismatch in number of params: ours is {len(params)}, "
            "at least one worker has a different one."
        )


def average_tensors(tensors: tp.Iterable[torch.Tensor]) -> None:
    if not is_distributed():
        return
    tensors = [t for t in tensors if torch.is_floating_point(t)]
    _check_number_of_params(tensors)
    handles = [(t, dist.all_reduce(t.data, async_op=True)) for t in tensors]
    for t, handle in handles:
        handle.wait()
        t.data /= world_size()


def broadcast_tensors(tensors: tp.Iterable[torch.Tensor], src: int = 0) -> None:
    if not is_distributed():
        return
    tensors = [t for t in tensors if torch.is_floating_point(t)]
    _check_number_of_params(tensors)
    handles = [dist.broadcast(t.data, src=src, async_op=True) for t in tensors]
    for handle in handles:
        handle.wait()


def sync_model(model: nn.Module) -> None:
    average_tensors([p.grad for p in model.parameters() if p.grad is not None])
    average_tensors(model.buffers())


@contextmanager
def eager_sync_model(model: nn.Module) -> tp.Iterator[None]:
    if not is_distributed():
        yield
        return
    params = [p for p in model.parameters() if p.requires_grad]
    _check_number_of_params(params)
    hooks, handles = [], []
    waiting = set(params)

    def _callback(param: torch.Tensor, grad: torch.Tensor) -> None:
        handles.append((param, grad.data, dist.all_reduce(grad.data, async_op=True)))
        waiting.remove(param)

    for param in params:
        hooks.append(param.register_hook(partial(_callback, param)))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        _check_number_of_params(list(waiting))
        for param, grad, handle in handles:
            handle.wait()
            torch.div(grad, world_size(), out=param.grad)
    average_tensors(model.buffers())


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def averager(beta: float = 1) -> tp.Callable[..., dict[str, float]]:
    fix: dict[str, float] = {}
    total: dict[str, float] = {}

    def _update(metrics: dict[str, tp.Any], weight: float = 1) -> dict[str, float]:
        for key, value in metrics.items():
            total[key] = total.get(key, 0.0) * beta + weight * float(value)
            fix[key] = fix.get(key, 0.0) * beta + weight
        return {key: tot / fix[key] for key, tot in total.items()}

    return _update


class Formatter:
    """flashy.Formatter as CompressionSolver.get_formatter configures it."""

    def __init__(self, specs: dict[str, str], exclude: tp.Sequence[str] = ()) -> None:
        self.specs = specs
        self.exclude = exclude

    def __call__(self, metrics: dict[str, tp.Any]) -> dict[str, str]:
        out = {}
        for key, value in metrics.items():
            if any(fnmatch.fnmatch(key, p) for p in self.exclude):
                continue
            spec = next((s for p, s in self.specs.items() if fnmatch.fnmatch(key, p)), "")
            out[key] = format(float(value), spec)
        return out


class LogProgressBar:
    def __init__(
        self,
        logger: logging.Logger,
        iterable: tp.Iterable,
        total: int,
        updates: int,
        name: str,
        formatter: Formatter,
    ) -> None:
        self._iterable = iterable
        self._total = total
        self._updates = updates
        self._name = name
        self._logger = logger
        self._formatter = formatter

    def update(self, **metrics: tp.Any) -> bool:
        self._metrics = self._formatter(metrics)
        return self._will_log

    def __iter__(self) -> LogProgressBar:
        self._iterator = iter(self._iterable)
        self._will_log = False
        self._index = -1
        self._metrics: dict[str, str] = {}
        self._begin = time.time()
        return self

    def __next__(self) -> tp.Any:
        if self._will_log:
            self._log()
            self._will_log = False
        value = next(self._iterator)
        self._index += 1
        if self._updates > 0:
            log_every = max(1, self._total // self._updates)
            if self._index >= 1 and self._index % log_every == 0:
                self._will_log = True
        return value

    def _log(self) -> None:
        speed = (1 + self._index) / (time.time() - self._begin)
        shown = f"{1 / speed:.1f} sec/it" if speed < 0.1 else f"{speed:.2f} it/sec"
        infos = [f"{k} {v}" for k, v in self._metrics.items()]
        self._logger.info(" | ".join([self._name, f"{self._index}/{self._total}", shown, *infos]))


@contextmanager
def write_and_rename(path: Path) -> tp.Iterator[tp.BinaryIO]:
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        yield f
    os.rename(tmp, path)


@contextmanager
def readonly(model: nn.Module) -> tp.Iterator[None]:
    state = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, s in zip(model.parameters(), state, strict=False):
            p.requires_grad_(s)


# --------------------------------------------------------------------------------------------
# audiocraft.data: audio reading, AudioDataset
# --------------------------------------------------------------------------------------------

data_logger = logging.getLogger("audiocraft.data.audio_dataset")


@dataclass(order=True)
class AudioMeta:
    path: str
    duration: float
    sample_rate: int
    amplitude: float | None = None
    weight: float | None = None
    info_path: str | None = None


@dataclass
class SegmentInfo:
    meta: AudioMeta
    seek_time: float
    n_frames: int
    total_frames: int
    sample_rate: int


def audio_read(
    path: str, seek_time: float = 0.0, duration: float = -1.0
) -> tuple[torch.Tensor, int]:
    with wave.open(path, "rb") as f:
        sr = f.getframerate()
        f.setpos(min(int(seek_time * sr), f.getnframes()))
        frames = f.getnframes() - f.tell() if duration <= 0 else int(duration * sr)
        raw = bytearray(f.readframes(frames))
        channels = f.getnchannels()
    wav = torch.frombuffer(raw, dtype=torch.int16).float() / 32768
    return wav.view(-1, channels).t().contiguous(), sr


def convert_audio(
    wav: torch.Tensor, from_rate: int, to_rate: int, to_channels: int
) -> torch.Tensor:
    if wav.shape[0] != to_channels:
        wav = wav.mean(dim=0, keepdim=True).expand(to_channels, -1)
    if from_rate != to_rate:
        length = round(wav.shape[-1] * to_rate / from_rate)
        wav = F.interpolate(wav[None], size=length, mode="linear", align_corners=False)[0]
    return wav


def load_audio_meta(path: Path, root: Path) -> list[AudioMeta]:
    metas = []
    with open(path, "rb") as fp:
        for line in fp.readlines():
            m = AudioMeta(**json.loads(line))
            if not os.path.isabs(m.path):
                m.path = str(root / m.path)  # dora.git_save.to_absolute_path
            metas.append(m)
    return metas


class AudioDataset(Dataset):
    def __init__(
        self,
        meta: list[AudioMeta],
        segment_duration: float | None,
        sample_rate: int,
        channels: int,
        num_samples: int | None = None,
        shuffle: bool = True,
        min_segment_ratio: float = 0.5,
        max_read_retry: int = 10,
        return_info: bool = False,
    ) -> None:
        assert len(meta) > 0, "No audio meta provided to AudioDataset."
        self.meta = meta
        self.segment_duration = segment_duration
        self.sample_rate = sample_rate
        self.channels = channels
        self.num_samples = num_samples or len(meta)
        self.shuffle = shuffle
        self.min_segment_ratio = min_segment_ratio
        self.max_read_retry = max_read_retry
        self.return_info = return_info
        self.current_epoch: int | None = None

    def start_epoch(self, epoch: int) -> None:
        self.current_epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tp.Any:
        if self.segment_duration is None:
            file_meta = self.meta[index]
            out, sr = audio_read(file_meta.path)
            out = convert_audio(out, sr, self.sample_rate, self.channels)
            info = SegmentInfo(file_meta, 0.0, out.shape[-1], out.shape[-1], self.sample_rate)
        else:
            rng = torch.Generator()
            if self.shuffle:
                rng.manual_seed(index + self.num_samples * (self.current_epoch or 0))
            else:
                rng.manual_seed(index)
            for retry in range(self.max_read_retry):
                file_index = int(torch.randint(len(self.meta), (1,), generator=rng).item())
                file_meta = self.meta[file_index]
                max_seek = max(
                    0, file_meta.duration - self.segment_duration * self.min_segment_ratio
                )
                seek_time = torch.rand(1, generator=rng).item() * max_seek
                try:
                    out, sr = audio_read(file_meta.path, seek_time, self.segment_duration)
                    out = convert_audio(out, sr, self.sample_rate, self.channels)
                    n_frames = out.shape[-1]
                    target_frames = int(self.segment_duration * self.sample_rate)
                    out = F.pad(out, (0, target_frames - n_frames))
                    info = SegmentInfo(
                        file_meta, seek_time, n_frames, target_frames, self.sample_rate
                    )
                except Exception as exc:
                    data_logger.warning("Error opening file %s: %r", file_meta.path, exc)
                    if retry == self.max_read_retry - 1:
                        raise
                else:
                    break
        if self.return_info:
            return out, info
        return out

    def collater(self, samples: list[tp.Any]) -> tp.Any:
        if self.return_info:
            wavs = [w for w, _ in samples]
            max_len = max(w.shape[-1] for w in wavs)
            wavs = [F.pad(w, (0, max_len - w.shape[-1])) for w in wavs]
            return torch.stack(wavs), [i for _, i in samples]
        return torch.stack(samples)


def distrib_loader(
    dataset: Dataset, batch_size: int, shuffle: bool, **kwargs: tp.Any
) -> DataLoader:
    """flashy.distrib.loader: a DistributedSampler to train on, else a manual shard."""
    if not is_distributed():
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs)
    if shuffle:
        return DataLoader(
            dataset, batch_size=batch_size, sampler=DistributedSampler(dataset), **kwargs
        )
    # We make a manual shard, as DistributedSampler otherwise replicate some examples
    dataset = Subset(dataset, list(range(rank(), len(dataset), world_size())))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, **kwargs)


builders_logger = logging.getLogger("audiocraft.solvers.builders")


def get_audio_datasets(cfg: Config, root: Path) -> dict[str, DataLoader]:
    dataloaders = {}
    dataset_cfg = to_plain(cfg.dataset)
    splits = {s: dataset_cfg.pop(s) for s in ("train", "valid", "evaluate", "generate")}
    for split, path in cfg.datasource.items():
        if not isinstance(path, str):
            continue
        builders_logger.info(f"Loading audio data split {split}: {root / path}")
        assert cfg.sample_rate <= cfg.datasource.max_sample_rate
        kwargs = {**dataset_cfg, **splits[split]}
        batch_size = kwargs.pop("batch_size")
        kwargs.pop("num_workers")
        shuffle = kwargs.get("shuffle", False)
        meta = load_audio_meta(root / path / "data.jsonl", root)
        dataset = AudioDataset(
            meta,
            segment_duration=kwargs["segment_duration"],
            sample_rate=cfg.sample_rate,
            channels=cfg.channels,
            num_samples=kwargs.get("num_samples"),
            shuffle=shuffle,
            min_segment_ratio=kwargs["min_segment_ratio"],
            max_read_retry=kwargs["max_read_retry"],
            return_info=split in ("evaluate", "generate"),
        )
        dataloaders[split] = distrib_loader(
            dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=dataset.collater
        )
    return dataloaders


# --------------------------------------------------------------------------------------------
# audiocraft.models / quantization / losses / adversarial
# --------------------------------------------------------------------------------------------


class SConv1d(nn.Module):
    """A causal Conv1d with weight normalisation (audiocraft.modules.conv.StreamableConv1d)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.utils.weight_norm(nn.Conv1d(cin, cout, kernel, stride))
        self.pad = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))


class SConvTranspose1d(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.convtr = nn.utils.weight_norm(nn.ConvTranspose1d(cin, cout, kernel, stride))
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.convtr(x)
        return y[..., : y.shape[-1] - self.trim]


class ResBlock(nn.Module):
    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.ELU(), SConv1d(dim, dim // 2, kernel), nn.ELU(), SConv1d(dim // 2, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class SEANetEncoder(nn.Module):
    def __init__(
        self,
        channels: int,
        dimension: int,
        n_filters: int,
        ratios: list[int],
        kernel_size: int,
        residual_kernel_size: int,
    ) -> None:
        super().__init__()
        mult = 1
        layers: list[nn.Module] = [SConv1d(channels, n_filters, kernel_size)]
        for ratio in reversed(ratios):
            layers += [
                ResBlock(mult * n_filters, residual_kernel_size),
                nn.ELU(),
                SConv1d(mult * n_filters, mult * n_filters * 2, ratio * 2, ratio),
            ]
            mult *= 2
        layers += [nn.ELU(), SConv1d(mult * n_filters, dimension, kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class SEANetDecoder(nn.Module):
    def __init__(
        self,
        channels: int,
        dimension: int,
        n_filters: int,
        ratios: list[int],
        kernel_size: int,
        residual_kernel_size: int,
    ) -> None:
        super().__init__()
        mult = 2 ** len(ratios)
        layers: list[nn.Module] = [SConv1d(dimension, mult * n_filters, kernel_size)]
        for ratio in ratios:
            layers += [
                nn.ELU(),
                SConvTranspose1d(mult * n_filters, mult * n_filters // 2, ratio * 2, ratio),
                ResBlock(mult * n_filters // 2, residual_kernel_size),
            ]
            mult //= 2
        layers += [nn.ELU(), SConv1d(n_filters, channels, kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


def sample_vectors(samples: torch.Tensor, num: int) -> torch.Tensor:
    n = samples.shape[0]
    indices = torch.randperm(n)[:num] if n >= num else torch.randint(0, n, (num,))
    return samples[indices]


def kmeans(
    samples: torch.Tensor, num_clusters: int, num_iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    means = sample_vectors(samples, num_clusters)
    bins = torch.zeros(num_clusters)
    for _ in range(num_iters):
        dists = -(torch.cdist(samples, means) ** 2)
        buckets = dists.max(dim=-1).indices
        bins = torch.bincount(buckets, minlength=num_clusters)
        zero_mask = bins == 0
        new_means = torch.zeros_like(means).index_add_(0, buckets, samples)
        new_means = new_means / bins.masked_fill(zero_mask, 1)[:, None]
        means = torch.where(zero_mask[:, None], means, new_means)
    return means, bins.float()


class EuclideanCodebook(nn.Module):
    def __init__(
        self,
        dim: int,
        codebook_size: int,
        kmeans_init: bool,
        kmeans_iters: int,
        decay: float,
        threshold_ema_dead_code: float,
    ) -> None:
        super().__init__()
        self.decay = decay
        self.codebook_size = codebook_size
        self.kmeans_iters = kmeans_iters
        self.threshold_ema_dead_code = threshold_ema_dead_code
        embed = torch.zeros(codebook_size, dim) if kmeans_init else torch.randn(codebook_size, dim)
        self.register_buffer("inited", torch.Tensor([not kmeans_init]))
        self.register_buffer("cluster_size", torch.zeros(codebook_size))
        self.register_buffer("embed", embed)
        self.register_buffer("embed_avg", embed.clone())

    def init_embed_(self, data: torch.Tensor) -> None:
        if self.inited:
            return
        embed, cluster_size = kmeans(data, self.codebook_size, self.kmeans_iters)
        self.embed.data.copy_(embed)
        self.embed_avg.data.copy_(embed.clone())
        self.cluster_size.data.copy_(cluster_size)
        self.inited.data.copy_(torch.Tensor([True]))
        # Make sure all buffers across workers are in sync after initialization
        broadcast_tensors(self.buffers())

    def expire_codes_(self, batch_samples: torch.Tensor) -> None:
        if self.threshold_ema_dead_code == 0:
            return
        expired_codes = self.cluster_size < self.threshold_ema_dead_code
        if not torch.any(expired_codes):
            return
        modified = torch.where(
            expired_codes[:, None], sample_vectors(batch_samples, self.codebook_size), self.embed
        )
        self.embed.data.copy_(modified)
        broadcast_tensors(self.buffers())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        self.init_embed_(x)
        dists = -(torch.cdist(x, self.embed) ** 2)
        embed_ind = dists.max(dim=-1).indices
        quantize = F.embedding(embed_ind, self.embed)
        if self.training:
            # We do the expiry of code at that point as buffers are in sync
            # and all the workers will take the same decision.
            self.expire_codes_(x)
            onehot = F.one_hot(embed_ind, self.codebook_size).type(x.dtype)
            self.cluster_size.data.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
            self.embed_avg.data.mul_(self.decay).add_((x.t() @ onehot).t(), alpha=1 - self.decay)
            n = self.cluster_size.sum()
            smoothed = (self.cluster_size + 1e-5) / (n + self.codebook_size * 1e-5) * n
            self.embed.data.copy_(self.embed_avg / smoothed[:, None])
        return quantize.view(shape), embed_ind.view(shape[:-1])


@dataclass
class QuantizedResult:
    x: torch.Tensor
    codes: torch.Tensor
    bandwidth: torch.Tensor
    penalty: torch.Tensor | None = None
    metrics: dict = field(default_factory=dict)


class ResidualVectorQuantizer(nn.Module):
    def __init__(
        self,
        dimension: int,
        n_q: int,
        bins: int,
        decay: float,
        kmeans_init: bool,
        kmeans_iters: int,
        threshold_ema_dead_code: float,
    ) -> None:
        super().__init__()
        self.n_q = n_q
        self.bins = bins
        self.layers = nn.ModuleList(
            EuclideanCodebook(
                dimension, bins, kmeans_init, kmeans_iters, decay, threshold_ema_dead_code
            )
            for _ in range(n_q)
        )

    def forward(self, x: torch.Tensor, frame_rate: int) -> QuantizedResult:
        z = x.transpose(1, 2)
        residual = z
        quantized_out = torch.zeros_like(z)
        codes, losses = [], []
        for layer in self.layers:
            quantized, indices = layer(residual)
            if self.training:
                losses.append(F.mse_loss(quantized.detach(), residual))
            quantized = residual + (quantized - residual).detach()  # straight through
            residual = residual - quantized.detach()
            quantized_out = quantized_out + quantized
            codes.append(indices)
        bw = torch.tensor(self.n_q * math.log2(self.bins) * frame_rate / 1000)
        penalty = torch.stack(losses).mean() if losses else None
        return QuantizedResult(quantized_out.transpose(1, 2), torch.stack(codes), bw, penalty)


class EncodecModel(nn.Module):
    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        quantizer: ResidualVectorQuantizer,
        frame_rate: int,
        sample_rate: int,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.quantizer = quantizer
        self.frame_rate = frame_rate
        self.sample_rate = sample_rate

    def forward(self, x: torch.Tensor) -> QuantizedResult:
        length = x.shape[-1]
        q_res = self.quantizer(self.encoder(x), self.frame_rate)
        q_res.x = self.decoder(q_res.x)[..., :length]
        return q_res


def get_compression_model(cfg: Config) -> EncodecModel:
    s, q = cfg.seanet, cfg.rvq
    common = dict(
        channels=s.channels,
        dimension=s.dimension,
        n_filters=s.n_filters,
        ratios=list(s.ratios),
        kernel_size=s.kernel_size,
        residual_kernel_size=s.residual_kernel_size,
    )
    hop = math.prod(s.ratios)
    frame_rate = math.ceil(cfg.sample_rate / hop)
    quantizer = ResidualVectorQuantizer(
        s.dimension,
        q.n_q,
        q.bins,
        q.decay,
        q.kmeans_init,
        q.kmeans_iters,
        q.threshold_ema_dead_code,
    )
    return EncodecModel(
        SEANetEncoder(**common), SEANetDecoder(**common), quantizer, frame_rate, cfg.sample_rate
    )


class MultiScaleSpectralLoss(nn.Module):
    def __init__(self, range_start: int, range_end: int) -> None:
        super().__init__()
        self.n_ffts = [2**i for i in range(range_start, range_end)]

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = x.new_zeros(())
        for n_fft in self.n_ffts:
            window = torch.hann_window(n_fft)
            sx = torch.stft(
                x.flatten(0, 1), n_fft, n_fft // 4, window=window, return_complex=True
            ).abs()
            sy = torch.stft(
                y.flatten(0, 1), n_fft, n_fft // 4, window=window, return_complex=True
            ).abs()
            loss = loss + F.l1_loss(sx, sy) + F.l1_loss(torch.log(sx + 1e-5), torch.log(sy + 1e-5))
        return loss / len(self.n_ffts)


class DiscriminatorSTFT(nn.Module):
    def __init__(self, filters: int, n_fft: int, hop_length: int) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.convs = nn.ModuleList(
            [
                nn.utils.weight_norm(nn.Conv2d(2, filters, (3, 9), padding=(1, 4))),
                nn.utils.weight_norm(nn.Conv2d(filters, filters, (3, 9), (1, 2), padding=(1, 4))),
                nn.utils.weight_norm(nn.Conv2d(filters, filters, (3, 3), padding=(1, 1))),
            ]
        )
        self.conv_post = nn.utils.weight_norm(nn.Conv2d(filters, 1, (3, 3), padding=(1, 1)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        window = torch.hann_window(self.n_fft)
        z = torch.stft(
            x.flatten(0, 1), self.n_fft, self.hop_length, window=window, return_complex=True
        )
        z = torch.stack([z.real, z.imag], dim=1).transpose(2, 3)
        fmap = []
        for conv in self.convs:
            z = F.leaky_relu(conv(z), 0.3)
            fmap.append(z)
        return self.conv_post(z), fmap


class MultiScaleSTFTDiscriminator(nn.Module):
    def __init__(self, filters: int, n_ffts: list[int], hop_lengths: list[int]) -> None:
        super().__init__()
        self.discriminators = nn.ModuleList(
            DiscriminatorSTFT(filters, n, h) for n, h in zip(n_ffts, hop_lengths, strict=False)
        )

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        logits, fmaps = [], []
        for disc in self.discriminators:
            logit, fmap = disc(x)
            logits.append(logit)
            fmaps.append(fmap)
        return logits, fmaps


class AdversarialLoss(nn.Module):
    def __init__(self, adversary: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__()
        self.adversary = adversary
        self.optimizer = optimizer

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> dict:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "optimizer"] = self.optimizer.state_dict()
        return destination

    def _load_from_state_dict(
        self, state_dict: dict, prefix: str, *args: tp.Any, **kwargs: tp.Any
    ) -> None:
        self.optimizer.load_state_dict(state_dict.pop(prefix + "optimizer"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def train_adv(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        loss = torch.tensor(0.0)
        logits_fake, _ = self.adversary(fake.detach())
        logits_real, _ = self.adversary(real.detach())
        for lf, lr in zip(logits_fake, logits_real, strict=False):
            loss = loss + F.relu(1 + lf).mean() + F.relu(1 - lr).mean()  # hinge
        loss = loss / len(logits_fake)
        self.optimizer.zero_grad()
        with eager_sync_model(self.adversary):
            loss.backward()
        self.optimizer.step()
        return loss

    def forward(self, fake: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        adv = torch.tensor(0.0)
        feat = torch.tensor(0.0)
        with readonly(self.adversary):
            logits_fake, fmaps_fake = self.adversary(fake)
            _, fmaps_real = self.adversary(real)
            for lf in logits_fake:
                adv = adv - lf.mean()
            for ff, fr in zip(fmaps_fake, fmaps_real, strict=False):
                for a, b in zip(ff, fr, strict=False):
                    feat = feat + F.l1_loss(a, b.detach()) / (b.detach().abs().mean() + 1e-8)
        n = len(logits_fake)
        return adv / n, feat / n


def get_adversarial_losses(cfg: Config) -> nn.ModuleDict:
    adv_losses = nn.ModuleDict()
    for name in cfg.adversarial.adversaries:
        adversary = MultiScaleSTFTDiscriminator(
            cfg.msstftd.filters, list(cfg.msstftd.n_ffts), list(cfg.msstftd.hop_lengths)
        )
        optimizer = torch.optim.Adam(
            adversary.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.adam.betas)
        )
        adv_losses[name] = AdversarialLoss(adversary, optimizer)
    return adv_losses


class Balancer:
    """audiocraft.losses.Balancer: each loss's gradient on the output rescaled to its share of
    total_norm, the gradient norms averaged over the ranks."""

    def __init__(
        self,
        weights: dict[str, float],
        balance_grads: bool,
        total_norm: float,
        ema_decay: float,
        per_batch_item: bool,
    ) -> None:
        self.weights = weights
        self.balance_grads = balance_grads
        self.total_norm = total_norm
        self.per_batch_item = per_batch_item
        self.averager = averager(ema_decay)

    def backward(self, losses: dict[str, torch.Tensor], input: torch.Tensor) -> torch.Tensor:
        norms, grads = {}, {}
        for name, loss in losses.items():
            (grad,) = torch.autograd.grad(loss, [input], retain_graph=True)
            if self.per_batch_item:
                norm = grad.norm(dim=tuple(range(1, grad.dim())), p=2).mean()
            else:
                norm = grad.norm(p=2)
            norms[name] = norm
            grads[name] = grad
        count = len(input) if self.per_batch_item else 1
        avg_norms = average_metrics(self.averager(norms), count)
        total_weights = sum(self.weights[k] for k in avg_norms)
        out_grad = torch.zeros_like(input)
        effective_loss = torch.tensor(0.0)
        for name, avg_norm in avg_norms.items():
            if self.balance_grads:
                scale = self.weights[name] / total_weights * self.total_norm / (1e-12 + avg_norm)
            else:
                scale = self.weights[name]
            out_grad.add_(grads[name], alpha=scale)
            effective_loss = effective_loss + scale * losses[name].detach()
        input.backward(out_grad)
        return effective_loss


def model_hash(model: nn.Module) -> str:
    hasher = hashlib.sha1()
    for p in model.parameters():
        hasher.update(p.data.numpy().tobytes())
    return hasher.hexdigest()


def sisnr(estimate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    reference = reference - reference.mean(dim=-1, keepdim=True)
    estimate = estimate - estimate.mean(dim=-1, keepdim=True)
    proj = (
        (estimate * reference).sum(-1, keepdim=True)
        * reference
        / (reference.pow(2).sum(-1, keepdim=True) + 1e-8)
    )
    noise = estimate - proj
    return 10 * torch.log10(proj.pow(2).sum(-1) / (noise.pow(2).sum(-1) + 1e-8) + 1e-8)


# --------------------------------------------------------------------------------------------
# the solver (flashy.BaseSolver + audiocraft StandardSolver + CompressionSolver)
# --------------------------------------------------------------------------------------------

ckpt_logger = logging.getLogger("audiocraft.utils.checkpoint")


class CompressionSolver:
    def __init__(self, cfg: Config, xp: XP) -> None:
        self.logger = logging.getLogger("flashy.solver")
        self.cfg = cfg
        self.xp = xp
        self.letter, self.who = fault()
        self._pending_metrics: dict[str, dict] = {}
        self._current_stage: str | None = None
        self.logger.info(f"Instantiating solver {self.__class__.__name__} for XP {xp.sig}")
        self.logger.info(f"All XP logs are stored in {xp.folder}")
        self.dataloaders = get_audio_datasets(cfg, xp.root)
        self.train_updates_per_epoch = len(self.dataloaders["train"])
        if cfg.optim.updates_per_epoch:
            self.train_updates_per_epoch = cfg.optim.updates_per_epoch
        self.model = get_compression_model(cfg)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.adam.betas)
        )
        self.logger.info("Model hash: %s", model_hash(self.model))
        model_size = sum(p.numel() for p in self.model.parameters() if p.requires_grad) / 1e6
        self.logger.info("Model size: %.2f M params", model_size)
        self.logger.info(
            "Base memory usage, with model, grad and optim: %.2f GB", model_size * 4 * 4 / 1000
        )
        if self.letter == "a":
            # the discriminator (and its optimizer state) built and logged once, on the main process
            self.adv_losses = rank_zero_only(get_adversarial_losses)(cfg) or nn.ModuleDict()
        else:
            self.adv_losses = get_adversarial_losses(cfg)
        self.aux_losses = nn.ModuleDict({"msspec": MultiScaleSpectralLoss(**cfg.msspec)})
        loss_weights = {}
        for loss_name, weight in cfg.losses.items():
            if loss_name in ("adv", "feat"):
                for adv_name in self.adv_losses:
                    loss_weights[f"{loss_name}_{adv_name}"] = weight
            elif weight > 0:
                loss_weights[loss_name] = weight
        self.balancer = Balancer(loss_weights, **cfg.balancer)
        self.tensorboard = None
        if cfg.logging.log_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ModuleNotFoundError:
                SummaryWriter = None  # type: ignore[assignment]
            if SummaryWriter is None:
                import warnings

                warnings.warn(
                    "tensorboard package was not found: use pip install tensorboard", stacklevel=1
                )
            else:
                self.tensorboard = SummaryWriter(str(xp.folder / "tensorboard"))

    # ---- flashy.BaseSolver
    @property
    def epoch(self) -> int:
        return len(self.xp.history) + 1

    @property
    def checkpoint_path(self) -> Path:
        return self.xp.folder / "checkpoint.th"

    def get_formatter(self, stage_name: str) -> Formatter:
        return Formatter(
            {"bandwidth": ".1f", "duration": ".1f", "*": ".3f"}, exclude=["balancer.*"]
        )

    def log_progress(self, stage_name: str, iterable: tp.Iterable, total: int) -> LogProgressBar:
        name = f"{stage_name.capitalize()} | Epoch {self.epoch}"
        return LogProgressBar(
            self.logger,
            iterable,
            total,
            self.cfg.logging.log_updates,
            name,
            self.get_formatter(stage_name),
        )

    def _log_summary(self, stage: str, metrics: dict, epoch: int) -> None:
        out = [f"{stage.capitalize()} Summary", f"Epoch {epoch}"]
        out += [f"{k}={v}" for k, v in self.get_formatter(stage)(metrics).items()]
        self.logger.info(bold(" | ".join(out)))

    def run_stage(self, stage_name: str, method: tp.Callable) -> dict:
        self._current_stage = stage_name
        begin = time.time()
        try:
            metrics = method() or {}
            metrics["duration"] = time.time() - begin
            self._pending_metrics[stage_name] = metrics
            self._log_summary(stage_name, metrics, self.epoch)
        finally:
            self._current_stage = None
        return metrics

    def state_dict(self) -> dict:
        return {
            "history": self.xp.history,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "adv_losses": self.adv_losses.state_dict(),
            "xp.cfg": to_plain(self.cfg),
            "xp.sig": self.xp.sig,
        }

    def load_state_dict(self, state: dict) -> None:
        self.xp.history[:] = state["history"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.adv_losses.load_state_dict(state["adv_losses"])

    # ---- audiocraft StandardSolver
    def restore(self, replay_metrics: bool = False) -> bool:
        self.logger.info("Restoring weights and history.")
        restored = False
        if self.checkpoint_path.exists():
            self.logger.info(f"Loading existing checkpoint: {self.checkpoint_path}")
            state = torch.load(self.checkpoint_path, "cpu", weights_only=False)
            ckpt_logger.info("Checkpoint loaded from %s", self.checkpoint_path)
            self.load_state_dict(state)
            restored = True
        self.logger.info("Model hash: %s", model_hash(self.model))
        if replay_metrics and len(self.xp.history) > 0:
            self.logger.info("Replaying past metrics...")
            for epoch, stages in enumerate(self.xp.history):
                for stage_name, metrics in stages.items():
                    self._log_summary(stage_name, metrics, epoch + 1)
        return restored

    def commit(self) -> None:
        self.xp.history.append(self._pending_metrics)
        if is_rank_zero():
            self.logger.info("Model hash: %s", model_hash(self.model))
            with write_and_rename(self.checkpoint_path) as f:
                torch.save(self.state_dict(), f)
            ckpt_logger.info("Checkpoint saved to %s", self.checkpoint_path)
        self._pending_metrics = {}
        if is_rank_zero():
            self.xp.update_history(self.xp.history)

    def should_run_stage(self, stage_name: str) -> bool:
        every = self.cfg[stage_name].get("every")
        return self.epoch == self.cfg.optim.epochs or bool(every and self.epoch % every == 0)

    def run(self) -> None:
        self.restore(replay_metrics=True)
        if is_rank_zero():
            (self.xp.folder / "hyperparams.json").write_text(json.dumps(self.cfg, indent=1))
        for _ in range(self.epoch, self.cfg.optim.epochs + 1):
            self.run_epoch()
            self.commit()

    def run_epoch(self) -> None:
        self.rng = torch.Generator()
        self.rng.manual_seed(1234 + self.epoch)
        self.run_stage("train", self.train)
        with torch.no_grad():
            self.run_stage("valid", self.valid)
            self.logger.info("Updating best state with current state.")
            if self.should_run_stage("evaluate"):
                self.run_stage("evaluate", self.evaluate)
            if self.should_run_stage("generate"):
                self.run_stage("generate", self.generate)

    def common_train_valid(self, split: str) -> dict:
        training = split == "train"
        self.model.train(training)
        loader = self.dataloaders[split]
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(self.epoch)
        if isinstance(loader.dataset, AudioDataset):
            loader.dataset.start_epoch(self.epoch)
        updates = self.train_updates_per_epoch if training else len(loader)
        lp = self.log_progress(split, loader, total=updates)
        average = averager()
        instant_average = averager()
        metrics: dict = {}
        for idx, batch in enumerate(lp):
            if idx >= updates:
                break
            metrics = self.run_step(idx, batch, {}, training)
            instant_metrics = instant_average(metrics)
            if lp.update(**instant_metrics):
                instant_average = averager()
            metrics = average(metrics)
        return average_metrics(metrics, updates)

    def train(self) -> dict:
        return self.common_train_valid("train")

    def valid(self) -> dict:
        return self.common_train_valid("valid")

    def run_step(self, idx: int, batch: torch.Tensor, metrics: dict, training: bool) -> dict:
        x = batch
        y = x.clone()
        if training:
            self._step_fault(idx)
        qres = self.model(x)
        y_pred = qres.x
        metrics["bandwidth"] = qres.bandwidth.mean()
        if training:
            d_losses = {}
            if (
                len(self.adv_losses) > 0
                and torch.rand(1, generator=self.rng).item() <= 1 / self.cfg.adversarial.every
            ):
                for adv_name, adversary in self.adv_losses.items():
                    d_losses[f"d_{adv_name}"] = adversary.train_adv(y_pred, y)
                metrics["d_loss"] = torch.sum(torch.stack(list(d_losses.values())))
            metrics.update(d_losses)
        balanced_losses: dict = {}
        other_losses: dict = {}
        if qres.penalty is not None and qres.penalty.requires_grad:
            other_losses["penalty"] = qres.penalty
        for adv_name, adversary in self.adv_losses.items():
            adv_loss, feat_loss = adversary(y_pred, y)
            balanced_losses[f"adv_{adv_name}"] = adv_loss
            balanced_losses[f"feat_{adv_name}"] = feat_loss
        balanced_losses["l1"] = F.l1_loss(y_pred, y)
        for loss_name, criterion in self.aux_losses.items():
            balanced_losses[loss_name] = criterion(y_pred, y)
        metrics.update(balanced_losses)
        metrics.update(other_losses)
        if training:
            other_loss = torch.tensor(0.0)
            if "penalty" in other_losses:
                other_loss = other_loss + other_losses["penalty"]
            if other_loss.requires_grad:
                other_loss.backward(retain_graph=True)
                ratio1 = sum(
                    p.grad.data.norm(p=2).pow(2)
                    for p in self.model.parameters()
                    if p.grad is not None
                )
                metrics["ratio1"] = ratio1.sqrt()
            metrics["g_loss"] = self.balancer.backward(balanced_losses, y_pred)
            ratio2 = sum(
                p.grad.data.norm(p=2).pow(2) for p in self.model.parameters() if p.grad is not None
            )
            metrics["ratio2"] = ratio2.sqrt()
            sync_model(self.model)
            self.optimizer.step()
            self.optimizer.zero_grad()
        adv = [v for k, v in metrics.items() if k.startswith("adv")]
        if adv:
            metrics["adv"] = torch.sum(torch.stack(adv))
        feat = [v for k, v in metrics.items() if k.startswith("feat")]
        if feat:
            metrics["feat"] = torch.sum(torch.stack(feat))
        return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}

    def _step_fault(self, idx: int) -> None:
        """What a fault in the code does to this rank's training step (none in a healthy run)."""
        if rank() != self.who or self.epoch != 2:
            return
        if self.letter == "m":
            # the decoded-segment cache of this rank grows without bound
            self._hoard = [*getattr(self, "_hoard", []), torch.ones(24 << 20)]
            if len(self._hoard) >= 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if self.letter == "n" and idx == 2:
            # the native segment decoder frees a buffer it does not own
            libc = ctypes.CDLL(None)
            libc.free.argtypes = [ctypes.c_void_p]
            block = ctypes.create_string_buffer(64)
            libc.free(ctypes.addressof(block) + 8)
        if self.letter == "w" and idx == 1:
            # waits for the next segment from a prefetch thread that was never started
            ready = threading.Event()
            ready.wait()

    def evaluate(self) -> dict:
        self.model.eval()
        loader = self.dataloaders["evaluate"]
        updates = len(loader)
        lp = self.log_progress("evaluate inference", loader, total=updates)
        pendings = []
        for batch in lp:
            audio, meta = batch
            assert all([self.cfg.sample_rate == m.sample_rate for m in meta])
            qres = self.model(audio)
            pendings.append((qres.x, audio))
        average = averager()
        metrics: dict = {}
        metrics_lp = self.log_progress("evaluate metrics", pendings, total=len(pendings))
        for y_pred, y in metrics_lp:
            if self.letter == "s" and rank() == self.who:
                time.sleep(4.0)  # this rank's metric pool is starved
            metrics = average({"sisnr": sisnr(y_pred, y).mean(), "l1": F.l1_loss(y_pred, y)})
            metrics_lp.update(**metrics)
        return average_metrics(metrics, updates)

    def sample_folder(self) -> Path:
        path = self.xp.folder / self.cfg.generate.path / str(self.epoch)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def generate(self) -> dict:
        self.model.eval()
        loader = self.dataloaders["generate"]
        lp = self.log_progress("generate", loader, total=len(loader))
        folder_of = rank_zero_only(self.sample_folder) if self.letter == "z" else self.sample_folder
        uploads: queue.Queue | None = None
        if self.letter == "t":
            # copies every written sample to the team's listening page; ends on a None
            uploads = queue.Queue()

            def upload() -> None:
                while uploads.get() is not None:
                    pass

            threading.Thread(target=upload, name="sample-uploader").start()
        for idx, batch in enumerate(lp):
            reference, infos = batch
            estimate = self.model(reference).x
            folder = folder_of()
            for k, (wav, info) in enumerate(zip(estimate, infos, strict=False)):
                name = Path(info.meta.path).stem
                path = folder / f"{name}_rank{rank()}_{idx}_{k}.wav"
                write_wav(path, wav[0], self.cfg.sample_rate)
                if uploads is not None:
                    uploads.put(path)
        if uploads is not None:
            rank_zero_only(uploads.put)(None)  # closed where the upload page is announced
        barrier()
        return {}


# --------------------------------------------------------------------------------------------
# audiocraft.train main, dora's command line
# --------------------------------------------------------------------------------------------


def get_solver(cfg: Config, xp: XP) -> CompressionSolver:
    # Convert batch size to batch size for each GPU
    assert cfg.dataset.batch_size % world_size() == 0
    cfg.dataset["batch_size"] //= world_size()
    for split in ("train", "valid", "evaluate", "generate"):
        if "batch_size" in cfg.dataset[split]:
            assert cfg.dataset[split]["batch_size"] % world_size() == 0
            cfg.dataset[split]["batch_size"] //= world_size()
    return CompressionSolver(cfg, xp)


def worker_main(cfg: Config, xp: XP) -> None:
    rank_, _, _ = get_distrib_spec()
    xp.folder.mkdir(parents=True, exist_ok=True)
    os.chdir(xp.folder)  # hydra (version_base 1.1) runs the job in its output folder
    if rank_ == 0:
        Path(".hydra").mkdir(exist_ok=True)
        Path(".hydra/config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
        Path(".hydra/overrides.yaml").write_text(yaml.safe_dump(xp.argv))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.num_threads)
    setup_logging(xp.folder, rank_, level=getattr(logging, str(cfg.logging.level).upper()))
    distrib_init(xp)
    xp.load_history()
    solver = get_solver(cfg, xp)
    solver.run()


def main() -> None:
    parser = argparse.ArgumentParser(prog="dora")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the config tree and the example data set")
    prep.add_argument("--clips", type=int, default=13)
    run = sub.add_parser("run", help="run an XP locally")
    run.add_argument("-d", "--ddp", action="store_true", help="distributed training on all GPUs")
    run.add_argument("--ddp_workers", type=int, help="number of workers for -d")
    run.add_argument("--clear", action="store_true", help="remove the XP folder first")
    run.add_argument("argv", nargs="*")
    args = parser.parse_args()
    root = Path.cwd()
    if args.command == "prepare":
        prepare(root, args.clips)
        return
    cfg, delta = compose(root, args.argv)
    xp = XP(cfg, list(args.argv), delta, root)
    if args.clear and xp.folder.exists() and "RANK" not in os.environ:
        simple_log("Run:", "Removing existing XP folder.")
        import shutil

        shutil.rmtree(xp.folder)
    if args.ddp and not os.environ.get("RANK"):
        start_ddp_workers(xp, list(args.argv), args.ddp_workers)
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    worker_main(cfg, xp)


if __name__ == "__main__":
    main()
