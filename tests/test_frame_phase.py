"""Which part of the program a collective was reached from (analysis/frames.phase): the
innermost frame of the program's own that names an evaluation or a training step. The frame
lines are composed in the form CPython prints them; only the first chain of function names is
a real traceback's (tests/fixtures/real/fiftysixth-lone-tally), the others are common names."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.frames import phase
from ddpdoctor.model.evidence import EVALUATION, TRAINING
from ddpdoctor.model.findings import Hit
from ddpdoctor.model.records import Record


def _hit(*funcs: str) -> Hit:
    """A timeout whose traceback calls the program's functions in this order (outermost
    first), then torch's barrier."""
    frames = [f'  File "/repo/train.py", line {10 + i}, in {f}' for i, f in enumerate(funcs)]
    frames.append(
        '  File "/repo/.venv/lib/python3.11/site-packages/torch/distributed/'
        'distributed_c10d.py", line 5356, in barrier'
    )
    context = [Record("console.log", i + 1, text) for i, text in enumerate(frames)]
    timeout = "RuntimeError: Timed out waiting 15000ms for recv operation to complete"
    return Hit("TMO101", Record("console.log", len(frames) + 1, timeout), {}, context)


@pytest.mark.parametrize(
    "funcs",
    [
        # StyleGAN's metric on the main process (tests/fixtures/real/fiftysixth-lone-tally)
        ("training_loop", "calc_metric", "get_feature_detector"),
        ("main", "compute_metrics"),
        ("fit", "validate"),
        ("main", "evaluate"),
    ],
)
def test_a_metric_or_an_evaluation_reached_the_collective(funcs: tuple[str, ...]) -> None:
    assert phase(_hit(*funcs)) == EVALUATION


@pytest.mark.parametrize(
    "funcs",
    [
        ("main", "train_one_epoch"),
        # a training step that logs its metrics is still a training step
        ("main", "train_step", "log_metrics"),
    ],
)
def test_a_training_step_reached_the_collective(funcs: tuple[str, ...]) -> None:
    assert phase(_hit(*funcs)) == TRAINING


def test_names_that_say_neither_say_nothing() -> None:
    assert phase(_hit("main", "run", "metric_table")) is None
