"""Real gloo runs of a hundred-and-fifty-fifth training-program style
(tests/programs/hundredfiftyfifth_style_train.py): a PyTorch DDP job on a PBS Pro supercomputer
the way ALCF's Polaris user guide and the HPC centres' DDP examples run one, re-created in plain
torch: a job script (#PBS -l select=2:system=polaris, -l walltime=00:30:00, -q debug, -A
datascience) that exports MASTER_ADDR and MASTER_PORT, copies the data set onto each node's
local SSD (/local/scratch) and starts `mpiexec -n 4 --ppn 2 --depth=8 --cpu-bind depth --env
OMP_NUM_THREADS=1 python train.py` (Cray PALS, simulated: PMI_RANK, PMI_SIZE,
PALS_LOCAL_RANKID; its 'x3005c0s19b1n0.hsn.cm.polaris.alcf.anl.gov: rank 3 exited with code 1' and
'...: rank 2 died from signal 9' lines, the other ranks SIGTERMed), one mode OpenMPI's `mpirun
-np 4 --npernode 2` (OMPI_COMM_WORLD_*, its 'Primary job  terminated normally...' blocks; the
second node's ranks get only what -x exports), one mode `python train.py` alone. The program sets
RANK, WORLD_SIZE and LOCAL_RANK by hand from those variables and calls init_process_group(env://,
gloo, a 15 s timeout); a tiny MNIST-like CNN in DDP on synthetic shards (/local/scratch/mnist/
train_NN.npz, rank r reads shard r; val.npz split across the ranks), batches prefetched by a
background thread. PBS keeps the job's stdout in train.o<seq> and its stderr in train.e<seq>:
every rank's print() (flushed, no rank prefix) lands in the first ('rank 2/4 on x3005c0s19b1n0
local 0', 'rank 3: 464 train samples (15 batches), 128 test samples', and from rank 0 the config
block, 'Train Epoch: 1 [128/512 (25%)]\\tLoss: 2.301234', 'Epoch 1: train loss 2.3017, ...',
'Test set: Average loss: 2.2810, Accuracy: 132/512 (25.78%)', 'Saving checkpoint to
checkpoints/mnist_cnn_epoch2.pt'), every traceback ('[rank1]: ' prefixed by torch once the process
group exists, bare before), warning and launcher line in the second, their interleaving lost; the
centre's resource-usage summary ('Exit Status: 1', 'Walltime Used: 00:00:35') ends the .o file,
PBS's '=>> PBS: job killed: walltime 185 exceeded limit 180' is in the .e file. The fixture of a
mode is its job folder as the user has it: train.o<seq> and train.e<seq>. Neither the program nor
the launch were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredfiftyfifth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 8 of 16 right (goal-lake, bare-shell, dry-node, zero-class, mud-save, thin-tail,
port-squat, quiet-quit). Missed: Cray PALS's own lines ('x3005c0s19b1n0.hsn.cm.polaris.alcf.
anl.gov: rank 3 died from signal 9', '... rank 2 died from signal 11 and dumped core', '... rank 0
died from signal 6 and dumped core') are quoted with their rank and host but not read as the
ranks' exits, so a SIGKILLed rank 3 leaves a collective mismatch on rank 0, a SIGSEGVed rank 2 an
uncoordinated exit of ranks 0 and 2, and gloo's unprefixed abort is tied to no rank; PBS's '=>>
PBS: job killed: walltime 185 exceeded limit 180' and the job summary's 'Exit Status: 271' /
'Exit Status: 0' are not read as the scheduler's time limit or the job's end (a walltime kill and
two healthy runs ending 'Total training time: 5.1 s' are read as logs that stop mid-training);
rank 1's start-up line in the .o file is taken as printed after the others' timeouts in the .e
file (the two files' interleaving is lost), so a deadlocked rank reads as a busy one; and of
OpenMPI's two bare MASTER_ADDR tracebacks only the rank mpirun names (3) is a culprit.
Since (session 41): PALS' own lines are read as the ranks' exits ('rank 3 died from signal 9':
host OOM on rank 3, fat-heap; 'signal 11 and dumped core': a native crash, null-peek; 'signal
6' ties the gloo abort to rank 0, lone-score; 'signal 15' a rank it stopped), and pbs_mom's
'=>> PBS: job killed: walltime 185 exceeded limit 180' is the batch system ending the job at its
time limit (clock-out); the epilogue's '   Exit Status:        0' is the job's exit code, as
LSF's 'Successfully completed.' and seff's 'State: COMPLETED (exit code 0)' are: a run that
ended 0 with nothing wrong in it (calm-lake, loud-lake right): 14 of 16.
"""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a job is given in brackets
# (capture_hundredfiftyfifth.sh; `pals` is the job script's `mpiexec -n 4 --ppn 2 --depth=8
# --cpu-bind depth --env OMP_NUM_THREADS=1 python train.py` after `mpiexec -n 2 --ppn 1` copied
# the data set onto both nodes' /local/scratch; ranks 0, 1 on x3005c0s13b0n0, 2, 3 on
# x3005c0s19b1n0; 4 shards of 512 samples, 16 batches of 32 a rank and epoch, 5 epochs, a test
# after each, rank 0 saves a checkpoint every second epoch)
EXPECTED: dict[str, Expected] = {
    # [pals] five epochs, 'Test set: ... Accuracy: 448/512 (87.50%)', 'Total training time: ...',
    # every rank exits 0, 'Exit Status: 0', an empty .e file
    "calm-lake": ("ok", None, []),
    # [mpiexec --depth=1 --cpu-bind depth ... python train.py --num-workers 3] each rank bound to
    # one core asks for 3 DataLoader workers: torch's "UserWarning: This DataLoader will create 3
    # worker processes in total. Our suggested max number of worker in current system is 1 ...
    # might get DataLoader running slow or even freeze" twice from each of the 4 ranks in the .e
    # file; the same healthy run, every rank exits 0
    "loud-lake": ("ok", None, []),
    # [pals --epochs 8 --target-acc 85] the all-reduced test accuracy passes the target after
    # epoch 5 on every rank alike ('Reached target accuracy 87.50% >= 85.00%, stopping'), all
    # leave the loop and exit 0: a planned stop
    "goal-lake": ("ok", None, []),
    # [the job script runs `python train.py` without mpiexec] no PMI_RANK, so the OpenMPI
    # branch: "KeyError: 'OMPI_COMM_WORLD_RANK'", exit 1; a script started without its launcher
    "bare-shell": ("failed", "launcher-env-missing", []),
    # [mpirun -np 4 --npernode 2 -x OMP_NUM_THREADS=1 python train.py] OpenMPI passes the job
    # script's MASTER_ADDR and MASTER_PORT to the head node's ranks only: ranks 2 and 3 raise
    # "ValueError: Error initializing torch.distributed using env:// rendezvous: environment
    # variable MASTER_ADDR expected, but not set" (bare tracebacks, before any process group);
    # mpirun aborts the job on the first of them
    "half-env": ("failed", "launcher-env-missing", [2, 3]),
    # [the job script copies the data set to /local/scratch itself: on the head node only] ranks 2
    # and 3 on x3005c0s19b1n0 find no '/local/scratch/mnist/train_02.npz' / 'train_03.npz'
    # (FileNotFoundError), exit 1; mpiexec SIGTERMs ranks 0 and 1: input files missing on the
    # ranks of one node
    "dry-node": ("failed", "data-error", [2, 3]),
    # [pals, MT_CASE k3] rank 3 keeps 64 MiB a batch from epoch 2 on and SIGKILLs itself at the
    # sixth (the OOM killer's way): 'rank 3 died from signal 9', no traceback of its own; the
    # others lose it in the gradient all-reduce ('Connection closed by peer')
    "fat-heap": ("failed", "host-oom", [3]),
    # [pals --epochs 300, #PBS -l walltime=00:03:00; the simulated PBS kills the job 50 s in]
    # '=>> PBS: job killed: walltime 185 exceeded limit 180', SIGTERM to every process of the
    # job: 'rank N died from signal 15' for all four, 'Exit Status: 271': the scheduler's time
    # limit
    "clock-out": ("failed", "preempted", []),
    # [pals, MT_CASE w1] rank 1's prefetch thread takes its queue's lock twice in epoch 3: its
    # main thread waits for a batch for good, outside any collective, silently; ranks 0, 2, 3 time
    # out after 15 s in the gradient all-reduce ('Timed out waiting 15000ms'), exit 1, mpiexec
    # SIGTERMs rank 1
    "twin-latch": ("hung", "hang", [1]),
    # [pals, MT_CASE v] a fork tests on rank 0 only, but test() still all-reduces the metric:
    # rank 0 issues that all_reduce (3 doubles) alone while ranks 1-3 go on to epoch 2's gradient
    # all-reduce; gloo aborts rank 0 ('op.preamble.length <= op.nbytes. 74712 vs 8 ... Is there a
    # distributed collective mismatch', 'rank 0 died from signal 6'): a collective only rank 0
    # issued
    "lone-score": ("failed", "collective-mismatch", [0]),
    # [pals, MT_CASE x1] rank 1's per-class accuracy over its last samples divides by a class
    # count of zero after epoch 3's training: '[rank1]: ZeroDivisionError: division by zero',
    # exit 1; the others lose it in the epoch's loss all-reduce
    "zero-class": ("failed", "python-exception", [1]),
    # [pals, MT_CASE z2] rank 2 reads address 0 (ctypes.string_at) in epoch 2: 'rank 2 died from
    # signal 11 and dumped core', no traceback; the others lose it
    "null-peek": ("failed", "native-crash", [2]),
    # [pals, MT_CASE s0] rank 0's checkpoint write after epoch 2 stalls 40 s ('Saving checkpoint
    # to checkpoints/mnist_cnn_epoch2.pt', never 'Checkpoint saved'); ranks 1-3 time out after
    # 15 s in epoch 3's first gradient all-reduce, mpiexec SIGTERMs rank 0 still writing: rank 0
    # busy past the timeout
    "mud-save": ("failed", "slow-rank-timeout", [0]),
    # [pals; the data set has 2000 samples: shards of 512, 512, 512 and 464] rank 3 has 15
    # batches ('rank 3: 464 train samples (15 batches)'), the others 16: rank 3 leaves epoch 1's
    # loop and all-reduces the epoch's loss while the others all-reduce their 16th gradients; gloo
    # aborts rank 3 (signal 6): the rank whose batches ran out first
    "thin-tail": ("failed", "uneven-inputs", [3]),
    # [pals; a process of an earlier job on the head node holds MASTER_PORT] rank 0's TCPStore
    # cannot listen ('EADDRINUSE'), exit 1; no process group forms
    "port-squat": ("failed", "rendezvous-failure", [0]),
    # [pals, MT_CASE e2] a fork's patience on the rank's own loss: rank 2 prints 'Early stopping
    # at epoch 2: no improvement for 1 epoch(s)' (no rank prefix) and exits 0 before the test's
    # all_reduce, with three epochs of the planned five ahead; the others lose it ('Connection
    # closed by peer') and exit 1
    "quiet-quit": ("failed", "uncoordinated-exit", [2]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "half-env": (
        "launcher-env-missing on rank 3 (LCH106, 0.9) instead of on ranks 2 and 3: the kind is "
        "right, but of the two bare (unprefixed) 'environment variable MASTER_ADDR expected, but "
        "not set' tracebacks only the one mpirun names ('Process name: [[N,1],3]', 'Exit code: 1') "
        "gets a rank; rank 2's, from the same node without the job's exports, is not tied to it"
    ),
    "twin-latch": (
        "slow-rank-timeout on rank 1 (INF201, 0.4) instead of hang: rank 1's start-up line in "
        "train.o ('rank 1: 512 train samples (16 batches), 128 test samples') is taken as output "
        "after the others' 'Timed out waiting 15000ms' in train.e ('it was working, not "
        "blocked'), though PBS's two files keep no order between them and rank 1 prints only at "
        "start-up"
    ),
}

RUNS = RunSet("hundredfiftyfifth-", EXPECTED, MISSES, label_nowhere=True)
PALS_LINE = re.compile(
    r"^(x3005c0s(?:13b0|19b1)n0)\.hsn\.cm\.polaris\.alcf\.anl\.gov: rank (\d) "
    r"(?:exited with code (\d+)|died from signal (\d+))",
    re.M,
)


def _file(mode: str, stream: str) -> str:
    (path,) = RUNS.folder(mode).glob(f"train.{stream}*")
    return path.read_text(errors="replace")


def _o(mode: str) -> str:
    return _file(mode, "o")


def _e(mode: str) -> str:
    return _file(mode, "e")


def _pals(mode: str) -> dict[int, str]:
    """Each rank PALS reported: its exit code, or 'sN' for a signal."""
    return {
        int(r): (code if code else f"s{sig}") for _, r, code, sig in PALS_LINE.findall(_e(mode))
    }


def _status(mode: str) -> int:
    m = re.search(r"^   Exit Status:\s+(\d+)$", _o(mode), re.M)
    assert m, mode
    return int(m.group(1))


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfiftyfifth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfiftyfifth_style_fixture_is_a_pbs_job_folder(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = RUNS.names(mode)
    seq = 1234567 + list(EXPECTED).index(mode)
    assert names == [f"train.e{seq}", f"train.o{seq}"], names
    for stream in "oe":
        assert "MT_CASE" not in _file(mode, stream)
    o = _o(mode)
    assert o.startswith("NUM_OF_NODES= 2 TOTAL_NUM_RANKS= 4 RANKS_PER_NODE= 2"), o[:200]
    assert f"   Job Id:             {seq}.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\n" in o
    assert o.rstrip().endswith("=" * 86)


def test_what_the_healthy_jobs_print() -> None:
    for mode in ("calm-lake", "loud-lake", "goal-lake"):
        o = _o(mode)
        assert _status(mode) == 0
        assert "Traceback" not in _e(mode) and not _pals(mode)
        assert re.search(r"^Total training time: \d+\.\d s$", o, re.M)
        for rank in range(4):
            assert f"rank {rank}: 512 train samples (16 batches), 128 test samples" in o
    for mode in ("calm-lake", "loud-lake"):
        assert _o(mode).count("\nTest set: Average loss: ") == 5
        assert _e(mode) == "" or mode == "loud-lake"
    loud = _e("loud-lake")
    assert loud.count("UserWarning: This DataLoader will create 3 worker processes in total.") == 8
    assert "Our suggested max number of worker in current system is 1" in loud
    goal = _o("goal-lake")
    assert "Reached target accuracy 87.50% >= 85.00%, stopping" in goal
    assert "Train Epoch: 6 " not in goal and _e("goal-lake") == ""


def test_the_ranks_and_their_nodes_in_the_o_file() -> None:
    for mode in set(EXPECTED) - {"bare-shell"}:
        o = _o(mode)
        for rank in range(4):
            host = "x3005c0s13b0n0" if rank < 2 else "x3005c0s19b1n0"
            assert f"\nrank {rank}/4 on {host} local {rank % 2}\n" in o, mode
    assert "rank 0/4" not in _o("bare-shell")


def test_what_pals_and_mpirun_report() -> None:
    assert _pals("fat-heap")[3] == "s9"
    assert _pals("null-peek")[2] == "s11"
    assert "rank 2 died from signal 11 and dumped core" in _e("null-peek")
    assert _pals("lone-score")[0] == "s6"
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in _e(
        "lone-score"
    )
    assert _pals("thin-tail")[3] == "s6"
    assert _pals("zero-class")[1] == "1"
    assert _pals("port-squat")[0] == "1"
    assert _pals("dry-node")[2] in ("1", "s15") and _pals("dry-node")[3] in ("1", "s15")
    assert "1" in (_pals("dry-node")[2], _pals("dry-node")[3])
    # the stuck and the busy rank are SIGTERMed by mpiexec after another rank's timeout
    assert _pals("twin-latch")[1] == "s15"
    assert _pals("mud-save")[0] == "s15"
    # rank 2 exited 0: PALS says nothing of it
    assert 2 not in _pals("quiet-quit")
    assert _pals("clock-out") == {0: "s15", 1: "s15", 2: "s15", 3: "s15"}
    half = _e("half-env")
    assert "Primary job  terminated normally, but 1 process returned" in half
    assert re.search(r"Process name: \[\[\d+,1\],[23]\]\n  Exit code:    1", half)
    assert not _pals("half-env") and not _pals("bare-shell")
    assert _status("clock-out") == 271
    for mode in set(EXPECTED) - {"calm-lake", "loud-lake", "goal-lake", "clock-out"}:
        assert _status(mode) != 0, mode


def test_what_the_failing_ranks_say() -> None:
    assert "KeyError: 'OMPI_COMM_WORLD_RANK'" in _e("bare-shell")
    half = _e("half-env")
    assert half.count("environment variable MASTER_ADDR expected, but not set") == 2
    assert "[rank" not in half  # before any process group: no torch prefix
    dry = _e("dry-node")
    for rank in (2, 3):
        assert (
            f"[rank{rank}]: FileNotFoundError: [Errno 2] No such file or directory: "
            f"'/local/scratch/mnist/train_0{rank}.npz'"
        ) in dry
    assert "[rank0]" not in dry and "[rank1]" not in dry
    assert "[rank1]: ZeroDivisionError: division by zero" in _e("zero-class")
    assert "EADDRINUSE" in _e("port-squat")
    assert "=>> PBS: job killed: walltime 185 exceeded limit 180" in _e("clock-out")
    # the killed ranks leave no traceback of their own; the others lose them
    assert "[rank3]" not in _e("fat-heap") and "[rank2]" not in _e("null-peek")
    for mode in ("fat-heap", "null-peek"):
        assert "Connection" in _e(mode)


def test_the_busy_the_stuck_the_short_and_the_early_rank() -> None:
    mud = _o("mud-save")
    assert "Saving checkpoint to checkpoints/mnist_cnn_epoch2.pt" in mud
    assert "Checkpoint saved" not in mud and "Train Epoch: 3 " not in mud
    assert _e("mud-save").count("Timed out waiting 15000ms") == 3
    latch = _o("twin-latch")
    assert "Train Epoch: 3 [0/512" in latch and "Epoch 3: train loss" not in latch
    assert "Timed out waiting 15000ms" in _e("twin-latch")
    assert "[rank1]" not in _e("twin-latch")
    thin = _o("thin-tail")
    assert "rank 3: 464 train samples (15 batches), 128 test samples" in thin
    assert "Epoch 1: train loss" not in thin
    quit_ = _o("quiet-quit")
    assert "\nEarly stopping at epoch 2: no improvement for 1 epoch(s)\n" in quit_
    assert "Test set" not in quit_.split("Epoch 2: train loss")[1]
    assert "Connection closed by peer" in _e("quiet-quit")
