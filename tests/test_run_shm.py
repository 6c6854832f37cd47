"""The shared memory a killed job leaves in /dev/shm (supervise/shm.py), with real processes:
a file mapped by a process that was SIGKILLed is removed, one a live process still maps is
kept, and nothing the job did not map is touched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ddpdoctor.supervise.shm import mapped_by, remove_leftovers

SHM = Path("/dev/shm")
HOLDER = """
import mmap, os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 1 << 20)
buf = mmap.mmap(fd, 1 << 20)
buf[:5] = b"ready"
print("mapped", flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
    return proc


def _name(tag: str) -> Path:
    return SHM / f"ddpdoctor_test_{tag}_{uuid.uuid4().hex[:8]}"


def test_a_killed_process_s_mapping_is_removed_a_live_one_is_kept() -> None:
    gone, kept, other = _name("gone"), _name("kept"), _name("other")
    other.write_bytes(b"not the job's")
    killed, alive = _holder(gone), _holder(kept)
    try:
        found = mapped_by([killed.pid, alive.pid])
        assert {str(gone), str(kept)} <= found and str(other) not in found
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        removed = remove_leftovers(found)
        assert [p for p, _ in removed if p in (str(gone), str(kept))] == [str(gone)]
        assert dict(removed)[str(gone)] == 1 << 20
        assert not gone.exists() and kept.exists() and other.exists()
    finally:
        alive.kill()
        alive.wait(timeout=10)
        for path in (gone, kept, other):
            path.unlink(missing_ok=True)


def test_only_plain_files_of_dev_shm_are_ever_removed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "file"
    elsewhere.write_text("x")
    nested = "/dev/shm/../tmp/x"
    assert remove_leftovers([str(elsewhere), nested, "/dev/shm/"]) == []
    assert elsewhere.exists()


def test_a_process_that_is_gone_maps_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    time.sleep(0.05)
    assert mapped_by([proc.pid]) == set()
