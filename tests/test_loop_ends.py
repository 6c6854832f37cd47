"""An end of the training loop that a framework prints on its way out of an exception too
(detectron2's "Total training time", YOLOX's "Training of experiment is done", from a
`finally:`) ends training only for a writer that did not fail (analysis/behaviour.py). The whole pipeline on the thirteenth set's
healthy runs (tests/test_thirteenth_style_runs.py) shows the positive side; here, the guard."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.behaviour import build_evidence
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.events import Event
from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.analysis.job import JobView
from ddpdoctor.model.findings import Finding, Hit, JobInfo
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.rules.registry import all_rules
from tests.conftest import REPO

RULES = {r.code: r for r in all_rules()}
SOURCE = "node0/log.txt.rank1"
END = Record(SOURCE, 40, "Total training time: 0:00:12 (0:00:01 on hooks)", Origin(rank=1))


def _job() -> JobView:
    return JobView(info=JobInfo(world_size=2), loop_ends=[(1, END)])


def _error_at(line: int, rank: int, code: str = "PY101") -> Event:
    rule = RULES[code]
    record = Record(SOURCE, line, "FloatingPointError: Loss became infinite", Origin(rank=rank))
    finding = Finding(code, rule.kind, str(rule.category), "", rule.title, ranks=[rank])
    return Event(finding, rule, rank, [Hit(code, record, {})], None)


def test_an_end_after_no_failure_of_its_writer_ends_training() -> None:
    evidence = build_evidence(_job(), [])
    assert evidence.completed_at == {SOURCE: 40}
    assert evidence.ranks[1].completed


def test_an_end_printed_after_its_writers_own_error_is_its_way_out() -> None:
    evidence = build_evidence(_job(), [_error_at(30, rank=1)])
    assert evidence.completed_at == {}
    assert not evidence.ranks.get(1) or not evidence.ranks[1].completed


def test_an_end_above_its_writers_own_traceback_is_its_way_out_too() -> None:
    """The exception goes on through the `finally:`; its caller (loguru's @logger.catch, the
    interpreter) prints it below the end line."""
    evidence = build_evidence(_job(), [_error_at(50, rank=1)])
    assert evidence.completed_at == {}


def test_an_exception_python_printed_and_carried_on_from_does_not_cancel_it() -> None:
    """An unraisable exception ('Exception ignored in: <function X.__del__>', a finalizer at
    interpreter exit) raised nothing: it is not what made the loop end."""
    handled = _error_at(50, rank=1)
    handled.hits[0].handled = True
    assert build_evidence(_job(), [handled]).completed_at == {SOURCE: 40}


def test_detectron2s_end_then_a_writers_finalizer_error_reads_as_an_end() -> None:
    """Corpus 979 (training split): 'Total training time', then TensorboardXWriter.__del__'s
    ignored TypeError at exit; the process then hung. Only the end of training was read."""
    case = next((REPO / "corpus" / "cases").glob("979-*"))
    verdict = diagnose_paths([str(case / "logs")]).verdict
    assert verdict.title == "Only the end of training was read"
    assert verdict.status == "unknown"
    # the one failure such a fragment leaves room for, named as a guess
    assert (verdict.kind, verdict.rule, verdict.confidence) == (
        "exit-teardown-crash",
        "INF210",
        0.3,
    )


def test_another_ranks_error_does_not_cancel_it() -> None:
    for line in (30, 50):
        assert build_evidence(_job(), [_error_at(line, rank=0)]).completed_at == {SOURCE: 40}


# PyTorch-Ignite's idist.Parallel.run after the training function returned (census
# ignite-parallel-end-of-run): the end of training; an engine's own end is not (an evaluator
# prints it after every validation), nor a script's own "End of run 3"
IGNITE_END = [f for f in FACT_PATTERNS if f.name == "completed" and "ignite" in f.regex]


@pytest.mark.parametrize(
    "line",
    [
        "ignite.distributed.launcher.Parallel INFO: End of run",
        "2024-05-02 10:00:02,481 ignite.distributed.launcher.Parallel INFO: End of run",
    ],
)
def test_ignites_end_of_run_is_an_end_of_training(line: str) -> None:
    assert len(IGNITE_END) == 1
    assert IGNITE_END[0].compiled.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "trainer INFO: Engine run finished. Time taken: 00:00:01.193",
        "evaluator INFO: Engine run finished. Time taken: 00:00:00.027",
        "ignite.distributed.launcher.Parallel INFO: - Run '<function training>' in 2 processes",
        "ignite.distributed.launcher.Parallel INFO: Initialized processing group with backend: "
        "'gloo'",
        "ignite.distributed.launcher.Parallel INFO: End of run 3 of 5, next: lr=0.01",
        "End of run",
    ],
)
def test_an_engines_end_or_another_end_of_run_is_not(line: str) -> None:
    assert not any(f.compiled.search(line) for f in FACT_PATTERNS if f.name == "completed")


def test_an_end_then_the_warning_printed_at_exit_is_a_run_that_exited() -> None:
    """Case 983: 'Training finished, exiting ...', then torch's warning that
    destroy_process_group() was not called before program exit, which only a process on its
    way out prints: it exited, not a fragment that cannot vouch for the run."""
    case = next((REPO / "corpus/cases").glob("983-*"))
    verdict = diagnose_paths([str(case / "logs")]).verdict
    assert (verdict.status, verdict.kind) == ("ok", None)
    assert any("destroy_process_group" in step for step in verdict.next_steps)


def test_an_error_the_run_went_on_from_to_its_end_is_no_failure() -> None:
    """Fifth set's noisy-ok (a real run): rank 0's dashboard push raises three times, caught
    and printed by the program; training then announces its end ('done: 30 steps') in the
    same output, no rank lost another and the agent reported no failed worker."""
    verdict = diagnose_paths([str(REPO / "tests/fixtures/real/fifth-noisy-ok")]).verdict
    assert (verdict.status, verdict.kind) == ("ok", None)
