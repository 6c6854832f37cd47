"""Lines a terminal hard-wrapped at its width, joined again. A log copied from a terminal (a
Windows console, tmux, an SSH client) or a fixed-width viewer comes back with every long line
cut into pieces of exactly the screen's width: 'Watchdog caught collective operation timeo' /
'ut: WorkNCCL(...)', and no rule finds the words the cut split. Programs write whole lines,
so only a small file (a paste) is looked at. Pure functions over bytes; no I/O."""

from __future__ import annotations

import bisect
import re
from collections import Counter
from itertools import pairwise

from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.tracebacks import EXCEPTION_LINE

MIN_INDENT = 4
"""A Markdown code block's indentation; a traceback's frames share only two spaces."""
MIN_WIDTH = 60
"""Narrower than any terminal a log is read in: lines this short are not cut by one."""
MIN_JOINS = 2
"""A width is the terminal's only when at least this many of its lines go on in the next."""
NEAR = 15
"""How far below the width a line counts as falling just short of it."""
SAME_START = 6
"""A next line that starts as the cut line did is a line of the same kind, not its rest."""
MESSAGE_START = re.compile(r"[A-Z][a-z]{2,} ")
"""A capitalised word and a space: how messages start ('Extracting ../data'), not how the rest
of a cut one goes on ('t=4718592, Timeout', 'DataParallel`. If', 'timing out.')."""
LINE_STARTS = ("Traceback (most recent", 'File "', "frame #", "During handling", "The above ")


def unwrap(data: bytes) -> tuple[bytes, tuple[int, ...]]:
    """The text with each hard-wrapped line joined to its rest, and the (joined) line numbers
    that took in a line of the file: see original_line. The text as it is, and no joins, when
    its lines do not look cut at one width."""
    lines = data.split(b"\n")
    if b"\r\n" in data:  # CRLF: the lines' lengths without their \r (slower, rarer)
        lines = [line.removesuffix(b"\r") for line in lines]
    width = _width(lines)
    if width is None:
        return data, ()
    joined: list[list[bytes]] = []  # each line's pieces (joined once: += was quadratic)
    merged_into: list[int] = []
    head = b""  # the start of the line the pieces being joined belong to
    last = b""  # the last piece, with the joined length it ends
    length = 0
    for body in lines:
        if joined and _goes_on(last, width, head, body, length):
            joined[-1].append(body)
            merged_into.append(len(joined))
            length += len(body)
        else:
            joined.append([body])
            head, length = body[:SAME_START], len(body)
        last = body
    if len(merged_into) < MIN_JOINS:
        return data, ()
    return b"\n".join(b"".join(pieces) for pieces in joined), tuple(merged_into)


def dedent(data: bytes) -> bytes:
    """The text without the indentation every one of its lines shares: a log pasted as a
    Markdown code block indented by four spaces (or a tab), or by two under a list item, where
    every line then looked like a traceback's frame and no line started where a log line
    starts. Programs never indent every line they write; only a paste of a traceback's frames
    alone shares Python's own two spaces. Lines keep their numbers."""
    first = data.lstrip(b"\r\n")[:1]
    if first not in (b" ", b"\t"):
        return data  # the first line is not indented (nearly every log): one look
    lines = data.split(b"\n")
    filled = [line for line in lines if line.strip()]
    if not filled:
        return data  # only blanks
    common = min(_indent(line) for line in filled)
    if (
        common < MIN_INDENT
        and not filled[0].startswith(b"\t")
        and all(line[common:].startswith(b'File "') for line in filled if _indent(line) == common)
    ):
        return data  # two spaces before every frame: a traceback's frames without their head
    prefix = filled[0][:common]
    if not all(line.startswith(prefix) for line in filled):
        return data  # mixed tabs and spaces: left as they are
    return b"\n".join(line[common:] if line.strip() else line for line in lines)


def _indent(line: bytes) -> int:
    return len(line) - len(line.lstrip(b" \t"))


FLAT_FRAME = re.compile(rb'^File "[^"\n]{1,4000}", line \d{1,9}')
"""A traceback's frame line at the start of the line: a paste that lost its indentation."""
NOT_CODE = re.compile(
    rb'^(?:File "|Traceback \(most recent|During handling|The above exception'
    rb"|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Interrupt|Exit|Warning)\b)"
)
"""What follows a frame line and is not its source code: the next frame, a traceback's own
lines, the exception line (a frame of frozen or compiled code shows no code)."""
CUT_REST = re.compile(rb"^[A-Za-z_<][\w<>.]{0,200}\r?$")
"""One word under a frame line: the rest of a frame line cut at a terminal's width ('lize'
under '..., in _cuda_deseria'), unless it is a statement of one word."""
STATEMENTS = frozenset((b"raise", b"return", b"yield", b"break", b"continue", b"pass"))
TORCH_TAG = re.compile(rb"\[(?:rank|default)\d{1,6}\]: ?")
"""torch's excepthook tag ('[rank3]: ') or torchrun's --tee prefix ('[default0]:'), before a
line whose own indentation a paste may have trimmed."""
TAGGED_FLAT_FRAME = re.compile(rb'(?m)^\[(?:rank|default)\d{1,6}\]: ?File "')
FLAT_SUMMARY_FIELD = re.compile(
    rb"^(?:time {6}|host {6}|rank {6}|exitcode  |error_file|traceback ): "
)
"""A field of torchelastic's failure summary (ChildFailedError's 'Failures:' and 'Root Cause'
entries, printed indented by two) at the start of the line."""


def reindent(data: bytes) -> bytes:
    """A traceback whose indentation a paste or a viewer trimmed (every line's leading spaces
    gone, 'File "train.py", line 9, in step' at the start of the line, or right after torch's
    '[rank3]: ' tag, and its code under it), indented again as Python prints it: two spaces
    before each frame line, four before the line of code that follows it, two before each
    field of torchelastic's failure summary. Tracebacks are then read as tracebacks (where
    they are cut, what they were doing, which lines belong to them) and a summary's fields as
    its entry's. Each writer's lines are followed apart (tags interleave). Lines keep their
    numbers."""
    if not (
        data.startswith(b'File "') or b'\nFile "' in data or b"\nexitcode  : " in data
    ) and not (b']: File "' in data and TAGGED_FLAT_FRAME.search(data)):
        return data  # no frame or field at the start of a line: nearly every log, one look
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    after_frame: dict[bytes, bool] = {}
    inside: dict[bytes, bool] = {}
    for index, whole in enumerate(lines):
        tag = TORCH_TAG.match(whole)
        prefix = tag.group(0).rstrip(b" ") + b" " if tag else b""
        line = whole[tag.end() :] if tag else whole
        key = tag.group(0).rstrip(b" ") if tag else b""
        if FLAT_SUMMARY_FIELD.match(line):
            lines[index] = prefix + b"  " + line
        elif FLAT_FRAME.match(line) or (index == last and inside.get(key) and _cut_frame(line)):
            lines[index] = prefix + b"  " + line
            after_frame[key] = inside[key] = True
            continue
        elif (
            after_frame.get(key)
            and index != last  # the paste's last line: its code, cut ('dist.init')
            and CUT_REST.match(line)
            and line.strip() not in STATEMENTS
        ):
            continue  # the rest of a frame line a terminal cut ('lize'): its code comes next
        elif (
            after_frame.get(key)
            and line.strip()
            and not line[:1].isspace()
            and not NOT_CODE.match(line)
        ):
            lines[index] = prefix + b"    " + line
            inside[key] = True
        elif line.strip():
            inside[key] = False
        after_frame[key] = False
    return b"\n".join(lines)


def _cut_frame(line: bytes) -> bool:
    """The paste's last line, cut inside a frame line ('File "/opt/conda/lib/pyth', 'F')."""
    return line.startswith(b'File "') or (bool(line) and b'File "'.startswith(line))


MIN_DOUBLED = 4
"""Fewer lines with text than this are too few to call a paste double-spaced."""
DOUBLED_SHARE = 0.9
"""The share of its lines with text (but the last) that a blank line follows in a
double-spaced paste."""


def undouble(data: bytes) -> tuple[bytes, tuple[int, ...]]:
    """The text without its blank lines, when a blank line follows nearly every line that
    holds text: a log copied from a web page or notebook output that double-spaced it, or
    saved twice through Windows line ends. Rules that read a message's next lines, or how near
    the end a line stands, counted the blanks as lines of the log. The lines that took in a
    blank, as unwrap's joins (see original_line): evidence keeps the file's line numbers."""
    blank_after = data.count(b"\n\n") + data.count(b"\n\r\n")
    if blank_after < MIN_DOUBLED or blank_after * 2 < data.count(b"\n") * 0.8:
        return data, ()  # a C count each: nearly every file stops here
    lines = data.split(b"\n")
    filled = [i for i, line in enumerate(lines) if line.strip(b" \t\r")]
    if len(filled) < MIN_DOUBLED:
        return data, ()
    followed = sum(1 for i in filled[:-1] if not lines[i + 1].strip(b" \t\r"))
    if followed < DOUBLED_SHARE * (len(filled) - 1):
        return data, ()
    ends = lines[-1] == b""  # the text's last newline ends its last line: no line after it
    kept: list[bytes] = []
    took: list[int] = []
    for line in lines[:-1] if ends else lines:
        if kept and not line.strip(b" \t\r"):
            took.append(len(kept))  # the blank is taken into the line above
        else:
            kept.append(line)
    return b"\n".join([*kept, b""] if ends else kept), tuple(took)


def compose(joins: tuple[int, ...], blanks: tuple[int, ...]) -> tuple[int, ...]:
    """unwrap's joins over the text undouble left (`blanks`): one tuple for original_line that
    maps a joined line to the file's own number."""
    if not joins or not blanks:
        return joins or blanks
    taken = list(joins)
    for line in blanks:  # the joined line that holds `line` took its blank in
        low, high = 1, line
        while low < high:
            mid = (low + high + 1) // 2
            if original_line(mid, joins) <= line:
                low = mid
            else:
                high = mid - 1
        taken.append(low)
    return tuple(sorted(taken))


NUMBERED = re.compile(rb"^(?: *(\d{1,9})(?: ?([:|]|\xe2\x94\x82) ?|[\t ])|\[(\d{1,9})(\]) )")
"""A viewer's line number before each line: `cat -n` ('     12\t'), `nl`, `less -N` ('     12 '),
a gutter with a bar ('  12 | ', '  12 │ ': web log viewers, editors), a colon ('12: ',
`grep -n`'s '812:') or brackets ('[12] ': which is also how MPICH's Hydra labels each rank's lines,
repeating a few numbers, never counting up line by line)."""
MIN_NUMBERED = 3
MIN_COLON_NUMBERED = 10
"""A colon after a number is also how srun labels its tasks ('0: ', '1: ', '2: '): only a
longer run of lines that count up one by one is a viewer's numbering."""
CLOCK = re.compile(rb" *\d{1,2}:\d\d:\d\d(?!:)")
"""A time at the start of a line ('10:42:01 INFO'): its hour is no line number (grep -n's
'5:10:42:01 INFO' and '5:10: text', srun's label behind it, are)."""


def unnumber(data: bytes) -> bytes:
    """The text without the line numbers a viewer put before every line (`cat -n`, `nl`,
    `less -N`, an editor's or a web log viewer's gutter copied with the text): then no line
    started where a log line starts. Only when every line that holds text starts with a
    number, the same separator after each, and the numbers count its lines (one more each
    line, or each line holding text). Lines keep their numbers."""
    if not data[:1].isdigit() and data[:1] not in (b" ", b"["):
        return data  # the first line starts with none of them: nearly every log, one look
    lines = data.split(b"\n")
    numbered: list[tuple[int, int, int]] = []  # (line index, its number, where the text starts)
    separators: set[bytes] = set()
    tight = False  # a colon right before a line's text: `grep -n`'s '812:text'
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        m = NUMBERED.match(line)
        if m is None or CLOCK.match(line):
            return data
        separators.add(m.group(2) or m.group(4) or b"")
        tight = tight or m.group(0)[-1:] == b":"
        numbered.append((index, int(m.group(1) or m.group(3)), m.end()))
    # `grep -n` keeps the lines it found, numbered as in the file: numbers that only grow,
    # with gaps, and the line's own text right after the colon (srun's task labels are
    # always followed by a space, and repeat); its gutter ends at the colon
    grep = separators == {b":"} and tight
    if grep:
        numbered = [(i, n, lines[i].index(b":") + 1) for i, n, _ in numbered]
    if len(separators) > 1 or len(numbered) < (
        MIN_COLON_NUMBERED if b":" in separators and not grep else MIN_NUMBERED
    ):
        return data
    for (i, n, _), (j, k, _) in pairwise(numbered):
        if k != n + 1 and k != n + (j - i) and not (grep and k > n):
            return data  # numbers that do not count the lines: the log's own
    out = list(lines)
    for index, _, start in numbered:
        out[index] = lines[index][start:]
    return b"\n".join(out)


def original_line(line: int, merges: tuple[int, ...]) -> int:
    """The file's own number of the first piece of joined line `line` (1-based): the lines
    merged into the joined lines above it come before it in the file."""
    return line + bisect.bisect_left(merges, line)


def _width(lines: list[bytes]) -> int | None:
    """The width the file's lines were cut at: its longest lines' length, when several of
    them go on in the next line, cut inside a word or number (a terminal cuts at its width,
    wherever that falls; the longest lines of a log that was not cut end where messages end);
    None for a file whose long lines are whole."""
    lengths = Counter(map(len, lines))  # counted in C: ~10 us for a 25 KB rank file
    width = max(lengths, default=0)
    if width < MIN_WIDTH or lengths[width] < MIN_JOINS:
        return None
    cut = 0
    for i, body in enumerate(lines[:-1]):
        nxt = lines[i + 1]
        inside_a_word = body[-1:].isalnum() and nxt[:1].isalnum()
        if len(body) == width and inside_a_word and _goes_on(body, width, body[:SAME_START], nxt):
            cut += 1
    # cut at one width, the long lines pile up at it: fewer lines fall just short of it than
    # reach it (a log's longest whole lines spread over their lengths)
    near = sum(lengths[n] for n in range(width - NEAR, width))
    return width if cut >= MIN_JOINS and near <= lengths[width] else None


def _goes_on(line: bytes, width: int, head: bytes, nxt: bytes, length: int = -1) -> bool:
    """`line` was cut at `width` and `nxt` is its rest: the cut fell inside the text (no
    terminal pads a cut line), and the next line starts as no line of a log does: no prefix,
    time or level of its own, no traceback's line, not the start of the line it would join.
    `line` is the last piece; `length` the length of the line joined so far (-1: the piece's)."""
    length = len(line) if length < 0 else length
    if length % width or not line or line[-1:].isspace() or not nxt or len(set(line)) < 3:
        return False
    if nxt[:SAME_START] == head:
        return False
    text = nxt.decode("utf-8", errors="replace")
    parsed = parse_line(text)
    if parsed.prefix or parsed.time is not None or parsed.level is not None:
        return False
    if parsed.origin.rank is not None or parsed.origin.local_rank is not None:
        return False
    stripped = parsed.text.lstrip()
    return (
        not stripped.startswith(LINE_STARTS)
        and EXCEPTION_LINE.match(stripped) is None
        and MESSAGE_START.match(stripped) is None
    )
