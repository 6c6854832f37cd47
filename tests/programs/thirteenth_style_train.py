"""A thirteenth training-program style for the generalisation fixtures
(tests/fixtures/real/thirteenth-*): research detection code in the way of detectron2 / mmengine,
raw torch on CPU with gloo. A `launch()` helper that uses torch.multiprocessing.spawn under plain
python (tcp:// init, `--num-machines/--machine-rank/--dist-url` for several machines) and calls
main directly under torchrun; `comm` helpers (synchronize, all_gather of objects, reduce_dict);
detectron2's logger set-up (rank 0 console at INFO, the others at WARNING, `log.txt` and
`log.txt.rank<N>` in the output dir); an EventStorage and a hook-based trainer (PeriodicWriter's
` eta: ... iter: ... total_loss: ...` lines, PeriodicCheckpointer with `last_checkpoint`, an
evaluation hook gathering predictions to rank 0, an LR scheduler hook, a stop-file hook); an
infinite TrainingSampler sharded by rank, an InferenceSampler with uneven shards, a JSON config
merged with `KEY VALUE` opts, and `--resume` from `last_checkpoint`. A fault is named by what it
does, never by the mode, and the mode is never printed (tests/fixtures/real/capture_thirteenth.sh:
re-capture after any edit).
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import itertools
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    loud: bool = False  # the usual scary warnings of such a codebase
    fat_preds_rank: int = -1  # this rank's evaluator keeps full-size mask logits in its results
    sync_each_eval_image: bool = False  # the evaluator synchronizes after every image
    bad_size_rank: int = -1  # the image this rank reads at iteration 5 has a wrong width
    inf_image_rank: int = -1  # the image this rank reads at iteration 6 decodes to inf
    leak_kill_rank: int = -1  # this rank's mapper cache grows until the OOM killer takes it
    worker_kill_rank: int = -1  # a DataLoader worker of this rank is killed at iteration 6
    sync_in_main_save: bool = False  # the checkpointer synchronizes inside is_main_process()
    voted_stop: bool = False  # the stop-file hook's decision is all-reduced


MODES: dict[str, Fault] = {
    "plain": Fault(),
    "warn-fine": Fault(loud=True),
    "eval-finish": Fault(),
    "fat-gather": Fault(fat_preds_rank=1),
    "uneven-eval-sync": Fault(sync_each_eval_image=True),
    "loss-key-skew": Fault(),
    "bad-anno": Fault(bad_size_rank=2),
    "full-rank-log": Fault(),
    "ckpt-other-node": Fault(),
    "inf-batch": Fault(inf_image_rank=3),
    "mask-head-idle": Fault(),
    "grow-kill": Fault(leak_kill_rank=1),
    "loader-child-kill": Fault(worker_kill_rank=1),
    "empty-eval-shard": Fault(),
    "addr-held": Fault(),
    "all-crowd": Fault(),
    "ckpt-sync-main": Fault(sync_in_main_save=True),
    "local-halt": Fault(),
    "voted-halt": Fault(voted_stop=True),
}

# -----------------------------------------------------------------------------
# comm: the process-group helpers every such codebase has (detectron2.utils.comm)


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    """A barrier among all processes (a no-op with one)."""
    if get_world_size() > 1:
        dist.barrier()


def all_gather(data: Any) -> list[Any]:
    """Every rank's picklable object, on every rank."""
    if get_world_size() == 1:
        return [data]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, data)
    return out


def reduce_dict(input_dict: dict[str, torch.Tensor], average: bool = True) -> dict[str, Any]:
    """Losses reduced to rank 0 (sorted keys, one stacked tensor): for logging only."""
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k].detach() for k in names], dim=0)
        dist.reduce(values, dst=0)
        if get_rank() == 0 and average:
            values /= world_size
        return dict(zip(names, values, strict=True))


# -----------------------------------------------------------------------------
# launch: mp.spawn under plain python, a direct call under torchrun (detectron2.engine.launch)

DEFAULT_TIMEOUT = datetime.timedelta(seconds=15)


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: tuple[Any, ...] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group(backend="gloo", timeout=timeout)
        _create_local_group(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        synchronize()
        main_func(*args)
        return
    world_size = num_machines * num_gpus_per_machine
    if world_size > 1:
        if dist_url == "auto":
            assert num_machines == 1, "dist_url=auto not supported in multi-machine jobs."
            dist_url = f"tcp://127.0.0.1:{_find_free_port()}"
        mp.start_processes(
            _distributed_worker,
            nprocs=num_gpus_per_machine,
            args=(
                main_func,
                world_size,
                num_gpus_per_machine,
                machine_rank,
                dist_url,
                args,
                timeout,
            ),
            daemon=False,
            start_method="spawn",
        )
    else:
        main_func(*args)


def _find_free_port() -> int:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


_LOCAL_PROCESS_GROUP: Any = None


def _create_local_group(num_per_machine: int) -> None:
    global _LOCAL_PROCESS_GROUP
    world = get_world_size()
    for i in range(world // max(num_per_machine, 1)):
        ranks = list(range(i * num_per_machine, (i + 1) * num_per_machine))
        pg = dist.new_group(ranks)
        if get_rank() in ranks:
            _LOCAL_PROCESS_GROUP = pg


def _distributed_worker(
    local_rank: int,
    main_func: Callable[..., Any],
    world_size: int,
    num_gpus_per_machine: int,
    machine_rank: int,
    dist_url: str,
    args: tuple[Any, ...],
    timeout: datetime.timedelta,
) -> None:
    global_rank = machine_rank * num_gpus_per_machine + local_rank
    try:
        dist.init_process_group(
            backend="gloo",
            init_method=dist_url,
            world_size=world_size,
            rank=global_rank,
            timeout=timeout,
        )
    except Exception as e:
        logger = logging.getLogger(__name__)
        logger.error(f"Process group URL: {dist_url}")
        raise e
    _create_local_group(num_gpus_per_machine)
    # a barrier right after init avoids a possible timeout in the first collective
    synchronize()
    main_func(*args)


# -----------------------------------------------------------------------------
# logger: detectron2.utils.logger.setup_logger


class _ColorfulFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        log = super().formatMessage(record)
        if record.levelno == logging.WARNING:
            prefix = "WRN"
        elif record.levelno in (logging.ERROR, logging.CRITICAL):
            prefix = "ERROR"
        else:
            return log
        return prefix + " " + log


def setup_logger(output: str | None, distributed_rank: int = 0, name: str = "d2") -> logging.Logger:
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    plain = logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s", "%m/%d %H:%M:%S")
    ch = logging.StreamHandler(stream=sys.stdout)
    ch.setLevel(logging.DEBUG if distributed_rank == 0 else logging.WARNING)
    ch.setFormatter(_ColorfulFormatter("[%(asctime)s %(name)s]: %(message)s", "%m/%d %H:%M:%S"))
    logger.addHandler(ch)
    if output is not None:
        filename = os.path.join(output, "log.txt")
        if distributed_rank > 0:
            filename = filename + f".rank{distributed_rank}"
        os.makedirs(os.path.dirname(filename), exist_ok=True)
        fh = logging.StreamHandler(open(filename, "a"))  # noqa: SIM115 (lives as long as the process)
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(plain)
        logger.addHandler(fh)
    return logger


# -----------------------------------------------------------------------------
# config: a yacs-like CfgNode from a JSON file and KEY VALUE opts


class CfgNode(dict[str, Any]):
    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def merge_from_file(self, path: str) -> None:
        with open(path) as f:
            self._merge(json.load(f), [])

    def _merge(self, other: dict[str, Any], prefix: list[str]) -> None:
        for k, v in other.items():
            full = ".".join([*prefix, k])
            if k not in self:
                raise KeyError(f"Non-existent config key: {full}")
            if isinstance(self[k], CfgNode):
                self[k]._merge(v, [*prefix, k])
            else:
                self[k] = v

    def merge_from_list(self, opts: list[str]) -> None:
        assert len(opts) % 2 == 0, (
            f"Override list has odd length: {opts}; it must be a list of pairs"
        )
        for full_key, raw in zip(opts[0::2], opts[1::2], strict=True):
            node: CfgNode = self
            *path, last = full_key.split(".")
            for p in path:
                node = node[p]
            if last not in node:
                raise KeyError(f"Non-existent config key: {full_key}")
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
            node[last] = value

    def dump(self) -> str:
        return json.dumps(self, indent=2, sort_keys=True)


def _node(**kw: Any) -> CfgNode:
    n = CfgNode()
    for k, v in kw.items():
        n[k] = v
    return n


def get_cfg() -> CfgNode:
    return _node(
        MODEL=_node(NUM_CLASSES=4, DDP_FIND_UNUSED=False, MASK_HEAD_START_ITER=0),
        DATASETS=_node(TRAIN=["toy_train"], TEST=["toy_val"], ROOT=""),
        DATALOADER=_node(NUM_WORKERS=0, FILTER_EMPTY_ANNOTATIONS=True, ONE_DATASET_PER_RANK=False),
        SOLVER=_node(
            IMS_PER_BATCH=4,
            BASE_LR=0.01,
            MAX_ITER=20,
            STEPS=[15],
            GAMMA=0.1,
            WARMUP_ITERS=5,
            CHECKPOINT_PERIOD=10,
        ),
        TEST=_node(EVAL_PERIOD=0, VAL_IMAGES=8),
        OUTPUT_DIR="./output",
        SEED=7,
    )


# -----------------------------------------------------------------------------
# data: a toy detection dataset from JSON annotations, a mapper, samplers, a grouped loader

IMG_FEAT = 16


def write_toy_data(root: str, n_train: int = 64, n_val: int = 8) -> None:
    """The annotation files a `prepare_*.py` script would write (COCO-like records)."""
    os.makedirs(root, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("toy_train", n_train), ("toy_val", n_val), ("toy_boxes", n_train)):
        images = []
        for i in range(n):
            h, w = (480, 640) if i % 2 == 0 else (640, 480)
            anns = []
            for _ in range(1 + i % 3):
                x, y = torch.randint(0, 200, (2,), generator=g).tolist()
                ann: dict[str, Any] = {
                    "bbox": [x, y, 60 + i, 40 + i],
                    "category_id": int(torch.randint(0, 4, (1,), generator=g)),
                    "iscrowd": 0,
                }
                if split != "toy_boxes":
                    ann["segmentation"] = [[x, y, x + 60, y, x + 60, y + 40]]
                anns.append(ann)
            images.append(
                {
                    "file_name": f"{split}/{i:06d}.jpg",
                    "image_id": i,
                    "height": h,
                    "width": w,
                    "annotations": anns,
                }
            )
        with open(os.path.join(root, f"{split}.json"), "w") as f:
            json.dump(images, f)


def load_dataset(root: str, name: str) -> list[dict[str, Any]]:
    path = os.path.join(root, f"{name}.json")
    with open(path) as f:
        dicts: list[dict[str, Any]] = json.load(f)
    logging.getLogger("d2.data.datasets").info(f"Loaded {len(dicts)} images from {path}")
    return dicts


def filter_images_with_only_crowd_annotations(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    num_before = len(dicts)
    dicts = [d for d in dicts if any(a.get("iscrowd", 0) == 0 for a in d["annotations"])]
    logging.getLogger("d2.data.build").info(
        f"Removed {num_before - len(dicts)} images with no usable annotations. {len(dicts)} images left."
    )
    return dicts


class SizeMismatchError(ValueError):
    """The image's size differs from the one in its annotation."""


def read_image(d: dict[str, Any], corrupt: set[int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """A deterministic stand-in for decoding the file: features and (height, width)."""
    g = torch.Generator().manual_seed(1000 + d["image_id"] * 7 + len(d["file_name"]))
    feat = torch.randn(IMG_FEAT, generator=g)
    if d["image_id"] in corrupt:
        feat[3] = float("inf")
    return feat, ((480, 640) if d["image_id"] % 2 == 0 else (640, 480))


def check_image_size(d: dict[str, Any], hw: tuple[int, int]) -> None:
    expected_hw = (d["height"], d["width"])
    if hw != expected_hw:
        raise SizeMismatchError(
            "Mismatched image shape{}, got {}, expect {}.".format(
                " for image " + d["file_name"], hw, expected_hw
            )
            + " Please check the width/height in your annotation."
        )


class DatasetMapper:
    """Reads the image of a record and turns its annotations into training targets."""

    def __init__(self, is_train: bool, corrupt: set[int], leak_kill: bool) -> None:
        self.is_train, self.corrupt, self.leak_kill = is_train, corrupt, leak_kill
        self._cache: list[bytearray] = []
        self.calls = 0

    def __call__(self, d: dict[str, Any]) -> dict[str, Any]:
        d = copy.deepcopy(d)
        image, hw = read_image(d, self.corrupt)
        check_image_size(d, hw)
        self.calls += 1
        if self.leak_kill:  # decoded images kept "for speed", never freed
            self._cache.append(bytearray(8 << 20))
            if self.calls >= 30:  # the cgroup's limit: the OOM killer sends SIGKILL
                os.kill(os.getpid(), signal.SIGKILL)
        anns = [a for a in d.pop("annotations") if a.get("iscrowd", 0) == 0]
        a = anns[0]
        out = {
            "image": image,
            "image_id": d["image_id"],
            "height": d["height"],
            "width": d["width"],
            "gt_classes": torch.tensor(a["category_id"]),
            "gt_boxes": torch.tensor(a["bbox"], dtype=torch.float32) / 640.0,
        }
        if "segmentation" in a:
            out["gt_masks"] = torch.tensor(float(len(a["segmentation"][0]) > 4))
        return out


class TrainingSampler:
    """An infinite stream of shuffled indices; each rank takes every world_size-th one."""

    def __init__(self, size: int, shuffle: bool = True, seed: int = 0) -> None:
        self._size, self._shuffle, self._seed = size, shuffle, seed
        self._rank, self._world_size = get_rank(), get_world_size()

    def __iter__(self) -> Iterator[int]:
        start = self._rank
        yield from itertools.islice(self._infinite_indices(), start, None, self._world_size)

    def _infinite_indices(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self._seed)
        while True:
            if self._shuffle:
                yield from torch.randperm(self._size, generator=g).tolist()
            else:
                yield from torch.arange(self._size).tolist()


class InferenceSampler:
    """Each rank gets a contiguous shard; the first `total % world` ranks one more."""

    def __init__(self, size: int) -> None:
        rank, world = get_rank(), get_world_size()
        shard, left = size // world, size % world
        sizes = [shard + int(r < left) for r in range(world)]
        begin = sum(sizes[:rank])
        self._local_indices = range(begin, begin + sizes[rank])

    def __iter__(self) -> Iterator[int]:
        yield from self._local_indices

    def __len__(self) -> int:
        return len(self._local_indices)


class _MappedStream(IterableDataset[dict[str, Any]]):
    """Records of the sampler's stream through the mapper, split among loader workers."""

    def __init__(
        self, dicts: list[dict[str, Any]], mapper: DatasetMapper, sampler: Any, kill_at: int
    ) -> None:
        self.dicts, self.mapper, self.sampler, self.kill_at = dicts, mapper, sampler, kill_at

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        stream: Iterator[int] = iter(self.sampler)
        if info is not None:
            stream = itertools.islice(stream, info.id, None, info.num_workers)
        for n, idx in enumerate(stream):
            if info is not None and info.id == 0 and n == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            yield self.mapper(self.dicts[idx])


class AspectRatioGroupedDataset(IterableDataset[list[dict[str, Any]]]):
    """Batches of images of the same orientation (w > h or not)."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self._buckets: list[list[dict[str, Any]]] = [[] for _ in range(2)]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        for d in self.dataset:
            bucket = self._buckets[0 if d["width"] > d["height"] else 1]
            bucket.append(d)
            if len(bucket) == self.batch_size:
                data = bucket[:]
                del bucket[:]
                yield data


def _trivial_batch_collator(batch: Any) -> Any:
    return batch


def images_read_by(
    rank: int, world: int, size: int, per_rank: int, iteration: int, seed: int
) -> int:
    """The dataset index `rank` reads first at `iteration` (its sampler's stream, no workers)."""
    stream = itertools.islice(
        TrainingSampler(size, seed=seed)._infinite_indices(), rank, None, world
    )
    return next(itertools.islice(stream, per_rank * iteration, None))


def build_train_loader(
    cfg: CfgNode, fault: Fault
) -> tuple[Iterator[list[dict[str, Any]]], list[dict[str, Any]]]:
    logger = logging.getLogger("d2.data.build")
    names = cfg.DATASETS.TRAIN
    if cfg.DATALOADER.ONE_DATASET_PER_RANK:  # multi-dataset training: a dataset per rank
        names = [names[get_rank() % len(names)]]
    dicts = [d for n in names for d in load_dataset(cfg.DATASETS.ROOT, n)]
    if cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS:
        dicts = filter_images_with_only_crowd_annotations(dicts)
    world, rank = get_world_size(), get_rank()
    per_rank = cfg.SOLVER.IMS_PER_BATCH // world
    corrupt: set[int] = set()
    if rank == fault.bad_size_rank:
        dicts[images_read_by(rank, world, len(dicts), per_rank, 5, cfg.SEED)]["width"] += 17
    if fault.inf_image_rank >= 0:
        i = images_read_by(fault.inf_image_rank, world, len(dicts), per_rank, 6, cfg.SEED)
        corrupt.add(dicts[i]["image_id"])
    mapper = DatasetMapper(True, corrupt, leak_kill=rank == fault.leak_kill_rank)
    sampler = TrainingSampler(len(dicts), seed=cfg.SEED)
    logger.info("Using training sampler TrainingSampler")
    kill_at = 6 * per_rank // 2 if rank == fault.worker_kill_rank else -1
    stream = _MappedStream(dicts, mapper, sampler, kill_at)
    loader = DataLoader(
        stream,
        batch_size=None,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        collate_fn=_trivial_batch_collator,
    )
    return iter(AspectRatioGroupedDataset(loader, per_rank)), dicts


# -----------------------------------------------------------------------------
# model: a tiny "R-CNN" with a class head, a box head and a mask head


class TinyRCNN(nn.Module):
    def __init__(self, cfg: CfgNode, fault: Fault) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(IMG_FEAT, 32), nn.ReLU())
        self.cls_score = nn.Linear(32, cfg.MODEL.NUM_CLASSES)
        self.bbox_pred = nn.Linear(32, 4)
        self.mask_head = nn.Linear(32, 1)
        self.mask_start_iter = cfg.MODEL.MASK_HEAD_START_ITER
        self.fault = fault
        self.register_buffer("pixel_mean", torch.zeros(IMG_FEAT))

    def forward(self, batched_inputs: list[dict[str, Any]]) -> Any:
        x = torch.stack([d["image"] for d in batched_inputs]) - self.pixel_mean
        if self.fault.loud:
            torch.meshgrid(torch.arange(2), torch.arange(2))  # anchors grid, the old way
        f = self.backbone(x)
        logits = self.cls_score(f)
        if not self.training:
            return logits, f
        losses = {
            "loss_cls": F.cross_entropy(
                logits, torch.stack([d["gt_classes"] for d in batched_inputs])
            ),
            "loss_box_reg": F.smooth_l1_loss(
                self.bbox_pred(f), torch.stack([d["gt_boxes"] for d in batched_inputs])
            ),
        }
        storage = get_event_storage()
        if storage.iter >= self.mask_start_iter and all("gt_masks" in d for d in batched_inputs):
            masks = torch.stack([d["gt_masks"] for d in batched_inputs])
            losses["loss_mask"] = F.binary_cross_entropy_with_logits(
                self.mask_head(f).squeeze(1), masks
            )
        return losses


# -----------------------------------------------------------------------------
# events and hooks (detectron2.utils.events, detectron2.engine.hooks)

_CURRENT_STORAGE: list[EventStorage] = []


def get_event_storage() -> EventStorage:
    assert _CURRENT_STORAGE, (
        "get_event_storage() has to be called inside a 'with EventStorage(...)' context!"
    )
    return _CURRENT_STORAGE[-1]


class EventStorage:
    def __init__(self, start_iter: int = 0) -> None:
        self.iter = start_iter
        self._history: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def put_scalar(self, name: str, value: float) -> None:
        self._history[name].append((float(value), self.iter))

    def put_scalars(self, **kwargs: float) -> None:
        for k, v in kwargs.items():
            self.put_scalar(k, v)

    def latest(self, name: str) -> float:
        return self._history[name][-1][0]

    def median(self, name: str, window: int = 20) -> float:
        vals = sorted(v for v, _ in self._history[name][-window:])
        return vals[len(vals) // 2]

    def names(self) -> list[str]:
        return list(self._history)

    def __enter__(self) -> EventStorage:
        _CURRENT_STORAGE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT_STORAGE.pop()


class HookBase:
    trainer: Trainer

    def before_train(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def after_train(self) -> None:
        pass


class LRScheduler(HookBase):
    def __init__(self, optimizer: torch.optim.Optimizer, cfg: CfgNode, loud: bool) -> None:
        def factor(it: int) -> float:
            warm = min(1.0, (it + 1) / cfg.SOLVER.WARMUP_ITERS)
            return warm * cfg.SOLVER.GAMMA ** sum(it >= s for s in cfg.SOLVER.STEPS)

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        self.optimizer, self.loud = optimizer, loud

    def before_train(self) -> None:
        if self.loud:  # a resumed scheduler is stepped to the start iteration before any step
            self.scheduler.step()

    def after_step(self) -> None:
        self.trainer.storage.put_scalar("lr", self.optimizer.param_groups[0]["lr"])
        self.scheduler.step()


class PeriodicCheckpointer(HookBase):
    def __init__(
        self, checkpointer: Checkpointer, period: int, max_iter: int, fault: Fault
    ) -> None:
        self.checkpointer, self.period, self.max_iter, self.fault = (
            checkpointer,
            period,
            max_iter,
            fault,
        )

    def _save(self, name: str) -> None:
        if is_main_process():
            self.checkpointer.save(name, iteration=self.trainer.iter)
            if self.fault.sync_in_main_save:
                synchronize()  # let the other ranks see the file before they go on

    def after_step(self) -> None:
        it = self.trainer.iter
        if (it + 1) % self.period == 0:
            self._save(f"model_{it:07d}")
        if it >= self.max_iter - 1:
            self._save("model_final")


class PeriodicWriter(HookBase):
    """CommonMetricPrinter: one line every `period` iterations, on rank 0."""

    def __init__(self, max_iter: int, period: int = 5) -> None:
        self.max_iter, self.period = max_iter, period
        self.logger = logging.getLogger("d2.utils.events")
        self._last_write: tuple[int, float] | None = None

    def after_step(self) -> None:
        it = self.trainer.iter
        if ((it + 1) % self.period == 0 or it == self.max_iter - 1) and is_main_process():
            self.write()

    def write(self) -> None:
        storage = self.trainer.storage
        it = storage.iter
        iter_time = storage.median("time")
        eta = datetime.timedelta(seconds=int(iter_time * (self.max_iter - it - 1)))
        losses = "  ".join(f"{k}: {storage.median(k):.4g}" for k in storage.names() if "loss" in k)
        self.logger.info(
            " eta: {}  iter: {}  {}  time: {:.4f}  data_time: {:.4f}  lr: {:.5g}  max_mem: 0M".format(
                eta, it, losses, iter_time, storage.median("data_time"), storage.latest("lr")
            )
        )

    def after_train(self) -> None:
        if is_main_process():
            self.write()


class StopFileHook(HookBase):
    """Stops training when `<OUTPUT_DIR>/STOP` exists (a manual early stop)."""

    def __init__(self, output_dir: str, voted: bool) -> None:
        self.path, self.voted = os.path.join(output_dir, "STOP"), voted

    def after_step(self) -> None:
        if (self.trainer.iter + 1) % 5:  # a file system call is not free: every 5 iterations
            return
        stop = os.path.exists(self.path)
        if self.voted:
            flag = torch.tensor([int(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        if stop:
            logging.getLogger("d2.engine.hooks").warning(
                f"Found {self.path}: stopping after iteration {self.trainer.iter}."
            )
            self.trainer.should_stop = True


class EvalHook(HookBase):
    def __init__(self, period: int, func: Callable[[], dict[str, Any]], max_iter: int) -> None:
        self.period, self.func, self.max_iter = period, func, max_iter

    def _do_eval(self) -> None:
        results = self.func()
        if results:
            flat = {f"{k}/{m}": v for k, d in results.items() for m, v in d.items()}
            self.trainer.storage.put_scalars(**flat)
        # evaluation may differ in time among ranks: keep them in step
        synchronize()

    def after_step(self) -> None:
        next_iter = self.trainer.iter + 1
        if self.period > 0 and next_iter % self.period == 0 and next_iter != self.max_iter:
            self._do_eval()

    def after_train(self) -> None:
        if self.trainer.iter + 1 >= self.max_iter:
            self._do_eval()


# -----------------------------------------------------------------------------
# checkpointer (fvcore's Checkpointer, smaller)


class Checkpointer:
    def __init__(self, model: nn.Module, save_dir: str, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.save_dir, self.optimizer = model, save_dir, optimizer
        self.logger = logging.getLogger("d2.checkpoint")

    def save(self, name: str, **extra: Any) -> None:
        path = os.path.join(self.save_dir, f"{name}.pth")
        self.logger.info(f"Saving checkpoint to {path}")
        data = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **extra}
        torch.save(data, path)
        with open(os.path.join(self.save_dir, "last_checkpoint"), "w") as f:
            f.write(os.path.basename(path))

    def resume_or_load(self, resume: bool) -> int:
        last = os.path.join(self.save_dir, "last_checkpoint")
        if not (resume and os.path.exists(last)):
            self.logger.info("No checkpoint found. Initializing model from scratch")
            return 0
        with open(last) as f:
            path = os.path.join(self.save_dir, f.read().strip())
        self.logger.info(f"[Checkpointer] Loading from {path} ...")
        data = torch.load(path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(data["model"])
        self.optimizer.load_state_dict(data["optimizer"])
        return int(data["iteration"]) + 1


# -----------------------------------------------------------------------------
# evaluation


class ToyEvaluator:
    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self._logger = logging.getLogger("d2.evaluation.evaluator")
        self._predictions: list[dict[str, Any]] = []

    def reset(self) -> None:
        self._predictions = []

    def process(
        self, inputs: list[dict[str, Any]], outputs: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        logits, f = outputs
        for d, lg, feat in zip(inputs, logits, f, strict=True):
            pred = {
                "image_id": d["image_id"],
                "category_id": int(lg.argmax()),
                "correct": int(lg.argmax()) == int(d["gt_classes"]),
            }
            if get_rank() == self.fault.fat_preds_rank:  # mask logits at full image size
                pred["mask_logits"] = feat.repeat(640 * 480 * 4 // 32)
            self._predictions.append(pred)

    def evaluate(self) -> dict[str, Any]:
        local_acc = sum(p["correct"] for p in self._predictions) / len(self._predictions)
        self._logger.debug(f"Local accuracy on {len(self._predictions)} images: {local_acc:.3f}")
        predictions = all_gather(self._predictions)
        if not is_main_process():
            return {}
        preds = list(itertools.chain(*predictions))
        acc = 100.0 * sum(p["correct"] for p in preds) / max(len(preds), 1)
        return {"bbox": {"AP": acc * 0.61, "AP50": acc * 0.83, "AP75": acc * 0.55}}


def inference_on_dataset(
    model: nn.Module, cfg: CfgNode, evaluator: ToyEvaluator, fault: Fault
) -> dict[str, Any]:
    logger = logging.getLogger("d2.evaluation.evaluator")
    dicts = load_dataset(cfg.DATASETS.ROOT, cfg.DATASETS.TEST[0])[: cfg.TEST.VAL_IMAGES]
    sampler = InferenceSampler(len(dicts))
    mapper = DatasetMapper(False, set(), leak_kill=False)
    logger.info(f"Start inference on {len(sampler)} batches")
    evaluator.reset()
    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        for idx in sampler:
            inputs = [mapper(dicts[idx])]
            evaluator.process(inputs, model(inputs))
            if fault.sync_each_eval_image:
                synchronize()  # per-image timing is only right when every rank is at the same image
    model.train()
    total = time.perf_counter() - start
    logger.info(
        f"Total inference time: {datetime.timedelta(seconds=int(total))} ({total / max(len(sampler), 1):.6f} s / iter per device, on {get_world_size()} devices)"
    )
    results = evaluator.evaluate()
    if is_main_process():
        for task, res in results.items():
            logger.info(
                "Evaluation results for {}: \n| AP | AP50 | AP75 |\n| {:.3f} | {:.3f} | {:.3f} |".format(
                    task, res["AP"], res["AP50"], res["AP75"]
                )
            )
            logger.info(f"copypaste: Task: {task}")
            logger.info("copypaste: AP,AP50,AP75")
            logger.info(
                "copypaste: {:.4f},{:.4f},{:.4f}".format(res["AP"], res["AP50"], res["AP75"])
            )
    return results


# -----------------------------------------------------------------------------
# the trainer


class Trainer:
    def __init__(self, cfg: CfgNode, fault: Fault, resume: bool) -> None:
        self.cfg, self.fault = cfg, fault
        self.logger = logging.getLogger("d2.engine.train_loop")
        torch.manual_seed(cfg.SEED)
        model = TinyRCNN(cfg, fault)
        logging.getLogger("d2.engine.defaults").info(f"Model:\n{model}")
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.SOLVER.BASE_LR, momentum=0.9)
        if get_world_size() > 1:
            model = DistributedDataParallel(
                model, broadcast_buffers=False, find_unused_parameters=cfg.MODEL.DDP_FIND_UNUSED
            )
        self.model = model
        self.data_iter, _ = build_train_loader(cfg, fault)
        self.checkpointer = Checkpointer(self._bare(), cfg.OUTPUT_DIR, self.optimizer)
        self.start_iter = self.checkpointer.resume_or_load(resume)
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.iter = self.start_iter
        self.should_stop = False
        self.evaluator = ToyEvaluator(fault)
        hooks: list[HookBase] = [
            LRScheduler(self.optimizer, cfg, fault.loud),
            PeriodicCheckpointer(
                self.checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD, self.max_iter, fault
            ),
            EvalHook(cfg.TEST.EVAL_PERIOD, self.test, self.max_iter),
            StopFileHook(cfg.OUTPUT_DIR, fault.voted_stop),
            PeriodicWriter(self.max_iter),
        ]
        for h in hooks:
            h.trainer = self
        self._hooks = hooks

    def _bare(self) -> nn.Module:
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def test(self) -> dict[str, Any]:
        return {
            "bbox": inference_on_dataset(self.model, self.cfg, self.evaluator, self.fault).get(
                "bbox", {}
            )
        }

    def train(self) -> None:
        self.logger.info(f"Starting training from iteration {self.start_iter}")
        start = time.perf_counter()
        with EventStorage(self.start_iter) as self.storage:
            for h in self._hooks:
                h.before_train()
            try:
                for it in range(self.start_iter, self.max_iter):
                    self.iter = self.storage.iter = it
                    self.run_step()
                    for h in self._hooks:
                        h.after_step()
                    if self.should_stop:
                        break
            except Exception:
                self.logger.exception("Exception during training:")
                raise
            finally:
                for h in self._hooks:
                    h.after_train()
        total = time.perf_counter() - start
        self.logger.info(
            f"Overall training speed: {self.iter + 1 - self.start_iter} iterations in {datetime.timedelta(seconds=int(total))} ({total / max(self.iter + 1 - self.start_iter, 1):.4f} s / it)"
        )
        self.logger.info(f"Total training time: {datetime.timedelta(seconds=int(total))}")

    def run_step(self) -> None:
        t0 = time.perf_counter()
        data = next(self.data_iter)
        data_time = time.perf_counter() - t0
        loss_dict = self.model(data)
        losses = sum(loss_dict.values())
        self._detect_anomaly(losses, loss_dict)
        self.optimizer.zero_grad()
        losses.backward()
        reduced = reduce_dict(loss_dict)
        if is_main_process():
            self.storage.put_scalar("total_loss", float(sum(reduced.values())))
            for k, v in reduced.items():
                self.storage.put_scalar(k, float(v))
        self.optimizer.step()
        self.storage.put_scalars(time=time.perf_counter() - t0, data_time=data_time)

    def _detect_anomaly(self, losses: torch.Tensor, loss_dict: dict[str, torch.Tensor]) -> None:
        if not torch.isfinite(losses).all():
            raise FloatingPointError(
                f"Loss became infinite or NaN at iteration={self.iter}!\nloss_dict = {loss_dict}"
            )


# -----------------------------------------------------------------------------
# entry point (tools/train_net.py)


def default_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Toy detection training")
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to config file")
    parser.add_argument("--resume", action="store_true", help="resume from last_checkpoint")
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument("--num-gpus", type=int, default=1, help="number of processes per machine")
    parser.add_argument("--num-machines", type=int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=int, default=0, help="the rank of this machine")
    parser.add_argument(
        "--dist-url", default="auto", help="initialization URL for pytorch distributed backend"
    )
    parser.add_argument("--write-toy-data", default="", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    parser.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="Modify config options at the end of the command: KEY VALUE pairs",
    )
    return parser


def setup(args: argparse.Namespace) -> CfgNode:
    cfg = get_cfg()
    if args.config_file:
        cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts or [])
    if not cfg.DATASETS.ROOT:
        cfg.DATASETS.ROOT = os.environ.get("D2_DATASETS", "datasets")
    rank = get_rank()
    os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
    logger = setup_logger(cfg.OUTPUT_DIR, distributed_rank=rank, name="d2")
    logger.info(f"Rank of current process: {rank}. World size: {get_world_size()}")
    logger.info(
        f"Environment info:\nsys.platform  {sys.platform}\nPython        {sys.version.split()[0]}\nPyTorch       {torch.__version__}"
    )
    shown = {k: v for k, v in vars(args).items() if k not in ("mode", "write_toy_data")}
    logger.info("Command line arguments: " + str(argparse.Namespace(**shown)))
    if is_main_process():
        path = os.path.join(cfg.OUTPUT_DIR, "config.json")
        with open(path, "w") as f:
            f.write(cfg.dump())
        logger.info(f"Full config saved to {path}")
    return cfg


def main(args: argparse.Namespace) -> None:
    fault = MODES[args.mode]
    if fault.loud:
        warnings.filterwarnings("default", category=UserWarning)
    cfg = setup(args)
    trainer = Trainer(cfg, fault, args.resume)
    trainer.train()


if __name__ == "__main__":
    cli_args = default_argument_parser().parse_args()
    if cli_args.write_toy_data:
        write_toy_data(cli_args.write_toy_data)
        sys.exit(0)
    print(
        "Command Line Args:",
        argparse.Namespace(
            **{k: v for k, v in vars(cli_args).items() if k not in ("mode", "write_toy_data")}
        ),
    )
    launch(
        main,
        cli_args.num_gpus,
        num_machines=cli_args.num_machines,
        machine_rank=cli_args.machine_rank,
        dist_url=cli_args.dist_url,
        args=(cli_args,),
    )
