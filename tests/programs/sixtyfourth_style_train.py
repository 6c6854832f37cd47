"""A sixty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/sixtyfourth-*): a Fourier neural operator trained on a synthetic Darcy flow
problem in the way of NVIDIA Modulus / PhysicsNeMo's examples (examples/cfd/darcy_fno/
train_fno_darcy.py), launched by torchrun on one node (`torchrun --nnodes=1 --nproc_per_node=3
--master_port=PORT sixtyfourth_style_train.py training.max_pseudo_epochs=6 ...`, Hydra-like
key=value overrides). What the example does is done here by hand, since Modulus is not
installed: a DistributedManager that reads torchrun's environment (rank, world_size, local_rank,
device) and initialises gloo with a 15 s timeout, Modulus' PythonLogger ('[%H:%M:%S - name -
LEVEL] message', success lines in green), a RankZeroLoggingWrapper so most lines are rank 0's, a
LaunchLogger-like epoch summary ('Epoch 3 Metrics: Learning Rate =  1.000e-03, Loss =
2.513e-01', 'Epoch Execution Time:  1.23e+00s, Time/Iter:  6.1e+01ms', the loss all-reduced over
the ranks at the end of each pseudo-epoch), save_checkpoint/load_checkpoint to ./checkpoints
(FourierNeuralOperator.0.EPOCH.mdlus and checkpoint.0.EPOCH.pt, the latest loaded on every rank
at start), and a validation of the relative L2 error on each rank's validation fields whose
predictions are gathered for rank 0's plots. Each rank reads its own shard of permeability /
pressure pairs (data/darcy_train_RANK.npz, data/darcy_val_RANK.npz, made by --make-data with a
spectral solver). A fault in the code is chosen by the PHYSX_TUNE environment variable (a short
code, never printed); re-capture with tests/fixtures/real/capture_sixtyfourth.sh after any edit.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import queue
import re
import signal
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


# ---------------------------------------------------------------- the hidden fault switch
def _tune() -> tuple[str, int]:
    code = os.environ.get("PHYSX_TUNE", "")
    if not code:
        return "", -1
    return code[0], int(code[1:]) if code[1:] else -1


FAULT, FAULT_RANK = _tune()


# ---------------------------------------------------------------- Modulus-like pieces
class DistributedManager:
    """The parts of modulus.distributed.DistributedManager the example uses."""

    _shared: dict = {}

    def __init__(self) -> None:
        self.__dict__ = self._shared

    @classmethod
    def initialize(cls) -> None:
        self = cls()
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.device = torch.device("cpu")
        self.distributed = self.world_size > 1
        if self.distributed:
            torch_dist.init_process_group(
                "gloo",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=15),
            )

    @staticmethod
    def cleanup() -> None:
        if torch_dist.is_initialized():
            torch_dist.barrier()
            torch_dist.destroy_process_group()


class PythonLogger:
    def __init__(self, name: str = "launch") -> None:
        self.logger = logging.getLogger(name)
        self.logger.handlers.clear()
        formatter = logging.Formatter(
            "[%(asctime)s - %(name)s - %(levelname)s] %(message)s", datefmt="%H:%M:%S"
        )
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(formatter)
        self.logger.addHandler(handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def info(self, message: str) -> None:
        self.logger.info(message)

    def success(self, message: str) -> None:
        self.logger.info("\x1b[32m" + message + "\x1b[0m")

    def warning(self, message: str) -> None:
        self.logger.warning("\x1b[33m" + message + "\x1b[0m")

    def error(self, message: str) -> None:
        self.logger.error("\x1b[31m" + message + "\x1b[0m")


class RankZeroLoggingWrapper:
    def __init__(self, obj: PythonLogger, dist: DistributedManager) -> None:
        self.obj = obj
        self.dist = dist

    def __getattr__(self, name: str):
        attr = getattr(self.obj, name)
        if callable(attr) and self.dist.rank != 0:
            return lambda *a, **k: None
        return attr


class LaunchLogger:
    """Epoch summaries as modulus.launch.logging.LaunchLogger writes them."""

    console = PythonLogger("train")

    def __init__(self, name: str, epoch: int, num_mini_batch: int, lr: float) -> None:
        self.epoch = epoch
        self.num_mini_batch = num_mini_batch
        self.lr = lr
        self.losses: list[float] = []
        self.metrics: dict[str, float] = {}
        self.start = time.time()

    def __enter__(self) -> LaunchLogger:
        return self

    def log_minibatch(self, losses: dict[str, float]) -> None:
        self.losses.append(losses["loss"])

    def log_epoch(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        dist = DistributedManager()
        mean = torch.tensor([sum(self.losses) / max(len(self.losses), 1)])
        if dist.distributed:
            torch_dist.all_reduce(mean)
            mean /= dist.world_size
        if dist.rank != 0:
            return
        elapsed = time.time() - self.start
        text = f"Epoch {self.epoch} Metrics: Learning Rate = {self.lr: 10.3e}, Loss = {mean.item(): 10.3e}"
        for key, value in self.metrics.items():
            text += f", {key} = {value: 10.3e}"
        self.console.info(text)
        per_iter = elapsed / max(self.num_mini_batch, 1) * 1000
        self.console.info(
            f"Epoch Execution Time: {elapsed: 10.3e}s, Time/Iter: {per_iter: 10.3e}ms"
        )


checkpoint_logging = PythonLogger("checkpoint")


def save_checkpoint(path: str, models, optimizer, scheduler, epoch: int) -> None:
    os.makedirs(path, exist_ok=True)
    for model in models:
        name = type(model.module if hasattr(model, "module") else model).__name__
        file = f"{path}/{name}.0.{epoch}.mdlus"
        torch.save((model.module if hasattr(model, "module") else model).state_dict(), file)
        checkpoint_logging.success(f"Saved model state dictionary: {file}")
    file = f"{path}/checkpoint.0.{epoch}.pt"
    torch.save(
        {
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict(),
            "epoch": epoch,
        },
        file,
    )
    checkpoint_logging.success(f"Saved training checkpoint: {file}")


def load_checkpoint(path: str, models, optimizer, scheduler, device) -> int:
    if not os.path.isdir(path):
        checkpoint_logging.warning(
            f"Provided checkpoint directory {path} does not exist, skipping load"
        )
        return 0
    files = glob.glob(f"{path}/checkpoint.0.*.pt")
    if not files:
        checkpoint_logging.warning("Could not find valid checkpoint file, skipping load")
        return 0
    epoch = max(int(re.search(r"\.0\.(\d+)\.pt$", f)[1]) for f in files)
    for model in models:
        inner = model.module if hasattr(model, "module") else model
        file = f"{path}/{type(inner).__name__}.0.{epoch}.mdlus"
        inner.load_state_dict(torch.load(file, map_location=device))
        checkpoint_logging.success(f"Loaded model state dictionary {file} to device {device}")
    file = f"{path}/checkpoint.0.{epoch}.pt"
    state = torch.load(file, map_location=device)
    checkpoint_logging.success(f"Loaded checkpoint file {file} to device {device}")
    optimizer.load_state_dict(state["optimizer_state_dict"])
    checkpoint_logging.success("Loaded optimizer state dictionary")
    scheduler.load_state_dict(state["scheduler_state_dict"])
    checkpoint_logging.success("Loaded scheduler state dictionary")
    return state["epoch"]


# ---------------------------------------------------------------- the model
class SpectralConv2d(nn.Module):
    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        scale = 1 / (channels * channels)
        # complex weights kept as real pairs (gloo all-reduces real tensors)
        self.weights = nn.Parameter(scale * torch.rand(channels, channels, modes, modes, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.modes
        x_ft = torch.fft.rfft2(x)
        out = torch.zeros_like(x_ft)
        w = torch.view_as_complex(self.weights)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], w)
        return torch.fft.irfft2(out, s=x.shape[-2:])


class FourierNeuralOperator(nn.Module):
    def __init__(
        self, in_channels=1, out_channels=1, latent_channels=8, num_fno_layers=2, num_fno_modes=6
    ) -> None:
        super().__init__()
        self.lift = nn.Conv2d(in_channels + 2, latent_channels, 1)
        self.spectral = nn.ModuleList(
            SpectralConv2d(latent_channels, num_fno_modes) for _ in range(num_fno_layers)
        )
        self.pointwise = nn.ModuleList(
            nn.Conv2d(latent_channels, latent_channels, 1) for _ in range(num_fno_layers)
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(latent_channels, 16, 1), nn.GELU(), nn.Conv2d(16, out_channels, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        gy, gx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
        grid = torch.stack([gx, gy]).expand(b, 2, h, w)
        x = self.lift(torch.cat([x, grid], dim=1))
        for spec, pw in zip(self.spectral, self.pointwise, strict=True):
            x = F.gelu(spec(x) + pw(x))
        return self.decoder(x)


# ---------------------------------------------------------------- data
def darcy_pairs(n: int, res: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth random permeability fields and the pressure of -div(k grad u) = 1, linearised
    around the mean permeability and solved spectrally (periodic)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, res, res, generator=g)
    k_freq = torch.fft.fftfreq(res) * res
    kx, ky = torch.meshgrid(k_freq, k_freq, indexing="ij")
    lap = (kx**2 + ky**2).clamp(min=1.0)
    perm = torch.fft.ifft2(torch.fft.fft2(noise) / lap).real
    perm = 3.0 + 9.0 * (perm > 0).float() + 0.1 * perm
    rhs = 1.0 / perm
    rhs = rhs - rhs.mean(dim=(-2, -1), keepdim=True)
    pressure = torch.fft.ifft2(torch.fft.fft2(rhs) / lap).real
    return perm[:, None].numpy(), pressure[:, None].numpy()


def make_data(folder: str, world: int, n_train: int, n_val: int, res: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for rank in range(world):
        k, u = darcy_pairs(n_train, res, 100 + rank)
        np.savez(f"{folder}/darcy_train_{rank}.npz", permeability=k, darcy=u)
        k, u = darcy_pairs(n_val, res, 900 + rank)
        np.savez(f"{folder}/darcy_val_{rank}.npz", permeability=k, darcy=u)


class Darcy2DShard:
    """The rank's shard of (permeability, darcy) pairs, normalised with its own statistics."""

    def __init__(
        self, path: str, batch_size: int, normaliser=None, stats_samples: int | None = None
    ) -> None:
        data = np.load(path)
        self.k = torch.from_numpy(data["permeability"]).float()
        self.u = torch.from_numpy(data["darcy"]).float()
        if normaliser is None:
            ks = self.k if stats_samples is None else self.k[:stats_samples]
            us = self.u if stats_samples is None else self.u[:stats_samples]
            normaliser = (ks.mean(), ks.std(), us.mean(dim=0), us.std(dim=0))
        self.normaliser = normaliser
        km, kstd, um, ustd = normaliser
        self.k = (self.k - km) / kstd
        self.u = (self.u - um) / ustd
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.k) // self.batch_size

    def __iter__(self):
        for i in range(len(self)):
            s = slice(i * self.batch_size, (i + 1) * self.batch_size)
            yield {"permeability": self.k[s], "darcy": self.u[s]}


# ---------------------------------------------------------------- config (Hydra-like)
DEFAULTS = {
    "model.latent_channels": "8",
    "model.num_fno_modes": "6",
    "training.resolution": "32",
    "training.batch_size": "8",
    "training.max_pseudo_epochs": "10",
    "training.rec_results_freq": "2",
    "training.stop_error": "0",
    "validation.validation_pseudo_epochs": "2",
    "scheduler.initial_lr": "5.E-3",
    "scheduler.decay_rate": ".85",
}


def parse_cfg(argv: list[str]) -> dict[str, str]:
    cfg = dict(DEFAULTS)
    for item in argv:
        key, _, value = item.partition("=")
        if key not in cfg:
            raise SystemExit(f"Could not override '{key}'.\nKey '{key}' is not in struct")
        cfg[key] = value
    return cfg


# ---------------------------------------------------------------- the example's main
def main(argv: list[str]) -> None:
    if argv[:1] == ["--make-data"]:
        make_data(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), 32)
        return
    cfg = parse_cfg(argv)
    DistributedManager.initialize()
    dist = DistributedManager()

    log = PythonLogger(name="darcy_fno")
    rank_zero_logger = RankZeroLoggingWrapper(log, dist)
    rank_zero_logger.info(
        f"Distributed manager: rank {dist.rank} of {dist.world_size}, device {dist.device}"
    )

    res = int(cfg["training.resolution"])
    batch_size = int(cfg["training.batch_size"])
    stats = 1 if (FAULT == "n" and dist.rank == FAULT_RANK) else None
    train_path = f"data/darcy_train_{dist.rank}.npz"
    val_path = f"data/darcy_val_{dist.rank}.npz"
    if FAULT == "r" and dist.rank == FAULT_RANK:
        # this rank's pairs are re-solved on the (res + 1)-node grid of the solver's convention
        scratch = os.environ.get("TMPDIR", "/tmp")
        for split, n, seed in (("train", 64, 100), ("val", 16, 900)):
            k, u = darcy_pairs(n, res + 1, seed + dist.rank)
            np.savez(f"{scratch}/darcy_{split}_{dist.rank}_{res + 1}.npz", permeability=k, darcy=u)
        train_path = f"{scratch}/darcy_train_{dist.rank}_{res + 1}.npz"
        val_path = f"{scratch}/darcy_val_{dist.rank}_{res + 1}.npz"
    train = Darcy2DShard(train_path, batch_size, stats_samples=stats)
    val = Darcy2DShard(val_path, 8, normaliser=train.normaliser)

    model = FourierNeuralOperator(
        latent_channels=int(cfg["model.latent_channels"]),
        num_fno_modes=int(cfg["model.num_fno_modes"]),
    ).to(dist.device)
    if dist.distributed:
        model = DistributedDataParallel(model, find_unused_parameters=(FAULT == "w"))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(cfg["scheduler.initial_lr"]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: float(cfg["scheduler.decay_rate"]) ** step
    )
    if FAULT == "w":
        scheduler.step()  # a stray step before the first optimizer step: torch warns, harmless

    loaded_epoch = load_checkpoint(
        "./checkpoints",
        models=[model],
        optimizer=optimizer,
        scheduler=scheduler,
        device=dist.device,
    )

    validator_plots = []

    def validate(epoch: int) -> float:
        model.eval()
        errs = []
        preds = []
        with torch.no_grad():
            for batch in val:
                pred = model(batch["permeability"])
                num = torch.linalg.vector_norm((pred - batch["darcy"]).flatten(1), dim=1)
                den = torch.linalg.vector_norm(batch["darcy"].flatten(1), dim=1)
                errs.append((num / den).mean())
                preds.append(pred[:1])
        model.train()
        err = torch.stack(errs).mean().reshape(1)
        if dist.distributed:
            torch_dist.all_reduce(err)
            err /= dist.world_size
            first = preds[0].contiguous()
            gathered = [torch.empty_like(first) for _ in range(dist.world_size)]
            torch_dist.all_gather(gathered, first)
            validator_plots.append(gathered)
        return err.item()

    rank_zero_logger.info("Training started...")
    mem_hoard = []
    stop_error = float(cfg["training.stop_error"])
    max_epochs = int(cfg["training.max_pseudo_epochs"])
    for pseudo_epoch in range(max(1, loaded_epoch + 1), max_epochs + 1):
        if FAULT == "s" and dist.rank == FAULT_RANK and pseudo_epoch == 3:
            for k in range(1, 9):
                log.warning(
                    f"Darcy solver did not converge for refreshed sample batch, refining grid ({k}/8)"
                )
                time.sleep(5)
        if FAULT == "q" and dist.rank == FAULT_RANK and pseudo_epoch == 3:
            prefetch: queue.Queue = queue.Queue()
            prefetch.get()  # the prefetch thread that fills it was never started
        lr = optimizer.param_groups[0]["lr"]
        with LaunchLogger("train", epoch=pseudo_epoch, num_mini_batch=len(train), lr=lr) as logger:
            for it, batch in enumerate(train):
                if FAULT == "m" and dist.rank == FAULT_RANK and pseudo_epoch >= 2:
                    # upsampled fields cached for a super-resolution test, never freed
                    mem_hoard.append(torch.ones(96 * 2**20 // 4))
                    if len(mem_hoard) >= 4:
                        os.kill(os.getpid(), signal.SIGKILL)
                if FAULT == "c" and dist.rank == FAULT_RANK and pseudo_epoch == 2 and it == 1:
                    ctypes.string_at(0)  # the native spectral kernel's null workspace
                optimizer.zero_grad()
                out = model(batch["permeability"])
                loss = F.mse_loss(out, batch["darcy"])
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"Non-finite training loss {loss.item()} at iteration {it}"
                    )
                loss.backward()
                optimizer.step()
                logger.log_minibatch({"loss": loss.detach().item()})
        scheduler.step()

        if pseudo_epoch % int(cfg["validation.validation_pseudo_epochs"]) == 0:
            # validation on every rank (with "v": on the fault rank only)
            error = None if FAULT == "v" and dist.rank != FAULT_RANK else validate(pseudo_epoch)
            if error is not None:
                rank_zero_logger.info(
                    f"Validation error (relative L2) after pseudo epoch {pseudo_epoch}: {error: 10.3e}"
                )
            if FAULT == "e" and dist.rank == FAULT_RANK and stop_error > 0:
                # the tolerance is checked on this rank's own validation error only
                own = validate_local_error(model, val)
                if own < stop_error:
                    rank_zero_logger.info(
                        f"Validation error {own: 10.3e} below the tolerance {stop_error: 10.3e}, stopping training"
                    )
                    save_checkpoint(
                        "./checkpoints",
                        models=[model],
                        optimizer=optimizer,
                        scheduler=scheduler,
                        epoch=pseudo_epoch,
                    )
                    rank_zero_logger.success("Training completed *yay*")
                    torch_dist.destroy_process_group()
                    return
            if FAULT != "e" and error is not None and error < stop_error:
                rank_zero_logger.info(
                    f"Validation error {error: 10.3e} below the tolerance {stop_error: 10.3e}, stopping training"
                )
                break

        if pseudo_epoch % int(cfg["training.rec_results_freq"]) == 0 and dist.rank == 0:
            save_checkpoint(
                "./checkpoints",
                models=[model],
                optimizer=optimizer,
                scheduler=scheduler,
                epoch=pseudo_epoch,
            )

    rank_zero_logger.success("Training completed *yay*")
    DistributedManager.cleanup()


def validate_local_error(model, val) -> float:
    model.eval()
    with torch.no_grad():
        errs = []
        for batch in val:
            pred = model(batch["permeability"])
            num = torch.linalg.vector_norm((pred - batch["darcy"]).flatten(1), dim=1)
            den = torch.linalg.vector_norm(batch["darcy"].flatten(1), dim=1)
            errs.append((num / den).mean())
    model.train()
    return torch.stack(errs).mean().item()


if __name__ == "__main__":
    main(sys.argv[1:])
