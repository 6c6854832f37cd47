"""The shape of a rule: everything about one failure signature family in one value, so that
`explain`, the docs, the scanner and the tests all read the same place. No matching logic
beyond compiling a rule's own regexes."""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from dataclasses import dataclass
from functools import cached_property

from ddpdoctor.model.taxonomy import KINDS, Category, default_category


class RuleDefinitionError(ValueError):
    """A rule in the knowledge base is malformed (a bug in ddpdoctor, caught by the tests)."""


@dataclass(frozen=True)
class Signature:
    """A regex over one log line. `literal` is a substring every match contains, used by the
    multi-pattern prefilter; derived from the regex when not given."""

    regex: str
    literal: str | None = None
    suggests: bool = False
    """True when the line only suggests the kind (SIGKILL suggests host OOM; the OOM killer's
    own message proves it): a verdict resting on such lines alone gets a lower confidence."""

    @cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)

    @cached_property
    def required_literal(self) -> str:
        lit = self.literal or longest_literal(self.regex)
        if lit not in self.regex.replace("\\", "") and self.literal is None:
            raise RuleDefinitionError(f"cannot derive a literal from {self.regex!r}")
        return lit


@dataclass(frozen=True)
class Explanation:
    what: str
    why: str
    fix: str
    false_positives: str = ""


@dataclass(frozen=True)
class Rule:
    """One failure signature family.

    severity: `error` ends a job; `warning` is context unless nothing else is found.
    cascade: this text is also printed by ranks that are only victims of another rank's
    failure (watchdog timeouts, closed connections, the launcher's SIGTERM); such a finding is
    never the root when a non-cascade error exists.
    specificity: higher wins when several rules claim the same traceback (a specific rule
    beats the generic python-exception one).
    context_all / context_none: regexes that must (or must not) appear in the same writer's
    traceback around the matched line, for rules that refine another (OOM inside torch.load).
    """

    code: str
    kind: str
    title: str
    signatures: tuple[Signature, ...]
    explanation: Explanation
    fix: tuple[str, ...]
    category: Category | None = None
    severity: str = "error"
    cascade: bool = False
    specificity: int = 50
    context_all: tuple[str, ...] = ()
    context_none: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    positive: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    sources: str = ""
    """Where upstream prints the messages the signatures match."""
    confirm: str = ""
    """Where to confirm the cause when only a `suggests` signature matched (the logs show the
    symptom, not the proof)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RuleDefinitionError(f"{self.code}: unknown kind {self.kind!r}")
        if self.severity not in ("error", "warning", "info"):
            raise RuleDefinitionError(f"{self.code}: bad severity {self.severity!r}")

    @property
    def default_category(self) -> Category:
        return self.category or default_category(self.kind)

    def match(self, line: str) -> re.Match[str] | None:
        """The first signature that matches the line, or None."""
        for sig in self.signatures:
            m = sig.compiled.search(line)
            if m:
                return m
        return None

    @cached_property
    def context_all_compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.context_all)

    @cached_property
    def context_none_compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.context_none)

    def context_ok(self, context_text: str) -> bool:
        """True when the traceback around the hit satisfies the rule's context conditions."""
        if any(not p.search(context_text) for p in self.context_all_compiled):
            return False
        return not any(p.search(context_text) for p in self.context_none_compiled)


def longest_literal(regex: str) -> str:
    """The longest run of plain characters that every match of `regex` must contain."""
    best = ""

    def walk(items: sre_parse.SubPattern | list[tuple[object, object]]) -> None:
        nonlocal best
        run: list[str] = []

        def flush() -> None:
            nonlocal best, run
            text = "".join(run)
            if len(text) > len(best):
                best = text
            run = []

        for op, arg in items:
            if op is sre_constants.LITERAL:
                run.append(chr(arg))  # type: ignore[arg-type]
            elif op is sre_constants.SUBPATTERN:
                flush()
                walk(arg[-1])  # type: ignore[index]
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
                flush()
                lo, _hi, sub = arg  # type: ignore[misc]
                if lo >= 1:
                    walk(sub)
            elif op is sre_constants.AT:
                continue
            else:
                flush()
        flush()

    walk(sre_parse.parse(regex))
    return best
