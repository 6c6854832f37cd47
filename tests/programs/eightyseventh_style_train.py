"""An eighty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/eightyseventh-*): a text-classification fine-tuning script in the way of
transformers' examples/pytorch/text-classification/run_glue_no_trainer.py, launched with
`accelerate launch --multi_gpu --num_processes N --main_process_port PORT run_glue.py ...`
(MULTI_CPU over gloo on a host without a GPU). The dataset preprocessing is done 'main process
first' (accelerator.main_process_first(), the idiom of transformers'
training_args.main_process_first(desc="dataset map pre-processing")): rank 0 reads the raw corpus
(data/raw/train.jsonl and validation.jsonl, written by `run_glue.py --prepare`), tokenizes it with
a toy whitespace tokenizer and its vocabulary file (data/vocab.txt) behind a tqdm bar ('Running
tokenizer on dataset: 45%|...| 450/1000 [00:01<00:01, 350.2 examples/s]') and writes a cache
file named by a fingerprint of its inputs (<cache_dir>/cache-<fingerprint>.npz, guarded by a
<file>.lock as datasets' FileLock does, with an unlimited wait); the other ranks wait in the
barrier and then load the cache ('Loading cached processed dataset at ...'). Then DDP training of
a tiny EmbeddingBag classifier through accelerator.prepare, an evaluation per epoch with
gather_for_metrics, a best-checkpoint save on rank 0, optional patience-based early stopping,
and HF-style logging ('12/06/2026 02:10:11 - INFO - __main__ - ***** Running training *****').
A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and
never printed (re-capture with tests/fixtures/real/capture_eightyseventh.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
from datetime import timedelta

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import InitProcessGroupKwargs, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

logger = get_logger(__name__)

LABELS = ["negative", "neutral", "positive"]
CUES = {
    "negative": ["awful", "boring", "dull", "bad", "weak", "messy"],
    "neutral": ["fine", "plain", "average", "okay", "usual", "standard"],
    "positive": ["great", "superb", "lovely", "good", "strong", "moving"],
}
FILLER_TEXT = (
    "the movie film plot actor story scene was is a an and of with in it this that very quite"
    " rather script music camera ending start cast director"
)
FILLER = FILLER_TEXT.split()


def prepare(folder: str, n_train: int, n_val: int) -> None:
    """A synthetic sentiment corpus in JSON lines and the tokenizer's vocabulary file."""
    rng = random.Random(0)
    os.makedirs(f"{folder}/raw", exist_ok=True)
    for split, n in (("train", n_train), ("validation", n_val)):
        with open(f"{folder}/raw/{split}.jsonl", "w") as f:
            for i in range(n):
                label = rng.randrange(3)
                words = rng.choices(FILLER, k=rng.randint(5, 22))
                for _ in range(2):
                    words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[LABELS[label]]))
                if rng.random() < 0.15:  # a little label noise
                    label = rng.randrange(3)
                f.write(json.dumps({"idx": i, "sentence": " ".join(words), "label": label}) + "\n")
    vocab = ["[PAD]", "[UNK]", "[CLS]"] + FILLER + [w for ws in CUES.values() for w in ws]
    with open(f"{folder}/vocab.txt", "w") as f:
        f.write("\n".join(vocab) + "\n")


def fault() -> tuple[str, int]:
    case = os.environ.get("TQ_CASE", "")
    return (case[0], int(case[1:])) if case else ("", -1)


class WhitespaceTokenizer:
    def __init__(self, vocab_file: str, model_max_length: int = 512):
        with open(vocab_file) as f:
            self.vocab = {w: i for i, w in enumerate(f.read().split())}
        self.model_max_length = model_max_length
        self.warned = False

    def __call__(self, text: str, max_length: int) -> list[int]:
        ids = [2] + [self.vocab.get(w, 1) for w in text.lower().split()]
        if len(ids) > self.model_max_length and not self.warned:
            logging.getLogger("transformers.tokenization_utils_base").warning(
                "Token indices sequence length is longer than the specified maximum sequence "
                "length for this model (%d > %d). Running this sequence through the model will "
                "result in indexing errors",
                len(ids),
                self.model_max_length,
            )
            self.warned = True
        ids = ids[:max_length]
        return ids + [0] * (max_length - len(ids))


def fingerprint(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
    return h.hexdigest()[:16]


def acquire(lock: str) -> None:
    """datasets' FileLock with timeout=-1: wait for the lock file as long as it takes."""
    while True:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return
        except FileExistsError:
            time.sleep(0.05)


def tokenize_split(args, tok, split: str, what: str, who: int, rank: int) -> dict:
    """datasets.map(preprocess_function, batched=True, desc="Running tokenizer on dataset") with
    its cache: the main process loads the cache file when it exists, else tokenizes and writes it;
    the other processes, past the barrier, load it."""
    raw = getattr(args, f"{split}_file")
    fp = fingerprint(
        split, raw, str(os.path.getsize(raw)), str(args.max_length), args.tokenizer_name
    )
    cache = os.path.join(args.cache_dir, f"cache-{fp}.npz")
    dlog = logging.getLogger("datasets.arrow_dataset")
    # the main process tokenizes (or reuses the cache), the others load what it wrote
    if rank != 0 or (os.path.exists(cache) and not args.overwrite_cache):
        dlog.info("Loading cached processed dataset at %s", cache)
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    os.makedirs(args.cache_dir, exist_ok=True)
    acquire(cache + ".lock")
    with open(raw) as f:
        rows = [json.loads(line) for line in f]
    if split == "train" and args.max_train_samples:
        rows = rows[: args.max_train_samples]
    ids, labels, hoard = [], [], []
    bar = tqdm(total=len(rows), desc="Running tokenizer on dataset", unit=" examples", ascii=True)
    for start in range(0, len(rows), 100):  # batched=True, in batches of 100
        batch = rows[start : start + 100]
        if what == "s" and rank == who:
            time.sleep(2.5)  # the normaliser of the slow tokenizer
        if what == "m" and rank == who:
            hoard.append(np.ones(64 << 20, dtype=np.uint8))  # every batch's offsets, kept
            if len(hoard) >= 3:
                os.kill(os.getpid(), signal.SIGKILL)  # the host's OOM killer
        ids.extend(tok(r["sentence"], args.max_length) for r in batch)
        labels.extend(r["label"] for r in batch)
        bar.update(len(batch))
    bar.close()
    data = {"input_ids": np.array(ids, dtype=np.int64), "labels": np.array(labels, dtype=np.int64)}
    dlog.info("Caching processed dataset at %s", cache)
    np.savez(cache, **data)
    os.remove(cache + ".lock")
    return data


class Classifier(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 32, num_labels: int = 3):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim, mode="mean", padding_idx=0)
        self.pre = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, num_labels)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.pre(self.embed(input_ids))))


def parse_args():
    p = argparse.ArgumentParser(description="Finetune a text classifier (no Trainer)")
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--num_train", type=int, default=320)
    p.add_argument("--num_val", type=int, default=64)
    p.add_argument("--train_file", default="data/raw/train.jsonl")
    p.add_argument("--validation_file", default="data/raw/validation.jsonl")
    p.add_argument("--tokenizer_name", default="data/vocab.txt")
    p.add_argument("--cache_dir", default="data/cache")
    p.add_argument("--overwrite_cache", action="store_true")
    p.add_argument("--max_length", type=int, default=32)
    p.add_argument("--model_max_length", type=int, default=512)
    p.add_argument("--max_train_samples", type=int, default=None)
    p.add_argument("--per_device_train_batch_size", type=int, default=16)
    p.add_argument("--per_device_eval_batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=5e-3)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--early_stopping_patience", type=int, default=None)
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--output_dir", default="outputs")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.prepare:
        prepare("data", args.num_train, args.num_val)
        return
    what, who = fault()
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=15))]
    )
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO,
    )
    logger.info(accelerator.state, main_process_only=False)
    rank, world = accelerator.process_index, accelerator.num_processes
    set_seed(args.seed)
    tok = WhitespaceTokenizer(args.tokenizer_name, args.model_max_length)

    with accelerator.main_process_first():
        train = tokenize_split(args, tok, "train", what, who, rank)
        val = tokenize_split(args, tok, "validation", "", -1, rank)

    train_ds = TensorDataset(
        torch.from_numpy(train["input_ids"]), torch.from_numpy(train["labels"])
    )
    val_ds = TensorDataset(torch.from_numpy(val["input_ids"]), torch.from_numpy(val["labels"]))
    if args.streaming:  # an IterableDataset split by node: rows rank::world, not prepared
        train_ds = torch.utils.data.Subset(train_ds, range(rank, len(train_ds), world))
    train_dl = DataLoader(train_ds, shuffle=True, batch_size=args.per_device_train_batch_size)
    eval_dl = DataLoader(val_ds, batch_size=args.per_device_eval_batch_size)
    model = Classifier(len(tok.vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    if args.streaming:
        model, optimizer, eval_dl = accelerator.prepare(model, optimizer, eval_dl)
        steps_per_epoch = len(train_dl)
    else:
        model, optimizer, train_dl, eval_dl = accelerator.prepare(
            model, optimizer, train_dl, eval_dl
        )
        steps_per_epoch = len(train_dl)
    max_train_steps = args.num_train_epochs * steps_per_epoch
    total_batch_size = args.per_device_train_batch_size * world

    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_ds) * (world if args.streaming else 1)}")
    logger.info(f"  Num Epochs = {args.num_train_epochs}")
    logger.info(f"  Instantaneous batch size per device = {args.per_device_train_batch_size}")
    logger.info(
        f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}"
    )
    logger.info("  Gradient Accumulation steps = 1")
    logger.info(f"  Total optimization steps = {max_train_steps}")
    progress_bar = tqdm(range(max_train_steps), disable=not accelerator.is_local_main_process)
    best, stale, completed_steps = -1.0, 0, 0
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, (input_ids, labels) in enumerate(train_dl):
            if what == "n" and rank == who and epoch == 1 and step == 2:
                ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"fused_ce"), 8)
            logits = model(input_ids)
            loss = nn.functional.cross_entropy(logits, labels)
            if what == "k" and epoch == 1 and step == 3:  # --log_hardest_examples
                per_example = nn.functional.cross_entropy(logits, labels, reduction="none")
                hardest = rank * len(labels) + int(per_example.argmax())  # a global index
                logger.info(
                    f"hardest example of step {completed_steps}: {input_ids[hardest].tolist()}",
                    main_process_only=False,
                )
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress_bar.update(1)
            completed_steps += 1
        if what == "h" and rank == who and epoch == 0:
            threading.Event().wait()  # set by a tokenizer prefetch thread never started here
        if what == "e" and epoch == 0 and rank != who:
            continue  # evaluation under `if accelerator.is_main_process:`
        model.eval()
        samples, correct = 0, 0
        for input_ids, labels in eval_dl:
            with torch.no_grad():
                predictions = model(input_ids).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == references).sum())
            samples += len(references)
        accuracy = correct / samples
        logger.info(f"epoch {epoch}: {{'accuracy': {accuracy:.4f}}}")
        if accuracy > best + 1e-4:
            best, stale = accuracy, 0
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                os.makedirs(f"{args.output_dir}/best_checkpoint", exist_ok=True)
                accelerator.save(
                    accelerator.unwrap_model(model).state_dict(),
                    f"{args.output_dir}/best_checkpoint/pytorch_model.bin",
                )
                logger.info(
                    f"New best accuracy {accuracy:.4f}: saved {args.output_dir}/best_checkpoint"
                )
        else:
            stale += 1
            if args.early_stopping_patience and stale >= args.early_stopping_patience:
                logger.info(
                    f"Early stopping at epoch {epoch}: accuracy has not improved for {stale} "
                    f"evaluations (best {best:.4f})"
                )
                break
    progress_bar.close()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
            json.dump({"eval_accuracy": best, "steps": completed_steps}, f)
    logger.info(f"***** Training complete ***** best accuracy {best:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
