"""INF201: one rank was busy outside the collectives while the others timed out waiting for it.
Evidence: a progress bar that kept moving for about the timeout, a rank the launcher had to
terminate (alive, printing nothing wrong), last words that announce a long phase, a timed-out
barrier at start-up that some ranks never joined."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence, WaitSite
from ddpdoctor.model.findings import Evidence
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import MAIN_PROCESS, Assessment, ranks_text
from ddpdoctor.rules.hypotheses.stalled_rank import (
    blocked_ranks,
    from_silent_rank,
    kept_writing,
    lock_waiting_ranks,
    not_main_and_silent,
    prompted_ranks,
)
from ddpdoctor.rules.launch import STORE_ERROR

RULE = Rule(
    code="INF201",
    kind="slow-rank-timeout",
    title="One rank was busy outside collectives while the others timed out waiting",
    signatures=(),
    explanation=Explanation(
        what="Some ranks timed out in a collective while another rank was visibly busy (a "
        "progress bar, preprocessing) and never joined it.",
        why="Work done on one rank only (dataset tokenisation under main_process_first, "
        "checkpoint consolidation, evaluation on rank 0) took longer than the process group "
        "timeout.",
        fix="Do the work before init_process_group or on every rank, cache it, or raise the "
        "timeout for that phase.",
        false_positives="If the busy rank was itself stuck, the cause is what it was stuck in.",
    ),
    fix=(
        "Preprocess once before the distributed job (or cache the tokenised dataset) so ranks "
        "do not wait for rank 0.",
        "Or raise the timeout: init_process_group(..., timeout=datetime.timedelta(hours=2)) "
        "(HF: --ddp_timeout 7200).",
    ),
)


def assess(job: JobEvidence) -> Assessment | None:
    """The strongest sign of a busy rank, if any rank waited for it."""
    waiting, quiet, missing = job.waiting, job.quiet, job.missing
    if not (waiting or job.timed_out):
        return None
    found: list[Assessment] = []
    unranked = _from_unranked_phase(job)
    # (where no rank is known at all, the busy writer is none of the waiting ones either)
    if job.busy_progress is not None and (quiet or missing or not job.ranks):
        elapsed, line = job.busy_progress
        guessed = False
        if line.rank is not None and line.rank not in waiting:
            culprit = {line.rank}  # the bar's own writer (not a timeout glued to its line)
        elif len(quiet) == 1:
            culprit = set(quiet)
        elif len(missing) == 1 and not quiet:
            culprit = set(missing)
        else:
            # lines no rank is named on are most often the main process's, the one that logs
            # (and the one that does work alone: saving, copying, evaluating)
            culprit = {MAIN_PROCESS} & (quiet | missing) - waiting
            guessed = bool(culprit)
        timeout = (
            f", about the collective timeout of {job.timeout_ms / 1000:g} s"
            if job.timeout_ms
            else ""
        )
        found.append(
            Assessment(
                RULE,
                0.65 if guessed else 0.7,
                sorted(culprit),
                [
                    f"a rank was busy: its own progress went on for {elapsed:g} s{timeout}, "
                    "while the other ranks waited."
                ],
                against=[
                    "no line names the busy writer's rank: the main process, which "
                    "logs, is the likeliest"
                ]
                if guessed
                else [],
                evidence=[line],
            )
        )
    # (a rank that left no line at all, which the launcher stopped alive, counts as one too)
    terminated = {r for r in quiet | missing if job.ranks[r].terminated}
    # the others' timeouts show the silent ranks were running (their transport would have
    # reported a peer that exited as a closed connection)
    running = (quiet - terminated) if job.peers_proven_alive else set()
    busy = terminated | running
    busy |= {r for r, v in job.ranks.items() if v.interrupted and not v.failed and r not in waiting}
    # a rank busy with work of its own that found its peers gone only when it came back to
    # the collective (its 'Connection closed', no timeout of its own)
    busy |= {
        r
        for r, v in job.ranks.items()
        if v.busy_phase and not v.failed and job.lost_its_peer_only(r)
    }
    # waiting on a lock, an answer or the extensions' build lock: INF211
    busy -= blocked_ranks(job) | prompted_ranks(job) | lock_waiting_ranks(job)
    if (
        waiting
        and not any("waiting" in job.ranks[r].echoes for r in waiting)
        and set(job.failing_exits) - busy
    ):
        # the others only lost a peer (a closed connection: a process that exited, not one
        # they timed out on) and a rank ended with an error of its own: that is the peer they
        # lost, not a silent rank the launcher stopped afterwards
        busy -= terminated
    named = {r for r, v in job.ranks.items() if v.named_absent}
    if busy and waiting:
        # of several terminated ranks, the ones that announced a long task of their own ("re-
        # tokenizing the shard") were busy; the others were stopped while waiting with the rest
        phased = {r for r in busy if job.ranks[r].busy_phase}
        # the main process waited for the others (a server, a coordinator): of several live
        # ranks, the ones the others trained on after had fallen behind, and the collective
        # waited for them. (Where another rank waited, a quiet main process may be ahead, in
        # a collective of its own, and the order of lines in a console says nothing of it.)
        behind = busy & set(job.trained_on_after) if MAIN_PROCESS in waiting else set()
        behind = behind if behind < busy and not (busy & named) and not phased else set()
        culprit = (busy & named) or phased or behind or busy
        # the launcher's termination shows a rank alive outside the collective; a
        # transport's silence only that it was alive (busy, stuck, or in another
        # collective whose own evidence then weighs more)
        score = 0.7 if busy & named else 0.6 if culprit - running else 0.55 if behind else 0.4
        # a line of no rank that counts the parts of its work speaks for the silent rank
        told = (
            unranked is not None
            and job.unranked_phase_counted
            and bool(set(unranked.culprits) & culprit)
        )
        if not (busy & named) and not phased and not told and not_main_and_silent(job, culprit):
            found.append(
                from_silent_rank(
                    job,
                    culprit,
                    waiting,
                    score,
                    not culprit - running,
                    set().union(*(job.trained_on_after[r] for r in behind)) - culprit,
                )
            )
            return max(found, key=lambda a: a.score)
        found.append(
            Assessment(
                RULE,
                score,
                sorted(culprit),
                [
                    "".join(
                        f"rank {r} was outside any collective when the stop signal came: its "
                        f"traceback shows the signal handler on top of {job.ranks[r].interrupted_at}. "
                        for r in sorted(culprit)
                        if job.ranks[r].interrupted and job.ranks[r].interrupted_at
                    )
                    + f"{ranks_text(culprit)} printed no error and "
                    + ("was" if len(culprit) == 1 else "were")
                    + (
                        " still running (the launcher had to terminate "
                        + ("it" if len(culprit) == 1 else "them")
                        + ")"
                        if culprit - running
                        else " still running (the transport would have reported "
                        + ("it" if len(culprit) == 1 else "them")
                        + " leaving as a closed connection; nobody did)"
                    )
                    + f" while {ranks_text(waiting)} timed out waiting for "
                    + ("it" if len(culprit) == 1 else "them")
                    + (
                        ", and the monitored barrier names "
                        + ("it as the rank" if len(culprit) == 1 else "them as the ranks")
                        + " that never arrived."
                        if busy & named
                        else "."
                    )
                    + (
                        f' Its last words while they waited were work of its own: "'
                        f'{job.ranks[min(phased)].busy_phase}".'
                        if len(phased) == 1
                        else "".join(
                            f" Rank {r}'s output went on after they had given up on it (it "
                            f'was working, not blocked): "{job.ranks[r].last_text.strip()[:120]}".'
                            for r in sorted(culprit)
                            if kept_writing(job, r)
                        )
                    )
                ],
                evidence=[e for r in sorted(culprit) for e in job.ranks[r].evidence[:1]],
                # nothing says what it was doing: busy, or blocked (a lock, I/O, a queue),
                # where no timeout helps
                fix=[]
                if any(job.ranks[r].busy_phase for r in culprit)
                else [
                    f"First find where {ranks_text(culprit)} was: run the job under `ddpdoctor "
                    "run` (it dumps every rank's stack when progress stops) or `py-spy dump "
                    "--pid <pid>` on it. If it was busy with work of its own, move that work "
                    "before init_process_group or raise the timeout for it; if it was blocked "
                    "(a lock, I/O, a queue), fix that: a longer timeout will not help."
                ],
            )
        )
    # the waiting ranks' own messages name who never came (the rank whose NCCL id they
    # waited for, the ranks a monitored barrier missed), and those printed no error: alive
    # elsewhere, or gone without a word
    silent = {r for r in named if not job.ranks[r].failed and not job.ranks[r].waiting}
    if waiting and silent and not busy and silent != set(job.ranks):
        found.append(
            Assessment(
                RULE,
                0.45,
                sorted(silent),
                [
                    f"the waiting ranks' own messages name {ranks_text(silent)} as the one "
                    "they waited for, and it printed no error: it had not reached that "
                    "collective, most likely busy with work of its own (data preparation, "
                    "loading, saving) for longer than the timeout."
                ],
                against=[f"{ranks_text(silent)} may also have died without printing anything"],
            )
        )
    late = _arrived_late(job)
    if late is not None:
        found.append(late)
    phases = [v for r, v in sorted(job.ranks.items()) if r in quiet | missing and v.busy_phase]
    if waiting and phases:
        view = phases[0]
        found.append(
            Assessment(
                RULE,
                0.55,
                [view.rank],
                [
                    f"rank {view.rank}'s last line says it had started a long phase on its own "
                    f'("{view.busy_phase}") while the others waited in a collective.'
                ],
            )
        )
    if unranked is not None:
        found.append(unranked)
    if missing and job.startup_seq is not None:
        found.append(
            Assessment(
                RULE,
                0.5,
                sorted(missing),
                [
                    f"the ranks timed out in collective #{job.startup_seq} of a 1-element "
                    f"barrier, at the very start of the job, and {ranks_text(missing)} never "
                    "joined: the classic picture of one rank doing start-up work alone "
                    "(downloading, tokenising, preprocessing under main_process_first) for "
                    "longer than the timeout."
                ],
                next_steps=[f"Check what {ranks_text(missing)} printed at start-up."],
            )
        )
    return max(found, key=lambda a: a.score) if found else None


def _arrived_late(job: JobEvidence) -> Assessment | None:
    """Ranks that announced a long phase of their own and then only lost their peers, while
    the others timed out waiting: they reached the collective after the others had given up
    (a timeout ends its rank, and its peers then find the connection closed)."""
    timed_out = {r for r, v in job.ranks.items() if "waiting" in v.echoes}
    late = {r for r, v in job.ranks.items() if v.busy_phase and v.lost_peer_only}
    if not late or not timed_out:
        return None
    first = job.ranks[min(late)]
    return Assessment(
        RULE,
        0.6,
        sorted(late),
        [
            f'{ranks_text(late)} announced a long phase of its own ("{first.busy_phase}") '
            f"while {ranks_text(timed_out)} timed out waiting in a collective; "
            + ("it" if len(late) == 1 else "they")
            + " reached the collective only after they had given up, and found the "
            "connection closed: busy past the timeout, not failed."
        ],
        evidence=[e for r in sorted(late) for e in job.ranks[r].evidence[:1]],
    )


def _in_another_collective(sites: list[WaitSite], waited_at: set[str]) -> bool:
    """The rank lost its peer in a collective whose op none of the waiting ranks waited in
    (known on both sides)."""
    ops = {(w.op or "").lower() for w in sites} - {""}
    known = waited_at - {""}
    return bool(ops and known and not ops & known)


WORK_ON_RANK = re.compile(r"(?i)\b(?:on|by) (?:rank|process) (?P<rank>\d{1,5})\b")
"""A line of work that says which rank does it ('building the indices on rank 0 ...',
'preprocessing by rank 0'): the writer names the worker, whatever its own rank."""


def _quoted(text: str) -> str:
    """A phase's line as quoted: its start and, for a long one, its end too (where a line of
    work often says on which rank it runs)."""
    text = text.strip()
    return text if len(text) <= 100 else f"{text[:55]} ... {text[-40:]}"


def _named_worker(phase: Evidence) -> int | None:
    """The rank an announcement of work names as the one doing it, if any."""
    named = WORK_ON_RANK.search(phase.text)
    return int(named["rank"]) if named else None


def _before_unranked_waits(job: JobEvidence, phase: Evidence) -> Assessment | None:
    """No rank is known for any writer, a line announced a long phase of work, and then
    requests to the c10d store timed out ('Socket Timeout': a key no process set in time, a
    barrier's): whatever the waiting processes were, they waited for that work. Which rank did
    it is known only where the line says ('building the indices on rank 0 ...', Megatron's,
    then the others' store wait). Above a store error alone (LCH111 at 0.3), which says only
    that a wait ran out."""
    if job.ranks or not job.unranked_wait_rules or job.unranked_wait_rules - {STORE_ERROR.code}:
        return None  # (the store's wait for its clients is the rendezvous's: LCH108)
    named = _named_worker(phase)
    return Assessment(
        RULE,
        0.5 if named is not None else 0.45,
        [] if named is None else [named],
        [
            f'a line of no rank announced a long phase of work ("{_quoted(phase.text)}") '
            "and then waits timed out: the processes that waited were waiting for that work, "
            "done on one rank while the others went on to meet it"
            + ("." if named is None else f", rank {named} as the line says.")
        ],
        against=[
            "no line names a rank: which one did the work is not known"
            if named is None
            else "the line that names the rank is no rank's own"
        ],
        evidence=[phase],
    )


def _from_unranked_phase(job: JobEvidence) -> Assessment | None:
    """A writer no rank can be given announced a long phase of work ('building the token
    index ...') and the others then waited: the rank that was not among them set out on it
    alone. Of several such ranks, the main process (the one that does work alone: indexing,
    caching, saving) is the likeliest. Not where no rank is known at all: the line may then
    be the waiting process's own, before it joined (and waited for) the others. Scored as a
    rank's own announcement is (0.55), with the rank the line does not name as a point
    against (which lowers the confidence shown); a phase that counts its own parts (0.65)
    shows work under way, stronger than a silent rank read as blocked (INF211 at 0.55)."""
    phase = job.unranked_phase
    if phase is None:
        return None
    if not job.waiting:
        return _before_unranked_waits(job, phase)
    absent = {r for r in job.quiet | job.missing if not job.ranks[r].failed} - set(job.waiting)
    timed_out = {r for r, v in job.ranks.items() if "waiting" in v.echoes}
    if not absent and timed_out:
        # every rank spoke, but some only lost their peers, after the others timed out: they
        # reached the collective after those had given up (_arrived_late, for a phase no
        # rank's own line names)
        waited_at = {(w.op or "").lower() for r in timed_out for w in job.ranks[r].wait_sites}
        absent = {
            r
            for r, v in job.ranks.items()
            if v.lost_peer_only
            # in the collective the others waited in: late to it; in another one, it called a
            # collective they never did (collective_mismatch), it was not late
            and not _in_another_collective(v.wait_sites, waited_at)
        }
    named = _named_worker(phase)
    if named in absent:
        absent = {named}  # the line says which of them does the work
    guessed = len(absent) > 1
    culprit = absent if not guessed else {MAIN_PROCESS} & absent
    if not culprit:
        return None
    return Assessment(
        RULE,
        0.65 if job.unranked_phase_counted else 0.55,
        sorted(culprit),
        [
            f'a line of no rank announced a long phase of work ("{_quoted(phase.text)}") '
            f"before the others waited, and {ranks_text(culprit)} was not among the ranks that "
            "timed out: it set out on that work alone and did not reach the collective in time."
        ],
        against=["the line that announced the work names no rank"]
        + (
            ["several ranks were absent: the main process, which works alone, is guessed"]
            if guessed
            else []
        ),
        evidence=[phase],
    )
