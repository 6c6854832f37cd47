"""Ray shows a line that several processes printed once, from one of them, with '[repeated Nx
across cluster]': the others' lines are not in the log. A rank that no line shows may have
printed all of them, so it is not missing (not silent, not the one that never joined)."""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

CASES = Path(__file__).resolve().parent.parent / "corpus" / "cases"
REPEATED = re.compile(r" \[repeated \d+x across cluster\]")


def _verl_first_allreduce() -> Path:
    """Corpus case 652 (train split): verl's workers under Ray; ranks 0 and 2 shown timing
    out in the job's first all-reduce (SeqNum=1), their lines '[repeated 3x across cluster]'."""
    (case,) = CASES.glob("652-*")
    return case / "logs" / "ray-driver.log"


def test_a_rank_ray_folded_into_others_lines_is_not_missing() -> None:
    report = diagnose_paths([str(_verl_first_allreduce())])
    assert report.job.ranks_missing == []
    v = report.verdict
    assert (v.kind, v.culprit.ranks) == ("nccl-timeout", [])


def test_without_the_fold_a_gap_in_the_ranks_is_a_missing_rank(tmp_path: Path) -> None:
    """The same lines as if every process's were there: rank 1, between the two shown, said
    nothing, and the others timed out waiting for it."""
    log = tmp_path / "driver.log"
    log.write_text(REPEATED.sub("", _verl_first_allreduce().read_text(encoding="utf-8")))
    report = diagnose_paths([str(log)])
    assert report.job.ranks_missing == [1]
    assert report.verdict.culprit.ranks == [1]
