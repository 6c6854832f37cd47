"""The terminal's kernel path: what the job's pipe holds is duplicated into a terminal that is
a pipe (tee(2)) before the capture reads it, and only while nothing waits for that terminal;
what tee could not pass is written from the read, after it. Real pipes and files, no mocks."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ddpdoctor.supervise.child import enlarge_pipe
from ddpdoctor.supervise.terminal import BLOCKING, NONBLOCKING, PIPE_SIZE, TerminalOut

KiB = 1 << 10


@contextmanager
def pipes(n: int) -> Iterator[list[tuple[int, int]]]:
    """`n` pipes; the first n-1 hold 1 MiB, as the job's pipes do (child.enlarge_pipe), the
    last, the terminal, is left as os.pipe() makes it."""
    made = [os.pipe() for _ in range(n)]
    for _r, w in made[:-1]:
        enlarge_pipe(w)
    try:
        yield made
    finally:
        for r, w in made:
            for fd in (r, w):
                with suppress(OSError):
                    os.close(fd)


def drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    got = bytearray()
    try:
        while chunk := os.read(fd, 1 << 20):
            got += chunk
    except BlockingIOError:
        pass
    return bytes(got)


def pass_on(term: TerminalOut, job_r: int) -> tuple[int, bytes]:
    """What Capture._read does with one read: tee first, then read, then offer the rest."""
    want = 1 << 20
    teed = term.tee_from(job_r, want)
    data = os.read(job_r, want)
    term.offer(memoryview(data)[teed:])
    return teed, data


def test_tee_passes_what_the_pipe_holds_without_consuming_it() -> None:
    with pipes(2) as [(job_r, job_w), (term_r, term_w)]:
        data = bytes(range(256)) * 1200  # 300 KiB
        os.write(job_w, data)
        term = TerminalOut(term_w, "stdout")
        assert term.mode == NONBLOCKING and term.fifo
        assert term.tee_from(job_r, len(data)) == len(data)
        assert drain(term_r) == data  # the terminal has it ...
        assert os.read(job_r, len(data) + 1) == data  # ... and the job's pipe still does
        assert term.written == term.teed == len(data) and term.backlog == 0
        term.close()


def test_a_pipe_we_write_into_is_enlarged_to_the_jobs_pipe_size() -> None:
    with pipes(1) as [(_r, w)]:
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) < PIPE_SIZE
        TerminalOut(w, "stdout").close()
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == min(PIPE_SIZE, max(limit, 1 << 16))


def test_tee_into_a_nearly_full_pipe_passes_what_fits_and_the_rest_follows_in_order() -> None:
    with pipes(2) as [(job_r, job_w), (term_r, term_w)]:
        term = TerminalOut(term_w, "stdout")
        earlier = b"e" * (PIPE_SIZE - 100 * KiB)
        term.offer(earlier)  # fits: the terminal pipe now has about 100 KiB of room
        assert term.backlog == 0
        data = b"".join(b"line %06d of the job\n" % i for i in range(15_000))  # ~300 KiB
        os.write(job_w, data)
        teed, read = pass_on(term, job_r)
        assert read == data
        assert 0 < teed < len(data)  # the kernel took whole pages up to the room left
        assert term.backlog == len(data) - teed  # the rest waits, after what was teed
        got = bytearray(drain(term_r))
        while term.pending:
            term.flush()
            got += drain(term_r)
        assert bytes(got) == earlier + data
        assert term.written == len(earlier) + len(data) and term.teed == teed


def test_no_tee_while_bytes_wait_for_the_terminal() -> None:
    """Teeing past pending bytes would put new output before older output."""
    with pipes(2) as [(job_r, job_w), (term_r, term_w)]:
        term = TerminalOut(term_w, "stdout")
        first = b"1" * (PIPE_SIZE + 200 * KiB)
        term.offer(first)
        assert term.pending
        got = bytearray(os.read(term_r, 300 * KiB))  # the reader made room, no flush yet
        second = b"2" * (50 * KiB)
        os.write(job_w, second)
        teed, read = pass_on(term, job_r)
        assert teed == 0 and read == second
        while len(got) < len(first) + len(second):
            got += drain(term_r)
            term.flush()
        assert bytes(got) == first + second and term.teed == 0


def test_no_tee_into_a_regular_file(tmp_path: Path) -> None:
    with pipes(2) as [(job_r, job_w), _unused]:
        fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
        try:
            term = TerminalOut(fd, "stdout")
            assert term.mode == BLOCKING and not term.fifo
            os.write(job_w, b"to a file\n")
            assert pass_on(term, job_r) == (0, b"to a file\n")
            assert (tmp_path / "out").read_bytes() == b"to a file\n"
        finally:
            os.close(fd)


def test_tee_to_a_reader_that_went_away_is_an_error_not_a_crash() -> None:
    with pipes(2) as [(job_r, job_w), (term_r, term_w)]:
        term = TerminalOut(term_w, "stdout")
        os.close(term_r)
        os.write(job_w, b"nobody reads this\n")
        teed, data = pass_on(term, job_r)
        assert teed == 0 and data == b"nobody reads this\n"
        assert term.error == "stdout: the reader went away"
        assert term.unsent == len(data) and term.written == 0
        term.close()
