"""A fifty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyeighth-*): a text classifier trained with Hugging Face Accelerate in the
way of accelerate's own examples (examples/nlp_example.py, examples/complete_nlp_example.py; no
Trainer), started on two machines with `accelerate launch --multi_gpu --num_machines 2
--machine_rank K --num_processes 4 --main_process_ip IP --main_process_port PORT` (on a CPU host
accelerate runs it as MULTI_CPU over gloo). A training_function(config, args) with the examples'
arguments (--cpu, --mixed_precision, --checkpointing_steps epoch, --resume_from_checkpoint,
--with_tracking, --output_dir, --project_dir), a 15 s process-group timeout through
InitProcessGroupKwargs, accelerate's get_logger(__name__) with main_process_only, accelerator.print,
gather_for_metrics in the evaluation, wait_for_everyone, save_state/load_state to a folder both
machines mount. The data are generated sentences in JSON lines (data/train.jsonl,
data/validation.jsonl in each machine's working folder), each line decoded when its item is asked
for, a whitespace tokenizer hashed into a small vocabulary, an EmbeddingBag classifier. A fault in
the code is chosen by the NLPX_CASE environment variable (a short code) and never printed
(re-capture with tests/fixtures/real/capture_fiftyeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import random
import signal
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta

import torch
from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from torch import nn
from torch.optim import AdamW
from torch.utils.data import DataLoader, Dataset

logger = get_logger(__name__)

MAX_LEN = 24
VOCAB = 2048
LABELS = {"negative": 0, "positive": 1}
EVAL_BATCH_SIZE = 16


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    concat_rank: int = -1  # this rank joins a 1-D length feature to the 2-D pooled embeddings
    hoard_rank: int = -1  # this rank keeps every batch's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native tokenizer fast path reads address 0
    slow_rank: int = -1  # this rank rebuilds its tokenized validation cache before evaluating
    stuck_rank: int = -1  # this rank waits for a prefetch thread that was never started
    gather_main: bool = False  # the main process alone gathers the training losses it logs
    uneven: bool = False  # DataLoaderConfiguration(even_batches=False)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "c2": Fault(concat_rank=2),
    "m1": Fault(hoard_rank=1),
    "v3": Fault(segv_rank=3),
    "t2": Fault(slow_rank=2),
    "j1": Fault(stuck_rank=1),
    "g0": Fault(gather_main=True),
    "e": Fault(uneven=True),
}

POSITIVE = ["good", "great", "lovely", "superb", "fine", "brilliant", "pleasant", "excellent"]
NEGATIVE = ["bad", "awful", "poor", "dreadful", "boring", "terrible", "dull", "weak"]
FILLER = ["the", "film", "was", "plot", "acting", "really", "quite", "and", "a", "story", "very"]


def make_split(path: str, n: int, seed: int) -> None:
    """n sentences with a sentiment word or two among filler words, one JSON object a line."""
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            label = "positive" if i % 2 else "negative"
            words = rng.choices(FILLER, k=rng.randint(5, 12))
            pool = POSITIVE if label == "positive" else NEGATIVE
            for _ in range(rng.randint(1, 2)):
                words.insert(rng.randrange(len(words) + 1), rng.choice(pool))
            f.write(json.dumps({"idx": i, "sentence": " ".join(words), "label": label}) + "\n")


def tokenize(sentence: str) -> list[int]:
    return [1 + zlib.crc32(w.encode()) % (VOCAB - 1) for w in sentence.lower().split()][:MAX_LEN]


class JsonLines(Dataset):
    """A JSON-lines file indexed by line offsets; a line is decoded when its item is asked for."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets = []
        with open(path, "rb") as f:
            pos = 0
            for line in f:
                self.offsets.append(pos)
                pos += len(line)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            row = json.loads(f.readline())
        return {"input_ids": tokenize(row["sentence"]), "labels": LABELS[row["label"]]}


def collate_fn(examples: list[dict]) -> dict[str, torch.Tensor]:
    ids = torch.zeros(len(examples), MAX_LEN, dtype=torch.long)
    for k, ex in enumerate(examples):
        ids[k, : len(ex["input_ids"])] = torch.tensor(ex["input_ids"])
    labels = torch.tensor([ex["labels"] for ex in examples])
    return {"input_ids": ids, "attention_mask": (ids > 0).long(), "labels": labels}


@dataclass
class ClassifierOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class TinyTextClassifier(nn.Module):
    """Mean-pooled embeddings and the sentence length, a small MLP head."""

    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean", padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim + 1, dim), nn.GELU(), nn.Linear(dim, classes))
        self.concat_1d = False

    def forward(self, input_ids, attention_mask, labels=None) -> ClassifierOutput:
        pooled = self.embed(input_ids)
        length = attention_mask.sum(1).float() / MAX_LEN
        if not self.concat_1d:
            length = length.unsqueeze(1)
        logits = self.head(torch.cat([pooled, length], dim=1))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return ClassifierOutput(loss=loss, logits=logits)


def get_dataloaders(accelerator: Accelerator, batch_size: int, data_dir: str, workers: int):
    train = JsonLines(os.path.join(data_dir, "train.jsonl"))
    validation = JsonLines(os.path.join(data_dir, "validation.jsonl"))
    train_dataloader = DataLoader(
        train,
        shuffle=True,
        collate_fn=collate_fn,
        batch_size=batch_size,
        drop_last=False,
        num_workers=workers,
    )
    eval_dataloader = DataLoader(
        validation,
        shuffle=False,
        collate_fn=collate_fn,
        batch_size=EVAL_BATCH_SIZE,
        drop_last=False,
        num_workers=workers,
    )
    return train_dataloader, eval_dataloader


def training_function(config: dict, args: argparse.Namespace) -> None:
    fault = FAULTS[os.environ.get("NLPX_CASE", "")]
    kwargs = [InitProcessGroupKwargs(timeout=timedelta(seconds=15))]
    dataloader_config = DataLoaderConfiguration(even_batches=not fault.uneven)
    if args.with_tracking:
        accelerator = Accelerator(
            cpu=args.cpu,
            mixed_precision=args.mixed_precision,
            log_with="all",
            project_dir=args.project_dir,
            kwargs_handlers=kwargs,
            dataloader_config=dataloader_config,
        )
    else:
        accelerator = Accelerator(
            cpu=args.cpu,
            mixed_precision=args.mixed_precision,
            kwargs_handlers=kwargs,
            dataloader_config=dataloader_config,
        )
    logger.info(accelerator.state, main_process_only=False)
    if args.report_to == "wandb":
        import wandb  # the prediction table logged after each evaluation

        wandb_table = wandb.Table
    else:
        wandb_table = None

    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    seed = int(config["seed"])
    batch_size = int(config["batch_size"])

    set_seed(seed)
    torch.set_num_threads(1)
    train_dataloader, eval_dataloader = get_dataloaders(
        accelerator, batch_size, args.data_dir, args.num_workers
    )
    model = TinyTextClassifier(VOCAB, 32, len(LABELS))
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 4)
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    if args.with_tracking:
        run = os.path.split(__file__)[-1].split(".")[0]
        accelerator.init_trackers(run, config)

    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataloader.dataset)}")
    logger.info(f"  Num Epochs = {num_epochs}")
    logger.info(f"  Instantaneous batch size per device = {batch_size}")
    logger.info(f"  Total train batch size = {batch_size * accelerator.num_processes}")

    overall_step = 0
    starting_epoch = 0
    if args.resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        accelerator.load_state(args.resume_from_checkpoint)
        path = os.path.basename(args.resume_from_checkpoint.rstrip("/"))
        training_difference = os.path.splitext(path)[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        else:
            overall_step = int(training_difference.replace("step_", ""))
            starting_epoch = overall_step // len(train_dataloader)

    best_accuracy, bad_epochs = 0.0, 0
    hoard: list[torch.Tensor] = []
    rank = accelerator.process_index
    unwrapped = accelerator.unwrap_model(model)
    for epoch in range(starting_epoch, num_epochs):
        if epoch == 1 and rank == fault.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        model.train()
        total_loss = 0.0
        for step, batch in enumerate(train_dataloader):
            unwrapped.concat_1d = rank == fault.concat_rank and epoch == 1 and step == 3
            if rank == fault.segv_rank and epoch == 1 and step == 2:
                ctypes.string_at(0)  # the native tokenizer fast path dereferences NULL
            outputs = model(**batch)
            loss = outputs.loss
            total_loss += loss.detach().float().item()
            if rank == fault.hoard_rank and epoch == 1:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            if step % args.log_every == 0:
                if fault.gather_main and accelerator.is_main_process:
                    losses = accelerator.gather(loss.detach().reshape(1))
                    logger.info(f"epoch {epoch} step {step}: mean loss {losses.mean().item():.4f}")
                else:
                    logger.info(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
            if isinstance(checkpointing_steps, int) and overall_step % checkpointing_steps == 0:
                output_dir = f"step_{overall_step}"
                if args.output_dir is not None:
                    output_dir = os.path.join(args.output_dir, output_dir)
                accelerator.save_state(output_dir)

        if rank == fault.slow_rank and epoch == 1:
            for part in range(1, 9):
                logger.warning(
                    f"Rebuilding the tokenized validation cache on this process: {part}/8",
                    main_process_only=False,
                )
                time.sleep(5)
        model.eval()
        correct, seen = 0, 0
        for step, batch in enumerate(eval_dataloader):  # noqa: B007
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics(
                (predictions, batch["labels"])
            )  # fmt: skip (as captured: the fixtures cite these lines)
            correct += (predictions == references).long().sum().item()
            seen += references.numel()
        accuracy = correct / seen
        accelerator.print(f"epoch {epoch}:", {"accuracy": round(accuracy, 4), "n": seen})
        if args.with_tracking:
            accelerator.log(
                {"accuracy": accuracy, "train_loss": total_loss / len(train_dataloader)},
                step=epoch,
            )
            if wandb_table is not None and accelerator.is_main_process:
                accelerator.get_tracker("wandb").log({"predictions": wandb_table(data=[])})
        if checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)
        if args.early_stopping_patience:
            # every process has the same gathered accuracy, so every process stops together
            if accuracy > best_accuracy + args.min_delta:
                best_accuracy, bad_epochs = accuracy, 0
            else:
                bad_epochs += 1
            if bad_epochs >= args.early_stopping_patience:
                accelerator.print(
                    f"Accuracy has not improved by {args.min_delta} for {bad_epochs} epoch(s): "
                    "stopping early"
                )
                break

    accelerator.wait_for_everyone()
    accelerator.print("Training completed.")
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument(
        "--mixed_precision",
        type=str,
        default=None,
        choices=["no", "fp16", "bf16", "fp8"],
        help="Whether to use mixed precision.",
    )
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument(
        "--checkpointing_steps",
        type=str,
        default=None,
        help="Whether the various states should be saved at the end of every n steps, "
        "or 'epoch' for each epoch.",
    )
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--report_to", type=str, default="all")
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--project_dir", type=str, default="logs")
    parser.add_argument("--data_dir", type=str, default="data")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--log_every", type=int, default=2)
    parser.add_argument("--early_stopping_patience", type=int, default=0)
    parser.add_argument("--min_delta", type=float, default=0.0)
    parser.add_argument("--make_data", type=str, default="", help="write the data and stop")
    args = parser.parse_args()
    if args.make_data:
        make_split(os.path.join(args.make_data, "train.jsonl"), 116, 1)
        make_split(os.path.join(args.make_data, "validation.jsonl"), 64, 2)
        return
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO,
    )
    config = {"lr": 2e-3, "num_epochs": args.num_epochs, "seed": 42, "batch_size": 8}
    training_function(config, args)


if __name__ == "__main__":
    main()
