"""LCH125: init_process_group with a file:// store waits in gloo's constructor for the other
ranks' keys; when none come, torch raises a bare 'RuntimeError: Wait timeout'. A rendezvous that
never formed, not a Python bug, and from this process's output alone no rank is to blame. The
fixture is a real run (see its README)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "real" / "file-store-wait-timeout"


def test_a_file_store_that_no_peer_joined_is_a_rendezvous_failure() -> None:
    v = diagnose_paths([str(FIXTURE / "console.log")]).verdict
    assert (v.status, v.kind, v.rule, v.culprit.ranks) == (
        "failed",
        "rendezvous-failure",
        "LCH125",
        [],
    )


def test_the_same_words_outside_init_are_not_read_as_a_rendezvous(tmp_path: Path) -> None:
    """'Wait timeout' raised by user code that has nothing to do with the process group."""
    text = (
        "Traceback (most recent call last):\n"
        '  File "poll.py", line 9, in <module>\n'
        "    wait_for_job(handle)\n"
        '  File "poll.py", line 5, in wait_for_job\n'
        '    raise RuntimeError("Wait timeout")\n'
        "RuntimeError: Wait timeout\n"
    )
    log = tmp_path / "poll.log"
    log.write_text(text)
    v = diagnose_paths([str(log)]).verdict
    assert v.rule != "LCH125"


def test_explain_names_the_rule_only_with_the_traceback_that_says_it() -> None:
    """`ddpdoctor explain` with the fixture's traceback names LCH125; with the exception line
    alone it names no rule (it named DATA104, a torch.load failure whose context condition
    the line does not meet, before)."""
    from tests.conftest import run_cli

    traceback = (FIXTURE / "console.log").read_text()
    assert "LCH125" in run_cli("explain", traceback).stdout
    alone = run_cli("explain", "RuntimeError: Wait timeout")
    assert "DATA104" not in alone.stdout and "LCH125" not in alone.stdout
