"""Real gloo runs of a hundred-and-sixty-eighth training-program style
(tests/programs/hundredsixtyeighth_style_train.py): reinforcement learning in the way of CleanRL's
ppo_atari_multigpu.py, a lab's fork for a classic-control task, launched as two docker compose
services that stand for the two nodes of one torchrun job. Captured by
tests/fixtures/real/capture_hundredsixtyeighth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
"""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a run is given in brackets
# (capture_hundredsixtyeighth.sh; every run: `docker compose up --abort-on-container-exit`, node0
# with ranks 0 and 1, node1 with ranks 2 and 3, 12 iterations of 1024 steps unless a mode says
# otherwise; CleanRL's writer is on local rank 0 of each node: ranks 0 and 2)
EXPECTED: dict[str, Expected] = {
    # 8 behaviour-cloning updates, 12 PPO iterations, every process exits 0; the first container
    # to exit makes compose abort and stop the other, which has exited or is exiting 0
    "calm-cart": ("ok", None, []),
    # [a `version: "3.8"` line in the compose file, no OMP_NUM_THREADS in the services'
    # environment, --cuda left at its default] the same healthy run with scary lines: compose's
    # 'level=warning msg="...: the attribute `version` is obsolete ..."', torchrun's
    # OMP_NUM_THREADS banner on both nodes, the fork's UserWarning '--cuda is set but
    # torch.cuda.is_available() is False: training on the CPU' from every process
    "loud-cart": ("ok", None, []),
    # [--stop-return 60 --learning-rate 1e-3 --total-timesteps 200000] the fork's early stop:
    # after each iteration the ranks all-reduce their mean recent episodic return and all stop
    # once it reaches 60; rank 0 prints 'mean episodic return ... >= 60.0: stopping at
    # global_step=...', every process exits 0: a planned stop
    "early-solve": ("ok", None, []),
    # [node1's copy of rank 3's demonstrations, shard-03-obs.npy, cut to 5000 bytes] rank 3
    # (node1's local rank 1) fails loading it for the behaviour-cloning warm start (np.load: 'ValueError:
    # Failed to read all data for array. ... (file seems not fully written?)'); the others lose it
    # in the first all-reduce: a corrupt input file read on rank 3
    "shard-rot": ("failed", "data-error", [3]),
    # [MT_CASE k1] from iteration 3 a fork's rollout cache on rank 1 (node0's local rank 1) keeps
    # 64 MiB an iteration and at the fifth the process is SIGKILLed (the container's OOM killer):
    # node0's torchrun 'exitcode: -9', no traceback; the others lose it
    "heap-swell": ("failed", "host-oom", [1]),
    # [MT_CASE r] a fork averages each finished episode's return over the processes with an
    # all_reduce inside CleanRL's writer branch (`if local_rank == 0`, ranks 0 and 2): their
    # one-float all_reduce meets ranks 1 and 3's gradient all_reduce; gloo aborts or the ranks
    # time out: a collective only ranks 0 and 2 issued
    "solo-reduce": ("failed", "collective-mismatch", [0, 2]),
    # [node1's command with --local-num-envs 8] CleanRL computes num_iterations from its own
    # process's envs times the world size: node1's processes run 6 iterations, node0's 12; ranks
    # 2 and 3 leave the loop after the sixth and exit 0 (node1's container exits 0 and compose
    # aborts), ranks 0 and 1 wait in iteration 7's first all-reduce and lose them: the ranks
    # whose iterations ran out first
    "env-skew": ("failed", "uneven-inputs", [2, 3]),
    # [MT_CASE h0] a fork's writer on rank 0 keeps runs/.scalars.lock from its third flush on;
    # rank 2's writer (node1's local rank 0) blocks in flock at its next flush, silent, outside
    # any collective; ranks 0, 1 and 3 time out after 20 s in the next iteration's all-reduce:
    # rank 2 stuck (the person then looked at node1's logs)
    "lock-wedge": ("hung", "hang", [2]),
    # [MT_CASE s, --stop-return 60 --learning-rate 1e-3 --total-timesteps 200000] a fork's stop
    # test that rank 0 makes on its own recent episodes and tells no one: rank 0 prints 'mean
    # episodic return ... >= 60.0: stopping ...', leaves the loop and exits 0; ranks 1, 2 and 3
    # go on into the next iteration's all-reduce and lose it: one rank left the run
    "solo-solve": ("failed", "uncoordinated-exit", [0]),
    # [--num-minibatches 5 on both nodes] 256 samples a process in minibatches of 51: the sixth
    # holds one sample, whose advantage std() is nan ('UserWarning: std(): degrees of freedom is
    # <= 0'); the nan loss's gradients, all-reduced, make every process's parameters nan, and
    # the next minibatch's Categorical fails on every rank ('ValueError: Expected parameter
    # logits ... found invalid values'): the same exception on all four
    "nan-spread": ("failed", "python-exception", [0, 1, 2, 3]),
    # [--resume runs/CartPoleMini-v1__ppo_multigpu__1__1733603321/checkpoint.pt, saved by an
    # earlier version of the fork with the run's Args dataclass in it] every process's
    # torch.load (weights_only by default since torch 2.6) rejects it: 'Weights only load
    # failed ... Unsupported global: GLOBAL __main__.Args'
    "resume-pickle": ("failed", "weights-only-load", [0, 1, 2, 3]),
    # [--total-timesteps 2000000; Ctrl-C (SIGINT to compose) once the console shows iteration 5]
    # the person stops a healthy run: compose 'Gracefully stopping... (press Ctrl+C again to
    # force)' and stops node1 then node0 (SIGTERM to torchrun); nothing the containers print
    # after the Ctrl-C reaches the console (the person then looked at node0's logs): stopped on
    # purpose from outside, no rank at fault
    "stop-press": ("failed", "preempted", []),
    # [MT_CASE a] CleanRL's own `dist.init_process_group(backend, rank=local_rank, ...)`, right
    # on one node only: node1's processes also claim ranks 0 and 1, nobody registers ranks 2
    # and 3, and every process's init_process_group times out after 20 s waiting for rank 2's
    # key in the store: the process group never forms
    "rank-alias": ("failed", "rendezvous-failure", []),
    # [--eval-every 3 --capture-video --eval-episodes 100] after iteration 3 rank 0 evaluates
    # the policy and renders every frame of 100 episodes (about 40 s); ranks 1, 2 and 3 wait in
    # iteration 4's first all-reduce and time out after 20 s ('Timed out waiting 20000ms'):
    # rank 0 busy past the timeout
    "eval-crawl": ("failed", "slow-rank-timeout", [0]),
    # [runs/ a named volume whose driver_opts make it a 96 KiB tmpfs both services mount] rank
    # 0's episodes.jsonl fills it: 'OSError: [Errno 28] No space left on device' at an episode's
    # write; the others lose it
    "runs-full": ("failed", "disk-full", [0]),
    # [both services on cleanrl-ppo:slim, built from a Dockerfile that copies ppo_multigpu.py
    # only; --save-model] after the last iteration rank 0 saves the model and imports CleanRL's
    # evaluation: 'ModuleNotFoundError: No module named 'cleanrl_utils''; the others have
    # exited 0 (the person then looked at node0's logs)
    "utils-gap": ("failed", "missing-module", [0]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}

RUNS = RunSet("hundredsixtyeighth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredsixtyeighth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)
