"""The general relations that say "A explains B". Each is one function over the events and the
job, documented by what it means for every rank; none names a rule or a kind. What a rule is
(an echo, an exit path, a marker, what it explains) is declared on the rule.

- exit path: what a rank prints after its own first failure is how it went down.
- echo: a rank that waited, lost its peer or was stopped did so because another rank failed
  first (time precedence; timeout arithmetic proves it).
- launcher: the launcher's notices follow whatever failed; once it reported a failed worker,
  its own store or rendezvous errors are its shutdown; the SIGKILL of a worker it had sent a
  closing signal is its own escalation.
- consequence: a generic exception on another rank, after a specific failure, is its echo.
- refinement: a finding that declares it explains a kind (named parameters without gradient
  explain the collective mismatch they cause).
- completion: after training announced its end, a crash or a lost peer is teardown.
- teardown marker: once a program reached its end with the group alive, a crash is teardown.
- agreed stop: after every rank stopped on purpose, the exit path is not a failure.
- stall: once `ddpdoctor run` caught the job stalled, what the stop and the kill made ranks
  print is their echo.
- run stop: when `ddpdoctor run` ended the job, the SIGKILL and stop signals it sent are not
  failures of the job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ddpdoctor.analysis.causal_graph import CausalGraph
from ddpdoctor.analysis.events import Event, Node, aborted_at_exit
from ddpdoctor.model.evidence import JobEvidence, Restart
from ddpdoctor.model.records import Record
from ddpdoctor.rules.base import Echo, Marker, Rule

ECHO_SLACK_S = 5.0
"""A cause may be logged this much after its echo (clocks of different hosts, buffering)."""


@dataclass
class Context:
    """What relations read besides the events."""

    evidence: JobEvidence
    completed_at: dict[str, int] = field(default_factory=dict)
    """First line per source where training announced its end."""
    intended: dict[str, Rule] = field(default_factory=dict)
    """The rules of intended ends: 'agreed-stop', 'teardown', 'stopped' (rules/registry.py)."""
    caught_ids: set[int] | None = None
    """The events the program caught and went on from (_caught), found once per job."""

    def caught(self, graph: CausalGraph) -> set[int]:
        if self.caught_ids is None:
            self.caught_ids = {id(e) for e in graph.events if _caught(e, graph.events)}
        return self.caught_ids


def precedes(a: Event, b: Event, slack_s: float = 0.0) -> bool | None:
    """Whether a was printed before b: by their times when both have one, else by line order
    in a source both appear in; None when nothing orders them (never the order of files)."""
    if a.time is not None and b.time is not None:
        return (a.time - b.time).total_seconds() < slack_s or (
            a.time == b.time and _line_order(a, b) is True
        )
    return _line_order(a, b)


def _line_order(a: Event, b: Event) -> bool | None:
    for source in sorted(a.sources & b.sources):
        la, lb = a.first_line(source), b.first_line(source)
        if la is not None and lb is not None and la != lb:
            return la < lb
    return None


def could_cause(cause: Event, effect: Event) -> bool:
    """Time allows cause -> effect: not logged clearly after it."""
    if cause.time is None or effect.time is None:
        return True
    return (cause.time - effect.time).total_seconds() <= ECHO_SLACK_S


def failing(event: Event) -> bool:
    """A line that says its rank failed or was left failing (not a notice, not a marker)."""
    return event.primary or event.echo in (Echo.WAITING, Echo.LOST_PEER, Echo.STOPPED)


def survived(event: Event, evidence: JobEvidence) -> bool:
    """An error the job went on from. One Python's logging printed as it carried on; a lost
    peer or a timeout printed before training announced its end (every step needs every rank:
    a connection retried, a peer that came back); any error of a rank that went on training
    after it (a traceback the program caught and logged, a retry that worked); any error of an
    attempt the launcher restarted, when a later attempt completed; the launcher stopping its
    workers before training announced its end (a membership change of an elastic job: a node
    joined or left, and the new group trained on). Later in the same output
    and later by the clock: lines without times prove no order (a process's buffered stdout
    reaches the console after the traceback it wrote to stderr), except above a failed
    attempt's exit in the same output."""
    if not event.hits:
        return False
    if all(h.handled for h in event.hits):
        return True  # printed by logging, which carried on
    if _before_restart(event, evidence):
        return True
    if event.echo == Echo.STOPPED:
        return False  # a stop's handler may log a step and a save on its way out: not a going on
    lived_on = evidence.lived_on
    if event.rank is not None and all(
        h.record.time is not None
        and any(
            src == h.record.source and line > h.record.line and at >= h.record.time
            for src, line, at in lived_on.get(event.rank, [])
        )
        for h in event.hits
    ):
        return True
    if event.primary and _ended_well_after(event, evidence):
        return True
    if event.echo not in (Echo.WAITING, Echo.LOST_PEER, Echo.LAUNCHER):
        return False  # (the launcher stopping workers, then training ending: a new group)
    return all(
        any(
            end.source == h.record.source
            and end.line > h.record.line
            and end.time is not None
            and h.record.time is not None
            and end.time > h.record.time
            for end in evidence.end_marks
        )
        for h in event.hits
    )


def _ended_well_after(event: Event, evidence: JobEvidence) -> bool:
    """An error that training announced its end after (or reached its last epoch after, its
    counters at their totals), below it in the same output, in a job
    where nothing else shows a failure: no rank lost or waited for another, no launcher
    reacted, no exit failed. Had the error ended its rank, its peers would have lost it: the
    program caught it and went on (a dashboard push retried, a metric skipped). (Without any
    end, nothing else is looked at: the echoes of 10,000 ranks, for each of 16,000 events.)"""
    if not (evidence.end_marks or evidence.last_epoch_lines):
        return False
    if evidence.failing_exits or evidence.job_exit_code not in (None, 0):
        return False
    if evidence.echoes & {"waiting", "lost-peer", "launcher", "stopped"}:
        return False
    return all(
        any(
            end.source == h.record.source and end.line > h.record.line for end in evidence.end_marks
        )
        # or the training loop seen at its last epoch below it (its counters at their totals)
        or any(
            source == h.record.source and line > h.record.line
            for source, line in evidence.last_epoch_lines
        )
        for h in event.hits
    )


def _before_restart(event: Event, evidence: JobEvidence) -> bool:
    """Every line of the event belongs to an attempt the launcher restarted and the job then
    completed: earlier by the clock than the end. A line without a time cannot belong to the
    last attempt unless that attempt survived it: a last attempt that failed would have ended
    in the launcher's failure summary, and there is none. Or the job failed in a later
    attempt: every line is of an earlier one."""
    ended_at = evidence.restart_ended_at
    if ended_at is None:
        return all(in_earlier_attempt(h.record, evidence) for h in event.hits)
    return all(h.record.time is None or h.record.time < ended_at for h in event.hits)


def in_earlier_attempt(record: Record, evidence: JobEvidence) -> bool:
    """The line was printed by an attempt the launcher restarted, before the last one."""
    return before_attempt(record, evidence.last_restart, evidence.earlier_attempt_sources)


def before_attempt(record: Record, restart: Restart | None, earlier: frozenset[str]) -> bool:
    """In an older attempt folder, above the agent's report of the restarted attempt's failed
    workers in the same console, or earlier by the clock elsewhere. A line without a time in
    another file cannot be placed."""
    if record.source in earlier:
        return True
    return restart is not None and restart.precedes(record) is True


def attempt_parts(evidence: JobEvidence) -> Callable[[Event], int] | None:
    """For a job judged by its last attempt: 0 for an event of an attempt the launcher
    restarted, 1 for the last attempt's (events are split at the restart, so all of an
    event's lines are on one side). Neither explains the other: a rank's later attempt is
    another process, which its earlier one's kill or error did not reach."""
    if evidence.last_restart is None and not evidence.earlier_attempt_sources:
        return None
    return lambda event: 0 if in_earlier_attempt(event.hits[0].record, evidence) else 1


def split_at_restart(
    events: list[Event], restart: Restart | None, earlier: frozenset[str]
) -> list[Event]:
    """A rank's lines of one finding before and after the last restart are two events: the
    same error in every attempt is the last attempt's failure and an earlier one's."""
    if restart is None and not earlier:
        return events
    out: list[Event] = []
    for event in events:
        old = [h for h in event.hits if before_attempt(h.record, restart, earlier)]
        new = [h for h in event.hits if not before_attempt(h.record, restart, earlier)]
        if old and new:
            out.extend((replace(event, hits=old), replace(event, hits=new)))
        else:
            out.append(event)
    return out


def attribute_by_elimination(events: list[Event], evidence: JobEvidence) -> bool:
    """A failure (or an early-stop announcement) printed without a rank belongs to the one rank
    it can be: the only rank (on its host, when the line has one) that neither waited nor lost
    its peer, narrowed to the ranks whose exit code says they failed, else to the ranks that
    wrote into the same file. Changes the events' ranks, never the records; True when any
    event got a rank."""
    present = {r for r, v in evidence.ranks.items() if v.present}
    waiting = evidence.waiting
    failing = set(evidence.failing_exits)
    raised = {r for r, code in evidence.failing_exits.items() if code not in SILENT_DEATHS}
    changed = _attribute_wait(events, waiting, raised if raised == failing else set())
    # ranks that lost a peer outlived it: they went on after it left (their unranked lost
    # peer given to them just above included)
    outlived = {r for r in present if "lost-peer" in evidence.ranks[r].echoes} | {
        e.rank for e in events if e.echo is Echo.LOST_PEER and e.rank is not None
    }
    for event in events:
        if event.rank is not None or not (
            event.primary or event.rule.exit_path or event.marker == Marker.STOP
        ):
            continue
        if event.marker == Marker.STOP and announcements(event) > 1:
            continue  # several ranks said it (the launcher may have killed one on its way out)
        if event.primary and _same_error_lines(event) > 1 and len(present) > 1:
            continue  # the same error line printed apart several times: several workers
        hosts = {h.record.origin.host for h in event.hits if h.record.origin.host}
        on_host = {r for r in present if evidence.ranks[r].host in hosts}
        # where ranks wrote into the event's own file, only they can have printed it (a node's
        # console holds its own ranks; host names from different sources may not agree)
        sources = {h.record.source for h in event.hits}
        in_source = {r for r in present if evidence.ranks[r].sources & sources}
        candidates = (on_host or present) - waiting
        if event.marker == Marker.STOP:
            # a stop is announced by a rank that then leaves (exit 0), not by one the launcher
            # saw fail or had to stop (those went on and were left waiting), nor by one that
            # then lost its peer (it went on: the peer had left)
            candidates -= outlived
            stopped = {r for r in candidates if evidence.ranks[r].terminated}
            if candidates - failing - stopped:
                candidates -= failing | stopped
        elif candidates & failing:
            candidates &= failing
        elif in_source:
            candidates &= in_source
        if len(candidates) != 1:
            # a failed worker printed the failure; a stop is not announced by one
            one_failed = len(failing) == 1 and event.marker != Marker.STOP
            candidates = set(failing) if one_failed else set()
        left_behind = waiting | outlived if event.marker == Marker.STOP else waiting
        if (
            not candidates
            and present
            and left_behind >= present
            and (not failing or event.marker == Marker.STOP)
            and len(evidence.missing) == 1
        ):
            # every rank that wrote was left waiting: the error is the silent one's, the one
            # rank of the world with no line of its own (its abort printed no prefix)
            candidates = set(evidence.missing)
        if len(candidates) == 1 and (waiting or failing):
            event.rank = candidates.pop()
            changed = True
    return changed


SILENT_DEATHS = frozenset({-4, -7, -8, -9, -11})
"""Exit codes of a worker a signal ended where Python raises nothing (SIGILL, SIGBUS, SIGFPE,
SIGKILL, SIGSEGV): such a worker printed no timeout or lost-peer exception of its own (unlike
SIGABRT, c10d's abort after its own timeout, or an exception's exit code)."""


def _attribute_wait(events: list[Event], waiting: set[int], failing: set[int]) -> bool:
    """A timeout or lost peer printed without a rank, when no rank is seen waiting, is the one
    failed worker's: the launcher saw it exit with an error (the exception this traceback
    raised), while the others it stopped (SIGTERM) printed none. One such echo only: two
    unranked waits may be two ranks'."""
    echoes = [
        e
        for e in events
        if e.rank is None
        and e.echo in (Echo.WAITING, Echo.LOST_PEER)
        and e.rule.severity == "error"
    ]
    if waiting or len(failing) != 1 or len(echoes) != 1 or _tracebacks(echoes[0]) != 1:
        return False
    echoes[0].rank = next(iter(failing))
    return True


def _tracebacks(event: Event) -> int:
    """How many separate reports its hits make (lines far apart are separate tracebacks)."""
    starts = 0
    last: dict[str, int] = {}
    for h in sorted(event.hits, key=lambda h: (h.record.source, h.record.line)):
        prev = last.get(h.record.source)
        if prev is None or h.record.line - prev > SAME_REPORT_LINES:
            starts += 1
        last[h.record.source] = h.record.line
    return starts


def _same_error_lines(event: Event) -> int:
    """How many times the event's first error line appears, word for word, in separate
    reports (each worker that raised the same exception printed it once). Unlike an error
    and its hints (SAME_REPORT_LINES), one message does not repeat its own error line: two
    copies with other lines between them are two reports, however close (click's 'Usage:',
    'Try --help', blank, 'Error: No such option' printed by each of two workers)."""
    if not event.hits:
        return 0
    first = event.hits[0].record.text
    same = sorted(
        ((h.record.source, h.record.line) for h in event.hits if h.record.text == first),
    )
    return sum(
        1
        for i, (source, line) in enumerate(same)
        if i == 0 or same[i - 1][0] != source or line - same[i - 1][1] > 1
    )


SAME_REPORT_LINES = 4
"""Lines of one writer this close together belong to one message (an error and its hints)."""


def relate_same_report(graph: CausalGraph, ctx: Context) -> None:
    """One report is one failure: of two rules matching lines of the same writer's traceback,
    or of one message printed over a few lines (an error and the hints printed under it), the
    more specific explains the other."""
    reports = [e for e in graph.events if failing(e)]
    caught = ctx.caught(graph)
    for a in reports:
        if id(a) in caught:
            continue  # the program went on from it: what it printed next is another report
        block = {(c.source, c.line) for h in a.hits for c in h.context}
        block |= {(h.record.source, h.record.line) for h in a.hits}
        for b in reports:
            if b is a or not (b.primary or b.rule.exit_path):
                continue
            # an abort printed with a timeout ("terminate called ... what(): ... timeout") is
            # how that timeout ended the process; otherwise the more specific rule wins
            if not b.rule.exit_path and (not a.primary or b.rule.specificity >= a.rule.specificity):
                continue
            if b.rule.exit_path and a.rule.exit_path:
                continue
            if _same_report(a, b, block):
                graph.add(a, b, "same report", "the same message, read by a more specific rule")


def _same_report(a: Event, b: Event, block: set[tuple[str, int]]) -> bool:
    if _subjects(a) != _subjects(b) and (_subjects(a) or _subjects(b)):
        return False  # a launcher's lines about different ranks ('task 2: Segmentation
        # fault', then 'tasks 0-1: Terminated') are reports of their own
    lines = {(h.record.source, h.record.line) for h in b.hits}
    near = {(c.source, c.line) for h in b.hits for c in h.context}
    if lines & block or near & {(h.record.source, h.record.line) for h in a.hits}:
        return True
    return any(
        ha.record.source == hb.record.source
        and ha.record.stream_key == hb.record.stream_key
        and abs(ha.record.line - hb.record.line) <= SAME_REPORT_LINES
        for ha in a.hits
        for hb in b.hits
    )


def _right_under(a: Event, b: Event) -> bool:
    """b's line follows one of a's closely in the same writer's stream."""
    return any(
        ha.record.source == hb.record.source
        and ha.record.stream_key == hb.record.stream_key
        and 0 < hb.record.line - ha.record.line <= SAME_REPORT_LINES
        for ha in a.hits
        for hb in b.hits
    )


def _subjects(event: Event) -> set[str]:
    """The ranks the event's lines name as what they are about (their 'rank' capture, or the
    local rank a launcher's report names: 'failed (exitcode: -11) local_rank: 1'; kept apart,
    since a node's local rank 1 need not be global rank 1)."""
    subjects: set[str] = set()
    for h in event.hits:
        if rank := h.captures.get("rank"):
            subjects.add(rank)
        elif local := h.captures.get("local_rank"):
            subjects.add(f"local {local}")
    return subjects


def relate_exit_path(graph: CausalGraph, ctx: Context) -> None:
    """On one rank, its first failure explains what it printed after: an abort on the way out,
    its own closed connections, a generic exception; not a later, more specific failure (a
    warning-level exception logged before the real error)."""
    by_rank: dict[int, list[Event]] = {}
    for event in graph.events:
        if event.rank is not None and (failing(event) or event.rule.exit_path):
            by_rank.setdefault(event.rank, []).append(event)
    caught = ctx.caught(graph)
    for rank, events in by_rank.items():
        for a in events:
            if not failing(a) or id(a) in caught:
                continue  # a failure the program caught and went on from ended nothing
            for b in events:
                if a is b or precedes(a, b) is not True:
                    continue
                if a.rule.exit_path and not b.rule.exit_path and _right_under(a, b):
                    # 'terminate called after throwing ...' and, under it, its 'what():' (a
                    # watchdog's timeout): the abort's reason, not what the rank said after it
                    graph.add(b, a, "same report", "the reason the abort printed under it")
                    continue
                if (
                    b.rule.exit_path
                    or b.echo is not None
                    or (b.rule.specificity <= a.rule.specificity)
                ):
                    graph.add(a, b, "exit path", f"rank {rank} went down after its own failure")
    # an abort of a rank that failed, where nothing orders the two: still its exit path
    for rank, events in by_rank.items():
        crashes = [e for e in events if e.rule.exit_path]
        firsts = [e for e in events if failing(e) and not e.rule.exit_path and id(e) not in caught]
        for crash in crashes:
            if not graph.explained(crash) and firsts:
                graph.add(firsts[0], crash, "exit path", f"how rank {rank} died after failing")


def relate_echoes(graph: CausalGraph, ctx: Context) -> None:
    """A rank that waited, lost its peer or was stopped is the echo of a failure on another
    rank that was not logged clearly after it; a timeout that began about when that failure
    happened is proven to be its echo (timeout arithmetic)."""
    primaries = [e for e in graph.events if e.primary]
    for echo in graph.events:
        if echo.echo not in (Echo.WAITING, Echo.LOST_PEER, Echo.STOPPED):
            continue
        for cause in primaries:
            if cause.rank is not None and cause.rank == echo.rank:
                continue  # same rank: the exit-path relation decides
            if not could_cause(cause, echo) or _printed_after_the_stop(cause, echo):
                continue
            if _left_after_its_work(cause, echo, ctx):
                continue
            proof = _timeout_arithmetic(cause, echo)
            graph.add(cause, echo, "echo", proof or "", proof=bool(proof))


def _left_after_its_work(cause: Event, echo: Event, ctx: Context) -> bool:
    """The abort a process prints at its own exit does not explain a rank that waited in a
    collective its code called after training announced its end: the aborting process had
    finished its work and left its Python code; the collective was one it never called (the
    waiting rank's own branch, a collective mismatch), and the abort is its teardown."""
    if echo.rank is None or not aborted_at_exit(cause):
        return False
    view = ctx.evidence.ranks.get(echo.rank)
    return view is not None and view.waited_after_end


def _printed_after_the_stop(cause: Event, echo: Event) -> bool:
    """A stop of the whole job from outside (no rank's: a launcher's time limit, a scheduler's
    cancel) printed in the same output above every line of the failure: the launcher wrote the
    stop, then what its stop did (Hydra's 'APPLICATION TIMED OUT', then its boxes of the
    processes it killed); that failure came after it, it did not make it."""
    if echo.echo != Echo.STOPPED or echo.rank is not None:
        return False
    stopped_at = {h.record.source: h.record.line for h in echo.hits}
    return bool(cause.hits) and all(
        h.record.source in stopped_at and h.record.line > stopped_at[h.record.source]
        for h in cause.hits
    )


def _timeout_arithmetic(cause: Event, echo: Event) -> str | None:
    """A watchdog line says how long it waited; a failure about that long before it proves
    the timeout is its echo."""
    if cause.time is None:
        return None
    for hit in echo.hits:
        ms = hit.captures.get("timeout_ms", "")
        if not ms.isdigit() or len(ms) > 12 or hit.record.time is None:
            continue
        waited = timedelta(milliseconds=int(ms))
        since = hit.record.time - waited
        gap = (since - cause.time).total_seconds()
        if -5.0 <= gap <= max(60.0, waited.total_seconds() * 0.25):
            who = f"rank {echo.rank}" if echo.rank is not None else "a rank"
            return (
                f"Timeout arithmetic: {who} timed out at {_hms(hit.record.time)} after "
                f"{waited.total_seconds():g} s, so it had waited since {_hms(since)}; the root "
                f"failure was at {_hms(cause.time)}, {abs(gap):.2f} s "
                f"{'before' if gap >= 0 else 'after'} that: the timeout is its consequence."
            )
    return None


def _hms(t: datetime) -> str:
    return t.strftime("%H:%M:%S.%f")[:-3]


def relate_launcher(graph: CausalGraph, ctx: Context) -> None:
    """The launcher's notices (SIGTERM sent to the others, its failure summary) follow
    whatever failed."""
    causes = [e for e in graph.events if failing(e)]
    for notice in graph.events:
        if notice.echo == Echo.LAUNCHER:
            for cause in causes:
                graph.add(cause, notice, "launcher", "the launcher's reaction to a failure")


def relate_launcher_escalation(graph: CausalGraph, ctx: Context) -> None:
    """A worker the launcher had sent a closing signal and that then died of SIGKILL was
    killed by the launcher once its grace period ran out (it ignored or outlived the SIGTERM):
    an exit code that reads as the OOM killer's is the launcher's reaction to whatever failed
    first."""
    killed = ctx.evidence.killed_after_stop
    if not killed:
        return
    for event in graph.events:
        if event.rank not in killed or not failing(event):
            continue
        if not all(h.suggests for h in event.hits):
            continue  # words of the process itself ('MemoryError'): its own failure, not only
            # what its exit code suggests
        for cause in graph.events:
            if cause is not event and failing(cause) and cause.rank != event.rank:
                graph.add(
                    cause,
                    event,
                    "launcher",
                    "the launcher's SIGKILL after the closing signal it sent that process",
                )


def relate_launcher_shutdown(graph: CausalGraph, ctx: Context) -> None:
    """Once the launcher has reported a failed worker, errors printed after that notice by
    no worker (the agent's store or rendezvous failing while it shuts down: the agent that
    hosted the store is gone too) are part of its shutdown, explained by what the workers
    did."""
    notices = [e for e in graph.events if e.echo == Echo.LAUNCHER]
    workers = [e for e in graph.events if failing(e) and _by_worker(e)]
    if not notices or not workers:
        return
    for event in graph.events:
        if not event.primary or event.rank is not None or _by_worker(event):
            continue
        if not any(precedes(n, event) is True for n in notices):
            continue
        for cause in workers:
            graph.add(
                cause,
                event,
                "launcher",
                "the launcher's own error while it shut down after a worker failed",
            )


def _by_worker(event: Event) -> bool:
    """Some line of the event carries a worker's rank (its prefix or the file it came from)."""
    return any(h.record.origin.rank is not None for h in event.hits)


def _went_down(graph: CausalGraph, event: Event) -> bool:
    """The event is how its rank went down after losing a peer or waiting for one (an abort
    on the way out): that rank was a victim, its crash explains no other rank's error."""
    return any(
        edge.relation == "exit path"
        and isinstance(edge.cause, Event)
        and edge.cause.echo in (Echo.WAITING, Echo.LOST_PEER)
        for edge in graph.causes_of(event)
    )


def relate_consequences(graph: CausalGraph, ctx: Context) -> None:
    """A generic exception on another rank, not logged clearly before a specific failure, is
    most likely that failure's echo (a rank raising on a broken collective). Not an error
    the job went on from (an exception Python printed and ignored at exit): it broke
    nothing."""
    specific = [
        e
        for e in graph.events
        if e.primary
        and not e.generic
        and not _went_down(graph, e)
        and not survived(e, ctx.evidence)
    ]
    for event in graph.events:
        if not (event.primary and event.generic):
            continue
        for cause in specific:
            if cause.rank is not None and cause.rank == event.rank:
                continue
            if could_cause(cause, event) and not _written_later(cause, event):
                graph.add(cause, event, "consequence", "a generic error after a specific one")


def _written_later(a: Event, b: Event) -> bool:
    """Every line of a comes after every line of b in the same writer's output: b came first,
    clocks or not."""
    return all(
        ha.record.source == hb.record.source
        and ha.record.stream_key == hb.record.stream_key
        and ha.record.line > hb.record.line
        for ha in a.hits
        for hb in b.hits
    )


def relate_refinements(graph: CausalGraph, ctx: Context) -> None:
    """A finding that declares it explains a kind is the cause of that kind's findings."""
    for cause in graph.events:
        for kind in cause.rule.explains:
            for effect in graph.events:
                if effect.rule.kind == kind and effect is not cause:
                    graph.add(cause, effect, "refinement", f"explains the {kind}")


def _after(event: Event, first_line: dict[str, int]) -> bool:
    """Every line of the event comes after the given line of its source."""
    return bool(event.hits) and all(
        h.record.source in first_line and h.record.line > first_line[h.record.source]
        for h in event.hits
    )


def relate_completion(graph: CausalGraph, ctx: Context) -> None:
    """After training announced its end (or every writer that counts epochs stood at the last
    one: decision._work_done_at), a crash, a lost peer or a stop from outside (a time
    limit reached by a job that did not exit) is teardown: the work was done (of the rank it
    happened to, when the announcements say which ranks finished). Not a rank that waited in a
    collective its own code called after the end: it was still doing distributed work."""
    if not ctx.completed_at:
        return
    finished = {r for r, v in ctx.evidence.ranks.items() if v.completed}
    # nobody waited for a peer or lost one: whichever rank announced the end trained in step
    # with the others (every step's collectives need them all) and none of them was needed
    # again, so a rank that crashed after the end had done its work too (the main process
    # alone logs "Training completed"; another rank dies in its exit hooks)
    nobody_missed = not ctx.evidence.echoes & {Echo.WAITING.value, Echo.LOST_PEER.value}

    def its_work_was_done(event: Event) -> bool:
        if event.rank is not None and event.echo in (Echo.WAITING, Echo.LOST_PEER):
            view = ctx.evidence.ranks.get(event.rank)
            if view is not None and view.waited_after_end:
                return False
        # in a console shared by ranks, another rank's end says nothing about this one, nor
        # does an end no rank can be tied to (one rank may have finished early, alone); but
        # an abort only a process's own teardown prints (its threads destroyed at exit) came
        # after whatever work that process did
        return (
            event.rank is None
            or event.rank in finished
            or any("at_exit" in h.captures for h in event.hits)
            or (nobody_missed and event.echo is None)
        )

    teardown = ctx.intended.get("teardown")
    crashes = [
        e
        for e in graph.events
        if (e.crash_like or e.echo == Echo.STOPPED)
        and not all(h.handled for h in e.hits)  # Python printed it and went on
        # a failure its own rule already reads as teardown keeps that rule (and its fix)
        and (teardown is None or e.rule.kind != teardown.kind)
        and _after(e, ctx.completed_at)
        and its_work_was_done(e)
    ]
    if not crashes:
        return
    node = graph.add_node(Node("completion", ctx.intended.get("teardown")))
    for crash in crashes:
        graph.add(node, crash, "completion", work_done_note(ctx.evidence))


def work_done_note(evidence: JobEvidence) -> str:
    """How the job's work is known to have been done before a teardown failure."""
    if evidence.completed_at:
        return "training had announced its end before this happened: the work was done."
    return (
        "every rank that counts epochs had reached the last one, its steps done, before this "
        "happened: the work was done."
    )


def relate_left_at_exit(graph: CausalGraph, ctx: Context) -> None:
    """A rank whose only failure is the abort of its own exit had left its Python code with
    no error while another rank still waited for it or lost it: how it left (a sys.exit or a
    return on that rank alone: the uncoordinated exit names it), not a crash in its work.
    After the end of training it is teardown (relate_completion)."""
    evidence = ctx.evidence
    waiting = evidence.waiting

    def left_alone(event: Event) -> bool:
        view = evidence.ranks.get(event.rank) if event.rank is not None else None
        return view is not None and view.left_at_exit and bool(waiting - {view.rank})

    aborts = [
        e
        for e in graph.events
        if e.primary and aborted_at_exit(e) and not graph.explained(e) and left_alone(e)
    ]
    if not aborts:
        return
    node = graph.add_node(Node("left at exit", None))
    for abort in aborts:
        graph.add(
            node,
            abort,
            "left",
            "the abort of its exit, with no error before it: it had left its Python code "
            "while the others still needed it.",
        )


def relate_survived(graph: CausalGraph, ctx: Context) -> None:
    """A lost peer or a timeout that training went on from (its end announced later in the
    same output) explains nothing and accuses nobody: the job outlived it."""
    gone = [e for e in graph.events if survived(e, ctx.evidence)]
    gone_ids = {id(e) for e in gone}  # not `e in gone`: field-wise equality, 16,000 events
    caught_ids = ctx.caught(graph)
    caught = [e for e in graph.events if id(e) not in gone_ids and id(e) in caught_ids]
    if not gone and not caught:
        return
    node = graph.add_node(Node("went on", None))
    for event in gone:
        graph.add(node, event, "survived", "training went on and announced its end after this.")
    for event in caught:
        graph.add(
            node,
            event,
            "survived",
            "the program logged this as a warning (it caught it and went on); a later failure "
            "of the same writer ended it.",
        )


def _caught(event: Event, events: list[Event]) -> bool:
    """A failure the program logged at warning level (it caught it: fairseq's "OOM: Ran out of
    memory ... attempting to recover") and after which another failure of the same writer
    followed in the same output: that later one ended the process."""
    if not event.primary or not event.hits:
        return False
    if any(h.record.level != "warning" for h in event.hits):
        return False
    first = min(event.hits, key=lambda h: h.record.line).record
    return any(
        other.primary  # not an abort: that is how the caught error's rank may still die
        and other.rule.kind != event.rule.kind
        and (other.rank is None or event.rank is None or other.rank == event.rank)
        and any(h.record.source == first.source and h.record.line > first.line for h in other.hits)
        for other in events
    )


def relate_teardown_marker(graph: CausalGraph, ctx: Context) -> None:
    """Once a program reached its end with the process group alive, a native crash is how it
    was torn down."""
    markers = [e for e in graph.events if e.marker == Marker.TEARDOWN]
    if not markers:
        return
    for crash in graph.events:
        # (not an exception Python printed under 'Exception ignored in ...' and went on from)
        if crash.rule.exit_path and not all(h.handled for h in crash.hits):
            graph.add(markers[0], crash, "teardown", "the process was being torn down")


def agreed_stop(graph: CausalGraph, ctx: Context) -> list[Event]:
    """The stop announcements, when every rank announced (or agreed to) the early stop, or
    caught the scheduler's warning signal (or the scheduler said, for the whole job, why it
    ended it: its reason)."""
    stops = [e for e in graph.events if e.marker == Marker.STOP]
    warned = [e for e in graph.events if e.marker == Marker.WARNED]
    if not stops and warned and (_every_rank_said(warned, ctx) or _for_the_job(warned)):
        return warned
    if not stops:
        return []
    announcers = {e.rank for e in stops if e.rank is not None}
    ranks = _present(ctx)
    agreed = [
        int(n)
        for e in stops
        for h in e.hits
        if (n := h.captures.get("agreed_ranks", "")).isdigit() and len(n) <= 7
    ]
    if announcers and announcers >= ranks:
        return stops
    if not announcers and sum(announcements(e) for e in stops) >= max(1, len(ranks)):
        return stops
    if agreed and max(agreed) >= len(ranks):
        return stops
    if (
        announcers <= {0}
        and not any(failing(e) for e in graph.events)
        and not ctx.evidence.failing_exits
        and not ctx.evidence.echoes & {"waiting", "lost-peer"}
    ):
        # announced by the main process alone (or by no rank the logs name), and nothing
        # failed after it: had the others not stopped with it, they would have waited for
        # it and timed out
        return stops
    if (
        announcers <= {0}
        and _ended_after(stops, ctx.evidence)
        and not ctx.evidence.echoes & {"waiting", "lost-peer"}
    ):
        # ... or the run announced its end below it in the same output (PyTorch-Ignite's
        # 'EarlyStopping: Stop training', then 'End of run') and no rank lost or waited for
        # the others after it (they stopped too): whatever crashed on the way out after
        return stops
    return []


def _present(ctx: Context) -> set[int]:
    return {r for r, v in ctx.evidence.ranks.items() if v.present}


def _for_the_job(events: list[Event]) -> bool:
    """A scheduler's words for the whole job, not a rank's: it names its reason."""
    return any(e.rank is None and "reason" in h.captures for e in events for h in e.hits)


def _every_rank_said(events: list[Event], ctx: Context) -> bool:
    """Every rank that wrote said it (by rank, or counted where no line names its rank)."""
    said = {e.rank for e in events if e.rank is not None}
    ranks = _present(ctx)
    if said:
        return said >= ranks
    return sum(announcements(e) for e in events) >= max(2, len(ranks))


def _ended_after(stops: list[Event], evidence: JobEvidence) -> bool:
    """An announcement of the end of the whole run (by no rank: a launcher's, the parent's)
    below a stop announcement in the same output. A rank's own 'training finished' after
    its stop may be that rank leaving alone."""
    return any(
        end.origin.rank is None
        and end.origin.local_rank is None
        and end.source == h.record.source
        and end.line > h.record.line
        for stop in stops
        for h in stop.hits
        for end in evidence.end_marks
    )


def announcements(stop: Event) -> int:
    """Ranks writing one console at the same moment glue their lines together ("...2
    epochsEarly stopping at epoch 5..."): the repeat is counted, not the line. The same line
    in two outputs (the console and the log file a logger also writes, nnU-Net's training
    log): no rank, the same words at the same instant to the sub-second, is one announcement."""
    total = 0
    copies: set[tuple[str, object]] = set()
    for hit in stop.hits:
        record = hit.record
        if record.origin.rank is None and record.time is not None and record.time.microsecond:
            if (record.text.strip(), record.time) in copies:
                continue
            copies.add((record.text.strip(), record.time))
        text = hit.record.text
        said = next(
            (
                _announced(m, s.required_literal)
                for s in stop.rule.signatures
                if (m := s.compiled.search(text))
            ),
            "",
        )
        total += max(1, text.casefold().count(said)) if said else 1
    return total


def _announced(match: re.Match[str], literal: str) -> str:
    """The words a stop's signature matched (casefolded), to count in its line. A signature
    that reads from the line's start ('Loss is inf, stopping training') matches the whole of
    two glued announcements at once: of its match, only the words from its literal on."""
    folded = match.group(0).casefold()
    if match.start() > 0:
        return folded
    at = folded.rfind(literal.casefold())
    return folded[at:] if at >= 0 else folded


def relate_agreed_stop(graph: CausalGraph, ctx: Context) -> None:
    """After every rank stopped early on purpose, its exit path (a crash, lost peers, a
    generic exception, a non-zero exit) is not a failure of training."""
    stops = agreed_stop(graph, ctx)
    if not stops:
        return
    node = graph.add_node(Node("agreed stop", ctx.intended.get("agreed-stop")))
    first: dict[str, int] = {}
    for stop in stops:
        for h in stop.hits:
            first[h.record.source] = min(first.get(h.record.source, h.record.line), h.record.line)
    for event in graph.events:
        after = (event.crash_like or event.echo is not None) and _after(event, first)
        if after or (event.primary and event.generic) or event.echo == Echo.LAUNCHER:
            graph.add(node, event, "agreed stop", "every rank had stopped on purpose before it")


def relate_stall(graph: CausalGraph, ctx: Context) -> None:
    """Once `ddpdoctor run` caught the job stalled, the ranks' timeouts, lost peers, aborts and
    stops are its echo; and when something stopped the job afterwards (its own kill, Ctrl-C,
    a SIGTERM), so are the generic exceptions the stop made them raise. A real error raised
    without a stop is not the stall's echo."""
    stall = ctx.evidence.stall
    if stall is None:
        return
    node = graph.add_node(Node("stall", None, time=stall.time))
    for event in graph.events:
        stop_echo = stall.stopped and event.primary and event.generic
        if event.echo is not None or event.rule.exit_path or stop_echo:
            graph.add(node, event, "stall", "printed when the stalled job was stopped")


def relate_run_stop(graph: CausalGraph, ctx: Context) -> None:
    """When `ddpdoctor run` ended the job (its kill after a hang, or a stop signal it
    forwarded and escalated), what that stop made the processes print is its echo: a SIGKILL
    reported without the OOM killer's word (it was ours), a stop signal."""
    if not ctx.evidence.stopped_by_run:
        return
    node = graph.add_node(Node("stopped by ddpdoctor run", None))
    for event in graph.events:
        sent_by_us = event.primary and all(h.suggests for h in event.hits)
        if sent_by_us or event.echo == Echo.STOPPED:
            graph.add(node, event, "run stop", "the stop ddpdoctor run sent to the job")


def relate_outside_stop(graph: CausalGraph, ctx: Context) -> None:
    """A stop sent to the whole job (the launcher's death signal: a scheduler's SIGTERM, a
    person's Ctrl-C) reaches the ranks one by one: the first to go closes its connections, and
    a peer still in a collective then reports a lost peer or a generic error. Those are its
    echo when printed after the stop: in the same log by line, across logs by time; across logs
    without times too when the stop reached a launcher agent, which ends the group itself when
    a worker fails (torchrun, DeepSpeed): still there to receive it, it had seen none fail. So
    is a death its signal alone suggests a cause for (a SIGKILL after the stop is its
    escalation, not the OOM killer). A timeout is kept: it takes minutes, and says the job hung
    before anybody stopped it."""
    stops = [e for e in graph.events if e.echo == Echo.STOPPED and e.rank is None and e.hits]
    if not stops:
        return
    # an agent that supervises its workers (torchrun's, DeepSpeed's) ends the job itself when
    # one fails; srun lets the other tasks run on, so a Slurm stop orders nothing by itself
    # (the stop lines that name the signal they received are the agents': torchrun's death
    # signal and SignalException, DeepSpeed's "Main process received"; slurmstepd names none)
    by_agent = any("signum" in h.captures or "sig" in h.captures for e in stops for h in e.hits)
    first: dict[str, int] = {}
    stop_time: dict[str, datetime] = {}  # per source, when its own stop came (by its clock)
    for stop in stops:
        for h in stop.hits:
            src = h.record.source
            first[src] = min(first.get(src, h.record.line), h.record.line)
            if h.record.time is not None:
                stop_time[src] = min(stop_time.get(src, h.record.time), h.record.time)
    stopped_at = min(stop_time.values()) if stop_time else None
    # another node's agent that reacted to a failure of its own (reported a failed worker,
    # terminated the others) had seen one before any stop reached the job: its workers' errors
    # are not the stop's (`reacted`: a source with no stop; `reacted_first`: one whose agent
    # reacted before its own stop, not to the stop itself, by the clock after the first stop)
    reacted: set[str] = set()
    reacted_first: set[str] = set()
    # a source with no stop of its own reacted before the stop unless its agent's first timed
    # report of a failure came after it by the clock (then it may have reacted to what the stop
    # did; the untimed lines of its summary follow that report)
    first_report: dict[str, datetime | None] = {}
    for e in graph.events:
        if e.echo != Echo.LAUNCHER:
            continue
        for h in e.hits:
            src, when = h.record.source, h.record.time
            after_stop = bool(when and stopped_at and when >= stopped_at)
            if src not in first:
                if when is not None:
                    known = first_report.get(src)
                    first_report[src] = when if known is None else min(known, when)
                else:
                    first_report.setdefault(src, None)
            elif h.record.line < first[src] and not after_stop:
                reacted_first.add(src)
    for src, when in first_report.items():
        if when is None or stopped_at is None or when < stopped_at:
            reacted.add(src)

    def stopped_elsewhere_first(src: str) -> bool:
        """Another agent got the stop before this source's did (by their clocks), and this
        source's agent had reported no failed worker before its own: a lost peer printed
        there before its own stop came from the ranks the first stop ended."""
        own = stop_time.get(src)
        return (
            by_agent
            and own is not None
            and src not in reacted_first
            and any(t < own for other, t in stop_time.items() if other != src)
        )

    def after_the_stop(event: Event) -> bool:
        for h in event.hits:
            src, when = h.record.source, h.record.time
            if src in first:
                if h.record.line <= first[src] and not (
                    event.echo == Echo.LOST_PEER and stopped_elsewhere_first(src)
                ):
                    return False
            elif when is not None and stopped_at is not None:
                if when < stopped_at:
                    return False
            elif not by_agent or src in reacted:
                return False
        return bool(event.hits)

    for event in graph.events:
        if event.echo in (Echo.STOPPED, Echo.WAITING):
            continue
        echo_like = event.echo in (Echo.LOST_PEER, Echo.LAUNCHER)
        # (and a death that only its signal suggests a cause for, a SIGKILL read as the OOM
        # killer's: after a stop of the whole job, that stop's escalation; Hydra kills every
        # process with SIGKILL at its time limit, a scheduler after its grace period)
        # (not where a rank had timed out already: the job hung before the stop came, and
        # the kill of the stuck rank is what the timeout waited for)
        suggested = (
            event.primary and all(h.suggests for h in event.hits) and not ctx.evidence.timed_out
        )
        if (echo_like or (event.primary and event.generic) or suggested) and after_the_stop(event):
            graph.add(stops[0], event, "outside stop", "the stop sent to the whole job ended it")


def relate_stopped_rank(graph: CausalGraph, ctx: Context) -> None:
    """A rank whose own words say a stop from outside reached it (its SIGTERM handler: an
    eviction, a preemption of its node) was gone from then on: the other ranks that lost it
    or waited for it later by the clock echo that stop."""
    for stop in graph.events:
        if stop.echo != Echo.STOPPED or stop.rank is None or stop.time is None:
            continue
        for event in graph.events:
            if event.echo not in (Echo.LOST_PEER, Echo.WAITING) or event.rank in (None, stop.rank):
                continue
            if event.time is not None and event.time > stop.time:
                graph.add(
                    stop, event, "stopped rank", f"rank {stop.rank} had been stopped from outside"
                )


RELATIONS = (
    relate_same_report,
    relate_exit_path,
    relate_launcher_escalation,
    relate_echoes,
    relate_launcher,
    relate_launcher_shutdown,
    relate_stopped_rank,
    relate_consequences,
    relate_refinements,
    relate_completion,
    relate_left_at_exit,
    relate_survived,
    relate_teardown_marker,
    relate_agreed_stop,
    relate_stall,
    relate_run_stop,
    relate_outside_stop,
)
"""Applied in this order; every relation only adds edges."""
