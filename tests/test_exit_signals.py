"""Exit codes that stand for a signal: negative as torchelastic reports them, 128+N as shells
report them, and 256-N from a wrapper that exits with its child's negative return code
(Determined's launch layer: `sys.exit(proc.wait())`, set 108). Programs' own codes are not."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import signal_name
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (-9, "SIGKILL"),
        (137, "SIGKILL"),
        (247, "SIGKILL"),
        (245, "SIGSEGV"),
        (250, "SIGABRT"),
        (241, "SIGTERM"),
        (143, "SIGTERM"),
        # a program's own exit(-1), exit(-2), exit(1): no signal
        (255, None),
        (254, None),
        (1, None),
        (0, None),
        (246, None),
    ],
)
def test_exit_codes_that_stand_for_a_signal(code: int, name: str | None) -> None:
    assert signal_name(code) == name


@pytest.mark.parametrize(
    ("mode", "kind", "ranks"),
    [("rss-climb", "host-oom", [0]), ("kernel-null", "native-crash", [1])],
)
def test_a_wrapped_signal_is_the_ranks_death(mode: str, kind: str, ranks: list[int]) -> None:
    """torchrun's summary shows 247 and 245 for a SIGKILLed and a SIGSEGVed rank behind
    Determined's wrapper, and nothing else says how they died."""
    verdict = diagnose_paths([str(REAL / f"hundredeighth-{mode}")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == (kind, ranks)


CASE_620 = REPO / "corpus" / "cases" / "620-nccl-timeout-determined-mnist-first-allgather-all-ranks"


def test_a_trace_cut_at_the_moment_a_peers_collective_timed_out_is_that_timeout() -> None:
    """Corpus case 620 (Determined, a paste in three parts): ranks 2 and 3's tracebacks under
    DDP's wrapping begin 0.02 s after ranks 1 and 4 report that their first all-gather ran for
    its whole 30 minutes, and the paste cuts them: the same timeout, not an error of their own."""
    verdict = diagnose_paths([str(CASE_620 / "logs")]).verdict
    assert verdict.kind == "nccl-timeout"
    assert not {2, 3} & set(verdict.culprit.ranks)
