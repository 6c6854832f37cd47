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
