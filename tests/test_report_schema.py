"""docs/report-schema.json and the typed model agree: every field of the model's dataclasses is
in the JSON report under a documented name (or is listed here with why not), every property the
schema documents comes from the model, and every key the real reports hold is documented
(additions need a schema change, not only code)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.findings import (
    Culprit,
    Evidence,
    Finding,
    JobInfo,
    RankExit,
    Report,
    Verdict,
)
from ddpdoctor.model.records import SourceInfo
from ddpdoctor.model.timeline import Arrow, Lane, Mark, Timeline
from ddpdoctor.report.render import render
from tests.conftest import REPO, corpus_cases, tier_sample

SCHEMA: dict[str, Any] = json.loads((REPO / "docs" / "report-schema.json").read_text())
REAL = REPO / "tests" / "fixtures" / "real"
CAPTURED = REPO / "src" / "ddpdoctor" / "scenarios" / "captured"

# (model class, where its object sits in the schema, field -> JSON name, fields not emitted)
MODEL: list[tuple[type, str, dict[str, str], dict[str, str]]] = [
    (Report, "", {"tool_version": "tool"}, {}),
    (Verdict, "verdict", {"basis": "confidence_basis"}, {}),
    (Culprit, "verdict.culprit", {}, {}),
    (Evidence, "$defs.evidence", {}, {}),
    (
        Finding,
        "findings[]",
        {},
        {
            "hits": "every raw line behind the finding; quoted through `evidence`",
            "note": "an inferred root's support, already in the verdict's summary",
        },
    ),
    (
        JobInfo,
        "job",
        {
            "exit_code": "exit.code",
            "exit_signal": "exit.signal",
            "per_rank": "exit.per_rank",
            "flight": "flight_recorder",
        },
        {},
    ),
    (RankExit, "job.exit.per_rank{}", {}, {}),
    (SourceInfo, "sources[]", {}, {}),
    (Timeline, "timeline", {}, {}),
    (Lane, "timeline.lanes[]", {}, {}),
    (Mark, "$defs.timeline_mark", {}, {}),
    (Arrow, "timeline.arrows[]", {"source": "from", "target": "to"}, {}),
]
NOT_FROM_THE_MODEL = {"": {"schema"}, "tool": {"name", "version"}}
"""Schema properties the renderer adds itself: the contract's name and the tool's."""


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    for alternative in node.get("anyOf", []):
        if alternative.get("type") != "null":
            return resolve(alternative)
    return node


def at(path: str) -> dict[str, Any]:
    """The schema object at a dotted path; `[]` steps into array items, `{}` into
    additionalProperties."""
    if path.startswith("$defs."):
        return resolve(SCHEMA["$defs"][path.split(".", 1)[1]])
    node = SCHEMA
    for part in [p for p in path.split(".") if p]:
        step, items, values = part.rstrip("[]{}"), part.endswith("[]"), part.endswith("{}")
        node = resolve(node["properties"][step])
        if items:
            node = resolve(node["items"])
        if values:
            node = resolve(node["additionalProperties"])
    return node


def declared(node: dict[str, Any], dotted: str) -> bool:
    for part in dotted.split("."):
        props = node.get("properties", {})
        if part not in props:
            return False
        node = resolve(props[part])
    return True


@pytest.mark.parametrize(
    "cls,path,renamed,left_out", MODEL, ids=lambda v: getattr(v, "__name__", "")
)
def test_every_model_field_is_documented(
    cls: type, path: str, renamed: dict[str, str], left_out: dict[str, str]
) -> None:
    node = at(path)
    fields = [f.name for f in dataclasses.fields(cls)]
    missing = [f for f in fields if f not in left_out and not declared(node, renamed.get(f, f))]
    assert missing == [], f"{cls.__name__} fields missing from the schema at {path!r}"


@pytest.mark.parametrize(
    "cls,path,renamed,left_out", MODEL, ids=lambda v: getattr(v, "__name__", "")
)
def test_every_documented_property_comes_from_the_model(
    cls: type, path: str, renamed: dict[str, str], left_out: dict[str, str]
) -> None:
    node = at(path)
    names = {renamed.get(f.name, f.name).split(".")[0] for f in dataclasses.fields(cls)}
    names |= NOT_FROM_THE_MODEL.get(path, set())
    extra = set(node.get("properties", {})) - names
    assert extra == set(), f"schema properties at {path!r} without a model field"


def keys_documented(value: Any, node: dict[str, Any], where: str) -> list[str]:
    """Paths of keys in `value` that the schema does not document."""
    node = resolve(node)
    out: list[str] = []
    if isinstance(value, dict):
        props = node.get("properties")
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                out += keys_documented(item, props[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                out += keys_documented(item, extra, f"{where}.{key}")
            elif props is not None:
                out.append(f"{where}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value[:50]:
            out += keys_documented(item, node["items"], f"{where}[]")
    return out


def real_inputs() -> list[Path]:
    cases = [p for p in sorted(REAL.iterdir()) if p.is_dir()]
    cases += [CAPTURED / "native-crash", CAPTURED / "collective-mismatch-shape"]
    cases += [REAL / "flight-recorder" / "run-hang" / "run"]
    return cases + [c / "logs" for c in corpus_cases()[:40]]


# every third input in `make test` (the same ones each run), all of them in `make fuzz`: the
# 2,750 reports, each validated by jsonschema, were its slowest part (239 s of test time, summed)
@pytest.mark.parametrize(
    "case", tier_sample(real_inputs()), ids=lambda p: p.parent.name + "/" + p.name
)
def test_real_reports_hold_only_documented_keys(case: Path) -> None:
    doc = json.loads(render(diagnose_paths([str(case)]), "json"))
    jsonschema.validate(doc, SCHEMA)
    assert keys_documented(doc, SCHEMA, "") == []
