"""The text report through the real command: a `file:line` is never broken across lines (a long
path loses its start, never its line number), the summary does not repeat the title, quoted
lines wrap under their indent, and the compact timeline shows the root and its cascade."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

TIMED = REPO / "tests" / "fixtures" / "real" / "timed-data-error" / "console.log"


def _deep_copy(tmp_path: Path) -> Path:
    """The real log under a path longer than any report width."""
    deep = tmp_path / "cluster-logs" / "job-4711-llama-70b-pretraining" / "attempt_0" / "node-07"
    deep.mkdir(parents=True)
    log = deep / "console.log"
    shutil.copy(TIMED, log)
    return log


def _panel(text: str, title: str) -> list[str]:
    """The inner lines of a rich panel, borders and the one space of padding removed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line and line.startswith("╭"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    return [line[2:-2] for line in lines[start + 1 : end]]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_file_line_is_never_broken(tmp_path: Path, width: int) -> None:
    log = _deep_copy(tmp_path)
    assert len(str(log)) > 100
    proc = run_cli("diagnose", str(log), "--width", str(width))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= width
    json_proc = run_cli("diagnose", str(log), "--format", "json")
    import json

    doc = json.loads(json_proc.stdout)
    wanted = {e["line"] for e in doc["verdict"]["evidence"]}
    wanted |= {f["evidence"][0]["line"] for f in doc["findings"]}
    for line_no in wanted:
        assert re.search(rf"console\.log:{line_no}\b", out), line_no
    # no line holds a piece of a location cut by wrapping
    assert not re.search(r"^[│┃ ]*\d+\s*[│┃]?\s*$", out, re.M)
    assert not re.search(r"console\.lo[│┃ ]*$|console\.log:[│┃ ]*$", out, re.M)


def test_summary_does_not_repeat_the_title() -> None:
    proc = run_cli("diagnose", str(TIMED))
    verdict = _panel(proc.stdout, "ddpdoctor verdict")
    title = "A rank failed on its input data (missing, corrupt or undecodable file)"
    assert verdict[1].strip() == title
    body = " ".join(line.strip() for line in verdict[2:])
    assert title not in body
    assert body.count("Culprit: rank 1") == 1
    assert "A path that exists only on some nodes" in body  # the summary's second sentence


def test_evidence_continuation_lines_are_indented() -> None:
    proc = run_cli("diagnose", str(TIMED), "--width", "80")
    evidence = _panel(proc.stdout, "Evidence")
    quoted = [line for line in evidence if line.strip()]
    locations = [line for line in quoted if re.match(r"\S+console\.log:\d+", line)]
    assert len(locations) >= 3
    for line in quoted:
        assert line in locations or line.startswith("  "), line
    # the long gloo line really wrapped, and its second part is indented too
    i = next(i for i, line in enumerate(evidence) if "unbound_buffer" in line)
    assert evidence[i + 1].startswith("  ") and evidence[i + 1].strip()


def test_compact_timeline_names_root_and_cascade() -> None:
    out = run_cli("diagnose", str(TIMED)).stdout
    block = out[out.index("Timeline from 2026-11-30 11:26:08.542 UTC") :].splitlines()
    rank1 = next(line for line in block if line.lstrip().startswith("rank 1"))
    rank0 = next(line for line in block if line.lstrip().startswith("rank 0"))
    assert "<" in rank1 and "ROOT error DATA101" in rank1 and "exit -15 (SIGTERM)" in rank1
    assert "+3.03 s timeout TMO102 (cascade)" in rank0
    assert "ROOT" not in rank0


def test_fix_steps_keep_their_brackets() -> None:
    """A fix quotes code ('flag = torch.tensor([int(stop)])'): the text report printed it as
    rich markup, which dropped '[int(stop)]' as an unknown tag. A real mp.spawn run whose rank
    1 left alone (fixture spawn-left-alone)."""
    log = REPO / "tests" / "fixtures" / "real" / "spawn-left-alone" / "console.log"
    proc = run_cli("diagnose", str(log), "--width", "200")
    assert "flag = torch.tensor([int(stop)]); dist.broadcast(flag, 0)" in proc.stdout
