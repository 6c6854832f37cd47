"""The shape of a hypothesis and of its assessment. A hypothesis reads plain job evidence
(model.evidence) and says how well it explains the job's end, with what for and against."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpdoctor.model.evidence import JobEvidence, Stall
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Rule


@dataclass(slots=True)
class Assessment:
    """One hypothesis applied to one job: how much the evidence supports it and whom it blames.

    score: 0..1, the confidence the verdict reports when this hypothesis wins.
    explains_echoes: the timeouts and closed connections of the other ranks are its echo (a
    rank that left or stalled explains why the others waited); False for verdicts that stand
    beside them (a stall caught live, a log that simply ends).
    """

    rule: Rule
    score: float
    culprits: list[int] = field(default_factory=list)
    support: list[str] = field(default_factory=list)
    """Sentences: the evidence for it, said plainly (they become the summary's notes)."""
    against: list[str] = field(default_factory=list)
    """Sentences: what weakens it (lowers the score; shown with the confidence)."""
    evidence: list[Evidence] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    """Steps specific to this job (e.g. the culprit's code line), shown before the rule's."""
    next_steps: list[str] = field(default_factory=list)
    status: Status = Status.FAILED
    category: str | None = None
    explains_echoes: bool = True


@dataclass(frozen=True)
class Hypothesis:
    """A documented inferred cause and the function that scores it."""

    rule: Rule
    assess: Callable[[JobEvidence], Assessment | None]
    precedence: int
    """Breaks ties between equal scores: lower wins (the more specific explanation)."""


_NUMBERS = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


MAIN_PROCESS = 0
"""The main process: rank-dependent branches (`if rank == 0`, `is_main_process`) single it out."""


def world_covering(job: JobEvidence, named: set[int]) -> set[int]:
    """The ranks of the job's world where its size is known and larger than every rank the
    logs name; empty otherwise (a size read from fewer ranks than a report names is no world)."""
    size = job.world_size or 0
    return set(range(size)) if named and size > max(named) else set()


def words_shape(text: str) -> str:
    """A line with its numbers (ranks, steps, losses, times) blanked: two ranks printing the
    same line at the same point of the program give the same shape."""
    return _NUMBERS.sub("#", text.strip().lower())[:200]


def stood_with(job: JobEvidence, waiting: set[int], quiet: set[int]) -> set[int]:
    """Quiet ranks whose last words are those of a waiting rank, numbers aside: they stopped
    where the waiting ranks stopped, and were ended (a launcher stops all after the first
    failure) before their own timeout could print. The quiet ranks left over went elsewhere.
    A rank may have several writers (its own prints, a launcher's header naming it): any
    shared last line counts."""
    shapes: dict[int, set[str]] = {}
    for words in job.last_words:
        if words.rank is not None and (shape := words_shape(words.text)):
            shapes.setdefault(words.rank, set()).add(shape)
    waited = set().union(*(shapes.get(r, set()) for r in waiting))
    if not waited:
        return set()
    return {r for r in quiet if shapes.get(r, set()) & waited}


def exited_while_others_ran(job: JobEvidence) -> tuple[set[int], set[int]] | None:
    """(gone, lost): the ranks that printed nothing and that torchrun's failure summary leaves
    out (it lists every worker that did not exit 0: these had), and those that lost a peer,
    where some rank then lost them or timed out waiting. None otherwise."""
    gone = job.unlisted_exits
    lost = {r for r, v in job.ranks.items() if "lost-peer" in v.echoes}
    if not gone or not (job.waiting or lost) or gone & set(job.failing_exits):
        return None
    return gone, lost


def ranks_text(ranks: set[int] | list[int]) -> str:
    """'rank 1' or 'ranks 0,2'."""
    ordered = sorted(ranks)
    label = "rank" if len(ordered) == 1 else "ranks"
    return f"{label} {','.join(str(r) for r in ordered)}"


def stall_evidence(stall: Stall) -> list[Evidence]:
    """The line of the run's events where the stall and every rank's place were recorded."""
    if not stall.source:
        return []
    where = "; ".join(f"{who} {what}" for who, what in stall.groups[:6]) or stall.summary
    return [Evidence(stall.source, stall.line, None, None, stall.time, f"stacks: {where}")]


def stall_note(stall: Stall) -> str:
    return f"the job stalled under `ddpdoctor run`, which took every rank's stack: {stall.summary}."
