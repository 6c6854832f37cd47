"""`ddpdoctor run` and PyTorch's Flight Recorder, on real 2-rank gloo jobs: the recorder is on
in the ranks by default, every rank's dump is collected into the run folder on a hang before the
job is killed, a rank that raises leaves its dump, and the report shows the recorders' view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.flight_dumps import read_dump
from ddpdoctor.model.flight import FlightDump
from tests.test_run_supervise import PROGRAMS, TORCHRUN, ddpdoctor_run, events


def line_of(program: Path, statement: str, occurrence: int = 1) -> str:
    lines = program.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if statement in line]
    return f"{program.name}:{hits[occurrence - 1]}"


def _env_of_child(tmp_path: Path, *opts: str, **env: str) -> str:
    """TORCH_FR_BUFFER_SIZE as a child of `ddpdoctor run` sees it."""
    child_env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    child_env.update(env)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ddpdoctor.cli.run_cmd import run; run()",
            "--run-dir",
            str(tmp_path / "r"),
            "--quiet-report",
            *opts,
            "--",
            sys.executable,
            "-c",
            "import os; print('FR=' + str(os.environ.get('TORCH_FR_BUFFER_SIZE')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return next(x for x in proc.stdout.splitlines() if x.startswith("FR="))


def test_recorder_on_by_default_and_opt_out(tmp_path: Path) -> None:
    assert _env_of_child(tmp_path / "a") == "FR=2000"
    assert _env_of_child(tmp_path / "b", "--no-flight-recorder") == "FR=None"
    assert _env_of_child(tmp_path / "c", TORCH_FR_BUFFER_SIZE="50") == "FR=50"  # user's wins
    assert not (tmp_path / "a" / "r" / "flight-recorder").exists()  # no dump: no empty folder


@pytest.mark.real
def test_hang_leaves_every_rank_dump_in_the_run_folder(tmp_path: Path) -> None:
    """Rank 1 sleeps while rank 0 waits in the barrier (tests/programs/run_train.py hang): the
    hang is detected, the dumps are asked for before --on-hang kill ends the job, and the
    report names the barrier rank 1 never entered and the line each rank last issued."""
    run_dir = tmp_path / "r"
    out = ddpdoctor_run(
        run_dir, "--hang-after", "5", "--on-hang", "kill", cmd=_torchrun("run_train.py", "hang")
    )
    assert out.returncode != 0
    evs = events(run_dir)
    kinds = [e["event"] for e in evs]
    assert kinds.index("flight_recorder") < kinds.index("kill")
    collected = next(e for e in evs if e["event"] == "flight_recorder")
    assert collected["dumped"] == [0, 1] and collected["silent"] == [], collected
    for rank in (0, 1):
        dump = read_dump(str(run_dir / "flight-recorder" / f"rank{rank}.pkl"))
        assert isinstance(dump, FlightDump) and dump.has_frames
    program = PROGRAMS / "run_train.py"
    barrier = line_of(program, "dist.barrier()")
    step = line_of(program, "dist.all_reduce(t)")
    report = json.loads((run_dir / "report.json").read_text())
    flight = report["job"]["flight_recorder"]
    first = flight["divergences"][0]
    assert (first["kind"], first["seq"], first["ranks"]) == ("behind", 6, [1])
    sites = {c["rank"]: (c["op"], c["seq"], c["site"]) for c in first["calls"]}
    assert sites == {0: ("barrier", 6, barrier), 1: ("all_reduce", 5, step)}
    text = (run_dir / "report.txt").read_text()
    assert f"rank 0 called barrier #6 at {barrier}" in text
    # the folder read again later gives the same view
    again = diagnose_paths([str(run_dir)]).job.flight
    assert again is not None and again.divergences[0].summary == first["summary"]


@pytest.mark.real
def test_rank_that_raises_asks_every_rank_for_its_dump(tmp_path: Path) -> None:
    """No hang detected: rank 1 raises before step 2's all_reduce while rank 0 is busy outside
    any collective (tests/programs/flight_cases.py busy, run without its own dumping). Rank 0
    raises nothing and torchrun SIGTERMs it; rank 1's exception hook dumps rank 1 and asks the
    others first, so rank 0's dump is in the run folder too."""
    run_dir = tmp_path / "r"
    out = ddpdoctor_run(run_dir, "--quiet-report", cmd=_torchrun("flight_cases.py", "busy"))
    assert out.returncode == 1, out.stderr
    assert "flight_recorder" not in [e["event"] for e in events(run_dir)]  # no hang, no request
    console = (run_dir / "console.log").read_text()
    assert "rank 0 evaluating" in console and "[rank0]: Traceback" not in console
    names = {p.name for p in (run_dir / "flight-recorder").iterdir()}
    assert {"rank0.json", "rank1.json", "rank1.pkl"} <= names, names
    flight = json.loads((run_dir / "report.json").read_text())["job"]["flight_recorder"]
    assert flight["ranks_with_dump"] == [0, 1]
    # the recorders agree: both issued all_reduce #2 and neither #3 (rank 0 was busy, rank 1
    # raised), so nobody waited in a collective; the logs tell the rest
    views = {v["rank"]: v["last_issued"] for v in flight["per_rank"]}
    assert views == {0: 2, 1: 2} and flight["divergences"] == [], flight


def _torchrun(program: str, *args: str) -> list[str]:
    return [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(PROGRAMS / program), *args]
