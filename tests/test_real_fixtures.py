"""Diagnoses of real runs kept as fixtures (tests/fixtures/real): healthy runs are `ok` (captured by
tests/fixtures/real/capture_healthy.sh), with and without c10d INFO noise."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.analysis.facts import FACT_PATTERNS
from tests.conftest import REPO

HEALTHY = REPO / "tests" / "fixtures" / "real"


@pytest.mark.parametrize("name", ["healthy-plain", "healthy-noisy"])
def test_healthy_run_is_ok(name: str) -> None:
    report = diagnose_paths([str(HEALTHY / name / "console.log")])
    assert report.verdict.status == "ok", report.verdict.summary
    assert report.verdict.kind is None
    assert not [f for f in report.findings if f.role == "root"]
    assert report.job.ranks_seen == [0, 1]


def test_grad_strides_alone_is_slow_not_failed(corpus) -> None:  # type: ignore[no-untyped-def]
    report = diagnose_paths([str(corpus / "013-ddp-grad-strides-conv1x1" / "logs")])
    assert report.verdict.status == "slow"
    assert report.verdict.kind == "ddp-grad-strides"


def test_grad_strides_next_to_a_failure_is_context(corpus, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two real logs together: the performance warning of case 013 and the OOM of case 006."""
    logs = [
        corpus / "013-ddp-grad-strides-conv1x1" / "logs",
        corpus / "006-cuda-oom-rank2-funasr-cascade" / "logs",
    ]
    report = diagnose_paths([str(p) for p in logs])
    assert report.verdict.kind == "cuda-oom"
    roles = {f.rule: f.role for f in report.findings}
    assert roles["DDP103"] == "context"


def test_torchrun_log_dir_error_files() -> None:
    """Real `@record` error files from `torchrun --log-dir`: JSON with an escaped traceback."""
    run = next((HEALTHY / "elastic-error-json").glob("*_*"))
    report = diagnose_paths([str(run)])
    assert report.verdict.kind == "data-error"
    assert report.verdict.culprit.ranks == [1]
    assert report.verdict.evidence[0].rank == 1
    assert report.verdict.evidence[0].time is not None
    roles = {f.rule: f.role for f in report.findings}
    assert roles["NET101"] == "cascade"


def test_timeout_arithmetic_on_real_timestamps() -> None:
    """Real run (tests/programs/timed_failure.py): rank 1's error at t0, rank 0's 3 s gloo
    timeout at about t0 + 3 s. The evidence must say the timeout is the consequence."""
    report = diagnose_paths([str(HEALTHY / "timed-data-error" / "console.log")])
    assert report.verdict.kind == "data-error"
    assert report.verdict.culprit.ranks == [1]
    notes = [e.text for e in report.verdict.evidence if e.text.startswith("Timeout arithmetic")]
    assert notes and "rank 0 timed out" in notes[0] and "consequence" in notes[0]
    timeouts = next(f for f in report.findings if f.rule == "TMO102")
    assert timeouts.role == "cascade" and timeouts.ranks == [0]


def test_really_small_dev_shm_is_a_dataloader_problem_not_a_full_disk() -> None:
    """Real run with /dev/shm mounted as a 1 MB tmpfs: 'No space left on device (28)' from the
    shared-memory allocator is DL101, not disk-full."""
    report = diagnose_paths([str(HEALTHY / "small-dev-shm" / "console.log")])
    assert report.verdict.kind == "dataloader-worker-killed"
    assert report.verdict.category == "environment"
    assert "DATA102" not in {f.rule for f in report.findings}
    assert "PY101" not in {f.rule for f in report.findings}  # same traceback, explained


MULTINODE = HEALTHY


@pytest.mark.parametrize(
    ("case", "kind", "ranks", "hosts"),
    [
        # rank 3 logs its error without a rank prefix: the only rank of node1 not waiting
        ("multinode-data-error", "data-error", [3], ["node1"]),
        # rank 3 sleeps in a finally block and is SIGTERMed by its agent before its error is
        # printed: alive, silent, not the main process and announcing no work of its own, it
        # was stuck outside the collective (it slept), not busy with work only it does
        ("multinode-silent-rank", "hang", [3], []),
    ],
)
def test_two_node_jobs(case: str, kind: str, ranks: list[int], hosts: list[str]) -> None:
    """Real 2 x 2 gloo jobs (two torchrun agents, static rendezvous), one console per node."""
    base = MULTINODE / case
    report = diagnose_paths([str(base / "node0"), str(base / "node1")])
    assert report.verdict.kind == kind
    assert report.verdict.culprit.ranks == ranks
    assert report.verdict.culprit.hosts == hosts
    assert report.job.ranks_seen == [0, 1, 2, 3]
    timeouts = next(f for f in report.findings if f.rule == "TMO102")
    assert timeouts.role == "cascade" and 3 not in timeouts.ranks


def test_a_collective_one_rank_calls_after_training_completed_is_a_mismatch() -> None:
    """Real run (tests/programs/teardown_crash.py): both ranks print 'Training complete', then
    rank 1 exits at once and rank 0's own last all_reduce (a metric only rank 0 averages) loses
    its peer. Not teardown: rank 0's code called a collective rank 1 never called, the same bug
    as a barrier under `if rank == 0` after the end (style-barrier-main) or trainer.evaluate()
    on the main process only (hf-trainer-evaluate-main-only)."""
    report = diagnose_paths([str(HEALTHY / "teardown-crash" / "console.log")])
    assert report.verdict.kind == "collective-mismatch"
    assert report.verdict.category == "user-code"
    assert report.verdict.culprit.ranks == [0]


def test_faulthandler_dumps_of_a_stalled_job_are_a_hang() -> None:
    """Real run (tests/programs/hang_dump.py): faulthandler.dump_traceback_later fires on both
    ranks while rank 1 sleeps outside the barrier; no error text at all."""
    report = diagnose_paths([str(HEALTHY / "hang-dump" / "console.log")])
    assert report.verdict.status == "hung"
    assert report.verdict.kind == "hang"
    assert report.verdict.category == "unknown"


def test_no_master_listening_is_a_rendezvous_failure() -> None:
    """Real run: node 1 of 2 against a master address and port where nothing listens."""
    report = diagnose_paths([str(HEALTHY / "rendezvous-no-master" / "console.log")])
    assert report.verdict.kind == "rendezvous-failure"
    assert report.verdict.category == "configuration"


def test_sigkill_alone_is_suggested_not_proven(corpus) -> None:  # type: ignore[no-untyped-def]
    """Corpus 021: only torchrun's exit -9 lines. Host OOM is the likely reading, not a proof."""
    report = diagnose_paths([str(corpus / "021-host-oom-sigkill-localrank3-colossalai" / "logs")])
    assert report.verdict.kind == "host-oom"
    assert report.verdict.confidence < 0.7
    assert "dmesg" in report.verdict.summary


def test_early_stop_announced_twice_on_one_glued_line() -> None:
    """Real run where both ranks' "Early stopping" lines share one physical line: the stop was
    announced by every rank, so it is an intended exit, not a worker failure."""
    report = diagnose_paths([str(HEALTHY / "early-stop-glued" / "console.log")])
    glued = [e for e in report.verdict.evidence if e.text.count("Early stopping") == 2]
    assert glued, "the fixture must hold the glued line"
    assert report.verdict.kind == "early-stop"
    assert report.verdict.category == "intended-exit"


def test_a_connection_reset_inside_the_dataloader_is_its_worker_dying() -> None:
    """Real run under load: rank 1's DataLoader worker was SIGKILLed while handing over a
    batch; rank 1 raised ConnectionResetError under the DataLoader's frames, rank 0 lost its
    peer. Rank 1's reset is the worker's death, not a lost peer rank."""
    report = diagnose_paths([str(HEALTHY / "accelerate-worker-killed-reset")])
    assert report.verdict.kind == "dataloader-worker-killed", report.verdict.summary
    assert report.verdict.culprit.ranks == [1]


def test_early_stop_of_every_rank_when_the_launcher_terminated_one() -> None:
    """Real run under load: both ranks announced the stop without a rank prefix, rank 0 exited
    first and torchrun SIGTERMed rank 1. The two announcements are two ranks' words: they are
    not both given to rank 0 (the only rank that 'failed'), and the stop is intended."""
    report = diagnose_paths([str(HEALTHY / "early-stop-one-terminated" / "console.log")])
    assert report.verdict.kind == "early-stop", report.verdict.summary
    assert report.verdict.category == "intended-exit"


def test_monitored_barrier_names_the_rank_that_kept_the_others_waiting() -> None:
    """Real run: rank 1 prints nothing and is terminated by torchrun; rank 0's monitored barrier
    names it. The culprit is rank 1 (busy), not the rank that reported the timeout."""
    report = diagnose_paths([str(HEALTHY / "monitored-barrier" / "console.log")])
    assert report.verdict.kind == "slow-rank-timeout"
    assert report.verdict.culprit.ranks == [1]
    roles = {f.rule: f.role for f in report.findings}
    assert roles["TMO103"] == "cascade"


def test_a_timeout_outranks_the_closed_connection_it_caused() -> None:
    """Real run where rank 0's "Connection closed by peer" is printed before rank 1's own
    timeout: the closure is the echo of the timeout, never the root. The tracebacks show the
    two ranks in different collectives (all_reduce vs broadcast): a collective mismatch, whose
    culprit is a guess between two evenly split ranks, said with a low confidence."""
    report = diagnose_paths([str(HEALTHY / "timeout-echo-printed-first" / "console.log")])
    order = [
        f.rule
        for f in sorted(report.findings, key=lambda f: f.evidence[0].line if f.evidence else 0)
    ]
    assert order.index("NET101") < order.index("TMO102"), "the fixture prints the echo first"
    assert report.verdict.kind == "collective-mismatch"
    assert report.verdict.category == "user-code"
    assert report.verdict.confidence < 0.5
    assert "all_reduce" in report.verdict.summary and "broadcast" in report.verdict.summary
    roles = {f.rule: f.role for f in report.findings}
    assert roles["NET101"] == "cascade" and roles["TMO102"] == "cascade"


def test_an_abort_while_a_timeout_ends_the_rank_is_not_the_root() -> None:
    """Real run: rank 0 times out, then aborts (SIGABRT) on its way out. The abort is how rank 0
    died, not why; the ranks' different batch totals are."""
    report = diagnose_paths([str(HEALTHY / "abort-after-timeout" / "console.log")])
    roles = {f.rule: f.role for f in report.findings}
    assert roles["LCH104"] == "cascade"
    assert report.verdict.kind == "uneven-inputs"
    assert report.verdict.culprit.ranks == [1]


def test_the_launchers_sigterm_names_its_victim_by_pid() -> None:
    """Real run: rank 0 printed nothing before torchrun terminated it; the pid in "Sending
    process N closing signal SIGTERM" is rank 0's in the summary, so rank 0 shows as a victim.
    Rank 1's all-reduce of 16 floats (rank 0's had 4096) aborted after three steps, and rank 0
    left no trace of where it waited: the abort alone reads as a rank that left the loop, the
    likelier cause of a non-main rank alone in a small collective, and the report says so as a
    guess with the other reading (captured/collective-mismatch-shape, where rank 0's traceback
    shows its own all_reduce, is the mismatch)."""
    report = diagnose_paths([str(HEALTHY / "victim-terminated-silently" / "console.log")])
    assert report.verdict.kind == "uneven-inputs"
    assert report.verdict.confidence <= 0.6
    assert any("a small collective called on that rank alone" in b for b in report.verdict.basis)
    terminated = next(f for f in report.findings if f.rule == "LCH102")
    assert terminated.role == "cascade"
    assert terminated.ranks == [0]


def test_the_summary_entry_of_a_rank_beats_the_launchers_one_line_notice() -> None:
    """Real run: torchrun first logs "failed (exitcode: 1) local_rank: 0 (pid: ...)", then its
    summary names rank 0 with host and pid; the report keeps the summary's fuller entry."""
    report = diagnose_paths([str(HEALTHY / "monitored-barrier" / "console.log")])
    rank0 = report.job.per_rank[0]
    assert (rank0.code, rank0.host, rank0.local_rank) == (1, "localhost", 0)
    assert rank0.pid is not None


def test_a_crash_after_every_rank_agreed_to_stop_is_the_early_stop() -> None:
    """Real run: both ranks stopped at step 3 on an agreed early stop, then rank 1 aborted in
    gloo's teardown at exit. The job's work was done and the platform saw a failure only
    because of how the ranks exited: the taxonomy's early stop (intended-exit), not a native
    crash of training; the abort is named on the way out."""
    report = diagnose_paths([str(HEALTHY / "agreed-stop-teardown-abort" / "console.log")])
    verdict = report.verdict
    assert (verdict.status, verdict.kind, verdict.category, verdict.culprit.ranks) == (
        "failed",
        "early-stop",
        "intended-exit",
        [],
    )
    assert "On the way out: rank 1" in verdict.summary


@pytest.mark.parametrize(
    ("case", "rank"),
    [
        # only mpirun's summary, behind docker compose's container prefix
        ("428-device-assignment-mmdet-mpirun-local-rank-not-set", 2),
        # Horovod under mpirun: the summary names rank 0, which exited 1
        ("410-cuda-oom-horovod-mpirun-shutdown-cascade-root-not-pasted", 0),
    ],
)
def test_mpiruns_first_failed_process_is_a_failed_rank(case: str, rank: int) -> None:
    """Open MPI's "The first process to do so was: Process name: [[J,1],R] Exit code: N" is
    a rank's exit, as torchrun's summary is: the job failed, never OK."""
    report = diagnose_paths([str(REPO / "corpus" / "cases" / case / "logs")])
    assert report.verdict.status == "failed"
    assert report.job.per_rank[rank].code == 1


def test_a_job_stopped_by_ctrl_c_while_stuck_is_a_hang_not_its_echoes() -> None:
    """Real run (capture_interrupted.sh): rank 1 stops in a sleep while rank 0 waits in a
    barrier; Ctrl-C (SIGINT to the process group) 3 s later. Rank 1 dies of the interrupt first
    and rank 0's barrier reports a closed connection: an echo of the stop, not an
    uncoordinated exit or a network fault. A person's stop of a stuck job: hang, a guess."""
    report = diagnose_paths([str(HEALTHY / "interrupted-hang" / "console.log")])
    v = report.verdict
    assert (v.status, v.kind, v.rule) == ("hung", "hang", "INF217")
    assert v.confidence < 0.5
    assert "run_train.py:35 in main" in v.summary
    roles = {f.rule: f.role for f in report.findings}
    assert roles["NET101"] == "cascade"


def test_a_person_stopping_a_stuck_job_in_a_public_report() -> None:
    """Corpus 415: DDP finished its first iteration, then nothing; the reporter pressed Ctrl-C
    (the agent's "Received 2 death signal"). Not a worker failure (INF208)."""
    case = REPO / "corpus" / "cases" / "415-hang-after-reducer-buckets-rebuilt-user-ctrl-c"
    v = diagnose_paths([str(case / "logs")]).verdict
    assert (v.status, v.kind) == ("hung", "hang")


def test_the_agents_word_that_every_worker_finished_is_an_end() -> None:
    """torchrun's agent at INFO level ends a healthy run with "worker group successfully
    finished" (agent/server/api.py): every worker exited 0, the job has an end."""
    from ddpdoctor.analysis.job import build_job
    from ddpdoctor.analysis.parallel import scan_inputs
    from ddpdoctor.ingest.sources import Input

    path = str(HEALTHY / "healthy-agent-info" / "console.log")
    scans = scan_inputs([Input(path, path)])
    ends = [f.record.text for s in scans for f in s.facts if f.name == "completed"]
    assert any("worker group successfully finished" in t for t in ends), ends
    assert path in build_job(scans, []).completed_at
    # the two ranks' prints were glued on one line in this run ("...(5%)rank 0 step 1/20"):
    # rank 0 is not seen, and the run is still healthy
    report = diagnose_paths([path])
    assert (report.verdict.status, report.verdict.kind) == ("ok", None), report.verdict.summary
    assert not [f for f in report.findings if f.role == "root"]


def test_a_counter_glued_after_another_ranks_words_is_that_ranks() -> None:
    """Real run (tests/fixtures/real/glued-counters): under load the two ranks' prints glue
    ('rank 1: epoch done, waiting for the othersrank 0 step 5/8'): rank 1's total is its own
    6, not rank 0's 8, and the shorter rank is named."""
    report = diagnose_paths([str(HEALTHY / "glued-counters" / "console.log")])
    assert (report.verdict.kind, report.verdict.culprit.ranks) == ("uneven-inputs", [1])


def test_glibcs_heap_check_names_the_native_crash() -> None:
    """Real run (tests/programs/heap_abort.py): rank 1 frees a buffer twice; glibc prints
    'free(): double free detected in tcache 2' and aborts; rank 0 loses its peer. The glibc
    line is the root's first evidence, rank 1 the culprit."""
    report = diagnose_paths([str(HEALTHY / "heap-abort" / "console.log")])
    verdict = report.verdict
    assert (verdict.kind, verdict.rule, verdict.culprit.ranks) == ("native-crash", "LCH104", [1])
    assert verdict.evidence[0].text == "free(): double free detected in tcache 2"
    roles = {f.rule: f.role for f in report.findings}
    assert roles["NET101"] == "cascade"


def test_a_rank_whose_stderr_was_lost_mid_traceback_had_raised() -> None:
    """Real run (accelerate-worker-killed under load): rank 1's traceback stops after its
    first frame and CPython reports 'lost sys.stderr'. Rank 1 raised; it did not end itself
    without a word (an uncoordinated exit) while rank 0 went on."""
    report = diagnose_paths([str(HEALTHY / "accelerate-worker-killed-lost-stderr")])
    assert report.verdict.kind != "uncoordinated-exit", report.verdict.summary
    assert report.verdict.culprit.ranks == [1]


@pytest.mark.parametrize(
    ("line", "n"),
    [
        ("[INFO|trainer.py:2142] 2026-12-04 20:16:21,135 >>   Total optimization steps = 54", 54),
        ("  Total optimization steps = 1,250", 1250),
        ("Namespace(lr=0.1, max_steps=1000, seed=1)", 1000),
        ("max_steps: -1", None),
    ],
)
def test_the_optimisation_steps_a_run_announces(line: str, n: int | None) -> None:
    found = [
        m["n"] for f in FACT_PATTERNS if f.name == "train_steps" and (m := f.compiled.search(line))
    ]
    assert [int(x.replace(",", "")) for x in found] == ([] if n is None else [n])


def test_the_trainers_own_bar_redrawn_at_its_close_proves_no_busy_rank() -> None:
    """fiftyfourth-prefetch-wait (a real run): rank 1 waits for ever on an event before its
    next batch; rank 0's label-less Trainer bar (its total the 'Total optimization steps = 54'
    the banner announced) is redrawn at 21/54 [00:16] when rank 0's all-reduce times out. That
    bar is the training loop's, not a busy rank's work: rank 1 was stuck, not busy."""
    verdict = diagnose_paths([str(HEALTHY / "fiftyfourth-prefetch-wait")]).verdict
    assert (verdict.status, verdict.kind, verdict.culprit.ranks) == ("hung", "hang", [1])
