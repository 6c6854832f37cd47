"""The text report: rich renderables at a fixed width (100 columns by default), readable without
colour. Tests render with no colour and compare text."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ddpdoctor.model.findings import Evidence, Report
from ddpdoctor.report.flight import headline, table_rows
from ddpdoctor.report.problems import problem_lines
from ddpdoctor.report.ranges import rank_ranges

STATUS_STYLE = {
    "failed": "bold red",
    "hung": "bold yellow",
    "slow": "bold yellow",
    "ok": "bold green",
    "unknown": "bold magenta",
}
MAX_TEXT = 300


def _where(e: Evidence) -> str:
    parts = [f"{e.source}:{e.line}"]
    if e.rank is not None:
        parts.append(f"rank {e.rank}")
    if e.host:
        parts.append(e.host)
    return "  ".join(parts)


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def renderables(report: Report) -> list[RenderableType]:
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
    lines.append(Text(v.summary))
    out: list[RenderableType] = [Panel(Group(*lines), title="ddpdoctor verdict", expand=True)]

    if v.evidence:
        ev = Text()
        for i, e in enumerate(v.evidence):
            if i:
                ev.append("\n")
            ev.append(_where(e) + "\n", style="cyan")
            ev.append("  " + _clip(e.text) + "\n")
        out.append(Panel(ev, title="Evidence", expand=True))
    if v.fix or v.next_steps:
        steps = Text()
        for i, step in enumerate([*v.fix, *v.next_steps], 1):
            steps.append(f"{i}. {step}\n")
        out.append(Panel(steps, title="What to do", expand=True))

    if report.findings:
        table = Table(title="Findings", expand=True, show_lines=False)
        table.add_column("role", no_wrap=True)
        table.add_column("rule", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("ranks", overflow="fold", max_width=16)
        table.add_column("n", justify="right")
        table.add_column("first evidence", overflow="fold")
        for f in report.findings:
            first = f.evidence[0] if f.evidence else None
            table.add_row(
                f.role,
                f.rule,
                f.kind,
                ",".join(map(str, f.ranks)) or "-",
                str(f.count),
                f"{first.source}:{first.line}" if first else "",
            )
        out.append(table)

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
    for line in problem_lines(bad):
        src.append(f"\n  {line}", style="yellow")
    out.append(src)
    return out


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
        table.add_row(*cells, style="bold red" if diverges else None)
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
    for r in renderables(report):
        console.print(r)
    return console.export_text(styles=color)


class _NullFile(io.StringIO):
    """Recording consoles render to memory only; nothing goes to the real stdout."""

    def write(self, _s: str) -> int:
        return 0
