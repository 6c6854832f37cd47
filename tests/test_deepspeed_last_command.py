"""DeepSpeed's launcher reports a failed worker as "[<command>] exits with return code = N",
where the command is the one its spawn loop started last (launcher/launch.py sigkill_handler
prints the loop's `cmd`), whichever worker failed. Its '--local_rank=K' names the failed
worker only where K is 0: the node's only worker. Real reports and runs only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

REPO = Path(__file__).resolve().parent.parent


def _case(prefix: str) -> str:
    found = sorted((REPO / "corpus" / "cases").glob(f"{prefix}-*"))
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    return str(found[0] / "logs")


@pytest.mark.parametrize(
    "path",
    [
        # two workers: "'--local_rank=1', ...] exits with return code = -11"
        "corpus:486",
        # set 121 kernel-segv: rank 1 crashed, but the line would name local rank 1 whichever
        "tests/fixtures/real/hundredtwentyfirst-kernel-segv",
    ],
)
def test_the_last_command_of_two_names_no_rank(path: str) -> None:
    where = _case(path.split(":")[1]) if path.startswith("corpus:") else str(REPO / path)
    v = diagnose_paths([where]).verdict
    assert (v.kind, v.culprit.ranks) == ("native-crash", [])


def test_the_only_worker_of_its_node_is_the_one_that_failed() -> None:
    """Case 469: "'--local_rank=0', ...] exits with return code = -9" with one worker."""
    v = diagnose_paths([_case("469")]).verdict
    assert (v.kind, v.culprit.ranks) == ("host-oom", [0])
