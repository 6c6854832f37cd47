"""A hundred-and-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfourth-*): global weather forecasting in the way of NVIDIA's
FourCastNet (train.py of github.com/NVlabs/FourCastNet), re-implemented in plain torch in one
file. As there: `train.py --yaml_config=config/AFNO.yaml --config=afno_backbone --run_num=0`
under torchrun (or under srun with export_DDP_vars.sh's RANK/LOCAL_RANK/WORLD_SIZE taken from
SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS), YParams reading one named section of a YAML file with
anchors, logging_utils' format '%(asctime)s - %(name)s - %(levelname)s - %(message)s' on the root
logger of every rank (the trainer's own lines gated by log_to_screen, rank 0 only) and a copy in
<exp_dir>/<config>/<run_num>/out.log, params.log()'s '------------------ Configuration
------------------' dump, the yearly data files read through a Dataset that opens each year
lazily (here <year>.npy of shape (time, channels, lat, lon) opened with np.load(mmap_mode='r')
in the DataLoader workers, the number of samples per year taken from the first file), the
normalisation by global_means.npy / global_stds.npy in reshape_fields, a DistributedSampler over
the global sample index for training and the same first batches on every rank for validation,
relative-L2 LpLoss, an AFNO backbone (patch embedding, blocks of FFT token mixing with
block-diagonal complex weights and softshrink, an MLP, a linear head back to patches), DDP with
find_unused_parameters=True, torch.cuda.amp's autocast and GradScaler behind --enable_amp, the
train/valid losses all-reduced at the end of each epoch, 'Time taken for epoch N is S sec' and
'Train loss: X. Valid loss: Y', ckpt.tar and best_ckpt.tar saved by rank 0 every epoch, the
CosineAnnealingLR branch's exit() at max_epochs and restore_checkpoint's retry without the
'module.' prefix when a pretrained checkpoint is fine-tuned with two_step_training. Added the
way users add them: a world print per rank, 'Saving model to ...', a non-finite loss guard, an
early stop on the valid loss, per-channel valid RMSE, years sharded over the ranks, staging of
the training years to node-local disk. `train.py --prepare DIR` writes the synthetic data
(tiny grids: 4 channels, 17 x 32). gloo on CPU, 15 s collective timeout. A fault in the code is
chosen by the TQ_CASE environment variable (a letter and a rank) and never printed (re-capture
with tests/fixtures/real/capture_hundredfourth.sh after any edit).
"""

# ruff: noqa: B905, RUF059, SIM102, SIM210, UP031, UP032 (FourCastNet's own code, as it is written)

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import logging
import os
import queue
import shutil
import signal
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.cuda import amp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

# ---------------------------------------------------------------- utils/logging_utils.py
_format = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"


def config_logger(log_level=logging.INFO):
    logging.basicConfig(format=_format, level=log_level)


def log_to_file(logger_name=None, log_level=logging.INFO, log_filename="tensorflow.log"):
    if not os.path.exists(os.path.dirname(log_filename)):
        os.makedirs(os.path.dirname(log_filename))
    log = logging.getLogger(logger_name)
    fh = logging.FileHandler(log_filename)
    fh.setLevel(log_level)
    fh.setFormatter(logging.Formatter(_format))
    log.addHandler(fh)


def log_versions():
    logging.info("--------------- Versions ---------------")
    logging.info("Torch: " + str(torch.__version__))
    logging.info("NumPy: " + str(np.__version__))
    logging.info("----------------------------------------")


config_logger()


def fault():
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ---------------------------------------------------------------- utils/YParams.py
class YParams:
    """Yaml file parser"""

    def __init__(self, yaml_filename, config_name, print_params=False):
        self._yaml_filename = yaml_filename
        self._config_name = config_name
        self.params = {}
        with open(yaml_filename) as _file:
            for key, val in yaml.safe_load(_file)[config_name].items():
                if val == "None":
                    val = None
                self.params[key] = val
                self.__setattr__(key, val)
        if print_params:
            self.log()

    def __getitem__(self, key):
        return self.params[key]

    def __setitem__(self, key, val):
        self.params[key] = val
        self.__setattr__(key, val)

    def __contains__(self, key):
        return key in self.params

    def log(self):
        logging.info("------------------ Configuration ------------------")
        logging.info("Configuration file: " + str(self._yaml_filename))
        logging.info("Configuration name: " + str(self._config_name))
        for key, val in self.params.items():
            logging.info(str(key) + " " + str(val))
        logging.info("---------------------------------------------------")


# ---------------------------------------------------------------- data_process (prepare step)
CHANNELS = ["u10", "v10", "t2m", "tcwv"]


def prepare(root, train_years, valid_years, constant_channel=False):
    """Synthetic 'ERA5': per year (samples, 4, 17, 32) float32, waves travelling east plus
    noise; a leap year has one sample more. global_means/stds of shape (1, 4, 1, 1)."""
    rng = np.random.default_rng(104)
    lat = np.linspace(-np.pi / 2, np.pi / 2, 17)[:, None]
    lon = np.linspace(0, 2 * np.pi, 32, endpoint=False)[None, :]
    base = np.array([5.0, -2.0, 280.0, 20.0])[:, None, None]
    amp_ = np.array([3.0, 2.0, 10.0, 6.0])[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, size=(4, 1, 1))

    def year(y, n):
        t = np.arange(n)[:, None, None, None] + 13 * (y - 1979)
        k = np.array([1, 2, 1, 3])[None, :, None, None]
        field = base + amp_ * np.cos(lat)[None, None] * np.sin(
            k * lon[None, None] - 0.35 * t + phase[None]
        )
        field = field + 0.05 * amp_ * rng.standard_normal(field.shape)
        return field.astype(np.float32)

    stats = []
    for split, years in (("train", train_years), ("valid", valid_years)):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        for y in years:
            data = year(y, 13 if y % 4 == 0 else 12)
            np.save(os.path.join(root, split, "%d.npy" % y), data)
            if split == "train":
                stats.append(data)
    stats = np.concatenate(stats)
    os.makedirs(os.path.join(root, "stats"), exist_ok=True)
    np.save(
        os.path.join(root, "stats", "global_means.npy"),
        stats.mean(axis=(0, 2, 3))[None, :, None, None],
    )
    np.save(
        os.path.join(root, "stats", "global_stds.npy"),
        stats.std(axis=(0, 2, 3))[None, :, None, None],
    )


# ---------------------------------------------------------------- utils/data_loader_multifiles.py
def get_data_loader(params, files_pattern, distributed, train):
    shard = None
    if train and params.shard_years and distributed:
        shard = (dist.get_rank(), dist.get_world_size())
    dataset = GetDataset(params, files_pattern, train, shard)
    sampler = DistributedSampler(dataset, shuffle=train) if distributed and shard is None else None
    dataloader = DataLoader(
        dataset,
        batch_size=int(params.batch_size),
        num_workers=params.num_data_workers,
        shuffle=(sampler is None and shard is not None),
        sampler=sampler if train else None,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
    )
    if train:
        return dataloader, dataset, sampler
    return dataloader, dataset


class GetDataset(Dataset):
    def __init__(self, params, location, train, shard=None):
        self.params = params
        self.location = location
        self.train = train
        self.dt = params.dt
        self.n_history = params.n_history
        self.in_channels = np.array(params.in_channels)
        self.out_channels = np.array(params.out_channels)
        self.n_in_channels = len(self.in_channels)
        self.n_out_channels = len(self.out_channels)
        self.crop_size_x = params.crop_size_x
        self.crop_size_y = params.crop_size_y
        self.roll = params.roll
        self.two_step_training = params.two_step_training
        self._get_files_stats(shard)

    def _get_files_stats(self, shard):
        self.files_paths = glob.glob(self.location + "/*.npy")
        self.files_paths.sort()
        if shard is not None:  # each rank memory-maps only its own block of years
            rank, world = shard
            self.files_paths = [list(p) for p in np.array_split(self.files_paths, world)][rank]
            logging.info(
                "rank {} reads years {}".format(
                    rank, ", ".join(os.path.basename(p)[:-4] for p in self.files_paths)
                )
            )
        self.n_years = len(self.files_paths)
        _f = np.load(self.files_paths[0], mmap_mode="r")
        logging.info("Getting file stats from {}".format(self.files_paths[0]))
        self.n_samples_per_year = _f.shape[0]
        # original image shape (before padding)
        self.img_shape_x = _f.shape[2] - 1  # just get rid of one of the pixels
        self.img_shape_y = _f.shape[3]
        self.n_samples_total = self.n_years * self.n_samples_per_year
        self.files = [None for _ in range(self.n_years)]
        logging.info("Number of samples per year: {}".format(self.n_samples_per_year))
        logging.info(
            "Found data at path {}. Number of examples: {}. Image Shape: {} x {} x {}".format(
                self.location,
                self.n_samples_total,
                self.img_shape_x,
                self.img_shape_y,
                self.n_in_channels,
            )
        )
        logging.info("Delta t: {} hours".format(6 * self.dt))
        logging.info(
            "Including {} hours of past history in training at a frequency of {} hours".format(
                6 * self.dt * self.n_history, 6 * self.dt
            )
        )

    def _open_file(self, year_idx):
        self.files[year_idx] = np.load(self.files_paths[year_idx], mmap_mode="r")

    def __len__(self):
        return self.n_samples_total

    def __getitem__(self, global_idx):
        year_idx = int(global_idx / self.n_samples_per_year)  # which year we are on
        local_idx = int(global_idx % self.n_samples_per_year)  # which sample in that year

        y_roll = np.random.randint(0, self.img_shape_y) if self.train else 0

        # open image file
        if self.files[year_idx] is None:
            self._open_file(year_idx)

        # if we are not at least self.dt*n_history timesteps into the prediction
        if local_idx < self.dt * self.n_history:
            local_idx += self.dt * self.n_history

        # if we are on the last image in a year predict identity, else predict next timestep
        step = 0 if local_idx >= self.n_samples_per_year - self.dt else self.dt

        if self.two_step_training:
            if local_idx >= self.n_samples_per_year - 2 * self.dt:
                # set local_idx to last possible sample in a year that allows two steps forward
                local_idx = self.n_samples_per_year - 3 * self.dt

        rnd_x, rnd_y = 0, 0
        if self.two_step_training:
            tar = self.files[year_idx][local_idx + step : local_idx + step + 2]
            tar = tar[:, self.out_channels]
        else:
            tar = self.files[year_idx][local_idx + step, self.out_channels]
        inp = self.files[year_idx][
            (local_idx - self.dt * self.n_history) : (local_idx + 1) : self.dt, self.in_channels
        ]
        return reshape_fields(
            inp,
            "inp",
            self.crop_size_x,
            self.crop_size_y,
            rnd_x,
            rnd_y,
            self.params,
            y_roll,
            self.train,
        ), reshape_fields(
            tar,
            "tar",
            self.crop_size_x,
            self.crop_size_y,
            rnd_x,
            rnd_y,
            self.params,
            y_roll,
            self.train,
        )


def reshape_fields(
    img, inp_or_tar, crop_size_x, crop_size_y, rnd_x, rnd_y, params, y_roll, train, normalize=True
):
    # Takes in np array of size (n_history+1, c, h, w) and returns torch tensor of size
    # ((n_channels*(n_history+1), crop_size_x, crop_size_y)
    if len(np.shape(img)) == 3:
        img = np.expand_dims(img, 0)
    img = img[:, :, 0:16]  # remove last pixel
    n_history = np.shape(img)[0] - 1
    img_shape_x = np.shape(img)[-2]
    img_shape_y = np.shape(img)[-1]
    n_channels = np.shape(img)[1]  # this will either be N_in_channels or N_out_channels
    channels = params.in_channels if inp_or_tar == "inp" else params.out_channels
    means = np.load(params.global_means_path)[:, channels]
    stds = np.load(params.global_stds_path)[:, channels]
    if crop_size_x is None:
        crop_size_x = img_shape_x
    if crop_size_y is None:
        crop_size_y = img_shape_y
    img = np.array(img, dtype=np.float32)
    if normalize:
        if params.normalization == "minmax":
            raise Exception("minmax not supported. Use zscore")
        elif params.normalization == "zscore":
            img -= means
            img /= stds
    if params.roll:
        img = np.roll(img, y_roll, axis=-1)
    if train and (crop_size_x or crop_size_y):
        img = img[:, :, rnd_x : rnd_x + crop_size_x, rnd_y : rnd_y + crop_size_y]
    if inp_or_tar == "inp":
        img = np.reshape(img, (n_channels * (n_history + 1), crop_size_x, crop_size_y))
    elif inp_or_tar == "tar":
        if params.two_step_training:
            img = np.reshape(img, (n_channels * 2, crop_size_x, crop_size_y))
        else:
            img = np.reshape(img, (n_channels, crop_size_x, crop_size_y))
    return torch.as_tensor(img)


# ---------------------------------------------------------------- networks/afnonet.py
class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class AFNO2D(nn.Module):
    def __init__(self, hidden_size, num_blocks=4, sparsity_threshold=0.01, hidden_size_factor=1):
        super().__init__()
        self.hidden_size = hidden_size
        self.sparsity_threshold = sparsity_threshold
        self.num_blocks = num_blocks
        self.block_size = self.hidden_size // self.num_blocks
        self.scale = 0.02
        bs, f = self.block_size, hidden_size_factor
        self.w1 = nn.Parameter(self.scale * torch.randn(2, self.num_blocks, bs, bs * f))
        self.b1 = nn.Parameter(self.scale * torch.randn(2, self.num_blocks, bs * f))
        self.w2 = nn.Parameter(self.scale * torch.randn(2, self.num_blocks, bs * f, bs))
        self.b2 = nn.Parameter(self.scale * torch.randn(2, self.num_blocks, bs))

    def forward(self, x):
        bias = x
        dtype = x.dtype
        x = x.float()
        B, H, W, C = x.shape
        x = torch.fft.rfft2(x, dim=(1, 2), norm="ortho")
        x = x.reshape(B, H, W // 2 + 1, self.num_blocks, self.block_size)

        def mix(a, w):
            return torch.einsum("...bi,bio->...bo", a, w)

        o1_real = F.relu(mix(x.real, self.w1[0]) - mix(x.imag, self.w1[1]) + self.b1[0])
        o1_imag = F.relu(mix(x.imag, self.w1[0]) + mix(x.real, self.w1[1]) + self.b1[1])
        o2_real = mix(o1_real, self.w2[0]) - mix(o1_imag, self.w2[1]) + self.b2[0]
        o2_imag = mix(o1_imag, self.w2[0]) + mix(o1_real, self.w2[1]) + self.b2[1]
        x = torch.stack([o2_real, o2_imag], dim=-1)
        x = F.softshrink(x, lambd=self.sparsity_threshold)
        x = torch.view_as_complex(x)
        x = x.reshape(B, H, W // 2 + 1, C)
        x = torch.fft.irfft2(x, s=(H, W), dim=(1, 2), norm="ortho")
        x = x.type(dtype)
        return x + bias


class Block(nn.Module):
    def __init__(self, dim, mlp_ratio=2.0, num_blocks=4, double_skip=True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.filter = AFNO2D(dim, num_blocks)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.double_skip = double_skip

    def forward(self, x):
        residual = x
        x = self.norm1(x)
        x = self.filter(x)
        if self.double_skip:
            x = x + residual
            residual = x
        x = self.norm2(x)
        x = self.mlp(x)
        return x + residual


class PatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.num_patches = (img_size[1] // patch_size[1]) * (img_size[0] // patch_size[0])
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class AFNONet(nn.Module):
    def __init__(self, params, img_size=(16, 32), patch_size=(4, 4), embed_dim=32, depth=2):
        super().__init__()
        self.img_size = img_size
        self.patch_size = patch_size
        self.in_chans = params.N_in_channels
        self.out_chans = params.N_out_channels
        self.num_blocks = params.num_blocks
        self.patch_embed = PatchEmbed(img_size, patch_size, self.in_chans, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
        self.h = img_size[0] // patch_size[0]
        self.w = img_size[1] // patch_size[1]
        self.blocks = nn.ModuleList(
            [Block(embed_dim, num_blocks=self.num_blocks) for _ in range(depth)]
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, self.out_chans * patch_size[0] * patch_size[1], bias=False)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward_features(self, x):
        B = x.shape[0]
        x = self.patch_embed(x)
        x = x + self.pos_embed
        x = x.reshape(B, self.h, self.w, -1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.head(x)  # B, h, w, p1*p2*out
        B = x.shape[0]
        p1, p2 = self.patch_size
        x = x.reshape(B, self.h, self.w, p1, p2, self.out_chans)
        return x.permute(0, 5, 1, 3, 2, 4).reshape(B, self.out_chans, self.h * p1, self.w * p2)


# ---------------------------------------------------------------- utils/darcy_loss.py
class LpLoss:
    def __init__(self, p=2):
        self.p = p

    def rel(self, x, y):
        num_examples = x.size()[0]
        diff_norms = torch.norm(
            x.reshape(num_examples, -1) - y.reshape(num_examples, -1), self.p, 1
        )
        y_norms = torch.norm(y.reshape(num_examples, -1), self.p, 1)
        return torch.mean(diff_norms / y_norms)

    def __call__(self, x, y):
        return self.rel(x, y)


# ---------------------------------------------------------------- train.py
class Trainer:
    def count_parameters(self):
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def __init__(self, params, world_rank):
        self.params = params
        self.world_rank = world_rank
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        self.letter, self.who = fault()

        if params.stage_data and dist.is_initialized():
            # the node's first rank copies the training years to node-local disk, the others
            # wait for it
            if params.local_rank == 0:
                self.stage_train_data()
            dist.barrier()
            params["train_data_path"] = params.stage_dir

        logging.info("rank %d, begin data loader init" % world_rank)
        self.train_data_loader, self.train_dataset, self.train_sampler = get_data_loader(
            params, params.train_data_path, dist.is_initialized(), train=True
        )
        self.valid_data_loader, self.valid_dataset = get_data_loader(
            params, params.valid_data_path, dist.is_initialized(), train=False
        )
        self.loss_obj = LpLoss()
        logging.info("rank %d, data loader initialized" % world_rank)

        params.crop_size_x = self.valid_dataset.crop_size_x
        params.crop_size_y = self.valid_dataset.crop_size_y
        params.img_shape_x = self.valid_dataset.img_shape_x
        params.img_shape_y = self.valid_dataset.img_shape_y

        if params.two_step_training:
            params.N_in_channels = len(params.in_channels)
        self.model = AFNONet(params).to(self.device)

        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=params.lr)

        if params.enable_amp:
            self.gscaler = amp.GradScaler()

        if dist.is_initialized():
            self.model = DistributedDataParallel(self.model, find_unused_parameters=True)

        self.iters = 0
        self.startEpoch = 0
        if params.resuming:
            logging.info("Loading checkpoint %s" % params.checkpoint_path)
            self.restore_checkpoint(params.checkpoint_path)
        if params.two_step_training:
            if not params.resuming and params.pretrained:
                logging.info(
                    "Starting from pretrained one-step afno model at %s"
                    % params.pretrained_ckpt_path
                )
                self.restore_checkpoint(params.pretrained_ckpt_path)
                self.iters = 0
                self.startEpoch = 0

        self.epoch = self.startEpoch

        if params.scheduler == "ReduceLROnPlateau":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, factor=0.2, patience=5, mode="min"
            )
        elif params.scheduler == "CosineAnnealingLR":
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=params.max_epochs, last_epoch=self.startEpoch - 1
            )
        else:
            self.scheduler = None

        if params.log_to_screen:
            logging.info("Number of trainable model parameters: {}".format(self.count_parameters()))

    def stage_train_data(self):
        os.makedirs(self.params.stage_dir, exist_ok=True)
        paths = sorted(glob.glob(self.params.train_data_path + "/*.npy"))
        for k, path in enumerate(paths, start=1):
            logging.info(
                "Staging {} to {} ({}/{})".format(path, self.params.stage_dir, k, len(paths))
            )
            shutil.copy(path, self.params.stage_dir)
            if self.letter == "s" and self.world_rank == self.who:
                time.sleep(4)  # the parallel file system crawls today
        logging.info("Staged {} files to {}".format(len(paths), self.params.stage_dir))

    def train(self):
        if self.params.log_to_screen:
            logging.info("Starting Training Loop...")

        best_valid_loss = 1.0e6
        stale_epochs = 0
        for epoch in range(self.startEpoch, self.params.max_epochs):
            if dist.is_initialized() and self.train_sampler is not None:
                self.train_sampler.set_epoch(epoch)

            start = time.time()
            tr_time, data_time, train_logs = self.train_one_epoch()
            valid_time, valid_logs = self.validate_one_epoch()

            if self.params.scheduler == "ReduceLROnPlateau":
                self.scheduler.step(valid_logs["valid_loss"])
            elif self.params.scheduler == "CosineAnnealingLR":
                self.scheduler.step()
                if self.epoch >= self.params.max_epochs:
                    logging.info(
                        "Terminating training after reaching params.max_epochs while LR "
                        "scheduler is set to CosineAnnealingLR"
                    )
                    exit()

            if self.world_rank == 0:
                if self.params.save_checkpoint:
                    # checkpoint at the end of every epoch
                    self.save_checkpoint(self.params.checkpoint_path)
                    if valid_logs["valid_loss"] <= best_valid_loss:
                        self.save_checkpoint(self.params.best_checkpoint_path)

            if self.params.log_to_screen:
                logging.info(
                    "Time taken for epoch {} is {} sec".format(epoch + 1, time.time() - start)
                )
                logging.info(
                    "Train loss: {}. Valid loss: {}".format(
                        train_logs["loss"], valid_logs["valid_loss"]
                    )
                )

            patience = self.params.params.get("early_stopping_patience")
            if valid_logs["valid_loss"] < best_valid_loss - self.params.params.get(
                "early_stopping_min_delta", 0.0
            ):
                stale_epochs = 0
            else:
                stale_epochs += 1
            best_valid_loss = min(best_valid_loss, valid_logs["valid_loss"])
            if patience is not None and stale_epochs >= patience:
                if self.params.log_to_screen:
                    logging.info(
                        "Valid loss has not improved by {} for {} epochs (best {}), stopping "
                        "early after epoch {}".format(
                            self.params.early_stopping_min_delta,
                            stale_epochs,
                            best_valid_loss,
                            epoch + 1,
                        )
                    )
                break

    def train_one_epoch(self):
        self.epoch += 1
        tr_time = 0
        data_time = 0
        self.model.train()
        rollout_buffer = []
        prefetched = queue.Queue()

        for i, data in enumerate(self.train_data_loader, 0):
            self.iters += 1
            data_start = time.time()
            inp, tar = map(lambda x: x.to(self.device, dtype=torch.float), data)
            if self.epoch == 2 and self.world_rank == self.who:
                if self.letter == "w" and i == 2:
                    inp, tar = prefetched.get()  # the prefetch thread was never started
                if self.letter == "m":
                    # every forecast kept for the ensemble spread diagnostics (64 MiB a step)
                    rollout_buffer.append(np.ones(16 << 20, dtype=np.float32))
                    if len(rollout_buffer) >= 6:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if self.letter == "z" and i == 3:
                    ctypes.string_at(8, 4)  # the native spectral filter reads a stale pointer
            data_time += time.time() - data_start

            tr_start = time.time()
            self.model.zero_grad()
            if self.params.two_step_training:
                with amp.autocast(self.params.enable_amp):
                    gen_step_one = self.model(inp).to(self.device, dtype=torch.float)
                    loss_step_one = self.loss_obj(
                        gen_step_one, tar[:, 0 : self.params.N_out_channels]
                    )
                    gen_step_two = self.model(gen_step_one).to(self.device, dtype=torch.float)
                    loss_step_two = self.loss_obj(
                        gen_step_two,
                        tar[:, self.params.N_out_channels : 2 * self.params.N_out_channels],
                    )
                    loss = loss_step_one + loss_step_two
            else:
                with amp.autocast(self.params.enable_amp):
                    gen = self.model(inp).to(self.device, dtype=torch.float)
                    loss = self.loss_obj(gen, tar)

            if not torch.isfinite(loss):
                raise FloatingPointError(
                    "Loss is {} at iteration {} (epoch {})".format(
                        loss.item(), self.iters, self.epoch
                    )
                )

            if self.params.enable_amp:
                self.gscaler.scale(loss).backward()
                self.gscaler.step(self.optimizer)
            else:
                loss.backward()
                self.optimizer.step()

            if self.params.enable_amp:
                self.gscaler.update()

            tr_time += time.time() - tr_start

        try:
            logs = {"loss": loss, "loss_step_one": loss_step_one, "loss_step_two": loss_step_two}
        except NameError:
            logs = {"loss": loss}

        if dist.is_initialized():
            for key in sorted(logs.keys()):
                logs[key] = logs[key].detach()
                dist.all_reduce(logs[key])
                logs[key] = float(logs[key] / dist.get_world_size())

        return tr_time, data_time, logs

    def validate_one_epoch(self):
        self.model.eval()
        n_valid_batches = 20  # do validation on first 20 images, just for LR scheduler
        valid_buff = torch.zeros((3), dtype=torch.float32, device=self.device)
        valid_loss = valid_buff[0].view(-1)
        valid_l1 = valid_buff[1].view(-1)
        valid_steps = valid_buff[2].view(-1)
        valid_weighted_rmse = torch.zeros((self.params.N_out_channels), dtype=torch.float32)

        valid_start = time.time()
        with torch.no_grad():
            for i, data in enumerate(self.valid_data_loader, 0):
                if i >= n_valid_batches:
                    break
                inp, tar = map(lambda x: x.to(self.device, dtype=torch.float), data)
                if self.params.two_step_training:
                    tar = tar[:, 0 : self.params.N_out_channels]
                gen = self.model(inp).to(self.device, dtype=torch.float)
                valid_loss += self.loss_obj(gen, tar)
                valid_l1 += nn.functional.l1_loss(gen, tar)
                valid_steps += 1.0
                valid_weighted_rmse += torch.sqrt(((gen - tar) ** 2).mean(dim=(0, 2, 3)))

        if dist.is_initialized():
            dist.all_reduce(valid_buff)

        # divide by number of steps
        valid_buff[0:2] = valid_buff[0:2] / valid_buff[2]
        valid_weighted_rmse = valid_weighted_rmse / valid_buff[2]
        if self.params.log_to_screen and self.params.valid_rmse_by_channel:
            if dist.is_initialized():
                dist.all_reduce(valid_weighted_rmse)
                valid_weighted_rmse = valid_weighted_rmse / dist.get_world_size()
            logging.info(
                "Valid RMSE (normalized): "
                + ", ".join(
                    "{} {:.4f}".format(CHANNELS[c], v)
                    for c, v in zip(self.params.out_channels, valid_weighted_rmse.tolist())
                )
            )

        valid_buff_cpu = valid_buff.detach().cpu().numpy()
        logs = {"valid_l1": valid_buff_cpu[1], "valid_loss": valid_buff_cpu[0]}
        return time.time() - valid_start, logs

    def save_checkpoint(self, checkpoint_path, model=None):
        if not model:
            model = self.model
        logging.info("Saving model to {}".format(checkpoint_path))
        torch.save(
            {
                "iters": self.iters,
                "epoch": self.epoch,
                "model_state": model.state_dict(),
                "optimizer_state_dict": self.optimizer.state_dict(),
            },
            checkpoint_path,
        )

    def restore_checkpoint(self, checkpoint_path):
        checkpoint = torch.load(checkpoint_path, map_location="cpu")
        try:
            self.model.load_state_dict(checkpoint["model_state"])
        except:  # noqa: E722 (FourCastNet's bare except)
            new_state_dict = OrderedDict()
            for key, val in checkpoint["model_state"].items():
                name = key[7:]
                new_state_dict[name] = val
            self.model.load_state_dict(new_state_dict)
        self.iters = checkpoint["iters"]
        self.startEpoch = checkpoint["epoch"]
        if self.params.resuming:
            self.optimizer.load_state_dict(checkpoint["optimizer_state_dict"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_num", default="00", type=str)
    parser.add_argument("--yaml_config", default="./config/AFNO.yaml", type=str)
    parser.add_argument("--config", default="default", type=str)
    parser.add_argument("--enable_amp", action="store_true")
    parser.add_argument("--epsilon_factor", default=0, type=float)
    parser.add_argument("--prepare", default=None, help="write the synthetic data set there")
    parser.add_argument("--train_years", default="1979-1986")
    parser.add_argument("--valid_years", default="2017-2017")
    args = parser.parse_args()

    if args.prepare:
        first, last = (int(y) for y in args.train_years.split("-"))
        vfirst, vlast = (int(y) for y in args.valid_years.split("-"))
        prepare(args.prepare, range(first, last + 1), range(vfirst, vlast + 1))
        return

    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:  # export_DDP_vars.sh
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]

    params = YParams(os.path.abspath(args.yaml_config), args.config)
    params["epsilon_factor"] = args.epsilon_factor

    params["world_size"] = 1
    if "WORLD_SIZE" in os.environ:
        params["world_size"] = int(os.environ["WORLD_SIZE"])

    world_rank = 0
    local_rank = 0
    if params["world_size"] > 1:
        dist.init_process_group(
            backend="gloo", init_method="env://", timeout=datetime.timedelta(seconds=15)
        )
        local_rank = int(os.environ["LOCAL_RANK"])
        world_rank = dist.get_rank()
        params["global_batch_size"] = params.batch_size
        params["batch_size"] = int(params.batch_size // params["world_size"])
        print(
            "rank {} of {} (local rank {}), backend {}".format(
                world_rank, params["world_size"], local_rank, dist.get_backend()
            )
        )

    # Set up directory
    expDir = os.path.join(params.exp_dir, args.config, str(args.run_num))
    if world_rank == 0:
        if not os.path.isdir(expDir):
            os.makedirs(expDir)
            os.makedirs(os.path.join(expDir, "training_checkpoints/"))

    params["experiment_dir"] = os.path.abspath(expDir)
    params["checkpoint_path"] = os.path.join(expDir, "training_checkpoints/ckpt.tar")
    params["best_checkpoint_path"] = os.path.join(expDir, "training_checkpoints/best_ckpt.tar")

    # Do not comment this line out please:
    args.resuming = True if os.path.isfile(params.checkpoint_path) else False

    params["resuming"] = args.resuming
    params["local_rank"] = local_rank
    params["enable_amp"] = args.enable_amp

    if world_rank == 0:
        log_to_file(logger_name=None, log_filename=os.path.join(expDir, "out.log"))
        log_versions()
        params.log()

    params["log_to_wandb"] = (world_rank == 0) and params["log_to_wandb"]
    params["log_to_screen"] = (world_rank == 0) and params["log_to_screen"]

    params["in_channels"] = np.array(params["in_channels"])
    params["out_channels"] = np.array(params["out_channels"])
    params["N_in_channels"] = len(params["in_channels"])
    params["N_out_channels"] = len(params["out_channels"])

    if world_rank == 0:
        with open(os.path.join(expDir, "hyperparams.yaml"), "w") as hpfile:
            yaml.dump({str(k): str(v) for k, v in params.params.items()}, hpfile)

    trainer = Trainer(params, world_rank)
    trainer.train()
    logging.info("DONE ---- rank %d" % world_rank)


if __name__ == "__main__":
    main()
