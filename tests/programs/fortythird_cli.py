"""The entry point of the forty-third training-program style (tests/fixtures/real/fortythird-*),
in the way of nnU-Net v2's `nnUNetv2_train DATASET CONFIGURATION FOLD -num_gpus N`
(nnunetv2/run/run_training.py): with more than one process it sets MASTER_ADDR (and MASTER_PORT,
printing the port it chose, unless the environment has one) and starts the ranks itself with
torch.multiprocessing.spawn (the rank is the spawn index); spawn's own errors
(ProcessRaisedException, ProcessExitedException) are the launcher's. The number of epochs comes
from the trainer's name (nnUNetTrainer_5epochs), as nnU-Net's trainer variants give it.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fortythird_style_train import DATASET, run_ddp


def find_free_network_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset_name_or_id")
    p.add_argument("configuration")
    p.add_argument("fold", type=int)
    p.add_argument("-tr", default="nnUNetTrainer")
    p.add_argument("-p", default="nnUNetPlans")
    p.add_argument("-num_gpus", type=int, default=1)
    p.add_argument("--c", action="store_true", help="continue training from the latest checkpoint")
    p.add_argument("-device", default="cpu")
    args = p.parse_args()
    if args.dataset_name_or_id not in (DATASET, DATASET[7:10]) or args.configuration != "2d":
        raise RuntimeError(f"unknown dataset or configuration: {args.dataset_name_or_id}")
    epochs = re.search(r"_(\d+)epochs", args.tr)
    num_epochs = int(epochs[1]) if epochs else 1000
    if args.num_gpus > 1:
        os.environ["MASTER_ADDR"] = "localhost"
        if "MASTER_PORT" not in os.environ:
            port = str(find_free_network_port())
            print(f"using port {port}")
            os.environ["MASTER_PORT"] = port
        mp.spawn(
            run_ddp,
            args=(args.tr, args.fold, num_epochs, args.c, args.num_gpus),
            nprocs=args.num_gpus,
            join=True,
        )
    else:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", str(find_free_network_port()))
        run_ddp(0, args.tr, args.fold, num_epochs, args.c, 1)


if __name__ == "__main__":
    main()
