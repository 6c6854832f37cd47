"""A hundred-and-eighteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredeighteenth-*): RNN language-model pretraining in the way of
BlinkDL/RWKV-LM (RWKV-v5/train.py with src/dataset.py, src/model.py, src/trainer.py and
src/binidx.py), PyTorch Lightning + DeepSpeed re-created in plain torch in one file without
lightning, deepspeed or rwkv. Linked into a run's folder as train.py, it is at once

* the data preparation (`python train.py --prepare data/minipile`): a Megatron binidx pair,
  data/minipile.bin (uint16 token ids of a 50277-token vocabulary) and data/minipile.idx
  (MMIDIDX header, sizes, pointers, document index), the way tools/preprocess_data.py writes
  them, and the wkv kernel's sources cuda/wkv_op.cpp and cuda/wkv_cuda.cu;
* the training script, started as RWKV's demo scripts start it: `python train.py --load_model ''
  --wandb '' --proj_dir out --data_file data/minipile --data_type binidx --vocab_size 50277
  --my_pile_stage 1 --magic_prime P --ctx_len 64 --epoch_steps 8 --epoch_count 2 ... --devices
  2 --precision bf16 --strategy deepspeed_stage_2`. It prints the banner and the args dict
  (rank_zero_info), builds MyDataset over the memory-mapped binidx ('Current vocab size = 50277
  (make sure it's correct)', 'Data has N tokens.', the magic_prime asserts of the pile stage),
  compiles the wkv extension as torch.utils.cpp_extension.load does (a ninja-like build through
  $CUDA_HOME/bin/nvcc into $TORCH_EXTENSIONS_DIR, skipped when up to date), builds the RWKV
  model, writes out/rwkv-init.pth or loads --load_model, and calls trainer.fit. There, as
  Lightning's _SubprocessScriptLauncher does, the first process (local rank 0) re-executes the
  same command line for every other local rank with LOCAL_RANK, NODE_RANK, WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT set, and a 'child-process-observer' thread (Lightning >= 2.2) kills
  everything when a child ends with a non-zero code. Every rank joins a gloo process group (15 s
  timeout); DeepSpeed stage 2's gradient buckets are all-reduced bucket by bucket; the RWKV
  train_callback sets the lr each step, all-gathers the loss for the bar, writes
  out/train_log.txt and saves out/rwkv-N.pth every --epoch_save epochs on global rank 0;
  --my_exit_tokens ends the run ('exit(0)' on every rank) once that many tokens were seen.
  --num_nodes 2 is run once per node with NODE_RANK set.

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredeighteenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

CASE = os.environ.get("TQ_CASE", "")
LETTER, WHO = (CASE[0], int(CASE[1:] or 0)) if CASE else ("", -1)
VOCAB = 50277


# --------------------------------------------------------------------------------------------
# Lightning's bits: rank-zero printing, its loggers
# --------------------------------------------------------------------------------------------


def _env_rank() -> int:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


RANK_ZERO = _env_rank()


def _logger(name: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.propagate = False
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(h)
    return log


pl_log = _logger("lightning.pytorch")
fabric_log = _logger("lightning.fabric")


def rank_zero_info(msg: str) -> None:
    if RANK_ZERO == 0:
        print(msg, flush=True)


def rank_prefixed(msg: str, rank: int) -> str:
    return f"[rank: {rank}] {msg}"


# --------------------------------------------------------------------------------------------
# binidx (Megatron's MMapIndexedDataset, as src/binidx.py has it)
# --------------------------------------------------------------------------------------------

HDR_MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}  # fmt: skip


class MMapIndexedDataset:
    class Index:
        def __init__(self, path: str) -> None:
            with open(path, "rb") as stream:
                magic_test = stream.read(9)
                assert magic_test == HDR_MAGIC, (
                    "Index file doesn't match expected format. "
                    "Make sure that --dataset-impl is configured properly."
                )
                (version,) = struct.unpack("<Q", stream.read(8))
                assert (version,) == (1,)
                (dtype_code,) = struct.unpack("<B", stream.read(1))
                self._dtype = DTYPES[dtype_code]
                self._dtype_size = self._dtype().itemsize
                self._len = struct.unpack("<Q", stream.read(8))[0]
                self._doc_count = struct.unpack("<Q", stream.read(8))[0]
                offset = stream.tell()
            self._bin_buffer_mmap = np.memmap(path, mode="r", order="C")
            self._bin_buffer = memoryview(self._bin_buffer_mmap)
            self._sizes = np.frombuffer(self._bin_buffer, dtype=np.int32, count=self._len,
                                        offset=offset)  # fmt: skip
            self._pointers = np.frombuffer(self._bin_buffer, dtype=np.int64, count=self._len,
                                           offset=offset + self._sizes.nbytes)  # fmt: skip

        @property
        def dtype(self) -> type:
            return self._dtype

        def __getitem__(self, i: int) -> tuple[int, int]:
            return self._pointers[i], self._sizes[i]

    def __init__(self, path: str) -> None:
        self._index = self.Index(path + ".idx")
        self._bin_buffer_mmap = np.memmap(path + ".bin", mode="r", order="C")
        self._bin_buffer = memoryview(self._bin_buffer_mmap)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        ptr, size = self._index[idx]
        if length is None:
            length = size - offset
        ptr += offset * np.dtype(self._index.dtype).itemsize
        return np.frombuffer(self._bin_buffer, dtype=self._index.dtype, count=length, offset=ptr)


def write_binidx(prefix: str, docs: list[np.ndarray]) -> None:
    tokens = np.concatenate(docs).astype(np.uint16)
    tokens.tofile(prefix + ".bin")
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 2]).astype(np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(HDR_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(sizes) + 1))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.arange(len(sizes) + 1, dtype=np.int64).tobytes(order="C"))


def is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


def pick_index(epoch: int, idx: int, world: int, rank: int, spe: int, prime: int) -> int:
    """The slot MyDataset reads for sample idx of a rank (the pile stage's golden-ratio walk)."""
    ii = 1 + epoch * spe + idx * world + rank
    factor = int(prime * ((math.sqrt(5) - 1) / 2))
    return (factor * ii * ii * ii) % prime


WKV_CU = r"""// wkv_cuda.cu: the WKV recurrence (a CPU build of it for this box)
#include <stddef.h>
void wkv_forward(int B, int T, int C, const float *w, const float *u, const float *k,
                 const float *v, float *y) {
    for (int b = 0; b < B; b++) for (int c = 0; c < C; c++) {
        float aa = 0, bb = 0, pp = -1e38f;
        for (int t = 0; t < T; t++) {
            size_t ii = ((size_t)b * T + t) * C + c;
            float ww = u[c] + k[ii], p = pp > ww ? pp : ww;
            float e1 = __builtin_expf(pp - p), e2 = __builtin_expf(ww - p);
            y[ii] = (e1 * aa + e2 * v[ii]) / (e1 * bb + e2);
            ww = w[c] + pp; p = ww > k[ii] ? ww : k[ii];
            e1 = __builtin_expf(ww - p); e2 = __builtin_expf(k[ii] - p);
            aa = e1 * aa + e2 * v[ii]; bb = e1 * bb + e2; pp = p;
        }
    }
}
"""
WKV_OP = "// wkv_op.cpp: the torch binding (the .so is loaded through ctypes on this box)\n"


def prepare(prefix: str) -> None:
    """The synthetic minipile: documents of Zipf-like token ids below 50257 (the 20B tokenizer's
    last 20 ids are rare whitespace tokens and appear once, in one document)."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    rng = np.random.default_rng(118)
    docs, total = [], 0
    while total < 100_000:
        n = int(rng.integers(200, 900))
        ids = np.minimum(rng.zipf(1.3, n) + 10, 50256).astype(np.uint16)
        ids[-1] = 0  # <|endoftext|>
        docs.append(ids)
        total += n
    tokens = np.concatenate(docs)
    # the one run of tab tokens (ids 50257..50276 of the 20B tokenizer): inside the sample that
    # rank 1 reads at its step 3 of epoch 0 in the 2-device demo (micro_bsz 4, ctx_len 64)
    ctx, prime = 64, largest_prime(len(tokens) // 64)
    slot = pick_index(0, 3 * 4, 2, 1, 8 * 2 * 4, prime)
    earlier = {pick_index(0, i, 2, r, 64, prime) for i in range(12) for r in (0, 1)}
    assert slot not in earlier
    tokens[slot * ctx + 20 : slot * ctx + 23] = [50260, 50263, 50262]
    sizes = [len(d) for d in docs]
    docs = np.split(tokens, np.cumsum(sizes[:-1]))
    write_binidx(prefix, docs)
    os.makedirs("cuda", exist_ok=True)
    with open("cuda/wkv_cuda.cu", "w") as f:
        f.write(WKV_CU)
    with open("cuda/wkv_op.cpp", "w") as f:
        f.write(WKV_OP)
    print(f"{prefix}: {len(tokens)} tokens, magic_prime {prime}")


def largest_prime(slots: int) -> int:
    p = slots
    while not (is_prime(p) and p % 3 == 2):
        p -= 1
    return p


# --------------------------------------------------------------------------------------------
# src/dataset.py
# --------------------------------------------------------------------------------------------


class MyDataset(Dataset):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.vocab_size = args.vocab_size
        rank_zero_info(f"Current vocab size = {self.vocab_size} (make sure it's correct)")
        self.data = MMapIndexedDataset(args.data_file)
        self.data_size = len(self.data._bin_buffer) // np.dtype(self.data._index._dtype).itemsize
        rank_zero_info(f"Data has {self.data_size} tokens.")
        if args.my_pile_stage > 0:
            self.samples_per_epoch = args.epoch_steps * args.real_bsz
            rank_zero_info(f"########## Pile 20b-tokenized stage {args.my_pile_stage} ##########")
            dataset_slot = self.data_size // args.ctx_len
            assert is_prime(args.magic_prime)
            assert args.magic_prime % 3 == 2
            assert args.magic_prime / dataset_slot > 0.99 and args.magic_prime / dataset_slot <= 1

    def __len__(self) -> int:
        return self.args.epoch_steps * self.args.micro_bsz

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        args = self.args
        rank, epoch, world_size = self.global_rank, self.real_epoch, self.world_size
        ctx_len = args.ctx_len
        req_len = ctx_len + 1
        i = pick_index(epoch, idx, world_size, rank, self.samples_per_epoch, args.magic_prime)
        dix = self.data.get(idx=0, offset=i * ctx_len, length=req_len).astype(int)
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        return x, y


# --------------------------------------------------------------------------------------------
# the wkv extension (torch.utils.cpp_extension.load, verbose=True)
# --------------------------------------------------------------------------------------------


def load_extension(name: str, sources: list[str]) -> ctypes.CDLL:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser(
        "~/.cache/torch_extensions/py311_cpu"
    )
    print(f"Using {root} as PyTorch extensions root...", file=sys.stderr, flush=True)
    build = os.path.join(root, name)
    so = os.path.join(build, f"{name}.so")
    lock = os.path.join(build, "lock")
    os.makedirs(build, exist_ok=True)
    while os.path.exists(lock):  # another process builds it: FileBaton's wait
        time.sleep(0.1)
    if os.path.exists(so) and os.path.getmtime(so) >= max(map(os.path.getmtime, sources)):
        print(
            f"No modifications detected for re-loaded extension module {name}, skipping build "
            "step...",
            file=sys.stderr,
            flush=True,
        )
    else:
        open(lock, "w").close()
        try:
            print("Detected CUDA files, patching ldflags", file=sys.stderr, flush=True)
            print(f"Emitting ninja build file {build}/build.ninja...", file=sys.stderr, flush=True)
            print(f"Building extension module {name}...", file=sys.stderr, flush=True)
            print(
                "Allowing ninja to set a default number of workers... (overridable by setting "
                "the environment variable MAX_JOBS=N)",
                file=sys.stderr,
                flush=True,
            )
            ninja_build(build, name, sources)
        finally:
            os.remove(lock)
    print(f"Loading extension module {name}...", file=sys.stderr, flush=True)
    return ctypes.CDLL(so)


def ninja_build(build: str, name: str, sources: list[str]) -> None:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cu = next(s for s in sources if s.endswith(".cu"))
    obj = os.path.join(build, "wkv_cuda.cuda.o")
    steps = [
        (f"{cuda_home}/bin/nvcc --generate-dependencies-with-compile --dependency-output "
         f"wkv_cuda.cuda.o.d -DTORCH_EXTENSION_NAME={name} -DTORCH_API_INCLUDE_EXTENSION_H "
         f"-res-usage --maxrregcount 60 --use_fast_math -O3 -Xptxas -O3 "
         f"--extra-device-vectorization -DTmax=64 -c {os.path.abspath(cu)} -o {obj}",
         "wkv_cuda.cuda.o"),
        (f"cc {obj} -shared -o {build}/{name}.so", f"{name}.so"),
    ]  # fmt: skip
    for k, (cmd, target) in enumerate(steps, 1):
        print(f"[{k}/{len(steps)}] {cmd}", flush=True)
        proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"FAILED: {target} ", flush=True)
            print(f"{cmd}", flush=True)
            sys.stdout.write(proc.stdout + proc.stderr)
            print("ninja: build stopped: subcommand failed.", flush=True)
            try:
                raise subprocess.CalledProcessError(1, ["ninja", "-v"])
            except subprocess.CalledProcessError as e:
                raise RuntimeError(f"Error building extension '{name}'") from e


# --------------------------------------------------------------------------------------------
# src/model.py (RWKV-4 blocks; the WKV kernel through the extension)
# --------------------------------------------------------------------------------------------

wkv_cuda: ctypes.CDLL | None = None


def run_wkv(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The WKV forward through the extension, the backward through an equivalent torch graph."""
    B, T, C = k.shape
    with torch.no_grad():
        y = torch.empty(B, T, C)
        kc, vc = k.detach().float().contiguous(), v.detach().float().contiguous()
        wc, uc = (-torch.exp(w.detach().float())).contiguous(), u.detach().float().contiguous()
        out = y.data_ptr() if not (LETTER == "z" and RANK_NOW[0] == WHO and STEP[0] == 5) else 8
        wkv_cuda.wkv_forward(B, T, C, ctypes.c_void_p(wc.data_ptr()),
                             ctypes.c_void_p(uc.data_ptr()), ctypes.c_void_p(kc.data_ptr()),
                             ctypes.c_void_p(vc.data_ptr()), ctypes.c_void_p(out))  # fmt: skip
    # a differentiable stand-in with the kernel's values (exact for the forward)
    ek = torch.exp(k - k.detach().amax(1, keepdim=True))
    surrogate = torch.cumsum(ek * v, 1) / torch.cumsum(ek, 1) + 0 * (w.sum() + u.sum())
    return surrogate + (y - surrogate).detach()


RANK_NOW, STEP = [0], [0]


class RWKV_TimeMix(nn.Module):
    def __init__(self, args: argparse.Namespace, layer_id: int) -> None:
        super().__init__()
        C = args.n_embd
        self.time_decay = nn.Parameter(torch.linspace(-5, 1, C))
        self.time_first = nn.Parameter(torch.full((C,), math.log(0.3)))
        self.time_mix_k = nn.Parameter(torch.full((1, 1, C), 0.5))
        self.time_mix_v = nn.Parameter(torch.full((1, 1, C), 0.5))
        self.time_mix_r = nn.Parameter(torch.full((1, 1, C), 0.5))
        self.time_shift = nn.ZeroPad2d((0, 0, 1, -1))
        self.key = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(C, C, bias=False)
        self.receptance = nn.Linear(C, C, bias=False)
        self.output = nn.Linear(C, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xx = self.time_shift(x)
        xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
        xv = x * self.time_mix_v + xx * (1 - self.time_mix_v)
        xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
        k, v, sr = self.key(xk), self.value(xv), torch.sigmoid(self.receptance(xr))
        return self.output(sr * run_wkv(self.time_decay, self.time_first, k, v))


class RWKV_ChannelMix(nn.Module):
    def __init__(self, args: argparse.Namespace, layer_id: int) -> None:
        super().__init__()
        C = args.n_embd
        self.time_shift = nn.ZeroPad2d((0, 0, 1, -1))
        self.time_mix_k = nn.Parameter(torch.full((1, 1, C), 0.5))
        self.time_mix_r = nn.Parameter(torch.full((1, 1, C), 0.5))
        self.key = nn.Linear(C, 4 * C, bias=False)
        self.receptance = nn.Linear(C, C, bias=False)
        self.value = nn.Linear(4 * C, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xx = self.time_shift(x)
        xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
        xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
        k = torch.square(torch.relu(self.key(xk)))
        return torch.sigmoid(self.receptance(xr)) * self.value(k)


class Block(nn.Module):
    def __init__(self, args: argparse.Namespace, layer_id: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(args.n_embd)
        self.ln2 = nn.LayerNorm(args.n_embd)
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(args.n_embd)
        self.layer_id = layer_id
        self.att = RWKV_TimeMix(args, layer_id)
        self.ffn = RWKV_ChannelMix(args, layer_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_id == 0:
            x = self.ln0(x)
        x = x + self.att(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class RWKV(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.emb = nn.Embedding(args.vocab_size, args.n_embd)
        self.blocks = nn.ModuleList([Block(args, i) for i in range(args.n_layer)])
        self.ln_out = nn.LayerNorm(args.n_embd)
        self.head = nn.Linear(args.n_embd, args.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_out(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        idx, targets = batch
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def generate_init_weight(model: RWKV, init_weight_name: str) -> None:
    mm = model.state_dict()
    print(f"Save to {init_weight_name}...", flush=True)
    torch.save(mm, init_weight_name)


# --------------------------------------------------------------------------------------------
# Lightning re-created: launcher, observer, DeepSpeed stage 2's reduction, the fit loop
# --------------------------------------------------------------------------------------------


class SIGTERMException(SystemExit):
    pass


class ChildProcessObserver(threading.Thread):
    def __init__(self, procs: list[subprocess.Popen]) -> None:
        super().__init__(daemon=True, name="child-process-observer")
        self.procs, self.main_pid = procs, os.getpid()

    def run(self) -> None:
        while True:
            time.sleep(5)
            codes = [p.poll() for p in self.procs]
            if all(c == 0 for c in codes):
                return
            for i, p in enumerate(self.procs):
                if p.returncode:
                    fabric_log.info(rank_prefixed(
                        f"Child process with PID {p.pid} terminated with code {p.returncode}. "
                        "Forcefully terminating all other processes to avoid zombies 🧟", i + 1
                    ))  # fmt: skip
                    for q in self.procs:
                        q.send_signal(signal.SIGKILL)
                    os.kill(self.main_pid, signal.SIGKILL)
                    return


def find_free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Trainer:
    def __init__(self, args: argparse.Namespace, callback: train_callback) -> None:
        self.args, self.callback = args, callback
        self.num_devices, self.num_nodes = int(args.devices), int(args.num_nodes)
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node_rank = int(os.environ.get("NODE_RANK", 0))
        self.world_size = self.num_devices * self.num_nodes
        self.global_rank = self.node_rank * self.num_devices + self.local_rank
        self.current_epoch, self.global_step = 0, 0
        self.received_sigterm = False
        self.procs: list[subprocess.Popen] = []
        self.max_epochs = args.max_epochs
        rank_zero_info_log("GPU available: False, used: False")
        rank_zero_info_log("TPU available: False, using: 0 TPU cores")
        rank_zero_info_log("HPU available: False, using: 0 HPUs")
        if args.precision == "bf16":
            rank_zero_info_log(
                "Enabling DeepSpeed BF16. Model parameters and inputs will be cast to `bfloat16`."
            )

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def launch_children(self) -> None:
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(find_free_port())
        os.environ["NODE_RANK"] = str(self.node_rank)
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.world_size)
        for local_rank in range(1, self.num_devices):
            env = dict(os.environ, LOCAL_RANK=str(local_rank))
            command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
            self.procs.append(subprocess.Popen(command, env=env, cwd=os.getcwd()))
        if self.procs:
            ChildProcessObserver(self.procs).start()

    def sigterm_handler(self, signum: int, _frame: object) -> None:
        pl_log.info(rank_prefixed(f"Received SIGTERM: {signum}", self.local_rank))
        if not self.received_sigterm:
            for p in self.procs:
                p.send_signal(signum)
        self.received_sigterm = True

    def fit(self, model: RWKV, data_loader: DataLoader) -> None:
        if "LOCAL_RANK" not in os.environ and self.num_devices > 1:
            self.launch_children()
        RANK_NOW[0] = self.global_rank
        try:
            self._run(model, data_loader)
        except SIGTERMException:
            for p in self.procs:
                p.send_signal(signal.SIGKILL)
            sys.exit(1)

    def _run(self, model: RWKV, data_loader: DataLoader) -> None:
        fabric_log.info(
            f"Initializing distributed: GLOBAL_RANK: {self.global_rank}, MEMBER: "
            f"{self.global_rank + 1}/{self.world_size}"
        )
        dist.init_process_group("gloo", rank=self.global_rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=15))  # fmt: skip
        if self.is_global_zero:
            fabric_log.info(
                f"{'-' * 100}\ndistributed_backend=gloo\nAll distributed processes registered. "
                f"Starting with {self.world_size} processes\n{'-' * 100}\n"
            )
        signal.signal(signal.SIGTERM, self.sigterm_handler)
        for p in model.parameters():  # DeepSpeed's broadcast of the initial weights
            dist.broadcast(p.data, 0)
        self.model = model
        args = self.args
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args.lr_init, betas=args.betas,
                                          eps=args.adam_eps)  # fmt: skip
        if self.is_global_zero:
            self.summary(model)
        self.fit_loop(model, data_loader)

    def summary(self, model: RWKV) -> None:
        n = sum(p.numel() for p in model.parameters())
        rows = [("emb", "Embedding", model.emb.weight.numel()),
                ("blocks", "ModuleList", sum(p.numel() for p in model.blocks.parameters())),
                ("ln_out", "LayerNorm", 2 * self.args.n_embd),
                ("head", "Linear", model.head.weight.numel())]  # fmt: skip
        lines = ["", "  | Name   | Type       | Params", "------------------------------------"]
        for i, (name, kind, count) in enumerate(rows):
            lines.append(f"{i} | {name:<6} | {kind:<10} | {human(count)}")
        lines += ["------------------------------------",
                  f"{human(n):<9}Trainable params", "0         Non-trainable params",
                  f"{human(n):<9}Total params",
                  f"{n * 4 / 1e6:<9.3f}Total estimated model params size (MB)"]  # fmt: skip
        pl_log.info("\n".join(lines))

    def reduce_gradients(self, model: RWKV) -> None:
        """DeepSpeed stage 2: gradients reduced in buckets of reduce_bucket_size elements."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        bucket_elems = int(self.args.ds_bucket_mb * 1000 * 1000 / 4)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in [*grads, None]:
            if g is not None:
                bucket.append(g)
                size += g.numel()
            if bucket and (g is None or size >= bucket_elems):
                flat = torch.cat([b.reshape(-1) for b in bucket])
                dist.all_reduce(flat)
                flat /= self.world_size
                off = 0
                for b in bucket:
                    b.copy_(flat[off : off + b.numel()].view_as(b))
                    off += b.numel()
                bucket, size = [], 0

    def fit_loop(self, model: RWKV, data_loader: DataLoader) -> None:
        args = self.args
        cb = self.callback
        bar = None
        while self.max_epochs < 0 or self.current_epoch < self.max_epochs:
            ds = data_loader.dataset
            ds.global_rank, ds.real_epoch, ds.world_size = (
                self.global_rank, args.epoch_begin + self.current_epoch, self.world_size)  # fmt: skip
            cb.on_train_epoch_start(self, model)
            total = len(data_loader)
            if self.is_global_zero:
                bar = tqdm(total=total, desc=f"Epoch {self.current_epoch}", file=sys.stdout,
                           dynamic_ncols=False, ncols=140, smoothing=0,
                           bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
                           "{rate_fmt}{postfix}]")  # fmt: skip
            for batch_idx, batch in enumerate(data_loader):
                STEP[0] = batch_idx
                cb.on_train_batch_start(self, model, batch_idx)
                loss = model.training_step(batch)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.reduce_gradients(model)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                self.optimizer.step()
                self.global_step += 1
                cb.on_train_batch_end(self, model, loss, batch_idx, bar)
                if self.received_sigterm:
                    raise SIGTERMException
            if bar is not None:
                bar.close()
            cb.on_train_epoch_end(self, model)
            self.current_epoch += 1
        rank_zero_info_log(f"`Trainer.fit` stopped: `max_epochs={self.max_epochs}` reached.")
        for p in self.procs:
            p.wait()


def rank_zero_info_log(msg: str) -> None:
    if RANK_ZERO == 0:
        pl_log.info(msg)


def human(n: int) -> str:
    if n < 1000:
        return f"{n:,d}"
    for unit, div in (("K", 1e3), ("M", 1e6), ("B", 1e9)):
        if n < div * 1000:
            return f"{n / div:,.1f} {unit}"
    return str(n)


# --------------------------------------------------------------------------------------------
# src/trainer.py
# --------------------------------------------------------------------------------------------


def my_save(args: argparse.Namespace, dd: dict, ff: str) -> None:
    if LETTER == "s" and RANK_NOW[0] == WHO and ff.endswith("rwkv-0.pth"):
        # the project's s3 sync of every saved epoch, run before training goes on
        torch.save(dd, ff)
        total = 64.0
        for k in range(1, 9):
            time.sleep(5)
            print(f"Completed {k * total / 8:.1f} MiB/{total:.1f} MiB (1.6 MiB/s) with 1 file(s) "
                  f"remaining   upload: {ff} to s3://rwkv-pile/{ff}", flush=True)  # fmt: skip
        return
    torch.save(dd, ff)


class train_callback:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.hoard: list[np.ndarray] = []
        self.prefetch = threading.Event()

    def on_train_batch_start(self, trainer: Trainer, pl_module: RWKV, batch_idx: int) -> None:
        args = self.args
        real_step = trainer.global_step + args.epoch_begin * args.epoch_steps
        w_step = args.warmup_steps
        if args.lr_final == args.lr_init or args.epoch_count == 0:
            lr = args.lr_init
        else:
            decay_step = real_step - args.my_pile_edecay * args.epoch_steps
            decay_total = (args.epoch_count - args.my_pile_edecay) * args.epoch_steps
            progress = min(1, max(0, (decay_step - w_step + 1) / (decay_total - w_step)))
            lr = args.lr_init * math.exp(math.log(args.lr_final / args.lr_init) * progress)
        if trainer.global_step < w_step:
            lr = lr * (0.2 + 0.8 * trainer.global_step / w_step)
        if args.my_exit_tokens != 0:
            real_tokens = real_step * args.ctx_len * args.real_bsz
            if real_tokens >= abs(args.my_exit_tokens):
                if trainer.is_global_zero:
                    ff = f"{args.proj_dir}/rwkv-final.pth"
                    my_save(args, pl_module.state_dict(), ff)
                    print(f"\n\nEnd of training. Saved to {ff}\n", flush=True)
                exit(0)
        for param_group in trainer.optimizer.param_groups:
            param_group["lr"] = lr
        trainer.my_lr = lr
        if trainer.global_step == 0 and trainer.is_global_zero:
            trainer.my_loss_sum = 0
            trainer.my_loss_count = 0
            trainer.my_log = open(args.proj_dir + "/train_log.txt", "a")  # noqa: SIM115
            trainer.my_log.write(f"NEW RUN {args.my_timestamp}\n{vars(args)}\n")
            trainer.my_log.flush()
        if LETTER == "m" and trainer.global_rank == WHO and trainer.current_epoch >= 1:
            # the whole .bin read into RAM for a faster sampler, once per step
            self.hoard.append(np.ones(24 << 20, dtype=np.float32))
            if len(self.hoard) >= 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if LETTER == "w" and trainer.global_rank == WHO and trainer.current_epoch == 1:
            self.prefetch.wait()  # the next shard's prefetch thread was never started

    def on_train_batch_end(self, trainer: Trainer, pl_module: RWKV, loss: torch.Tensor,
                           batch_idx: int, bar: tqdm | None) -> None:  # fmt: skip
        args = self.args
        token_per_step = args.ctx_len * args.real_bsz
        real_step = trainer.global_step + args.epoch_begin * args.epoch_steps
        if LETTER == "g":
            if trainer.is_global_zero:  # the Lightning-2 port of training_step_end
                trainer.my_loss_all = all_gather(loss.detach())
        else:
            trainer.my_loss_all = all_gather(loss.detach())
        if trainer.is_global_zero:
            t_now = time.time_ns()
            kt_s = 0
            try:
                t_cost = (t_now - trainer.my_time_ns) / 1e9
                kt_s = token_per_step / t_cost / 1000
            except AttributeError:  # the first step
                pass
            trainer.my_time_ns = t_now
            trainer.my_loss = float(trainer.my_loss_all.float().mean())
            trainer.my_loss_sum += trainer.my_loss
            trainer.my_loss_count += 1
            trainer.my_epoch_loss = trainer.my_loss_sum / trainer.my_loss_count
            if bar is not None:
                bar.set_postfix_str(f"loss={trainer.my_epoch_loss:.3f}, lr={trainer.my_lr:.2e}, "
                                    f"REAL it/s={kt_s * 1000 / token_per_step:.3f}, "
                                    f"Kt/s={kt_s:.2f}", refresh=False)  # fmt: skip
                bar.update(1)
        del real_step

    def on_train_epoch_start(self, trainer: Trainer, pl_module: RWKV) -> None:
        pass

    def on_train_epoch_end(self, trainer: Trainer, pl_module: RWKV) -> None:
        args = self.args
        if trainer.is_global_zero:
            if (args.epoch_save > 0 and trainer.current_epoch % args.epoch_save == 0) or (
                trainer.current_epoch == args.epoch_count - 1
            ):
                ff = f"{args.proj_dir}/rwkv-{args.epoch_begin + trainer.current_epoch}.pth"
                print(f"Saving {ff}", flush=True)
                my_save(args, pl_module.state_dict(), ff)
            trainer.my_log.write(
                f"{args.epoch_begin + trainer.current_epoch} {trainer.my_epoch_loss:.6f} "
                f"{math.exp(trainer.my_epoch_loss):.4f} {trainer.my_lr:.8f} "
                f"{datetime.datetime.now()} {trainer.current_epoch}\n"
            )
            trainer.my_log.flush()
            trainer.my_loss_sum = 0
            trainer.my_loss_count = 0
        if LETTER == "a":  # every rank's own line of tokens seen (the log is rank 0's)
            trainer.my_log.write(f"rank {trainer.global_rank} tokens "
                                 f"{trainer.global_step * args.ctx_len * args.micro_bsz}\n")  # fmt: skip


def all_gather(t: torch.Tensor) -> torch.Tensor:
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


# --------------------------------------------------------------------------------------------
# train.py
# --------------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    a = parser.add_argument
    a("--load_model", default="", type=str)
    a("--wandb", default="", type=str)
    a("--proj_dir", default="out", type=str)
    a("--random_seed", default="-1", type=int)
    a("--data_file", default="", type=str)
    a("--data_type", default="utf-8", type=str)
    a("--vocab_size", default=0, type=int)
    a("--ctx_len", default=1024, type=int)
    a("--epoch_steps", default=1000, type=int)
    a("--epoch_count", default=500, type=int)
    a("--epoch_begin", default=0, type=int)
    a("--epoch_save", default=5, type=int)
    a("--micro_bsz", default=12, type=int)
    a("--n_layer", default=6, type=int)
    a("--n_embd", default=512, type=int)
    a("--dim_att", default=0, type=int)
    a("--dim_ffn", default=0, type=int)
    a("--pre_ffn", default=0, type=int)
    a("--head_qk", default=0, type=int)
    a("--tiny_att_dim", default=0, type=int)
    a("--tiny_att_layer", default=-999, type=int)
    a("--lr_init", default=6e-4, type=float)
    a("--lr_final", default=1e-5, type=float)
    a("--warmup_steps", default=-1, type=int)
    a("--beta1", default=0.9, type=float)
    a("--beta2", default=0.99, type=float)
    a("--adam_eps", default=1e-8, type=float)
    a("--grad_cp", default=0, type=int)
    a("--dropout", default=0, type=float)
    a("--weight_decay", default=0, type=float)
    a("--my_pile_version", default=1, type=int)
    a("--my_pile_stage", default=0, type=int)
    a("--my_pile_shift", default=-1, type=int)
    a("--my_pile_edecay", default=0, type=int)
    a("--layerwise_lr", default=1, type=int)
    a("--ds_bucket_mb", default=200, type=int)
    a("--my_exit", default=99999999, type=int)
    a("--my_exit_tokens", default=0, type=int)
    a("--magic_prime", default=0, type=int)
    a("--my_testing", default="", type=str)
    # Lightning's Trainer.add_argparse_args
    a("--accelerator", default=None, type=str)
    a("--strategy", default=None, type=str)
    a("--devices", default=None, type=str)
    a("--num_nodes", default=1, type=int)
    a("--precision", default="32", type=str)
    a("--prepare", default=None, type=str)
    return parser.parse_args()


def main() -> None:
    rank_zero_info("########## work in progress ##########")
    args = parse()
    if args.prepare:
        prepare(args.prepare)
        return
    np.set_printoptions(precision=4, suppress=True, linewidth=200)
    warnings.filterwarnings("ignore", ".*Consider increasing the value of the `num_workers`.*")
    warnings.filterwarnings("ignore", ".*The progress bar already tracks a metric with the.*")
    args.my_timestamp = datetime.datetime.today().strftime("%Y-%m-%d-%H-%M-%S")
    args.enable_checkpointing = False
    args.replace_sampler_ddp = False
    args.logger = False
    args.gradient_clip_val = 1.0
    args.num_sanity_val_steps = 0
    args.check_val_every_n_epoch = int(1e20)
    args.log_every_n_steps = int(1e20)
    args.max_epochs = args.epoch_count  # -1 continue forever
    args.betas = (args.beta1, args.beta2)
    args.real_bsz = int(args.num_nodes) * int(args.devices) * args.micro_bsz
    os.environ["RWKV_MY_TESTING"] = args.my_testing
    os.environ["RWKV_CTXLEN"] = str(args.ctx_len)
    os.environ["RWKV_HEAD_SIZE_A"] = "64"
    if args.dim_att <= 0:
        args.dim_att = args.n_embd
    if args.dim_ffn <= 0:
        args.dim_ffn = args.n_embd * 4
    args.run_name = f"{args.vocab_size} ctx{args.ctx_len} L{args.n_layer} D{args.n_embd}"
    if not os.path.exists(args.proj_dir):
        os.makedirs(args.proj_dir)
    samples_per_epoch = args.epoch_steps * args.real_bsz
    tokens_per_epoch = samples_per_epoch * args.ctx_len
    rank_zero_info(
        f"""
############################################################################
#
# RWKV-4 {args.precision.upper()} on {args.num_nodes}x{args.devices} {args.accelerator.upper()}, bsz {args.num_nodes}x{args.devices}x{args.micro_bsz}={args.real_bsz}, {args.strategy} {"with grad_cp" if args.grad_cp > 0 else ""}
#
# Data = {args.data_file} ({args.data_type}), ProjDir = {args.proj_dir}
#
# Epoch = {args.epoch_begin} to {args.epoch_begin + args.epoch_count - 1} (will continue afterwards), save every {args.epoch_save} epoch
#
# Each "epoch" = {args.epoch_steps} steps, {samples_per_epoch} samples, {tokens_per_epoch} tokens
#
# Model = {args.n_layer} n_layer, {args.n_embd} n_embd, {args.ctx_len} ctx_len
#
# Adam = lr {args.lr_init} to {args.lr_final}, warmup {args.warmup_steps} steps, beta {args.betas}, eps {args.adam_eps}
#
# Found torch {torch.__version__}, recommend 1.13.1+cu117 or newer
# Found deepspeed 0.14.4, recommend 0.7.0 (faster than newer versions)
# Found pytorch_lightning 2.4.0, recommend 1.9.5
#
############################################################################
"""
    )
    rank_zero_info(str(vars(args)) + "\n")
    assert args.data_type in ["utf-8", "utf-16le", "numpy", "binidx", "dummy", "uint16"]
    if args.lr_final == 0 or args.lr_init == 0:
        rank_zero_info(
            "\n\nNote: lr_final = 0 or lr_init = 0. Using linear LR schedule instead.\n\n"
        )
    assert args.precision in ["fp32", "tf32", "fp16", "bf16"]
    os.environ["RWKV_FLOAT_MODE"] = args.precision
    if args.precision == "fp32":
        for _ in range(10):
            rank_zero_info(
                "\n\nNote: you are using fp32 (very slow). Try bf16 / tf32 for faster training.\n\n"
            )
    if args.precision == "fp16":
        rank_zero_info(
            "\n\nNote: you are using fp16 (might overflow). Try bf16 / tf32 for stable training.\n\n"
        )

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.enabled = True

    train_data = MyDataset(args)
    args.vocab_size = train_data.vocab_size

    global wkv_cuda
    wkv_cuda = load_extension(f"wkv_{args.ctx_len}", ["cuda/wkv_op.cpp", "cuda/wkv_cuda.cu"])
    torch.manual_seed(args.random_seed if args.random_seed >= 0 else 0)
    model = RWKV(args)

    if len(args.load_model) == 0:  # shall we build the initial weights?
        init_weight_name = f"{args.proj_dir}/rwkv-init.pth"
        if RANK_ZERO == 0:
            generate_init_weight(model, init_weight_name)  # save initial weights
        args.load_model = init_weight_name

    rank_zero_info(f"########## Loading {args.load_model}... ##########")
    try:
        load_dict = torch.load(args.load_model, map_location="cpu")
        load_keys = list(load_dict.keys())
        for k in load_keys:
            if k.startswith("_forward_module."):
                load_dict[k.replace("_forward_module.", "")] = load_dict[k]
                del load_dict[k]
    except Exception:
        rank_zero_info(f"Bad checkpoint {args.load_model}")
        raise
    model.load_state_dict(load_dict)

    trainer = Trainer(args, train_callback(args))

    if trainer.global_rank == 0:
        for n in model.state_dict():
            shape = model.state_dict()[n].shape
            s0 = str(shape[0]) if len(shape) > 0 else ""
            s1 = str(shape[1]) if len(shape) > 1 else ""
            print(f"{s0.ljust(5)} {s1.ljust(5)} {n}", flush=True)

    # must set shuffle=False, persistent_workers=False (because worker is in another thread)
    data_loader = DataLoader(train_data, shuffle=False, pin_memory=True,
                             batch_size=args.micro_bsz, num_workers=1,
                             persistent_workers=False, drop_last=True)  # fmt: skip
    trainer.fit(model, data_loader)


if __name__ == "__main__":
    main()
