"""A paste of several files that `tail` or `head` headed with '==> logs/rank3.log <==' read as
those files: each section is its own source, named by the path in its header (a file's name
tells its writer: ingest/filenames). Only a few inputs are looked at (pastes come one or two at
a time, not as 10,000 rank files)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import replace

from ddpdoctor.ingest.inputs import Input

HEADER = re.compile(rb"(?m)^==> (?P<path>[^\n<>]{1,1000}) <==\r?$")
"""tail's and head's header before each file when given several (coreutils)."""
MAX_INPUTS = 100
"""More inputs than this are rank files of a job, not pastes: not opened to look."""
MAX_BYTES = 4 * 1024 * 1024
"""A paste is read whole to find its headers; a bigger file is a log, read as it is."""


def split_sections(inputs: list[Input]) -> list[Input]:
    """Each input that starts with a tail header, as one input per header (the byte range
    under it, the path it names); any other input as it is."""
    if len(inputs) > MAX_INPUTS:
        return inputs
    out: list[Input] = []
    for item in inputs:
        out.extend(_sections(item) or [item])
    return out


def _sections(item: Input) -> list[Input] | None:
    if item.path == "-" or item.start or item.end is not None:
        return None
    try:
        st = os.stat(item.path)
        if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_BYTES:
            return None
        with open(item.path, "rb") as fh:
            if fh.read(4) != b"==> ":
                return None
            data = b"==> " + fh.read()
    except OSError:
        return None  # reading it again reports the error
    headers = list(HEADER.finditer(data))
    if not headers or headers[0].start() != 0:
        return None
    sections: list[Input] = []
    for i, header in enumerate(headers):
        start = min(header.end() + 1, len(data))
        end = headers[i + 1].start() if i + 1 < len(headers) else None
        named = header.group("path").decode("utf-8", errors="replace").strip()
        display = f"{item.display} [{named}]"
        line = data.count(b"\n", 0, start)
        sections.append(
            replace(item, display=display, start=start, end=end, named=named, first_line=line)
        )
    return sections
