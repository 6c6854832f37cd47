"""Geometry of the timeline picture: where each lane, mark, axis tick and arrow goes in an SVG
of fixed view box. Numbers only; the HTML template draws them, so the picture needs no script
and no network."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.model.timeline import Lane, Mark, Timeline
from ddpdoctor.report.durations import clock, duration

WIDTH = 1000
LABEL_X = 8
AXIS_X0 = 210
AXIS_X1 = 850
EXIT_X = 900
TOP = 46
LANE_H = 42
BOTTOM = 16
MIN_GAP = 16
"""Marks of one lane closer than this are spread apart (they keep their order)."""
TICKS = 5


@dataclass(slots=True)
class DrawnMark:
    mark: Mark
    x: float
    y: float
    tip: str
    """The mark's tooltip (SVG <title>): time, where, what it says."""


@dataclass(slots=True)
class DrawnLane:
    lane: Lane
    y: float
    top: float
    marks: list[DrawnMark] = field(default_factory=list)


@dataclass(slots=True)
class DrawnArrow:
    path: str
    source: str
    target: str


@dataclass(slots=True)
class Tick:
    x: float
    label: str


@dataclass(slots=True)
class Drawing:
    width: int
    height: int
    lane_h: int
    axis_x0: int
    axis_x1: int
    exit_x: int
    axis_label: str
    lanes: list[DrawnLane]
    arrows: list[DrawnArrow]
    ticks: list[Tick]

    @property
    def marks(self) -> int:
        """How many marks are drawn: a timeline of none is not shown."""
        return sum(len(lane.marks) for lane in self.lanes)


def draw(t: Timeline) -> Drawing:
    lanes: list[DrawnLane] = []
    by_id: dict[str, DrawnMark] = {}
    for i, lane in enumerate(t.lanes):
        top = TOP + i * LANE_H
        drawn = DrawnLane(lane=lane, y=top + LANE_H / 2, top=top)
        last = -1e9
        for mark in sorted(lane.marks, key=lambda m: (m.what == "exit", m.position)):
            if mark.what == "exit":
                x = float(EXIT_X)
            else:
                x = max(AXIS_X0 + mark.position * (AXIS_X1 - AXIS_X0), last + MIN_GAP)
                last = x
            dm = DrawnMark(mark=mark, x=round(x, 1), y=drawn.y, tip=_tip(mark, t))
            drawn.marks.append(dm)
            by_id[mark.id] = dm
        lanes.append(drawn)
    arrows = []
    for a in t.arrows:
        src, dst = by_id.get(a.source), by_id.get(a.target)
        if src is None or dst is None:
            continue
        arrows.append(DrawnArrow(_curve(src, dst), a.source, a.target))
    height = TOP + len(lanes) * LANE_H + BOTTOM
    return Drawing(
        width=WIDTH,
        height=height,
        lane_h=LANE_H,
        axis_x0=AXIS_X0,
        axis_x1=AXIS_X1,
        exit_x=EXIT_X,
        axis_label=_axis_label(t),
        lanes=lanes,
        arrows=arrows,
        ticks=_ticks(t),
    )


def _curve(src: DrawnMark, dst: DrawnMark) -> str:
    """From the root down (or up) to the cascade mark's lane, then into the mark from the left:
    arrows leave the root's lane at once instead of running along it."""
    x1, y1, x2, y2 = src.x, src.y, dst.x, dst.y
    if abs(y2 - y1) < 1:  # same lane: an arc above it
        mid = (x1 + x2) / 2
        return f"M{x1:.1f},{y1 - 8:.1f} Q{mid:.1f},{y1 - 30:.1f} {x2 - 3:.1f},{y2 - 9:.1f}"
    down = 1 if y2 > y1 else -1
    start_y = y1 + 8 * down
    end_x = x2 - 9 if x2 - x1 > 24 else x2
    end_y = y2 if x2 - x1 > 24 else y2 - 9 * down
    bend = x1 + min(40.0, max(0.0, (x2 - x1) / 3))
    return f"M{x1:.1f},{start_y:.1f} C{x1:.1f},{y2:.1f} {bend:.1f},{y2:.1f} {end_x:.1f},{end_y:.1f}"


def _seconds(t: Timeline) -> float:
    if t.start is None or t.end is None:
        return 0.0
    return (t.end - t.start).total_seconds()


def _ticks(t: Timeline) -> list[Tick]:
    if t.axis != "time" or t.start is None:
        return [Tick(AXIS_X0, "first line"), Tick(AXIS_X1, "last line")]
    span = _seconds(t)
    return [
        Tick(
            round(AXIS_X0 + i / (TICKS - 1) * (AXIS_X1 - AXIS_X0), 1),
            "+" + duration(span * i / (TICKS - 1)),
        )
        for i in range(TICKS)
    ]


def _axis_label(t: Timeline) -> str:
    if t.axis == "time" and t.start is not None:
        return f"time from {clock(t.start)} UTC"
    return "line order in each log (the logs carry no timestamps)"


def _tip(mark: Mark, t: Timeline) -> str:
    head = [mark.what.replace("-", " ") + ("" if mark.role == "context" else f" ({mark.role})")]
    if mark.time is not None:
        head.append(clock(mark.time))
        if t.start is not None:
            head.append("+" + duration((mark.time - t.start).total_seconds()))
    if mark.source:
        head.append(f"{mark.source}:{mark.line}")
    if len(mark.ranks) > 1:
        head.append(f"{len(mark.ranks)} ranks")
    body = mark.label if mark.text == mark.label else f"{mark.label}\n{mark.text}"
    return " · ".join(head) + "\n" + body
