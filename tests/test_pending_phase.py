"""A writer no rank can be given that announced a long phase of work and did not step again
(StreamSummary.pending_phase): the scanner keeps the phase's line, a later progress line clears
it, and a rank that was absent from the others' wait is then read as busy with it (INF201).
Real consoles only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.phases import counted_phase, phase_of_work
from ddpdoctor.analysis.scanner import Scanner, SourceScan
from ddpdoctor.ingest.sources import Input
from ddpdoctor.rules.registry import all_rules
from tests.conftest import REPO

SCANNER = Scanner([r for r in all_rules() if r.signatures])
REAL = REPO / "tests" / "fixtures" / "real"


def _scan(path: Path) -> SourceScan:
    return SCANNER.scan(Input(str(path), str(path)))


def test_an_unranked_phase_before_the_wait_is_kept() -> None:
    """Rank 0 prints 'building token index for the vocabulary ...' with no prefix while ranks
    1-3 wait in DDP's first collective."""
    scan = _scan(REAL / "eighteenth-vocab-index" / "console.log")
    phases = [s.pending_phase for s in scan.streams.values() if s.pending_phase]
    assert [text for _, text in phases] == ["building token index for the vocabulary ..."]


def test_a_ranked_writer_keeps_no_pending_phase() -> None:
    """A rank's own words say it already (behaviour reads its last lines)."""
    scan = _scan(REAL / "eighteenth-vocab-index" / "console.log")
    assert all(s.pending_phase is None for s in scan.streams.values() if s.origin.rank is not None)


CONSOLES = sorted(p for p in REAL.glob("*/console.log") if p.stat().st_size < 200_000)


@pytest.mark.parametrize("path", CONSOLES[::7], ids=lambda p: p.parent.name)
def test_a_pending_phase_comes_after_the_writers_last_step(path: Path) -> None:
    """A step after the phase's line ends it: no writer keeps a phase announced before its
    last progress line, unless that line counts the parts of a phase (the same work under
    way: 'Evaluating ...', then 'eval 3/8'), or is the phase's own counted line, or is itself
    the last step line, one that announces a phase of work ('Saving model ... at iteration 0')."""
    for stream in _scan(path).streams.values():
        if stream.pending_phase is not None:
            line, text = stream.pending_phase
            if line < stream.last_progress_line:
                assert counted_phase(stream.last_progress_text), stream.key
            assert (
                line > stream.last_progress_line
                or counted_phase(text)
                or (counted_phase(stream.last_progress_text))
                # a step line that is itself a phase of work ('Saving model ... at iteration 0')
                or (line == stream.last_progress_line and phase_of_work(text))
            ), stream.key


def test_the_consoles_above_hold_phases_set_out_on_after_a_step() -> None:
    """The property above is not empty: some of those consoles have writers that stepped and
    then set out on a phase (13 writers with a phase, 8 of them after a step, when written)."""
    after_a_step = [
        s
        for path in CONSOLES[::7]
        for s in _scan(path).streams.values()
        if s.pending_phase is not None and s.last_progress_line
    ]
    assert len(after_a_step) >= 5


def test_the_absent_rank_is_busy_with_the_unranked_phase() -> None:
    report = diagnose_paths([str(REAL / "eighteenth-vocab-index")])
    verdict = report.verdict
    assert (verdict.kind, verdict.culprit.ranks, verdict.rule) == (
        "slow-rank-timeout",
        [0],
        "INF201",
    )
    assert any("building token index" in e.text for e in verdict.evidence)


def test_a_phase_before_the_rendezvous_of_an_unknown_world_is_no_busy_rank() -> None:
    """One process built its vocabulary and then waited for a second that never came
    ('1/2 clients joined'): no rank is known, and the line is the waiting process's own."""
    verdict = diagnose_paths([str(REAL / "seventyfirst-half-ring")]).verdict
    assert verdict.kind == "rendezvous-failure"
