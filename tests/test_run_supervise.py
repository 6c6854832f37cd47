"""`ddpdoctor run` end to end on real processes: exit codes, signals, orphans, hangs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import HungRun

HERE = Path(__file__).parent
PROGRAMS = HERE / "programs"
TORCHRUN = Path(sys.executable).parent / "torchrun"
RUN = [sys.executable, "-c", "from ddpdoctor.cli.run_cmd import run; run()"]


def ddpdoctor_run(
    run_dir: Path, *opts: str, cmd: list[str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUN, "--run-dir", str(run_dir), *opts, "--", *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def torchrun(nproc: int, *args: str) -> list[str]:
    return [
        str(TORCHRUN),
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(PROGRAMS / "run_train.py"),
        *args,
    ]


def plain(*args: str) -> list[str]:
    return [sys.executable, str(PROGRAMS / "run_plain.py"), *args]


@pytest.mark.parametrize("code", [0, 1, 2, 137])
def test_exit_code_mirrored(tmp_path: Path, code: int) -> None:
    out = ddpdoctor_run(tmp_path / "r", "--quiet-report", cmd=plain("exit", str(code)))
    assert out.returncode == code
    assert "hello stdout" in out.stdout and "hello stderr" in out.stderr
    assert "hello stdout" in (tmp_path / "r" / "console.log").read_text()
    kinds = [e["event"] for e in events(tmp_path / "r")]
    assert kinds[0] == "start" and kinds[-1] == "exit"
    assert (tmp_path / "r" / "report.json").exists() and (tmp_path / "r" / "report.txt").exists()


def test_death_by_sigterm_mirrored(tmp_path: Path) -> None:
    out = ddpdoctor_run(tmp_path / "r", "--quiet-report", cmd=plain("sigterm"))
    assert out.returncode == 128 + signal.SIGTERM
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["job"]["exit"]["signal"] == "SIGTERM"


def test_deadlock_found_through_faulthandler(tmp_path: Path) -> None:
    t0 = time.time()
    out = ddpdoctor_run(
        tmp_path / "r",
        "--hang-after",
        "2",
        "--startup-grace",
        "0",
        "--on-hang",
        "kill",
        "--stacks",
        "faulthandler",
        "--grace",
        "1",
        cmd=plain("lock"),
        timeout=30,
    )
    assert time.time() - t0 < 20
    assert out.returncode == 128 + signal.SIGTERM
    hang = next(e for e in events(tmp_path / "r") if e["event"] == "stacks")
    diag = hang["diagnosis"]
    assert isinstance(diag, dict) and diag["kind"] == "deadlock", diag
    assert diag["methods"] == ["faulthandler"]
    dumps = list((tmp_path / "r" / "stacks").glob("pid*.txt"))
    assert dumps and "run_plain.py" in dumps[0].read_text()


def test_heartbeats_count_as_progress(tmp_path: Path) -> None:
    # No output after the first lines; only heartbeats every 0.6 s keep the job alive.
    out = ddpdoctor_run(
        tmp_path / "r",
        "--hang-after",
        "2",
        "--startup-grace",
        "0",
        "--quiet-report",
        cmd=plain("beat", "6"),
        timeout=30,
    )
    assert out.returncode == 0
    assert not [e for e in events(tmp_path / "r") if e["event"] == "hang_detected"]


@pytest.mark.real
def test_barrier_hang_names_the_culprit(hung_run: HungRun) -> None:
    run_dir = hung_run.run_dir
    out = hung_run.proc
    assert out.returncode != 0
    evs = events(run_dir)
    detected = next(e for e in evs if e["event"] == "hang_detected")
    stacks = next(e for e in evs if e["event"] == "stacks")
    console = (run_dir / "console.log").read_text()
    hang_start = max(float(t) for t in re.findall(r"HANG_START (\d+\.\d{3})", console))
    from datetime import datetime

    latency = datetime.fromisoformat(str(detected["time"])).timestamp() - hang_start
    assert latency < 5 + 10, latency
    diag = stacks["diagnosis"]
    assert isinstance(diag, dict)
    assert diag["culprit_ranks"] == [1], diag
    assert diag["kind"] == "missing-from-collective"
    assert "ranks 0,2 wait in barrier at run_train.py" in str(diag["summary"])
    assert "rank 1 is sleeping at run_train.py" in str(diag["summary"])
    for r in range(3):
        assert "run_train.py" in (run_dir / "stacks" / f"rank{r}.txt").read_text()
        assert (run_dir / "ranks" / f"rank{r}.log").read_text().count("step") == 5
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"]["status"] == "hung"
    assert report["verdict"]["culprit"]["ranks"] == [1]
    # Ranks SIGTERMed by torchrun's shutdown are reaped at once: their codes may be unobserved.
    assert {e["code"] for e in report["job"]["exit"]["per_rank"].values()} <= {-15}


@pytest.mark.real
def test_pause_shorter_than_hang_after_is_not_a_hang(tmp_path: Path) -> None:
    out = ddpdoctor_run(
        tmp_path / "r", "--hang-after", "5", "--quiet-report", cmd=torchrun(2, "pause", "2.5")
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert not [e for e in events(tmp_path / "r") if e["event"] == "hang_detected"]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    exits = report["job"]["exit"]["per_rank"].values()
    assert {e["code"] for e in exits} <= {0}  # observed ones are exact


@pytest.mark.real
def test_rank_exit_code_known_exactly(tmp_path: Path) -> None:
    out = ddpdoctor_run(tmp_path / "r", "--quiet-report", cmd=torchrun(2, "exit", "2"))
    assert out.returncode == 1  # torchrun's own code for any failure
    per_rank = json.loads((tmp_path / "r" / "report.json").read_text())["job"]["exit"]["per_rank"]
    assert per_rank["1"]["code"] == 2 and per_rank["1"]["signal"] is None
    summary = next(
        line
        for line in (tmp_path / "r" / "report.txt").read_text().splitlines()
        if line.startswith("ddpdoctor run:")
    )
    assert re.fullmatch(
        r"ddpdoctor run: exit code 1, per rank (\d+: -?\d+( \(SIG\w+\))?(, )?)+", summary
    )
    assert "1: 2" in summary


def _start_waiting_job(run_dir: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--quiet-report", "--", *torchrun(2, "wait")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    pids: list[int] = []
    while time.monotonic() < deadline:
        console = run_dir / "console.log"
        text = console.read_text() if console.exists() else ""
        # two ranks printing at once can interleave inside one line: match, do not split
        pids = [int(pid) for pid in re.findall(r"WAITING rank \d+ pid (\d+)", text)]
        if len(pids) == 2:
            return proc, pids
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("ranks did not start")


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.real
def test_signal_reaches_every_rank(tmp_path: Path) -> None:
    proc, pids = _start_waiting_job(tmp_path / "r")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert _gone(pids, 10)
    evs = events(tmp_path / "r")
    assert any(e["event"] == "signal_forwarded" for e in evs)
    assert proc.returncode != 0


@pytest.mark.real
def test_sigkill_of_ddpdoctor_leaves_no_rank(tmp_path: Path) -> None:
    proc, pids = _start_waiting_job(tmp_path / "r")
    agent = [c.pid for c in psutil.Process(proc.pid).children()]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert _gone(pids + agent, 15), [p for p in pids + agent if psutil.pid_exists(p)]


@pytest.mark.parametrize(("grace", "flagged"), [("2", True), ("30", False)])
def test_startup_grace_option_is_honoured(tmp_path: Path, grace: str, flagged: bool) -> None:
    """A job silent for 6 s from its start: a hang after a 2 s start-up grace, none within 30 s."""
    out = ddpdoctor_run(
        tmp_path / "r",
        "--hang-after",
        "1",
        "--startup-grace",
        grace,
        "--stacks",
        "none",
        "--quiet-report",
        cmd=[sys.executable, "-c", "import time; time.sleep(6)"],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    hangs = [e for e in events(tmp_path / "r") if e["event"] == "hang_detected"]
    assert bool(hangs) is flagged


def _stray_child(holds_output: bool) -> list[str]:
    """A job whose main process starts a child that outlives it (sleeping 60 s) and exits 0."""
    redirect = "" if holds_output else ", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    program = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60); print(\"late line\")']" + redirect + ")\n"
        "print('stray pid', p.pid, flush=True)\n"
    )
    return [sys.executable, "-c", program]


@pytest.mark.parametrize("holds_output", [True, False])
def test_process_left_running_is_named_and_ended(tmp_path: Path, holds_output: bool) -> None:
    """A process the job started that outlives it is ended with the run, and the report says
    which it was, and (where it still held the job's output) that its later output is lost."""
    out = ddpdoctor_run(tmp_path / "r", cmd=_stray_child(holds_output), timeout=60)
    assert out.returncode == 0
    stray = int(re.search(r"stray pid (\d+)", out.stdout)[1])  # type: ignore[index]
    assert _gone([stray], 15)
    exit_event = events(tmp_path / "r")[-1]
    assert [p["pid"] for p in exit_event["left_running"]] == [stray]  # type: ignore[index]
    said = re.search(
        r"ddpdoctor run: 1 process of the job still ran after it ended \((.*)", out.stderr
    )
    assert said is not None and f"(pid {stray})" in said[1]
    assert ("not captured" in said[1]) is holds_output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [x.endswith(f"(pid {stray})") for x in report["supervisor"]["left_running"]] == [True]


def test_nothing_left_running_says_nothing(tmp_path: Path) -> None:
    out = ddpdoctor_run(tmp_path / "r", cmd=plain("exit", "0"))
    assert "still ran after it ended" not in out.stderr
    assert events(tmp_path / "r")[-1]["left_running"] == []
