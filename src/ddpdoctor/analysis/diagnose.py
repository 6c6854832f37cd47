"""The diagnose pipeline: sources -> scans -> hits (ranks attributed once) -> findings ->
causal graph -> decision -> report. One entry point for the CLI, `run` and `demo`."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor import __version__
from ddpdoctor.analysis.decision import decide
from ddpdoctor.analysis.flight import analyze as analyze_flight
from ddpdoctor.analysis.grouping import dedupe, evidence_of, group
from ddpdoctor.analysis.job import build_job, workers_end
from ddpdoctor.analysis.parallel import scan_inputs, thaw
from ddpdoctor.analysis.verdict import build_verdict
from ddpdoctor.ingest.attribution import attribute
from ddpdoctor.ingest.flight_dumps import take_dumps
from ddpdoctor.ingest.run_events import is_events_file, read_events
from ddpdoctor.ingest.self_rank import files_announcing_ranks
from ddpdoctor.ingest.sources import Input, expand_paths
from ddpdoctor.model.findings import Report, Verdict
from ddpdoctor.model.records import SourceInfo
from ddpdoctor.rules.registry import HYPOTHESES, INTENDED_ENDS, all_rules


def diagnose_inputs(
    inputs: list[Input],
    problems: list[SourceInfo] | None = None,
    engine: str = "auto",
    jobs: int | None = None,
    named: list[str] | None = None,
) -> Report:
    rules = {r.code: r for r in all_rules()}
    run_events = [read_events(i.path) for i in inputs if is_events_file(i.path)]
    event_paths = {e.source for e in run_events}
    inputs = [i for i in inputs if i.path not in event_paths]
    dumps, dump_sources, inputs = take_dumps(inputs)
    inputs = files_announcing_ranks(inputs)
    scans = scan_inputs(inputs, engine=engine, jobs=jobs)
    hits = [h for scan in scans for h in scan.hits]
    order = 0
    for scan in scans:  # make orders unique across sources, keeping file order inside each
        for h in scan.hits:
            order += 1
            h.order = order
    job = build_job(scans, [h.record.origin for h in hits], run_events)
    hits = attribute(hits, job.resolve, job.single_node, job.info.hosts, workers_end(job))
    writers = {scan.info.path: (len(scan.streams), scan.info.lines) for scan in scans}
    hits = dedupe(hits, rules, writers)
    if dumps:
        job.info.flight = analyze_flight(dumps, job.info.world_size)
    findings = group(hits, rules)
    decision = decide(findings, job, rules, HYPOTHESES, INTENDED_ENDS)
    for f in findings:
        f.evidence = evidence_of(f.hits)
    if decision.inferred is not None:
        findings.insert(0, decision.inferred)
    verdict = build_verdict(decision, findings, job)
    role_order = {"root": 0, "cascade": 1, "context": 2}
    findings.sort(key=lambda f: (role_order.get(f.role, 3), f.hits[0].order if f.hits else 0))
    sources: list[SourceInfo] = [scan.info for scan in scans] + dump_sources + list(problems or [])
    sources += [
        SourceInfo(
            e.source,
            lines=e.facts,
            status="read",
            reason=f"the job never started: {e.start_error}"
            if e.start_error
            else "ddpdoctor run events",
        )
        for e in run_events
    ]
    verdict = not_ok_without_what_was_named(verdict, sources, named or [])
    return Report(
        tool_version=__version__,
        verdict=verdict,
        findings=findings,
        job=job.info,
        sources=sources,
    )


def diagnose_paths(paths: list[str], engine: str = "auto", jobs: int | None = None) -> Report:
    """Diagnose files, folders, globs, .gz files and '-' (stdin). The library's entry: what a
    big scan froze for the analysis is given back to the collector before returning (the CLI,
    which exits after rendering, keeps it frozen through the report)."""
    inputs, problems = expand_paths(paths)
    try:
        return diagnose_inputs(inputs, problems, engine=engine, jobs=jobs, named=paths)
    finally:
        thaw()


def not_ok_without_what_was_named(
    verdict: Verdict, sources: list[SourceInfo], named: list[str]
) -> Verdict:
    """ "OK" needs what the user named: when an input given by name could not be read (or only
    in part), nothing found in the rest is not a clean bill of health."""
    if verdict.status != "ok":
        return verdict
    unread = [s for s in sources if s.path in named and s.status != "read"]
    if not unread:
        return verdict
    what = "; ".join(f"{s.path} ({s.status}: {s.reason})" for s in unread[:5])
    return replace(
        verdict,
        status="unknown",
        title="No failure found in what could be read",
        summary=f"No error, timeout or crash was found in what could be read, but {what}: the "
        "answer may be there.",
        next_steps=[f"Make {s.path} readable and diagnose again." for s in unread[:5]],
    )
