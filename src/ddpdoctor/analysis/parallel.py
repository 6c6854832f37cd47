"""Scanning many inputs fast: cut big plain files into newline-aligned byte ranges, scan files
and ranges in worker processes, and merge the parts of one file back into one SourceScan.
The plan does not depend on the worker count, so one process and many give the same result.
Owns no rule semantics: it keeps what job building needs and bounds what it keeps."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator, MutableSequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress
from functools import lru_cache

from ddpdoctor.analysis.facts import elapsed_seconds
from ddpdoctor.analysis.newlines import use_numpy
from ddpdoctor.analysis.scanner import (
    MANY_FILES,
    MAX_HITS_PER_PATTERN,
    FactHit,
    PartBudget,
    Scanner,
    SourceScan,
    sample_bytes_for,
)
from ddpdoctor.ingest.sources import (
    GZIP_MAGIC,
    SNIFF_BYTES,
    Input,
    looks_binary,
    looks_utf16,
)
from ddpdoctor.model.records import Record
from ddpdoctor.rules.base import Rule
from ddpdoctor.rules.registry import all_rules

PARALLEL_MIN_BYTES = 64 * 1024 * 1024
"""Below this much input, starting worker processes costs more than it saves."""
FAST_COUNT_MIN_BYTES = 512 * 1024 * 1024
"""From this much input on, the ~0.1 s numpy import pays for itself in faster line counting."""
PART_BYTES = 128 * 1024 * 1024
"""Plain files above this are scanned as ranges of about this size: two cores share one big
file, and what a part keeps in memory before merging stays bounded."""
BOUNDARY_SEARCH_BYTES = 8 * 1024 * 1024
"""How far past a cut point to look for a newline; a longer line is not cut there."""


def _scannable(rules: Iterable[Rule]) -> list[Rule]:
    return [r for r in rules if r.signatures]


@lru_cache(maxsize=4)
def _scanner(engine: str) -> Scanner:
    """Compiling the pattern database takes ~0.3 s: once per process and engine (workers
    started by fork inherit the parent's)."""
    return Scanner(_scannable(all_rules()), engine=engine)


def plan(inputs: list[Input]) -> list[tuple[int, Input]]:
    """(input index, part) for every part to scan, in input order and file order."""
    units: list[tuple[int, Input]] = []
    for index, item in enumerate(inputs):
        units.extend((index, part) for part in split(item))
    return units


def split(item: Input, part_bytes: int | None = None) -> list[Input]:
    """A big plain file as newline-aligned ranges; anything else (stdin, .gz, UTF-16, binary,
    small) whole."""
    part_bytes = part_bytes or PART_BYTES
    if item.path == "-" or item.start or item.end is not None:
        return [item]
    try:
        size = os.path.getsize(item.path)
        if size <= part_bytes or not os.path.isfile(item.path):
            return [item]
        with open(item.path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
            if head[:2] == GZIP_MAGIC or looks_utf16(head):  # decoded as one stream
                return [item]
            if looks_binary(head):  # a checkpoint beside the logs: skipped whole, unread
                return [item]
            cuts = [0]
            parts = -(-size // part_bytes)
            for k in range(1, parts):
                cut = _line_start_after(fh, k * size // parts)
                if cut is not None and cuts[-1] < cut < size:
                    cuts.append(cut)
    except OSError:
        return [item]
    ends: list[int | None] = [*cuts[1:], None]
    return [
        Input(item.path, item.display, start, end) for start, end in zip(cuts, ends, strict=True)
    ]


def _line_start_after(fh: object, offset: int) -> int | None:
    """The offset just after the first newline at or after `offset`, if one is near."""
    seek, read = fh.seek, fh.read  # type: ignore[attr-defined]
    seek(offset)
    looked = 0
    while looked < BOUNDARY_SEARCH_BYTES:
        block: bytes = read(256 * 1024)
        if not block:
            return None
        nl = block.find(b"\n")
        if nl >= 0:
            return offset + looked + nl + 1
        looked += len(block)
    return None


_Job = tuple[str, Input, int, bool, "tuple[int, tuple[int, ...]] | None"]
_shared_counts: MutableSequence[int] | None = None
"""The hit counts of split files' ranges, shared with worker processes (see PartBudget)."""


def _share(counts: MutableSequence[int]) -> None:
    """Worker initializer: the parent's shared counts (inherited as they are under fork)."""
    global _shared_counts
    _shared_counts = counts


def _scan_part(job: _Job) -> SourceScan:
    engine, item, sample, head, slots = job
    budget = None
    if slots is not None and _shared_counts is not None:
        budget = PartBudget(_shared_counts, slots[0], slots[1])
    return compact(_scanner(engine).scan(item, sample, head, budget))


def _budget_slots(units: list[tuple[int, Input]]) -> list[tuple[int, tuple[int, ...]] | None]:
    """Per unit: its slot and the slots of the earlier ranges of the same file, for the ranges
    of split files; None for a file scanned whole."""
    parts_of: dict[int, int] = {}
    for index, _ in units:
        parts_of[index] = parts_of.get(index, 0) + 1
    slots: list[tuple[int, tuple[int, ...]] | None] = []
    earlier: dict[int, list[int]] = {}
    for index, _ in units:
        if parts_of[index] < 2:
            slots.append(None)
            continue
        mine = sum(1 for s in slots if s is not None)
        before = earlier.setdefault(index, [])
        slots.append((mine, tuple(before)))
        before.append(mine)
    return slots


def scan_inputs(
    inputs: list[Input], engine: str = "auto", jobs: int | None = None
) -> list[SourceScan]:
    """One SourceScan per input, in input order; parts of a split file are merged back."""
    units = plan(inputs)
    sample = sample_bytes_for(len(inputs))
    head = len(inputs) < MANY_FILES
    total = 0
    for item in inputs:
        with suppress(OSError):
            total += os.path.getsize(item.path) if item.path != "-" else 0
    workers = min(jobs if jobs is not None else (os.cpu_count() or 1), len(units))
    scanner = _scanner(engine)  # compiled before forking, so that workers share it
    if total >= FAST_COUNT_MIN_BYTES:
        use_numpy()  # before forking too: two workers importing at once took twice as long
    merged: list[SourceScan | None] = [None] * len(inputs)
    parts: Iterator[SourceScan]
    slots = _budget_slots(units)
    n_slots = sum(1 for s in slots if s is not None)
    jobs_ = [(engine, u, sample, head, s) for (_, u), s in zip(units, slots, strict=True)]
    if workers > 1 and total >= PARALLEL_MIN_BYTES:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        counts = context.RawArray("q", max(1, n_slots * scanner.n_rules))
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_share, initargs=(counts,)
        ) as pool:
            chunksize = max(1, min(16, len(units) // (workers * 8)))
            parts = pool.map(_scan_part, jobs_, chunksize=chunksize)
            _merge_all(merged, [i for i, _ in units], parts)
    else:
        _share([0] * (n_slots * scanner.n_rules))
        parts = (_scan_part(job) for job in jobs_)
        _merge_all(merged, [i for i, _ in units], parts)
    return [m for m in merged if m is not None]


def _merge_all(
    merged: list[SourceScan | None], owners: list[int], parts: Iterable[SourceScan]
) -> None:
    for owner, part in zip(owners, parts, strict=True):
        acc = merged[owner]
        merged[owner] = part if acc is None else merge(acc, part)


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
        a = acc.streams.get(key)
        if a is None:
            acc.streams[key] = s
            continue
        a.lines_seen += s.lines_seen
        a.last_line, a.last_text = s.last_line, s.last_text
        a.progress_lines += s.progress_lines
        a.last_init_line = s.last_init_line or a.last_init_line
        a.last_progress_line = s.last_progress_line or a.last_progress_line
        a.error_lines += s.error_lines
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
    seen: set[tuple[str, str]] = set()
    kept: list[FactHit] = []
    for fact in scan.facts:
        if fact.name == "progress":
            if fact is best:
                kept.append(fact)
            continue
        if fact.name == "world_size":
            key = (fact.name, fact.captures.get("n", ""))
        elif fact.name in ("socket_transport", "ib_transport"):
            key = (fact.name, "")
        else:
            kept.append(fact)
            continue
        if key not in seen:
            seen.add(key)
            kept.append(fact)
    scan.facts = kept
    return scan
