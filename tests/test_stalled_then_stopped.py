"""A job stopped from outside after it had gone quiet for far longer than its own pace of
progress lines is a hang, not a preemption (INF229), from a real run: rank 1 blocks on its own
lock at step 10, rank 0 waits under a 600 s collective timeout, and a 60 s time limit
(`timeout -s TERM`) stops torchrun (tests/fixtures/real/capture_stalled_then_stopped.sh). The
same stop after steady progress stays a stop from outside."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def test_a_stop_long_after_the_last_step_is_a_hang() -> None:
    v = diagnose_paths([str(REAL / "stalled-then-stopped")]).verdict
    assert (v.status, v.kind, v.rule) == ("hung", "hang", "INF229")
    assert "a longer time limit would not have helped" in v.summary


def test_the_same_stop_right_after_a_step_is_the_stop(tmp_path: Path) -> None:
    """The capture with the silence cut out: the stop follows the last step at its pace."""
    lines = (REAL / "stalled-then-stopped" / "console.log").read_text().splitlines()
    last_step = max(i for i, line in enumerate(lines) if " - step: " in line)
    stop = next(i for i, line in enumerate(lines) if "death signal" in line)
    step_time = lines[last_step].split(" - ")[0][-12:]  # HH:MM:SS,mmm of the last step
    hh, mm, rest = step_time.split(":")
    moved = lines[stop].replace(lines[stop][6:21], f"{hh}:{mm}:{rest.replace(',', '.')}000", 1)
    kept = [*lines[: last_step + 1], moved, *lines[stop + 1 :]]
    (tmp_path / "console.log").write_text("\n".join(kept) + "\n")
    v = diagnose_paths([str(tmp_path)]).verdict
    assert v.rule != "INF229" and v.kind == "preempted", (v.rule, v.kind)
