"""The diagnose pipeline: sources -> scans -> hits -> findings -> causality -> report.
One entry point for the CLI, `run` and `demo`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from contextlib import suppress
from functools import lru_cache

from ddpdoctor import __version__
from ddpdoctor.analysis.causality import decide
from ddpdoctor.analysis.grouping import dedupe, evidence_of, group
from ddpdoctor.analysis.job import build_job
from ddpdoctor.analysis.scanner import Scanner, SourceScan
from ddpdoctor.analysis.verdict import build_verdict
from ddpdoctor.ingest.run_events import is_events_file, read_events
from ddpdoctor.ingest.sources import Input, expand_paths
from ddpdoctor.model.findings import Report
from ddpdoctor.model.records import SourceInfo
from ddpdoctor.rules.base import Rule
from ddpdoctor.rules.registry import all_rules

PARALLEL_MIN_BYTES = 64 * 1024 * 1024
"""Below this much input, starting worker processes costs more than it saves."""

_WORKER_SCANNER: Scanner | None = None


def _scan_in_worker(item: Input) -> SourceScan:
    global _WORKER_SCANNER
    if _WORKER_SCANNER is None:
        _WORKER_SCANNER = Scanner(_scannable(all_rules()))
    return _WORKER_SCANNER.scan(item)


def _scannable(rules: Iterable[Rule]) -> list[Rule]:
    return [r for r in rules if r.signatures]


def scan_inputs(
    inputs: list[Input], engine: str = "auto", jobs: int | None = None
) -> list[SourceScan]:
    total = 0
    for item in inputs:
        with suppress(OSError):
            total += os.path.getsize(item.path) if item.path != "-" else 0
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    if workers > 1 and len(inputs) > 1 and total >= PARALLEL_MIN_BYTES and engine == "auto":
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_scan_in_worker, inputs, chunksize=4))
    scanner = _scanner(engine)
    return [scanner.scan(item) for item in inputs]


@lru_cache(maxsize=4)
def _scanner(engine: str) -> Scanner:
    """Compiling the pattern database takes ~0.3 s: once per process and engine."""
    return Scanner(_scannable(all_rules()), engine=engine)


def diagnose_inputs(
    inputs: list[Input],
    problems: list[SourceInfo] | None = None,
    engine: str = "auto",
    jobs: int | None = None,
) -> Report:
    rules = {r.code: r for r in all_rules()}
    run_events = [read_events(i.path) for i in inputs if is_events_file(i.path)]
    event_paths = {e.source for e in run_events}
    inputs = [i for i in inputs if i.path not in event_paths]
    scans = scan_inputs(inputs, engine=engine, jobs=jobs)
    hits = [h for scan in scans for h in scan.hits]
    order = 0
    for scan in scans:  # make orders unique across sources, keeping file order inside each
        for h in scan.hits:
            order += 1
            h.order = order
    hits = dedupe(hits, rules)
    job = build_job(scans, [h.record.origin for h in hits], run_events)
    findings = group(hits, rules)
    analysis = decide(findings, job, rules)
    verdict = build_verdict(analysis, job)
    for f in findings:
        f.evidence = evidence_of(f.hits)
    role_order = {"root": 0, "cascade": 1, "context": 2}
    findings.sort(key=lambda f: (role_order.get(f.role, 3), f.hits[0].order if f.hits else 0))
    sources: list[SourceInfo] = [scan.info for scan in scans] + list(problems or [])
    sources += [
        SourceInfo(e.source, status="read", reason="ddpdoctor run events") for e in run_events
    ]
    return Report(
        tool_version=__version__,
        verdict=verdict,
        findings=findings,
        job=job.info,
        sources=sources,
    )


def diagnose_paths(paths: list[str], engine: str = "auto", jobs: int | None = None) -> Report:
    """Diagnose files, folders, globs, .gz files and '-' (stdin)."""
    inputs, problems = expand_paths(paths)
    return diagnose_inputs(inputs, problems, engine=engine, jobs=jobs)
