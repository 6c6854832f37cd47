"""Real gloo runs of a fourteenth training-program style (tests/programs/fourteenth_style_train.py:
a detection-training CLI in the way of ultralytics (YOLO), raw torch: one plain command with
key=value arguments; with nproc > 1 the main process writes a temp launcher file under
~/.config/Kestrel/DDP, prints `DDP: debug command ... -m torch.distributed.run ...`, runs it with
subprocess.run(check=True) (a failure ends in the parent's CalledProcessError, after torchrun's
report) and deletes it in a finally; rank 0 builds labels.cache first (torch_distributed_zero_first),
validates alone while the others wait in the broadcast of the EarlyStopping decision, saves
last.pt/best.pt; resume=True restarts from last.pt; tqdm-like progress lines; a 15 s collective
timeout), launched four ways: the tool's own launch (no rank prefixes), torchrun --standalone on
the program itself, torchrun --log-dir --tee 3, and plain python with nproc=1. Neither the
program nor the launches were used to build the rules: the diagnosis must generalise. Captured
by tests/fixtures/real/capture_fourteenth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_fourteenth.sh)
EXPECTED: dict[str, Expected] = {
    # [tool 2, workers=4] GradScaler disabling itself without CUDA, DataLoader's "suggested max
    # number of worker" warning on a 2-core box, torchrun's OMP_NUM_THREADS banner; 3 epochs, rc 0
    "chatty-fit": ("ok", None, []),
    # [torchrun 2] lr0=0: the fitness stops improving, EarlyStopping(patience=2) on rank 0 says
    # stop, the decision is broadcast, every rank leaves the loop before epoch 10 and exits 0
    "plateau-quit": ("ok", None, []),
    # [python, nproc=1] one process, no process group, 2 epochs, exits 0
    "lone-fit": ("ok", None, []),
    # [tool 4] four ranks on two cores: slow but healthy, 2 epochs, exits 0
    "crowded-cores": ("ok", None, []),
    # [tool 2] rank 0's validation: every batch's NMS runs into its time limit ("NMS time limit
    # exceeded"), the whole validation outlasts the 15 s timeout; rank 1 times out in the
    # broadcast of the stop decision, rank 0 was busy, not dead
    "val-drag": ("failed", "slow-rank-timeout", [0]),
    # [tool 3] rank 0's metric code stacks the labels of the validation set's background image
    # (none): RuntimeError on rank 0 alone; ranks 1-2 lose their peer in the broadcast
    "val-crash": ("failed", "python-exception", [0]),
    # [tool 2] EarlyStopping decides on rank 0, the decision is not broadcast: rank 0 leaves the
    # loop, validates best.pt and exits 0; rank 1 trains on and loses its peer in all-reduce
    "stop-unshared": ("failed", "uncoordinated-exit", [0]),
    # [tool 2] rank 1 waits for labels.cache to exist instead of at the barrier and unpickles it
    # while rank 0 is still writing it: a truncated cache (a cache race) on rank 1
    "cache-torn": ("failed", "data-error", [1]),
    # [logdir 2, workers=2] an image listed by its label file is gone: "Image Not Found" in a
    # DataLoader worker of rank 1 (the sampler gives that image to rank 1), re-raised there
    "imgs-absent": ("failed", "data-error", [1]),
    # [tool 2, workers=2] a DataLoader worker of rank 1 grows and is SIGKILLed: rank 1's main
    # process raises "DataLoader worker ... is killed by signal: Killed."
    "loader-reaped": ("failed", "dataloader-worker-killed", [1]),
    # [tool 3] rank 1 caches images in RAM without bound and is SIGKILLed in epoch 2 (the OOM
    # killer's signature: -9, no traceback)
    "rank-reaped": ("failed", "host-oom", [1]),
    # [tool 2] resume=True with last.pt cut in half: torch.load fails on every rank
    "resume-cut": ("failed", "data-error", [0, 1]),
    # [tool 2] resume=True and no last.pt: the main process raises FileNotFoundError before it
    # launches anything; there is no rank
    "resume-void": ("failed", "data-error", []),
    # [tool 2] the tool starts torchrun without waiting and its finally deletes the temp launcher
    # file at once: python cannot open the file in any worker
    "launcher-gone": ("failed", "entrypoint-not-found", [0, 1]),
    # [tool 2] the tool's launch goes through torch.distributed.launch (which passes
    # --local-rank=N) to a temp file whose argparse knows --local_rank only: every rank exits 2
    "argv-dash": ("failed", "local-rank-argument", [0, 1]),
    # [tool 2, port=P] the user pinned the port another process listens on: torchrun's TCPStore
    # cannot bind it (EADDRINUSE); no worker starts
    "port-held": ("failed", "rendezvous-failure", []),
    # [torchrun 2] a label with a zero-width box (rank 1's third batch): the box loss is inf, the
    # trainer's finiteness guard raises FloatingPointError on rank 1 alone
    "inf-guard": ("failed", "python-exception", [1]),
    # [logdir 2] the dataset holds the caches of an earlier run: rank 0 takes the cache lock and
    # returns the valid cache without releasing it; rank 1 waits for that lock forever, printing
    # nothing, outside any collective; rank 0 times out (15 s) in DDP's all-reduce
    "cache-lock": ("hung", "hang", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("fourteenth-", EXPECTED, MISSES, label_nowhere=True)
TOOL_LAUNCHED = [
    "chatty-fit",
    "crowded-cores",
    "val-drag",
    "val-crash",
    "stop-unshared",
    "cache-torn",
    "loader-reaped",
    "rank-reaped",
    "resume-cut",
    "launcher-gone",
    "argv-dash",
    "port-held",
]


@pytest.mark.parametrize("mode", RUNS.params())
def test_fourteenth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_fourteenth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize("mode", TOOL_LAUNCHED)
def test_the_tool_launches_torchrun_on_a_temp_file_and_echoes_its_failure(mode: str) -> None:
    """The main process prints its debug command over a temp launcher file; a failed job ends in
    the parent's CalledProcessError naming that command, after everything torchrun printed."""
    console = RUNS.console(mode)
    command = re.search(
        r"DDP: debug command (\S+) -m (torch\.distributed\.\w+) .*(_temp_\w+\.py)", console
    )
    assert command, console[:2000]
    failed = EXPECTED[mode][0] != "ok"
    assert ("subprocess.CalledProcessError: Command" in console) == failed
    if failed:
        echo = console.rindex("subprocess.CalledProcessError")
        assert command.group(3) in console[echo:]
        assert "torch.distributed" not in console[echo:].replace(command.group(2), "")
        assert "[default" not in console  # the tool's launch prefixes no rank


def test_early_stopping_ends_every_rank_before_the_last_epoch() -> None:
    console = RUNS.console("plateau-quit")
    assert "Stopping training early as no improvement observed in last 2 epochs" in console
    assert "10 epochs completed" not in console
    assert "ChildFailedError" not in console


def test_the_unshared_stop_leaves_rank_1_training() -> None:
    """Rank 0 printed its stop and finished; torchrun reports only local rank 1 as failed."""
    console = RUNS.console("stop-unshared")
    assert "Stopping training early" in console
    assert "epochs completed in" in console
    assert RUNS.agent_exits("stop-unshared") == [("1", "1")]


def test_the_slow_validation_warned_and_outlasted_the_timeout() -> None:
    console = RUNS.console("val-drag")
    assert console.count("NMS time limit") >= 7  # 2.2 s each: over 15 s of validation
    assert "15000ms" in console


def test_the_missing_checkpoint_fails_before_any_launch() -> None:
    console = RUNS.console("resume-void")
    assert "Resume checkpoint not found" in console
    assert "DDP: debug command" not in console


def test_the_removed_launcher_file_is_reported_by_python_in_every_worker() -> None:
    console = RUNS.console("launcher-gone")
    assert console.count("can't open file") == 2
    assert {r for _, r in RUNS.agent_exits("launcher-gone")} <= {"0", "1"}


@pytest.mark.parametrize("mode", ["imgs-absent", "cache-lock"])
def test_a_teed_run_keeps_each_ranks_streams_in_its_own_files(mode: str) -> None:
    """--log-dir --tee 3: the console has every rank's lines prefixed, each rank's files its own."""
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 4
    assert "[default0]:" in RUNS.console(mode)
    assert "[default" not in "".join(f.read_text() for f in ranks)


def test_the_rank_waiting_for_the_lock_printed_nothing() -> None:
    """Rank 1 logs errors only and never got past the cache lock: its files and its console
    prefix are empty, while rank 0 timed out in the first all-reduce."""
    rank1 = [f for f in RUNS.files("cache-lock") if f.parent.name == "1" and f.suffix == ".log"]
    assert len(rank1) == 2 and all(f.stat().st_size == 0 for f in rank1)
    console = RUNS.console("cache-lock")
    assert "[default1]:" not in console
    # gloo words the same 15 s timeout either way, from run to run
    assert "Timed out waiting 15000ms" in console or "Application timeout caused pair" in console


def test_a_plain_python_run_has_no_agent_and_no_launcher_file() -> None:
    console = RUNS.console("lone-fit")
    assert "DDP: debug command" not in console
    assert "2 epochs completed in" in console
