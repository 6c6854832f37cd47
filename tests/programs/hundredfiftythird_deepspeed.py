"""The `deepspeed` command re-created for the hundredfiftythird-* fixtures (the training program is
tests/programs/hundredfiftythird_style_train.py, linked into a run's folder as train.py): the
runner (deepspeed/launcher/runner.py: `deepspeed --num_gpus 2 --master_port PORT train.py ...`
with no hostfile, local resources only; or `deepspeed --hostfile hostfile --no_ssh --node_rank K
--master_addr A --master_port P train.py ...` on each node of a multi-node job, without ssh) and
the per-node launcher it starts (deepspeed/launcher/launch.py: `python -u -m
deepspeed.launcher.launch --world_info=<base64> --master_addr=A --master_port=P
[--node_rank=K] --enable_each_rank_log=None train.py ...`). DeepSpeed is not installed here: a
run's folder links this file as site/deepspeed/launcher/{runner,launch}.py and its bin/deepspeed
calls runner.main, as DeepSpeed's own bin/deepspeed does. Written from DeepSpeed's log formats,
not its code.

launch.py starts one `train.py --local_rank=K ...` per local rank with RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, polls them every second, logs 'Process N exits
successfully.' for each that exits 0, and when one exits non-zero terminates every process tree
and logs the command it built LAST with that exit code (DeepSpeed's wording, whichever rank
failed). A SIGTERM or SIGINT to the launcher terminates the ranks the same way. The runner of a
single node installs no signal handler.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time


def log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger: '[asctime] [LEVEL] [file:line:func] message' on stdout."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    with contextlib.suppress(OSError):
        sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
        sys.stdout.flush()


def accelerator() -> None:
    log(
        "INFO",
        "real_accelerator.py:239:get_accelerator",
        "Setting ds_accelerator to cpu (auto detect)",
    )


def read_hostfile(path: str) -> collections.OrderedDict[str, int]:
    pool: collections.OrderedDict[str, int] = collections.OrderedDict()
    if not os.path.isfile(path):
        log(
            "WARNING",
            "runner.py:215:fetch_hostfile",
            "Unable to find hostfile, will proceed with training with local resources only.",
        )
        return pool
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            host, slots = line.split()
            pool[host] = int(slots.split("=")[1])
    return pool


# ------------------------------------------------------------------------------------- runner


def main(argv: list[str] | None = None) -> None:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed runner to help launch distributed jobs")
    p.add_argument("-H", "--hostfile", default="/job/hostfile")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--master_addr", default="")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    pool = read_hostfile(args.hostfile)
    if not pool:
        pool = collections.OrderedDict(localhost=os.cpu_count() or 1)
        args.master_addr = "127.0.0.1"
    active = collections.OrderedDict((host, list(range(n))) for host, n in pool.items())
    if args.num_gpus > 0:
        active = collections.OrderedDict((h, list(range(args.num_gpus))) for h in active)
    if args.no_ssh:
        assert 0 <= args.node_rank < len(active), (
            "Launching training without ssh, but --node_rank is not set correctly."
        )
    world_info = base64.urlsafe_b64encode(json.dumps(active).encode("utf-8")).decode("utf-8")
    cmd = [
        sys.executable,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world_info}",
        f"--master_addr={args.master_addr}",
        f"--master_port={args.master_port}",
    ]
    if args.no_ssh:
        cmd.append(f"--node_rank={args.node_rank}")
    cmd += ["--enable_each_rank_log=None", args.user_script, *args.user_args]
    log("INFO", "runner.py:607:main", f"cmd = {' '.join(cmd)}")
    result = subprocess.Popen(cmd)
    result.wait()
    # a failure's exit code goes back to the shell
    if result.returncode > 0:
        sys.exit(result.returncode)


# ------------------------------------------------------------------------------------- launch


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        kids[int(stat[stat.rindex(")") + 2 :].split()[1])].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            found.append(kid)
            todo.append(kid)
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def stop_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process and everything under it, up to 30 s to go, then SIGKILL."""
    pids = [*_descendants(process.pid), process.pid]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        process.poll()
        if not any(_running(pid) for pid in pids):
            return
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def launch_main() -> None:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed distributed training launch utility")
    p.add_argument("--node_rank", type=int, default=0)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--world_info", default="None")
    p.add_argument("--enable_each_rank_log", default="None")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = p.parse_args()

    env = os.environ.copy()
    world_info = json.loads(base64.urlsafe_b64decode(args.world_info))
    log("INFO", "launch.py:146:main", f"WORLD INFO DICT: {world_info}")
    nodes = list(world_info)
    here = nodes[args.node_rank]
    num_local_procs = len(world_info[here])
    log(
        "INFO",
        "launch.py:152:main",
        f"nnodes={len(nodes)}, num_local_procs={num_local_procs}, node_rank={args.node_rank}",
    )
    mapping: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    world = 0
    for node in nodes:
        for _ in world_info[node]:
            mapping[node].append(world)
            world += 1
    log("INFO", "launch.py:163:main", f"global_rank_mapping={mapping}")
    log("INFO", "launch.py:164:main", f"dist_world_size={world}")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in world_info[here])
    log("INFO", "launch.py:168:main", f"Setting CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}")
    env.update(
        MASTER_ADDR=args.master_addr,
        MASTER_PORT=str(args.master_port),
        WORLD_SIZE=str(world),
        CROSS_RANK=str(args.node_rank),
        CROSS_SIZE=str(len(nodes)),
        LOCAL_SIZE=str(num_local_procs),
    )

    processes: list[subprocess.Popen[bytes]] = []
    cmd: list[str] = []
    for k in range(num_local_procs):
        rank = mapping[here][k]
        local_rank = rank % num_local_procs
        env["RANK"], env["LOCAL_RANK"] = str(rank), str(local_rank)
        cmd = [sys.executable, "-u", args.training_script, f"--local_rank={local_rank}"]
        cmd += args.training_script_args
        process = subprocess.Popen(cmd, env=env)
        log("INFO", "launch.py:256:main", f"process {process.pid} spawned with command: {cmd}")
        processes.append(process)

    names = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
    failed: list[int] = []

    def stop_all(signum: int, frame: object) -> None:
        for process in processes:
            log("INFO", "launch.py:319:sigkill_handler", f"Killing subprocess {process.pid}")
            with contextlib.suppress(Exception):
                stop_tree(process)
        if failed:
            # the command built last, whichever process failed (as DeepSpeed logs it)
            log(
                "ERROR",
                "launch.py:325:sigkill_handler",
                f"{cmd} exits with return code = {failed[0]}",
            )
            sys.exit(failed[0])
        if signum in names:
            log(
                "INFO",
                "launch.py:328:sigkill_handler",
                f"Main process received {names[signum]}, exiting",
            )
        sys.exit(1)

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    alive = set(processes)
    while alive:
        done = []
        for process in alive:
            if process.poll() is None:
                continue
            if process.returncode != 0:
                failed.append(process.returncode)
                stop_all(signal.SIGTERM, None)
            log("INFO", "launch.py:351:main", f"Process {process.pid} exits successfully.")
            done.append(process)
        alive -= set(done)
        time.sleep(1)


if __name__ == "__main__":  # `python -u -m deepspeed.launcher.launch ...`
    launch_main()
