"""INF212: the log stops in the middle of training: no error, no end of training, no exit.
The job may have hung or still be running; nothing here says which. The verdict stays
"unknown"; its kind names the likelier reading of a log whose writers all fell silent (a hang,
the taxonomy's "no progress and no error text") at the confidence of a guess, and its evidence
is where each writer's output ends."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.collectives import SILENT_HANG_CAUSES
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF212",
    kind="hang",
    title="The log ends in the middle of training, without an end",
    signatures=(),
    category=Category.UNKNOWN,
    status=Status.UNKNOWN,
    explanation=Explanation(
        what="The progress counters stop before their total, and nothing after them says the "
        "job ended: no error, no end-of-training line, no exit code.",
        why="The job hung (a collective nobody joined, a stuck data loader), was still running "
        "when the log was copied, or was killed without a trace in these logs.",
        fix="Check whether the job is still running; if it hangs, take every rank's stack "
        "(`py-spy dump --pid PID`, or run it under `ddpdoctor run`, which does it for you).",
        false_positives="A log copied while the job was healthy and still running.",
    ),
    fix=(
        "If the job is still running and makes no progress: dump every rank's stack "
        "(py-spy dump --pid PID) or re-run under `ddpdoctor run --hang-after 300 -- ...`.",
        "If it ended: collect the launcher's output and every rank's log up to the end.",
        SILENT_HANG_CAUSES,
    ),
)


MAX_ENDINGS = 4
"""The last lines quoted: where the first writers' output ends (every one is in the JSON)."""


def assess(job: JobEvidence) -> Assessment | None:
    if job.ended or not job.started_training or job.echoes or job.failing_exits:
        return None
    if (job.ended_on_full_bar or job.ended_after_full_bar) and job.last_step is None:
        return None  # the run's own bar reached its total: the loop ended, not the log
    if job.exited_cleanly and job.last_step is None:
        return None  # the processes shut down normally, with no error: not a log cut short
    if job.ended_on_last_epoch:
        return None  # every writer's epoch counter reached its last epoch's end
    if job.ended_on_planned_step:
        return None  # every writer ended on the step its configuration planned last
    where = (
        f"at step {job.last_step[0]} of {job.last_step[1]}"
        if job.last_step
        else ("after its training progress")
    )
    return Assessment(
        RULE,
        0.3,
        [],
        [
            f"the log ends {where} without an end: no error, no end of training, no exit "
            "code. The job may have hung, or it was still running."
        ],
        next_steps=[
            "Find out whether the job is still running, and collect the rest of its output."
        ],
        status=Status.UNKNOWN,
        category=str(Category.UNKNOWN),
        explains_echoes=False,
        evidence=job.last_words[:MAX_ENDINGS],
    )
