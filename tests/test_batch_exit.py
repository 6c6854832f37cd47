"""How a batch system reports the end of the whole job (LSF's job report, Slurm's seff, a PBS
epilogue's resource table): the job's exit code where no launcher names the ranks' own."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.analysis.job import _batch_exit_code


def _read(line: str) -> int | None:
    for fact in FACT_PATTERNS:
        if fact.name == "batch_exit" and (m := fact.compiled.search(line)):
            return _batch_exit_code({k: v for k, v in m.groupdict().items() if v is not None})
    return None


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("Successfully completed.", 0),
        ("Exited with exit code 130.", 130),
        ("State: COMPLETED (exit code 0)", 0),
        ("State: FAILED (exit code 1)", 1),
        ("   Exit Status:        0", 0),
        # PBS: 256 plus the signal that ended the job (271: SIGTERM)
        ("   Exit Status:        271", -15),
        # not a task's exit inside srun's error line, nor a program's own words
        ("srun: error: node12: task 3: Exited with exit code 1", None),
        ("Exit Status: see the log", None),
    ],
)
def test_the_job_exit_a_batch_system_reports(line: str, code: int | None) -> None:
    assert _read(line) == code
