"""library/model_util.py of the hundred-and-ninth style (kohya-ss/sd-scripts re-created in plain
torch for the fixtures tests/fixtures/real/hundredninth-*; linked into each run's folder as
library/model_util.py): a Stable Diffusion v1 checkpoint in miniature, the three models kohya's
scripts take out of one .safetensors file (a CLIP-like text encoder, an AutoencoderKL-like VAE, a
UNet2DConditionModel-like denoiser with Transformer2DModel blocks), the CLIP-like tokenizer, the
DDPM noise schedule, and the .safetensors format read and written by hand (safetensors is not
installed: the same 8-byte header length, JSON header and raw little-endian data, and the same
refusals as the library's writer). Nothing is downloaded: the prepare step writes the checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

VOCAB = 4096
MAX_LENGTH = 77  # tokenizer.model_max_length
BOS, EOS = VOCAB - 2, VOCAB - 1
TE_WIDTH = 64
VAE_SCALE_FACTOR = 0.18215

# region safetensors


_DTYPES = {torch.float32: ("F32", np.float32), torch.float16: ("F16", np.float16)}
_NP = {"F32": np.float32, "F16": np.float16}


def save_file(
    tensors: dict[str, torch.Tensor], filename: str, metadata: dict | None = None
) -> None:
    """safetensors.torch.save_file: the header, then every tensor's bytes in key order."""
    header: dict = {}
    if metadata is not None:
        for _k, v in metadata.items():
            if not isinstance(v, str):
                raise TypeError(
                    f"argument 'metadata': '{type(v).__name__}' object is not an instance of 'str'"
                )
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. "
                "It either means you are trying to save tensors which are reference of each "
                "other in which case it's recommended to save only the full tensors, and reslice "
                "at load time, or simply call `.contiguous()` on your tensor to pack it before "
                "saving."
            )
        code, np_dtype = _DTYPES[t.dtype]
        data = t.detach().cpu().numpy().astype(np_dtype).tobytes()
        header[name] = {
            "dtype": code,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(filename, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)


def load_file(filename: str) -> dict[str, torch.Tensor]:
    with open(filename, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(body[b:e], dtype=_NP[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


# endregion

# region tokenizer


class CLIPTokenizer:
    """Words and punctuation hashed into the vocabulary; <BOS> ... <EOS>, padded with <EOS> (v1)."""

    model_max_length = MAX_LENGTH
    pad_token_id = eos_token_id = EOS
    bos_token_id = BOS

    def tokenize(self, text: str) -> list[int]:
        words = re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())
        return [1 + zlib.crc32(w.encode()) % (VOCAB - 3) for w in words]

    def __call__(self, text: str, max_length: int = MAX_LENGTH) -> torch.Tensor:
        ids = [BOS, *self.tokenize(text)[: max_length - 2], EOS]
        ids += [EOS] * (max_length - len(ids))
        return torch.tensor(ids)


# endregion

# region text encoder


class CLIPAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (
            p(x).view(b, n, self.heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, d))


class CLIPMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * 4)
        self.fc2 = nn.Linear(dim * 4, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(1.702 * h))  # quick_gelu


class CLIPEncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(dim)
        self.self_attn = CLIPAttention(dim, heads)
        self.layer_norm2 = nn.LayerNorm(dim)
        self.mlp = CLIPMLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(dim, heads) for _ in range(layers))


class CLIPTextEmbeddings(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(VOCAB, dim)
        self.position_embedding = nn.Embedding(MAX_LENGTH, dim)


class CLIPTextTransformer(nn.Module):
    def __init__(self, dim: int = TE_WIDTH, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embeddings = CLIPTextEmbeddings(dim)
        self.encoder = CLIPEncoder(dim, heads, layers)
        self.final_layer_norm = nn.LayerNorm(dim)


class CLIPTextModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text_model = CLIPTextTransformer()
        self.gradient_checkpointing = False

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        tm = self.text_model
        pos = torch.arange(input_ids.shape[-1])
        x = tm.embeddings.token_embedding(input_ids) + tm.embeddings.position_embedding(pos)
        for layer in tm.encoder.layers:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x)
            else:
                x = layer(x)
        return tm.final_layer_norm(x)


# endregion

# region VAE


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.ModuleList(nn.Conv2d(c, 16, 3, stride=2, padding=1) for c in (8, 16, 16))
        self.conv_out = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for conv in self.down:
            h = conv(F.silu(h))
        return self.conv_out(F.silu(h))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(4, 16, 3, padding=1)
        self.up = nn.ModuleList(nn.Conv2d(16, 16, 3, padding=1) for _ in range(3))
        self.conv_out = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for conv in self.up:
            h = conv(F.silu(F.interpolate(h, scale_factor=2.0, mode="nearest")))
        return self.conv_out(F.silu(h))


class AutoencoderKL(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.decoder = Decoder()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        mean, _logvar = self.encoder(x).chunk(2, dim=1)
        return mean

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)


# endregion

# region U-Net


class ResnetBlock2D(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.conv_shortcut is None else self.conv_shortcut(x))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, context_dim: int | None, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim or dim, dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        self.use_sdpa = False

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(context).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(context).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            w = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
            y = w.softmax(dim=-1) @ v
        return self.to_out[0](y.transpose(1, 2).reshape(b, n, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = CrossAttention(dim, None, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff(self.norm3(x))


class Transformer2DModel(nn.Module):
    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, dim)
        self.proj_in = nn.Conv2d(dim, dim, 1)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(dim, context_dim, heads)])
        self.proj_out = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)
        for block in self.transformer_blocks:
            y = block(y, context)
        return x + self.proj_out(y.transpose(1, 2).reshape(b, c, h, w))


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int, ctx: int, attn: bool, down: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin, cout, temb)])
        self.attentions = nn.ModuleList([Transformer2DModel(cout, ctx, 4)] if attn else [])
        self.downsamplers = nn.ModuleList(
            [nn.Conv2d(cout, cout, 3, stride=2, padding=1)] if down else []
        )


class UNet2DConditionModel(nn.Module):
    """conv_in, two down blocks, a mid block, two up blocks, conv_out (kohya's original_unet
    names); 4 latent channels, cross-attention on the text encoder's hidden states."""

    def __init__(self, c1: int = 16, c2: int = 32, ctx: int = TE_WIDTH) -> None:
        super().__init__()
        temb = 64
        self.c1 = c1
        self.conv_in = nn.Conv2d(4, c1, 3, padding=1)
        self.time_embedding = nn.Sequential(nn.Linear(c1, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.down_blocks = nn.ModuleList(
            [Block(c1, c1, temb, ctx, False, True), Block(c1, c2, temb, ctx, True, True)]
        )
        self.mid_block = Block(c2, c2, temb, ctx, True, False)
        self.up_blocks = nn.ModuleList(
            [Block(2 * c2, c2, temb, ctx, True, False), Block(c2 + c1, c1, temb, ctx, False, False)]
        )
        self.conv_out = nn.Conv2d(c1, 4, 3, padding=1)
        self.gradient_checkpointing = False

    def set_use_sdpa(self, sdpa: bool) -> None:
        for m in self.modules():
            if isinstance(m, CrossAttention):
                m.use_sdpa = sdpa

    def _res_attn(self, block: Block, h: torch.Tensor, temb: torch.Tensor, ctx: torch.Tensor):
        def run(h, temb, ctx):
            h = block.resnets[0](h, temb)
            for attn in block.attentions:
                h = attn(h, ctx)
            return h

        if self.gradient_checkpointing and self.training:
            return torch.utils.checkpoint.checkpoint(run, h, temb, ctx, use_reentrant=True)
        return run(h, temb, ctx)

    def forward(self, sample: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor):
        half = self.c1 // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
        e = timesteps[:, None].float() * freqs[None]
        temb = self.time_embedding(torch.cat([e.sin(), e.cos()], dim=1))
        h = self.conv_in(sample)
        skips = []
        for block in self.down_blocks:
            h = self._res_attn(block, h, temb, context)
            skips.append(h)
            h = block.downsamplers[0](h)
        h = self._res_attn(self.mid_block, h, temb, context)
        for block in self.up_blocks:
            skip = skips.pop()
            h = F.interpolate(h, size=skip.shape[-2:], mode="nearest")
            h = self._res_attn(block, torch.cat([h, skip], dim=1), temb, context)
        return self.conv_out(h)


# endregion

# region checkpoint


PREFIXES = {
    "unet": "model.diffusion_model.",
    "vae": "first_stage_model.",
    "text_encoder": "cond_stage_model.transformer.",
}


def create_models() -> tuple[CLIPTextModel, AutoencoderKL, UNet2DConditionModel]:
    return CLIPTextModel(), AutoencoderKL(), UNet2DConditionModel()


def save_stable_diffusion_checkpoint(path: str, seed: int) -> None:
    torch.manual_seed(seed)
    text_encoder, vae, unet = create_models()
    state = {}
    for name, model in (("text_encoder", text_encoder), ("vae", vae), ("unet", unet)):
        for k, v in model.state_dict().items():
            state[PREFIXES[name] + k] = v.contiguous()
    save_file(state, path, {"format": "pt"})


def load_models_from_stable_diffusion_checkpoint(path: str, device: str = "cpu"):
    state = load_file(path)
    text_encoder, vae, unet = create_models()
    logger.info(
        f"UNet2DConditionModel: 64, 4, {TE_WIDTH}, False, False"
    )  # sample_size, attention_head_dim, cross_attention_dim, use_linear_projection, upcast_attention
    for name, model in (("u-net", unet), ("vae", vae), ("text encoder", text_encoder)):
        prefix = PREFIXES["unet" if name == "u-net" else name.replace(" ", "_")]
        sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        info = model.load_state_dict(sub)
        logger.info(f"loading {name}: {info}")
    return text_encoder.to(device), vae.to(device), unet.to(device)


def make_bucket_resolutions(max_reso, min_size=256, max_size=1024, divisible=64):
    max_width, max_height = max_reso
    max_area = max_width * max_height
    resos = set()
    width = int(math.sqrt(max_area) // divisible) * divisible
    resos.add((width, width))
    width = min_size
    while width <= max_size:
        height = min(max_size, int((max_area // width) // divisible) * divisible)
        if height >= min_size:
            resos.add((width, height))
            resos.add((height, width))
        width += divisible
    return sorted(resos)


class DDPMScheduler:
    """beta_schedule scaled_linear, 1000 steps (the noise schedule of SD v1)."""

    num_train_timesteps = 1000

    def __init__(self) -> None:
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()

    def add_noise(self, latents, noise, timesteps):
        a = self.alphas_cumprod[timesteps].view(-1, 1, 1, 1)
        return a.sqrt() * latents + (1 - a).sqrt() * noise


# endregion
