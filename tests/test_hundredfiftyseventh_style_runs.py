"""Real gloo runs of a hundred-and-fifty-seventh training-program style
(tests/programs/hundredfiftyseventh_style_train.py): a PyTorch custom training job on Google
Cloud Vertex AI, the way the vertex-ai-samples notebooks and the prebuilt PyTorch containers run
one, re-created in plain torch without Vertex or any Google library: two worker pools,
workerpool0 (the chief, one replica) and workerpool1 (three workers), every replica a VM of its
own running `python -m trainer.task --data-dir gs://vertex-demo-bucket/fashion-npz ...` once (no
torchrun), its rank and the world size read from CLUSTER_SPEC the samples' way (the chief 0,
workerpool1's replica i is i + 1), MASTER_ADDR (the chief's hostname,
'cmle-training-workerpool0-<hash>-0') and MASTER_PORT (3333) from the platform for
init_process_group(env://); gs:// URIs read and written through the Cloud Storage FUSE mount
(/gcs/vertex-demo-bucket/...): one shard of the training data per replica
(train-0000R-of-00004.npz), the test set split by rank and its loss and accuracy all-reduced, the
chief's checkpoint to AIP_CHECKPOINT_DIR after each epoch and the model to AIP_MODEL_DIR at the
end; a small CNN in DDP. Python logging's default format on stderr ('INFO:root:Test set: Average
loss: 2.2115, Accuracy: 166/512 (32%)'), the PyTorch MNIST example's 'Train Epoch: 2 [96/256
(38%)]<TAB>Loss: 2.243856' on stdout. The platform (tests/programs/hundredfiftyseventh_vertex.py:
each VM a network, UTS and mount namespace of its own on a private bridge) sends every line to
Cloud Logging: stdout as severity INFO, stderr as ERROR (every logging.info line of the program
is an ERROR record), each record naming its replica only in its resource labels and log name
(task_name 'workerpool1-0'); its own records are the service's ('Job is running.', 'The replica
workerpool1-1 exited with a non-zero status of 137. To find out more about why your job exited
please check the logs: ...', 'Job was cancelled because it exceeded the maximum running time.',
'Finished tearing down training program.', 'Job failed.', 'Job completed successfully.'). When
one replica exits non-zero (128 + N for a signal N) the job fails and every other replica gets
SIGTERM. The fixture of a mode is what the user downloads: the job's records exported from Cloud
Logging as JSON lines (downloaded-logs-<time>.json, every replica's and the service's records in
the order of their time) or, for four modes, what `gcloud ai custom-jobs stream-logs` printed
(console.log: 'ERROR<TAB>2026-12-07 12:30:23 +0000<TAB>workerpool1-1<TAB>[rank2]: ...'). gloo on
CPU, a 15 s collective timeout. Neither the program nor the platform were used to build the
rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredfiftyseventh.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 4 of 16 right (calm-fern, loud-fern, goal-fern, one-vm). Missed: no replica
line names its writer. In the export, a replica's line is the record's jsonPayload.message, which
the JSON reader does not open (it reads top-level keys only: every replica record is an empty line
with insertId, logName and receiveTimestamp as fields, some signatures still matching the raw
record), and neither the record's task_name nor its logName ('.../logs/workerpool1-1') is taken as
the writer; in gcloud's stream-logs form the task column ('ERROR<TAB>...<TAB>workerpool1-1<TAB>')
is not read either, nor the '[rank2]: ' that follows it. So the right kinds come with no culprit
(gap-shard, chief-sum, twin-store, twin-zero), timeouts are blamed on four silent ranks (drip-save,
lock-loop), and a lost peer stays a network fault (heap-climb, null-peek, quiet-quit, eta-type,
short-tail's abort read as a mismatch). The service's records are read but not understood: 'The
replica workerpool1-1 exited with a non-zero status of 137.' (128 + SIGKILL; 139 SIGSEGV) is no
exit status of a replica (workerpool1-i is rank i + 1), and 'Job was cancelled because it exceeded
the maximum running time.' is no scheduler's stop (clock-out reads as a log that just ends).
Since (session 41): a Cloud Logging entry is read as its payload (jsonPayload's record, or
textPayload) written by the replica its resource's labels name (task_name; a GKE pod's
pod_name), the envelope's own keys no fields of it; gcloud's stream-logs lines are read as
their task column's (severity, time, task name, then the line); and the service's 'The replica
workerpool1-1 exited with a non-zero status of 137' is that replica's rank's exit (137: SIGKILL,
139: SIGSEGV). Right since: gap-shard, drip-save, heap-climb, null-peek, chief-sum, short-tail,
twin-store, lock-loop, quiet-quit, eta-type: 14 of 16.
"""

from __future__ import annotations

import json
import re

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks, the platform's RANK: workerpool0-0 is 0,
# workerpool1-i is i + 1); what a run is given in brackets (capture_hundredfiftyseventh.sh;
# `job` is the chief and three workers, four shards of 256 samples, four epochs)
EXPECTED: dict[str, Expected] = {
    # [job] four epochs of 8 steps a replica, the test set after each, the chief's checkpoints
    # and model, every replica 'Training finished', all exit 0: 'Job completed successfully.'
    "calm-fern": ("ok", None, []),
    # [job --num-workers 3 --find-unused-parameters --mmap-test; stream-logs] the same healthy
    # run with scary lines from every replica: numpy's 'UserWarning: The given NumPy array is
    # not writable', the DataLoader's 'This DataLoader will create 3 worker processes in total.
    # Our suggested max number of worker in current system is 2', DDP's
    # '[rankN]:[W... reducer.cpp:...] Warning: find_unused_parameters=True was specified in
    # DDP constructor, but did not find any unused parameters'; all exit 0
    "loud-fern": ("ok", None, []),
    # [job --epochs 12 --target-accuracy 0.8] the all-reduced test accuracy passes the target
    # after epoch 5 on every replica alike ('Accuracy 0.8418 reached the target 0.80 after
    # epoch 5, stopping'), all finish and exit 0: a planned stop
    "goal-fern": ("ok", None, []),
    # [a job of workerpool0 alone: the platform sets no MASTER_ADDR, MASTER_PORT, WORLD_SIZE or
    # RANK] the script still calls init_process_group(env://): 'ValueError: Error initializing
    # torch.distributed using env:// rendezvous: environment variable MASTER_ADDR expected, but
    # not set', status 1
    "one-vm": ("failed", "launcher-env-missing", []),
    # [job; train-00002-of-00004.npz never reached the bucket] workerpool1-1 (rank 2) fails
    # opening its shard through the FUSE mount: "FileNotFoundError: [Errno 2] No such file or
    # directory: '/gcs/vertex-demo-bucket/fashion-npz/train-00002-of-00004.npz'", status 1; the
    # others are torn down
    "gap-shard": ("failed", "data-error", [2]),
    # [job, MT_CASE s0] from epoch 2 the chief writes its checkpoint through the FUSE mount 8 KiB
    # at a time, 2 s a block ('Saving checkpoint to gs://.../checkpoint_epoch2.pt', then
    # nothing); the workers time out after 15 s in epoch 3's gradient all-reduce ('Timed out
    # waiting 15000ms'), the chief is torn down still writing: the chief busy past the timeout
    "drip-save": ("failed", "slow-rank-timeout", [0]),
    # [job, MT_CASE k2] workerpool1-1 (rank 2) keeps 64 MiB for each batch from epoch 2 on and
    # is SIGKILLed at the sixth (the OOM killer's way): no traceback, 'The replica
    # workerpool1-1 exited with a non-zero status of 137.'; the others lose it
    "heap-climb": ("failed", "host-oom", [2]),
    # [job, MT_CASE z1; stream-logs] workerpool1-0 (rank 1) reads address 0 in epoch 2 (a
    # compiled augmentation): SIGSEGV, no traceback, status 139; the others lose it
    "null-peek": ("failed", "native-crash", [1]),
    # [job, MT_CASE v; stream-logs] a fork all-reduces the epoch's training loss on the chief
    # only, for its log line: the chief's all_reduce of one float meets the workers' test-set
    # all_reduce of three; gloo aborts the chief ('gloo::EnforceNotMet ... op.preamble.length
    # <= op.nbytes. 8 vs 4'), status 134: a collective only rank 0 issued
    "chief-sum": ("failed", "collective-mismatch", [0]),
    # [job; a newer export of the data set, 992 samples: the last shard holds 224] workerpool1-2
    # (rank 3) runs one batch short (7 against 8) and enters the test-set all_reduce while the
    # others all-reduce their last gradients; gloo aborts it (status 134): the rank whose
    # batches ran out first
    "short-tail": ("failed", "uneven-inputs", [3]),
    # [job, MT_CASE p] a fork shares the run's start time through a TCPStore of its own on
    # MASTER_ADDR:MASTER_PORT before init_process_group: the chief's init_process_group cannot
    # listen on 3333 ('DistNetworkError: ... EADDRINUSE'), status 1; the workers lose the store
    "twin-store": ("failed", "rendezvous-failure", [0]),
    # [job, MT_CASE c] a fork counts workerpool1's replicas from 0: workerpool1-0 (the
    # platform's rank 1) claims rank 0 as the chief does ('rank 0 of 4' from both), no replica
    # takes rank 3; the gloo rendezvous of every replica times out waiting for rank 3's key
    # ('DistStoreError: wait timeout after 15000ms, keys: /default_pg/0//cpu//0/3'): the replica
    # that took another's rank
    "twin-zero": ("failed", "rendezvous-failure", [1]),
    # [job, MT_CASE w3] in epoch 2 workerpool1-2's (rank 3) prefetch thread takes its own lock
    # twice: rank 3 waits for a batch for good, silently, outside any collective; the others time
    # out after 15 s in the gradient all-reduce and exit 1; rank 3 is torn down
    "lock-loop": ("hung", "hang", [3]),
    # [job, MT_CASE e2] a fork's patience rule on the replica's own test loss: after epoch 2
    # workerpool1-1 (rank 2) logs 'Rank 2: test loss 2.2198 not improving, leaving training' and
    # calls sys.exit(0); the others lose it in epoch 3's gradient all-reduce ('Connection closed
    # by peer') and exit 1
    "quiet-quit": ("failed", "uncoordinated-exit", [2]),
    # [job --epochs 300 --log-interval 8, a maximum running time of 20 s; stream-logs] a healthy
    # run stopped by the platform: 'Job was cancelled because it exceeded the maximum running
    # time.', every replica SIGTERMed in epoch 56, 'Job failed.'
    "clock-out": ("failed", "preempted", []),
    # [job, MT_CASE x1] after epoch 2 workerpool1-0 (rank 1) logs the time left from a numpy
    # float32: 'TypeError: unsupported type for timedelta seconds component: numpy.float32',
    # status 1; the others lose it in the next all-reduce
    "eta-type": ("failed", "python-exception", [1]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "twin-zero": (
        "rendezvous-failure with no culprit (LCH111, 0.3) instead of on rank 1: right kind, but "
        "'Task workerpool1 (index 0): rank 0 of 4' beside the chief's 'rank 0 of 4' (two "
        "replicas claiming rank 0, none rank 3, whose key '/default_pg/0//cpu//0/3' every "
        "replica waits for) is in jsonPayload.message, unread: only store timeouts are seen"
    ),
    "clock-out": (
        "unknown hang (INF212, 0.3) instead of preempted: the service's 'Job was cancelled "
        "because it exceeded the maximum running time.' (Vertex's own time limit, then SIGTERM "
        "to every replica) is not known as a scheduler's stop; the stream log ends in epoch 56's "
        "progress lines, then 'Job failed.'"
    ),
}

RUNS = RunSet("hundredfiftyseventh-", EXPECTED, MISSES, label_nowhere=True)
STREAM = {"loud-fern", "null-peek", "chief-sum", "clock-out"}
TASKS = ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool1-2"]
URL = "https://console.cloud.google.com/logs/viewer?project=vertex-demo-project&resource=ml_job"


def _records(mode: str) -> list[tuple[str, str, str]]:
    """(task, severity, message) of every record, in the file's order, from either form."""
    name = RUNS.names(mode)[0]
    out = []
    for line in RUNS.text(mode, name).splitlines():
        if mode in STREAM:
            severity, _when, task, message = line.split("\t", 3)
        else:
            r = json.loads(line)
            task = r["resource"]["labels"]["task_name"]
            severity = r["severity"]
            message = r["textPayload"] if task == "service" else r["jsonPayload"]["message"]
        out.append((task, severity, message))
    return out


def _said(mode: str, task: str) -> list[str]:
    return [m for t, _s, m in _records(mode) if t == task]


def _service(mode: str) -> list[str]:
    return _said(mode, "service")


def _exits(mode: str) -> dict[str, int]:
    """replica -> the non-zero status the service reported for it."""
    found = (
        re.match(r"The replica (\S+) exited with a non-zero status of (\d+)\. ", m)
        for m in _service(mode)
    )
    return {f[1]: int(f[2]) for f in found if f}


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredfiftyseventh_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredfiftyseventh_style_fixture_is_one_small_rewritten_unlabelled_log(mode: str) -> None:
    RUNS.check_fixture(mode)
    names = RUNS.names(mode)
    if mode in STREAM:
        assert names == ["console.log"], names
    else:
        assert len(names) == 1 and re.fullmatch(r"downloaded-logs-\d{8}-\d{6}\.json", names[0])
    text = RUNS.text(mode, names[0])
    assert "MT_CASE" not in text
    if mode not in STREAM:
        for line in text.splitlines():
            r = json.loads(line)
            assert r["resource"]["type"] == "ml_job"
            assert r["logName"].startswith("projects/vertex-demo-project/logs/")
            assert ("textPayload" in r) == (r["resource"]["labels"]["task_name"] == "service")
    records = _records(mode)
    assert records[0] == ("service", "INFO", "Job is preparing.")
    assert records[-1][0] == "service"
    times = re.findall(r'"timestamp": "([^"]+)"', text) if mode not in STREAM else []
    assert times == sorted(times)


def test_the_streams_severities() -> None:
    """stderr is ERROR (every logging line of the program), stdout INFO."""
    for mode in EXPECTED:
        for _task, severity, message in _records(mode):
            if message.startswith("INFO:root:"):
                assert severity == "ERROR", (mode, message)
            if message.startswith("Train Epoch: "):
                assert severity == "INFO", (mode, message)


def test_what_the_healthy_runs_print() -> None:
    for mode in ("calm-fern", "loud-fern", "goal-fern"):
        assert _service(mode)[-2:] == [
            "Finished tearing down training program.",
            "Job completed successfully.",
        ]
        assert _exits(mode) == {}
        for task in TASKS:
            said = _said(mode, task)
            assert not any("Traceback" in m for m in said), (mode, task)
            assert any(re.match(r"INFO:root:Training finished in \d+\.\d s$", m) for m in said)
        assert any(m.startswith("INFO:root:Model saved to gs://") for m in _said(mode, TASKS[0]))
    for mode in ("calm-fern", "loud-fern"):
        assert any(m.startswith("Train Epoch: 4 [192/256") for m in _said(mode, TASKS[3]))
    loud = "\n".join(m for _t, _s, m in _records("loud-fern"))
    assert loud.count("UserWarning: The given NumPy array is not writable") == 4
    assert "This DataLoader will create 3 worker processes in total" in loud
    for rank in range(4):
        assert re.search(rf"\[rank{rank}\]:\[W.*find_unused_parameters=True was specified", loud)
    for task in TASKS:
        said = _said("goal-fern", task)
        assert "INFO:root:Accuracy 0.8418 reached the target 0.80 after epoch 5, stopping" in said
        assert not any(m.startswith("Train Epoch: 6 ") for m in said)


def test_the_service_reports_each_failed_replica() -> None:
    assert _exits("one-vm") == {"workerpool0-0": 1}
    assert _exits("gap-shard") == {"workerpool1-1": 1}
    assert _exits("heap-climb") == {"workerpool1-1": 137}
    assert _exits("null-peek") == {"workerpool1-0": 139}
    assert _exits("chief-sum") == {"workerpool0-0": 134}
    assert _exits("short-tail") == {"workerpool1-2": 134}
    assert _exits("twin-store")["workerpool0-0"] == 1  # a worker that lost the store may too
    assert _exits("eta-type") == {"workerpool1-0": 1}
    assert "workerpool1-1" not in _exits("quiet-quit")  # it exited 0
    assert "workerpool1-2" not in _exits("lock-loop")  # torn down, still waiting
    assert "workerpool0-0" not in _exits("drip-save")  # torn down, still writing
    assert _exits("clock-out") == {}
    for mode in set(EXPECTED) - {"calm-fern", "loud-fern", "goal-fern"}:
        service = _service(mode)
        assert service[-2:] == ["Finished tearing down training program.", "Job failed."], mode
        for m in service:
            if m.startswith("The replica "):
                assert URL in m
    assert "Job was cancelled because it exceeded the maximum running time." in _service(
        "clock-out"
    )
    for task in ("workerpool1-1", "workerpool1-0"):  # killed by signals: no traceback
        mode = "heap-climb" if task == "workerpool1-1" else "null-peek"
        assert not any("Traceback" in m for m in _said(mode, task))


def test_what_the_failing_replicas_say() -> None:
    assert (
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
        "variable MASTER_ADDR expected, but not set" in _said("one-vm", TASKS[0])
    )
    assert (
        "[rank2]: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/gcs/vertex-demo-bucket/fashion-npz/train-00002-of-00004.npz'"
    ) in _said("gap-shard", "workerpool1-1")
    assert any("EADDRINUSE" in m for m in _said("twin-store", TASKS[0]))
    for task in TASKS[1:]:
        assert not any("EADDRINUSE" in m for m in _said("twin-store", task))
    assert "INFO:root:Task workerpool0 (index 0): rank 0 of 4" in _said("twin-zero", TASKS[0])
    assert "INFO:root:Task workerpool1 (index 0): rank 0 of 4" in _said("twin-zero", TASKS[1])
    for task in TASKS:
        assert (
            "torch.distributed.DistStoreError: wait timeout after 15000ms, keys: "
            "/default_pg/0//cpu//0/3"
        ) in _said("twin-zero", task)
    assert (
        "[rank1]: TypeError: unsupported type for timedelta seconds component: numpy.float32"
        in _said("eta-type", "workerpool1-0")
    )
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in _said(
        "chief-sum", TASKS[0]
    )
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in _said(
        "short-tail", "workerpool1-2"
    )


def test_the_busy_the_stuck_and_the_early_replica() -> None:
    chief = [m for m in _said("drip-save", TASKS[0]) if not m.startswith("Train Epoch")]
    assert re.match(r"INFO:root:Saving checkpoint to gs://\S+/checkpoint_epoch2\.pt$", chief[-1])
    for task in TASKS[1:]:
        assert any("Timed out waiting 15000ms" in m for m in _said("drip-save", task)), task
    stuck = _said("lock-loop", "workerpool1-2")
    assert stuck[-1].startswith("Train Epoch: 2 [0/256 (0%)]"), stuck[-3:]
    for task in TASKS[:3]:
        assert any("Timed out waiting 15000ms" in m for m in _said("lock-loop", task)), task
    early = _said("quiet-quit", "workerpool1-1")
    assert re.match(
        r"INFO:root:Rank 2: test loss \d\.\d{4} not improving, leaving training$", early[-1]
    )
    assert any(
        m.startswith("INFO:root:Rank 3: 224 training") for m in _said("short-tail", TASKS[3])
    )
    assert any(m.startswith("Train Epoch: 1 [0/224 (0%)]") for m in _said("short-tail", TASKS[3]))


def test_a_replica_the_service_reports_is_the_culprits_host() -> None:
    """The service's 'The replica workerpool1-1 exited with a non-zero status of 137' is a line
    of the platform's own log (its task_name 'service'), about the replica: the culprit's host
    is the replica, not the service."""
    culprit = diagnose_paths([str(RUNS.folder("heap-climb"))]).verdict.culprit
    assert (culprit.ranks, culprit.hosts) == ([2], ["workerpool1-1"])
