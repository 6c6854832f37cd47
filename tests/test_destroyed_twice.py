"""A clean-up that runs twice at the end of a finished run (a framework's destroy_process_group
and the script's own) is teardown with its own rule and fix (EXIT105), not a plain exception:
real torchrun runs of tests/programs/destroy_twice_train.py (gloo, CPU, torch 2.13), each
rank's epoch counter at 3/3 before it raised."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


@pytest.mark.parametrize(
    ("mode", "raised"),
    [
        ("default", "AssertionError: Process group cannot be None"),
        ("subgroup", "ValueError: Invalid process group specified"),
    ],
)
def test_a_second_destroy_is_teardown_with_its_own_fix(mode: str, raised: str) -> None:
    folder = REAL / f"teardown-destroyed-twice-{mode}"
    text = (folder / "console.log").read_text()
    assert text.count("epoch 3/3") == 2 and text.count(raised) == 2
    verdict = diagnose_paths([str(folder)]).verdict
    assert (verdict.status, verdict.kind, verdict.rule, verdict.culprit.ranks) == (
        "failed",
        "exit-teardown-crash",
        "EXIT105",
        [0, 1],
    )
    assert "is_initialized()" in verdict.fix[0]
    assert any(raised in e.text for e in verdict.evidence)
