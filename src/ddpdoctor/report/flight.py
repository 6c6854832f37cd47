"""The Flight Recorder part of the reports: the JSON view under `job.flight_recorder`, and the
compact cross-rank table (one line per sequence id, one column per rank) that the text and HTML
reports show. Renders the analysis; decides nothing."""

from __future__ import annotations

from typing import Any

from ddpdoctor.model.flight import FlightAnalysis, FlightCall, FlightDivergence, FlightRow

MAX_TABLE_RANKS = 8
"""Columns of the cross-rank table: the ranks the divergences name first, then the lowest."""


def call_to_dict(call: FlightCall) -> dict[str, Any]:
    return {
        "rank": call.rank,
        "group": call.pg,
        "group_desc": call.pg_desc,
        "seq": call.seq,
        "op": call.op,
        "input_sizes": call.input_sizes,
        "input_dtypes": call.input_dtypes,
        "site": call.site,
        "file": call.file,
        "line": call.line,
        "function": call.func,
        "source": call.source,
    }


def divergence_to_dict(d: FlightDivergence) -> dict[str, Any]:
    return {
        "kind": d.kind,
        "group": d.pg,
        "group_desc": d.pg_desc,
        "seq": d.seq,
        "ranks": d.ranks,
        "others": d.others,
        "fields": d.fields,
        "ambiguous": d.ambiguous,
        "summary": d.summary,
        "calls": [call_to_dict(c) for c in d.calls],
    }


def flight_to_dict(a: FlightAnalysis | None) -> dict[str, Any] | None:
    """The recorder's view for `job.flight_recorder` (None when no dump was read)."""
    if a is None:
        return None
    return {
        "world_size": a.world_size,
        "ranks_with_dump": a.ranks_with_dump,
        "ranks_without_dump": a.ranks_without_dump,
        "per_rank": [
            {
                "rank": v.rank,
                "group": v.pg,
                "group_desc": v.pg_desc,
                "last_issued": v.last_issued,
                "last_enqueued": v.status.last_enqueued,
                "last_started": v.status.last_started,
                "last_completed": v.status.last_completed,
                "last": call_to_dict(v.last_call) if v.last_call else None,
                "source": v.source,
            }
            for v in a.views
        ],
        "divergences": [divergence_to_dict(d) for d in a.divergences],
        "table": [
            {
                "group": row.pg,
                "group_desc": row.pg_desc,
                "seq": row.seq,
                "diverges": row.diverges,
                "cells": {
                    str(r): call_to_dict(c) if c else None for r, c in sorted(row.cells.items())
                },
            }
            for row in a.table
        ],
        "notes": a.notes,
        "sources": a.sources,
    }


def table_ranks(a: FlightAnalysis) -> list[int]:
    """The columns: ranks named by divergences first, then the others, at most MAX_TABLE_RANKS."""
    named = [r for d in a.divergences for r in (*d.ranks, *d.others)]
    every = sorted({r for row in a.table for r in row.cells})
    ordered = list(dict.fromkeys([*named, *every]))
    return sorted(r for r in ordered[:MAX_TABLE_RANKS] if r in every)


def cell_text(call: FlightCall | None) -> str:
    """`all_reduce [1024] @ train.py:57`, or `-` for a rank that never issued the op."""
    if call is None:
        return "-"
    sizes = ",".join("x".join(map(str, s)) for s in call.input_sizes[:2])
    text = call.op + (f" [{sizes}]" if sizes else "")
    return text + (f" @ {call.site}" if call.site else "")


def group_label(row: FlightRow) -> str:
    return row.pg_desc if row.pg_desc and row.pg_desc != "undefined" else f"group {row.pg}"


def table_rows(a: FlightAnalysis) -> tuple[list[str], list[tuple[bool, list[str]]]]:
    """Header and rows (diverges, cells) of the cross-rank table, as text."""
    ranks = table_ranks(a)
    header = ["group", "#", *(f"rank {r}" for r in ranks)]
    rows = [
        (
            row.diverges,
            [group_label(row), str(row.seq), *(cell_text(row.cells.get(r)) for r in ranks)],
        )
        for row in a.table
    ]
    return header, rows


def headline(a: FlightAnalysis) -> str:
    """One line: what the recorders say, for the top of the table."""
    with_dump = ",".join(map(str, a.ranks_with_dump)) or "none"
    text = f"dumps from ranks {with_dump}"
    if a.ranks_without_dump:
        text += "; none from ranks " + ",".join(map(str, a.ranks_without_dump))
    return text
