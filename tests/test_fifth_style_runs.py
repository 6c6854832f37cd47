"""Real gloo runs of a sixth training-program style (tests/programs/fifth_style_train.py: a
token classifier written with HF Accelerate: gradient accumulation through
`accelerator.accumulate`, `gather_for_metrics`, `reduce`, `check_trigger` every step,
`save_state`/`load_state`, accelerate.logging lines `MM/DD/YYYY HH:MM:SS - LEVEL - name -
[RANK n] msg` (main process only unless asked), `accelerator.print`, tqdm on the local main
process, a 15 s collective timeout through InitProcessGroupKwargs), launched eight ways:
accelerate launch --multi_gpu on CPU, accelerate launch with a config file, --tee/--log_dir,
torchrun on the same script, python -m accelerate.commands.launch, --max_restarts 1 with an
@record main, two accelerate launch agents as two machines, and plain python. Neither the
program nor the launches were used to build the rules: the diagnosis must generalise.
Captured by tests/fixtures/real/capture_fifth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_fifth.sh)
EXPECTED: dict[str, Expected] = {
    # [alaunch 2] every rank finishes and exits 0; the noise is harmless: accelerate launch's
    # defaults warning, torch.cuda.amp.GradScaler's deprecation and "CUDA is not available"
    # warnings, one step whose gradient norm is nan on every rank (skipped by the program on
    # each rank alike), and a refused dashboard push logged with its traceback
    "noisy-ok": ("ok", None, []),
    # [config 3] after the first evaluation every rank calls set_trigger(); check_trigger()
    # agrees on all ranks, they leave the loop at the same step and exit 0
    "trigger-stop": ("ok", None, []),
    # [torchrun 3] rank 0 alone decides to stop after the first evaluation (no trigger) and
    # waits in wait_for_everyone(); ranks 1 and 2 go on training and time out in their next
    # collective
    "main-only-stop": ("failed", "uncoordinated-exit", [0]),
    # [alaunch 3] rank 0 alone writes the evaluation table and formats a 5-element tensor with
    # ':.3f' (TypeError); ranks 1 and 2 go on to the next step's collectives and lose rank 0
    "report-format": ("failed", "python-exception", [0]),
    # [module 2] rank 1 meets a constant sample: its per-sample standardisation divides 0 by 0,
    # and anomaly detection raises in backward ("returned nan values"); rank 0 waits for it
    "anomaly-nan": ("failed", "python-exception", [1]),
    # [config 3] at step 7 rank 0 broadcasts the schedule before its backward, ranks 1 and 2
    # after theirs: rank 0's broadcast meets their gradient all_reduce, each rank times out
    # in a different collective
    "bcast-first": ("failed", "collective-mismatch", [0]),
    # [logdir 3] rank 1 alone finds flagged samples in its shard and calls
    # broadcast_object_list to announce them; ranks 0 and 2 go on to their next collectives
    "object-one-rank": ("failed", "collective-mismatch", [1]),
    # [torchrun 2] rank 1 skips a batch with no labelled tokens at a gradient-sync step (its
    # backward and that step's check_trigger): from then on its collectives pair with other
    # ones, until sizes differ (gloo's "collective mismatch" enforce, SIGABRT)
    "empty-batch-skip": ("failed", "collective-mismatch", [1]),
    # [alaunch 3] rank 1's main thread and its prefetch thread take two locks in opposite
    # orders: rank 1 deadlocks outside any collective, silent; ranks 0 and 2 time out
    "abba": ("hung", "hang", [1]),
    # [config 3] rank 2 rebuilds its sample index in a busy loop for 45 s (it says so); ranks 0
    # and 1 time out after 15 s in the next collective
    "index-rebuild": ("failed", "slow-rank-timeout", [2]),
    # [torchrun 3] after save_state rank 0 uploads the checkpoint to an artifact store that
    # refuses, backing off 1+2+4+8+16 s; ranks 1 and 2 time out in wait_for_everyone()
    "slow-save": ("failed", "slow-rank-timeout", [0]),
    # [alaunch 2] load_state from a checkpoint whose optimizer.bin was cut in half: torch.load
    # fails on every rank, a corrupt input file
    "torn-optimizer": ("failed", "data-error", [0, 1]),
    # [restarts 2] rank 1 keeps 64 MiB per step and is SIGKILLed (as by the OOM killer), in
    # each attempt: host-oom (suggested, not proven)
    "oom-restart": ("failed", "host-oom", [1]),
    # [nodes 2x2] rank 3 (machine 1, local 1) dereferences a null pointer in a C call: SIGSEGV,
    # no Python traceback; the other ranks lose it
    "native-segv": ("failed", "native-crash", [3]),
    # [module 2] torch.cuda.set_device(local_process_index) on a CPU-only build, on every rank:
    # a device mapping made for GPUs
    "gpu-pin": ("failed", "device-assignment", [0, 1]),
    # [python] started with plain python: KeyError 'WORLD_SIZE' at start, no rank
    "no-world": ("failed", "launcher-env-missing", []),
    # [nodes 2x2] machine 1 asks for the 8-bit optimizer and has no bitsandbytes:
    # ModuleNotFoundError on ranks 2 and 3; ranks 0 and 1 lose their peers
    "tracker-one-node": ("failed", "missing-module", [2, 3]),
    # [logdir 3] even_batches=False: 8 batches dealt over 3 ranks, rank 2 gets 2 and leaves the
    # loop for evaluation while ranks 0 and 1 still train their third batch
    "short-shard": ("failed", "uneven-inputs", [2]),
    # [alaunch 3, @record] a sequence one token too long reaches rank 1's collate: torch.stack
    # raises RuntimeError; the agent's summary quotes rank 1's traceback
    "collate-record": ("failed", "python-exception", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "gpu-pin": "failed/cuda-library-mismatch [0, 1] (CUDA105, as 'Torch not compiled with CUDA "
    "enabled'): AttributeError 'torch._C' has no '_cuda_setDevice' raised in "
    "torch.cuda.set_device on a CPU-only build (the ranks' state says MULTI_CPU, gloo, cpu:0)",
}


RUNS = RunSet("fifth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_fifth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_fifth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize("mode", ["object-one-rank", "short-shard"])
def test_a_teed_run_keeps_each_ranks_streams_in_its_own_files(mode: str) -> None:
    """--tee 3 --log_dir: the console has every rank's lines, each rank's files its own."""
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 6
    assert "[RANK 0]" in "".join(f.read_text() for f in ranks)
    assert "[RANK 0]" in RUNS.console(mode)


@pytest.mark.parametrize("mode", ["native-segv", "tracker-one-node"])
def test_two_machines_write_two_agent_logs(mode: str) -> None:
    """Two accelerate launch agents: each machine's console is its own file, and machine 1's
    processes are ranks 2 and 3."""
    RUNS.check_two_agents(mode)


def test_a_restarted_run_shows_both_attempts() -> None:
    """--max_restarts 1: the agent reports a failed worker once per attempt, the SIGKILLed rank
    first. (Attempt 1 ends at start-up here: torch 2.13's restarted gloo workers fail to
    connect their full mesh, as capture_fifth.sh says.)"""
    exits = RUNS.agent_exits("oom-restart")
    assert len(exits) == 2, exits
    assert exits[0] == ("-9", "1")


def test_a_recorded_main_puts_its_traceback_in_the_summary() -> None:
    """@record: the summary quotes the failing rank's exception instead of '<N/A>'."""
    summary = RUNS.console("collate-record").split("Root Cause")[-1]
    assert "error_file: <N/A>" not in summary
    assert "stack expects each tensor to be equal size" in summary
