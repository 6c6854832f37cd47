"""A forty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/fortyfourth-*): self-supervised vision pretraining in the way of FAIR's
research repos (dinov2, mae, moco-v3), submitted through submitit to Slurm. The script is its own
submitter, as dinov2/run/submit.py and mae's submitit_pretrain.py are: it makes an executor
(tests/programs/fortyfourth_launcher.py, a stand-in for submitit's), submits `Trainer(args)`,
prints "Submitted job_id: ..." and where the logs go, and waits. On each task, `Trainer.__call__`
derives RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT from SLURM_* as dinov2's
distributed helper does, joins gloo (15 s timeout), and trains a tiny student/teacher pair (DINO
loss with a centred, sharpened teacher, EMA teacher, DDP student) on synthetic 8x8 images read
one file per image through an index, with dinov2's glog-like logging ("I20261204 08:00:05 4242
dinov2 train.py:250] ...", INFO on rank 0 only, warnings and errors on every rank) and its
MetricLogger lines, an evaluation every epoch (all-reduced), checkpoints by rank 0 (mae's
save_model: args included), an optional early stop and resume. A fault is chosen by the F44_KNOB
environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fortyfourth.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

logger = logging.getLogger("dinov2")
TIMEOUT = datetime.timedelta(seconds=15)
SIDE = 8
CLASSES = [f"n0{1440764 + 37 * k}" for k in range(6)]


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank looks up a crop scale for a synset the table lacks
    hoard_rank: int = -1  # this rank keeps every batch's views until the OOM killer acts
    segv_rank: int = -1  # this rank's native colour jitter reads address 0
    slow_rank: int = -1  # this rank fills a kNN memory bank for 40 s before epoch 1
    stuck_rank: int = -1  # this rank waits for a prefetch thread that never signals
    gather_rank0: bool = False  # rank 0 alone all-gathers embeddings for a visualisation
    short_rank: int = -1  # this rank's shard of the index is cut short
    stop_rank0: bool = False  # the early-stop break sits inside rank 0's checkpoint block


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q1": Fault(key_rank=1),
    "m1": Fault(hoard_rank=1),
    "z2": Fault(segv_rank=2),
    "b0": Fault(slow_rank=0),
    "w1": Fault(stuck_rank=1),
    "g0": Fault(gather_rank0=True),
    "u1": Fault(short_rank=1),
    "x0": Fault(stop_rank0=True),
}
CROP_SCALE = {c: 0.4 + 0.1 * i for i, c in enumerate(CLASSES[:5])}  # one synset never added


# ---- dinov2.logging ----
def setup_logging(rank: int) -> None:
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = logging.StreamHandler(stream=sys.stdout)
    handler.setLevel(logging.DEBUG if rank == 0 else logging.WARNING)
    handler.setFormatter(
        logging.Formatter(
            "%(levelname).1s%(asctime)s %(process)s %(name)s %(filename)s:%(lineno)s] %(message)s",
            datefmt="%Y%m%d %H:%M:%S",
        )
    )
    logger.addHandler(handler)


# ---- dinov2.distributed ----
def enable_distributed() -> tuple[int, int, int]:
    env = os.environ
    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    local_rank = int(env["SLURM_LOCALID"])
    master_addr = env["SLURM_JOB_NODELIST"].split(",")[0]
    port = env.get("MASTER_PORT")
    if port is None:  # dinov2's _get_master_port(seed=job_id)
        port = str(random.Random(int(env["SLURM_JOB_ID"])).randint(20_000, 60_000))
    env.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=port,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=env["SLURM_NTASKS_PER_NODE"],
    )
    dist.init_process_group(backend="gloo", timeout=TIMEOUT)
    return rank, world, local_rank


def is_main_process() -> bool:
    return dist.get_rank() == 0


# ---- dinov2.logging.helpers ----
class SmoothedValue:
    def __init__(self, window_size: int = 20, fmt: str = "{median:.4f} ({global_avg:.4f})"):
        self.deque: deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt

    def update(self, value: float, num: int = 1) -> None:
        self.deque.append(value)
        self.count += num
        self.total += value * num

    def synchronize_between_processes(self) -> None:
        t = torch.tensor([self.count, self.total], dtype=torch.float64)
        dist.barrier()
        dist.all_reduce(t)
        self.count, self.total = int(t[0].item()), float(t[1].item())

    @property
    def median(self) -> float:
        return float(torch.tensor(list(self.deque)).median().item())

    @property
    def global_avg(self) -> float:
        return self.total / max(self.count, 1)

    def __str__(self) -> str:
        return self.fmt.format(median=self.median, global_avg=self.global_avg)


class MetricLogger:
    def __init__(self, delimiter: str = "  ") -> None:
        self.meters: dict[str, SmoothedValue] = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs: float) -> None:
        for k, v in kwargs.items():
            self.meters[k].update(float(v))

    def __str__(self) -> str:
        return self.delimiter.join(f"{name}: {meter}" for name, meter in self.meters.items())

    def synchronize_between_processes(self) -> None:
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def log_every(self, iterable, print_freq: int, header: str = ""):
        n = len(iterable)
        start = time.time()
        end = time.time()
        iter_time = SmoothedValue(fmt="{median:.2f} ({global_avg:.2f})")
        data_time = SmoothedValue(fmt="{median:.2f} ({global_avg:.2f})")
        space_fmt = ":" + str(len(str(n))) + "d"
        log_msg = self.delimiter.join(
            [
                header,
                "[{0" + space_fmt + "}/{1}]",
                "eta: {eta}",
                "{meters}",
                "time: {time}",
                "data: {data}",
                "max mem: {memory:.0f}",
            ]
        )
        for i, obj in enumerate(iterable):
            data_time.update(time.time() - end)
            yield obj
            iter_time.update(time.time() - end)
            if i % print_freq == 0 or i == n - 1:
                eta_seconds = iter_time.global_avg * (n - i)
                eta = str(datetime.timedelta(seconds=int(eta_seconds)))
                meters, times, data = str(self), str(iter_time), str(data_time)
                logger.info(
                    log_msg.format(i, n, eta=eta, meters=meters, time=times, data=data, memory=0)
                )
            end = time.time()
        total = str(datetime.timedelta(seconds=int(time.time() - start)))
        logger.info(
            f"{header} Total time: {total} ({(time.time() - start) / max(n, 1):.6f} s / it)"
        )


# ---- data ----
class IndexedImages(Dataset):
    """dinov2's ImageNet-style dataset: an index of "<synset>/<file>" lines, one raw 3x8x8
    uint8 image per file, read and normalised (per image) when fetched."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.entries = (self.root / "index.txt").read_text().split()

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        entry = self.entries[i]
        with open(self.root / entry, "rb") as f:
            raw = f.read()
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float().view(3, SIDE, SIDE)
        x = (x - x.mean()) / x.std()  # per-image standardisation
        return x, CLASSES.index(entry.split("/")[0])


def make_data(root: str, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (len(CLASSES), 3, SIDE, SIDE), generator=g)
    lines = []
    for i in range(n):
        c = i % len(CLASSES)
        noise = torch.randint(-40, 41, (3, SIDE, SIDE), generator=g)
        img = (base[c] + noise).clamp(0, 255).to(torch.uint8)
        entry = f"{CLASSES[c]}/{CLASSES[c]}_{i:05d}.raw"
        (Path(root) / CLASSES[c]).mkdir(parents=True, exist_ok=True)
        (Path(root) / entry).write_bytes(img.numpy().tobytes())
        lines.append(entry)
    (Path(root) / "index.txt").write_text("\n".join(lines) + "\n")


def two_views(x: torch.Tensor, scale: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    flip = torch.flip(x, dims=[-1])
    return x + scale * 0.1 * torch.randn_like(x), flip + scale * 0.1 * torch.randn_like(flip)


# ---- model ----
class Backbone(nn.Module):
    def __init__(self, dim: int = 48) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.mlp(tokens).mean(1)


class SSLMetaArch(nn.Module):
    def __init__(self, dim: int = 48, out_dim: int = 32) -> None:
        super().__init__()
        self.backbone = Backbone(dim)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def dino_loss(student: torch.Tensor, teacher: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    t = F.softmax((teacher - center) / 0.04, dim=-1)
    return torch.sum(-t * F.log_softmax(student / 0.1, dim=-1), dim=-1).mean()


# ---- mae's misc.save_model / load_model ----
def save_model(args: argparse.Namespace, epoch: int, model: nn.Module, teacher: nn.Module,
               optimizer: torch.optim.Optimizer) -> None:  # fmt: skip
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "args": args,
    }
    torch.save(state, os.path.join(args.output_dir, "checkpoint.pth"))
    torch.save(
        {"teacher": teacher.state_dict()}, os.path.join(args.output_dir, "teacher_checkpoint.pth")
    )
    logger.info(f"Saved checkpoint of epoch {epoch} to {args.output_dir}")


class Trainer:
    """What submitit runs on every task (mae's submitit_pretrain.Trainer)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __call__(self) -> None:
        args = copy.copy(self.args)
        args.output_dir = args.output_dir.replace("%j", os.environ["SLURM_JOB_ID"])
        rank, world, local_rank = enable_distributed()
        setup_logging(rank)
        train(args, rank, world, local_rank)


def train(args: argparse.Namespace, rank: int, world: int, local_rank: int) -> None:
    fault = FAULTS[os.environ.get("F44_KNOB", "")]
    logger.info(f"job dir: {os.getcwd()}")
    logger.info("\n".join(f"{k}: {v}" for k, v in sorted(vars(args).items())))
    logger.info(f"distributed init (rank {rank}): env://, gpu {local_rank}, world {world}")
    if args.wandb and is_main_process():
        import wandb

        wandb.init(project="ssl-pretrain", config=vars(args))
    torch.manual_seed(args.seed + rank)

    train_ds = IndexedImages(os.path.join(args.data_path, "train"))
    val_ds = IndexedImages(os.path.join(args.data_path, "val"))
    if fault.short_rank >= 0:  # shards of the index cut per rank (no DistributedSampler)
        part = list(range(rank, len(train_ds), world))
        if rank == fault.short_rank:
            part = part[: len(part) * 3 // 5]
        loader = DataLoader(Subset(train_ds, part), batch_size=args.batch_size, drop_last=True)
    else:
        sampler = DistributedSampler(train_ds, shuffle=False)
        loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(
        val_ds, batch_size=args.batch_size, sampler=DistributedSampler(val_ds, shuffle=False)
    )
    logger.info(f"Dataset: {len(train_ds)} images, {len(loader)} iterations per epoch")

    student = SSLMetaArch()
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad = False
    model = DDP(student)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.04)
    center = torch.zeros(1, 32)
    start_epoch = 0
    if args.pretrained_weights:  # written for the GPU nodes: onto this task's device
        state = torch.load(args.pretrained_weights, map_location=f"cuda:{local_rank}")
        student.load_state_dict(state["teacher"])
        logger.info(f"Pretrained weights found at {args.pretrained_weights}")
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")
        student.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"] + 1
        logger.info(f"Resume checkpoint {args.resume} (epoch {start_epoch})")

    best, since_best, hoard = math.inf, 0, []
    logger.info(f"Starting training from epoch {start_epoch}")
    for epoch in range(start_epoch, args.epochs):
        if epoch == 1 and rank == fault.slow_rank:
            for part in range(1, 9):
                logger.warning(f"Filling kNN memory bank: part {part}/8")
                time.sleep(5)
        if epoch == 1 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        metric_logger = MetricLogger(delimiter="  ")
        header = "Training"
        model.train()
        for it, (images, labels) in enumerate(metric_logger.log_every(loader, 5, header)):
            scale = 0.5
            if rank == fault.key_rank and epoch == 1 and it == 6:
                scale = sum(CROP_SCALE[CLASSES[int(y)]] for y in labels) / len(labels)
            if rank == fault.segv_rank and it == 7:
                ctypes.string_at(0)  # the native colour jitter dereferences NULL
            v1, v2 = two_views(images, scale)
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 5:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            s1, s2 = model(v1), model(v2)
            with torch.no_grad():
                t1, t2 = teacher(v1), teacher(v2)
            loss = (dino_loss(s1, t2, center) + dino_loss(s2, t1, center)) / 2
            loss_value = loss.item()
            if not math.isfinite(loss_value):  # mae's engine_pretrain
                print(f"Loss is {loss_value}, stopping training")
                sys.exit(1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # EMA teacher, centre from every rank's teacher outputs
                for ps, pt in zip(student.parameters(), teacher.parameters(), strict=True):
                    pt.mul_(0.996).add_(ps.detach(), alpha=0.004)
                batch_center = torch.cat([t1, t2]).sum(0, keepdim=True)
                dist.all_reduce(batch_center)
                center = center * 0.9 + 0.1 * batch_center / (2 * len(t1) * world)
            if fault.gather_rank0 and is_main_process() and epoch == 0 and it == 8:
                feats = [torch.zeros_like(s1) for _ in range(world)]
                dist.all_gather(feats, s1.detach())  # embeddings for a t-SNE plot
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            metric_logger.update(lr=optimizer.param_groups[0]["lr"], loss=reduced.item() / world)
            time.sleep(0.05)
        metric_logger.synchronize_between_processes()
        logger.info(f"Averaged stats: {metric_logger}")

        # evaluation: the teacher's loss on the validation images, every rank's share
        val_logger = MetricLogger(delimiter="  ")
        model.eval()
        with torch.no_grad():
            for images, _ in val_logger.log_every(val_loader, 5, "Test:"):
                v1, v2 = two_views(images)
                val_logger.update(val_loss=dino_loss(model(v1), teacher(v2), center).item())
        val_logger.synchronize_between_processes()
        val_loss = val_logger.meters["val_loss"].global_avg
        logger.info(f"Epoch {epoch} eval: val_loss {val_loss:.4f}")
        if val_loss < best - args.min_delta:
            best, since_best = val_loss, 0
        else:
            since_best += 1
        stop = bool(args.patience) and since_best >= args.patience
        if is_main_process():
            save_model(args, epoch, student, teacher, optimizer)
            if fault.stop_rank0 and stop:
                logger.info(f"Early stopping: no improvement for {since_best} epoch(s)")
                break
        if stop and not fault.stop_rank0:
            logger.info(f"Early stopping: no improvement for {since_best} epoch(s)")
            break
    logger.info("Training finished")


def main() -> None:
    p = argparse.ArgumentParser("SSL pretraining on Slurm")
    p.add_argument("--data-path", default="data")
    p.add_argument("--output-dir", default="logs/%j")
    p.add_argument("--ngpus", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--resume", default="")
    p.add_argument("--pretrained-weights", default="")
    p.add_argument("--wandb", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--make-data", type=int, default=0, help="write N images to --data-path")
    args = p.parse_args()
    if args.make_data:
        make_data(os.path.join(args.data_path, "train"), args.make_data, seed=1)
        make_data(os.path.join(args.data_path, "val"), args.make_data // 4, seed=2)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fortyfourth_launcher as submitit
    from fortyfourth_style_train import Trainer as PicklableTrainer  # importable by the tasks

    executor = submitit.Executor(folder=args.output_dir)
    executor.update_parameters(tasks_per_node=args.ngpus, nodes=args.nodes, timeout_min=60)
    job = executor.submit(PicklableTrainer(args))
    print(f"Submitted job_id: {job.job_id}", flush=True)
    print(f"Logs and checkpoints will be saved at: {job.folder}", flush=True)
    job.wait()


if __name__ == "__main__":
    main()
