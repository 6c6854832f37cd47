"""Synthetic multi-rank torchrun logs for the scanning benchmark, with a fixed seed: rank
prefixes, glog and NCCL INFO noise, tqdm bars and step lines, plus a few hundred real error
lines copied at generation time from ../shared/corpus/*/logs (error texts are never invented).

Usage: python benchmarks/generate.py single|ranks|gz OUT [--gib N] [--files M] [--seed S]
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import re
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
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
    for log in sorted(CORPUS.glob("*/logs/*")):
        if not log.is_file():
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        for raw in text.splitlines():
            line = raw.rstrip()
            if line and ERROR_LINE.search(line) and len(line) < 4000:
                lines.append(line)
    if not lines:
        raise SystemExit(f"no corpus logs under {CORPUS}: cannot copy real error lines")
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


def _writer(path: Path) -> BinaryIO:
    if path.suffix != ".gz":
        return open(path, "wb")
    try:
        from isal import igzip

        return igzip.open(path, "wb", compresslevel=1)  # type: ignore[no-any-return,no-untyped-call]
    except ImportError:
        return gzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]


def generate(mode: str, out: Path, gib: float, files: int, seed: int) -> list[Path]:
    """Write the data set; returns the paths to give to `ddpdoctor diagnose` and `rg`."""
    out.mkdir(parents=True, exist_ok=True)
    total = int(gib * GIB)
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
    ap.add_argument("mode", choices=["single", "ranks", "gz"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=float, default=1.0, help="total size in GiB")
    ap.add_argument("--files", type=int, default=1000, help="rank files (mode ranks)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    paths = generate(args.mode, args.out, args.gib, args.files, args.seed)
    size = sum(
        os.path.getsize(os.path.join(r, f)) for p in paths for r, _, fs in os.walk(p) for f in fs
    ) + sum(os.path.getsize(p) for p in paths if p.is_file())
    print(f"wrote {size / 1e6:.0f} MB to {args.out}")


if __name__ == "__main__":
    main()
