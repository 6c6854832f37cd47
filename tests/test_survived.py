"""Errors a job went on from are not how it ended (real runs, tests/fixtures/real)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def _head(name: str, lines: int, tmp: Path) -> str:
    """The first `lines` lines of a real capture: the same run, read while it was going."""
    text = (REAL / name / "console.log").read_bytes().split(b"\n")  # progress bars hold \r
    out = tmp / "console.log"
    out.write_bytes(b"\n".join(text[:lines]) + b"\n")
    return str(out)


def test_a_lost_peer_before_the_announced_end_was_survived() -> None:
    """Rank 1 logged a connection reset as a warning and retried; rank 0 announced the end of
    training four seconds later (Python logging, timestamps on both)."""
    report = diagnose_paths([str(REAL / "fourth-noisy-ok")])
    assert report.verdict.status == "ok"
    assert any("went on from them" in n for n in [report.verdict.summary])
    assert {f.role for f in report.findings if f.rule == "NET101"} == {"context"}


def test_a_logged_traceback_the_rank_trained_on_from_is_not_the_end(tmp_path: Path) -> None:
    """Rank 0 logged two tracebacks at WARNING (a refused dashboard push) and went on to
    'epoch 2 step 20' (timestamped after them): read up to that line, the run has not failed;
    it is simply not over."""
    report = diagnose_paths([_head("fifth-noisy-ok", 132, tmp_path)])
    assert report.verdict.status == "unknown", report.verdict.summary
    assert all(f.role == "context" for f in report.findings if f.rule == "PY101")


def test_a_traceback_with_nothing_timed_after_it_still_ends_the_run(tmp_path: Path) -> None:
    """Cut right after the first push's traceback: no progress line of rank 0 follows it, so
    nothing proves the rank went on."""
    report = diagnose_paths([_head("fifth-noisy-ok", 82, tmp_path)])
    assert report.verdict.kind == "python-exception", report.verdict.summary


def test_an_error_the_program_logged_as_a_warning_before_a_later_failure_was_caught() -> None:
    """fairseq logs a caught OOM at WARNING ('OOM: Ran out of memory ... attempting to recover
    from OOM') and goes on; the collective it then skipped makes gloo abort the rank. The OOM
    is context, not the root (fifteenth-oom-forward, a real torchrun run)."""
    report = diagnose_paths([str(REAL / "fifteenth-oom-forward")])
    assert report.verdict.kind != "host-oom"
    assert {f.role for f in report.findings if f.kind == "host-oom"} == {"context"}
