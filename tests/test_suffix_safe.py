"""The scan skips parsing a plain candidate line when a suffix-safe regex finds nothing in it
(engine.suffix_safe, Scanner._confirm). That is only right if a match in the parsed message
(a suffix of the line) is always a match in the line: checked here on every real log line the
repository keeps, for every pattern the scan confirms."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.engine import plain_line, suffix_safe
from ddpdoctor.analysis.parallel import _scanner
from ddpdoctor.ingest.prefixes import parse_line
from tests.conftest import REPO, tier_sample


@pytest.mark.parametrize(
    ("regex", "safe"),
    [
        (r"Timed out\b", True),  # an assertion after a consumed character sees shared text
        (r"[Ff]ailed to (?:decode|load)", True),
        (r"\dx", True),
        (r"[]a]b", True),
        (r"[^]a]b", True),
        (r"(?i)nccl error", True),
        (r"a(b|c)", True),
        (r"\bfoo", False),  # at the message's start, \b sees no character before it
        (r"^foo", False),
        (r"\Afoo", False),
        (r"f?oo", False),  # may consume nothing first
        (r"x*y", False),
        (r"x{0,3}y", False),
        (r"foo|\bbar", False),  # another branch may open with an assertion
        (r"(foo)", False),
        (r"a(?<![=/])b", False),  # a lookbehind may reach before the message
        (r"(?m)x", False),
        (r"\1x", False),
        (r"[ab", False),
    ],
)
def test_suffix_safe_reads_regexes_conservatively(regex: str, safe: bool) -> None:
    assert suffix_safe(regex) is safe


def _real_lines() -> list[str]:
    lines: list[str] = []
    logs = [
        *(REPO / "corpus" / "cases").glob("*/logs/**/*"),
        *(REPO / "tests" / "fixtures" / "real").rglob("*.log"),
        *(REPO / "src" / "ddpdoctor" / "scenarios").rglob("*.log"),
    ]
    for log in sorted(logs):
        if log.is_file():
            data = log.read_bytes()
            lines.extend(
                raw.decode("ascii")
                for raw in data.split(b"\n")
                if raw and plain_line(raw) and raw.isascii()
            )
    return tier_sample(lines)


def test_no_match_in_a_plain_line_means_none_in_its_message() -> None:
    scanner = _scanner("auto")
    regexes = [
        t.signature.compiled if t.signature else t.fact.compiled
        for t, safe in zip(scanner._targets, scanner._suffix_safe, strict=True)
        if safe and (t.signature or t.fact)
    ]
    assert len(regexes) > 200  # most of the knowledge base takes the shortcut
    lines = _real_lines()
    assert len(lines) > 10_000
    checked = 0
    for raw in lines:
        message = parse_line(raw).text
        if message == raw:
            continue  # no prefix: nothing to compare
        assert raw.endswith(message)
        for regex in regexes:
            if regex.search(message) is not None:
                checked += 1
                assert regex.search(raw) is not None, (regex.pattern, raw)
    assert checked > 1_000


def test_reports_the_same_with_the_shortcut_on_and_off(tmp_path: Path) -> None:
    """A generated dense log with real error lines: the report does not depend on it."""
    from benchmarks.generate import slurm_writers, write_dense

    from ddpdoctor.analysis.diagnose import diagnose_paths
    from ddpdoctor.report.to_json import report_to_dict

    log = tmp_path / "dense.log"
    write_dense(log, 6 * 1024 * 1024, 5, 0.2, slurm_writers(16), errors=80)
    scanner = _scanner("auto")
    with_it = report_to_dict(diagnose_paths([str(log)], jobs=1))
    saved = scanner._suffix_safe
    scanner._suffix_safe = [False] * len(saved)
    try:
        without = report_to_dict(diagnose_paths([str(log)], jobs=1))
    finally:
        scanner._suffix_safe = saved
    assert with_it["verdict"]["status"] == "failed"
    assert with_it == without
