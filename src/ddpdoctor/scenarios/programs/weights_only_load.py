"""Injects weights-only-load: the checkpoint holds a custom config object next to the weights.
Since torch 2.6, torch.load defaults to weights_only=True and refuses to unpickle it, so every
rank fails to resume with "Weights only load failed"."""

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class TrainConfig:
    lr: float = 0.1
    epochs: int = 3


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    path = os.path.abspath("last.ckpt")
    if rank == 0:
        model = torch.nn.Linear(8, 1)
        torch.save({"model": model.state_dict(), "config": TrainConfig()}, path)
        print(f"rank 0 saved {path}", flush=True)
    dist.barrier()
    state = torch.load(path)  # weights_only=True by default
    print(f"rank {rank} resumed from epoch {state['config'].epochs}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
