"""INF215 / INF216: a writer's output ends inside a stack trace that nothing after it ended.
A Python traceback without the exception line that ends every traceback (INF215), or a C++
backtrace of c10::Error frames (INF216). The process raised an error (a trace is only printed for
one) and the log was cut before, or while, saying which: a paste that stops early, a file
truncated by a full disk or a killed `tee`, a process that died mid-print."""

from __future__ import annotations

import re
import signal

from ddpdoctor.model.evidence import CutTrace, JobEvidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment, ranks_text
from ddpdoctor.rules.hypotheses.cut_site import native_site_rule, site_rule

STOP_SIGNALS = {int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGHUP), int(signal.SIGKILL)}
"""What stops a job from outside (SIGKILL: the escalation after a grace period)."""

COLLECT = (
    "Collect the complete output of that rank (torchrun --tee 3 or --log-dir DIR keeps each "
    "worker's stderr) and run the diagnosis on it: the error line decides the cause."
)

RULE = Rule(
    code="INF215",
    kind="python-exception",
    title="The output ends inside a traceback: the exception's own line is missing",
    signatures=(),
    category=Category.UNKNOWN,
    explanation=Explanation(
        what="A writer's last lines are a Python traceback ('Traceback (most recent call "
        "last):' and its frames, or frames alone) with no exception line after it.",
        why="Python prints a traceback when an exception ends a thread or process (or the code "
        "logs one); its last line names the exception. Without that line the cause is unknown, "
        "only where it happened: the last frame shown.",
        fix="Collect the rest of that writer's output (the full stderr, torchrun --tee 3 or "
        "--log-dir) and diagnose it again; the last frame says which code raised.",
        false_positives="A log copied while the traceback was being written, by a job that "
        "then went on (rare: a traceback is printed at once).",
    ),
    fix=(COLLECT, "Until then, the last frame shown is where it failed: read that code first."),
)

NATIVE = Rule(
    code="INF216",
    kind="native-crash",
    title="The output ends inside a C++ backtrace (c10::Error frames)",
    signatures=(),
    category=Category.UNKNOWN,
    explanation=Explanation(
        what="A writer's last lines are the frames of a C++ backtrace ('Exception raised from "
        "f at file:line (most recent call first):', 'frame #N: ...') and nothing follows.",
        why="torch's C++ code threw an error. Raised in a thread of its own (the NCCL watchdog, "
        "the heartbeat monitor) it ends the process with SIGABRT; raised under Python it "
        "becomes a RuntimeError whose message comes before the frames. The function it was "
        "raised from says where: a watchdog means a collective timed out or failed.",
        fix="Read the lines before the frames (the error's message) on that rank, or collect "
        "its complete output.",
        false_positives="A log cut right after an error whose message this diagnosis did not "
        "recognise: the message is then above the frames.",
    ),
    fix=(COLLECT, "Read the function named in 'Exception raised from': it says which part threw."),
)


SOCKET_IO = re.compile(r"Exception raised from (?:sendBytes|recvBytes) at \S*c10d/Utils\.hpp")
"""The backtrace of a c10d socket read or write whose other end went away: printed under the
line that says so (a lost connection, the store's host gone), it is that line's, not a crash of
its own."""


def assess(job: JobEvidence) -> Assessment | None:
    # a rank whose own errors are echoes (a timeout, a closed connection, a stop) printed that
    # trace for them: it is not a cause; nor is a trace no rank owns in a job that has echoes
    # (but the launcher's report that a worker failed only says that one did)
    # (the launcher's report of a rank's exit is about that rank, not an echo it printed)
    echoing = {r for r, v in job.ranks.items() if v.echoes - {"launcher"}} | _killed_by_the_stop(
        job
    )
    cut = [
        c
        for c in job.cut_tracebacks
        if (
            (c.where.rank is None and not job.echoes - {"launcher"})
            or (c.where.rank is not None and c.where.rank not in echoing)
        )
        and not (c.native and SOCKET_IO.match(c.where.text))
        and not _at_a_peers_timeout(c, job)
    ]
    if not cut:
        return None
    native = all(c.native for c in cut)
    # where every Python trace stopped, when that place nearly names the cause
    places = {
        native_site_rule(c.where.text, c.tail) if c.native else site_rule(c.tail) for c in cut
    }
    place = places.pop() if len(places) == 1 else None
    ranks = sorted({c.where.rank for c in cut if c.where.rank is not None})
    failing = [r for r in ranks if r in job.failing_exits]
    who = f"the output of {ranks_text(ranks)}" if ranks else "the output"
    support = [
        f"{who} ends inside a C++ backtrace: torch's native code threw an error, and nothing "
        "after it says what became of the process."
        if native
        else f"{who} ends inside a Python traceback: an exception was raised, and the line "
        "naming it is not in the logs."
    ]
    support += [f"The trace shows: {t}" for t in _where(cut)[:1]]
    if failing:
        codes = ", ".join(f"rank {r}: {job.failing_exits[r]}" for r in failing)
        support.append(f"The launcher reports it exiting with an error ({codes}).")
    return Assessment(
        place or (NATIVE if native else RULE),
        (0.55 if failing else 0.45) + (0.05 if place is not None else 0.0),
        failing or ranks,
        support,
        evidence=[c.where for c in cut[:4]],
        next_steps=["Collect the rest of that output: the error line names the cause."],
        category=None if place is not None else str(Category.UNKNOWN),
        # the place's own status: a launcher cut while waiting for its workers is a hang
        status=place.verdict_status if place is not None else Status.FAILED,
        # a writer known by its rank can be the one the others lost; an unnamed one cannot
        explains_echoes=bool(ranks),
    )


AT_THE_TIMEOUT_S = 2.0
"""A trace that began this close to the moment a peer reported its collective timed out."""


def _at_a_peers_timeout(cut: CutTrace, job: JobEvidence) -> bool:
    """The trace began within seconds of the moment another rank reported that its collective
    had timed out: a collective that ran for its whole timeout was waiting for something at
    its start, not at its end, and every rank in it times out at about that moment. A trace
    printed then is that timeout reaching this rank too, cut before its message, not a cause."""
    began = cut.where.time
    if began is None or cut.where.rank in job.waiting:
        return False
    return any(
        "waiting" in job.ranks[r].echoes
        and e.time is not None
        and abs((began - e.time).total_seconds()) <= AT_THE_TIMEOUT_S
        for r in job.waiting
        for e in job.ranks[r].evidence[:1]
    )


def _killed_by_the_stop(job: JobEvidence) -> set[int]:
    """Ranks that died of a stop signal in a job stopped from outside (Ctrl-C, a scheduler's
    SIGTERM, `ddpdoctor run` passing one on): a second signal (the launcher forwards the one
    the whole group already got) kills a rank while it prints the first one's traceback, so
    that trace ends early because of the stop, not because of an error of its own."""
    if not (job.stopped_by_run or "stopped" in job.unranked_echoes):
        return set()
    return {r for r, code in job.failing_exits.items() if -code in STOP_SIGNALS}


def _where(cut: list[CutTrace]) -> list[str]:
    return [c.where.text for c in cut if c.where.text]
