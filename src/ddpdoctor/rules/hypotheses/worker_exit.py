"""INF208: the launcher reports a worker that failed, and that worker's own error is not in
the logs (its output went elsewhere). Where its output is shown (the console holds the
traceback of a rank it left waiting) and it printed no traceback, it ended itself: a rank that
left on its own (INF202). Where the launcher stopped its workers after a failure it does not
name, in a console that holds what the workers printed, and none of them printed an error, the
one that ended died without a word: killed from outside (INF231), or, after its training loop
had run to its end, in teardown (INF210)."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules import inferred
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses import killed_rank, uncoordinated_exit
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF208",
    kind="python-exception",
    title="A worker exited with an error and its own output is not in the logs",
    signatures=(),
    explanation=Explanation(
        what="The launcher reports a failed worker, but that worker's error text is missing.",
        why="The worker's stderr went elsewhere (a --log-dir, a redirect, another file).",
        fix="Collect that worker's output (torchrun --log-dir / --tee 3) and diagnose it.",
        false_positives="None.",
    ),
    fix=("Re-run with torchrun --tee 3 (or --log-dir DIR) so each worker's output is kept.",),
)


def assess(job: JobEvidence) -> Assessment | None:
    if "stopped" in job.unranked_echoes:
        # a stop sent to the whole job (the launcher's death signal) made the workers exit
        # non-zero: the launcher was there to receive it, so no worker had failed before
        return None
    # ranks left waiting exit with an error too. Ranks that lost their peer (a connection
    # closed, Horovod shut down) were left by one that went away: a rank that exited with an
    # error is that one. Ranks that timed out waited for one that was alive but elsewhere: a
    # rank that exited with an error and printed nothing here is as likely another of them.
    failing = {r: c for r, c in job.failing_exits.items() if r not in job.waiting}
    # (a timeout no rank could be read for still says a rank waited for a live peer)
    unranked_wait = "waiting" in job.unranked_echoes
    timed_out = unranked_wait or any("waiting" in job.ranks[r].echoes for r in job.waiting)
    if (job.waiting or unranked_wait) and (not failing or timed_out):
        return None
    if not failing:
        if "launcher" not in job.echoes or job.echoes & {"lost-peer", "stopped"}:
            return None
        if job.worker_lines > 0 and not any(v.failed or v.warned for v in job.ranks.values()):
            if job.stalled_before(job.launcher_reacted_at):
                return _stalled_then_stopped(job)
            return _died_without_a_word(job)
        return Assessment(
            RULE,
            0.4,
            [],
            [
                "the launcher terminated the workers because one of them failed, and no "
                "worker's own error is in these logs."
            ],
        )
    deliberate = _exited_without_a_traceback(job, failing)
    if deliberate:
        return Assessment(
            uncoordinated_exit.RULE,
            0.55,
            sorted(deliberate),
            [
                f"{ranks_text(deliberate)} exited with "
                + ", ".join(f"code {failing[r]}" for r in sorted(deliberate))
                + " and printed no traceback, in the console where "
                + f"{ranks_text(job.waiting)}'s traceback is: an uncaught exception would "
                "have printed one there, so the process ended itself (sys.exit, exit()) while "
                f"{ranks_text(job.waiting)} went on and lost it."
            ],
            against=["its traceback may have been silenced (stderr redirected by the program)"],
        )
    codes = ", ".join(f"rank {r}: {c}" for r, c in sorted(failing.items()))
    return Assessment(
        RULE,
        0.5,
        sorted(failing),
        [f"the launcher reports {ranks_text(set(failing))} exiting with an error ({codes})."],
    )


def _stalled_then_stopped(job: JobEvidence) -> Assessment:
    """The launcher's stop came long after the job's last progress, at far more than its
    pace: the job was stuck before, and whatever ended it (a worker, or a stop from outside
    that the launcher passed on) ended a hang."""
    assert job.launcher_reacted_at is not None and job.last_progress_at is not None
    silence = (job.launcher_reacted_at - job.last_progress_at).total_seconds()
    return Assessment(
        inferred.STALLED_THEN_STOPPED,
        0.5,
        [],
        [
            f"the job printed progress every {job.step_s:.3g} s, then nothing for "
            f"{silence:.0f} s and no error until the launcher stopped its workers: it was "
            "stuck before that, and the stop is not the cause."
        ],
        status=Status.HUNG,
    )


def _died_without_a_word(job: JobEvidence) -> Assessment:
    """The launcher stopped the workers after one ended, the workers' own lines are in the
    same output, and none printed an error: a Python exception would have printed its
    traceback there, so the worker was killed (the OOM killer's SIGKILL, a memory limit) or
    crashed natively; after a loop that ran to its end, that was in teardown."""
    after_the_loop = bool(
        job.ended_on_full_bar
        or job.ended_after_full_bar
        or job.ended_on_last_epoch
        or job.ended_on_planned_step
    )
    if after_the_loop:
        return Assessment(
            inferred.TEARDOWN_CRASH,
            0.4,
            [],
            [
                "the launcher stopped the workers because one ended, after the training loop "
                "had run to its end, and no worker printed an error in the output that holds "
                "their lines: the worker died on its way out (teardown), not in training."
            ],
            against=["which worker ended, and how, is not in these logs"],
        )
    return Assessment(
        killed_rank.RULE,
        0.4,
        [],
        [
            "the launcher stopped the workers because one ended, and no worker printed an "
            "error in the output that holds their lines: a Python exception would have "
            "printed its traceback there, so the worker died without a word, killed from "
            "outside (the kernel's OOM killer, a memory limit) or by a native crash."
        ],
        against=["which worker ended, and how, is not in these logs"],
    )


def _exited_without_a_traceback(job: JobEvidence, failing: dict[int, int]) -> set[int]:
    """Failed workers with no error of their own whose stderr is shown: the launcher reported
    their exit in a console where a rank left waiting printed its traceback (the same node's
    workers share it). A Python process that dies of an exception prints its traceback
    there; one that printed nothing called sys.exit() itself. Not where that console holds an
    exception line of no rank: some worker raised, its traceback perhaps not printed."""
    if not job.waiting:
        return set()
    shown = {s for r in job.waiting for s in job.ranks[r].sources}
    if any(e.source in shown for e in job.unranked_raised):
        # an exception line no rank is known for is in that console: the failed worker's
        # own, printed without a traceback (a program's excepthook), not a silent exit
        return set()
    # a rank whose output ends inside a traceback of its own did raise: its stderr was cut
    # (Python's 'lost sys.stderr'), not silent
    raised = {c.where.rank for c in job.cut_tracebacks}
    return {
        r
        for r in failing
        if (view := job.ranks.get(r)) is not None
        and not view.failed
        and not view.warned
        and view.exit_signal is None
        and view.exit_source in shown
        and r not in raised
    }
