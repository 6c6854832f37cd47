"""`diagnose` survives hostile input: each input that once ended in "internal error" (exit 3) or
blocked forever, reproduced from a real log, run folder or error file mutated the way the issue
found it, through the real command. Survival means exit 0, 1 or 2, no traceback, and (for
--format json) valid UTF-8 JSON on stdout."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.rules.registry import all_rules
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
TIMED = REAL / "timed-data-error" / "console.log"
SUMMARY = REAL / "timeout-echo-printed-first" / "console.log"
RUN_HANG = REPO / "tests" / "fixtures" / "runs" / "hang"
ERROR_JSON = next((REAL / "elastic-error-json").glob("*_*"))
CORPUS = REPO / "corpus" / "cases"
BIG = "9" * 5000
"""Beyond Python's 4,300-digit int-string limit: int() raises ValueError."""
HUGE = "9" * 400
"""Parses, but overflows a float, a timedelta or a datetime."""


def diagnose(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[bytes], Any]:
    """The real command; (process, the JSON report or None). Fails on any internal error."""
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "diagnose", "--format", "json", *args],
        capture_output=True,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 1, 2), err[-3000:]
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    report = json.loads(proc.stdout.decode("utf-8")) if proc.stdout.strip() else None
    return proc, report


def source(report: Any, name: str) -> dict[str, Any]:
    found = [s for s in report["sources"] if s["path"].endswith(name)]
    assert found, [s["path"] for s in report["sources"]]
    return found[0]  # type: ignore[no-any-return]


def positive(code: str, needle: str) -> str:
    """A real line kept in a rule's own positive examples."""
    rule = next(r for r in all_rules() if r.code == code)
    return next(p for p in rule.positive if needle in p)


# -- compressed input -------------------------------------------------------------------------


def test_corrupt_gzip_raising_isals_own_error_is_partial(tmp_path: Path) -> None:
    """31 of 46 corrupted gzip inputs ended in an internal error: isal reports an invalid
    deflate block with its own exception type, which was not caught. The text is the real
    corpus logs (varied enough that the archive spans several of isal's input reads), a run
    of bytes overwritten near the end."""
    igzip = pytest.importorskip("isal.igzip")
    from isal.igzip_lib import IsalError

    text = b"".join(p.read_bytes() for p in sorted(CORPUS.glob("*/logs/*"))) * 10
    data = gzip.compress(text)
    for offset in range(len(data) * 9 // 10, len(data) - 100, 997):
        trial = data[:offset] + b"\xff" * 64 + data[offset + 64 :]
        try:
            igzip.decompress(trial)
        except IsalError:
            break
        except Exception:
            continue
    else:
        pytest.fail("no corruption made isal raise IsalError")
    path = tmp_path / "console.log.gz"
    path.write_bytes(trial)
    _, report = diagnose(str(path))
    src = source(report, "console.log.gz")
    assert src["status"] == "partial" and "corrupt" in src["reason"]
    assert 0 < src["bytes"] < len(text)


def test_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    data = gzip.compress(TIMED.read_bytes() * 50)
    path = tmp_path / "console.log.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    _, report = diagnose(str(path))
    src = source(report, "console.log.gz")
    assert src["status"] == "partial" and src["bytes"] > 0
    assert report["verdict"]["kind"] == "data-error"


# -- numbers with thousands of digits ---------------------------------------------------------


def _mutated_summary(exit_code: str, pid: str, rank: str) -> str:
    text = SUMMARY.read_text()
    text = text.replace("exitcode  : -15 (pid: 21978)", f"exitcode  : {exit_code} (pid: {pid})")
    return text.replace("rank      : 1 (local_rank: 1)", f"rank      : {rank} (local_rank: {rank})")


@pytest.mark.parametrize(
    ("exit_code", "pid", "rank"),
    [(f"-{BIG}", "21978", "1"), ("-15", BIG, "1"), ("-15", "21978", BIG), (f"-{HUGE}", HUGE, HUGE)],
)
def test_huge_numbers_in_the_launchers_summary(
    tmp_path: Path, exit_code: str, pid: str, rank: str
) -> None:
    log = tmp_path / "console.log"
    log.write_text(_mutated_summary(exit_code, pid, rank))
    _, report = diagnose(str(log))
    assert report["verdict"]["status"] != "ok"
    for exit_ in report["job"]["exit"]["per_rank"].values():
        assert exit_["code"] is None or abs(exit_["code"]) < 2**33


@pytest.mark.parametrize("digits", [BIG, HUGE])
def test_huge_timeout_in_a_watchdog_line(tmp_path: Path, digits: str) -> None:
    """`Timeout(ms)=` beyond the int-string limit (ValueError), or parseable but beyond any time
    arithmetic (OverflowError), next to a timestamped root failure on another rank."""
    watchdog = positive("TMO101", "Timeout(ms)=")
    head, tail = watchdog.split("Timeout(ms)=", 1)
    tail = tail.split(")", 1)[1]
    root = next(line for line in TIMED.read_text().splitlines() if "FileNotFoundError" in line)
    log = tmp_path / "console.log"
    log.write_text(
        f"2024-05-01T10:00:00Z {root}\n"
        f"2024-05-01T10:30:00Z [rank0]:{head}Timeout(ms)={digits}){tail}\n"
    )
    _, report = diagnose(str(log))
    assert report["verdict"]["status"] == "failed"


def test_huge_rank_captured_from_a_long_line(tmp_path: Path) -> None:
    """A capture taken from the raw line (past the 4,000 characters kept as text) once reached
    int() with 5,000 digits."""
    line = positive("DDP101", "did not receive grad for rank")
    prefix, rest = line.split("for rank ", 1)
    rest = rest.split(":", 1)[1]
    log = tmp_path / "console.log"  # no rank in the name: the captured one is used
    log.write_text(f"{prefix}for rank {BIG}:{rest}\n[rank{BIG}]:{rest}\n")
    diagnose(str(log))


def test_huge_world_size_and_ranks_from_nccl_lines(tmp_path: Path) -> None:
    real = next(
        line
        for case in sorted(CORPUS.glob("*/logs/*"))
        for line in case.read_text(errors="replace").splitlines()
        if " nranks " in line and " cudaDev " in line
    )
    log = tmp_path / "console.log"
    ranks = real.replace(" rank ", f" rank {BIG}", 1)  # past the 4,000 characters kept as text
    world = real.replace(" nranks ", f" nranks {BIG}", 1)
    log.write_text(f"{ranks}\n{world}\n{real.replace(' rank ', f' rank {HUGE}', 1)}\n")
    _, report = diagnose(str(log))
    assert report["job"]["world_size"] is None or report["job"]["world_size"] < 2**25


@pytest.mark.parametrize("elapsed", [f"{BIG}:55", f"{HUGE}:{HUGE}", "1:2:3:4:5", "::"])
def test_huge_tqdm_times(tmp_path: Path, elapsed: str) -> None:
    """The progress fact's elapsed time once overflowed a float (and its sum an int string)."""
    bar = " 9%|███▊   | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]"  # corpus 019, real
    log = tmp_path / "console.log"
    log.write_text(TIMED.read_text() + bar.replace("29:55", elapsed) + "\n")
    diagnose(str(log))


def test_huge_timestamp_in_an_error_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ERROR_JSON, run)
    for error_file in run.rglob("error.json"):
        doc = json.loads(error_file.read_text())
        doc["message"]["extraInfo"]["timestamp"] = HUGE
        error_file.write_text(json.dumps(doc))
    _, report = diagnose(str(run))
    assert report["verdict"]["kind"] == "data-error"


def test_a_flight_recorder_counter_in_another_script(tmp_path: Path) -> None:
    """A real JSON dump whose counters and group ids are "²" or "--5" (str.isdigit() or
    lstrip("-") says yes, int() raises) or 5,000 digits."""
    capture = REAL / "flight-recorder" / "skip"
    run = tmp_path / "skip"
    shutil.copytree(capture, run)
    dump = run / "dumps" / "rank0.json"
    doc = json.loads(dump.read_text())
    for status in doc["pg_status"].values():
        status["last_enqueued_collective"] = "²"
        status["last_completed_collective"] = "--5"
    doc["entries"][0]["process_group"][0] = "²"  # a group id the analysis sorts as a number
    doc["entries"][1]["process_group"][0] = BIG
    dump.write_text(json.dumps(doc))
    diagnose(str(run))


# -- malformed run folders --------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def _events_mutations() -> list[tuple[str, str]]:
    lines = (RUN_HANG / "events.jsonl").read_text().splitlines()
    rest = lines[1:]
    stacks = next(json.loads(x) for x in rest if '"stacks"' in x)
    exit_ = next(json.loads(x) for x in rest if '"exit"' in x)

    def with_(base: dict[str, Any], **changes: Any) -> str:
        out = json.loads(json.dumps(base))
        for key, value in changes.items():
            target = out["diagnosis"] if key in out.get("diagnosis", {}) else out
            target[key] = value
        return json.dumps(out)

    return [
        ("per_rank a list", with_(exit_, per_rank=[1, 2])),
        ("per_rank values as text", with_(exit_, per_rank={"0": "-15", "x": 1})),
        ("NaN and infinity", with_(exit_, code=float("nan"), per_rank={"0": float("inf")})),
        ("huge codes", with_(exit_, code=int(HUGE), per_rank={HUGE: int(HUGE)})),
        ("code beyond the int limit", json.dumps(exit_).replace('"code": 1', f'"code": {BIG}')),
        ("culprits as text", with_(stacks, culprit_ranks="1")),
        ("culprits of every type", with_(stacks, culprit_ranks=[None, 1.5, "2", True, -1, [3]])),
        ("groups of ints", with_(stacks, groups=[1, 2, 3])),
        ("group members of every type", with_(stacks, groups=[{"who": 7, "where": {"a": 1}}])),
        ("taxonomy kind a list", with_(stacks, taxonomy_kind=["hang"])),
        ("diagnosis a string", with_(stacks, diagnosis="hung")),
        ("bad date", with_(stacks, time="yesterday at noon")),
        ("date out of range", with_(stacks, time="0001-01-01T00:00:00")),
        ("naive date", with_(stacks, time="2026-12-01T15:44:44")),
        ("date of another type", with_(stacks, time=12345)),
        ("activities of every type", with_(stacks, activities={"rank 1": 5, BIG: {}, "x": []})),
        ("deep nesting", '{"event": "stacks", "diagnosis": ' + DEEP + "}"),
        ("a deeply nested line", DEEP),
        ("not an object", "[1, 2, 3]"),
    ]


@pytest.mark.parametrize(("what", "line"), _events_mutations(), ids=lambda x: str(x)[:30])
def test_malformed_events_file_in_a_run_folder(tmp_path: Path, what: str, line: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN_HANG, run)
    events = run / "events.jsonl"
    events.write_text(events.read_text() + line + "\n")
    _, report = diagnose(str(run))
    assert source(report, "events.jsonl")["status"] == "read"


def test_events_file_whose_first_line_is_deeply_nested(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN_HANG, run)
    (run / "events.jsonl").write_text(DEEP + "\n")
    diagnose(str(run))


def test_error_file_deeply_nested_and_of_wrong_types(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ERROR_JSON, run)
    files = sorted(run.rglob("error.json"))
    files[0].write_text('{"message": ' + DEEP + "}")
    files[1].write_text('{"message": {"extraInfo": [1], "message": {"a": 1}}}')
    proc, _ = diagnose(str(run))
    assert proc.returncode == 2  # nothing left to diagnose, and it says why
    assert proc.stderr.count(b"not a torchelastic error file") == 2


# -- file system shapes -----------------------------------------------------------------------


def test_folders_nested_a_thousand_deep(tmp_path: Path) -> None:
    """The folder walk was recursive: 1,000 levels exceeded Python's recursion limit."""
    deep = tmp_path / "logs"
    path = str(deep)
    os.mkdir(path)
    try:
        for _ in range(1000):  # one level at a time: os.makedirs itself recurses
            path += "/d"
            os.mkdir(path)
        shutil.copy(TIMED, path + "/console.log")
        _, report = diagnose(str(deep))
        assert source(report, "console.log")["status"] == "read"
        assert report["verdict"]["kind"] == "data-error"
        _, by_glob = diagnose(str(deep) + "/**/*.log")
        assert source(by_glob, "console.log")["status"] == "read"
    finally:
        remove_tree(deep)


def remove_tree(top: Path) -> None:
    """Remove a tree of any depth bottom-up: shutil.rmtree recurses, and pytest's own cleanup
    of old temporary folders would die on this one (RecursionError) in a later session."""
    folders: list[str] = []
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        folders.append(folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for folder in reversed(folders):
        os.rmdir(folder)


def test_a_fifo_without_a_writer_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "logs.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    _, report = diagnose("--pipe-wait", "1", str(fifo), str(TIMED), timeout=60)
    assert time.monotonic() - t0 < 30
    src = source(report, "logs.fifo")
    assert src["status"] == "skipped" and "nothing arrived in 1 s" in src["reason"]
    assert report["verdict"]["kind"] == "data-error"  # the other input was diagnosed


def test_a_fifo_whose_writer_stays_open_is_read_until_it_goes_quiet(tmp_path: Path) -> None:
    fifo = tmp_path / "logs.fifo"
    os.mkfifo(fifo)
    text = TIMED.read_bytes()
    stop = threading.Event()

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(text)
            fh.flush()
            stop.wait(60)  # the writer keeps its end open

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        _, report = diagnose("--pipe-wait", "1", str(fifo), timeout=60)
    finally:
        stop.set()
        writer.join(10)
    src = source(report, "logs.fifo")
    assert src["status"] == "partial" and src["bytes"] == len(text)
    assert "went quiet" in src["reason"]
    assert report["verdict"]["kind"] == "data-error"


def test_a_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Invalid JSON on stdout, and a crash with -o, before names were escaped."""
    folder = os.fsencode(tmp_path)
    name = folder + b"/rank1-\xff\xfe.log"
    with open(name, "wb") as fh:
        fh.write(TIMED.read_bytes())
    path = os.fsdecode(name)
    _, report = diagnose(path)
    assert any(s["path"].endswith("rank1-\\xff\\xfe.log") for s in report["sources"])
    assert report["verdict"]["kind"] == "data-error"
    out = tmp_path / "report.json"
    diagnose(path, "-o", str(out))
    assert json.loads(out.read_text(encoding="utf-8"))["verdict"]["kind"] == "data-error"
    text = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "diagnose", os.fsdecode(folder)],
        capture_output=True,
        cwd=REPO,
        check=False,
    )
    assert text.returncode == 1 and b"\\xff\\xfe" in text.stdout
    text.stdout.decode("utf-8")  # valid UTF-8 throughout


def test_a_random_binary_file_is_skipped_as_binary(tmp_path: Path) -> None:
    """200 KB of /dev/urandom was read as 780 log lines: random bytes are 9-11% control bytes,
    around the old 10% threshold. Three files from /dev/urandom, and two random ones chosen so
    that the first 8 KB holds fewer than 10% control bytes (the ones that fooled the check)."""
    import random

    control = bytes([*range(0, 9), *range(14, 32)])
    fooling: list[bytes] = []
    rng = random.Random(12)
    while len(fooling) < 2:
        blob = rng.randbytes(200 * 1024)
        head = blob[:8192]
        if len(head) - len(head.translate(None, control)) <= 0.10 * len(head):
            fooling.append(blob)
    for n, blob in enumerate([os.urandom(200 * 1024) for _ in range(3)] + fooling):
        (tmp_path / f"blob{n}.bin").write_bytes(blob)
    shutil.copy(TIMED, tmp_path / "console.log")
    _, report = diagnose(str(tmp_path))
    for n in range(5):
        src = source(report, f"blob{n}.bin")
        assert (src["status"], src["reason"]) == ("skipped", "binary data, not a log")
    assert report["verdict"]["kind"] == "data-error"


def test_a_huge_sequence_id_in_a_flight_recorder_dump(tmp_path: Path) -> None:
    """Found by `make fuzz`: in a real dump of the two-groups capture, the first entry's
    collective_seq_id became 10**19; the cross-rank walk met an id no rank had recorded
    (internal error), and walking every id up to 10**19 would never have ended."""
    folder = tmp_path / "two-groups"
    shutil.copytree(REAL / "flight-recorder" / "two-groups", folder)
    dump = folder / "dumps" / "rank0.json"
    data = json.loads(dump.read_text())
    data["entries"][0]["collective_seq_id"] = 10**19
    dump.write_text(json.dumps(data))
    (folder / "dumps" / "rank0.pkl").unlink()  # the damaged JSON is rank 0's only dump
    _, report = diagnose(str(folder), timeout=60)
    assert report is not None and report["verdict"]["status"] != "ok"
