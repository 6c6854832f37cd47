"""Real gloo runs of a fifty-ninth training-program style (tests/programs/fiftyninth_style_train.py:
a tiny GPT-like decoder pre-trained on a 2-node Slurm job in the way of torchtitan's and
Megatron's multi-node sbatch scripts: tests/programs/fiftyninth_multinode.sbatch runs `srun
--label --ntasks-per-node=1 torchrun --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d
--rdzv_endpoint HEAD:PORT --rdzv_id $SLURM_JOB_ID`, so 4 ranks, node02's are global ranks 2 and
3). Raw torch DDP over gloo (15 s collective timeout) and a checkpoint process group of its own
(gloo, 30 min), step-based training, a byte-level token shard per rank on each node's disk,
logging in torchtitan's format '[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s' at
INFO on global rank 0 only (WARNING on the others), the logged loss averaged over ranks,
checkpoints by global rank 0 to the shared folder. Slurm is not installed here: the capture
(tests/fixtures/real/capture_fiftyninth.sh) simulates scontrol and srun, and says which lines
are simulated; the batch script, both torchruns and their workers are real. The fixture of a
mode is the job's one slurm-JOBID.out: the batch script's echo lines, then every line of srun
task K (node0K+1's torchrun and its workers) prefixed "K: " as `srun --label` does (task K is a
NODE, not a rank), then srun's own lines where real srun prints them ("srun: error: node02: task
1: Exited with exit code 1" for a task that exits non-zero; at a time limit slurmstepd's
"*** STEP/JOB ... CANCELLED AT ... DUE TO TIME LIMIT ***" and srun's "Job step aborted").
Neither the program nor the launch were used to build the rules: the diagnosis must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 8 of 15 right (calm-quad, loud-quad, goal-met, key-miss, shard-gone,
head-resume, wall-hit, solo-goal). Under most misses one cause: srun's --label 'K: ' names the
srun TASK (one torchrun a node), but it is read as rank K, so node02's torchrun lines are rank
1's and node01's are rank 0's, and torchtitan's '[titan]' records of ranks other than 0 carry no
rank at all (rss-climb, null-pack, reindex-crawl, event-park, short-shard, tps-solo with node02's
keep-alive RendezvousConnectionError on top); a hang ended by the time limit is read as the time
limit (stale-lock). Since, slurmstepd's '*** STEP 59014.0 ON node01 CANCELLED' is no training
progress (its STEP had stood for the job's last progress line, which carries no time, so the
37 s of silence before the stop were not measured), and a step's line and its save's at one
time give the pace from the step before: stale-lock is hung, hang (its culprit still missing).
A node's torchrun whose keep-alive heartbeat lost the store ('has failed to send a keep-alive
heartbeat to the rendezvous ... RendezvousConnectionError') lost a peer, the store's host that
ended first, as at its shutdown: tps-solo right, 9 of 15. A file whose srun labels stand in
front of a launcher's own lines (torchrun's agent) reads each label as a node, not a rank
(ingest/srun_tasks), named as srun's error line on the task names it: rss-climb, null-pack and
event-park right, 12 of 15."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); arguments in brackets (capture_fiftyninth.sh)
EXPECTED: dict[str, Expected] = {
    # 30 steps, a loss line every 5 and a checkpoint every 10 on rank 0, "Training completed";
    # both torchruns exit 0, so srun prints nothing; node02's torchrun logs a TCPStore
    # "recvVector failed ... Connection was likely closed" and "failed to shutdown the
    # rendezvous" (RendezvousConnectionError) warning as node01's store goes away at the end
    "calm-quad": ("ok", None, []),
    # [OMP_NUM_THREADS unset, --log-mfu] the same run with scary warnings: torchrun's
    # "Setting OMP_NUM_THREADS environment variable for each process to be 1" banner on both
    # nodes, "[titan] ... WARNING - Peak flops undefined for: cpu, fallback to A100" on every
    # rank, and DDP's reducer warning "find_unused_parameters=True was specified in DDP
    # constructor, but did not find any unused parameters" on every rank; trains to the end
    "loud-quad": ("ok", None, []),
    # [--steps 60 --stop-loss 2.5] the loss averaged over the ranks falls below the target at
    # step 25: every rank breaks together, rank 0 logs "Loss 2.3547 is below the target 2.5000,
    # stopping." and "Training completed"; every process exits 0: an agreed, intended stop
    "goal-met": ("ok", None, []),
    # rank 2 (node02's local rank 0) weighs its loss by its shard's source, "code", which the
    # table lacks, at step 8: "[rank2]: KeyError: 'code'"; ranks 0, 1 and 3 lose it
    # ("Connection closed by peer"), node02's torchrun names rank 2 its root cause; srun
    # reports both tasks "Exited with exit code 1"
    "key-miss": ("failed", "python-exception", [2]),
    # rank 3's shard is not on node02's disk: "[rank3]: FileNotFoundError: [Errno 2] No such
    # file or directory: 'data/shard_03.bin'" before training; the others lose it
    "shard-gone": ("failed", "data-error", [3]),
    # rank 1 keeps 96 MiB a step and SIGKILLs itself at step 6 (the OOM killer's way): no
    # traceback, node01's torchrun "failed (exitcode: -9) local_rank: 1", rank 1 its root
    # cause; the others lose it; node02's torchrun then loses the c10d store
    # (RendezvousConnectionError); srun reports both torchruns "Exited with exit code 1" (srun
    # sees the torchrun task, not the killed worker)
    "rss-climb": ("failed", "host-oom", [1]),
    # rank 3's native packing kernel reads address 0 at step 7: SIGSEGV, no traceback, node02's
    # torchrun "exitcode: -11" for local rank 1 (rank 3); the others lose it
    "null-pack": ("failed", "native-crash", [3]),
    # rank 2 re-indexes its shard at step 12 for 40 s, logging "[titan] ... WARNING - Shard
    # index is stale, re-indexing data (k/8)" every 5 s (4 of 8 printed); ranks 0, 1 and 3 time
    # out after 15 s in the gradient all-reduce ("Timed out waiting 15000ms"), rank 2 is
    # SIGTERMed by node02's torchrun while still re-indexing
    "reindex-crawl": ("failed", "slow-rank-timeout", [2]),
    # rank 1 waits at step 12 on an event a prefetch thread that was never started should set:
    # silent, outside any collective; ranks 0, 2 and 3 time out after 15 s in the gradient
    # all-reduce; node01's torchrun SIGTERMs the stuck rank 1
    "event-park": ("hung", "hang", [1]),
    # only rank 0 all-reduces the throughput it logs at step 5 (`if rank == 0`): its 1-element
    # all-reduce meets the others' next gradient all-reduce, gloo aborts rank 0 ("terminate
    # called after throwing an instance of 'gloo::EnforceNotMet'", "68480 vs 4. Received data
    # size doesn't match expected size. Is there a distributed collective mismatch in your
    # code?", exitcode -6) before it logs step 5; the others lose it
    "tps-solo": ("failed", "collective-mismatch", [0]),
    # rank 3's shard on node02 is 17 batches long (the others 1600): at step 18 rank 3 logs
    # "[titan] ... WARNING - Ran out of data; last step was 17.", leaves the loop and exits 0;
    # ranks 0, 1 and 2 lose it in the gradient all-reduce ("Connection closed by peer");
    # node02's torchrun names rank 2 (exit 1) as its root cause, <NO_OTHER_FAILURES>
    "short-shard": ("failed", "uneven-inputs", [3]),
    # [--resume outputs/checkpoint/step-10.pt] an earlier run's checkpoint is in node01's
    # working folder only: ranks 2 and 3 raise "FileNotFoundError: [Errno 2] No such file or
    # directory: 'outputs/checkpoint/step-10.pt'" in torch.load (a missing input), rank 0 logs
    # "Loading the checkpoint from ... at step 10." and ranks 0 and 1 lose them
    "head-resume": ("failed", "data-error", [2, 3]),
    # [--steps 100000 --log-freq 50 --ckpt-interval 200, time limit 30 s] healthy training
    # reaches the job's time limit: "slurmstepd-node01: error: *** JOB 59013 ON node01
    # CANCELLED AT ... DUE TO TIME LIMIT ***" (and the STEP line), SIGTERM to every process;
    # both torchruns raise SignalException and srun reports their exits
    "wall-hit": ("failed", "preempted", []),
    # [time limit 45 s] an earlier job left a lock in the shared checkpoint folder: rank 0 logs
    # "Saving a full checkpoint at step 10." and waits for the lock silently, ranks 1-3 wait in
    # the checkpoint group's barrier (30 min timeout): no error until the time limit cancels
    # the job; the hang is the cause, the time limit only ends it
    "stale-lock": ("hung", "hang", [0]),
    # [--steps 60 --stop-loss 2.5] the loss target is checked on rank 0's own loss, never
    # agreed: at step 20 rank 0 logs "Loss 2.4170 is below the target 2.5000, stopping." and
    # "Training completed" and exits 0; as captured ranks 1, 2 and 3 go on into step 20's
    # checkpoint barrier and lose it there ("Connection closed by peer" in dist.barrier);
    # node01's torchrun names rank 1 (exit 1), <NO_OTHER_FAILURES>
    "solo-goal": ("failed", "uncoordinated-exit", [0]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "short-shard": "failed, uncoordinated-exit with no culprit (INF202, 0.3): rank 3's "
    "'1: [titan] ... root - WARNING - Ran out of data; last step was 17.' carries no rank of "
    "its own: node02's (srun's task label), rank 2's or 3's, in one stream with node02's "
    "torchrun; so the rank out of batches is neither named nor read as a data end; rank 3 had "
    "17 batches against 1600, uneven-inputs on rank 3",
    "stale-lock": "hung, hang with no culprit (INF229, 0.55): status and kind are right (37 s "
    "without progress before the time limit's SIGTERM, against a step every 0.2 s), but not "
    "rank 0: its last line 'Saving a full checkpoint at step 10.' is the last progress of the "
    "job, and ranks 1-3 wait silently in the checkpoint group's barrier (30 min timeout), so "
    "nothing sets rank 0 apart",
}


RUNS = RunSet("fiftyninth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_fiftyninth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    """The job's slurm-JOBID.out."""
    (f,) = RUNS.files(mode)
    return f.read_text(errors="replace")


def _lines(mode: str) -> list[str]:
    return _out(mode).splitlines()


def _task(mode: str, k: int) -> str:
    """srun task K's lines (node0K+1's torchrun and its workers), the label removed."""
    return "\n".join(line[3:] for line in _lines(mode) if line.startswith(f"{k}: "))


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_fiftyninth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    (f,) = RUNS.files(mode)
    assert re.fullmatch(r"slurm-59\d{3}\.out", f.name), f.name
    assert "TQ_CASE" not in _out(mode)


BATCH_ECHO = re.compile(
    r"Nodes: node01 node02|Head node: node01|Head node IP: 127\.0\.0\.1"
    r"|Job 59\d{3}: 2 nodes, 2 processes a node"
)
SLURM_OWN = re.compile(
    r"srun: error: node0([12]): task ([01]): (Exited with exit code \d+|Terminated|Killed)"
    r"|srun: Job step aborted: Waiting up to 32 seconds for job step to finish\."
    r"|srun: got SIGCONT|srun: forcing job termination"
    r"|slurmstepd-node01: error: \*\*\* JOB 59\d{3} ON node01 CANCELLED AT "
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d DUE TO TIME LIMIT \*\*\*"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_the_batch_scripts_a_labelled_tasks_or_slurms(mode: str) -> None:
    """Four echo lines of the batch script first, then lines of task 0 or 1 with srun's
    label, and srun's or slurmstepd's own lines."""
    lines = _lines(mode)
    assert all(BATCH_ECHO.fullmatch(line) for line in lines[:4]), lines[:4]
    for line in lines[4:]:
        assert line.startswith(("0: ", "1: ")) or SLURM_OWN.fullmatch(line), line


def test_node_two_holds_global_ranks_two_and_three() -> None:
    """srun's label is the task's, one task a node: task 1's workers are torch's [rank2] and
    [rank3], and its torchrun names them with their local ranks."""
    assert "global_ranks=[2, 3]" in _task("calm-quad", 1)
    assert "global_ranks=[0, 1]" in _task("calm-quad", 0)
    key = _task("key-miss", 1)
    assert "[rank2]: KeyError: 'code'" in key
    assert "[rank2]" not in _task("key-miss", 0)
    segv = _task("null-pack", 1)
    assert "failed (exitcode: -11) local_rank: 1" in segv
    assert re.search(r"rank      : 3 \(local_rank: 1\)\n\s+exitcode  : -11", segv)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_the_program_logs_info_on_global_rank_zero_only(mode: str) -> None:
    record = re.compile(r"^\[titan\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - root - (\w+) - ", re.M)
    assert {m[1] for m in record.finditer(_task(mode, 1))} <= {"WARNING"}
    info = [line for line in _task(mode, 0).splitlines() if " - root - INFO - " in line]
    assert info or mode == "tps-solo"  # tps-solo's rank 0 logs up to "Training starts" only


def test_srun_speaks_only_for_tasks_that_failed_and_at_the_time_limit() -> None:
    for mode in ("calm-quad", "loud-quad", "goal-met"):
        assert "srun:" not in _out(mode) and "slurmstepd" not in _out(mode)
    for mode in EXPECTED:
        limit = "DUE TO TIME LIMIT" in _out(mode)
        assert limit == (mode in ("wall-hit", "stale-lock")), mode
    assert "srun: error: node02: task 1: Exited with exit code 1" in _out("key-miss")
