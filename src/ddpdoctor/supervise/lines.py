"""Routes the raw output of the job's stdout and stderr, chunk by chunk, to per-rank pieces
(lines that start with a torchrun prefix such as `[rank3]:` or `[default0]:`) and tells progress
which stream printed how many bytes and whether a progress line was among them. Lines cut by chunk
boundaries are joined; a line longer than WINDOW streams through instead of being held.
Works on offsets into the chunks it is given (no copies of complete lines); never writes files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpdoctor.supervise.linescan import PREFIX, PREFIX_LINE, PREFIX_MAX, LineScanner
from ddpdoctor.supervise.progress import JOB

WINDOW = 1 << 16
"""The longest unfinished line held back so that it reaches its rank log in one piece."""
# A run of consecutive lines with the same prefix: one match per run, not per line.
RUN = re.compile(rb"(?P<p>" + PREFIX + rb")[^\n]*\n(?:(?P=p)[^\n]*\n)*")

Piece = bytes | memoryview


@dataclass
class _Line:
    """The unfinished last line of one stream."""

    open: bool = False
    decided: bool = False
    label: str | None = None
    held: bytes = b""
    streaming: bool = False


@dataclass
class Marks:
    """Per label: bytes seen and whether a progress line was among them, for one batch."""

    size: dict[str, int] = field(default_factory=dict)
    progress: set[str] = field(default_factory=set)


@dataclass
class LineRouter:
    """`feed(stream, chunk)` in arrival order; then take `pieces` (label -> pieces in order) and
    `marks`. `fresh(label)` says a label had progress moments ago: its lines are not searched."""

    scanner: LineScanner
    fresh: Callable[[str], bool] = lambda _label: False
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    marks: Marks = field(default_factory=Marks)
    _lines: dict[int, _Line] = field(default_factory=dict)
    _skip: dict[str, bool] = field(default_factory=dict)

    def take(self) -> tuple[dict[str, list[Piece]], Marks]:
        """What the chunks fed since the last call produced; resets for the next batch."""
        out = (self.pieces, self.marks)
        self.pieces, self.marks, self._skip = {}, Marks(), {}
        return out

    def feed(self, stream: int, data: bytes) -> None:
        line = self._lines.setdefault(stream, _Line())
        n, i = len(data), 0
        if line.open:
            nl = data.find(b"\n")
            stop = n if nl < 0 else nl + 1
            if not line.decided:
                _decide(line, line.held + data[: min(stop, PREFIX_MAX)], nl >= 0)
            self._tail(line, data, 0, stop, complete=nl >= 0)
            if nl < 0:
                return
            i = stop
        last = data.rfind(b"\n", i)
        if last >= i:
            self._complete(data, i, last + 1)
            i = last + 1
        if i < n:
            line.open, line.decided, line.label, line.held, line.streaming = (
                True,
                False,
                None,
                b"",
                False,
            )
            _decide(line, data[i : i + PREFIX_MAX], complete=False)
            self._tail(line, data, i, n, complete=False)

    def close(self, stream: int) -> None:
        """End of `stream`: its unfinished line is routed as a line of its own."""
        line = self._lines.pop(stream, None)
        if line is None or not line.open:
            return
        if not line.decided:
            _decide(line, line.held[:PREFIX_MAX], complete=True)
        if line.label is not None and (line.held or line.streaming):
            self._put(line.label, line.held)
            self._put(line.label, b"\n")

    # ------------------------------------------------------------------ internals
    def _tail(self, line: _Line, data: bytes, start: int, end: int, complete: bool) -> None:
        """A piece of the unfinished line: counted now, written once complete (or too long)."""
        key = line.label if line.decided and line.label is not None else JOB
        self._count(key, data, start, end)
        if line.decided and line.label is None:
            line.held = b""  # an unlabeled line only goes to console.log
        elif line.streaming:
            self._put(str(line.label), memoryview(data)[start:end])
        elif complete or len(line.held) + end - start > WINDOW:
            if not line.decided:
                _decide(line, line.held[:PREFIX_MAX] + data[start : start + PREFIX_MAX], True)
            if line.label is not None:
                if line.held:
                    self._put(line.label, line.held)
                self._put(line.label, memoryview(data)[start:end])
            line.held = b""
            line.streaming = not complete
        else:
            line.held += data[start:end]
        if complete:
            line.open = False

    def _complete(self, data: bytes, start: int, end: int) -> None:
        """Complete lines: unlabeled stretches and runs of one rank, in order."""
        first = self.scanner.next_prefix(data, start, end)
        if first < 0:
            self._count(JOB, data, start, end)
            return
        if first > start:
            self._count(JOB, data, start, first)
        pos = first
        view = memoryview(data)
        while pos < end:
            m = RUN.match(data, pos, end)
            if m is not None:
                label = m.group(1)[1:-2].decode("ascii", "replace")
                self._put(label, view[pos : m.end()])
                self._count(label, data, pos, m.end())
                pos = m.end()
                continue
            nxt = self.scanner.next_prefix(data, pos, end)
            if nxt <= pos:  # not a prefix after all: this one line is unlabeled
                nl = data.find(b"\n", pos, end)
                nxt = end if nl < 0 else nl + 1
            self._count(JOB, data, pos, nxt)
            pos = nxt

    def _count(self, label: str, data: bytes, start: int, end: int) -> None:
        marks = self.marks
        marks.size[label] = marks.size.get(label, 0) + end - start
        if label in marks.progress or self._fresh(label):
            return
        if self.scanner.has_progress(data, start, end):
            marks.progress.add(label)

    def _fresh(self, label: str) -> bool:
        skip = self._skip.get(label)
        if skip is None:
            skip = self._skip[label] = self.fresh(label)
        return skip

    def _put(self, label: str, piece: Piece) -> None:
        bucket = self.pieces.get(label)
        if bucket is None:
            bucket = self.pieces[label] = []
        bucket.append(piece)


def _decide(line: _Line, head: bytes, complete: bool) -> None:
    """Label the unfinished line from its first bytes once they are enough to tell."""
    m = PREFIX_LINE.match(head)
    if m is not None:
        line.decided, line.label = True, m.group()[1:-2].decode("ascii", "replace")
    elif complete or len(head) >= PREFIX_MAX or b"]:" in head or head[:1] not in (b"", b"["):
        line.decided, line.label = True, None
