"""A stop on a loss that is no longer finite ('Loss is nan, stopping training', then
sys.exit(1): DeiT's, MAE's, DINO's and SwAV's check) is the program's answer to a diverged
run. Announced by every rank with nobody left waiting, it is a failure of training on every
rank (INF242), not an agreed early stop; announced by one rank while the others lost it, it
stays that rank's own exit. Real captures only."""

from __future__ import annotations

from ddpdoctor.analysis.decision import NON_FINITE
from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.program_runs import REAL


def test_every_rank_stopping_on_a_nan_loss_is_a_diverged_run() -> None:
    """Set 116 half-exp: both SwAV ranks print 'Loss is nan, stopping training' (no rank
    prefix) after float16 exp overflowed, and exit 1."""
    v = diagnose_paths([str(REAL / "hundredsixteenth-half-exp")]).verdict
    assert (v.status, v.kind, v.rule, v.culprit.ranks) == (
        "failed",
        "python-exception",
        "INF242",
        [0, 1],
    )


def test_one_rank_stopping_on_its_own_nan_is_not() -> None:
    """Set 52 nan-one: rank 1 alone stops on its NaN inputs; rank 0 loses it."""
    v = diagnose_paths([str(REAL / "fiftysecond-nan-one")]).verdict
    assert v.rule != "INF242"


def test_the_words_name_a_value_no_longer_finite() -> None:
    assert NON_FINITE.search("Loss is nan, stopping training")
    assert NON_FINITE.search("Non-finite loss at step 6, stopping")
    assert not NON_FINITE.search("val loss 0.31 did not improve for 3 epochs, stopping")
    assert not NON_FINITE.search("reached the target: infer mode next, stopping")
