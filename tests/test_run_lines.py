"""Units of the output path of `ddpdoctor run`: the per-rank line router under arbitrary chunk
boundaries (real torchrun consoles), the two scanners agreeing, the terminal writer, the log
writer surviving a routing failure."""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.supervise import dropbehind, linescan
from ddpdoctor.supervise.capture import COALESCE_S, Capture
from ddpdoctor.supervise.lines import WINDOW, LineRouter
from ddpdoctor.supervise.linescan import LineScanner
from ddpdoctor.supervise.logwriter import LogWriter
from ddpdoctor.supervise.progress import ProgressTracker
from ddpdoctor.supervise.rundir import RunDir
from ddpdoctor.supervise.terminal import NONBLOCKING, TerminalOut
from tests.conftest import tier_sample

FIXTURES = Path(__file__).parent / "fixtures" / "real"
# The definition the router must agree with: a line belongs to the rank its prefix names.
LINE_PREFIX = re.compile(rb"^\[([A-Za-z_][A-Za-z_-]{0,30}?\d{1,9})\]:")
SCANNERS = ["stdlib"] + (["hyperscan"] if linescan._hs is not None else [])


def real_consoles() -> list[Path]:
    """Real torchrun consoles of this repository whose lines carry rank prefixes."""
    found = []
    for path in sorted(FIXTURES.rglob("*.log")):
        data = path.read_bytes()
        if re.search(rb"(?m)^\[(?:rank|default)\d+\]:", data):
            found.append(path)
    return found


CONSOLES = real_consoles()


def reference(data: bytes) -> dict[str, bytes]:
    """Per-rank logs computed line by line (a last unfinished line gets its newline)."""
    out: dict[str, list[bytes]] = {}
    lines = data.split(b"\n")
    tail = lines.pop()
    whole = [line + b"\n" for line in lines] + ([tail + b"\n"] if tail else [])
    for line in whole:
        m = LINE_PREFIX.match(line)
        if m:
            out.setdefault(m.group(1).decode(), []).append(line)
    return {k: b"".join(v) for k, v in out.items()}


def route(data: bytes, cuts: list[int], engine: str) -> dict[str, bytes]:
    router = LineRouter(LineScanner(engine))
    got: dict[str, list[bytes]] = {}
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            router.feed(1, data[a:b])
            for label, pieces in router.take()[0].items():
                got.setdefault(label, []).extend(bytes(p) for p in pieces)
    router.close(1)
    for label, pieces in router.take()[0].items():
        got.setdefault(label, []).extend(bytes(p) for p in pieces)
    return {k: b"".join(v) for k, v in got.items()}


def test_fixtures_have_prefixed_consoles() -> None:
    assert len(CONSOLES) >= 3, CONSOLES


@pytest.mark.parametrize("engine", SCANNERS)
@pytest.mark.parametrize("path", tier_sample(CONSOLES), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_real_console_routed_like_line_by_line(path: Path, engine: str) -> None:
    data = path.read_bytes()
    expected = reference(data)
    assert expected
    # whole, in 7-byte pieces (prefixes cut everywhere), and in pieces of 4 KiB
    for step in (len(data) + 1, 7, 4096):
        assert route(data, list(range(step, len(data), step)), engine) == expected


LINE = st.one_of(
    st.builds(
        lambda r, text: b"[rank%d]:" % r + text,
        st.integers(0, 11),
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
    ),
    st.builds(lambda text: b"[default1]:" + text, st.sampled_from([b"", b"step 3", b"x" * 70])),
    st.sampled_from([b"", b"[", b"[rank", b"[rank1]", b"[2026-12-01 10:00:00] INFO", b"plain"]),
    st.builds(lambda n: b"[rank2]:" + b"\r45%|####| 45/100" * n, st.integers(0, 5000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(LINE, max_size=40),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=30),
    unfinished=st.booleans(),
    engine=st.sampled_from(SCANNERS),
)
def test_any_chunking_routes_every_byte(
    lines: list[bytes], cuts: list[int], unfinished: bool, engine: str
) -> None:
    data = b"\n".join(lines) + (b"" if unfinished else b"\n")
    assert route(data, cuts, engine) == reference(data)


def test_long_line_streams_through_without_being_held() -> None:
    """A tqdm bar redrawn with \\r for minutes is one line: it must not pile up in memory."""
    router = LineRouter(LineScanner())
    router.feed(1, b"[rank0]:" + b"\r12%|#  | 12/100" * 100)
    assert router.take()[0] == {}  # short: held so the line reaches its log in one piece
    router.feed(1, b"\r13%|#  | 13/100" * (WINDOW // 10))
    pieces = router.take()[0]
    assert sum(len(p) for p in pieces["rank0"]) > WINDOW
    router.feed(1, b" done\n[rank1]:next\n")
    pieces = router.take()[0]
    assert bytes(pieces["rank0"][-1]).endswith(b" done\n")
    assert b"".join(bytes(p) for p in pieces["rank1"]) == b"[rank1]:next\n"


def test_a_line_cut_on_stdout_does_not_split_for_stderr_lines() -> None:
    """torchrun's agent block-buffers stdout (lines cut at 8 KiB) while stderr comes per line:
    the rank log gets whole lines in the order they were completed."""
    router = LineRouter(LineScanner())
    router.feed(1, b"[rank0]:stdout li")
    router.feed(2, b"[rank0]:stderr line\n")
    router.feed(1, b"ne\n")
    pieces = router.take()[0]
    assert b"".join(bytes(p) for p in pieces["rank0"]) == (
        b"[rank0]:stderr line\n[rank0]:stdout line\n"
    )


def test_scanners_agree_on_real_lines() -> None:
    if len(SCANNERS) < 2:
        pytest.skip("hyperscan is not installed")
    fast, slow = LineScanner("hyperscan"), LineScanner("stdlib")
    progress_lines = prefixed = 0
    for path in CONSOLES:
        data = path.read_bytes()
        starts = [0, *[m.end() for m in re.finditer(rb"\n", data)][:-1]]
        for a, b in zip(starts, [*starts[1:], len(data)], strict=True):
            progress = slow.has_progress(data, a, b)
            assert fast.has_progress(data, a, b) is progress, data[a:b]
            assert progress is (linescan.PROGRESS.search(data[a:b]) is not None)
            progress_lines += progress
            first = fast.next_prefix(data, a, len(data))
            assert first == slow.next_prefix(data, a, len(data))
            prefixed += first == a
    assert progress_lines > 10 and prefixed > 100, (progress_lines, prefixed)


def test_terminal_leaves_the_shared_description_blocking() -> None:
    """A pipe given to us as stdout is written without O_NONBLOCK on the shell's description."""
    r, w = os.pipe()
    try:
        term = TerminalOut(w, "stdout")
        assert term.mode == NONBLOCKING
        assert not fcntl.fcntl(w, fcntl.F_GETFL) & os.O_NONBLOCK
        big = b"x" * (4 << 20)
        term.offer(big)  # the pipe holds 1 MiB (enlarged from 64 KiB): the rest waits
        assert term.backlog == len(big) - term.written > 0
        got = b""
        while len(got) < len(big):
            got += os.read(r, 1 << 16)
            term.flush()
        assert got == big and term.backlog == 0
        term.close()
    finally:
        os.close(r)
        os.close(w)


def test_terminal_reader_gone_is_an_error_not_a_crash() -> None:
    r, w = os.pipe()
    term = TerminalOut(w, "stdout")
    os.close(r)
    term.offer(b"lost\n")
    assert term.error == "stdout: the reader went away"
    term.offer(b"more\n")
    assert term.unsent == len(b"lost\nmore\n")
    term.close()
    os.close(w)


def test_a_routing_failure_still_writes_console_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """console.log gets every byte even if per-rank routing raises (a bug must not stop the
    logs, nor, through the backlog, the job)."""
    rundir = RunDir(tmp_path)
    rundir.create()
    log = LogWriter(rundir, ProgressTracker(None), LineScanner())

    def broken(_stream: int, _data: bytes) -> None:
        raise ValueError("routing bug")

    monkeypatch.setattr(log._router, "feed", broken)
    log.start()
    log.put(1, b"[rank0]:one\n")
    log.put(2, b"two\n")
    log.finish()
    assert rundir.console_log.read_bytes() == b"[rank0]:one\ntwo\n"
    assert log.errors >= 1 and log.first_error == "routing: ValueError: routing bug"
    assert log.backlog() == 0


def test_big_logs_are_handed_to_the_disk_and_dropped_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the window, a log's new part is handed to the disk and its old part dropped from
    the page cache; what the files hold is every byte, in order, console and rank logs alike."""
    monkeypatch.setattr(dropbehind, "WINDOW_BYTES", 1 << 16)
    monkeypatch.setattr(dropbehind, "KEEP_BYTES", 1 << 16)
    rundir = RunDir(tmp_path)
    rundir.create()
    log = LogWriter(rundir, ProgressTracker(None), LineScanner())
    log.start()
    chunks = [
        b"".join(b"[rank%d]:line %07d of chunk %d\n" % (i % 2, i, c) for i in range(900))
        for c in range(40)
    ]
    for chunk in chunks:
        log.put(1, chunk)
    log.finish()
    whole = b"".join(chunks)
    assert rundir.console_log.read_bytes() == whole
    for rank in (0, 1):
        wanted = b"".join(
            line + b"\n" for line in whole.split(b"\n") if line.startswith(b"[rank%d]" % rank)
        )
        assert rundir.rank_log(f"rank{rank}").read_bytes() == wanted
    console = next(c for c in log._drop_behind.values() if c.pos == len(whole))
    if sys.platform.startswith("linux"):  # the calls exist, and tmp_path's file system takes them
        assert console.enabled
        assert console.handed > len(whole) - (1 << 16)
        assert 0 < console.dropped <= console.handed - (2 << 16)


def test_a_small_log_is_left_to_the_kernel(tmp_path: Path) -> None:
    path = tmp_path / "small.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    cache = dropbehind.DropBehind(fd)
    os.write(fd, b"x" * 1000)
    cache.wrote(1000)
    os.close(fd)
    assert (cache.handed, cache.dropped, cache.pos) == (0, 0, 1000)


def test_coalescing_waits_less_for_a_fast_writer(tmp_path: Path) -> None:
    """A slow printer's output is gathered for COALESCE_S; a job writing fast gets a wait in
    which only half its pipe fills, so its writes do not block on a full pipe."""
    rundir = RunDir(tmp_path)
    rundir.create()
    cap = Capture(rundir, ProgressTracker(None), echo=False)
    cap._fill_bytes = (1 << 20) // 2
    assert cap._pause(80, 0.5) == COALESCE_S  # a line every half second
    fast = cap._pause(1 << 20, 0.015)  # 70 MB/s
    assert 0 < fast < COALESCE_S and fast * (1 << 20) / 0.015 <= (1 << 20) // 2 + 1


@pytest.mark.parametrize("engine", SCANNERS)
@pytest.mark.parametrize(
    ("line", "progress"),
    [
        # tests/fixtures/real/eightysixth-*: FedML's server and clients
        (b"[FedML-Server(0) @device-id-0] ... ################Communication round : 3", True),
        (b"client_idx = 1, round 4, train_loss = 0.8941, train_acc = 0.6516", True),
        (b"tick 6     kimg 0.4      time 41s          sec/tick 5.2", True),  # StyleGAN
        (b"Epoch: [1]  [ 10/100]  eta: 0:01:02  lr: 0.000100", True),
        (b"RTT of a round trip to 10.0.0.2 measured", False),
        (b"loaded metadata of 12 shards (beta 0.9)", False),
        (b"best val_loss 1.11", False),
    ],
)
def test_rarer_words_of_progress_count_with_a_number(
    line: bytes, progress: bool, engine: str
) -> None:
    """What the diagnosis reads as a step (analysis/scanner.py's PROGRESS_LINE) is progress
    for the supervisor's hang watch too, and the same words without a count are not."""
    data = b"x\n" + line + b"\n"
    assert LineScanner(engine).has_progress(data, 2, len(data)) is progress
