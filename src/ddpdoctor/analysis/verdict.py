"""Turn an Analysis into the Verdict users read: kind, category, culprit, summary, fix, evidence,
and what to collect next when no root could be established."""

from __future__ import annotations

import re

from ddpdoctor.analysis.causality import Analysis
from ddpdoctor.analysis.grouping import evidence_of
from ddpdoctor.analysis.job import JobView
from ddpdoctor.model.findings import Culprit, Evidence, Finding, Verdict
from ddpdoctor.model.taxonomy import Role, Status
from ddpdoctor.rules.base import Rule

MAX_VERDICT_EVIDENCE = 8


def build_verdict(analysis: Analysis, job: JobView) -> Verdict:
    rule = analysis.rule
    if rule is None:
        return Verdict(
            status=str(analysis.status),
            kind=None,
            category=None,
            rule=None,
            title="No failure found" if analysis.status == Status.OK else "No cause found",
            confidence=analysis.confidence,
            culprit=Culprit(),
            summary=" ".join(analysis.notes) if analysis.notes else _ok_summary(job),
            fix=[],
            evidence=[],
            next_steps=analysis.next_steps,
        )
    category = analysis.category or str(rule.default_category)
    evidence: list[Evidence] = []
    if analysis.root is not None:
        evidence.extend(evidence_of(analysis.root.hits, limit=4))
        for f in analysis.findings:
            if f is not analysis.root and f.role == Role.ROOT:
                evidence.extend(evidence_of(f.hits, limit=2))
    evidence.extend(analysis.extra_evidence)
    for f in analysis.findings:
        if f.role == Role.CASCADE and len(evidence) < MAX_VERDICT_EVIDENCE:
            evidence.extend(evidence_of(f.hits, limit=1))
    culprit = Culprit(ranks=analysis.culprit_ranks, hosts=analysis.culprit_hosts)
    summary = _summary(analysis, rule, job, category)
    return Verdict(
        status=str(analysis.status),
        kind=rule.kind,
        category=category,
        rule=rule.code,
        title=rule.title,
        confidence=round(analysis.confidence, 2),
        culprit=culprit,
        summary=summary,
        fix=list(rule.fix),
        evidence=evidence[:MAX_VERDICT_EVIDENCE],
        next_steps=analysis.next_steps,
    )


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    label = "rank" if len(ranks) == 1 else "ranks"
    return f"{label} {','.join(str(r) for r in ranks)}"


def _summary(analysis: Analysis, rule: Rule, job: JobView, category: str) -> str:
    where = _ranks(analysis.culprit_ranks)
    if analysis.culprit_hosts:
        where = (
            f"{where} on {','.join(analysis.culprit_hosts)}"
            if where
            else (f"host {','.join(analysis.culprit_hosts)}")
        )
    parts = [f"{rule.title}" + (f" ({where})" if where else "") + "."]
    parts.append(rule.explanation.why)
    cascades = [f for f in analysis.findings if f.role == Role.CASCADE]
    if cascades and analysis.status != Status.OK:
        other = sorted({r for f in cascades for r in f.ranks} - set(analysis.culprit_ranks))
        titles = "; ".join(sorted({f.title for f in cascades})[:3])
        parts.append(
            "The other errors"
            + (f" on {_ranks(other)}" if other else "")
            + f" are consequences, not causes: {titles}."
        )
    parts.extend(note[:1].upper() + note[1:] for note in analysis.notes)
    if analysis.root is not None:
        named = _named_parameters(analysis.root)
        if named:
            parts.append(f"Parameters named in the log: {named}.")
        frame = user_frame(analysis.root)
        if frame:
            parts.append(f"Raised from your code at {frame}.")
    if category == "infrastructure":
        parts.append("The logs carry hardware or fabric evidence for this.")
    launcher = job.info.launcher_root_cause_rank
    if launcher is not None and analysis.culprit_ranks and launcher not in analysis.culprit_ranks:
        parts.append(
            f"torchrun's 'Root Cause (first observed failure)' names rank {launcher}, but that "
            "rank was a victim."
        )
    return " ".join(parts)


FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|<frozen|/torch/|/bin/")


def user_frame(finding: Finding) -> str | None:
    """The deepest traceback frame outside installed libraries: where the user should look."""
    for hit in finding.hits:
        for record in reversed(hit.context):
            m = FRAME.search(record.text)
            if m and not LIBRARY_PATH.search(m.group("path")):
                return f"{m.group('path')}:{m.group('line')} in {m.group('func')}"
    return None


def _named_parameters(finding: Finding) -> str:
    names: list[str] = []
    for hit in finding.hits:
        for name in re.split(r",\s*", hit.captures.get("params", "")):
            if name and name not in names:
                names.append(name.strip())
    return ", ".join(names[:20])


def _ok_summary(job: JobView) -> str:
    seen = job.info.ranks_seen
    text = "No error, timeout or crash was found in the logs"
    if seen:
        text += f" of {_ranks(seen)}"
    return text + "."
