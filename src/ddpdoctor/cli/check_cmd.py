"""`ddpdoctor check [opts]`: preflight. Thin: parse options, call `preflight.session`, render the
result as text (rich) or JSON (`ddpdoctor.check/v1`), exit 0 when everything passes, 1 when a
check or the collective test fails, 2 on usage or input errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ddpdoctor.cli.exitcodes import FAILURE_FOUND, OK, USAGE_OR_INPUT
from ddpdoctor.preflight.checks import CheckOptions
from ddpdoctor.preflight.render import WIDTH, render
from ddpdoctor.preflight.session import (
    SCHEMA,
    CheckConfig,
    result_from_facts,
    result_from_worker,
    run_check,
)
from ddpdoctor.redaction import clean_value

MULTI_NODE_HELP = """
On several nodes, run the worker under your own launcher on every node, then render its result:

\b
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
      --rdzv-endpoint HOST:29500 -m ddpdoctor.preflight.worker --output /shared/check.json
  ddpdoctor check --result /shared/check.json
"""


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise click.BadParameter(f"{path} is not JSON: {exc}") from exc


def _facts_from(paths: tuple[Path, ...]) -> list[dict[str, Any]]:
    """Fact files: one fact dict, a list of them, or a saved check result (its ranks/facts)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        data = _load_json(p)
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            data = data.get("ranks") or [data.get("facts") or {}]
        items = data if isinstance(data, list) else [data]
        for item in items:
            if not isinstance(item, dict):
                raise click.BadParameter(f"{p}: expected fact objects, got {type(item).__name__}")
            out.append(item)
    return out


@click.command("check", epilog=MULTI_NODE_HELP)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Run the collective test with N local ranks (torchrun --standalone). "
    "Without it only facts and checks.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "gloo", "nccl"]),
    default="auto",
    show_default=True,
    help="auto: nccl with GPUs, gloo otherwise.",
)
@click.option(
    "--attempt-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds one launch of the test may take before it counts as hung.",
)
@click.option(
    "--timeout",
    "total_timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds for the whole check, bisection included.",
)
@click.option(
    "--pg-timeout",
    type=click.FloatRange(min=1),
    default=None,
    help="init_process_group timeout in the test (default: half the attempt timeout, >= 5).",
)
@click.option(
    "--sizes",
    default="1024,16384,262144,1048576",
    show_default=True,
    help="Message sizes in bytes for the bandwidth table (comma list).",
)
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--no-bisect", is_flag=True, help="Do not rerun a failing test under variations.")
@click.option("--bisect-all", is_flag=True, help="Try every variation, not only until one works.")
@click.option("--master-addr", default=None, help="Rendezvous address (with --master-port).")
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    envvar="MASTER_PORT",
    default=None,
    help="Use this rendezvous port as your job would (default: a free one; env MASTER_PORT).",
)
@click.option(
    "--num-workers",
    type=click.IntRange(min=0),
    default=None,
    help="DataLoader workers per rank in your job (0 silences the /dev/shm check).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    help="Where the job writes (free disk is checked there).",
)
@click.option(
    "--facts",
    "facts_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check saved fact sets (JSON: one, a list, or a check result) instead of this node.",
)
@click.option(
    "--result",
    "worker_result",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Render and check a result written by `-m ddpdoctor.preflight.worker`.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--strict", is_flag=True, help="Warnings fail the check too (exit 1).")
@click.option(
    "--no-redact",
    is_flag=True,
    help="Show secret-looking environment values and output lines as they are.",
)
def check(
    nproc_per_node: int | None,
    backend: str,
    attempt_timeout: float,
    total_timeout: float,
    pg_timeout: float | None,
    sizes: str,
    iters: int,
    no_bisect: bool,
    bisect_all: bool,
    master_addr: str | None,
    master_port: int | None,
    num_workers: int | None,
    workdir: Path,
    facts_files: tuple[Path, ...],
    worker_result: Path | None,
    fmt: str,
    output: Path | None,
    strict: bool,
    no_redact: bool,
) -> None:
    """Preflight: facts of this node, checks over them, and (with --nproc-per-node) a short
    collective test with transport bisection when it fails."""
    if facts_files and worker_result:
        raise click.UsageError("--facts and --result exclude each other")
    if (facts_files or worker_result) and nproc_per_node:
        raise click.UsageError("--nproc-per-node runs a test here; it excludes --facts/--result")
    try:
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        raise click.BadParameter(
            f"not a comma list of integers: {sizes}", param_hint="--sizes"
        ) from exc
    if not size_list or min(size_list) <= 0:
        raise click.BadParameter("sizes must be positive", param_hint="--sizes")

    options = CheckOptions(num_workers=num_workers, nproc_per_node=nproc_per_node)
    if facts_files:
        result = result_from_facts(_facts_from(facts_files), options)
    elif worker_result:
        data = _load_json(worker_result)
        if not isinstance(data, dict) or "ranks" not in data:
            raise click.BadParameter(f"{worker_result} is not a worker result")
        result = result_from_worker(data, options)
    else:
        cfg = CheckConfig(
            nproc_per_node=nproc_per_node,
            backend=backend,
            attempt_timeout_s=attempt_timeout,
            total_timeout_s=total_timeout,
            pg_timeout_s=pg_timeout,
            sizes=",".join(str(s) for s in size_list),
            iters=iters,
            bisect=not no_bisect,
            bisect_all=bisect_all,
            master_addr=master_addr,
            master_port=master_port,
            workdir=str(workdir),
            options=options,
        )
        result = run_check(cfg)
    # env values (HF_TOKEN, ...), the test's output lines, saved results: masked before printing
    result = clean_value(result, not no_redact)

    if fmt == "json":
        text = json.dumps(result, indent=2, default=str) + "\n"
        if output:
            output.write_text(text)
        else:
            click.echo(text, nl=False)
    else:
        if output:
            with output.open("w") as fh:
                render(result, Console(file=fh, width=WIDTH, no_color=True, highlight=False))
        else:
            probe = Console()
            width = min(WIDTH, probe.width) if probe.is_terminal else WIDTH
            render(result, Console(width=width, highlight=False))
    failed = result["status"] == "failed" or (strict and result["status"] == "warnings")
    sys.exit(FAILURE_FOUND if failed else OK)


__all__ = ["USAGE_OR_INPUT", "check"]
