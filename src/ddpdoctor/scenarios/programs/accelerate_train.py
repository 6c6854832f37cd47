"""A small regression model trained the way HF Accelerate's examples do (`accelerator.prepare`,
`accelerator.backward`, `gather_for_metrics`, `wait_for_everyone`, `is_main_process`), run by
`accelerate launch --multi_gpu --num_processes 2` on CPU (`Accelerator(cpu=True)`: gloo).

FAULT (argv[1]) picks the mistake or accident injected where users meet it:
  healthy             two epochs with evaluation, exit 0 (accelerate's usual warnings only)
  loss-main-only      the auxiliary loss is added on the main process only
  gather-in-branch    the evaluation metric is gathered inside `if accelerator.is_main_process`
  eval-exception      rank 1's evaluation shard has no labels: its metric divides by zero
  worker-killed       rank 1's DataLoader worker is SIGKILLed (as by the OOM killer)
  sigkill             rank 1 is SIGKILLed at step 3 (as by the OOM killer)
  checkpoint-missing  resuming from each node's local disk; Accelerate saved the weights on the
                      main node only (save_on_each_node=False), so node 1's folder lacks them
Each rank plays a node with its own local disk: `node<rank>/` under the working directory.
"""

import os
import signal
import sys
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULT = sys.argv[1] if len(sys.argv) > 1 else "healthy"
Batch = tuple[torch.Tensor, torch.Tensor]
FAIL_RANK = 1
FAIL_STEP = 3


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)
        self.aux_head = nn.Linear(16, 1)  # predicts the noise level, an auxiliary task

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.head(h).squeeze(-1), self.aux_head(h).squeeze(-1)


class Samples(Dataset[Batch]):
    """Synthetic regression data: y is the sum of the features."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(-1)
        self.served = 0  # in a DataLoader worker: that worker's own copy counts

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Batch:
        self.served += 1
        doomed = FAULT == "worker-killed" and os.environ.get("RANK") == str(FAIL_RANK)
        if doomed and self.served == 20:  # rank 1's worker, whatever the shuffled order
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to a worker
        return self.x[i], self.y[i]


def evaluate(accelerator: Accelerator, model: nn.Module, loader: Iterable[Batch]) -> float:
    """The mean absolute error over each rank's labelled samples, averaged over the ranks."""
    model.eval()
    maes = []
    for x, y in loader:
        with torch.no_grad():
            pred, _ = model(x)
        if FAULT == "eval-exception" and accelerator.process_index == FAIL_RANK:
            y = torch.full_like(y, float("nan"))  # this shard's labels are missing
        labelled = ~torch.isnan(y)
        maes.append(float((pred - y)[labelled].abs().sum()) / int(labelled.sum()))
    model.train()
    local = torch.tensor(maes)
    if FAULT == "gather-in-branch":
        if accelerator.is_main_process:  # only the main process reports the metric
            return float(accelerator.gather_for_metrics(local).mean())
        return float("nan")
    return float(accelerator.gather_for_metrics(local).mean())


def main() -> None:
    config = ProjectConfiguration(project_dir=f"node{os.environ.get('RANK', '0')}")
    accelerator = Accelerator(
        cpu=True,
        project_config=config,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=5))],
    )
    rank = accelerator.process_index
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    workers = 1 if FAULT == "worker-killed" else 0
    train = DataLoader(Samples(128, 0), batch_size=8, shuffle=True, num_workers=workers)
    val = DataLoader(Samples(32, 1), batch_size=8)
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
    accelerator.print(f"training on {accelerator.num_processes} processes ({accelerator.device})")

    checkpoint = Path(config.project_dir) / "checkpoint"
    if FAULT == "checkpoint-missing":
        accelerator.save_state(checkpoint)  # the end of a previous job, on each node's disk
        accelerator.wait_for_everyone()
        accelerator.print(f"resuming from {checkpoint}")
        accelerator.load_state(checkpoint)

    step = 0
    for epoch in range(2):
        for x, y in train:
            pred, aux = model(x)
            loss = nn.functional.mse_loss(pred, y)
            if FAULT != "loss-main-only" or accelerator.is_main_process:  # the fault: rank 0 only
                loss = loss + 0.1 * aux.pow(2).mean()  # the auxiliary task
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if FAULT == "sigkill" and rank == FAIL_RANK and step == FAIL_STEP:
                os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
            if step % 4 == 0:
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            step += 1
        mae = evaluate(accelerator, model, val)
        accelerator.print(f"epoch {epoch} validation MAE {mae:.4f}")

    accelerator.wait_for_everyone()
    accelerator.end_training()
    accelerator.print("training finished")


if __name__ == "__main__":
    main()
