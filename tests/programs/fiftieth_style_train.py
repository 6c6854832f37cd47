"""A fiftieth program style for the generalisation fixtures (tests/fixtures/real/fiftieth-*):
contrastive image-text (CLIP) training in the way of mlfoundations/open_clip's training/main.py.
A tiny image tower (two convolutions) and text tower (word embeddings, masked mean, MLP) in raw
torch with random init and a learnable logit scale; image-text pairs in webdataset-like tar
shards (`<key>.png` + `<key>.txt` members; made by --make-data at capture time), expanded from
brace notation, split by node and by DataLoader worker as wds.split_by_node / split_by_worker do,
read with tarfile and PIL, batched in the pipeline and capped per worker (`with_epoch`), a
DataLoader with 2 workers; DDP; open_clip's ClipLoss, whose features are gathered from every rank
(`torch.distributed.nn.all_gather` with --gather-with-grad, else `all_gather` of the detached
features with the local ones put back); the logit scale clamped to ln(100); AdamW with a cosine
schedule after a linear warmup; zero-shot classification of a small labelled tar on rank 0 only
at the end of each epoch (the others go on into the next epoch); checkpoints by rank 0. Logging
as open_clip's: "%(asctime)s |  %(levelname)7s | %(message)s" to the console and, on rank 0, to
logs/<name>/out.log; rank 0 logs at INFO, the other ranks at WARNING. With --stop-at-top1 the
run stops once the zero-shot top-1 reaches it (rank 0's decision broadcast to every rank).
Launched by tests/programs/fiftieth_train.sh (torchrun, gloo, 15 s timeout). A fault is chosen
by the OC50_VARIANT environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fiftieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import torch
import torch.distributed as dist
import torch.distributed.nn
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from tqdm import tqdm

TIMEOUT = timedelta(seconds=15)
SIZE = 16
COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
RGB = {
    "red": (220, 30, 30),
    "green": (30, 190, 60),
    "blue": (40, 60, 220),
    "yellow": (230, 220, 40),
    "purple": (140, 40, 170),
    "orange": (240, 140, 20),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
SHAPES = ["square", "circle", "stripe"]
TEMPLATES = ["a photo of a {}.", "a {} thing."]
VOCAB = ["<pad>", "<sot>", "<eot>", "<unk>", "a", "photo", "of", "the", "is", "small", "large"]
VOCAB += COLORS + SHAPES + ["thing", "picture"]
CONTEXT = 12


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank's batch statistics look up a key the pipeline never sets
    hoard_rank: int = -1  # this rank keeps 64 MiB a step until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation reads address 0
    slow_eval: bool = False  # the zero-shot set is read from a slow disk: 5 s a batch
    stuck_rank: int = -1  # this rank waits before epoch 1 for a cache thread never started
    eval_reduce: bool = False  # the zero-shot counts are all-reduced inside rank 0's evaluate
    solo_stop: bool = False  # the --stop-at-top1 check reads rank 0's metrics on rank 0 only
    cuda_map: bool = False  # the resume maps the checkpoint to cuda:<local rank>


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(key_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "z0": Fault(slow_eval=True),
    "w1": Fault(stuck_rank=1),
    "r0": Fault(eval_reduce=True),
    "x0": Fault(solo_stop=True),
    "g0": Fault(cuda_map=True),
}


# --- distributed (open_clip's training/distributed.py) ------------------------------------


def is_master(args: argparse.Namespace) -> bool:
    return args.rank == 0


def world_info_from_env() -> tuple[int, int, int]:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    return local_rank, rank, world


def init_distributed_device(args: argparse.Namespace) -> torch.device:
    args.distributed = False
    args.world_size, args.rank, args.local_rank = 1, 0, 0
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        args.local_rank, args.rank, args.world_size = world_info_from_env()
        dist.init_process_group(
            backend=args.dist_backend, init_method=args.dist_url, timeout=TIMEOUT
        )
        args.distributed = True
    args.device = "cpu"
    return torch.device(args.device)


def broadcast_object(args: argparse.Namespace, obj: object, src: int = 0) -> object:
    objects = [obj] if args.rank == src else [None]
    dist.broadcast_object_list(objects, src=src)
    return objects[0]


def unwrap_model(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


# --- logging (open_clip's training/logger.py) ---------------------------------------------


def setup_logging(log_file: str | None, level: int) -> None:
    formatter = logging.Formatter(
        "%(asctime)s |  %(levelname)7s | %(message)s", datefmt="%Y-%m-%d,%H:%M:%S"
    )
    logging.root.setLevel(level)
    for logger in [logging.getLogger(name) for name in logging.root.manager.loggerDict]:
        logger.setLevel(level)
    stream_handler = logging.StreamHandler()
    stream_handler.setFormatter(formatter)
    logging.root.addHandler(stream_handler)
    if log_file:
        file_handler = logging.FileHandler(filename=log_file)
        file_handler.setFormatter(formatter)
        logging.root.addHandler(file_handler)


# --- tokenizer and model -------------------------------------------------------------------


def tokenize(texts: list[str], context_length: int = CONTEXT) -> torch.Tensor:
    index = {w: i for i, w in enumerate(VOCAB)}
    out = torch.zeros(len(texts), context_length, dtype=torch.long)
    for row, text in enumerate(texts):
        words = re.findall(r"[a-z]+", text.lower())
        ids = [1, *[index.get(w, 3) for w in words][: context_length - 2], 2]
        out[row, : len(ids)] = torch.tensor(ids)
    return out


class TinyClip(nn.Module):
    def __init__(self, embed_dim: int = 32, width: int = 32) -> None:
        super().__init__()
        self.visual = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(16, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, embed_dim),
        )
        self.token_embedding = nn.Embedding(len(VOCAB), width)
        self.positional_embedding = nn.Parameter(torch.randn(CONTEXT, width) * 0.01)
        self.text_mlp = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.text_projection = nn.Linear(width, embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def encode_image(self, image: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        features = self.visual(image)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        x = self.token_embedding(text) + self.positional_embedding
        words = (text > 3) | (text == 3)  # word tokens: not <pad>, <sot>, <eot>
        x = (x * words.unsqueeze(-1)).sum(1) / words.sum(1, keepdim=True)
        features = self.text_projection(self.text_mlp(x))
        return F.normalize(features, dim=-1) if normalize else features

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "image_features": self.encode_image(image, normalize=True),
            "text_features": self.encode_text(text, normalize=True),
            "logit_scale": self.logit_scale.exp(),
        }


# --- loss (open_clip's loss.py) ------------------------------------------------------------


def gather_features(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    local_loss: bool = False,
    gather_with_grad: bool = False,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    if gather_with_grad:
        all_image_features = torch.cat(torch.distributed.nn.all_gather(image_features), dim=0)
        all_text_features = torch.cat(torch.distributed.nn.all_gather(text_features), dim=0)
    else:
        gathered_image_features = [torch.zeros_like(image_features) for _ in range(world_size)]
        gathered_text_features = [torch.zeros_like(text_features) for _ in range(world_size)]
        dist.all_gather(gathered_image_features, image_features)
        dist.all_gather(gathered_text_features, text_features)
        if not local_loss:
            # ensure grads for local rank when all_* features don't have a gradient
            gathered_image_features[rank] = image_features
            gathered_text_features[rank] = text_features
        all_image_features = torch.cat(gathered_image_features, dim=0)
        all_text_features = torch.cat(gathered_text_features, dim=0)
    return all_image_features, all_text_features


class ClipLoss(nn.Module):
    def __init__(
        self, local_loss: bool, gather_with_grad: bool, rank: int, world_size: int
    ) -> None:
        super().__init__()
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.rank = rank
        self.world_size = world_size

    def get_logits(
        self, image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.world_size > 1:
            all_image_features, all_text_features = gather_features(
                image_features,
                text_features,
                self.local_loss,
                self.gather_with_grad,
                self.rank,
                self.world_size,
            )
            if self.local_loss:
                logits_per_image = logit_scale * image_features @ all_text_features.T
                logits_per_text = logit_scale * text_features @ all_image_features.T
            else:
                logits_per_image = logit_scale * all_image_features @ all_text_features.T
                logits_per_text = logits_per_image.T
        else:
            logits_per_image = logit_scale * image_features @ text_features.T
            logits_per_text = logit_scale * text_features @ image_features.T
        return logits_per_image, logits_per_text

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor,
        output_dict: bool = False,
    ) -> dict[str, torch.Tensor]:
        logits_per_image, logits_per_text = self.get_logits(
            image_features, text_features, logit_scale
        )
        n = logits_per_image.shape[0]
        labels = torch.arange(n)
        if self.world_size > 1 and self.local_loss:
            labels = labels + n * self.rank
        total_loss = (
            F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)
        ) / 2
        return {"contrastive_loss": total_loss}


# --- data (a webdataset-like pipeline) ----------------------------------------------------


def expand_urls(spec: str) -> list[str]:
    """wds brace notation: shards/shard-{000000..000023}.tar; '::' joins several specs."""
    urls: list[str] = []
    for part in spec.split("::"):
        m = re.search(r"\{(\d+)\.\.(\d+)\}", part)
        if not m:
            urls.append(part)
            continue
        width = len(m.group(1))
        for i in range(int(m.group(1)), int(m.group(2)) + 1):
            urls.append(part[: m.start()] + str(i).zfill(width) + part[m.end() :])
    return urls


def url_opener(url: str) -> io.BufferedIOBase:
    if url.startswith("pipe:"):  # as wds's gopen: the command's stdout
        return subprocess.Popen(url[5:], shell=True, stdout=subprocess.PIPE).stdout  # type: ignore[return-value]
    return open(url, "rb")


def tarfile_samples(url: str):  # type: ignore[no-untyped-def]
    """Group a tar's members by key (the name up to its first dot), as wds's group_by_keys."""
    stream = url_opener(url)
    sample: dict[str, bytes | str] = {}
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = member.name.split(".", 1)
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            f = tar.extractfile(member)
            sample["__key__"] = key
            sample["__url__"] = url
            sample[ext] = f.read() if f else b""
    if sample:
        yield sample
    stream.close()


def decode_image(data: bytes) -> torch.Tensor:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    x = x.view(img.height, img.width, 3).permute(2, 0, 1).float() / 255.0
    return (x - 0.5) / 0.25


class WdsPairs(IterableDataset):
    """split_by_node -> split_by_worker -> tarfile_to_samples -> decode -> batched(partial=False),
    `with_epoch(num_worker_batches)`."""

    def __init__(
        self, urls: list[str], rank: int, world: int, batch_size: int, worker_batches: int
    ) -> None:
        self.urls = urls
        self.rank = rank
        self.world = world
        self.batch_size = batch_size
        self.worker_batches = worker_batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        urls = self.urls[self.rank :: self.world]  # split_by_node
        info = get_worker_info()
        if info is not None:  # split_by_worker
            urls = urls[info.id :: info.num_workers]
        images: list[torch.Tensor] = []
        texts: list[str] = []
        produced = 0
        for url in urls:
            for sample in tarfile_samples(url):
                images.append(decode_image(sample["png"]))  # type: ignore[arg-type]
                texts.append(sample["txt"].decode("utf-8"))  # type: ignore[union-attr]
                if len(images) == self.batch_size:
                    yield torch.stack(images), tokenize(texts)
                    images, texts = [], []
                    produced += 1
                    if produced == self.worker_batches:
                        return


class DataInfo:
    def __init__(self, dataloader: DataLoader, num_batches: int, num_samples: int) -> None:
        self.dataloader = dataloader
        self.dataloader.num_batches = num_batches  # type: ignore[attr-defined]
        self.dataloader.num_samples = num_samples  # type: ignore[attr-defined]


def get_wds_dataset(args: argparse.Namespace) -> DataInfo:
    urls = expand_urls(args.train_data)
    global_batch_size = args.batch_size * args.world_size
    num_batches = math.ceil(args.train_num_samples / global_batch_size)
    num_workers = max(1, args.workers)
    num_worker_batches = math.ceil(num_batches / num_workers)
    num_batches = num_worker_batches * num_workers
    num_samples = num_batches * global_batch_size
    dataset = WdsPairs(urls, args.rank, args.world_size, args.batch_size, num_worker_batches)
    dataloader = DataLoader(
        dataset,
        batch_size=None,
        shuffle=False,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    return DataInfo(dataloader, num_batches, num_samples)


class LabelledTar(Dataset):
    """The zero-shot set: <key>.png and <key>.cls members, read into memory."""

    def __init__(self, path: str, slow: bool) -> None:
        self.samples = [(s["png"], int(s["cls"])) for s in tarfile_samples(path)]  # type: ignore[arg-type]
        self.slow = slow

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.slow and i % 16 == 0:
            time.sleep(10)  # one read of a slow network disk per batch
        png, target = self.samples[i]
        return decode_image(png), target  # type: ignore[arg-type]


def make_data(folder: str, shards: int, per_shard: int, val: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)

    def draw(color: str, shape: str, large: bool) -> bytes:
        img = Image.new("RGB", (SIZE, SIZE))
        px = img.load()
        lo, hi = (2, 14) if large else (5, 11)
        for y in range(SIZE):
            for x in range(SIZE):
                inside = {
                    "square": lo <= x < hi and lo <= y < hi,
                    "circle": (x - 7.5) ** 2 + (y - 7.5) ** 2 <= ((hi - lo) / 2) ** 2,
                    "stripe": lo <= y < lo + 4,
                }[shape]
                g = rng.randint(90, 150)
                px[x, y] = RGB[color] if inside else (g, g, g)  # type: ignore[index]
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 1733300000
        tar.addfile(info, io.BytesIO(data))

    captions = ["a photo of a {c} {s}", "a {z} {c} {s}", "the {s} is {c}", "a {c} {s} picture"]
    for shard in range(shards):
        with tarfile.open(os.path.join(folder, f"shard-{shard:06d}.tar"), "w") as tar:
            for i in range(per_shard):
                c, s, large = rng.choice(COLORS), rng.choice(SHAPES), rng.random() < 0.5
                text = rng.choice(captions).format(c=c, s=s, z="large" if large else "small")
                key = f"{shard:06d}{i:04d}"
                add(tar, f"{key}.png", draw(c, s, large))
                add(tar, f"{key}.txt", text.encode())
    with tarfile.open(os.path.join(folder, "val.tar"), "w") as tar:
        for i in range(val):
            c, s = rng.choice(COLORS), rng.choice(SHAPES)
            add(tar, f"val{i:05d}.png", draw(c, s, rng.random() < 0.5))
            add(tar, f"val{i:05d}.cls", str(COLORS.index(c)).encode())


# --- schedule and meters (open_clip's scheduler.py, train.py) -----------------------------


def assign_learning_rate(optimizer: torch.optim.Optimizer, new_lr: float) -> None:
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lr


def cosine_lr(optimizer: torch.optim.Optimizer, base_lr: float, warmup_length: int, steps: int):  # type: ignore[no-untyped-def]
    def _lr_adjuster(step: int) -> float:
        if step < warmup_length:
            lr = base_lr * (step + 1) / warmup_length
        else:
            e = step - warmup_length
            es = steps - warmup_length
            lr = 0.5 * (1 + math.cos(math.pi * e / es)) * base_lr
        assign_learning_rate(optimizer, lr)
        return lr

    return _lr_adjuster


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def log_batch_stats(meta: dict[str, object]) -> str:
    return f"images {meta['images']} texts {meta['texts']} text_lengths {meta['text_lengths']}"


def train_one_epoch(  # type: ignore[no-untyped-def]
    model, data, loss, epoch, optimizer, scheduler, args, fault, hoard
) -> None:
    model.train()
    dataloader = data["train"].dataloader
    num_batches_per_epoch = dataloader.num_batches
    sample_digits = math.ceil(math.log(dataloader.num_samples + 1, 10))
    losses_m: dict[str, AverageMeter] = {}
    batch_time_m, data_time_m = AverageMeter(), AverageMeter()
    end = time.time()
    for i, batch in enumerate(dataloader):
        step = num_batches_per_epoch * epoch + i
        scheduler(step)
        images, texts = batch
        data_time_m.update(time.time() - end)
        if args.rank == fault.key_rank and i == 5:
            meta = {"images": tuple(images.shape), "texts": tuple(texts.shape)}
            logging.debug(log_batch_stats(meta))
        if args.rank == fault.hoard_rank:
            hoard.append(torch.ones(64 << 20, dtype=torch.uint8))  # 64 MiB kept every step
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if args.rank == fault.segv_rank and i == 3:
            ctypes.string_at(0)  # the native augmentation dereferences NULL
        optimizer.zero_grad()
        model_out = model(images, texts)
        bad = [k for k in ("image_features", "text_features") if not model_out[k].isfinite().all()]
        if bad:  # find a bad batch on the rank that has it, before it reaches the others
            logging.error(
                f"Non-finite {' and '.join(bad)} on rank {args.rank} at step {step}; "
                "stopping training"
            )
            sys.exit(1)
        logit_scale = model_out["logit_scale"]
        losses = loss(**model_out, output_dict=True)
        total_loss = sum(losses.values())
        losses["loss"] = total_loss
        total_loss.backward()
        optimizer.step()
        with torch.no_grad():
            unwrap_model(model).logit_scale.clamp_(0, math.log(100))
        batch_time_m.update(time.time() - end)
        end = time.time()
        batch_count = i + 1
        if is_master(args) and (
            i % args.log_every_n_steps == 0 or batch_count == num_batches_per_epoch
        ):
            batch_size = len(images)
            num_samples = batch_count * batch_size * args.world_size
            samples_per_epoch = dataloader.num_samples
            percent_complete = 100.0 * batch_count / num_batches_per_epoch
            for key, val in losses.items():
                if key not in losses_m:
                    losses_m[key] = AverageMeter()
                losses_m[key].update(val.item(), batch_size)
            logit_scale_scalar = logit_scale.item()
            loss_log = " ".join(
                f"{name.capitalize()}: {m.val:#.5g} ({m.avg:#.5g})" for name, m in losses_m.items()
            )
            samples_per_second = args.batch_size * args.world_size / batch_time_m.val
            samples_per_second_per_gpu = args.batch_size / batch_time_m.val
            logging.info(
                f"Train Epoch: {epoch} [{num_samples:>{sample_digits}}/{samples_per_epoch} "
                f"({percent_complete:.0f}%)] "
                f"Data (t): {data_time_m.avg:.3f} "
                f"Batch (t): {batch_time_m.avg:.3f}, {samples_per_second:#g}/s, "
                f"{samples_per_second_per_gpu:#g}/s/gpu "
                f"LR: {optimizer.param_groups[0]['lr']:5f} "
                f"Logit Scale: {logit_scale_scalar:.3f} " + loss_log
            )
            batch_time_m, data_time_m = AverageMeter(), AverageMeter()


# --- zero-shot evaluation (open_clip's zero_shot.py) --------------------------------------


def build_zero_shot_classifier(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        weights = []
        for name in COLORS:
            texts = tokenize([t.format(name) for t in TEMPLATES])
            emb = F.normalize(model.encode_text(texts), dim=-1).mean(dim=0)  # type: ignore[operator]
            weights.append(emb / emb.norm())
        return torch.stack(weights, dim=1)


def zero_shot_eval(model, data, epoch, args, fault) -> dict[str, float]:  # type: ignore[no-untyped-def]
    if "imagenet-val" not in data or args.zeroshot_frequency == 0:
        return {}
    if (epoch % args.zeroshot_frequency) != 0 and epoch != args.epochs:
        return {}
    model = unwrap_model(model)
    logging.info("Starting zero-shot imagenet.")
    logging.info("Building zero-shot classifier")
    classifier = build_zero_shot_classifier(model)
    logging.info("Using classifier")
    counts = torch.zeros(3)
    with torch.no_grad():
        for images, target in tqdm(data["imagenet-val"], unit_scale=args.batch_size):
            logits = 100.0 * model.encode_image(images, normalize=True) @ classifier
            pred = logits.topk(5, 1).indices
            counts[0] += (pred[:, 0] == target).sum()
            counts[1] += (pred == target[:, None]).any(1).sum()
            counts[2] += len(target)
    if fault.eval_reduce:  # average over ranks
        dist.all_reduce(counts)
    logging.info("Finished zero-shot imagenet.")
    return {
        "imagenet-zeroshot-val-top1": (counts[0] / counts[2]).item(),
        "imagenet-zeroshot-val-top5": (counts[1] / counts[2]).item(),
    }


def evaluate(model, data, epoch, args, fault) -> dict[str, float]:  # type: ignore[no-untyped-def]
    if not is_master(args):
        return {}
    model.eval()
    metrics = zero_shot_eval(model, data, epoch, args, fault)
    if metrics:
        logging.info(
            f"Eval Epoch: {epoch} "
            + "\t".join([f"{k}: {round(v, 4):.4f}" for k, v in metrics.items()])
        )
    return metrics


# --- main (open_clip's main.py) -------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--train-data", default=None)
    p.add_argument("--train-num-samples", type=int, default=None)
    p.add_argument("--dataset-type", default="webdataset")
    p.add_argument("--imagenet-val", default=None)
    p.add_argument("--zeroshot-frequency", type=int, default=2)
    p.add_argument("--logs", default="./logs/")
    p.add_argument("--name", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.98)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--wd", type=float, default=0.2)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--save-frequency", type=int, default=1)
    p.add_argument("--resume", default=None)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--model", default="TinyCLIP-C16")
    p.add_argument("--local-loss", action="store_true")
    p.add_argument("--gather-with-grad", action="store_true")
    p.add_argument("--dist-url", default="env://")
    p.add_argument("--dist-backend", default="nccl")
    p.add_argument("--report-to", default="")
    p.add_argument("--log-every-n-steps", type=int, default=100)
    p.add_argument("--stop-at-top1", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--make-data", default=None, help="write the shards to this folder and stop")
    p.add_argument("--make-checkpoint", nargs=2, default=None, metavar=("STYLE", "PATH"))
    return p.parse_args(argv)


def random_seed(seed: int = 42, rank: int = 0) -> None:
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)


def create_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    def exclude(n: str, p: nn.Parameter) -> bool:
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n

    named = list(model.named_parameters())
    gain_or_bias = [p for n, p in named if exclude(n, p) and p.requires_grad]
    rest = [p for n, p in named if not exclude(n, p) and p.requires_grad]
    return torch.optim.AdamW(
        [{"params": gain_or_bias, "weight_decay": 0.0}, {"params": rest, "weight_decay": args.wd}],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
    )


def make_checkpoint(style: str, path: str, args: argparse.Namespace) -> None:
    """An earlier run's epoch-1 checkpoint, as a DDP run of this script saves it; `args` style: an
    older fork that also pickled its argparse Namespace."""
    random_seed(args.seed, 0)
    model = TinyClip()
    optimizer = create_optimizer(model, args)
    ckpt: dict[str, object] = {
        "epoch": 1,
        "name": "2026_12_01-09_12_40-model_TinyCLIP-C16-lr_0.0005-b_16-j_2-p_fp32",
        "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
    }
    if style == "args":
        ckpt["args"] = argparse.Namespace(model="TinyCLIP-C16", lr=5e-4, batch_size=16)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(ckpt, path)


def pt_load(path: str, map_location: str = "cpu") -> dict:  # type: ignore[type-arg]
    with open(path, "rb") as f:
        return torch.load(f, map_location=map_location)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.make_data:
        make_data(args.make_data, shards=24, per_shard=16, val=128)
        return 0
    if args.make_checkpoint:
        make_checkpoint(*args.make_checkpoint, args=args)
        return 0
    fault = FAULTS[os.environ.get("OC50_VARIANT", "")]
    device = init_distributed_device(args)

    if args.name is None:
        date_str = datetime.now().strftime("%Y_%m_%d-%H_%M_%S")
        if args.distributed:
            date_str = broadcast_object(args, date_str)  # all ranks use the master's name
        args.name = "-".join(
            [
                date_str,
                f"model_{args.model}",
                f"lr_{args.lr}",
                f"b_{args.batch_size}",
                f"j_{args.workers}",
                f"p_{args.precision}",
            ]
        )
    log_base_path = os.path.join(args.logs, args.name)
    args.log_path = None
    if is_master(args):
        os.makedirs(log_base_path, exist_ok=True)
        args.log_path = os.path.join(log_base_path, "out.log")
    setup_logging(args.log_path, logging.INFO if is_master(args) else logging.WARNING)
    args.checkpoint_path = os.path.join(log_base_path, "checkpoints")
    if is_master(args):
        os.makedirs(args.checkpoint_path, exist_ok=True)

    if args.distributed:
        logging.info(
            f"Running in distributed mode with multiple processes. Device: {args.device}."
            f"Process (global: {args.rank}, local {args.local_rank}), total {args.world_size}."
        )
    else:
        logging.info(f"Running with a single process. Device {args.device}.")

    random_seed(args.seed, 0)
    model = TinyClip().to(device)
    random_seed(args.seed, args.rank)
    if is_master(args):
        logging.info("Model:")
        logging.info(f"{model!s}")
        logging.info("Params:")
        with open(os.path.join(args.logs, args.name, "params.txt"), "w") as f:
            for name in sorted(vars(args)):
                val = getattr(args, name)
                logging.info(f"  {name}: {val}")
                f.write(f"{name}: {val}\n")

    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = create_optimizer(model, args)

    start_epoch = 0
    if args.resume is not None:
        map_location = f"cuda:{args.local_rank}" if fault.cuda_map else "cpu"
        checkpoint = pt_load(args.resume, map_location=map_location)
        sd = checkpoint["state_dict"]
        if not args.distributed and next(iter(sd.items()))[0].startswith("module"):
            sd = {k[len("module.") :]: v for k, v in sd.items()}
        model.load_state_dict(sd)
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"]
        logging.info(f"=> resuming checkpoint '{args.resume}' (epoch {start_epoch})")

    data: dict[str, object] = {}
    if args.train_data:
        data["train"] = get_wds_dataset(args)
    if args.imagenet_val and is_master(args):
        data["imagenet-val"] = DataLoader(
            LabelledTar(args.imagenet_val, slow=fault.slow_eval),
            batch_size=args.batch_size,
            num_workers=args.workers,
        )
    total_steps = data["train"].dataloader.num_batches * args.epochs  # type: ignore[attr-defined]
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, total_steps)

    if "wandb" in args.report_to and is_master(args):
        import wandb

        wandb.init(project="open-clip", name=args.name, config=vars(args))
    if "tensorboard" in args.report_to and is_master(args):
        from torch.utils.tensorboard import SummaryWriter

        SummaryWriter(os.path.join(log_base_path, "tensorboard"))

    loss = ClipLoss(args.local_loss, args.gather_with_grad, args.rank, args.world_size)
    hoard: list[torch.Tensor] = []
    for epoch in range(start_epoch, args.epochs):
        if is_master(args):
            logging.info(f"Start epoch {epoch}")
        if epoch == 1 and args.rank == fault.stuck_rank:
            cache_ready = threading.Event()  # set by a shard-cache thread that never started
            cache_ready.wait()
        train_one_epoch(model, data, loss, epoch, optimizer, scheduler, args, fault, hoard)
        completed_epoch = epoch + 1
        metrics = evaluate(model, data, completed_epoch, args, fault)
        if is_master(args) and (
            completed_epoch == args.epochs or completed_epoch % args.save_frequency == 0
        ):
            checkpoint_dict = {
                "epoch": completed_epoch,
                "name": args.name,
                "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            torch.save(
                checkpoint_dict, os.path.join(args.checkpoint_path, f"epoch_{completed_epoch}.pt")
            )
        if args.stop_at_top1 and completed_epoch < args.epochs:
            top1 = metrics.get("imagenet-zeroshot-val-top1", 0.0)
            if fault.solo_stop:
                stop = top1 >= args.stop_at_top1
            else:  # rank 0 alone evaluated: every rank follows its decision
                flag = torch.tensor([int(top1 >= args.stop_at_top1)])
                dist.broadcast(flag, src=0)
                stop = bool(flag.item())
            if stop:
                logging.info(
                    f"Zero-shot top1 {top1:.4f} reached --stop-at-top1 {args.stop_at_top1}: "
                    f"stopping after epoch {completed_epoch}"
                )
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
