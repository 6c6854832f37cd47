"""A hundred-and-twenty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentysixth-*): image classification in the way of torchvision's
reference scripts (pytorch/vision references/classification/train.py with its utils.py and
presets.py), re-created in plain torch in one file (torchvision and PIL are not installed here;
numpy is), linked into each run's folder as train.py and started as its README starts it:
`torchrun --nproc_per_node=2 train.py --model resnet18 --batch-size 8 --lr 0.1 --epochs 3
--data-path data --output-dir out --device cpu [flags]` (two machines: `torchrun --nnodes=2
--node_rank=K --nproc_per_node=1 --master_addr=... --master_port=...`).

What it re-creates: utils.init_distributed_mode ('| distributed init (rank 1): env://' from every
rank, then setup_for_distributed silencing print() on every rank but 0 unless force=True),
SmoothedValue / MetricLogger with log_every ('Epoch: [0]  [ 0/10]  eta: 0:00:03  lr: 0.1  img/s:
123.4  loss: 2.3026 (2.3026)  acc1: 0.0000 (0.0000)  acc5: 50.0000 (50.0000)  time: 0.3012
data: 0.2011', 'Epoch: [0] Total time: 0:00:02') and synchronize_between_processes,
reduce_across_processes, accuracy, save_on_master; load_data ('Loading data', 'Loading training
data', 'Took 0.0123', --cache-dataset to ~/.torch/vision/datasets/imagefolder/<sha1>.pt,
'Creating data loaders') over an ImageFolder of class folders (ImageNet-like wnids, PPM images
decoded with numpy) with ClassificationPresetTrain / ClassificationPresetEval, DistributedSampler
for training; 'Creating model' (a ResNet of torchvision's layout with a base width of 16:
resnet18, resnet34, resnet50; num_classes from the class folders), SGD, StepLR, CrossEntropyLoss,
--amp the way the reference does it (torch.cuda.amp.GradScaler, autocast on "cuda"), DDP,
--resume, 'Start training', evaluate ('Test:   [0/3]  eta: ...', 'Test:  Acc@1 12.500 Acc@5
50.000'), model_{epoch}.pth and checkpoint.pth by save_on_master, 'Training time 0:00:20'. The
user's own change: the test set is split by an unpadded sampler (every image counted once, the
bias warning of evaluate never shows). The process group is gloo with a 15 s timeout. A fault in
the code is chosen by the TQ_CASE environment variable (a short code) and never printed
(re-capture with tests/fixtures/real/capture_hundredtwentysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import datetime
import errno
import hashlib
import math
import os
import random
import signal
import threading
import time
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- faults (TQ_CASE)


@dataclass(frozen=True)
class Fault:
    erase_rank: int = -1  # this rank's random erasing builds a patch of the wrong size
    hoard_rank: int = -1  # this rank keeps 64 MiB a step until the OOM killer acts
    segv_rank: int = -1  # this rank's native accuracy kernel reads address 0
    slow_rank: int = -1  # this rank re-verifies the validation images before evaluating
    stuck_rank: int = -1  # this rank waits for a prefetcher thread that was never started
    reduce_main: bool = False  # the sample count of evaluate is reduced on rank 0 only


FAULTS = {
    "": Fault(),
    "e1": Fault(erase_rank=1),
    "m1": Fault(hoard_rank=1),
    "n1": Fault(segv_rank=1),
    "s1": Fault(slow_rank=1),
    "w1": Fault(stuck_rank=1),
    "r0": Fault(reduce_main=True),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

# ----------------------------------------------------------------------------- utils.py


class SmoothedValue:
    """Track a series of values and provide access to smoothed values over a
    window or the global series average.
    """

    def __init__(self, window_size=20, fmt=None):
        if fmt is None:
            fmt = "{median:.4f} ({global_avg:.4f})"
        self.deque = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0
        self.fmt = fmt

    def update(self, value, n=1):
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self):
        """
        Warning: does not synchronize the deque!
        """
        t = reduce_across_processes([self.count, self.total])
        t = t.tolist()
        self.count = int(t[0])
        self.total = t[1]

    @property
    def median(self):
        d = torch.tensor(list(self.deque))
        return d.median().item()

    @property
    def avg(self):
        d = torch.tensor(list(self.deque), dtype=torch.float32)
        return d.mean().item()

    @property
    def global_avg(self):
        return self.total / self.count

    @property
    def max(self):
        return max(self.deque)

    @property
    def value(self):
        return self.deque[-1]

    def __str__(self):
        return self.fmt.format(
            median=self.median,
            avg=self.avg,
            global_avg=self.global_avg,
            max=self.max,
            value=self.value,
        )


class MetricLogger:
    def __init__(self, delimiter="\t"):
        self.meters = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            assert isinstance(v, (float, int))
            self.meters[k].update(v)

    def __getattr__(self, attr):
        if attr in self.meters:
            return self.meters[attr]
        if attr in self.__dict__:
            return self.__dict__[attr]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")

    def __str__(self):
        loss_str = []
        for name, meter in self.meters.items():
            loss_str.append(f"{name}: {meter!s}")
        return self.delimiter.join(loss_str)

    def synchronize_between_processes(self):
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def add_meter(self, name, meter):
        self.meters[name] = meter

    def log_every(self, iterable, print_freq, header=None):
        i = 0
        if not header:
            header = ""
        start_time = time.time()
        end = time.time()
        iter_time = SmoothedValue(fmt="{avg:.4f}")
        data_time = SmoothedValue(fmt="{avg:.4f}")
        space_fmt = ":" + str(len(str(len(iterable)))) + "d"
        log_msg = self.delimiter.join(
            [
                header,
                "[{0" + space_fmt + "}/{1}]",
                "eta: {eta}",
                "{meters}",
                "time: {time}",
                "data: {data}",
            ]
        )
        for obj in iterable:
            data_time.update(time.time() - end)
            yield obj
            iter_time.update(time.time() - end)
            if i % print_freq == 0:
                eta_seconds = iter_time.global_avg * (len(iterable) - i)
                eta_string = str(datetime.timedelta(seconds=int(eta_seconds)))
                print(
                    log_msg.format(
                        i,
                        len(iterable),
                        eta=eta_string,
                        meters=str(self),
                        time=str(iter_time),
                        data=str(data_time),
                    )
                )
            i += 1  # noqa: SIM113 (as in torchvision's utils.py)
            end = time.time()
        total_time = time.time() - start_time
        total_time_str = str(datetime.timedelta(seconds=int(total_time)))
        print(f"{header} Total time: {total_time_str}")


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        if target.ndim == 2:
            target = target.max(dim=1)[1]

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])

        res = []
        for k in topk:
            correct_k = correct[:k].flatten().sum(dtype=torch.float32)
            res.append(correct_k * (100.0 / batch_size))
        return res


def mkdir(path):
    try:
        os.makedirs(path)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise


def setup_for_distributed(is_master):
    """
    This function disables printing when not in master process
    """
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized():
    if not dist.is_available():
        return False
    return dist.is_initialized()


def get_world_size():
    if not is_dist_avail_and_initialized():
        return 1
    return dist.get_world_size()


def get_rank():
    if not is_dist_avail_and_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.gpu = args.rank % max(torch.cuda.device_count(), 1)
    elif hasattr(args, "rank"):
        pass
    else:
        print("Not using distributed mode")
        args.distributed = False
        return

    args.distributed = True

    if args.device == "cuda":
        torch.cuda.set_device(args.gpu)
        args.dist_backend = "nccl"
    else:
        args.dist_backend = "gloo"
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(
        backend=args.dist_backend,
        init_method=args.dist_url,
        world_size=args.world_size,
        rank=args.rank,
        timeout=datetime.timedelta(seconds=15),
    )
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def reduce_across_processes(val):
    if not is_dist_avail_and_initialized():
        # nothing to sync, but we still convert to tensor for consistency with the distributed case.
        return torch.tensor(val)

    t = torch.tensor(val, device="cpu")
    dist.barrier()
    dist.all_reduce(t)
    return t


# ----------------------------------------------------------------------------- presets.py

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class RandomResizedCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), interpolation="bilinear",
                 antialias=True):  # fmt: skip
        self.size = size
        self.scale = scale
        self.ratio = ratio
        self.interpolation = interpolation
        self.antialias = antialias

    def __call__(self, img):
        _, h, w = img.shape
        area = h * w
        for _ in range(10):
            target_area = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            cw = round(math.sqrt(target_area * aspect))
            ch = round(math.sqrt(target_area / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                top = random.randint(0, h - ch)
                left = random.randint(0, w - cw)
                break
        else:
            ch, cw, top, left = h, w, 0, 0
        crop = img[None, :, top : top + ch, left : left + cw]
        return F.interpolate(
            crop, size=(self.size, self.size), mode=self.interpolation, antialias=self.antialias
        )[0]


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        return img.flip(-1) if random.random() < self.p else img


class Resize:
    def __init__(self, size, interpolation="bilinear", antialias=True):
        self.size = size
        self.interpolation = interpolation
        self.antialias = antialias

    def __call__(self, img):
        return F.interpolate(
            img[None], size=(self.size, self.size), mode=self.interpolation,
            antialias=self.antialias,
        )[0]  # fmt: skip


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        _, h, w = img.shape
        top, left = (h - self.size) // 2, (w - self.size) // 2
        return img[:, top : top + self.size, left : left + self.size]


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __call__(self, img):
        return (img - self.mean) / self.std


class RandomErasing:
    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value="random"):
        self.p = p
        self.scale = scale
        self.ratio = ratio
        self.value = value

    def __call__(self, img):
        if random.random() >= self.p:
            return img
        c, h, w = img.shape
        for _ in range(10):
            erase_area = h * w * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            eh = round(math.sqrt(erase_area * aspect))
            ew = round(math.sqrt(erase_area / aspect))
            if eh < h and ew < w:
                break
        else:
            return img
        top, left = random.randint(0, h - eh), random.randint(0, w - ew)
        self.drawn = getattr(self, "drawn", 0) + 1
        pw = ew
        if FAULT.erase_rank == int(os.environ.get("RANK", "0")) and self.drawn == 25:
            pw += 1  # the patch drawn for the area before the aspect was rounded
        v = torch.empty(c, eh, pw).normal_()
        img = img.clone()
        img[:, top : top + eh, left : left + ew] = v
        return img


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class ClassificationPresetTrain:
    def __init__(self, *, crop_size, hflip_prob=0.5, random_erase_prob=0.0):
        trans = [RandomResizedCrop(crop_size, antialias=True)]
        if hflip_prob > 0:
            trans.append(RandomHorizontalFlip(hflip_prob))
        trans.append(Normalize(mean=MEAN, std=STD))
        if random_erase_prob > 0:
            trans.append(RandomErasing(p=random_erase_prob))
        self.transforms = Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(self, *, crop_size, resize_size=256):
        self.transforms = Compose(
            [Resize(resize_size, antialias=True), CenterCrop(crop_size), Normalize(MEAN, STD)]
        )

    def __call__(self, img):
        return self.transforms(img)


# ----------------------------------------------------------------------------- datasets

IMG_EXTENSIONS = (".ppm", ".jpeg", ".jpg", ".png")


def ppm_loader(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, size, maxval, _ = data.split(b"\n", 3)
    if magic != b"P6":
        raise ValueError(f"not a binary PPM file: {path}")
    w, h = (int(x) for x in size.split())
    offset = len(magic) + len(size) + len(maxval) + 3
    arr = np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(h, w, 3)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div(255)


class ImageFolder:
    def __init__(self, root, transform=None):
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = []
        for c in self.classes:
            for name in sorted(os.listdir(os.path.join(root, c))):
                if name.lower().endswith(IMG_EXTENSIONS):
                    self.samples.append((os.path.join(root, c, name), self.class_to_idx[c]))
        self.targets = [s[1] for s in self.samples]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = ppm_loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target


class UnpaddedDistributedSampler(torch.utils.data.Sampler):
    """Every test image on exactly one rank (DistributedSampler pads with repeats, which
    biases the accuracy: the warning in evaluate)."""

    def __init__(self, dataset):
        self.indices = list(range(get_rank(), len(dataset), get_world_size()))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


# ----------------------------------------------------------------------------- models


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000, width=16):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


MODELS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


def get_model(name, weights=None, num_classes=1000):
    if name not in MODELS:
        raise ValueError(f"Unknown model {name}")
    block, layers = MODELS[name]
    return ResNet(block, layers, num_classes=num_classes)


# ----------------------------------------------------------------------------- train.py


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, scaler=None):
    model.train()
    metric_logger = MetricLogger(delimiter="  ")
    metric_logger.add_meter("lr", SmoothedValue(window_size=1, fmt="{value}"))
    metric_logger.add_meter("img/s", SmoothedValue(window_size=10, fmt="{value}"))

    header = f"Epoch: [{epoch}]"
    hoard = []
    for i, (image, target) in enumerate(
        metric_logger.log_every(data_loader, args.print_freq, header)
    ):
        start_time = time.time()
        image, target = image.to(device), target.to(device)
        with torch.amp.autocast("cuda", enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)

        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()

        if FAULT.hoard_rank == get_rank() and epoch == 1:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # decoded batches kept
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if FAULT.segv_rank == get_rank() and epoch == 1 and i == 4:
            ctypes.string_at(0)  # the native top-k kernel reads a null pointer

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        batch_size = image.shape[0]
        metric_logger.update(loss=loss.item(), lr=optimizer.param_groups[0]["lr"])
        metric_logger.meters["acc1"].update(acc1.item(), n=batch_size)
        metric_logger.meters["acc5"].update(acc5.item(), n=batch_size)
        metric_logger.meters["img/s"].update(batch_size / (time.time() - start_time))


def evaluate(model, criterion, data_loader, device, print_freq=100, log_suffix=""):
    model.eval()
    metric_logger = MetricLogger(delimiter="  ")
    header = f"Test: {log_suffix}"

    num_processed_samples = 0
    with torch.inference_mode():
        for image, target in metric_logger.log_every(data_loader, print_freq, header):
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)

            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            # FIXME need to take into account that the datasets
            # could have been padded in distributed setup
            batch_size = image.shape[0]
            metric_logger.update(loss=loss.item())
            metric_logger.meters["acc1"].update(acc1.item(), n=batch_size)
            metric_logger.meters["acc5"].update(acc5.item(), n=batch_size)
            num_processed_samples += batch_size
    # gather the stats from all processes

    if FAULT.reduce_main:
        if dist.get_rank() == 0:
            num_processed_samples = reduce_across_processes(num_processed_samples)
            if len(data_loader.dataset) != num_processed_samples:
                warnings.warn(
                    f"It looks like the dataset has {len(data_loader.dataset)} samples, but "
                    f"{num_processed_samples} samples were used for the validation, which might "
                    "bias the results. Try adjusting the batch size and / or the world size. "
                    "Setting the world size to 1 is always a safe bet.",
                    stacklevel=2,
                )
    else:
        num_processed_samples = reduce_across_processes(num_processed_samples)
        if (
            hasattr(data_loader.dataset, "__len__")
            and len(data_loader.dataset) != num_processed_samples
            and dist.get_rank() == 0
        ):
            warnings.warn(
                f"It looks like the dataset has {len(data_loader.dataset)} samples, but "
                f"{num_processed_samples} samples were used for the validation, which might bias "
                "the results. Try adjusting the batch size and / or the world size. Setting the "
                "world size to 1 is always a safe bet.",
                stacklevel=2,
            )

    metric_logger.synchronize_between_processes()

    print(
        f"{header} Acc@1 {metric_logger.acc1.global_avg:.3f} Acc@5 {metric_logger.acc5.global_avg:.3f}"
    )
    return metric_logger.acc1.global_avg


def _get_cache_path(filepath):
    h = hashlib.sha1(filepath.encode()).hexdigest()
    cache_path = os.path.join("~", ".torch", "vision", "datasets", "imagefolder", h[:10] + ".pt")
    cache_path = os.path.expanduser(cache_path)
    return cache_path


def load_data(traindir, valdir, args):
    # Data loading code
    print("Loading data")
    val_resize_size, val_crop_size, train_crop_size = (
        args.val_resize_size,
        args.val_crop_size,
        args.train_crop_size,
    )

    print("Loading training data")
    st = time.time()
    cache_path = _get_cache_path(traindir)
    if args.cache_dataset and os.path.exists(cache_path):
        # Attention, as the transforms are also cached!
        print(f"Loading dataset_train from {cache_path}")
        dataset, _ = torch.load(cache_path, weights_only=False)
    else:
        dataset = ImageFolder(
            traindir,
            ClassificationPresetTrain(
                crop_size=train_crop_size,
                hflip_prob=args.hflip_prob,
                random_erase_prob=args.random_erase,
            ),
        )
        if args.cache_dataset:
            print(f"Saving dataset_train to {cache_path}")
            mkdir(os.path.dirname(cache_path))
            save_on_master((dataset, traindir), cache_path)
    print("Took", time.time() - st)

    print("Loading validation data")
    cache_path = _get_cache_path(valdir)
    if args.cache_dataset and os.path.exists(cache_path):
        # Attention, as the transforms are also cached!
        print(f"Loading dataset_test from {cache_path}")
        dataset_test, _ = torch.load(cache_path, weights_only=False)
    else:
        preprocessing = ClassificationPresetEval(
            crop_size=val_crop_size, resize_size=val_resize_size
        )
        dataset_test = ImageFolder(valdir, preprocessing)
        if args.cache_dataset:
            print(f"Saving dataset_test to {cache_path}")
            mkdir(os.path.dirname(cache_path))
            save_on_master((dataset_test, valdir), cache_path)

    print("Creating data loaders")
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
        test_sampler = UnpaddedDistributedSampler(dataset_test)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.SequentialSampler(dataset_test)

    return dataset, dataset_test, train_sampler, test_sampler


def main(args):
    if args.output_dir:
        mkdir(args.output_dir)

    init_distributed_mode(args)
    print(args)

    device = torch.device(args.device)
    torch.set_num_threads(1)

    train_dir = os.path.join(args.data_path, "train")
    val_dir = os.path.join(args.data_path, "val")
    dataset, dataset_test, train_sampler, test_sampler = load_data(train_dir, val_dir, args)

    num_classes = len(dataset.classes)
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=False,
    )
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test, batch_size=args.batch_size, sampler=test_sampler,
        num_workers=args.workers, pin_memory=False,
    )  # fmt: skip

    print("Creating model")
    model = get_model(args.model, weights=args.weights, num_classes=num_classes)
    model.to(device)

    if args.distributed and args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    lr_scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma
    )

    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=False)
        model_without_ddp.load_state_dict(checkpoint["model"])
        if not args.test_only:
            optimizer.load_state_dict(checkpoint["optimizer"])
            lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1
        if scaler:
            scaler.load_state_dict(checkpoint["scaler"])

    if args.test_only:
        evaluate(model, criterion, data_loader_test, device=device)
        return

    print("Start training")
    start_time = time.time()
    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        if FAULT.stuck_rank == get_rank() and epoch == 1:
            ready = threading.Event()  # set by the prefetcher thread (never started)
            ready.wait()
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, scaler)
        lr_scheduler.step()
        if FAULT.slow_rank == get_rank() and epoch == 1:
            for part in range(1, 9):
                print(
                    f"Verifying validation images on rank {get_rank()}: part {part}/8", force=True
                )
                time.sleep(5)
        evaluate(model, criterion, data_loader_test, device=device)
        if args.output_dir:
            checkpoint = {
                "model": model_without_ddp.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
                "args": args,
            }
            if scaler:
                checkpoint["scaler"] = scaler.state_dict()
            save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))

    total_time = time.time() - start_time
    total_time_str = str(datetime.timedelta(seconds=int(total_time)))
    print(f"Training time {total_time_str}")


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(
        description="PyTorch Classification Training", add_help=add_help
    )

    parser.add_argument(
        "--data-path",
        default="/datasets01/imagenet_full_size/061417/",
        type=str,
        help="dataset path",
    )
    parser.add_argument("--model", default="resnet18", type=str, help="model name")
    parser.add_argument(
        "--device", default="cuda", type=str, help="device (Use cuda or cpu Default: cuda)"
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        default=32,
        type=int,
        help="images per gpu, the total batch size is $NGPU x batch_size",
    )
    parser.add_argument(
        "--epochs", default=90, type=int, metavar="N", help="number of total epochs to run"
    )
    parser.add_argument(
        "-j",
        "--workers",
        default=16,
        type=int,
        metavar="N",
        help="number of data loading workers (default: 16)",
    )
    parser.add_argument("--opt", default="sgd", type=str, help="optimizer")
    parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate")
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument(
        "--wd",
        "--weight-decay",
        default=1e-4,
        type=float,
        metavar="W",
        help="weight decay (default: 1e-4)",
        dest="weight_decay",
    )
    parser.add_argument(
        "--label-smoothing",
        default=0.0,
        type=float,
        help="label smoothing (default: 0.0)",
        dest="label_smoothing",
    )
    parser.add_argument(
        "--lr-scheduler", default="steplr", type=str, help="the lr scheduler (default: steplr)"
    )
    parser.add_argument(
        "--lr-step-size", default=30, type=int, help="decrease lr every step-size epochs"
    )
    parser.add_argument(
        "--lr-gamma", default=0.1, type=float, help="decrease lr by a factor of lr-gamma"
    )
    parser.add_argument("--print-freq", default=10, type=int, help="print frequency")
    parser.add_argument("--output-dir", default=".", type=str, help="path to save outputs")
    parser.add_argument("--resume", default="", type=str, help="path of checkpoint")
    parser.add_argument("--start-epoch", default=0, type=int, metavar="N", help="start epoch")
    parser.add_argument(
        "--cache-dataset",
        dest="cache_dataset",
        help="Cache the datasets for quicker initialization. It also serializes the transforms",
        action="store_true",
    )
    parser.add_argument(
        "--sync-bn", dest="sync_bn", help="Use sync batch norm", action="store_true"
    )
    parser.add_argument(
        "--test-only", dest="test_only", help="Only test the model", action="store_true"
    )
    parser.add_argument(
        "--auto-augment", default=None, type=str, help="auto augment policy (default: None)"
    )
    parser.add_argument(
        "--random-erase", default=0.0, type=float, help="random erasing probability (default: 0.0)"
    )
    parser.add_argument(
        "--hflip-prob", default=0.5, type=float, help="horizontal flip probability (default: 0.5)"
    )
    parser.add_argument(
        "--amp", action="store_true", help="Use torch.cuda.amp for mixed precision training"
    )
    parser.add_argument("--world-size", default=1, type=int, help="number of distributed processes")
    parser.add_argument(
        "--dist-url", default="env://", type=str, help="url used to set up distributed training"
    )
    parser.add_argument(
        "--val-resize-size",
        default=256,
        type=int,
        help="the resize size used for validation (default: 256)",
    )
    parser.add_argument(
        "--val-crop-size",
        default=224,
        type=int,
        help="the central crop size used for validation (default: 224)",
    )
    parser.add_argument(
        "--train-crop-size",
        default=224,
        type=int,
        help="the random crop size used for training (default: 224)",
    )
    parser.add_argument("--weights", default=None, type=str, help="the weights enum name to load")
    parser.add_argument("--prepare", default="", type=str, help=argparse.SUPPRESS)
    return parser  # fmt: skip


# ----------------------------------------------------------------------------- prepare step

WNIDS = [
    "n01440764", "n01443537", "n01484850", "n01491361", "n01494475",
    "n01496331", "n01498041", "n01514668", "n01514859", "n01518878",
]  # fmt: skip


def write_ppm(path, arr):
    h, w, _ = arr.shape
    with open(path, "wb") as f:
        f.write(f"P6\n{w} {h}\n255\n".encode() + arr.tobytes())


def prepare(root, n_train=16, n_val=4, size=40):
    """An ImageFolder-like copy of a 10-class ImageNet subset: data/train/<wnid>/<wnid>_N.ppm,
    data/val/<wnid>/ILSVRC2012_val_000NNNNN.ppm, each class its own colour and stripes."""
    rng = np.random.default_rng(0)
    k = 0
    for c, wnid in enumerate(WNIDS):
        colour = np.array([(c * 37) % 256, (c * 91) % 256, (c * 53) % 256], dtype=np.float32)
        for split, n in (("train", n_train), ("val", n_val)):
            folder = os.path.join(root, split, wnid)
            os.makedirs(folder, exist_ok=True)
            for j in range(n):
                img = colour + rng.normal(0, 40, (size, size, 3))
                img[:: 2 + c % 3] += 30
                img = np.clip(img, 0, 255).astype(np.uint8)
                if split == "train":
                    name = f"{wnid}_{1000 + 7 * j}.ppm"
                else:
                    k += 1
                    name = f"ILSVRC2012_val_{k:08d}.ppm"
                write_ppm(os.path.join(folder, name), img)


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    if args.prepare:
        prepare(args.prepare)
    else:
        del args.prepare
        main(args)
