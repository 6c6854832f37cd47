"""What every rank did, gathered from the events, the job facts and a live run's stacks into
plain evidence (model.evidence) that hypotheses are scored from. Reads; decides nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import lru_cache

from ddpdoctor.analysis.events import Event, aborted_at_exit
from ddpdoctor.analysis.facts import elapsed_seconds
from ddpdoctor.analysis.frames import (
    FRAME,
    LIBRARY_PATH,
    LOCK_CALL,
    SLEEP_CALL,
    handler_start,
    in_backward,
    in_ddp_forward,
    interrupted_line,
    phase,
)
from ddpdoctor.analysis.job import JobView
from ddpdoctor.analysis.phases import (
    counted_phase,
    phase_of_work,
    search_with_words,
    slow_unit_of_work,
)
from ddpdoctor.analysis.relations import before_attempt, in_earlier_attempt, survived
from ddpdoctor.analysis.scanner import (
    ANY_COUNTER,
    CLOCK_WITHIN,
    DATA_ENDED,
    DATA_ENDED_WORDS,
    OTHER_PHASE_BAR,
    PROGRESS_COUNTER,
    RECENT_MIN,
    FactHit,
    StreamSummary,
    epoch_total,
    epochs_after,
    last_epoch_done,
    progress_line,
)
from ddpdoctor.ingest.bounds import count_number
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.tracebacks import EXCEPTION_LINE
from ddpdoctor.model.evidence import (
    COLLECTIVE_FUNCTIONS,
    Activity,
    JobEvidence,
    RankView,
    Stall,
    WaitSite,
)
from ddpdoctor.model.findings import Evidence, Hit
from ddpdoctor.model.records import Record
from ddpdoctor.rules.base import Echo, Marker

MAX_LOGGED_ERRORS = 8
"""Writers' last error-level lines kept (10,000 rank files may each have one)."""
STARTUP_SEQ = 5
"""A timed-out collective among the first this many of the job happened at start-up."""
BUSY_PROGRESS_MIN_S = 30.0
"""Without a known collective timeout, a bar must have run this long to prove a busy rank."""
BUSY_WINDOW = (0.5, 1.25)
"""A bar whose elapsed time is about the collective timeout (this share of it) ran while the
others waited: it started with the collective they waited in. With the timeout known, the
window alone decides (a 15 s timeout's busy rank ran a 15 s bar, below the floor above)."""
LAST_WORDS_READ = 1024
"""Distinct last words whose readings (a phase announced, a slow piece of work, data that ran
out) are kept: the ranks of a job end on the same few lines. 10,000 rank files: 4,661 of their
19,750 writers end on one DeepSpeed warning (9 variants of 412 characters) whose case-blind
search for the end of the data took 70 us a time, 0.5 s of the parent's analysis. The strings
kept are the writers' own (no copy); only a diagnosis's last ones stay after it."""


def _digits(text: str | None, limit: int = 12) -> int | None:
    if text is None or not text.isdigit() or len(text) > limit:
        return None
    return int(text)


def wait_site(hit: Hit) -> WaitSite:
    """Where a timed-out rank waited: the watchdog's own fields, else its traceback."""
    op = hit.captures.get("op")
    # gloo names the transport's half ("Timed out waiting ... for recv operation"): one
    # all-reduce is a send on one rank and a recv on another, so only a collective named by
    # the traceback says which operation it was
    transport_half = op in ("recv", "send")
    site: str | None = None
    caller: str | None = None
    cut = handler_start(hit)
    if cut is not None:  # a signal handler's own collective: not where the rank was waiting
        op, transport_half = None, False
    for record in reversed(hit.context[:cut]):
        m = FRAME.search(record.text)
        if m is None:
            continue
        if (
            (op is None or transport_half)
            and "distributed" in m["path"]
            and m["func"] in COLLECTIVE_FUNCTIONS
        ):
            op, transport_half = m["func"], False
        if not LIBRARY_PATH.search(m["path"]):
            here = f"{m['path'].rsplit('/', 1)[-1]}:{m['line']}"
            if site is None:
                site = here
            elif caller is None:
                caller = here
    return WaitSite(
        op=None if transport_half else op,
        site=site,
        seq=_digits(hit.captures.get("seq")),
        numel=_digits(hit.captures.get("numel")),
        phase=phase(hit) if cut is None else None,
        group=_digits(hit.captures.get("group")),
        caller=caller,
    )


def _interrupted_activity(site: str, code: str) -> Activity:
    """What a rank was doing where a stop signal's handler found it, read from that code line
    as `ddpdoctor run` reads a stack: blocked on a lock, asleep, or at work."""
    if LOCK_CALL.search(code):
        return Activity("lock", "acquire", site, code)
    if SLEEP_CALL.search(code):
        return Activity("sleep", "sleep", site, code)
    return Activity("compute", "", site, code)


def _spoke_after_waits(job: JobView, events: list[Event], ranks: dict[int, RankView]) -> None:
    """Ranks whose last line in a console comes after another rank's timeout or lost peer in
    that console (a paste cut on a rank's own timeout line, a rank that went on printing
    while the others gave up on it) were there when the others gave up: they did not leave
    first."""
    waits: dict[str, list[tuple[int, int | None]]] = {}
    for event in events:
        if event.echo not in (Echo.WAITING, Echo.LOST_PEER):
            continue
        for hit in event.hits:
            if not before_attempt(hit.record, job.last_restart, job.earlier_attempt_sources):
                waits.setdefault(hit.record.source, []).append((hit.record.line, event.rank))
    if not waits:
        return
    for stream in job.streams:
        writer = job.resolve(stream.origin)
        view = ranks.get(writer) if writer is not None else None
        if view is None or stream.source in job.earlier_attempt_sources:
            continue
        if any(
            line < stream.last_line and rank is not None and rank != writer
            for line, rank in waits.get(stream.source, ())
        ):
            view.spoke_after_waits = True


def _trained_on_after(job: JobView, known: set[int]) -> dict[int, set[int]]:
    """Each rank whose last line in a console comes before another rank's last training-
    progress line in that console, with those ranks: they trained on after it fell silent.
    (Per-rank files give no common order: only a console the ranks share says who stopped
    first.)"""
    last: dict[str, dict[int, int]] = {}
    progress: dict[str, dict[int, int]] = {}
    for stream in job.streams:
        writer = job.resolve(stream.origin)
        if writer is None or writer not in known or stream.source in job.earlier_attempt_sources:
            continue
        lines = last.setdefault(stream.source, {})
        lines[writer] = max(lines.get(writer, 0), stream.last_line)
        if stream.last_progress_line > 0:
            steps = progress.setdefault(stream.source, {})
            steps[writer] = max(steps.get(writer, 0), stream.last_progress_line)
    after: dict[int, set[int]] = {}
    for source, lines in last.items():
        steps = progress.get(source, {})
        for r, line in lines.items():
            if went_on := {o for o, p in steps.items() if o != r and p > line}:
                after.setdefault(r, set()).update(went_on)
    return after


def build_evidence(job: JobView, events: list[Event]) -> JobEvidence:
    job = _with_clean_loop_ends(job, events)
    info = job.info
    evidence = JobEvidence(
        world_size=info.world_size,
        single_node=job.single_node,
        transports=set(job.transports),
        ib_requested=job.ib_requested,
        pg_wait_ranks=set(job.pg_wait_ranks),
        local_ifaces=[Evidence.of(r, r.text[-200:]) for r in job.local_ifaces],
        job_exit_code=info.exit_code,
        launched_processes=job.launched_processes,
    )
    ranks = evidence.ranks
    seen = set(info.ranks_seen)  # a set: 10,000 ranks tested against a list took 0.65 s
    for rank in sorted(seen | set(info.ranks_missing)):
        ranks[rank] = RankView(rank=rank, present=rank in seen)
    for rank, exit_ in info.per_rank.items():
        view = ranks.setdefault(rank, RankView(rank=rank, present=True))
        view.exit_code, view.exit_signal = exit_.code, exit_.signal
        view.host = view.host or exit_.host
        view.exit_source = job.exit_sources.get(rank)
        if exit_.code is not None and exit_.code != 0 and exit_.signal != "SIGTERM":
            evidence.failing_exits[rank] = exit_.code

    ended_on_step: dict[int, bool] = {}
    for stream in job.streams:
        writer = job.resolve(stream.origin)
        if writer is None or writer not in ranks:
            continue
        view = ranks[writer]
        view.host = view.host or stream.origin.host
        if stream.source in job.earlier_attempt_sources:
            continue  # how the writer was in an attempt the launcher restarted
        if stream.last_line > 0:
            on_step = stream.last_progress_line == stream.last_line
            ended_on_step[writer] = ended_on_step.get(writer, True) and on_step
        if stream.source:
            view.sources.add(stream.source)
        if stream.error_lines and not _errors_before_restart(stream, job):
            view.warned = True
        if stream.progress_total is not None:
            view.progress_total = stream.progress_total
        if stream.last_line >= 0 and stream.last_text:
            view.last_text = stream.last_text
            if not stream.error_lines:
                view.busy_phase = _announced_phase(stream)
            view.data_ended = view.data_ended or _data_ended(stream)

    for rank, on_step in ended_on_step.items():
        ranks[rank].ended_on_step = on_step
    evidence.others_mid_step = _ended_mid_step(job)
    _spoke_after_waits(job, events, ranks)
    evidence.trained_on_after = _trained_on_after(job, set(ranks))

    flight = info.flight
    if flight is not None:
        evidence.flight = flight
        for rank in flight.ranks_with_dump:  # a rank that left a dump was there
            ranks.setdefault(rank, RankView(rank=rank)).present = True
    early = left_early(job, events)
    for rank in job.completed_ranks | early:
        view = ranks.setdefault(rank, RankView(rank=rank, present=True))
        view.present = True  # its own words announced the end
        view.completed = rank not in early
        view.announced_stop |= rank in early
        if rank not in job.completed_ranks:  # the announcement no rank could be tied to
            view.evidence.extend(
                replace(Evidence.of(record), rank=rank)
                for announcer, record in job.completions[:1]
                if announcer is None
            )
    _stopped_alive(job, events, ranks)
    evidence.completed_at = dict(job.completed_at)
    evidence.data_sizes = {u: dict(by_rank) for u, by_rank in job.data_sizes.items()}
    evidence.resume_points = {u: dict(by_rank) for u, by_rank in job.resume_points.items()}
    evidence.skipped_ranks = set(job.skipped_ranks)
    evidence.filtered_ranks = set(job.filtered_ranks)
    evidence.filtered_unranked = job.filtered_unranked
    evidence.skipped_unranked = job.skipped_unranked
    evidence.gpu_processes = {pid: set(gpus) for pid, gpus in job.gpu_processes.items()}
    evidence.gpu_process_rows = {at: Evidence.of(row) for at, row in job.gpu_process_rows.items()}
    evidence.prompts = [replace(Evidence.of(record), rank=rank) for rank, record in job.prompts]
    evidence.extension_waits = [
        replace(Evidence.of(record), rank=rank) for rank, record in job.extension_waits
    ]
    evidence.announcements = {
        rank: [replace(Evidence.of(record), rank=rank) for record in records]
        for rank, records in job.announcements.items()
    }
    evidence.end_marks = [r for rank, r in job.completions if rank is None or rank not in early]
    evidence.restart_ended_at = job.recovered_at
    _scope_to_last_attempt(evidence, job, events)
    for stream in job.streams:
        writer = job.resolve(stream.origin)
        if writer is not None and stream.last_progress_time is not None and stream.source:
            mark = (stream.source, stream.last_progress_line, stream.last_progress_time)
            evidence.lived_on.setdefault(writer, []).append(mark)
        if stream.last_progress_time is not None:
            at = evidence.last_progress_at
            evidence.last_progress_at = (
                max(at, stream.last_progress_time) if at else stream.last_progress_time
            )
        if stream.step_s is not None:
            evidence.step_s = max(evidence.step_s or 0.0, stream.step_s)
    if early:  # their announcements do not mark the end of training
        evidence.completed_at = {}
        for announcer, record in job.completions:
            if announcer is None or announcer not in early:
                line = evidence.completed_at.get(record.source, record.line)
                evidence.completed_at[record.source] = min(line, record.line)
    warned_by: set[tuple[str, str]] = set()
    for event in events:
        if survived(event, evidence):
            if event.echo in (Echo.WAITING, Echo.LOST_PEER):
                evidence.survived += 1  # the job went on to its end: not how any rank was left
            continue
        _add_event(evidence, event)
        if event.rule.severity == "warning":
            warned_by.add((event.rule.code, event.rule.title))
        if event.marker in (Marker.TEARDOWN, Marker.STOP):
            evidence.ended = True  # the program reached its end, or stopped on purpose
        evidence.reached_exit |= event.marker == Marker.TEARDOWN
        if event.rank is not None and _waited_after_end(event, evidence.completed_at):
            ranks[event.rank].waited_after_end = True

    evidence.warnings = [title for _, title in sorted(warned_by)]
    evidence.timeout_ms = _timeout_ms(events)
    evidence.startup_seq = _startup_seq(events)
    evidence.busy_progress = _busy_progress(job, evidence.timeout_ms)
    evidence.unranked_phase = _unranked_phase(job, events)
    evidence.unranked_phase_counted = evidence.unranked_phase is not None and counted_phase(
        evidence.unranked_phase.text
    )
    evidence.stopped_short = _stopped_short(job)
    evidence.logged_errors = _each_writers(
        job, lambda s: (s.last_error_line, s.last_error_text) if s.last_error_text.strip() else None
    )[:MAX_LOGGED_ERRORS]
    evidence.unranked_raised = _each_writers(
        job, lambda s: s.first_raised if job.resolve(s.origin) is None else None
    )
    evidence.stall = _stall(job)
    evidence.stopped_by_run = job.stopped
    evidence.ended |= bool(info.per_rank or info.exit_code is not None or job.completed_at)
    evidence.started_training = any(s.progress_lines for s in job.streams)
    evidence.normal_seen = job.normal_seen
    evidence.ignored_exceptions = sum(s.ignored_traces for s in job.streams)
    evidence.killed_after_stop = frozenset(
        rank
        for rank, exit_ in info.per_rank.items()
        if (exit_.code == -9 or exit_.signal == "SIGKILL") and exit_.pid in job.stopped_pids
    )
    evidence.world_stated = job.world_stated
    reactions = [h.record for e in events if e.echo is Echo.LAUNCHER for h in e.hits]
    reacted = [r.time for r in reactions if r.time is not None]
    evidence.launcher_reacted_at = min(reacted) if reacted else None
    last_reaction = max(reacted) if reacted else None
    reaction_lines = {(r.source, r.line) for r in reactions}
    evidence.worker_lines = sum(s.lines_seen for s in job.streams) - len(reaction_lines)
    peers = [
        PEER_ADDRESS.findall(h.record.text)
        for e in events
        if e.echo is Echo.LOST_PEER
        for h in e.hits
    ]
    _worked_while_others_waited(job, evidence, last_reaction, reaction_lines)
    _counted_work_until_the_reaction(job, evidence, reaction_lines)
    _progressed_while_others_waited(job, evidence)
    _counted_through_a_timeout(job, evidence, events)
    _counted_work_past_the_steps(job, evidence)
    evidence.lost_peers_on_loopback = bool(peers) and all(
        found and all(LOOPBACK.fullmatch(a) for a in found) for found in peers
    )
    evidence.last_step = _last_step(job)
    evidence.source_counters = _source_counters(job)
    evidence.ended_on_full_bar = any(
        s.last_line > 0 and s.last_line == s.last_progress_line and _full_bar(s.last_progress_text)
        for s in job.streams
    )
    errors_logged = any(s.error_lines for s in job.streams)
    evidence.ended_after_full_bar = (
        not evidence.ended_on_full_bar and not errors_logged and _ended_after_full_bar(job)
    )
    evidence.ended_on_planned_step = not errors_logged and _ended_on_planned_step(job)
    if job.launcher_summaries and not job.function_workers and not evidence.completed_at:
        _peer_of_a_lone_rank(evidence)  # (a function's summary lists one failure only)
    evidence.unlisted_exits = _unlisted_exits(job, evidence)
    evidence.unlisted_speakers = _unlisted_speakers(job, evidence)
    evidence.exited_cleanly = job.interpreter_exit_seen and not errors_logged
    if job.leaked_at_shutdown is not None:
        evidence.leaked_at_shutdown = Evidence.of(job.leaked_at_shutdown)
    counted = [
        last_epoch_done(s.last_epoch, job.max_epochs, s.first_epoch)
        for s in job.streams
        if s.last_epoch is not None
    ]
    evidence.ended_on_last_epoch = bool(counted) and all(counted)
    evidence.ended_at_epoch_total = evidence.ended_on_last_epoch and all(
        s.last_epoch[0] == epoch_total(s.last_epoch, job.max_epochs)
        for s in job.streams
        if s.last_epoch is not None
    )
    if evidence.ended_on_last_epoch:
        evidence.last_epoch_lines = [
            (s.source, s.last_progress_line) for s in job.streams if s.last_epoch is not None
        ]
    evidence.epochs_left = _epochs_left(job, evidence.unlisted_exits)
    evidence.early_in_first_epoch = _early_in_first_epoch(job, evidence.unlisted_exits)
    evidence.stalled_at_startup = _stalled_at_startup(job)
    evidence.one_device_per_process = _one_device_per_process(job)
    evidence.cut_tracebacks = list(job.cut_tracebacks)
    evidence.last_words = _last_words(job)
    evidence.traced_endings = {
        (s.source, s.last_line) for s in job.streams if s.last_line == s.closed_traceback_line
    }
    return evidence


def _errors_before_restart(stream: StreamSummary, job: JobView) -> bool:
    """Every error the writer logged was in an attempt the launcher restarted (its console
    above the agent's report, or an older attempt folder): in its last attempt it said none."""
    if stream.source in job.earlier_attempt_sources:
        return True
    restart = job.last_restart
    return (
        restart is not None
        and stream.source == restart.source
        and (stream.last_error_line < restart.line)
    )


def _scope_to_last_attempt(evidence: JobEvidence, job: JobView, events: list[Event]) -> None:
    """The job failed in an attempt after a restart: judge it by that attempt's failures, when
    it had any of its own (an error, a timeout). A last attempt whose workers only lost each
    other (the restarted group could not connect) never ran: the earlier attempts' failures
    are all there is to read."""
    evidence.last_restart = job.last_restart
    evidence.earlier_attempt_sources = job.earlier_attempt_sources
    if evidence.last_restart is None and not evidence.earlier_attempt_sources:
        return
    if not any(
        (e.primary or e.echo is Echo.WAITING)
        and not all(in_earlier_attempt(h.record, evidence) for h in e.hits)
        for e in events
    ):
        evidence.last_restart, evidence.earlier_attempt_sources = None, frozenset()


def _data_ended(stream: StreamSummary) -> str | None:
    """Its last line, or the one before it, or one of its first lines after its last step,
    when it says the writer's data ran out (torchtitan's 'Ran out of data; last step was 17.'
    is followed by its sleep, 'Training completed' and 'Process group destroyed.')."""
    for text in (stream.last_text, stream.prev_text, *stream.after_progress):
        if text and _said_data_ended(text):
            return text[:80]
    return None


@lru_cache(maxsize=LAST_WORDS_READ)
def _said_data_ended(text: str) -> bool:
    """Whether DATA_ENDED.search(text) finds a match, without its case-blind search of every
    writer's last two lines where none of its words is there (0.11 s for the 19,750 writers of
    10,000 rank files, in the parent after their scan)."""
    return search_with_words(DATA_ENDED, DATA_ENDED_WORDS, text)


def _worked_while_others_waited(
    job: JobView,
    evidence: JobEvidence,
    end: datetime | None,
    reactions: set[tuple[str, int]],
) -> None:
    """A writer that went on printing lines of its own (neither progress nor errors) while
    the others waited in a collective, until the launcher's reaction, was alive and busy
    with work of its own: not blocked, not gone. The wait is the collective timeout before
    the launcher's last reaction (`end`: after a restart, the last attempt's), or where the
    logs do not say the timeout, what followed the waiting ranks' last step. A writer no
    rank is known for counts for the one rank that neither waited nor failed, of its host
    where the ranks' own lines show theirs."""
    timeout_ms, waiting = evidence.timeout_ms, evidence.waiting
    if end is None or not waiting:
        return
    start = end - timedelta(milliseconds=timeout_ms) if timeout_ms else _wait_began(job, evidence)
    if start is None:
        return
    hosts = _hosts_of_ranks(job)
    for stream in job.streams:
        if len(stream.recent) < RECENT_MIN:
            continue
        inside = [
            (line, at, parsed.text)
            for line, raw in stream.recent
            if (stream.source, line) not in reactions
            and not LAUNCHER_OWN.search(raw)
            and not (parsed := parse_line(raw, stream.year)).text[:1].isspace()
            and (at := parsed.time or _clock_time(raw, end))
            and start <= at < end
        ]
        if len(inside) < RECENT_MIN:
            continue
        line, time, text = inside[-1]
        _busy_with(
            job, evidence, stream, hosts, Evidence(stream.source, line, None, None, time, text)
        )


def _progressed_while_others_waited(job: JobView, evidence: JobEvidence) -> None:
    """A writer whose own progress went on after the waiting ranks' last step, two of its
    progress lines at least after it, was at work in a phase of its own while they waited: the
    ranks of one training loop step together (its collectives hold each back), so a counter
    runs on past the others' only where it has no collective with them (its own evaluation,
    preprocessing, sampling). Alive and busy, not blocked."""
    if not evidence.waiting:
        return
    began = _wait_began(job, evidence)
    if began is None:
        return
    hosts: dict[int, str] | None = None
    for stream in job.streams:
        at, pace = stream.last_progress_time, stream.step_s
        if (
            at is None
            or pace is None
            or not stream.progress_moved
            or at - timedelta(seconds=pace) <= began
        ):
            continue
        hosts = _hosts_of_ranks(job) if hosts is None else hosts
        work = Evidence(
            stream.source, stream.last_progress_line, None, None, at, stream.last_progress_text
        )
        _busy_with(job, evidence, stream, hosts, work)


def _wait_began(job: JobView, evidence: JobEvidence) -> datetime | None:
    """The time of the waiting ranks' last progress line (the latest of them): they entered
    the collective they timed out in after it. None where one of them shows no timed step,
    or lost a peer instead (a peer that left: what it printed before it went was no work
    the others waited for)."""
    waiting = evidence.waiting
    if any("waiting" not in evidence.ranks[r].echoes for r in waiting):
        return None
    last: dict[int, datetime] = {}
    for stream in job.streams:
        rank = job.resolve(stream.origin)
        at = stream.last_progress_time
        if rank in waiting and at is not None and (rank not in last or at > last[rank]):
            last[rank] = at
    return max(last.values()) if waiting <= last.keys() else None


def _counted_work_until_the_reaction(
    job: JobView, evidence: JobEvidence, reactions: set[tuple[str, int]]
) -> None:
    """A writer whose last lines before the launcher's reaction (at most REACTION_GAP lines
    above it) count one piece of work up without finishing it ('rebuilding (4/10)' after
    '(3/10)', plain prints no time dates) was still at it when the launcher stopped the job
    after the others' wait: alive and busy, as a writer whose timed lines fall in the wait
    (_worked_while_others_waited). Only where ranks waited."""
    if not evidence.waiting:
        return
    by_source: dict[str, list[int]] = {}
    for source, line in reactions:
        by_source.setdefault(source, []).append(line)
    streams = [s for s in job.streams if len(s.bare) >= RECENT_MIN and s.source in by_source]
    hosts = _hosts_of_ranks(job) if streams else {}
    for stream in streams:
        counted = _counted_run(stream.bare, sorted(by_source[stream.source]))
        if counted is None:
            continue
        line, text = counted
        _busy_with(
            job, evidence, stream, hosts, Evidence(stream.source, line, None, None, None, text)
        )


REACTION_GAP = 3
"""Lines between a writer's last count of work and the launcher's reaction, at most."""
DIGITS = re.compile(r"\d+")
WORK_COUNT = re.compile(r"(?<![\d/.])(\d{1,6})/(\d{1,6})(?![\d/.])")
"""A count of work done ('4/10', '(3/8 stores done'), not a date or a path."""


def _counted_run(bare: tuple[tuple[int, str], ...], reactions: list[int]) -> tuple[int, str] | None:
    """(line, text) of the last of >= RECENT_MIN lines that end a writer's untimed lines
    before a reaction and count one piece of work up (the same words, the same total, the
    count rising, not at its total), the reaction at most REACTION_GAP lines below."""
    for reaction in reactions:
        before = [(line, raw.rsplit("\r", 1)[-1]) for line, raw in bare if line < reaction]
        if not before or reaction - before[-1][0] > REACTION_GAP + 1:
            continue
        run = _rising_count(before)
        if len(run) >= RECENT_MIN and run[0][2] < run[0][3]:
            return run[0][0], run[0][1].strip()
    return None


def _rising_count(lines: list[tuple[int, str]]) -> list[tuple[int, str, int, int, str]]:
    """The lines that end `lines` and count one piece of work up ('(3/8)...' after
    '(2/8)...': the same words, the same total, the count rising), last first, as (line,
    text, count, total, words)."""
    run: list[tuple[int, str, int, int, str]] = []
    for line, text in reversed(lines):
        counts = list(WORK_COUNT.finditer(text))
        if not counts or progress_line(text):
            break  # (a training step's count is the loop's, not work of the writer's own)
        m = counts[-1]  # the last count of the line (a bar glued in front has its own)
        done, total = int(m[1]), int(m[2])
        # (the same words: other numbers on the line may move with the count, '140/160 (7/8)')
        words = DIGITS.sub("#", text[: m.start()])[-60:] + DIGITS.sub("#", text[m.end() :])
        if run and (words != run[-1][4] or total != run[-1][3] or done >= run[-1][2]):
            break
        run.append((line, text, done, total, words))
    return run


def _counted_through_a_timeout(job: JobView, evidence: JobEvidence, events: list[Event]) -> None:
    """A writer whose lines count one piece of work up across another rank's timeout in the
    same output ('(4/8)', the timeout, '(5/8)'): it was at that work for the whole of the
    other's wait, alive and busy (a plain print carries no time to measure the wait by; the
    order of one console's lines does)."""
    timeouts: dict[str, int] = {}
    for event in events:
        if event.echo is Echo.WAITING and event.rank is not None:
            for hit in event.hits:
                at = timeouts.get(hit.record.source)
                if at is None or hit.record.line < at:
                    timeouts[hit.record.source] = hit.record.line
    if not timeouts:
        return
    hosts: dict[int, str] | None = None
    for stream in job.streams:
        at = timeouts.get(stream.source)
        if at is None or len(stream.bare) + len(stream.recent) < RECENT_MIN:
            continue
        lines = sorted(
            {(line, raw.rsplit("\r", 1)[-1]) for line, raw in stream.bare + stream.recent}
        )
        run = _rising_count(lines)
        # the count runs on after the timeout, and had begun before it: from before the wait's
        # end in this console's order, or from past its first piece (the rest of a bar glued
        # in front of its first line after the timeout hides the earlier ones)
        if len(run) < RECENT_MIN or run[0][0] < at or (run[-1][0] > at and run[-1][2] <= 1):
            continue
        hosts = _hosts_of_ranks(job) if hosts is None else hosts
        after = next(r for r in reversed(run) if r[0] > at)
        work = Evidence(stream.source, after[0], None, None, None, after[1].strip())
        _busy_with(job, evidence, stream, hosts, work)


def _counted_work_past_the_steps(job: JobView, evidence: JobEvidence) -> None:
    """Timed lines that count one piece of work up without finishing it ('Rebuilding the
    length buckets (3/8)...' after '(2/8)', 5 s apart), written after the job's last training
    step for about the collective timeout, where a wait timed out: a writer was busy with its
    own work while the wait ran out, as a bar that kept moving shows (busy_progress). Its rank
    is the writer's where known."""
    timeout_ms, last = evidence.timeout_ms, evidence.last_progress_at
    if evidence.busy_progress is not None or not evidence.timed_out or not timeout_ms:
        return
    if last is None:
        return
    for stream in job.streams:
        timed: dict[int, datetime] = {}
        lines: list[tuple[int, str]] = []
        for line, raw in stream.recent:
            parsed = parse_line(raw, stream.year)
            if parsed.time is None or parsed.time < last or parsed.text[:1].isspace():
                continue
            timed[line] = parsed.time
            lines.append((line, parsed.text))
        run = _rising_count(lines)
        if len(run) < RECENT_MIN or run[0][2] >= run[0][3]:
            continue
        elapsed = (timed[run[0][0]] - last).total_seconds()
        if elapsed < BUSY_WINDOW[0] * timeout_ms / 1000:
            continue
        rank = job.resolve(stream.origin)
        work = Evidence(stream.source, run[0][0], rank, None, timed[run[0][0]], run[0][1])
        evidence.busy_progress = (elapsed, work)
        return


def _hosts_of_ranks(job: JobView) -> dict[int, str]:
    """Where each rank's own lines were written (a launcher's summary may say localhost)."""
    return {
        rank: s.origin.host
        for s in job.streams
        if s.origin.host and (rank := job.resolve(s.origin)) is not None
    }


def _busy_with(
    job: JobView,
    evidence: JobEvidence,
    stream: StreamSummary,
    hosts: dict[int, str],
    work: Evidence,
) -> None:
    """The stream's writer was busy with `work` while the others waited: its busy phase and
    first evidence. A writer no rank is known for is the one rank of its host (where the
    ranks' own lines show theirs) that neither waited nor failed."""
    waiting = evidence.waiting
    writer = job.resolve(stream.origin)
    if writer is None:
        host = stream.origin.host
        candidates = {
            r
            for r, v in evidence.ranks.items()
            if (r not in waiting or evidence.lost_its_peer_only(r))
            and not v.failed
            and (host is None or hosts.get(r, host) == host)
        }
        if len(candidates) != 1:
            return
        writer = candidates.pop()
    view = evidence.ranks.get(writer)
    if view is None or view.failed or view.busy_phase:
        return
    if writer in waiting and not evidence.lost_its_peer_only(writer):
        return
    view.busy_phase = work.text[:80]
    view.evidence.insert(0, replace(work, rank=writer, host=stream.origin.host))


LAUNCHER_OWN = re.compile(r"torch/distributed/(?:elastic|run\.py)|torch/multiprocessing/")
"""A launcher's own log lines (torchrun's agent, mp.spawn), in the workers' console: not the
workers' work. (An indented line, a summary's field or a traceback's frame, is not either.)"""
CLOCK_TIME = re.compile(r"(?<!\d)(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?(?!\d)")
"""A time of day without a date ('[06:56:30 - darcy_fno - WARNING]', datefmt='%H:%M:%S')."""


def _clock_time(raw: str, near: datetime) -> datetime | None:
    """The time of day a record carries without a date, on the day of `near` (the day before
    where that would put it after `near`): a wait of seconds does not span days."""
    m = CLOCK_TIME.search(raw, 0, CLOCK_WITHIN)
    if m is None:
        return None
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    if hour > 23 or minute > 59 or second > 59:
        return None
    micro = int((m[4] or "0").ljust(6, "0"))
    at = near.replace(hour=hour, minute=minute, second=second, microsecond=micro)
    return at - timedelta(days=1) if at > near + timedelta(hours=12) else at


def _announced_phase(stream: StreamSummary) -> str | None:
    """The long phase a writer's last words announce, or the line before them when its last
    line is not progress (a stop signal's handler printed after 'saving a checkpoint'), or is
    the only progress it printed: the phase's own bar ('Downloading ... to data/', then the
    download's bar), not a step of a training loop it never reached."""
    if _phase_in(stream.last_text):
        return stream.last_text[:80]
    on_progress = stream.last_progress_line == stream.last_line
    if not on_progress and _slow_work_in(stream.last_text):
        return stream.last_text[:80]  # its last piece of work took seconds: at the next one
    if (
        stream.prev_text
        and (not on_progress or stream.progress_lines == 1)
        and _phase_in(stream.prev_text)
        and not _counted_to_its_end(stream.prev_text)
    ):
        return stream.prev_text[:80]
    return None


@lru_cache(maxsize=LAST_WORDS_READ)
def _phase_in(text: str) -> bool:
    """phase_of_work of a writer's last words (see LAST_WORDS_READ)."""
    return phase_of_work(text)


@lru_cache(maxsize=LAST_WORDS_READ)
def _slow_work_in(text: str) -> bool:
    """slow_unit_of_work of a writer's last words (see LAST_WORDS_READ)."""
    return slow_unit_of_work(text)


def _counted_to_its_end(text: str) -> bool:
    """A phase's line whose counters all stand at their totals ('[Eval batch=2/2] Eval on
    eval data'): the phase's last step; a line after it (its results) says it ended."""
    counters = list(ANY_COUNTER.finditer(text.rsplit("\r", 1)[-1]))
    return bool(counters) and all(m["n"] == m["total"] for m in counters)


MID_STEP_LINES = 3
"""Lines a writer may print after its last training step and still have stopped on it (a
warning, a metric line of that step)."""


def _ended_mid_step(job: JobView) -> frozenset[int | None]:
    """The writers whose output ends on a training step (or within MID_STEP_LINES of one), in
    the launcher's last attempt: they stopped in the middle of training, at no end of theirs."""
    return frozenset(
        job.resolve(s.origin)
        for s in job.streams
        if s.source not in job.earlier_attempt_sources
        and s.last_progress_line > 0
        and 0 <= s.last_line - s.last_progress_line <= MID_STEP_LINES
    )


def _unranked_phase(job: JobView, events: list[Event]) -> Evidence | None:
    """The long phase a writer no rank can be given set out on (StreamSummary.pending_phase),
    shown before the first wait in its own source (a phase announced after the others' wait
    is no work they waited for); the earliest of several, in source and line order."""
    first_wait: dict[str, int] = {}
    for event in events:
        if event.echo is not Echo.WAITING:
            continue
        for hit in event.hits:
            line = first_wait.get(hit.record.source)
            if line is None or hit.record.line < line:
                first_wait[hit.record.source] = hit.record.line
    if not first_wait:
        return None
    found = [
        Evidence(s.source, s.pending_phase[0], None, s.origin.host, None, s.pending_phase[1])
        for s in job.streams
        if s.pending_phase is not None
        and job.resolve(s.origin) is None
        and s.pending_phase[0] < first_wait.get(s.source, s.pending_phase[0] + 1)
    ]
    return min(found, key=lambda e: (e.source, e.line)) if found else None


def _stopped_short(job: JobView) -> Evidence | None:
    """A run that announced its end while every training counter of a writer no rank is known
    for (the main process's bar: StreamSummary.planned) stood at half its total or less: the
    loop ended long before the steps it counted towards (a final evaluation's bar may follow
    the end). Half, not just short: a log that prints every tenth step ends on '90/100'
    before a whole run's end. Ranked writers' last counters are left out: a rank's tag ('rank
    1/3') or another phase's count ('Generate | 1/2') stands there as often."""
    if not job.completed_at:
        return None
    counted = [s for s in job.streams if s.planned is not None]
    if not counted:
        return None
    for s in counted:
        assert s.planned is not None
        if not 0 < s.planned.done * 2 <= s.planned.total:
            return None
    last = max(counted, key=lambda s: (s.source, s.planned.line if s.planned else 0))
    assert last.planned is not None
    return Evidence(
        last.source,
        last.planned.line,
        job.resolve(last.origin),
        last.origin.host,
        None,
        last.planned.text,
    )


def _last_words(job: JobView) -> list[Evidence]:
    """Each writer's last line, in source and line order (the input's order does not count)."""
    return _each_writers(job, lambda s: (s.last_line, s.last_text) if s.last_text else None)


def _each_writers(
    job: JobView, pick: Callable[[StreamSummary], tuple[int, str] | None]
) -> list[Evidence]:
    """One line of each writer that has it (`pick` gives its number and words), in source and
    line order."""
    found = [
        Evidence(s.source, line, job.resolve(s.origin), s.origin.host, None, text)
        for s in job.streams
        if (picked := pick(s)) is not None and (line := picked[0]) > 0 and (text := picked[1])
    ]
    return sorted(found, key=lambda e: (e.source, e.line, e.text))


def _add_event(evidence: JobEvidence, event: Event) -> None:
    rank = event.rank
    if rank is None:
        if event.echo is not None:
            evidence.unranked_echoes.add(str(event.echo))
        evidence.unranked_stop |= event.marker == Marker.STOP
        if event.echo is Echo.WAITING:  # a coordinator speaking for the job names the absent
            evidence.unranked_wait_kinds.add(event.rule.kind)
            evidence.unranked_wait_rules.add(event.rule.code)
            _mark_named_absent(evidence, event)
        return
    view = evidence.ranks.setdefault(rank, RankView(rank=rank, present=True))
    if event.echo is Echo.WAITING and rank in _absent_named_by(event):
        # a coordinator's report (Horovod's rank 0) naming its own writer among the ranks
        # that never came: it speaks for the job, it is not a rank left waiting
        evidence.unranked_wait_kinds.add(event.rule.kind)
        evidence.unranked_wait_rules.add(event.rule.code)
        _mark_named_absent(evidence, event)
        view.evidence.extend(Evidence.of(h.record) for h in event.hits[:2])
        return
    if event.echo in (Echo.WAITING, Echo.LOST_PEER) and any(
        handler_start(h) is not None for h in event.hits
    ):
        # a stop signal found it elsewhere (alive, not in a collective) and the handler's own
        # collective failed: the rank was busy or stuck where the handler interrupted it
        view.interrupted = True
        view.interrupted_at = next((w.site for h in event.hits if (w := wait_site(h)).site), None)
        view.activity = next(
            (_interrupted_activity(*at) for h in event.hits if (at := interrupted_line(h))), None
        )
        view.evidence.extend(Evidence.of(h.record) for h in event.hits[:1])
        return
    if event.echo is not None:
        view.echoes.add(str(event.echo))
        view.waited_on_live_peers |= event.echo is Echo.WAITING and event.rule.peers_alive
        if event.echo is Echo.WAITING:
            view.wait_kinds.add(event.rule.kind)
    elif event.primary and aborted_at_exit(event):
        view.aborted_at_exit = True
    elif event.primary:
        view.failed = True
        if (sizes := _size_abort(event)) is not None:
            evidence.size_aborts.setdefault(rank, sizes)
    elif event.rule.severity == "warning" and event.marker is None:
        view.warned = True
    if event.marker == Marker.STOP:
        view.announced_stop = True
        view.present = True  # its own words (told by elimination: the one rank without any)
    if event.echo in (Echo.WAITING, Echo.LOST_PEER):
        for hit in event.hits:  # where it was when the peer never came or went away
            view.wait_sites.append(wait_site(hit))
        _mark_named_absent(evidence, event)

    view.evidence.extend(Evidence.of(h.record) for h in event.hits[:2])


def _size_abort(event: Event) -> tuple[int, int] | None:
    """(bytes sent, bytes expected) of a size check that aborted a collective."""
    for hit in event.hits:
        sent = _digits(hit.captures.get("sent_bytes"), 15)
        expected = _digits(hit.captures.get("expected_bytes"), 15)
        if sent is not None and expected is not None:
            return sent, expected
    return None


def _absent_named_by(event: Event) -> set[int]:
    return {r for hit in event.hits for r in _named_absent(hit.captures)}


def _mark_named_absent(evidence: JobEvidence, event: Event) -> None:
    for absent in _absent_named_by(event):
        evidence.ranks.setdefault(absent, RankView(rank=absent)).named_absent = True


def _named_absent(captures: dict[str, str]) -> set[int]:
    """The ranks a waiting message names as never having arrived: those it lists as missing,
    or, when it lists the ranks that did arrive, the ones below the highest of them that it
    leaves out (ranks above it cannot be told from a smaller world)."""
    absent = {
        r
        for n in re.findall(r"\d+", captures.get("missing", ""))[:64]
        if (r := _digits(n, 7)) is not None
    }
    ready = {
        r
        for n in re.findall(r"\d+", captures.get("ready", ""))[:64]
        if (r := _digits(n, 7)) is not None
    }
    if ready:
        absent |= set(range(max(ready))) - ready
    rank, world = _digits(captures.get("rank", ""), 7), _digits(captures.get("world", ""), 7)
    if captures.get("joined") == "1" and rank is not None and world is not None and rank < world:
        absent |= set(range(min(world, 1 << 16))) - {rank}  # it alone had arrived
    return absent


PEER_ADDRESS = re.compile(r"\[(\d{1,3}(?:\.\d{1,3}){3}|localhost|::1|[\w.-]{1,253})\]:\d{1,5}")
"""The peer a transport names when its connection was lost (gloo's 'Connection closed by peer
[127.0.0.1]:15242', 'Read error [10.0.0.5]:4242')."""
LOOPBACK = re.compile(r"127(?:\.\d{1,3}){3}|localhost|::1")


def _stopped_alive(job: JobView, events: list[Event], ranks: dict[int, RankView]) -> None:
    """A rank that left no line, which the launcher stopped alive after the one rank seen
    failed (job.stopped_unseen): it was outside the collective its peer waited in. Not where
    an end or a stop was announced by no known rank: that one may have left on its own."""
    unranked_end = any(e.rank is None and e.marker is not None for e in events)
    if unranked_end:
        return
    for rank in job.stopped_unseen:
        view = ranks.get(rank)
        if view is not None and not view.present and view.exit_signal is None:
            view.exit_signal = "SIGTERM"


def left_early(job: JobView, events: list[Event]) -> set[int]:
    """Ranks that announced the end of training while another rank, which never announced
    it, was still in a training step: that rank lost its peer or timed out inside the backward
    pass (or DDP's forward, whose buffer broadcast also joins every rank each step). Every
    rank's step joins every other's, so a rank that really finished all its steps cannot leave
    a peer waiting in one: the announcers did not finish the job, they left it (an early stop
    or a `break` taken on one rank). A wait shown before the announcement (same output, or
    earlier by the clock) does not count; nor does a wait outside a training step (a barrier,
    a save, an evaluation after the end), where ranks also wait after a real end. An
    announcement no rank can be tied to, in a console the ranks share, was made by a rank
    that did not wait after it: when every rank of the world but one waited, that one."""
    done: dict[int, Record] = {}
    unranked: list[Record] = []
    for rank, record in job.completions:
        if rank is None:
            unranked.append(record)
        elif rank not in done or record.line < done[rank].line:
            done[rank] = record
    if not done and not unranked:
        return set()
    early: set[int] = set()
    waited_after_unranked: set[int] = set()
    for event in events:
        if event.rank is None or event.rank in done:
            continue
        if event.echo not in (Echo.WAITING, Echo.LOST_PEER):
            continue
        for hit in event.hits:
            if not (in_backward(hit) or in_ddp_forward(hit)):
                continue
            early |= {r for r, end in done.items() if _later(hit.record, end)}
            # as for a rank's own announcement: not shown before it (per-writer files without
            # times have no common order)
            if any(_later(hit.record, end) for end in unranked):
                waited_after_unranked.add(event.rank)
    world = job.info.world_size
    if waited_after_unranked and not done and world and world <= MAX_WORLD_FOR_ANNOUNCER:
        rest = set(range(world)) - waited_after_unranked
        if len(rest) == 1:
            early |= rest
    return early


MAX_WORLD_FOR_ANNOUNCER = 64
"""The world's ranks are counted one by one to find the one that did not wait."""


def _later(record: Record, end: Record) -> bool:
    """Not shown before `end` (files without times have no common order)."""
    if record.source == end.source:
        return record.line > end.line
    return record.time is None or end.time is None or record.time > end.time


def _waited_after_end(event: Event, completed_at: dict[str, int]) -> bool:
    """A timeout or lost peer inside a collective the rank's own code called (its traceback
    names both), in a job whose training announced its end, and not printed before that
    announcement in a source that has both (per-rank files leave them unordered: the end
    was announced, the wait came at some point)."""
    if not completed_at or event.echo not in (Echo.WAITING, Echo.LOST_PEER) or not event.hits:
        return False
    before = any(
        h.record.source in completed_at and h.record.line < completed_at[h.record.source]
        for h in event.hits
    )
    return not before and any((site := wait_site(h)).op and site.site for h in event.hits)


def _timeout_ms(events: list[Event]) -> float | None:
    for event in events:
        for hit in event.hits:
            ms = _digits(hit.captures.get("timeout_ms"))
            if ms is not None:
                return float(ms)
    return None


def _startup_seq(events: list[Event]) -> int | None:
    """SeqNum of a timeout in a barrier-like collective (1 element, or BARRIER) among the
    job's first few collectives: ranks waited for a rank still starting up."""
    for event in events:
        if event.echo != Echo.WAITING:
            continue
        for hit in event.hits:
            seq = _digits(hit.captures.get("seq"))
            barrier_like = hit.captures.get("numel") == "1" or hit.captures.get("op") == "BARRIER"
            if seq is not None and seq <= STARTUP_SEQ and barrier_like:
                return seq
    return None


def _busy_progress(job: JobView, timeout_ms: float | None) -> tuple[float, Evidence] | None:
    """A progress bar that kept moving for about the collective timeout proves a busy rank."""
    best: tuple[float, FactHit] | None = None
    for fact in job.progress:
        elapsed = elapsed_seconds(fact.captures.get("elapsed", ""))
        if elapsed is None:
            continue
        if best is None or elapsed > best[0]:
            best = (elapsed, fact)
    if best is None:
        return None
    elapsed, fact = best
    if timeout_ms is None:
        busy = elapsed >= BUSY_PROGRESS_MIN_S
    else:
        # a bar that ran much longer than the timeout is training, not one rank; one of the
        # rank's own work that was still moving at its last redraw may have started before
        # the others began to wait (each rank's evaluation, the slow one's still going)
        upper = BUSY_WINDOW[1] if not _kept_moving(fact, job.train_steps) else MOVING_WINDOW
        busy = BUSY_WINDOW[0] * timeout_ms / 1000 <= elapsed <= upper * timeout_ms / 1000
        # a short timeout's bar: a training loop's bar that stopped when its rank began to wait
        # shows about the timeout too ('train: 13%| 4/30 [00:15<01:43'); only work of the
        # rank's own that moved ('class weights: 62%| 31/50 [00:15<00:09') proves it busy
        busy = busy and (elapsed >= BUSY_PROGRESS_MIN_S or _own_work_bar(fact, job.train_steps))
    if busy and _stood_still(fact, timeout_ms):
        return None
    return (elapsed, Evidence.of(fact.record, fact.record.text[-160:])) if busy else None


STEADY_FACTOR = 2.0
"""A last count that took at most this many times the bar's average count before it kept the
bar's pace: the rank was working, not waiting."""
MOVING_WINDOW = 3.0
"""How long, in collective timeouts, a bar of a rank's own work that was still moving at its
last redraw may have run: it began with that rank's phase, before the others' wait."""


def _kept_moving(fact: FactHit, train_steps: set[int]) -> bool:
    """The bar counted on between its last two redraws, at no more than a few seconds a count
    (work under way, not a bar redrawn once more as its process closed it), and counts work of
    the rank's own."""
    redraws = _last_redraws(fact)
    if redraws is None:
        return False
    n, before_n, elapsed, before = redraws
    if n <= before_n:
        return False
    return (elapsed - before) / (n - before_n) <= MAX_SECONDS_A_COUNT and _own_work_bar(
        fact, train_steps
    )


def _last_redraws(fact: FactHit) -> tuple[int, int, float, float] | None:
    """(count, count before, elapsed s, elapsed s before) of a bar's last two redraws."""
    captures = fact.captures
    n, before_n = count_number(captures.get("n")), count_number(captures.get("before_n"))
    elapsed = elapsed_seconds(captures.get("elapsed", ""))
    before = elapsed_seconds(captures.get("before_elapsed", ""))
    if n is None or before_n is None or elapsed is None or before is None:
        return None
    return n, before_n, elapsed, before


MAX_SECONDS_A_COUNT = 10.0
"""A bar that counts slower than this between its last redraws was closed, not working."""


def _stood_still(fact: FactHit, timeout_ms: float | None) -> bool:
    """The bar's last redraw moved at most one count past the redraw before it while its time
    grew by about the collective timeout (or the floor without one): the bar stood still, and
    tqdm drew it once more as its process closed it after the wait ('16/48 [00:01' then
    '17/48 [00:16'). Its time is the rank's wait, not work."""
    redraws = _last_redraws(fact)
    if redraws is None:
        return False
    n, before_n, elapsed, before = redraws
    gap = BUSY_WINDOW[0] * timeout_ms / 1000 if timeout_ms else BUSY_PROGRESS_MIN_S
    last_count = elapsed - before
    # ... unless every count before took about as long: a slow rank's steady pace (an
    # evaluation at 8 s a batch), not a fast bar that stopped for the wait
    steady = before_n > 0 and last_count <= STEADY_FACTOR * before / before_n
    return n - before_n <= 1 and last_count >= gap and not steady


TRAINING_BAR = re.compile(r"(?i)train|epoch|\bep ?\d|\biter|\bstep")
"""Words of a training loop's own bar ('train:', 'Epoch 1:', 'r0 ep1:', 'Steps')."""


def _own_work_bar(fact: FactHit, train_steps: set[int]) -> bool:
    """A bar that moved (its count above 0) and whose line names no training loop, nor counts
    to the optimisation steps the run announced (the Trainer's bar has no label): work of the
    rank's own (preprocessing, weights, an index), not the loop the others waited in."""
    moved = (count_number(fact.captures.get("n")) or 0) > 0
    loop = count_number(fact.captures.get("total")) in train_steps
    return moved and not loop and TRAINING_BAR.search(fact.record.text) is None


def _stall(job: JobView) -> Stall | None:
    """The last stall `ddpdoctor run` caught, with where each rank was."""
    if not job.hangs:
        return None
    hang = job.hangs[-1]
    activities = {
        rank: Activity(
            category=str(a.get("category", "unknown")),
            op=str(a.get("op", "")),
            site=str(a.get("site", "")),
            source=str(a.get("source", "")),
        )
        for rank, a in hang.activities.items()
    }
    source, _, line = hang.source.rpartition(":")
    time = None
    if hang.time:
        try:
            time = datetime.fromisoformat(hang.time)
        except ValueError:
            time = None
    groups = [(_who(g.get("who")), str(g.get("where", ""))) for g in hang.groups[:8]]
    return Stall(
        activities=activities,
        time=time,
        source=source,
        line=int(line) if line.isdigit() else 0,
        summary=hang.summary,
        groups=groups,
        killed=job.killed_for_hang,
        stopped=job.stopped,
    )


def _who(who: object) -> str:
    return ", ".join(map(str, who)) if isinstance(who, list) else str(who)


def _peer_of_a_lone_rank(evidence: JobEvidence) -> None:
    """Rank 0, the only rank the logs show, lost its connection to a peer on one node, and
    the launcher's failure summary (which lists every worker that did not exit 0) names it
    alone: the world held another process at least, which printed nothing (only rank 0 logs)
    and had exited 0. Where nothing says how many, it is rank 1 of a world of two. (Not after
    training's end was announced: the others then ended with it.)"""
    if evidence.world_size and evidence.world_size >= 2:
        return
    if set(evidence.ranks) != {0} or not evidence.single_node:
        return
    if "lost-peer" not in evidence.ranks[0].echoes or not evidence.lost_peers_on_loopback:
        return
    evidence.world_size = 2
    evidence.ranks[1] = RankView(rank=1, present=False)


def _listed_by_summary(job: JobView, evidence: JobEvidence) -> set[int] | None:
    """The ranks torchrun's failure summary lists in a one-node world of known size, where it
    lists any (every worker that did not exit 0: a rank left out exited 0); None where the
    summary says nothing of the others (none, several nodes, a function's summary that lists
    the first failure only)."""
    if not (job.launcher_summaries and evidence.single_node and evidence.world_size):
        return None
    if job.function_workers:
        return None
    return set(job.info.per_rank) or None


def _spawn_reported_a_victim(job: JobView, evidence: JobEvidence) -> set[int] | None:
    """The one process mp.spawn reported, where its error only says it lost its peers or timed
    out waiting for them: spawn raises for the first process that ended with an error and
    passes over those that exited 0, so a rank that vanished before it (the one it lost) and
    was not reported had exited 0; a kill or a crash of it would have been reported first.
    None where spawn reported no process, several, or one that failed on its own."""
    if len(job.spawn_reported) != 1 or job.launcher_summaries:
        return None
    (reported,) = job.spawn_reported
    view = evidence.ranks.get(reported)
    if view is None or view.failed or not view.waiting:
        return None
    return {reported}


def _unlisted_exits(job: JobView, evidence: JobEvidence) -> set[int]:
    """Ranks of a one-node world with no line of their own that torchrun's failure summary
    leaves out while listing others: every worker that did not exit 0 is listed there (the
    ones it stopped too, with SIGTERM), so these had already exited 0. Not where the launcher
    said it stopped as many workers as are left out (mp.spawn's 'Terminating process' inside
    the agent, whose summary lists only the first failure): those were alive."""
    listed = _listed_by_summary(job, evidence)
    if listed is None:
        return set()
    world = evidence.world_size or 0
    gone = {r for r in evidence.missing if r not in listed and r < world}
    unlisted_stops = job.stopped_pids - {e.pid for e in job.info.per_rank.values()}
    return gone if len(gone) > len(unlisted_stops) else set()


def _unlisted_speakers(job: JobView, evidence: JobEvidence) -> set[int]:
    """Ranks with lines of their own that torchrun's failure summary leaves out while listing
    others (within the world it summarises), or that mp.spawn passed over for a rank that only
    lost them (_spawn_reported_a_victim), and whose lines show no end of theirs (no error, no
    wait, no lost peer, no stop from outside): they exited 0, on their own; they were not
    killed."""
    listed = _listed_by_summary(job, evidence)
    world = evidence.world_size
    if listed is None:
        listed, world = _spawn_reported_a_victim(job, evidence), None
    if listed is None:
        return set()
    return {
        r
        for r, view in evidence.ranks.items()
        if r not in listed
        and (world is None or r < world)
        and view.present
        and not view.failed
        and not view.waiting
        and not view.terminated
        and not view.echoes & {"lost-peer", "waiting", "stopped"}
    }


def _ended_after_full_bar(job: JobView) -> bool:
    """The bar redrawn last in the whole log is at its total and is not a loading step's
    (checkpoint shards, a download, a dataset map), and no writer's counter stopped short of
    its total: what followed the bar (an evaluation's results, a save) came after the run's
    work (the caller checks that no writer logged an error)."""
    progressed = [s for s in job.streams if s.last_progress_line > 0]
    if not progressed:
        return False
    latest = max(progressed, key=lambda s: s.last_progress_line)
    label = latest.last_progress_text.split("%|", 1)[0]
    if STORING_BAR.search(label):
        # a save's bar at its total after the writer's own step counter had reached its
        # total (nanotron's 'Saving weights: 100%' after 'iteration: 20 / 20'): the loop
        # ran to its end, then the run stored its work
        planned = latest.planned
        return (
            _full_bar(latest.last_progress_text)
            and planned is not None
            and planned.total >= 2
            and planned.done == planned.total
            and _last_step(job) is None
        )
    return (
        (_full_bar(latest.last_progress_text) or _step_counter_at_total(latest, job))
        and not LOADING_BAR.search(label)
        and _last_step(job) is None
    )


PLANNED_STEP = re.compile(
    r"(?i)\b(?:global[ _]?step|step|iter(?:ation)?|update)s?\b\s{0,3}[:=#]?\s{0,3}"
    r"(?P<n>\d{1,9})\b(?!\s{0,2}/)"
)
"""A step line's own number, not a counter's 'n/total' ('Global Step: 48', 'step 48 |')."""


def _ended_on_planned_step(job: JobView) -> bool:
    """The run's configuration gave its number of steps (arcface_torch's 'total_step 48'),
    and every writer that printed progress ended on a step line at that number ('... Epoch:
    1   Global Step: 48'), or on the validation of the last configured epoch (mmcv's
    'Epoch(val) [3][11]' of 'max: 3 epochs'): the loop ran to its last step (the caller
    checks that no writer logged an error; a job that hung after that line would read the
    same). Where the logs hold several totals (a resumed run's log appended to its first
    attempt's), the largest: a last step short of any planned total is no end."""
    progressed = [s for s in job.streams if s.last_progress_line > 0]
    if not progressed:
        return False
    if job.max_epochs and all(
        _validated_epoch(s.last_text) == max(job.max_epochs) for s in progressed
    ):
        return True  # every writer's last line validates the last configured epoch
    if not job.train_steps:
        return False
    planned = max(job.train_steps)
    for stream in progressed:
        if stream.last_line != stream.last_progress_line:
            return False
        m = PLANNED_STEP.search(stream.last_text)
        if m is None or int(m["n"]) != planned:
            return False
    return True


VALIDATED_EPOCH = re.compile(r"\bEpoch\(val\) \[(?P<n>\d{1,6})\]")
"""mmcv's and MMEngine's record of an epoch's validation: 'Epoch(val) [3][11]	bbox_mAP: ...'."""


def _validated_epoch(text: str) -> int | None:
    m = VALIDATED_EPOCH.search(text)
    return int(m["n"]) if m else None


def _step_counter_at_total(stream: StreamSummary, job: JobView) -> bool:
    """The writer's last progress line counts its steps up to their total ('Step 60/ 60;',
    'iter 500/500'), as a bar at 100% does, and counts no epoch: its loop ran to its end.
    Not where the writer's epochs are known and its last one is not the run's last."""
    text = stream.last_progress_text
    counter = PROGRESS_COUNTER.search(text)
    if counter is None:
        return _step_at_counted_total(stream, text)
    if EPOCH_WORD.search(text) or OTHER_PHASE_BAR.search(text[: counter.start()]):
        return False
    n, total = _digits(counter["n"]), _digits(counter["total"])
    if n is None or total is None or total < 2 or n != total:
        return False
    if stream.progress_done != n or stream.progress_total != total:
        return False  # the writer's own counter (scanner) reads another one on that line
    epoch = stream.last_epoch
    return epoch is None or last_epoch_done(epoch, job.max_epochs, stream.first_epoch)


STEP_NUMBER = re.compile(
    r"(?i)^(?:iter(?:ation)?|step|update)\s{0,3}[:=]?\s{0,3}(?P<n>\d{1,9})\b"
    r"|\b(?:after|at|in) (?P<count>\d{1,9}) (?:steps|iterations|iters|updates)\b"
)
"""A progress line that starts with its step's number ('iter 60: loss 2.3053', 'step 60 |'), or
that says how many steps were done ('eval loss 1.20 after 120 steps')."""


def _step_at_counted_total(stream: StreamSummary, text: str) -> bool:
    """The writer's counter reached its total on an earlier line ('step:60/60 val_loss:...')
    and its last progress line, after it, names that step ('iter 60: loss ...': nanoGPT's
    evaluation line, then the last step's own): its loop ran to its end."""
    total, done = stream.progress_total, stream.progress_done
    if total is None or done != total or total < 2 or EPOCH_WORD.search(text):
        return False
    m = STEP_NUMBER.search(text)
    return m is not None and _digits(m["n"] or m["count"]) == total


LOADING_BAR = re.compile(r"(?i)load|download|map|writ|sav|shard|fetch")
"""A bar label of a step that prepares or stores, not the run's own work."""
STORING_BAR = re.compile(r"(?i)\b(?:sav|writ)")
"""... of one that stores it (a checkpoint's save)."""


FULL_BAR = re.compile(r"(?<!\d)100%\|")
EPOCH_WORD = re.compile(r"(?i)\bepoch")


STARTUP_BAR = re.compile(
    r"(?i)load|download|\bmap\b|tokeni[sz]|shards?\b|preprocess|extract|cach|prepar|convert|filter"
)
"""A bar's label that names work before the training loop: 'Loading checkpoint shards',
'Downloading', 'Map (num_proc=8)', 'Running tokenizer on dataset'. At its total it ends
start-up, not the run. (Not scanner.OTHER_PHASE_BAR: an evaluation's bar at its total, which
that one names too, may be how an evaluation-only run ends.)"""


def _full_bar(text: str) -> bool:
    """A progress bar at its total that counts no epoch and names no start-up work: the run's
    own loop finished."""
    full = list(FULL_BAR.finditer(text))
    if not full or EPOCH_WORD.search(text):
        return False
    label = text[max(0, full[-1].start() - 60) : full[-1].start()].rsplit("\r", 1)[-1]
    return not STARTUP_BAR.search(label)


TQDM_COUNTER = re.compile(r"\d{1,3}%\|[^|\r\n]{0,200}\|\s*(?P<n>\d+)/(?P<total>\d+) \[")
"""tqdm's bar counter: '62%|██▌   | 5/8 [00:03<00:01'."""


def _source_counters(job: JobView) -> dict[str, tuple[int, int]]:
    """Each source's last training-bar counter, where one unranked writer drew it."""
    found: dict[str, tuple[int, int] | None] = {}
    for stream in job.streams:
        if not stream.last_progress_text or job.resolve(stream.origin) is not None:
            continue
        counter = _last_counter(stream.last_progress_text)
        if counter is not None:
            # two unranked writers drawing bars in one source: no telling whose is whose
            found[stream.source] = None if stream.source in found else counter
    return {source: c for source, c in found.items() if c is not None}


def _last_counter(text: str) -> tuple[int, int] | None:
    """The last redraw's (done, total), unless its label names another phase."""
    matches = list(TQDM_COUNTER.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    label = text[max(0, last.start() - 40) : last.start()].rsplit("\r", 1)[-1]
    n, total = _digits(last["n"]), _digits(last["total"])
    if n is None or total is None or total < 2 or OTHER_PHASE_BAR.search(label):
        return None
    return n, total


def _last_step(job: JobView) -> tuple[int, int] | None:
    """The furthest counter any writer reached, when no writer reached its total."""
    steps = [
        (s.progress_done, s.progress_total)
        for s in job.streams
        if s.progress_done is not None and s.progress_total is not None
    ]
    if not steps:
        return None
    done, total = max(steps)
    if any(d >= t for d, t in steps):
        return None
    return done, total


def _stalled_at_startup(job: JobView) -> bool:
    streams = [s for s in job.streams if s.lines_seen]
    if not streams:
        return False
    if any(EXCEPTION_LINE.match(s.last_text) for s in streams):
        return False  # a writer ended on an error (init_process_group() named in its message)
    last = max(s.last_line for s in streams)
    init = max(s.last_init_line for s in streams)  # a cut last line may belong to no writer
    # no training step since the (last) start-up, and the output ends right after it: in
    # lines with text where it ends in the source of the start-up (blank lines between, in a
    # double-spaced paste, are not the job's)
    progressed = any(s.last_progress_line > init for s in streams)
    ending = {s.source for s in streams if s.last_line == last}
    near = last - init <= 3 or any(
        s.last_init_line == init and s.source in ending and s.lines_after_init <= 3 for s in streams
    )
    return init > 0 and not progressed and near


def _with_clean_loop_ends(job: JobView, events: list[Event]) -> JobView:
    """The job with the ends of the training loop that the framework prints on the way out of
    an exception too (detectron2's "Total training time", YOLOX's "Training of experiment is
    done", from a `finally:`) taken as ends of training, for the writers that did not fail:
    with a writer's own error or timeout such a line is its way out, shown above the
    traceback when the exception goes on through the `finally:` and is printed by a caller."""
    clean = [
        (rank, end)
        for rank, end in job.loop_ends
        if not any(_writer_failed(event, rank, end) for event in events)
    ]
    if not clean:
        return job
    completed_at = dict(job.completed_at)
    for _, end in clean:
        completed_at[end.source] = min(completed_at.get(end.source, end.line), end.line)
    return replace(
        job,
        completions=[*job.completions, *clean],
        completed_ranks=job.completed_ranks | {r for r, _ in clean if r is not None},
        completed_at=completed_at,
        loop_ends=[],
    )


def _epochs_left(job: JobView, gone: set[int]) -> int | None:
    """The fewest whole epochs still planned after the one each writer stood in at its last
    epoch line (counted from 0 where its first one named epoch 0), of the writers that did not
    exit unlisted: how far from the run's end the ranks still running were."""
    left = [
        after
        for s in job.streams
        if s.last_epoch is not None
        and job.resolve(s.origin) not in gone
        and (after := epochs_after(s.last_epoch, job.max_epochs, s.first_epoch)) is not None
    ]
    return min(left) if left else None


def _early_in_first_epoch(job: JobView, gone: set[int]) -> bool:
    """Whether the writers still running (not in `gone`) that carried a fractional epoch all
    last stood less than FIRST_EPOCH_SHARE through the run's first epoch."""
    shares = [
        s.epoch_share
        for s in job.streams
        if s.epoch_share is not None and job.resolve(s.origin) not in gone
    ]
    return bool(shares) and max(shares) < FIRST_EPOCH_SHARE


FIRST_EPOCH_SHARE = 0.5
"""How far through the first epoch the ranks still running must have got for a peer that
left before them to have merely run out of batches: one with fewer batches stays in step
with the others and leaves when its data ends, so they then stand where its data ended (over
several epochs, further on still); less than halfway through the first epoch, it would have
had less than half their data."""


def _writer_failed(event: Event, rank: int | None, end: Record) -> bool:
    """The event is an error or a wait of the writer of `end`, in the same output. A traceback
    Python printed and carried on from (an unraisable exception in a __del__, logging's own
    error) raised nothing: it cannot be what ended the loop."""
    if not (event.primary or event.echo in (Echo.WAITING, Echo.LOST_PEER)):
        return False
    if event.hits and all(h.handled for h in event.hits):
        return False
    if rank is not None and event.rank is not None and event.rank != rank:
        return False
    return any(h.record.source == end.source for h in event.hits)


def _one_device_per_process(job: JobView) -> bool:
    """Several processes of one host, each naming device 0 in its NCCL prefix ("host:pid:tid
    [0]"): every one sees only its own GPU."""
    devices: dict[str, dict[int, set[int]]] = {}
    for stream in job.streams:
        o = stream.origin
        if o.host and o.pid and o.local_rank is not None:
            devices.setdefault(o.host, {}).setdefault(o.pid, set()).add(o.local_rank)
    return any(
        len(by_pid) >= 2 and all(devs == {0} for devs in by_pid.values())
        for by_pid in devices.values()
    )
