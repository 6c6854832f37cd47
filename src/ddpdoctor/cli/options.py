"""Checks and defaults of command-line options that the commands share: the report format from
the output file's extension, an output folder that must exist, rule selectors that must match.
Bad values are usage errors (exit 2), never internal errors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import PurePath

import click

from ddpdoctor.rules.base import Rule

MIN_WIDTH = 40
"""Narrower than this, the text report's panels and tables cannot hold a line of evidence."""
FORMAT_OF_SUFFIX = {".html": "html", ".htm": "html", ".json": "json", ".txt": "text"}


def format_for(output: str | None) -> str:
    """The format an output file's extension asks for; text for stdout or another extension."""
    if output is None:
        return "text"
    return FORMAT_OF_SUFFIX.get(PurePath(output).suffix.lower(), "text")


def output_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An --output whose folder is missing (or is a file) is a usage error, found before the
    logs are read."""
    if value is None or value == "-":
        return value
    folder = os.path.dirname(value) or "."
    if not os.path.isdir(folder):
        why = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise click.BadParameter(f"the folder {folder!r} {why}", ctx=ctx, param=param)
    return value


def selected(rules: Sequence[Rule], select: str) -> list[Rule]:
    """Rules whose code starts with one of the comma-separated prefixes; like ruff, a prefix
    that selects nothing is an error, not an empty list."""
    prefixes = [p.strip().upper() for p in select.split(",") if p.strip()]
    if not prefixes:
        raise click.BadParameter("no rule code prefix given", param_hint="--select")
    unknown = [p for p in prefixes if not any(r.code.startswith(p) for r in rules)]
    if unknown:
        raise click.BadParameter(
            f"no rule code starts with {', '.join(unknown)} (see `ddpdoctor rules`)",
            param_hint="--select",
        )
    return [r for r in rules if any(r.code.startswith(p) for p in prefixes)]
