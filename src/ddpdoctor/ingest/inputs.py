"""What the user named, expanded into inputs: files, folders (walked without recursion, links to
folders followed once, loops detected), globs (`**` walked the same way) and '-'. Every path the
user named or a folder holds becomes an Input or a skipped SourceInfo with its reason: nothing
goes missing silently. Reads no file content."""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ddpdoctor.ingest.filenames import display_name
from ddpdoctor.model.records import SourceInfo

STDIN_NAME = "<stdin>"
PIPE_WAIT_S = 30.0
"""How long a named pipe, FIFO or device may stay silent (no writer yet, or a writer that
stopped writing without closing) before reading it ends with what arrived."""
HIDDEN = "hidden: its name starts with a dot (name it to read it)"


@dataclass(slots=True)
class Input:
    """One thing to read: a path on disk, or stdin; or the byte range [start, end) of a plain
    file (end None: to the end), cut just after a newline so that ranges share no line.
    `wait_s`: how long a pipe or device may stay silent (None: wait as long as it takes)."""

    path: str
    display: str
    start: int = 0
    end: int | None = None
    wait_s: float | None = PIPE_WAIT_S
    named: str | None = None
    """A section of a paste under tail's '==> path <==' (ingest/sections): that path, whose
    name tells the writer as a file's would."""
    first_line: int = 0
    """Lines of the file above the section: its lines keep the file's numbers."""
    spool: str | None = None
    """A range of stdin: the temporary file it was spooled to (ingest/spool), holding the
    range's bytes at their offset in the stream, so that it reads as the same range of one
    file would."""
    read_ahead: bytes = b""
    """Stdin (or the rest of it) only: bytes already taken from the stream to decide how to
    scan it (ingest/spool); its reader gets them first, then the stream itself."""
    head: bytes = b""
    """A later range of stdin: the start of the stream, which decides how the whole input's
    srun labels read (ingest/srun_tasks), as it does for one reader of the stream."""
    own_rank: int | None = None
    """The rank the file's start announces as its writer's, where the job's files each
    announce another (ingest/self_rank): the writer of its lines that name none."""


def reason_for(exc: OSError, what: str = "cannot read") -> str:
    """A reason people understand for an error met while expanding or opening a path."""
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.ENAMETOOLONG:
        return f"{what}: path longer than the system allows (PATH_MAX)"
    if exc.errno == errno.ELOOP:
        return f"{what}: symbolic link loop"
    return f"{what}: {exc.strerror or exc}"


class _Expansion:
    """Inputs and skipped sources of one call, deduplicated by file identity."""

    def __init__(self, wait_s: float | None) -> None:
        self.inputs: list[Input] = []
        self.problems: list[SourceInfo] = []
        self.wait_s = wait_s
        self.files: set[object] = set()
        self.folders: dict[tuple[int, int], str] = {}

    def skip(self, path: str, reason: str) -> None:
        self.problems.append(SourceInfo(display_name(path), status="skipped", reason=reason))

    def add_file(self, path: str, st: os.stat_result | None, in_folder: bool) -> None:
        """One stat per file, done by the caller: a file reached twice (through a link, two
        arguments or a folder and a glob) has one identity and is read once."""
        if st is None:  # a dangling link: reported as unreadable when it is opened
            key: object = os.path.realpath(path)
        else:
            key = (st.st_dev, st.st_ino)
            if in_folder and not stat.S_ISREG(st.st_mode):
                # a pipe or socket in a log folder would block the scan; named ones are read
                self.skip(path, "not a regular file")
                return
        if key not in self.files:
            self.files.add(key)
            self.inputs.append(Input(path=path, display=display_name(path), wait_s=self.wait_s))

    def walk(
        self,
        top: str,
        top_stat: os.stat_result,
        keep: Callable[[str], bool] | None = None,
        hidden_too: bool = False,
    ) -> None:
        """Every file below `top`, depth first in name order, with a loop: a tree 1,000 folders
        deep must not exhaust the interpreter's recursion limit. Links to folders are followed
        after the real folders, so that a folder is named by its own path and a link to it is
        the repeat. With `keep` (a glob), only entries whose path relative to `top` it accepts
        are read or reported, and hidden ones only when the pattern names some."""
        top_key = (top_stat.st_dev, top_stat.st_ino)
        # a glob sees only part of a tree: it must not stop a later full walk of the same one
        visited = self.folders if keep is None else {}
        if top_key in visited:
            return  # the same folder named twice: its files are read once
        visited[top_key] = top
        # (path, its key, index of the parent entry): the chain of parents finds loops
        chain: list[tuple[str, tuple[int, int], int]] = [(top, top_key, -1)]
        stack = [0]
        links: list[tuple[str, tuple[int, int], int]] = []
        while stack or links:
            if not stack:
                path, key, parent = links.pop(0)
                seen = visited.get(key)
                if seen is not None:
                    self.skip(path, _repeat_reason(chain, parent, key, seen))
                    continue
                visited[key] = path
                chain.append((path, key, parent))
                stack.append(len(chain) - 1)
            here = stack.pop()
            subfolders: list[int] = []
            for path, key, is_link in self._list(chain[here][0], top, keep, hidden_too):
                if is_link:
                    links.append((path, key, here))
                elif key in visited:  # a bind mount or hard-linked folder seen before
                    self.skip(path, _repeat_reason(chain, here, key, visited[key]))
                else:
                    visited[key] = path
                    chain.append((path, key, here))
                    subfolders.append(len(chain) - 1)
            stack.extend(reversed(subfolders))

    def _list(
        self, folder: str, top: str, keep: Callable[[str], bool] | None, hidden_too: bool
    ) -> Iterator[tuple[str, tuple[int, int], bool]]:
        """Adds the files of one folder, reports what cannot be read; yields its subfolders as
        (path, identity, reached through a link)."""
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self.skip(folder, reason_for(exc, "cannot read folder"))
            return
        for entry in entries:
            path = entry.path
            if top == "." and path.startswith("./"):  # as glob names them (subfolders' too)
                path = path[2:]
            wanted = keep is None or keep(os.path.relpath(path, top))
            if entry.name.startswith(".") and not hidden_too:
                if keep is None:
                    self.skip(path, HIDDEN)
                continue
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            try:
                st: os.stat_result | None = entry.stat()
            except OSError as exc:
                if is_folder:  # e.g. its path is longer than PATH_MAX
                    if wanted:
                        self.skip(path, reason_for(exc, "cannot read folder"))
                    continue
                st = None
            if is_folder and st is not None:
                yield path, (st.st_dev, st.st_ino), entry.is_symlink()
            elif wanted:
                self.add_file(path, st, in_folder=True)


def _repeat_reason(
    chain: list[tuple[str, tuple[int, int], int]], parent: int, key: tuple[int, int], seen: str
) -> str:
    """A link back to a folder above it is a loop; to any other folder read already, a repeat."""
    at = parent
    while at >= 0:
        if chain[at][1] == key:
            return f"symbolic link loop: back to {display_name(chain[at][0])}"
        at = chain[at][2]
    return f"same folder as {display_name(seen)}, read once"


def expand_paths(
    paths: list[str], wait_s: float | None = PIPE_WAIT_S
) -> tuple[list[Input], list[SourceInfo]]:
    """Expand files, folders (recursively, sorted), globs and '-' into inputs; every path that
    cannot be read comes back as a skipped source with the reason."""
    out = _Expansion(wait_s)
    for raw in paths:
        if raw == "-":
            out.inputs.append(Input(path="-", display=STDIN_NAME, wait_s=None))
            continue
        if not os.path.lexists(raw) and glob.has_magic(raw):
            before = len(out.inputs) + len(out.problems)
            _expand_glob(out, raw)
            if len(out.inputs) + len(out.problems) == before:
                out.skip(raw, "no file matches")
            continue
        _expand_one(out, raw)
    from ddpdoctor.ingest.sections import split_sections  # it reads Input

    out.inputs = split_sections(out.inputs)
    problems: list[SourceInfo] = []
    seen: set[tuple[str, str | None]] = set()
    for problem in out.problems:  # a loop met by a folder and by a glob over it is one problem
        if (problem.path, problem.reason) not in seen:
            seen.add((problem.path, problem.reason))
            problems.append(problem)
    return out.inputs, problems


def _expand_one(out: _Expansion, path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            out.skip(path, "cannot read: the symbolic link points to nothing")
        else:
            out.skip(path, reason_for(exc))
        return
    if stat.S_ISDIR(st.st_mode):
        out.walk(path, st)
    else:
        out.add_file(path, st, in_folder=False)


def _expand_glob(out: _Expansion, pattern: str) -> None:
    """A pattern without a `**` component is the standard library's glob (one folder level per
    component); with one, what comes before it is globbed and each folder found is walked like a
    folder named on the command line, its paths matched against the rest of the pattern."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        for path in sorted(glob.glob(pattern)):
            _expand_one(out, path)
        return
    cut = parts.index("**")
    prefix = os.sep.join(parts[:cut]) or ("." if cut == 0 else os.sep)
    rest = parts[cut:]
    matcher = re.compile(_glob_regex(rest))
    hidden = any(p.startswith(".") for p in rest)
    bases = sorted(glob.glob(prefix)) if glob.has_magic(prefix) else [prefix]
    for base in bases:
        try:
            st = os.stat(base)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # a missing base: "no file matches" says enough
                out.skip(base, reason_for(exc, "cannot read folder"))
            continue
        if stat.S_ISDIR(st.st_mode):
            out.walk(
                base, st, keep=lambda rel: matcher.fullmatch(rel) is not None, hidden_too=hidden
            )


def _glob_regex(parts: list[str]) -> str:
    """Path components of a glob as a regex over a relative path: `**` is any number of folders
    (or, last, anything below), `*` and `?` stay inside one name, names starting with a dot are
    matched only by components that start with one (as glob does)."""
    pieces: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            pieces.append(r"(?:(?!\.)[^/]+(?:/(?!\.)[^/]+)*)?" if last else r"(?:(?!\.)[^/]+/)*")
            continue
        head = "" if part.startswith(".") else r"(?!\.)"
        pieces.append(head + _name_regex(part) + ("" if last else "/"))
    return "".join(pieces)


def _name_regex(part: str) -> str:
    """One name of a glob (`*`, `?`, `[...]`, `[!...]`) as a regex that stays inside the name."""
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        close = _class_close(part, i) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif close > 0:
            body = part[i + 1 : close]
            negate = body[:1] in ("!", "^")
            members = "".join(re.escape(ch) if ch != "-" else "-" for ch in body[negate:])
            out.append(("(?!/)[^" if negate else "[") + members + "]")
            i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _class_close(part: str, start: int) -> int:
    """Index of the `]` closing the class that opens at `start`, or -1 (then `[` is literal)."""
    first = start + 1
    if part[first : first + 1] in ("!", "^") and first < len(part):
        first += 1
    return part.find("]", first + 1) if first < len(part) else -1
