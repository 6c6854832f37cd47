"""Cross-rank analysis of Flight Recorder dumps (analysis/flight.py) on the six real captures of
tests/fixtures/real/flight-recorder, and a comparison with PyTorch's own analyzer on the same
dumps. The code lines are looked up in the program that made the captures, never typed in."""

from __future__ import annotations

import copy
import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.flight import analyze
from ddpdoctor.ingest.flight_dumps import read_dump
from ddpdoctor.model.flight import FlightAnalysis, FlightDump
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "real" / "flight-recorder"
PROGRAM = REPO / "tests" / "programs" / "flight_cases.py"


def site(statement: str, occurrence: int = 1) -> str:
    """`flight_cases.py:N` of the n-th line of the capture program holding `statement`."""
    lines = PROGRAM.read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if statement in line]
    return f"{PROGRAM.name}:{hits[occurrence - 1]}"


GRADS = site("dist.all_reduce(grads)")
BARRIER = site("dist.barrier()")


def dumps(case: str, pattern: str = "*") -> list[FlightDump]:
    out = [read_dump(str(p)) for p in sorted((FIXTURES / case / "dumps").glob(pattern))]
    assert all(isinstance(d, FlightDump) for d in out), out
    return out  # type: ignore[return-value]


def calls(a: FlightAnalysis) -> dict[int, tuple[str, int, str | None]]:
    d = a.divergences[0]
    return {c.rank: (c.op, c.seq, c.site) for c in d.calls}


def test_skip_one_all_reduce() -> None:
    """Rank 1 skips step 2's all_reduce: at #4 rank 0 is still in the loop's all_reduce while
    rank 1 already calls the final barrier. Rank 1 is the one that left the pattern."""
    a = analyze(dumps("skip"))
    d = a.divergences[0]
    assert (d.kind, d.pg, d.seq, d.fields) == ("mismatch", "0", 4, ["op"])
    assert (d.ranks, d.others, d.ambiguous) == ([1], [0], False)
    assert calls(a) == {0: ("all_reduce", 4, GRADS), 1: ("barrier", 4, BARRIER)}
    assert f"rank 1 called barrier #4 at {BARRIER}" in d.summary
    assert f"rank 1 stopped issuing all_reduce at {GRADS}" in d.summary


def test_broadcast_against_all_reduce() -> None:
    """Two ranks, two ops at #4, nothing to say which side is wrong: both are named."""
    a = analyze(dumps("op"))
    d = a.divergences[0]
    assert (d.kind, d.seq, d.fields, d.ranks, d.ambiguous) == ("mismatch", 4, ["op"], [0, 1], True)
    assert calls(a) == {
        0: ("all_reduce", 4, site("dist.all_reduce(metric)")),
        1: ("broadcast", 4, site("dist.broadcast(metric")),
    }


def test_shape_mismatch_names_the_rank_without_a_dump() -> None:
    """gloo SIGABRTs rank 1 (no Python exception, so no dump); rank 0's recorder shows the
    all_reduce of 4096 floats it was in. The logs give the world size."""
    a = analyze(dumps("shape"), world_size=2)
    assert a.ranks_with_dump == [0] and a.ranks_without_dump == [1]
    d = a.divergences[0]
    assert (d.kind, d.ranks, d.others) == ("no-dump", [1], [0])
    assert calls(a) == {0: ("all_reduce", 4, site("dist.all_reduce(stats)"))}
    assert d.calls[0].input_sizes == [[4096]]
    # without the world size from the logs, gloo's unnamed pg_config entry ('[0, 1]') gives it
    assert analyze(dumps("shape")).ranks_without_dump == [1]


def test_sleeping_rank_is_behind() -> None:
    a = analyze(dumps("sleep"))
    d = a.divergences[0]
    assert (d.kind, d.seq, d.ranks, d.others) == ("behind", 5, [1], [0])
    assert calls(a) == {0: ("barrier", 5, BARRIER), 1: ("all_reduce", 4, GRADS)}
    assert d.summary == (
        f"rank 0 called barrier #5 at {BARRIER} in default_pg; "
        f"rank 1 never did (its last was #4, all_reduce at {GRADS})"
    )


def test_sleeping_rank_from_the_worker_server_alone() -> None:
    """The worker server's JSON, asked while rank 1 slept: same ranks and ids, no code lines."""
    a = analyze(dumps("sleep", "*.fr_trace_json"))
    d = a.divergences[0]
    assert (d.kind, d.seq, d.ranks) == ("behind", 5, [1])
    assert calls(a) == {0: ("barrier", 5, None), 1: ("all_reduce", 4, None)}


def test_rank_that_died_before_a_collective() -> None:
    a = analyze(dumps("die"))
    d = a.divergences[0]
    assert (d.kind, d.seq, d.ranks) == ("behind", 3, [1])
    assert calls(a) == {0: ("all_reduce", 3, GRADS), 1: ("all_reduce", 2, GRADS)}


def test_two_groups_called_in_opposite_order() -> None:
    """Rank 0 waits in group 1 for rank 1, rank 1 waits in the default group for rank 0."""
    a = analyze(dumps("two-groups"))
    assert [d.kind for d in a.divergences] == ["group-order"]
    d = a.divergences[0]
    assert d.ranks == [0, 1] and d.ambiguous
    waits = {c.rank: (c.pg, c.op, c.seq, c.site) for c in d.calls}
    assert waits == {
        0: ("1", "all_reduce", 1, site("dist.all_reduce(loss, group=group)")),
        1: ("0", "all_reduce", 4, site("dist.all_reduce(grads)", 3)),
    }
    shown = {(row.pg, row.seq): row.diverges for row in a.table}
    assert shown[("0", 4)] and shown[("1", 1)] and not shown[("0", 3)]


@pytest.mark.parametrize("case", ["skip", "op", "sleep", "die", "two-groups"])
def test_json_form_alone_gives_the_same_divergence(case: str) -> None:
    full, bare = analyze(dumps(case, "*.pkl")), analyze(dumps(case, "*.json"))
    key = [(d.kind, d.pg, d.seq, d.ranks, d.others) for d in full.divergences]
    assert key == [(d.kind, d.pg, d.seq, d.ranks, d.others) for d in bare.divergences]
    assert all(c.site is None for d in bare.divergences for c in d.calls)


@pytest.mark.parametrize("case", ["skip", "op", "shape", "sleep", "die", "two-groups"])
def test_input_order_does_not_matter(case: str) -> None:
    base = analyze(dumps(case), world_size=2)
    for seed in range(4):
        shuffled = dumps(case)
        random.Random(seed).shuffle(shuffled)
        again = analyze(shuffled, world_size=2)
        assert [d.summary for d in again.divergences] == [d.summary for d in base.divergences]
        assert [(r.pg, r.seq) for r in again.table] == [(r.pg, r.seq) for r in base.table]


def test_a_majority_names_the_odd_rank() -> None:
    """The `op` capture with a third rank that behaves as rank 0 (its real dump, renumbered):
    now broadcast is the odd one out."""
    ds = dumps("op", "*.pkl")
    third = copy.deepcopy(next(d for d in ds if d.rank == 0))
    third.rank = 2
    d = analyze([*ds, third]).divergences[0]
    assert (d.kind, d.ranks, d.others, d.ambiguous) == ("mismatch", [1], [0, 2], False)


def test_collective_only_one_side_issued() -> None:
    """The `die` capture with two more ranks behaving as rank 1 (renumbered real dumps): the
    all_reduce #3 that only rank 0 issued is the odd one, not the three ranks behind."""
    ds = dumps("die", "*.pkl")
    extra = []
    for rank in (2, 3):
        twin = copy.deepcopy(next(d for d in ds if d.rank == 1))
        twin.rank = rank
        extra.append(twin)
    d = analyze([*ds, *extra]).divergences[0]
    assert (d.kind, d.seq, d.ranks, d.others) == ("only-some", 3, [0], [1, 2, 3])


def test_ranks_disagreeing_on_membership() -> None:
    """Real dumps whose pg_config is edited (loaded, rewritten, re-read, as field-notes says)
    so that the two ranks name different members for group 1."""
    ds = dumps("two-groups", "*.pkl")
    ds[0].members = {"1": [0, 1]}
    ds[1].members = {"1": [1, 2]}
    kinds = [d.kind for d in analyze(ds).divergences]
    assert kinds[0] == "group-config"


# ---------------------------------------------------------------------------- torch's analyzer
def _torch_details(case: str, order: list[int]) -> dict[str, dict[str, Any]]:
    """The raw dumps as torch's loader builds them, with pg_config filled: on gloo it is empty
    and the stock analyzer stops with KeyError ('0', 0) (field-notes). Every group of these
    captures holds both ranks (the program's new_group([0, 1]))."""
    out: dict[str, dict[str, Any]] = {}
    for rank in order:
        path = FIXTURES / case / "dumps" / f"rank{rank}.pkl"
        if not path.exists():
            continue
        raw = pickle.loads(path.read_bytes())  # the repo's own fixture, for torch's analyzer
        raw["pg_config"] = {
            e["process_group"][0]: {
                "name": e["process_group"][0],
                "desc": e["process_group"][1],
                "ranks": "[0, 1]",
            }
            for e in raw["entries"]
        }
        out[f"rank{rank}"] = {"rank": rank, "host_name": f"host{rank}", **raw}
    return out


def _torch_findings(case: str, order: list[int]) -> list[tuple[int, str, list[int], list[int]]]:
    """(seq, group, missing ranks, ranks torch calls culprits) of each collective that fails."""
    builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
    config = pytest.importorskip("torch.distributed.flight_recorder.components.config_manager")
    args = config.JobConfig().parse_args([])
    args.allow_incomplete_ranks = True
    details = _torch_details(case, order)
    db = builder.build_db(details, args, next(iter(details.values()))["version"])
    return [
        (
            c.collective_seq_id,
            c.group_id,
            sorted(c.missing_ranks or []),
            sorted(c.mismatch_collectives or {}),
        )
        for c in db.collectives
        if not c.pass_check or c.missing_ranks
    ]


def test_torch_analyzer_on_the_same_dumps(caplog: pytest.LogCaptureFixture) -> None:
    """Where PyTorch's analyzer and ours agree, and where they differ (README: Flight Recorder):
    - sleep, die: both name the missing rank at the same sequence id.
    - skip, op: both flag #4 of the default group; torch names as culprit whichever rank its
      input order puts second (swap the order, the culprit swaps); ours does not depend on the
      order and, for skip, names rank 1 because it left the repeated all_reduce.
    - two-groups: torch reports each group's unmatched collective separately; ours joins them
      into one group-order divergence (each rank waits where the other never came).
    - shape: with rank 1's dump missing torch cannot decide (it only logs so); ours names rank 1
      as without a dump and quotes rank 0's all_reduce of 4096 floats."""
    ours = {case: analyze(dumps(case, "*.pkl"), world_size=2) for case in FIXTURE_CASES}
    for case in ("sleep", "die"):
        d = ours[case].divergences[0]
        assert _torch_findings(case, [0, 1]) == [(d.seq, "0", d.ranks, [])]
    for case in ("skip", "op"):
        d = ours[case].divergences[0]
        assert _torch_findings(case, [0, 1]) == [(d.seq, "0", [], [1])]
        assert _torch_findings(case, [1, 0]) == [(d.seq, "0", [], [0])]  # order-dependent
    assert ours["skip"].divergences[0].ranks == [1]
    assert ours["op"].divergences[0].ranks == [0, 1]
    assert sorted(_torch_findings("two-groups", [0, 1])) == [(1, "1", [1], []), (4, "0", [0], [])]
    assert [d.kind for d in ours["two-groups"].divergences] == ["group-order"]
    assert _torch_findings("shape", [0, 1]) == []
    assert "We cannot decide what's wrong with this collective entry" in caplog.text
    assert ours["shape"].divergences[0].kind == "no-dump"


FIXTURE_CASES = ("skip", "op", "shape", "sleep", "die", "two-groups")


def test_a_dump_naming_a_huge_rank_costs_no_more_than_a_bounded_world(tmp_path: Path) -> None:
    """make fuzz: a damaged dump whose pg_config named rank 16,000,000 made the comparison
    build per-rank structures of that size (14 GB, killed by the OOM killer). The world it
    follows is bounded and says so; the table keeps the ranks with a dump and a few others."""
    from ddpdoctor.analysis import flight

    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "real" / "flight-recorder" / "op", run)
    (run / "dumps" / "rank0.pkl").unlink()  # the JSON form of the same dump is the one changed
    dump = run / "dumps" / "rank0.json"
    data = json.loads(dump.read_text())
    data["pg_config"][""]["ranks"] = "[0, 16000000]"
    dump.write_text(json.dumps(data))
    report = diagnose_paths([str(run)])
    analysis = report.job.flight
    assert analysis is not None
    assert analysis.world_size == flight.MAX_WORLD
    assert any("16,000,001 ranks" in note for note in analysis.notes)
    assert all(len(row.cells) <= 2 + flight.TABLE_GAPS for row in analysis.table)
