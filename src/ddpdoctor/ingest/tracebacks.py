"""Traceback stitching: given the line where an error was printed, collect the earlier lines of
the same writer that belong to its Python traceback, skipping lines other ranks interleaved."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache

from ddpdoctor.ingest.prefixes import SPAWN_PROCESS, ParsedLine, parse_line

TRACEBACK_HEAD = "Traceback (most recent call last):"
LOGGING_ERROR = "--- Logging error ---"
"""What Python's logging prints over the traceback of an error raised while it wrote a record
(logging.Handler.handleError: a full disk, a closed stream, a bad format string): it prints it
and carries on, so the program did not die of it."""
UNRAISABLE = "Exception ignored in"
"""What Python prints over an exception it could not raise (sys.unraisablehook: a __del__, a
weakref callback, an atexit function at exit): it goes on."""
FINALIZER_FRAME = re.compile(r"multiprocessing[/\\]util\.py\", line \d{1,6}, in _run_finalizers$")
"""multiprocessing's exit-time finalizers (a semaphore's sem_unlink, a queue's feeder): each
one's exception is printed (traceback.print_exc) and the next one runs."""
CHAINED = re.compile(
    r"^(During handling of the above exception|The above exception was the direct)"
)
EXCEPTION_LINE = re.compile(r"^\**[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\b")
RAY_TASK_HEAD = re.compile(
    r"^(?:[\w.]*RayTaskError(?:\([\w.]+\))?: )?ray::\S+ \(pid=(?P<pid>\d{1,9})"
    r"(?:, ip=(?P<ip>[\d.]{7,15}))?"
)
"""Where Ray's driver re-raises a worker's exception it prints this line in place of
'Traceback (most recent call last):' (python/ray/exceptions.py): the head of that worker's
traceback, naming its process."""
CARETS = re.compile(r"^[\^~]+ *$")
"""Python 3.11's markers under a frame's code ('^^^^^^^^'), when a paste trimmed their
indentation."""
IPYTHON_FRAME_HEAD = r"(?:File [^\"\n]{1,1000}:\d{1,6}, in |Cell In ?\[\d{1,6}\], line \d)"
"""IPython's (Jupyter's) header of a frame: 'File /path/mod.py:474, in func(args)', 'Cell In[7],
line 3' (a notebook cell). One pattern for the walk back here and the scanner's look above a
quoted source line."""
IPYTHON_ARROW = r"-{1,6}> ?\d{1,6} "
"""IPython's arrow at the frame's own line of code, quoted with its line number ('---> 474
for line in task.stdout:'); the lines around it are indented to the same gutter."""
FRAME_LINE = re.compile(r'^(?:> )?File "[^"]{1,4000}", line \d{1,9}|^' + IPYTHON_FRAME_HEAD)
IPYTHON_GUTTER = re.compile("^" + IPYTHON_ARROW)
IPYTHON_HEAD = re.compile(r"^[A-Za-z_][\w.]{0,200} {2,}Traceback \(most recent call last\)")
"""IPython's head of a traceback: the exception's name, padded, then Python's words."""
WRAPPED_FRAME = re.compile(
    r'^(?:"[^"\s]{1,4000}(?:", line)?|[^"\s]{0,4000}", line \d{1,9}, in \S{1,400}'
    r"|\d{1,9}, in \S{1,400}|[A-Za-z_<][\w<>.]{0,200})$"
)
"""The pieces of a frame line a console wrapped at its width (rich prints a child's traceback
so): the quoted path's start (with ', line' when the number was wrapped), the path's end with
the line number and function, the number and function, the function name alone."""
MAX_WALK_LINES = 400
MAX_TRACEBACK_LINES = 120
MAX_WALK_BYTES = 1024 * 1024
"""The walk back also stops after this many bytes: 400 lines of 8 MB each, looked at again for
every error line, would make a scan of long lines quadratic."""
MAX_INTERLEAVED = 3
"""Log records of other processes a walk steps over inside one traceback: in a console that
ranks share without a prefix, another rank's logging line lands between two of this one's
frames (unbuffered stderr, written as it comes); a traceback never holds a log record."""
LINE_PARSE_BYTES = 64 * 1024
"""Only the start of a long line is parsed: its prefix and the first 4,000 characters of its
text are all a traceback line is judged by."""


def is_traceback_line(text: str) -> bool:
    """Frame lines (indented, or not where loguru's and better_exceptions' "> " marks the frame
    that caught the error and the line's parse took that mark away), traceback heads,
    chaining sentences, exception lines, and C++ frame lists that torch appends to errors."""
    if not text:
        return False
    if text[0] in " \t" or text.startswith(
        (
            TRACEBACK_HEAD,
            "Original " + TRACEBACK_HEAD,
            "frame #",
            "Exception raised from",
        )
    ):
        return True
    first = text[0]  # (each regex only where its first characters or words can be)
    return bool(
        (first in "^~" and CARETS.match(text))
        or (first in "DT" and CHAINED.match(text))
        or EXCEPTION_LINE.match(text)
        or ("ray::" in text and RAY_TASK_HEAD.match(text))
        or (first in ">FC" and FRAME_LINE.match(text))
        or (first == "-" and IPYTHON_GUTTER.match(text))
        or WRAPPED_FRAME.match(text)
    )


def walk_back(
    chunk: bytes,
    line_start: int,
    key: str,
    parse: Callable[[str], ParsedLine],
    known: Mapping[int, ParsedLine] | None = None,
) -> list[tuple[int, ParsedLine]]:
    """(lines back, line) for each line of the traceback ending at `line_start`, oldest first.

    Only lines whose prefix equals `key` count (ranks interleave in one console). Stops at the
    traceback head, at a non-traceback line of the same writer, or after a bounded walk.
    `known`: lines of the chunk already parsed by `parse`, by where they start (the scan's
    candidates above this one), used as they are.
    """
    found: list[tuple[int, ParsedLine]] = []
    end = line_start - 1
    walked = 0
    stepped_over = 0
    after_head = False
    needles, rare = _needles_of(key)
    floor = max(0, line_start - MAX_WALK_BYTES)
    find = chunk.find
    while end > floor and walked < MAX_WALK_LINES and len(found) < MAX_TRACEBACK_LINES:
        if rare:
            # the lines after the last one holding the writer's longest needle are other
            # writers' (unless cleaning could join a needle): counted, not visited one by one
            pos = chunk.rfind(rare, floor, end)
            after = find(b"\n", pos, end + 1) if pos >= 0 else floor - 1
            if after < end and not _cleaned(chunk, after + 1, end):
                skipped = chunk.count(b"\n", after + 1, end) + 1
                if pos < 0 or walked + skipped >= MAX_WALK_LINES:
                    break
                walked += skipped
                end = after
                continue
        start = chunk.rfind(b"\n", floor, end) + 1
        if start == 0 and floor > 0:
            break  # the line starts before the budget: not looked at
        walked += 1
        if (
            needles
            and (
                find(rare, start, end) < 0
                or (len(needles) > 1 and any(find(needle, start, end) < 0 for needle in needles))
            )
            and not _cleaned(chunk, start, end)
        ):
            end = start - 1  # another writer's line: no need to parse it
            continue
        stop = min(end, start + LINE_PARSE_BYTES)
        whole = known.get(start) if known is not None and stop == end else None
        raw = chunk[start:stop].decode("utf-8", errors="replace") if whole is None else ""
        # decided without the line's time (a third of a parse); a line kept is parsed whole
        parsed = whole if whole is not None else parse_line(raw, with_time=False)
        end = start - 1
        if parsed.prefix != key or not parsed.text.strip():
            if (
                not key
                and found
                and walked - found[-1][0] == 1
                and parsed.text.startswith(TRACEBACK_HEAD)
            ):
                # a logging record's first line carries its writer's prefix, the traceback it
                # logged under it none (ParlAI's 'rank:  1 | 12:00:01 CRIT | Traceback ...'):
                # the head right above the unprefixed frames is theirs
                found.append((walked, whole if whole is not None else parse(raw)))
                break
            continue
        if after_head and not CHAINED.match(parsed.text):
            dated = whole if whole is not None else parse(raw)
            # logger.exception's header line dates the traceback; mp.spawn's names its process;
            # logging's own says the error was handled
            if (
                dated.time is not None
                or SPAWN_PROCESS.match(parsed.text)
                or parsed.text.startswith((LOGGING_ERROR, UNRAISABLE))
            ):
                found.append((walked, dated))
            break
        if not is_traceback_line(parsed.text) and not _frame_above(chunk, floor, end, key):
            # another process's log record between two of this traceback's frames (the line
            # below it is a frame or its code, not the traceback's first line)
            if (
                parsed.level is not None
                and stepped_over < MAX_INTERLEAVED
                and found
                and found[-1][1].text[:1] in (" ", "\t")
            ):
                stepped_over += 1
                continue
            break
        found.append((walked, whole if whole is not None else parse(raw)))
        after_head = parsed.text.startswith(TRACEBACK_HEAD) or bool(
            RAY_TASK_HEAD.match(parsed.text) or IPYTHON_HEAD.match(parsed.text)
        )
    found.reverse()
    return found


def _frame_above(chunk: bytes, floor: int, end: int, key: str) -> bool:
    """The writer's line above (ending at `end`) is a frame line: the line below it is that
    frame's code, whatever its indentation (a paste or a viewer that trimmed every line's
    leading spaces leaves 'loss.backward()' bare under 'File "train.py", line 9, in step')."""
    for _ in range(BLANKS_BETWEEN + 1):
        if end <= floor:
            return False
        start = chunk.rfind(b"\n", floor, end) + 1
        raw = chunk[start : min(end, start + LINE_PARSE_BYTES)]
        if not (_may_hold_frame(raw) or _may_be_blank_behind_prefix(raw)):
            return False
        above = parse_line(raw.decode("utf-8", errors="replace"), with_time=False)
        if above.text.strip() or (above.prefix and above.prefix != key):
            return above.prefix == key and FRAME_LINE.match(above.text) is not None
        # a blank line of the writer's behind a prefix (a double-spaced paste whose lines a
        # collector stamped or wrapped, so that no blank line is left for undouble to see)
        end = start - 1
    return False


def _may_be_blank_behind_prefix(raw: bytes) -> bool:
    """Whether a line could be a prefix with nothing after it, before parsing it (the walk
    reaches one such test for nearly every warning it starts from: 10,000 rank files would
    parse a line each): short, and ending as prefixes end (a time, a tag's ':' or ']', a
    label's '|', a JSON record's '}'), or empty."""
    stripped = raw.rstrip()
    return len(stripped) <= BLANK_WITH_PREFIX_BYTES and stripped[-1:] in PREFIX_ENDS


PREFIX_ENDS = (b"", *(bytes([c]) for c in b":]|}>Z0123456789"))
"""The last byte of a prefix (b"": a line of nothing at all)."""


BLANKS_BETWEEN = 2
"""Blank lines of the writer's looked past between a frame line and its code."""
BLANK_WITH_PREFIX_BYTES = 96
"""Longer lines hold more than a prefix before nothing: not looked at as blank ones."""


FRAME_MAKERS = (b"File", b"\\", b"\x1b", b"\x00")
"""Bytes without which no parse of a line gives a frame line: its own 'File', a JSON escape (a
record's message is its decoded value), and what cleaning removes between two letters (colour
codes, NUL). rich's boxed frames become indented ones, which FRAME_LINE does not match."""


def _may_hold_frame(raw: bytes) -> bool:
    """Whether parsing `raw` could give a frame line: nearly every line walked over is not
    one, and this test costs a parse's fraction (10,000 rank files parsed 35,000 lines above
    a writer's warning only to learn they were not frames)."""
    return (
        b"File" in raw
        or b"Cell In" in raw  # IPython's notebook cell frame
        or b"\\" in raw
        or b"\x1b" in raw
        or b"\x00" in raw  # FRAME_MAKERS
    )


def carried_on(context: list[str]) -> bool:
    """The traceback (its lines, oldest first) is one Python printed and went on from: logging's
    own error, an unraisable exception, a multiprocessing finalizer at exit."""
    if context and context[0].startswith((LOGGING_ERROR, UNRAISABLE)):
        return True
    return any(FINALIZER_FRAME.search(line) for line in context)


SKIPPED_ITEM = re.compile(
    r"^(?:WARNING|Warning|WARN)?:? ?(?:[Ss]kipp(?:ed|ing)|[Ii]gnor(?:ed|ing)|[Dd]ropp(?:ed|ing)) "
    r"(?:(?:a|the|bad|corrupt(?:ed)?|broken|invalid|unreadable) )?"
    r"(?:sample|file|image|record|example|item|row|clip|utterance|audio|video|batch)s?\b"
)
"""A line that starts by saying the program skipped the item its error is about ('WARNING:
Skipped sample (index 3). cannot identify image file ...', timm's reader; 'Skipping corrupt
image x.jpg: ...'): it went on to the next one, the error ended nothing."""


def skipped_item(text: str) -> bool:
    """The line reports an error the program stepped over (SKIPPED_ITEM)."""
    return SKIPPED_ITEM.match(text) is not None


@lru_cache(maxsize=64)
def _needles_of(key: str) -> tuple[tuple[bytes, ...], bytes]:
    """The writer's needles and the longest of them, once per writer (a walk starts from
    every rule's hit: 2,000 rank files walked 11,411 times)."""
    needles = _writer_needles(key)
    return needles, max(needles, key=len) if needles else b""


def _writer_needles(key: str) -> tuple[bytes, ...]:
    """Bytes every line of the writer `key` contains: each piece of its prefix (each part is a
    piece of the raw line, and a part may itself hold spaces, so every space-separated piece
    is one). A line lacking one belongs to another writer and is skipped unparsed: on the
    benchmark's 1,000 rank files stitching took 24 ms instead of 82, and in a console of
    16 interleaved ranks under `srun --label` (whose first part, `0: `, every rank of a node
    shares) a warning's walk back parsed 30 lines of other ranks instead of none. A piece
    holding a replacement character (undecodable bytes) is not looked for."""
    return tuple(p.encode("utf-8") for p in key.split(" ") if p and "\ufffd" not in p)


def _cleaned(chunk: bytes, start: int, end: int) -> bool:
    """True when cleaning (colour codes, NUL bytes) could join a prefix the raw bytes split."""
    return chunk.find(b"\x1b", start, end) >= 0 or chunk.find(b"\x00", start, end) >= 0
