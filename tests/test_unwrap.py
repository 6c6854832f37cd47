"""Lines a terminal hard-wrapped at its width are joined again (ingest/unwrap), on real pastes
of the corpus whose watchdog lines were cut mid-number, and never on logs whose longest lines
are whole (the same long NCCL line printed by several ranks, a download log's lines, prose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.unwrap import (
    compose,
    dedent,
    original_line,
    reindent,
    undouble,
    unnumber,
    unwrap,
)
from tests.conftest import FULL_TIER, REPO, run_cli

CASES = REPO / "corpus" / "cases"


def _log(prefix: str) -> Path:
    return next(p for p in (next(CASES.glob(prefix)) / "logs").iterdir() if p.is_file())


@pytest.mark.parametrize("prefix", ["824-*", "878-*", "482-*"])
def test_watchdog_lines_cut_at_the_terminal_width_are_joined(prefix: str) -> None:
    data = _log(prefix).read_bytes()
    joined, merges = unwrap(data)
    assert merges
    lines = joined.decode().split("\n")
    watchdog = [line for line in lines if "Watchdog caught collective operation timeout" in line]
    assert watchdog and all("milliseconds before timing out" in line for line in watchdog)
    # each joined line is numbered as the file's line its first piece is on
    physical = data.decode().split("\n")
    for number, line in enumerate(lines, start=1):
        first = physical[original_line(number, merges) - 1]
        assert line.startswith(first.removesuffix("\r")), (number, line[:60], first[:60])


@pytest.mark.parametrize(
    "path",
    [
        # the longest lines are two whole 'Downloading ... .gz' lines, each followed by a whole
        # 'Extracting ...' line
        _log("444-*"),
        # two ranks' identical 'NCCL INFO 24 coll channels ...' lines, each followed by a
        # UCX 'Caught signal 7' line
        _log("224-*"),
        # prose wrapped at word boundaries by an editor
        REPO / "tests" / "fixtures" / "real" / "accelerate-worker-killed-reset" / "README.md",
    ],
    ids=["downloads", "same-nccl-line", "prose"],
)
def test_whole_long_lines_are_not_joined(path: Path) -> None:
    data = path.read_bytes()
    assert unwrap(data) == (data, ())


def test_evidence_quotes_the_joined_line_at_its_own_line_number() -> None:
    report = diagnose_paths([str(next(CASES.glob("878-*")) / "logs")])
    quoted = [e for f in report.findings for e in f.evidence if "Watchdog caught" in e.text]
    assert quoted and quoted[0].line == 13
    assert "NumelIn=185614592" in quoted[0].text


def test_among_many_rank_files_nothing_is_joined(tmp_path: Path) -> None:
    """Thousands of files are a program's own logs, never a terminal's paste: not looked at."""
    from ddpdoctor.ingest.sources import ChunkStream, Input

    log = tmp_path / "rank0.log"
    log.write_bytes(_log("824-*").read_bytes())
    kept = ChunkStream(Input(str(log), str(log)), join_wrapped=False)
    assert list(kept) == [log.read_bytes()] and kept.merges == ()
    joined = ChunkStream(Input(str(log), str(log)))
    assert list(joined) != [log.read_bytes()] and joined.merges


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # a Markdown code block indented by four spaces (a blank line inside keeps its own)
        (b"    [rank1]: Traceback\n\n      File 'x'\n", b"[rank1]: Traceback\n\n  File 'x'\n"),
        (b"\tINFO step 1\n\tINFO step 2\n", b"INFO step 1\nINFO step 2\n"),
        # a traceback's frames pasted without their head share only two spaces: kept
        (b'  File "a.py", line 1\n    f()\n', b'  File "a.py", line 1\n    f()\n'),
        # ... but a whole log under a list item shares two spaces too (corpus cases 365, 481,
        # 1353): its traceback's head and exception line stand at those two
        (
            b'  Traceback (most recent call last):\n    File "a.py", line 1\n      f()\n'
            b"  RuntimeError: NCCL error\n",
            b'Traceback (most recent call last):\n  File "a.py", line 1\n    f()\n'
            b"RuntimeError: NCCL error\n",
        ),
        (b"  INFO step 1\n  INFO step 2\n", b"INFO step 1\nINFO step 2\n"),
        # a log whose first line is not indented, blanks only, tabs and spaces mixed: kept
        (b"step 1\n    step 2\n", b"step 1\n    step 2\n"),
        (b" \n\t\n  \n", b" \n\t\n  \n"),
        (b"    a\n\tb\n", b"    a\n\tb\n"),
    ],
)
def test_the_indentation_every_line_shares_is_removed(text: bytes, want: bytes) -> None:
    assert dedent(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # cat -n (blank lines numbered too), less -N (a line that starts with a tab), nl (blank
        # lines not numbered)
        (b"     7\tW1130 step\n     8\t\n     9\tINFO x\n", b"W1130 step\n\nINFO x\n"),
        (b"      1 a\n      2 \tb\n      3 c\n", b"a\n\tb\nc\n"),
        (b"     1\ta\n\n     2\tb\n     3\tc\n", b"a\n\nb\nc\n"),
        # numbers that do not count the lines: srun labels, a log's own counters; too few
        (b"0: a\n1: b\n0: c\n1: d\n", b"0: a\n1: b\n0: c\n1: d\n"),
        (
            b"10 step loss 0.5\n20 step loss 0.4\n30 step loss 0.3\n",
            b"10 step loss 0.5\n20 step loss 0.4\n30 step loss 0.3\n",
        ),
        (b"1 a\n2 b\n", b"1 a\n2 b\n"),
        # a web viewer's or an editor's gutter: a bar after the number
        (b"   98 | W1130 step\n   99 | \n  100 | INFO x\n", b"W1130 step\n\nINFO x\n"),
        (b"  1 \xe2\x94\x82 a\n  2 \xe2\x94\x82 b\n  3 \xe2\x94\x82 c\n", b"a\nb\nc\n"),
        # a colon after the number (grep -n ''): only over ten lines, as srun labels four
        # tasks the same way, one line each
        (
            b"".join(b"%d: line %d\n" % (n, n) for n in range(1, 12)),
            b"".join(b"line %d\n" % n for n in range(1, 12)),
        ),
        (b"0: a\n1: b\n2: c\n3: d\n", b"0: a\n1: b\n2: c\n3: d\n"),
        # separators that differ from line to line: not one viewer's gutter
        (b"1 | a\n2: b\n3 c\n", b"1 | a\n2: b\n3 c\n"),
        # grep -n keeps the lines it found: numbers that grow with gaps, the text right after
        # the colon (srun's labels have a space there)
        (
            b"812:[rank1]: Traceback (most recent call last):\n1040:[rank1]: RuntimeError: x\n"
            b"1203:[rank0]: RuntimeError: y\n",
            b"[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: x\n"
            b"[rank0]: RuntimeError: y\n",
        ),
        (b"1:100%|#| 36/36\n2:INFO a\n3:INFO b\n", b"100%|#| 36/36\nINFO a\nINFO b\n"),
        # a time's hour is no line number, though hours grow
        (b"09:59:58 a\n10:00:01 b\n11:00:00 c\n", b"09:59:58 a\n10:00:01 b\n11:00:00 c\n"),
        (b"3:a\n3:b\n5:c\n", b"3:a\n3:b\n5:c\n"),
    ],
)
def test_a_viewers_line_numbers_are_removed(text: bytes, want: bytes) -> None:
    assert unnumber(text) == want


@pytest.mark.parametrize("gutter", [b"%6d\t", b"%5d | ", b"%d: "])
@pytest.mark.parametrize("capture", ["fifth-abba", "left-alone-exit-abort"])
def test_a_capture_shown_with_line_numbers_keeps_its_verdict(
    tmp_path: Path, gutter: bytes, capture: str
) -> None:
    """A real capture as `cat -n`, a web viewer's gutter or `grep -n ''` shows it: the verdict
    of the capture itself."""
    source = REPO / "tests" / "fixtures" / "real" / capture / "console.log"
    lines = source.read_bytes().split(b"\n")
    numbered = tmp_path / "console.log"
    numbered.write_bytes(b"\n".join(gutter % n + line for n, line in enumerate(lines, 1)))
    want = diagnose_paths([str(source)]).verdict
    got = diagnose_paths([str(numbered)]).verdict
    assert (got.status, got.kind, got.culprit.ranks) == (want.status, want.kind, want.culprit.ranks)


@pytest.mark.parametrize("prefix", ["1597-*", "824-*", "653-*"])
def test_a_double_spaced_paste_loses_its_blank_lines_and_keeps_its_numbers(prefix: str) -> None:
    """A real log with a blank line after each line (824's lines are also cut at a terminal's
    width; 653 is an IPython traceback, which has blank lines of its own)."""
    data = _log(prefix).read_bytes()
    doubled = data.replace(b"\n", b"\n\n")
    single, blanks = undouble(doubled)
    texts = [line for line in data.split(b"\n") if line.strip(b" \t\r")]
    assert single == b"\n".join(texts) + (b"\n" if data.endswith(b"\n") else b"")
    joined, joins = unwrap(single)
    merges = compose(joins, blanks)
    physical = doubled.decode().split("\n")
    for number, line in enumerate(joined.decode().split("\n")[:-1], start=1):
        first = physical[original_line(number, merges) - 1]
        assert first.strip() and line.startswith(first), (number, line[:60], first[:60])


@pytest.mark.parametrize("prefix", ["653-*", "444-*", "224-*"])
def test_blank_lines_of_a_log_itself_stay(prefix: str) -> None:
    """Blank lines between some of a log's lines (a traceback's, a download's) are not a
    double-spaced paste."""
    data = _log(prefix).read_bytes()
    assert undouble(data) == (data, ())


def test_a_traceback_pasted_without_its_indentation_is_indented_again() -> None:
    """352's paste lost the indentation of mp.spawn's traceback: frames and code at the start
    of the line. They come back as Python prints them; the exception line stays."""
    data = _log("352-*").read_bytes()
    lines = reindent(data).decode().split("\n")
    frames = [line for line in lines if 'File "' in line]
    assert frames and all(line.startswith('  File "') for line in frames)
    code = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith('  File "')]
    assert all(line.startswith("    ") for line in code)
    assert lines[-2].startswith("ValueError: host not found") or lines[-1].startswith("ValueError")


@pytest.mark.parametrize("prefix", ["653-*", "444-*", "878-*"])
def test_indented_tracebacks_and_other_logs_are_left_as_they_are(prefix: str) -> None:
    data = _log(prefix).read_bytes()
    assert reindent(data) == data


@pytest.mark.parametrize("prefix", ["246-*", "1597-*"])
def test_a_paste_piped_in_is_read_as_the_same_paste_in_a_file(prefix: str, tmp_path: Path) -> None:
    """`pbpaste | ddpdoctor diagnose -`: a real log trimmed of its indentation (246, a cut
    traceback) and double-spaced (1597, a start-up that stops) reads the same from stdin as
    from a file; stdin skipped the paste repairs (246 read as 'unknown: hang' there)."""
    raw = _log(prefix).read_bytes()
    data = b"\n".join(line.lstrip() for line in raw.split(b"\n")).replace(b"\n", b"\n\n")
    pasted = tmp_path / "paste.log"
    pasted.write_bytes(data)
    from_file = json.loads(run_cli("diagnose", str(pasted), "--format", "json").stdout)
    from_stdin = json.loads(run_cli("diagnose", "-", "--format", "json", stdin=data).stdout)
    want = diagnose_paths([str(_log(prefix).parent)]).verdict
    for got in (from_file["verdict"], from_stdin["verdict"]):
        assert (got["status"], got["kind"], got["rule"]) == (want.status, want.kind, want.rule)


def test_bracketed_line_numbers_are_a_viewers_not_ranks() -> None:
    """'[1] ', '[2] ', '[3] ' counting up line by line are a viewer's numbers, taken away; the
    same brackets repeating a few numbers are Hydra's rank labels, kept."""
    numbered = b"[1] epoch 1 step 1\n[2] epoch 1 step 2\n[3] Traceback (most recent call last):\n"
    assert (
        unnumber(numbered)
        == b"epoch 1 step 1\nepoch 1 step 2\nTraceback (most recent call last):\n"
    )
    ranks = b"[0] epoch 1\n[1] epoch 1\n[0] epoch 2\n[1] epoch 2\n"
    assert unnumber(ranks) == ranks


GUTTERS = {"cat -n": b"%6d\t", "viewer": b"%4d | ", "web viewer": b"[%d] ", "grep -n": b"%d:"}
NUMBERED_CASES = sorted((REPO / "corpus" / "cases").iterdir())
"""Every tenth case of the project's corpus in `make test`, all in `make fuzz`'s full tier;
pastes of fewer than three lines aside (nobody numbers one line, and it tells no gutter)."""


@pytest.mark.parametrize(
    "case", NUMBERED_CASES if FULL_TIER else NUMBERED_CASES[::10], ids=lambda p: p.name[:5]
)
def test_numbered_corpus_cases_keep_their_verdicts(case: Path, tmp_path: Path) -> None:
    logs = [p for p in (case / "logs").iterdir() if p.is_file()]
    texts = {p.name: p.read_bytes() for p in logs}
    if any(len([x for x in t.split(b"\n") if x.strip()]) < 3 for t in texts.values()):
        pytest.skip("a paste of fewer than three lines")
    want = diagnose_paths([str(case / "logs")]).verdict
    for name, gutter in GUTTERS.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        for file, text in texts.items():
            lines = text.split(b"\n")
            (out / file).write_bytes(b"\n".join(gutter % n + x for n, x in enumerate(lines, 1)))
        got = diagnose_paths([str(out)]).verdict
        assert (got.status, got.kind, got.culprit.ranks) == (
            want.status,
            want.kind,
            want.culprit.ranks,
        ), name
