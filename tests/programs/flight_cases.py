"""Collective faults with PyTorch's Flight Recorder on (TORCH_FR_BUFFER_SIZE set), captured by
tests/fixtures/real/flight-recorder/capture.sh. argv[1] picks the fault:

  skip          rank 1 skips one step's gradient all_reduce (a bad batch), then both barrier
  op            at step 2 rank 0 all_reduces a metric, rank 1 broadcasts it
  shape         at step 2 rank 0 all_reduces 4096 floats, rank 1 only 16
  sleep         rank 1 sleeps (a slow checkpoint) while rank 0 waits in the barrier
  die           rank 1 raises on a bad batch before step 2's all_reduce
  two-groups    a second process group; the ranks call the two groups in opposite order
  busy          rank 1 raises on a bad batch while rank 0 is busy outside any collective
                (for `ddpdoctor run` tests: rank 0 raises nothing, the launcher ends it)

On gloo the recorder never dumps by itself, so this program dumps as a user does: on an
exception and on SIGTERM (the launcher stopping it), to $FR_DUMP_DIR/rank<RANK>.pkl (with the
frames) and rank<RANK>.json (no frames). A sleeping rank also serves the c10d worker server
on $FR_DUMP_DIR/rank<RANK>.sock so that the capture script can ask it for `fr_trace_json`.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json, _WorkerServer

STEPS = 4


def dump_flight_recorder() -> None:
    """What a user adds beside faulthandler: the last collectives of this rank, both forms."""
    out = os.environ.get("FR_DUMP_DIR")
    if not out:
        return
    rank = os.environ.get("RANK", "x")
    with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as fh:
        fh.write(_dump_fr_trace())
    with open(os.path.join(out, f"rank{rank}.json"), "wb") as fh:
        fh.write(_dump_fr_trace_json())
    print(f"rank {rank}: flight recorder dumped", flush=True)


def on_sigterm(signum: int, _frame: object) -> None:
    dump_flight_recorder()
    sys.exit(128 + signum)


def train(case: str, rank: int) -> None:
    grads = torch.ones(1024)
    group = dist.new_group([0, 1]) if case == "two-groups" else None
    for step in range(STEPS):
        if case in ("die", "busy") and rank == 1 and step == 2:
            raise ValueError(f"corrupt sample in batch {step}: label -1 out of range")
        if case == "busy" and rank == 0 and step == 2:
            print(f"rank {rank} evaluating", flush=True)
            time.sleep(30)
        if case == "skip" and rank == 1 and step == 2:
            print(f"rank {rank} step {step}: nan loss, skipping the update", flush=True)
            continue
        dist.all_reduce(grads)
        print(f"rank {rank} step {step} done", flush=True)
        if step == 2 and case == "op":
            metric = torch.ones(8)
            if rank == 0:
                dist.all_reduce(metric)
            else:
                dist.broadcast(metric, src=0)
        if step == 2 and case == "shape":
            stats = torch.zeros(16 if rank == 1 else 4096)
            dist.all_reduce(stats)
        if step == 2 and case == "two-groups":
            loss = torch.ones(1)
            if rank == 0:
                dist.all_reduce(loss, group=group)
                dist.all_reduce(grads)
            else:
                dist.all_reduce(grads)
                dist.all_reduce(loss, group=group)
    if case == "sleep" and rank == 1:
        print(f"rank {rank} saving a checkpoint", flush=True)
        time.sleep(30)
    print(f"rank {rank} entering the final barrier", flush=True)
    dist.barrier()


def main() -> None:
    case = sys.argv[1]
    timeout_s = float(os.environ.get("FR_PG_TIMEOUT_S", "3"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    signal.signal(signal.SIGTERM, on_sigterm)
    server = None
    if case == "sleep" and os.environ.get("FR_DUMP_DIR"):
        server = _WorkerServer(os.path.join(os.environ["FR_DUMP_DIR"], f"rank{rank}.sock"))
    try:
        train(case, rank)
    except Exception:
        dump_flight_recorder()
        raise
    finally:
        if server is not None:
            server.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
