"""A pasted stack dump whose process stands in destroy_process_group (EXIT104): a hang on the
way out, read from a real re-enacted report (corpus case 767, a py-spy dump of torchtitan)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

CASES = Path(__file__).resolve().parent.parent / "corpus" / "cases"


def _dump() -> Path:
    (case,) = CASES.glob("767-*")
    return case / "logs"


def test_a_dump_in_destroy_process_group_is_a_teardown_hang() -> None:
    report = diagnose_paths([str(_dump())])
    v = report.verdict
    assert (v.status, v.kind, v.rule) == ("hung", "exit-teardown-crash", "EXIT104")


def test_the_same_dump_elsewhere_is_only_a_dump(tmp_path: Path) -> None:
    """Without the teardown frame the dump says the job made no progress, nothing more."""
    text = (_dump() / "py-spy-rank.log").read_text()
    kept = [line for line in text.splitlines() if "destroy_process_group" not in line]
    (tmp_path / "dump.log").write_text("\n".join(kept) + "\n")
    v = diagnose_paths([str(tmp_path)]).verdict
    assert (v.status, v.kind, v.rule) == ("hung", "hang", "HANG101")
