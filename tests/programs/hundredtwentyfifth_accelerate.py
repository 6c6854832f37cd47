"""`accelerate launch` re-created for the hundredtwentyfifth-* fixtures (the training program is
tests/programs/hundredtwentyfifth_style_train.py, started as lerobot's `accelerate launch
--multi_gpu --num_processes=2 lerobot/scripts/train.py --policy.type=act ...`; accelerate is not
used): the part of accelerate's commands/launch.py a single-machine multi-GPU launch of a script
goes through. It reads the default config file that `accelerate config` wrote
($HF_HOME/accelerate/default_config.yaml) or, without one, says which values it defaulted ('The
following values were not passed to `accelerate launch` and had defaults used instead'); sets
OMP_NUM_THREADS to --num_cpu_threads_per_process; refuses a main process port another process
holds (ConnectionError, before any worker starts); and hands the script to torch elastic,
torch.distributed.run.run, which starts one process per rank with
RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set and reports how they ended (its
ChildFailedError and failure summary, as accelerate's multi_gpu_launcher lets them through).
Started as `python hundredtwentyfifth_accelerate.py launch ...`, through an `accelerate` link in
the captures.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

import yaml

logger = logging.getLogger("accelerate.commands.launch")


def is_port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", port)) == 0


def default_config_file() -> str:
    hf_home = os.environ.get(
        "HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    )
    return os.path.join(hf_home, "accelerate", "default_config.yaml")


def launch_command_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("launch", allow_abbrev=False)
    parser.add_argument("--config_file", default=None)
    parser.add_argument("--multi_gpu", action="store_true")
    parser.add_argument("--num_processes", type=int, default=None)
    parser.add_argument("--num_machines", type=int, default=None)
    parser.add_argument("--num_cpu_threads_per_process", type=int, default=None)
    parser.add_argument("--main_process_port", type=int, default=None)
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--dynamo_backend", default=None)
    parser.add_argument("--gpu_ids", default=None)
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=launch_command)
    return parser


def _validate_launch_command(args: argparse.Namespace) -> argparse.Namespace:
    warned = []
    config_file = args.config_file
    if config_file is None and os.path.isfile(default_config_file()):
        config_file = default_config_file()
    if config_file is not None:
        with open(config_file) as f:
            defaults = yaml.safe_load(f)
        if not args.multi_gpu:
            args.multi_gpu = defaults.get("distributed_type") == "MULTI_GPU"
        for name in ("num_processes", "num_machines", "main_process_port", "gpu_ids"):
            if getattr(args, name) is None and defaults.get(name) is not None:
                setattr(args, name, defaults[name])
        if args.mixed_precision is None:
            args.mixed_precision = defaults.get("mixed_precision") or "no"
        if args.dynamo_backend is None:
            args.dynamo_backend = "no"
    else:
        if args.num_processes is None:
            args.num_processes = 1
            warned.append("\t`--num_processes` was set to a value of `1`")
        if not args.multi_gpu and args.num_processes > 1:
            warned.append(
                "\t\tMore than one GPU was found, enabling multi-GPU training.\n"
                "\t\tIf this was unintended please pass in `--num_processes=1`."
            )
            args.multi_gpu = True
        if args.num_machines is None:
            warned.append("\t`--num_machines` was set to a value of `1`")
            args.num_machines = 1
        if args.mixed_precision is None:
            warned.append("\t`--mixed_precision` was set to a value of `'no'`")
            args.mixed_precision = "no"
        if args.dynamo_backend is None:
            warned.append("\t`--dynamo_backend` was set to a value of `'no'`")
            args.dynamo_backend = "no"
    if args.num_cpu_threads_per_process is None:
        args.num_cpu_threads_per_process = int(os.environ.get("OMP_NUM_THREADS", "1"))
    if args.gpu_ids is None:
        args.gpu_ids = "all"
    if any(warned):
        message = "The following values were not passed to `accelerate launch` and had defaults used instead:\n"
        message += "\n".join(warned)
        message += (
            "\nTo avoid this warning pass in values for each of the problematic parameters or run "
            "`accelerate config`."
        )
        logger.warning(message)
    return args


def prepare_multi_gpu_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    num_machines = args.num_machines or 1
    main_process_port = args.main_process_port
    if main_process_port is None:
        main_process_port = 29500
    # only need to check port availability in main process, in case we have to start multiple
    # launchers on the same machine for some reasons like splitting log files.
    need_port_check = num_machines <= 1
    if need_port_check and is_port_in_use(main_process_port):
        raise ConnectionError(
            f"Tried to launch distributed communication on port `{main_process_port}`, but another process is utilizing it. "
            "Please specify a different port (such as using the `--main_process_port` flag or specifying a different `main_process_port` in your config file)"
            " and rerun your script. To automatically use the next open port (on a single node), you can set this to `0`."
        )
    torchrun = [
        *(["--module"] if args.module else []),
        "--nproc_per_node",
        str(args.num_processes),
        "--master_port",
        str(main_process_port),
    ]
    current_env = os.environ.copy()
    current_env["ACCELERATE_MIXED_PRECISION"] = str(args.mixed_precision)
    current_env["ACCELERATE_DYNAMO_BACKEND"] = str(args.dynamo_backend).upper()
    current_env["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    if args.gpu_ids != "all":
        current_env["CUDA_VISIBLE_DEVICES"] = str(args.gpu_ids)
    return torchrun, current_env


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    import torch.distributed.run as distrib_run

    torchrun, current_env = prepare_multi_gpu_env(args)
    run_args = distrib_run.get_args_parser().parse_args(
        [*torchrun, args.training_script, *args.training_script_args]
    )
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(current_env)
    try:
        distrib_run.run(run_args)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def simple_launcher(args: argparse.Namespace) -> None:
    import subprocess

    cmd = [sys.executable, *(["-m"] if args.module else []), args.training_script]
    cmd += args.training_script_args
    current_env = os.environ.copy()
    current_env["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    process = subprocess.Popen(cmd, env=current_env)
    process.wait()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)


def launch_command(args: argparse.Namespace) -> None:
    args = _validate_launch_command(args)
    if args.multi_gpu:
        multi_gpu_launcher(args)
    else:
        simple_launcher(args)


def main() -> None:
    parser = argparse.ArgumentParser(
        "Accelerate CLI tool", usage="accelerate <command> [<args>]", allow_abbrev=False
    )
    subparsers = parser.add_subparsers(help="accelerate command helpers")
    launch_command_parser(subparsers=subparsers)
    args = parser.parse_args()
    if not hasattr(args, "func"):
        parser.print_help()
        sys.exit(1)
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
