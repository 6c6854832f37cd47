"""A seventieth training-program style for the generalisation fixtures
(tests/fixtures/real/seventieth-*): image super-resolution trained in the way of XPixelGroup's
BasicSR and the repos built on it (Real-ESRGAN, SwinIR's and HAT's training): this file is the
run's basicsr/train.py, started as BasicSR's README starts it, `python -m
torch.distributed.launch --nproc_per_node=2 --master_port=PORT basicsr/train.py -opt
options/train_tiny_x2.yml --launcher pytorch` (the legacy launcher), with the option file
tests/programs/seventieth_train_tiny_x2.yml. What it keeps of BasicSR: parse_options (the YAML
options, the rank and world size from init_dist, manual_seed + rank), get_root_logger ('%(asctime)s
%(levelname)s: %(message)s', INFO on rank 0 only, ERROR on the others, to the console and to
experiments/<name>/train_<name>_<timestamp>.log), the version banner and the dumped options,
PairedImageDataset (paired_random_crop, augment), the EnlargedSampler with dataset_enlarge_ratio,
the PrefetchDataLoader ('cpu' prefetch: a thread filling a queue) and the CPUPrefetcher, an
MSRResNet (tiny), SRModel (reduce_loss_dict reduces the logged losses to rank 0 every iteration,
dist_validation validates on rank 0 only, save_network / save_training_state on rank 0 only),
the MessageLogger lines, auto_resume from the latest training_states/<iter>.state, and
load_network with strict_load_g. Images are binary PPM (P6) files decoded from their bytes as
cv2.imdecode does (None where the bytes are no image); a tiny early_stop_psnr option stands for
the early stop users add. A fault in the code is chosen by the RSR_CASE environment variable (a
short code) and never printed (re-capture with tests/fixtures/real/capture_seventieth.sh after
any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import os.path as osp
import queue as Queue
import random
import signal
import threading
import time
from collections import OrderedDict
from copy import deepcopy

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler

__version__ = "1.4.2"
CASE = os.environ.get("RSR_CASE", "")
initialized_logger = {}


def get_root_logger(logger_name="basicsr", log_level=logging.INFO, log_file=None):
    logger = logging.getLogger(logger_name)
    if logger_name in initialized_logger:
        return logger
    format_str = "%(asctime)s %(levelname)s: %(message)s"
    stream_handler = logging.StreamHandler()
    stream_handler.setFormatter(logging.Formatter(format_str))
    logger.addHandler(stream_handler)
    logger.propagate = False
    rank, _ = get_dist_info()
    if rank != 0:
        logger.setLevel("ERROR")
    elif log_file is not None:
        logger.setLevel(log_level)
        file_handler = logging.FileHandler(log_file, "w")
        file_handler.setFormatter(logging.Formatter(format_str))
        file_handler.setLevel(log_level)
        logger.addHandler(file_handler)
    initialized_logger[logger_name] = True
    return logger


def get_env_info():
    msg = r"""
                ____                _       _____  ____
               / __ ) ____ _ _____ (_)_____/ ___/ / __ \
              / __  |/ __ `// ___// // ___/\__ \ / /_/ /
             / /_/ // /_/ /(__  )/ // /__ ___/ // _, _/
            /_____/ \__,_//____//_/ \___//____//_/ |_|
     ______                   __   __                 __      __
    / ____/____   ____   ____/ /  / /   __  __ _____ / /__   / /
   / / __ / __ \ / __ \ / __  /  / /   / / / // ___// //_/  / /
  / /_/ // /_/ // /_/ // /_/ /  / /___/ /_/ // /__ / /<    /_/
  \____/ \____/ \____/ \____/  /_____/\____/ \___//_/|_|  (_)
    """
    msg += (
        "\nVersion Information: "
        f"\n\tBasicSR: {__version__}"
        f"\n\tPyTorch: {torch.__version__}"
        "\n\tTorchVision: not installed"
    )
    return msg


def dict2str(opt, indent_level=1):
    msg = "\n"
    for k, v in opt.items():
        if isinstance(v, dict):
            msg += " " * (indent_level * 2) + k + ":["
            msg += dict2str(v, indent_level + 1)
            msg += " " * (indent_level * 2) + "]\n"
        else:
            msg += " " * (indent_level * 2) + k + ": " + str(v) + "\n"
    return msg


# ---------------------------------------------------------------- dist_util
def init_dist(launcher, backend="gloo", timeout=1800):
    if launcher == "pytorch":
        rank = int(os.environ["RANK"])
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout))
        return rank
    raise ValueError(f"Invalid launcher type: {launcher}")


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def master_only(func):
    def wrapper(*args, **kwargs):
        rank, _ = get_dist_info()
        if rank == 0:
            return func(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------- options
def parse_options(root_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("-opt", type=str, required=True, help="Path to option YAML file.")
    parser.add_argument(
        "--launcher", choices=["none", "pytorch", "slurm"], default="none", help="job launcher"
    )
    parser.add_argument("--auto_resume", action="store_true")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    args = parser.parse_args()
    with open(args.opt) as f:
        opt = yaml.load(f, Loader=yaml.SafeLoader)
    if args.launcher == "none":
        opt["dist"] = False
        print("Disable distributed.", flush=True)
    else:
        opt["dist"] = True
        dp = opt.get("dist_params", {})
        init_dist(args.launcher, dp.get("backend", "gloo"), dp.get("timeout", 1800))
    opt["rank"], opt["world_size"] = get_dist_info()
    seed = opt.get("manual_seed")
    if seed is None:
        seed = random.randint(1, 10000)
        opt["manual_seed"] = seed
    set_random_seed(seed + opt["rank"])
    opt["auto_resume"] = args.auto_resume
    opt["is_train"] = True
    for phase, dataset in opt["datasets"].items():
        dataset["phase"] = phase.split("_")[0]
        dataset["scale"] = opt["scale"]
    opt["path"]["experiments_root"] = osp.join(root_path, "experiments", opt["name"])
    opt["path"]["models"] = osp.join(opt["path"]["experiments_root"], "models")
    opt["path"]["training_states"] = osp.join(opt["path"]["experiments_root"], "training_states")
    opt["path"]["log"] = opt["path"]["experiments_root"]
    return opt, args


def set_random_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def get_time_str():
    return time.strftime("%Y%m%d_%H%M%S", time.localtime())


# ---------------------------------------------------------------- data
def imdecode(content):
    """cv2.imdecode's way: None where the bytes are no image this decoder reads."""
    if not content.startswith(b"P6\n"):
        return None
    try:
        head, rest = content[3:].split(b"\n", 1)
        w, h = (int(x) for x in head.split())
        _maxval, pixels = rest.split(b"\n", 1)
    except ValueError:
        return None
    if len(pixels) < w * h * 3:
        return None
    return np.frombuffer(pixels[: w * h * 3], dtype=np.uint8).reshape(h, w, 3)[:, :, ::-1]


def imfrombytes(content, flag="color", float32=False):
    img = imdecode(content)
    if float32:
        img = img.astype(np.float32) / 255.0
    return img


class FileClient:
    def get(self, filepath, client_key="default"):
        with open(filepath, "rb") as f:
            return f.read()


def paired_random_crop(img_gts, img_lqs, gt_patch_size, scale, gt_path=None):
    h_lq, w_lq, _ = img_lqs.shape
    h_gt, w_gt, _ = img_gts.shape
    lq_patch_size = gt_patch_size // scale
    if h_gt != h_lq * scale or w_gt != w_lq * scale:
        raise ValueError(
            f"Scale mismatches. GT ({h_gt}, {w_gt}) is not {scale}x "
            f"multiplication of LQ ({h_lq}, {w_lq})."
        )
    if h_lq < lq_patch_size or w_lq < lq_patch_size:
        raise ValueError(
            f"LQ ({h_lq}, {w_lq}) is smaller than patch size "
            f"({lq_patch_size}, {lq_patch_size}). Please remove {gt_path}."
        )
    top = random.randint(0, h_lq - lq_patch_size)
    left = random.randint(0, w_lq - lq_patch_size)
    img_lqs = img_lqs[top : top + lq_patch_size, left : left + lq_patch_size, ...]
    top_gt, left_gt = int(top * scale), int(left * scale)
    img_gts = img_gts[top_gt : top_gt + gt_patch_size, left_gt : left_gt + gt_patch_size, ...]
    return img_gts, img_lqs


def augment(imgs, hflip=True, rotation=True):
    hflip = hflip and random.random() < 0.5
    vflip = rotation and random.random() < 0.5
    out = []
    for img in imgs:
        if hflip:
            img = img[:, ::-1]
        if vflip:
            img = img[::-1]
        out.append(img)
    return out


def img2tensor(imgs):
    return [torch.from_numpy(np.ascontiguousarray(i[:, :, ::-1].transpose(2, 0, 1))) for i in imgs]


class PairedImageDataset(Dataset):
    def __init__(self, opt):
        self.opt = opt
        self.file_client = FileClient()
        self.gt_folder, self.lq_folder = opt["dataroot_gt"], opt["dataroot_lq"]
        names = sorted(os.listdir(self.gt_folder))
        self.paths = [
            {"gt_path": osp.join(self.gt_folder, n), "lq_path": osp.join(self.lq_folder, n)}
            for n in names
        ]

    def __getitem__(self, index):
        scale = self.opt["scale"]
        gt_path = self.paths[index]["gt_path"]
        img_gt = imfrombytes(self.file_client.get(gt_path, "gt"), float32=True)
        lq_path = self.paths[index]["lq_path"]
        img_lq = imfrombytes(self.file_client.get(lq_path, "lq"), float32=True)
        if self.opt["phase"] == "train":
            if CASE == "w1" and get_worker_rank() == 1 and index_seen(index) == 30:
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies as the shm limit kills it
            gt_size = self.opt["gt_size"]
            img_gt, img_lq = paired_random_crop(img_gt, img_lq, gt_size, scale, gt_path)
            img_gt, img_lq = augment([img_gt, img_lq], self.opt["use_hflip"], self.opt["use_rot"])
        img_gt, img_lq = img2tensor([img_gt, img_lq])
        return {"lq": img_lq, "gt": img_gt, "lq_path": lq_path, "gt_path": gt_path}

    def __len__(self):
        return len(self.paths)


_worker = {"rank": 0, "seen": 0}


def get_worker_rank():
    return _worker["rank"]


def index_seen(index):
    _worker["seen"] += 1
    return _worker["seen"]


def worker_init_fn(worker_id, num_workers, rank, seed):
    worker_seed = num_workers * rank + worker_id + seed
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    _worker["rank"] = rank


class EnlargedSampler(Sampler):
    def __init__(self, dataset, num_replicas, rank, ratio=1):
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.num_samples = math.ceil(len(self.dataset) * ratio / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.epoch)
        indices = torch.randperm(self.total_size, generator=g).tolist()
        dataset_size = len(self.dataset)
        indices = [v % dataset_size for v in indices]
        indices = indices[self.rank : self.total_size : self.num_replicas]
        return iter(indices)

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class PrefetchGenerator(threading.Thread):
    def __init__(self, generator, num_prefetch_queue):
        threading.Thread.__init__(self)
        self.queue = Queue.Queue(num_prefetch_queue)
        self.generator = generator
        self.daemon = True
        self.start()

    def run(self):
        for n, item in enumerate(self.generator):
            if CASE == "j1" and dist.get_rank() == 1 and n == 25:
                threading.Event().wait()  # a reader lock that is never released
            self.queue.put(item)
        self.queue.put(None)

    def __next__(self):
        next_item = self.queue.get()
        if next_item is None:
            raise StopIteration
        return next_item

    def __iter__(self):
        return self


class PrefetchDataLoader(DataLoader):
    def __init__(self, num_prefetch_queue, **kwargs):
        self.num_prefetch_queue = num_prefetch_queue
        super().__init__(**kwargs)

    def __iter__(self):
        return PrefetchGenerator(super().__iter__(), self.num_prefetch_queue)


class CPUPrefetcher:
    def __init__(self, loader):
        self.ori_loader = loader
        self.loader = iter(loader)

    def next(self):
        try:
            return next(self.loader)
        except StopIteration:
            return None

    def reset(self):
        self.loader = iter(self.ori_loader)


def build_dataloader(dataset, dataset_opt, num_gpu=1, dist=False, sampler=None, seed=None):
    from functools import partial

    phase = dataset_opt["phase"]
    rank, _ = get_dist_info()
    if phase == "train":
        num_workers = dataset_opt["num_worker_per_gpu"]
        dataloader_args = dict(
            dataset=dataset,
            batch_size=dataset_opt["batch_size_per_gpu"],
            shuffle=False,
            num_workers=num_workers,
            sampler=sampler,
            drop_last=True,
        )
        if num_workers:
            dataloader_args["worker_init_fn"] = partial(
                worker_init_fn, num_workers=num_workers, rank=rank, seed=seed
            )
    else:
        dataloader_args = dict(dataset=dataset, batch_size=1, shuffle=False, num_workers=0)
    prefetch_mode = dataset_opt.get("prefetch_mode")
    if prefetch_mode == "cpu":
        num_prefetch_queue = dataset_opt.get("num_prefetch_queue", 1)
        logger = get_root_logger()
        logger.info(
            f"Use {prefetch_mode} prefetch dataloader: num_prefetch_queue = {num_prefetch_queue}"
        )
        return PrefetchDataLoader(num_prefetch_queue=num_prefetch_queue, **dataloader_args)
    return DataLoader(**dataloader_args)


# ---------------------------------------------------------------- network
class ResidualBlockNoBN(nn.Module):
    def __init__(self, num_feat=64, res_scale=1):
        super().__init__()
        self.res_scale = res_scale
        self.conv1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.conv2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.conv2(self.relu(self.conv1(x)))
        return identity + out * self.res_scale


class MSRResNet(nn.Module):
    def __init__(self, num_in_ch=3, num_out_ch=3, num_feat=64, num_block=16, upscale=4):
        super().__init__()
        self.upscale = upscale
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.body = nn.Sequential(*[ResidualBlockNoBN(num_feat=num_feat) for _ in range(num_block)])
        if self.upscale in [2, 3]:
            self.upconv1 = nn.Conv2d(num_feat, num_feat * self.upscale * self.upscale, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(self.upscale)
        elif self.upscale == 4:
            self.upconv1 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1)
            self.upconv2 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.1, inplace=True)

    def forward(self, x):
        feat = self.lrelu(self.conv_first(x))
        out = self.body(feat)
        if self.upscale == 4:
            out = self.lrelu(self.pixel_shuffle(self.upconv1(out)))
            out = self.lrelu(self.pixel_shuffle(self.upconv2(out)))
        else:
            out = self.lrelu(self.pixel_shuffle(self.upconv1(out)))
        out = self.conv_last(self.lrelu(self.conv_hr(out)))
        base = F.interpolate(x, scale_factor=self.upscale, mode="bilinear", align_corners=False)
        return out + base


def calculate_psnr(img, img2):
    mse = np.mean((img.astype(np.float64) - img2.astype(np.float64)) ** 2)
    if mse == 0:
        return float("inf")
    return 10.0 * np.log10(255.0 * 255.0 / mse)


def tensor2img(tensor):
    img = tensor.squeeze(0).float().detach().cpu().clamp_(0, 1).numpy().transpose(1, 2, 0)
    return (img * 255.0).round().astype(np.uint8)


# ---------------------------------------------------------------- model
class SRModel:
    def __init__(self, opt):
        self.opt = opt
        self.schedulers, self.optimizers = [], []
        logger = get_root_logger()
        net_opt = deepcopy(opt["network_g"])
        net_type = net_opt.pop("type")
        net = MSRResNet(**net_opt)
        logger.info(f"Network [{net_type}] is created.")
        self.net_g = net
        load_path = self.opt["path"].get("pretrain_network_g")
        if load_path is not None:
            param_key = self.opt["path"].get("param_key_g", "params")
            self.load_network(
                self.net_g, load_path, self.opt["path"].get("strict_load_g", True), param_key
            )
        self.net_g = self.model_to_device(self.net_g)
        self.net_g.train()
        train_opt = self.opt["train"]
        self.cri_pix = nn.L1Loss(reduction=train_opt["pixel_opt"].get("reduction", "mean"))
        self.loss_weight = train_opt["pixel_opt"].get("loss_weight", 1.0)
        optim_opt = deepcopy(train_opt["optim_g"])
        optim_opt.pop("type")
        self.optimizer_g = torch.optim.Adam(self.net_g.parameters(), **optim_opt)
        self.optimizers.append(self.optimizer_g)
        sch = train_opt["scheduler"]
        for optimizer in self.optimizers:
            self.schedulers.append(
                torch.optim.lr_scheduler.MultiStepLR(
                    optimizer, milestones=sch["milestones"], gamma=sch["gamma"]
                )
            )
        if opt["train"].get("step_scheduler_first"):
            for scheduler in self.schedulers:
                scheduler.step()
        self.log_dict = OrderedDict()
        self.best_metric_results = {}
        self.held = []

    def model_to_device(self, net):
        if self.opt["dist"]:
            find_unused_parameters = self.opt.get("find_unused_parameters", False)
            net = DistributedDataParallel(net, find_unused_parameters=find_unused_parameters)
        return net

    def load_network(self, net, load_path, strict=True, param_key="params"):
        logger = get_root_logger()
        load_net = torch.load(load_path, map_location=lambda storage, loc: storage)
        if param_key is not None:
            load_net = load_net[param_key]
        logger.info(
            f"Loading {net.__class__.__name__} model from {load_path}, with param key: [{param_key}]."
        )
        for k, v in deepcopy(load_net).items():
            if k.startswith("module."):
                load_net[k[7:]] = v
                load_net.pop(k)
        net.load_state_dict(load_net, strict=strict)

    def feed_data(self, data):
        self.lq = data["lq"]
        self.gt = data["gt"]

    def optimize_parameters(self, current_iter):
        rank = self.opt["rank"]
        if CASE == "m1" and rank == 1 and current_iter >= 10:
            self.held.append(torch.ones(24 * 1024 * 1024))  # 96 MiB kept an iteration
            if current_iter == 16:
                os.kill(os.getpid(), signal.SIGKILL)
        if CASE == "v1" and rank == 1 and current_iter == 22:
            ctypes.string_at(0)  # the compiled upsampling op reads a null pointer
        self.optimizer_g.zero_grad()
        lq = self.lq
        if CASE == "n1" and rank == 1 and current_iter == 23:
            lq = lq * float("inf")  # a batch with an overflowing pixel
        self.output = self.net_g(lq)
        l_total = 0
        loss_dict = OrderedDict()
        if CASE == "k1" and rank == 1 and current_iter == 25:
            edges = int(
                (self.gt.diff(dim=-1).abs() > 2.0).sum()
            )  # no edge steeper than 2 in [0, 1]
            weight = 1.0 / edges
        else:
            weight = self.loss_weight
        l_pix = weight * self.cri_pix(self.output, self.gt)
        l_total += l_pix
        loss_dict["l_pix"] = l_pix
        if self.opt["train"].get("skip_nan_loss") and not torch.isfinite(l_total):
            get_root_logger().warning(
                f"NaN or Inf loss at iter {current_iter}, skip this iteration."
            )
            return
        l_total.backward()
        self.optimizer_g.step()
        self.log_dict = self.reduce_loss_dict(loss_dict)

    def reduce_loss_dict(self, loss_dict):
        with torch.no_grad():
            if self.opt["dist"]:
                keys, losses = [], []
                for name, value in loss_dict.items():
                    keys.append(name)
                    losses.append(value)
                losses = torch.stack(losses, 0)
                torch.distributed.reduce(losses, dst=0)
                if self.opt["rank"] == 0:
                    losses /= self.opt["world_size"]
                loss_dict = {key: loss for key, loss in zip(keys, losses, strict=True)}
            log_dict = OrderedDict()
            for name, value in loss_dict.items():
                log_dict[name] = value.mean().item()
            return log_dict

    def update_learning_rate(self, current_iter, warmup_iter=-1):
        if current_iter > 1:
            for scheduler in self.schedulers:
                scheduler.step()

    def get_current_learning_rate(self):
        return [param_group["lr"] for param_group in self.optimizers[0].param_groups]

    def get_current_log(self):
        return self.log_dict

    def validation(self, dataloader, current_iter, tb_logger, save_img=False):
        if self.opt["dist"]:
            self.dist_validation(dataloader, current_iter, tb_logger, save_img)
        else:
            self.nondist_validation(dataloader, current_iter, tb_logger, save_img)

    def dist_validation(self, dataloader, current_iter, tb_logger, save_img):
        if self.opt["rank"] == 0:
            self.nondist_validation(dataloader, current_iter, tb_logger, save_img)

    def nondist_validation(self, dataloader, current_iter, tb_logger, save_img):
        from tqdm import tqdm

        dataset_name = dataloader.dataset.opt["name"]
        use_pbar = self.opt["val"].get("pbar", False)
        metric = 0.0
        if dataset_name not in self.best_metric_results:
            self.best_metric_results[dataset_name] = {"psnr": {"val": -float("inf"), "iter": -1}}
        pbar = tqdm(total=len(dataloader), unit="image") if use_pbar else None
        for val_data in dataloader:
            img_name = osp.splitext(osp.basename(val_data["lq_path"][0]))[0]
            self.feed_data(val_data)
            self.net_g.eval()
            with torch.no_grad():
                self.output = self.net_g(self.lq)
            self.net_g.train()
            metric += calculate_psnr(tensor2img(self.output), tensor2img(self.gt))
            if pbar is not None:
                pbar.update(1)
                pbar.set_description(f"Test {img_name}")
        if pbar is not None:
            pbar.close()
        metric /= len(dataloader)
        best = self.best_metric_results[dataset_name]["psnr"]
        if metric >= best["val"]:
            best["val"], best["iter"] = metric, current_iter
        log_str = f"Validation {dataset_name}\n\t # psnr: {metric:.4f}\tBest: {best['val']:.4f} @ {best['iter']} iter\n"
        get_root_logger().info(log_str)

    @master_only
    def save_network(self, net, net_label, current_iter, param_key="params"):
        if current_iter == -1:
            current_iter = "latest"
        save_filename = f"{net_label}_{current_iter}.pth"
        save_path = os.path.join(self.opt["path"]["models"], save_filename)
        bare = net.module if isinstance(net, DistributedDataParallel) else net
        state_dict = {k: v.cpu() for k, v in bare.state_dict().items()}
        torch.save({param_key: state_dict}, save_path)

    @master_only
    def save_training_state(self, epoch, current_iter):
        if current_iter != -1:
            state = {"epoch": epoch, "iter": current_iter, "optimizers": [], "schedulers": []}
            for o in self.optimizers:
                state["optimizers"].append(o.state_dict())
            for s in self.schedulers:
                state["schedulers"].append(s.state_dict())
            save_filename = f"{current_iter}.state"
            torch.save(state, os.path.join(self.opt["path"]["training_states"], save_filename))

    def save(self, epoch, current_iter):
        self.save_network(self.net_g, "net_g", current_iter)
        self.save_training_state(epoch, current_iter)

    def resume_training(self, resume_state):
        for i, o in enumerate(resume_state["optimizers"]):
            self.optimizers[i].load_state_dict(o)
        for i, s in enumerate(resume_state["schedulers"]):
            self.schedulers[i].load_state_dict(s)


class MessageLogger:
    def __init__(self, opt, start_iter=1, tb_logger=None):
        self.exp_name = opt["name"]
        self.interval = opt["logger"]["print_freq"]
        self.start_iter = start_iter
        self.max_iters = opt["train"]["total_iter"]
        self.start_time = time.time()
        self.logger = get_root_logger()

    def reset_start_time(self):
        self.start_time = time.time()

    @master_only
    def __call__(self, log_vars):
        epoch = log_vars.pop("epoch")
        current_iter = log_vars.pop("iter")
        lrs = log_vars.pop("lrs")
        message = f"[{self.exp_name[:5]}..][epoch:{epoch:3d}, iter:{current_iter:8,d}, lr:("
        for v in lrs:
            message += f"{v:.3e},"
        message += ")] "
        if "time" in log_vars:
            iter_time = log_vars.pop("time")
            data_time = log_vars.pop("data_time")
            total_time = time.time() - self.start_time
            time_sec_avg = total_time / (current_iter - self.start_iter + 1)
            eta_sec = time_sec_avg * (self.max_iters - current_iter - 1)
            eta_str = str(datetime.timedelta(seconds=int(eta_sec)))
            message += f"[eta: {eta_str}, "
            message += f"time (data): {iter_time:.3f} ({data_time:.3f})] "
        for k, v in log_vars.items():
            message += f"{k}: {v:.4e} "
        self.logger.info(message)


class AvgTimer:
    def __init__(self):
        self.start_time = self.tic = time.time()
        self.current_time = 0

    def start(self):
        self.tic = time.time()

    def record(self):
        self.current_time = time.time() - self.tic

    def get_current_time(self):
        return self.current_time

    def get_avg_time(self):
        return self.current_time


# ---------------------------------------------------------------- train
def create_train_val_dataloader(opt, logger):
    train_loader, val_loaders = None, []
    for phase, dataset_opt in opt["datasets"].items():
        if phase == "train":
            dataset_enlarge_ratio = dataset_opt.get("dataset_enlarge_ratio", 1)
            train_set = PairedImageDataset(dataset_opt)
            logger.info(f"Dataset [PairedImageDataset] - {dataset_opt['name']} is built.")
            train_sampler = EnlargedSampler(
                train_set, opt["world_size"], opt["rank"], dataset_enlarge_ratio
            )
            train_loader = build_dataloader(
                train_set,
                dataset_opt,
                opt["num_gpu"],
                opt["dist"],
                train_sampler,
                opt["manual_seed"],
            )
            num_iter_per_epoch = math.ceil(
                len(train_set)
                * dataset_enlarge_ratio
                / (dataset_opt["batch_size_per_gpu"] * opt["world_size"])
            )
            total_iters = int(opt["train"]["total_iter"])
            total_epochs = math.ceil(total_iters / num_iter_per_epoch)
            logger.info(
                "Training statistics:"
                f"\n\tNumber of train images: {len(train_set)}"
                f"\n\tDataset enlarge ratio: {dataset_enlarge_ratio}"
                f"\n\tBatch size per gpu: {dataset_opt['batch_size_per_gpu']}"
                f"\n\tWorld size (gpu number): {opt['world_size']}"
                f"\n\tRequire iter number per epoch: {num_iter_per_epoch}"
                f"\n\tTotal epochs: {total_epochs}; iters: {total_iters}."
            )
        elif phase.split("_")[0] == "val":
            val_set = PairedImageDataset(dataset_opt)
            logger.info(f"Dataset [PairedImageDataset] - {dataset_opt['name']} is built.")
            val_loader = build_dataloader(
                val_set, dataset_opt, opt["num_gpu"], opt["dist"], None, opt["manual_seed"]
            )
            logger.info(f"Number of val images/folders in {dataset_opt['name']}: {len(val_set)}")
            val_loaders.append(val_loader)
    return train_loader, train_sampler, val_loaders, total_epochs, total_iters


def load_resume_state(opt):
    resume_state_path = None
    if opt["auto_resume"]:
        state_path = osp.join("experiments", opt["name"], "training_states")
        if osp.isdir(state_path):
            states = [v for v in os.listdir(state_path) if v.endswith(".state")]
            if len(states) != 0:
                states = [float(v.split(".state")[0]) for v in states]
                resume_state_path = osp.join(state_path, f"{max(states):.0f}.state")
                opt["path"]["resume_state"] = resume_state_path
    else:
        if opt["path"].get("resume_state"):
            resume_state_path = opt["path"]["resume_state"]
    if resume_state_path is None:
        return None
    resume_state = torch.load(resume_state_path, map_location=lambda storage, loc: storage)
    resume_iter = resume_state["iter"]
    opt["path"]["pretrain_network_g"] = osp.join(opt["path"]["models"], f"net_g_{resume_iter}.pth")
    return resume_state


def make_exp_dirs(opt):
    path_opt = opt["path"].copy()
    os.makedirs(path_opt.pop("experiments_root"), exist_ok=True)
    for key in ("models", "training_states", "log"):
        os.makedirs(path_opt[key], exist_ok=True)


def train_pipeline(root_path):
    opt, _args = parse_options(root_path)
    torch.backends.cudnn.benchmark = True
    resume_state = load_resume_state(opt)
    if resume_state is None and opt["rank"] == 0:
        make_exp_dirs(opt)
    log_file = osp.join(opt["path"]["log"], f"train_{opt['name']}_{get_time_str()}.log")
    logger = get_root_logger(logger_name="basicsr", log_level=logging.INFO, log_file=log_file)
    logger.info(get_env_info())
    logger.info(dict2str(opt))
    result = create_train_val_dataloader(opt, logger)
    train_loader, train_sampler, val_loaders, total_epochs, total_iters = result
    model = SRModel(opt)
    logger.info("Model [SRModel] is created.")
    if resume_state:
        model.resume_training(resume_state)
        logger.info(
            f"Resuming training from epoch: {resume_state['epoch']}, iter: {resume_state['iter']}."
        )
        start_epoch = resume_state["epoch"]
        current_iter = resume_state["iter"]
    else:
        start_epoch = 0
        current_iter = 0
    msg_logger = MessageLogger(opt, current_iter, None)
    prefetch_mode = opt["datasets"]["train"].get("prefetch_mode")
    if prefetch_mode is None or prefetch_mode == "cpu":
        prefetcher = CPUPrefetcher(train_loader)
    else:
        raise ValueError(
            f"Wrong prefetch_mode {prefetch_mode}. Supported ones are: None, 'cuda', 'cpu'."
        )
    logger.info(f"Start training from epoch: {start_epoch}, iter: {current_iter}")
    data_timer, iter_timer = AvgTimer(), AvgTimer()
    start_time = time.time()
    stop_psnr = opt["train"].get("early_stop_psnr")
    stop = False
    for epoch in range(start_epoch, total_epochs + 1):
        train_sampler.set_epoch(epoch)
        prefetcher.reset()
        train_data = prefetcher.next()
        while train_data is not None:
            data_timer.record()
            current_iter += 1
            if current_iter > total_iters:
                break
            model.update_learning_rate(
                current_iter, warmup_iter=opt["train"].get("warmup_iter", -1)
            )
            model.feed_data(train_data)
            model.optimize_parameters(current_iter)
            iter_timer.record()
            if current_iter == 1:
                msg_logger.reset_start_time()
            if current_iter % opt["logger"]["print_freq"] == 0:
                log_vars = {"epoch": epoch, "iter": current_iter}
                log_vars.update({"lrs": model.get_current_learning_rate()})
                log_vars.update(
                    {"time": iter_timer.get_avg_time(), "data_time": data_timer.get_avg_time()}
                )
                log_vars.update(model.get_current_log())
                msg_logger(log_vars)
            if current_iter % opt["logger"]["save_checkpoint_freq"] == 0:
                logger.info("Saving models and training states.")
                model.save(epoch, current_iter)
            if opt.get("val") is not None and (current_iter % opt["val"]["val_freq"] == 0):
                for val_loader in val_loaders:
                    model.validation(val_loader, current_iter, None, opt["val"]["save_img"])
                if stop_psnr is not None:
                    best = (
                        max(r["psnr"]["val"] for r in model.best_metric_results.values())
                        if model.best_metric_results
                        else 0.0
                    )
                    if CASE == "e0":
                        stop = opt["rank"] == 0 and best >= stop_psnr
                    else:
                        flag = torch.tensor([1.0 if best >= stop_psnr else 0.0])
                        dist.broadcast(flag, src=0)
                        stop = bool(flag.item())
                    if stop:
                        logger.info(
                            f"Early stop: best psnr {best:.4f} reached the target {stop_psnr}."
                        )
                        break
            data_timer.start()
            iter_timer.start()
            train_data = prefetcher.next()
        if stop:
            break
    consumed_time = str(datetime.timedelta(seconds=int(time.time() - start_time)))
    logger.info(f"End of training. Time consumed: {consumed_time}")
    logger.info("Save the latest model.")
    model.save(epoch=-1, current_iter=-1)
    if opt.get("val") is not None:
        for val_loader in val_loaders:
            model.validation(val_loader, current_iter, None, opt["val"]["save_img"])


def make_data(root, n_train=16, n_val=4, val_size=64, seed=0):
    """Synthetic smooth images (HR) and their 2x box-downscaled LR, as binary PPM files."""
    rng = np.random.default_rng(seed)

    def write(path, img):
        h, w, _ = img.shape
        with open(path, "wb") as f:
            f.write(b"P6\n%d %d\n255\n" % (w, h) + img[:, :, ::-1].tobytes())

    for split, n, size in (("train", n_train, 48), ("val", n_val, val_size)):
        for sub in ("HR", "LR_bicx2"):
            os.makedirs(osp.join(root, split, sub), exist_ok=True)
        for i in range(n):
            yy, xx = np.mgrid[0:size, 0:size] / size
            ch = [
                np.sin(
                    2
                    * np.pi
                    * (rng.uniform(0.5, 2) * yy + rng.uniform(0.5, 2) * xx + rng.uniform())
                )
                for _ in range(3)
            ]
            hr = ((np.stack(ch, -1) * 0.4 + 0.5) * 255).clip(0, 255).astype(np.uint8)
            lr = hr.reshape(size // 2, 2, size // 2, 2, 3).mean((1, 3)).round().astype(np.uint8)
            write(osp.join(root, split, "HR", f"img_{i:04d}.ppm"), hr)
            write(osp.join(root, split, "LR_bicx2", f"img_{i:04d}.ppm"), lr)


if __name__ == "__main__":
    if len(os.sys.argv) > 2 and os.sys.argv[1] == "--make-data":
        extra = {k: int(v) for k, v in (a.split("=") for a in os.sys.argv[3:])}
        make_data(os.sys.argv[2], **extra)
    else:
        root_path = osp.abspath(osp.join(__file__, osp.pardir, osp.pardir))
        train_pipeline(root_path)
