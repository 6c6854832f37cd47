"""The events file `ddpdoctor run` writes (events.jsonl): exact per-rank exit codes and the hangs
it caught with their stack diagnosis. Read as structured facts, never scanned as a log."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddpdoctor.ingest.bounds import exit_code_number, plausible_time, rank_number
from ddpdoctor.ingest.filenames import display_name

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


MAX_EVENT_LINE_BYTES = 4 * 1024 * 1024
"""An event `ddpdoctor run` writes is a few KB; a longer line is not one of them."""
MAX_GROUPS = 64


def is_events_file(path: str) -> bool:
    """A regular JSON-lines file (events.jsonl, or renamed keeping its .jsonl) whose first
    record is a `ddpdoctor run` start event: the content decides, not the name."""
    if not path.endswith(".jsonl"):  # a string test: this runs on every input file
        return False
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO of that name would block open
            return False
        with open(path, "rb") as f:
            first = _record(f.readline(MAX_EVENT_LINE_BYTES) or b"{}")
    except OSError:
        return False
    if first is None:
        return False
    started = first.get("event") == "start" and "run_id" in first
    return started or (first.get("event") == "start_failed" and "argv" in first)


def read_events(path: str) -> RunEvents:
    """The facts of an events file, each field checked: a hand-edited or corrupt file (wrong
    types, NaN, huge numbers, bad dates, deep nesting) loses the fields that are wrong, never
    the diagnosis."""
    events = RunEvents(source=path)
    try:
        with open(path, "rb") as f:
            number = 0
            while line := f.readline(MAX_EVENT_LINE_BYTES):
                number += 1
                if not line.endswith(b"\n") and len(line) == MAX_EVENT_LINE_BYTES:
                    while (rest := f.readline(MAX_EVENT_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass  # the rest of an overlong line
                    continue
                rec = _record(line)
                if rec is not None:
                    _apply(events, rec, f"{display_name(path)}:{number}")
    except OSError:
        return events
    return events


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # deep nesting exhausts the decoder's recursion
        return None
    return rec if isinstance(rec, dict) else None


def _apply(events: RunEvents, rec: dict[str, Any], where: str) -> None:
    kind = rec.get("event")
    if kind in ("exit", "stacks"):
        events.facts += 1
    if kind == "start_failed":
        events.start_error = _str(rec.get("error")) or "the command could not be started"
    if kind == "exit":
        per_rank = rec.get("per_rank")
        if isinstance(per_rank, dict):
            exits = {rank_number(str(k)): _int(v, exit_code_number) for k, v in per_rank.items()}
            events.per_rank_exit = {
                r: c for r, c in exits.items() if r is not None and c is not None
            }
        events.exit_code = _int(rec.get("code"), exit_code_number)
    elif kind == "stacks":
        diag = rec.get("diagnosis")
        diag = diag if isinstance(diag, dict) else {}
        ranks = diag.get("culprit_ranks")
        culprits = [_int(r, rank_number) for r in ranks] if isinstance(ranks, list) else []
        events.hangs.append(
            RunHang(
                kind=_str(diag.get("kind")) or "hang",
                taxonomy_kind=_str(diag.get("taxonomy_kind")),
                culprit_ranks=sorted({r for r in culprits if r is not None}),
                summary=_str(diag.get("summary")) or "",
                groups=_groups(diag.get("groups")),
                time=_time(rec.get("time")),
                source=where,
                activities=_activities(diag.get("activities")),
            )
        )
    elif kind == "kill" and rec.get("reason") == "hang":
        events.killed_for_hang = True
        events.stopped = True
    elif kind == "signal_forwarded":
        events.stopped = True


def _int(value: object, parse: Callable[[str], int | None]) -> int | None:
    """A JSON integer within the bounds `parse` checks (not a bool, float, NaN or string)."""
    return parse(str(value)) if type(value) is int else None


def _str(value: object, limit: int = 4000) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _time(value: object) -> str | None:
    """An ISO time that later steps can parse and compare: UTC, in range, or None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = plausible_time(datetime.fromisoformat(value))
    except ValueError:
        return None
    return parsed.isoformat() if parsed else None


def _groups(value: object) -> list[dict[str, Any]]:
    """Stack groups as the supervisor writes them: who (rank labels) and where (a code line)."""
    if not isinstance(value, list):
        return []
    groups: list[dict[str, Any]] = []
    for g in value[:MAX_GROUPS]:
        if not isinstance(g, dict):
            continue
        who = g.get("who")
        labels = (
            [str(w)[:80] for w in who[:MAX_GROUPS] if isinstance(w, str | int)]
            if isinstance(who, list)
            else _str(who, 200)
        )
        groups.append({"who": labels, "where": _str(g.get("where"), 400) or "?"})
    return groups


def _activities(raw: object) -> dict[int, dict[str, Any]]:
    """{rank: activity} from a stacks event; labels that are not ranks are left out."""
    if not isinstance(raw, dict):
        return {}
    out: dict[int, dict[str, Any]] = {}
    for label, activity in list(raw.items())[: MAX_GROUPS * 1024]:
        rank = rank_number(str(label).removeprefix("rank "))
        if rank is not None and isinstance(activity, dict):
            out[rank] = {k: v[:400] for k, v in activity.items() if isinstance(v, str)}
    return out
