"""torchelastic error files (`error.json`, written by `@record` under torchrun --log-dir or
TORCHELASTIC_ERROR_FILE): a JSON document whose traceback is one escaped string. Turned back
into the log lines it stands for, each stamped with the file's timestamp."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ddpdoctor.ingest.bounds import count_number, time_from_epoch
from ddpdoctor.ingest.inputs import reason_for
from ddpdoctor.model.records import SourceInfo

MAX_ERROR_FILE_BYTES = 16 * 1024 * 1024


def is_error_file(path: str) -> bool:
    return Path(path).name == "error.json"


class ErrorFileChunks:
    """Same interface as sources.ChunkStream: iterate for the text, then read `info` (whose
    `lines` the scanner counts as it goes)."""

    def __init__(self, path: str, display: str) -> None:
        self.path = path
        self.info = SourceInfo(path=display)
        self.mtime: float | None = None

    def __iter__(self) -> Iterator[bytes]:
        try:
            st = os.stat(self.path)
            self.mtime = st.st_mtime
            if not stat.S_ISREG(st.st_mode):  # a FIFO of that name would block the read
                self.info.status, self.info.reason = "skipped", "not a regular file"
                return
            if st.st_size > MAX_ERROR_FILE_BYTES:
                self.info.status, self.info.reason = "skipped", "error file too large"
                return
            with open(self.path, "rb") as f:
                raw = f.read(MAX_ERROR_FILE_BYTES + 1)
        except OSError as exc:
            self.info.status, self.info.reason = "skipped", reason_for(exc)
            return
        self.info.bytes = len(raw)
        text = render_error_file(raw)
        if text is None:
            self.info.status, self.info.reason = "skipped", "not a torchelastic error file"
            return
        yield text.encode("utf-8", errors="replace")


def render_error_file(raw: bytes) -> str | None:
    """The traceback (or message) lines of a torchelastic error file, ISO-timestamped."""
    try:
        doc = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # deep nesting exhausts the decoder's recursion
        return None
    message = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, str):  # older format: a bare message string
        body, stamp = message, None
    elif isinstance(message, dict):
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        body = extra.get("py_callstack") or message.get("message") or ""
        stamp = extra.get("timestamp")
    else:
        return None
    if not isinstance(body, str):
        return None
    prefix = ""
    seconds = count_number(stamp) if isinstance(stamp, str) else None
    if type(stamp) is int:
        seconds = count_number(str(stamp))
    when = time_from_epoch(seconds) if seconds is not None else None
    if when is not None:
        prefix = when.strftime("%Y-%m-%dT%H:%M:%SZ ")
    lines = [line for line in body.splitlines() if line.strip()]
    return "".join(f"{prefix}{line}\n" for line in lines)
