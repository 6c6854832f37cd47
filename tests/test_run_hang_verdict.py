"""A hang caught by `ddpdoctor run` stays the root whoever stops the job afterwards: its own
kill (--on-hang kill), Ctrl-C (SIGINT) or a SIGTERM. Real torchrun/gloo jobs where rank 1
sleeps while rank 0 waits in a barrier (tests/programs/run_train.py hang); the verdict names
rank 1 with the line where it sleeps and a fix for what it was doing, never "raise the timeout"
nor the stop as a failure of its own."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import HungRun, run_cli
from tests.program_runs import REAL
from tests.test_run_supervise import RUN, events, torchrun

pytestmark = pytest.mark.real


def _hang_verdict(run_dir: Path) -> dict[str, object]:
    proc = run_cli("diagnose", str(run_dir), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    verdict = report["verdict"]
    assert verdict["status"] == "hung", verdict
    assert verdict["kind"] == "hang" and verdict["rule"] == "INF211", verdict
    assert verdict["culprit"]["ranks"] == [1]
    fix = " ".join(verdict["fix"])
    assert "run_train.py:35" in fix and "sleep" in fix
    assert "timeout" not in fix.lower()
    roots = [f for f in report["findings"] if f["role"] == "root"]
    assert [f["rule"] for f in roots] == ["INF211"], roots
    stops = [f for f in report["findings"] if f["kind"] in ("preempted", "python-exception")]
    assert all(f["role"] == "cascade" for f in stops), stops
    return verdict


def _run_until_stacks(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--hang-after", "4", "--", *torchrun(2, "hang")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if (run_dir / "events.jsonl").exists() and any(
            e["event"] == "stacks" for e in events(run_dir)
        ):
            return proc
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("no hang detected within 90 s")


def test_hang_then_own_kill(hung_run: HungRun) -> None:
    assert hung_run.proc.returncode != 0
    _hang_verdict(hung_run.run_dir)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_hang_then_stopped_by_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "r"
    proc = _run_until_stacks(run_dir)
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    _hang_verdict(run_dir)


def test_ctrl_c_of_a_job_run_never_saw_stall_is_not_a_hang(tmp_path: Path) -> None:
    """Ctrl-C to `ddpdoctor run` while every rank is busy (sleeping, well inside the hang
    threshold): a stop, said as one; not a worker failure (the ranks exit non-zero because of
    the stop), nor the "stopped by hand, most likely stuck" guess that a bare log of a Ctrl-C
    gets, since run watched the job and saw no stall."""
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--hang-after", "600", "--", *torchrun(2, "wait")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    console = run_dir / "console.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if console.exists() and console.read_text(errors="replace").count("WAITING rank") >= 2:
            break
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads(run_cli("diagnose", str(run_dir), "--format", "json").stdout)
    verdict = report["verdict"]
    assert (verdict["status"], verdict["kind"]) == ("unknown", None), verdict
    assert "stopped by a signal `ddpdoctor run` passed on" in verdict["summary"]


def test_a_trace_the_stop_cut_short_is_the_stops() -> None:
    """The same Ctrl-C, captured in the run where it lands badly (1 run in 8 here): torchrun
    passes the SIGINT on to ranks that already got it, and the second one kills rank 1 while it
    prints the first one's traceback. A trace cut by the stop's own signal (rank 1 exits -2) is
    the stop's, not an exception of unknown cause on rank 1."""
    report = json.loads(
        run_cli("diagnose", str(REAL / "run-stop-cuts-trace"), "--format", "json").stdout
    )
    verdict = report["verdict"]
    assert (verdict["status"], verdict["kind"]) == ("unknown", None), verdict
    assert "stopped by a signal `ddpdoctor run` passed on" in verdict["summary"]
    assert not [f for f in report["findings"] if f["rule"] == "INF215"]
