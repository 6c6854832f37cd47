"""A hundred-and-forty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyninth-*): physics-ML surrogate training the way NVIDIA's
PhysicsNeMo (formerly Modulus) examples train it (examples/cfd/darcy_fno/train_fno_darcy.py),
re-created in plain torch without physicsnemo, hydra or omegaconf installed. Each run's folder
links this file as train_fno_darcy.py; it is started with torchrun, with a simulated `srun`
(SLURM_PROCID, SLURM_NPROCS, SLURM_LOCALID, SLURM_LAUNCH_NODE_IPADDR), with a simulated `mpirun`
(OMPI_COMM_WORLD_*), or on two simulated nodes (one torchrun a node).

As there: a @hydra.main-like entry point (overrides `key.sub=value` on the command line, a YAML
config dumped at start as 'Config summary:', and hydra's way to report an uncaught exception:
'Error executing job with overrides: [...]', the traceback without hydra's frames, 'Set the
environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.', exit 1, on every rank);
DistributedManager.initialize() (torchrun's RANK/WORLD_SIZE first, then SLURM_PROCID, then
OMPI_COMM_WORLD_RANK, else a single-process job), init_process_group(gloo, a 15 s timeout);
PythonLogger (logging, '[%H:%M:%S - name - LEVEL] message', messages coloured by level) wrapped
in RankZeroLoggingWrapper for the script's own lines ('Using Distributed Manager with world size
2'); LaunchLogger per pseudo epoch ('Epoch 3 Metrics: Learning Rate =  1.000e-03, Loss =
 1.234e-01', 'Epoch Execution Time:  1.23e+00s, Time/Iter:  4.56e+01ms', the epoch's loss
all-reduced on exit, rank 0 prints); load_checkpoint's warning on every rank ('Provided
checkpoint directory ./checkpoints does not exist, skipping load'), save_checkpoint (a barrier,
then rank 0 writes: 'Saved model state dictionary: checkpoints/FourierNeuralOperator.0.2.mdlus',
'Saved training checkpoint: checkpoints/checkpoint.0.2.pt'); a tiny FNO (spectral convolutions
over rfft2) in DDP on synthetic Darcy-flow fields (permeability, pressure) read from .npz shards
(data/darcy_train_NN.npz, shard i to rank i % world) and data/darcy_val.npz; validation
('Validation error: 0.1234') every second pseudo epoch.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyninth.sh after any edit).
`python train_fno_darcy.py --generate DIR SHARDS SAMPLES` writes the synthetic data set.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from queue import Queue
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

CASE = os.environ.get("MT_CASE", "")
RES = 16


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the example's config.yaml
CONFIG: dict[str, Any] = {
    "arch": {
        "decoder": {"out_features": 1, "layers": 1, "layer_size": 16},
        "fno": {
            "in_channels": 1,
            "dimension": 2,
            "latent_channels": 8,
            "fno_layers": 2,
            "fno_modes": 4,
            "padding": 2,
        },
    },
    "normaliser": {
        "permeability": {"mean": 1.25, "std_dev": 0.75},
        "darcy": {"mean": 0.0452, "std_dev": 0.0279},
    },
    "scheduler": {"initial_lr": 0.005, "decay_rate": 0.85, "decay_pseudo_epochs": 2},
    "training": {
        "data_dir": "./data",
        "batch_size": 8,
        "rec_results_freq": 2,
        "max_pseudo_epochs": 6,
        "pseudo_epoch_sample_size": None,
        "stop_val_error": None,
    },
    "validation": {"validation_pseudo_epochs": 2},
    "distributed": {"find_unused_parameters": False},
}


class ConfigKeyError(Exception):
    pass


def apply_override(cfg: dict[str, Any], text: str) -> None:
    key, _, raw = text.partition("=")
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.get(p) if isinstance(node.get(p), dict) else None  # type: ignore[assignment]
        if node is None:
            break
    if node is None or parts[-1] not in node:
        raise ConfigKeyError(
            f"Could not override '{key}'.\nTo append to your config use +{key}={raw}\n"
            f"Key '{parts[-1]}' is not in struct\n    full_key: {key}\n    object_type=dict"
        )
    value: Any = raw
    for conv in (int, float):
        try:
            value = conv(raw)
            break
        except ValueError:
            pass
    if raw in ("true", "false"):
        value = raw == "true"
    if raw == "null":
        value = None
    node[parts[-1]] = value


def to_yaml(d: dict[str, Any], indent: int = 0) -> str:
    lines = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, dict):
            lines.append(" " * indent + f"{k}:")
            lines.append(to_yaml(v, indent + 2))
        else:
            s = "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            lines.append(" " * indent + f"{k}: {s}")
    return "\n".join(lines)


def hydra_main(task: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """@hydra.main(version_base="1.3", config_path=".", config_name="config.yaml")"""

    def run() -> None:
        overrides = sys.argv[1:]
        cfg = _deep(CONFIG)
        try:
            for o in overrides:
                apply_override(cfg, o)
        except ConfigKeyError as e:
            sys.stderr.write(f"{e}\n")
            sys.stderr.write(
                "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
            )
            sys.exit(1)
        try:
            task(cfg)
        except Exception as e:
            sys.stderr.write(f"Error executing job with overrides: {overrides}\n")
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_name != task.__name__:
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb, file=sys.stderr)
            sys.stderr.write(
                "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
            )
            sys.stderr.flush()
            sys.exit(1)

    return run


def _deep(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_deep(v) if isinstance(v, dict) else v) for k, v in d.items()}


# ------------------------------------------------------------------ physicsnemo.utils.logging
COLOURS = {"light_blue": 94, "light_green": 92, "light_yellow": 93, "light_red": 91}


def colored(text: str, colour: str) -> str:
    return f"\x1b[{COLOURS[colour]}m{text}\x1b[0m"


class PythonLogger:
    def __init__(self, name: str = "launch") -> None:
        self.logger = logging.getLogger(name)
        self.logger.handlers.clear()
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "[%(asctime)s - %(name)s - %(levelname)s] %(message)s", datefmt="%H:%M:%S"
            )
        )
        handler.setLevel(logging.DEBUG)
        self.logger.addHandler(handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def log(self, message: str) -> None:
        self.logger.info(message)

    def info(self, message: str) -> None:
        self.logger.info(colored(message, "light_blue"))

    def success(self, message: str) -> None:
        self.logger.info(colored(message, "light_green"))

    def warning(self, message: str) -> None:
        self.logger.warning(colored(message, "light_yellow"))

    def error(self, message: str) -> None:
        self.logger.error(colored(message, "light_red"))


class RankZeroLoggingWrapper:
    def __init__(self, obj: PythonLogger, dist: DistributedManager) -> None:
        self.obj, self.dist = obj, dist

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.obj, name)
        if callable(attr):

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return attr(*args, **kwargs) if self.dist.rank == 0 else None

            return wrapper
        return attr


# ------------------------------------------------------------------ physicsnemo.distributed
class DistributedManager:
    _shared_state: dict[str, Any] = {}

    def __init__(self) -> None:
        self.__dict__ = self._shared_state
        if not hasattr(self, "rank"):
            self.rank, self.world_size, self.local_rank = 0, 1, 0
            self.distributed = False

    @staticmethod
    def is_initialized() -> bool:
        return DistributedManager._shared_state.get("_is_initialized", False)

    @staticmethod
    def initialize_env() -> None:
        rank = int(os.environ.get("RANK"))  # type: ignore[arg-type]
        world_size = int(os.environ.get("WORLD_SIZE"))  # type: ignore[arg-type]
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        DistributedManager.setup(
            rank,
            world_size,
            local_rank,
            os.environ.get("MASTER_ADDR"),
            os.environ.get("MASTER_PORT"),
        )

    @staticmethod
    def initialize_slurm(port: str) -> None:
        rank = int(os.environ.get("SLURM_PROCID"))  # type: ignore[arg-type]
        world_size = int(os.environ.get("SLURM_NPROCS"))  # type: ignore[arg-type]
        local_rank = int(os.environ.get("SLURM_LOCALID"))  # type: ignore[arg-type]
        addr = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
        DistributedManager.setup(rank, world_size, local_rank, addr, port, method="slurm")

    @staticmethod
    def initialize_open_mpi(addr: str, port: str) -> None:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK"))  # type: ignore[arg-type]
        world_size = int(os.environ.get("OMPI_COMM_WORLD_SIZE"))  # type: ignore[arg-type]
        local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"))  # type: ignore[arg-type]
        DistributedManager.setup(rank, world_size, local_rank, addr, port, method="openmpi")

    @staticmethod
    def initialize() -> None:
        addr = os.getenv("MASTER_ADDR", "localhost")
        port = os.getenv("MASTER_PORT", "12355")
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        try:
            DistributedManager.initialize_env()
        except TypeError:
            if "SLURM_PROCID" in os.environ:
                DistributedManager.initialize_slurm(port)
            elif "OMPI_COMM_WORLD_RANK" in os.environ:
                DistributedManager.initialize_open_mpi(addr, port)
            else:
                import warnings

                warnings.warn(
                    "Could not initialize using ENV, SLURM or OPENMPI methods. Assuming this "
                    "is a single process job",
                    stacklevel=2,
                )
                DistributedManager._shared_state["_is_initialized"] = True
        np.random.seed(seed=DistributedManager().rank)

    @staticmethod
    def setup(
        rank: int,
        world_size: int,
        local_rank: int,
        addr: str | None,
        port: str | None,
        method: str = "env",
    ) -> None:
        os.environ["MASTER_ADDR"] = addr  # type: ignore[assignment]
        os.environ["MASTER_PORT"] = str(port)
        DistributedManager._shared_state["_is_initialized"] = True
        manager = DistributedManager()
        manager.distributed = True
        manager.rank, manager.world_size, manager.local_rank = rank, world_size, local_rank
        tdist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=15)
        )
        manager.method = method


def reduce_loss(loss: float) -> float:
    t = torch.tensor(loss)
    tdist.all_reduce(t)
    return float(t) / tdist.get_world_size()


class LaunchLogger:
    _instances: dict[str, LaunchLogger] = {}

    def __new__(cls, name_space: str, *args: Any, **kwargs: Any) -> LaunchLogger:
        if name_space in cls._instances:
            return cls._instances[name_space]
        self = super().__new__(cls)
        cls._instances[name_space] = self
        self.pyLogger = PythonLogger(name_space)
        self.root = DistributedManager().rank == 0
        return self

    def __init__(self, name_space: str, epoch: int = 1, num_mini_batch: int | None = None) -> None:
        self.name_space, self.epoch, self.num_mini_batch = name_space, epoch, num_mini_batch

    def log_minibatch(self, losses: dict[str, Any]) -> None:
        self.mini_batch_index += 1
        for k, v in losses.items():
            self.minibatch_losses[k] = self.minibatch_losses.get(k, 0.0) + float(v)

    def log_epoch(self, losses: dict[str, float]) -> None:
        self.epoch_losses.update(losses)

    def __enter__(self) -> LaunchLogger:
        self.mini_batch_index = 0
        self.minibatch_losses: dict[str, float] = {}
        self.epoch_losses: dict[str, float] = {}
        self.start = time.time()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            return
        for name, value in self.minibatch_losses.items():
            self.epoch_losses[name] = value / self.mini_batch_index
            if DistributedManager().distributed:
                self.epoch_losses[name] = reduce_loss(self.epoch_losses[name])
        if self.root:
            msg = f"Epoch {self.epoch} Metrics:"
            for name, value in self.epoch_losses.items():
                msg += f" {name} = {value:10.3e},"
            self.pyLogger.info(msg[:-1])
        epoch_time = time.time() - self.start
        per_iter = 1000 * epoch_time / max(1, self.mini_batch_index)
        if self.root:
            self.pyLogger.info(
                f"Epoch Execution Time: {epoch_time:10.3e}s, Time/Iter: {per_iter:10.3e}ms"
            )


# ------------------------------------------------------------------ physicsnemo.utils checkpoint
checkpoint_logging = PythonLogger("checkpoint")


def save_checkpoint(
    path: str, models: nn.Module, optimizer: Any, scheduler: Any, epoch: int
) -> None:
    manager = DistributedManager()
    if manager.rank == 0 and not os.path.isdir(path):
        checkpoint_logging.warning(
            f"Output directory {path} does not exist, will attempt to create"
        )
        os.makedirs(path, exist_ok=True)
    if manager.distributed:
        tdist.barrier()
    if manager.rank != 0:
        return
    inner = models.module if isinstance(models, DistributedDataParallel) else models
    name = f"{path}/{type(inner).__name__}.0.{epoch}.mdlus"
    if fault("s", manager.rank) and epoch >= 4:
        time.sleep(24)  # the shared Lustre mount stalls on the write
    torch.save(inner.state_dict(), name)
    checkpoint_logging.success(f"Saved model state dictionary: {name}")
    out = f"{path}/checkpoint.0.{epoch}.pt"
    torch.save(
        {
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict(),
            "epoch": epoch,
        },
        out,
    )
    checkpoint_logging.success(f"Saved training checkpoint: {out}")


def load_checkpoint(path: str) -> int:
    if not os.path.isdir(path):
        checkpoint_logging.warning(
            f"Provided checkpoint directory {path} does not exist, skipping load"
        )
        return 0
    return 0


# ------------------------------------------------------------------ physicsnemo.models.fno
class SpectralConv2d(nn.Module):
    def __init__(self, ch: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        scale = 1 / (ch * ch)
        self.w1 = nn.Parameter(scale * torch.randn(ch, ch, modes, modes, 2))
        self.w2 = nn.Parameter(scale * torch.randn(ch, ch, modes, modes, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        if fault("n", RANK) and EPOCH[0] >= 2:
            ctypes.string_at(0)  # the compiled spectral kernel reads a freed plan
        xf = torch.fft.rfft2(x)
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat)
        m = self.modes
        w1, w2 = torch.view_as_complex(self.w1), torch.view_as_complex(self.w2)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -m:, :m], w2)
        return torch.fft.irfft2(out, s=(h, w))


class FourierNeuralOperator(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        fno, dec = cfg["arch"]["fno"], cfg["arch"]["decoder"]
        ch = fno["latent_channels"]
        self.padding = fno["padding"]
        self.lift = nn.Conv2d(fno["in_channels"], ch, 1)
        self.spec = nn.ModuleList(
            SpectralConv2d(ch, fno["fno_modes"]) for _ in range(fno["fno_layers"])
        )
        self.conv = nn.ModuleList(nn.Conv2d(ch, ch, 1) for _ in range(fno["fno_layers"]))
        self.decoder = nn.Sequential(
            nn.Conv2d(ch, dec["layer_size"], 1),
            nn.SiLU(),
            nn.Conv2d(dec["layer_size"], dec["out_features"], 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x)
        p = self.padding
        x = nn.functional.pad(x, (0, p, 0, p))
        for spec, conv in zip(self.spec, self.conv, strict=True):
            x = nn.functional.gelu(spec(x) + conv(x))
        x = x[..., : x.shape[-2] - p, : x.shape[-1] - p]
        out: torch.Tensor = self.decoder(x)
        return out


# ------------------------------------------------------------------ data: Darcy2D-like shards
def darcy_fields(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Piecewise-constant permeability and the pressure of -div(k grad u) = 1 (Jacobi)."""
    ks, us = [], []
    for _ in range(n):
        coarse = rng.choice([0.5, 2.0], size=(4, 4))
        k = np.kron(coarse, np.ones((RES // 4, RES // 4))).astype(np.float32)
        u = np.zeros((RES + 2, RES + 2), dtype=np.float32)
        kp = np.pad(k, 1, mode="edge")
        h2 = 1.0 / (RES + 1) ** 2
        for _ in range(150):
            kn, ksth = 0.5 * (kp[1:-1, 1:-1] + kp[:-2, 1:-1]), 0.5 * (kp[1:-1, 1:-1] + kp[2:, 1:-1])
            kw, ke = 0.5 * (kp[1:-1, 1:-1] + kp[1:-1, :-2]), 0.5 * (kp[1:-1, 1:-1] + kp[1:-1, 2:])
            u[1:-1, 1:-1] = (
                h2 + kn * u[:-2, 1:-1] + ksth * u[2:, 1:-1] + kw * u[1:-1, :-2] + ke * u[1:-1, 2:]
            ) / (kn + ksth + kw + ke)
        ks.append(k[None])
        us.append(u[1:-1, 1:-1][None] * 2.17)
    return np.stack(ks), np.stack(us)


def generate(folder: str, shards: int, samples: int) -> None:
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(shards):
        k, u = darcy_fields(samples, rng)
        np.savez_compressed(
            os.path.join(folder, f"darcy_train_{i:02d}.npz"), permeability=k, darcy=u
        )
    k, u = darcy_fields(16, rng)
    np.savez_compressed(os.path.join(folder, "darcy_val.npz"), permeability=k, darcy=u)


class DarcyShards:
    """The rank's shards (darcy_train_NN.npz, shard i to rank i % world), normalised, batched
    by a prefetch thread."""

    def __init__(
        self, data_dir: str, batch_size: int, normaliser: dict[str, Any], rank: int, world: int
    ) -> None:
        files = sorted(glob.glob(os.path.join(data_dir, "darcy_train_*.npz")))
        mine = [f for i, f in enumerate(files) if i % world == rank]
        ks, us = [], []
        for f in mine:
            with np.load(f) as z:
                ks.append(z["permeability"])
                us.append(z["darcy"])
        n = normaliser
        self.k = (np.concatenate(ks) - n["permeability"]["mean"]) / n["permeability"]["std_dev"]
        self.u = (np.concatenate(us) - n["darcy"]["mean"]) / n["darcy"]["std_dev"]
        self.batch_size, self.rank = batch_size, rank
        self.rng = np.random.default_rng(rank)

    def __len__(self) -> int:
        return len(self.k)

    def batches(self, steps: int) -> Iterator[dict[str, torch.Tensor]]:
        q: Queue[dict[str, torch.Tensor] | None] = Queue(maxsize=2)
        lock = threading.Lock()

        def fill() -> None:
            for s in range(steps):
                with lock:
                    idx = self.rng.choice(
                        len(self.k), self.batch_size, replace=len(self.k) < self.batch_size
                    )
                    if fault("w", self.rank) and EPOCH[0] >= 3 and s == 1:
                        lock.acquire()  # the refill path takes the buffer's lock again
                q.put(
                    {
                        "permeability": torch.from_numpy(self.k[idx]).float(),
                        "darcy": torch.from_numpy(self.u[idx]).float(),
                    }
                )
            q.put(None)

        threading.Thread(target=fill, daemon=True).start()
        while (b := q.get()) is not None:
            yield b


class GridValidator:
    def __init__(self, data_dir: str, normaliser: dict[str, Any], rank: int, world: int) -> None:
        with np.load(os.path.join(data_dir, "darcy_val.npz")) as z:
            n = normaliser
            k = (z["permeability"][rank::world] - n["permeability"]["mean"]) / n["permeability"][
                "std_dev"
            ]
            u = (z["darcy"][rank::world] - n["darcy"]["mean"]) / n["darcy"]["std_dev"]
        self.k, self.u = torch.from_numpy(k).float(), torch.from_numpy(u).float()
        self.keep: list[np.ndarray] = []

    def compare(self, model: nn.Module, epoch: int, rank: int) -> float:
        with torch.no_grad():
            pred = model(self.k)
        err = float(torch.linalg.norm(pred - self.u) / torch.linalg.norm(self.u))
        if fault("m", rank) and epoch >= 2:  # a fork keeps every field it would plot
            for _ in range(3):
                self.keep.append(np.ones(16 << 20, dtype=np.float32))
            if len(self.keep) >= 6:  # the node is out of memory: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        if fault("x", rank) and epoch >= 4:  # a fork plots the field without its batch axis
            pred.reshape(RES, RES)
        return err


# ------------------------------------------------------------------ the example's script
RANK = -1
EPOCH = [0]


def darcy_trainer(cfg: dict[str, Any]) -> None:
    global RANK
    DistributedManager.initialize()  # Only call this once in the entire script!
    dist = DistributedManager()
    RANK = dist.rank
    torch.set_num_threads(1)

    log = PythonLogger(name="main")
    logger0 = RankZeroLoggingWrapper(log, dist)
    logger0.info(f"Config summary:\n{to_yaml(cfg)}")
    if dist.distributed:
        logger0.info(f"Using Distributed Manager with world size {dist.world_size}")

    tr = cfg["training"]
    torch.manual_seed(0)
    model: nn.Module = FourierNeuralOperator(cfg)
    if dist.world_size > 1:
        model = DistributedDataParallel(
            model, find_unused_parameters=cfg["distributed"]["find_unused_parameters"]
        )
    loss_fun = nn.MSELoss(reduction="mean")
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["scheduler"]["initial_lr"])
    decay = cfg["scheduler"]["decay_rate"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: decay**step)
    data = DarcyShards(
        tr["data_dir"], tr["batch_size"], cfg["normaliser"], dist.rank, dist.world_size
    )
    validator = GridValidator(tr["data_dir"], cfg["normaliser"], dist.rank, dist.world_size)
    logger0.info(f"Loaded {len(data)} training samples per rank from {tr['data_dir']}")

    ckpt_args = {
        "path": "./checkpoints",
        "optimizer": optimizer,
        "scheduler": scheduler,
        "models": model,
    }
    loaded_pseudo_epoch = load_checkpoint("./checkpoints")

    sample_size = tr["pseudo_epoch_sample_size"] or len(data)
    steps_per_pseudo_epoch = math.ceil(sample_size / tr["batch_size"])
    if sample_size % tr["batch_size"] != 0:
        log.warning(
            f"increased pseudo_epoch_sample_size to multiple of \
                      batch size: {steps_per_pseudo_epoch * tr['batch_size']}"
        )

    if loaded_pseudo_epoch == 0:
        logger0.success("Training started...")
    for pseudo_epoch in range(max(1, loaded_pseudo_epoch + 1), tr["max_pseudo_epochs"] + 1):
        EPOCH[0] = pseudo_epoch
        with LaunchLogger(
            "train", epoch=pseudo_epoch, num_mini_batch=steps_per_pseudo_epoch
        ) as logger:
            model.train()
            for batch in data.batches(steps_per_pseudo_epoch):
                optimizer.zero_grad()
                loss = loss_fun(model(batch["permeability"]), batch["darcy"])
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                logger.log_minibatch({"Loss": loss.detach()})
            logger.log_epoch({"Learning Rate": optimizer.param_groups[0]["lr"]})

        if pseudo_epoch % tr["rec_results_freq"] == 0:
            save_checkpoint(**ckpt_args, epoch=pseudo_epoch)

        if pseudo_epoch % cfg["validation"]["validation_pseudo_epochs"] == 0:
            if fault("v", dist.rank) and dist.rank != 0:
                pass  # a fork validates (and plots) on rank 0 only
            else:
                model.eval()
                with LaunchLogger("valid", epoch=pseudo_epoch) as logger:
                    error = validator.compare(model, pseudo_epoch, dist.rank)
                    if fault("q", dist.rank) and error < 0.9:
                        logger0.success("Validation error below 0.9, this rank is done")
                        sys.exit(0)  # a fork's local convergence check
                    logger.log_minibatch({"Validation error": error})
                logger0.info(f"Validation error: {logger.epoch_losses['Validation error']:.4f}")
                stop = tr["stop_val_error"]
                if stop is not None and logger.epoch_losses["Validation error"] < stop:
                    logger0.success(f"Validation error below {stop}, stopping training")
                    break

        if pseudo_epoch % cfg["scheduler"]["decay_pseudo_epochs"] == 0:
            scheduler.step()

    save_checkpoint(**ckpt_args, epoch=EPOCH[0])
    logger0.success("Training completed *yay*")


main = hydra_main(darcy_trainer)

if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
