"""JSON log records (structured logging on Kubernetes and cloud platforms, python-json-logger,
docker's json-file driver): one object per line, read as the plain line a text logger would
have printed: its message, and for an exception logged with it (logger.exception's exc_info,
an excepthook's traceback as one escaped string) the exception's own line first, where the
rules look for it. The fields a program logs beside the message ('step: 5  loss: 3.9') are
kept apart, for progress (a message's end stays its end for the rules). The rank a record
names is its writer's."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ddpdoctor.ingest.bounds import rank_number

MESSAGE_KEYS = ("msg", "message", "log", "event", "textPayload", "MESSAGE")
"""Where loggers put the message (docker's json-file driver: "log", with its newline)."""
EXCEPTION_KEYS = ("exc_info", "exc_text", "exception", "stack_trace", "traceback", "stack")
"""Where they put a formatted traceback."""
HEADER_KEYS = frozenset(
    {
        "ts", "time", "timestamp", "@timestamp", "asctime", "created", "date",
        "level", "levelname", "severity", "levelno",
        "logger", "name", "logger_name",
        "rank", "global_rank", "local_rank",
        "host", "hostname", "pod", "pod_name", "node",
        "pid", "process", "processName", "thread", "threadName",
        "module", "funcName", "lineno", "filename", "pathname", "stream",
        # Cloud Logging's envelope of an entry (its export, `gcloud logging read`)
        "insertId", "logName", "receiveTimestamp", "trace", "spanId", "traceSampled",
    }
)  # fmt: skip
"""The header a text logger prints before the message, parsed elsewhere (prefixes.py)."""
MAX_FIELDS = 12
MAX_VALUE = 200
MAX_RECORD = 256 * 1024
"""A record longer than this (an enormous escaped traceback) is not decoded."""


@dataclass(frozen=True)
class JsonRecord:
    text: str
    fields: str = ""
    trace: tuple[str, ...] = ()
    """The logged traceback's lines above its exception line (header and frames)."""
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    """The machine, pod or replica the record names as its source (Cloud Logging's
    resource.labels: a Vertex AI replica's task_name, a GKE pod's pod_name)."""
    printed: bool = False
    """The message is one line of output as the program printed it (docker's json-file driver,
    a collector's export of stdout), with whatever prefixes its writer put before it."""


def read_json_record(line: str) -> JsonRecord | None:
    """The record a JSON log line stands for, or None for any other line (one that is not a
    whole JSON object, or holds neither a message nor a logged exception nor a field)."""
    body = line.strip()
    # a JSON object's first key is quoted with '"' (the Trainer's printed dicts, "{'loss':
    # ...}" on every logging step, are Python's repr: not decoded at all)
    if not body.startswith('{"') or not body.endswith("}") or len(body) > MAX_RECORD:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    host = _resource_host(doc)
    payload = doc.get("jsonPayload")
    if isinstance(payload, dict):
        # Cloud Logging's structured entry: the logger's record is its jsonPayload
        doc = payload
    message = _first_text(doc, MESSAGE_KEYS)
    exception = _first_text(doc, EXCEPTION_KEYS)
    one_line = message is not None and "\n" not in message.strip("\r\n")
    traceback = "" if message is None or one_line else message
    if "Traceback (most recent call last)" in traceback and not exception:
        exception = traceback  # logger.error(traceback.format_exc())
        message = traceback.split("\n", 1)[0]
    fields = _fields(doc)
    if message is None and exception is None and not fields:
        if any(isinstance(doc.get(key), str) for key in MESSAGE_KEYS):
            # a blank line printed ({"log": "\n"})
            return JsonRecord("", host=host, printed=True)
        return None
    parts = [_exception_line(exception)] if exception else []
    if message and one_line and not exception:
        # one line of output per record (docker's json-file driver, a collector's export of
        # stdout): the line as printed, its indentation kept (a traceback's frames and code)
        parts.append(message.rstrip("\r\n"))
    elif message:
        parts.append(" ".join(message.split()))
    return JsonRecord(
        " | ".join(p for p in parts if p),
        "  ".join(fields),
        _trace(exception) if exception else (),
        _number(doc.get("rank", doc.get("global_rank"))),
        _number(doc.get("local_rank")),
        host,
        printed=bool(message and one_line and not exception and not fields),
    )


RESOURCE_HOST_LABELS = ("task_name", "pod_name", "instance_id")
"""Cloud Logging's resource labels that name the writer: a Vertex AI replica, a GKE pod, a
Compute Engine VM."""
HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _resource_host(doc: dict[str, object]) -> str | None:
    """The writer a Cloud Logging entry names in its resource's labels."""
    resource = doc.get("resource")
    labels = resource.get("labels") if isinstance(resource, dict) else None
    if not isinstance(labels, dict):
        return None
    for key in RESOURCE_HOST_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and 0 < len(value) <= 63 and set(value) <= HOST_CHARS:
            return value
    return None


def _first_text(doc: dict[str, object], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = doc.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _fields(doc: dict[str, object]) -> list[str]:
    """The record's own scalar fields ('step: 5'), in the order logged."""
    out: list[str] = []
    for key, value in doc.items():
        if key in HEADER_KEYS or key in MESSAGE_KEYS or key in EXCEPTION_KEYS:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue
        out.append(f"{key}: {str(value)[:MAX_VALUE]}")
        if len(out) == MAX_FIELDS:
            break
    return out


MAX_TRACE_LINES = 200


def _trace(traceback: str) -> tuple[str, ...]:
    """The traceback's lines above its exception line, the innermost frames kept."""
    lines = [line.rstrip() for line in traceback.splitlines() if line.strip()]
    return tuple(lines[:-1][-MAX_TRACE_LINES:])


def _exception_line(traceback: str) -> str:
    """A formatted traceback's last non-empty line: the exception and its message."""
    lines = [line for line in traceback.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | str):
        return rank_number(str(value))
    return None
