"""Ranks that behaved alike share a timeline lane (report.lane_groups): marks at the same place,
some with a time and some without, and a group of thousands of ranks."""

from __future__ import annotations

from datetime import UTC, datetime

from ddpdoctor.model.timeline import Lane, Mark
from ddpdoctor.report.lane_groups import merge


def _lane(rank: int, when: datetime | None) -> Lane:
    mark = Mark(
        id=f"m{rank}",
        what="context",
        role="context",
        label="ZeRO-3",
        rule="PERF101",
        time=when,
        source=f"rank{rank}.log",
        line=3,
        text="[WARNING] [stage3.py:2117:step] 1 pytorch allocator cache flushes",
        position=0.5,
    )
    return Lane(id=f"r{rank}", label=f"rank {rank}", kind="rank", ranks=[rank], marks=[mark])


def test_marks_with_and_without_a_time_at_one_place_merge() -> None:
    """1,000 generated sparse rank files crashed the report here: a timed mark (UTC-aware) and
    an untimed one at the same position were compared through a naive datetime.max."""
    when = datetime(2026, 11, 30, 11, 26, 8, tzinfo=UTC)
    merged = merge([_lane(0, None), _lane(1, when), _lane(2, None)], 0)
    assert [m.time for m in merged.marks] == [when]  # the timed one stands for all
    assert merged.marks[0].ranks == [0, 1, 2]
    assert merged.label == "ranks 0-2 (3)"


def test_a_group_of_ten_thousand_ranks_keeps_every_rank_once() -> None:
    lanes = [_lane(r, None) for r in reversed(range(10_000))]
    merged = merge(lanes, 0)
    assert merged.marks[0].ranks == list(range(10_000))
    assert merged.label == "ranks 0-9999 (10000)"
