"""What `ddpdoctor run` costs a job that writes a lot of output (a benchmark, not a test).

For each case the same job runs bare and under `ddpdoctor run`, alternately (pairs, so that a
busy neighbour on this shared machine hits both), with stdout and stderr going to the same
place either way: `pipe` (a `cat` into /dev/null, as a terminal, `| tee` or a container
runtime reads) or `file` (a regular file, as a batch system's redirect). Printed per case and
sink (median over the pairs, and the range of the per-pair values as the noise):

- job s: the time the job's writers spent writing (each writer measures itself; for torchrun
  the slowest rank), bare and supervised, and their ratio (target: at most 1.1);
- cmd s: the whole command, bare job vs `ddpdoctor run` including its start-up and the final
  diagnosis of the run folder;
- CPU: the job's own CPU (user+sys: wait4 when bare, ddpdoctor's RUSAGE_CHILDREN when
  supervised), and ddpdoctor's CPU while the job ran (its exit event: capture loop, log writer,
  watchdog, exit watch) as a share of the job's (target: at most 10%); `all` is ddpdoctor's
  whole process (start-up and the diagnosis of a 200 MB run folder included).

Before the table, the floor: the CPU of copying MB megabytes into a new file in 1 MiB writes
(what console.log costs at the least, whatever the rest does), best of 3.

Usage: python benchmarks/run_overhead.py [--mb 200] [--pairs 3] [--cases fast,small,...]
       [--sinks pipe,file]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "tests" / "programs" / "output_writer.py"
PY = sys.executable
TORCHRUN = str(Path(PY).parent / "torchrun")
RUN = [PY, "-m", "ddpdoctor", "run"]
LINE_BYTES = 47  # a `small_lines` line
RANK_LINE_BYTES = 41  # a `rank_lines` line (8-digit counter)


@dataclass
class Case:
    name: str
    argv: list[str]
    what: str


def cases(mb: int) -> list[Case]:
    total = mb * 1_000_000
    small = total // LINE_BYTES
    out = [
        Case("fast", [PY, str(WRITER), "fast", str(total)], f"{mb} MB in 1 MiB os.write calls"),
        Case(
            "small",
            [PY, str(WRITER), "small", str(small)],
            f"{mb} MB as {small:,} lines, one flushed write each",
        ),
        Case(
            "lines",
            [PY, str(WRITER), "lines", str(small)],
            f"{mb} MB as {small:,} print()ed lines, block-buffered",
        ),
    ]
    for n in (2, 4):
        per_rank = total // n // RANK_LINE_BYTES
        launch = [TORCHRUN, "--standalone", f"--nproc-per-node={n}"]
        out.append(
            Case(
                f"torchrun{n}",
                [*launch, str(WRITER), "rank", str(per_rank)],
                f"{mb} MB from {n} ranks, print() per line",
            )
        )
    per_rank = total // 2 // RANK_LINE_BYTES
    out.append(
        Case(
            "torchrun2-tee",
            [
                TORCHRUN,
                "--standalone",
                "--nproc-per-node=2",
                "--tee",
                "3",
                str(WRITER),
                "rank",
                str(per_rank),
            ],
            f"{mb} MB from 2 ranks through torchrun --tee 3 ([rankN]: prefixes, split per rank)",
        )
    )
    return out


@dataclass
class Sample:
    job_s: float
    cmd_s: float
    job_cpu_s: float
    sup_cpu_s: float | None = None
    sup_all_cpu_s: float | None = None


def _cpu(ru: object) -> float:
    return float(ru.ru_utime + ru.ru_stime)  # type: ignore[attr-defined]


def run_once(
    argv: list[str], tmp: Path, supervised: bool, env: dict[str, str], sink_kind: str
) -> Sample:
    times = tmp / "times.txt"
    times.unlink(missing_ok=True)
    run_dir = tmp / "run"
    env = {**env, "OUTPUT_WRITER_TIMES": str(times)}
    if "--tee" in argv:
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:"
    cmd = [*RUN, "--run-dir", str(run_dir), "--quiet-report", "--", *argv] if supervised else argv
    sink: subprocess.Popen[bytes] | None = None
    if sink_kind == "pipe":
        sink = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert sink.stdin is not None
        out_fd = sink.stdin.fileno()
    else:
        out_fd = os.open(tmp / "out.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out_fd, stderr=out_fd, env=env)
    if sink is not None and sink.stdin is not None:
        sink.stdin.close()
    else:
        os.close(out_fd)
    _pid, status, usage = os.wait4(proc.pid, 0)
    cmd_s = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if sink is not None:
        sink.wait()
    (tmp / "out.log").unlink(missing_ok=True)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... exited {code}")
    job_s = max(float(line.split()[1]) for line in times.read_text().splitlines())
    if not supervised:
        return Sample(job_s, cmd_s, _cpu(usage))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    exit_ = next(e for e in events if e["event"] == "exit")
    job_cpu = float(exit_["cpu"]["job_s"])
    sample = Sample(job_s, cmd_s, job_cpu, float(exit_["cpu"]["supervisor_s"]))
    sample.sup_all_cpu_s = _cpu(usage) - job_cpu
    out = exit_["output"]
    if out["logs"]["errors"] or any(t["error"] for t in out["terminal"].values()):
        raise SystemExit(f"output trouble: {out}")
    shutil.rmtree(run_dir)
    return sample


def file_floor_s(tmp: Path, mb: int) -> float:
    """CPU seconds of writing `mb` MB into a new file (best of 3): the least console.log costs."""
    block = os.urandom(1 << 20)
    best = float("inf")
    for _ in range(3):
        path = tmp / "floor.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        left = mb * 1_000_000
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        os.close(fd)
        path.unlink()
        best = min(best, _cpu(ru1) - _cpu(ru0))
    return best


def _range(values: list[float], fmt: str) -> str:
    return f"({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cases", default="fast,small,lines,torchrun2,torchrun4,torchrun2-tee")
    ap.add_argument("--sinks", default="pipe,file")
    args = ap.parse_args()
    wanted = args.cases.split(",")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-bench-") as tmp_name:
        tmp = Path(tmp_name)
        floor = file_floor_s(tmp, args.mb)
        print(f"floor: {args.mb} MB into a new file costs {floor:.3f} s CPU here")
        print(
            f"{'case':<14} {'sink':<4} {'job s bare':>10} {'sup':>6} {'ratio':>5} {'(range)':>11}  "
            f"{'cmd s bare/sup':>14}  {'job CPU':>7} {'ddpd CPU':>8} {'share':>6} {'(range)':>13} "
            f"{'all':>6}"
        )
        for case in cases(args.mb):
            if case.name not in wanted:
                continue
            for sink in args.sinks.split(","):
                bare: list[Sample] = []
                sup: list[Sample] = []
                for _ in range(args.pairs):
                    bare.append(run_once(case.argv, tmp, False, env, sink))
                    sup.append(run_once(case.argv, tmp, True, env, sink))
                ratios = [s.job_s / b.job_s for b, s in zip(bare, sup, strict=True)]
                shares = [100 * float(s.sup_cpu_s or 0) / s.job_cpu_s for s in sup]
                print(
                    f"{case.name:<14} {sink:<4} {med(b.job_s for b in bare):>10.2f} "
                    f"{med(s.job_s for s in sup):>6.2f} {med(ratios):>5.2f} "
                    f"{_range(ratios, '{:.2f}'):>11}  "
                    f"{med(b.cmd_s for b in bare):>6.2f}/{med(s.cmd_s for s in sup):<7.2f}  "
                    f"{med(s.job_cpu_s for s in sup):>7.2f} "
                    f"{med(float(s.sup_cpu_s or 0) for s in sup):>8.3f} "
                    f"{med(shares):>5.1f}% {_range(shares, '{:.1f}%'):>13} "
                    f"{med(float(s.sup_all_cpu_s or 0) for s in sup):>5.2f}s"
                )
                bare_cpu = med(b.job_cpu_s for b in bare)
                print(
                    f"  {case.what}; bare job CPU {bare_cpu:.2f} s; the file floor is "
                    f"{100 * floor / bare_cpu:.0f}% of it"
                )
                sys.stdout.flush()


if __name__ == "__main__":
    main()
