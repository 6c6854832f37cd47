"""Real gloo runs of a hundred-and-fifteenth training-program style
(tests/programs/hundredfifteenth_style_train.py, linked into each run's folder as
scripts/train.py): pretraining a language model in the way of AI2's OLMo trainer
(allenai/OLMo's scripts/train.py), re-created in plain torch without olmo installed. A YAML
config (configs/tiny/OLMo-20M.yaml) merged with dotted overrides (--optimizer.learning_rate=...,
--global_train_batch_size=..., --evaluators.1.enabled=true, a bare --save_overwrite) into a
TrainConfig; prepare_cli_environment()'s logging: one record format on every rank, time, host and
local rank, logger and line, level, message separated by tabs ('2026-12-06 15:36:53.720\tvm:0\t
train:750\tINFO\tTraining complete'), the non-zero local ranks passing WARNING and above only (so
their tracebacks, as CRITICAL records, are the only lines they print); OLMo's excepthook: an
OLMoError is printed as one line, 'OLMoConfigurationError: ...', no traceback, no rank; any other
exception is logged as 'Uncaught RuntimeError: ...' at CRITICAL with its traceback (no
'[rankN]:' prefix: OLMo's hook replaces torch's). The configuration saved by rank 0 to
<save_folder>/config.yaml (OLMoConfigurationError when it exists without --save_overwrite); a
memmap token dataset over the uint16 .npy files listed under data.paths (the number of tokens
read from each header, a file memory-mapped when one of its chunks is first asked for, chunks of
64 tokens); global indices permuted and saved by rank 0, every world_size-th to a rank; the
global batch split into device batches and micro-batches with gradient accumulation; a tiny
causal transformer wrapped in DDP as FSDP would shard it, its AdamW state sharded over the ranks
(each rank updates its slice of the flat parameters and all-gathers them); OLMo's metric blocks
('[step=10/30]' then '    train/CrossEntropyLoss=6.269', '    throughput/device/tokens_per_second=
...', '    System/Peak GPU Memory (MB)=0'), the pre-train checkpoint and its reload, 'Saving
checkpoint...' / 'Checkpoint saved to runs/olmo-tiny/step10' (sharded, a file per rank), an
in-loop perplexity evaluator, a downstream evaluator (piqa, off by default, configured to run on
rank 0 only), the time_limit cancel ('Run canceled due to time limit reached'), 'Training loop
complete', 'Unsharded checkpoint saved to runs/olmo-tiny/step30-unsharded', 'Training complete'.
gloo on CPU, 15 s collective timeout.

The launch: `torchrun --nproc_per_node=N --master_port=PORT scripts/train.py
configs/tiny/OLMo-20M.yaml --save_folder=runs/olmo-tiny --save_overwrite [overrides]` (N = 2; 3
for loud-pile) after `python scripts/train.py prepare data` wrote four token files. The fixture
of a mode is the command's console, console.log (torchrun's and every rank's stdout and stderr,
no --tee), as a user hands it. Captured with tests/fixtures/real/capture_hundredfifteenth.sh,
ports 39440-39455, fault switch $TQ_CASE never printed, the other faults in what a run is given
(overrides, the last token file cut short, a save folder an earlier run left, a checkpoint of an
earlier 3-process run, OMP_NUM_THREADS unset, a port held by a stale process, a SIGTERM to
torchrun from outside). Neither the program nor the launch were used to build the rules: the
diagnosis must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 11 of 16 right (calm-pile, loud-pile, clock-halt, eosless-row, torn-shard,
rss-creep, port-squat, wall-term, batch-odd, folder-kept, world-resume; eosless-row, batch-odd
and folder-kept through INF208, 'its own output is not in the logs', not through the lines that
say it). Misses: the rank of OLMo's records is only in the host:local_rank field ('vm:1'), and
its tracebacks carry no '[rankN]:' prefix, so the gloo timeouts of norm-solo, piqa-crawl,
repeat-drop and upload-park are attributed to no rank and read as a bare collective timeout
(TMO102, 0.3); kernel-segv's SIGSEGV (exitcode -11 in torchrun's summary) is read as a worker
whose output went elsewhere (INF208), the native crash kept as context."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit GLOBAL ranks); arguments in brackets
# (capture_hundredfifteenth.sh; every run but folder-kept is given --save_folder=runs/olmo-tiny
# --save_overwrite)
EXPECTED: dict[str, Expected] = {
    # [max_duration 30] 2 ranks train 30 steps; rank 0 logs a metric block every 5 steps, the
    # sharded checkpoints step10 and step20, two perplexity evaluations, 'Training loop
    # complete', 'Unsharded checkpoint saved to runs/olmo-tiny/step30-unsharded', 'Training
    # complete'; rank 1 logs nothing (INFO); every rank exits 0, torchrun prints nothing
    "calm-pile": ("ok", None, []),
    # [3 ranks, OMP_NUM_THREADS unset, --precision=amp_bf16 --global_train_batch_size=24] the
    # same run with scary output: torchrun's OMP_NUM_THREADS banner, and on every rank a
    # py.warnings WARNING record "UserWarning: CUDA is not available or torch_xla is imported.
    # Disabling autocast." (a GPU recipe's precision on a CPU host); 'Training complete', every
    # rank exits 0
    "loud-pile": ("ok", None, []),
    # [--max_duration=100000 --time_limit=8] OLMo's own time limit: rank 0 finds the limit
    # passed at a cancel check and broadcasts the flag; rank 0 logs "Run canceled due to time
    # limit reached", rank 1 "Run canceled" (WARNING, so both show), the loop ends, the final
    # unsharded checkpoint is saved, 'Training complete', every rank exits 0: an agreed,
    # intended stop before max_duration
    "clock-halt": ("ok", None, []),
    # [--data.generate_doc_lengths=true] the program's document lengths take the last EOS of
    # every row; rank 0's device batch at step 9 holds a chunk of the one long document (no
    # EOS in 64 tokens): "Uncaught IndexError: index -1 is out of bounds for dimension 0 with
    # size 0" on rank 0 in doc_lens; rank 1, in step 9's gradient all-reduce, loses it
    # ("Connection closed by peer"). The data are valid: the program's assumption is the bug
    "eosless-row": ("failed", "python-exception", [0]),
    # part-3-00000.npy, the small last token file, was cut to 4 kB of its 6 kB (header intact):
    # rank 1's first device batch holds a chunk of it, np.memmap with the header's length
    # raises "Uncaught ValueError: mmap length is greater than file size" on rank 1 (a CRITICAL
    # record of local rank 1); rank 0, whose first chunks of that file come at step 6, goes
    # into step 1's collectives and loses it: a rank failing on a corrupt input file
    "torn-shard": ("failed", "data-error", [1]),
    # from step 9 rank 1 keeps 64 MiB a step and SIGKILLs itself at the sixth, the OOM killer's
    # way: no traceback of its own, "failed (exitcode: -9) local_rank: 1"; rank 0 "Connection
    # closed by peer", SIGTERMed
    "rss-creep": ("failed", "host-oom", [1]),
    # rank 1 reads a freed buffer's address at step 13 (a native kernel): SIGSEGV, no
    # traceback, "exitcode: -11" for local rank 1; rank 0 loses it
    "kernel-segv": ("failed", "native-crash", [1]),
    # [--optimizer.metrics_log_interval=10] the optimizer's grad norm is all-reduced only
    # where it is logged, `rank == 0`: at step 10 rank 0 waits in a 1-float all_reduce while
    # rank 1 waits in the sharded optimizer's all_gather; as captured both time out after
    # 15 s, rank 0 "Timed out waiting 15000ms for recv operation to complete" under
    # dist.all_reduce(norm), rank 1 "... for send operation to complete" in all_gather (in the
    # first capture rank 1 got "Connection closed by peer" instead): a collective only rank 0
    # called
    "norm-solo": ("failed", "collective-mismatch", [0]),
    # [--max_duration=1ep and an instance filter (repetition period 1-13, count 32)] the
    # program drops the repetitive instances each rank draws instead of masking them: rank 0
    # keeps 41 device batches, rank 1 40; after step 40 rank 1's loader ends, it leaves the
    # loop ('Epoch 1 complete', 'Training loop complete' unseen: INFO on rank 1) and waits in
    # the final unsharded checkpoint's barrier while rank 0 is in step 41's gradient
    # all-reduce; rank 1 times out after 15 s in barrier under save_checkpoint, rank 0 then
    # "Connection closed by peer" in backward: uneven inputs, rank 1 the one that ran out
    "repeat-drop": ("failed", "uneven-inputs", [1]),
    # [--evaluators.1.enabled=true] at step 15 rank 0 alone runs the downstream evaluator piqa
    # (rank0_only in the user's config), 5 s a batch, logging "Running evaluation for
    # 'piqa'..." and "[eval_step=k/8]"; rank 1 goes on to the cancel check's broadcast and
    # times out there after 15 s ("Timed out waiting 15000ms" under check_if_cancelled, at
    # "[eval_step=2/8]"), torchrun SIGTERMs rank 0 while it still evaluates: rank 0 busy past
    # the collective timeout
    "piqa-crawl": ("failed", "slow-rank-timeout", [0]),
    # at step 12 rank 1 waits on an upload thread's event that is never set: silent, outside
    # any collective; rank 0 times out after 15 s in step 12's gradient all-reduce (backward
    # under train_batch, "Timed out waiting 15000ms for recv operation to complete"), rank 1
    # is SIGTERMed
    "upload-park": ("hung", "hang", [1]),
    # a crashed job's process still listens on the port: torchrun's TCPStore cannot listen
    # (EADDRINUSE); no rank starts
    "port-squat": ("failed", "rendezvous-failure", []),
    # [--max_duration=100000, SIGTERM to torchrun after 25 s] healthy training stopped from
    # outside as by a scheduler's time limit: "Received 15 death signal, shutting down
    # workers", the ranks SIGTERMed, torchrun's SignalException
    "wall-term": ("failed", "preempted", []),
    # [--global_train_batch_size=12] 12 is not divisible by 2 ranks x micro-batch 4: every rank
    # raises OLMoConfigurationError at the start of main, printed by OLMo's excepthook as one
    # line without a traceback or rank ("OLMoConfigurationError: global_train_batch_size (12)
    # must be divisible by world size x device_train_microbatch_size (2 x 4)", twice), both
    # exit 1: every rank's own uncaught exception (a wrong configuration)
    "batch-odd": ("failed", "python-exception", [0, 1]),
    # [no --save_overwrite] an earlier run left runs/olmo-tiny/config.yaml: rank 0 alone raises
    # "OLMoConfigurationError: runs/olmo-tiny/config.yaml already exists, use --save_overwrite
    # to overwrite" (one line, no traceback) and exits 1; rank 1, in the barrier after it,
    # loses it ("Connection closed by peer") and is SIGTERMed: rank 0's uncaught exception
    "folder-kept": ("failed", "python-exception", [0]),
    # [--load_path=runs/olmo-3proc/step10] the checkpoint was saved by a 3-process run: the
    # model loads, the sharded AdamW state of each rank (a third of the flat parameters) does
    # not fit the half a rank keeps now: "Uncaught RuntimeError: The size of tensor a (29856)
    # must match the size of tensor b (19904) at non-singleton dimension 0" in
    # load_sharded_optim_state on both ranks: every rank's uncaught exception
    "world-resume": ("failed", "python-exception", [0, 1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "norm-solo": "failed, nccl-timeout, no culprit (TMO102, 0.3): since session 35 both ranks' "
    "'Uncaught RuntimeError: ... Timed out waiting 15000ms' records are read as ranks 0 and 1 "
    "(OLMo's host:local_rank field), but the tracebacks under them are continuation lines with "
    "no prefix, so which function each rank waited in is not theirs: the tool cannot see that "
    "rank 0 waited in dist.all_reduce(norm) inside `rank == 0` code while rank 1 waited in the "
    "optimizer's all_gather: collective-mismatch on rank 0",
    "repeat-drop": "failed, nccl-timeout, no culprit (TMO102, 0.3): since session 35 the "
    "timeout records are read as ranks 1 and 0 (OLMo's host:local_rank field), but their "
    "tracebacks are continuation lines with no prefix: rank 1's barrier under save_checkpoint, "
    "called from fit after the loop (the final unsharded save), against rank 0's backward under "
    "train_batch, is not tied to the ranks: rank 1 ran out of batches first, uneven-inputs on "
    "rank 1",
}


RUNS = RunSet("hundredfifteenth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfifteenth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    return RUNS.console(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfifteenth_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.relative_to(RUNS.folder(mode)).as_posix() for f in RUNS.files(mode)]
    assert names == ["console.log"], names
    assert "TQ_CASE" not in _out(mode)


RECORD = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\tvm:(\d)\t([\w.]+):(\d+)\t"
    r"(INFO|WARNING|ERROR|CRITICAL)\t(.*)"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_only_local_rank_zero_logs_info(mode: str) -> None:
    """OLMo's rank0_only filter: a record of a non-zero local rank is WARNING or above."""
    for line in _out(mode).splitlines():
        m = RECORD.fullmatch(line)
        if m and m.group(2) != "0":
            assert m.group(5) in ("WARNING", "ERROR", "CRITICAL"), line


def test_the_faults_happened_as_intended() -> None:
    for mode in ("calm-pile", "loud-pile", "clock-halt"):
        text = _out(mode)
        assert "exitcode" not in text and "Uncaught" not in text, mode
        assert text.rstrip().endswith("Training complete"), mode
    assert "Unsharded checkpoint saved to runs/olmo-tiny/step30-unsharded" in _out("calm-pile")
    loud = _out("loud-pile")
    assert "Setting OMP_NUM_THREADS environment variable" in loud
    assert loud.count("UserWarning: CUDA is not available or torch_xla is imported.") == 3
    halt = _out("clock-halt")
    assert "vm:0\tolmo.train:" in halt and "Run canceled due to time limit reached" in halt
    assert re.search(r"vm:1\tolmo\.train:\d+\tWARNING\tRun canceled$", halt, re.M)
    eos = _out("eosless-row")
    assert "vm:0\ttrain:" in eos and "Uncaught IndexError: index -1 is out of bounds" in eos
    assert RUNS.agent_exits("eosless-row") == [("1", "0")]
    torn = _out("torn-shard")
    assert re.search(
        r"vm:1\ttrain:\d+\tCRITICAL\tUncaught ValueError: mmap length is greater", torn
    )
    assert RUNS.agent_exits("torn-shard") == [("1", "1")]
    assert RUNS.agent_exits("rss-creep") == [("-9", "1")]
    assert RUNS.agent_exits("kernel-segv") == [("-11", "1")]
    solo = _out("norm-solo")
    assert "dist.all_reduce(norm)" in solo and "in all_gather" in solo
    drop = _out("repeat-drop")
    assert "[step=40/47]" in drop and "[step=45/47]" not in drop
    assert re.search(r"vm:1\ttrain:\d+\tCRITICAL\tUncaught RuntimeError: .*Timed out", drop)
    crawl = _out("piqa-crawl")
    assert "Running evaluation for 'piqa'..." in crawl and "[eval_step=8/8]" not in crawl
    park = _out("upload-park")
    assert "vm:1\ttrain:" not in park.split("Timed out")[0]
    assert "EADDRINUSE" in _out("port-squat")
    wall = _out("wall-term")
    assert "Received 15 death signal" in wall and "got signal: 15" in wall
    odd = _out("batch-odd")
    assert odd.count("OLMoConfigurationError: global_train_batch_size (12) must be divisible") == 2
    assert 'Traceback (most recent call last):\n  File "/tmp' not in odd
    kept = _out("folder-kept")
    assert "OLMoConfigurationError: runs/olmo-tiny/config.yaml already exists" in kept
    world = _out("world-resume")
    assert world.count("Uncaught RuntimeError: The size of tensor a (29856) must match") == 2
