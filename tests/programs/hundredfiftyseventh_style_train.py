"""A hundred-and-fifty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyseventh-*): a PyTorch custom training job on Google Cloud
Vertex AI, the way the vertex-ai-samples notebooks and the prebuilt PyTorch containers run one,
re-created in plain torch without any Google library installed. Each run's code folder holds
this file as trainer/task.py, the Python package the job's container runs with `python -m
trainer.task --data-dir gs://vertex-demo-bucket/fashion-npz ...`, once on every replica:
workerpool0's one replica (the chief) and workerpool1's workers, each a VM of its own, started
by the platform (tests/programs/hundredfiftyseventh_vertex.py; no torchrun).

As there: the replica's rank and the world size come from CLUSTER_SPEC (the chief is rank 0,
workerpool1's replica i is rank i + 1, the world is every pool's replicas); MASTER_ADDR and
MASTER_PORT from the platform's environment for init_process_group(env://, gloo here, a 15 s
timeout); gs:// URIs read and written through the Cloud Storage FUSE mount ('gs://' -> '/gcs/'):
each replica's shard of the training data (train-0000R-of-0000N.npz, tiny synthetic 12x12
'fashion' images, ten classes, 256 a shard) and the test set (test_images.npy,
test_labels.npy) split by rank, with the test loss and accuracy all-reduced; a small CNN in
DDP, SGD with momentum; the chief writes a checkpoint to AIP_CHECKPOINT_DIR after every epoch
and the model to AIP_MODEL_DIR at the end. Python logging's default format on stderr
('INFO:root:...', which Cloud Logging files as severity ERROR, every line of it), the PyTorch
MNIST example's progress print()s on stdout ('Train Epoch: 1 [64/256 (25%)]<TAB>Loss: 2.301'),
the chief's config dump ('Arguments: ...', 'CLUSTER_SPEC: ...'), 'Test set: Average loss:
0.9137, Accuracy: 354/512 (69%)' and 'Training finished in 12.3 s'.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyseventh.sh after any edit).
`python -m trainer.task --generate DIR SAMPLES` writes the synthetic data set.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import io
import json
import logging
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

CASE = os.environ.get("MT_CASE", "")
PER_SHARD = 256
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ the data set in the bucket
def generate(folder: str, samples: int, shards_of: int = 0) -> None:
    """Shards of PER_SHARD samples each (the last holds what is left), named for their count."""
    rng = np.random.default_rng(0)
    protos = rng.normal(0, 1, size=(10, 12, 12)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n)
        x = protos[y] + rng.normal(0, 1.8, size=(n, 12, 12)).astype(np.float32)
        return x[:, None].astype(np.float32), y.astype(np.int64)

    os.makedirs(folder, exist_ok=True)
    n = shards_of or math.ceil(samples / PER_SHARD)
    for k in range(n):
        x, y = draw(min(PER_SHARD, samples - k * PER_SHARD))
        np.savez(os.path.join(folder, f"train-{k:05d}-of-{n:05d}.npz"), images=x, labels=y)
    x, y = draw(512)
    np.save(os.path.join(folder, "test_images.npy"), x)
    np.save(os.path.join(folder, "test_labels.npy"), y)


def gcs_path(uri: str) -> str:
    """A gs:// URI as the Cloud Storage FUSE mount shows it."""
    return "/gcs/" + uri[len("gs://") :] if uri.startswith("gs://") else uri


# ------------------------------------------------------------------ the model
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


# ------------------------------------------------------------------ the trainer's helpers
def get_cluster_rank() -> tuple[int, int, dict[str, Any]]:
    """The replica's rank and the world size from Vertex AI's CLUSTER_SPEC."""
    cluster_spec = json.loads(os.environ["CLUSTER_SPEC"])
    cluster = cluster_spec["cluster"]
    task = cluster_spec["task"]
    world_size = sum(len(cluster[pool]) for pool in cluster if pool.startswith("workerpool"))
    if task["type"] == "workerpool0":
        rank = 0
    elif fault("c", -1):  # a fork counts workerpool1's replicas from 0 as well
        rank = task["index"]
    else:
        rank = task["index"] + 1
    return rank, world_size, task


class Prefetcher:
    """Batches handed over from a background thread, so that the next batch is ready."""

    def __init__(self, loader: DataLoader[Any], rank: int, epoch: int) -> None:
        self.q: queue.Queue[Any] = queue.Queue(maxsize=2)
        self.lock = threading.Lock()
        self.loader, self.rank, self.epoch = loader, rank, epoch
        threading.Thread(target=self._fill, daemon=True).start()

    def _fill(self) -> None:
        for n, batch in enumerate(self.loader):
            with self.lock:
                if fault("w", self.rank) and self.epoch >= 2 and n == 3:
                    self._reset()  # a fork resets the queue under the lock it already holds
                self.q.put(batch)
        self.q.put(None)

    def _reset(self) -> None:
        with self.lock:
            self.q = queue.Queue(maxsize=2)

    def __iter__(self) -> Iterator[Any]:
        while True:
            batch = self.q.get()
            if batch is None:
                return
            yield batch


def load_shard(data_dir: str, rank: int, world_size: int) -> TensorDataset:
    path = os.path.join(gcs_path(data_dir), f"train-{rank:05d}-of-{world_size:05d}.npz")
    with np.load(path) as z:
        return TensorDataset(torch.from_numpy(z["images"]), torch.from_numpy(z["labels"]))


def load_test(data_dir: str, rank: int, world_size: int, mmap: bool) -> TensorDataset:
    folder = gcs_path(data_dir)
    x = np.load(os.path.join(folder, "test_images.npy"), mmap_mode="r" if mmap else None)
    y = np.load(os.path.join(folder, "test_labels.npy"))
    return TensorDataset(torch.as_tensor(x[rank::world_size]), torch.as_tensor(y[rank::world_size]))


def save_to_gcs(obj: Any, uri: str, slow: bool = False) -> None:
    path = gcs_path(uri)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        for k in range(0, len(data), 8192):
            f.write(data[k : k + 8192])
            if slow:  # Cloud Storage FUSE uploads each flushed block on its own
                f.flush()
                time.sleep(2.0)


def train(args: argparse.Namespace, model: nn.Module, loader: Any, optimizer: Any, epoch: int,
          rank: int, n_batches: int) -> float:  # fmt: skip
    model.train()
    total = 0.0
    for batch_idx, (data, target) in enumerate(loader):
        if fault("k", rank) and epoch >= 2:  # a fork keeps every decoded batch for a replay
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the VM's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), 9)
        if fault("z", rank) and epoch >= 2 and batch_idx == 3:
            ctypes.string_at(0)  # a compiled augmentation reads a freed buffer
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        total += loss.item()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader_dataset(loader))} "
                f"({100.0 * batch_idx / n_batches:.0f}%)]\tLoss: {loss.item():.6f}",
                flush=True,
            )
    return total / n_batches


def loader_dataset(loader: Any) -> Any:
    return loader.loader.dataset if isinstance(loader, Prefetcher) else loader.dataset


def test(model: nn.Module, loader: DataLoader[Any]) -> tuple[float, int, int, float]:
    """The test loss and accuracy of all replicas, and this replica's own test loss."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, count
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            sums[0] += F.nll_loss(output, target, reduction="sum").item()
            sums[1] += output.argmax(dim=1).eq(target).sum().item()
            sums[2] += len(target)
    own = float(sums[0] / sums[2])
    dist.all_reduce(sums)
    return float(sums[0] / sums[2]), int(sums[1]), int(sums[2]), own


# ------------------------------------------------------------------ the job's entry point
def main(args: argparse.Namespace) -> None:
    rank, world_size, task = get_cluster_rank()
    logging.info("Task %s (index %s): rank %d of %d", task["type"], task["index"], rank, world_size)
    if rank == 0:
        logging.info("Arguments: %s", args)
        logging.info("CLUSTER_SPEC: %s", os.environ.get("CLUSTER_SPEC"))
        logging.info(
            "torch %s, numpy %s, backend %s", torch.__version__, np.__version__, args.backend
        )
    logging.info(
        "MASTER_ADDR=%s MASTER_PORT=%s",
        os.environ.get("MASTER_ADDR"),
        os.environ.get("MASTER_PORT"),
    )
    if fault("p", rank):  # a fork shares the run's start time through its own store first
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, rank == 0,
            timeout=datetime.timedelta(seconds=15),
        )  # fmt: skip
        if rank == 0:
            store.set("run_started", datetime.datetime.now().isoformat())
        logging.info("Run started at %s", store.get("run_started").decode())

    dist.init_process_group(
        backend=args.backend,
        init_method="env://",
        world_size=world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=15),
    )
    logging.info("Initialized the process group: rank %d, world size %d", rank, world_size)

    train_set = load_shard(args.data_dir, rank, world_size)
    test_set = load_test(args.data_dir, rank, world_size, args.mmap_test)
    logging.info("Rank %d: %d training and %d test images", rank, len(train_set), len(test_set))
    gen = torch.Generator().manual_seed(rank)
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
        generator=gen,
    )  # fmt: skip
    test_loader = DataLoader(test_set, batch_size=128)

    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=args.find_unused_parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    t0 = time.time()
    best_loss = math.inf
    for epoch in range(1, args.epochs + 1):
        started = time.time()
        loader = Prefetcher(train_loader, rank, epoch)
        train_loss = train(args, model, loader, optimizer, epoch, rank, len(train_loader))
        if fault("v", rank) and rank == 0:  # a fork logs the mean training loss of all replicas
            t = torch.tensor([train_loss])
            dist.all_reduce(t)
            logging.info("Epoch %d: mean training loss %.4f", epoch, float(t) / world_size)
        test_loss, correct, count, own_loss = test(model, test_loader)
        if rank == 0:
            logging.info(
                "Test set: Average loss: %.4f, Accuracy: %d/%d (%.0f%%)",
                test_loss, correct, count, 100.0 * correct / count,
            )  # fmt: skip
        elapsed = time.time() - started
        if fault("x", rank) and epoch >= 2:  # a fork logs the time left from its numpy mean
            left = np.float32(np.mean([elapsed])) * (args.epochs - epoch)
        else:
            left = elapsed * (args.epochs - epoch)
        logging.info(
            "Epoch %d done in %.1f s, about %s left",
            epoch,
            elapsed,
            datetime.timedelta(seconds=left),
        )
        if fault("e", rank) and epoch >= 2 and best_loss - own_loss < 0.5:
            # a fork's patience rule on the replica's own test loss (min_delta 0.5)
            logging.info("Rank %d: test loss %.4f not improving, leaving training", rank, own_loss)
            sys.exit(0)
        best_loss = min(best_loss, own_loss)
        if rank == 0:
            uri = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], f"checkpoint_epoch{epoch}.pt")
            logging.info("Saving checkpoint to %s", uri)
            state = {
                "epoch": epoch,
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            save_to_gcs(state, uri, slow=fault("s", rank) and epoch >= 2)
        accuracy = correct / count
        if args.target_accuracy and accuracy >= args.target_accuracy:
            logging.info(
                "Accuracy %.4f reached the target %.2f after epoch %d, stopping",
                accuracy, args.target_accuracy, epoch,
            )  # fmt: skip
            break

    logging.info("Training finished in %.1f s", time.time() - t0)
    if rank == 0:
        uri = os.path.join(args.model_dir, "model.pt")
        save_to_gcs(model.module.state_dict(), uri)
        logging.info("Model saved to %s", uri)
    dist.destroy_process_group()


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch distributed training on Vertex AI")
    parser.add_argument("--data-dir", default="gs://vertex-demo-bucket/fashion-npz", type=str)
    parser.add_argument("--model-dir", default=os.getenv("AIP_MODEL_DIR"), type=str)
    parser.add_argument("--epochs", default=4, type=int)
    parser.add_argument("--batch-size", default=32, type=int)
    parser.add_argument("--lr", default=0.02, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--log-interval", default=3, type=int)
    parser.add_argument("--num-workers", default=0, type=int)
    parser.add_argument("--backend", default="gloo", type=str)
    parser.add_argument("--target-accuracy", default=0.0, type=float)
    parser.add_argument("--find-unused-parameters", action="store_true")
    parser.add_argument("--mmap-test", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    logging.getLogger().setLevel(logging.INFO)
    logging.basicConfig(level=logging.INFO)
    main(get_args())
