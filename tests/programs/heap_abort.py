"""Rank 1's native extension frees a buffer twice at step 3 (here through ctypes on libc, as a
buggy C extension does): glibc detects it, prints its message and aborts (SIGABRT, no Python
traceback). Rank 0 loses its peer in the next all_reduce (gloo, 10 s timeout)."""

import ctypes
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    t = torch.ones(4)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    for step in range(6):
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t.sum().item():.0f}", flush=True)
        if rank == 1 and step == 3:
            buffer = libc.malloc(64)
            libc.free(buffer)
            libc.free(buffer)  # the second free: glibc aborts the process
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
