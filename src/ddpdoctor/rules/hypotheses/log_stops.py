"""INF233: the output stops and nothing in it was recognised: no error, no message of normal
operation, no training progress, no end, no exit code. People bring such a log when the job
stopped printing and never ended (the hang the taxonomy describes as "no progress and no error
text"), or when the error went to a file they did not give. The verdict stays "unknown" at the
confidence of a guess; its kind names the likelier reading, and its evidence is where each
writer's output stops, which is where a hung job is waiting."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.collectives import SILENT_HANG_CAUSES
from ddpdoctor.rules.data import MISSING_INPUT, MISSING_INPUT_WORDS
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


UNKNOWN_ERROR = Rule(
    code="INF240",
    kind="python-exception",
    title="The program logged an error no rule knows, then its output stops",
    signatures=(),
    category=Category.UNKNOWN,
    status=Status.UNKNOWN,
    explanation=Explanation(
        what="The only sign of trouble is an error-level line of the program's own (logging's "
        "ERROR, a rich or glog error record) whose words no rule here knows; after it there is "
        "no progress, no end of training and no exit code.",
        why="Programs often log what they cannot do and quit without a traceback (a missing "
        "dataset, a bad argument: 'dataset not found', 'invalid config'), and every process then "
        "exits 0, so the launcher prints nothing. The same log is left by a job that logged "
        "the error and then waits.",
        fix="Read the error the program logged: it names what it could not do (a path, an "
        "argument, a file). If the job still runs and prints nothing, take every rank's stack.",
        false_positives="An error the program logged and recovered from, in a log copied "
        "before the job went on.",
    ),
    fix=(
        "Read the quoted error: fix the input, path or argument it names and start again.",
        "If the job is still running and prints nothing: dump every rank's stack (py-spy dump "
        "--pid PID) or re-run under `ddpdoctor run`.",
    ),
)

MAX_ENDINGS = 4
"""The last lines quoted: where the first writers' output stops (every one is in the JSON)."""


def assess(job: JobEvidence) -> Assessment | None:
    if job.ended or job.started_training or job.normal_seen or job.stalled_at_startup:
        return None  # other hypotheses and verdicts read those
    if job.ignored_exceptions:
        return None  # Python's own word that it went on (decision.py reads it)
    if job.echoes or job.failing_exits or job.job_exit_code is not None or job.stopped_by_run:
        return None
    if not job.last_words or job.warnings:
        return None  # nothing read, or something recognised after all
    if job.logged_errors:
        return _after_an_unknown_error(job)
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


def _after_an_unknown_error(job: JobEvidence) -> Assessment:
    """The program logged an error no rule here knows, and then its output stops: no progress,
    no end, no exit code. Its own words are the best lead: quoted first, the reading stays a
    guess (a job that quits on its error leaves this log, and so does one that waits after
    logging it)."""
    said = job.logged_errors[0]
    missing = [e for e in job.logged_errors if MISSING_INPUT_WORDS.search(e.text)]
    if missing:
        return _missing_input(job, missing)
    return Assessment(
        UNKNOWN_ERROR,
        0.3,
        [],
        [
            "No rule here knows the error the program logged "
            f'("{said.text.strip()[:160]}"), and nothing after it says what became of the job: '
            "no progress, no end of training, no exit code. If the job ended there, that "
            "error is most likely why; if it still runs and prints nothing, it waits."
        ],
        against=["an error no rule knows: its words are the evidence, not a diagnosis"],
        next_steps=[
            "Read the error the program logged (quoted above): it names what it could not do.",
            "Find out whether the job is still running; collect every rank's complete output "
            "and the launcher's, and diagnose them together.",
        ],
        status=Status.UNKNOWN,
        category=str(Category.UNKNOWN),
        explains_echoes=False,
        evidence=[*job.logged_errors[:2], *job.last_words[:MAX_ENDINGS]],
    )


def _missing_input(job: JobEvidence, missing: list[Evidence]) -> Assessment:
    """The error the program logged says its input data is not there ('No data found',
    'data_dir /data/x does not exist'), and no training followed: a program that cannot find
    its data does not train, whether it then exits (every worker returning 0, the launcher
    silent) or waits."""
    ranks = sorted({e.rank for e in missing if e.rank is not None})
    return Assessment(
        MISSING_INPUT,
        0.45,
        ranks,
        [
            "The program logged that its input data is not there "
            f'("{missing[0].text.strip()[:160]}"), and no training followed: no progress, '
            "no end of training, no exit code."
        ],
        against=["the program's own words, read as missing data; no exit code was seen"],
        next_steps=["Check the path or folder the logged error names, on every node."],
        explains_echoes=False,
        evidence=[*missing[:2], *job.last_words[:MAX_ENDINGS]],
    )
