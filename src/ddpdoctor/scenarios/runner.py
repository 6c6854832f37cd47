"""Runs one scenario for real: builds its launch command, runs it in its own process group under
an outer timeout, and writes what a user would have seen to `<out_dir>/console.log` plus a
`meta.json` describing the run. Never interprets the output: diagnosis is someone else's job."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from ddpdoctor.process_group import kill_group
from ddpdoctor.scenarios.catalog import Scenario

CONSOLE_LOG = "console.log"
META_JSON = "meta.json"
RANK_LOGS_DIR = "ranks"
KILL_GRACE_S = 5.0

# Inherited variables that would change how the launched job behaves; each scenario sets its own.
_SCRUBBED_ENV_PREFIXES = ("TORCHELASTIC_", "TORCH_DISTRIBUTED_", "GLOO_", "NCCL_", "PET_")
_SCRUBBED_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
     "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one real run left behind."""

    out_dir: Path
    exit_code: int | None
    """The launcher's exit status (negative: killed by that signal); None if it never started."""
    duration_s: float
    timed_out: bool

    @property
    def log_paths(self) -> list[str]:
        return log_paths(self.out_dir)


def log_paths(out_dir: Path) -> list[str]:
    """The log files of a run directory (console first, then per-rank files), never meta.json."""
    out_dir = Path(out_dir)
    paths = [str(out_dir / CONSOLE_LOG)] if (out_dir / CONSOLE_LOG).is_file() else []
    ranks = out_dir / RANK_LOGS_DIR
    if ranks.is_dir():
        paths += sorted(str(p) for p in ranks.rglob("*") if p.is_file() and p.stat().st_size)
    return paths


def torch_version() -> str | None:
    """The installed torch version without importing torch (importing costs about 1.4 s)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def framework_version(name: str | None) -> str | None:
    """The installed version of a scenario's framework, without importing it."""
    if name is None:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _accelerate_launch(nproc: int) -> list[str]:
    """`accelerate launch` on several CPU processes, as its users type it (no `accelerate
    config`: its defaults warning is part of what they see). Its rendezvous gets a free port:
    the default 29500 may be taken by another job on the machine."""
    beside = Path(sys.executable).with_name("accelerate")
    cmd = (
        [str(beside)]
        if beside.exists()
        else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [
        *cmd,
        "launch",
        "--multi_gpu",
        f"--num_processes={nproc}",
        f"--main_process_port={port}",
    ]


def build_command(scenario: Scenario, log_dir: Path | None, master_port: int | None) -> list[str]:
    """The command line a user would have typed for this scenario."""
    program = str(scenario.program_path)
    nproc = f"--nproc-per-node={scenario.nproc}"
    if scenario.launcher in ("python", "lightning"):  # Lightning starts the other ranks itself
        return [sys.executable, program, *scenario.args]
    if scenario.launcher == "accelerate":
        return [*_accelerate_launch(scenario.nproc), program, *scenario.args]
    if scenario.launcher == "launch":
        return [sys.executable, "-m", "torch.distributed.launch", nproc, program, *scenario.args]
    cmd = _torchrun()
    if master_port is not None:
        cmd += ["--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={master_port}"]
    else:
        cmd.append("--standalone")
    cmd.append(nproc)
    if log_dir is not None:
        cmd += ["--tee=3", f"--log-dir={log_dir}"]
    return [*cmd, program, *scenario.args]


def build_env(scenario: Scenario) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUBBED_ENV and not k.startswith(_SCRUBBED_ENV_PREFIXES)
    }
    # Unbuffered output keeps the console in the order things happened, as on a terminal.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(scenario.env)
    return env


def run(
    scenario: Scenario,
    out_dir: str | Path,
    on_start: Callable[[list[str]], None] | None = None,
) -> RunResult:
    """Runs the scenario once into `out_dir` (created; previous logs there are replaced).
    `on_start` gets the command line just before it starts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / CONSOLE_LOG, out / META_JSON):
        stale.unlink(missing_ok=True)
    shutil.rmtree(out / RANK_LOGS_DIR, ignore_errors=True)
    log_dir = out / RANK_LOGS_DIR if scenario.tee else None

    holder: socket.socket | None = None
    master_port: int | None = None
    if scenario.occupy_master_port:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        master_port = holder.getsockname()[1]
    command = build_command(scenario, log_dir, master_port)
    if on_start is not None:
        on_start(command)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    timed_out = False
    exit_code: int | None = None
    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"ddpdoctor-{scenario.name}-") as cwd,
            open(out / CONSOLE_LOG, "wb") as console,
        ):
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=build_env(scenario),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the timeout kills ranks too
            )
            try:
                if scenario.sigterm_after_s is not None:
                    try:
                        proc.wait(timeout=scenario.sigterm_after_s)
                    except subprocess.TimeoutExpired:
                        proc.send_signal(signal.SIGTERM)  # the launcher only, as a scheduler
                exit_code = proc.wait(timeout=scenario.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc, KILL_GRACE_S)
                exit_code = proc.returncode
    finally:
        if holder is not None:
            holder.close()
    duration_s = time.monotonic() - t0
    _write_meta(out, scenario, command, exit_code, duration_s, timed_out, started)
    return RunResult(out, exit_code, duration_s, timed_out)


def _write_meta(
    out: Path,
    scenario: Scenario,
    command: list[str],
    exit_code: int | None,
    duration_s: float,
    timed_out: bool,
    started: datetime,
) -> None:
    meta = {
        "scenario": scenario.name,
        "title": scenario.title,
        "command": command,
        "env": {"PYTHONUNBUFFERED": "1", **scenario.env},
        "exit_code": exit_code,
        "timed_out": timed_out,
        "duration_s": round(duration_s, 2),
        "date": started.isoformat(timespec="seconds"),
        "torch": torch_version(),
        **(
            {"framework": {scenario.framework: framework_version(scenario.framework)}}
            if scenario.framework
            else {}
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "files": [os.path.relpath(p, out) for p in log_paths(out)],
    }
    (out / META_JSON).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def read_meta(out_dir: str | Path) -> dict[str, object]:
    """The meta.json of a run (or captured) directory; {} when absent."""
    path = Path(out_dir) / META_JSON
    if not path.is_file():
        return {}
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data
