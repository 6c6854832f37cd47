"""Per-rank progress from output lines and heartbeat files, and the adaptive hang threshold.
Fed by the log writer (one call per batch of output, from what the ranks wrote, not from what
the terminal has shown); read by the watchdog.

Heartbeats: the supervisor sets `DDPDOCTOR_HEARTBEAT_DIR`; ranks append JSON lines to
`rank<N>.hb` there (see `ddpdoctor.probe.heartbeat.beat`); a file's mtime is its last beat.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections import deque
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.supervise.linescan import PROGRESS

JOB = "*"
"""The stream of lines without a rank prefix (and the job as a whole)."""
MIN_HANG_S = 60.0
ADAPTIVE_FACTOR = 5.0
FRESH_S = 0.2
"""A stream that printed progress this recently is not searched for more: the time of its last
progress is then off by at most this much, far below any hang threshold."""


@dataclass
class Stream:
    last_activity: float
    last_progress: float | None = None
    progress_events: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    size: int = 0
    """Bytes of output (counting lines would cost more than the rest of the capture)."""


class ProgressTracker:
    """Thread-safe: `record()` from the log writer thread, `stalled()` from the watchdog."""

    def __init__(
        self,
        hang_after_s: float | None,
        heartbeat_dir: Path | None = None,
        startup_grace_s: float = 60.0,
    ) -> None:
        self.fixed_hang_after_s = hang_after_s
        self.startup_grace_s = startup_grace_s
        self.heartbeat_dir = heartbeat_dir
        self.started = time.monotonic()
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._held = False
        self._resumed = float("-inf")
        self._hb_mtimes: dict[str, float] = {}

    def note(self, label: str, data: bytes) -> None:
        """Record output `data` of stream `label` (a rank label or JOB)."""
        progress = {label} if PROGRESS.search(data) is not None else set()
        self.record({label: len(data)}, progress)

    def record(self, size: Mapping[str, int], progress: Set[str], now: float | None = None) -> None:
        """One batch of output: bytes per stream label, and the labels that printed progress."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for label, count in size.items():
                for key in {label, JOB}:
                    s = self._streams.get(key)
                    if s is None:
                        s = self._streams[key] = Stream(last_activity=now)
                    s.last_activity = now
                    s.size += count
                    if label in progress:
                        self._progress(s, now)

    def fresh(self, label: str, now: float | None = None) -> bool:
        """Whether `label` printed progress less than FRESH_S ago (see FRESH_S)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            s = self._streams.get(label)
            return s is not None and s.last_progress is not None and now - s.last_progress < FRESH_S

    @staticmethod
    def _progress(s: Stream, now: float) -> None:
        # Coalesce bursts: lines of one read are one event, else the median interval is ~0.
        if s.last_progress is None or now - s.last_progress > 0.05:
            s.progress_events.append(now)
        s.last_progress = now

    def poll_heartbeats(self) -> None:
        """Fold heartbeat-file mtimes into progress (called by the watchdog every tick)."""
        if self.heartbeat_dir is None:
            return
        try:
            entries = list(self.heartbeat_dir.glob("rank*.hb"))
        except OSError:
            return
        now_wall, now = time.time(), time.monotonic()
        for path in entries:
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            label = path.stem
            if self._hb_mtimes.get(label) == mtime:
                continue
            self._hb_mtimes[label] = mtime
            when = now - max(0.0, now_wall - mtime)
            with self._lock:
                for key in {label, JOB}:
                    s = self._streams.setdefault(key, Stream(last_activity=when))
                    s.last_activity = max(s.last_activity, when)
                    if s.last_progress is None or when > s.last_progress:
                        self._progress(s, when)

    def hold(self, held: bool, now: float | None = None) -> None:
        """The capture stopped reading the job (its terminal or the disk is behind) or started
        again. A job that waits on its writes is not hung on its own: nothing is stalled while
        held, and idle time counts again from the release (a paused `| less` must not make
        `--on-hang kill` end the job)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not held and self._held:
                self._resumed = now
            self._held = held

    def hang_after_s(self) -> float:
        """The fixed threshold, else max(60 s, 5x the median interval between progress events)."""
        if self.fixed_hang_after_s is not None:
            return self.fixed_hang_after_s
        with self._lock:
            job = self._streams.get(JOB)
            events = list(job.progress_events) if job else []
        if len(events) < 3:
            return MIN_HANG_S
        gaps = [b - a for a, b in itertools.pairwise(events)]
        return max(MIN_HANG_S, ADAPTIVE_FACTOR * statistics.median(gaps))

    def stalled(self, now: float | None = None) -> tuple[float, list[str]] | None:
        """`(idle_s, labels)` when the job or some ranks made no progress for the threshold.

        The job as a whole counts progress lines (or any line while none has been seen yet);
        a rank counts only once it printed progress 3 times (many jobs log from rank 0 only).
        """
        now = time.monotonic() if now is None else now
        limit = self.hang_after_s()
        with self._lock:
            if self._held:
                return None
            resumed = self._resumed
            job = self._streams.get(JOB)
            if job is None or job.last_progress is None:
                # Start-up (imports, rendezvous) is slow and silent: allow the grace period.
                ref = max(self.started if job is None else job.last_activity, resumed)
                idle = now - ref
                if idle > limit and now - self.started > max(limit, self.startup_grace_s):
                    return idle, sorted(k for k in self._streams if k != JOB)
                return None
            ref = max(job.last_progress, resumed)
            if now - ref > limit:
                return now - ref, sorted(k for k in self._streams if k != JOB)
            since = {
                k: now - max(s.last_progress, resumed)
                for k, s in self._streams.items()
                if k != JOB and len(s.progress_events) >= 3 and s.last_progress is not None
            }
            lagging = [k for k, idle in since.items() if idle > limit]
            if lagging:
                return max(since[k] for k in lagging), lagging
        return None

    def snapshot(self) -> dict[str, dict[str, float | int | None]]:
        now = time.monotonic()
        with self._lock:
            return {
                k: {
                    "bytes": s.size,
                    "idle_s": round(now - s.last_activity, 3),
                    "since_progress_s": None
                    if s.last_progress is None
                    else round(now - s.last_progress, 3),
                }
                for k, s in self._streams.items()
            }
