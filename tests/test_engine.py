"""The fast engine and the stdlib fallback must find exactly the same things."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.engine import hyperscan_available
from ddpdoctor.report.to_json import report_to_dict
from tests.conftest import corpus_cases


@pytest.mark.skipif(not hyperscan_available(), reason="hyperscan not installed")
@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_same_report_with_and_without_hyperscan(case: Path) -> None:
    fast = report_to_dict(diagnose_paths([str(case / "logs")], engine="auto"))
    slow = report_to_dict(diagnose_paths([str(case / "logs")], engine="stdlib"))
    assert fast == slow
