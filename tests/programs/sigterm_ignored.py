"""Rank 0 raises after three all-reduces; rank 1 is busy in work of its own and its SIGTERM
handler only notes the signal, so torchrun's agent kills it with SIGKILL after its 30 s grace
period ('Unable to shutdown process N via 15, forcefully exiting via 9'). Captured as
tests/fixtures/real/launcher-escalation/console.log with
`torchrun --nproc-per-node=2 --master-port=39977 sigterm_ignored.py` (paths rewritten to /repo)."""

from __future__ import annotations

import datetime
import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()


def note(signum: int, frame: FrameType | None) -> None:
    print(f"rank {rank}: got SIGTERM, finishing the step first", flush=True)


signal.signal(signal.SIGTERM, note)
for step in range(3):
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} step {step} ok", flush=True)
if rank == 0:
    raise ValueError("label 9 out of range for 5 classes")
while True:
    time.sleep(1)  # rank 1 stuck in work of its own, ignoring SIGTERM
