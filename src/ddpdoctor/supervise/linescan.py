"""Looks at a range of job output in one pass: does it hold a progress line, and where is the
first line with a torchrun rank prefix? Hyperscan when installed (about 0.2 ms per MB), a
stdlib literal prefilter otherwise (Python `re` alone reads ~22 MB/s here: it would throttle
the job). Owns the two patterns; knows nothing about files, ranks or time.
"""

from __future__ import annotations

import contextlib
import re
from types import ModuleType

_hs: ModuleType | None
try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the platform
    _hs = None

# A progress line: training-loop words or a tqdm bar (`45%|####  | 45/100 [00:01<00:02, 30it/s]`).
# Rarer words of progress count only with a number behind them, as in the diagnosis
# (analysis/scanner.py's PROGRESS_LINE): StyleGAN's 'kimg 0.4', a federated 'round : 3', an
# 'eta: 0:01:02', a 'train_loss = 1.27'.
PROGRESS_WORDS = (
    rb"\b(?:steps?|iter(?:ation)?s?|epochs?|loss|batch)\b"
    rb"|(?:\b(?:kimg|rounds?|eta)|train_loss)\b\s{0,8}[:=\[]?\s{0,8}\d"
)
PROGRESS_BAR = rb"\d%\||it/s\]|s/it\]"
PROGRESS = re.compile(rb"(?i)" + PROGRESS_WORDS + rb"|" + PROGRESS_BAR)
# torchrun `--tee`: `[{role}{local_rank}]:` (`[default0]:`), or a template such as `[rank3]:`
# (torch/distributed/elastic/multiprocessing/tail_log.py writes f"{header}{line}").
PREFIX = rb"\[[A-Za-z_][A-Za-z_-]{0,30}?\d{1,9}\]:"
PREFIX_MAX = 44
"""The longest prefix PREFIX matches, in bytes."""
PREFIX_LINE = re.compile(PREFIX)
# Every literal a progress match holds, in lower case: the fallback's prefilter.
_LITERALS = (
    b"step",
    b"iter",
    b"epoch",
    b"loss",
    b"batch",
    b"kimg",
    b"round",
    b"eta",
    b"%|",
    b"it/s]",
    b"s/it]",
)


class _Hit:
    """Hyperscan callback state: the end of the first match; the scan stops there."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end = -1

    def on_match(self, _pid: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
        self.end = end
        return True  # stop: only the first match is wanted


class LineScanner:
    """Ranges are `data[start:end]`, `start` at a line start; offsets returned are absolute.

    Two databases, each scanned until its first match: a joint one would go on to the end
    of a block whenever one of its patterns is missing, and progress words are dense in many
    logs (1 ms per MB where every line has one, against 0.2 ms stopping at the first)."""

    def __init__(self, prefer: str = "auto") -> None:
        self.engine = "stdlib"
        self._prefix_db: object | None = None
        self._progress_db: object | None = None
        if prefer != "stdlib" and _hs is not None:
            try:
                once = _hs.HS_FLAG_SINGLEMATCH
                self._prefix_db = _database([rb"^" + PREFIX], [_hs.HS_FLAG_MULTILINE | once])
                self._progress_db = _database(
                    [PROGRESS_WORDS, PROGRESS_BAR], [_hs.HS_FLAG_CASELESS | once, once]
                )
                self._prefix_scratch = _hs.Scratch(self._prefix_db)
                self._progress_scratch = _hs.Scratch(self._progress_db)
                self.engine = "hyperscan"
            except Exception:
                if prefer == "hyperscan":
                    raise
                self._prefix_db = self._progress_db = None

    def has_progress(self, data: bytes, start: int, end: int) -> bool:
        """Whether a progress line is in the range."""
        if self._progress_db is None:
            return _fallback_progress(data, start, end)
        hit = _Hit()
        _run(self._progress_db, self._progress_scratch, memoryview(data)[start:end], hit)
        return hit.end >= 0

    def next_prefix(self, data: bytes, start: int, end: int) -> int:
        """Offset of the first line in the range that starts with a rank prefix, or -1."""
        if self._prefix_db is None:
            return _fallback_prefix(data, start, end)
        hit = _Hit()
        _run(self._prefix_db, self._prefix_scratch, memoryview(data)[start:end], hit)
        if hit.end < 0:
            return -1
        # the prefix starts its line and is short: the line start is close before its end
        stop = start + hit.end
        nl = data.rfind(b"\n", max(start, stop - PREFIX_MAX - 1), stop)
        return nl + 1 if nl >= 0 else start


def _run(db: object, scratch: object, view: memoryview, hit: _Hit) -> None:
    if _hs is None:  # pragma: no cover - only called when a database was compiled
        return
    with contextlib.suppress(_hs.ScanTerminated):  # the callback asked to stop
        db.scan(view, match_event_handler=hit.on_match, scratch=scratch)  # type: ignore[attr-defined]


def _database(expressions: list[bytes], flags: list[int]) -> object:
    """A few short patterns compile in milliseconds: no cache needed."""
    if _hs is None:  # pragma: no cover
        raise RuntimeError("hyperscan is not installed")
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    db.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=flags,
    )
    return db


def _fallback_prefix(data: bytes, start: int, end: int) -> int:
    pos = data.find(b"]:", start, end)
    while pos >= 0:
        line = max(start, data.rfind(b"\n", start, pos) + 1)
        if PREFIX_LINE.match(data, line, end):
            return line
        nl = data.find(b"\n", pos, end)
        if nl < 0:
            return -1
        pos = data.find(b"]:", nl, end)
    return -1


def _fallback_progress(data: bytes, start: int, end: int) -> bool:
    """Lower-case literal search, then the regex on each line that holds a literal."""
    low = data[start:end].lower()
    for literal in _LITERALS:
        pos = low.find(literal)
        while pos >= 0:
            line = low.rfind(b"\n", 0, pos) + 1
            stop = low.find(b"\n", pos)
            stop = len(low) if stop < 0 else stop
            if PROGRESS.search(data, start + line, start + stop):
                return True
            pos = low.find(literal, stop)
    return False
