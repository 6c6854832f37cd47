"""Numbers and times read from untrusted text, made safe where they enter: a rank, pid, exit code
or timestamp outside what a real job can print becomes None here, so that no later step meets an
int beyond Python's int-string limit, an overflowing time difference or a million-rank range.
Pure functions; no I/O."""

from __future__ import annotations

import re
from datetime import UTC, datetime

MAX_RANK = 1 << 24
"""16,777,216 ranks: far above any job run so far; a larger "rank" is noise or an attack."""
MAX_PID = (1 << 31) - 1
MAX_EXIT_CODE = 1 << 32
"""Exit codes as launchers print them: 0-255, negative signal numbers, Windows' 32-bit codes."""
MAX_NUMBER_DIGITS = 12
"""A captured number with more digits than this is not kept: 10^12 ms is 31 years, more than any
timeout, and every sum or time difference over such numbers stays far inside datetime's range."""
MIN_YEAR = 1900
MAX_YEAR = 9000
"""Timestamps outside these years are not log times (and near datetime's limits every timeout
subtraction would overflow)."""

_INT = re.compile(rf"[+-]?\d{{1,{MAX_NUMBER_DIGITS}}}")
_NUMERIC = re.compile(r"[\d\s,+\-]*")
_LONG_DIGITS = re.compile(rf"\d{{{MAX_NUMBER_DIGITS + 1}}}")


def bounded_int(text: str | None, low: int, high: int) -> int | None:
    """`text` as an int when it is one of at most MAX_NUMBER_DIGITS digits within [low, high]."""
    if text is None:
        return None
    common = len(text) <= MAX_NUMBER_DIGITS and text.isascii() and text.isdigit()
    if not common and _INT.fullmatch(text) is None:  # signs, other scripts' digits: slower
        return None
    value = int(text)
    return value if low <= value <= high else None


def rank_number(text: str | None) -> int | None:
    return bounded_int(text, 0, MAX_RANK)


def pid_number(text: str | None) -> int | None:
    return bounded_int(text, 1, MAX_PID)


def exit_code_number(text: str | None) -> int | None:
    return bounded_int(text, -MAX_EXIT_CODE, MAX_EXIT_CODE)


def count_number(text: str | None, high: int = 10**MAX_NUMBER_DIGITS) -> int | None:
    """A non-negative count (world size, steps, totals)."""
    return bounded_int(text, 0, high)


def safe_capture(value: str) -> bool:
    """False for a capture made only of numbers (a rank, a timeout, a list of ranks) one of which
    has more digits than any real value: consumers would turn it into an int."""
    return not (_NUMERIC.fullmatch(value) and _LONG_DIGITS.search(value))


def plausible_time(value: datetime | None) -> datetime | None:
    """The time when its year is one a log can carry; timezone-aware UTC."""
    if value is None or not MIN_YEAR <= value.year <= MAX_YEAR:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def time_from_epoch(seconds: float) -> datetime | None:
    """A POSIX timestamp (file mtime, error-file stamp) as a UTC time, or None out of range."""
    try:
        return plausible_time(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError):
        return None
