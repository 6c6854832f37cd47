"""A hundred-and-twentieth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentieth-*): differentially private image classification with Opacus
and DDP in the way of pytorch/opacus's examples/cifar10.py and its distributed tutorial
(`torchrun --nproc_per_node=2 cifar10.py --epochs 3 --batch-size 256 --sigma 1.5 -c 10.0
--delta 1e-5 --dist_algo ddp --lr 0.1`), re-created in plain torch in one file, without opacus
installed: a GradSampleModule-like wrapper (forward hooks keep each layer's activations, full
backward hooks turn the backprops into per-sample gradients with the expanded-weights formulas:
unfold for Conv2d, einsum for Linear, the normalised input for GroupNorm), ModuleValidator's
check that refuses BatchNorm (UnsupportedModuleError), the DPDDP wrapper
(DifferentiallyPrivateDistributedDataParallel: the parameters broadcast from rank 0 at wrap),
the distributed DP optimizer (per-sample clipping to max_grad_norm, Gaussian noise of std
noise_multiplier * max_grad_norm added on rank 0, the summed gradients all-reduced parameter by
parameter in step()), Poisson sampling over each rank's shard of the data (DPDataLoader with a
DistributedPoissonBatchSampler: a variable-size batch every step, an empty one possible,
collated as zero-size tensors), the RDP accountant (opacus' DEFAULT_ALPHAS, the
subsampled-Gaussian RDP and its conversion to (epsilon, delta)), PrivacyEngine's 'Secure RNG
turned off' warning and the torchcsprng import of --secure-rng, the accountant's 'Optimal order
is the largest alpha' warning, python logging '%(asctime)s:%(levelname)s:%(message)s' on the
'ddp' logger, rank 0's '\\tTrain Epoch: E \\tLoss: L Acc@1: A (ε = e, δ = d)' and '\\tTest set:'
lines, checkpoint.tar saved by rank 0 each epoch, the metrics logged at the end. Added the way
users add them: a stop when the privacy budget --target-epsilon is spent, the test accuracy
all-reduced over the ranks' halves of the test set. The data are an image folder of per-image
.npy files (data/cifar10/{train,test}/<class>/<n>.npy, 32 x 32 x 3 uint8) read lazily, written by
`--prepare DIR`. gloo on CPU, 15 s collective timeout. A fault in the code is chosen by the
TQ_CASE environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from datetime import datetime, timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(
    format="%(asctime)s:%(levelname)s:%(message)s",
    datefmt="%m/%d/%Y %H:%M:%S",
    stream=sys.stdout,
)
logger = logging.getLogger("ddp")
logger.setLevel(level=logging.INFO)

CASE = os.environ.get("TQ_CASE", "")
CASE_RANK = int(CASE[1:]) if CASE[1:].isdigit() else -1

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD_DEV = (0.2023, 0.1994, 0.2010)


# ---------------------------------------------------------------- opacus/validators/errors.py
class UnsupportedError(ValueError):
    pass


class UnsupportedModuleError(UnsupportedError):
    pass


class ShouldReplaceModuleError(UnsupportedModuleError):
    pass


for _cls in (UnsupportedError, UnsupportedModuleError, ShouldReplaceModuleError):
    _cls.__module__ = "opacus.validators.errors"


class ModuleValidator:
    @staticmethod
    def validate(module: nn.Module, *, strict: bool = False) -> list[Exception]:
        errors: list[Exception] = []
        for name, m in module.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                errors.append(
                    ShouldReplaceModuleError(
                        "BatchNorm cannot support training with differential privacy: it "
                        "normalises each sample with statistics of the other samples in its "
                        f"batch, so one sample's contribution is not isolated ({name}: {m}). "
                        "Use a privacy-safe normalisation (GroupNorm, LayerNorm, InstanceNorm); "
                        "ModuleValidator.fix(model) replaces BatchNorm with GroupNorm."
                    )
                )
        if strict and errors:
            raise UnsupportedModuleError(errors)
        return errors


# ---------------------------------------------------------------- opacus/grad_sample
def _conv2d_grad_sample(layer: nn.Conv2d, activations, backprops):
    n = activations.shape[0]
    if f"v{RANK}" == CASE and STATE["epoch"] == 2 and STATE["step"] == 3:
        ctypes.string_at(0)  # the native unfold fast path dereferences NULL
    activations = F.unfold(
        activations,
        layer.kernel_size,
        padding=layer.padding,
        stride=layer.stride,
        dilation=layer.dilation,
    )
    backprops = backprops.reshape(n, -1, activations.shape[-1])
    grad_sample = torch.einsum("noq,npq->nop", backprops, activations)
    ret = {layer.weight: grad_sample.view(n, *layer.weight.shape)}
    if layer.bias is not None:
        ret[layer.bias] = torch.sum(backprops, dim=2)
    return ret


def _linear_grad_sample(layer: nn.Linear, activations, backprops):
    ret = {layer.weight: torch.einsum("n...i,n...j->nij", backprops, activations)}
    if layer.bias is not None:
        ret[layer.bias] = torch.einsum("n...k->nk", backprops)
    return ret


def _group_norm_grad_sample(layer: nn.GroupNorm, activations, backprops):
    gs = F.group_norm(activations, layer.num_groups, eps=layer.eps) * backprops
    return {
        layer.weight: torch.einsum("ni...->ni", gs),
        layer.bias: torch.einsum("ni...->ni", backprops),
    }


GRAD_SAMPLERS = {
    nn.Conv2d: _conv2d_grad_sample,
    nn.Linear: _linear_grad_sample,
    nn.GroupNorm: _group_norm_grad_sample,
}


class GradSampleModule(nn.Module):
    """Hooks that leave p.grad_sample (one gradient per example) on every trainable parameter."""

    def __init__(self, m: nn.Module, *, loss_reduction: str = "mean") -> None:
        super().__init__()
        self._module = m
        self.loss_reduction = loss_reduction
        self.hoard: list[torch.Tensor] = []
        for module in m.modules():
            if type(module) in GRAD_SAMPLERS:
                module.register_forward_hook(self.capture_activations_hook)
                module.register_full_backward_hook(self.capture_backprops_hook)

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def capture_activations_hook(self, module, forward_input, _forward_output):
        if module.training:
            module.activations = forward_input[0].detach()

    def capture_backprops_hook(self, module, _forward_input, forward_output):
        backprops = forward_output[0].detach()
        n = module.activations.shape[0]
        if self.loss_reduction == "mean":
            backprops = backprops * n
        for param, gs in GRAD_SAMPLERS[type(module)](module, module.activations, backprops).items():
            param.grad_sample = gs
            if f"m{RANK}" == CASE and STATE["epoch"] >= 2:
                # the per-sample gradients of the whole logical batch, kept for the expanded batch
                self.hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(self.hoard) == 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        del module.activations


# ---------------------------------------------------------------- opacus/distributed.py
class DifferentiallyPrivateDistributedDataParallel(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p.data, 0)
        self.module = model

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


DPDDP = DifferentiallyPrivateDistributedDataParallel


# ---------------------------------------------------------------- opacus/optimizers
class DistributedDPOptimizer:
    def __init__(self, optimizer, *, noise_multiplier, max_grad_norm, expected_batch_size):
        self.original_optimizer = optimizer
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = max_grad_norm
        self.expected_batch_size = expected_batch_size
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.step_hook = None

    @property
    def param_groups(self):
        return self.original_optimizer.param_groups

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            p.grad_sample = None
            p.summed_grad = None
        self.original_optimizer.zero_grad(set_to_none)

    def clip_and_accumulate(self) -> None:
        n = self.params[0].grad_sample.shape[0]
        per_param_norms = [p.grad_sample.reshape(n, -1).norm(2, dim=-1) for p in self.params]
        per_sample_norms = torch.stack(per_param_norms, dim=1).norm(2, dim=1)
        clip_factor = (self.max_grad_norm / (per_sample_norms + 1e-6)).clamp(max=1.0)
        for p in self.params:
            p.summed_grad = torch.einsum("i,i...", clip_factor, p.grad_sample)

    def add_noise(self) -> None:
        for p in self.params:
            if self.rank == 0:
                noise = torch.normal(
                    mean=0,
                    std=self.noise_multiplier * self.max_grad_norm,
                    size=p.summed_grad.shape,
                    generator=None,
                )
                p.grad = (p.summed_grad + noise).view_as(p)
            else:
                p.grad = p.summed_grad.view_as(p)

    def scale_grad(self) -> None:
        for p in self.params:
            p.grad /= self.expected_batch_size

    def reduce_gradients(self) -> None:
        for p in self.params:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= self.world_size

    def step(self) -> None:
        self.clip_and_accumulate()
        self.add_noise()
        self.scale_grad()
        if self.step_hook:
            self.step_hook(self)
        self.reduce_gradients()
        self.original_optimizer.step()


# ---------------------------------------------------------------- opacus/accountants/analysis/rdp.py
def _log_add(logx: float, logy: float) -> float:
    a, b = min(logx, logy), max(logx, logy)
    if a == -math.inf:
        return b
    return math.log1p(math.exp(a - b)) + b


def _log_sub(logx: float, logy: float) -> float:
    if logx < logy:
        raise ValueError("The result of subtraction must be non-negative.")
    if logy == -math.inf:
        return logx
    if logx == logy:
        return -math.inf
    try:
        return math.log(math.expm1(logx - logy)) + logy
    except OverflowError:
        return logx


def _log_erfc(x: float) -> float:
    if x < 20:
        return math.log(math.erfc(x))
    return -x * x - math.log(x) - 0.5 * math.log(math.pi)  # the asymptotic series' first term


def _binom(a: float, k: int) -> float:
    c = 1.0
    for j in range(k):
        c *= (a - j) / (j + 1)
    return c


def _compute_log_a_for_int_alpha(q: float, sigma: float, alpha: int) -> float:
    log_a = -math.inf
    for i in range(alpha + 1):
        log_coef_i = math.log(math.comb(alpha, i)) + i * math.log(q) + (alpha - i) * math.log(1 - q)
        s = log_coef_i + (i * i - i) / (2 * (sigma**2))
        log_a = _log_add(log_a, s)
    return float(log_a)


def _compute_log_a_for_frac_alpha(q: float, sigma: float, alpha: float) -> float:
    log_a0, log_a1 = -math.inf, -math.inf
    i = 0
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    while True:
        coef = _binom(alpha, i)
        log_coef = math.log(abs(coef))
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
        log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
        if coef > 0:
            log_a0 = _log_add(log_a0, log_s0)
            log_a1 = _log_add(log_a1, log_s1)
        else:
            log_a0 = _log_sub(log_a0, log_s0)
            log_a1 = _log_sub(log_a1, log_s1)
        i += 1
        if max(log_s0, log_s1) < -30:
            break
    return _log_add(log_a0, log_a1)


def _compute_rdp(q: float, sigma: float, alpha: float) -> float:
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1.0:
        return alpha / (2 * sigma**2)
    if float(alpha).is_integer():
        return _compute_log_a_for_int_alpha(q, sigma, int(alpha)) / (alpha - 1)
    return _compute_log_a_for_frac_alpha(q, sigma, alpha) / (alpha - 1)


def get_privacy_spent(*, orders, rdp, delta):
    orders_vec = np.atleast_1d(orders)
    rdp_vec = np.atleast_1d(rdp)
    eps = (
        rdp_vec
        - (np.log(delta) + np.log(orders_vec)) / (orders_vec - 1)
        + np.log((orders_vec - 1) / orders_vec)
    )
    if np.isnan(eps).all():
        return np.inf, np.nan
    idx_opt = np.nanargmin(eps)
    if idx_opt == 0 or idx_opt == len(eps) - 1:
        extreme = "smallest" if idx_opt == 0 else "largest"
        warnings.warn(
            f"Optimal order is the {extreme} alpha. Please consider expanding the range of "
            "alphas to get a tighter privacy bound.",
            stacklevel=2,
        )
    return eps[idx_opt], orders_vec[idx_opt]


class RDPAccountant:
    DEFAULT_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))

    def __init__(self) -> None:
        self.history: list[tuple[float, float, int]] = []

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, steps = self.history.pop()
            self.history.append((sigma, q, steps + 1))
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def get_epsilon(self, delta: float) -> float:
        rdp = sum(
            np.array([_compute_rdp(q, sigma, a) for a in self.DEFAULT_ALPHAS]) * steps
            for (sigma, q, steps) in self.history
        )
        eps, _best_alpha = get_privacy_spent(orders=self.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
        return float(eps)


# ---------------------------------------------------------------- opacus/data_loader.py
class DistributedPoissonBatchSampler:
    """Each rank's shard of a permutation; every step keeps each of its examples with
    probability sample_rate (Poisson sampling): a batch of variable size, possibly empty."""

    def __init__(self, total_size, sample_rate, *, batch_size, generator=None, shuffle_seed=0):
        self.total_size = total_size
        self.sample_rate = sample_rate
        self.generator = generator
        self.num_replicas = dist.get_world_size()
        self.rank = dist.get_rank()
        self.shuffle_seed = shuffle_seed
        self.epoch = 0
        self.num_samples = math.ceil((self.total_size - self.rank) / self.num_replicas)
        # as many steps as this rank's shard holds full batches of its share
        self.steps = self.num_samples // (batch_size // self.num_replicas)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.shuffle_seed + self.epoch)
        indices = torch.randperm(self.total_size, generator=g)
        indices = indices[self.rank : self.total_size : self.num_replicas]
        assert len(indices) == self.num_samples
        for _ in range(self.steps):
            mask = torch.rand(self.num_samples, generator=self.generator) < self.sample_rate
            yield indices[mask.nonzero(as_tuple=False).reshape(-1)].tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def wrap_collate_with_empty(sample_empty_shapes, dtypes):
    def collate(batch):
        if len(batch) > 0:
            return torch.utils.data.default_collate(batch)
        return [
            torch.zeros(shape, dtype=dtype)
            for shape, dtype in zip(sample_empty_shapes, dtypes, strict=False)
        ]

    return collate


class DPDataLoader(DataLoader):
    @classmethod
    def from_data_loader(cls, data_loader: DataLoader, *, generator=None, distributed=True):
        dataset = data_loader.dataset
        sample_rate = 1 / len(data_loader)
        batch_sampler = DistributedPoissonBatchSampler(
            total_size=len(dataset),
            sample_rate=sample_rate,
            batch_size=data_loader.batch_size,
            generator=generator,
        )
        x, _y = dataset[0]
        loader = cls(
            dataset=dataset,
            batch_sampler=batch_sampler,
            num_workers=data_loader.num_workers,
            collate_fn=wrap_collate_with_empty([(0, *x.shape), (0,)], [x.dtype, torch.int64]),
        )
        loader.sample_rate = sample_rate
        return loader


# ---------------------------------------------------------------- opacus/privacy_engine.py
class PrivacyEngine:
    def __init__(self, *, accountant: str = "rdp", secure_mode: bool = False) -> None:
        self.accountant = RDPAccountant()
        self.secure_mode = secure_mode
        self.secure_rng = None
        if self.secure_mode:
            try:
                import torchcsprng as csprng
            except ImportError as e:
                msg = (
                    "To use secure RNG, you must install the torchcsprng package! "
                    "Check out the instructions here: https://github.com/pytorch/csprng#installation"
                )
                raise ImportError(msg) from e
            self.secure_rng = csprng.create_random_device_generator("/dev/urandom")
        else:
            warnings.warn(
                "Secure RNG turned off. This is perfectly fine for experimentation as it allows "
                "for much faster training performance, but remember to turn it on and retrain "
                "one last time before production with ``secure_mode`` turned on.",
                stacklevel=2,
            )

    def make_private(self, *, module, optimizer, data_loader, noise_multiplier, max_grad_norm):
        ModuleValidator.validate(module, strict=True)
        module = GradSampleModule(module)
        data_loader = DPDataLoader.from_data_loader(data_loader, generator=self.secure_rng)
        sample_rate = data_loader.sample_rate
        expected_batch_size = int(len(data_loader.dataset) * sample_rate / dist.get_world_size())
        optimizer = DistributedDPOptimizer(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
        )

        def hook(opt):
            self.accountant.step(noise_multiplier=opt.noise_multiplier, sample_rate=sample_rate)

        optimizer.step_hook = hook
        return module, optimizer, data_loader


# ---------------------------------------------------------------- the example
RANK = 0
STATE = {"epoch": 0, "step": 0}


class ImageFolderNpy(Dataset):
    """<root>/<class>/<n>.npy, one 32 x 32 x 3 uint8 image a file, read when asked for."""

    def __init__(self, root: str) -> None:
        self.samples = []
        for label, name in enumerate(CLASSES):
            folder = os.path.join(root, name)
            for f in sorted(os.listdir(folder)):
                self.samples.append((os.path.join(folder, f), label))
        self.mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
        self.std = torch.tensor(CIFAR10_STD_DEV).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        img = np.load(path)
        x = torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
        return (x - self.mean) / self.std, label


class ConvNet(nn.Module):
    """The example's convnet, with GroupNorm (--arch convnet) or BatchNorm (--arch convnet_bn)."""

    def __init__(self, num_classes: int = 10, norm: str = "group") -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            normlayer = nn.BatchNorm2d(cout) if norm == "batch" else nn.GroupNorm(4, cout)
            return [nn.Conv2d(cin, cout, 3, padding=1), normlayer, nn.ReLU(), nn.AvgPool2d(2, 2)]

        self.features = nn.Sequential(*block(3, 8), *block(8, 16), *block(16, 16))
        self.fc = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x):
        x = self.features(x)
        x = x.view(x.size(0), -1)
        return self.fc(x)


def accuracy(preds, labels) -> float:
    return float((preds == labels).float().mean()) if len(labels) else 0.0


def save_checkpoint(state, is_best, filename="checkpoint.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def train(args, model, train_loader, optimizer, privacy_engine, epoch, rank):
    start_time = datetime.now()
    model.train()
    criterion = nn.CrossEntropyLoss()
    losses, top1_acc = [], []
    train_loader.batch_sampler.set_epoch(epoch)
    for i, (images, target) in enumerate(train_loader):
        STATE["step"] = i
        output = model(images)
        loss = criterion(output, target)
        preds = output.detach().argmax(dim=1)
        losses.append(loss.item())
        top1_acc.append(accuracy(preds, target))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.target_epsilon and CASE != "x0":
            epsilon = privacy_engine.accountant.get_epsilon(delta=args.delta)
            if epsilon > args.target_epsilon:
                logger.info(
                    f"Privacy budget exhausted (ε = {epsilon:.2f} > {args.target_epsilon}), "
                    "stopping"
                )
                return datetime.now() - start_time, True
        if i % args.print_freq == 0 and rank == 0:
            if CASE == "g0":  # the mean loss over the ranks for the line below
                mean_loss = torch.tensor([loss.item()])
                dist.all_reduce(mean_loss)
                losses[-1] = mean_loss.item() / dist.get_world_size()
            epsilon = privacy_engine.accountant.get_epsilon(delta=args.delta)
            print(
                f"\tTrain Epoch: {epoch} \t"
                f"Loss: {np.mean(losses):.4f} "
                f"Acc@1: {np.mean(top1_acc) * 100:.3f} "
                f"(ε = {epsilon:.2f}, δ = {args.delta})"
            )
            if args.target_epsilon and CASE == "x0" and epsilon > args.target_epsilon:
                logger.info(
                    f"Privacy budget exhausted (ε = {epsilon:.2f} > {args.target_epsilon}), "
                    "stopping"
                )
                sys.exit(0)
    return datetime.now() - start_time, False


def test(args, model, test_loader, rank):
    model.eval()
    criterion = nn.CrossEntropyLoss()
    totals = torch.zeros(3)  # loss sum, correct, seen
    with torch.no_grad():
        for images, target in test_loader:
            output = model(images)
            totals[0] += criterion(output, target).item() * len(target)
            totals[1] += (output.argmax(dim=1) == target).sum()
            totals[2] += len(target)
    dist.all_reduce(totals)
    loss, top1_avg = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
    if rank == 0:
        print(f"\tTest set:Loss: {loss:.4f} Acc: {top1_avg * 100:.3f} ")
    return top1_avg


def prepare(root: str, n_train: int, n_test: int) -> None:
    """Synthetic CIFAR-10-like images: a class colour and stripe pattern under noise."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        for k in range(n):
            label = k % len(CLASSES)
            base = np.zeros((32, 32, 3), dtype=np.float32)
            base[..., label % 3] = 120 + 12 * label
            base[:: (label % 4) + 2, :, (label + 1) % 3] += 80
            img = np.clip(base + rng.normal(0, 40, size=base.shape), 0, 255).astype(np.uint8)
            folder = os.path.join(root, split, CLASSES[label])
            os.makedirs(folder, exist_ok=True)
            np.save(os.path.join(folder, f"{k:05d}.npy"), img)


def parse_args():
    parser = argparse.ArgumentParser(description="PyTorch CIFAR10 DP Training")
    parser.add_argument("-j", "--workers", default=0, type=int, metavar="N")
    parser.add_argument("--epochs", default=3, type=int, metavar="N")
    parser.add_argument("--start-epoch", default=1, type=int, metavar="N")
    parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N")
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=0, type=float, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=4, type=int)
    parser.add_argument("--seed", default=11, type=int)
    parser.add_argument("--sigma", type=float, default=1.5, help="Noise multiplier")
    parser.add_argument(
        "-c", "--max-per-sample-grad_norm", type=float, default=10.0, help="Clip per-sample grads"
    )
    parser.add_argument("--secure-rng", action="store_true", default=False)
    parser.add_argument("--delta", type=float, default=1e-5, help="Target delta")
    parser.add_argument("--target-epsilon", type=float, default=0.0, help="stop when spent")
    parser.add_argument("--checkpoint-file", type=str, default="checkpoint")
    parser.add_argument("--data-root", type=str, default="data/cifar10")
    parser.add_argument("--optim", type=str, default="SGD")
    parser.add_argument("--device", type=str, default="cuda")
    parser.add_argument("--arch", type=str, default="convnet", choices=["convnet", "convnet_bn"])
    parser.add_argument("--dist_algo", type=str, default="ddp", choices=["ddp", "naive"])
    parser.add_argument("--prepare", type=str, default="", help="write the image folder there")
    parser.add_argument("--n-train", type=int, default=1024)
    return parser.parse_args()


def setup(args):
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    backend = "gloo" if args.device == "cpu" else "nccl"
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=15))
    logger.info(f"Setting up {backend} process group: rank {rank}, world_size {world_size}")
    return rank, local_rank, world_size


def main():
    global RANK
    args = parse_args()
    if args.prepare:
        prepare(args.prepare, args.n_train, 256)
        return
    torch.set_num_threads(1)
    rank, _local_rank, world_size = setup(args)
    RANK = rank
    torch.manual_seed(args.seed + rank)

    train_dataset = ImageFolderNpy(os.path.join(args.data_root, "train"))
    test_dataset = ImageFolderNpy(os.path.join(args.data_root, "test"))
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, num_workers=args.workers)
    test_loader = DataLoader(
        torch.utils.data.Subset(test_dataset, range(rank, len(test_dataset), world_size)),
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.workers,
    )

    best_acc1 = 0.0
    model = ConvNet(num_classes=10, norm="batch" if args.arch == "convnet_bn" else "group")
    if world_size > 1 and args.dist_algo in ("ddp", "naive"):
        model = DPDDP(model)
    if args.optim == "SGD":
        optimizer = torch.optim.SGD(
            model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
        )
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    privacy_engine = PrivacyEngine(secure_mode=args.secure_rng)
    model, optimizer, train_loader = privacy_engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        noise_multiplier=args.sigma,
        max_grad_norm=args.max_per_sample_grad_norm,
    )
    if rank == 0:
        print(f"Using sigma={optimizer.noise_multiplier} and C={args.max_per_sample_grad_norm}")

    accuracy_per_epoch, time_per_epoch = [], []
    for epoch in range(args.start_epoch, args.epochs + 1):
        STATE["epoch"] = epoch
        if f"j{rank}" == CASE and epoch == 2:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        train_duration, spent = train(
            args, model, train_loader, optimizer, privacy_engine, epoch, rank
        )
        top1_acc = test(args, model, test_loader, rank)
        is_best = top1_acc > best_acc1
        best_acc1 = max(top1_acc, best_acc1)
        time_per_epoch.append(train_duration)
        accuracy_per_epoch.append(float(top1_acc))
        if rank == 0:
            save_checkpoint(
                {
                    "epoch": epoch,
                    "arch": args.arch,
                    "state_dict": model.state_dict(),
                    "best_acc1": best_acc1,
                },
                is_best,
                filename=args.checkpoint_file + ".tar",
            )
        if f"s{rank}" == CASE and epoch == 1:
            for part in range(1, 9):
                logger.info(
                    f"Auditing the privacy guarantee for the release report: PRV accountant "
                    f"over 4096 deltas ({part}/8)"
                )
                time.sleep(5)
        if spent:
            break

    time_per_epoch_seconds = [t.total_seconds() for t in time_per_epoch]
    avg_time_per_epoch = sum(time_per_epoch_seconds) / len(time_per_epoch_seconds)
    metrics = {
        "accuracy": best_acc1,
        "accuracy_per_epoch": accuracy_per_epoch,
        "avg_time_per_epoch_str": str(timedelta(seconds=int(avg_time_per_epoch))),
        "time_per_epoch": time_per_epoch_seconds,
    }
    if rank == 0:
        logger.info(
            "\nNote:\n- 'total_time' includes the data loading time, training time and testing "
            "time.\n- 'time_per_epoch' measures the training time only.\n"
        )
        logger.info(metrics)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
