"""Real gloo runs of a thirty-sixth training-program style (tests/programs/
thirtysixth_style_train.py: logging.basicConfig with '[%(asctime)s] %(levelname)s:%(name)s:
%(message)s' and a logger per rank ("train.r1"), a background thread prefetching batches from
per-rank files into a queue, raw DDP on gloo with a 12 s timeout, rank 0 saving a checkpoint
each epoch, an early-stopping rule). Launched as `torchrun --standalone --nproc-per-node 3`, the
console redirected to a file. Neither the program nor the launch was used to build the rules:
the diagnosis must generalise. Captured by tests/fixtures/real/capture_thirtysixth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 2 of 5 right. full-disk was a Python exception: torch 2.13's file writer
reports a full device as 'RuntimeError: basic_ios::clear: iostream error' from torch.save;
read since as a suggestion of a full disk (rules/data.py DATA102). own-stop was a lost peer
with no cause (NET101): rank 2's 'early stopping at epoch 0' names its rank only in the
logger's name ('INFO:train.r2:'); read since (ingest/prefixes.py LOGGER_NAME_RANK).
four-of-three since session 28: the waits for rank 3's address, beyond the three processes
launched, read as a world larger than the launch (INF238)."""

from __future__ import annotations

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks); three ranks each
EXPECTED: dict[str, Expected] = {
    # three epochs; every rank logs "training finished"; all exit 0
    "calm": ("ok", None, []),
    # rank 0 saves its checkpoint to a device with no space left (/dev/full): ENOSPC
    "full-disk": ("failed", "disk-full", [0]),
    # a launch script hard-codes world_size=4 for three processes: the group never forms
    "four-of-three": ("failed", "rendezvous-failure", []),
    # rank 2 decides alone, on its own loss, to stop after epoch 0 and exits 0; ranks 0 and 1
    # wait for it in the epoch's barrier
    "own-stop": ("failed", "uncoordinated-exit", [2]),
    # rank 1's prefetch thread cannot load a missing batch file (FileNotFoundError in the
    # thread); its main thread waits on the queue for ever, and ranks 0 and 2 time out
    "thread-miss": ("failed", "data-error", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {}


RUNS = RunSet("thirtysixth-", EXPECTED, MISSES, label_nowhere=True)


@pytest.mark.parametrize("mode", RUNS.params())
def test_thirtysixth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_thirtysixth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    for f in RUNS.files(mode):
        assert "T36_CASE" not in f.read_text(errors="replace"), f
