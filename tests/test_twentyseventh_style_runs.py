"""Real gloo runs of a twenty-seventh training-program style (tests/programs/twentyseventh_style_train.py:
a fault-tolerant torchelastic script as the PyTorch elastic docs and torchtitan teach it: `@record`
on main, a checkpoint (model, optimizer, epoch, step) every 4 steps saved by rank 0 with an atomic
rename, every attempt resuming from the newest checkpoint, Python logging "%(asctime)s
%(levelname)s [rank %(rank)s] %(message)s" naming the attempt (TORCHELASTIC_RESTART_COUNT)),
launched by torchrun with --max-restarts 1-2 and the c10d rendezvous, four ways: one agent's
console (every attempt in one console.log), one agent with --log-dir --redirects 3 --tee 3
(console.log and logs/<run id>/attempt_<n>/), two agents as two nodes (node0.log, node1.log;
--nnodes 2, or elastic 1:2 with the second agent joining late), and one agent of a --nnodes 2:2
job whose second node never comes. The point of the set is what restarts do to the logs: errors
of attempts the job recovered from, the same error in every attempt until the restarts run out,
the agent's own lines about restarting. Neither the program nor the launches were used to build
the rules: the diagnosis must generalise. Captured by tests/fixtures/real/capture_twentyseventh.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch, world size and --max-restarts in brackets
# (capture_twentyseventh.sh)
EXPECTED: dict[str, Expected] = {
    # [console 2, restarts 1] two epochs from scratch, checkpoints every 4 steps, no restart;
    # every rank logs "training done", exit 0
    "steady-pair": ("ok", None, []),
    # [console 2, restarts 1, --epochs 4 --target-loss 0.6] the epoch's mean loss is
    # all-reduced, so every rank sees it under the target after epoch 1 and stops there; the
    # final checkpoint is saved, every rank exits 0
    "goal-halt": ("ok", None, []),
    # [logdir 2, restarts 2] attempt 0: rank 1's shard fetch raises ConnectionResetError at
    # step 7; the agent restarts the group, attempt 1 resumes from the step-4 checkpoint and
    # finishes: the job recovered, exit 0. (As captured, rank 0, having lost rank 1 in the
    # gradient all-reduce, then died in teardown: "terminate called without an active
    # exception", "Fatal Python error: Segmentation fault"; the agent names local rank 0's -11)
    "blip-r1": ("ok", None, []),
    # [console 3, restarts 1] attempt 0: rank 2 hoards memory and is SIGKILLed (OOM killer
    # style, no traceback) at step 6; attempt 1 resumes from step 4 and finishes: exit 0. (The
    # agent names local rank 2's exitcode -9 here; in another capture it named local rank 0's
    # -15, the SIGTERM it had sent itself)
    "reaped-r2": ("ok", None, []),
    # [nodes, --nnodes 1:2, restarts 1, a shared checkpoint folder] node 0 starts alone
    # (world 2); node 1's agent comes 12 s later, node 0's agent stops its workers for the new
    # rendezvous (a membership change, no failure), the world of 4 resumes from the newest
    # checkpoint and finishes: both agents exit 0
    "late-node": ("ok", None, []),
    # [console 3, restarts 2] rank 2 looks up a class weight past the end of its table at step 6
    # (IndexError) in every attempt (each resumes from step 4 and reaches step 6 again): the
    # restarts run out, the job fails with rank 2's error
    "index-r2": ("failed", "python-exception", [2]),
    # [logdir 2, restarts 1] attempt 0: rank 0's shard read fails once with EIO at step 5
    # (recovered); attempt 1 resumes from step 4 and rank 1 waits, silent and outside any
    # collective, for a prefetch thread a resume never starts; rank 0 times out after 15 s in
    # the gradient all-reduce, and no restart is left
    "wedge-r1": ("hung", "hang", [1]),
    # [console 2, restarts 2] attempt 0: rank 0 saves step 8's checkpoint in place (no rename)
    # and is SIGKILLed half-way through writing it; attempts 1 and 2 both load that half file on
    # every rank (torch.load's PyTorchFileReader: "OSError: [Errno 22] Invalid argument") and
    # fail until the restarts run out. The job ends on a corrupt input file every rank reads:
    # data-error, ranks 0 and 1
    "torn-save": ("failed", "data-error", [0, 1]),
    # [console 3, restarts 1] rank 0 uploads each checkpoint from step 8 on to an object store
    # for 25 s (logging each part); ranks 1 and 2 time out after 15 s in step 9's all-reduce,
    # in both attempts (attempt 1 resumes from step 8 and uploads step 12's)
    "upload-r0": ("failed", "slow-rank-timeout", [0]),
    # [logdir 3, restarts 1] rank 2 slices its own part of the data (no DistributedSampler) and
    # keeps half of it: it leaves the epoch after 4 steps for the epoch-end loss all-reduce while
    # ranks 0 and 1 all-reduce step 5's gradients (gloo aborts rank 2: exitcode -6, "Fatal
    # Python error: Aborted"); the same in attempt 1
    "thin-r2": ("failed", "uneven-inputs", [2]),
    # [console 2, restarts 1] rank 0 alone all-reduces its gradient norm for its log line
    # (`if rank == 0`), at step 2, while rank 1 goes on to step 3's gradient all-reduce (gloo
    # aborts rank 0: exitcode -6); the same in attempt 1
    "norm-r0": ("failed", "collective-mismatch", [0]),
    # [console 3, restarts 1] rank 1 judges its own loss low enough at step 6 and returns from
    # main (exit 0) without telling the others; ranks 0 and 2 lose it in the next all-reduce;
    # the same in attempt 1
    "quit-r1": ("failed", "uncoordinated-exit", [1]),
    # [logdir 2, restarts 1] rank 0 imports wandb (the experiment tracker) after joining the
    # group: ModuleNotFoundError in both attempts; rank 1 loses it in DDP's first broadcast
    "tracker-r0": ("failed", "missing-module", [0]),
    # [logdir 3, restarts 1] rank 1's native collate dereferences NULL at step 5: SIGSEGV
    # (exitcode -11, no Python traceback) in both attempts
    "segv-r1": ("failed", "native-crash", [1]),
    # [console 2, restarts 1, --rdzv-conf read_timeout=20] a stale process listens on the
    # rendezvous endpoint's port: the agent cannot bind the c10d store there, connects to the
    # squatter as a client and gets no store reply (RendezvousConnectionError); no worker starts
    "port-squat": ("failed", "rendezvous-failure", []),
    # [console --nnodes 2:2, restarts 1, --rdzv-conf join_timeout=20] the second node's agent is
    # never started: the one agent waits for the rendezvous to fill and gives up after 20 s
    # (RendezvousTimeoutError); no worker starts
    "lone-node": ("failed", "rendezvous-failure", []),
    # [nodes 2x2, --nnodes 2, restarts 1] the data file was copied to node 0's disk only:
    # ranks 2 and 3 (node 1) raise FileNotFoundError in torch.load, in both attempts; ranks 0
    # and 1 lose them
    "shard-node0": ("failed", "data-error", [2, 3]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("twentyseventh-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twentyseventh_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twentyseventh_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "ELX_FAULT" not in f.read_text(errors="replace"), f


def _text(mode: str, pattern: str = "*.log") -> str:
    return "\n".join(f.read_text(errors="replace") for f in RUNS.files(mode) if f.match(pattern))


def test_a_recovered_attempt_keeps_its_error_in_attempt_0_only() -> None:
    """--log-dir: attempt 0's ranks wrote error files (@record), attempt 1's did not; the
    console keeps attempt 0's traceback and ends with every rank's 'training done'."""
    names = {
        "/".join(f.relative_to(RUNS.folder("blip-r1")).parts[-3:]) for f in RUNS.files("blip-r1")
    }
    assert {"attempt_0/1/error.json", "attempt_0/0/error.json"} <= names, names
    assert not any(n.startswith("attempt_1/") and n.endswith("error.json") for n in names), names
    console = RUNS.console("blip-r1")
    assert "ConnectionResetError: [Errno 104] Connection reset by peer" in console
    assert len(RUNS.agent_exits("blip-r1")) == 1
    assert console.count("training done") == 2
    assert "ChildFailedError" not in console


@pytest.mark.parametrize(
    ("mode", "attempts", "exit_", "local"),
    [("index-r2", 3, "1", "2"), ("segv-r1", 2, "-11", "1"), ("tracker-r0", 2, "1", "0")],
)
def test_the_same_failure_ends_every_attempt_until_the_restarts_run_out(
    mode: str, attempts: int, exit_: str, local: str
) -> None:
    console = RUNS.console(mode)
    assert RUNS.agent_exits(mode) == [(exit_, local)] * attempts
    assert f"attempt {attempts - 1}: world size" in console
    assert f"attempt {attempts}: world size" not in console
    assert "ChildFailedError" in console
    assert "training done" not in console


def test_a_killed_rank_is_followed_by_a_resumed_attempt_that_finishes() -> None:
    """reaped-r2: one failed worker (rank 2's SIGKILL, no traceback of its own) in attempt 0;
    attempt 1 resumes from the step-4 checkpoint and every rank finishes."""
    console = RUNS.console("reaped-r2")
    assert RUNS.agent_exits("reaped-r2") == [("-9", "2")]
    assert "[rank2]: Traceback" not in console
    assert "ChildFailedError" not in console
    assert "resumed from checkpoints/step_00004.pt" in console
    assert console.count("training done") == 3


def test_a_torn_checkpoint_fails_every_later_attempt_on_load() -> None:
    console = RUNS.console("torn-save")
    assert RUNS.agent_exits("torn-save")[0] == ("-9", "0")
    assert console.count("]: OSError: [Errno 22] Invalid argument") == 4  # 2 ranks x 2 attempts
    assert "saved checkpoint checkpoints/step_00008.pt" not in console


def test_the_hang_comes_in_the_attempt_after_a_recovered_one() -> None:
    console = RUNS.console("wedge-r1")
    attempt1 = console[console.index("attempt 1: world size") :]
    assert "OSError: [Errno 5] Input/output error" in console
    assert "OSError" not in attempt1
    assert "Timed out waiting 15000ms for recv operation" in attempt1
    assert "[rank1]: Traceback" not in attempt1  # rank 1 waits silently until the SIGTERM


def test_a_late_node_restarts_the_group_without_a_failure() -> None:
    """--nnodes 1:2: node 0 trains alone (world 2); node 1's arrival stops node 0's workers and
    a world of 4 resumes from the shared checkpoint; no worker failure is reported."""
    node0 = (RUNS.folder("late-node") / "node0.log").read_text(errors="replace")
    node1 = (RUNS.folder("late-node") / "node1.log").read_text(errors="replace")
    assert node0.index("world size 2") < node0.index("closing signal SIGTERM")
    assert node0.index("closing signal SIGTERM") < node0.index("world size 4")
    assert "[rank 2] resumed from" in node1 and "[rank 3] training done" in node1
    assert "failed (exitcode" not in node0 + node1


def test_the_rendezvous_never_forms() -> None:
    assert "RendezvousTimeoutError" in RUNS.console("lone-node")
    assert "RendezvousConnectionError" in RUNS.console("port-squat")
    for mode in ("lone-node", "port-squat"):
        assert "[rank" not in RUNS.console(mode), mode


def test_two_agents_write_one_console_each() -> None:
    RUNS.check_two_agents("shard-node0")
    node1 = (RUNS.folder("shard-node0") / "node1.log").read_text(errors="replace")
    assert node1.count("[rank2]: FileNotFoundError") == 2


@pytest.mark.parametrize(("mode", "world"), [("wedge-r1", 2), ("segv-r1", 3), ("thin-r2", 3)])
def test_the_log_dir_holds_one_folder_per_attempt(mode: str, world: int) -> None:
    names = {"/".join(f.relative_to(RUNS.folder(mode)).parts[-3:]) for f in RUNS.files(mode)}
    for attempt in (0, 1):
        for r in range(world):
            assert f"attempt_{attempt}/{r}/stdout.log" in names, (attempt, r)
            assert f"attempt_{attempt}/{r}/stderr.log" in names, (attempt, r)
