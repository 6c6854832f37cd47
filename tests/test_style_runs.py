"""Real gloo runs of a DDP job written in another style than the scenarios (Python logging
headers, a DistributedSampler, evaluation every epoch; tests/programs/style_train.py), one fault
per mode, with 3 ranks and for the cross-rank ones also 2: the diagnosis must not depend on
the program being the one its rules were built from. Captured by capture_style.sh."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"

# mode -> (status, kind, culprit ranks)
EXPECTED = {
    "leave": ("failed", "uncoordinated-exit", [1]),  # rank 1 returns from the loop
    "sigkill": ("failed", "host-oom", [2]),  # rank 2 SIGKILLed: suggested, not proven
    "segv": ("failed", "native-crash", [0]),
    "keyerror": ("failed", "python-exception", [1]),
    "metric-main": ("failed", "collective-mismatch", [0]),  # all_reduce only on rank 0
    "slow-eval": ("failed", "slow-rank-timeout", [0]),  # rank 0 evaluates past the timeout
    "early-stop-main": ("failed", "uncoordinated-exit", [0]),  # only rank 0 stops early
    "early-stop-all": ("ok", None, []),
    "barrier-main": ("failed", "collective-mismatch", [0]),  # a barrier under `if rank == 0`
    "skip-backward": ("failed", "collective-mismatch", [1]),  # rank 1 skips a backward
    "uneven": ("failed", "uneven-inputs", [1]),  # rank 1 has fewer batches
    "worker-oom": ("failed", "dataloader-worker-killed", [1]),
    "bad-file": ("failed", "data-error", [2]),
}
TWO_RANKS = ["leave", "metric-main", "early-stop-main", "barrier-main", "slow-eval", "uneven"]


@pytest.mark.parametrize(
    ("mode", "suffix"),
    [(m, "") for m in EXPECTED] + [(m, "-2ranks") for m in TWO_RANKS],
)
def test_style_run(mode: str, suffix: str) -> None:
    verdict = diagnose_paths([str(REAL / f"style-{mode}{suffix}" / "console.log")]).verdict
    status, kind, culprits = EXPECTED[mode]
    assert (verdict.status, verdict.kind, verdict.culprit.ranks) == (status, kind, culprits), (
        verdict.rule,
        verdict.summary,
    )
