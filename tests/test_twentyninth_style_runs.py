"""Real gloo runs of a twenty-ninth training-program style (tests/programs/twentyninth_style_train.py:
a research codebase run on a Slurm cluster the way HPC users do it: an sbatch script (--ntasks,
--time, --output=slurm-%j.out, sometimes --error=slurm-%j.err, sometimes --signal=USR1@45) runs
one srun step with one task per rank; the program reads SLURM_PROCID / SLURM_NTASKS /
SLURM_LOCALID, takes MASTER_ADDR from `scontrol show hostnames`, joins gloo with a tcp:// init
method (15 s collective timeout), trains a tiny MLP in DDP and prints plain f-strings:
"[rank 1] epoch 0 it 10 loss 0.5265"). Launched four ways under the single-node Slurm 22.05 of
`make slurm-up`: `srun --label`, plain `srun`, `srun --kill-on-bad-exit=1` (with a separate
.err file), and `srun` of two torchrun agents as two nodes (one task per node, each its own
folder). What Slurm wrote is kept as it is: the program's lines, srun's and slurmstepd's. Neither
the program nor the launches were used to build the rules: the diagnosis must generalise.
Captured by tests/fixtures/real/capture_twentyninth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_twentyninth.sh)
EXPECTED: dict[str, Expected] = {
    # [label 3] three epochs, a validation loss and a checkpoint each; every rank prints
    # "[rank N] done" and exits 0; neither srun nor slurmstepd prints anything
    "calm-trio": ("ok", None, []),
    # [plain 2, --patience 1 --min-delta 10] the stopping rule reads the all-reduced validation
    # loss: after epoch 1 both ranks print "early stopping: no improvement for 1 epoch(s)",
    # "done", and exit 0: an agreed, intended early stop
    "plateau-vote": ("ok", None, []),
    # [agents 2x2] srun starts one torchrun agent per "node", each with two workers; two epochs,
    # every worker prints "done", every agent exits 0
    "relay-pair": ("ok", None, []),
    # [kill 2] rank 1 adds to per-class statistics under a key never stored: KeyError 'high' at
    # epoch 0 it 12; rank 0 loses its peer in the gradient all-reduce; srun --kill-on-bad-exit
    # cancels the step ("task 1: Exited with exit code 1", "STEP ... CANCELLED")
    "stat-key": ("failed", "python-exception", [1]),
    # [label 3] rank 2 averages a running sum over a bucket that stayed empty: ZeroDivisionError
    # at epoch 0 it 10; ranks 0 and 1 lose their peer in the gradient all-reduce and exit 1
    "empty-bucket": ("failed", "python-exception", [2]),
    # [label 2, --time=1] the job runs past its one-minute limit: slurmstepd's "CANCELLED AT ...
    # DUE TO TIME LIMIT", srun's "tasks 0-1: Terminated"
    "wall-clock": ("failed", "preempted", []),
    # [plain 2] the user scancels the running job after about 25 s: "JOB ... CANCELLED AT ..."
    # (no "DUE TO"), "tasks 0-1: Terminated"; the scheduler ended the job on request
    "hand-cancel": ("failed", "preempted", []),
    # [label 2] rank 1 keeps 64 MiB a batch and is SIGKILLed at its sixth (OOM killer style):
    # no traceback, srun's "task 1: Killed"; rank 0 loses its peer
    "mem-hoard": ("failed", "host-oom", [1]),
    # [kill 3] rank 2's native augmentation reads address 0 at epoch 0 it 9: SIGSEGV, srun's
    # "task 2: Segmentation fault"; srun cancels the step
    "null-read": ("failed", "native-crash", [2]),
    # [kill 2] rank 1 waits before epoch 1 for a prefetch event nobody sets: silent, outside any
    # collective; rank 0 times out after 15 s in the next collective and exits 1, and
    # --kill-on-bad-exit then kills the stuck rank 1
    "idle-wait": ("hung", "hang", [1]),
    # [label 3] rank 0 rebuilds a feature cache for 25 s before epoch 1 (printing each part);
    # ranks 1 and 2 time out after 15 s in the gradient all-reduce
    "cache-rebuild": ("failed", "slow-rank-timeout", [0]),
    # [plain 2] only rank 0 all-reduces its per-parameter gradient norms for logging at it 6
    # (`if rank == ...`); its 4-element all-reduce meets rank 1's 1-element stop-flag all-reduce.
    # As captured, gloo let them pair: rank 1's flag came back non-zero, so rank 1 printed
    # "caught SIGUSR1" (no signal was sent) and went to the barrier while rank 0 went on to its
    # own flag all-reduce; both timed out after 15 s and exited 1
    "norm-log": ("failed", "collective-mismatch", [0]),
    # [label 3] each rank takes whole shard files (8 files over 3 ranks): rank 2 has two files,
    # 12 batches against 18, leaves the epoch first and goes to the validation all-reduce while
    # ranks 0 and 1 still all-reduce gradients. As captured, rank 2 aborted in gloo ("Received
    # data size doesn't match expected size", terminate called: "task 2: Aborted") and ranks 0
    # and 1 got "Connection reset by peer"
    "shard-files": ("failed", "uneven-inputs", [2]),
    # [kill 2] rank 0 imports an experiment tracker (wandb) that is not installed, right after
    # joining the group: ModuleNotFoundError; rank 1 loses it and srun cancels the step
    "tracker-import": ("failed", "missing-module", [0]),
    # [kill 2] a stale process listens on the MASTER_PORT the job exports: rank 0's TCPStore
    # cannot bind (EADDRINUSE); srun cancels the step
    "port-squat": ("failed", "rendezvous-failure", [0]),
    # [plain 3] row 122 of the data (rank 2's, through the DistributedSampler) has a feature
    # "n/a": float() raises ValueError in the dataset's __getitem__ on rank 2
    "bad-row": ("failed", "data-error", [2]),
    # [agents 2x2, --resume ckpt/last.pt] the checkpoint is in node 0's folder only: ranks 2 and
    # 3 (node 1's workers) raise FileNotFoundError in torch.load; ranks 0 and 1 lose them
    "one-node-ckpt": ("failed", "data-error", [2, 3]),
    # [label 2, --time=1 --signal=USR1@45] Slurm sends SIGUSR1 to the step's tasks 45 s before
    # the limit; the handler sets a flag the ranks all-reduce each step: both print "caught
    # SIGUSR1", rank 0 saves a checkpoint "so the job can be requeued", every rank exits 0
    # before the limit: the scheduler's warning handled on purpose, nothing failed
    "warn-signal": ("ok", "preempted", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("twentyninth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twentyninth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twentyninth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "EXP_VARIANT" not in f.read_text(errors="replace"), f


def _text(mode: str) -> str:
    return "\n".join(f.read_text(errors="replace") for f in RUNS.files(mode))


KILL_ON_BAD_EXIT = ["stat-key", "null-read", "idle-wait", "tracker-import", "port-squat"]


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_each_job_wrote_slurm_files_only(mode: str) -> None:
    """One batch job per mode: slurm-<job>.out, and slurm-<job>.err where the script names one."""
    names = [f.name for f in RUNS.files(mode)]
    job = re.match(r"slurm-(\d+)\.", names[0])
    assert job, names
    want = [f"slurm-{job[1]}.out"]
    if mode in KILL_ON_BAD_EXIT:
        want = [f"slurm-{job[1]}.err", *want]
    assert names == want, names


@pytest.mark.parametrize("mode", ["calm-trio", "plateau-vote", "relay-pair", "warn-signal"])
def test_on_success_neither_srun_nor_slurmstepd_speaks(mode: str) -> None:
    text = _text(mode)
    assert "srun:" not in text and "slurmstepd" not in text
    assert "Traceback" not in text


def test_kill_on_bad_exit_cancels_the_step() -> None:
    err = _text("stat-key")
    assert "srun: error: vm: task 1: Exited with exit code 1" in err
    assert re.search(r"slurmstepd-vm: error: \*\*\* STEP \d+\.0 ON vm CANCELLED AT \S+ \*\*\*", err)
    assert "srun: error: vm: task 0: Terminated" in err
    # without --kill-on-bad-exit the others end on their own (they lost a peer)
    assert "CANCELLED" not in _text("empty-bucket")
    assert "srun: error: vm: tasks 0-1: Exited with exit code 1" in _text("empty-bucket")


def test_the_scheduler_ends_two_jobs_and_says_why() -> None:
    assert re.search(
        r"\*\*\* JOB \d+ ON vm CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*", _text("wall-clock")
    )
    cancel = _text("hand-cancel")
    assert re.search(r"\*\*\* JOB \d+ ON vm CANCELLED AT \S+ \*\*\*", cancel)
    assert "DUE TO" not in cancel
    for mode in ("wall-clock", "hand-cancel"):
        assert "srun: error: vm: tasks 0-1: Terminated" in _text(mode)
        assert "Traceback" not in _text(mode)


def test_srun_names_the_signal_of_a_task_that_left_no_traceback() -> None:
    hoard = _text("mem-hoard")
    assert "srun: error: vm: task 1: Killed" in hoard and "[rank1]:" not in hoard
    segv = _text("null-read")
    assert "srun: error: vm: task 2: Segmentation fault" in segv and "[rank2]:" not in segv


def test_srun_labels_agents_not_ranks_under_torchrun() -> None:
    """`srun --label` of two torchrun agents: the label is the agent's task (the node), so
    node 1's workers, ranks 2 and 3, print under "1: "."""
    text = _text("relay-pair")
    assert re.search(r"^1: \[rank 2\] world 4 local_rank 0", text, re.M)
    assert re.search(r"^1: \[rank 3\] world 4 local_rank 1", text, re.M)
    assert re.search(r"^1: \[rank2\]: FileNotFoundError", _text("one-node-ckpt"), re.M)


def test_the_warning_signal_is_handled_and_a_mismatch_fakes_it() -> None:
    warned = _text("warn-signal")
    for r in (0, 1):
        assert re.search(rf"^{r}: \[rank {r}\] caught SIGUSR1 at epoch \d+ it \d+$", warned, re.M)
    assert "exiting so the job can be requeued" in warned
    # norm-log: no signal was sent; rank 1's stop flag came back from rank 0's norm all-reduce
    assert "[rank 1] caught SIGUSR1" in _text("norm-log")
    assert "[rank 0] caught SIGUSR1" not in _text("norm-log")
