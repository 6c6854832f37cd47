"""Real gloo runs of a hundred-and-twentieth training-program style
(tests/programs/hundredtwentieth_style_train.py, linked into each run's folder as cifar10.py):
differentially private image classification with Opacus and DDP in the way of pytorch/opacus's
examples/cifar10.py and its distributed tutorial, re-created in plain torch without opacus. A
GradSampleModule-like wrapper (forward hooks keep each layer's activations, full backward hooks
turn the backprops into per-sample gradients: unfold for Conv2d, einsum for Linear, the
normalised input for GroupNorm; torch's 'Full backward hook is firing when gradients are computed
with respect to module outputs since no inputs require gradients' on every rank), ModuleValidator's
check that refuses BatchNorm ('opacus.validators.errors.UnsupportedModuleError:
[ShouldReplaceModuleError("BatchNorm cannot support training with differential privacy ...")]'),
the DPDDP wrapper (DifferentiallyPrivateDistributedDataParallel: the parameters broadcast from
rank 0 at wrap), the distributed DP optimizer (per-sample clipping to -c, Gaussian noise of std
sigma * c on rank 0, the summed gradients all-reduced parameter by parameter in step()), Poisson
sampling over each rank's shard (a DistributedPoissonBatchSampler: a batch of variable size,
possibly empty, collated as zero-size tensors), the RDP accountant with opacus' default alphas,
PrivacyEngine's 'UserWarning: Secure RNG turned off. ...' on every rank (--secure-rng imports
torchcsprng), the accountant's 'UserWarning: Optimal order is the largest alpha. ...', the 'ddp'
logger's '%(asctime)s:%(levelname)s:%(message)s' records ('12/06/2026 18:18:38:INFO:Setting up
gloo process group: rank 1, world_size 2'), rank 0's prints ('Using sigma=1.5 and C=10.0',
'\\tTrain Epoch: 1 \\tLoss: 2.4114 Acc@1: 10.256 (ε = 0.74, δ = 1e-05)', '\\tTest set:Loss: 1.3797
Acc: 47.656 '), checkpoint.tar each epoch, the example's closing 'Note:' record and metrics dict.
Added the way users add them: a stop when --target-epsilon is spent ('Privacy budget exhausted
(ε = 5.05 > 5.0), stopping'), the test accuracy all-reduced over the ranks' halves of the test
set. The data are an image folder of per-image .npy files (data/cifar10/{train,test}/<class>/),
read lazily. gloo on CPU, 15 s collective timeout.

The launch: `torchrun --nproc_per_node=N --master_port=PORT cifar10.py --epochs 3 --batch-size
64 --sigma 1.5 -c 10.0 --delta 1e-5 --dist_algo ddp --lr 0.1 --device cpu [...]` (N = 2; 3 for
loud-draw; no --tee: the ranks' output reaches the console unprefixed, their tracebacks as
'[rankN]:' lines) after `python cifar10.py --prepare data/cifar10` wrote 1024 training and 256
test images. The fixture of a mode is the command's console, console.log (torchrun's and every
rank's stdout and stderr), as a user hands it. Captured with
tests/fixtures/real/capture_hundredtwentieth.sh, ports 39520-39535, fault switch $TQ_CASE never
printed, the other faults in what a run is given (--arch convnet_bn, --batch-size 8,
--secure-rng without torchcsprng, --target-epsilon, one image file cut short, 1023 training
images, OMP_NUM_THREADS unset, a port held by a stale process, a SIGTERM to torchrun from
outside). Neither the program nor the launch were used to build the rules: the diagnosis must
generalise.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 11 of 16 right (bn-wrap, empty-draw, npy-torn, grad-hoard, unfold-segv,
loss-solo, audit-crawl, event-wait, csprng-gone, port-squat, wall-term). Misses: the example's
end, the closing 'Note:' record and the metrics dict ('INFO:{'accuracy': ...}') after the last
'Test set' line, with torchrun silent on success, is not read as an end of training, so the two
healthy runs and the agreed budget stop read as a log cut off mid-training (calm-draw, loud-draw,
budget-halt: unknown hang, INF212 0.3; budget-halt's 'Privacy budget exhausted (ε = 5.05 > 5.0),
stopping' on both ranks is not read as a stop either); rank 0's lone 'Privacy budget exhausted
... stopping' before its sys.exit(0), a record with no rank in it, is not read as that rank's
announced stop, so its early exit reads as fewer batches (budget-solo: uneven-inputs, right
rank); rank 1 of odd-shard, one step short and aborted by gloo in the test's all-reduce, reads
as a rank-dependent collective (collective-mismatch, right rank): no line of the abort says
where rank 1 was."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit GLOBAL ranks); arguments in brackets (capture_hundredtwentieth.sh;
# every run is given --epochs 3 --batch-size 64 --sigma 1.5 -c 10.0 --delta 1e-5 --dist_algo ddp
# --lr 0.1 --device cpu unless a bracket says otherwise)
EXPECTED: dict[str, Expected] = {
    # 2 ranks, 16 Poisson steps an epoch (sample rate 1/16, about 32 images a rank a step): rank
    # 0 prints four 'Train Epoch' lines an epoch (ε 0.74 ... 1.68) and a 'Test set' line, saves
    # checkpoint.tar, logs the closing 'Note:' and the metrics dict; both ranks exit 0, torchrun
    # prints nothing. The 'Secure RNG turned off' and 'Full backward hook is firing' warnings of
    # every rank are the normal look of this style
    "calm-draw": ("ok", None, []),
    # [3 ranks, OMP_NUM_THREADS unset, --sigma 6 -c 1.0] the same run with scary output:
    # torchrun's OMP_NUM_THREADS banner, three ranks' 'Secure RNG turned off' and
    # full-backward-hook warnings, the accountant's 'UserWarning: Optimal order is the largest
    # alpha. Please consider expanding the range of alphas to get a tighter privacy bound.' (so
    # much noise makes the optimal RDP order the largest of the defaults), a noisy loss (2.2 to
    # 3.3, ε 0.27 at the end); the three epochs finish, the metrics are logged, every rank exits
    # 0: healthy by mechanism
    "loud-draw": ("ok", None, []),
    # [--epochs 10 --sigma 0.8 --target-epsilon 5.0] every rank's accountant counts the same
    # steps, so in epoch 2 both ranks log "Privacy budget exhausted (ε = 5.05 > 5.0),
    # stopping" at once, run the last test, rank 0 logs the metrics, every rank exits 0: an
    # agreed, intended stop
    "budget-halt": ("ok", None, []),
    # [--epochs 10 --sigma 0.8 --target-epsilon 5.0] the budget check sits inside rank 0's print
    # block: at epoch 2 step 8 rank 0 alone logs "Privacy budget exhausted (ε = 5.10 > 5.0),
    # stopping" and calls sys.exit(0) (exit 0); rank 1 goes on to the next step's gradient
    # all-reduce and loses its peer ("Connection closed by peer"), exits 1 and is the failure
    # torchrun reports (`<NO_OTHER_FAILURES>`): one rank left on purpose, the other did not
    "budget-solo": ("failed", "uncoordinated-exit", [0]),
    # [--arch convnet_bn] the BatchNorm variant of the model goes to make_private without
    # ModuleValidator.fix: the validator raises "opacus.validators.errors.UnsupportedModuleError:
    # [ShouldReplaceModuleError("BatchNorm cannot support training with differential privacy
    # ...")]" on both ranks, before any step (both tracebacks are in the log; torchrun saw rank
    # 0's exit 1 first and SIGTERMed rank 1 as it ended): every rank's own uncaught exception
    "bn-wrap": ("failed", "python-exception", [0, 1]),
    # [--batch-size 8 -p 32] the expected batch is 4 images a rank a step; early in epoch 1
    # (after the step-0 line) rank 0's Poisson draw is empty, the zero-size batch reaches the
    # model's `x.view(x.size(0), -1)`: "[rank0]: RuntimeError: cannot reshape tensor of 0 elements into
    # shape [0, -1] because the unspecified dimension size -1 can be any value and is
    # ambiguous"; rank 1, in the gradient all-reduce, loses it ("Connection closed by peer") and
    # is SIGTERMed. The data are fine; the program's model cannot take the empty batch Poisson
    # sampling legitimately produces: rank 0's uncaught exception
    "empty-draw": ("failed", "python-exception", [0]),
    # the conversion of one training image (dataset item 666, drawn by rank 1 at epoch 1's third
    # step) was interrupted: np.load raises "[rank1]: ValueError: Failed to read all data for
    # array. Expected (32, 32, 3) = 3072 elements, could only read 1872 elements. (file seems
    # not fully written?)" in __getitem__; rank 0 loses it in the gradient all-reduce: a rank
    # failing on a corrupt input file
    "npy-torn": ("failed", "data-error", [1]),
    # from epoch 2 rank 1 keeps every layer's per-sample gradients of the expanded batch (64 MiB
    # each) and is SIGKILLed at the sixth, the OOM killer's way, in epoch 2's first backward: no
    # traceback, "failed (exitcode: -9) local_rank: 1", "Signal 9 (SIGKILL) received by PID";
    # rank 0 loses it ("Connection closed by peer") and is SIGTERMed
    "grad-hoard": ("failed", "host-oom", [1]),
    # rank 1's native unfold path in the conv per-sample gradient reads address 0 at epoch 2's
    # fourth step: SIGSEGV, no traceback, "failed (exitcode: -11) local_rank: 1"; rank 0
    # ("Connection reset by peer") is SIGTERMed
    "unfold-segv": ("failed", "native-crash", [1]),
    # rank 0 alone all-reduces the step's loss for its print (inside `if ... rank == 0`): after
    # step 0 its 1-float all-reduce meets rank 1's all-reduce of the first conv weight of step 1;
    # gloo aborts rank 0 ("op.preamble.length <= op.nbytes. 216 vs 4 ... Is there a distributed
    # collective mismatch in your code?", exitcode -6), rank 1 is SIGTERMed: a collective only
    # rank 0 called
    "loss-solo": ("failed", "collective-mismatch", [0]),
    # [1023 training images] the sampler gives each rank as many steps as its shard holds full
    # shares of the batch (shard // 32): rank 0's 512 images make 16 steps, rank 1's 511 make
    # 15; after its 15th step rank 1 leaves the epoch and all-reduces the test totals (3 floats)
    # while rank 0 all-reduces step 16's gradients: gloo aborts rank 1 ("216 vs 4", exitcode
    # -6), rank 0 loses it: uneven inputs, rank 1 the one that ran out
    "odd-shard": ("failed", "uneven-inputs", [1]),
    # after epoch 1 rank 0 audits the privacy guarantee for a report, logging "Auditing the
    # privacy guarantee for the release report: PRV accountant over 4096 deltas (k/8)" every 5 s
    # (4 of 8 logged); rank 1 times out after 15 s in epoch 2's first gradient all-reduce
    # ("Timed out waiting 15000ms for recv operation to complete"), torchrun SIGTERMs rank 0
    # while it still audits: rank 0 busy past the timeout
    "audit-crawl": ("failed", "slow-rank-timeout", [0]),
    # before epoch 2 rank 1 waits on an event that a prefetch thread, never started, would set:
    # silent, outside any collective; rank 0 times out after 15 s in epoch 2's first gradient
    # all-reduce ("Timed out waiting 15000ms for recv operation to complete"), rank 1 is
    # SIGTERMed
    "event-wait": ("hung", "hang", [1]),
    # [--secure-rng] PrivacyEngine(secure_mode=True) imports torchcsprng, which is not
    # installed: "ModuleNotFoundError: No module named 'torchcsprng'", re-raised as
    # "ImportError: To use secure RNG, you must install the torchcsprng package!" on both ranks
    "csprng-gone": ("failed", "missing-module", [0, 1]),
    # a crashed job's process still listens on the port: torchrun's TCPStore cannot listen,
    # "torch.distributed.DistNetworkError: The server socket has failed to listen on any local
    # network address. port: 39534, ... EADDRINUSE"; no rank starts
    "port-squat": ("failed", "rendezvous-failure", []),
    # [--epochs 100000, SIGTERM to torchrun after 25 s] healthy training (11 epochs tested)
    # stopped from outside as by a scheduler's time limit: "Received 15 death signal, shutting
    # down workers", both ranks SIGTERMed, torchrun raises SignalException "Process N got
    # signal: 15"
    "wall-term": ("failed", "preempted", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "calm-draw": "unknown, hang (INF212, 0.3): 'The log ends in the middle of training, without "
    "an end'; the run's end is the example's closing 'Note:' record ('- 'total_time' includes "
    "the data loading time, ...') and rank 0's metrics dict ('INFO:{'accuracy': 0.5, "
    "'accuracy_per_epoch': ...}') after the third 'Test set' line, and torchrun prints nothing "
    "when every rank exits 0: no line is read as the end of training, so the finished run reads "
    "as a log cut off after its progress lines",
    "loud-draw": "unknown, hang (INF212, 0.3): as calm-draw, the closing 'Note:' record and the "
    "metrics dict are not read as the end of training; the warnings (torchrun's OMP banner, "
    "'Secure RNG turned off', 'Optimal order is the largest alpha') do not decide it",
    "odd-shard": "failed, collective-mismatch on rank 1 (COL101, 0.9): right rank; gloo's "
    "'op.preamble.length <= op.nbytes. 216 vs 4 ... Is there a distributed collective mismatch' "
    "abort of rank 1 is read as a collective in a rank-dependent branch; by mechanism rank 1's "
    "shard of the 1023 images gave it 15 steps to rank 0's 16 and it entered the test's "
    "all-reduce of 3 floats while rank 0 all-reduced step 16's gradients. The SIGABRT leaves no "
    "Python stack and only rank 0 prints progress, so no line shows that rank 1 left the epoch "
    "(the only trace: rank 0's last 'Train Epoch: 1' line is step 12 and no 'Test set' line "
    "follows): uneven-inputs",
}


RUNS = RunSet("hundredtwentieth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredtwentieth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


def _out(mode: str) -> str:
    return RUNS.console(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredtwentieth_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = [f.relative_to(RUNS.folder(mode)).as_posix() for f in RUNS.files(mode)]
    assert names == ["console.log"], names
    assert "TQ_CASE" not in _out(mode)


RECORD = r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d:INFO:.*"
PRINT = (
    r"Using sigma=[\d.]+ and C=[\d.]+|"
    r"\tTrain Epoch: \d+ \tLoss: [\d.]+ Acc@1: [\d.]+ \(ε = [\d.]+, δ = 1e-05\)|"
    r"\tTest set:Loss: [\d.]+ Acc: [\d.]+ "
)
# the lines of the closing 'Note:' record after its head
NOTE = r"Note:|- 'total_time' includes .*|- 'time_per_epoch' measures .*|"
WORKER = re.compile(
    r"\[rank\d\]:.*|"
    r"terminate called after throwing an instance of 'gloo::EnforceNotMet'|"
    r"  what\(\):  \[enforce fail at .*|"
    r"/tmp/run-395\d\d/cifar10\.py:\d+: UserWarning: (Secure RNG turned off|Full backward hook "
    r"is firing|Optimal order is the largest alpha)\b.*|"
    r"  (privacy_engine = PrivacyEngine\(secure_mode=args\.secure_rng\)|loss\.backward\(\)|"
    r"eps, _best_alpha = get_privacy_spent\(.*\))"
)
PROGRAM = re.compile(rf"{RECORD}|{PRINT}|{NOTE}")
AGENT = re.compile(r"[WE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ torch/distributed/\S+:\d+\] .*")
AGENT_END = re.compile(
    r"Traceback \(most recent call last\):|  File .*|    .*|\s+[\^~]+|"
    r"torch\.distributed\.\S+(Error|Exception): .*|"
    r"=+|-+|cifar10\.py FAILED|Failures:|  <NO_OTHER_FAILURES>|"
    r"Root Cause \(first observed failure\):|\[\d\]:|"
    r"  (time|host|rank|exitcode|error_file|traceback)\s*: .*|"
)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_a_record_a_print_or_what_torch_gloo_and_torchrun_print(mode: str) -> None:
    """The 'ddp' logger's records, rank 0's prints, the ranks' own output ('[rankN]:'
    tracebacks, gloo's abort, the Opacus-style and torch warnings), torchrun's log lines, and from
    torchrun's own traceback on, its failure summary."""
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
    for mode in ("calm-draw", "loud-draw", "budget-halt"):
        text = _out(mode)
        assert "exitcode" not in text and "Traceback" not in text, mode
        assert "INFO:{'accuracy': " in text, mode
    calm = _out("calm-draw")
    assert calm.count("Secure RNG turned off") == 2
    assert re.findall(r"\tTest set:", calm) == ["\tTest set:"] * 3
    loud = _out("loud-draw")
    assert "Setting OMP_NUM_THREADS environment variable" in loud
    assert loud.count("Secure RNG turned off") == 3
    assert "UserWarning: Optimal order is the largest alpha" in loud
    halt = _out("budget-halt")
    assert halt.count("Privacy budget exhausted (ε = 5.05 > 5.0), stopping") == 2
    solo = _out("budget-solo")
    assert solo.count("Privacy budget exhausted (ε = 5.10 > 5.0), stopping") == 1
    assert RUNS.agent_exits("budget-solo") == [("1", "1")]
    assert "  <NO_OTHER_FAILURES>" in solo
    bn = _out("bn-wrap")
    assert (
        bn.count("opacus.validators.errors.UnsupportedModuleError: [ShouldReplaceModuleError(") == 2
    )
    assert "Train Epoch" not in bn
    assert "[rank0]: RuntimeError: cannot reshape tensor of 0 elements into shape [0, -1]" in (
        _out("empty-draw")
    )
    assert RUNS.agent_exits("empty-draw") == [("1", "0")]
    assert "[rank1]: ValueError: Failed to read all data for array." in _out("npy-torn")
    assert RUNS.agent_exits("npy-torn") == [("1", "1")]
    assert RUNS.agent_exits("grad-hoard") == [("-9", "1")]
    assert "Train Epoch: 2" not in _out("grad-hoard")
    assert RUNS.agent_exits("unfold-segv") == [("-11", "1")]
    assert RUNS.agent_exits("loss-solo") == [("-6", "0")]
    assert "216 vs 4" in _out("loss-solo")
    assert RUNS.agent_exits("odd-shard") == [("-6", "1")]
    crawl = _out("audit-crawl")
    assert "(4/8)" in crawl and "(5/8)" not in crawl
    assert "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/" in (
        crawl
    )
    assert "Timed out waiting 15000ms for recv operation to complete" in crawl
    wait = _out("event-wait")
    assert "[rank0]: RuntimeError:" in wait and "Timed out waiting 15000ms" in wait
    assert "[rank1]: Traceback" not in wait and "Train Epoch: 2" not in wait
    gone = _out("csprng-gone")
    assert gone.count("ModuleNotFoundError: No module named 'torchcsprng'") == 2
    assert gone.count("ImportError: To use secure RNG, you must install the torchcsprng") == 2
    assert "EADDRINUSE" in _out("port-squat")
    wall = _out("wall-term")
    assert "Received 15 death signal" in wall and "got signal: 15" in wall
