"""The words with which a writer announces a long phase of work of its own (saving,
evaluating, tokenising, building an index): read by the scanner on every writer's sampled
lines and by behaviour on each rank's last words."""

from __future__ import annotations

import re

BUSY_PHASE = re.compile(
    r"(?i)sav(?:e|ing) (?:(?:the|a|its) )?(?:(?:best|final|last|latest|new) (?:[\w-]+ )?)?"
    r"(?:model|checkpoint|state)"
    r"|saving (?:to|into) \S"
    r"|writing (?:the )?(?:checkpoint|model)|evaluating|validating"
    r"|(?:running|start(?:ing)?|begin(?:ning)?) (?:the )?(?:evaluation|validation|eval\b)"
    r"|(?:evaluation|validation|eval) (?:start|begin|loop|dataloader|epoch|step|batch|on )"
    r"|^(?:validation|evaluation|eval|testing)\b.{0,40}\d+%\|"
    r"|tokeniz|preprocess|download|loading (?:the )?(?:dataset|data|checkpoint|model|shard)"
    r"|decod(?:e|ing) (?:the )?(?:images?|audio|videos?|frames?|samples?|data)\b"
    r"|building (?:the |a |its )?(?:[\w-]+ ){0,2}"
    r"(?:index|indices|cache|vocab\w*|dataset|features?\b)"
    r"|consolidat|gather(?:ing)? (?:the )?(?:full )?state"
    r"|running (?:on|the) (?:dataset|eval)|rebuilding"
    r"|(?:can|may|might|will) take (?:a while|a (?:few )?minutes?|some time|long)"
    # Hugging Face datasets' bars over a whole dataset (the work a main process does alone
    # under main_process_first while the others wait at the barrier)
    r"|^(?:map|filter)(?: \(num_proc=\d+\))?: +\d+%"
    r"|^(?:generating \w+ split|grouping texts|casting the dataset|concatenating|packing)\b"
    # a copy to remote storage (a checkpoint uploaded at save time): the AWS CLI's progress
    # ('Completed 8.0 MiB/64.0 MiB (1.6 MiB/s) with 1 file(s) remaining'), an upload announced
    r"|^completed [\d.]{1,10} [kmgt]?i?b/[\d.]{1,10} [kmgt]?i?b\b"
    r"|\bupload(?:ing)?\b[^\n]{0,120}\b(?:to|into) \S"
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
    "map",
    "filter",
    "generating",
    "grouping",
    "casting",
    "concatenating",
    "packing",
    "completed",
    "upload",
)
"""A lower-cased piece of every alternative of BUSY_PHASE: ASCII text holding none of them
cannot match it (see busy_phase)."""


COUNTED_PHASE = re.compile(
    r"(?i)^(?:(?:info|warning|warn|debug|notice)\b[: -]{1,3})?(?:[\w.-]{1,24} ?[|:\]>] ?)?"
    r"(?!train|fitt|runn|epoch|step)[a-z]{3,20}ing\b"
    r"[^\n]{0,100}?(?<![\w.])(?P<count>\d{1,7}/\d{1,7})\b"
)
"""A phase of work that counts its own parts, named by a verb in -ing at the start of the line
(after a level and a short label: 'INFO teacher | calibrating temperature: batch 3/8',
'regenerating track layouts (1/8)', 'Filling kNN memory bank: part 2/8'): whatever the verb, a
writer that counts the parts of something other than its training loop is at work on it. Not
the loop's own counters ('Training 3/100', 'running step 5/50'), nor a count of processes
('Initializing distributed: GLOBAL_RANK: 3, MEMBER: 4/4', 'worker 2/4': PROCESS_COUNT)."""


def busy_phase(text: str) -> bool:
    """Whether BUSY_PHASE.search(text) finds a match, without running its case-blind search of
    18 alternatives over every writer's last words where none of their words is there: 1.0 s
    (profiled) of build_evidence for 19,750 writers of 10,000 rank files."""
    return search_with_words(BUSY_PHASE, BUSY_WORDS, text)


PROCESS_COUNT = re.compile(
    r"(?i)\b(?:rank|member|node|worker|process|gpu|device|host|client|student|replica|world)"
    r"[\s:=#]{0,3}$"
)
"""Words before a counter that make it a count of processes, not of parts of the work."""


def counted_phase(text: str) -> bool:
    """COUNTED_PHASE, tried only on lines with a '/' and an 'ing', whose counter counts no
    processes. Read on the lines of writers no rank can be given, where a progress line is
    the whole of what shows a process at work (a rank's own last line may be the last of
    what it did before it stopped: busy_phase reads words, not counters)."""
    if "/" not in text or "ing" not in text.lower():
        return False
    found = COUNTED_PHASE.search(text)
    return found is not None and not PROCESS_COUNT.search(text, 0, found.start("count"))


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


SLOW_UNIT = re.compile(
    r"\((?:[^()\n]{0,80}, )?(?P<s>\d{2,6}(?:\.\d{1,3})?) ?s\)"
    r"|\btook (?P<took>\d{2,6}(?:\.\d{1,3})?) ?s(?:ec(?:onds?)?)?\b"
)
"""A line that reports a piece of the writer's own work and how long it took, ten seconds or
more: 'read part-00001.npy (2560 rows, 12.0s)', 'building the cache took 45.2 s'."""


def slow_unit_of_work(text: str) -> bool:
    """Whether the line reports a piece of work of ten seconds or more (SLOW_UNIT): a writer
    whose last words say so was at work that slow, and most likely at the next piece of it."""
    if "s" not in text:
        return False
    m = SLOW_UNIT.search(text)
    return m is not None and float(m["s"] or m["took"]) >= SLOW_UNIT_S


SLOW_UNIT_S = 10.0
"""The length of one piece of work that makes a writer slow at it (a collective's timeout is
minutes in real jobs, 10-15 s in the suite's runs)."""
