"""Inputs that were not read in full, as lines for people: grouped by what happened to them, a
few paths each. A folder with thousands of checkpoints beside its logs must not bury the report
under one line per skipped file, and a `ddpdoctor run` folder's own reports, expected there, are
not worth a line."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

PATHS_PER_REASON = 5
RUN_REPORTS = frozenset({"report.json", "report.txt", "report.html"})
"""What `ddpdoctor run` writes beside its events.jsonl (supervise.rundir)."""
RUN_EVENTS = "events.jsonl"
OWN_REPORT = "ddpdoctor report"
"""How the scanner says it skipped a report ddpdoctor wrote ("a ddpdoctor report, not a log")."""


def run_reports(sources: list[Any]) -> set[str]:
    """Paths of a run folder's own reports: skipped as ddpdoctor's output, beside the events
    file of that run."""
    run_dirs = {
        posixpath.dirname(s.path) for s in sources if posixpath.basename(s.path) == RUN_EVENTS
    }
    return {
        s.path
        for s in sources
        if s.status == "skipped"
        and OWN_REPORT in (s.reason or "")
        and posixpath.basename(s.path) in RUN_REPORTS
        and posixpath.dirname(s.path) in run_dirs
    }


def problem_lines(sources: Iterable[Any], limit: int = PATHS_PER_REASON) -> list[str]:
    """`status: path: reason` for each input not read in full (a run folder's own reports
    excepted); past `limit` inputs with the same status and reason, one line counts the rest."""
    sources = list(sources)
    expected = run_reports(sources)
    groups: dict[tuple[str, str], list[str]] = {}
    for s in sources:
        if s.status != "read" and s.path not in expected:
            groups.setdefault((s.status, s.reason or ""), []).append(s.path)
    lines: list[str] = []
    for (status, reason), paths in groups.items():
        lines += [f"{status}: {path}: {reason}" for path in paths[:limit]]
        if len(paths) > limit:
            lines.append(f"{status}: {len(paths) - limit} more: {reason}")
    return lines
