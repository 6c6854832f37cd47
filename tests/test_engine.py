"""The fast engine and the stdlib fallback must find exactly the same things."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.engine import hyperscan_available
from ddpdoctor.report.to_json import report_to_dict
from tests.conftest import corpus_cases


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_same_report_with_and_without_hyperscan(case: Path) -> None:
    fast = report_to_dict(diagnose_paths([str(case / "logs")], engine="auto"))
    slow = report_to_dict(diagnose_paths([str(case / "logs")], engine="stdlib"))
    assert fast == slow


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
def test_same_report_on_generated_multi_rank_log(tmp_path: Path) -> None:
    """Several 4 MB chunks of torchrun output with tqdm bars, NCCL noise and real error lines."""
    from benchmarks.generate import write_log

    log = tmp_path / "train.log"
    write_log(log, 10 * 1024 * 1024, seed=3, ranks=list(range(8)), world=8, errors=60)
    fast = report_to_dict(diagnose_paths([str(log)], engine="auto"))
    slow = report_to_dict(diagnose_paths([str(log)], engine="stdlib"))
    assert fast["verdict"]["status"] == "failed"
    assert fast == slow


def test_a_signature_anchored_at_its_line_end_is_found_mid_chunk(tmp_path: Path) -> None:
    """A short-literal signature goes to Hyperscan as a prefilter regex: its $ must end the
    line, not the chunk. bash's 'Killed' (LCH101, '^Killed\\s*$') and Slurm's '*** STEP ... ON
    node' (LCH109) in the middle of a log were read only when they closed a chunk."""
    from ddpdoctor.analysis.scanner import Scanner
    from ddpdoctor.ingest.inputs import Input
    from ddpdoctor.rules.registry import all_rules

    log = tmp_path / "console.log"
    log.write_text(
        "epoch 1 step 3\nKilled\nepoch 2\nsrun: error: *** STEP 4242.0 ON node1\nlast line\n"
    )
    for engine in ("auto", "python"):
        scan = Scanner(list(all_rules()), engine=engine).scan(Input(str(log), str(log)))
        found = {(h.rule, h.record.line) for h in scan.hits}
        assert {("LCH101", 2), ("LCH109", 4)} <= found, (engine, found)


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
def test_slow_subset_databases_are_cached_on_disk_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subset database that was slow to compile is written beside the database of all
    patterns, and loaded by the next process (it finds the same candidates); a fast one is
    not written; a cache that holds CACHE_MAX_FILES files loses its least recently used."""
    import hyperscan

    from ddpdoctor.analysis import engine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "ddpdoctor"
    forms = [(r"NET/IB.{0,40}(?:failed|error)", hyperscan.HS_FLAG_PREFILTER)]

    def found(db: object) -> list[int]:
        hits: list[int] = []
        db.scan(  # type: ignore[attr-defined]
            b"x NET/IB : ibv_poll_cq error\n",
            match_event_handler=lambda pid, s, e, f, c: hits.append(pid),
            scratch=hyperscan.Scratch(db),
        )
        return hits

    engine._compiled_database(forms, [7], keep_slower_than_s=3600.0)
    assert not cache.exists() or not list(cache.iterdir())
    written = engine._compiled_database(forms, [7], keep_slower_than_s=1e-9)
    assert len(list(cache.iterdir())) == 1
    loaded = engine._compiled_database(forms, [7], keep_slower_than_s=1e-9)
    assert found(loaded) == found(written) == [7]
    (older,) = list(cache.iterdir())
    monkeypatch.setattr(engine, "CACHE_MAX_FILES", 1)
    engine._compiled_database(forms, [8], keep_slower_than_s=1e-9)
    (newest,) = list(cache.iterdir())  # the least recently used made room for it
    assert newest.name != older.name
    assert found(engine._compiled_database(forms, [8], keep_slower_than_s=1e-9)) == [8]
