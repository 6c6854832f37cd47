"""PyTorch Flight Recorder data as ddpdoctor sees it: the entries of one rank's dump, and what
the cross-rank analysis found (ranks behind, collectives that diverge, the user's code line of
each side). Plain data for the causality engine and the renderers; no parsing, no torch."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python3", "<frozen", "/torch/")
"""A recorded frame whose file contains one of these is torch's or Python's, not the user's."""


@dataclass(frozen=True, slots=True)
class FlightFrame:
    """One Python frame the recorder captured when a collective was issued."""

    name: str
    file: str
    line: int

    @property
    def site(self) -> str:
        """`train.py:16`: what a user recognises; the full path stays in `file`."""
        return f"{posixpath.basename(self.file.replace(chr(92), '/'))}:{self.line}"

    @property
    def is_user(self) -> bool:
        return not any(m in self.file for m in LIBRARY_MARKERS)


@dataclass(slots=True)
class FlightEntry:
    """One collective (or point-to-point op) one rank issued, as its recorder kept it."""

    record_id: int
    pg: str
    """Process group name as the recorder writes it ("0" is the default group)."""
    pg_desc: str
    seq: int
    """collective_seq_id (p2p_seq_id for point-to-point ops): the n-th op of this rank in pg."""
    p2p: bool
    op: str
    """The operation without the backend prefix: all_reduce, broadcast, barrier, ..."""
    backend: str
    input_sizes: list[list[int]]
    output_sizes: list[list[int]]
    input_dtypes: list[str]
    output_dtypes: list[str]
    state: str
    """scheduled | started | completed; gloo leaves every entry `scheduled`."""
    time_created_ns: int | None = None
    timeout_ms: int | None = None
    frames: list[FlightFrame] = field(default_factory=list)
    """Innermost first, as recorded; empty in the JSON form, which carries no frames."""

    @property
    def user_frame(self) -> FlightFrame | None:
        """The innermost frame of the user's code: the line that issued the collective."""
        return next((f for f in self.frames if f.is_user), None)


@dataclass(slots=True)
class FlightGroupStatus:
    """The recorder's own counters for one process group (`pg_status`). On gloo they are not
    reliable: the op that timed out may already count as completed."""

    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


@dataclass(slots=True)
class FlightDump:
    """One rank's Flight Recorder dump, read from its pickle or JSON form."""

    source: str
    form: str
    """pickle | json."""
    rank: int | None
    """From the file name, as torch names dumps (`<prefix><rank>`); the dump itself has none."""
    version: str
    entries: list[FlightEntry]
    members: dict[str, list[int]] = field(default_factory=dict)
    """Process group name -> global ranks, where `pg_config` records them (gloo does not)."""
    status: dict[str, FlightGroupStatus] = field(default_factory=dict)
    dropped_entries: int = 0
    """Entries past the reader's cap, not kept."""

    @property
    def has_frames(self) -> bool:
        return any(e.frames for e in self.entries)


@dataclass(slots=True)
class FlightCall:
    """What one rank issued: an entry reduced to what a verdict quotes."""

    rank: int
    pg: str
    pg_desc: str
    seq: int
    op: str
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    site: str | None
    """`train.py:16`, the user's innermost frame; None when the dump carries no frames."""
    file: str | None
    line: int | None
    func: str | None
    source: str
    """The dump it came from."""

    def describe(self) -> str:
        """`all_reduce #4 at train.py:16`."""
        return f"{self.op} #{self.seq}" + (f" at {self.site}" if self.site else "")


@dataclass(slots=True)
class FlightRankView:
    """Where one rank stands in one process group, by its own dump."""

    rank: int
    pg: str
    pg_desc: str
    last_issued: int | None
    """Highest sequence id among the rank's entries in this group: the last op it issued."""
    status: FlightGroupStatus
    """The recorder's counters, as written (see FlightGroupStatus)."""
    last_call: FlightCall | None
    source: str


@dataclass(slots=True)
class FlightDivergence:
    """One place where the ranks' recorders disagree.

    kind:
      behind       ranks never issued seq (their last is lower) while the others did
      mismatch     at seq the ranks issued a different op, sizes or dtypes
      only-some    seq holds an op on some ranks that the others issued one later (an extra
                   collective in a rank-dependent branch)
      group-order  ranks wait in different process groups, each for a collective the other
                   never issued there (groups called in another order)
      group-config the ranks' recorders disagree on a group's members
      no-dump      ranks of the job left no dump
    """

    kind: str
    pg: str | None
    pg_desc: str | None
    seq: int | None
    ranks: list[int]
    """The ranks that diverge: the minority, the lagging ones, the ones that left the pattern the
    others kept; every rank involved when nothing tells the sides apart (`ambiguous`)."""
    others: list[int]
    calls: list[FlightCall]
    """Each rank's entry at seq; for a rank that never issued seq, its last call instead."""
    fields: list[str] = field(default_factory=list)
    """For mismatch: which of op, sizes, dtypes differ."""
    ambiguous: bool = False
    summary: str = ""
    """One sentence naming op, sequence id, ranks and code lines of each side."""


@dataclass(slots=True)
class FlightRow:
    """One line of the cross-rank table: one sequence id of one group, each rank's call."""

    pg: str
    pg_desc: str
    seq: int
    cells: dict[int, FlightCall | None]
    """Rank -> its call at seq; None when it never issued it (or its dump does not reach it)."""
    diverges: bool


@dataclass(slots=True)
class FlightAnalysis:
    """The recorders of a job read side by side: the facts the causality engine consumes."""

    world_size: int | None
    ranks_with_dump: list[int]
    ranks_without_dump: list[int]
    views: list[FlightRankView]
    divergences: list[FlightDivergence]
    """Earliest first: the first one is where the job left the rails."""
    table: list[FlightRow]
    """The last few sequence ids of the groups that matter, for the reports."""
    sources: list[str]
    notes: list[str] = field(default_factory=list)
    """What limits the analysis (dumps without a rank, membership not recorded, ...)."""

    @property
    def first(self) -> FlightDivergence | None:
        return self.divergences[0] if self.divergences else None
