"""From raw hits to findings: keep the most specific rule per line, drop the generic
python-exception hit when a specific rule explains the same traceback, and group by rule."""

from __future__ import annotations

import re

from ddpdoctor.model.findings import Evidence, Finding, Hit
from ddpdoctor.model.records import Record
from ddpdoctor.rules.base import Rule

GENERIC_SPECIFICITY = 5
MAX_EVIDENCE = 6


def _line_key(record: Record) -> tuple[str, int]:
    return (record.source, record.line)


def dedupe(
    hits: list[Hit], rules: dict[str, Rule], sources: dict[str, tuple[int, int]] | None = None
) -> list[Hit]:
    """One rule per line (the most specific), and no generic hit inside an explained traceback.
    The same line in two sources (a console and the per-rank file `ddpdoctor run`, torchrun
    --tee or a logger's file sink wrote) is one event. The copy kept is the one whose source
    says most about its writer: the source with the fewest writers, then the shorter one (a
    rank's own file, or the file its logger writes, holds only its lines; a shared console
    holds everyone's), then the earlier line; never the order or the names of the inputs.
    `sources`: path -> (writers, lines)."""
    best: dict[tuple[str, int], int] = {}
    for hit in hits:
        key = _line_key(hit.record)
        best[key] = max(best.get(key, 0), rules[hit.rule].specificity)
    kept = [h for h in hits if rules[h.rule].specificity == best[_line_key(h.record)]]

    explained: set[tuple[str, int]] = set()
    for hit in kept:
        # a notice or a warning explains no traceback around it: the warning a run prints
        # before its error is not that error, nor is 'Exception ignored in atexit callback'
        # printed after another process's traceback in a shared console
        rule = rules[hit.rule]
        if rule.specificity > GENERIC_SPECIFICITY and rule.severity == "error":
            explained.add(_line_key(hit.record))
            explained.update(_line_key(c) for c in hit.context)
    known = sources or {}
    chosen: dict[tuple[str, int | None, int | None, str], tuple[int, int, int, str]] = {}
    for hit in kept:
        writers, lines = known.get(hit.record.source, (0, 0))
        rank = (writers, lines, hit.record.line, hit.record.source)
        event = _event_key(hit)
        if event not in chosen or rank < chosen[event]:
            chosen[event] = rank
    wrapped = _wrapped_messages(kept, rules)
    out: list[Hit] = []
    for hit in kept:
        if chosen[_event_key(hit)][3] != hit.record.source:
            continue
        if id(hit) in wrapped:
            continue
        if (
            rules[hit.rule].specificity <= GENERIC_SPECIFICITY
            and rules[hit.rule].severity == "error"
        ):
            block = {_line_key(hit.record), *(_line_key(c) for c in hit.context)}
            if block & explained:
                continue
        out.append(hit)
    return out


EMPTY_EXCEPTION = re.compile(r"^\**[A-Za-z_][\w.]{0,200}(?:Error|Exception):\s*$")
"""An exception line whose message went to the next lines (rich's traceback and narrow
terminals wrap a long message right after 'RuntimeError: ')."""
WRAP_LINES = 3


def _wrapped_messages(hits: list[Hit], rules: dict[str, Rule]) -> set[int]:
    """Generic exception hits with an empty message that a more specific rule reads in the
    same writer's next lines: the message itself, wrapped."""
    specific: dict[tuple[str, str], list[int]] = {}
    for hit in hits:
        if rules[hit.rule].specificity > GENERIC_SPECIFICITY:
            key = (hit.record.source, hit.record.stream_key)
            specific.setdefault(key, []).append(hit.record.line)
    drop: set[int] = set()
    for hit in hits:
        if rules[hit.rule].specificity > GENERIC_SPECIFICITY:
            continue
        if not EMPTY_EXCEPTION.match(hit.record.text):
            continue
        lines = specific.get((hit.record.source, hit.record.stream_key), [])
        if any(0 < line - hit.record.line <= WRAP_LINES for line in lines):
            drop.add(id(hit))
    return drop


def _event_key(hit: Hit) -> tuple[str, int | None, int | None, str]:
    origin = hit.record.origin
    return (hit.rule, origin.rank, origin.local_rank, hit.record.text)


def group(hits: list[Hit], rules: dict[str, Rule]) -> list[Finding]:
    """One finding per rule, hits in scan order."""
    by_rule: dict[str, list[Hit]] = {}
    for hit in sorted(hits, key=lambda h: h.order):
        by_rule.setdefault(hit.rule, []).append(hit)
    findings: list[Finding] = []
    for code, rule_hits in by_rule.items():
        rule = rules[code]
        times = [h.record.time for h in rule_hits if h.record.time is not None]
        ranks = {h.record.origin.rank for h in rule_hits if h.record.origin.rank is not None}
        hosts = {h.record.origin.host for h in rule_hits if h.record.origin.host}
        finding = Finding(
            rule=code,
            kind=rule.kind,
            category=str(rule.default_category),
            role="context",
            title=rule.title,
            ranks=sorted(ranks),
            hosts=sorted(hosts),
            first_time=min(times) if times else None,
            count=len(rule_hits),
            hits=rule_hits,
        )
        findings.append(finding)
    return findings


def evidence_of(hits: list[Hit], limit: int = MAX_EVIDENCE) -> list[Evidence]:
    """Quote the first hit of each rank (then the rest) up to `limit`, with a short traceback
    excerpt for the first one."""
    chosen: list[Hit] = []
    seen_writers: set[str] = set()
    for hit in hits:
        if hit.record.stream_key not in seen_writers:
            seen_writers.add(hit.record.stream_key)
            chosen.append(hit)
    for hit in hits:
        if len(chosen) >= limit:
            break
        if hit not in chosen:
            chosen.append(hit)
    chosen = sorted(chosen[:limit], key=lambda h: h.order)
    return [Evidence.of(h.record) for h in chosen]
