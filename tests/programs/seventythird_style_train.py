"""A seventy-third training-program style for the generalisation fixtures
(tests/fixtures/real/seventythird-*): an image classifier trained in the way of ColossalAI's
examples (examples/images/resnet/train.py and the Booster tutorials): colossalai.launch_from_torch(),
a DistCoordinator, get_dist_logger() records on rank 0, a Booster whose plugin is chosen by
--plugin (torch_ddp, low_level_zero, hybrid_parallel with --tp_size; torch_ddp_fp16 runs fp32),
a tqdm bar an epoch on the master, an evaluation all-reduced over the ranks, sharded checkpoints
a few epochs (booster.save_model / save_optimizer / save_lr_scheduler, --checkpoint/epoch-N), --resume
ColossalAI itself is re-created in plain torch by tests/programs/seventythird_colossalai (copied
as `colossalai` onto the run's PYTHONPATH); the program is copied into each run's folder as
train.py and started with `colossalai run --nproc_per_node 2 train.py ...`. The data are synthetic
8x8 "images" of 10 classes in data/cifar10/{train,test}.pt (or pre-sharded part-0000K.pt files).
A fault in the code is chosen by a short code in the run folder's .tqc file, never printed
(re-capture with tests/fixtures/real/capture_seventythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import colossalai
import torch
import torch.distributed as dist
from colossalai._fault import case
from colossalai.booster import Booster
from colossalai.booster.plugin import HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin
from colossalai.cluster import DistCoordinator
from colossalai.logging import get_dist_logger
from torch import nn
from torch.optim import Adam
from torch.optim.lr_scheduler import MultiStepLR
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

NUM_CLASSES = 10


class TinyResNet(nn.Module):
    """A stem, one residual MLP block and a head; tp_plan shards the block's MLP."""

    tp_plan = {"block.fc1": "col", "block.fc2": "row"}

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64), nn.GELU())
        self.block = nn.Module()
        self.block.fc1 = nn.Linear(64, 128)
        self.block.act = nn.GELU()
        self.block.fc2 = nn.Linear(128, 64)
        self.head = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + self.block.fc2(self.block.act(self.block.fc1(h)))
        return self.head(h)


def make_data(out: str) -> None:
    """Class blobs in 192 dimensions; in the test split every odd sample's label is noisy."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(NUM_CLASSES, 3 * 8 * 8, generator=g)

    def split(n: int, noisy_odd: bool) -> dict:
        labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
        images = (centers[labels] + 3.5 * torch.randn(n, 3 * 8 * 8, generator=g)).view(n, 3, 8, 8)
        if noisy_odd:
            flip = torch.rand(n, generator=g) < 0.45
            flip[::2] = False
            labels = torch.where(flip, torch.randint(0, NUM_CLASSES, (n,), generator=g), labels)
        return {"images": images, "labels": labels}

    os.makedirs(os.path.join(out, "cifar10"), exist_ok=True)
    torch.save(split(2048, False), os.path.join(out, "cifar10", "train.pt"))
    torch.save(split(512, True), os.path.join(out, "cifar10", "test.pt"))


def build_dataloader(batch_size: int, coordinator: DistCoordinator, plugin, data_path: str):
    test = torch.load(os.path.join(data_path, "test.pt"))
    test_set = TensorDataset(test["images"], test["labels"])
    train_file = os.path.join(data_path, "train.pt")
    if os.path.exists(train_file):
        train = torch.load(train_file)
        train_set = TensorDataset(train["images"], train["labels"])
        train_dataloader = plugin.prepare_dataloader(
            train_set, batch_size=batch_size, shuffle=True, drop_last=True
        )
    else:  # pre-sharded: one part a rank
        part = torch.load(os.path.join(data_path, f"part-{coordinator.rank:05d}.pt"))
        train_set = TensorDataset(part["images"], part["labels"])
        train_dataloader = DataLoader(
            train_set, batch_size=batch_size, shuffle=True, drop_last=True
        )
    test_dataloader = plugin.prepare_dataloader(
        test_set, batch_size=100, shuffle=False, drop_last=False
    )
    return train_dataloader, test_dataloader


@torch.no_grad()
def evaluate(
    model: nn.Module, test_dataloader, coordinator: DistCoordinator
) -> tuple[float, float]:
    model.eval()
    correct = torch.zeros(1, dtype=torch.int64)
    total = torch.zeros(1, dtype=torch.int64)
    for images, labels in test_dataloader:
        outputs = model(images)
        _, predicted = torch.max(outputs.data, 1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
    local = correct.item() / total.item()
    dist.all_reduce(correct)
    dist.all_reduce(total)
    accuracy = correct.item() / total.item()
    model.train()
    return accuracy, local


def sample_predictions(model: nn.Module, test_dataloader, coordinator: DistCoordinator) -> None:
    """Per-class confusion over the whole test set, with test-time augmentation (master only)."""
    model.eval()
    with torch.no_grad():
        batches = list(test_dataloader.dataset.tensors[0].split(64))
        for images in tqdm(
            batches, desc="Sampling predictions", disable=not coordinator.is_master()
        ):
            for _ in range(8):
                model(images + 0.01 * torch.randn_like(images))
                time.sleep(0.6)
    model.train()


def train_epoch(
    epoch: int,
    num_epochs: int,
    model,
    optimizer,
    criterion,
    train_dataloader,
    booster,
    coordinator,
    lr_scheduler,
) -> float:
    model.train()
    total_loss = 0.0
    with tqdm(
        train_dataloader,
        desc=f"Epoch [{epoch + 1}/{num_epochs}]",
        disable=not coordinator.is_master(),
    ) as pbar:
        for images, labels in pbar:
            outputs = model(images)
            loss = criterion(outputs.float(), labels)
            booster.backward(loss, optimizer)
            optimizer.step()
            optimizer.zero_grad()
            total_loss += loss.item()
            pbar.set_postfix({"loss": loss.item()})
    lr_scheduler.step()
    return total_loss / max(1, len(train_dataloader))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "-p",
        "--plugin",
        type=str,
        default="torch_ddp",
        choices=["torch_ddp", "torch_ddp_fp16", "low_level_zero", "hybrid_parallel"],
        help="plugin to use",
    )
    parser.add_argument(
        "--tp_size", type=int, default=1, help="tensor parallel size (hybrid_parallel)"
    )
    parser.add_argument("-e", "--epochs", type=int, default=3)
    parser.add_argument("-b", "--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "-r", "--resume", type=int, default=-1, help="resume from the epoch's checkpoint"
    )
    parser.add_argument(
        "-c", "--checkpoint", type=str, default="./checkpoint", help="checkpoint directory"
    )
    parser.add_argument(
        "-i", "--interval", type=int, default=1, help="interval of saving checkpoint"
    )
    parser.add_argument("--data_path", type=str, default="./data/cifar10")
    parser.add_argument(
        "--target_acc", type=float, default=None, help="stop once the test accuracy reaches it"
    )
    parser.add_argument("--initial_scale", type=float, default=2**5)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--consolidate", action="store_true", help="also save one consolidated optimizer file"
    )
    parser.add_argument("--async_save", action="store_true")
    parser.add_argument("--sample_preds", action="store_true")
    parser.add_argument("--comm_timeout", type=int, default=12, help="seconds")
    parser.add_argument("--legacy_config", action="store_true")
    args = parser.parse_args()
    fault = case()

    # ==============================
    # Launch Distributed Environment
    # ==============================
    colossalai.launch_from_torch(
        config={} if args.legacy_config else None,
        seed=42,
        timeout=timedelta(seconds=args.comm_timeout),
    )
    coordinator = DistCoordinator()
    logger = get_dist_logger()

    # ==============================
    # Instantiate Plugin and Booster
    # ==============================
    booster_kwargs = {}
    if args.plugin.startswith("torch_ddp"):
        plugin = TorchDDPPlugin()
    elif args.plugin == "low_level_zero":
        plugin = LowLevelZeroPlugin(initial_scale=args.initial_scale, verbose=args.verbose)
    elif args.plugin == "hybrid_parallel":
        plugin = HybridParallelPlugin(
            tp_size=args.tp_size, pp_size=1, zero_stage=0, precision="fp32"
        )
    if args.plugin == "torch_ddp_fp16":
        booster_kwargs["mixed_precision"] = "fp16"
    booster = Booster(plugin=plugin, **booster_kwargs)

    # ==============================
    # Prepare Dataloader
    # ==============================
    logger.info(f"Building dataloaders from {args.data_path}", ranks=[0])
    train_dataloader, test_dataloader = build_dataloader(
        args.batch_size, coordinator, plugin, args.data_path
    )

    # ====================================
    # Prepare model, optimizer, criterion
    # ====================================
    model = TinyResNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=args.lr)
    lr_scheduler = MultiStepLR(optimizer, milestones=[20, 40], gamma=0.1)
    model, optimizer, criterion, _, lr_scheduler = booster.boost(
        model, optimizer, criterion=criterion, lr_scheduler=lr_scheduler
    )
    logger.info(
        f"Booster initialized with the {args.plugin} plugin, {len(train_dataloader)} steps an epoch",
        ranks=[0],
    )

    # ==============================
    # Resume from checkpoint
    # ==============================
    start_epoch = 0
    if args.resume >= 0:
        ckpt = f"{args.checkpoint}/epoch-{args.resume}"
        logger.info(f"Resuming from {ckpt}", ranks=[0])
        booster.load_model(model, f"{ckpt}/model")
        booster.load_optimizer(optimizer, f"{ckpt}/optimizer")
        booster.load_lr_scheduler(lr_scheduler, f"{ckpt}/lr_scheduler.pt")
        start_epoch = args.resume

    @coordinator.on_master_only()
    def log_epoch(epoch: int, loss: float, accuracy: float) -> None:
        mean = torch.tensor([loss])
        if fault == "r0":  # the logged loss, averaged over the ranks
            dist.all_reduce(mean)
            mean /= coordinator.world_size
        logger.info(
            f"Epoch {epoch + 1}: train loss {mean.item():.4f}, test accuracy {accuracy * 100:.2f} %",
            ranks=[0],
        )

    # ==============================
    # Train model
    # ==============================
    for epoch in range(start_epoch, args.epochs):
        loss = train_epoch(
            epoch,
            args.epochs,
            model,
            optimizer,
            criterion,
            train_dataloader,
            booster,
            coordinator,
            lr_scheduler,
        )
        accuracy, local = evaluate(model, test_dataloader, coordinator)
        log_epoch(epoch, loss, accuracy)
        if args.sample_preds and coordinator.is_master():
            sample_predictions(model, test_dataloader, coordinator)

        # save checkpoint
        if args.interval > 0 and (epoch + 1) % args.interval == 0:
            ckpt = f"{args.checkpoint}/epoch-{epoch + 1}"
            logger.info(f"Saving checkpoint to {ckpt}", ranks=[0])
            booster.save_model(model, f"{ckpt}/model", shard=True, use_async=args.async_save)
            booster.save_optimizer(optimizer, f"{ckpt}/optimizer", shard=True)
            if args.consolidate:
                booster.save_optimizer(optimizer, f"{ckpt}/optimizer.pt", shard=False)
            booster.save_lr_scheduler(lr_scheduler, f"{ckpt}/lr_scheduler.pt")

        if args.target_acc is not None:
            reached = local if fault == "s0" else accuracy
            if reached >= args.target_acc:
                logger.info(
                    f"Test accuracy {reached * 100:.2f} % reached the target {args.target_acc * 100:.2f} %, stopping early",
                    ranks=None if fault == "s0" else [0],
                )
                break

    coordinator.print_on_master(f"Accuracy of the model on the test images: {accuracy * 100:.2f} %")


if __name__ == "__main__":
    if len(os.sys.argv) == 3 and os.sys.argv[1] == "--make-data":
        make_data(os.sys.argv[2])
    else:
        main()
