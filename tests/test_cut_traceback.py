"""A writer whose output ends inside a traceback (header and frames, no exception line): the
scan's head and tail samples follow each writer's tracebacks (scanner._follow_traceback). Real
consoles only: whole ones must never read as cut, and the same consoles cut mid-traceback must."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.scanner import Scanner, SourceScan
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.sources import Input
from ddpdoctor.rules.registry import all_rules
from ddpdoctor.scenarios import catalog, runner
from tests.conftest import REPO, tier_sample

SCANNER = Scanner([r for r in all_rules() if r.signatures])
REAL = REPO / "tests" / "fixtures" / "real"


def _scan(path: Path, sample_bytes: int | None = None) -> SourceScan:
    item = Input(str(path), str(path))
    return SCANNER.scan(item) if sample_bytes is None else SCANNER.scan(item, sample_bytes)


def _open(scan: SourceScan) -> dict[str, tuple[int, str]]:
    return {
        key: (s.open_traceback_at, s.open_traceback_text)
        for key, s in scan.streams.items()
        if s.open_traceback_line
    }


CUT_FOR_REAL = REAL / "run-stop-cuts-trace"
"""The real capture whose rank 1 did die mid-traceback (a second SIGINT while it printed the
first's): its console and rank log are cut, not whole."""
LOST_STDERR = REAL / "accelerate-worker-killed-lost-stderr"
"""Another: rank 1 lost its stderr after its traceback's first frame (CPython's 'lost
sys.stderr')."""
CUT_IN_QUEUE = REAL / "accelerate-worker-killed-cut-in-queue"
"""Another: rank 1's traceback stops inside the DataLoader's queue (its exception line lost)."""
DAEMON_AT_EXIT = REAL / "seventieth-noisy-lift"
"""Another: a rank's daemon prefetch thread was printing its traceback when the interpreter
exited (daemon threads are stopped mid-way at shutdown): the console ends inside it."""


def _consoles() -> list[Path]:
    scenarios = [Path(p) for s in catalog.SCENARIOS for p in runner.log_paths(s.captured_dir)]
    fixtures = sorted(
        p
        for p in REAL.rglob("*.log")
        if p.is_file()
        and not {CUT_FOR_REAL, LOST_STDERR, CUT_IN_QUEUE, DAEMON_AT_EXIT} & set(p.parents)
    )
    return [p for p in scenarios + fixtures if any(map(_is_header, _text(p).splitlines()))]


def _is_header(line: str) -> bool:
    """A traceback's first line after the writer's prefix (not one quoted in a summary)."""
    return parse_line(line, with_time=False).text.startswith("Traceback (most recent call last)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


CONSOLES = _consoles()


def test_there_are_real_tracebacks_to_read() -> None:
    assert len(CONSOLES) >= 40  # chained ones among them (disk-full-checkpoint, worker-oom)


@pytest.mark.parametrize(
    "console", tier_sample(CONSOLES), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_a_whole_console_has_no_cut_traceback(console: Path) -> None:
    assert _open(_scan(console)) == {}


@pytest.mark.parametrize(
    "console", tier_sample(CONSOLES), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_cut_after_a_frame_the_writer_is_inside_a_traceback(console: Path, tmp_path: Path) -> None:
    """Cut each console right after the first frame of its last traceback: that writer's
    output ends inside it, and the frame quoted is the one before the cut."""
    lines = _text(console).splitlines(keepends=True)
    header = max(i for i, ln in enumerate(lines) if _is_header(ln))
    # the frame as parsed: rich's boxed traceback prints "path:line in func" for it
    frame = next(
        i
        for i in range(header, len(lines))
        if 'File "' in parse_line(lines[i], with_time=False).text
    )
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[: frame + 1]), encoding="utf-8")
    found = _open(_scan(cut))
    # the writer of that traceback is open at the cut; a writer whose own traceback was
    # interleaved with it (two nodes' output in one console) may be open too
    assert any(at == frame + 1 and text.startswith('File "') for at, text in found.values()), found
    assert len(found) <= 2, found


def test_a_trace_a_signal_cut_for_real_is_open() -> None:
    """The real cut: rank 1's output (its own file, and the console it shares) ends at the
    frame 'main()' of a traceback whose exception line was never printed."""
    for log in (CUT_FOR_REAL / "ranks" / "rank1.log", CUT_FOR_REAL / "console.log"):
        found = _open(_scan(log))
        assert list(found) == ["[rank1]:"], found
        assert found["[rank1]:"][1].startswith('File "') and "run_train.py" in found["[rank1]:"][1]


def test_a_traceback_cut_in_the_unread_middle_of_a_big_log_is_not_guessed(tmp_path: Path) -> None:
    """Head and tail are sampled; a traceback open at the end of the head may have ended in
    the middle nobody parsed: it is not reported."""
    console = REAL / "style-worker-oom" / "console.log"
    lines = _text(console).splitlines(keepends=True)
    header = next(i for i, ln in enumerate(lines) if _is_header(ln))
    head = "".join(lines[: header + 3])
    log = tmp_path / "big.log"
    log.write_text(head + "filler line\n" * 20_000 + "last words\n", encoding="utf-8")
    assert _open(_scan(log, sample_bytes=len(head.encode()) + 10)) == {}


def test_a_cpp_backtrace_cut_before_its_end_is_native(tmp_path: Path) -> None:
    """c10::Error's frames ('Exception raised from f at file:line', 'frame #N:'), cut in the
    middle as a paste is: a native trace, quoted by its first line."""
    lines = _text(REAL / "rendezvous-no-master" / "console.log").splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Exception raised from"))
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[: start + 6]), encoding="utf-8")
    scan = _scan(cut)
    ((at, text),) = _open(scan).values()
    assert at == start + 1 and text.startswith("Exception raised from throwTimeoutError")
    assert all(s.open_trace_native for s in scan.streams.values() if s.open_traceback_line)
    # the line after the frames ends the trace: the same console whole has none open
    assert _open(_scan(REAL / "rendezvous-no-master" / "console.log")) == {}


INDENTED = "1014-device-assignment-fairseq2-clusterscope-slurm-localid-visible-devices-cut"
"""A fairseq2 recipe's log (corpus case 1014): its handler aligns a record's further lines, the
logged stack trace too, under the message column; the paste stops inside that trace."""


def test_a_trace_a_handler_indented_is_followed_to_its_cut(tmp_path: Path) -> None:
    (log,) = (REPO / "corpus" / "cases" / INDENTED / "logs").iterdir()
    opened = _open(_scan(log))
    assert [text for _, text in opened.values()] == [
        'File "/home/user/work/asr-proj/.venv/lib/python3.12/site-packages/fairseq2/gang.py", '
        "line 492, in create_default_process_group"
    ]
    # composed: the same record ended by its exception line at the header's indentation, and
    # the program's next record; whole, it is not cut
    lines = _text(log).splitlines()
    indent = " " * (len(lines[2]) - len(lines[2].lstrip()))
    whole = tmp_path / "whole.log"
    whole.write_text(
        "\n".join(
            [*lines, f"{indent}RuntimeError: a composed ending", "2026-03-11 09:14:57 INFO     x"]
        )
        + "\n"
    )
    assert _open(_scan(whole)) == {}


def test_a_trace_whose_stderr_was_lost_is_open() -> None:
    """The second real cut: rank 1's traceback stops after its first frame, then CPython's
    'lost sys.stderr' and its dump of the exception object."""
    found = _open(_scan(LOST_STDERR / "console.log"))
    assert "[rank1]:" in found, found
    assert found["[rank1]:"][1].startswith('File "')


def test_a_traceback_cut_in_the_dataloaders_queue_waited_for_a_worker() -> None:
    """Real run: rank 1's traceback stops below the DataLoader's _try_get_data, in the queue
    its workers hand batches through (multiprocessing/queues.py get, the batch's unpickling),
    and the launcher reports rank 1 exiting 1: it was waiting for a worker's batch when it
    raised (its worker had been SIGKILLed), not a Python exception of unknown kind. The
    launcher's report of rank 1's exit does not make rank 1's own trace an echo."""
    verdict = diagnose_paths([str(CUT_IN_QUEUE)]).verdict
    assert (verdict.kind, verdict.rule, verdict.culprit.ranks) == (
        "dataloader-worker-killed",
        "INF221",
        [1],
    )


def test_a_trace_cut_below_an_agreed_stop_makes_the_stop_a_failed_exit(tmp_path: Path) -> None:
    """Corpus 149 (training split): Sana's unranked 'Early stop current
    iteration', then rank 1's traceback cut before its exception. Every rank stopped on purpose
    and a process raised on the way out: the taxonomy's early stop (failed), not a healthy run.
    The same log cut above the traceback is the healthy stop it announced."""
    (case,) = (REPO / "corpus" / "cases").glob("149-*")
    (log,) = (case / "logs").iterdir()
    v = diagnose_paths([str(log)]).verdict
    assert (v.status, v.kind) == ("failed", "early-stop")
    lines = log.read_text().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if "Traceback" in ln)
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[:end]))
    v = diagnose_paths([str(cut)]).verdict
    assert (v.status, v.kind, v.rule) == ("ok", None, "INF207")
