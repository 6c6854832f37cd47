"""A self-contained HTML report (rich's recording console export), one file to attach to a
ticket."""

from __future__ import annotations

from rich.console import Console

from ddpdoctor.model.findings import Report
from ddpdoctor.report.to_terminal import _NullFile, renderables


def to_html(report: Report, width: int = 110) -> str:
    console = Console(width=width, record=True, force_terminal=True, file=_NullFile())
    for r in renderables(report):
        console.print(r)
    return console.export_html(inline_styles=True)
