import os
import sys

with open(sys.argv[0]) as f:
    code = f.read()  # read the code of this file ASAP, for logging
import argparse
import resource
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

# CPU port of the speedrun (no GPU on this box): gloo instead of nccl, float32 weights with
# bfloat16 only inside Newton-Schulz, no torch.compile (off by default, --compile=True), no
# FlexAttention (causal SDPA), token shards memory-mapped instead of read into pinned memory.

# -----------------------------------------------------------------------------
# Muon optimizer


def zeropower_via_newtonschulz5(G: Tensor, steps: int) -> Tensor:
    """
    Newton-Schulz iteration to compute the zeroth power / orthogonalization of G. We opt to use a
    quintic iteration whose coefficients are selected to maximize the slope at zero. For the purpose
    of minimizing steps, it turns out to be empirically effective to keep increasing the slope at
    zero even beyond the point where the iteration no longer converges all the way to one everywhere
    on the interval. This iteration therefore does not produce UV^T but rather something like US'V^T
    where S' is diagonal with S_{ii}' ~ Uniform(0.5, 1.5), which turns out not to hurt model
    performance at all relative to UV^T, where USV^T = G is the SVD.
    """
    assert G.ndim >= 2  # batched Muon implementation by @scottjmaddox
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT

    # Ensure spectral norm is at most 1
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    # Perform the NS iterations
    for _ in range(steps):
        A = X @ X.mT
        B = (
            b * A + c * A @ A
        )  # quintic computation strategy adapted from suggestion by @jxbz, @leloykun, and @YouJiacheng
        X = a * X + B @ X

    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


class Muon(torch.optim.Optimizer):
    """
    Muon - MomentUm Orthogonalized by Newton-schulz

    https://kellerjordan.github.io/posts/muon/

    Muon internally runs standard SGD-momentum, and then performs an orthogonalization post-
    processing step, in which each 2D parameter's update is replaced with the nearest orthogonal
    matrix. To efficiently orthogonalize each update, we use a Newton-Schulz iteration, which has
    the advantage that it can be stably run in bfloat16 on the GPU.

    Some warnings:
    - This optimizer should not be used for the embedding layer, the final fully connected layer,
    or any {0,1}-D parameters; those should all be optimized by a standard method (e.g., AdamW).
    - To use it with 4D convolutional filters, it works well to just flatten their last 3 dimensions.

    Arguments:
        lr: The learning rate used by the internal SGD.
        momentum: The momentum used by the internal SGD.
        nesterov: Whether to use Nesterov-style momentum in the internal SGD. (recommended)
        ns_steps: The number of Newton-Schulz iteration steps to use.
    """

    def __init__(
        self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, rank=0, world_size=1
    ):
        self.rank = rank
        self.world_size = world_size
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        params: list[Tensor] = [*params]
        assert all(isinstance(p, Tensor) for p in params)
        sizes = {p.numel() for p in params}

        def create_update_buffer(size: int):
            b = torch.empty(self.world_size, size, dtype=torch.bfloat16)
            return dict(update_buffer=b, update_buffer_views=[b[i] for i in range(self.world_size)])

        param_groups = [
            dict(params=[p for p in params if p.numel() == size], **create_update_buffer(size))
            for size in sizes
        ]
        super().__init__(param_groups, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr = group["lr"]
            momentum = group["momentum"]
            nesterov = group["nesterov"]
            ns_steps = group["ns_steps"]
            update_buffer_views: list[Tensor] = group["update_buffer_views"]
            # generate weight updates in distributed fashion
            params: list[Tensor] = group["params"]
            # each rank orthogonalizes every world_size-th param, then every rank gets all the
            # updates of the round (a plain all_gather: gloo has no async overlap to win here)
            for base_i in range(len(params))[:: self.world_size]:
                if base_i + self.rank < len(params):
                    p = params[base_i + self.rank]
                    g = p.grad
                    assert g is not None
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(g)
                    buf: Tensor = state["momentum_buffer"]
                    buf.lerp_(g, 1 - momentum)
                    g = g.lerp_(buf, momentum) if nesterov else buf
                    g = zeropower_via_newtonschulz5(g, steps=ns_steps).flatten()
                    dist.all_gather(update_buffer_views, g)
                    params_world = params[base_i : base_i + self.world_size]
                    for p_world, g_world in zip(params_world, update_buffer_views, strict=False):
                        p_world.add_(
                            g_world.view_as(p_world),
                            alpha=-lr * max(1, p_world.size(-2) / p_world.size(-1)) ** 0.5,
                        )


# -----------------------------------------------------------------------------
# PyTorch nn.Module definitions for the GPT-2 model


def norm(x: Tensor):
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def reset_parameters(self) -> None:
        std = 0.5 * (self.in_features**-0.5)  # 0.5 is a bit better than the default 1/sqrt(3)
        bound = (3**0.5) * std
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x))


class Rotary(nn.Module):
    def __init__(self, dim: int, max_seq_len=65536):
        super().__init__()
        # half-truncate RoPE by @YouJiacheng (w/ base freq tuning)
        angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=torch.float32)
        angular_freq = torch.cat([angular_freq, angular_freq.new_zeros(dim // 4)])
        t = torch.arange(max_seq_len, dtype=torch.float32)
        theta = torch.einsum("i,j -> ij", t, angular_freq)
        self.cos = nn.Buffer(theta.cos(), persistent=False)
        self.sin = nn.Buffer(theta.sin(), persistent=False)

    def forward(self, x_BTHD: Tensor):
        assert self.cos.size(0) >= x_BTHD.size(-3)
        cos, sin = (
            self.cos[None, : x_BTHD.size(-3), None, :],
            self.sin[None, : x_BTHD.size(-3), None, :],
        )
        x1, x2 = x_BTHD.to(dtype=torch.float32).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return torch.cat((y1, y2), 3).type_as(x_BTHD)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_seq_len: int, head_dim=128):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        hdim = num_heads * head_dim
        std = 0.5 * (dim**-0.5)
        bound = (3**0.5) * std  # improved init scale by @YouJiacheng
        # merged QKV weights: suggested by many, implemented by @fernbear.bsky.social, and further improved by @YouJiacheng
        # https://x.com/hi_tysam/status/1879699187107033311
        self.qkv_w = nn.Parameter(torch.empty(3, hdim, dim).uniform_(-bound, bound))
        self.lambdas = nn.Parameter(torch.tensor([0.5, 0.5]))
        self.rotary = Rotary(head_dim, max_seq_len)
        self.c_proj = CastedLinear(hdim, dim)
        self.c_proj.weight.detach().zero_()  # zero init suggested by @Grad62304977

    def forward(self, x: Tensor, ve: Tensor | None):
        B, T = x.size(0), x.size(1)  # batch size, sequence length
        q, k, v = (
            F.linear(x, self.qkv_w.flatten(end_dim=1).type_as(x))
            .view(B, T, 3 * self.num_heads, self.head_dim)
            .chunk(3, dim=-2)
        )
        q, k = norm(q), norm(k)  # QK norm @Grad62304977
        q, k = self.rotary(q), self.rotary(k)
        if ve is not None:
            v = self.lambdas[0] * v + self.lambdas[1] * ve.view_as(v)  # @KoszarskyB & @Grad62304977
        else:  # skip mid-layers token value embeddings by @YouJiacheng
            v = self.lambdas[0] * v
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=0.12
        ).transpose(1, 2)
        y = y.contiguous().view(
            B, T, self.num_heads * self.head_dim
        )  # re-assemble all head outputs side by side
        y = self.c_proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        hdim = 4 * dim
        self.c_fc = CastedLinear(dim, hdim)
        self.c_proj = CastedLinear(hdim, dim)
        self.c_proj.weight.detach().zero_()  # zero init suggested by @Grad62304977

    def forward(self, x: Tensor):
        x = self.c_fc(x)
        x = F.relu(
            x
        ).square()  # https://arxiv.org/abs/2109.08668v2; ~1-2% better than GELU; suggested by @SKYLINEZ007 and @Grad62304977
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_seq_len: int, head_dim: int):
        super().__init__()
        self.attn = CausalSelfAttention(dim, num_heads, max_seq_len, head_dim)
        self.mlp = MLP(dim)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, x: Tensor, ve: Tensor | None, x0: Tensor):
        x = self.lambdas[0] * x + self.lambdas[1] * x0
        x = x + self.attn(norm(x), ve)
        x = x + self.mlp(norm(x))
        return x


# -----------------------------------------------------------------------------
# The main model


def next_multiple_of_n(v: float | int, *, n: int):
    return next(x for x in range(n, int(v) + 1 + n, n) if x >= v)


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        num_layers: int,
        num_heads: int,
        model_dim: int,
        max_seq_len: int,
        head_dim: int,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model_dim)
        # token value embeddings by @KoszarskyB - inspired by @Grad62304977's value residual implementation following https://arxiv.org/abs/2410.17897
        self.value_embeds = nn.ModuleList([nn.Embedding(vocab_size, model_dim) for _ in range(1)])
        self.blocks = nn.ModuleList(
            [Block(model_dim, num_heads, max_seq_len, head_dim) for _ in range(num_layers)]
        )
        # there are only 50257 unique GPT-2 tokens; we extend to nearest multiple of 128 for efficiency.
        # suggested to me by @Grad62304977. this originates from Karpathy's experiments.
        self.lm_head = CastedLinear(model_dim, next_multiple_of_n(vocab_size, n=128))
        self.lm_head.weight.detach().zero_()  # @Grad62304977
        # Add learnable skip connection weights for decoder layers
        self.skip_weights = nn.Parameter(torch.ones(num_layers // 2))

    def forward(self, input_seq: Tensor, target_seq: Tensor | None = None):
        assert input_seq.ndim == 2
        ve = [value_embed(input_seq) for value_embed in self.value_embeds]
        # the first layer gets its value embedding, the others none
        ve = [ve[0]] + [None] * (len(self.blocks) - 1)

        x = x0 = norm(self.embed(input_seq))

        # U-net design by @brendanh0gan
        skip_connections = []
        n = len(self.skip_weights)
        for i in range(len(self.blocks)):
            if i >= len(self.blocks) - n:
                x = x + self.skip_weights[i - (len(self.blocks) - n)] * skip_connections.pop()
            x = self.blocks[i](x, ve[i], x0)
            if i < n:
                skip_connections.append(x)

        x = norm(x)
        if target_seq is None:  # sampling: the logits of the last position only
            x = x[:, -1]
        logits = self.lm_head(x).float()
        # @Grad62304977 added tanh softcapping following Gemma 2 paper, @KoszarskyB reduced it from 30 to 15, @YouJiacheng shifted it by +15 (2*sigmoid(2*x)=tanh(x)+1)
        logits = 30 * torch.sigmoid(logits / 7.5)
        if target_seq is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), target_seq.view(-1))
        return loss


# -----------------------------------------------------------------------------
# Our own simple Distributed Data Loader


def _load_data_shard(file: Path):
    header = torch.from_file(str(file), False, 256, dtype=torch.int32)  # header is 256 int32
    assert header[0] == 20240520, "magic number mismatch in the data .bin file"
    assert header[1] == 1, "unsupported version"
    num_tokens = int(header[2])  # number of tokens (claimed)
    # memory-mapped: no pinned host buffer on CPU, and the page cache holds what is read
    tokens = np.memmap(file, dtype=np.uint16, mode="r", offset=256 * 4, shape=(num_tokens,))
    assert len(tokens) == num_tokens, "number of tokens read does not match header"
    return tokens


def distributed_data_generator(
    filename_pattern: str, batch_size: int, rank: int, world_size: int, split_files=False
):
    files = sorted(Path.cwd().glob(filename_pattern))
    assert files, f"no data files match {filename_pattern}"
    assert batch_size % world_size == 0
    local_batch_size = batch_size // world_size
    if split_files:  # each rank streams its own shards: 1/world_size of the data read per rank
        files = files[rank::world_size]
        rank, batch_size = 0, local_batch_size
    file_iter = iter(
        files
    )  # use itertools.cycle(files) instead if you want to do multi-epoch training
    tokens, pos = _load_data_shard(next(file_iter)), 0
    while True:
        if pos + batch_size + 1 >= len(tokens):
            tokens, pos = _load_data_shard(next(file_iter)), 0
        buf = tokens[pos + rank * local_batch_size :][: local_batch_size + 1]
        buf = torch.from_numpy(buf.astype(np.int64))
        inputs = buf[:-1]
        targets = buf[1:]
        pos += batch_size
        yield inputs, targets


# -----------------------------------------------------------------------------
# int main


@dataclass
class Hyperparameters:
    # data
    train_files = "data/fineweb10B/fineweb_train_*.bin"  # input .bin to train on
    val_files = "data/fineweb10B/fineweb_val_*.bin"  # input .bin to eval validation loss on
    val_tokens = (
        4 * 1024
    )  # how many tokens of validation data? it's important to keep this fixed for consistent comparisons
    batch_size = 8 * 32  # batch size, in tokens, across all devices
    train_seq_len = 128  # sequence length, in tokens
    val_seq_len = 256
    # model
    num_layers = 4
    num_heads = 2
    model_dim = 32
    head_dim = 16
    # optimization
    num_iterations = 120  # number of iterations to run
    warmup_iters = 10
    cooldown_iters = (
        40  # number of iterations of linear warmup/cooldown for triangular or trapezoidal schedule
    )
    target_val_loss = 0.0  # stop once the validation loss is below this (0: train to the end)
    # evaluation and logging
    val_loss_every = 30  # every how many steps to evaluate val loss? 0 for only at the end
    sample_every = 0  # every how many steps to print samples from the model (0: never)
    sample_count = 4
    sample_len = 64
    save_checkpoint = False
    compile = False


args = Hyperparameters()
# command-line overrides of the defaults above: --num_iterations=60 --val_loss_every=10 ...
parser = argparse.ArgumentParser()
for name, value in vars(Hyperparameters).items():
    if not name.startswith("_"):
        kind = (lambda s: s.lower() in ("1", "true")) if isinstance(value, bool) else type(value)
        parser.add_argument(f"--{name}", type=kind, default=value)
for name, value in vars(parser.parse_args()).items():
    setattr(args, name, value)

# torchrun sets these env variables
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
assert 8 % world_size == 0, "world_size must be a divisor of 8"
device = torch.device("cpu")
torch.set_num_threads(1)
dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))
dist.barrier()
master_process = rank == 0  # this process will do logging, checkpointing etc.

# begin logging
logfile = None
if master_process:
    run_id = uuid.uuid4()
    os.makedirs("logs", exist_ok=True)
    logfile = f"logs/{run_id}.txt"
    print(logfile)


def print0(s, console=False):
    if master_process:
        with open(logfile, "a") as f:
            if console:
                print(s)
            print(s, file=f)


# begin by printing this file (the Python code)
print0(code)
print0("=" * 100)
# log information about the hardware/software environment this is running on
print0(f"Running Python {sys.version}")
print0(f"Running PyTorch {torch.version.__version__} compiled for CUDA {torch.version.cuda}")


def nvidia_smi():
    # no nvidia-smi on a CPU box: its table, of what this process can know
    import platform  # avoid top level import

    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total_mib = int(meminfo["MemTotal"].split()[0]) // 1024
    used_mib = total_mib - int(meminfo["MemAvailable"].split()[0]) // 1024

    def row(*cells):
        return (
            "|"
            + "|".join(f" {c:<{w - 2}} " for c, w in zip(cells, (41, 24, 22), strict=True))
            + "|"
        )

    bar = "+" + "+".join("-" * w for w in (41, 24, 22)) + "+"
    rows = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        "+" + "-" * 89 + "+",
        f"| {'CPU-SMI (nvidia-smi not found)   Driver Version: none   Backend: gloo':<88}|",
        bar,
        row(
            "GPU  Name                 Persistence-M",
            "Bus-Id          Disp.A",
            "Volatile Uncorr. ECC",
        ),
        row(
            "Fan  Temp   Perf          Pwr:Usage/Cap",
            "          Memory-Usage",
            "GPU-Util  Compute M.",
        ),
        "|" + "+".join("=" * w for w in (41, 24, 22)) + "|",
    ]
    for r in range(world_size):
        rows.append(
            row(
                f"  {r}  {platform.machine()} CPU (rank {r})",
                "host",
                f"{used_mib}MiB / {total_mib}MiB",
            )
        )
        rows.append(row("N/A   N/A    N/A              N/A /  N/A", "", "     N/A     Default"))
        rows.append(bar)
    return "\n".join(rows) + "\n"


print0(nvidia_smi())
print0("=" * 100)

########################################
#    Construct model and optimizer     #
########################################

model: nn.Module = GPT(
    vocab_size=50257,
    num_layers=args.num_layers,
    num_heads=args.num_heads,
    model_dim=args.model_dim,
    max_seq_len=max(args.train_seq_len, args.val_seq_len),
    head_dim=args.head_dim,
).to(device)
for param in model.parameters():
    dist.broadcast(param.detach(), 0)

# collect the parameters to optimize
hidden_matrix_params = [
    p for n, p in model.blocks.named_parameters() if p.ndim >= 2 and "embed" not in n
]
embed_params = [p for n, p in model.named_parameters() if "embed" in n]
scalar_params = [p for p in model.parameters() if p.ndim < 2]
head_params = [model.lm_head.weight]

# init the optimizer(s)
adam_params = [
    dict(params=head_params, lr=0.008),
    dict(params=embed_params, lr=0.6),
    dict(params=scalar_params, lr=0.04),
]
# small adam epsilon by @YouJiacheng. this is an alternate method of fixing the world_size dependence
# discovered by @fernbear.bsky.social https://x.com/hi_tysam/status/1879692937589875094
optimizer1 = torch.optim.Adam(adam_params, betas=(0.8, 0.95), eps=1e-10, fused=True)
optimizer2 = Muon(hidden_matrix_params, lr=0.05, momentum=0.95, rank=rank, world_size=world_size)
optimizers = [optimizer1, optimizer2]


# learning rate schedule: warmup, stable, then cooldown
def get_lr(step: int):
    assert step <= args.num_iterations
    # 1) linear warmup for warmup_iters steps
    if step < args.warmup_iters:
        return (step + 1) / args.warmup_iters
    # 2) constant lr for a while
    elif step < args.num_iterations - args.cooldown_iters:
        return 1.0
    # 3) linear cooldown
    else:
        decay_ratio = (args.num_iterations - step) / args.cooldown_iters
        return max(decay_ratio, 0.1)


schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, get_lr) for opt in optimizers]

if args.compile:
    model: nn.Module = torch.compile(model, dynamic=False)


@torch.no_grad()
def sample(model: nn.Module, n: int, length: int) -> list[list[int]]:
    """n continuations of length tokens from the start of the validation data (no kv cache)."""
    prompt = next(distributed_data_generator(args.val_files, n * 8, 0, 1))[0].view(n, 8)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        idx = prompt[i : i + 1]
        for _ in range(length):
            logits = model(idx[:, -args.val_seq_len :])
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
        out.append(idx[0].tolist())
        print0(
            f"sample {i + 1}/{n}: {length} tokens in {1000 * (time.perf_counter() - t0):.0f}ms: "
            f"{idx[0, 8:24].tolist()}",
            console=True,
        )
    return out


########################################
#        Training and validation       #
########################################

train_loader = distributed_data_generator(
    args.train_files, args.batch_size, rank, world_size, split_files=True
)
training_time_ms = 0
# start the clock
t0 = time.perf_counter()
# begin training
train_steps = args.num_iterations
for step in range(train_steps + 1):
    last_step = step == train_steps
    # This effectively ignores timing first 10 steps, which are slower for weird reasons.
    # Alternately, and slightly more correctly in terms of benchmarking, we could do 10
    # steps with dummy data first, and then re-initialize the model and reset the loader.
    if step == 10:
        training_time_ms = 0
        t0 = time.perf_counter()
    timed_steps = float("nan") if step <= 11 else (step - 10) + 1  # <= 11 to avoid bug in val

    # --------------- VALIDATION SECTION -----------------
    if last_step or (args.val_loss_every > 0 and step % args.val_loss_every == 0):
        # stop the clock
        training_time_ms += 1000 * (time.perf_counter() - t0)
        model.eval()
        val_batch_size = world_size * args.val_seq_len
        assert args.val_tokens % val_batch_size == 0
        val_steps = args.val_tokens // val_batch_size
        val_loader = distributed_data_generator(args.val_files, val_batch_size, rank, world_size)
        val_loss = 0
        with torch.no_grad():
            for _ in range(val_steps):
                x, y = next(val_loader)
                val_loss += model(x.view(1, -1), y.view(1, -1))
        val_loss /= val_steps
        del val_loader
        dist.all_reduce(val_loss, op=dist.ReduceOp.SUM)  # gloo has no ReduceOp.AVG
        val_loss /= world_size
        print0(
            f"step:{step}/{train_steps} val_loss:{val_loss:.4f} train_time:{training_time_ms:.0f}ms step_avg:{training_time_ms / (timed_steps - 1):.2f}ms",
            console=True,
        )
        model.train()
        if args.target_val_loss and val_loss < args.target_val_loss:
            print0(
                f"val_loss < {args.target_val_loss} reached at step {step}, stopping", console=True
            )
            break
        if master_process and args.sample_every and step and step % args.sample_every == 0:
            model.eval()
            sample(model, args.sample_count, args.sample_len)
            model.train()
        # start the clock again
        t0 = time.perf_counter()

    if last_step:
        if args.save_checkpoint:
            if master_process:
                log = dict(
                    step=step,
                    code=code,
                    model=model.state_dict(),
                    optimizer1=optimizer1.state_dict(),
                )
                os.makedirs(f"logs/{run_id}", exist_ok=True)
                torch.save(log, f"logs/{run_id}/state_step{step:06d}.pt")
            # Muon's momentum buffers live on the rank that orthogonalizes the param: each rank saves its own
            torch.save(optimizer2.state_dict(), f"logs/{run_id}/muon_rank{rank}_step{step:06d}.pt")
        # the last step only has the validation loop, so break to avoid training
        break

    # --------------- TRAINING SECTION BEGIN -----------------
    inputs, targets = next(train_loader)
    for input_seq, target_seq in zip(
        inputs.split(args.train_seq_len), targets.split(args.train_seq_len), strict=True
    ):
        model(input_seq[None], target_seq[None]).backward()
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)  # gloo has no ReduceOp.AVG
        param.grad /= world_size
    # momentum warmup for Muon
    frac = min(step / 300, 1)
    for group in optimizer2.param_groups:
        group["momentum"] = (1 - frac) * 0.85 + frac * 0.95
    # step the optimizers and schedulers
    for opt, sched in zip(optimizers, schedulers, strict=True):
        opt.step()
        sched.step()
    # null the gradients
    model.zero_grad(set_to_none=True)
    # logging
    approx_time = training_time_ms + 1000 * (time.perf_counter() - t0)
    print0(
        f"step:{step + 1}/{train_steps} train_time:{approx_time:.0f}ms step_avg:{approx_time / timed_steps:.2f}ms",
        console=True,
    )

# no CUDA allocator here: the process's resident set stands in for it
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
print0(
    f"peak memory allocated: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB "
    f"reserved: {int(status['VmPeak'].split()[0]) // 1024} MiB",
    console=True,
)
dist.destroy_process_group()
