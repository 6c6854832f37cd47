"""gpt-neox's deepy.py and the DeepSpeed launcher it execs, re-created for the hundredtwentyfirst-*
fixtures (the training program is tests/programs/hundredtwentyfirst_style_train.py). Neither
gpt-neox nor deepspeed is installed here: a run's folder links this file as deepy.py and as
deepspeed/launcher/launch.py.

`python ./deepy.py train.py -d configs 125M.yml local_setup.yml`: NeoXArgs.from_ymls reads the
YAML files (a key in two files is an error, '-' in keys becomes '_'), calculate_derived takes the
number of GPUs from num_gpus and fills the batch sizes that are not given, prints the arguments
(updated first, then defaults), splits them into the DeepSpeed config and the Megatron config and
calls deepspeed.launcher.runner.main in-process: no hostfile, so local resources only, then
`python -u -m deepspeed.launcher.launch --world_info=<base64> --master_addr=127.0.0.1
--master_port=PORT --enable_each_rank_log=None train.py --deepspeed_config <base64>
--megatron_config <base64>`. launch.py starts one `train.py --local_rank=K ...` per local rank with
RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, polls them every second, logs 'Process N exits
successfully.', and when one exits non-zero terminates every process tree and logs the LAST
command it built with that exit code (DeepSpeed's own wording, whichever rank failed).
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time

import yaml

DEEPSPEED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "optimizer",
    "fp16",
    "gradient_clipping",
    "zero_optimization",
    "wall_clock_breakdown",
    "steps_per_print",
)
LAUNCHER_KEYS = ("num_gpus", "master_port", "hostfile", "include")

NEOX_DEFAULTS: dict = {
    "attention_config": [[["global"], 2]],
    "checkpoint_factor": None,
    "distributed_backend": "nccl",
    "eval_interval": 1000,
    "eval_iters": 10,
    "exit_interval": None,
    "final_full_eval": False,
    "fp16": None,
    "global_num_gpus": None,
    "gradient_accumulation_steps": None,
    "gradient_clipping": 1.0,
    "hidden_size": None,
    "init_method_std": 0.02,
    "log_interval": 100,
    "make_vocab_size_divisible_by": 128,
    "master_port": 29500,
    "max_position_embeddings": None,
    "merge_file": None,
    "min_lr": 0.0,
    "model_parallel_size": 1,
    "num_attention_heads": None,
    "num_gpus": None,
    "num_layers": None,
    "num_workers": 2,
    "optimizer": None,
    "pipe_parallel_size": 0,
    "save": None,
    "save_interval": None,
    "seed": 1234,
    "seq_length": None,
    "split": "969, 30, 1",
    "steps_per_print": 10,
    "tensorboard_dir": None,
    "tokenizer_type": "GPT2BPETokenizer",
    "train_batch_size": None,
    "train_iters": None,
    "train_micro_batch_size_per_gpu": None,
    "vocab_file": None,
    "wall_clock_breakdown": False,
    "warmup": 0.01,
    "zero_optimization": None,
    "data_path": None,
    "user_script": None,
}


def log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger: '[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s]
    %(message)s' to stdout."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    try:
        sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
        sys.stdout.flush()
    except OSError:
        pass


def accelerator() -> None:
    log("INFO", "real_accelerator.py:110:get_accelerator", "Setting ds_accelerator to cpu (auto detect)")  # fmt: skip


# ------------------------------------------------------------------------------------- NeoXArgs


def from_ymls(paths: list[str]) -> dict:
    print(f"NeoXArgs.from_ymls() {paths}", flush=True)
    config: dict = {}
    files: dict[str, str] = {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        files[os.path.basename(path)] = text
        for key, value in (yaml.safe_load(text) or {}).items():
            key = key.replace("-", "_")
            if key in config:
                raise ValueError(f"Conf file {path} has the following duplicate keys: {[key]}")
            config[key] = value
    unknown = sorted(set(config) - set(NEOX_DEFAULTS))
    if unknown:
        raise ValueError(f"NeoXArgs: unrecognized config keys {unknown}")
    config["config_files"] = files
    return config


def calculate_derived(args: dict) -> None:
    global_num_gpus = args.get("num_gpus") or 1
    args["global_num_gpus"] = global_num_gpus
    logging.info(
        "NeoXArgs.calculate_derived() Total number of GPUs determined to be: %s", global_num_gpus
    )
    dp_world_size = global_num_gpus // args["model_parallel_size"]
    train_batch = args.get("train_batch_size")
    micro_batch = args.get("train_micro_batch_size_per_gpu")
    grad_acc = args.get("gradient_accumulation_steps")
    if train_batch is not None and micro_batch is not None and grad_acc is not None:
        return  # all values are provided, nothing needs to be set
    if micro_batch is not None and grad_acc is None:
        grad_acc = 1 if train_batch is None else train_batch // (micro_batch * dp_world_size)
    if train_batch is None:
        train_batch = micro_batch * grad_acc * dp_world_size
    args["train_batch_size"] = train_batch
    args["train_micro_batch_size_per_gpu"] = micro_batch
    args["gradient_accumulation_steps"] = grad_acc


def print_args(args: dict) -> None:
    print("-------------------- arguments --------------------", flush=True)
    rows = []
    for arg in sorted(args):
        if arg == "config_files":
            continue
        value = args[arg]
        text = f"  {arg} {'.' * (32 - len(arg))} {value}"
        text += "." * (64 - len(text))
        info = "default" if value == NEOX_DEFAULTS.get(arg) else "updated"
        rows.append((info, text))
    for info, text in sorted(rows, key=lambda r: r[0], reverse=True):
        print(text + info, flush=True)
    print("---------------- end of arguments ----------------", flush=True)


def b64(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode("utf-8")).decode("utf-8")


def deepy_main() -> None:
    logging.basicConfig(level=logging.INFO)
    p = argparse.ArgumentParser(description="GPT-NeoX Configuration", allow_abbrev=False)
    p.add_argument("user_script")
    p.add_argument("--conf_dir", "-d", default=None)
    p.add_argument("conf_file", nargs="+")
    ns = p.parse_args()
    paths = [os.path.join(ns.conf_dir, f) if ns.conf_dir else f for f in ns.conf_file]
    args = dict(NEOX_DEFAULTS)
    args.update(from_ymls(paths))
    args["user_script"] = ns.user_script
    calculate_derived(args)
    print_args(args)
    ds_config = {k: args[k] for k in DEEPSPEED_KEYS if args.get(k) is not None}
    megatron = {k: v for k, v in args.items() if k not in DEEPSPEED_KEYS and k != "config_files"}
    runner_main(
        [
            "--num_gpus",
            str(args["num_gpus"]),
            "--master_port",
            str(args["master_port"]),
            ns.user_script,
            "--deepspeed_config",
            b64(ds_config),
            "--megatron_config",
            b64(megatron),
        ]
    )


# ------------------------------------------------------------------------------------- runner


def runner_main(argv: list[str]) -> None:
    accelerator()
    p = argparse.ArgumentParser(description="DeepSpeed runner to help launch distributed jobs")
    p.add_argument("--num_gpus", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--master_addr", default="")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    log(
        "WARNING",
        "runner.py:196:fetch_hostfile",
        "Unable to find hostfile, will proceed with training with local resources only.",
    )
    active = collections.OrderedDict([("localhost", list(range(args.num_gpus)))])
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
    log("INFO", "runner.py:550:main", f"cmd = {' '.join(cmd)}")
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


if __name__ == "__main__":
    if os.path.basename(sys.argv[0]) == "deepy.py":
        deepy_main()
    else:  # `python -u -m deepspeed.launcher.launch ...`
        launch_main()
