"""Diagnoses of real Slurm outputs kept as fixtures (tests/fixtures/real/slurm-*, captured under
the Slurm of .ci/slurm-up; see each README): they run everywhere, Slurm or not. Wrong verdicts
are strict xfails, so that fixing one makes this file say so."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
BOTH = ["sbatch.out", "run-console.log"]


def verdict(case: str, name: str) -> tuple[str | None, str | None, list[int]]:
    report = diagnose_paths([str(REAL / case / name)])
    v = report.verdict
    assert report.job.world_size == (3 if case == "slurm-healthy" else 2)
    return v.kind, v.category, v.culprit.ranks


def test_healthy_three_tasks() -> None:
    report = diagnose_paths([str(REAL / "slurm-healthy" / "sbatch.out")])
    assert report.verdict.status == "ok", report.verdict.summary
    assert report.job.ranks_seen == [0, 1, 2]


@pytest.mark.parametrize("name", BOTH)
def test_time_limit(name: str) -> None:
    assert verdict("slurm-time-limit", name)[:2] == ("preempted", "intended-exit")


@pytest.mark.parametrize("name", BOTH)
def test_time_limit_blames_no_rank(name: str) -> None:
    assert verdict("slurm-time-limit", name)[2] == []


@pytest.mark.parametrize("name", BOTH)
def test_scancel(name: str) -> None:
    assert verdict("slurm-scancel", name)[:2] == ("preempted", "intended-exit")


@pytest.mark.parametrize("name", BOTH)
def test_sigkill_culprit(name: str) -> None:
    assert verdict("slurm-sigkill", name)[2] == [1]


@pytest.mark.parametrize("name", BOTH)
def test_sigkill_kind(name: str) -> None:
    assert verdict("slurm-sigkill", name) == ("host-oom", "resource", [1])
