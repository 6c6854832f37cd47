"""Every regex the scan runs takes time linear in the line length. Each signature of each rule
(iterated from the registry), each context pattern, job fact and module-level regex of ingestion
is run on adversarial lines of 1 MB (256 KB in `make test`) built from its own parse tree
(tests/adversary.py), in a child process that is stopped if one line stalls; each line must
finish within a bound that a linear regex meets with room to spare and a quadratic one misses by
orders of magnitude (three signatures took 39-50 s on a 64 KB line and over 300 s on a 1 MB one
before they were bounded)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

FULL = os.environ.get("DDPDOCTOR_FUZZ") == "full"
LINE_BYTES = 1 << 20 if FULL else 1 << 17
"""1 MB lines in `make fuzz` (which CI runs too); 128 KB in `make test` (an eighth of the time:
a quadratic regex still takes eight times longer than it may, as the three of 2026-11 took 39-50
s at 64 KB)."""
LINE_CPU_BOUND_S = 2.0 if FULL else 0.5
"""CPU seconds a line may take: 2 s for 1 MB, 0.5 s for 128 KB. The slowest regex measured 0.20 s
on 1 MB (a 120-character window after each of 100,000 "NCCL WARN"s) and 0.08 s on 128 KB alone,
but 0.14 s beside another CPU-bound process (the machine's two cores share their caches); a
quadratic one needs minutes on 1 MB and 39-50 s on 64 KB, two orders of magnitude above either
bound."""
STALL_S = 60.0
"""Wall time without any line finishing after which the probe is stopped (a loaded machine
runs the child at a fraction of a core)."""
VARIANTS = 3 if FULL else 1


def _probe(size: int, variants: int) -> tuple[list[dict[str, object]], dict[str, object] | None]:
    """Run tests/linear_probe.py; (finished lines, the line it stalled on or None)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.linear_probe", str(size), str(variants)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    done: list[dict[str, object]] = []
    current: dict[str, object] | None = None
    try:
        while True:
            ready, _, _ = select.select([child.stdout], [], [], STALL_S)
            if not ready:
                return done, current
            line = child.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            if "start" in event:
                current = event["start"]
            elif "done" in event:
                done.append(event)
                current = None
            elif event.get("end"):
                break
    finally:
        child.kill()
        child.wait()
    assert child.returncode in (0, -9), child.returncode
    return done, None


def test_every_regex_runs_in_linear_time_on_adversarial_megabyte_lines() -> None:
    done, stalled = _probe(LINE_BYTES, VARIANTS)
    assert stalled is None, f"a regex stalled for {STALL_S:g} s: {stalled}"
    patterns = {str(d["done"]) for d in done}
    assert len(patterns) > 200 and len(done) > 1000  # the inventory was really walked
    slow = sorted(done, key=lambda d: -float(str(d["cpu_s"])))
    print("slowest lines:", [(d["done"], round(float(str(d["cpu_s"])), 3)) for d in slow[:5]])
    over = [d for d in slow if float(str(d["cpu_s"])) > LINE_CPU_BOUND_S]
    assert not over, over[:10]


def test_known_pathological_lines_diagnose_quickly(tmp_path: Path) -> None:
    """The three lines of the issue (LINE_BYTES each), through the whole scan (prefilter, prefix
    parsing, confirmation on the capped text and on the raw line, traceback walk)."""
    size = LINE_BYTES
    watchdog = (
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    )
    lines = [
        (watchdog + "A" * size)[:size],
        ("error: unrecognized arguments: " * (size // 31 + 1))[:size],
        ("libcudaa" * (size // 8))[: size - 40] + ": cannot open shared object file",
        (watchdog + "Timeout(ms)=" + "1" * size)[:size],
    ]
    log = tmp_path / "rank0.log"
    log.write_text("\n".join(lines) + "\n")
    t0 = time.process_time()
    report = diagnose_paths([str(log)])
    spent = time.process_time() - t0
    assert report.sources[0].status == "read"
    assert spent < 10.0, spent
