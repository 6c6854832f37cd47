"""Real gloo runs of an eighty-fourth training-program style
(tests/programs/eightyfourth_style_train.py, linked into each run's folder as train.py): torch's
built-in distributed-training algorithms in one image-classification train.py, the way the
PyTorch DDP documentation and tutorials teach them: DistributedDataParallel(static_graph=True,
gradient_as_bucket_view=True), a communication hook chosen by --comm-hook (PowerSGD with
PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=10) by default,
fp16_compress_hook, or none), ZeroRedundancyOptimizer(optimizer_class=AdamW), and every epoch's
loop inside `with Join([model, optimizer], throw_on_early_termination=...)` so that ranks with
fewer batches finish early. A tiny residual CNN (28,554 parameters, block2 skippable by
--drop-block stochastic depth) on synthetic 3x16x16 images of 10 classes in per-rank shards of
different sizes (data/train_<rank>.pt of 160, 128 and 112 images: 10, 8 and 7 batches of 16;
data/val.pt split rank::world), validation loss and accuracy all-reduced each epoch. Python
logging on rank 0 only ('%(asctime)s | %(levelname)s | %(name)s | %(message)s', logger
__main__; the other ranks log warnings only): 'Epoch [2/5] Step [4/10] loss 1.8735', 'Epoch 2
done in 0.3s | train_loss ... | val_loss ... | val_acc 0.167'. At the end every rank calls
optimizer.consolidate_state_dict(to=0), rank 0 saves checkpoints/final.pt ('Saved consolidated
checkpoint to checkpoints/final.pt'), then a barrier, destroy_process_group and rank 0's
'Training complete'. gloo on CPU, 15 s collective timeout.

The launch: `torchrun --nproc_per_node=N --master_port=PORT --log-dir logs --tee 3 train.py
[flags]` after `python train.py --prepare --sizes ...` (N = 2; 3 for loud-zero and flip-segv;
without --tee 3 for loud-zero, heap-zero and port-held, where the ranks' output reaches the
console unprefixed). The fixture of a mode is the command's console, console.log (torchrun's
and every rank's stdout and stderr; with --tee every rank line prefixed '[defaultN]:'), as a
user hands it; the per-rank copies under logs/ are left out. Captured with
tests/fixtures/real/capture_eightyfourth.sh, ports 38900-38915, fault switch $TQ_CASE never
printed, the other faults in what a run is given (flags, rank 1's shard truncated,
OMP_NUM_THREADS unset, a port held by a stale process, a SIGTERM to torchrun from outside).
Neither the program nor the launch were used to build the rules: the diagnosis must generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 14 of 16 right (calm-zero, loud-zero, goal-zero, psgd-early, ckpt-gather,
shard-torn, heap-zero, flip-segv, hook-half, gather-solo, depth-skip, prefetch-park, port-held,
wall-term). Misses: Join's "Detected at least one rank that exhausted inputs. Throwing across
all ranks." on rank 0 is read as a rank of its own that ran out, beside rank 1's "Rank 1
exhausted all inputs." (join-throw: kind right, both ranks named); rank 1's warnings through
the program's logger ('[default1]:... | WARNING | __main__ | Recomputing per-channel
normalisation statistics of train_1.pt (pass 4/8)') are not read as work the rank announced, so
the slow rank reads as stuck (stats-crawl). Now 16 of 16: the ranks that raise Join's "Detected
at least one rank that exhausted inputs" waited for the one that ran out (DDP106 echo); a
rank whose own lines went on after the others had timed out was working, not blocked."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit GLOBAL ranks); arguments in brackets (capture_eightyfourth.sh)
EXPECTED: dict[str, Expected] = {
    # [--epochs 5] 5 epochs on 2 ranks with the PowerSGD hook; rank 1 (8 batches) joins early
    # every epoch and Join shadows its collectives, as it is meant to; rank 0 logs every epoch,
    # "Saved consolidated checkpoint to checkpoints/final.pt" and "Training complete"; every
    # rank exits 0, torchrun prints nothing
    "calm-zero": ("ok", None, []),
    # [3 ranks, no --tee, OMP_NUM_THREADS unset, --amp --comm-hook fp16 --epochs 5] the same
    # run with scary output: torchrun's OMP_NUM_THREADS banner, and on every rank "FutureWarning:
    # `torch.cuda.amp.GradScaler(args...)` is deprecated" and "UserWarning:
    # torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling." (a GPU
    # script's --amp on a CPU host: the scaler passes everything through); trains to the end,
    # "Training complete", every rank exits 0
    "loud-zero": ("ok", None, []),
    # [--epochs 20 --target-acc 0.55] the all-reduced validation accuracy reaches 0.552 at epoch
    # 5 on every rank alike: every rank breaks, rank 0 logs "Target accuracy 0.550 reached at
    # epoch 5 (val_acc 0.552), stopping", the state is consolidated and saved, every rank exits
    # 0: an agreed, intended stop
    "goal-zero": ("ok", None, []),
    # [--start-powersgd-iter 1] PowerSGDState refuses start_powerSGD_iter <= 1 with error
    # feedback on: every rank raises "ValueError: Expect `start_powerSGD_iter` > 1 if
    # `use_error_feedback` or `warm_start` is enabled, ..." in the set-up, before training;
    # an uncaught exception of the program on both ranks
    "psgd-early": ("failed", "python-exception", [0, 1]),
    # [--save-every 1] the periodic checkpoint calls consolidate_state_dict(to=0) on every rank
    # but then builds the state dict (optimizer.state_dict()) on every rank and saves on rank 0
    # only: after epoch 1 rank 0 saves "checkpoints/epoch_1.pt" and goes on, rank 1 raises
    # "RuntimeError: Optimizer state has not been consolidated on this rank. Please call
    # `consolidate_state_dict(to=1)` ..."; rank 0 loses it in epoch 2's PowerSGD all-reduce
    # ("Connection closed by peer") and is SIGTERMed: rank 1's uncaught exception
    "ckpt-gather": ("failed", "python-exception", [1]),
    # rank 1's shard was cut to 20,000 bytes by an interrupted copy: rank 1's torch.load of
    # data/train_1.pt raises "OSError: [Errno 22] Invalid argument" in PyTorchFileReader; rank 0
    # loses it in DDP's parameter check ("Connection closed by peer"): a rank failing on its
    # input file
    "shard-torn": ("failed", "data-error", [1]),
    # [no --tee] from epoch 2 rank 1 keeps 64 MiB a step and SIGKILLs itself at the sixth (the
    # OOM killer's way): no traceback, torchrun's "failed (exitcode: -9) local_rank: 1" and
    # "Signal 9 (SIGKILL) received by PID"; rank 0 loses it in the hook's all-reduce
    "heap-zero": ("failed", "host-oom", [1]),
    # [3 ranks] rank 2's native flip routine writes to address 8 at epoch 2's fourth step:
    # SIGSEGV, no traceback, torchrun's "exitcode: -11" for local rank 2 (its root cause);
    # rank 1 loses it ("Connection reset by peer"), ranks 0 and 1 are SIGTERMed
    "flip-segv": ("failed", "native-crash", [2]),
    # [--comm-hook fp16] the fp16 hook is registered inside rank 0's logging block only: at the
    # first backward rank 0 all-reduces the bucket in fp16 (14,278 bytes) and rank 1 in fp32
    # (28,556): gloo aborts rank 0 ("terminate called after throwing an instance of
    # 'gloo::EnforceNotMet' ... 28556 vs 14278 ... Is there a distributed collective mismatch
    # in your code?", exitcode -6), rank 1 loses it: the hook on one rank only, rank 0 the one
    # whose collective differs
    "hook-half": ("failed", "collective-mismatch", [0]),
    # the final consolidate_state_dict(to=0) sits in rank 0's save block: after the 3 epochs
    # rank 0 alone waits in consolidate_state_dict's broadcast while rank 1 waits in the final
    # barrier; both time out after 15 s ("Timed out waiting 15000ms for recv operation to
    # complete", rank 0 in broadcast, rank 1 in barrier): a collective only rank 0 called
    "gather-solo": ("failed", "collective-mismatch", [0]),
    # [--throw-on-early-termination] rank 1 has 8 batches to rank 0's 10: when rank 1 runs out
    # in epoch 1, Join raises "RuntimeError: Rank 1 exhausted all inputs." on rank 1 and
    # "Detected at least one rank that exhausted inputs. Throwing across all ranks." on rank 0,
    # and the program does not catch them: uneven inputs, rank 1 the short one
    "join-throw": ("failed", "uneven-inputs", [1]),
    # [--drop-block 0.3] stochastic depth skips block2 at random, with the per-rank seed: rank
    # 1 skips it in its first iteration, so static_graph records block2's parameters as unused,
    # and uses it in the second: rank 1's backward raises "RuntimeError: Your training graph has
    # changed in this iteration, e.g., one parameter is unused in first iteration, but then got
    # used in the second iteration. this is not compatible with static_graph set to True.";
    # rank 0 loses it: the DDP reducer's set of used parameters changed on rank 1
    "depth-skip": ("failed", "ddp-unused-parameters", [1]),
    # before epoch 2 rank 1 recomputes its normalisation statistics, logging "WARNING |
    # __main__ | Recomputing per-channel normalisation statistics of train_1.pt (pass k/8)"
    # every 4 s (5 of 8 printed); rank 0 gives up after 15 s in the hook's all-reduce
    # ("Application timeout caused pair closure"); torchrun SIGTERMs rank 1 while it still works
    "stats-crawl": ("failed", "slow-rank-timeout", [1]),
    # at epoch 2's third step rank 1 waits on an event a prefetch thread that was never started
    # should set: silent, outside any collective; rank 0 times out after 15 s in the hook's
    # all-reduce ("Application timeout caused pair closure"), rank 1 is SIGTERMed
    "prefetch-park": ("hung", "hang", [1]),
    # [no --tee] a crashed job's process still listens on the port: torchrun's TCPStore cannot
    # listen, "torch.distributed.DistNetworkError: The server socket has failed to listen on any
    # local network address. port: 38914, ... EADDRINUSE"; no rank starts
    "port-held": ("failed", "rendezvous-failure", []),
    # [--epochs 100000, SIGTERM to torchrun after 20 s] healthy training stopped from outside as
    # by a scheduler's time limit: "Received 15 death signal, shutting down workers", both ranks
    # SIGTERMed, torchrun raises SignalException "Process N got signal: 15"
    "wall-term": ("failed", "preempted", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("eightyfourth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_eightyfourth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    return RUNS.console(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_eightyfourth_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.relative_to(RUNS.folder(mode)).as_posix() for f in RUNS.files(mode)]
    assert names == ["console.log"], names
    assert "TQ_CASE" not in _out(mode)


TEE = r"(?:\[default\d\]:)?"  # --tee 3's prefix; absent in the modes run without --tee
RECORD = re.compile(
    rf"{TEE}\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} \| (INFO|WARNING) \| __main__ \| .*"
)
WORKER = re.compile(
    rf"{TEE}(?:\[rank\d\]:.*|"
    r"terminate called after throwing an instance of 'gloo::EnforceNotMet'|"
    r"  what\(\):  \[enforce fail at .*|"
    r"/tmp/run-389\d\d/train\.py:\d+: FutureWarning: `torch\.cuda\.amp\.GradScaler\(args\.\.\.\)` "
    r"is deprecated\..*|"
    r"  scaler = torch\.cuda\.amp\.GradScaler\(\) if args\.amp else None|"
    r"/repo/\.venv/lib/python3\.11/site-packages/torch/cuda/amp/grad_scaler\.py:\d+: "
    r"UserWarning: torch\.cuda\.amp\.GradScaler is enabled, but CUDA is not available\..*|"
    r"  super\(\)\.__init__\(|)"
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
    """Rank 0's log records (and rank 1's warnings), the ranks' own output ('[rankN]:'
    tracebacks, gloo's abort, the GradScaler warnings), torchrun's log lines, and from
    torchrun's own traceback on its failure summary."""
    lines = _out(mode).splitlines()
    end = next(
        (k for k, line in enumerate(lines) if line == "Traceback (most recent call last):"),
        len(lines),
    )
    for line in lines[:end]:
        assert RECORD.fullmatch(line) or WORKER.fullmatch(line) or AGENT.fullmatch(line), line
    for line in lines[end:]:
        assert AGENT.fullmatch(line) or AGENT_END.fullmatch(line) or RECORD.fullmatch(line), line


def test_the_faults_happened_as_intended() -> None:
    for mode in ("calm-zero", "loud-zero", "goal-zero"):
        out = _out(mode)
        assert "Saved consolidated checkpoint to checkpoints/final.pt" in out, mode
        assert "Training complete" in out and "exitcode" not in out and "Traceback" not in out
    loud = _out("loud-zero")
    assert "Setting OMP_NUM_THREADS environment variable" in loud
    assert loud.count("GradScaler is enabled, but CUDA is not available") == 3
    assert "Target accuracy 0.550 reached at epoch 5" in _out("goal-zero")
    assert _out("psgd-early").count("ValueError: Expect `start_powerSGD_iter` > 1") == 2
    gather = _out("ckpt-gather")
    assert "Saved checkpoint checkpoints/epoch_1.pt" in gather
    assert "[rank1]: RuntimeError: Optimizer state has not been consolidated" in gather
    assert "[rank1]: OSError: [Errno 22] Invalid argument" in _out("shard-torn")
    assert RUNS.agent_exits("heap-zero") == [("-9", "1")]
    assert RUNS.agent_exits("flip-segv") == [("-11", "2")]
    assert RUNS.agent_exits("hook-half") == [("-6", "0")]
    assert "28556 vs 14278" in _out("hook-half")
    solo = _out("gather-solo")
    assert solo.count("Timed out waiting 15000ms for recv operation") == 2
    assert "in broadcast" in solo and "in barrier" in solo
    throw = _out("join-throw")
    assert "[rank1]: RuntimeError: Rank 1 exhausted all inputs." in throw
    assert "[rank0]: RuntimeError: Detected at least one rank that exhausted inputs." in throw
    assert "Your training graph has changed in this iteration" in _out("depth-skip")
    crawl = _out("stats-crawl")
    assert "(pass 5/8)" in crawl and "Application timeout caused pair closure" in crawl
    park = _out("prefetch-park")
    assert "Application timeout caused pair closure" in park and "WARNING" not in park
    assert "[rank1]: Traceback" not in park and "Epoch [2/3] Step [4/10]" not in park
    assert "EADDRINUSE" in _out("port-held")
    wall = _out("wall-term")
    assert "Received 15 death signal" in wall and "got signal: 15" in wall
