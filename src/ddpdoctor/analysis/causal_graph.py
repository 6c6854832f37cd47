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
        out: list[Event] = []
        for item in items:
            if not self.causes_of(item):
                continue
            cycle = self.reachable_from([item]) & self._explaining(item)
            if id(item) in cycle and all(
                id(edge.cause) in cycle
                for member in self._members(cycle)
                for edge in self.causes_of(member)
            ):
                out.append(item)
        return out

    def _explaining(self, item: Cause) -> set[int]:
        """Ids of everything that explains the item, directly or not, and the item."""
        seen: set[int] = set()
        stack: list[Cause] = [item]
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            stack.extend(e.cause for e in self.causes_of(current))
        return seen

    def _members(self, ids: set[int]) -> list[Cause]:
        everything: list[Cause] = [*self.events, *self.nodes]
        return [x for x in everything if id(x) in ids]

    def reachable_from(self, roots: list[Cause]) -> set[int]:
        """Ids of every node and event that the roots explain, directly or not."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            item = stack.pop()
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.extend(e.effect for e in self.effects_of(item))
        return seen
