"""A hundred-and-fortieth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortieth-*): speaker-diarization (segmentation) training with
pyannote.audio 3.1's `pyannote-audio-train` (a Hydra app over pyannote's Model/Task classes and
PyTorch Lightning's Trainer), re-created in plain torch and the standard library in one module
without pyannote, hydra, lightning, tqdm or soundfile. Linked into a run's folder as
pyannote_audio.py (the folder is on PYTHONPATH, as site-packages is for the package), with a
`pyannote-audio-train` console script that calls train(). Started as pyannote's tutorial starts
it:

    pyannote-audio-train +registry=database.yml protocol=Debug.SpeakerDiarization.Debug \
        task=SpeakerDiarization model=PyanNet trainer.devices=2 trainer.strategy=ddp \
        trainer.max_epochs=2 [key=value ...]

As there: Hydra composes the config (the defaults, then the overrides; `+key=value` adds a key),
makes outputs/YYYY-MM-DD/HH-MM-SS the job's folder, writes .hydra/config.yaml, hydra.yaml and
overrides.yaml there, changes into it, and logs with its job-logging format '[%(asctime)s]
[%(name)s][%(levelname)s] - %(message)s' to the console and to <job name>.log. The protocol comes
from the registry (database.yml: uris, wav paths, rttm annotations); the task is the
SpeakerDiarization task (1 s chunks, at most 3 speakers a chunk and 2 a frame, the powerset
multi-class loss), the model PyanNet (a strided sinc-like conv front end, an LSTM, a linear layer
and the 7-class powerset classifier). In trainer.fit, as Lightning's _SubprocessScriptLauncher
does under Hydra, the first process re-executes the same command line for every other local rank
with LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set and 'hydra.run.dir=<same
folder>' 'hydra.job.name=train_ddp_process_K' 'hydra.output_subdir=null' appended (the children
log to the same console and to train_ddp_process_K.log), and its 'child-process-observer' thread
kills every process when a child ends with a non-zero code. Every rank logs 'Initializing
distributed: GLOBAL_RANK: 1, MEMBER: 2/2' and joins a gloo group (15 s timeout); rank 0 runs
prepare_data (the audio files' metadata, read from their headers with a soundfile-like reader),
every rank setup; training chunks are drawn at random from every file with a generator seeded by
(seed, epoch, global rank, worker), read with soundfile-like partial reads, and collated in a
DataLoader worker; validation chunks are fixed and sharded with a DistributedSampler, and the
DiarizationErrorRate metric is summed over ranks. Rank 0 prints the model summary, a tqdm-like
bar ('Epoch 0:  40%|####      | 2/5 [00:01<00:01,  1.95it/s, v_num=0, loss=0.693]'), the
ModelCheckpoint lines ("[rank: 0] Epoch 0, global step 5: 'DiarizationErrorRate' reached ...")
and EarlyStopping's. SIGTERM is handled as Lightning's signal connector does.

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed. `python pyannote_audio.py --prepare DIR` writes the synthetic Debug corpus (16 kHz WAV
files with 2-3 speakers, their RTTM files) and database.yml.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import json
import logging
import math
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import typing as tp
import warnings
import wave
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler

__version__ = "3.1.1"
SAMPLE_RATE = 16000
CASE = os.environ.get("TQ_CASE", "")
LETTER, WHO = (CASE[:1], int(CASE[1:]) if CASE[1:] else -1) if CASE else ("", -1)
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
CREATES_PROCESSES_EXTERNALLY = "LOCAL_RANK" in os.environ


def fault(letter: str, rank: int) -> bool:
    return letter == LETTER and (WHO < 0 or rank == WHO)


# ---------------------------------------------------------------- hydra (compose, run dir, logs)
DEFAULTS: dict[str, tp.Any] = {
    "protocol": None,
    "registry": None,
    "task": {
        "_target_": "pyannote.audio.tasks.SpeakerDiarization",
        "duration": 1.0,
        "max_speakers_per_chunk": 3,
        "max_speakers_per_frame": 2,
        "batch_size": 5,
        "num_workers": 1,
        "pin_memory": False,
        "augmentation": None,
    },
    "model": {"_target_": "pyannote.audio.models.segmentation.PyanNet", "lstm": {"hidden": 16}},
    "optimizer": {"_target_": "torch.optim.Adam", "lr": 0.001},
    "trainer": {
        "accelerator": "cpu",
        "devices": 1,
        "strategy": "auto",
        "max_epochs": 1000,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
        "seed": 0,
    },
    "patience": 100,
    "ckpt_path": None,
    "hydra": {
        "run": {"dir": "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"},
        "job": {"name": "train", "chdir": True},
        "output_subdir": ".hydra",
    },
}


def parse_value(text: str) -> tp.Any:
    text = text.strip('"')
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"null": None, "true": True, "false": False}.get(text.lower(), text)


def compose(argv: list[str]) -> tuple[dict[str, tp.Any], list[str]]:
    cfg = json.loads(json.dumps(DEFAULTS))
    overrides = []
    for arg in argv:
        key, _, value = arg.partition("=")
        overrides.append(arg)
        adding = key.startswith("+")
        node = cfg
        parts = key.lstrip("+").split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if not adding and parts[-1] not in node:
            raise SystemExit(
                f"Could not override '{key}'.\nTo append to your config use +{key}={value}\n"
                f"Key '{parts[-1]}' is not in struct\n    full_key: {key}\n    object_type=dict\n"
                "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
            )
        if key in ("task", "model"):  # a config group: task=SpeakerDiarization
            continue
        node[parts[-1]] = parse_value(value)
    return cfg, overrides


def to_yaml(d: tp.Any, indent: int = 0) -> str:
    if not isinstance(d, dict):
        return f"{'null' if d is None else d}\n"
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:\n" + to_yaml(v, indent + 2))
        else:
            out.append(" " * indent + f"{k}: {to_yaml(v).strip()}\n")
    return "".join(out)


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        t = datetime.datetime.fromtimestamp(record.created)
        return t.strftime("%Y-%m-%d %H:%M:%S") + f",{int(record.msecs):03d}"


def configure_job_logging(log_file: Path) -> None:
    fmt = _Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in (logging.StreamHandler(sys.stdout), logging.FileHandler(log_file)):
        h.setFormatter(fmt)
        root.addHandler(h)
    logging.captureWarnings(False)


class RankZero:
    rank = int(os.environ.get("LOCAL_RANK", 0)) + int(os.environ.get("NODE_RANK", 0))


pl_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
fabric_log = logging.getLogger("lightning.fabric.utilities.distributed")
cb_log = logging.getLogger("lightning.pytorch.callbacks.model_checkpoint")
es_log = logging.getLogger("lightning.pytorch.callbacks.early_stopping")
pa_log = logging.getLogger("pyannote.audio.cli.train")


def rank_zero_info(msg: str, log: logging.Logger = pl_log) -> None:
    if RankZero.rank == 0:
        log.info(msg)


def rank_zero_warn(msg: str, category: type[Warning] = UserWarning) -> None:
    if RankZero.rank == 0:
        warnings.warn(msg, category, stacklevel=2)


class PossibleUserWarning(UserWarning):
    pass


# ---------------------------------------------------------------- soundfile-like audio I/O
class LibsndfileError(RuntimeError):
    pass


@dataclasses.dataclass
class _Info:
    samplerate: int
    frames: int
    channels: int

    @property
    def duration(self) -> float:
        return self.frames / self.samplerate


def sf_info(path: str) -> _Info:
    with open(path, "rb") as f:
        head = f.read(44)
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise LibsndfileError(f"Error opening {path!r}: Format not recognised.")
    channels, rate = struct.unpack("<HI", head[22:28])
    size = struct.unpack("<I", head[40:44])[0]
    return _Info(rate, size // (2 * channels), channels)


def sf_read(path: str, start: int, frames: int) -> torch.Tensor:
    """(channel, frames) float32 of a partial read: seek, read; fewer frames at the file's end."""
    sf_info(path)
    with open(path, "rb") as f:
        f.seek(44 + 2 * start)
        data = f.read(2 * frames)
    pcm = torch.frombuffer(bytearray(data), dtype=torch.int16) if data else torch.zeros(0)
    return (pcm.float() / 32768.0).view(1, -1)


def write_wav(path: Path, wav: torch.Tensor) -> None:
    pcm = (wav.clamp(-1, 1) * 32767).to(torch.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(struct.pack(f"<{pcm.numel()}h", *pcm.tolist()))


# ---------------------------------------------------------------- pyannote.database (registry)
def load_database(path: str) -> dict[str, tp.Any]:
    """database.yml, as the registry reads it: Databases.Debug (a wav template) and Protocols."""
    text = Path(path).read_text()
    db: dict[str, tp.Any] = {"files": {}, "subsets": {}}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Debug:") and line.startswith("  ") and "wav" not in db:
            db["wav"] = s.split(":", 1)[1].strip()
        for subset in ("train", "development", "test"):
            if s.startswith(f"{subset}:"):
                section = subset
                db["subsets"][subset] = {}
        if section and s.startswith(("uri:", "annotation:")):
            k, v = s.split(":", 1)
            db["subsets"][section][k] = v.strip()
    db["root"] = str(Path(path).resolve().parent)
    return db


def protocol_files(db: dict[str, tp.Any], subset: str) -> list[dict[str, tp.Any]]:
    root = Path(db["root"])
    uris = (root / db["subsets"][subset]["uri"]).read_text().split()
    rttm = (root / db["subsets"][subset]["annotation"]).read_text().splitlines()
    files = []
    for uri in uris:
        segs = []
        for row in rttm:
            f = row.split()
            if f[1] == uri:
                segs.append((float(f[3]), float(f[3]) + float(f[4]), f[7]))
        files.append({"uri": uri, "audio": str(root / db["wav"].format(uri=uri)), "segs": segs})
    return files


# ---------------------------------------------------------------- the task and its data
@dataclasses.dataclass
class Specifications:
    problem: str
    resolution: str
    duration: float
    classes: list[str]
    powerset_max_classes: int
    permutation_invariant: bool = True


POWERSET = [(), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]
FRAMES = 100  # the model's frames in a 1 s chunk


def chunk_plan(
    n_files: int, weights: list[float], seed: int, epoch: int, rank: int, n: int
) -> list[tuple[int, float]]:
    """The (file, start) of each training chunk a rank's worker draws in an epoch."""
    rng = random.Random(f"{seed}-{epoch}-{rank}-0")
    out = []
    for _ in range(n):
        i = rng.choices(range(n_files), weights=weights)[0]
        out.append((i, rng.uniform(0, weights[i] - 1.0)))
    return out


def target(segs: list[tuple[float, float, str]], start: float, duration: float) -> torch.Tensor:
    speakers: list[str] = []
    active = torch.zeros(FRAMES, 3)
    for s, e, spk in sorted(segs):
        if e <= start or s >= start + duration:
            continue
        if spk not in speakers:
            speakers.append(spk)
        k = speakers.index(spk)
        if k >= 3:
            continue
        a = max(0, int((s - start) / duration * FRAMES))
        b = min(FRAMES, int((e - start) / duration * FRAMES))
        active[a:b, k] = 1
    y = torch.zeros(FRAMES, dtype=torch.long)
    for t in range(FRAMES):
        on = tuple(int(k) for k in active[t].nonzero().flatten().tolist())[:2]
        y[t] = POWERSET.index(on)
    return y


class TrainDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, task: SpeakerDiarization) -> None:
        self.task = task

    def __iter__(self) -> tp.Iterator[tuple[torch.Tensor, torch.Tensor]]:
        t = self.task
        info = get_worker_info()
        assert info is None or info.id == 0
        durations = [f["duration"] for f in t.train_files]
        plan = chunk_plan(len(durations), durations, t.seed, t.epoch, t.rank, t.chunks_per_rank)
        for i, start in plan:
            f = t.train_files[i]
            if fault("s", t.rank) and t.epoch >= 1:
                time.sleep(5.0)  # the rank's audio on a mount that stalls (an NFS server's hiccup)
            if fault("w", t.rank) and t.epoch >= 1:
                threading.Event().wait()  # the worker blocks for good (a lock held at fork)
            x = sf_read(f["audio"], int(start * SAMPLE_RATE), int(t.duration * SAMPLE_RATE))
            x = t.augment(x)
            yield x, target(f["segs"], start, t.duration)


class ValDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, task: SpeakerDiarization) -> None:
        self.items = [(f, float(s)) for f in task.dev_files for s in range(int(f["duration"]))]
        self.task = task

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        f, s = self.items[i]
        x = sf_read(f["audio"], int(s * SAMPLE_RATE), SAMPLE_RATE)
        return x, target(f["segs"], s, 1.0)


def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])


class SpeakerDiarization:
    def __init__(self, protocol: str, db: dict[str, tp.Any], cfg: dict[str, tp.Any]) -> None:
        self.protocol, self.db = protocol, db
        self.duration = float(cfg["duration"])
        self.batch_size = int(cfg["batch_size"])
        self.num_workers = int(cfg["num_workers"])
        self.augmentation = cfg.get("augmentation")
        self.specifications = Specifications(
            "MONO_LABEL_CLASSIFICATION", "FRAME", self.duration,
            ["speaker#1", "speaker#2", "speaker#3"], cfg["max_speakers_per_frame"],
        )  # fmt: skip
        self.seed, self.epoch, self.rank, self.world = 0, 0, 0, 1
        self.noise: list[torch.Tensor] = []

    def prepare_data(self) -> None:
        """Rank 0: every file's metadata, from its header (the protocol's cache)."""
        for subset in ("train", "development"):
            files = protocol_files(self.db, subset)
            for f in files:
                f["duration"] = sf_info(f["audio"]).duration
            Path(f".{subset}.cache.json").write_text(json.dumps(files))

    def setup(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.train_files = json.loads(Path(".train.cache.json").read_text())
        self.dev_files = json.loads(Path(".development.cache.json").read_text())
        total = sum(f["duration"] for f in self.train_files)
        if fault("u", -1):  # a fork: each rank counts the chunks of its own shard of the files
            mine = self.train_files[rank::world]
            total = sum(f["duration"] for f in mine) * world
        self.chunks_per_rank = math.ceil(total / self.duration / world)
        if self.augmentation:
            g = torch.Generator().manual_seed(7)
            lengths = [2.0, 1.5, 3.0] + ([0.5] if fault("n", rank) else [])
            self.noise = [torch.randn(1, int(s * SAMPLE_RATE), generator=g) * 0.05 for s in lengths]

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """AddBackgroundNoise(p=0.5): a clip of the noise bank added at a random gain."""
        if not self.noise or random.random() > 0.5:
            return x
        noise = random.choice(self.noise)
        return x + random.uniform(0.2, 1.0) * noise[:, : x.shape[-1]]

    def train_dataloader(self) -> DataLoader[tp.Any]:
        return DataLoader(TrainDataset(self), batch_size=self.batch_size,
                          num_workers=self.num_workers, collate_fn=collate)  # fmt: skip

    def val_dataloader(self) -> DataLoader[tp.Any]:
        ds = ValDataset(self)
        sampler: DistributedSampler[int] = DistributedSampler(
            ds, self.world, self.rank, shuffle=False
        )
        return DataLoader(ds, batch_size=self.batch_size, sampler=sampler, collate_fn=collate)


# ---------------------------------------------------------------- the model
class SincNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wav_norm1d = nn.InstanceNorm1d(1, affine=True)
        self.conv1d = nn.Conv1d(1, 8, 251, stride=160, padding=125)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = F.leaky_relu(self.conv1d(self.wav_norm1d(x)))
        return out[..., :FRAMES]


class PyanNet(nn.Module):
    def __init__(self, task: SpeakerDiarization, hidden: int) -> None:
        super().__init__()
        self.specifications = task.specifications
        self.sincnet = SincNet()
        self.lstm = nn.LSTM(8, hidden, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(2 * hidden, hidden)
        self.classifier = nn.Linear(hidden, len(POWERSET))
        self.activation = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.sincnet(x).transpose(1, 2))
        out: torch.Tensor = self.activation(self.classifier(F.leaky_relu(self.linear(h))))
        return out


# ---------------------------------------------------------------- Lightning's pieces
class SIGTERMException(SystemExit):
    """Raised by the loops once SIGTERM was received (exits 1 without a traceback)."""


def rank_prefixed(msg: str, rank: int | None) -> str:
    return f"[rank: {rank}] {msg}" if rank is not None else msg


class ChildProcessObserver(threading.Thread):
    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        super().__init__(daemon=True, name="child-process-observer")
        self.procs, self.main_pid = procs, os.getpid()

    def run(self) -> None:
        while True:
            time.sleep(5)
            for p in self.procs:
                p.poll()
            codes = [p.returncode for p in self.procs]
            if all(c == 0 for c in codes):
                return
            for i, p in enumerate(self.procs):
                if p.returncode:
                    fabric_log.info(rank_prefixed(
                        f"Child process with PID {p.pid} terminated with code {p.returncode}. "
                        "Forcefully terminating all other processes to avoid zombies 🧟", i + 1
                    ))  # fmt: skip
                    for q in self.procs:
                        q.send_signal(signal.SIGKILL)
                    os.kill(self.main_pid, signal.SIGKILL)
                    return


def find_free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


class ProgressBar:
    """Lightning's TQDMProgressBar line as tqdm draws it: '\\r'-refreshed on stdout."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.desc, self.total, self.n, self.postfix = "", 0, 0, ""

    def reset(self, desc: str, total: int) -> None:
        self.desc, self.total, self.n, self.t0 = desc, total, 0, time.monotonic()

    def update(self, n: int, postfix: str) -> None:
        self.n, self.postfix = n, postfix
        el = time.monotonic() - self.t0
        rate = self.n / el if el > 0 else 0.0
        rem = (self.total - self.n) / rate if rate else 0.0
        frac = self.n / max(self.total, 1)
        fill = int(frac * 10)
        bar = "█" * fill + " " * (10 - fill)

        def mm(s: float) -> str:
            return f"{int(s) // 60:02d}:{int(s) % 60:02d}"

        sys.stdout.write(
            f"\r{self.desc}: {int(frac * 100):3d}%|{bar}| {self.n}/{self.total} "
            f"[{mm(el)}<{mm(rem)}, {rate:5.2f}it/s{', ' + postfix if postfix else ''}]"
        )
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()


class Trainer:
    def __init__(self, cfg: dict[str, tp.Any], patience: int) -> None:
        self.devices = int(cfg["devices"])
        self.max_epochs = int(cfg["max_epochs"])
        self.log_every_n_steps = int(cfg["log_every_n_steps"])
        self.seed = int(cfg["seed"])
        self.local_rank = LOCAL_RANK
        self.node_rank = int(os.environ.get("NODE_RANK", 0))
        self.world_size = self.devices
        self.global_rank = self.node_rank * self.devices + self.local_rank
        self.patience = patience
        self.procs: list[subprocess.Popen[bytes]] = []
        self.received_sigterm = self.should_stop = False
        self.epoch = self.global_step = 0
        self.best: float | None = None
        self.wait = 0
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("TPU available: False, using: 0 TPU cores")
        rank_zero_info("HPU available: False, using: 0 HPUs")

    def launch_children(self) -> None:
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(find_free_port())
        os.environ["NODE_RANK"] = str(self.node_rank)
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.world_size)
        for local_rank in range(1, self.devices):
            env = dict(os.environ, LOCAL_RANK=str(local_rank))
            command = [sys.executable, os.path.abspath(ORIGINAL_ARGV0), *sys.argv[1:]]
            command += [f'hydra.run.dir="{os.getcwd()}"',
                        f"hydra.job.name=train_ddp_process_{local_rank}", "hydra.output_subdir=null"]  # fmt: skip
            self.procs.append(subprocess.Popen(command, env=env, cwd=ORIGINAL_CWD))
        if self.procs:
            ChildProcessObserver(self.procs).start()

    def sigterm_handler(self, signum: int, _frame: tp.Any) -> None:
        pl_log.info(rank_prefixed(f"Received SIGTERM: {signum}", self.global_rank))
        if not self.received_sigterm:
            for p in self.procs:
                p.send_signal(signum)
        self.received_sigterm = True

    def fit(self, module: PyanNet, task: SpeakerDiarization, ckpt_path: str | None) -> None:
        if not CREATES_PROCESSES_EXTERNALLY and self.devices > 1:
            self.launch_children()
        RankZero.rank = self.global_rank
        fabric_log.info(
            f"Initializing distributed: GLOBAL_RANK: {self.global_rank}, MEMBER: "
            f"{self.global_rank + 1}/{self.world_size}"
        )
        dist.init_process_group("gloo", rank=self.global_rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=15))  # fmt: skip
        rank_zero_info(
            f"{'-' * 100}\ndistributed_backend=gloo\nAll distributed processes registered. "
            f"Starting with {self.world_size} processes\n{'-' * 100}\n",
            fabric_log,
        )
        signal.signal(signal.SIGTERM, self.sigterm_handler)
        torch.manual_seed(self.seed)
        if self.global_rank == 0:
            task.prepare_data()
        dist.barrier()
        task.setup(self.global_rank, self.world_size)
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        if ckpt_path:
            rank_zero_info(f"Restoring states from the checkpoint path at {ckpt_path}")
            ckpt = torch.load(ckpt_path, map_location="cpu")  # weights_only: torch's default
            module.load_state_dict(ckpt["state_dict"])
            optimizer.load_state_dict(ckpt["optimizer_states"][0])
            self.epoch = ckpt["epoch"] + 1
            self.global_step = ckpt["global_step"]
            rank_zero_info(f"Restored all states from the checkpoint at {ckpt_path}")
        self.model = DDP(module)
        self.summary(module)
        train_loader, val_loader = task.train_dataloader(), task.val_dataloader()
        batches = math.ceil(task.chunks_per_rank / task.batch_size)
        if task.num_workers == 0:
            rank_zero_warn(
                "The 'train_dataloader' does not have many workers which may be a bottleneck. "
                "Consider increasing the value of the `num_workers` argument` to `num_workers=1` "
                "in the `DataLoader` to improve performance.",
                PossibleUserWarning,
            )
        if batches < self.log_every_n_steps:
            rank_zero_warn(
                f"The number of training batches ({batches}) is smaller than the logging interval "
                f"Trainer(log_every_n_steps={self.log_every_n_steps}). Set a lower value for "
                "log_every_n_steps if you want to see logs for the training epoch.",
                PossibleUserWarning,
            )
        bar = ProgressBar() if self.global_rank == 0 else None
        loss_shown = ""
        hoard: list[torch.Tensor] = []
        while self.epoch < self.max_epochs and not self.should_stop:
            task.epoch = self.epoch
            if bar:
                bar.reset(f"Epoch {self.epoch}", batches)
            module.train()
            for i, (x, y) in enumerate(train_loader):
                if fault("m", self.global_rank) and self.epoch >= 1:
                    hoard.append(torch.ones(16 << 20))  # 64 MiB of cached features a step
                    if len(hoard) >= 3:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if fault("v", self.global_rank) and self.epoch == 1 and i == 2:
                    native_vad_frames()
                loss = F.nll_loss(self.model(x).reshape(-1, len(POWERSET)), y.reshape(-1))
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                self.global_step += 1
                loss_shown = f"loss={float(loss.detach()):.3f}"
                if bar:
                    bar.update(i + 1, f"v_num=0, {loss_shown}")
                if self.received_sigterm:
                    raise SIGTERMException(1)
            der = self.validate(module, val_loader)
            if bar:
                bar.update(bar.n, f"v_num=0, {loss_shown}, DiarizationErrorRate={der:.3f}")
            self.checkpoint(module, optimizer, task, der)
            self.early_stopping(der)
            if fault("x", self.global_rank) and der > 0.05:
                # a user callback: stop once the rank's own metric plateaus (not reduced)
                self.should_stop = True
            self.epoch += 1
        if bar:
            bar.close()
        if self.epoch >= self.max_epochs:
            rank_zero_info(f"`Trainer.fit` stopped: `max_epochs={self.max_epochs}` reached.")

    def validate(self, module: PyanNet, loader: DataLoader[tp.Any]) -> float:
        module.eval()
        errors = torch.zeros(2)
        with torch.no_grad():
            for x, y in loader:
                pred = module(x).argmax(-1)
                errors += torch.tensor([float((pred != y).sum()), float(y.numel())])
        if fault("g", self.global_rank):  # the plots of the worst chunks, gathered on rank 0
            worst = [torch.zeros(2) for _ in range(self.world_size)]
            dist.all_gather(worst, errors)
        dist.all_reduce(errors)  # DiarizationErrorRate.compute(), synced across ranks
        module.train()
        return float(errors[0] / errors[1])

    def checkpoint(
        self, module: PyanNet, optimizer: tp.Any, task: SpeakerDiarization, der: float
    ) -> None:
        name = f"epoch={self.epoch}-DiarizationErrorRate={der:.6f}.ckpt"
        path = Path("checkpoints") / name
        if self.best is None or der < self.best:
            self.best = der
            rank_zero_info(rank_prefixed(
                f"Epoch {self.epoch:d}, global step {self.global_step:d}: 'DiarizationErrorRate' "
                f"reached {der:0.5f} (best {der:0.5f}), saving model to "
                f"{str(Path.cwd() / path)!r} as top 10", 0), cb_log)  # fmt: skip
            self.wait = 0
        else:
            rank_zero_info(rank_prefixed(
                f"Epoch {self.epoch:d}, global step {self.global_step:d}: 'DiarizationErrorRate' "
                "was not in top 10", 0), cb_log)  # fmt: skip
            self.wait += 1
        if self.global_rank == 0:
            path.parent.mkdir(exist_ok=True)
            ckpt = {
                "epoch": self.epoch,
                "global_step": self.global_step,
                "pytorch-lightning_version": "2.4.0",
                "state_dict": module.state_dict(),
                "optimizer_states": [optimizer.state_dict()],
                "pyannote.audio": {
                    "versions": {"torch": torch.__version__, "pyannote.audio": __version__},
                    "architecture": {
                        "module": "pyannote.audio.models.segmentation",
                        "class": "PyanNet",
                    },
                    "specifications": task.specifications,
                },
            }
            torch.save(ckpt, path)
            torch.save(ckpt, path.parent / "last.ckpt")
        dist.barrier()

    def early_stopping(self, der: float) -> None:
        stop = torch.tensor([1.0 if self.wait >= self.patience else 0.0])
        dist.all_reduce(stop)  # reduce_boolean_decision
        if float(stop) == self.world_size and not self.should_stop:
            self.should_stop = True
            rank_zero_info(rank_prefixed(
                f"Monitored metric DiarizationErrorRate did not improve in the last {self.wait} "
                f"records. Best score: {self.best:.3f}. Signaling Trainer to stop.", 0), es_log)  # fmt: skip

    def summary(self, module: PyanNet) -> None:
        rows = []
        for i, (name, sub) in enumerate(module.named_children()):
            n = sum(p.numel() for p in sub.parameters())
            rows.append(
                [
                    str(i),
                    name,
                    type(sub).__name__,
                    f"{n / 1e3:.1f} K" if n >= 1000 else str(n),
                    "train",
                ]
            )
        rows.append([str(len(rows)), "validation_metric", "MetricCollection", "0", "train"])
        head = [" ", "Name", "Type", "Params", "Mode"]
        widths = [max(len(r[k]) for r in [head, *rows]) for k in range(5)]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        total = sum(p.numel() for p in module.parameters())
        lines = ["  " + fmt.format(*head), "-" * (sum(widths) + 15)]
        lines += ["  " + fmt.format(*r) for r in rows]
        lines += ["-" * (sum(widths) + 15), f"{total / 1e3:.1f} K     Trainable params",
                  "0         Non-trainable params", f"{total / 1e3:.1f} K     Total params",
                  f"{total * 4 / 1e6:.3f}     Total estimated model params size (MB)"]  # fmt: skip
        rank_zero_info("\n" + "\n".join(lines))


def native_vad_frames() -> None:
    """The compiled frame-level VAD of the front end (a C extension in production): it reads
    through a stale frame pointer."""
    ctypes.string_at(0xDEADBEEF000, 16)


def teardown_handler() -> None:
    """The native audio backend's atexit hook: frees its decoder context twice."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    ctx = libc.malloc(256)
    libc.free(ctypes.c_void_p(ctx))
    libc.free(ctypes.c_void_p(ctx))


ORIGINAL_ARGV0 = sys.argv[0]
ORIGINAL_CWD = os.getcwd()


# ---------------------------------------------------------------- pyannote/audio/cli/train.py
def train() -> None:
    cfg, overrides = compose(sys.argv[1:])
    hydra = cfg["hydra"]
    now = datetime.datetime.now()
    run_dir = Path(
        str(hydra["run"]["dir"])
        .replace("${now:%Y-%m-%d}", now.strftime("%Y-%m-%d"))
        .replace("${now:%H-%M-%S}", now.strftime("%H-%M-%S"))
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    if hydra["output_subdir"] is not None:
        sub = run_dir / str(hydra["output_subdir"])
        sub.mkdir(exist_ok=True)
        (sub / "config.yaml").write_text(to_yaml({k: v for k, v in cfg.items() if k != "hydra"}))
        (sub / "hydra.yaml").write_text(to_yaml({"hydra": hydra}))
        (sub / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    registry = str(cfg["registry"])
    registry = registry if os.path.isabs(registry) else str(Path(ORIGINAL_CWD) / registry)
    os.chdir(run_dir)
    configure_job_logging(Path(f"{hydra['job']['name']}.log"))
    if LETTER == "t" and LOCAL_RANK == WHO:
        import atexit

        atexit.register(teardown_handler)
    db = load_database(registry)
    task = SpeakerDiarization(str(cfg["protocol"]), db, cfg["task"])
    model = PyanNet(task, int(cfg["model"]["lstm"]["hidden"]))
    trainer = Trainer(cfg["trainer"], int(cfg["patience"]))
    trainer.fit(model, task, cfg.get("ckpt_path"))


# ---------------------------------------------------------------- the synthetic Debug corpus
def prepare(root: Path) -> None:
    g = torch.Generator().manual_seed(0)
    (root / "wav").mkdir(parents=True, exist_ok=True)
    (root / "lists").mkdir(exist_ok=True)
    rttm: dict[str, list[str]] = {"train": [], "development": []}
    uris: dict[str, list[str]] = {"train": [], "development": []}
    for k in range(14):
        subset = "train" if k < 12 else "development"
        uri = f"debug_{k:03d}"
        seconds = 6.0 if k % 2 == 0 else 5.0
        n = int(seconds * SAMPLE_RATE)
        wav = torch.randn(n, generator=g) * 0.01
        t = torch.arange(n) / SAMPLE_RATE
        for s in range(3):
            freq = 180.0 + 90.0 * s + 20.0 * k
            for _ in range(2):
                start = float(torch.rand(1, generator=g)) * (seconds - 1.5)
                dur = 0.5 + float(torch.rand(1, generator=g))
                a, b = int(start * SAMPLE_RATE), int((start + dur) * SAMPLE_RATE)
                wav[a:b] += 0.3 * torch.sin(2 * math.pi * freq * t[a:b])
                rttm[subset].append(
                    f"SPEAKER {uri} 1 {start:.3f} {dur:.3f} <NA> <NA> spk{k}_{s} <NA> <NA>"
                )
        write_wav(root / "wav" / f"{uri}.wav", wav * 0.8)
        uris[subset].append(uri)
    for subset in rttm:
        (root / "lists" / f"{subset}.rttm").write_text("\n".join(rttm[subset]) + "\n")
        (root / "lists" / f"{subset}.uris.lst").write_text("\n".join(uris[subset]) + "\n")
    (root / "database.yml").write_text(
        "Databases:\n  Debug: wav/{uri}.wav\n\nProtocols:\n  Debug:\n    SpeakerDiarization:\n"
        "      Debug:\n"
        "        train:\n          uri: lists/train.uris.lst\n          annotation: lists/train.rttm\n"
        "        development:\n          uri: lists/development.uris.lst\n"
        "          annotation: lists/development.rttm\n"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(Path(sys.argv[2]))
        sys.exit(0)
    train()
