"""Output capture: one loop on the supervisor's main thread reads the job's stdout and stderr
pipes in large reads (1 MiB pipes) and passes every byte on, in order per stream, to our own
stdout/stderr (TerminalOut, never blocking) and to the log writer thread (console.log, per-rank
logs, progress). Nothing is dropped: when the terminal or the disk is behind by more than
`backlog_bytes`, the loop stops reading that pipe and the job's writes block, as on a pipe
without ddpdoctor. Reads are coalesced (a short pause after a small read) so that a job that
flushes every line does not wake the loop once per line.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import select
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from ddpdoctor.supervise.linescan import LineScanner
from ddpdoctor.supervise.logwriter import LogWriter
from ddpdoctor.supervise.progress import ProgressTracker
from ddpdoctor.supervise.rundir import RunDir
from ddpdoctor.supervise.terminal import NONBLOCKING, SOCKET, TerminalOut

READ_SIZE = 1 << 20
BACKLOG_BYTES = 16 << 20
"""Default bound on what is held for a terminal that is not reading (per stream)."""
LOG_BACKLOG_BYTES = 64 << 20
COALESCE_BELOW = 1 << 19
COALESCE_S = 0.02
"""After a read of less than COALESCE_BELOW, wait up to this long before the next: each turn of
the loop costs ~0.1 ms whatever it carries, and a job that flushes every line would otherwise
make one turn per line. Output reaches the terminal at most this much later."""
COALESCE_FILL = 2
"""The wait is shortened so that, at the rate the last turn saw, at most 1/COALESCE_FILL of the
job's pipe fills meanwhile: a job printing 70 MB/s in small flushed writes filled the 1 MiB
pipe within a fixed 20 ms wait and then waited on it (1.5x its bare time)."""
DRAIN_S = 5.0
"""After the job's main process ended, how long its pipes may stay open without EOF (a stray
grandchild holding them) before the loop stops waiting; time spent throttled does not count."""
RETRY_MS = 10
STREAM_NAMES = {1: "stdout", 2: "stderr"}
_IN = select.POLLIN | select.POLLHUP | select.POLLERR


class Capture:
    """Owns the pump loop (`run`, on the calling thread), the terminals and the log writer."""

    def __init__(
        self,
        rundir: RunDir,
        progress: ProgressTracker,
        echo: bool = True,
        backlog_bytes: int = BACKLOG_BYTES,
        scanner: LineScanner | None = None,
    ) -> None:
        self.echo = echo
        self.progress = progress
        self.backlog_bytes = max(READ_SIZE, backlog_bytes)
        self.scanner = scanner or LineScanner()
        self.log = LogWriter(rundir, progress, self.scanner)
        self.terminals: dict[int, TerminalOut] = {}
        self.read_bytes: dict[int, int] = {}
        self.reads = 0
        self._avail = array.array("i", [0])
        self._fill_bytes = PIPE_FALLBACK // COALESCE_FILL
        self.turns = 0
        self.throttled_s = 0.0
        self.drained = True
        self._posted: list[tuple[int, bytes]] = []
        self._post_lock = threading.Lock()
        self._running = False
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    # ------------------------------------------------------------------ other threads
    def post(self, fd: int, data: bytes) -> None:
        """Print a message of ours (a hang report) on fd 1/2 after the job's pending output,
        without blocking the caller while the loop runs; directly (blocking) otherwise."""
        with self._post_lock:
            if self._running and fd in self.terminals and self.terminals[fd].error is None:
                self._posted.append((fd, data))
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"\0")
                return
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

    def notifier(self, fallback: Callable[[str], None]) -> Callable[[str], None]:
        """`notify` for the watchdog: through `post` when the job's output passes through us."""
        if not self.echo:
            return fallback

        def notify(text: str) -> None:
            self.post(2, (text.rstrip("\n") + "\n").encode("utf-8", "replace"))

        return notify

    # ------------------------------------------------------------------ the loop
    def run(self, pipes: dict[int, int], pid: int, exited: Callable[[], bool]) -> None:
        """Pump until the job (`pid`) ended, its pipes are drained and every byte delivered.

        `pipes` maps our output fd (1 or 2) to the read end of the job's pipe for it."""
        for out in pipes:
            self.read_bytes[out] = 0
            if self.echo:
                self.terminals[out] = TerminalOut(out, STREAM_NAMES.get(out, f"fd {out}"))
        keep_freed_memory()
        self.log.start()
        pidfd = _pidfd(pid)
        open_pipes = dict(pipes)
        for fd in open_pipes.values():
            os.set_blocking(fd, False)
        sizes = [_pipe_size(fd) for fd in open_pipes.values()]
        self._fill_bytes = min(sizes or [PIPE_FALLBACK]) // COALESCE_FILL
        with self._post_lock:
            self._running = True
        try:
            self._pump(open_pipes, pidfd, exited)
        finally:
            for fd in open_pipes.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(pidfd)
            with self._post_lock:
                self._running = False
                posted, self._posted = self._posted, []
            for fd, data in posted:
                self.terminals[fd].offer(data)
            self._flush_blocking()
            self.log.finish()
            for term in self.terminals.values():
                term.close()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _pump(
        self, open_pipes: dict[int, int], pidfd: int | None, exited: Callable[[], bool]
    ) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        registered: dict[int, int] = {}
        child_done, exit_seen, held = False, pidfd is None, False
        drain_left = DRAIN_S
        last = turn_end = time.monotonic()
        log, terms, limit = self.log, self.terminals, self.backlog_bytes
        term_of = {t.poll_fd: t for t in terms.values() if t.mode in (NONBLOCKING, SOCKET)}
        while True:
            now = time.monotonic()
            if not child_done and exit_seen and exited():
                child_done = True
                if pidfd is not None:
                    poller.unregister(pidfd)
            wanted: dict[int, int] = {}
            throttled = log_full = False
            for out, rfd in open_pipes.items():
                term = terms.get(out)
                if log.backlog() >= LOG_BACKLOG_BYTES:
                    throttled = log_full = True
                elif term is not None and term.backlog >= limit:
                    throttled = True
                else:
                    wanted[rfd] = _IN
            for fd, term in term_of.items():
                if term.pending:
                    wanted[fd] = select.POLLOUT
            # the time since the last turn was spent in the state decided then: one long
            # wait for a reader ends with a flush that may clear the backlog at once
            if held:
                self.throttled_s += now - last
            elif child_done:
                drain_left -= now - last
            if throttled != held:
                held = throttled
                self.progress.hold(held, now)
            if child_done:
                if open_pipes and drain_left <= 0:
                    self.drained = False
                    for out, rfd in list(open_pipes.items()):
                        self._close_stream(out, rfd, open_pipes, poller, registered)
                if not open_pipes and not any(t.pending for t in terms.values()):
                    return
            last = now
            for fd, mask in wanted.items():
                if registered.get(fd) != mask:
                    poller.register(fd, mask)
                    registered[fd] = mask
            for fd in [fd for fd in registered if fd not in wanted]:
                poller.unregister(fd)
                del registered[fd]
            timeout: int | None = None
            if not exit_seen:
                timeout = None if pidfd is not None else 50
            if log_full:
                timeout = RETRY_MS
            elif child_done and open_pipes and not throttled:
                timeout = max(1, int(drain_left * 1000))
            got = 0
            self.turns += 1
            for fd, _events in poller.poll(timeout):
                if fd == self._wake_r:
                    self._take_posted()
                elif fd == pidfd:
                    exit_seen = True
                elif fd in term_of:
                    term_of[fd].flush()  # POLLOUT, or POLLERR: the write reports it
                else:
                    stream = next((o for o, r in open_pipes.items() if r == fd), None)
                    if stream is not None:
                        got += self._read(stream, fd, open_pipes, poller, registered)
            if pidfd is None:
                exit_seen = True  # no descriptor for the exit: ask every turn
            if 0 < got < COALESCE_BELOW and not child_done:
                time.sleep(self._pause(got, time.monotonic() - turn_end))
            turn_end = time.monotonic()

    def _pause(self, got: int, since_s: float) -> float:
        """How long to let output gather: COALESCE_S, less where the job writes so fast that
        it would fill more than 1/COALESCE_FILL of its pipe meanwhile (`got` bytes came in
        the `since_s` seconds since the previous turn ended)."""
        rate = got / max(since_s, 1e-4)
        return min(COALESCE_S, self._fill_bytes / rate)

    def _read(
        self,
        out: int,
        rfd: int,
        open_pipes: dict[int, int],
        poller: select.poll,
        registered: dict[int, int],
    ) -> int:
        try:
            # exactly what the pipe holds: a 1 MiB read that returns less costs ~0.1 ms more
            # in allocating and shrinking its buffer than the read itself
            fcntl.ioctl(rfd, termios.FIONREAD, self._avail, True)
            want = min(READ_SIZE, self._avail[0])
            term = self.terminals.get(out)
            teed = term.tee_from(rfd, want) if term is not None else 0
            data = os.read(rfd, want or READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            data = b""
        if not data:
            self._close_stream(out, rfd, open_pipes, poller, registered)
            return 0
        self.read_bytes[out] += len(data)
        self.reads += 1
        self.log.put(out, data)  # the logs first: they never wait for the terminal
        if term is not None:
            term.offer(memoryview(data)[teed:] if teed else data)
        return len(data)

    def _close_stream(
        self,
        out: int,
        rfd: int,
        open_pipes: dict[int, int],
        poller: select.poll,
        registered: dict[int, int],
    ) -> None:
        del open_pipes[out]
        if registered.pop(rfd, None) is not None:
            poller.unregister(rfd)
        with contextlib.suppress(OSError):
            os.close(rfd)
        self.log.end(out)

    def _take_posted(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass
        with self._post_lock:
            posted, self._posted = self._posted, []
        for fd, data in posted:
            self.terminals[fd].offer(data)

    def _flush_blocking(self) -> None:
        """The end: wait (in poll) until each terminal took everything or failed."""
        poller = select.poll()
        while True:
            waiting = [t for t in self.terminals.values() if t.pending and t.error is None]
            if not waiting:
                return
            for t in waiting:
                poller.register(t.poll_fd, select.POLLOUT)
            poller.poll(1000)
            for t in waiting:
                t.flush()
                poller.unregister(t.poll_fd)

    def stats(self) -> dict[str, Any]:
        return {
            "read": {STREAM_NAMES.get(k, str(k)): v for k, v in self.read_bytes.items()},
            "reads": self.reads,
            "turns": self.turns,
            "terminal": {t.name: t.as_dict() for t in self.terminals.values()},
            "logs": self.log.as_dict(),
            "throttled_s": round(self.throttled_s, 3),
            "drained": self.drained,
            "engine": self.scanner.engine,
        }


def keep_freed_memory() -> None:
    """Let glibc keep freed read buffers for reuse (up to 32 MiB) instead of giving them back
    and faulting in fresh zeroed pages for the next 1 MiB read: measured 0.13 s instead of
    0.18-0.32 s of ddpdoctor CPU per 200 MB. Affects only this process; a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 4 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 32 << 20)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h


PIPE_FALLBACK = 1 << 16
"""A pipe's capacity where it cannot be asked (Linux's default)."""


def _pipe_size(fd: int) -> int:
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except (OSError, AttributeError):
        return PIPE_FALLBACK


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+), else None (polled)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
