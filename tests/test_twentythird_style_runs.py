"""Real gloo runs of a twenty-third training-program style (tests/programs/twentythird_style_train.py:
a research repo's homegrown launcher, one `subprocess.Popen` per rank with stdout and stderr in
`logs/rank<N>.log`, its own `[launcher] ...` lines, the rest killed when one fails or, with
--wait-all, waited for; train.py joins through `tcp://127.0.0.1:PORT` with a 15 s timeout and
logs `%(asctime)s [%(levelname)s] %(message)s` with no rank (the rank is only in the file
name), raw DDP on a tiny MLP, a DistributedSampler, per-epoch eval, a checkpoint on rank 0 and
--resume on every rank), launched four ways: the launcher on one node, two launchers as two
nodes (node0/, node1/), the rank files of one node concatenated into all.log (a user's paste),
and one plain process. Neither the program nor the launches were used to build the rules: the
diagnosis must generalise. Captured by tests/fixtures/real/capture_twentythird.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead."""

from __future__ import annotations

import re

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); launch and world size in brackets (capture_twentythird.sh)
EXPECTED: dict[str, Expected] = {
    # [one 2, --workers 4] real warnings only: the DataLoader's "4 worker processes ...
    # suggested max", lr_scheduler.step() before optimizer.step(), torch.tensor() of a tensor;
    # two epochs, eval, checkpoints, every rank exits 0
    "loud-tidy": ("ok", None, []),
    # [nodes 2x2, --epochs 3] three epochs on two nodes, every rank and launcher exits 0
    "nodes-clean": ("ok", None, []),
    # [one 4] rank 1's shard index names a class ("jump") the label map lacks: KeyError while
    # it builds its class weights, after DDP's construction; the others lose it in the first
    # gradient all-reduce and the launcher kills them
    "jump-class": ("failed", "python-exception", [1]),
    # [one 3] rank 2 caches 64 MiB a batch and is SIGKILLed at its fourth (the OOM killer's
    # signature): no traceback, only the launcher's "rank 2 exited with code -9"
    "hoard-r2": ("failed", "host-oom", [2]),
    # [nodes 2x2] rank 3 (node 1) dereferences NULL in its native feature code in epoch 1:
    # SIGSEGV, nothing in its file, node 1's launcher says -11; node 0's ranks lose it
    "null-feat": ("failed", "native-crash", [3]),
    # [one 3, --wait-all] rank 0 writes checkpoint metadata with a tensor in it: TypeError
    # "Object of type Tensor is not JSON serializable"; ranks 1 and 2 lose it in the barrier,
    # the naive launcher waits for all
    "meta-tensor": ("failed", "python-exception", [0]),
    # [one 3, --wait-all] rank 2's shard index was cut short: JSONDecodeError before it joins;
    # ranks 0 and 1 wait at the store until the 15 s timeout, then exit 1
    "torn-index": ("failed", "data-error", [2]),
    # [one 4, --stop-below 100] rank 3 stops on its own validation loss after epoch 0, logs
    # the early stop and exits 0 (the launcher: "rank 3 finished"); the others go on into the
    # eval all-reduce and lose it
    "self-stop": ("failed", "uncoordinated-exit", [3]),
    # [one 3] rank 0 calls dist.barrier() inside `if rank == 0` after its checkpoint; ranks 1
    # and 2 go on to the shared barrier and the next epoch: a collective in a rank-dependent
    # branch
    "zero-wait": ("failed", "collective-mismatch", [0]),
    # [one 3] a per-rank length filter keeps far fewer of rank 1's samples: rank 1 has fewer
    # batches, leaves the loop for the eval all-reduce while ranks 0 and 2 still all-reduce
    # gradients
    "long-filter": ("failed", "uneven-inputs", [1]),
    # [one 3] rank 2 builds a feature cache for 25 s (logging each part) before epoch 1; ranks
    # 0 and 1 time out after 15 s in the gradient all-reduce
    "cache-drag": ("failed", "slow-rank-timeout", [2]),
    # [one 2] a stale process listens on the run's port: rank 0's TCPStore cannot bind
    # (EADDRINUSE); rank 1 talks to the stale process
    "bound-port": ("failed", "rendezvous-failure", [0]),
    # [one 3, --world-size 4] the launcher starts ranks 0-2 of a world of 4: rank 3 never
    # exists, everyone waits at the store until the timeout
    "world-four": ("failed", "rendezvous-failure", [3]),
    # [one 3] a stale job still holds the feature-cache flock: rank 1 blocks in flock after
    # joining, silent and outside any collective; ranks 0 and 2 time out in DDP's construction
    "locked-cache": ("hung", "hang", [1]),
    # [nodes 2x2, --resume ckpt/last.pt] the checkpoint is on node 0's disk only: ranks 2 and
    # 3 raise FileNotFoundError in torch.load; ranks 0 and 1 lose them
    "ckpt-node0": ("failed", "data-error", [2, 3]),
    # [cat 3] the paste: rank 2's label from an older 8-class version of the data: "IndexError:
    # Target 7 is out of bounds." in its sixth batch; the others lose it; only the rank files'
    # concatenation is kept (rank 2's file says "rank 2, world size 3" at its start)
    "pasted": ("failed", "python-exception", [2]),
    # [solo] one process, two epochs, exits 0
    "solo-mlp": ("ok", None, []),
    # [solo, --tracker tensorboard] torch.utils.tensorboard without the tensorboard package:
    # ImportError at start
    "no-board": ("failed", "missing-module", []),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("twentythird-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_twentythird_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_twentythird_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "EXP_FAULT" not in f.read_text(errors="replace"), f


def _launcher(mode: str, node: str = "") -> str:
    return (RUNS.folder(mode) / node / "console.log").read_text(errors="replace")


@pytest.mark.parametrize("mode", ["nodes-clean", "null-feat", "ckpt-node0"])
def test_two_launchers_write_one_folder_per_node(mode: str) -> None:
    """Each node's folder holds its launcher's console and its own two rank files."""
    for node, ranks in (("node0", "01"), ("node1", "23")):
        names = sorted(f.name for f in (RUNS.folder(mode) / node).iterdir())
        assert names == ["console.log", f"rank{ranks[0]}.log", f"rank{ranks[1]}.log"], names
        assert f"[launcher] started rank {ranks[1]} (pid" in _launcher(mode, node)


def test_the_killed_rank_says_nothing_and_only_the_launcher_says_minus_nine() -> None:
    assert "[launcher] rank 2 exited with code -9" in _launcher("hoard-r2")
    rank2 = (RUNS.folder("hoard-r2") / "logs" / "rank2.log").read_text(errors="replace")
    assert "Traceback" not in rank2


def test_the_paste_is_one_file_whose_log_lines_name_no_rank() -> None:
    """The file names are lost; the program's own lines carry no rank, only torch's traceback
    prefix (`[rank2]:`, printed once the group is up) and the start-up line do."""
    assert [f.name for f in RUNS.files("pasted")] == ["all.log"]
    text = (RUNS.folder("pasted") / "all.log").read_text(errors="replace")
    assert re.search(r"^\[rank2\]: IndexError: Target \d+ is out of bounds", text, re.M)
    logged = [line for line in text.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert len(logged) > 10
    assert not any("[rank" in line for line in logged)


def test_the_naive_launcher_kills_nobody() -> None:
    for mode in ("meta-tensor", "torn-index"):
        assert "[launcher] killing remaining ranks" not in _launcher(mode)
    assert "[launcher] killing remaining ranks" in _launcher("jump-class")
