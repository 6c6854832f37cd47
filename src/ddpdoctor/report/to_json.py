"""The JSON report, exactly the `ddpdoctor.report/v1` contract of design.md (additions only)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ddpdoctor.model.findings import Evidence, Report
from ddpdoctor.model.records import SourceInfo
from ddpdoctor.model.timeline import Mark, Timeline
from ddpdoctor.report.flight import flight_to_dict
from ddpdoctor.report.timeline import build_timeline

SCHEMA = "ddpdoctor.report/v1"


def _time(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _evidence(e: Evidence) -> dict[str, Any]:
    return {
        "source": e.source,
        "line": e.line,
        "rank": e.rank,
        "host": e.host,
        "time": _time(e.time),
        "text": e.text,
    }


def _source(s: SourceInfo) -> dict[str, Any]:
    return {
        "path": s.path,
        "bytes": s.bytes,
        "lines": s.lines,
        "status": s.status,
        "reason": s.reason,
    }


def _mark(m: Mark) -> dict[str, Any]:
    return {
        "id": m.id,
        "what": m.what,
        "role": m.role,
        "label": m.label,
        "rule": m.rule,
        "time": _time(m.time),
        "source": m.source,
        "line": m.line,
        "text": m.text,
        "position": round(m.position, 4),
        "ranks": m.ranks,
    }


def timeline_to_dict(t: Timeline) -> dict[str, Any]:
    return {
        "axis": t.axis,
        "start": _time(t.start),
        "end": _time(t.end),
        "grouped": t.grouped,
        "ranks": t.ranks,
        "lanes": [
            {
                "id": lane.id,
                "label": lane.label,
                "kind": lane.kind,
                "ranks": lane.ranks,
                "hosts": lane.hosts,
                "culprit": lane.culprit,
                "marks": [_mark(m) for m in lane.marks],
            }
            for lane in t.lanes
        ],
        "arrows": [{"from": a.source, "to": a.target} for a in t.arrows],
    }


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as JSON data; the timeline is built here when the report was not shown
    through report.view (which builds it and cleans it with the rest)."""
    v = report.verdict
    job = report.job
    return {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": report.tool_version},
        "verdict": {
            "status": v.status,
            "kind": v.kind,
            "category": v.category,
            "rule": v.rule,
            "title": v.title,
            "confidence": v.confidence,
            "culprit": {"ranks": list(v.culprit.ranks), "hosts": list(v.culprit.hosts)},
            "summary": v.summary,
            "fix": list(v.fix),
            "evidence": [_evidence(e) for e in v.evidence],
            "next_steps": list(v.next_steps),
            "confidence_basis": list(v.basis),
        },
        "findings": [
            {
                "rule": f.rule,
                "kind": f.kind,
                "category": f.category,
                "role": f.role,
                "title": f.title,
                "ranks": f.ranks,
                "hosts": f.hosts,
                "first_time": _time(f.first_time),
                "count": f.count,
                "evidence": [_evidence(e) for e in f.evidence],
            }
            for f in report.findings
        ],
        "job": {
            "world_size": job.world_size,
            "ranks_seen": job.ranks_seen,
            "ranks_missing": job.ranks_missing,
            "hosts": job.hosts,
            "exit": {
                "code": job.exit_code,
                "signal": job.exit_signal,
                "per_rank": {
                    str(rank): {
                        "code": e.code,
                        "signal": e.signal,
                        "host": e.host,
                        "local_rank": e.local_rank,
                        "pid": e.pid,
                    }
                    for rank, e in sorted(job.per_rank.items())
                },
            },
            "launcher_root_cause_rank": job.launcher_root_cause_rank,
            "flight_recorder": flight_to_dict(job.flight),
            "last_progress": {
                str(rank): _evidence(e) for rank, e in sorted(job.last_progress.items())
            },
        },
        "sources": [_source(s) for s in report.sources],
        "timeline": timeline_to_dict(report.timeline or build_timeline(report)),
    }


def to_json(report: Report) -> str:
    return json.dumps(report_to_dict(report), indent=2, ensure_ascii=False)
