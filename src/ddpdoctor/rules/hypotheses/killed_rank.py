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
    if all(job.ranks[r].waited_after_end for r in job.waiting):
        return None
    killed = {r for r in job.quiet if stopped_on_a_step(job, r)}
    if not killed or len(job.waiting) < len(job.quiet):
        return None
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
