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


_LEAVES = (int, float, bool, type(None))
_PLAIN = frozenset(_LEAVES)
"""Exactly these types are kept as they are without a look-up (subclasses go the long way)."""

Copier = Callable[[Any, Callable[[str], str]], Any]
_COPIERS: dict[type, Copier] = {}
"""How a value of each type is copied, decided once per type: a report of 10,000 rank files
holds about 20,000 objects (sources, per-rank exits) and 230,000 values; asking each value
what it is (and `dataclasses.replace` asking each class for its fields again) took half the
view's time."""


def _copy(value: Any, clean: Callable[[str], str]) -> Any:
    kind = type(value)
    if kind is str:
        return clean(value)
    if kind in _PLAIN:
        return value
    copier = _COPIERS.get(kind)
    if copier is None:
        copier = _COPIERS[kind] = _copier(kind)
    return copier(value, clean)


def _item(value: Any, clean: Callable[[str], str]) -> Any:
    kind = type(value)
    if kind is str:
        return clean(value)
    if kind in _PLAIN:
        return value
    return _copy(value, clean)


def _copier(kind: type) -> Copier:
    """Strings cleaned, leaves kept, dataclasses (but the fields no renderer shows), lists,
    tuples and dicts copied item by item; anything else kept as it is."""
    if issubclass(kind, str):
        return lambda value, clean: clean(value)
    if issubclass(kind, _LEAVES):
        return lambda value, clean: value
    if dataclasses.is_dataclass(kind) and not _has_init_vars(kind):
        made = [f.name for f in dataclasses.fields(kind) if f.init]
        copied = tuple(name for name in made if name not in NOT_SHOWN)
        kept = tuple(name for name in made if name in NOT_SHOWN)
        build = cast(Callable[..., Any], kind)

        def dataclass_copy(value: Any, clean: Callable[[str], str]) -> Any:
            # as dataclasses.replace(value, **changes) does: every init field passed again
            changes = {name: _item(getattr(value, name), clean) for name in copied}
            for name in kept:
                changes[name] = getattr(value, name)
            return build(**changes)

        return dataclass_copy
    if dataclasses.is_dataclass(kind):
        return _replaced
    if issubclass(kind, list):
        return lambda value, clean: [_item(v, clean) for v in value]
    if issubclass(kind, tuple):
        return lambda value, clean: tuple(_item(v, clean) for v in value)
    if issubclass(kind, dict):
        return lambda value, clean: {_item(k, clean): _item(v, clean) for k, v in value.items()}
    return lambda value, clean: value


def _has_init_vars(kind: type) -> bool:
    found = getattr(kind, "__dataclass_fields__", {})
    return any(f._field_type is dataclasses._FIELD_INITVAR for f in found.values())  # type: ignore[attr-defined]


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(
            f.name for f in dataclasses.fields(cls) if f.init and f.name not in NOT_SHOWN
        )
    return names


def _replaced(value: Any, clean: Callable[[str], str]) -> Any:
    changes = {name: _copy(getattr(value, name), clean) for name in _fields(type(value))}
    return dataclasses.replace(value, **changes)
