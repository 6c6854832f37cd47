"""A launcher's parent that re-raises a worker's traceback under its own 'Exception: ' (OpenNMT's
and fairseq's ErrorHandler with its '-- Tracebacks above this line can probably be ignored --'
banner; torch 1.x mp.spawn's join) reports the worker's error: the worker's exception below it
is the root, the parent's is the launcher's report (LCH122). Real captures only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def _roles(paths: list[str]) -> tuple[str | None, dict[str, str]]:
    report = diagnose_paths(paths)
    return report.verdict.rule, {f.rule: f.role for f in report.findings}


def test_the_workers_exception_under_the_banner_is_the_root() -> None:
    """Set 71 joint-slip: the worker's RuntimeError under OpenNMT's banner is the root."""
    report = diagnose_paths([str(REAL / "seventyfirst-joint-slip")])
    assert report.verdict.rule == "PY101"
    assert report.verdict.evidence[0].text.startswith("RuntimeError: Sizes of tensors must match")
    assert {f.rule: f.role for f in report.findings}["LCH122"] == "cascade"


def test_torch_1_spawn_reraise_leaves_the_childs_cut_traceback_as_the_root() -> None:
    """Corpus 888 (training): torch 1.x mp.spawn's 'raise Exception(msg)' in join over process
    1's traceback, cut before its error line: the cut traceback is read, not the parent's."""
    found = list((REPO / "corpus" / "cases").glob("888-*"))
    if not found:
        pytest.skip("corpus case 888 not present")
    rule, roles = _roles([str(Path(found[0]) / "logs")])
    assert (rule, roles["LCH122"]) == ("INF215", "cascade")


def test_a_programs_own_empty_exception_is_not_a_launchers_report(tmp_path: Path) -> None:
    """The same words from a program's own `raise Exception(msg)` outside a launcher's handler
    stay its own exception (the real joint-slip traceback with the handler's frame renamed)."""
    text = (REAL / "seventyfirst-joint-slip" / "console.log").read_text()
    assert "in signal_handler" in text
    (tmp_path / "console.log").write_text(
        text.replace("in signal_handler", "in report_failure").replace(
            "-- Tracebacks above this line can probably", "-- see the traceback"
        )
    )
    _rule, roles = _roles([str(tmp_path)])
    assert "LCH122" not in roles
