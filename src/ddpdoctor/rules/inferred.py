"""Verdicts that no single line proves: they are inferred in analysis from how ranks behaved
(who timed out, who went silent, who was busy). Documented here like every rule, so `explain`
covers them; they have no signatures."""

from __future__ import annotations

from ddpdoctor.rules.base import Explanation, Rule, Signature

SLOW_RANK = Rule(
    code="INF201",
    kind="slow-rank-timeout",
    title="One rank was busy outside collectives while the others timed out waiting",
    signatures=(),
    explanation=Explanation(
        what="Some ranks timed out in a collective while another rank was visibly busy (a "
        "progress bar, preprocessing) and never joined it.",
        why="Work done on one rank only (dataset tokenisation under main_process_first, "
        "checkpoint consolidation, evaluation on rank 0) took longer than the process group "
        "timeout.",
        fix="Do the work before init_process_group or on every rank, cache it, or raise the "
        "timeout for that phase.",
        false_positives="If the busy rank was itself stuck, the cause is what it was stuck in.",
    ),
    fix=(
        "Preprocess once before the distributed job (or cache the tokenised dataset) so ranks "
        "do not wait for rank 0.",
        "Or raise the timeout: init_process_group(..., timeout=datetime.timedelta(hours=2)) "
        "(HF: --ddp_timeout 7200).",
    ),
)

UNCOORDINATED_EXIT = Rule(
    code="INF202",
    kind="uncoordinated-exit",
    title="A rank left the job without an error while the others kept going",
    signatures=(),
    explanation=Explanation(
        what="A rank stopped printing with no error (often exiting 0) while its peers then "
        "failed with closed connections or timeouts.",
        why="An early stop, a `sys.exit()`, a `break` or a return taken on one rank only; or "
        "the process was killed without a trace in its own log.",
        fix="Decide stops on one rank and broadcast the decision; every rank must leave the "
        "training loop at the same step and call destroy_process_group().",
        false_positives="A rank killed from outside (OOM killer, scheduler) leaves the same "
        "trace; check its exit code and dmesg.",
    ),
    fix=(
        "Broadcast stop decisions: flag = torch.tensor([int(stop)]); dist.broadcast(flag, 0); "
        "if flag.item(): break  (on every rank).",
        "Never call sys.exit()/return on one rank inside the training loop.",
    ),
)

COLLECTIVE_ASYMMETRY = Rule(
    code="INF203",
    kind="collective-mismatch",
    title="A minority of ranks waited in a collective the others had finished",
    signatures=(),
    explanation=Explanation(
        what="Only some ranks timed out, while the others went on (or finished) without error.",
        why="The waiting ranks issued a collective that the others did not (a rank-dependent "
        "branch), or with a different size, so it never completed for them.",
        fix="Make the collective sequence identical on every rank; re-run with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL to get the mismatch reported.",
        false_positives="Uneven inputs give a similar picture when the waiting rank had more "
        "batches.",
    ),
    fix=(
        "Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL to have the mismatching collective named.",
        "Check collectives inside rank-dependent branches and tensors of rank-dependent size.",
    ),
)

MISSING_RANKS = Rule(
    code="INF204",
    kind="nccl-timeout",
    title="Ranks timed out and the ranks they waited for left no logs",
    signatures=(),
    explanation=Explanation(
        what="Collective timeouts or closed connections, and no log at all from some ranks.",
        why="The root cause is most likely in the missing logs: a rank or node that died first.",
        fix="Collect the logs of the missing ranks/nodes (or run under `ddpdoctor run`).",
        false_positives="The missing ranks may simply not have been included in the paste.",
    ),
    fix=("Collect the logs of the missing ranks or nodes and diagnose all of them together.",),
)

STARTUP_HANG = Rule(
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

HANG = Rule(
    code="INF206",
    kind="hang",
    title="No progress and no error",
    signatures=(),
    explanation=Explanation(
        what="The job stopped making progress without printing an error.",
        why="A deadlock in a collective, a rank stuck in data loading, or a hang in the "
        "transport; the log alone cannot tell.",
        fix="Run the job under `ddpdoctor run` to get the Python stack of every rank when it "
        "stalls, or dump stacks now with `py-spy dump --pid PID` on each rank.",
        false_positives="A log that was cut before the end.",
    ),
    fix=(
        "Dump every rank's stack while it hangs: py-spy dump --pid PID (or run under "
        "`ddpdoctor run`).",
        "Set TORCH_DISTRIBUTED_DEBUG=DETAIL and NCCL_DEBUG=INFO for the next run.",
    ),
)

EARLY_STOP_ALL = Rule(
    code="INF207",
    kind="early-stop",
    title="All ranks stopped on purpose",
    signatures=(),
    explanation=Explanation(
        what="Every rank announced the stop and ended together.",
        why="Early stopping or a step limit; a non-zero exit code only reflects how the "
        "program exits.",
        fix="Exit 0 after destroy_process_group() so schedulers do not count a failure.",
        false_positives="None.",
    ),
    fix=("After the loop: dist.destroy_process_group(); sys.exit(0).",),
)

WORKER_EXIT = Rule(
    code="INF208",
    kind="python-exception",
    title="A worker exited with an error and its own output is not in the logs",
    signatures=(),
    explanation=Explanation(
        what="The launcher reports a failed worker, but that worker's error text is missing.",
        why="The worker's stderr went elsewhere (a --log-dir, a redirect, another file).",
        fix="Collect that worker's output (torchrun --log-dir / --tee 3) and diagnose it.",
        false_positives="None.",
    ),
    fix=("Re-run with torchrun --tee 3 (or --log-dir DIR) so each worker's output is kept.",),
)

UNEVEN = Rule(
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

TEARDOWN_CRASH = Rule(
    code="INF210",
    kind="exit-teardown-crash",
    title="Training finished, then a rank crashed or hung while shutting down",
    signatures=(),
    explanation=Explanation(
        what="The failure came after the job announced the end of training.",
        why="Ranks left the process group at different times (no destroy_process_group), a "
        "final collective ran on some ranks only, or library teardown (NCCL/gloo threads, "
        "atexit hooks, DataLoader workers) crashed during interpreter exit.",
        fix="End every rank the same way: barrier(), destroy_process_group(), then exit 0; "
        "keep end-of-training work (saving, evaluation) on every rank or behind a barrier.",
        false_positives="A real failure while saving the final checkpoint (disk full, host "
        "OOM) is reported as that failure instead.",
    ),
    fix=(
        "At the very end on every rank: torch.distributed.barrier(); "
        "torch.distributed.destroy_process_group(); sys.exit(0).",
    ),
)

HANG_DUMP = Rule(
    code="HANG101",
    kind="hang",
    title="Stack dumps of a stalled job (py-spy / faulthandler)",
    sources="Python faulthandler dump_traceback, py-spy dump",
    severity="warning",
    specificity=10,
    signatures=(
        # faulthandler.dump_traceback_later(timeout) firing: "Timeout (0:00:05)!"
        Signature(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!", "Timeout ("),
        Signature(r"Thread 0x[0-9a-f]+ \(most recent call first\):", "(most recent call first):"),
        Signature(r"Thread \d+ \(idle\): \"", '(idle): "'),
        Signature(r"Thread \d+ \(active(?:\+gil)?\): \"", "(active"),
    ),
    explanation=Explanation(
        what="The log holds Python stack dumps taken while the job made no progress.",
        why="Someone (or a watchdog) dumped the stacks of a job that hung: ranks wait in a "
        "collective that another rank never reaches, or sit in data loading or a lock.",
        fix="Compare the ranks' stacks: the rank that is not in the same collective as the "
        "others is the culprit. `ddpdoctor run` takes and groups them automatically.",
        false_positives="A dump printed by a crash handler next to a real error; the error is "
        "then the root.",
    ),
    fix=(
        "Group the ranks by their top frames; the odd one out is where to look "
        "(`ddpdoctor run --hang-after 120 -- torchrun ...` does this for you).",
    ),
    positive=(
        "Thread 0x00007f3b8c4f1740 (most recent call first):",
        'Thread 1234 (idle): "MainThread"',
    ),
    negative=("Traceback (most recent call last):",),
)

RULES = (
    TEARDOWN_CRASH,
    HANG_DUMP,
    UNEVEN,
    SLOW_RANK,
    UNCOORDINATED_EXIT,
    COLLECTIVE_ASYMMETRY,
    MISSING_RANKS,
    STARTUP_HANG,
    HANG,
    EARLY_STOP_ALL,
    WORKER_EXIT,
)


HANG_BY_KIND: dict[str, Rule] = {
    "slow-rank-timeout": SLOW_RANK,
    "uncoordinated-exit": UNCOORDINATED_EXIT,
    "collective-mismatch": COLLECTIVE_ASYMMETRY,
    "hang": HANG,
}
"""How a hang classified from live stacks (`ddpdoctor run`) maps to documented rules."""
