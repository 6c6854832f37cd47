"""Shared memory a job that `ddpdoctor run` killed leaves behind. A rank ended by SIGKILL never
unlinks the /dev/shm files it created (DeepSpeed's CPU all-reduce buffers, 69 MB per rank, were
found piling up to 22 GB on one machine): after its own kill, `run` removes the files the job's
processes had mapped that no process maps any more. Nothing else in /dev/shm is touched."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

SHM = "/dev/shm/"


def _mapped(pid: int, proc: Path) -> set[str]:
    """The /dev/shm files a process maps (its /proc/PID/maps), unlinked ones left out."""
    paths: set[str] = set()
    try:
        with open(proc / str(pid) / "maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                at = line.find(SHM)
                if at < 0 or line.rstrip().endswith("(deleted)"):
                    continue
                paths.add(line[at:].rstrip("\n"))
    except OSError:
        pass  # gone, or not ours to read
    return paths


def mapped_by(pids: Iterable[int], proc: Path = Path("/proc")) -> set[str]:
    """The /dev/shm files the given processes map now (taken before they are killed)."""
    found: set[str] = set()
    for pid in pids:
        found |= _mapped(pid, proc)
    return found


def still_mapped(proc: Path = Path("/proc")) -> set[str]:
    """Every /dev/shm file some live process maps (all of /proc, read once)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(proc):
            if entry.name.isdigit():
                found |= _mapped(int(entry.name), proc)
    return found


def remove_leftovers(paths: Iterable[str], proc: Path = Path("/proc")) -> list[tuple[str, int]]:
    """Remove the files among `paths` (the killed job's) that no live process maps; returns
    (path, bytes) of what was removed."""
    candidates = sorted(
        p
        for p in set(paths)
        if p.startswith(SHM) and "/" not in p[len(SHM) :] and p[len(SHM) :] not in ("", ".", "..")
    )
    if not candidates:
        return []
    in_use = still_mapped(proc)
    removed: list[tuple[str, int]] = []
    for path in candidates:
        if path in in_use:
            continue
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except OSError:
            continue  # gone already, or not ours to remove
        removed.append((path, size))
    return removed
