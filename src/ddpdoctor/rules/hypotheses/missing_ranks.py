"""INF204: ranks timed out, and the ranks they waited for left no lines at all. Missing
evidence is evidence: the root cause is most likely in the logs that were not given."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF204",
    kind="nccl-timeout",
    title="Ranks timed out and the ranks they waited for left no logs",
    signatures=(),
    explanation=Explanation(
        what="Collective timeouts or closed connections, and no log at all from some ranks.",
        why="The root cause is most likely in the missing logs: a rank or node that died first.",
        fix="Collect the logs of the missing ranks/nodes (or run under `ddpdoctor run`).",
        false_positives="The missing ranks may simply not have been included in the paste.",
    ),
    fix=("Collect the logs of the missing ranks or nodes and diagnose all of them together.",),
)


def assess(job: JobEvidence) -> Assessment | None:
    missing = job.missing
    if not missing or not job.timed_out:
        return None
    return Assessment(
        RULE,
        0.35,
        sorted(missing),
        [
            f"{ranks_text(missing)} left no lines at all: the root cause is most likely in "
            "their logs, which were not given."
        ],
        next_steps=[f"Collect the logs of {ranks_text(missing)}."],
    )
