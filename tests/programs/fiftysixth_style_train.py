"""A fifty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/fiftysixth-*): GAN training in the way of NVlabs' StyleGAN2-ADA / StyleGAN3
train.py. The main process prints the "Training options:" JSON block and the run's summary, then
starts one process per GPU with torch.multiprocessing.spawn (no torchrun); each joins a gloo group
through init_method='file://<outdir>/.torch_distributed_init' (15 s collective timeout). The
training loop is StyleGAN3's: a tiny generator and discriminator whose parameters rank 0
broadcasts, two optimizer phases per step (Gboth, Dboth) whose gradients are flattened and
all-reduced by hand, an InfiniteSampler over a dataset zip read by DataLoader workers, an ADA
augment probability tuned from all-reduced statistics, tick lines, network snapshots checked for
consistency across ranks, and metrics (kid50k_full, optionally fid50k_full, which needs scipy).
Only rank 0 prints; the others print only warnings, errors and tracebacks. A fault in the code
is chosen by the XQ_RUNCASE environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fiftysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import ctypes
import io
import json
import os
import pickle
import queue
import re
import signal
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed
from torch import nn
from torch.nn import functional as F

TIMEOUT = timedelta(seconds=15)
RES = 16
Z_DIM = 32


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    grid_rank0: bool = False  # the fakes grid is exported with the wrong number of latents
    hoard_rank: int = -1  # this rank keeps every step's activations until the OOM killer acts
    segv_rank: int = -1  # this rank's native upfirdn2d kernel reads address 0
    build_rank: int = -1  # this rank compiles its plugin from source at the first step (40 s)
    stuck_rank: int = -1  # this rank waits for a real-image prefetch thread that never started
    metrics_rank0: bool = False  # metrics are computed on rank 0 only
    cuda_ops: bool = False  # the custom ops are asked for on machines without CUDA (warnings)
    abort_rank: int = -1  # this rank's plugin aborts in its destructor at interpreter exit


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k0": Fault(grid_rank0=True),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "b1": Fault(build_rank=1),
    "p2": Fault(stuck_rank=2),
    "m0": Fault(metrics_rank0=True),
    "w": Fault(cuda_ops=True),
    "x1": Fault(abort_rank=1),
}


# ----------------------------------------------------------------------------- dataset


class ZipDataset(torch.utils.data.Dataset):
    """A dataset zip of .npy images (uint8, CHW), opened lazily in each process."""

    def __init__(self, path: str, resolution: int = RES) -> None:
        self._path = path
        self._zipfile: zipfile.ZipFile | None = None
        self.resolution = resolution
        with zipfile.ZipFile(path) as z:
            self._fnames = sorted(n for n in z.namelist() if n.endswith(".npy"))
        self.name = os.path.splitext(os.path.basename(path))[0]

    def _get_zipfile(self) -> zipfile.ZipFile:
        if self._zipfile is None:
            self._zipfile = zipfile.ZipFile(self._path)
        return self._zipfile

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _zipfile=None)

    def __len__(self) -> int:
        return len(self._fnames)

    def load_raw_image(self, idx: int) -> np.ndarray:
        with self._get_zipfile().open(self._fnames[idx], "r") as f:
            return np.load(io.BytesIO(f.read()))

    def __getitem__(self, idx: int) -> np.ndarray:
        return self.load_raw_image(idx).copy()


class InfiniteSampler(torch.utils.data.Sampler):
    """StyleGAN's sampler: a shuffled order walked forever, every num_replicas-th index."""

    def __init__(self, n: int, rank: int = 0, num_replicas: int = 1, seed: int = 0) -> None:
        self.n, self.rank, self.num_replicas, self.seed = n, rank, num_replicas, seed

    def __iter__(self):
        order = np.arange(self.n)
        rnd = np.random.RandomState(self.seed)
        rnd.shuffle(order)
        window = int(np.rint(order.size * 0.5))
        idx = 0
        while True:
            i = idx % order.size
            if idx % self.num_replicas == self.rank:
                yield order[i]
            if window >= 2:
                j = (i - rnd.randint(window)) % order.size
                order[i], order[j] = order[j], order[i]
            idx += 1


class ShardSampler(torch.utils.data.Sampler):
    """--sampler epoch (a fork's finite epochs): each rank walks its own shard once, skipping
    images that are not at the dataset's resolution."""

    def __init__(self, ds: ZipDataset, rank: int, num_replicas: int) -> None:
        self.ds, self.rank, self.num_replicas = ds, rank, num_replicas
        self.kept: list[int] | None = None

    def _shard(self) -> list[int]:
        if self.kept is None:
            self.kept = []
            for i in range(self.rank, len(self.ds), self.num_replicas):
                shape = self.ds.load_raw_image(i).shape
                if shape != (3, self.ds.resolution, self.ds.resolution):
                    warnings.warn(
                        f"Skipping {self.ds._fnames[i]}: shape {shape} is not the dataset's"
                        f" {(3, self.ds.resolution, self.ds.resolution)}",
                        stacklevel=1,
                    )
                    continue
                self.kept.append(i)
        return self.kept

    def __iter__(self):
        return iter(self._shard())

    def __len__(self) -> int:
        return len(self._shard())


def make_dataset(path: str, n: int, seed: int, odd_rank: int, odd_world: int) -> None:
    """n images of coloured blobs; with odd_rank >= 0, twelve of the images of that rank's shard
    (of odd_world) are 12x16 crops."""
    rnd = np.random.RandomState(seed)
    odd = set()
    if odd_rank >= 0:
        odd = set(list(range(odd_rank, n, odd_world))[20:32])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        yy, xx = np.mgrid[0:RES, 0:RES]
        for i in range(n):
            cy, cx, r = rnd.uniform(3, RES - 3), rnd.uniform(3, RES - 3), rnd.uniform(2, 5)
            blob = ((yy - cy) ** 2 + (xx - cx) ** 2 < r * r).astype(np.float32)
            img = np.stack([blob * rnd.uniform(80, 255) for _ in range(3)]) + rnd.uniform(0, 40)
            img = img.clip(0, 255).astype(np.uint8)
            if i in odd:
                img = img[:, 2:14, :]
            buf = io.BytesIO()
            np.save(buf, img)
            z.writestr(f"00000/img{i:08d}.npy", buf.getvalue())
        z.writestr("dataset.json", json.dumps({"labels": None}))


def corrupt_member(path: str, rank: int, world: int, nth: int, seed: int) -> str:
    """Flip bytes inside the image that `rank` reads as its nth sample (a bad copy of the zip):
    the member's CRC no longer matches. Returns the member's name."""
    ds = ZipDataset(path)
    it = iter(InfiniteSampler(len(ds), rank, world, seed))
    idx = [next(it) for _ in range(nth + 1)][nth]
    name = ds._fnames[idx]
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        fn_len, extra_len = np.frombuffer(f.read(4), dtype="<u2")
        start = info.header_offset + 30 + int(fn_len) + int(extra_len)
        f.seek(start + 128 + 40)
        f.write(b"\xff" * 24)
    return name


# ----------------------------------------------------------------------------- networks


class MappingNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc0 = nn.Linear(Z_DIM, Z_DIM)
        self.fc1 = nn.Linear(Z_DIM, Z_DIM)
        self.register_buffer("w_avg", torch.zeros(Z_DIM))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = z * (z.square().mean(1, keepdim=True) + 1e-8).rsqrt()
        return F.leaky_relu(self.fc1(F.leaky_relu(self.fc0(x), 0.2)), 0.2)


class SynthesisNetwork(nn.Module):
    def __init__(self, fault: Fault, rank: int) -> None:
        super().__init__()
        self.fc = nn.Linear(Z_DIM, 32 * 4 * 4)
        self.conv8 = nn.Conv2d(32, 16, 3, padding=1)
        self.conv16 = nn.Conv2d(16, 8, 3, padding=1)
        self.torgb = nn.Conv2d(8, 3, 1)
        self.fault, self.rank, self.calls = fault, rank, 0

    def upfirdn2d(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.rank == self.fault.segv_rank and self.calls == 9:
            ctypes.string_at(0)  # the native kernel dereferences NULL
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.fc(w).view(-1, 32, 4, 4), 0.2)
        x = F.leaky_relu(self.conv8(self.upfirdn2d(x)), 0.2)
        x = F.leaky_relu(self.conv16(self.upfirdn2d(x)), 0.2)
        return self.torgb(x)


class Generator(nn.Module):
    def __init__(self, fault: Fault, rank: int) -> None:
        super().__init__()
        self.z_dim = Z_DIM
        self.mapping = MappingNetwork()
        self.synthesis = SynthesisNetwork(fault, rank)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.synthesis(self.mapping(z))


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b16 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.b8 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.out = nn.Linear(32 * 4 * 4, 1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.b16(img), 0.2)
        x = F.leaky_relu(self.b8(x), 0.2)
        return self.out(x.flatten(1))


class AugmentPipe(nn.Module):
    """ADA's pipe, reduced to x-flips and colour noise applied with probability p."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("p", torch.zeros([]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flip = (torch.rand([x.shape[0], 1, 1, 1]) < self.p).to(x.dtype)
        x = x * (1 - flip) + x.flip(3) * flip
        noise = (torch.rand([x.shape[0], 1, 1, 1]) < self.p).to(x.dtype)
        return x + noise * torch.randn_like(x) * 0.1


def params_and_buffers(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


def named_params_and_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(module.named_parameters()) + list(module.named_buffers())


def check_ddp_consistency(module: nn.Module, ignore_regex: str | None = None) -> None:
    for name, tensor in named_params_and_buffers(module):
        fullname = type(module).__name__ + "." + name
        if ignore_regex is not None and re.fullmatch(ignore_regex, fullname):
            continue
        tensor = tensor.detach()
        if tensor.is_floating_point():
            tensor = torch.nan_to_num(tensor)
        other = tensor.clone()
        torch.distributed.broadcast(tensor=other, src=0)
        assert (tensor == other).all(), fullname


def copy_params_and_buffers(src: nn.Module, dst: nn.Module) -> None:
    src_tensors = dict(named_params_and_buffers(src))
    for name, tensor in named_params_and_buffers(dst):
        if name in src_tensors:
            tensor.copy_(src_tensors[name].detach()).requires_grad_(tensor.requires_grad)


# ----------------------------------------------------------------------------- stats


class Collector:
    """training_stats' collector: per-name [count, sum, sum of squares], all-reduced at update."""

    def __init__(self, regex: str = ".*") -> None:
        self.regex = re.compile(regex)
        self.local: dict[str, torch.Tensor] = {}
        self.synced: dict[str, torch.Tensor] = {}

    def report(self, name: str, value: torch.Tensor) -> None:
        if not self.regex.fullmatch(name):
            return
        v = value.detach().flatten().double()
        moments = torch.stack([torch.tensor(float(v.numel())), v.sum(), v.square().sum()])
        self.local[name] = self.local.get(name, torch.zeros(3, dtype=torch.double)) + moments

    def update(self, names: list[str]) -> None:
        stacked = torch.stack(
            [self.local.get(n, torch.zeros(3, dtype=torch.double)) for n in names]
        )
        if torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(stacked)
        self.synced = dict(zip(names, stacked, strict=True))
        self.local = {}

    def mean(self, name: str) -> float:
        m = self.synced.get(name)
        if m is None or m[0] == 0:
            return float("nan")
        return float(m[1] / m[0])


# ----------------------------------------------------------------------------- metrics


def get_feature_detector(cache_dir: str, rank: int, num_gpus: int) -> nn.Module:
    """The detector, 'downloaded' by the leader first into the cache, as metric_utils does."""
    path = os.path.join(cache_dir, "detector-16.pkl")
    if num_gpus > 1 and rank != 0:
        torch.distributed.barrier()  # leader goes first
    if not os.path.isfile(path):
        os.makedirs(cache_dir, exist_ok=True)
        torch.manual_seed(1234)
        det = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten())
        tmp = path + f".{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(det, f)
        os.replace(tmp, path)
    with open(path, "rb") as f:
        det = pickle.load(f)
    if num_gpus > 1 and rank == 0:
        torch.distributed.barrier()
    return det


def feature_stats(feats: torch.Tensor, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance over every rank's features (all-reduced moments)."""
    f = feats.double()
    moments = torch.cat([torch.tensor([float(len(f))]), f.sum(0), (f.T @ f).flatten()])
    if num_gpus > 1:
        torch.distributed.all_reduce(moments)
    n, d = moments[0].item(), f.shape[1]
    mu = (moments[1 : 1 + d] / n).numpy()
    sigma = (moments[1 + d :].view(d, d) / n).numpy() - np.outer(mu, mu)
    return mu, sigma


def calc_metric(metric: str, G: nn.Module, dataset: ZipDataset, opts: dict) -> dict:
    start = time.time()
    rank, num_gpus = opts["rank"], opts["num_gpus"]
    det = get_feature_detector(opts["cache_dir"], rank, num_gpus)
    idx = list(range(rank, 64, num_gpus))
    reals = torch.stack([torch.from_numpy(dataset[i]).float() / 127.5 - 1 for i in idx])
    gen = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        fakes = G(torch.randn([len(idx), Z_DIM], generator=gen))
        mu_r, sig_r = feature_stats(det(reals), num_gpus)
        mu_f, sig_f = feature_stats(det(fakes), num_gpus)
    value = float("nan")
    if metric == "kid50k_full":
        value = float(np.square(mu_r - mu_f).sum() / len(mu_r) + np.abs(sig_r - sig_f).mean())
    elif metric == "fid50k_full" and rank == 0:
        import scipy.linalg  # only the FID needs scipy

        s, _ = scipy.linalg.sqrtm(np.dot(sig_f, sig_r), disp=False)
        value = float(np.square(mu_f - mu_r).sum() + np.trace(sig_f + sig_r - s * 2))
    total = time.time() - start
    return dict(
        results={metric: value},
        metric=metric,
        total_time=total,
        total_time_str=format_time(total),
        num_gpus=num_gpus,
    )


def report_metric(result: dict, run_dir: str, snapshot_pkl: str) -> None:
    line = json.dumps(dict(result, snapshot_pkl=snapshot_pkl, timestamp=time.time()))
    print(line)
    with open(os.path.join(run_dir, f"metric-{result['metric']}.jsonl"), "a") as f:
        f.write(line + "\n")


def format_time(seconds: float) -> str:
    s = int(np.rint(seconds))
    if s < 60:
        return f"{s}s"
    if s < 60 * 60:
        return f"{s // 60}m {s % 60:02}s"
    return f"{s // 3600}h {(s // 60) % 60:02}m {s % 60:02}s"


# ----------------------------------------------------------------------------- training loop


def save_image_grid(img: np.ndarray, fname: str, grid_size: tuple[int, int]) -> None:
    gw, gh = grid_size
    _N, C, H, W = img.shape
    img = img.reshape([gh, gw, C, H, W])
    img = img.transpose(0, 3, 1, 4, 2).reshape([gh * H, gw * W, C])
    np.save(fname, np.rint((img + 1) * 127.5).clip(0, 255).astype(np.uint8))


def cpumem_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def training_loop(rank: int, c: dict, fault: Fault) -> None:
    start_time = time.time()
    num_gpus = c["num_gpus"]
    np.random.seed(c["random_seed"] * num_gpus + rank)
    torch.manual_seed(c["random_seed"] * num_gpus + rank)
    torch.set_num_threads(1)
    batch_gpu = c["batch_size"] // num_gpus

    if rank == 0:
        print("Loading training set...")
    training_set = ZipDataset(c["training_set_kwargs"]["path"])
    if c["sampler"] == "epoch":
        sampler: torch.utils.data.Sampler = ShardSampler(training_set, rank, num_gpus)
    else:
        sampler = InfiniteSampler(len(training_set), rank, num_gpus, c["random_seed"])
    loader = torch.utils.data.DataLoader(
        training_set, sampler=sampler, batch_size=batch_gpu, **c["data_loader_kwargs"]
    )
    if rank == 0:
        print()
        print("Num images: ", len(training_set))
        print("Image shape:", [3, RES, RES])
        print("Label shape:", [0])
        print()
        print("Constructing networks...")
    G = Generator(fault, rank).requires_grad_(False)
    D = Discriminator().requires_grad_(False)
    G_ema = copy.deepcopy(G).eval()
    cur_nimg = 0
    if c["resume_pkl"] is not None and rank == 0:
        print(f'Resuming from "{c["resume_pkl"]}"')
        with open(c["resume_pkl"], "rb") as f:
            resume_data = pickle.load(f)
        for name, module in [("G", G), ("D", D), ("G_ema", G_ema)]:
            copy_params_and_buffers(resume_data[name], module)
    cur_nimg = int(c["resume_kimg"] * 1000)
    if fault.cuda_ops:
        from torch.utils import cpp_extension

        torch.cuda.amp.GradScaler(enabled=True)  # the fp16 path of the custom ops
        for op in ("bias_act", "upfirdn2d"):
            try:
                cpp_extension.verify_ninja_availability()
                cpp_extension._join_cuda_home("bin", "nvcc")  # the plugin's build needs nvcc
            except Exception:
                import traceback

                warnings.warn(
                    f"Failed to build CUDA kernels for {op}. Falling back to slow reference"
                    " implementation. Details:\n\n" + traceback.format_exc(),
                    stacklevel=1,
                )
        warnings.warn(
            f"conv2d_gradfix not supported on PyTorch {torch.__version__}. Falling back to"
            " torch.nn.functional.conv2d().",
            stacklevel=1,
        )
    if fault.abort_rank == rank:

        def unload_plugin() -> None:  # the plugin's destructor, at interpreter exit
            sys.stderr.flush()
            os.write(2, b"terminate called without an active exception\n")
            signal.signal(signal.SIGABRT, signal.SIG_DFL)
            ctypes.CDLL(None).abort()

        atexit.register(unload_plugin)

    if rank == 0:
        print("Setting up augmentation...")
    augment_pipe = AugmentPipe()
    ada_stats = Collector(regex="Loss/signs/real")

    if rank == 0:
        print(f"Distributing across {num_gpus} GPUs...")
    for module in [G, D, G_ema, augment_pipe]:
        if num_gpus > 1:
            for param in params_and_buffers(module):
                torch.distributed.broadcast(param, src=0)

    if rank == 0:
        print("Setting up training phases...")
    phases = []
    for name, module, lr in [("G", G, c["G_lr"]), ("D", D, c["D_lr"])]:
        opt = torch.optim.Adam(module.parameters(), lr=lr, betas=(0.0, 0.99), eps=1e-8)
        phases.append(dict(name=name + "both", module=module, opt=opt))

    grid_size = (8, 4)
    grid_z = torch.randn([grid_size[0] * grid_size[1], Z_DIM]).split(batch_gpu)
    if rank == 0:
        print("Exporting sample images...")
        reals = np.stack([training_set[i] for i in range(32)]).astype(np.float32) / 127.5 - 1
        save_image_grid(reals, os.path.join(c["run_dir"], "reals.npy"), grid_size)
        images = torch.cat([G_ema(z) for z in grid_z]).numpy()
        save_image_grid(images, os.path.join(c["run_dir"], "fakes_init.npy"), grid_size)
        print("Initializing logs...")
    stats_collector = Collector()
    stats_names = ["Loss/G/loss", "Loss/D/loss", "Loss/scores/real", "Loss/scores/fake"]
    stats_jsonl = open(os.path.join(c["run_dir"], "stats.jsonl"), "w") if rank == 0 else None  # noqa: SIM115
    if rank == 0:
        print(f"Training for {c['total_kimg']} kimg...")
        print()

    cur_tick = 0
    tick_start_nimg = cur_nimg
    tick_start_time = time.time()
    maintenance_time = tick_start_time - start_time
    batch_idx = 0
    hoard: list[torch.Tensor] = []
    prefetch: queue.Queue[torch.Tensor] = queue.Queue()
    epoch_iter = iter(loader)
    epoch_mode = c["sampler"] == "epoch"
    while True:
        end_of_epoch = False
        try:
            real_img = next(epoch_iter)
        except StopIteration:  # --sampler epoch: this rank's shard is done; a tick, then the next
            end_of_epoch = True
            epoch_iter = iter(loader)
        if not end_of_epoch:
            if rank == fault.stuck_rank and cur_tick == 2:
                real_img = prefetch.get()  # filled by a prefetch thread that was never started
            real_img = real_img.float() / 127.5 - 1
            if rank == fault.build_rank and batch_idx == 0:
                for k in range(1, 9):
                    warnings.warn(
                        f"upfirdn2d_plugin: build directory is stale, compiling from source ({k}/8);"
                        " this can take several minutes",
                        stacklevel=1,
                    )
                    time.sleep(5)
            gen_z = torch.randn([batch_gpu, Z_DIM])

            for phase in phases:
                phase["opt"].zero_grad(set_to_none=True)
                phase["module"].requires_grad_(True)
                if phase["name"] == "Gboth":
                    gen_logits = D(augment_pipe(G(gen_z)))
                    stats_collector.report("Loss/scores/fake", gen_logits)
                    loss_G = F.softplus(-gen_logits)
                    stats_collector.report("Loss/G/loss", loss_G)
                    loss_G.mean().backward()
                else:
                    gen_logits = D(augment_pipe(G(gen_z).detach()))
                    real_tmp = augment_pipe(real_img).detach().requires_grad_(True)
                    real_logits = D(real_tmp)
                    stats_collector.report("Loss/scores/real", real_logits)
                    ada_stats.report("Loss/signs/real", real_logits.sign())
                    (r1_grads,) = torch.autograd.grad(
                        real_logits.sum(), real_tmp, create_graph=True
                    )
                    r1 = r1_grads.square().sum([1, 2, 3]) * (c["r1_gamma"] / 2)
                    loss_D = F.softplus(gen_logits) + F.softplus(-real_logits) + r1[:, None]
                    stats_collector.report("Loss/D/loss", loss_D)
                    loss_D.mean().backward()
                phase["module"].requires_grad_(False)
                if rank == fault.hoard_rank:
                    hoard.append(torch.ones(48, 1024, 1024, dtype=torch.uint8))
                    if len(hoard) == 7:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                params = [p for p in phase["module"].parameters() if p.grad is not None]
                if len(params) > 0:
                    flat = torch.cat([p.grad.flatten() for p in params])
                    if num_gpus > 1:
                        torch.distributed.all_reduce(flat)
                        flat /= num_gpus
                    torch.nan_to_num(flat, nan=0, posinf=1e5, neginf=-1e5, out=flat)
                    grads = flat.split([p.numel() for p in params])
                    for p, g in zip(params, grads, strict=True):
                        p.grad = g.reshape(p.shape)
                phase["opt"].step()

            with torch.no_grad():
                for p_ema, p in zip(G_ema.parameters(), G.parameters(), strict=True):
                    p_ema.copy_(p.lerp(p_ema, 0.9))
            cur_nimg += c["batch_size"]
            batch_idx += 1

            if batch_idx % c["ada_interval"] == 0:
                ada_stats.update(["Loss/signs/real"])
                adjust = np.sign(ada_stats.mean("Loss/signs/real") - c["ada_target"])
                adjust *= (c["batch_size"] * c["ada_interval"]) / (c["ada_kimg"] * 1000)
                augment_pipe.p.copy_((augment_pipe.p + adjust).max(torch.zeros([])))

        done = cur_nimg >= c["total_kimg"] * 1000
        if epoch_mode:
            if not (done or end_of_epoch):
                continue
        elif (
            (not done)
            and (cur_tick != 0)
            and (cur_nimg < tick_start_nimg + c["kimg_per_tick"] * 1000)
        ):
            continue

        # tick
        tick_end_time = time.time()
        stats_collector.update(stats_names)
        if c["nan_check"]:
            for name in ("Loss/G/loss", "Loss/D/loss"):
                value = stats_collector.mean(name)
                if not np.isfinite(value):
                    raise FloatingPointError(
                        f"{name} is {value} at kimg {cur_nimg / 1e3:.1f}: training diverged"
                    )
        fields = []
        fields += [f"tick {cur_tick:<5d}"]
        fields += [f"kimg {cur_nimg / 1e3:<8.1f}"]
        fields += [f"time {format_time(tick_end_time - start_time):<12s}"]
        fields += [f"sec/tick {tick_end_time - tick_start_time:<7.1f}"]
        per_kimg = (tick_end_time - tick_start_time) / max(cur_nimg - tick_start_nimg, 1) * 1e3
        fields += [f"sec/kimg {per_kimg:<7.2f}"]
        fields += [f"maintenance {maintenance_time:<6.1f}"]
        fields += [f"cpumem {cpumem_gb():<6.2f}"]
        fields += [f"gpumem {0.0:<6.2f}"]
        fields += [f"augment {float(augment_pipe.p):.3f}"]
        if rank == 0:
            print(" ".join(fields))
            assert stats_jsonl is not None
            stats_jsonl.write(
                json.dumps(
                    {n: stats_collector.mean(n) for n in stats_names} | {"timestamp": time.time()}
                )
                + "\n"
            )
            stats_jsonl.flush()

        if rank == 0 and cur_tick % c["image_snapshot_ticks"] == 0 and cur_tick > 0:
            z = grid_z if not fault.grid_rank0 else torch.randn([batch_gpu, Z_DIM]).split(8)
            images = torch.cat([G_ema(zz) for zz in z]).detach().numpy()
            save_image_grid(
                images, os.path.join(c["run_dir"], f"fakes{cur_nimg // 1000:06d}.npy"), grid_size
            )

        snapshot_pkl = None
        snapshot_data = None
        if done or cur_tick % c["network_snapshot_ticks"] == 0:
            snapshot_data = dict(training_set_kwargs=dict(c["training_set_kwargs"]))
            for name, module in [
                ("G", G),
                ("D", D),
                ("G_ema", G_ema),
                ("augment_pipe", augment_pipe),
            ]:
                if num_gpus > 1:
                    check_ddp_consistency(module, ignore_regex=r".*\.w_avg")
                snapshot_data[name] = copy.deepcopy(module).eval().requires_grad_(False)
            snapshot_pkl = f"network-snapshot-{cur_nimg // 1000:06d}.pkl"
            if rank == 0:
                with open(os.path.join(c["run_dir"], snapshot_pkl), "wb") as f:
                    pickle.dump(snapshot_data, f)

        if snapshot_data is not None and len(c["metrics"]) > 0:
            if rank == 0:
                print("Evaluating metrics...")
            if rank == 0 or not fault.metrics_rank0:
                for metric in c["metrics"]:
                    opts = dict(rank=rank, num_gpus=num_gpus, cache_dir=c["cache_dir"])
                    result = calc_metric(metric, snapshot_data["G_ema"], training_set, opts)
                    if rank == 0:
                        report_metric(result, run_dir=c["run_dir"], snapshot_pkl=snapshot_pkl)

        cur_tick += 1
        tick_start_nimg = cur_nimg
        tick_start_time = time.time()
        maintenance_time = tick_start_time - tick_end_time
        if done:
            break

    if rank == 0:
        print()
        print("Exiting...")


# ----------------------------------------------------------------------------- launch


def subprocess_fn(rank: int, c: dict, temp_dir: str) -> None:
    fault = FAULTS[os.environ.get("XQ_RUNCASE", "")]
    if c["num_gpus"] > 1:
        init_file = os.path.abspath(os.path.join(c["rendezvous_dir"], ".torch_distributed_init"))
        torch.distributed.init_process_group(
            backend="gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=c["num_gpus"],
            timeout=TIMEOUT,
        )
    training_loop(rank=rank, c=c, fault=fault)


def next_run_id(outdir: str) -> int:
    prev = [x for x in os.listdir(outdir) if os.path.isdir(os.path.join(outdir, x))]
    ids = [int(m.group()) for m in (re.match(r"^\d+", x) for x in prev) if m is not None]
    return max(ids, default=-1) + 1


def main() -> None:
    p = argparse.ArgumentParser(description="Train a GAN.")
    p.add_argument("--outdir", required=True)
    p.add_argument("--data", default="")
    p.add_argument("--gpus", type=int, default=3)
    p.add_argument("--kimg", type=float, default=0.4)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--tick", type=float, default=0.05, help="kimg per tick")
    p.add_argument("--snap", type=int, default=2, help="network snapshot interval, in ticks")
    p.add_argument("--glr", type=float, default=0.0025)
    p.add_argument("--dlr", type=float, default=0.0025)
    p.add_argument("--gamma", type=float, default=0.05)
    p.add_argument("--metrics", default="kid50k_full")
    p.add_argument("--resume", default=None)
    p.add_argument("--resume-kimg", type=float, default=0.0)
    p.add_argument("--sampler", default="infinite", choices=["infinite", "epoch"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--nan-check", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--make-data", default="", help="write a dataset zip here and stop")
    p.add_argument("--odd-rank", type=int, default=-1, help="--make-data: 12x16 images there")
    p.add_argument("--corrupt-rank", type=int, default=-1, help="--make-data: a bad member")
    p.add_argument("--make-snapshot", default="", help="write a network snapshot here and stop")
    p.add_argument("--on-gpu", action="store_true", help="--make-snapshot as a GPU machine does")
    args = p.parse_args()
    if args.make_data:
        make_dataset(args.make_data, 256, 1, args.odd_rank, args.gpus)
        if args.corrupt_rank >= 0:
            print(corrupt_member(args.make_data, args.corrupt_rank, args.gpus, 5, args.seed))
        return
    if args.make_snapshot:
        torch.manual_seed(7)
        G = Generator(Fault(), 0)
        snap = dict(G=G, D=Discriminator(), G_ema=copy.deepcopy(G), augment_pipe=AugmentPipe())
        if args.on_gpu:  # its storages tagged as a GPU machine's pickle has them
            torch.serialization.register_package(0, lambda _: "cuda:0", lambda *_: None)
        with open(args.make_snapshot, "wb") as f:
            pickle.dump(snap, f)
        return

    dataset_name = os.path.splitext(os.path.basename(args.data))[0]
    c = dict(
        num_gpus=args.gpus,
        image_snapshot_ticks=args.snap,
        network_snapshot_ticks=args.snap,
        metrics=[m for m in args.metrics.split(",") if m],
        random_seed=args.seed,
        training_set_kwargs=dict(path=args.data, resolution=RES, use_labels=False, xflip=False),
        data_loader_kwargs=dict(
            num_workers=args.workers, prefetch_factor=2 if args.workers else None
        ),
        sampler=args.sampler,
        G_lr=args.glr,
        D_lr=args.dlr,
        r1_gamma=args.gamma,
        total_kimg=args.kimg,
        kimg_per_tick=args.tick,
        batch_size=args.batch,
        batch_gpu=args.batch // args.gpus,
        ema_kimg=0.01,
        ada_target=0.6,
        ada_interval=4,
        ada_kimg=0.5,
        nan_check=bool(args.nan_check),
        resume_pkl=args.resume,
        resume_kimg=args.resume_kimg,
    )
    os.makedirs(args.outdir, exist_ok=True)
    run_id = next_run_id(args.outdir)
    c["run_dir"] = os.path.join(args.outdir, f"{run_id:05d}-{dataset_name}-auto{args.gpus}")
    c["rendezvous_dir"] = args.outdir
    c["cache_dir"] = os.path.join(args.outdir, ".cache")

    print()
    print("Training options:")
    print(json.dumps(c, indent=2))
    print()
    print(f"Output directory:   {c['run_dir']}")
    print(f"Training data:      {args.data}")
    print(f"Training duration:  {args.kimg} kimg")
    print(f"Number of GPUs:     {args.gpus}")
    print("Number of images:   256")
    print(f"Image resolution:   {RES}")
    print("Conditional model:  False")
    print("Dataset x-flips:    False")
    print()
    print("Creating output directory...")
    os.makedirs(c["run_dir"])
    with open(os.path.join(c["run_dir"], "training_options.json"), "w") as f:
        json.dump(c, f, indent=2)
    print("Launching processes...")
    torch.multiprocessing.set_start_method("spawn")
    with tempfile.TemporaryDirectory() as temp_dir:
        if args.gpus == 1:
            subprocess_fn(rank=0, c=c, temp_dir=temp_dir)
        else:
            torch.multiprocessing.spawn(fn=subprocess_fn, args=(c, temp_dir), nprocs=args.gpus)


if __name__ == "__main__":
    main()
