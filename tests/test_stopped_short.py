"""A run that announced its end, with nothing failed, while the main process's training bar
stood at half its total or less: a silent early stop (INF241, ok). Real runs only: an early
stopping callback that says nothing (the transformers Trainer's), a healthy run whose bar
reached its total, and ranked writers whose last counter is no plan."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


@pytest.mark.parametrize(
    ("name", "counter", "line"),
    [
        ("hundredtwelfth-patience-halt", "28/84", 82),  # axolotl: 'Training Completed!!!'
        # Whisper: the final evaluation's '4/4' bar after the end is not the plan
        ("hundredthirteenth-patience-wer", "15/200", 74),
        # sentence-transformers: its 'Computing widget examples: 1/1' after the end neither
        ("hundredfourteenth-goal-halt", "10/40", 53),
        # the Trainer's 'Writing model shards: 1/1' after the end neither
        ("ninth-patience-halt", "15/30", 20),
    ],
)
def test_an_end_at_a_fraction_of_the_planned_steps_is_an_early_stop(
    name: str, counter: str, line: int
) -> None:
    """The evidence is the training bar where it stood, not the last bar of any kind."""
    verdict = diagnose_paths([str(REAL / name)]).verdict
    assert (verdict.status, verdict.kind, verdict.rule) == ("ok", None, "INF241")
    assert [(e.line, counter in e.text) for e in verdict.evidence] == [(line, True)]


@pytest.mark.parametrize(
    "name",
    [
        "hundredtwelfth-calm-tune",  # the bar reached its total (a tokenizer's bar before it)
        "hundredthirteenth-calm-hindi",
        "thirtysecond-clean",  # '[rank 1/3] epoch 1 done': a rank's tag, no plan
        "hundredth-calm-codec",  # a rank's last counter is its generation phase's 1/2
    ],
)
def test_a_run_that_did_its_steps_is_no_early_stop(name: str) -> None:
    verdict = diagnose_paths([str(REAL / name)]).verdict
    assert (verdict.status, verdict.kind) == ("ok", None)
