"""Scale, not speed: many files, one huge line, and a big file split across processes all give
the right verdict with bounded memory. Timing lives in benchmarks/run.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.generate import write_log

from ddpdoctor.analysis import parallel
from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.sources import Input
from ddpdoctor.report.to_json import report_to_dict
from tests.conftest import REPO

# A real line from corpus case 030 (a FileNotFoundError on rank 0).
REAL_ERROR = (
    "FileNotFoundError: [Errno 2] No such file or directory: "
    "'E:/visionlab/data/imnet_val/val5k/val_file_list.pickle'\n"
)
HEALTHY = "[rank{r}]: step 10 loss 2.31\n[rank{r}]: step 11 loss 2.29\n"

RSS_PROBE = """
import json, resource, sys
from ddpdoctor.analysis.diagnose import diagnose_paths
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = diagnose_paths([sys.argv[1]], jobs=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
src = report.sources[0]
print(json.dumps({"grew_kib": after - before, "status": report.verdict.status,
                  "kind": report.verdict.kind, "source": src.status, "lines": src.lines}))
"""


def test_ten_thousand_files(tmp_path: Path) -> None:
    for r in range(10_000):
        sub = tmp_path / f"node{r // 1000}"
        sub.mkdir(exist_ok=True)
        text = HEALTHY.format(r=r)
        if r == 4321:
            text += f"[rank{r}]: {REAL_ERROR}"
        (sub / f"rank{r}.log").write_text(text)
    report = diagnose_paths([str(tmp_path)])
    assert len(report.sources) == 10_000
    assert all(s.status == "read" for s in report.sources)
    assert report.verdict.status == "failed"
    assert 4321 in report.verdict.culprit.ranks


def test_hundred_megabyte_line_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    with open(log, "wb") as fh:
        fh.write(b"[rank0]: step 1 loss 2.0\n")
        for _ in range(100):
            fh.write(b"x" * (1 << 20))  # one 100 MiB line without a newline
        fh.write(b"\n[rank0]: " + REAL_ERROR.encode())
    proc = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    out = json.loads(proc.stdout)
    assert out["status"] == "failed"
    assert out["source"] == "read"
    assert out["grew_kib"] < 96 * 1024  # far below the 100 MiB line


def test_big_file_same_report_split_or_not_one_or_two_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "train.log"
    write_log(log, 72 * 1024 * 1024, seed=11, ranks=list(range(8)), world=8, errors=40)
    monkeypatch.setattr(parallel, "PART_BYTES", 20 * 1024 * 1024)
    parts = parallel.split(Input(str(log), str(log)))
    assert len(parts) == 4
    assert all(p.end is None or p.end > p.start for p in parts)
    sequential = report_to_dict(diagnose_paths([str(log)], jobs=1))
    two = report_to_dict(diagnose_paths([str(log)], jobs=2))
    assert sequential == two
    monkeypatch.setattr(parallel, "PART_BYTES", 1 << 40)
    whole = report_to_dict(diagnose_paths([str(log)], jobs=1))
    assert whole["verdict"] == sequential["verdict"]
    assert whole["sources"] == sequential["sources"]


def test_evidence_line_numbers_are_exact_across_chunks(tmp_path: Path) -> None:
    """Errors placed at known lines of a file spanning several 4 MB chunks, among progress
    lines (sampled facts) and noise: every quoted line is exactly at source:line."""
    error = "[rank1]: FileNotFoundError: [Errno 2] No such file or directory: 'shard-{n}.bin'"
    noise = "[rank0]: step {n} loss 0.25 | 12%|#         | {n}/100000 [00:{s:02d}<10:00, 3.1it/s]"
    log = tmp_path / "console.log"
    wanted: dict[int, str] = {}
    with log.open("w") as fh:
        for n in range(1, 160_001):
            if n % 37_001 == 0:
                line = error.format(n=n)
                wanted[n] = line
            else:
                line = noise.format(n=n, s=n % 60)
            fh.write(line + "\n")
    assert log.stat().st_size > 3 * 4 * 1024 * 1024
    report = diagnose_paths([str(log)])
    lines = log.read_text().splitlines()
    data = next(f for f in report.findings if f.rule == "DATA101")
    assert data.count == len(wanted)
    for hit in data.hits:
        assert hit.record.line in wanted
        assert lines[hit.record.line - 1] == wanted[hit.record.line]


def _without_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan as it was before texts were shared and NCCL comm lines kept no text."""
    from dataclasses import replace

    scanner = parallel._scanner("auto")
    kept_all = [
        replace(t, fact=replace(t.fact, text_read=True)) if t.fact is not None else t
        for t in scanner._targets
    ]
    monkeypatch.setattr(scanner, "_targets", kept_all)
    monkeypatch.setattr(parallel, "_sharing_texts", lambda scans: scans)


def test_shared_texts_and_textless_facts_change_no_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rank files at 20% candidates (benchmark data: NCCL comm lines, repeated warnings):
    equal hit texts are one object across files, NCCL comm facts keep no text, and the report
    is the same as when every text is kept."""
    from benchmarks.generate import generate

    from ddpdoctor.analysis.job import learn_rank_map

    generate("dense-ranks", tmp_path, 6e-4, 96, seed=7, density=0.2)
    inputs = [Input(str(p), str(p)) for p in sorted(tmp_path.glob("*.log"))]
    scans = parallel.scan_inputs(inputs, jobs=1)
    texts = [h.record.text for s in scans for h in s.hits]
    assert len(texts) > 2 * len(set(texts))  # warnings repeat across files
    assert len({id(t) for t in texts}) == len(set(texts))
    comm = [f for s in scans for f in s.facts if f.name == "nccl_comm"]
    assert comm and all(f.record.text == "" for f in comm)
    shared = report_to_dict(diagnose_paths([str(tmp_path)], jobs=1))
    rank_map = learn_rank_map(scans)
    _without_sharing(monkeypatch)
    scans = parallel.scan_inputs(inputs, jobs=1)
    assert all(f.record.text for s in scans for f in s.facts if f.name == "nccl_comm")
    assert learn_rank_map(scans) == rank_map and rank_map
    kept = report_to_dict(diagnose_paths([str(tmp_path)], jobs=1))
    shared.pop("elapsed_s", None)
    kept.pop("elapsed_s", None)
    assert shared == kept
