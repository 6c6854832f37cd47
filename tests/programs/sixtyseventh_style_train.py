"""A tiny DDPM trained in the way of lucidrains' denoising-diffusion-pytorch `Trainer`: a small
Unet-like denoiser, a GaussianDiffusion wrapper (cosine beta schedule, pred_v objective), the
Trainer with Accelerate's Accelerator(split_batches=True, mixed_precision='no'), an EMA of the
model on the main process only, a tqdm bar on the main process ('loss: 0.1234'), sample grids
(results/sample-{milestone}.png) and milestones (results/model-{milestone}.pt with step, model,
opt, ema, scaler and version) every `save_and_sample_every` steps, an optional FID on the main
process, `trainer.load(milestone)` to resume and 'training complete' at the end. Launched with
`accelerate launch --config_file accelerate_config.yaml sixtyseventh_style_train.py ...`.

The data is a folder of tiny synthetic "images" (3x8x8 tensors saved with torch.save, one file
each), made with --make-data. PIL is not installed here: a sample grid is written as a raw
tensor under the .png name. A fault in the code is chosen by the DIFFQ environment variable (a
short code, never printed); see FAULTS.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import threading
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, InitProcessGroupKwargs
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

__version__ = "2.1.3"

# DIFFQ code -> (fault, rank it hits, step it hits at)
FAULTS = {
    "": (None, -1, -1),
    "a0": ("solo_stop", -1, -1),  # the main process stops on its own loss, no trigger
    "b0": ("slow_sample", 0, -1),  # sampling on the main process sleeps per timestep
    "c0": ("fid_gather", 0, -1),  # the FID gathers features on the main process only
    "d1": ("t_edge", 1, 7),  # timesteps sampled one past the schedule
    "e0": ("grid_cache", 0, -1),  # every sample grid kept in memory, SIGKILL as the OOM killer
    "f1": ("null_unet", 1, 9),  # the native conv fast path reads address 0
    "g0": ("png_wait", 0, -1),  # the grid writer waits for a thread never started
    "h2": ("worker_kill", 2, 8),  # the DataLoader worker is SIGKILLed (shm)
}


def exists(x):
    return x is not None


def cycle(dl):
    while True:
        yield from dl


def num_to_groups(num, divisor):
    groups = num // divisor
    remainder = num % divisor
    arr = [divisor] * groups
    if remainder > 0:
        arr.append(remainder)
    return arr


# dataset


class ImageFolder(Dataset):
    def __init__(self, folder, image_size, exts=("pt",), fault=None, rank=0):
        super().__init__()
        self.folder = folder
        self.image_size = image_size
        self.paths = sorted(p for ext in exts for p in Path(f"{folder}").glob(f"**/*.{ext}"))
        self.fault = fault
        self.reads = 0

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        path = self.paths[index]
        self.reads += 1
        if self.fault == "worker_kill" and self.reads > 8 * 4 + 2:
            os.kill(os.getpid(), signal.SIGKILL)  # the container's /dev/shm ran out
        img = torch.load(path, weights_only=True)
        return img * 2 - 1


# model


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, time_emb_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.SiLU(), nn.Linear(time_emb_dim, dim_out * 2))
        self.block1 = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.block2 = nn.Conv2d(dim_out, dim_out, 3, padding=1)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, time_emb):
        scale, shift = self.mlp(time_emb)[:, :, None, None].chunk(2, dim=1)
        h = F.silu(self.block1(x)) * (scale + 1) + shift
        h = F.silu(self.block2(h))
        return h + self.res_conv(x)


class Unet(nn.Module):
    def __init__(self, dim=16, channels=3, fault=None):
        super().__init__()
        self.channels = channels
        time_dim = dim * 4
        self.time_mlp = nn.Sequential(
            SinusoidalPosEmb(dim),
            nn.Linear(dim, time_dim),
            nn.GELU(),
            nn.Linear(time_dim, time_dim),
        )
        self.init_conv = nn.Conv2d(channels, dim, 7, padding=3)
        self.down = ResnetBlock(dim, dim * 2, time_dim)
        self.mid = ResnetBlock(dim * 2, dim * 2, time_dim)
        self.up = ResnetBlock(dim * 3, dim, time_dim)
        self.final_conv = nn.Conv2d(dim, channels, 1)
        self.fault = fault

    def forward(self, x, time):
        if self.fault is not None and self.fault():
            ctypes.string_at(0)  # the fused conv kernel's workspace pointer is NULL
        t = self.time_mlp(time)
        x = self.init_conv(x)
        r = x.clone()
        h = self.mid(self.down(x, t), t)
        h = self.up(torch.cat((h, r), dim=1), t)
        return self.final_conv(h)


# gaussian diffusion


def extract(a, t, x_shape):
    b, *_ = t.shape
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def cosine_beta_schedule(timesteps, s=0.008):
    steps = timesteps + 1
    t = torch.linspace(0, timesteps, steps, dtype=torch.float64) / timesteps
    alphas_cumprod = torch.cos((t + s) / (1 + s) * math.pi * 0.5) ** 2
    alphas_cumprod = alphas_cumprod / alphas_cumprod[0]
    betas = 1 - (alphas_cumprod[1:] / alphas_cumprod[:-1])
    return torch.clip(betas, 0, 0.999)


class GaussianDiffusion(nn.Module):
    def __init__(self, model, *, image_size, timesteps=1000, beta_schedule="cosine"):
        super().__init__()
        self.model = model
        self.channels = model.channels
        self.image_size = image_size
        betas = cosine_beta_schedule(timesteps)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        self.num_timesteps = int(betas.shape[0])
        register = partial(self.register_buffer, persistent=False)
        register("betas", betas.float())
        register("alphas_cumprod", alphas_cumprod.float())
        register("sqrt_alphas_cumprod", torch.sqrt(alphas_cumprod).float())
        register("sqrt_one_minus_alphas_cumprod", torch.sqrt(1.0 - alphas_cumprod).float())
        register("sqrt_recip_alphas", torch.sqrt(1.0 / alphas).float())
        self.t_edge = False
        self.slow = 0.0

    def q_sample(self, x_start, t, noise):
        return (
            extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
            + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise
        )

    def p_losses(self, x_start, t):
        noise = torch.randn_like(x_start)
        x = self.q_sample(x_start=x_start, t=t, noise=noise)
        model_out = self.model(x, t)
        v = (
            extract(self.sqrt_alphas_cumprod, t, x_start.shape) * noise
            - extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * x_start
        )
        return F.mse_loss(model_out, v)

    def forward(self, img):
        b = img.shape[0]
        hi = self.num_timesteps + 1 if self.t_edge else self.num_timesteps
        t = torch.randint(0, hi, (b,), device=img.device).long()
        if self.t_edge:
            t[0] = self.num_timesteps
        return self.p_losses(img, t)

    @torch.inference_mode()
    def sample(self, batch_size=16, sampling_timesteps=50):
        img = torch.randn((batch_size, self.channels, self.image_size, self.image_size))
        times = torch.linspace(-1, self.num_timesteps - 1, sampling_timesteps + 1).int()
        times = list(reversed(times.tolist()))[:-1]
        for time_ in tqdm(times, desc="sampling loop time step"):
            t = torch.full((batch_size,), time_, dtype=torch.long)
            v = self.model(img, t)
            a = extract(self.sqrt_alphas_cumprod, t, img.shape)
            s = extract(self.sqrt_one_minus_alphas_cumprod, t, img.shape)
            img = (a * img - s * v).clamp(-1, 1)
            if self.slow:
                time.sleep(self.slow)
        return (img + 1) * 0.5


class EMA(nn.Module):
    def __init__(self, model, beta=0.995, update_every=10):
        super().__init__()
        import copy

        self.ema_model = copy.deepcopy(model)
        self.ema_model.requires_grad_(False)
        self.beta = beta
        self.update_every = update_every
        self.step = 0

    def update(self, model):
        self.step += 1
        if self.step % self.update_every:
            return
        with torch.no_grad():
            for e, p in zip(self.ema_model.parameters(), model.parameters(), strict=True):
                e.lerp_(p, 1 - self.beta)


# trainer


class Trainer:
    def __init__(
        self,
        diffusion_model,
        folder,
        *,
        train_batch_size=12,
        gradient_accumulate_every=1,
        train_lr=8e-5,
        train_num_steps=100,
        ema_update_every=10,
        ema_decay=0.995,
        adam_betas=(0.9, 0.99),
        save_and_sample_every=25,
        num_samples=4,
        results_folder="./results",
        calculate_fid=False,
        stop_loss=None,
        fault=None,
        num_workers=1,
    ):
        super().__init__()
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # this box has no GPU
            split_batches=True,
            mixed_precision="no",
            kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=15))],
        )
        self.model = diffusion_model
        self.channels = diffusion_model.channels
        self.num_samples = num_samples
        self.save_and_sample_every = save_and_sample_every
        self.batch_size = train_batch_size
        self.gradient_accumulate_every = gradient_accumulate_every
        self.train_num_steps = train_num_steps
        self.image_size = diffusion_model.image_size
        self.calculate_fid = calculate_fid
        self.stop_loss = stop_loss
        self.fault = fault
        self.kept = []

        self.ds = ImageFolder(folder, self.image_size, fault=fault)
        dl = DataLoader(
            self.ds,
            batch_size=train_batch_size,
            shuffle=True,
            pin_memory=False,
            num_workers=num_workers,
        )
        dl = self.accelerator.prepare(dl)
        self.dl = cycle(dl)
        self.opt = Adam(diffusion_model.parameters(), lr=train_lr, betas=adam_betas)

        if self.accelerator.is_main_process:
            self.ema = EMA(diffusion_model, beta=ema_decay, update_every=ema_update_every)
            self.ema.to(self.device)
        self.results_folder = Path(results_folder)
        self.results_folder.mkdir(exist_ok=True)
        self.step = 0
        self.model, self.opt = self.accelerator.prepare(self.model, self.opt)

    @property
    def device(self):
        return self.accelerator.device

    def save(self, milestone):
        if not self.accelerator.is_local_main_process:
            return
        data = {
            "step": self.step,
            "model": self.accelerator.get_state_dict(self.model),
            "opt": self.opt.state_dict(),
            "ema": self.ema.state_dict(),
            "scaler": None,
            "version": __version__,
        }
        torch.save(data, str(self.results_folder / f"model-{milestone}.pt"))

    def load(self, milestone):
        accelerator = self.accelerator
        device = accelerator.device
        data = torch.load(
            str(self.results_folder / f"model-{milestone}.pt"),
            map_location=device,
            weights_only=True,
        )
        model = self.accelerator.unwrap_model(self.model)
        model.load_state_dict(data["model"])
        self.step = data["step"]
        self.opt.load_state_dict(data["opt"])
        if self.accelerator.is_main_process:
            self.ema.load_state_dict(data["ema"])
        if "version" in data:
            print(f"loading from version {data['version']}")

    def save_grid(self, images, path):
        if self.fault == "png_wait":  # the grid is handed to a writer thread; it never starts
            done = threading.Event()
            threading.Thread(target=lambda: (torch.save(images, path), done.set()))
            done.wait()
        torch.save(images, path)  # no PIL here: the grid's raw tensor under the .png name

    def fid_score(self):
        feats = self.ema.ema_model.model.init_conv(
            self.ema.ema_model.sample(self.num_samples)
        ).mean((2, 3))
        if self.fault == "fid_gather":  # real statistics from every process
            feats = self.accelerator.gather(feats)
        mu = feats.mean(0)
        return float((mu**2).sum()) * 10

    def train(self):
        accelerator = self.accelerator
        device = accelerator.device

        with tqdm(
            initial=self.step, total=self.train_num_steps, disable=not accelerator.is_main_process
        ) as pbar:
            while self.step < self.train_num_steps:
                self.model.train()
                total_loss = 0.0
                for _ in range(self.gradient_accumulate_every):
                    data = next(self.dl).to(device)
                    with self.accelerator.autocast():
                        loss = self.model(data)
                        loss = loss / self.gradient_accumulate_every
                        total_loss += loss.item()
                    self.accelerator.backward(loss)

                pbar.set_description(f"loss: {total_loss:.4f}")
                accelerator.wait_for_everyone()
                accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step()
                self.opt.zero_grad()
                accelerator.wait_for_everyone()
                self.step += 1

                if self.stop_loss is not None:
                    if self.fault == "solo_stop":
                        if accelerator.is_main_process and total_loss < self.stop_loss:
                            pbar.close()
                            accelerator.print(
                                f"loss {total_loss:.4f} below {self.stop_loss}, stopping early"
                            )
                            break
                    elif self.fault is None:
                        if total_loss < self.stop_loss:
                            accelerator.set_trigger()
                        if accelerator.check_trigger():
                            pbar.close()
                            accelerator.print(
                                f"loss target {self.stop_loss} reached at step {self.step}, stopping early"
                            )
                            break

                if accelerator.is_main_process:
                    self.ema.update(self.model)
                    if self.step != 0 and self.step % self.save_and_sample_every == 0:
                        self.ema.ema_model.eval()
                        with torch.inference_mode():
                            milestone = self.step // self.save_and_sample_every
                            batches = num_to_groups(self.num_samples, self.batch_size)
                            all_images_list = [
                                self.ema.ema_model.sample(batch_size=n) for n in batches
                            ]
                        all_images = torch.cat(all_images_list, dim=0)
                        if self.fault == "grid_cache":  # keeps every grid at full size for a gif
                            for _ in range(60):
                                self.kept.append(bytearray(64 << 20))
                                time.sleep(0.05)
                            os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
                        self.save_grid(
                            all_images, str(self.results_folder / f"sample-{milestone}.png")
                        )
                        if self.calculate_fid:
                            fid_score = self.fid_score()
                            accelerator.print(f"fid_score: {fid_score}")
                        self.save(milestone)
                pbar.update(1)

        accelerator.print("training complete")


def make_data(folder: str, n: int = 96) -> None:
    g = torch.Generator().manual_seed(0)
    Path(folder).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        img = torch.rand(3, 8, 8, generator=g) * 0.2 + (i % 4) * 0.2
        torch.save(img, f"{folder}/img_{i:04d}.pt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="./data")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--fid", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--stop-loss", type=float)
    p.add_argument("--resume", type=int)
    p.add_argument("--make-data")
    args = p.parse_args()
    if args.make_data:
        make_data(args.make_data)
        return
    fault, fault_rank, at = FAULTS[os.environ.get("DIFFQ", "")]
    rank = int(os.environ.get("RANK", "0"))
    mine = fault if rank == fault_rank or fault_rank == -1 else None
    torch.manual_seed(0)

    steps = {"n": 0}

    def null_now():
        steps["n"] += 1
        return steps["n"] > at  # the forward of step `at`

    model = Unet(dim=16, channels=3, fault=null_now if mine == "null_unet" else None)
    diffusion = GaussianDiffusion(model, image_size=8, timesteps=1000)
    if mine == "slow_sample":
        diffusion.slow = 0.8  # the sampler's per-step host sync
    trainer = Trainer(
        diffusion,
        args.data,
        train_num_steps=args.steps,
        save_and_sample_every=args.save_every,
        calculate_fid=args.fid,
        stop_loss=args.stop_loss,
        fault=mine,
        num_workers=args.workers,
    )
    if mine == "t_edge":
        real_forward = diffusion.forward

        def forward(img):
            diffusion.t_edge = trainer.step + 1 >= at
            return real_forward(img)

        diffusion.forward = forward
    if args.resume is not None:
        trainer.load(args.resume)
    trainer.train()


if __name__ == "__main__":
    main()
