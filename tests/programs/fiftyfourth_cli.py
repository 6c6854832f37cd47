"""The command line of the fifty-fourth training-program style (tests/fixtures/real/fiftyfourth-*):
an LLM fine-tuning CLI in the way of LLaMA-Factory's `llamafactory-cli` (its cli.py): the user runs
one command, `python fiftyfourth_cli.py train config.yaml`; the CLI prints its banner and, since
more than one process is asked for (NPROC_PER_NODE, 3 unless set, or FORCE_TORCHRUN), runs
`torchrun --nnodes 1 --node_rank 0 --nproc_per_node N --master_addr ADDR --master_port PORT
fiftyfourth_style_train.py config.yaml` with subprocess.run(check=True), so that a failed run ends
the CLI with a CalledProcessError traceback after torchrun's own output. One process runs the
training in place.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys

VERSION = "0.9.3.dev0"
WELCOME = (
    "-" * 58
    + "\n"
    + f"| Welcome to TinyTune, version {VERSION}".ljust(57)
    + "|\n|"
    + " " * 56
    + "|\n"
    + "| Project page: https://github.com/tinytune/TinyTune".ljust(57)
    + "|\n"
    + "-" * 58
)
USAGE = (
    "-" * 70
    + "\n"
    + "| Usage:                                                             |\n"
    + "|   tinytune-cli train -h: train models                              |\n"
    + "|   tinytune-cli version: show version info                          |\n"
    + "-" * 70
)
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fiftyfourth_style_train.py")


def get_logger() -> logging.Logger:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            "[%(levelname)s|%(asctime)s] %(name)s:%(lineno)s >> %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
        )
    )
    logger = logging.getLogger("tinytune.cli")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def main() -> None:
    logger = get_logger()
    command = sys.argv.pop(1) if len(sys.argv) > 1 else "help"
    if command == "version":
        print(WELCOME)
    elif command == "train":
        print(WELCOME)
        force_torchrun = os.getenv("FORCE_TORCHRUN", "0").lower() in ("true", "1")
        nproc_per_node = os.getenv("NPROC_PER_NODE", "3")
        if force_torchrun or int(nproc_per_node) > 1:
            nnodes = os.getenv("NNODES", "1")
            node_rank = os.getenv("NODE_RANK", "0")
            master_addr = os.getenv("MASTER_ADDR", "127.0.0.1")
            master_port = os.getenv("MASTER_PORT", str(random.randint(20001, 29999)))
            logger.info(
                f"Initializing {nproc_per_node} distributed tasks at: {master_addr}:{master_port}"
            )
            env = dict(os.environ)
            process = subprocess.run(
                (
                    "torchrun --nnodes {nnodes} --node_rank {node_rank} --nproc_per_node "
                    "{nproc_per_node} --master_addr {master_addr} --master_port {master_port} "
                    "{file_name} {args}"
                )
                .format(
                    nnodes=nnodes,
                    node_rank=node_rank,
                    nproc_per_node=nproc_per_node,
                    master_addr=master_addr,
                    master_port=master_port,
                    file_name=TRAIN,
                    args=" ".join(sys.argv[1:]),
                )
                .split(),
                env=env,
                check=True,
            )
            sys.exit(process.returncode)
        else:
            subprocess.run([sys.executable, TRAIN, *sys.argv[1:]], check=True)
    else:
        print(USAGE)


if __name__ == "__main__":
    main()
