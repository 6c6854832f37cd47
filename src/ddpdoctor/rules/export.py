"""The signature set as patterns `rg -f` accepts (grep does not: `-E` lacks digit classes
and scoped flags, `-P` takes one pattern): used to compare ddpdoctor with rg on the same work,
and by people who want to search for the same lines themselves."""

from __future__ import annotations

import re

_NAMED_GROUP = re.compile(r"\(\?P<\w+>")
_LOOKAROUND_OPENERS = ("(?=", "(?!", "(?<=", "(?<!")


def rg_regex(regex: str) -> str:
    """One Python signature regex as one rg pattern that matches at least the same lines.

    Named groups become plain groups; look-arounds (rg's default engine has none) are dropped,
    which only widens the pattern, as the prefilter does; `\\"` (a needless escape rg rejects)
    becomes `"`."""
    plain = _NAMED_GROUP.sub("(", _without_lookarounds(regex))
    return plain.replace('\\"', '"')


def _without_lookarounds(regex: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(regex):
        if regex[i] == "\\":
            out.append(regex[i : i + 2])
            i += 2
        elif regex[i] == "[":
            end = _class_end(regex, i)
            out.append(regex[i:end])
            i = end
        elif regex.startswith(_LOOKAROUND_OPENERS, i):
            i = _group_end(regex, i)
        else:
            out.append(regex[i])
            i += 1
    return "".join(out)


def _class_end(regex: str, start: int) -> int:
    """Index just past the character class opening at `start` (`[]...]` and `[^]...]` too)."""
    i = start + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1
    while i < len(regex) and regex[i] != "]":
        i += 2 if regex[i] == "\\" else 1
    return i + 1


def _group_end(regex: str, start: int) -> int:
    """Index just past the group opening at `start`, skipping escapes and classes inside."""
    depth = 0
    i = start
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(regex, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i
