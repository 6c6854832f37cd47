"""INF215: a writer's output ends inside a Python traceback: the header and maybe some frames
are there, the exception line that ends every traceback is not. The process raised an exception
(a traceback is only printed for one), and the log was cut before saying which: a paste that
stops early, a file truncated by a full disk or a killed `tee`, a process killed mid-print."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF215",
    kind="python-exception",
    title="The output ends inside a traceback: the exception's own line is missing",
    signatures=(),
    category=Category.UNKNOWN,
    explanation=Explanation(
        what="A writer's last lines are a traceback ('Traceback (most recent call last):' and "
        "its frames) with no exception line after it.",
        why="Python prints a traceback when an exception ends a thread or process (or the code "
        "logs one); its last line names the exception. Without that line the cause is unknown, "
        "only where it happened: the last frame shown.",
        fix="Collect the rest of that writer's output (the full stderr, torchrun --tee 3 or "
        "--log-dir) and diagnose it again; the last frame says which code raised.",
        false_positives="A log copied while the traceback was being written, by a job that "
        "then went on (rare: a traceback is printed at once).",
    ),
    fix=(
        "Collect the complete output of that rank (torchrun --tee 3 or --log-dir DIR keeps "
        "each worker's stderr) and run the diagnosis on it: the exception line decides the cause.",
        "Until then, the last frame shown is where it failed: read that code first.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    waiting = job.waiting  # a rank's own timeout traceback, cut, is an echo, not a cause
    cut = [e for e in job.cut_tracebacks if e.rank is None or e.rank not in waiting]
    if not cut:
        return None
    ranks = sorted({e.rank for e in cut if e.rank is not None})
    failing = [r for r in ranks if r in job.failing_exits]
    where = [e.text for e in cut if e.text.startswith('File "')]
    support = [
        (f"the output of {ranks_text(ranks)}" if ranks else "the output")
        + " ends inside a Python traceback: an exception was raised, and the line naming it "
        "is not in the logs."
    ]
    if where:
        support.append(f"The last frame shown: {where[0]}")
    if failing:
        codes = ", ".join(f"rank {r}: {job.failing_exits[r]}" for r in failing)
        support.append(f"The launcher reports it exiting with an error ({codes}).")
    return Assessment(
        RULE,
        0.55 if failing else 0.45,
        failing or ranks,
        support,
        evidence=cut[:4],
        next_steps=["Collect the rest of that output: its last line names the exception."],
        category=str(Category.UNKNOWN),
        # a writer known by its rank can be the one the others lost; an unnamed one cannot
        explains_echoes=bool(ranks),
    )
