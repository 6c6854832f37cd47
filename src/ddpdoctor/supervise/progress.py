"""Per-rank progress from output lines and heartbeat files, and the adaptive hang threshold.
Fed by the capture thread (cheap calls, one per chunk and rank); read by the watchdog.

Heartbeats: the supervisor sets `DDPDOCTOR_HEARTBEAT_DIR`; ranks append JSON lines to
`rank<N>.hb` there (see `ddpdoctor.probe.heartbeat.beat`); a file's mtime is its last beat.
"""

from __future__ import annotations

import itertools
import re
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

# A progress line: training-loop words or a tqdm bar (`45%|####  | 45/100 [00:01<00:02, 30it/s]`).
PROGRESS = re.compile(
    rb"(?i)\b(?:steps?|iter(?:ation)?s?|epochs?|loss|batch)\b|\d%\||it/s\]|s/it\]"
)
JOB = "*"
"""The stream of lines without a rank prefix (and the job as a whole)."""
MIN_HANG_S = 60.0
ADAPTIVE_FACTOR = 5.0


@dataclass
class Stream:
    last_activity: float
    last_progress: float | None = None
    progress_events: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    lines: int = 0


class ProgressTracker:
    """Thread-safe: `note()` from the capture thread, `stalled()` from the watchdog."""

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
        self._hb_mtimes: dict[str, float] = {}

    def note(self, label: str, data: bytes, lines: int) -> None:
        """Record `lines` output lines of stream `label` (a rank label or JOB)."""
        now = time.monotonic()
        progress = PROGRESS.search(data) is not None
        with self._lock:
            for key in {label, JOB}:
                s = self._streams.get(key)
                if s is None:
                    s = self._streams[key] = Stream(last_activity=now)
                s.last_activity = now
                s.lines += lines
                if progress:
                    self._progress(s, now)

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
            job = self._streams.get(JOB)
            if job is None or job.last_progress is None:
                # Start-up (imports, rendezvous) is slow and silent: allow the grace period.
                ref = self.started if job is None else job.last_activity
                idle = now - ref
                if idle > limit and now - self.started > max(limit, self.startup_grace_s):
                    return idle, sorted(k for k in self._streams if k != JOB)
                return None
            ref = job.last_progress
            if now - ref > limit:
                return now - ref, sorted(k for k in self._streams if k != JOB)
            lagging = [
                k
                for k, s in self._streams.items()
                if k != JOB
                and len(s.progress_events) >= 3
                and s.last_progress is not None
                and now - s.last_progress > limit
            ]
            if lagging:
                return max(now - (self._streams[k].last_progress or now) for k in lagging), lagging
        return None

    def snapshot(self) -> dict[str, dict[str, float | int | None]]:
        now = time.monotonic()
        with self._lock:
            return {
                k: {
                    "lines": s.lines,
                    "idle_s": round(now - s.last_activity, 3),
                    "since_progress_s": None
                    if s.last_progress is None
                    else round(now - s.last_progress, 3),
                }
                for k, s in self._streams.items()
            }
