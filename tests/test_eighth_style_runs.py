"""Real gloo runs of an eighth training-program style (tests/programs/eighth_style_train.py: a
single-file nanoGPT-style train.py in raw torch: globals overridden by `--key=value`, DDP when
torchrun set RANK, a tiny GPT on per-rank np.memmap token shards read at random offsets, gradient
accumulation through `require_backward_grad_sync`, estimate_loss averaged by all_reduce on every
rank, a checkpoint dict saved by the master, `init_from="resume"`, `print` on the master only, a
20 s collective timeout), launched five ways: torchrun --standalone (console), torchrun --log-dir
--tee 3, the legacy `python -m torch.distributed.launch`, two torchrun agents as two nodes (c10d
rendezvous), and plain python. Neither the program nor the launches were used to build the
rules: the diagnosis must generalise. Captured by tests/fixtures/real/capture_eighth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_eighth.sh)
EXPECTED: dict[str, Expected] = {
    # [console 2] --dtype=float16 --find_unused=True: every rank warns that torch.cuda.amp's
    # GradScaler is deprecated and, enabled without CUDA, disables itself; DDP's reducer warns
    # that find_unused_parameters=True found no unused parameter. Harmless: all exit 0
    "loud-but-fine": ("ok", None, []),
    # [logdir 4] bf16 autocast and JSON metric lines; max_iters reached, every rank exits 0
    "iters-done": ("ok", None, []),
    # [console 3] the corpus lost 60 tokens at its end, so the last shard's train file (rank 2's)
    # is shorter than the size get_batch draws offsets from (meta.pkl's, of a full shard): when
    # rank 2 draws an offset past its end, torch.stack gets a short slice and raises
    # RuntimeError; ranks 0 and 1 lose it in their next collective
    "memmap-overrun": ("failed", "python-exception", [2]),
    # [console 3] estimate_loss (with its all_reduce of the mean loss) runs on the master only:
    # rank 0's 1-float all_reduce meets ranks 1 and 2's gradient all_reduce of the first
    # backward (gloo: size mismatch, SIGABRT)
    "solo-eval": ("failed", "collective-mismatch", [0]),
    # [console 3] at iter 20 the master saves the checkpoint, then mirrors it to "remote
    # storage" at 6 kB/s (about a minute); ranks 1 and 2 time out in the barrier after 20 s
    "ckpt-stall": ("failed", "slow-rank-timeout", [0]),
    # [console 2] init_from=resume from a checkpoint saved from the DDP wrapper (keys start with
    # "module."; the loader strips only "_orig_mod."): load_state_dict raises on every rank
    "prefix-resume": ("failed", "python-exception", [0, 1]),
    # [nodes 2x2] init_from=resume with a node-local out_dir: node 1's has no ckpt.pt, so
    # ranks 2 and 3 fail in torch.load (FileNotFoundError), ranks 0 and 1 lose them in DDP's
    # constructor: a missing input file
    "half-resume": ("failed", "data-error", [2, 3]),
    # [nodes 2x2] node 1's data folder was copied without meta.pkl: ranks 2 and 3 fall back to
    # GPT-2's vocab_size 50304 (they say so), ranks 0 and 1 use 65; DDP's constructor finds the
    # parameter shapes differ
    "vocab-skew": ("failed", "ddp-model-mismatch", [2, 3]),
    # [nodes 2x2] node 1 runs micro-batches half the size and twice the accumulation steps: its
    # ranks sync on micro step 5, node 0's on micro step 2, but every rank issues the same
    # gradient all_reduces once per iteration, so they pair up; all exit 0
    "uneven-accum": ("ok", None, []),
    # [console 3] the corpus's last 15% is padding (targets ignored): rank 2's shard holds it,
    # a micro-batch of padding only gives loss nan, and rank 2 alone prints so and breaks out
    # of its loop (exits 0); ranks 0 and 1 wait for it in the gradient all_reduce
    "nan-break": ("failed", "uncoordinated-exit", [2]),
    # [logdir 2] clip_grad_norm_ on the master only: no collective, the replicas drift apart
    # silently; every rank exits 0
    "clip-on-master": ("ok", None, []),
    # [console 3] rank 1 SIGKILLs itself at iter 12 (the OOM killer's signature): host-oom,
    # suggested not proven
    "sigkill-step": ("failed", "host-oom", [1]),
    # [logdir 4] rank 3 dereferences NULL through ctypes at iter 8: SIGSEGV, no traceback
    "null-deref": ("failed", "native-crash", [3]),
    # [console 3] the out_dir already holds a ckpt.pt: the master asks on stdin whether to
    # overwrite it, and nobody types (the terminal stays open); rank 0 blocks in input(),
    # outside any collective and silent, ranks 1 and 2 time out in DDP's constructor
    "ask-overwrite": ("hung", "hang", [0]),
    # [legacy 2] torch.distributed.launch passes --local-rank=N: the configurator rejects the
    # unknown key on every rank
    "legacy-argv": ("failed", "local-rank-argument", [0, 1]),
    # [legacy 2, --use-env] the same program trains to the end, every rank exits 0 (the
    # launcher's deprecation warning is harmless)
    "legacy-env-ok": ("ok", None, []),
    # [python] --distributed=on without a launcher: init_process_group's env:// rendezvous finds
    # no RANK
    "no-torchrun": ("failed", "launcher-env-missing", []),
    # [python] one process, no DDP, 30 iterations, exits 0
    "solo-run": ("ok", None, []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("eighth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_eighth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_eighth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)


@pytest.mark.parametrize(
    ("mode", "world"), [("iters-done", 4), ("null-deref", 4), ("clip-on-master", 2)]
)
def test_a_teed_run_keeps_each_ranks_streams_in_its_own_files(mode: str, world: int) -> None:
    """--log-dir --tee 3: the console has every rank's lines prefixed, each rank's files its own."""
    ranks = [f for f in RUNS.files(mode) if f.name in ("stdout.log", "stderr.log")]
    assert len(ranks) == 2 * world
    assert f"[default{world - 1}]:" in RUNS.console(mode)
    assert "[default" not in "".join(f.read_text() for f in ranks)


@pytest.mark.parametrize("mode", ["half-resume", "vocab-skew"])
def test_two_nodes_write_two_agent_logs(mode: str) -> None:
    """Two agents as two nodes: each node's console is its own file, node 1's ranks are 2-3."""
    RUNS.check_two_agents(mode)


def test_the_legacy_launcher_passes_local_rank_unless_told_not_to() -> None:
    """python -m torch.distributed.launch warns that it is deprecated; without --use-env it
    appends --local-rank=N, which the program's configurator rejects on every rank."""
    argv, env = RUNS.console("legacy-argv"), RUNS.console("legacy-env-ok")
    for console in (argv, env):
        assert "The module torch.distributed.launch is deprecated" in console
    assert argv.count("ValueError: Unknown config key: local-rank") == 2
    assert "Unknown config key" not in env


def test_a_plain_python_run_has_no_agent() -> None:
    """Plain python: one process, no rank prefixes, no agent summary."""
    for mode in ("no-torchrun", "solo-run"):
        console = RUNS.console(mode)
        assert "ChildFailedError" not in console
        assert "[rank" not in console
