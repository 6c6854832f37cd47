"""INF205: the output stops during distributed start-up: no error, no training step, no exit.
On one node the classic cause is broken GPU peer-to-peer; across nodes, the network transport
(reported as a hang, since nothing in the logs proves the fabric)."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment
from ddpdoctor.rules.hypotheses.stalled_rank import HANG

RULE = Rule(
    code="INF205",
    kind="nccl-p2p",
    title="Output stopped during distributed start-up with no error",
    signatures=(),
    explanation=Explanation(
        what="The log ends at distributed initialisation: no error, no training step, no exit.",
        why="A hang while NCCL connects the GPUs. On one node the classic cause is broken "
        "peer-to-peer (ACS/IOMMU, a driver change); across nodes the network transport.",
        fix="Bisect: NCCL_P2P_DISABLE=1 (one node) or NCCL_IB_DISABLE=1 (several nodes) with "
        "NCCL_DEBUG=INFO; `ddpdoctor check` automates it.",
        false_positives="A log that was simply cut, or a rendezvous waiting for other nodes.",
    ),
    fix=(
        "Re-run with NCCL_DEBUG=INFO to see where initialisation stops.",
        "Try NCCL_P2P_DISABLE=1: if it then runs, check `nvidia-smi topo -m`, ACS/IOMMU and "
        "the driver version.",
        "Across nodes try NCCL_IB_DISABLE=1 and set NCCL_SOCKET_IFNAME.",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    if not job.stalled_at_startup or job.echoes or job.failing_exits:
        return None
    if job.job_exit_code not in (None, 0):
        return None
    return Assessment(
        RULE if job.single_node else HANG,
        0.3,
        [],
        [
            "the output stops during distributed start-up: no error, no training step, no "
            "exit. On one node, broken GPU peer-to-peer is the classic cause."
        ],
        next_steps=[
            "Re-run with NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1; or run `ddpdoctor check "
            "--nproc-per-node N` on the node.",
        ],
        status=Status.HUNG,
        category=str(Category.UNKNOWN),
        explains_echoes=False,
    )
