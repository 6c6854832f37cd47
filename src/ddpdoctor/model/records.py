"""Records: one log line (or a stitched traceback) with everything ingestion could learn about
where it came from. Sources: what was read and how well. No parsing here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ddpdoctor.model.transfer import by_fields


@by_fields
@dataclass(slots=True)
class Origin:
    """Who printed a line: every field optional, filled by prefixes, file names or content."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None

    def merged_with(self, fallback: Origin) -> Origin:
        """Fields of self win; gaps are filled from fallback (e.g. the file name's rank)."""
        return Origin(
            rank=self.rank if self.rank is not None else fallback.rank,
            local_rank=self.local_rank if self.local_rank is not None else fallback.local_rank,
            host=self.host if self.host is not None else fallback.host,
            pid=self.pid if self.pid is not None else fallback.pid,
        )


@by_fields
@dataclass(slots=True)
class Record:
    """A line as the analysis sees it: text without prefixes, plus its origin and position."""

    source: str
    line: int
    text: str
    origin: Origin = field(default_factory=Origin)
    time: datetime | None = None
    level: str | None = None
    stream_key: str = ""
    """Lines with the same stream_key came from one writer (one rank's prefix in one file)."""

    @property
    def rank(self) -> int | None:
        return self.origin.rank

    @property
    def host(self) -> str | None:
        return self.origin.host


@by_fields
@dataclass(slots=True)
class SourceInfo:
    """One input as the user gave it, and whether it could be read."""

    path: str
    bytes: int = 0
    lines: int = 0
    status: str = "read"  # read | partial | skipped
    reason: str | None = None
