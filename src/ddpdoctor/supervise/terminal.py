"""One of ddpdoctor's own outputs (stdout or stderr) as the job's output goes out through it:
writes that never block the capture loop, and the bytes not yet taken by a slow reader. Into a
pipe, what the job's pipe holds is first duplicated in the kernel (tee(2): the same pages, no
copy through ddpdoctor) while nothing is pending; what tee could not pass is written as before.

Pipes, FIFOs and terminals are opened a second time through /proc/self/fd with O_NONBLOCK, so
the shell's own file description keeps its flags (a shell left with a non-blocking terminal
misbehaves, also after a SIGKILL of ddpdoctor); sockets are written with MSG_DONTWAIT; a
regular file never waits on a reader and is written as it is. Owns no policy on how much may
be held back: the capture loop reads `backlog` and stops reading the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import stat
from collections import deque
from collections.abc import Callable
from typing import cast

IOV_MAX = 1024
BLOCKING, NONBLOCKING, SOCKET = "blocking", "nonblocking", "socket"


class TerminalOut:
    """`offer()` writes what it can now and keeps the rest in order; `flush()` on POLLOUT."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self.written = 0
        self.backlog = 0
        self.max_backlog = 0
        self.error: str | None = None
        self.unsent = 0
        """Bytes the job wrote after our reader went away (EPIPE): in the logs only."""
        self._pending: deque[memoryview] = deque()
        self._sock: socket.socket | None = None
        self.fifo = False
        self.mode, self.poll_fd = self._open(fd)
        self.teed = 0
        self._tee = _libc_tee() if self.fifo and self.mode == NONBLOCKING else None

    def _open(self, fd: int) -> tuple[str, int]:
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            self.error = f"{self.name} is not open ({exc.strerror})"
            return BLOCKING, fd
        if stat.S_ISREG(mode):
            return BLOCKING, fd
        if stat.S_ISSOCK(mode):
            try:
                self._sock = socket.socket(fileno=os.dup(fd))
                return SOCKET, self._sock.fileno()
            except OSError:
                return BLOCKING, fd
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            out = os.open(f"/proc/self/fd/{fd}", flags)
        except OSError:
            return BLOCKING, fd
        self.fifo = stat.S_ISFIFO(mode)
        if self.fifo:
            _enlarge(out)
        return NONBLOCKING, out

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def offer(self, data: bytes | memoryview) -> None:
        """Queue `data` after what is pending and write as much as the reader takes now."""
        if not data:
            return
        if self.error is not None:
            self.unsent += len(data)
            return
        view = memoryview(data)
        if not self._pending:
            sent = self._send([view])
            if sent == len(view):
                return
            if self.error is not None:
                self.unsent += len(view) - sent
                return
            view = view[sent:]
        self._pending.append(view)
        self.backlog += len(view)
        self.max_backlog = max(self.max_backlog, self.backlog)

    def tee_from(self, rfd: int, n: int) -> int:
        """Duplicate up to `n` bytes at the head of pipe `rfd` into this terminal (a pipe) in
        the kernel, without consuming them: page references, no copy. 0 when not possible."""
        if self._tee is None or self._pending or self.error is not None or n <= 0:
            return 0
        done = self._tee(rfd, self.poll_fd, n, SPLICE_F_NONBLOCK)
        if done < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            if err in (errno.EINVAL, errno.ENOSYS):
                self._tee = None  # not a pipe after all, or no tee here: copy instead
                return 0
            self._fail(OSError(err, os.strerror(err)))
            return 0
        self.written += done
        self.teed += done
        return int(done)

    def flush(self) -> None:
        """Write pending bytes until the reader stops taking them."""
        while self._pending and self.error is None:
            group = [self._pending[i] for i in range(min(len(self._pending), IOV_MAX))]
            sent = self._send(group)
            if sent == 0:
                return
            self.backlog -= sent
            while sent:
                head = self._pending[0]
                if sent >= len(head):
                    sent -= len(head)
                    self._pending.popleft()
                else:
                    self._pending[0] = head[sent:]
                    sent = 0

    def _send(self, views: list[memoryview]) -> int:
        """Bytes written now (0 when the reader is full); on a write error, stop echoing."""
        while True:
            try:
                if self._sock is not None:
                    n = self._sock.sendmsg(views, [], socket.MSG_DONTWAIT)
                elif self.mode == BLOCKING:
                    n = _write_all(self.poll_fd, views)
                else:
                    n = os.writev(self.poll_fd, views)
            except InterruptedError:
                continue
            except BlockingIOError:
                return 0
            except OSError as exc:
                self._fail(exc)
                return 0
            self.written += n
            return n

    def _fail(self, exc: OSError) -> None:
        what = "the reader went away" if exc.errno == errno.EPIPE else exc.strerror or str(exc)
        self.error = f"{self.name}: {what}"
        self.unsent += self.backlog
        self.backlog = 0
        self._pending.clear()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        elif self.mode == NONBLOCKING:
            with contextlib.suppress(OSError):
                os.close(self.poll_fd)

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "written": self.written,
            "teed": self.teed,
            "max_backlog": self.max_backlog,
            "unsent": self.unsent,
            "error": self.error,
        }


PIPE_SIZE = 1 << 20
"""A pipe we write into (`| tee`, `| cat`, a container runtime) is given the capacity of the
job's own pipes when it has less (64 KiB by default): one tee then passes a whole read on.
Refused above /proc/sys/fs/pipe-max-size or the user's pipe quota; it then stays as it is."""
SPLICE_F_NONBLOCK = 2  # linux/splice.h


def _enlarge(fd: int) -> None:
    with contextlib.suppress(OSError):
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE_SIZE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


def _libc_tee() -> Callable[[int, int, int, int], int] | None:
    """tee(2) through libc (the os module has splice but no tee); None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).tee
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    fn.restype = ctypes.c_ssize_t
    return cast("Callable[[int, int, int, int], int]", fn)


def _write_all(fd: int, views: list[memoryview]) -> int:
    """A blocking descriptor (a regular file): write everything, even after a short write."""
    total = sum(len(v) for v in views)
    done = os.writev(fd, views)
    if done < total:
        rest = memoryview(b"".join(views))[done:]
        while rest:
            try:
                n = os.write(fd, rest)
            except InterruptedError:
                continue
            rest = rest[n:]
            done += n
    return done
