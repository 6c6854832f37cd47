"""Metamorphic tests on the real corpus: wrapping every line the way launchers and log
collectors do (torchrun rank prefix, Slurm label, pdsh host, Kubernetes timestamps, CRLF,
gzip, a Markdown quote or indented block, journald, a CloudWatch export) must not change the diagnosed kind. The log text itself is never altered."""

from __future__ import annotations

import gzip
import html
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import FULL_TIER, REPO, corpus_cases, tier_sample

# A rank prefix claims every line for one writer: only for logs that name no rank themselves.
RANK_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "torchrun-rank": lambda line: f"[rank5]:{line}",
    "slurm-label": lambda line: f" 5: {line}",
}
TRANSFORMS: dict[str, Callable[[str], str]] = {
    "pdsh-host": lambda line: f"worker-3: {line}",
    # GNU parallel's --tag: the job's argument (its node) and a tab
    "parallel-tag": lambda line: f"node3\t{line}",
    "k8s-time": lambda line: f"2024-05-01T10:00:00.123456789Z {line}",
    "kubectl-prefix": lambda line: f"[pod/train-worker-1/pytorch] {line}",
    "crlf": lambda line: f"{line}\r",
    # a log pasted into an issue as a Markdown quote
    "markdown-quote": lambda line: f"> {line}",
    # `journalctl -u train.service`: syslog time (no year), host, the service's process
    "journald": lambda line: f"Dec 03 16:45:33 node7 python3[4242]: {line}",
    # an export of CloudWatch Logs: the event's time, then a tab
    "cloudwatch-tab": lambda line: f"2024-05-01T10:00:00.123Z\t{line}",
    # a Markdown code block made by indenting every line four spaces
    "markdown-indent": lambda line: f"    {line}",
    # ... or pasted under a Markdown list item: two spaces
    "list-item-indent": lambda line: f"  {line}",
    # a log copied from a web page's source: '<', '>', '&' and quotes as HTML entities
    "html-escaped": lambda line: html.escape(line),
    # a log that went through a word processor, a chat or a mail: curly quotes
    "curly-quotes": lambda line: line.replace("'", "\u2019").replace('"', "\u201d"),
}


def _kind(paths: list[str]) -> str | None:
    return diagnose_paths(paths).verdict.kind


def _write(case: Path, out: Path, transform: Callable[[str], str], gz: bool = False) -> list[str]:
    written = []
    for log in sorted((case / "logs").iterdir()):
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        text = "".join(transform(line) + "\n" for line in lines)
        target = out / (log.name + (".gz" if gz else ""))
        target.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
        written.append(str(target))
    return written


@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_wrapping_lines_keeps_the_kind(case: Path, tmp_path: Path) -> None:
    label = json.loads((case / "label.json").read_text())
    base = _kind([str(case / "logs")])
    text = " ".join(p.read_text(errors="replace") for p in (case / "logs").iterdir())
    single_writer = re.search(r"(?i)\brank\s?\d|\[rank", text) is None
    transforms = {**TRANSFORMS, **(RANK_TRANSFORMS if single_writer else {})}
    for name, transform in transforms.items():
        out = tmp_path / name
        out.mkdir()
        got = _kind(_write(case, out, transform))
        assert got == base, f"{name}: {got} != {base} (label {label['kind']})"
    out = tmp_path / "gz"
    out.mkdir()
    assert _kind(_write(case, out, lambda line: line, gz=True)) == base


_HEALTHY = (
    Path(__file__).parent / "fixtures" / "real" / "healthy-noisy" / "console.log"
).read_text()
# the run up to (not including) its announced end: a job that ran fine for a while
HEALTHY_NOISE = _HEALTHY[: _HEALTHY.index("saved and reloaded checkpoint")]


@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_healthy_noise_before_the_failure_keeps_the_kind(case: Path, tmp_path: Path) -> None:
    """The start of a real healthy run (c10d INFO, DDP init, training steps) in front of each
    corpus log, as when a job runs fine for a while and then fails."""
    base = _kind([str(case / "logs")])
    for log in sorted((case / "logs").iterdir()):
        (tmp_path / log.name).write_text(HEALTHY_NOISE + log.read_text(errors="replace"))
    assert _kind([str(tmp_path)]) == base


CAPTURED = Path(__file__).parents[1] / "src" / "ddpdoctor" / "scenarios" / "captured"
PREFIX = re.compile(r"^\[rank(\d+)\]:\s?")


@pytest.mark.parametrize(
    "scenario", sorted(p.name for p in CAPTURED.iterdir() if (p / "console.log").is_file())
)
def test_console_split_into_rank_files_keeps_the_verdict(scenario: str, tmp_path: Path) -> None:
    """A real console split the way per-rank logging writes it (rank<N>.log without the
    prefix, everything else in launcher.log) gives the same kind and culprit."""
    console = CAPTURED / scenario / "console.log"
    whole = diagnose_paths([str(console)]).verdict
    files: dict[str, list[str]] = {}
    for line in console.read_text(errors="replace").splitlines():
        m = PREFIX.match(line)
        name = f"rank{m.group(1)}.log" if m else "launcher.log"
        files.setdefault(name, []).append(line[m.end() :] if m else line)
    if len(files) < 2:
        pytest.skip("no rank-prefixed lines to split")
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    split = diagnose_paths([str(tmp_path)]).verdict
    assert (split.kind, split.culprit.ranks) == (whole.kind, whole.culprit.ranks)


REAL = Path(__file__).parent / "fixtures" / "real"
COLOURED = ["twentyninth-calm-trio", "twentysecond-chatty-finish", "ninth-rss-kill", "both-fail"]


@pytest.mark.parametrize("capture", COLOURED)
def test_colour_codes_around_every_line_keep_the_verdict(capture: str, tmp_path: Path) -> None:
    """A coloured logger's codes around each line (and its empty lines: only codes) leave the
    verdict of a real capture as it was: '[rank 1] done' still ends training."""
    source = REAL / capture
    want = diagnose_paths([str(source)]).verdict
    for f in (p for p in source.rglob("*") if p.is_file()):
        target = tmp_path / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = f.read_bytes().split(b"\n")
        target.write_bytes(b"\n".join(b"\x1b[31m" + line + b"\x1b[0m" for line in lines))
    got = diagnose_paths([str(tmp_path)]).verdict
    assert (got.status, got.kind, got.culprit.ranks) == (want.status, want.kind, want.culprit.ranks)


REPO_CASES = tier_sample(
    sorted(
        p
        for p in (Path(__file__).parents[1] / "corpus" / "cases").iterdir()
        if (p / "label.json").is_file()
    )
)
"""The project's labelled corpus with logs: a stable third in `make test`, all in `make fuzz`."""


PASTE_ARTIFACTS: dict[str, Callable[[bytes], bytes]] = {
    # saved or pasted on Windows
    "crlf": lambda data: data.replace(b"\n", b"\r\n"),
    # copied from a web page or a notebook's output that double-spaced it
    "double-spaced": lambda data: data.replace(b"\n", b"\n\n"),
    # CRLF text written again through a text-mode file on Windows
    "cr-cr-lf": lambda data: data.replace(b"\n", b"\r\r\n"),
    # every line's leading blanks trimmed (a paste outside a code block, some log viewers)
    "unindented": lambda data: b"\n".join(line.lstrip() for line in data.split(b"\n")),
    # copied from an issue with its Markdown code fences
    "fenced": lambda data: b"```python\n" + data.rstrip(b"\n") + b"\n```\n",
    # copied from an issue that folded the log in <details> (the usual way to paste a long one)
    "folded": lambda data: (
        b"<details>\n<summary>Full log</summary>\n\n```\n"
        + data.rstrip(b"\n")
        + b"\n```\n</details>\n"
    ),
    # copied from a terminal or tmux/screen buffer: every line padded with blanks to the width
    "terminal-padded": lambda data: b"\n".join(line.ljust(120) for line in data.split(b"\n")),
    # copied from a rendered web page: indentation as no-break spaces
    "web-indented": lambda data: b"\n".join(
        NBSP * (len(line) - len(line.lstrip(b" "))) + line.lstrip(b" ")
        for line in data.split(b"\n")
    ),
}
NBSP = "\u00a0".encode()
CHANGED_BY = {
    # py-spy's dump: the indentation is what puts each frame under its thread
    ("unindented", "767-"): "a py-spy dump's frames are read by their indentation",
    # milabench's report quotes each rank's lines indented behind '| [rank0]:'
    ("unindented", "257-"): "milabench's quoted lines: the rank of the worker's error is lost",
    # several ranks' tracebacks one after another: where one ends is told by its indentation
    ("unindented", "1016-"): "ranks' tracebacks in a row: the culprits change",
    ("unindented", "481-"): "a rank's stderr and another's error file: the culprits change",
}
"""Cases whose verdict an artifact changes, and why: what only the artifact's absence said."""


def _stamp(index: int, digits: int) -> str:
    """The time a collector gives the index-th line: one millisecond after the one before."""
    start = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC) + timedelta(milliseconds=index)
    return start.strftime("%Y-%m-%dT%H:%M:%S.") + f"{start.microsecond:06d}000"[:digits] + "Z"


COLLECTOR_WRAPPERS: dict[str, Callable[[int, str], str]] = {
    # docker's json-file driver (and a node's container log collected as is): one record per
    # line of output, the line with its newline under "log" (its "time" left out: times a log
    # never had would change what the timing of its lines says)
    "docker-json": lambda i, line: json.dumps(
        {"log": line + "\n", "stream": "stderr"},
        ensure_ascii=False,  # (Go's encoder writes UTF-8 as it is)
    ),
    # a cloud logging export: one record per line, the line under "message"
    "json-export": lambda i, line: json.dumps(
        {"severity": "INFO", "message": line}, ensure_ascii=False
    ),
    # a CI runner's or a cloud console's time before every line (seven digits of fraction)
    "runner-time": lambda i, line: f"{_stamp(i, 7)} {line}",
}


COLLECTOR_CHANGED = {
    # py-spy dumps are files or a terminal's output, never a container's log lines
    ("docker-json", "812-"): "py-spy dumps one record per line",
    ("json-export", "812-"): "py-spy dumps one record per line",
    ("docker-json", "975-"): "py-spy dumps one record per line",
    ("json-export", "975-"): "py-spy dumps one record per line",
    # an issue's title: a traceback flattened into one line, no collector's line
    ("docker-json", "2091-"): "an issue title's one flattened line",
    ("json-export", "2091-"): "an issue title's one flattened line",
    ("runner-time", "2091-"): "an issue title's one flattened line",
    # the log had no times: the stamps (a millisecond apart) are times it never had, and the
    # elastic agent's restart then reads as coming right after the failure
    ("runner-time", "1501-"): "times the log never had",
}
"""Cases a wrapper changes, and why: wrappings no collector makes of such a text."""


@pytest.mark.parametrize("case", REPO_CASES, ids=lambda p: p.name[:60])
def test_collector_wrappers_keep_the_verdict(case: Path, tmp_path: Path) -> None:
    """Every labelled real case reads as it does when a log collector wrapped each line: a
    traceback exported one JSON record per line lost its frames' indentation and read its
    'Traceback (most recent call last):' twice (the record reader took a one-line message for
    a logged traceback), and flat frames after torch's '[rank24]: ' tag, which reindent puts
    back only where the tag starts the line, were no traceback behind a collector's time."""
    want = diagnose_paths([str(case / "logs")]).verdict
    changed: list[str] = []
    for name, wrap in COLLECTOR_WRAPPERS.items():
        if any(name == w and case.name.startswith(c) for w, c in COLLECTOR_CHANGED):
            continue
        out = tmp_path / name
        out.mkdir()
        for log in sorted((case / "logs").iterdir()):
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
            (out / log.name).write_text("".join(wrap(i, x) + "\n" for i, x in enumerate(lines)))
        got = diagnose_paths([str(out)]).verdict
        changed.extend([name] if (got.status, got.kind) != (want.status, want.kind) else [])
    assert not changed, changed


@pytest.mark.parametrize("case", REPO_CASES, ids=lambda p: p.name[:60])
def test_paste_artifacts_keep_the_verdict(case: Path, tmp_path: Path) -> None:
    """Every labelled real case with what a paste picks up reads as it does without it (but
    for CHANGED_BY): with CRLF a bare 'NotImplementedError\\r' closing a traceback was no
    exception line (the patterns end lines at '\\n'); with a blank line after each line a log
    that stops right after start-up no longer did (the blanks counted as lines after it); a
    traceback without its indentation (its frames at the start of the line), or indented with
    a web page's no-break spaces, was no traceback; and the closing fence of a paste copied
    with its Markdown fences (or folded in <details>) was every writer's last line."""
    want = diagnose_paths([str(case / "logs")]).verdict
    for name, artifact in PASTE_ARTIFACTS.items():
        if any(name == a and case.name.startswith(c) for a, c in CHANGED_BY):
            continue
        out = tmp_path / name
        out.mkdir()
        for log in sorted((case / "logs").iterdir()):
            (out / log.name).write_bytes(artifact(log.read_bytes()))
        got = diagnose_paths([str(out)]).verdict
        assert (got.status, got.kind, got.culprit.ranks) == (
            want.status,
            want.kind,
            want.culprit.ranks,
        ), name


OWN_CASES = sorted((REPO / "corpus" / "cases").iterdir())
"""The project's own labelled corpus (corpus/cases): every tenth case in `make test`, all of
them in `make fuzz`'s full tier."""


@pytest.mark.parametrize(
    "case", OWN_CASES if FULL_TIER else OWN_CASES[::10], ids=lambda p: p.name.split("-")[0]
)
def test_curly_quotes_keep_the_verdict(case: Path, tmp_path: Path) -> None:
    """Quotes a word processor or a chat curled on the way to the issue (corpus case 435's
    'instance of' c10::CUDAError between U+2018 and U+2019) read as the straight ones the
    program printed."""
    curly = {ord("'"): "\u2019", ord('"'): "\u201d"}
    for log in (case / "logs").iterdir():
        if log.is_file():
            text = log.read_text(encoding="utf-8", errors="replace")
            (tmp_path / log.name).write_text(text.translate(curly), encoding="utf-8")
    before = diagnose_paths([str(case / "logs")]).verdict
    after = diagnose_paths([str(tmp_path)]).verdict
    assert (after.status, after.kind, after.culprit.ranks) == (
        before.status,
        before.kind,
        before.culprit.ranks,
    )
