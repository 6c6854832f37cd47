"""A stand-in for the pip package schedulefree (facebookresearch/schedule_free) of the
hundred-and-sixth style's fixtures: the capture script builds it into the wheel
schedulefree-1.4-py3-none-any.whl that the task's setup installs with pip (as
schedulefree/__init__.py). AdamWScheduleFree keeps the package's signature and its train() /
eval() switches; underneath it is AdamW with a linear warmup (the fixtures need the optimizer
to exist and to train, not schedule-free's averaging)."""

from __future__ import annotations

import torch

__version__ = "1.4"


class AdamWScheduleFree(torch.optim.AdamW):
    def __init__(
        self,
        params,
        lr: float = 0.0025,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        warmup_steps: int = 0,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.warmup_steps, self.base_lr, self.k, self.training = warmup_steps, lr, 0, True

    def train(self) -> None:
        self.training = True

    def eval(self) -> None:
        self.training = False

    @torch.no_grad()
    def step(self, closure=None):
        self.k += 1
        scale = min(1.0, self.k / self.warmup_steps) if self.warmup_steps else 1.0
        for group in self.param_groups:
            group["lr"] = self.base_lr * scale
        return super().step(closure)
