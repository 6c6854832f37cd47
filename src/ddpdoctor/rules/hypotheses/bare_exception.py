"""INF227: a writer's output ends with an exception line and no traceback above it. Python
prints an uncaught exception as its traceback and then that line; a paste that keeps only the
last line, or a program that logs `f"{type(e).__name__}: {e}"` before exiting, leaves the
line alone. It is how that process ended, said as a guess: the frames that would prove it are
missing."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF227",
    kind="python-exception",
    title="The output ends with an exception line whose traceback is not shown",
    signatures=(),
    explanation=Explanation(
        what="A writer's last line is a Python exception ('TypeError: ...', "
        "'_pickle.PicklingError: ...') with no traceback before it, and nothing else in the "
        "logs failed.",
        why="An uncaught exception ends its process with exactly that line; the traceback "
        "above it was left out of the paste, or the program printed only the message.",
        fix="Read the message: it usually names the call that failed (an argument, a value, an "
        "object that cannot be pickled). Collect the full output for the traceback.",
        false_positives="A caught exception the program logged before going on (its later "
        "lines would then follow it), or a line quoted from elsewhere.",
    ),
    fix=(
        "Run it again with the full stderr of every rank kept (torchrun --tee 3 or --log-dir "
        "DIR) to see where the exception was raised.",
    ),
)

EXCEPTION = re.compile(r"^\**(?P<exc>[A-Za-z_][\w.]{0,200}(?:Error|Exception)): \S")
"""An exception line with a message: 'TypeError: init_process_group() got an unexpected ...'."""


def assess(job: JobEvidence) -> Assessment | None:
    if job.echoes or job.failing_exits or job.ended or job.cut_tracebacks:
        return None
    if any(v.failed for v in job.ranks.values()):
        return None
    ending = [
        w
        for w in job.last_words
        if EXCEPTION.match(w.text.strip()) and (w.source, w.line) not in job.traced_endings
    ]
    if not ending:
        return None
    ranks = sorted({w.rank for w in ending if w.rank is not None})
    who = f"the output of {ranks_text(ranks)}" if ranks else "the output"
    exc = EXCEPTION.match(ending[0].text.strip())
    name = exc["exc"] if exc else "an exception"
    return Assessment(
        RULE,
        0.4,  # the most generic reading: a line that says what failed wins over it
        ranks,
        [
            f"{who} ends with {name} and no traceback above it: an uncaught exception ends a "
            "process with exactly that line."
        ],
        evidence=ending[:4],
        next_steps=["Collect the full output of that process: the traceback says where."],
    )
