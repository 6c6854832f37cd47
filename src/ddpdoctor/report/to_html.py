"""A self-contained HTML report, one file to attach to a ticket: the verdict, its evidence as
quoted lines (file:line, rank, host), what to do, the failure timeline (inline SVG: one lane per
rank or group of ranks, the root marked, arrows to its cascade), every finding with all its
evidence (folded), the job's ranks and exits, and the sources read or skipped. Rendered by a
Jinja2 template with autoescape on; inline CSS; no script, nothing fetched."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2

from ddpdoctor.model.findings import JobInfo, Report
from ddpdoctor.model.timeline import Timeline
from ddpdoctor.report.drawing import draw
from ddpdoctor.report.flight import headline, table_rows
from ddpdoctor.report.ranges import rank_ranges
from ddpdoctor.report.summary import summary_body
from ddpdoctor.report.timeline import build_timeline

STATUS_COLOUR = {
    "failed": "#b42318",
    "hung": "#b54708",
    "slow": "#b54708",
    "ok": "#067647",
    "unknown": "#6941c6",
}
LEGEND = (
    ("error", "error the rank reported"),
    ("timeout", "timeout in a collective"),
    ("lost-peer", "lost a peer"),
    ("launcher", "launcher's reaction"),
    ("signal", "stopped by a signal"),
    ("hang", "hang detected"),
    ("stacks", "stack dump"),
    ("progress", "last progress"),
    ("context", "other line"),
    ("exit", "exit"),
)
CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:70em;
padding:0 1em;color:#1d2939;background:#fff}p,li,td{overflow-wrap:anywhere}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid
#eaecf0;padding-bottom:.2em}.badge{display:inline-block;color:#fff;border-radius:4px;
padding:.1em .6em;font-weight:600;letter-spacing:.03em}.meta{color:#475467}.culprit{font-weight:600;
color:#155eef}code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
code.loc{white-space:nowrap}
pre{background:#f9fafb;border:1px solid #eaecf0;border-radius:4px;padding:.5em .7em;margin:.2em 0
.8em;white-space:pre-wrap;word-break:break-word}.where{color:#475467;font-size:.9em}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3em .6em;
border-bottom:1px solid #eaecf0;vertical-align:top}th{background:#f9fafb}
.role-root,.culprit-lane{color:#b42318;font-weight:600}.role-cascade{color:#b54708}.skipped{color:#b54708}
details summary{cursor:pointer;color:#155eef}footer{margin-top:2em;color:#98a2b3;font-size:.85em}
.timeline-figure{margin:0}svg.timeline{display:block;font:12px system-ui,sans-serif;
border:1px solid #eaecf0;border-radius:4px;background:#fff}
.lane-bg{fill:#fff}.lane:nth-of-type(even) .lane-bg{fill:#f9fafb}
.lane.culprit .lane-bg{fill:#fef3f2}
.lane-label{fill:#344054}.lane.culprit .lane-label{fill:#b42318;font-weight:600}
.lane-line{stroke:#d0d5dd;stroke-width:1}.tick{stroke:#eaecf0;stroke-dasharray:2 3}
.tick-label,.axis-label{fill:#667085;font-size:11px;text-anchor:middle}.axis-label{text-anchor:start}
.mark circle,.mark path,.mark rect{stroke:#fff;stroke-width:1}
.role-root circle,.role-root path,.role-root rect{fill:#b42318}
.role-cascade circle,.role-cascade path,.role-cascade rect{fill:#dc6803}
.role-context circle,.role-context path,.role-context rect{fill:#98a2b3}
.what-progress circle{fill:#fff;stroke:#067647;stroke-width:2}
.mark .hollow{fill:#fff;stroke-width:1.6}.role-root .hollow{stroke:#b42318}
.role-cascade .hollow{stroke:#dc6803}.role-context .hollow{stroke:#667085}
.what-exit rect{fill:#344054}.exit-label{fill:#344054;font-size:11px}
.root-marker .root-ring,.key .root-ring{fill:none;stroke:#b42318;stroke-width:2.2}
.root-text{fill:#b42318;font-size:9px;font-weight:700;text-anchor:middle;letter-spacing:.05em}
.arrow{fill:none;stroke:#b42318;stroke-width:1.3;stroke-opacity:.55}.arrowhead{fill:#b42318}
.legend{color:#475467;font-size:.85em;margin:.4em 0 .8em}.legend .key{margin-right:1.1em;
white-space:nowrap}.legend svg{vertical-align:middle}ol.marks{margin:0;padding-left:1.2em}
"""


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ddpdoctor.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["rank_ranges"] = rank_ranges
    return env.get_template("report.html.j2")


def to_html(report: Report, width: int = 110) -> str:
    """The whole page; `width` is accepted for the renderer interface (the page reflows)."""
    v = report.verdict
    timeline = report.timeline or build_timeline(report)
    flight = report.job.flight
    context: dict[str, Any] = {
        "page_title": f"ddpdoctor: {v.status} {v.kind or ''}".strip(),
        "css": CSS,
        "v": v,
        "colour": STATUS_COLOUR.get(v.status, "#344054"),
        "culprit": _culprit(v.culprit.ranks, v.culprit.hosts),
        "summary": summary_body(v),
        "steps": [*v.fix, *v.next_steps],
        "drawing": draw(timeline),
        "timeline_note": _note(timeline),
        "legend": [(w, t) for w, t in LEGEND if _shown(timeline, w)],
        "findings": report.findings,
        "flight": None,
        "job_facts": _job_facts(report.job),
        "per_rank": _per_rank(report.job),
        "sources": report.sources,
        "version": report.tool_version,
    }
    if flight is not None:
        header, rows = table_rows(flight)
        context["flight"] = {
            "headline": headline(flight),
            "divergences": flight.divergences,
            "header": header,
            "rows": rows,
            "notes": flight.notes,
        }
    return _template().render(context)


def _shown(t: Timeline, what: str) -> bool:
    return any(m.what == what for lane in t.lanes for m in lane.marks)


def _note(t: Timeline) -> str:
    lanes = len(t.lanes)
    text = f"{t.ranks} rank(s) on {lanes} lane(s)"
    if t.grouped:
        text += "; ranks that behaved alike share a lane"
    text += "; hover a mark for its line" if t.axis == "time" else "; ordered by line"
    return text + "."


def _culprit(ranks: list[int], hosts: list[str]) -> str:
    out = []
    if ranks:
        out.append(("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)))
    if hosts:
        out.append(("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts))
    return "; ".join(out)


def _job_facts(job: JobInfo) -> list[str]:
    facts = [
        f"world size: {job.world_size if job.world_size is not None else 'unknown'}",
        f"ranks seen: {rank_ranges(job.ranks_seen) or 'none'}",
    ]
    if job.ranks_missing:
        facts.append(f"ranks with no lines: {rank_ranges(job.ranks_missing)}")
    if job.hosts:
        facts.append(f"hosts: {', '.join(job.hosts)}")
    if job.exit_code is not None:
        facts.append(
            f"exit: {job.exit_code}" + (f" ({job.exit_signal})" if job.exit_signal else "")
        )
    return facts


def _per_rank(job: JobInfo) -> list[list[str]]:
    rows = []
    for rank, e in sorted(job.per_rank.items()):
        code = "" if e.code is None else str(e.code)
        code += f" ({e.signal})" if e.signal else ""
        rows.append(
            [
                str(rank),
                code,
                e.host or "",
                "" if e.local_rank is None else str(e.local_rank),
                "" if e.pid is None else str(e.pid),
            ]
        )
    return rows
