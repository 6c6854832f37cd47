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
    return _ascii_only(plain.replace('\\"', '"'))


_RG_ESCAPABLE = frozenset("\\.+*?()|[]{}^$#&-~")
"""The punctuation rg's regex syntax lets one escape; `\\ ` (Python's re.escape of a space)
and the like are errors there."""


def _ascii_only(regex: str) -> str:
    """The pattern for rg --no-unicode (bytes, ASCII classes): a non-ASCII character becomes
    its UTF-8 bytes; a class holding some becomes an alternation of its ASCII part and their
    byte sequences, or, negated, loses them (it then matches at least the same lines); an
    escaped space (or other punctuation rg does not escape) becomes the character itself."""
    out: list[str] = []
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            plain = not nxt.isalnum() and nxt not in _RG_ESCAPABLE and nxt.isascii()
            out.append(nxt if plain else _byte_escape(nxt) if not nxt.isascii() else c + nxt)
            i += 2
        elif c == "[":
            end = _class_end(regex, i)
            out.append(_ascii_class(regex[i:end]))
            i = end
        else:
            out.append(c if c.isascii() else _byte_escape(c))
            i += 1
    return "".join(out)


def _byte_escape(char: str) -> str:
    return "(?:" + "".join(f"\\x{b:02X}" for b in char.encode()) + ")"


def _ascii_class(cls: str) -> str:
    if cls.isascii():
        return cls
    negated = cls.startswith("[^")
    body = cls[2 if negated else 1 : -1]
    ascii_part: list[str] = []
    wide: list[str] = []
    i = 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            ascii_part.append(body[i : i + 2])
            i += 2
            continue
        (ascii_part if body[i].isascii() else wide).append(body[i])
        i += 1
    members = "".join(ascii_part)
    if negated:
        return f"[^{members}]" if members else "[\\x00-\\xFF]"
    alternatives = ([f"[{members}]"] if members else []) + [
        "".join(f"\\x{b:02X}" for b in w.encode()) for w in wide
    ]
    return "(?:" + "|".join(alternatives) + ")"


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
