"""The tail sample's progress patterns open with a look-ahead so that Python `re` skips
positions in C. That look-ahead must only be a speed-up: on any text they find what the plain
patterns (the specification, written out here) find."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.analysis.scanner import PROGRESS_COUNTER, PROGRESS_LINE, _counts, progress_line

PLAIN_LINE = re.compile(
    r"(?i)(?:\b(?:step|iter(?:ation)?|epoch|loss|batch|eta|kimg|round)|(?<=train_)loss)\b"
    r"\s*[:=\[]?\s*\d|\d+%\|"
)
PLAIN_COUNTER = re.compile(
    r"(?i)\b(?:(?:step|iter(?:ation)?|batch|it)\b\D{0,3}?"
    r"|epoch\b[\s:=\[]{0,3}\d{1,6}(?: \| |\]\[ {0,6}))(?P<n>\d+)\s*/\s*(?P<total>\d+)"
)
WORDS = [
    "step",
    "STEP",
    "Iter",
    "iteration",
    "epoch",
    "Loss",
    "batch",
    "it",
    "x",
    "steps",
    "kimg",
    "round",
    "train_",
    "val_",
]
GLUE = [" ", ":", "=", "[", "/", " / ", "%|", "_", "", "é", "][ ", " | "]
texts = st.lists(
    st.sampled_from(WORDS) | st.sampled_from(GLUE) | st.integers(0, 999).map(str), max_size=12
).map("".join) | st.text(max_size=60)


@given(texts)
def testprogress_line_finds_what_the_plain_pattern_finds(text: str) -> None:
    """Both find a line or neither; where they do, the match ends at the same place. A
    percentage is read as at most three digits, so in '0100%|' the fast pattern starts one
    digit later than the plain one: the scanner only asks whether a line matches."""
    fast, plain = PROGRESS_LINE.search(text), PLAIN_LINE.search(text)
    assert (fast and fast.end()) == (plain and plain.end())


@given(texts)
def test_progress_counter_finds_what_the_plain_pattern_finds(text: str) -> None:
    fast, plain = PROGRESS_COUNTER.search(text), PLAIN_COUNTER.search(text)
    assert (fast and fast.groupdict()) == (plain and plain.groupdict())


def test_realprogress_lines() -> None:
    bar = "  14%|#         | 2805/20000 [15:35<95:31,  3.01it/s]"
    assert PROGRESS_LINE.search(bar)
    assert PROGRESS_COUNTER.search("Epoch 3 step 120/500 loss 0.3")["total"] == "500"  # type: ignore[index]
    # the step count right after its epoch, the word for it left out (pytorch/examples'
    # ProgressMeter, flashy's solver), and not the epoch's own count
    assert PROGRESS_COUNTER.search("Epoch: [0][ 10/391]\tTime  0.5")["total"] == "391"  # type: ignore[index]
    assert PROGRESS_COUNTER.search("Train | Epoch 1 | 2/3 | 1.71 it/sec")["n"] == "2"  # type: ignore[index]
    assert PROGRESS_COUNTER.search("Epoch 3/10 loss 0.2") is None
    assert not PROGRESS_LINE.search("NCCL INFO Channel 02/0 : 0[0] -> 1[1] via P2P/CUMEM/read")
    # StyleGAN's ticks count thousands of images shown
    assert progress_line("tick 6     kimg 0.4      time 12s          sec/tick 3.9")
    # slurmstepd's notice names a job step's id, not a training step (fiftyninth-stale-lock)
    assert not progress_line(
        "slurmstepd-node01: error: *** STEP 59014.0 ON node01 CANCELLED AT 2026-12-04T23:55:44 "
        "DUE TO TIME LIMIT ***"
    )
    assert progress_line("step 59014 loss 0.3")
    # a federated or RL run's communication round, and the training loss under a variable's
    # name (FedML's logs: tests/fixtures/real/eightysixth-calm-fed)
    assert progress_line("################Communication round : 3")
    assert progress_line("client_idx = 1, round 0, train_loss = 1.2685, train_acc = 0.4484")
    # not configuration, nor a summary's best validation loss at the end
    assert not progress_line("max_epoch: 100, num_steps: 10, warmup_steps = 100")
    assert not progress_line("rank 0 finished, best val_loss 1.1111")
    assert not progress_line("round-trip 3 ms")


def test_the_numbers_aprogress_line_counts_by() -> None:
    """What tells a counter that moved from a heartbeat repeating its step: the numbers after
    a word for steps and before a total, not a loss, a rate or a memory figure."""
    assert _counts("Evaluate metrics | Epoch 3 | 2/6 | 0.25 it/sec | sisnr -67.936") == ["3", "2"]
    assert _counts("heartbeat step=5 rss_mb=374") == ["5"]
    assert _counts("heartbeat step=5 rss_mb=375") == _counts("heartbeat step=5 rss_mb=374")
    assert _counts("iter 120 loss 0.31") != _counts("iter 121 loss 0.31")


def test_a_signal_handlers_answer_is_no_phase_of_work() -> None:
    """'Received SIGTERM, saving a checkpoint' answers a stop from outside (hundredfifth-stats-
    park); 'saving a checkpoint' alone is work the rank was at."""
    from ddpdoctor.analysis.phases import phase_of_work

    assert not phase_of_work(
        "Received SIGTERM, saving a checkpoint before the instance is reclaimed"
    )
    assert phase_of_work("Saving checkpoint to /opt/ml/checkpoints/checkpoint.pth")
