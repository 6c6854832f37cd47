"""A sixth training-program style for the generalisation fixtures (tests/fixtures/real/fifth-*):
a token classifier trained the way Hugging Face Accelerate's examples are written (Accelerator
with gradient accumulation, `prepare`, `accumulate`, `backward`, `clip_grad_norm_`,
`gather_for_metrics`, `reduce`, `wait_for_everyone`, `set_trigger`/`check_trigger`,
`save_state`/`load_state`, `accelerator.print`, `accelerate.logging.get_logger` with its
`MM/DD/YYYY HH:MM:SS - LEVEL - name - msg` lines, a tqdm bar on the local main process only),
on CPU with gloo and a 15 s collective timeout. One real fault per --mode, named by what it does
so no output ever quotes the label. Captured by tests/fixtures/real/capture_fifth.sh:
re-capture after any edit (the fixtures quote its lines)."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import logging
import os
import signal
import threading
import time
import urllib.request
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import (
    DataLoaderConfiguration,
    InitProcessGroupKwargs,
    broadcast,
    broadcast_object_list,
    set_seed,
)
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

logger = get_logger("tokcls.train")

VOCAB = 64
CLASSES = 5
SEQ = 16
IGNORE = -100


@dataclass(frozen=True)
class Plan:
    """What goes wrong, where (rank None: nowhere)."""

    noisy: bool = False  # deprecated AMP API, a dashboard that refuses, one non-finite step
    stop_target: float | None = None  # early stop once a rank's validation loss is below it
    main_stops_alone: bool = False  # ... decided on the main process only, without the trigger
    report_table: bool = False  # the main process writes a per-class table after evaluation
    constant_sample_rank: int | None = None  # a sample with zero variance, anomaly mode on
    schedule_bcast: bool = False  # the main process broadcasts the schedule before the reduce
    flagged_rank: int | None = None  # finds flagged samples and announces them alone
    unlabelled_rank: int | None = None  # gets a batch without labels at a sync step
    prefetch_rank: int | None = None  # a prefetch thread that locks in the other order
    stale_index_rank: int | None = None  # rebuilds its sample index in the loop
    upload_retries: int = 0  # the main process uploads each checkpoint, backing off on errors
    oom_rank: int | None = None  # keeps every batch's activations until the kernel kills it
    segv_rank: int | None = None  # a C helper dereferences a null pointer
    pin_devices: bool = False  # torch.cuda.set_device(local index), as on a GPU box
    exact_eval: bool = False  # even_batches=False: no duplicated samples at the end
    ragged_rank: int | None = None  # a sequence one token too long reaches the collate


PLANS: dict[str, Plan] = {
    "baseline": Plan(),  # only capture_fifth.sh's checkpoint for the resume mode
    "noisy-ok": Plan(noisy=True),
    "trigger-stop": Plan(stop_target=100.0),
    "main-only-stop": Plan(stop_target=100.0, main_stops_alone=True),
    "report-format": Plan(report_table=True),
    "anomaly-nan": Plan(constant_sample_rank=1),
    "bcast-first": Plan(schedule_bcast=True),
    "object-one-rank": Plan(flagged_rank=1),
    "empty-batch-skip": Plan(unlabelled_rank=1),
    "abba": Plan(prefetch_rank=1),
    "index-rebuild": Plan(stale_index_rank=2),
    "slow-save": Plan(upload_retries=5),
    "torn-optimizer": Plan(),  # capture_fifth.sh passes --resume-from a cut checkpoint
    "oom-restart": Plan(oom_rank=1),
    "native-segv": Plan(segv_rank=3),
    "gpu-pin": Plan(pin_devices=True),
    "no-world": Plan(),  # started with plain python
    "tracker-one-node": Plan(),  # TRAIN_OPTIMIZER=adamw8bit on node 1, no bitsandbytes there
    "short-shard": Plan(exact_eval=True),
    "collate-record": Plan(ragged_rank=1),
}


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Synthetic token sequences; a token's class is its id modulo CLASSES."""

    def __init__(self, n: int, seed: int, constant: set[int], ragged: set[int]) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.features = torch.randn(n, SEQ, 4, generator=g)
        self.constant = constant
        self.ragged = ragged

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        feats = self.features[i]
        if i in self.constant:  # a sensor that reported the same value all along
            feats = torch.full_like(feats, 0.5)
        if i in self.ragged:  # the upstream tokenizer forgot to truncate this one
            ids = torch.cat([ids, ids[:1]])
            feats = torch.cat([feats, feats[:1]])
        feats = (feats - feats.mean()) / feats.std()  # per-sample standardisation
        return {"input_ids": ids, "features": feats, "labels": ids % CLASSES}


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.proj = nn.Linear(4, 32)
        self.mix = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.out = nn.Linear(32, CLASSES)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.proj(features)
        return self.out(h + self.mix(h))


class PrefetchCache:
    """Batches read ahead by a thread; hit/miss counters for the progress line."""

    def __init__(self, inverted: bool) -> None:
        self.cache_lock = threading.Lock()
        self.stats_lock = threading.Lock()
        self.hits = 0
        self.inverted = inverted  # the stats reader was written later, by someone else

    def refill(self) -> None:
        for _ in range(1000):
            with self.cache_lock:
                time.sleep(0.05)  # reading the next shard
                with self.stats_lock:
                    self.hits += 1
            time.sleep(0.01)

    def summary(self) -> str:
        with self.stats_lock:
            if self.inverted:
                time.sleep(0.05)  # formats the histogram first
                with self.cache_lock:  # and peeks at the cache size: the other lock order
                    return f"cache hits {self.hits}"
            return f"cache hits {self.hits}"


def rebuild_index(rank: int, seconds: float) -> int:
    """Hashes every sample id again, as after a dataset version change."""
    logger.warning(
        "sample index on this process is stale (dataset revision changed); rebuilding it",
        main_process_only=False,
    )
    digest = hashlib.sha256()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        digest.update(n.to_bytes(8, "little"))
        n += 1
    logger.warning(f"sample index rebuilt: {n} entries", main_process_only=False)
    return n


def upload(path: str, retries: int) -> None:
    """Pushes a checkpoint to the artifact store, backing off exponentially on failure."""
    delay = 1.0
    for attempt in range(1, retries + 1):
        try:
            urllib.request.urlopen("http://127.0.0.1:9/artifacts", data=path.encode(), timeout=5)
            return
        except OSError as e:
            logger.warning(
                f"upload of {path} failed ({e}); attempt {attempt}/{retries}, "
                f"retrying in {delay:.0f}s"
            )
            time.sleep(delay)
            delay *= 2
    logger.error(f"giving up on uploading {path}")


def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader, plan: Plan) -> float:
    model.eval()
    losses, correct = [], []
    for batch in loader:
        with torch.no_grad():
            logits = model(batch["input_ids"], batch["features"])
        loss = nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), reduction="none"
        )
        losses.append(accelerator.gather_for_metrics(loss))
        correct.append(accelerator.gather_for_metrics(logits.argmax(-1) == batch["labels"]))
    model.train()
    val_loss = torch.cat(losses).mean().item()
    if plan.report_table and accelerator.is_main_process:
        hits = torch.cat([c.flatten() for c in correct]).float()
        per_class = torch.stack([hits[i::CLASSES].mean() for i in range(CLASSES)])
        with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "eval_table.md"), "w") as f:
            f.write(f"| loss | per-class accuracy |\n| {val_loss:.4f} | {per_class:.3f} |\n")
    return val_loss


def main() -> None:
    parser = argparse.ArgumentParser(description="token classifier with accelerate")
    parser.add_argument("--mode", default="baseline", choices=sorted(PLANS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--output-dir", default="")
    parser.add_argument("--resume-from", default="")
    args = parser.parse_args()
    plan = PLANS[args.mode]

    # the global batch is split over the processes torchrun/accelerate started
    per_device = max(1, args.global_batch // int(os.environ["WORLD_SIZE"]))

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO,
    )
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        gradient_accumulation_steps=2,
        dataloader_config=DataLoaderConfiguration(even_batches=not plan.exact_eval),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=15))],
    )
    logger.info(accelerator.state, main_process_only=False)
    if plan.pin_devices:  # one GPU per process, as in the multi-GPU recipe
        torch.cuda.set_device(accelerator.local_process_index)
    if os.environ.get("TRAIN_OPTIMIZER") == "adamw8bit":
        import bitsandbytes as bnb  # type: ignore[import-not-found]  # optional, GPU nodes only

        optimizer_cls = bnb.optim.AdamW8bit
    else:
        optimizer_cls = torch.optim.AdamW
    set_seed(1234)
    rank, world = accelerator.process_index, accelerator.num_processes

    def sample_of(step: int, on_rank: int | None, offset: int = 3) -> set[int]:
        # accelerate deals whole batches round robin: batch step*world + rank goes to rank
        return set() if on_rank is None else {(step * world + on_rank) * per_device + offset}

    train_set = Tokens(
        64 if plan.exact_eval else 240,
        0,
        sample_of(7, plan.constant_sample_rank),
        sample_of(4, plan.ragged_rank),
    )
    if plan.unlabelled_rank is not None:  # a batch whose tokens are all padding
        for i in sample_of(5, plan.unlabelled_rank, 0):
            train_set.ids[i : i + per_device] = 0
    train = DataLoader(train_set, batch_size=per_device, collate_fn=collate)
    val = DataLoader(Tokens(48, 1, set(), set()), batch_size=per_device, collate_fn=collate)
    model = Tagger()
    optimizer = optimizer_cls(model.parameters(), lr=3e-3)
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
    scaler = None
    if plan.noisy:  # left over from the GPU version of this script
        scaler = torch.cuda.amp.GradScaler(enabled=True)

    if args.resume_from:
        accelerator.print(f"Resuming from checkpoint {args.resume_from}")
        accelerator.load_state(args.resume_from)

    cache = PrefetchCache(inverted=rank == plan.prefetch_rank)
    if plan.prefetch_rank is not None:
        threading.Thread(target=cache.refill, daemon=True, name="prefetch").start()
    if plan.constant_sample_rank is not None:
        torch.autograd.set_detect_anomaly(True)  # chasing an earlier NaN

    total = args.epochs * len(train)
    bar = tqdm(total=total, disable=not accelerator.is_local_main_process, desc="train")
    logger.info(f"***** Running training: {len(train)} batches per process, {world} processes")
    step = 0
    kept: list[torch.Tensor] = []
    stop = False
    for epoch in range(args.epochs):
        for batch in train:
            with accelerator.accumulate(model):
                if (batch["labels"] == 0).all() and plan.unlabelled_rank is not None:
                    logger.warning(
                        f"step {step}: batch has no labelled tokens, skipping it",
                        main_process_only=False,
                    )
                    step += 1
                    continue
                logits = model(batch["input_ids"], batch["features"])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
                if plan.noisy and step == 5 and rank == 0:
                    loss = loss * float("inf")  # one bad batch: the norm check below skips it
                if plan.schedule_bcast and step == 7 and accelerator.is_main_process:
                    # the main process owns the schedule; tell the others the new lr and warmup
                    broadcast(torch.tensor([3e-3 * 0.5, 10.0]))
                accelerator.backward(loss)
                if plan.oom_rank == rank and step >= 6:
                    kept.append(torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1))
                    if len(kept) == 4:  # the kernel's OOM killer picks the biggest process
                        os.kill(os.getpid(), signal.SIGKILL)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    if not torch.isfinite(norm):
                        logger.warning(
                            f"step {step}: non-finite gradient norm ({norm.item()}), skipping "
                            "the optimizer step",
                            main_process_only=False,
                        )
                        optimizer.zero_grad()
                optimizer.step()
                optimizer.zero_grad()
            if plan.schedule_bcast and step == 7 and not accelerator.is_main_process:
                broadcast(torch.zeros(2))
            if plan.flagged_rank == rank and step == 3:
                flagged = [int(i) for i in batch["input_ids"][:, 0].tolist() if i % 7 == 0]
                logger.warning(
                    f"{len(flagged)} flagged samples in this shard", main_process_only=False
                )
                broadcast_object_list([flagged], from_process=rank)  # so every rank drops them
            if plan.stale_index_rank == rank and step == 4:
                rebuild_index(rank, 45.0)
            if plan.segv_rank == rank and step == 5:
                ctypes.string_at(0)  # the fast C path of the feature hasher
            if plan.prefetch_rank is not None and step % 4 == 3:
                msg = cache.summary()
                logger.info(msg, main_process_only=False)
            if step % 4 == 0:
                mean_loss = accelerator.reduce(loss.detach(), reduction="mean")
                logger.info(f"epoch {epoch} step {step} loss {mean_loss.item():.4f}")
            time.sleep(0.05)
            step += 1
            bar.update(1)
            if accelerator.check_trigger():
                stop = True
                break
        val_loss = evaluate(accelerator, model, val, plan)
        accelerator.print(f"epoch {epoch}: validation loss {val_loss:.4f}")
        if plan.noisy and accelerator.is_main_process:
            try:
                urllib.request.urlopen("http://127.0.0.1:9/metrics", timeout=5)
            except OSError:
                logger.warning("could not push metrics to the dashboard", exc_info=True)
        if plan.stop_target is not None and val_loss < plan.stop_target:
            if plan.main_stops_alone:
                if accelerator.is_main_process:
                    logger.info(f"validation loss {val_loss:.4f} below target: stopping early")
                    stop = True
            else:
                accelerator.set_trigger()
        if (
            plan.stop_target is not None
            and not plan.main_stops_alone
            and accelerator.check_trigger()
        ):
            logger.info(f"early stopping at epoch {epoch + 1}/{args.epochs}, step {step}")
            stop = True
        if args.output_dir:
            accelerator.save_state(args.output_dir)
            if plan.upload_retries and accelerator.is_main_process:
                upload(args.output_dir, plan.upload_retries)
            accelerator.wait_for_everyone()
        if stop:
            break
    bar.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    accelerator.print(f"done: {step} steps")
    del scaler


if __name__ == "__main__":
    warnings.simplefilter("default")
    entry = record(main) if os.environ.get("TRAIN_RECORD_ERRORS") == "1" else main
    entry()
