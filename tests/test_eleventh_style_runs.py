"""Real Ray Train runs of an eleventh training-program style (tests/programs/eleventh_style_train.py:
ray.init on this machine, a TorchTrainer of 2-4 RayTrainWorker actors on gloo with
TorchConfig(timeout_s=15) and FailureConfig(max_failures=0), prepare_model and
prepare_data_loader, ray.train.report every epoch with a checkpoint from rank 0, get_checkpoint on
resume, the user's print and logging lines). Ray launches the workers; console.log is the driver's
output: every worker line carries `(RayTrainWorker pid=N)` and no rank, the controller's
`(TorchTrainer pid=N)` lines list which pid is which world rank, the raylet and Tune print their
own errors, and the run ends in TrainingFailedError. Neither the program nor Ray's log format
were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_eleventh.sh (ray 2.40.0, torch 2.13.0 CPU); ray is not needed here.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
Culprits are world ranks, named only where the log proves them (Ray's error names a pid, the
controller's table maps that pid to its world rank)."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); workers in brackets
EXPECTED: dict[str, Expected] = {
    # [2] DDP warns on each worker that find_unused_parameters=True found none, torch warns that
    # 4 DataLoader processes exceed the 2 cores, the user logs WARNING lines every epoch; the run
    # completes
    "scary-but-fine": ("ok", None, []),
    # [4] four epochs, a checkpoint each, "Training completed after 4 iterations"
    "all-epochs-done": ("ok", None, []),
    # [3] rank 1's label check raises ValueError in epoch 1; the driver's RayTaskError(ValueError)
    # names the worker's pid, which the controller's table maps to world_rank=1
    "label-check-raise": ("failed", "python-exception", [1]),
    # [2] rank 0 alone all_reduces its 1-float validation loss after epoch 0 while rank 1 starts
    # epoch 1's gradient all_reduce: gloo finds 676 bytes where rank 0 expects 4 and SIGABRTs
    # rank 0 (its pid is world_rank=0); the raylet reports the dead worker
    "metric-sync-on-zero": ("failed", "collective-mismatch", [0]),
    # [3] rank 1 says it rebuilds its token cache and sleeps 45 s before prepare_model; rank 0
    # times out after 15 s in DDP's parameter check
    "slow-tokenize": ("failed", "slow-rank-timeout", [1]),
    # [3] rank 1 SIGKILLs itself in epoch 1 (the OOM killer's signature): the raylet's "worker
    # died" notice, "Worker 1 has failed.", ActorDiedError whose pid is world_rank=1 and whose
    # first guess is the OOM killer: host-oom, suggested not proven
    "killed-worker": ("failed", "host-oom", [1]),
    # [3] rank 2 reads address 0 in epoch 1: SIGSEGV with a faulthandler stack, no Python
    # exception; "Worker 2 has failed.", ActorDiedError
    "null-deref": ("failed", "native-crash", [2]),
    # [3] early stopping on each rank's own validation loss: rank 2's held-out split is
    # mislabelled, so it alone says it stops early after epoch 2 and returns; Ray's controller
    # finds one worker finished while the others report ("Some workers returned results while
    # others didn't")
    "local-early-stop": ("failed", "uncoordinated-exit", [2]),
    # [2] ray.train.report on rank 0 only, a call every worker must make (the driver takes one
    # result per worker): rank 0 blocks in its second report, rank 1 trains on and times out
    # after 15 s in the gradient all_reduce of epoch 2; rank 0 made the call in a rank branch
    "report-on-zero": ("failed", "collective-mismatch", [0]),
    # [3] the manifest names 3 shards, shard-0002.pt was not copied: rank 2 (pid -> world_rank=2)
    # fails in torch.load with FileNotFoundError
    "shard-missing": ("failed", "data-error", [2]),
    # [2] a DataLoader worker process of rank 1 is SIGKILLed in epoch 1: "DataLoader worker
    # (pid(s) N) exited unexpectedly" from the Ray worker whose pid is world_rank=1
    "loader-sigkill": ("failed", "dataloader-worker-killed", [1]),
    # [3] rank 2's metrics writer takes its non-reentrant lock twice in epoch 1: rank 2 deadlocks
    # outside any collective, silent; ranks 0 and 1 block in ray.train.report (the driver waits
    # for rank 2's result), so no collective times out; the capture's SIGINT after 120 s ends
    # the run (Tune: "Stop signal received"). Ranks 1 and 2 print nothing before it: the log
    # cannot tell which of them is stuck, so no culprit
    "lock-twice": ("hung", "hang", []),
    # [3] 4 shards dealt as shards[rank::3]: rank 0 reads 2, ranks 1 and 2 read 1 each (they say
    # so); ranks 1 and 2 finish the epoch and block in report while rank 0 still trains and
    # times out after 15 s in its gradient all_reduce
    "shards-vs-workers": ("failed", "uneven-inputs", [1, 2]),
    # [2] resume_from_checkpoint names checkpoint_000000 of an earlier run whose
    # CheckpointConfig(num_to_keep=1) deleted it: every worker's torch.load raises
    # FileNotFoundError, but Ray shows only the first worker's error (its pid is world_rank=0);
    # nothing in the log shows rank 1's
    "resume-rotated": ("failed", "data-error", [0]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "report-on-zero": "slow-rank-timeout on rank 0 (INF201, 0.4): the culprit is right (alive: rank 1 only "
    "timed out, gloo would have reported it leaving), but a call only some workers make "
    "is read as a busy rank, not a collective mismatch",
    "shards-vs-workers": "failed, slow-rank-timeout on rank 2 (INF201, 0.6): the workers' "
    "'reading 2 of 4 shards' / 'reading 1 of 4 shards' (uneven shards per worker) are not read "
    "as uneven inputs; rank 2, alive, not the main process, and printing after the others had "
    "timed out, is read as busy past the timeout (at first sight: hang, read as stuck)",
}


RUNS = RunSet("eleventh-", EXPECTED, MISSES, label_nowhere=True)


def pid_ranks(console: str) -> dict[int, int]:
    """The controller's table (`- (node_id=..., ip=..., pid=N) world_rank=R, ...`): the only
    place that ties a RayTrainWorker's pid to its world rank."""
    table = re.findall(r"pid=(\d+)\) world_rank=(\d+), local_rank=\d+", console)
    return {int(pid): int(rank) for pid, rank in table}


@pytest.mark.parametrize("mode", RUNS.params())
def test_eleventh_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_eleventh_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_ray_prefixes_worker_lines_with_a_pid_and_lists_which_pid_is_which_rank(mode: str) -> None:
    """Every run starts its worker group: one table row per worker, the worker's own lines
    prefixed by its pid only."""
    console = RUNS.console(mode)
    ranks = pid_ranks(console)
    assert sorted(ranks.values()) == list(range(len(ranks))) and len(ranks) >= 2
    prefixed = {int(p) for p in re.findall(r"\(RayTrainWorker pid=(\d+)\)", console)}
    assert prefixed <= set(ranks)
    assert not re.search(r"\(RayTrainWorker pid=\d+, rank", console)


@pytest.mark.parametrize(
    ("mode", "rank"),
    [
        ("label-check-raise", 1),
        ("shard-missing", 2),
        ("loader-sigkill", 1),
        ("killed-worker", 1),
        ("null-deref", 2),
        ("resume-rotated", 0),
    ],
)
def test_the_failed_workers_pid_maps_to_the_culprits_world_rank(mode: str, rank: int) -> None:
    """Ray names the failed worker by pid (RayTaskError's `get_next() (pid=N` or
    ActorDiedError's `pid: N`); the controller's table turns it into the world rank."""
    console = RUNS.console(mode)
    named = re.findall(r"__execute\.get_next\(\)\S* \(pid=(\d+)|^\tpid: (\d+)$", console, re.M)
    pids = {int(a or b) for a, b in named}
    assert {pid_ranks(console)[p] for p in pids} == {rank}


def test_a_run_ends_in_training_failed_error_or_completes() -> None:
    """Each failed run ends in Ray's TrainingFailedError; the healthy ones say they completed;
    the hung one was stopped by the capture's SIGINT."""
    for mode, (status, _, _) in EXPECTED.items():
        console = RUNS.console(mode)
        if status == "ok":
            assert "Training completed after" in console, mode
        elif status == "hung":
            assert "Stop signal received (e.g. via SIGINT/Ctrl+C)" in console, mode
        else:
            assert "TrainingFailedError: The Ray Train run failed" in console, mode
