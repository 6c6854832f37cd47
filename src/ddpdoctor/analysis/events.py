"""The nodes of the causal graph: one event per (finding, rank, echo), with what the engine
asks of it (is it a primary failure, an echo, a marker; when and where it was first printed).
No decisions here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ddpdoctor.model.findings import Finding, Hit
from ddpdoctor.rules.base import Echo, Marker, Rule

GENERIC_SPECIFICITY = 5
"""Rules at or below this prior are catch-alls (any Python exception, launcher notices)."""


@dataclass(eq=False)
class Event:
    """The hits of one finding on one rank (None: no rank could be told) with one echo."""

    finding: Finding
    rule: Rule
    rank: int | None
    hits: list[Hit]
    echo: Echo | None

    @property
    def primary(self) -> bool:
        """A failure reported by the rank that had it (not an echo, a marker or a notice)."""
        return self.echo is None and self.rule.marker is None and self.rule.severity == "error"

    @property
    def generic(self) -> bool:
        return self.rule.specificity <= GENERIC_SPECIFICITY

    @property
    def crash_like(self) -> bool:
        """How a process dies on its way out (an abort) or loses its peers: after the work
        was done, this is teardown."""
        return self.rule.exit_path or self.echo in (Echo.WAITING, Echo.LOST_PEER)

    @property
    def marker(self) -> Marker | None:
        return self.rule.marker

    @property
    def time(self) -> datetime | None:
        times = [h.record.time for h in self.hits if h.record.time is not None]
        return min(times) if times else None

    @property
    def sources(self) -> set[str]:
        return {h.record.source for h in self.hits}

    def first_line(self, source: str) -> int | None:
        lines = [h.record.line for h in self.hits if h.record.source == source]
        return min(lines) if lines else None


@dataclass(eq=False)
class Node:
    """A cause the logs imply without a line of its own: a hypothesis that won, the end of
    training, an early stop every rank agreed on, a stall `ddpdoctor run` caught."""

    name: str
    rule: Rule | None
    ranks: list[int] = field(default_factory=list)
    time: datetime | None = None


EXIT_REPORT_CAPTURES = frozenset({"signum", "sig", "local_rank", "rank"})
"""What a launcher's report of a worker's signal captures (the number, its name, the rank)."""


def aborted_at_exit(event: Event) -> bool:
    """Its rank's own words are only the abort C++ prints while a process destroys its
    threads at exit ('terminate called without an active exception'), beside the launcher's
    report of that signal: the process had already left its Python code."""
    return any("at_exit" in h.captures for h in event.hits) and all(
        "at_exit" in h.captures or (h.captures and set(h.captures) <= EXIT_REPORT_CAPTURES)
        for h in event.hits
    )


def split(findings: list[Finding], rules: dict[str, Rule]) -> list[Event]:
    """One event per finding, rank and echo, hits in scan order."""
    events: list[Event] = []
    for finding in findings:
        rule = rules[finding.rule]
        by_key: dict[tuple[int | None, str | None], list[Hit]] = {}
        for hit in finding.hits:
            if _own_connection(hit):
                continue
            by_key.setdefault((hit.record.origin.rank, hit.echo), []).append(hit)
        for (rank, echo), hits in by_key.items():
            events.append(Event(finding, rule, rank, hits, Echo(echo) if echo else None))
    return events


def _own_connection(hit: Hit) -> bool:
    """NCCL's proxy service thread names the local rank whose connection closed: its own
    ("[2] ... Connection closed by localRank 2") when this rank's communicator is being torn
    down or aborted (the exit path of a rank, healthy or not), a peer's when that peer went
    away. Only the peer's is an echo of anything."""
    peer = hit.captures.get("peer_local_rank")
    own = hit.record.origin.local_rank
    return peer is not None and own is not None and peer.isdigit() and int(peer) == own
