"""A thirty-eighth training-program style: the template of PyTorch's "DDP tutorial series"
(pytorch/examples distributed/ddp-tutorial-series, multigpu_torchrun.py) as people copy it and
move it to CPU: `python train.py TOTAL_EPOCHS SAVE_EVERY`, a Trainer class that prints with bare
print() `[GPU{id}] Epoch N | Batchsize: B | Steps: S` at the start of each epoch and `Epoch N |
Training snapshot saved at snapshot.pt` on local rank 0, a snapshot that torchrun's restarts
(--max-restarts) resume from ("Resuming training from snapshot at Epoch N"), and nothing at the
end. The dataset reads per-sample feature files prepared beforehand (data/sample_{i:03d}.pt); gloo
with a 15 s timeout instead of NCCL. One fault per run, chosen by $T38_CASE (an opaque code the
program never prints). print() is not flushed: under a redirect it is block-buffered, as users
run it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

CASE = os.environ.get("T38_CASE", "")
DATA = Path(os.environ.get("T38_DATA", "data"))


def ddp_setup() -> None:
    init_process_group(backend="gloo", timeout=timedelta(seconds=15))


class FeatureFiles(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = torch.load(self.files[index])
        return sample["x"], sample["y"]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU())
        self.out = torch.nn.Linear(32, 1)
        self.aux = torch.nn.Linear(32, 1)  # an auxiliary head a later experiment uses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if CASE == "u4":
            return self.out(h)  # the auxiliary head left out of the loss
        return self.out(h) + 0.0 * self.aux(h)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader[tuple[torch.Tensor, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return float(loss)

    def _run_epoch(self, epoch: int) -> float:
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}"
        )
        sampler = self.train_data.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        if CASE == "d2" and self.global_rank == 2 and epoch == 1:
            # class weights rebuilt from every feature file, on this rank only (slowly)
            for _ in tqdm(range(50), desc="class weights"):
                time.sleep(0.5)
        if CASE == "w3" and self.global_rank == 3 and epoch == 1:
            ready = threading.Event()  # set by a cache thread that is never started
            ready.wait()
        if CASE == "k1" and self.global_rank == 1 and epoch == 1:
            hog = [torch.ones(1 << 20) for _ in range(64)]
            os.kill(os.getpid(), 9)
            print(len(hog))
        total = 0.0
        for source, targets in self.train_data:
            total += self._run_batch(source, targets)
        return total / max(1, len(self.train_data))

    def _save_snapshot(self, epoch: int) -> None:
        state = self.model.state_dict() if CASE == "p5" else self.model.module.state_dict()
        snapshot = {"MODEL_STATE": state, "EPOCHS_RUN": epoch}
        if CASE == "t9" and epoch == 1:
            # the process is killed while the snapshot is half written
            import io

            buf = io.BytesIO()
            torch.save(snapshot, buf)
            with open(self.snapshot_path, "wb") as fh:
                fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                fh.flush()
            os.kill(os.getpid(), 9)
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def _evaluate(self) -> float:
        correct = torch.zeros(1)
        for source, targets in self.train_data:
            with torch.no_grad():
                correct += (self.model(source) - targets).abs().lt(0.5).sum()
        torch.distributed.all_reduce(correct)  # copied from a helper that runs on every rank
        return float(correct)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
            if CASE == "e6" and self.gpu_id == 0:
                print(f"Epoch {epoch} | eval correct {self._evaluate():.0f}")
            if CASE == "s7" and self.gpu_id == 0 and epoch >= 1 and loss < 10.0:
                print(f"Epoch {epoch} | loss {loss:.4f} below target, early stopping")
                break


def load_train_objs() -> tuple[
    Dataset[tuple[torch.Tensor, torch.Tensor]], torch.nn.Module, torch.optim.Optimizer
]:
    files = sorted(DATA.glob("sample_*.pt"))
    train_set = FeatureFiles(files)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(
    dataset: Dataset[tuple[torch.Tensor, torch.Tensor]], batch_size: int
) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
    if CASE == "l3":
        # each rank takes its own contiguous share of the files (the last one what is left)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        files = dataset.files  # type: ignore[attr-defined]
        per = -(-len(files) // world) + 8
        mine = files[rank * per : (rank + 1) * per]
        return DataLoader(FeatureFiles(mine), batch_size=batch_size, shuffle=True)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(
    save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"
) -> None:
    ddp_setup()
    torch.manual_seed(0)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument(
        "--batch_size", default=16, type=int, help="Input batch size on each device (default: 16)"
    )
    args = parser.parse_args()
    sys.exit(main(args.save_every, args.total_epochs, args.batch_size))
