"""Injects native-crash: rank 1 segfaults inside native code at step 3.

A C extension that reads a bad pointer kills its process with SIGSEGV and leaves no Python
traceback; here rank 1 reads address 0 through ctypes, a real segmentation fault. torchrun
reports exit code -11 for rank 1; rank 0 loses its peer in all_reduce.
"""

import ctypes
from datetime import timedelta

import torch
import torch.distributed as dist

FAIL_RANK = 1
FAIL_STEP = 3


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    for step in range(8):
        if rank == FAIL_RANK and step == FAIL_STEP:
            ctypes.string_at(0)  # a native library dereferencing a null pointer
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
