"""Runs every scenario for real (torchrun + gloo on CPU, one after another, each under its outer
timeout) and checks each aspect of the diagnosis against the catalog, as the captured tests do.
Known analysis gaps are strict xfails. Skipped where torch cannot be imported; the scenarios
written with Accelerate, Lightning or the transformers Trainer (marker `frameworks`) are skipped,
saying so, where that framework is not installed (`make setup-frameworks`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.findings import Report
from ddpdoctor.scenarios import catalog, runner

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed"),
]

_RUNS: dict[str, tuple[runner.RunResult, Report]] = {}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scenarios")


def _run(scenario: catalog.Scenario, base: Path) -> tuple[runner.RunResult, Report]:
    """Each scenario runs once per session, whichever aspect asks first."""
    if scenario.name not in _RUNS:
        result = runner.run(scenario, base / scenario.name)
        _RUNS[scenario.name] = (result, diagnose_paths(result.log_paths))
    return _RUNS[scenario.name]


def _cases() -> list[object]:
    cases: list[object] = []
    for s in catalog.SCENARIOS:
        tier = [pytest.mark.frameworks] if s.framework else []
        cases.append(pytest.param(s, "run", marks=tier, id=f"{s.name}-run"))
        for aspect in catalog.ASPECTS:
            gap = s.gaps.get(aspect)
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
            cases.append(pytest.param(s, aspect, marks=tier + marks, id=f"{s.name}-{aspect}"))
    return cases


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("scenario", "aspect"), _cases())
def test_real_scenario(scenario: catalog.Scenario, aspect: str, run_dir: Path) -> None:
    if scenario.missing_needs:
        hint = " (make setup-frameworks)" if scenario.framework else ""
        pytest.skip(f"{scenario.name} needs {', '.join(scenario.missing_needs)}{hint}")
    result, report = _run(scenario, run_dir)
    if aspect == "run":
        assert not result.timed_out, f"{scenario.name} ran past {scenario.timeout_s} s"
        if scenario.expected_status == "ok":
            assert result.exit_code == 0
        else:
            assert result.exit_code not in (0, None)
        assert (result.out_dir / runner.META_JSON).is_file()
        return
    problems = catalog.mismatches(scenario, report)
    assert aspect not in problems, problems[aspect]


@pytest.mark.timeout(180)
def test_demo_runs_live(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ddpdoctor.cli.demo_cmd import demo

    result = CliRunner().invoke(demo, ["--format", "json", "--keep", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["demo"]["mode"] == "live"
    assert data["demo"]["matches_expected"] is True
    assert data["verdict"]["culprit"]["ranks"] == [1]
    assert runner.read_meta(tmp_path)["scenario"] == "data-error"
