"""The report as ddpdoctor shows it: every string in it (verdict, evidence, findings, job,
sources) with terminal control sequences stripped and, unless asked not to, secrets masked.
Every renderer goes through here, so no output format can forget it. Returns copies: the
analysis' own objects are never changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

from ddpdoctor.model.findings import Report
from ddpdoctor.redaction import clean_text

# Fields that no renderer shows: the raw hits behind a finding hold every record of the scan;
# copying them would cost time for nothing.
NOT_SHOWN = frozenset({"hits"})


def shown(report: Report, redact: bool = True) -> Report:
    """A copy of `report` fit to print: control sequences stripped, secrets masked if `redact`."""
    cache: dict[str, str] = {}

    def clean(text: str) -> str:
        out = cache.get(text)
        if out is None:
            out = cache[text] = clean_text(text, redact)
        return out

    return cast(Report, _copy(report, clean))


def _copy(value: Any, clean: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return clean(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _copy(getattr(value, f.name), clean)
            for f in dataclasses.fields(value)
            if f.init and f.name not in NOT_SHOWN
        }
        return dataclasses.replace(value, **changes)
    if isinstance(value, list):
        return [_copy(v, clean) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy(v, clean) for v in value)
    if isinstance(value, dict):
        return {_copy(k, clean): _copy(v, clean) for k, v in value.items()}
    return value
