"""The failure timeline as plain data: one lane per rank (or per group of ranks that behaved
alike, or per launcher), the marks on it in time or line order, the root marked, and arrows from
the root to what it explains. Built by report.timeline from the findings; rendered by report."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

MARK_KINDS = (
    "progress",  # the last progress line a rank printed
    "error",  # a failure the rank reported itself
    "timeout",  # the rank waited in a collective a peer never joined
    "lost-peer",  # the rank lost its connection to a peer or to the store
    "launcher",  # the launcher reacting (SIGTERM to the others, its failure summary)
    "signal",  # the process was stopped from outside (a signal, Ctrl-C)
    "hang",  # `ddpdoctor run` caught the job making no progress
    "stacks",  # a stack dump of a stalled process
    "context",  # a warning or fact: true, not the cause
    "exit",  # how the process ended (exit code or signal)
)
"""What a mark says about its lane, for the legend and the JSON report."""


@dataclass(slots=True)
class Mark:
    id: str
    what: str
    """One of MARK_KINDS."""
    role: str
    """root | cascade | context (exits take the role of nothing: context)."""
    label: str
    rule: str | None
    time: datetime | None
    source: str | None
    line: int | None
    text: str
    position: float
    """Where along the axis, 0 (first mark) to 1 (last)."""
    ranks: list[int] = field(default_factory=list)
    """The ranks of the lane that showed this mark (all of them on a rank's own lane)."""


@dataclass(slots=True)
class Lane:
    id: str
    label: str
    kind: str
    """rank | group (ranks that behaved alike) | launcher (lines no rank can be told for)."""
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    culprit: bool = False
    marks: list[Mark] = field(default_factory=list)


@dataclass(slots=True)
class Arrow:
    """The root's mark explains this cascade mark."""

    source: str
    target: str


@dataclass(slots=True)
class Timeline:
    axis: str
    """time (the marks carry timestamps) | order (line order: the logs carry no times)."""
    start: datetime | None
    end: datetime | None
    lanes: list[Lane] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    grouped: bool = False
    """Some lanes stand for several ranks that behaved alike."""
    ranks: int = 0
    """How many ranks the lanes cover."""
