"""The run folder's logs as the job writes them: a thread that takes what the capture loop read
(in read order), appends it to console.log, routes complete lines to ranks/<label>.log and
tells progress what each rank printed. A separate thread so that a slow disk never holds up the
terminal and a blocked terminal never holds up the logs. Never drops: the loop stops reading the
job while `backlog()` is too large. Write errors are counted, not raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import deque
from collections.abc import Sequence

from ddpdoctor.supervise.dropbehind import DropBehind
from ddpdoctor.supervise.lines import LineRouter, Piece
from ddpdoctor.supervise.linescan import LineScanner
from ddpdoctor.supervise.progress import ProgressTracker
from ddpdoctor.supervise.rundir import RunDir

IOV_MAX = 1024
BATCH = 256
"""Chunks taken per turn: the writer catches up in a few large writes."""
PACE_S = 0.05
PACE_BELOW = 1 << 18
"""After a batch smaller than PACE_BELOW the writer rests PACE_S before the next (the loop
does not ring meanwhile): a job printing slowly costs one wake-up per 50 ms, not one per
read. console.log and progress lag by at most that much. Well below the capture's 1 MiB
reads: at 1 MiB the writer of a fast job rested after most reads and fell 50-68 MB behind,
its copies then came from memory gone cold, and the loop stopped reading the job at 64 MB."""
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
_STOP = -1


class LogWriter:
    """`put()`/`end()` from the capture loop (one thread); the writes run on this thread."""

    def __init__(self, rundir: RunDir, progress: ProgressTracker, scanner: LineScanner) -> None:
        self.rundir = rundir
        self.progress = progress
        self.handed = 0
        """Bytes given by the capture loop (written by that thread only)."""
        self.done = 0
        """Bytes written (by this thread only): handed - done is the backlog."""
        self.max_backlog = 0
        self.errors = 0
        self.first_error: str | None = None
        self._chunks: deque[tuple[int, bytes]] = deque()
        # A bare lock as a doorbell: the loop rings it only while this thread sleeps
        # (threading.Event costs several lock operations per ring).
        self._bell = threading.Lock()
        self._bell.acquire()
        self._sleeping = False
        self._stopping = False
        self._router = LineRouter(scanner, fresh=progress.fresh)
        self._files: dict[str, int | None] = {}
        self._console: int | None = None
        self._drop_behind: dict[int, DropBehind] = {}
        self._thread = threading.Thread(target=self._loop, name="ddpdoctor-logs", daemon=True)

    def start(self) -> None:
        try:
            self._console = os.open(self.rundir.console_log, _OPEN_FLAGS, 0o644)
            self._drop_behind[self._console] = DropBehind(self._console)
        except OSError as exc:
            self._error(exc)
        self._thread.start()

    def put(self, stream: int, data: bytes) -> None:
        self._chunks.append((stream, data))
        self.handed += len(data)
        backlog = self.handed - self.done
        if backlog > self.max_backlog:
            self.max_backlog = backlog
        self._ring()

    def end(self, stream: int) -> None:
        """`stream` reached its end: its unfinished last line is routed as it is."""
        self._chunks.append((stream, b""))
        self._ring()

    def backlog(self) -> int:
        return self.handed - self.done

    def finish(self) -> None:
        """Write everything handed over, then close the files (waits for the disk)."""
        self._stopping = True
        self._chunks.append((_STOP, b""))
        self._ring()
        self._thread.join()

    def _ring(self) -> None:
        if self._sleeping:
            self._sleeping = False
            with contextlib.suppress(RuntimeError):  # rung already
                self._bell.release()

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        chunks = self._chunks
        while True:
            if not chunks:
                self._sleeping = True
                if not chunks:  # checked again after saying so: no ring is missed
                    self._bell.acquire()
                self._sleeping = False
                continue
            batch = [chunks.popleft() for _ in range(min(BATCH, len(chunks)))]
            if not self._write(batch):
                break
            if sum(len(c) for _, c in batch) < PACE_BELOW and not self._stopping:
                time.sleep(PACE_S)
        for fd in [self._console, *self._files.values()]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _write(self, batch: list[tuple[int, bytes]]) -> bool:
        """Route first (progress must not wait for the disk), then write; False at the end.
        console.log gets every chunk even if routing fails: a bug there must not stop the
        logs, nor (through the backlog) the job."""
        go_on = True
        data: list[Piece] = []
        for stream, chunk in batch:
            if stream == _STOP:
                go_on = False
            elif chunk:
                data.append(chunk)
        try:
            pieces = self._route(batch)
        except Exception as exc:
            self._router = LineRouter(self._router.scanner, fresh=self.progress.fresh)
            pieces = {}
            self.errors += 1
            self.first_error = self.first_error or f"routing: {type(exc).__name__}: {exc}"
        if self._console is not None and data:
            self._append(self._console, data)
        for label, parts in pieces.items():
            fd = self._rank_file(label)
            if fd is not None:
                self._append(fd, parts)
        self.done += sum(len(c) for c in data)
        return go_on

    def _route(self, batch: list[tuple[int, bytes]]) -> dict[str, list[Piece]]:
        router = self._router
        for stream, chunk in batch:
            if chunk:
                router.feed(stream, chunk)
            elif stream != _STOP:
                router.close(stream)
        pieces, marks = router.take()
        if marks.size:
            self.progress.record(marks.size, marks.progress, time.monotonic())
        return pieces

    def _rank_file(self, label: str) -> int | None:
        if label not in self._files:
            try:
                fd = os.open(self.rundir.rank_log(label), _OPEN_FLAGS, 0o644)
                self._files[label] = fd
                self._drop_behind[fd] = DropBehind(fd)
            except OSError as exc:
                self._files[label] = None
                self._error(exc)
        return self._files[label]

    def _append(self, fd: int, parts: Sequence[Piece]) -> None:
        try:
            for i in range(0, len(parts), IOV_MAX):
                group = parts[i : i + IOV_MAX]
                total = sum(len(p) for p in group)
                done = os.writev(fd, group)
                if done < total:  # a short write to a file: disk full or a signal
                    rest = memoryview(b"".join(group))[done:]
                    while rest:
                        n = os.write(fd, rest)
                        if n <= 0:
                            raise OSError(errno.ENOSPC, "short write", str(fd))
                        rest = rest[n:]
                self._drop_behind[fd].wrote(total)
        except OSError as exc:
            self._error(exc)

    def _error(self, exc: OSError) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{exc.filename or 'log'}: {exc.strerror or exc}"

    def as_dict(self) -> dict[str, object]:
        return {
            "written": self.done,
            "max_backlog": self.max_backlog,
            "errors": self.errors,
            "error": self.first_error,
        }
