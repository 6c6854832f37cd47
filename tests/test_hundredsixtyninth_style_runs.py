"""Real gloo runs of a hundred-and-sixty-ninth training-program style
(tests/programs/hundredsixtyninth_style_train.py): text-line recognition trained the way
PaddleOCR's tools/train.py trains a CRNN (a small CNN, a BiLSTM, a CTC head over a character
dictionary file; EasyOCR's trainer and the CRNN+CTC repositories do the same), re-created in
plain torch without paddle, on synthetic 32x100 serial-number crops in an lmdb-like folder
(.npy files, labels.txt, num-samples), evaluated by rank 0 alone on a SimpleDataSet list (tqdm's
'eval model:' bar), torch DDP on gloo, a 20 s collective timeout (the lab's Global.dist_timeout).
PaddleOCR's console: the whole config by print_dict, '[2026/12/07 23:17:12] ppocr INFO: epoch:
[1/3], global_step: 5, lr: 0.001000, CTCLoss: ..., loss: ..., acc: ..., norm_edit_dis: ...,
avg_reader_cost: ... s, avg_batch_cost: ... s, avg_samples: 19.2, ips: ... samples/s, eta:
0:00:07', 'cur metric, ...', 'save best model is to ./output/rec/best_accuracy', 'best metric,
...', 'save model in ./output/rec/latest', the ppocr logger at INFO on rank 0 only (other ranks
at ERROR), and set_signal_handlers, by which a worker (a process-group leader under torchrun)
answers SIGTERM with 'main proc N exit, kill process group N' and a SIGKILL of its own group.
RUN AS A SYSTEMD SERVICE and read back with journalctl: the lab's unit ocr-train.service
(Type=simple, Restart=on-failure, RestartSec=10, StartLimitBurst=2 in 10 min, TimeoutStopSec=15)
runs `<venv>/bin/python3 -m torch.distributed.run --nproc_per_node 2 --master_port P
tools/train.py -c configs/rec/rec_crnn_serial.yml -o Global.epoch_num=3 ...` on one node
(trainhost) or, with `--nnodes 2 --node_rank N --master_addr trainhost0`, on two (trainhost0 with
ranks 0 and 1, trainhost1 with ranks 2 and 3). No systemd runs on the capture machine:
tests/programs/hundredsixtyninth_systemd.py re-creates systemd 252 and journald for the one unit
(each node in UTS and mount namespaces of its own: its hostname, its /etc/hosts), and the fixture
of a mode is each node's journal as `journalctl -u ocr-train.service -o short-iso --no-pager`
prints it, journal-HOST.txt: '2026-12-07T23:17:12+0000 trainhost python3[29044]: message' with
the main process's PID (torchrun's; its workers share its stream), systemd's own lines
('Started ocr-train.service - OCR training.', 'ocr-train.service: Main process exited,
code=exited, status=1/FAILURE', 'Failed with result 'exit-code'.', 'Consumed 9.541s CPU time.',
'Scheduled restart job, restart counter is at 1.', 'Start request repeated too quickly.',
'Stopping ...', 'State 'stop-sigterm' timed out. Killing.', 'A process of this unit has been
killed by the OOM killer.'), and '[199B blob data]' for a message journalctl will not print (the
tqdm bar's carriage returns; torch's bold escape codes). Every service that failed on its own
was restarted once and, failing again, refused by the start limit, but short-shard's node0,
whose restart waited for node1 until the operator stopped it. Neither the program nor the
launch were used to build the rules: the diagnosis must generalise. Captured by
tests/fixtures/real/capture_hundredsixtyninth.sh.

EXPECTED was written from each mode's mechanism and the taxonomy before any diagnosis was seen;
a mode ddpdoctor gets wrong today is a strict xfail whose reason says what it says instead.
First diagnosis: 8 of 16 right (torn-crop, dict-gone, null-stroke, lone-norm, blank-ink,
root-cwd, stop-sweep, best-scalar). Missed: the journal's systemd lines are not read as the
service's end: their 'ocr-train.service: ' is taken as a host's prefix (the job's hosts are
'ocr-train.service, trainhost'), so 'Deactivated successfully.' is no exit 0 and a healthy run
whose rank 0 ends with PaddleOCR's 'best metric, ...' reads as a log cut in the middle of
training (calm-glyph), 'A process of this unit has been killed by the OOM killer.' is not read
and the SIGTERM of OOMPolicy=stop that followed reads as a scheduler's preemption (heap-swell),
and `systemctl stop` of a service that had printed nothing for 42 s after its last epoch reads as a
preemption of a healthy run, not the end of a teardown hang (late-flush); SimpleDataSet's
skipped sample, whose 'ppocr ERROR: When parsing line ...' shares a journal line with the tqdm
bar and prints as '[126B blob data]', reads as an uncaught data error (loud-glyph); PaddleOCR's
unprefixed INFO lines, rank 0's alone, are taken as every rank's, so rank 0's own early stop
reads as all ranks' (lone-target); the restart's processes in the same journal are counted as a
third rank, whose missing logs are blamed for rank 1's timeout while rank 0 hung silently in
its file listing (list-choke); rank 0's SIGKILL by its own PaddleOCR signal handler reads as the
OOM killer's, not the end of its long evaluation (slow-eval, rank right); node1's clean exit
while node0's ranks were still in epoch 3 is not read as the shorter copy's ranks leaving
first, and node1's exit-barrier error reads as a rendezvous failure (short-shard).
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from tests.program_runs import Expected, RunSet

# mode -> (status, kind, culprit ranks: GLOBAL ranks); what a run is given in brackets
# (capture_hundredsixtyninth.sh; every run: the lab's unit, Restart=on-failure, RestartSec=10,
# StartLimitBurst=2, TimeoutStopSec=15; one node, trainhost, with ranks 0 and 1, or two nodes,
# trainhost0 with ranks 0 and 1 and trainhost1 with ranks 2 and 3)
EXPECTED: dict[str, Expected] = {
    # three epochs of 20 steps a rank, rank 0 evaluates at global steps 20 and 40 ('cur metric,
    # ...', 'save best model is to ./output/rec/best_accuracy', 'best metric, ...'), saves
    # latest and iter_epoch_3; torchrun exits 0: 'Deactivated successfully.' and the CPU time
    "calm-glyph": ("ok", None, []),
    # [two nodes; the unit without OMP_NUM_THREADS, Train.loader.num_workers=4; node0's copy of
    # the evaluation set lost val/word_0017.npy] the same healthy run with scary lines:
    # torchrun's OMP_NUM_THREADS banner on both nodes, the DataLoader's warning about 4 workers
    # on a 2-CPU machine from every rank, and at rank 0's evaluation SimpleDataSet's 'ppocr
    # ERROR: When parsing line val/word_0017.npy ..., error happened with msg: Traceback ...
    # FileNotFoundError' (PaddleOCR skips the sample and takes the next one); both services
    # exit 0
    "loud-glyph": ("ok", None, []),
    # [the .npy of the sample rank 1 reads first in epoch 1's thirteenth step cut to 4 KiB] rank
    # 1's DataLoader worker fails loading it (LMDBDataSet has no guard): 'ValueError: Caught
    # ValueError in DataLoader worker process N.' ... 'Failed to read all data for array'; rank
    # 0 loses it; the restarted service fails the same way, then the start limit: a corrupt
    # input file read by rank 1
    "torn-crop": ("failed", "data-error", [1]),
    # [two nodes; node1's checkout synced without ppocr/utils/dict/] ranks 2 and 3 (node1) fail
    # building the training set's CTCLabelEncode: 'FileNotFoundError: [Errno 2] No such file or
    # directory: 'ppocr/utils/dict/serial_dict.txt''; ranks 0 and 1 wait for them in DDP's
    # constructor and lose them; both services restart and fail again: the input missing on
    # the ranks of one node
    "dict-gone": ("failed", "data-error", [2, 3]),
    # [MT_CASE k1, MemoryMax=1536M] from epoch 2 rank 1 keeps 128 MiB a step (a fork's cache
    # of decoded batches); the group passes MemoryMax and the OOM killer takes rank 1, the
    # largest process: SIGKILL, no traceback, 'ocr-train.service: A process of this unit has
    # been killed by the OOM killer.', OOMPolicy=stop sends SIGTERM to the rest, 'Failed with
    # result 'oom-kill''; the restart ends the same way
    "heap-swell": ("failed", "host-oom", [1]),
    # [two nodes, MT_CASE z2] rank 2 (node1's local rank 0) reads address 0 in a native call at
    # epoch 2's third step: SIGSEGV, node1's torchrun 'exitcode: -11', no Python traceback; the
    # others lose it
    "null-stroke": ("failed", "native-crash", [2]),
    # [Metric.sync=True] the lab's metric sync all-reduces the evaluation's counts, but PaddleOCR
    # evaluates on rank 0 alone: at global step 20 rank 0's lone all_reduce meets rank 1's next
    # training step (DDP's buffer broadcast and gradient all-reduce): gloo aborts on the sizes
    # or both wait until the 20 s timeout; a collective only rank 0 issued
    "lone-norm": ("failed", "collective-mismatch", [0]),
    # [two nodes; node1 holds an older export of the training set, 560 samples to node0's 640]
    # each rank's DistributedBatchSampler sizes its share from its own node's copy: ranks 2 and
    # 3 have 8 steps an epoch, ranks 0 and 1 have 10; the extra steps pair across epochs until
    # ranks 2 and 3 finish their 24 steps and exit 0 (node1: 'Deactivated successfully.'),
    # while ranks 0 and 1 lose them in step 25; node0's service restarts and waits for node1 in
    # the rendezvous until the operator stops it: the ranks whose batches ran out first
    "short-shard": ("failed", "uneven-inputs", [2, 3]),
    # [Train.dataset.data_dir=./train_data/rec/training_full/, 3000 samples] rank 0 lists the
    # training files for the run's manifest with Popen(['find', ...], stdout=PIPE) and wait()
    # before reading: 3000 names are more than the pipe holds (64 KiB), so find blocks writing
    # and rank 0 waits for it for ever, silently; rank 1 waits in DDP's constructor and times
    # out after 20 s; the restart does the same: rank 0 stuck
    "list-choke": ("hung", "hang", [0]),
    # [Global.eval_batch_step=[0,10] Global.early_stop_patience=2] the lab's early stop is
    # decided where the metric is, in rank 0's evaluation: after two evaluations without
    # improvement rank 0 alone logs 'acc has not improved for 2 evaluations, stop training',
    # saves, and exits 0; rank 1 goes on into step 21 and loses it; the restart does the same:
    # one rank left the run
    "lone-target": ("failed", "uncoordinated-exit", [0]),
    # [the crop rank 1 reads first in epoch 1's eighth step is blank (255 everywhere)] the
    # per-image normalisation divides 0 by 0, the crop is NaN, rank 1's CTC loss is NaN and the
    # lab's check raises 'FloatingPointError: loss is nan at epoch 1, global_step 7: stop
    # training'; rank 0 loses it; the restart does the same
    "blank-ink": ("failed", "python-exception", [1]),
    # [the unit without WorkingDirectory=] systemd starts the service in /, so torchrun's
    # workers are given '/tools/train.py': "can't open file '/tools/train.py': [Errno 2] No
    # such file or directory", exit 2 on both; the restart does the same: a launch given a
    # script that is not there
    "root-cwd": ("failed", "entrypoint-not-found", []),
    # [Global.epoch_num=30; `systemctl stop ocr-train.service` at epoch 2's global step 25]
    # 'Stopping ocr-train.service - OCR training...', SIGTERM to every process of the unit:
    # each worker's PaddleOCR handler prints 'main proc N exit, kill process group N' and
    # SIGKILLs its own group, torchrun 'Received 15 death signal, shutting down workers', exit
    # 1, 'Stopped ocr-train.service - OCR training.', no restart: stopped on purpose from outside
    "stop-sweep": ("failed", "preempted", []),
    # [Global.use_visualdl=True; the lab's dashboard agent socket does not exist on the node]
    # training finishes ('best metric, ...' after 'save model in ./output/rec/iter_epoch_3'),
    # rank 1 exits 0, rank 0 waits in the VisualDL writer's close() for an upload that retries
    # for ever; the service stays active with no line until the operator stops it 40 s later:
    # training finished, then rank 0 hung in teardown
    "late-flush": ("hung", "exit-teardown-crash", [0]),
    # [Global.checkpoints=./output/rec/latest, an earlier run's checkpoint of its first epoch,
    # whose best_model_dict holds the evaluation's numpy float64] every rank's torch.load
    # (weights_only by default in torch 2.6+) rejects it: 'Weights only load failed ...
    # Unsupported global: GLOBAL numpy._core.multiarray.scalar'; the restart does the same
    "best-scalar": ("failed", "weights-only-load", [0, 1]),
    # [two nodes; PostProcess.name=CTCBeamSearchDecode beam_size=20, the evaluation list the
    # 2048-image benchmark] rank 0 evaluates alone at global step 20 (tqdm's 'eval model:' bar),
    # a pure-Python beam search of about 20 ms an image; ranks 1, 2 and 3 wait in the next
    # step's collectives and time out after 20 s; the restart does the same: rank 0 busy past
    # the timeout
    "slow-eval": ("failed", "slow-rank-timeout", [0]),
}

# mode -> what ddpdoctor says instead today (known gaps: fixing one turns its xfail into a failure)
MISSES: dict[str, str] = {
    "calm-glyph": (
        "unknown, hang with no culprit (INF212, 0.3) instead of ok: 'The log ends in the middle "
        "of training, without an end ... no error, no end of training, no exit code'; systemd's "
        "'ocr-train.service: Deactivated successfully.' (torchrun exited 0) is not read as the "
        "service's clean end (its 'ocr-train.service: ' is taken as a host's prefix: the job's "
        "hosts are 'ocr-train.service, trainhost', the exit code unknown), nor PaddleOCR's end "
        "of training ('save model in ./output/rec/iter_epoch_3', then 'best metric, ...') as one"
    ),
    "loud-glyph": (
        "failed, data-error on host trainhost0 with no rank (DATA101, 0.9) instead of ok: "
        "SimpleDataSet's 'FileNotFoundError: [Errno 2] No such file or directory: "
        "'./train_data/rec/val/word_0017.npy'' is read as a rank failing on its data, but it is "
        "the traceback PaddleOCR logs for a sample it skips ('ppocr ERROR: When parsing line "
        "..., error happened with msg: Traceback ...', then the next sample); the line that says "
        "so shares a journal line with the tqdm bar's carriage returns and prints as '[126B blob "
        "data]', so only ', error happened with msg: Traceback (most recent call last):' and the "
        "traceback show; both services' 'Deactivated successfully.' (exit 0) are not read"
    ),
    "heap-swell": (
        "failed, preempted with no culprit (LCH109, 0.6) instead of host-oom on rank 1: "
        "torchrun's 'Received 15 death signal, shutting down workers' is read as the scheduler "
        "ending the job 'and nothing failed before'; systemd's 'ocr-train.service: A process of "
        "this unit has been killed by the OOM killer.' just before it (MemoryMax=, the kernel's "
        "cgroup OOM killer took rank 1) and 'Failed with result 'oom-kill'.' are not read (their "
        "'ocr-train.service: ' taken as a host), and the SIGTERM is OOMPolicy=stop's; rank 1 "
        "left no line of its own (torchrun was SIGTERMed before it saw the -9): of the two pids "
        "torchrun sent SIGTERM to, only rank 0's answered ('main proc 29932 exit, kill process "
        "group 29932')"
    ),
    "short-shard": (
        "failed, rendezvous-failure with no culprit (LCH108, 0.3) instead of uneven-inputs on "
        "ranks 2 and 3: node1's torchrun's exit-barrier error after its workers ended "
        "('torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
        "closed.', the store of node0 gone) is taken as the root with 'only secondary errors "
        "visible'; node1's 'Deactivated successfully.' (ranks 2 and 3 finished their three "
        "epochs, exit 0) while ranks 0 and 1 were still in epoch 3 ('Connection closed by peer' "
        "in DDP's forward after 'epoch: [3/3], global_step: 20') is not read as the ranks of one "
        "node running out of batches first (node1's copy has 560 samples, node0's 640, and only "
        "rank 0 logs 'train dataloader has 10 iters'); node0's restart, which waited for node1 "
        "until the operator's stop timed out ('Killing process N (pt_elastic)'), adds nothing"
    ),
    "list-choke": (
        "failed, nccl-timeout on rank 2 (INF204, 0.3) instead of hung, hang on rank 0: the "
        "restarted attempt's torchrun (another PID in the same journal) sends SIGTERM to a pid "
        "that is neither of the first attempt's ranks, which makes a world of 3 with a 'rank 2' "
        "that 'left no lines'; that missing rank is blamed for rank 1's 'Timed out waiting "
        "20000ms for send operation' in DDP's constructor, while rank 0, silent since the config "
        "it printed (its 'train set manifest: ...' line never comes: Popen(['find', ...]).wait() "
        "blocked on a full pipe), is not singled out; its 'exitcode : -9' (its own signal "
        "handler's kill of its group) is listed as a host OOM among the consequences"
    ),
    "lone-target": (
        "failed, early-stop with no culprit (INF207, 0.7) instead of uncoordinated-exit on rank "
        "0: 'acc has not improved for 2 evaluations, stop training' is taken as 'every rank "
        "announced the stop' because PaddleOCR's INFO lines carry no rank and are read as every "
        "rank's; the ppocr logger logs INFO on rank 0 only, and rank 1 was still training (its "
        "'Connection closed by peer' is raised in avg_loss.backward() of the next step): one "
        "rank left the loop, the other lost it"
    ),
    "late-flush": (
        "failed, preempted with no culprit (LCH109, 0.6) instead of hung, exit-teardown-crash "
        "on rank 0: torchrun's 'Received 15 death signal' after the operator's `systemctl stop` "
        "('Stopping ocr-train.service - OCR training...', a systemd line not read) is taken as "
        "a scheduler's stop of a healthy job; the service had printed nothing for 42 s after "
        "training finished ('save model in ./output/rec/iter_epoch_3' and the final 'best "
        "metric, ...' at 23:28:58), and torchrun had one worker left to stop (rank 0, 'main proc "
        "1004 exit'): rank 0 hung in teardown (the VisualDL writer's close() waiting for an "
        "upload), which nothing reads"
    ),
    "slow-eval": (
        "failed, host-oom on rank 0 (LCH101, 0.65) instead of slow-rank-timeout on rank 0: rank "
        "right, kind wrong; rank 0's 'exitcode : -9 (SIGKILL)' is the kill of its own process "
        "group by PaddleOCR's SIGTERM handler ('main proc 1587 exit, kill process group 1587', "
        "after torchrun stopped it once rank 1 had timed out), not the OOM killer; what rank 0 "
        "was doing, the 2048-image evaluation with a pure-Python beam search after 'epoch: "
        "[3/3], global_step: 20', is only tqdm's bar, which prints as '[1.1K blob data]'; the "
        "timeout arithmetic compares the restart's timeout with the first attempt's SIGKILL"
    ),
}

RUNS = RunSet("hundredsixtyninth-", EXPECTED, MISSES, label_nowhere=True)
TWO_NODES = {"loud-glyph", "dict-gone", "null-stroke", "short-shard", "slow-eval"}


LINE = re.compile(
    r"(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+0000) (?P<host>trainhost[01]?) "
    r"(?P<ident>systemd\[1\]|python3\[(?P<pid>\d+)\]): (?P<msg>.*)"
)
UNIT = "ocr-train.service"
STARTED = f"Started {UNIT} - OCR training."
# every failed service restarted once, then refused by the start limit (StartLimitBurst=2)
TWICE = {
    "torn-crop",
    "dict-gone",
    "heap-swell",
    "null-stroke",
    "lone-norm",
    "list-choke",
    "lone-target",
    "blank-ink",
    "root-cwd",
    "best-scalar",
    "slow-eval",
}


def _hosts(mode: str) -> list[str]:
    return ["trainhost0", "trainhost1"] if mode in TWO_NODES else ["trainhost"]


def _entries(mode: str, host: str) -> list[re.Match[str]]:
    lines = RUNS.text(mode, f"journal-{host}.txt").splitlines()
    found = [LINE.fullmatch(ln) for ln in lines]
    assert all(found), [ln for ln, m in zip(lines, found, strict=True) if not m][:3]
    return [m for m in found if m]


def _systemd(mode: str, host: str) -> list[str]:
    """systemd's own lines of the unit, CPU times as N."""
    return [
        re.sub(r"Consumed \S+( \S+)? CPU time", "Consumed N CPU time", m["msg"])
        for m in _entries(mode, host)
        if m["ident"] == "systemd[1]"
    ]


def _attempts(mode: str, host: str) -> list[str]:
    """What each invocation of the service wrote, one text per main PID, in order."""
    texts: dict[str, list[str]] = {}
    for m in _entries(mode, host):
        if m["pid"]:
            texts.setdefault(m["pid"], []).append(m["msg"])
    return ["\n".join(t) for t in texts.values()]


def _service(mode: str, host: str = "trainhost") -> str:
    return "\n".join(_attempts(mode, host))


def _failure(result: str) -> list[str]:
    return [f"{UNIT}: Failed with result '{result}'.", f"{UNIT}: Consumed N CPU time."]


def _restart(n: int) -> list[str]:
    return [
        f"{UNIT}: Scheduled restart job, restart counter is at {n}.",
        f"Stopped {UNIT} - OCR training.",
        f"{UNIT}: Consumed N CPU time.",
    ]


EXITED_1 = f"{UNIT}: Main process exited, code=exited, status=1/FAILURE"


@pytest.mark.parametrize("mode", RUNS.params())
def test_hundredsixtyninth_style_run(mode: str) -> None:
    RUNS.check_verdict(mode)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hundredsixtyninth_style_fixture_is_small_rewritten_and_unlabelled(mode: str) -> None:
    RUNS.check_fixture(mode)
    assert RUNS.names(mode) == [f"journal-{h}.txt" for h in _hosts(mode)]
    for name in RUNS.names(mode):
        text = RUNS.text(mode, name)
        for mark in ("MT_CASE", "OCR169", "HS169", "work/main"):
            assert mark not in text, (name, mark)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_line_is_a_short_iso_journal_entry_of_its_host(mode: str) -> None:
    """journalctl -o short-iso: no header, every entry 'STAMP HOST IDENT[PID]: ', the stream's
    identifier the binary of ExecStart and its PID the main process's, one PID an invocation,
    stamps in order."""
    for host in _hosts(mode):
        entries = _entries(mode, host)
        assert {m["host"] for m in entries} == {host}
        assert entries[0]["msg"] == STARTED
        assert [m["stamp"] for m in entries] == sorted(m["stamp"] for m in entries)
        pids: list[str] = []
        for m in entries:
            if m["msg"] == STARTED:
                pids.append("")
            elif m["pid"]:
                assert pids[-1] in ("", m["pid"]), (host, m["msg"])
                pids[-1] = m["pid"]
        assert len(pids) == len(_attempts(mode, host)) or mode == "short-shard"


def test_what_systemd_said() -> None:
    for mode in ("calm-glyph", "loud-glyph"):
        for host in _hosts(mode):
            assert _systemd(mode, host) == [
                STARTED,
                f"{UNIT}: Deactivated successfully.",
                f"{UNIT}: Consumed N CPU time.",
            ]
    for mode in TWICE:
        for host in _hosts(mode):
            result = "oom-kill" if mode == "heap-swell" else "exit-code"
            oom = [f"{UNIT}: A process of this unit has been killed by the OOM killer."]
            attempt = [STARTED, *(oom if mode == "heap-swell" else []), EXITED_1]
            assert _systemd(mode, host) == [
                *attempt,
                *_failure(result),
                *_restart(1),
                *attempt,
                *_failure(result),
                *_restart(2),
                f"{UNIT}: Start request repeated too quickly.",
                f"{UNIT}: Failed with result '{result}'.",
                f"Failed to start {UNIT} - OCR training.",
            ], (mode, host)
    for mode in ("stop-sweep", "late-flush"):
        assert _systemd(mode, "trainhost") == [
            STARTED,
            f"Stopping {UNIT} - OCR training...",
            EXITED_1,
            f"{UNIT}: Failed with result 'exit-code'.",
            f"Stopped {UNIT} - OCR training.",
            f"{UNIT}: Consumed N CPU time.",
        ]
    # node1 finished; node0 failed, restarted, and waited for node1 until the operator stopped
    # it: torchrun, blocked in the rendezvous, did not answer SIGTERM
    assert _systemd("short-shard", "trainhost1") == _systemd("calm-glyph", "trainhost")
    killed = re.fullmatch(
        rf"{UNIT}: Killing process \d+ \(pt_elastic\) with signal SIGKILL\.",
        _systemd("short-shard", "trainhost0")[-5],
    )
    assert killed and _systemd("short-shard", "trainhost0") == [
        STARTED,
        EXITED_1,
        *_failure("exit-code"),
        *_restart(1),
        STARTED,
        f"Stopping {UNIT} - OCR training...",
        f"{UNIT}: State 'stop-sigterm' timed out. Killing.",
        killed.group(0),
        f"{UNIT}: Main process exited, code=killed, status=9/KILL",
        f"{UNIT}: Failed with result 'timeout'.",
        f"Stopped {UNIT} - OCR training.",
        f"{UNIT}: Consumed N CPU time.",
    ]
    assert _attempts("short-shard", "trainhost0")[1:] == []  # the restart printed nothing


def test_what_the_healthy_runs_print() -> None:
    calm = _service("calm-glyph")
    assert calm.count("ppocr INFO: cur metric, acc: ") == 2  # global steps 20 and 40
    assert re.findall(r"^\[\d+B blob data\]$", calm, re.M) == ["[278B blob data]"] * 2
    last = calm.splitlines()[-3:]
    assert last[0].endswith("ppocr INFO: save model in ./output/rec/latest")
    assert last[1].endswith("ppocr INFO: save model in ./output/rec/iter_epoch_3")
    assert "ppocr INFO: best metric, acc: 0.0, norm_edit_dis: " in last[2]
    assert "Traceback" not in calm and "OMP_NUM_THREADS" not in calm
    loud0, loud1 = (_service("loud-glyph", h) for h in ("trainhost0", "trainhost1"))
    for text in (loud0, loud1):
        assert "Setting OMP_NUM_THREADS environment variable for each process" in text
        assert "UserWarning: This DataLoader will create 4 worker processes in total." in text
    assert "ppocr INFO: best metric" in loud0 and "ppocr" not in loud1  # ranks 2, 3 at ERROR
    # SimpleDataSet's skipped sample: its first line shares a journal line with the tqdm bar
    assert "[126B blob data]\n, error happened with msg: Traceback (most recent call last):" in (
        loud0
    )
    assert "FileNotFoundError: [Errno 2] No such file or directory: " in loud0
    assert "'./train_data/rec/val/word_0017.npy'" in loud0 and "ppocr ERROR" not in loud0


def test_the_faults_in_the_data_and_the_code() -> None:
    for text in _attempts("torn-crop", "trainhost"):
        assert "[rank1]: ValueError: Caught ValueError in DataLoader worker process 0." in text
        assert (
            "[rank1]: ValueError: Failed to read all data for array. Expected (32, 100, 3) = 9600 "
            "elements, could only read 3968 elements. (file seems not fully written?)"
        ) in text
        assert "epoch: [1/3], global_step: 10," in text and "global_step: 15," not in text
    for text in _attempts("dict-gone", "trainhost1"):
        for rank in (2, 3):
            assert (
                f"[rank{rank}]: FileNotFoundError: [Errno 2] No such file or directory: "
                "'ppocr/utils/dict/serial_dict.txt'"
            ) in text
    assert "FileNotFoundError" not in _service("dict-gone", "trainhost0")
    for text in _attempts("null-stroke", "trainhost1"):
        assert re.search(r"failed \(exitcode: -11\) local_rank: 0 \(pid: \d+\)", text)
        assert re.search(r"rank      : 2 \(local_rank: 0\)\n  exitcode  : -11 ", text)
        assert re.search(r"rank      : 3 \(local_rank: 1\)\n  exitcode  : -9 ", text)
        assert "main proc " in text and "[rank2]" not in text
    for text in _attempts("lone-norm", "trainhost"):
        assert "op.preamble.length <= op.nbytes. 150068 vs 8." in text
        assert re.search(r"rank      : 0 \(local_rank: 0\)\n  exitcode  : -6 ", text)
    for text in _attempts("blank-ink", "trainhost"):
        assert (
            "[rank1]: FloatingPointError: loss is nan at epoch 1, global_step 7: stop training"
            in (text)
        )
    for text in _attempts("best-scalar", "trainhost"):
        for rank in (0, 1):
            assert (
                f"[rank{rank}]: \tWeightsUnpickler error: Unsupported global: GLOBAL "
                "numpy._core.multiarray.scalar was not an allowed global by default."
            ) in text
        # 'Weights only load failed ...' holds torch's bold escape codes: journalctl's blob
        assert text.count("[193B blob data]") == 2 and "Weights only load failed" not in text
    for text in _attempts("root-cwd", "trainhost"):
        assert (
            text.count(
                "/repo/.venv/bin/python3: can't open file '//tools/train.py': [Errno 2] No such "
                "file or directory"
            )
            == 2
        )
        assert " repo/.venv/lib/python3.11/site-packages/torch/distributed/" in text


def test_the_killed_the_stuck_the_busy_and_the_stopped() -> None:
    swell = RUNS.text("heap-swell", "journal-trainhost.txt")
    for text in _attempts("heap-swell", "trainhost"):
        sent = re.findall(r"Sending process (\d+) closing signal SIGTERM", text)
        answered = re.findall(r"main proc (\d+) exit, kill process group \1", text)
        assert len(sent) == 2 and answered == sent[:1]  # rank 1, the OOM killer's, was gone
        assert "Received 15 death signal, shutting down workers" in text
        assert "exitcode" not in text
    assert swell.index("killed by the OOM killer") < swell.index("Received 15 death signal")
    for text in _attempts("list-choke", "trainhost"):
        assert "train set manifest" not in text and "ppocr INFO: profiler_options" in text
        assert "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/" in (
            text
        )
        assert "Timed out waiting 20000ms for send operation to complete" in text
        assert "[rank0]" not in text
    for text in _attempts("lone-target", "trainhost"):
        assert text.count("ppocr INFO: cur metric, acc: 0.0") == 2
        assert "ppocr INFO: acc has not improved for 2 evaluations, stop training" in text
        assert "[rank1]:     avg_loss.backward()" in text and "[rank0]" not in text
    for text in _attempts("slow-eval", "trainhost0"):
        assert re.search(r"^\[1\.\dK blob data\]$", text, re.M)  # rank 0's evaluation bar
        assert re.search(r"main proc (\d+) exit, kill process group \1", text)
        assert "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/" in (
            text
        )
    for text in _attempts("slow-eval", "trainhost1"):
        assert text.count("Timed out waiting 20000ms for recv operation to complete") == 2
    stop = _service("stop-sweep")
    assert "epoch: [2/30], global_step: 25," in stop and "global_step: 35," not in stop
    assert len(re.findall(r"^main proc (\d+) exit, kill process group \1$", stop, re.M)) == 2
    assert "SignalException: Process " in stop and "got signal: 15" in stop
    flush = _entries("late-flush", "trainhost")
    i = next(k for k, m in enumerate(flush) if m["msg"].startswith("Stopping "))
    assert "ppocr INFO: best metric, acc: " in flush[i - 1]["msg"]
    assert "save model in ./output/rec/iter_epoch_3" in flush[i - 2]["msg"]
    gap = (
        datetime.fromisoformat(flush[i]["stamp"]) - datetime.fromisoformat(flush[i - 1]["stamp"])
    ).total_seconds()
    assert gap >= 40
    assert len(re.findall("Sending process", _service("late-flush"))) == 1  # rank 1 had exited
    shard1 = _service("short-shard", "trainhost1")
    assert "Error waiting on exit barrier." in shard1 and "ppocr" not in shard1
    shard0 = _service("short-shard", "trainhost0")
    assert "epoch: [3/3], global_step: 20," in shard0 and "train dataloader has 10 iters" in shard0
    for rank in (0, 1):
        assert f"[rank{rank}]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/" in shard0
