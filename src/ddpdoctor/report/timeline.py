"""The failure timeline from a report: per rank, the first line of each finding (its role and
what it says: an error, a timeout, the launcher's reaction, a stack dump), the last progress
and the exit; the root marked and arrows from it to the cascade; ranks that behaved alike share
a lane when there are many. Reads the report only (findings, their hits, the job); decides
nothing."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import datetime

from ddpdoctor.model.findings import Evidence, Finding, Hit, Report
from ddpdoctor.model.timeline import Arrow, Lane, Mark, Timeline
from ddpdoctor.report.lane_groups import MAX_LANES, alike, grouped, hosts_alike, merge

__all__ = ["MAX_LANES", "MAX_RANK_LANES", "MAX_UNRANKED_LANES", "build_timeline"]

MAX_RANK_LANES = 16
"""Up to this many ranks get a lane each; beyond, ranks that behaved alike share one."""
MAX_MARKS_PER_LANE = 8
MAX_UNRANKED_LANES = 4
"""Lines without a rank get a lane per host up to this many hosts; beyond, hosts whose lines
said the same share one."""
MAX_ARROWS = 48
ECHO_MARK = {
    "waiting": "timeout",
    "lost-peer": "lost-peer",
    "launcher": "launcher",
    "stopped": "signal",
}
"""rules.base.Echo values (carried by each hit): what the line says about its own rank."""
ROLE_ORDER = {"root": 0, "cascade": 1, "context": 2}
RUN_EVENTS = "events.jsonl"
"""The events file of `ddpdoctor run` (ingest.run_events): a stall found there is its hang
detection; a stall found in a log is a stack dump."""
STALL_KIND = "hang"


@dataclass(slots=True)
class _Raw:
    """A mark before lanes are laid out: `rank` None for lines no rank can be told for."""

    what: str
    role: str
    label: str
    rule: str | None
    time: datetime | None
    source: str | None
    line: int | None
    text: str
    rank: int | None
    host: str | None
    order: int
    position: float = 1.0


def build_timeline(report: Report) -> Timeline:
    """The timeline of `report`: a pure function of the report."""
    culprits = list(report.verdict.culprit.ranks)
    raws = _from_findings(report.findings, culprits)
    raws += _from_job(report, start=len(raws))
    lines_of = {str(getattr(s, "path", "")): int(getattr(s, "lines", 0)) for s in report.sources}
    axis, start, end = _place(raws, lines_of)
    rank_lanes, others = _lanes(raws, report, culprits)
    many = len(rank_lanes) > MAX_RANK_LANES
    if many:  # grouped straight from each rank's first marks: no Lane or Mark made per rank
        lanes = grouped(rank_lanes) + others
    else:
        lanes = [_lane(rl) for rl in rank_lanes] + others
        # ranks with nothing to show (no lines, no exit) share one lane even among few
        empty = [
            lane for lane in lanes if lane.kind == "rank" and not lane.marks and not lane.culprit
        ]
        if len(empty) > 1:
            kept = [lane for lane in lanes if lane not in empty]
            lanes = kept + [merge(g, i) for i, g in enumerate(alike(empty), len(kept))]
    unranked = [lane for lane in lanes if lane.kind == "launcher"]
    if len(unranked) > MAX_UNRANKED_LANES:
        lanes = [lane for lane in lanes if lane.kind != "launcher"] + hosts_alike(unranked)
    lanes.sort(key=_lane_order)
    for lane in lanes:
        lane.marks = _trim(lane.marks)
    ranked = [lane for lane in lanes if lane.kind != "launcher" and lane.marks]
    if len({h for lane in ranked for h in lane.hosts}) > 1 and all(
        len(lane.hosts) == 1 for lane in ranked
    ):
        for lane in ranked:  # which node each lane ran on, when every lane says and they differ
            lane.label += f" @ {lane.hosts[0]}"
    covered = {r for lane in lanes for r in lane.ranks}
    return Timeline(
        axis=axis,
        start=start,
        end=end,
        lanes=lanes,
        arrows=_arrows(lanes),
        grouped=many,
        ranks=len(covered),
    )


# ------------------------------------------------------------------------------ marks
def _what(finding: Finding, echo: str | None, source: str | None) -> str:
    if echo in ECHO_MARK:
        return ECHO_MARK[echo]
    if finding.kind == STALL_KIND and source:
        if posixpath.basename(source) == RUN_EVENTS:
            return "hang"
        if finding.role != "root":
            return "stacks"
    return "context" if finding.role == "context" else "error"


def _first(hits: list[Hit]) -> Hit:
    """The earliest hit: by time when it has one, else by scan order."""
    return min(hits, key=lambda h: (h.record.time is None, h.record.time or datetime.min, h.order))


def _from_findings(findings: list[Finding], culprits: list[int]) -> list[_Raw]:
    """One mark per finding, rank and echo: where it was first seen."""
    raws: list[_Raw] = []
    for finding in findings:
        if finding.hits:
            groups: dict[tuple[int | None, str | None, str | None], list[Hit]] = {}
            for hit in finding.hits:
                origin = hit.record.origin  # lines without a rank: one mark per host
                host = origin.host if origin.rank is None else None
                groups.setdefault((origin.rank, hit.echo, host), []).append(hit)
            for (rank, echo, _), hits in groups.items():
                rec = _first(hits).record
                what = _what(finding, echo, rec.source)
                for lane_rank in _lane_ranks(finding, rank, culprits):
                    raws.append(
                        _Raw(
                            what=what,
                            role=finding.role,
                            label=finding.title,
                            rule=finding.rule,
                            time=rec.time,
                            source=rec.source,
                            line=rec.line,
                            text=rec.text,
                            rank=lane_rank,
                            host=rec.origin.host,
                            order=len(raws),
                        )
                    )
            continue
        # a cause inferred from the job, or a report read back: its quoted evidence
        for ev in finding.evidence or [_no_evidence(finding)]:
            what = _what(finding, None, ev.source or None)
            for lane_rank in _lane_ranks(finding, ev.rank, culprits):
                raws.append(
                    _Raw(
                        what=what,
                        role=finding.role,
                        label=finding.title,
                        rule=finding.rule,
                        time=ev.time,
                        source=ev.source or None,
                        line=ev.line or None,
                        text=ev.text,
                        rank=lane_rank,
                        host=ev.host,
                        order=len(raws),
                    )
                )
    return raws


def _no_evidence(finding: Finding) -> Evidence:
    return Evidence(source="", line=0, rank=None, host=None, time=None, text=finding.note or "")


def _lane_ranks(finding: Finding, rank: int | None, culprits: list[int]) -> list[int | None]:
    """A root line printed without a rank stands on the culprit's lane(s)."""
    if rank is not None:
        return [rank]
    if finding.role == "root":
        ranks = finding.ranks or culprits
        if ranks and len(ranks) <= MAX_RANK_LANES:
            return list(ranks)
    return [None]


def _from_job(report: Report, start: int) -> list[_Raw]:
    """Last progress and exits, from the job facts."""
    raws: list[_Raw] = []
    job = report.job
    for rank, ev in sorted(job.last_progress.items()):
        raws.append(
            _Raw(
                what="progress",
                role="context",
                label="last progress",
                rule=None,
                time=ev.time,
                source=ev.source,
                line=ev.line,
                text=ev.text,
                rank=rank,
                host=ev.host,
                order=start + len(raws),
            )
        )
    for rank, ex in sorted(job.per_rank.items()):
        if ex.code is None and ex.signal is None:
            continue
        label = "exit" if ex.code is None else f"exit {ex.code}"
        if ex.signal:
            label += f" ({ex.signal})"
        raws.append(
            _Raw(
                what="exit",
                role="context",
                label=label,
                rule=None,
                time=None,
                source=None,
                line=None,
                text=label,
                rank=rank,
                host=ex.host,
                order=start + len(raws),
            )
        )
    return raws


# ------------------------------------------------------------------------------ positions
def _place(
    raws: list[_Raw], lines_of: dict[str, int]
) -> tuple[str, datetime | None, datetime | None]:
    """Positions 0..1: by time when marks carry times (an untimed line takes the time of the
    nearest timed line before it in the same source), else by line order within the source.
    Exits, and marks nothing places, go at the end."""
    at = _times(raws)
    if at:
        start, end = min(at.values()), max(at.values())
        span = (end - start).total_seconds() or 1.0
        for r in raws:
            t = at.get(r.order)
            r.position = 1.0 if t is None else (t - start).total_seconds() / span
        return "time", start, end
    for r in raws:
        total = lines_of.get(r.source or "", 0)
        r.position = min(1.0, r.line / total) if total and r.line else 1.0
    return "order", None, None


def _times(raws: list[_Raw]) -> dict[int, datetime]:
    """The time each mark is drawn at; marks keep their own `time` (None stays None)."""
    at = {r.order: r.time for r in raws if r.time is not None}
    if not at:
        return {}
    timed: dict[str, list[tuple[int, datetime]]] = {}
    for r in raws:
        if r.time is not None and r.source and r.line:
            timed.setdefault(r.source, []).append((r.line, r.time))
    hang = min((r.time for r in raws if r.what == "hang" and r.time), default=None)
    for r in raws:
        if r.time is not None or r.what == "exit":
            continue
        same = timed.get(r.source or "", [])
        before = [t for line, t in same if r.line and line <= r.line]
        after = [t for line, t in same if r.line and line > r.line]
        if before:
            at[r.order] = max(before)
        elif after:
            at[r.order] = min(after)
        elif r.what == "stacks" and hang is not None:
            at[r.order] = hang  # `ddpdoctor run` dumps the stacks when it detects the hang
    return at


# ------------------------------------------------------------------------------ lanes
@dataclass(slots=True)
class _RankLane:
    """A rank's lane before lanes are laid out: its first mark of each kind, as raws (many
    ranks are grouped from these without a Lane or a Mark made for each rank)."""

    rank: int
    label: str
    hosts: list[str]
    culprit: bool
    marks: list[_Raw]
    shown: set[tuple[object, ...]]

    @property
    def ranks(self) -> list[int]:
        return [self.rank]


def _lanes(
    raws: list[_Raw], report: Report, culprits: list[int]
) -> tuple[list[_RankLane], list[Lane]]:
    """A lane per rank (every rank the job knows, marks or not), in rank order, and a lane per
    host's unranked lines."""
    job = report.job
    ranks = set(job.ranks_seen) | set(job.ranks_missing) | set(job.per_rank)
    ranks |= {r.rank for r in raws if r.rank is not None}
    hosts = {rank: ex.host for rank, ex in job.per_rank.items() if ex.host}
    no_lines = set(job.ranks_missing)  # a list: looked through once per lane, 0.7 s for 10,000
    chosen = set(culprits)
    by_rank: dict[int, _RankLane] = {}
    for rank in sorted(ranks):
        by_rank[rank] = _RankLane(
            rank=rank,
            label=f"rank {rank}" + (" (no lines)" if rank in no_lines else ""),
            hosts=[hosts[rank]] if rank in hosts else [],
            culprit=rank in chosen,
            marks=[],
            shown=set(),
        )
    others: dict[str, Lane] = {}
    marked: dict[str, set[tuple[object, ...]]] = {}  # per lane: (what, role, rule, label) shown
    for r in sorted(raws, key=lambda r: (r.position, r.order)):
        same = (r.what, r.role, r.rule, r.label)
        if r.rank is not None:
            rl = by_rank[r.rank]
            if r.host and r.host not in rl.hosts:
                rl.hosts.append(r.host)
            if same not in rl.shown:  # raws come earliest first: the first one stays
                rl.shown.add(same)
                rl.marks.append(r)
            continue
        key = f"h{r.host or ''}"
        if key not in others:
            label = "no rank" + (f" ({r.host})" if r.host else "")
            lane = others[key] = Lane(
                id=f"lane-n{len(by_rank) + len(others)}", label=label, kind="launcher"
            )
            if r.host:
                lane.hosts.append(r.host)
        lane = others[key]
        seen = marked.setdefault(lane.id, set())
        if same not in seen:  # a set: a lane of thousands of marks compared each with all
            seen.add(same)
            lane.marks.append(_mark(r, lane))
    return list(by_rank.values()), list(others.values())


def _lane(rl: _RankLane) -> Lane:
    """The lane of one rank, shown on its own."""
    lane = Lane(
        id=f"lane-r{rl.rank}",
        label=rl.label,
        kind="rank",
        ranks=[rl.rank],
        hosts=rl.hosts,
        culprit=rl.culprit,
    )
    lane.marks = [_mark(r, lane) for r in rl.marks]
    return lane


def _mark(r: _Raw, lane: Lane) -> Mark:
    return Mark(
        id="",
        what=r.what,
        role=r.role,
        label=r.label,
        rule=r.rule,
        time=r.time,
        source=r.source,
        line=r.line,
        text=r.text,
        position=r.position,
        ranks=list(lane.ranks),
    )


def _lane_order(lane: Lane) -> tuple[int, int]:
    """Culprits first, then ranks that show something, lines without a rank, quiet ranks."""
    if lane.culprit:
        place = 0
    elif lane.kind == "launcher":
        place = 2
    else:
        place = 1 if lane.marks else 3
    return (place, lane.ranks[0] if lane.ranks else 1 << 30)


def _trim(marks: list[Mark]) -> list[Mark]:
    """At most MAX_MARKS_PER_LANE: root and cascade before context, exits kept."""
    if len(marks) <= MAX_MARKS_PER_LANE:
        return sorted(marks, key=lambda m: m.position)
    keep = sorted(marks, key=lambda m: (m.what != "exit", ROLE_ORDER.get(m.role, 3), m.position))[
        :MAX_MARKS_PER_LANE
    ]
    return sorted(keep, key=lambda m: m.position)


def _arrows(lanes: list[Lane]) -> list[Arrow]:
    """Number the marks; an arrow from the first root mark to the first cascade mark of each
    finding on every other lane."""
    n = 0
    for lane in lanes:
        for mark in lane.marks:
            n += 1
            mark.id = f"m{n}"
    roots = [m for lane in lanes for m in lane.marks if m.role == "root"]
    if not roots:
        return []
    root = min(roots, key=lambda m: (m.position, m.id))
    arrows: list[Arrow] = []
    for lane in lanes:
        seen: set[str | None] = set()
        for mark in lane.marks:
            if mark.role == "cascade" and mark.rule not in seen and len(arrows) < MAX_ARROWS:
                seen.add(mark.rule)
                arrows.append(Arrow(source=root.id, target=mark.id))
    return arrows
