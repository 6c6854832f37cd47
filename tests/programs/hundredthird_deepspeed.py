"""DeepSpeed's multi-node launch re-created for the hundredthird-* fixtures (the training program
is tests/programs/hundredthird_style_train.py): the `deepspeed` runner (deepspeed/launcher/
runner.py with its PDSH multinode runner), a pdsh-like fan-out over ssh, and
deepspeed/launcher/launch.py, the per-node launcher that starts one process per slot with
RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set and --local_rank=N passed. Neither
deepspeed nor pdsh is installed here: this file stands in for both, as the run's folders link
it (<node>/site-packages/deepspeed/launcher/{runner,launch}.py; <node>/bin/deepspeed and
<node>/bin/pdsh call runner_main and pdsh_main).

The two 'nodes' are folders of this one machine (their homes): SIM_NODES names a JSON file
{"local": "node1", "nodes": {"node1": {"home": ...}, "node2": {"home": ..., "sshd": false}}}.
The simulated ssh runs the remote command with bash in the host's home, with the local home's
paths in the command replaced by the host's (each node has its own disk), in a session of its
own (ssh's remote side), with a login environment of the node; a host whose "sshd" is false
refuses the connection. Only the runner and pdsh read SIM_NODES; nothing prints it.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

PDSH_MAX_FAN_OUT = 1024
EXPORT_ENVS = ("MLFLOW", "NCCL", "PYTHON", "MV2", "UCX")
# what a node's login shell has in its environment besides HOME (a .bashrc's exports)
LOGIN_ENV = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "TMPDIR", "TQ_CASE")


def log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger: '[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s]
    %(message)s' to stdout; like logging, a write that fails is dropped."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    try:
        sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
        sys.stdout.flush()
    except OSError:
        pass


def accelerator() -> None:
    log(
        "INFO",
        "real_accelerator.py:203:get_accelerator",
        "Setting ds_accelerator to cpu (auto detect)",
    )


def sim_nodes() -> dict:
    with open(os.environ["SIM_NODES"]) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------- runner


def fetch_hostfile(path: str) -> collections.OrderedDict | None:
    if not os.path.isfile(path):
        log(
            "WARNING",
            "runner.py:214:fetch_hostfile",
            "Unable to find hostfile, will proceed with training with local resources only.",
        )
        return None
    pool: collections.OrderedDict[str, int] = collections.OrderedDict()
    with open(path) as fd:
        for line in fd.readlines():
            line = line.strip()
            if line == "" or line.startswith("#"):
                continue
            try:
                hostname, slots = line.split()
                _, slot_count = slots.split("=")
                count = int(slot_count)
            except ValueError as err:
                log(
                    "ERROR",
                    "runner.py:244:_parse_hostfile",
                    "Hostfile is not formatted correctly, unable to proceed with training.",
                )
                raise err
            if hostname in pool:
                raise ValueError(f"Hostfile contains multiple entries for {hostname}")
            pool[hostname] = count
    return pool


def runner_main() -> int:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed runner to help launch distributed jobs")
    p.add_argument("-H", "--hostfile", default="/job/hostfile")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--master_addr", default="")
    p.add_argument("--launcher", default="pdsh")
    p.add_argument("--no_ssh_check", action="store_true")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    args = p.parse_args()

    pool = fetch_hostfile(args.hostfile)
    if not pool:
        raise RuntimeError("this re-creation launches from a hostfile only")
    active = collections.OrderedDict((host, list(range(n))) for host, n in pool.items())
    nodes = sim_nodes()
    multi_node_exec = len(active) > 1
    if multi_node_exec and not args.no_ssh_check:
        first_host = next(iter(active))
        # `ssh -o PasswordAuthentication=no {first_host} hostname`
        if nodes["nodes"].get(first_host, {}).get("sshd", True) is False:
            raise RuntimeError(
                f"Using hostfile at {args.hostfile} but host={first_host} was not reachable via "
                "ssh. If you are running with a single node please remove "
                f"{args.hostfile} or setup passwordless ssh."
            )
    if not args.master_addr:
        raise RuntimeError("this re-creation needs --master_addr")
    world_info = base64.urlsafe_b64encode(json.dumps(active).encode("utf-8")).decode("utf-8")

    env = os.environ.copy()
    curr_path = os.path.abspath(".")
    if "PYTHONPATH" in env:
        env["PYTHONPATH"] = curr_path + ":" + env["PYTHONPATH"]
    else:
        env["PYTHONPATH"] = curr_path
    exports = {k: v for k, v in env.items() if any(k.startswith(n) for n in EXPORT_ENVS)}

    env["PDSH_RCMD_TYPE"] = "ssh"
    active_workers = ",".join(active.keys())
    log(
        "INFO",
        "multinode_runner.py:80:get_cmd",
        f"Running on the following workers: {active_workers}",
    )
    pdsh_cmd_args = ["pdsh", "-S", "-f", str(PDSH_MAX_FAN_OUT), "-w", active_workers]
    export_str = "".join(f"export {k}={v}; " for k, v in exports.items())
    deepspeed_launch = [
        export_str,
        f"cd {curr_path};",
        sys.executable,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world_info}",
        "--node_rank=%n",
        f"--master_addr={args.master_addr}",
        f"--master_port={args.master_port}",
    ]
    cmd = pdsh_cmd_args + deepspeed_launch + [args.user_script] + args.user_args
    cmd_to_search = [i + "\\" for i in deepspeed_launch[2:6]]
    kill_cmd = [*pdsh_cmd_args, "pkill -f ", " ".join(cmd_to_search)[:-1]]
    log("INFO", "runner.py:568:main", f"cmd = {' '.join(cmd)}")
    result = subprocess.Popen(cmd, env=env)

    def sigkill_handler(signum: int, frame: object) -> None:
        result.send_signal(signal.SIGINT)
        time.sleep(0.1)
        result.send_signal(signal.SIGTERM)
        result_kill = subprocess.Popen(kill_cmd, env=env)
        result_kill.wait()
        time.sleep(1)
        sys.exit(1)

    signal.signal(signal.SIGINT, sigkill_handler)
    signal.signal(signal.SIGTERM, sigkill_handler)
    result.wait()
    if result.returncode > 0:
        sys.exit(result.returncode)
    return 0


# --------------------------------------------------------------------------------------- pdsh


class Pdsh:
    def __init__(self, hosts: list[str], command: str) -> None:
        conf = sim_nodes()
        self.local = conf["local"]
        self.nodes = conf["nodes"]
        self.hosts = hosts
        self.command = command
        self.lock = threading.Lock()
        self.running: dict[str, bool] = {h: True for h in hosts}
        self.last_interrupt = 0.0
        self.busy = False
        self.pending = False

    def emit(self, stream: object, data: bytes) -> None:
        with self.lock:
            try:
                stream.buffer.write(data)  # type: ignore[attr-defined]
                stream.flush()  # type: ignore[attr-defined]
            except OSError:
                pass

    def say(self, text: str) -> None:  # pdsh's own messages, on stderr
        self.emit(sys.stderr, f"pdsh@{self.local}: {text}\n".encode())

    def pump(self, host: str, pipe: object, stream: object) -> None:
        prefix = f"{host}: ".encode()
        rest = b""
        while True:
            chunk = os.read(pipe.fileno(), 65536)  # type: ignore[attr-defined]
            if not chunk:
                break
            rest += chunk
            *lines, rest = rest.split(b"\n")
            for line in lines:
                self.emit(stream, prefix + line + b"\n")
        if rest:
            self.emit(stream, prefix + rest + b"\n")

    def scoped_pkill(self, home: str, pattern: str) -> int:
        """`pkill -f PATTERN` on that host: the processes of this node only (its home)."""
        found = 1
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            line = b" ".join(a for a in args if a).decode(errors="replace")
            if pattern in line and (cwd == home or cwd.startswith(home + "/")):
                try:
                    os.kill(int(entry), signal.SIGTERM)
                    found = 0
                except OSError:
                    pass
        return found

    def remote(self, rank: int, host: str, codes: dict[str, int]) -> None:
        node = self.nodes.get(host)
        if node is None or node.get("sshd", True) is False:
            reason = "Connection refused" if node is not None else "Name or service not known"
            if node is None:
                msg = f"{host}: ssh: Could not resolve hostname {host}: {reason}\n"
            else:
                msg = f"{host}: ssh: connect to host {host} port 22: {reason}\n"
            self.emit(sys.stderr, msg.encode())
            codes[host] = 255
            self.running[host] = False
            self.say(f"{host}: ssh exited with exit code 255")
            return
        home = node["home"]
        local_home = self.nodes[self.local]["home"]
        cmd = self.command.replace("%n", str(rank)).replace("%h", host)
        cmd = cmd.replace(local_home + "/", home + "/")
        if cmd.startswith("pkill "):
            argv = shlex.split(cmd)
            codes[host] = self.scoped_pkill(home, argv[-1])
        else:
            env = {k: os.environ[k] for k in LOGIN_ENV if k in os.environ}
            env["HOME"] = home
            env["SHELL"] = "/bin/bash"
            proc = subprocess.Popen(
                ["bash", "-c", cmd],
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            pumps = [
                threading.Thread(target=self.pump, args=(host, proc.stdout, sys.stdout)),
                threading.Thread(target=self.pump, args=(host, proc.stderr, sys.stderr)),
            ]
            for t in pumps:
                t.start()
            for t in pumps:
                t.join()
            rc = proc.wait()
            codes[host] = rc if rc >= 0 else 255
        self.running[host] = False
        if codes[host] != 0:
            self.say(f"{host}: ssh exited with exit code {codes[host]}")

    def on_sigint(self, signum: int, frame: object) -> None:
        if self.busy:  # a second ^C while the first is still being reported
            self.pending = True
            return
        now = time.monotonic()
        if now - self.last_interrupt < 1.0:
            self.say("interrupt, aborting.")
            os._exit(1)
        self.busy = True
        self.say("interrupt (one more within 1 sec to abort)")
        self.say(" (^Z within 1 sec to cancel pending threads)")
        for host in self.hosts:
            if self.running[host]:
                self.say(f"{host}: command in progress")
        self.last_interrupt = now
        self.busy = False
        if self.pending:
            self.say("interrupt, aborting.")
            os._exit(1)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_sigint)
        codes: dict[str, int] = {}
        threads = [
            threading.Thread(target=self.remote, args=(k, h, codes), daemon=True)
            for k, h in enumerate(self.hosts)
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        return max(codes.values(), default=0)


def pdsh_main() -> int:
    argv = sys.argv[1:]
    hosts: list[str] = []
    k = 0
    while k < len(argv) and argv[k].startswith("-"):
        if argv[k] == "-w":
            hosts = argv[k + 1].split(",")
            k += 2
        elif argv[k] == "-f":
            k += 2
        else:
            k += 1
    return Pdsh(hosts, " ".join(argv[k:])).run()


# ------------------------------------------------------------------------------------- launch


def _children(pid: int) -> list[int]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def terminate_process_tree(process: subprocess.Popen) -> None:
    """psutil's way: terminate the process and its children, wait up to 30 s, kill the rest."""
    tree = [*_children(process.pid), process.pid]
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        process.poll()
        if not any(_alive(pid) for pid in tree):
            return
        time.sleep(0.1)
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def launch_main() -> None:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed distributed training launch utility")
    p.add_argument("--node_rank", type=int, default=0)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--world_info", default="None")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = p.parse_args()

    current_env = os.environ.copy()
    for k in current_env:
        if "NCCL" in k:
            log("INFO", "launch.py:139:main", f"{args.node_rank} {k}={current_env[k]}")
    if args.world_info == "None":
        raise ValueError("world_info can not be None")
    world_info = json.loads(base64.urlsafe_b64decode(args.world_info))
    log("INFO", "launch.py:146:main", f"WORLD INFO DICT: {world_info}")
    node_list = list(world_info.keys())
    nnodes = len(node_list)
    local_node = node_list[args.node_rank]
    local_gpu_ids = world_info[local_node]
    num_local_procs = len(local_gpu_ids)
    log(
        "INFO",
        "launch.py:152:main",
        f"nnodes={nnodes}, num_local_procs={num_local_procs}, node_rank={args.node_rank}",
    )
    global_rank_mapping: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    curr_global_rank = 0
    dist_world_size = 0
    for node_id in node_list:
        gids = world_info[node_id]
        dist_world_size += len(gids)
        for _ in gids:
            global_rank_mapping[node_id].append(curr_global_rank)
            curr_global_rank += 1
    log("INFO", "launch.py:163:main", f"global_rank_mapping={global_rank_mapping}")
    log("INFO", "launch.py:164:main", f"dist_world_size={dist_world_size}")
    current_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, local_gpu_ids))
    log(
        "INFO",
        "launch.py:166:main",
        f"Setting CUDA_VISIBLE_DEVICES={current_env['CUDA_VISIBLE_DEVICES']}",
    )
    current_env["MASTER_ADDR"] = args.master_addr
    current_env["MASTER_PORT"] = str(args.master_port)
    current_env["WORLD_SIZE"] = str(dist_world_size)
    current_env["CROSS_RANK"] = str(args.node_rank)
    current_env["CROSS_SIZE"] = str(nnodes)
    current_env["LOCAL_SIZE"] = str(num_local_procs)

    processes: list[subprocess.Popen] = []
    cmd: list[str] = []
    for local_proc in range(num_local_procs):
        dist_rank = global_rank_mapping[local_node][local_proc]
        local_rank = dist_rank % num_local_procs
        current_env["RANK"] = str(dist_rank)
        current_env["LOCAL_RANK"] = str(local_rank)
        cmd = [sys.executable, "-u", args.training_script, f"--local_rank={local_rank}"]
        cmd += args.training_script_args
        process = subprocess.Popen(cmd, env=current_env)
        processes.append(process)
        log("INFO", "launch.py:256:main", f"process {process.pid} spawned with command: {cmd}")

    sig_names = {2: "SIGINT", 15: "SIGTERM"}
    last_return_code: int | None = None

    def sigkill_handler(signum: int, frame: object) -> None:
        for process in processes:
            log("INFO", "launch.py:322:sigkill_handler", f"Killing subprocess {process.pid}")
            with contextlib.suppress(Exception):
                terminate_process_tree(process)
        if last_return_code is not None:
            log(
                "ERROR",
                "launch.py:328:sigkill_handler",
                f"{cmd} exits with return code = {last_return_code}",
            )
            sys.exit(last_return_code)
        if signum in sig_names:
            log(
                "INFO",
                "launch.py:333:sigkill_handler",
                f"Main process received {sig_names[signum]}, exiting",
            )
        sys.exit(1)

    signal.signal(signal.SIGINT, sigkill_handler)
    signal.signal(signal.SIGTERM, sigkill_handler)
    alive_processes = set(processes)
    while len(alive_processes):
        finished_processes = []
        for process in alive_processes:
            if process.poll() is None:
                continue
            if process.returncode != 0:
                last_return_code = process.returncode
                sigkill_handler(signal.SIGTERM, None)
            else:
                log("INFO", "launch.py:351:main", f"Process {process.pid} exits successfully.")
                finished_processes.append(process)
        alive_processes = set(alive_processes) - set(finished_processes)
        time.sleep(1)


if __name__ == "__main__":  # `python -u -m deepspeed.launcher.launch ...`
    launch_main()
