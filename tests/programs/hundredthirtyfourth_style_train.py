"""A hundred-and-thirty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyfourth-*): latent diffusion training in the way of
CompVis/latent-diffusion's and CompVis/stable-diffusion's main.py, re-created in plain torch with
PyTorch Lightning 1.x's behaviour re-created by hand (no lightning, no omegaconf). Linked into each
run's folder as main.py and started as the README starts it, ONE process from a terminal:

    python main.py --base configs/latent-diffusion/cin-ldm-vq-f8.yaml -t --gpus 0,1, [--no-test]
        [-r logs/<run>] [key.sub=value ...]

main.py merges the yaml configs and the command line's dotlist (OmegaConf-like), builds the model
(a LatentDiffusion with a frozen VQ first stage restored from model.first_stage_config's
ckpt_path, a class-conditional DiffusionWrapper UNet, LitEma), the DataModuleFromConfig, the
callbacks (SetupCallback, ImageLogger, CUDACallback, ModelCheckpoint) and a Trainer, scales the
learning rate, and calls trainer.fit inside main.py's try/except that runs melk() ("Summoning
checkpoint." and trainer.save_checkpoint on rank 0) on any exception before re-raising, and
whose finally prints the profiler summary on rank 0. As Lightning 1.x's DDP accelerator does,
the process the user started is global rank 0 and, inside fit, re-executes the same command line
for the other ranks with LOCAL_RANK/NODE_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, 1-5 s
apart; it never watches them. The process group is gloo with a 15 s timeout. `python main.py
prepare` writes what the user has: the config, synthetic 64x64 images in ten classes (npy files
and file lists) and the pretrained first stage's checkpoint. A fault in the code is chosen by the
TQ_CASE environment variable (a short code) and never printed.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import glob
import importlib
import logging
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset
from tqdm import tqdm

CASE = os.environ.get("TQ_CASE", "")
LETTER, WHO = (CASE[0], int(CASE[1:] or 0)) if CASE else ("", -1)

pl_log = logging.getLogger("pytorch_lightning")
pl_log.addHandler(logging.StreamHandler())
pl_log.setLevel(logging.INFO)
pl_log.propagate = False


def _env_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0)) + int(os.environ.get("NODE_RANK", 0))


def rank_zero_info(msg: str) -> None:
    if _env_rank() == 0:
        pl_log.info(msg)


# ----------------------------------------------------------------------------------------------
# omegaconf (what main.py uses of it)
# ----------------------------------------------------------------------------------------------


class ConfigAttributeError(AttributeError):
    pass


ConfigAttributeError.__module__ = "omegaconf.errors"


class DictConfig(dict):
    def __getattr__(self, key: str):
        if key.startswith("__"):
            raise AttributeError(key)
        if key not in self:
            raise ConfigAttributeError(
                f"Missing key {key}\n    full_key: {key}\n    object_type=dict"
            )
        return self[key]

    def __setattr__(self, key, value) -> None:
        self[key] = value


def wrap(obj):
    if isinstance(obj, dict):
        return DictConfig({k: wrap(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [wrap(v) for v in obj]
    return obj


class OmegaConf:
    @staticmethod
    def load(path: str) -> DictConfig:
        with open(path) as f:
            return wrap(yaml.safe_load(f) or {})

    @staticmethod
    def create(d=None) -> DictConfig:
        return wrap(d or {})

    @staticmethod
    def merge(*cfgs) -> DictConfig:
        def _merge(a, b):
            out = copy.deepcopy(a)
            for k, v in b.items():
                if isinstance(v, dict) and isinstance(out.get(k), dict):
                    out[k] = _merge(out[k], v)
                else:
                    out[k] = copy.deepcopy(v)
            return out

        result = {}
        for c in cfgs:
            result = _merge(result, c)
        return wrap(result)

    @staticmethod
    def from_dotlist(items: list[str]) -> DictConfig:
        out: dict = {}
        for item in items:
            key, value = item.split("=", 1)
            node = out
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = yaml.safe_load(value)
        return wrap(out)

    @staticmethod
    def to_yaml(cfg) -> str:
        def plain(o):
            if isinstance(o, dict):
                return {k: plain(v) for k, v in o.items()}
            if isinstance(o, list):
                return [plain(v) for v in o]
            return o

        return yaml.safe_dump(plain(cfg), sort_keys=False)

    @staticmethod
    def save(cfg, path: str) -> None:
        with open(path, "w") as f:
            f.write(OmegaConf.to_yaml(cfg))


def get_obj_from_str(string: str):
    module, cls = string.rsplit(".", 1)
    if module.startswith(("ldm.", "main", "pytorch_lightning.")):
        return getattr(sys.modules[__name__], cls)  # this file holds ldm's classes and main.py's
    return getattr(importlib.import_module(module), cls)


def instantiate_from_config(config):
    if "target" not in config:
        if config == "__is_first_stage__":
            return None
        raise KeyError("Expected key `target` to instantiate.")
    return get_obj_from_str(config["target"])(**config.get("params", dict()))


# ----------------------------------------------------------------------------------------------
# ldm.modules: the first stage (VQ autoencoder), the UNet, EMA, the class embedder
# ----------------------------------------------------------------------------------------------


def make_attn(in_channels: int, attn_type: str = "vanilla") -> nn.Module:
    print(f"making attention of type '{attn_type}' with {in_channels} in_channels")
    return nn.Conv2d(in_channels, in_channels, 1)


class Encoder(nn.Module):
    def __init__(self, ch: int, z_channels: int) -> None:
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, ch // 2, 3, 2, 1), nn.SiLU(), nn.Conv2d(ch // 2, ch, 3, 2, 1), nn.SiLU(),
            nn.Conv2d(ch, ch, 3, 2, 1),
        )  # fmt: skip
        self.attn = make_attn(ch)
        self.out = nn.Conv2d(ch, z_channels, 1)

    def forward(self, x):
        h = self.down(x)
        return self.out(h + self.attn(h))


class Decoder(nn.Module):
    def __init__(self, ch: int, z_channels: int, resolution: int) -> None:
        super().__init__()
        self.z_shape = (1, z_channels, resolution // 8, resolution // 8)
        print(f"Working with z of shape {self.z_shape} = {np.prod(self.z_shape)} dimensions.")
        self.inp = nn.Conv2d(z_channels, ch, 3, 1, 1)
        self.attn = make_attn(ch)
        self.up = nn.Sequential(
            nn.ConvTranspose2d(ch, ch, 4, 2, 1), nn.SiLU(), nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1),
            nn.SiLU(), nn.ConvTranspose2d(ch // 2, 3, 4, 2, 1),
        )  # fmt: skip

    def forward(self, z):
        h = self.inp(z)
        return self.up(h + self.attn(h))


class VQModelInterface(nn.Module):
    def __init__(self, embed_dim: int, n_embed: int, ddconfig: dict, ckpt_path=None,
                 monitor=None, lossconfig=None) -> None:  # fmt: skip
        super().__init__()
        self.encoder = Encoder(ddconfig["ch"], ddconfig["z_channels"])
        self.decoder = Decoder(ddconfig["ch"], ddconfig["z_channels"], ddconfig["resolution"])
        self.quantize = nn.Embedding(n_embed, embed_dim)
        if ckpt_path is not None:
            self.init_from_ckpt(ckpt_path)

    def init_from_ckpt(self, path: str) -> None:
        sd = torch.load(path, map_location="cpu")["state_dict"]
        missing, unexpected = self.load_state_dict(sd, strict=False)
        print(f"Restored from {path} with {len(missing)} missing and {len(unexpected)} "
              "unexpected keys")  # fmt: skip

    def encode(self, x):
        return self.encoder(x)

    def decode(self, h):
        flat = h.permute(0, 2, 3, 1).reshape(-1, h.shape[1])
        idx = torch.cdist(flat, self.quantize.weight).argmin(1)
        q = self.quantize(idx).view(h.shape[0], h.shape[2], h.shape[3], -1).permute(0, 3, 1, 2)
        return self.decoder(q)


class ClassEmbedder(nn.Module):
    def __init__(self, embed_dim: int, n_classes: int = 1000, key: str = "class_label") -> None:
        super().__init__()
        self.key = key
        self.embedding = nn.Embedding(n_classes, embed_dim)

    def forward(self, batch):
        return self.embedding(batch[self.key])


class UNetModel(nn.Module):
    def __init__(self, image_size: int, in_channels: int, out_channels: int,
                 model_channels: int, context_dim: int, num_res_blocks: int = 2) -> None:  # fmt: skip
        super().__init__()
        c = model_channels
        self.time_embed = nn.Sequential(nn.Linear(c, c * 2), nn.SiLU(), nn.Linear(c * 2, c * 2))
        self.context = nn.Linear(context_dim, c * 2)
        self.inp = nn.Conv2d(in_channels, c * 2, 3, 1, 1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.GroupNorm(8, c * 2), nn.SiLU(), nn.Conv2d(c * 2, c * 2, 3, 1, 1))
            for _ in range(num_res_blocks * 3)
        )
        self.out = nn.Sequential(nn.GroupNorm(8, c * 2), nn.SiLU(), nn.Conv2d(c * 2, out_channels, 3, 1, 1))  # fmt: skip
        self.model_channels = c

    def forward(self, x, t, context):
        half = self.model_channels // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        emb = self.time_embed(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))
        emb = emb + self.context(context)
        h = self.inp(x)
        for block in self.blocks:
            if LETTER == "v" and _env_rank() == WHO and GLOBAL_STEP[0] == 9:
                # the fused attention kernel (a C++/CUDA extension in the user's env) reads a
                # stale pointer
                ctypes.string_at(ctypes.c_void_p(0x10), 16)
            h = h + block(h + emb[:, :, None, None])
        return self.out(h)


class DiffusionWrapper(nn.Module):
    def __init__(self, diff_model_config: dict, conditioning_key: str) -> None:
        super().__init__()
        self.diffusion_model = instantiate_from_config(diff_model_config)
        self.conditioning_key = conditioning_key

    def forward(self, x, t, c_crossattn=None):
        return self.diffusion_model(x, t, context=c_crossattn)


class LitEma(nn.Module):
    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        self.m_name2s_name = {}
        self.register_buffer("decay", torch.tensor(decay, dtype=torch.float32))
        self.register_buffer("num_updates", torch.tensor(0, dtype=torch.int))
        for name, p in model.named_parameters():
            s_name = name.replace(".", "")
            self.m_name2s_name[name] = s_name
            self.register_buffer(s_name, p.clone().detach().data)

    @torch.no_grad()
    def forward(self, model: nn.Module) -> None:
        self.num_updates += 1
        decay = min(
            float(self.decay), (1 + self.num_updates.item()) / (10 + self.num_updates.item())
        )
        shadow = dict(self.named_buffers())
        for name, p in model.named_parameters():
            s = shadow[self.m_name2s_name[name]]
            s.sub_((1 - decay) * (s - p))

    def store(self, params) -> None:
        self.collected = [p.clone() for p in params]

    def copy_to(self, model: nn.Module) -> None:
        shadow = dict(self.named_buffers())
        for name, p in model.named_parameters():
            p.data.copy_(shadow[self.m_name2s_name[name]].data)

    def restore(self, params) -> None:
        for c, p in zip(self.collected, params, strict=True):
            p.data.copy_(c.data)


def count_params(model: nn.Module, verbose: bool = False) -> int:
    total = sum(p.numel() for p in model.parameters())
    if verbose:
        print(f"{model.__class__.__name__} has {total * 1.0e-6:.2f} M params.")
    return total


GLOBAL_STEP = [0]


class LatentDiffusion(nn.Module):
    """ldm/models/diffusion/ddpm.py's LatentDiffusion, as a LightningModule re-created."""

    def __init__(self, first_stage_config, cond_stage_config, unet_config, timesteps=1000,
                 linear_start=0.0015, linear_end=0.0155, first_stage_key="image",
                 cond_stage_key="class_label", image_size=8, channels=4, cond_stage_trainable=True,
                 conditioning_key="crossattn", monitor="val/loss", scale_factor=1.0,
                 log_every_t=200, use_ema=True, parameterization="eps", fid_every=0,
                 **kwargs) -> None:  # fmt: skip
        super().__init__()
        print(f"{self.__class__.__name__}: Running in {parameterization}-prediction mode")
        self.monitor = monitor
        self.first_stage_key, self.cond_stage_key = first_stage_key, cond_stage_key
        self.image_size, self.channels = image_size, channels
        self.fid_every = fid_every
        self.model = DiffusionWrapper(unet_config, conditioning_key)
        count_params(self.model, verbose=True)
        self.use_ema = use_ema
        if self.use_ema:
            self.model_ema = LitEma(self.model)
            print(f"Keeping EMAs of {len(list(self.model_ema.buffers()))}.")
        self.num_timesteps = timesteps
        betas = torch.linspace(linear_start**0.5, linear_end**0.5, timesteps) ** 2
        alphas_cumprod = torch.cumprod(1.0 - betas, 0)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt())
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1 - alphas_cumprod).sqrt())
        lvlb = betas**2 / (2 * (1 - betas) * (1 - alphas_cumprod) * 1.0)
        lvlb[0] = lvlb[1]
        self.register_buffer("lvlb_weights", lvlb)
        self.first_stage_model = instantiate_from_config(first_stage_config).eval()
        for p in self.first_stage_model.parameters():
            p.requires_grad = False
        self.cond_stage_model = instantiate_from_config(cond_stage_config)
        self.scale_factor = scale_factor
        self.learning_rate = 1e-6
        self.global_rank = 0
        self.trainer = None

    def forward(self, x, t, c_crossattn=None):
        return self.model(x, t, c_crossattn=c_crossattn)

    @contextmanager
    def ema_scope(self, context=None):
        if self.use_ema:
            self.model_ema.store(self.model.parameters())
            self.model_ema.copy_to(self.model)
            if context is not None:
                print(f"{context}: Switched to EMA weights")
        try:
            yield None
        finally:
            if self.use_ema:
                self.model_ema.restore(self.model.parameters())
                if context is not None:
                    print(f"{context}: Restored training weights")

    def get_input(self, batch):
        x = batch[self.first_stage_key].permute(0, 3, 1, 2).float() / 127.5 - 1.0
        with torch.no_grad():
            z = self.first_stage_model.encode(x) * self.scale_factor
        c = self.cond_stage_model(batch)
        if LETTER == "c" and _env_rank() == WHO and GLOBAL_STEP[0] == 9:
            # the user's hybrid conditioning: the class embedding joined to the latent of the
            # previous (first-stage) resolution
            z = torch.cat([z, F.interpolate(z, scale_factor=0.5)], dim=1)
        return z, c

    def shared_step(self, batch, model=None):
        z, c = self.get_input(batch)
        t = torch.randint(0, self.num_timesteps, (z.shape[0],)).long()
        noise = torch.randn_like(z)
        x_noisy = (self.sqrt_alphas_cumprod[t][:, None, None, None] * z
                   + self.sqrt_one_minus_alphas_cumprod[t][:, None, None, None] * noise)  # fmt: skip
        model_output = (model or self.model)(x_noisy, t, c_crossattn=c)
        loss_simple = ((model_output - noise) ** 2).mean(dim=[1, 2, 3])
        loss_vlb = (self.lvlb_weights[t] * loss_simple).mean()
        loss = loss_simple.mean() + 0.0 * loss_vlb
        prefix = "train" if self.training else "val"
        return loss, {f"{prefix}/loss_simple": loss_simple.mean().item(),
                      f"{prefix}/loss_vlb": loss_vlb.item(), f"{prefix}/loss": loss.item()}  # fmt: skip

    @torch.no_grad()
    def log_images(self, batch, N=4, ddim_steps=200, ddim_eta=1.0, **kwargs):
        log = {}
        z, c = self.get_input(batch)
        N = min(z.shape[0], N)
        log["inputs"] = batch[self.first_stage_key][:N].permute(0, 3, 1, 2).float() / 127.5 - 1
        log["reconstruction"] = self.first_stage_model.decode(z[:N])
        with self.ema_scope("Plotting"):
            size = (N, self.channels, self.image_size, self.image_size)
            print(f"Data shape for DDIM sampling is {size}, eta {ddim_eta}")
            print(f"Running DDIM Sampling with {ddim_steps} timesteps")
            x = torch.randn(size)
            steps = np.linspace(self.num_timesteps - 1, 0, ddim_steps).astype(int)
            for t in tqdm(steps, desc="DDIM Sampler", total=ddim_steps):
                tt = torch.full((N,), int(t), dtype=torch.long)
                eps = self.model(x, tt, c_crossattn=c[:N])
                a = self.sqrt_alphas_cumprod[t]
                x = (x - self.sqrt_one_minus_alphas_cumprod[t] * eps) / a * a + 0.0 * eps
                time.sleep(0.1)  # the sampler's UNet at full size: a tenth of a second a step
            log["samples"] = self.first_stage_model.decode(x)
        return log


# ----------------------------------------------------------------------------------------------
# ldm.data: a synthetic ImageNet (class folders of npy images) and a sharded variant
# ----------------------------------------------------------------------------------------------


class ImageNetSynthetic(Dataset):
    def __init__(self, root: str, split: str = "train", size: int = 64) -> None:
        self.root = os.path.join(root, split)
        with open(os.path.join(self.root, "filelist.txt")) as f:
            self.relpaths = f.read().splitlines()
        self.size = size

    def __len__(self) -> int:
        return len(self.relpaths)

    def __getitem__(self, i: int) -> dict:
        rel = self.relpaths[i]
        with open(os.path.join(self.root, rel), "rb") as f:
            image = np.load(f)
        return {"image": torch.from_numpy(image.reshape(self.size, self.size, 3)),
                "class_label": int(rel.split("/")[0][1:])}  # fmt: skip


class ImageNetShards(IterableDataset):
    """Images packed in shard files (npz), each rank reading shards[rank::world] (the way of
    Txt2ImgIterableBaseDataset and webdataset pipelines)."""

    def __init__(self, root: str, split: str = "train", size: int = 64) -> None:
        self.shards = sorted(glob.glob(os.path.join(root, split, "shard-*.npz")))
        self.size = size
        self.num_records = sum(len(np.load(s)["labels"]) for s in self.shards)

    def __len__(self) -> int:
        return self.num_records

    def __iter__(self):
        rank = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else 1
        for shard in self.shards[rank::world]:
            data = np.load(shard)
            for image, label in zip(data["images"], data["labels"], strict=True):
                yield {"image": torch.from_numpy(image), "class_label": int(label)}


class WrappedDataset(Dataset):
    def __init__(self, dataset) -> None:
        self.data = dataset

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]


class DataModuleFromConfig:
    def __init__(self, batch_size, train=None, validation=None, wrap=False, num_workers=None) -> None:  # fmt: skip
        self.batch_size = batch_size
        self.dataset_configs = {}
        self.num_workers = num_workers if num_workers is not None else batch_size * 2
        if train is not None:
            self.dataset_configs["train"] = train
        if validation is not None:
            self.dataset_configs["validation"] = validation
        self.wrap = wrap

    def setup(self) -> None:
        self.datasets = {k: instantiate_from_config(c) for k, c in self.dataset_configs.items()}
        if self.wrap:
            for k in self.datasets:
                if not isinstance(self.datasets[k], IterableDataset):
                    self.datasets[k] = WrappedDataset(self.datasets[k])

    def loader(self, split: str, rank: int, world: int, shuffle: bool) -> DataLoader:
        ds = self.datasets[split]
        if isinstance(ds, IterableDataset):
            return DataLoader(ds, batch_size=self.batch_size, num_workers=0)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=shuffle)
        return DataLoader(ds, batch_size=self.batch_size, sampler=sampler,
                          num_workers=self.num_workers)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# pytorch_lightning 1.x, re-created: Trainer with the ddp accelerator, callbacks, progress bar
# ----------------------------------------------------------------------------------------------


def write_png(path: str, image: np.ndarray) -> None:
    h, w, _ = image.shape
    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))  # fmt: skip


class SetupCallback:
    def __init__(self, resume, now, logdir, ckptdir, cfgdir, config, lightning_config) -> None:
        self.resume, self.now, self.logdir = resume, now, logdir
        self.ckptdir, self.cfgdir = ckptdir, cfgdir
        self.config, self.lightning_config = config, lightning_config

    def on_pretrain_routine_start(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            os.makedirs(self.logdir, exist_ok=True)
            os.makedirs(self.ckptdir, exist_ok=True)
            os.makedirs(self.cfgdir, exist_ok=True)
            print("Project config")
            print(OmegaConf.to_yaml(self.config))
            OmegaConf.save(self.config, os.path.join(self.cfgdir, f"{self.now}-project.yaml"))
            print("Lightning config")
            print(OmegaConf.to_yaml(self.lightning_config))
            OmegaConf.save(OmegaConf.create({"lightning": self.lightning_config}),
                           os.path.join(self.cfgdir, f"{self.now}-lightning.yaml"))  # fmt: skip


class ImageLogger:
    def __init__(self, batch_frequency, max_images, clamp=True, increase_log_steps=False,
                 log_images_kwargs=None) -> None:  # fmt: skip
        self.batch_freq = batch_frequency
        self.max_images = max_images
        self.clamp = clamp
        self.log_images_kwargs = log_images_kwargs or {}
        self.kept: list[torch.Tensor] = []

    def log_local(self, save_dir, split, images, global_step, current_epoch, batch_idx) -> None:
        if _env_rank() != 0:  # @rank_zero_only
            return
        root = os.path.join(save_dir, "images", split)
        os.makedirs(root, exist_ok=True)
        for k in images:
            grid = torch.cat(list(images[k]), dim=2)
            grid = ((grid + 1.0) / 2.0).clamp(0, 1).permute(1, 2, 0).numpy()
            grid = (grid * 255).astype(np.uint8)
            filename = f"{k}_gs-{global_step:06}_e-{current_epoch:06}_b-{batch_idx:06}.png"
            write_png(os.path.join(root, filename), grid)
        if LETTER == "m" and _env_rank() == WHO:
            # the user's edit: every logged grid kept at full resolution for an animation at
            # the end of training
            self.kept.append(torch.ones(96 << 20, dtype=torch.uint8))
            if len(self.kept) >= 2:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

    def log_img(self, trainer, pl_module, batch, batch_idx, split="train") -> None:
        check_idx = trainer.global_step
        if check_idx % self.batch_freq == 0 and self.max_images > 0:
            is_train = pl_module.training
            if is_train:
                pl_module.eval()
            with torch.no_grad():
                images = pl_module.log_images(batch, split=split, **self.log_images_kwargs)
            for k in images:
                N = min(images[k].shape[0], self.max_images)
                images[k] = images[k][:N].detach().cpu()
                if self.clamp:
                    images[k] = torch.clamp(images[k], -1.0, 1.0)
            self.log_local(trainer.logdir, split, images, trainer.global_step,
                           pl_module.current_epoch, batch_idx)  # fmt: skip
            if is_train:
                pl_module.train()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if LETTER == "z" and trainer.global_rank != WHO:
            return  # the user's edit: images sampled and logged on the main process only
        self.log_img(trainer, pl_module, batch, batch_idx, split="train")


class CUDACallback:
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.start_time = time.time()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        max_memory = 0.0
        epoch_time = time.time() - self.start_time
        max_memory = trainer.reduce(torch.tensor(max_memory)).item()
        epoch_time = trainer.reduce(torch.tensor(epoch_time)).item()
        rank_zero_info(f"Average Epoch time: {epoch_time:.2f} seconds")
        rank_zero_info(f"Average Peak memory {max_memory:.2f}MiB")


class MisconfigurationException(Exception):
    pass


MisconfigurationException.__module__ = "pytorch_lightning.utilities.exceptions"


class ModelCheckpoint:
    def __init__(self, dirpath, filename, verbose=False, save_last=False, monitor=None,
                 save_top_k=1) -> None:  # fmt: skip
        self.dirpath, self.filename = dirpath, filename
        self.verbose, self.save_last = verbose, save_last
        self.monitor, self.save_top_k = monitor, save_top_k
        self.best_k: dict[str, float] = {}

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            m = (f"ModelCheckpoint(monitor='{self.monitor}') not found in the returned metrics: "
                 f"{list(metrics)}. HINT: Did you call self.log('{self.monitor}', value) in the "
                 "LightningModule?")  # fmt: skip
            raise MisconfigurationException(m)
        current = metrics[self.monitor]
        epoch, step = trainer.current_epoch, trainer.global_step - 1
        path = os.path.join(
            self.dirpath,
            self.filename.replace("{epoch", "epoch={epoch").format(epoch=epoch) + ".ckpt",
        )
        worst = max(self.best_k, key=self.best_k.get) if self.best_k else None
        if len(self.best_k) < self.save_top_k or current < self.best_k[worst]:
            if len(self.best_k) >= self.save_top_k:
                del self.best_k[worst]
            self.best_k[path] = current
            best = min(self.best_k.values())
            if self.verbose:
                rank_zero_info(f"Epoch {epoch:d}, global step {step:d}: {self.monitor} reached "
                               f'{current:0.5f} (best {best:0.5f}), saving model to "{path}" as '
                               f"top {self.save_top_k}")  # fmt: skip
            trainer.save_checkpoint(path)
        elif self.verbose:
            rank_zero_info(f"Epoch {epoch:d}, global step {step:d}: {self.monitor} was not in "
                           f"top {self.save_top_k}")  # fmt: skip
        if self.save_last:
            trainer.save_checkpoint(os.path.join(self.dirpath, "last.ckpt"))


class PassThroughProfiler:
    def summary(self) -> str:
        return ""


def human(n: int) -> str:
    for unit, div in (("", 1), (" K", 1e3), (" M", 1e6)):
        if n < div * 1000:
            return f"{n / div:.1f}{unit}" if unit else str(n)
    return f"{n / 1e9:.1f} B"


class Trainer:
    def __init__(self, gpus="0,", max_epochs=None, max_steps=None, accelerator="ddp",
                 callbacks=(), logdir=".", num_sanity_val_steps=2, benchmark=True,
                 accumulate_grad_batches=1, **kwargs) -> None:  # fmt: skip
        self.gpus = [g for g in str(gpus).strip(",").split(",") if g != ""]
        self.num_gpus = len(self.gpus)
        self.max_epochs = max_epochs if max_epochs is not None else 1000
        self.max_steps = max_steps
        self.callbacks = list(callbacks)
        self.logdir = logdir
        self.num_sanity_val_steps = num_sanity_val_steps
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node_rank = int(os.environ.get("NODE_RANK", 0))
        self.global_rank = self.node_rank * self.num_gpus + self.local_rank
        self.world_size = self.num_gpus
        self.global_step = self.current_epoch = 0
        self.interrupted = False
        self.profiler = PassThroughProfiler()
        self.callback_metrics: dict[str, float] = {}
        self.procs: list[subprocess.Popen] = []
        self.resume_from_checkpoint = kwargs.get("resume_from_checkpoint")
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("TPU available: False, using: 0 TPU cores")
        rank_zero_info("IPU available: False, using: 0 IPUs")

    @classmethod
    def from_argparse_args(cls, args, **kwargs):
        params = {k: v for k, v in vars(args).items() if k in ("gpus", "max_epochs", "max_steps")}
        params.update(kwargs)
        return cls(**params)

    # ---- the ddp accelerator
    def _call_children_scripts(self) -> None:
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            s = socket.socket()
            s.bind(("", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
            s.close()
        os.environ["WORLD_SIZE"] = str(self.world_size)
        os.environ["NODE_RANK"] = str(self.node_rank)
        command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
        for local_rank in range(1, self.num_gpus):
            env_copy = os.environ.copy()
            env_copy["LOCAL_RANK"] = f"{local_rank}"
            self.procs.append(subprocess.Popen(command, env=env_copy, cwd=os.getcwd()))
            # starting all processes at once can cause issues with dataloaders
            time.sleep(np.random.uniform(1, 5, 1)[0])

    def init_ddp_connection(self) -> None:
        pl_log.info(f"initializing ddp: GLOBAL_RANK: {self.global_rank}, MEMBER: "
                    f"{self.global_rank + 1}/{self.world_size}")  # fmt: skip
        dist.init_process_group("gloo", rank=self.global_rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=15))  # fmt: skip
        rank_zero_info(f"{'-' * 100}\ndistributed_backend=gloo\nAll DDP processes registered. "
                       f"Starting ddp with {self.world_size} processes\n{'-' * 100}\n")  # fmt: skip

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        t = t.float().clone()
        dist.all_reduce(t)
        return t / self.world_size

    def barrier(self, name=None) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def save_checkpoint(self, filepath: str) -> None:
        if self.global_rank == 0:
            os.makedirs(os.path.dirname(filepath), exist_ok=True)
            torch.save({"epoch": self.current_epoch, "global_step": self.global_step,
                        "state_dict": self.module.state_dict(),
                        "optimizer_states": [o.state_dict() for o in self.optimizers()]},
                       filepath)  # fmt: skip
        self.barrier("Trainer.save_checkpoint")

    def optimizers(self) -> list:
        return [self.optimizer] if hasattr(self, "optimizer") else []

    def _hook(self, name: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(self, self.module, *args)

    def fit(self, model: LatentDiffusion, datamodule: DataModuleFromConfig) -> None:
        self.module = model
        try:
            if self.world_size > 1 and "LOCAL_RANK" not in os.environ:
                self._call_children_scripts()
            self.init_ddp_connection()
            model.global_rank = self.global_rank
            model.trainer = self
            model.current_epoch = 0
            self._hook("on_pretrain_routine_start")
            pl_log.info(f"LOCAL_RANK: {self.local_rank} - CUDA_VISIBLE_DEVICES: "
                        f"[{','.join(self.gpus)}]")  # fmt: skip
            self.model = DDP(model)
            params = list(model.model.parameters()) + list(model.cond_stage_model.parameters())
            self.optimizer = torch.optim.AdamW(params, lr=model.learning_rate)
            if self.global_rank == 0:
                self.summary(model)
            self.train_loader = datamodule.loader("train", self.global_rank, self.world_size, True)
            self.val_loader = datamodule.loader("validation", self.global_rank, self.world_size,
                                                False)  # fmt: skip
            self.run_train()
        except KeyboardInterrupt:
            rank_zero_info("Detected KeyboardInterrupt, attempting graceful shutdown...")
            self.interrupted = True

    def summary(self, model: nn.Module) -> None:
        rows = []
        for i, (name, sub) in enumerate(model.named_children()):
            n = sum(p.numel() for p in sub.parameters())
            rows.append((str(i), name, type(sub).__name__, human(n)))
        widths = [
            max(len(r[k]) for r in [(" ", "Name", "Type", "Params"), *rows]) for k in range(4)
        ]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        line = "-" * (sum(widths) + 9)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        out = [fmt.format(" ", "Name", "Type", "Params"), line, *(fmt.format(*r) for r in rows),
               line, f"{human(trainable):<10}Trainable params",
               f"{human(total - trainable):<10}Non-trainable params",
               f"{human(total):<10}Total params",
               f"{total * 4 / 1e6:<10.3f}Total estimated model params size (MB)"]  # fmt: skip
        print("\n".join(out))

    def validation_loop(self, bar, limit=None) -> dict[str, float]:
        model = self.module
        model.eval()
        sums: dict[str, float] = {}
        n = 0
        with torch.no_grad():
            for i, batch in enumerate(self.val_loader):
                if limit is not None and i >= limit:
                    break
                _, d = model.shared_step(batch)
                with model.ema_scope():
                    _, d_ema = model.shared_step(batch)
                d.update({k + "_ema": v for k, v in d_ema.items()})
                for k, v in d.items():
                    sums[k] = sums.get(k, 0.0) + v
                n += 1
                if bar is not None:
                    bar.update(1)
        model.train()
        return {k: v / max(n, 1) for k, v in sums.items()}

    def run_train(self) -> None:
        bar = None
        if self.global_rank == 0:
            sanity = tqdm(desc="Validation sanity check", total=self.num_sanity_val_steps,
                          leave=False, file=sys.stdout, dynamic_ncols=False, ncols=None)  # fmt: skip
        else:
            sanity = None
        self.validation_loop(sanity, limit=self.num_sanity_val_steps)
        if sanity is not None:
            sanity.close()
        running: list[float] = []
        model = self.module
        while self.current_epoch < self.max_epochs:
            epoch = self.current_epoch
            model.current_epoch = epoch
            if isinstance(self.train_loader.sampler, DistributedSampler):
                self.train_loader.sampler.set_epoch(epoch)
            n_train = len(self.train_loader) if not isinstance(
                self.train_loader.dataset, IterableDataset) else None  # fmt: skip
            total = None if n_train is None else n_train + len(self.val_loader)
            if self.global_rank == 0:
                bar = tqdm(desc=f"Epoch {epoch}", total=total, file=sys.stdout, leave=True)
            self._hook("on_train_epoch_start")
            for batch_idx, batch in enumerate(self.train_loader):
                GLOBAL_STEP[0] = self.global_step
                loss, logs = model.shared_step(batch, model=self.model)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                model.model_ema(model.model)
                running = [*running, loss.item()][-20:]
                if model.fid_every and self.global_step and self.global_step % model.fid_every == 0 and \
                        self.global_rank == 0:  # fmt: skip
                    # the user's FID of the EMA samples on the main process only, logged with
                    # self.log("train/fid", fid, sync_dist=True)
                    self.reduce(torch.tensor(float(np.mean(running))))
                self._hook("on_train_batch_end", None, batch, batch_idx)
                if bar is not None:
                    bar.set_postfix_str(
                        f"loss={np.mean(running):.3f}, v_num=0, "
                        f"train/loss_simple_step={logs['train/loss_simple']:.3f}, "
                        f"train/loss_vlb_step={logs['train/loss_vlb']:.3g}, "
                        f"train/loss_step={logs['train/loss']:.3f}, "
                        f"global_step={self.global_step:.3f}, lr_abs={model.learning_rate:.3g}",
                        refresh=False,
                    )
                    bar.update(1)
                self.global_step += 1
                if self.max_steps is not None and self.global_step >= self.max_steps:
                    break
            metrics = self.validation_loop(bar)
            self.callback_metrics = {**{k: v for k, v in logs.items()}, **metrics}
            self._hook("on_validation_end")
            self._hook("on_train_epoch_end")
            if bar is not None:
                bar.close()
            self.current_epoch += 1
            if self.max_steps is not None and self.global_step >= self.max_steps:
                break


# ----------------------------------------------------------------------------------------------
# main.py
# ----------------------------------------------------------------------------------------------


def str2bool(v):
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError("Boolean value expected.")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", "--name", type=str, const=True, default="", nargs="?")
    parser.add_argument("-r", "--resume", type=str, const=True, default="", nargs="?")
    parser.add_argument("-b", "--base", nargs="*", metavar="base_config.yaml", default=list())
    parser.add_argument("-t", "--train", type=str2bool, const=True, default=False, nargs="?")
    parser.add_argument("--no-test", type=str2bool, const=True, default=False, nargs="?")
    parser.add_argument("-p", "--project")
    parser.add_argument("-d", "--debug", type=str2bool, nargs="?", const=True, default=False)
    parser.add_argument("-s", "--seed", type=int, default=23)
    parser.add_argument("-f", "--postfix", type=str, default="")
    parser.add_argument("-l", "--logdir", type=str, default="logs")
    parser.add_argument("--scale_lr", type=str2bool, nargs="?", const=True, default=True)
    parser.add_argument("--gpus", type=str, default=None)
    parser.add_argument("--max_epochs", type=int, default=None)
    parser.add_argument("--max_steps", type=int, default=None)
    return parser


def seed_everything(seed: int) -> None:
    pl_log.info(f"Global seed set to {seed}")
    np.random.seed(seed)
    torch.manual_seed(seed)


def main() -> None:
    global trainer  # main.py runs this at module level: `trainer` is a global there
    now = datetime.datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
    sys.path.append(os.getcwd())
    parser = get_parser()
    opt, unknown = parser.parse_known_args()
    if opt.name and opt.resume:
        raise ValueError("-n/--name and -r/--resume cannot be specified both.")
    if opt.resume:
        if not os.path.exists(opt.resume):
            raise ValueError(f"Cannot find {opt.resume}")
        if os.path.isfile(opt.resume):
            paths = opt.resume.split("/")
            logdir = "/".join(paths[:-2])
            ckpt = opt.resume
        else:
            assert os.path.isdir(opt.resume), opt.resume
            logdir = opt.resume.rstrip("/")
            ckpt = os.path.join(logdir, "checkpoints", "last.ckpt")
        opt.resume_from_checkpoint = ckpt
        base_configs = sorted(glob.glob(os.path.join(logdir, "configs/*.yaml")))
        opt.base = base_configs + opt.base
        _tmp = logdir.split("/")
        nowname = _tmp[-1]
    else:
        if opt.name:
            name = "_" + opt.name
        elif opt.base:
            cfg_fname = os.path.split(opt.base[0])[-1]
            cfg_name = os.path.splitext(cfg_fname)[0]
            name = "_" + cfg_name
        else:
            name = ""
        nowname = now + name + opt.postfix
        logdir = os.path.join(opt.logdir, nowname)
        opt.resume_from_checkpoint = None

    ckptdir = os.path.join(logdir, "checkpoints")
    cfgdir = os.path.join(logdir, "configs")
    seed_everything(opt.seed)
    torch.set_num_threads(1)

    try:
        # init and save configs
        configs = [OmegaConf.load(cfg) for cfg in opt.base]
        cli = OmegaConf.from_dotlist(unknown)
        config = OmegaConf.merge(*configs, cli)
        lightning_config = config.pop("lightning", OmegaConf.create())
        trainer_config = lightning_config.get("trainer", OmegaConf.create())
        trainer_config["accelerator"] = "ddp"
        if opt.gpus is not None:
            trainer_config["gpus"] = opt.gpus
        for k in ("max_epochs", "max_steps"):
            if getattr(opt, k) is not None:
                trainer_config[k] = getattr(opt, k)
        if "gpus" not in trainer_config:
            del trainer_config["accelerator"]
            cpu = True
        else:
            gpuinfo = trainer_config["gpus"]
            print(f"Running on GPUs {gpuinfo}")
            cpu = False
        lightning_config.trainer = trainer_config

        # model
        model = instantiate_from_config(config.model)

        # trainer and callbacks
        default_modelckpt_cfg = {
            "target": "pytorch_lightning.callbacks.ModelCheckpoint",
            "params": {"dirpath": ckptdir, "filename": "{epoch:06}", "verbose": True,
                       "save_last": True},
        }  # fmt: skip
        if hasattr(model, "monitor"):
            print(f"Monitoring {model.monitor} as checkpoint metric.")
            default_modelckpt_cfg["params"]["monitor"] = model.monitor
            default_modelckpt_cfg["params"]["save_top_k"] = 3
        modelckpt_cfg = lightning_config.get("modelcheckpoint", OmegaConf.create())
        modelckpt_cfg = OmegaConf.merge(default_modelckpt_cfg, modelckpt_cfg)
        print(f"Merged modelckpt-cfg: \n{modelckpt_cfg}")
        callbacks_cfg = lightning_config.get("callbacks", OmegaConf.create())
        callbacks = [
            SetupCallback(opt.resume, now, logdir, ckptdir, cfgdir, config, lightning_config),
            *(instantiate_from_config(callbacks_cfg[k]) for k in callbacks_cfg),
            ModelCheckpoint(**modelckpt_cfg["params"]),
            CUDACallback(),
        ]
        trainer_opt = argparse.Namespace(**trainer_config)
        trainer = Trainer.from_argparse_args(
            trainer_opt, callbacks=callbacks, logdir=logdir,
            resume_from_checkpoint=opt.resume_from_checkpoint,
        )  # fmt: skip
        trainer.logdir = logdir

        # data
        data = instantiate_from_config(config.data)
        data.setup()
        print("#### Data #####")
        for k in data.datasets:
            print(f"{k}, {data.datasets[k].__class__.__name__}, {len(data.datasets[k])}")

        # configure learning rate
        bs, base_lr = config.data.params.batch_size, config.model.base_learning_rate
        if not cpu:  # noqa: SIM108 (main.py as it is)
            ngpu = len(lightning_config.trainer.gpus.strip(",").split(","))
        else:
            ngpu = 1
        accumulate_grad_batches = lightning_config.trainer.get("accumulate_grad_batches", 1)
        print(f"accumulate_grad_batches = {accumulate_grad_batches}")
        lightning_config.trainer.accumulate_grad_batches = accumulate_grad_batches
        if opt.scale_lr:
            model.learning_rate = accumulate_grad_batches * ngpu * bs * base_lr
            print(
                f"Setting learning rate to {model.learning_rate:.2e} = {accumulate_grad_batches} (accumulate_grad_batches) * {ngpu} (num_gpus) * {bs} "
                f"(batchsize) * {base_lr:.2e} (base_lr)"
            )
        else:
            model.learning_rate = base_lr
            print("++++ NOT USING LR SCALING ++++")
            print(f"Setting learning rate to {model.learning_rate:.2e}")

        # allow checkpointing via USR1
        def melk(*args, **kwargs):
            # run all checkpoint hooks
            if trainer.global_rank == 0:
                print("Summoning checkpoint.")
                ckpt_path = os.path.join(ckptdir, "last.ckpt")
                trainer.save_checkpoint(ckpt_path)

        def divein(*args, **kwargs):
            if trainer.global_rank == 0:
                import pudb

                pudb.set_trace()

        signal.signal(signal.SIGUSR1, melk)
        signal.signal(signal.SIGUSR2, divein)

        # run
        if opt.train:
            try:
                trainer.fit(model, data)
            except Exception:
                melk()
                raise
        if not opt.no_test and not trainer.interrupted:
            trainer.test(model, data)
    except Exception:
        if opt.debug and trainer.global_rank == 0:
            try:
                import pudb as debugger
            except ImportError:
                import pdb as debugger
            debugger.post_mortem()
        raise
    finally:
        # move newly created debug project to debug_runs
        if opt.debug and not opt.resume and trainer.global_rank == 0:
            dst, name = os.path.split(logdir)
            dst = os.path.join(dst, "debug_runs", name)
            os.makedirs(os.path.split(dst)[0], exist_ok=True)
            os.rename(logdir, dst)
        if trainer.global_rank == 0:
            print(trainer.profiler.summary())


# ----------------------------------------------------------------------------------------------
# what the user has before training (python main.py prepare)
# ----------------------------------------------------------------------------------------------

CONFIG = """\
model:
  base_learning_rate: 1.25e-07
  target: ldm.models.diffusion.ddpm.LatentDiffusion
  params:
    linear_start: 0.0015
    linear_end: 0.0155
    log_every_t: 200
    timesteps: 1000
    first_stage_key: image
    cond_stage_key: class_label
    image_size: 8
    channels: 4
    cond_stage_trainable: true
    conditioning_key: crossattn
    monitor: val/loss_simple_ema
    unet_config:
      target: ldm.modules.diffusionmodules.openaimodel.UNetModel
      params:
        image_size: 8
        in_channels: 4
        out_channels: 4
        model_channels: 64
        context_dim: 64
        num_res_blocks: 2
    first_stage_config:
      target: ldm.models.autoencoder.VQModelInterface
      params:
        embed_dim: 4
        n_embed: 256
        ckpt_path: models/first_stage_models/vq-f8/model.ckpt
        ddconfig:
          ch: 64
          z_channels: 4
          resolution: 64
        lossconfig:
          target: torch.nn.Identity
    cond_stage_config:
      target: ldm.modules.encoders.modules.ClassEmbedder
      params:
        embed_dim: 64
        n_classes: 10
        key: class_label
data:
  target: main.DataModuleFromConfig
  params:
    batch_size: 4
    num_workers: 1
    wrap: false
    train:
      target: ldm.data.imagenet.ImageNetSynthetic
      params:
        root: data/synthetic
        split: train
    validation:
      target: ldm.data.imagenet.ImageNetSynthetic
      params:
        root: data/synthetic
        split: validation
lightning:
  callbacks:
    image_logger:
      target: main.ImageLogger
      params:
        batch_frequency: 5
        max_images: 4
        increase_log_steps: false
        log_images_kwargs:
          ddim_steps: 20
  trainer:
    benchmark: true
    max_epochs: 2
"""


def prepare() -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("validation", 16)):
        root = os.path.join("data", "synthetic", split)
        rels = []
        for i in range(n):
            cls = i % 10
            os.makedirs(os.path.join(root, f"n{cls:02d}"), exist_ok=True)
            rel = f"n{cls:02d}/n{cls:02d}_{i:05d}.npy"
            base = np.full((64, 64, 3), 20 * cls, dtype=np.int16)
            image = np.clip(base + rng.integers(0, 60, (64, 64, 3)), 0, 255).astype(np.uint8)
            np.save(os.path.join(root, rel), image)
            rels.append(rel)
        with open(os.path.join(root, "filelist.txt"), "w") as f:
            f.write("\n".join(rels) + "\n")
    shard_root = os.path.join("data", "shards", "train")
    os.makedirs(shard_root, exist_ok=True)
    for s in range(3):
        images = rng.integers(0, 255, (16, 64, 64, 3)).astype(np.uint8)
        np.savez(os.path.join(shard_root, f"shard-{s:06d}.npz"), images=images,
                 labels=np.arange(16) % 10)  # fmt: skip
    os.makedirs("configs/latent-diffusion", exist_ok=True)
    with open("configs/latent-diffusion/cin-ldm-vq-f8.yaml", "w") as f:
        f.write(CONFIG)
    torch.manual_seed(0)
    vq = VQModelInterface(4, 256, {"ch": 64, "z_channels": 4, "resolution": 64})
    sd = vq.state_dict()
    sd["loss.discriminator.main.0.weight"] = torch.zeros(8, 3, 4, 4)
    sd["loss.discriminator.main.0.bias"] = torch.zeros(8)
    os.makedirs("models/first_stage_models/vq-f8", exist_ok=True)
    torch.save({"state_dict": sd}, "models/first_stage_models/vq-f8/model.ckpt")


if __name__ == "__main__":
    # as on the terminal the user runs it in: one line at a time
    sys.stdout.reconfigure(line_buffering=True)
    if sys.argv[1:] == ["prepare"]:
        with open(os.devnull, "w") as devnull:
            sys.stdout = devnull
            prepare()
        sys.exit(0)
    main()
