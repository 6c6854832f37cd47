"""Ranks that timed out in the same kind of collective with different element counts
(NumelIn on the NCCL watchdog's line) were in different calls: NCCL checks no sizes, and an
all-reduce, all-gather, broadcast, reduce or reduce-scatter has the same count on every rank.
INF203 groups them apart (a collective mismatch); equal counts do not. Real reports only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.rules.hypotheses.collective_mismatch import SAME_SIZE_OPS

CASES = Path(__file__).resolve().parent.parent / "corpus" / "cases"


def _case(prefix: str) -> str:
    found = sorted(CASES.glob(f"{prefix}-*"))
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    return str(found[0] / "logs")


def test_one_all_reduce_of_two_sizes_is_a_mismatch() -> None:
    """Case 1121: ranks 1, 2, 4 and 5 wait in ALLREDUCE #1107 of 2,560 elements, rank 0 in
    ALLREDUCE #1103 of 544,997,376 (it was four collectives behind)."""
    v = diagnose_paths([_case("1121")]).verdict
    assert (v.kind, v.rule) == ("collective-mismatch", "INF203")


def test_one_all_gather_of_two_sizes_names_the_odd_rank() -> None:
    """Case 1950: at _ALLGATHER_BASE #202571 rank 0 gathers 75,264 elements where ranks 1,
    2 and 6 gather 2,359,296."""
    v = diagnose_paths([_case("1950")]).verdict
    assert (v.kind, v.rule, v.culprit.ranks) == ("collective-mismatch", "INF203", [0])


@pytest.mark.parametrize("prefix", ["803", "878", "885"])
def test_equal_sizes_are_one_call(prefix: str) -> None:
    """Ranks in the same collective with the same count: no mismatch from the sizes."""
    v = diagnose_paths([_case(prefix)]).verdict
    assert v.kind != "collective-mismatch"


def test_per_rank_sizes_are_not_compared() -> None:
    """All-to-all, gathers and coalesced groups may carry other counts on each rank."""
    assert {"alltoall", "alltoall_base", "gather", "scatter", "coalesced"}.isdisjoint(SAME_SIZE_OPS)
