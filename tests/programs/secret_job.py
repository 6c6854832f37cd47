"""A 2-rank gloo job for the redaction tests. Like many training scripts it takes its hub token
on the command line (--hub_token) and its W&B key from the environment. Rank 1 stops making
progress for STALL seconds (long enough for `ddpdoctor run` to dump every rank's stack: py-spy
heads each dump with the process's command line), then fails with both secrets in its message.
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hub_token", required=True)
    parser.add_argument("--stall", type=float, default=8.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        print(f"step {step} loss {1.0 / (step + 1):.3f}", flush=True)
        time.sleep(0.1)
    if rank == 1:
        time.sleep(args.stall)
        raise RuntimeError(
            f"push to https://trainer:{args.hub_token}@huggingface.co/acme/model failed "
            f"(WANDB_API_KEY={os.environ['WANDB_API_KEY']})"
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
