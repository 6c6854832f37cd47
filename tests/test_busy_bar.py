"""A progress bar's last two redraws say whether its rank was working or waiting
(analysis/behaviour.py _stood_still, _kept_moving): one count that took about the collective
timeout after fast ones is the bar redrawn as its process closed it after a wait; one that took
as long as every count before it is a slow rank's steady pace (set 138 tta-crawl, real: rank
1's evaluation at 8 s a batch while rank 0 timed out after 15 s)."""

from __future__ import annotations

from ddpdoctor.analysis.behaviour import _kept_moving, _stood_still
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.scanner import FactHit
from ddpdoctor.model.records import Origin, Record
from tests.conftest import REPO

TIMEOUT_MS = 15_000.0


def _bar(n: int, elapsed: str, before_n: int, before: str, text: str = "") -> FactHit:
    captures = {"n": str(n), "total": "48", "elapsed": elapsed}
    captures |= {"before_n": str(before_n), "before_elapsed": before}
    line = text or f" 35%|███▌      | {n}/48 [{elapsed}<00:30,  1.2s/it]"
    return FactHit("progress", captures, Record("console.log", 7, line, Origin()), [])


def test_a_fast_bar_that_took_the_timeout_for_its_last_count_stood_still() -> None:
    assert _stood_still(_bar(17, "00:16", 16, "00:01"), TIMEOUT_MS)


def test_a_bar_whose_every_count_took_as_long_kept_its_pace() -> None:
    bar = _bar(3, "00:24", 2, "00:16")
    assert not _stood_still(bar, TIMEOUT_MS)
    assert _kept_moving(bar, set())


def test_a_training_loops_bar_is_not_the_ranks_own_work() -> None:
    assert not _kept_moving(_bar(3, "00:24", 2, "00:16"), {48})


def test_a_slow_ranks_evaluation_bar_still_moving_makes_it_busy_not_stuck() -> None:
    verdict = diagnose_paths(
        [str(REPO / "tests/fixtures/real/hundredthirtyeighth-tta-crawl")]
    ).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("slow-rank-timeout", [1])
