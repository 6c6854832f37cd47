"""One attempt of the collective test on this node: launch torchrun with the worker, bound it in
time, kill its whole process group when it overruns, and turn what the ranks left behind into an
Attempt value. Also the bandwidth arithmetic of nccl-tests. Never raises for a failing job."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.process_group import kill_group

RESULT_ENV = "DDPDOCTOR_CHECK_RESULT"  # same value as worker.RESULT_ENV; worker imports torch
TAIL_LINES = 40


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: all_reduce busbw = algbw * 2(n-1)/n;
    all_gather and reduce_scatter busbw = algbw * (n-1)/n."""
    if world <= 0:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (world - 1) / world
    if op in ("all_gather", "reduce_scatter"):
        return (world - 1) / world
    return 1.0


@dataclass
class LaunchConfig:
    nproc_per_node: int
    backend: str = "auto"
    attempt_timeout_s: float = 60.0
    pg_timeout_s: float = 20.0
    sizes: str = "1024,16384,262144,1048576"
    iters: int = 5
    warmup: int = 2
    master_addr: str | None = None
    master_port: int | None = None
    python: str = sys.executable


@dataclass
class Attempt:
    """What one launch of the test did. status: ok | failed | hung | error (could not start)."""

    env: dict[str, str]
    status: str
    duration_s: float
    exit_code: int | None = None
    error: str | None = None
    failed_stage: str | None = None
    rank_stages: dict[int, str] = field(default_factory=dict)
    """Last stage each rank reached, with its status: {0: "barrier:running"}."""
    output_tail: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "status": self.status,
            "duration_s": round(self.duration_s, 3),
            "exit_code": self.exit_code,
            "error": self.error,
            "failed_stage": self.failed_stage,
            "rank_stages": {str(k): v for k, v in sorted(self.rank_stages.items())},
            "output_tail": self.output_tail,
        }


def torchrun_command(cfg: LaunchConfig) -> list[str]:
    cmd = [cfg.python, "-m", "torch.distributed.run"]
    if cfg.master_port is None:
        cmd += ["--standalone"]
    else:
        # static rendezvous on the user's port: exactly what their own job would bind
        cmd += [
            "--nnodes",
            "1",
            "--node-rank",
            "0",
            "--master-addr",
            cfg.master_addr or "127.0.0.1",
            "--master-port",
            str(cfg.master_port),
        ]
    cmd += [
        "--nproc-per-node",
        str(cfg.nproc_per_node),
        "--max-restarts",
        "0",
        "-m",
        "ddpdoctor.preflight.worker",
        "--backend",
        cfg.backend,
        "--pg-timeout",
        str(cfg.pg_timeout_s),
        "--sizes",
        cfg.sizes,
        "--iters",
        str(cfg.iters),
        "--warmup",
        str(cfg.warmup),
    ]
    return cmd


def port_in_use(port: int, addr: str = "127.0.0.1") -> bool:
    """True when nobody may bind `port` (what torchrun's TCPStore will try)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("" if addr in ("", "127.0.0.1", "localhost") else addr, port))
        except OSError as exc:
            # EADDRNOTAVAIL: MASTER_ADDR is another host; only that host can tell
            return exc.errno == errno.EADDRINUSE
    return False


def port_owner(port: int) -> dict[str, Any] | None:
    """The process listening on `port`, when psutil may tell (often it may not)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN":
                info: dict[str, Any] = {"pid": conn.pid, "name": None}
                if conn.pid:
                    info["name"] = psutil.Process(conn.pid).name()
                return info
    except Exception:
        return None
    return None


def run_attempt(cfg: LaunchConfig, env_changes: dict[str, str]) -> Attempt:
    """Launch the test once with `env_changes` applied over the current environment."""
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-check-") as tmp:
        result = Path(tmp) / "result.json"
        env = dict(os.environ)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
            env.pop(k, None)
        env.update(env_changes)
        env[RESULT_ENV] = str(result)
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = Path(tmp) / "output.log"
        t0 = time.monotonic()
        with log.open("wb") as out:
            try:
                proc = subprocess.Popen(
                    torchrun_command(cfg),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # one process group: torchrun and its ranks
                )
            except OSError as exc:
                return Attempt(env_changes, "error", 0.0, error=f"cannot start torchrun: {exc}")
            hung = False
            try:
                code: int | None = proc.wait(timeout=cfg.attempt_timeout_s)
            except subprocess.TimeoutExpired:
                hung = True
                kill_group(proc, 3.0)
                code = None
        duration = time.monotonic() - t0
        tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        return interpret(env_changes, result, cfg.nproc_per_node, code, hung, duration, tail)


def interpret(
    env_changes: dict[str, str],
    result: Path,
    nproc: int,
    code: int | None,
    hung: bool,
    duration: float,
    tail: list[str],
) -> Attempt:
    ranks: dict[int, dict[str, Any]] = {}
    for r in range(nproc):
        data = _load(result.with_name(f"{result.name}.rank{r}.json"))
        if data is not None:
            ranks[r] = data
    rank_stages: dict[int, str] = {}
    failed_stage = None
    error = None
    for r in range(nproc):
        data = ranks.get(r)
        if data is None:
            rank_stages[r] = "not-started"
            continue
        stages = data.get("stages") or []
        if data.get("done"):
            rank_stages[r] = "done"
        elif stages:
            rank_stages[r] = f"{stages[-1]['name']}:{stages[-1]['status']}"
        else:
            rank_stages[r] = "starting"  # importing torch, collecting facts
        err = data.get("error")
        if err and error is None:
            failed_stage = err.get("stage")
            error = f"rank {r}: {err.get('type')}: {err.get('message')}".strip()
    summary = _load(result)
    if hung:
        status = "hung"
        stuck = sorted({s for s in rank_stages.values() if s != "done"})
        error = error or f"no result after {duration:.0f} s; ranks stopped at {', '.join(stuck)}"
        if failed_stage is None:
            running = [s.split(":")[0] for s in rank_stages.values() if s.endswith(":running")]
            failed_stage = running[0] if running else None
    elif code == 0 and summary is not None:
        status = "ok"
    else:
        status = "failed"
        error = error or _error_from_output(tail) or f"torchrun exited with code {code}"
    if error and status != "ok":
        hint = _error_from_output(tail)
        if hint and hint not in error:
            error = f"{error} | {hint}"
    return Attempt(
        env=env_changes,
        status=status,
        duration_s=duration,
        exit_code=code,
        error=error,
        failed_stage=failed_stage,
        rank_stages=rank_stages,
        output_tail=tail,
        result=summary,
    )


# Messages that name the cause better than a Python exception type does.
_OUTPUT_HINTS = (
    # gloo/transport/tcp/device.cc: lookupAddrForIface
    re.compile(r"Unable to find address for: ?\S+"),
    # torch/csrc/distributed/c10d/socket.cpp: the TCPStore server cannot bind
    re.compile(r"EADDRINUSE.*|address already in use", re.I),
    # NCCL src/misc/socket.cc / bootstrap: no interface matched NCCL_SOCKET_IFNAME
    re.compile(r"no socket interface found|neither AF_INET"),
    re.compile(r"No module named \S+"),
)


def _error_from_output(tail: list[str]) -> str | None:
    for line in tail:
        for pat in _OUTPUT_HINTS:
            m = pat.search(line)
            if m:
                return m.group(0).strip()
    return None


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
