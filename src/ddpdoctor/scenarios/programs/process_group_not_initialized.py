"""Injects process-group-not-initialized: the script asks for its rank before it calls
init_process_group, so every rank raises "Default process group has not been initialized"."""

from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    rank = dist.get_rank()  # too early: init_process_group has not run yet
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    print(f"rank {rank} ready", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
