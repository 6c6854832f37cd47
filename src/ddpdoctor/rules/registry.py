"""The one table of every rule. Codes are stable and never reused; a new rule is one line here
plus its own module entry and examples."""

from __future__ import annotations

from functools import lru_cache

from ddpdoctor.rules import (
    collectives,
    cuda,
    data,
    ddp,
    generic,
    inferred,
    launch,
    performance,
    transport,
)
from ddpdoctor.rules.base import Rule, RuleDefinitionError
from ddpdoctor.rules.hypotheses import (
    bare_exception,
    collective_mismatch,
    cut_site,
    cut_traceback,
    duplicate_ranks,
    gpu0_contexts,
    killed_rank,
    lagging_rank,
    log_ends,
    log_stops,
    missing_ranks,
    slow_rank,
    stalled_rank,
    startup_hang,
    store_connect,
    teardown_stop,
    uncoordinated_exit,
    uneven_inputs,
    worker_exit,
    world_beyond_launch,
)
from ddpdoctor.rules.hypotheses.base import Hypothesis

FAMILIES = (ddp, collectives, transport, cuda, launch, data, generic, inferred, performance)

HYPOTHESES: tuple[Hypothesis, ...] = (
    Hypothesis(stalled_rank.STUCK, stalled_rank.assess, precedence=0),
    Hypothesis(slow_rank.RULE, slow_rank.assess, precedence=1),
    Hypothesis(uneven_inputs.RULE, uneven_inputs.assess, precedence=2),
    Hypothesis(uncoordinated_exit.RULE, uncoordinated_exit.assess, precedence=3),
    Hypothesis(killed_rank.RULE, killed_rank.assess, precedence=3),
    Hypothesis(collective_mismatch.RULE, collective_mismatch.assess, precedence=4),
    Hypothesis(lagging_rank.RULE, lagging_rank.assess, precedence=5),
    Hypothesis(missing_ranks.RULE, missing_ranks.assess, precedence=5),
    Hypothesis(duplicate_ranks.RULE, duplicate_ranks.assess, precedence=5),
    Hypothesis(world_beyond_launch.RULE, world_beyond_launch.assess, precedence=5),
    Hypothesis(worker_exit.RULE, worker_exit.assess, precedence=6),
    Hypothesis(cut_traceback.RULE, cut_traceback.assess, precedence=6),
    Hypothesis(bare_exception.RULE, bare_exception.assess, precedence=6),
    Hypothesis(startup_hang.RULE, startup_hang.assess, precedence=7),
    Hypothesis(store_connect.RULE, store_connect.assess, precedence=7),
    Hypothesis(teardown_stop.RULE, teardown_stop.assess, precedence=7),
    Hypothesis(log_ends.RULE, log_ends.assess, precedence=8),
    Hypothesis(log_stops.RULE, log_stops.assess, precedence=9),
    Hypothesis(gpu0_contexts.RULE, gpu0_contexts.assess, precedence=5),
)
"""Inferred causes, each scored from the job's evidence by the same engine (analysis/decide)."""

HYPOTHESIS_ONLY_RULES = (
    stalled_rank.HANG,
    cut_traceback.NATIVE,
    *cut_site.RULES,
    startup_hang.RENDEZVOUS,
    startup_hang.LOCAL_INTERFACE,
    missing_ranks.NEVER_JOINED,
    log_stops.UNKNOWN_ERROR,
)
"""Rules a hypothesis may conclude with besides its own (documented like every rule)."""

INTENDED_ENDS: dict[str, Rule] = {
    "agreed-stop": inferred.EARLY_STOP_ALL,
    "teardown": inferred.TEARDOWN_CRASH,
    "stopped": inferred.STOPPED,
    "interrupted": inferred.INTERRUPTED,
    "stalled-then-stopped": inferred.STALLED_THEN_STOPPED,
    "stopped-short": inferred.STOPPED_SHORT,
    "diverged": inferred.DIVERGED,
}
"""The verdicts of ends that are not failures of training, by the engine's name for them:
every rank stopped on purpose; a crash after the work was done; a stop from outside; a stop
by hand (SIGINT) of a job that most likely hung; a stop from outside of a job that had made no
progress for far longer than its pace; an end, with nothing failed, at half the steps its own
counter planned or fewer; and the one stop that is no intended end: every rank stopped on a
loss that was no longer finite (diverged)."""


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    rules: list[Rule] = []
    seen: set[str] = set()
    declared = [r for family in FAMILIES for r in family.RULES]
    declared += [h.rule for h in HYPOTHESES] + list(HYPOTHESIS_ONLY_RULES)
    for rule in declared:
        if rule.code in seen:
            raise RuleDefinitionError(f"duplicate rule code {rule.code}")
        seen.add(rule.code)
        rules.append(rule)
    return tuple(rules)


def find_rules(query: str) -> list[Rule]:
    """Rules named by code (DDP101), code prefix (DDP1), kind slug, or matching a log text."""
    q = query.strip()
    by_code = [r for r in all_rules() if r.code.upper() == q.upper()]
    if by_code:
        return by_code
    by_kind = [r for r in all_rules() if r.kind == q.lower()]
    if by_kind:
        return by_kind
    if q.isalnum() and q[:2].isalpha() and len(q) <= 6:
        by_prefix = [r for r in all_rules() if r.code.upper().startswith(q.upper())]
        if by_prefix:
            return by_prefix
    matched = [r for r in all_rules() if r.match(q)]
    if not matched and len(q) >= 12:
        # a fragment of a message: compare with each signature's required literal
        lowered = q.lower()
        matched = [
            r
            for r in all_rules()
            if any(
                lowered in s.required_literal.lower()
                or (len(s.required_literal) >= 12 and s.required_literal.lower() in lowered)
                for s in r.signatures
            )
        ]
    # a rule that needs a traceback around its line ('RuntimeError: ...' is a torch.load failure
    # only under torch.load's frames) is not named by a text that lacks it
    matched = [r for r in matched if r.context_ok(q)]
    matched.sort(key=lambda r: -r.specificity)
    return matched
