"""`ddpdoctor demo [NAME]`: runs one fault scenario as a real torchrun/gloo job on CPU, then
diagnoses what it printed. Without torch it replays the logs bundled from a real run and says so.
Thin: running lives in scenarios.runner, diagnosis in analysis; this only wires and prints."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import click

from ddpdoctor.cli import exitcodes
from ddpdoctor.redaction import clean_text, clean_value
from ddpdoctor.scenarios import catalog, runner

SHOWN_LINES = 30
_PREFIX = re.compile(r"^(\[[A-Za-z_]*\d+\]: ?)?")
_BANNER = re.compile(r"\] \**\s*$")  # torchrun's empty and '*****' warning lines


def torch_available() -> bool:
    """True when this interpreter can import torch (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def _list_scenarios() -> None:
    click.echo(f"{'scenario':<30} {'ranks':>5}  {'expected kind':<30} title")
    for s in catalog.SCENARIOS:
        mark = "*" if s.name == catalog.DEFAULT_SCENARIO else " "
        ranks = str(s.nproc) if s.launcher != "python" else "-"
        click.echo(f"{s.name + mark:<30} {ranks:>5}  {s.expected_label:<30} {s.title}")
    click.echo("\n* the default. Run one with: ddpdoctor demo NAME")


def _condensed(path: Path, n: int) -> list[str]:
    """The console without traceback frames and source lines, at most n lines (head and tail)."""
    text = path.read_bytes().decode("utf-8", errors="replace").replace("\x00", "")
    kept: list[str] = []
    for line in text.splitlines():
        prefix = _PREFIX.match(line)
        body = line[prefix.end() :] if prefix else line
        if body.startswith(("  File ", "    ")) or _BANNER.search(body):
            continue
        kept.append(line)
    if len(kept) <= n:
        return kept
    half = n // 2
    return [*kept[:half], f"... ({len(kept) - 2 * half} lines)", *kept[-half:]]


def _replay_dir(scenario: catalog.Scenario, keep: str | None) -> Path:
    src = scenario.captured_dir
    if not runner.log_paths(src):
        raise click.ClickException(f"no bundled logs for scenario {scenario.name!r}")
    if keep is None:
        return src
    dst = Path(keep)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


@click.command("demo")
@click.argument("name", required=False, default=catalog.DEFAULT_SCENARIO)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Report format.",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the job's logs (console.log, meta.json) in this folder.",
)
@click.option(
    "--replay",
    is_flag=True,
    help="Diagnose the bundled logs of a real run instead of running torch.",
)
@click.option("--width", type=int, default=100, show_default=True, help="Text report width.")
def demo(name: str, list_only: bool, fmt: str, keep: str | None, replay: bool, width: int) -> None:
    """Run a tiny distributed job with one injected fault and diagnose it (default: data-error).

    Needs torch to run the job (2-3 gloo ranks on CPU, about 5-15 s); without torch, or with
    --replay, it diagnoses the logs bundled from a real run instead.
    """
    from ddpdoctor.analysis.diagnose import diagnose_paths
    from ddpdoctor.report.render import render

    if list_only:
        _list_scenarios()
        return
    try:
        scenario = catalog.get(name)
    except KeyError as exc:
        click.echo(f"ddpdoctor: {exc.args[0]}; see `ddpdoctor demo --list`.", err=True)
        sys.exit(exitcodes.USAGE_OR_INPUT)

    live = not replay and torch_available() and not scenario.missing_needs
    if live:
        out_dir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="ddpdoctor-demo-"))
        click.echo(f"ddpdoctor demo: {scenario.name}: {scenario.title}", err=True)
        result = runner.run(
            scenario, out_dir, on_start=lambda cmd: click.echo(f"  $ {shlex.join(cmd)}", err=True)
        )
        how = f"exit code {result.exit_code} after {result.duration_s:.1f} s"
        if result.timed_out:
            how = f"killed after the {scenario.timeout_s:.0f} s limit"
        header = f"Ran {scenario.name} for real ({how})."
    else:
        why = (
            "--replay was given"
            if replay
            else "torch is not importable here"
            if not torch_available()
            else f"this machine has no {', '.join(scenario.missing_needs)}"
        )
        out_dir = _replay_dir(scenario, keep)
        meta = runner.read_meta(out_dir)
        header = (
            f"REPLAY ({why}): diagnosing logs captured from a real run of {scenario.name} "
            f"on {meta.get('date', '?')} with torch {meta.get('torch', '?')}; nothing was run."
        )
        click.echo(f"ddpdoctor demo: {header}", err=True)

    paths = runner.log_paths(out_dir)
    report = diagnose_paths(paths)
    expected_ok = (report.verdict.status, report.verdict.kind, report.verdict.category) == (
        scenario.expected_status,
        scenario.expected_kind,
        scenario.expected_category,
    )
    if fmt == "json":
        data = json.loads(render(report, "json"))
        data["demo"] = {
            "scenario": scenario.name,
            "mode": "live" if live else "replay",
            "logs": paths,
            "expected": {"kind": scenario.expected_kind, "category": scenario.expected_category},
            "matches_expected": expected_ok,
        }
        click.echo(json.dumps(clean_value(data), indent=2))
    else:
        console = out_dir / runner.CONSOLE_LOG
        click.echo(header)
        click.echo(f"\nWhat the job printed, traceback frames left out ({console}):")
        for line in _condensed(console, SHOWN_LINES):  # the job's own words: cleaned
            click.echo(f"  | {clean_text(line)[: width - 4]}")
        click.echo("")
        click.echo(render(report, "text", width=width))
        verdict = "matches" if expected_ok else "does NOT match"
        injected = scenario.expected_label + (
            f" ({scenario.expected_category})" if scenario.expected_category else ""
        )
        click.echo(f"Injected fault: {injected}; the diagnosis {verdict}.")
        if keep or live:
            click.echo(f"Logs: {out_dir}  (again: ddpdoctor diagnose {shlex.join(paths)})")
