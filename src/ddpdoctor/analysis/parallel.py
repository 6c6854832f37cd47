"""Scanning many inputs fast: cut big plain files into newline-aligned byte ranges, scan files
and ranges in worker processes, and merge the parts of one file back into one SourceScan
(analysis/merging). The plan does not depend on the worker count, so one process and many give
the same result. Owns no rule semantics."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator, MutableSequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import lru_cache

from ddpdoctor.analysis.merging import Merger, compact, merge
from ddpdoctor.analysis.newlines import use_numpy
from ddpdoctor.analysis.scanner import (
    MANY_FILES,
    HitBudget,
    Scanner,
    SourceScan,
    sample_bytes_for,
)
from ddpdoctor.ingest import spool
from ddpdoctor.ingest.sources import (
    GZIP_MAGIC,
    SNIFF_BYTES,
    Input,
    looks_binary,
    looks_utf16,
)
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.rules.base import Rule
from ddpdoctor.rules.registry import all_rules

PARALLEL_MIN_BYTES = 64 * 1024 * 1024
"""Below this much input, starting worker processes costs more than it saves."""
FAST_COUNT_MIN_BYTES = 512 * 1024 * 1024
"""From this much input on, the ~0.1 s numpy import pays for itself in faster line counting."""
PART_BYTES = 128 * 1024 * 1024
"""Plain files above this are scanned as ranges of about this size: two cores share one big
file, and what a part keeps in memory before merging stays bounded."""
STDIN_PART_BYTES = 32 * 1024 * 1024
"""Stdin is scanned in parallel from this much on, as ranges of about this size (see
ingest/spool): the parent holds one range in memory while it reads it."""
STDIN_SLOTS = 256
"""Ranges of stdin that publish their hit counts to the later ones (see scanner.HitBudget);
later ranges read them and keep what merging would keep all the same."""
BOUNDARY_SEARCH_BYTES = 8 * 1024 * 1024
"""How far past a cut point to look for a newline; a longer line is not cut there."""


def _scannable(rules: Iterable[Rule]) -> list[Rule]:
    return [r for r in rules if r.signatures]


@lru_cache(maxsize=4)
def _scanner(engine: str) -> Scanner:
    """Compiling the pattern database takes ~0.3 s: once per process and engine (workers
    started by fork inherit the parent's)."""
    return Scanner(_scannable(all_rules()), engine=engine)


def plan(inputs: list[Input], sizes: list[int | None] | None = None) -> list[tuple[int, Input]]:
    """(input index, part) for every part to scan, in input order and file order. `sizes`:
    each input's size if known (see _size_of)."""
    units: list[tuple[int, Input]] = []
    for index, item in enumerate(inputs):
        size = sizes[index] if sizes is not None else None
        units.extend((index, part) for part in split(item, size=size))
    return units


def _size_of(item: Input) -> int | None:
    """The input's size, None for stdin or a path that cannot be looked at: one stat per
    input for planning and the total (it was two, in the parent, for each of 10,000 files)."""
    if item.path == "-":
        return None
    try:
        return os.path.getsize(item.path)
    except OSError:
        return None


def split(item: Input, part_bytes: int | None = None, size: int | None = None) -> list[Input]:
    """A big plain file as newline-aligned ranges; anything else (stdin, .gz, UTF-16, binary,
    small) whole. `size`: the file's, when the caller has it."""
    part_bytes = part_bytes or PART_BYTES
    if item.path == "-" or item.start or item.end is not None:
        return [item]
    try:
        if size is None:
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


_Budget = tuple[int | None, tuple[int, ...], bool]
"""(slot of a split file's range or None, slots of its earlier ranges, trimmed across files)."""
_Job = tuple[str, Input, int, bool, _Budget]
_shared_counts: MutableSequence[int] | None = None
"""Hit counts shared with worker processes (see scanner.HitBudget)."""
_value_keys: dict[int, set[object]] = {}
"""Values of facts read by value that this process handed on during the current diagnosis."""


def _share(counts: MutableSequence[int]) -> None:
    """A process's state for a diagnosis: the shared hit counts (a worker's initializer; the
    parent's too where it scans), no fact values handed on yet, and no cyclic garbage
    collector (see _collector_paused)."""
    global _shared_counts
    _shared_counts = counts
    _value_keys.clear()
    gc.disable()


_froze = False
"""The last scan froze what was alive when it ended (see _collector_paused)."""
FREEZE_MIN_OBJECTS = 100_000
"""A scan that leaves fewer objects than this (most inputs) freezes nothing: collections walk
them in a few milliseconds."""


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while scanning: a scan makes no reference cycles
    (reference counting frees what it drops), but its records, hits and parsed lines trigger
    collections that walk every live object again and again: measured with it off, 11% less
    CPU on a 1 GiB log at 20% candidates (3.37 -> 3.01 s) and 23% on 10,000 rank files
    (12.2 -> 9.35 s, the whole diagnosis).

    When it is turned back on after a scan that left many objects (FREEZE_MIN_OBJECTS), what
    is alive is first frozen (gc.freeze): the analysis after the scan no longer has each of its
    collections walk the scans again (1.2 s of the parent's 4.5 s CPU on 10,000 rank files,
    280,000 objects). Reference counting still frees them; only a cycle among them waits,
    until the next scan gives them back to the collector. Nothing is frozen when other code
    had frozen objects."""
    global _froze
    if _froze:
        gc.unfreeze()  # the previous scan's: collected as usual from now on
        _froze = False
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            # objects made since the last collection, net: with it off, what the scan left
            made = gc.get_count()[0]
            if made >= FREEZE_MIN_OBJECTS and gc.get_freeze_count() == 0:
                gc.freeze()
                _froze = True
            gc.enable()


def thaw() -> None:
    """Give what the last scan froze back to the collector: the diagnosis calls it once its
    analysis is done, so a library caller keeps no frozen objects between diagnoses."""
    global _froze
    if _froze:
        gc.unfreeze()
        _froze = False


def _scan_part(job: _Job) -> SourceScan:
    engine, item, sample, head, (slot, earlier, across_files) = job
    scanner = _scanner(engine)
    budget = None
    if _shared_counts is not None and (slot is not None or across_files):
        budget = HitBudget(_shared_counts, scanner.n_rules, slot, earlier, across_files)
    return compact(scanner.scan(item, sample, head, budget, _value_keys))


MAX_SHARED_TEXTS = 100_000
"""Distinct texts of hits that scans share (see _sharing_texts): beyond this many, new ones
are kept as they come (a hostile set of files, each line different, shares nothing)."""


def _sharing_texts(scans: Iterable[SourceScan]) -> Iterator[SourceScan]:
    """Each scan as it comes, its hits' texts replaced by an equal one an earlier scan kept,
    and within the scan each writer's key, host and numbers (rank, pid) made one object: 10,000
    rank files repeat the same few warnings (35,590 hit texts, 61 different, 9.1 MiB of
    characters each time), every record built its own copy of its writer's key, and every
    origin its own int of each rank and pid above 256 (112,000 ints for 10,000 files). Equal
    values, one object: the analysis reads values, never identities."""
    texts: dict[str, str] = {}
    for scan in scans:
        keys: dict[str, str] = {}
        numbers: dict[int, int] = {}
        for hit in scan.hits:
            record = hit.record
            text = texts.get(record.text)
            if text is None:
                if len(texts) < MAX_SHARED_TEXTS:
                    texts[record.text] = record.text
            else:
                record.text = text
            _share_record(record, keys, numbers)
            for earlier in hit.context:
                _share_record(earlier, keys, numbers)
            if hit.captures:
                hit.captures = {k: texts.get(v, v) for k, v in hit.captures.items()}
        for fact in scan.facts:
            _share_record(fact.record, keys, numbers)
        for stream in scan.streams.values():
            _share_origin(stream.origin, keys, numbers)
        yield scan


def _share_record(record: Record, keys: dict[str, str], numbers: dict[int, int]) -> None:
    record.stream_key = keys.setdefault(record.stream_key, record.stream_key)
    _share_origin(record.origin, keys, numbers)


def _share_origin(origin: Origin, keys: dict[str, str], numbers: dict[int, int]) -> None:
    if origin.rank is not None:
        origin.rank = numbers.setdefault(origin.rank, origin.rank)
    if origin.pid is not None:
        origin.pid = numbers.setdefault(origin.pid, origin.pid)
    if origin.host is not None:
        origin.host = keys.setdefault(origin.host, origin.host)


def _budgets(units: list[tuple[int, Input]], many: bool) -> list[_Budget]:
    """Per unit: a slot for each range of a split file, with the slots of the ranges before it
    in the same file; whole files among many are trimmed across files (split ones are trimmed
    after merging, their ranges keep what the file would)."""
    parts_of: dict[int, int] = {}
    for index, _ in units:
        parts_of[index] = parts_of.get(index, 0) + 1
    budgets: list[_Budget] = []
    earlier: dict[int, list[int]] = {}
    slots = 0
    for index, _ in units:
        if parts_of[index] < 2:
            budgets.append((None, (), many))
            continue
        before = earlier.setdefault(index, [])
        budgets.append((slots, tuple(before), False))
        before.append(slots)
        slots += 1
    return budgets


def scan_inputs(
    inputs: list[Input], engine: str = "auto", jobs: int | None = None
) -> list[SourceScan]:
    """One SourceScan per input, in input order; parts of a split file are merged back.
    Stdin alone is read in ranges by every worker when it is long and plain text (see
    _scan_stdin); else by one reader, the bytes taken to decide in front."""
    available = jobs if jobs is not None else (os.cpu_count() or 1)
    if available > 1 and len(inputs) == 1 and inputs[0].path == "-":
        first = spool.read_first()
        folder = (
            spool.make_dir() if len(first) == spool.READ_BYTES and spool.plain_text(first) else None
        )
        if folder is not None:
            with _collector_paused():
                return [_scan_stdin(first, folder, engine, available)]
        inputs = [replace(inputs[0], read_ahead=first)]
    sizes = [_size_of(item) for item in inputs]
    units = plan(inputs, sizes)
    sample = sample_bytes_for(len(inputs))
    many = len(inputs) >= MANY_FILES
    head = not many
    total = sum(size for size in sizes if size is not None)
    workers = min(available, len(units))
    scanner = _scanner(engine)  # compiled before forking, so that workers share it
    if total >= FAST_COUNT_MIN_BYTES:
        use_numpy()  # before forking too: two workers importing at once took twice as long
    budgets = _budgets(units, many)
    size = scanner.n_rules * (1 + sum(1 for b in budgets if b[0] is not None))
    jobs_ = [(engine, u, sample, head, b) for (_, u), b in zip(units, budgets, strict=True)]
    owners = [i for i, _ in units]
    with _collector_paused():
        return _run(jobs_, owners, scanner, many, size, workers, total)


def _run(
    jobs_: list[_Job],
    owners: list[int],
    scanner: Scanner,
    many: bool,
    size: int,
    workers: int,
    total: int,
) -> list[SourceScan]:
    """Scan every unit, in worker processes when it pays, and merge as they complete."""
    if workers > 1 and total >= PARALLEL_MIN_BYTES:
        with _worker_pool(workers, size) as (pool, counts):
            merger = Merger(owners, scanner.rule_index, many, counts)
            chunksize = max(1, min(16, len(jobs_) // (workers * 8)))
            return merger.add_all(_sharing_texts(pool.map(_scan_part, jobs_, chunksize=chunksize)))
    shared = [0] * size
    _share(shared)
    merger = Merger(owners, scanner.rule_index, many, shared)
    return merger.add_all(_sharing_texts(_scan_part(job) for job in jobs_))


@contextmanager
def _worker_pool(
    workers: int, size: int
) -> Iterator[tuple[ProcessPoolExecutor, MutableSequence[int]]]:
    """Worker processes forked from this one (the compiled scanner is inherited), sharing
    `size` hit counts (see scanner.HitBudget) with each other and with this process, which
    may scan a unit too (the rest of stdin that could not be spooled), for a fresh diagnosis."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    counts = context.RawArray("q", size)
    _share(counts)  # before forking: the workers start from this process's state
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_share, initargs=(counts,)
    ) as pool:
        yield pool, counts


def _scan_stdin(first: bytes, folder: str, engine: str, workers: int) -> SourceScan:
    """Stdin spooled to `folder` in ranges as it is read (ingest/spool; `first` already read),
    each range scanned by a worker process while the next is read, their scans merged in
    stream order as a split file's are. A stream that ends within its first range is scanned
    here, from its spooled file. The folder is removed."""
    scanner = _scanner(engine)
    sample = sample_bytes_for(1)
    parts = spool.ranges(first, folder, STDIN_PART_BYTES, sample)
    try:
        opening = next(parts)
        if opening.end is None:  # the whole stream in one range: no worker to start
            _share([0] * scanner.n_rules)  # a fresh diagnosis in this process
            alone = _scan_part((engine, opening, sample, True, (None, (), False)))
            merged = next(_sharing_texts([alone]))
        else:
            merged = _scan_ranges(opening, parts, engine, sample, workers)
    finally:
        parts.close()
        spool.remove_dir(folder)
    merger = Merger([0], scanner.rule_index)
    merger.add(0, merged)  # facts read by value: one of each, as for any file
    return merger.merged[0]


def _scan_ranges(
    opening: Input, parts: Iterator[Input], engine: str, sample: int, workers: int
) -> SourceScan:
    """The ranges scanned by worker processes, at most `workers` ahead of the one merged (each
    range's file is on disk until then), merged in stream order. A range that could not be
    spooled is the rest of the stream, scanned here once the ones before it are in."""
    scanner = _scanner(engine)
    use_numpy()  # before forking (see scan_inputs): the stream's size is not known in advance
    merged: SourceScan | None = None
    with _worker_pool(workers, scanner.n_rules * (1 + STDIN_SLOTS)) as (pool, _):

        def scans() -> Iterator[SourceScan]:
            pending: deque[tuple[Input, Future[SourceScan]]] = deque()
            for index, part in enumerate(itertools.chain([opening], parts)):
                slot = index if index < STDIN_SLOTS else None
                budget: _Budget = (slot, tuple(range(min(index, STDIN_SLOTS))), False)
                job: _Job = (engine, part, sample, True, budget)
                if part.spool is None:
                    while pending:
                        yield _collect(pending.popleft())
                    yield _scan_part(job)
                    return
                pending.append((part, pool.submit(_scan_part, job)))
                while len(pending) > workers:
                    yield _collect(pending.popleft())
            while pending:
                yield _collect(pending.popleft())

        for scan in _sharing_texts(scans()):
            merged = scan if merged is None else merge(merged, scan)
    assert merged is not None  # the opening range at least
    return merged


def _collect(item: tuple[Input, Future[SourceScan]]) -> SourceScan:
    """A range's scan, its spooled file removed (its disk is given back as the stream goes)."""
    part, future = item
    try:
        return future.result()
    finally:
        if part.spool is not None:
            with suppress(OSError):
                os.unlink(part.spool)
