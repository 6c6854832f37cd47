"""Real gloo runs of a fifth training-program style (tests/programs/fourth_style_train.py: a
Trainer with hooks and a config dataclass, gradient accumulation under DDP's no_sync() or FSDP2,
Python logging `<ISO ms>Z <host> [worker N] LEVEL logger | msg` with ranks other than 0 at
WARNING only, an @record main whose tracebacks torchrun prints in its summary, a 15 s collective
timeout), launched six ways: torchrun --role trainer (console), --log-dir/--redirects 3 without
--tee (the console holds only the agent's lines), --local-ranks-filter 0 (the other ranks'
output is lost), --max-restarts 1 (the failure happens again in attempt 1), two agents as two
nodes, and plain python. Neither the program nor the launches were used to build the rules: the
diagnosis must generalise. Captured by tests/fixtures/real/capture_fourth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_fourth.sh)
EXPECTED: dict[str, Expected] = {
    # [console 3] every rank finishes and exits 0; the warnings (a UserWarning, a shard fetch that
    # failed with ConnectionResetError and was retried, gradient clipping) are harmless
    "noisy-ok": ("ok", None, []),
    # [logdir 4] the same training under FSDP2 (fully_shard), every rank exits 0
    "sharded-ok": ("ok", None, []),
    # [filter 3] rank 0's evaluation did not improve; its stop flag is broadcast at the same step
    # on every rank, all leave the loop at step 40, destroy the group and exit 0
    "patience-stop": ("ok", None, []),
    # [console 3] rank 1 skips the backward of the accumulation step whose loss spikes: its DDP
    # reducer launches the missed all-reduce in the next backward and the ranks line up again;
    # the job finishes and exits 0 (a warning, not a failure)
    "spike-skip": ("ok", None, []),
    # [logdir 3] only rank 0 evaluates, on a 2-sample quick set: a class never predicted makes
    # its precision divide by zero (ZeroDivisionError); the others wait in the next all-reduce
    "eval-zero-div": ("failed", "python-exception", [0]),
    # [restarts 4] rank 2 draws a batch of padding only: loss 0/0 = nan, the program's own check
    # raises FloatingPointError; the restarted attempt fails the same way
    "padded-batch-nan": ("failed", "python-exception", [2]),
    # [console 3] rank 1 syncs its metrics as broadcast then all_reduce, the others as
    # all_reduce then broadcast: every rank times out in a different collective
    "swapped-sync": ("failed", "collective-mismatch", [1]),
    # [console 4, FSDP2] after evaluation rank 0 alone calls all_gather_object; the others go on
    # to the next forward's FSDP all-gather
    "gather-on-main": ("failed", "collective-mismatch", [0]),
    # [console 3] rank 2's metrics writer takes its non-reentrant lock twice (flush inside write):
    # rank 2 deadlocks outside any collective, silent; ranks 0 and 1 time out waiting for it
    "relock": ("hung", "hang", [2]),
    # [logdir 3] rank 1 rebuilds its token index in a busy loop for 40 s; the others time out
    # after 15 s in the next all-reduce
    "cache-rebuild": ("failed", "slow-rank-timeout", [1]),
    # [filter 3] rank 0 uploads its checkpoint at 16 kB/s (a rate limit in the wrong unit) for
    # about 35 s; ranks 1 and 2 time out at the barrier after 15 s
    "throttled-upload": ("failed", "slow-rank-timeout", [0]),
    # [logdir 3] every rank resumes from a checkpoint cut short: torch.load fails ("failed finding
    # central directory"), a corrupt input file
    "truncated-resume": ("failed", "data-error", [0, 1, 2]),
    # [restarts 3] rank 1 SIGKILLs itself at step 25 in both attempts: the OOM killer's
    # signature, so host-oom (suggested, not proven)
    "self-kill": ("failed", "host-oom", [1]),
    # [filter 4] rank 3 calls libc abort() at step 20: SIGABRT, no Python traceback; its output
    # is not on the console, the agent's summary names its exit -6
    "self-abort": ("failed", "native-crash", [3]),
    # [console 3] DDP(device_ids=[local_rank]) around a CPU module: ValueError on every rank, a
    # device mapping made for GPUs
    "cpu-device-ids": ("failed", "device-assignment", [0, 1, 2]),
    # [console 3] DDP(static_graph=True) with no_sync() accumulation: the reducer's
    # "expect_autograd_hooks_ INTERNAL ASSERT FAILED" on every rank at the first synced backward
    "static-accum": ("failed", "python-exception", [0, 1, 2]),
    # [python] started with plain python and MASTER_ADDR/MASTER_PORT only: KeyError 'LOCAL_RANK'
    # at start, no rank
    "no-launcher": ("failed", "launcher-env-missing", []),
    # [nodes 2x2] node 1 runs with TRAIN_OPTIM=fused and has no apex: ModuleNotFoundError on ranks
    # 2 and 3; ranks 0 and 1 lose their peers
    "apex-one-node": ("failed", "missing-module", [2, 3]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("fourth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_fourth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_fourth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize("mode", ["patience-stop", "throttled-upload", "self-abort"])
def test_a_filtered_console_holds_only_rank_0s_lines(mode: str) -> None:
    """--local-ranks-filter 0: the program's lines of other ranks never reach the console."""
    workers = set(re.findall(r"\[worker (\d+)\]", RUNS.console(mode)))
    assert workers == {"0"}, workers


@pytest.mark.parametrize("mode", ["eval-zero-div", "cache-rebuild", "truncated-resume"])
def test_a_redirected_console_holds_only_the_agents_lines(mode: str) -> None:
    """--redirects 3 without --tee: the workers' lines are only in the per-rank files."""
    assert "[worker" not in RUNS.console(mode)
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 6
    assert "[worker" in "".join(f.read_text() for f in ranks)


@pytest.mark.parametrize(
    ("mode", "first"), [("padded-batch-nan", ("1", "2")), ("self-kill", ("-9", "1"))]
)
def test_a_restarted_run_shows_both_attempts(mode: str, first: tuple[str, str]) -> None:
    """--max-restarts 1: the agent reports a failed worker once per attempt, the fault's rank
    first. (Attempt 1 need not fail by the fault again: torch 2.13's restarted gloo workers
    often cannot form their group here; see capture_fourth.sh.)"""
    exits = RUNS.agent_exits(mode)
    assert len(exits) == 2, exits
    assert exits[0] == first
