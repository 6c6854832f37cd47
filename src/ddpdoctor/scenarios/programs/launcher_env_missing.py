"""Injects launcher-env-missing: a torchrun script started with plain `python`.

No launcher set RANK/LOCAL_RANK/WORLD_SIZE, so the first os.environ["LOCAL_RANK"] raises
KeyError: 'LOCAL_RANK'.
"""

import os
from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    print(f"rank {dist.get_rank()} (local {local_rank}) ready", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
