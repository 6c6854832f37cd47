"""A job stopped from outside after it had gone quiet for far longer than its own pace of
progress lines is a hang, not a preemption (INF229), from a real run: rank 1 blocks on its own
lock at step 10, rank 0 waits under a 600 s collective timeout, and a 60 s time limit
(`timeout -s TERM`) stops torchrun (tests/fixtures/real/capture_stalled_then_stopped.sh). A
stop right after a step (another real run of the same program) stays a stop from outside."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def test_a_stop_long_after_the_last_step_is_a_hang() -> None:
    v = diagnose_paths([str(REAL / "stalled-then-stopped")]).verdict
    assert (v.status, v.kind, v.rule) == ("hung", "hang", "INF229")
    assert "a longer time limit would not have helped" in v.summary


def test_a_stop_right_after_a_step_is_the_stop() -> None:
    """The same program stopped by a time limit 20 ms after its step-15 line (a real run,
    tests/fixtures/real/twelfth-time-limit): a stop from outside, not a hang."""
    v = diagnose_paths([str(REAL / "twelfth-time-limit")]).verdict
    assert (v.kind, v.rule) == ("preempted", "LCH109")
