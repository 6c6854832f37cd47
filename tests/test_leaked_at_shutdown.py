"""multiprocessing's resource tracker, at its own shutdown, names what processes had not
released ('There appear to be 3 leaked semaphore objects to clean up at shutdown'): some process
ended without its own exit. A run that read as healthy is then not known to have ended well."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def _leaked(line: str) -> bool:
    return any(f.compiled.search(line) for f in FACT_PATTERNS if f.name == "leaked_at_shutdown")


def test_the_trackers_words_are_read() -> None:
    assert _leaked(
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: "
        "resource_tracker: There appear to be 3 leaked semaphore objects to clean up at shutdown"
    )
    assert _leaked("There appear to be 1 leaked shared_memory objects to clean up at shutdown")
    assert not _leaked("resource_tracker: '/mp-abc123': [Errno 2] No such file or directory")


def test_a_job_killed_with_no_word_of_its_own_is_not_ok() -> None:
    """hundredfortythird-wall-term: a SIGTERM to every process under ColBERT's Launcher leaves
    only the tracker's warning; hundredfortyfourth-pipe-full: 'test result' printed, then the
    launcher killed while stuck in teardown. Both read OK before; no error was read in either."""
    for name in ("hundredfortythird-wall-term", "hundredfortyfourth-pipe-full"):
        verdict = diagnose_paths([str(REAL / name)]).verdict
        assert (verdict.status, verdict.kind) == ("unknown", None), name
        assert "leaked" in verdict.summary and verdict.evidence, name


def test_a_healthy_run_without_it_stays_ok() -> None:
    """hundredfortythird-quiet-pass (the same Launcher, every process exits 0): no leak."""
    folder = REAL / "hundredfortythird-quiet-pass"
    assert not any(_leaked(p.read_text(errors="replace")) for p in folder.rglob("*.log"))
    assert diagnose_paths([str(folder)]).verdict.status == "ok"
