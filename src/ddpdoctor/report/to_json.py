"""The JSON report, exactly the `ddpdoctor.report/v1` contract of design.md (additions only)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ddpdoctor.model.findings import Evidence, Report
from ddpdoctor.model.records import SourceInfo
from ddpdoctor.report.flight import flight_to_dict

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


def report_to_dict(report: Report) -> dict[str, Any]:
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
        },
        "sources": [_source(s) for s in report.sources],
    }


def to_json(report: Report) -> str:
    return json.dumps(report_to_dict(report), indent=2, ensure_ascii=False)
