"""A rule's documentation as Markdown, generated from the rule itself (for `explain` and
docs/rules/), so docs never drift from the knowledge base."""

from __future__ import annotations

from ddpdoctor.rules.base import CAPTURES, Echo, Marker, Rule

ECHO_MEANING = {
    Echo.WAITING: "printed by a rank left waiting in a collective a peer never joined: an echo "
    "of a failure elsewhere, never the root while something explains it",
    Echo.LOST_PEER: "printed by a rank whose peer (or store) went away: an echo of that peer's "
    "failure, never the root while something explains it",
    Echo.LAUNCHER: "the launcher's reaction to a failed worker: always a consequence",
    Echo.STOPPED: "printed by a process stopped from outside (a signal, Ctrl-C): the echo of "
    "a failure elsewhere, of a stall `ddpdoctor run` caught, or of the scheduler",
}
MARKER_MEANING = {
    Marker.STOP: "marks an early stop: intended when every rank announces it; on some ranks "
    "only, the others are left waiting (uncoordinated exit)",
    Marker.TEARDOWN: "marks the end of the program with the process group alive: a crash "
    "after it is teardown",
    Marker.STALLED: "marks a stalled job (stack dumps): the root when nothing failed before",
    Marker.WARNED: "marks the scheduler's warning signal caught by a rank: a stop on purpose "
    "when every rank caught it, else context (a signal reaches every task, not one)",
}


def _causality(rule: Rule) -> list[str]:
    """How the engine treats the rule's findings, in words (the declarations on the rule)."""
    lines: list[str] = []
    if rule.echo is not None:
        lines.append(f"- echo: {ECHO_MEANING[rule.echo]}")
    for sig in rule.signatures:
        if sig.echo is not None and sig.echo != rule.echo:
            lines.append(f"- echo for `{sig.regex}`: {ECHO_MEANING[sig.echo]}")
    if rule.exit_path:
        lines.append("- exit path: after the same rank's own error, this is how it died, not why")
    if rule.peers_alive:
        lines.append(
            "- peers alive: the transport reports a peer that exits as a lost connection at "
            "once, so ranks that only timed out waited on peers that were still running (none "
            "of them simply left)"
        )
    if rule.split_gpus_configure:
        lines.append(
            "- between processes that each see only their own GPU (all on device 0), a "
            "configuration fault, not the hardware's"
        )
    if rule.alike_on_every_rank:
        lines.append(
            "- alike on every rank: every rank runs this at start-up the same way; where the "
            "launcher showed one rank's error and stopped the others before they showed an "
            "error, a wait or work of their own, the others are named too"
        )
    if rule.marker is not None:
        lines.append(f"- marker: {MARKER_MEANING[rule.marker]}")
    if rule.explains:
        lines.append(
            f"- explains: {', '.join(rule.explains)} (when both appear, this is the cause)"
        )
    if rule.symptom_of:
        lines.append(
            f"- symptom of: {', '.join(rule.symptom_of)} (when that cause's evidence holds, it "
            "is the root)"
        )
    if rule.proves_infrastructure:
        lines.append("- evidence of a hardware or fabric fault by itself")
    names = sorted({n for s in rule.signatures for n in s.compiled.groupindex})
    lines += [f"- captures `{n}`: {CAPTURES[n]}" for n in names]
    return lines


def _prose(text: str) -> str:
    """Text for Markdown with Python's dunder names kept: outside `code` spans a double
    underscore ("__getitem__") would start bold text and lose its underscores."""
    parts = text.split("`")
    return "`".join(p.replace("__", "\\_\\_") if i % 2 == 0 else p for i, p in enumerate(parts))


def rule_markdown(rule: Rule) -> str:
    ex = rule.explanation
    lines = [
        f"# {rule.code}: {_prose(rule.title)}",
        "",
        f"- kind: `{rule.kind}`",
        f"- category: `{rule.default_category}`",
        f"- severity: {rule.severity}",
    ]
    if not rule.signatures:
        lines.append("- inferred from how ranks behaved (no single log line proves it)")
    causality = _causality(rule)
    if causality:
        lines += ["", "## In the causal analysis", *causality]
    lines += [
        "",
        "## What it detects",
        _prose(ex.what),
        "",
        "## Why it happens",
        _prose(ex.why),
        "",
        "## How to fix",
        _prose(ex.fix),
        "",
    ]
    if rule.fix:
        lines.append("Steps:")
        lines += [f"1. {_prose(step)}" for step in rule.fix]
        lines.append("")
    if rule.framework_fix:
        lines.append("Under a framework (shown first when the job's tracebacks show it):")
        lines += [f"- {_prose(step)}" for _name, step in rule.framework_fix]
        lines.append("")
    if rule.capture_fix:
        lines.append("When a line says so:")
        lines += [f"- {name} `{value}`: {_prose(step)}" for name, value, step in rule.capture_fix]
        lines.append("")
    if ex.false_positives:
        lines += ["## False positives", _prose(ex.false_positives), ""]
    if rule.signatures:
        lines += [
            "## Signatures",
            *(
                f"- `{s.regex}`" + (" (suggests only: lowers confidence)" if s.suggests else "")
                for s in rule.signatures
            ),
        ]
        if rule.sources:
            lines.append(f"\nPrinted by: {rule.sources}")
        if rule.confirm:
            lines.append(f"\nWhen only a suggesting line matched, confirm {_prose(rule.confirm)}.")
        lines.append("")
    if rule.context_all or rule.context_none:
        lines.append("## Context conditions (same rank's traceback)")
        lines += [f"- must contain `{c}`" for c in rule.context_all]
        lines += [f"- must not contain `{c}`" for c in rule.context_none]
        lines.append("")
    if rule.positive:
        lines += ["## Example (fires)", "```", *rule.positive, "```", ""]
    if rule.negative:
        lines += ["## Near miss (does not fire)", "```", *rule.negative, "```", ""]
    if rule.references:
        lines += ["## References", *(f"- {r}" for r in rule.references), ""]
    return "\n".join(lines).rstrip() + "\n"


def index_markdown(rules: tuple[Rule, ...]) -> str:
    lines = [
        "# ddpdoctor rules",
        "",
        "Generated by `ddpdoctor rules --write-docs docs/rules`; do not edit by hand.",
        "",
        "| code | kind | category | title |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| [{r.code}]({r.code}.md) | {r.kind} | {r.default_category} | {r.title} |" for r in rules
    ]
    return "\n".join(lines) + "\n"
