"""JSON log records read as the line a text logger would have printed: the message, an
exception logged with it (its own line first, its traceback as the line's context), the
fields beside it kept apart for progress, the rank it names. Lines from the twenty-eighth
set's real captures (a JSON logging.Formatter on every rank under torchrun)."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.json_lines import read_json_record
from ddpdoctor.ingest.prefixes import MAX_TEXT, parse_line
from tests.conftest import REPO

REAL = REPO / "tests/fixtures/real"
STEP = (
    '[default1]:{"ts": "2026-12-03T08:20:25.915+00:00", "level": "INFO", "logger": "trainer", '
    '"rank": 1, "host": "vm", "msg": "train_step", "step": 1, "loss": 4.3574, '
    '"samples_per_s": 17.8}'
)
LOGGED = (
    '[default2]:{"ts": "2026-12-03T08:20:14.243+00:00", "level": "ERROR", "logger": "trainer", '
    '"rank": 2, "host": "vm", "msg": "metrics computation failed", "step": 3, "exc_info": '
    '"Traceback (most recent call last):\\n  File \\"/repo/tests/programs/twentyeighth_style_'
    'train.py\\", line 280, in main\\n    fields[\\"samples_per_s\\"] = round(len(x) / '
    "interval, 1)\\n                                    ~~~~~~~^~~~~~~~~~\\nZeroDivisionError: "
    'float division by zero"}'
)


def test_a_record_is_its_message_with_its_fields_apart() -> None:
    parsed = parse_line(STEP, 2026)
    assert parsed.text == "train_step"
    assert parsed.fields == "step: 1  loss: 4.3574  samples_per_s: 17.8"
    assert (parsed.origin.rank, parsed.origin.host, parsed.level) == (1, "vm", "info")
    assert parsed.time is not None


def test_a_logged_exception_is_its_own_line_with_its_traceback_above() -> None:
    parsed = parse_line(LOGGED, 2026)
    assert parsed.text == "ZeroDivisionError: float division by zero | metrics computation failed"
    assert parsed.trace[0] == "Traceback (most recent call last):"
    assert parsed.trace[1].startswith('  File "/repo/tests/programs/twentyeighth_style_train.py"')
    assert parsed.origin.rank == 2


def test_a_record_longer_than_a_line_is_read_whole() -> None:
    """A deep traceback makes the record longer than the text a line keeps (MAX_TEXT)."""
    frames = '\\n  File \\"/repo/x.py\\", line 1, in f\\n    f()' * 200
    line = (
        '{"level": "ERROR", "rank": 3, "msg": "step failed", "exc_info": "Traceback (most '
        f'recent call last):{frames}\\nRecursionError: maximum recursion depth exceeded"}}'
    )
    assert len(line) > MAX_TEXT
    assert parse_line(line).text.startswith("RecursionError: maximum recursion depth exceeded")


def test_docker_json_file_lines_are_their_log() -> None:
    """docker's json-file driver: each line of the container's output in "log"."""
    record = read_json_record(
        '{"log":"RuntimeError: CUDA error: out of memory\\n","stream":"stderr",'
        '"time":"2024-05-01T10:00:00.000000000Z"}'
    )
    assert record is not None and record.text == "RuntimeError: CUDA error: out of memory"


def test_what_is_not_a_json_record_is_left_alone() -> None:
    for line in (
        "{'loss': 0.31, 'learning_rate': 5e-05, 'epoch': 0.5}",  # the HF Trainer's dict repr
        '{"a": [1, 2]}',  # no message, no scalar field
        '{"msg": "cut',
        "[1, 2, 3]",
    ):
        assert read_json_record(line) is None, line
    assert parse_line("{'loss': 0.31, 'epoch': 0.5}").text == "{'loss': 0.31, 'epoch': 0.5}"


def _verdict(name: str) -> tuple[str, str | None, list[int]]:
    v = diagnose_paths([str(Path(REAL / name))]).verdict
    return str(v.status), v.kind, sorted(v.culprit.ranks)


def test_a_json_logged_run_that_finished_is_ok() -> None:
    """Every rank's steps are JSON records and torchrun prints nothing on success."""
    assert _verdict("twentyeighth-calm-pair") == ("ok", None, [])


def test_an_error_only_in_exc_info_names_its_rank() -> None:
    """Rank 2's save fails (logged with exc_info, retried with a backoff) while the others
    time out in the save's collectives."""
    assert _verdict("twentyeighth-fd-retry") == ("failed", "python-exception", [2])


def test_a_cloud_logging_entry_is_its_payload_written_by_its_resource() -> None:
    """Cloud Logging's export (Logs Explorer, `gcloud logging read`): a structured entry's
    record is its jsonPayload, a text entry's its textPayload, and the resource's labels name
    the replica or pod that wrote it; the envelope's own keys are no fields of the record."""
    structured = json.dumps(
        {
            "insertId": "f18b3c209dfbfd",
            "jsonPayload": {"levelname": "ERROR", "message": "[rank1]: TypeError: bad operand"},
            "resource": {"type": "ml_job", "labels": {"task_name": "workerpool1-0"}},
            "timestamp": "2026-12-07T12:38:08.879931Z",
            "severity": "ERROR",
            "logName": "projects/p/logs/workerpool1-0",
        }
    )
    record = read_json_record(structured)
    assert record is not None and record.printed
    assert (record.text, record.host, record.fields) == (
        "[rank1]: TypeError: bad operand",
        "workerpool1-0",
        "",
    )
    parsed = parse_line(structured)
    assert (parsed.text, parsed.origin.rank, parsed.origin.host) == (
        "TypeError: bad operand",
        1,
        "workerpool1-0",
    )
    pod = json.dumps(
        {
            "textPayload": "Epoch 3 done",
            "resource": {"type": "k8s_container", "labels": {"pod_name": "train-worker-1"}},
            "receiveTimestamp": "2026-12-07T12:38:09Z",
        }
    )
    assert parse_line(pod).origin.host == "train-worker-1"
    assert parse_line(pod).prefix != parse_line(pod.replace("worker-1", "worker-2")).prefix
