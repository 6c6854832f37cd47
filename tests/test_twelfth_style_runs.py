"""Real gloo runs of a twelfth training-program style (tests/programs/twelfth_style_train.py:
torchtitan-style PyTorch-native code in raw torch: a TOML job config with dotted CLI overrides,
FSDP2 (`fully_shard` on each block and the root) on a tiny llama, `torch.distributed.checkpoint`
saves of `get_state_dict` into `<dump>/checkpoint/step-N` every 5 steps and a resume from the
newest one through `set_state_dict`, torchtitan-like `step: N  loss: ...  memory: ...  tps: ...
mfu: ...` lines through Python logging, @record on main, a 15 s collective timeout, and torchrun
--max-restarts 1 restarting the worker group, whose next attempt resumes from the checkpoint),
launched six ways: torchrun --standalone (console), torchrun --standalone --max-restarts 1,
torchrun --log-dir --tee 3, two torchrun agents as two nodes (c10d rendezvous, with and without
restarts), a static rendezvous, and plain python. Neither the program nor the launches were used
to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_twelfth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_twelfth.sh)
EXPECTED: dict[str, Expected] = {
    # [console 2] a deprecated GradScaler FutureWarning, GradScaler disabling itself because
    # CUDA is not available, "Peak flops undefined ... fallback to A100"; 12 steps, exits 0
    "noisy-warmup": ("ok", None, []),
    # [restarts 2] attempt 0: rank 1's shard read fails once with EIO at step 7 (OSError), the
    # agent restarts the worker group, attempt 1 resumes from the step-5 checkpoint and trains
    # to step 20; every rank of the last attempt exits 0: the job ended well
    "bounce-once": ("ok", None, []),
    # [restarts 2] decay_ratio 0: the WSD schedule's decay phase divides by 0 decay steps at
    # step 20 on every rank (ZeroDivisionError in the LR lambda); attempt 1 resumes from step 15
    # and fails the same way; the restarts run out
    "decay-zero": ("failed", "python-exception", [0, 1]),
    # [console 2] the resumed step-10 checkpoint lacks rank 1's __1_0.distcp (the copy never
    # arrived): DCP's read plan has both ranks read from that file, both reads fail
    # (FileNotFoundError), and its CheckpointException names ranks 0 and 1 on every rank
    "distcp-gone": ("failed", "data-error", [0, 1]),
    # [console 2] the resumed checkpoint's .metadata is cut in half: every rank reads it and
    # fails to unpickle it, a corrupt input file on every rank
    "meta-cut": ("failed", "data-error", [0, 1]),
    # [console 2] resumed with --model.n_layers 3 over a 2-layer checkpoint: DCP's planner finds
    # no layers.2 keys in the checkpoint, the same error on every rank
    "wider-model": ("failed", "python-exception", [0, 1]),
    # [python] one process, the env set by hand, resumes the 2-rank checkpoint (DCP reshards
    # it) and trains to step 20, exits 0
    "one-proc-reshard": ("ok", None, []),
    # [restarts 3] rank 2 leaks 32 MiB a step and is SIGKILLed at step 8 (the OOM killer's
    # signature), in attempt 0 and again in attempt 1 (resumed from step 5): host-oom
    "kill-nine": ("failed", "host-oom", [2]),
    # [console 2] at the step-10 save rank 1's checkpoint stager takes its own non-reentrant
    # lock twice: rank 1 blocks outside any collective, printing nothing; rank 0 times out
    # (15 s) in DCP's save collective
    "stager-relock": ("hung", "hang", [1]),
    # [logdir 2] the logged loss is all-reduced on rank 0 only (a rank-dependent collective in
    # the logging path): rank 0's all_reduce meets rank 1's next FSDP all-gather
    "loss-avg-main": ("failed", "collective-mismatch", [0]),
    # [nodes 2x2] rank 3's data shard is all zeros (padding only): every label is ignored, its
    # loss is NaN and the program's finiteness check raises on rank 3 only
    "zero-shard": ("failed", "python-exception", [3]),
    # [logdir 2] the data folder lacks rank 1's shard: FileNotFoundError on rank 1
    "shard-absent": ("failed", "data-error", [1]),
    # [console 2, a wider model] a SIGTERM from outside (the scheduler's time limit) reaches
    # torchrun while the step-15 checkpoint is being written; the agent stops the workers
    "time-limit": ("failed", "preempted", []),
    # [console 3] the config's data_parallel_shard_degree is 2, the launch has 3 processes:
    # the same ValueError on every rank before the process group forms
    "dp-degree": ("failed", "python-exception", [0, 1, 2]),
    # [static 2] another process listens on the --master-port: the agent's TCPStore cannot
    # bind (EADDRINUSE); no worker starts
    "port-taken": ("failed", "rendezvous-failure", []),
    # [console 2, 40 s limit] training completes on both ranks, rank 1 exits 0, rank 0's
    # interpreter waits forever at exit for its non-daemon metrics thread: a teardown hang
    "flusher-stuck": ("hung", "exit-teardown-crash", [0]),
    # [nodes 2x2, both agents --max-restarts 1] rank 2's shard read fails once with EIO in
    # attempt 0; both agents restart, attempt 1 resumes from step 5 and completes: ok
    "node-bounce": ("ok", None, []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "flusher-stuck": "hung, exit-teardown-crash with no culprit (INF210, 0.6): the kind and "
    "status are right, but rank 0 (the one process still alive after 'Training completed', the "
    "only one the agent had to SIGTERM, by pid) is not named: nothing maps that pid to a rank",
}


RUNS = RunSet("twelfth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twelfth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twelfth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


def test_a_restarted_attempt_resumes_from_the_checkpoint_and_finishes() -> None:
    """--max-restarts 1: rank 1 fails once in attempt 0, the agent restarts the group and the
    new attempt resumes from the step-5 checkpoint; torchrun reports no failure at the end."""
    console = RUNS.console("bounce-once")
    assert RUNS.agent_exits("bounce-once") == [("1", "1")]
    assert "OSError: [Errno 5] Input/output error" in console
    assert console.count("Loading the checkpoint at step 5.") == 2
    assert console.count("Training completed") == 2
    assert "ChildFailedError" not in console


@pytest.mark.parametrize(
    ("mode", "code", "rank"), [("decay-zero", "1", None), ("kill-nine", "-9", "2")]
)
def test_a_failure_repeated_in_every_attempt_runs_out_of_restarts(
    mode: str, code: str, rank: str | None
) -> None:
    """The same failure ends attempt 0 and attempt 1 (resumed from a checkpoint): the agent
    reports a failed worker per attempt, then gives up. (When every rank raises at once, which
    one the agent reports first varies from run to run.)"""
    exits = RUNS.agent_exits(mode)
    assert len(exits) == 2, exits
    assert all(c == code for c, _ in exits), exits
    assert rank is None or all(r == rank for _, r in exits), exits
    assert "Loading the checkpoint at step" in RUNS.console(mode)
    assert "ChildFailedError" in RUNS.console(mode)


@pytest.mark.parametrize("mode", ["loss-avg-main", "shard-absent"])
def test_a_teed_run_keeps_each_ranks_streams_in_its_own_files(mode: str) -> None:
    """--log-dir --tee 3: the console has every rank's lines prefixed, each rank's files its own."""
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 4
    assert "[default1]:" in RUNS.console(mode)
    assert "[default" not in "".join(f.read_text() for f in ranks)


def test_two_nodes_write_two_agent_logs() -> None:
    """Two agents as two nodes: each node's console is its own file, node 1's ranks are 2-3."""
    RUNS.check_two_agents("zero-shard")


def test_two_restarted_nodes_resume_together() -> None:
    """Both agents restart after rank 2's failure (a transient connectFullMesh failure may come
    with the re-rendezvous) and both nodes' workers resume from step 5 and finish."""
    for node in ("node0.log", "node1.log"):
        text = (RUNS.folder("node-bounce") / node).read_text()
        assert "Training starts at step 6" in text
        assert text.rstrip().endswith("Training completed")
    assert "[rank2]: OSError: [Errno 5]" in (RUNS.folder("node-bounce") / "node1.log").read_text()


def test_the_time_limit_came_while_a_checkpoint_was_written() -> None:
    """The agent got SIGTERM after a 'Saving the checkpoint' line and before its 'Finished'."""
    console = RUNS.console("time-limit")
    death = console.index("Received 15 death signal")
    last_save = console.rindex("Saving the checkpoint", 0, death)
    assert "Finished saving" not in console[last_save:death]


def test_a_plain_python_run_has_no_agent() -> None:
    """Plain python: one process resumes the 2-rank checkpoint, no rank prefixes, no agent."""
    console = RUNS.console("one-proc-reshard")
    assert "ChildFailedError" not in console
    assert "[rank" not in console
    assert "Loading the checkpoint at step 10." in console


def test_a_job_stopped_from_outside_after_training_ended_hung_in_teardown() -> None:
    """flusher-stuck: both ranks said 'Training completed', then nothing for 33 s until the
    time limit's SIGTERM reached the agent: nothing crashed, a process had not exited."""
    verdict = RUNS.report("flusher-stuck").verdict
    assert (verdict.status, verdict.kind) == ("hung", "exit-teardown-crash")
