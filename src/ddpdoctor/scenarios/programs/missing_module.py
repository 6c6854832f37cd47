"""Injects missing-module: the script imports NVIDIA apex, which the image does not ship, so
every rank dies at import with "ModuleNotFoundError: No module named 'apex'"."""

from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    from apex.optimizers import FusedAdam  # the missing dependency

    FusedAdam(torch.nn.Linear(8, 1).parameters())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
