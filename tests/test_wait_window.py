"""The others' wait, and what a writer printed inside it (analysis/behaviour's wait window):
a record that carries a time of day without a date is read on the day of the launcher's stop."""

from __future__ import annotations

from datetime import UTC, datetime

from ddpdoctor.analysis.behaviour import _clock_time

STOP = datetime(2026, 12, 5, 6, 56, 36, 532000, tzinfo=UTC)


def test_a_time_of_day_is_read_on_the_day_of_the_stop() -> None:
    # Modulus's PythonLogger: '[%H:%M:%S - name - LEVEL]' (tests/fixtures/real/sixtyfourth-*)
    line = "[06:56:30 - darcy_fno - WARNING] Darcy solver did not converge (3/8)"
    assert _clock_time(line, STOP) == datetime(2026, 12, 5, 6, 56, 30, tzinfo=UTC)
    assert _clock_time("[06:56:35,250] INFO x", STOP) == datetime(
        2026, 12, 5, 6, 56, 35, 250000, tzinfo=UTC
    )


def test_a_wait_across_midnight_reads_the_day_before() -> None:
    stop = datetime(2026, 12, 5, 0, 0, 5, tzinfo=UTC)
    assert _clock_time("[23:59:58] rebuilding 2/8", stop) == datetime(
        2026, 12, 4, 23, 59, 58, tzinfo=UTC
    )


def test_what_is_no_time_of_day_is_none() -> None:
    assert _clock_time("step 12:30:99 of a counter", STOP) is None  # 99 seconds
    assert _clock_time("loss 0.25 at 4:5:6", STOP) is None
    # past the head of the line: a time inside the message is not the record's
    assert _clock_time("x" * 120 + " 06:56:30", STOP) is None
