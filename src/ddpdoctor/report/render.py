"""Pick a renderer by format name. Every format renders the report as `view.shown` returns it:
control sequences stripped, secrets masked unless `redact` is False."""

from __future__ import annotations

from ddpdoctor.model.findings import Report
from ddpdoctor.report.to_json import to_json
from ddpdoctor.report.view import shown

FORMATS = ("text", "json", "html")


def render(
    report: Report,
    fmt: str = "text",
    width: int | None = None,
    color: bool = False,
    redact: bool = True,
) -> str:
    report = shown(report, redact)
    if fmt == "json":
        return to_json(report)
    if fmt == "html":  # rich is imported only for the text report
        from ddpdoctor.report.to_html import to_html

        return to_html(report, width=width or 110)
    from ddpdoctor.report.to_terminal import to_text

    return to_text(report, width=width or 100, color=color)
