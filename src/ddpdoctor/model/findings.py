"""Findings, verdicts and the report: the values every later layer produces and renders.
Diagnoses are values, never exceptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ddpdoctor.model.flight import FlightAnalysis
from ddpdoctor.model.records import Record
from ddpdoctor.model.timeline import Timeline
from ddpdoctor.model.transfer import by_fields


@dataclass(slots=True)
class Evidence:
    source: str
    line: int
    rank: int | None
    host: str | None
    time: datetime | None
    text: str

    @classmethod
    def of(cls, record: Record, text: str | None = None) -> Evidence:
        return cls(
            source=record.source,
            line=record.line,
            rank=record.origin.rank,
            host=record.origin.host,
            time=record.time,
            text=text if text is not None else record.text,
        )


@by_fields
@dataclass(slots=True)
class Hit:
    """One rule signature that matched one line, with its captures and surrounding traceback."""

    rule: str
    record: Record
    captures: dict[str, str]
    context: list[Record] = field(default_factory=list)
    """Earlier lines of the same writer's traceback, oldest first (may be empty)."""
    order: int = 0
    """Position of the line in the whole scan: used as a tie-breaker within one source."""
    suggests: bool = False
    """The matching signature only suggests the kind (see rules.base.Signature.suggests)."""
    echo: str | None = None
    """What the line says about its rank as a victim of a failure elsewhere (rules.base.Echo),
    from the rule or the matching signature; None for a line that reports a failure."""
    handled: bool = False
    """Its traceback is one Python printed and carried on from (ingest.tracebacks.carried_on:
    logging's own error, an unraisable exception, an exit-time finalizer): the error did not
    end the process."""
    store_host: bool = False
    """The matching signature is printed only by the rendezvous store's host (rules.base.
    Signature.store_host)."""


@dataclass(slots=True)
class Finding:
    rule: str
    kind: str
    category: str
    role: str
    title: str
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    first_time: datetime | None = None
    count: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list, repr=False)
    note: str | None = None


@dataclass(slots=True)
class Culprit:
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    status: str
    kind: str | None
    category: str | None
    rule: str | None
    title: str
    confidence: float
    culprit: Culprit
    summary: str
    fix: list[str]
    evidence: list[Evidence]
    next_steps: list[str] = field(default_factory=list)
    basis: list[str] = field(default_factory=list)
    """What the confidence rests on: '+ ...' for, '- ...' against."""


@dataclass(slots=True)
class RankExit:
    code: int | None
    signal: str | None = None
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None


@dataclass(slots=True)
class JobInfo:
    world_size: int | None = None
    ranks_seen: list[int] = field(default_factory=list)
    ranks_missing: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    exit_code: int | None = None
    exit_signal: str | None = None
    per_rank: dict[int, RankExit] = field(default_factory=dict)
    launcher_root_cause_rank: int | None = None
    flight: FlightAnalysis | None = None
    """The Flight Recorder dumps among the inputs, read across ranks (None: no dump given)."""
    last_progress: dict[int, Evidence] = field(default_factory=dict)
    """The last progress line (step, epoch, loss) each rank printed, for the timeline. Empty
    until the analysis fills it from its job facts (analysis.job keeps them in JobView)."""


@dataclass(slots=True)
class Report:
    tool_version: str
    verdict: Verdict
    findings: list[Finding]
    job: JobInfo
    sources: list[Any]
    timeline: Timeline | None = None
    """Built from the findings by report.timeline when the report is shown (report.view)."""
