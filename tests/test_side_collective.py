"""gloo aborts the rank that received a larger message than its own collective expected
('op.preamble.length <= op.nbytes. 8 vs 4'). In a world of two, when that receiver expected a
few bytes and got a gradient-sized message it left the common path itself (a skipped step, a
metric on its own); when both messages were small, the sizes say nothing and the main process,
which rank-dependent branches single out, is named. Real gloo runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


@pytest.mark.parametrize(
    ("fixture", "culprit", "prior"),
    [
        # the master's extra precise-BN all_reduce (8 bytes) into process 1's 4-byte one
        ("sixtyeighth-bn-solo", [0], True),
        # rank 0's grad-norm all_reduce under `if rank == 0` (36 vs 8)
        ("fortysixth-norm-solo", [0], True),
        # rank 1 skipped a step: it waited in an 8-byte flag while rank 0 sent gradients
        ("fifteenth-hand-bucket", [1], False),
        # the aborted rank is the main process itself: nothing to change
        ("fortyfifth-solo-histogram", [0], False),
        # a world of three: the ring's sender is not known, the aborted rank stays named
        ("sixtysixth-ragged-valid", [2], False),
    ],
)
def test_the_sender_is_named_only_between_two_small_collectives(
    fixture: str, culprit: list[int], prior: bool
) -> None:
    v = diagnose_paths([str(REAL / fixture)]).verdict
    assert (v.rule, v.culprit.ranks) == ("COL101", culprit)
    said = " ".join(v.basis)
    assert ("which of the two ranks was out of place is a prior" in said) is prior
