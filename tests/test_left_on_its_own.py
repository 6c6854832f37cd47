"""A rank that leaves its training loop on its own and exits 0 while the others go on (a
return or sys.exit taken on one rank) is an uncoordinated exit, not a rank killed from
outside: torchrun's failure summary lists every worker that did not exit 0, so a rank with
lines of its own that it leaves out had exited 0 (INF202), even when its last line is a
training step and it said nothing on leaving (INF231 would read that as an OOM kill). Real
torchrun jobs on gloo, diagnosed as they printed. The leaving rank destroys its process group
first: without it, its exit sometimes aborts in gloo's teardown ('terminate called without an
active exception', SIGABRT, listed by torchrun and read as that rank's native crash), a
different run that is not tested here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

LEAVING = """
import datetime, os, sys
import torch, torch.distributed as dist
mode = os.environ["LEAVE_MODE"]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    for step in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"[rank{rank}] epoch {epoch} loss {loss.item():.4f}", flush=True)
    if mode == "quiet-return" and rank == 1 and epoch == 3:
        dist.destroy_process_group()
        sys.exit(0)  # leaves without a word
    if mode == "target-exit" and rank == 0 and epoch == 3:
        print("Target accuracy reached, exiting")
        dist.destroy_process_group()
        sys.exit(0)
print(f"[rank{rank}] done", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.real
@pytest.mark.parametrize(("mode", "leaver"), [("quiet-return", 1), ("target-exit", 0)])
def test_a_rank_that_exits_0_mid_run_left_on_its_own(
    tmp_path: Path, mode: str, leaver: int
) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(LEAVING)
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "LEAVE_MODE": mode},
    )
    assert proc.returncode != 0
    # the other rank lost it in its next gradient all-reduce; the summary lists that one only
    assert "Connection closed by peer" in proc.stdout or "Connection reset" in proc.stdout
    assert f"rank      : {1 - leaver} (local_rank: {1 - leaver})" in proc.stdout
    log = tmp_path / "console.log"
    log.write_text(proc.stdout)
    v = diagnose_paths([str(log)]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("failed", "uncoordinated-exit", [leaver])


FIXTURE = Path(__file__).parent / "fixtures" / "real" / "left-alone-exit-abort"


def test_a_rank_whose_exit_aborted_in_teardown_still_left_on_its_own() -> None:
    """Without destroy_process_group, the leaving rank's exit sometimes aborts in gloo's
    teardown: its words are its own stop ('Target accuracy reached, exiting'), that abort and
    torchrun's SIGABRT, while the other rank lost it mid-run: it left on its own, and its stop
    is the evidence (since a stop in the program's own words may end in 'exiting'), the abort
    only how it exited. A captured run of the program above (see the fixture's README)."""
    v = diagnose_paths([str(FIXTURE / "console.log")]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("failed", "uncoordinated-exit", [0])
    evidence = " ".join(e.text for e in v.evidence)
    assert "Target accuracy reached, exiting" in evidence


SPAWN_LEFT = Path(__file__).parent / "fixtures" / "real" / "spawn-left-alone"
SPAWN_KILLED = Path(__file__).parent / "fixtures" / "real" / "spawn-killed-rank"


def test_a_rank_mp_spawn_passed_over_had_exited_0() -> None:
    """mp.spawn raises for the first process that ended with an error: when it reports a rank
    that only lost its peer, the silent rank that went first was not killed (spawn would have
    reported that) but exited 0. Real runs of one program (see the fixtures' READMEs)."""
    left = diagnose_paths([str(SPAWN_LEFT / "console.log")]).verdict
    assert (left.status, left.kind, left.culprit.ranks) == ("failed", "uncoordinated-exit", [1])
    killed = diagnose_paths([str(SPAWN_KILLED / "console.log")]).verdict
    assert (killed.status, killed.kind, killed.culprit.ranks) == ("failed", "host-oom", [1])


AFTER_END = Path(__file__).parent / "fixtures" / "real" / "after-end-gather-exit-abort"


def test_a_finished_ranks_exit_abort_is_not_why_a_rank_waited_after_the_end() -> None:
    """Rank 0 gathered alone after 'Training completed'; rank 1 had returned, and its exit
    aborted ('terminate called without an active exception', SIGABRT, torchrun's root cause).
    The abort came after rank 1's work: the collective only rank 0 called is the cause, not a
    teardown crash of rank 1 (what CI's live hf-trainer-evaluate-main-only read once)."""
    text = (AFTER_END / "console.log").read_text()
    assert text.index("Training completed") < text.index("Connection closed by peer")
    assert "terminate called without an active exception" in text
    assert "exitcode  : -6 (pid: " in text and "rank      : 1 (local_rank: 1)" in text
    v = diagnose_paths([str(AFTER_END)]).verdict
    assert (v.status, v.kind, v.culprit.ranks) == ("failed", "collective-mismatch", [0])
