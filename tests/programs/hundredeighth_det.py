"""A re-created Determined cluster for the hundred-and-eighth style's fixtures
(tests/fixtures/real/hundredeighth-*), without determined installed: the `det` command a user
runs (`det experiment create CONFIG CONTEXT`, `det experiment wait|pause|kill ID`, `det trial
logs ID`), and behind it the master and one agent on this machine.

What Determined 0.27 does is re-created from its sources (master/internal/task/allocation.go,
master/internal/trial.go, master/pkg/model/task.go, agent/pkg/docker, harness/determined/exec):
the master's task logs of an allocation ('Scheduling Trial T (Experiment E) (id: TASK.RUN)',
'Trial T (Experiment E) was assigned to an agent'), the agent's ('image already found, skipping
pull phase: IMAGE', 'copying files to container: /', 'Resources for Trial ... have started'), the
container's output shipped line by line as ship_logs.py does it (a '[rank=N] ' prefix taken into
the rank field, a leading 'INFO:'/'WARNING:'/'ERROR:' into the level), the container's exit
('resources exited successfully with a zero exit code', or ERROR 'crashed: resources failed with
non-zero exit code: container failed with non-zero exit code: N (exit code N)', then 'Trial T
(Experiment E) was terminated: allocation stopped early after / preempted after / failed: ...'),
max_restarts (a failed allocation is scheduled again as TASK.RUN+1 until the restarts are used
up, from the trial's latest checkpoint), `det experiment pause` as the master's graceful
preemption ('gracefully terminating allocation's remaining resources (reason: user requested
pause)'; the trial's preempt.should_preempt() turns True), and `det trial logs` printing each
log as TaskLog.Message() does: '[2026-12-06T05:31:22.104117Z] 7f3c2a1b [rank=1] || INFO: ...',
eight spaces where a master's log has no container. A container is a private mount, UTS and
PID namespace (`unshare --pid --fork --kill-child`; needs root) with /run/determined its own
(entrypoint.sh, the workdir with the experiment's context, info/cluster_info.json, the
pythonuserbase holding the determined package of tests/programs/hundredeighth_harness.py), its
own /etc/hosts and hostname; its first process stands for ship_logs.py (it runs entrypoint.sh,
passes signals on and exits 128 + N for a child killed by signal N), and when it exits the
kernel kills whatever is left in the container, as Docker's PID 1 does; entrypoint.sh is
Determined's (prep_container, the startup hook under `set -x`, `exec python3 -m
determined.exec.launch`). The cluster's state lives in $DETSIM_HOME (experiments, trials, their
logs as JSON lines, each allocation's folder standing for the master's API).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

HARNESS = Path(__file__).resolve().with_name("hundredeighth_harness.py")
RANK = re.compile(r"(?P<space1> ?)\[rank=(?P<rank_id>([0-9]+))\](?P<space2> ?)(?P<log>.*)", re.S)
LEVEL = re.compile(
    r"(?P<space1> ?)(?P<level>(DEBUG|INFO|WARNING|ERROR|CRITICAL)):(?P<space2> ?)(?P<log>.*)",
    re.S,
)
LINEEND = re.compile(rb"[\r\n]")
AGENT = "cpu-node-02"

ENTRYPOINT = """#!/bin/bash

set -e

STARTUP_HOOK="startup-hook.sh"
export PATH="/run/determined/pythonuserbase/bin:$PATH"

if [ -z "$DET_PYTHON_EXECUTABLE" ]; then
    export DET_PYTHON_EXECUTABLE="python3"
fi
"$DET_PYTHON_EXECUTABLE" -m determined.exec.prep_container --download_context_directory --resources --proxy

set -x
test -f "${STARTUP_HOOK}" && source "${STARTUP_HOOK}"
set +x

# Do rendezvous last, to ensure all launch layers start around the same time.
"$DET_PYTHON_EXECUTABLE" -m determined.exec.prep_container --rendezvous

exec "$DET_PYTHON_EXECUTABLE" -m determined.exec.launch "$@"
"""

SHIP_LOGS = """import signal, subprocess, sys

# ship_logs.py, the container's first process: it runs the entrypoint, passes signals on, and
# exits as bash would (128 + N for a child killed by signal N); the shipping itself is the agent's
# reading of the container's output here.
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGWINCH):
    signal.signal(sig, lambda signum, frame: p.send_signal(signum))
code = p.wait()
sys.exit(128 - code if code < 0 else code)
"""

MODULES = [
    "determined/__init__.py",
    "determined/exec/prep_container.py",
    "determined/exec/launch.py",
    "determined/exec/pid_server.py",
    "determined/exec/pid_client.py",
    "determined/launch/torch_distributed.py",
    "determined/launch/wrap_rank.py",
]


def home() -> Path:
    return Path(os.environ.get("DETSIM_HOME", Path.home() / ".detsim"))


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- the task log store
class TaskLogs:
    def __init__(self, trial_id: int) -> None:
        self.path = home() / "trials" / str(trial_id) / "logs.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()

    def insert(
        self,
        log: str,
        *,
        container: str | None = None,
        rank: int | None = None,
        level: str | None = None,
    ) -> None:
        entry = {
            "timestamp": now(),
            "container_id": container,
            "rank_id": rank,
            "level": level,
            "log": log,
        }
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def master(self, log: str, level: str = "INFO", container: str | None = None) -> None:
        """A log the master writes itself (enrichLog: INFO unless given, a newline added)."""
        self.insert(log + "\n", container=container, level=level)

    def ship(self, line: str, container: str) -> None:
        """ship_logs.py's parse of one line of the container's output."""
        rank = None
        m = RANK.match(line)
        if m:
            rank = int(m.group("rank_id"))
            line = m.group("log")
        level = None
        m = LEVEL.match(line)
        if m:
            level = m.group("level")
            line = m.group("log")
        self.insert(line, container=container, rank=rank, level=level)


def message(entry: dict) -> str:
    """model.TaskLog.Message(): the flat line UIs and the CLI show."""
    parts = [f"[{entry['timestamp']}]"]
    parts.append((entry["container_id"] or "")[:8] or " " * 8)
    if entry["rank_id"] is not None:
        parts.append(f"[rank={entry['rank_id']}]")
    parts.append("||")
    if entry["level"]:
        parts.append(f"{entry['level']}:")
    parts.append(entry["log"])
    return " ".join(parts)


def read_lines(fd) -> object:
    """ship_logs.py's read_newlines_or_carriage_returns."""
    chunks: list[bytes] = []
    while True:
        buf = fd.read1(4095) if hasattr(fd, "read1") else fd.read(4095)
        if not buf:
            break
        while buf:
            m = LINEEND.search(buf)
            if m is None:
                chunks.append(buf)
                break
            start, end = m.span()
            chunks.append(buf[:start] + b"\n")
            yield b"".join(chunks).decode("utf8", errors="replace")
            chunks = []
            buf = buf[end:]
    if chunks:
        yield b"".join(chunks).decode("utf8", errors="replace") + "\n"


# ---------------------------------------------------------------- the experiment config
def expand_config(config: dict) -> dict:
    """The experiment config as the master completes it with its defaults."""
    hp = {}
    for k, v in (config.get("hyperparameters") or {}).items():
        hp[k] = v if isinstance(v, dict) and "type" in v else {"type": "const", "val": v}
    storage = dict(config.get("checkpoint_storage") or {})
    storage.setdefault("save_experiment_best", 0)
    storage.setdefault("save_trial_best", 1)
    storage.setdefault("save_trial_latest", 1)
    storage.setdefault("storage_path", None)
    env = dict(config.get("environment") or {})
    image = env.get("image", "determinedai/pytorch-ngc-dev:0736b6d")
    env["image"] = {"cpu": image, "cuda": image, "rocm": image} if isinstance(image, str) else image
    variables = env.get("environment_variables") or []
    if isinstance(variables, list):
        variables = {"cpu": variables, "cuda": variables, "rocm": variables}
    env["environment_variables"] = variables
    env.setdefault("force_pull_image", False)
    env.setdefault("pod_spec", None)
    env.setdefault("ports", {})
    env.setdefault("registry_auth", None)
    resources = dict(config.get("resources") or {})
    resources.setdefault("slots_per_trial", 1)
    resources.setdefault("resource_pool", "default")
    resources.setdefault("priority", None)
    resources.setdefault("max_slots", None)
    resources.setdefault("shm_size", None)
    resources.setdefault("devices", [])
    searcher = dict(config["searcher"])
    searcher.setdefault("smaller_is_better", True)
    searcher.setdefault("source_checkpoint_uuid", None)
    searcher.setdefault("source_trial_id", None)
    out = {
        "bind_mounts": config.get("bind_mounts", []),
        "checkpoint_policy": config.get("checkpoint_policy", "best"),
        "checkpoint_storage": storage,
        "data": config.get("data", {}),
        "debug": config.get("debug", False),
        "description": config.get("description"),
        "entrypoint": config["entrypoint"],
        "environment": env,
        "hyperparameters": hp,
        "labels": config.get("labels", []),
        "log_policies": [],
        "max_restarts": config.get("max_restarts", 5),
        "min_checkpoint_period": config.get("min_checkpoint_period", {"batches": 0}),
        "min_validation_period": config.get("min_validation_period", {"batches": 0}),
        "name": config.get("name"),
        "optimizations": {
            "aggregation_frequency": 1,
            "average_aggregated_gradients": True,
            "average_training_metrics": True,
            "grad_updates_size_file": None,
            "gradient_compression": False,
            "mixed_precision": "O0",
            "tensor_fusion_cycle_time": 1,
            "tensor_fusion_threshold": 64,
        },
        "perform_initial_validation": False,
        "profiling": {
            "begin_on_batch": 0,
            "enabled": False,
            "end_after_batch": None,
            "sync_timings": True,
        },
        "project": config.get("project", "Uncategorized"),
        "records_per_epoch": config.get("records_per_epoch", 0),
        "reproducibility": {"experiment_seed": 1765000321},
        "resources": resources,
        "scheduling_unit": 100,
        "searcher": searcher,
        "workspace": config.get("workspace", "Uncategorized"),
    }
    return out


def hparams_of(config: dict) -> dict:
    return {k: v["val"] for k, v in config["hyperparameters"].items()}


# ---------------------------------------------------------------- the master (a daemon process)
class Master:
    def __init__(self, exp_id: int) -> None:
        self.exp_dir = home() / "experiments" / str(exp_id)
        self.exp = json.loads((self.exp_dir / "experiment.json").read_text())
        self.config = self.exp["config"]
        self.exp_id = exp_id
        self.trial_id = self.exp["trial_id"]
        self.trial_dir = home() / "trials" / str(self.trial_id)
        self.logs = TaskLogs(self.trial_id)
        self.name = f"Trial {self.trial_id} (Experiment {exp_id})"
        self.task_id = f"{exp_id}.{uuid.uuid4()}"
        self.rng = random.Random()

    def state(self, value: str) -> None:
        (self.exp_dir / "state").write_text(value)

    def latest_checkpoint(self) -> tuple[str | None, int]:
        path = self.trial_dir / "checkpoints.jsonl"
        if not path.exists():
            return None, 0
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not lines:
            return None, 0
        return lines[-1]["uuid"], int(lines[-1]["metadata"].get("steps_completed", 0))

    def run(self) -> None:
        restarts = 0
        run_id = 0
        max_restarts = int(self.config.get("max_restarts", 5))
        self.state("ACTIVE")
        while True:
            run_id += 1
            allocation = f"{self.task_id}.{run_id}"
            outcome = self.allocate(allocation, run_id)
            if outcome == "failed":
                restarts += 1
                if restarts > max_restarts:
                    self.state("ERROR")
                    return
                continue
            self.state(outcome)
            return

    def build_container(self, cid: str, allocation: str, run_id: int, hostname: str) -> Path:
        croot = home() / "containers" / cid
        (croot / "info").mkdir(parents=True)
        shutil.copytree(self.exp_dir / "context", croot / "workdir", symlinks=False)
        (croot / "entrypoint.sh").write_text(ENTRYPOINT)
        (croot / "ship_logs.py").write_text(SHIP_LOGS)
        (croot / "hosts").write_text(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"127.0.1.1\t{hostname}\n"
        )
        site = croot / "pythonuserbase" / "lib" / "python3.11" / "site-packages"
        for module in MODULES:
            target = site / module
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / "__init__.py").touch()
            if target.name == "__init__.py":
                target.unlink()
            target.symlink_to(HARNESS)
        (croot / "pythonuserbase" / "bin").mkdir(parents=True)
        latest, steps = self.latest_checkpoint()
        slots = int(self.config["resources"]["slots_per_trial"])
        info = {
            "master_url": "http://10.20.0.5:8080",
            "cluster_id": "4c7e5ba4-53be-4c7b-9d07-1e4ecb6b1f0a",
            "agent_id": AGENT,
            "slot_ids": list(range(slots)),
            "task_id": self.task_id,
            "allocation_id": allocation,
            "task_type": "TRIAL",
            "container_addrs": ["10.20.0.12"],
            "container_rank": 0,
            "latest_checkpoint": latest,
            "trial": {
                "trial_id": self.trial_id,
                "experiment_id": self.exp_id,
                "trial_run_id": run_id,
                "hparams": hparams_of(self.config),
                "config": self.config,
                "steps_completed": steps,
            },
        }
        (croot / "info" / "cluster_info.json").write_text(json.dumps(info))
        return croot

    def allocate(self, allocation: str, run_id: int) -> str:
        logs = self.logs
        logs.master(f"Scheduling {self.name} (id: {allocation})")
        time.sleep(0.4 + self.rng.random() * 0.4)
        logs.master(f"{self.name} was assigned to an agent")
        cid = str(uuid.uuid4())
        image = self.config["environment"]["image"]["cpu"]
        logs.master(f"image already found, skipping pull phase: docker.io/{image}", container=cid)
        api = home() / "allocations" / allocation
        api.mkdir(parents=True)
        hostname = uuid.uuid4().hex[:12]
        croot = self.build_container(cid, allocation, run_id, hostname)
        for path in ("/", "/run/determined", "/", "/", "/"):
            logs.master(f"copying files to container: {path}", container=cid)
        proc = self.start_container(cid, croot, api, allocation, hostname)
        logs.master(f"Resources for {self.name} have started", container=cid)
        readers = [
            threading.Thread(target=self.collect, args=(stream, cid), daemon=True)
            for stream in (proc.stdout, proc.stderr)
        ]
        for r in readers:
            r.start()
        preempting = killing = False
        while proc.poll() is None:
            if not preempting and (self.exp_dir / "pause").exists():
                preempting = True
                logs.master(
                    "gracefully terminating allocation's remaining resources "
                    "(reason: user requested pause)"
                )
                (api / "preempt").touch()
            if not killing and (self.exp_dir / "kill").exists():
                killing = True
                logs.master(
                    "forcibly killing allocation's remaining resources (reason: user requested "
                    "kill)"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.2)
        for r in readers:
            r.join(timeout=10)
        code = proc.returncode
        if code < 0:
            code = 128 - code  # docker's exit code of a container killed by a signal
        # whatever the container left behind (its processes' group) goes with the container
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/tmp/pid_server-{allocation}")
        time.sleep(0.3)
        if killing:
            failure = f"container failed with non-zero exit code: {code} (exit code {code})"
            logs.master(
                f"killed: resources failed with non-zero exit code: {failure}", container=cid
            )
            logs.master(
                f"{self.name} was terminated: allocation killed after resources were killed"
            )
            return "CANCELED"
        if code == 0:
            ok = "resources exited successfully with a zero exit code"
            logs.master(ok, container=cid)
            reason = f"all resources exited: {ok}"
            if preempting and (api / "ack").exists() and (api / "ack").read_text() == "preemption":
                logs.master(f"{self.name} was terminated: allocation preempted after {reason}")
                return "PAUSED"
            logs.master(f"{self.name} was terminated: allocation stopped early after {reason}")
            return "COMPLETED"
        failure = (
            "resources failed with non-zero exit code: container failed with non-zero exit "
            f"code: {code} (exit code {code})"
        )
        logs.master(f"crashed: {failure}", level="ERROR", container=cid)
        logs.master(f"{self.name} was terminated: allocation failed: {failure}", level="ERROR")
        return "failed"

    def start_container(
        self, cid: str, croot: Path, api: Path, allocation: str, hostname: str
    ) -> subprocess.Popen:
        venv_bin = Path(sys.executable).parent
        env = {
            "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": hostname,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONUSERBASE": "/run/determined/pythonuserbase",
            "PYTHONPATH": "/run/determined/pythonuserbase/lib/python3.11/site-packages",
            "DET_MASTER": "http://10.20.0.5:8080",
            "DET_MASTER_ADDR": "10.20.0.5",
            "DET_MASTER_PORT": "8080",
            "DET_CLUSTER_ID": "4c7e5ba4-53be-4c7b-9d07-1e4ecb6b1f0a",
            "DET_AGENT_ID": AGENT,
            "DET_CONTAINER_ID": cid,
            "DET_RESOURCES_ID": cid,
            "DET_RESOURCES_TYPE": "docker-container",
            "DET_ALLOCATION_ID": allocation,
            "DET_TASK_ID": self.task_id,
            "DET_TASK_TYPE": "TRIAL",
            "DET_TRIAL_ID": str(self.trial_id),
            "DET_EXPERIMENT_ID": str(self.exp_id),
            "DET_SLOT_IDS": json.dumps(
                list(range(int(self.config["resources"]["slots_per_trial"])))
            ),
            "DETSIM_API": str(api),
        }
        for item in self.config["environment"]["environment_variables"].get("cpu", []):
            k, _, v = item.partition("=")
            env[k] = v
        # what the simulation passes through from the cluster's own environment (never printed)
        for k in ("TQ_CASE", "C10D_PORT"):
            if k in os.environ:
                env[k] = os.environ[k]
        env_args = " ".join(f"{k}={json.dumps(v)}" for k, v in env.items())
        inner = (
            "mount -t tmpfs -o size=64m tmpfs /run && mkdir -p /run/determined && "
            f"mount --bind {croot} /run/determined && mount --bind {croot}/hosts /etc/hosts && "
            f"hostname {hostname} && "
            f"cd /run/determined/workdir && exec env -i {env_args} python3 "
            "/run/determined/ship_logs.py /bin/bash /run/determined/entrypoint.sh"
        )
        proc = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--uts",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                inner,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (croot / "pid").write_text(str(proc.pid))
        (home() / "containers" / "latest").unlink(missing_ok=True)
        (home() / "containers" / "latest").symlink_to(croot)
        return proc

    def collect(self, stream, cid: str) -> None:
        for line in read_lines(stream):
            self.logs.ship(line, cid)


# ---------------------------------------------------------------- the CLI
def next_id(kind: str, first: int) -> int:
    path = home() / f"next_{kind}_id"
    value = int(path.read_text()) if path.exists() else first
    path.write_text(str(value + 1))
    return value


def size_fmt(num: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(num) < 1024.0:
            return f"{num:3.1f}{unit}B"
        num /= 1024.0
    return f"{num:.1f}TB"


def experiment_create(config_path: str, context: str) -> int:
    config = expand_config(yaml.safe_load(Path(config_path).read_text()))
    files = [p for p in Path(context).rglob("*") if p.is_file() and ".detignore" not in p.name]
    total = sum(p.stat().st_size for p in files)
    print(f"Preparing files to send to master... {size_fmt(total)} and {len(files)} files")
    home().mkdir(parents=True, exist_ok=True)
    exp_id = next_id("experiment", 7)
    trial_id = next_id("trial", 12)
    exp_dir = home() / "experiments" / str(exp_id)
    exp_dir.mkdir(parents=True)
    shutil.copytree(context, exp_dir / "context", symlinks=False)
    (exp_dir / "experiment.json").write_text(
        json.dumps({"id": exp_id, "trial_id": trial_id, "config": config})
    )
    (exp_dir / "state").write_text("ACTIVE")
    with open(exp_dir / "master.log", "w") as out:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_master", str(exp_id)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(f"Created experiment {exp_id}")
    return 0


def experiment_wait(exp_id: str) -> int:
    state_file = home() / "experiments" / exp_id / "state"
    while True:
        state = state_file.read_text().strip()
        if state in ("COMPLETED", "ERROR", "PAUSED", "CANCELED"):
            print(f"Experiment {exp_id} terminated with state {state}")
            return 0 if state == "COMPLETED" else 1
        time.sleep(0.5)


def trial_logs(trial_id: str) -> int:
    path = home() / "trials" / trial_id / "logs.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            print(message(json.loads(line)), end="")
    print(f"Trial log stream ended. To reopen log stream, run: det trial logs -f {trial_id}")
    return 0


def main() -> int:
    args = [a for a in sys.argv[1:]]
    if args[:2] == ["-m", args[1] if len(args) > 1 else ""]:
        args = args[2:]
    if args[:1] == ["_master"]:
        Master(int(args[1])).run()
        return 0
    if args[:1] in (["experiment"], ["e"]):
        sub, rest = args[1], args[2:]
        if sub == "create":
            return experiment_create(rest[0], rest[1])
        if sub == "wait":
            return experiment_wait(rest[0])
        if sub in ("pause", "kill"):
            (home() / "experiments" / rest[0] / sub).touch()
            print(f"Experiment {rest[0]} {'paused' if sub == 'pause' else 'killed'}.")
            return 0
    if args[:2] == ["trial", "logs"]:
        return trial_logs(args[2])
    print(
        f"usage: det experiment create|wait|pause|kill ... | det trial logs ID (got {args})",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
