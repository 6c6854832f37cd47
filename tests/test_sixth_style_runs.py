"""Real gloo runs of a seventh training-program style (tests/programs/sixth_style_train.py: a
tabular classifier written with PyTorch Lightning: a LightningModule and a LightningDataModule,
`Trainer(accelerator="cpu", devices=N, num_nodes=M, strategy=DDPStrategy(
process_group_backend="gloo", timeout=20 s))`, ModelCheckpoint, EarlyStopping and a custom
Callback, `self.log` with and without `sync_dist`, `self.all_gather`, `rank_zero_info` and
`rank_zero_only`, `trainer.strategy.barrier()`, Lightning's console lines and rich progress bar as
they come), launched six ways: plain python (Lightning's subprocess launcher), torchrun,
torchrun --log-dir --tee 3, torchrun --max-restarts 1 with an @record main, two torchrun agents
as two nodes, and the variables srun sets (Lightning's SLURMEnvironment) without Slurm. Neither
the program nor the launches were used to build the rules: the diagnosis must generalise.
Captured by tests/fixtures/real/capture_sixth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_sixth.sh)
EXPECTED: dict[str, Expected] = {
    # [python 2] every rank finishes its three epochs and exits 0; the noise is harmless: a
    # deprecation UserWarning of the program's own, a logged warning that wandb is not installed
    # (rank 0 only, caught), Lightning's "It is recommended to use self.log(..., sync_dist=True)"
    # for the unsynced metrics, its tips and its progress bar
    "calm-warnings": ("ok", None, []),
    # [torchrun 3] EarlyStopping(stopping_threshold=100) on val_loss (logged with sync_dist):
    # after the first validation every rank agrees to stop (Lightning reduces the decision),
    # all exit 0
    "plateau-halt": ("ok", None, []),
    # [logdir 3] rank 0 alone (rank_zero_only) writes a per-class report after the first real
    # validation and indexes a 3-name list with the fourth class: IndexError; ranks 1 and 2 go
    # on to the next collectives and lose or wait for rank 0
    "summary-crash": ("failed", "python-exception", [0]),
    # [torchrun 2] rank 1's copy of the table has rows of 1e38: its loss is NaN and the
    # program's own guard raises FloatingPointError; rank 0 waits for it in the gradient
    # all_reduce
    "nan-guard": ("failed", "python-exception", [1]),
    # [python 3] at batch 3 rank 2 broadcasts the learning rate (3 floats) before the
    # throughput all_reduce (1 float), ranks 0 and 1 the other way round: rank 2's collectives
    # are issued in a different order
    "order-swap": ("failed", "collective-mismatch", [2]),
    # [torchrun 3] rank 1 alone calls all_gather_object after validation to share its hard
    # examples; ranks 0 and 2 go on to their next collectives
    "object-gossip": ("failed", "collective-mismatch", [1]),
    # [torchrun 2] manual optimisation: rank 1 skips manual_backward and the step on a
    # "degenerate" batch (it says so) after DDP's forward; it issues one gradient all_reduce
    # fewer and its collectives no longer pair with rank 0's (no reducer error is raised:
    # nothing marked a gradient ready, so both time out)
    "skipped-backward": ("failed", "collective-mismatch", [1]),
    # [python 3] rank 1's callback takes a non-reentrant threading.Lock and calls a refresh
    # that takes it again: rank 1 deadlocks outside any collective, silent; ranks 0 and 2 time
    # out in their next collective
    "lock-twice": ("hung", "hang", [1]),
    # [nodes 2x2] at the start of epoch 1 rank 3 (node 1, local 1) rebuilds its vocabulary
    # cache in a busy loop for 60 s (it says so); the other ranks time out after 20 s
    "busy-prep": ("failed", "slow-rank-timeout", [3]),
    # [torchrun 3] after each validation rank 0 exports the model to slow storage (8 x 5 s,
    # announced), then every rank calls trainer.strategy.barrier(); ranks 1 and 2 time out in
    # the barrier after 20 s
    "slow-ckpt": ("failed", "slow-rank-timeout", [0]),
    # [python 2] fit(ckpt_path=last.ckpt) where last.ckpt was cut in half: torch.load fails on
    # every rank, a corrupt input file
    "torn-resume": ("failed", "data-error", [0, 1]),
    # [restarts 2, @record] rank 1 keeps 64 MiB per step and is SIGKILLed (as by the OOM
    # killer) at its sixth step; the agent restarts the group once: host-oom (suggested)
    "self-kill": ("failed", "host-oom", [1]),
    # [nodes 2x2] rank 2 (node 1, local 0) calls libc abort() in epoch 1: SIGABRT, no Python
    # traceback; the other ranks lose it
    "abort-native": ("failed", "native-crash", [2]),
    # [torchrun 2] a callback's setup calls torch.cuda.set_device(local_rank) on a CPU-only
    # build, on every rank: a device mapping made for GPUs
    "cuda-pin": ("failed", "device-assignment", [0, 1]),
    # [plain python, one process] the program reads WORLD_SIZE before creating the Trainer (to
    # scale the learning rate); nothing has set it: KeyError at start, no rank
    "no-env": ("failed", "launcher-env-missing", []),
    # [nodes 2x2] node 1 runs with TRAIN_PROFILER=1 and has no torch_tb_profiler:
    # ModuleNotFoundError on ranks 2 and 3 before the process group; ranks 0 and 1 wait for
    # them
    "profiler-node": ("failed", "missing-module", [2, 3]),
    # [logdir 3, @record] in epoch 1 rank 2's throughput report divides by the samples since
    # the last report after resetting that count: ZeroDivisionError; the agent's summary
    # quotes rank 2's traceback
    "record-fail": ("failed", "python-exception", [2]),
    # [slurm 3] each rank reads its own validation file; rank 2's has 20 rows, so its last
    # batch holds 4 predictions where the others hold 8, and self.all_gather of them mismatches
    # in size on rank 2
    "gather-shape": ("failed", "collective-mismatch", [2]),
    # [python 3] each rank reads its own training file; rank 2's is two batches shorter: it
    # leaves the training loop for validation while ranks 0 and 1 still train
    "uneven-shard": ("failed", "uneven-inputs", [2]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "cuda-pin": "failed/cuda-library-mismatch [0, 1] (CUDA105): AttributeError 'torch._C' has no "
    "'_cuda_setDevice' raised in torch.cuda.set_device called from a callback's setup, on a "
    "CPU-only build whose Lightning lines say 'GPU available: False, used: False'",
}


RUNS = RunSet("sixth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_sixth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_sixth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize(
    ("mode", "world"),
    [("calm-warnings", 2), ("order-swap", 3), ("torn-resume", 2), ("uneven-shard", 3)],
)
def test_lightnings_own_launcher_starts_every_rank(mode: str, world: int) -> None:
    """Plain python: Lightning's subprocess launcher, not an agent, starts the other ranks (no
    agent summary), and each says so in its own line."""
    console = RUNS.console(mode)
    for rank in range(world):
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{world}" in console
    assert "ChildFailedError" not in console


@pytest.mark.parametrize("mode", ["summary-crash", "record-fail"])
def test_a_teed_run_keeps_each_ranks_streams_in_its_own_files(mode: str) -> None:
    """--log-dir --tee 3: the console has every rank's lines prefixed, each rank's files its own."""
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 6
    assert "[default2]:" in RUNS.console(mode)
    assert "[default2]:" not in "".join(f.read_text() for f in ranks)


@pytest.mark.parametrize("mode", ["busy-prep", "abort-native", "profiler-node"])
def test_two_nodes_write_two_agent_logs(mode: str) -> None:
    """Two torchrun agents: each node's console is its own file, and node 1's processes are
    ranks 2 and 3."""
    RUNS.check_two_agents(mode)


def test_a_restarted_run_shows_both_attempts() -> None:
    """--max-restarts 1: the agent reports a failed worker once per attempt, the SIGKILLed rank
    first. (In this capture attempt 1 ends at start-up: torch 2.13's restarted gloo workers fail
    to connect their full mesh, as capture_sixth.sh says; in an earlier capture the kill came
    again.)"""
    exits = RUNS.agent_exits("self-kill")
    assert len(exits) == 2, exits
    assert exits[0] == ("-9", "1")


def test_a_recorded_main_puts_its_traceback_in_the_summary() -> None:
    """@record: the summary quotes the failing rank's exception instead of '<N/A>'."""
    summary = RUNS.console("record-fail").split("Root Cause")[-1]
    assert "error_file: <N/A>" not in summary
    assert "ZeroDivisionError: float division by zero" in summary


def test_slurm_variables_make_lightning_take_the_ranks_it_was_given() -> None:
    """The variables srun sets: Lightning's SLURMEnvironment takes the three processes as
    ranks 0-2 (and its requeue handler), with no hint that srun was not used."""
    console = RUNS.console("gather-shape")
    assert console.count("SLURM auto-requeueing enabled") == 3
    assert "MEMBER: 3/3" in console
    assert "is available on your system but is not used" not in console
