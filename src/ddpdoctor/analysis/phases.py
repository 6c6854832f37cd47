"""The words with which a writer announces a long phase of work of its own (saving,
evaluating, tokenising, building an index): read by the scanner on every writer's sampled
lines and by behaviour on each rank's last words."""

from __future__ import annotations

import re

BUSY_PHASE = re.compile(
    r"(?i)sav(?:e|ing) (?:(?:the|a|its) )?(?:model|checkpoint|state)|saving (?:to|into) \S"
    r"|writing (?:the )?(?:checkpoint|model)|evaluating|validating"
    r"|(?:running|start(?:ing)?|begin(?:ning)?) (?:the )?(?:evaluation|validation|eval\b)"
    r"|(?:evaluation|validation|eval) (?:start|begin|loop|dataloader|epoch|step|batch|on )"
    r"|^(?:validation|evaluation|eval|testing)\b.{0,40}\d+%\|"
    r"|tokeniz|preprocess|download|loading (?:the )?(?:dataset|data|checkpoint|model)"
    r"|decod(?:e|ing) (?:the )?(?:images?|audio|videos?|frames?|samples?|data)\b"
    r"|building (?:the |a |its )?(?:[\w-]+ ){0,2}(?:index|cache|vocab\w*|dataset|features?\b)"
    r"|consolidat|gather(?:ing)? (?:the )?(?:full )?state"
    r"|running (?:on|the) (?:dataset|eval)|rebuilding"
    r"|(?:can|may|might|will) take (?:a while|a (?:few )?minutes?|some time|long)"
)
"""Last words that announce a long phase a rank does on its own."""
BUSY_WORDS = (
    "sav",
    "writing",
    "eval",
    "valid",
    "%|",
    "tokeniz",
    "decod",
    "preprocess",
    "download",
    "loading",
    "building",
    "consolidat",
    "gather",
    "running",
    "take",
)
"""A lower-cased piece of every alternative of BUSY_PHASE: ASCII text holding none of them
cannot match it (see busy_phase)."""


def busy_phase(text: str) -> bool:
    """Whether BUSY_PHASE.search(text) finds a match, without running its case-blind search of
    18 alternatives over every writer's last words where none of their words is there: 1.0 s
    (profiled) of build_evidence for 19,750 writers of 10,000 rank files."""
    return search_with_words(BUSY_PHASE, BUSY_WORDS, text)


def phase_of_work(text: str) -> bool:
    """A long phase the writer announces (busy_phase), not a signal handler's answer to a stop
    from outside ('Received SIGTERM, saving a checkpoint')."""
    return busy_phase(text) and not ("SIG" in text and SIGNAL_ANSWER.search(text))


SIGNAL_ANSWER = re.compile(r"(?i)\b(?:received|caught|got|handling) (?:signal )?SIG[A-Z]{3,6}\b")
"""A signal handler's own words: what it then does is its answer to a stop from outside, not
work the process was at before it."""


def search_with_words(regex: re.Pattern[str], words: tuple[str, ...], text: str) -> bool:
    """Whether a case-blind regex matches, searched only where the text holds one of the
    lower-cased pieces every alternative of it contains. Only ASCII text is tested by words:
    (?i) also folds letters such as U+017F (long s) into ASCII ones."""
    if text.isascii():
        lower = text.lower()
        if not any(word in lower for word in words):
            return False
    return regex.search(text) is not None
