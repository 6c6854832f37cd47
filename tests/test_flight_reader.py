"""Reading Flight Recorder dumps (ingest/flight_dumps.py): the real dumps of torch 2.13 on gloo
(tests/fixtures/real/flight-recorder, captured by its capture.sh) in both forms, recognised by
content whatever their names, and hostile files refused without running any of their code."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest import flight_dumps
from ddpdoctor.ingest.flight_dumps import Rejected, parse_dump, read_dump, sniff
from ddpdoctor.model.flight import FlightDump
from tests.conftest import REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "real" / "flight-recorder"
CASES = ("skip", "op", "shape", "sleep", "die", "two-groups")


def _dump(path: Path) -> FlightDump:
    result = read_dump(str(path))
    assert isinstance(result, FlightDump), result
    return result


@pytest.mark.parametrize("case", CASES)
def test_real_dumps_read_in_both_forms(case: str) -> None:
    pickles = sorted((FIXTURES / case / "dumps").glob("*.pkl"))
    assert pickles
    for pkl in pickles:
        from_pickle = _dump(pkl)
        from_json = _dump(pkl.with_suffix(".json"))
        assert from_pickle.form == "pickle" and from_json.form == "json"
        assert from_pickle.rank == from_json.rank == int(pkl.stem.removeprefix("rank"))
        assert from_pickle.version == from_json.version == "2.10"
        # the same moment of the same rank: same ops, sizes and sequence ids; frames only in
        # the pickle (torch 2.13's JSON dump carries none)
        key = [(e.pg, e.seq, e.op, e.input_sizes, e.input_dtypes) for e in from_pickle.entries]
        assert key == [
            (e.pg, e.seq, e.op, e.input_sizes, e.input_dtypes) for e in from_json.entries
        ]
        assert from_pickle.has_frames and not from_json.has_frames
        for e in from_pickle.entries:
            assert e.backend == "gloo"
            assert e.user_frame is not None
            assert e.user_frame.file.endswith("tests/programs/flight_cases.py")
            assert e.frames[0].file.endswith("distributed_c10d.py")  # innermost first


def test_worker_server_answer_is_read_as_a_dump() -> None:
    """What the c10d worker server's `fr_trace_json` handler returned while rank 1 slept."""
    for rank in (0, 1):
        dump = _dump(FIXTURES / "sleep" / "dumps" / f"rank{rank}.fr_trace_json")
        assert dump.form == "json" and dump.rank == rank
    assert [e.op for e in _dump(FIXTURES / "sleep" / "dumps" / "rank0.fr_trace_json").entries][
        -1
    ] == "barrier"


def test_gloo_status_counters_are_read_as_written() -> None:
    """pg_status: ints in the pickle, strings in the JSON form; both read as numbers."""
    pkl = _dump(FIXTURES / "die" / "dumps" / "rank1.pkl")
    js = _dump(FIXTURES / "die" / "dumps" / "rank1.json")
    assert pkl.status["0"].last_enqueued == js.status["0"].last_enqueued == 2
    assert pkl.status["0"].last_started == -1


def test_recognised_by_content_not_by_name(tmp_path: Path) -> None:
    """Dumps renamed to what they are not (a .log, no extension) are still dumps; the rank
    comes from the name as torch names dumps (`<prefix><rank>`)."""
    src = FIXTURES / "op" / "dumps"
    shutil.copy(src / "rank0.pkl", tmp_path / "nccl_trace_rank_0")
    shutil.copy(src / "rank1.json", tmp_path / "trace_1.log")
    report = diagnose_paths([str(tmp_path)])
    reasons = {Path(s.path).name: s.reason for s in report.sources}
    assert reasons["nccl_trace_rank_0"] == (
        "Flight Recorder dump (pickle, rank 0, 4 entries, with frames)"
    )
    assert reasons["trace_1.log"] == "Flight Recorder dump (json, rank 1, 4 entries, no frames)"
    flight = report.job.flight
    assert flight is not None and flight.ranks_with_dump == [0, 1]
    assert flight.divergences[0].kind == "mismatch" and flight.divergences[0].seq == 4


def test_sniff_heads() -> None:
    data = (FIXTURES / "op" / "dumps" / "rank0.pkl").read_bytes()
    assert sniff(data[:4096]) == "pickle"
    assert sniff((FIXTURES / "op" / "dumps" / "rank0.json").read_bytes()[:4096]) == "json"
    assert sniff((FIXTURES / "op" / "console.log").read_bytes()[:4096]) is None
    assert sniff((FIXTURES / "op" / "meta.json").read_bytes()[:4096]) is None
    pretty = json.dumps(
        json.loads((FIXTURES / "op" / "dumps" / "rank0.json").read_bytes()), indent=2
    )
    assert sniff(pretty.encode()[:4096]) == "json"  # re-saved by a user, indented


# ---------------------------------------------------------------------------- hostile files
class _Payload:
    """Unpickling this runs `command` through os.system: what a malicious dump would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


def _malicious(marker: Path, protocol: int) -> bytes:
    return pickle.dumps({"entries": [_Payload(f"touch {marker}")], "version": "2.10"}, protocol)


def test_the_payload_really_runs_code_when_unpickled(tmp_path: Path) -> None:
    """Control for the tests below: the general unpickler (in a child process) does create the
    file, so its absence after diagnose means the code was not run."""
    marker = tmp_path / "pwned"
    blob = tmp_path / "rank0.pkl"
    blob.write_bytes(_malicious(marker, 2))
    subprocess.run(
        [sys.executable, "-c", f"import pickle; pickle.load(open({str(blob)!r}, 'rb'))"],
        check=True,
        timeout=60,
    )
    assert marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path, protocol: int) -> None:
    """A pickle whose loading would run os.system, placed where rank 0's dump is expected
    beside the real dump of rank 1 and the job's log: refused with a clear reason, no code run,
    the rest still diagnosed."""
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    (run / "dumps").mkdir(parents=True)
    shutil.copy(FIXTURES / "op" / "console.log", run / "console.log")
    shutil.copy(FIXTURES / "op" / "dumps" / "rank1.pkl", run / "dumps" / "rank1.pkl")
    (run / "dumps" / "rank0.pkl").write_bytes(_malicious(marker, protocol))
    proc = run_cli("diagnose", "--format", "json", str(run))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    doc = json.loads(proc.stdout)
    bad = next(s for s in doc["sources"] if s["path"].endswith("rank0.pkl"))
    assert bad["status"] == "skipped"
    assert bad["reason"].startswith("refused: a pickle that is not a Flight Recorder dump")
    assert "system" in bad["reason"] and "none of its code ran" in bad["reason"]
    flight = doc["job"]["flight_recorder"]
    assert flight["ranks_with_dump"] == [1] and flight["ranks_without_dump"] == [0]


def test_text_pickle_is_never_unpickled(tmp_path: Path) -> None:
    """Protocol 0 has no binary header: such a file is read as a log, never unpickled."""
    marker = tmp_path / "pwned"
    (tmp_path / "rank0.pkl").write_bytes(_malicious(marker, 0))
    proc = run_cli("diagnose", "--format", "json", str(tmp_path))
    assert proc.returncode in (0, 1, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (7, "without Flight Recorder entries"),
        ({"entries": "no"}, "without Flight Recorder entries"),
        ({"entries": [1, 2]}, "whose entries are not Flight Recorder entries"),
    ],
)
def test_plain_pickles_that_are_not_dumps(value: object, reason: str) -> None:
    result = parse_dump(pickle.dumps(value, 2), "x")
    assert isinstance(result, Rejected) and reason in result.reason


def test_nesting_is_bounded() -> None:
    deep: list[object] = []
    for _ in range(200):
        deep = [deep]
    result = parse_dump(pickle.dumps({"entries": deep}, 4), "x")
    assert isinstance(result, Rejected)
    assert "nested more than 16 levels deep" in result.reason
    text = b'{"comm_lib_version": "", "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    result = parse_dump(text, "x")
    assert isinstance(result, Rejected) and "JSON" in result.reason


def test_shared_references_do_not_multiply(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickle can reference one entry a million times in a few MB (memo): the reader caps
    the entries it keeps instead of building a million objects."""
    entry = pickle.loads((FIXTURES / "op" / "dumps" / "rank0.pkl").read_bytes())["entries"][0]
    blob = pickle.dumps({"entries": [entry] * 1_000_000, "version": "2.10"}, 4)
    assert len(blob) < 3_000_000
    monkeypatch.setattr(flight_dumps, "MAX_ENTRIES", 1000)
    result = parse_dump(blob, "x")
    assert isinstance(result, FlightDump)
    assert len(result.entries) == 1000 and result.dropped_entries == 999_000


def test_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rank0.pkl"
    shutil.copy(FIXTURES / "op" / "dumps" / "rank0.pkl", path)
    monkeypatch.setattr(flight_dumps, "MAX_DUMP_BYTES", 1000)
    result = read_dump(str(path))
    assert isinstance(result, Rejected) and "bytes, more than" in result.reason


@pytest.mark.parametrize("cut", [2, 100, 1000])
def test_truncated_pickle_is_refused_cleanly(tmp_path: Path, cut: int) -> None:
    data = (FIXTURES / "op" / "dumps" / "rank0.pkl").read_bytes()[:cut]
    (tmp_path / "rank0.pkl").write_bytes(data)
    result = read_dump(str(tmp_path / "rank0.pkl"))
    assert isinstance(result, Rejected) and result.reason.startswith("a pickle that cannot be read")
    proc = run_cli("diagnose", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_a_pipe_is_not_sniffed(tmp_path: Path) -> None:
    """A dump handed over through a pipe is read as a stream, like any log: sniffing never
    opens it, so no byte is taken from the scan (a pipe's bytes can be read only once)."""
    fifo = tmp_path / "rank0.fifo"
    os.mkfifo(fifo)
    data = (FIXTURES / "op" / "dumps" / "rank0.pkl").read_bytes()
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # holds both ends: the bytes wait in it
    try:
        os.write(fd, data)
        assert flight_dumps.sniff_path(str(fifo)) is None
        assert os.read(fd, len(data) + 1) == data
    finally:
        os.close(fd)
    assert flight_dumps.sniff_path(str(tmp_path / "missing")) is None


def test_a_damaged_memo_slot_is_refused_before_it_costs_memory() -> None:
    """make fuzz: a pickle whose PUT names memo slot 2**31 made the unpickler grow and zero a
    memo table of gigabytes (14 GB, the OOM killer). Refused at once, nothing allocated."""
    import struct

    from ddpdoctor.ingest.flight_dumps import Rejected, parse_dump

    damaged = b"\x80\x02]r" + struct.pack("<I", 0x7FFFFFF0) + b"."  # [] then LONG_BINPUT
    result = parse_dump(damaged, "rank0.pkl", 0, "pickle")
    assert isinstance(result, Rejected) and "memo slot" in result.reason
