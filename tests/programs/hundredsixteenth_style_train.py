"""A hundred-sixteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixteenth-*): self-supervised image pretraining in the way of
facebookresearch/swav's main_swav.py (and its siblings dino / deepcluster-v2), started as the
repo's README starts it on one node: `python -m torch.distributed.launch --use_env
--nproc_per_node=2 main_swav.py --data_path data/train --epochs 3 --base_lr 0.6 --final_lr 0.0006
--warmup_epochs 0 --batch_size 16 --size_crops 24 12 --nmb_crops 2 4 --min_scale_crops 0.14 0.05
--max_scale_crops 1. 0.14 --use_fp16 true --freeze_prototypes_niters 5 --queue_length 256
--epoch_queue_starts 1 --dump_path ./experiments --dist_url env://`, re-created in plain torch
without apex or torchvision; linked into each run's folder as main_swav.py.

What it re-creates: src/utils.py (bool_flag, init_distributed_mode reading RANK / WORLD_SIZE of
the launcher's environment, initialize_exp with its params table, fix_random_seeds,
restart_from_checkpoint, AverageMeter), src/logger.py (LogFormatter "INFO - 12/01/20 12:00:00 -
0:00:05 - message", create_logger: the console on every rank, train.log / train.log-RANK in the
dump path, PD_Stats' stats{rank}.pkl), src/multicropdataset.py (an image folder of class
folders, RandomResizedCrop per crop size, flips), a tiny CNN under the name resnet50 with the
projection head and the prototypes, the multi-crop forward, the Sinkhorn-Knopp assignment
distributed_sinkhorn (an all_reduce of sum_Q, then one of the prototype sums per iteration), the
queue of embeddings per rank (queue{rank}.pth in the dump path), the training log records of
rank 0 ("Epoch: [0][0]\tTime ...\tData ...\tLoss ...\tLr: ..."), checkpoint.pth.tar saved by rank
0 each epoch. --use_fp16 runs the forward under torch.autocast (float16) with a GradScaler, the
way apex's O1 did; the assignment is computed on the half-precision scores, as the repo did. A
check of a fork stops training when an epoch's mean loss is not finite (DINO's "Loss is nan,
stopping training"), and an assert of a fork checks the queue length against the global batch.
The images are small .npy arrays (height, width, 3, uint8) in class folders, written by
`python main_swav.py --prepare data/train`.

A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredsixteenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import pickle
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

IMAGE = 24
MEAN = [0.485, 0.456, 0.406]
STD = [0.228, 0.224, 0.225]
CLASS_SIZES = [40, 24, 36, 28, 32, 32, 36, 28, 40, 24]  # 320 images
# fmt: off

@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    log_queue_rank: int = -1  # this rank's log record reports the queue's fill, None or not
    hoard_rank: int = -1  # this rank keeps every batch's crops for a visualisation
    segv_rank: int = -1  # this rank's fused crop normalisation reads address 0
    sinkhorn_break_rank: int = -1  # this rank stops its Sinkhorn iterations on a local criterion
    class_shard: bool = False  # each rank reads its own class folders, no DistributedSampler
    refill_rank: int = -1  # this rank refills its queue from the training set before epoch 1
    wait_rank: int = -1  # this rank waits before epoch 1 for a marker no rank writes
    half_scores: bool = False  # the assignment's exp runs on the float16 scores (a port off apex)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "l0": Fault(log_queue_rank=0),
    "m1": Fault(hoard_rank=1),
    "z0": Fault(segv_rank=0),
    "k1": Fault(sinkhorn_break_rank=1),
    "u": Fault(class_shard=True),
    "r1": Fault(refill_rank=1),
    "w1": Fault(wait_rank=1),
    "h": Fault(half_scores=True),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

logger = logging.getLogger()

parser = argparse.ArgumentParser(description="Implementation of SwAV")


def bool_flag(s):
    """Parse boolean arguments from the command line."""
    FALSY_STRINGS = {"off", "false", "0"}
    TRUTHY_STRINGS = {"on", "true", "1"}
    if s.lower() in FALSY_STRINGS:
        return False
    elif s.lower() in TRUTHY_STRINGS:
        return True
    else:
        raise argparse.ArgumentTypeError("invalid value for a boolean flag")


#########################
#### data parameters ####
#########################
parser.add_argument("--data_path", type=str, default="/path/to/imagenet", help="path to dataset repository")
parser.add_argument("--nmb_crops", type=int, default=[2], nargs="+", help="list of number of crops (example: [2, 6])")
parser.add_argument("--size_crops", type=int, default=[224], nargs="+", help="crops resolutions (example: [224, 96])")
parser.add_argument("--min_scale_crops", type=float, default=[0.14], nargs="+", help="argument in RandomResizedCrop (example: [0.14, 0.05])")
parser.add_argument("--max_scale_crops", type=float, default=[1], nargs="+", help="argument in RandomResizedCrop (example: [1., 0.14])")

#########################
## swav specific params #
#########################
parser.add_argument("--crops_for_assign", type=int, nargs="+", default=[0, 1], help="list of crops id used for computing assignments")
parser.add_argument("--temperature", default=0.1, type=float, help="temperature parameter in training loss")
parser.add_argument("--epsilon", default=0.05, type=float, help="regularization parameter for Sinkhorn-Knopp algorithm")
parser.add_argument("--sinkhorn_iterations", default=3, type=int, help="number of iterations in Sinkhorn-Knopp algorithm")
parser.add_argument("--feat_dim", default=32, type=int, help="feature dimension")
parser.add_argument("--nmb_prototypes", default=50, type=int, help="number of prototypes")
parser.add_argument("--queue_length", type=int, default=0, help="length of the queue (0 for no queue)")
parser.add_argument("--epoch_queue_starts", type=int, default=15, help="from this epoch, we start using a queue")

#########################
#### optim parameters ###
#########################
parser.add_argument("--epochs", default=100, type=int, help="number of total epochs to run")
parser.add_argument("--batch_size", default=64, type=int, help="batch size per gpu, i.e. how many unique instances per gpu")
parser.add_argument("--base_lr", default=4.8, type=float, help="base learning rate")
parser.add_argument("--final_lr", type=float, default=0, help="final learning rate")
parser.add_argument("--freeze_prototypes_niters", default=313, type=int, help="freeze the prototypes during this many iterations from the start")
parser.add_argument("--wd", default=1e-6, type=float, help="weight decay")
parser.add_argument("--warmup_epochs", default=10, type=int, help="number of warmup epochs")
parser.add_argument("--start_warmup", default=0, type=float, help="initial warmup learning rate")

#########################
#### dist parameters ###
#########################
parser.add_argument("--dist_url", default="env://", type=str, help="""url used to set up distributed
                    training; see https://pytorch.org/docs/stable/distributed.html""")
parser.add_argument("--world_size", default=-1, type=int, help="""
                    number of processes: it is set automatically and
                    should not be passed as argument""")
parser.add_argument("--rank", default=0, type=int, help="""rank of this process:
                    it is set automatically and should not be passed as argument""")
parser.add_argument("--local_rank", default=0, type=int, help="this argument is not used and should be ignored")

#########################
#### other parameters ###
#########################
parser.add_argument("--arch", default="resnet50", type=str, help="convnet architecture")
parser.add_argument("--hidden_mlp", default=64, type=int, help="hidden layer dimension in projection head")
parser.add_argument("--workers", default=1, type=int, help="number of data loading workers")
parser.add_argument("--checkpoint_freq", type=int, default=25, help="Save the model periodically")
parser.add_argument("--use_fp16", type=bool_flag, default=True, help="whether to train with mixed precision or not")
parser.add_argument("--sync_bn", type=str, default="none", help="synchronize bn (SyncBatchNorm needs GPU modules)")
parser.add_argument("--dump_path", type=str, default=".", help="experiment dump path for checkpoints and log")
parser.add_argument("--seed", type=int, default=31, help="seed")
parser.add_argument("--prepare", type=str, default="", help="write the synthetic image folders and stop")  # fmt: skip


###############################################################################
# src/logger.py
###############################################################################
class LogFormatter:
    def __init__(self):
        self.start_time = time.time()

    def format(self, record):
        elapsed_seconds = round(record.created - self.start_time)
        prefix = "%s - %s - %s" % (
            record.levelname,
            time.strftime("%x %X"),
            timedelta(seconds=elapsed_seconds),
        )
        message = record.getMessage()
        message = message.replace("\n", "\n" + " " * (len(prefix) + 3))
        return "%s - %s" % (prefix, message) if message else ""


def create_logger(filepath, rank):
    """Create a logger. Use a different log file for each process."""
    log_formatter = LogFormatter()
    if filepath is not None:
        if rank > 0:
            filepath = "%s-%i" % (filepath, rank)
        file_handler = logging.FileHandler(filepath, "a")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(log_formatter)
    console_handler = logging.StreamHandler()
    console_handler.setLevel(logging.INFO)
    console_handler.setFormatter(log_formatter)
    logger = logging.getLogger()
    logger.handlers = []
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if filepath is not None:
        logger.addHandler(file_handler)
    logger.addHandler(console_handler)

    def reset_time():
        log_formatter.start_time = time.time()

    logger.reset_time = reset_time
    return logger


class PD_Stats:
    """Log stuff with pandas library (here: a list pickled)."""

    def __init__(self, path, columns):
        self.path = path
        self.columns = columns
        self.stats = []
        if os.path.isfile(self.path):
            with open(self.path, "rb") as f:
                self.stats = pickle.load(f)

    def update(self, row, save=True):
        self.stats.append(dict(zip(self.columns, row)))
        if save:
            with open(self.path, "wb") as f:
                pickle.dump(self.stats, f)


###############################################################################
# src/utils.py
###############################################################################
def init_distributed_mode(args):
    """Initialize the following variables: world_size, rank, gpu_to_work_on."""
    args.is_slurm_job = "SLURM_JOB_ID" in os.environ
    if args.is_slurm_job:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.world_size = int(os.environ["SLURM_NNODES"]) * int(os.environ["SLURM_TASKS_PER_NODE"][0])
    else:
        # multi-GPU job (local or multi-node) - jobs started with torch.distributed.launch
        # read environment variables
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    # prepare distributed (gloo on this CPU machine, a 15 s collective timeout)
    dist.init_process_group(
        backend="gloo",
        init_method=args.dist_url,
        world_size=args.world_size,
        rank=args.rank,
        timeout=timedelta(seconds=15),
    )
    args.gpu_to_work_on = "cpu"
    return


def initialize_exp(params, *args, dump_params=True):
    """Initialize the experience: dump parameters, create checkpoint repo, a logger, stats."""
    if dump_params:
        pickle.dump(params, open(os.path.join(params.dump_path, "params.pkl"), "wb"))
    params.dump_checkpoints = os.path.join(params.dump_path, "checkpoints")
    if not params.rank and not os.path.isdir(params.dump_checkpoints):
        os.mkdir(params.dump_checkpoints)
    training_stats = PD_Stats(os.path.join(params.dump_path, "stats" + str(params.rank) + ".pkl"), args)
    logger = create_logger(os.path.join(params.dump_path, "train.log"), rank=params.rank)
    logger.info("============ Initialized logger ============")
    logger.info("\n".join("%s: %s" % (k, str(v)) for k, v in sorted(dict(vars(params)).items())))
    logger.info("The experiment will be stored in %s\n" % params.dump_path)
    logger.info("")
    return logger, training_stats


def restart_from_checkpoint(ckp_paths, run_variables=None, **kwargs):
    """Re-start from checkpoint"""
    if isinstance(ckp_paths, list):
        for ckp_path in ckp_paths:
            if os.path.isfile(ckp_path):
                break
    else:
        ckp_path = ckp_paths
    if not os.path.isfile(ckp_path):
        return
    logger.info("Found checkpoint at {}".format(ckp_path))
    checkpoint = torch.load(ckp_path, map_location="cpu")
    for key, value in kwargs.items():
        if key in checkpoint and value is not None:
            try:
                msg = value.load_state_dict(checkpoint[key], strict=False)
                print(msg)
            except TypeError:
                msg = value.load_state_dict(checkpoint[key])
            logger.info("=> loaded {} from checkpoint '{}'".format(key, ckp_path))
        else:
            logger.warning("=> failed to load {} from checkpoint '{}'".format(key, ckp_path))
    if run_variables is not None:
        for var_name in run_variables:
            if var_name in checkpoint:
                run_variables[var_name] = checkpoint[var_name]


def fix_random_seeds(seed=31):
    torch.manual_seed(seed)
    np.random.seed(seed)


class AverageMeter:
    """computes and stores the average and current value"""

    def __init__(self):
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


###############################################################################
# src/multicropdataset.py
###############################################################################
def scan_folder(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    samples = []
    for c, name in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, name))):
            if f.endswith(".npy"):
                samples.append((os.path.join(root, name, f), c))
    return classes, samples


def random_resized_crop(img, size, scale, ratio=(3.0 / 4.0, 4.0 / 3.0)):
    _, h, w = img.shape
    area = h * w
    for _ in range(10):
        target = area * random.uniform(scale[0], scale[1])
        aspect = math.exp(random.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            i = random.randint(0, h - ch)
            j = random.randint(0, w - cw)
            break
    else:
        ch, cw, i, j = h, w, 0, 0
    crop = img[:, i : i + ch, j : j + cw].unsqueeze(0)
    return F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False)[0]


class MultiCropDataset(Dataset):
    def __init__(self, data_path, size_crops, nmb_crops, min_scale_crops, max_scale_crops, size_dataset=-1, return_index=False):
        assert len(size_crops) == len(nmb_crops)
        assert len(min_scale_crops) == len(nmb_crops)
        assert len(max_scale_crops) == len(nmb_crops)
        self.classes, self.samples = scan_folder(data_path)
        if size_dataset >= 0:
            self.samples = self.samples[:size_dataset]
        self.return_index = return_index
        self.trans = []
        for i in range(len(size_crops)):
            self.trans.extend([(size_crops[i], (min_scale_crops[i], max_scale_crops[i]))] * nmb_crops[i])
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, _ = self.samples[index]
        image = np.load(path)
        image = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0
        multi_crops = []
        for size, scale in self.trans:
            crop = random_resized_crop(image, size, scale)
            if random.random() < 0.5:
                crop = crop.flip(-1)
            crop = crop * random.uniform(0.6, 1.4)  # colour distortion (brightness)
            multi_crops.append((crop.clamp(0, 1) - self.mean) / self.std)
        if self.return_index:
            return index, multi_crops
        return multi_crops


###############################################################################
# src/resnet50.py (a tiny CNN in its place)
###############################################################################
class ResNet(nn.Module):
    def __init__(self, normalize=False, output_dim=0, hidden_mlp=0, nmb_prototypes=0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.l2norm = normalize
        num_out_filters = 32
        if output_dim == 0:
            self.projection_head = None
        elif hidden_mlp == 0:
            self.projection_head = nn.Linear(num_out_filters, output_dim)
        else:
            self.projection_head = nn.Sequential(
                nn.Linear(num_out_filters, hidden_mlp),
                nn.BatchNorm1d(hidden_mlp),
                nn.ReLU(inplace=True),
                nn.Linear(hidden_mlp, output_dim),
            )
        self.prototypes = None
        if nmb_prototypes > 0:
            self.prototypes = nn.Linear(output_dim, nmb_prototypes, bias=False)

    def forward_backbone(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        x = self.avgpool(x)
        return torch.flatten(x, 1)

    def forward_head(self, x):
        if self.projection_head is not None:
            x = self.projection_head(x)
        if self.l2norm:
            x = nn.functional.normalize(x, dim=1, p=2)
        if self.prototypes is not None:
            return x, self.prototypes(x)
        return x

    def forward(self, inputs):
        if not isinstance(inputs, list):
            inputs = [inputs]
        idx_crops = torch.cumsum(
            torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp in inputs]), return_counts=True)[1],
            0,
        )
        start_idx = 0
        for end_idx in idx_crops:
            _out = self.forward_backbone(torch.cat(inputs[start_idx:end_idx]))
            if start_idx == 0:
                output = _out
            else:
                output = torch.cat((output, _out))
            start_idx = end_idx
        return self.forward_head(output)


def resnet50(**kwargs):
    return ResNet(**kwargs)


###############################################################################
# main_swav.py
###############################################################################
def prepare(root):
    """Small synthetic images: blobs of a class colour on noise, .npy (H, W, 3) uint8."""
    rng = np.random.default_rng(0)
    for c, n in enumerate(CLASS_SIZES):
        folder = os.path.join(root, "n%08d" % (1440000 + c))
        os.makedirs(folder, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for k in range(n):
            img = rng.integers(0, 80, (IMAGE, IMAGE, 3))
            y, x = rng.integers(0, IMAGE - 8, 2)
            img[y : y + 8, x : x + 8] = colour
            np.save(os.path.join(folder, "n%08d_%d.npy" % (1440000 + c, k)), img.astype(np.uint8))


def main():
    global args
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    init_distributed_mode(args)
    fix_random_seeds(args.seed)
    logger, training_stats = initialize_exp(args, "epoch", "loss")

    # build data
    train_dataset = MultiCropDataset(
        args.data_path,
        args.size_crops,
        args.nmb_crops,
        args.min_scale_crops,
        args.max_scale_crops,
    )
    if FAULT.class_shard:
        # each process reads its own share of the class folders (less to scan per process)
        train_dataset.samples = [s for s in train_dataset.samples if s[1] % args.world_size == args.rank]
        sampler = torch.utils.data.RandomSampler(train_dataset)
        sampler.set_epoch = lambda epoch: None
    else:
        sampler = DistributedSampler(train_dataset)
    train_loader = DataLoader(
        train_dataset,
        sampler=sampler,
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=False,
        drop_last=True,
    )
    logger.info("Building data done with {} images loaded.".format(len(train_dataset)))

    # build model
    model = resnet50(
        normalize=True,
        hidden_mlp=args.hidden_mlp,
        output_dim=args.feat_dim,
        nmb_prototypes=args.nmb_prototypes,
    )
    # synchronize batch norm layers
    if args.sync_bn == "pytorch":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if args.rank == 0:
        logger.info(model)
    logger.info("Building model done.")

    # build optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9, weight_decay=args.wd)
    warmup_lr_schedule = np.linspace(args.start_warmup, args.base_lr, len(train_loader) * args.warmup_epochs)
    iters = np.arange(len(train_loader) * (args.epochs - args.warmup_epochs))
    cosine_lr_schedule = np.array(
        [
            args.final_lr
            + 0.5 * (args.base_lr - args.final_lr) * (1 + math.cos(math.pi * t / (len(train_loader) * (args.epochs - args.warmup_epochs))))
            for t in iters
        ]
    )
    lr_schedule = np.concatenate((warmup_lr_schedule, cosine_lr_schedule))
    logger.info("Building optimizer done.")

    # init mixed precision
    scaler = None
    if args.use_fp16:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        logger.info("Initializing mixed precision done.")

    # wrap model
    model = nn.parallel.DistributedDataParallel(model)

    # optionally resume from a checkpoint
    to_restore = {"epoch": 0}
    restart_from_checkpoint(
        os.path.join(args.dump_path, "checkpoint.pth.tar"),
        run_variables=to_restore,
        state_dict=model,
        optimizer=optimizer,
        scaler=scaler,
    )
    start_epoch = to_restore["epoch"]

    # build the queue
    queue = None
    queue_path = os.path.join(args.dump_path, "queue" + str(args.rank) + ".pth")
    if os.path.isfile(queue_path):
        queue = torch.load(queue_path)["queue"]
    # the queue needs to be divisible by the batch size
    assert args.queue_length % (args.batch_size * args.world_size) == 0, (
        "queue_length ({}) must be divisible by batch_size * world_size ({})".format(
            args.queue_length, args.batch_size * args.world_size
        )
    )

    for epoch in range(start_epoch, args.epochs):
        # train the network for one epoch
        logger.info("============ Starting epoch %i ... ============" % epoch)

        # set sampler
        train_loader.sampler.set_epoch(epoch)

        # optionally starts a queue
        if args.queue_length > 0 and epoch >= args.epoch_queue_starts and queue is None:
            queue = torch.zeros(
                len(args.crops_for_assign),
                args.queue_length // args.world_size,
                args.feat_dim,
            )
        if epoch == 1 and args.rank == FAULT.refill_rank:
            refill_queue(train_loader, model, queue)
        if epoch == 1 and args.rank == FAULT.wait_rank:
            marker = os.path.join(args.dump_path, "checkpoint.pth.tar.done")
            while not os.path.exists(marker):
                time.sleep(1)

        # train the network
        scores, queue = train(train_loader, model, optimizer, epoch, lr_schedule, queue, scaler)
        training_stats.update(scores)

        # save checkpoints
        if args.rank == 0:
            save_dict = {
                "epoch": epoch + 1,
                "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict(),
            }
            if args.use_fp16:
                save_dict["scaler"] = scaler.state_dict()
            torch.save(save_dict, os.path.join(args.dump_path, "checkpoint.pth.tar"))
            if epoch % args.checkpoint_freq == 0 or epoch == args.epochs - 1:
                shutil.copyfile(
                    os.path.join(args.dump_path, "checkpoint.pth.tar"),
                    os.path.join(args.dump_checkpoints, "ckp-" + str(epoch) + ".pth"),
                )
        if queue is not None:
            torch.save({"queue": queue}, queue_path)
        # a fork's guard (DINO's): a diverged run is not worth its compute
        if not math.isfinite(scores[1]):
            logger.info("Loss is {}, stopping training".format(scores[1]))
            sys.exit(1)


def refill_queue(loader, model, queue):
    """Fill this rank's queue with embeddings of the training set before it is used."""
    parts = 8
    for part in range(1, parts + 1):
        logger.info("Refilling the queue from the training set: %d/%d" % (part, parts))
        time.sleep(5)


hoard = []


def train(train_loader, model, optimizer, epoch, lr_schedule, queue, scaler):
    batch_time = AverageMeter()
    data_time = AverageMeter()
    losses = AverageMeter()

    model.train()
    use_the_queue = False

    end = time.time()
    for it, inputs in enumerate(train_loader):
        # measure data loading time
        data_time.update(time.time() - end)

        # update learning rate
        iteration = epoch * len(train_loader) + it
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr_schedule[iteration]

        if args.rank == FAULT.segv_rank and epoch == 1 and it == 2:
            ctypes.string_at(0)  # the fused crop normalisation reads a NULL buffer
        if args.rank == FAULT.hoard_rank and epoch == 1:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # crops for a figure
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

        # normalize the prototypes
        with torch.no_grad():
            w = model.module.prototypes.weight.data.clone()
            w = nn.functional.normalize(w, dim=1, p=2)
            model.module.prototypes.weight.copy_(w)

        # ============ multi-res forward passes ... ============
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.use_fp16):
            embedding, output = model(inputs)
        embedding = embedding.detach()
        bs = inputs[0].size(0)

        # ============ swav loss ... ============
        loss = 0
        for i, crop_id in enumerate(args.crops_for_assign):
            with torch.no_grad():
                out = output[bs * crop_id : bs * (crop_id + 1)].detach()
                if not FAULT.half_scores:
                    out = out.float()  # apex's O1 ran exp in float32

                # time to use the queue
                if queue is not None:
                    if use_the_queue or not torch.all(queue[i, -1, :] == 0):
                        use_the_queue = True
                        out = torch.cat((torch.mm(queue[i], model.module.prototypes.weight.t()), out))
                    # fill the queue
                    queue[i, bs:] = queue[i, :-bs].clone()
                    queue[i, :bs] = embedding[crop_id * bs : (crop_id + 1) * bs]

                # get assignments
                q = distributed_sinkhorn(out, stop_early=args.rank == FAULT.sinkhorn_break_rank and epoch == 0 and it == 3)[-bs:]

            # cluster assignment prediction
            subloss = 0
            for v in np.delete(np.arange(np.sum(args.nmb_crops)), crop_id):
                x = output[bs * v : bs * (v + 1)].float() / args.temperature
                subloss -= torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
            loss += subloss / (np.sum(args.nmb_crops) - 1)
        loss /= len(args.crops_for_assign)

        # ============ backward and optim step ... ============
        optimizer.zero_grad()
        if args.use_fp16:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        # cancel gradients for the prototypes
        if iteration < args.freeze_prototypes_niters:
            for name, p in model.named_parameters():
                if "prototypes" in name:
                    p.grad = None
        if args.use_fp16:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

        # ============ misc ... ============
        losses.update(loss.item(), inputs[0].size(0))
        batch_time.update(time.time() - end)
        end = time.time()
        if args.rank == 0 and it % 5 == 0:
            if args.rank == FAULT.log_queue_rank:
                fill = (queue[0].abs().sum(-1) > 0).float().mean().item()
                logger.info("Queue fill: {:.1%}".format(fill))
            logger.info(
                "Epoch: [{0}][{1}]\t"
                "Time {batch_time.val:.3f} ({batch_time.avg:.3f})\t"
                "Data {data_time.val:.3f} ({data_time.avg:.3f})\t"
                "Loss {loss.val:.4f} ({loss.avg:.4f})\t"
                "Lr: {lr:.4f}".format(
                    epoch,
                    it,
                    batch_time=batch_time,
                    data_time=data_time,
                    loss=losses,
                    lr=optimizer.param_groups[0]["lr"],
                )
            )
    return (epoch, losses.avg), queue


@torch.no_grad()
def distributed_sinkhorn(out, stop_early=False):
    Q = torch.exp(out / args.epsilon).t()  # Q is K-by-B for consistency with notations from our paper
    B = Q.shape[1] * args.world_size  # number of samples to assign
    K = Q.shape[0]  # how many prototypes

    # make the matrix sums to 1
    sum_Q = torch.sum(Q)
    dist.all_reduce(sum_Q)
    Q /= sum_Q

    for it in range(args.sinkhorn_iterations):
        # normalize each row: total weight per prototype must be 1/K
        sum_of_rows = torch.sum(Q, dim=1, keepdim=True)
        dist.all_reduce(sum_of_rows)
        Q /= sum_of_rows
        Q /= K

        # normalize each column: total weight per sample must be 1/B
        Q /= torch.sum(Q, dim=0, keepdim=True)
        Q /= B
        # a fork's shortcut: stop once this rank's own assignment looks balanced
        if stop_early:
            break

    Q *= B  # the colomns must sum to 1 so that Q is an assignment
    return Q.t()
# ruff: noqa: B007, B905, RUF046, SIM108, SIM115, UP031, UP032 (swav's own code, as it is written)

if __name__ == "__main__":
    main()
