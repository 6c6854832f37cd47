"""A small regression LightningModule trained the way Lightning users do: `Trainer(accelerator=
"cpu", devices=2, strategy=DDPStrategy(timeout=...))`, `self.log(..., sync_dist=True)`,
callbacks. Started with plain `python` (Lightning's own launcher makes this process rank 0 and
starts rank 1 as a child) or under torchrun (Lightning then takes the ranks torchrun made).

FAULT (argv[1]) picks the mistake or accident injected where users meet it:
  healthy             three epochs, exit 0 (Lightning's usual warnings only)
  early-stop          EarlyStopping(monitor="val_loss") stops the run: every rank stops, exit 0
  unused-parameters   the auxiliary head is built but left out of the loss
  sync-dist-in-branch the validation metric is logged with sync_dist=True on global rank 0 only
  eval-exception      validation_step raises on rank 1 (a sample it cannot score)
  checkpoint-missing  resuming with ckpt_path on each node's local disk: ModelCheckpoint saved on
                      global rank 0 only, so node 1 has no file
Each rank plays a node with its own local disk: `node<local rank>/` under the working directory.
"""

import os
import sys
from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULT = sys.argv[1] if len(sys.argv) > 1 else "healthy"
FAIL_RANK = 1
NODE_DISK = f"node{os.environ.get('LOCAL_RANK', '0')}"
# The process group's timeout, for collectives and for ranks joining at start-up: under
# Lightning's own launcher rank 1 starts only after rank 0 has imported everything, which takes
# longer than a few seconds on a busy 2-core machine.
TIMEOUT = timedelta(seconds=float(os.environ.get("DDP_TIMEOUT_S", "30")))


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic regression data: y is the sum of the features."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)
        self.aux_head = nn.Linear(16, 1)  # predicts the noise level, an auxiliary task

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.head(h).squeeze(-1), self.aux_head(h).squeeze(-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        pred, aux = self(x)
        loss = nn.functional.mse_loss(pred, y)
        if FAULT != "unused-parameters":
            loss = loss + 0.1 * aux.pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> None:
        x, y = batch
        pred, _ = self(x)
        if FAULT == "eval-exception" and self.global_rank == FAIL_RANK:
            raise ValueError(f"cannot score batch {idx}: targets contain NaN")
        mae = (pred - y).abs().mean()
        if FAULT == "sync-dist-in-branch":
            if self.trainer.is_global_zero:  # only rank 0 reports the metric
                self.log("val_loss", mae, sync_dist=True)
        else:
            self.log("val_loss", mae, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**overrides: object) -> L.Trainer:
    settings: dict[str, object] = {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": DDPStrategy(timeout=TIMEOUT),
        "max_epochs": 3,
        "logger": False,
        "enable_checkpointing": False,
    }
    return L.Trainer(**{**settings, **overrides})  # type: ignore[arg-type]


def main() -> None:
    L.seed_everything(0)
    train = DataLoader(Samples(128, 0), batch_size=8, shuffle=True)
    val = DataLoader(Samples(32, 1), batch_size=8)
    model = Regressor()
    if FAULT == "early-stop":
        # stop once val_loss improves by less than 1.0 (a plateau on this toy problem)
        stop = EarlyStopping(monitor="val_loss", patience=1, min_delta=1.0, verbose=True)
        trainer(callbacks=[stop], max_epochs=20).fit(model, train, val)
    elif FAULT == "checkpoint-missing":
        # a first job saved its last checkpoint; a second one resumes from it on every node
        save = ModelCheckpoint(dirpath=NODE_DISK, save_last=True)
        trainer(callbacks=[save], enable_checkpointing=True, max_epochs=1).fit(model, train, val)
        trainer(max_epochs=2).fit(model, train, val, ckpt_path=f"{NODE_DISK}/last.ckpt")
    else:
        trainer().fit(model, train, val)
    # Lightning leaves the process group alive at the end; gloo in torch 2.13 may then abort a
    # process at exit ("terminate called without an active exception")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
