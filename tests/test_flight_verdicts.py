"""The verdicts issue 13 asks of the six real Flight Recorder captures and the `ddpdoctor run`
hang (tests/fixtures/real/flight-recorder): with the dumps, the verdict names the collective,
its sequence id, the ranks and each side's code line, and turns the logs' timeouts into the
right kind and culprit. What the analysis alone finds is in test_flight_analysis.py.
"""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.findings import Report
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "real" / "flight-recorder"
PROGRAMS = REPO / "tests" / "programs"


def site(program: str, statement: str, occurrence: int = 1) -> str:
    lines = (PROGRAMS / program).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if statement in line]
    return f"{program}:{hits[occurrence - 1]}"


def fc(statement: str, occurrence: int = 1) -> str:
    return site("flight_cases.py", statement, occurrence)


# case -> kind, category, culprit ranks, what the verdict's summary must name
EXPECTED: dict[str, tuple[str, str, list[int], list[str]]] = {
    "skip": (
        "collective-mismatch",
        "user-code",
        [1],
        ["all_reduce #4", fc("dist.all_reduce(grads)"), "barrier #4", fc("dist.barrier()")],
    ),
    "op": (
        "collective-mismatch",
        "user-code",
        [0, 1],
        [
            "all_reduce #4",
            fc("dist.all_reduce(metric)"),
            "broadcast #4",
            fc("dist.broadcast(metric"),
        ],
    ),
    "shape": (
        "collective-mismatch",
        "user-code",
        [1],
        ["all_reduce #4", fc("dist.all_reduce(stats)")],
    ),
    "sleep": (
        "slow-rank-timeout",
        "configuration",
        [1],
        ["barrier #5", fc("dist.barrier()"), "#4", fc("dist.all_reduce(grads)")],
    ),
    "die": (
        "python-exception",
        "user-code",
        [1],
        ["all_reduce #3", fc("dist.all_reduce(grads)")],
    ),
    "two-groups": (
        "collective-mismatch",
        "user-code",
        [0, 1],
        [
            "all_reduce #1",
            fc("dist.all_reduce(loss, group=group)"),
            "all_reduce #4",
            fc("dist.all_reduce(grads)", 3),
        ],
    ),
}


def logs_and_dumps(case: str) -> Report:
    return diagnose_paths([str(FIXTURES / case / "console.log"), str(FIXTURES / case / "dumps")])


def test_the_dumps_reach_the_report() -> None:
    """Not waiting for anything: the analysis is attached to the job of every capture."""
    for case in EXPECTED:
        flight = logs_and_dumps(case).job.flight
        assert flight is not None and flight.divergences, case


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_verdict_names_collective_sequence_ranks_and_lines(case: str) -> None:
    kind, category, culprits, named = EXPECTED[case]
    v = logs_and_dumps(case).verdict
    assert (v.kind, v.category, v.culprit.ranks) == (kind, category, culprits)
    for text in named:
        assert text in v.summary, (text, v.summary)


@pytest.mark.parametrize("case", ["skip", "op", "two-groups", "sleep"])
def test_dumps_turn_the_logs_timeouts_into_the_cause(case: str) -> None:
    """On their logs alone these captures read as a timeout with no culprit (nccl-timeout) or
    as the wrong kind (sleep: uncoordinated-exit, as rank 1 was SIGTERMed while sleeping);
    with the dumps, the right kind and culprit, at least as confident."""
    kind, _category, culprits, _named = EXPECTED[case]
    alone = diagnose_paths([str(FIXTURES / case / "console.log")]).verdict
    both = logs_and_dumps(case).verdict
    assert (both.kind, both.culprit.ranks) == (kind, culprits)
    assert both.confidence >= alone.confidence


def test_run_hang_report_names_the_collective() -> None:
    """The run folder `ddpdoctor run` left for a hang (rank 1 sleeping before the barrier):
    the verdict names barrier #6 and both code lines. (This run folder predates the stack
    activities in events.jsonl, so the recorder's lagging rank carries the verdict.)"""
    report = diagnose_paths([str(FIXTURES / "run-hang" / "run")])
    v = report.verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("hung", "hang", [1])
    for text in (
        "barrier #6",
        site("run_train.py", "dist.barrier()"),
        site("run_train.py", "dist.all_reduce(t)"),
    ):
        assert text in v.summary, (text, v.summary)


def test_run_hang_fixture_holds_the_dumps() -> None:
    flight = diagnose_paths([str(FIXTURES / "run-hang" / "run")]).job.flight
    assert flight is not None and flight.ranks_with_dump == [0, 1]
    first = flight.divergences[0]
    assert (first.kind, first.seq, first.ranks) == ("behind", 6, [1])


def test_fixture_programs_are_where_the_dumps_say() -> None:
    """The code lines quoted above are the lines the recorders captured (the fixtures were made
    by this version of the programs)."""
    flight = logs_and_dumps("sleep").job.flight
    assert flight is not None
    sites = {c.site for d in flight.divergences for c in d.calls}
    assert sites == {fc("dist.barrier()"), fc("dist.all_reduce(grads)")}


def test_dumps_alone_that_diverge_are_not_ok() -> None:
    """Only the dumps of `die` (no log): today the verdict reads OK, no failure found, above a
    table that shows rank 1 never issuing all_reduce #3."""
    v = diagnose_paths([str(FIXTURES / "die" / "dumps")]).verdict
    assert v.status != "ok"
    assert v.culprit.ranks == [1] and "all_reduce #3" in v.summary
