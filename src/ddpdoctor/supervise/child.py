"""The child process tree: spawn in its own session with PR_SET_PDEATHSIG, a guardian that kills
every tagged descendant if ddpdoctor dies (even by SIGKILL), signal forwarding, process-to-rank
mapping through /proc/<pid>/environ, and exact per-rank exit codes read from zombies.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from ddpdoctor.errors import SupervisorError

RUN_ID_ENV = "DDPDOCTOR_RUN_ID"
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

# Runs in a separate session with signals ignored; exits when the pipe from ddpdoctor closes
# (ddpdoctor ended, however it died), then kills whatever still carries the run tag.
GUARDIAN = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
fd, tag, grace = int(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3])
while True:
    try:
        if not os.read(fd, 1):
            break
    except InterruptedError:
        continue
    except OSError:
        break
def tagged():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/environ" % name, "rb") as fh:
                    if tag in fh.read().split(b"\0"):
                        out.append(int(name))
            except OSError:
                pass
    return out
def send(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
pids = tagged()
send(pids, signal.SIGTERM)
deadline = time.monotonic() + grace
while pids and time.monotonic() < deadline:
    time.sleep(0.1)
    pids = tagged()
send(pids, signal.SIGKILL)
if len(sys.argv) > 4 and sys.argv[4]:
    import shutil
    shutil.rmtree(sys.argv[4], ignore_errors=True)
"""


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _child_preexec() -> None:
    # Runs between fork and exec: only async-signal-safe work. The libc handle was loaded earlier.
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    role: str
    """"rank" (a rank's main process), "worker" (a child of a rank), "agent" or "main"."""
    rank: int | None = None
    local_rank: int | None = None
    name: str = ""

    @property
    def label(self) -> str:
        if self.role == "rank":
            return f"rank {self.rank}"
        if self.role == "worker":
            return f"rank {self.rank} worker pid {self.pid}"
        return f"{self.role} pid {self.pid}"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def exit_status_code(status: int) -> int:
    """waitpid status -> torchrun's convention: the exit code, or -N for death by signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


def shell_code(code: int) -> int:
    """Popen.returncode -> what a shell reports: 128+N for death by signal N."""
    return 128 - code if code < 0 else code


@dataclass
class Child:
    """The supervised job; `proc` is the direct child (torchrun, python, srun...)."""

    proc: subprocess.Popen[bytes]
    run_id: str
    guardian: subprocess.Popen[bytes] | None
    guardian_fd: int | None
    pipes: dict[int, int]
    ranks: dict[int, ProcInfo] = field(default_factory=dict)
    """pid -> info of every process seen in the tree (kept after exit)."""
    exit_codes: dict[int, int] = field(default_factory=dict)
    """rank -> exit code (-N: signal N) of rank main processes, read from their zombies."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid

    # ---------------------------------------------------------------- process tree
    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def tagged(self) -> list[psutil.Process]:
        """Every live process carrying this run's tag, also ones that left the tree."""
        tag = f"{RUN_ID_ENV}={self.run_id}".encode()
        found: list[psutil.Process] = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if tag in fh.read().split(b"\0"):
                        found.append(psutil.Process(int(name)))
            except (OSError, psutil.Error):
                continue
        return found

    def refresh(self) -> list[ProcInfo]:
        """Map live processes to ranks via RANK/LOCAL_RANK (or SLURM_PROCID) in their env."""
        procs = {p.pid: p for p in self.tree()}
        for p in self.tagged():
            procs.setdefault(p.pid, p)
        envs: dict[int, dict[str, str]] = {}
        ppids: dict[int, int] = {}
        names: dict[int, str] = {}
        for pid, p in procs.items():
            try:
                envs[pid] = p.environ()
                ppids[pid] = p.ppid()
                names[pid] = p.name()
            except psutil.Error:
                continue
        live: list[ProcInfo] = []
        for pid, env in envs.items():
            rank = _int(env.get("RANK") or env.get("SLURM_PROCID") or env.get("PMI_RANK"))
            local = _int(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID"))
            parent_rank = envs.get(ppids[pid], {}).get("RANK")
            if rank is None:
                role = "main" if pid == self.pid else "agent"
            elif parent_rank is not None and _int(parent_rank) == rank:
                role = "worker"
            else:
                role = "rank"
            info = ProcInfo(pid, ppids[pid], role, rank, local, names[pid])
            live.append(info)
        if any(i.role == "rank" for i in live):
            for info in live:
                if info.role == "main":
                    info.role = "agent"  # a launcher (torchrun, srun) above the ranks
        with self._lock:
            for info in live:
                self.ranks[info.pid] = info
        return live

    # ---------------------------------------------------------------- exit codes
    def start_exit_watch(self, interval_s: float = 0.02, rescan_s: float = 0.5) -> None:
        t = threading.Thread(
            target=self._exit_watch, args=(interval_s, rescan_s), daemon=True, name="ddpdoctor-exit"
        )
        t.start()

    def _exit_watch(self, interval_s: float, rescan_s: float) -> None:
        last_scan = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_scan > rescan_s:
                last_scan = now
                self.refresh()
            with self._lock:
                watch = [
                    i
                    for i in self.ranks.values()
                    if i.role == "rank" and i.rank is not None and i.rank not in self.exit_codes
                ]
            for info in watch:
                code = zombie_exit_code(info.pid)
                if code is not None and info.rank is not None:
                    with self._lock:
                        self.exit_codes[info.rank] = code
            self._stop.wait(interval_s)

    def per_rank_exit(self) -> dict[int, int]:
        with self._lock:
            return dict(sorted(self.exit_codes.items()))

    # ---------------------------------------------------------------- signals
    def process_groups(self) -> set[int]:
        groups: set[int] = set()
        mine = os.getpgrp()
        for p in [*self.tree(), *self.tagged()]:
            try:
                pgid = os.getpgid(p.pid)
            except OSError:
                continue
            if pgid != mine:
                groups.add(pgid)
        return groups

    def forward(self, sig: int) -> None:
        """Send `sig` to the child's process group and every group a tagged process leads."""
        groups = self.process_groups()
        groups.add(self.pid)  # the child leads its own session and group
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except OSError:
                continue

    def terminate(self, grace_s: float = 5.0) -> None:
        """SIGTERM every group, wait `grace_s` for the tree to go, then SIGKILL what is left."""
        self.forward(signal.SIGTERM)
        if not self._wait_gone(grace_s):
            self.kill_remaining()

    def kill_after(
        self, grace_s: float, record: Callable[[list[ProcInfo]], None] = lambda _left: None
    ) -> None:
        """After a forwarded termination signal: give the tree `grace_s` to end, then SIGKILL
        what is left (torchrun would wait 30 s for ranks that ignore SIGTERM) and `record` it."""
        if self._wait_gone(grace_s):
            return
        left = self.remaining()
        if left:
            record(left)
            self.kill_remaining()

    def _wait_gone(self, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self._stop.is_set() or (self.proc.poll() is not None and not self.remaining()):
                return True
            time.sleep(0.1)
        return False

    def remaining(self) -> list[ProcInfo]:
        """Live (not zombie) processes of the tree and every tagged one, ranks mapped."""
        out: list[ProcInfo] = []
        for info in self.refresh():
            try:
                if psutil.Process(info.pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(info)
            except psutil.Error:
                continue
        return out

    def kill_remaining(self) -> None:
        """SIGKILL everything left; the launcher last, a moment later, so that it can still log
        how its ranks ended (its summary is evidence for the diagnosis)."""
        others = [p for p in [*self.tree(), *self.tagged()] if p.pid != self.pid]
        for p in others:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if others:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1.0)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        for p in self.tagged():  # started meanwhile
            with contextlib.suppress(psutil.Error):
                p.kill()

    def close(self) -> None:
        """Stop watching; closing the guardian pipe makes it reap any tagged leftovers."""
        self._stop.set()
        if self.guardian_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.guardian_fd)
            self.guardian_fd = None
        if self.guardian is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.guardian.wait(timeout=10)


def zombie_exit_code(pid: int) -> int | None:
    """The exit status of a zombie (field 52 of /proc/<pid>/stat), torchrun-style; else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    return exit_status_code(int(fields[49]))


PIPE_SIZE = 1 << 20
"""The job's stdout/stderr pipes hold 1 MiB (the unprivileged maximum by default) instead of
64 KiB: the capture loop wakes up 16x less often and takes each wake-up in one read."""


def enlarge_pipe(fd: int, size: int = PIPE_SIZE) -> int:
    """Set a pipe's capacity; returns the capacity it has (unchanged where refused)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (OSError, AttributeError):
        try:
            return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        except (OSError, AttributeError):
            return 0


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    run_id: str,
    guardian_grace_s: float = 3.0,
    cwd: str | None = None,
    cleanup: str = "",
) -> Child | SupervisorError:
    """Start the guardian, then the job in a new session with stdout/stderr on pipes."""
    guard_r, guard_w = os.pipe()
    guardian: subprocess.Popen[bytes] | None
    try:
        guardian = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                GUARDIAN,
                str(guard_r),
                run_id,
                str(guardian_grace_s),
                cleanup,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(guard_r,),
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "")},
        )
    except OSError:
        guardian = None
    finally:
        os.close(guard_r)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_w, err_w):
        enlarge_pipe(fd)
    child_env = dict(env)
    child_env[RUN_ID_ENV] = run_id
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=None,
            stdout=out_w,
            stderr=err_w,
            env=child_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_preexec,
        )
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w, guard_w):
            os.close(fd)
        return SupervisorError(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
    os.close(out_w)
    os.close(err_w)
    return Child(proc, run_id, guardian, guard_w, pipes={1: out_r, 2: err_r})
