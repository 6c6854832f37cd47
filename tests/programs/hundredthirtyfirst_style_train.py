"""A hundred-and-thirty-first training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyfirst-*): vision-language pretraining in the way of
salesforce/LAVIS (BLIP-2 stage 1: `python -m torch.distributed.run --nproc_per_node=2 train.py
--cfg-path lavis/projects/blip2/train/pretrain_stage1.yaml`), re-created in plain torch without
lavis installed. LAVIS's train.py (job_id = now(), Config from --cfg-path with --options
key=value overrides, init_distributed_mode printing '| distributed init (rank R, world W):
env://' on every rank and setup_for_distributed silencing print on the others, setup_logger at
INFO on rank 0 and WARN elsewhere, cfg.pretty_print's JSON dumps), a task that builds the
coco_caption dataset ('Building datasets...', the annotation split across ranks as LAVIS's
webdataset builders split shards by node), a tiny Blip2Qformer (a frozen conv image encoder,
query tokens cross-attending to its patches, a hashed-word text encoder; image-text contrastive
loss over features gathered with concat_all_gather, image-text matching with hard negatives
drawn by torch.multinomial), the RunnerBase loop (MetricLogger 'Train: data epoch: [N]' lines,
'Averaged stats: ...', rank 0's log.txt in output_dir/<job_id>, 'Saving checkpoint at epoch N
to ...', 'Evaluating on val.', 'Training time ...'), the linear_warmup_cosine_lr scheduler and
run.resume_ckpt_path. gloo on CPU with a 15 s collective timeout. A fault in the code is chosen
by the TQ_CASE environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_hundredthirtyfirst.sh after any edit).
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import datetime
import json
import logging
import math
import os
import random
import re
import signal
import threading
import time
import zlib
from collections import defaultdict, deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    overflow_rank: int = -1  # this rank's text-to-image similarities overflow to inf (epoch 1)
    hoard_rank: int = -1  # this rank keeps every step's image embeddings until the OOM killer acts
    segv_rank: int = -1  # this rank's native batch augmentation reads address 0
    audit_rank: int = -1  # this rank re-verifies its shard's images before epoch 1
    stuck_rank: int = -1  # this rank waits for a prefetch thread that was never started
    main_eval: bool = False  # validation only on the main process


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "n1": Fault(overflow_rank=1),
    "h1": Fault(hoard_rank=1),
    "s1": Fault(segv_rank=1),
    "a1": Fault(audit_rank=1),
    "w1": Fault(stuck_rank=1),
    "e0": Fault(main_eval=True),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]


# ----------------------------------------------------------------------------- lavis/common
def now() -> str:
    return datetime.datetime.now().strftime("%Y%m%d%H%M")[:-1]


def is_dist_avail_and_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_dist_avail_and_initialized() else 1


def is_main_process() -> bool:
    return get_rank() == 0


def setup_for_distributed(is_master: bool) -> None:
    """Disables printing when not in the master process."""
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args: dict) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args["rank"] = int(os.environ["RANK"])
        args["world_size"] = int(os.environ["WORLD_SIZE"])
        args["gpu"] = int(os.environ["LOCAL_RANK"])
    else:
        print("Not using distributed mode")
        args["distributed"] = False
        return
    args["distributed"] = True
    args["dist_backend"] = "gloo"
    print(
        "| distributed init (rank {}, world {}): {}".format(
            args["rank"], args["world_size"], args["dist_url"]
        ),
        flush=True,
    )
    dist.init_process_group(
        backend=args["dist_backend"],
        init_method=args["dist_url"],
        world_size=args["world_size"],
        rank=args["rank"],
        timeout=datetime.timedelta(seconds=15),
    )
    dist.barrier()
    setup_for_distributed(args["rank"] == 0)


def setup_logger() -> None:
    logging.basicConfig(
        level=logging.INFO if is_main_process() else logging.WARN,
        format="%(asctime)s [%(levelname)s] %(message)s",
        handlers=[logging.StreamHandler()],
    )


class Config:
    def __init__(self, args: argparse.Namespace) -> None:
        with open(args.cfg_path) as f:
            self.config = yaml.safe_load(f)
        for opt in args.options or []:
            key, value = opt.split("=", 1)
            node = self.config
            *parents, last = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = yaml.safe_load(value)

    @property
    def run_cfg(self) -> dict:
        return self.config["run"]

    @property
    def model_cfg(self) -> dict:
        return self.config["model"]

    @property
    def datasets_cfg(self) -> dict:
        return self.config["datasets"]

    def to_dict(self) -> dict:
        return self.config

    def pretty_print(self) -> None:
        logging.info("\n=====  Running Parameters    =====")
        logging.info(json.dumps(self.run_cfg, indent=4, sort_keys=True))
        logging.info("\n======  Dataset Attributes  ======")
        for name, dataset_config in self.datasets_cfg.items():
            logging.info(f"\n======== {name} =======")
            logging.info(json.dumps(dataset_config, indent=4, sort_keys=True))
        logging.info("\n======  Model Attributes  ======")
        logging.info(json.dumps(self.model_cfg, indent=4, sort_keys=True))


class SmoothedValue:
    def __init__(self, window_size: int = 20, fmt: str | None = None) -> None:
        self.deque: deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt or "{median:.4f} ({global_avg:.4f})"

    def update(self, value: float, n: int = 1) -> None:
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self) -> None:
        if not is_dist_avail_and_initialized():
            return
        t = torch.tensor([self.count, self.total], dtype=torch.float64)
        dist.barrier()
        dist.all_reduce(t)
        self.count = int(t[0].item())
        self.total = t[1].item()

    @property
    def median(self) -> float:
        return torch.tensor(list(self.deque)).median().item()

    @property
    def avg(self) -> float:
        return torch.tensor(list(self.deque), dtype=torch.float32).mean().item()

    @property
    def global_avg(self) -> float:
        return self.total / max(self.count, 1)

    @property
    def value(self) -> float:
        return self.deque[-1]

    def __str__(self) -> str:
        return self.fmt.format(
            median=self.median, avg=self.avg, global_avg=self.global_avg, value=self.value
        )


class MetricLogger:
    def __init__(self, delimiter: str = "\t") -> None:
        self.meters: dict[str, SmoothedValue] = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs: float) -> None:
        for k, v in kwargs.items():
            self.meters[k].update(float(v))

    def add_meter(self, name: str, meter: SmoothedValue) -> None:
        self.meters[name] = meter

    def __str__(self) -> str:
        return self.delimiter.join(f"{name}: {meter}" for name, meter in self.meters.items())

    def global_avg(self) -> str:
        return self.delimiter.join(
            f"{name}: {meter.global_avg:.4f}" for name, meter in self.meters.items()
        )

    def synchronize_between_processes(self) -> None:
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def log_every(self, iterable, print_freq: int, header: str = ""):
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
        print(
            f"{header} Total time: {total_time_str} ({total_time / max(len(iterable), 1):.4f} s / it)"
        )


# ----------------------------------------------------------------------------- processors
class BlipImageTrainProcessor:
    """Reads an image file (netpbm here: no PIL on the host), a random flip, normalisation."""

    def __init__(self, image_size: int = 32) -> None:
        self.image_size = image_size
        self.mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
        self.std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)

    def load(self, path: str) -> torch.Tensor:
        with open(path, "rb") as f:
            data = f.read()
        magic, size, maxval, pixels = data.split(b"\n", 3)
        if magic != b"P6":
            raise OSError(f"cannot identify image file '{path}'")
        w, h = (int(v) for v in size.split())
        image = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(h, w, 3)
        return image.permute(2, 0, 1).float() / float(maxval)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if random.random() < 0.5:
            image = image.flip(-1)
        return (image - self.mean) / self.std


class BlipCaptionProcessor:
    def __init__(self, prompt: str = "", max_words: int = 50) -> None:
        self.prompt = prompt
        self.max_words = max_words

    def __call__(self, caption: str) -> str:
        return self.prompt + self.pre_caption(caption)

    def pre_caption(self, caption: str) -> str:
        caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
        caption = re.sub(r"\s{2,}", " ", caption)
        caption = caption.rstrip("\n")
        caption = caption.strip(" ")
        caption_words = caption.split(" ")
        if len(caption_words) > self.max_words:
            caption = " ".join(caption_words[: self.max_words])
        if not len(caption):
            raise ValueError("pre_caption yields invalid text")
        return caption


# ----------------------------------------------------------------------------- datasets
class CaptionDataset(Dataset):
    def __init__(self, vis_processor, text_processor, vis_root: str, ann_path: str) -> None:
        with open(ann_path) as f:
            annotation = json.load(f)
        # each rank reads its own part of the annotation, as the webdataset builders split the
        # shards by node
        self.annotation = annotation[get_rank() :: get_world_size()]
        self.vis_root = vis_root
        self.vis_processor = vis_processor
        self.text_processor = text_processor

    def __len__(self) -> int:
        return len(self.annotation)

    def __getitem__(self, index: int) -> dict:
        ann = self.annotation[index]
        image_path = os.path.join(self.vis_root, ann["image"])
        image = self.vis_processor(self.vis_processor.load(image_path))
        caption = self.text_processor(ann["caption"])
        return {"image": image, "text_input": caption, "image_id": ann["image_id"]}

    def collater(self, samples: list[dict]) -> dict:
        return {
            "image": torch.stack([s["image"] for s in samples]),
            "text_input": [s["text_input"] for s in samples],
            "image_id": [s["image_id"] for s in samples],
        }


class ImageTextPretrainTask:
    def build_datasets(self, cfg: Config) -> dict:
        datasets = {}
        for name, dataset_config in cfg.datasets_cfg.items():
            logging.info("Building datasets...")
            root = dataset_config["build_info"]["images"]["storage"]
            vis_size = dataset_config["vis_processor"]["train"]["image_size"]
            max_words = dataset_config["text_processor"]["train"].get("max_words", 50)
            splits = {}
            for split, info in dataset_config["build_info"]["annotations"].items():
                splits[split] = CaptionDataset(
                    BlipImageTrainProcessor(vis_size),
                    BlipCaptionProcessor(max_words=max_words),
                    root,
                    info["storage"],
                )
            datasets[name] = splits
        return datasets

    def build_model(self, cfg: Config) -> nn.Module:
        m = cfg.model_cfg
        return Blip2Qformer(
            num_query_token=m["num_query_token"],
            embed_dim=m["embed_dim"],
            freeze_vit=m.get("freeze_vit", True),
        )

    def train_step(self, model, samples: dict) -> torch.Tensor:
        return model(samples)["loss"]

    def valid_step(self, model, samples: dict) -> dict:
        m = model.module if isinstance(model, DDP) else model
        with torch.no_grad():
            image_feats, text_feat = m.extract_features(samples)
            image_feats_all = concat_all_gather(image_feats)
            text_feat_all = concat_all_gather(text_feat)
        sim_i2t = torch.einsum("bqe,ne->bnq", image_feats, text_feat_all).max(-1).values
        sim_t2i = torch.einsum("be,nqe->bnq", text_feat, image_feats_all).max(-1).values
        bs = image_feats.size(0)
        targets = torch.arange(bs) + get_rank() * bs
        return {
            "i2t": (sim_i2t.argmax(1) == targets).sum().item(),
            "t2i": (sim_t2i.argmax(1) == targets).sum().item(),
            "n": bs,
        }

    def evaluation(self, model, data_loader) -> dict:
        metric_logger = MetricLogger(delimiter="  ")
        header = "Evaluation"
        totals = torch.zeros(3, dtype=torch.float64)
        for samples in metric_logger.log_every(data_loader, 10, header):
            out = self.valid_step(model, samples)
            totals += torch.tensor([out["i2t"], out["t2i"], out["n"]], dtype=torch.float64)
        if is_dist_avail_and_initialized():
            dist.all_reduce(totals)
        txt_r1 = 100.0 * totals[0].item() / totals[2].item()
        img_r1 = 100.0 * totals[1].item() / totals[2].item()
        return {"txt_r1": txt_r1, "img_r1": img_r1, "agg_metrics": (txt_r1 + img_r1) / 2}


# ----------------------------------------------------------------------------- model
@torch.no_grad()
def concat_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Performs all_gather operation on the provided tensors.
    *** Warning ***: torch.distributed.all_gather has no gradient."""
    if not is_dist_avail_and_initialized():
        return tensor
    tensors_gather = [torch.ones_like(tensor) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(tensors_gather, tensor, async_op=False)
    output = torch.cat(tensors_gather, dim=0)
    return output


def tokenize(texts: list[str], vocab: int = 1024, max_len: int = 16) -> torch.Tensor:
    ids = torch.zeros(len(texts), max_len, dtype=torch.long)
    for k, text in enumerate(texts):
        words = [1 + zlib.crc32(w.encode()) % (vocab - 1) for w in text.split()][:max_len]
        ids[k, : len(words)] = torch.tensor(words)
    return ids


class Blip2Qformer(nn.Module):
    def __init__(self, num_query_token: int = 16, embed_dim: int = 32, freeze_vit: bool = True):
        super().__init__()
        width = 48
        self.visual_encoder = nn.Conv2d(3, width, kernel_size=8, stride=8)  # 16 patches
        self.ln_vision = nn.LayerNorm(width)
        if freeze_vit:
            for p in self.visual_encoder.parameters():
                p.requires_grad = False
            self.visual_encoder.eval()
            logging.info("freeze vision encoder")
        self.query_tokens = nn.Parameter(torch.zeros(1, num_query_token, width))
        self.query_tokens.data.normal_(mean=0.0, std=0.02)
        self.crossattention = nn.MultiheadAttention(width, 4, batch_first=True)
        self.ffn = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.word_embeddings = nn.EmbeddingBag(1024, width, mode="mean", padding_idx=0)
        self.vision_proj = nn.Linear(width, embed_dim)
        self.text_proj = nn.Linear(width, embed_dim)
        self.itm_head = nn.Linear(2 * width, 2)
        self.temp = nn.Parameter(0.07 * torch.ones([]))
        self.hoard: list[torch.Tensor] = []

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            patches = self.visual_encoder(image).flatten(2).transpose(1, 2)
        return self.ln_vision(patches)

    def qformer(self, image_embeds: torch.Tensor) -> torch.Tensor:
        query = self.query_tokens.expand(image_embeds.size(0), -1, -1)
        out, _ = self.crossattention(query, image_embeds, image_embeds)
        return out + self.ffn(out)

    def extract_features(self, samples: dict) -> tuple[torch.Tensor, torch.Tensor]:
        image_embeds = self.encode_image(samples["image"])
        query_output = self.qformer(image_embeds)
        image_feats = F.normalize(self.vision_proj(query_output), dim=-1)
        text_embeds = self.word_embeddings(tokenize(samples["text_input"]))
        text_feat = F.normalize(self.text_proj(text_embeds), dim=-1)
        return image_feats, text_feat

    def forward(self, samples: dict) -> dict:
        image = samples["image"]
        image_embeds = self.encode_image(image)
        query_output = self.qformer(image_embeds)
        image_feats = F.normalize(self.vision_proj(query_output), dim=-1)
        text_embeds = self.word_embeddings(tokenize(samples["text_input"]))
        text_feat = F.normalize(self.text_proj(text_embeds), dim=-1)
        rank = get_rank()
        epoch, it = samples["epoch"], samples["iters"]
        if rank == FAULT.hoard_rank and epoch == 1:
            self.hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(self.hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

        ###============== Image-text Contrastive ===================###
        image_feats_all = concat_all_gather(image_feats)  # [batch_size*num_gpu, num_query, dim]
        text_feat_all = concat_all_gather(text_feat)  # [batch_size*num_gpu, embed_dim]
        sim_q2t = torch.matmul(image_feats.unsqueeze(1), text_feat_all.unsqueeze(-1)).squeeze()
        sim_i2t, _ = sim_q2t.max(-1)
        sim_i2t = sim_i2t / self.temp
        sim_t2q = torch.matmul(
            text_feat.unsqueeze(1).unsqueeze(1), image_feats_all.permute(0, 2, 1)
        ).squeeze()
        sim_t2i, _ = sim_t2q.max(-1)
        sim_t2i = sim_t2i / self.temp
        if rank == FAULT.overflow_rank and epoch == 1 and it == 3:
            sim_t2i = sim_t2i * float("inf")
        bs = image.size(0)
        targets = torch.linspace(rank * bs, rank * bs + bs - 1, bs, dtype=int)
        loss_itc = (
            F.cross_entropy(sim_i2t, targets, label_smoothing=0.1)
            + F.cross_entropy(sim_t2i, targets, label_smoothing=0.1)
        ) / 2

        ###============== Image-text Matching ===================###
        with torch.no_grad():
            weights_t2i = F.softmax(sim_t2i[:, rank * bs : rank * bs + bs], dim=1) + 1e-4
            weights_t2i.fill_diagonal_(0)
            weights_i2t = F.softmax(sim_i2t[:, rank * bs : rank * bs + bs], dim=1) + 1e-4
            weights_i2t.fill_diagonal_(0)
        # select a negative image for each text
        image_embeds_neg = []
        for b in range(bs):
            neg_idx = torch.multinomial(weights_t2i[b], 1).item()
            image_embeds_neg.append(image_embeds[neg_idx])
        image_embeds_neg = torch.stack(image_embeds_neg, dim=0)
        # select a negative text for each image
        text_embeds_neg = []
        for b in range(bs):
            neg_idx = torch.multinomial(weights_i2t[b], 1).item()
            text_embeds_neg.append(text_embeds[neg_idx])
        text_embeds_neg = torch.stack(text_embeds_neg, dim=0)
        image_all = torch.cat([image_embeds, image_embeds_neg, image_embeds], dim=0)
        text_all = torch.cat([text_embeds, text_embeds, text_embeds_neg], dim=0)
        query_itm = self.qformer(image_all).mean(1)
        logits = self.itm_head(torch.cat([query_itm, text_all], dim=1))
        itm_labels = torch.cat(
            [torch.ones(bs, dtype=torch.long), torch.zeros(2 * bs, dtype=torch.long)], dim=0
        )
        loss_itm = F.cross_entropy(logits, itm_labels)
        return {"loss": loss_itc + loss_itm, "loss_itc": loss_itc, "loss_itm": loss_itm}


# ----------------------------------------------------------------------------- runner
class LinearWarmupCosineLRScheduler:
    def __init__(self, optimizer, max_epoch, min_lr, init_lr, warmup_steps=0, warmup_start_lr=-1):
        self.optimizer = optimizer
        self.max_epoch = max_epoch
        self.min_lr = min_lr
        self.init_lr = init_lr
        self.warmup_steps = warmup_steps
        self.warmup_start_lr = warmup_start_lr if warmup_start_lr >= 0 else init_lr

    def step(self, cur_epoch: int, cur_step: int) -> None:
        if cur_epoch == 0 and cur_step < self.warmup_steps:
            lr = self.warmup_start_lr + (self.init_lr - self.warmup_start_lr) * cur_step / max(
                1, self.warmup_steps
            )
        else:
            lr = (self.init_lr - self.min_lr) * 0.5 * (
                1.0 + math.cos(math.pi * cur_epoch / self.max_epoch)
            ) + self.min_lr
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr


class RunnerBase:
    def __init__(self, cfg: Config, task, model, datasets, job_id: str) -> None:
        self.config = cfg
        self.job_id = job_id
        self.task = task
        self.datasets = datasets
        self._model = model
        self._wrapped_model = None
        self._optimizer = None
        self._scaler = None
        self.start_epoch = 0
        self.setup_output_dir()

    @property
    def run_cfg(self) -> dict:
        return self.config.run_cfg

    @property
    def use_distributed(self) -> bool:
        return bool(self.run_cfg.get("distributed")) and is_dist_avail_and_initialized()

    @property
    def model(self) -> nn.Module:
        if self.use_distributed:
            if self._wrapped_model is None:
                self._wrapped_model = DDP(self._model)
            return self._wrapped_model
        return self._model

    def unwrap_dist_model(self, model):
        return model.module if self.use_distributed else model

    @property
    def optimizer(self):
        if self._optimizer is None:
            num_parameters = 0
            p_wd, p_non_wd = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                if p.ndim < 2 or "bias" in n or "ln" in n or "bn" in n:
                    p_non_wd.append(p)
                else:
                    p_wd.append(p)
                num_parameters += p.data.nelement()
            logging.info(f"number of trainable parameters: {num_parameters}")
            optim_params = [
                {"params": p_wd, "weight_decay": float(self.run_cfg["weight_decay"])},
                {"params": p_non_wd, "weight_decay": 0},
            ]
            beta2 = self.run_cfg.get("beta2", 0.999)
            self._optimizer = torch.optim.AdamW(
                optim_params,
                lr=float(self.run_cfg["init_lr"]),
                weight_decay=float(self.run_cfg["weight_decay"]),
                betas=(0.9, beta2),
            )
        return self._optimizer

    @property
    def scaler(self):
        amp = self.run_cfg.get("amp", False)
        if amp and self._scaler is None:
            self._scaler = torch.cuda.amp.GradScaler()
        return self._scaler

    @property
    def lr_scheduler(self) -> LinearWarmupCosineLRScheduler:
        if not hasattr(self, "_lr_sched"):
            assert self.run_cfg["lr_sched"] == "linear_warmup_cosine_lr"
            self._lr_sched = LinearWarmupCosineLRScheduler(
                optimizer=self.optimizer,
                max_epoch=int(self.run_cfg["max_epoch"]),
                min_lr=float(self.run_cfg["min_lr"]),
                init_lr=float(self.run_cfg["init_lr"]),
                warmup_steps=int(self.run_cfg.get("warmup_steps", 0)),
                warmup_start_lr=float(self.run_cfg.get("warmup_lr", -1)),
            )
        return self._lr_sched

    def create_loader(self, split: str, is_train: bool) -> DataLoader:
        dataset = next(iter(self.datasets.values()))[split]
        bsz = self.run_cfg["batch_size_train" if is_train else "batch_size_eval"]
        return DataLoader(
            dataset,
            batch_size=bsz,
            num_workers=self.run_cfg["num_workers"],
            pin_memory=False,
            shuffle=is_train,
            collate_fn=dataset.collater,
            drop_last=bool(self.run_cfg.get("train_drop_last", True)) if is_train else False,
        )

    @property
    def train_loader(self) -> DataLoader:
        if not hasattr(self, "_train_loader"):
            self._train_loader = self.create_loader(self.run_cfg["train_splits"][0], True)
        return self._train_loader

    def setup_output_dir(self) -> None:
        output_dir = os.path.join(os.getcwd(), self.run_cfg["output_dir"], self.job_id)
        os.makedirs(os.path.join(output_dir, "result"), exist_ok=True)
        self.output_dir = output_dir

    def log_config(self) -> None:
        if is_main_process():
            with open(os.path.join(self.output_dir, "log.txt"), "a") as f:
                f.write(json.dumps(self.config.to_dict(), indent=4) + "\n")

    def log_stats(self, stats: dict, split_name: str) -> None:
        if is_main_process():
            log_stats = {**{f"{split_name}_{k}": v for k, v in stats.items()}}
            with open(os.path.join(self.output_dir, "log.txt"), "a") as f:
                f.write(json.dumps(log_stats) + "\n")

    def train_epoch(self, epoch: int) -> dict:
        model = self.model
        model.train()
        self.unwrap_dist_model(model).visual_encoder.eval()
        data_loader = self.train_loader
        iters_per_epoch = len(data_loader)
        metric_logger = MetricLogger(delimiter="  ")
        metric_logger.add_meter("lr", SmoothedValue(window_size=1, fmt="{value:.6f}"))
        metric_logger.add_meter("loss", SmoothedValue(window_size=1, fmt="{value:.4f}"))
        logging.info(f"Start training epoch {epoch}, {iters_per_epoch} iters per inner epoch.")
        header = f"Train: data epoch: [{epoch}]"
        loader = iter(data_loader)
        rank = get_rank()
        if rank == FAULT.audit_rank and epoch == 1:
            for part in range(1, 9):
                logging.warning(
                    f"rank {rank}: verifying the images of this rank's shard "
                    f"against the annotation ({part}/8)"
                )
                time.sleep(5)
        for i in metric_logger.log_every(range(iters_per_epoch), 50, header):
            if rank == FAULT.stuck_rank and epoch == 1 and i == 2:
                ready = threading.Event()  # set by a prefetch thread that was never started
                ready.wait()
            samples = next(loader)
            if rank == FAULT.segv_rank and epoch == 1 and i == 2:
                ctypes.string_at(0)  # the native batch augmentation dereferences NULL
            samples.update({"epoch": epoch, "num_iters_per_epoch": iters_per_epoch, "iters": i})
            self.lr_scheduler.step(cur_epoch=epoch, cur_step=i)
            with torch.autocast("cuda", enabled=bool(self.run_cfg.get("amp", False))):
                loss = self.task.train_step(model, samples)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            self.optimizer.zero_grad()
            metric_logger.update(loss=loss.item())
            metric_logger.update(lr=self.optimizer.param_groups[0]["lr"])
        metric_logger.synchronize_between_processes()
        logging.info("Averaged stats: " + str(metric_logger.global_avg()))
        return {k: f"{meter.global_avg:.3f}" for k, meter in metric_logger.meters.items()}

    def eval_epoch(self, split_name: str, cur_epoch) -> dict:
        dataset = next(iter(self.datasets.values()))[split_name]
        loader = DataLoader(
            dataset,
            batch_size=self.run_cfg["batch_size_eval"],
            num_workers=self.run_cfg["num_workers"],
            shuffle=False,
            collate_fn=dataset.collater,
            drop_last=False,
        )
        model = self.model
        model.eval()
        return self.task.evaluation(model, loader)

    def _save_checkpoint(self, cur_epoch: int, is_best: bool = False) -> None:
        if not is_main_process():
            return
        model_no_ddp = self.unwrap_dist_model(self.model)
        param_grad_dic = {k: v.requires_grad for (k, v) in model_no_ddp.named_parameters()}
        state_dict = model_no_ddp.state_dict()
        for k in list(state_dict.keys()):
            if k in param_grad_dic and not param_grad_dic[k]:
                del state_dict[k]  # the frozen image encoder is not saved
        save_obj = {
            "model": state_dict,
            "optimizer": self.optimizer.state_dict(),
            "config": self.config.to_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "epoch": cur_epoch,
        }
        save_to = os.path.join(
            self.output_dir, "checkpoint_{}.pth".format("best" if is_best else cur_epoch)
        )
        logging.info(f"Saving checkpoint at epoch {cur_epoch} to {save_to}.")
        torch.save(save_obj, save_to)

    def _load_checkpoint(self, url_or_filename: str) -> None:
        if os.path.isfile(url_or_filename):
            checkpoint = torch.load(url_or_filename, map_location="cpu")
        else:
            raise RuntimeError("checkpoint url or path is invalid")
        state_dict = checkpoint["model"]
        self.unwrap_dist_model(self.model).load_state_dict(state_dict, strict=False)
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.scaler and "scaler" in checkpoint and checkpoint["scaler"]:
            self.scaler.load_state_dict(checkpoint["scaler"])
        self.start_epoch = checkpoint["epoch"] + 1
        print("resume the checkpoint")
        logging.info(f"Resume checkpoint from {url_or_filename}")

    def train(self) -> None:
        start_time = time.time()
        best_agg_metric = 0
        best_epoch = 0
        self.log_config()
        max_epoch = int(self.run_cfg["max_epoch"])
        resume = self.run_cfg.get("resume_ckpt_path")
        if not self.run_cfg.get("evaluate", False) and resume is not None:
            self._load_checkpoint(resume)
        valid_splits = self.run_cfg.get("valid_splits", [])
        for cur_epoch in range(self.start_epoch, max_epoch):
            logging.info("Start training")
            train_stats = self.train_epoch(cur_epoch)
            self.log_stats(split_name="train", stats=train_stats)
            self._save_checkpoint(cur_epoch, is_best=False)
            for split_name in valid_splits:
                if FAULT.main_eval and not is_main_process():
                    continue
                logging.info(f"Evaluating on {split_name}.")
                val_log = self.eval_epoch(split_name=split_name, cur_epoch=cur_epoch)
                if val_log is not None and is_main_process():
                    agg_metrics = val_log["agg_metrics"]
                    if agg_metrics > best_agg_metric and split_name == "val":
                        best_epoch, best_agg_metric = cur_epoch, agg_metrics
                    val_log.update({"best_epoch": best_epoch})
                    self.log_stats(val_log, split_name)
            if self.run_cfg.get("distributed"):
                dist.barrier()
        total_time = time.time() - start_time
        total_time_str = str(datetime.timedelta(seconds=int(total_time)))
        logging.info(f"Training time {total_time_str}")


# ----------------------------------------------------------------------------- train.py
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Training")
    parser.add_argument("--cfg-path", required=True, help="path to configuration file.")
    parser.add_argument(
        "--options",
        nargs="+",
        help="override some settings in the used config, the key-value pair "
        "in xxx=yyy format will be merged into config file (deprecate), "
        "change to --cfg-options instead.",
    )
    return parser.parse_args()


def setup_seeds(config: Config) -> None:
    seed = config.run_cfg["seed"] + get_rank()
    random.seed(seed)
    torch.manual_seed(seed)


def main() -> None:
    job_id = now()
    cfg = Config(parse_args())
    init_distributed_mode(cfg.run_cfg)
    setup_seeds(cfg)
    torch.set_num_threads(1)
    setup_logger()
    cfg.pretty_print()
    task = ImageTextPretrainTask()
    datasets = task.build_datasets(cfg)
    model = task.build_model(cfg)
    runner = RunnerBase(cfg=cfg, job_id=job_id, task=task, model=model, datasets=datasets)
    runner.train()


if __name__ == "__main__":
    main()
