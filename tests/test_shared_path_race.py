"""PY105: a FileExistsError or FileNotFoundError raised while a rank created, renamed or deleted
a path is ranks racing on a shared path (checkpoint rotation, a temporary checkpoint renamed
into place, an output folder made on every rank), not missing input. Real public reports
(corpus/cases), real 3-rank gloo runs whose checkpoint housekeeping runs on every rank
(tests/fixtures/real/shared-path-*, capture_shared_path.sh), and a real capture of a missing
data file, which stays DATA101."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"
CAPTURED = REPO / "src" / "ddpdoctor" / "scenarios" / "captured"
REAL = REPO / "tests" / "fixtures" / "real"


def _case(prefix: str) -> Path:
    return next(CASES.glob(f"{prefix}-*")) / "logs"


@pytest.mark.parametrize(
    ("case", "culprit"),
    [
        # the transformers Trainer's os.renames of its tmp-checkpoint folder, on rank 1 of 4
        ("1503", [1]),
        # a checkpointer's os.makedirs(exist_ok=True) on a shared filesystem, rank 8
        ("1232", [8]),
    ],
)
def test_a_create_or_rename_that_failed_on_a_shared_path_is_a_race(
    case: str, culprit: list[int]
) -> None:
    verdict = diagnose_paths([str(_case(case))]).verdict
    assert (verdict.rule, verdict.kind) == ("PY105", "python-exception")
    assert verdict.culprit is not None and verdict.culprit.ranks == culprit
    assert "barrier" in " ".join(verdict.fix)


def test_a_missing_input_file_stays_a_data_error() -> None:
    """The data-error scenario's FileNotFoundError comes from opening a sample: no path was
    being created, renamed or deleted."""
    report = diagnose_paths([str(CAPTURED / "data-error")])
    assert report.verdict.rule == "DATA101"
    assert all(f.rule != "PY105" for f in report.findings)


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        # every rank deletes the previous epoch's checkpoint folder: ranks 1 and 2 find it gone
        ("rotate", "FileNotFoundError"),
        # every rank makes the run's folder with os.makedirs(path): ranks 1 and 2 find it there
        ("mkdir", "FileExistsError"),
    ],
)
def test_housekeeping_on_every_rank_of_a_real_run_is_a_race(mode: str, error: str) -> None:
    console = (REAL / f"shared-path-{mode}" / "console.log").read_text()
    assert f"[rank1]: {error}" in console and f"[rank2]: {error}" in console
    verdict = diagnose_paths([str(REAL / f"shared-path-{mode}")]).verdict
    assert (verdict.status, verdict.rule, verdict.kind) == ("failed", "PY105", "python-exception")
    assert verdict.culprit is not None and verdict.culprit.ranks == [1, 2]


def test_the_same_housekeeping_on_rank_0_behind_a_barrier_is_healthy() -> None:
    verdict = diagnose_paths([str(REAL / "shared-path-guarded")]).verdict
    assert verdict.status == "ok" and verdict.kind is None
