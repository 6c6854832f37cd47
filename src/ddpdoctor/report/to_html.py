"""A self-contained HTML report, one file to attach to a ticket: the verdict, its evidence as
quoted lines (file:line, rank, host), what to do, every finding with all its evidence (folded),
the job's ranks and exits, and the sources read or skipped. Stdlib only; inline CSS; no script."""

from __future__ import annotations

from html import escape

from ddpdoctor.model.findings import Evidence, Finding, JobInfo, Report
from ddpdoctor.report.flight import headline, table_rows
from ddpdoctor.report.ranges import rank_ranges

STATUS_COLOUR = {
    "failed": "#b42318",
    "hung": "#b54708",
    "slow": "#b54708",
    "ok": "#067647",
    "unknown": "#6941c6",
}
CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:70em;
padding:0 1em;color:#1d2939;background:#fff}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid
#eaecf0;padding-bottom:.2em}.badge{display:inline-block;color:#fff;border-radius:4px;
padding:.1em .6em;font-weight:600;letter-spacing:.03em}.meta{color:#475467}.culprit{font-weight:600;
color:#155eef}code,pre{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:#f9fafb;border:1px solid #eaecf0;border-radius:4px;padding:.5em .7em;margin:.2em 0
.8em;white-space:pre-wrap;word-break:break-word}.where{color:#475467;font-size:.9em}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3em .6em;
border-bottom:1px solid #eaecf0;vertical-align:top}th{background:#f9fafb}
.role-root{color:#b42318;font-weight:600}.role-cascade{color:#475467}.skipped{color:#b54708}
details summary{cursor:pointer;color:#155eef}footer{margin-top:2em;color:#98a2b3;font-size:.85em}
"""


def to_html(report: Report, width: int = 110) -> str:
    """The whole page; `width` is accepted for the renderer interface (the page reflows)."""
    v = report.verdict
    colour = STATUS_COLOUR.get(v.status, "#344054")
    title = f"ddpdoctor: {v.status} {v.kind or ''}".strip()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        "<header>",
        f'<span class="badge" style="background:{colour}">{escape(v.status.upper())}</span>',
    ]
    if v.kind:
        parts.append(
            f' <strong>{escape(v.kind)}</strong> <span class="meta">({escape(v.category or "")})'
            f" rule {escape(v.rule or '')}, confidence {v.confidence:.2f}</span>"
        )
    parts.append(f"<h1>{escape(v.title)}</h1>")
    culprit = _culprit(v.culprit.ranks, v.culprit.hosts)
    if culprit:
        parts.append(f'<p class="culprit">Culprit: {escape(culprit)}</p>')
    parts += ["</header>", f"<p>{escape(v.summary)}</p>"]
    if v.evidence:
        parts.append("<h2>Evidence</h2>")
        parts += [_quote(e) for e in v.evidence]
    steps = [*v.fix, *v.next_steps]
    if steps:
        parts.append("<h2>What to do</h2><ol>")
        parts += [f"<li>{escape(step)}</li>" for step in steps]
        parts.append("</ol>")
    if report.findings:
        parts.append("<h2>Findings</h2>")
        parts.append(_findings(report.findings))
    if report.job.flight is not None:
        parts.append(_flight(report))
    parts.append("<h2>Job</h2>")
    parts.append(_job(report.job))
    parts.append("<h2>Sources</h2>")
    parts.append(_sources(report.sources))
    parts.append(f"<footer>ddpdoctor {escape(report.tool_version)}</footer></body></html>")
    return "\n".join(parts) + "\n"


def _culprit(ranks: list[int], hosts: list[str]) -> str:
    out = []
    if ranks:
        out.append(("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)))
    if hosts:
        out.append(("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts))
    return "; ".join(out)


def _where(e: Evidence) -> str:
    bits = [f"<code>{escape(e.source)}:{e.line}</code>"]
    if e.rank is not None:
        bits.append(f"rank {e.rank}")
    if e.host:
        bits.append(escape(e.host))
    if e.time is not None:
        bits.append(escape(e.time.isoformat()))
    return '<div class="where">' + " &middot; ".join(bits) + "</div>"


def _quote(e: Evidence) -> str:
    return _where(e) + f"<pre>{escape(e.text)}</pre>"


def _findings(findings: list[Finding]) -> str:
    rows = [
        "<table><thead><tr><th>role</th><th>rule</th><th>kind</th><th>ranks</th><th>n</th>"
        "<th>what and where</th></tr></thead><tbody>"
    ]
    for f in findings:
        first = f.evidence[0] if f.evidence else None
        where = f"<code>{escape(first.source)}:{first.line}</code>" if first else ""
        detail = ""
        if f.evidence:
            quotes = "".join(_quote(e) for e in f.evidence)
            detail = f"<details><summary>{len(f.evidence)} line(s)</summary>{quotes}</details>"
        rows.append(
            f'<tr><td class="role-{escape(f.role)}">{escape(f.role)}</td>'
            f"<td>{escape(f.rule)}</td><td>{escape(f.kind)}</td>"
            f"<td>{escape(','.join(map(str, f.ranks)) or '-')}</td><td>{f.count}</td>"
            f"<td>{escape(f.title)}<br>{where}{detail}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)


def _job(job: JobInfo) -> str:
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
    out = "<ul>" + "".join(f"<li>{escape(x)}</li>" for x in facts) + "</ul>"
    if job.per_rank:
        out += "<table><thead><tr><th>rank</th><th>exit</th><th>host</th><th>local rank</th>"
        out += "<th>pid</th></tr></thead><tbody>"
        for rank, e in sorted(job.per_rank.items()):
            code = "" if e.code is None else str(e.code)
            code += f" ({e.signal})" if e.signal else ""
            out += (
                f"<tr><td>{rank}</td><td>{escape(code)}</td><td>{escape(e.host or '')}</td>"
                f"<td>{'' if e.local_rank is None else e.local_rank}</td>"
                f"<td>{'' if e.pid is None else e.pid}</td></tr>"
            )
        out += "</tbody></table>"
    return out


def _flight(report: Report) -> str:
    """The recorders side by side: what diverged, then the last collectives of each rank."""
    a = report.job.flight
    if a is None:
        return ""
    out = [f'<h2>Flight Recorder</h2><p class="meta">{escape(headline(a))}</p>']
    if a.divergences:
        out.append("<ul>")
        out += [
            f"<li><strong>{escape(d.kind)}</strong>: {escape(d.summary)}</li>"
            for d in a.divergences
        ]
        out.append("</ul>")
    header, rows = table_rows(a)
    if rows:
        out.append("<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header))
        out.append("</tr></thead><tbody>")
        for diverges, cells in rows:
            css = ' class="role-root"' if diverges else ""
            out.append(f"<tr{css}>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
        out.append("</tbody></table>")
    out += [f'<p class="meta">note: {escape(n)}</p>' for n in a.notes]
    return "".join(out)


def _sources(sources: list[object]) -> str:
    rows = [
        "<table><thead><tr><th>source</th><th>status</th><th>bytes</th><th>lines</th>"
        "</tr></thead><tbody>"
    ]
    for s in sources:
        status = str(getattr(s, "status", ""))
        reason = getattr(s, "reason", None)
        shown = escape(status + (f": {reason}" if reason else ""))
        css = "" if status == "read" else ' class="skipped"'
        rows.append(
            f"<tr><td><code>{escape(str(getattr(s, 'path', '')))}</code></td>"
            f"<td{css}>{shown}</td><td>{getattr(s, 'bytes', '')}</td>"
            f"<td>{getattr(s, 'lines', '')}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)
