"""Multi-pattern prefilter over large byte chunks. Finds candidate lines for many signatures in
one pass (Hyperscan when installed, a stdlib literal search otherwise); the caller confirms each
candidate with Python `re`. What the caller no longer needs from a source (a pattern past its
cap, a fact value it has) is not reported again, so a repeated line costs no Python per line.
Owns no rule semantics; both engines report the same candidates for what they report.

Per chunk, Hyperscan first answers which patterns occur at all (each reports once), then only
the occurring patterns the caller still wants are located line by line, each with a database of
its own, so that one warning repeated 50,000 times in a chunk costs nothing once its cap is
reached. Facts that only need their distinct values (`Pattern.distinct`) are told apart on the
raw bytes before any Python parsing: per chunk in C where every line holding the pattern's
literal is plain text with one occurrence, else line by line; only the first line of a value the
source has not shown is handed on."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Protocol

from ddpdoctor.ingest.prefixes import MAX_TEXT

_hs: ModuleType | None
try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the platform
    _hs = None

LITERAL_SEARCH_MIN_CHARS = 8
"""A pattern whose required literal is at least this long is searched as that literal alone
(caseless): Hyperscan then runs its literal matcher, about 40% faster on the benchmark's logs
than prefiltering every regex, and a literal this long is rare enough that the few extra
candidate lines cost less in Python `re` than the regex costs in Hyperscan. Shorter literals
("Error", "Exit", "world") would flood Python with candidates: those keep the regex."""

SAMPLE_LINES = 4
"""Per chunk, a `sampled` pattern reports only the last this many lines holding its literal."""

BULK_MIN_LINES = 1024
"""From this many candidate lines of a distinct fact in one chunk on, its values are read by
one `findall` over the chunk (about 2 ms per 4 MB) instead of line by line (about 2 us a
line), when no line holding its literal is messy (not plain text, or the literal twice)."""

LOCATE_ALL_MIN = 24
"""From this many patterns to locate in one chunk on, the database of all patterns is scanned
(its callback dropping the rest) instead of compiling one for these."""
SEPARATE_MAX = 3
"""Up to this many patterns to locate are scanned for one at a time, more with one database."""
SUBSET_DATABASES = 64
"""Databases of a few patterns kept per process, the least recently used dropped first."""
SUBSET_KEEP_MIN_S = 0.002
"""A subset database that took at least this long to compile is kept in the on-disk cache
beside the database of all patterns: a few signatures' prefilter regexes take 20-180 ms each
(a bounded gap between two alternations, a lookbehind), and every process compiled each
combination again: on a 1 GiB log at 20% candidates, 73 combinations took 0.67 s of the
4.4 s scan in one process, and both workers of a diagnosis compiled theirs."""
CACHE_MAX_FILES = 2000
"""The most databases the on-disk cache holds; the least recently used go first (_make_room)."""
SPARSE_MAX = 256
"""A chunk is first scanned once with every pattern, keeping where each matched, until this
many matches: a sparse chunk (most of a real log) is then done in one pass, as before the
presence pass existed; a dense one goes on to the presence pass and the located few, and so do
the later chunks of its source (a stopped pass costs most of a scan: 1% logs lost 20%)."""

_CONTROL = rb"[\x00-\x08\x0b-\x1f\x7f]"
"""Bytes that cleaning removes or reinterprets (NUL, ESC, CR) or that Python's `\\s` and
bytes' `\\s` disagree on (\\x1c-\\x1f): a line holding one is not plain."""
_NOT_PLAIN = re.compile(_CONTROL + rb"|[\x80-\xff]")
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
"""What `\b` takes for a word character on ASCII text."""


class Distinct(StrEnum):
    """What tells two lines of a fact apart for whoever reads the fact."""

    VALUE = "value"
    """Only the captured values (a world size, that a transport was named)."""
    WRITER = "writer"
    """The captured values and who printed the line: the bytes before the match."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """A regex for the prefilter plus a literal every match contains (for the fallback).

    `sampled`: the caller needs only the latest few occurrences per chunk (a progress bar that
    redraws every step); a callback per line would cost more than the whole scan.
    `distinct`: the caller needs one line per distinct value (see Distinct) and `regex`, begun
    by a literal, is the fact's own regex: a line is dropped before parsing when it is plain
    text (ASCII, no control byte, not longer than a parsed line's text), the regex matches it
    once, and a line with the same value was handed on before.
    """

    regex: str
    literal: str
    sampled: bool = False
    distinct: Distinct | None = None


@dataclass(slots=True)
class Seen:
    """What a caller no longer needs the engine to report for one source."""

    capped: set[int] = field(default_factory=set)
    """Patterns whose further lines the caller would not keep."""
    keys: dict[int, set[object]] = field(default_factory=dict)
    """Per distinct pattern, the values already handed on."""
    dense: bool = False
    """A chunk of this source had too many matches for one pass with every pattern: its next
    chunks go straight to the presence pass."""


Candidates = list[tuple[int, int, list[int]]]


class Matcher(Protocol):
    name: str

    def candidate_lines(self, chunk: bytes, seen: Seen | None = None) -> Candidates:
        """(line_start, line_end, pattern ids) for every line that may match, in file order;
        ids of a line by the offset where they matched, then by id."""
        ...


def _group_by_line(chunk: bytes, hits: list[tuple[int, int]]) -> Candidates:
    """Turn (pattern id, offset inside the line) pairs into one entry per line."""
    out: Candidates = []
    line_end = -1
    rfind, find = chunk.rfind, chunk.find
    pids: list[int] = []
    # by offset, then id: tuples compare without a key function
    for offset, pid in sorted([(offset, pid) for pid, offset in hits]):
        if offset > line_end:
            start = rfind(b"\n", 0, offset) + 1
            end = find(b"\n", offset)
            line_end = len(chunk) if end < 0 else end
            pids = [pid]
            out.append((start, line_end, pids))
        elif pid not in pids:
            pids.append(pid)
    return out


def _by_literal(patterns: Sequence[Pattern], sampled: bool) -> list[tuple[bytes, list[int]]]:
    by_literal: dict[bytes, list[int]] = {}
    for pid, pat in enumerate(patterns):
        if pat.sampled == sampled:
            by_literal.setdefault(pat.literal.encode(), []).append(pid)
    return list(by_literal.items())


def _sampled_hits(chunk: bytes, sampled: list[tuple[bytes, list[int]]]) -> list[tuple[int, int]]:
    """The last SAMPLE_LINES lines holding each sampled literal, found from the end in C."""
    hits: list[tuple[int, int]] = []
    rfind = chunk.rfind
    for literal, pids in sampled:
        if rfind(literal[:1]) < 0:
            continue  # one byte is searched with memrchr: 0.4 us per 27 KB instead of 11
        end = len(chunk)
        for _ in range(SAMPLE_LINES):
            pos = rfind(literal, 0, end)
            if pos < 0:
                break
            hits.extend((pid, pos) for pid in pids)
            end = rfind(b"\n", 0, pos)
            if end < 0:
                break
    return hits


def plain_line(line: bytes) -> bool:
    """ASCII without control bytes and no longer than a parsed text: cleaning leaves it as it
    is, so its parsed message is a suffix of it and a regex finds there what it finds in the
    bytes (Python's str and bytes classes agree on ASCII without control bytes). Not a line
    whose end parsing may cut: trailing blanks or tabs, or a caller's file:line column (rich's
    RichHandler right-aligns 'train.py:42' after the message), nor a JSON log record (read
    as its message and fields, ingest/json_lines.py)."""
    if line[-1:] in (b" ", b"\t") or (line[-1:].isdigit() and b".py:" in line[-100:]):
        return False
    if line.endswith(b"}") and b'{"' in line:
        return False
    return len(line) <= MAX_TEXT and _NOT_PLAIN.search(line) is None


_FLAGS = re.compile(r"\(\?[aiLsu]+\)")
"""Global inline flags a regex may open with (not m or x: they change what follows)."""
_ZERO_WIDTH_ESCAPES = frozenset("bBAZ")
_META = frozenset("^$.|?*+(){}")


def suffix_safe(regex: str) -> bool:
    """Whether a match of `regex` in a suffix of a line implies a match in the whole line.
    True only for a regex that opens with one character it must consume (a literal, an
    escaped character or class, a set) and has no lookbehind and no top-level alternative:
    every assertion it makes then looks at characters both strings share. So on a plain line,
    whose parsed message is a suffix of it, no match in the line means none in the message
    (see Scanner._confirm). Conservative: False whenever the text is not simple to read."""
    flags = _FLAGS.match(regex)
    body = regex[flags.end() :] if flags else regex
    if not body or "(?<" in body or body[0] in _META:
        return False
    if body[0] == "\\":
        if len(body) < 2 or body[1] in _ZERO_WIDTH_ESCAPES or body[1].isdigit():
            return False
        first = 2
    elif body[0] == "[":
        start = 2 if body[1:2] == "^" else 1
        close = body.find("]", start + 1 if body[start : start + 1] == "]" else start)
        if close < 0:
            return False
        first = close + 1
    else:
        first = 1
    if body[first : first + 1] in ("?", "*", "{"):
        return False
    depth, i, in_set = 0, 0, False
    while i < len(body):  # no `|` outside groups (a branch could open with an assertion)
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_set:
            in_set = c != "]"
        elif c == "[":
            in_set = True
            if body[i + 1 : i + 2] == "^":
                i += 1
            if body[i + 1 : i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return False
        i += 1
    return True


class DistinctFact:
    """Tells one distinct pattern's lines apart on their bytes (see Pattern.distinct).

    Exact for the values the caller reads: on a plain line matched once, the fact's regex
    finds the same match in the parsed message (a suffix of the line, after prefixes that end
    in a non-word character) as in the whole line, or none there and then the same one in the
    line, which is where the caller looks next; so the line's captures are the key's. A WRITER
    key also holds the bytes before the match, which decide the prefix the parser strips.
    Lines that are not plain, or match twice, are handed on whole, as any candidate.
    """

    def __init__(self, pid: int, pattern: Pattern) -> None:
        self.pid = pid
        self.regex = re.compile(pattern.regex.encode())
        # Python `re` skips ahead to a pattern's leading literal in C, but not past a leading
        # \b (30 ms instead of 1.7 per 4 MB): over a chunk, the boundary is checked apart
        self.boundary = pattern.regex.startswith(r"\b")
        self.scan = re.compile(pattern.regex[2:].encode()) if self.boundary else self.regex
        self.writer = pattern.distinct == Distinct.WRITER

    def done(self, keys: set[object]) -> bool:
        """A fact without captures (a transport was named) needs one line, ever."""
        return not self.scan.groups and () in keys

    def _inside_one_line(self, chunk: bytes, m: re.Match[bytes]) -> bool:
        """A match the regex finds on the line alone: no newline in it, and its leading \b
        (if any) holds (what precedes it in the line, or the line's start, is no word byte)."""
        if b"\n" in m.group(0):
            return False
        s = m.start()
        return not self.boundary or s == 0 or chunk[s - 1] not in _WORD_BYTES

    def whole_chunk(self, chunk: bytes, keys: set[object]) -> list[tuple[int, int]]:
        """Every line holding the literal is plain and holds it once: the first line of each
        value not seen before, found in C (findall) and then located by one search."""
        out: list[tuple[int, int]] = []
        if self.writer:  # a key per match; the loop is kept to the fewest calls per match
            rfind = chunk.rfind
            for m in self.scan.finditer(chunk):
                s = m.start()
                key = (chunk[rfind(b"\n", 0, s) + 1 : s], m.groups())
                if key not in keys and self._inside_one_line(chunk, m):
                    keys.add(key)
                    out.append((self.pid, m.end() - 1))
            return out
        if not self.scan.groups:
            if () in keys or self.scan.search(chunk) is None:
                return out
            found: set[object] = {()}
        else:  # values of matches without their \b, or across a line end: a superset, each
            # new one confirmed below on a match inside one line
            found = {v if isinstance(v, tuple) else (v,) for v in self.scan.findall(chunk)}
        new = found - keys
        if not new:
            return out
        for m in self.scan.finditer(chunk):  # the first line-level match of each new value
            values = m.groups()
            if values in new and self._inside_one_line(chunk, m):
                new.discard(values)
                keys.add(values)
                out.append((self.pid, m.end() - 1))
                if not new:
                    break
        return out

    def by_line(
        self, chunk: bytes, offsets: Iterable[int], keys: set[object]
    ) -> list[tuple[int, int]]:
        """The prefilter's candidate lines, less plain lines whose value was seen."""
        out: list[tuple[int, int]] = []
        last_end = -1
        rfind, find, search = chunk.rfind, chunk.find, self.regex.search
        for offset in sorted(offsets):
            if offset <= last_end:
                continue
            start = rfind(b"\n", 0, offset) + 1
            end = find(b"\n", offset)
            last_end = end = len(chunk) if end < 0 else end
            line = chunk[start:end]
            if not plain_line(line):
                out.append((self.pid, offset))  # parsed as any candidate
                continue
            m = search(line)
            if m is None:
                continue  # neither the line nor its message holds a match
            if search(line, m.start() + 1) is not None:
                out.append((self.pid, offset))
                continue
            key = (line[: m.start()], m.groups()) if self.writer else m.groups()
            if key not in keys:
                keys.add(key)
                out.append((self.pid, offset))
        return out


class _Matcher(ABC):
    """What both engines share: sampling, caps, distinct facts; the engines say which patterns
    occur in a chunk and where."""

    name = "base"

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = list(patterns)
        self._sampled = _by_literal(patterns, sampled=True)
        self._distinct = {
            pid: DistinctFact(pid, p)
            for pid, p in enumerate(patterns)
            if p.distinct is not None and not p.sampled
        }

    def candidate_lines(self, chunk: bytes, seen: Seen | None = None) -> Candidates:
        seen = seen if seen is not None else Seen()
        hits = _sampled_hits(chunk, self._sampled)
        locate: list[int] = []
        facts: dict[int, DistinctFact] = {}
        every = None if seen.dense else self._every_if_sparse(chunk)
        seen.dense = every is None
        present = {pid for pid, _ in every} if every is not None else self._present(chunk)
        for pid in sorted(present):
            if pid in seen.capped:
                continue
            fact = self._distinct.get(pid)
            if fact is None or not fact.done(seen.keys.setdefault(pid, set())):
                locate.append(pid)
                if fact is not None:
                    facts[pid] = fact
        if every is not None:
            wanted = set(locate)
            located = (
                every
                if len(wanted) == len(present)
                else [(pid, offset) for pid, offset in every if pid in wanted]
            )
        else:
            located = self._locate(chunk, locate) if locate else []
        if facts:
            offsets: dict[int, list[int]] = {pid: [] for pid in facts}
            rest: list[tuple[int, int]] = []
            for pid, offset in located:
                if pid in offsets:
                    offsets[pid].append(offset)
                else:
                    rest.append((pid, offset))
            located = rest
            messy: set[int] | None = None
            for pid, fact in facts.items():
                keys = seen.keys[pid]
                if len(offsets[pid]) >= BULK_MIN_LINES:
                    messy = self._messy(chunk) if messy is None else messy
                    if pid not in messy:
                        hits.extend(fact.whole_chunk(chunk, keys))
                        continue
                hits.extend(fact.by_line(chunk, offsets[pid], keys))
        hits.extend(located)
        return _group_by_line(chunk, hits)

    def _every_if_sparse(self, chunk: bytes) -> list[tuple[int, int]] | None:
        """(pattern id, offset) of every candidate of every pattern when the chunk has few,
        else None (the engine then asks which patterns occur, and locates those)."""
        return None

    @abstractmethod
    def _present(self, chunk: bytes) -> set[int]:
        """The non-sampled patterns that may occur in the chunk."""

    @abstractmethod
    def _messy(self, chunk: bytes) -> set[int]:
        """The distinct patterns to look at line by line in this chunk: a line holding the
        literal is not plain text or holds it twice (or some line is too long to tell)."""

    @abstractmethod
    def _locate(self, chunk: bytes, pids: list[int]) -> list[tuple[int, int]]:
        """(pattern id, offset) of every candidate of the given patterns."""


class LiteralMatcher(_Matcher):
    """Stdlib fallback: `bytes.find` per distinct literal. About 25 MB/s with ~200 literals."""

    name = "stdlib"

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        super().__init__(patterns)
        self._literals = _by_literal(patterns, sampled=False)

    def _present(self, chunk: bytes) -> set[int]:
        return {pid for lit, pids in self._literals if lit in chunk for pid in pids}

    def _messy(self, chunk: bytes) -> set[int]:
        return set(self._distinct)  # no cheap test here: distinct facts line by line

    def _locate(self, chunk: bytes, pids: list[int]) -> list[tuple[int, int]]:
        wanted = set(pids)
        hits: list[tuple[int, int]] = []
        find = chunk.find
        for literal, lit_pids in self._literals:
            mine = [pid for pid in lit_pids if pid in wanted]
            if not mine:
                continue
            pos = find(literal)
            while pos >= 0:
                hits.extend((pid, pos) for pid in mine)
                end = find(b"\n", pos)
                if end < 0:
                    break
                pos = find(literal, end)
        return hits


class HyperscanMatcher(_Matcher):
    """Hyperscan block mode over a whole chunk; patterns compiled in prefilter mode, so a
    candidate is a superset of real matches and Python `re` has the last word."""

    name = "hyperscan"

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        if _hs is None:
            raise RuntimeError("hyperscan is not installed")
        super().__init__(patterns)
        self._ids = [pid for pid, p in enumerate(patterns) if not p.sampled]
        self._forms = {pid: _prefilter_form(patterns[pid]) for pid in self._ids}
        self._db: object | None = None
        self._presence: object | None = None
        self._subsets: dict[tuple[int, ...], tuple[object, object]] = {}
        if not self._ids:
            return
        forms = [self._forms[pid] for pid in self._ids]
        self._db = _compiled_database(forms, self._ids)
        self._scratch = _hs.Scratch(self._db)
        # presence: each pattern once per chunk
        single = _hs.HS_FLAG_SINGLEMATCH
        self._presence = _compiled_database(
            [(rx, flags | single) for rx, flags in forms], self._ids
        )
        self._presence_scratch = _hs.Scratch(self._presence)
        # per distinct fact, its literal on a line with a byte that is not plain text, or
        # twice; and long lines: scanned only where a distinct fact occurs (in the presence
        # database they slowed it from 1.3 to 1.0 GB/s on every chunk)
        n = len(patterns)
        self._messy_of: dict[int, int] = {n: -1}
        messy: list[tuple[str, int]] = [(f"[^\\n]{{{MAX_TEXT + 1}}}", single)]
        dirty = r"[\x00-\x08\x0b-\x1f\x7f-\xff]"
        for k, pid in enumerate(sorted(self._distinct), start=1):
            lit = re.escape(patterns[pid].literal)
            messy.append((f"{lit}[^\\n]*(?:{dirty}|{lit})|{dirty}[^\\n]*{lit}", single))
            self._messy_of[n + k] = pid
        self._messy_db = _compiled_database(messy, list(self._messy_of))
        self._messy_scratch = _hs.Scratch(self._messy_db)

    def _every_if_sparse(self, chunk: bytes) -> list[tuple[int, int]] | None:
        if self._db is None:
            return []
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(pid: int, start: int, end: int, flags: int, ctx: object) -> bool:
            append((pid, end - 1 if end > 0 else 0))
            return len(hits) >= SPARSE_MAX  # True stops the scan: a dense chunk

        try:
            self._db.scan(  # type: ignore[attr-defined]
                chunk, match_event_handler=on_match, scratch=self._scratch
            )
        except _hs.ScanTerminated:  # type: ignore[union-attr]
            return None
        return hits

    def _present(self, chunk: bytes) -> set[int]:
        found: set[int] = set()
        if self._presence is not None:
            add = found.add

            def on_match(pid: int, start: int, end: int, flags: int, ctx: object) -> None:
                add(pid)

            self._presence.scan(  # type: ignore[attr-defined]
                chunk, match_event_handler=on_match, scratch=self._presence_scratch
            )
        return found

    def _messy(self, chunk: bytes) -> set[int]:
        found: set[int] = set()
        add = found.add

        def on_match(pid: int, start: int, end: int, flags: int, ctx: object) -> None:
            add(self._messy_of[pid])

        self._messy_db.scan(  # type: ignore[attr-defined]
            chunk, match_event_handler=on_match, scratch=self._messy_scratch
        )
        return set(self._distinct) if -1 in found else found

    def _locate(self, chunk: bytes, pids: list[int]) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append
        if len(pids) >= LOCATE_ALL_MIN and self._db is not None:
            wanted = set(pids)

            def on_wanted(pid: int, start: int, end: int, flags: int, ctx: object) -> None:
                if pid in wanted:
                    append((pid, end - 1 if end > 0 else 0))

            self._db.scan(  # type: ignore[attr-defined]
                chunk, match_event_handler=on_wanted, scratch=self._scratch
            )
            return hits

        def on_match(pid: int, start: int, end: int, flags: int, ctx: object) -> None:
            append((pid, end - 1 if end > 0 else 0))

        # up to SEPARATE_MAX patterns, one small database each: Hyperscan runs a lone literal
        # at 10 GB/s, two together at 3.6
        groups = [(pid,) for pid in pids] if len(pids) <= SEPARATE_MAX else [tuple(pids)]
        for group in groups:
            db, scratch = self._subset_db(group)
            db.scan(chunk, match_event_handler=on_match, scratch=scratch)  # type: ignore[attr-defined]
        return hits

    def _subset_db(self, pids: tuple[int, ...]) -> tuple[object, object]:
        """A database of just these patterns, compiled when first needed (0.2 ms a pattern,
        up to 180 ms for a few prefilter regexes: those are loaded from the on-disk cache
        when another process compiled them, see SUBSET_KEEP_MIN_S) and kept for the next
        chunks, which mostly want the same few (one scan of it: 0.5 ms per 4 MB, against 4 ms
        for the database of all patterns)."""
        got = self._subsets.pop(pids, None)
        if got is None:
            if _hs is None:
                raise RuntimeError("hyperscan is not installed")
            forms = [self._forms[pid] for pid in pids]
            db = _compiled_database(forms, list(pids), keep_slower_than_s=SUBSET_KEEP_MIN_S)
            got = (db, _hs.Scratch(db))
            while len(self._subsets) >= SUBSET_DATABASES:
                del self._subsets[next(iter(self._subsets))]  # the least recently used
        self._subsets[pids] = got
        return got


def _prefilter_form(pattern: Pattern) -> tuple[str, int]:
    """The expression and flags Hyperscan searches for `pattern` (see LITERAL_SEARCH_MIN_CHARS);
    either way every line the regex matches is found."""
    assert _hs is not None
    # a regex with characters beyond ASCII (a shell's message in the user's language) would
    # be read byte by byte, its classes too (a class holding a full-width parenthesis is a
    # class of that character's 3 bytes): its literal, whose bytes are what they are, instead
    if len(pattern.literal) >= LITERAL_SEARCH_MIN_CHARS or not pattern.regex.isascii():
        return re.escape(pattern.literal), _hs.HS_FLAG_CASELESS
    # multiline: a signature's $ ends its line, not the chunk (without it "^Killed\s*$" was
    # found only where the line closed a chunk: bash's "Killed" mid-log went unread)
    return pattern.regex, _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_ALLOWEMPTY | _hs.HS_FLAG_MULTILINE


def _compiled_database(
    expressions: list[tuple[str, int]], ids: list[int], keep_slower_than_s: float = 0.0
) -> object:
    """Compile, or load the same database compiled before: compiling takes ~0.3 s, loading
    ~5 ms. The cache is keyed by everything that goes into the database. A database whose
    compile took less than `keep_slower_than_s` is not written (a subset database of a few
    literals costs less to compile again than a file in the cache)."""
    if _hs is None:
        raise RuntimeError("hyperscan is not installed")
    key = hashlib.sha256(
        repr((expressions, ids, getattr(_hs, "__version__", ""), platform.machine())).encode()
    ).hexdigest()[:32]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddpdoctor"
    path = cache / f"hs-{key}.db"
    with suppress(Exception):
        db = _hs.loadb(path.read_bytes(), _hs.HS_MODE_BLOCK)
        with suppress(OSError):
            os.utime(path)  # used now: the eviction keeps it (see _make_room)
        return db
    started = time.perf_counter()
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    db.compile(
        expressions=[rx.encode() for rx, _ in expressions],
        ids=ids,
        elements=len(ids),
        flags=[flags for _, flags in expressions],
    )
    if keep_slower_than_s and time.perf_counter() - started < keep_slower_than_s:
        return db
    with suppress(OSError):  # a read-only home only costs the compile next time
        cache.mkdir(parents=True, exist_ok=True)
        _make_room(cache)
        tmp = cache / f".hs-{key}.{os.getpid()}.tmp"
        tmp.write_bytes(_hs.dumpb(db))
        os.replace(tmp, path)
    return db


def _make_room(cache: Path) -> None:
    """Keep the cache under CACHE_MAX_FILES databases: the least recently used go first (a
    load marks a file used). Refusing to write once the cache was full (as before) made every
    later version of the rules compile its subset databases in every process for ever: 0.2 s
    of CPU on each diagnosis of a 0.25 GiB log once 2,000 files from earlier versions had
    filled it."""
    try:
        files = [e for e in os.scandir(cache) if e.name.startswith("hs-")]
    except OSError:
        return
    if len(files) < CACHE_MAX_FILES:
        return
    keep = max(0, int(CACHE_MAX_FILES * 0.9) - 1)
    for entry in sorted(files, key=_mtime)[: len(files) - keep]:
        with suppress(OSError):
            os.unlink(entry.path)


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat().st_mtime
    except OSError:
        return 0.0


def build_matcher(patterns: Sequence[Pattern], prefer: str = "auto") -> Matcher:
    """The fastest engine available; `prefer="stdlib"` forces the fallback (tests, debugging)."""
    if prefer != "stdlib" and _hs is not None:
        try:
            return HyperscanMatcher(patterns)
        except Exception:
            if prefer == "hyperscan":
                raise
    return LiteralMatcher(patterns)


def hyperscan_available() -> bool:
    return _hs is not None
