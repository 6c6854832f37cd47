"""Rank 1 sleeps instead of entering the barrier the others wait in; every rank arms
faulthandler.dump_traceback_later, the usual "dump my stacks if I hang" guard, so after 5 s
each rank prints its Python stack and exits. The process group timeout is far longer."""

import faulthandler
import time
from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    faulthandler.dump_traceback_later(5, exit=True)
    print(f"rank {rank} entering barrier", flush=True)
    if rank == 1:
        time.sleep(60)
    dist.barrier()


if __name__ == "__main__":
    main()
