"""PY105: a FileExistsError or FileNotFoundError raised while a rank created, renamed or deleted
a path is ranks racing on a shared path (checkpoint rotation, a temporary checkpoint renamed
into place, an output folder made on every rank), not missing input. Real public reports
(corpus/cases) and a real capture of a missing data file, which stays DATA101."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"
CAPTURED = REPO / "src" / "ddpdoctor" / "scenarios" / "captured"


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
