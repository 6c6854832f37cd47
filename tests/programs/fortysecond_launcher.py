"""The launcher of the forty-second training-program style (tests/fixtures/real/fortysecond-*), in
the way of MosaicML Composer's `composer -n N train.py cfg.yaml` (composer/cli/launcher.py): it
starts N rank processes itself (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
MASTER_ADDR, MASTER_PORT set; each in a session of its own), writes every rank's stdout and
stderr to per-rank files in a folder (rank 0's also streamed to the console), watches them, and
when one exits non-zero prints its exit status and both files between Composer's
'----------Begin global rank N STDOUT----------' markers, then stops the others (SIGTERM, SIGKILL
after a grace period) and exits 1. On success it exits 0 and prints nothing of its own.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

GRACE_S = 10.0


class Stop(Exception):
    """The launcher itself was told to stop (SIGTERM, SIGINT)."""


def _on_signal(signum: int, frame: object) -> None:
    raise Stop(signum)


def _pump(src: IO[bytes], file: IO[bytes], console: IO[bytes]) -> None:
    """Rank 0's stream, line by line, to its file and to the console."""
    for line in iter(src.readline, b""):
        file.write(line)
        file.flush()
        console.write(line)
        console.flush()


def _block(rank: int, stream: str, path: Path) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = ""
    return [
        f"----------Begin global rank {rank} {stream}----------",
        text.rstrip("\n"),
        f"----------End global rank {rank} {stream}----------",
    ]


def _exit_status(rank: int, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
    lines = [f"Global rank {rank} (PID {proc.pid}) exited with code {proc.returncode}"]
    lines += _block(rank, "STDOUT", out) + _block(rank, "STDERR", err)
    print("\n".join(lines), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="launcher", description="Starts N training processes.")
    p.add_argument("-n", "--nproc", type=int, required=True)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--stdout", default="logs/rank{rank}.stdout.txt")
    p.add_argument("--stderr", default="logs/rank{rank}.stderr.txt")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = p.parse_args()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    files: dict[int, tuple[Path, Path]] = {}
    pumps: list[threading.Thread] = []
    signalled: set[int] = set()
    failed: list[int] = []
    try:
        for rank in range(args.nproc):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(args.nproc),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(args.nproc),
                NODE_RANK="0",
                MASTER_ADDR=args.master_addr,
                MASTER_PORT=str(args.master_port),
                PYTHONUNBUFFERED="1",
            )
            out = Path(args.stdout.format(rank=rank))
            err = Path(args.stderr.format(rank=rank))
            out.parent.mkdir(parents=True, exist_ok=True)
            err.parent.mkdir(parents=True, exist_ok=True)
            files[rank] = (out, err)
            cmd = [sys.executable, "-u", args.training_script, *args.training_script_args]
            if rank == 0:  # streamed to the console as well as written
                proc = subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True,
                )  # fmt: skip
                for src, path, console in (
                    (proc.stdout, out, sys.stdout.buffer),
                    (proc.stderr, err, sys.stderr.buffer),
                ):
                    t = threading.Thread(
                        target=_pump, args=(src, path.open("wb"), console), daemon=True
                    )
                    t.start()
                    pumps.append(t)
            else:
                proc = subprocess.Popen(
                    cmd, env=env, stdout=out.open("wb"), stderr=err.open("wb"),
                    start_new_session=True,
                )  # fmt: skip
            procs[rank] = proc
        while True:  # watch them
            live = [r for r, proc in procs.items() if proc.poll() is None]
            crashed = [r for r, proc in procs.items() if proc.returncode not in (None, 0)]
            if crashed:
                failed = crashed[:1]
                break
            if not live:
                break
            time.sleep(0.1)
    except Stop:
        print("Killing training processes", flush=True)
    if failed:
        for t in pumps:
            t.join(timeout=1.0)
        _exit_status(failed[0], procs[failed[0]], *files[failed[0]])
    for rank, proc in procs.items():  # the others: SIGTERM, then SIGKILL after the grace period
        if proc.poll() is None:
            print(f"Killing global rank {rank} (PID {proc.pid}) with SIGTERM", flush=True)
            signalled.add(rank)
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(proc.poll() is None for proc in procs.values()):
        time.sleep(0.1)
    for rank, proc in procs.items():
        if proc.poll() is None:
            print(f"Killing global rank {rank} (PID {proc.pid}) with SIGKILL", flush=True)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for t in pumps:
        t.join(timeout=1.0)
    for rank, proc in procs.items():  # ranks that failed on their own as well
        if rank not in failed and rank not in signalled and proc.returncode not in (None, 0):
            _exit_status(rank, proc, *files[rank])
            failed.append(rank)
    return 1 if failed or signalled else 0


if __name__ == "__main__":
    sys.exit(main())
