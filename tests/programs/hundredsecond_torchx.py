"""The `torchx` command line of the hundred-second style (tests/fixtures/real/hundredsecond-*),
re-created without torchx installed: `torchx run -s local_cwd dist.ddp -j 1x2 --script train.py
-- --epochs 3` as Meta's TorchX (torchx/cli/cmd_run.py, torchx/components/dist.py,
torchx/schedulers/local_scheduler.py) does it on one machine.

- `run` parses -s/-cfg and takes the component name and its arguments as a remainder; the
  component's own parser is built from the signature of `dist.ddp` (every parameter an option,
  `*script_args` the remainder after `--`, add_help=False), so an application argument given
  before `--` is rejected by it ('unrecognized arguments') before anything is launched;
- `dist.ddp` builds a one-role AppDef: the role is named after the script (train), its
  entrypoint is `bash -c "torchrun --rdzv_backend c10d --rdzv_endpoint localhost:0 --rdzv_id
  <app id> --nnodes 1 --nproc_per_node 2 --tee 3 --role '' train.py ..."` (for more than one
  node the endpoint is ${TORCHX_RANK0_HOST:=localhost}:<rdzv_port>), env LOGLEVEL=WARNING plus
  --env, max_retries kept in the role (the local scheduler ignores retries);
- `local_cwd` runs every replica from the current folder (nothing is copied), in a new
  session, with TORCHELASTIC_ERROR_FILE=<log dir>/torchx/<app id>/<role>/<replica>/error.json
  and PET_LOG_DIR, its stdout and stderr in files that a Tee merges into combined.log; the CLI
  prints the app handle, logs 'Waiting for the app to finish...', tails every replica's
  combined.log onto stderr prefixed '<role>/<replica> ', polls the status every second, logs
  'Job finished: SUCCEEDED|FAILED' and on failure the AppStatus as YAML (state FAILED (5),
  num_restarts 0, roles [], msg <NONE>, structured_error_msg: the oldest replica error file,
  which torchrun's @record copies from the first failed worker's), then exits 1. SIGTERM or
  SIGINT raise SignalException in the CLI, whose scheduler then SIGTERMs every replica's
  process group and SIGKILLs what is left after 10 s. Logging is torchx's own:
  'torchx %(asctime)s %(levelname)-8s %(message)s', no colours when not on a terminal.
"""

import argparse
import contextlib
import inspect
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from enum import Enum
from itertools import groupby
from pathlib import Path
from string import Template
from typing import Any, TextIO

import yaml

logger = logging.getLogger("torchx.cli.cmd_run")
log = logging.getLogger("torchx.schedulers.local_scheduler")

IMAGE = "ghcr.io/pytorch/torchx:0.8.0"
NONE = "<NONE>"


# ---- torchx.components.dist ------------------------------------------------------------------


class _noquote(str):
    pass


def parse_nnodes(j: str) -> tuple[int, int, int, str]:
    if re.match("^\\d+:\\d+x\\d+$", j):
        nnodes_rep, nproc_per_node = j.split("x")
        min_nnodes, max_nnodes = nnodes_rep.split(":")
    elif re.match("^\\d+x\\d+$", j):
        min_nnodes, nproc_per_node = j.split("x")
        max_nnodes = min_nnodes
        nnodes_rep = min_nnodes
    elif re.match("^\\d+$", j):
        min_nnodes = "1"
        max_nnodes = min_nnodes
        nnodes_rep = min_nnodes
        nproc_per_node = j
    else:
        raise ValueError(f"Invalid format for -j, usage example: 1:2x4 or 1x4 or 4. Given: {j}")
    return int(min_nnodes), int(max_nnodes), int(nproc_per_node), nnodes_rep


def ddp(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = IMAGE,
    name: str = "/",
    h: str | None = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    rdzv_conf: str | None = None,
    mounts: list[str] | None = None,
    debug: bool = False,
    tee: int = 3,
) -> dict:
    """Distributed data parallel style application (one role, multi-replica)."""
    if (script is None) == (m is None):
        raise ValueError("exactly one of --script and -m must be specified")
    _min_nnodes, max_nnodes, nproc_per_node, nnodes_rep = parse_nnodes(j)
    if max_nnodes == 1:
        rdzv_endpoint = "localhost:0"
    else:
        rdzv_endpoint = _noquote(f"$${{${{rank0_env}}:=localhost}}:{rdzv_port}")
    env = dict(env or {})
    run_name = name.rpartition("/")[2] or Path(script or m.rpartition(".")[2]).stem
    experiment = name.partition("/")[0] if "/" in name else ""
    env["TORCHX_TRACKING_EXPERIMENT_NAME"] = experiment or "default-experiment"
    env["TORCHX_TRACKING_RUN_NAME"] = run_name
    env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    if debug:
        env.update(
            {
                "CUDA_LAUNCH_BLOCKING": "1",
                "NCCL_DESYNC_DEBUG": "1",
                "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                "TORCH_SHOW_CPP_STACKTRACES": "1",
            }
        )
    cmd = ["torchrun", "--rdzv_backend", rdzv_backend]
    cmd += ["--rdzv_conf", rdzv_conf] if rdzv_conf is not None else []
    cmd += ["--rdzv_endpoint", rdzv_endpoint, "--rdzv_id", "${app_id}"]
    cmd += ["--nnodes", nnodes_rep, "--nproc_per_node", str(nproc_per_node)]
    cmd += ["--tee", str(tee), "--role", ""]
    cmd += [script] if script is not None else ["-m", m]
    cmd += list(script_args)
    quoted = [a if isinstance(a, _noquote) else shlex.quote(a) for a in cmd]
    role = Path(script).stem if script else m.rpartition(".")[2]
    return {
        "name": run_name,
        "role": role,
        "num_replicas": max_nnodes,
        "entrypoint": "bash",
        "args": ["-c", " ".join(quoted)],
        "env": env,
        "max_retries": max_retries,
    }


COMPONENTS = {"dist.ddp": ddp}


# ---- torchx.specs.builders -------------------------------------------------------------------


def to_dict(arg: str) -> dict[str, str]:
    """torchx.util.types.to_dict: 'K1=v1,K2=v2' (the last delimiter before a key splits)."""
    out: dict[str, str] = {}
    if not arg:
        return out
    parts = arg.split("=")
    key = parts[0].strip()
    for vk in parts[1:-1]:
        idx = max(vk.rfind(","), vk.rfind(";"))
        if idx <= 0 or len(vk) == idx + 1:
            raise ValueError(f"`{vk}` cannot be split into `val<delim>key` with delims=[',', ';']")
        out[key] = vk[:idx].strip()
        key = vk[idx + 1 :].strip()
    out[key] = parts[-1].strip()
    return out


def _parser_for(fn: Any) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"torchx run <run args...> {fn.__name__} ",
        description=inspect.getdoc(fn),
        add_help=False,
    )
    parser.add_argument("--help", action="help", default=argparse.SUPPRESS)

    class _reminder_action(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, self.dest, values if values else (self.default or "").split())

    for name, p in inspect.signature(fn).parameters.items():
        ann = p.annotation
        kwargs: dict[str, Any] = {"type": ann if ann in (int, str, float) else str}
        if p.default is not inspect.Parameter.empty:
            kwargs["default"] = str(p.default) if isinstance(p.default, bool) else p.default
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            parser.add_argument(name, nargs=argparse.REMAINDER, action=_reminder_action, **kwargs)
        else:
            names = [f"--{name}"] if len(name) > 1 else [f"-{name}", f"--{name}"]
            if "default" not in kwargs:
                kwargs["required"] = True
            parser.add_argument(*names, **kwargs)
    return parser


def materialize_appdef(fn: Any, args: list[str]) -> dict:
    parsed = _parser_for(fn).parse_args(args)
    var_args: list[str] = []
    kwargs: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        value = getattr(parsed, name)
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            var_args = value
        elif name == "env" and value is not None:
            kwargs[name] = to_dict(value)
        elif name == "mounts" and value is not None:
            kwargs[name] = value.split(",")
        elif name == "debug":
            kwargs[name] = value and str(value).lower() == "true"
        else:
            kwargs[name] = value
    if var_args and var_args[0] == "--":
        var_args = var_args[1:]
    return fn(*var_args, **kwargs)


# ---- torchx.schedulers.local_scheduler -------------------------------------------------------


class AppState(int, Enum):
    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{self.name} ({self.value})"


TERMINAL = (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)


class SignalException(Exception):
    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


SignalException.__module__ = "torchx.schedulers.local_scheduler"  # as its traceback names it


def _terminate_process_handler(signum: int, frame: Any) -> None:
    sigval = signal.Signals(signum)
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)


def random_id() -> str:
    start, end = "bcdfghjklmnpqrstvwxz", "bcdfghjklmnpqrstvwxz012345679"
    out = ""
    v = struct.unpack("!Q", os.urandom(8))[0]
    while v > 0:
        candidates = start if out == "" else end
        out += candidates[v % len(candidates)]
        v //= len(candidates)
    return out


class Tee:
    """Merges a replica's stdout.log and stderr.log into combined.log (polled every 0.1 s)."""

    def __init__(self, out: io.FileIO, *sources: str) -> None:
        self.lock = threading.Lock()
        self.out = out
        self.streams = []
        for source in sources:
            r = open(source, "rb", buffering=0)  # noqa: SIM115
            os.set_blocking(r.fileno(), False)
            self.streams.append(r)
        self._closed = False
        self.thread = threading.Thread(target=self._start_thread, daemon=True)
        self.thread.start()

    def _start_thread(self) -> None:
        while True:
            read = False
            for r in self.streams:
                data = r.read(64000)
                if data:
                    read = True
                    with self.lock:
                        self.out.write(data)
            if not read:
                if self._closed:
                    break
                time.sleep(0.1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.thread.join()
        for s in self.streams:
            s.close()
        self.out.close()


class Replica:
    def __init__(
        self, role: str, replica_id: int, log_dir: str, env: dict[str, str], args: list[str]
    ):
        self.role_name, self.replica_id = role, replica_id
        os.makedirs(log_dir)
        self.stdout = open(os.path.join(log_dir, "stdout.log"), "wb", buffering=0)  # noqa: SIM115
        self.stderr = open(os.path.join(log_dir, "stderr.log"), "wb", buffering=0)  # noqa: SIM115
        combined = open(os.path.join(log_dir, "combined.log"), "wb", buffering=0)  # noqa: SIM115
        self.combined = Tee(
            combined, os.path.join(log_dir, "stdout.log"), os.path.join(log_dir, "stderr.log")
        )
        self.error_file = env.get("TORCHELASTIC_ERROR_FILE", "<N/A>")
        full = os.environ.copy()
        full.update(env)
        full["PATH"] = ":".join(p for p in (env.get("PATH"), os.getenv("PATH")) if p)
        full.setdefault("PYTHONUNBUFFERED", "x")
        self.proc = subprocess.Popen(
            args,
            env=full,
            stdout=self.stdout,
            stderr=self.stderr,
            start_new_session=True,
            cwd=os.getcwd(),
        )

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.stdout.close()
        self.stderr.close()
        self.combined.close()


class LocalApp:
    def __init__(self, app_id: str, log_dir: str) -> None:
        self.id, self.log_dir = app_id, log_dir
        self.replicas: list[Replica] = []
        self.state = AppState.PENDING
        self.closed = False
        self.lock = threading.Lock()

    def kill(self) -> None:
        for r in self.replicas:
            r.terminate()
        end = time.monotonic() + 10
        for r in self.replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(max(end - time.monotonic(), 0.01))
        for r in self.replicas:
            if r.proc.poll() is None:
                r.proc.kill()
        for r in self.replicas:
            r.proc.wait()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.kill()

    def structured_error_msg(self) -> str:
        error_file, oldest = None, float("inf")
        for r in self.replicas:
            if os.path.exists(r.error_file) and os.path.getmtime(r.error_file) < oldest:
                oldest, error_file = os.path.getmtime(r.error_file), r.error_file
        if not error_file:
            return NONE
        with open(error_file) as f:
            return json.dumps(json.load(f))


class LocalScheduler:
    def __init__(self, session_name: str) -> None:
        self.session_name = session_name
        self.apps: dict[str, LocalApp] = {}
        self.base_log_dir: str | None = None
        signal.signal(signal.SIGTERM, _terminate_process_handler)
        signal.signal(signal.SIGINT, _terminate_process_handler)

    def submit(self, app: dict, cfg: dict[str, str]) -> str:
        app_id = f"{app['name']}-{random_id()}"
        self.base_log_dir = cfg.get("log_dir")
        if not self.base_log_dir:
            self.base_log_dir = tempfile.mkdtemp(prefix="torchx_")
            log.info(
                "Log directory not set in scheduler cfg."
                " Creating a temporary log dir that will be deleted on exit."
                " To preserve log directory set the `log_dir` cfg option"
            )
        log.info(f"Log directory is: {self.base_log_dir}")
        app_log_dir = os.path.join(self.base_log_dir, self.session_name, app_id)
        os.makedirs(app_log_dir)
        local_app = LocalApp(app_id, app_log_dir)
        handle = f"local_cwd://{self.session_name}/{app_id}"
        for replica_id in range(app["num_replicas"]):
            values = {
                "app_id": app_id,
                "replica_id": str(replica_id),
                "rank0_env": "TORCHX_RANK0_HOST",
                "img_root": "",
            }
            args = [Template(a).safe_substitute(values) for a in app["args"]]
            env = {k: Template(v).safe_substitute(values) for k, v in app["env"].items()}
            env["TORCHX_JOB_ID"] = handle
            env["PATH"] = os.getcwd()
            env["TORCHX_RANK0_HOST"] = "localhost"
            replica_log_dir = os.path.join(app_log_dir, app["role"], str(replica_id))
            env.setdefault("TORCHELASTIC_ERROR_FILE", os.path.join(replica_log_dir, "error.json"))
            env.setdefault("PET_LOG_DIR", os.path.join(app_log_dir, "torchelastic", app["role"]))
            local_app.replicas.append(
                Replica(app["role"], replica_id, replica_log_dir, env, [app["entrypoint"], *args])
            )
        local_app.state = AppState.RUNNING
        self.apps[handle] = local_app
        return handle

    def describe(self, handle: str) -> tuple[AppState, str, str]:
        local_app = self.apps[handle]
        error = local_app.structured_error_msg()
        if local_app.state not in TERMINAL:
            running = any(r.proc.poll() is None for r in local_app.replicas)
            failed = any(r.proc.poll() not in (None, 0) for r in local_app.replicas)
            if running:
                local_app.state = AppState.RUNNING
            elif failed:
                local_app.state = AppState.FAILED
            else:
                local_app.state = AppState.SUCCEEDED
        if local_app.state in TERMINAL:
            local_app.close()
        return local_app.state, error, f"file://{local_app.log_dir}"

    def log_iter(self, handle: str, replica: Replica):
        """LocalScheduler.log_iter: combined.log, followed until the app is finished."""
        path = os.path.join(self.apps[handle].log_dir, replica.role_name, str(replica.replica_id))
        path = os.path.join(path, "combined.log")
        finished = False
        while True:
            finished = self.describe(handle)[0] in TERMINAL
            if os.path.isfile(path):
                time.sleep(0.1)
                fp = open(path, newline="\n", errors="replace")  # noqa: SIM115
                break
            if finished:
                raise RuntimeError(f"app: {handle} finished without writing: {path}")
            time.sleep(0.1)
        while True:
            chunk = fp.read(64000)
            if not chunk:
                if finished:
                    fp.close()
                    return
                time.sleep(0.1)
                finished = self.describe(handle)[0] in TERMINAL
                continue
            while chunk:
                idx = chunk.find("\n")
                if idx < 0:
                    yield chunk
                    break
                yield chunk[: idx + 1]
                chunk = chunk[idx + 1 :]

    def close(self) -> None:
        for app in self.apps.values():
            app.kill()
        if self.base_log_dir:
            shutil.rmtree(self.base_log_dir, ignore_errors=True)


def app_status_repr(state: AppState, error: str, url: str) -> str:
    """AppStatus.__repr__: the status as YAML."""
    status = {
        "msg": NONE,
        "num_restarts": 0,
        "roles": [],
        "state": repr(state),
        "structured_error_msg": json.loads(error) if error != NONE else NONE,
        "ui_url": url,
    }
    return yaml.dump({"AppStatus": status})


def print_log_lines(file: TextIO, scheduler: LocalScheduler, handle: str, r: Replica) -> None:
    prefix = f"{r.role_name}/{r.replica_id} "
    for line in scheduler.log_iter(handle, r):
        if "\r" in line:
            line = line.replace("\r", f"\r{prefix}")
        if "\n" in line[:-1]:
            line = line[:-1].replace("\n", f"\n{prefix}") + line[-1:]
        if not line.startswith("\r"):
            line = f"{prefix}{line}"
        print(line, file=file, end="", flush=True)


def get_logs(file: TextIO, scheduler: LocalScheduler, handle: str) -> None:
    threads = []
    for r in scheduler.apps[handle].replicas:
        t = threading.Thread(target=print_log_lines, args=(file, scheduler, handle, r), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


# ---- torchx.cli ------------------------------------------------------------------------------


def cfg_from_str(text: str | None) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split(",")) if text else {}


def cmd_run(args: argparse.Namespace, subparser: argparse.ArgumentParser) -> None:
    nargs = list(args.component_name_and_args)
    if nargs and nargs[0] == "--":
        nargs = nargs[1:]
    component, component_args = (None, nargs)
    if nargs and not nargs[0].startswith("-"):
        component, component_args = nargs[0], nargs[1:]
    for _, group in groupby(component_args, key=lambda x: x == "--"):
        options = [x for x in group if x.startswith("-") and x.strip() not in ("-", "--")]
        duplicates = [a for a, c in Counter(options).items() if c > 1]
        if duplicates:
            subparser.error(f"Repeated Command Line Arguments: {duplicates}")
    if not component:
        subparser.error(
            "missing component name, either provide it from the CLI or in .torchxconfig"
        )
    if component not in COMPONENTS:
        logger.error(f"\nFailed to run component `{component}` got errors: \n {component}")
        sys.exit(1)
    scheduler = LocalScheduler("torchx")
    try:
        app = materialize_appdef(COMPONENTS[component], component_args)
        handle = scheduler.submit(app, cfg_from_str(args.scheduler_args))
        print(handle)
        logger.info("Waiting for the app to finish...")
        log_thread = threading.Thread(
            target=get_logs, args=(sys.stderr, scheduler, handle), daemon=True
        )
        log_thread.start()
        while True:
            state, error, url = scheduler.describe(handle)
            if state in TERMINAL:
                break
            time.sleep(1)
        logger.info(f"Job finished: {state}")
        log_thread.join()
        if state != AppState.SUCCEEDED:
            logger.error(app_status_repr(state, error, url))
            sys.exit(1)
    finally:
        scheduler.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="torchx CLI")
    parser.add_argument("--log_level", type=str, default=os.getenv("LOGLEVEL", "INFO"))
    sub = parser.add_subparsers(title="sub-commands")
    run = sub.add_parser("run")
    run.add_argument("-s", "--scheduler", type=str, default="default", choices=["local_cwd"])
    run.add_argument("-cfg", "--scheduler_args", type=str)
    run.add_argument("--dryrun", action="store_true", default=False)
    run.add_argument("--wait", action="store_true", default=False)
    run.add_argument("--log", action="store_true", default=False)
    run.add_argument("--workspace", "--buck-target", default=f"{Path.cwd()}")
    run.add_argument("--parent_run_id", type=str)
    run.add_argument("--tee_logs", action="store_true", default=False)
    run.add_argument("component_name_and_args", nargs=argparse.REMAINDER)
    run.set_defaults(func=lambda a: cmd_run(a, run))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="torchx %(asctime)s %(levelname)-8s %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    if "func" not in args:
        parser.print_help()
        sys.exit(1)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
