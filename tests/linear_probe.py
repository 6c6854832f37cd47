"""Times every regex the scan runs, on adversarial lines (tests/adversary.py), in a child process
that test_linear_time.py watches: a regex gone quadratic is stopped and named instead of holding
the test suite for hours. Prints one JSON object per line searched, before and after the search.

Usage: python -m tests.linear_probe SIZE VARIANTS
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from types import ModuleType

from ddpdoctor.analysis import facts, scanner
from ddpdoctor.analysis.facts import FACT_PATTERNS
from ddpdoctor.ingest import attribution, bounds, filenames, prefixes, tracebacks
from ddpdoctor.rules.registry import all_rules
from tests.adversary import adversarial_lines

MODULES: tuple[ModuleType, ...] = (
    prefixes,
    tracebacks,
    filenames,
    bounds,
    scanner,
    facts,
    attribution,
)
"""Modules whose module-level regexes run over log text or paths."""
ANCHORED = frozenset(
    {
        # applied with .match/.fullmatch at one position of a line, never searched through it
        "prefixes.RFC3339",
        "prefixes.ISO_TIME",
        "prefixes.US_TIME",
        "prefixes.TORCHRUN",
        "prefixes.GLOG",
        "prefixes.GLOG_BRACKET",
        "prefixes.NCCL",
        "prefixes.SLURM",
        "prefixes.PDSH",
        "prefixes.GREP_PATH",
        "prefixes.TIME_OF_DAY_LEVEL",
        "prefixes.LOGGER_NAME_RANK",
        "prefixes.SYSLOG_SOURCE",
        "prefixes.COMPOSE",
        "prefixes.KUBECTL",
        "prefixes.STREAM_TAG",
        "prefixes.PLATFORM_TAG",
        "prefixes.PY_LEVEL",
        "prefixes.NAMED_PY_LEVEL",
        "prefixes.QUOTED_TAG",
        "prefixes.OLMO_RECORD",
        "prefixes.DETERMINED",
        "prefixes.COLBERT_HEAD",
        "prefixes.RICH_CALLER",
        "prefixes.LEADING_RANK",
        "prefixes.CALLER_RANK",
        "prefixes.LEADING_LOCAL_RANK",
        "prefixes.TAGGED_RANK",
        "prefixes.HOST_TAGGED_RANK",
        "attribution.SUMMARY_ENTRY_RANK",
        "prefixes.JSON_RANK",
        "tracebacks.CHAINED",
        "tracebacks.EXCEPTION_LINE",
        "scanner.TRACEBACK_BODY",
        "scanner.RAISED",
        "scanner.WHOLE_FRAME",
        "scanner.NATIVE_FRAME",
        "scanner.NATIVE_WRAPPED",
        "facts.SUMMARY_RANK",
        "facts.SUMMARY_HOST",
        "filenames.HOST_NAME",
        "filenames.ATTEMPT_DIR",
        "filenames.STREAM_FILE",
        "filenames.DIR_RANK",
        "filenames.DIR_LOCAL_RANK",
        "bounds._INT",
        "bounds._NUMERIC",
    }
)


def inventory() -> Iterator[tuple[str, re.Pattern[str], str, bool]]:
    """(name, regex, literal, anchored) for every signature and context pattern of every rule,
    every job fact, and every module-level text regex of ingestion and scanning."""
    for rule in all_rules():
        for n, sig in enumerate(rule.signatures):
            yield f"{rule.code}/{n}", sig.compiled, sig.required_literal, False
        for n, ctx in enumerate((*rule.context_all_compiled, *rule.context_none_compiled)):
            yield f"{rule.code}/context{n}", ctx, "", False
    for index, fact in enumerate(FACT_PATTERNS):
        yield f"fact/{fact.name}#{index}", fact.compiled, fact.literal, False
    for module in MODULES:
        short = module.__name__.rsplit(".", 1)[-1]
        for attr, value in sorted(vars(module).items()):
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                name = f"{short}.{attr}"
                yield name, value, "", name in ANCHORED


def main(size: int, variants: int) -> None:
    for name, regex, literal, anchored in inventory():
        run = regex.match if anchored else regex.search
        for n, line in enumerate(adversarial_lines(regex, literal, size, variants)):
            start = {"pattern": name, "line": n, "head": line[:80], "regex": regex.pattern}
            print(json.dumps({"start": start}), flush=True)
            t0 = time.process_time()
            run(line)
            print(json.dumps({"done": name, "line": n, "cpu_s": time.process_time() - t0}))
    print(json.dumps({"end": True}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
