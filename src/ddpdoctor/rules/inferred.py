"""Intended ends and stalls: the verdicts the engine reaches from markers (every rank stopped
early on purpose; training announced its end before a crash; stack dumps of a stalled job;
and every rank stopping on a loss no longer finite, which only looks like an intended end).
Inferred causes scored from how ranks behaved live in rules/hypotheses/."""

from __future__ import annotations

from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Marker, Rule, Signature

EARLY_STOP_ALL = Rule(
    code="INF207",
    kind="early-stop",
    healthy_when_ok=True,
    title="All ranks stopped on purpose",
    signatures=(),
    explanation=Explanation(
        what="Every rank announced the stop and ended together.",
        why="Early stopping or a step limit; a non-zero exit code only reflects how the "
        "program exits.",
        fix="Exit 0 after destroy_process_group() so schedulers do not count a failure.",
        false_positives="None.",
    ),
    fix=("After the loop: dist.destroy_process_group(); sys.exit(0).",),
)

DIVERGED = Rule(
    code="INF242",
    kind="python-exception",
    title="Every rank stopped on a loss that was no longer finite: training diverged",
    signatures=(),
    explanation=Explanation(
        what="Every rank announced that it stopped because its loss was NaN or infinite "
        "('Loss is nan, stopping training', the check in DeiT's, MAE's, DINO's and SwAV's "
        "training loops, then sys.exit(1)).",
        why="The stop is the program's answer to a failure, not a planned end: the model "
        "diverged (a learning rate too high, float16 overflow in exp or softmax, a division "
        "by zero in a normalisation, bad inputs on every rank).",
        fix="Find the first step whose loss was not finite: lower the learning rate or add "
        "warm-up, clip gradients, compute the overflowing op in float32 (or use bf16), check "
        "the inputs of that step.",
        false_positives="None: the program's own words name the non-finite loss.",
    ),
    fix=(
        "Log the loss every step and find the first non-finite one; run that step with "
        "torch.autograd.set_detect_anomaly(True) to see which op produced it.",
        "Lower the learning rate or add warm-up, clip gradients (clip_grad_norm_), and keep "
        "exp/softmax/normalisations in float32 under autocast.",
    ),
)

STOPPED_SHORT = Rule(
    code="INF241",
    kind="early-stop",
    healthy_when_ok=True,
    title="The run ended on its own well before its planned steps: a silent early stop",
    signatures=(),
    severity="info",
    explanation=Explanation(
        what="Training announced its end with no failure, while its own step counter had "
        "reached at most half of the total it counted towards ('15/200' and then 'Training "
        "completed').",
        why="An early-stopping callback or a target the program checks ended the loop; many "
        "(the transformers Trainer's EarlyStoppingCallback among them) say nothing when they "
        "stop, so the counter's total is the only sign that more steps were planned.",
        fix="Nothing, if stopping early was meant (the best checkpoint is kept); otherwise "
        "check the early-stopping patience and threshold, or the limit that ended the loop.",
        false_positives="A counter whose total is not the run's plan (a bar over a dataset "
        "larger than the steps asked for with max_steps).",
    ),
    fix=(
        "If the stop was not meant: look at the early-stopping settings (patience, threshold, "
        "metric) and at the evaluations before the end.",
    ),
)

TEARDOWN_CRASH = Rule(
    code="INF210",
    kind="exit-teardown-crash",
    title="Training finished, then a rank crashed or hung while shutting down",
    signatures=(),
    explanation=Explanation(
        what="The failure came after the job announced the end of training.",
        why="Ranks left the process group at different times (no destroy_process_group), or "
        "library teardown (NCCL/gloo threads, atexit hooks, DataLoader workers) crashed during "
        "interpreter exit.",
        fix="End every rank the same way: barrier(), destroy_process_group(), then exit 0; "
        "keep end-of-training work (saving, evaluation) on every rank or behind a barrier.",
        false_positives="A real failure while saving the final checkpoint (disk full, host "
        "OOM) is reported as that failure instead; so is a collective the program itself "
        "calls after the end on some ranks only (a final evaluation or barrier under "
        "`if rank == 0`): a collective mismatch.",
    ),
    fix=(
        "At the very end on every rank: torch.distributed.barrier(); "
        "torch.distributed.destroy_process_group(); sys.exit(0).",
    ),
)

HANG_DUMP = Rule(
    code="HANG101",
    kind="hang",
    title="Stack dumps of a stalled job (py-spy / faulthandler)",
    sources="Python faulthandler dump_traceback, py-spy dump, gdb backtrace (bt)",
    severity="warning",
    marker=Marker.STALLED,
    status=Status.HUNG,
    specificity=10,
    signatures=(
        # faulthandler.dump_traceback_later(timeout) firing: "Timeout (0:00:05)!"
        Signature(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!", "Timeout ("),
        # not the threads faulthandler lists under a crash's "Fatal Python error: Aborted" (a
        # signal's handler, not a stall: the crash is read at its header, LCH104)
        Signature(
            r"Thread 0x[0-9a-f]+ \(most recent call first\):",
            "(most recent call first):",
            after_head="Fatal Python error: ",
            head_within=60,
        ),
        # py-spy: decimal thread ids (0.1, 0.2), hexadecimal from 0.3
        Signature(r"Thread (?:\d+|0x[0-9A-Fa-f]+) \(idle\): \"", '(idle): "'),
        Signature(r"Thread (?:\d+|0x[0-9A-Fa-f]+) \(active(?:\+gil)?\): \"", "(active"),
        # gdb attached to a live process (`gdb -p PID`, `bt` / `thread apply all bt`):
        # "#3  0x00007f21cbda2f in ncclProxyProgress () from libnccl.so.2"
        Signature(r"^#\d{1,4}\s{1,3}0x[0-9a-f]{6,16} in \S", " in "),
    ),
    explanation=Explanation(
        what="The log holds stack dumps (Python's, or a debugger's of the native code) taken "
        "while the job made no progress.",
        why="Someone (or a watchdog) dumped the stacks of a job that hung: ranks wait in a "
        "collective that another rank never reaches, or sit in data loading or a lock.",
        fix="Compare the ranks' stacks: the rank that is not in the same collective as the "
        "others is the culprit. `ddpdoctor run` takes and groups them automatically.",
        false_positives="A dump printed by a crash handler next to a real error, or gdb's "
        "backtrace of a crashed process's core file; the error is then the root.",
    ),
    fix=(
        "Group the ranks by their top frames; the odd one out is where to look "
        "(`ddpdoctor run --hang-after 120 -- torchrun ...` does this for you).",
    ),
    positive=(
        "Thread 0x00007f3b8c4f1740 (most recent call first):",
        'Thread 1234 (idle): "MainThread"',
        'Thread 0x7FA3915C7440 (active): "MainThread"',
        "#14 0x0000153a6506cf36 in cudaMemcpyAsync () from /usr/lib64/libcudart.so.11.0",
    ),
    negative=(
        "Traceback (most recent call last):",
        # torch's c10 backtrace and glibc's are not a debugger's
        "frame #3: c10::Error::Error(c10::SourceLocation) + 0x8b (0x7f2a in libc10.so)",
        "# 0x7f21cbda2f is the address the kernel reports",
    ),
)

STOPPED = Rule(
    code="INF213",
    kind="preempted",
    title="The job was stopped from outside, with no failure before",
    signatures=(),
    explanation=Explanation(
        what="The processes printed what a stopped process prints (KeyboardInterrupt, a "
        "SignalException) and nothing failed before the stop.",
        why="A user pressed Ctrl-C or sent a signal, or a scheduler or supervisor ended the "
        "job; the traceback is how Python reports the stop, not a bug.",
        fix="Nothing to fix in the training code; if the stop was not yours, ask the scheduler "
        "(sacct, kubectl describe pod) who sent it.",
        false_positives="A job that hung and was then stopped by hand: the hang is the cause "
        "(run it under `ddpdoctor run` to have it caught).",
    ),
    fix=(
        "If nobody stopped it on purpose: check the scheduler's records for the signal's "
        "origin (time limit, preemption, an operator).",
        "If it was stopped because it hung: re-run under `ddpdoctor run` to get the stacks.",
    ),
)

INTERRUPTED = Rule(
    code="INF217",
    kind="hang",
    title="Stopped by hand (Ctrl-C), with no failure before: most likely stuck",
    status=Status.HUNG,
    signatures=(),
    explanation=Explanation(
        what="The job was interrupted (SIGINT: Ctrl-C in its terminal, or a KeyboardInterrupt) "
        "and nothing failed before the interrupt.",
        why="A scheduler stops a job with SIGTERM or SIGKILL; SIGINT is a person at the "
        "terminal, and people interrupt a distributed job when it stops making progress: a "
        "rank waiting in a collective its peers never join, a dead peer the others still "
        "wait for, a deadlock in data loading. The traceback of the interrupt shows where "
        "each process was waiting, not what went wrong.",
        fix="Take the stacks of every rank while it is stuck (`py-spy dump --pid`), or run it "
        "under `ddpdoctor run`, which catches the stall and groups the stacks; compare where "
        "the ranks wait.",
        false_positives="A healthy job stopped on purpose (it was no longer wanted) reads the "
        "same: then nothing is wrong.",
    ),
    fix=(
        "If it was stuck: re-run under `ddpdoctor run --hang-after 300 -- <launcher> ...`; it "
        "catches the stall, takes every rank's stack and names the odd one out.",
        "Or, while it hangs: `py-spy dump --pid <pid>` for every rank's process, and compare "
        "the collectives they wait in.",
    ),
)

STALLED_THEN_STOPPED = Rule(
    code="INF229",
    kind="hang",
    title="The job had stopped making progress long before it was stopped from outside",
    status=Status.HUNG,
    signatures=(),
    explanation=Explanation(
        what="Its progress lines came at a steady pace, then none for far longer than that "
        "pace, with no error; then a signal from outside (a time limit, a scheduler, a "
        "person, a timeout wrapper) ended it.",
        why="A job that makes no progress and prints no error is stuck: a rank waiting in a "
        "collective its peers never join, a deadlock, a data loader that stopped delivering, "
        "a collective timeout far longer than the time limit. The stop only ended the wait; "
        "a longer time limit would not have helped.",
        fix="Find where the ranks waited: run it under `ddpdoctor run --hang-after N` (it "
        "catches the stall and takes every rank's stack) or `py-spy dump --pid` each rank "
        "while it hangs; set a collective timeout shorter than the time limit so the hang "
        "ends with an error that names the collective.",
        false_positives="A job whose last phase (a final save, an evaluation) is legitimately "
        "long and silent: its last lines say it started one.",
    ),
    fix=(
        "Re-run under `ddpdoctor run --hang-after 300 -- <launcher> ...`: it catches the "
        "stall, takes every rank's stack and names the rank that is not where the others are.",
        "Give init_process_group a timeout shorter than the time limit, so that a hang ends "
        "with a timeout naming the collective.",
    ),
)

RULES = (
    TEARDOWN_CRASH,
    HANG_DUMP,
    EARLY_STOP_ALL,
    STOPPED,
    INTERRUPTED,
    STALLED_THEN_STOPPED,
    STOPPED_SHORT,
    DIVERGED,
)
