"""Real gloo runs of a hundred-and-fourth training-program style
(tests/programs/hundredfourth_style_train.py, linked into each run's folder as train.py): global
weather forecasting in the way of NVIDIA's FourCastNet (NVlabs/FourCastNet's train.py),
re-implemented in plain torch. YParams reads one section of config/AFNO.yaml (anchors and
'<<: *backbone' merges, '!!bool True'); logging_utils' format '%(asctime)s - %(name)s -
%(levelname)s - %(message)s' on the root logger of EVERY rank ('2026-12-06 08:15:19,519 - root -
INFO - ...', no rank in the line), the trainer's own lines gated by log_to_screen (rank 0 only),
rank 0's params.log() dump between '------------------ Configuration ------------------' and a
dashed line ('lr 0.002', 'max_epochs 4', ...), a world print per rank ('rank 1 of 2 (local rank
1), backend gloo'). The yearly data files data/train/<year>.npy (time, channels, lat, lon: 12
samples of 4 x 17 x 32 a year, a leap year 13; valid 2017) are memory-mapped lazily by the
Dataset inside the DataLoader's worker (num_data_workers 1), the number of samples per year taken
from the first file ('Number of samples per year: 12', 'Found data at path ... Number of
examples: 96'), normalised by data/stats/global_means.npy and global_stds.npy in reshape_fields;
a DistributedSampler over the global sample index for training, the same first batches on every
rank for validation. An AFNO backbone (patch embedding, FFT token mixing with block-diagonal
complex weights and softshrink, 16,160 parameters) under DDP(find_unused_parameters=True),
relative-L2 LpLoss, torch.cuda.amp's autocast (and GradScaler behind --enable_amp), a guard that
raises FloatingPointError on a non-finite loss, the train and valid losses all-reduced each
epoch, rank 0's 'Saving model to .../training_checkpoints/ckpt.tar' (and best_ckpt.tar), 'Time
taken for epoch 1 is 0.257 sec' and 'Train loss: 0.754. Valid loss: 0.740'. With FourCastNet's
CosineAnnealingLR (afno_backbone) every rank logs 'Terminating training after reaching
params.max_epochs while LR scheduler is set to CosineAnnealingLR' in the last epoch and calls
exit() (before that epoch's lines and checkpoint); with ReduceLROnPlateau (full_field) every
rank ends with 'DONE ---- rank N'. The fine-tuning section (afno_backbone_finetune:
two_step_training, pretrained) restores pretrained_ckpt_path with FourCastNet's retry that strips
the first 7 characters ('module.') of every key. gloo on CPU, 15 s collective timeout.

The launch: `torchrun --nproc_per_node=N --master_port=PORT train.py
--yaml_config=config/AFNO.yaml --config=CONFIG --run_num=0 [--enable_amp]` (N = 2; 3 for
loud-era and shard-short; no --tee: the ranks' output reaches the console unprefixed, their
tracebacks as '[rankN]:' lines) after `python train.py --prepare data` wrote the years and the
statistics. The fixture of a mode is the command's console, console.log (torchrun's and every
rank's stdout and stderr), as a user hands it; rank 0's out.log in the experiment folder is left
out. Captured with tests/fixtures/real/capture_hundredfourth.sh, ports 39264-39279, fault switch
$TQ_CASE never printed, the other faults in what a run is given (the config's lines, a data
folder starting at the leap year 1980, 1985.npy cut short, a zero in global_stds.npy, a
checkpoint of an earlier single-process run, the experiment folder on a 128 kB tmpfs,
OMP_NUM_THREADS unset, a port held by a stale process, a SIGTERM to torchrun from outside).
Neither the program nor the launch were used to build the rules: the diagnosis must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 14 of 16 right (loud-era, plateau-halt, year-torn, std-void, prefix-lost,
exp-brim, rollout-hoard, filter-segv, rmse-solo, shard-short, stage-crawl, queue-park,
port-squat, wall-term). Misses: FourCastNet's CosineAnnealingLR end, 'Terminating training after
reaching params.max_epochs while LR scheduler is set to CosineAnnealingLR' and exit() on every
rank, is not read as an end, so the healthy run reads as a log cut off mid-training (calm-era:
unknown hang); an IndexError raised in the DataLoader worker by the loader's own index
arithmetic (years of different lengths, the length taken from the leap year 1980) reads as a
corrupt input file (leap-lead: data-error, right rank). Since then: a loop that says it stops
after reaching its configured end ('Terminating training after reaching ...', 'Reached
max_steps', 'Maximum number of epochs reached.') ends training (calm-era right): 15 of 16."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit GLOBAL ranks); arguments in brackets (capture_hundredfourth.sh)
EXPECTED: dict[str, Expected] = {
    # [--config=afno_backbone, max_epochs 4] 2 ranks train; rank 0 logs epochs 1-3 ('Time taken
    # for epoch 3 ...', 'Train loss: ... Valid loss: ...') and saves ckpt.tar/best_ckpt.tar each
    # time; in epoch 4 FourCastNet's CosineAnnealingLR branch logs "Terminating training after
    # reaching params.max_epochs while LR scheduler is set to CosineAnnealingLR" on both ranks
    # and calls exit(): every rank exits 0, torchrun prints nothing. The run did all its
    # epochs: a finished run, not an early stop
    "calm-era": ("ok", None, []),
    # [3 ranks, OMP_NUM_THREADS unset, --config=full_field --enable_amp] the same kind of run
    # with scary output: torchrun's OMP_NUM_THREADS banner, on every rank "FutureWarning:
    # `torch.cuda.amp.GradScaler(args...)` is deprecated", "UserWarning: torch.cuda.amp.GradScaler
    # is enabled, but CUDA is not available.  Disabling.", "UserWarning: CUDA is not available or
    # torch_xla is imported. Disabling autocast." (a GPU recipe's --enable_amp on a CPU host) and
    # DDP's find_unused_parameters warning; ReduceLROnPlateau, 4 epochs, "DONE ---- rank 0/1/2",
    # every rank exits 0
    "loud-era": ("ok", None, []),
    # [afno_backbone with ReduceLROnPlateau, max_epochs 40, early_stopping_patience 2,
    # early_stopping_min_delta 0.005] the all-reduced valid loss stalls: after epoch 13 rank 0
    # logs "Valid loss has not improved by 0.005 for 2 epochs (best 0.1409...), stopping early
    # after epoch 13"; every rank saw the same valid loss and breaks, "DONE ---- rank 0/1", every
    # rank exits 0: an agreed, intended stop
    "plateau-halt": ("ok", None, []),
    # [train years 1980-1986] the user's download starts at the leap year 1980 (13 samples): the
    # Dataset takes 'Number of samples per year: 13' from the first file and indexes every other
    # year as if it had 13; rank 1's first batch holds 1982's sample 11, whose target is sample
    # 12 of a 12-sample year: "IndexError: Caught IndexError in DataLoader worker process 0" ...
    # "IndexError: index 12 is out of bounds for axis 0 with size 12" on rank 1 (rank 0's first
    # batches are inside the years); rank 0 loses it in the gradient all-reduce ("Connection
    # closed by peer"). The data are valid years; the loader's equal-length assumption is the
    # bug: an uncaught exception of the program on rank 1
    "leap-lead": ("failed", "python-exception", [1]),
    # the copy of data/train/1985.npy was interrupted (40,000 of 104,576 bytes, the header
    # intact): rank 1's worker is the first to open it (its first batch holds a 1985 sample,
    # rank 0's first three do not): np.load(mmap_mode='r') raises "ValueError: mmap length is
    # greater than file size", re-raised as "Caught ValueError in DataLoader worker process 0";
    # rank 0 loses it in the gradient all-reduce: a rank failing on a corrupt input file
    "year-torn": ("failed", "data-error", [1]),
    # global_stds.npy has a 0 for channel 3 (tcwv, constant in the download it was computed
    # from): reshape_fields divides by it ("RuntimeWarning: divide by zero encountered in
    # divide", "img /= stds"), the loss of the first batch is nan on both ranks and the
    # program's guard raises "FloatingPointError: Loss is nan at iteration 1 (epoch 1)" on rank 0
    # and rank 1 alike, before the first backward: every rank's own uncaught exception
    "std-void": ("failed", "python-exception", [0, 1]),
    # [--config=afno_backbone_finetune] the pretrained one-step backbone came from an earlier
    # single-process run (python train.py: no DDP, keys without 'module.'): both ranks log
    # "Starting from pretrained one-step afno model at .../best_ckpt.tar", load_state_dict on the
    # DDP model raises "Error(s) in loading state_dict for DistributedDataParallel: Missing
    # key(s) ... "module.pos_embed" ... Unexpected key(s) ... "pos_embed"", FourCastNet's bare
    # except strips 7 characters from keys that had no prefix and the second load raises again
    # (Unexpected key(s) "ed", "mbed.proj.weight", ...): every rank's uncaught exception
    "prefix-lost": ("failed", "python-exception", [0, 1]),
    # exp_dir is a 128 kB tmpfs: out.log and hyperparams.yaml fit, rank 0's first "Saving model
    # to .../ckpt.tar" (the model and Adam state, about 200 kB) does not: torch's zip writer
    # fails ("RuntimeError: basic_ios::clear: iostream error" then "[enforce fail at
    # inline_container.cc:672] . unexpected pos 116352 vs 116244", no ENOSPC text), rank 0
    # exits 1; rank 1, in epoch 2's gradient all-reduce, loses it: rank 0 out of disk space
    "exp-brim": ("failed", "disk-full", [0]),
    # from epoch 2 rank 1 keeps 64 MiB a step (every forecast for ensemble diagnostics) and is
    # SIGKILLed at the sixth, the OOM killer's way: no traceback, "failed (exitcode: -9)
    # local_rank: 1", "Signal 9 (SIGKILL) received by PID"; rank 0 is SIGTERMed while waiting
    "rollout-hoard": ("failed", "host-oom", [1]),
    # rank 1's native spectral filter reads address 8 at epoch 2's fourth step: SIGSEGV, no
    # traceback, "failed (exitcode: -11) local_rank: 1"; rank 0 is SIGTERMed
    "filter-segv": ("failed", "native-crash", [1]),
    # [valid_rmse_by_channel: !!bool True] the per-channel valid RMSE is all-reduced inside
    # `if params.log_to_screen` (rank 0 only): after epoch 1's validation rank 0 alone enters a
    # 4-float all-reduce while rank 1 goes on to epoch 2's gradient all-reduce; gloo aborts rank
    # 0 ("op.preamble.length <= op.nbytes. 16160 vs 4 ... Is there a distributed collective
    # mismatch in your code?", exitcode -6); rank 1 loses it ("Connection reset by peer") and
    # is SIGTERMed: a collective only rank 0 called
    "rmse-solo": ("failed", "collective-mismatch", [0]),
    # [3 ranks, shard_years: !!bool True] each rank memory-maps its own block of years
    # (np.array_split): ranks 0 and 1 read 3 years (36 samples, 18 batches of 2), rank 2 reads
    # 1985 and 1986 (24 samples, 12 batches): after its 12th step rank 2 leaves the loop and
    # all-reduces the epoch's train loss (4 bytes) while the others are in step 13's gradient
    # all-reduce; gloo aborts rank 2 ("10776 vs 4", exitcode -6), ranks 0 and 1 lose it: uneven
    # inputs, rank 2 the one that ran out
    "shard-short": ("failed", "uneven-inputs", [2]),
    # [stage_data: !!bool True] the node's local rank 0 copies the training years to
    # /tmp/fcn_stage while the others wait in dist.barrier(); the copy crawls, 4 s a file
    # ("Staging .../1982.npy to /tmp/fcn_stage/train (4/8)" is the last of 8 logged); rank 1's
    # barrier times out after 15 s ("Timed out waiting 15000ms for recv operation to
    # complete"), torchrun SIGTERMs rank 0 while it still copies: rank 0 busy past the timeout
    "stage-crawl": ("failed", "slow-rank-timeout", [0]),
    # at epoch 2's third step rank 1 waits on a prefetch queue whose thread was never started:
    # silent, outside any collective; rank 0 gives up after 15 s in the gradient all-reduce
    # ("Timed out waiting 15000ms for recv operation to complete"; "Application timeout caused
    # pair closure" in another capture), rank 1 is SIGTERMed
    "queue-park": ("hung", "hang", [1]),
    # a crashed job's process still listens on the port: torchrun's TCPStore cannot listen,
    # "torch.distributed.DistNetworkError: The server socket has failed to listen on any local
    # network address. port: 39278, ... EADDRINUSE"; no rank starts
    "port-squat": ("failed", "rendezvous-failure", []),
    # [max_epochs 100000, SIGTERM to torchrun after 25 s] healthy training (32 epochs logged)
    # stopped from outside as by a scheduler's time limit: "Received 15 death signal, shutting
    # down workers", both ranks SIGTERMed, torchrun raises SignalException "Process N got
    # signal: 15"
    "wall-term": ("failed", "preempted", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "leap-lead": "failed, data-error on rank 1 (DATA101, 0.6): right rank; 'IndexError: Caught "
    "IndexError in DataLoader worker process 0' is read as a rank failing on a missing or corrupt "
    "input file, but the years are valid: the Dataset took 'Number of samples per year: 13' from "
    "the leap year 1980 and indexed the 12-sample 1982 past its end ('index 12 is out of bounds "
    "for axis 0 with size 12' at the target read in __getitem__), an indexing bug of the "
    "program's loader: python-exception on rank 1",
}


RUNS = RunSet("hundredfourth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfourth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    return RUNS.console(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfourth_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.relative_to(RUNS.folder(mode)).as_posix() for f in RUNS.files(mode)]
    assert names == ["console.log"], names
    assert "TQ_CASE" not in _out(mode)


RECORD = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - root - INFO - .*"
PRINT = r"rank \d of \d \(local rank \d\), backend gloo"
# a record, or a world print (one print's text and its newline are two writes under torchrun's
# `python -u`, so another rank's print or record may join it mid-line)
PROGRAM = re.compile(rf"{RECORD}|{PRINT}(?:{PRINT}|{RECORD})?")
WORKER = re.compile(
    r"\[rank\d\]:.*|"
    r"terminate called after throwing an instance of 'gloo::EnforceNotMet'|"
    r"  what\(\):  \[enforce fail at .*|"
    r"/tmp/run-392\d\d/train\.py:\d+: FutureWarning: `torch\.cuda\.amp\.(autocast|GradScaler)"
    r"\(args\.\.\.\)` is deprecated\..*|"
    r"  with amp\.autocast\(self\.params\.enable_amp\):|"
    r"  self\.gscaler = amp\.GradScaler\(\)|"
    r"/repo/\.venv/lib/python3\.11/site-packages/torch/cuda/amp/(grad_scaler|autocast_mode)\.py:"
    r"\d+: UserWarning: .*CUDA is not available.*|"
    r"  super\(\)\.__init__\(|"
    r"/tmp/run-392\d\d/train\.py:\d+: RuntimeWarning: divide by zero encountered in divide|"
    r"  img /= stds|"
)
AGENT = re.compile(r"[WE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ torch/distributed/\S+:\d+\] .*")
AGENT_END = re.compile(
    r"Traceback \(most recent call last\):|  File .*|    .*|\s+[\^~]+|"
    r"torch\.distributed\.\S+(Error|Exception): .*|"
    r"=+|-+|train\.py FAILED|Failures:|"
    r"Root Cause \(first observed failure\):|\[\d\]:|"
    r"  (time|host|rank|exitcode|error_file|traceback)\s*: .*|"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_a_record_or_what_torch_gloo_and_torchrun_print(mode: str) -> None:
    """Every rank's log records and world prints, the ranks' own output ('[rankN]:' tracebacks,
    gloo's abort, the amp and numpy warnings), torchrun's log lines, and from torchrun's own
    traceback on its failure summary."""
    lines = _out(mode).splitlines()
    end = next(
        (k for k, line in enumerate(lines) if line == "Traceback (most recent call last):"),
        len(lines),
    )
    for line in lines[:end]:
        assert PROGRAM.fullmatch(line) or WORKER.fullmatch(line) or AGENT.fullmatch(line), line
    for line in lines[end:]:
        assert AGENT.fullmatch(line) or AGENT_END.fullmatch(line), line


def test_the_faults_happened_as_intended() -> None:
    calm = _out("calm-era")
    assert calm.count("Terminating training after reaching params.max_epochs") == 2
    assert "Time taken for epoch 3 is" in calm and "Time taken for epoch 4" not in calm
    for mode in ("calm-era", "loud-era", "plateau-halt"):
        assert "exitcode" not in _out(mode) and "Traceback" not in _out(mode), mode
    loud = _out("loud-era")
    assert "Setting OMP_NUM_THREADS environment variable" in loud
    assert loud.count("GradScaler is enabled, but CUDA is not available") == 3
    assert all(f"DONE ---- rank {r}" in loud for r in range(3))
    halt = _out("plateau-halt")
    assert "stopping early after epoch 13" in halt and "DONE ---- rank 1" in halt
    leap = _out("leap-lead")
    assert "Number of samples per year: 13" in leap
    assert "[rank1]: IndexError: index 12 is out of bounds for axis 0 with size 12" in leap
    assert RUNS.agent_exits("leap-lead") == [("1", "1")]
    assert "[rank1]: ValueError: mmap length is greater than file size" in _out("year-torn")
    assert RUNS.agent_exits("year-torn") == [("1", "1")]
    void = _out("std-void")
    assert "divide by zero encountered in divide" in void
    assert void.count("FloatingPointError: Loss is nan at iteration 1 (epoch 1)") == 2
    lost = _out("prefix-lost")
    assert lost.count('Unexpected key(s) in state_dict: "pos_embed"') == 2
    assert lost.count('Unexpected key(s) in state_dict: "ed", "mbed.proj.weight"') == 2
    brim = _out("exp-brim")
    assert (
        "[rank0]: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos" in brim
    )
    assert RUNS.agent_exits("exp-brim") == [("1", "0")]
    assert RUNS.agent_exits("rollout-hoard") == [("-9", "1")]
    assert "Time taken for epoch 2" not in _out("rollout-hoard")
    assert RUNS.agent_exits("filter-segv") == [("-11", "1")]
    rmse = _out("rmse-solo")
    assert RUNS.agent_exits("rmse-solo") == [("-6", "0")]
    assert "16160 vs 4" in rmse and "Valid RMSE" not in rmse
    assert "valid_rmse_by_channel True" in rmse
    assert RUNS.agent_exits("shard-short") == [("-6", "2")]
    assert "rank 2 reads years 1985, 1986" in _out("shard-short")
    crawl = _out("stage-crawl")
    assert "(4/8)" in crawl and "(5/8)" not in crawl and "Staged" not in crawl
    assert (
        "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/" in crawl
    )
    assert "Timed out waiting 15000ms for recv operation to complete" in crawl
    park = _out("queue-park")
    assert re.search(  # gloo words the same timeout either way, from run to run
        r"\[rank0\]: RuntimeError: (Application timeout caused pair closure|.*Timed out waiting "
        r"15000ms for recv operation to complete)",
        park,
    )
    assert "[rank1]: Traceback" not in park and "Time taken for epoch 2" not in park
    assert "EADDRINUSE" in _out("port-squat")
    wall = _out("wall-term")
    assert "Received 15 death signal" in wall and "got signal: 15" in wall
