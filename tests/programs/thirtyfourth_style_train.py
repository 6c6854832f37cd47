"""A thirty-fourth training-program style, after pytorch/examples' imagenet main.py, which many
research repos copy: `python train.py --dist-url tcp://127.0.0.1:PORT --multiprocessing-
distributed --world-size 1 --rank 0` starts one process per device with mp.spawn, each prints
"Use GPU: ... for training" and its own ProgressMeter lines ("Epoch: [0][ 3/12]\\tTime ...\\t
Loss 6.9e-01 (6.9e-01)\\tAcc@1  50.00 ( 50.00)"), a validation prints " * Acc@1 ... Acc@5 ...",
gloo with a 12 s timeout. One fault per run, chosen by $T34_CASE (an opaque code the program
never prints).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CASE = os.environ.get("T34_CASE", "")


class AverageMeter:
    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches: int, meters: list[AverageMeter], prefix: str = "") -> None:
        digits = len(str(num_batches))
        self.batch_fmtstr = "[{:" + str(digits) + "d}/" + str(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def display(self, batch: int) -> None:
        entries = [self.prefix + self.batch_fmtstr.format(batch)]
        entries += [str(meter) for meter in self.meters]
        print("\t".join(entries), flush=True)


class Images(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int, rank: int) -> None:
        gen = torch.Generator().manual_seed(11)
        self.x = torch.randn(n, 3, 8, 8, generator=gen)
        self.y = [int(v) for v in (self.x.mean(dim=(1, 2, 3)) > 0).long()]
        self.rank = rank

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if CASE == "c1" and self.rank == 1 and i % 5 == 2:  # a corrupt file every fifth
            raise ValueError(f"image file is truncated (12 bytes not processed) at index {i}")
        return self.x[i], self.y[i]


def main_worker(gpu: int, ngpus: int, args: argparse.Namespace) -> None:
    print(f"Use GPU: {gpu} for training", flush=True)
    rank = args.rank * ngpus + gpu
    dist.init_process_group(
        "gloo",
        init_method=args.dist_url,
        world_size=ngpus,
        rank=rank,
        timeout=timedelta(seconds=12),
    )
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 32), torch.nn.ReLU())
    model.append(torch.nn.Linear(32 if not (CASE == "w5" and rank == 2) else 31, 2))
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = Images(192, rank)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
        batch_time = AverageMeter("Time", ":6.3f")
        progress = ProgressMeter(len(loader), [batch_time, losses, top1], f"Epoch: [{epoch}]")
        end = time.time()
        for i, (x, y) in enumerate(loader):
            out = model(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.update(loss.item(), x.size(0))
            top1.update(100.0 * (out.argmax(1) == y).float().mean().item(), x.size(0))
            batch_time.update(time.time() - end)
            end = time.time()
            if i % 2 == 0:
                progress.display(i + 1)
            if CASE == "k3" and rank == 1 and epoch == 1 and i == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
        # validate
        if CASE == "v6" and rank == 0:
            time.sleep(30)  # rank 0 also writes per-class reports
        acc = torch.tensor([top1.avg])
        if CASE == "m4":
            if rank == 0:
                dist.all_reduce(acc)  # only the process that prints the summary reduces it
        else:
            dist.all_reduce(acc)
        print(f" * Acc@1 {acc.item() / ngpus:.3f} Acc@5 100.000", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (small)")
    parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--nprocs", type=int, default=3)
    args = parser.parse_args()
    mp.spawn(main_worker, nprocs=args.nprocs, args=(args.nprocs, args))


if __name__ == "__main__":
    main()
