"""What a launcher's stop lines say about the workers (analysis/facts.py terminated_worker,
raised_worker; analysis/job.py _launched_at_least, _stopped_unseen; behaviour.py
_stopped_alive, _unlisted_exits). A launcher that stops the workers still alive after one
failed ran at least that many plus the failed one, and those it stopped were alive: a rank
that left no line but was stopped was outside the collective its peer timed out in, not dead
first. All on real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS

REAL = Path(__file__).resolve().parent / "fixtures" / "real"
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "cases"


def _captured(name: str, line: str) -> list[dict[str, str]]:
    return [
        {k: v for k, v in m.groupdict().items() if v is not None}
        for f in FACT_PATTERNS
        if f.name == name and (m := f.compiled.search(line))
    ]


@pytest.mark.parametrize(
    ("line", "pid"),
    [
        # torchelastic's agent (api.py) and mp.spawn (spawn.py), as torch 2.13 prints them
        (
            "W1204 11:15:37.749000 7236 torch/distributed/elastic/multiprocessing/api.py:1028] "
            "Sending process 7250 closing signal SIGTERM",
            "7250",
        ),
        (
            "W1204 07:35:02.472000 16836 torch/multiprocessing/spawn.py:165] Terminating "
            "process 16855 via signal SIGTERM",
            "16855",
        ),
        # older torchrun, without the glog header
        (
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 27314 "
            "closing signal SIGTERM",
            "27314",
        ),
    ],
)
def test_a_launcher_stopping_a_worker_names_its_pid(line: str, pid: str) -> None:
    assert _captured("terminated_worker", line) == [{"pid": pid}]


@pytest.mark.parametrize(
    "line",
    [
        "Sending process 1 closing signal",  # no signal named
        "Terminating process group",
        "[rank0]: terminating process 12 via kill",
    ],
)
def test_other_lines_name_no_stopped_worker(line: str) -> None:
    assert _captured("terminated_worker", line) == []


def test_spawns_report_of_the_worker_that_raised_names_it() -> None:
    line = "-- Process 0 terminated with the following error:"
    assert _captured("raised_worker", line) == [{"local_rank": "0"}]
    assert _captured("raised_worker", "process 0 terminated with exit code 1") == []


def test_a_worker_stopped_after_the_only_ranks_failure_counts_in_the_world() -> None:
    """fortythird-heavy-case: only rank 0 logs; its validation barrier times out after 15 s,
    mp.spawn reports process 0's error and stops one other process. The world is at least 2,
    and the rank that left no line is that process: alive, outside the barrier, named."""
    report = diagnose_paths([str(REAL / "fortythird-heavy-case")])
    assert report.job.world_size == 2 and report.job.ranks_missing == [1]
    assert report.verdict.culprit.ranks == [1]
    assert report.verdict.kind != "nccl-timeout"
    assert any("Terminating process" in e.text for e in report.verdict.evidence)


def test_several_stopped_workers_are_not_guessed_to_be_the_missing_ones() -> None:
    """Corpus 146 (training split): one rank's watchdog timeout and seven others stopped by
    the agent, whose logs were not given: the seven were alive, but which of them the
    timed-out rank waited for is not known, so no busy rank is named."""
    case = next(CORPUS.glob("146-*"))
    verdict = diagnose_paths([str(case / "logs")]).verdict
    assert (verdict.kind, verdict.rule) == ("nccl-timeout", "INF204")


def test_a_stop_ordered_from_outside_adds_no_worker() -> None:
    """third-sigterm: two nodes' agents got SIGTERM and stopped their four workers; none
    failed, so the stops bound nothing beyond what the ranks said (world 4)."""
    report = diagnose_paths([str(REAL / "third-sigterm")])
    assert report.job.world_size == 4 and report.job.ranks_missing == []


def test_stops_the_summary_lists_leave_no_rank_unaccounted() -> None:
    """fortyeighth-doc-filter: torchrun's summary lists the rank it stopped (exitcode -15 with
    its pid), so the rank it leaves out had exited 0: uneven inputs on it, as before."""
    verdict = diagnose_paths([str(REAL / "fortyeighth-doc-filter")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("uneven-inputs", [0])


def _case(number: str) -> str:
    return str(next(CORPUS.glob(f"{number}-*")) / "logs")


@pytest.mark.parametrize(
    ("case", "rule", "kind"),
    [
        # DeepSpeed's launcher killing its workers ('Killing subprocess N', cut before the
        # return code) right after 'Loading checkpoint shards: 0%' or a memory report, with no
        # traceback in the console the workers share: killed from outside (host memory)
        ("437", "INF231", "host-oom"),
        ("825", "INF231", "host-oom"),
        # torchrun's SIGTERMs glued to a bar at its total (1873/1873): after the loop
        ("150", "INF210", "exit-teardown-crash"),
        # the launcher's line alone, no worker's: their output went elsewhere
        ("345", "INF208", "python-exception"),
    ],
)
def test_a_launcher_stopping_workers_none_of_which_printed_an_error(
    case: str, rule: str, kind: str
) -> None:
    """Training-split corpus cases: the launcher stopped its workers after a failure it does
    not name, and no worker printed an error where their own lines are."""
    verdict = diagnose_paths([_case(case)]).verdict
    assert (verdict.rule, verdict.kind, verdict.status) == (rule, kind, "failed")


def test_a_launcher_stop_long_after_the_last_progress_ends_a_hang() -> None:
    """seventh-ack-wait (a real DeepSpeed run): a step every 0.7 s, then 105 s of nothing
    until launch.py's sigkill_handler killed the workers (the capture's timeout): a job
    stuck before the stop, not a worker that died."""
    verdict = diagnose_paths([str(REAL / "seventh-ack-wait")]).verdict
    assert (verdict.status, verdict.kind, verdict.rule) == ("hung", "hang", "INF229")


@pytest.mark.parametrize(
    "fixture",
    [
        # 'Training completed', then only a stop from outside (twelfth-flusher-stuck)
        "twelfth-flusher-stuck",
        # every rank's agreed 'stopping early', then 'Received 15 death signal' and the
        # launcher's SIGTERM to the one worker still alive 54 s later (sixtyfirst-late-knot)
        "sixtyfirst-late-knot",
    ],
)
def test_processes_still_there_after_an_intended_end_hung_on_their_way_out(fixture: str) -> None:
    verdict = diagnose_paths([str(REAL / fixture)]).verdict
    assert (verdict.status, verdict.kind) == ("hung", "exit-teardown-crash")


def test_an_agreed_stop_with_no_outside_stop_after_it_stays_an_early_stop() -> None:
    # every rank stops on a loss target and exits 0 (fifty-ninth goal-met)
    verdict = diagnose_paths([str(REAL / "fiftyninth-goal-met")]).verdict
    assert (verdict.status, verdict.kind, verdict.rule) == ("ok", None, "INF207")


def test_a_peer_lost_on_the_loopback_is_no_network_fault() -> None:
    """fortieth-own-stop: rank 2 printed 'Epoch 2: early stopping' (no rank prefix) and
    exited 0; ranks 0 and 1 lost it: 'Connection closed by peer [127.0.0.1]:15242'. A
    loopback connection does not fail for network reasons: a peer process went away."""
    verdict = diagnose_paths([str(REAL / "fortieth-own-stop")]).verdict
    assert (verdict.kind, verdict.rule) == ("uncoordinated-exit", "INF202")
    assert verdict.category != "infrastructure"


@pytest.mark.parametrize(
    "fixture",
    [
        # a stop from outside (the pod evicted) ended the ranks: the stop is the cause
        "sixteenth-pod-evict",
        # ranks timed out waiting: they waited on a live peer
        "sixteenth-push-slow",
    ],
)
def test_loopback_losses_after_a_stop_or_beside_timeouts_are_read_as_before(fixture: str) -> None:
    verdict = diagnose_paths([str(REAL / fixture)]).verdict
    assert verdict.rule != "INF202"


def test_a_sigkill_after_the_launchers_own_sigterm_is_its_escalation_not_the_oom_killer() -> None:
    """Real capture (set 139 feed-lock): torchrun's agent sends rank 1 'closing signal
    SIGTERM' once rank 0 failed, rank 1's handler only notes it, and 30 s later the agent says
    'Unable to shutdown process N via 15, forcefully exiting via 9': the summary's 'exitcode  :
    -9 (pid: N)  (SIGKILL)' is the agent's kill, a reaction to the failure, not a host out of
    memory."""
    report = diagnose_paths([str(REAL / "hundredthirtyninth-feed-lock")])
    assert report.verdict.kind != "host-oom"
    roles = {f.rule: f.role for f in report.findings}
    assert roles["LCH101"] == "cascade"


def test_the_failure_that_made_the_launcher_stop_the_workers_is_the_root() -> None:
    """Real torchrun run (tests/programs/sigterm_ignored.py): rank 0 raises a ValueError, the
    agent sends rank 1 SIGTERM, rank 1's handler only notes it, and 30 s later the agent kills
    it ('exitcode  : -9 (pid: N)  (SIGKILL)'). The session-37 code named a host out of memory
    on rank 1; the root is rank 0's exception, the SIGKILL its consequence."""
    report = diagnose_paths([str(REAL / "launcher-escalation" / "console.log")])
    verdict = report.verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("python-exception", [0])
    roles = {f.rule: f.role for f in report.findings}
    assert roles["LCH101"] == "cascade"


def test_a_sigkill_the_launcher_did_not_start_with_a_sigterm_stays_the_oom_killers() -> None:
    """Real capture (set 139 rss-grow): rank 3 dies of SIGKILL and the agent then sends the
    other workers 'closing signal SIGTERM', not rank 3: the host-oom reading stands."""
    console = (REAL / "hundredthirtyninth-rss-grow" / "node1.log").read_text(errors="replace")
    assert "closing signal SIGTERM" in console
    verdict = diagnose_paths([str(REAL / "hundredthirtyninth-rss-grow")]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("host-oom", [3])
