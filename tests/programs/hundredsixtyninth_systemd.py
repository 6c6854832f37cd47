"""A stand-in for systemd 252 and journald running one service unit, for the
hundredsixtyninth-* fixtures (tests/fixtures/real/capture_hundredsixtyninth.sh): it starts the
unit's ExecStart the way the service manager does, keeps what its processes write to stdout and
stderr the way journald keeps a service's stream, and writes the unit's journal as `journalctl
-u UNIT -o short-iso --no-pager` prints it. No systemd runs on the capture machine.

What it re-creates (systemd v252, Debian 12's, read from src/core/service.c, unit.c, job.c,
cgroup.c, src/journal/journald-stream.c, src/shared/logs-show.c, src/basic/time-util.c and
format-util.c):
- short-iso lines: '2026-12-07T21:43:55+0000 HOST IDENT[PID]: MESSAGE' ('%Y-%m-%dT%H:%M:%S%z',
  before v255's '+00:00'), no header (v250 made the range header a debug message);
- the stream: ExecStart's stdout and stderr are one stream connection, so every line of the
  service and of every process that inherits it carries the identifier of ExecStart's binary
  (its basename) and the PID of the main process; lines break at '\\n', at NUL and every
  LineMax=48K bytes; a message that is not valid UTF-8 or holds a control character (a '\\r',
  an escape sequence) prints as '[N blob data]' (journalctl without --all);
- the service manager's own lines (systemd[1]) for a Type=simple service: 'Started UNIT -
  DESCRIPTION.', 'UNIT: Main process exited, code=exited, status=1/FAILURE' (only for an unclean
  exit: not 0, not SIGHUP/SIGINT/SIGTERM/SIGPIPE), 'UNIT: Failed with result 'exit-code'.' or
  'UNIT: Deactivated successfully.', 'UNIT: Consumed 1min 2.345s CPU time.' (format_timespan
  at 1 ms), Restart=on-failure with RestartSec= ('UNIT: Scheduled restart job, restart counter
  is at 1.', 'Stopped UNIT - DESCRIPTION.' and the CPU line again as the restart job stops the
  unit), StartLimitBurst= ('UNIT: Start request repeated too quickly.', the previous result
  again, 'Failed to start UNIT - DESCRIPTION.'), `systemctl stop` ('Stopping UNIT -
  DESCRIPTION...', SIGTERM to every process of the control group, after TimeoutStopSec= 'UNIT:
  State 'stop-sigterm' timed out. Killing.' and 'UNIT: Killing process N (COMM) with signal
  SIGKILL.' for each, 'Stopped UNIT - DESCRIPTION.'), MemoryMax= with the default OOMPolicy=stop
  (the kernel's OOM killer takes the largest process of the group: 'UNIT: A process of this
  unit has been killed by the OOM killer.', then the rest are stopped and the result is
  'oom-kill'), and 'Found left-over process ...' at a start.

The control group is every process whose environment carries this invocation's mark (torchrun
starts its workers in sessions of their own, so a process group would not hold them); this
process is their subreaper, so that the CPU time of every process of the group is counted when
it is reaped. The memory of the group is the sum of its processes' Pss. `systemctl stop` is a
file named `stop` in the control folder.

Usage: python hundredsixtyninth_systemd.py UNIT_FILE JOURNAL CONTROL_DIR (the unit's name is
the file's; the host is this UTS namespace's hostname).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path

LINE_MAX = 48 * 1024
MARK = "OCR169_CGROUP"
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}
EXIT_NAMES = dict(
    enumerate(
        (
            *("SUCCESS", "FAILURE", "INVALIDARGUMENT", "NOTIMPLEMENTED", "NOPERMISSION"),
            *("NOTINSTALLED", "NOTCONFIGURED", "NOTRUNNING"),
        )
    )
)


def parse_unit(path: Path) -> dict[str, list[str]]:
    """Key -> values (Environment= may repeat), sections ignored."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def parse_seconds(value: str) -> float:
    if value.endswith("min"):
        return float(value[:-3]) * 60
    if value.endswith("s"):
        return float(value[:-1])
    return float(value)


def parse_bytes(value: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if value[-1] in units:
        return int(float(value[:-1]) * units[value[-1]])
    return int(value)


def format_timespan(usec: int) -> str:
    """systemd's format_timespan(buf, l, t, USEC_PER_MSEC)."""
    table = [
        ("y", 31557600 * 10**6),
        ("month", 2629800 * 10**6),
        ("w", 7 * 86400 * 10**6),
        ("d", 86400 * 10**6),
        ("h", 3600 * 10**6),
        ("min", 60 * 10**6),
        ("s", 10**6),
        ("ms", 10**3),
        ("us", 1),
    ]
    accuracy = 10**3
    if usec <= 0:
        return "0"
    parts: list[str] = []
    t = usec
    for suffix, unit in table:
        if t <= 0:
            break
        if t < accuracy and parts:
            break
        if t < unit:
            continue
        a, b = divmod(t, unit)
        done = False
        if t < 60 * 10**6 and b > 0:
            j = len(str(unit)) - 1 - (len(str(accuracy)) - 1)
            b //= accuracy
            if j > 0:
                parts.append(f"{a}.{b:0{j}d}{suffix}")
                t = 0
                done = True
        if not done:
            parts.append(f"{a}{suffix}")
            t = b
    return " ".join(parts)


def format_bytes(n: int) -> str:
    """systemd's format_bytes() (IEC, one digit below the point, as v252 prints it)."""
    table = [("E", 1 << 60), ("P", 1 << 50), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20)]
    table.append(("K", 1 << 10))
    for i, (suffix, factor) in enumerate(table):
        if n >= factor:
            if i != len(table) - 1:
                below = (n // table[i + 1][1] * 10 // table[-1][1]) % 10
            else:
                below = (n * 10 // factor) % 10
            return f"{n // factor}.{below}{suffix}"
    return f"{n}B"


def printable(text: str) -> bool:
    """utf8_is_printable(): no C0 control but TAB and LF, no DEL or C1 control."""
    for ch in text:
        c = ord(ch)
        if (c < 0x20 and ch not in "\t\n") or 0x7F <= c <= 0x9F:
            return False
    return True


class Journal:
    """One host's journal of one unit, printed as `journalctl -o short-iso` prints it."""

    def __init__(self, path: Path, host: str):
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.host = host
        self.lock = threading.Lock()

    def entry(self, ident: str, pid: int, message: bytes | str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
        if isinstance(message, bytes):
            try:
                text = message.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None or not printable(text):
                text = f"[{format_bytes(len(message))} blob data]"
        else:
            text = message
        with self.lock:
            self.file.write(f"{stamp} {self.host} {ident}[{pid}]: {text}\n")
            self.file.flush()


class Stream(threading.Thread):
    """journald's stdout stream of one invocation: lines at LF, NUL or LineMax."""

    def __init__(self, fd: int, journal: Journal, ident: str, pid: int):
        super().__init__(daemon=True)
        self.fd, self.journal, self.identifier, self.pid = fd, journal, ident, pid

    def run(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                break
            buf += chunk
            while True:
                cut = [i for i in (buf.find(b"\n"), buf.find(b"\0")) if i >= 0]
                if cut:
                    i = min(cut)
                    self.journal.entry(self.identifier, self.pid, buf[:i])
                    buf = buf[i + 1 :]
                elif len(buf) >= LINE_MAX:
                    self.journal.entry(self.identifier, self.pid, buf[:LINE_MAX])
                    buf = buf[LINE_MAX:]
                else:
                    break
        if buf:
            self.journal.entry(self.identifier, self.pid, buf)
        os.close(self.fd)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "n/a"


def members(mark: str, any_invocation: bool = False) -> list[int]:
    """The processes of the control group: their environment carries the mark (with
    any_invocation, the unit's mark of any invocation)."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var == needle or (any_invocation and var.startswith(needle + b":")):
                found.append(int(d))
                break
    return sorted(found)


def pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Service:
    def __init__(self, unit_file: Path, journal: Journal, control: Path):
        self.name = unit_file.name
        self.conf = parse_unit(unit_file)
        self.journal = journal
        self.control = control
        self.desc = self.one("Description", self.name)
        self.cpu_usec = 0
        self.restarts = 0
        self.result = "success"
        # the unit on this host, under this capture's run (two runs may share a machine)
        self.unit_mark = f"{self.name}@{journal.host}@{os.environ.get('OCR169_RUN', '')}"

    def one(self, key: str, default: str = "") -> str:
        return self.conf.get(key, [default])[-1]

    def log(self, message: str, unit: bool = True) -> None:
        self.journal.entry("systemd", 1, f"{self.name}: {message}" if unit else message)

    def stop_requested(self) -> bool:
        return (self.control / "stop").exists()

    def environment(self, invocation: str) -> dict[str, str]:
        env = {
            "LANG": "C.UTF-8",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "INVOCATION_ID": invocation,
            "JOURNAL_STREAM": f"8:{secrets.randbelow(90000) + 10000}",
            "SYSTEMD_EXEC_PID": "",
        }
        for line in self.conf.get("Environment", []):
            for item in shlex.split(line):
                k, _, v = item.partition("=")
                env[k] = v
        env[MARK] = f"{self.unit_mark}:{invocation}"
        return env

    def reap(self, main: int) -> tuple[int, int] | None:
        """Every child that ended (the main process, orphans of the group): their CPU time;
        the main process's wait status once it ended."""
        status = None
        while True:
            try:
                pid, st, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.cpu_usec += int((ru.ru_utime + ru.ru_stime) * 1e6)
            if pid == main:
                status = (pid, st)
        return status

    def kill_all(self, mark: str, main: int, sig: int, log: bool) -> None:
        pids = members(mark)
        order = ([main] if main in pids else []) + [p for p in pids if p != main]
        for pid in order:
            if log:
                name = signal.Signals(sig).name
                self.log(f"Killing process {pid} ({comm(pid)}) with signal {name}.")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def start_once(self) -> str:
        """One invocation: 'restart' when Restart=on-failure applies, else 'done'."""
        invocation = secrets.token_hex(16)
        mark = f"{self.unit_mark}:{invocation}"
        for pid in members(self.unit_mark, any_invocation=True):
            self.log(
                f"Found left-over process {pid} ({comm(pid)}) in control group while "
                "starting unit. Ignoring."
            )
            self.log(
                "This usually indicates unclean termination of a previous run, or service "
                "implementation deficiencies.",
                unit=False,
            )
        argv = shlex.split(self.one("ExecStart"))
        workdir = self.one("WorkingDirectory", "/")
        env = self.environment(invocation)
        self.cpu_usec = 0
        self.result = "success"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                os.dup2(w, 1)
                os.dup2(w, 2)
                devnull = os.open("/dev/null", os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(r)
                os.close(w)
                env["SYSTEMD_EXEC_PID"] = str(os.getpid())
                os.chdir(workdir)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(203)
        os.close(w)
        self.log(f"Started {self.name} - {self.desc}.", unit=False)
        stream = Stream(r, self.journal, os.path.basename(argv[0]), pid)
        stream.start()
        stopping_since: float | None = None
        user_stop = False
        killed = False
        main_done = False
        memory_max = parse_bytes(self.one("MemoryMax")) if self.one("MemoryMax") else None
        timeout_stop = parse_seconds(self.one("TimeoutStopSec", "90s"))
        while True:
            ended = self.reap(pid)
            if ended is not None:
                main_done = True
                st = ended[1]
                if os.WIFEXITED(st):
                    code, num = "exited", os.WEXITSTATUS(st)
                    clean = num == 0
                    text = EXIT_NAMES.get(num, "n/a")
                    f = "exit-code"
                else:
                    num = os.WTERMSIG(st)
                    code = "dumped" if os.WCOREDUMP(st) else "killed"
                    clean = num in CLEAN_SIGNALS
                    text = signal.Signals(num).name.removeprefix("SIG")
                    f = "core-dump" if code == "dumped" else "signal"
                if not clean:
                    self.log(f"Main process exited, code={code}, status={num}/{text}")
                    if self.result == "success":
                        self.result = f
                if stopping_since is None:
                    # the rest of the group is stopped as the unit goes down
                    self.kill_all(mark, pid, signal.SIGTERM, log=False)
                    self.kill_all(mark, pid, signal.SIGCONT, log=False)
                    stopping_since = time.monotonic()
            if main_done and not members(mark):
                break
            if memory_max is not None and stopping_since is None:
                sizes = {p: pss(p) for p in members(mark)}
                if sum(sizes.values()) > memory_max:
                    victim = max(sizes, key=lambda p: sizes[p])
                    os.kill(victim, signal.SIGKILL)
                    time.sleep(0.05)
                    self.log("A process of this unit has been killed by the OOM killer.")
                    self.result = "oom-kill"  # OOMPolicy=stop
                    self.kill_all(mark, pid, signal.SIGTERM, log=False)
                    self.kill_all(mark, pid, signal.SIGCONT, log=False)
                    stopping_since = time.monotonic()
            if self.stop_requested() and not user_stop:
                user_stop = True
                if stopping_since is None:
                    self.log(f"Stopping {self.name} - {self.desc}...", unit=False)
                    self.kill_all(mark, pid, signal.SIGTERM, log=False)
                    self.kill_all(mark, pid, signal.SIGCONT, log=False)
                    stopping_since = time.monotonic()
            if (
                stopping_since is not None
                and not killed
                and time.monotonic() - stopping_since > timeout_stop
            ):
                killed = True
                self.log("State 'stop-sigterm' timed out. Killing.")
                self.kill_all(mark, pid, signal.SIGKILL, log=True)
                if self.result == "success":
                    self.result = "timeout"
            time.sleep(0.1)
        stream.join(timeout=5)
        if self.result == "success":
            self.log("Deactivated successfully.")
        else:
            self.log(f"Failed with result '{self.result}'.")
        if user_stop:
            self.log(f"Stopped {self.name} - {self.desc}.", unit=False)
        if self.cpu_usec > 0:
            self.log(f"Consumed {format_timespan(self.cpu_usec)} CPU time.")
        if user_stop or self.result == "success" or self.one("Restart") != "on-failure":
            return "done"
        return "restart"

    def run(self) -> None:
        interval = parse_seconds(self.one("StartLimitIntervalSec", "10s"))
        burst = int(self.one("StartLimitBurst", "5"))
        restart_sec = parse_seconds(self.one("RestartSec", "100ms"))
        starts: list[float] = []
        while True:
            now = time.monotonic()
            starts = [t for t in starts if now - t < interval]
            if len(starts) >= burst:
                self.log("Start request repeated too quickly.")
                self.log(f"Failed with result '{self.result}'.")
                self.log(f"Failed to start {self.name} - {self.desc}.", unit=False)
                return
            starts.append(now)
            if self.start_once() == "done":
                return
            waited = 0.0
            while waited < restart_sec:
                if self.stop_requested():
                    return
                time.sleep(0.1)
                waited += 0.1
            self.restarts += 1
            self.log(f"Scheduled restart job, restart counter is at {self.restarts}.")
            self.log(f"Stopped {self.name} - {self.desc}.", unit=False)
            if self.cpu_usec > 0:
                self.log(f"Consumed {format_timespan(self.cpu_usec)} CPU time.")


def main() -> None:
    unit_file, journal_path, control = (Path(a) for a in sys.argv[1:4])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the group come here
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    service = Service(unit_file, Journal(journal_path, socket.gethostname()), control)
    service.run()


if __name__ == "__main__":
    main()
