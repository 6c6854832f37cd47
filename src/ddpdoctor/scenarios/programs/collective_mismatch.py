"""Injects collective-mismatch: a collective inside a rank-dependent branch.

Rank 0 logs a metric with an extra all_reduce that the other ranks never issue, so their next
collectives pair up wrongly. argv[1] picks the mismatch: `op` (rank 0 all_reduce vs broadcast
elsewhere) or `shape` (same op, a tensor of another size on rank 1). gloo either aborts
("Is there a distributed collective mismatch") or, with TORCH_DISTRIBUTED_DEBUG=DETAIL, raises
"Detected mismatch between collectives on ranks".
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "op"
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    for step in range(4):
        grads = torch.ones(1024)
        dist.all_reduce(grads)
        print(f"rank {rank} step {step} grad {grads[0].item():.0f}", flush=True)
        if step == 2:
            if mode == "shape":
                stats = torch.zeros(16 if rank == 1 else 4096)  # rank 1 gathers fewer stats
                dist.all_reduce(stats)
            elif rank == 0:
                dist.all_reduce(torch.ones(8))  # only rank 0 logs this metric
            else:
                dist.broadcast(torch.ones(8), src=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
