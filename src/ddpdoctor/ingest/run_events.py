"""The events file `ddpdoctor run` writes (events.jsonl): exact per-rank exit codes and the hangs
it caught with their stack diagnosis. Read as structured facts, never scanned as a log."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"


@dataclass(slots=True)
class RunHang:
    kind: str
    taxonomy_kind: str | None
    culprit_ranks: list[int]
    summary: str
    groups: list[dict[str, Any]]
    time: str | None
    source: str
    activities: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Where each rank was (category, op, site, source), from its stack."""


@dataclass(slots=True)
class RunEvents:
    source: str
    per_rank_exit: dict[int, int] = field(default_factory=dict)
    exit_code: int | None = None
    hangs: list[RunHang] = field(default_factory=list)
    killed_for_hang: bool = False
    stopped: bool = False
    """The job was stopped from outside: ddpdoctor's kill after a hang, or a signal (Ctrl-C,
    SIGTERM) that `run` forwarded to it."""
    start_error: str | None = None
    """Why the job never started (`ddpdoctor run` could not start the command)."""
    facts: int = 0
    """How many records say something about the job (exits, stacks); a start alone says
    nothing."""


def is_events_file(path: str) -> bool:
    """An events.jsonl whose first record is a `ddpdoctor run` start event."""
    if Path(path).name != EVENTS_NAME:
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return False
    if not isinstance(first, dict):
        return False
    started = first.get("event") == "start" and "run_id" in first
    return started or (first.get("event") == "start_failed" and "argv" in first)


def read_events(path: str) -> RunEvents:
    events = RunEvents(source=path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return events
    for number, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind = rec.get("event")
        if kind in ("exit", "stacks"):
            events.facts += 1
        if kind == "start_failed":
            events.start_error = str(rec.get("error") or "the command could not be started")
        if kind == "exit":
            per_rank = rec.get("per_rank") or {}
            events.per_rank_exit = {int(k): int(v) for k, v in per_rank.items() if v is not None}
            code = rec.get("code")
            events.exit_code = int(code) if isinstance(code, int) else None
        elif kind == "stacks":
            diag = rec.get("diagnosis") or {}
            events.hangs.append(
                RunHang(
                    kind=str(diag.get("kind", "hang")),
                    taxonomy_kind=diag.get("taxonomy_kind"),
                    culprit_ranks=[int(r) for r in diag.get("culprit_ranks") or []],
                    summary=str(diag.get("summary", "")),
                    groups=list(diag.get("groups") or []),
                    time=rec.get("time"),
                    source=f"{path}:{number}",
                    activities=_activities(diag.get("activities")),
                )
            )
        elif kind == "kill" and rec.get("reason") == "hang":
            events.killed_for_hang = True
            events.stopped = True
        elif kind == "signal_forwarded":
            events.stopped = True
    return events


def _activities(raw: object) -> dict[int, dict[str, Any]]:
    """{rank: activity} from a stacks event; labels that are not ranks are left out."""
    if not isinstance(raw, dict):
        return {}
    out: dict[int, dict[str, Any]] = {}
    for label, activity in raw.items():
        tail = str(label).removeprefix("rank ")
        if tail.isdigit() and len(tail) <= 7 and isinstance(activity, dict):
            out[int(tail)] = {k: v for k, v in activity.items() if isinstance(v, str)}
    return out
