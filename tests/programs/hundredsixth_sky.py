"""A re-created `sky` command (SkyPilot) for the hundred-and-sixth style's fixtures
(tests/fixtures/real/hundredsixth-*), without skypilot, Ray or Kubernetes installed: `sky launch
-c CLUSTER task.yaml` on a cluster of simulated nodes on this machine, and `sky down CLUSTER`.

What SkyPilot does is re-created from its sources (sky/backends/task_codegen.py,
sky/skylet/log_lib.py): the launch's own lines ('⚙︎ Launching on Kubernetes.', '✓ Cluster
launched: ...', '⚙︎ Job submitted, ID: N'); the job driver, a process of its own that keeps
running when the client stops streaming, which prints '├── Waiting for task resources on N
nodes.' and '└── Job started. Streaming logs... (Ctrl-C to exit log streaming; job will not be
killed)', runs the task's setup on every node (its lines prefixed '(setup pid=P) ' on the head,
'(setup pid=P, ip=IP) ' on a worker) and then its run section on every node (prefixed '(head,
rank=0, pid=P) ', '(worker1, rank=1, pid=P, ip=IP) ': SkyPilot's rank is the node's), each as
`/bin/bash -i` of SkyPilot's task script (source ~/.bashrc, PYTHONUNBUFFERED=1, cd
~/sky_workdir, the task's envs, SKYPILOT_NODE_RANK / SKYPILOT_NUM_NODES / SKYPILOT_NODE_IPS /
SKYPILOT_NUM_GPUS_PER_NODE / SKYPILOT_TASK_ID), stdout and stderr merged, bash's two '-i'
warnings skipped; get_or_fail: when a node's run section ends with a non-zero code, the nodes
still running are killed (their output stops there: the Ray worker that streamed it is gone)
and get return code 137; the epilogue 'ERROR: Job N failed with return code list: [...]' with
SkyPilot's reason; and the client's tail of the job's log ('✓ Job finished (status:
SUCCEEDED).' / '✗ Job finished (status: FAILED).', the log tail's ssh session closing, the
'📋 Useful Commands' block). Ctrl-C (SIGINT) of the client stops the streaming only, as
SkyPilot's API client says; the job runs on.

A node is a network namespace of its own (an address on a bridge of the cluster's namespaces,
a hostname in /etc/hosts), and a mount namespace in which /home is the node's own folder
(/home/sky holds ~/sky_workdir, its wheels and pip's target) and each storage mount (a bucket)
is the cluster's shared folder. The cluster is described by cluster.json in
$SKYSIM_HOME/clusters/CLUSTER/ (written by the capture script): nodes (name, ip, extra
addresses, folder), the storage mounts, per-node environment the simulation adds (never
printed), the addresses Ray reports for SKYPILOT_NODE_IPS. `sky down` kills every process of
the cluster's nodes and removes its namespaces.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

SKIP = ("bash: cannot set terminal process group", "bash: no job control in this shell")
RUNNING = ("PENDING", "SETTING_UP", "RUNNING")


def cluster_dir(name: str) -> Path:
    return Path(os.environ["SKYSIM_HOME"]) / "clusters" / name


def load(name: str) -> dict:
    return json.loads((cluster_dir(name) / "cluster.json").read_text())


def ns(cluster: dict, node: dict) -> str:
    return f"{cluster['netns_prefix']}-{node['name']}"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


# ---------------------------------------------------------------- the cloud (the simulation)
def provision(cluster: dict) -> None:
    """The cluster's network: a bridge in a namespace of its own, each node's namespace on it."""
    prefix = cluster["netns_prefix"]
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if f"{prefix}-switch" in existing:
        return
    sw = f"{prefix}-switch"
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    if cluster.get("gateway"):  # a router that forwards nothing: what it is sent is dropped
        gw = f"{prefix}-gw"
        sh("ip", "netns", "add", gw)
        sh("ip", "-n", sw, "link", "add", "vgw", "type", "veth", "peer", "name", "eth0",
           "netns", gw)  # fmt: skip
        sh("ip", "-n", sw, "link", "set", "vgw", "master", "br0", "up")
        sh("ip", "-n", gw, "addr", "add", f"{cluster['gateway']}/24", "dev", "eth0")
        sh("ip", "-n", gw, "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", gw, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    for i, node in enumerate(cluster["nodes"]):
        n = ns(cluster, node)
        sh("ip", "netns", "add", n)
        sh("ip", "-n", sw, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
           "netns", n)  # fmt: skip
        sh("ip", "-n", sw, "link", "set", f"v{i}", "master", "br0", "up")
        for addr in [node["ip"], *node.get("extra_addrs", [])]:
            sh("ip", "-n", n, "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", n, "link", "set", "eth0", "up")
        sh("ip", "-n", n, "link", "set", "lo", "up")
        for net, via in node.get("routes", []):
            sh("ip", "-n", n, "route", "add", net, "via", via)


def node_pids(cluster: dict, node: dict) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", ns(cluster, node)], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


def kill_node(cluster: dict, node: dict, sig: int) -> None:
    for pid in node_pids(cluster, node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def down(name: str) -> None:
    cluster = load(name)
    for node in cluster["nodes"]:
        kill_node(cluster, node, signal.SIGKILL)
    for pidfile in (cluster_dir(name) / "jobs").glob("*/driver.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    time.sleep(1)
    for node in cluster["nodes"]:
        subprocess.run(["ip", "netns", "del", ns(cluster, node)], check=False)
    for extra in ("gw", "switch"):
        subprocess.run(
            ["ip", "netns", "del", f"{cluster['netns_prefix']}-{extra}"],
            check=False,
            stderr=subprocess.DEVNULL,
        )


def node_command(cluster: dict, node: dict, script: Path, env: dict[str, str]) -> list[str]:
    """`/bin/bash -i SCRIPT` on the node: its network, its hostname, its /home, the mounts."""
    home = Path(node["folder"]) / "home"
    binds = [f"mount --bind {shlex.quote(str(home))} /home"]
    binds.append(f"mount --bind {shlex.quote(str(Path(node['folder']) / 'hosts'))} /etc/hosts")
    for target, source in cluster["mounts"].items():
        binds.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    inner = (
        f"hostname {shlex.quote(node['hostname'])} && {' && '.join(binds)} && "
        f"cd /home/sky && exec env -i {env_args} /bin/bash -i {shlex.quote(str(script))}"
    )
    return [
        "ip", "netns", "exec", ns(cluster, node), "unshare", "--uts", "--mount",
        "--propagation", "private", "--", "/bin/sh", "-c", inner,
    ]  # fmt: skip


# ---------------------------------------------------------------- the job driver (on the head)
class Driver:
    def __init__(self, name: str, job_id: int) -> None:
        self.name, self.job_id = name, job_id
        self.cluster = load(name)
        self.job = cluster_dir(name) / "jobs" / str(job_id)
        self.task = json.loads((self.job / "task.json").read_text())
        self.log = open(self.job / "run.log", "a", encoding="utf-8")  # noqa: SIM115
        self.lock = threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()

    def status(self, value: str) -> None:
        (self.job / "status").write_text(value)

    def script(self, node: dict, kind: str, body: str, env: dict[str, str]) -> Path:
        """SkyPilot's make_task_bash_script, written into the node's /tmp (its home here)."""
        lines = [
            "#!/bin/bash",
            "source ~/.bashrc",
            "set -a",
            ". $(conda info --base 2> /dev/null)/etc/profile.d/conda.sh > /dev/null 2>&1 || true",
            "set +a",
            "export PYTHONUNBUFFERED=1",
            "cd ~/sky_workdir",
        ]
        lines += [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]
        lines += [body, ""]
        path = Path(node["folder"]) / "home" / "sky" / ".sky" / f"sky_app_{kind}_{self.job_id}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))
        return Path("/home/sky/.sky") / path.name

    def start(self, node: dict, kind: str, body: str, env: dict[str, str], prefix: str) -> dict:
        base = {
            "HOME": "/home/sky",
            "USER": "sky",
            "LOGNAME": "sky",
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TERM": "xterm",
            "PATH": self.cluster["path"],
        }
        base.update(self.cluster.get("image_env", {}))
        base.update(self.cluster.get("node_env", {}).get(node["name"], {}))
        script = self.script(node, kind, body, env)
        proc = subprocess.Popen(
            node_command(self.cluster, node, script, base),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        task = {"node": node, "proc": proc, "muted": False, "prefix": prefix.format(pid=proc.pid)}
        task["reader"] = threading.Thread(target=self.stream, args=(task,), daemon=True)
        task["reader"].start()
        return task

    def stream(self, task: dict) -> None:
        for raw in iter(task["proc"].stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n").replace("\r\n", "\n")
            if task["muted"] or line.startswith(SKIP):
                continue
            self.write(task["prefix"] + line)

    def finished(self, task: dict) -> int | None:
        """The task's return code once its node reported it: a node lost with all its
        processes (a preempted VM) reports nothing until the job's other tasks have ended."""
        code = task["proc"].poll()
        if code is None:
            return None
        task["reader"].join(timeout=5)
        if code < 0:
            if -code == signal.SIGKILL and not task.get("cancelled"):
                return None  # the node is gone: Ray learns it only when it gives up on it
            return 128 - code
        return code

    def cancel(self, task: dict) -> None:
        """ray.cancel(force=True): the streaming worker dies (no more lines), the subprocess
        daemon SIGTERMs the task's processes, SIGKILLs what is left 30 s later."""
        task["muted"] = True
        task["cancelled"] = True
        kill_node(self.cluster, task["node"], signal.SIGTERM)
        threading.Timer(5, kill_node, args=(self.cluster, task["node"], signal.SIGKILL)).start()

    def get_or_fail(self, tasks: list[dict]) -> list[int]:
        codes: list[int | None] = [None] * len(tasks)
        while any(c is None for c in codes):
            for i, task in enumerate(tasks):
                if codes[i] is None:
                    codes[i] = self.finished(task)
            done = [c for c in codes if c is not None]
            if any(c != 0 for c in done) and any(c is None for c in codes):
                for i, task in enumerate(tasks):
                    if codes[i] is None:
                        self.cancel(task)
                        codes[i] = 137
                break
            if any(c is None for c in codes):
                time.sleep(0.2)
        return [int(c) for c in codes if c is not None]

    def run(self) -> None:
        nodes = self.cluster["nodes"][: self.task["num_nodes"]]
        n = len(nodes)
        self.status("PENDING")
        self.write(f"├── Waiting for task resources on {n} node{'s' if n > 1 else ''}.")
        time.sleep(0.5)
        self.write(
            "└── Job started. Streaming logs... (Ctrl-C to exit log streaming; job will not "
            "be killed)"
        )
        envs = {k: str(v) for k, v in (self.task.get("envs") or {}).items()}
        task_id = f"sky-{self.task['launched_at']}_{self.name}_{self.job_id}"
        if self.task.get("setup"):
            self.status("SETTING_UP")
            setup_env = dict(envs, SKYPILOT_NUM_NODES=str(n), SKYPILOT_TASK_ID=task_id)
            tasks = [
                self.start(
                    node,
                    "setup",
                    self.task["setup"],
                    setup_env,
                    "(setup pid={pid}) " if i == 0 else f"(setup pid={{pid}}, ip={node['ip']}) ",
                )
                for i, node in enumerate(nodes)
            ]
            codes = self.get_or_fail(tasks)
            failed = [
                (t["proc"].pid, c) for t, c in zip(tasks, codes, strict=True) if c not in (0, 137)
            ]
            if failed:
                workers = ", ".join(f"(pid={p}, returncode={c})" for p, c in failed)
                self.write(
                    f"ERROR: Job {self.job_id}'s setup failed. Failed workers: {workers}. "
                    "See error logs above for more details."
                )
                time.sleep(1)
                self.status("FAILED_SETUP")
                return
        self.status("RUNNING")
        ips = self.cluster.get("reported_ips") or [node["ip"] for node in nodes]
        tasks = []
        for i, node in enumerate(nodes):
            env = dict(
                envs,
                SKYPILOT_NODE_IPS="\n".join(ips[:n]),
                SKYPILOT_NUM_NODES=str(n),
                SKYPILOT_NUM_GPUS_PER_NODE="0",
                SKYPILOT_NODE_RANK=str(i),
                SKYPILOT_INTERNAL_JOB_ID=str(self.job_id),
                SKYPILOT_TASK_ID=task_id,
            )
            name = "head" if i == 0 else f"worker{i}"
            prefix = f"({name}, rank={i}, pid={{pid}}) "
            if i > 0:
                prefix = f"({name}, rank={i}, pid={{pid}}, ip={node['ip']}) "
            tasks.append(self.start(node, "run", self.task["run"], env, prefix))
        codes = self.get_or_fail(tasks)
        for task in tasks:
            if not task["muted"]:
                task["reader"].join(timeout=5)
        if sum(codes) != 0:
            time.sleep(0.5)
            reason = ""
            if any(c == 139 for c in codes):
                reason = "(likely due to Segmentation Fault)"
            if any(c == 137 for c in codes):
                non_137 = next(c for c in codes if c != 137)
                reason = (
                    f"(A Worker failed with return code {non_137}, SkyPilot cleaned up the "
                    "processes on other nodes with return code 137)"
                )
            self.write(f"ERROR: Job {self.job_id} failed with return code list: {codes} {reason}")
            self.status("FAILED")
        else:
            time.sleep(0.5)
            self.status("SUCCEEDED")


# ---------------------------------------------------------------- the client
def say(text: str = "") -> None:
    print(text, flush=True)


def launch(name: str, yaml_path: str) -> int:
    spec = yaml.safe_load(Path(yaml_path).read_text())
    cluster = load(name)
    cdir = cluster_dir(name)
    jobs = cdir / "jobs"
    jobs.mkdir(exist_ok=True)
    job_id = len(list(jobs.iterdir())) + 1
    num_nodes = int(spec.get("num_nodes", 1))
    res = spec.get("resources", {})
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d-%H-%M-%S-") + f"{now.microsecond:06d}"
    cpus = str(res.get("cpus", "2")).rstrip("+")
    mem = str(res.get("memory", "8")).rstrip("+")
    say(f"Considered resources ({num_nodes} node{'s' if num_nodes > 1 else ''}):")
    rule = "-" * 92
    say(rule)
    say(
        " INFRA                              INSTANCE          vCPUs   Mem(GB)   GPUS   COST ($)   CHOSEN   "
    )
    say(rule)
    infra = f"Kubernetes ({cluster['context']})"
    instance = f"{cpus}CPU--{mem}GB"
    say(f" {infra:<34} {instance:<17} {cpus:<7} {mem:<9} -      0.00          ✔     ")
    say(rule)
    if job_id == 1:
        say(f"Launching a new cluster '{name}'. Proceed? [Y/n]: Y")
    else:
        say(f"Running task on cluster {name}. Proceed? [Y/n]: Y")
    provision(cluster)
    say("⚙︎ Launching on Kubernetes.")
    say("└── Pods are up.")
    say(f"✓ Cluster launched: {name}.  View logs: sky api logs -l sky-{stamp}/provision.log")
    workdir = spec.get("workdir")
    nodes = cluster["nodes"][:num_nodes]
    plural = f"{num_nodes} node{'s' if num_nodes > 1 else ''}"
    if workdir:
        src = (Path(yaml_path).parent / workdir).resolve()
        say("⚙︎ Syncing files.")
        say(f"  Syncing workdir (to {plural}): {src} -> ~/sky_workdir")
        for node in nodes:
            dst = Path(node["folder"]) / "home" / "sky" / "sky_workdir"
            shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
        say(f"✓ Synced workdir.  View logs: sky api logs -l sky-{stamp}/workdir_sync.log")
    mounts = spec.get("file_mounts") or {}
    if mounts:
        say("⚙︎ Mounting files.")
        for target, source in mounts.items():
            store = source.get("name") if isinstance(source, dict) else source
            say(f"  Mounting (to {plural}): {store} -> {target}")
        say(f"✓ Storage mounted.  View logs: sky api logs -l sky-{stamp}/storage_mounts.log")
    job = jobs / str(job_id)
    job.mkdir()
    task = {
        "num_nodes": num_nodes,
        "setup": spec.get("setup"),
        "run": spec.get("run"),
        "envs": spec.get("envs"),
        "launched_at": stamp,
    }
    (job / "task.json").write_text(json.dumps(task))
    (job / "run.log").touch()
    (job / "status").write_text("INIT")
    with open(job / "driver.log", "w") as out:
        driver = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_driver", name, str(job_id)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (job / "driver.pid").write_text(str(driver.pid))
    say(f"⚙︎ Job submitted, ID: {job_id}")
    request = f"{random.Random(stamp).getrandbits(32):08x}"

    def interrupted(signum: int, frame: object) -> None:
        say("^C")
        say("⚙︎ Request will continue running asynchronously.")
        say(f"├── View logs: sky api logs {request}")
        say(f"├── Or, visit: http://127.0.0.1:46580/api/stream?request_id={request}")
        say(f"└── To cancel the request, run: sky api cancel {request}")
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted)
    status = tail(job)
    mark = "✓" if status == "SUCCEEDED" else "✗"
    say(f"{mark} Job finished (status: {status}).")
    say(f"Shared connection to {cluster['nodes'][0]['ip']} closed.")
    say()
    say("📋 Useful Commands")
    say(f"Job ID: {job_id}")
    say(f"├── To cancel the job:\t\tsky cancel {name} {job_id}")
    say(f"├── To stream job logs:\t\tsky logs {name} {job_id}")
    say(f"└── To view job queue:\t\tsky queue {name}")
    say(f"Cluster name: {name}")
    say(f"├── To log into the head VM:\tssh {name}")
    say(f"├── To submit a job:\t\tsky exec {name} yaml_file")
    say(f"├── To stop the cluster:\tsky stop {name}")
    say(f"└── To teardown the cluster:\tsky down {name}")
    return 0 if status == "SUCCEEDED" else 100


def tail(job: Path) -> str:
    """log_lib's _follow_job_logs: every line of the job's log, then its final status."""
    with open(job / "run.log", encoding="utf-8") as f:
        line, waited = "", False
        while True:
            chunk = f.readline()
            if chunk:
                line += chunk
                if line.endswith("\n"):
                    print(line, end="", flush=True)
                    line = ""
                continue
            status = (job / "status").read_text().strip()
            if status not in RUNNING and status != "INIT":
                if not waited:
                    time.sleep(1.5)
                    waited = True
                    continue
                return status
            time.sleep(0.5)


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["_driver"]:
        Driver(args[1], int(args[2])).run()
        return 0
    if args[:1] == ["down"]:
        down(args[1])
        return 0
    if args[:1] == ["launch"]:
        rest = [a for a in args[1:] if a not in ("-y", "--yes")]
        name = rest[rest.index("-c") + 1]
        yaml_path = next(a for a in rest if a.endswith((".yaml", ".yml")))
        return launch(name, yaml_path)
    print(
        f"usage: sky launch -c CLUSTER task.yaml | sky down CLUSTER (got {args})", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
