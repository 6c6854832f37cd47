"""INF209: the ranks iterated over different numbers of batches, so the one with the fewest
left the loop while the others entered the next collective. Evidence: per-rank progress
counters that run to different totals ("step 5/8" vs "step 5/6"), or one bar per node console
whose totals differ (drawn by each node's main process, without a rank: the ranks are that
console's), the amounts of data the ranks announced (the few that said another amount than
most, fewer or more), or ranks other than the main process that waited in the evaluation after
the loop, or in a barrier, while the others still waited inside a training step."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import EVALUATION, TRAINING, JobEvidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import (
    MAIN_PROCESS,
    Assessment,
    exited_while_others_ran,
    ranks_text,
)

KIND = "uneven-inputs"

RULE = Rule(
    code="INF209",
    kind=KIND,
    title="Ranks iterated over different numbers of batches",
    signatures=(),
    explanation=Explanation(
        what="Ranks failed waiting for each other, and their own output shows they had "
        "different amounts of data: progress counters that run to different totals, amounts "
        "announced per rank, a rank that said its data ran out or that it dropped part of it, "
        "or a rank already in the evaluation's collective (or gloo aborting it in a collective "
        "of one number) while the others were still inside a training step.",
        why="Each rank got a different number of batches (uneven sharding, an IterableDataset "
        "without per-rank split, drop_last=False), so the rank with fewer batches left the loop "
        "while the others entered the next collective.",
        fix="Give every rank the same number of batches, or train inside `with model.join():`.",
        false_positives="Counters that are not per-rank batch counts; a small collective one "
        "rank calls alone inside the loop (a metric only it logs) gives the same gloo abort.",
    ),
    fix=(
        "Use DistributedSampler(dataset, drop_last=True) or equal shards per rank.",
        "Or wrap the training loop in `with ddp_model.join():`.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    if not (job.waiting or any(v.failed for v in job.ranks.values())):
        return _from_data_end_alone(job) or _from_sizes_alone(job)
    totals = {r: v.progress_total for r, v in job.ranks.items() if v.progress_total is not None}
    # an announcement is weaker than a counter: only a few odd ones out count; stronger than
    # the ranks' different collectives (INF203 at 0.6), which a rank that ran out of batches
    # and left the loop also shows
    found = _fewest(totals, 0.6, "iterate over different numbers of batches", "") or _from_sizes(
        job, 0.62
    )
    return (
        found
        or _from_exhausted_iterator(job)
        or _from_filtering(job)
        or _from_resume_points(job)
        or _from_sources(job)
        or _from_phases(job)
        or _from_scalar_abort(job)
        or _from_barrier(job)
        or _from_data_end(job)
        or _from_join_barrier(job)
        or _from_clean_exit(job)
        or _from_skipped_batches(job)
    )


EXHAUSTED = re.compile(r"^(?:StopIteration|RuntimeError: generator raised StopIteration)\s*$")
"""Python's words for an iterator with nothing left, uncaught: a plain StopIteration, or the
RuntimeError a generator turns it into (PEP 479) when one of its own `next()` calls ran dry."""


def _from_exhausted_iterator(job: JobEvidence) -> Assessment | None:
    """Some ranks, not all, died of an iterator with nothing left, uncaught (their
    next batch or shard was not there), after training had run, while the others went on and
    then lost them or timed out: those ranks had fewer batches. Where every rank raises it,
    the data has no batch at all for anyone (a data error, not uneven data). Above the plain
    exception (PY101 at 0.6): the exception says what ran out."""
    if not job.started_training:
        return None
    waiting = job.waiting  # a property that walks every rank: once, not once per failed rank
    if not waiting:
        return None
    dry = {
        r
        for r, v in job.ranks.items()
        if v.failed and r not in waiting and any(EXHAUSTED.match(e.text) for e in v.evidence)
    }
    if not dry or dry >= set(job.ranks) or len(dry) >= (job.world_size or len(job.ranks)):
        return None
    return Assessment(
        RULE,
        0.7,
        sorted(dry),
        [
            f"{ranks_text(dry)} died of an iterator with nothing left (StopIteration) after "
            f"training had run, while {ranks_text(set(job.waiting))} went on and then lost "
            f"{'it' if len(dry) == 1 else 'them'}: {ranks_text(dry)} ran out of batches (or "
            "shards) first."
        ],
        against=["an iterator of another kind (not the data's) that ran dry raises the same"],
        evidence=[e for r in sorted(dry) for e in job.ranks[r].evidence[:2]],
    )


def _from_skipped_batches(job: JobEvidence) -> Assessment | None:
    """Ranks that said they skipped a batch or a step ('prompt too long, skipping generation
    batch') and then fell silent with no error of their own, while the others, which skipped
    nothing, went on and then lost them or timed out waiting: a whole iteration skipped on one
    rank leaves it one batch short, in step with the others until its loop ends first. Just
    above a rank that only left (INF202 at 0.6), which its own words contradict: it said why
    its loop was shorter. (A rank that skipped only part of a step falls out of step at once:
    gloo aborts it in the next collective, which _from_scalar_abort leaves to the mismatch.)"""
    skipped = {
        r
        for r in job.skipped_ranks
        if r in job.ranks
        and not job.ranks[r].failed
        and not job.ranks[r].echoes - {"launcher", "stopped"}  # no wait or lost peer of its own
    }
    others = set(job.waiting) - skipped
    if not skipped or not others or job.completed_at or job.unranked_stop:
        return None
    if any(job.ranks[r].announced_stop or job.ranks[r].completed for r in skipped):
        return None
    return Assessment(
        RULE,
        0.65,  # less its point against: level with a rank that only left, ahead by precedence
        sorted(skipped),
        [
            f"{ranks_text(skipped)} said "
            + ("it" if len(skipped) == 1 else "they")
            + " skipped a batch and "
            f"then fell silent with no error, while {ranks_text(others)} went on and then lost "
            + ("it" if len(skipped) == 1 else "them")
            + " or timed out waiting: a skipped batch leaves a rank with fewer batches than "
            "the others, so its loop ended first."
        ],
        against=["a rank killed later without a word leaves the same trace"],
    )


def _from_clean_exit(job: JobEvidence) -> Assessment | None:
    """Ranks that printed nothing and that torchrun's failure summary leaves out had exited 0
    (it lists every worker that did not) while the others still ran and then lost them or
    timed out waiting, and no rank announced a stop: a loop that ended on some ranks only,
    most often because they had fewer batches. Just above a rank that only left (INF202 at
    0.6): an early stop or a return taken on those ranks alone leaves the same trace, but it
    is decided in code that usually says so."""
    left = exited_while_others_ran(job)
    if left is None:
        return None
    gone, lost = left
    if job.unranked_stop or any(v.announced_stop for v in job.ranks.values()):
        return None  # a stop decided on purpose (INF202 names who left)
    if job.completed_at:
        return None  # training's end was announced: they finished; the loop was not short
    if job.epochs_left is not None and job.epochs_left >= WHOLE_EPOCHS_AHEAD:
        return None  # they left a run with epochs to go: not a loop a few batches short
    if job.early_in_first_epoch:
        return None  # they had not got halfway through the first epoch: not a data end
    one = len(gone) == 1
    return Assessment(
        RULE,
        0.62,
        sorted(gone),
        [
            f"{ranks_text(gone)} printed nothing and the launcher's failure summary does not "
            f"list {'it' if one else 'them'} (torchrun lists every worker that did not exit 0): "
            f"{'its' if one else 'their'} loop ended and {'it' if one else 'they'} exited 0 "
            f"while {ranks_text(set(job.waiting) | lost)} still ran and then lost "
            f"{'it' if one else 'them'} or timed out waiting. No rank announced a stop: "
            f"{'it' if one else 'they'} most likely had fewer batches."
        ],
        against=[
            "an early stop or a return taken on that rank alone leaves the same trace: its "
            "own output would say how much data it had"
        ],
    )


WHOLE_EPOCHS_AHEAD = 1
"""Whole epochs the ranks still running had ahead of them, from which a rank that exited 0
before them did not merely have fewer batches: a rank short of batches stays in step with the
others through every epoch (the collectives of each step pair up, shifted by what it lacks)
and leaves at the end of the last one, while they finish theirs; one that exits with epochs
to go left the run itself (a stop it decided alone: INF202)."""


def _from_filtering(job: JobEvidence) -> Assessment | None:
    """Ranks that exited 0 while the others still ran (the launcher's failure summary leaves
    them out) and said they dropped part of their data ('dropped 48 documents longer than
    seq_length'): they had fewer batches and finished their loop first. A line that no rank
    can be given points at the ranks that left when they are the only ones that did. Above a
    rank that only left (INF202 at 0.65): its own words say why."""
    if not job.waiting or not (job.filtered_ranks or job.filtered_unranked):
        return None
    gone = set(job.unlisted_exits)
    ranked = job.filtered_ranks
    # a rank that said so and then fell silent without an error, while others waited (not
    # when their transport shows every peer alive: a rank still running had not left)
    quiet = {
        r
        for r in (set() if job.peers_proven_alive else job.quiet & ranked)
        if not job.ranks[r].failed
        and not job.ranks[r].terminated
        and r not in job.failing_exits
        and not job.ranks[r].busy_phase
    }
    culprits = (gone | quiet) & ranked if ranked else gone
    if not culprits:
        return None
    one = len(culprits) == 1
    it = "it" if one else "they"
    said = (
        f"said {it} had dropped part of {'its' if one else 'their'} data"
        if ranked
        else "a line of no rank said part of the data was dropped"
    )
    return Assessment(
        RULE,
        0.7,
        sorted(culprits),
        [
            f"{ranks_text(culprits)} ended without an error while the others still ran, and "
            f"{said}: with fewer batches {it} finished the loop first, and the others waited "
            f"in a collective of a batch {it} did not have."
        ],
        against=[] if ranked else ["the line that says data was dropped names no rank"],
    )


def _from_join_barrier(job: JobEvidence) -> Assessment | None:
    """The program's own barrier before every batch (WeNet's join) named the ranks that did
    not come and called it an uneven workload (a wait of that kind), and those ranks printed
    no error and announced no long task of their own: their data most likely ran out first.
    Weaker than a busy rank's own evidence (INF201 at 0.6-0.7), stronger than a rank that is
    only silent (0.4-0.45)."""
    if KIND not in job.unranked_wait_kinds and not any(
        KIND in v.wait_kinds for v in job.ranks.values()
    ):
        return None
    absent = {
        r
        for r, v in job.ranks.items()
        if v.named_absent and not v.failed and not v.waiting and not v.busy_phase
    }
    if not absent:
        return None
    return Assessment(
        RULE,
        0.5,
        sorted(absent),
        [
            f"the program's own barrier before every batch named {ranks_text(absent)} as not "
            "coming and called it an uneven workload; "
            f"{ranks_text(absent)} printed no error and announced no long task of its own: "
            "its data most likely ran out first."
        ],
        against=["a rank that was only slow or stuck is named the same way"],
    )


def _from_data_end_alone(job: JobEvidence) -> Assessment | None:
    """No error and no end: the log stops after some ranks of the world said their data ran
    out (and went on, to a validation or the next epoch) while the others never did. Those
    left the loop first; with DistributedSampler every rank's data ends at the same step, so
    ranks whose data ends alone had fewer batches, and wait for the others for ever."""
    if job.ended or job.ended_without_a_line or any(v.completed for v in job.ranks.values()):
        return None
    world = set(range(job.world_size)) if job.world_size else set(job.ranks)
    ended = {r for r, v in job.ranks.items() if v.data_ended and not v.failed}
    if not ended or not world - ended or not ended <= world:
        return None
    return Assessment(
        RULE,
        0.45,
        sorted(ended),
        [
            f"{ranks_text(ended)} said its data ran out "
            f'("{job.ranks[min(ended)].data_ended}"), and {ranks_text(world - ended)} never '
            "did before the log stops: the ranks had different numbers of batches, and those "
            "that ran out first wait for the others."
        ],
        against=[
            "the log may stop just before the others' data ran out too (a copy taken at the "
            "epoch's end)"
        ],
        status=Status.HUNG,  # nothing failed: the ranks wait for each other
    )


def _from_sizes_alone(job: JobEvidence) -> Assessment | None:
    """No error and no end: the log stops after the ranks said how much data they have, and a
    few of them said another amount. Nothing failed, so the ranks wait for each other: the
    ones with fewer batches left the loop, the others wait in a collective of a batch they
    alone have."""
    if job.ended or job.ended_without_a_line or any(v.completed for v in job.ranks.values()):
        return None  # the loop ran to its end: every rank had what its steps needed
    found = _from_sizes(job, 0.45)
    if found is None:
        return None
    found.against.append(
        "nothing failed and nothing timed out in what was read: the log may have been copied "
        "while the job still ran"
    )
    found.status = Status.HUNG
    return found


def _from_sizes(job: JobEvidence, score: float) -> Assessment | None:
    """What the ranks said they have ('7 batches'), unit by unit: the few ranks that said
    another amount than most, fewer or more, are the odd ones out."""
    for unit in sorted(job.data_sizes):
        found = _odd_ones_out(job.data_sizes[unit], score, f"{unit}: ")
        if found is not None:
            return found
    return None


def _odd_ones_out(counts: dict[int, int], score: float, unit: str) -> Assessment | None:
    """The ranks whose announced amount differs from that of most ranks (a group smaller than
    half): with fewer batches they leave the loop first; with more they go on alone into a
    collective that the others, done with their epoch, never join."""
    groups: dict[int, set[int]] = {}
    for rank, n in counts.items():
        groups.setdefault(n, set()).add(rank)
    if len(groups) < 2:
        return None
    fewest = min(groups)
    if len(groups[fewest]) * 2 <= len(counts):
        n = fewest  # the ranks with the least, unless they are most of the world
    else:
        n = min(groups, key=lambda k: (len(groups[k]), k))  # a few with more than most
        if len(groups[n]) * 2 >= len(counts):
            return None
    odd = groups[n]
    most = max((k for k in groups if k != n), key=lambda k: (len(groups[k]), -k))
    detail = ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))
    consequence = (
        "ran out of data first and left the loop while the others waited"
        if n < most
        else "had more to do than the others: after their last batch the others left the "
        "loop, and it went on alone into a collective nobody else joined"
    )
    return Assessment(
        RULE,
        score,
        sorted(odd),
        [
            f"the ranks announced different amounts of data ({unit}{detail}): "
            f"{ranks_text(odd)} {consequence}."
        ],
    )


def _from_resume_points(job: JobEvidence) -> Assessment | None:
    """Ranks that started or resumed training at different points ('resuming ... at step 20'
    on two, 'starting from step 0' on the third: its checkpoint was not there) have different
    numbers of steps left: the others finish and leave it waiting. The odd ones out are named
    (of two equal groups, those that started earliest: they lost their checkpoint)."""
    for unit, points in sorted(job.resume_points.items()):
        if len(set(points.values())) < 2 or len(points) < 2:
            continue
        groups: dict[int, set[int]] = {}
        for rank, n in points.items():
            groups.setdefault(n, set()).add(rank)
        odd = min(groups.items(), key=lambda item: (len(item[1]), item[0]))[1]
        detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(points.items()))
        return Assessment(
            RULE,
            0.8,
            sorted(odd),
            [
                f"the ranks started training at different {unit}s ({detail}): "
                f"{ranks_text(odd)} had a different number of steps left, so one group "
                "finished and left while the other still waited for it."
            ],
            next_steps=[
                "Check that every rank resumes from the same checkpoint: one stored on a "
                "node-local disk or a volume of its own is not there for the others."
            ],
        )
    return None


def _from_data_end(job: JobEvidence) -> Assessment | None:
    """Ranks that left the loop while the others went on (an announced end, stop or
    completion of their own), whose words after their last step say their data ran out: they
    had fewer batches. Ranks that printed nothing and exited 0 while the others still ran (the
    launcher's failure summary leaves them out) left with them. Stronger than a rank leaving
    on its own (INF202 at 0.75): it says why it left."""
    said = {
        r
        for r, v in job.ranks.items()
        if (v.announced_stop or v.completed) and v.data_ended and not v.failed and not v.waiting
    }
    # or that said so and then timed out in a collective of their own after the loop (a final
    # barrier, an evaluation) that the others, still in a training step, never reached
    waited = {
        r
        for r, v in job.ranks.items()
        if v.data_ended and not v.failed and "waiting" in v.echoes and r not in said
    }
    said |= waited
    others = {r for r, v in job.ranks.items() if v.present} - said
    if (
        not said
        or not others
        or not any(job.ranks[r].waiting or "lost-peer" in job.ranks[r].echoes for r in others)
    ):
        return None
    silent = {r for r in job.unlisted_exits if r in job.ranks and not job.ranks[r].present}
    left = said | silent
    also = (
        f"; {ranks_text(silent)} printed nothing and exited 0 while they still ran: "
        f"{'it' if len(silent) == 1 else 'they'} left the loop as well"
        if silent
        else ""
    )
    then = (
        f"; {ranks_text(waited)} then timed out in a collective that the others, still in "
        "the loop, never reached"
        if waited
        else ""
    )
    return Assessment(
        RULE,
        0.8 if not waited else 0.7,
        sorted(left),
        [
            f"{ranks_text(said)} said its data ran out "
            f'("{job.ranks[min(said)].data_ended}") and left the loop while '
            f"{ranks_text(others)} went on to the next step and failed waiting for it"
            f"{then}{also}."
        ],
        evidence=[e for r in sorted(said) for e in job.ranks[r].evidence[:1]],
    )


def _from_sources(job: JobEvidence) -> Assessment | None:
    """One bar per node console (drawn by its local main process, without a rank): the
    nodes whose bar runs to a smaller total had fewer batches; their ranks, known from the
    launcher's summary in that console or their own lines there, left the loop first."""
    if len(set(job.source_counters.values())) < 2:
        return None
    totals: dict[int, int] = {}
    for rank, view in job.ranks.items():
        files = view.sources | ({view.exit_source} if view.exit_source else set())
        counted = {job.source_counters[f][1] for f in files if f in job.source_counters}
        if len(counted) == 1:
            totals[rank] = counted.pop()
    if len(totals) < len(job.ranks):
        return None  # a rank no bar speaks for
    return _fewest(totals, 0.6, "iterate over different numbers of batches", "")


def _from_phases(job: JobEvidence) -> Assessment | None:
    """Some ranks timed out in a collective of the evaluation that follows the training loop
    while the others timed out inside a training step (its backward, DDP's forward): those
    left the loop first, as ranks with fewer batches do. A rank-dependent evaluation singles
    out the main process instead, so ranks including rank 0 are left to INF203."""
    phases: dict[int, str] = {}
    for rank, view in job.ranks.items():
        known = [s.phase for s in view.wait_sites if s.phase]
        if known:
            phases[rank] = known[-1]
    ahead = {r for r, p in phases.items() if p == EVALUATION}
    behind = {r for r, p in phases.items() if p == TRAINING}
    if not ahead or not behind or MAIN_PROCESS in ahead or len(ahead) > len(behind):
        return None
    return Assessment(
        RULE,
        0.65,
        sorted(ahead),
        [
            f"{ranks_text(ahead)} timed out in the evaluation's collective while "
            f"{ranks_text(behind)} still waited inside a training step: "
            f"{ranks_text(ahead)} had left the training loop first, as a rank with fewer "
            "batches does."
        ],
        against=[
            "an evaluation called on some ranks only (a rank-dependent branch) gives the same "
            "picture"
        ],
    )


SCALAR_BYTES = 16
"""A collective this small carries a metric or a flag (one or two numbers), not gradients."""


def _from_scalar_abort(job: JobEvidence) -> Assessment | None:
    """gloo aborted a rank other than the main process in a collective of one or two numbers
    (a metric, a flag) when a peer sent it a larger tensor, while the other ranks that left a
    traceback were inside a training step, in DDP's own collective (its gradient all-reduce in
    backward, its forward), none in a collective the program calls by name:
    that rank had left the training loop for what follows it, as a rank with fewer batches
    does, and did not say it skipped a step. Work on some ranks only singles out the main
    process (a metric it alone logs), which is left to the collective mismatch; so is a rank
    that said it skipped a batch, and so are aborted ranks whose own Flight Recorder dumps were
    given (they show the calls themselves; a rank that died leaves none). Where the launcher
    ended every other rank before it printed where it waited, the abort alone counts once
    training had run, with the other reading said. Tried after counts, announcements and
    phases of the ranks."""
    aborts = job.size_aborts
    small = {
        r
        for r, (sent, expected) in aborts.items()
        if expected <= SCALAR_BYTES < sent and r != MAIN_PROCESS
    }
    if job.flight is not None and small <= set(job.flight.ranks_with_dump):
        return None  # their recorders show the calls themselves (sizes, frames)
    if (
        not small
        or small & job.skipped_ranks
        or job.skipped_unranked
        or len(small) * 2 > max(len(job.ranks), 2)
    ):
        return None
    sent, expected = aborts[min(small)]
    against = [
        "a small collective called on that rank alone inside the loop (a metric it logs by "
        "itself) gives the same abort"
    ]
    if any(v.wait_sites for r, v in job.ranks.items() if r not in small):
        # where the others waited: DDP's own collective inside a training step (no collective
        # of the program's named: a program's own all_reduce of another size is a mismatch)
        last = {
            r: next((s for s in reversed(v.wait_sites) if s.phase), None)
            for r, v in job.ranks.items()
            if r not in small
        }
        # (or the same collective of the program's own on every other rank, inside the
        # step: all of them agree on it, as MoE's all_to_all each step, and only the aborted
        # rank was elsewhere)
        ops = {w.op for w in last.values() if w}
        shared = len(ops) == 1 and None not in ops and len(last) >= 2 and all(last.values())
        training = {
            r for r, w in last.items() if w and w.phase == TRAINING and (w.op is None or shared)
        }
        if not training or any(
            w and (w.phase == EVALUATION or (w.op and not shared)) for w in last.values()
        ):
            return None
        others = f"while {ranks_text(training)} still waited inside a training step"
    elif job.started_training:
        # the launcher ended the others before they printed where they waited: the abort
        # alone, on a rank that is not the main process (whose work alone is the usual
        # rank-dependent collective), once training had run (a rank runs out of data after
        # its last batch, not before its first)
        others = "and no other rank printed where it waited"
        against.append("no other rank's traceback shows where it was")
    else:
        return None
    return Assessment(
        RULE,
        0.65,  # each point against takes off its share
        sorted(small),
        [
            f"gloo aborted {ranks_text(small)} in a collective of {expected} bytes (a metric "
            f"or a flag) when a peer sent {sent}, {others}: {ranks_text(small)} had most "
            "likely left the training loop first, as a rank with fewer batches does."
        ],
        against=against,
        evidence=[e for r in sorted(small) for e in job.ranks[r].evidence[:1]],
        next_steps=[
            f"If every rank had as many batches: find the collective of {expected} bytes that "
            f"{ranks_text(small)} called alone (a metric or a flag under a condition only it "
            "met) and call it on every rank."
        ],
    )


def _from_barrier(job: JobEvidence) -> Assessment | None:
    """Ranks other than the main process waited in a barrier while every other rank that
    waited was inside a training step (DDP's own collective in backward or forward, no
    collective of the program's named): a program's barriers stand where an epoch, an
    evaluation or a save ends, so those ranks had reached the end of their data first. Work
    for one rank only (a save, an evaluation behind a barrier) singles out the main process
    instead, which is left to INF203."""
    last = {r: v.wait_sites[-1] for r, v in job.ranks.items() if v.wait_sites}
    ahead = {r for r, w in last.items() if w.op and w.op.lower() == "barrier"}
    behind = {r for r, w in last.items() if w.op is None and w.phase == TRAINING}
    if (
        not ahead
        or not behind
        or MAIN_PROCESS in ahead
        or len(ahead) > len(behind)
        or ahead | behind != set(last)
    ):
        return None
    return Assessment(
        RULE,
        0.65,
        sorted(ahead),
        [
            f"{ranks_text(ahead)} waited in a barrier while {ranks_text(behind)} still waited "
            f"inside a training step: {ranks_text(ahead)} had come to the end of its loop "
            "first, as a rank with fewer batches does."
        ],
        against=["a barrier called on that rank only (a rank-dependent branch) looks the same"],
    )


def _fewest(counts: dict[int, int], score: float, what: str, unit: str) -> Assessment | None:
    """The ranks with the fewest batches (or samples): they run out first and leave the loop
    while the others wait."""
    if len(set(counts.values())) < 2:
        return None
    fewest = min(counts.values())
    short = {r for r, n in counts.items() if n == fewest}
    detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
    return Assessment(
        RULE,
        score,
        sorted(short),
        [
            f"the ranks {what} ({unit}{detail}): {ranks_text(short)} ran out of data first and "
            "left the loop while the others waited."
        ],
    )
