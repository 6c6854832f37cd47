"""Two relations, each right on its own, may explain two events by each other (a launcher's
report read as the same message as a crash it also reports as an echo; an abort read as the
exit path of the timeout printed under it, and that timeout as the echo of the abort). The
graph keeps the first of two opposite edges (relations are applied strongest first), and a
longer cycle that nothing outside explains is "ungrounded": never an "OK" or "nothing
recognised" for it."""

from __future__ import annotations

from ddpdoctor.analysis.causal_graph import CausalGraph
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.events import Event, Node
from ddpdoctor.model.findings import Finding, Hit
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.rules.registry import all_rules
from tests.conftest import REPO

RULES = {r.code: r for r in all_rules()}
CASES = REPO / "corpus" / "cases"


def _event(code: str, line: int, rank: int | None) -> Event:
    rule = RULES[code]
    record = Record("slurm-30.err", line, "srun: error: vm: task 2: Segmentation fault", Origin())
    finding = Finding(code, rule.kind, str(rule.category), "", rule.title, ranks=[])
    return Event(finding, rule, rank, [Hit(code, record, {})], None)


def test_the_opposite_of_an_edge_is_not_added() -> None:
    crash, report = _event("LCH104", 29, 2), _event("LCH109", 31, None)
    graph = CausalGraph([crash, report])
    graph.add(report, crash, "same report")
    graph.add(crash, report, "echo")
    assert [(e.cause, e.effect) for e in graph.edges] == [(report, crash)]
    assert graph.unexplained([crash, report]) == [report]


def _cycle_of_three() -> tuple[CausalGraph, list[Event]]:
    """A crash, a launcher's report and another rank's abort, each explaining the next."""
    crash, report, abort = (
        _event("LCH104", 29, 2),
        _event("LCH109", 31, None),
        _event("LCH104", 33, 1),
    )
    graph = CausalGraph([crash, report, abort])
    graph.add(report, crash, "same report")
    graph.add(crash, abort, "echo")
    graph.add(abort, report, "launcher")
    return graph, [crash, report, abort]


def test_events_that_only_explain_each_other_are_ungrounded() -> None:
    graph, events = _cycle_of_three()
    assert graph.unexplained(events) == []
    assert graph.ungrounded(events) == events


def test_an_event_explained_from_outside_a_cycle_is_grounded() -> None:
    graph, events = _cycle_of_three()
    graph.add(graph.add_node(Node("went on", None)), events[0], "survived")
    assert graph.ungrounded(events) == []


def _case(prefix: str) -> str:
    (folder,) = CASES.glob(f"{prefix}-*")
    return str(folder / "logs")


def test_an_abort_is_explained_by_the_timeout_printed_under_it() -> None:
    """Real report (corpus 1873): "0: terminate called after throwing an instance of
    'c10::DistBackendError'" and, under it, "0:   what():  [PG 0 Rank 0] Process group watchdog
    thread terminated with exception: ... Watchdog caught collective operation timeout": the
    abort is how the timeout ended rank 0, not a crash of its own, and not nothing."""
    report = diagnose_paths([_case("1873")])
    verdict = report.verdict
    assert (verdict.status, verdict.kind, verdict.rule) == ("failed", "nccl-timeout", "TMO101")
    roles = {f.rule: f.role for f in report.findings}
    assert roles["LCH104"] == "cascade"


def test_a_teardown_abort_under_a_traceback_is_its_exit_path() -> None:
    """Real report (corpus 178): a gloo 'Read timeout' traceback in all_reduce, then, as the
    process ends, gloo's enforce on cudaErrorCudartUnloading ('29 vs 0 ... driver shutting
    down'): the timeout is the failure; the teardown abort is how the process died of it."""
    report = diagnose_paths([_case("178")])
    assert (report.verdict.kind, report.verdict.rule) == ("nccl-timeout", "TMO102")
    roles = {f.rule: f.role for f in report.findings}
    assert roles["EXIT103"] == "cascade"


def test_a_teardown_abort_alone_is_a_teardown_crash() -> None:
    """Real report (corpus 436): only the abort, once per process: a failure on the way out."""
    verdict = diagnose_paths([_case("436")]).verdict
    assert (verdict.kind, verdict.rule) == ("exit-teardown-crash", "EXIT103")
