"""Ranks that start or resume training at different points have different numbers of steps
left: one group finishes and leaves the other waiting (uneven inputs, the odd ones named).
The fact's lines, and the whole pipeline on the sixteenth set's volume-empty (a real run:
trainer-2's volume is new and empty)."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS
from tests.conftest import REPO

POINTS = [p for p in FACT_PATTERNS if p.name == "resume_point"]


def _point(text: str) -> tuple[str, str] | None:
    for p in POINTS:
        if p.literal in text and (m := p.compiled.search(text)):
            return m.group("unit"), m.group("n")
    return None


@pytest.mark.parametrize(
    ("text", "point"),
    [
        ("resuming from /tmp/pvc-29973-trainer-1/latest.pt at step 20", ("step", "20")),
        ("no checkpoint in /tmp/pvc-29973-trainer-2, starting from step 0", ("step", "0")),
        ("Starting training from iteration 0", ("iteration", "0")),
        ("resume at step 20", ("step", "20")),
    ],
)
def test_where_a_rank_starts(text: str, point: tuple[str, str]) -> None:
    assert _point(text) == point


@pytest.mark.parametrize(
    "text",
    ["loss at step 20: 0.51", "saved checkpoint at step 20", "warmup from step 0 to 100 is linear"],
)
def test_other_lines_say_no_start(text: str) -> None:
    assert _point(text) is None


def test_a_rank_that_started_over_is_named() -> None:
    v = diagnose_paths([str(REPO / "tests/fixtures/real/sixteenth-volume-empty")]).verdict
    assert (v.kind, v.culprit.ranks) == ("uneven-inputs", [2])
