"""LCH119: a background thread that lost the c10d store says only that the store's host (rank
0, or the first node's torchrun agent) went away. Never a failure of its own: not the root, not
a rank waiting in a collective, and the C++ backtrace TCPStore prints under the warning is no
crash. Lines: real captures of this project, and the format of public reports (NCCL's heartbeat
monitor exists only on GPUs), host names and paths replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
CAPTURES = ["third-early-stop-main", "twentyseventh-port-squat", "twentieth-worker-reaped"]

# the heartbeat monitor's warning, TCPStore's and the start of its backtrace as torch 2.6-2.8
# print them (github.com/MiniMax-AI/MiniMax-M1/issues/14, host names replaced; the paste, like
# this one, stops inside the frames)
HEARTBEAT = """\
[rank3]:[W624 12:52:07.296197118 ProcessGroupNCCL.cpp:1659] [PG ID 0 PG GUID 0 Rank 3] \
Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too \
early), with error: Broken pipe
[rank3]:[W624 12:52:08.296327263 TCPStore.cpp:106] [c10d] sendBytes failed on \
SocketImpl(fd=97, addr=[node-a]:50828, remote=[node-a]:45903): Broken pipe
Exception raised from sendBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:653 (most \
recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, \
std::char_traits<char>, std::allocator<char> >) + 0x98 (0x7f4d327785e8 in \
/opt/venv/lib/python3.12/site-packages/torch/lib/libc10.so)
frame #1: <unknown function> + 0x5ba8afe (0x7f4d1b3a8afe in \
/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so)
frame #2: <unknown function> + 0x5baa358 (0x7f4d1b3aa358 in \
/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so)
frame #3: <unknown function> + 0x5babb3e (0x7f4d1b3abb3e in \
/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so)
"""


@pytest.mark.parametrize("name", CAPTURES)
def test_tcpstore_warnings_of_real_runs_are_context(name: str) -> None:
    """Real gloo runs whose agents or ranks logged 'recvValue failed on SocketImpl' after the
    store's host exited: read as context, the verdict rests on something else."""
    report = diagnose_paths([str(REAL / name)])
    mine = [f for f in report.findings if f.rule == "LCH119"]
    assert mine, "the capture's TCPStore warning is read"
    assert all(f.role == "context" for f in mine)
    assert report.verdict.rule != "LCH119"


def test_only_the_heartbeat_monitors_warnings_is_no_failure(tmp_path: Path) -> None:
    log = tmp_path / "paste.log"
    log.write_text(HEARTBEAT)
    verdict = diagnose_paths([str(log)]).verdict
    assert verdict.status == "unknown"
    assert verdict.kind is None  # not nccl-network, not a native crash from the backtrace
    assert "Only warnings were read" in verdict.summary
    assert "lost the c10d store" in verdict.summary
