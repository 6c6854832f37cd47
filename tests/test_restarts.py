"""A job torchelastic restarted (--max-restarts) is judged by its last attempt: the agent's
report of an attempt's failed workers, followed seconds later by another report of the same
agent, ends an attempt it restarted; what the workers printed before it (or in an older
attempt folder of --log-dir) is not how the job ended, and cannot explain the last attempt's
lines (those are other processes). Unless the last attempt never ran: workers that only lost
each other leave the earlier attempts' failures as all there is to read."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.job import _last_restart
from ddpdoctor.analysis.scanner import FactHit
from ddpdoctor.ingest.filenames import attempt_of
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.model.records import Record
from tests.conftest import REPO

REAL = REPO / "tests/fixtures/real"


def _exit(line: int, raw: str) -> FactHit:
    parsed = parse_line(raw, 2026)
    record = Record("console.log", line, parsed.text, parsed.origin, parsed.time)
    code = parsed.text.split("exitcode: ", 1)[1].split(")", 1)[0]
    local = parsed.text.split("local_rank: ", 1)[1].split(" ", 1)[0]
    return FactHit("launcher_exit", {"code": code, "local_rank": local}, record, [])


# tests/fixtures/real/twentyseventh-torn-save/console.log: one agent (pid 27334), three attempts
TORN = [
    _exit(
        35,
        "E1203 07:37:28.698000 27334 torch/distributed/elastic/multiprocessing/api.py:1002]"
        " failed (exitcode: -9) local_rank: 0 (pid: 27339) of binary: /repo/.venv/bin/python",
    ),
    _exit(
        71,
        "E1203 07:37:31.265000 27334 torch/distributed/elastic/multiprocessing/api.py:1002]"
        " failed (exitcode: 1) local_rank: 1 (pid: 27351) of binary: /repo/.venv/bin/python",
    ),
    _exit(
        106,
        "E1203 07:37:33.927000 27334 torch/distributed/elastic/multiprocessing/api.py:1002]"
        " failed (exitcode: 1) local_rank: 0 (pid: 27359) of binary: /repo/.venv/bin/python",
    ),
]


def test_the_last_restart_is_the_agents_second_to_last_report() -> None:
    restart = _last_restart(TORN)
    assert restart is not None and (restart.source, restart.line) == ("console.log", 71)


def test_one_report_is_no_restart() -> None:
    assert _last_restart(TORN[:1]) is None


def test_two_agents_reporting_apart_are_two_nodes_not_a_restart() -> None:
    """Another node's agent reports its own workers' end later (after a timeout): each agent
    is compared with itself only."""
    other = _exit(
        200,
        "E1203 07:37:50.100000 28811 torch/distributed/elastic/multiprocessing/api.py:1002]"
        " failed (exitcode: 1) local_rank: 0 (pid: 28820) of binary: /repo/.venv/bin/python",
    )
    assert _last_restart([TORN[0], other]) is None


def test_attempt_folders_are_read_from_the_path() -> None:
    path = "logs/job-1_abc/attempt_2/1/stderr.log"
    assert attempt_of(path) == ("logs/job-1_abc", 2)
    assert attempt_of("logs/attempt_2/notes.txt") is None


def _verdict(folder: Path) -> tuple[str, str | None, list[int]]:
    v = diagnose_paths([str(folder)]).verdict
    return str(v.status), v.kind, sorted(v.culprit.ranks)


def test_the_same_failed_load_in_every_later_attempt_names_both_ranks() -> None:
    """Rank 0's attempt-0 SIGKILL tore the checkpoint; both ranks' loads fail in attempts 1
    and 2. The kill does not explain rank 0's later errors (other processes)."""
    assert _verdict(REAL / "twentyseventh-torn-save") == ("failed", "data-error", [0, 1])


def test_a_hang_in_the_last_attempt_is_not_the_first_attempts_error() -> None:
    assert _verdict(REAL / "twentyseventh-wedge-r1") == ("hung", "hang", [1])


def test_a_last_attempt_that_never_connected_keeps_the_first_attempts_cause() -> None:
    """torch 2.13's restarted gloo workers here often cannot form their group: attempt 1
    only loses its peers, attempt 0's SIGKILL of rank 1 stays the cause."""
    assert _verdict(REAL / "fourth-self-kill") == ("failed", "host-oom", [1])


def test_a_node_joining_an_elastic_job_is_no_failure() -> None:
    """--nnodes 1:2: node 0's agent stops its world-2 workers when node 1 joins (no worker
    failed, no 'failed (exitcode' line); the world of 4 trains and every rank ends."""
    assert _verdict(REAL / "twentyseventh-late-node") == ("ok", None, [])


def test_the_report_says_the_job_was_restarted() -> None:
    summary = diagnose_paths([str(REAL / "twentyseventh-torn-save")]).verdict.summary
    assert "restarted the workers" in summary and "last attempt" in summary
    # a job without restarts says nothing of them
    assert "restarted" not in diagnose_paths([str(REAL / "glued-counters")]).verdict.summary
