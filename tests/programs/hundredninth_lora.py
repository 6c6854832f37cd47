"""networks/lora.py of the hundred-and-ninth style (kohya-ss/sd-scripts re-created in plain torch
for the fixtures tests/fixtures/real/hundredninth-*; linked into each run's folder as
networks/lora.py and imported by `--network_module=networks.lora`): kohya's LoRAModule, which
takes over the forward of a Linear or 1x1 Conv2d of the frozen model (lora_down, lora_up, the
alpha buffer, scale = alpha / dim), and LoRANetwork, which wraps the Linear layers of the text
encoder's CLIPAttention/CLIPMLP and of the U-Net's Transformer2DModel blocks, with kohya's log
lines and its save_weights to .safetensors with the sshs hashes in the metadata.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os

import torch
from library import model_util

logger = logging.getLogger(__name__)


class LoRAModule(torch.nn.Module):
    """replaces forward method of the original Linear, instead of replacing the original Linear
    module."""

    def __init__(self, lora_name, org_module, multiplier=1.0, lora_dim=4, alpha=1):
        super().__init__()
        self.lora_name = lora_name
        if org_module.__class__.__name__ == "Conv2d":
            in_dim, out_dim = org_module.in_channels, org_module.out_channels
            self.lora_down = torch.nn.Conv2d(in_dim, lora_dim, (1, 1), bias=False)
            self.lora_up = torch.nn.Conv2d(lora_dim, out_dim, (1, 1), bias=False)
        else:
            in_dim, out_dim = org_module.in_features, org_module.out_features
            self.lora_down = torch.nn.Linear(in_dim, lora_dim, bias=False)
            self.lora_up = torch.nn.Linear(lora_dim, out_dim, bias=False)
        self.lora_dim = lora_dim
        alpha = lora_dim if alpha is None or alpha == 0 else alpha
        self.scale = alpha / lora_dim
        self.register_buffer("alpha", torch.tensor(float(alpha)))
        torch.nn.init.kaiming_uniform_(self.lora_down.weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_up.weight)
        self.multiplier = multiplier
        self.org_module = org_module  # remove in applying

    def apply_to(self):
        self.org_forward = self.org_module.forward
        self.org_module.forward = self.forward
        del self.org_module

    def forward(self, x):
        org_forwarded = self.org_forward(x)
        lx = self.lora_up(self.lora_down(x))
        return org_forwarded + lx * self.multiplier * self.scale


class LoRANetwork(torch.nn.Module):
    UNET_TARGET_REPLACE_MODULE = ["Transformer2DModel"]
    TEXT_ENCODER_TARGET_REPLACE_MODULE = ["CLIPAttention", "CLIPSdpaAttention", "CLIPMLP"]
    LORA_PREFIX_UNET = "lora_unet"
    LORA_PREFIX_TEXT_ENCODER = "lora_te"

    def __init__(self, text_encoder, unet, multiplier=1.0, lora_dim=4, alpha=1, varbose=False):
        super().__init__()
        self.multiplier = multiplier
        self.lora_dim = lora_dim
        self.alpha = alpha
        logger.info(f"create LoRA network. base dim (rank): {lora_dim}, alpha: {alpha}")
        logger.info("neuron dropout: p=None, rank dropout: p=None, module dropout: p=None")

        def create_modules(is_unet, root_module, target_replace_modules):
            prefix = self.LORA_PREFIX_UNET if is_unet else self.LORA_PREFIX_TEXT_ENCODER
            loras = []
            for name, module in root_module.named_modules():
                if module.__class__.__name__ in target_replace_modules:
                    for child_name, child_module in module.named_modules():
                        is_linear = child_module.__class__.__name__ == "Linear"
                        is_conv2d_1x1 = (
                            child_module.__class__.__name__ == "Conv2d"
                            and child_module.kernel_size == (1, 1)
                        )
                        if is_linear or is_conv2d_1x1:
                            lora_name = prefix + "." + name + "." + child_name
                            lora_name = lora_name.replace(".", "_")
                            loras.append(
                                LoRAModule(
                                    lora_name, child_module, self.multiplier, lora_dim, alpha
                                )
                            )
            return loras

        logger.info("create LoRA for Text Encoder:")
        self.text_encoder_loras = create_modules(
            False, text_encoder, LoRANetwork.TEXT_ENCODER_TARGET_REPLACE_MODULE
        )
        logger.info(f"create LoRA for Text Encoder: {len(self.text_encoder_loras)} modules.")
        self.unet_loras = create_modules(True, unet, LoRANetwork.UNET_TARGET_REPLACE_MODULE)
        logger.info(f"create LoRA for U-Net: {len(self.unet_loras)} modules.")

        names = set()
        for lora in self.text_encoder_loras + self.unet_loras:
            assert lora.lora_name not in names, f"duplicated lora name: {lora.lora_name}"
            names.add(lora.lora_name)

    def apply_to(self, text_encoder, unet, apply_text_encoder=True, apply_unet=True):
        if apply_text_encoder:
            logger.info("enable LoRA for text encoder")
        else:
            self.text_encoder_loras = []
        if apply_unet:
            logger.info("enable LoRA for U-Net")
        else:
            self.unet_loras = []
        for lora in self.text_encoder_loras + self.unet_loras:
            lora.apply_to()
            self.add_module(lora.lora_name, lora)

    def prepare_optimizer_params(self, text_encoder_lr, unet_lr, default_lr):
        all_params = []
        if self.text_encoder_loras:
            params = [p for lora in self.text_encoder_loras for p in lora.parameters()]
            all_params.append({"params": params, "lr": text_encoder_lr or default_lr})
        if self.unet_loras:
            params = [p for lora in self.unet_loras for p in lora.parameters()]
            all_params.append({"params": params, "lr": unet_lr or default_lr})
        return all_params, ["textencoder", "unet"][: len(all_params)]

    def enable_gradient_checkpointing(self):
        pass  # not supported

    def prepare_grad_etc(self, text_encoder, unet):
        self.requires_grad_(True)

    def on_epoch_start(self, text_encoder, unet):
        self.train()

    def get_trainable_params(self):
        return self.parameters()

    def save_weights(self, file, dtype, metadata):
        if metadata is not None and len(metadata) == 0:
            metadata = None
        state_dict = self.state_dict()
        if dtype is not None:
            for key in list(state_dict.keys()):
                state_dict[key] = state_dict[key].detach().clone().to("cpu").to(dtype)
        if os.path.splitext(file)[1] == ".safetensors":
            if metadata is None:
                metadata = {}
            # Precalculate model hashes to save time on indexing
            h = hashlib.sha256()
            for key in sorted(state_dict):
                h.update(state_dict[key].numpy().tobytes())
            metadata["sshs_model_hash"] = h.hexdigest()
            metadata["sshs_legacy_hash"] = h.hexdigest()[:8]
            model_util.save_file(state_dict, file, metadata)
        else:
            torch.save(state_dict, file)


def create_network(multiplier, network_dim, network_alpha, vae, text_encoder, unet, **kwargs):
    if network_dim is None:
        network_dim = 4  # default
    if network_alpha is None:
        network_alpha = 1.0
    return LoRANetwork(
        text_encoder, unet, multiplier=multiplier, lora_dim=network_dim, alpha=network_alpha
    )
