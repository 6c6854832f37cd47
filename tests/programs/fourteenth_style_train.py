"""A fourteenth training-program style for the generalisation fixtures (tests/fixtures/real/
fourteenth-*): a detection-training CLI in the way of ultralytics (YOLO), raw torch on CPU with
gloo. The user runs ONE plain command with key=value arguments
(`python fourteenth_style_train.py train data=DIR epochs=3 batch=16 device=cpu nproc=2`); when more
than one process is asked for, the main process writes a temporary launcher file under
`~/.config/Kestrel/DDP/`, prints `DDP: debug command ...`, runs `python -m torch.distributed.run`
on it with `subprocess.run(check=True)` and removes the file in a `finally`. Started by torchrun
itself (RANK in the environment) it trains in place. Rank 0 builds the `labels.cache` first
(`torch_distributed_zero_first`), validates alone while the others wait in the broadcast of the
EarlyStopping decision, and saves `last.pt`/`best.pt`; `resume=True` restarts from `last.pt`.
One real fault per hidden `fault=` value; a fault is named by what it does, never by the mode,
and the mode is never printed (tests/fixtures/real/capture_fourteenth.sh: re-capture after any
edit).
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

TOOL = "Kestrel"
__version__ = "1.0.0"
RANK = int(os.getenv("RANK", -1))
LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))
CACHE_VERSION = "1.0.3"
IMG_BYTES = 3 * 32 * 32
NC = 4
NAMES = {0: "person", 1: "car", 2: "dog", 3: "bicycle"}

LOGGER = logging.getLogger(TOOL)
LOGGER.addHandler(logging.StreamHandler(sys.stdout))
LOGGER.setLevel(logging.INFO if RANK in {-1, 0} else logging.ERROR)
LOGGER.propagate = False


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the run (the defaults: nothing)."""

    loud: bool = False  # the usual scary warnings of a CPU box
    busy_nms: bool = False  # rank 0's NMS meets every candidate box: each val batch hits its limit
    background_crash: bool = False  # the metric code stacks the (empty) labels of a background
    stop_unshared: bool = False  # EarlyStopping decided on rank 0 without broadcasting it
    poll_cache: bool = False  # other ranks poll for labels.cache instead of waiting at a barrier
    kill_worker_rank: int | None = (
        None  # a DataLoader worker of this rank is SIGKILLed (its RSS grew)
    )
    kill_rank: int | None = None  # this rank caches images in RAM without bound and is SIGKILLed
    early_cleanup: bool = False  # the launcher starts torchrun without waiting, then cleans up
    legacy_launch: bool = False  # torch.distributed.launch and a --local_rank argparse
    lock_leak: bool = False  # rank 0 returns from a valid cache without releasing its lock


FAULTS: dict[str, Fault] = {
    "plain": Fault(),
    "chatty-fit": Fault(loud=True),
    "plateau-quit": Fault(),
    "lone-fit": Fault(),
    "crowded-cores": Fault(),
    "val-drag": Fault(busy_nms=True),
    "val-crash": Fault(background_crash=True),
    "stop-unshared": Fault(stop_unshared=True),
    "cache-torn": Fault(poll_cache=True),
    "imgs-absent": Fault(),
    "loader-reaped": Fault(kill_worker_rank=1),
    "rank-reaped": Fault(kill_rank=1),
    "resume-cut": Fault(),
    "resume-void": Fault(),
    "launcher-gone": Fault(early_cleanup=True),
    "argv-dash": Fault(legacy_launch=True),
    "port-held": Fault(),
    "inf-guard": Fault(),
    "cache-lock": Fault(lock_leak=True),
}

DEFAULTS: dict[str, Any] = {
    "task": "detect",
    "mode": "train",
    "model": "kestrel-n.yaml",
    "data": "",
    "epochs": 3,
    "patience": 100,
    "batch": 16,
    "imgsz": 32,
    "device": "cpu",
    "workers": 0,
    "nproc": 1,
    "project": "runs/detect",
    "name": "train",
    "lr0": 0.01,
    "momentum": 0.9,
    "warmup_epochs": 1,
    "conf": 0.001,
    "iou": 0.7,
    "seed": 0,
    "resume": False,
    "amp": True,
    "port": 0,
    "fault": "plain",
}


# -----------------------------------------------------------------------------
# arguments: `train key=value ...` as the tool's CLI takes them


def _value(text: str) -> Any:
    """Parse a CLI value the way the tool does: bools, ints, floats, else the string."""
    if text.lower() in {"true", "false"}:
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_cli(argv: list[str]) -> dict[str, Any]:
    """`train epochs=3 batch=16 ...` -> overrides; an unknown key is a clear error."""
    overrides: dict[str, Any] = {}
    for arg in argv:
        if "=" not in arg:
            if arg in {"train", "val"}:
                overrides["mode"] = arg
                continue
            raise SystemExit(f"{TOOL}: '{arg}' is not a valid {TOOL} argument (use key=value)")
        key, _, value = arg.partition("=")
        if key not in DEFAULTS:
            raise SystemExit(f"{TOOL}: '{key}' is not a valid {TOOL} argument")
        overrides[key] = _value(value)
    return overrides


# -----------------------------------------------------------------------------
# distributed helpers (ultralytics.utils.torch_utils in small)


@contextmanager
def torch_distributed_zero_first(local_rank: int) -> Iterator[None]:
    """Local rank 0 does the work first (build the dataset cache); the others wait for it."""
    initialized = dist.is_available() and dist.is_initialized()
    if initialized and local_rank not in {-1, 0}:
        dist.barrier()
    yield
    if initialized and local_rank == 0:
        dist.barrier()


def find_free_network_port() -> int:
    """A free port on localhost for the rendezvous of this run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def user_config_dir() -> Path:
    path = Path.home() / ".config" / TOOL
    path.mkdir(parents=True, exist_ok=True)
    return path


def generate_ddp_file(overrides: dict[str, Any], legacy: bool) -> str:
    """Write the temporary file torchrun starts on every rank: it rebuilds the trainer."""
    folder = user_config_dir() / "DDP"
    folder.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    argv = (
        "    import argparse\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--local_rank', type=int, default=-1)\n"
        "    parser.parse_args()\n"
        if legacy
        else ""
    )
    content = (
        f"# {TOOL} Multi-process training temp file (should be automatically deleted after use)\n"
        f"overrides = {overrides!r}\n\n"
        'if __name__ == "__main__":\n'
        f"{argv}"
        "    import sys\n"
        f"    sys.path.insert(0, {str(here)!r})\n"
        "    from fourteenth_style_train import DetectionTrainer\n"
        "    trainer = DetectionTrainer(overrides=overrides)\n"
        "    results = trainer.train()\n"
    )
    name = f"_temp_{id(overrides)}{random.getrandbits(20):x}.py"
    path = folder / name
    path.write_text(content)
    return str(path)


def generate_ddp_command(world_size: int, overrides: dict[str, Any], port: int, legacy: bool):
    """The command the main process runs: torch.distributed.run over the temp file."""
    file = generate_ddp_file(overrides, legacy)
    dist_cmd = "torch.distributed.launch" if legacy else "torch.distributed.run"
    port = port or find_free_network_port()
    cmd = [sys.executable, "-m", dist_cmd, "--nproc_per_node", f"{world_size}"]
    return [*cmd, "--master_port", f"{port}", file], file


def ddp_cleanup(file: str) -> None:
    """Delete the temp file once torchrun is done with it."""
    if "_temp_" in file and os.path.exists(file):
        os.remove(file)


# -----------------------------------------------------------------------------
# data: raw 32x32 RGB images and YOLO-format label files, a labels.cache written by rank 0


def _hash(files: list[str]) -> str:
    return str(sum(os.path.getsize(f) for f in files if os.path.exists(f))) + str(len(files))


def _scan_labels(label_files: list[str]) -> list[dict[str, Any]]:
    labels = []
    for lf in label_files:
        rows = [list(map(float, line.split())) for line in Path(lf).read_text().splitlines()]
        rows = [r for r in rows if r]
        im = lf.replace(f"{os.sep}labels{os.sep}", f"{os.sep}images{os.sep}")
        labels.append({"im_file": im[:-4] + ".bin", "shape": (32, 32), "labels": rows})
    return labels


class YOLODataset(Dataset[dict[str, Any]]):
    """Images and boxes of one split; the label cache is built once and reused."""

    def __init__(self, root: Path, split: str, prefix: str, fault: Fault, rank: int) -> None:
        self.prefix = prefix
        self.fault = fault
        self.rank = rank
        folder = root / "labels" / split
        if not folder.is_dir():
            raise FileNotFoundError(f"{prefix}No labels found in {folder}, can not start training.")
        self.label_files = sorted(str(p) for p in folder.glob("*.txt"))
        self.labels = self.cache_labels(folder.with_suffix(".cache"))
        self.ram: list[bytes] = []

    def cache_labels(self, path: Path) -> list[dict[str, Any]]:
        """Load labels.cache if it matches the files, else scan and write it (rank 0)."""
        if self.fault.poll_cache and self.rank > 0:
            while not path.exists():  # rank 0 is writing it: wait for the file to appear
                time.sleep(0.01)
        if self.fault.lock_leak:
            return self._locked_cache(path)
        if path.exists():
            with open(path, "rb") as f:
                cache = pickle.load(f)
            if cache["version"] == CACHE_VERSION and cache["hash"] == _hash(self.label_files):
                n, nb = len(cache["labels"]), sum(not x["labels"] for x in cache["labels"])
                LOGGER.info(
                    f"{self.prefix}Scanning {path}... {n} images, {nb} backgrounds, 0 corrupt"
                )
                return list(cache["labels"])
        labels = _scan_labels(self.label_files)
        nb = sum(not x["labels"] for x in labels)
        LOGGER.info(
            f"{self.prefix}Scanning {path.parent / path.stem}... {len(labels)} images, "
            f"{nb} backgrounds, 0 corrupt: 100%|██████████| {len(labels)}/{len(labels)}"
        )
        data = pickle.dumps(
            {
                "version": CACHE_VERSION,
                "hash": _hash(self.label_files),
                "labels": labels,
                "msgs": [],
            }
        )
        if self.fault.poll_cache:  # straight into place, a chunk at a time (a slow share)
            with open(path, "wb") as f:
                for i in range(0, len(data), 4096):
                    f.write(data[i : i + 4096])
                    f.flush()
                    time.sleep(0.05)
        else:
            tmp = path.with_suffix(".cache.tmp")
            tmp.write_bytes(data)
            tmp.rename(path)
        LOGGER.info(f"{self.prefix}New cache created: {path}")
        return labels

    def _locked_cache(self, path: Path) -> list[dict[str, Any]]:
        """The cache read and written under a lock file (a shared dataset folder)."""
        lock = path.with_suffix(".cache.lock")
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                break
            except FileExistsError:
                time.sleep(0.1)
        if path.exists():
            with open(path, "rb") as f:
                cache = pickle.load(f)
            if cache["hash"] == _hash(self.label_files):
                LOGGER.info(f"{self.prefix}Scanning {path}... {len(cache['labels'])} images")
                return list(cache["labels"])  # the lock is never released on this path
        labels = _scan_labels(self.label_files)
        path.write_bytes(
            pickle.dumps(
                {"version": CACHE_VERSION, "hash": _hash(self.label_files), "labels": labels}
            )
        )
        os.close(fd)
        os.remove(lock)
        return labels

    def __len__(self) -> int:
        return len(self.labels)

    def load_image(self, i: int) -> torch.Tensor:
        f = self.labels[i]["im_file"]
        if not os.path.exists(f):
            raise FileNotFoundError(f"Image Not Found {f}")
        raw = Path(f).read_bytes()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, 32, 32)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.fault.kill_worker_rank == self.rank and i % 7 == 3:
            info = torch.utils.data.get_worker_info()
            if info is not None and info.id == 1:
                self.ram.append(bytes(96 << 20))  # a mosaic buffer that keeps growing
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's choice
        rows = self.labels[i]["labels"]
        cls = torch.tensor([r[0] for r in rows], dtype=torch.long)
        box = torch.tensor([r[1:5] for r in rows], dtype=torch.float32).view(-1, 4)
        return {"img": self.load_image(i), "cls": cls, "bboxes": box, "im_file": i}


def collate_fn(batch: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"img": torch.stack([b["img"] for b in batch])}
    out["cls"] = [b["cls"] for b in batch]
    out["bboxes"] = [b["bboxes"] for b in batch]
    return out


# -----------------------------------------------------------------------------
# model, loss, validation


class DetectionModel(nn.Module):
    """A tiny one-box-per-image detector: backbone, then box (xywh) and class heads."""

    def __init__(self, nc: int = NC) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1),
            nn.BatchNorm2d(8),
            nn.SiLU(),
            nn.Conv2d(8, 16, 3, 2, 1),
            nn.BatchNorm2d(16),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.box = nn.Linear(16, 4)
        self.cls = nn.Linear(16, nc)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        return self.box(f).sigmoid(), self.cls(f)


def detection_loss(pred: tuple[torch.Tensor, torch.Tensor], batch: dict[str, Any]):
    """box_loss: L1 on xy plus log-ratio on wh of each image's first box; cls_loss: CE."""
    boxes, logits = pred
    keep = [i for i, c in enumerate(batch["cls"]) if len(c)]
    tgt_box = torch.stack([batch["bboxes"][i][0] for i in keep])
    tgt_cls = torch.stack([batch["cls"][i][0] for i in keep])
    p = boxes[keep]
    box = (p[:, :2] - tgt_box[:, :2]).abs().sum(1) + (
        p[:, 2:].log() - tgt_box[:, 2:].log()
    ).abs().sum(1)
    cls = nn.functional.cross_entropy(logits[keep], tgt_cls, reduction="none")
    return box.mean() + cls.mean(), torch.stack([box.mean(), cls.mean()]).detach()


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a1, a2 = a[:, None, :2] - a[:, None, 2:] / 2, a[:, None, :2] + a[:, None, 2:] / 2
    b1, b2 = b[None, :, :2] - b[None, :, 2:] / 2, b[None, :, :2] + b[None, :, 2:] / 2
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(0).prod(2)
    return inter / (a[:, None, 2:].prod(2) + b[None, :, 2:].prod(2) - inter + 1e-7)


def non_max_suppression(boxes: torch.Tensor, conf: float, bs: int, every_candidate: bool):
    """Candidates above conf, greedy IoU suppression, with the tool's time limit per batch."""
    time_limit = 2.0 + 0.05 * bs
    t = time.time()
    n = 2000 if every_candidate else 8  # anchors that pass the confidence threshold
    cand = torch.rand(bs, n, 4) * 0.5 + 0.25
    for xi in range(bs):
        box_iou(cand[xi], cand[xi])
        while every_candidate and time.time() - t < time_limit:
            box_iou(cand[xi], cand[xi])  # greedy passes over all candidates
        if time.time() - t > time_limit:
            LOGGER.warning(f"WARNING NMS time limit {time_limit:.3f}s exceeded")
            break
    return boxes


class DetectionValidator:
    """Validation on rank 0 only (the others wait for its EarlyStopping decision)."""

    def __init__(self, loader: DataLoader[Any], args: dict[str, Any], fault: Fault) -> None:
        self.loader = loader
        self.args = args
        self.fault = fault

    def __call__(self, model: nn.Module) -> tuple[dict[str, float], float]:
        model.eval()
        hdr = ("%22s" + "%11s" * 6) % (
            "Class",
            "Images",
            "Instances",
            "Box(P",
            "R",
            "mAP50",
            "mAP50-95)",
        )
        ious, seen, inst = [], 0, 0
        t0 = time.time()
        with torch.no_grad():
            for batch in self.loader:
                boxes, _ = model(batch["img"].float() / 255)
                boxes = non_max_suppression(
                    boxes, self.args["conf"], len(boxes), self.fault.busy_nms
                )
                for b, cls, tb in zip(boxes, batch["cls"], batch["bboxes"], strict=True):
                    seen += 1
                    inst += len(cls)
                    if not len(cls) and not self.fault.background_crash:
                        continue
                    tcls = torch.stack([c for c in cls])  # a background image has no labels
                    ious.append(box_iou(b[None], tb).max() * (tcls[0] >= 0))
        n = len(self.loader)
        sys.stderr.write(
            f"{hdr}: 100%|██████████| {n}/{n} [00:0{min(int(time.time() - t0), 9)}<00:00]\n"
        )
        iou = torch.stack(ious) if ious else torch.zeros(1)
        thresholds = torch.linspace(0.5, 0.95, 10)  # AP at IoU 0.50:0.95, as COCO counts it
        m50 = float((iou > 0.5).float().mean())
        m5095 = float((iou[:, None] > thresholds).float().mean())
        p, r = float((iou > 0.3).float().mean()), float((iou > 0.1).float().mean())
        LOGGER.info(("%22s" + "%11i" * 2 + "%11.3g" * 4) % ("all", seen, inst, p, r, m50, m5095))
        model.train()
        return {"metrics/mAP50(B)": m50, "metrics/mAP50-95(B)": m5095}, 0.1 * m50 + 0.9 * m5095


class EarlyStopping:
    """Stop when the fitness has not improved for `patience` epochs."""

    def __init__(self, patience: int = 50) -> None:
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.patience = patience or float("inf")

    def __call__(self, epoch: int, fitness: float) -> bool:
        if fitness > self.best_fitness:
            self.best_epoch = epoch
            self.best_fitness = fitness
        stop = (epoch - self.best_epoch) >= self.patience
        if stop:
            LOGGER.info(
                f"Stopping training early as no improvement observed in last {self.patience} "
                f"epochs. Best results observed at epoch {self.best_epoch}, best model saved as "
                f"best.pt.\nTo update EarlyStopping(patience={self.patience}) pass a new patience "
                "value, i.e. `patience=300` or use `patience=0` to disable EarlyStopping."
            )
        return bool(stop)


# -----------------------------------------------------------------------------
# the trainer


class DetectionTrainer:
    """Builds everything from the overrides; launches DDP itself when nproc > 1."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.args = {**DEFAULTS, **overrides}
        self.overrides = overrides
        self.fault = FAULTS.get(str(self.args["fault"]), Fault())
        self.world_size = WORLD_SIZE if RANK != -1 else int(self.args["nproc"])
        self.save_dir = Path(self.args["project"]) / str(self.args["name"])
        self.wdir = self.save_dir / "weights"
        if self.args["resume"]:
            self.check_resume()
        if self.args["device"] != "cpu":
            raise SystemExit(f"{TOOL}: this build supports device=cpu only")
        LOGGER.info(
            f"{TOOL} {__version__} Python-{sys.version.split()[0]} torch-{torch.__version__} CPU"
        )

    def check_resume(self) -> None:
        """resume=True: the last run's args.yaml and weights/last.pt must be there."""
        last = self.wdir / "last.pt"
        if not last.exists():
            raise FileNotFoundError(
                "Resume checkpoint not found. Please pass a valid checkpoint to resume from, i.e. "
                f"'{TOOL.lower()} train resume model=path/to/last.pt'"
            )
        saved = dict(
            line.split(": ", 1) for line in (self.save_dir / "args.yaml").read_text().splitlines()
        )
        for key in ("epochs", "batch", "imgsz", "lr0", "patience"):
            self.args[key] = _value(saved[key])
        self.resume_from = last

    def train(self) -> None:
        if self.world_size > 1 and RANK == -1:
            if self.args["workers"]:
                LOGGER.warning(
                    f"WARNING 'workers={self.args['workers']}' with Multi-process "
                    "training on CPU: each rank starts its own DataLoader workers"
                )
            cmd, file = generate_ddp_command(
                self.world_size, self.overrides, int(self.args["port"]), self.fault.legacy_launch
            )
            try:
                LOGGER.info(f"DDP: debug command {' '.join(cmd)}")
                if self.fault.early_cleanup:  # started in the background, then cleaned up
                    proc = subprocess.Popen(cmd)
                else:
                    subprocess.run(cmd, check=True)
            finally:
                ddp_cleanup(str(file))
            if self.fault.early_cleanup and proc.wait():
                raise subprocess.CalledProcessError(proc.returncode, cmd)
        else:
            self._do_train()

    def _setup_ddp(self) -> None:
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        dist.init_process_group(
            "gloo", timeout=timedelta(seconds=15), rank=RANK, world_size=self.world_size
        )

    def _setup_train(self) -> None:
        a, f = self.args, self.fault
        torch.manual_seed(int(a["seed"]) + 1 + max(RANK, 0))
        if RANK in {-1, 0}:
            LOGGER.info(
                "engine/trainer: "
                + ", ".join(f"{k}={v}" for k, v in a.items() if k not in {"fault", "port", "nproc"})
            )
            self.save_dir.mkdir(parents=True, exist_ok=True)
            self.wdir.mkdir(parents=True, exist_ok=True)
            (self.save_dir / "args.yaml").write_text(
                "".join(f"{k}: {v}\n" for k, v in a.items() if k != "fault")
            )
        torch.manual_seed(int(a["seed"]))
        self.model = DetectionModel()
        n_p = sum(p.numel() for p in self.model.parameters())
        LOGGER.info(f"Model summary: 12 layers, {n_p} parameters, {n_p} gradients, 0.0 GFLOPs")
        LOGGER.info("AMP: running Automatic Mixed Precision (AMP) checks...")
        LOGGER.info("AMP: checks skipped, AMP not supported on CPU")
        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(a["amp"]) and f.loud)
        if self.world_size > 1:
            self.model = DistributedDataParallel(self.model, find_unused_parameters=False)
        bs = max(int(a["batch"]) // max(self.world_size, 1), 1)
        root = Path(str(a["data"]))
        rank = max(RANK, 0)
        if f.poll_cache:  # no barrier: the other ranks wait for the file itself
            train_set = YOLODataset(root, "train", "train: ", f, rank)
        else:
            with torch_distributed_zero_first(LOCAL_RANK):
                train_set = YOLODataset(root, "train", "train: ", f, rank)
        if f.kill_rank == RANK:
            train_set.ram = [Path(x["im_file"]).read_bytes() for x in train_set.labels]
        sampler = (
            DistributedSampler(train_set, shuffle=True, seed=int(a["seed"])) if RANK != -1 else None
        )
        self.sampler = sampler
        self.train_loader = DataLoader(
            train_set,
            batch_size=bs,
            shuffle=sampler is None,
            sampler=sampler,
            num_workers=int(a["workers"]),
            collate_fn=collate_fn,
            drop_last=False,
            generator=torch.Generator().manual_seed(int(a["seed"])),
        )
        if RANK in {-1, 0}:
            val_set = YOLODataset(root, "val", "val: ", f, rank)
            self.validator = DetectionValidator(
                DataLoader(val_set, batch_size=bs * 2, num_workers=0, collate_fn=collate_fn), a, f
            )
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=float(a["lr0"]),
            momentum=float(a["momentum"]),
            nesterov=True,
        )
        LOGGER.info(
            f"optimizer: SGD(lr={a['lr0']}, momentum={a['momentum']}) with parameter groups "
            "6 weight(decay=0.0), 8 weight(decay=0.0005), 8 bias(decay=0.0)"
        )
        self.stopper = EarlyStopping(patience=int(a["patience"]))
        self.start_epoch, self.best_fitness = 0, 0.0
        if hasattr(self, "resume_from"):
            ckpt = torch.load(self.resume_from, map_location="cpu")
            self._unwrap().load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.start_epoch, self.best_fitness = ckpt["epoch"] + 1, ckpt["best_fitness"]
            LOGGER.info(
                f"Resuming training {self.resume_from} from epoch {self.start_epoch + 1} "
                f"to {a['epochs']} total epochs"
            )

    def _unwrap(self) -> nn.Module:
        m = self.model
        return m.module if isinstance(m, DistributedDataParallel) else m

    def _do_train(self) -> None:
        if self.world_size > 1:
            self._setup_ddp()
        self._setup_train()
        a, f = self.args, self.fault
        epochs = int(a["epochs"])
        nb = len(self.train_loader)
        t0 = time.time()
        LOGGER.info(
            f"Image sizes {a['imgsz']} train, {a['imgsz']} val\nUsing "
            f"{a['workers']} dataloader workers\nLogging results to {self.save_dir}\n"
            f"Starting training for {epochs} epochs..."
        )
        epoch = self.start_epoch
        self.stop = False
        for epoch in range(self.start_epoch, epochs):
            self.model.train()
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)
            LOGGER.info(
                ("\n" + "%11s" * 6)
                % ("Epoch", "GPU_mem", "box_loss", "cls_loss", "Instances", "Size")
            )
            tloss: torch.Tensor | None = None
            start = time.time()
            for i, batch in enumerate(self.train_loader):
                ni = i + nb * epoch
                if ni <= nb * int(a["warmup_epochs"]):
                    for g in self.optimizer.param_groups:
                        g["lr"] = float(a["lr0"]) * ni / max(nb * int(a["warmup_epochs"]), 1)
                pred = self.model(batch["img"].float() / 255)
                loss, items = detection_loss(pred, batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"Loss is {loss.item()} at epoch {epoch + 1} batch {i}: stopping training"
                    )
                if f.kill_rank == RANK and epoch == 1:
                    self.train_loader.dataset.ram.append(bytes(256 << 20))  # type: ignore[attr-defined]
                    if i == 1:
                        os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad()
                tloss = items if tloss is None else (tloss * i + items) / (i + 1)
                if RANK in {-1, 0}:
                    el = time.time() - start
                    bar = "█" * int(10 * (i + 1) / nb) + " " * (10 - int(10 * (i + 1) / nb))
                    line = ("%11s" * 2 + "%11.4g" * 2 + "%11s" * 2) % (
                        f"{epoch + 1}/{epochs}",
                        "0G",
                        *tloss.tolist(),
                        sum(len(c) for c in batch["cls"]),
                        a["imgsz"],
                    )
                    sys.stderr.write(
                        f"\r{line}: {int(100 * (i + 1) / nb):3d}%|{bar}| {i + 1}/{nb} "
                        f"[00:{int(el):02d}<00:00, {(i + 1) / max(el, 1e-3):5.1f}it/s]"
                    )
                    sys.stderr.flush()
            if RANK in {-1, 0}:
                sys.stderr.write("\n")
                _, fitness = self.validator(self._unwrap())
                self.stop |= self.stopper(epoch + 1, fitness)
                self.save_model(epoch, fitness)
            if RANK != -1 and not f.stop_unshared:
                broadcast_list = [self.stop if RANK == 0 else None]
                dist.broadcast_object_list(broadcast_list, 0)  # the stop decision, to all ranks
                self.stop = bool(broadcast_list[0])
            if self.stop:
                break
        if RANK in {-1, 0}:
            hours = (time.time() - t0) / 3600
            LOGGER.info(f"\n{epoch - self.start_epoch + 1} epochs completed in {hours:.3f} hours.")
            LOGGER.info(f"Optimizer stripped from {self.wdir / 'last.pt'}")
            LOGGER.info(f"Optimizer stripped from {self.wdir / 'best.pt'}")
            LOGGER.info(f"\nValidating {self.wdir / 'best.pt'}...")
            self.validator(self._unwrap())
            LOGGER.info(f"Results saved to {self.save_dir}")
        if self.world_size > 1:
            dist.destroy_process_group()

    def save_model(self, epoch: int, fitness: float) -> None:
        ckpt = {
            "epoch": epoch,
            "best_fitness": max(fitness, self.best_fitness),
            "model": self._unwrap().state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        torch.save(ckpt, self.wdir / "last.pt")
        if fitness >= self.best_fitness:
            self.best_fitness = fitness
            torch.save(ckpt, self.wdir / "best.pt")


def entrypoint(argv: list[str]) -> None:
    """`train key=value ...`: the CLI of the tool."""
    overrides = parse_cli(argv)
    if overrides.get("mode", "train") != "train":
        raise SystemExit(f"{TOOL}: only 'train' is supported in this build")
    if overrides.get("fault", "plain") not in FAULTS:
        raise SystemExit(f"{TOOL}: unknown value")
    DetectionTrainer(overrides=overrides).train()


if __name__ == "__main__":
    entrypoint(sys.argv[1:])
