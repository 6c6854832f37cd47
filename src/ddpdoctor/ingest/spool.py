"""Stdin cut into ranges that worker processes can scan while the next one is read: a pipe can
be read only once and only in order, so each newline-aligned range is written to a temporary
file of its own, at its offset in the stream (a sparse file: only the range takes disk), and
read back by a scan as the same range of one file would be. Each range's file is removed once
its scan is merged, so at most a few ranges are on disk at a time, whatever the stream's size.
Owns no scanning: analysis/parallel schedules the ranges."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Generator
from contextlib import suppress
from typing import BinaryIO

from ddpdoctor.ingest.inputs import STDIN_NAME, Input
from ddpdoctor.ingest.sources import GZIP_MAGIC, SNIFF_BYTES, looks_binary, looks_utf16
from ddpdoctor.ingest.srun_tasks import HEAD_BYTES

READ_BYTES = 1024 * 1024
WRITE_BYTES = 4 * 1024 * 1024
"""Read bytes are written out once this many are held (up to their last newline)."""


def read_first(stream: BinaryIO | None = None) -> bytes:
    """The stream's first block (up to READ_BYTES; less only at its end): enough to sniff."""
    stream = stream or sys.stdin.buffer
    parts: list[bytes] = []
    got = 0
    while got < READ_BYTES:
        block = stream.read(READ_BYTES - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def plain_text(head: bytes) -> bool:
    """Text the range scans read as it is: not compressed, UTF-16 or binary (those are decoded
    or refused as one stream, by one reader)."""
    return not (head[:2] == GZIP_MAGIC or looks_utf16(head) or looks_binary(head[:SNIFF_BYTES]))


def make_dir() -> str | None:
    """A private temporary folder for the ranges, or None where none can be made."""
    try:
        return tempfile.mkdtemp(prefix="ddpdoctor-stdin-")
    except OSError:
        return None


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def ranges(
    first: bytes, folder: str, part_bytes: int, min_last: int, stream: BinaryIO | None = None
) -> Generator[Input, None, None]:
    """Stdin from `first` (already read) on, as ranges of about `part_bytes` that end just
    after a newline, each written to its own file in `folder` as it is read (the parent holds
    a few megabytes, never a range) and yielded once complete. The last range has no end and
    holds at least `min_last` bytes (what a scan samples of the input's end: the last range
    samples the same lines one reader of the whole stream would). A line longer than a range
    stays whole in one range. Where a range cannot be written (a full disk), what is left of
    the stream is the last range, not spooled: read from stdin itself, the bytes already
    taken from it in front (Input.read_ahead), for the caller to scan in its own process."""
    read = (stream or sys.stdin.buffer).read
    pending = bytearray(first)  # read, not yet written
    head = b""  # the stream's start, handed to every later range
    ended = not first
    offset = 0  # where the current range starts in the stream
    for index in itertools.count():
        path = os.path.join(folder, f"range-{index}")
        size = 0  # of the current range, written so far
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            yield _unspooled(path, offset, pending, 0, head)
            return
        try:
            while size + len(pending) <= part_bytes and not ended:
                block = read(READ_BYTES)
                if not block:
                    ended = True
                    break
                pending += block
                if len(pending) >= WRITE_BYTES:  # write what ends at a newline, keep the rest
                    done = pending.rfind(b"\n") + 1
                    if done:
                        _write_at(fd, offset + size, pending, done)
                        size += done
                        del pending[:done]
            cut = len(pending) if ended else pending.rfind(b"\n") + 1
            while not cut and not ended:  # a line longer than a range: the range ends with it
                block = read(READ_BYTES)
                if not block:
                    ended, cut = True, len(pending)
                    break
                at = len(pending)
                pending += block
                cut = pending.find(b"\n", at) + 1
            while len(pending) - cut < min_last and not ended:  # enough left for a last range?
                block = read(READ_BYTES)
                if block:
                    pending += block
                else:
                    ended = True
            if ended and len(pending) - cut < min_last:
                cut = len(pending)  # too little left for a range of its own: this is the last
            _write_at(fd, offset + size, pending, cut)
        except OSError:
            os.close(fd)
            yield _unspooled(path, offset, pending, size, head)
            return
        os.close(fd)
        size += cut
        del pending[:cut]
        last = ended and not pending
        if index == 0:
            head = _read_back(path, 0, min(size, HEAD_BYTES))
        yield Input(
            "-", STDIN_NAME, offset, None if last else offset + size, None, spool=path, head=head
        )
        if last:
            return
        offset += size


def _unspooled(
    path: str, offset: int, pending: bytearray, written: int, head: bytes = b""
) -> Input:
    """The rest of the stream from `offset`, for stdin's own reader: what was written of the
    current range (read back), what was read after it, then the stream itself."""
    data = _read_back(path, offset, written) if written else b""
    with suppress(OSError):
        os.unlink(path)
    if offset == 0:
        return Input("-", STDIN_NAME, offset, None, None, read_ahead=data + bytes(pending))
    return Input("-", STDIN_NAME, offset, None, None, read_ahead=data + bytes(pending), head=head)


def _read_back(path: str, offset: int, size: int) -> bytes:
    """What a range's file holds at `offset` (nothing where it cannot be read)."""
    with suppress(OSError), open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)
    return b""


def _write_at(fd: int, offset: int, data: bytearray, size: int) -> None:
    with memoryview(data) as view:
        done = 0
        while done < size:
            done += os.pwrite(fd, view[done:size], offset + done)
