"""The causality engine names no rule code and no kind: what a rule means to it is declared on
the rule (rules/base.py) and inferred causes live in rules/hypotheses. A new failure kind then
touches its rule or hypothesis, its fixtures and one registry line, never the engine."""

from __future__ import annotations

import re

from ddpdoctor.model.taxonomy import KINDS
from ddpdoctor.rules.base import CAPTURES
from ddpdoctor.rules.registry import HYPOTHESES, all_rules
from tests.conftest import REPO

ANALYSIS = REPO / "src" / "ddpdoctor" / "analysis"
RULE_CODE = re.compile(r"\b(?:DDP|COL|TMO|NET|CUDA|LCH|DATA|DL|ENV|PY|EXIT|PERF|INF|HANG)\d{3}\b")


def test_no_rule_code_or_kind_in_the_engine() -> None:
    for path in sorted(ANALYSIS.glob("*.py")):
        text = path.read_text()
        assert not RULE_CODE.findall(text), (path.name, RULE_CODE.findall(text))
        quoted = {m for m in re.findall(r"[\"']([a-z0-9-]+)[\"']", text) if m in KINDS}
        assert not quoted, (path.name, quoted)


def test_every_capture_group_is_declared() -> None:
    for rule in all_rules():
        for sig in rule.signatures:
            assert set(sig.compiled.groupindex) <= set(CAPTURES), (rule.code, sig.regex)


def test_every_hypothesis_is_a_documented_rule() -> None:
    codes = {r.code for r in all_rules()}
    for hypothesis in HYPOTHESES:
        assert hypothesis.rule.code in codes
        assert not hypothesis.rule.signatures
        assert hypothesis.rule.explanation.what and hypothesis.rule.fix
        assert hypothesis.assess.__doc__ is None or hypothesis.assess.__module__.startswith(
            "ddpdoctor.rules.hypotheses"
        )
