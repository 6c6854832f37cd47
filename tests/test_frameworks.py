"""Which training framework a job ran under, read from its tracebacks' frames, and the fix
steps in that framework's terms that the verdict then puts first (rules/frameworks.py,
Rule.framework_fix). Frames are taken from the captured logs of real runs."""

from __future__ import annotations

import functools

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.rules.base import Explanation, Rule, RuleDefinitionError
from ddpdoctor.rules.docs import rule_markdown
from ddpdoctor.rules.frameworks import FRAMEWORKS, frameworks_in
from ddpdoctor.rules.registry import all_rules
from ddpdoctor.scenarios import catalog, runner

LABELS = tuple(f"{f.label}:" for f in FRAMEWORKS)


@functools.cache
def frames(name: str) -> tuple[str, ...]:
    """The traceback frame lines of a captured scenario's console."""
    text = (catalog.get(name).captured_dir / runner.CONSOLE_LOG).read_text(errors="replace")
    return tuple(line for line in text.splitlines() if 'File "' in line)


@pytest.mark.parametrize(
    ("scenario", "found"),
    [
        ("accelerate-loss-main-only", ["accelerate"]),
        ("lightning-unused-parameters", ["lightning"]),
        # the Trainer drives its own Accelerator: accelerate's frames are in its tracebacks,
        # its advice is not for Trainer users
        ("hf-trainer-unused-parameters", ["transformers"]),
        ("data-error", []),
    ],
)
def test_frameworks_are_read_from_the_frames(scenario: str, found: list[str]) -> None:
    assert frameworks_in(list(frames(scenario))) == found


def test_the_trainer_hides_accelerate_only_when_its_own_frames_are_there() -> None:
    lines = frames("hf-trainer-evaluate-main-only")
    assert frameworks_in(list(lines)) == ["transformers"]
    assert any("/accelerate/" in line for line in lines)
    no_trainer = [line for line in lines if "/transformers/trainer" not in line]
    assert frameworks_in(no_trainer) == ["accelerate"]


def test_transformers_code_outside_the_trainer_is_not_the_trainer() -> None:
    """transformers' collators and models run under any framework (Accelerate, Lightning)."""
    lines = frames("hf-trainer-eval-exception")
    collator = [line for line in lines if "/transformers/data/" in line]
    assert collator
    assert frameworks_in(collator) == []


def test_a_fix_for_an_unknown_framework_is_a_definition_error() -> None:
    with pytest.raises(RuleDefinitionError, match="unknown framework 'keras'"):
        Rule(
            code="T999",
            kind="python-exception",
            title="t",
            signatures=(),
            explanation=Explanation("w", "y", "f"),
            fix=("f",),
            framework_fix=(("keras", "model.fit(...)"),),
        )


def test_framework_fixes_are_documented() -> None:
    ddp101 = next(r for r in all_rules() if r.code == "DDP101")
    page = rule_markdown(ddp101)
    assert "- Lightning: make every parameter take part" in page
    assert "DDPStrategy(find_unused_parameters=True)" in page
    assert "TrainingArguments(ddp_find_unused_parameters=True)" in page


@pytest.mark.parametrize(
    "scenario",
    [s for s in catalog.SCENARIOS if s.framework is None],
    ids=lambda s: s.name,
)
def test_raw_jobs_get_no_framework_advice(scenario: catalog.Scenario) -> None:
    fix = diagnose_paths(runner.log_paths(scenario.captured_dir)).verdict.fix
    assert not [step for step in fix if step.startswith(LABELS)]


@pytest.mark.parametrize(
    "scenario",
    [s for s in catalog.SCENARIOS if s.expected_fix],
    ids=lambda s: s.name,
)
def test_only_the_frameworks_own_advice(scenario: catalog.Scenario) -> None:
    fix = diagnose_paths(runner.log_paths(scenario.captured_dir)).verdict.fix
    label = next(f.label for f in FRAMEWORKS if f.name == scenario.framework)
    assert [step for step in fix if step.startswith(LABELS)] == [
        step for step in fix if step.startswith(f"{label}:")
    ]


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.framework_fix], ids=lambda r: r.code)
def test_each_framework_step_names_its_framework(rule: Rule) -> None:
    """A step is shown alone in a verdict's fix list: it says whose terms it is in."""
    labels = {f.name: f.label for f in FRAMEWORKS}
    for name, step in rule.framework_fix:
        assert step.startswith(f"{labels[name]}: "), (rule.code, step)
