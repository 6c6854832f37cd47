"""The failure timeline (issue 15, section 3) on real runs: lanes per rank, the root on the
culprit's lane, arrows to the cascade, exits, a `ddpdoctor run` folder's hang and stack dumps,
thousands of ranks collapsed to the groups that behaved alike, line order without timestamps,
and secrets masked in it like everywhere else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.report.render import render
from ddpdoctor.report.timeline import (
    MAX_LANES,
    MAX_RANK_LANES,
    MAX_UNRANKED_LANES,
    build_timeline,
)
from tests.conftest import REPO, HungRun, run_cli

REAL = REPO / "tests" / "fixtures" / "real"
TIMED = REAL / "timed-data-error" / "console.log"
CAPTURED = REPO / "src" / "ddpdoctor" / "scenarios" / "captured"


def timeline_of(*paths: Path | str) -> dict[str, Any]:
    proc = run_cli("diagnose", "--format", "json", *map(str, paths))
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def lane_of(doc: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(lane for lane in doc["timeline"]["lanes"] if rank in lane["ranks"])


def marks(lane: dict[str, Any], **match: object) -> list[dict[str, Any]]:
    return [m for m in lane["marks"] if all(m[k] == v for k, v in match.items())]


def write_world(folder: Path, world: int, culprit: int) -> None:
    """A 2-rank real failure (tests/fixtures/real/timed-data-error) at the scale of `world`
    ranks, one log per rank as a cluster keeps them: the lines are the run's own, renumbered."""
    lines = TIMED.read_text().splitlines()
    steps = [line for line in lines[4:10] if "rank0" in line]
    failed, waited = lines[10:16], lines[16:26]
    for r in range(world):
        body = [line.replace("rank0", f"rank{r}") for line in steps]
        if r == culprit:
            body += [
                x.replace("rank1", f"rank{r}").replace("shard-1", f"shard-{r}") for x in failed
            ]
        else:
            body += [line.replace("rank0", f"rank{r}") for line in waited]
        (folder / f"rank{r}.log").write_text("\n".join(body) + "\n")


def test_culprit_lane_holds_the_root_and_arrows_reach_the_cascade() -> None:
    doc = timeline_of(TIMED)
    t = doc["timeline"]
    assert doc["verdict"]["culprit"]["ranks"] == [1]
    assert t["axis"] == "time" and t["start"].startswith("2026-11-30T11:26:08.542")
    first = t["lanes"][0]
    assert first["ranks"] == [1] and first["culprit"] is True
    (root,) = marks(first, role="root")
    assert root["what"] == "error" and root["rule"] == "DATA101" and root["line"] == 16
    assert root["position"] == 0.0
    rank0 = lane_of(doc, 0)
    assert not rank0["culprit"] and not marks(rank0, role="root")
    (timeout,) = marks(rank0, what="timeout")
    assert timeout["role"] == "cascade" and timeout["line"] == 26
    assert 0.8 < timeout["position"] < 0.82  # 3.03 s of the 3.72 s the marks span
    assert {"from": root["id"], "to": timeout["id"]} in t["arrows"]
    assert all(a["from"] == root["id"] for a in t["arrows"])
    exits = {lane["ranks"][0]: marks(lane, what="exit")[0]["label"] for lane in t["lanes"][:2]}
    assert exits == {1: "exit -15 (SIGTERM)", 0: "exit 1"}


@pytest.mark.real
def test_a_run_folder_shows_its_hang_and_stack_dumps(hung_run: HungRun) -> None:
    """A real 3-rank gloo job under `ddpdoctor run`: rank 1 sleeps while 0 and 2 wait in a
    barrier; the run is ended on the hang."""
    run_dir = hung_run.run_dir
    assert hung_run.proc.returncode != 0
    groups = "ranks 0,2 wait in barrier at run_train.py:36; rank 1 is sleeping at run_train.py:35"
    assert groups in (run_dir / "report.txt").read_text()  # run's own report: grouped stacks
    doc = timeline_of(run_dir)
    assert doc["verdict"]["culprit"]["ranks"] == [1]
    first = doc["timeline"]["lanes"][0]
    assert first["ranks"] == [1] and first["culprit"] and marks(first, role="root")
    for r in (0, 1, 2):
        dumps = marks(lane_of(doc, r), what="stacks")
        assert dumps and Path(dumps[0]["source"]).name == f"rank{r}.txt"
    # ranks torchrun SIGTERMs are reaped at once: their codes may go unobserved
    for r, ex in doc["job"]["exit"]["per_rank"].items():
        if ex["code"] is not None:
            assert marks(lane_of(doc, int(r)), what="exit")[0]["label"].startswith(
                f"exit {ex['code']}"
            )
    hang = [m for lane in doc["timeline"]["lanes"] for m in marks(lane, what="hang")]
    for m in hang:  # the stall `run` caught, read from its events file, on the culprit's lane
        assert Path(m["source"]).name == "events.jsonl" and 1 in m["ranks"]
    html = run_cli("diagnose", "--format", "html", str(run_dir)).stdout
    assert "wait in barrier at run_train.py:36" in html


def test_thousands_of_ranks_share_lanes_by_behaviour(tmp_path: Path) -> None:
    write_world(tmp_path, 1024, culprit=700)
    doc = timeline_of(tmp_path)
    t = doc["timeline"]
    assert doc["verdict"]["culprit"]["ranks"] == [700]
    assert t["grouped"] is True and t["ranks"] == 1024
    assert len(t["lanes"]) == 2
    culprit, others = t["lanes"]
    assert culprit["ranks"] == [700] and culprit["culprit"]
    assert marks(culprit, role="root")[0]["rule"] == "DATA101"
    assert len(others["ranks"]) == 1023 and others["label"] == "ranks 0-699,701-1023 (1023)"
    (timeout,) = marks(others, what="timeout")
    assert timeout["role"] == "cascade" and len(timeout["ranks"]) == 1023
    assert t["arrows"] == [{"from": marks(culprit, role="root")[0]["id"], "to": timeout["id"]}]
    html = run_cli("diagnose", "--format", "html", str(tmp_path)).stdout
    assert html.count('<g class="lane') == 2  # 1024 ranks, two lanes drawn


def test_groups_are_capped_when_ranks_behave_in_many_ways(tmp_path: Path) -> None:
    """Each rank of a 64-rank world with its own failure line: too many behaviours for a lane
    each; the picture stays bounded and the culprit keeps its lane."""
    write_world(tmp_path, 64, culprit=5)
    report = diagnose_paths([str(tmp_path)])
    t = build_timeline(report)
    assert t.grouped and len(t.lanes) <= MAX_LANES + 1
    assert t.lanes[0].ranks == [5] and t.lanes[0].culprit
    assert sorted(r for lane in t.lanes for r in lane.ranks) == list(range(64))
    assert MAX_RANK_LANES < 64


def test_logs_without_timestamps_are_laid_out_in_line_order() -> None:
    log = CAPTURED / "data-error" / "console.log"
    text = log.read_text()
    report = diagnose_paths([str(log)])
    t = build_timeline(report)
    has_time = any(m.time for lane in t.lanes for m in lane.marks)
    assert t.axis == ("time" if has_time else "order")
    positioned = [m for lane in t.lanes for m in lane.marks if m.what != "exit" and m.line]
    assert positioned
    for m in positioned:
        assert 0.0 <= m.position <= 1.0
    if t.axis == "order":
        total = len(text.splitlines())
        assert all(abs(m.position - m.line / total) < 0.01 for m in positioned if m.line)


@pytest.mark.parametrize("fmt", ["json", "html", "text"])
def test_secrets_in_timeline_marks_are_masked(tmp_path: Path, fmt: str) -> None:
    token = "hf_huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs"
    log = tmp_path / "console.log"
    log.write_text(
        TIMED.read_text().replace(
            "No such file or directory: '/nonexistent/shard-1.bin'",
            f"No such file or directory: '/nonexistent/shard-1.bin?token={token}'",
        )
    )
    report = diagnose_paths([str(log)])
    masked = render(report, fmt)
    raw = render(report, fmt, redact=False)
    assert token not in masked
    if fmt == "json":
        root = json.loads(masked)["timeline"]["lanes"][0]["marks"][0]
        assert "token=****" in root["text"] and root["role"] == "root"
        assert token in json.loads(raw)["timeline"]["lanes"][0]["marks"][0]["text"]


def test_lines_without_a_rank_share_lanes_across_many_hosts(tmp_path: Path) -> None:
    """torchrun's own lines (no rank) from 8 nodes, each its run's lines with its own pids:
    hosts whose launcher said the same share one lane."""
    lines = TIMED.read_text().splitlines()[26:28]  # SIGTERM sent, a worker failed
    for k in range(8):
        node = tmp_path / f"node{k}"
        node.mkdir()
        text = "\n".join(lines).replace("27405", str(27405 + 10 * k))
        (node / "console.log").write_text(text.replace("27404", str(27404 + 10 * k)) + "\n")
    t = timeline_of(tmp_path)["timeline"]
    unranked = [lane for lane in t["lanes"] if lane["kind"] == "launcher"]
    assert 1 <= len(unranked) <= MAX_UNRANKED_LANES
    merged = next(lane for lane in unranked if len(lane["hosts"]) == 8)
    assert merged["label"] == "no rank (8 hosts)"
    assert {m["rule"] for m in merged["marks"]} == {"LCH102", "LCH103"}
