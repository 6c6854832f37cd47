"""Flight Recorder dumps: recognise them by content (a pickle, or the JSON that
`_dump_fr_trace_json()` and the worker server's `fr_trace_json` return) and read them safely.

A pickle is never given to the general unpickler: a restricted one refuses every class and
function (torch's dumps hold only dicts, lists, tuples, str, int, float, bool and None), and
size, nesting and counts are bounded. Reading never raises: a refusal is a reason string.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import re
import stat
from dataclasses import dataclass
from typing import Any

from ddpdoctor.ingest.bounds import MAX_RANK
from ddpdoctor.ingest.filenames import origin_from_path
from ddpdoctor.ingest.sources import Input
from ddpdoctor.model.flight import FlightDump, FlightEntry, FlightFrame, FlightGroupStatus
from ddpdoctor.model.records import SourceInfo

MAX_DUMP_BYTES = 128 * 1024 * 1024
"""A 20,000-entry NCCL dump with frames is about 30 MB; more than this is not read."""
MAX_DEPTH = 16
"""torch's dumps nest 5 deep (dump > entries > entry > frames > frame)."""
MAX_NODES = 20_000_000
MAX_ENTRIES = 100_000
MAX_FRAMES = 128
MAX_TENSORS = 256
MAX_TEXT = 4096
HEAD_BYTES = 4096
PICKLE_PROTOCOLS = (2, 3, 4, 5)
"""PROTO opcode versions: torch's C++ pickler writes 2, Python's pickle 4 or 5. Protocols 0
and 1 have no header; such files are text or not dumps, and are read as logs, never unpickled."""
JSON_KEYS = (b'"entries"', b'"pg_config"', b'"pg_status"', b'"comm_lib_version"')
TRAILING_RANK = re.compile(r"(\d{1,6})$")
_DECIMAL = re.compile(r"-?[0-9]{1,19}")

_READ_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    MemoryError,
    OverflowError,
    RecursionError,
    UnicodeDecodeError,
    ImportError,
)


@dataclass(slots=True)
class Rejected:
    """A file that looked like a dump but was not read; `reason` goes to the report's sources."""

    reason: str


def sniff(head: bytes) -> str | None:
    """'pickle' or 'json' when the first bytes of a file look like a Flight Recorder dump."""
    if len(head) >= 2 and head[0] == 0x80 and head[1] in PICKLE_PROTOCOLS:
        return "pickle"
    text = head.lstrip()
    if text[:1] == b"{" and b'"entries"' in head and any(k in head for k in JSON_KEYS[1:]):
        return "json"
    if text[:1] == b"{" and b'"entries"' in head and b'"profiling_name"' in head:
        return "json"
    return None


def sniff_path(path: str) -> str | None:
    """sniff() on the head of a regular file; None when it cannot be read (the scan will say
    why) or is not a regular file: a pipe (`<(kubectl logs ...)`) is never opened here, as
    that would take its first bytes from the scan (or let its writer in before the reader)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return sniff(os.read(fd, HEAD_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only the plain types the pickle machine makes by itself:
    anything that names a class or function (os.system, builtins.eval, torch.Tensor) is refused
    before it is looked up, so no code of the file's choosing can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it asks for {module[:80]}.{name[:80]}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to external objects (persistent ids)")


MAX_MEMO_INDEX = 1 << 22
"""The highest memo slot a dump's pickle may name. The unpickler grows its memo table to twice
the slot a PUT names and zeroes it: one damaged 4-byte index asked for gigabytes (make fuzz:
14 GB, the OOM killer)."""
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def load_plain_pickle(data: bytes) -> Any:
    """The value of a pickle made only of dicts, lists, tuples, sets, str, bytes, numbers, bool
    and None. Raises pickle.UnpicklingError (or another _READ_ERRORS) otherwise."""
    for op, arg, _ in pickletools.genops(data):
        if op.name in _MEMO_PUTS and isinstance(arg, int) and arg > MAX_MEMO_INDEX:
            raise pickle.UnpicklingError(f"a memo slot of {arg:,}, more than a dump uses")
        if op.name == "STOP":
            break
    return _PlainUnpickler(io.BytesIO(data)).load()


def check_shape(value: Any) -> str | None:
    """Why a decoded value is too deep or too big to be a dump, or None. Iterative, and each
    container is visited once, so shared or cyclic references cannot make it loop or explode."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"more than {MAX_NODES:,} values"
        if isinstance(item, dict | list | tuple | set | frozenset):
            if depth > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
            if id(item) in seen:
                continue
            seen.add(id(item))
            children = item.items() if isinstance(item, dict) else item
            for child in children:
                stack.append((child, depth + 1))
    return None


def read_dump(
    path: str, display: str | None = None, form: str | None = None
) -> FlightDump | Rejected:
    """Read one dump file; never raises. `form` skips sniffing when the caller has done it."""
    display = display or path
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            return Rejected(
                f"{size:,} bytes, more than the {MAX_DUMP_BYTES // 2**20} MiB a Flight Recorder "
                "dump is read up to"
            )
        with open(path, "rb") as fh:
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        return Rejected(f"cannot read: {exc.strerror}")
    return parse_dump(data, display, rank_from_path(path), form)


def parse_dump(
    data: bytes, source: str, rank: int | None = None, form: str | None = None
) -> FlightDump | Rejected:
    """A dump from its bytes (pickle or JSON, as sniffed); never raises."""
    form = form or sniff(data[:HEAD_BYTES])
    if len(data) > MAX_DUMP_BYTES:
        return Rejected(f"more than the {MAX_DUMP_BYTES // 2**20} MiB a dump is read up to")
    if form == "pickle":
        try:
            value = load_plain_pickle(data)
        except pickle.UnpicklingError as exc:
            if str(exc).startswith(("it asks for", "it refers to")):
                return Rejected(
                    f"refused: a pickle that is not a Flight Recorder dump ({exc}); dumps hold "
                    "only plain data, so it was not loaded and none of its code ran"
                )
            return Rejected(f"a pickle that cannot be read: {exc}")
        except _READ_ERRORS as exc:
            return Rejected(f"a pickle that cannot be read: {type(exc).__name__}: {exc}"[:300])
    elif form == "json":
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as exc:
            return Rejected(f"JSON that cannot be read: {type(exc).__name__}: {exc}"[:300])
    else:
        return Rejected("not a Flight Recorder dump")
    problem = check_shape(value)
    if problem is not None:
        return Rejected(f"a {form} value {problem}: not a Flight Recorder dump")
    return to_dump(value, source, rank, form)


def rank_from_path(path: str) -> int | None:
    """The rank in a dump's file name: `rank3`, `nccl_trace_rank_3`, or, as torch's own
    analyzer reads names, the digits that end the name (`fr_3`)."""
    rank = origin_from_path(path).rank
    if rank is not None:
        return rank
    stem = os.path.basename(path).split(".", 1)[0]
    m = TRAILING_RANK.search(stem)
    return int(m.group(1)) if m else None


def to_dump(value: Any, source: str, rank: int | None, form: str) -> FlightDump | Rejected:
    """The dump from a decoded value, keeping only well-typed fields; caps counts."""
    if not isinstance(value, dict) or not isinstance(value.get("entries", None), list):
        return Rejected(f"a {form} value without Flight Recorder entries: not a dump")
    raw_entries: list[Any] = value["entries"]
    entries: list[FlightEntry] = []
    for raw in raw_entries[:MAX_ENTRIES]:
        entry = _entry(raw)
        if entry is not None:
            entries.append(entry)
    if raw_entries and not entries:
        return Rejected(f"a {form} value whose entries are not Flight Recorder entries")
    return FlightDump(
        source=source,
        form=form,
        rank=rank,
        version=_text(value.get("version")) or "",
        entries=entries,
        members=_members(value.get("pg_config")),
        status=_status(value.get("pg_status")),
        dropped_entries=max(0, len(raw_entries) - MAX_ENTRIES),
    )


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _pg_name(value: Any) -> str:
    """A process group's id as text; one that looks like a number but is none Python can read
    back (other scripts' digits, thousands of digits) is marked so that no reader tries."""
    text = _text(value) or ""
    if text.isdigit() and not (text.isascii() and len(text) <= 12):
        return "#" + text
    return text


def _int(value: Any) -> int | None:
    """An int, or a decimal string of one (the JSON form writes pg_status counters as text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else None
    if isinstance(value, str) and _DECIMAL.fullmatch(value):  # not "²", "--5" or "١٢"
        return int(value)
    return None


def _sizes(value: Any) -> list[list[int]]:
    if not isinstance(value, list | tuple):
        return []
    out: list[list[int]] = []
    for dims in value[:MAX_TENSORS]:
        if isinstance(dims, list | tuple):
            out.append([d for d in (_int(x) for x in dims[:16]) if d is not None])
    return out


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list | tuple):
        return []
    return [s[:64] for s in value[:MAX_TENSORS] if isinstance(s, str)]


def _frames(value: Any) -> list[FlightFrame]:
    if not isinstance(value, list | tuple):
        return []
    out: list[FlightFrame] = []
    for raw in value[:MAX_FRAMES]:
        if not isinstance(raw, dict):
            continue
        file, name, line = _text(raw.get("filename")), _text(raw.get("name")), _int(raw.get("line"))
        if file is not None and line is not None:
            out.append(FlightFrame(name=name or "", file=file, line=line))
    return out


def _entry(raw: Any) -> FlightEntry | None:
    if not isinstance(raw, dict):
        return None
    name = _text(raw.get("profiling_name"))
    group = raw.get("process_group")
    p2p = raw.get("is_p2p") is True
    seq = _int(raw.get("p2p_seq_id" if p2p else "collective_seq_id"))
    if name is None or seq is None or not isinstance(group, list | tuple) or not group:
        return None
    backend, _, op = name.rpartition(":")
    pg = _pg_name(group[0])
    desc = (_text(group[1]) if len(group) > 1 else None) or ""
    created = _int(raw.get("time_created_ns"))
    return FlightEntry(
        record_id=_int(raw.get("record_id")) or 0,
        pg=pg,
        pg_desc=desc,
        seq=seq,
        p2p=p2p,
        op=op,
        backend=backend,
        input_sizes=_sizes(raw.get("input_sizes")),
        output_sizes=_sizes(raw.get("output_sizes")),
        input_dtypes=_strings(raw.get("input_dtypes")),
        output_dtypes=_strings(raw.get("output_dtypes")),
        state=_text(raw.get("state")) or "",
        time_created_ns=created if created else None,
        timeout_ms=_int(raw.get("timeout_ms")),
        frames=_frames(raw.get("frames")),
    )


def _members(value: Any) -> dict[str, list[int]]:
    """pg name -> ranks from pg_config, when recorded. gloo writes one entry keyed '' that
    names no group (its ranks, when not '[]', bound the world size); it is kept under ''."""
    out: dict[str, list[int]] = {}
    if not isinstance(value, dict):
        return out
    for key, conf in list(value.items())[:10_000]:
        if not isinstance(key, str) or not isinstance(conf, dict):
            continue
        ranks = _rank_list(conf.get("ranks"))
        if ranks:
            out[_pg_name(key)] = ranks
    return out


def _rank_list(value: Any) -> list[int]:
    """'[0, 1, 2]' (how the recorder writes it) or a real list."""
    if isinstance(value, str) and len(value) <= 1_000_000:
        parts = value.strip().strip("[]").split(",")
        ranks = [_int(p.strip()) for p in parts if p.strip()]
        return [r for r in ranks if r is not None and 0 <= r <= MAX_RANK]
    if isinstance(value, list | tuple):
        return [r for r in (_int(x) for x in value) if r is not None and 0 <= r <= MAX_RANK]
    return []


def _status(value: Any) -> dict[str, FlightGroupStatus]:
    out: dict[str, FlightGroupStatus] = {}
    if not isinstance(value, dict):
        return out
    for key, raw in list(value.items())[:10_000]:
        if isinstance(key, str) and isinstance(raw, dict):
            out[_pg_name(key)] = FlightGroupStatus(
                last_enqueued=_int(raw.get("last_enqueued_collective")),
                last_started=_int(raw.get("last_started_collective")),
                last_completed=_int(raw.get("last_completed_collective")),
            )
    return out


def take_dumps(
    inputs: list[Input],
) -> tuple[list[FlightDump], list[SourceInfo], list[Input]]:
    """Split the inputs: Flight Recorder dumps (read here), and the rest (logs to scan). A
    file that looks like a pickle is never scanned as text: it is a dump or it is refused; a
    JSON file that turns out not to be a dump goes back to the scan."""
    dumps: list[FlightDump] = []
    sources: list[SourceInfo] = []
    rest: list[Input] = []
    for item in inputs:
        form = None
        if item.path != "-" and not item.start and item.end is None:
            form = sniff_path(item.path)
        if form is None:
            rest.append(item)
            continue
        result = read_dump(item.path, item.display, form)
        size = _size(item.path)
        if isinstance(result, FlightDump):
            dumps.append(result)
            rank = f"rank {result.rank}" if result.rank is not None else "rank unknown"
            frames = "with frames" if result.has_frames else "no frames"
            sources.append(
                SourceInfo(
                    item.display,
                    bytes=size,
                    lines=len(result.entries),  # the records read, as a log's lines
                    status="read",
                    reason=f"Flight Recorder dump ({form}, {rank}, "
                    f"{len(result.entries)} entries, {frames})",
                )
            )
        elif form == "json":
            rest.append(item)
        else:
            sources.append(
                SourceInfo(item.display, bytes=size, status="skipped", reason=result.reason)
            )
    return dumps, sources, rest


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
