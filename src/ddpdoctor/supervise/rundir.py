"""The run folder of one supervised job: console and per-rank logs, events.jsonl, stacks/, the
final report. Owns paths and the event journal; knows nothing about processes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ddpdoctor.redaction import clean_text, clean_value


def utc_now() -> datetime:
    return datetime.now(UTC)


def default_run_dir(base: Path | None = None) -> Path:
    stamp = utc_now().strftime("%Y%m%dT%H%M%S.%fZ")
    return (base or Path("ddpdoctor-runs")) / stamp


@dataclass
class RunDir:
    """Paths inside the run folder and a thread-safe writer of `events.jsonl`. What ddpdoctor
    writes here (events, stack dumps, reports) goes through `scrub`; the logs of the job never."""

    root: Path
    redact: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def console_log(self) -> Path:
        return self.root / "console.log"

    @property
    def ranks_dir(self) -> Path:
        return self.root / "ranks"

    @property
    def stacks_dir(self) -> Path:
        return self.root / "stacks"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def report_txt(self) -> Path:
        return self.root / "report.txt"

    def scrub(self, text: str) -> str:
        """Text fit to write here: control sequences stripped, secrets masked unless told not."""
        return clean_text(text, self.redact)

    def rank_log(self, label: str) -> Path:
        return self.ranks_dir / f"{label}.log"

    def create(self) -> None:
        for path in (self.root, self.ranks_dir, self.stacks_dir):
            path.mkdir(parents=True, exist_ok=True)

    def event(self, kind: str, **payload: Any) -> dict[str, Any]:
        """Append one event; returns it. Never raises: a failing disk must not stop the job."""
        record: dict[str, Any] = {
            "time": utc_now().isoformat(),
            "event": kind,
            **clean_value(payload, self.redact),
        }
        line = json.dumps(record, default=lambda obj: self.scrub(str(obj)))
        try:
            with self._lock, self.events.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            pass
        return record
