"""INF235: two processes announced the same global rank while other ranks of the world never
announced theirs. Every process of a job joins as one rank of the world; when two launches (two
nodes, two srun steps, a launcher and the script's own spawn) each compute the same ranks (no
node rank given, Slurm told one node), each rank of the first node's range is announced twice
and the ranks of the other nodes never: the group cannot form. A restart announces every rank
again and leaves none out, so it does not read as this."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text

RULE = Rule(
    code="INF235",
    kind="rendezvous-failure",
    title="Two processes joined as the same global rank; other ranks never joined",
    signatures=(),
    category=Category.CONFIGURATION,
    explanation=Explanation(
        what="The same global rank is announced by two processes (Lightning's 'GLOBAL_RANK: 1, "
        "MEMBER: 2/8' twice), and some ranks of the world by none.",
        why="Two launches computed the same ranks: each node believes it is the first (no "
        "--node_rank / NODE_RANK, Slurm given fewer --nodes or --ntasks than the program's "
        "num_nodes and devices), or the script spawns its own workers under a launcher that "
        "already did. The group waits for ranks nobody has, or fails on the duplicates.",
        fix="Give every node its own node rank and the same world: torchrun --nnodes N "
        "--node_rank K (or Slurm's --nodes N --ntasks-per-node G, matching Trainer(num_nodes=N, "
        "devices=G)); launch the workers once.",
        false_positives="Two runs' logs pasted together: then each announcement is a different "
        "job's.",
    ),
    fix=(
        "Make each node's ranks distinct: set the node rank per node (torchrun --node_rank, "
        "NODE_RANK) or let Slurm set it (#SBATCH --nodes=N --ntasks-per-node=G, as many as "
        "Trainer(num_nodes=N, devices=G) expects).",
        "Start the workers once: not a launcher around a script that spawns its own.",
    ),
)


def _announced_twice(said: list[Evidence]) -> bool:
    """Two processes announced the rank: twice in one output (each process prints its own
    line once), or from two hosts. The same line in two outputs is one process's line kept
    twice (a console and the rank's own file under torchrun --tee, a log and its copy)."""
    sources = [e.source for e in said]
    hosts = {e.host for e in said if e.host}
    return len(sources) > len(set(sources)) or len(hosts) > 1


def assess(job: JobEvidence) -> Assessment | None:
    twice = {r for r, said in job.announcements.items() if _announced_twice(said)}
    if not twice or job.last_restart is not None:
        return None
    absent = {r for r in job.missing if r not in job.announcements}
    if not absent or len(twice) < len(absent) / 2:
        return None  # the world's other ranks all came: a restart or a repeated line
    world = f" of the world of {job.world_size}" if job.world_size else ""
    failed = any(v.failed for v in job.ranks.values())
    return Assessment(
        RULE,
        0.6,
        [],
        [
            f"{ranks_text(twice)} joined the group twice (two processes announced "
            + ("it" if len(twice) == 1 else "each of them")
            + f"), while {ranks_text(absent)}{world} never joined: two launches took the "
            "same global ranks (each node believed it was the first), so the group could not "
            "form."
        ],
        evidence=[e for r in sorted(twice)[:2] for e in job.announcements[r][:2]],
        status=Status.FAILED if failed else Status.HUNG,
        category=str(Category.CONFIGURATION),
    )
