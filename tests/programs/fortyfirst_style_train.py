"""A forty-first training-program style: a runner in the way of OpenMMLab's MMEngine (mmdet 3.x,
mmseg 1.x, mmpretrain), launched as its tools/dist_train.sh does (`torchrun --nproc_per_node N
train.py CONFIG --launcher pytorch`): an MMLogger that writes '12/04 04:50:05 - mmengine - INFO -
message' on rank 0 and only warnings and errors elsewhere (as MMEngine sets the other ranks'
level), the environment block and the config dumped at start, 'Epoch(train) [1][ 10/40]  lr:
1.0000e-02  eta: 0:00:12  time: 0.1234  data_time: 0.0123  memory: 0  loss: 0.6931' every few
iterations, 'Saving checkpoint at 1 epochs', an 'Epoch(val) [1][5/5]    accuracy/top1: 50.0000'
summary whose metric is all-gathered, and hooks around the loop. gloo with a 15 s timeout.
One fault per run, chosen by $T41_CASE (an opaque code the program never prints).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("T41_CASE", "")
WORK_DIR = Path(os.environ.get("T41_WORK_DIR", "work_dirs/toy_cls"))
MAX_EPOCHS = 3
ITERS = 12
INTERVAL = 4


def get_logger(rank: int) -> logging.Logger:
    logger = logging.getLogger("mmengine")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s", "%m/%d %H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    logger.propagate = False
    return logger


def env_block(world: int) -> str:
    lines = [
        "",
        "------------------------------------------------------------",
        "System environment:",
        f"    sys.platform: {sys.platform}",
        f"    Python: {sys.version.split()[0]}",
        "    CUDA available: False",
        f"    PyTorch: {torch.__version__}",
        "",
        "Runtime environment:",
        "    cudnn_benchmark: False",
        "    dist_cfg: {'backend': 'gloo'}",
        "    seed: 42",
        "    Distributed launcher: pytorch",
        "    Distributed training: True",
        f"    GPU number: {world}",
        "------------------------------------------------------------",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = get_logger(rank)
    logger.info(env_block(world))
    logger.info(
        "Config:\nmodel = dict(type='ToyClassifier', in_channels=8, num_classes=3)\n"
        f"train_cfg = dict(by_epoch=True, max_epochs={MAX_EPOCHS}, val_interval=1)\n"
        f"work_dir = '{WORK_DIR}'\n"
    )
    gen = torch.Generator().manual_seed(100 + rank)
    n = ITERS * 4 if not (CASE == "s6" and rank == 1) else 9 * 4  # its annotation file is shorter
    x = torch.randn(n, 8, generator=gen)
    y = (x[:, :3].argmax(1)).long()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if CASE == "r8":
        # resume: rank 1 stands for a second node, whose node-local work_dir never got it
        folder = WORK_DIR if rank != 1 else WORK_DIR.parent / "node1" / WORK_DIR.name
        state = torch.load(folder / "epoch_2.pth")
        model.module.load_state_dict(state["state_dict"])
        logger.info(f"resumed epoch: {state['epoch']}")
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    logger.info(f"Checkpoints will be saved to {WORK_DIR.resolve()}.")
    iters = n // 4
    start = time.perf_counter()
    for epoch in range(1, MAX_EPOCHS + 1):
        for i in range(1, iters + 1):
            xb, yb = x[(i - 1) * 4 : i * 4], y[(i - 1) * 4 : i * 4]
            if CASE == "n4" and rank == 0 and epoch == 2 and i == 5:
                xb = xb * float("nan")  # a corrupted image decoded as NaNs
            loss = F.cross_entropy(model(xb), yb)
            if CASE == "n4" and not torch.isfinite(loss):
                raise RuntimeError(f"loss is nan at epoch {epoch} iter {i}, stop training")
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % INTERVAL == 0:
                elapsed = time.perf_counter() - start
                logger.info(
                    f"Epoch(train) [{epoch}][{i:>2}/{iters}]  lr: 1.0000e-02  eta: 0:00:0{epoch}  "
                    f"time: {elapsed / i:.4f}  data_time: 0.0012  memory: 0  loss: {loss.item():.4f}"
                )
            if CASE == "k3" and rank == 2 and epoch == 2 and i == 6:
                hog = [torch.ones(1 << 20) for _ in range(48)]
                os.kill(os.getpid(), 9)
                print(len(hog))
        logger.info(f"Exp name: toy_cls_{time.strftime('%Y%m%d_%H%M%S')}")
        logger.info(f"Saving checkpoint at {epoch} epochs")
        if rank == 0:
            torch.save(
                {"state_dict": model.module.state_dict(), "epoch": epoch},
                WORK_DIR / f"epoch_{epoch}.pth",
            )
            if CASE == "w5" and epoch == 1:
                time.sleep(25.0)  # the checkpoint goes to a network file system first
        correct = torch.tensor([float((model(x[-20:]).argmax(1) == y[-20:]).sum())])
        if CASE != "v7" or rank == 0:  # v7: the metric is gathered only where it is logged
            dist.all_reduce(correct)
        logger.info(
            f"Epoch(val) [{epoch}][5/5]    accuracy/top1: {100.0 * float(correct) / (20 * world):.4f}  data_time: 0.0011  time: 0.0123"
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
