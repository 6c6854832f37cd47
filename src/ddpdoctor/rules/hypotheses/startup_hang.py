"""INF205 / INF226: the output stops during distributed start-up: no error, no training step, no
exit. Where it stops says which part of start-up never finished: right after NCCL connected
the GPUs of one node peer-to-peer (its own "via P2P/..." lines), broken GPU peer-to-peer is the
classic cause; without such lines nothing in the logs points at the fabric, and it is a hang
(the bisection is the next step); while every writer's last words still announce joining the
group (INF226), the rendezvous never completed: some members never arrived."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text
from ddpdoctor.rules.hypotheses.stalled_rank import HANG

RULE = Rule(
    code="INF205",
    kind="nccl-p2p",
    title="Output stopped during distributed start-up with no error",
    signatures=(),
    explanation=Explanation(
        what="The log ends at distributed initialisation right after NCCL connected the GPUs "
        "of one node peer-to-peer ('via P2P/IPC'): no error, no training step, no exit.",
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

RENDEZVOUS = Rule(
    code="INF226",
    kind="rendezvous-failure",
    title="Output stopped while the ranks were joining the process group",
    signatures=(),
    explanation=Explanation(
        what="The log ends with the ranks announcing that they join the process group "
        "(Lightning's 'Initializing distributed: GLOBAL_RANK', DeepSpeed's 'Initializing "
        "TorchBackend'), and no line says the group formed: no error, no step, no exit.",
        why="init_process_group waits until every member of the world has reached the "
        "rendezvous. Members that never arrive (a node that did not start, started with "
        "another --nnodes or MASTER_ADDR, or scheduled with the wrong task count) leave the "
        "others waiting there until the timeout.",
        fix="Check that every node started with the same world size, MASTER_ADDR and "
        "MASTER_PORT, and that the scheduler gave the job the number of tasks it expects "
        "(Slurm: --ntasks-per-node equal to the GPUs per node).",
        false_positives="A log copied while the other nodes were still starting.",
    ),
    fix=(
        "Compare the world size the ranks announce with the processes that really started "
        "(`squeue`/`sacct`, the other nodes' logs); under Slurm set --ntasks-per-node to the "
        "GPUs per node.",
        "Check MASTER_ADDR/MASTER_PORT are the same on every node and reachable from each.",
    ),
)

LOCAL_INTERFACE = Rule(
    code="INF239",
    kind="nccl-socket-interface",
    title="Start-up stopped across nodes while NCCL used a local or virtual network interface",
    signatures=(),
    explanation=Explanation(
        what="The job spans nodes, its output stops during distributed start-up with no "
        "error, and NCCL's own lines show its bootstrap or socket transport using the "
        "loopback, a container's or a bridge's virtual interface (veth, docker, br-, cni, "
        "flannel) or a link-local address (fe80::, 169.254.) among its interfaces.",
        why="NCCL advertises the addresses of the interfaces it picked to the other nodes; one "
        "that only exists on this host (127.0.0.1, a bridge, a link-local IPv6 address) cannot "
        "be reached from them, and the connection waits until the timeout. Containers and "
        "Kubernetes pods add such interfaces; NCCL picks them when NCCL_SOCKET_IFNAME does not "
        "name the node's real one.",
        fix="Set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the interface every node "
        "reaches the others on (ens5, eth0, bond0, ib0), the same name on every node; or "
        "exclude the others (NCCL_SOCKET_IFNAME=^lo,docker,veth).",
        false_positives="NCCL lists such interfaces on hosts where the real one also works; "
        "the hang may then be elsewhere (a firewall, a rank that never started).",
    ),
    fix=(
        "export NCCL_SOCKET_IFNAME=<the node's real interface: ens5, eth0, bond0, ib0> (the "
        "same on every node; `ip -br addr` shows them) and GLOO_SOCKET_IFNAME likewise; or "
        "exclude the local ones: NCCL_SOCKET_IFNAME=^lo,docker,veth,br-.",
        "Re-run with NCCL_DEBUG=INFO: the 'Bootstrap : Using' and 'NET/Socket : Using' lines "
        "must name that interface only.",
    ),
)

JOINING = re.compile(
    r"Initializing distributed: GLOBAL_RANK|initializing ddp: GLOBAL_RANK"
    r"|Initializing TorchBackend in DeepSpeed|Rendezvous'ing worker group"
    r"|Waiting in store based barrier"
)
"""What a rank (or launcher) says just before it waits for the other members: Lightning
(strategies/ddp.py), DeepSpeed (comm.py init_distributed), torchelastic's agent, c10d's store
barrier (census)."""


def assess(job: JobEvidence) -> Assessment | None:
    if not job.stalled_at_startup or job.echoes or job.failing_exits:
        return None
    if job.job_exit_code not in (None, 0):
        return None
    joining = [w for w in job.last_words if JOINING.search(w.text)]
    if joining and len(joining) == len(job.last_words):
        return _joining(job, joining)
    if not job.single_node and job.local_ifaces:
        return _local_interface(job)
    # broken peer-to-peer only where NCCL's own lines show it connecting GPUs that way
    p2p = job.single_node and "p2p" in job.transports
    return Assessment(
        RULE if p2p else HANG,
        0.3,
        [],
        [
            "the output stops during distributed start-up: no error, no training step, no "
            "exit."
            + (
                " NCCL connected the GPUs peer-to-peer on one node and nothing followed: "
                "broken GPU peer-to-peer is the classic cause."
                if p2p
                else " Nothing says where it waited: a rank that never arrived, or NCCL "
                "connecting the GPUs (peer-to-peer inside a node, the network across nodes)."
            )
        ],
        # where start-up stopped is not known: the transport bisection comes first
        fix=[] if p2p else list(RULE.fix),
        next_steps=[
            "Re-run with NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1; or run `ddpdoctor check "
            "--nproc-per-node N` on the node.",
        ],
        status=Status.HUNG,
        category=str(Category.UNKNOWN),
        explains_echoes=False,
    )


def _joining(job: JobEvidence, joining: list[Evidence]) -> Assessment:
    world = f" (a world of {job.world_size})" if job.world_size else ""
    # the ranks of that world that never said a word: the members that did not arrive
    # (a few, among many that came: when most are absent, the count itself is wrong)
    present = {r for r, v in job.ranks.items() if v.present}
    absent = sorted(job.missing) if job.world_size and len(job.missing) < len(present) else []
    named = (
        f" {ranks_text(absent)} of that world never announced itself: "
        + ("it is" if len(absent) == 1 else "they are")
        + " the member the others waited for."
        if absent
        else ""
    )
    return Assessment(
        RENDEZVOUS,
        0.4,
        absent,
        [
            f"the output stops while the ranks announce that they join the process group{world}, "
            "and no line says the group formed (no step, no error, no exit). The "
            "rendezvous was waiting for members that never arrived." + named
        ],
        evidence=joining[:4],
        next_steps=[
            "Check that every node started and with the same world size and MASTER_ADDR; "
            "read the other nodes' logs."
        ],
        status=Status.HUNG,
        explains_echoes=False,
    )


def _local_interface(job: JobEvidence) -> Assessment:
    """Across nodes, NCCL's interfaces include one the other nodes cannot reach."""
    return Assessment(
        LOCAL_INTERFACE,
        0.45,
        [],
        [
            "the output stops during distributed start-up across nodes, with no error, and "
            "NCCL's own lines show it using a loopback, virtual or link-local interface that "
            "the other nodes cannot reach."
        ],
        evidence=job.local_ifaces[:2],
        status=Status.HUNG,
        category=str(Category.CONFIGURATION),
        explains_echoes=False,
    )
