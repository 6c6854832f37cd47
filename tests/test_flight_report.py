"""The recorders' view in the reports: `job.flight_recorder` in the JSON contract
(docs/report-schema.json), the cross-rank table in the text and HTML reports."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.report.to_html import to_html
from ddpdoctor.report.to_json import report_to_dict
from ddpdoctor.report.to_terminal import to_text
from tests.conftest import REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "real" / "flight-recorder"
SCHEMA = json.loads((REPO / "docs" / "report-schema.json").read_text())
CASES = ("skip", "op", "shape", "sleep", "die", "two-groups")


@pytest.mark.parametrize("case", CASES)
def test_json_report_with_dumps_validates(case: str) -> None:
    doc = report_to_dict(diagnose_paths([str(FIXTURES / case)]))
    jsonschema.validate(doc, SCHEMA)
    flight = doc["job"]["flight_recorder"]
    assert flight["divergences"] and flight["table"]
    views = {(v["rank"], v["group"]): v for v in flight["per_rank"]}
    assert views[(0, "0")]["last_issued"] is not None


def test_json_report_without_dumps_has_null() -> None:
    doc = report_to_dict(diagnose_paths([str(FIXTURES / "op" / "console.log")]))
    jsonschema.validate(doc, SCHEMA)
    assert doc["job"]["flight_recorder"] is None


def test_per_rank_view_of_the_sleeping_rank() -> None:
    doc = report_to_dict(diagnose_paths([str(FIXTURES / "sleep" / "dumps")]))
    views = {v["rank"]: v for v in doc["job"]["flight_recorder"]["per_rank"]}
    assert views[0]["last_issued"] == 5 and views[1]["last_issued"] == 4
    assert views[0]["last"]["op"] == "barrier" and views[1]["last"]["op"] == "all_reduce"
    # pg_status as the recorder wrote it (the latest of the rank's dumps)
    assert views[1]["last_enqueued"] == 4


def test_text_report_shows_the_table() -> None:
    report = diagnose_paths([str(FIXTURES / "op")])
    text = to_text(report, width=120)
    head = next(line for line in text.splitlines() if "Flight Recorder (" in line)
    assert "dumps from ranks 0,1" in head
    row = next(line for line in text.splitlines() if "broadcast [8] @" in line and "│" in line)
    assert "all_reduce [8] @ flight_cases.py:" in row and "broadcast [8] @ flight_cases.py:" in row
    assert "mismatch: different collectives at #4 of default_pg" in text


def test_text_report_marks_a_rank_without_dump() -> None:
    text = to_text(diagnose_paths([str(FIXTURES / "shape")]), width=120)
    assert "none from ranks 1" in text
    rows = [line for line in text.splitlines() if "all_reduce [4096]" in line]
    assert rows and rows[0].rstrip(" │").endswith("-")


def test_html_report_shows_the_table_escaped() -> None:
    html = to_html(diagnose_paths([str(FIXTURES / "two-groups")]))
    assert "<h2>Flight Recorder</h2>" in html
    assert "<strong>group-order</strong>" in html
    assert html.count('<tr class="role-root">') == 2  # #4 of default_pg and #1 of group 1
    assert "<script" not in html


def test_cli_reads_a_folder_of_dumps_only() -> None:
    """Dumps and no log: the recorders' view is reported (the verdict: test_flight_verdicts)."""
    proc = run_cli("diagnose", "--format", "json", str(FIXTURES / "die" / "dumps"))
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["job"]["flight_recorder"]["divergences"][0]["kind"] == "behind"
