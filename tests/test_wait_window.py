"""The others' wait, and what a writer printed inside it (analysis/behaviour's wait window):
a record that carries a time of day without a date is read on the day of the launcher's stop."""

from __future__ import annotations

from datetime import UTC, datetime

from ddpdoctor.analysis.behaviour import _clock_time, _counted_run

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


# ------------------------------------------------------------------ a count of work, untimed
# The lines of tests/fixtures/real/sixtyeighth-frame-crawl (plain prints of a process with no
# log handler), at their lines in that console; the launcher reacted at line 105.
REBUILD = "Decoded-frame cache of the val split is stale; rebuilding ({}/10)"
FRAME_CRAWL = tuple((100 + k, REBUILD.format(k + 1)) for k in range(5))


def test_a_count_of_work_rising_up_to_the_reaction_is_work_in_progress() -> None:
    assert _counted_run(FRAME_CRAWL, [105]) == (104, REBUILD.format(5))


def test_a_count_glued_behind_a_bar_redraw_is_read_from_the_line_end() -> None:
    # tests/fixtures/real/sixtyfifth-decomp-crawl: the first count printed onto the bar's redraw
    bare = (
        (
            46,
            "\rValidation DataLoader 0: 100%|██████████| 3/3 [00:00<00:00, 522.50it/s]"
            "Seasonal decomposition of validation stores: 2/8 stores done",
        ),
        (47, "Seasonal decomposition of validation stores: 3/8 stores done"),
        (48, "Seasonal decomposition of validation stores: 4/8 stores done"),
    )
    assert _counted_run(bare, [49]) == (
        48,
        "Seasonal decomposition of validation stores: 4/8 stores done",
    )


def test_a_finished_count_is_not_work_in_progress() -> None:
    done = tuple((100 + k, REBUILD.format(k + 6)) for k in range(5))  # 6/10 .. 10/10
    assert _counted_run(done, [105]) is None


def test_a_count_that_does_not_rise_is_not_work_in_progress() -> None:
    # the same attempt printed again (a retry loop stuck on one item), or a count going down
    same = (
        (100, "waiting for the lock (attempt 3/5)"),
        (101, "waiting for the lock (attempt 3/5)"),
    )
    assert _counted_run(same, [102]) is None
    down = ((100, REBUILD.format(4)), (101, REBUILD.format(3)))
    assert _counted_run(down, [102]) is None


def test_one_line_or_other_words_or_a_distant_reaction_are_not() -> None:
    assert _counted_run(FRAME_CRAWL[-1:], [105]) is None
    mixed = ((100, "loading shard 1/4"), (101, REBUILD.format(2)))
    assert _counted_run(mixed, [102]) is None
    assert _counted_run(FRAME_CRAWL, [120]) is None  # 16 lines of something else in between
