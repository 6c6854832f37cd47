"""Real gloo runs of a Trainer-like script (tests/programs/trainer_style_job.py: a banner,
metrics printed as dicts, 2-4 ranks), one fault per mode: line-proven failures and cross-rank
ones, diagnosed with the kind and culprit a person would give. Captured by
capture_trainer.sh."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"

# mode -> (kind, culprit ranks)
EXPECTED = {
    "unused": ("ddp-unused-parameters", [0, 1]),
    # each rank's message blames the other; of two equal groups (rank 0's 6 params, rank 1's
    # 8) the one without rank 0, the reference DDP builds on: rank 1 had the extra layer
    "model-mismatch": ("ddp-model-mismatch", [1]),
    # every rank calls barrier() before init_process_group and prints the same ValueError (the
    # launcher saw rank 0's exit first and stopped rank 1, already on its way out): both failed
    # (until session 16 the expectation was the launcher's one failed exit, [0])
    "pg-missing": ("process-group-not-initialized", [0, 1]),
    "weights-only": ("weights-only-load", [0, 1]),
    "eval-assert": ("python-exception", [1]),
    "slow-save": ("slow-rank-timeout", [0]),
    "exit": ("uncoordinated-exit", [1]),
    "gather-main": ("collective-mismatch", [0]),
    "segv": ("native-crash", [2]),
    "shape": ("collective-mismatch", [1]),
    "missing-file": ("data-error", [3]),
    "sigterm": ("preempted", []),
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_trainer_run(mode: str) -> None:
    verdict = diagnose_paths([str(REAL / f"trainer-{mode}" / "console.log")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == EXPECTED[mode], (
        verdict.rule,
        verdict.summary,
    )
