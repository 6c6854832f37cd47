"""INF204: ranks timed out, and the ranks they waited for left no lines at all. Missing
evidence is evidence: the root cause is most likely in the logs that were not given."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.collectives import SAME_COLLECTIVES
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF204",
    kind="nccl-timeout",
    title="Ranks timed out and the ranks they waited for left no logs",
    signatures=(),
    explanation=Explanation(
        what="Collective timeouts or closed connections, and no log at all from some ranks.",
        why="The root cause is most likely in the missing logs: a rank or node that died first.",
        fix="Collect the logs of the missing ranks/nodes (or run under `ddpdoctor run`); where "
        "they say nothing, find where each rank was when the others timed out.",
        false_positives="The missing ranks may simply not have been included in the paste.",
    ),
    fix=(
        "Collect the logs of the missing ranks or nodes and diagnose all of them together.",
        # when those logs hold nothing (a rank stuck without a word), where each rank was is
        # the next evidence: its stack, and the collective it last entered
        "If they show no error: while it hangs, take every rank's stack (`py-spy dump --pid "
        "PID`, or re-run under `ddpdoctor run`, which does it when progress stops), and re-run "
        "with NCCL_DEBUG=INFO and the flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
        "dumped on the timeout) to see which collective each rank was in.",
        SAME_COLLECTIVES,
        "Raise the timeout (init_process_group(timeout=...)) only if a rank was legitimately "
        "busy for that long.",
    ),
)


NEVER_JOINED = Rule(
    code="INF230",
    kind="rendezvous-failure",
    title="Ranks never joined the rendezvous; the others waited for them at start-up",
    signatures=(),
    explanation=Explanation(
        what="The ranks that started waited at the rendezvous (the store's wait for its "
        "clients, the store-based barrier) and timed out, and some ranks of the world left no "
        "line at all.",
        why="Those ranks never started, or never reached init_process_group: a pod still "
        "pending or crash-looping, a node that did not start, a launcher given fewer processes "
        "than the world size, a crash before the first line.",
        fix="Find why the missing ranks did not start (the scheduler's state of their pod or "
        "node, their own logs) and make every node start with the same world size.",
        false_positives="Their logs may simply not have been included.",
    ),
    fix=(
        "Check that the processes of the missing ranks started (kubectl get pods / describe, "
        "squeue, the launcher's output on their node) and read their logs.",
        "Check that every node was started with the same --nnodes / WORLD_SIZE.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    missing = job.missing
    if not missing or not job.timed_out:
        return None
    if all(job.ranks[r].terminated for r in missing):
        return None  # the launcher stopped them alive: they had not died first (INF201)
    # the ranks that timed out did so at the rendezvous (the others lost the store's host
    # when it gave up)
    waiting = {r for r in job.waiting if job.ranks[r].wait_kinds}
    if waiting and all(job.ranks[r].wait_kinds == {NEVER_JOINED.kind} for r in waiting):
        return Assessment(
            NEVER_JOINED,
            0.45,
            sorted(missing),
            [
                f"{ranks_text(waiting)} timed out waiting at the rendezvous, and "
                f"{ranks_text(missing)} of the world left no line at all: "
                + ("it" if len(missing) == 1 else "they")
                + " never joined."
            ],
            next_steps=[f"Find out whether {ranks_text(missing)} started, and read its log."],
        )
    # lines no rank can be told from (a console without rank prefixes) may be theirs
    unnamed = any(w.rank is None for w in job.last_words)
    said = (
        "left no line that names them (the lines that name no rank may be theirs)"
        if unnamed
        else "left no lines at all"
    )
    return Assessment(
        RULE,
        0.3 if unnamed else 0.35,
        sorted(missing),
        [
            f"{ranks_text(missing)} {said}: the root cause is most likely in their logs, "
            "which were not given."
        ],
        next_steps=[f"Collect the logs of {ranks_text(missing)}."],
    )
