"""Horovod's stall inspector (HVD101) on real re-enacted reports: the coordinator names, per
stalled op, the ranks missing or the ranks ready; the ranks that never submitted the op and
printed no error are where the job hung."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

CASES = Path(__file__).resolve().parent.parent / "corpus" / "cases"


def _logs(prefix: str) -> Path:
    (case,) = CASES.glob(f"{prefix}-*")
    return case / "logs"


def test_the_ranks_left_out_of_every_ready_list_are_the_hung_ones() -> None:
    report = diagnose_paths([str(_logs("751"))])
    v = report.verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "hang", [1, 5])
    assert any(f.rule == "HVD101" and f.role == "cascade" for f in report.findings)


def test_a_rank_named_missing_from_the_stalled_op_is_the_hung_one() -> None:
    v = diagnose_paths([str(_logs("715"))]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "hang", [1])


def test_the_warning_without_its_op_list_names_nobody(tmp_path: Path) -> None:
    """Cut before the ops are listed: a stall, but no rank to blame."""
    lines = (_logs("751") / "train.log").read_text().splitlines()
    (tmp_path / "train.log").write_text("\n".join(lines[:2]) + "\n")
    v = diagnose_paths([str(tmp_path)]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "hang", [])


def test_every_rank_missing_some_op_is_a_collective_mismatch() -> None:
    """Horovod >= 0.20 lists per rank the ops it has not submitted: when that is every rank,
    nobody is merely behind; the ranks submitted different collectives."""
    v = diagnose_paths([str(_logs("714"))]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "collective-mismatch", [])


def test_the_coordinator_naming_itself_is_not_a_rank_left_waiting() -> None:
    """Rank 0's own log (rank0.log) holds the coordinator's report, one line of ops joined by
    ', ' (operations.cc before 0.20) whose ready lists leave out ranks 0 and 6: rank 0 speaks
    for the job there, it does not wait; both named ranks are where the job hung."""
    v = diagnose_paths([str(_logs("916"))]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "hang", [0, 6])
    assert "names rank(s) 0,6 as never having arrived" in v.summary
