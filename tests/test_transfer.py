"""Scans cross from worker processes to the parent as pickles of their fields: the parent gets
values equal to the worker's, shared objects still shared, and a class whose fields __init__
cannot rebuild is refused where it is declared."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ddpdoctor.analysis.parallel import scan_inputs
from ddpdoctor.ingest.sources import expand_paths
from ddpdoctor.model.records import Origin, Record
from ddpdoctor.model.transfer import by_fields

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def test_a_record_comes_back_equal_and_shares_what_it_shared() -> None:
    origin = Origin(rank=3, local_rank=1, host="node7", pid=4242)
    when = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    records = [Record("a.log", n, "text", origin, when, "error", "a.log|[rank3]:") for n in (1, 2)]
    back = pickle.loads(pickle.dumps(records))
    assert back == records
    assert back[0].origin is back[1].origin


def test_the_scans_of_real_runs_come_back_equal() -> None:
    inputs, _ = expand_paths([str(p) for p in sorted(REAL.iterdir())[:20]])
    scans = scan_inputs(inputs, jobs=1)
    assert any(scan.hits for scan in scans)
    assert pickle.loads(pickle.dumps(scans)) == scans


def test_a_field_outside_init_is_refused() -> None:
    with pytest.raises(TypeError):

        @by_fields
        @dataclass(slots=True)
        class Derived:
            a: int
            b: int = field(init=False, default=0)
