"""Hypothesis strategies for hostile inputs, all grown from real material: the real logs kept in
the repo (tests/fixtures/real, the captured scenarios, the corpus cases and ../shared/corpus when
present), the real run folders and torchelastic error files, mutated the way a broken disk, a
careless user or an attacker would (atheris-style byte edits, plus edits that know the formats:
numbers of thousands of digits, extreme dates, JSON values of the wrong type, special files)."""

from __future__ import annotations

import codecs
import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.conftest import CORPUS, REPO

REAL = REPO / "tests" / "fixtures" / "real"
CAPTURED = REPO / "src" / "ddpdoctor" / "scenarios" / "captured"
CASES = REPO / "corpus" / "cases"
FLIGHT = REAL / "flight-recorder"
RUN_FOLDERS = (
    REPO / "tests" / "fixtures" / "runs" / "hang",
    REPO / "tests" / "fixtures" / "runs" / "exit-3",
    FLIGHT / "run-hang" / "run",
)
FLIGHT_CAPTURES = tuple(sorted(p for p in FLIGHT.iterdir() if (p / "dumps").is_dir()))
"""Real Flight Recorder dumps (pickle and JSON forms) with the console log of their job."""
ERROR_FILES = next((REAL / "elastic-error-json").glob("*_*"))
MAX_MUTANT_BYTES = 4 << 20
"""A mutant is cut to this size (the scan of long inputs is tested elsewhere)."""
MAX_SEED_LINES = 400
"""A window of a real log this long keeps each example fast while holding whole tracebacks."""


def _log_files() -> list[Path]:
    roots = [REAL, CAPTURED, CASES, CORPUS]
    files = [
        p
        for root in roots
        if root.is_dir()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".log", ".txt", "") and p.stat().st_size < 4 << 20
    ]
    return files


LOG_FILES = _log_files()

BIG_NUMBERS = ["9" * 5000, "9" * 400, "-" + "9" * 4400, "1" + "0" * 19, "00000000000000000007"]
TOKENS = [
    "Timeout(ms)=",
    "[rank",
    "]:",
    "[default",
    "exitcode  : ",
    "rank      : ",
    "nranks ",
    "WORLD_SIZE=",
    "%|",
    "Traceback (most recent call last):",
    "error: unrecognized arguments: ",
    "libcuda",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=",
    "\x1b[31m",
    "\x1b]0;title\x07",
    "\r",
    "\x00",
    "\ufffd",
    "0001-01-01T00:00:00Z ",
    "9999-12-31T23:59:59.999999+14:00 ",
    "E1231 23:59:60.999999 ",
    "[PG 1 (",
    "\\",
    '"',
]


@st.composite
def real_text(draw: st.DrawFn) -> bytes:
    """A window of lines of a real log."""
    path = draw(st.sampled_from(LOG_FILES))
    lines = path.read_bytes().splitlines(keepends=True)
    start = draw(st.integers(0, max(0, len(lines) - 1)))
    return b"".join(lines[start : start + MAX_SEED_LINES])


def _digit_runs(data: bytes) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(data) and len(runs) < 200:
        if 48 <= data[i] <= 57:
            j = i
            while j < len(data) and 48 <= data[j] <= 57:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` after a few edits: bytes flipped, inserted or deleted, numbers blown up, format
    tokens inserted, a line repeated or stretched, the text cut."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 8))
        at = draw(st.integers(0, len(buf))) if buf else 0
        if kind == 0 and buf:  # flip a byte
            i = min(at, len(buf) - 1)
            buf[i] = draw(st.integers(0, 255))
        elif kind == 1:  # insert random bytes
            buf[at:at] = draw(st.binary(min_size=1, max_size=32))
        elif kind == 2 and buf:  # delete a span
            buf[at : at + draw(st.integers(1, 256))] = b""
        elif kind == 3:  # a number of thousands of digits where one was
            runs = _digit_runs(bytes(buf))
            if runs:
                i, j = draw(st.sampled_from(runs))
                buf[i:j] = draw(st.sampled_from(BIG_NUMBERS)).encode()
        elif kind == 4:  # a format token
            buf[at:at] = draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass")
        elif kind == 5 and buf:  # a line repeated many times
            s = bytes(buf).rfind(b"\n", 0, at) + 1
            e = bytes(buf).find(b"\n", at)
            line = bytes(buf[s : e + 1 if e >= 0 else len(buf)]) or b"x\n"
            buf[s:s] = line * min(draw(st.integers(2, 500)), MAX_MUTANT_BYTES // len(line) + 1)
        elif kind == 6 and buf:  # a line stretched to 100 KB
            token = draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass") or b"x"
            buf[at:at] = token * (100_000 // len(token))
        elif kind == 7:  # cut the text
            del buf[at:]
        else:  # invalid UTF-8 and lone surrogates' bytes
            buf[at:at] = draw(st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]))
        del buf[MAX_MUTANT_BYTES:]  # edits compound: a stretched line repeated 500 times
    return bytes(buf)


@st.composite
def encoded(draw: st.DrawFn, data: bytes) -> tuple[str, bytes]:
    """(file name, bytes): plain, gzip (whole, truncated or damaged) or UTF-16 with its mark."""
    form = draw(st.sampled_from(["plain", "plain", "gzip", "gzip-cut", "gzip-bad", "utf16"]))
    if form == "plain":
        return "console.log", data
    if form == "utf16":
        text = data.decode("utf-8", "replace")
        return "console.log", codecs.BOM_UTF16_LE + text.encode("utf-16-le")
    packed = gzip.compress(data, compresslevel=1)
    if form == "gzip-cut":
        packed = packed[: draw(st.integers(0, len(packed)))]
    elif form == "gzip-bad" and len(packed) > 12:
        at = draw(st.integers(10, len(packed) - 1))
        packed = packed[:at] + draw(st.binary(min_size=1, max_size=64)) + packed[at + 1 :]
    return "console.log.gz", packed


def json_values() -> st.SearchStrategy[Any]:
    """JSON values of every type, including what Python's json accepts beyond the standard
    (NaN, infinity) and numbers beyond any bound."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([10**400, -(10**400), 2**63, -1, 0]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.sampled_from(["", "rank 1", "2026-12-01T15:44:44", "0001-01-01T00:00:00", "yesterday"]),
        st.sampled_from(["²", "--5", "١٢", "-", "1e3", "9" * 30, "9" * 5000, "[0, 1, ²]"]),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _replace_somewhere(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one node (found by a random walk from the root) replaced by any JSON."""
    deeper = draw(st.integers(0, 3)) > 0  # leaves hold most fields: go down 3 times in 4
    if isinstance(value, dict) and value and deeper:
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _replace_somewhere(draw, value[key])}
    if isinstance(value, list) and value and deeper:
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _replace_somewhere(draw, value[i]), *value[i + 1 :]]
    return draw(json_values())


HOSTILE_NUMBERS: list[Any] = [
    "²",
    "--5",
    "١٢",
    "9" * 5000,
    "-" + "9" * 30,
    10**400,
    -(2**70),
    float("nan"),
    float("inf"),
    1.5,
    True,
    None,
    "",
]


def _numbers_spoiled(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """`value` with about half of its numbers (and strings of digits) replaced by ones of
    another script, sign, size or type: every numeric field of a format at once."""
    if depth > 50:
        return value
    if isinstance(value, dict):
        return {k: _numbers_spoiled(draw, v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_spoiled(draw, v, depth + 1) for v in value[:200]] + value[200:]
    numeric = isinstance(value, int | float) or (isinstance(value, str) and value.isdigit())
    if numeric and draw(st.booleans()):
        return draw(st.sampled_from(HOSTILE_NUMBERS))
    return value


def _dump(value: Any) -> str:
    try:
        return json.dumps(value)
    except (ValueError, RecursionError):
        return "{}"


@st.composite
def mutated_json_lines(draw: st.DrawFn, text: str) -> bytes:
    """JSON lines with values replaced by ones of any type, lines dropped, duplicated or
    nested thousands deep, and sometimes plain byte edits on top."""
    out: list[str] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        choice = draw(st.integers(0, 10))  # Hypothesis favours small values: 0 is common
        if choice == 0:
            out.append(_dump(_numbers_spoiled(draw, record)))
        elif choice <= 5:
            for _ in range(draw(st.integers(1, 4))):
                record = _replace_somewhere(draw, record)
            out.append(_dump(record))
        elif choice == 6:
            continue
        elif choice == 7:
            out += [line] * draw(st.integers(2, 5))
        elif choice == 8:
            depth = draw(st.sampled_from([50, 5000, 100_000]))
            out.append('{"event": "stacks", "diagnosis": ' + "[" * depth + "]" * depth + "}")
        else:
            out.append(line)
    data = ("\n".join(out) + "\n").encode()
    if draw(st.integers(0, 4)) == 0:
        data = draw(mutated(data))
    return data


SPECIAL = ["fifo", "dangling", "loop", "hidden", "binary", "empty", "folder", "unreadable"]


def add_special(folder: Path, kind: str) -> None:
    """A file-system oddity inside a folder being diagnosed."""
    target = folder / f"odd-{kind}"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dangling":
        os.symlink(folder / "nowhere", target)
    elif kind == "loop":
        os.symlink(folder, target)
    elif kind == "hidden":
        shutil.copy(LOG_FILES[0], folder / ".hidden.log")
    elif kind == "binary":
        target.write_bytes(os.urandom(64 * 1024))
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "folder":
        (target / "sub").mkdir(parents=True)
    else:
        target.mkdir()
        target.chmod(0)
