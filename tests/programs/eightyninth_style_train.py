"""An eighty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/eightyninth-*): a weather / climate model trained on two simulated nodes in
the way of NVIDIA Makani / FourCastNet / ClimaX training scripts. A tiny 2-D vision-transformer
(patch embedding, two encoder blocks, a linear head back to the lat-lon grid, a residual
forecast) predicts the next 6-hourly state of four synthetic fields (u10, v10, t2m, z500) on a
16x32 lat-lon grid, from yearly files data/era5_tiny/<year>.npy and data/stats/global_{means,
stds}.npy written by `train.py --prepare`. The parameters come from a YAML file in Makani's
YParams manner (`--yaml_config config/tiny.yaml --config tiny --run_num 0`); the training years
are sharded over the ranks ClimaX's way (years[rank::world]); the loss is the latitude-weighted
MSE; each epoch ends with an all-reduce of the training loss, a validation whose weighted RMSE
per channel is all-reduced, and a checkpoint (exp_dir/tiny/<run_num>/training_checkpoints/
ckpt.tar) that global rank 0 writes. Python logging in FourCastNet's format ('%(asctime)s -
%(name)s - %(levelname)s - %(message)s', the root logger), INFO on global rank 0 only. gloo on
CPU, 15 s collective timeout. Launched as two 'nodes', `torchrun --nnodes 2 --node_rank K
--nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint localhost:PORT --rdzv_id weather train.py
--yaml_config config/tiny.yaml --run_num 0`. A fault in the code is chosen by the TQ_CASE
environment variable (a letter and a global rank) and never printed (re-capture with
tests/fixtures/real/capture_eightyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import queue
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CHANNELS = ["u10", "v10", "t2m", "z500"]


def fault() -> tuple[str, int]:
    """(letter, global rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


class YParams:
    """Makani's YParams: one named section of a YAML file, as attributes and items."""

    def __init__(self, yaml_filename: str, config_name: str) -> None:
        with open(yaml_filename) as f:
            self.params = dict(yaml.safe_load(f)[config_name])
        for key, val in self.params.items():
            setattr(self, key, val)

    def __getitem__(self, key: str) -> object:
        return self.params[key]

    def __setitem__(self, key: str, val: object) -> None:
        self.params[key] = val
        setattr(self, key, val)

    def log(self) -> None:
        logging.info("------------------ Configuration ------------------")
        logging.info("Configuration file: " + str(self.params.get("_file")))
        logging.info("Configuration name: " + str(self.params.get("_name")))
        for key, val in self.params.items():
            if not key.startswith("_"):
                logging.info(str(key) + " " + str(val))
        logging.info("---------------------------------------------------")


def prepare(params: YParams) -> None:
    """Synthetic 6-hourly fields: travelling waves with a seasonal cycle, noise on top."""
    rng = np.random.default_rng(89)
    h, w = params.img_shape
    lat = np.linspace(-np.pi / 2, np.pi / 2, h)[:, None]
    lon = np.linspace(0, 2 * np.pi, w, endpoint=False)[None, :]
    root = Path(params.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    years = list(params.train_years) + list(params.valid_years)
    for year in years:
        t = np.arange(params.samples_per_year)[:, None, None] + 100 * (year - 2000)
        fields = []
        for c in range(len(CHANNELS)):
            k = c + 1
            phase = 2 * np.pi * 0.03 * t * k
            wave = np.cos(k * lon[None] - phase) * np.cos(lat[None]) ** k
            fields.append(wave + 0.5 * np.sin(lat[None] * k) + 0.1 * c)
        x = np.stack(fields, axis=1) + 0.05 * rng.standard_normal((len(t), len(CHANNELS), h, w))
        np.save(root / f"{year}.npy", x.astype(np.float32))
    stats = Path(params.stats_dir)
    stats.mkdir(parents=True, exist_ok=True)
    everything = np.concatenate([np.load(root / f"{y}.npy") for y in params.train_years])
    np.save(stats / "global_means.npy", everything.mean(axis=(0, 2, 3), keepdims=True))
    np.save(stats / "global_stds.npy", everything.std(axis=(0, 2, 3), keepdims=True))


class YearsDataset(torch.utils.data.Dataset):
    """Pairs (state at t, state at t + 6 h) from a list of yearly files, normalised."""

    def __init__(self, params: YParams, years: list[int]) -> None:
        self.means = np.load(Path(params.stats_dir) / "global_means.npy")[0]
        self.stds = np.load(Path(params.stats_dir) / "global_stds.npy")[0]
        self.files = [np.load(Path(params.data_dir) / f"{y}.npy", mmap_mode="r") for y in years]
        self.per_year = [len(f) - 1 for f in self.files]

    def __len__(self) -> int:
        return sum(self.per_year)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        year = 0
        while idx >= self.per_year[year]:
            idx -= self.per_year[year]
            year += 1
        x = (self.files[year][idx] - self.means) / self.stds
        y = (self.files[year][idx + 1] - self.means) / self.stds
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


class TinyViT(nn.Module):
    """FourCastNet's backbone reduced: patch embedding, encoder blocks, a linear head."""

    def __init__(self, params: YParams) -> None:
        super().__init__()
        c, p, d = len(CHANNELS), params.patch_size, params.embed_dim
        h, w = params.img_shape
        self.p, self.hp, self.wp = p, h // p, w // p
        self.patch_embed = nn.Conv2d(c, d, kernel_size=p, stride=p)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.hp * self.wp, d))
        layer = nn.TransformerEncoderLayer(d, params.num_heads, 2 * d, 0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, params.depth, enable_nested_tensor=False)
        self.head = nn.Linear(d, c * p * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        z = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        z = self.head(self.blocks(z))
        z = z.view(b, self.hp, self.wp, c, self.p, self.p).permute(0, 3, 1, 4, 2, 5)
        return x + z.reshape(b, c, self.hp * self.p, self.wp * self.p)


def lat_weights(h: int) -> torch.Tensor:
    lat = torch.linspace(-90, 90, h)
    w = torch.cos(torch.deg2rad(lat))
    return (w / w.mean()).view(1, 1, h, 1)


class Trainer:
    def __init__(self, params: YParams, world_rank: int, world_size: int) -> None:
        self.params, self.world_rank, self.world_size = params, world_rank, world_size
        self.letter, self.who = fault()
        if params.batch_size % world_size != 0:
            raise ValueError(
                f"Global batch size {params.batch_size} is not divisible by the number of "
                f"data parallel ranks {world_size}"
            )
        self.local_bs = params.batch_size // world_size
        if world_rank == 0:
            logging.info("rank %d, begin data loader init", world_rank)
        years = list(params.train_years)[world_rank::world_size]
        self.train_ds = YearsDataset(params, years)
        self.train_loader = torch.utils.data.DataLoader(
            self.train_ds, batch_size=self.local_bs, shuffle=True, drop_last=True
        )
        valid = YearsDataset(params, list(params.valid_years))
        self.valid_ds = torch.utils.data.Subset(
            valid, list(range(world_rank, len(valid), world_size))
        )
        self.valid_loader = torch.utils.data.DataLoader(self.valid_ds, batch_size=self.local_bs)
        if world_rank == 0:
            logging.info("rank %d, data loader initialized", world_rank)
        torch.manual_seed(0)
        self.model = DDP(TinyViT(params))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=params.lr)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=params.max_epochs
        )
        self.scaler = torch.cuda.amp.GradScaler() if params.enable_amp else None
        self.weights = lat_weights(params.img_shape[0])
        self.iters, self.start_epoch = 0, 0
        run_dir = Path(params.exp_dir) / params["_name"] / str(params.run_num)
        self.checkpoint_path = run_dir / "training_checkpoints" / "ckpt.tar"
        if params.resuming:
            if world_rank == 0:
                logging.info("Loading checkpoint %s", self.checkpoint_path)
            self.restore_checkpoint(self.checkpoint_path)
        if world_rank == 0:
            n = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            logging.info("Number of trainable model parameters: %d", n)
        self.prefetch: queue.Queue[int] = queue.Queue()

    def restore_checkpoint(self, path: Path) -> None:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        self.model.module.load_state_dict(checkpoint["model_state"])
        self.optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
        self.iters = checkpoint["iters"]
        self.start_epoch = checkpoint["epoch"]

    def save_checkpoint(self, path: Path, epoch: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "iters": self.iters,
                "epoch": epoch,
                "model_state": self.model.module.state_dict(),
                "optimizer_state_dict": self.optimizer.state_dict(),
            },
            path,
        )

    def loss_obj(self, pred: torch.Tensor, tar: torch.Tensor) -> torch.Tensor:
        return ((pred - tar) ** 2 * self.weights).mean()

    def train_one_epoch(self, epoch: int) -> tuple[float, dict[str, torch.Tensor]]:
        tr_start = time.time()
        self.model.train()
        total, steps = torch.zeros(1), 0
        n_batches = len(self.train_loader)
        hog: list[bytearray] = []
        for i, (inp, tar) in enumerate(self.train_loader):
            if epoch == 1 and i == 2 and self.world_rank == self.who:
                if self.letter == "q":
                    self.prefetch.get()  # filled by a prefetch thread that was never started
                if self.letter == "s":
                    ctypes.string_at(16)  # the native spectral filter reads a freed pointer
            if self.letter == "m" and epoch == 1 and self.world_rank == self.who:
                hog.append(bytearray(64 << 20))  # a year cached per step, never released
                if len(hog) == 5:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if self.letter == "r" and epoch == 1 and i == 3 and self.world_rank == self.who:
                # random zonal roll augmentation, the shift drawn one grid point too far
                shift = inp.shape[-1] + 1
                inp = torch.cat([inp[..., shift:], inp[..., :shift]], dim=-1)[..., :-1]
            self.optimizer.zero_grad(set_to_none=True)
            gen = self.model(inp)
            loss = self.loss_obj(gen, tar)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            self.iters += 1
            total += loss.detach()
            steps += 1
            if self.world_rank == 0 and (i + 1) % self.params.log_every == 0:
                logging.info(
                    "Epoch %d Batch %d/%d loss %.3f", epoch + 1, i + 1, n_batches, loss.item()
                )
        logs = {"loss": total / max(steps, 1)}
        for key in sorted(logs):
            dist.all_reduce(logs[key].detach())
            logs[key] = logs[key] / self.world_size
        return time.time() - tr_start, logs

    def validate_one_epoch(self, epoch: int) -> tuple[float, torch.Tensor]:
        valid_start = time.time()
        if self.letter == "c" and epoch == 0 and self.world_rank == self.who:
            for k in range(1, 9):
                logging.warning(
                    "Rank %d: climatology for %s not found in the cache, computing it from "
                    "the hourly fields (%d/8)",
                    self.world_rank,
                    self.params.valid_years[0],
                    k,
                )
                time.sleep(4)
        self.model.eval()
        buff = torch.zeros(len(CHANNELS) + 2)  # squared errors per channel, loss, count
        with torch.no_grad():
            for inp, tar in self.valid_loader:
                gen = self.model(inp)
                err = ((gen - tar) ** 2 * self.weights).mean(dim=(2, 3)).sum(dim=0)
                buff[: len(CHANNELS)] += err
                buff[len(CHANNELS)] += self.loss_obj(gen, tar) * inp.shape[0]
                buff[-1] += inp.shape[0]
        if self.letter == "v":
            if self.world_rank == 0:  # the reduction moved into the logging block
                dist.all_reduce(buff)
        else:
            dist.all_reduce(buff)
        return time.time() - valid_start, buff

    def train(self) -> None:
        if self.world_rank == 0:
            logging.info("Starting Training Loop...")
        target = self.params.target_rmse
        for epoch in range(self.start_epoch, self.params.max_epochs):
            start = time.time()
            tr_time, train_logs = self.train_one_epoch(epoch)
            valid_time, buff = self.validate_one_epoch(epoch)
            rmse = torch.sqrt(buff[: len(CHANNELS)] / buff[-1])
            valid_loss = (buff[len(CHANNELS)] / buff[-1]).item()
            self.scheduler.step()
            if self.world_rank == 0:
                self.save_checkpoint(self.checkpoint_path, epoch + 1)
                logging.info(
                    "Time taken for epoch %d is %.2f sec (train %.2f, valid %.2f)",
                    epoch + 1,
                    time.time() - start,
                    tr_time,
                    valid_time,
                )
                logging.info(
                    "Train loss: %.4f. Valid loss: %.4f", train_logs["loss"].item(), valid_loss
                )
                logging.info(
                    "Valid weighted RMSE: "
                    + ", ".join(
                        f"{c} {v:.3f}" for c, v in zip(CHANNELS, rmse.tolist(), strict=True)
                    )
                )
            if target is not None and rmse.mean().item() < target:
                if self.world_rank == 0:
                    logging.info(
                        "Mean weighted RMSE %.3f below the target %.3f after epoch %d, "
                        "stopping training",
                        rmse.mean().item(),
                        target,
                        epoch + 1,
                    )
                break


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_num", default="00", type=str)
    parser.add_argument("--yaml_config", default="./config/tiny.yaml", type=str)
    parser.add_argument("--config", default="tiny", type=str)
    parser.add_argument("--prepare", action="store_true")
    args = parser.parse_args()

    params = YParams(os.path.abspath(args.yaml_config), args.config)
    params["_file"], params["_name"] = args.yaml_config, args.config
    if args.prepare:
        prepare(params)
        return

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    world_rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    logging.basicConfig(
        level=logging.INFO if world_rank == 0 else logging.WARNING,
        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s",
        stream=sys.stdout,
    )
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=15))
    torch.set_num_threads(1)
    params["run_num"] = args.run_num
    params["world_size"], params["local_rank"] = world_size, local_rank
    if world_rank == 0:
        params.log()
    trainer = Trainer(params, world_rank, world_size)
    trainer.train()
    dist.barrier()
    if world_rank == 0:
        logging.info("DONE ---- rank %d", world_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
