"""A stop on a loss that is no longer finite ('Loss is nan, stopping training', then
sys.exit(1): DeiT's, MAE's, DINO's and SwAV's check) is the program's answer to a diverged
run. Announced by every rank with nobody left waiting, it is a failure of training on every
rank (INF242), not an agreed early stop; announced by one rank while the others lost it, it
stays that rank's own exit. Real captures only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.decision import NON_FINITE
from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.program_runs import REAL


def test_every_rank_stopping_on_a_nan_loss_is_a_diverged_run() -> None:
    """Set 116 half-exp: both SwAV ranks print 'Loss is nan, stopping training' (no rank
    prefix) after float16 exp overflowed, and exit 1."""
    v = diagnose_paths([str(REAL / "hundredsixteenth-half-exp")]).verdict
    assert (v.status, v.kind, v.rule, v.culprit.ranks) == (
        "failed",
        "python-exception",
        "INF242",
        [0, 1],
    )


def test_one_rank_stopping_on_its_own_nan_is_not() -> None:
    """Set 52 nan-one: rank 1 alone stops on its NaN inputs; rank 0 loses it."""
    v = diagnose_paths([str(REAL / "fiftysecond-nan-one")]).verdict
    assert v.rule != "INF242"


def test_the_words_name_a_value_no_longer_finite() -> None:
    assert NON_FINITE.search("Loss is nan, stopping training")
    assert NON_FINITE.search("Non-finite loss at step 6, stopping")
    assert not NON_FINITE.search("val loss 0.31 did not improve for 3 epochs, stopping")
    assert not NON_FINITE.search("reached the target: infer mode next, stopping")


DIVERGING = """
import datetime, math, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e30)
for step in range(20):
    loss = model(torch.ones(8, 4) * 1e20).pow(2).mean()
    if not math.isfinite(loss.item()):
        print(f"Loss is {loss.item()}, stopping training", flush=True)
        sys.exit(1)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_real_torchrun_job_whose_ranks_both_stop_on_a_nan(tmp_path: Path) -> None:
    """Two gloo ranks under torchrun diverge at once and print their stops at the same moment:
    the console often glues them into one line ('Loss is inf, stopping trainingLoss is inf,
    stopping training'; each repeat is one rank's announcement). The console is read as it
    came, and with its two stop lines glued where they came apart."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(DIVERGING)
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert proc.stdout.count("stopping training") == 2
    lines = proc.stdout.splitlines(keepends=True)
    stops = [i for i, line in enumerate(lines) if "stopping training" in line]
    glued = list(lines)
    if len(stops) == 2:  # printed apart this time: glue them as concurrent writers do
        glued[stops[0]] = glued[stops[0]].rstrip("\n")
    for name, text in (("console.log", proc.stdout), ("glued.log", "".join(glued))):
        log = tmp_path / name
        log.write_text(text)
        v = diagnose_paths([str(log)]).verdict
        assert (v.kind, v.rule, v.culprit.ranks) == ("python-exception", "INF242", [0, 1]), name
