"""How many ranks announced a stop (relations.announcements): the same line in two outputs,
the console and the log file a program's logger also writes, is one announcement; two ranks'
lines are two. Lines from tests/fixtures/real/fortythird-lone-patience (nnU-Net's console and
its training_log file), the other cases composed from them."""

from __future__ import annotations

from datetime import UTC, datetime

from ddpdoctor.analysis.events import Event
from ddpdoctor.analysis.relations import announcements
from ddpdoctor.model.findings import Finding, Hit
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.rules.registry import all_rules

RULE = next(r for r in all_rules() if r.code == "EXIT101")
STOP = "Early stopping: EMA pseudo Dice did not improve by 0.5 for 1 epoch(s). Best: 0.0"
AT = datetime(2026, 12, 4, 7, 37, 0, 322850, tzinfo=UTC)


def _stop(*lines: tuple[str, str, datetime | None, int | None]) -> Event:
    hits = [
        Hit(RULE.code, Record(source, n, text, Origin(rank=rank), time=time), {})
        for n, (source, text, time, rank) in enumerate(lines, start=30)
    ]
    finding = Finding(RULE.code, RULE.kind, str(RULE.category), "", RULE.title, ranks=[])
    return Event(finding, RULE, None, hits, None)


def test_one_line_in_the_console_and_in_the_log_file_is_one_announcement() -> None:
    stop = _stop(("console.log", STOP + " ", AT, None), ("training_log.txt", STOP, AT, None))
    assert announcements(stop) == 1


def test_two_ranks_or_two_moments_are_two() -> None:
    later = AT.replace(microsecond=322999)
    assert announcements(_stop(("a.log", STOP, AT, None), ("b.log", STOP, later, None))) == 2
    assert announcements(_stop(("r0.log", STOP, AT, 0), ("r1.log", STOP, AT, 1))) == 2
    # no time to tell a copy from a second rank's line: counted
    assert announcements(_stop(("a.log", STOP, None, None), ("b.log", STOP, None, None))) == 2
