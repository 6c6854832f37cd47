"""The JSON report follows the v1 contract (docs/report-schema.json) on every corpus case."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.taxonomy import KINDS
from ddpdoctor.report.to_json import report_to_dict
from tests.conftest import REPO, corpus_cases

SCHEMA = json.loads((REPO / "docs" / "report-schema.json").read_text())


@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_report_validates(case: Path) -> None:
    doc = report_to_dict(diagnose_paths([str(case / "logs")]))
    jsonschema.validate(doc, SCHEMA)
    assert doc["verdict"]["kind"] is None or doc["verdict"]["kind"] in KINDS
    for f in doc["findings"]:
        assert f["kind"] in KINDS
    roots = [f for f in doc["findings"] if f["role"] == "root"]
    if doc["verdict"]["status"] == "ok":
        assert not roots


def test_evidence_points_at_real_lines(corpus: Path) -> None:
    """Every quoted line is really at source:line."""
    case = corpus / "006-cuda-oom-rank2-funasr-cascade"
    doc = report_to_dict(diagnose_paths([str(case / "logs")]))
    for ev in doc["verdict"]["evidence"]:
        lines = Path(ev["source"]).read_text().splitlines()
        assert ev["text"][:40] in lines[ev["line"] - 1]
