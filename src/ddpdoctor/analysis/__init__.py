"""Analysis: scan sources for rule hits, then decide root cause, cascade and verdict."""
