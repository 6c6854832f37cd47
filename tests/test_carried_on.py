"""Tracebacks Python prints and goes on from (ingest.tracebacks.carried_on) are not how a
process ended: the lines are the interpreter's own formats, as in the real captures."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.tracebacks import carried_on
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
