"""A paste of several files headed by tail's '==> path <==' is read as those files
(ingest/sections): real multi-file captures pasted that way keep their verdict, and evidence
names the section and the paste's own line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.inputs import Input
from ddpdoctor.ingest.sections import MAX_INPUTS, split_sections
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def _as_tail_output(capture: Path, out: Path) -> Path:
    """`tail -n +1 $(find CAPTURE -type f)`: each file under its header, a blank line between."""
    parts: list[bytes] = []
    for f in sorted(p for p in capture.rglob("*") if p.is_file()):
        body = f.read_bytes()
        parts.append(b"==> " + str(f.relative_to(capture)).encode() + b" <==\n" + body)
    paste = out / "paste.txt"
    paste.write_bytes(b"\n".join(parts))
    return paste


@pytest.mark.parametrize(
    "capture",
    ["eighth-iters-done", "twentyseventh-thin-r2", "third-slow-rank", "fourth-sharded-ok"],
)
def test_a_tail_paste_of_a_capture_keeps_its_verdict(capture: str, tmp_path: Path) -> None:
    want = diagnose_paths([str(REAL / capture)]).verdict
    got = diagnose_paths([str(_as_tail_output(REAL / capture, tmp_path))]).verdict
    assert (got.status, got.kind, got.culprit.ranks) == (want.status, want.kind, want.culprit.ranks)


def test_evidence_names_the_section_and_the_pastes_line(tmp_path: Path) -> None:
    paste = _as_tail_output(REAL / "twentyseventh-thin-r2", tmp_path)
    report = diagnose_paths([str(paste)])
    lines = paste.read_bytes().split(b"\n")
    quoted = [e for f in report.findings for e in f.evidence if "op.preamble.length" in e.text]
    assert quoted
    for e in quoted:
        assert e.source.startswith(f"{paste} [") and e.source.endswith("]")
        assert b"op.preamble.length" in lines[e.line - 1]


def test_only_a_header_at_the_start_splits_a_file(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\n==> other.log <==\nstep 2\n")
    plain = tmp_path / "arrow.log"
    plain.write_bytes(b"==> not a header\nstep 1\n")
    inputs = [Input(str(log), str(log)), Input(str(plain), str(plain))]
    assert split_sections(inputs) == inputs


def test_many_inputs_are_not_opened(tmp_path: Path) -> None:
    paste = tmp_path / "paste.txt"
    paste.write_bytes(b"==> rank1.log <==\nstep 1\n")
    inputs = [Input(str(paste), str(paste))] * (MAX_INPUTS + 1)
    assert split_sections(inputs) == inputs
    (section,) = split_sections(inputs[:1])
    assert (section.named, section.start, section.end, section.first_line) == (
        "rank1.log",
        18,
        None,
        1,
    )
