"""Inputs as bytes: stream each one (expanded by `inputs`) as newline-aligned chunks,
transparently gunzipping by magic bytes and decoding UTF-16; binary data, unreadable, corrupt and
silent inputs end with a status and a reason, never an exception. Never modifies input."""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from types import ModuleType
from typing import BinaryIO, cast

from ddpdoctor.ingest.characters import html_escaped, straight_quotes, unescaped
from ddpdoctor.ingest.inputs import PIPE_WAIT_S, STDIN_NAME, Input, expand_paths, reason_for
from ddpdoctor.ingest.pipes import QuietPipe, WaitedReader, open_waited
from ddpdoctor.ingest.unwrap import compose, dedent, reindent, undouble, unnumber, unwrap
from ddpdoctor.model.records import SourceInfo

__all__ = ["PIPE_WAIT_S", "STDIN_NAME", "ChunkStream", "Input", "expand_paths", "looks_binary"]

_fast_gzip: ModuleType | None
_DECODE_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error)
try:  # isal decompresses gzip about 1.5x faster than zlib; optional.
    from isal import igzip as _fast_gzip
    from isal.igzip_lib import IsalError

    # isal reports a corrupt deflate stream with its own type, not OSError or zlib.error
    _DECODE_ERRORS += (cast("type[BaseException]", IsalError),)
except ImportError:  # pragma: no cover - depends on the platform
    _fast_gzip = None

_READ_ERRORS: tuple[type[BaseException], ...] = (QuietPipe, *_DECODE_ERRORS)

CHUNK_BYTES = 4 * 1024 * 1024
MAX_LINE_BYTES = 8 * 1024 * 1024
"""A single line longer than this is cut into pieces so memory stays bounded."""
SNIFF_BYTES = 8192
DECODED_READ_BYTES = 256 * 1024
"""Read size of a decoded stream (gzip, UTF-16): a truncated archive then loses at most one read
of text."""
GZIP_PIECE_BYTES = 32 * 1024
"""A .gz is decompressed this much at a time (as fast as larger reads, measured with isal): a
truncated or corrupt archive then loses at most this much of the text before the damage."""
PROBE_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
UTF16_SNIFF_BYTES = 256


def looks_utf16(head: bytes) -> bool:
    """A byte order mark, then text whose every other byte is mostly NUL (ASCII in UTF-16): a
    log that merely starts with the bytes FF FE is not taken for UTF-16."""
    if head[:2] not in UTF16_BOMS:
        return False
    body = head[2:UTF16_SNIFF_BYTES]
    high = body[1::2] if head[:2] == b"\xff\xfe" else body[0::2]
    return len(high) > 0 and high.count(0) * 2 >= len(high)


class _Utf8FromUtf16:
    """A UTF-16 log (with its byte order mark) read as UTF-8 bytes, so the scan sees text and
    not every other byte NUL (which would be taken for binary data)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._text = io.TextIOWrapper(raw, encoding="utf-16", errors="replace", newline="")

    def read(self, size: int = -1) -> bytes:
        return self._text.read(size // 2 if size > 0 else -1).encode("utf-8")

    def close(self) -> None:
        self._text.close()


def _is_regular(stream: io.BufferedReader) -> bool:
    """A regular file, whose size says where it ends. A pipe (`<(kubectl logs ...)` is one), a
    character device or a /proc file (regular, but of size 0) must be read to its end instead."""
    try:
        st = os.fstat(stream.fileno())
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def looks_binary(head: bytes) -> bool:
    """True for data that is not a log: many control bytes, or some control bytes amid bytes
    that are not UTF-8 (random or compressed data: 9-11% control bytes, 40% invalid UTF-8 in
    8 KB of /dev/urandom). A few NULs (bus errors print them), colour codes, and logs in a
    legacy encoding (no control bytes) stay text."""
    if not head:
        return False
    control = (len(head) - len(head.translate(None, CONTROL_BYTES))) / len(head)
    if control > 0.10:
        return True
    if control <= 0.03:
        return False
    invalid = head.decode("utf-8", "replace").count("\ufffd") - head.count(b"\xef\xbf\xbd")
    return invalid / len(head) > 0.15


CONTROL_BYTES = bytes([*range(0, 9), *range(14, 32)])


class ChunkStream:
    """Newline-aligned chunks of one input. After iteration, `info` says how it went; its
    `lines` are left to the reader, which counts them in the same pass that numbers its hits."""

    def __init__(
        self, item: Input, chunk_bytes: int = CHUNK_BYTES, join_wrapped: bool = True
    ) -> None:
        self.item = item
        self.join_wrapped = join_wrapped
        """Read a source that fits in one chunk as a paste (see _as_paste): a small file, or
        stdin that ended within its first chunk. Not among thousands of rank files, which
        programs wrote (and where looking costs ~50 us a file)."""
        self.chunk_bytes = chunk_bytes
        self.info = SourceInfo(path=item.display)
        self.mtime: float | None = None
        self.read_bytes = chunk_bytes
        self._waited = False
        self._gzip = False
        self._pending: BaseException | None = None
        self.merges: tuple[int, ...] = ()
        """Lines a terminal had hard-wrapped, joined (ingest/unwrap): the joined lines that
        took in the next line of the file, known once the first chunk is out."""

    def _skip(self, reason: str) -> None:
        self.info.status, self.info.reason = "skipped", reason

    def _open(self) -> BinaryIO | None:
        if self.item.spool is not None:
            try:
                spooled = open(self.item.spool, "rb")  # noqa: SIM115 - closed in __iter__
                spooled.seek(self.item.start)
            except OSError as exc:
                self._skip(reason_for(exc))
                return None
            return spooled  # a range of stdin, sniffed with its start (ingest/spool)
        if self.item.path == "-":
            raw: BinaryIO = _stdin(self.item.read_ahead)
        else:
            try:
                st = os.stat(self.item.path)
                if stat.S_ISDIR(st.st_mode):
                    self._skip("a folder, not a file")
                    return None
                if stat.S_ISREG(st.st_mode):
                    raw = open(self.item.path, "rb")  # noqa: SIM115 - closed in __iter__
                else:  # a pipe or device: opening a FIFO without a writer would block
                    raw = open_waited(self.item.path, self.item.wait_s)
                    self._waited = True
                self.mtime = st.st_mtime
                if self.item.start or self.item.end is not None:
                    raw.seek(self.item.start)
                    return raw  # a part of a plain file: never compressed, never sniffed
            except OSError as exc:
                self._skip(reason_for(exc))
                return None
        try:
            head = raw.peek(UTF16_SNIFF_BYTES) if hasattr(raw, "peek") else b""
        except QuietPipe as exc:
            raw.close()
            self._skip(f"nothing arrived in {exc.wait_s:g} s (a pipe without a writer?)")
            return None
        except OSError as exc:
            self._skip(reason_for(exc))
            return None
        if looks_utf16(head):  # Windows PowerShell's `>` writes UTF-16
            self.read_bytes = DECODED_READ_BYTES
            return _Utf8FromUtf16(raw)  # type: ignore[return-value]
        if head[:2] == GZIP_MAGIC:
            opener = _fast_gzip.open if _fast_gzip is not None else gzip.open
            self.read_bytes = DECODED_READ_BYTES
            self._gzip = True
            return opener(raw, "rb")  # type: ignore[no-any-return,no-untyped-call,return-value,unused-ignore]
        return raw

    def __iter__(self) -> Iterator[bytes]:
        if self.item.path != "-" and not self.item.start and self.item.end is None:
            whole = self._small_file()
            if whole is not None:
                if whole:
                    yield whole
                return
        stream = self._open()
        if stream is None:
            return
        # a decoded stream (gzip, UTF-16) is no BufferedReader: read, not sized
        if (
            (self.item.path != "-" or self.item.spool is not None)
            and isinstance(stream, io.BufferedReader)
            and not isinstance(stream.raw, WaitedReader)
            and _is_regular(stream)
        ):
            try:
                yield from self._exact_chunks(stream)
            finally:
                stream.close()
            return
        left = -1 if self.item.end is None else self.item.end - self.item.start
        try:
            chunks = self._joined_chunks(stream, left)
            first = next(chunks, None)
            second = next(chunks, None) if first is not None else None
            if first is not None and second is None and left < 0:
                # stdin, a pipe or a decoded .gz that ended within one chunk: read as a small
                # file is (`pbpaste | ddpdoctor diagnose -` lost every paste repair)
                yield self._as_paste(first)
                return
            for chunk in (first, second):
                if chunk is not None:
                    yield chunk
            yield from chunks
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()

    def _small_file(self) -> bytes | None:
        """A plain regular file that fits in one chunk, read with one open and one read: what
        the general path would yield (b"" when it yields nothing: binary data, an empty read),
        or None to leave it to the general path (anything else, and every error, which that
        path reports as it always has). Each of 10,000 rank files paid ~40 us for a buffered
        reader, its 8 KB peek and two more fstat calls."""
        try:
            st = os.stat(self.item.path)
        except OSError:
            return None
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or not 0 < size <= self.chunk_bytes:
            return None  # a folder, a pipe, a /proc file (size 0), or more than one chunk
        try:
            fd = os.open(self.item.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.pread(fd, size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) != size:  # changed under us: the general path reads what is there now
            return None
        head = data[:UTF16_SNIFF_BYTES]
        if head[:2] == GZIP_MAGIC or looks_utf16(head):
            return None  # decoded as a stream
        self.mtime = st.st_mtime
        if looks_binary(data[:SNIFF_BYTES]):
            self._skip("binary data, not a log")
            return b""
        self.info.bytes = size
        data = self._as_paste(data)
        return data if data.endswith(b"\n") else data + b"\n"

    def _as_paste(self, data: bytes) -> bytes:
        """A source read whole (a small file, or a stream that ended within its first chunk:
        a paste piped in) as it was meant (ingest/unwrap): a viewer's line numbers, a code
        block's indentation and a double-spaced copy's blank lines taken out, hard-wrapped
        lines joined, a trimmed traceback indented again. `merges` maps its lines back to the
        source's own numbers."""
        if not self.join_wrapped:
            return data
        data = straight_quotes(data)  # the characters first: a curly quote is three bytes
        if html_escaped(data):
            data = unescaped(data)
        data, blanks = undouble(dedent(unnumber(data)))
        data, joins = unwrap(data)
        data = reindent(data)  # after the joins: a frame line cut at the width is whole
        self.merges = compose(joins, blanks)
        return data

    def _read(self, stream: BinaryIO, size: int) -> bytes:
        """Up to `size` bytes. A gzip stream is read in pieces and a pipe or device as data
        arrives, so that an error or a pause keeps what came before it: the bytes read are
        returned now and the error is raised by the next call (a truncated .gz used to lose its
        whole last read, up to 256 KB of text)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            raise pending
        if not (self._waited or self._gzip) or not hasattr(stream, "read1"):
            return stream.read(size)
        piece = GZIP_PIECE_BYTES if self._gzip else size
        parts: list[bytes] = []
        got = 0
        while got < size:
            try:
                part = stream.read1(min(piece, size - got))
            except _READ_ERRORS as exc:
                if not parts:
                    raise
                self._pending = exc
                break
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _joined_chunks(self, stream: BinaryIO, left: int) -> Iterator[bytes]:
        """Any stream: read blocks, carry the partial last line into the next one. `left` is
        how many bytes to read, or -1 for all."""
        carry = b""
        first = self.item.start == 0  # a later range of a file was sniffed with its start
        while left != 0:
            try:
                want = self.read_bytes if left < 0 else min(left, self.read_bytes)
                block = self._read(stream, want)
                left = left - len(block) if left > 0 else left
            except QuietPipe as exc:
                if self.info.bytes:
                    self.info.status = "partial"
                    self.info.reason = f"the pipe went quiet for {exc.wait_s:g} s; read until then"
                else:
                    self._skip(f"nothing arrived in {exc.wait_s:g} s (a pipe without a writer?)")
                break
            except _DECODE_ERRORS as exc:
                self.info.status = "partial"
                self.info.reason = (
                    f"truncated or corrupt compressed data: {exc}"
                    if self._gzip
                    else reason_for(exc, "read failed")
                    if isinstance(exc, OSError)
                    else str(exc)
                )
                break
            if first:
                first = False
                if looks_binary(block[:SNIFF_BYTES]):
                    self._skip("binary data, not a log")
                    return
            if not block:
                break
            self.info.bytes += len(block)
            data = carry + block if carry else block
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > MAX_LINE_BYTES:
                    yield data + b"\n"
                    carry = b""
                else:
                    carry = data
                continue
            carry = data[cut + 1 :]
            yield data[: cut + 1]
        if carry:
            yield carry + b"\n"

    def _exact_chunks(self, stream: io.BufferedReader) -> Iterator[bytes]:
        """Plain files: a small read near the end of each window finds its last newline, so
        each chunk is read once at its exact length (no carry joined, no slice copied)."""
        fd = stream.fileno()
        pos = self.item.start
        try:
            stop = os.fstat(fd).st_size if self.item.end is None else self.item.end
        except OSError as exc:
            self._skip(reason_for(exc))
            return
        while pos < stop:
            want = min(self.chunk_bytes, stop - pos)
            if pos + want < stop:
                probe_at = max(pos, pos + want - PROBE_BYTES)
                try:
                    nl = os.pread(fd, pos + want - probe_at, probe_at).rfind(b"\n")
                except OSError:
                    nl = -1
                if nl < 0:
                    stream.seek(pos)  # a long line near the cut: the general path copes
                    yield from self._joined_chunks(stream, stop - pos)
                    return
                want = probe_at + nl + 1 - pos
            try:
                block = os.pread(fd, want, pos)
            except OSError as exc:
                self.info.status, self.info.reason = "partial", reason_for(exc, "read failed")
                return
            if pos == 0 and looks_binary(block[:SNIFF_BYTES]):
                self._skip("binary data, not a log")
                return
            if not block:
                break
            pos += len(block)
            self.info.bytes += len(block)
            if not block.endswith(b"\n"):  # the file grew or its last line has no newline
                block += b"\n"
            yield block


def _stdin(read_ahead: bytes) -> BinaryIO:
    """Stdin, with the bytes already taken from it (Input.read_ahead) in front."""
    if not read_ahead:
        return sys.stdin.buffer
    return io.BufferedReader(_Replayed(read_ahead, sys.stdin.buffer))


class _Replayed(io.RawIOBase):
    """Bytes already read from a stream, then the stream itself (which closing leaves open)."""

    def __init__(self, data: bytes, rest: BinaryIO) -> None:
        self._data = memoryview(data)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._data:
            n = min(len(buffer), len(self._data))
            buffer[:n] = self._data[:n]
            self._data = self._data[n:]
            return n
        read1 = getattr(self._rest, "read1", self._rest.read)
        block: bytes = read1(len(buffer))
        buffer[: len(block)] = block
        return len(block)
