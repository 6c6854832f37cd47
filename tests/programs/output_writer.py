"""A job that writes output in known, checkable patterns, for `ddpdoctor run` output tests and
benchmarks/run_overhead.py. Torch-free. MODE (argv[1]):

fast BYTES         os.write of 1 MiB blocks to stdout as fast as it can (`fast_blocks`)
small LINES        one line per write, flushed (`small_lines`)
lines LINES        print() per line, block-buffered as Python is on a pipe (`small_lines`)
paced BYTES RATE   `fast_blocks` content in 64 KiB writes at RATE bytes/s
interleave LINES   two subprocesses write `[rank0]:` / `[rank1]:` lines to the same stdout
rank LINES         under torchrun: print() per line, prefixed by the rank (`rank_lines`)
fill-then-lock BYTES  `fast_blocks` content, then progress lines, then a deadlock
ignore-term        ignore SIGTERM, say so, sleep (torchrun ranks do it on rank 1 only)

With OUTPUT_WRITER_TIMES set, appends "<rank> <seconds spent writing>" to that file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

BLOCK = 1 << 20
_POOL: list[bytes] = []


def _pool() -> list[bytes]:
    """16 distinct 1 MiB bodies of log-like lines, one line in 64 a progress line."""
    if not _POOL:
        for p in range(16):
            lines = []
            i = 0
            size = 0
            while size < BLOCK - 200:
                if i % 64 == 0:
                    line = b"step %d loss %.4f lr 0.001 pool %d\n" % (i, 1.0 / (i + 1), p)
                else:
                    line = b"2026-12-01 10:00:00,%03d INFO trainer.py:%d pool %d line %d data\n" % (
                        i % 1000,
                        i % 500,
                        p,
                        i,
                    )
                lines.append(line)
                size += len(line)
                i += 1
            _POOL.append(b"".join(lines))
    return _POOL


def fast_blocks(total: int) -> Iterator[bytes]:
    """`total` bytes in blocks: a unique header line (the block number) plus a pool body."""
    pool = _pool()
    k, sent = 0, 0
    while sent < total:
        block = b"block %010d\n" % k + pool[k % len(pool)]
        block = block[: total - sent]
        yield block
        sent += len(block)
        k += 1


def small_lines(n: int) -> Iterator[bytes]:
    for i in range(n):
        yield b"%09d small write, flushed, step %d of the job\n" % (i, i)


def rank_lines(rank: int, n: int) -> Iterator[bytes]:
    for i in range(n):
        yield b"rank %d line %08d of the job, loss %d\n" % (rank, i, i % 97)


def _timed(write: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    write()
    elapsed = time.perf_counter() - t0
    path = os.environ.get("OUTPUT_WRITER_TIMES")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{os.environ.get('RANK', '0')} {elapsed:.6f}\n")


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main() -> None:
    mode = sys.argv[1]
    arg = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if mode == "fast":
        _timed(lambda: [_write_all(b) for b in fast_blocks(arg)])
    elif mode == "small":

        def small() -> None:
            out = sys.stdout.buffer
            for line in small_lines(arg):
                out.write(line)
                out.flush()

        _timed(small)
    elif mode == "lines":

        def buffered() -> None:
            out = sys.stdout.buffer
            for line in small_lines(arg):
                out.write(line)
            out.flush()

        _timed(buffered)
    elif mode == "paced":
        rate = float(sys.argv[3])
        t0 = time.monotonic()
        sent = 0
        for block in fast_blocks(arg):
            for i in range(0, len(block), 1 << 16):
                piece = block[i : i + (1 << 16)]
                _write_all(piece)
                sent += len(piece)
                delay = t0 + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
    elif mode == "interleave":
        procs = [
            subprocess.Popen([sys.executable, __file__, "interleave-one", str(r), str(arg)])
            for r in (0, 1)
        ]
        sys.exit(max(p.wait() for p in procs))
    elif mode == "interleave-one":
        rank, n = arg, int(sys.argv[3])
        prefix = b"[rank%d]:" % rank
        batch: list[bytes] = []
        size = 0
        for line in rank_lines(rank, n):
            batch.append(prefix + line)
            size += len(prefix) + len(line)
            if size > 3000:  # whole lines, one write under PIPE_BUF: atomic on the pipe
                _write_all(b"".join(batch))
                batch, size = [], 0
        _write_all(b"".join(batch))
    elif mode == "rank":
        rank = int(os.environ.get("RANK", "0"))

        def ranked() -> None:
            for line in rank_lines(rank, arg):
                sys.stdout.write(line.decode())
            sys.stdout.flush()

        _timed(ranked)
    elif mode == "fill-then-lock":
        for block in fast_blocks(arg):
            _write_all(block)
        for step in range(3):
            print(f"step {step} loss 1.0", flush=True)
            time.sleep(0.2)
        print(f"HANG_START {time.time():.3f}", flush=True)
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif mode == "ignore-term":
        rank = int(os.environ.get("RANK", "0"))
        if rank == arg:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"IGNORING rank {rank} pid {os.getpid()} ignores={rank == arg}", flush=True)
        time.sleep(3600)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
