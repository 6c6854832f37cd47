"""INF231: a rank's output ends on a training step, with no error, no word of leaving and no
exit code, while the others failed waiting for it. A process that leaves on its own goes
through code after its loop (a message, a save, an exit code its launcher reports); one killed
from outside (the kernel's OOM killer, a pod's memory limit, a scheduler's SIGKILL) stops
mid-step and says nothing, and when its launcher dies with it (a Kubernetes pod, a node) no
exit code is printed either."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF231",
    kind="host-oom",
    title="A rank stopped in the middle of a training step without a word: killed from outside",
    signatures=(),
    category=Category.RESOURCE,
    explanation=Explanation(
        what="A rank's output ends on a training-progress line: no error, no word of leaving, "
        "no exit code. The other ranks then timed out or lost their connection to it.",
        why="SIGKILL ends a process at once, with nothing printed: the kernel's OOM killer "
        "(host memory), a container's memory limit (Kubernetes OOMKilled), a scheduler's "
        "kill. When the launcher dies with it (the whole pod or node), no exit code is "
        "printed either.",
        fix="Look for the kill where it is recorded: `dmesg -T | grep -i 'killed process'` on "
        "its node, `kubectl describe pod` (Last State: OOMKilled), `sacct -j JOB` "
        "(OUT_OF_MEMORY); then lower its host memory (fewer DataLoader workers, smaller "
        "prefetch, no full dataset per rank) or raise the limit.",
        false_positives="A rank that left on its own right after a step without a word "
        "(a sys.exit in the loop): its launcher, when its output is there, reports exit 0.",
    ),
    fix=(
        "Check the node's kernel log (dmesg -T | grep -i 'out of memory') or the pod's state "
        "(kubectl describe pod: OOMKilled) for the named ranks.",
        "Reduce host memory per rank (DataLoader num_workers, prefetch_factor, datasets held "
        "in memory per process) or raise the memory limit.",
    ),
)


LEAVING = re.compile(
    r"(?i)\b(?:stop|stopping|stopped|exit|exiting|leav(?:e|ing)|done|finish(?:ed|ing)?|break"
    r"|quit(?:ting)?|abort(?:ing)?|end(?:ing)?|halt(?:ing)?|skip(?:s|ping|ped)?)\b"
)
"""Words of a rank announcing its own way out ("loss is nan at iter 8, stopping") or its own
change of course ("step 6: prompt too long, skipping generation batch"): a step line that says
them is a decision the rank took, not a step cut short."""


def assess(job: JobEvidence) -> Assessment | None:
    if not job.waiting or job.peers_proven_alive:
        return None
    if job.waited_after_end(job.waiting):
        return None
    killed = {r for r in job.quiet if stopped_on_a_step(job, r)}
    if not killed or len(job.waiting) < len(job.quiet):
        return _vanished_mid_training(job)
    return Assessment(
        RULE,
        0.5,
        sorted(killed),
        [
            f"{ranks_text(killed)} stopped printing in the middle of training (the last line "
            "is a training step) with no error, no word of leaving and no exit code, while "
            f"{ranks_text(job.waiting)} failed waiting: killed from outside, as the OOM "
            "killer or a memory limit kills, most likely. This is not a network fault."
        ],
        evidence=[w for w in job.last_words if w.rank in killed][:4],
    )


def stopped_on_a_step(job: JobEvidence, rank: int) -> bool:
    """The rank's output ends on a step and nothing says it ended otherwise: no exit code,
    no stop, no end of training, no long phase of its own announced. (Not a rank that the
    launcher's failure summary leaves out: it exited 0, it was not killed.)"""
    view = job.ranks[rank]
    return (
        view.ended_on_step
        and view.exit_code is None
        and rank not in job.unlisted_exits | job.unlisted_speakers
        and not view.terminated
        and not view.completed
        and not view.announced_stop
        and not view.busy_phase
        and "stopped" not in view.echoes
        and not LEAVING.search(view.last_text)
    )


def _nothing_said_how_ranks_ended(job: JobEvidence) -> bool:
    """The job-wide half of vanished_mid_training, read once for all ranks (each of the
    properties it reads walks every rank): writers were mid-step, the others lost a peer (a
    closed connection is a process that ended) and none timed out waiting for a live one, no
    launcher reported any exit, nobody announced a stop."""
    if not job.others_mid_step:
        return False
    echoes = job.echoes
    return (
        "lost-peer" in echoes
        and "waiting" not in echoes  # (job.timed_out)
        and "launcher" not in echoes
        and "stopped" not in job.unranked_echoes
        and job.job_exit_code is None
        and not job.unranked_stop
        and not any(v.exit_code is not None or v.announced_stop for v in job.ranks.values())
    )


def vanished_mid_training(job: JobEvidence, rank: int) -> bool:
    """A rank that printed no steps of its own (only the main process logs them) fell silent
    while the writers that did were in the middle of training, the others lost their
    connection to it (none timed out waiting for a live one), and no launcher reported any
    exit: nothing of a decision to leave (no stop, no end, no word of leaving in its own last
    line), nothing that would have said how it ended. A process that leaves on its own goes
    through code after its loop, and a launcher that saw it would say exit 0; one killed from
    outside stops wherever the training was, and when the launcher raised on the first error
    it saw (mp.spawn, Lightning, Fabric) or died with it, no exit code is printed. The job-wide
    half is _nothing_said_how_ranks_ended, read by killed_mid_training once for every rank."""
    view = job.ranks[rank]
    mid = job.others_mid_step
    return (
        (len(mid) > 1 or rank not in mid)  # a writer other than this rank ended mid-step
        and not view.ended_on_step  # (stopped_on_a_step: its own step)
        and rank not in job.unlisted_exits
        and rank not in job.unlisted_speakers
        and not view.terminated
        and not view.completed
        and not view.busy_phase
        and "stopped" not in view.echoes
        and not LEAVING.search(view.last_text)
        and not view.spoke_after_waits
    )


def killed_mid_training(job: JobEvidence) -> set[int]:
    """Every quiet rank, where each one vanished while the others trained
    (vanished_mid_training) and at least as many ranks waited: those were killed."""
    if not job.waiting or job.peers_proven_alive or not _nothing_said_how_ranks_ended(job):
        return set()
    quiet = set(job.quiet)
    gone = {r for r in quiet if vanished_mid_training(job, r)}
    if not gone or gone != quiet or len(job.waiting) < len(gone):
        return set()
    return gone


def _vanished_mid_training(job: JobEvidence) -> Assessment | None:
    """The quiet ranks that vanished while the others trained (killed_mid_training): killed,
    as the OOM killer kills, most likely; weaker than a rank's own last line on a step (0.5),
    since the others' steps only say where the training was."""
    gone = killed_mid_training(job)
    if not gone:
        return None
    return Assessment(
        RULE,
        0.45,
        sorted(gone),
        [
            f"{ranks_text(gone)} fell silent without an error, a word of leaving or an exit "
            f"code while {ranks_text(job.waiting)} trained on (the log's last lines before the "
            "failure are training steps) and then failed waiting: a rank that leaves on its own "
            "goes through code after its loop, one killed from outside (the OOM killer, a "
            "memory limit) stops wherever training was. This is not a network fault."
        ],
        against=[
            "the rank printed no steps of its own: only the others' say where training was",
            "no exit code was printed: a crash (SIGSEGV) leaves the same trace",
        ],
        evidence=[w for w in job.last_words if w.rank in gone][:4],
    )
