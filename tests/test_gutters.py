"""Line numbers a viewer, an editor, `cat -n` or `grep -n` put in front of a pasted log's lines
(ingest/gutters.py) come off before anything reads the lines: the corpus' cases numbered those
ways keep their verdicts, and the numbers logs really start their lines with are left alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.gutters import gutter_of
from tests.conftest import FULL_TIER, REPO

TRACE = [
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 212, in <module>',
    "    main()",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]


def _numbered(lines: list[str], form: Callable[[int, str], str], first: int = 1) -> bytes:
    return "\n".join(form(first + i, line) for i, line in enumerate(lines)).encode()


GUTTERS: dict[str, Callable[[int, str], str]] = {
    "cat -n": lambda n, line: f"{n:>6}\t{line}",
    "viewer": lambda n, line: f"{n:>4} | {line}",
    "web viewer": lambda n, line: f"[{n}] {line}",
    "grep -n": lambda n, line: f"{n}:{line}",
}


@pytest.mark.parametrize("name", list(GUTTERS))
def test_each_gutter_is_found_and_taken_off(name: str) -> None:
    data = _numbered(TRACE, GUTTERS[name], first=2318)
    gutter = gutter_of(data)
    assert gutter is not None
    assert gutter.sub(b"", data).decode().split("\n") == TRACE


def test_grep_keeps_only_some_lines_and_their_numbers_still_grow() -> None:
    data = b"812:[rank1]: Traceback (most recent call last):\n1040:[rank1]: RuntimeError: x\n"
    data += b"1203:[rank0]: RuntimeError: y\n"
    gutter = gutter_of(data)
    assert gutter is not None and gutter.sub(b"", data).startswith(b"[rank1]: Traceback")


@pytest.mark.parametrize(
    "text",
    [
        # srun --label task ids repeat and fall back
        "0: step 1 loss 2.3\n1: step 1 loss 2.4\n0: step 2 loss 2.1\n1: step 2 loss 2.2\n",
        # times, dates and epoch seconds are no line numbers
        "10:42:01 INFO start\n10:42:02 INFO step 1\n10:42:03 INFO step 2\n",
        "2026-12-07 10:42:01,123 INFO start\n2026-12-07 10:42:02,456 INFO step 1\n"
        "2026-12-07 10:42:03,789 INFO step 2\n",
        # Hydra's -prepend-rank labels
        "[0] epoch 1\n[1] epoch 1\n[0] epoch 2\n[1] epoch 2\n",
        # tqdm bars start with their percentage
        " 10%|#         | 1/10\n 20%|##        | 2/10\n 30%|###       | 3/10\n",
        # two numbered lines are the program's own list
        "1: resnet50\n2: vit_b_16\nTraceback (most recent call last):\nKeyError: 3\n",
        # a log that starts with words
        "Starting training\n1 | 2 | 3\n2 | 3 | 4\n3 | 4 | 5\n",
    ],
)
def test_numbers_a_log_itself_starts_lines_with_are_no_gutter(text: str) -> None:
    assert gutter_of(text.encode()) is None


CASES = sorted((REPO / "corpus" / "cases").iterdir())
"""Every tenth case of the project's corpus in `make test`, all in `make fuzz`'s full tier;
single-line pastes aside (nobody numbers one line, and one line tells no gutter)."""


@pytest.mark.parametrize("case", CASES if FULL_TIER else CASES[::10], ids=lambda p: p.name[:5])
def test_numbered_corpus_cases_keep_their_verdicts(case: Path, tmp_path: Path) -> None:
    logs = [p for p in (case / "logs").iterdir() if p.is_file()]
    texts = {p.name: p.read_text(encoding="utf-8", errors="replace") for p in logs}
    if any(len([line for line in t.split("\n") if line.strip()]) < 3 for t in texts.values()):
        pytest.skip("a paste of fewer than three lines")
    before = diagnose_paths([str(case / "logs")]).verdict
    for name, form in GUTTERS.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        for file, text in texts.items():
            (out / file).write_bytes(_numbered(text.split("\n"), form))
        after = diagnose_paths([str(out)]).verdict
        assert (after.status, after.kind, after.culprit.ranks) == (
            before.status,
            before.kind,
            before.culprit.ranks,
        ), name
