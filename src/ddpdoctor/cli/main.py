"""`ddpdoctor` command group: diagnose, explain, rules (and run, check, demo from their modules).
Thin: parse options, call the layers below, choose a renderer, map outcomes to exit codes."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ddpdoctor import __version__
from ddpdoctor.cli import exitcodes
from ddpdoctor.cli.options import MIN_WIDTH, format_for, output_path, selected
from ddpdoctor.errors import DdpdoctorError
from ddpdoctor.ingest.inputs import PIPE_WAIT_S
from ddpdoctor.redaction import clean_text
from ddpdoctor.report.render import FORMATS

if TYPE_CHECKING:
    from ddpdoctor.model.findings import Report


class LazyGroup(click.Group):
    """Commands of other packages (run, check, demo) are imported only when used, so that
    `diagnose` does not pay for the supervisor's and preflight's imports."""

    lazy: dict[str, tuple[str, str]] = {
        "run": ("ddpdoctor.cli.run_cmd", "run"),
        "check": ("ddpdoctor.cli.check_cmd", "check"),
        "demo": ("ddpdoctor.cli.demo_cmd", "demo"),
        "explain": ("ddpdoctor.cli.explain_cmd", "explain"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            import importlib

            module, attr = self.lazy[cmd_name]
            try:
                command = getattr(importlib.import_module(module), attr)
            except ImportError:
                return None
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddpdoctor")
def cli() -> None:
    """Tells you why a distributed PyTorch job failed, hung or crawled, which rank is to
    blame, and what to change."""


DIAGNOSE_HELP = """
\b
Examples:
  ddpdoctor diagnose logs/                          # a folder, read recursively
  ddpdoctor diagnose 'node*/rank*.log' -o report.html   # format from the extension
  ddpdoctor diagnose ddpdoctor-runs/20261201T*      # a `ddpdoctor run` folder
  kubectl logs job/train --all-containers --prefix | ddpdoctor diagnose -
  ddpdoctor diagnose logs/ --format json | jq .verdict

\b
Exit codes:
  0  no failure found
  1  a failure, hang or slowdown was diagnosed
  2  usage or input error (nothing readable, a bad option, an output folder that is missing)
  3  internal error (a bug in ddpdoctor: re-run with DDPDOCTOR_DEBUG=1 and report it)
"""


PIECE_CHARS = 1 << 16
"""How much of a report is written at once (then up to the next newline)."""


def pieces(text: str) -> Iterator[str]:
    """The report in pieces that end at a newline: click.echo copies what it writes twice
    (the newline appended, colour codes stripped when the output is not a terminal) and the
    stream encodes it once more. A JSON report of 10,000 rank files is 6 M characters, 12 MB
    as a str once a tqdm block character is in it: written whole it raised the command's peak
    by 17 MiB (132 MiB, above the 128 MiB target). A colour code never spans a newline."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + PIECE_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


CLI_GC_THRESHOLDS = (50_000, 10, 10)
"""The cyclic collector's thresholds for `diagnose`, which exits after rendering: it runs after
every 50,000 objects made net instead of 700. The scan keeps it off (parallel); the analysis and
the report after it made hundreds of collections, each walking the young objects and every
tenth the old ones: 0.25 s of the parent's 2.9 s CPU on 10,000 rank files (the timeline 0.64
-> 0.30 s with it off). Cycles are still collected, 70 times less often. One full collection
when the analysis is done finds no cycles there, but empties the interpreter's free lists and
hands back emptied arenas (2-4 MiB on that set) before the view and the text are made: without
it the rarer collections left the peak 1-2 MiB higher."""


@cli.command(epilog=DIAGNOSE_HELP)
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Output format (default: from the --output extension .html/.htm, .json, .txt; else text).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default=None,
    callback=output_path,
    help="Write the report to this file instead of stdout (- for stdout); its folder must exist.",
)
@click.option(
    "--width",
    type=click.IntRange(min=MIN_WIDTH),
    default=100,
    show_default=True,
    help=f"Columns of the text report (at least {MIN_WIDTH}).",
)
@click.option(
    "--color/--no-color", default=None, help="Colour the text report (default: on a TTY)."
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "stdlib"]),
    default="auto",
    hidden=True,
    help="Pattern engine: auto (Hyperscan when installed) or the stdlib prefilter.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Parallel scanner processes (default: one per CPU for large inputs).",
)
@click.option(
    "--no-redact",
    is_flag=True,
    help="Show secrets (tokens, passwords, keys) as the logs have them instead of masking them.",
)
@click.option(
    "--pipe-wait",
    type=click.FloatRange(min=0.1),
    default=PIPE_WAIT_S,
    show_default=True,
    help="Seconds a named pipe or device may stay silent before reading it stops.",
)
def diagnose(
    paths: tuple[str, ...],
    fmt: str | None,
    output: str | None,
    width: int,
    color: bool | None,
    engine: str,
    jobs: int | None,
    no_redact: bool,
    pipe_wait: float,
) -> None:
    """Diagnose the logs of every rank and node: files, folders, globs, .gz files, - for stdin."""
    from ddpdoctor.analysis.diagnose import diagnose_inputs
    from ddpdoctor.cli.progress import scan_progress
    from ddpdoctor.ingest.sources import expand_paths
    from ddpdoctor.report.problems import problem_lines
    from ddpdoctor.report.render import render
    from ddpdoctor.report.view import shown

    thresholds = gc.get_threshold()  # given back when the command ends (an in-process caller)
    click.get_current_context().call_on_close(lambda: gc.set_threshold(*thresholds))
    gc.set_threshold(*CLI_GC_THRESHOLDS)
    inputs, problems = expand_paths(list(paths), wait_s=pipe_wait)
    with scan_progress(list(paths)):
        found = diagnose_inputs(inputs, problems, engine=engine, jobs=jobs, named=list(paths))
    gc.collect()  # free lists and emptied arenas back before the view and the text (see above)
    # what reaches stderr below (skipped paths) is cleaned like the report itself
    report = shown(found, redact=not no_redact)
    _printable_paths(report)
    if not any(s.status != "skipped" and s.lines > 0 for s in report.sources):
        for line in problem_lines(report.sources):
            click.echo(f"ddpdoctor: {line.split(': ', 1)[1]}", err=True)
        for s in report.sources:
            if s.status != "skipped":
                what = (
                    s.reason
                    if s.reason and "never started" in s.reason
                    else ("holds no record of the job" if s.reason else "is empty")
                )
                click.echo(f"ddpdoctor: {s.path}: {what}", err=True)
        click.echo("ddpdoctor: nothing to diagnose: no input holds a line of log", err=True)
        sys.exit(exitcodes.USAGE_OR_INPUT)
    output = None if output == "-" else output
    fmt = fmt or format_for(output)
    use_color = color if color is not None else (output is None and sys.stdout.isatty())
    text = render(report, fmt, width=width, color=use_color and fmt == "text", redact=not no_redact)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                for piece in pieces(text):
                    fh.write(piece)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write {output}: {exc.strerror}", param_hint="--output"
            ) from exc
    else:
        for piece in pieces(text):
            click.echo(piece, nl=False)
        if not text.endswith("\n"):
            click.echo("")
    for line in problem_lines(report.sources):
        click.echo(f"ddpdoctor: {line}", err=True)
    failed = report.verdict.status in ("failed", "hung", "slow", "unknown")
    sys.exit(exitcodes.FAILURE_FOUND if failed else exitcodes.OK)


@cli.command("rules")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="A table for people, or JSON (code, kind, category, title, severity, cascade, inferred).",
)
@click.option(
    "--select",
    default=None,
    help="Only codes with these prefixes, comma-separated (e.g. DDP1,CUDA); each must match.",
)
@click.option(
    "--write-docs",
    type=click.Path(file_okay=False),
    default=None,
    help="Write one Markdown page per rule and an index into this folder.",
)
@click.option(
    "--export-patterns",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Write every signature regex, one per line, for `rg --no-unicode -f FILE` (bytes and "
    "ASCII classes; - for stdout).",
)
def rules_cmd(
    fmt: str, select: str | None, write_docs: str | None, export_patterns: str | None
) -> None:
    """List every rule: code, kind, category, title."""
    import json

    from ddpdoctor.rules.docs import index_markdown, rule_markdown
    from ddpdoctor.rules.registry import all_rules

    rules = list(all_rules())
    if select is not None:
        rules = selected(rules, select)
    if write_docs:
        out = Path(write_docs)
        out.mkdir(parents=True, exist_ok=True)
        for rule in rules:
            (out / f"{rule.code}.md").write_text(rule_markdown(rule), encoding="utf-8")
        (out / "README.md").write_text(index_markdown(tuple(rules)), encoding="utf-8")
        click.echo(f"wrote {len(rules)} rule pages to {out}")
        return
    if export_patterns:
        from ddpdoctor.analysis.facts import FACT_PATTERNS
        from ddpdoctor.rules.export import rg_regex

        regexes = [s.regex for r in rules for s in r.signatures] + [f.regex for f in FACT_PATTERNS]
        text = "".join(rg_regex(rx) + "\n" for rx in regexes)
        if export_patterns == "-":
            click.echo(text, nl=False)
            return
        try:
            Path(export_patterns).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write {export_patterns}: {exc.strerror}", param_hint="--export-patterns"
            ) from exc
        click.echo(f"wrote {len(regexes)} patterns to {export_patterns}")
        return
    if fmt == "json":
        click.echo(
            json.dumps(
                [
                    {
                        "code": r.code,
                        "kind": r.kind,
                        "category": str(r.default_category),
                        "title": r.title,
                        "severity": r.severity,
                        "cascade": r.cascade,
                        "inferred": not r.signatures,
                    }
                    for r in rules
                ],
                indent=2,
            )
        )
        return
    for r in rules:
        click.echo(f"{r.code:<8} {r.kind:<30} {r.default_category!s:<15} {r.title}")


def _printable_paths(report: Report) -> None:
    """File names that are not UTF-8 written with escapes in every source and evidence path: a
    lone surrogate would make the JSON invalid and a UTF-8 report file unwritable."""
    from ddpdoctor.ingest.filenames import display_name

    for source in report.sources:
        source.path = display_name(source.path)
    for evidence in report.verdict.evidence:
        evidence.source = display_name(evidence.source)
    for finding in report.findings:
        for evidence in finding.evidence:
            evidence.source = display_name(evidence.source)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except DdpdoctorError as exc:
        click.echo(f"ddpdoctor: {clean_text(str(exc))}", err=True)
        sys.exit(exitcodes.USAGE_OR_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug in ddpdoctor: one clear line, exit 3, details on demand
        if os.environ.get("DDPDOCTOR_DEBUG"):
            raise
        click.echo(
            f"ddpdoctor: internal error ({type(exc).__name__}: {clean_text(str(exc))}). This is "
            "a bug in ddpdoctor; re-run with DDPDOCTOR_DEBUG=1 for the traceback and report it.",
            err=True,
        )
        sys.exit(exitcodes.INTERNAL)
