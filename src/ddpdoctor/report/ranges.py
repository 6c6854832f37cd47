"""Rank lists as people write them: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (10,000 ranks stay short)."""

from __future__ import annotations


def rank_ranges(values: list[int]) -> str:
    if not values:
        return ""
    out: list[str] = []
    start = prev = values[0]
    for v in values[1:]:
        if v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = v
    out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
