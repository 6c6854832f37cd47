"""Reports before and after a change to the scanning path (a tool, not a test): `save` writes
`report_to_dict` of every real input the project keeps (scenario captures, tests/fixtures, the
labelled corpus: ../shared/corpus when present and corpus/cases) and of a few generated dense
logs; `compare` diagnoses them again and prints every difference, key by key. Real inputs must
not differ; generated ones may only where a cap on repeats changed what is counted, and the
verdict must not.

Usage: python benchmarks/snapshot.py save|compare [DIR] [--only real|generated]
       (DIR defaults to bench-data/snapshots)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from generate import GIB, slurm_writers, write_dense, write_dense_ranks, write_log  # noqa: E402

from ddpdoctor.analysis import parallel  # noqa: E402
from ddpdoctor.analysis.diagnose import diagnose_paths  # noqa: E402
from ddpdoctor.report.to_json import report_to_dict  # noqa: E402
from ddpdoctor.scenarios import catalog, runner  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpus"
CASES = ROOT / "corpus" / "cases"
FIXTURES = ROOT / "tests" / "fixtures"
DATA = ROOT / "bench-data" / "snapshot-data"
"""Generated once and kept: a later change of the generator must not look like a change of
the scanner."""


def real_cases() -> Iterator[tuple[str, list[str]]]:
    """Every real capture, each as the tests give it (file lists) and, for folders, whole."""
    for s in catalog.SCENARIOS:
        yield f"scenario/{s.name}", runner.log_paths(s.captured_dir)
    for folder in sorted(p for p in (FIXTURES / "real").iterdir() if p.is_dir()):
        files = sorted(str(p) for p in folder.rglob("*") if p.is_file() and p.name != "meta.json")
        yield f"real/{folder.name}/files", files
        yield f"real/{folder.name}", [str(folder)]
    for folder in sorted(p for p in (FIXTURES / "runs").iterdir() if p.is_dir()):
        yield f"runs/{folder.name}", [str(folder)]
    for base, prefix in ((CORPUS, "corpus"), (CASES, "cases")):
        if not base.is_dir():
            continue
        for case in sorted(p for p in base.iterdir() if (p / "label.json").is_file()):
            yield f"{prefix}/{case.name}", [str(case / "logs")]


def generated_cases() -> Iterator[tuple[str, list[str]]]:
    """Dense and sparse logs big enough to reach the caps on repeats, generated once."""
    DATA.mkdir(parents=True, exist_ok=True)
    sparse = DATA / "sparse-12m.log"
    if not sparse.exists():
        write_log(sparse, 12 * 1024 * 1024, seed=3, ranks=list(range(8)), world=8, errors=60)
    yield "generated/sparse-12m", [str(sparse)]
    for density in (0.01, 0.2):
        dense = DATA / f"dense-{density:g}-24m.log"
        if not dense.exists():
            write_dense(dense, 24 * 1024 * 1024, 5, density, slurm_writers(16), errors=80)
        yield f"generated/dense-{density:g}-24m", [str(dense)]
    yield "generated/dense-0.2-24m-split", [str(DATA / "dense-0.2-24m.log")]
    ranks = DATA / "dense-ranks-0.2-300"
    if not ranks.exists():
        ranks.mkdir()
        write_dense_ranks(ranks, 300, int(0.01 * GIB) // 300, 9, 0.2)
    yield "generated/dense-ranks-0.2-300", [str(ranks)]
    yield "generated/dense-ranks-0.2-300-workers", [str(ranks)]


def report_of(name: str, paths: list[str], jobs: int | None = None) -> dict[str, Any]:
    """The report; a name ending in -split cuts its file into 6 MB ranges, and one ending in
    -split or -workers is scanned in worker processes when jobs > 1, however small."""
    saved = parallel.PART_BYTES, parallel.PARALLEL_MIN_BYTES
    if name.endswith("-split"):
        parallel.PART_BYTES = 6 * 1024 * 1024
    if name.endswith(("-split", "-workers")):
        parallel.PARALLEL_MIN_BYTES = 0
    try:
        return report_to_dict(diagnose_paths(paths, jobs=jobs))
    finally:
        parallel.PART_BYTES, parallel.PARALLEL_MIN_BYTES = saved


def _differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if type(a) is not type(b):
        yield f"{where}: {str(a)[:160]!r} -> {str(b)[:160]!r}"
    elif isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                yield f"{where}.{key}: only {'after' if key in b else 'before'}"
            else:
                yield from _differences(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        if len(a) != len(b):
            yield f"{where}: {len(a)} items -> {len(b)}"
        for n, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _differences(x, y, f"{where}[{n}]")
    elif a != b:
        yield f"{where}: {str(a)[:160]!r} -> {str(b)[:160]!r}"


def _cases(only: str | None) -> Iterator[tuple[str, list[str]]]:
    if only in (None, "real"):
        yield from real_cases()
    if only in (None, "generated"):
        yield from generated_cases()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("action", choices=["save", "compare"])
    ap.add_argument("dir", nargs="?", type=Path, default=ROOT / "bench-data" / "snapshots")
    ap.add_argument("--only", choices=["real", "generated"], default=None)
    args = ap.parse_args()
    out: Path = args.dir
    out.mkdir(parents=True, exist_ok=True)
    changed = 0
    total = 0
    new = 0
    t0 = time.perf_counter()
    for name, paths in _cases(args.only):
        total += 1
        file = out / (name.replace("/", "__") + ".json")
        jobs: list[int | None] = [1, 2] if name.startswith("generated") else [None]
        reports = [report_of(name, paths, j) for j in jobs]
        for j, r in zip(jobs[1:], reports[1:], strict=True):
            if r != reports[0]:
                print(f"{name}: jobs={j} differs from jobs={jobs[0]}")
                changed += 1
        if args.action == "save":
            file.write_text(json.dumps(reports[0], indent=1, sort_keys=True))
            continue
        if not file.exists():  # an input added since the snapshot: nothing to compare with
            new += 1
            print(f"{name}: new since the snapshot, not compared")
            continue
        before = json.loads(file.read_text())
        diffs = list(_differences(before, reports[0]))
        if diffs:
            changed += 1
            print(f"{name}: {len(diffs)} differences")
            for d in diffs[:40]:
                print(f"    {d}")
    verb = "saved" if args.action == "save" else "compared"
    added = f", {new} new" if new else ""
    print(f"{verb} {total} cases in {time.perf_counter() - t0:.0f} s; {changed} differ{added}")
    sys.exit(1 if changed and args.action == "compare" else 0)


if __name__ == "__main__":
    main()
