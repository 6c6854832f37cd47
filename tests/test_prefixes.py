"""Every line prefix format we claim to strip, on lines copied from real logs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.analysis.scanner import Scanner
from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.ingest.sources import Input
from ddpdoctor.rules.registry import all_rules


@pytest.mark.parametrize(
    ("line", "text", "rank", "local_rank", "host"),
    [
        # torchrun [rankN]: with nested glog (torch >= 2.2)
        (
            "[rank0]:[E1130 12:00:00.123456 1234 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught",
            "[Rank 0] Watchdog caught",
            0,
            None,
            None,
        ),
        # torchrun default role prefix: local rank
        (
            "[default1]:Traceback (most recent call last):",
            "Traceback (most recent call last):",
            None,
            1,
            None,
        ),
        # custom role
        ("[trainer3]:loss=0.5", "loss=0.5", None, 3, None),
        # TorchX's local scheduler: role/replica, then torchrun's role-less local rank
        # (hundredsecond-*, corpus case 269)
        ("train/0 [1]:epoch 2 loss 0.31", "epoch 2 loss 0.31", None, 1, "train/0"),
        ("trainer/1 [default0]:x", "x", None, 0, "trainer/1"),
        ("train/0 [1]:[rank1]: RuntimeError: x", "RuntimeError: x", 1, 1, "train/0"),
        # torchelastic's failure summary heads each entry with a bare '[1]:': not a prefix
        ("[1]:", "[1]:", None, None, None),
        # a path before a bracket that is no torchrun prefix
        ("usr/1 [x] no", "usr/1 [x] no", None, None, None),
        # NCCL debug line: host, pid, device
        (
            "asr-ddp-7f3k-train-job0-w-0:15325:16199 [2] NCCL INFO [Service thread] Connection closed by localRank 2",
            "NCCL INFO [Service thread] Connection closed by localRank 2",
            None,
            2,
            "asr-ddp-7f3k-train-job0-w-0",
        ),
        # Slurm srun --label, space padded
        (
            " 3: Traceback (most recent call last):",
            "Traceback (most recent call last):",
            3,
            None,
            None,
        ),
        ("12: RuntimeError: boom", "RuntimeError: boom", 12, None, None),
        # pdsh / DeepSpeed host prefix, nested torchrun prefix
        ("worker-1: [rank2]: RuntimeError: x", "RuntimeError: x", 2, None, "worker-1"),
        # GNU parallel's --tag (set 166): the job's node and a tab
        ("node1\t[rank3]: RuntimeError: x", "RuntimeError: x", 3, None, "node1"),
        # pdsh with a hostfile of addresses (corpus cases 207, 808)
        ("10.42.7.33: [rank2]: RuntimeError: x", "RuntimeError: x", 2, None, "10.42.7.33"),
        # argparse line must not be taken for a host prefix
        (
            "train.py: error: unrecognized arguments: --local-rank=4",
            "train.py: error: unrecognized arguments: --local-rank=4",
            None,
            None,
            None,
        ),
        ("RuntimeError: CUDA error: x", "RuntimeError: CUDA error: x", None, None, None),
        # capture platform tag
        (
            "[stderr]ModuleNotFoundError: No module named 'x'",
            "ModuleNotFoundError: No module named 'x'",
            None,
            None,
            None,
        ),
        # a program that names its rank at line start
        ("Rank 4 finished", "Rank 4 finished", 4, None, None),
        # docker compose / SageMaker local mode: the container is the host (corpus case 428)
        (
            "x7kq2m91ab-algo-1-r4t8w |  Process name: [[31907,1],2]",
            " Process name: [[31907,1],2]",
            None,
            None,
            "x7kq2m91ab-algo-1-r4t8w",
        ),
        # Lightning's model summary table is not a container prefix
        ("0 | model   | ResNet | 11.2 M", "0 | model   | ResNet | 11.2 M", None, None, None),
        # Ray's log monitor: the worker's process and node, never its rank (corpus cases 254,
        # 423, 233); torch's own prefix may follow
        (
            "(RayTrainWorker pid=48213) /pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: "
            "indexSelectLargeIndex: block: [22,0,0], thread: [96,0,0] Assertion",
            "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectLargeIndex: block: "
            "[22,0,0], thread: [96,0,0] Assertion",
            None,
            None,
            None,
        ),
        (
            "(ReferenceModelRayActor pid=3317, ip=10.20.3.14) [rank3]:RuntimeError: x",
            "RuntimeError: x",
            3,
            None,
            "10.20.3.14",
        ),
        ("(raylet) A worker died or was killed", "A worker died or was killed", None, None, None),
        # Ray's deduplication suffix stays: a parsed message is always a suffix of its line
        (
            "(CriticModelRayActor pid=602788) Some weights were not initialized [repeated 7x "
            "across cluster]",
            "Some weights were not initialized [repeated 7x across cluster]",
            None,
            None,
            None,
        ),
        # torchtitan's logger: its name in brackets, then the time (tests/fixtures/real/
        # twelfth-*); a bracketed word with no time after it is the program's own text
        (
            "[titan] 2026-12-02 10:09:01,048 - root - INFO - Training completed",
            "root - INFO - Training completed",
            None,
            None,
            None,
        ),
        ("[titan] hello", "[titan] hello", None, None, None),
        # Hydra's job logging glues time, logger and level (tests/fixtures/real/twentysixth-*),
        # also behind torchrun's prefix; a bracketed time with text after it stays as before
        (
            "[2026-12-03 05:57:26,366][__main__][INFO] - epoch 1 step 4/12 loss 0.7",
            "epoch 1 step 4/12 loss 0.7",
            None,
            None,
            None,
        ),
        ("[rank1]:[2026-12-03 05:57:26,366][__main__][ERROR] - boom", "boom", 1, None, None),
        (
            "[2026-12-03 05:57:26,366][note] x",
            "[2026-12-03 05:57:26,366][note] x",
            None,
            None,
            None,
        ),
        # horovodrun's gloo launcher tags lines with the rank alone
        ("[3]<stderr>:RuntimeError: x", "RuntimeError: x", 3, None, None),
        # a parenthesis of the program's own is not Ray's
        ("(epoch 3) loss 0.5", "(epoch 3) loss 0.5", None, None, None),
        # kubectl logs --prefix, then torchrun's prefix
        (
            "[pod/train-worker-1/pytorch] [rank3]:Traceback (most recent call last):",
            "Traceback (most recent call last):",
            3,
            None,
            "train-worker-1",
        ),
        # Composer's and llm-foundry's logging format (tests/fixtures/real/fortysecond-*)
        (
            "2026-12-04 07:03:54,083: rank0[13309][MainThread]: INFO: __main__: Done.",
            "Done.",
            0,
            None,
            None,
        ),
        (
            "2026-12-04 07:01:37,697: rank1[6376][MainThread]: INFO: trainer.callbacks."
            "checkpoint_saver: Saving checkpoint to ./ckpt/ep1-ba8-rank1.pt",
            "Saving checkpoint to ./ckpt/ep1-ba8-rank1.pt",
            1,
            None,
            None,
        ),
        # a program's own 'rank0[...]' that is not that header stays its text
        ("rank0[ok] all good", "rank0[ok] all good", None, None, None),
        # Determined's task logs (set 108; the form of real `det trial logs`): its time, the
        # container (the node), the rank its launch layer adds, two bars
        (
            "[2026-12-06T11:53:21.548721Z] f1b4ae76 [rank=1] || [rank1]: Traceback (most "
            "recent call last):",
            "Traceback (most recent call last):",
            1,
            None,
            "f1b4ae76",
        ),
        (
            "[2024-03-15T16:29:06.552162Z] 5c902731 [rank=0] || INFO: [62] determined.core: "
            "report_training_metrics(steps_completed=100)",
            "INFO: [62] determined.core: report_training_metrics(steps_completed=100)",
            0,
            None,
            "5c902731",
        ),
        # the container's own line, the master's (no container), a paste without times
        (
            "[2026-12-06T11:53:13.408324Z] f1b4ae76 || + test -f startup-hook.sh",
            "+ test -f startup-hook.sh",
            None,
            None,
            "f1b4ae76",
        ),
        (
            "[2026-12-06T11:53:12.975579Z]          || INFO: Scheduling Trial 18",
            "INFO: Scheduling Trial 18",
            None,
            None,
            None,
        ),
        ("[rank=1] || Training in distributed mode", "Training in distributed mode", 1, None, None),
        # bars without a time before them are a program's own
        ("deadbeef || x", "deadbeef || x", None, None, None),
        # ParlAI: a spawned worker's prefix, then the time of day and a level cut to four
        # letters; the main process's info lines, the time before a bar
        (
            "rank:  1 | 21:48:14 CRIT | Traceback (most recent call last):",
            "Traceback (most recent call last):",
            1,
            None,
            None,
        ),
        (
            "21:48:16 | loading dictionary from /tmp/model.dict",
            "loading dictionary from /tmp/model.dict",
            None,
            None,
            None,
        ),
        # a message's own clock with no bar or level after it stays
        ("12:00:01 the run started", "12:00:01 the run started", None, None, None),
    ],
)
def test_prefix_stripping(
    line: str, text: str, rank: int | None, local_rank: int | None, host: str | None
) -> None:
    parsed = parse_line(line, 2026)
    assert parsed.text == text
    assert parsed.origin.rank == rank
    assert parsed.origin.local_rank == local_rank
    assert parsed.origin.host == host


def test_glog_launcher_line_time_level_pid() -> None:
    p = parse_line(
        "W1130 09:09:31.210000 9401 torch/distributed/elastic/multiprocessing/api.py:900] "
        "Sending process 9402 closing signal SIGTERM",
        2026,
    )
    assert p.text == "Sending process 9402 closing signal SIGTERM"
    assert p.level == "warning"
    assert p.origin.pid == 9401
    assert p.time == datetime(2026, 11, 30, 9, 9, 31, 210000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        # torchtitan 0.3.0's '[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s'
        (
            "[rank3]:[titan] 2026-12-05 19:58:56,376 - root - WARNING - Ran out of data; last "
            "step was canceled.",
            "warning",
        ),
        ("2026-12-05 19:58:56,376 - trainer.ckpt - ERROR - could not save", "error"),
        # a message that only names a level in its words
        ("2026-12-05 19:58:56,376 - the ERROR - rate is fine", None),
    ],
)
def test_logger_name_then_level(line: str, level: str | None) -> None:
    assert parse_line(line).level == level


@pytest.mark.parametrize(
    ("line", "task"),
    [
        # srun --label's task behind a log collector's stamp: Kubernetes' (RFC 3339, nanoseconds),
        # CloudWatch's export (a tab after the time), journald's header
        ("2024-05-01T10:00:00.123456789Z 0: soundstream total loss: 19.874", 0),
        ("2024-05-01T10:00:00.123Z\t3: RuntimeError: boom", 3),
        ("Dec 03 16:45:33 node7 python3[4242]: 2: Mini_epoch 23 of 24: save_model.", 2),
        # moreutils' `ts` (a syslog time alone) and a collector's stream tag
        ("Dec 05 10:00:01 2: Mini_epoch 23 of 24: save_model.", 2),
        ("[stderr] 3: RuntimeError: boom", 3),
        # not after a program's own time (Python logging's asctime)
        ("2024-05-01 10:00:00,123 1: loss 0.5", None),
    ],
)
def test_srun_label_after_a_collectors_stamp(line: str, task: int | None) -> None:
    assert parse_line(line).task == task


@pytest.mark.parametrize(
    ("line", "task"),
    [
        ("3: RuntimeError: boom", 3),
        # padded to the width of the largest task id (12 tasks, 120 tasks)
        (" 3: RuntimeError: boom", 3),
        ("  7: RuntimeError: boom", 7),
        # a numbered listing indented further than any label (DeepSpeed's pipeline partition,
        # tests/fixtures/real/hundredfiftythird-*)
        ("     5: LMHeadPipe", None),
        ("    12: ParallelTransformerLayerPipe", None),
    ],
)
def test_srun_label_is_padded_to_five_characters_at_most(line: str, task: int | None) -> None:
    assert parse_line(line).task == task


def test_gcloud_stream_logs_name_the_replica_not_a_level() -> None:
    """`gcloud ai custom-jobs stream-logs`: severity, time and task name, tab-separated; the
    severity is the stream's (stderr is ERROR), the line's own logger says its level."""
    p = parse_line("ERROR\t2026-12-07 12:35:52 +0000\tworkerpool1-0\tINFO:root:rank 1 of 4")
    assert (p.origin.host, p.level, p.text) == ("workerpool1-0", "info", "INFO:root:rank 1 of 4")
    assert p.time is not None and p.prefix == "workerpool1-0"


def test_old_bracket_glog() -> None:
    p = parse_line(
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout"
    )
    assert p.level == "error"
    assert p.origin.rank == 2
    assert p.text.startswith("[Rank 2] Watchdog")


def test_kubernetes_rfc3339_and_python_logging() -> None:
    p = parse_line("2024-01-01T10:00:00.123456789Z [default1]:hello")
    assert p.text == "hello"
    assert p.origin.local_rank == 1
    assert p.time is not None and p.time.tzinfo is not None
    q = parse_line(
        "[2024-10-28 06:14:36,059] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending"
    )
    assert q.time == datetime(2024, 10, 28, 6, 14, 36, 59000, tzinfo=UTC)
    assert q.text.startswith("torch.distributed.elastic")


def test_platform_tags_after_timestamp() -> None:
    p = parse_line(
        "2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [1ae524d8-cda9-41ec-98e0-e919977e7830]"
        '   File "/opt/conda/lib/python3.7/site-packages/torch/serialization.py", line 379, in save'
    )
    assert p.text.startswith('  File "/opt/conda')


def test_ansi_and_carriage_return_progress() -> None:
    p = parse_line("\x1b[31m[rank1]:\x1b[0m epoch 1:  10%|#  | 1/10\r epoch 1:  20%|## | 2/10\r")
    assert p.origin.rank == 1
    assert "20%" in p.text and "10%" not in p.text


def test_nul_bytes_and_huge_line_are_tolerated() -> None:
    p = parse_line("abc\x00def" + "x" * 100_000)
    assert "\x00" not in p.text
    assert len(p.text) <= 4000


PREFIX_PIECES = [
    "[rank3]:",
    "[default0]:",
    "2023-01-02 03:04:05,123 ",
    "2023-01-02T03:04:05.123Z ",
    "E1130 12:00:00.123456 1234 ProcessGroupNCCL.cpp:616] ",
    "[E ProcessGroupNCCL.cpp:475] ",
    "[I1130 12:00:00 1 a.cpp:1] ",
    "host-1:11:12 [0] ",
    "[pod/train-1/c] ",
    "[stderr] ",
    " 12: ",
    "worker-1: ",
    "[177/train (pid 1)] ",
    "INFO:root:",
    "[",
    "[p",
    "[s",
    "[E",
    "[1",
    "\x1b[31m",
]
MESSAGES = [
    "Traceback (most recent call last):",
    "NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1b000",
    "rank 3 step 10 loss 0.5",
    "  14%|#   | 2805/20000 [15:35<95:31,  3.01it/s]",
    "[Rank 1] Watchdog caught collective operation timeout",
    "",
]


@given(
    st.lists(st.sampled_from(PREFIX_PIECES), max_size=4),
    st.sampled_from(MESSAGES) | st.text(max_size=40),
)
def test_parsing_without_time_changes_nothing_else(pieces: list[str], message: str) -> None:
    """The tail sample skips time parsing for speed; what it keeps must be what a full parse
    gives (writer, prefix, level, text)."""
    line = "".join(pieces) + message
    full = parse_line(line, 2026)
    quick = parse_line(line, 2026, with_time=False)
    assert quick.time is None
    assert (quick.text, quick.origin, quick.level, quick.prefix, quick.rank_from_text) == (
        full.text,
        full.origin,
        full.level,
        full.prefix,
        full.rank_from_text,
    )


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ('{"rank": 2, "t": 1.73, "epoch": 0, "it": 3, "loss": 0.6856}', 2),
        ('{"step": 5, "global_rank": 3, "loss": 0.1}', 3),
        ('{"ranking": 3, "score": 0.5}', None),  # another field
        ('{"rank": "best", "score": 0.5}', None),  # not a number
        ('loss {"rank": 1}', None),  # a JSON line starts with its brace
    ],
)
def test_a_json_line_names_its_rank(line: str, rank: int | None) -> None:
    parsed = parse_line(line)
    assert parsed.origin.rank == rank
    assert parsed.rank_from_text == (rank is not None)


def test_the_rank_waiting_for_the_nccl_id_is_the_one_named_in_brackets() -> None:
    line = (
        "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
        "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got "
        "error: Socket Timeout"
    )
    parsed = parse_line(line)
    assert (parsed.origin.rank, parsed.rank_from_text) == (1, True)


@pytest.mark.parametrize(
    ("line", "rank", "local"),
    [
        ("Rank 1/4: epoch 2 done", 1, None),
        ("[rank1/4] step 10 loss 0.5", 1, None),
        ("rank#3 saving", 3, None),
        ("INFO [proc 12070] rank 2 | step 5", 2, None),
        # Lightning's rank_prefixed_message, and a colon and a space before the number
        ("[rank: 1] Received SIGTERM: 15", 1, None),
        ("Rank: 3 | step 10", 3, None),
        # the device index in the rank's place is its local rank (mp.spawn's `gpu` argument)
        ("gpu 1 | evaluating on the held-out set", None, 1),
        ("INFO [proc 12070] gpu 2 | epoch 0 step 4 loss 0.69", None, 2),
        ("[GPU 3] step 7", None, 3),
        ("LOCAL_RANK: 1 - CUDA_VISIBLE_DEVICES: [0,1]", None, 1),
        # near misses: a device listing, a rank named inside a sentence, a launcher prefix first
        ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1234)", None, None),
        ("Waiting for rank 3 to join", None, None),
        ("INFO: waiting for gpu 1 | retrying", None, None),
        ("worker 2: step 5", None, None),
    ],
)
def test_a_program_names_its_rank_or_device_first(
    line: str, rank: int | None, local: int | None
) -> None:
    parsed = parse_line(line)
    assert (parsed.origin.rank, parsed.origin.local_rank) == (rank, local)
    assert parsed.rank_from_text == (rank is not None or local is not None)


def test_a_launcher_prefix_outranks_the_device_in_the_text() -> None:
    parsed = parse_line("[default0]:gpu 1 | step 3")
    assert (parsed.origin.local_rank, parsed.rank_from_text) == (0, False)


@pytest.mark.parametrize(
    ("line", "rank", "level"),
    [
        (
            "2026-12-02T03:56:14.587Z vm [worker 1] WARNING fourth.trainer | fetch failed",
            1,
            "warning",
        ),
        ("node3 [rank 5] INFO step 10", 5, "info"),
        ("[Worker 2/4] step 7", 2, None),
        # near misses: a tag inside prose, a DataLoader worker, a host without a level after
        ("Waiting [rank 3] to join", None, None),
        ("DataLoader worker (pid 123) is killed by signal: Killed.", None, None),
        ("node3 [rank 5] step 10", None, None),
    ],
)
def test_a_bracketed_rank_tag_names_the_writer(
    line: str, rank: int | None, level: str | None
) -> None:
    parsed = parse_line(line)
    assert (parsed.origin.rank, parsed.level) == (rank, level)


def test_the_transformers_examples_logging_format_is_read() -> None:
    """datefmt '%m/%d/%Y %H:%M:%S', then ' - LEVEL - name - ', and an upper-case rank tag."""
    parsed = parse_line(
        "12/02/2026 04:17:54 - WARNING - tokcls.train - [RANK 0] could not push metrics"
    )
    assert (parsed.time is not None, parsed.level, parsed.origin.rank) == (True, "warning", 0)
    assert parsed.time is not None and (parsed.time.month, parsed.time.day) == (12, 2)
    day_first = parse_line("31/12/2026 04:17:54 - INFO - x - y")  # a month cannot be 31
    assert day_first.time is not None and (day_first.time.month, day_first.time.day) == (12, 31)


def test_the_store_barrier_names_the_rank_that_waits() -> None:
    line = (
        "INFO:root:Waiting in store based barrier to initialize process group for rank: 5, key: "
        "store_based_barrier_key:1 (world_size=8, worker_count=7, timeout=0:30:00)"
    )
    parsed = parse_line(line)
    assert (parsed.origin.rank, parsed.rank_from_text) == (5, True)


def test_a_ray_worker_prefix_names_its_process_and_node_not_a_rank() -> None:
    """Each Ray worker is a writer of its own (its pid), on the node of its ip; the rank comes
    only from what follows (torch's [rankN]: prefix, the program's words)."""
    parsed = parse_line("(RayTrainWorker pid=4242, ip=10.0.0.7) Epoch 1: loss 0.31", 2026)
    assert (parsed.origin.pid, parsed.origin.host, parsed.origin.rank) == (4242, "10.0.0.7", None)
    assert parsed.prefix == "(RayTrainWorker pid=4242, ip=10.0.0.7)"
    assert parsed.text == "Epoch 1: loss 0.31"


@pytest.mark.parametrize(
    ("line", "host", "rank", "text"),
    [
        # SkyPilot's console (sky launch --num-nodes 2): the node, then the worker's own tag
        (
            "(worker1, rank=1, pid=15089, ip=10.0.0.12) [rank2]: Traceback (most recent call "
            "last):",
            "10.0.0.12",
            2,
            "Traceback (most recent call last):",
        ),
        (
            "(head, rank=0, pid=15079, ip=10.0.0.11) 2026-12-04 20:04:26,091 - INFO - trainer - "
            "Epoch 1/3 step 4/8 loss 0.6532",
            "10.0.0.11",
            None,
            "Epoch 1/3 step 4/8 loss 0.6532",
        ),
        # without its address the node's name is the host
        ("(head, rank=0, pid=2342) [rank1]: x", "head", 1, "x"),
    ],
)
def test_a_skypilot_node_prefix_names_the_node_not_a_rank(
    line: str, host: str, rank: int | None, text: str
) -> None:
    """SkyPilot's 'rank' is the node's and its pid the node's run script: the node is the
    writer's host, the worker's rank comes only from what follows (ingest/prefixes.py)."""
    parsed = parse_line(line, 2026)
    assert (parsed.origin.host, parsed.origin.rank, parsed.origin.pid) == (host, rank, None)
    assert parsed.text.endswith(text) and not parsed.text.startswith("(")


def test_a_fedml_prefix_names_the_rank_and_its_time() -> None:
    """FedML's logger opens each line with the process's role and id (the server 0, client k
    rank k in its simulations), then its time, level and caller
    (tests/fixtures/real/eightysixth-*); a cross-silo client's own processes share the id and
    add @replica-rank-N, so that id is no rank."""
    parsed = parse_line(
        "[FedML-Client(2) @device-id-2] [Sun, 06 Dec 2026 02:13:02] [INFO] "
        "[fedavg.py:251:client] client_idx = 2, local_sample_number = 445",
        2026,
    )
    assert parsed.origin.rank == 2 and parsed.level == "info"
    assert parsed.time is not None and parsed.time.isoformat() == "2026-12-06T02:13:02+00:00"
    assert parsed.text == "client_idx = 2, local_sample_number = 445"
    server = parse_line(
        "[FedML-Server(0) @device-id-0] [Sat, 27 Aug 2022 23:23:51] [INFO] [x.py:28:run] ok"
    )
    assert server.origin.rank == 0 and server.text == "ok"
    replica = parse_line("[FedML-Client(1) @device-id-1 @replica-rank-3] [INFO] [a.py:1:f] go")
    assert replica.origin.rank is None


def test_torchbeasts_format_gives_level_pid_and_time() -> None:
    """TorchBeast's '[%(levelname)s:%(process)d %(module)s:%(lineno)d %(asctime)s] '
    (tests/fixtures/real/ninetysecond-*): the process, not a rank."""
    parsed = parse_line("[INFO:348 monobeast:442 2026-12-06 03:26:33,893] Learning finished.")
    assert (parsed.level, parsed.origin.pid, parsed.origin.rank) == ("info", 348, None)
    assert parsed.text == "Learning finished." and parsed.time is not None


def test_a_json_log_line_gives_its_time_level_and_pod() -> None:
    """A structured line as the sixteenth set's pods wrote it (tests/fixtures/real/sixteenth-
    pod-evict): its own fields say when, how bad and which pod; its rank field names the
    rank. Its message is the text the rules read (ingest/json_lines.py)."""
    line = (
        '{"ts": "2026-12-02T12:57:16.479+00:00", "level": "WARNING", "pod": '
        '"train-ddp-worker-1", "rank": 2, "logger": "trainer", "msg": "SIGTERM received: pod '
        'is terminating, checkpointing before exit"}'
    )
    parsed = parse_line(line)
    assert parsed.time == datetime(2026, 12, 2, 12, 57, 16, 479000, tzinfo=UTC)
    assert parsed.level == "warning"
    assert parsed.origin.host == "train-ddp-worker-1" and parsed.origin.rank == 2
    assert parsed.text == "SIGTERM received: pod is terminating, checkpointing before exit"


def test_a_json_value_is_not_a_field_of_the_line() -> None:
    """Only the line's own keys count: a message that quotes "time" gives no time."""
    parsed = parse_line('{"msg": "step took time 2026-12-02T12:57:16 to run", "lvl": "x"}')
    assert parsed.time is None and parsed.level is None and parsed.origin.host is None


def test_a_line_printed_right_after_a_redrawn_bar_is_that_line() -> None:
    """tqdm ends a redraw without a newline: the next record any writer prints starts right
    after the bar's closing bracket (real: tests/fixtures/real/twentysecond-nan-break-one)."""
    bar = "Steps:  38%|###8      | 6/16 [00:00<00:00, 22.77it/s, lr=0.0001, step_loss=1.05]"
    record = "12/02/2026 15:55:05 - ERROR - __main__ - [RANK 1] Loss is nan at step 7, stopping"
    parsed = parse_line(bar + "\r" + bar.replace("6/16", "7/16") + record)
    assert (parsed.origin.rank, parsed.level) == (1, "error")
    assert parsed.text.endswith("Loss is nan at step 7, stopping")
    outer = parse_line("[default1]:" + bar + "\r" + bar + record)
    assert outer.prefix.startswith("[default1]:") and outer.text.endswith("stopping")
    # the bar's last redraw is kept beside it, with the outer prefix: its writer's progress
    assert parsed.bar_line == bar.replace("6/16", "7/16")
    assert outer.bar_line == "[default1]:" + bar
    assert parse_line(bar + "\r" + bar).bar_line is None


def test_a_bar_that_another_writer_printed_onto_still_shows_training_ran(tmp_path: Path) -> None:
    """Real (tests/fixtures/real/fortyfifth-lopsided-split): rank 0's bar at 27/40, then
    gloo's abort of another rank printed onto its last redraw. The bar is progress of its
    writer: training had run when the abort came."""
    bar = "Epoch 01:  68%|######7   | 27/40 [00:00<00:00, 44.68it/s]"
    abort = "terminate called after throwing an instance of 'gloo::EnforceNotMet'"
    log = tmp_path / "console.log"
    log.write_text(f"{bar.replace('27/40', '1/40')}\r{bar}{abort}\n")
    scanner = Scanner([r for r in all_rules() if r.signatures])
    streams = scanner.scan(Input(str(log), str(log))).streams.values()
    assert sum(s.progress_lines for s in streams) == 1
    assert any(s.last_text == abort for s in streams)


def test_a_bar_without_a_carriage_return_keeps_its_progress() -> None:
    """A paste that lost the \\r: the bar is the line's only state of progress; a bar alone,
    or its last redraw with nothing after it, stays a bar."""
    bar = "Map:  20%|##        | 281400/1402715 [33:12<2:12:38, 140.90 examples/s]"
    assert parse_line(bar + "Traceback (most recent call last):").text.startswith("Map:  20%")
    assert parse_line(bar + "\r" + bar).text == bar


def test_hydra_job_logging_gives_time_and_level() -> None:
    parsed = parse_line("[2026-12-03 05:57:26,366][torch.distributed][WARNING] - x", 2026)
    assert (parsed.text, parsed.level) == ("x", "warning")
    assert parsed.time is not None and parsed.time.isoformat().startswith("2026-12-03T05:57:26")


def test_pyslowfast_header_gives_time_level_and_strips_the_caller() -> None:
    """PySlowFast's '[%(asctime)s][%(levelname)s] %(filename)s: %(lineno)4d: ' with datefmt
    '%m/%d %H:%M:%S' (tests/fixtures/real/fiftyfirst-*): the message starts after the line."""
    line = "[12/04 14:18:26][INFO] train_net.py:  818: training done: Top1 Acc: 41.67"
    parsed = parse_line(line, 2026)
    assert (parsed.level, parsed.text) == ("info", "training done: Top1 Acc: 41.67")
    assert parsed.time is not None and parsed.time.isoformat().startswith("2026-12-04T14:18:26")


def test_lm_eval_datefmt_gives_time_level_and_the_rank_named_after_the_caller() -> None:
    """lm-evaluation-harness logs with datefmt '%Y-%m-%d:%H:%M:%S' (a colon between date and
    time), the level padded, then the caller (tests/fixtures/real/fortyninth-*)."""
    line = (
        "2026-12-04:13:38:27,804 ERROR    [fortyninth_style_train.py:274] rank 2: nll is nan "
        "for doc_id [41] at batch 3; stopping"
    )
    parsed = parse_line(line, 2026)
    assert (parsed.level, parsed.origin.rank) == ("error", 2)
    assert parsed.time is not None and parsed.time.isoformat().startswith("2026-12-04T13:38:27")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        # rich.traceback (rich 15) as a program with rich.traceback.install() prints it
        (
            "╭──────────── Traceback (most recent call last) ────────────╮",
            "Traceback (most recent call last):",
        ),
        (
            "│ /tmp/richtb.py:8 in main                                   │",
            '  File "/tmp/richtb.py", line 8, in main',
        ),
        (
            '[rank1]:│ ❱  8 │   load("/data/missing/train.csv")             │',
            '    ❱  8 │   load("/data/missing/train.csv")',
        ),
        ("╰────────────────────────────────────────────────────────────╯", ""),
        # a box of the program's own that is no traceback keeps its text
        ("╭─── Summary ───╮", "╭─── Summary ───╮"),
    ],
)
def test_rich_boxed_traceback_lines_read_as_pythons(line: str, text: str) -> None:
    assert parse_line(line, 2026).text == text


def test_rich_handler_records_give_time_level_and_rank_without_the_caller_column() -> None:
    """rich.logging.RichHandler (rich 15, COLUMNS=100): the time column, blank when the time
    repeats, the level column, the caller's file:line right-aligned; under a record, the
    traceback box and the exception line are indented by both columns."""
    head = parse_line(
        "[12/03/26 06:30:02] INFO     [rank 0] epoch 1 step 4/12 loss 0.71"
        "                       richlog.py:5",
        2026,
    )
    assert (head.text, head.level, head.origin.rank) == (
        "[rank 0] epoch 1 step 4/12 loss 0.71",
        "info",
        0,
    )
    assert head.time is not None and head.time.isoformat().startswith("2026-12-03T06:30:02")
    same_second = parse_line(
        "                    ERROR    [rank 0] failed to read the batch"
        "                         richlog.py:11",
        2026,
    )
    assert (same_second.text, same_second.level) == ("[rank 0] failed to read the batch", "error")
    box = " " * 29 + "╭────────── Traceback (most recent call last) ──────────╮" + " " * 14
    assert parse_line(box, 2026).text == "Traceback (most recent call last):"
    exc = " " * 29 + "KeyError: 'x'" + " " * 60
    assert parse_line(exc, 2026).text == "KeyError: 'x'"
    # a code line of a Python traceback indented as deep is left alone
    code = " " * 29 + "loss = model(batch)"
    assert parse_line(code, 2026).text == code


@pytest.mark.parametrize(
    "message",
    [
        "GPU 1 | loss 0.3",
        "[cuda:1] step 3",
        "LOCAL_RANK: 1 - CUDA_VISIBLE_DEVICES: [0,1]",
        "local rank 3 ready",
        "locally ranked",
        "x" * 158 + "gpu",
        "x" * 157 + "gpu",
        "Loc\u212aal_ran\u212a 2 | step",  # Kelvin signs: folded into 'k' by (?i) only
        "local_ran\u212a 2 | step",
        "\u0130 gpu",
        "nothing here",
        "",
    ],
)
def test_may_name_device_agrees_with_the_case_blind_search(message: str) -> None:
    """The ASCII fast path finds the device words exactly where the case-blind regex does."""
    from ddpdoctor.ingest import prefixes

    expected = prefixes._DEVICE_WORDS.search(message, 0, 160) is not None
    assert prefixes._may_name_device(message) is expected


def test_a_caller_column_then_rank_and_world_names_the_rank() -> None:
    """k2/icefall/lhotse's logging format (corpus case 997): '%(levelname)s [%(filename)s:
    %(lineno)d] (%(rank)s/%(world_size)s) %(message)s'."""
    parsed = parse_line(
        "2023-04-12 21:37:44,208 INFO [trainer.py:650] (5/8) Reaches end of dataloader."
    )
    assert parsed.origin.rank == 5
    # a bare '(1/3)' step count names no rank
    assert parse_line("INFO (1/3) downloading the dataset").origin.rank is None


@pytest.mark.parametrize(
    ("line", "rank", "local"),
    [
        # one task a rank: the label is the rank
        ("1: epoch 0 it 10 loss 0.52", 1, None),
        ("1: [rank 1] epoch 0 it 10 loss 0.52", 1, None),
        # one torchrun agent a task (a node each, tests/fixtures/real/twentyninth-relay-pair):
        # the worker's own prefix or rank tag names the writer, the label only its node
        ("0: [rank 1] epoch 0 it 10 loss 0.52", 1, None),
        ("1: [rank3]: FileNotFoundError: ckpt/last.pt", 3, None),
        ("1: [default0]:Traceback (most recent call last):", None, 0),
    ],
)
def test_an_srun_label_is_the_rank_unless_the_line_names_another(
    line: str, rank: int | None, local: int | None
) -> None:
    parsed = parse_line(line)
    assert (parsed.origin.rank, parsed.origin.local_rank) == (rank, local)
    assert parsed.prefix.startswith(line.split(":")[0])


@pytest.mark.parametrize(
    ("line", "text", "rank", "host"),
    [
        # journalctl (syslog time without a year, host, the service's process)
        (
            "Dec 03 16:45:33 node7 python3[4242]: [rank1]: RuntimeError: x",
            "RuntimeError: x",
            1,
            "node7",
        ),
        # moreutils' ts, a day padded with a space
        ("Dec  3 16:45:33 [rank1]: RuntimeError: x", "RuntimeError: x", 1, None),
        # journalctl -o short-iso
        ("2024-12-03T16:45:33+0000 node7 python3[4242]: [rank2]: x", "x", 2, "node7"),
        # a CloudWatch export: a tab after the time
        ("2024-05-01T10:00:00.123Z\t[rank1]: RuntimeError: x", "RuntimeError: x", 1, None),
        # an srun label inside a Markdown quote
        ("> 3: Traceback (most recent call last):", "Traceback (most recent call last):", 3, None),
        # torchrun's tag indented, or behind a report's bar (milabench quotes each rank's
        # stderr so): the quoting of whoever re-printed the line
        ("        | [rank0]: FileNotFoundError: x", "FileNotFoundError: x", 0, None),
        ("\t[rank3]: RuntimeError: x", "RuntimeError: x", 3, None),
        # near misses: a bar without indentation, an indented list, code quoting a tag
        ("| [rank0]: x", "| [rank0]: x", None, None),
        ("    [1, 2]: x", "    [1, 2]: x", None, None),
        ('    print("[rank0]: hi")', '    print("[rank0]: hi")', None, None),
        # a program's own tag before a rank it names: said about that rank, maybe by another
        # process (a launcher's "[launcher] rank 1 exited with code 1")
        (
            "[launcher] rank 1 exited with code 1",
            "[launcher] rank 1 exited with code 1",
            None,
            None,
        ),
        # near misses: a month in prose, a time without a month
        ("May 5 was a good day", "May 5 was a good day", None, None),
        ("Dec 03 was a good day", "Dec 03 was a good day", None, None),
    ],
)
def test_syslog_journald_and_exported_lines_are_read(
    line: str, text: str, rank: int | None, host: str | None
) -> None:
    parsed = parse_line(line, 2026)
    assert (parsed.text, parsed.origin.rank, parsed.origin.host) == (text, rank, host)
    if "16:45:33" in line:
        assert parsed.time is not None and parsed.time.hour == 16


@pytest.mark.parametrize(
    ("line", "text", "rank", "local"),
    [
        # grep -rn over torchrun's --log-dir: the folder names the local rank
        ("logs/job/attempt_0/3/stderr.log:12:RuntimeError: x", "RuntimeError: x", None, 3),
        # grep -r over per-rank files and a Slurm output with its own label
        (
            "rank2.log:Traceback (most recent call last):",
            "Traceback (most recent call last):",
            2,
            None,
        ),
        ("slurm-88.out:0: [rank 1] done", "[rank 1] done", 1, None),
        # near misses: Python's warning location, a context line of grep -C
        ("train.py:42: UserWarning: x", "train.py:42: UserWarning: x", None, None),
        ("out.log-12-context line", "out.log-12-context line", None, None),
    ],
)
def test_a_grep_path_names_the_file_and_its_writer(
    line: str, text: str, rank: int | None, local: int | None
) -> None:
    parsed = parse_line(line)
    assert (parsed.text, parsed.origin.rank, parsed.origin.local_rank) == (text, rank, local)


def test_a_sagemaker_mpi_tag_names_the_rank_and_the_instance() -> None:
    parsed = parse_line("[1,mpirank:3,algo-2]<stderr>:Traceback (most recent call last):")
    assert (parsed.text, parsed.origin.rank, parsed.origin.host) == (
        "Traceback (most recent call last):",
        3,
        "algo-2",
    )


def test_nemo_logger_header_gives_level_and_time() -> None:
    parsed = parse_line("0: [NeMo E 2023-04-11 16:22:07 exp_manager:423] multi-node without SLURM")
    assert (parsed.text, parsed.origin.rank, parsed.level) == (
        "multi-node without SLURM",
        0,
        "error",
    )
    assert parsed.time is not None and parsed.time.year == 2023


@pytest.mark.parametrize(
    ("line", "text", "level"),
    [
        # transformers' examples and LLaMA-Factory
        (
            "[INFO|trainer.py:2128] 2024-05-01 10:00:00,123 >> ***** Running training *****",
            "***** Running training *****",
            "info",
        ),
        (
            "[WARNING|2024-12-01 10:00:00] llamafactory.train:143 >> Training done",
            "Training done",
            "warning",
        ),
        # ms-swift
        ("[INFO:swift] Training done", "Training done", "info"),
        # DeepSpeed's logger after its time
        (
            "[2024-05-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10",
            "[Rank 0] step=10",
            "info",
        ),
        # loguru's default format
        (
            "2024-05-01 10:00:00.123 | ERROR    | __main__:main:42 - Training done",
            "Training done",
            "error",
        ),
        # OpenMMLab's mmengine and detectron2 (no year)
        (
            "05/01 10:00:00 - mmengine - INFO - Epoch(train) [1][10/100]",
            "Epoch(train) [1][10/100]",
            "info",
        ),
        ("[05/01 10:00:00 d2.engine.train_loop]: Starting training", "Starting training", None),
        (
            "[05/01 10:00:00] d2.engine.hooks WARNING: Total training time",
            "Total training time",
            "warning",
        ),
        # torch's own (c10) logging does not pad the month: March 7 is 307
        ("[rank1]:[E307 04:12:51.218331904 ProcessGroupNCCL.cpp:616] x", "x", "error"),
        # a near miss: a bracketed level alone
        ("[INFO] plain", "[INFO] plain", None),
    ],
)
def test_training_frameworks_logger_headers_are_read(
    line: str, text: str, level: str | None
) -> None:
    parsed = parse_line(line, 2024)
    assert (parsed.text, parsed.level) == (text, level)
    if text != line and not line.startswith("[INFO"):
        assert parsed.time is not None


@pytest.mark.parametrize(
    ("line", "text", "level"),
    [
        # datefmt="%H:%M:%S": the time of day, then the level (tests/programs/
        # thirtyfirst_style_train.py's coloured header, colours stripped)
        ("00:00:24 INFO    [r0] training done in 0.3s", "[r0] training done in 0.3s", "info"),
        ("[12:00:01] WARNING - disk low", "disk low", "warning"),
        ("12:00:01,123 | ERROR | boom", "boom", "error"),
        ("[12:00:01 INFO] x", "x", "info"),
        # no level after it: a message's own clock, left as it is
        ("12:00:01 the clock says", "12:00:01 the clock says", None),
    ],
)
def test_a_time_of_day_header_is_read_for_its_level(line: str, text: str, level: str) -> None:
    parsed = parse_line(line)
    assert (parsed.text, parsed.level, parsed.time) == (text, level, None)


@pytest.mark.parametrize(
    ("line", "text", "rank"),
    [
        # a bracketed time glued to the rank's own tag (tests/programs/thirtysecond_style_train.py)
        ("[2026-12-04 00:07:45,936][rank 1/3] Done!", "[rank 1/3] Done!", 1),
        # a rank's tag after the time is the writer, not a job platform's step id
        ("2026-06-17 09:13:29,226 [RANK:0] Starting trainer...", "[RANK:0] Starting trainer...", 0),
        ("2026-06-17T09:13:29Z [177/train/578 (pid 1)] step 3", "step 3", None),
    ],
)
def test_a_ranks_tag_after_the_time_names_the_writer(line: str, text: str, rank: int) -> None:
    parsed = parse_line(line)
    assert (parsed.text, parsed.origin.rank) == (text, rank)


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        # logging's default format with a logger per rank (tests/programs/
        # thirtysixth_style_train.py names them train.r<N>)
        ("INFO:train.r2:early stopping at epoch 0", 2),
        ("WARNING:rank3:slow step", 3),
        ("ERROR:trainer.worker_1:failed", 1),
        ("INFO:__main__:hello", None),
        ("INFO:r2d2:beep", None),
    ],
)
def test_a_loggers_name_can_name_the_rank(line: str, rank: int | None) -> None:
    assert parse_line(line).origin.rank == rank


@pytest.mark.parametrize(
    ("line", "rank", "host"),
    [
        # a program's own tag names its rank, not a host (pdsh's "host: ")
        ("rank1: RuntimeError: boom", 1, None),
        ("node-1: RuntimeError: boom", None, "node-1"),
        ("worker-3: RuntimeError: boom", None, "worker-3"),
        ("rank1\tRuntimeError: boom", 1, None),
    ],
)
def test_a_rank_tag_is_no_pdsh_host(line: str, rank: int | None, host: str | None) -> None:
    parsed = parse_line(line, 2026)
    assert (parsed.origin.rank, parsed.origin.host) == (rank, host)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        # OpenPCDet's '%(asctime)s  %(levelname)5s  %(message)s' (tests/fixtures/real/
        # ninetyfifth-calm-pcd): the level padded to five characters, behind the time
        (
            "2026-12-06 05:15:24,240   INFO  **********************End training "
            "kitti_models/tiny_pointpillar(default)**********************",
            "info",
        ),
        ("2026-12-06 05:15:24,240  ERROR  boom", "error"),
        # indented text that starts with a level's word, behind no time: no record's level
        ("    INFO is printed below", None),
    ],
)
def test_a_padded_level_behind_the_time(line: str, level: str | None) -> None:
    assert parse_line(line).level == level


def test_a_record_printed_after_a_wiped_bar_is_its_own_line() -> None:
    """tests/fixtures/real/ninetyfifth-loud-pcd: tqdm wipes its bar ('\\r', blanks, '\\r') as
    it closes, and the logger's next record starts on the same physical line: the record is
    read with its own time and level, and the bar's last redraw is kept as the bar's."""
    line = (
        "epochs:  67%|######6   | 2/3 [00:06<00:03,  3.20s/it]\repochs: 100%|##########| 3/3 "
        "[00:10<00:00,  3.28s/it]\r                                                     \r"
        "2026-12-06 05:16:13,104   INFO  ****End training kitti_models/tiny_pointpillar****"
    )
    parsed = parse_line(line)
    assert parsed.level == "info"
    assert parsed.time == datetime(2026, 12, 6, 5, 16, 13, 104000, tzinfo=UTC)
    assert "End training" in parsed.text
    assert parsed.bar_line is not None and "3/3" in parsed.bar_line


def test_hydras_format_with_the_month_and_day_alone() -> None:
    """dora's and flashy's logging (tests/fixtures/real/hundredth-*): Hydra's '[time][name]
    [LEVEL] - ' with datefmt '%m-%d %H:%M:%S': the time in the source's year, the level."""
    parsed = parse_line("[12-06 05:51:34][flashy.solver][ERROR] - boom", year=2026)
    assert (parsed.text, parsed.level) == ("boom", "error")
    assert parsed.time == datetime(2026, 12, 6, 5, 51, 34, tzinfo=UTC)
    # a bracketed date without Hydra's fields is no such header
    assert parse_line("[12-06 05:51:34] boom", year=2026).time is None


def test_the_logging_cookbooks_name_then_level_without_a_time() -> None:
    """'%(name)s - %(levelname)s - %(message)s' with no time in front: the level after the
    logger's name is read (the padded-level check applies to a level at the message's start
    only)."""
    assert parse_line("torchtitan.train - ERROR - Ran out of data").level == "error"


def test_olmos_records_name_the_host_and_local_rank() -> None:
    """AI2 OLMo's records (tests/fixtures/real/hundredfifteenth-*): time, host:local_rank,
    logger:line and level, tab-separated; its excepthook's 'Uncaught X: ' before an
    exception's own line. Without the tabs, the same words are no such record."""
    root = Path(__file__).parent / "fixtures" / "real"
    line = next(
        ln
        for ln in (root / "hundredfifteenth-folder-kept" / "console.log").read_text().splitlines()
        if "\tCRITICAL\t" in ln
    )
    parsed = parse_line(line)
    assert (parsed.origin.host, parsed.origin.local_rank, parsed.level) == ("vm", 1, "critical")
    assert parsed.text.startswith("RuntimeError: ")
    assert parse_line("2026-12-06 15:52:19.567 vm:0 train:787 INFO CLI").origin.local_rank is None


@pytest.mark.parametrize(
    ("line", "text", "level"),
    [
        # LeRobot's init_logging (set 125): level, date and time, the caller right-aligned
        ("INFO 2026-12-06 19:05:56 s/train.py:1042 End of training", "End of training", "info"),
        ("WARNING 2026-12-06 19:05:50    utils.py:55 fps mismatch", "fps mismatch", "warning"),
    ],
)
def test_a_level_then_the_time_then_the_caller_is_a_record_head(
    line: str, text: str, level: str
) -> None:
    parsed = parse_line(line)
    assert (parsed.text, parsed.level) == (text, level)
    assert parsed.time is not None


def test_a_level_word_before_a_number_is_no_record_head() -> None:
    assert parse_line("ERROR 404 not found").text == "ERROR 404 not found"


def test_colberts_run_print_names_the_time_and_the_rank() -> None:
    """ColBERT's print_message ('[%b %d, %H:%M:%S] ') and Run().print, which puts the rank in
    brackets after it (tests/fixtures/real/hundredfortythird-*). A bracketed number without
    that head is no rank, and the head without a rank names none."""
    root = Path(__file__).parent / "fixtures" / "real"
    line = next(
        ln
        for ln in (root / "hundredfortythird-lone-quit" / "console.log").read_text().splitlines()
        if "stopping early" in ln
    )
    parsed = parse_line(line, 2026)
    assert parsed.origin.rank == 1 and parsed.text.startswith("#> Loss flat")
    assert parsed.time == datetime(2026, 12, 7, 5, 47, 20, tzinfo=UTC)
    alone = parse_line("[Dec 07, 05:47:19] #> Starting...", 2026)
    assert alone.origin.rank is None and alone.text == "#> Starting..."
    assert parse_line("[1] \t\t #> Loss flat").origin.rank is None


def test_hydras_rank_label_names_the_writer() -> None:
    """MPICH's / Intel MPI's Hydra with -prepend-rank: '[3] message' is MPI rank 3's line
    (tests/fixtures/real/hundredfiftyninth-*); not NCCL's device tag left where a paste cut the
    'host:pid:tid ' head off, nor a line that only starts with a bracketed date."""
    line = parse_line("[3] /tmp/synth/shard_03.npz: 464 samples, 15 steps/epoch, val 128")
    assert (line.origin.rank, line.text) == (
        3,
        "/tmp/synth/shard_03.npz: 464 samples, 15 steps/epoch, val 128",
    )
    assert parse_line("[0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.").origin.rank is None
    assert parse_line("[2023-07-11 15:02:36] step 5").origin.rank is None


def test_a_terminals_echo_of_ctrl_c_leaves_the_line_its_time() -> None:
    """A recorded terminal (util-linux script, set 167) shows the '^C' the key echoed at the
    start of torchrun's next glog line: the line is still torchrun's, timed."""
    typescript = (
        Path(__file__).parent
        / "fixtures"
        / "real"
        / "hundredsixtyseventh-fifo-read"
        / "typescript-node0.txt"
    )
    line = next(s for s in typescript.read_text().splitlines() if s.startswith("^CW1207"))
    parsed = parse_line(line, year=2026)
    assert parsed.time == datetime(2026, 12, 7, 19, 56, 18, 420000, tzinfo=UTC)
    assert parsed.text.startswith("Received 2 death signal, shutting down workers")
    assert parse_line("^C^CTraceback (most recent call last):").text.startswith("Traceback")
    assert parse_line("^Zero padding").text == "^Zero padding"  # not a signal key's echo
