"""Turn a Decision into the Verdict users read: kind, category, culprit, summary, fix, evidence,
the basis of the confidence, and what to collect next when no root could be established."""

from __future__ import annotations

import re

from ddpdoctor.analysis.decision import Decision
from ddpdoctor.analysis.frames import user_frame
from ddpdoctor.analysis.grouping import evidence_of
from ddpdoctor.analysis.job import JobView
from ddpdoctor.model.findings import Culprit, Evidence, Finding, Hit, Verdict
from ddpdoctor.model.taxonomy import Role, Status
from ddpdoctor.rules.base import Rule
from ddpdoctor.rules.frameworks import frameworks_in

MAX_VERDICT_EVIDENCE = 8


def build_verdict(decision: Decision, findings: list[Finding], job: JobView) -> Verdict:
    rule = decision.rule
    if rule is None:
        return Verdict(
            status=str(decision.status),
            kind=None,
            category=None,
            rule=None,
            title=decision.title
            or ("No failure found" if decision.status == Status.OK else "No cause found"),
            confidence=decision.confidence,
            culprit=Culprit(),
            summary=" ".join(n[:1].upper() + n[1:] for n in decision.notes)
            if decision.notes
            else _ok_summary(job),
            fix=[],
            # (a verdict of no kind quotes what it rests on where there is a line: the leak
            # at shutdown that makes a quiet run not known to be healthy, a stop's words)
            evidence=decision.evidence[:MAX_VERDICT_EVIDENCE],
            next_steps=decision.next_steps,
            basis=decision.basis,
        )
    kind = _kind(decision, rule)
    # (no failure kind, no category of one: a healthy run's)
    category = (decision.category or str(rule.default_category)) if kind else None
    root_hits = [h for e in decision.roots for h in e.hits]
    evidence: list[Evidence] = evidence_of(_in_order(root_hits), limit=4)
    for other in decision.others[:2]:
        evidence.extend(evidence_of(other.hits, limit=1))
    evidence.extend(decision.evidence)
    for f in findings:
        if f.role == Role.CASCADE and len(evidence) < MAX_VERDICT_EVIDENCE:
            evidence.extend(evidence_of(f.hits, limit=1))
    return Verdict(
        status=str(decision.status),
        kind=kind,
        category=category,
        rule=rule.code,
        title=decision.title or rule.title,
        confidence=round(decision.confidence, 2),
        culprit=Culprit(ranks=decision.culprit_ranks, hosts=decision.culprit_hosts),
        summary=_summary(decision, rule, findings, job, category, root_hits),
        fix=list(decision.fix)
        + rule.fix_for_captures([h.record.text for h in root_hits[:MAX_FIX_LINES]])
        + rule.fix_for(_frameworks(findings))
        + list(rule.fix),
        evidence=evidence[:MAX_VERDICT_EVIDENCE],
        next_steps=decision.next_steps,
        basis=decision.basis,
    )


def _kind(decision: Decision, rule: Rule) -> str | None:
    """The failure kind; none where nothing failed. A stop every rank agreed on that ended
    with nothing failing is a healthy run (the taxonomy's early stop is one that the platform
    saw as a failure only because of how the ranks exited): its rule and summary still say
    that training stopped early on purpose."""
    if decision.status == Status.OK and rule.healthy_when_ok:
        return None
    return rule.kind


MAX_FIX_LINES = 16
"""Root lines searched for the values a fix depends on (every rank's copy of one error is
the same text)."""


def _frameworks(findings: list[Finding]) -> list[str]:
    """The training frameworks the job ran under, from the frames of every traceback read."""
    return frameworks_in([r.text for f in findings for h in f.hits for r in h.context])


def _in_order(hits: list[Hit]) -> list[Hit]:
    return sorted(hits, key=lambda h: h.order)


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    label = "rank" if len(ranks) == 1 else "ranks"
    return f"{label} {','.join(str(r) for r in ranks)}"


def _summary(
    decision: Decision,
    rule: Rule,
    findings: list[Finding],
    job: JobView,
    category: str | None,
    root_hits: list[Hit],
) -> str:
    where = _ranks(decision.culprit_ranks)
    if decision.culprit_hosts:
        hosts = ",".join(decision.culprit_hosts)
        where = f"{where} on {hosts}" if where else f"host {hosts}"
    parts = [f"{rule.title}" + (f" ({where})" if where else "") + "."]
    parts.append(rule.explanation.why)
    cascades = [f for f in findings if f.role == Role.CASCADE]
    if cascades and decision.status != Status.OK:
        other = sorted({r for f in cascades for r in f.ranks} - set(decision.culprit_ranks))
        titles = "; ".join(sorted({f.title for f in cascades})[:3])
        parts.append(
            "The other errors"
            + (f" on {_ranks(other)}" if other else "")
            + f" are consequences, not causes: {titles}."
        )
    parts.extend(note[:1].upper() + note[1:] for note in decision.notes)
    named = _named_parameters(root_hits)
    if named:
        parts.append(f"Parameters named in the log: {named}.")
    frame = user_frame(root_hits)
    if frame:
        parts.append(f"Raised from your code at {frame}.")
    if category == "infrastructure":
        parts.append("The logs carry hardware or fabric evidence for this.")
    launcher = job.info.launcher_root_cause_rank
    if launcher is not None and decision.culprit_ranks and launcher not in decision.culprit_ranks:
        parts.append(
            f"torchrun's 'Root Cause (first observed failure)' names rank {launcher}, but that "
            "rank was a victim."
        )
    return " ".join(parts)


def _named_parameters(hits: list[Hit]) -> str:
    names: list[str] = []
    for hit in hits:
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
