"""Real gloo runs of a twenty-sixth training-program style (tests/programs/twentysixth_style_train.py:
a Hydra application: `@hydra.main(config_path="twentysixth_conf", config_name="config",
version_base="1.3")` with a `model` config group built by `hydra.utils.instantiate`, dotted
overrides on the command line, raw DDP inside, a rank-0 checkpoint each epoch, a validation loss
all-reduced across ranks and an early stop on it). Every rank is a Hydra app: its job logging
writes the console in Hydra's "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s" and its run
folder's train.log (outputs/toy/rank<RANK>/ by the config; outputs/shared/ for all ranks where a
mode overrides hydra.run.dir); an exception in the task function is Hydra's to report ("Error
executing job with overrides: [...]", the trimmed traceback, "Set the environment variable
HYDRA_FULL_ERROR=1 for a complete stack trace.", exit 1), except in config-missing, the one run
with HYDRA_FULL_ERROR=1. Launched four ways: torchrun's console, torchrun with --log-dir
--redirects 3 --tee 3 (console.log and logs/), two torchrun agents as two nodes (node0.log,
node1.log), and the deprecated torch.distributed.launch (console.log). Each fixture keeps the
run's outputs/ (train.log, .hydra/*.yaml). Neither the program nor the launches were used to
build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_twentysixth.sh (hydra-core 1.3.2, omegaconf 2.3.0 in the capture's
own venv).

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_twentysixth.sh)
EXPECTED: dict[str, Expected] = {
    # [console 2] three epochs, a checkpoint and an all-reduced validation each; exit 0
    "tidy": ("ok", None, []),
    # [logdir 2, trainer.patience=1 trainer.epochs=6] the all-reduced validation loss does not
    # improve by min_delta after epoch 1: every rank logs "early stopping at epoch 1", leaves
    # the loop, destroys the group and exits 0
    "plateau-stop": ("ok", None, []),
    # [nodes 2x2, trainer.epochs=2] two epochs on two nodes, every rank and agent exits 0
    "nodes-clean": ("ok", None, []),
    # [console 2, model=resmlp, HYDRA_FULL_ERROR=1] the resmlp entry of the model group leaves
    # `blocks: ???` to the command line and the run does not give it: instantiate raises
    # omegaconf's MissingMandatoryValue (model.blocks) on every rank; with HYDRA_FULL_ERROR the
    # exception leaves the app whole ([rankN]: prefixed by torch's excepthook). A config error
    # on all ranks: no rank is a cascade of another
    "config-missing": ("failed", "python-exception", [0, 1]),
    # [logdir 2, trainer.epoch=2] an override of a key the config lacks (epochs): Hydra's
    # composition fails on every rank before the app runs ("Could not override
    # 'trainer.epoch'... Key 'epoch' is not in struct"), exit 1 on both
    "override-typo": ("failed", "python-exception", [0, 1]),
    # [console 3, hydra.run.dir=outputs/shared] rank 1 weights the classes by the counts of a
    # 3-sample slice of its batch at step 3: ZeroDivisionError (Hydra's trimmed traceback);
    # ranks 0 and 2 lose it in the gradient all-reduce (Connection closed by peer)
    "weights-r1": ("failed", "python-exception", [1]),
    # [logdir 2] rank 1 keeps 64 MiB a batch and is SIGKILLed at its fourth: no traceback, the
    # agent's exitcode -9 for local rank 1
    "oom-r1": ("failed", "host-oom", [1]),
    # [console 3] rank 2 dereferences NULL in native code at step 3: SIGSEGV, exitcode -11
    "segv-r2": ("failed", "native-crash", [2]),
    # [logdir 3] before epoch 1 rank 1 polls for a marker file a prefetcher that was never
    # started should write: silent, outside any collective; ranks 0 and 2 time out after 15 s
    "stuck-r1": ("hung", "hang", [1]),
    # [console 2] after saving epoch 0's checkpoint rank 0 uploads it to an artifact store that
    # keeps timing out (5 attempts of 5 s, each logged); rank 1 times out after 15 s in epoch
    # 1's gradient all-reduce
    "upload-r0": ("failed", "slow-rank-timeout", [0]),
    # [logdir 2] the barrier meant to fence the checkpoint sits inside rank 0's `if rank == 0:`
    # save branch: rank 0 waits in barrier, rank 1 in epoch 1's gradient all-reduce; both time
    # out after 15 s
    "barrier-r0": ("failed", "collective-mismatch", [0]),
    # [console 3, data.sharded=true] each rank reads its own shard file and shard 1 is half as
    # long (4 batches, the others 8, logged by each rank): rank 1 leaves the epoch for the
    # validation all-reduce while ranks 0 and 2 still all-reduce gradients; gloo's size check
    # aborts rank 1 (SIGABRT)
    "shard-short": ("failed", "uneven-inputs", [1]),
    # [console 3, trainer.patience=1 trainer.epochs=5, hydra.run.dir=outputs/shared] the early
    # stopper is consulted on rank 0 only: rank 0 logs "early stopping at epoch 1", destroys
    # its group and exits 0; ranks 1 and 2 go on into epoch 2's all-reduce and lose it
    "halt-r0": ("failed", "uncoordinated-exit", [0]),
    # [logdir 2, data.num_workers=2] sample 21 (rank 1's) has "n/a" in a feature column: the
    # dataset's __getitem__ raises ValueError in a DataLoader worker, re-raised on rank 1
    # ("Caught ValueError in DataLoader worker process 1"); rank 0 loses it
    "na-cell": ("failed", "data-error", [1]),
    # [console 2, model=transformer] the model group's transformer entry names
    # toy_models.TinyTransformer, whose package is not installed: instantiate fails on every
    # rank with Hydra's "Error locating target 'toy_models.TinyTransformer'" (the
    # ModuleNotFoundError is chained and hidden without HYDRA_FULL_ERROR)
    "no-module": ("failed", "missing-module", [0, 1]),
    # [nodes 2x2] the data set was staged on node 0's disk only: ranks 2 and 3 raise
    # FileNotFoundError 'data/train.csv'; ranks 0 and 1 lose them
    "data-node0": ("failed", "data-error", [2, 3]),
    # [console 2, static rendezvous on --master-port] a stale process listens on the port: the
    # agent's TCPStore cannot bind (EADDRINUSE) and no rank is started
    "port-held": ("failed", "rendezvous-failure", []),
    # [launch 2] torch.distributed.launch passes --local-rank=K; Hydra's argument parser
    # rejects it on every rank ("unrecognized arguments: --local-rank=0"), exit 2
    "launch-argv": ("failed", "local-rank-argument", [0, 1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("twentysixth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twentysixth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twentysixth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "HX_FAULT" not in f.read_text(errors="replace"), f


def _text(mode: str, pattern: str) -> str:
    return "\n".join(f.read_text(errors="replace") for f in RUNS.files(mode) if f.match(pattern))


def _run_folders(mode: str) -> list[str]:
    """Hydra's run folders the ranks wrote a train.log in (relative to outputs/)."""
    out = RUNS.folder(mode) / "outputs"
    return sorted(str(f.parent.relative_to(out)) for f in out.rglob("train.log"))


def test_two_agents_write_one_console_each() -> None:
    for mode in ("data-node0", "nodes-clean"):
        consoles = sorted(f.name for f in RUNS.folder(mode).glob("*.log"))
        assert consoles == ["node0.log", "node1.log"], consoles
        node1 = (RUNS.folder(mode) / "node1.log").read_text(errors="replace")
        assert "rank 2/4" in node1 and "rank 3/4" in node1 and "rank 0/4" not in node1
        assert _run_folders(mode) == [f"toy/rank{r}" for r in range(4)]
    assert "FileNotFoundError" not in (RUNS.folder("data-node0") / "node0.log").read_text()


@pytest.mark.parametrize(
    ("mode", "world"),
    [
        ("plateau-stop", 2),
        ("override-typo", 2),
        ("oom-r1", 2),
        ("stuck-r1", 3),
        ("barrier-r0", 2),
        ("na-cell", 2),
    ],
)
def test_the_log_dir_holds_each_local_rank_stdout_and_stderr(mode: str, world: int) -> None:
    names = {
        "/".join(f.relative_to(RUNS.folder(mode)).parts[-2:])
        for f in RUNS.files(mode)
        if f.parts[-5] == "logs" or f.name == "console.log"
    }
    assert names == {"console.log"} | {
        f"{r}/std{s}.log" for r in range(world) for s in ("out", "err")
    }, names


def test_hydra_logs_in_its_format_to_the_console_and_each_rank_run_folder() -> None:
    stamp = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[__main__\]\[INFO\] - "
    assert re.search(stamp + r"rank 1 finished", RUNS.console("tidy"), re.M)
    assert _run_folders("tidy") == ["toy/rank0", "toy/rank1"]
    rank1 = _text("tidy", "outputs/toy/rank1/train.log")
    assert "rank 1/2" in rank1 and "rank 0/2" not in rank1
    # one run folder for every rank where the run overrides hydra.run.dir
    assert _run_folders("weights-r1") == ["shared"]
    assert _run_folders("halt-r0") == ["shared"]


def test_hydra_reports_the_task_function_exception_trimmed() -> None:
    hint = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    console = RUNS.console("weights-r1")
    assert console.count("Error executing job with overrides: []") == 3
    assert "ZeroDivisionError: division by zero" in console and hint in console
    assert "Error executing job with overrides: ['model=transformer']" in RUNS.console("no-module")
    assert "ModuleNotFoundError" not in RUNS.console("no-module")
    assert "Error locating target 'toy_models.TinyTransformer'" in RUNS.console("no-module")
    # the one run with HYDRA_FULL_ERROR=1: the whole exception, no hint
    full = RUNS.console("config-missing")
    assert hint not in full
    for r in (0, 1):
        assert f"[rank{r}]: omegaconf.errors.MissingMandatoryValue" in full


def test_config_errors_come_before_the_app() -> None:
    typo = RUNS.console("override-typo")
    assert "Key 'epoch' is not in struct" in typo and "rank 0/2" not in typo
    argv = RUNS.console("launch-argv")
    for r in (0, 1):
        assert f"error: unrecognized arguments: --local-rank={r}" in argv
    held = RUNS.console("port-held")
    assert "EADDRINUSE" in held and "rank 0/2" not in held


def test_the_agent_reports_the_killed_and_the_lost() -> None:
    assert ("-9", "1") in RUNS.agent_exits("oom-r1")
    assert ("-11", "2") in RUNS.agent_exits("segv-r2")
    assert ("-6", "1") in RUNS.agent_exits("shard-short")
    assert "Received data size doesn't match expected size" in RUNS.console("shard-short")
    # rank 0 stopped alone and exited 0: the agent reports rank 1's failure, not rank 0's
    assert ("0", "0") not in RUNS.agent_exits("halt-r0")
    assert "early stopping at epoch 1" in RUNS.console("halt-r0")
    assert RUNS.console("plateau-stop").count("early stopping at epoch 1") == 2
