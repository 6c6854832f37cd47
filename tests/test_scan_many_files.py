"""Many small rank files (issue 14): the shortcuts that made 10,000 files cheaper read what the
longer way read. A small file is read in one go as the general path reads it; values of facts
read by value that earlier files handed on are dropped only where merging would drop them; the
tail sample's quick tests agree with the regexes they stand for; a big scan's objects are kept
out of the collector's sight and given back by the next scan. Speed is measured by
`make bench`, never here."""

from __future__ import annotations

import gc
import gzip
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.analysis import parallel, scanner
from ddpdoctor.analysis.engine import _sampled_hits
from ddpdoctor.analysis.scanner import (
    PROGRESS_LINE,
    Scanner,
    StreamSummary,
    _follow_traceback,
    is_own_output,
    progress_line,
)
from ddpdoctor.ingest.sources import CHUNK_BYTES, ChunkStream, Input
from ddpdoctor.model.records import Origin

LINE = "[rank3]:W0612 10:00:01.237802 40001 socket.cpp:752] [c10d] The client socket has failed\n"


def _read(path: Path, general: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[object, ...]:
    with monkeypatch.context() as m:
        if general:
            m.setattr(ChunkStream, "_small_file", lambda self: None)
        stream = ChunkStream(Input(str(path), str(path)))
        chunks = list(stream)
    info = stream.info
    return chunks, info.bytes, info.status, info.reason, stream.mtime


@pytest.mark.parametrize(
    "content",
    [
        LINE.encode() * 3,
        LINE.encode() * 3 + b"no newline at the end",
        b"\n",
        b"",
        bytes(range(256)) * 40,  # binary: skipped
        gzip.compress(LINE.encode() * 50),  # decoded as a stream
        b"\xff\xfe" + (LINE * 3).encode("utf-16-le"),
        b"x" * 70_000 + b"\n" + LINE.encode(),  # a long line
        b"\xff\xfe not UTF-16 at all\n" + LINE.encode(),
    ],
    ids=["plain", "unterminated", "blank", "empty", "binary", "gzip", "utf16", "long", "fffe"],
)
def test_a_small_file_is_read_as_the_general_path_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    path = tmp_path / "rank3.log"
    path.write_bytes(content)
    assert _read(path, False, monkeypatch) == _read(path, True, monkeypatch)


def test_files_of_a_chunk_or_more_and_odd_paths_take_the_general_path(tmp_path: Path) -> None:
    exact = tmp_path / "exact.log"
    exact.write_bytes(b"y" * (CHUNK_BYTES - 1) + b"\n")
    assert ChunkStream(Input(str(exact), "exact.log"))._small_file() is not None
    bigger = tmp_path / "bigger.log"
    bigger.write_bytes(b"y" * CHUNK_BYTES + b"\n")
    assert ChunkStream(Input(str(bigger), "bigger.log"))._small_file() is None
    assert ChunkStream(Input(str(tmp_path), "dir"))._small_file() is None
    assert ChunkStream(Input(str(tmp_path / "missing"), "missing"))._small_file() is None
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert ChunkStream(Input(str(fifo), "pipe"))._small_file() is None  # and never blocks


def _facts(folder: Path, jobs: int) -> list[tuple[object, ...]]:
    inputs = [Input(str(p), str(p)) for p in sorted(folder.iterdir())]
    scans = parallel.scan_inputs(inputs, jobs=jobs)
    return [
        (s.info.path, f.name, sorted(f.captures.items()), f.record.line, f.record.text)
        for s in scans
        for f in s.facts
    ]


def _without_shared_values(monkeypatch: pytest.MonkeyPatch) -> None:
    scan = Scanner.scan

    def alone(self: Scanner, item: Input, *args: object) -> scanner.SourceScan:
        return scan(self, item, *args[:3], None)  # type: ignore[arg-type]

    monkeypatch.setattr(Scanner, "scan", alone)


@pytest.mark.parametrize("cap", [None, 3])
def test_values_handed_on_by_earlier_files_drop_only_what_merging_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int | None
) -> None:
    """70 rank files repeating a world size and a transport, some with values of their own;
    with a cap on facts, the first file reaches it with values noted but never confirmed,
    which a later file must still report."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(70):
        lines = [f"[rank{rank}]:node0:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB"]
        sizes = [8] + ([rank % 5 + 2] if rank % 7 == 3 else [])
        if rank == 0:
            sizes = [11, 12, 13, 14, 15, 16]
        if rank == 9:
            sizes = [15]  # noted by file 0 past its cap, never confirmed there
        lines += [f"[rank{rank}]:node0:1:1 [0] NCCL INFO comm 0x1 nranks {n} here" for n in sizes]
        lines += [f"[rank{rank}]:WORLD_SIZE=8 MASTER_ADDR=node0", "\u00e9 nranks 8 x"]
        (folder / f"rank{rank:03d}.log").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    if cap is not None:
        monkeypatch.setattr(scanner, "MAX_FACTS_PER_PATTERN", cap)
    parallel._scanner.cache_clear()
    try:
        one, two = _facts(folder, 1), _facts(folder, 2)
        _without_shared_values(monkeypatch)
        alone = _facts(folder, 1)
    finally:
        parallel._scanner.cache_clear()
    assert one == alone == two
    with_15 = [f for f in one if f[1] == "world_size" and ("n", "15") in f[2]]
    assert [f[0][-11:] for f in with_15] == ["rank000.log" if cap is None else "rank009.log"]


WORDS = st.sampled_from(
    ["step", "STEP", "Iter", "iteration", "epoch", "loss", "batch", "it", "steps", "\u017ftep"]
)
BITS = st.sampled_from(
    [" ", "\t", ":", "=", "[", "3", "45", "1234%|", "%|", "|", "_", "a", "\u0130ter", "\u00a0"]
)


@settings(max_examples=1000, deadline=None)
@given(parts=st.lists(st.one_of(WORDS, BITS), max_size=8))
def test_the_quick_progress_test_agrees_with_its_regex(parts: list[str]) -> None:
    message = "".join(parts)
    assert progress_line(message) == bool(PROGRESS_LINE.search(message))


@pytest.mark.parametrize(
    ("message", "opens"),
    [
        ("Traceback (most recent call last):", True),
        ('  File "train.py", line 3, in <module>', True),
        ('\u2003File "train.py", line 3, in <module>', True),
        ("Exception raised from c10d at store.cpp:1 (most recent call first):", True),
        ("frame #0: c10::Error::Error() + 0x1 (0x7f in libc10.so)", True),
        ("step 10 loss 2.3", False),
        ("", False),
    ],
)
def test_what_opens_a_trace_still_opens_it(message: str, opens: bool) -> None:
    summary = StreamSummary("k", Origin())
    _follow_traceback(summary, message, 7)
    assert (summary.open_traceback_line == 7) is opens


def test_own_reports_are_known_and_logs_naming_the_tool_are_not() -> None:
    assert is_own_output(b'{\n  "schema": "ddpdoctor.report/v1",\n')
    assert is_own_output(b"ddpdoctor verdict: rank 3 timed out\n")
    assert not is_own_output(b"pip install ddpdoctor\nstep 1 loss 2\n")
    assert not is_own_output(b"x" * 600 + b"ddpdoctor verdict")  # past the head


def test_progress_bars_are_sampled_whether_or_not_a_percent_sign_occurs() -> None:
    bars = b"".join(b" %d%%|##   | %d/100 [00:0%d<00:10]\r\n" % (n, n, n % 10) for n in range(9))
    where = [m.start() for m in re.finditer(rb"%\|", bars)]
    assert _sampled_hits(bars, [(b"%|", [5])]) == [(5, at) for at in reversed(where[-4:])]
    assert _sampled_hits(LINE.encode() * 20, [(b"%|", [5])]) == []


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """No frozen objects during the test (the suite freezes what collection left: conftest),
    frozen again after it."""
    gc.unfreeze()
    yield
    gc.collect()
    gc.freeze()


@pytest.mark.usefixtures("unfrozen")
def test_a_big_scan_is_frozen_and_given_back_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "rank0.log"
    log.write_text(LINE * 50)
    if gc.get_freeze_count() and not parallel._froze:
        pytest.skip("something else froze objects")
    monkeypatch.setattr(parallel, "FREEZE_MIN_OBJECTS", 0)
    garbage: list[object] = []
    garbage.append(garbage)  # a cycle only the collector frees
    parallel.scan_inputs([Input(str(log), str(log))], jobs=1)
    assert gc.isenabled() and gc.get_freeze_count() > 0
    del garbage
    monkeypatch.setattr(parallel, "FREEZE_MIN_OBJECTS", 10**12)  # the next freezes nothing
    parallel.scan_inputs([Input(str(log), str(log))], jobs=1)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert not parallel._froze


@pytest.mark.usefixtures("unfrozen")
def test_the_library_entry_leaves_nothing_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diagnose_paths gives back what its scan froze: a program calling it keeps no frozen
    objects between diagnoses."""
    from ddpdoctor.analysis.diagnose import diagnose_paths

    log = tmp_path / "rank0.log"
    log.write_text(LINE * 50)
    if gc.get_freeze_count() and not parallel._froze:
        pytest.skip("something else froze objects")
    monkeypatch.setattr(parallel, "FREEZE_MIN_OBJECTS", 0)
    diagnose_paths([str(log)])
    assert gc.get_freeze_count() == 0 and not parallel._froze
