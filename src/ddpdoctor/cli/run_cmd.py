"""`ddpdoctor run [opts] -- CMD...`: supervise a live job. Thin: parse options, call
`supervise.session.run_job`, print hang reports and the final diagnosis to stderr, exit with the
child's exit code (128+N when it died by signal N).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ddpdoctor.cli.exitcodes import INTERNAL, USAGE_OR_INPUT
from ddpdoctor.errors import SupervisorError
from ddpdoctor.redaction import clean_text
from ddpdoctor.supervise.rundir import default_run_dir
from ddpdoctor.supervise.session import RunOptions, run_job


def _notify(text: str) -> None:
    click.echo(text, err=True)


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Run folder (default ./ddpdoctor-runs/<UTC timestamp>).",
)
@click.option(
    "--hang-after",
    type=float,
    default=None,
    help="Seconds without progress before a hang is declared "
    "(default: max(60, 5x the median interval between progress lines)).",
)
@click.option(
    "--on-hang",
    type=click.Choice(["report", "kill"]),
    default="report",
    show_default=True,
    help="On a hang: report and keep the job, or dump and end it.",
)
@click.option(
    "--stacks",
    type=click.Choice(["auto", "py-spy", "faulthandler", "none"]),
    default="auto",
    show_default=True,
    help="How to collect Python stacks of ranks.",
)
@click.option(
    "--no-inject",
    is_flag=True,
    help="Do not put the faulthandler sitecustomize on the job's PYTHONPATH.",
)
@click.option(
    "--no-flight-recorder",
    is_flag=True,
    help="Leave PyTorch's Flight Recorder as the job sets it (default: TORCH_FR_BUFFER_SIZE=2000 "
    "unless set, and every rank's dump collected into the run folder on a hang).",
)
@click.option(
    "--label-ranks",
    is_flag=True,
    help="Make torchrun prefix each line with [rankN]: (adds --tee 3).",
)
@click.option(
    "--grace",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when ending the job, also after a signal "
    "ddpdoctor forwarded (ranks that ignore SIGTERM are killed after this).",
)
@click.option(
    "--output-buffer",
    type=float,
    default=16.0,
    show_default=True,
    help="MiB of the job's output held per stream for a terminal or pipe that is not "
    "reading; beyond it the job's writes wait, as on a pipe (nothing is dropped).",
)
@click.option(
    "--startup-grace",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds allowed before the first progress line (imports, rendezvous).",
)
@click.option("--quiet-report", is_flag=True, help="Do not print the final diagnosis.")
@click.option(
    "--no-redact",
    is_flag=True,
    help="Keep secrets (tokens, passwords) in events.jsonl, stack dumps and the reports; "
    "console.log and ranks/*.log always keep what the job printed.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(
    run_dir: Path | None,
    hang_after: float | None,
    on_hang: str,
    stacks: str,
    no_inject: bool,
    no_flight_recorder: bool,
    label_ranks: bool,
    grace: float,
    output_buffer: float,
    startup_grace: float,
    quiet_report: bool,
    no_redact: bool,
    command: tuple[str, ...],
) -> None:
    """Supervise a job: per-rank logs, hang detection, merged stacks, diagnosis at the end."""
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        click.echo("ddpdoctor run: no command given (ddpdoctor run [opts] -- CMD...)", err=True)
        sys.exit(USAGE_OR_INPUT)
    if hang_after is not None and hang_after <= 0:
        click.echo("ddpdoctor run: --hang-after must be positive", err=True)
        sys.exit(USAGE_OR_INPUT)
    if not 0 <= grace <= 86400:
        click.echo("ddpdoctor run: --grace must be between 0 and 86400 seconds", err=True)
        sys.exit(USAGE_OR_INPUT)
    if not 1 <= output_buffer <= 65536:
        click.echo("ddpdoctor run: --output-buffer must be between 1 and 65536 MiB", err=True)
        sys.exit(USAGE_OR_INPUT)
    opts = RunOptions(
        argv=argv,
        run_dir=run_dir or default_run_dir(),
        hang_after_s=hang_after,
        on_hang=on_hang,
        stacks=stacks,
        inject=not no_inject and stacks != "none",
        flight_recorder=not no_flight_recorder,
        label_ranks=label_ranks,
        grace_s=grace,
        output_buffer_bytes=int(output_buffer * (1 << 20)),
        startup_grace_s=startup_grace,
        notify=_notify,
        redact=not no_redact,
    )
    try:
        result = run_job(opts)
    except Exception as exc:
        why = clean_text(str(exc), not no_redact)
        click.echo(f"ddpdoctor run: internal error: {type(exc).__name__}: {why}", err=True)
        sys.exit(INTERNAL)
    if isinstance(result, SupervisorError):
        click.echo(f"ddpdoctor run: {clean_text(str(result), not no_redact)}", err=True)
        sys.exit(127 if "cannot start" in str(result) else USAGE_OR_INPUT)
    if not quiet_report:
        click.echo(result.report_text.rstrip(), err=True)
    sys.exit(result.exit_code)
