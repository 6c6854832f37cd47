"""Synthetic multi-rank logs for the scanning benchmark, with a fixed seed, plus a few hundred real
error lines copied at generation time from ../shared/corpus/*/logs, else corpus/cases/*/logs
(error texts are never invented).

- `single`, `gz`, `ranks`: the sparse case (about 0.01% of lines need a closer look): torchrun
  rank prefixes, glog and NCCL INFO noise, tqdm bars and step lines.
- `dense` (one console) and `dense-ranks` (one file per rank): logs as big jobs print them, at a
  chosen candidate density (the share of lines the prefilter hands to Python): NCCL INFO at
  every communicator's init with distinct ranks, hosts, devices and comm ids, DeepSpeed
  `log_dist` and a tqdm bar per step, per-rank warnings repeated every step (ZeRO-3's allocator
  cache flushes, DDP's grad strides, c10d's reconnects), ranks interleaved, Slurm `--label` and
  torchrun `[rankN]:` prefixes. The noise and candidate texts follow what NCCL 2.18-2.21,
  DeepSpeed 0.14, torch 2.x and tqdm print; every line carries the second of its block, so
  candidate lines are not byte-identical copies of each other.

Usage: python benchmarks/generate.py single|ranks|gz|dense|dense-ranks OUT [--gib N]
       [--files M] [--density D] [--seed S]
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
REPO_CORPUS = ROOT / "corpus" / "cases"
"""The repository's own labelled cases: where ../shared/corpus is absent (a clone elsewhere)."""
GIB = 1024**3
POOL_BLOCK_BYTES = 256 * 1024
POOL_BLOCKS = 48
ERROR_LINE = re.compile(
    r"Error|error:|Exception|Traceback|failed|FAILED|WARN|Timeout|timed out|SIG[A-Z]+|exitcode|"
    r"Killed|Aborted|CUDA|NCCL WARN|RuntimeError",
)


def corpus_error_lines(limit: int = 400) -> list[str]:
    """Real error lines (and traceback frames around them) from the labelled corpus."""
    lines: list[str] = []
    logs = sorted(CORPUS.glob("*/logs/*")) or sorted(REPO_CORPUS.glob("*/logs/*"))
    for log in logs:
        if not log.is_file():
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        for raw in text.splitlines():
            line = raw.rstrip()
            if line and ERROR_LINE.search(line) and len(line) < 4000:
                lines.append(line)
    if not lines:
        raise SystemExit(f"no corpus logs under {CORPUS} or {REPO_CORPUS}: no real error lines")
    out: list[str] = []
    while len(out) < limit:
        out.extend(lines)
    return out[:limit]


def _noise_line(rng: random.Random, rank: int, world: int, step: int, host: str) -> str:
    """One ordinary line of a healthy job, as torchrun prefixes it."""
    pid = 40000 + rank
    kind = rng.random()
    if kind < 0.40:
        ch = rng.randrange(32)
        peer = (rank + 1) % world
        return (
            f"[rank{rank}]:{host}:{pid}:{pid + 80} [{rank % 8}] NCCL INFO Channel {ch:02d}/0 : "
            f"{rank}[{rank % 8}] -> {peer}[{peer % 8}] via P2P/CUMEM/read"
        )
    if kind < 0.65:
        loss = rng.uniform(0.5, 4.0)
        lr = rng.uniform(1e-5, 3e-4)
        return (
            f"[rank{rank}]:I0612 10:{step // 600 % 60:02d}:{step // 10 % 60:02d}.{step % 1000:06d}"
            f" {pid} train.py:214] step {step} loss {loss:.4f} lr {lr:.2e} grad_norm "
            f"{rng.uniform(0.1, 3):.3f} tokens/s {rng.randrange(90000, 140000)}"
        )
    if kind < 0.80:
        total = 20000
        n = step % total
        pct = n * 100 // total
        bar = "\u2588" * (pct // 10) + " " * (10 - pct // 10)
        el = n // 3
        return (
            f"[rank{rank}]: {pct:3d}%|{bar}| {n}/{total} [{el // 60:02d}:{el % 60:02d}<"
            f"{(total - n) // 180:02d}:{(total - n) // 3 % 60:02d},  3.01it/s]"
        )
    if kind < 0.92:
        return (
            f"[rank{rank}]:{host}:{pid}:{pid + 81} [{rank % 8}] NCCL INFO AllReduce: opCount "
            f"{step:x} sendbuff 0x7f{rng.randrange(1 << 28):07x} count {rng.randrange(1 << 20)} "
            f"datatype 7 op 0 root 0 comm 0x55d3c2a1f0 [nranks={world}] stream 0x55d3c29e40"
        )
    return (
        f"[rank{rank}]:W0612 10:00:{step % 60:02d}.{step % 1000:06d} {pid} dataloader.py:88] "
        f"prefetch queue depth {rng.randrange(8)} worker {rng.randrange(16)} batch {step}"
    )


def _pool(seed: int, ranks: list[int], world: int) -> list[bytes]:
    """Blocks of noise lines reused (in a seeded order) to write gigabytes quickly."""
    rng = random.Random(seed)
    blocks: list[bytes] = []
    step = 0
    for _ in range(POOL_BLOCKS):
        lines: list[str] = []
        size = 0
        while size < POOL_BLOCK_BYTES:
            rank = rng.choice(ranks)
            host = f"node{rank // 8}"
            step += 1
            line = _noise_line(rng, rank, world, step, host) + "\n"
            lines.append(line)
            size += len(line.encode())
        blocks.append("".join(lines).encode())
    return blocks


def _init_lines(ranks: list[int], world: int) -> bytes:
    out = []
    for rank in ranks:
        host = f"node{rank // 8}"
        out.append(
            f"[rank{rank}]:{host}:{40000 + rank}:{40100 + rank} [{rank % 8}] NCCL INFO comm "
            f"0x55d3c2a1f0 rank {rank} nranks {world} cudaDev {rank % 8} busId 1b000 - "
            "Init COMPLETE\n"
        )
    return "".join(out).encode()


def write_log(
    path: Path,
    size: int,
    seed: int,
    ranks: list[int],
    world: int,
    errors: int,
    pool: list[bytes] | None = None,
) -> None:
    """One log of about `size` bytes; `errors` real error lines spread over its last half."""
    rng = random.Random(seed)
    pool = pool if pool is not None else _pool(seed, ranks, world)
    real = corpus_error_lines()
    tail_start = size // 2
    error_at = sorted(rng.randrange(tail_start, max(tail_start + 1, size)) for _ in range(errors))
    written = 0
    with _writer(path) as fh:
        head = _init_lines(ranks, world)
        fh.write(head)
        written += len(head)
        e = 0
        while written < size:
            block = pool[rng.randrange(len(pool))]
            if len(block) > size - written:
                block = block[: block.rfind(b"\n", 0, size - written) + 1]
                if not block:
                    break
            fh.write(block)
            written += len(block)
            while e < len(error_at) and error_at[e] <= written:
                line = real[(seed + e) % len(real)]
                if not line.startswith("[rank"):  # torchrun prefixes what a worker prints
                    line = f"[rank{ranks[(seed + e) % len(ranks)]}]:{line}"
                fh.write(line.encode() + b"\n")
                written += len(line) + 1
                e += 1


DENSITIES = (0.001, 0.01, 0.05, 0.10, 0.20)
"""The candidate densities `make bench` measures (share of lines the prefilter hands to Python)."""
GPUS_PER_NODE = 8
DENSE_WORLD = 16
"""Two nodes of eight GPUs: the dense console's ranks."""
TIME_TOKEN = b"@TIME@@@"  # HH:MM:SS of the block, filled in when the block is written
COMM_TOKEN = b"@COMM@@@"  # 8 hex digits of the block: communicators of later blocks are new ones
ZERO3_FLUSH = (
    "[WARNING] [stage3.py:2117:step] {n} pytorch allocator cache flushes since last step. this "
    "happens when there is high memory pressure and is detrimental to performance. if this is "
    "happening frequently consider adjusting settings to reduce memory consumption. If you are "
    "unable to make the cache flushes go away consider adding get_accelerator().empty_cache() "
    "calls in your training loop to ensure that all ranks flush their caches at the same time"
)
GRAD_STRIDES = (
    "Warning: Grad strides do not match bucket view strides. This may indicate grad was not "
    "created according to the gradient layout contract, or that the param's strides changed "
    "since DDP was constructed.  This is not an error, but may impair performance."
)


@dataclass(frozen=True)
class Writer:
    """One rank as its lines show it: the prefixes in front, and its NCCL identity."""

    rank: int
    world: int
    prefix: str
    host: str
    pid: int

    @property
    def dev(self) -> int:
        return self.rank % GPUS_PER_NODE


def slurm_writers(world: int) -> list[Writer]:
    """`srun --label` running one torchrun per node with `--tee 3`: task id (the node) then
    the global rank, e.g. `1: [rank11]:`."""
    out = []
    for rank in range(world):
        node = rank // GPUS_PER_NODE
        out.append(
            Writer(rank, world, f"{node}: [rank{rank}]:", f"dgx-a100-{node:03d}", 52000 + rank)
        )
    return out


def _glog_time(letter: str, rng: random.Random) -> str:
    return f"{letter}0612 @TIME@@@.{rng.randrange(10**6):06d} "


def _ds_time(rng: random.Random) -> str:
    return f"[2024-06-12 @TIME@@@,{rng.randrange(1000):03d}] "


def _nccl(w: Writer, tid: int) -> str:
    return f"{w.host}:{w.pid}:{w.pid + tid} [{w.dev}] NCCL INFO "


def comm_init_line(w: Writer, rng: random.Random, comm: int, complete: bool) -> str:
    """A communicator's init as NCCL 2.18-2.21 prints it (init.cc): the world, a node's
    tensor-parallel group or a data-parallel group across nodes."""
    kind = comm % 3
    n, r = (
        (w.world, w.rank)
        if kind == 0
        else (GPUS_PER_NODE, w.dev)
        if kind == 1
        else (
            max(1, w.world // GPUS_PER_NODE),
            w.rank // GPUS_PER_NODE,
        )
    )
    ptr = f"0x{0x55D3C2A1F0 + comm * 0x1000 + w.rank:x}"
    head = _nccl(w, 0)  # the thread that calls init: the main one
    ids = f"busId {(w.dev + 1) * 0x10000:x} commId 0x@COMM@@@{comm:08x}"
    if not complete:
        return (
            f"{head}comm {ptr} rank {r} nranks {n} cudaDev {w.dev} nvmlDev {w.dev} {ids} "
            "- Init START"
        )
    return (
        f"{head}ncclCommInitRank comm {ptr} rank {r} nranks {n} cudaDev {w.dev} nvmlDev {w.dev} "
        f"{ids} localSize {GPUS_PER_NODE} used {rng.randrange(1 << 20, 1 << 26)} bytes on core "
        f"{rng.randrange(64)} - Init COMPLETE"
    )


def init_burst(w: Writer, rng: random.Random) -> list[str]:
    """One communicator's init on one rank: its START and COMPLETE lines (the candidates)
    around the channel, tree and connection lines NCCL prints in between."""
    comm = rng.randrange(1, 64)
    lines = [comm_init_line(w, rng, comm, complete=False)]
    for ch in range(rng.randrange(12, 32)):
        peer = (w.rank + 1 + ch % 2) % w.world
        lines.append(
            _nccl(w, 0) + f"Channel {ch:02d}/0 : {w.rank}[{w.dev}] -> {peer}[{peer % 8}] "
            f"via P2P/CUMEM/read"
        )
    lines.append(_nccl(w, 0) + "Connected all rings")
    lines.append(_nccl(w, 0) + "Connected all trees")
    lines.append(_nccl(w, 0) + "threadThresholds 8/8/64 | 128/8/64 | 512 | 512")
    lines.append(comm_init_line(w, rng, comm, complete=True))
    return lines


def dense_candidate(w: Writer, rng: random.Random, step: int) -> list[str]:
    """Lines the prefilter hands to Python: a warning (with its detail lines), a transport,
    or a communicator's init (two candidates among its INFO lines). Inits are rare after the
    start (a new process group, a lazily created P2P communicator): 0.5% of the events, so
    that at 20% density about one line in a thousand is a comm line, as in real logs of
    NCCL_DEBUG=INFO; every rank's first init is in the header."""
    kind = rng.random()
    if kind < 0.005:
        return init_burst(w, rng)
    if kind < 0.015:
        return [
            _nccl(w, 0) + f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
            f"[3]mlx5_3:1/IB [RO]; OOB ib0:10.3.{w.rank // GPUS_PER_NODE}.{10 + w.dev}<0>"
        ]
    if kind < 0.50:  # DeepSpeed ZeRO-3, every rank, every step under memory pressure
        return [_ds_time(rng) + ZERO3_FLUSH.format(n=rng.randrange(1, 9))]
    if kind < 0.75:  # torch's reducer.cpp, TORCH_WARN per step when warnings are always shown
        return [
            _glog_time("W", rng) + f"{w.pid} reducer.cpp:1400] " + GRAD_STRIDES,
            "grad.sizes() = [256, 64, 1, 1], strides() = [64, 1, 64, 64]",
            "bucket_view.sizes() = [256, 64, 1, 1], strides() = [64, 1, 1, 1] "
            "(function operator())",
        ]
    return [  # c10d while the store's host is not up yet (socket.cpp)
        _glog_time("W", rng) + f"{w.pid} socket.cpp:752] [c10d] The client socket has failed "
        f"to connect to [dgx-a100-000]:29500 (errno: 111 - Connection refused)."
    ]


def dense_noise(w: Writer, rng: random.Random, step: int) -> str:
    """An ordinary line of a healthy DeepSpeed job with NCCL_DEBUG=INFO (not a candidate)."""
    kind = rng.random()
    if kind < 0.22:
        ch = rng.randrange(32)
        peer = (w.rank + 1) % w.world
        return (
            _nccl(w, 80) + f"Channel {ch:02d}/0 : {w.rank}[{w.dev}] -> {peer}[{peer % 8}] "
            f"via P2P/CUMEM/read"
        )
    if kind < 0.30:
        return _nccl(w, 80) + rng.choice(
            (
                "Connected all rings",
                "Connected all trees",
                f"Trees [0] {w.rank + 1}/-1/-1->{w.rank}->{w.rank - 1} [1] -1/-1/-1->{w.rank}->-1",
                "threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
                "32 coll channels, 32 collnet channels, 0 nvls channels, 32 p2p channels, "
                "32 p2p channels per peer",
                "P2P Chunksize set to 524288",
            )
        )
    if kind < 0.55:
        return (
            _glog_time("I", rng) + f"{w.pid} train.py:214] step {step} loss "
            f"{rng.uniform(0.5, 4.0):.4f} lr {rng.uniform(1e-5, 3e-4):.2e} grad_norm "
            f"{rng.uniform(0.1, 3):.3f} tokens/s {rng.randrange(90000, 140000)}"
        )
    if kind < 0.75:
        return (
            _nccl(w, 81) + f"AllReduce: opCount {step:x} sendbuff 0x7f{rng.randrange(1 << 28):07x} "
            f"recvbuff 0x7f{rng.randrange(1 << 28):07x} count {rng.randrange(1 << 20)} datatype 7 "
            f"op 0 root 0 comm 0x55d3c2a1f0 [nranks={w.world}] stream 0x55d3c29e40"
        )
    if kind < 0.85:
        return (
            _ds_time(rng) + f"[INFO] [logging.py:96:log_dist] [Rank {w.rank}] step={step}, "
            f"skipped=0, lr=[{rng.uniform(1e-5, 3e-4):.6e}], mom=[[0.9, 0.95]]"
        )
    if kind < 0.90:
        return (
            _ds_time(rng) + f"[INFO] [timer.py:260:stop] epoch=0/micro_step={step}/global_step="
            f"{step}, RunningAvgSamplesPerSec={rng.uniform(90, 130):.4f}, CurrSamplesPerSec="
            f"{rng.uniform(90, 130):.4f}, MemAllocated=31.2GB, MaxMemAllocated=62.47GB"
        )
    return (
        _glog_time("W", rng) + f"{w.pid} dataloader.py:88] prefetch queue depth "
        f"{rng.randrange(8)} worker {rng.randrange(16)} batch {step}"
    )


def tqdm_line(step: int, total: int = 20000) -> str:
    """Rank 0's progress bar, one line per step (tqdm writing to a file, not a terminal)."""
    n = step % total
    pct = n * 100 // total
    bar = "\u2588" * (pct // 10) + " " * (10 - pct // 10)
    el = n // 3
    return (
        f"{pct:3d}%|{bar}| {n}/{total} [{el // 3600:02d}:{el // 60 % 60:02d}:{el % 60:02d}<"
        f"{(total - n) // 180:02d}:{(total - n) // 3 % 60:02d},  3.01it/s]"
    )


def dense_text(
    rng: random.Random, density: float, writers: list[Writer], size: int, step: int
) -> str:
    """About `size` bytes of interleaved lines of all writers, `density` of them candidates
    (a candidate event comes whenever the share so far is below it)."""
    lines: list[str] = []
    length = 0
    candidates = 0
    while length < size:
        w = rng.choice(writers)
        step += 1
        if candidates < density * (len(lines) + 1):
            texts = dense_candidate(w, rng, step)
            candidates += 2 if len(texts) > 3 else 1  # an init burst holds two
        elif w.rank == 0 and rng.random() < 0.25:
            texts = [tqdm_line(step)]
        else:
            texts = [dense_noise(w, rng, step)]
        for text in texts:
            line = f"{w.prefix}{text}\n"
            lines.append(line)
            length += len(line)
    return "".join(lines)


def dense_pool(seed: int, density: float, writers: list[Writer]) -> list[bytes]:
    """Blocks reused (in a seeded order, each stamped with its own time) to write gigabytes."""
    rng = random.Random(seed)
    return [
        dense_text(rng, density, writers, POOL_BLOCK_BYTES, k * 10_000).encode()
        for k in range(POOL_BLOCKS)
    ]


def _header(writers: list[Writer]) -> bytes:
    """Each rank's first NCCL lines: its transport and the world communicator's init."""
    rng = random.Random(0)
    out = []
    for w in writers:
        out.append(
            f"{w.prefix}{_nccl(w, 0)}NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB "
            f"ib0:10.3.{w.rank // GPUS_PER_NODE}.{10 + w.dev}<0>\n"
        )
        out.append(f"{w.prefix}{comm_init_line(w, rng, 0, complete=True)}\n")
    return "".join(out).replace("@COMM@@@", "00000000").replace("@TIME@@@", "10:00:00").encode()


def stamped(block: bytes, index: int) -> bytes:
    """A pool block as the index-th block of the file: its own second and communicators."""
    t = 36000 + index
    clock = f"{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}".encode()
    return block.replace(TIME_TOKEN, clock).replace(COMM_TOKEN, f"{index:08x}".encode())


def write_dense(
    path: Path, size: int, seed: int, density: float, writers: list[Writer], errors: int
) -> None:
    """One console of about `size` bytes; `errors` real error lines over its last half."""
    rng = random.Random(seed)
    pool = dense_pool(seed, density, writers)
    real = corpus_error_lines()
    error_at = sorted(rng.randrange(size // 2, max(size // 2 + 1, size)) for _ in range(errors))
    with _writer(path) as fh:
        written = fh.write(_header(writers))
        e = 0
        index = 0
        while written < size:
            block = stamped(pool[rng.randrange(len(pool))], index)
            index += 1
            if len(block) > size - written:
                block = block[: block.rfind(b"\n", 0, size - written) + 1]
                if not block:
                    break
            written += fh.write(block)
            while e < len(error_at) and error_at[e] <= written:
                w = writers[(seed + e) % len(writers)]
                line = real[(seed + e) % len(real)]
                written += fh.write(f"{w.prefix}{line}\n".encode())
                e += 1


def write_dense_ranks(out: Path, files: int, size: int, seed: int, density: float) -> None:
    """One file per rank (as `torchrun --log-dir` or per-rank redirects leave them): torchrun's
    `[rankN]:` prefix, the rank's own NCCL identity, about `size` bytes each."""
    real = corpus_error_lines()
    width = max(4, len(str(files - 1)))
    rng = random.Random(seed)
    for rank in range(files):
        node = rank // GPUS_PER_NODE
        w = Writer(rank, files, f"[rank{rank}]:", f"node{node:04d}", 40000 + rank % 100)
        text = dense_text(rng, density, [w], size, rank * 1000)
        data = _header([w]) + stamped(text.encode(), rank)
        if rank % max(1, files // 300) == 0:
            data += f"{w.prefix}{real[(seed + rank) % len(real)]}\n".encode()
        (out / f"rank{rank:0{width}d}.log").write_bytes(data)


def _writer(path: Path) -> BinaryIO:
    if path.suffix != ".gz":
        return open(path, "wb")
    try:
        from isal import igzip

        return igzip.open(path, "wb", compresslevel=1)  # type: ignore[no-any-return,no-untyped-call]
    except ImportError:
        return gzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]


def generate(
    mode: str, out: Path, gib: float, files: int, seed: int, density: float = 0.0
) -> list[Path]:
    """Write the data set; returns the paths to give to `ddpdoctor diagnose` and `rg`."""
    out.mkdir(parents=True, exist_ok=True)
    total = int(gib * GIB)
    if mode == "dense":
        path = out / "train.log"
        write_dense(path, total, seed, density, slurm_writers(DENSE_WORLD), errors=300)
        return [path]
    if mode == "dense-ranks":
        write_dense_ranks(out, files, max(1, total // files), seed, density)
        return [out]
    if mode in ("single", "gz"):
        name = "train.log.gz" if mode == "gz" else "train.log"
        path = out / name
        write_log(path, total, seed, list(range(8)), 8, errors=300)
        return [path]
    if mode == "ranks":
        per = max(1, total // files)
        width = max(4, len(str(files - 1)))
        base = _pool(seed, [0], files)  # one rank's noise, relabelled per file (fast)
        for rank in range(files):
            name = f"rank{rank:0{width}d}.log"
            errors = 1 if rank % max(1, files // 300) == 0 else 0
            pool = [b.replace(b"[rank0]:", f"[rank{rank}]:".encode()) for b in base[:8]]
            write_log(out / name, per, seed + rank, [rank], files, errors, pool)
        return [out]
    raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("mode", choices=["single", "ranks", "gz", "dense", "dense-ranks"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=float, default=1.0, help="total size in GiB")
    ap.add_argument("--files", type=int, default=1000, help="rank files (mode ranks)")
    ap.add_argument("--density", type=float, default=0.05, help="candidate share (dense modes)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    paths = generate(args.mode, args.out, args.gib, args.files, args.seed, args.density)
    size = sum(
        os.path.getsize(os.path.join(r, f)) for p in paths for r, _, fs in os.walk(p) for f in fs
    ) + sum(os.path.getsize(p) for p in paths if p.is_file())
    print(f"wrote {size / 1e6:.0f} MB to {args.out}")


if __name__ == "__main__":
    main()
