"""Named pipes, FIFOs and devices read without blocking forever: opened non-blocking (a FIFO
without a writer would block `open` itself), then each read waits at most a bounded time for
data. Owns no parsing; the caller decides what a silent pipe means for its source."""

from __future__ import annotations

import io
import os
import select


class QuietPipe(OSError):
    """No byte arrived within the wait: no writer came, or the writer stopped writing without
    closing its end."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"no data for {wait_s:g} s")
        self.wait_s = wait_s


class WaitedReader(io.RawIOBase):
    """A non-blocking file descriptor read through poll(2) with a timeout per read."""

    def __init__(self, fd: int, wait_s: float | None) -> None:
        super().__init__()
        self._fd = fd
        self._wait_s = wait_s
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLPRI)

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        timeout_ms = None if self._wait_s is None else max(0, int(self._wait_s * 1000))
        while True:
            # a FIFO that never had a writer reports nothing (and read() would say EOF):
            # only read once poll says there is data or a hang-up
            if not self._poll.poll(timeout_ms):
                raise QuietPipe(self._wait_s or 0.0)
            try:
                data = os.read(self._fd, len(buffer))
            except BlockingIOError:
                continue
            buffer[: len(data)] = data
            return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_waited(path: str, wait_s: float | None) -> io.BufferedReader:
    """A pipe, FIFO or character device opened without blocking, buffered (so that it can be
    peeked at like a file), each read waiting at most `wait_s` seconds."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return io.BufferedReader(WaitedReader(fd, wait_s), buffer_size=256 * 1024)
