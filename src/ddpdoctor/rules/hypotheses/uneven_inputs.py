"""INF209: the ranks iterated over different numbers of batches, so the one with the fewest
left the loop while the others entered the next collective. Evidence: per-rank progress
counters that run to different totals ("step 5/8" vs "step 5/6"), with ranks left waiting."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF209",
    kind="uneven-inputs",
    title="Ranks iterated over different numbers of batches",
    signatures=(),
    explanation=Explanation(
        what="The ranks' progress counters run to different totals, and ranks then timed out "
        "waiting for each other.",
        why="Each rank got a different number of batches (uneven sharding, an IterableDataset "
        "without per-rank split, drop_last=False), so the rank with fewer batches left the loop "
        "while the others entered the next collective.",
        fix="Give every rank the same number of batches, or train inside `with model.join():`.",
        false_positives="Counters that are not per-rank batch counts.",
    ),
    fix=(
        "Use DistributedSampler(dataset, drop_last=True) or equal shards per rank.",
        "Or wrap the training loop in `with ddp_model.join():`.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    if not (job.waiting or any(v.failed for v in job.ranks.values())):
        return None
    totals = {r: v.progress_total for r, v in job.ranks.items() if v.progress_total is not None}
    if len(set(totals.values())) < 2:
        return _from_announced_sizes(job)
    fewest = min(t for t in totals.values() if t is not None)
    short = {r for r, t in totals.items() if t == fewest}
    detail = ", ".join(f"rank {r}: {t}" for r, t in sorted(totals.items()))
    return Assessment(
        RULE,
        0.6,
        sorted(short),
        [
            f"the ranks iterate over different numbers of batches ({detail}): "
            f"{ranks_text(short)} ran out of data first and left the loop while the others "
            "waited."
        ],
    )


def _from_announced_sizes(job: JobEvidence) -> Assessment | None:
    """The ranks said how much data they have ('56 samples, 7 batches'), and a few said less
    than the others: they run out first."""
    for unit in sorted(job.data_sizes):
        sizes = job.data_sizes[unit]
        if len(sizes) < 2 or len(set(sizes.values())) < 2:
            continue
        fewest = min(sizes.values())
        short = {r for r, n in sizes.items() if n == fewest}
        if len(short) * 2 > len(sizes):
            continue  # most ranks have the least: no odd one out
        detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(sizes.items()))
        return Assessment(
            RULE,
            0.55,
            sorted(short),
            [
                f"the ranks announced different amounts of data ({unit}: {detail}): "
                f"{ranks_text(short)} ran out first and left the loop while the others waited "
                "for it."
            ],
        )
    return None
