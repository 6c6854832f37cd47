"""Injects local-rank-argument: a torchrun-style script started with torch.distributed.launch.

The script's argparse declares no --local-rank, as torchrun scripts read LOCAL_RANK from the
environment; the deprecated launcher still appends --local-rank=N to argv, so every rank exits
with "error: unrecognized arguments: --local-rank=N" (status 2).
"""

import argparse
import os

import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description="train")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    print(f"local rank {os.environ['LOCAL_RANK']} training {args.epochs} epochs", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
