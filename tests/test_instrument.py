"""ddpdoctor.instrument: unit tests of each helper in one process, then real torchrun/gloo runs
of raw DDP training that uses them, diagnosed from what they printed."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
PROGRAM = Path(__file__).parent / "programs" / "instrument_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_importing_instrument_imports_no_torch() -> None:
    code = "import sys, ddpdoctor.instrument; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@needs_torch
def test_unused_parameters_are_named_without_the_ddp_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from ddpdoctor import instrument

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 1)
            self.frozen = torch.nn.Linear(4, 1).requires_grad_(False)

    net = Net()
    net.body(torch.randn(2, 4)).sum().backward()

    class Wrapper(torch.nn.Module):  # stands in for DistributedDataParallel's .module
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

    assert instrument.unused_parameters(net) == ["head.weight", "head.bias"]
    assert instrument.unused_parameters(Wrapper(net)) == ["head.weight", "head.bias"]
    monkeypatch.setenv("RANK", "3")
    out = io.StringIO()
    assert instrument.report_unused_parameters(net, step=7, file=out) == [
        "head.weight",
        "head.bias",
    ]
    instrument.report_unused_parameters(net, step=8, file=out)  # the same set: printed once
    assert out.getvalue() == (
        "ddpdoctor: parameters without gradient on rank 3 (step 7): head.weight, head.bias\n"
    )


def test_report_unused_parameters_never_raises() -> None:
    from ddpdoctor import instrument

    assert instrument.report_unused_parameters(object()) == []


@needs_torch
def test_stopping_without_a_process_group_is_the_local_wish() -> None:
    from ddpdoctor import instrument

    assert instrument.agree_to_stop(True) is True
    assert instrument.agree_to_stop(False) is False
    instrument.finish()  # a no-op


@needs_torch
def test_checkpoint_goes_to_the_ranks_own_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from ddpdoctor import instrument

    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2)}, path)
    assert instrument.load_checkpoint(path)["w"].device.type == "cpu"
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert instrument.rank_device() == "cuda:3"  # not cuda:0, where torch.load would put it


@needs_torch
def test_checkpoint_failures_name_rank_host_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from ddpdoctor import instrument

    monkeypatch.setenv("RANK", "5")
    with pytest.raises(instrument.CheckpointError, match=r"rank 5 on .* cannot find checkpoint"):
        instrument.load_checkpoint(tmp_path / "missing.pt")

    path = tmp_path / "objects.pt"
    torch.save({"cfg": PickledConfig()}, path)
    with pytest.raises(instrument.CheckpointError, match="weights_only=False"):
        instrument.load_checkpoint(path)


def test_heartbeat_file_is_named_by_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor import instrument
    from ddpdoctor.probe import heartbeat

    monkeypatch.setenv("DDPDOCTOR_HEARTBEAT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setattr(heartbeat, "_last_write", 0.0)
    instrument.heartbeat(11)
    beat = json.loads((tmp_path / "rank2.hb").read_text())
    assert beat["step"] == 11


class PickledConfig:
    """An object saved into a checkpoint by pickle: a weights-only load refuses it."""


def _assert_clean_end(code: int, log: Path) -> None:
    """Exit 0 and no failure found; or, when torch 2.13's gloo teardown aborted a rank at exit
    after the work was done (about 1 run in 10 under load), a diagnosis that says exactly that."""
    text = log.read_text()
    verdict = diagnose_paths([str(log)]).verdict
    if code == 0:
        assert verdict.status == "ok", text
    else:
        assert "terminate called without an active exception" in text, text
        assert (verdict.kind, verdict.category) == ("exit-teardown-crash", "intended-exit")


def _torchrun(mode: str, workdir: Path) -> tuple[int, Path]:
    log = workdir / f"{mode}.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(PROGRAM), mode],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            timeout=120,
            check=False,
        )
    return proc.returncode, log


@pytest.mark.real
@needs_torch
@pytest.mark.timeout(180)
def test_agreed_stop_ends_every_rank_at_the_same_step(tmp_path: Path) -> None:
    """Rank 1 alone wants to stop (the uncoordinated-exit scenario without the helper): with
    agree_to_stop both ranks stop at step 3 and the job exits 0."""
    code, log = _torchrun("stop", tmp_path)
    text = log.read_text()
    assert "rank 0 stops at step 3" in text and "rank 1 stops at step 3" in text
    assert "early stopping agreed by all 2 ranks at step 3 (asked by ranks 1)" in text
    _assert_clean_end(code, log)
    if code == 0:
        verdict = diagnose_paths([str(log)]).verdict
        assert (verdict.status, verdict.kind, verdict.rule) == ("ok", None, "INF207")


@pytest.mark.real
@needs_torch
@pytest.mark.timeout(180)
def test_unused_parameters_named_and_made_the_root(tmp_path: Path) -> None:
    """Rank 1 skips the auxiliary head: gloo fails on DDP's differing buckets (a collective
    mismatch); the helper's line turns that into the real cause, with the names."""
    code, log = _torchrun("unused", tmp_path)
    assert code != 0
    verdict = diagnose_paths([str(log)]).verdict
    assert (verdict.kind, verdict.rule, verdict.culprit.ranks) == (
        "ddp-unused-parameters",
        "DDP107",
        [1],
    )
    assert "aux_head.weight" in verdict.summary


@pytest.mark.real
@needs_torch
@pytest.mark.timeout(180)
def test_unused_parameters_with_find_unused_is_not_a_failure(tmp_path: Path) -> None:
    """With find_unused_parameters=True DDP reduces the skipped head too (its gradient is the
    average of the ranks that used it): nothing breaks and nothing is reported."""
    code, log = _torchrun("unused-ok", tmp_path)
    assert "parameters without gradient" not in log.read_text()
    _assert_clean_end(code, log)


@pytest.mark.real
@needs_torch
@pytest.mark.timeout(180)
def test_resume_loads_on_every_rank_and_a_missing_checkpoint_names_its_rank(
    tmp_path: Path,
) -> None:
    code, log = _torchrun("resume", tmp_path)
    assert "rank 1 resumed at step 5 on cpu" in log.read_text()
    _assert_clean_end(code, log)
    code, log = _torchrun("resume-missing", tmp_path)
    assert code != 0
    assert "CheckpointError: rank 1 on " in log.read_text()
    verdict = diagnose_paths([str(log)]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("data-error", [1])
