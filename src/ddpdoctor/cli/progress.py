"""A progress bar on stderr while `diagnose` reads more than PROGRESS_MIN_BYTES, when stderr is a
terminal. The scan runs in worker processes that report nothing back, so progress is what this
process and its children have read (the kernel's per-process I/O counters) against the inputs'
total size: no change to the scanner, no cost to it."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

PROGRESS_MIN_BYTES = 1_000_000_000
"""Below 1 GB the scan takes about a second here: a bar would only flicker."""
POLL_S = 0.2


def input_bytes(paths: list[str]) -> int:
    """Total size of the files the paths name (folders walked, globs expanded, stdin: 0)."""
    from ddpdoctor.ingest.sources import expand_paths

    inputs, _ = expand_paths([p for p in paths if p != "-"])
    total = 0
    for item in inputs:
        try:
            total += os.path.getsize(item.path)
        except OSError:
            continue
    return total


def bytes_read(me: psutil.Process) -> int:
    """Bytes this process and its children have read so far (read_chars: page cache included)."""
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.io_counters().read_chars
        except (psutil.Error, AttributeError):
            continue
    return total


@contextmanager
def scan_progress(paths: list[str], min_bytes: int = PROGRESS_MIN_BYTES) -> Iterator[None]:
    """Show a bar while the block runs, if stderr is a terminal and the inputs are large."""
    if not sys.stderr.isatty():
        yield
        return
    total = input_bytes(paths)
    if total < min_bytes:
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    me = psutil.Process()
    base = bytes_read(me)
    done = threading.Event()
    progress = Progress(
        TextColumn("ddpdoctor: reading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )

    def poll(task: TaskID) -> None:
        while not done.wait(POLL_S):
            progress.update(task, completed=min(total, bytes_read(me) - base))

    with progress:
        task = progress.add_task("scan", total=total)
        watcher = threading.Thread(target=poll, args=(task,), daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
