"""A text-to-image fine-tuning script in the way of diffusers' examples/text_to_image/
train_text_to_image.py (and the dreambooth / LoRA / sd-scripts trainers built like it), on CPU
with a tiny UNet built here (no downloads): an imagefolder dataset (metadata.jsonl + PNGs) read
with PIL in DataLoader workers, a frozen toy text encoder (mean-pooled token embeddings), a DDPM
noise schedule, an EMA of the UNet, `Accelerator(gradient_accumulation_steps=...,
project_config=ProjectConfiguration(...))`, `get_logger(__name__, log_level="INFO")`, the "Steps"
tqdm bar on the main process, `save_state` every --checkpointing_steps into checkpoint-N/ with
--checkpoints_total_limit, --resume_from_checkpoint latest, validation images on the main process,
`wait_for_everyone()` before the final save, `end_training()`.

Most failures come from what a run is given (its data folder, flags, launcher, a half-written
checkpoint); the few that need the program are chosen by the T2I_FAULT environment variable
(an opaque code, never printed). Written for tests/fixtures/real/capture_twentysecond.sh, not
used to build any rule.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration, set_seed
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

logger = get_logger(__name__, log_level="INFO")
FAULT = os.environ.get("T2I_FAULT", "")
WEIGHTS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    parser.add_argument("--train_data_dir", type=str, required=True)
    parser.add_argument("--output_dir", type=str, default="sd-model-finetuned")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--center_crop", action="store_true")
    parser.add_argument("--random_flip", action="store_true")
    parser.add_argument("--train_batch_size", type=int, default=2)
    parser.add_argument("--num_train_epochs", type=int, default=100)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--lr_warmup_steps", type=int, default=0)
    parser.add_argument("--use_8bit_adam", action="store_true")
    parser.add_argument("--use_ema", action="store_true")
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--checkpointing_steps", type=int, default=500)
    parser.add_argument("--checkpoints_total_limit", type=int, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--validation_prompts", type=str, default=None, nargs="+")
    parser.add_argument("--validation_epochs", type=int, default=5)
    parser.add_argument("--num_validation_images", type=int, default=4)
    parser.add_argument("--validation_inference_steps", type=int, default=20)
    parser.add_argument("--ddp_timeout", type=int, default=1800, help="seconds (sd-scripts)")
    parser.add_argument("--mixed_precision", type=str, default="no")
    return parser.parse_args()


# ---- a tiny tokenizer and frozen text encoder (stands in for CLIP) ----------------------------
MAX_TOKENS = 8


def tokenize(caption: str) -> torch.Tensor:
    """Words -> ids 1..63, 0 is padding; an empty caption is all padding."""
    ids = [1 + sum(map(ord, w)) % 63 for w in caption.lower().split()][:MAX_TOKENS]
    return torch.tensor(ids + [0] * (MAX_TOKENS - len(ids)), dtype=torch.long)


class TextEncoder(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # mean over the caption's real tokens (the attention mask's pooling)
        mask = (ids != 0).unsqueeze(-1).float()
        return (self.embed(ids) * mask).sum(1) / mask.sum(1)


# ---- a tiny conditional UNet --------------------------------------------------------------------
def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.shortcut(x) + h


class UNet2DConditionModel(nn.Module):
    """conv_in, two down blocks, a mid block with self-attention over a learned position
    embedding of the (resolution/4)^2 latent positions, two up blocks with skips, conv_out."""

    def __init__(self, resolution: int, ch: int = 16, text_dim: int = 16) -> None:
        super().__init__()
        self.config = {"sample_size": resolution, "block_out_channels": [ch, 2 * ch]}
        self.gradient_checkpointing = False
        temb = 4 * ch
        self.time_embedding = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.text_proj = nn.Linear(text_dim, temb)
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.down1 = ResnetBlock(ch, ch, temb)
        self.downsample1 = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.down2 = ResnetBlock(2 * ch, 2 * ch, temb)
        self.downsample2 = nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1)
        self.mid_pos_embed = nn.Parameter(torch.zeros(1, (resolution // 4) ** 2, 2 * ch))
        self.mid_attn = nn.MultiheadAttention(2 * ch, 2, batch_first=True)
        self.mid = ResnetBlock(2 * ch, 2 * ch, temb)
        self.up2 = ResnetBlock(4 * ch, 2 * ch, temb)
        self.up1 = ResnetBlock(3 * ch, ch, temb)
        self.conv_norm_out = nn.GroupNorm(4, ch)
        self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)
        self.ch = ch

    def enable_gradient_checkpointing(self) -> None:
        self.gradient_checkpointing = True

    def _block(self, block: ResnetBlock, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        if self.gradient_checkpointing and self.training:
            # the call diffusers' older blocks made (no use_reentrant)
            out: torch.Tensor = torch.utils.checkpoint.checkpoint(block, x, temb)
            return out
        result: torch.Tensor = block(x, temb)
        return result

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> torch.Tensor:
        temb = self.time_embedding(timestep_embedding(timestep, self.ch))
        temb = temb + self.text_proj(encoder_hidden_states)
        h0 = self._block(self.down1, self.conv_in(sample), temb)
        h1 = self._block(self.down2, self.downsample1(h0), temb)
        h = self.downsample2(h1)
        b, c, hh, ww = h.shape
        seq = h.flatten(2).transpose(1, 2) + self.mid_pos_embed
        seq = seq + self.mid_attn(seq, seq, seq, need_weights=False)[0]
        h = self._block(self.mid, seq.transpose(1, 2).reshape(b, c, hh, ww), temb)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = self._block(self.up2, torch.cat([h, h1], 1), temb)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = self._block(self.up1, torch.cat([h, h0], 1), temb)
        out: torch.Tensor = self.conv_out(F.silu(self.conv_norm_out(h)))
        return out


# ---- DDPM noise schedule ------------------------------------------------------------------------
class DDPMScheduler:
    def __init__(self, num_train_timesteps: int = 1000) -> None:
        self.num_train_timesteps = num_train_timesteps
        betas = torch.linspace(1e-4, 0.02, num_train_timesteps)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

    def add_noise(self, x: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self.alphas_cumprod[t].sqrt()[:, None, None, None]
        s = (1 - self.alphas_cumprod[t]).sqrt()[:, None, None, None]
        return a * x + s * noise

    def sample(
        self,
        unet: nn.Module,
        cond: torch.Tensor,
        shape: tuple[int, ...],
        steps: int,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Deterministic DDIM steps from pure noise."""
        x = torch.randn(shape, generator=generator)
        ts = torch.linspace(self.num_train_timesteps - 1, 0, steps).long()
        for i, t in enumerate(ts):
            eps = unet(x, t.repeat(shape[0]), cond)
            a = self.alphas_cumprod[t]
            a_prev = self.alphas_cumprod[ts[i + 1]] if i + 1 < len(ts) else torch.tensor(1.0)
            x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
            x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
        return x


# ---- EMA of the UNet's weights (diffusers.training_utils.EMAModel) -----------------------------
class EMAModel:
    def __init__(self, parameters: Any, decay: float = 0.9999) -> None:
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay = decay
        self.optimization_step = 0
        self.temp_stored_params: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, parameters: Any) -> None:
        self.optimization_step += 1
        decay = min(self.decay, (1 + self.optimization_step) / (10 + self.optimization_step))
        for s, p in zip(self.shadow_params, parameters, strict=True):
            s.sub_((1 - decay) * (s - p))

    def copy_to(self, parameters: Any) -> None:
        for s, p in zip(self.shadow_params, parameters, strict=True):
            p.data.copy_(s.data)

    def store(self, parameters: Any) -> None:
        self.temp_stored_params = [p.detach().clone() for p in parameters]

    def restore(self, parameters: Any) -> None:
        for c, p in zip(self.temp_stored_params, parameters, strict=True):
            p.data.copy_(c.data)
        self.temp_stored_params = []

    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        save_file(
            {f"p{i}": s for i, s in enumerate(self.shadow_params)},
            os.path.join(path, "diffusion_pytorch_model.safetensors"),
        )
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"decay": self.decay, "optimization_step": self.optimization_step}, f)

    def load_pretrained(self, path: str) -> None:
        tensors = load_file(os.path.join(path, "diffusion_pytorch_model.safetensors"))
        self.shadow_params = [tensors[f"p{i}"] for i in range(len(tensors))]
        with open(os.path.join(path, "config.json")) as f:
            self.optimization_step = json.load(f)["optimization_step"]


# ---- save_pretrained / from_pretrained of the UNet, sharded -------------------------------------
def save_sharded(model: nn.Module, path: str, shards: int = 2) -> None:
    os.makedirs(path, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    keys = list(state)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i::shards]}
        if i == 1 and os.environ.get("T2I_HOLD"):
            # the fp32 copy of the full pipeline for the export on top of the training state:
            # the host runs out of memory and the kernel's OOM killer takes this process
            held = [torch.ones(2**24) for _ in range(4)]
            del held
            os.kill(os.getpid(), signal.SIGKILL)
        save_file(part, os.path.join(path, name))
        weight_map.update({k: name for k in part})
    with open(os.path.join(path, WEIGHTS_INDEX), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model.config, f)


def load_sharded(model: nn.Module, path: str) -> None:
    index = os.path.join(path, WEIGHTS_INDEX)
    if not os.path.isfile(index):
        raise OSError(f"Error no file named {WEIGHTS_INDEX} found in directory {path}.")
    with open(index) as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
    state: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        state.update(load_file(os.path.join(path, name)))
    model.load_state_dict(state)


# ---- the imagefolder dataset ---------------------------------------------------------------------
class ImageFolder(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """metadata.jsonl lines {"file_name", "text"} beside the images, as datasets' imagefolder."""

    def __init__(self, root: str, resolution: int, center_crop: bool, random_flip: bool) -> None:
        self.root = Path(root)
        with open(self.root / "metadata.jsonl") as f:
            self.rows = [json.loads(line) for line in f if line.strip()]
        self.resolution, self.center_crop, self.random_flip = resolution, center_crop, random_flip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[i]
        if FAULT == "wk" and os.environ.get("LOCAL_RANK") == "0" and i == self.kill_at():
            os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer picks this worker
        image = Image.open(self.root / row["file_name"]).convert("RGB")
        x = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        x = x.view(image.height, image.width, 3).permute(2, 0, 1).float()[None] / 255.0
        r = self.resolution
        scale = r / min(x.shape[-2:])
        x = F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)[0]
        top, left = (x.shape[1] - r) // 2, (x.shape[2] - r) // 2
        x = x[:, top : top + r, left : left + r]
        if self.random_flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return {"pixel_values": (x - 0.5) / 0.5, "input_ids": tokenize(row["text"])}

    def kill_at(self) -> int:
        return int(os.environ.get("T2I_AT", "5"))


def deprecate(name: str, version: str, message: str) -> None:
    """diffusers.utils.deprecate's warning."""
    warnings.warn(
        f"`{name}` is deprecated and will be removed in version {version}. {message}",
        FutureWarning,
        stacklevel=3,
    )


def log_validation(
    unet: nn.Module,
    text_encoder: TextEncoder,
    scheduler: DDPMScheduler,
    args: argparse.Namespace,
    accelerator: Accelerator,
    epoch: int,
) -> None:
    logger.info("Running validation... ")
    unet.eval()
    generator = torch.Generator().manual_seed(args.seed or 0)
    images = []
    for prompt in args.validation_prompts:
        logger.info(f"Generating {args.num_validation_images} images with prompt: {prompt}.")
        cond = text_encoder(tokenize(prompt)[None].repeat(args.num_validation_images, 1))
        with torch.no_grad():
            shape = (args.num_validation_images, 3, args.resolution, args.resolution)
            images.append(
                scheduler.sample(unet, cond, shape, args.validation_inference_steps, generator)
            )
    grid = torch.cat(images).clamp(-1, 1).add(1).mul(127.5).byte()
    out = Path(args.output_dir) / "validation"
    out.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(grid):
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(out / f"epoch{epoch:03d}_{i}.png")
    unet.train()


def main() -> None:  # one script, as the upstream example is
    args = parse_args()
    logging_dir = Path(args.output_dir, "logs")
    accelerator_project_config = ProjectConfiguration(
        project_dir=args.output_dir, logging_dir=str(logging_dir)
    )
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=None,
        project_config=accelerator_project_config,
        cpu=not torch.cuda.is_available(),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.ddp_timeout))],
    )
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO,
    )
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed, device_specific=True)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)

    text_encoder = TextEncoder()
    text_encoder.requires_grad_(False)
    torch.manual_seed(0)  # the "pretrained" weights every process starts from
    unet = UNet2DConditionModel(args.resolution)
    noise_scheduler = DDPMScheduler()
    if args.seed is not None:
        set_seed(args.seed, device_specific=True)

    ema_unet = EMAModel(unet.parameters()) if args.use_ema else None
    if FAULT == "w":  # a pipeline built the older way, as many forks of the script still do
        deprecate(
            "scale",
            "1.0.0",
            "Passing `scale` to `cross_attention_kwargs` is deprecated. `scale` will be ignored.",
        )
        deprecate(
            "Transformer2DModelOutput",
            "1.0.0",
            "Importing `Transformer2DModelOutput` "
            "from `diffusers.models.transformer_2d` is deprecated and this will be removed "
            "in a future version. Please use `from diffusers.models.modeling_outputs "
            "import Transformer2DModelOutput`, instead.",
        )
        logger.warning(
            "xformers is not available. Make sure it is installed correctly to use "
            "memory efficient attention; falling back to the default attention."
        )

    def save_model_hook(models: list[nn.Module], weights: list[Any], output_dir: str) -> None:
        if accelerator.is_main_process:
            if ema_unet is not None:
                ema_unet.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for model in models:
                save_sharded(accelerator.unwrap_model(model), os.path.join(output_dir, "unet"))
                weights.pop()

    def load_model_hook(models: list[nn.Module], input_dir: str) -> None:
        if ema_unet is not None:
            ema_unet.load_pretrained(os.path.join(input_dir, "unet_ema"))
        for _ in range(len(models)):
            model = models.pop()
            load_sharded(accelerator.unwrap_model(model), os.path.join(input_dir, "unet"))

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    if args.gradient_checkpointing:
        unet.enable_gradient_checkpointing()

    if args.use_8bit_adam:
        try:
            import bitsandbytes as bnb  # type: ignore[import-not-found]
        except ImportError:
            raise ImportError(
                "Please install bitsandbytes to use 8-bit Adam. You can do so by running "
                "`pip install bitsandbytes`"
            ) from None
        optimizer_cls = bnb.optim.AdamW8bit
    else:
        optimizer_cls = torch.optim.AdamW
    optimizer = optimizer_cls(unet.parameters(), lr=args.learning_rate, weight_decay=1e-2)

    train_dataset = ImageFolder(
        args.train_data_dir, args.resolution, args.center_crop, args.random_flip
    )

    def collate_fn(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {
            "pixel_values": torch.stack([e["pixel_values"] for e in examples]).float(),
            "input_ids": torch.stack([e["input_ids"] for e in examples]),
        }

    train_dataloader = torch.utils.data.DataLoader(
        train_dataset,
        shuffle=True,
        collate_fn=collate_fn,
        batch_size=args.train_batch_size,
        num_workers=args.dataloader_num_workers,
        generator=torch.Generator().manual_seed(args.seed or 0),
    )

    num_update_steps_per_epoch = math.ceil(
        len(train_dataloader) / accelerator.num_processes / args.gradient_accumulation_steps
    )
    overrode_max_train_steps = False
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
        overrode_max_train_steps = True

    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, args.lr_warmup_steps))
    )
    unet, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        unet, optimizer, train_dataloader, lr_scheduler
    )

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if overrode_max_train_steps:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    total_batch_size = (
        args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    )
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataset)}")
    logger.info(f"  Num Epochs = {args.num_train_epochs}")
    logger.info(f"  Instantaneous batch size per device = {args.train_batch_size}")
    logger.info(
        f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}"
    )
    logger.info(f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}")
    logger.info(f"  Total optimization steps = {args.max_train_steps}")
    global_step = 0
    first_epoch = 0

    if args.resume_from_checkpoint:
        if args.resume_from_checkpoint != "latest":
            path: str | None = os.path.basename(args.resume_from_checkpoint)
        else:
            dirs = os.listdir(args.output_dir) if os.path.isdir(args.output_dir) else []
            dirs = [d for d in dirs if d.startswith("checkpoint")]
            dirs = sorted(dirs, key=lambda x: int(x.split("-")[1]))
            path = dirs[-1] if len(dirs) > 0 else None
        if path is None:
            accelerator.print(
                f"Checkpoint '{args.resume_from_checkpoint}' does not exist. "
                "Starting a new training run."
            )
            args.resume_from_checkpoint = None
            initial_global_step = 0
        else:
            accelerator.print(f"Resuming from checkpoint {path}")
            accelerator.load_state(os.path.join(args.output_dir, path))
            global_step = int(path.split("-")[1])
            initial_global_step = global_step
            first_epoch = global_step // num_update_steps_per_epoch
    else:
        initial_global_step = 0

    progress_bar = tqdm(
        range(0, args.max_train_steps),
        initial=initial_global_step,
        desc="Steps",
        disable=not accelerator.is_local_main_process,
    )

    stop = False
    for epoch in range(first_epoch, args.num_train_epochs):
        train_loss = 0.0
        for _step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(unet):
                latents = batch["pixel_values"]
                noise = torch.randn_like(latents)
                bsz = latents.shape[0]
                timesteps = torch.randint(0, noise_scheduler.num_train_timesteps, (bsz,))
                noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
                encoder_hidden_states = text_encoder(batch["input_ids"])
                model_pred = unet(noisy_latents, timesteps, encoder_hidden_states)
                loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
                if not torch.isfinite(loss):
                    # sd-scripts-style guard: nothing good comes after a NaN
                    logger.error(
                        f"Loss is {loss.item()} at step {global_step}, stopping training",
                        main_process_only=False,
                    )
                    stop = True
                    break
                avg_loss = accelerator.gather(loss.repeat(args.train_batch_size)).mean()
                train_loss += avg_loss.item() / args.gradient_accumulation_steps
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                if ema_unet is not None:
                    ema_unet.step(unet.parameters())
                progress_bar.update(1)
                global_step += 1
                accelerator.log({"train_loss": train_loss}, step=global_step)
                train_loss = 0.0

                if global_step % args.checkpointing_steps == 0:  # noqa: SIM102 - nested as upstream
                    if accelerator.is_main_process:
                        if args.checkpoints_total_limit is not None:
                            checkpoints = os.listdir(args.output_dir)
                            checkpoints = [d for d in checkpoints if d.startswith("checkpoint")]
                            checkpoints = sorted(checkpoints, key=lambda x: int(x.split("-")[1]))
                            if len(checkpoints) >= args.checkpoints_total_limit:
                                num_to_remove = len(checkpoints) - args.checkpoints_total_limit + 1
                                removing_checkpoints = checkpoints[0:num_to_remove]
                                logger.info(
                                    f"{len(checkpoints)} checkpoints already exist, removing "
                                    f"{len(removing_checkpoints)} checkpoints"
                                )
                                logger.info(
                                    f"removing checkpoints: {', '.join(removing_checkpoints)}"
                                )
                                for removing_checkpoint in removing_checkpoints:
                                    shutil.rmtree(
                                        os.path.join(args.output_dir, removing_checkpoint)
                                    )
                        save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
                        if FAULT == "bm":
                            # make sure every process has finished its step before saving
                            accelerator.wait_for_everyone()
                        if FAULT == "sk" and global_step >= int(os.environ.get("T2I_AT", "4")):
                            os.environ["T2I_HOLD"] = "1"
                        accelerator.save_state(save_path)
                        logger.info(f"Saved state to {save_path}")

            logs = {"step_loss": loss.detach().item(), "lr": lr_scheduler.get_last_lr()[0]}
            progress_bar.set_postfix(**logs)

            if global_step >= args.max_train_steps:
                break
        if stop:
            break

        if accelerator.is_main_process:  # noqa: SIM102 - nested as upstream
            if args.validation_prompts is not None and epoch % args.validation_epochs == 0:
                if ema_unet is not None:
                    # Store the UNet parameters temporarily and load the EMA parameters
                    ema_unet.store(unet.parameters())
                    ema_unet.copy_to(unet.parameters())
                log_validation(
                    accelerator.unwrap_model(unet),
                    text_encoder,
                    noise_scheduler,
                    args,
                    accelerator,
                    epoch,
                )
                if ema_unet is not None:
                    ema_unet.restore(unet.parameters())

    # Create the pipeline using the trained modules and save it.
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unet_final = accelerator.unwrap_model(unet)
        if ema_unet is not None:
            ema_unet.copy_to(unet_final.parameters())
        save_sharded(unet_final, os.path.join(args.output_dir, "unet"))
        logger.info(f"Model saved to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
