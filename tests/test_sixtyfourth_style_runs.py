"""Real gloo runs of a sixty-fourth training-program style (tests/programs/sixtyfourth_style_train.py:
scientific machine learning in the way of NVIDIA Modulus / PhysicsNeMo's examples, a Fourier
neural operator trained on a synthetic Darcy flow problem as examples/cfd/darcy_fno does).
Launched as those examples are, by torchrun on one node: `torchrun --nnodes=1 --nproc_per_node=3
--master_port=PORT sixtyfourth_style_train.py key=value...` (Hydra-like overrides), so 3 ranks,
gloo, a 15 s collective timeout. A hand-made DistributedManager reads torchrun's environment;
Modulus' PythonLogger writes '[HH:MM:SS - name - LEVEL] message' records (success lines green,
warnings yellow, as ANSI escapes), a RankZeroLoggingWrapper keeps the 'darcy_fno' records to
rank 0 (a rank's own warnings go through the unwrapped logger, with no rank in them), the
'checkpoint' logger speaks on every rank (load_checkpoint's "Provided checkpoint directory
./checkpoints does not exist, skipping load" three times), and a LaunchLogger-like context
all-reduces the epoch's loss and has rank 0 log 'Epoch 3 Metrics: Learning Rate =  3.612e-03,
Loss =  5.488e-01' and 'Epoch Execution Time:  1.681e-01s, Time/Iter:  2.102e+01ms'. Each rank
reads its own shard (data/darcy_train_RANK.npz, data/darcy_val_RANK.npz), validation every 2
pseudo-epochs computes a relative L2 error (all-reduced) and all-gathers one predicted field a
rank for rank 0's plots; rank 0 saves ./checkpoints/FourierNeuralOperator.0.EPOCH.mdlus and
checkpoint.0.EPOCH.pt, and every rank loads the latest at start. The fixture of a mode is
console.log: everything torchrun and its workers printed, stdout and stderr in one stream (as
`2>&1 | tee` keeps it), captured by tests/fixtures/real/capture_sixtyfourth.sh (ports
38461-38477). Neither the program nor the launch were used to build the rules: the diagnosis
must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 15 of 17 right (calm-grid, loud-grid, tol-met, solo-tol, val-solo, nan-norm,
cache-swell, fft-null, queue-park, short-npz, npz-gone, torn-mdlus, wall-term, port-squat,
yay-abort). The misses: a gloo size abort names the rank that RECEIVED the odd-sized data, not
the rank that sent it (res-split), and Modulus' records carry no rank, so a rank's own warnings
of long work are not tied to it (solver-crawl).
"""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); overrides in brackets (capture_sixtyfourth.sh)
EXPECTED: dict[str, Expected] = {
    # 10 pseudo-epochs of 8 iterations, validation and a checkpoint every 2, "Training
    # completed *yay*" in green; torchrun exits 0 and prints nothing of its own
    "calm-grid": ("ok", None, []),
    # [OMP_NUM_THREADS unset] the same run with scary, harmless warnings: torchrun's
    # OMP_NUM_THREADS banner, torch's "Detected call of `lr_scheduler.step()` before
    # `optimizer.step()`" UserWarning on every rank (a stray scheduler step before training), and
    # DDP's "[rankN]:[W...] reducer.cpp ... find_unused_parameters=True was specified in DDP
    # constructor, but did not find any unused parameters" on every rank; trains to the end
    "loud-grid": ("ok", None, []),
    # [training.max_pseudo_epochs=40 training.stop_error=0.3] the all-reduced validation error
    # falls below the tolerance after pseudo-epoch 10: every rank breaks together, rank 0 logs
    # "Validation error  2.799e-01 below the tolerance  3.000e-01, stopping training" and
    # "Training completed *yay*", every process exits 0: an agreed, intended stop
    "tol-met": ("ok", None, []),
    # [same overrides] the tolerance is checked on rank 0's OWN validation error, never agreed:
    # after pseudo-epoch 12 rank 0 logs "Validation error  2.959e-01 below the tolerance ...,
    # stopping training", saves, "Training completed *yay*", destroys its process group and
    # exits 0; ranks 1 and 2 go on into pseudo-epoch 13 and lose it in the gradient all-reduce
    # ("Connection closed by peer"); torchrun names rank 1 (exit 1) its root cause
    "solo-tol": ("failed", "uncoordinated-exit", [0]),
    # validation (with its all-reduce of the error) runs on rank 0 only (`if rank == 0`): after
    # pseudo-epoch 2 rank 0's 1-float all-reduce meets the others' pseudo-epoch 3 gradient
    # all-reduce; gloo aborts rank 0 ("terminate called after throwing an instance of
    # 'gloo::EnforceNotMet'", "6372 vs 4 ... Is there a distributed collective mismatch in your
    # code?", exitcode -6); rank 2 loses it in backward ("Connection closed by peer"), rank 1
    # is SIGTERMed before it prints
    "val-solo": ("failed", "collective-mismatch", [0]),
    # rank 1's Darcy pairs are re-solved on a 33-node grid (the others 32): the FNO is resolution
    # invariant, so training and the all-reduces run; validation's all_gather of one predicted
    # field a rank gets 33x33 from rank 1: gloo aborts rank 2 ("2178 vs 2048. Received data size
    # doesn't match expected size", exitcode -6, torchrun's root cause), ranks 0 and 1 raise
    # "Connection reset by peer" inside all_gather; the rank whose shape differs is rank 1
    "res-split": ("failed", "collective-mismatch", [1]),
    # rank 2 takes its normalisation statistics from one sample (unbiased pointwise std of one
    # field: NaN; torch warns "std(): degrees of freedom is <= 0", no rank on it): its first loss
    # is NaN and the program's guard raises "[rank2]: FloatingPointError: Non-finite training
    # loss nan at iteration 0" before backward; ranks 0 and 1 lose it in backward
    "nan-norm": ("failed", "python-exception", [2]),
    # rank 1 caches 96 MiB of upsampled fields an iteration from pseudo-epoch 2 and is SIGKILLed
    # at the 4th (the OOM killer's way): no traceback, torchrun "failed (exitcode: -9)
    # local_rank: 1", its root cause; ranks 0 and 2 lose it in backward
    "cache-swell": ("failed", "host-oom", [1]),
    # rank 2's native spectral kernel reads address 0 in pseudo-epoch 2: SIGSEGV, no traceback,
    # torchrun "exitcode: -11" for local rank 2; ranks 0 and 1 "Connection reset by peer"
    "fft-null": ("failed", "native-crash", [2]),
    # rank 1 re-solves refreshed samples before pseudo-epoch 3 for 40 s, logging its own (rank
    # less) "[.. - darcy_fno - WARNING] Darcy solver did not converge for refreshed sample
    # batch, refining grid (k/8)" every 5 s (4 of 8 printed); ranks 0 and 2 time out after 15 s
    # in the gradient all-reduce ("Timed out waiting 15000ms for recv/send operation"), rank 0's
    # exit is torchrun's root cause; rank 1 is SIGTERMed while still busy
    "solver-crawl": ("failed", "slow-rank-timeout", [1]),
    # rank 2 waits before pseudo-epoch 3 on a queue a prefetch thread that was never started
    # should fill: silent, outside any collective; ranks 0 and 1 time out after 15 s in the
    # gradient all-reduce; torchrun SIGTERMs the stuck rank 2
    "queue-park": ("hung", "hang", [2]),
    # rank 1's training shard holds 20 pairs (2 batches of 8, the others 8 batches): after its
    # second batch it leaves the epoch and its LaunchLogger all-reduces the epoch's loss (1
    # float) against the others' third gradient all-reduce; gloo aborts rank 1 ("6372 vs 4 ...
    # collective mismatch", exitcode -6, torchrun's root cause), ranks 0 and 2 lose it in
    # backward ("Connection closed by peer", "Connection reset by peer"): the rank with fewer
    # batches left the loop
    "short-npz": ("failed", "uneven-inputs", [1]),
    # rank 2's training shard was never copied: "[rank2]: FileNotFoundError: [Errno 2] No such
    # file or directory: 'data/darcy_train_2.npz'" before training; torchrun SIGTERMs the others
    "npz-gone": ("failed", "data-error", [2]),
    # an earlier job was killed while it saved pseudo-epoch 4's model (the .mdlus truncated):
    # every rank's load_checkpoint raises "PytorchStreamReader failed reading zip archive: failed
    # finding central directory ... your checkpoint file is corrupted": a corrupt input on all
    "torn-mdlus": ("failed", "data-error", [0, 1, 2]),
    # [training.max_pseudo_epochs=100000, SIGTERM to torchrun after 30 s, as a scheduler's time
    # limit sends it] healthy training to pseudo-epoch 90: torchrun "Received 15 death signal,
    # shutting down workers", SIGTERMs its workers and raises SignalException
    "wall-term": ("failed", "preempted", []),
    # a stale process of an earlier job listens on the master port: torchrun's static
    # rendezvous cannot start its TCPStore ("DistNetworkError: The server socket has failed to
    # listen on any local network address. port: 38476 ... EADDRINUSE"); no worker starts
    "port-squat": ("failed", "rendezvous-failure", []),
    # calm-grid's command as first captured: training to the end, "Training completed *yay*",
    # then rank 1 aborts while exiting (teardown: barrier + destroy_process_group, interpreter
    # exit): "terminate called without an active exception", torchrun "failed (exitcode: -6)
    # local_rank: 1" (SIGABRT), the others SIGTERMed: the work was done, the exit crashed
    "yay-abort": ("failed", "exit-teardown-crash", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "res-split": "failed, collective-mismatch on rank 2 (COL101, 0.90): the kind is right, but "
    "the culprit is the rank gloo aborted ('2178 vs 2048. Received data size doesn't match', "
    "torchrun's root cause, exitcode -6), which received rank 1's 33x33 field in the "
    "all_gather; rank 1's traceback ('Connection reset by peer' in all_gather) looks like "
    "rank 0's, and nothing in the log says whose tensor had the other shape: rank 1's fields "
    "were on another grid, collective-mismatch on rank 1",
}


RUNS = RunSet("sixtyfourth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_sixtyfourth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _lines(mode: str) -> list[str]:
    return RUNS.console(mode).splitlines()


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_sixtyfourth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    assert [f.name for f in RUNS.files(mode)] == ["console.log"]
    assert "PHYSX_TUNE" not in RUNS.console(mode)


RECORD = re.compile(
    r"\[\d\d:\d\d:\d\d - (darcy_fno|checkpoint|train) - (INFO|WARNING)\] "
    r"(\x1b\[3[23]m.*\x1b\[0m|[^\x1b]*)"
)
TORCH = re.compile(
    r"\[rank\d\]:.*"  # a worker's traceback or c10d warning, torch's rank prefix
    r"|[WEI]1205 \d\d:\d\d:\d\d\.\d{6} \d+ torch/distributed/.*"  # torchrun's logger
    r"|Traceback \(most recent call last\):|  File \".*|    .*|\s*[\^~]+\s*"
    r"|torch\.distributed\.\S+: .*|torch\.distributed\.\S+Error: "
    r"|=+|-+|/repo/tests/programs/sixtyfourth_style_train\.py FAILED|Failures:"
    r"|Root Cause \(first observed failure\):|\[\d\]:|  (time|host|rank|exitcode|error_file"
    r"|traceback) *: .*"
    r"|terminate called (after throwing an instance of 'gloo::EnforceNotMet'"
    r"|without an active exception)|  what\(\):  \[enforce fail at .*"
    r"|/repo/tests/programs/sixtyfourth_style_train\.py:\d+: UserWarning: .*"
    r"|  (normaliser|scheduler)\.?.*"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_the_programs_or_torchs(mode: str) -> None:
    for line in _lines(mode):
        assert RECORD.fullmatch(line) or TORCH.fullmatch(line), line


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_rank_zero_speaks_for_the_program_and_every_rank_for_the_checkpoint(mode: str) -> None:
    text = RUNS.console(mode)
    assert "Distributed manager: rank 1" not in text and "rank 2 of 3" not in text
    skip = text.count("Provided checkpoint directory ./checkpoints does not exist")
    assert skip in (0, 3), skip
    if mode in ("calm-grid", "loud-grid", "yay-abort", "wall-term", "solver-crawl"):
        assert skip == 3


def test_healthy_runs_end_in_green_and_torchrun_stays_quiet() -> None:
    for mode in ("calm-grid", "loud-grid", "tol-met"):
        text = RUNS.console(mode)
        assert "\x1b[32mTraining completed *yay*\x1b[0m" in text
        assert "ChildFailedError" not in text
        assert not re.search(r"\[rank\d\]:(?!\[W)", text)  # only loud-grid's reducer warnings
    assert "ChildFailedError" in RUNS.console("yay-abort")
    assert RUNS.agent_exits("yay-abort") == [("-6", "1")]
