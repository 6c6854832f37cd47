#!/usr/bin/env python3
"""The sixty-ninth style's launcher: `python -m trainer.distribute --script train_tts.py --gpus
"0,1"` of coqui's 👟Trainer package, re-implemented (the package is not installed here). As the
original: one subprocess a GPU id, every one started with the training script, the TrainerArgs
paths passed through (--continue_path, --restore_path), --group_id=group_<date>, --use_ddp=true,
the unknown arguments (--coqpit.* overrides) and --rank=N; stdout and stderr inherited (every
rank prints into the one console), the command logged by the "trainer" logger after each start,
then a wait for each process in turn. The exit codes are not looked at: the launcher returns 0
whatever its processes did, and a process that died is noticed only when its turn to be waited
for comes."""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import subprocess
import time

handler = logging.StreamHandler()
handler.setFormatter(logging.Formatter(""))
logger = logging.getLogger("trainer")
logger.addHandler(handler)
logger.setLevel(logging.INFO)


def get_gpus(args: argparse.Namespace) -> list[str]:
    # set active gpus from CUDA_VISIBLE_DEVICES or --gpus
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") != "":
        gpus = os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        gpus = args.gpus
    return list(map(str.strip, gpus.split(",")))


def distribute() -> None:
    """Call the training script in DDP mode."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--continue_path", type=str, default="")
    parser.add_argument("--restore_path", type=str, default="")
    parser.add_argument("--script", type=str, help="Target training script to distibute.")
    parser.add_argument("--gpus", type=str, help='GPU IDs to be used, in the format "0,1".')
    args, unargs = parser.parse_known_args()

    gpus = get_gpus(args)
    group_id = time.strftime("%Y_%m_%d-%H%M%S")

    # set arguments for train.py
    folder_path = pathlib.Path(__file__).parent.absolute()
    if os.path.exists(os.path.join(folder_path, args.script)):
        command = [os.path.join(folder_path, args.script)]
    else:
        command = [args.script]

    # Pass all the TrainerArgs fields
    command.append(f"--continue_path={args.continue_path}")
    command.append(f"--restore_path={args.restore_path}")
    command.append(f"--group_id=group_{group_id}")
    command.append("--use_ddp=true")
    command += unargs
    command.append("")

    # run processes
    processes = []
    for rank, local_gpu_id in enumerate(gpus):
        my_env = os.environ.copy()
        my_env["PYTHON_EGG_CACHE"] = f"/tmp/tmp{local_gpu_id}"
        my_env["RANK"] = f"{rank}"
        my_env["CUDA_VISIBLE_DEVICES"] = f"{','.join(gpus)}"
        command[-1] = f"--rank={rank}"
        # prevent stdout for processes with rank != 0
        stdout = None
        p = subprocess.Popen(["python3", *command], stdout=stdout, env=my_env)
        processes.append(p)
        logger.info(command)

    for p in processes:
        p.wait()


if __name__ == "__main__":
    distribute()
