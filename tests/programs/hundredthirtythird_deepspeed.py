"""The `deepspeed` command re-created for the hundredthirtythird-* fixtures (the training program is
tests/programs/hundredthirtythird_style_train.py, linked into a run's folder as main.py): the
runner (deepspeed/launcher/runner.py: `deepspeed --num_gpus 2 --master_port PORT main.py ...`,
no hostfile, so local resources only) and the per-node launcher it starts
(deepspeed/launcher/launch.py: `python -u -m deepspeed.launcher.launch --world_info=<base64>
--master_addr=127.0.0.1 --master_port=PORT --enable_each_rank_log=None main.py ...`). Neither
deepspeed nor DeepSpeed-Chat is installed here: a run's folder links this file as
site/deepspeed/launcher/{runner,launch}.py, and its bin/deepspeed calls runner.main as DeepSpeed's
own bin/deepspeed does.

launch.py starts one `main.py --local_rank=K ...` per local rank with RANK/LOCAL_RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT set, polls them every second, logs 'Process N exits successfully.', and
when one exits non-zero terminates every process tree and logs the LAST command it built with
that exit code (DeepSpeed's own wording, whichever rank failed). The local runner installs no
signal handler (DeepSpeed's installs one for the multi-node pdsh launcher only).
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
    """DeepSpeed's logger: '[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s]
    %(message)s' to stdout, one write a record; a write that fails is dropped."""
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


# ------------------------------------------------------------------------------------- runner


def main(argv: list[str] | None = None) -> None:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed runner to help launch distributed jobs")
    p.add_argument("-H", "--hostfile", default="/job/hostfile")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--master_addr", default="")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if not os.path.isfile(args.hostfile):
        log(
            "WARNING",
            "runner.py:202:fetch_hostfile",
            "Unable to find hostfile, will proceed with training with local resources only.",
        )
    num_gpus = args.num_gpus if args.num_gpus > 0 else 1
    active = collections.OrderedDict([("localhost", list(range(num_gpus)))])
    if not args.master_addr:
        args.master_addr = "127.0.0.1"
    world_info = base64.urlsafe_b64encode(json.dumps(active).encode("utf-8")).decode("utf-8")
    env = os.environ.copy()
    curr_path = os.path.abspath(".")
    env["PYTHONPATH"] = curr_path + (":" + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    cmd = [
        sys.executable,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world_info}",
        f"--master_addr={args.master_addr}",
        f"--master_port={args.master_port}",
        "--enable_each_rank_log=None",
        args.user_script,
        *args.user_args,
    ]
    log("INFO", "runner.py:568:main", f"cmd = {' '.join(cmd)}")
    result = subprocess.Popen(cmd, env=env)
    result.wait()
    # In case of failure must propagate the error-condition back to the caller (usually shell).
    if result.returncode > 0:
        sys.exit(result.returncode)


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
    p.add_argument("--enable_each_rank_log", default="None")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = p.parse_args()

    current_env = os.environ.copy()
    world_info = json.loads(base64.urlsafe_b64decode(args.world_info))
    log("INFO", "launch.py:145:main", f"WORLD INFO DICT: {world_info}")
    node_list = list(world_info.keys())
    nnodes = len(node_list)
    local_node = node_list[args.node_rank]
    local_gpu_ids = world_info[local_node]
    num_local_procs = len(local_gpu_ids)
    log(
        "INFO",
        "launch.py:151:main",
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
    log("INFO", "launch.py:162:main", f"global_rank_mapping={global_rank_mapping}")
    log("INFO", "launch.py:163:main", f"dist_world_size={dist_world_size}")
    current_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, local_gpu_ids))
    log(
        "INFO",
        "launch.py:165:main",
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
            log("INFO", "launch.py:315:sigkill_handler", f"Killing subprocess {process.pid}")
            with contextlib.suppress(Exception):
                terminate_process_tree(process)
        if last_return_code is not None:
            log(
                "ERROR",
                "launch.py:321:sigkill_handler",
                f"{cmd} exits with return code = {last_return_code}",
            )
            sys.exit(last_return_code)
        if signum in sig_names:
            log(
                "INFO",
                "launch.py:326:sigkill_handler",
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
                log("INFO", "launch.py:350:main", f"Process {process.pid} exits successfully.")
                finished_processes.append(process)
        alive_processes = set(alive_processes) - set(finished_processes)
        time.sleep(1)


if __name__ == "__main__":  # `python -u -m deepspeed.launcher.launch ...`
    launch_main()
