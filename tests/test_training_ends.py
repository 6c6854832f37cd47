"""How a log says its training ran to its end, each way with its positive and near-miss lines
(the lines of real captures: tests/fixtures/real/thirtyseventh-* for ESPnet's trainer and
Kaldi's run.pl, fortieth-* for a Keras-like loop's counters)."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.analysis.scanner import _last_epoch_done

COMPLETED = [f for f in FACT_PATTERNS if f.name == "completed"]


def _completed(line: str) -> bool:
    return any(f.compiled.search(line) for f in COMPLETED)


@pytest.mark.parametrize(
    "line",
    [
        # ESPnet's trainer after its epoch loop (thirtyseventh-steady's train.log)
        "The training was finished at 3 epochs ",
        # Kaldi's utils/run.pl (and queue.pl, slurm.pl) after the job exited 0
        "# Ended (code 0) at Fri Dec  4 04:16:23 UTC 2026, elapsed time 9 seconds",
        "Training is done.",
        "training has completed",
    ],
)
def test_a_sentence_or_a_wrapper_exit_code_ends_training(line: str) -> None:
    assert _completed(line)


@pytest.mark.parametrize(
    "line",
    [
        # the job failed: run.pl records it
        "# Ended (code 1) at Fri Dec  4 04:16:37 UTC 2026, elapsed time 8 seconds",
        # one epoch's or one phase's end
        "training is finished for epoch 3",
        "Training is done with this stage, evaluating",
        # ESPnet's early stop names its own end: "stopped", not finished
        "[Early stopping] valid.loss has not been improved 1 epochs continuously. The training "
        "was stopped at 2epoch",
    ],
)
def test_an_epoch_a_phase_or_a_failed_exit_ends_nothing(line: str) -> None:
    assert not _completed(line)


@pytest.mark.parametrize(
    ("line", "done"),
    [
        # fortieth-calm: every rank's last epoch summary, and its bar redrawn in place
        ("Epoch: 4/4 Train steps: 10 Val steps: 4 0.10s loss: 0.341106 val_loss: 0.29", True),
        ("\rEpoch: 4/4 Step: 9/10  90.00% |██████| 0.09s\rEpoch: 4/4 Step: 10/10 100.00% |", True),
        ("Epoch 3/3: 100%|██████████| 50/50 [00:05<00:00,  9.81it/s]", True),
        # the last epoch, not yet through; an earlier epoch at its end; no epoch counted
        ("\rEpoch: 4/4 Step: 3/10  30.00% |██████| 0.03s loss: 0.3", False),
        ("Epoch [2/3] step 50/50 loss 0.31", False),
        ("step 5/5 loss 0.31", None),
        # DDP tutorial's 'Epoch 2 | ... | Steps: 4' says no total: not known to be the last
        ("[GPU3] Epoch 2 | Batchsize: 16 | Steps: 4", None),
    ],
)
def test_the_last_epoch_with_its_steps_done_ends_the_loop(line: str, done: bool | None) -> None:
    assert _last_epoch_done(line) is done
