"""A hundred-and-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfifth-*): the user's entry point of a SageMaker PyTorch estimator
with `distribution={"mpi": {"enabled": True}}`, written the way the SageMaker PyTorch MNIST
examples are written. Copied into each host's /opt/ml/code as train.py and started by the
re-created training toolkit (tests/programs/hundredfifth_toolkit.py) through mpirun; every
hyperparameter arrives as a command-line string, the paths come from SM_* variables (model_dir,
the training and testing channels), the rank from OpenMPI's OMPI_COMM_WORLD_*, MASTER_ADDR and
MASTER_PORT from the PyTorch container. `logging.getLogger(__name__)` with a bare
StreamHandler on stdout ('Train Epoch: 1 [0/1120 (0%)] Loss: 2.301585', 'Test set: Average loss:
...'), the classic MNIST CNN under DDP on gloo (CPU), a DistributedSampler over a fully
replicated channel or each host's own files of a channel sharded by S3 key, a checkpoint in
/opt/ml/checkpoints for Spot training (rank 0) and a SIGTERM handler for the Spot interruption,
the model saved to model_dir/model.pth with its code/ on the master host only, model_fn for the
inference container. `python train.py --prepare DIR` writes synthetic MNIST-like shards.
A fault in the code is chosen by $TQ_CASE and never printed; the others come from what a run is
given (hyperparameters, channels, the cluster).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)
logger.setLevel(logging.DEBUG)
logger.addHandler(logging.StreamHandler(sys.stdout))

CASE = os.environ.get("TQ_CASE", "")
SHARDS = 5
PER_SHARD = 448
TEST = 512

_stop_requested = False


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        if CASE == "w":  # the example as first copied, before its dim= fix
            return F.log_softmax(x)
        return F.log_softmax(x, dim=1)


def prepare(out: Path) -> None:
    """Synthetic MNIST-like digits: a fixed stroke template per class plus noise and a shift,
    uint8 28x28, written as the S3 prefix holds them (training/train-0N.pt, testing/test.pt)."""
    gen = torch.Generator().manual_seed(105)
    templates = (torch.rand(10, 28, 28, generator=gen) > 0.78).float()

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 10, (n,), generator=gen)
        imgs = templates[labels] * 0.7 + torch.rand(n, 28, 28, generator=gen) * 0.6
        shift = int(torch.randint(-2, 3, (1,), generator=gen))
        imgs = torch.roll(imgs, shift, dims=2)
        return (imgs.clamp(0, 1) * 255).to(torch.uint8), labels

    (out / "training").mkdir(parents=True, exist_ok=True)
    (out / "testing").mkdir(parents=True, exist_ok=True)
    for k in range(SHARDS):
        x, y = draw(PER_SHARD)
        torch.save((x, y), out / "training" / f"train-{k:02d}.pt")
    x, y = draw(TEST)
    torch.save((x, y), out / "testing" / "test.pt")


def _to_dataset(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> TensorDataset:
    x = torch.cat([p[0] for p in parts]).float().div(255.0).sub(0.1307).div(0.3081)
    y = torch.cat([p[1] for p in parts])
    return TensorDataset(x.unsqueeze(1), y)


def _get_train_data_loader(batch_size, training_dir, is_distributed, sharded, **kwargs):
    logger.info("Get train data loader")
    files = [f for f in sorted(os.listdir(training_dir)) if f.startswith("train-")]
    dataset = _to_dataset([torch.load(os.path.join(training_dir, f)) for f in files])
    # a channel sharded by S3 key already gives each host its own part of the data
    train_sampler = DistributedSampler(dataset) if is_distributed and not sharded else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train_sampler is None,
        sampler=train_sampler,
        **kwargs,
    )


def _get_test_data_loader(test_batch_size, testing_dir, **kwargs):
    logger.info("Get test data loader")
    dataset = _to_dataset([torch.load(os.path.join(testing_dir, "test.pt"))])
    return DataLoader(dataset, batch_size=test_batch_size, shuffle=True, **kwargs)


def _normalisation_stats(args, is_master_rank):
    """The channel's pixel mean and std, computed once by rank 0 and shared through
    /opt/ml/checkpoints so that every rank (and a resumed Spot job) uses the same values."""
    path = os.path.join(args.checkpoint_dir, "norm_stats.pt")
    if is_master_rank:
        files = sorted(Path(args.data_dir).glob("train-*.pt"))
        pixels = torch.cat([torch.load(f)[0] for f in files]).float().div(255.0)
        stats = {"mean": pixels.mean().item(), "std": pixels.std().item()}
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save(stats, path)
        logger.info("Normalisation stats: mean {mean:.4f}, std {std:.4f}".format(**stats))
        return stats
    while not os.path.exists(path):
        time.sleep(1)
    return torch.load(path)


def _on_sigterm(signum, frame):
    # Spot instances get a SIGTERM before they are reclaimed: checkpoint at the next step
    global _stop_requested
    _stop_requested = True
    logger.info("Received SIGTERM, saving a checkpoint before the instance is reclaimed")


def save_checkpoint(model, optimizer, scheduler, epoch, checkpoint_dir):
    path = os.path.join(checkpoint_dir, "checkpoint.pth")
    logger.info("Saving checkpoint to {}".format(path))
    os.makedirs(checkpoint_dir, exist_ok=True)
    torch.save(
        {
            "epoch": epoch,
            "model_state_dict": model.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler": scheduler,
        },
        path,
    )


def train(args):
    is_distributed = len(args.hosts) > 1 and args.backend is not None
    logger.debug("Distributed training - {}".format(is_distributed))
    use_cuda = args.num_gpus > 0
    logger.debug("Number of gpus available - {}".format(args.num_gpus))
    device = torch.device("cuda" if use_cuda else "cpu")
    rank = 0

    if is_distributed:
        # mpirun starts one process per GPU (one per host on CPU instances)
        local_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1))
        world_size = len(args.hosts) * local_size
        os.environ["WORLD_SIZE"] = str(world_size)
        host_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ["RANK"] = str(host_rank)
        dist.init_process_group(
            backend=args.backend,
            rank=host_rank,
            world_size=world_size,
            timeout=timedelta(seconds=args.dist_timeout),
        )
        rank = dist.get_rank()
        logger.info(
            "Initialized the distributed environment: '{}' backend on {} nodes. ".format(
                args.backend, dist.get_world_size()
            )
            + "Current host rank is {}. Number of gpus: {}".format(dist.get_rank(), args.num_gpus)
        )

    signal.signal(signal.SIGTERM, _on_sigterm)
    torch.manual_seed(args.seed)

    if args.normalize == "dataset":
        _normalisation_stats(args, rank == 0)

    sharded = (
        args.input_data_config.get("training", {}).get("S3DistributionType") == "ShardedByS3Key"
    )
    kwargs = {"num_workers": args.num_workers} if args.num_workers else {}
    train_loader = _get_train_data_loader(
        args.batch_size, args.data_dir, is_distributed, sharded, **kwargs
    )
    test_loader = _get_test_data_loader(args.test_batch_size, args.test_dir, **kwargs)

    logger.debug(
        "Processes {}/{} ({:.0f}%) of train data".format(
            len(train_loader.sampler),
            len(train_loader.dataset),
            100.0 * len(train_loader.sampler) / len(train_loader.dataset),
        )
    )
    logger.debug(
        "Processes {}/{} ({:.0f}%) of test data".format(
            len(test_loader.sampler),
            len(test_loader.dataset),
            100.0 * len(test_loader.sampler) / len(test_loader.dataset),
        )
    )

    model = Net().to(device)
    if is_distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)

    # linear scaling rule: the learning rate grows with the number of processes
    lr = args.lr * (dist.get_world_size() if is_distributed else 1)
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    if args.warmup_epochs:
        scheduler = optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: min(1.0, (epoch + 1) / (args.warmup_epochs + 1))
        )
    else:
        scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

    start_epoch = 1
    ckpt = os.path.join(args.checkpoint_dir, "checkpoint.pth")
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model_state_dict"])
        optimizer.load_state_dict(state["optimizer_state_dict"])
        start_epoch = state["epoch"] + 1
        logger.info("Resuming from checkpoint {} at epoch {}".format(ckpt, start_epoch))

    best, best_epoch = 0.0, 0
    for epoch in range(start_epoch, args.epochs + 1):
        model.train()
        if isinstance(train_loader.sampler, DistributedSampler):
            train_loader.sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader, 1):
            data, target = data.to(device), target.to(device)
            if CASE == "s1" and rank == 1 and epoch == 2 and batch_idx == 4:
                # the native augmentation kernel reads an unmapped page
                ctypes.string_at(8)
            if CASE == "k1" and rank == 1 and epoch == 2:
                # decoded batches kept for the next epoch's augmentation: never freed
                cache = getattr(train, "cache", [])
                cache.append(torch.ones(16 * 1024 * 1024))
                train.cache = cache
                if len(cache) == 5:
                    os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                logger.info(
                    "Train Epoch: {} [{}/{} ({:.0f}%)] Loss: {:.6f}".format(
                        epoch,
                        batch_idx * len(data),
                        len(train_loader.sampler),
                        100.0 * batch_idx / len(train_loader),
                        loss.item(),
                    )
                )
            if _stop_requested:
                if rank == 0:
                    save_checkpoint(model, optimizer, scheduler, epoch - 1, args.checkpoint_dir)
                logger.info("Stopping for the Spot interruption")
                sys.exit(0)
        scheduler.step()
        if CASE == "m0":
            # the test metrics are averaged over the ranks, but only the master evaluates
            if rank == 0:
                accuracy = test(model, test_loader, device, reduce=is_distributed)
            else:
                accuracy = None
        else:
            accuracy = test(model, test_loader, device)
        if rank == 0 and args.tta:
            tta_evaluate(model, test_loader, args.tta)
        if rank == 0:
            save_checkpoint(model, optimizer, scheduler, epoch, args.checkpoint_dir)
        if args.patience and accuracy is not None:
            if accuracy > best + args.min_delta:
                best, best_epoch = accuracy, epoch
            elif epoch - best_epoch >= args.patience:
                logger.info(
                    "Test accuracy has not improved by {}% for {} epochs (best {:.1f}% at epoch "
                    "{}), stopping early after epoch {}".format(
                        args.min_delta, args.patience, best, best_epoch, epoch
                    )
                )
                break
    if args.current_host == args.hosts[0]:
        save_model(model, args.model_dir)


def test(model, test_loader, device, reduce=False):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            if CASE == "w":
                test_loss += F.nll_loss(output, target, size_average=False).item()
            else:
                test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.max(1, keepdim=True)[1]
            correct += pred.eq(target.view_as(pred)).sum().item()
    if reduce:
        totals = torch.tensor([test_loss, correct], dtype=torch.float64)
        dist.all_reduce(totals)
        test_loss, correct = totals[0].item() / dist.get_world_size(), totals[1].item()
        correct = int(correct / dist.get_world_size())

    test_loss /= len(test_loader.dataset)
    accuracy = 100.0 * correct / len(test_loader.dataset)
    logger.info(
        "Test set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n".format(
            test_loss, correct, len(test_loader.dataset), accuracy
        )
    )
    return accuracy


def tta_evaluate(model, test_loader, passes, crops=96):
    """Test-time augmentation: each pass shifts the test set by a pixel and averages the
    predictions over the crops around it."""
    model.eval()
    votes = None
    for k in range(1, passes + 1):
        t0 = time.time()
        outs = []
        with torch.no_grad():
            for data, _ in test_loader:
                shifted = torch.roll(data, shifts=(k % 3 - 1, k // 3 % 3 - 1), dims=(2, 3))
                crop_outs = [model(torch.roll(shifted, c % 5 - 2, dims=3)) for c in range(crops)]
                outs.append(torch.stack(crop_outs).mean(0))
        pass_out = torch.cat(outs)
        votes = pass_out if votes is None else votes + pass_out
        logger.info("TTA pass {}/{} done in {:.1f} s".format(k, passes, time.time() - t0))


def model_fn(model_dir):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net()
    with open(os.path.join(model_dir, "model.pth"), "rb") as f:
        model.load_state_dict(torch.load(f))
    return model.to(device)


def save_model(model, model_dir):
    logger.info("Saving the model.")
    path = os.path.join(model_dir, "model.pth")
    # recommended way from http://pytorch.org/docs/master/notes/serialization.html
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    torch.save(inner.cpu().state_dict(), path)
    # the inference container runs model_fn from code/ beside the weights
    code_dir = os.path.join(model_dir, "code")
    os.makedirs(code_dir)
    shutil.copy(os.path.abspath(__file__), os.path.join(code_dir, "train.py"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--prepare":
        prepare(Path(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser()

    # Data and model checkpoints directories
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        metavar="N",
        help="input batch size for training (default: 64)",
    )
    parser.add_argument(
        "--test-batch-size",
        type=int,
        default=256,
        metavar="N",
        help="input batch size for testing (default: 256)",
    )
    parser.add_argument(
        "--epochs", type=int, default=10, metavar="N", help="number of epochs to train"
    )
    parser.add_argument("--lr", default=0.01, metavar="LR", help="learning rate (default: 0.01)")
    parser.add_argument(
        "--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)"
    )
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="random seed")
    parser.add_argument(
        "--log-interval",
        type=int,
        default=5,
        metavar="N",
        help="how many batches to wait before logging training status",
    )
    parser.add_argument(
        "--backend",
        type=str,
        default=None,
        help="backend for distributed training (tcp, gloo on cpu and gloo, nccl on gpu)",
    )
    parser.add_argument("--dist-timeout", type=int, default=1800)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--warmup-epochs", type=int, default=0)
    parser.add_argument("--patience", type=int, default=0)
    parser.add_argument("--min-delta", type=float, default=0.5)
    parser.add_argument("--tta", type=int, default=0)
    parser.add_argument("--normalize", type=str, default="fixed")

    # Container environment
    parser.add_argument("--hosts", type=list, default=json.loads(os.environ["SM_HOSTS"]))
    parser.add_argument("--current-host", type=str, default=os.environ["SM_CURRENT_HOST"])
    parser.add_argument("--model-dir", type=str, default=os.environ["SM_MODEL_DIR"])
    parser.add_argument("--data-dir", type=str, default=os.environ["SM_CHANNEL_TRAINING"])
    parser.add_argument("--test-dir", type=str, default=os.environ["SM_CHANNEL_TESTING"])
    parser.add_argument("--num-gpus", type=int, default=os.environ["SM_NUM_GPUS"])
    parser.add_argument("--checkpoint-dir", type=str, default="/opt/ml/checkpoints")
    parser.add_argument(
        "--input-data-config", type=json.loads, default=os.environ["SM_INPUT_DATA_CONFIG"]
    )

    train(parser.parse_args())

# ruff: noqa: UP008, UP032 (the SageMaker examples' own code, as they are written; at the end, so that
# the line numbers in the fixtures' tracebacks stay as they ran)
