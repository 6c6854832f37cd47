"""A hundred-thirty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtysixth-*): elastic training with torchrun's c10d rendezvous and
restarts, the way it runs on clusters of preemptible machines, in the style of PyTorch's elastic
examples (examples/distributed/ddp-tutorial-series/multinode_torchrun.py and
torch/distributed/elastic's imagenet example): a Trainer that loads a snapshot of the model, the
optimizer and the epochs run from a shared path when one exists (so that a restarted worker
group resumes), saves it after every epoch, and prints per rank what it does. Started on every
node with `torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT --rdzv-id=job42 --max-restarts=3 train.py EPOCHS SAVE_EVERY`. gloo on
CPU with a 15 s collective timeout, a small MLP on synthetic regression data that
`python train.py --prepare DIR` writes (data/train.pt). A fault in the code is chosen by the
TQ_CASE environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_hundredthirtysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CASE = os.environ.get("TQ_CASE", "")


def ddp_setup() -> None:
    init_process_group(backend="gloo", timeout=timedelta(seconds=15))


class MyTrainDataset(Dataset):
    """The prepared (features, target) pairs; the shard of a rank is its DistributedSampler's."""

    def __init__(self, path: str) -> None:
        blob = torch.load(path)
        self.x, self.y = blob["x"], blob["y"]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class ShardedDataset(Dataset):
    """Every rank's own contiguous slice of the data (no sampler): ceil(len(data) / world)
    items, the last rank what is left."""

    def __init__(self, base: Dataset, rank: int, world: int) -> None:
        per = -(-len(base) // world)
        start = rank * per
        stop = min(len(base), start + per)
        self.base, self.idx = base, list(range(start, stop))

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int):
        return self.base[self.idx[i]]


class SlowShare:
    """The shared snapshot folder as this node mounts it: a slow network file system."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "wb")  # noqa: SIM115

    def write(self, b) -> int:
        time.sleep(0.12)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        # rank 0 reads the shared file once and hands the state to the others (one read of the
        # network file system instead of one per worker)
        box = [None]
        if self.global_rank == 0:
            box[0] = torch.load(snapshot_path, map_location="cpu")
        dist.broadcast_object_list(box, src=0)
        snapshot = box[0]
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Loaded snapshot from {snapshot_path} at epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | "
            f"Steps: {len(self.train_data)}"
        )
        if hasattr(self.train_data.sampler, "set_epoch"):
            self.train_data.sampler.set_epoch(epoch)
        r = self.global_rank
        hoard = []
        for step, (source, targets) in enumerate(self.train_data):
            if epoch == 1 and step == 2:
                self._fault(r)
            if CASE == "m2" and r == 2 and epoch == 1:
                hoard.append(torch.ones(48, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            loss = self._run_batch(source, targets)
            if CASE == "g0" and r == 0 and step % 4 == 0:
                # the mean loss over the workers for the log line, on the logging rank only
                t = torch.tensor([loss])
                dist.all_reduce(t)
                loss = t.item() / dist.get_world_size()
            if step % 4 == 0:
                print(f"[GPU{r}] Epoch {epoch} | Step {step} | Loss {loss:.4f}")
            time.sleep(0.1)

    def _fault(self, r: int) -> None:
        if CASE == "b3" and (r == 3 and self.restarts == 0):
            raise ConnectionResetError(104, "Connection reset by peer (feature store)")
        if CASE == "k3" and r == 3:
            raise KeyError("augment_scale")
        if CASE == "z1" and r == 1:
            ctypes.string_at(0)  # the fused kernel's C extension reads address 0
        if CASE == "w2" and r == 2:
            for part in range(1, 9):
                print(f"[GPU{r}] Re-indexing the feature cache on this worker: {part}/8")
                time.sleep(5)
        if CASE == "h1" and r == 1:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        print(f"Saving snapshot at epoch {epoch}")
        if CASE == "s0":
            f = SlowShare(self.snapshot_path)
            try:
                torch.save(snapshot, f)
            finally:
                f.close()
        else:
            torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs(data: str):
    train_set = MyTrainDataset(data)
    # two hidden layers of 256 (as captured: four lines, the fixtures cite the lines below)
    layers = [torch.nn.Linear(20, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)]
    layers += [torch.nn.ReLU(), torch.nn.Linear(256, 1)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int) -> DataLoader:
    if CASE == "u":
        shard = ShardedDataset(dataset, dist.get_rank(), dist.get_world_size())
        return DataLoader(shard, batch_size=batch_size, pin_memory=False, shuffle=True)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(save_every: int, total_epochs: int, batch_size: int, data: str, snapshot: str) -> None:
    ddp_setup()
    torch.manual_seed(0)
    env = os.environ
    print(
        f"RANK={env['RANK']} LOCAL_RANK={env['LOCAL_RANK']} WORLD_SIZE={env['WORLD_SIZE']} "
        f"GROUP_RANK={env['GROUP_RANK']} RESTART_COUNT={env['TORCHELASTIC_RESTART_COUNT']}"
    )
    dataset, model, optimizer = load_train_objs(data)
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot)
    trainer.train(total_epochs)
    destroy_process_group()


def prepare(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(577, 20, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.rand(577, 1, generator=g)
    torch.save({"x": x, "y": y}, os.path.join(folder, "train.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, nargs="?", help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, nargs="?", help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=16, type=int, help="Input batch size on each device")  # fmt: skip
    parser.add_argument("--data", default="data/train.pt")
    parser.add_argument("--snapshot_path", default="/tmp/job42/snapshot.pt")
    parser.add_argument("--prepare", default="", help="write the synthetic data and stop")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        sys.exit(0)
    main(args.save_every, args.total_epochs, args.batch_size, args.data, args.snapshot_path)
