"""Line numbers that a viewer, an editor, `cat -n` or `grep -n` put in front of every line of a
pasted log ('  12 | text', '    12<TAB>text', '[2318] text', '12:text'). The program wrote none
of them, and behind them a traceback's frames, a launcher's banner or a rank prefix no longer
start their lines. Found once per file from its first lines, then taken off every line. Pure
functions over bytes; no I/O."""

from __future__ import annotations

import re
from itertools import pairwise

FORMS = (
    rb"[ \t]*(\d{1,7})\t",  # cat -n, nl
    rb"[ \t]*(\d{1,7}) ?\| ?",  # a viewer's or an editor's gutter
    rb"\[(\d{1,7})\] ?",  # a web log viewer's
    rb"[ \t]*(\d{1,7}):(?!\d\d:|[/\\])",  # grep -n (not a time's '10:42:' nor 'C:\')
)
"""Each gutter form, its number as group 1."""

STARTS = [re.compile(form) for form in FORMS]
STRIP = [re.compile(rb"(?m)^" + form) for form in FORMS]

LOOK = 60
"""The first lines of a file its gutter is told from."""
MIN_LINES = 3
"""Fewer numbered lines tell nothing (a list's '1: first', '2: second' is the program's)."""
SHARE = 0.9
"""Of the lines looked at, the share that must carry the gutter (a viewer leaves a long line's
continuation unnumbered)."""
FIRST_LINE = re.compile(rb"\s*(?:" + b"|".join(FORMS) + rb")")
"""Any form at the start of the file (its blank lines skipped): most logs' first line has
none, and they are done with this one match (10,000 rank files: a microsecond each)."""


def gutter_of(head: bytes) -> re.Pattern[bytes] | None:
    """The pattern that takes the gutter off every line of the file whose first bytes are
    `head`, or None when its lines are not numbered: every looked-at line (but a few) starts
    with the same form and the numbers only grow, as a viewer's, `cat -n`'s or `grep -n`'s do
    (a launcher's task labels '0: ', '1: ' repeat and fall back, a time never parses as one)."""
    if not FIRST_LINE.match(head):  # (before any split: most files end here)
        return None
    lines = [line for line in head.split(b"\n", LOOK)[:LOOK] if line.strip()]
    if len(lines) < MIN_LINES:
        return None
    for start, strip in zip(STARTS, STRIP, strict=True):
        if not start.match(lines[0]):  # the first line is numbered too (a timed log ends here)
            continue
        numbers = [int(m[1]) for line in lines if (m := start.match(line))]
        if len(numbers) < max(MIN_LINES, SHARE * len(lines)):
            continue
        if all(a < b for a, b in pairwise(numbers)):
            return strip
    return None
