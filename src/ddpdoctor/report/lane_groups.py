"""Lanes of the timeline that stand for several ranks or hosts: ranks whose marks say the same
(what, role, rule) share a lane, the earliest mark standing for all of them, and the number of
lanes stays bounded however many ranks the job had."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from ddpdoctor.model.timeline import Lane, Mark
from ddpdoctor.report.ranges import rank_ranges

MAX_LANES = 24
"""Groups beyond this many are merged into one lane of the remaining ranks."""
_NO_TIME = datetime.max.replace(tzinfo=UTC)
"""Where a mark without a time sorts among marks at the same position (times are UTC-aware:
a naive `datetime.max` could not be compared with them)."""


class MarkLike(Protocol):
    """A timeline Mark, or a mark not yet made one (report.timeline's raw marks)."""

    @property
    def what(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def rule(self) -> str | None: ...
    @property
    def time(self) -> datetime | None: ...
    @property
    def source(self) -> str | None: ...
    @property
    def line(self) -> int | None: ...
    @property
    def text(self) -> str: ...
    @property
    def position(self) -> float: ...


class LaneLike(Protocol):
    """A timeline Lane, or a rank's lane not yet made one (its marks raw)."""

    @property
    def label(self) -> str: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def hosts(self) -> list[str]: ...
    @property
    def culprit(self) -> bool: ...
    @property
    def marks(self) -> Sequence[MarkLike]: ...


L = TypeVar("L", bound=LaneLike)


def signature(lane: LaneLike) -> tuple[object, ...]:
    """What a rank did, without when: ranks with equal signatures share a group lane."""
    marks = tuple((m.what, m.role, m.rule, m.label) for m in lane.marks)
    return (lane.culprit, lane.label.endswith("(no lines)"), marks)


def alike(lanes: list[L]) -> list[list[L]]:
    """Lanes by signature: culprits first, then the largest groups."""
    buckets: dict[tuple[object, ...], list[L]] = {}
    for lane in lanes:
        buckets.setdefault(signature(lane), []).append(lane)
    return sorted(buckets.values(), key=lambda ls: (not ls[0].culprit, -len(ls), ls[0].ranks))


def grouped(rank_lanes: Sequence[LaneLike]) -> list[Lane]:
    """Ranks that behaved alike share a lane: the earliest mark of each kind stands for all."""
    ordered = alike(list(rank_lanes))
    if len(ordered) > MAX_LANES:
        rest = [lane for group in ordered[MAX_LANES - 1 :] for lane in group]
        ordered = [*ordered[: MAX_LANES - 1], rest]
    return [merge(group, i) for i, group in enumerate(ordered)]


def merge(group: Sequence[LaneLike], index: int) -> Lane:
    ranks = sorted(r for lane in group for r in lane.ranks)
    hosts = sorted({h for lane in group for h in lane.hosts})
    alike = len({signature(lane) for lane in group}) == 1
    label = ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
    if len(ranks) > 1:
        label += f" ({len(ranks)}{'' if alike else ', not alike'})"
    if group[0].label.endswith("(no lines)") and alike:
        label += " no lines" if len(ranks) > 1 else " (no lines)"
    merged = Lane(
        id=f"lane-g{index}",
        label=label,
        kind="group" if len(ranks) > 1 else "rank",
        ranks=ranks,
        hosts=hosts,
        culprit=any(lane.culprit for lane in group),
    )
    slots: dict[tuple[object, ...], Mark] = {}
    # the ranks of each slot, sorted once at the end: sorting them again for every lane made
    # a group of 10,000 ranks take 2.5 s
    ranks_of: dict[tuple[object, ...], set[int]] = {}
    for lane in group:
        for m in lane.marks:
            key = (m.what, m.role, m.rule, m.label)
            first = slots.get(key)
            ranks_of.setdefault(key, set()).update(lane.ranks)
            if first is None or (m.position, m.time or _NO_TIME) < (
                first.position,
                first.time or _NO_TIME,
            ):
                slots[key] = Mark(
                    id="",
                    what=m.what,
                    role=m.role,
                    label=m.label,
                    rule=m.rule,
                    time=m.time,
                    source=m.source,
                    line=m.line,
                    text=m.text,
                    position=m.position,
                )
    for slot, mark in slots.items():
        mark.ranks = sorted(ranks_of[slot])
    merged.marks = sorted(slots.values(), key=lambda m: m.position)
    return merged


def hosts_alike(lanes: list[Lane]) -> list[Lane]:
    """Unranked lanes of many hosts: one per behaviour, the earliest line standing for all."""
    buckets: dict[tuple[object, ...], list[Lane]] = {}
    for lane in lanes:
        buckets.setdefault(signature(lane), []).append(lane)
    out: list[Lane] = []
    for i, group in enumerate(sorted(buckets.values(), key=len, reverse=True)):
        hosts = sorted({h for lane in group for h in lane.hosts})
        merged = Lane(
            id=f"lane-u{i}",
            label=f"no rank ({len(hosts)} hosts)" if len(hosts) > 1 else group[0].label,
            kind="launcher",
            hosts=hosts,
        )
        slots: dict[tuple[object, ...], Mark] = {}
        for lane in group:
            for m in lane.marks:
                key = (m.what, m.role, m.rule, m.label)
                if key not in slots or m.position < slots[key].position:
                    slots[key] = m
        merged.marks = sorted(slots.values(), key=lambda m: m.position)
        out.append(merged)
    return out
