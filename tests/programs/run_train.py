"""A tiny gloo job for `ddpdoctor run` tests. MODE (argv[1]):
ok: steps then exit 0; pause: steps, a pause of PAUSE s on all ranks, steps, exit 0;
hang: rank 1 sleeps while the others wait in a barrier; exit: rank 1 exits with CODE (argv[2]);
sigterm: rank 1 kills itself with SIGTERM; wait: every rank sleeps (for signal tests).
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    arg = sys.argv[2] if len(sys.argv) > 2 else "0"
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(5):
        dist.all_reduce(t)
        print(f"step {step} loss {1.0 / (step + 1):.3f}", flush=True)
        time.sleep(0.1)
    if mode == "pause":
        time.sleep(float(arg))
        for step in range(5, 10):
            dist.all_reduce(t)
            print(f"step {step} loss 0.1", flush=True)
    elif mode == "hang":
        print(f"HANG_START {time.time():.3f}", flush=True)
        if rank == 1:
            time.sleep(3600)
        dist.barrier()
    elif mode == "exit":
        if rank == 1:
            os._exit(int(arg))
        time.sleep(0.5)
        dist.barrier()
    elif mode == "sigterm":
        if rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        dist.barrier()
    elif mode == "wait":
        print(f"WAITING rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(3600)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
