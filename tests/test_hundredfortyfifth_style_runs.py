"""Real gloo runs of a hundred-and-forty-fifth training-program style
(tests/programs/hundredfortyfifth_style_train.py): embodied-AI reinforcement learning trained the
way habitat-lab's DD-PPO trainer (habitat_baselines) trains a PointNav agent, re-created in plain
torch without habitat installed: each rank steps a VectorEnv whose toy grid simulators live in
forkserver worker PROCESSES behind duplex pipes (scenes as .glb files, episodes as json.gz per
scene, split over the ranks and their environments), collects 16-step rollouts and runs PPO on a
tiny actor-critic (a GRU state encoder) in DDP; DD-PPO's own TCPStore on MAIN_PORT with a
'rollout_tracker' PrefixStore; SIGUSR1/SIGTERM handlers ('Got signal to requeue', 'Exiting
cleanly and saving state') after which every rank saves a resume state and leaves the loop at
the same update, and rank 0 logs 'Requeueing job 4699' in a Slurm batch job. Only rank 0 logs,
through the 'habitat' logger ('%(asctime)-15s %(message)s' on stderr): 'Initialized DD-PPO with 2
workers', the config as YAML, 'agent number of parameters: 8125', every 5 updates 'update: 10\\tfps:
...', 'update: 10\\tenv-time: ...s\\tpth-time: ...s\\tframes: 640', 'Average window size: 50
distance_to_goal: ...  reward: ...  success: ...'. Every rank's errors reach the console (torch's
'[rankN]:' prefix on tracebacks); an environment worker's uncaught exception is printed by
multiprocessing ('Process ForkServerProcess-1:', no rank), and a rank whose worker died sees
EOFError or BrokenPipeError on its pipe. Launched as the DD-PPO README says: `python -u -m
torch.distributed.launch --use_env --nproc_per_node 2 --master_port=39983 run.py --exp-config
ddppo_pointnav.yaml --run-type train` (the legacy launcher and its FutureWarning), one mode with
`python -u -m torch.distributed.run`, one without --use_env, one on two simulated nodes
(--nnodes=2 --node_rank=K --master_addr=127.0.0.1, one launcher per node). gloo on CPU, a 15 s
collective timeout. The fixture of a mode is the console of the command, console.log, or each
node's console, node0.log and node1.log. Neither the program nor the launch were used to build
the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredfortyfifth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 7 of 15 right (noisy-nav, goal-met, wall-end, rss-climb, stats-solo,
scene-odd, env-raise). Missed: habitat's handled SIGUSR1 ('Got signal to requeue', 'Requeueing
job N') is not seen as a requeue; an environment worker's death is not followed through its
pipe: a gzip EOFError printed by the worker process (no rank prefix) reads as a script
exception on a host, a ConnectionResetError on a multiprocessing pipe as a gloo peer error
(collective-mismatch for a silent SIGSEGV), and a rank's EOFError raised after the launcher's
SIGTERM took its workers as the root of a slow or deadlocked rank; a rank that exited 0 between
updates 10 and 15 of 400 reads as uneven inputs; and the launch-wide argument and port
faults name ranks 0/1 and rank 0 as culprits. Since fixed (session 40): sig-one, habitat's
requeue handler's 'Got signal to requeue' and rank 0's 'Requeueing job N' (LCH118). A broken
multiprocessing pipe to an environment worker is now the worker's death on that rank (PY108), not
a lost peer rank: sim-segv and gz-cut name the right rank, their kinds still misses.
"""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a run is given in brackets
# (capture_hundredfortyfifth.sh; `legacy` is `python -u -m torch.distributed.launch
# --nproc_per_node 2 --master_port=39983 --use_env run.py --exp-config ddppo_pointnav.yaml
# --run-type train` with config overrides after it, 8 scenes: 2 a rank, one for each of its two
# environments; `slurm`: SLURM_JOB_ID=4699 and a job name in the environment, so the environment
# workers ignore the job's signals)
EXPECTED: dict[str, Expected] = {
    # [python -u -m torch.distributed.run ..., OMP_NUM_THREADS unset,
    # ...find_unused_params=True ...rnn_dropout=0.1] 40 updates, every process exits 0, with
    # scary lines: torchrun's OMP_NUM_THREADS banner, torch's GRU 'UserWarning: dropout option
    # adds dropout after all but last recurrent layer ...' and DDP's 'find_unused_parameters=True
    # was specified in DDP constructor, but did not find any unused parameters' from both ranks
    "noisy-nav": ("ok", None, []),
    # [legacy ...target_success=0.05 ...num_updates=400] the all-reduced window success reaches
    # the target on every rank alike: rank 0 logs 'Reached success 0.050 >= 0.05 at update 12,
    # stopping', every rank leaves the loop, closes its environments, exits 0: a planned stop
    "goal-met": ("ok", None, []),
    # [slurm legacy ...num_updates=100000; SIGUSR1 to both ranks after 25 s] the scheduler's
    # requeue warning: both ranks print 'Got signal to requeue', leave the loop at the same update
    # (the flag is all-reduced), save a resume state, close their environments; rank 0 logs
    # 'Requeueing job 4699' and `scontrol requeue` accepts it; every process exits 0
    "sig-one": ("ok", "preempted", []),
    # [slurm legacy ...num_updates=100000; SIGTERM to the launcher after 25 s] the scheduler's
    # time limit: the launcher's 'Received 15 death signal, shutting down workers' and its
    # SIGTERM to the ranks, their 'Exiting cleanly and saving state'; they save a resume state
    # and exit 0; the launcher exits 1
    "wall-end": ("failed", "preempted", []),
    # [the legacy launcher without --use_env] it passes '--local-rank=N' and run.py's parser
    # knows no such flag: 'run.py: error: unrecognized arguments: --local-rank=N' from both
    # workers, exit 2 each; the launch gave every rank the same argument
    "dash-rank": ("failed", "local-rank-argument", []),
    # [two nodes; node 1's copy of scene2.json.gz cut to 300 bytes] rank 2 (node 1's local rank
    # 0) gives the scene to its first environment worker, whose gzip read fails ('EOFError:
    # Compressed file ended before the end-of-stream marker was reached', printed under 'Process
    # ForkServerProcess-1:'); rank 2 itself gets EOFError reading the worker's pipe in VectorEnv's
    # constructor; ranks 0, 1 and 3 lose it in DDP's constructor: a corrupt input file on rank 2
    "gz-cut": ("failed", "data-error", [2]),
    # [legacy ...num_updates=400, MT_CASE c1] rank 1's first environment loads its third scene
    # from a slow mount (40 s): rank 1 waits on that worker's pipe, outside any collective, while
    # rank 0 times out after 15 s in the per-update stats all_reduce: rank 1 busy past the timeout
    "scene-crawl": ("failed", "slow-rank-timeout", [1]),
    # [legacy, MT_CASE k1] rank 1 keeps 32 MiB for each rollout step from update 4 on and is
    # SIGKILLed at the twelfth (the OOM killer's way): the launcher's 'failed (exitcode: -9)
    # local_rank: 1'; its orphaned environment workers print EOFError tracebacks
    "rss-climb": ("failed", "host-oom", [1]),
    # [legacy ...num_updates=400, MT_CASE g0] rank 0's second environment worker reads address 0
    # right after it sent its 150th step (the simulator's renderer): SIGSEGV, no trace of its
    # own; rank 0 sees its pipe broken (BrokenPipeError/EOFError) and exits 1, rank 1 loses it:
    # a native crash under rank 0
    "sim-segv": ("failed", "native-crash", [0]),
    # [legacy, MT_CASE s] a fork all-reduces the episode window only on rank 0 and only for the
    # log line (update 5): rank 0 issues that all_reduce alone while rank 1 goes on to update
    # 6's gradient all-reduce; gloo fails the mismatched collective: one only rank 0 issued
    "stats-solo": ("failed", "collective-mismatch", [0]),
    # [legacy, MT_CASE u, three scenes] rank 0 gets scenes 0 and 2 (two environments), rank 1
    # only scene 1: a fork runs one environment instead of raising, and splits its rollout into
    # min(2, 1) mini-batches: rank 1 runs 2 backward passes an update, rank 0 4; rank 1 goes on
    # to the stats all_reduce while rank 0 is in its third gradient all-reduce: the rank whose
    # batches ran out first
    "scene-odd": ("failed", "uneven-inputs", [1]),
    # [legacy; a stale process listens on MAIN_PORT] rank 0's DD-PPO TCPStore cannot listen
    # ('EADDRINUSE'); rank 1's store client talks to the stale process: no process group forms
    "port-held": ("failed", "rendezvous-failure", []),
    # [legacy ...num_updates=400, MT_CASE w1] rank 1's second environment worker takes the
    # episode lock twice after its twelfth episode: rank 1 waits on that pipe for good,
    # silently, outside any collective; rank 0 times out after 15 s in the stats all_reduce,
    # the launcher SIGTERMs rank 1 (whose handler only sets a flag) and kills it 30 s later
    "env-lock": ("hung", "hang", [1]),
    # [legacy ...num_updates=400, MT_CASE e1] a fork's early stop on rank 1's own episodes: from
    # update 8, once its own window's success reaches 0.05, rank 1 closes its environments and
    # calls sys.exit(0); rank 0 waits in the next all_reduce and loses it
    "lone-quit": ("failed", "uncoordinated-exit", [1]),
    # [legacy ...num_updates=400, MT_CASE x1] a fork's SPL measure in rank 1's environment
    # workers reads a measure it never registered: "KeyError: 'soft_spl'" printed under
    # 'Process ForkServerProcess-N:', the worker exits; rank 1 gets EOFError on its pipe and
    # exits 1; rank 0 loses it in the next all_reduce
    "env-raise": ("failed", "python-exception", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "dash-rank": (
        "local-rank-argument on ranks 0 and 1 (LCH105, 0.9) instead of on none: the kind is right, "
        "but both workers' 'run.py: error: unrecognized arguments: --local-rank=N' are taken as "
        "two culprits, where the launch (the legacy launcher without --use_env) gave every rank "
        "the same argument (as set 142's dash-arg)"
    ),
    "gz-cut": (
        "python-exception on rank 2 (PY108, 0.9) instead of data-error: rank 2's EOFError on its "
        "environment worker's pipe is read as the worker's death (the rank is right), but the "
        "worker's own gzip 'EOFError: Compressed file ended before the end-of-stream marker was "
        "reached', printed without a rank prefix just above, is not taken as the cause"
    ),
    "scene-crawl": (
        "python-exception on rank 1 (PY101, 0.6) instead of slow-rank-timeout: rank 1's "
        "'[rank1]: EOFError' from VectorEnv's pipe read (run.py:443), raised only after the "
        "launcher's SIGTERM ended its environment workers, is taken as the root; rank 0's 15 s "
        "timeout is its consequence, though rank 0 timed out first and rank 1 was waiting on a "
        "worker still loading a scene"
    ),
    "sim-segv": (
        "python-exception on rank 0 (PY108, 0.6) instead of native-crash: rank 0's "
        "'ConnectionResetError' from multiprocessing's pipe is read as its environment worker's "
        "death (the rank is right; no longer a peer rank lost, which made it a "
        "collective-mismatch), but how the worker died (SIGSEGV, silently) is not in the log"
    ),
    "port-held": (
        "rendezvous-failure on rank 0 (LCH108, 0.9) instead of on none: the kind is right, but "
        "rank 0, whose DD-PPO TCPStore could not listen on MAIN_PORT ('EADDRINUSE'), is named "
        "as culprit where a stale process holding the port is the cause (rank 1 SIGKILLed 30 s "
        "later is read as host OOM among the consequences)"
    ),
    "env-lock": (
        "python-exception on rank 1 (PY101, 0.6) instead of hung/hang: as scene-crawl, rank "
        "1's '[rank1]: EOFError' on its worker's pipe after the launcher's SIGTERM (its "
        "environment worker deadlocked; rank 0 had timed out after 15 s) is taken as the root"
    ),
    "lone-quit": (
        "uneven-inputs on rank 1 (INF209, 0.57) instead of uncoordinated-exit: rank 1 left "
        "silently with exit 0 between updates 10 and 15 of a planned 400 (num_updates: 400 in "
        "the config dump, 'update: N' lines every 5), read as a loop a few batches short; "
        "the run's planned length is not read from this style's counters"
    ),
}

RUNS = RunSet("hundredfortyfifth-", EXPECTED, MISSES, label_nowhere=True)
TWO_NODES = {"gz-cut"}


def _out(mode: str) -> str:
    return RUNS.console(mode)


def _node(mode: str, node: int) -> str:
    return (RUNS.folder(mode) / f"node{node}.log").read_text(errors="replace")


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfortyfifth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfortyfifth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_console_or_two_nodes(mode, TWO_NODES)


@pytest.mark.parametrize("mode", sorted(set(EXPECTED) - TWO_NODES - {"noisy-nav"}))
def test_the_legacy_launcher_warns_first(mode: str) -> None:
    assert _out(mode).startswith(
        "/repo/.venv/lib/python3.11/site-packages/torch/distributed/launch.py:207: "
        "FutureWarning: The module torch.distributed.launch is deprecated"
    )


def test_what_the_healthy_runs_print() -> None:
    for mode in ("noisy-nav", "goal-met", "sig-one"):
        text = _out(mode)
        assert "Traceback" not in text and "exitcode" not in text, mode
        assert re.search(r"^\S+ \S+ Initialized DD-PPO with 2 workers$", text, re.M)
        assert re.search(r"^\S+ \S+ agent number of parameters: 8125$", text, re.M)
        assert re.search(r"^\S+ \S+ config: habitat:$", text, re.M)
    noisy = _out("noisy-nav")
    assert noisy.count("\tenv-time: ") == 8  # every 5 of 40 updates
    assert re.search(r"^\S+ \S+ update: 40\tfps: \d+\.\d{3}\t$", noisy, re.M)
    assert re.search(
        r"^\S+ \S+ Average window size: 50  distance_to_goal: \d\.\d{3}  reward: -?\d\.\d{3}"
        r"  success: \d\.\d{3}$",
        noisy,
        re.M,
    )
    assert "Setting OMP_NUM_THREADS environment variable for each process" in noisy
    assert noisy.count("UserWarning: dropout option adds dropout after all but last") == 2
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\]:\[W.*find_unused_parameters=True was specified", noisy)
    assert re.search(r"Reached success 0\.\d{3} >= 0\.05 at update \d+, stopping", _out("goal-met"))


def test_the_scheduler_signals_are_handled() -> None:
    requeue = _out("sig-one")
    assert requeue.count("Got signal to requeue") == 2
    assert re.search(r"^\S+ \S+ Requeueing job 4699$", requeue, re.M)
    wall = _out("wall-end")
    assert "Received 15 death signal, shutting down workers" in wall
    assert wall.count("Exiting cleanly and saving state") == 2
    assert "[rank" not in wall  # both ranks left the loop and exited 0


def test_the_launcher_names_signals_and_failures_with_local_ranks() -> None:
    assert RUNS.agent_exits("rss-climb") == [("-9", "1")]
    assert RUNS.agent_exits("stats-solo") == [("-6", "0")]
    assert RUNS.agent_exits("scene-odd") == [("-6", "1")]
    for mode in ("stats-solo", "scene-odd"):
        assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in _out(mode)
    assert RUNS.agent_exits("sim-segv") == [("1", "0")]
    assert RUNS.agent_exits("env-raise") == [("1", "1")]
    assert RUNS.agent_exits("lone-quit") == [("1", "0")]  # rank 1 exited 0: not a failure
    assert "EADDRINUSE" in _out("port-held")
    assert "Unable to shutdown process" in _out("port-held")  # rank 1 ignored SIGTERM
    for rank in (0, 1):
        assert f"run.py: error: unrecognized arguments: --local-rank={rank}" in _out("dash-rank")


def test_the_environment_workers_die_under_their_ranks() -> None:
    cut = _node("gz-cut", 1)
    assert "Process ForkServerProcess-1:" in cut
    assert "EOFError: Compressed file ended before the end-of-stream marker was reached" in cut
    assert "[rank2]: ConnectionResetError" in cut or "[rank2]: EOFError" in cut
    assert "[rank2]" not in _node("gz-cut", 0)
    raised = _out("env-raise")
    assert "KeyError: 'soft_spl'" in raised and "[rank1]: EOFError" in raised
    segv = _out("sim-segv")
    assert re.search(r"\[rank0\]: (BrokenPipeError|ConnectionResetError|EOFError)", segv)
    assert "Process ForkServerProcess" not in segv  # the crashed worker printed nothing
    assert "Process ForkServerProcess-" in _out("rss-climb")  # orphans read EOF


def test_the_busy_and_the_stuck_rank() -> None:
    for mode in ("scene-crawl", "env-lock"):
        text = _out(mode)
        assert "[rank0]: RuntimeError: " in text and "Timed out waiting 15000ms" in text, mode
        assert "[rank1]: EOFError" in text, mode  # its workers went with the launcher's SIGTERM
    assert "Connection closed by peer" in _out("lone-quit")
    assert "[rank1]" not in _out("lone-quit")
