"""`accelerate launch` re-created for the hundredseventh-* fixtures (the training program is
tests/programs/hundredseventh_style_train.py; accelerate is not used): the part of accelerate's
commands/accelerate_cli.py and commands/launch.py a single-machine multi-GPU launch goes
through. It reads the config file (TRL's examples/accelerate_configs/multi_gpu.yaml) or says which
values it defaulted ("The following values were not passed to `accelerate launch` and had
defaults used instead"), prepares the environment as prepare_multi_gpu_env does (the port check
included) and hands the script to torch elastic, torch.distributed.run.run, which starts one
process per rank with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set and reports how they
ended. Started as `python hundredseventh_accelerate.py launch ...`, through an `accelerate` link
in the captures.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import warnings

import yaml

logger = logging.getLogger("accelerate.commands.launch")


def is_port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", port)) == 0


def launch_command_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("launch", allow_abbrev=False)
    parser.add_argument("--config_file", default=None)
    parser.add_argument("--multi_gpu", action="store_true")
    parser.add_argument("--num_processes", type=int, default=None)
    parser.add_argument("--num_machines", type=int, default=None)
    parser.add_argument("--machine_rank", type=int, default=None)
    parser.add_argument("--main_process_ip", default=None)
    parser.add_argument("--main_process_port", type=int, default=None)
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--dynamo_backend", default=None)
    parser.add_argument("--gpu_ids", default=None)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=launch_command)
    return parser


def _validate_launch_command(args: argparse.Namespace) -> argparse.Namespace:
    warned = []
    if args.config_file is not None:
        with open(args.config_file) as f:
            defaults = yaml.safe_load(f)
        if not args.multi_gpu:
            args.multi_gpu = defaults.get("distributed_type") == "MULTI_GPU"
        for name in ("num_processes", "num_machines", "machine_rank", "main_process_ip",
                     "main_process_port", "gpu_ids"):  # fmt: skip
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
    if args.main_process_port is None:
        args.main_process_port = 29500
    num_machines = args.num_machines or 1
    torchrun = ["--nproc_per_node", str(args.num_processes)]
    if is_port_in_use(args.main_process_port) and num_machines <= 1:
        warnings.warn(
            f"Port `{args.main_process_port}` is already in use. "
            "Accelerate will attempt to launch in a standalone-like mode by finding an open "
            "port automatically for this session. If this current attempt fails, or for more "
            "control in future runs, please specify a different port (e.g., "
            "`--main_process_port <your_chosen_port>`) or use `--main_process_port 0` for "
            "automatic selection in your launch command or Accelerate config file.",
            stacklevel=2,
        )
        torchrun.append("--standalone")
    if "--standalone" not in torchrun:
        torchrun += ["--master_port", str(args.main_process_port)]
    current_env = os.environ.copy()
    current_env["ACCELERATE_MIXED_PRECISION"] = str(args.mixed_precision)
    current_env["ACCELERATE_DYNAMO_BACKEND"] = str(args.dynamo_backend).upper()
    current_env["ACCELERATE_DYNAMO_MODE"] = "default"
    current_env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = "False"
    current_env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "False"
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

    cmd = [sys.executable, args.training_script, *args.training_script_args]
    process = subprocess.Popen(cmd)
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
