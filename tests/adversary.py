"""Adversarial lines for a regex, built from its parse tree: for every repeat in it, the text
that leads up to the repeat followed by a long run of what the repeat accepts, the same text
repeated (many starting points, each scanning far), and near misses of its required literal.
These are the shapes that make a backtracking engine take quadratic time or worse."""

from __future__ import annotations

import re
import re._constants as sre
import re._parser as sre_parse
from collections.abc import Iterator
from typing import Any

PROBE = "a7 -_.:/'\"()[]=,xZ0\t;|<>%"
"""Characters tried against each repeated class; the regex's own literal is added to them."""
_REPEATS = tuple(
    op
    for op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None))
    if op is not None
)
_ONE_CHAR = (sre.ANY, sre.IN, sre.LITERAL, sre.NOT_LITERAL, sre.CATEGORY)
_CATEGORY = {
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\w",
    sre.CATEGORY_NOT_WORD: r"\W",
}


def _one_char_regex(op: Any, arg: Any) -> str:
    """A parsed single-character item as a regex of its own, to probe which characters it takes."""
    if op is sre.ANY:
        return "."
    if op is sre.LITERAL:
        return re.escape(chr(arg))
    if op is sre.NOT_LITERAL:
        return "[^" + re.escape(chr(arg)) + "]"
    if op is sre.CATEGORY:
        return _CATEGORY.get(arg, "(?!)")
    parts, negate = [], False
    for o, a in arg:
        if o is sre.NEGATE:
            negate = True
        elif o is sre.LITERAL:
            parts.append(re.escape(chr(a)))
        elif o is sre.RANGE:
            parts.append(re.escape(chr(a[0])) + "-" + re.escape(chr(a[1])))
        elif o is sre.CATEGORY:
            parts.append(_CATEGORY.get(a, ""))
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


class _Walk:
    """Builds the shortest text the regex matches, noting before each repeat what led to it."""

    def __init__(self, probe: str, flags: int, variants: int) -> None:
        self.probe = probe
        self.flags = flags
        self.variants = variants
        self.pumps: list[tuple[str, list[str]]] = []

    def accepted(self, op: Any, arg: Any) -> list[str]:
        if op is sre.LITERAL:
            return [chr(arg)]
        one = re.compile(_one_char_regex(op, arg), self.flags | re.S)
        found = [c for c in self.probe if one.fullmatch(c)]
        if not found and op is sre.IN:
            found = [
                chr(a if o is sre.LITERAL else a[0])
                for o, a in arg
                if o in (sre.LITERAL, sre.RANGE)
            ]
        return found or ["a"]

    def seq(self, items: Any, text: str) -> str:
        for op, arg in items:
            if op in _ONE_CHAR:
                text += self.accepted(op, arg)[0]
            elif op in _REPEATS:
                low, _high, body = arg
                sample = self.seq(body, "")
                runs = [sample]
                if len(body) == 1 and body[0][0] in _ONE_CHAR:
                    runs += self.accepted(*body[0])[: self.variants]
                self.pumps.append((text, [r for r in dict.fromkeys(runs) if r]))
                self.seq(body, text)  # repeats nested inside this one
                text += sample * low
            elif op is sre.SUBPATTERN:
                text = self.seq(arg[-1], text)
            elif op is getattr(sre, "ATOMIC_GROUP", None):
                text = self.seq(arg, text)
            elif op is sre.BRANCH:
                for alternative in arg[1][1:]:
                    self.seq(alternative, text)
                text = self.seq(arg[1][0], text)
            # AT, ASSERT, ASSERT_NOT, GROUPREF add no text
        return text


def adversarial_lines(
    pattern: re.Pattern[str], literal: str = "", size: int = 1 << 20, variants: int = 1
) -> Iterator[str]:
    """Lines of exactly `size` characters that make `pattern` work hard. `variants`: how many
    characters each repeated class is pumped with besides the shortest text of its body."""
    walk = _Walk("".join(dict.fromkeys(PROBE + literal)), pattern.flags & re.I, variants)
    shortest = walk.seq(sre_parse.parse(pattern.pattern, pattern.flags), "")
    seeds: list[str] = []
    for before, runs in walk.pumps:
        for run in runs:
            seeds += [before + run * size, before + run, before + run * 8]
        seeds.append(before)
    if shortest:
        seeds += [shortest[:-1], shortest[:-1] + " "]
    if literal:
        seeds += [literal[:-1], literal + literal[:-1]]
    for seed in dict.fromkeys(s[:size] for s in seeds if s):
        yield (seed * -(-size // len(seed)))[:size]
