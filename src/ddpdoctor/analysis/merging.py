"""The parent's side of a scan: the ranges of a split file merged back in order, facts that job
building cannot tell apart dropped, and with many files each file trimmed as it completes, in
input order, so that what is kept does not depend on which worker scanned what. Owns no rule
semantics: it keeps what job building and the analysis read (see scanner.HitBudget)."""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from dataclasses import replace

from ddpdoctor.analysis.engine import Distinct
from ddpdoctor.analysis.facts import FACT_PATTERNS, elapsed_seconds
from ddpdoctor.analysis.scanner import (
    AFTER_PROGRESS_LINES,
    MAX_HITS_ACROSS_FILES,
    MAX_HITS_PER_PATTERN,
    RECENT_LINES,
    FactHit,
    SourceScan,
)
from ddpdoctor.model.findings import Hit
from ddpdoctor.model.records import Record

BY_VALUE = frozenset(f.name for f in FACT_PATTERNS if f.distinct == Distinct.VALUE)
"""Facts job building reads by value only (a world size, a transport): one of each is enough."""


def _value_key(fact: FactHit) -> tuple[str, tuple[tuple[str, str], ...]]:
    return fact.name, tuple(sorted(fact.captures.items()))


class Merger:
    """Collects the scans of the units of a plan, in plan order (input order, file order)."""

    def __init__(
        self,
        owners: list[int],
        rule_index: dict[str, int],
        across_files: bool = False,
        shared: MutableSequence[int] | None = None,
    ) -> None:
        self.owners = owners
        self.merged: dict[int, SourceScan] = {}
        self.left: dict[int, int] = {}
        for owner in owners:
            self.left[owner] = self.left.get(owner, 0) + 1
        self.rule_index = rule_index
        self.across_files = across_files
        self.shared = shared
        """Where the hits kept so far are published for the worker processes (HitBudget)."""
        self.accepted = [0] * len(rule_index)
        self.values: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add_all(self, parts: Iterable[SourceScan]) -> list[SourceScan]:
        """Every unit's scan, in plan order; one SourceScan per input, in input order."""
        for owner, part in zip(self.owners, parts, strict=True):
            self.add(owner, part)
        return [self.merged[i] for i in sorted(self.merged)]

    def add(self, owner: int, part: SourceScan) -> None:
        acc = self.merged.get(owner)
        self.merged[owner] = part if acc is None else merge(acc, part)
        self.left[owner] -= 1
        if not self.left[owner]:
            self._complete(self.merged[owner])

    def _complete(self, scan: SourceScan) -> None:
        """A file whose last range arrived: its facts by value that earlier files had are
        dropped (the first of each value over all files is kept, as one process finds it), and
        with many files its hits are trimmed."""
        facts: list[FactHit] = []
        for fact in scan.facts:
            if fact.name in BY_VALUE:
                key = _value_key(fact)
                if key in self.values:
                    continue
                self.values.add(key)
            facts.append(fact)
        scan.facts = facts
        if self.across_files:
            scan.hits = self._trim(scan.hits)

    def _trim(self, hits: list[Hit]) -> list[Hit]:
        """A file's first hit of each rule, and the others while the rule has fewer than
        MAX_HITS_ACROSS_FILES over the files before; the counts go to the workers."""
        kept: list[Hit] = []
        first: set[str] = set()
        accepted = self.accepted
        for hit in hits:
            rule = self.rule_index[hit.rule]
            if hit.rule in first and accepted[rule] >= MAX_HITS_ACROSS_FILES:
                continue
            first.add(hit.rule)
            accepted[rule] += 1
            kept.append(hit)
        if self.shared is not None:
            for rule in {self.rule_index[h.rule] for h in kept}:
                self.shared[rule] = accepted[rule]
        return kept


def merge(acc: SourceScan, part: SourceScan) -> SourceScan:
    """Append the scan of the next range of the same file to `acc` (both compacted)."""
    shift = acc.info.lines
    shifted: set[int] = set()

    def move(record: Record) -> None:
        if id(record) not in shifted:
            shifted.add(id(record))
            record.line += shift

    for hit in part.hits:
        move(hit.record)
        for ctx in hit.context:
            move(ctx)
    for fact in part.facts:
        move(fact.record)
    info = acc.info
    info.bytes += part.info.bytes
    info.lines += part.info.lines
    if info.status == "read" and part.info.status != "read":
        info.status, info.reason = part.info.status, part.info.reason
    kept: dict[str, int] = {}
    for hit in acc.hits:
        kept[hit.rule] = kept.get(hit.rule, 0) + 1
    for hit in part.hits:
        if kept.get(hit.rule, 0) >= MAX_HITS_PER_PATTERN:
            continue
        kept[hit.rule] = kept.get(hit.rule, 0) + 1
        acc.hits.append(hit)
    acc.facts.extend(part.facts)
    for key, s in part.streams.items():
        s.first_line += shift if s.first_line else 0
        s.last_line += shift if s.last_line else 0
        s.last_init_line += shift if s.last_init_line else 0
        s.last_progress_line += shift if s.last_progress_line else 0
        s.open_traceback_line += shift if s.open_traceback_line else 0
        s.open_traceback_at += shift if s.open_traceback_at else 0
        s.closed_traceback_line += shift if s.closed_traceback_line else 0
        s.last_error_line += shift if s.last_error_line else 0
        if s.first_raised is not None:
            s.first_raised = (s.first_raised[0] + shift, s.first_raised[1])
        s.recent = tuple((line + shift, raw) for line, raw in s.recent)
        s.bare = tuple((line + shift, raw) for line, raw in s.bare)
        if s.pending_phase is not None:
            s.pending_phase = (s.pending_phase[0] + shift, s.pending_phase[1])
        if s.planned is not None:
            s.planned = replace(s.planned, line=s.planned.line + shift)
        a = acc.streams.get(key)
        if a is None:
            acc.streams[key] = s
            continue
        a.lines_seen += s.lines_seen
        a.recent = (a.recent + s.recent)[-RECENT_LINES:]
        a.bare = (a.bare + s.bare)[-RECENT_LINES:]
        a.year = s.year
        a.prev_text = s.prev_text or a.last_text
        a.last_line, a.last_text = s.last_line, s.last_text
        a.open_traceback_line, a.open_traceback_at = s.open_traceback_line, s.open_traceback_at
        a.open_traceback_time = s.open_traceback_time
        a.open_traceback_text, a.open_trace_native = s.open_traceback_text, s.open_trace_native
        a.open_trace_indent = s.open_trace_indent
        a.open_trace_carried_on = s.open_trace_carried_on
        a.ignored_traces += s.ignored_traces
        a.open_traceback_tail = s.open_traceback_tail
        a.closed_traceback_line = s.closed_traceback_line or a.closed_traceback_line
        a.after_progress = (
            s.after_progress
            if s.progress_lines
            else (a.after_progress + s.after_progress)[:AFTER_PROGRESS_LINES]
        )
        if s.planned is not None and (a.planned is None or s.planned.total >= a.planned.total):
            a.planned = s.planned
        if s.phase_cleared:  # a later step ended an earlier range's phase
            a.pending_phase, a.phase_cleared = s.pending_phase, True
        elif a.pending_phase is None:  # the first phase set out on stands
            a.pending_phase = s.pending_phase
        a.progress_lines += s.progress_lines
        a.last_init_line = s.last_init_line or a.last_init_line
        # (the later range's lines of this writer only: enough to tell 'right after' from not)
        a.lines_after_init = (
            s.lines_after_init if s.last_init_line else a.lines_after_init + s.lines_seen
        )
        if s.last_progress_line:
            a.last_progress_line, a.last_progress_time = s.last_progress_line, s.last_progress_time
            a.step_s = s.step_s or a.step_s
            a.progress_moved = s.progress_moved if s.step_s else a.progress_moved
        a.last_progress_text = s.last_progress_text or a.last_progress_text
        if s.progress_total is not None:
            a.progress_done = s.progress_done
        a.last_epoch = s.last_epoch if s.last_epoch is not None else a.last_epoch
        a.first_epoch = a.first_epoch if a.first_epoch is not None else s.first_epoch
        a.epoch_share = s.epoch_share if s.epoch_share is not None else a.epoch_share
        a.error_lines += s.error_lines
        a.last_error_line = s.last_error_line or a.last_error_line
        a.last_error_text = s.last_error_text or a.last_error_text
        a.first_raised = a.first_raised or s.first_raised
        a.progress_total = s.progress_total or a.progress_total
        if a.origin.rank is None and s.origin.rank is not None:
            a.origin = s.origin
    return compact(acc)


def compact(scan: SourceScan) -> SourceScan:
    """Drop facts that job building cannot tell apart from ones kept: the same world size
    twice, a transport seen before, every progress bar but the first longest-running one."""
    best: FactHit | None = None
    best_s = -1.0
    for fact in scan.facts:
        if fact.name == "progress":
            elapsed = elapsed_seconds(fact.captures.get("elapsed", ""))
            if best is None or (elapsed is not None and elapsed > best_s):
                best, best_s = fact, elapsed if elapsed is not None else best_s
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    kept: list[FactHit] = []
    for fact in scan.facts:
        if fact.name == "progress":
            if fact is best:
                kept.append(fact)
            continue
        if fact.name not in BY_VALUE:
            kept.append(fact)
            continue
        key = _value_key(fact)
        if key not in seen:
            seen.add(key)
            kept.append(fact)
    scan.facts = kept
    return scan
