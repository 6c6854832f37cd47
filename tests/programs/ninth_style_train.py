"""A ninth training-program style for the generalisation fixtures (tests/fixtures/real/ninth-*):
a fine-tuning script written the way Hugging Face transformers.Trainer users write it. argparse
for the script's own flags, `TrainingArguments(use_cpu=True, ddp_backend="gloo", ...)`, a tiny
BERT built from a config (`AutoModelForSequenceClassification.from_config`, nothing downloaded),
a synthetic sentiment dataset generated in the script, a padding data collator that maps label
names to ids, `compute_metrics`, EarlyStoppingCallback and custom TrainerCallbacks, a Trainer
subclass with a weighted loss, `trainer.train(resume_from_checkpoint=...)`, `trainer.save_model()`,
and the Trainer's own log dicts and tqdm bars as they come. transformers 5.x ignores ddp_timeout
with use_cpu, so the script joins the process group itself with a 20 s timeout (a common
workaround). One real fault per `--mode`; the faults are named by what they do, never by the
mode, so no output quotes it. Several modes have no fault in the code: their cause is the
checkpoint, the files or the arguments the capture gives them
(tests/fixtures/real/capture_ninth.sh: re-capture after any edit, the fixtures quote its lines).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: the model is built here
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    EarlyStoppingCallback,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    set_seed,
)

VOCAB = 64
PAD = 0
LABELS = {"negative": 0, "positive": 1}


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code or the data (the defaults: nothing)."""

    odd_label_row: int = -1  # this training row is labelled "neutral" (an annotation typo)
    zero_annotator_row: int = -1  # this row has 0 annotators: its loss weight is 1/0
    main_only_barrier_on_save: bool = False  # waits for the "upload" on rank 0 only
    scoring_latency_s: float = 0.0  # rank 0 asks a judge service per chunk of predictions
    own_eval_file_rows: tuple[int, ...] = ()  # each rank evaluates its own file (rows per rank)
    spare_head: bool = False  # an auxiliary head that forward never uses
    kill_rank_at_item: tuple[int, int] = (-1, 0)  # (rank, item): the process dies (SIGKILL)
    kill_worker_at_item: tuple[int, int] = (-1, 0)  # (rank, item): a loader worker dies
    locked_features: bool = False  # feature cache built under a per-rank file lock
    patience: int = 0  # EarlyStoppingCallback with this patience
    loud: bool = False  # options that make the Trainer and DDP warn
    bare_teardown: bool = False  # destroys the group right after the last gather (no barrier)


MODES: dict[str, Fault] = {
    "plain": Fault(),
    "loud-ok": Fault(loud=True),
    "patience-halt": Fault(patience=2),
    "accel-run": Fault(bare_teardown=True),
    "solo-ok": Fault(),
    "label-typo": Fault(odd_label_row=77),
    "weight-nan": Fault(zero_annotator_row=141),
    "zero-only-barrier": Fault(main_only_barrier_on_save=True),
    "slow-scoring": Fault(scoring_latency_s=6.0),
    "eval-skew": Fault(own_eval_file_rows=(40, 24)),
    "frozen-head": Fault(spare_head=True),
    "rss-kill": Fault(kill_rank_at_item=(1, 90)),
    "worker-kill": Fault(kill_worker_at_item=(0, 60)),
    "stale-lock": Fault(locked_features=True),
    "resume-half": Fault(),
    "stop-file": Fault(),
    "argparse-strict": Fault(),
    "no-launcher": Fault(),
    "full-disk": Fault(),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fine-tune a small sentiment classifier.")
    p.add_argument("--mode", default="plain", choices=sorted(MODES), metavar="FAULT")
    p.add_argument("--output_dir", default="")
    p.add_argument("--cache_dir", default="")
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--stop_file", default="")
    p.add_argument("--distributed", action="store_true", help="multi-node config: join a group")
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--eval_steps", type=int, default=5)
    p.add_argument("--save_steps", type=int, default=10)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--ddp_timeout", type=int, default=20)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)  # strict: an unknown flag is an error


# -----------------------------------------------------------------------------
# data


def synth_rows(n: int, seed: int, fault: Fault) -> list[dict[str, Any]]:
    """Rows as a labelling tool exports them: token ids, a label name, annotator count."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(8, 25))
        ids = rng.integers(3, VOCAB, size=length)
        label = "positive" if (ids % 7 == 0).sum() >= (ids % 5 == 0).sum() else "negative"
        annotators = int(rng.integers(1, 4))
        if i == fault.odd_label_row:
            label = "neutral"
        if i == fault.zero_annotator_row:
            annotators = 0
        rows.append({"input_ids": ids.tolist(), "label": label, "annotators": annotators})
    return rows


class SentimentDataset(Dataset[dict[str, Any]]):
    def __init__(self, rows: list[dict[str, Any]], fault: Fault) -> None:
        self.rows = rows
        self.fault = fault
        self.served = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.served += 1
        rank = int(os.environ.get("RANK", "0"))
        kill_rank, kill_item = self.fault.kill_rank_at_item
        if rank == kill_rank and self.served == kill_item and get_worker_info() is None:
            os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does to it
        w_rank, w_item = self.fault.kill_worker_at_item
        worker = get_worker_info()
        if rank == w_rank and worker is not None and worker.id == 1 and self.served == w_item:
            os.kill(os.getpid(), signal.SIGKILL)  # a loader worker killed (shm, OOM killer)
        row = dict(self.rows[i])
        # inverse-agreement weight: rows many annotators agreed on count less
        row["weight"] = float(np.float32(1.0) / np.float32(row["annotators"]))
        return row


class PadCollator:
    """Pads a batch to its longest row and maps label names to ids."""

    def __init__(self, label2id: dict[str, int], max_length: int = 32) -> None:
        self.label2id = label2id
        self.max_length = max_length

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = min(max(len(f["input_ids"]) for f in features), self.max_length)
        ids = torch.full((len(features), longest), PAD, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for j, f in enumerate(features):
            row = f["input_ids"][:longest]
            ids[j, : len(row)] = torch.tensor(row)
            mask[j, : len(row)] = 1
        labels = torch.tensor([self.label2id[f["label"]] for f in features])
        weights = torch.tensor([f.get("weight", 1.0) for f in features], dtype=torch.float)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "weight": weights}


def build_features(cache_dir: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-rank feature cache, built under a file lock so that a restarted job never reads a
    half-written cache."""
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, f"features-{rank}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(cache_dir, f"features-{rank}.pt")
        torch.save(rows, path)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return rows


# -----------------------------------------------------------------------------
# trainer pieces


class WeightedTrainer(Trainer):
    """Loss weighted per row; a non-finite loss stops the run before it poisons the weights."""

    def __init__(
        self, *a: Any, eval_shards: list[list[dict[str, Any]]] | None = None, **kw: Any
    ) -> None:
        super().__init__(*a, **kw)
        self.eval_shards = eval_shards

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        weight = inputs.pop("weight")
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        per_row = nn.functional.cross_entropy(outputs.logits, labels, reduction="none")
        loss = (per_row * weight).sum() / weight.numel()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.state.global_step}")
        return (loss, outputs) if return_outputs else loss

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: Any = None,
    ) -> Any:
        inputs = dict(inputs)
        inputs.pop("weight", None)
        labels = inputs.pop("labels")
        with torch.no_grad():
            logits = model(**inputs).logits
            loss = nn.functional.cross_entropy(logits, labels)
        return (loss, logits, labels)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if self.eval_shards is None:
            return super().get_eval_dataloader(eval_dataset)
        # every rank scores its own validation file, already split upstream
        rank = self.args.process_index
        return DataLoader(
            SentimentDataset(self.eval_shards[rank], Fault()),
            batch_size=self.args.per_device_eval_batch_size,
            collate_fn=self.data_collator,
        )


class StepTimer(TrainerCallback):
    """Keeps the wall time per optimizer step (reported at the end on the main process)."""

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.times: list[float] = []

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        now = time.perf_counter()
        self.times.append(now - self.t)
        self.t = now

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.is_world_process_zero and self.times:
            print(
                f"median step time {1000 * float(np.median(self.times)):.1f} ms "
                f"over {len(self.times)} steps"
            )


class UploadOnSave(TrainerCallback):
    """Pushes each checkpoint to shared storage from the main process."""

    def __init__(self, wait_for_it: bool) -> None:
        self.wait_for_it = wait_for_it

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.is_world_process_zero:
            print(f"uploading checkpoint-{state.global_step} ...", flush=True)
            if self.wait_for_it:
                dist.barrier()  # "make sure the upload finished before anyone moves on"


class GracefulStop(TrainerCallback):
    """Stops training cleanly when an operator touches the stop file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.path and state.global_step % 10 == 0 and os.path.exists(self.path):
            print(f"stop file found at step {state.global_step}, finishing", flush=True)
            control.should_training_stop = True


def make_compute_metrics(latency_s: float) -> Any:
    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        logits, labels = eval_pred
        preds = np.asarray(logits).argmax(-1)
        labels = np.asarray(labels)
        tp = float(((preds == 1) & (labels == 1)).sum())
        f1 = 2 * tp / max(1.0, float((preds == 1).sum() + (labels == 1).sum()))
        metrics = {"accuracy": float((preds == labels).mean()), "f1": f1}
        if latency_s and int(os.environ.get("RANK", "0")) == 0:
            # a judge model behind an HTTP endpoint rates the predictions in chunks of 8
            agree = []
            for start in range(0, len(preds), 8):
                time.sleep(latency_s)
                agree.append(float((preds[start : start + 8] == labels[start : start + 8]).mean()))
            metrics["judge_agreement"] = float(np.mean(agree))
        return metrics

    return compute_metrics


# -----------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    fault = MODES[args.mode]
    set_seed(args.seed)
    if "RANK" in os.environ or args.distributed:
        # TrainingArguments(use_cpu=True) ignores ddp_timeout: join the group ourselves
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.ddp_timeout))
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    output_dir = args.output_dir or os.path.join(tempfile.gettempdir(), "sentiment-bert")

    train_rows = synth_rows(512, args.seed, fault)
    eval_rows = synth_rows(64, args.seed + 1, Fault())
    if fault.locked_features:
        train_rows = build_features(
            args.cache_dir or os.path.join(tempfile.gettempdir(), "feature-cache"), train_rows
        )

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=len(LABELS),
        id2label={v: k for k, v in LABELS.items()},
        label2id=LABELS,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    if fault.spare_head:
        model.aux_head = nn.Linear(32, 3)  # for the topic task, wired into forward later

    training_args = TrainingArguments(
        output_dir=output_dir,
        use_cpu=True,
        ddp_backend="gloo" if world > 1 else None,
        ddp_timeout=args.ddp_timeout,
        ddp_find_unused_parameters=None if fault.loud else False,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=5e-4,
        max_steps=args.max_steps,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        load_best_model_at_end=fault.patience > 0,
        metric_for_best_model="accuracy" if fault.patience else None,
        greater_is_better=True if fault.patience else None,
        report_to="none",
        remove_unused_columns=False,  # the collator needs "label" names and "weight"
        dataloader_num_workers=args.num_workers,
        seed=args.seed,
        max_grad_norm=1.0,
        torch_compile=False,
    )
    callbacks: list[TrainerCallback] = [
        StepTimer(),
        UploadOnSave(fault.main_only_barrier_on_save),
        GracefulStop(args.stop_file),
    ]
    if fault.patience:
        # an improvement smaller than 0.5 accuracy does not count
        callbacks.append(
            EarlyStoppingCallback(
                early_stopping_patience=fault.patience, early_stopping_threshold=0.5
            )
        )
    eval_shards = None
    if fault.own_eval_file_rows:
        eval_shards, start = [], 0
        for n in fault.own_eval_file_rows:
            eval_shards.append(eval_rows[start : start + n])
            start += n
    trainer = WeightedTrainer(
        model=model,
        args=training_args,
        train_dataset=SentimentDataset(train_rows, fault),
        eval_dataset=SentimentDataset(eval_rows, Fault()),
        data_collator=PadCollator(LABELS),
        compute_metrics=make_compute_metrics(fault.scoring_latency_s),
        callbacks=callbacks,
        eval_shards=eval_shards,
    )
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    metrics = trainer.evaluate()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.log_metrics("eval", metrics)
    if rank == 0:
        print(f"saved to {output_dir}")
    if dist.is_initialized():
        if not fault.bare_teardown:
            dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
