"""The report as ddpdoctor shows it: every string in it (verdict, evidence, findings, job,
sources, timeline) with terminal control sequences stripped and, unless asked not to, secrets
masked. Every renderer goes through here, so no output format can forget it. Returns copies: the
analysis' own objects are never changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

from ddpdoctor.model.findings import Report
from ddpdoctor.redaction import clean_text
from ddpdoctor.report.timeline import build_timeline

# Fields that no renderer shows: the raw hits behind a finding hold every record of the scan;
# copying them would cost time for nothing.
NOT_SHOWN = frozenset({"hits"})


_SHOWN: dict[int, tuple[Report, bool]] = {}
"""The copies made, by id, each held with its redact flag: showing a copy again (the CLI
checks the copy, then renders it) returns it as it is instead of copying it all over again."""


def shown(report: Report, redact: bool = True) -> Report:
    """A copy of `report` fit to print: control sequences stripped, secrets masked if `redact`."""
    made = _SHOWN.get(id(report))
    if made is not None and made[0] is report and (made[1] or not redact):
        return report
    cache: dict[str, str] = {}

    def clean(text: str) -> str:
        out = cache.get(text)
        if out is None:
            out = cache[text] = clean_text(text, redact)
        return out

    copy = cast(Report, _copy(report, clean))
    if copy.timeline is None:  # built from the raw hits, which are not copied: cleaned here
        copy.timeline = _copy(build_timeline(report), clean)
    _SHOWN.clear()  # only the latest copy is remembered: nothing accumulates
    _SHOWN[id(copy)] = (copy, redact)
    return copy


_FIELDS: dict[type, tuple[str, ...]] = {}
_LEAVES = (int, float, bool, type(None))


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(
            f.name for f in dataclasses.fields(cls) if f.init and f.name not in NOT_SHOWN
        )
    return names


def _copy(value: Any, clean: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, _LEAVES):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {name: _copy(getattr(value, name), clean) for name in _fields(type(value))}
        return dataclasses.replace(value, **changes)
    if isinstance(value, list):
        return [_copy(v, clean) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy(v, clean) for v in value)
    if isinstance(value, dict):
        return {_copy(k, clean): _copy(v, clean) for k, v in value.items()}
    return value
