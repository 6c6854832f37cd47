"""A person at a terminal, for tests/fixtures/real/capture_hundredsixtyseventh.sh: one interactive
bash session recorded with util-linux `script`, as someone keeps a typescript of what they did on
a machine before there is a scheduler. `open` runs `script -q -f TYPESCRIPT` on a pseudo-terminal
of its own (so `script` sees a real terminal and records its size and TTY), `script` starts the
user's bash (-i, ~/.bashrc with the prompt) on a second one, and the keys come from a FIFO, one
command a line: `type TEXT` (TEXT and Enter), `ctrl-c` (the byte Ctrl-C sends: the terminal's
line discipline turns it into SIGINT for the foreground job and echoes '^C'). The session ends
when the user types `exit`. `wait` polls a typescript for a pattern or for the prompt. Nothing
here prints into the typescript: only the shell and what it runs do.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

CONTROL_KEYS = {"ctrl-c": b"\x03", "ctrl-z": b"\x1a", "ctrl-backslash": b"\x1c"}
BRACKETED_PASTE = re.compile(rb"\x1b\[\?2004[hl]")


def _session(args: argparse.Namespace) -> int:
    os.makedirs(args.home, exist_ok=True)
    with open(os.path.join(args.home, ".bashrc"), "w") as rc:
        rc.write(f"PS1='{args.ps1}'\nHISTFILE=/dev/null\n")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", args.rows, args.cols, 0, 0))
    env = {
        "HOME": args.home,
        "USER": args.user,
        "LOGNAME": args.user,
        "SHELL": "/bin/bash",
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }
    # the fault switch, the run's own disk and the capture's mark on every process of the run
    # (how it finds them to clean up): none of them is ever shown
    for name in ("MT_CASE", "TMPDIR", "CAPTURE_RUN"):
        if name in os.environ:
            env[name] = os.environ[name]

    def controlling_tty() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        ["script", "-q", "-f", args.typescript],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=args.home,
        env=env,
        preexec_fn=controlling_tty,
        close_fds=True,
    )
    os.close(slave)
    keys = os.open(args.keys, os.O_RDWR | os.O_NONBLOCK)  # RDWR: no EOF when a writer leaves
    pending = b""
    while proc.poll() is None:
        ready, _, _ = select.select([master, keys], [], [], 0.2)
        if master in ready:
            try:
                os.read(master, 65536)  # the screen: `script` writes the typescript itself
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
        if keys in ready:
            pending += os.read(keys, 65536)
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                _press(master, line.decode())
    os.close(master)
    return proc.returncode or 0


def _press(master: int, command: str) -> None:
    verb, _, text = command.partition(" ")
    if verb == "type":
        for ch in text:  # a fast typist, one key at a time
            os.write(master, ch.encode())
            time.sleep(0.004)
        time.sleep(0.2)
        os.write(master, b"\r")
    elif verb in CONTROL_KEYS:
        os.write(master, CONTROL_KEYS[verb])
    else:
        raise SystemExit(f"unknown key command {command!r}")


def _screen(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


PROMPT = re.compile(rb"alice@node\d:\S*\$ ")


def _prompts(text: bytes) -> int:
    return len(PROMPT.findall(text))


def _wait(args: argparse.Namespace) -> int:
    """0 once the typescript shows the pattern, or (with --prompts K) ends at the shell's prompt
    with at least K prompts shown so far; 1 when --seconds pass first."""
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        text = BRACKETED_PASTE.sub(b"", _screen(args.typescript))
        if args.prompts:
            at_prompt = re.search(PROMPT.pattern + rb"\Z", text[-200:])
            if at_prompt and _prompts(text) >= args.prompts:
                return 0
        elif re.search(args.pattern.encode(), text):
            return 0
        time.sleep(0.5)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    op = sub.add_parser("open")
    op.add_argument("--typescript", required=True)
    op.add_argument("--home", required=True)
    op.add_argument("--keys", required=True)
    op.add_argument("--ps1", required=True)
    op.add_argument("--user", default="alice")
    op.add_argument("--cols", type=int, default=120)
    op.add_argument("--rows", type=int, default=32)
    wt = sub.add_parser("wait")
    wt.add_argument("--typescript", required=True)
    wt.add_argument("--seconds", type=float, required=True)
    wt.add_argument("--pattern", default="")
    wt.add_argument("--prompts", type=int, default=0)
    ct = sub.add_parser("count")
    ct.add_argument("--typescript", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.verb == "count":  # how many prompts the shell has shown so far
        print(_prompts(BRACKETED_PASTE.sub(b"", _screen(args.typescript))))
        return 0
    return _session(args) if args.verb == "open" else _wait(args)


if __name__ == "__main__":
    sys.exit(main())
