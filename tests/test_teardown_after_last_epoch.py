"""A crash after every rank's epoch counter reached its own total is teardown: the work was
done (relate_completion through decision._work_done_at), though no line announced the end."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def test_an_abort_after_the_last_epoch_is_a_teardown_crash() -> None:
    """A real run of tests/programs/del_at_exit_train.py under torchrun: both ranks print
    'epoch 3/3', then rank 0 aborts at exit ('terminate called without an active exception',
    exit -6) and torchrun SIGTERMs rank 1. It read as a native crash before."""
    verdict = diagnose_paths([str(REAL / "teardown-abort-after-last-epoch")]).verdict
    assert (verdict.status, verdict.kind, verdict.culprit.ranks) == (
        "failed",
        "exit-teardown-crash",
        [0],
    )
    assert "reached the last one" in verdict.summary


def test_a_crash_at_an_epoch_a_count_from_zero_calls_last_is_not() -> None:
    """hundredthirtyseventh-segv-ext: AllenNLP's 'Epoch 1/2' (the second of three: it counts
    'Epoch %d/%d', epoch, num_epochs - 1), then worker 1's SIGSEGV. A count from 0 would make
    '1/2' the last of two; it stands at no total of its own, so the crash is the failure."""
    verdict = diagnose_paths([str(REAL / "hundredthirtyseventh-segv-ext")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("native-crash", [1])
