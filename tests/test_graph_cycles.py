"""Two relations, each right on its own, may explain two events by each other (a launcher's
report read as the same message as a crash it also reports as an echo): nothing outside the
cycle explains them, so they are not explained, and never an "OK"."""

from __future__ import annotations

from ddpdoctor.analysis.causal_graph import CausalGraph
from ddpdoctor.analysis.events import Event, Node
from ddpdoctor.model.findings import Finding, Hit
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.rules.registry import all_rules

RULES = {r.code: r for r in all_rules()}


def _event(code: str, line: int, rank: int | None) -> Event:
    rule = RULES[code]
    record = Record("slurm-30.err", line, "srun: error: vm: task 2: Segmentation fault", Origin())
    finding = Finding(code, rule.kind, str(rule.category), "", rule.title, ranks=[])
    return Event(finding, rule, rank, [Hit(code, record, {})], None)


def test_events_that_only_explain_each_other_are_ungrounded() -> None:
    crash, report = _event("LCH104", 29, 2), _event("LCH109", 31, None)
    graph = CausalGraph([crash, report])
    graph.add(report, crash, "same report")
    graph.add(crash, report, "echo")
    assert graph.unexplained([crash, report]) == []
    assert graph.ungrounded([crash, report]) == [crash, report]


def test_an_event_explained_from_outside_a_cycle_is_grounded() -> None:
    crash, report = _event("LCH104", 29, 2), _event("LCH109", 31, None)
    graph = CausalGraph([crash, report])
    graph.add(report, crash, "same report")
    graph.add(crash, report, "echo")
    graph.add(graph.add_node(Node("went on", None)), crash, "survived")
    assert graph.ungrounded([crash, report]) == []
