"""Collective mismatches and timeouts (c10d ProcessGroupWrapper, ProcessGroupNCCL watchdog, gloo
transport). Timeouts are usually the echo of a failure elsewhere: the waiting rank was
alive (`Echo.WAITING`)."""

from __future__ import annotations

from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Echo, Explanation, Rule, Signature
from ddpdoctor.rules.frameworks import COLLECTIVE_IN_BRANCH_FIX

COLLECTIVE_MISMATCH = Rule(
    code="COL101",
    kind="collective-mismatch",
    title="Ranks called different collectives",
    sources="c10d ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL), gloo pair.cc",
    # the rank that runs out of batches first issues the next phase's collectives early
    symptom_of=("uneven-inputs",),
    signatures=(
        Signature(r"Detected mismatch between collectives on ranks"),
        # gloo/transport/tcp/pair.cc: shapes differ between ranks
        Signature(
            r"op\.preamble\.length <= op\.nbytes"
            r"(?:\. (?P<sent_bytes>\d{1,15}) vs (?P<expected_bytes>\d{1,15}))?",
            "op.preamble.length",
        ),
        Signature(r"Is there a distributed collective mismatch in your code"),
        # gloo/alltoallv.cc: all_to_all's split sizes disagree on this rank itself (what it
        # sends to itself is not what it expects from itself): the ranks computed their
        # split sizes differently
        Signature(
            r"inLengthPerRank\[myRank\] == outLengthPerRank\[myRank\]",
            "inLengthPerRank[myRank]",
        ),
        # FSDP's execution order check (torch/distributed/fsdp/_exec_order_utils.py, with
        # TORCH_DISTRIBUTED_DEBUG=DETAIL): ranks all-gather different modules' parameters
        Signature(
            r"Forward order differs across ranks: rank (?P<rank_a>\d+) is all-gathering",
            "Forward order differs across ranks",
        ),
        # NCCL transport/net_socket.cc: a peer sent more bytes than this rank expects
        Signature(
            r"message truncated : receiving (?P<sent_bytes>\d{1,15}) bytes instead of "
            r"(?P<expected_bytes>\d{1,15})",
            "message truncated : receiving",
        ),
        # NCCL bootstrap.cc / socket.cc: a peer's message of another size than this rank expects
        Signature(
            r"Message truncated : received \d+ bytes instead of \d+",
            "Message truncated : received",
        ),
        # accelerate utils/operations.py (ACCELERATE_DEBUG_MODE=1) compares shapes first
        Signature(r"Cannot apply desired operation due to shape mismatches"),
        # NCCL 2.4's own check (init.cc, a device-side assertion of the collective's
        # arguments): 'at and around rank N' is the rank that printed it
        Signature(
            r"NCCL WARN Mismatched collective detected, please check your collective calls",
            "Mismatched collective detected",
        ),
    ),
    explanation=Explanation(
        what="Two ranks issued collectives that do not match: another op, another shape or "
        "dtype, or a different sequence.",
        why="A collective inside a rank-dependent branch (if rank == 0: all_reduce), logging "
        "calls with sync_dist on different metric sets per rank, tensors of data-dependent "
        "size.",
        fix="Make every rank issue the same collectives in the same order with the same "
        "shapes; move rank-dependent work outside collectives; pad variable-size tensors.",
        false_positives="None for the DETAIL fingerprint message.",
    ),
    fix=(
        "Find the collective in a rank-dependent branch (if rank == 0 / if is_main_process) "
        "and call it on every rank.",
        "Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatches are then reported with the "
        "op, shape and rank instead of hanging.",
    ),
    framework_fix=COLLECTIVE_IN_BRANCH_FIX,
    positive=(
        "gpu-node3:1201:1290 [1] init.cc:1247 NCCL WARN Mismatched collective detected, please "
        "check your collective calls at and around rank 9. You can use NCCL_DEBUG=INFO and "
        "NCCL_DEBUG_SUBSYS=COLL to see the collective logs",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST",
        "RuntimeError: Forward order differs across ranks: rank 0 is all-gathering 5 parameters "
        "while rank 1 is all-gathering 4 parameters",
        "RuntimeError: [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/alltoallv.cc:"
        "138] inLengthPerRank[myRank] == outLengthPerRank[myRank]. ",
    ),
    negative=("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE",),
)

SAME_COLLECTIVES = (
    "If no rank failed or was busy: every rank must issue the same collectives in the same "
    "order. A rank with fewer batches leaves the loop first (DistributedSampler(..., "
    "drop_last=True), the same number of batches per rank, or `with ddp_model.join():`); a "
    "collective called on some ranks only (a metric, an evaluation or a save under `if rank "
    "== 0` / is_main_process, a barrier there) waits for ever: call it on every rank."
)
"""The two mistakes of the program's own behind a timeout that names no culprit (uneven inputs
and a rank-dependent collective), before the transport is suspected."""

SILENT_HANG_CAUSES = (
    "If it hangs: the program's own mistakes come first. A collective or barrier() on some "
    "ranks only (an evaluation, a save or a metric under `if rank == 0` / is_main_process), "
    "ranks with different numbers of batches (DistributedSampler(..., drop_last=True)), or "
    "every process on GPU 0 (torch.cuda.set_device(local_rank) before init_process_group) "
    "wait for ever without an error."
)
"""What makes a job wait silently, for the verdicts of a log that stops with no error."""

NCCL_WATCHDOG_TIMEOUT = Rule(
    code="TMO101",
    kind="nccl-timeout",
    title="Collective timed out (NCCL watchdog)",
    sources="ProcessGroupNCCL.cpp WorkNCCL::checkTimeout / watchdogHandler",
    echo=Echo.WAITING,
    specificity=20,
    signatures=(
        Signature(
            # torch < 1.12 prints no SeqNum: "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000)"
            # (a line cut by a paste keeps what it has: the op, maybe the timeout)
            r"Watchdog caught collective operation timeout: WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?"
            r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?(?:[^)]*?Timeout\(ms\)="
            r"(?P<timeout_ms>\d+))?(?:\) ran for (?P<ran_ms>\d+) milliseconds)?",
            "Watchdog caught collective operation timeout",
        ),
        # the same line cut short by a paste or a terminal: still a watchdog timeout
        Signature(r"Watchdog caught collective operation timeout"),
        # ... or wrapped there, and pasted from the line after its head: the timed-out work
        # alone at the start of a line, "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1,
        # NumelOut=1, Timeout(ms)=600000)", read only where its head is not just above
        Signature(
            r"^WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?"
            r"(?:[^)]*?Timeout\(ms\)=(?P<timeout_ms>\d+))?(?:\) ran for (?P<ran_ms>\d+))?",
            "WorkNCCL(",
            after_head="Watchdog caught collective operation timeout",
        ),
        Signature(r"Timeout at NCCL work: (?P<seq>\d+)", "Timeout at NCCL work"),
        # the watchdog's first line about a collective that timed out or failed (torch 2.4-2.5;
        # 'failure detected by watchdog at work sequence id: N PG status: ...' since 2.6): the
        # line beside it says which, and a more specific one wins the rank (census
        # pgnccl-exception-detected-by-watchdog, pgnccl-failure-detected-by-watchdog)
        Signature(
            r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d+)",
            "Exception (either an error or timeout) detected by watchdog",
        ),
        Signature(
            r"failure detected by watchdog at work sequence id: (?P<seq>\d+)",
            "failure detected by watchdog at work sequence id",
        ),
        # another rank's watchdog timed out and asked this one to dump its flight recorder
        # (ProcessGroupNCCL.cpp, torch >= 2.4): this rank is a bystander of that timeout
        Signature(
            r"Received a dump signal due to a collective timeout from\s+rank (?P<timeout_rank>\d+)",
            "Received a dump signal due to a collective timeout",
        ),
        # ... the line before it, which alone says only that another rank asked (torch >= 2.5)
        Signature(
            r"Observed flight recorder dump signal from another rank via TCPStore",
            "Observed flight recorder dump signal",
        ),
        # TORCH_NCCL_BLOCKING_WAIT=1 raises the timeout in the calling thread
        # (ProcessGroupNCCL.cpp WorkNCCL::synchronize)
        # (torch 2.x's other wording of it: "[Rank 1] Work WorkNCCL(SeqNum=2521, OpType=ALLREDUCE,
        # ...) timed out in blocking wait.")
        Signature(
            r"timed out in blocking wait(?: \(TORCH_NCCL_BLOCKING_WAIT=1\)|\.)",
            "timed out in blocking wait",
        ),
        # ... and torch 1.9-1.12's, raised by wait() in the calling thread: "RuntimeError:
        # [Rank 1] Caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST,
        # TensorShape=[], Timeout(ms)=10800000) ran for 10800027 milliseconds before timing out."
        Signature(
            r"\bCaught collective operation timeout: WorkNCCL\((?:SeqNum=(?P<seq>\d+), )?"
            r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?(?:[^)]*?Timeout\(ms\)="
            r"(?P<timeout_ms>\d+))?",
            "Caught collective operation timeout",
        ),
        # ncclTimeout (NCCL init.cc ncclGetErrorString) through c10d's "NCCL error in: ..."
        # and C10D_CHECK_TIMEOUT (NCCLUtils.hpp) of a non-blocking communicator
        Signature(r"NCCL error in: \S+, timeout, NCCL version", ", timeout, NCCL version"),
        Signature(r"NCCL timeout in: \S+:\d+", "NCCL timeout in: "),
        Signature(r"Some NCCL operations have failed or timed out"),
        Signature(r"watchdog thread terminated with"),
    ),
    explanation=Explanation(
        what="A collective did not complete within the process group timeout.",
        why="Almost always a symptom: another rank crashed, exited, or is busy elsewhere and "
        "never joined the collective. Only when every rank is present and waiting is the "
        "network a suspect.",
        fix="Look for the earliest error on any rank (ddpdoctor does this). If none: check "
        "for a rank busy outside collectives (rank-0 preprocessing), missing ranks' logs, then "
        "bisect transports with NCCL_IB_DISABLE=1 / NCCL_P2P_DISABLE=1.",
        false_positives="It is a real timeout, but rarely the root cause.",
    ),
    fix=(
        "Find the first error on any rank: run `ddpdoctor diagnose` on the logs of ALL ranks "
        "and nodes.",
        "If a rank is legitimately busy (preprocessing, checkpoint), raise the timeout: "
        "init_process_group(..., timeout=datetime.timedelta(minutes=60)).",
        SAME_COLLECTIVES,
        "If every rank was present: export NCCL_DEBUG=INFO and bisect with NCCL_IB_DISABLE=1, "
        "then NCCL_P2P_DISABLE=1 (`ddpdoctor check` automates it).",
    ),
    positive=(
        "[rank1]:[E1023 09:52:18.406497120 ProcessGroupNCCL.cpp:1664] [PG 0 "
        "(default_pg) Rank 1] Exception (either an error or timeout) detected by "
        "watchdog at work: 412, last enqueued NCCL work: 412, last completed NCCL "
        "work: 411.",
        "[rank0]:[E311 07:22:18.356114092 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID "
        "0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: "
        "4817530 PG status: last enqueued work: 4817530, last completed work: 4817529",
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)",
        "RuntimeError: [Rank 1] Caught collective operation timeout: WorkNCCL(SeqNum=1, "
        "OpType=BROADCAST, TensorShape=[], Timeout(ms)=10800000) ran for 10800027 milliseconds "
        "before timing out.",
        "[Rank 1] Work WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=160672064, "
        "NumelOut=160672064, Timeout(ms)=600000) timed out in blocking wait.",
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran "
        "for 1800328 milliseconds before timing out.",
    ),
    negative=(
        "[rank3]:[I1203 08:40:02.118342771 ProcessGroupNCCL.cpp:2030] [PG ID 0 PG "
        "GUID 0(default_pg) Rank 3] Process group watchdog thread terminated normally",
        "NCCL INFO comm 0x9f2ef80 rank 8 nranks 16 cudaDev 0 busId b000 - Init COMPLETE",
    ),
)

GLOO_TIMEOUT = Rule(
    code="TMO102",
    kind="nccl-timeout",
    title="Collective timed out (gloo)",
    sources="gloo/transport/tcp/unbound_buffer.cc, pair.cc",
    echo=Echo.WAITING,
    # gloo's TCP pairs see a peer process that exits at once ("Connection closed by peer",
    # NET101): a rank that timed out instead waited on peers that were still running
    peers_alive=True,
    specificity=20,
    signatures=(
        Signature(
            r"Timed out waiting (?P<timeout_ms>\w+) ?ms for (?P<op>recv|send) operation to complete",
            "Timed out waiting",
        ),
        Signature(r"Application timeout caused pair closure"),
        # gloo transport/tcp/pair.cc: a read on a pair timed out
        Signature(r"\] Read timeout \[", "Read timeout ["),
    ),
    explanation=Explanation(
        what="A gloo send/recv inside a collective waited longer than the process group timeout.",
        why="The peer never entered the matching collective: it crashed, exited early (uneven "
        "data, early stop on one rank), is busy elsewhere, or issued another collective.",
        fix="Find what the peer rank did instead (its own log); give every rank the same "
        "number of steps; raise the timeout if a rank is legitimately busy.",
        false_positives="It is a real timeout, but rarely the root cause.",
    ),
    fix=(
        "Read the log of the rank that did not join: its last lines say what it was doing.",
        "If ranks may finish at different steps, equalise the data per rank or use "
        "`with model.join():`.",
    ),
    positive=(
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "3000ms for recv operation to complete",
    ),
    negative=("[c10d] The client socket has timed out after 60s while trying to connect to",),
)

RPC_TIMEOUT = Rule(
    code="TMO104",
    kind="nccl-timeout",
    title="A remote call timed out (torch.distributed.rpc)",
    sources="torch/csrc/distributed/rpc/rpc_agent.h kRpcTimeoutErrorStr (TensorPipe agent)",
    echo=Echo.WAITING,
    # the callee was alive: TensorPipe reports a worker that exited as 'eof' or a reset
    peers_alive=True,
    specificity=20,
    signatures=(
        Signature(
            r"RPC ran for more than set timeout \((?P<timeout_ms>\d{1,12}) ms\)",
            "RPC ran for more than set timeout",
        ),
    ),
    explanation=Explanation(
        what="An rpc_sync/rpc_async/remote call got no answer within its RPC timeout.",
        why="The worker it called was busy with work of its own (a parameter server saving or "
        "rebuilding its state), stuck, or waiting for another call; it was alive.",
        fix="Read the called worker's log for what it was doing; raise rpc_timeout "
        "(TensorPipeRpcBackendOptions(rpc_timeout=...) or per call) if it was legitimately busy.",
        false_positives="It is a real timeout, but rarely the root cause.",
    ),
    fix=(
        "Read the log of the worker the call went to: its last lines say what it was doing.",
        "If that work is legitimate, raise the RPC timeout for it "
        "(TensorPipeRpcBackendOptions(rpc_timeout=...), or timeout= on the call).",
    ),
    positive=(
        "[rank1]: RuntimeError: RPCErr:1:RPC ran for more than set timeout (15000 ms) and will "
        "now be marked with an error",
    ),
    negative=(
        "[W socket.cpp:601] [c10d] The client socket has timed out after 60s while trying to "
        "connect to (127.0.0.1, 29500)",
    ),
)

MONITORED_BARRIER = Rule(
    code="TMO103",
    kind="nccl-timeout",
    title="A rank failed to reach a monitored barrier",
    sources="ProcessGroupGloo::monitoredBarrier",
    echo=Echo.WAITING,
    specificity=25,
    signatures=(
        Signature(
            r"Ranks? (?P<missing>[\d, ]+) failed to pass monitoredBarrier",
            "failed to pass monitoredBarrier",
        ),
        # ProcessGroupGloo::monitoredBarrier on a non-zero rank: rank 0 is the one to read
        Signature(
            r"successfully reached monitoredBarrier, but received errors while waiting for "
            r"send/recv from rank (?P<missing>0)",
            "successfully reached monitoredBarrier",
        ),
        # control_collectives/StoreCollectives.cpp names the ranks that did not arrive
        Signature(
            r"(?:barrier|gather|all_gather) failed -- missing ranks: (?P<missing>[\d, ]+)",
            "failed -- missing ranks: ",
        ),
    ),
    explanation=Explanation(
        what="torch.distributed.monitored_barrier names the ranks that did not arrive in time.",
        why="Those ranks were stuck, busy, or gone.",
        fix="Read the named ranks' logs; see what they were doing at that time.",
        false_positives="None.",
    ),
    fix=("Read the log of the ranks named in the message: they never reached the barrier.",),
    # tests/fixtures/real/monitored-barrier
    positive=("RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms",),
    negative=("Watchdog caught collective operation timeout",),
)

GROUP_CREATION_WAIT = Rule(
    code="COL103",
    kind="collective-mismatch",
    title="Ranks timed out creating a process group (new_group): they disagree on the groups",
    sources="torch/distributed/distributed_c10d.py new_group, ProcessGroupGloo's full-mesh "
    "connect over the store (keys /<default pg>//<group>//<device>//...), TCPStore wait",
    echo=Echo.WAITING,
    specificity=30,
    signatures=(
        # gloo connects a new group's members through the default group's store: a rank
        # waits for the address of a member that never created that group
        Signature(
            r"DistStoreError: wait timeout after (?P<timeout_ms>\d+)ms, keys: "
            r"/default_pg/\d+//(?P<group>\d+)//",
            "keys: /default_pg/",
        ),
    ),
    explanation=Explanation(
        what="After the job's process group formed, ranks timed out waiting for the other "
        "members of a group being created (dist.new_group): those members never created it, "
        "not at that index.",
        why="Every rank must call new_group for every group, with the same ranks and in the "
        "same order (Megatron-style tensor/pipeline/data groups, DeviceMesh): a group created "
        "under a rank-dependent condition, in another order, or from different "
        "parallel sizes on some nodes leaves the ranks waiting on different groups.",
        fix="Create all groups on every rank, in one deterministic order, from the same "
        "sizes (pass the same --tensor/pipeline-parallel sizes to every node); keep the "
        "`if rank in ranks` test for using a group, not for creating it.",
        false_positives="A member that died or hung before creating the group: its own error "
        "or silence is then the cause.",
    ),
    fix=(
        "Call dist.new_group(ranks) on every rank for every group, in the same order, even "
        "on ranks that are not members; compare the parallel sizes each node was given.",
    ),
    positive=(
        "[rank0]: torch.distributed.DistStoreError: wait timeout after 15000ms, keys: "
        "/default_pg/0//1//cpu//0/1",
    ),
    negative=("torch.distributed.DistStoreError: Socket Timeout",),
)

RAY_UNEVEN_REPORTS = Rule(
    code="COL104",
    kind="uncoordinated-exit",
    title="Ray Train: some workers reported results while others did not",
    sources="ray python/ray/train/trainer.py (TrainingIterator._run_with_error_handling), "
    "train/_internal/backend_executor.py",
    echo=Echo.WAITING,
    specificity=30,
    signatures=(
        Signature(
            r"Some workers returned results while others didn't",
            "Some workers returned results while others didn't",
        ),
    ),
    explanation=Explanation(
        what="Ray Train's controller collects one report per worker per call of "
        "train.report(); some workers had finished their loop (or reported) while others had "
        "not.",
        why="The workers did not run the same number of iterations: one left its loop early "
        "on its own (a local early stop, a break, a return), had fewer batches, or reported "
        "only under a rank-dependent condition.",
        fix="Make every worker call train.report() the same number of times: decide stops "
        "on one rank and share the decision, give every worker the same number of batches, "
        "and report from every worker (Ray keeps the checkpoint of rank 0).",
        false_positives="None: the controller only says it when the counts differ.",
    ),
    fix=(
        "Share stop decisions across workers (all-reduce a stop flag) and call "
        "ray.train.report() on every worker at every iteration, with the same number of "
        "batches per worker.",
    ),
    positive=(
        "RuntimeError: Some workers returned results while others didn't. Make sure that "
        "`session.report()` are called the same number of times on all workers.",
    ),
    negative=("Trial task failed for trial TorchTrainer_de934_00000",),
)

HOROVOD_STALL = Rule(
    code="HVD101",
    kind="hang",
    title="Horovod's stall inspector: a collective waits for ranks that never submitted it",
    sources="horovod/common/stall_inspector.cc (operations.cc before 0.20)",
    echo=Echo.WAITING,
    status=Status.HUNG,
    specificity=25,
    signatures=(
        Signature(
            r"One or more tensors were submitted to be reduced, gathered or broadcasted by "
            r"subset of ranks and are waiting for remainder of ranks for more than "
            r"(?P<after>\d+) seconds",
            "waiting for remainder of ranks",
        ),
        # the ops it lists, each with the ranks missing (or, in some versions, ready): one
        # per line, or (operations.cc before 0.20) one line of them joined by ", "
        Signature(
            r"(?:^\s*|\], )(?P<op>(?:allreduce|allgather|broadcast|alltoall|reducescatter|join)"
            r"\.\S*) \[missing ranks: (?P<missing>[\d, ]+)\]",
            "[missing ranks: ",
        ),
        Signature(
            r"(?:^\s*|\], )(?P<op>(?:allreduce|allgather|broadcast|alltoall|reducescatter|join)"
            r"\.\S*) \[ready ranks: (?P<ready>[\d, ]+)\]",
            "[ready ranks: ",
        ),
        # Horovod >= 0.20: "Missing ranks:" then one line per missing rank with the ops it
        # has not submitted (under horovodrun's own "[0] " or "[0]<stderr>:" prefix, which a
        # parse may take with the "0: " after it for an srun label: read on the raw line too)
        *(
            Signature(
                rf"^(?:\[\d{{1,5}}\](?:<std(?:out|err)>)?:? ?)?(?P<missing>\d{{1,5}}): \[{op}\.",
                f": [{op}.",
            )
            for op in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
        ),
    ),
    explanation=Explanation(
        what="Horovod's coordinator saw some ranks submit a collective that the others had "
        "not submitted after the stall warning time (60 s by default); it names the ops and "
        "the ranks missing (or the ranks ready) for each.",
        why="The missing ranks are elsewhere: stuck or slow before that collective (data "
        "loading, a lock, work of their own), gone, or on another code path that submits "
        "other tensors (a rank-dependent branch, a different number of steps). Without a "
        "stall shutdown time the job then hangs for ever.",
        fix="Read what the missing ranks were doing (their last lines, py-spy dump on their "
        "pids); make every rank submit the same ops in the same order and the same number of "
        "times (hvd.join() for uneven data).",
        false_positives="Ranks that are merely slow arrive later and the warning stops.",
    ),
    fix=(
        "Dump the stacks of the missing ranks while it stalls (py-spy dump --pid PID): they "
        "show where those ranks are instead of the collective.",
        "If the ranks take different paths (a branch on the rank, uneven data), make every "
        "rank submit the same collectives; hvd.join() lets ranks with less data finish.",
    ),
    positive=(
        "[2021-02-02 21:19:07.345988: W horovod/common/stall_inspector.cc:105] One or more "
        "tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and "
        "are waiting for remainder of ranks for more than 60 seconds. This may indicate that "
        "different ranks are trying to submit different tensors or that only subset of ranks is "
        "submitting tensors, which will cause deadlock.",
        "allreduce.conv1.weight [missing ranks: 1, 5]",
        " ranks: 5, 1, 4, 7, 2, 3], allreduce.layer1.1.conv1.weight [ready ranks: 5, 1, 4, 7, 2, "
        "3], allreduce.layer1.1.bn1.weight [ready ranks: 5, 1, 4, 7, 2, 3]",
        "[0] 1: [broadcast.head_in.0.bias, broadcast.head_in.0.weight ...]",
    ),
    negative=("Reducer buckets have been rebuilt in this iteration.",),
)

WATCHDOG_STUCK = Rule(
    code="HANG102",
    kind="hang",
    title="The NCCL watchdog itself got stuck (heartbeat monitor)",
    sources="ProcessGroupNCCL.cpp HeartbeatMonitor (torch >= 2.2)",
    echo=Echo.WAITING,
    specificity=20,
    signatures=(
        Signature(
            r"ProcessGroupNCCL's watchdog got stuck for (?P<after>\d+) seconds",
            "watchdog got stuck for",
        ),
        # the heartbeat monitor's own line before that exit message (torch >= 2.2), and the
        # monitor thread's termination of torch >= 2.5 (its own words for the same hang)
        Signature(
            r"Heartbeat monitor timed out! Process will be terminated",
            "Heartbeat monitor timed out!",
        ),
        Signature(
            r"Terminating the process after attempting to dump debug info, due to "
            r"ProcessGroupNCCL watchdog hang",
            "due to ProcessGroupNCCL watchdog hang",
        ),
    ),
    explanation=Explanation(
        what="The heartbeat monitor saw the collective watchdog make no progress and aborts the "
        "process.",
        why="A CUDA or NCCL call hangs (a kernel that never finishes, a collective a peer never "
        "joins, a GPU or link stall), or a thread holds the GIL inside a CUDA call. Often the "
        "echo of a peer that stopped: look at the other ranks first.",
        fix="Find what the ranks were doing: their stacks (py-spy dump, `ddpdoctor run`), the "
        "other ranks' errors; TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only delays the abort.",
        false_positives="It is a real stall, but rarely its cause.",
    ),
    fix=(
        "Dump the ranks' stacks while it hangs (py-spy dump --pid PID, or run under "
        "`ddpdoctor run`) and read every rank's log for an earlier error.",
        "If every rank waits in the same collective: bisect the transport (NCCL_P2P_DISABLE=1, "
        "NCCL_IB_DISABLE=1) with NCCL_DEBUG=INFO.",
    ),
    positive=(
        "[rank0]:[F1130 10:49:07.000000000 ProcessGroupNCCL.cpp:1224] [PG 0 (default_pg) Rank 0] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
        "monitoring enqueued collectives.",
        "[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Heartbeat monitor timed out! "
        "Process will be terminated after dumping debug info. workMetaList_.size()=2",
        "[rank0]:[F919 07:00:13.418192812 ProcessGroupNCCL.cpp:1653] [PG ID 0 PG GUID "
        "0(default_pg) Rank 0] [PG ID 0 PG GUID 0(default_pg) Rank 0] Terminating the process "
        "after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.",
    ),
    negative=("Watchdog caught collective operation timeout",),
)

NCCL_REJECTED_CALL = Rule(
    code="COL105",
    kind="python-exception",
    title="NCCL rejected a collective's arguments (invalid argument, no algorithm for the dtype)",
    sources="NCCL src/init.cc ncclGetErrorString (ncclInvalidArgument), src/enqueue.cc "
    "(2.3.5-2.30.7) via torch/csrc/distributed/c10d/NCCLUtils.hpp",
    specificity=60,
    signatures=(
        # the same ncclInvalidArgument before NCCL 2.18 (census nccl-result-invalid-argument-old),
        # raised by a collective (ProcessGroupNCCL.cpp); not by the communicator's creation
        # (NCCLUtils.hpp's ncclCommInitRank: a rank not below the world size, corpus 434)
        Signature(
            r"NCCL error in: (?![^\n]{0,400}?NCCLUtils\.hpp)[^\n]{0,400}?, invalid argument, NCCL "
            r"version",
            "invalid argument, NCCL version",
        ),
        # ncclGetErrorString(ncclInvalidArgument), as torch's "NCCL error in: ..." quotes it
        Signature(
            r"invalid argument \(run with NCCL_DEBUG=WARN for details\)",
            "invalid argument (run with NCCL_DEBUG=WARN",
        ),
        # enqueue.cc: no algorithm/protocol pair can run this op on this dtype (NCCL_ALGO or
        # NCCL_PROTO forcing an impossible one, an unsupported dtype such as fp8 on old NCCL)
        Signature(
            r"No algorithm/protocol available for function (?P<op>\w+) with datatype",
            "No algorithm/protocol available for function",
        ),
    ),
    explanation=Explanation(
        what="NCCL refused the call itself: an argument it cannot use (a tensor on another "
        "device than the communicator's, a null or misaligned buffer, a count that does not "
        "fit), or no algorithm and protocol that can run the op on that data type.",
        why="The program passed something NCCL does not accept (a CPU or wrong-device tensor, "
        "a dtype this NCCL version cannot reduce), or NCCL_ALGO / NCCL_PROTO force a "
        "combination that is not available.",
        fix="Re-run with NCCL_DEBUG=WARN: the WARN line says which argument; move tensors to "
        "the rank's own device, use a dtype NCCL supports for the op, unset NCCL_ALGO and "
        "NCCL_PROTO.",
        false_positives="None: NCCL returns these only for the call's arguments.",
    ),
    fix=(
        "Re-run with NCCL_DEBUG=WARN to see which argument NCCL rejected.",
        "Check the tensors of the collective: on torch.cuda.current_device() (set_device(local "
        "rank) before init), contiguous, of a dtype NCCL reduces; unset NCCL_ALGO/NCCL_PROTO.",
    ),
    positive=(
        "RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
        "1169, invalid argument, NCCL version 2.10.3",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:2006, invalid argument (run with NCCL_DEBUG=WARN for details), "
        "NCCL version 2.20.5",
        "node07:2291:2384 [3] enqueue.cc:2063 NCCL WARN No algorithm/protocol available for "
        "function AllReduce with datatype ncclFloat8e4m3.",
    ),
    negative=(
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/../c10d/NCCLUtils.hpp:82, invalid "
        "argument, NCCL version 2.4.8",
        "NCCL INFO NCCL_PROTO set by environment to simple",
    ),
)

RULES = (
    COLLECTIVE_MISMATCH,
    NCCL_REJECTED_CALL,
    NCCL_WATCHDOG_TIMEOUT,
    GLOO_TIMEOUT,
    RPC_TIMEOUT,
    MONITORED_BARRIER,
    GROUP_CREATION_WAIT,
    RAY_UNEVEN_REPORTS,
    HOROVOD_STALL,
    WATCHDOG_STUCK,
)
