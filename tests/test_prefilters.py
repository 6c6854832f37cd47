"""Word prefilters put in front of slow case-blind regexes must agree with the regex on every
line: the real logs of the corpus and fixtures, one line per alternative, and text whose
non-ASCII letters fold into ASCII ones under (?i)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.behaviour import DATA_ENDED, _said_data_ended
from ddpdoctor.analysis.phases import BUSY_PHASE, busy_phase
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.tracebacks import FRAME_LINE, _may_hold_frame
from tests.conftest import tier_sample

ROOT = Path(__file__).resolve().parent.parent
EACH_ALTERNATIVE = [
    "Saving the model to /ckpt",
    "saving into /ckpt/step_100",
    "Writing checkpoint shard 3",
    "Evaluating: 12/100",
    "VALIDATING on the held-out set",
    "starting the evaluation",
    "Validation epoch 3",
    "testing 3/10 45%|####",
    "Tokenizing dataset",
    "preprocessing shards",
    "Downloading shards",
    "Loading the checkpoint from disk",
    "building the index",
    "consolidating the optimizer state",
    "Gathering full state dict",
    "running on dataset shard 3",
    "rebuilding buckets",
    "This will take a while",
]
FOLDED = ["\u017fave model", "Evaluating \u212a", "\u017fa\u017fing state", "tol\u0130ng"]


def _real_lines() -> list[str]:
    lines: list[str] = []
    for base in (ROOT / "corpus" / "cases", ROOT / "tests" / "fixtures" / "real"):
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in (".log", ".txt", ".out", ".err", ""):
                text = path.read_bytes()[: 256 * 1024].decode("utf-8", errors="replace")
                lines.extend(text.splitlines())
    return tier_sample(lines)


def test_busy_words_agree_with_the_regex_on_real_lines() -> None:
    lines = _real_lines()
    assert len(lines) > 10_000  # the corpus is there: the test compares something
    matched = 0
    for line in lines:
        want = BUSY_PHASE.search(line) is not None
        assert busy_phase(line) == want, line
        matched += want
    assert matched > 0


@pytest.mark.parametrize("line", EACH_ALTERNATIVE + FOLDED)
def test_busy_words_agree_on_each_alternative(line: str) -> None:
    assert busy_phase(line) == (BUSY_PHASE.search(line) is not None)
    if line in EACH_ALTERNATIVE:
        assert busy_phase(line)


DATA_ENDED_ALTERNATIVES = [
    "rank 3: dataset exhausted",
    "the data loader ran out after 12 steps",
    "Shard 2 is empty",
    "input stream depleted",
    "all samples consumed",
    "ran out of batches",
    "No more data for this rank",
    "reached the end of the dataset",
    "END OF DATA LOADER",
]
DATA_ENDED_FOLDED = ["data\u017fet exhausted", "\u0130nput empty", "the data ran out \u212a"]


def test_data_ended_words_agree_with_the_regex_on_real_lines() -> None:
    matched = 0
    for line in _real_lines():
        want = DATA_ENDED.search(line) is not None
        assert _said_data_ended(line) == want, line
        matched += want
    assert matched > 0


@pytest.mark.parametrize("line", DATA_ENDED_ALTERNATIVES + DATA_ENDED_FOLDED)
def test_data_ended_words_agree_on_each_alternative(line: str) -> None:
    assert _said_data_ended(line) == (DATA_ENDED.search(line) is not None)
    if line in DATA_ENDED_ALTERNATIVES:
        assert _said_data_ended(line)


FRAMES_IN_DISGUISE = [
    'File "/w/train.py", line 9, in step',
    '[rank1]: > File "/w/train.py", line 9, in step',
    '{"message": "File \\"/w/train.py\\", line 9, in step"}',  # a JSON record's message
    '{"message": "\\u0046ile \\"/w/train.py\\", line 9, in step"}',
    'Fi\x1b[0mle "/w/train.py", line 9, in step',  # a colour code inside the word
    'Fi\x00le "/w/train.py", line 9, in step',
]


def test_a_line_without_frame_bytes_parses_to_no_frame_on_real_lines() -> None:
    """The walk back's test before parsing the line above a writer's line: whatever parsing
    makes of a line a frame line, the line holds one of the bytes looked for."""
    frames = 0
    for line in _real_lines() + FRAMES_IN_DISGUISE:
        frame = FRAME_LINE.match(parse_line(line, with_time=False).text) is not None
        frames += frame
        if frame:
            assert _may_hold_frame(line.encode("utf-8")), line
    assert frames >= len(FRAMES_IN_DISGUISE)


@pytest.mark.parametrize("line", FRAMES_IN_DISGUISE)
def test_each_disguise_is_a_frame_and_is_looked_at(line: str) -> None:
    assert FRAME_LINE.match(parse_line(line, with_time=False).text)
    assert _may_hold_frame(line.encode("utf-8"))
