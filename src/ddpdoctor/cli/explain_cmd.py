"""`ddpdoctor explain CODE|KIND|"log text"`: a rule's documentation. A log text is matched the
way `diagnose` matches it (the scanner itself: prefixes stripped, tracebacks stitched, the most
specific rule per line), then as a fragment of a line a rule matches. Rendered Markdown on a
terminal, plain text in a pipe."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click

from ddpdoctor.cli import exitcodes
from ddpdoctor.redaction import clean_text
from ddpdoctor.rules.base import Rule

MAX_WIDTH = 100
FALLBACK_WIDTH = 80
"""When the terminal reports no size (0 columns: some CI pseudo-terminals, `script`)."""
MIN_OVERLAP = 8
"""A fragment must share at least this many characters with a signature's literal."""
SHOWN = 5

EXPLAIN_HELP = """
\b
Examples:
  ddpdoctor explain DDP101                      # by rule code
  ddpdoctor explain DDP1                        # every rule whose code starts with DDP1
  ddpdoctor explain cuda-oom                    # by kind
  ddpdoctor explain "unrecognized arguments: --local-rank=0"   # by a line of your log
  ddpdoctor explain "[rank3]: torch.OutOfMemoryError: CUDA out of memory."

\b
Exit codes:
  0  a rule was found and documented
  2  no rule matches the query
"""


def scanned_rules(text: str) -> list[Rule]:
    """The rules `diagnose` would report for `text` read as a log: the real scanner over it."""
    from ddpdoctor.analysis.grouping import dedupe
    from ddpdoctor.analysis.scanner import Scanner
    from ddpdoctor.ingest.sources import Input
    from ddpdoctor.rules.registry import all_rules

    rules = {r.code: r for r in all_rules()}
    scanner = Scanner([r for r in rules.values() if r.signatures])  # as analysis.parallel
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-explain-") as folder:
        path = Path(folder) / "query.log"
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        scan = scanner.scan(Input(path=str(path), display="query"))
    hits = dedupe(scan.hits, rules)
    found = list(dict.fromkeys(h.rule for h in sorted(hits, key=lambda h: h.order)))
    return sorted((rules[c] for c in found), key=lambda r: -r.specificity)


def fragment_rules(text: str) -> list[Rule]:
    """Rules one of whose lines `text` is a piece of: the fragment completed with the start of
    the signature's own literal ("unrecognized arguments: ..." after "error: ") must then match
    the signature's regex, as the scanner would apply it."""
    from ddpdoctor.ingest.prefixes import parse_line
    from ddpdoctor.rules.registry import all_rules

    body = parse_line(text.strip()).text
    lowered = body.lower()
    found: list[Rule] = []
    for rule in all_rules():
        for sig in rule.signatures:
            literal = sig.required_literal
            for k in range(min(len(literal), len(body)), MIN_OVERLAP - 1, -1):
                if literal[-k:].lower() == lowered[:k]:
                    if sig.compiled.search(literal[: len(literal) - k] + body):
                        found.append(rule)
                    break
            if rule in found:
                break
    return sorted(found, key=lambda r: -r.specificity)


def terminal_width() -> int:
    """The terminal's columns, at most MAX_WIDTH; FALLBACK_WIDTH when it reports none."""
    try:
        columns = os.get_terminal_size().columns
    except OSError:
        return FALLBACK_WIDTH
    return min(MAX_WIDTH, columns) if columns > 0 else FALLBACK_WIDTH


@click.command("explain", epilog=EXPLAIN_HELP)
@click.argument("query", nargs=-1, required=True)
def explain(query: tuple[str, ...]) -> None:
    """Document a rule: by code (DDP101), code prefix (DDP1), kind slug, or a log line (matched
    as `diagnose` matches it)."""
    from rich.console import Console
    from rich.markdown import Markdown

    from ddpdoctor.rules.docs import rule_markdown
    from ddpdoctor.rules.registry import find_rules

    text = " ".join(query)
    rules = find_rules(text) if _names_a_rule(text) else []
    rules = rules or scanned_rules(text) or find_rules(text) or fragment_rules(text)
    if not rules:
        shown = clean_text(text)
        click.echo(f"ddpdoctor: no rule matches {shown!r}; see `ddpdoctor rules`.", err=True)
        sys.exit(exitcodes.USAGE_OR_INPUT)
    tty = sys.stdout.isatty()
    console = Console(
        width=terminal_width() if tty else FALLBACK_WIDTH,
        force_terminal=tty,
        no_color=not tty,
        highlight=False,
        emoji=False,
    )
    with console.capture() as captured:
        for rule in rules[:SHOWN]:
            console.print(Markdown(rule_markdown(rule)))
        if len(rules) > SHOWN:
            console.print(
                f"({len(rules) - SHOWN} more: {', '.join(r.code for r in rules[SHOWN:])})"
            )
    text = captured.get()
    if not tty:  # rich pads every line to the width; a pipe wants plain lines
        text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    click.echo(text, nl=False)


def _names_a_rule(text: str) -> bool:
    """A code, a code prefix or a kind slug: one word, no spaces."""
    word = text.strip()
    return bool(word) and " " not in word and len(word) <= 40
