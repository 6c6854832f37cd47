"""Tracebacks Python prints and goes on from (ingest.tracebacks.carried_on) are not how a
process ended: the lines are the interpreter's own formats, as in the real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.tracebacks import carried_on, skipped_item
from tests.conftest import REPO

FINALIZER = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/multiprocessing/util.py", line 300, in _run_finalizers',
    "    finalizer()",
    '  File "/usr/lib/python3.11/multiprocessing/synchronize.py", line 87, in _cleanup',
    "    sem_unlink(name)",
]


def test_an_exit_time_finalizer_or_an_unraisable_exception_is_carried_on_from() -> None:
    assert carried_on(FINALIZER)
    assert carried_on(["Exception ignored in: <function _releaseLock at 0x7f>", *FINALIZER[:1]])
    assert carried_on(["--- Logging error ---", "Traceback (most recent call last):"])


def test_an_ordinary_traceback_is_not() -> None:
    own = [
        "Traceback (most recent call last):",
        '  File "/repo/train.py", line 12, in <module>',
        "    open(path)",
    ]
    assert not carried_on(own)
    assert not carried_on([])
    # a program's own util.py, or a finalizer frame named elsewhere, is not multiprocessing's
    assert not carried_on([own[0], '  File "/repo/util.py", line 3, in _run_finalizers'])


def test_the_semaphore_cleanup_at_exit_is_not_the_failure() -> None:
    """twenty-first ap-only-zero: after the ranks lose each other in a gather only rank 0
    entered, spawn's semaphore finalizers print FileNotFoundError (sem_unlink) at exit."""
    report = diagnose_paths([str(REPO / "tests/fixtures/real/twentyfirst-ap-only-zero")])
    assert report.verdict.rule != "DATA101"
    assert all(f.role != "root" for f in report.findings if f.rule == "DATA101")


def _case(number: str) -> str:
    return str(next((REPO / "corpus" / "cases").glob(f"{number}-*")) / "logs")


def test_a_paste_of_ignored_exceptions_alone_reads_ok_not_a_cut_traceback() -> None:
    """Corpus 770 (pytorch#5355): only DataLoaderIter.__del__'s ignored exception, cut inside a
    path; corpus 769 (pytorch#95724): only a multiprocessing finalizer's ignored
    FileNotFoundError. Python printed them and carried on: no cut traceback (INF215), no error
    the program logged (INF240), no hang (INF233): OK, at a guess's confidence."""
    for number in ("770", "769"):
        verdict = diagnose_paths([_case(number)]).verdict
        assert (verdict.status, verdict.kind, verdict.rule) == ("ok", None, None), number
        assert verdict.confidence <= 0.35
        assert "ignored" in verdict.summary


def test_the_same_traceback_without_its_ignored_header_is_cut(tmp_path: Path) -> None:
    """The negative: corpus 770's frames without the 'Exception ignored in' line above them are
    an ordinary traceback cut before its exception line."""
    lines = (next((REPO / "corpus" / "cases").glob("770-*")) / "logs" / "train.log").read_text()
    assert lines.startswith("Exception ignored in:")
    (tmp_path / "train.log").write_text(lines.split("\n", 1)[1])
    verdict = diagnose_paths([str(tmp_path)]).verdict
    assert (verdict.status, verdict.kind, verdict.rule) == ("failed", "python-exception", "INF215")


def test_logging_errors_own_traceback_cut_short_is_no_cut_traceback(tmp_path: Path) -> None:
    """thirteenth-full-rank-log's rank 1 (a real run on a full disk): logging's own error over
    the traceback of a flush that failed, as a paste cut before its exception line. Python
    printed it and carried on: no cut traceback (INF215), but no OK either (a record that could
    not be written is no sign of health); without its '--- Logging error ---' header the same
    frames are a cut traceback."""
    (log,) = (REPO / "tests/fixtures/real/thirteenth-full-rank-log").rglob("1/stderr.log")
    head = log.read_text().splitlines(keepends=True)[:6]
    assert head[0].startswith("--- Logging error ---") and head[-1].strip() == "self.stream.flush()"
    (tmp_path / "carried").mkdir()
    (tmp_path / "carried" / "train.log").write_text("".join(head))
    carried = diagnose_paths([str(tmp_path / "carried")]).verdict
    assert carried.rule != "INF215" and carried.status != "ok"
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "train.log").write_text("".join(head[1:]))
    assert diagnose_paths([str(tmp_path / "bare")]).verdict.rule == "INF215"


@pytest.mark.parametrize(
    ("line", "stepped_over"),
    [
        # timm's reader (set 167 loud-pair), and the words other loaders use for the same
        (
            "WARNING: Skipped sample (index 3). cannot identify image file "
            "<_io.BufferedReader name='data/train/n01440764_1291.png'>",
            True,
        ),
        ("Skipping corrupt image data/train/x.jpg: image file is truncated", True),
        ("Ignoring bad record 1289: UnicodeDecodeError: 'utf-8' codec can't decode", True),
        # the error itself, or a skip that is no item of the data
        ("PIL.UnidentifiedImageError: cannot identify image file 'data/train/x.jpg'", False),
        ("Skipped 3 batches with a NaN loss", False),
        ("skipping_ratio: 0.5", False),
    ],
)
def test_a_line_that_says_it_skipped_the_item_is_stepped_over(
    line: str, stepped_over: bool
) -> None:
    assert skipped_item(line) is stepped_over
