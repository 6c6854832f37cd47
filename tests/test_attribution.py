"""Rank attribution of lines whose writer is not their subject (tests/fixtures/real, real runs)."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def test_a_traceback_in_the_launchers_failure_summary_is_its_entrys_rank() -> None:
    """torchrun's ChildFailedError summary quotes each failed rank's @record traceback under
    that rank's entry; the console shows rank 0 only (--local-ranks-filter 0): the gloo
    timeouts there belong to ranks 1 and 2, not to nobody."""
    report = diagnose_paths([str(REAL / "fourth-throttled-upload")])
    timeouts = [f for f in report.findings if f.rule == "TMO102"]
    assert timeouts and sorted({r for f in timeouts for r in f.ranks}) == [1, 2]
    assert report.verdict.culprit.ranks == [0]


def test_a_summary_entry_without_a_traceback_names_no_other_line() -> None:
    """The same summary's SIGTERM entry (rank 0) quotes no traceback: rank 0's own lines keep
    rank 0, and no error is moved onto it."""
    report = diagnose_paths([str(REAL / "fourth-throttled-upload")])
    assert all(0 not in f.ranks for f in report.findings if f.rule == "TMO102")


def test_an_unprefixed_abort_belongs_to_the_one_rank_that_wrote_nothing() -> None:
    """Three ranks; 0 and 1 printed tracebacks (their peer reset the connection), rank 2 no
    line of its own: gloo's size-check abort, printed without a prefix, is rank 2's."""
    report = diagnose_paths([str(REAL / "sixth-gather-shape")])
    assert (report.verdict.kind, report.verdict.culprit.ranks) == ("collective-mismatch", [2])


def test_loguru_caught_header_names_the_spawned_process() -> None:
    """loguru's @logger.catch prints "process 'SpawnProcess-2' (pid)" over the traceback it
    swallows (its "> File" marks the catching frame); under mp.spawn that is local rank 1. The
    gloo "Connection closed by peer" of the other process stays its own."""
    report = diagnose_paths([str(REAL / "twentyfirst-gt-void")])
    roots = [f for f in report.findings if f.rule == "PY101"]
    assert roots and roots[0].ranks == [1]
    lost = [f for f in report.findings if f.rule == "NET101"]
    assert lost and all(1 not in f.ranks for f in lost)


def test_a_process_name_that_is_not_a_spawned_child_names_no_rank() -> None:
    """Under torchrun loguru names 'MainProcess': no local rank follows from it."""
    from ddpdoctor.ingest.attribution import LOGURU_CAUGHT

    header = (
        "An error has been caught in function 'main', process 'MainProcess' (4242), "
        "thread 'MainThread' (1):"
    )
    m = LOGURU_CAUGHT.search(header)
    assert m and m.group("n") is None and m.group("pid") == "4242"
    spawned = LOGURU_CAUGHT.search(header.replace("MainProcess", "SpawnProcess-3"))
    assert spawned and spawned.group("n") == "3"
    assert not LOGURU_CAUGHT.search(header.replace("MainProcess", "SpawnProcess-3:1")).group("n")


def test_the_store_that_cannot_listen_is_the_master_ranks() -> None:
    """'The server socket has failed to listen' is printed by the process hosting the TCPStore:
    rank 0 when the traceback is a training process's (a python launch, twentieth port-busy),
    nobody's when torchrun's agent hosted it (twelfth port-taken: its frames are run.py's)."""
    busy = diagnose_paths([str(REAL / "twentieth-port-busy")]).verdict
    assert (busy.kind, busy.culprit.ranks) == ("rendezvous-failure", [0])
    taken = diagnose_paths([str(REAL / "twelfth-port-taken")]).verdict
    assert (taken.kind, taken.culprit.ranks) == ("rendezvous-failure", [])


def test_a_launchers_report_on_a_child_names_the_childs_rank(tmp_path: Path) -> None:
    """Lightning's launcher runs in rank 0's process and reports a child it started by PID,
    prefixed with the child's own rank (rank_prefixed_message(..., rank=i + 1)); where no line
    maps the pid, that prefix names the child (set 118 bin-hoard, the census's example). A
    report naming a pid alone names nobody."""
    census = [json.loads(line) for line in (REPO / "census" / "messages.jsonl").open()]
    (example,) = [m["example"] for m in census if m["id"] == "pl-child-process-killed"]
    log = tmp_path / "console.log"
    log.write_text(example + "\n")
    verdict = diagnose_paths([str(log)]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("host-oom", [1])
    log.write_text(example.replace("[rank: 1] ", "") + "\n")
    verdict = diagnose_paths([str(log)]).verdict
    assert (verdict.kind, verdict.culprit.ranks) == ("host-oom", [])


def test_an_unprefixed_terminate_belongs_to_the_one_rank_sigabrt_ended() -> None:
    """C++'s 'terminate called after throwing an instance of gloo::EnforceNotMet' and its
    'what():' line carry no [rankN]: prefix (torch's hook prefixes Python's tracebacks only);
    std::terminate aborts, and torchrun saw one rank end by SIGABRT (exitcode -6): rank 2's.
    With two aborted ranks nothing says which printed it."""
    report = diagnose_paths([str(REAL / "seventyfifth-short-part")])
    mismatch = [f for f in report.findings if f.rule == "COL101"]
    assert mismatch and mismatch[0].ranks == [2]


def test_an_error_header_naming_a_rank_attributes_the_traceback_under_it() -> None:
    """A program that catches an exception and logs it under a header naming its rank
    (InternEvo's train.py) leaves the traceback unprefixed; the header says whose it is. A
    progress line that merely ends with a rank number is no such header."""
    from ddpdoctor.ingest.attribution import RANKED_HEAD

    for header, rank in [
        ("ERROR train.py:660 in <module> -- Raise exception from vm with rank id: 1", "1"),
        ("Exception on rank 3:", "3"),
        ("worker failed on rank_id=12", "12"),
    ]:
        m = RANKED_HEAD.search(header)
        assert m is not None and m.group("rank") == rank, header
    for other in ["INFO step 5 done on rank 0", "Error rate 0.5 at step 3", "rank 1: raise x"]:
        assert RANKED_HEAD.search(other) is None, other
    v = diagnose_paths([str(REPO / "tests/fixtures/real/hundredtwentyninth-meta-stale")]).verdict
    assert (v.kind, v.culprit.ranks) == ("data-error", [1])
