"""Rank 1 fails to read its shard and logs it with logger.exception (timestamped); rank 0
waits in all_reduce, times out (gloo, 3 s) and logs that too. Both ranks' errors carry Python
logging timestamps, so the timeout arithmetic can be checked on real output."""

import logging
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

logging.basicConfig(format="%(asctime)s %(levelname)s rank%(rank)s %(message)s", level=logging.INFO)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    log = logging.LoggerAdapter(logging.getLogger("train"), {"rank": rank})
    t = torch.ones(2)
    for step in range(3):
        dist.all_reduce(t)
        log.info("step %d done", step)
    try:
        if rank == 1:
            with open(f"/nonexistent/shard-{rank}.bin", "rb") as f:
                f.read()
        dist.all_reduce(t)
    except Exception:
        log.exception("step 3 failed")
        if rank == 1:
            time.sleep(5)  # keep the process (and its socket) alive, like a slow teardown
        sys.exit(1)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
