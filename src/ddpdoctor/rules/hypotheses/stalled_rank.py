"""INF211 and INF206: `ddpdoctor run` caught the job making no progress and took every rank's
stack. A rank outside the collective the others wait in (sleeping, waiting on a lock, stuck in
the DataLoader, busy in its own code) is the one to look at, at the line its stack names; when
every rank waits in the same collective, the logs cannot say more than "hang". Without `run`, a
stop signal's handler can show the same: its traceback stands on the line the rank was blocked
in (a lock) while the others timed out."""

from __future__ import annotations

from ddpdoctor.model.evidence import PROMPTS, Activity, JobEvidence
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Category, Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.collectives import SILENT_HANG_CAUSES
from ddpdoctor.rules.hypotheses.base import (
    MAIN_PROCESS,
    Assessment,
    ranks_text,
    stall_evidence,
    stall_note,
)

STUCK = Rule(
    code="INF211",
    kind="hang",
    title="A rank was stuck outside the collective the others waited in",
    signatures=(),
    category=Category.USER_CODE,
    status=Status.HUNG,
    explanation=Explanation(
        what="The job made no progress; the stacks show most ranks waiting in a collective and "
        "one (or a few) somewhere else: sleeping, waiting on a lock, in the DataLoader, or busy "
        "in its own code. Without `ddpdoctor run`'s stacks: a stop signal's traceback standing "
        "on a rank's lock, or a question asked on the terminal that the one rank still running "
        "waited to have answered, while the others timed out.",
        why="That rank never reached the collective: a sleep or a blocking call on one rank, a "
        "deadlock, a data loader that stopped delivering, or work only that rank does.",
        fix="Read the culprit's stack at the line named: make it reach the collective (remove "
        "the blocking call, fix the deadlock or the data loading), or do that work on every "
        "rank.",
        false_positives="A rank that was legitimately busy and would have arrived: then only "
        "the hang threshold was too short.",
    ),
    fix=(
        "Read the culprit rank's code at the line named above (under `ddpdoctor run`, its "
        "whole stack is in the run folder's stacks/).",
    ),
)

HANG = Rule(
    code="INF206",
    kind="hang",
    title="No progress and no error",
    signatures=(),
    explanation=Explanation(
        what="The job stopped making progress without printing an error.",
        why="A deadlock in a collective, a rank stuck in data loading, or a hang in the "
        "transport; the log alone cannot tell.",
        fix="Run the job under `ddpdoctor run` to get the Python stack of every rank when it "
        "stalls, or dump stacks now with `py-spy dump --pid PID` on each rank.",
        false_positives="A log that was cut before the end.",
    ),
    fix=(
        "Dump every rank's stack while it hangs: py-spy dump --pid PID (or run under "
        "`ddpdoctor run`).",
        "Set TORCH_DISTRIBUTED_DEBUG=DETAIL and NCCL_DEBUG=INFO for the next run.",
        SILENT_HANG_CAUSES,
    ),
)

ELSEWHERE = ("sleep", "lock", "dataloader", "compute", "idle", "unknown")


def _fix(rank: int, activity: Activity, others: str) -> str:
    code = f" (`{activity.source}`)" if activity.source else ""
    at = f"{activity.site}{code}"
    match activity.category:
        case "sleep":
            return (
                f"Rank {rank} sleeps at {at} while {others}: remove or shorten that wait, or "
                "let every rank take the same path."
            )
        case "lock":
            return (
                f"Rank {rank} waits on a lock at {at} while {others}: a deadlock (threads, a "
                "queue, a file lock); make sure whatever holds it can finish on that rank."
            )
        case "dataloader":
            return (
                f"Rank {rank} is stuck in the DataLoader at {at} while {others}: a worker that "
                "hangs or storage that stalls; re-run with num_workers=0 to see the error, or "
                "set DataLoader(timeout=...)."
            )
        case "compute":
            return (
                f"Rank {rank} is busy in its own code at {at} while {others}: if that work "
                "belongs to one rank (evaluation, saving, preprocessing), do it on every rank or "
                "outside the collectives; if it should not take this long, it loops."
            )
    return f"Rank {rank} is not in any collective ({activity.category} at {at}) while {others}."


def blocked_ranks(job: JobEvidence) -> set[int]:
    """Ranks a stop signal's handler found waiting on a lock, outside any collective."""
    return {
        r
        for r, v in job.ranks.items()
        if v.interrupted and not v.failed and not v.waiting and v.activity is not None
        if v.activity.category == "lock"
    }


def prompted_ranks(job: JobEvidence) -> set[int]:
    """Ranks waiting for an answer to a question asked on the terminal: the ranks that asked
    (when the line names one), else the one rank the launcher found still running, silent."""
    return _writers_or_the_one_alive(job, job.prompts)


def lock_waiting_ranks(job: JobEvidence) -> set[int]:
    """Ranks that made no progress after torch's 'Using ... as PyTorch extensions root...' (no
    build or load after it either): waiting on the extensions' build lock. The rank the line
    names, else the one rank the launcher found still running, silent."""
    return _writers_or_the_one_alive(job, job.extension_waits)


def _writers_or_the_one_alive(job: JobEvidence, lines: list[Evidence]) -> set[int]:
    """The ranks that wrote `lines` where the lines name them, else (lines without a rank) the
    one rank the launcher found still running, neither failed nor waiting; none when nothing
    was written."""
    if not lines:
        return set()
    named = {e.rank for e in lines if e.rank is not None}
    if named:
        return {r for r in named if r in job.ranks and not job.ranks[r].failed}
    # (a warning of its own earlier, a DataLoader's, does not make it a rank that waited)
    alive = {r for r, v in job.ranks.items() if v.terminated and not v.failed and not v.waiting}
    return alive if len(alive) == 1 else set()


def not_main_and_silent(job: JobEvidence, ranks: set[int]) -> bool:
    """Ranks other than the main process that announced no work of their own, whose place no
    stop signal showed, and whose output did not go on after the others had given up on them:
    nothing says they were busy. (A rank blocked on a lock or a queue prints nothing; one that
    went on writing its own lines while the others timed out was working.)"""
    return (
        bool(ranks)
        and MAIN_PROCESS not in ranks
        and all(
            job.ranks[r].activity is None
            and not job.ranks[r].busy_phase
            and not kept_writing(job, r)
            for r in ranks
        )
    )


def kept_writing(job: JobEvidence, rank: int) -> bool:
    """The rank's own output went on after another rank's timeout or lost peer, and what it
    wrote last was neither an error nor a stop signal's trace: alive and at work when the
    others gave up on it."""
    view = job.ranks[rank]
    return (
        view.spoke_after_waits
        and not view.interrupted
        and not view.failed
        and not view.warned
        and "stopped" not in view.echoes
    )


def from_silent_rank(
    job: JobEvidence,
    silent: set[int],
    waiting: set[int],
    score: float,
    by_transport: bool,
    trained_on: set[int] | None = None,
) -> Assessment:
    """Ranks other than the main process, alive (the launcher had to stop them, or the
    transport showed them running), silent and with no work announced, while the others timed
    out waiting: stuck, not busy. Work that only one rank does (evaluating, saving, uploading,
    tokenising under main_process_first) is the main process's; a rank other than 0 has none
    of its own to be busy with, and waits on something that never comes (a lock, a queue, a
    data loader, a file)."""
    one = len(silent) == 1
    return Assessment(
        STUCK,
        score,
        sorted(silent),
        [
            f"{ranks_text(silent)} printed no error and "
            + ("was" if one else "were")
            + " still running"
            + (
                " (the transport would have reported "
                + ("it" if one else "them")
                + " leaving as a closed connection; nobody did)"
                if by_transport
                else " (the launcher had to stop " + ("it" if one else "them") + ")"
            )
            + f" while {ranks_text(waiting)} timed out waiting for "
            + ("it" if one else "them")
            + ", and "
            + ("it" if one else "they")
            + " announced no work of "
            + ("its" if one else "their")
            + " own: work only one rank does (evaluation, saving, preprocessing) is the main "
            "process's, so a rank other than 0 that falls silent outside the collectives is "
            "most likely blocked (a lock, a queue, the data loader, a file), not busy."
            + (
                f" {ranks_text(trained_on).capitalize()} went on training after "
                + ("its" if one else "their")
                + " last line: "
                + ("it" if one else "they")
                + " fell behind the others."
                if trained_on
                else ""
            )
        ],
        against=["nothing in the logs shows where it was: it may also have been slow"],
        evidence=[e for r in sorted(silent) for e in job.ranks[r].evidence[:1]],
        fix=[
            f"Find where {ranks_text(silent)} waited: run the job under `ddpdoctor run` (it "
            "dumps every rank's stack when progress stops) or `py-spy dump --pid <pid>` on it. "
            "Look for what only that rank waits on: a file lock or a lock file left by an "
            "earlier run, a queue or event nobody feeds, a data loader worker that stopped; a "
            "longer timeout will not help a blocked rank.",
        ],
        status=Status.HUNG,
    )


def _from_prompt(job: JobEvidence) -> Assessment | None:
    """A rank asked a question on the terminal and the others timed out waiting: a worker's
    stdin is no terminal, nobody answers, so that rank waits for ever (a hang, not work)."""
    asking, waiting = prompted_ranks(job) - job.waiting, job.waiting
    if not asking or not waiting:
        return None
    prompt = job.prompts[0]
    question = _question(prompt.text)
    return Assessment(
        STUCK,
        0.7,
        sorted(asking),
        [
            f"the job asked a question on its terminal ('{question} ...') and "
            f"{ranks_text(asking)} printed no error and was still running, while "
            f"{ranks_text(waiting)} timed out waiting for it: it was waiting for an answer "
            "that never comes (a distributed worker's input is not a terminal)."
        ],
        fix=[
            "Answer the question before the job asks it: pass the flag or setting it stands "
            "for (overwrite/resume options, trust_remote_code=True, `wandb login` or "
            "WANDB_MODE=offline beforehand), or remove the input() from the training script.",
        ],
        evidence=[prompt],
        status=Status.HUNG,
    )


def _from_extension_lock(job: JobEvidence) -> Assessment | None:
    """A rank made no progress after torch's 'Using <dir> as PyTorch extensions root...' while
    the others timed out waiting for it: torch.utils.cpp_extension prints that line, then takes
    the build folder's lock (a FileBaton) before building or loading; a build killed earlier
    leaves its lock file behind, and the next process waits for it to go, for ever (a hang
    outside any collective, not work: no timeout helps)."""
    stuck, waiting = lock_waiting_ranks(job) - job.waiting, job.waiting
    if not stuck or not waiting:
        return None
    line = job.extension_waits[0]
    root = (
        line.text.split("Using ", 1)[-1].split(" as PyTorch extensions root", 1)[0]
        if " as PyTorch extensions root" in line.text
        else "TORCH_EXTENSIONS_DIR (by default ~/.cache/torch_extensions)"
    )
    said = line.text.strip()
    if (cut := said.find('"... ')) >= 0:  # another writer's words glued to the open line
        said = said[: cut + 4]
    return Assessment(
        STUCK,
        0.7,
        sorted(stuck),
        [
            f"{ranks_text(stuck)} printed '{said[:200]}' and made no progress "
            f"after it (no build, no load of the extension), while {ranks_text(waiting)} timed out "
            "waiting: torch takes the extension build folder's lock after that line, and a "
            "lock file left by a build that was killed (or another process's build that never "
            "ends) keeps it waiting for ever."
        ],
        fix=[
            f"Delete the stale lock: the `lock` file in the extension's folder under {root} "
            "(or the whole folder: it is rebuilt), then run again; set TORCH_EXTENSIONS_DIR to "
            "a folder of this job's own so that jobs sharing a home do not share locks.",
        ],
        evidence=[line],
        status=Status.HUNG,
    )


def _question(text: str) -> str:
    """The question up to its answer choices (another writer's text may follow on the line)."""
    ends = [at + len(mark) for mark in PROMPTS if (at := text.find(mark)) >= 0]
    return text[: min(ends)].strip()[-160:] if ends else text.strip()[:160]


def _from_interrupted(job: JobEvidence) -> Assessment | None:
    """Ranks timed out waiting while a rank the stop found blocked on a lock never came: it
    was deadlocked, not busy (no timeout would have helped)."""
    blocked, waiting = blocked_ranks(job), job.waiting
    if not blocked or not waiting:
        return None
    others = f"{ranks_text(waiting)} timed out waiting for it"
    return Assessment(
        STUCK,
        0.7,
        sorted(blocked),
        [
            f"rank {r} printed no error; the stop signal's handler found it at "
            f"{v.activity.site} (`{v.activity.source}`), outside any collective, while "
            f"{ranks_text(waiting)} timed out in theirs."
            for r, v in sorted(job.ranks.items())
            if r in blocked and v.activity is not None
        ],
        fix=[
            _fix(r, v.activity, others)
            for r, v in sorted(job.ranks.items())
            if r in blocked and v.activity is not None
        ],
        evidence=[e for r in sorted(blocked) for e in job.ranks[r].evidence[:1]],
        status=Status.HUNG,
    )


def _from_named_absence(job: JobEvidence) -> Assessment | None:
    """A message on behalf of the whole job (a coordinator's stall warning, no rank of its
    own) names the ranks that never submitted the collective the others wait in, and those
    ranks printed no error: they are somewhere else, stuck or slow, and the job hangs there.
    A waiting rank that speaks for itself is read as a timeout instead (slow_rank)."""
    if job.waiting or "waiting" not in job.unranked_echoes:
        return None
    absent = {
        r
        for r, v in job.ranks.items()
        if v.named_absent and not v.failed and not v.waiting and not v.completed
    }
    if not absent or any(v.failed for v in job.ranks.values()):
        return None
    return Assessment(
        STUCK,
        0.5,
        sorted(absent),
        [
            f"the job's own stall report names {ranks_text(absent)} as never having submitted "
            "the collective the other ranks submitted, and "
            + ("it" if len(absent) == 1 else "they")
            + " printed no error: "
            + ("it was" if len(absent) == 1 else "they were")
            + " somewhere else (stuck, slow, or on another code path), and the job hung there."
        ],
        fix=[
            f"Dump the stacks of {ranks_text(absent)} while it hangs (py-spy dump --pid PID): "
            "they show where those ranks are instead of the collective; if they take another "
            "path (a branch on the rank, fewer batches), make every rank submit the same ops."
        ],
        status=Status.HUNG,
        category=str(Category.UNKNOWN),
    )


def assess(job: JobEvidence) -> Assessment | None:
    stall = job.stall
    if stall is None or not stall.activities:
        return (
            _from_interrupted(job)
            or _from_prompt(job)
            or _from_extension_lock(job)
            or _from_named_absence(job)
        )
    acts = stall.activities
    inside = {r for r, a in acts.items() if a.in_collective}
    outside = {r for r, a in acts.items() if a.category in ELSEWHERE}
    summary = [stall_note(stall)]
    if inside and outside:
        ops = sorted({f"{acts[r].op} at {acts[r].site}" for r in inside})
        others = f"{ranks_text(inside)} wait in {' / '.join(ops)}"
        data_only = all(acts[r].category in ("dataloader", "unknown", "idle") for r in outside)
        return Assessment(
            STUCK,
            0.8,
            sorted(outside),
            summary,
            fix=[_fix(r, acts[r], others) for r in sorted(outside)],
            evidence=stall_evidence(stall),
            status=Status.HUNG,
            category=str(Category.UNKNOWN) if data_only else None,
        )
    if inside and len(inside) == len(acts):
        places = {(a.op, a.site) for a in acts.values()}
        if len(places) == 1:
            return Assessment(
                HANG,
                0.5,
                [],
                [
                    *summary,
                    "every rank waits in the same collective: a rank that never arrived is not "
                    "among them, or the transport itself stalled.",
                ],
                evidence=stall_evidence(stall),
                next_steps=[
                    "Check that every rank of the job was captured; if so, bisect the "
                    "transport (`ddpdoctor check`, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1).",
                ],
                status=Status.HUNG,
            )
        return None  # ranks in different collectives: a collective mismatch
    if outside:
        by_category: dict[str, set[int]] = {}
        for r in outside:
            by_category.setdefault(acts[r].category, set()).add(r)
        groups = sorted(by_category.items(), key=lambda kv: (len(kv[1]), min(kv[1])))
        culprits = groups[0][1] if len(groups) > 1 else set()
        shown = culprits or outside
        return Assessment(
            STUCK if culprits else HANG,
            0.6 if culprits else 0.5,
            sorted(culprits),
            summary,
            fix=[_fix(r, acts[r], "the others do not progress") for r in sorted(shown)][:4],
            evidence=stall_evidence(stall),
            status=Status.HUNG,
        )
    return None
