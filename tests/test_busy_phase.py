"""Last words that announce a long phase a rank does on its own (a save, an evaluation) make
it busy, not gone; a line that reports a phase's result does not. Lines from real captures
and re-enacted reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.behaviour import BUSY_PHASE
from ddpdoctor.analysis.diagnose import diagnose_paths


@pytest.mark.parametrize(
    "line",
    [
        "0: saving to /data/runs/soundstream-fsq/results",  # corpus 768
        "Saving model checkpoint to /out/checkpoint-500",
        "Validation DataLoader 0:  45%|████▌     | 9/20 [00:01<00:02,  5.12it/s]",
        "Running evaluation on the test set",
        "tokenizing the shard 3 of 8",
        # tests/fixtures/real/eleventh-slow-tokenize (a Ray Train worker)
        "worker 1: token cache is stale, rebuilding it (this can take a minute)",
    ],
)
def test_a_phase_announced(line: str) -> None:
    assert BUSY_PHASE.search(line)


@pytest.mark.parametrize(
    "line",
    [
        # tests/fixtures/real/seventh-main-stop: a result, then the rank's own stop
        "[Rank 0] validation loss 4.0672 below target, stopping",
        "epoch 3 evaluation results: accuracy 0.91",
    ],
)
def test_a_phase_reported_done(line: str) -> None:
    assert not BUSY_PHASE.search(line)


def test_a_main_process_saving_alone_is_busy_not_gone() -> None:
    """Corpus case 768: the main process said it was saving, then nothing, while rank 6 timed
    out in a broadcast: busy on its own (slow rank), not a rank that left."""
    (case,) = (Path(__file__).resolve().parent.parent / "corpus" / "cases").glob("768-*")
    v = diagnose_paths([str(case / "logs")]).verdict
    assert (v.kind, v.culprit.ranks) == ("slow-rank-timeout", [0])


@pytest.mark.parametrize(
    ("last", "before", "phase"),
    [
        # tests/fixtures/real/fortysecond-parked-prefetch, rank 1: the evaluation's last batch,
        # then its result; the rank was stuck after it, not evaluating
        ("Eval metrics/eval/Accuracy: 0.5208", "[Eval batch=2/2] Eval on eval data", None),
        # the same phase not through, then a line that is no progress: still in it
        (
            "Eval metrics/eval/Accuracy: 0.5208",
            "[Eval batch=1/2] Eval on eval data",
            "[Eval batch=1/2] Eval on eval data",
        ),
        # composed: a stop's handler after a save that counts nothing: the save is the phase
        ("received SIGTERM, exiting", "saving checkpoint to /ckpt/step_40.pt", "saving"),
    ],
)
def test_the_line_before_the_last_announces_a_phase_not_yet_through(
    last: str, before: str, phase: str | None
) -> None:
    from ddpdoctor.analysis.behaviour import _announced_phase
    from ddpdoctor.analysis.scanner import StreamSummary
    from ddpdoctor.model.records import Origin

    stream = StreamSummary("w", Origin(), last_line=9, last_text=last, prev_text=before)
    said = _announced_phase(stream)
    assert (said is None) if phase is None else (said is not None and phase in said)
