"""Units of `ddpdoctor run`: heartbeat probe, progress thresholds, stack parsing and grouping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.probe import heartbeat
from ddpdoctor.supervise.child import ProcInfo
from ddpdoctor.supervise.progress import JOB, ProgressTracker, Stream
from ddpdoctor.supervise.stacks import RankStack, diagnose_stacks, parse_faulthandler, parse_pyspy

PYSPY = """Process 11: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 11 (idle): "MainThread"
    all_reduce (/x/site-packages/torch/distributed/distributed_c10d.py:2800)
    main (/job/train.py:88)
    <module> (/job/train.py:130)
"""
PYSPY_B = PYSPY.replace("all_reduce", "barrier").replace("train.py:88", "train.py:120")
FAULT = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/job/train.py", line 50 in helper

Current thread 0x00007f0000000002 (most recent call first):
  File "/x/site-packages/torch/utils/data/dataloader.py", line 1100 in _next_data
  File "/job/train.py", line 77 in main
  File "/job/train.py", line 130 in <module>
"""


def stack(rank: int, text: str, fmt: str = "py-spy") -> RankStack:
    parse = parse_pyspy if fmt == "py-spy" else parse_faulthandler
    return RankStack(ProcInfo(100 + rank, 1, "rank", rank), fmt, text, parse(text), cpu=0.0)


def test_heartbeat_is_a_noop_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heartbeat.ENV_DIR, raising=False)
    heartbeat.beat(3)


def test_heartbeat_writes_json_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(heartbeat.ENV_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setattr(heartbeat, "_last_write", 0.0)
    heartbeat.beat(7)
    record = json.loads((tmp_path / "rank2.hb").read_text())
    assert record["step"] == 7


def test_heartbeat_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(heartbeat.ENV_DIR, "/nonexistent/dir")
    monkeypatch.setattr(heartbeat, "_last_write", 0.0)
    heartbeat.beat()


def test_adaptive_threshold_follows_the_step_interval() -> None:
    p = ProgressTracker(None)
    assert p.hang_after_s() == 60.0
    with p._lock:
        s = p._streams.setdefault(JOB, Stream(0.0))
        s.progress_events.extend([0.0, 30.0, 60.0, 90.0])
        s.last_progress = 90.0
    assert p.hang_after_s() == 150.0
    assert p.stalled(now=200.0) is None
    assert p.stalled(now=241.0) is not None


def test_activity_alone_is_not_progress() -> None:
    p = ProgressTracker(5.0, startup_grace_s=0.0)
    p.note("rank0", b"step 1 loss 2.0\n")
    p.note("rank0", b"warning: something\n")
    stalled = p.stalled(now=p.started + 1000)
    assert stalled is not None and stalled[1] == ["rank0"]


def test_groups_name_the_odd_rank() -> None:
    diag = diagnose_stacks([stack(0, PYSPY), stack(1, PYSPY_B), stack(2, PYSPY)])
    assert diag.kind == "collective-mismatch"
    assert diag.culprits == [1]
    assert diag.summary.startswith("ranks 0,2 wait in all_reduce at train.py:88; rank 1 wait")


def test_rank_in_the_dataloader_is_missing_from_the_collective() -> None:
    diag = diagnose_stacks([stack(0, PYSPY), stack(1, FAULT, "faulthandler")])
    assert diag.kind == "missing-from-collective"
    assert diag.culprits == [1]
    assert "rank 1 is in the DataLoader (_next_data) at train.py:77" in diag.summary


def test_a_dead_rank_is_missing() -> None:
    diag = diagnose_stacks([stack(0, PYSPY)], missing=[1])
    assert diag.taxonomy_kind == "uncoordinated-exit" and diag.culprits == [1]


def test_a_job_waiting_on_its_writes_is_not_stalled() -> None:
    """While the capture does not read (terminal behind), the job waits in write: no hang;
    after the release its idle time counts from then, not from its last progress line."""
    p = ProgressTracker(5.0, startup_grace_s=0.0)
    p.note("rank0", b"step 1 loss 2.0\n")
    t0 = p.started
    p.hold(True, now=t0 + 1)
    assert p.stalled(now=t0 + 100) is None
    p.hold(False, now=t0 + 100)
    assert p.stalled(now=t0 + 104) is None
    stalled = p.stalled(now=t0 + 106)
    assert stalled is not None and 5.9 < stalled[0] < 6.1
