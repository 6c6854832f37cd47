"""INF202: a rank left the job without an error while the others kept going and then failed
waiting for it. Evidence: an early stop announced by some ranks only; ranks that simply stopped
printing (exit 0, no error) while the others timed out or lost their peer; peers lost on the
loopback address with no error anywhere (a process on the same host went away)."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import (
    MAIN_PROCESS,
    Assessment,
    exited_while_others_ran,
    ranks_text,
    stall_evidence,
)
from ddpdoctor.rules.hypotheses.killed_rank import killed_mid_training, stopped_on_a_step

RULE = Rule(
    code="INF202",
    kind="uncoordinated-exit",
    title="A rank left the job without an error while the others kept going",
    signatures=(),
    explanation=Explanation(
        what="A rank stopped printing with no error (often exiting 0) while its peers then "
        "failed with closed connections or timeouts.",
        why="An early stop, a `sys.exit()`, a `break` or a return taken on one rank only; or "
        "the process was killed without a trace in its own log.",
        fix="Decide stops on one rank and broadcast the decision; every rank must leave the "
        "training loop at the same step and call destroy_process_group().",
        false_positives="A rank killed from outside (OOM killer, scheduler) leaves the same "
        "trace; check its exit code and dmesg.",
    ),
    fix=(
        "Broadcast stop decisions: flag = torch.tensor([int(stop)]); dist.broadcast(flag, 0); "
        "if flag.item(): break  (on every rank).",
        "Never call sys.exit()/return on one rank inside the training loop.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    stalled = _from_stall(job)
    if stalled is not None:
        return stalled
    waiting, quiet = job.waiting, job.quiet
    if not (waiting or job.echoes & {"waiting", "lost-peer"}):
        return None
    unlisted = _from_summary(job)
    if unlisted is not None:
        return unlisted
    at_exit = _aborted_at_exit(job)
    if at_exit is not None:
        return at_exit
    present = {r for r, v in job.ranks.items() if v.present}
    stoppers = {r for r, v in job.ranks.items() if v.announced_stop}
    if stoppers and stoppers < present:
        return Assessment(
            RULE,
            0.75,
            sorted(stoppers),
            [
                f"{ranks_text(stoppers)} stopped early on "
                + ("its own" if len(stoppers) == 1 else "their own")
                + f"; {ranks_text(present - stoppers)} kept going and failed waiting for "
                + ("it." if len(stoppers) == 1 else "them.")
            ],
            evidence=[e for r in sorted(stoppers) for e in job.ranks[r].evidence[:1]],
        )
    barrier_stop = _stopped_into_a_barrier(job, stoppers)
    if barrier_stop is not None:
        return barrier_stop
    # a rank that announced the end of training finished; it did not leave early. Nor did
    # one that left after training announced its end, while the others went on to collectives
    # of their own (collective_mismatch: a collective only some ranks called)
    # a stop sent to the whole job (the launcher's death signal, Ctrl-C to the process group)
    # reaches some ranks first: a rank whose only words are that stop did not leave on its own
    whole_job_stopped = "stopped" in job.unranked_echoes
    killed = killed_mid_training(job)
    left = {
        r
        for r in quiet
        if not job.ranks[r].terminated
        and r not in job.failing_exits  # its exit code says it failed: it did not just leave
        and not job.ranks[r].completed
        and not (whole_job_stopped and "stopped" in job.ranks[r].echoes)
        # a stop from outside no rank's line names (the shell's 'Terminated' of the process it
        # started) reached a rank that said nothing of leaving: stopped, not left
        and not (whole_job_stopped and not job.timed_out and not job.ranks[r].announced_stop)
        # its own words say a stop from outside reached it (its SIGTERM handler): it did not
        # leave on its own
        and not ("stopped" in job.ranks[r].echoes and not job.ranks[r].terminated)
        # its last words announce a long phase of its own (saving, evaluating): busy, not gone
        and not job.ranks[r].busy_phase
        # it stopped mid-step without a word: killed from outside (killed_rank), not left;
        # or it fell silent while the others trained and no launcher said how it ended
        and not stopped_on_a_step(job, r)
        and r not in killed
        # it still printed after the others gave up on it: it had not left
        and not job.ranks[r].spoke_after_waits
    }
    if waiting and job.waited_after_end(waiting):
        left = set()
    if job.peers_proven_alive:
        left = set()  # they timed out on a transport that sees a peer leave: nobody left
    if not left and not any(v.failed for v in job.ranks.values()):
        loopback = _from_loopback(job)
        if loopback is not None:
            return loopback
    first = left & set(job.trained_on_after) if MAIN_PROCESS in waiting else set()
    went_on = set().union(*(job.trained_on_after[r] for r in first)) - first
    if first and went_on and len(waiting) < len(quiet) and not job.timed_out:
        # the main process lost a peer; of the ranks that fell quiet without an error, the
        # others trained on after these stopped talking, and a closed connection is a process
        # that ended: these left first
        return Assessment(
            RULE,
            0.55,
            sorted(first),
            [
                f"{ranks_text(first)} fell silent without any error while "
                f"{ranks_text(went_on)} went on training after "
                + ("its" if len(first) == 1 else "their")
                + f" last line, and {ranks_text(waiting)} then lost the connection to a peer: "
                "a closed connection is a process that ended, so "
                + ("it left (or was killed)" if len(first) == 1 else "they left (or were killed)")
                + " first. This is not a network fault."
            ],
            evidence=[e for r in sorted(first) for e in job.ranks[r].evidence[:1]],
        )
    if left and waiting and len(waiting) >= len(quiet):
        return Assessment(
            RULE,
            0.6,
            sorted(left),
            [
                f"{ranks_text(left)} stopped printing without any error while "
                f"{ranks_text(waiting)} reported closed connections or timeouts: they left (or "
                "were killed) first. This is not a network fault."
            ],
        )
    return None


def _aborted_at_exit(job: JobEvidence) -> Assessment | None:
    """A rank whose only words are the abort of its own exit ('terminate called without an
    active exception': its threads destroyed as the interpreter ended) had left its Python
    code with no error, while the others still waited for it or lost it."""
    left = {r for r, v in job.ranks.items() if v.left_at_exit}
    others = job.waiting - left
    if not left or not others:
        return None
    if job.waited_after_end(others):
        return None  # they left after training's end; the others' collective was their own
    one = len(left) == 1
    return Assessment(
        RULE,
        0.75,
        sorted(left),
        [
            f"{ranks_text(left)} printed no error, only the abort C++ prints while a process "
            "destroys its threads at exit ('terminate called without an active exception'): "
            + ("it had" if one else "they had")
            + f" left the Python code on {'its' if one else 'their'} own (a sys.exit, a return "
            f"or the end of a loop on {'that rank' if one else 'those ranks'} alone) while "
            f"{ranks_text(others)} still waited for {'it' if one else 'them'} or lost "
            + ("it" if one else "them")
            + ". The abort is how it exited, not a crash in its work."
        ],
        evidence=[e for r in sorted(left) for e in job.ranks[r].evidence[:1]],
    )


def _stopped_into_a_barrier(job: JobEvidence, stoppers: set[int]) -> Assessment | None:
    """A line of no rank announced a stop (an early stop, a target reached), and of the ranks
    that timed out some waited in a barrier while the others waited in another collective:
    the ranks at the barrier had left the loop on that stop (a decision each rank took alone,
    on its own numbers) and waited for the others there, who were still in a step."""
    if not job.unranked_stop or stoppers:
        return None
    waiting = job.waiting
    at_barrier = {
        r
        for r in waiting
        if any((w.op or "").lower() == "barrier" for w in job.ranks[r].wait_sites)
    }
    elsewhere = {r for r in waiting - at_barrier if job.ranks[r].wait_sites}
    if not at_barrier or not elsewhere:
        return None
    one = len(at_barrier) == 1
    return Assessment(
        RULE,
        0.45,
        sorted(at_barrier),
        [
            f"a line of no rank announced a stop, and {ranks_text(at_barrier)} then waited in "
            f"a barrier while {ranks_text(elsewhere)} still waited in another collective: "
            f"{'it' if one else 'they'} had left the training loop on that stop alone (a "
            "stop each rank decided on its own numbers), the others had not."
        ],
        evidence=[e for r in sorted(at_barrier) for e in job.ranks[r].evidence[:1]],
    )


def _from_loopback(job: JobEvidence) -> Assessment | None:
    """Ranks lost their peers on the loopback address (same host) and no rank printed an
    error of its own: a loopback connection does not fail for network reasons, so the peer
    process went away first (exited on its own, or was killed or crashed without its output
    here). Which rank it was is not known: the ranks of the world that lost no peer and were
    not seen failing, where the world is known, else none."""
    if not job.lost_peers_on_loopback or job.timed_out or "stopped" in job.echoes:
        return None  # a timeout waited on a live peer; a stop from outside ended them all
    lost = {r for r, v in job.ranks.items() if "lost-peer" in v.echoes}
    world = set(range(job.world_size)) if job.world_size else set(job.ranks)
    others = {r for r in world - lost if not job.ranks.get(r) or not job.ranks[r].waiting}
    culprits = others if others and len(others) < len(world) else set()
    return Assessment(
        RULE,
        0.35,
        sorted(culprits),
        [
            f"{ranks_text(lost) if lost else 'ranks'} lost the connection to a peer on the "
            "same host (a loopback address), and no rank printed an error of its own: the "
            "loopback does not fail for network reasons, so the peer process ended first "
            "(it left on its own, or was killed or crashed without a trace here). This is "
            "not a network fault."
        ],
        against=["how the peer ended is not in these logs (an OOM kill leaves the same trace)"],
    )


def _from_summary(job: JobEvidence) -> Assessment | None:
    """Ranks that printed nothing and that torchrun's failure summary leaves out had exited 0
    (it lists every worker that did not, the ones it stopped too); the others then lost them
    or timed out waiting: they left first."""
    left = exited_while_others_ran(job)
    if left is None:
        return None
    gone, lost = left
    ahead = _far_from_the_end(job)
    return Assessment(
        RULE,
        0.6,
        sorted(gone),
        [
            f"{ranks_text(gone)} printed nothing and the launcher's failure summary does not "
            f"list {'it' if len(gone) == 1 else 'them'} (torchrun lists every worker that did "
            f"not exit 0): {'it' if len(gone) == 1 else 'they'} had exited 0 while "
            f"{ranks_text(set(job.waiting) | lost)} still ran, and these then lost "
            f"{'it' if len(gone) == 1 else 'them'} or timed out waiting. This is not a network "
            "fault."
        ]
        + ([ahead] if ahead else []),
        against=[]
        if ahead
        else [
            "a rank with fewer batches leaves its loop the same way (uneven inputs): its "
            "own output would say how much data it had"
        ],
    )


def _far_from_the_end(job: JobEvidence) -> str | None:
    """Why the ranks that left were not merely short of batches, where their peers' progress
    says it: those were far from where a rank with less data would have left them."""
    if job.epochs_left:
        return (
            f"the ranks still running had {job.epochs_left} whole epoch(s) to go: a rank with "
            "fewer batches stays in step with them and leaves at the end of the last one."
        )
    if job.early_in_first_epoch:
        return (
            "the ranks still running had not got halfway through the first epoch (the "
            "'epoch' of their log dicts): a rank with fewer batches leaves where its data "
            "ends, which would have been less than half of theirs."
        )
    return None


def _from_stall(job: JobEvidence) -> Assessment | None:
    """`ddpdoctor run` found ranks gone while the others waited in a collective."""
    if job.stall is None:
        return None
    acts = job.stall.activities
    gone = {r for r, a in acts.items() if a.category == "exited"}
    inside = {r for r, a in acts.items() if a.in_collective}
    if not gone or not inside:
        return None
    return Assessment(
        RULE,
        0.8,
        sorted(gone),
        [
            f"the job stalled under `ddpdoctor run`: {ranks_text(inside)} waited in a "
            f"collective that {ranks_text(gone)} never reached: they had already exited."
        ],
        evidence=stall_evidence(job.stall),
        status=Status.HUNG,
    )
