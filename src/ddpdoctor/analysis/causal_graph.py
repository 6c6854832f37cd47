"""The causal graph: events and implied causes are nodes; an edge says "A explains B" and
which general relation (analysis/relations.py) says so. A root is what nothing explains. No
relation, rule code or kind is known here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ddpdoctor.analysis.events import Event, Node

Cause = Event | Node


@dataclass(eq=False)
class Edge:
    cause: Cause
    effect: Cause
    relation: str
    """The relation's name (see analysis/relations.py)."""
    why: str = ""
    """The sentence the report may quote for it."""
    proof: bool = False
    """The relation is proven by numbers (timeout arithmetic), not only plausible."""


@dataclass
class CausalGraph:
    events: list[Event]
    apart: Callable[[Event], int] | None = None
    """Which part of the job an event belongs to, where parts cannot explain each other (the
    attempts of a restarted job: their processes are others). None: one part."""
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    # the edges of each cause and effect, in the order they were added: looking them up by a
    # scan of all edges made 10,000 ranks' 30,000 events take 9 s
    _by_cause: dict[int, list[Edge]] = field(default_factory=dict, repr=False)
    _by_effect: dict[int, list[Edge]] = field(default_factory=dict, repr=False)

    def add(
        self, cause: Cause, effect: Cause, relation: str, why: str = "", proof: bool = False
    ) -> None:
        if cause is effect:
            return
        if (
            self.apart is not None
            and isinstance(cause, Event)
            and isinstance(effect, Event)
            and self.apart(cause) != self.apart(effect)
        ):
            return
        if any(e.cause is effect for e in self._by_effect.get(id(cause), ())):
            return  # the effect already explains the cause (an earlier, stronger relation):
            # two events that explain each other would leave neither a root
        edge = Edge(cause, effect, relation, why, proof)
        self.edges.append(edge)
        self._by_cause.setdefault(id(cause), []).append(edge)
        self._by_effect.setdefault(id(effect), []).append(edge)

    def add_node(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def causes_of(self, effect: Cause) -> list[Edge]:
        return list(self._by_effect.get(id(effect), ()))

    def effects_of(self, cause: Cause) -> list[Edge]:
        return list(self._by_cause.get(id(cause), ()))

    def explained(self, item: Cause, among: set[int] | None = None) -> bool:
        """Something else explains it (optionally: only causes whose id is in `among`)."""
        return any(among is None or id(e.cause) in among for e in self.causes_of(item))

    def unexplained(self, items: list[Event]) -> list[Event]:
        return [e for e in items if not self.explained(e)]

    def ungrounded(self, items: list[Event]) -> list[Event]:
        """Items explained only from inside a cycle through themselves (A explains B, B
        explains A, by two relations each right on its own): no member of their cycle has a
        cause outside it. Empty without such cycles."""
        everything: list[Cause] = [*self.events, *self.nodes]
        by_id = {id(x): x for x in everything}
        out: list[Event] = []
        for item in items:
            causes = self.causes_of(item)
            if not causes or any(isinstance(e.cause, Node) for e in causes):
                continue  # unexplained, or explained by an inferred cause: no cycle of events
            cycle = self.reachable_from([item]) & self._walk(item, backward=True)
            if all(
                id(edge.cause) in cycle
                for member in cycle
                for edge in self.causes_of(by_id[member])
            ):
                out.append(item)
        return out

    def reachable_from(self, roots: list[Cause]) -> set[int]:
        """Ids of every node and event that the roots explain, directly or not."""
        seen: set[int] = set()
        for root in roots:
            seen |= self._walk(root, backward=False, seen=seen)
        return seen

    def _walk(self, start: Cause, backward: bool, seen: set[int] | None = None) -> set[int]:
        """Ids of what `start` explains (or, backward, what explains it), directly or not,
        and `start` itself; `seen` is skipped."""
        done = set(seen) if seen else set()
        stack: list[Cause] = [start]
        while stack:
            item = stack.pop()
            if id(item) in done:
                continue
            done.add(id(item))
            edges = self.causes_of(item) if backward else self.effects_of(item)
            stack.extend(e.cause if backward else e.effect for e in edges)
        return done
