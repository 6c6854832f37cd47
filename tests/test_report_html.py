"""The HTML report: one self-contained page with the verdict, quoted evidence, fixes, every
finding, the job and the sources; log text is escaped, never markup."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.report.render import render

CAPTURED = Path(__file__).parents[1] / "src" / "ddpdoctor" / "scenarios" / "captured"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _page(paths: list[str]) -> tuple[str, _Collect]:
    html = render(diagnose_paths(paths), "html")
    parsed = _Collect()
    parsed.feed(html)
    return html, parsed


def test_the_page_holds_verdict_evidence_fixes_findings_job_and_sources(tmp_path: Path) -> None:
    log = CAPTURED / "native-crash" / "console.log"
    html, page = _page([str(log), str(tmp_path / "missing.log")])
    text = " ".join(page.text)
    assert html.startswith("<!DOCTYPE html>")
    assert "script" not in page.tags and "link" not in page.tags  # self-contained, inert
    for heading in ("Evidence", "What to do", "Findings", "Job", "Sources"):
        assert heading in text
    assert "Culprit: rank 1" in text
    assert re.search(r"console\.log:\d+", text)  # evidence quoted as file:line
    assert "SIGSEGV" in text
    assert "skipped: no such file" in text


def test_log_text_is_escaped(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    real = (CAPTURED / "data-error" / "console.log").read_text()
    log.write_text(real.replace("shard-", "<script>alert(1)</script>shard-"))
    html, page = _page([str(log)])
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "script" not in page.tags
