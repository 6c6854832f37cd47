"""`ddpdoctor run` passes every byte through, in order, to the terminal (here: a pipe the test
reads) and to console.log and the per-rank logs; a reader that stops makes the job wait instead
of losing output; hangs are found while the terminal is blocked; ranks that ignore SIGTERM are
killed after the grace period. Real processes throughout (torch-free writers, and torchrun)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Iterable
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).parent
WRITER = HERE / "programs" / "output_writer.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
RUN = [sys.executable, "-c", "from ddpdoctor.cli.run_cmd import run; run()"]
MiB = 1 << 20

sys.path.insert(0, str(WRITER.parent))
import output_writer  # noqa: E402


def start(
    run_dir: Path, *opts: str, cmd: list[str], stderr: int | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--quiet-report", *opts, "--", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
    )


def writer(*args: object) -> list[str]:
    return [sys.executable, str(WRITER), *map(str, args)]


def events(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def exit_event(run_dir: Path) -> dict[str, object]:
    return next(e for e in events(run_dir) if e["event"] == "exit")


def sha(chunks: Iterable[bytes]) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    for c in chunks:
        h.update(c)
        n += len(c)
    return n, h.hexdigest()


def file_sha(path: Path) -> tuple[int, str]:
    def chunks() -> Iterable[bytes]:
        with path.open("rb") as fh:
            while block := fh.read(4 * MiB):
                yield block

    return sha(chunks())


def read_all(stream: object) -> Iterable[bytes]:
    while block := stream.read1(4 * MiB):  # type: ignore[attr-defined]
        yield block


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_fast_writer_200_mb_arrives_whole(tmp_path: Path) -> None:
    total = 200_000_000
    proc = start(tmp_path / "r", cmd=writer("fast", total), stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    got = sha(read_all(proc.stdout))
    assert proc.wait(timeout=120) == 0
    expected = sha(output_writer.fast_blocks(total))
    assert got == expected
    assert file_sha(tmp_path / "r" / "console.log") == expected
    out = exit_event(tmp_path / "r")["output"]
    assert isinstance(out, dict)
    assert out["read"] == {"stdout": total, "stderr": 0}
    assert out["terminal"]["stdout"]["written"] == total
    assert out["logs"]["written"] == total and out["logs"]["errors"] == 0
    assert out["drained"] is True


def test_many_small_flushed_writes_arrive_whole(tmp_path: Path) -> None:
    n = 200_000
    proc = start(tmp_path / "r", cmd=writer("small", n))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    expected = b"".join(output_writer.small_lines(n))
    assert stdout == expected
    assert (tmp_path / "r" / "console.log").read_bytes() == expected
    assert exit_event(tmp_path / "r")["output"]["read"]["stdout"] == len(expected)  # type: ignore[index]


def test_reader_paused_10_s_loses_nothing_and_logs_keep_growing(tmp_path: Path) -> None:
    """The job writes 12 MB at 1.2 MB/s while nobody reads our stdout for 10 s: console.log
    follows the job, not the terminal; then the reader gets every byte in order."""
    total, rate = 12_000_000, 1_200_000
    run_dir = tmp_path / "r"
    proc = start(run_dir, cmd=writer("paced", total, rate))
    assert proc.stdout is not None and proc.stderr is not None
    err: list[bytes] = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()  # type: ignore[union-attr]
    t0 = time.monotonic()
    sizes = []
    while time.monotonic() - t0 < 10:
        time.sleep(1)
        sizes.append(size(run_dir / "console.log"))
    got = sha(read_all(proc.stdout))
    assert proc.wait(timeout=60) == 0, err
    expected = sha(output_writer.fast_blocks(total))
    assert got == expected
    assert file_sha(run_dir / "console.log") == expected
    # our stdout pipe holds 1 MiB; the log grew through the whole pause, to about 10 s' worth
    # less the job's start (up to 2 s on a loaded machine: 9.57 MB after 9 s was seen)
    assert sizes[1] < sizes[4] < sizes[8], sizes
    assert sizes[8] > 7 * rate, sizes
    terminal = exit_event(run_dir)["output"]["terminal"]["stdout"]  # type: ignore[index]
    assert terminal["max_backlog"] > 7 * rate and terminal["error"] is None
    # the first reads went on by tee (the pipe had room), the rest was written after them
    assert 0 < terminal["teed"] < total


def test_blocked_reader_throttles_the_job_instead_of_buffering(tmp_path: Path) -> None:
    """With --output-buffer 4 (MiB) and a reader that stops, the job's writes block once about
    4 MiB wait for the terminal: memory stays bounded, nothing is dropped."""
    total = 48_000_000
    run_dir = tmp_path / "r"
    proc = start(run_dir, "--output-buffer", "4", cmd=writer("fast", total))
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while size(run_dir / "console.log") < 4 * MiB and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2)  # the job is given time to run ahead, which it must not
    plateau = [size(run_dir / "console.log")]
    time.sleep(1)
    plateau.append(size(run_dir / "console.log"))
    # backlog (4 MiB) + one read (1 MiB) + our stdout pipe (enlarged to 1 MiB, see
    # terminal.PIPE_SIZE) + slack
    assert 4 * MiB <= plateau[0] == plateau[1] <= 6.2 * MiB + MiB, plateau
    got = sha(read_all(proc.stdout))
    assert proc.wait(timeout=60) == 0
    expected = sha(output_writer.fast_blocks(total))
    assert got == expected and file_sha(run_dir / "console.log") == expected
    terminal = exit_event(run_dir)["output"]["terminal"]["stdout"]  # type: ignore[index]
    assert 3 * MiB < terminal["max_backlog"] <= 5 * MiB


def test_job_held_by_a_blocked_reader_is_not_a_hang(tmp_path: Path) -> None:
    """`ddpdoctor run --on-hang kill ... | less`, and the user scrolls back for 4 s: the job
    waits on its writes, which is not a hang; it must not be dumped or killed for it."""
    total = 40_000_000
    run_dir = tmp_path / "r"
    opts = ("--output-buffer", "1", "--hang-after", "1", "--startup-grace", "0")
    proc = start(run_dir, *opts, "--on-hang", "kill", "--stacks", "none", cmd=writer("fast", total))
    assert proc.stdout is not None and proc.stderr is not None
    time.sleep(4)
    got = sha(read_all(proc.stdout))
    assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
    assert got == sha(output_writer.fast_blocks(total))
    kinds = [e["event"] for e in events(run_dir)]
    assert "hang_detected" not in kinds and "kill" not in kinds, kinds
    assert exit_event(run_dir)["output"]["throttled_s"] > 2  # type: ignore[index]


def _through(kind: str, tmp_path: Path, total: int) -> tuple[bytes, dict[str, object]]:
    """Run the fast writer with our stdout on a socket or a pty (raw), read after a pause;
    the description we share with ddpdoctor must stay blocking all along."""
    if kind == "socket":
        ours, theirs = socket.socketpair()
        read_fd, child_fd = ours.fileno(), theirs.fileno()
    else:
        read_fd, child_fd = os.openpty()
        tty.setraw(child_fd)
    run_dir = tmp_path / kind
    proc = subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--quiet-report", "--", *writer("fast", total)],
        stdout=child_fd,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)
    assert not fcntl.fcntl(child_fd, fcntl.F_GETFL) & os.O_NONBLOCK
    got = bytearray()
    while len(got) < total:
        got += os.read(read_fd, MiB)
    assert proc.wait(timeout=60) == 0
    for fd in (read_fd, child_fd):
        os.close(fd)
    terminal = exit_event(run_dir)["output"]["terminal"]["stdout"]  # type: ignore[index]
    return bytes(got), terminal


@pytest.mark.parametrize("kind", ["socket", "pty"])
def test_socket_and_terminal_outputs_get_every_byte(tmp_path: Path, kind: str) -> None:
    total = 6_000_000
    got, terminal = _through(kind, tmp_path, total)
    assert sha([got]) == sha(output_writer.fast_blocks(total))
    assert terminal["mode"] == ("socket" if kind == "socket" else "nonblocking")
    assert terminal["written"] == total and terminal["max_backlog"] > MiB


def test_two_ranks_interleaving_keep_their_order(tmp_path: Path) -> None:
    """Two processes write `[rank0]:`/`[rank1]:` lines to one pipe, whole lines per write."""
    n = 100_000
    run_dir = tmp_path / "r"
    proc = start(run_dir, cmd=writer("interleave", n))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    want = {
        r: b"".join(b"[rank%d]:" % r + line for line in output_writer.rank_lines(r, n))
        for r in (0, 1)
    }
    assert len(stdout) == sum(len(w) for w in want.values())
    for r in (0, 1):
        assert (run_dir / "ranks" / f"rank{r}.log").read_bytes() == want[r]
    console = (run_dir / "console.log").read_bytes()
    assert console == stdout
    per_rank = {r: b"".join(re.findall(rb"(?m)^\[rank%d\]:.*\n" % r, console)) for r in (0, 1)}
    assert per_rank == want
    # the two writers did interleave (else this test proves nothing about order)
    assert len(re.findall(rb"\[rank0\]:[^\n]*\n\[rank1\]:", console)) > 3


@pytest.mark.real
def test_torchrun_ranks_interleaving_split_in_order(tmp_path: Path) -> None:
    """torchrun --tee prefixes every line; each rank's log holds its lines, in order."""
    n = 20_000
    run_dir = tmp_path / "r"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(WRITER), "rank", str(n)]
    proc = start(run_dir, "--label-ranks", cmd=cmd)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    console = (run_dir / "console.log").read_bytes()
    # torchrun's tee threads tail each rank's file: on a loaded machine one of them can print a
    # line of its rank in the middle of another rank's line (seen: "...line 3869[rank0]:rank 0
    # line 3870"). What torchrun printed is then not the ranks' own lines, and only what
    # ddpdoctor does with it can be checked exactly.
    torn = re.search(rb".\[rank\d\]:", console) is not None  # a prefix inside a line
    for r in (0, 1):
        want = b"".join(b"[rank%d]:" % r + line for line in output_writer.rank_lines(r, n))
        in_console = b"".join(re.findall(rb"(?m)^\[rank%d\]:.*\n" % r, console))
        assert (run_dir / "ranks" / f"rank{r}.log").read_bytes() == in_console
        assert b"".join(re.findall(rb"(?m)^\[rank%d\]:.*\n" % r, stdout)) == in_console
        if not torn:
            assert in_console == want


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def _wait_for(run_dir: Path, pattern: bytes, count: int, timeout: float) -> list[re.Match[bytes]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = run_dir / "console.log"
        found = list(re.finditer(pattern, path.read_bytes())) if path.exists() else []
        if len(found) >= count:
            return found
        time.sleep(0.1)
    path = run_dir / "console.log"
    tail = path.read_bytes()[-3000:] if path.exists() else b"(no console.log)"
    events_log = run_dir / "events.jsonl"
    seen = events_log.read_bytes()[-2000:] if events_log.exists() else b"(no events.jsonl)"
    raise AssertionError(
        f"{pattern!r} x{count} not seen in {timeout} s; console ends:\n{tail!r}\n"
        f"events end:\n{seen!r}"
    )


def test_process_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    proc = start(run_dir, "--grace", "1.5", cmd=writer("ignore-term", 0))
    (m,) = _wait_for(run_dir, rb"IGNORING rank 0 pid (\d+) ignores=True", 1, 30)
    pid = int(m.group(1))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGKILL
    assert 1.5 <= took < 1.5 + 4, took
    assert not _pids_alive([pid])
    killed = next(e for e in events(run_dir) if e["event"] == "kill_escalated")
    assert [p["pid"] for p in killed["processes"]] == [pid]  # type: ignore[union-attr]


@pytest.mark.real
def test_rank_ignoring_sigterm_is_killed_after_grace_not_torchruns_30_s(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(WRITER), "ignore-term", "1"]
    proc = start(run_dir, "--grace", "2", cmd=cmd)
    # the two ranks write to one pipe: a line may end right where the other rank's begins
    # ("...ignores=FalseIGNORING rank 1 ..."), so the pattern ends on the word it expects
    found = _wait_for(run_dir, rb"IGNORING rank (\d) pid (\d+) ignores=(True|False)", 2, 60)
    pids = {int(m.group(1)): int(m.group(2)) for m in found}
    agent = [c.pid for c in psutil.Process(proc.pid).children()]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert took < 2 + 6, took  # torchrun alone waits 30 s for a rank that ignores SIGTERM
    assert not _pids_alive([*pids.values(), *agent])
    evs = events(run_dir)
    killed = next(e for e in evs if e["event"] == "kill_escalated")
    ranks = {p["rank"] for p in killed["processes"] if p["role"] == "rank"}  # type: ignore[union-attr]
    assert ranks == {1}, killed
    assert proc.returncode != 0


def test_hang_found_while_the_terminal_is_blocked(tmp_path: Path) -> None:
    """Nobody reads our stdout or stderr: the job fills them, then deadlocks. The hang is
    detected from what the job wrote, stacks are dumped and the job ended; then every byte and
    the hang report still arrive."""
    fill = 2 * MiB
    run_dir = tmp_path / "r"
    proc = start(
        run_dir,
        "--hang-after",
        "2",
        "--startup-grace",
        "0",
        "--on-hang",
        "kill",
        "--stacks",
        "faulthandler",
        "--grace",
        "1",
        cmd=writer("fill-then-lock", fill),
    )
    deadline = time.monotonic() + 40
    kinds: list[object] = []
    while time.monotonic() < deadline and "kill" not in kinds:
        time.sleep(0.2)
        kinds = [e["event"] for e in events(run_dir)]
    assert "hang_detected" in kinds and "stacks" in kinds and "kill" in kinds, kinds
    assert size(run_dir / "console.log") > fill  # the logs are complete; the terminal is not
    assert proc.poll() is None  # still waiting for its reader
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    head = b"".join(output_writer.fast_blocks(fill))
    assert stdout.startswith(head)
    assert re.fullmatch(rb"(step \d loss 1.0\n){3}HANG_START [\d.]+\n", stdout[len(head) :])
    assert stdout == (run_dir / "console.log").read_bytes()
    assert b"output_writer.py" in stderr  # the hang report names where the job waits
    stacks = next(e for e in events(run_dir) if e["event"] == "stacks")
    assert stacks["diagnosis"]["kind"] == "deadlock"  # type: ignore[index]


def test_job_output_to_a_closed_reader_goes_on_in_the_logs(tmp_path: Path) -> None:
    """`ddpdoctor run ... | head -c 100`: the reader leaves; the job is not killed for it and
    console.log keeps everything."""
    total = 8_000_000
    run_dir = tmp_path / "r"
    r, w = os.pipe()
    proc = subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--quiet-report", "--", *writer("fast", total)],
        stdout=w,
        stderr=subprocess.PIPE,
    )
    os.close(w)
    assert os.read(r, 100)
    os.close(r)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert file_sha(run_dir / "console.log") == sha(output_writer.fast_blocks(total))
    terminal = exit_event(run_dir)["output"]["terminal"]["stdout"]  # type: ignore[index]
    assert terminal["error"] == "stdout: the reader went away"
    assert terminal["written"] + terminal["unsent"] == total
