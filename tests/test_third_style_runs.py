"""Real gloo runs of a third DDP job style (tests/programs/third_style_train.py: bare print() lines
`[R0/3] ...` and JSON metric lines, a hand-written batching loop, a 20 s collective timeout),
launched four ways: torchrun console only, torchrun --log-dir/--redirects/--tee (per-rank files
beside the console), two torchrun agents emulating two nodes (each agent's console in
node0.log and node1.log; c10d or static rendezvous), and plain python. Neither the program nor the
launches were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_third.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch in brackets (see capture_third.sh)
EXPECTED: dict[str, Expected] = {
    # [logdir] every rank finishes and exits 0; the warnings (find_unused_parameters=True with
    # none unused, a UserWarning, a missing resume checkpoint that is handled) are harmless
    "healthy": ("ok", None, []),
    # [console] rank 2's own code slices its labels one short: torch raises ValueError "Expected
    # input batch_size (8) to match target batch_size (7)"; a code bug, not unreadable data
    "value-error": ("failed", "python-exception", [2]),
    # [static, 2 nodes] rank 3 (node1) cannot open its shard right after init: FileNotFoundError
    "missing-file": ("failed", "data-error", [3]),
    # [logdir] rank 1 leaves the loop, destroys its group and exits 0; the others keep training
    "leave": ("failed", "uncoordinated-exit", [1]),
    # [c10d, 2 nodes] rank 2 SIGKILLs itself mid-training: the OOM killer's signature, so
    # host-oom (suggested, not proven), as for style-sigkill
    "sigkill": ("failed", "host-oom", [2]),
    # [c10d, 2 nodes] a broadcast under `if rank == 0`: the others never issue it
    "rank0-collective": ("failed", "collective-mismatch", [0]),
    # [logdir] rank 1 sleeps 40 s in "evaluation" while the others wait 20 s at the barrier
    "slow-rank": ("failed", "slow-rank-timeout", [1]),
    # [console] rank 2 has 7 batches per epoch, the others 10; no Join
    "uneven": ("failed", "uneven-inputs", [2]),
    # [logdir] every rank skips `mid` on every third batch with find_unused_parameters=False:
    # each rank's reducer raises at the next forward
    "unused": ("failed", "ddp-unused-parameters", [0, 1, 2]),
    # [static, 2 nodes] rank 1 builds a wider hidden layer: parameter shapes differ from rank 0's
    "model-mismatch": ("failed", "ddp-model-mismatch", [1]),
    # [logdir] rank 1 reads address 0 (ctypes.string_at(0)): SIGSEGV, no Python traceback
    "segv": ("failed", "native-crash", [1]),
    # [logdir] argparse requires --local_rank, which torchrun never passes: every rank exits 2
    "local-rank": ("failed", "local-rank-argument", [0, 1, 2]),
    # [static, 2 nodes] SIGTERM to both torchrun agents mid-training, as a scheduler preempts
    "sigterm": ("failed", "preempted", []),
    # [c10d, 2 nodes] rank 0 alone decides to stop early and exits 0; ranks 1-3 wait for it
    "early-stop-main": ("failed", "uncoordinated-exit", [0]),
    # [logdir] the stop flag is all-reduced: every rank stops at the same epoch and exits 0
    "early-stop-all": ("ok", None, []),
    # [console] a DataLoader worker of rank 1 is SIGKILLed (the only mode with a DataLoader)
    "worker-killed": ("failed", "dataloader-worker-killed", [1]),
    # [console] rank 0 calls dist.get_world_size() before init_process_group
    "pg-before-init": ("failed", "process-group-not-initialized", [0]),
    # [logdir] rank 0 resumes from a checkpoint holding an argparse.Namespace: torch.load's
    # weights_only default (torch >= 2.6) rejects it
    "weights-only": ("failed", "weights-only-load", [0]),
    # [python] the torchrun script started with plain python: no RANK/WORLD_SIZE, so no rank
    "no-launcher": ("failed", "launcher-env-missing", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("third-", EXPECTED, MISSES)


@pytest.mark.parametrize("mode", RUNS.params())
def test_third_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_third_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


def test_a_launchers_store_errors_while_it_shuts_down_are_not_the_root() -> None:
    """node1's agent reports its failed worker, then its c10d store connection and rendezvous
    shutdown fail (the agent that hosted the store had exited): those errors are the
    shutdown, explained by the workers, never a rendezvous failure to fix."""
    report = RUNS.report("early-stop-main")
    assert report.verdict.kind != "rendezvous-failure"
    roles = {f.role for f in report.findings if f.rule == "LCH108"}
    assert roles and "root" not in roles, roles
