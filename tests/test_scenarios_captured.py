"""Diagnoses the logs captured from real scenario runs (no torch needed) and checks each aspect
of the verdict against the catalog; known analysis gaps are strict xfails. Also the `demo`
command in replay mode."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.cli import demo_cmd
from ddpdoctor.model.findings import Report
from ddpdoctor.scenarios import catalog, runner


def _cases() -> list[object]:
    cases: list[object] = []
    for s in catalog.SCENARIOS:
        for aspect in catalog.ASPECTS:
            gap = s.gaps.get(aspect)
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
            cases.append(pytest.param(s, aspect, marks=marks, id=f"{s.name}-{aspect}"))
    return cases


@functools.cache
def _report(name: str) -> Report:
    return diagnose_paths(runner.log_paths(catalog.get(name).captured_dir))


@pytest.mark.parametrize(("scenario", "aspect"), _cases())
def test_captured_diagnosis(scenario: catalog.Scenario, aspect: str) -> None:
    problems = catalog.mismatches(scenario, _report(scenario.name))
    assert aspect not in problems, problems[aspect]


@pytest.mark.parametrize("scenario", catalog.SCENARIOS, ids=lambda s: s.name)
def test_captured_logs_are_real_runs(scenario: catalog.Scenario) -> None:
    meta = runner.read_meta(scenario.captured_dir)
    assert meta["scenario"] == scenario.name
    assert str(meta["torch"]).startswith("2.")
    if scenario.expected_status == "ok":
        assert meta["exit_code"] == 0
    else:
        assert meta["exit_code"] not in (0, None)
    if scenario.framework is not None:  # the framework's version is kept with its log
        assert isinstance(meta["framework"], dict)
        assert meta["framework"][scenario.framework]
    assert meta["timed_out"] is False
    paths = runner.log_paths(scenario.captured_dir)
    assert paths and paths[0].endswith(runner.CONSOLE_LOG)
    assert meta["files"] == [p.split(f"{scenario.name}/", 1)[1] for p in paths]


def test_catalog_is_consistent() -> None:
    names = [s.name for s in catalog.SCENARIOS]
    assert len(names) == len(set(names))
    assert catalog.DEFAULT_SCENARIO in names
    for s in catalog.SCENARIOS:
        assert s.program_path.is_file() != (s.expected_kind == "entrypoint-not-found"), s.name
        assert set(s.gaps) <= set(catalog.ASPECTS), s.name
        assert not s.cascade_ranks or s.expected_culprits is not None, s.name


def test_demo_list() -> None:
    result = CliRunner().invoke(demo_cmd.demo, ["--list"])
    assert result.exit_code == 0
    for s in catalog.SCENARIOS:
        assert s.name in result.output


def test_demo_unknown_scenario_is_a_usage_error() -> None:
    result = CliRunner().invoke(demo_cmd.demo, ["no-such-scenario"])
    assert result.exit_code == 2
    assert "unknown scenario" in result.output


def test_demo_replays_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_cmd, "torch_available", lambda: False)
    result = CliRunner().invoke(demo_cmd.demo, [])
    assert result.exit_code == 0, result.output
    assert "REPLAY (torch is not importable here)" in result.output
    assert "data-error" in result.output
    assert "the diagnosis matches" in result.output


def test_demo_replay_json_and_keep(tmp_path: Path) -> None:
    keep = tmp_path / "logs"
    args = ["host-oom", "--replay", "--format", "json", "--keep", str(keep)]
    result = CliRunner().invoke(demo_cmd.demo, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "ddpdoctor.report/v1"
    assert data["verdict"]["kind"] == "host-oom"
    assert data["demo"] == {
        "scenario": "host-oom",
        "mode": "replay",
        "logs": [str(keep / runner.CONSOLE_LOG)],
        "expected": {"kind": "host-oom", "category": "resource"},
        "matches_expected": True,
    }


def test_demo_replays_a_scenario_this_machine_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without /dev/full the disk-full injection would fail for another reason: replay it."""
    scenario = catalog.get("disk-full-checkpoint")
    monkeypatch.setattr(catalog, "get", lambda name: replace(scenario, needs=("/no/such/device",)))
    result = CliRunner().invoke(demo_cmd.demo, ["disk-full-checkpoint"])
    assert result.exit_code == 0, result.output
    assert "REPLAY (this machine has no /no/such/device)" in result.output
    assert "disk-full" in result.output


def test_a_framework_that_is_not_installed_is_a_missing_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the framework the scenario cannot run: the real tests skip it, saying what is
    missing, and demo replays its bundled logs."""
    scenario = replace(catalog.get("lightning-early-stop"), framework="no_such_framework")  # type: ignore[arg-type]
    assert scenario.missing_needs == ["no_such_framework"]
    monkeypatch.setattr(catalog, "get", lambda name: scenario)
    result = CliRunner().invoke(demo_cmd.demo, ["lightning-early-stop"])
    assert result.exit_code == 0, result.output
    assert "REPLAY (this machine has no no_such_framework)" in result.output
    assert "Injected fault: none (ok); the diagnosis matches." in result.output


def test_healthy_runs_are_listed_as_such() -> None:
    result = CliRunner().invoke(demo_cmd.demo, ["--list"])
    line = next(ln for ln in result.output.splitlines() if ln.startswith("hf-trainer-healthy"))
    assert "none (ok)" in line
