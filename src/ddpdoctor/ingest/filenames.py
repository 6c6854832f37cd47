"""What a file's path says about its writer: `rank3.log`, `node1/`, `worker-2.txt`, and
torchrun's `--log-dir` layout `<run_id>/attempt_<k>/<local_rank>/stdout.log`."""

from __future__ import annotations

import os
import re

from ddpdoctor.ingest.bounds import rank_number
from ddpdoctor.model.records import Origin

# a rank in the name; Azure ML keeps each MPI process's (rank's) prints in
# user_logs/std_log_process_<N>.txt (std_log_process_01.txt)
RANK_NAME = re.compile(
    r"(?:^|[^a-z])(?:(?:global_?)?rank[-_.]?|std_log_process_)(\d{1,5})(?!\d)", re.IGNORECASE
)
LOCAL_RANK_NAME = re.compile(r"local_?rank[-_.]?(\d{1,5})(?!\d)", re.IGNORECASE)
DEVICE_SUFFIX = re.compile(r"(?<=.)[-_]GPU[-_]?(\d{1,3})$", re.IGNORECASE)
"""A per-process log named for its device at the end of its stem, as NVIDIA's multiproc.py
(tacotron2, waveglow) names each worker's: logs/<group>_GPU_<i>.log, the worker it started on
GPU i: its local rank."""
LOCAL_BEFORE = re.compile(r"local_?rank[-_.]?$", re.IGNORECASE)
HOST_NAME = re.compile(
    r"^((?:node|worker|host|gpu|compute|pod|trainer|machine)[-_]?\d+[\w-]*)", re.IGNORECASE
)
ATTEMPT_DIR = re.compile(r"^attempt_\d+$")
STREAM_FILE = re.compile(r"^(stdout|stderr)\.log$|^error\.json$")


DIR_RANK = re.compile(r"^(?:global_?)?rank[-_.]?(\d{1,5})$", re.IGNORECASE)
"""A folder named for its rank: `rank3/`, `rank_3/`, OpenMPI's `--output-filename DIR` layout
`DIR/1/rank.3/stdout`."""
DIR_LOCAL_RANK = re.compile(r"^local_?rank[-_]?(\d{1,5})$", re.IGNORECASE)


def _global_rank(name: str) -> int | None:
    """The rank a file name gives, not its local rank's ('local_rank1' names a device; NeMo's
    'nemo_log_globalrank-1_localrank-1.txt' names both)."""
    for m in RANK_NAME.finditer(name):
        if not LOCAL_BEFORE.search(name, 0, m.start(1)):
            return int(m.group(1))
    return None


def _parts(path: str) -> list[str]:
    """The path's named parts, as PurePath.parts has them but without its cost: this runs for
    every file of a 10,000-rank job."""
    if os.altsep:
        path = path.replace(os.altsep, os.sep)
    return [p for p in path.split(os.sep) if p and p != "."]


def attempt_of(path: str) -> tuple[str, int] | None:
    """torchrun --log-dir's attempt folder of a worker's file (RUN/attempt_N/LOCAL_RANK/
    stdout.log): the run's folder and N. Each restart of the worker group writes a new one."""
    parts = _parts(path)
    if len(parts) >= 3 and STREAM_FILE.match(parts[-1]) and ATTEMPT_DIR.match(parts[-3]):
        return os.sep.join(parts[:-3]), int(parts[-3].split("_", 1)[1])
    return None


def origin_from_path(path: str) -> Origin:
    """Best guess of rank/local rank/host from the path alone; unknown parts stay None.

    The file name may carry the rank anywhere in its stem (`train_rank3.log`); a folder only
    counts when its whole name is a rank or host (`rank3/`, `node1/`), so that a project folder
    such as `debug-rank0-runs/` does not label every file in it.
    """
    parts = _parts(path)
    origin = Origin()
    if not parts:
        return origin
    if len(parts) >= 3 and STREAM_FILE.match(parts[-1]) and ATTEMPT_DIR.match(parts[-3]):
        origin.local_rank = rank_number(parts[-2])
    name = parts[-1]  # the rank may follow a dot too: train.rank2.log
    stem = name.split(".", 1)[0]
    # each case-blind search only where its word is: on ASCII, where case folding only maps
    # letters (it folds a few others into ASCII ones), in the lower-cased name (this runs for
    # each of 10,000 rank files in the scan and again in the job's building)
    lower = name.lower() if name.isascii() else None
    m = LOCAL_RANK_NAME.search(name) if lower is None or "local" in lower else None
    if m and origin.local_rank is None:
        origin.local_rank = int(m.group(1))
    m = DEVICE_SUFFIX.search(stem) if lower is None or "gpu" in lower else None
    if m and origin.local_rank is None:
        origin.local_rank = int(m.group(1))
    if lower is None or "rank" in lower or "std_log_process_" in lower:
        origin.rank = _global_rank(name)
    m = HOST_NAME.match(stem)
    if m:
        origin.host = m.group(1)
    for folder in reversed(parts[-3:-1]):
        if origin.rank is None and (m := DIR_RANK.match(folder)):
            origin.rank = int(m.group(1))
        if origin.local_rank is None and (m := DIR_LOCAL_RANK.match(folder)):
            origin.local_rank = int(m.group(1))
        if origin.host is None and (m := HOST_NAME.match(folder)):
            origin.host = m.group(1)
    return origin


def display_name(path: str) -> str:
    """The path as reports show it: bytes that are not UTF-8 (kept by Python as lone surrogates,
    which no UTF-8 output can hold) written as `\\xNN` escapes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = path.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte
            return path.encode("utf-8", "backslashreplace").decode("utf-8")
        return raw.decode("utf-8", "backslashreplace")
    return path
