"""Real gloo runs of a fourth DDP job style, started WITHOUT torchrun
(tests/programs/spawn_style_train.py: Python logging per process, `[proc <pid>]` in the format and
the rank only inside the text as `gpu N | ...`, tqdm bars from rank 0, a 20 s collective timeout),
launched two ways: torch.multiprocessing.spawn (no launcher prefix; a failure comes back through
spawn's ProcessRaisedException / ProcessExitedException in the parent's traceback) and the legacy
`python -m torch.distributed.launch --use_env` (console only, or --log-dir with --redirects 3 and
no --tee: the console holds the agent's lines, the workers' output only the per-rank files).
Neither the program nor the launches were used to build the rules: the diagnosis must
generalise. Captured by tests/fixtures/real/capture_spawn.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch in brackets (see capture_spawn.sh). 3 ranks each.
# Under mp.spawn the parent raises for the first process it sees exit non-zero, SIGTERMs the
# others at once, and prints only that one process's traceback or signal.
EXPECTED: dict[str, Expected] = {
    # [spawn] every process finishes and exits 0, the parent logs that all finished; the warnings
    # (no checkpoint to resume, a UserWarning, find_unused_parameters=True with none unused)
    # are harmless
    "healthy": ("ok", None, []),
    # [spawn] rank 1's shuffled order holds an index one past its 80 samples in epoch 1:
    # IndexError from tensor indexing, a code bug (not unreadable data); spawn's parent prints
    # "-- Process 1 terminated with the following error:" and the traceback
    "index-error": ("failed", "python-exception", [1]),
    # [spawn] rank 1 cannot open its shard right after init: FileNotFoundError
    "missing-file": ("failed", "data-error", [1]),
    # [spawn] rank 1 SIGKILLs itself mid-training: "process 1 terminated with signal SIGKILL" is
    # the OOM killer's signature, so host-oom (suggested, not proven), as for style-sigkill
    "sigkill": ("failed", "host-oom", [1]),
    # [spawn] rank 1 reads address 0 (ctypes.string_at(0)): SIGSEGV, no Python traceback
    "segv": ("failed", "native-crash", [1]),
    # [spawn] rank 1 breaks out of its loop in epoch 1 ("under the target, stopping"), finishes,
    # destroys its group and returns (exit 0); ranks 0 and 2 keep training and lose their peer
    "leave": ("failed", "uncoordinated-exit", [1]),
    # [spawn] after a new best, rank 0 alone broadcasts a "save" flag (a collective in a
    # rank-dependent branch) while ranks 1 and 2 wait in their barrier
    "rank0-collective": ("failed", "collective-mismatch", [0]),
    # [spawn] rank 1 sleeps 40 s in "evaluation" while ranks 0 and 2 wait 20 s at the barrier
    "slow-rank": ("failed", "slow-rank-timeout", [1]),
    # [spawn] rank 1 has 7 batches per epoch, the others 10; no Join
    "uneven": ("failed", "uneven-inputs", [1]),
    # [spawn] only rank 1 skips `mid` (every third batch) with find_unused_parameters=False: its
    # reducer raises at the next forward, the others wait in the backward's all-reduce
    "unused": ("failed", "ddp-unused-parameters", [1]),
    # [spawn] rank 1 builds a wider hidden layer: parameter shapes differ from rank 0's
    "model-mismatch": ("failed", "ddp-model-mismatch", [1]),
    # [spawn] the stop vote is all-reduced: every rank stops after epoch 1 and returns, exit 0
    "early-stop-all": ("ok", None, []),
    # [spawn] another process already listens on the tcp:// port: rank 0's TCPStore server
    # cannot bind (EADDRINUSE); the others are SIGTERMed while they wait for the store. The
    # root error is rank 0's, the fix is the port
    "port-in-use": ("failed", "rendezvous-failure", [0]),
    # [legacy console] the same healthy run under torch.distributed.launch --use_env (its
    # FutureWarning that the module is deprecated is harmless)
    "legacy-healthy": ("ok", None, []),
    # [legacy console] the IndexError of index-error, printed by rank 1 itself ([rank1]: prefix
    # from c10d's excepthook) and summarised by the agent
    "legacy-index-error": ("failed", "python-exception", [1]),
    # [legacy logdir] the SIGKILL of sigkill; the agent's console names exitcode -9
    "legacy-sigkill": ("failed", "host-oom", [1]),
    # [legacy console] the early return of leave, its lines unprefixed among the others'
    "legacy-leave": ("failed", "uncoordinated-exit", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("spawn-", EXPECTED, MISSES)


@pytest.mark.parametrize("mode", RUNS.params())
def test_spawn_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_spawn_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
