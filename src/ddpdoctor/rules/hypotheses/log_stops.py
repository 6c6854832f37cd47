"""INF233: the output stops and nothing in it was recognised: no error, no message of normal
operation, no training progress, no end, no exit code. People bring such a log when the job
stopped printing and never ended (the hang the taxonomy describes as "no progress and no error
text"), or when the error went to a file they did not give. The verdict stays "unknown" at the
confidence of a guess; its kind names the likelier reading, and its evidence is where each
writer's output stops, which is where a hung job is waiting."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.collectives import SILENT_HANG_CAUSES
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF233",
    kind="hang",
    title="The output stops with no error, no progress and no end",
    signatures=(),
    category=Category.UNKNOWN,
    status=Status.UNKNOWN,
    explanation=Explanation(
        what="Nothing in the logs was recognised: no error, no message of normal operation, no "
        "training progress, no end of training, no exit code. The output simply stops.",
        why="A job that waits for ever prints nothing more: a collective or a rendezvous some "
        "rank never joined, a data loader or a download that never returns, a lock. The same "
        "log is what a job still running, or one whose error went elsewhere, leaves.",
        fix="Check whether the job is still running; if it is and prints nothing, take every "
        "rank's stack (`py-spy dump --pid PID`, or run it under `ddpdoctor run`, which does "
        "it for you) to see where it waits.",
        false_positives="A log copied while the job was still starting, or the part of a "
        "failed job's output that holds no error (the error went to another file).",
    ),
    fix=(
        "If the job is still running and prints nothing: dump every rank's stack "
        "(py-spy dump --pid PID) or re-run under `ddpdoctor run --hang-after 300 -- ...`.",
        "If it ended: the error went to an output not read here (another rank's file, the "
        "launcher's console, the scheduler's job log): diagnose them together.",
        SILENT_HANG_CAUSES,
    ),
)


MAX_ENDINGS = 4
"""The last lines quoted: where the first writers' output stops (every one is in the JSON)."""


def assess(job: JobEvidence) -> Assessment | None:
    if job.ended or job.started_training or job.normal_seen or job.stalled_at_startup:
        return None  # other hypotheses and verdicts read those
    if job.echoes or job.failing_exits or job.job_exit_code is not None or job.stopped_by_run:
        return None
    if not job.last_words or job.warnings:
        return None  # nothing read, or something recognised after all
    return Assessment(
        RULE,
        0.3,
        [],
        [
            "Nothing in these logs was recognised: no error, no message of normal operation, "
            "no training progress, no end of training, no exit code. The output stops at the "
            "lines below: if the job is still running and prints nothing more, it hangs "
            "there; if it ended, its error is not in what was read."
        ],
        against=["nothing recognised: no error, progress, end of training or exit code"],
        next_steps=[
            "Find out whether the job is still running (and where it waits). If it failed, "
            "collect every rank's complete output (torchrun --tee 3 or --log-dir DIR) and the "
            "launcher's, and diagnose them together."
        ],
        status=Status.UNKNOWN,
        category=str(Category.UNKNOWN),
        explains_echoes=False,
        evidence=job.last_words[:MAX_ENDINGS],
    )
