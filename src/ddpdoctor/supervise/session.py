"""One supervised run, start to finish: run folder, child, capture, watchdog, signal forwarding,
then the end-of-job diagnosis written as report.json/report.txt. Returns values; never prints
(the CLI passes `notify`).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ddpdoctor.errors import SupervisorError
from ddpdoctor.supervise import inject
from ddpdoctor.supervise.capture import BACKLOG_BYTES, Capture
from ddpdoctor.supervise.child import FORWARDED, Child, ProcInfo, shell_code, spawn
from ddpdoctor.supervise.flight import FlightCollector
from ddpdoctor.supervise.progress import ProgressTracker
from ddpdoctor.supervise.report import finish_report
from ddpdoctor.supervise.rundir import RunDir
from ddpdoctor.supervise.watchdog import Watchdog

LABEL_TEMPLATE = "[rank${rank}]:"


@dataclass
class RunOptions:
    argv: list[str]
    run_dir: Path
    hang_after_s: float | None = None
    on_hang: str = "report"
    stacks: str = "auto"
    inject: bool = True
    flight_recorder: bool = True
    """Turn PyTorch's Flight Recorder on in the ranks and collect their dumps on a hang."""
    label_ranks: bool = False
    grace_s: float = 5.0
    startup_grace_s: float = 60.0
    echo: bool = True
    output_buffer_bytes: int = BACKLOG_BYTES
    notify: Callable[[str], None] = lambda _text: None
    redact: bool = True
    """Mask secrets in what ddpdoctor writes (events, stack dumps, reports), not in the logs."""


@dataclass
class RunResult:
    exit_code: int
    run_dir: Path
    report_text: str
    report: dict[str, Any]
    hangs: int = 0
    per_rank: dict[int, int] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)


def is_torchrun(argv: Sequence[str]) -> int | None:
    """Index after which torchrun options may be inserted, or None if this is not torchrun."""
    if argv and Path(argv[0]).name == "torchrun":
        return 1
    for i, a in enumerate(argv[:-1]):
        if a == "-m" and argv[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return i + 2
    return None


def with_rank_labels(argv: list[str]) -> list[str]:
    """Ask torchrun to prefix every line with `[rankN]:` unless the user chose tee/redirects;
    ask srun for its `N: ` task labels (`--label`), which `diagnose` reads as ranks."""
    if argv and Path(argv[0]).name == "srun":
        if any(a in ("-l", "--label") for a in argv[1:]):
            return argv
        return [argv[0], "--label", *argv[1:]]
    at = is_torchrun(argv)
    if at is None or any(
        a.startswith(("--tee", "-t", "--redirects", "-r")) for a in argv[1 : at + 8]
    ):
        return argv
    return [*argv[:at], "--tee", "3", *argv[at:]]


def run_job(opts: RunOptions) -> RunResult | SupervisorError:
    rundir = RunDir(opts.run_dir, redact=opts.redact)
    try:
        rundir.create()
        inject_root = inject.prepare()
    except OSError as exc:
        return SupervisorError(f"cannot create the run folder {opts.run_dir}: {exc}")
    argv = with_rank_labels(opts.argv) if opts.label_ranks else list(opts.argv)
    injected = opts.inject and opts.stacks != "py-spy"
    env = inject.job_env(dict(os.environ), inject_root, rundir.stacks_dir, injected)
    flight: FlightCollector | None = None
    if opts.flight_recorder:
        try:
            flight = FlightCollector.prepare(rundir.root, inject_root)
            env = flight.env(env)
        except OSError:
            flight = None
    if opts.label_ranks and is_torchrun(argv) is not None:
        env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", LABEL_TEMPLATE)
    progress = ProgressTracker(opts.hang_after_s, inject_root / "heartbeats", opts.startup_grace_s)
    run_id = uuid.uuid4().hex
    started = time.monotonic()
    child = spawn(argv, env, run_id, guardian_grace_s=opts.grace_s, cleanup=str(inject_root))
    if isinstance(child, SupervisorError):
        rundir.event("start_failed", argv=argv, error=str(child))
        shutil.rmtree(inject_root, ignore_errors=True)
        return child
    rundir.event(
        "start",
        argv=argv,
        pid=child.pid,
        run_id=run_id,
        hang_after_s=opts.hang_after_s,
        on_hang=opts.on_hang,
        stacks=opts.stacks,
        run_dir=str(rundir.root),
    )
    received: list[int] = []
    previous = _forward_signals(child, received, rundir, opts.grace_s)
    capture = Capture(rundir, progress, echo=opts.echo, backlog_bytes=opts.output_buffer_bytes)
    child.start_exit_watch()
    watchdog = Watchdog(
        child,
        progress,
        rundir,
        opts.on_hang,
        opts.stacks,
        inject_root / "armed",
        opts.grace_s,
        capture.notifier(opts.notify),
        flight=flight if injected else None,
    )
    watchdog.start()
    cpu_start = _cpu_s(resource.RUSAGE_SELF)
    try:
        # the output loop runs here until the job ended and all it wrote is delivered
        capture.run(child.pipes, child.pid, lambda: child.proc.poll() is not None)
    finally:
        _restore_signals(previous)
    code = child.proc.wait()
    cpu = {
        "supervisor_s": round(_cpu_s(resource.RUSAGE_SELF) - cpu_start, 3),
        "job_s": round(_cpu_s(resource.RUSAGE_CHILDREN), 3),
    }
    watchdog.stop()
    time.sleep(0.06)  # one more exit-watch pass for ranks that died with the agent
    per_rank = child.per_rank_exit()
    # processes of the job that outlived it (a daemon it started, a rank's stray child): the
    # guardian ends them when the run closes, and the user is told which they were
    left_running = [p for p in child.remaining() if p.pid != child.pid]
    rundir.event(
        "exit",
        code=code,
        shell_code=shell_code(code),
        signal=signal.Signals(-code).name if code < 0 else None,
        per_rank={str(k): v for k, v in per_rank.items()},
        duration_s=round(time.monotonic() - started, 3),
        output=capture.stats(),
        cpu=cpu,
        signals_received=received,
        left_running=[
            {"pid": p.pid, "role": p.role, "rank": p.rank, "name": p.name} for p in left_running
        ],
    )
    child.close()
    shutil.rmtree(inject_root, ignore_errors=True)
    _drop_empty(rundir.stacks_dir)
    if flight is not None:
        flight.tidy()
    report, text = finish_report(
        rundir,
        code,
        per_rank,
        watchdog.hangs,
        watchdog.killed_for_hang,
        capture.stats(),
        progress.snapshot(),
        [_process_text(p) for p in left_running],
        opts.grace_s,
    )
    return RunResult(
        shell_code(code),
        rundir.root,
        text,
        report,
        len(watchdog.hangs),
        per_rank,
        capture.stats(),
    )


Handler = Callable[[int, FrameType | None], Any] | int | None


def _forward_signals(
    child: Child, received: list[int], rundir: RunDir, grace_s: float
) -> dict[int, Handler]:
    """Forward each signal to every rank; after the first, SIGKILL what is left after grace_s."""
    escalation: list[threading.Thread] = []

    def record(left: list[ProcInfo]) -> None:
        rundir.event(
            "kill_escalated",
            grace_s=grace_s,
            processes=[{"pid": p.pid, "role": p.role, "rank": p.rank} for p in left],
        )

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        rundir.event("signal_forwarded", signal=signal.Signals(signum).name)
        child.forward(signum)
        if not escalation:
            t = threading.Thread(
                target=child.kill_after,
                args=(grace_s, record),
                daemon=True,
                name="ddpdoctor-kill-after",
            )
            escalation.append(t)
            t.start()

    previous: dict[int, Handler] = {}
    for sig in FORWARDED:
        try:
            previous[sig] = signal.signal(sig, handler)
        except (OSError, ValueError):
            continue
    return previous


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _restore_signals(previous: dict[int, Handler]) -> None:
    for sig, old in previous.items():
        try:
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            continue


def _drop_empty(folder: Path) -> None:
    """Ranks arm faulthandler files up front; those never written are noise in the run folder."""
    for path in folder.glob("*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            continue


def _process_text(info: ProcInfo) -> str:
    """A leftover process as the user can find it: its rank where it has one, its pid and name."""
    if info.role == "rank":
        return f"rank {info.rank} (pid {info.pid})"
    if info.role == "worker":
        return info.label
    return f"{info.name or 'process'} (pid {info.pid})"
