"""Stdin scanned on every core (issue 14): a pipe is cut into newline-aligned ranges spooled to
temporary files (ingest/spool) that worker processes scan while the parent reads on. The ranges
hold every byte once, in order; the report is the one a single reader of the stream gives; the
temporary files are gone afterwards, also when a range cannot be written. Speed is measured by
`make bench` (its stdin table), never here."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from benchmarks.generate import slurm_writers, write_dense

from ddpdoctor.analysis import parallel, scanner
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest import sources, spool
from ddpdoctor.ingest.sources import ChunkStream, Input
from ddpdoctor.report.to_json import report_to_dict
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"


def _lines(seed: int, n: int, long_every: int = 0) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randint(0, 120)
        if long_every and i % long_every == 0:
            size = rng.randint(3000, 9000)  # longer than a range in the tests below
        out.append(b"x" * size + b" %d" % i)
    return b"\n".join(out) + b"\n"


def _spooled(data: bytes, folder: str, part: int, min_last: int) -> list[tuple[Input, bytes]]:
    stream = io.BufferedReader(io.BytesIO(data))
    first = spool.read_first(stream)
    got = []
    for item in spool.ranges(first, folder, part, min_last, stream):
        assert item.spool is not None
        with open(item.spool, "rb") as fh:
            fh.seek(item.start)
            body = fh.read()
        got.append((item, body))
    return got


@pytest.mark.parametrize("seed", range(6))
def test_ranges_hold_every_byte_once_newline_aligned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(spool, "READ_BYTES", 1000)
    monkeypatch.setattr(spool, "WRITE_BYTES", 3000)
    data = _lines(seed, 2000, long_every=300 if seed % 2 else 0)
    part, min_last = 4096 + seed * 1000, 700
    got = _spooled(data, str(tmp_path), part, min_last)
    assert b"".join(body for _, body in got) == data
    offset = 0
    for n, (item, body) in enumerate(got):
        assert item.path == "-" and item.display == "<stdin>" and item.start == offset
        last = n == len(got) - 1
        assert (item.end is None) == last
        if not last:
            assert item.end == offset + len(body)
            assert body.endswith(b"\n")  # the next range starts a line
        offset += len(body)
    assert len(got) > 3
    assert len(got[-1][1]) >= min_last  # the tail a scan samples is in the last range


def test_a_stream_shorter_than_a_range_is_one_range(tmp_path: Path) -> None:
    data = _lines(1, 40_000)
    got = _spooled(data, str(tmp_path), len(data) + 1, 1000)
    assert [(i.start, i.end) for i, _ in got] == [(0, None)]
    assert got[0][1] == data


def test_too_little_after_a_cut_joins_the_last_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range never ends so near the stream's end that the last one is shorter than the tail
    a scan samples: that tail would then miss the other writers' last lines."""
    monkeypatch.setattr(spool, "READ_BYTES", 1000)
    data = b"a" * 99 + b"\n"
    data *= 100  # 10,000 bytes
    got = _spooled(data, str(tmp_path), 4000, 2500)
    sizes = [len(body) for _, body in got]
    assert sum(sizes) == len(data) and sizes[-1] >= 2500
    assert all(i.end is not None for i, _ in got[:-1])


def test_a_range_that_cannot_be_written_leaves_the_rest_to_one_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk in the middle of the stream: the ranges written so far stand, and what is
    left (read already or not) is given back to stdin's reader, whole and in order."""
    monkeypatch.setattr(spool, "READ_BYTES", 1000)
    monkeypatch.setattr(spool, "WRITE_BYTES", 3000)
    data = _lines(3, 3000)
    written: list[int] = []
    real = spool._write_at

    def failing(fd: int, offset: int, buf: bytearray, size: int) -> None:
        if len(written) >= 3:
            raise OSError(28, "No space left on device")
        written.append(size)
        real(fd, offset, buf, size)

    monkeypatch.setattr(spool, "_write_at", failing)
    stream = io.BufferedReader(io.BytesIO(data))
    items = list(spool.ranges(spool.read_first(stream), str(tmp_path), 8000, 500, stream))
    rest = items[-1]
    assert rest.spool is None and rest.end is None
    before = b""
    for item in items[:-1]:
        assert item.spool is not None
        with open(item.spool, "rb") as fh:
            fh.seek(item.start)
            before += fh.read()
    assert rest.start == len(before)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stream))
    replayed = b"".join(ChunkStream(rest))
    assert before + replayed == data


def _with_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))


def _stdin_report(monkeypatch: pytest.MonkeyPatch, data: bytes, jobs: int) -> dict[str, object]:
    _with_stdin(monkeypatch, data)
    return report_to_dict(diagnose_paths(["-"], jobs=jobs))


def test_parallel_stdin_gives_the_single_readers_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dense log of 16 writers (errors, repeated warnings past their caps, progress of every
    rank) piped in: cut into 5 ranges scanned by two workers, the report is the one reader's,
    last words, last progress and counts included."""
    log = tmp_path / "dense.log"
    write_dense(log, 12 * 1024 * 1024, 7, 0.2, slurm_writers(16), errors=40)
    data = log.read_bytes()
    tempfile_root = tmp_path / "tmp"
    tempfile_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tempfile_root))
    one = _stdin_report(monkeypatch, data, jobs=1)
    monkeypatch.setattr(parallel, "STDIN_PART_BYTES", 2_500_000)
    made: list[str] = []
    real_ranges = spool.ranges

    def counted(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        for item in real_ranges(*args, **kwargs):  # type: ignore[arg-type]
            made.append(str(item.spool))
            yield item

    monkeypatch.setattr(spool, "ranges", counted)
    two = _stdin_report(monkeypatch, data, jobs=2)
    assert len(made) >= 4
    assert one["verdict"]["status"] == "failed"  # type: ignore[index]
    # a finding past its cap counts the hits kept: a multi-line message whose first line ends
    # one range (or chunk, for one reader) and whose last line starts the next adds one
    capped_one, capped_two = _capped_counts(one), _capped_counts(two)
    assert capped_one, "the log should repeat a warning past its cap"
    assert capped_one.keys() == capped_two.keys()
    assert all(abs(capped_one[k] - capped_two[k]) <= 20 for k in capped_one)
    assert two == one
    assert not os.listdir(tempfile_root)  # every range's file and the folder removed


def _capped_counts(report: dict[str, object]) -> dict[str, int]:
    """The counts of findings past their cap, taken out of the report."""
    counts = {}
    for finding in report["findings"]:  # type: ignore[attr-defined]
        if finding["count"] >= scanner.MAX_HITS_PER_PATTERN:
            counts[finding["rule"]] = finding.pop("count")
    return counts


def test_small_or_compressed_stdin_is_read_by_one_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Less than a block, or gzip: nothing is spooled, the bytes read to decide are replayed."""
    case = sorted((Path(__file__).parent / "fixtures").rglob("*.log"))[0]
    data = case.read_bytes()
    assert len(data) > 2000

    def refused() -> str:
        raise AssertionError("spooled")

    monkeypatch.setattr(spool, "make_dir", refused)
    assert _stdin_report(monkeypatch, data, 2) == _stdin_report(monkeypatch, data, 1)
    monkeypatch.setattr(spool, "READ_BYTES", 1000)  # a first block that is all there
    packed = gzip.compress(data)
    assert len(packed) > 1000
    gz_report = _stdin_report(monkeypatch, packed, 2)
    assert gz_report == _stdin_report(monkeypatch, data, 1)


def test_tail_sample_does_not_depend_on_where_the_last_chunk_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last lines of every writer are sampled from the input's end, also when its last
    chunk is a few bytes long (a file a little longer than a multiple of the chunk size)."""
    log = tmp_path / "ranks.log"
    write_dense(log, 3 * 1024 * 1024, 11, 0.05, slurm_writers(8), errors=0)
    whole = report_to_dict(diagnose_paths([str(log)], jobs=1))
    data = log.read_bytes()
    cut = data.rfind(b"\n", 0, len(data) - 200) + 1  # a last chunk of under 200 bytes
    monkeypatch.setattr(sources, "CHUNK_BYTES", cut)
    monkeypatch.setattr(ChunkStream.__init__, "__defaults__", (cut, True))
    assert len(data) - cut < scanner.HEAD_TAIL_BYTES
    small_last = report_to_dict(diagnose_paths([str(log)], jobs=1))
    assert small_last["job"] == whole["job"]
    assert small_last["verdict"] == whole["verdict"]


def test_the_same_stdin_twice_in_one_process_hands_on_the_same_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library caller diagnosing twice: the second stdin, spooled as one range and scanned in
    this process, keeps the facts read by value (a world size, a transport) that the first
    handed on: each diagnosis starts from none handed on (it dropped them before)."""
    (log,) = (
        CASES
        / "1070-slow-rank-timeout-litgpt-slurm-first-broadcast-workers-oversubscribed"
        / "logs"
    ).iterdir()
    monkeypatch.setattr(spool, "READ_BYTES", 1000)  # spooled, as one range

    def facts() -> list[str]:
        _with_stdin(monkeypatch, log.read_bytes())
        (scan,) = parallel.scan_inputs([Input("-", "<stdin>", wait_s=None)], jobs=2)
        return sorted(f.name for f in scan.facts)

    first = facts()
    assert {"world_size", "ib_transport"} <= set(first)
    assert facts() == first


def test_the_rest_of_stdin_that_cannot_be_spooled_is_scanned_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk after two ranges: those are scanned by the workers, the rest of the stream
    (the bytes taken from it in front) by this process, and the report is one reader's."""
    log = tmp_path / "dense.log"
    write_dense(log, 6 * 1024 * 1024, 5, 0.1, slurm_writers(8), errors=20)
    data = log.read_bytes()
    one = _stdin_report(monkeypatch, data, jobs=1)
    monkeypatch.setattr(parallel, "STDIN_PART_BYTES", 1_500_000)
    real = spool._write_at
    writes: list[int] = []

    def full_after_two_ranges(fd: int, offset: int, buf: bytearray, size: int) -> None:
        if offset >= 2 * 1_500_000:
            raise OSError(28, "No space left on device")
        writes.append(size)
        real(fd, offset, buf, size)

    monkeypatch.setattr(spool, "_write_at", full_after_two_ranges)
    two = _stdin_report(monkeypatch, data, jobs=2)
    assert writes
    # counts past a cap depend on where ranges end (see the first test of reports above)
    assert _capped_counts(one).keys() == _capped_counts(two).keys()
    assert two == one


def test_a_real_pipe_through_the_cli_is_spooled_and_cleaned_up(tmp_path: Path) -> None:
    """`cat log | ddpdoctor diagnose -` as a user runs it: a 40 MB log through a real pipe
    (more than one range) gives the report one reader gives (`-j 1`), and leaves nothing in
    the temporary folder."""
    log = tmp_path / "dense.log"
    write_dense(log, 40 * 1024 * 1024, 3, 0.01, slurm_writers(8), errors=10)
    spool_root = tmp_path / "tmp"
    spool_root.mkdir()
    env = {**os.environ, "TMPDIR": str(spool_root)}

    def piped(jobs: str) -> str:
        with open(log, "rb") as fh:
            cat = subprocess.Popen(["cat"], stdin=fh, stdout=subprocess.PIPE)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ddpdoctor",
                    "diagnose",
                    "-j",
                    jobs,
                    "--format",
                    "json",
                    "-",
                ],
                stdin=cat.stdout,
                capture_output=True,
                env=env,
                timeout=300,
                check=False,
            )
            assert cat.stdout is not None
            cat.stdout.close()
            cat.wait()
        assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
        return done.stdout.decode()

    one, two = json.loads(piped("1")), json.loads(piped("2"))
    assert one["verdict"]["status"] == "failed"
    # counts past a cap depend on where ranges end (see the in-process test above)
    assert _capped_counts(one).keys() == _capped_counts(two).keys()
    assert two == one
    assert not os.listdir(spool_root)
