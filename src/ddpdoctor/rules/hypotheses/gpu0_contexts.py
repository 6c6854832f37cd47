"""INF234: nvidia-smi shows the job's processes, each on its own GPU, holding memory on GPU 0
as well: every rank created a CUDA context (and often tensors) on cuda:0. The classic cause on
resume is torch.load without map_location: the checkpoint's tensors were saved from cuda:0 and
are restored there by every rank; a CUDA call made before torch.cuda.set_device does the same.
GPU 0 carries one extra context per rank, which slows it and turns into an out-of-memory there
as the ranks grow."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF234",
    kind="checkpoint-load-device",
    title="Every rank also holds memory on GPU 0",
    signatures=(),
    category=Category.USER_CODE,
    status=Status.SLOW,
    explanation=Explanation(
        what="nvidia-smi's process table lists processes that run on GPU 1, 2, ... and also "
        "hold memory on GPU 0.",
        why="Each of them created a CUDA context on cuda:0: torch.load of a checkpoint saved "
        "from GPU 0 without map_location restores its tensors there on every rank, and any "
        "CUDA call before torch.cuda.set_device (or a torch.device('cuda') without an index) "
        "lands on GPU 0 too. GPU 0 then carries one extra context per rank: slower, and out "
        "of memory as the job grows.",
        fix="Load with torch.load(path, map_location='cpu') (or the rank's own device), and "
        "call torch.cuda.set_device(local_rank) before any other CUDA call.",
        false_positives="A program that uses GPU 0 on purpose from every rank (a shared "
        "evaluation model), or a table taken from several jobs at once.",
    ),
    fix=(
        "checkpoint = torch.load(path, map_location='cpu') (or map_location=f'cuda:{local_rank}').",
        "torch.cuda.set_device(local_rank) first thing in the process, before any model, tensor "
        "or CUDA query.",
    ),
)


MIN_ON_ZERO = 2
"""Processes holding GPU 0: one process owning two GPUs on purpose holds it alone; several
processes there, one of them another GPU's, is the per-rank context (a paste may cut the table
before the other GPUs' rows, so one such process is enough to see it)."""


def assess(job: JobEvidence) -> Assessment | None:
    on_zero = {pid for pid, gpus in job.gpu_processes.items() if 0 in gpus}
    doubled = sorted(pid for pid in on_zero if job.gpu_processes[pid] - {0})
    if len(on_zero) < MIN_ON_ZERO or not doubled:
        return None
    if job.echoes or job.failing_exits or any(v.failed for v in job.ranks.values()):
        return None  # a failure to explain first; this is how it ran, not how it ended
    others = sorted({g for pid in doubled for g in job.gpu_processes[pid] - {0}})
    shown = ", ".join(str(p) for p in doubled[:8])
    return Assessment(
        RULE,
        0.55,
        [],
        [
            f"The nvidia-smi table lists {len(on_zero)} processes holding memory on GPU 0, and "
            f"process(es) {shown} of them run on GPU(s) {', '.join(str(g) for g in others[:8])}: "
            "each rank created a CUDA context on cuda:0 besides its own GPU (torch.load "
            "without map_location on resume, or a CUDA call before set_device)."
        ],
        status=Status.SLOW,
        category=str(Category.USER_CODE),
        explains_echoes=False,
        evidence=[
            row
            for pid in doubled[:3]
            for gpu in sorted(job.gpu_processes[pid])
            if (row := job.gpu_process_rows.get((pid, gpu))) is not None
        ],
    )
