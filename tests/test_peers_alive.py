"""gloo's TCP pairs report a peer process that exits as a closed connection at once (NET101):
ranks that only timed out (TMO102, declared `peers_alive`) waited on peers that were still
running, so none of the silent ranks simply left (uncoordinated exit); they were alive
elsewhere, and are named as such. Real captures of both sides."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


@pytest.mark.parametrize(
    ("capture", "culprit"),
    [("thirteenth-all-crowd", [2, 3]), ("eleventh-report-on-zero", [0])],
)
def test_silent_ranks_the_others_only_timed_out_on_were_running(
    capture: str, culprit: list[int]
) -> None:
    verdict = diagnose_paths([str(REAL / capture)]).verdict
    assert verdict.kind != "uncoordinated-exit", verdict.summary
    assert verdict.culprit.ranks == culprit
    assert "would have reported" in verdict.summary


@pytest.mark.parametrize("capture", ["style-leave", "thirteenth-local-halt", "spawn-leave"])
def test_a_peer_that_left_closes_the_connection_and_is_named_as_gone(capture: str) -> None:
    verdict = diagnose_paths([str(REAL / capture)]).verdict
    assert verdict.kind == "uncoordinated-exit", verdict.summary


def test_a_rank_that_spoke_after_the_others_timed_out_had_not_left() -> None:
    """Corpus case 878 (a re-enacted public report): ranks 2 and 3's watchdog timeouts, then
    the paste stops on rank 6's own timeout line, cut after its header. Rank 6 printed after
    the others gave up, so it was there: not a rank that left first (INF202), a timeout."""
    case = next((REPO / "corpus" / "cases").glob("878-*"))
    verdict = diagnose_paths([str(case / "logs")]).verdict
    assert verdict.kind == "nccl-timeout", verdict.summary
    assert 6 not in verdict.culprit.ranks


def test_a_rank_that_left_in_an_earlier_attempt_still_left() -> None:
    """Twenty-seventh quit-r1 (torchrun --max-restarts 1): rank 1 leaves training in both
    attempts; its lines of the last attempt come after the others' lost peers of the first,
    which say nothing of the last attempt."""
    verdict = diagnose_paths([str(REAL / "twentyseventh-quit-r1")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("uncoordinated-exit", [1])
