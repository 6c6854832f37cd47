"""A twenty-first training-program style for the generalisation fixtures
(tests/fixtures/real/twentyfirst-*): a detection trainer in the way of YOLOX and the research repos
that log with loguru, raw torch on CPU with gloo. YOLOX's `launch()` (mp.start_processes with a
tcp:// dist_url, `--num_machines/--machine_rank`; a direct call under torchrun), `@logger.catch` on
main (loguru's default: the traceback is printed with its variables and NOT re-raised, so a failed
rank exits 0), `setup_logger(save_dir, distributed_rank)` (loguru's default format; rank 0 at INFO
plus `train_log.txt`, other ranks WARNING and above; sys.stdout/stderr redirected through loguru),
a Trainer whose `train()` runs `after_train()` in a `finally` ("Training of experiment is done and
the best AP is ..." even when it failed), a COCO-like toy dataset read by pycocotools-style code
with `wait_for_the_master`, per-rank shards, an evaluator that all-gathers top-k detections and
synchronizes, and `latest_ckpt.pth` save / `--resume`. Needs loguru (not a ddpdoctor dependency).
A fault is chosen by $EXP_FAULT (a code, never printed); most faults are in what a run is given
(tests/fixtures/real/capture_twentyfirst.sh: re-capture after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import inspect
import json
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from loguru import logger
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler

FAULT = os.environ.get("EXP_FAULT", "")
IMG = 32
NUM_CLASSES = 3
DEFAULT_TIMEOUT = datetime.timedelta(seconds=15)

# -----------------------------------------------------------------------------
# yolox/utils/dist.py


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_local_rank() -> int:
    return int(os.environ.get("YOLOX_LOCAL_RANK", "0"))


def is_main_process() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    """A barrier among all processes (a no-op with one)."""
    if get_world_size() > 1:
        dist.barrier()


@contextmanager
def wait_for_the_master(local_rank: int | None = None) -> Iterator[None]:
    """Local rank 0 of each machine reads first; the others wait in a barrier."""
    if local_rank is None:
        local_rank = get_local_rank()
    if local_rank > 0 and get_world_size() > 1:
        dist.barrier()
    yield
    if local_rank == 0 and get_world_size() > 1:
        dist.barrier()


# -----------------------------------------------------------------------------
# yolox/core/launch.py


def _find_free_port() -> int:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    backend: str = "gloo",
    dist_url: str | None = None,
    args: tuple[Any, ...] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        os.environ["YOLOX_LOCAL_RANK"] = str(local_rank)
        dist.init_process_group(backend=backend, timeout=timeout)
        synchronize()
        main_func(*args)
        return
    world_size = num_machines * num_gpus_per_machine
    if world_size > 1:
        if dist_url == "auto":
            assert num_machines == 1, "dist_url=auto cannot work with distributed training."
            dist_url = f"tcp://127.0.0.1:{_find_free_port()}"
        start_method = "spawn"
        if vars(args[0]).get("cache", False):  # fork keeps the cached images shared
            start_method = "fork"
        mp.start_processes(
            _distributed_worker,
            nprocs=num_gpus_per_machine,
            args=(
                main_func,
                world_size,
                num_gpus_per_machine,
                machine_rank,
                backend,
                dist_url,
                args,
                timeout,
            ),
            daemon=False,
            start_method=start_method,
        )
    else:
        main_func(*args)


def _distributed_worker(
    local_rank: int,
    main_func: Callable[..., Any],
    world_size: int,
    num_gpus_per_machine: int,
    machine_rank: int,
    backend: str,
    dist_url: str,
    args: tuple[Any, ...],
    timeout: datetime.timedelta,
) -> None:
    global_rank = machine_rank * num_gpus_per_machine + local_rank
    logger.info(f"Rank {global_rank} initialization finished.")
    try:
        dist.init_process_group(
            backend=backend,
            init_method=dist_url,
            world_size=world_size,
            rank=global_rank,
            timeout=timeout,
        )
    except Exception:
        logger.error(f"Process group URL: {dist_url}")
        raise
    os.environ["YOLOX_LOCAL_RANK"] = str(local_rank)
    synchronize()
    main_func(*args)


# -----------------------------------------------------------------------------
# yolox/utils/logger.py


class StreamToLoguru:
    """stdout/stderr: writes from the named callers go through loguru, the rest straight out."""

    def __init__(self, level: str = "INFO", caller_names: tuple[str, ...] = ("apex",)) -> None:
        self.level = level
        self.caller_names = caller_names

    def write(self, buf: str) -> None:
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        module = caller.f_globals.get("__name__", "") if caller is not None else ""
        if module.split(".")[0] in self.caller_names:
            for line in buf.rstrip().splitlines():
                logger.opt(depth=1).log(self.level, line.rstrip())
        else:
            sys.__stdout__.write(buf)  # type: ignore[union-attr]

    def flush(self) -> None:
        sys.__stdout__.flush()  # type: ignore[union-attr]

    def isatty(self) -> bool:
        return False


def setup_logger(save_dir: str, distributed_rank: int = 0, filename: str = "train_log.txt") -> None:
    """Rank 0 logs INFO to the console and to save_dir/train_log.txt; the other ranks only
    WARNING and above, to the console."""
    logger.remove()
    if distributed_rank == 0:
        logger.add(sys.stderr, level="INFO", enqueue=True)
        logger.add(os.path.join(save_dir, filename))
    else:
        logger.add(sys.stderr, level="WARNING")
    redirect = StreamToLoguru("INFO")
    sys.stderr = redirect  # type: ignore[assignment]
    sys.stdout = redirect  # type: ignore[assignment]


# -----------------------------------------------------------------------------
# data: a COCO-like json read by pycocotools-style code, images as raw float16 files


def write_toy_data(root: str, n_train: int = 48, n_val: int = 8) -> None:
    """instances_train.json, instances_val.json and one raw image file per image id."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for split, n, start in (("train", n_train, 0), ("val", n_val, 1000)):
        images, anns = [], []
        for i in range(start, start + n):
            img = torch.rand(3, IMG, IMG, generator=g) * 0.2
            images.append({"id": i, "file_name": f"{i:012d}.raw", "width": IMG, "height": IMG})
            for _ in range(1 + int(torch.randint(0, 3, (1,), generator=g))):
                x, y = (float(v) for v in torch.randint(0, IMG - 10, (2,), generator=g))
                w, h = (float(v) for v in torch.randint(4, 10, (2,), generator=g))
                c = int(torch.randint(0, NUM_CLASSES, (1,), generator=g))
                img[c, int(y) : int(y + h), int(x) : int(x + w)] += 0.8
                anns.append(
                    {"id": len(anns) + 1, "image_id": i, "category_id": c + 1,
                     "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0}
                )  # fmt: skip
            img.half().numpy().tofile(os.path.join(root, "images", f"{i:012d}.raw"))
        cats = [{"id": c + 1, "name": n} for c, n in enumerate(("car", "person", "dog"))]
        with open(os.path.join(root, f"instances_{split}.json"), "w") as f:
            json.dump({"images": images, "annotations": anns, "categories": cats}, f)


class COCO:
    """The part of pycocotools.coco.COCO this trainer uses (and its prints)."""

    def __init__(self, annotation_file: str) -> None:
        print("loading annotations into memory...")
        tic = time.time()
        with open(annotation_file) as f:
            self.dataset = json.load(f)
        print(f"Done (t={time.time() - tic:0.2f}s)")
        print("creating index...")
        self.imgs = {im["id"]: im for im in self.dataset["images"]}
        self.img_to_anns: dict[int, list[dict[str, Any]]] = {i: [] for i in self.imgs}
        for a in self.dataset["annotations"]:
            self.img_to_anns[a["image_id"]].append(a)
        print("index created!")

    def load_res(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        print("Loading and preparing results...")
        anns = list(results)
        assert isinstance(anns, list), "results in not an array of objects"
        if "bbox" in anns[0] and anns[0]["bbox"] != []:
            for i, a in enumerate(anns):
                a["id"] = i + 1
        return anns


class COCODataset(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    def __init__(self, data_dir: str, json_file: str) -> None:
        self.data_dir = data_dir
        self.coco = COCO(os.path.join(data_dir, json_file))
        self.ids = sorted(self.coco.imgs)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        img_id = self.ids[index]
        info = self.coco.imgs[img_id]
        path = os.path.join(self.data_dir, "images", info["file_name"])
        with open(path, "rb") as f:
            raw = f.read()
        img = torch.frombuffer(bytearray(raw), dtype=torch.float16).float().view(3, IMG, IMG)
        boxes = [[a["category_id"] - 1, *a["bbox"]] for a in self.coco.img_to_anns[img_id]]
        return img, torch.tensor(boxes, dtype=torch.float32).view(-1, 5), img_id


def collate(batch: list[Any]) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    return (
        torch.stack([b[0] for b in batch]),
        [b[1] for b in batch],
        [b[2] for b in batch],
    )


class ShardSampler(Sampler[int]):
    """Contiguous shards of ceil(n / world) images, shuffled per epoch inside the shard."""

    def __init__(self, size: int, shuffle: bool, seed: int = 0) -> None:
        per = math.ceil(size / get_world_size())
        self.indices = list(range(size))[get_rank() * per : (get_rank() + 1) * per]
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(self.indices)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter([self.indices[i] for i in torch.randperm(len(self.indices), generator=g)])

    def __len__(self) -> int:
        return len(self.indices)


# -----------------------------------------------------------------------------
# model and loss


class TinyYOLO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.SiLU(),
            nn.Conv2d(8, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(),
        )  # fmt: skip
        self.head = nn.Conv2d(16, 1 + NUM_CLASSES + 4, 1)
        stride = IMG // 8
        ys, xs = torch.meshgrid(torch.arange(8), torch.arange(8))  # the old call: it warns
        self.register_buffer("centers", torch.stack([xs, ys], -1).view(-1, 2) * stride + 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.backbone(x))  # B, 8, 8, 8
        return out.flatten(2).transpose(1, 2)  # B, cells, 1 + C + 4


def get_losses(
    outputs: torch.Tensor, targets: list[torch.Tensor], centers: torch.Tensor
) -> dict[str, torch.Tensor]:
    """SimOTA-like assignment in miniature: a cell inside a ground-truth box is foreground and
    takes the box whose centre is nearest."""
    obj_l, cls_l, iou_l = [], [], []
    for out, gt in zip(outputs, targets, strict=True):
        x, y = centers[:, None, 0], centers[:, None, 1]
        inside = (x >= gt[:, 1]) & (x <= gt[:, 1] + gt[:, 3])
        inside &= (y >= gt[:, 2]) & (y <= gt[:, 2] + gt[:, 4])  # cells x num_gt
        gt_c = gt[:, 1:3] + gt[:, 3:5] / 2
        cost = torch.where(inside, torch.cdist(centers, gt_c), torch.inf)
        _, idx = cost.min(dim=1)
        fg = inside.any(dim=1)
        obj_l.append(F.binary_cross_entropy_with_logits(out[:, 0], fg.float()))
        if fg.any():
            cls_l.append(F.cross_entropy(out[fg, 1 : 1 + NUM_CLASSES], gt[idx[fg], 0].long()))
            iou_l.append(F.l1_loss(out[fg, 1 + NUM_CLASSES :] * IMG, gt[idx[fg], 1:5]) / IMG)
    z = outputs.sum() * 0
    obj = torch.stack(obj_l).mean()
    cls = torch.stack(cls_l).mean() if cls_l else z
    iou = torch.stack(iou_l).mean() if iou_l else z
    return {"total_loss": obj + cls + iou, "iou_loss": iou, "conf_loss": obj, "cls_loss": cls}


# -----------------------------------------------------------------------------
# evaluator


class COCOEvaluator:
    def __init__(self, loader: DataLoader[Any], coco: COCO, conf: float, topk: int = 10) -> None:
        self.loader, self.coco, self.conf, self.topk = loader, coco, conf, topk

    def evaluate(self, model: nn.Module, distributed: bool) -> tuple[float, float, str]:
        model.eval()
        rows = []
        with torch.no_grad():
            for imgs, _, ids in self.loader:
                out = model(imgs)
                for o, img_id in zip(out, ids, strict=True):
                    score, order = torch.sigmoid(o[:, 0]).topk(self.topk)
                    box = o[order, 1 + NUM_CLASSES :] * IMG
                    cls = o[order, 1 : 1 + NUM_CLASSES].argmax(-1).float()
                    ids_ = torch.full_like(score, float(img_id))
                    rows.append(torch.cat([ids_[:, None], box, score[:, None], cls[:, None]], 1))
        dets = torch.cat(rows) if rows else torch.zeros(0, 7)
        if distributed:  # every rank's top-k detections (yolox.utils.gather, unpadded)
            parts = [torch.empty_like(dets) for _ in range(get_world_size())]
            dist.all_gather(parts, dets)
            dets = torch.cat(parts)
        model.train()
        if not is_main_process():
            return 0.0, 0.0, ""
        return self.evaluate_prediction(dets)

    def evaluate_prediction(self, dets: torch.Tensor) -> tuple[float, float, str]:
        logger.info("Evaluate in main process...")
        data_list = [
            {"image_id": int(d[0]), "category_id": int(d[6]) + 1, "bbox": d[1:5].tolist(),
             "score": float(d[5])}
            for d in dets
            if float(d[5]) > self.conf
        ]  # fmt: skip
        results = self.coco.load_res(data_list)
        hits = 0
        for r in results:
            for a in self.coco.img_to_anns[r["image_id"]]:
                if a["category_id"] == r["category_id"]:
                    hits += int(abs(a["bbox"][0] - r["bbox"][0]) < 2)
        ap = hits / max(len(results), 1)
        ap50 = min(1.0, ap * 1.5)
        info = (
            f" Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = {ap:.3f}\n"
            f" Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ] = {ap50:.3f}"
        )
        return ap, ap50, info


# -----------------------------------------------------------------------------
# yolox/core/trainer.py


class AverageMeter:
    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def update(self, v: float) -> None:
        self.total += v
        self.count += 1

    @property
    def avg(self) -> float:
        return self.total / max(self.count, 1)


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.max_epoch = args.max_epoch
        self.rank = get_rank()
        self.local_rank = get_local_rank()
        self.is_distributed = get_world_size() > 1
        self.best_ap = 0.0
        self.file_name = os.path.join(args.output_dir, args.experiment_name)
        self.input_size = (IMG, IMG)
        self.start_epoch = 0
        self.meters: dict[str, AverageMeter] = {}
        if self.rank == 0:
            os.makedirs(self.file_name, exist_ok=True)
        synchronize()
        setup_logger(self.file_name, distributed_rank=self.rank)

    def train(self) -> None:
        self.before_train()
        try:
            self.train_in_epoch()
        except Exception:
            raise
        finally:
            self.after_train()

    def before_train(self) -> None:
        args = self.args
        logger.info(f"args: {args}")
        torch.manual_seed(0)
        model = TinyYOLO()
        logger.info(f"Model Summary: Params: {sum(p.numel() for p in model.parameters())}")
        self.optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        self.scaler = torch.cuda.amp.GradScaler(enabled=args.fp16)
        with wait_for_the_master():
            dataset = COCODataset(args.data_dir, args.train_ann)
        self.sampler = ShardSampler(len(dataset), shuffle=True)
        self.train_loader = DataLoader(
            dataset, batch_size=args.batch_size // get_world_size(), sampler=self.sampler,
            num_workers=args.workers, collate_fn=collate,
        )  # fmt: skip
        self.max_iter = len(self.train_loader)
        logger.info("init prefetcher, this might take one minute or less...")
        self.lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, self.max_epoch * self.max_iter
        )
        if self.is_distributed:
            model = DDP(model, broadcast_buffers=False)
        self.model = model
        if args.resume:
            self.resume_train()
        with wait_for_the_master():
            val = COCODataset(args.data_dir, args.val_ann)
        val_loader = DataLoader(
            val, batch_size=2, sampler=ShardSampler(len(val), shuffle=False), collate_fn=collate
        )
        self.evaluator = COCOEvaluator(val_loader, val.coco, conf=args.conf)
        if self.rank == 0 and args.logger == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tblogger = SummaryWriter(os.path.join(self.file_name, "tensorboard"))
        logger.info("Training start...")
        logger.info(f"\n{model}")

    def resume_train(self) -> None:
        logger.info("resume training")
        ckpt_file = self.args.ckpt or os.path.join(self.file_name, "latest_ckpt.pth")
        ckpt = torch.load(ckpt_file, map_location="cpu", weights_only=True)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.best_ap = ckpt.pop("best_ap", 0)
        self.start_epoch = ckpt["start_epoch"]
        logger.info(f"loaded checkpoint '{ckpt_file}' (epoch {self.start_epoch})")

    def train_in_epoch(self) -> None:
        for self.epoch in range(self.start_epoch, self.max_epoch):  # noqa: B020 (YOLOX's loop)
            logger.info(f"---> start train epoch{self.epoch + 1}")
            self.sampler.set_epoch(self.epoch)
            self.train_in_iter()
            self.after_epoch()

    def train_in_iter(self) -> None:
        self.t0 = time.time()
        self.iter = 0
        for self.iter, (imgs, targets, _) in enumerate(self.train_loader):  # noqa: B020
            data_end = time.time()
            self.train_one_iter(imgs, targets, data_end)

    def train_one_iter(self, imgs: torch.Tensor, targets: list[torch.Tensor], t: float) -> None:
        self.inject(targets)
        outputs = self.model(imgs)
        centers = (self.model.module if self.is_distributed else self.model).centers
        losses = get_losses(outputs, targets, centers)
        loss = losses["total_loss"]
        if not torch.isfinite(loss):
            if self.args.nonfinite == "skip":
                logger.warning(f"NaN or Inf found in loss ({loss.item()}), skip this iteration")
                self.t0 = time.time()
                return
            logger.error(f"Loss is {loss.item()}, stopping training")
            sys.exit(1)
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.lr_scheduler.step()
        now = time.time()
        for k, v in (("iter_time", now - self.t0), ("data_time", t - self.t0)):
            self.meters.setdefault(k, AverageMeter()).update(v)
        for k, v in losses.items():
            self.meters.setdefault(k, AverageMeter()).update(float(v.detach()))
        self.t0 = now
        self.after_iter()

    def inject(self, targets: list[torch.Tensor]) -> None:
        """What goes wrong inside a rank at its fifth iteration (EXP_FAULT)."""
        if self.iter != 4 or self.epoch != self.start_epoch:
            return
        if FAULT == "eg" and self.rank == 1:  # an image whose objects were all filtered out
            targets[0] = targets[0][:0]
        elif FAULT == "hb" and self.rank == 1:  # box widths that overflowed float32
            targets[0][:, 3] = float("inf")
        elif FAULT == "kl" and self.rank == 2:  # the mosaic cache grows until the OOM killer
            self._cache = [torch.ones(16 * 2**20) for _ in range(4)]
            os.kill(os.getpid(), signal.SIGKILL)
        elif FAULT == "sv" and self.rank == 1:  # the compiled box op reads a null pointer
            ctypes.string_at(0)

    def after_iter(self) -> None:
        if (self.iter + 1) % self.args.print_interval:
            return
        left = (self.max_epoch - self.epoch) * self.max_iter - self.iter - 1
        eta = datetime.timedelta(seconds=int(self.meters["iter_time"].avg * left))
        progress = (
            f"epoch: {self.epoch + 1}/{self.max_epoch}, iter: {self.iter + 1}/{self.max_iter}"
        )
        times = ", ".join(f"{k}: {self.meters[k].avg:.3f}s" for k in ("iter_time", "data_time"))
        loss_str = ", ".join(
            f"{k}: {self.meters[k].avg:.1f}"
            for k in ("total_loss", "iou_loss", "conf_loss", "cls_loss")
        )
        lr = self.optimizer.param_groups[0]["lr"]
        logger.info(
            f"{progress}, mem: 0Mb, {times}, {loss_str}, lr: {lr:.3e}, "
            f"size: {self.input_size[0]:d}, ETA: {eta}"
        )
        self.meters = {}

    def after_epoch(self) -> None:
        self.save_ckpt(ckpt_name="latest")
        if (self.epoch + 1) % self.args.eval_interval == 0:
            if FAULT == "ez":
                if self.rank == 0:  # evaluate on the main process only
                    self.evaluate_and_save_model()
            else:
                self.evaluate_and_save_model()

    def evaluate_and_save_model(self) -> None:
        evalmodel = self.model.module if self.is_distributed else self.model
        ap50_95, _ap50, summary = self.evaluator.evaluate(evalmodel, self.is_distributed)
        update_best = ap50_95 > self.best_ap
        self.best_ap = max(self.best_ap, ap50_95)
        if self.rank == 0:
            logger.info("\n" + summary)
        synchronize()
        self.save_ckpt("last_epoch", update_best)

    def save_ckpt(self, ckpt_name: str, update_best_ckpt: bool = False) -> None:
        if self.rank != 0:
            return
        logger.info(f"Save weights to {self.file_name}")
        state = {
            "start_epoch": self.epoch + 1,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "best_ap": self.best_ap,
        }
        torch.save(state, os.path.join(self.file_name, f"{ckpt_name}_ckpt.pth"))
        if update_best_ckpt:
            torch.save(state, os.path.join(self.file_name, "best_ckpt.pth"))

    def after_train(self) -> None:
        logger.info(f"Training of experiment is done and the best AP is {self.best_ap * 100:.2f}")


# -----------------------------------------------------------------------------
# tools/train.py


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("YOLOX train parser")
    parser.add_argument("-expn", "--experiment-name", type=str, default="yolox_nano_toy")
    parser.add_argument("--dist-backend", default="gloo", type=str)
    parser.add_argument("--dist-url", default=None, type=str, help="url used to set up dist")
    parser.add_argument("-b", "--batch-size", type=int, default=8, help="batch size")
    parser.add_argument("-d", "--devices", default=None, type=int, help="device for training")
    parser.add_argument("--resume", default=False, action="store_true")
    parser.add_argument("-c", "--ckpt", default=None, type=str, help="checkpoint file")
    parser.add_argument("--num_machines", default=1, type=int, help="num of node for training")
    parser.add_argument("--machine_rank", default=0, type=int, help="node rank for multi-node")
    parser.add_argument("--fp16", dest="fp16", default=False, action="store_true")
    parser.add_argument("--cache", default=False, action="store_true")
    parser.add_argument("-l", "--logger", type=str, default="none", help="tensorboard/wandb")
    parser.add_argument("--output-dir", default="./YOLOX_outputs")
    parser.add_argument("--data-dir", default="datasets/COCO")
    parser.add_argument("--train-ann", default="instances_train.json")
    parser.add_argument("--val-ann", default="instances_val.json")
    parser.add_argument("--max-epoch", type=int, default=2)
    parser.add_argument("--eval-interval", type=int, default=1)
    parser.add_argument("--print-interval", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--conf", type=float, default=0.01)
    parser.add_argument("--nonfinite", choices=("skip", "exit"), default="exit")
    parser.add_argument("--write-toy-data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n-train", type=int, default=48, help=argparse.SUPPRESS)
    return parser


@logger.catch
def main(args: argparse.Namespace) -> None:
    if args.workers > 1:
        warnings.warn(
            f"This DataLoader will create {args.workers * get_world_size()} worker processes in "
            "total. Our suggested max number of worker in current system is 2, which is smaller "
            "than what this DataLoader is going to create.",
            UserWarning,
            stacklevel=1,
        )
    trainer = Trainer(args)
    trainer.train()


if __name__ == "__main__":
    args = make_parser().parse_args()
    if args.write_toy_data:
        write_toy_data(args.write_toy_data, n_train=args.n_train)
        sys.exit(0)
    num_gpu = args.devices if args.devices is not None else 1
    launch(
        main,
        num_gpu,
        args.num_machines,
        args.machine_rank,
        backend=args.dist_backend,
        dist_url=args.dist_url,
        args=(args,),
    )
