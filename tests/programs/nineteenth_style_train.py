"""A nineteenth training-program style for the generalisation fixtures
(tests/fixtures/real/nineteenth-*): a detection training script in the way of torchvision's
`references/` and the DETR / Deformable-DETR / MAE family built on it, raw torch on CPU with gloo.
`init_distributed_mode(args)` from RANK/WORLD_SIZE/LOCAL_RANK or SLURM_PROCID, print() silenced
on every rank but 0 by `setup_for_distributed`, `MetricLogger` / `SmoothedValue` progress lines
and their `synchronize_between_processes()` (a barrier and an all_reduce on every rank),
`reduce_dict`, a COCO-style annotation file and per-image files under --coco_path, a tiny
set-prediction model with a greedy matcher, `save_on_master` checkpoints and `log.txt`, `--resume`
with `torch.load(map_location="cpu")`, and a BackgroundGenerator loader as many detection repos
wrap their DataLoader. Most faults live in what a run is given (data, checkpoints, launch
environment, prepared by tests/fixtures/real/capture_nineteenth.sh); the few in the code are
chosen by the NINETEENTH_FAULT environment variable, never printed. `--make_synthetic_coco DIR`
writes the data set.
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import datetime
import fcntl
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import warnings
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

FAULT = os.environ.get("NINETEENTH_FAULT", "")
SIDE = 32
NUM_TRAIN = 26
NUM_VAL = 10


# ---------------------------------------------------------------- util/misc.py
class SmoothedValue:
    """Track a series of values and provide access to smoothed values over a window or the
    global series average."""

    def __init__(self, window_size: int = 20, fmt: str | None = None) -> None:
        if fmt is None:
            fmt = "{median:.4f} ({global_avg:.4f})"
        self.deque: deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt

    def update(self, value: float, n: int = 1) -> None:
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self) -> None:
        """Warning: does not synchronize the deque!"""
        if not is_dist_avail_and_initialized():
            return
        t = torch.tensor([self.count, self.total], dtype=torch.float64)
        dist.barrier()
        dist.all_reduce(t)
        t_list = t.tolist()
        self.count = int(t_list[0])
        self.total = t_list[1]

    @property
    def median(self) -> float:
        return float(torch.tensor(list(self.deque)).median().item())

    @property
    def avg(self) -> float:
        return float(torch.tensor(list(self.deque), dtype=torch.float32).mean().item())

    @property
    def global_avg(self) -> float:
        return self.total / self.count

    @property
    def max(self) -> float:
        return max(self.deque)

    @property
    def value(self) -> float:
        return self.deque[-1]

    def __str__(self) -> str:
        return self.fmt.format(
            median=self.median,
            avg=self.avg,
            global_avg=self.global_avg,
            max=self.max,
            value=self.value,
        )


def all_gather(data: Any) -> list[Any]:
    """Run all_gather on arbitrary picklable data."""
    world_size = get_world_size()
    if world_size == 1:
        return [data]
    data_list: list[Any] = [None] * world_size
    dist.all_gather_object(data_list, data)
    return data_list


def reduce_dict(input_dict: dict[str, torch.Tensor], average: bool = True) -> dict[str, Any]:
    """Reduce the values in the dictionary from all processes so that all processes have the
    averaged results."""
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k] for k in names], dim=0)
        dist.all_reduce(values)
        if average:
            values /= world_size
        return dict(zip(names, values, strict=True))


class MetricLogger:
    def __init__(self, delimiter: str = "\t") -> None:
        self.meters: defaultdict[str, SmoothedValue] = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].update(float(v))

    def __str__(self) -> str:
        return self.delimiter.join(f"{name}: {meter}" for name, meter in self.meters.items())

    def synchronize_between_processes(self) -> None:
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def add_meter(self, name: str, meter: SmoothedValue) -> None:
        self.meters[name] = meter

    def log_every(self, iterable: Any, print_freq: int, header: str = "") -> Iterator[Any]:
        start_time = time.time()
        end = time.time()
        iter_time = SmoothedValue(fmt="{avg:.4f}")
        data_time = SmoothedValue(fmt="{avg:.4f}")
        space_fmt = ":" + str(len(str(len(iterable)))) + "d"
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
            if i % print_freq == 0 or i == len(iterable) - 1:
                eta_seconds = iter_time.global_avg * (len(iterable) - i)
                eta_string = str(datetime.timedelta(seconds=int(eta_seconds)))
                print(
                    log_msg.format(
                        i,
                        len(iterable),
                        eta=eta_string,
                        meters=str(self),
                        time=str(iter_time),
                        data=str(data_time),
                        memory=0,
                    )
                )
            end = time.time()
        total_time = time.time() - start_time
        total_time_str = str(datetime.timedelta(seconds=int(total_time)))
        print(f"{header} Total time: {total_time_str} ({total_time / len(iterable):.4f} s / it)")


def setup_for_distributed(is_master: bool) -> None:
    """This function disables printing when not in master process."""
    builtin_print = builtins.print

    def print(*args: Any, **kwargs: Any) -> None:
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    return dist.get_world_size() if is_dist_avail_and_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process() -> bool:
    return get_rank() == 0


def save_on_master(obj: Any, path: Path) -> None:
    if is_main_process():
        torch.save(obj, path)


def init_distributed_mode(args: argparse.Namespace) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.world_size = int(os.environ["SLURM_NTASKS"])
        args.gpu = int(os.environ.get("SLURM_LOCALID", "0"))
    else:
        print("Not using distributed mode")
        args.distributed = False
        args.rank, args.world_size, args.gpu = 0, 1, 0
        return
    args.distributed = True
    args.dist_backend = "gloo"
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(
        backend=args.dist_backend,
        init_method=args.dist_url,
        world_size=args.world_size,
        rank=args.rank,
        timeout=datetime.timedelta(seconds=args.dist_timeout),
    )
    dist.barrier()
    setup_for_distributed(args.rank == 0)


# ---------------------------------------------------------------- datasets/coco.py
class FileLock:
    """filelock's FileLock: an fcntl lock with a timeout (-1 waits for ever)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self.fh: Any = None

    def __enter__(self) -> FileLock:
        self.fh = open(self.path, "a")
        deadline = time.time() + self.timeout
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if self.timeout >= 0 and time.time() > deadline:
                    self.fh.close()
                    raise TimeoutError(
                        f"The file lock '{self.path}' could not be acquired."
                    ) from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


class CocoDetection(Dataset[tuple[torch.Tensor, dict[str, torch.Tensor]]]):
    """COCO-style: an annotation file and one raw 3xSIDExSIDE uint8 file per image; targets are
    normalised cxcywh boxes and labels, as DETR's ConvertCocoPolysToMask + Normalize give."""

    def __init__(self, img_folder: Path, ann_file: Path, cache_file: Path | None) -> None:
        self.img_folder = img_folder
        if cache_file is not None:
            coco = self._cached(ann_file, cache_file)
        else:
            with open(ann_file) as f:
                coco = json.load(f)
        self.images = sorted(coco["images"], key=lambda im: im["id"])
        self.anns: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for ann in coco["annotations"]:
            self.anns[ann["image_id"]].append(ann)
        self.cache: dict[int, torch.Tensor] = {}

    @staticmethod
    def _cached(ann_file: Path, cache_file: Path) -> dict[str, Any]:
        """The filtered index is built once per node, under a lock: local rank 0 builds it and
        may wait as long as it takes; the others give up after a while."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        with FileLock(str(cache_file) + ".lock", -1 if local_rank == 0 else 3):
            if not cache_file.exists():
                with open(ann_file) as f:
                    coco = json.load(f)
                coco["annotations"] = [a for a in coco["annotations"] if a["bbox"][2] > 0]
                tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(coco))
                os.replace(tmp, cache_file)
            with open(cache_file) as f:
                return dict(json.load(f))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        info = self.images[idx]
        raw = (self.img_folder / info["file_name"]).read_bytes()
        img = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        img = img.view(3, info["height"], info["width"]).float() / 255.0
        img = (img - 0.45) / 0.225
        if FAULT == "rk" and get_rank() == get_world_size() - 1:
            # cache_mode keeps each decoded image, here at the size of a real one
            self.cache[idx] = torch.ones(64 << 18)
            if len(self.cache) >= 3:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        w, h = float(info["width"]), float(info["height"])
        boxes = torch.tensor([a["bbox"] for a in self.anns[info["id"]]], dtype=torch.float32)
        boxes = boxes.reshape(-1, 4)
        cxcywh = torch.stack(
            [
                (boxes[:, 0] + boxes[:, 2] / 2) / w,
                (boxes[:, 1] + boxes[:, 3] / 2) / h,
                boxes[:, 2] / w,
                boxes[:, 3] / h,
            ],
            dim=-1,
        )
        labels = torch.tensor([a["category_id"] for a in self.anns[info["id"]]], dtype=torch.int64)
        return img, {"boxes": cxcywh, "labels": labels, "image_id": torch.tensor(info["id"])}


def build_dataset(image_set: str, args: argparse.Namespace) -> CocoDetection:
    root = Path(args.coco_path)
    if not root.exists():
        raise FileNotFoundError(f"provided COCO path {root} does not exist")
    ann = root / "annotations" / f"instances_{image_set}2017.json"
    cache = root / "annotations" / f"index_{image_set}2017.json" if image_set == "train" else None
    return CocoDetection(root / f"{image_set}2017", ann, cache)


def make_synthetic_coco(root: Path, num_classes: int) -> None:
    """Writes a tiny seeded COCO-style set: images with 1-3 boxes each."""
    rng = random.Random(7)
    for split, n, first in (("train", NUM_TRAIN, 1), ("val", NUM_VAL, 1001)):
        (root / f"{split}2017").mkdir(parents=True, exist_ok=True)
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        images, anns = [], []
        for image_id in range(first, first + n):
            name = f"{image_id:012d}.raw"
            img = torch.randint(0, 256, (3, SIDE, SIDE), dtype=torch.uint8)
            for _ in range(rng.randint(1, 3)):
                x, y = rng.randint(0, SIDE - 9), rng.randint(0, SIDE - 9)
                bw, bh = rng.randint(4, 8), rng.randint(4, 8)
                cat = rng.randint(1, num_classes)
                img[cat % 3, y : y + bh, x : x + bw] = 255
                anns.append(
                    {
                        "id": len(anns) + 1,
                        "image_id": image_id,
                        "bbox": [x, y, bw, bh],
                        "area": bw * bh,
                        "category_id": cat,
                        "iscrowd": 0,
                    }
                )
            (root / f"{split}2017" / name).write_bytes(bytes(img.flatten().tolist()))
            images.append({"id": image_id, "file_name": name, "width": SIDE, "height": SIDE})
        cats = [{"id": c, "name": f"class{c}"} for c in range(1, num_classes + 1)]
        coco = {"images": images, "annotations": anns, "categories": cats}
        (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(coco))


def collate_fn(batch: list[Any]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    imgs, targets = zip(*batch, strict=True)
    return torch.stack(imgs), list(targets)


class BackgroundGenerator(threading.Thread):
    """prefetch_generator's BackgroundGenerator: a thread fills a queue from the loader."""

    def __init__(self, generator: Iterable[Any], max_prefetch: int = 2) -> None:
        super().__init__(daemon=True)
        self.queue: queue.Queue[Any] = queue.Queue(max_prefetch)
        self.generator = generator
        self.start()

    def run(self) -> None:
        for item in self.generator:
            self.queue.put(item)
        self.queue.put(None)

    def __next__(self) -> Any:
        next_item = self.queue.get()
        if next_item is None:
            raise StopIteration
        return next_item

    def __iter__(self) -> BackgroundGenerator:
        return self


class DataLoaderX(DataLoader[Any]):
    def __iter__(self) -> Any:
        return BackgroundGenerator(super().__iter__())


class ShardSampler(Sampler[int]):
    """Every image exactly once per epoch: rank r takes indices[r::world], no padding."""

    def __init__(self, n: int, num_replicas: int, rank: int, seed: int) -> None:
        self.n, self.num_replicas, self.rank, self.seed, self.epoch = n, num_replicas, rank, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist()[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))


# ---------------------------------------------------------------- models/detr.py
class DETR(nn.Module):
    """A set-prediction detector, tiny: a conv backbone, then per-query class logits and boxes."""

    def __init__(self, num_classes: int, num_queries: int) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU()
        )
        self.query_embed = nn.Embedding(num_queries, 32)
        self.class_embed = nn.Linear(32, num_classes + 1)
        self.bbox_embed = nn.Linear(32, 4)

    def forward(self, samples: torch.Tensor) -> dict[str, torch.Tensor]:
        if FAULT == "w":
            ys, xs = torch.meshgrid(torch.arange(8), torch.arange(8))  # the sine position
            del ys, xs  # embedding's grid, as older code builds it
        feats = self.backbone(samples).flatten(2).mean(-1)  # (B, 32)
        hs = feats[:, None, :] + self.query_embed.weight[None]  # (B, Q, 32)
        return {"pred_logits": self.class_embed(hs), "pred_boxes": self.bbox_embed(hs).sigmoid()}


class SetCriterion(nn.Module):
    """Greedy matching (each target takes its nearest query by box L1), then classification
    over all queries (unmatched ones are 'no object') and L1 on the matched boxes."""

    def __init__(self, num_classes: int, eos_coef: float) -> None:
        super().__init__()
        self.num_classes = num_classes
        weight = torch.ones(num_classes + 1)
        weight[-1] = eos_coef
        self.register_buffer("empty_weight", weight)

    def forward(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64)
        l1 = []
        for i, t in enumerate(targets):
            cost = torch.cdist(boxes[i].detach(), t["boxes"], p=1)  # (Q, T)
            nearest = cost.min(dim=1).values  # how far each query is from any target
            order = torch.argsort(nearest)[: len(t["labels"])]
            target_classes[i, order] = t["labels"]
            l1.append(F.l1_loss(boxes[i, order], t["boxes"], reduction="sum"))
        num_boxes = max(sum(len(t["labels"]) for t in targets), 1)
        loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, self.empty_weight)
        return {"loss_ce": loss_ce, "loss_bbox": torch.stack(l1).sum() / num_boxes}


# ---------------------------------------------------------------- engine.py
def train_one_epoch(
    model: nn.Module,
    criterion: SetCriterion,
    data_loader: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    epoch: int,
    max_norm: float,
) -> dict[str, float]:
    model.train()
    weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0}
    metric_logger = MetricLogger(delimiter="  ")
    metric_logger.add_meter("lr", SmoothedValue(window_size=1, fmt="{value:.6f}"))
    header = f"Epoch: [{epoch}]"
    for samples, targets in metric_logger.log_every(data_loader, 2, header):
        outputs = model(samples)
        loss_dict = criterion(outputs, targets)
        losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict)
        assert isinstance(losses, torch.Tensor)
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            print(loss_dict)
            sys.exit(1)
        optimizer.zero_grad()
        losses.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        loss_dict_reduced = reduce_dict(loss_dict)
        reduced = sum(loss_dict_reduced[k] * weight_dict[k] for k in loss_dict_reduced)
        metric_logger.update(loss=reduced, **loss_dict_reduced)
        metric_logger.update(lr=optimizer.param_groups[0]["lr"])
    # gather the stats from all processes
    if FAULT == "sm":
        if is_main_process():  # the averaged stats are only printed there anyway
            metric_logger.synchronize_between_processes()
    else:
        metric_logger.synchronize_between_processes()
    print("Averaged stats:", metric_logger)
    return {k: meter.global_avg for k, meter in metric_logger.meters.items()}


class CocoEvaluator:
    """Counts, per image, the targets whose class a matched query predicts; merged across ranks
    like pycocotools' evalImgs, summarised as AP lines."""

    def __init__(self) -> None:
        self.hits: dict[int, tuple[int, int]] = {}

    def update(self, outputs: dict[str, torch.Tensor], targets: list[dict[str, Any]]) -> None:
        pred = outputs["pred_logits"].argmax(-1)
        for i, t in enumerate(targets):
            got = sum(int((pred[i] == lab).any()) for lab in t["labels"].tolist())
            self.hits[int(t["image_id"])] = (got, len(t["labels"]))

    def synchronize_between_processes(self) -> None:
        merged: dict[int, tuple[int, int]] = {}
        for part in all_gather(self.hits):
            merged.update(part)
        self.hits = merged

    def summarize(self) -> float:
        got = sum(g for g, _ in self.hits.values())
        total = sum(n for _, n in self.hits.values())
        ap = got / max(total, 1)
        print("IoU metric: bbox")
        for iou, area in (
            ("0.50:0.95", "   all"),
            ("0.50     ", "   all"),
            ("0.75     ", "   all"),
        ):
            print(
                f" Average Precision  (AP) @[ IoU={iou} | area={area} | maxDets=100 ] = "
                f"{ap * (0.5 if iou.startswith('0.75') else 1):.3f}"
            )
        return ap


@torch.no_grad()
def evaluate(
    model: nn.Module, criterion: SetCriterion, data_loader: DataLoader[Any]
) -> dict[str, float]:
    model.eval()
    weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0}
    metric_logger = MetricLogger(delimiter="  ")
    header = "Test:"
    evaluator = CocoEvaluator()
    for samples, targets in metric_logger.log_every(data_loader, 4, header):
        outputs = model(samples)
        loss_dict = criterion(outputs, targets)
        loss_dict_reduced = reduce_dict(loss_dict)
        reduced = sum(loss_dict_reduced[k] * weight_dict[k] for k in loss_dict_reduced)
        metric_logger.update(loss=reduced, **loss_dict_reduced)
        evaluator.update(outputs, targets)
    metric_logger.synchronize_between_processes()
    print("Averaged stats:", metric_logger)
    evaluator.synchronize_between_processes()
    stats = {k: meter.global_avg for k, meter in metric_logger.meters.items()}
    stats["coco_eval_bbox"] = evaluator.summarize()
    return stats


@torch.no_grad()
def evaluate_main(model: nn.Module, data_loader: DataLoader[Any]) -> dict[str, float]:
    """The quick evaluation on the main process: precision of the confident detections."""
    model.eval()
    tp = detections = 0
    for samples, targets in data_loader:
        probs = model(samples)["pred_logits"].softmax(-1)[..., :-1]
        scores, labels = probs.max(-1)
        keep = scores > 0.7
        detections += int(keep.sum())
        for i, t in enumerate(targets):
            tp += sum(int(lab in t["labels"].tolist()) for lab in labels[i][keep[i]].tolist())
    precision = tp / detections
    print(f"precision@0.7: {precision:.3f}")
    return {"precision": precision}


def write_visualisations(path: Path) -> None:
    """Rank 0 draws the predictions with a native image writer (a C call through ctypes)."""
    path.mkdir(exist_ok=True)
    if FAULT == "sv":
        ctypes.string_at(0)  # the writer's buffer pointer is NULL: SIGSEGV


# ---------------------------------------------------------------- main.py
def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("Set transformer detector", add_help=False)
    parser.add_argument("--lr", default=1e-4, type=float)
    parser.add_argument("--lr_backbone", default=1e-5, type=float)
    parser.add_argument("--batch_size", default=2, type=int)
    parser.add_argument("--weight_decay", default=1e-4, type=float)
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--lr_drop", default=200, type=int)
    parser.add_argument("--clip_max_norm", default=0.1, type=float)
    parser.add_argument("--num_queries", default=4, type=int)
    parser.add_argument("--num_classes", default=5, type=int)
    parser.add_argument("--eos_coef", default=0.1, type=float)
    parser.add_argument("--dataset_file", default="coco")
    parser.add_argument("--coco_path", type=str)
    parser.add_argument("--output_dir", default="", help="path where to save, empty for no saving")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", default=42, type=int)
    parser.add_argument("--resume", default="", help="resume from checkpoint")
    parser.add_argument("--start_epoch", default=0, type=int, metavar="N")
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--num_workers", default=0, type=int)
    parser.add_argument("--world_size", default=1, type=int)
    parser.add_argument("--dist_url", default="env://")
    parser.add_argument("--dist_timeout", default=15, type=int)
    parser.add_argument("--make_synthetic_coco", default="", help=argparse.SUPPRESS)
    return parser


def main(args: argparse.Namespace) -> None:
    init_distributed_mode(args)
    print(args)
    device = torch.device(args.device)
    seed = args.seed + get_rank()
    torch.manual_seed(seed)
    random.seed(seed)

    model = DETR(args.num_classes, args.num_queries)
    criterion = SetCriterion(args.num_classes, args.eos_coef)
    model.to(device)
    model_without_ddp = model
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=FAULT == "w")
        model_without_ddp = model.module
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print("number of params:", n_parameters)

    param_dicts = [
        {"params": [p for n, p in model_without_ddp.named_parameters() if "backbone" not in n]},
        {
            "params": [p for n, p in model_without_ddp.named_parameters() if "backbone" in n],
            "lr": args.lr_backbone,
        },
    ]
    optimizer = torch.optim.AdamW(param_dicts, lr=args.lr, weight_decay=args.weight_decay)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)
    if FAULT == "w":
        lr_scheduler.step()  # the warmup scheduler is stepped once before training

    dataset_train = build_dataset("train", args)
    dataset_val = build_dataset("val", args)
    sampler_train: Sampler[int]
    if args.distributed and FAULT == "us":
        sampler_train = ShardSampler(len(dataset_train), args.world_size, args.rank, args.seed)
    elif args.distributed:
        sampler_train = DistributedSampler(dataset_train, seed=args.seed)
    else:
        sampler_train = torch.utils.data.RandomSampler(dataset_train)
    if args.distributed:
        sampler_val: Sampler[int] = DistributedSampler(dataset_val, shuffle=False)
    else:
        sampler_val = torch.utils.data.SequentialSampler(dataset_val)
    batch_sampler_train = BatchSampler(sampler_train, args.batch_size, drop_last=True)
    data_loader_train = DataLoaderX(
        dataset_train,
        batch_sampler=batch_sampler_train,
        collate_fn=collate_fn,
        num_workers=args.num_workers,
    )
    data_loader_val = DataLoader(
        dataset_val,
        args.batch_size,
        sampler=sampler_val,
        drop_last=False,
        collate_fn=collate_fn,
        num_workers=args.num_workers,
    )

    output_dir = Path(args.output_dir)
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=False)
        model_without_ddp.load_state_dict(checkpoint["model"])
        if "optimizer" in checkpoint and "lr_scheduler" in checkpoint and "epoch" in checkpoint:
            optimizer.load_state_dict(checkpoint["optimizer"])
            lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
            args.start_epoch = checkpoint["epoch"] + 1

    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            sampler_train.set_epoch(epoch)  # type: ignore[attr-defined]
        train_stats = train_one_epoch(
            model, criterion, data_loader_train, optimizer, epoch, args.clip_max_norm
        )
        lr_scheduler.step()
        if args.output_dir:
            checkpoint_paths = [output_dir / "checkpoint.pth"]
            if (epoch + 1) % args.lr_drop == 0 or (epoch + 1) % 100 == 0:
                checkpoint_paths.append(output_dir / f"checkpoint{epoch:04}.pth")
            for checkpoint_path in checkpoint_paths:
                save_on_master(
                    {
                        "model": model_without_ddp.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(),
                        "epoch": epoch,
                        "args": args,
                    },
                    checkpoint_path,
                )

        if FAULT == "em":
            test_stats: dict[str, float] = {}
            if is_main_process():  # all of the validation set, on one process
                loader = DataLoader(dataset_val, args.batch_size, collate_fn=collate_fn)
                test_stats = evaluate_main(model_without_ddp, loader)
        else:
            test_stats = evaluate(model, criterion, data_loader_val)
        if is_main_process():
            write_visualisations(output_dir / "vis")

        log_stats = {
            **{f"train_{k}": v for k, v in train_stats.items()},
            **{f"test_{k}": v for k, v in test_stats.items()},
            "epoch": epoch,
            "n_parameters": n_parameters,
        }
        if args.output_dir and is_main_process():
            with (output_dir / "log.txt").open("a") as f:
                f.write(json.dumps(log_stats) + "\n")

    total_time = time.time() - start_time
    total_time_str = str(datetime.timedelta(seconds=int(total_time)))
    print(f"Training time {total_time_str}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        "DETR training and evaluation script", parents=[get_args_parser()]
    )
    args = parser.parse_args()
    if args.make_synthetic_coco:
        make_synthetic_coco(Path(args.make_synthetic_coco), args.num_classes)
        sys.exit(0)
    if args.output_dir:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("default")
    main(args)
