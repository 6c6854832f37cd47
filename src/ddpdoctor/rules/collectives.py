"""Collective mismatches and timeouts (c10d ProcessGroupWrapper, ProcessGroupNCCL watchdog, gloo
transport). Timeouts are usually the echo of a failure elsewhere: the waiting rank was
alive (`Echo.WAITING`)."""

from __future__ import annotations

from ddpdoctor.rules.base import Echo, Explanation, Rule, Signature

COLLECTIVE_MISMATCH = Rule(
    code="COL101",
    kind="collective-mismatch",
    title="Ranks called different collectives",
    sources="c10d ProcessGroupWrapper.cpp (TORCH_DISTRIBUTED_DEBUG=DETAIL), gloo pair.cc",
    signatures=(
        Signature(r"Detected mismatch between collectives on ranks"),
        # gloo/transport/tcp/pair.cc: shapes differ between ranks
        Signature(r"op\.preamble\.length <= op\.nbytes", "op.preamble.length"),
        Signature(r"Is there a distributed collective mismatch in your code"),
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
    positive=(
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST",
    ),
    negative=("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE",),
)

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
        Signature(r"Timeout at NCCL work: (?P<seq>\d+)", "Timeout at NCCL work"),
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
        "If every rank was present: export NCCL_DEBUG=INFO and bisect with NCCL_IB_DISABLE=1, "
        "then NCCL_P2P_DISABLE=1 (`ddpdoctor check` automates it).",
    ),
    positive=(
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran "
        "for 1800328 milliseconds before timing out.",
    ),
    negative=("NCCL INFO comm 0x9f2ef80 rank 8 nranks 16 cudaDev 0 busId b000 - Init COMPLETE",),
)

GLOO_TIMEOUT = Rule(
    code="TMO102",
    kind="nccl-timeout",
    title="Collective timed out (gloo)",
    sources="gloo/transport/tcp/unbound_buffer.cc, pair.cc",
    echo=Echo.WAITING,
    specificity=20,
    signatures=(
        Signature(
            r"Timed out waiting (?P<timeout_ms>\w+) ?ms for (?P<op>recv|send) operation to complete",
            "Timed out waiting",
        ),
        Signature(r"Application timeout caused pair closure"),
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

RULES = (COLLECTIVE_MISMATCH, NCCL_WATCHDOG_TIMEOUT, GLOO_TIMEOUT, MONITORED_BARRIER)
