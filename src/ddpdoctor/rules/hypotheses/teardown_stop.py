"""INF237: the output stops while the program was shutting down: the last words of its writers
announce the end of the run (destroy_process_group called, NCCL's communicators aborted or
destroyed, wandb's end-of-run summary), and nothing follows: no error, no exit code. A job whose
training finished and that then never exits (a destroy_process_group some rank never joins, a
communicator abort that blocks, an atexit hook) leaves exactly this; so does a healthy run
whose launcher prints nothing on success. The verdict stays "unknown" at the confidence of a
guess, but it names the phase the output stopped in, which a log "ending in the middle of
training" would not."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.findings import Evidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF237",
    kind="exit-teardown-crash",
    title="The output stops while the program was shutting down",
    signatures=(),
    status=Status.UNKNOWN,
    explanation=Explanation(
        what="The last lines the writers printed belong to the end of the run (destroying the "
        "process group, NCCL communicators aborted or destroyed, wandb's run summary), and "
        "nothing follows them: no error, no exit code.",
        why="After the work is done a process can still hang on its way out: "
        "destroy_process_group() called on some ranks only or while others still run "
        "collectives, a communicator abort that blocks, a logger's or a library's atexit "
        "hook that waits for ever.",
        fix="If the job never exits: end every rank the same way (barrier(), then "
        "destroy_process_group() on every rank, then exit), and take the stack of a process "
        "that stays (`py-spy dump --pid PID`) to see which exit step blocks.",
        false_positives="A healthy run ends the same way where its launcher prints nothing "
        "when every worker exits 0 (torchrun does not): nothing after the last line tells an "
        "exit 0 from a hang. Under `ddpdoctor run` the exit codes are recorded.",
    ),
    fix=(
        "At the very end on every rank: torch.distributed.barrier(); "
        "torch.distributed.destroy_process_group(); then exit.",
        "If a process stays after its last line: py-spy dump --pid PID shows the exit step it "
        "blocks in (a destroy_process_group some rank never joined, an atexit hook, a "
        "logger's upload).",
    ),
)

WINDING_DOWN = re.compile(
    # the program's own announcement, or torch's shutdown words (any case, _ or space)
    r"destroy(?:ing)?[_ ](?:the )?process[_ ]group"
    # NCCL (init.cc) at ncclCommAbort / ncclCommDestroy, which destroy_process_group calls
    r"|\b(?:Abort|Destroy) COMPLETE\b"
    # NCCL's proxy service thread as each local rank frees its communicator
    r"|\[Service thread\] Connection closed by localRank"
    r"|ProcessGroupNCCL destructor entered"
    # wandb.finish(): the run's summary tables and its last words
    r"|^wandb: (?:Run (?:history|summary):|Waiting for W&B process to finish"
    r"|Synced \d|Find logs at|\s*\S.{0,60}? [▁▂▃▄▅▆▇█]{3})",
    re.IGNORECASE,
)
"""What a process prints on its way out, after its work (positive: "[rank 0] calling
destroy_process_group ...", "gcn17:2408115:2596340 [2] NCCL INFO comm 0xe83c2a0 rank 2 nranks 4
cudaDev 2 busId ca000 - Abort COMPLETE", "wandb:         train/box_loss ██▇▆▆▅▄▄",
"wandb: Run summary:"; negative: "wandb: Tracking run with wandb version 0.16.0", "NCCL INFO
comm 0x55d5 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE", "destroy the old
checkpoint", "Epoch 3/10 step 40")."""


def assess(job: JobEvidence) -> Assessment | None:
    if job.ended or job.echoes or job.failing_exits or job.stopped_by_run:
        return None  # an end, an error or a stop: other verdicts read those
    if job.job_exit_code is not None or not job.last_words:
        return None
    endings = _last_per_rank(job)
    winding = [w for w in endings if WINDING_DOWN.search(w.text)]
    # most ranks stopped there: one rank's summary among others still training is not it
    if not winding or 2 * len(winding) < len(endings):
        return None
    return Assessment(
        RULE,
        0.35,
        [],
        [
            "the output stops while the program was shutting down after its work: the last "
            "lines announce the end of the run (destroying the process group, communicators "
            "aborted, a logger's end-of-run summary) and nothing follows, no error and no exit "
            "code. If the job never exited, it hangs in teardown; if it did, nothing here says "
            "with which code (torchrun prints nothing when every worker exits 0)."
        ],
        next_steps=[
            "Find out whether the processes are still running; if they are, take their stacks "
            "(py-spy dump --pid PID) to see which exit step they block in."
        ],
        status=Status.UNKNOWN,
        explains_echoes=False,
        evidence=winding[:4],
    )


def _last_per_rank(job: JobEvidence) -> list[Evidence]:
    """Each rank's last line per source (a rank's prints and its NCCL lines are two writers
    of one file: the later one is where that rank stopped); unranked writers count alone."""
    last: dict[tuple[str, int | None], Evidence] = {}
    alone: list[Evidence] = []
    for words in job.last_words:
        if words.rank is None:
            alone.append(words)
            continue
        key = (words.source, words.rank)
        if key not in last or words.line > last[key].line:
            last[key] = words
    return [*last.values(), *alone]
