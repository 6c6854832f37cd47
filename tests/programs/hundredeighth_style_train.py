"""A hundred-and-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredeighth-*): a PyTorch trial written with Determined's Core API in the
way of Determined's own tutorial (examples/tutorials/core_api_pytorch_mnist/
model_def_distributed.py), copied into the experiment's context directory as train.py and
started by `det experiment create const.yaml .` with `entrypoint: python3 -m
determined.launch.torch_distributed python3 train.py` and `resources: slots_per_trial: 2`
(re-created: tests/programs/hundredeighth_det.py and hundredeighth_harness.py).

What the tutorial does is kept: `dist.init_process_group(...)` (gloo on CPU here, a 15 s
timeout), `det.core.DistributedContext.from_torch_distributed()`, `with det.core.init(
distributed=...) as core_context`, the hyperparameters from det.get_cluster_info(), DDP, the
chief alone reporting training and validation metrics, storing the checkpoint
(core_context.checkpoint.store_path, checkpoint.pt and a 'state' file) and completing the
searcher operation, the loop over core_context.searcher.operations() with the operation's length
converted from the configured unit, a validation and a checkpoint after every epoch and at the
operation's end, core_context.preempt.should_preempt() after each checkpoint, resuming from
info.latest_checkpoint, 'Train Epoch: E [N/M (P%)]\tLoss: L' printed by every rank and Python's
logging in Determined's LOG_FORMAT. The data are pre-sharded: data/train/shard-0000K-of-00006.pt
and data/val/shard-0000K-of-00006.pt (tensors of 16x16 synthetic digit images and labels,
written by `python train.py --prepare data`), rank r reading shards r, r + size, ...; a small
CNN. A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredeighth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import pathlib
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import determined as det
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    class_weights: bool = False  # the loss weighted by torch.bincount(labels) without minlength
    hoard_rank: int = -1  # this rank keeps every batch's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native augmentation kernel reads address 0
    chief_reduce: bool = False  # the validation all-reduce written inside the chief's branch
    slow_rank: int = -1  # this rank rebuilds its validation cache before the first validation
    stuck_rank: int = -1  # this rank waits for a prefetch thread that was never started


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "w": Fault(class_weights=True),
    "m0": Fault(hoard_rank=0),
    "s1": Fault(segv_rank=1),
    "r0": Fault(chief_reduce=True),
    "t1": Fault(slow_rank=1),
    "p1": Fault(stuck_rank=1),
}

SHARDS = 6


class Net(nn.Module):
    def __init__(self, hparams: dict) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, hparams["n_filters1"], 3, 1)
        self.conv2 = nn.Conv2d(hparams["n_filters1"], hparams["n_filters2"], 3, 1)
        self.dropout1 = nn.Dropout(hparams["dropout1"])
        self.dropout2 = nn.Dropout(hparams["dropout2"])
        self.fc1 = nn.Linear(36 * hparams["n_filters2"], 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


# ---------------------------------------------------------------- data
def prepare(root: str, samples: int, last_shard: int) -> None:
    """Synthetic 16x16 'digits': a class's stroke pattern plus noise, in six shards a split."""
    g = torch.Generator().manual_seed(2026)
    patterns = (torch.rand(10, 16, 16, generator=g) > 0.6).float()
    for split, n in (("train", samples), ("val", 384)):
        out = pathlib.Path(root, split)
        out.mkdir(parents=True, exist_ok=True)
        per = n // SHARDS
        for k in range(SHARDS):
            m = last_shard if (split == "train" and k == SHARDS - 1 and last_shard) else per
            labels = torch.randint(0, 10, (m,), generator=g)
            noise = torch.rand(m, 16, 16, generator=g)
            images = (patterns[labels] * 0.25 + noise * 0.75) * 255
            torch.save(
                {"images": images.to(torch.uint8).unsqueeze(1), "labels": labels},
                out / f"shard-{k:05d}-of-{SHARDS:05d}.pt",
            )


class ShardDataset(torch.utils.data.Dataset):
    """The shards of this rank (r, r + size, ...), loaded whole."""

    def __init__(self, root: str, rank: int, size: int) -> None:
        images, labels = [], []
        for k in range(rank, SHARDS, size):
            shard = torch.load(os.path.join(root, f"shard-{k:05d}-of-{SHARDS:05d}.pt"))
            images.append(shard["images"])
            labels.append(shard["labels"])
        self.images = torch.cat(images).float().div_(255).sub_(0.5).div_(0.25)
        self.labels = torch.cat(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


# ---------------------------------------------------------------- training
def train_epoch(
    args, model, train_loader, optimizer, core_context, epoch_idx, state, length, fault
) -> None:
    model.train()
    rank = core_context.distributed.rank
    hoard = []
    for batch_idx, (data, target) in enumerate(train_loader):
        if state["steps"] >= length:
            return
        if rank == fault.stuck_rank and state["steps"] == 20:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        if rank == fault.segv_rank and state["steps"] == 30:
            ctypes.string_at(0)  # the native augmentation kernel dereferences NULL
        if state["augment"] is not None:
            data = state["augment"](data)
        optimizer.zero_grad()
        output = model(data)
        if fault.class_weights:
            counts = torch.bincount(target).float()
            loss = F.nll_loss(output, target, weight=counts.sum() / counts.clamp(min=1))
        else:
            loss = F.nll_loss(output, target)
        if rank == fault.hoard_rank and state["steps"] >= 30:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        loss.backward()
        optimizer.step()
        state["steps"] += 1
        if (batch_idx + 1) % args.log_interval == 0:
            seen, pct = (batch_idx + 1) * len(data), 100.0 * (batch_idx + 1) / len(train_loader)
            print(
                f"Train Epoch: {epoch_idx} [{seen}/{len(train_loader.dataset)} ({pct:.0f}%)]\t"
                f"Loss: {loss.item():.6f}"
            )
            # Report metrics only on rank 0: only the chief worker may report training metrics
            # and progress, or upload checkpoints.
            if rank == 0:
                core_context.train.report_training_metrics(
                    steps_completed=state["steps"], metrics={"train_loss": loss.item()}
                )


def test(model, test_loader, core_context, steps_completed, fault) -> float:
    model.eval()
    rank = core_context.distributed.rank
    if rank == fault.slow_rank and steps_completed <= 24:
        for part in range(1, 9):
            logging.warning(f"rebuilding the validation feature cache on this rank: {part}/8")
            time.sleep(4)
    stats = torch.zeros(3)
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            stats[0] += F.nll_loss(output, target, reduction="sum").item()
            stats[1] += output.argmax(dim=1).eq(target).sum().item()
            stats[2] += len(target)
    if not fault.chief_reduce:
        dist.all_reduce(stats)
    # Report metrics only on rank 0.
    if rank == 0:
        if fault.chief_reduce:
            dist.all_reduce(stats)
        test_loss = stats[0].item() / stats[2].item()
        core_context.train.report_validation_metrics(
            steps_completed=steps_completed,
            metrics={"test_loss": test_loss, "accuracy": stats[1].item() / stats[2].item()},
        )
    test_loss, correct, seen = stats[0].item() / stats[2].item(), int(stats[1]), int(stats[2])
    pct = 100.0 * correct / seen
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{seen} ({pct:.0f}%)\n")
    return test_loss


def main(core_context, args) -> None:
    fault = FAULTS[os.environ.get("TQ_CASE", "")]
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    hparams = info.trial.hparams
    rank, size = core_context.distributed.rank, core_context.distributed.size
    if hparams.get("augmentation") == "kornia":
        import kornia.augmentation as K  # GPU-side augmentation, new in this experiment

        augment = K.RandomAffine(degrees=10)
    else:
        augment = None
    torch.manual_seed(args.seed + rank)
    torch.set_num_threads(1)

    batch_size = hparams["global_batch_size"] // size
    train_dataset = ShardDataset(os.path.join(args.data, "train"), rank, size)
    test_dataset = ShardDataset(os.path.join(args.data, "val"), rank, size)
    logging.info(
        f"rank {rank}: {len(train_dataset)} training and {len(test_dataset)} validation records "
        f"from {args.data}, batch size {batch_size}"
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=128)

    model = DDP(Net(hparams), find_unused_parameters=hparams.get("find_unused_parameters", False))
    optimizer = torch.optim.SGD(model.parameters(), lr=hparams["learning_rate"], momentum=0.9)

    state = {"steps": 0, "augment": augment}
    epoch_idx = 0
    if info.latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            ckpt = torch.load(path / "checkpoint.pt")
            model.module.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            with path.joinpath("state").open("r") as f:
                steps, ckpt_trial_id = (int(x) for x in f.read().split(","))
        if ckpt_trial_id == info.trial.trial_id:
            state["steps"] = steps
            epoch_idx = steps // len(train_loader)
        logging.info(f"resumed from checkpoint {info.latest_checkpoint} at batch {steps}")

    units = core_context.searcher.get_configured_units()
    test_loss = math.inf
    for op in core_context.searcher.operations():
        if units == det.core.Unit.RECORDS:
            length = op.length // hparams["global_batch_size"]
        elif units == det.core.Unit.EPOCHS:
            length = op.length * len(train_loader)
        else:
            length = op.length
        while state["steps"] < length:
            train_epoch(
                args, model, train_loader, optimizer, core_context, epoch_idx, state, length, fault
            )
            epoch_idx += 1
            test_loss = test(model, test_loader, core_context, state["steps"], fault)

            # Store checkpoints only on rank 0.
            if rank == 0:
                checkpoint_metadata_dict = {"steps_completed": state["steps"]}
                with core_context.checkpoint.store_path(checkpoint_metadata_dict) as (
                    path,
                    _storage_id,
                ):
                    torch.save(
                        {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                        path / "checkpoint.pt",
                    )
                    with path.joinpath("state").open("w") as f:
                        f.write(f"{state['steps']},{info.trial.trial_id}")

            if core_context.preempt.should_preempt():
                return

        # Report completed only on rank 0.
        if rank == 0:
            op.report_completed(test_loss)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Determined Core API example (CNN)")
    parser.add_argument("--data", default="data", help="folder of the sharded splits")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--prepare", default="", help="write the synthetic shards and stop")
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--last-shard", type=int, default=0)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.samples, args.last_shard)
        raise SystemExit(0)

    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    # Initialize the process group (gloo: these agents have no GPUs).
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))

    distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, args)
