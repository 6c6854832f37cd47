"""Shared test fixtures: where the real corpus and captured logs live, and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the DeepSpeed buffers this session's jobs left behind (made since it started;
    every job of the session has ended by now)."""
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
