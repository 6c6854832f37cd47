"""A tiny gloo job launched by Slurm itself (`srun -n N python slurm_train.py MODE`), written the
way Slurm users write it: rank and world size from SLURM_PROCID / SLURM_NTASKS, MASTER_ADDR and
MASTER_PORT exported by the caller. MODE (argv[1]):
ok: steps then exit 0; forever: a step every 0.5 s until stopped (time limit, scancel, signals);
sigkill: rank 1 kills itself with SIGKILL after step 2 while the others all-reduce;
hang: rank 1 sleeps while the others wait in a barrier; exit: rank 1 exits with CODE (argv[2]);
wait: every rank sleeps (for signal tests).
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
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    timeout = timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "60")))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    print(f"rank {rank}/{world} pid {os.getpid()} on {os.uname().nodename}", flush=True)
    t = torch.ones(4)
    steps = 10**9 if mode == "forever" else 5
    for step in range(steps):
        if mode == "sigkill" and rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
        print(f"step {step} loss {1.0 / (step + 1):.3f}", flush=True)
        time.sleep(0.5 if mode == "forever" else 0.1)
    if mode == "hang":
        print(f"HANG_START {time.time():.3f}", flush=True)
        if rank == 1:
            time.sleep(3600)
        dist.barrier()
    elif mode == "exit":
        if rank == 1:
            os._exit(int(arg))
        time.sleep(0.5)
        dist.barrier()
    elif mode == "wait":
        print(f"WAITING rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(3600)
    dist.destroy_process_group()
    print(f"rank {rank}: training finished", flush=True)


if __name__ == "__main__":
    main()
