"""A ninety-first training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyfirst-*): semi-supervised image classification in the way of FixMatch
implementations (kekmodel/FixMatch-pytorch's train.py, the USB / TorchSSL codebases), raw torch
on CPU with gloo. A labeled DataLoader of batch B and an unlabeled one of batch mu*B (weak and
strong augmentations of every image) are drawn from each step through iterators that are
re-created when they run out; the step count of an epoch is --eval-step, whatever the loaders'
lengths; pseudo-labels above a confidence threshold (0.95) on the weak view train the strong
view; an EMA copy of the model (ModelEMA) is evaluated on rank 0 only after every epoch
('top-1 acc: 41.20', 'Best top-1 acc: 41.20', 'Mean top-1 acc: 40.10'); rank 0 saves
<out>/checkpoint.pth.tar (and model_best.pth.tar); --resume restores model, EMA, optimizer and
scheduler. The data set 'synth' is synthetic 3x16x16 images (data/labeled.pt, the labeled pool;
data/unlabeled.pt; data/test.pt) written by `train.py --prepare`; a file that is missing is
built by rank 0 while the others wait in a barrier (FixMatch's rank-0-first pattern around the
data set getters). A tiny WideResNet-like CNN, DDP(find_unused_parameters=True), FixMatch's
logging ('%(asctime)s - %(levelname)s - %(name)s -   %(message)s', INFO on rank 0, WARNING on
the others) and its tqdm bar per epoch ('Train Epoch: 1/   3. Iter:   10/  16. LR: 0.0300. ...').
gloo on CPU, 15 s collective timeout. Launched with `torchrun --nproc_per_node N train.py
--dataset synth --num-labeled 40 --arch wideresnet --batch-size 8 --lr 0.03 --expand-labels
--seed 5 --out results/synth@40`. A fault in the code is chosen by the TQ_CASE environment
variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetyfirst.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import random
import shutil
import signal
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

logger = logging.getLogger(__name__)
best_acc = 0

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
STD = torch.tensor([0.2471, 0.2435, 0.2616]).view(3, 1, 1)


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


LETTER, WHO = fault()


# ----------------------------------------------------------------------------- data set


def synth_images(n: int, classes: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 3x16x16 images: each class a colour and a stripe frequency, plus noise."""
    palette = torch.Generator().manual_seed(91)
    colours = torch.rand(classes, 3, 1, 1, generator=palette)
    ramp = torch.linspace(-1, 1, 16)
    y = torch.randint(0, classes, (n,), generator=g)
    horizontal = (y % 2 == 0).float().view(n, 1, 1, 1)
    stripes = torch.sin(2.0 * (y.float().view(n, 1, 1, 1) + 1) * ramp.view(1, 1, 16, 1))
    stripes = horizontal * stripes + (1 - horizontal) * stripes.transpose(2, 3)
    x = 0.25 + 0.5 * colours[y] + 0.2 * stripes + 0.12 * torch.randn(n, 3, 16, 16, generator=g)
    return (x.clamp(0, 1) * 255).to(torch.uint8), y


def write_split(root: str, name: str, n: int, classes: int, seed: int, log: bool = False) -> None:
    g = torch.Generator().manual_seed(seed)
    path = os.path.join(root, f"{name}.pt")
    if name == "unlabeled":
        images: list[torch.Tensor] = []
        chunks = 10
        for _ in range(chunks):
            x, _ = synth_images(n // chunks, classes, g)
            images.extend(x.unbind(0))
            if log:
                logger.info("Decoding raw unlabeled images for %s: %d/%d", path, len(images), n)
                time.sleep(2.5)  # the raw pool is decoded image by image
        torch.save({"images": images}, path)
    else:
        x, y = synth_images(n, classes, g)
        torch.save({"images": x, "targets": y, "classes": classes}, path)


def prepare(root: str, classes: int, num_unlabeled: int) -> None:
    os.makedirs(root, exist_ok=True)
    write_split(root, "labeled", 1000, classes, 1)
    write_split(root, "unlabeled", num_unlabeled, classes, 2)
    write_split(root, "test", 200, classes, 3)


def weak(x: torch.Tensor) -> torch.Tensor:
    """RandomHorizontalFlip + RandomCrop(16, padding=2, padding_mode='reflect')."""
    if random.random() < 0.5:
        x = x.flip(-1)
    dx, dy = random.randint(-2, 2), random.randint(-2, 2)
    return torch.roll(x, shifts=(dy, dx), dims=(-2, -1))


def strong(x: torch.Tensor) -> torch.Tensor:
    """RandAugmentMC(n=2, m=10) on tensors, then Cutout."""
    x = weak(x).float()
    for op in random.sample(["brightness", "contrast", "solarize", "posterize", "equalize"], 2):
        v = random.uniform(0.05, 0.95)
        if op == "brightness":
            x = x * (0.5 + v)
        elif op == "contrast":
            x = (x - x.mean()) * (0.5 + v) + x.mean()
        elif op == "solarize":
            x = torch.where(x < 256 * v, x, 255 - x)
        elif op == "posterize":
            shift = 8 - int(4 + 4 * v)
            x = ((x.clamp(0, 255).to(torch.uint8) >> shift) << shift).float()
        else:
            x = (x - x.amin()) / (x.amax() - x.amin() + 1e-6) * 255
    cy, cx = random.randint(0, 15), random.randint(0, 15)
    x[..., max(cy - 4, 0) : cy + 4, max(cx - 4, 0) : cx + 4] = 127
    return x.clamp(0, 255)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """transforms.ToTensor() + transforms.Normalize(mean=cifar10_mean, std=cifar10_std)."""
    x = x.float().div(255)
    return x.sub_(MEAN).div_(STD)


class SynthSSL(Dataset):
    def __init__(self, images, targets=None, indexs=None, mode="labeled") -> None:
        self.images, self.targets, self.mode = images, targets, mode
        self.indexs = list(range(len(images))) if indexs is None else list(indexs)

    def __len__(self) -> int:
        return len(self.indexs)

    def __getitem__(self, i: int):
        img = self.images[self.indexs[i]]
        if self.mode == "labeled":
            return normalize(weak(img)), int(self.targets[self.indexs[i]])
        if self.mode == "test":
            return normalize(img), int(self.targets[self.indexs[i]])
        if LETTER == "n" and torch.distributed.get_rank() == WHO and self.calls == 1130:
            ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"rand"), 4)  # native RandAugment
        self.calls += 1
        return (normalize(weak(img)), normalize(strong(img))), -1

    calls = 0


def x_u_split(args, labels: torch.Tensor):
    label_per_class = args.num_labeled // args.num_classes
    labels = np.array(labels)
    labeled_idx = []
    unlabeled_idx = np.array(range(len(labels)))
    for i in range(args.num_classes):
        idx = np.where(labels == i)[0]
        idx = np.random.choice(idx, label_per_class, False)
        labeled_idx.extend(idx)
    labeled_idx = np.array(labeled_idx)
    assert len(labeled_idx) == args.num_labeled

    if args.expand_labels or args.num_labeled < args.batch_size:
        num_expand_x = math.ceil(args.batch_size * args.eval_step / args.num_labeled)
        labeled_idx = np.hstack([labeled_idx for _ in range(num_expand_x)])
    np.random.shuffle(labeled_idx)
    return labeled_idx, unlabeled_idx


def get_synth(args, root: str):
    for name, n in (("labeled", 1000), ("unlabeled", 2048), ("test", 200)):
        if not os.path.exists(os.path.join(root, f"{name}.pt")):
            logger.info("%s not found, building it in %s", f"{name}.pt", root)
            write_split(root, name, n, 10, {"labeled": 1, "unlabeled": 2, "test": 3}[name], True)
    base = torch.load(os.path.join(root, "labeled.pt"))
    args.num_classes = base["classes"]
    train_labeled_idxs, _ = x_u_split(args, base["targets"].tolist())
    labeled = SynthSSL(base["images"], base["targets"], train_labeled_idxs, "labeled")
    unlabeled = SynthSSL(torch.load(os.path.join(root, "unlabeled.pt"))["images"], mode="u")
    test = None
    if args.local_rank in [-1, 0]:  # evaluation runs on rank 0 only
        t = torch.load(os.path.join(root, "test.pt"))
        test = SynthSSL(t["images"], t["targets"], mode="test")
    return labeled, unlabeled, test


DATASET_GETTERS = {"synth": get_synth}


# ----------------------------------------------------------------------------- model


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, out_planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes, momentum=0.001)
        self.relu1 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes, momentum=0.001)
        self.relu2 = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(in_planes, out_planes, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.relu1(self.bn1(x))
        y = self.conv2(self.relu2(self.bn2(self.conv1(o))))
        return y + self.shortcut(o)


class WideResNet(nn.Module):
    def __init__(self, num_classes: int, widen_factor: int = 1) -> None:
        super().__init__()
        c = [8, 8 * widen_factor, 16 * widen_factor]
        self.conv1 = nn.Conv2d(3, c[0], 3, 1, 1, bias=False)
        self.block1 = BasicBlock(c[0], c[1], 1)
        self.block2 = BasicBlock(c[1], c[2], 2)
        self.bn1 = nn.BatchNorm2d(c[2], momentum=0.001)
        self.relu = nn.LeakyReLU(negative_slope=0.1, inplace=True)
        self.fc = nn.Linear(c[2], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block2(self.block1(self.conv1(x)))
        out = F.adaptive_avg_pool2d(self.relu(self.bn1(out)), 1)
        return self.fc(out.flatten(1))


class ModelEMA:
    def __init__(self, args, model: nn.Module, decay: float) -> None:
        from copy import deepcopy

        self.ema = deepcopy(model)
        self.ema.eval()
        self.decay = decay
        self.ema_has_module = hasattr(self.ema, "module")
        self.param_keys = [k for k, _ in self.ema.named_parameters()]
        self.buffer_keys = [k for k, _ in self.ema.named_buffers()]
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model: nn.Module) -> None:
        needs_module = hasattr(model, "module") and not self.ema_has_module
        with torch.no_grad():
            msd = model.state_dict()
            esd = self.ema.state_dict()
            for k in self.param_keys:
                j = "module." + k if needs_module else k
                esd[k].copy_(esd[k] * self.decay + (1.0 - self.decay) * msd[j].detach())
            for k in self.buffer_keys:
                j = "module." + k if needs_module else k
                esd[k].copy_(msd[j])


# ----------------------------------------------------------------------------- training


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)):
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.reshape(1, -1).expand_as(pred))
    return [correct[:k].reshape(-1).float().sum(0).mul_(100.0 / batch_size) for k in topk]


def interleave(x: torch.Tensor, size: int) -> torch.Tensor:
    s = list(x.shape)
    return x.reshape([-1, size, *s[1:]]).transpose(0, 1).reshape([-1, *s[1:]])


def de_interleave(x: torch.Tensor, size: int) -> torch.Tensor:
    s = list(x.shape)
    return x.reshape([size, -1, *s[1:]]).transpose(0, 1).reshape([-1, *s[1:]])


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, cycles=7 / 16):
    def _lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        no_progress = float(current_step - num_warmup_steps) / float(
            max(1, num_training_steps - num_warmup_steps)
        )
        return max(0.0, math.cos(math.pi * cycles * no_progress))

    return LambdaLR(optimizer, _lr_lambda, -1)


def set_seed(args) -> None:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)


def save_checkpoint(state: dict, is_best: bool, checkpoint: str) -> None:
    filepath = os.path.join(checkpoint, "checkpoint.pth.tar")
    torch.save(state, filepath)
    if is_best:
        shutil.copyfile(filepath, os.path.join(checkpoint, "model_best.pth.tar"))


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch FixMatch Training")
    parser.add_argument("--prepare", action="store_true", help="write the synth data and exit")
    parser.add_argument("--num-classes", type=int, default=10, help="synth classes (--prepare)")
    parser.add_argument("--num-unlabeled", type=int, default=2048, help="(--prepare)")
    parser.add_argument("--num-workers", type=int, default=0, help="number of workers")
    parser.add_argument("--dataset", default="synth", type=str, choices=["synth"])
    parser.add_argument("--num-labeled", type=int, default=40, help="number of labeled data")
    parser.add_argument(
        "--expand-labels", action="store_true", help="expand labels to fit eval steps"
    )
    parser.add_argument("--arch", default="wideresnet", type=str, choices=["wideresnet"])
    parser.add_argument("--total-steps", default=48, type=int, help="number of total steps to run")
    parser.add_argument("--eval-step", default=16, type=int, help="number of eval steps to run")
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("--batch-size", default=8, type=int, help="train batchsize")
    parser.add_argument("--lr", "--learning-rate", default=0.03, type=float)
    parser.add_argument(
        "--warmup", default=0, type=float, help="warmup epochs (unlabeled data based)"
    )
    parser.add_argument("--wdecay", default=5e-4, type=float, help="weight decay")
    parser.add_argument(
        "--nesterov", action="store_true", default=True, help="use nesterov momentum"
    )
    parser.add_argument("--use-ema", action="store_true", default=True, help="use EMA model")
    parser.add_argument("--ema-decay", default=0.999, type=float, help="EMA decay rate")
    parser.add_argument("--mu", default=7, type=int, help="coefficient of unlabeled batch size")
    parser.add_argument("--lambda-u", default=1, type=float, help="coefficient of unlabeled loss")
    parser.add_argument("--T", default=1, type=float, help="pseudo label temperature")
    parser.add_argument("--threshold", default=0.95, type=float, help="pseudo label threshold")
    parser.add_argument("--out", default="result", help="directory to output the result")
    parser.add_argument("--resume", default="", type=str, help="path to latest checkpoint")
    parser.add_argument("--seed", default=None, type=int, help="random seed")
    parser.add_argument("--amp", action="store_true", help="use 16-bit (mixed) precision")
    parser.add_argument("--distributed-eval", action="store_true", help="shard the test set")
    parser.add_argument(
        "--local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", -1)),
        help="For distributed training: local_rank",
    )
    parser.add_argument("--no-progress", action="store_true", help="don't use progress bar")
    args = parser.parse_args()
    if args.prepare:
        prepare("./data", args.num_classes, args.num_unlabeled)
        return
    global best_acc

    def create_model(args):
        model = WideResNet(num_classes=args.num_classes)
        logger.info(f"Total params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
        return model

    device = torch.device("cpu")
    if args.local_rank == -1:
        args.world_size = 1
        args.n_gpu = 0
    else:
        torch.distributed.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=15))
        args.world_size = torch.distributed.get_world_size()
        args.n_gpu = 0
    args.device = device

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s -   %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO if args.local_rank in [-1, 0] else logging.WARN,
    )
    logger.warning(
        f"Process rank: {args.local_rank}, "
        f"device: {args.device}, "
        f"n_gpu: {args.n_gpu}, "
        f"distributed training: {bool(args.local_rank != -1)}, "
        f"16-bits training: {args.amp}",
    )
    logger.info(dict(args._get_kwargs()))

    if args.seed is not None:
        set_seed(args)
    if args.local_rank in [-1, 0]:
        os.makedirs(args.out, exist_ok=True)

    if args.local_rank not in [-1, 0]:
        torch.distributed.barrier()

    labeled_dataset, unlabeled_dataset, test_dataset = DATASET_GETTERS[args.dataset](args, "./data")

    if args.local_rank == 0:
        torch.distributed.barrier()

    train_sampler = RandomSampler if args.local_rank == -1 else DistributedSampler

    labeled_trainloader = DataLoader(
        labeled_dataset,
        sampler=train_sampler(labeled_dataset),
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        drop_last=True,
    )
    unlabeled_trainloader = DataLoader(
        unlabeled_dataset,
        sampler=train_sampler(unlabeled_dataset),
        batch_size=args.batch_size * args.mu,
        num_workers=args.num_workers,
        drop_last=True,
    )
    test_loader = None
    if test_dataset is not None:
        test_loader = DataLoader(
            test_dataset,
            sampler=DistributedSampler(test_dataset, shuffle=False)
            if args.distributed_eval
            else SequentialSampler(test_dataset),
            batch_size=args.batch_size,
            num_workers=args.num_workers,
        )

    if args.local_rank not in [-1, 0]:
        torch.distributed.barrier()
    model = create_model(args)
    if args.local_rank == 0:
        torch.distributed.barrier()
    model.to(args.device)

    no_decay = ["bias", "bn"]
    grouped_parameters = [
        {
            "params": [
                p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)
            ],
            "weight_decay": args.wdecay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = optim.SGD(grouped_parameters, lr=args.lr, momentum=0.9, nesterov=args.nesterov)
    args.epochs = math.ceil(args.total_steps / args.eval_step)
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup, args.total_steps)

    ema_model = ModelEMA(args, model, args.ema_decay) if args.use_ema else None
    args.start_epoch = 0

    if args.resume:
        logger.info("==> Resuming from checkpoint..")
        assert os.path.isfile(args.resume), "Error: no checkpoint directory found!"
        args.out = os.path.dirname(args.resume)
        checkpoint = torch.load(args.resume)
        best_acc = checkpoint["best_acc"]
        args.start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
        if args.use_ema:
            ema_model.ema.load_state_dict(checkpoint["ema_state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])

    if args.local_rank != -1:
        model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)

    logger.info("***** Running training *****")
    logger.info(f"  Task = {args.dataset}@{args.num_labeled}")
    logger.info(f"  Num Epochs = {args.epochs}")
    logger.info(f"  Batch size per GPU = {args.batch_size}")
    logger.info(f"  Total train batch size = {args.batch_size * args.world_size}")
    logger.info(f"  Total optimization steps = {args.total_steps}")

    model.zero_grad()
    train(
        args,
        labeled_trainloader,
        unlabeled_trainloader,
        test_loader,
        model,
        optimizer,
        ema_model,
        scheduler,
    )


def train(
    args,
    labeled_trainloader,
    unlabeled_trainloader,
    test_loader,
    model,
    optimizer,
    ema_model,
    scheduler,
):
    global best_acc
    test_accs = []
    end = time.time()
    rank = args.local_rank

    if args.world_size > 1:
        labeled_epoch = 0
        unlabeled_epoch = 0
        labeled_trainloader.sampler.set_epoch(labeled_epoch)
        unlabeled_trainloader.sampler.set_epoch(unlabeled_epoch)

    labeled_iter = iter(labeled_trainloader)
    unlabeled_iter = iter(unlabeled_trainloader)
    autocast = torch.cuda.amp.autocast if args.amp else None
    hoard: list[torch.Tensor] = []

    model.train()
    for epoch in range(args.start_epoch, args.epochs):
        batch_time = AverageMeter()
        data_time = AverageMeter()
        losses = AverageMeter()
        losses_x = AverageMeter()
        losses_u = AverageMeter()
        mask_probs = AverageMeter()
        if not args.no_progress:
            p_bar = tqdm(range(args.eval_step), disable=args.local_rank not in [-1, 0])
        for batch_idx in range(args.eval_step):
            try:
                inputs_x, targets_x = next(labeled_iter)
            except:  # noqa: E722  (as the original)
                if args.world_size > 1:
                    labeled_epoch += 1
                    labeled_trainloader.sampler.set_epoch(labeled_epoch)
                labeled_iter = iter(labeled_trainloader)
                inputs_x, targets_x = next(labeled_iter)

            try:
                (inputs_u_w, inputs_u_s), _ = next(unlabeled_iter)
            except:  # noqa: E722
                if args.world_size > 1:
                    unlabeled_epoch += 1
                    unlabeled_trainloader.sampler.set_epoch(unlabeled_epoch)
                unlabeled_iter = iter(unlabeled_trainloader)
                (inputs_u_w, inputs_u_s), _ = next(unlabeled_iter)

            if LETTER == "h" and rank == WHO and epoch == 1 and batch_idx == 9:
                ready = threading.Event()  # set by a prefetch thread that was never started
                ready.wait()
            if LETTER == "m" and rank == WHO and epoch >= 1:
                hoard.append(torch.ones(16 << 20))  # 64 MiB a step
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

            data_time.update(time.time() - end)
            batch_size = inputs_x.shape[0]
            inputs = interleave(torch.cat((inputs_x, inputs_u_w, inputs_u_s)), 2 * args.mu + 1)
            targets_x = targets_x.to(args.device)
            if autocast is not None:
                with autocast():
                    logits = model(inputs)
            else:
                logits = model(inputs)
            logits = de_interleave(logits, 2 * args.mu + 1)
            logits_x = logits[:batch_size]
            logits_u_w, logits_u_s = logits[batch_size:].chunk(2)
            del logits

            Lx = F.cross_entropy(logits_x, targets_x, reduction="mean")
            pseudo_label = torch.softmax(logits_u_w.detach() / args.T, dim=-1)
            max_probs, targets_u = torch.max(pseudo_label, dim=-1)
            mask = max_probs.ge(args.threshold).float()
            Lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()
            loss = Lx + args.lambda_u * Lu
            loss.backward()

            losses.update(loss.item())
            losses_x.update(Lx.item())
            losses_u.update(Lu.item())
            optimizer.step()
            scheduler.step()
            if args.use_ema:
                ema_model.update(model)
            model.zero_grad()

            batch_time.update(time.time() - end)
            end = time.time()
            mask_probs.update(mask.mean().item())
            if not args.no_progress:
                p_bar.set_description(
                    f"Train Epoch: {epoch + 1}/{args.epochs:4}. Iter: {batch_idx + 1:4}/{args.eval_step:4}. LR: {scheduler.get_last_lr()[0]:.4f}. "
                    f"Data: {data_time.avg:.3f}s. Batch: {batch_time.avg:.3f}s. Loss: {losses.avg:.4f}. Loss_x: {losses_x.avg:.4f}. "
                    f"Loss_u: {losses_u.avg:.4f}. Mask: {mask_probs.avg:.2f}. "
                )
                p_bar.update()

        if not args.no_progress:
            p_bar.close()

        test_model = ema_model.ema if args.use_ema else model

        if args.local_rank in [-1, 0]:
            _test_loss, test_acc = test(args, test_loader, test_model, epoch)
            is_best = test_acc > best_acc
            best_acc = max(test_acc, best_acc)
            model_to_save = model.module if hasattr(model, "module") else model
            if args.use_ema:
                ema_to_save = (
                    ema_model.ema.module if hasattr(ema_model.ema, "module") else ema_model.ema
                )
            save_checkpoint(
                {
                    "epoch": epoch + 1,
                    "state_dict": model_to_save.state_dict(),
                    "ema_state_dict": ema_to_save.state_dict() if args.use_ema else None,
                    "acc": test_acc,
                    "best_acc": best_acc,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                },
                is_best,
                args.out,
            )
            test_accs.append(test_acc)
            logger.info(f"Best top-1 acc: {best_acc:.2f}")
            logger.info(f"Mean top-1 acc: {np.mean(test_accs[-20:]):.2f}\n")


def test(args, test_loader, model, epoch):
    batch_time = AverageMeter()
    data_time = AverageMeter()
    losses = AverageMeter()
    top1 = AverageMeter()
    top5 = AverageMeter()
    end = time.time()

    if not args.no_progress:
        test_loader = tqdm(test_loader, disable=args.local_rank not in [-1, 0])

    with torch.no_grad():
        for batch_idx, (inputs, targets) in enumerate(test_loader):
            data_time.update(time.time() - end)
            model.eval()
            outputs = model(inputs)
            loss = F.cross_entropy(outputs, targets)
            prec1, prec5 = accuracy(outputs, targets, topk=(1, 5))
            losses.update(loss.item(), inputs.shape[0])
            top1.update(prec1.item(), inputs.shape[0])
            top5.update(prec5.item(), inputs.shape[0])
            batch_time.update(time.time() - end)
            end = time.time()
            if not args.no_progress:
                test_loader.set_description(
                    f"Test Iter: {batch_idx + 1:4}/{len(test_loader):4}. Data: {data_time.avg:.3f}s. Batch: {batch_time.avg:.3f}s. "
                    f"Loss: {losses.avg:.4f}. top1: {top1.avg:.2f}. top5: {top5.avg:.2f}. "
                )
        if not args.no_progress:
            test_loader.close()
    if args.distributed_eval:  # average the shards' accuracies over the ranks
        stats = torch.tensor([top1.sum, top5.sum, top1.count], dtype=torch.float64)
        torch.distributed.all_reduce(stats)
        top1.avg, top5.avg = (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()

    logger.info(f"top-1 acc: {top1.avg:.2f}")
    logger.info(f"top-5 acc: {top5.avg:.2f}")
    return losses.avg, top1.avg


if __name__ == "__main__":
    main()
