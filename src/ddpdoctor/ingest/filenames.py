"""What a file's path says about its writer: `rank3.log`, `node1/`, `worker-2.txt`, and
torchrun's `--log-dir` layout `<run_id>/attempt_<k>/<local_rank>/stdout.log`."""

from __future__ import annotations

import re
from pathlib import PurePath

from ddpdoctor.model.records import Origin

RANK_NAME = re.compile(r"(?:^|[^a-z])(?:global_?)?rank[-_.]?(\d{1,5})(?!\d)", re.IGNORECASE)
LOCAL_RANK_NAME = re.compile(r"local_?rank[-_.]?(\d{1,5})(?!\d)", re.IGNORECASE)
HOST_NAME = re.compile(
    r"^((?:node|worker|host|gpu|compute|pod|trainer|machine)[-_]?\d+[\w-]*)", re.IGNORECASE
)
ATTEMPT_DIR = re.compile(r"^attempt_\d+$")
STREAM_FILE = re.compile(r"^(stdout|stderr)\.log$|^error\.json$")


def origin_from_path(path: str) -> Origin:
    """Best guess of rank/local rank/host from the path alone; unknown parts stay None."""
    parts = PurePath(path).parts
    origin = Origin()
    if len(parts) >= 3 and STREAM_FILE.match(parts[-1]) and parts[-2].isdigit():
        if ATTEMPT_DIR.match(parts[-3]):
            origin.local_rank = int(parts[-2])
    for part in reversed(parts[-3:]):
        stem = part.rsplit(".", 1)[0] if "." in part else part
        if origin.local_rank is None:
            m = LOCAL_RANK_NAME.search(stem)
            if m:
                origin.local_rank = int(m.group(1))
        if origin.rank is None and not LOCAL_RANK_NAME.search(stem):
            m = RANK_NAME.search(stem)
            if m:
                origin.rank = int(m.group(1))
        if origin.host is None:
            m = HOST_NAME.match(stem)
            if m:
                origin.host = m.group(1)
    return origin
