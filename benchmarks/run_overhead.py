"""Overhead of `ddpdoctor run`: a job printing ~100k lines/s, bare vs supervised (a benchmark,
not a test). Usage: python benchmarks/run_overhead.py [LINES]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = [sys.executable, str(ROOT / "tests" / "programs" / "run_plain.py"), "lines"]
RUN = [sys.executable, "-c", "from ddpdoctor.cli.run_cmd import run; run()"]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    lines = sys.argv[1] if len(sys.argv) > 1 else "1000000"
    with tempfile.TemporaryDirectory() as tmp:
        for unbuffered in (False, True):
            env_prefix = ["env", "PYTHONUNBUFFERED=1"] if unbuffered else []
            bare = min(timed([*env_prefix, *JOB, lines]) for _ in range(3))
            sup = min(
                timed(
                    [
                        *env_prefix,
                        *RUN,
                        "--run-dir",
                        f"{tmp}/r{i}{unbuffered}",
                        "--quiet-report",
                        "--",
                        *JOB,
                        lines,
                    ]
                )
                for i in range(3)
            )
            rate = int(lines) / bare
            mode = "unbuffered" if unbuffered else "block-buffered"
            print(
                f"{mode}: {lines} lines, bare {bare:.2f} s ({rate:,.0f} lines/s), "
                f"supervised {sup:.2f} s, slowdown {100 * (sup / bare - 1):+.1f}%"
            )


if __name__ == "__main__":
    main()
