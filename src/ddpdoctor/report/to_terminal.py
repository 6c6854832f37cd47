"""The text report: rich renderables at a fixed width (100 columns by default), readable without
colour. A `file:line` is never broken across lines (a long path loses its start instead), quoted
lines wrap under their indent, and the timeline is one line per lane. Tests render with no colour
and compare text."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.model.findings import Evidence, Report
from ddpdoctor.model.timeline import Lane, Mark, Timeline
from ddpdoctor.report.durations import clock, duration
from ddpdoctor.report.flight import headline, table_rows
from ddpdoctor.report.problems import problem_lines
from ddpdoctor.report.ranges import rank_ranges
from ddpdoctor.report.summary import summary_body
from ddpdoctor.report.timeline import build_timeline

STATUS_STYLE = {
    "failed": "bold red",
    "hung": "bold yellow",
    "slow": "bold yellow",
    "ok": "bold green",
    "unknown": "bold magenta",
}
MAX_TEXT = 300
PANEL_PADDING = 4
"""Columns a panel takes from the width: two borders, two spaces."""
FINDINGS_OTHER_COLUMNS = 58
"""Columns the findings table needs besides `file:line` (role, rule, kind, ranks, n, borders)."""
MIN_LOCATION = 24


def location(source: str, line: int, limit: int) -> str:
    """`source:line` in at most `limit` columns: a long path loses its start, never the line."""
    text = f"{source}:{line}"
    if len(text) <= limit:
        return text
    keep = max(1, limit - 1)
    return "…" + text[-keep:]


def _where(e: Evidence, limit: int) -> Text:
    tail = ""
    if e.rank is not None:
        tail += f"  rank {e.rank}"
    if e.host:
        tail += f"  {e.host}"
    loc = location(e.source, e.line, max(12, limit - len(tail)))
    return Text(loc + tail, style="cyan", no_wrap=True, overflow="ellipsis")


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def renderables(report: Report, width: int = 100) -> list[RenderableType]:
    v = report.verdict
    head = Text()
    head.append(f"{v.status.upper()}", style=STATUS_STYLE.get(v.status, "bold"))
    if v.kind:
        head.append(f"  {v.kind}", style="bold")
        head.append(f"  ({v.category})")
        head.append(f"  rule {v.rule}  confidence {v.confidence:.2f}", style="dim")
    lines: list[RenderableType] = [head, Text(v.title, style="bold")]
    culprit = []
    if v.culprit.ranks:
        label = "rank " if len(v.culprit.ranks) == 1 else "ranks "
        culprit.append(label + ",".join(map(str, v.culprit.ranks)))
    if v.culprit.hosts:
        label = "host " if len(v.culprit.hosts) == 1 else "hosts "
        culprit.append(label + ",".join(v.culprit.hosts))
    if culprit:
        lines.append(Text("Culprit: " + "; ".join(culprit), style="bold cyan"))
    lines.append(Text(""))
    lines.append(Text(summary_body(v)))
    if v.basis:  # what the confidence rests on, for and against
        lines.append(Text(""))
        lines.append(Text(f"Confidence {v.confidence:.2f}: " + "; ".join(v.basis), style="dim"))
    out: list[RenderableType] = [Panel(Group(*lines), title="ddpdoctor verdict", expand=True)]

    inner = width - PANEL_PADDING
    if v.evidence:
        quotes: list[RenderableType] = []
        for i, e in enumerate(v.evidence):
            if i:
                quotes.append(Text(""))
            quotes.append(_where(e, inner))
            quotes.append(Padding(Text(_clip(e.text)), (0, 0, 0, 2)))  # wraps under its indent
        out.append(Panel(Group(*quotes), title="Evidence", expand=True))
    if v.fix or v.next_steps:
        steps = Table.grid(padding=(0, 1))
        steps.add_column(justify="right", no_wrap=True)
        steps.add_column(ratio=1)
        for i, step in enumerate([*v.fix, *v.next_steps], 1):
            # a long step wraps under its own text; Text, not markup: a fix quotes code and
            # errors ('torch.tensor([int(stop)])', '[/__w/.../pair.cc:553]')
            steps.add_row(f"{i}.", Text(step))
        out.append(Panel(steps, title="What to do", expand=True))

    if report.findings:
        out.append(_findings(report, width))

    timeline = report.timeline or build_timeline(report)
    if timeline.lanes and any(lane.marks for lane in timeline.lanes):
        out.append(_timeline(timeline))

    if report.job.flight is not None:
        out.extend(_flight(report))
    job = report.job
    facts = Text(style="dim")
    facts.append(f"world size: {job.world_size if job.world_size is not None else 'unknown'}")
    if job.ranks_seen:
        facts.append(f"   ranks seen: {rank_ranges(job.ranks_seen)}")
    if job.ranks_missing:
        facts.append(f"   ranks with no lines: {rank_ranges(job.ranks_missing)}")
    if job.hosts:
        facts.append(f"   hosts: {', '.join(job.hosts[:8])}")
    out.append(facts)
    bad = [s for s in report.sources if s.status != "read"]
    read = len(report.sources) - len(bad)
    src = Text(f"sources: {read} read", style="dim")
    for line in problem_lines(report.sources):
        src.append(f"\n  {line}", style="yellow")
    out.append(src)
    return out


def _findings(report: Report, width: int) -> RenderableType:
    """Role, rule, kind, ranks, count and the first `file:line`, which is shortened from the
    left to fit and never wraps."""
    limit = max(MIN_LOCATION, width - FINDINGS_OTHER_COLUMNS)
    locs = [
        location(f.evidence[0].source, f.evidence[0].line, limit) if f.evidence else ""
        for f in report.findings
    ]
    table = Table(title="Findings", expand=True, show_lines=False)
    table.add_column("role", no_wrap=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("kind", no_wrap=True, overflow="ellipsis", min_width=8)
    table.add_column("ranks", overflow="fold", min_width=5, max_width=16)
    table.add_column("n", justify="right", no_wrap=True, min_width=2)
    table.add_column(
        "first evidence", no_wrap=True, min_width=max(len(loc) for loc in locs) or None
    )
    for f, loc in zip(report.findings, locs, strict=True):
        table.add_row(f.role, f.rule, f.kind, rank_ranges(f.ranks) or "-", str(f.count), Text(loc))
    return table


def _timeline(t: Timeline) -> RenderableType:
    """One line per lane (wrapping under itself): each mark as `+3.03 s timeout TMO102`, the
    root as ROOT, cascade marks flagged; ranks that behaved alike share a lane."""
    if t.axis == "time" and t.start is not None:
        title = f"Timeline from {clock(t.start)} UTC"
    else:
        title = "Timeline in line order (the logs carry no timestamps)"
    if t.grouped:
        title += "; ranks that behaved alike share a lane"
    grid = Table(
        title=title, title_justify="left", expand=True, show_header=False, box=None, padding=(0, 1)
    )
    grid.add_column("lane", no_wrap=True, max_width=28, overflow="ellipsis")
    grid.add_column("marks", ratio=1)
    for lane in t.lanes:
        if lane.marks:
            grid.add_row(_lane_label(lane), _lane_marks(lane, t))
    return grid


def _lane_label(lane: Lane) -> Text:
    text = Text(lane.label, style="bold red" if lane.culprit else "")
    if lane.culprit:
        text.append(" <", style="bold red")
    return text


def _lane_marks(lane: Lane, t: Timeline) -> Text:
    out = Text()
    for i, m in enumerate(lane.marks):
        if i:
            out.append(" · ", style="dim")
        out.append_text(_mark_text(m, t))
    return out


def _mark_text(m: Mark, t: Timeline) -> Text:
    if m.what == "exit":
        return Text(m.label, style="bold")
    text = Text()
    if m.time is not None and t.start is not None:
        text.append(f"+{duration((m.time - t.start).total_seconds())} ", style="dim")
    if m.role == "root":
        text.append("ROOT ", style="bold red")
    text.append(m.what, style="red" if m.role == "root" else "")
    if m.rule:
        text.append(f" {m.rule}")
    if m.role == "cascade":
        text.append(" (cascade)", style="yellow")
    if len(m.ranks) > 1:
        text.append(f" x{len(m.ranks)}", style="dim")
    return text


def _flight(report: Report) -> list[RenderableType]:
    """The recorders side by side: what diverged, then the last collectives of each rank."""
    a = report.job.flight
    if a is None:
        return []
    header, rows = table_rows(a)
    table = Table(title=f"Flight Recorder ({headline(a)})", expand=True)
    for i, name in enumerate(header):
        if i == 1:
            table.add_column(name, no_wrap=True, justify="right")
        else:
            table.add_column(name, no_wrap=i < 2, overflow="fold")
    for diverges, cells in rows:
        table.add_row(*map(Text, cells), style="bold red" if diverges else None)
    out: list[RenderableType] = []
    lines = Text()
    for d in a.divergences[:3]:
        lines.append(f"{d.kind}: ", style="bold")
        lines.append(_clip(d.summary, 600) + "\n")
    for note in a.notes[:3]:
        lines.append(f"note: {_clip(note)}\n", style="dim")
    if rows:
        out.append(table)
    if lines:
        out.append(lines)
    return out


def to_text(report: Report, width: int = 100, color: bool = False) -> str:
    console = Console(
        width=width,
        record=True,
        color_system="standard" if color else None,
        force_terminal=color,
        file=_NullFile(),
    )
    for r in renderables(report, width):
        console.print(r)
    return console.export_text(styles=color)


class _NullFile(io.StringIO):
    """Recording consoles render to memory only; nothing goes to the real stdout."""

    def write(self, _s: str) -> int:
        return 0
