"""Bad input never raises: binary, unreadable, truncated .gz, invalid UTF-8, huge lines,
globs, folders and stdin all give a clear status per source. Input is never modified."""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.ingest.sources import Input, expand_paths
from tests.conftest import run_cli

# A real line from corpus case 030 (a FileNotFoundError on rank 0).
REAL_ERROR = (
    "FileNotFoundError: [Errno 2] No such file or directory: "
    "'E:/visionlab/data/imnet_val/val5k/val_file_list.pickle'\n"
)


def _status(report, name: str) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    src = next(s for s in report.sources if s.path.endswith(name))
    return src.status, src.reason


def test_binary_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(bytes(range(256)) * 100)
    (tmp_path / "train.log").write_text(REAL_ERROR)
    report = diagnose_paths([str(tmp_path)])
    assert _status(report, "model.bin")[0] == "skipped"
    assert "binary" in (_status(report, "model.bin")[1] or "")
    assert report.verdict.kind == "data-error"


def test_truncated_gzip_is_partial_and_still_diagnosed(tmp_path: Path) -> None:
    data = gzip.compress(((REAL_ERROR + "x" * 200 + "\n") * 2000).encode())
    (tmp_path / "train.log.gz").write_bytes(data[: len(data) // 2])
    report = diagnose_paths([str(tmp_path / "train.log.gz")])
    status, reason = _status(report, "train.log.gz")
    assert status == "partial" and reason
    assert report.verdict.kind == "data-error"


def test_gzip_by_magic_bytes_not_extension(tmp_path: Path) -> None:
    (tmp_path / "rank1.txt").write_bytes(gzip.compress(REAL_ERROR.encode()))
    report = diagnose_paths([str(tmp_path / "rank1.txt")])
    assert report.verdict.kind == "data-error"
    assert report.verdict.culprit.ranks == [1]


def test_missing_and_unmatched_paths(tmp_path: Path) -> None:
    report = diagnose_paths([str(tmp_path / "nope.log"), str(tmp_path / "*.none")])
    assert [s.status for s in report.sources] == ["skipped", "skipped"]


def test_unreadable_file(tmp_path: Path) -> None:
    target = tmp_path / "dir.log"
    target.mkdir()
    os.symlink(tmp_path / "gone", tmp_path / "dangling.log")
    report = diagnose_paths([str(tmp_path / "dangling.log")])
    assert report.sources[0].status == "skipped"


def test_invalid_utf8_ansi_and_long_lines(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_bytes(
        b"\xff\xfe garbage \xc3\x28\n"
        + b"\x1b[31m"
        + REAL_ERROR.encode()
        + b"\x1b[0m"
        + b"y" * (20 * 1024 * 1024)
        + b"\n"
    )
    report = diagnose_paths([str(log)])
    assert report.verdict.kind == "data-error"
    assert report.sources[0].status == "read"


def test_input_is_never_modified(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(REAL_ERROR)
    before = (hashlib.sha256(log.read_bytes()).hexdigest(), log.stat().st_mtime_ns)
    diagnose_paths([str(tmp_path)])
    assert (hashlib.sha256(log.read_bytes()).hexdigest(), log.stat().st_mtime_ns) == before


def test_stdin_and_exit_codes(tmp_path: Path) -> None:
    proc = run_cli("diagnose", "--format", "json", "-", stdin=REAL_ERROR.encode())
    assert proc.returncode == 1
    assert '"data-error"' in proc.stdout
    assert run_cli("diagnose", str(tmp_path / "missing.log")).returncode == 2
    healthy = Path(__file__).parent / "fixtures" / "real" / "healthy-plain" / "console.log"
    assert run_cli("diagnose", str(healthy)).returncode == 0


def test_a_file_reached_twice_is_read_once(tmp_path: Path) -> None:
    """Through its folder, by name and through a link: one input, not three."""
    log = tmp_path / "logs" / "rank0.log"
    log.parent.mkdir()
    log.write_text("x\n")
    os.symlink(log, tmp_path / "link.log")
    inputs, problems = expand_paths([str(log.parent), str(log), str(tmp_path / "link.log")])
    assert [i.path for i in inputs] == [str(log)]
    assert problems == []


def test_the_current_folder_is_read_with_its_subfolders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`diagnose .` inside a `run` folder: the files of ranks/ keep their folder's name (its
    first two letters were once cut as if they were "./", and the rank logs went unread)."""
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.log").write_text(REAL_ERROR)
    (tmp_path / "console.log").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    inputs, problems = expand_paths(["."])
    assert [i.path for i in inputs] == ["console.log", os.path.join("ranks", "rank0.log")]
    assert problems == []
    report = diagnose_paths(["."])
    assert all(s.status != "skipped" for s in report.sources), report.sources


def test_a_pipe_is_read_to_its_end(tmp_path: Path) -> None:
    """`ddpdoctor diagnose <(kubectl logs ...)` hands over a pipe: its size says 0, its content
    must still be read (it was silently reported as an empty, readable log)."""
    fifo = tmp_path / "logs.fifo"
    os.mkfifo(fifo)
    text = f"[rank1]:{REAL_ERROR}\n".encode()

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(text)

    writer = threading.Thread(target=write)
    writer.start()
    report = diagnose_paths([str(fifo)])
    writer.join(timeout=10)
    assert report.sources[0].bytes == len(text)
    assert report.verdict.kind == "data-error"


def test_a_pipe_inside_a_folder_is_skipped_not_waited_for(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "collector.fifo")
    (tmp_path / "rank1.log").write_text(f"{REAL_ERROR}\n")
    report = diagnose_paths([str(tmp_path)])
    by_path = {Path(s.path).name: s for s in report.sources}
    assert by_path["collector.fifo"].status == "skipped"
    assert by_path["collector.fifo"].reason == "not a regular file"
    assert report.verdict.kind == "data-error"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_device_is_sniffed_and_skipped() -> None:
    report = diagnose_paths(["/dev/zero"])
    assert report.sources[0].status == "skipped"
    assert report.sources[0].reason == "binary data, not a log"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc")
def test_a_file_of_size_zero_with_content_is_read() -> None:
    report = diagnose_paths(["/proc/self/status"])
    assert report.sources[0].bytes > 0


CAPTURED = Path(__file__).parents[1] / "src" / "ddpdoctor" / "scenarios" / "captured"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be-bom"])
def test_a_utf16_log_is_read_as_text(tmp_path: Path, encoding: str) -> None:
    """Windows PowerShell's `python train.py > log.txt` writes UTF-16 with CRLF: a real capture
    re-encoded that way must give the same diagnosis, not 'binary data'."""
    real = (CAPTURED / "host-oom" / "console.log").read_text(encoding="utf-8")
    text = real.replace("\n", "\r\n")
    data = (
        b"\xfe\xff" + text.encode("utf-16-be")
        if encoding.endswith("bom")
        else text.encode(encoding)
    )
    log = tmp_path / "log.txt"
    log.write_bytes(data)
    report = diagnose_paths([str(log)])
    plain = diagnose_paths([str(CAPTURED / "host-oom" / "console.log")])
    assert report.sources[0].status == "read"
    assert report.sources[0].lines == plain.sources[0].lines
    assert (report.verdict.kind, report.verdict.culprit.ranks) == (
        plain.verdict.kind,
        plain.verdict.culprit.ranks,
    )


def test_a_big_utf16_log_is_not_cut_into_byte_ranges(tmp_path: Path) -> None:
    from ddpdoctor.analysis import parallel

    log = tmp_path / "big.txt"
    log.write_bytes("step 1 loss 0.5\r\n".encode("utf-16") * 10)
    assert parallel.split(Input(str(log), str(log)), part_bytes=64) == [Input(str(log), str(log))]


def test_many_skipped_files_are_summarised_not_listed(tmp_path: Path) -> None:
    """A run folder with checkpoints beside its log: a few skipped paths, then a count."""
    for i in range(12):
        (tmp_path / f"ckpt-{i:02d}.pt").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "rank1.log").write_text(f"{REAL_ERROR}\n")
    proc = run_cli("diagnose", str(tmp_path))
    skipped = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 6, proc.stderr
    assert skipped[-1] == "ddpdoctor: skipped: 7 more: binary data, not a log"
    assert "skipped: 7 more: binary data, not a log" in proc.stdout  # the text report too
    assert proc.returncode == 1  # the log was still diagnosed


def test_a_big_binary_file_is_skipped_whole_not_scanned_in_ranges(tmp_path: Path) -> None:
    """Only a file's first range is sniffed; a checkpoint cut into ranges had its later ranges
    scanned as text (and their hits merged) before being reported as skipped."""
    from ddpdoctor.analysis import parallel

    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(bytes(range(256)) * 4096 + f"\n{REAL_ERROR}".encode() * 10)
    item = Input(str(ckpt), str(ckpt))
    assert parallel.split(item, part_bytes=64 * 1024) == [item]
    report = diagnose_paths([str(ckpt), str(tmp_path)])
    assert report.sources[0].status == "skipped" and report.sources[0].bytes == 0
    assert report.findings == []
