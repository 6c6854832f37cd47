"""Accelerate's notebook_launcher says how many processes it starts ('Launching training on 3
CUDAs.'): the size of the launch where the processes themselves print no rank (kept apart from
the world's size: ranks known to exist that printed nothing would read as ranks that left no
logs)."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS
from tests.conftest import REPO

LAUNCHED = [f for f in FACT_PATTERNS if f.name == "launched_processes"]


def _launched(line: str) -> int | None:
    for fact in LAUNCHED:
        m = fact.compiled.search(line)
        if m is not None:
            return int(m.group("n"))
    return None


@pytest.mark.parametrize(
    ("line", "size"),
    [
        ("Launching training on 3 CUDAs.", 3),  # accelerate 1.15 (fiftysecond-*)
        # the other forms of accelerate/launchers.py: 0.x, TPU
        ("Launching training on 8 GPUs.", 8),
        ("Launching a training on 8 TPU cores.", 8),
    ],
)
def test_the_launcher_names_the_processes_it_starts(line: str, size: int) -> None:
    assert _launched(line) == size


@pytest.mark.parametrize(
    "line",
    [
        "Launching training on one GPU.",  # one process: no distributed world
        "Launching training on CPU.",
        "INFO: Launching training on 3 CUDAs. (took 2 s)",  # not the launcher's whole line
    ],
)
def test_other_lines_give_no_world(line: str) -> None:
    assert _launched(line) is None


def test_every_process_of_the_launch_is_named_for_a_resume_they_all_ran() -> None:
    # the notebook launcher started 3 processes that all torch.load the same checkpoint onto
    # cuda:0; it shows process 0's error only
    report = diagnose_paths([str(REPO / "tests" / "fixtures" / "real" / "fiftysecond-cuda-map")])
    assert report.verdict.kind == "checkpoint-load-device"
    assert report.verdict.culprit.ranks == [0, 1, 2]
