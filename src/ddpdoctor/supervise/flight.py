"""Flight Recorder under `ddpdoctor run`: the environment that turns the recorder on in the
ranks, and the collection of every rank's dump into the run folder on a hang, before anything is
killed. The ranks' side (a thread that answers requests, a dump on an uncaught exception) lives
in the sitecustomize that inject.py writes. Never raises into the supervisor."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.supervise.child import ProcInfo

BUFFER_SIZE = "2000"
"""Entries each rank keeps (TORCH_FR_BUFFER_SIZE) unless the user chose: about 1 MB per rank."""
DUMP_PREFIX = "nccl_trace_rank_"
"""Name of the dumps NCCL writes itself on a watchdog timeout (TORCH_FR_DUMP_TEMP_FILE prefix +
rank), redirected into the run folder. Not exercised here: gloo never dumps by itself."""
ACK_TIMEOUT_S = 15.0
"""A rank's first dump with frames took 4.0-6.8 s here (torch imports about 820 modules for its
symbolizer on the first call); the JSON form it writes first is instant."""
POLL_S = 0.05


@dataclass
class FlightResult:
    """What one collection got: ranks that wrote a dump, ranks that answered without one
    (no process group yet), ranks that did not answer in time."""

    request: str
    dumped: list[int] = field(default_factory=list)
    no_dump: dict[int, str] = field(default_factory=dict)
    silent: list[int] = field(default_factory=list)
    collect_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "dumped": self.dumped,
            "no_dump": {str(k): v for k, v in self.no_dump.items()},
            "silent": self.silent,
            "collect_s": round(self.collect_s, 3),
        }


@dataclass
class FlightCollector:
    """Paths shared with the ranks: `dump_dir` in the run folder, request and answer folders
    in the supervisor's private temp folder."""

    dump_dir: Path
    requests: Path
    answers: Path
    count: int = 0

    @classmethod
    def prepare(cls, run_root: Path, inject_root: Path) -> FlightCollector:
        dump_dir = run_root / "flight-recorder"
        requests, answers = inject_root / "fr-requests", inject_root / "fr-answers"
        for path in (dump_dir, requests, answers):
            path.mkdir(parents=True, exist_ok=True)
        return cls(dump_dir.resolve(), requests.resolve(), answers.resolve())

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The child's environment with the recorder on (a user's own setting wins)."""
        out = dict(env)
        out.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER_SIZE)
        out.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(self.dump_dir / DUMP_PREFIX))
        out["DDPDOCTOR_FR_DIR"] = str(self.dump_dir)
        out["DDPDOCTOR_FR_REQUESTS"] = str(self.requests)
        out["DDPDOCTOR_FR_ANSWERS"] = str(self.answers)
        return out

    def collect(self, procs: list[ProcInfo], timeout_s: float = ACK_TIMEOUT_S) -> FlightResult:
        """Ask every live rank for its dump and wait until each answered or `timeout_s`."""
        self.count += 1
        name = f"req{self.count}"
        result = FlightResult(request=name)
        ranks = {p.pid: p.rank for p in procs if p.role == "rank" and p.rank is not None}
        t0 = time.monotonic()
        try:
            (self.requests / name).touch()
        except OSError:
            result.silent = sorted(r for r in ranks.values() if r is not None)
            return result
        waiting = dict(ranks)
        while waiting and time.monotonic() - t0 < timeout_s:
            for pid in list(waiting):
                answer = self.answers / f"{name}.{pid}"
                try:
                    text = answer.read_text(encoding="utf-8", errors="replace").strip()
                except OSError:
                    continue
                rank = waiting.pop(pid)
                if rank is None:
                    continue
                if text == "ok":
                    result.dumped.append(rank)
                else:
                    result.no_dump[rank] = text[:200]
            if waiting:
                time.sleep(POLL_S)
        result.silent = sorted(r for r in waiting.values() if r is not None)
        result.dumped.sort()
        result.collect_s = time.monotonic() - t0
        return result

    def tidy(self) -> None:
        """Leftover temp files of an interrupted write; the folder itself when empty."""
        with contextlib.suppress(OSError):
            for path in self.dump_dir.glob("*.tmp"):
                path.unlink()
            if not any(self.dump_dir.iterdir()):
                os.rmdir(self.dump_dir)
