"""The collective test that runs inside every rank under torchrun (or any launcher that sets
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): init, barrier, all_reduce and all_gather correctness,
bandwidth, facts gathered to rank 0. Each rank writes its progress to `<result>.rank<N>.json`;
rank 0 writes the whole result to the path in $DDPDOCTOR_CHECK_RESULT (or --output).
Usage on several nodes:  torchrun --nnodes N ... -m ddpdoctor.preflight.worker --output FILE"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ddpdoctor.preflight.collective import RESULT_ENV, busbw_factor
from ddpdoctor.preflight.facts import collect_facts

WORKER_SCHEMA = "ddpdoctor.check-worker/v1"
DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)


def rank_file(result: Path, rank: int) -> Path:
    return result.with_name(f"{result.name}.rank{rank}.json")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: the parent may read while we write, or kill us in between."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


class Progress:
    """One rank's own account: stages reached, with their durations and the error if any."""

    def __init__(self, result: Path | None, rank: int) -> None:
        self.path = rank_file(result, rank) if result else None
        self.data: dict[str, Any] = {
            "rank": rank,
            "pid": os.getpid(),
            "stages": [],
            "error": None,
            "done": False,
        }

    def start(self, name: str) -> float:
        self.data["stages"].append({"name": name, "status": "running", "duration_s": None})
        self.flush()
        return time.perf_counter()

    def end(self, t0: float, status: str = "ok", **extra: Any) -> None:
        stage = self.data["stages"][-1]
        stage.update(status=status, duration_s=round(time.perf_counter() - t0, 6), **extra)
        self.flush()

    def flush(self) -> None:
        if self.path is not None:
            _write_json(self.path, self.data)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddpdoctor.preflight.worker")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--pg-timeout", type=float, default=30.0, help="process group timeout (s)")
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--output", default=None, help=f"result file (default: ${RESULT_ENV})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.output or os.environ.get(RESULT_ENV)
    result = Path(out) if out else None
    rank = int(os.environ.get("RANK", "0"))
    progress = Progress(result, rank)
    progress.flush()
    try:
        summary = run(args, rank, progress)
    except Exception as exc:
        stage = progress.data["stages"][-1]["name"] if progress.data["stages"] else "start"
        if progress.data["stages"]:
            progress.data["stages"][-1]["status"] = "failed"
        progress.data["error"] = {
            "stage": stage,
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }
        progress.flush()
        sys.stderr.write(f"[ddpdoctor check rank {rank}] {stage} failed: {exc}\n")
        return 1
    progress.data["done"] = True
    progress.flush()
    if rank == 0 and result is not None and summary is not None:
        _write_json(result, summary)
    return 0


def run(args: argparse.Namespace, rank: int, progress: Progress) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    device = torch.device("cpu")
    facts = collect_facts(topo=local_rank == 0)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        facts["device"] = _device_facts(torch, local_rank)

    t0 = progress.start("init")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.pg_timeout))
    progress.end(t0, backend=backend)
    world = dist.get_world_size()

    t0 = progress.start("barrier")
    dist.barrier()
    progress.end(t0)

    t0 = progress.start("all_reduce")
    x = torch.arange(1024, dtype=torch.float32, device=device) + rank
    dist.all_reduce(x)
    expect = torch.arange(1024, dtype=torch.float32, device=device) * world + sum(range(world))
    ok_ar = bool(torch.equal(x, expect))
    progress.end(t0, "ok" if ok_ar else "wrong")

    t0 = progress.start("all_gather")
    mine = torch.full((256,), float(rank), device=device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    ok_ag = all(bool(torch.all(p == float(r))) for r, p in enumerate(parts))
    progress.end(t0, "ok" if ok_ag else "wrong")
    if not (ok_ar and ok_ag):
        raise RuntimeError(
            f"collective returned wrong data (all_reduce ok={ok_ar}, all_gather ok={ok_ag})"
        )

    t0 = progress.start("bandwidth")
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    bw = measure_bandwidth(torch, dist, device, world, sizes, args.iters, args.warmup)
    progress.end(t0)

    t0 = progress.start("gather_facts")
    dist.barrier()
    facts["time_unix"] = time.time()  # taken right after a barrier: the clock-skew probe
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, facts)
    progress.end(t0)

    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {
        "schema": WORKER_SCHEMA,
        "backend": backend,
        "world_size": world,
        "stages": progress.data["stages"],
        "correctness": {"all_reduce": ok_ar, "all_gather": ok_ag},
        "bandwidth": bw,
        "ranks": gathered,
    }


def _device_facts(torch: Any, local_rank: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(local_rank)
    uuid = getattr(props, "uuid", None)
    return {
        "local_index": local_rank,
        "name": props.name,
        "uuid": f"GPU-{uuid}" if uuid is not None else None,
        "pci_bus_id": getattr(props, "pci_bus_id", None),
    }


def _op_step(
    torch: Any, dist: Any, op: str, n: int, world: int, device: Any, gather_into: Any
) -> Callable[[], None]:
    """One iteration of `op` over n float32 elements in total (buffers allocated once)."""
    if op == "all_reduce":
        buf = torch.ones(n, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buf)
    inp = torch.ones(n // world, dtype=torch.float32, device=device)
    outp = torch.empty(n, dtype=torch.float32, device=device)
    return lambda: gather_into(outp, inp)


def measure_bandwidth(
    torch: Any, dist: Any, device: Any, world: int, sizes: list[int], iters: int, warmup: int
) -> list[dict[str, Any]]:
    """algbw and busbw as nccl-tests defines them: size is the full buffer (all_reduce) or the
    full gathered output (all_gather); time is the slowest rank's mean per iteration."""
    rows: list[dict[str, Any]] = []
    # all_gather_into_tensor is deprecated in favour of all_gather_single in torch 2.13
    gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            n = max(world, size // 4 // world * world)  # float32 elements, divisible by world
            nbytes = n * 4
            step = _op_step(torch, dist, op, n, world, device, gather_into)
            for _ in range(warmup):
                step()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            time_s = float(elapsed.item())
            algbw = nbytes / time_s / 1e9 if time_s > 0 else 0.0
            rows.append(
                {
                    "op": op,
                    "bytes": nbytes,
                    "time_s": time_s,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * busbw_factor(op, world),
                }
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
