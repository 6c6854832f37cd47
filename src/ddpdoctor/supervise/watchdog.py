"""Hang detection: a thread that watches progress, and on a stall collects every rank's stack
and Flight Recorder dump, groups the stacks, records and reports the diagnosis, and (with
on_hang="kill") ends the job.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.supervise.child import Child
from ddpdoctor.supervise.flight import FlightCollector
from ddpdoctor.supervise.progress import ProgressTracker
from ddpdoctor.supervise.rundir import RunDir, utc_now
from ddpdoctor.supervise.shm import mapped_by, remove_leftovers, still_mapped
from ddpdoctor.supervise.stacks import (
    HangDiagnosis,
    collect,
    diagnose_stacks,
    render_hang,
    write_dumps,
)

SHM_REAP_WAIT_S = 15.0
"""How long after our kill the job's processes may take to go before their /dev/shm files are
looked at (5 s was too short on a loaded 2-core machine: the files were still mapped)."""


@dataclass
class Hang:
    detected_at: str
    idle_s: float
    stalled: list[str]
    diagnosis: HangDiagnosis
    text: str
    collect_s: float


@dataclass
class Watchdog:
    child: Child
    progress: ProgressTracker
    rundir: RunDir
    on_hang: str = "report"
    stack_method: str = "auto"
    armed_dir: Path | None = None
    grace_s: float = 5.0
    notify: Callable[[str], None] = lambda _text: None
    hangs: list[Hang] = field(default_factory=list)
    flight: FlightCollector | None = None
    """Asks the ranks for their Flight Recorder dumps on a hang (None: recorder off)."""
    killed_for_hang: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ddpdoctor-watchdog")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _tick_s(self) -> float:
        return max(0.2, min(1.0, self.progress.hang_after_s() / 20))

    def _loop(self) -> None:
        in_episode = False
        while not self._stop.wait(self._tick_s()):
            if self.child.proc.poll() is not None:
                return
            self.progress.poll_heartbeats()
            stalled = self.progress.stalled()
            if stalled is None:
                if in_episode:
                    self.rundir.event("progress_resumed")
                in_episode = False
                continue
            if in_episode:
                continue
            in_episode = True
            self.handle(*stalled)
            if self.on_hang == "kill":
                self.rundir.event("kill", reason="hang", grace_s=self.grace_s)
                self.notify(f"ddpdoctor: ending the job (--on-hang kill, grace {self.grace_s} s)")
                self.killed_for_hang = True
                shm = mapped_by(p.pid for p in self.child.refresh())
                self.child.terminate(self.grace_s)
                self._remove_shared_memory(shm)
                return

    def _remove_shared_memory(self, paths: set[str]) -> None:
        """After our own kill: the /dev/shm files the job had mapped and nobody maps now (a
        killed rank never unlinks its own), once its processes are gone."""
        if not paths:
            return
        # a loaded machine takes seconds to reap killed ranks (a file still mapped is kept):
        # the launcher may be gone while its ranks, killed too, still map their files
        deadline = time.monotonic() + SHM_REAP_WAIT_S
        while self.child.remaining() and time.monotonic() < deadline:
            time.sleep(0.1)
        while paths & still_mapped() and time.monotonic() < deadline:
            time.sleep(0.2)
        removed = remove_leftovers(paths)
        if removed:
            total = sum(size for _, size in removed)
            self.rundir.event("shm_removed", files=[path for path, _ in removed], bytes=total)
            self.notify(
                f"ddpdoctor: removed {len(removed)} shared-memory file(s) ({total / 2**20:.0f} "
                "MB) the killed job left in /dev/shm"
            )

    def handle(self, idle_s: float, stalled: list[str]) -> Hang:
        """Dump, group and report the stacks of every rank once per stall episode."""
        when = utc_now().isoformat()
        limit = self.progress.hang_after_s()
        self.rundir.event(
            "hang_detected", idle_s=round(idle_s, 3), hang_after_s=limit, stalled=stalled
        )
        t0 = time.monotonic()
        procs = [p for p in self.child.refresh() if p.role in ("rank", "main", "worker", "agent")]
        ranks_alive = {p.rank for p in procs if p.role == "rank"}
        gone = sorted(r for r in self.child.per_rank_exit() if r not in ranks_alive)
        stacks = collect(procs, self.rundir.stacks_dir, self.stack_method, self.armed_dir)
        collect_s = time.monotonic() - t0
        if self.flight is not None:  # before anything is killed: the ranks are still there
            result = self.flight.collect(procs)
            self.rundir.event("flight_recorder", **result.as_dict())
        n = len(self.hangs) + 1
        write_dumps(stacks, self.rundir.stacks_dir, n, when, self.rundir.redact)
        diag = diagnose_stacks(stacks, missing=gone)
        text = self.rundir.scrub(render_hang(diag, idle_s))
        with contextlib.suppress(OSError):
            (self.rundir.stacks_dir / f"hang-{n}.txt").write_text(text + "\n", encoding="utf-8")
        self.rundir.event(
            "stacks",
            dump=n,
            collect_s=round(collect_s, 3),
            diagnosis=diag.as_dict(),
            processes=[
                {
                    "pid": s.proc.pid,
                    "role": s.proc.role,
                    "rank": s.proc.rank,
                    "method": s.method,
                    "cpu": s.cpu,
                    "error": s.error,
                }
                for s in stacks
            ],
        )
        hang = Hang(when, idle_s, stalled, diag, text, collect_s)
        self.hangs.append(hang)
        self.notify(text)
        return hang
