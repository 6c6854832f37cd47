"""Real gloo runs of a ninety-second training-program style
(tests/programs/ninetysecond_style_train.py, linked into each run's folder as monobeast.py):
reinforcement learning with an IMPALA / TorchBeast actor-learner split, as the distributed forks
of facebookresearch/torchbeast's monobeast.py write it. Every torchrun rank is a learner: a DDP
process (gloo on CPU, 15 s collective timeout) that starts its own actor processes with
torch.multiprocessing's spawn context (actors rank, rank + N, ...; global actor indices). The
actors step a tiny numpy gridworld on the learner's own level file (data/levels_<rank>.npy),
act with a shared-memory copy of the policy and write unrolls of 20 steps into shared-memory
buffers whose indices travel through a free_queue and a full_queue (ctx.SimpleQueue); the
learner takes 4 full buffers, computes V-trace, DDP all-reduces the gradients, returns the
buffers and copies the weights to the actors; every 10 updates the episode returns are
all-reduced (and can stop every learner at --target_return). Each learner trains on its actors'
share of --total_steps. TorchBeast's logging on every process, set at import so the spawned
actors log alike ('[INFO:12345 monobeast:403 2026-12-06 03:26:30,903] Steps 1600 @ 799.4 SPS.
Loss -5.605134. Stats: mean_episode_return 0.70 (learner 0: 0.75), episodes 12' from learner
0, 'Actor 3 started.' from the actors, 'Exception in worker process 3' and a traceback from a
failing actor); the records carry the pid, not the rank. At the end learner 0 saves
logs/torchbeast/monobeast-dist/model.tar, every learner sends None to its actors, logs 'Learner
K: learning finished after N steps.' and destroys the process group; learner 0 logs 'Learning
finished after N steps.'. The loop sits in TorchBeast's try/finally, which stops the actors on
any error, so a failing learner exits.

The launch: `torchrun --nproc_per_node=N --master_port=PORT monobeast.py --num_actors A [flags]`
after `python monobeast.py --prepare --num_learners N` (N = 2, 3 for trio-beast; A = 4, 3 for
trio-beast and actors-odd; no --tee: every process writes to the console unprefixed, torch's
own '[rankN]:' on the learners' tracebacks). The fixture of a mode is the command's console,
console.log, as a user hands it. Captured with tests/fixtures/real/capture_ninetysecond.sh,
ports 39060-39075, fault switch $TQ_CASE never printed, the other faults in what a run is given
(flags, learner 1's level file truncated or written by a generator with density 1,
OMP_NUM_THREADS unset, a port held by a stale process, a SIGTERM to torchrun from outside).
Neither the program nor the launch were used to build the rules: the diagnosis must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 10 of 16 right (goal-beast, stats-zero, heap-beast, segv-beast, stat-solo,
eval-slow, buffer-leak, level-walled, port-held, wall-term). Misses: TorchBeast's records carry
the pid, not the rank, so the healthy runs' 'Learning finished after N steps.' is no end and
torchrun's silence reads as a log that stops (calm-beast, loud-beast, trio-beast: INF212 hang);
the actors' unprefixed tracebacks are given to rank 0, not to learner 1 that owns them
(level-torn, where numpy's short read is not a data error either, and unroll-skew); learner 1's
'learning finished after 12000 steps' on its smaller share is not read as the rank that ran
out (actors-odd: uncoordinated-exit without a culprit). Now 13 of 16: TorchBeast's
'[INFO:pid module:line time] ' header is read (level, pid, time) and its 'Learning finished after N
steps.' is the end of training (calm-beast, loud-beast, trio-beast); level-torn now data-error,
on the wrong rank."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit GLOBAL ranks); arguments in brackets (capture_ninetysecond.sh)
EXPECTED: dict[str, Expected] = {
    # [--num_actors 4] 2 learners with 2 actors each, 150 updates each; learner 0 logs "Steps
    # 1600 @ ... SPS" every 10 updates up to 24000, saves model.tar, both learners log "learning
    # finished after 12000 steps", "Learning finished after 24000 steps"; every process exits 0,
    # torchrun prints nothing
    "calm-beast": ("ok", None, []),
    # [OMP_NUM_THREADS unset, --mmap_levels] the same run with scary output: torchrun's
    # OMP_NUM_THREADS banner, and every actor's "UserWarning: The given NumPy array is not
    # writable, and PyTorch does not support non-writable tensors. This means writing to this
    # tensor will result in undefined behavior." (torch.from_numpy of the memory-mapped,
    # read-only level file; nothing writes to it); trains to the end, every process exits 0
    "loud-beast": ("ok", None, []),
    # [3 learners, --num_actors 3] one actor per learner, 100 updates each, "Learning finished
    # after 24000 steps"; every process exits 0
    "trio-beast": ("ok", None, []),
    # [--total_steps 400000 --target_return 0.8] the all-reduced mean episode return reaches
    # 0.81 after 60 updates, the same on every learner: every learner leaves its loop, learner
    # 0 logs "Reached target return 0.80 (mean_episode_return 0.81), stopping.", saves, both
    # learners finish, all exit 0: an agreed, intended stop
    "goal-beast": ("ok", None, []),
    # learner 1's level file was cut to 900 bytes by an interrupted copy: both of its actors (1
    # and 3) fail in np.load with "ValueError: Failed to read all data for array. Expected (64,
    # 5, 5) = 1600 elements, could only read 772 elements." ("Exception in worker process 3",
    # their tracebacks, "Process SpawnProcess-2:"); learner 1 waits forever on its full_queue
    # (no batch ever comes, nothing checks the actors), outside any collective; learner 0 times
    # out after 15 s in DDP's first all-reduce ("Timed out waiting 15000ms for recv"), torchrun
    # SIGTERMs learner 1: the input file of rank 1's actors
    "level-torn": ("failed", "data-error", [1]),
    # at its second statistics block (update 20) learner 1 averages the returns of the episodes
    # that ended in its batch without guarding an empty batch: "ZeroDivisionError: float
    # division by zero" in train() on rank 1; learner 0 waits in the statistics all-reduce and
    # is SIGTERMed: an uncaught exception of the program on rank 1
    "stats-zero": ("failed", "python-exception", [1]),
    # from update 12 learner 1 keeps 64 MiB an update and SIGKILLs itself at the sixth (the OOM
    # killer's way): no traceback, torchrun's "failed (exitcode: -9) local_rank: 1" and
    # "Signal 9 (SIGKILL) received by PID"; learner 0 loses it ("Connection closed by peer")
    "heap-beast": ("failed", "host-oom", [1]),
    # learner 1's native V-trace routine writes to address 8 at update 15: SIGSEGV, no
    # traceback, torchrun's "exitcode: -11" for local rank 1; learner 0 loses it and is
    # SIGTERMed
    "segv-beast": ("failed", "native-crash", [1]),
    # the all-reduce of the episode statistics sits inside learner 0's logging block: at update
    # 10 learner 0 all-reduces 2 floats while learner 1 is already in update 11's gradient
    # all-reduce: gloo aborts learner 0 ("op.preamble.length <= op.nbytes. 9608 vs 4 ... Is
    # there a distributed collective mismatch in your code?", exitcode -6), learner 1 loses it:
    # a collective only rank 0 called
    "stat-solo": ("failed", "collective-mismatch", [0]),
    # [--num_actors 3] actors 0 and 2 belong to learner 0, actor 1 to learner 1: each learner's
    # budget is its actors' share of --total_steps 36000, 24000 and 12000 steps, 300 and 150
    # updates: learner 1 leaves after 150 updates ("Learner 1: learning finished after 12000
    # steps.", exits 0), learner 0's next gradient all-reduce loses it ("Connection closed by
    # peer"), exitcode 1: ranks with different numbers of batches, rank 1 the one that ran out
    "actors-odd": ("failed", "uneven-inputs", [1]),
    # at update 12 learner 1 evaluates the greedy policy, logging "Learner 1: evaluating greedy
    # policy, episode k/8" every 4 s (4 of 8 printed); learner 0 gives up after 15 s in the
    # gradient all-reduce ("Timed out waiting 15000ms for recv"), torchrun SIGTERMs learner 1
    # while it still works: a rank busy past the timeout, announced
    "eval-slow": ("failed", "slow-rank-timeout", [1]),
    # learner 1 never returns the buffers of a batch to its free_queue: after its first update
    # (4 buffers, batch 4) its actors block on free_queue.get() and learner 1 on
    # full_queue.get(), silently, outside any collective; learner 0 times out after 15 s in the
    # second update's all-reduce ("Timed out waiting 15000ms for send"), torchrun SIGTERMs
    # learner 1: the shared buffers starved, a silent hang of rank 1
    "buffer-leak": ("hung", "hang", [1]),
    # learner 1's level file came from a generator run with wall density 1: every cell a wall,
    # so both of its actors ("Actor 1 started.", "Actor 3 started.") loop forever looking for a
    # free start cell, silently; learner 1 waits on its full_queue, learner 0 times out after
    # 15 s in DDP's first all-reduce, torchrun SIGTERMs learner 1: no error text anywhere, rank
    # 1 the one that never arrived
    "level-walled": ("hung", "hang", [1]),
    # learner 1's actors unroll 25 steps into buffers of 21 rows: both raise "IndexError: index
    # 21 is out of bounds for dimension 0 with size 21" in act() on their first unroll
    # ("Exception in worker process 1/3"); learner 1 waits forever on its full_queue, learner 0
    # times out after 15 s in DDP's first all-reduce, learner 1 is SIGTERMed: an exception of
    # the program in rank 1's actors
    "unroll-skew": ("failed", "python-exception", [1]),
    # a crashed job's process still listens on the port: torchrun's TCPStore cannot listen,
    # "torch.distributed.DistNetworkError: The server socket has failed to listen on any local
    # network address. port: 39074, ... EADDRINUSE"; no learner starts
    "port-held": ("failed", "rendezvous-failure", []),
    # [--total_steps 100000000, SIGTERM to torchrun after 25 s] healthy training stopped from
    # outside as by a scheduler's time limit: "Received 15 death signal, shutting down
    # workers", both learners SIGTERMed, torchrun raises SignalException "Process N got signal:
    # 15"
    "wall-term": ("failed", "preempted", []),
}

HEALTHY = "unknown, hang (INF212, 0.3): 'the log ends in the middle of training, without an end': TorchBeast's records carry the pid, not the rank ('[INFO:348 monobeast:442 ...]'), so no line names a rank (world size: unknown) and learner 0's 'Learning finished after N steps.' and every learner's 'Learner K: learning finished after N steps.' are not read as the end of training; torchrun says nothing when every worker exits 0, so a clean end reads as a log that stops"

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "level-torn": "failed, data-error on rank 0 (DATA101, 0.9): the kind is right now (numpy's "
    "'Failed to read all data for array ... (file seems not fully written?)' is a cut input "
    "file), the rank is not: the actors' tracebacks carry no rank prefix and are given to rank 0, "
    "not to learner 1 ('Learner 1: actors [1, 3]', 'Exception in worker process 3'). At first "
    "sight: python-exception on rank 0 (PY101)",
    "unroll-skew": "failed, python-exception on rank 0 (PY101, 0.6): right kind, wrong rank: the "
    "IndexErrors ('index 21 is out of bounds for dimension 0 with size 21') of learner 1's actors 1 and "
    "3 are in unprefixed actor tracebacks and are given to rank 0, whose own error is only the timeout "
    "that learner 1's starving queue caused: python-exception on rank 1",
}


RUNS = RunSet("ninetysecond-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_ninetysecond_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    return RUNS.console(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_ninetysecond_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.relative_to(RUNS.folder(mode)).as_posix() for f in RUNS.files(mode)]
    assert names == ["console.log"], names
    assert "TQ_CASE" not in _out(mode)


RECORD = re.compile(r"\[(INFO|ERROR):\d+ monobeast:\d+ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] .*")
WORKER = re.compile(
    r"\[rank\d\]:.*|"
    r"terminate called after throwing an instance of 'gloo::EnforceNotMet'|"
    r"  what\(\):  \[enforce fail at .*|"
    r"/tmp/run-390\d\d/monobeast\.py:\d+: UserWarning: The given NumPy array is not writable.*|"
    r"  env = GridWorld\(torch\.from_numpy\(levels\), .*|"
    r"/root/\.pyenv/versions/3\.11\.7/lib/python3\.11/multiprocessing/resource_tracker\.py:\d+: "
    r"UserWarning: resource_tracker: There appear to be \d+ leaked semaphore objects .*|"
    r"  warnings\.warn\('resource_tracker: There appear to be %d '"
)
ACTOR = re.compile(  # a failing actor's traceback, printed twice (traceback.print_exc, then
    # multiprocessing's own after "Process SpawnProcess-K:"), then print()'s empty line
    r"Traceback \(most recent call last\):|  File .*|    .*|\s+[\^~]+|"
    r"Process SpawnProcess-\d+:|(ValueError|IndexError): .*|"
)
AGENT = re.compile(r"[WE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ torch/distributed/\S+:\d+\] .*")
AGENT_END = re.compile(
    r"Traceback \(most recent call last\):|  File .*|    .*|\s+[\^~]+|"
    r"torch\.distributed\.\S+(Error|Exception): .*|"
    r"=+|-+|monobeast\.py FAILED|Failures:|  <NO_OTHER_FAILURES>|"
    r"Root Cause \(first observed failure\):|\[\d\]:|"
    r"  (time|host|rank|exitcode|error_file|traceback)\s*: .*|"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_a_record_or_what_torch_gloo_and_torchrun_print(mode: str) -> None:
    """TorchBeast's records of the learners and actors, the actors' tracebacks, the learners'
    own output ('[rankN]:' tracebacks, gloo's abort, numpy's and the resource tracker's
    warnings), torchrun's log lines, and from torchrun's own traceback on its failure
    summary."""
    lines = _out(mode).splitlines()
    end = next(
        (
            k
            for k, line in enumerate(lines[:-1])
            if line == "Traceback (most recent call last):"
            and lines[k + 1].startswith('  File "/repo/.venv/bin/torchrun"')
        ),
        len(lines),
    )
    for line in lines[:end]:
        assert (
            RECORD.fullmatch(line)
            or WORKER.fullmatch(line)
            or AGENT.fullmatch(line)
            or ACTOR.fullmatch(line)
        ), line
    for line in lines[end:]:
        assert AGENT.fullmatch(line) or AGENT_END.fullmatch(line) or WORKER.fullmatch(line), line


def test_the_faults_happened_as_intended() -> None:
    for mode in ("calm-beast", "loud-beast", "trio-beast", "goal-beast"):
        out = _out(mode)
        assert "Saving checkpoint to logs/torchbeast/monobeast-dist/model.tar" in out, mode
        assert "Learning finished after" in out and "exitcode" not in out
        assert "Traceback" not in out, mode
    loud = _out("loud-beast")
    assert "Setting OMP_NUM_THREADS environment variable" in loud
    assert loud.count("UserWarning: The given NumPy array is not writable") == 4
    assert "Reached target return 0.80" in _out("goal-beast")
    torn = _out("level-torn")
    assert torn.count("ValueError: Failed to read all data for array") == 4
    assert "Exception in worker process 1" in torn and "Exception in worker process 3" in torn
    assert "Timed out waiting 15000ms" in torn and "SPS" not in torn
    assert "[rank1]: ZeroDivisionError: float division by zero" in _out("stats-zero")
    assert RUNS.agent_exits("heap-beast") == [("-9", "1")]
    assert RUNS.agent_exits("segv-beast") == [("-11", "1")]
    assert RUNS.agent_exits("stat-solo") == [("-6", "0")]
    assert "9608 vs 4" in _out("stat-solo")
    odd = _out("actors-odd")
    assert "Learner 1: learning finished after 12000 steps." in odd
    assert "Learner 0: learning finished" not in odd and "Connection closed by peer" in odd
    slow = _out("eval-slow")
    assert "episode 4/8" in slow and "Timed out waiting 15000ms for recv" in slow
    for mode in ("buffer-leak", "level-walled"):
        out = _out(mode)
        assert "Timed out waiting 15000ms" in out and "[rank1]" not in out, mode
        assert "Exception in worker" not in out and "SPS" not in out, mode
    skew = _out("unroll-skew")
    assert skew.count("IndexError: index 21 is out of bounds for dimension 0 with size 21") == 4
    assert "EADDRINUSE" in _out("port-held")
    wall = _out("wall-term")
    assert "Received 15 death signal" in wall and "got signal: 15" in wall
