"""A ninety-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyeighth-*): class-conditional latent diffusion transformer training in
the way of facebookresearch/DiT's train.py (and the Open-Sora, SiT and fast-DiT scripts built on
it), re-implemented in plain torch (no diffusers, timm or torchvision; linked into each run's
folder as train.py). `torchrun --nnodes=1 --nproc_per_node=N train.py --model DiT-S/2
--data-path data/train --image-size 32 --global-batch-size 8 --epochs 2 --log-every 5
--ckpt-every 20`: DiT's main() as it is, on gloo and the CPU: init_process_group, `assert
args.global_batch_size % dist.get_world_size() == 0`, `seed = args.global_seed *
dist.get_world_size() + rank` and every rank's print() of 'Starting rank=0, seed=0,
world_size=2.'; rank 0 makes results/NNN-DiT-S-2/checkpoints and DiT's create_logger (rank 0
logs '[\\033[34m%(asctime)s\\033[0m] %(message)s' to the console and the experiment's log.txt,
the other ranks get a NullHandler); `assert args.image_size % 8 == 0`; an ImageFolder of PNG
files in class folders (the number of classes taken from the class folders when --num-classes is
not given, as the forks that train on their own data do); DiT (patch embedding, adaLN-Zero
blocks, a label embedding with a classifier-free-guidance null class, learned sigma) with an EMA
copy (requires_grad False, updated every step), DDP, a 1000-step Gaussian diffusion (MSE on the
noise plus the variational bound of the learned variance), a frozen tiny 'VAE' (x8 down) whose
weights are loaded from the local pretrained/sd-vae-ft-<vae> folder (config.json,
diffusion_pytorch_model.bin, standing in for stabilityai/sd-vae-ft-ema), AdamW(lr 1e-4, wd 0), a
DistributedSampler (shuffle, seed global_seed) and a DataLoader(drop_last=True,
pin_memory=True); every --log-every steps the running loss is all-reduced and divided by the
world size, and rank 0 logs '(step=0000005) Train Loss: 0.9876, Train Steps/Sec: 3.21'; every
--ckpt-every steps rank 0 saves {model, ema, opt, args} to checkpoints/0000020.pt ('Saved
checkpoint to ...') and every rank waits in dist.barrier(); 'Done!' and destroy_process_group.
Options of the forks: --mixed-precision bf16 (torch.autocast("cuda", bfloat16) as SiT's script
writes it), --fid-samples (rank 0 samples the EMA model for FID after a checkpoint),
--sample-every/--cfg-scale (rank 0 samples a preview grid with classifier-free guidance).
PIL is not installed here: the PNG files are written and read with zlib (8-bit RGB, filter 0).
gloo on CPU, 15 s collective timeout. `train.py --prepare` writes data/train and the pretrained
VAE folder. A fault in the code is chosen by the TQ_CASE environment variable (a letter and a
rank) and never printed (re-capture with tests/fixtures/real/capture_ninetyeighth.sh after any
edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import logging
import math
import os
import queue
import signal
import struct
import time
import zlib
from collections import OrderedDict
from copy import deepcopy
from glob import glob
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ---------------------------------------------------------------- PNG (no PIL here)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_png(path: Path, pixels: torch.Tensor) -> None:
    """8-bit RGB, filter type 0 on every row."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].contiguous().numpy().tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    path.write_bytes(
        PNG_SIGNATURE
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def read_png(path: str) -> torch.Tensor:
    """HxWx3 uint8 of an 8-bit RGB PNG with filter type 0 (what --prepare writes)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != PNG_SIGNATURE:
        raise ValueError(f"cannot identify image file {path!r}")
    pos, idat, width, height = 8, [], 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    rows = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(height, 1 + 3 * width)
    return rows[:, 1:].reshape(height, width, 3).clone()


# ---------------------------------------------------------------- data

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder(Dataset):
    """torchvision's ImageFolder: one folder per class, classes sorted by name."""

    def __init__(self, root: str, transform) -> None:
        self.root = root
        self.transform = transform
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = []
        for c in self.classes:
            files = sorted(
                f for f in os.listdir(os.path.join(root, c)) if f.lower().endswith(IMG_EXTENSIONS)
            )
            if not files:
                raise FileNotFoundError(
                    f"Found no valid file for the classes {c}. "
                    f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
                )
            self.samples += [(os.path.join(root, c, f), self.class_to_idx[c]) for f in files]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        return self.transform(read_png(path)), target


def center_crop_arr(image: torch.Tensor, image_size: int) -> torch.Tensor:
    """ADM's center crop (a resize to image_size first where the image is larger)."""
    x = image.permute(2, 0, 1).float()
    h, w = x.shape[1:]
    if min(h, w) != image_size:
        scale = image_size / min(h, w)
        size = (round(h * scale), round(w * scale))
        x = F.interpolate(x[None], size=size, mode="bicubic", align_corners=False)[0]
        h, w = size
    top, left = (h - image_size) // 2, (w - image_size) // 2
    return x[:, top : top + image_size, left : left + image_size]


class Transform:
    """center_crop_arr, RandomHorizontalFlip, ToTensor, Normalize(0.5, 0.5)."""

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        x = center_crop_arr(image, self.image_size) / 255.0
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return (x - 0.5) / 0.5


# ---------------------------------------------------------------- VAE (frozen)


class DiagonalGaussian:
    def __init__(self, moments: torch.Tensor) -> None:
        self.mean, logvar = moments.chunk(2, dim=1)
        self.std = torch.exp(0.5 * logvar.clamp(-30.0, 20.0))

    def sample(self) -> torch.Tensor:
        return self.mean + self.std * torch.randn_like(self.mean)


class EncoderOutput:
    def __init__(self, latent_dist: DiagonalGaussian) -> None:
        self.latent_dist = latent_dist


class AutoencoderKL(nn.Module):
    """A tiny stand-in of diffusers' AutoencoderKL: x8 down, 4 latent channels."""

    config_name = "config.json"
    weights_name = "diffusion_pytorch_model.bin"

    def __init__(self, in_channels: int = 3, latent_channels: int = 4, width: int = 16) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
        )
        self.quant_conv = nn.Conv2d(2 * width, 2 * latent_channels, 1)

    def encode(self, x: torch.Tensor) -> EncoderOutput:
        return EncoderOutput(DiagonalGaussian(self.quant_conv(self.encoder(x))))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> AutoencoderKL:
        folder = Path(pretrained_model_name_or_path)
        if not folder.is_dir():
            raise OSError(
                f"{pretrained_model_name_or_path} is not a local folder and is not a valid model "
                "identifier listed on 'https://huggingface.co/models'"
            )
        if not (folder / cls.weights_name).is_file():
            raise OSError(
                f"Error no file named {cls.weights_name} found in directory "
                f"{pretrained_model_name_or_path}."
            )
        config = json.loads((folder / cls.config_name).read_text())
        model = cls(
            config["in_channels"], config["latent_channels"], config["block_out_channels"][0]
        )
        model.load_state_dict(torch.load(folder / cls.weights_name, map_location="cpu"))
        return model.eval()


# ---------------------------------------------------------------- DiT


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size),
        )
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class LabelEmbedder(nn.Module):
    """Class labels to vectors; label dropout for classifier-free guidance."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels: torch.Tensor) -> torch.Tensor:
        drop_ids = torch.rand(labels.shape[0]) < self.dropout_prob
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels: torch.Tensor, train: bool) -> torch.Tensor:
        if train and self.dropout_prob > 0:
            labels = self.token_drop(labels)
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        mlp_hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, mlp_hidden),
            nn.GELU(approximate="tanh"),
            nn.Linear(mlp_hidden, hidden_size),
        )
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(
            c
        ).chunk(6, dim=1)
        h = modulate(self.norm1(x), shift_msa, scale_msa)
        x = x + gate_msa.unsqueeze(1) * self.attn(h, h, h, need_weights=False)[0]
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def get_2d_sincos_pos_embed(embed_dim: int, grid_size: int) -> torch.Tensor:
    grid = torch.arange(grid_size, dtype=torch.float64)
    gy, gx = torch.meshgrid(grid, grid, indexing="ij")

    def one(pos: torch.Tensor, dim: int) -> torch.Tensor:
        omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
        out = pos.reshape(-1)[:, None] * omega[None]
        return torch.cat([torch.sin(out), torch.cos(out)], dim=1)

    return torch.cat([one(gx, embed_dim // 2), one(gy, embed_dim // 2)], dim=1).float()


class DiT(nn.Module):
    """Diffusion model with a Transformer backbone."""

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 64,
        depth: int = 2,
        num_heads: int = 2,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
    ) -> None:
        super().__init__()
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.x_embedder = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        grid = input_size // patch_size
        # fixed sin-cos embedding
        self.pos_embed = nn.Parameter(
            get_2d_sincos_pos_embed(hidden_size, grid)[None], requires_grad=False
        )
        self.blocks = nn.ModuleList(
            [DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)]
        )
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)

        self.apply(_basic_init)
        w = self.x_embedder.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.constant_(self.x_embedder.bias, 0)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        # adaLN-Zero
        for block in self.blocks:
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        c, p = self.out_channels, self.patch_size
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, h * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed
        t = self.t_embedder(t)
        y = self.y_embedder(y, self.training)
        c = t + y
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)

    def forward_with_cfg(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float
    ) -> torch.Tensor:
        half = x[: len(x) // 2]
        combined = torch.cat([half, half], dim=0)
        model_out = self.forward(combined, t, y)
        eps, rest = model_out[:, :3], model_out[:, 3:]
        cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        eps = torch.cat([half_eps, half_eps], dim=0)
        return torch.cat([eps, rest], dim=1)


# tiny stand-ins of the paper's configurations (S: 384 wide, 12 deep, 6 heads in the paper)
DiT_CONFIGS = {"S": (64, 2, 2), "B": (96, 3, 3), "L": (128, 4, 4), "XL": (160, 4, 4)}
DiT_models = {f"DiT-{size}/{p}": (size, p) for size in DiT_CONFIGS for p in (2, 4, 8)}


def build_model(name: str, input_size: int, num_classes: int) -> DiT:
    size, patch = DiT_models[name]
    hidden, depth, heads = DiT_CONFIGS[size]
    return DiT(
        input_size=input_size,
        patch_size=patch,
        hidden_size=hidden,
        depth=depth,
        num_heads=heads,
        num_classes=num_classes,
    )


# ---------------------------------------------------------------- diffusion


class GaussianDiffusion:
    """Linear betas, 1000 steps; the loss of DiT's create_diffusion(timestep_respacing=""):
    MSE on the noise plus the variational bound of the learned variance."""

    def __init__(self, num_timesteps: int = 1000) -> None:
        self.num_timesteps = num_timesteps
        betas = torch.linspace(1e-4, 0.02, num_timesteps, dtype=torch.float64)
        alphas_cumprod = torch.cumprod(1.0 - betas, 0)
        prev = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        self.sqrt_ac = alphas_cumprod.sqrt().float()
        self.sqrt_1mac = (1.0 - alphas_cumprod).sqrt().float()
        post_var = betas * (1.0 - prev) / (1.0 - alphas_cumprod)
        self.post_log_var = torch.log(torch.cat([post_var[1:2], post_var[1:]])).float()
        self.log_betas = torch.log(betas).float()
        self.post_c1 = (betas * prev.sqrt() / (1.0 - alphas_cumprod)).float()
        self.post_c2 = ((1.0 - prev) * (1.0 - betas).sqrt() / (1.0 - alphas_cumprod)).float()
        self.recip_ac = (1.0 / alphas_cumprod).sqrt().float()
        self.recipm1_ac = (1.0 / alphas_cumprod - 1).sqrt().float()

    @staticmethod
    def _at(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return a[t].view(-1, 1, 1, 1)

    def training_losses(self, model, x_start, t, model_kwargs) -> dict[str, torch.Tensor]:
        noise = torch.randn_like(x_start)
        x_t = self._at(self.sqrt_ac, t) * x_start + self._at(self.sqrt_1mac, t) * noise
        out = model(x_t, t, **model_kwargs)
        eps, var_values = out.chunk(2, dim=1)
        mse = ((noise - eps) ** 2).mean(dim=(1, 2, 3))
        # the variational bound, with the mean's gradient stopped (learned sigma)
        frac = (var_values + 1) / 2
        min_log, max_log = self._at(self.post_log_var, t), self._at(self.log_betas, t)
        model_log_var = frac * max_log + (1 - frac) * min_log
        pred_x0 = self._at(self.recip_ac, t) * x_t - self._at(self.recipm1_ac, t) * eps.detach()
        model_mean = self._at(self.post_c1, t) * pred_x0 + self._at(self.post_c2, t) * x_t
        true_mean = self._at(self.post_c1, t) * x_start + self._at(self.post_c2, t) * x_t
        kl = 0.5 * (
            -1.0
            + model_log_var
            - min_log
            + torch.exp(min_log - model_log_var)
            + (true_mean - model_mean) ** 2 * torch.exp(-model_log_var)
        )
        vb = kl.mean(dim=(1, 2, 3)) / math.log(2.0) * self.num_timesteps / 1000.0
        return {"loss": mse + vb, "mse": mse, "vb": vb}


# ---------------------------------------------------------------- DiT's helpers


@torch.no_grad()
def update_ema(ema_model: nn.Module, model: nn.Module, decay: float = 0.9999) -> None:
    ema_params = OrderedDict(ema_model.named_parameters())
    model_params = OrderedDict(model.named_parameters())
    for name, param in model_params.items():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def requires_grad(model: nn.Module, flag: bool = True) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def cleanup() -> None:
    dist.destroy_process_group()


def create_logger(logging_dir: str | None) -> logging.Logger:
    """A logger that writes to a log file and stdout (rank 0 only)."""
    if dist.get_rank() == 0:  # real logger
        logging.basicConfig(
            level=logging.INFO,
            format="[\033[34m%(asctime)s\033[0m] %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
            handlers=[logging.StreamHandler(), logging.FileHandler(f"{logging_dir}/log.txt")],
        )
        logger = logging.getLogger(__name__)
    else:  # dummy logger (does nothing)
        logger = logging.getLogger(__name__)
        logger.addHandler(logging.NullHandler())
    return logger


def native_flip(x: torch.Tensor, letter: str, who: int, rank: int, step: int) -> torch.Tensor:
    """The horizontal flip of the latents (a native kernel in production)."""
    if letter == "n" and rank == who and step == 4:
        ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"flip"), 4)
    return x


@torch.no_grad()
def sample_preview(ema: DiT, diffusion: GaussianDiffusion, latent_size: int, args, step: int):
    """A preview grid of the EMA model (DiT's sample.py, 8 classes, classifier-free guidance)."""
    n = 8
    y = torch.arange(n) % ema.y_embedder.num_classes
    z = torch.randn(n, ema.in_channels, latent_size, latent_size)
    use_cfg = args.cfg_scale > 1.0
    if use_cfg:
        z = torch.cat([z, z], 0)
    for i in reversed(range(0, diffusion.num_timesteps, diffusion.num_timesteps // 25)):
        t = torch.full((z.shape[0],), i, dtype=torch.long)
        out = ema.forward_with_cfg(z, t, y, args.cfg_scale) if use_cfg else ema(z, t, y)
        eps = out[:, : ema.in_channels]
        z = diffusion._at(diffusion.recip_ac, t) * z - diffusion._at(diffusion.recipm1_ac, t) * eps
    return z


# ---------------------------------------------------------------- main


def main(args: argparse.Namespace) -> None:
    letter, who = fault()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    assert args.global_batch_size % dist.get_world_size() == 0, (
        "Batch size must be divisible by world size."
    )
    rank = dist.get_rank()
    seed = args.global_seed * dist.get_world_size() + rank
    torch.manual_seed(seed)
    print(f"Starting rank={rank}, seed={seed}, world_size={dist.get_world_size()}.")

    # Setup an experiment folder:
    if rank == 0:
        os.makedirs(args.results_dir, exist_ok=True)
        experiment_index = len(glob(f"{args.results_dir}/*"))
        model_string_name = args.model.replace("/", "-")
        experiment_dir = f"{args.results_dir}/{experiment_index:03d}-{model_string_name}"
        checkpoint_dir = f"{experiment_dir}/checkpoints"
        os.makedirs(checkpoint_dir, exist_ok=True)
        logger = create_logger(experiment_dir)
        logger.info(f"Experiment directory created at {experiment_dir}")
    else:
        logger = create_logger(None)

    assert args.image_size % 8 == 0, "Image size must be divisible by 8 (for the VAE encoder)."
    latent_size = args.image_size // 8

    # Setup data (first: the label embedding is sized from the class folders):
    dataset = ImageFolder(args.data_path, transform=Transform(args.image_size))
    num_classes = args.num_classes or len(dataset.classes)
    logger.info(f"Dataset contains {len(dataset):,} images ({args.data_path})")

    # Create model:
    model = build_model(args.model, latent_size, num_classes)
    ema = deepcopy(model)  # Create an EMA of the model for use after training
    requires_grad(ema, False)
    model = DDP(model)
    diffusion = GaussianDiffusion()
    vae = AutoencoderKL.from_pretrained(f"pretrained/sd-vae-ft-{args.vae}")
    requires_grad(vae, False)
    logger.info(f"DiT Parameters: {sum(p.numel() for p in model.parameters()):,}")

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)

    sampler = DistributedSampler(
        dataset,
        num_replicas=dist.get_world_size(),
        rank=rank,
        shuffle=True,
        seed=args.global_seed,
    )
    loader = DataLoader(
        dataset,
        batch_size=int(args.global_batch_size // dist.get_world_size()),
        shuffle=False,
        sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=True,
        drop_last=True,
    )

    # Prepare models for training:
    update_ema(ema, model.module, decay=0)  # Ensure EMA is initialized with synced weights
    model.train()
    ema.eval()

    train_steps = 0
    log_steps = 0
    running_loss = 0.0
    start_time = time.time()
    latent_cache: list[torch.Tensor] = []
    prefetched: queue.Queue = queue.Queue()  # filled by a latent prefetch thread

    logger.info(f"Training for {args.epochs} epochs...")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        logger.info(f"Beginning epoch {epoch}...")
        for step, (x, y) in enumerate(loader, start=1):
            if letter == "w" and rank == who and epoch == 1 and step == 3:
                x = prefetched.get()  # the prefetch thread was never started
            with torch.no_grad():
                # Map input images to latent space + normalize latents:
                x = vae.encode(x).latent_dist.sample().mul_(0.18215)
            x = native_flip(x, letter, who, rank, step if epoch == 1 else 0)
            if letter == "m" and rank == who and epoch == 1:
                latent_cache.append(torch.ones(16 << 20))  # 64 MiB a step
                if len(latent_cache) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],))
            model_kwargs = dict(y=y)
            if args.mixed_precision == "bf16":
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss_dict = diffusion.training_losses(model, x, t, model_kwargs)
            else:
                loss_dict = diffusion.training_losses(model, x, t, model_kwargs)
            loss = loss_dict["loss"].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            update_ema(ema, model.module)

            # Log loss values:
            running_loss += loss.item()
            log_steps += 1
            train_steps += 1
            if train_steps % args.log_every == 0 and (letter != "l" or rank == who):
                # Measure training speed:
                end_time = time.time()
                steps_per_sec = log_steps / (end_time - start_time)
                # Reduce loss history over all processes:
                avg_loss = torch.tensor(running_loss / log_steps)
                dist.all_reduce(avg_loss, op=dist.ReduceOp.SUM)
                avg_loss = avg_loss.item() / dist.get_world_size()
                logger.info(
                    f"(step={train_steps:07d}) Train Loss: {avg_loss:.4f}, "
                    f"Train Steps/Sec: {steps_per_sec:.2f}"
                )
                # Reset monitoring variables:
                running_loss = 0.0
                log_steps = 0
                start_time = time.time()
            elif letter == "l" and train_steps % args.log_every == 0:
                running_loss, log_steps, start_time = 0.0, 0, time.time()

            # Save DiT checkpoint:
            if train_steps % args.ckpt_every == 0 and train_steps > 0:
                if rank == 0:
                    checkpoint = {
                        "model": model.module.state_dict(),
                        "ema": ema.state_dict(),
                        "opt": opt.state_dict(),
                        "args": args,
                    }
                    checkpoint_path = f"{checkpoint_dir}/{train_steps:07d}.pt"
                    torch.save(checkpoint, checkpoint_path)
                    logger.info(f"Saved checkpoint to {checkpoint_path}")
                    if args.fid_samples:
                        batches = 8
                        for k in range(1, batches + 1):
                            logger.info(
                                f"Computing FID of the EMA model at step {train_steps:07d}: "
                                f"sampling {args.fid_samples:,} images with 250 DDPM steps "
                                f"(batch {k}/{batches})"
                            )
                            time.sleep(4.0)
                dist.barrier()

            # Sample a preview grid from the EMA model:
            if args.sample_every and train_steps % args.sample_every == 0:
                if rank == 0:
                    logger.info(
                        f"Sampling a preview grid of 8 images from the EMA model "
                        f"(cfg-scale {args.cfg_scale})"
                    )
                    sample_preview(ema, diffusion, latent_size, args, train_steps)
                    logger.info(f"Saved preview to {experiment_dir}/samples/{train_steps:07d}.png")
                dist.barrier()

    model.eval()  # important! This disables randomized embedding dropout
    # do any sampling/FID calculation/etc. with ema (or model) in eval mode ...

    logger.info("Done!")
    cleanup()


# ---------------------------------------------------------------- --prepare

CLASSES = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475", "n01496331"]


def prepare(num_classes: int, per_class: int, size: int) -> None:
    """data/train/<wnid>/<wnid>_<k>.png (a colour and a stripe per class, plus noise) and the
    pretrained VAE folder pretrained/sd-vae-ft-ema (config.json, diffusion_pytorch_model.bin)."""
    ramp = torch.linspace(-1, 1, size)
    for c, wnid in enumerate(CLASSES[:num_classes]):
        g = torch.Generator().manual_seed(98 + c)
        colour = torch.rand(3, generator=g) * 200 + 28
        folder = Path("data/train") / wnid
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            stripes = torch.sin(3.0 * (c + 1) * ramp).view(size, 1, 1)
            if c % 2:
                stripes = stripes.transpose(0, 1)
            img = colour.view(1, 1, 3) + 40 * stripes + 25 * torch.randn(size, size, 3, generator=g)
            pixels = img.clamp(0, 255).to(torch.uint8)
            write_png(folder / f"{wnid}_{1000 + 37 * k}.png", pixels)
    vae_dir = Path("pretrained/sd-vae-ft-ema")
    vae_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    vae = AutoencoderKL()
    config = {
        "_class_name": "AutoencoderKL",
        "in_channels": 3,
        "latent_channels": 4,
        "block_out_channels": [16, 32, 32],
        "sample_size": 256,
        "scaling_factor": 0.18215,
    }
    (vae_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.save(vae.state_dict(), vae_dir / "diffusion_pytorch_model.bin")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare", action="store_true", help="write the data and the VAE")
    parser.add_argument("--prepare-classes", type=int, default=4)
    parser.add_argument("--prepare-per-class", type=int, default=24)
    parser.add_argument("--data-path", type=str, default="data/train")
    parser.add_argument("--results-dir", type=str, default="results")
    parser.add_argument("--model", type=str, choices=list(DiT_models.keys()), default="DiT-S/2")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=1400)
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--global-seed", type=int, default=0)
    parser.add_argument("--vae", type=str, choices=["ema", "mse"], default="ema")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--ckpt-every", type=int, default=50_000)
    parser.add_argument("--mixed-precision", type=str, choices=["no", "bf16"], default="no")
    parser.add_argument("--fid-samples", type=int, default=0)
    parser.add_argument("--sample-every", type=int, default=0)
    parser.add_argument("--cfg-scale", type=float, default=1.0)
    cli = parser.parse_args()
    if cli.prepare:
        prepare(cli.prepare_classes, cli.prepare_per_class, cli.image_size)
    else:
        main(cli)
