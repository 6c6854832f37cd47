"""Output capture: reader threads drain the child's stdout/stderr pipes, forward raw bytes to our
own stdout/stderr and to the run folder (console.log, per-rank logs split on `[rankN]:` prefixes),
and feed progress. Readers never block on a slow terminal or disk: bounded queues, drops counted.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ddpdoctor.supervise.progress import JOB, ProgressTracker
from ddpdoctor.supervise.rundir import RunDir

READ_SIZE = 1 << 16
QUEUE_CHUNKS = 1024
MAX_PARTIAL = 1 << 20
# torchrun `--tee`: `[{role}{local_rank}]:` (`[default0]:`), or a template like `[rank3]:`.
RANK_PREFIX = re.compile(rb"^\[([A-Za-z_][A-Za-z_-]*?)(\d+)\]:[^\n]*\n", re.M)


@dataclass
class Drops:
    terminal_chunks: int = 0
    terminal_bytes: int = 0
    disk_chunks: int = 0
    disk_bytes: int = 0
    write_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


_EOF = b""


@dataclass
class Capture:
    """Owns the reader, terminal-writer and disk-writer threads of one job."""

    rundir: RunDir
    progress: ProgressTracker
    echo: bool = True
    drops: Drops = field(default_factory=Drops)
    _threads: list[threading.Thread] = field(default_factory=list)
    _disk: queue.Queue[tuple[int, bytes]] = field(default_factory=lambda: queue.Queue(QUEUE_CHUNKS))
    _term: dict[int, queue.Queue[bytes]] = field(default_factory=dict)
    _open_readers: int = 0

    def start(self, pipes: dict[int, int]) -> None:
        """`pipes` maps our output fd (1 or 2) to the read end of the child's pipe."""
        self._open_readers = len(pipes)
        for out_fd, read_fd in pipes.items():
            if self.echo:
                q: queue.Queue[bytes] = queue.Queue(QUEUE_CHUNKS)
                self._term[out_fd] = q
                self._spawn(self._terminal_writer, out_fd, q, name=f"ddpdoctor-term{out_fd}")
            self._spawn(self._reader, out_fd, read_fd, name=f"ddpdoctor-read{out_fd}")
        self._spawn(self._disk_writer, name="ddpdoctor-disk")

    def _spawn(self, target: object, *args: object, name: str) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        t.start()
        self._threads.append(t)

    def _reader(self, out_fd: int, read_fd: int) -> None:
        term = self._term.get(out_fd)
        while True:
            try:
                data = os.read(read_fd, READ_SIZE)
            except InterruptedError:
                continue
            except OSError:
                data = _EOF
            if term is not None:
                self._put(term, data)
            self._put_disk(out_fd, data)
            if not data:
                break
        with contextlib.suppress(OSError):
            os.close(read_fd)

    def _put(self, q: queue.Queue[bytes], data: bytes) -> None:
        try:
            q.put_nowait(data)
        except queue.Full:
            if not data:  # EOF marker must arrive: wait briefly for room.
                with contextlib.suppress(queue.Full):
                    q.put(data, timeout=1.0)
                return
            self.drops.terminal_chunks += 1
            self.drops.terminal_bytes += len(data)

    def _put_disk(self, out_fd: int, data: bytes) -> None:
        try:
            self._disk.put_nowait((out_fd, data))
        except queue.Full:
            if not data:
                with contextlib.suppress(queue.Full):
                    self._disk.put((out_fd, data), timeout=1.0)
                return
            self.drops.disk_chunks += 1
            self.drops.disk_bytes += len(data)

    def _terminal_writer(self, out_fd: int, q: queue.Queue[bytes]) -> None:
        while True:
            data = q.get()
            if not data:
                return
            view = memoryview(data)
            while view:
                try:
                    n = os.write(out_fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    self.drops.write_errors += 1
                    break
                view = view[n:]

    def _disk_writer(self) -> None:
        files: dict[str, BinaryIO] = {}
        partial: dict[int, bytes] = {}
        console: BinaryIO | None = None
        try:
            console = self.rundir.console_log.open("ab")
        except OSError:
            self.drops.write_errors += 1
        open_streams = self._open_readers
        while open_streams:
            out_fd, data = self._disk.get()
            if not data:
                open_streams -= 1
                rest = partial.pop(out_fd, b"")
                if rest:
                    self._route(rest + b"\n", files)
                continue
            if console is not None:
                try:
                    console.write(data)
                    if self._disk.empty():
                        console.flush()
                except OSError:
                    self.drops.write_errors += 1
            head = partial.pop(out_fd, b"")
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(head) + len(data) < MAX_PARTIAL:
                    partial[out_fd] = head + data
                self.progress.note(JOB, data, 0)  # a `\r` progress bar redraw counts
                continue
            if len(data) > cut:
                partial[out_fd] = data[cut:]
            self._route(head + data[:cut] if head else data[:cut], files)
            if self._disk.empty():
                for fh in files.values():
                    try:
                        fh.flush()
                    except OSError:
                        self.drops.write_errors += 1
        for fh in [*files.values(), *([console] if console else [])]:
            try:
                fh.close()
            except OSError:
                self.drops.write_errors += 1

    def _route(self, block: bytes, files: dict[str, BinaryIO]) -> None:
        """Split complete lines by rank prefix; feed progress once per rank per block."""
        lines = block.count(b"\n")
        if b"]:" not in block:
            self.progress.note(JOB, block, lines)
            return
        per_rank: dict[str, list[bytes]] = {}
        for m in RANK_PREFIX.finditer(block):
            label = (m.group(1) + m.group(2)).decode("ascii", "replace")
            per_rank.setdefault(label, []).append(m.group(0))
        if not per_rank:
            self.progress.note(JOB, block, lines)
            return
        for label, chunks in per_rank.items():
            text = b"".join(chunks)
            self.progress.note(label, text, len(chunks))
            fh = files.get(label)
            if fh is None:
                try:
                    fh = files[label] = self.rundir.rank_log(label).open("ab")
                except OSError:
                    self.drops.write_errors += 1
                    continue
            try:
                fh.write(text)
            except OSError:
                self.drops.write_errors += 1
        unlabeled = lines - sum(len(c) for c in per_rank.values())
        if unlabeled > 0:
            self.progress.note(JOB, b"", unlabeled)

    def join(self, timeout_s: float) -> bool:
        """Wait for every thread to drain; False if some still run (a stray holds the pipe)."""
        import time

        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


def label_paths(rundir: RunDir) -> list[Path]:
    return sorted(rundir.ranks_dir.glob("*.log"))
