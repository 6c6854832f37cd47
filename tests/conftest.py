"""Shared test fixtures: where the real corpus and captured logs live, and a CLI runner."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"

# DeepSpeed's CPU backend JIT-compiles its shm op into torch's extension cache. Shared by every
# environment of the user (~/.cache), it is rebuilt whenever another venv's paths differ, and a
# build killed midway leaves a lock that makes every later rank wait forever: each venv keeps
# its own (`make setup-launchers` warms this one).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))


SESSION_START = time.time()
DEEPSPEED_SHM = "deepspeed_allreduce_buffer_*"
"""DeepSpeed's CPU all-reduce buffers (/dev/shm, 69 MB each): a rank the tests kill on purpose
(a hang, a SIGKILL) never unlinks its own, and they pile up in memory run after run (22 GB
were found on this machine)."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collecting ~9,800 tests left alive (their parameters, the fixtures' texts
    read at import) out of the cyclic collector's way: each of its full collections walked all
    of it again, and the diagnoses of the later tests ran four times slower in the whole suite
    than alone (1.2 s against 0.3 s per redaction case). The tests' own objects are collected as
    before."""
    gc.collect()
    gc.freeze()


JOB_MARKERS = ("real", "slurm", "launchers", "frameworks")
"""Tests that start real jobs (torchrun, srun, accelerate, deepspeed: several processes each,
timings that matter). Under `pytest -n` (make test runs two workers) they all go to one worker,
one job at a time, while the other worker diagnoses logs: two jobs at once on a 2-core machine
would slow each other's start-up past the hang thresholds they test."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the job tests (see JOB_MARKERS) for pytest-xdist's --dist loadgroup. First of the
    hook's implementations, whatever the plugins' order: xdist reads the group mark in its own."""
    for item in items:
        if any(item.get_closest_marker(name) for name in JOB_MARKERS):
            item.add_marker(pytest.mark.xdist_group("jobs"))


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to start where xdist cannot group the job tests: pytest 9.2 made `Node.nodeid` a
    view of a structured id, and pytest-xdist <= 3.8's --dist loadgroup (which renames each item
    '...@jobs') then groups nothing. The job tests ran on both workers, two Slurm cases at once
    queued behind each other on the 2-CPU node, and CI failed after 18 minutes of timeouts. A
    worker's own error never reaches the terminal, so this is checked here, before any starts."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    from importlib.metadata import version

    if loadgroup_broken(version("pytest"), version("pytest-xdist")):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')}: "
            "--dist loadgroup would not keep the job tests on one worker; install the versions "
            "pyproject.toml pins (make setup) or run without -n"
        )


def loadgroup_broken(pytest_version: str, xdist_version: str) -> bool:
    """True for the pairs measured to group nothing (pytest >= 9.2, pytest-xdist <= 3.8)."""

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", text)[:2])

    return parts(pytest_version) >= (9, 2) and parts(xdist_version) <= (3, 8)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the DeepSpeed buffers this session's jobs left behind (made since it started;
    every job of the session has ended by now). Under pytest-xdist only the controller does it,
    after every worker: a worker that finished first would remove the buffers of a job that
    another worker is still running."""
    if hasattr(session.config, "workerinput"):
        return
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return
    for leftover in shm.glob(DEEPSPEED_SHM):
        try:
            if leftover.stat().st_mtime >= SESSION_START:
                leftover.unlink()
        except OSError:
            pass  # gone already, or not ours to remove


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-scenarios",
        action="store_true",
        help="run all 45 real scenarios (make test-scenarios), not only the core ones",
    )


def corpus_cases() -> list[Path]:
    if not CORPUS.is_dir():
        return []
    return sorted(p for p in CORPUS.iterdir() if (p / "label.json").is_file())


def run_cli(
    *args: str, stdin: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def diagnose_json(*paths: str | Path) -> dict[str, Any]:
    proc = run_cli("diagnose", "--format", "json", *map(str, paths))
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present")
    return CORPUS


@dataclass(frozen=True)
class HungRun:
    run_dir: Path
    proc: subprocess.CompletedProcess[str]


@pytest.fixture(scope="session")
def hung_run(tmp_path_factory: pytest.TempPathFactory) -> HungRun:
    """One real 3-rank gloo job under `ddpdoctor run --hang-after 5 --on-hang kill
    --label-ranks`: rank 1 sleeps while ranks 0 and 2 wait in a barrier (tests/programs/
    run_train.py hang). The tests that read its run folder (the supervisor's events and
    stacks, the timeline, the verdict after run's own kill) share it instead of running the
    same 15-second job three times; they only read it."""
    run_dir = tmp_path_factory.mktemp("hung-run") / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = run_cli(
        "run", "--run-dir", str(run_dir), "--hang-after", "5", "--on-hang", "kill",
        "--label-ranks", "--", str(torchrun), "--standalone", "--nproc-per-node=3",
        str(REPO / "tests" / "programs" / "run_train.py"), "hang", timeout=180,
    )  # fmt: skip
    return HungRun(run_dir, proc)


T = TypeVar("T")

FULL_TIER = os.environ.get("DDPDOCTOR_FUZZ") == "full"
"""`make fuzz` (DDPDOCTOR_FUZZ=full, run by CI after `make test`): the tiers over every real
line and every real capture; `make test` runs a stable third of them, to stay within its time."""


def tier_sample(items: list[T]) -> list[T]:
    """Every item in the full tier, else every third (the same ones each run)."""
    return items if FULL_TIER else items[::3]
