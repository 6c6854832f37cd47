"""Times and durations as the reports print them: `+3.03 s`, `12 min`, `11:26:08.542`."""

from __future__ import annotations

from datetime import datetime


def duration(s: float) -> str:
    """A duration short enough for an axis tick."""
    if s <= 0:
        return "0 s"
    if s < 0.1:
        return f"{s * 1000:.1f} ms"
    if s < 10:
        return f"{s:.2f} s"
    if s < 600:
        return f"{s:.0f} s"
    if s < 36_000:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def clock(when: datetime) -> str:
    """Date and time to the millisecond."""
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
