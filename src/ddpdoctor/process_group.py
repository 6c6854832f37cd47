"""Ending a child we started in its own session: SIGTERM to the whole group, then SIGKILL.
Shared by the collective test (preflight) and the scenario runner."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM the child's process group, wait `grace_s`, then SIGKILL it and reap the child."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
