"""Inputs that were not read in full, as lines for people: grouped by what happened to them, a
few paths each. A folder with thousands of checkpoints beside its logs must not bury the report
under one line per skipped file."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PATHS_PER_REASON = 5


def problem_lines(sources: Iterable[Any], limit: int = PATHS_PER_REASON) -> list[str]:
    """`status: path: reason` for each input not read in full; past `limit` inputs with the same
    status and reason, one line counts the rest."""
    groups: dict[tuple[str, str], list[str]] = {}
    for s in sources:
        if s.status != "read":
            groups.setdefault((s.status, s.reason or ""), []).append(s.path)
    lines: list[str] = []
    for (status, reason), paths in groups.items():
        lines += [f"{status}: {path}: {reason}" for path in paths[:limit]]
        if len(paths) > limit:
            lines.append(f"{status}: {len(paths) - limit} more: {reason}")
    return lines
