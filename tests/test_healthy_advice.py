"""A healthy run's warnings get their advice in the verdict's next steps, said as advice and
not as a cause (corpus training cases whose threads asked about exactly those warnings); a
failed run's verdict does not list them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

CASES = REPO / "corpus" / "cases"


def _case(prefix: str) -> str:
    found = sorted(CASES.glob(f"{prefix}-*"))
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    return str(Path(found[0]) / "logs")


@pytest.mark.parametrize(
    ("prefix", "advice"),
    [
        # Megatron's run ends with torch's "destroy_process_group() was not called" warning
        ("271", "destroy_process_group"),
        ("453", "destroy_process_group"),
        # the Trainer's needless find_unused_parameters=True (DDP108)
        ("334", "find_unused_parameters=False"),
        # NCCL's barrier guessing the rank's GPU (DDP109)
        ("375", "device_id"),
        # ... and torch 2.7+'s guess before the first collective, behind pytest's test-file
        # name: its advice names init_process_group, and the log does not stop in start-up
        ("1607", "device_id"),
    ],
)
def test_an_ok_verdict_gives_the_advice_of_its_warnings(prefix: str, advice: str) -> None:
    verdict = diagnose_paths([_case(prefix)]).verdict
    assert verdict.status == "ok" and verdict.kind is None
    steps = [s for s in verdict.next_steps if s.startswith("Not a failure, but worth fixing")]
    assert steps and advice in " ".join(steps), verdict.next_steps


def test_a_failed_verdict_does_not_list_them() -> None:
    verdict = diagnose_paths([_case("136")]).verdict  # a failure with teardown warnings around
    assert verdict.status != "ok"
    assert not [s for s in verdict.next_steps if s.startswith("Not a failure")]
