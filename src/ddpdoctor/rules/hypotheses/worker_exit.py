"""INF208: the launcher reports a worker that failed, and that worker's own error is not in
the logs (its output went elsewhere). Where its output is shown (the console holds the
traceback of a rank it left waiting) and it printed no traceback, it ended itself: a rank that
left on its own (INF202)."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses import uncoordinated_exit
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
    timed_out = any("waiting" in job.ranks[r].echoes for r in job.waiting)
    if job.waiting and (not failing or timed_out):
        return None
    if not failing:
        if "launcher" not in job.echoes or job.echoes & {"lost-peer", "stopped"}:
            return None
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


def _exited_without_a_traceback(job: JobEvidence, failing: dict[int, int]) -> set[int]:
    """Failed workers with no error of their own whose stderr is shown: the launcher reported
    their exit in a console where a rank left waiting printed its traceback (the same node's
    workers share it). A Python process that dies of an exception prints its traceback
    there; one that printed nothing called sys.exit() itself."""
    if not job.waiting:
        return set()
    shown = {s for r in job.waiting for s in job.ranks[r].sources}
    return {
        r
        for r in failing
        if (view := job.ranks.get(r)) is not None
        and not view.failed
        and not view.warned
        and view.exit_signal is None
        and view.exit_source in shown
    }
