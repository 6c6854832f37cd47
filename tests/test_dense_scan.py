"""Dense logs (issue 14): what the scan stops looking at or drops before parsing changes nothing
the analysis reads. Repeated facts are told apart on their bytes (engine.DistinctFact), a rule
past its cap is no longer looked for, the ranges of a split file and the files of a big set
share what they kept, and the collector is off while scanning. Speed is measured by `make bench`,
never here; these tests check results, and memory where it is the point."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from benchmarks.generate import init_burst, slurm_writers, stamped, write_dense, write_dense_ranks
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ddpdoctor.analysis import facts, merging, parallel, scanner
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.engine import hyperscan_available
from ddpdoctor.analysis.scanner import Scanner
from ddpdoctor.ingest.bounds import rank_number
from ddpdoctor.ingest.sources import Input
from ddpdoctor.report.to_json import report_to_dict
from ddpdoctor.rules.registry import all_rules
from tests.conftest import FULL_TIER, REPO

# A real comm line (corpus case 006, an ASR job on 16 GPUs), and lines in the formats NCCL's
# init.cc and net.cc print, as benchmarks/generate.py writes them.
REAL_COMM = (
    "asr-ddp-7f3k-train-job0-m-0:14051:14875 [0] NCCL INFO comm 0x9f2ef80 rank 8 nranks 16 "
    "cudaDev 0 busId b000 - Abort COMPLETE"
)
BODIES = [
    REAL_COMM,
    "node1:4211:4211 [3] NCCL INFO comm 0x55d3c2a1f3 rank 11 nranks 16 cudaDev 3 nvmlDev 3 "
    "busId 40000 commId 0x1f - Init START",
    # the same communicator kind on another node: same rank in group and device, other host
    "node0:4200:4200 [3] NCCL INFO comm 0x55d3c2a1f3 rank 11 nranks 16 cudaDev 3 nvmlDev 3 "
    "busId 40000 commId 0x1f - Init START",
    "node1:4211:4211 [3] NCCL INFO ncclCommInitRank comm 0x55d3c2b1f3 rank 3 nranks 8 cudaDev 3 "
    "nvmlDev 3 busId 40000 commId 0x2e localSize 8 used 5542 bytes on core 3 - Init COMPLETE",
    "node1:4211:4211 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0",
    "node0:4200:4200 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/8",
    "  world_size ...................................... 16",
    "WORLD_SIZE=4 MASTER_ADDR=node0",
]
PREFIXES = ["", "[rank3]:", "1: [rank11]:", "[default3]:", "[pod/train-w-1/pytorch] ", "0: "]
PREFIXES += ["2024-06-12T10:00:01Z [job nranks 4] "]  # a platform's tag: a value in the prefix
MESS = ["", "", "", "", "", "\x1b[0m", "\x00", "\r", "\u0661\u0666", "\u2003", "é", "x" * 4100]
MESS += [" nranks 8 ", " world_size: 2 "]  # a second value on the line


NUMBER = re.compile(r"(?:rank |nranks |cudaDev |/|=|\.\. )(\d+)")
"""The numbers job building reads (ranks, devices, world sizes)."""


def _mutated(body: str, digit: str, pick: int, mess: str, where: int) -> str:
    """The body with one of its numbers replaced and some mess put somewhere in it."""
    numbers = list(NUMBER.finditer(body))
    if numbers:
        m = numbers[pick % len(numbers)]
        body = body[: m.start(1)] + digit + body[m.end(1) :]
    where = min(where, len(body))
    return body[:where] + mess + body[where:]


lines_st = st.lists(
    st.builds(
        lambda p, b, d, k, m, w: p + _mutated(b, d, k, m, w),
        st.sampled_from(PREFIXES),
        st.sampled_from(BODIES),
        st.sampled_from("12"),
        st.integers(0, 3),
        st.sampled_from(MESS),
        st.integers(0, 120),
    ),
    min_size=1,
    max_size=12,
)


def _outcomes(scan: scanner.SourceScan) -> set[tuple[object, ...]]:
    """What job building reads of the facts that are told apart by value or writer."""
    out: set[tuple[object, ...]] = set()
    for fact in scan.facts:
        if fact.name == "nccl_comm":
            o = fact.record.origin
            rank, dev = fact.captures.get("rank"), fact.captures.get("dev")
            out.add((fact.name, o.host, o.pid, rank_number(rank), rank_number(dev)))
        elif fact.name in merging.BY_VALUE:
            out.add((fact.name, fact.captures.get("n")))
    return out


@contextmanager
def _without_distinct() -> Iterator[None]:
    """Facts as they were before: every line parsed."""
    saved = facts.FACT_PATTERNS
    facts.FACT_PATTERNS = tuple(replace(f, distinct=None) for f in saved)
    scanner.FACT_PATTERNS = facts.FACT_PATTERNS
    try:
        yield
    finally:
        facts.FACT_PATTERNS = scanner.FACT_PATTERNS = saved


def _scanners(engine: str) -> tuple[Scanner, Scanner]:
    rules = [r for r in all_rules() if r.signatures]
    with _without_distinct():
        every_line = Scanner(rules, engine=engine)
    return Scanner(rules, engine=engine), every_line


SCANNERS = {e: _scanners(e) for e in ("stdlib", *(["auto"] if hyperscan_available() else []))}


@pytest.mark.parametrize("engine", list(SCANNERS))
@settings(
    max_examples=60 if FULL_TIER else 20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lines=lines_st, repeat=st.sampled_from([1, 2, 1100]))
def test_repeats_dropped_on_their_bytes_lose_no_value(
    tmp_path: Path, engine: str, lines: list[str], repeat: int
) -> None:
    """Whatever mess (colour codes, NUL, CR, other scripts' digits, long lines) sits in the
    lines, the facts kept by value or writer are the ones a scan that parses every line finds;
    repeated often enough, a chunk is read with one findall (engine.BULK_MIN_LINES)."""
    text = "\n".join(lines * repeat) + "\n"
    assume(len(text) < 3_000_000)
    log = tmp_path / f"{engine}.log"
    log.write_text(text, encoding="utf-8")
    fast, every_line = SCANNERS[engine]
    item = Input(str(log), str(log))
    assert _outcomes(fast.scan(item)) == _outcomes(every_line.scan(item))


@pytest.mark.parametrize("engine", list(SCANNERS))
def test_a_comm_line_repeated_on_other_hosts_maps_each_host(tmp_path: Path, engine: str) -> None:
    """NCCL's comm lines give (host, device) -> rank: the same rank in group and device on
    another node, or under a pod name that kubectl put in front, is another writer."""
    body = BODIES[1]
    lines = [body, body.replace("node1:4211", "node0:4200"), "[pod/w-2/pytorch] " + body] * 1100
    log = tmp_path / "comm.log"
    log.write_text("\n".join(lines) + "\n")
    fast, every_line = SCANNERS[engine]
    item = Input(str(log), str(log))
    kept = _outcomes(fast.scan(item))
    assert kept == _outcomes(every_line.scan(item))
    hosts = {o[1] for o in kept if o[0] == "nccl_comm"}
    assert hosts == {"node0", "node1", "w-2"}


def _dense(tmp_path: Path, mb: int, density: float, seed: int = 5) -> Path:
    log = tmp_path / f"dense-{density:g}.log"
    write_dense(log, mb * 1024 * 1024, seed, density, slurm_writers(16), errors=40)
    return log


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
def test_same_report_with_and_without_hyperscan_on_a_dense_log(tmp_path: Path) -> None:
    """Caps, presence scans and distinct facts: both engines keep the same lines."""
    log = _dense(tmp_path, 6, 0.2)
    fast = report_to_dict(diagnose_paths([str(log)], engine="auto"))
    slow = report_to_dict(diagnose_paths([str(log)], engine="stdlib"))
    assert fast["verdict"]["status"] == "failed"
    assert fast == slow


def test_split_dense_log_same_report_one_process_or_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges that skip what the earlier ranges already hold (scanner.HitBudget) keep what
    merging keeps, whichever range ran first."""
    log = _dense(tmp_path, 24, 0.2)
    whole = report_to_dict(diagnose_paths([str(log)], jobs=1))
    monkeypatch.setattr(parallel, "PART_BYTES", 5 * 1024 * 1024)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    assert len(parallel.split(Input(str(log), str(log)))) == 5
    one = report_to_dict(diagnose_paths([str(log)], jobs=1))
    two = report_to_dict(diagnose_paths([str(log)], jobs=2))
    assert one == two
    assert one["verdict"] == whole["verdict"]
    # each writer's last words and last progress come from the last range that has them
    assert one["job"] == whole["job"]
    # each repeated warning has one pattern: its cap per pattern is the one per rule merging
    # applies, and the ranges keep the same hits as the whole file
    assert one["findings"] == whole["findings"]
    capped = [f for f in one["findings"] if f["count"] == scanner.MAX_HITS_PER_PATTERN]
    assert capped, "the log should repeat a warning past its cap"


def test_many_files_keep_each_files_first_hit_and_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the budget across files, every file still keeps its first hit of each rule: each
    rank keeps what it said, and the verdict is the one of a far larger budget."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    write_dense_ranks(folder, 96, 20_000, 9, 0.2)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    base = report_to_dict(diagnose_paths([str(folder)], jobs=1))
    monkeypatch.setattr(scanner, "MAX_HITS_ACROSS_FILES", 3)
    monkeypatch.setattr(merging, "MAX_HITS_ACROSS_FILES", 3)
    one = report_to_dict(diagnose_paths([str(folder)], jobs=1))
    two = report_to_dict(diagnose_paths([str(folder)], jobs=2))
    assert one == two
    assert one["verdict"] == base["verdict"]
    assert one["job"] == base["job"]
    roles = {f["rule"]: (f["role"], f["ranks"], f["count"]) for f in one["findings"]}
    before = {f["rule"]: (f["role"], f["ranks"], f["count"]) for f in base["findings"]}
    assert {r: v[:2] for r, v in roles.items()} == {r: v[:2] for r, v in before.items()}
    trimmed = [r for r, v in roles.items() if v[2] < before[r][2]]
    assert trimmed, "the budget should have trimmed the repeated warnings"
    assert all(roles[r][2] >= len(roles[r][1]) for r in trimmed)  # one hit per rank at least


RSS_PROBE = """
import json, resource, sys
from ddpdoctor.analysis.diagnose import diagnose_paths
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = diagnose_paths([sys.argv[1]], jobs=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": after - before}))
"""


def test_comm_lines_repeated_all_along_hold_no_object_per_line(tmp_path: Path) -> None:
    """96 MB of NCCL communicator inits on 16 ranks, over and over (a job that creates process
    groups or P2P communicators all the time): 74,000 comm lines, each a world size and a
    (host, device) -> rank fact. Only distinct ones are kept: the process grows by about
    20 MiB, where keeping one fact per line grew it by 124 MiB."""
    log = tmp_path / "inits.log"
    rng = random.Random(3)
    writers = slurm_writers(16)
    with log.open("wb") as fh:
        written = k = 0
        while written < 96 * 1024 * 1024:
            text = "".join(w.prefix + line + "\n" for w in writers for line in init_burst(w, rng))
            written += fh.write(stamped(text.encode(), k))
            k += 1
    proc = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(log)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=True,
    )
    out = json.loads(proc.stdout)
    assert out["grew_kib"] < 48 * 1024, out


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan is not installed")
def test_one_pass_on_sparse_chunks_presence_pass_on_dense_ones(tmp_path: Path) -> None:
    """A chunk with few matches is located in one pass with every pattern; one with many goes
    to the presence pass, and so do the later chunks of its source. Either way the lines
    handed on are the ones the presence pass alone finds."""
    from ddpdoctor.analysis import engine

    fast, _ = SCANNERS["auto"]
    matcher = fast.matcher
    assert isinstance(matcher, engine.HyperscanMatcher)
    sparse = _dense(tmp_path, 2, 0.001).read_bytes()[: 1 << 20]
    dense = _dense(tmp_path, 2, 0.2, seed=6).read_bytes()[: 1 << 20]
    for chunk, dense_after in ((sparse, False), (dense, True)):
        seen = engine.Seen()
        got = matcher.candidate_lines(chunk, seen)
        assert seen.dense is dense_after
        presence_only = engine.Seen(dense=True)
        assert got == matcher.candidate_lines(chunk, presence_only)
    # the source's next chunk, sparse as it is, skips the one pass
    calls: list[int] = []
    one_pass = matcher._every_if_sparse

    def counted(chunk: bytes) -> list[tuple[int, int]] | None:
        calls.append(len(chunk))
        return one_pass(chunk)

    seen = engine.Seen()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matcher, "_every_if_sparse", counted)
        matcher.candidate_lines(dense, seen)
        matcher.candidate_lines(sparse, seen)
    assert calls == [len(dense)] and seen.dense
