"""INF203: the ranks were not in the same collective. Evidence, without TORCH_DISTRIBUTED_DEBUG:
the ranks' timeouts name different collectives or different lines of the program (a collective
inside a rank-dependent branch: a metric synced on the main process only, wait_for_everyone()
under `if is_main_process`, an extra barrier on one rank); a live run's stacks show ranks
waiting in different collectives; or only a minority of ranks waited while the rest went on."""

from __future__ import annotations

from ddpdoctor.model.evidence import EVALUATION, JobEvidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.frameworks import COLLECTIVE_IN_BRANCH_FIX
from ddpdoctor.rules.hypotheses.base import (
    MAIN_PROCESS,
    Assessment,
    ranks_text,
    stall_evidence,
    stood_with,
    world_covering,
)

RULE = Rule(
    code="INF203",
    kind="collective-mismatch",
    title="The ranks waited in different collectives",
    signatures=(),
    explanation=Explanation(
        what="The ranks timed out (or hung) in collectives that do not match: another "
        "operation, another line of the program, or a collective only some ranks issued.",
        why="A collective inside a rank-dependent branch (`if rank == 0: all_reduce`, a metric "
        "synced only on the main process, `wait_for_everyone()` under `if is_main_process`), "
        "or a rank that skipped a step the others took, so the ranks' sequences of "
        "collectives diverged.",
        fix="Make every rank issue the same collectives in the same order; move rank-dependent "
        "work outside collectives; re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL to have the "
        "mismatch reported.",
        false_positives="Uneven inputs give a similar picture: one rank left the loop and waits "
        "in a final barrier while the others wait in the next step.",
    ),
    fix=(
        "Find the collective in a rank-dependent branch (if rank == 0 / if is_main_process / "
        "a skipped step) and call it on every rank, or move it out of the branch.",
        "Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL to have the mismatching collective named.",
    ),
    framework_fix=COLLECTIVE_IN_BRANCH_FIX,
)


DIVERGING = ("mismatch", "only-some", "group-order", "group-config")
"""Flight Recorder divergences that are a collective mismatch (not a rank left behind)."""


def assess(job: JobEvidence) -> Assessment | None:
    found = [
        a
        for a in (
            _from_flight(job),
            _from_stall(job),
            _from_wait_sites(job),
            _from_minority(job),
            _from_lone_evaluation(job),
            _from_skipped_step(job),
            _from_named_absence(job),
            _from_group_creation(job),
            _from_crossed_sends(job),
        )
        if a
    ]
    return max(found, key=lambda a: a.score) if found else None


SAME_SIZE_OPS = frozenset(
    {
        "allreduce",
        "allgather",
        "_allgather_base",
        "broadcast",
        "reduce",
        "reduce_scatter",
        "_reduce_scatter_base",
    }
)
"""NCCL's OpType names (lower case) of collectives whose input has as many elements on every
rank (not all-to-all, gather or scatter with per-rank sizes, nor a coalesced group)."""


COMPARED_WHERE_KNOWN = 2
"""Where a rank waited: (op, site, size, caller); from this field on, a field is compared only
where every rank's lines show it."""


def _known_on_every_rank(where: dict[int, tuple[object, ...]]) -> dict[int, tuple[object, ...]]:
    """Where the ranks waited, without the size or caller that some rank's output lacks (a
    traceback cut by the paste, a timeout line without NumelIn): a field one rank does not
    show says nothing of a difference. The op and the site stay as they are (a rank waiting
    in a receive no collective names is a side of its own)."""
    width = len(next(iter(where.values())))
    kept = list(range(COMPARED_WHERE_KNOWN)) + [
        i
        for i in range(COMPARED_WHERE_KNOWN, width)
        if all(key[i] is not None for key in where.values())
    ]
    return {rank: tuple(key[i] for i in kept) for rank, key in where.items()}


def _groups(where: dict[int, tuple[object, ...]]) -> list[set[int]]:
    """Ranks grouped by where they were, largest group first, then by lowest rank."""
    groups: dict[tuple[object, ...], set[int]] = {}
    for rank, key in where.items():
        groups.setdefault(key, set()).add(rank)
    return sorted(groups.values(), key=lambda g: (-len(g), min(g)))


def _odd_ones(groups: list[set[int]]) -> tuple[set[int], bool]:
    """The ranks outside the largest group, and whether that was a guess (groups of equal
    size: the main process's group is named, as rank-dependent branches favour it)."""
    if len(groups[0]) > len(groups[1]):
        return set().union(*groups[1:]), False
    with_main = next((g for g in groups if MAIN_PROCESS in g), None)
    if with_main is not None:
        return with_main, True
    return set().union(*groups), True


def _describe(where: dict[int, str]) -> str:
    by: dict[str, list[int]] = {}
    for rank, text in sorted(where.items()):
        by.setdefault(text, []).append(rank)
    return "; ".join(f"{ranks_text(r)} {t}" for t, r in by.items())


def _from_flight(job: JobEvidence) -> Assessment | None:
    """The ranks' Flight Recorders disagree on what was called at one sequence number."""
    if job.flight is None:
        return None
    div = next((d for d in job.flight.divergences if d.kind in DIVERGING), None)
    if div is None:
        return None
    return Assessment(
        RULE,
        0.7 if div.ambiguous else 0.85,
        sorted(div.ranks),
        [f"the Flight Recorder dumps show it: {div.summary}"],
        against=["the dumps cannot tell which side took the extra or missing call"]
        if div.ambiguous
        else [],
    )


def _from_stall(job: JobEvidence) -> Assessment | None:
    if job.stall is None:
        return None
    inside = {r: a for r, a in job.stall.activities.items() if a.in_collective}
    if len(inside) < 2 or len(inside) != len(job.stall.activities):
        return None
    groups = _groups({r: (a.op, a.site) for r, a in inside.items()})
    if len(groups) < 2:
        return None
    odd, guess = _odd_ones(groups)
    where = {r: f"wait in {a.op} at {a.site}" for r, a in inside.items()}
    return Assessment(
        RULE,
        0.65 if guess else 0.8,
        sorted(odd),
        [f"the ranks' stacks show them in different collectives: {_describe(where)}."]
        + (
            [
                "The ranks are split evenly; the main process's side is named, as rank-dependent "
                "branches most often single it out."
            ]
            if guess
            else []
        ),
        evidence=stall_evidence(job.stall),
        status=Status.HUNG,
    )


def _from_wait_sites(job: JobEvidence) -> Assessment | None:
    where: dict[int, tuple[object, ...]] = {}
    text: dict[int, str] = {}
    for rank, view in job.ranks.items():
        sites = [s for s in view.wait_sites if s.op or s.site]
        if not sites:
            continue
        last = sites[-1]
        op = last.op.lower() if last.op else None
        # the element count of a collective every rank must call with the same size: ranks
        # in one of a different size were in a different call (NCCL checks no sizes)
        numel = last.numel if op in SAME_SIZE_OPS else None
        where[rank] = (op, last.site, numel, last.caller)
        at = (
            f" at {last.site}" + (f" from {last.caller}" if last.caller else "")
            if last.site
            else ""
        )
        seq = f" #{last.seq}" if last.seq is not None else ""
        size = f" of {numel} elements" if numel is not None else ""
        text[rank] = f"waited in {last.op or 'a collective'}{seq}{size}{at}"
    if len(where) < 2:
        return None
    where = _known_on_every_rank(where)
    groups = _groups(where)
    if len(groups) < 2:
        return None
    odd, guess = _odd_ones(groups)
    ahead = _gone_on(groups, where) if guess else None
    if ahead is not None:
        odd = ahead
    # a rank the launcher had to stop, silent and in no collective: the one collective it
    # never joined holds the peers that need it (a broadcast's root, its children) while
    # the others, served, go on to the next; their different collectives are its absence
    absent = {
        r for r in job.quiet if job.ranks[r].terminated and not job.ranks[r].wait_sites
    } - set(where)
    return Assessment(
        RULE,
        0.35 if absent else 0.45 if guess else 0.6,
        sorted(odd),
        [f"the ranks timed out in different collectives: {_describe(text)}."]
        + (
            [
                f"The ranks are split evenly; {ranks_text(ahead)} had gone on to a collective "
                "while the others still waited to receive from them: a send they skipped."
            ]
            if ahead is not None
            else [
                "The ranks are split evenly, so the logs cannot say which side took the extra "
                "or missing call; the main process's side is named, as rank-dependent branches "
                "most often single it out."
            ]
            if guess
            else []
        ),
        against=(["a guess between evenly split ranks"] if guess else [])
        + (
            [
                f"{ranks_text(absent)} was stopped alive in no collective: a collective it never "
                "joined holds some ranks while the others go on"
            ]
            if absent
            else []
        ),
    )


def _gone_on(groups: list[set[int]], where: dict[int, tuple[object, ...]]) -> set[int] | None:
    """Of two even sides, the one that went on to a named collective while the other waits
    in a receive no collective names (a point-to-point exchange: an isend/irecv's wait): the
    receivers wait for a send the others skipped on their way."""
    if len(groups) != 2:
        return None
    ops = [where[min(g)][0] for g in groups]
    named = [g for g, op in zip(groups, ops, strict=True) if op not in (None, "recv")]
    return named[0] if len(named) == 1 else None


def _from_minority(job: JobEvidence) -> Assessment | None:
    waiting, quiet = job.waiting, job.quiet
    if not (waiting and quiet):
        return None
    finished = {r for r in quiet if job.ranks[r].completed and not job.ranks[r].announced_stop}
    if not finished and job.waited_after_end(waiting):
        # no rank's own line says it finished, but training announced its end before the
        # waiting ranks entered their collective: the ranks that left without an error left
        # after it (a training step needs every rank), they did not leave early
        finished = {r for r in quiet if not job.ranks[r].announced_stop}
    if finished and finished == quiet:
        return Assessment(
            RULE,
            0.6,
            sorted(waiting),
            [
                f"{ranks_text(finished)} finished training and left; {ranks_text(waiting)} "
                "waited in a collective after that, one the others never called (a "
                "collective in a rank-dependent branch at the end, such as wait_for_everyone() "
                "under `if is_main_process`)."
            ],
        )
    stood = stood_with(job, waiting, quiet)
    odd = quiet - stood
    if stood and odd and len(waiting | stood) > len(odd):
        return Assessment(
            RULE,
            0.5,
            sorted(odd),
            [
                f"{ranks_text(waiting)} timed out, and {ranks_text(stood)} stopped at the same "
                f"point (their last words are alike), while {ranks_text(odd)} had gone on to "
                "something else: "
                + "; ".join(f"rank {r}: {job.ranks[r].last_text[:120]!r}" for r in sorted(odd))
                + f". The others were in a collective {ranks_text(odd)} did not join."
            ],
            against=[
                "the ranks that stood still printed no timeout of their own (they were "
                "stopped once the first rank failed)"
            ],
        )
    if len(waiting) >= len(quiet):
        return None
    return Assessment(
        RULE,
        0.5,
        sorted(waiting),
        [
            f"only {ranks_text(waiting)} timed out; {ranks_text(quiet)} went on without error, "
            "so the waiting ranks were in a collective nobody else joined."
        ],
    )


def _from_lone_evaluation(job: JobEvidence) -> Assessment | None:
    """Only the main process timed out, in a collective its evaluation reached (a metric's
    barrier or all-reduce), and no other rank of the world failed, waited or printed a line:
    an evaluation run on the main process only, whose collective the others never call (they
    went on training, silent as non-main ranks often are). A guess: silent ranks may also
    have been slow or stuck in an evaluation of their own."""
    if job.waiting != {MAIN_PROCESS} or not job.started_training:
        return None
    sites = job.ranks[MAIN_PROCESS].wait_sites
    if not sites or sites[-1].phase != EVALUATION:
        return None
    others = {r for r in job.ranks if r != MAIN_PROCESS}
    if not others or any(job.ranks[r].present or job.ranks[r].failed for r in others):
        return None
    return Assessment(
        RULE,
        0.4,
        [MAIN_PROCESS],
        [
            f"only the main process timed out, in a collective its evaluation reached "
            f"({sites[-1].op or 'a collective'}), while {ranks_text(others)} printed nothing "
            "and failed in nothing: an evaluation run on the main process only, whose "
            "collective the other ranks never call."
        ],
        against=[f"{ranks_text(others)} printed nothing: they may have been busy elsewhere"],
    )


def _from_skipped_step(job: JobEvidence) -> Assessment | None:
    """A few ranks said they skip a step (a bad batch, no labels) and then ranks timed out: a
    rank that skips a step skips its collectives, so from then on the ranks' collectives no
    longer pair up. When every rank said it, they skipped together."""
    present = {r for r, v in job.ranks.items() if v.present}
    skipped = job.skipped_ranks & present
    if not skipped or not job.waiting or len(skipped) * 2 > len(present):
        return None
    return Assessment(
        RULE,
        0.5,
        sorted(skipped),
        [
            f"{ranks_text(skipped)} said it skipped a step or a batch that "
            f"{ranks_text(present - skipped)} did not skip, and then ranks timed out: a skipped "
            "step skips its collectives (the gradient all-reduce of its backward), so the "
            "ranks' collectives no longer paired up."
        ],
        fix=[
            "Never skip a step on one rank: compute the skip decision on every rank (all_reduce "
            "a flag) or replace the bad batch's loss by 0 * loss so every rank runs backward."
        ],
    )


def _from_named_absence(job: JobEvidence) -> Assessment | None:
    """The waiting side names every rank as missing from some collective the others had
    submitted (Horovod's stall report): no rank is merely behind, each is on a path of its
    own, submitting collectives the others do not."""
    present = {r for r, v in job.ranks.items() if v.present}
    named = {r for r, v in job.ranks.items() if v.named_absent}
    if len(named) < 2 or not present or not present <= named:
        return None
    # every rank of the world, not only the one or two whose lines were given
    world = world_covering(job, named) or present
    if len(world) < 2 or not world <= named:
        return None
    if any(v.failed for v in job.ranks.values()):
        return None
    return Assessment(
        RULE,
        0.65,
        [],
        [
            f"the job's stall report names every rank ({ranks_text(named)}) as missing a "
            "collective that other ranks had submitted: no rank is simply behind; the ranks "
            "submitted different collectives and each waits for one the others will never send."
        ],
        status=Status.HUNG,
    )


def _from_group_creation(job: JobEvidence) -> Assessment | None:
    """Ranks timed out creating process groups, not the same one: every rank creates every
    group in one order, so they disagree on the groups. The ranks waiting on the latest group
    created more groups than the others, or other ones: when they are not the majority,
    they are the ones whose sequence of groups differs."""
    at: dict[int, int] = {}
    for rank, view in job.ranks.items():
        groups = [s.group for s in view.wait_sites if s.group is not None]
        if groups:
            at[rank] = groups[-1]
    if len(set(at.values())) < 2:
        return None
    latest = max(at.values())
    ahead = {r for r, g in at.items() if g == latest}
    culprits = ahead if 2 * len(ahead) <= len(at) else set()
    where = "; ".join(
        f"{ranks_text({r for r, g in at.items() if g == group})} on group {group}"
        for group in sorted(set(at.values()))
    )
    return Assessment(
        RULE,
        0.65,
        sorted(culprits),
        [
            "the ranks timed out creating process groups, each waiting on another group "
            f"({where}): they did not create the same groups in the same order."
            + (
                f" {ranks_text(culprits)} had gone on to a group the others never reached."
                if culprits
                else ""
            )
        ],
    )


def _from_crossed_sends(job: JobEvidence) -> Assessment | None:
    """Every rank that waited stood in a blocking send (its traceback's `dist.send`), and no
    rank failed on its own: a blocking send returns once its peer posts the matching receive,
    so ranks that all send before they receive wait on each other (an exchange, a ring, a
    pipeline's hand-off written in the same order on both sides). The order of the exchange
    is wrong on every rank alike: nobody to single out."""
    if any(v.failed for v in job.ranks.values()):
        return None
    ops: dict[int, str | None] = {}
    for rank, view in job.ranks.items():
        sites = [s for s in view.wait_sites if s.op or s.site]
        if sites:
            ops[rank] = sites[-1].op.lower() if sites[-1].op else None
    senders = {r for r, op in ops.items() if op == "send"}
    # every rank of the world among them: a rank that was elsewhere (busy, stuck, gone) is
    # the receiver the senders waited for, not a partner in a crossed exchange
    world = set(range(job.world_size)) if job.world_size else set(job.ranks)
    if len(world) < 2 or set(ops) != world or senders != world:
        return None
    where = "; ".join(
        f"rank {r} at {job.ranks[r].wait_sites[-1].site}"
        for r in sorted(senders)
        if job.ranks[r].wait_sites[-1].site
    )
    return Assessment(
        RULE,
        0.6,
        [],
        [
            f"{ranks_text(senders)} each waited in a blocking send"
            + (f" ({where})" if where else "")
            + " and none in a receive: a send returns only once its peer posts the matching "
            "receive, so ranks that all send first wait on each other for ever (a deadlock in "
            "the order of the exchange, the same on every rank)."
        ],
        fix=[
            "Order the exchange so that every send meets a posted receive: even ranks send "
            "first and odd ranks receive first, or post both at once with dist.isend/dist.irecv "
            "(or dist.batch_isend_irecv) and wait on the requests afterwards.",
        ],
    )
