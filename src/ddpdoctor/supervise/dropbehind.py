"""Keeps what a big log file holds in the page cache bounded: once a file grew past
`WINDOW_BYTES` beyond what was last handed to the disk, its new part is handed to the disk
(`sync_file_range`, which starts the writeback and does not wait for it) and the part written
out well before is dropped from the cache (`posix_fadvise(DONTNEED)`, which skips pages still
dirty). Why: a job printing hundreds of MB made ddpdoctor fill that much fresh page cache, and
fresh pages cost: on this VM 200 MB into a new file cost 0.04 s of CPU for the first ~600 MB
of a session and 0.56 s after (first touches of memory the guest never used), so `run` took
0.2-0.65 s of CPU per 200 MB depending on what the machine had done before. Recycling a few
tens of MB keeps it at ~0.05 s, and a log of any size holds at most about 96 MB of the cache
(what the job's own data would otherwise lose; not measured). A file below `WINDOW_BYTES` is
never touched; where the calls are missing (not Linux) nothing happens; on tmpfs DONTNEED
drops nothing (checked: the file stays whole)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

WINDOW_BYTES = 32 << 20
"""Written but not yet handed to the disk: the most a log keeps dirty before writeback starts."""
KEEP_BYTES = 32 << 20
"""Handed to the disk but still cached, behind the write position (writeback takes a while:
dropping pages still under writeback does nothing)."""
SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_SYNC = _sync_file_range()


class DropBehind:
    """One per log file; `wrote(n)` after each write of n bytes (appends only)."""

    __slots__ = ("dropped", "enabled", "fd", "handed", "pos")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        try:
            self.pos = os.fstat(fd).st_size
        except OSError:
            self.pos = 0
        self.handed = self.dropped = self.pos
        self.enabled = _SYNC is not None and hasattr(os, "posix_fadvise")

    def wrote(self, n: int) -> None:
        self.pos += n
        sync = _SYNC
        if sync is None or not self.enabled or self.pos - self.handed < WINDOW_BYTES:
            return
        try:
            if sync(self.fd, self.handed, self.pos - self.handed, SYNC_FILE_RANGE_WRITE) != 0:
                self.enabled = False  # a file system that refuses: leave it to the kernel
                return
            self.handed = self.pos
            end = self.handed - KEEP_BYTES - WINDOW_BYTES
            if end > self.dropped:
                os.posix_fadvise(self.fd, self.dropped, end - self.dropped, os.POSIX_FADV_DONTNEED)
                self.dropped = end
        except (OSError, ctypes.ArgumentError):
            self.enabled = False
