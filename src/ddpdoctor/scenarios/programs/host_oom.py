"""Injects host-oom: rank 1 grows a host-memory cache, then dies from SIGKILL at step 3
(with the argument `startup`: while loading, before it joins the process group, so the other
rank waits for it at start-up).

The kernel OOM killer sends SIGKILL, which leaves no Python traceback; here rank 1 sends it to
itself (no real memory exhaustion on a shared machine). torchrun reports exit code -9 for rank 1;
rank 0 loses its peer in all_reduce.
"""

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

FAIL_RANK = 1
FAIL_STEP = 3


def main() -> None:
    if sys.argv[1:] == ["startup"] and os.environ.get("RANK") == str(FAIL_RANK):
        preload = [torch.ones(4 * 1024 * 1024) for _ in range(4)]  # a dataset loaded into RAM
        print(f"rank {FAIL_RANK} preloaded {len(preload) * 16} MiB", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    cache: list[torch.Tensor] = []
    for step in range(8):
        cache.append(torch.ones(4 * 1024 * 1024))  # 16 MiB per step that is never freed
        if rank == FAIL_RANK and step == FAIL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step} cache {len(cache) * 16} MiB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
