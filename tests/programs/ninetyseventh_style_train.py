"""A ninety-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyseventh-*): GAN training in the way of NVlabs' stylegan2-ada-pytorch /
stylegan3 train.py, re-implemented in plain torch in one file (linked into each run's folder as
train.py; dnnlib's EasyDict and Logger, torch_utils' custom_ops, misc and training_stats,
training/dataset.py, networks.py, augment.py, loss.py and training_loop.py folded in, much
smaller). `python train.py --outdir=training-runs --data=datasets/tiny.zip --gpus=2 --cfg=auto
--kimg=1 --snap=1 --metrics=none` checks its options with click as stylegan2-ada does (UserError ->
ctx.fail), builds the dataset once to learn its resolution, prints the "Training options:" JSON
and stylegan3's summary (Output directory, Number of GPUs, Batch size, Training duration, Dataset
path/size/resolution/labels/x-flips), then starts --gpus processes itself with
torch.multiprocessing.spawn (start method spawn). Each joins a gloo group through env://
(MASTER_ADDR/MASTER_PORT, as the cluster forks of the repo do instead of the file:// init file)
with this fork's 15 s timeout; only rank 0 prints (dnnlib's Logger tees stdout and stderr into
the run's log.txt), the other ranks set custom_ops.verbosity = 'none'.

The training loop is StyleGAN's: ImageFolderDataset over a zip of PNGs (decoded by a small
stdlib PNG reader: no PIL here), misc.InfiniteSampler per rank, a DataLoader with --workers
workers; a tiny mapping + synthesis generator (modulated convolutions, noise inputs, skip
architecture) and a resnet discriminator with minibatch-stddev, each wrapped in DDP (G_ema too,
for its initial sync; forward_sync_buffers=False, torch 2.13's name for StyleGAN's
broadcast_buffers=False, which in 2.13 also leaves the buffers out of DDP's initial sync),
StyleGAN2Loss with R1 on every D step ('Gboth', 'Dboth': this CPU port
does not regularize lazily), an ADA-like AugmentPipe whose probability p is tuned every
ada_interval batches from the sign of D's real logits, all-reduced by a training_stats
Collector; the tick status line, network-snapshot-NNNNNN.pkl after misc.check_ddp_consistency,
'Exiting...'. The "custom ops" bias_act and upfirdn2d are computed in torch, but their set-up is
simulated as StyleGAN's custom_ops.get_plugin / torch.utils.cpp_extension.load do it: a build
directory under $TORCH_EXTENSIONS_DIR, guarded by torch's own FileBaton ('lock'): the first
process builds, the others wait for the lock to go; the set-up happens at the first call (rank
0's print_module_summary, the other ranks' first training step). `--resume` loads on rank 0 only
and, as the snapshot-resume patch of the repo does, takes cur_nimg (and here batch_idx) from a
'network-snapshot-NNNNNN.pkl' name, on rank 0 only.

`python train.py dataset_tool --dest D.zip [...]` writes a synthetic dataset zip (dataset_tool.py's
layout 00000/img00000000.png); `python train.py make_snapshot --dest P.pkl --resolution R` writes a
network pickle of freshly initialised networks (a stand-in for a pretrained one). A fault in the
code is chosen by the TQ_CASE environment variable (a letter and a rank) and never printed
(re-capture with tests/fixtures/real/capture_ninetyseventh.sh after any edit).
"""
# ruff: noqa: B006, B904, B905, RUF005, RUF059, SIM102, SIM115, UP004, UP015, UP024, UP030, UP032 (StyleGAN's own code, as it is written)

import copy
import ctypes
import datetime
import hashlib
import json
import os
import pickle
import re
import signal
import struct
import sys
import time
import zipfile
import zlib

import click
import numpy as np
import psutil
import torch
import torch.nn.functional as F
from torch.utils.file_baton import FileBaton

DIST_TIMEOUT = datetime.timedelta(seconds=15)  # this fork's collective timeout


def fault():
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ----------------------------------------------------------------------------
# dnnlib


class EasyDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name)

    def __setattr__(self, name, value):
        self[name] = value

    def __delattr__(self, name):
        del self[name]


class Logger(object):
    """Redirect stderr to stdout, optionally print stdout to a file, and optionally force flushing on both stdout and the file."""

    def __init__(self, file_name=None, file_mode="w", should_flush=True):
        self.file = None
        if file_name is not None:
            self.file = open(file_name, file_mode)
        self.should_flush = should_flush
        self.stdout = sys.stdout
        self.stderr = sys.stderr
        sys.stdout = self
        sys.stderr = self

    def write(self, text):
        if isinstance(text, bytes):
            text = text.decode()
        if len(text) == 0:
            return
        if self.file is not None:
            self.file.write(text)
        self.stdout.write(text)
        if self.should_flush:
            self.flush()

    def flush(self):
        if self.file is not None:
            self.file.flush()
        self.stdout.flush()


def format_time(seconds):
    s = int(np.rint(seconds))
    if s < 60:
        return "{0}s".format(s)
    elif s < 60 * 60:
        return "{0}m {1:02}s".format(s // 60, s % 60)
    elif s < 24 * 60 * 60:
        return "{0}h {1:02}m {2:02}s".format(s // (60 * 60), (s // 60) % 60, s % 60)
    else:
        return "{0}d {1:02}h {2:02}m".format(
            s // (24 * 60 * 60), (s // (60 * 60)) % 24, (s // 60) % 60
        )


def construct_class_by_name(*args, class_name=None, **kwargs):
    # every class of this port lives in this one file
    return globals()[class_name.split(".")[-1]](*args, **kwargs)


def open_url(url):
    # this port reads local paths only (no downloads)
    return open(url, "rb")


# ----------------------------------------------------------------------------
# torch_utils.custom_ops: set-up of the compiled plugins, with torch's FileBaton

verbosity = "brief"  # Verbosity level: 'none', 'brief', 'full'
_cached_plugins = dict()
_rank = 0


class _Plugin:
    """The loaded extension: its kernels (computed with torch ops in this port)."""

    def __init__(self, name):
        self.name = name
        self.calls = 0

    def bias_act(self, x, b, dim, act, alpha, gain, clamp):
        self.calls += 1
        letter, who = fault()
        if letter == "n" and _rank == who and _fault_armed[0] and self.calls % 7 == 0:
            ctypes.string_at(0)  # the kernel reads through a null pointer
        return _bias_act_ref(x, b, dim, act, alpha, gain, clamp)


def _extensions_root():
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        root = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions", "py311_cpu")
    return root


def get_plugin(module_name, sources):
    assert verbosity in ["none", "brief", "full"]
    if module_name in _cached_plugins:
        return _cached_plugins[module_name]
    if verbosity == "full":
        print(f'Setting up PyTorch plugin "{module_name}"...')
    elif verbosity == "brief":
        print(f'Setting up PyTorch plugin "{module_name}"... ', end="", flush=True)
    try:
        build_dir = os.path.join(_extensions_root(), module_name)
        os.makedirs(build_dir, exist_ok=True)
        digest = hashlib.md5("\n".join(sources).encode()).hexdigest()
        library = os.path.join(build_dir, f"{module_name}.so")
        # as torch.utils.cpp_extension._jit_compile: every process takes the baton; the one
        # that gets it (re)builds when the sources changed, the others wait for it to go
        baton = FileBaton(os.path.join(build_dir, "lock"))
        if baton.try_acquire():
            try:
                built = os.path.isfile(library) and open(library).read() == digest
                if not built:
                    time.sleep(1.5)  # ninja: compiling and linking the extension
                    with open(library, "w") as f:
                        f.write(digest)
            finally:
                baton.release()
        else:
            baton.wait()
        module = _Plugin(module_name)
    except:
        if verbosity == "brief":
            print("Failed!")
        raise
    if verbosity == "full":
        print(f'Done setting up PyTorch plugin "{module_name}".')
    elif verbosity == "brief":
        print("Done.")
    _cached_plugins[module_name] = module
    return module


# ----------------------------------------------------------------------------
# torch_utils.ops: bias_act and upfirdn2d

_bias_act_plugin = None
_upfirdn2d_plugin = None
_fault_armed = [False]


def _bias_act_ref(x, b, dim, act, alpha, gain, clamp):
    if b is not None:
        x = x + b.reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    if act == "lrelu":
        x = F.leaky_relu(x, alpha)
    x = x * gain
    if clamp is not None and clamp >= 0:
        x = x.clamp(-clamp, clamp)
    return x


def bias_act(x, b=None, dim=1, act="linear", alpha=0.2, gain=None, clamp=None):
    global _bias_act_plugin
    if gain is None:
        gain = np.sqrt(2) if act == "lrelu" else 1
    if _bias_act_plugin is None:
        _bias_act_plugin = get_plugin("bias_act_plugin", ["bias_act.cpp", "bias_act.h"])
    return _bias_act_plugin.bias_act(x, b, dim, act, alpha, gain, clamp)


def _setup_filter():
    f = torch.tensor([1.0, 3.0, 3.0, 1.0])
    f = f[:, None] * f[None, :]
    return f / f.sum()


def upfirdn2d(x, f, up=1, down=1, padding=(0, 0, 0, 0), gain=1):
    global _upfirdn2d_plugin
    if _upfirdn2d_plugin is None:
        _upfirdn2d_plugin = get_plugin("upfirdn2d_plugin", ["upfirdn2d.cpp", "upfirdn2d.h"])
    n, c, h, w = x.shape
    if up > 1:
        x = x.reshape(n, c, h, 1, w, 1)
        x = F.pad(x, [0, up - 1, 0, 0, 0, up - 1])
        x = x.reshape(n, c, h * up, w * up)
    x = F.pad(x, list(padding))
    weight = (f * (gain if up == 1 else gain * up * up))[None, None].repeat(c, 1, 1, 1)
    x = F.conv2d(x, weight.to(x.dtype), groups=c)
    if down > 1:
        x = x[:, :, ::down, ::down]
    return x


# ----------------------------------------------------------------------------
# torch_utils.misc


class InfiniteSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, rank=0, num_replicas=1, shuffle=True, seed=0, window_size=0.5):
        assert len(dataset) > 0
        assert num_replicas > 0
        assert 0 <= rank < num_replicas
        assert 0 <= window_size <= 1
        super().__init__()
        self.dataset = dataset
        self.rank = rank
        self.num_replicas = num_replicas
        self.shuffle = shuffle
        self.seed = seed
        self.window_size = window_size

    def __iter__(self):
        order = np.arange(len(self.dataset))
        rnd = None
        window = 0
        if self.shuffle:
            rnd = np.random.RandomState(self.seed)
            rnd.shuffle(order)
            window = int(np.rint(order.size * self.window_size))
        idx = 0
        while True:
            i = idx % order.size
            if idx % self.num_replicas == self.rank:
                yield order[i]
            if window >= 2:
                j = (i - rnd.randint(window)) % order.size
                order[i], order[j] = order[j], order[i]
            idx += 1


def params_and_buffers(module):
    return list(module.parameters()) + list(module.buffers())


def named_params_and_buffers(module):
    return list(module.named_parameters()) + list(module.named_buffers())


def copy_params_and_buffers(src_module, dst_module, require_all=False):
    src_tensors = {name: tensor for name, tensor in named_params_and_buffers(src_module)}
    for name, tensor in named_params_and_buffers(dst_module):
        assert (name in src_tensors) or (not require_all)
        if name in src_tensors:
            tensor.copy_(src_tensors[name].detach()).requires_grad_(tensor.requires_grad)


class ddp_sync:
    def __init__(self, module, sync):
        self.ctx = None
        if not sync and isinstance(module, torch.nn.parallel.DistributedDataParallel):
            self.ctx = module.no_sync()

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def check_ddp_consistency(module, ignore_regex=None):
    for name, tensor in named_params_and_buffers(module):
        fullname = type(module).__name__ + "." + name
        if ignore_regex is not None and re.fullmatch(ignore_regex, fullname):
            continue
        tensor = tensor.detach()
        other = tensor.clone()
        torch.distributed.broadcast(tensor=other, src=0)
        assert (torch.nan_to_num(tensor) == torch.nan_to_num(other)).all(), fullname


def print_module_summary(module, inputs, max_nesting=3, skip_redundant=True):
    entries = []
    nesting = [0]

    def pre_hook(_mod, _inputs):
        nesting[0] += 1

    def post_hook(mod, _inputs, outputs):
        nesting[0] -= 1
        if nesting[0] <= max_nesting:
            outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            outputs = [t for t in outputs if isinstance(t, torch.Tensor)]
            entries.append(EasyDict(mod=mod, outputs=outputs))

    hooks = [mod.register_forward_pre_hook(pre_hook) for mod in module.modules()]
    hooks += [mod.register_forward_hook(post_hook) for mod in module.modules()]
    outputs = module(*inputs)
    for hook in hooks:
        hook.remove()
    tensors_seen = set()
    for e in entries:
        e.unique_params = [t for t in e.mod.parameters() if id(t) not in tensors_seen]
        e.unique_buffers = [t for t in e.mod.buffers() if id(t) not in tensors_seen]
        e.unique_outputs = [t for t in e.outputs if id(t) not in tensors_seen]
        tensors_seen |= {id(t) for t in e.unique_params + e.unique_buffers + e.unique_outputs}
    if skip_redundant:
        entries = [
            e
            for e in entries
            if len(e.unique_params) or len(e.unique_buffers) or len(e.unique_outputs)
        ]
    rows = [[type(module).__name__, "Parameters", "Buffers", "Output shape", "Datatype"]]
    rows += [["---"] * len(rows[0])]
    param_total = 0
    buffer_total = 0
    submodule_names = {mod: name for name, mod in module.named_modules()}
    for e in entries:
        name = "<top-level>" if e.mod is module else submodule_names[e.mod]
        param_size = sum(t.numel() for t in e.unique_params)
        buffer_size = sum(t.numel() for t in e.unique_buffers)
        output_shapes = [str(list(t.shape)) for t in e.outputs]
        output_dtypes = [str(t.dtype).split(".")[-1] for t in e.outputs]
        rows += [
            [
                name + (":0" if len(e.outputs) >= 2 else ""),
                str(param_size) if param_size else "-",
                str(buffer_size) if buffer_size else "-",
                (output_shapes + ["-"])[0],
                (output_dtypes + ["-"])[0],
            ]
        ]
        param_total += param_size
        buffer_total += buffer_size
    rows += [["---"] * len(rows[0])]
    rows += [["Total", str(param_total), str(buffer_total), "-", "-"]]
    widths = [max(len(cell) for cell in column) for column in zip(*rows)]
    print()
    for row in rows:
        print("  ".join(cell + " " * (width - len(cell)) for cell, width in zip(row, widths)))
    print()
    return outputs


# ----------------------------------------------------------------------------
# torch_utils.training_stats: per-name [count, sum, sum of squares], summed over the ranks

_counters = dict()  # name -> float64 tensor [3], accumulated since the last sync
_cumulative = dict()
_report_rank = 0


def report(name, value):
    elems = torch.as_tensor(value).detach().flatten().to(torch.float64)
    moments = torch.stack([torch.ones_like(elems).sum(), elems.sum(), elems.square().sum()])
    if name not in _counters:
        _counters[name] = torch.zeros(3, dtype=torch.float64)
    _counters[name].add_(moments)
    return value


def report0(name, value):
    report(name, value if _report_rank == 0 else [])
    return value


class Collector:
    def __init__(self, regex=".*"):
        self._regex = re.compile(regex)
        self._moments = dict()

    def names(self):
        return [name for name in sorted(_counters) if self._regex.fullmatch(name)]

    def update(self):
        names = self.names()
        if not names:
            return
        deltas = torch.stack([_counters[name].clone() for name in names])
        for name in names:
            _counters[name].zero_()
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(deltas)
        self._moments = {name: deltas[k] for k, name in enumerate(names)}

    def num(self, name):
        m = self._moments.get(name)
        return 0 if m is None else int(m[0])

    def mean(self, name):
        m = self._moments.get(name)
        if m is None or m[0] == 0:
            return float("nan")
        return float(m[1] / m[0])

    def __getitem__(self, name):
        return self.mean(name)

    def as_dict(self):
        return {name: EasyDict(num=self.num(name), mean=self.mean(name)) for name in self._moments}


# ----------------------------------------------------------------------------
# training.dataset: a zip of PNGs (dataset_tool.py's layout)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_chunk(tag, data):
    return (
        struct.pack(">I", len(data))
        + tag
        + data
        + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    )


def encode_png(img):
    h, w, c = img.shape
    color = {1: 0, 3: 2, 4: 6}[c]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))
    return (
        _PNG_SIGNATURE
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
        + _png_chunk(b"IDAT", zlib.compress(raw, 6))
        + _png_chunk(b"IEND", b"")
    )


def decode_png(data):
    """8-bit, non-interlaced PNGs (what dataset_tool.py writes)."""
    if data[:8] != _PNG_SIGNATURE:
        raise ValueError("not a PNG file")
    pos = 8
    idat = []
    width = height = channels = None
    while pos < len(data):
        length, tag = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if tag == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, stride + 1)
    if rows[:, 0].any():
        raise ValueError("unsupported PNG row filter")
    image = rows[:, 1:].reshape(height, width, channels)
    return image[:, :, 0] if channels == 1 else image


class ImageFolderDataset(torch.utils.data.Dataset):
    def __init__(
        self,
        path,
        resolution=None,
        use_labels=False,
        max_size=None,
        xflip=False,
        random_seed=0,
        **kwargs,
    ):
        self._path = path
        self._zipfile = None
        if not (os.path.isfile(self._path) and self._path.endswith(".zip")):
            raise IOError("Path must point to a directory or zip")
        self._all_fnames = set(self._get_zipfile().namelist())
        self._image_fnames = sorted(fname for fname in self._all_fnames if fname.endswith(".png"))
        if len(self._image_fnames) == 0:
            raise IOError("No image files found in the specified path")
        self._name = os.path.splitext(os.path.basename(self._path))[0]
        raw_shape = [len(self._image_fnames)] + list(self._load_raw_image(0).shape)
        if resolution is not None and (raw_shape[2] != resolution or raw_shape[3] != resolution):
            raise IOError("Image files do not match the specified resolution")
        self._raw_shape = list(raw_shape)
        self._use_labels = use_labels
        self._raw_idx = np.arange(self._raw_shape[0], dtype=np.int64)
        if (max_size is not None) and (self._raw_idx.size > max_size):
            np.random.RandomState(random_seed).shuffle(self._raw_idx)
            self._raw_idx = np.sort(self._raw_idx[:max_size])
        self._xflip = np.zeros(self._raw_idx.size, dtype=np.uint8)
        if xflip:
            self._raw_idx = np.tile(self._raw_idx, 2)
            self._xflip = np.concatenate([self._xflip, np.ones_like(self._xflip)])
        self._worker_items = 0
        self._rank = 0

    def _get_zipfile(self):
        if self._zipfile is None:
            self._zipfile = zipfile.ZipFile(self._path)
        return self._zipfile

    def __getstate__(self):
        return dict(self.__dict__, _zipfile=None)

    def _load_raw_image(self, raw_idx):
        fname = self._image_fnames[raw_idx]
        with self._get_zipfile().open(fname, "r") as f:
            image = decode_png(f.read())
        if image.ndim == 2:
            image = image[:, :, np.newaxis]  # HW => HWC
        image = image.transpose(2, 0, 1)  # HWC => CHW
        return image

    def __len__(self):
        return self._raw_idx.size

    def __getitem__(self, idx):
        letter, who = fault()
        if letter == "w" and self._rank == who and torch.utils.data.get_worker_info() is not None:
            self._worker_items += 1
            if self._worker_items == 120:
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer picks the loader worker
        image = self._load_raw_image(self._raw_idx[idx])
        if self._xflip[idx]:
            image = image[:, :, ::-1]
        return image.copy(), self.get_label(idx)

    def get_label(self, idx):
        return np.zeros([0], dtype=np.float32)

    @property
    def name(self):
        return self._name

    @property
    def image_shape(self):
        return list(self._raw_shape[1:])

    @property
    def num_channels(self):
        return self.image_shape[0]

    @property
    def resolution(self):
        return self.image_shape[1]

    @property
    def label_shape(self):
        return [0]

    @property
    def label_dim(self):
        return 0

    @property
    def has_labels(self):
        return False


# ----------------------------------------------------------------------------
# training.networks (tiny)


class FullyConnectedLayer(torch.nn.Module):
    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        activation="linear",
        lr_multiplier=1,
        bias_init=0,
    ):
        super().__init__()
        self.activation = activation
        self.weight = torch.nn.Parameter(torch.randn([out_features, in_features]) / lr_multiplier)
        self.bias = (
            torch.nn.Parameter(torch.full([out_features], float(bias_init))) if bias else None
        )
        self.weight_gain = lr_multiplier / np.sqrt(in_features)
        self.bias_gain = lr_multiplier

    def forward(self, x):
        w = self.weight * self.weight_gain
        b = self.bias
        if b is not None and self.bias_gain != 1:
            b = b * self.bias_gain
        x = x.matmul(w.t())
        return bias_act(x, b, act=self.activation)


class Conv2dLayer(torch.nn.Module):
    def __init__(
        self, in_channels, out_channels, kernel_size, bias=True, activation="linear", up=1, down=1
    ):
        super().__init__()
        self.activation = activation
        self.up = up
        self.down = down
        self.register_buffer("resample_filter", _setup_filter())
        self.padding = kernel_size // 2
        self.weight_gain = 1 / np.sqrt(in_channels * (kernel_size**2))
        self.weight = torch.nn.Parameter(
            torch.randn([out_channels, in_channels, kernel_size, kernel_size])
        )
        self.bias = torch.nn.Parameter(torch.zeros([out_channels])) if bias else None

    def forward(self, x, gain=1):
        w = self.weight * self.weight_gain
        if self.down > 1:
            x = upfirdn2d(x, self.resample_filter, padding=(1, 2, 1, 2))
        x = F.conv2d(x, w, padding=self.padding, stride=self.down)
        act_gain = (np.sqrt(2) if self.activation == "lrelu" else 1) * gain
        return bias_act(x, self.bias, act=self.activation, gain=act_gain)


class MappingNetwork(torch.nn.Module):
    def __init__(
        self, z_dim, c_dim, w_dim, num_ws, num_layers=2, lr_multiplier=0.01, w_avg_beta=0.995
    ):
        super().__init__()
        self.z_dim = z_dim
        self.w_dim = w_dim
        self.num_ws = num_ws
        self.num_layers = num_layers
        self.w_avg_beta = w_avg_beta
        features = [z_dim] + [w_dim] * num_layers
        for idx in range(num_layers):
            layer = FullyConnectedLayer(
                features[idx], features[idx + 1], activation="lrelu", lr_multiplier=lr_multiplier
            )
            setattr(self, f"fc{idx}", layer)
        self.register_buffer("w_avg", torch.zeros([w_dim]))

    def forward(self, z, c, truncation_psi=1, update_emas=False):
        x = z * (z.square().mean(dim=1, keepdim=True) + 1e-8).rsqrt()
        for idx in range(self.num_layers):
            x = getattr(self, f"fc{idx}")(x)
        if update_emas and self.w_avg_beta is not None:
            self.w_avg.copy_(x.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))
        return x.unsqueeze(1).repeat([1, self.num_ws, 1])


def modulated_conv2d(
    x, weight, styles, noise=None, up=1, padding=0, resample_filter=None, demodulate=True
):
    batch_size = x.shape[0]
    out_channels, in_channels, kh, kw = weight.shape
    w = weight.unsqueeze(0) * styles.reshape(batch_size, 1, -1, 1, 1)
    if demodulate:
        dcoefs = (w.square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt()
        w = w * dcoefs.reshape(batch_size, -1, 1, 1, 1)
    if up > 1:
        x = upfirdn2d(x, resample_filter, up=2, padding=(2, 1, 2, 1))
    x = x.reshape(1, -1, *x.shape[2:])
    w = w.reshape(-1, in_channels, kh, kw)
    x = F.conv2d(x, w, padding=padding, groups=batch_size)
    x = x.reshape(batch_size, -1, *x.shape[2:])
    if noise is not None:
        x = x + noise
    return x


class SynthesisLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, w_dim, resolution, kernel_size=3, up=1):
        super().__init__()
        self.resolution = resolution
        self.up = up
        self.padding = kernel_size // 2
        self.register_buffer("resample_filter", _setup_filter())
        self.affine = FullyConnectedLayer(w_dim, in_channels, bias_init=1)
        self.weight = torch.nn.Parameter(
            torch.randn([out_channels, in_channels, kernel_size, kernel_size])
        )
        self.register_buffer("noise_const", torch.randn([resolution, resolution]))
        self.noise_strength = torch.nn.Parameter(torch.zeros([]))
        self.bias = torch.nn.Parameter(torch.zeros([out_channels]))

    def forward(self, x, w, noise_mode="random"):
        styles = self.affine(w)
        if noise_mode == "random":
            noise = (
                torch.randn([x.shape[0], 1, self.resolution, self.resolution]) * self.noise_strength
            )
        else:
            noise = self.noise_const * self.noise_strength
        x = modulated_conv2d(
            x,
            self.weight,
            styles,
            noise=noise,
            up=self.up,
            padding=self.padding,
            resample_filter=self.resample_filter,
        )
        return bias_act(x, self.bias, act="lrelu", clamp=256)


class ToRGBLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, w_dim):
        super().__init__()
        self.affine = FullyConnectedLayer(w_dim, in_channels, bias_init=1)
        self.weight = torch.nn.Parameter(torch.randn([out_channels, in_channels, 1, 1]))
        self.bias = torch.nn.Parameter(torch.zeros([out_channels]))
        self.weight_gain = 1 / np.sqrt(in_channels)

    def forward(self, x, w):
        styles = self.affine(w) * self.weight_gain
        x = modulated_conv2d(x, self.weight, styles, demodulate=False)
        return bias_act(x, self.bias, clamp=256)


class SynthesisBlock(torch.nn.Module):
    def __init__(self, in_channels, out_channels, w_dim, resolution, img_channels):
        super().__init__()
        self.in_channels = in_channels
        self.resolution = resolution
        self.register_buffer("resample_filter", _setup_filter())
        if in_channels == 0:
            self.const = torch.nn.Parameter(torch.randn([out_channels, resolution, resolution]))
        else:
            self.conv0 = SynthesisLayer(in_channels, out_channels, w_dim, resolution, up=2)
        self.conv1 = SynthesisLayer(out_channels, out_channels, w_dim, resolution)
        self.torgb = ToRGBLayer(out_channels, img_channels, w_dim)
        self.num_conv = 1 if in_channels == 0 else 2

    def forward(self, x, img, ws, noise_mode="random"):
        w_iter = iter(ws.unbind(dim=1))
        if self.in_channels == 0:
            x = self.const.unsqueeze(0).repeat([ws.shape[0], 1, 1, 1])
        else:
            x = self.conv0(x, next(w_iter), noise_mode=noise_mode)
        x = self.conv1(x, next(w_iter), noise_mode=noise_mode)
        if img is not None:
            img = upfirdn2d(img, self.resample_filter, up=2, padding=(2, 1, 2, 1))
        y = self.torgb(x, next(w_iter))
        img = img.add_(y) if img is not None else y
        return x, img


def _channels(res, channel_base, channel_max):
    return min(channel_base // res, channel_max)


class SynthesisNetwork(torch.nn.Module):
    def __init__(self, w_dim, img_resolution, img_channels, channel_base=256, channel_max=32):
        super().__init__()
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.block_resolutions = [2**i for i in range(2, int(np.log2(img_resolution)) + 1)]
        self.num_ws = 0
        for res in self.block_resolutions:
            in_channels = _channels(res // 2, channel_base, channel_max) if res > 4 else 0
            out_channels = _channels(res, channel_base, channel_max)
            block = SynthesisBlock(in_channels, out_channels, w_dim, res, img_channels)
            self.num_ws += block.num_conv + 1
            setattr(self, f"b{res}", block)

    def forward(self, ws, noise_mode="random"):
        x = img = None
        w_idx = 0
        for res in self.block_resolutions:
            block = getattr(self, f"b{res}")
            x, img = block(x, img, ws[:, w_idx : w_idx + block.num_conv + 1], noise_mode=noise_mode)
            w_idx += block.num_conv
        return img


class Generator(torch.nn.Module):
    def __init__(
        self,
        z_dim,
        c_dim,
        w_dim,
        img_resolution,
        img_channels,
        mapping_kwargs={},
        synthesis_kwargs={},
    ):
        super().__init__()
        self.init_kwargs = dict(
            z_dim=z_dim,
            c_dim=c_dim,
            w_dim=w_dim,
            img_resolution=img_resolution,
            img_channels=img_channels,
            mapping_kwargs=dict(mapping_kwargs),
            synthesis_kwargs=dict(synthesis_kwargs),
        )
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.synthesis = SynthesisNetwork(
            w_dim=w_dim,
            img_resolution=img_resolution,
            img_channels=img_channels,
            **synthesis_kwargs,
        )
        self.num_ws = self.synthesis.num_ws
        self.mapping = MappingNetwork(
            z_dim=z_dim, c_dim=c_dim, w_dim=w_dim, num_ws=self.num_ws, **mapping_kwargs
        )

    def forward(self, z, c, noise_mode="random"):
        ws = self.mapping(z, c)
        return self.synthesis(ws, noise_mode=noise_mode)


class DiscriminatorBlock(torch.nn.Module):
    def __init__(self, in_channels, tmp_channels, out_channels, resolution, img_channels):
        super().__init__()
        self.in_channels = in_channels
        if in_channels == 0:
            self.fromrgb = Conv2dLayer(
                img_channels, tmp_channels, kernel_size=1, activation="lrelu"
            )
        self.conv0 = Conv2dLayer(tmp_channels, tmp_channels, kernel_size=3, activation="lrelu")
        self.conv1 = Conv2dLayer(
            tmp_channels, out_channels, kernel_size=3, activation="lrelu", down=2
        )
        self.skip = Conv2dLayer(tmp_channels, out_channels, kernel_size=1, bias=False, down=2)

    def forward(self, x, img):
        if self.in_channels == 0:
            x = self.fromrgb(img)
        y = self.skip(x, gain=np.sqrt(0.5))
        x = self.conv0(x)
        x = self.conv1(x, gain=np.sqrt(0.5))
        return y.add_(x)


class MinibatchStdLayer(torch.nn.Module):
    def __init__(self, group_size, num_channels=1):
        super().__init__()
        self.group_size = group_size
        self.num_channels = num_channels

    def forward(self, x):
        N, C, H, W = x.shape
        G = min(self.group_size, N)
        F_ = self.num_channels
        c = C // F_
        y = x.reshape(G, -1, F_, c, H, W)
        y = y - y.mean(dim=0)
        y = y.square().mean(dim=0)
        y = (y + 1e-8).sqrt()
        y = y.mean(dim=[2, 3, 4])
        y = y.reshape(-1, F_, 1, 1)
        y = y.repeat(G, 1, H, W)
        return torch.cat([x, y], dim=1)


class DiscriminatorEpilogue(torch.nn.Module):
    def __init__(self, in_channels, resolution, mbstd_group_size=4):
        super().__init__()
        self.mbstd = MinibatchStdLayer(group_size=mbstd_group_size)
        self.conv = Conv2dLayer(in_channels + 1, in_channels, kernel_size=3, activation="lrelu")
        self.fc = FullyConnectedLayer(
            in_channels * (resolution**2), in_channels, activation="lrelu"
        )
        self.out = FullyConnectedLayer(in_channels, 1)

    def forward(self, x):
        x = self.mbstd(x)
        x = self.conv(x)
        x = self.fc(x.flatten(1))
        return self.out(x)


class Discriminator(torch.nn.Module):
    def __init__(
        self,
        c_dim,
        img_resolution,
        img_channels,
        channel_base=256,
        channel_max=32,
        epilogue_kwargs={},
    ):
        super().__init__()
        self.init_kwargs = dict(
            c_dim=c_dim,
            img_resolution=img_resolution,
            img_channels=img_channels,
            channel_base=channel_base,
            channel_max=channel_max,
            epilogue_kwargs=dict(epilogue_kwargs),
        )
        self.img_resolution = img_resolution
        self.block_resolutions = [2**i for i in range(int(np.log2(img_resolution)), 2, -1)]
        for res in self.block_resolutions:
            in_channels = _channels(res, channel_base, channel_max) if res < img_resolution else 0
            tmp_channels = _channels(res, channel_base, channel_max)
            out_channels = _channels(res // 2, channel_base, channel_max)
            setattr(
                self,
                f"b{res}",
                DiscriminatorBlock(in_channels, tmp_channels, out_channels, res, img_channels),
            )
        self.b4 = DiscriminatorEpilogue(
            _channels(4, channel_base, channel_max), resolution=4, **epilogue_kwargs
        )

    def forward(self, img, c):
        x = None
        for res in self.block_resolutions:
            x = getattr(self, f"b{res}")(x, img)
        return self.b4(x)


# ----------------------------------------------------------------------------
# training.augment (xflip, integer translation, brightness, contrast; each with probability p)


class AugmentPipe(torch.nn.Module):
    def __init__(
        self,
        xflip=0,
        xint=0,
        brightness=0,
        contrast=0,
        xint_max=0.125,
        brightness_std=0.2,
        contrast_std=0.5,
    ):
        super().__init__()
        self.register_buffer("p", torch.ones([]))
        self.xflip = float(xflip)
        self.xint = float(xint)
        self.brightness = float(brightness)
        self.contrast = float(contrast)
        self.xint_max = xint_max
        self.brightness_std = brightness_std
        self.contrast_std = contrast_std

    def forward(self, images):
        batch_size, num_channels, height, width = images.shape
        if self.xflip > 0:
            i = torch.floor(torch.rand([batch_size, 1, 1, 1]) * 2)
            i = torch.where(
                torch.rand([batch_size, 1, 1, 1]) < self.xflip * self.p, i, torch.zeros_like(i)
            )
            images = torch.where(i > 0, images.flip(3), images)
        if self.xint > 0:
            t = (torch.rand([batch_size, 2]) * 2 - 1) * self.xint_max
            t = torch.where(
                torch.rand([batch_size, 1]) < self.xint * self.p, t, torch.zeros_like(t)
            )
            shift = torch.round(t * height).to(torch.int64)
            images = torch.stack(
                [
                    torch.roll(img, shifts=(int(s[1]), int(s[0])), dims=(1, 2))
                    for img, s in zip(images, shift)
                ]
            )
        if self.brightness > 0:
            b = torch.randn([batch_size, 1, 1, 1]) * self.brightness_std
            b = torch.where(
                torch.rand([batch_size, 1, 1, 1]) < self.brightness * self.p, b, torch.zeros_like(b)
            )
            images = images + b
        if self.contrast > 0:
            c = torch.exp2(torch.randn([batch_size, 1, 1, 1]) * self.contrast_std)
            c = torch.where(
                torch.rand([batch_size, 1, 1, 1]) < self.contrast * self.p, c, torch.ones_like(c)
            )
            images = (images - images.mean(dim=[1, 2, 3], keepdim=True)) * c + images.mean(
                dim=[1, 2, 3], keepdim=True
            )
        return images


# ----------------------------------------------------------------------------
# training.loss


class StyleGAN2Loss:
    def __init__(self, device, G_mapping, G_synthesis, D, augment_pipe=None, r1_gamma=10):
        self.device = device
        self.G_mapping = G_mapping
        self.G_synthesis = G_synthesis
        self.D = D
        self.augment_pipe = augment_pipe
        self.r1_gamma = r1_gamma

    def run_G(self, z, c, sync):
        with ddp_sync(self.G_mapping, sync):
            ws = self.G_mapping(z, c, update_emas=True)
        with ddp_sync(self.G_synthesis, sync):
            img = self.G_synthesis(ws)
        return img, ws

    def run_D(self, img, c, sync):
        if self.augment_pipe is not None:
            img = self.augment_pipe(img)
        with ddp_sync(self.D, sync):
            logits = self.D(img, c)
        return logits

    def accumulate_gradients(self, phase, real_img, real_c, gen_z, gen_c, sync, gain):
        assert phase in ["Gboth", "Dboth"]
        if phase == "Gboth":
            gen_img, _gen_ws = self.run_G(gen_z, gen_c, sync=sync)
            gen_logits = self.run_D(gen_img, gen_c, sync=False)
            report("Loss/scores/fake", gen_logits)
            report("Loss/signs/fake", gen_logits.sign())
            loss_Gmain = F.softplus(-gen_logits)
            report("Loss/G/loss", loss_Gmain)
            loss_Gmain.mean().mul(gain).backward()
        if phase == "Dboth":
            gen_img, _gen_ws = self.run_G(gen_z, gen_c, sync=False)
            gen_logits = self.run_D(gen_img, gen_c, sync=False)
            loss_Dgen = F.softplus(gen_logits)
            loss_Dgen.mean().mul(gain).backward()
            real_img_tmp = real_img.detach().requires_grad_(True)
            real_logits = self.run_D(real_img_tmp, real_c, sync=sync)
            report("Loss/scores/real", real_logits)
            report("Loss/signs/real", real_logits.sign())
            loss_Dreal = F.softplus(-real_logits)
            report("Loss/D/loss", loss_Dgen + loss_Dreal)
            r1_grads = torch.autograd.grad(
                outputs=[real_logits.sum()],
                inputs=[real_img_tmp],
                create_graph=True,
                only_inputs=True,
            )[0]
            r1_penalty = r1_grads.square().sum([1, 2, 3])
            loss_Dr1 = r1_penalty * (self.r1_gamma / 2)
            report("Loss/r1_penalty", r1_penalty)
            report("Loss/D/reg", loss_Dr1)
            (real_logits * 0 + loss_Dreal + loss_Dr1).mean().mul(gain).backward()


# ----------------------------------------------------------------------------
# network pickles (torch_utils.persistence's way: the class, its init kwargs and its state)


def _persist(module):
    if module is None:
        return None
    return dict(
        persistent_class=type(module).__name__,
        init_kwargs=copy.deepcopy(getattr(module, "init_kwargs", {})),
        state=module.state_dict(),
    )


def _restore(data):
    if data is None:
        return None
    module = globals()[data["persistent_class"]](**data["init_kwargs"])
    module.load_state_dict(data["state"])
    return module.eval().requires_grad_(False)


def load_network_pkl(f):
    data = pickle.load(f)
    return {
        name: (
            _restore(value) if isinstance(value, dict) and "persistent_class" in value else value
        )
        for name, value in data.items()
    }


# ----------------------------------------------------------------------------
# training.training_loop


def setup_snapshot_image_grid(training_set, random_seed=0):
    rnd = np.random.RandomState(random_seed)
    gw = np.clip(7680 // training_set.image_shape[2], 7, 32)
    gh = np.clip(4320 // training_set.image_shape[1], 4, 32)
    all_indices = list(range(len(training_set)))
    rnd.shuffle(all_indices)
    grid_indices = [all_indices[i % len(all_indices)] for i in range(gw * gh)]
    images, labels = zip(*[training_set[i] for i in grid_indices])
    return (gw, gh), np.stack(images), np.stack(labels)


def save_image_grid(img, fname, drange, grid_size):
    lo, hi = drange
    img = np.asarray(img, dtype=np.float32)
    img = (img - lo) * (255 / (hi - lo))
    img = np.rint(img).clip(0, 255).astype(np.uint8)
    gw, gh = grid_size
    _N, C, H, W = img.shape
    img = img.reshape(gh, gw, C, H, W)
    img = img.transpose(0, 3, 1, 4, 2)
    img = img.reshape(gh * H, gw * W, C)
    assert C in [1, 3]
    with open(fname, "wb") as f:
        f.write(encode_png(img))


def training_loop(
    run_dir=".",
    training_set_kwargs={},
    data_loader_kwargs={},
    G_kwargs={},
    D_kwargs={},
    G_opt_kwargs={},
    D_opt_kwargs={},
    augment_kwargs=None,
    loss_kwargs={},
    metrics=[],
    random_seed=0,
    num_gpus=1,
    rank=0,
    batch_size=4,
    batch_gpu=4,
    ema_kimg=10,
    ema_rampup=None,
    augment_p=0,
    ada_target=None,
    ada_interval=4,
    ada_kimg=500,
    total_kimg=25000,
    kimg_per_tick=4,
    image_snapshot_ticks=50,
    network_snapshot_ticks=50,
    resume_pkl=None,
    **_unused,
):
    start_time = time.time()
    device = torch.device("cpu")
    np.random.seed(random_seed * num_gpus + rank)
    torch.manual_seed(random_seed * num_gpus + rank)
    letter, who = fault()

    # Load training set.
    if rank == 0:
        print("Loading training set...")
    training_set = construct_class_by_name(**training_set_kwargs)
    training_set._rank = rank
    training_set_sampler = InfiniteSampler(
        dataset=training_set, rank=rank, num_replicas=num_gpus, seed=random_seed
    )
    training_set_iterator = iter(
        torch.utils.data.DataLoader(
            dataset=training_set,
            sampler=training_set_sampler,
            batch_size=batch_size // num_gpus,
            **data_loader_kwargs,
        )
    )
    if rank == 0:
        print()
        print("Num images: ", len(training_set))
        print("Image shape:", training_set.image_shape)
        print("Label shape:", training_set.label_shape)
        print()

    # Construct networks.
    if rank == 0:
        print("Constructing networks...")
    common_kwargs = dict(
        c_dim=training_set.label_dim,
        img_resolution=training_set.resolution,
        img_channels=training_set.num_channels,
    )
    G = Generator(**G_kwargs, **common_kwargs).train().requires_grad_(False).to(device)
    D = Discriminator(**D_kwargs, **common_kwargs).train().requires_grad_(False).to(device)
    G_ema = copy.deepcopy(G).eval()

    # Resume from existing pickle.
    cur_nimg = 0
    batch_idx = 0
    if (resume_pkl is not None) and (rank == 0):
        print(f'Resuming from "{resume_pkl}"')
        with open_url(resume_pkl) as f:
            resume_data = load_network_pkl(f)
        for name, module in [("G", G), ("D", D), ("G_ema", G_ema)]:
            copy_params_and_buffers(resume_data[name], module, require_all=False)

        # resume from a snapshot file(`network-snapshot-<INT>.pkl`) continues from
        # where it stopped..
        match = re.match(r"^.*(network-snapshot-)(\d+)(.pkl)$", resume_pkl, re.IGNORECASE)
        if match:
            cur_nimg = int(match.group(2)) * 1000
            batch_idx = cur_nimg // batch_size  # keep the ADA schedule where it was

    # Print network summary tables.
    if rank == 0:
        z = torch.empty([batch_gpu, G.z_dim], device=device)
        c = torch.empty([batch_gpu, G.c_dim], device=device)
        img = print_module_summary(G, [z, c])
        print_module_summary(D, [img, c])

    # Setup augmentation.
    if rank == 0:
        print("Setting up augmentation...")
    augment_pipe = None
    ada_stats = None
    if (augment_kwargs is not None) and (augment_p > 0 or ada_target is not None):
        augment_pipe = (
            construct_class_by_name(**augment_kwargs).train().requires_grad_(False).to(device)
        )
        augment_pipe.p.copy_(torch.as_tensor(augment_p))
        if ada_target is not None:
            ada_stats = Collector(regex="Loss/signs/real")

    # Distribute across GPUs.
    if rank == 0:
        print(f"Distributing across {num_gpus} GPUs...")
    ddp_modules = dict()
    for name, module in [
        ("G_mapping", G.mapping),
        ("G_synthesis", G.synthesis),
        ("D", D),
        (None, G_ema),
        ("augment_pipe", augment_pipe),
    ]:
        if (num_gpus > 1) and (module is not None) and len(list(module.parameters())) != 0:
            module.requires_grad_(True)
            if letter == "b":  # the original line, from before torch 2.13 renamed the flag
                module = torch.nn.parallel.DistributedDataParallel(module, broadcast_buffers=False)
            else:
                module = torch.nn.parallel.DistributedDataParallel(
                    module, forward_sync_buffers=False
                )
            module.requires_grad_(False)
        if name is not None:
            ddp_modules[name] = module

    # Setup training phases.
    if rank == 0:
        print("Setting up training phases...")
    loss = construct_class_by_name(device=device, **ddp_modules, **loss_kwargs)
    phases = []
    for name, module, opt_kwargs in [("G", G, G_opt_kwargs), ("D", D, D_opt_kwargs)]:
        opt = getattr(torch.optim, opt_kwargs["class_name"].split(".")[-1])(
            module.parameters(),
            lr=opt_kwargs["lr"],
            betas=opt_kwargs["betas"],
            eps=opt_kwargs["eps"],
        )
        phases += [EasyDict(name=name + "both", module=module, opt=opt, interval=1)]

    # Export sample images.
    grid_size = None
    grid_z = None
    grid_c = None
    if rank == 0:
        print("Exporting sample images...")
        grid_size, images, labels = setup_snapshot_image_grid(training_set=training_set)
        save_image_grid(
            images, os.path.join(run_dir, "reals.png"), drange=[0, 255], grid_size=grid_size
        )
        grid_z = torch.randn([labels.shape[0], G.z_dim], device=device).split(batch_gpu)
        grid_c = torch.from_numpy(labels).to(device).split(batch_gpu)
        with torch.no_grad():
            images = torch.cat(
                [G_ema(z=z, c=c, noise_mode="const").cpu() for z, c in zip(grid_z, grid_c)]
            ).numpy()
        save_image_grid(
            images, os.path.join(run_dir, "fakes_init.png"), drange=[-1, 1], grid_size=grid_size
        )

    # Initialize logs.
    if rank == 0:
        print("Initializing logs...")
    stats_collector = Collector(regex=".*")
    stats_jsonl = None
    if rank == 0:
        stats_jsonl = open(os.path.join(run_dir, "stats.jsonl"), "wt")
        try:
            import torch.utils.tensorboard as tensorboard  # noqa: F401
        except ImportError as err:
            print("Skipping tfevents export:", err)

    # Train.
    if rank == 0:
        print(f"Training for {total_kimg} kimg...")
        print()
    cur_tick = 0
    tick_start_nimg = cur_nimg
    tick_start_time = time.time()
    maintenance_time = tick_start_time - start_time
    hoard = []
    while True:
        # Fetch training data.
        phase_real_img, phase_real_c = next(training_set_iterator)
        phase_real_img = (phase_real_img.to(device).to(torch.float32) / 127.5 - 1).split(batch_gpu)
        phase_real_c = phase_real_c.to(device).split(batch_gpu)
        all_gen_z = torch.randn([len(phases) * batch_size, G.z_dim], device=device)
        all_gen_z = [phase_gen_z.split(batch_gpu) for phase_gen_z in all_gen_z.split(batch_size)]
        all_gen_c = [
            training_set.get_label(np.random.randint(len(training_set)))
            for _ in range(len(phases) * batch_size)
        ]
        all_gen_c = torch.from_numpy(np.stack(all_gen_c)).to(device)
        all_gen_c = [phase_gen_c.split(batch_gpu) for phase_gen_c in all_gen_c.split(batch_size)]

        if letter == "m" and rank == who and cur_tick >= 1:
            hoard.append(torch.ones(16 << 20))  # 64 MiB a step
            if len(hoard) >= 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        _fault_armed[0] = cur_tick >= 1

        # Execute training phases.
        for phase, phase_gen_z, phase_gen_c in zip(phases, all_gen_z, all_gen_c):
            if batch_idx % phase.interval != 0:
                continue
            phase.opt.zero_grad(set_to_none=True)
            phase.module.requires_grad_(True)
            for round_idx, (real_img, real_c, gen_z, gen_c) in enumerate(
                zip(phase_real_img, phase_real_c, phase_gen_z, phase_gen_c)
            ):
                sync = round_idx == batch_size // (batch_gpu * num_gpus) - 1
                gain = phase.interval
                loss.accumulate_gradients(
                    phase=phase.name,
                    real_img=real_img,
                    real_c=real_c,
                    gen_z=gen_z,
                    gen_c=gen_c,
                    sync=sync,
                    gain=gain,
                )
            phase.module.requires_grad_(False)
            for param in phase.module.parameters():
                if param.grad is not None:
                    torch.nan_to_num(param.grad, nan=0, posinf=1e5, neginf=-1e5, out=param.grad)
            phase.opt.step()

        # Update G_ema.
        ema_nimg = ema_kimg * 1000
        if ema_rampup is not None:
            ema_nimg = min(ema_nimg, cur_nimg * ema_rampup)
        ema_beta = 0.5 ** (batch_size / max(ema_nimg, 1e-8))
        with torch.no_grad():
            for p_ema, p in zip(G_ema.parameters(), G.parameters()):
                p_ema.copy_(p.lerp(p_ema, ema_beta))
            for b_ema, b in zip(G_ema.buffers(), G.buffers()):
                b_ema.copy_(b)

        # Update state.
        cur_nimg += batch_size
        batch_idx += 1

        # Execute ADA heuristic.
        if (ada_stats is not None) and (batch_idx % ada_interval == 0):
            ada_stats.update()
            adjust = (
                np.sign(ada_stats["Loss/signs/real"] - ada_target)
                * (batch_size * ada_interval)
                / (ada_kimg * 1000)
            )
            augment_pipe.p.copy_((augment_pipe.p + adjust).max(torch.zeros([])))

        # Perform maintenance tasks once per tick.
        done = cur_nimg >= total_kimg * 1000
        if (not done) and (cur_tick != 0) and (cur_nimg < tick_start_nimg + kimg_per_tick * 1000):
            continue

        # Print status line, accumulating the same information in stats_collector.
        tick_end_time = time.time()
        fields = []
        fields += [f"tick {report0('Progress/tick', cur_tick):<5d}"]
        fields += [f"kimg {report0('Progress/kimg', cur_nimg / 1e3):<8.1f}"]
        fields += [
            f"time {format_time(report0('Timing/total_sec', tick_end_time - start_time)):<12s}"
        ]
        fields += [
            f"sec/tick {report0('Timing/sec_per_tick', tick_end_time - tick_start_time):<7.1f}"
        ]
        fields += [
            f"sec/kimg {report0('Timing/sec_per_kimg', (tick_end_time - tick_start_time) / (cur_nimg - tick_start_nimg) * 1e3):<7.2f}"
        ]
        fields += [f"maintenance {report0('Timing/maintenance_sec', maintenance_time):<6.1f}"]
        fields += [
            f"cpumem {report0('Resources/cpu_mem_gb', psutil.Process(os.getpid()).memory_info().rss / 2**30):<6.2f}"
        ]
        fields += [f"gpumem {report0('Resources/peak_gpu_mem_gb', 0.0):<6.2f}"]
        fields += [
            f"augment {report0('Progress/augment', float(augment_pipe.p.cpu()) if augment_pipe is not None else 0):.3f}"
        ]
        if rank == 0:
            print(" ".join(fields))

        # Save image snapshot.
        if (
            (rank == 0)
            and (image_snapshot_ticks is not None)
            and (done or cur_tick % image_snapshot_ticks == 0)
        ):
            with torch.no_grad():
                images = torch.cat(
                    [G_ema(z=z, c=c, noise_mode="const").cpu() for z, c in zip(grid_z, grid_c)]
                ).numpy()
            save_image_grid(
                images,
                os.path.join(run_dir, f"fakes{cur_nimg // 1000:06d}.png"),
                drange=[-1, 1],
                grid_size=grid_size,
            )

        # Save network snapshot.
        snapshot_pkl = None
        snapshot_data = None
        if (network_snapshot_ticks is not None) and (
            done or cur_tick % network_snapshot_ticks == 0
        ):
            snapshot_data = dict(training_set_kwargs=dict(training_set_kwargs))
            for name, module in [
                ("G", G),
                ("D", D),
                ("G_ema", G_ema),
                ("augment_pipe", augment_pipe),
            ]:
                if module is not None:
                    if num_gpus > 1:
                        check_ddp_consistency(module, ignore_regex=r".*\.w_avg")
                    module = copy.deepcopy(module).eval().requires_grad_(False).cpu()
                snapshot_data[name] = _persist(module)
                del module
            snapshot_pkl = os.path.join(run_dir, f"network-snapshot-{cur_nimg // 1000:06d}.pkl")
            if rank == 0:
                with open(snapshot_pkl, "wb") as f:
                    pickle.dump(snapshot_data, f)
        del snapshot_data

        # Collect statistics.
        stats_collector.update()
        stats_dict = stats_collector.as_dict()

        # Update logs.
        timestamp = time.time()
        if stats_jsonl is not None:
            fields = dict(stats_dict, timestamp=timestamp)
            stats_jsonl.write(json.dumps(fields) + "\n")
            stats_jsonl.flush()

        # Update state.
        cur_tick += 1
        tick_start_nimg = cur_nimg
        tick_start_time = time.time()
        maintenance_time = tick_start_time - tick_end_time
        if done:
            break

    # Done.
    if rank == 0:
        print()
        print("Exiting...")


# ----------------------------------------------------------------------------
# train.py


class UserError(Exception):
    pass


def setup_training_loop_kwargs(
    gpus=None,
    snap=None,
    metrics=None,
    seed=None,
    data=None,
    mirror=None,
    cfg=None,
    gamma=None,
    kimg=None,
    batch=None,
    aug=None,
    p=None,
    target=None,
    resume=None,
    workers=None,
):
    args = EasyDict()

    if gpus is None:
        gpus = 1
    assert isinstance(gpus, int)
    if not (gpus >= 1 and gpus & (gpus - 1) == 0):
        raise UserError("--gpus must be a power of two")
    args.num_gpus = gpus

    if snap is None:
        snap = 50
    assert isinstance(snap, int)
    if snap < 1:
        raise UserError("--snap must be at least 1")
    args.image_snapshot_ticks = snap
    args.network_snapshot_ticks = snap

    if metrics is None:
        metrics = ["fid50k_full"]
    assert isinstance(metrics, list)
    if len(metrics):
        raise UserError(
            "\n".join(
                [
                    "--metrics can only contain the following values:",
                    "none (this port computes no metrics)",
                ]
            )
        )
    args.metrics = metrics

    if seed is None:
        seed = 0
    args.random_seed = seed

    assert data is not None
    args.training_set_kwargs = EasyDict(
        class_name="training.dataset.ImageFolderDataset",
        path=data,
        use_labels=True,
        max_size=None,
        xflip=False,
    )
    args.data_loader_kwargs = EasyDict(
        pin_memory=torch.cuda.is_available(), num_workers=3, prefetch_factor=2
    )
    try:
        training_set = construct_class_by_name(**args.training_set_kwargs)
        args.training_set_kwargs.resolution = training_set.resolution
        args.training_set_kwargs.use_labels = training_set.has_labels
        args.training_set_kwargs.max_size = len(training_set)
        desc = training_set.name
        del training_set
    except IOError as err:
        raise UserError(f"--data: {err}")
    args.training_set_kwargs.use_labels = False

    if mirror is None:
        mirror = False
    if mirror:
        desc += "-mirror"
        args.training_set_kwargs.xflip = True

    if cfg is None:
        cfg = "auto"
    desc += f"-{cfg}"
    cfg_specs = {
        "auto": dict(
            ref_gpus=-1,
            kimg=25000,
            mb=-1,
            mbstd=-1,
            fmaps=-1,
            lrate=-1,
            gamma=-1,
            ema=-1,
            ramp=0.05,
            map=2,
        ),
        "stylegan2": dict(
            ref_gpus=8,
            kimg=25000,
            mb=32,
            mbstd=4,
            fmaps=1,
            lrate=0.002,
            gamma=10,
            ema=10,
            ramp=None,
            map=8,
        ),
    }
    assert cfg in cfg_specs
    spec = EasyDict(cfg_specs[cfg])
    if cfg == "auto":
        desc += f"{gpus:d}"
        spec.ref_gpus = gpus
        res = args.training_set_kwargs.resolution
        spec.mb = max(min(gpus * min(4096 // res, 32), 64), gpus)
        spec.mbstd = min(spec.mb // gpus, 4)
        spec.fmaps = 1 if res >= 64 else 0.5
        spec.lrate = 0.002 if res >= 1024 else 0.0025
        spec.gamma = 0.0002 * (res**2) / spec.mb
        spec.ema = spec.mb * 10 / 32

    args.G_kwargs = EasyDict(
        z_dim=32, w_dim=32, mapping_kwargs=EasyDict(), synthesis_kwargs=EasyDict()
    )
    args.D_kwargs = EasyDict(epilogue_kwargs=EasyDict())
    args.G_kwargs.synthesis_kwargs.channel_base = args.D_kwargs.channel_base = int(spec.fmaps * 512)
    args.G_kwargs.synthesis_kwargs.channel_max = args.D_kwargs.channel_max = 32
    args.G_kwargs.mapping_kwargs.num_layers = spec.map
    args.D_kwargs.epilogue_kwargs.mbstd_group_size = spec.mbstd
    args.G_opt_kwargs = EasyDict(
        class_name="torch.optim.Adam", lr=spec.lrate, betas=[0.0, 0.99], eps=1e-8
    )
    args.D_opt_kwargs = EasyDict(
        class_name="torch.optim.Adam", lr=spec.lrate, betas=[0.0, 0.99], eps=1e-8
    )
    args.loss_kwargs = EasyDict(class_name="training.loss.StyleGAN2Loss", r1_gamma=spec.gamma)
    args.total_kimg = spec.kimg
    args.batch_size = spec.mb
    args.batch_gpu = spec.mb // spec.ref_gpus
    args.ema_kimg = spec.ema
    args.ema_rampup = spec.ramp

    if gamma is not None:
        if not gamma >= 0:
            raise UserError("--gamma must be non-negative")
        desc += f"-gamma{gamma:g}"
        args.loss_kwargs.r1_gamma = gamma

    if kimg is not None:
        if not kimg >= 1:
            raise UserError("--kimg must be at least 1")
        desc += f"-kimg{kimg:d}"
        args.total_kimg = kimg

    if batch is not None:
        if not (batch >= 1 and batch % gpus == 0):
            raise UserError("--batch must be at least 1 and divisible by --gpus")
        desc += f"-batch{batch}"
        args.batch_size = batch
        args.batch_gpu = batch // gpus

    if aug is None:
        aug = "ada"
    else:
        desc += f"-{aug}"
    if aug == "ada":
        args.ada_target = 0.6
    elif aug == "noaug":
        pass
    elif aug == "fixed":
        if p is None:
            raise UserError(f"--aug={aug} requires specifying --p")
    if p is not None:
        if not 0 <= p <= 1:
            raise UserError("--p must be between 0 and 1")
        desc += f"-p{p:g}"
        args.augment_p = p
    if target is not None:
        if aug != "ada":
            raise UserError("--target can only be specified with --aug=ada")
        desc += f"-target{target:g}"
        args.ada_target = target
    if aug != "noaug":
        args.augment_kwargs = EasyDict(
            class_name="training.augment.AugmentPipe", xflip=1, xint=1, brightness=1, contrast=1
        )

    if resume is None:
        resume = "noresume"
    elif resume == "noresume":
        desc += "-noresume"
    else:
        desc += "-resumecustom"
        args.resume_pkl = resume
    if resume != "noresume":
        args.ada_kimg = 100  # make ADA react faster at the beginning
        args.ema_rampup = None  # disable EMA rampup

    if workers is not None:
        if not workers >= 1:
            raise UserError("--workers must be at least 1")
        args.data_loader_kwargs.num_workers = workers

    return desc, args


def subprocess_fn(rank, args, temp_dir):
    global verbosity, _rank, _report_rank
    Logger(file_name=os.path.join(args.run_dir, "log.txt"), file_mode="a", should_flush=True)

    # Init torch.distributed.
    if args.num_gpus > 1:
        torch.distributed.init_process_group(
            backend="gloo",
            init_method="env://",
            rank=rank,
            world_size=args.num_gpus,
            timeout=DIST_TIMEOUT,
        )

    # Init torch_utils.
    _rank = _report_rank = rank
    if rank != 0:
        verbosity = "none"

    # Execute training loop.
    training_loop(rank=rank, **args)


class CommaSeparatedList(click.ParamType):
    name = "list"

    def convert(self, value, param, ctx):
        _ = param, ctx
        if value is None or value.lower() == "none" or value == "":
            return []
        return value.split(",")


@click.command()
@click.pass_context
@click.option("--outdir", help="Where to save the results", required=True, metavar="DIR")
@click.option("--gpus", help="Number of GPUs to use [default: 1]", type=int, metavar="INT")
@click.option("--snap", help="Snapshot interval [default: 50 ticks]", type=int, metavar="INT")
@click.option(
    "--metrics",
    help='Comma-separated list or "none" [default: fid50k_full]',
    type=CommaSeparatedList(),
)
@click.option("--seed", help="Random seed [default: 0]", type=int, metavar="INT")
@click.option("-n", "--dry-run", help="Print training options and exit", is_flag=True)
@click.option("--data", help="Training data (directory or zip)", metavar="PATH", required=True)
@click.option("--mirror", help="Enable dataset x-flips [default: false]", type=bool, metavar="BOOL")
@click.option("--cfg", help="Base config [default: auto]", type=click.Choice(["auto", "stylegan2"]))
@click.option("--gamma", help="Override R1 gamma", type=float)
@click.option("--kimg", help="Override training duration", type=int, metavar="INT")
@click.option("--batch", help="Override batch size", type=int, metavar="INT")
@click.option(
    "--aug", help="Augmentation mode [default: ada]", type=click.Choice(["noaug", "ada", "fixed"])
)
@click.option("--p", help="Augmentation probability for --aug=fixed", type=float)
@click.option("--target", help="ADA target value for --aug=ada", type=float)
@click.option("--resume", help="Resume training [default: noresume]", metavar="PKL")
@click.option("--workers", help="Override number of DataLoader workers", type=int, metavar="INT")
def main(ctx, outdir, dry_run, **config_kwargs):
    """Train a GAN using the techniques described in the paper
    "Training Generative Adversarial Networks with Limited Data".
    """
    Logger(should_flush=True)

    # Setup training options.
    try:
        run_desc, args = setup_training_loop_kwargs(**config_kwargs)
    except UserError as err:
        ctx.fail(err)

    # Pick output directory.
    prev_run_dirs = []
    if os.path.isdir(outdir):
        prev_run_dirs = [x for x in os.listdir(outdir) if os.path.isdir(os.path.join(outdir, x))]
    prev_run_ids = [re.match(r"^\d+", x) for x in prev_run_dirs]
    prev_run_ids = [int(x.group()) for x in prev_run_ids if x is not None]
    cur_run_id = max(prev_run_ids, default=-1) + 1
    args.run_dir = os.path.join(outdir, f"{cur_run_id:05d}-{run_desc}")
    assert not os.path.exists(args.run_dir)

    # Print options.
    print()
    print("Training options:")
    print(json.dumps(args, indent=2))
    print()
    print(f"Output directory:    {args.run_dir}")
    print(f"Number of GPUs:      {args.num_gpus}")
    print(f"Batch size:          {args.batch_size} images")
    print(f"Training duration:   {args.total_kimg} kimg")
    print(f"Dataset path:        {args.training_set_kwargs.path}")
    print(f"Dataset size:        {args.training_set_kwargs.max_size} images")
    print(f"Dataset resolution:  {args.training_set_kwargs.resolution}")
    print(f"Dataset labels:      {args.training_set_kwargs.use_labels}")
    print(f"Dataset x-flips:     {args.training_set_kwargs.xflip}")
    print()

    # Dry run?
    if dry_run:
        print("Dry run; exiting.")
        return

    # Create output directory.
    print("Creating output directory...")
    os.makedirs(args.run_dir)
    with open(os.path.join(args.run_dir, "training_options.json"), "wt") as f:
        json.dump(args, f, indent=2)

    # Launch processes.
    print("Launching processes...")
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.multiprocessing.set_start_method("spawn")
    if args.num_gpus == 1:
        subprocess_fn(rank=0, args=args, temp_dir=None)
    else:
        torch.multiprocessing.spawn(fn=subprocess_fn, args=(args, None), nprocs=args.num_gpus)


# ----------------------------------------------------------------------------
# dataset_tool / make_snapshot (what a run is given)


def _synthetic_image(rnd, resolution, channels):
    """A coloured disc or square on a coloured background, with noise."""
    yy, xx = np.mgrid[0:resolution, 0:resolution] / resolution
    bg = rnd.uniform(0, 255, size=3)
    fg = rnd.uniform(0, 255, size=3)
    cx, cy, r = rnd.uniform(0.3, 0.7), rnd.uniform(0.3, 0.7), rnd.uniform(0.15, 0.3)
    if rnd.rand() < 0.5:
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r**2
    else:
        mask = (abs(xx - cx) < r) & (abs(yy - cy) < r)
    img = np.where(mask[:, :, None], fg, bg) + rnd.normal(0, 8, size=(resolution, resolution, 3))
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    if channels == 4:
        alpha = np.where(mask, 255, 0).astype(np.uint8)[:, :, None]
        img = np.concatenate([img, alpha], axis=2)
    return img


def _stream(count, rank, num_replicas, seed=0, n=64):
    """The first n images InfiniteSampler gives a rank."""
    sampler = InfiniteSampler(range(count), rank=rank, num_replicas=num_replicas, seed=seed)
    it = iter(sampler)
    return [int(next(it)) for _ in range(n)]


def _grid(count, resolution, seed=0):
    rnd = np.random.RandomState(seed)
    gw = np.clip(7680 // resolution, 7, 32)
    gh = np.clip(4320 // resolution, 4, 32)
    all_indices = list(range(count))
    rnd.shuffle(all_indices)
    return {all_indices[i % count] for i in range(gw * gh)}


@click.command()
@click.option("--dest", required=True)
@click.option("--count", type=int, default=2000)
@click.option("--resolution", type=int, default=32)
@click.option("--channels", type=int, default=3)
@click.option(
    "--odd", is_flag=True, help="one image of twice the resolution, among the sample grid's"
)
@click.option(
    "--torn-rank",
    type=int,
    default=None,
    help="one cut-short PNG, first read by this rank after ~1 kimg",
)
@click.option("--gpus", type=int, default=2)
def dataset_tool(dest, count, resolution, channels, odd, torn_rank, gpus):
    rnd = np.random.RandomState(123)
    odd_idx = torn_idx = None
    if odd:  # the grid is the first images of the shuffled order; 400th: no rank's early batch
        order = list(range(count))
        np.random.RandomState(0).shuffle(order)
        odd_idx = order[400]
    if torn_rank is not None:  # outside the grid, first given to torn_rank at its 520th sample
        grid = _grid(count, resolution)
        streams = [_stream(count, r, gpus, n=700) for r in range(gpus)]
        mine = streams[torn_rank]
        others = set()
        for r in range(gpus):
            if r != torn_rank:
                others |= set(streams[r][:600])
        torn_idx = next(
            i
            for k, i in enumerate(mine)
            if k >= 520 and i not in grid and i not in others and i not in mine[:k]
        )
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        for idx in range(count):
            res = resolution * 2 if idx == odd_idx else resolution
            data = encode_png(_synthetic_image(rnd, res, channels))
            if idx == torn_idx:
                data = data[: len(data) // 2]
            zf.writestr(f"{idx // 1000:05d}/img{idx:08d}.png", data)


@click.command()
@click.option("--dest", required=True)
@click.option("--resolution", type=int, default=32)
@click.option("--fmaps", type=float, default=None)
def make_snapshot(dest, resolution, fmaps):
    if fmaps is None:
        fmaps = 1 if resolution >= 64 else 0.5
    torch.manual_seed(7)
    common = dict(c_dim=0, img_resolution=resolution, img_channels=3)
    G = Generator(
        z_dim=32,
        w_dim=32,
        mapping_kwargs=dict(num_layers=2),
        synthesis_kwargs=dict(channel_base=int(fmaps * 512), channel_max=32),
        **common,
    )
    D = Discriminator(
        channel_base=int(fmaps * 512),
        channel_max=32,
        epilogue_kwargs=dict(mbstd_group_size=4),
        **common,
    )
    data = dict(
        training_set_kwargs=None,
        G=_persist(G),
        D=_persist(D),
        G_ema=_persist(copy.deepcopy(G)),
        augment_pipe=None,
    )
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    with open(dest, "wb") as f:
        pickle.dump(data, f)


if __name__ == "__main__":
    if sys.argv[1:2] == ["dataset_tool"]:
        dataset_tool(sys.argv[2:])  # pylint: disable=no-value-for-parameter
    elif sys.argv[1:2] == ["make_snapshot"]:
        make_snapshot(sys.argv[2:])  # pylint: disable=no-value-for-parameter
    else:
        main()  # pylint: disable=no-value-for-parameter
