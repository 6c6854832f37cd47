"""The exported signature set: rg accepts every pattern, and each still matches the rule's own
positive examples (dropping look-arounds may widen a pattern, never narrow it). The benchmark
runs rg --no-unicode (bytes, ASCII classes), so the patterns are checked as bytes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddpdoctor.rules.export import rg_regex
from ddpdoctor.rules.registry import all_rules
from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("python", "exported"),
    [
        (r"(?P<rank>\d+) failed", r"(\d+) failed"),
        (r"(?i:\bearly stop)\b(?![_=(:])", r"(?i:\bearly stop)\b"),
        (r"a(?<=a)(?<!b\))c", "ac"),
        (r"x(?=[)(])y", "xy"),
        (r"[(?!]keep", r"[(?!]keep"),
        (r"\(?!not a group", r"\(?!not a group"),
        (r"said \"hi\"", 'said "hi"'),
        # rg --no-unicode: a non-ASCII character as its UTF-8 bytes; classes holding some as an
        # alternation (negated: without them, which widens); no escaped spaces
        ("Erreur\\ de\\ bus", "Erreur de bus"),
        ("段错误$", r"(?:\xE6\xAE\xB5)(?:\xE9\x94\x99)(?:\xE8\xAF\xAF)$"),
        ("[(（]x", r"(?:[(]|\xEF\xBC\x88)x"),
        ("[^()（）\\n]{1,4}", r"[^()\n]{1,4}"),
    ],
)
def test_rg_regex_cases(python: str, exported: str) -> None:
    assert rg_regex(python) == exported


def test_exported_patterns_match_every_positive_example() -> None:
    for rule in all_rules():
        for example in rule.positive:
            widened = [re.compile(rg_regex(s.regex).encode()) for s in rule.signatures]
            exact = [s.compiled for s in rule.signatures]
            if any(p.search(example) for p in exact):
                assert any(p.search(example.encode()) for p in widened), (rule.code, example)


@pytest.mark.skipif(shutil.which("rg") is None, reason="rg not installed")
def test_rg_accepts_the_exported_set(tmp_path: Path) -> None:
    patterns = tmp_path / "patterns.txt"
    assert run_cli("rules", "--export-patterns", str(patterns)).returncode == 0
    log = tmp_path / "log.txt"
    log.write_text(
        "Early stopping at epoch 5\nnothing here\n  段错误 (核心已转储)\n", encoding="utf-8"
    )
    # as `rules --help` says to run it, and as the benchmark does (with Unicode classes the
    # whole set compiles past rg's default size limit)
    proc = subprocess.run(
        ["rg", "--no-unicode", "-c", "-f", str(patterns), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout.strip() == "2"
