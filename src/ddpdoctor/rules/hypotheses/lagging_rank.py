"""INF214: the ranks' Flight Recorder dumps show a rank that stopped issuing the collectives
the others issued: it died, was stuck or busy elsewhere before that collective. Its own log
says which; without it, the recorder still names the rank and the collective it never
reached."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF214",
    kind="hang",
    title="A rank stopped issuing the collectives the others issued",
    signatures=(),
    category=Category.UNKNOWN,
    explanation=Explanation(
        what="In the Flight Recorder dumps, one rank's last collective is earlier than the "
        "others': it never issued the collective they were in.",
        why="That rank died, hung or was busy somewhere else (data loading, evaluation, a "
        "sleep or a lock) before reaching the collective; the others waited for it.",
        fix="Read that rank's own log and stack at the time: its last lines and the code line "
        "of its last collective show where it stopped.",
        false_positives="Dumps taken at different moments: a rank dumped earlier looks behind.",
    ),
    fix=(
        "Read the lagging rank's own log (and stack, with `ddpdoctor run`) around its last "
        "collective: that is where it stopped.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    if job.flight is None:
        return None
    div = next((d for d in job.flight.divergences if d.kind == "behind"), None)
    if div is None or not div.ranks:
        return None
    return Assessment(
        RULE,
        0.55,
        sorted(div.ranks),
        [f"the Flight Recorder dumps show it: {div.summary}"],
        status=Status.HUNG if job.stall is not None else Status.FAILED,
    )
