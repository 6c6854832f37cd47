"""Transport errors between ranks: peers that vanished (gloo/NCCL sockets), InfiniBand and
peer-to-peer faults, socket interface selection. Whether a closed connection is a network fault
or a dead peer is decided in analysis, not here."""

from __future__ import annotations

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Echo, Explanation, Rule, Signature

BISECTION_FIX = (
    "Bisect the transport: rerun with NCCL_IB_DISABLE=1; if it still fails, also "
    "NCCL_P2P_DISABLE=1 (`ddpdoctor check --nproc-per-node N` does this for you).",
    "If NCCL_P2P_DISABLE=1 fixes it: check `nvidia-smi topo -m` (NVLink/PCIe paths), ACS and "
    "IOMMU settings, and the driver version.",
    "If NCCL_IB_DISABLE=1 fixes it: check the IB NICs (ibstat, link state), `ulimit -l` "
    "(memlock) and set NCCL_SOCKET_IFNAME / NCCL_IB_HCA to the right devices.",
)

LOCAL_PIPE_FRAMES = (
    r'[/\\]multiprocessing[/\\](?:connection|resource_sharer)\.py", line \d{1,6}, in '
    r"_?(?:recv|send|get)"
)
"""A frame of multiprocessing's pipe to a child process, receiving or sending."""

PEER_CLOSED = Rule(
    code="NET101",
    kind="nccl-network",
    title="Connection to a peer rank closed or reset",
    sources="gloo/transport/tcp/pair.cc, NCCL socket.cc, ProcessGroupNCCL service thread",
    echo=Echo.LOST_PEER,
    specificity=20,
    signatures=(
        # a rank waiting for rank 0 to publish the NCCL id in the store: rank 0 is gone or late
        Signature(
            r"retrieving ncclUniqueId from \[(?P<missing>\d{1,7})\] via c10d key-value store",
            "retrieving ncclUniqueId",
        ),
        Signature(r"Connection closed by remote peer"),
        Signature(r"Connection closed by peer"),
        Signature(r"Connection reset by peer"),
        Signature(
            r"Connection closed by localRank (?P<peer_local_rank>\d+)",
            "Connection closed by localRank",
        ),
        Signature(r"remote process exited or there was a network error"),
        Signature(r"ncclRemoteError"),
        Signature(r"Broken pipe"),
        # NCCL proxy.cc: this rank's proxy could not reach a peer's proxy thread (it died, or
        # the path to it is down): "Proxy Call to rank 3 failed (Connect)"
        Signature(r"Proxy Call to rank (?P<missing>\d{1,7}) failed \(", "Proxy Call to rank"),
        # gloo transport/tcp/pair.cc and pair.h: a socket gone during connect, handshake or
        # after an earlier failure; ProcessGroupGloo.cpp: the mesh could not form at init
        Signature(r"Socket unexpectedly closed \[", "Socket unexpectedly closed"),
        Signature(r"\] Socket closed \[", "Socket closed ["),
        Signature(r"\] Connect timeout \[", "Connect timeout ["),
        Signature(r"Gloo connectFullMesh failed"),
        # NCCL misc/socket.cc: a connect() of the bootstrap or socket transport aborted
        # (ECONNABORTED: the connection was torn down on the way, by the peer or the network)
        Signature(
            r"Connect to \S+ failed : Software caused connection abort",
            "Software caused connection abort",
        ),
        # NCCL transport/net_socket.cc: the socket transport failed mid-collective
        Signature(r"NET/Socket : socket progress error"),
        # Horovod (horovod.torch as well): a collective after a peer raised or finished
        Signature(r"Horovod has been shut down\. This was caused by", "Horovod has been shut down"),
    ),
    # not Python's own socket errors on a multiprocessing pipe to a child process of the rank
    # (a vectorised environment's worker, a Pool's, a DataLoader's: DL103): the child died,
    # no peer rank was lost
    context_none=(LOCAL_PIPE_FRAMES,),
    explanation=Explanation(
        what="A rank lost its TCP/NCCL connection to a peer.",
        why="Nearly always because the peer process died or exited (an error, an OOM kill, "
        "an early sys.exit). Only when every peer is alive is it a network fault.",
        fix="Find the peer that died first: its last lines hold the cause. If all ranks were "
        "alive, bisect the transport.",
        false_positives="The same text appears for a crashed peer and for a real network fault.",
    ),
    fix=(
        "Read the logs of every rank: the rank that stopped first is the cause.",
        *BISECTION_FIX,
    ),
    positive=(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer [127.0.0.1]:23456",
        "socketProgressOpt: Call to recv from 10.20.0.4<33759> failed : Connection reset by peer",
        "gpu-7:1234:1300 [3] proxy.cc:1533 NCCL WARN Proxy Call to rank 3 failed (Connect)",
    ),
    negative=("NCCL INFO Connected all rings",),
)

_NOT_RETRY_EXCEEDED = (
    r"(?! ?: ?Got completion (?:from peer \S+ )?with (?:error |status=)(?:12|13\b|IBV_WC_\w*RETRY))"
)
"""Completion status 12/13 (retries exceeded) is NET107's: a path that may be configuration."""

_NOT_RETRYING = r"(?![^\n]{0,200}, retrying \d{1,3}/\d{1,3} after)"
"""Not NCCL's INFO line of a verbs call it retries (misc/ibvwrap.cc): only the last try fails."""

IB_ERROR = Rule(
    code="NET102",
    kind="nccl-network",
    title="InfiniBand / RoCE transport error",
    sources="NCCL net_ib.cc",
    proves_infrastructure=True,
    specificity=70,
    signatures=(
        # the IB transport's own faults (census nccl-warn-ib-*, nccl-warn-ibv-*): a port that
        # went down (of the non-fatal events only that one: a GID or LID change is no fault), a
        # fatal event on a QP or CQ, a verb that failed
        Signature(
            r"NET/IB : \S{1,80} (?:Got non-fatal async event: port error|async fatal event on "
            r"(?:QP|CQ|SRQ))",
            "async",
        ),
        # net_ib/common.cc (NCCL >= 2.23): every call after such a fatal async event fails with
        # this line (census nccl-warn-ib-fatal-error-detected)
        Signature(
            r"communicator encountered a fatal error \(detected in ",
            "communicator encountered a fatal error",
        ),
        # not the INFO line of a call NCCL retries (misc/ibvwrap.cc, NCCL >= 2.24: 'Call to
        # ibv_modify_qp failed with 110 ..., retrying 1/7 after 250 msec of sleep'; census
        # nccl-info-modify-qp-retrying): only its final WARN is a failure
        Signature(r"Call to ibv_\w{1,40} failed" + _NOT_RETRYING, "Call to ibv_"),
        # NICs of different link types or counts paired across ranks: the selection of HCAs,
        # a configuration (capture_category below), not a fault of the fabric
        # (NCCL >= 2.26 also says it while merging NICs and from the remote side: census
        # nccl-warn-ib-merge-incompatible, nccl-warn-ib-remote-incompatible)
        Signature(
            r"NET/IB : (?P<what>Attempted to (?:connect|merge) incompatible devices|Local "
            r"mergedDev=|Remote \S{1,20} device is incompatible)"
            r"(?:\S{1,200} has a different number of devices)?",
            "NET/IB : ",
        ),
        Signature(r"ibv_poll_cq.{0,80}(?:failed|error)", "ibv_poll_cq"),
        # net_ib.cc's size check of a receive ('NET/IB : collective mismatch error local size
        # ...' up to NCCL 2.12.7; 'NET/IB : req 0/1 tag 0 peer 10.0.0.9<47129> collective
        # mismatch error, local size ... remote size ...' in 2.12.10-2.19): NCCL's comment says
        # it catches the program's collectives of different sizes; the reports were fixed on the
        # network side. Either way no proof of a faulty fabric (capture_category below)
        Signature(
            r"NET/IB : (?:req \d{1,4}/\d{1,4} tag \w{1,12} peer \S{1,80} )?"
            r"(?P<what>collective mismatch error)",
            "collective mismatch error",
        ),
        # net_ib/p2p.cc: the peer's receive descriptor arrived empty (census
        # nccl-warn-ib-incorrect-receive-info); like the size check above, no proof of a fault
        Signature(
            r"NET/IB : req \d{1,4}/\d{1,4} tag \w{1,12} peer \S{1,80} "
            r"(?P<what>posted incorrect receive info)",
            "posted incorrect receive info",
        ),
        Signature(r"local catastrophic error"),
        # (the GPU-initiated path of NCCL >= 2.28 prints 'NET/IB/GIN: Got completion ...')
        Signature(
            r"NET/IB(?:/GIN)?" + _NOT_RETRY_EXCEEDED + r" ?: Got completion from peer",
            "Got completion from peer",
        ),
        # aws-ofi-nccl (EFA and other libfabric providers): a completion with an error
        Signature(r"NET/OFI Request \S+ completed with error", "completed with error"),
        Signature(
            r"NET/IB" + _NOT_RETRY_EXCEEDED + r".{0,40}(?:ibv_\w+ failed|Unable to|error)", "NET/IB"
        ),
        # a verbs call that could not pin memory (ENOMEM): the locked-memory limit (ulimit
        # -l, a container's memlock), as the rule's own false positives say, not the fabric
        Signature(
            r"(?:ibv_reg_mr|ibv_create_cq)\w{0,10} failed with error (?P<what>Cannot allocate memory)",
            "failed with error Cannot allocate memory",
        ),
        Signature(r"ibv_reg_mr.{0,80}failed|ibv_create_qp.{0,80}failed", "ibv_"),
        # NCCL misc/ibvwrap.cc: a QP could not be moved to RTR/RTS (RoCE GID index, cabling)
        Signature(r"Call to ibv_modify_qp failed" + _NOT_RETRYING, "Call to ibv_modify_qp failed"),
    ),
    explanation=Explanation(
        what="NCCL's InfiniBand transport reported a completion error or a failed verbs call.",
        why="A faulty cable, switch port or NIC, a link flapping, a too small memlock limit "
        "(ibv_reg_mr), or mismatched IB configuration across nodes.",
        fix="Identify the host pair in the message, check `ibstat`/link counters on both, raise "
        "`ulimit -l` to unlimited, and test with NCCL_IB_DISABLE=1 to confirm.",
        false_positives="ibv_reg_mr failures are configuration (memlock), not hardware.",
    ),
    fix=BISECTION_FIX,
    capture_fix=(
        (
            "what",
            r"Attempted to (?:connect|merge) incompatible devices|Local mergedDev=|Remote \S{1,20} device "
            r"is incompatible",
            "Give every rank NICs of one link type and count: list them in NCCL_IB_HCA (e.g. "
            "NCCL_IB_HCA=mlx5_0,mlx5_1), the same on every node.",
        ),
        (
            "what",
            "Cannot allocate memory",
            "The verbs call could not pin memory: raise the locked-memory limit to unlimited "
            "(`ulimit -l unlimited` in the job's shell, /etc/security/limits.conf memlock, "
            "docker run --ulimit memlock=-1, Slurm PropagateResourceLimits) and check it inside "
            "the job with `ulimit -l`.",
        ),
        (
            "what",
            "collective mismatch error",
            "A peer sent more bytes than this rank's receive expected: check that every rank "
            "issues the same collectives with the same sizes (TORCH_DISTRIBUTED_DEBUG=DETAIL), "
            "then bisect the transport (NCCL_IB_DISABLE=1; the same on every node).",
        ),
    ),
    capture_category=(
        (
            "what",
            r"Attempted to (?:connect|merge) incompatible devices|Local mergedDev=|Remote \S{1,20} device "
            r"is incompatible",
            Category.CONFIGURATION,
        ),
        ("what", "collective mismatch error|posted incorrect receive info", Category.UNKNOWN),
        ("what", "Cannot allocate memory", Category.ENVIRONMENT),
    ),
    positive=(
        "gpu-a7:31415:31502 [3] transport/net_ib/connect.cc:1034 NCCL WARN NET/IB : "
        "Remote RoCE device is incompatible with the local [0]mlx5_0:1/IB. Try "
        "selecting NICs of only one link type using NCCL_IB_HCA",
        "gpu-a7:31415:31502 [3] transport/net_ib/common.cc:32 NCCL WARN communicator "
        "encountered a fatal error (detected in ncclIbTest)",
        "gpu-a7:31415:31502 [3] transport/net_ib/common.cc:150 NCCL WARN NET/IB : "
        "mlx5_0:1 async fatal event on SRQ, unused for now (0x7f3a2c001a40): SRQ "
        "catastrophic error",
        "gpu-n3:2291:2384 [3] NCCL INFO NET/IB : mlx5_0:1 Got non-fatal async event: port "
        "error(10)",
        "gpu-n3:2291:2384 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 peer "
        "10.0.0.9<47129> collective mismatch error, local size 501760 remote size 65536",
        "gpu-n3:2291:2384 [3] misc/ibvwrap.cc:42 NCCL WARN Call to ibv_create_cq failed with error "
        "Cannot allocate memory",
        "gpu-n3:2291:2384 [3] NCCL WARN NET/IB : Attempted to connect incompatible devices: "
        "[0]mlx5_0:1/IB and [0]mlx5_4:1/RoCE.",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.5<42115> with error 5, opcode 0, "
        "len 0, vendor err 249",
        "node07:2291:2384 [3] transport/net_ib/common.cc:120 NCCL WARN NET/IB : mlx5_0:1 async "
        "fatal event: local catastrophic error",
    ),
    negative=(
        "gpu-a7:31415:31415 [3] NCCL INFO Call to ibv_modify_qp failed with 110 "
        "Connection timed out, RTR, retrying 1/7 after 250 msec of sleep",
        "gpu-n3:2291:2384 [3] NCCL INFO NET/IB : mlx5_0:1 Got non-fatal async event: GID table "
        "change(18)",
        "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.5<0>",
    ),
)

IB_RETRY_EXCEEDED = Rule(
    code="NET107",
    kind="nccl-network",
    title="InfiniBand / RoCE sends were never acknowledged (retry counter exceeded)",
    # the path between two NICs: a RoCE setting as often as a fault; the logs cannot tell
    category=Category.UNKNOWN,
    sources="NCCL net_ib.cc / net_ib/p2p.cc (ibv_poll_cq completion status 12, 13)",
    specificity=65,  # a port event or a catastrophic error beside it (NET102) says more
    signatures=(
        # status 12 is IBV_WC_RETRY_EXC_ERR, 13 IBV_WC_RNR_RETRY_EXC_ERR, in every NCCL wording:
        # "with error 12, opcode", "from peer X with error 12", "with status=12 opcode=0",
        # "with status=IBV_WC_RETRY_EXC_ERR(12)"
        # (and the GPU-initiated path's 'NET/IB/GIN: Got completion ...', NCCL >= 2.28: census
        # nccl-warn-ib-gin-completion)
        Signature(
            r"NET/IB(?:/GIN)? ?: ?Got completion (?:from peer \S+ )?with (?:error |status=)"
            r"(?:12|13)\b",
            "Got completion ",
        ),
        Signature(r"IBV_WC_(?:RNR_)?RETRY_EXC_ERR", "RETRY_EXC_ERR"),
        Signature(r"transport retry counter exceeded"),
    ),
    explanation=Explanation(
        what="NCCL's InfiniBand/RoCE transport gave up on a send that the peer's NIC never "
        "acknowledged (completion status 12: transport retries exceeded; 13: receiver not "
        "ready).",
        why="The two NICs cannot reach each other over RDMA although the TCP bootstrap worked. "
        "On RoCE this is most often configuration: NCCL picked a GID index (RoCE v1 vs v2, "
        "IPv4 vs IPv6) or traffic class the switches do not route, or PFC/ECN is missing; on "
        "InfiniBand a link, cable or port is down or flapping. When it happens at the first "
        "collective it is the path, not load.",
        fix="Test RDMA between the two hosts (ib_write_bw from perftest) with the GID index "
        "NCCL uses; on RoCE set NCCL_IB_GID_INDEX (show_gids lists the RoCE v2 entry, often 3) "
        "and the same NCCL_IB_TC on every node; check ibstat and the port error counters.",
        false_positives="A peer process that died mid-transfer can leave its partner with "
        "status 12 too: check that every rank was alive.",
    ),
    fix=(
        "On RoCE: set NCCL_IB_GID_INDEX to the RoCE v2 GID (show_gids, often 3) and the same "
        "NCCL_IB_TC on every node; check PFC/ECN on the switches.",
        "Test RDMA between the two hosts with ib_write_bw (perftest) using that GID index; "
        "check `ibstat` and the port error counters; NCCL_IB_DISABLE=1 confirms it is the RDMA "
        "path.",
    ),
    positive=(
        "gpu-a7:31415:31502 [3] transport/net_ib/gin.cc:749 NCCL WARN NET/IB/GIN: Got "
        "completion from peer 10.12.0.21<54132> with status=12 opcode=1 len=0 vendor "
        "err 129 (Put) hca mlx5_0",
        "trn-worker-1:2317:2359 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion "
        "with error 12, opcode 1, len 0, vendor err 129",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.5<42115> with error 12, opcode 0, "
        "len 0, vendor err 129",
    ),
    negative=(
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.5<42115> with error 5, opcode 0, "
        "len 0, vendor err 249",
    ),
)

P2P_ERROR = Rule(
    code="NET103",
    kind="nccl-p2p",
    title="GPU peer-to-peer / IPC transport failure inside a node",
    sources="NCCL transport/p2p.cc, CUDA runtime",
    proves_infrastructure=True,
    split_gpus_configure=True,
    specificity=70,
    signatures=(
        # Accelerate refusing P2P/IB on RTX 40xx cards without NCCL_P2P_DISABLE (census
        # accelerate-rtx4000-p2p): the peer-to-peer path those cards lack, a setting to make
        # (capture_category below), not a fault of the node
        Signature(
            r"Using (?P<what>RTX 4000 series) doesn't support faster communication broadband "
            r"via P2P or IB",
            "RTX 4000 series doesn't support",
        ),
        # not an allocation that ran out of memory there (NCCL's "Cuda failure 'out of
        # memory'" while the P2P transport allocates its buffers: an OOM)
        Signature(r"transport/p2p\.cc:\d+ NCCL WARN(?! Cuda failure 'out of memory')", "p2p.cc"),
        Signature(r"peer access is not supported between these two devices"),
        # cudaErrorTooManyPeers (60): one process mapped more peer GPUs than the driver allows
        # (8): nn.DataParallel or one process over more than 8 GPUs
        Signature(r"(?P<what>peer mapping resources exhausted)", "peer mapping resources"),
        Signature(r"cudaIpcOpenMemHandle"),
        Signature(r"P2P/IPC.{0,60}(?:failed|error)", "P2P/IPC"),
        # NCCL's topology and NVML checks of P2P between a node's GPUs, and the CUDA runtime's
        # error for a peer copy without peer access (census nccl-warn-p2p-disabled-nvlink,
        # nccl-warn-no-transport, nccl-warn-nvml-p2p-status, cuda-err-peer-access-not-enabled)
        Signature(r"P2P is disabled between NVLINK connected GPUs", "P2P is disabled between"),
        Signature(r"NCCL WARN No transport found for rank", "No transport found for rank"),
        Signature(r"nvmlDeviceGetP2PStatus\(.{1,60}\) failed", "nvmlDeviceGetP2PStatus("),
        Signature(r"CUDA error: peer access has not been enabled", "peer access has not been"),
    ),
    explanation=Explanation(
        what="NCCL could not use direct GPU-to-GPU copies (P2P/NVLink/IPC) inside a node.",
        why="ACS or IOMMU enabled on the PCIe switches, a driver regression, GPUs split across "
        "containers, or broken NVLink.",
        fix="Confirm with NCCL_P2P_DISABLE=1; check `nvidia-smi topo -m`, disable ACS / set "
        "iommu=pt, update or roll back the driver.",
        false_positives="Accelerate's refusal on RTX 40xx cards is a setting the cards need, "
        "not a fault (its category is configuration).",
    ),
    fix=BISECTION_FIX,
    capture_fix=(
        (
            "what",
            "RTX 4000 series",
            "Set NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 before launching (GeForce RTX 40xx "
            "cards have no peer-to-peer path; `accelerate launch` sets both itself, torchrun "
            "and deepspeed do not).",
        ),
        (
            "what",
            "peer mapping resources exhausted",
            "One process drives more GPUs than it may map as peers (8): give each process at "
            "most 8 GPUs (CUDA_VISIBLE_DEVICES), or use DistributedDataParallel with one "
            "process per GPU instead of nn.DataParallel over all of them.",
        ),
    ),
    capture_category=(
        ("what", "RTX 4000 series", Category.CONFIGURATION),
        ("what", "peer mapping resources exhausted", Category.CONFIGURATION),
    ),
    positive=(
        "NotImplementedError: Using RTX 4000 series doesn't support faster communication "
        'broadband via P2P or IB. Please set `NCCL_P2P_DISABLE="1"` and `NCCL_IB_DISABLE="1"',
        "NCCL WARN Cuda failure 'peer access is not supported between these two devices'",
        "RuntimeError: cuda runtime error (60) : peer mapping resources exhausted at "
        "/pytorch/aten/src/THC/THCGeneral.cpp:141",
    ),
    negative=("NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC",),
)

SOCKET_INTERFACE = Rule(
    code="NET104",
    kind="nccl-socket-interface",
    title="No usable network interface for NCCL / gloo",
    sources="NCCL bootstrap.cc / socket.cc, gloo/transport/tcp/device.cc",
    specificity=70,
    signatures=(
        # no interface NCCL could use: the IB transport's IP interface, the socket transport's,
        # the out-of-band one asked for by name (census nccl-warn-ib-no-ip-if, -net-socket-no-if,
        # -oob-ifname)
        Signature(r"NET/IB : No IP interface found", "No IP interface found"),
        Signature(r"NET/Socket : no interface found", "NET/Socket : no interface found"),
        Signature(
            r"no device found (?:matching|after excluding) \S{1,80}, verify NCCL_OOB_NET_IFNAME",
            "verify NCCL_OOB_NET_IFNAME",
        ),
        # gloo's TCP device given an empty interface or host name (GLOO_SOCKET_IFNAME="", a
        # hostname that resolves to nothing: census gloo-tcp-device-empty-host)
        Signature(
            r"GlooDeviceFactory::makeTCPDevice\(\): interface or hostname can't be empty",
            "interface or hostname can't be empty",
        ),
        Signature(r"no socket interface found"),
        Signature(r"Unable to find address for: ?(?P<ifname>\S+)", "Unable to find address for"),
        Signature(r"neither AF_INET"),
        Signature(r"ifa != nullptr"),
        Signature(r"No usable listening interface found"),
        # NCCL misc/socket.cc: a socket of the chosen interface's address family cannot be
        # created (no IP interface at all, or IPv6 picked on a host without it)
        Signature(
            r"Socket creation failed : Address family not supported", "Socket creation failed"
        ),
        # gloo/transport/tcp/device.cc (Device::connect / isInitiator): GLOO_ENFORCE_EQ of the
        # pair's two address families: one rank advertised an IPv4 address (2, AF_INET) and
        # its peer an IPv6 one (10, AF_INET6): the nodes resolved or picked different kinds of
        # interface (a hostname with only an IPv6 record on one node)
        Signature(r"ss1\.ss_family == ss2\.ss_family", "ss_family == ss2.ss_family"),
    ),
    explanation=Explanation(
        what="NCCL or gloo could not find the network interface it was told to use, or the "
        "ranks picked interfaces of different address families (IPv4 on one node, IPv6 on "
        "another).",
        why="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names an interface that does not exist on "
        "this node (names differ between nodes: eth0 vs eno1), or no interface is up; or the "
        "nodes resolved their addresses differently (one to IPv4, one to IPv6), which gloo "
        "refuses when it pairs them.",
        fix="List interfaces with `ip -br addr` on every node and set NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME to one that exists everywhere (comma list or prefix, e.g. `eno,eth`); "
        "`lo` only works on a single node.",
        false_positives="None known.",
    ),
    fix=(
        "Run `ip -br addr` on every node; set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to an "
        "interface that exists on all of them, e.g. NCCL_SOCKET_IFNAME=eth0,eno1 or a prefix.",
        "Or unset it and let NCCL choose; `ddpdoctor check` tries each interface for you.",
        "'Address family not supported': the node has no usable IP interface, or NCCL picked "
        "an IPv6 one the host cannot use: check `ip -br addr`, set NCCL_SOCKET_IFNAME, or "
        "NCCL_SOCKET_FAMILY=AF_INET.",
        "gloo's 'ss1.ss_family == ss2.ss_family. 2 vs 10': one node's address is IPv4, the "
        "other's IPv6: set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to IPv4 interfaces on "
        "every node, or make the master's hostname resolve to the same kind of address "
        "everywhere (getent ahosts HOST).",
    ),
    positive=(
        "gpu-a7:31415:31502 [3] bootstrap.cc:579 NCCL WARN no device found after "
        "excluding ib0,docker0, verify NCCL_OOB_NET_IFNAME",
        "gpu-n7:2291:2384 [3] transport/net_ib/init.cc:307 NCCL WARN NET/IB : No IP interface found.",
        "gpu-n7:2291:2384 [3] bootstrap.cc:577 NCCL WARN no device found matching ib0, verify "
        "NCCL_OOB_NET_IFNAME",
        "RuntimeError: GlooDeviceFactory::makeTCPDevice(): interface or hostname can't be empty",
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] "
        "ifa != nullptr. Unable to find address for: eth7",
        "NCCL WARN Bootstrap : no socket interface found",
        "include/socket.h:344 WARN Socket creation failed : Address family not supported by "
        "protocol",
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:276] "
        "ss1.ss_family == ss2.ss_family. 2 vs 10",
    ),
    negative=(
        "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>",
        "op.preamble.length <= op.nbytes. 16548 vs 16",
        "misc/socket.cc:480 NCCL WARN Socket creation failed : Too many open files",
    ),
)

NCCL_SYSTEM_ERROR = Rule(
    code="NET105",
    kind="nccl-socket-interface",
    title="NCCL 'unhandled system error' (a socket, shm or sysfs call failed)",
    sources="ProcessGroupNCCL.cpp C10D_NCCL_CHECK, NCCL ncclSystemError",
    specificity=40,
    signatures=(
        # a connect NCCL gave up on after its retries or timeouts (census
        # nccl-warn-start-connect-retries, -timeouts)
        Signature(
            r"socketStartConnect: exceeded (?:retries|timeouts) \(\d{1,9}\)",
            "socketStartConnect: exceeded",
        ),
        # a connect() of NCCL's bootstrap or socket transport failed: often the wrong interface
        Signature(
            r"NCCL WARN.{0,120}(?:No route to host|Connection refused|Network is unreachable)",
            "NCCL WARN",
        ),
        Signature(r"unhandled system error"),
        Signature(r"ncclSystemError"),
    ),
    explanation=Explanation(
        what="An NCCL call failed because a system call failed; most often while NCCL "
        "connects ranks (socket interface selection) and sometimes shared memory in containers.",
        why="Nodes pick different or unreachable interfaces (NCCL_SOCKET_IFNAME naming `lo` or "
        "an interface missing on one node), a firewall, or /dev/shm too small in a container.",
        fix="Re-run with NCCL_DEBUG=INFO to see the failing call; set NCCL_SOCKET_IFNAME to an "
        "interface every node has; in containers give /dev/shm room (--shm-size / --ipc=host).",
        false_positives="The same code covers other system-call failures; NCCL_DEBUG=INFO says which.",
    ),
    fix=(
        "Re-run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see the failing system call.",
        "Set NCCL_SOCKET_IFNAME to interfaces that exist on every node (e.g. eno1,eth0); never "
        "`lo` across nodes.",
        "In containers, enlarge /dev/shm (docker --shm-size=16g or --ipc=host).",
    ),
    positive=(
        "gpu-n7:2291:2384 [3] misc/socket.cc:467 NCCL WARN socketStartConnect: exceeded retries "
        "(20000)",
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, "
        "unhandled system error, NCCL version 2.4.8",
    ),
    negative=("NCCL error in: ProcessGroupNCCL.cpp:1691, invalid usage",),
)

NVLS_FAILED = Rule(
    code="NET109",
    kind="nccl-p2p",
    title="NVLink SHARP (NVLS) failed: the node's Fabric Manager or NVSwitches",
    sources="NCCL src/transport/nvls.cc (its WARN lines, cuMulticastBindMem)",
    category=Category.INFRASTRUCTURE,
    proves_infrastructure=True,
    specificity=70,
    signatures=(
        Signature(
            r"Failed to bind NVLink SHARP \(NVLS\) Multicast memory", "Failed to bind NVLink SHARP"
        ),
    ),
    explanation=Explanation(
        what="NCCL's NVLink SHARP transport (multicast memory on NVSwitch systems: H100/H200/"
        "B200 HGX, DGX) could not create or bind its buffers.",
        why="NVLS needs the node's Fabric Manager running and matching the driver, and healthy "
        "NVSwitches: a Fabric Manager that was stopped and restarted, failed to start, or runs "
        "another version leaves multicast unusable until the GPUs are reset; NCCL says so in "
        "its own message.",
        fix="Check `systemctl status nvidia-fabricmanager` and `nvidia-smi -q | grep -i -A2 "
        "fabric` on the node; after a Fabric Manager restart reset the GPUs or reboot. To run "
        "meanwhile: NCCL_NVLS_ENABLE=0.",
        false_positives="None known: the line comes from the NVLS transport itself.",
    ),
    fix=(
        "On the node: `systemctl status nvidia-fabricmanager` (running, same version as the "
        "driver) and `nvidia-smi -q | grep -i -A2 fabric` (state Completed); after a Fabric "
        "Manager restart, reset the GPUs (nvidia-smi -r) or reboot the node.",
        "To run meanwhile, disable NVLS: export NCCL_NVLS_ENABLE=0.",
    ),
    positive=(
        # corpus case 1351 (NCCL 2.29, H100 CI runners)
        "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 "
        "'the operation cannot be performed in the present state'.",
    ),
    negative=(
        "gpu-n07:30417:30417 [2] NCCL INFO NVLS multicast support is available on dev 2",
        "gpu-n07:30417:30460 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'",
    ),
)

NVLS_SETUP = Rule(
    code="NET111",
    kind="nccl-p2p",
    title="NVLink SHARP (NVLS) could not be set up: the driver or the Fabric Manager",
    sources="NCCL src/transport/nvls.cc (CUCHECK of cuMulticastCreate / AddDevice / map)",
    specificity=65,
    signatures=(
        # any CUDA failure NCCL reports from its NVLS transport ("transport/nvls.cc:244 NCCL
        # WARN Cuda failure 1 'invalid argument'"): the multicast objects NVSwitch systems
        # provide could not be made
        Signature(r"transport/nvls\.cc:\d+ NCCL WARN", "transport/nvls.cc:"),
    ),
    explanation=Explanation(
        what="A CUDA driver call of NCCL's NVLink SHARP transport (multicast objects on "
        "NVSwitch systems) failed while the communicator was set up.",
        why="The driver is older than what this NCCL's NVLS needs (a new NCCL in an old "
        "driver's container), or the node's Fabric Manager is not in a usable state (stopped, "
        "restarted without a GPU reset, another version than the driver).",
        fix="Compare the driver with the NCCL in use and upgrade the driver (or use an NCCL "
        "of the driver's era); check `systemctl status nvidia-fabricmanager`; "
        "NCCL_NVLS_ENABLE=0 avoids NVLS meanwhile.",
        false_positives="None known: the line comes from the NVLS transport itself.",
    ),
    fix=(
        "Check the driver against the NCCL in use (nvidia-smi; python -c 'import torch; "
        "print(torch.cuda.nccl.version())'): upgrade the driver, or use a PyTorch/NCCL built "
        "for it.",
        "Check the Fabric Manager: `systemctl status nvidia-fabricmanager` (running, the "
        "driver's version); after a restart of it, reset the GPUs or reboot the node.",
        "To run meanwhile, disable NVLS: export NCCL_NVLS_ENABLE=0.",
    ),
    positive=(
        # corpus cases 1357 (a Fabric Manager restarted) and 909 (NCCL 2.26, a 12.2 driver)
        "gpu-n07:30417:30460 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'",
    ),
    negative=("gpu-n07:30417:30417 [2] NCCL INFO NVLS multicast support is available on dev 2",),
)

NCCL_TOPOLOGY = Rule(
    code="NET110",
    kind="cuda-library-mismatch",
    title="NCCL could not make sense of the node's topology (an NCCL older than the hardware)",
    sources="NCCL src/graph/paths.cc, src/graph/topo.h (WARN, then ncclInternalError)",
    category=Category.ENVIRONMENT,
    specificity=70,
    signatures=(
        Signature(r"Failed to find reverse path from remNode", "Failed to find reverse path"),
        Signature(r"Could not find NET with id", "Could not find NET with id"),
    ),
    explanation=Explanation(
        what="NCCL's topology detection (GPUs, NICs, PCI switches, NVLink) found links it "
        "cannot follow, and init failed with an internal error.",
        why="An NCCL release older than the GPUs or NICs of the node (NCCL 2.14 on H100, an old "
        "container's NCCL on a new platform) misreads its topology; less often an "
        "NCCL_TOPO_FILE that does not describe this node, or a container that hides /sys.",
        fix="Use an NCCL that supports the hardware: a newer PyTorch wheel or container (its "
        "bundled nvidia-nccl), or LD_PRELOAD a newer libnccl; check NCCL_TOPO_FILE if set.",
        false_positives="A topology file written for another node type gives the same lines.",
    ),
    fix=(
        "Upgrade NCCL to a release that supports these GPUs and NICs (a newer container or "
        "PyTorch wheel, or pip install -U nvidia-nccl-cu12 with torch's matching CUDA): "
        "python -c 'import torch; print(torch.cuda.nccl.version())' shows the one in use.",
        "If NCCL_TOPO_FILE is set, check that it describes this node; in containers, mount "
        "/sys so NCCL can read the PCI topology.",
    ),
    positive=(
        # corpus case 1350 (NCCL 2.14.3 on H100)
        "Failed to find reverse path from remNode 0/61000 nlinks 4 to node 0/ca000",
        # corpus case 1055
        "graph/topo.h:230 NCCL WARN Could not find NET with id 0",
    ),
    negative=("NCCL INFO Connected all rings",),
)

NCCL_SHM_SEGMENT = Rule(
    code="NET106",
    kind="nccl-p2p",
    title="NCCL's shared-memory transport could not create its /dev/shm segment",
    sources="NCCL src/misc/shmutils.cc, src/include/shm.h (NCCL WARN, then ncclSystemError)",
    # the node's transport failed, but for the container's /dev/shm size: its environment
    category=Category.ENVIRONMENT,
    specificity=45,
    signatures=(
        # the segment could be created but not grown to its size: /dev/shm is full or too small
        # (census nccl-warn-shm-extend)
        Signature(
            r"failed to extend /dev/shm/\S{1,200} to \d{1,15} bytes", "failed to extend /dev/shm/"
        ),
        Signature(
            r"Error while (?:creating|attaching to) shared memory segment",
            "shared memory segment",
        ),
        # older NCCL (include/shm.h): the segment's file could not be given its size
        Signature(r"NCCL WARN Call to posix_fallocate failed", "Call to posix_fallocate failed"),
        # NCCL >= 2.22 (misc/shmutils.cc, os/linux.cc since 2.29): the segment's file could not
        # be created or mapped (census nccl-warn-shm-create-failed, nccl-warn-shm-map-failed)
        Signature(
            r"Error: failed to create shared memory file /dev/shm/\S{1,200}, error",
            "failed to create shared memory file",
        ),
        Signature(
            r"Error: Could not map /dev/shm/\S{1,200} size \d{1,15}", "Could not map /dev/shm/"
        ),
    ),
    explanation=Explanation(
        what="NCCL's intra-node transport (SHM, used between GPUs of one node without direct "
        "peer-to-peer) failed to create its buffers in /dev/shm; the collective then fails "
        "with 'unhandled system error'.",
        why="Containers start with a small /dev/shm (Docker's default is 64 MB; some CI "
        "runners give 16 MB): NCCL's segments for 8 GPUs do not fit.",
        fix="Give the container shared memory: docker run --shm-size=16g or --ipc=host "
        "(Kubernetes: an emptyDir volume with medium: Memory mounted on /dev/shm).",
        false_positives="A /dev/shm filled by something else (DataLoader workers, leftover "
        "segments of killed jobs): `df -h /dev/shm` says which.",
    ),
    fix=(
        "Run the container with --shm-size=16g (or --ipc=host); on Kubernetes mount an "
        "emptyDir {medium: Memory} volume at /dev/shm.",
        "Check `df -h /dev/shm` inside the container and remove stale nccl-* segments of "
        "killed jobs.",
        "If /dev/shm cannot be enlarged: NCCL_SHM_DISABLE=1 (NCCL then uses P2P or the "
        "network between the node's GPUs, slower).",
    ),
    positive=(
        "gpu-a7:31415:31502 [3] misc/shmutils.cc:80 NCCL WARN Error: failed to create "
        "shared memory file /dev/shm/nccl-XXXXXX, error Permission denied (13)",
        "gpu-n7:2291:2384 [3] misc/shmutils.cc:72 NCCL WARN Error: failed to extend "
        "/dev/shm/nccl-Yh3Kx1 to 9637892 bytes",
        "node07:2291:2384 [3] misc/shmutils.cc:113 NCCL WARN Error while creating shared "
        "memory segment /dev/shm/nccl-VEqvSO (size 9637888)",
        "4e9a7654171e:8639:8745 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed "
        ": No space left on device",
    ),
    negative=(
        "RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2>: No space "
        "left on device (28)",
    ),
)

NCCL_INTERNAL_ERROR = Rule(
    code="NET108",
    kind="nccl-network",
    title="NCCL reported an internal error (most often the network or topology at init)",
    sources="NCCL src/init.cc ncclGetErrorString (ncclInternalError, 2.3.5-2.30.7) via "
    "torch/csrc/distributed/c10d/NCCLUtils.hpp",
    specificity=40,
    signatures=(
        # the same ncclInternalError as torch printed it before NCCL 2.18's longer wording
        # (census nccl-result-internal-old)
        Signature(
            r"NCCL error in: [^\n]{0,400}?, internal error, NCCL version",
            "internal error, NCCL version",
        ),
        Signature(
            r"internal error - please report this issue to the NCCL developers",
            "internal error - please report this issue to the NCCL developers",
            suggests=True,
        ),
    ),
    explanation=Explanation(
        what="An NCCL call returned ncclInternalError.",
        why="Despite the wording, it is mostly the environment NCCL found at init: a network "
        "plugin or an IB/RoCE device that fails, a topology NCCL cannot use, mismatched NCCL "
        "versions across nodes; a real NCCL bug is rarer. The WARN lines NCCL prints before "
        "it (NCCL_DEBUG=WARN) say which.",
        fix="Re-run with NCCL_DEBUG=WARN (or INFO) and read the WARN line before the error; "
        "bisect the transport (NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1, NCCL_SOCKET_IFNAME).",
        false_positives="A genuine NCCL bug: the WARN line then names NCCL's own code.",
    ),
    fix=(
        "Re-run with NCCL_DEBUG=WARN and read the WARN line NCCL prints before this error.",
        "Check that every node runs the same NCCL (torch wheel), then bisect: "
        "NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1, NCCL_SOCKET_IFNAME=<interface>.",
    ),
    confirm="the WARN line NCCL prints before the error (NCCL_DEBUG=WARN): it names the "
    "network, topology or plugin call that failed",
    positive=(
        "RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1646755903507/work/torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:1169, internal error, NCCL version 2.10.3",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, internal error - please report this issue to the NCCL developers, "
        "NCCL version 2.20.5",
    ),
    negative=("NCCL INFO Using network Socket",),
)

NCCL_UDS_IPC = Rule(
    code="NET112",
    kind="nccl-p2p",
    title="NCCL's local socket between the ranks of a node failed (cuMem handle exchange)",
    sources="NCCL src/misc/ipcsocket.cc (UDS send, receive, bind)",
    category=Category.CONFIGURATION,
    specificity=80,
    signatures=(
        # the Unix-domain socket the ranks of one node pass their cuMem (P2P) memory handles
        # through: its errno names the system call's complaint (refused, in use), not a
        # network's (census nccl-warn-uds-send, nccl-warn-uds-bind)
        Signature(
            r"UDS: (?:Sending data over|Receiving data over|Binding to) socket \S{1,300} failed",
            "UDS: ",
        ),
        # the socket could not be created at all, and proxy.cc's call over it (NCCL >= 2.19,
        # 2.20: census nccl-warn-uds-socket-creation, nccl-warn-proxy-uds-call-failed)
        Signature(r"UDS: Socket creation error : ", "UDS: Socket creation error"),
        Signature(
            r"ncclProxyCallBlockingUDS call to tpRank \d{1,7}\(\w{1,20}\) failed",
            "ncclProxyCallBlockingUDS call to tpRank",
        ),
    ),
    explanation=Explanation(
        what="NCCL could not pass a GPU memory handle to another rank of the same node over its "
        "Unix-domain socket (the cuMem IPC path of the P2P transport).",
        why="The ranks of one node do not share what that socket needs: separate containers or "
        "network namespaces per rank, a private /tmp, an abstract socket name already bound by "
        "a stale process of an earlier job, or a seccomp/AppArmor profile that denies it.",
        fix="Run the node's ranks in one container (or share its IPC and network namespace); "
        "kill stale processes of earlier jobs; to get going, NCCL_CUMEM_ENABLE=0 or "
        "NCCL_P2P_DISABLE=1.",
        false_positives="None known: the line is NCCL's own.",
    ),
    fix=(
        "Run all ranks of a node in one container or pod (or share ipc/network namespaces: "
        "docker --ipc=host --network=host), and kill stale processes of earlier jobs.",
        "Meanwhile: NCCL_CUMEM_ENABLE=0 (no cuMem handles over the socket) or NCCL_P2P_DISABLE=1.",
    ),
    positive=(
        "gpu-a7:31415:31502 [3] proxy.cc:1275 NCCL WARN ncclProxyCallBlockingUDS call "
        "to tpRank 1(7a3c91f0e2b4d5c6) failed : 3",
        "gpu-n7:2291:2384 [3] misc/ipcsocket.cc:221 NCCL WARN UDS: Sending data over socket "
        "/tmp/nccl-socket-3-5f2a1c9e04b7d813 failed : Connection refused (111)",
        "gpu-n7:2291:2384 [0] misc/ipcsocket.cc:57 NCCL WARN UDS: Binding to socket "
        "/tmp/nccl-socket-0-9b1f3e6a22c4d001 failed : Address already in use (98)",
    ),
    negative=("gpu-n7:2291:2384 [3] NCCL INFO UDS: Creating socket /tmp/nccl-socket-3-5f2a",),
)

SOCKET_FALLBACK = Rule(
    code="NET113",
    kind="zero3-multinode-slow",
    title="NCCL found no InfiniBand/RoCE device and runs between nodes over TCP sockets",
    sources="NCCL src/transport/net_ib.cc ('NET/IB : No device found'), src/misc/ibvwrap.cc "
    "('Failed to open libibverbs.so'), src/transport/net_socket.cc ('NET/Socket : Using')",
    severity="info",
    # slow only where the traffic crosses nodes, or where the job meant to use IB
    applies=lambda job: _socket_instead_of_ib(job),
    specificity=12,
    signatures=(
        Signature(r"NET/IB : No device found", "NET/IB : No device found"),
        Signature(r"Failed to open libibverbs", "Failed to open libibverbs"),
    ),
    explanation=Explanation(
        what="NCCL could not use an RDMA device (its IB plugin found no device, or the "
        "libibverbs library is missing) and fell back to its TCP socket transport, while the "
        "job's traffic crosses nodes or the job named IB devices (NCCL_IB_HCA).",
        why="Across nodes every all-reduce or all-gather then goes through the kernel's TCP "
        "stack on one interface: a job that scales on InfiniBand/RoCE crawls (ZeRO-3 and FSDP "
        "full sharding worst, several times DDP's traffic), and long collectives may reach "
        "the timeout. Usual causes: the RDMA userspace (libibverbs, rdma-core, the mlx5 "
        "provider) not installed in the container, the IB devices not passed into it "
        "(/dev/infiniband), or NCCL_IB_HCA naming devices this node does not have.",
        fix="Make the RDMA devices usable where the job runs (install rdma-core/libibverbs, "
        "pass /dev/infiniband and IPC_LOCK into the container, check `ibv_devinfo`), then "
        "look for 'NET/IB : Using [0]mlx5_0:1/IB' in NCCL_DEBUG=INFO.",
        false_positives="Nodes without any RDMA fabric: sockets are then the only path, and the "
        "fix is fewer or larger collectives (ZeRO-2, hybrid sharding, gradient accumulation).",
    ),
    fix=(
        "Check the fabric from inside the job's environment: `ibv_devinfo` must list the "
        "HCAs (install rdma-core/libibverbs; in containers pass --device=/dev/infiniband "
        "--cap-add=IPC_LOCK); NCCL_DEBUG=INFO must then say 'NET/IB : Using [0]mlx5_0:1/IB'.",
        "Where the nodes have no RDMA fabric: keep the job in one node, or cut the traffic "
        "across nodes (ZeRO-2 or hybrid sharding: FSDP HYBRID_SHARD, DeepSpeed "
        "zero_hpz_partition_size; gradient accumulation).",
    ),
    positive=(
        "dl-node2:2210348:2210348 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open "
        "libibverbs.so[.1]",
        "gpu-a:1200:1200 [0] NCCL INFO NET/IB : No device found.",
    ),
    negative=(
        "gpu-a:1200:1200 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB "
        "ib0:10.1.0.5<0>",
        "NCCL INFO Using network Socket",
    ),
)


def _socket_instead_of_ib(job: JobEvidence) -> bool:
    """NCCL's net transport is sockets (no IB) and that costs: the traffic crosses nodes, or
    the job named IB devices it then did not get."""
    socket_only = "socket" in job.transports and "ib" not in job.transports
    # an interface the other nodes cannot reach is the nearer cause (INF239)
    return socket_only and (not job.single_node or job.ib_requested) and not job.local_ifaces


RULES = (
    PEER_CLOSED,
    NCCL_UDS_IPC,
    NCCL_INTERNAL_ERROR,
    IB_ERROR,
    IB_RETRY_EXCEEDED,
    P2P_ERROR,
    SOCKET_INTERFACE,
    NCCL_SYSTEM_ERROR,
    NCCL_SHM_SEGMENT,
    NVLS_FAILED,
    NVLS_SETUP,
    NCCL_TOPOLOGY,
    SOCKET_FALLBACK,
)
