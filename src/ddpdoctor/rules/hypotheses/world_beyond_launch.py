"""INF238: the default process group waited for ranks that were never launched. While the
group forms, each process publishes its address under its rank's key in the store and waits for
every other rank's (gloo: /default_pg/0//cpu//0/<rank>). A wait that times out on a rank at or
beyond the processes the logs show (ranks 0..N-1 all there, the key names rank N or more) says
the world the processes were told is larger than the launch: a hard-coded or edited world
size, --nnodes or WORLD_SIZE counting nodes or GPUs that never started. The group cannot form;
no rank's code is at fault."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF238",
    kind="rendezvous-failure",
    title="The process group waited for ranks beyond the processes launched",
    signatures=(),
    category=Category.CONFIGURATION,
    explanation=Explanation(
        what="While the default process group formed, the processes waited for the address of "
        "a rank at or beyond the ones launched (all ranks below it are there), and timed out.",
        why="The world size the processes were given is larger than the processes started: a "
        "world_size hard-coded or edited in a script or config, WORLD_SIZE or --nnodes counting "
        "nodes or GPUs that are not there, a node that was never started.",
        fix="Give init_process_group the world the launcher started (torchrun sets WORLD_SIZE: "
        "use it, not a constant), or start the missing processes (every node, with the same "
        "--nnodes and --nproc-per-node).",
        false_positives="Logs of only the first ranks of a larger job: the ranks after them may "
        "exist and have failed to start; their own logs tell.",
    ),
    fix=(
        "Pass the launcher's world to init_process_group (world_size=int(os.environ["
        "'WORLD_SIZE']), or init_method='env://' with no world_size), not a number of your "
        "own; check configs and scripts for a world_size that no longer matches the launch.",
        "If the job spans nodes: start every node with the same --nnodes and --nproc-per-node, "
        "and check that the missing node's launcher started at all.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    waited = job.pg_wait_ranks
    present = {r for r, v in job.ranks.items() if v.present}
    if not waited or not present:
        return None
    launched = max(present) + 1
    if present != set(range(launched)) or min(waited) < launched:
        return None
    # where only some ranks report a wait and the others printed no error, those few were
    # most likely told the larger world (an edited config on one node): they are where to look
    odd = job.waiting & present
    if odd == present or any(job.ranks[r].failed for r in present - odd):
        odd = set()
    return Assessment(
        RULE,
        0.6,
        sorted(odd),
        [
            f"the processes waited, while the process group formed, for the address of "
            f"{ranks_text(waited)}, and the logs show the {launched} processes launched, ranks "
            f"0 to {launched - 1}: the world they were given is larger than the launch, so "
            "the group could not form."
            + (
                f" Only {ranks_text(odd)} reported a wait, the others printed no error: "
                f"{ranks_text(odd)} was most likely given the larger world."
                if odd
                else ""
            )
        ],
        category=str(Category.CONFIGURATION),
    )
