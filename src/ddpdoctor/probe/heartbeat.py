"""Heartbeats from a rank to `ddpdoctor run`: one JSON line per beat in
`$DDPDOCTOR_HEARTBEAT_DIR/rank<RANK>.hb` (`{"time": <unix s>, "step": <int|null>, "pid": <int>}`).
A no-op when the variable is absent; stdlib only; never raises into the user's program.
"""

from __future__ import annotations

import json
import os
import time

from ddpdoctor.probe.ranks import this_rank

ENV_DIR = "DDPDOCTOR_HEARTBEAT_DIR"
MIN_INTERVAL_S = 0.5
"""Beats closer than this are coalesced: a tight loop must not turn into a disk write per step."""

_last_write = 0.0


def beat(step: int | None = None) -> None:
    """Record that this rank made progress (optionally at `step`); cheap enough for every step."""
    global _last_write
    try:
        directory = os.environ.get(ENV_DIR)
        if not directory:
            return
        now = time.time()
        if now - _last_write < MIN_INTERVAL_S:
            return
        _last_write = now
        rank = this_rank()
        line = json.dumps({"time": now, "step": step, "pid": os.getpid()})
        with open(os.path.join(directory, f"rank{rank}.hb"), "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except Exception:
        return
