"""A seventy-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/seventyfourth-*): a tiny decoder-only LM pre-trained with pipeline
parallelism through PyTorch's own `torch.distributed.pipelining` API, in the way of torchtitan
(torchtitan/train.py + torchtitan/distributed/pipeline_parallel.py) and the PyTorch pipelining
tutorial. The launch is torchtitan's run_train.sh (tests/programs/seventyfourth_titan/run_train.sh:
`torchrun --nproc_per_node=$NGPU --rdzv_backend c10d --rdzv_endpoint=localhost:PORT
--local-ranks-filter $LOG_RANK --role rank --tee 3 -m titan_train --job.config_file CONFIG`),
the config a torchtitan TOML (tests/programs/seventyfourth_titan/debug_pp.toml) with dotted
command-line overrides (`--training.steps 60`).

What the program does, as torchtitan does it: a DeviceMesh over ("dp_replicate", "pp") on gloo,
the model split by hand into one stage per pp rank (a deep copy of the whole model with the
layers of other stages deleted, the embedding only on the first stage, norm and output only on
the last, FQNs kept), a `PipelineStage` per rank and a schedule from
`parallelism.pipeline_parallel_schedule` (GPipe, 1F1B, Interleaved1F1B with two stages a rank)
over `local_batch_size // pipeline_parallel_microbatch_size` micro-batches, the loss function on
the last stage, the gradient norm clipped over the pp group (an all-reduce), gradients
all-reduced over the dp_replicate group where there is one, torch.distributed.checkpoint (DCP)
saves every `checkpoint.interval` steps into outputs/checkpoint/step-N and a resume from the
newest one found there, the step line "step: 10  loss:  4.1234  grad_norm: ...  memory: ...
tps: ...  tflops: ...  mfu: ...%" on every rank (loss -1.0 on stages without the loss, as
torchtitan shows it), torchtitan's "[titan] %(asctime)s - %(name)s - %(levelname)s -
%(message)s" records, `@record` on main (torchrun's summary then shows the error). Data: a
byte-level token file a dp replica (data/shard_K.bin). An optional loss target
(`training.stop_loss`, broadcast from the last stage). A fault in the code is chosen by the
PPQ environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_seventyfourth.sh after any edit).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.nn import functional as F

logger = logging.getLogger()


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    mask_rank: int = -1  # this rank's attention mask gets an extra column at step 9
    hoard_rank: int = -1  # this rank keeps every micro-batch's activations until it is killed
    segv_rank: int = -1  # this rank's fused cross-entropy kernel reads address 0 at step 9
    slow_rank: int = -1  # this rank re-packs its data shard at step 10 (about 40 s)
    stuck_rank: int = -1  # this rank waits at step 12 for a prefetch thread never started
    loss_allreduce: bool = False  # the last stage alone all-reduces its loss over the world
    solo_stop: bool = False  # the loss target is checked where the loss is, never shared
    nan_rank: int = -1  # this rank's logits overflow at step 11 (its loss check raises)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "a2": Fault(mask_rank=2),
    "m1": Fault(hoard_rank=1),
    "v3": Fault(segv_rank=3),
    "s0": Fault(slow_rank=0),
    "j2": Fault(stuck_rank=2),
    "r3": Fault(loss_allreduce=True),
    "e3": Fault(solo_stop=True),
    "n3": Fault(nan_rank=3),
}
FAULT = FAULTS[os.environ.get("PPQ", "")]

WORDS = (
    *("the", "model", "reads", "a", "token", "and", "predicts", "the", "next", "one", "while"),
    *("the", "loss", "goes", "down", "slowly", "as", "every", "stage", "passes", "its"),
    *("activations", "to", "the", "next", "and", "the", "gradients", "come", "back"),
)

DEFAULTS: dict[str, dict[str, object]] = {
    "job": {"dump_folder": "./outputs", "description": "debug training"},
    "metrics": {"log_freq": 1, "disable_color_printing": True},
    "model": {"name": "llama3", "flavor": "debugmodel"},
    "optimizer": {"name": "AdamW", "lr": 8e-4, "eps": 1e-8},
    "lr_scheduler": {"warmup_steps": 2},
    "training": {
        "local_batch_size": 8,
        "seq_len": 32,
        "max_norm": 1.0,
        "steps": 30,
        "dataset": "bytes_test",
        "dataset_path": "data",
        "stop_loss": 0.0,
    },
    "parallelism": {
        "data_parallel_replicate_degree": 1,
        "pipeline_parallel_degree": 4,
        "pipeline_parallel_schedule": "1F1B",
        "pipeline_parallel_microbatch_size": 2,
    },
    "checkpoint": {"enable": True, "folder": "checkpoint", "interval": 10},
    "comm": {"init_timeout_seconds": 60, "train_timeout_seconds": 15},
}


class Color:
    def __init__(self, on: bool) -> None:
        codes = {
            "red": "\033[31m",
            "green": "\033[32m",
            "yellow": "\033[33m",
            "blue": "\033[34m",
            "magenta": "\033[35m",
            "cyan": "\033[36m",
            "orange": "\033[38;2;180;60;0m",
            "turquoise": "\033[38;2;54;234;195m",
            "reset": "\033[39m",
        }
        for name, code in codes.items():
            setattr(self, name, code if on else "")


def load_config(argv: list[str]) -> dict[str, dict[str, object]]:
    cfg = copy.deepcopy(DEFAULTS)
    args = list(argv)
    overrides: list[tuple[str, str]] = []
    while args:
        key = args.pop(0)
        if not key.startswith("--") or not args:
            raise SystemExit(
                f"usage: titan_train --job.config_file FILE [--section.key VALUE]; got {key}"
            )
        overrides.append((key[2:], args.pop(0)))
    for key, value in overrides:
        if key == "job.config_file":
            with open(value, "rb") as f:
                for section, items in tomllib.load(f).items():
                    cfg.setdefault(section, {}).update(items)
    for key, value in overrides:
        if key == "job.config_file":
            continue
        section, name = key.split(".", 1)
        old = cfg.setdefault(section, {}).get(name)
        if isinstance(old, bool):
            cfg[section][name] = value.lower() in ("1", "true", "yes")
        elif isinstance(old, int):
            cfg[section][name] = int(value)
        elif isinstance(old, float):
            cfg[section][name] = float(value)
        else:
            cfg[section][name] = value
    return cfg


def init_logger() -> None:
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    ch = logging.StreamHandler()
    ch.setLevel(logging.INFO)
    ch.setFormatter(
        logging.Formatter("[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s")
    )
    logger.addHandler(ch)
    os.environ["KINETO_LOG_LEVEL"] = "5"


# --------------------------------------------------------------------------- model


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 8
    n_heads: int = 4
    vocab_size: int = 256
    max_seq_len: int = 32


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, x_.shape[-1])
    return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.layer_id = layer_id
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bs, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bs, seqlen, self.n_heads, self.head_dim)
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5 + mask
        out = F.softmax(scores.float(), dim=-1).type_as(q) @ v
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args, layer_id)
        self.feed_forward = nn.Sequential(
            nn.Linear(args.dim, 4 * args.dim, bias=False),
            nn.SiLU(),
            nn.Linear(4 * args.dim, args.dim, bias=False),
        )
        self.attention_norm = nn.RMSNorm(args.dim)
        self.ffn_norm = nn.RMSNorm(args.dim)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


STEP = [0]  # the training step, for what the faults do


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Module | None = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer(
            "freqs_cis",
            precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len),
            persistent=False,
        )
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm: nn.Module | None = nn.RMSNorm(args.dim)
        self.output: nn.Module | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.hoard: list[torch.Tensor] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        seqlen = h.shape[1]
        rank = dist.get_rank()
        width = seqlen + 1 if rank == FAULT.mask_rank and STEP[0] >= 9 else seqlen
        mask = torch.full((seqlen, width), float("-inf")).triu(1)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, mask)
        if rank == FAULT.hoard_rank and STEP[0] >= 3:
            # kept "for the activation statistics": 32 MiB a micro-batch, never freed
            self.hoard.append(torch.ones(8 * 1024 * 1024))
            if len(self.hoard) >= 12:  # the OOM killer's choice: SIGKILL, no traceback
                os.kill(os.getpid(), signal.SIGKILL)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
            if rank == FAULT.nan_rank and STEP[0] >= 11:
                h = h * float("inf")
        return h


def pipeline_module_split(whole: Transformer, stage_idx: int, num_stages: int) -> Transformer:
    """torchtitan's manual split: a deep copy with the other stages' layers deleted."""
    n = whole.args.n_layers
    per = n // num_stages
    start, stop = stage_idx * per, (stage_idx + 1) * per
    model = copy.deepcopy(whole)
    if stage_idx != 0:
        model.tok_embeddings = None
    for name in list(model.layers.keys()):
        if not start <= int(name) < stop:
            del model.layers[name]
    if stage_idx != num_stages - 1:
        model.norm = None
        model.output = None
    return model


# --------------------------------------------------------------------------- data


def make_data(folder: str) -> None:
    import random

    rng = random.Random(0)
    os.makedirs(folder, exist_ok=True)
    for k in range(2):
        words = [rng.choice(WORDS) for _ in range(60_000)]
        Path(folder, f"shard_{k}.bin").write_bytes(" ".join(words).encode()[: 1600 * 8 * 33])
    print(f"wrote 2 shards to {folder}")


class ByteDataLoader:
    def __init__(self, path: str, batch: int, seq: int, dp_rank: int) -> None:
        self.path = path
        self.batch, self.seq = batch, seq
        logger.info(f"Preparing bytes_test dataset from {path}")
        self.data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
        self.pos = 0
        self.dp_rank = dp_rank

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch * (self.seq + 1)
        if self.pos + n > len(self.data):
            raise StopIteration
        chunk = self.data[self.pos : self.pos + n].view(self.batch, self.seq + 1)
        self.pos += n
        if FAULT.slow_rank == dist.get_rank() and STEP[0] == 10:
            for k in range(1, 11):
                logger.warning(
                    f"Re-packing shard {self.path} into sequences of {self.seq + 1} ({k}/10)"
                )
                time.sleep(4)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


# --------------------------------------------------------------------------- training


def clip_grad_norm_(
    params: list[torch.Tensor], max_norm: float, pp_group: dist.ProcessGroup
) -> torch.Tensor:
    """torchtitan's clip_grad_norm_ with pp: the local norm's square all-reduced over pp."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.stack([g.norm(2) for g in grads]).norm(2) if grads else torch.zeros(())
    total = total**2
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
    total = total**0.5
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == FAULT.segv_rank and STEP[0] >= 9:
        ctypes.string_at(0)  # the fused kernel's null read: SIGSEGV
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


@record
def main() -> None:
    init_logger()
    if sys.argv[1:2] == ["--make-data"]:
        make_data(sys.argv[2])
        return
    cfg = load_config(sys.argv[1:])
    color = Color(not cfg["metrics"]["disable_color_printing"])
    tr, par, ck, comm = cfg["training"], cfg["parallelism"], cfg["checkpoint"], cfg["comm"]
    logger.info(f"Starting job: {cfg['job']['description']}")
    world_size = int(os.environ["WORLD_SIZE"])
    pp, dp = int(par["pipeline_parallel_degree"]), int(par["data_parallel_replicate_degree"])
    assert dp * pp == world_size, (
        f"Invalid parallel dims: dp_replicate({dp}) * dp_shard(1) * cp(1) * tp(1) * pp({pp}) "
        f"!= WORLD_SIZE({world_size})"
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=comm["init_timeout_seconds"]))
    dims = [(n, d) for n, d in (("dp_replicate", dp), ("pp", pp)) if d > 1]
    logger.info(
        f"Building {len(dims)}-D device mesh with {[n for n, _ in dims]}, {[d for _, d in dims]}"
    )
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp_replicate", "pp"))
    pp_mesh, dp_mesh = mesh["pp"], mesh["dp_replicate"]
    pp_rank, dp_rank = pp_mesh.get_local_rank(), dp_mesh.get_local_rank()
    pp_group = pp_mesh.get_group()
    dp_group = dp_mesh.get_group() if dp > 1 else None
    gc.disable()
    gc.collect(1)
    logger.info("[GC] Initial GC collection took 0.00 seconds")
    torch.manual_seed(0)

    data_path = os.path.join(tr["dataset_path"], f"shard_{dp_rank}.bin")
    loader = ByteDataLoader(data_path, int(tr["local_batch_size"]), int(tr["seq_len"]), dp_rank)

    margs = ModelArgs(max_seq_len=int(tr["seq_len"]))
    logger.info(f"Building {cfg['model']['name']} {cfg['model']['flavor']} with {margs}")
    with torch.device("cpu"):
        whole = Transformer(margs)
    n_params = sum(p.numel() for p in whole.parameters())
    logger.info(
        f"{color.blue}Model {cfg['model']['name']} {cfg['model']['flavor']} {color.red}size: {n_params:,} total parameters{color.reset}"
    )

    schedule_name = str(par["pipeline_parallel_schedule"])
    looped = schedule_name == "Interleaved1F1B"
    stages_per_rank = 2 if looped else 1
    num_stages = pp * stages_per_rank
    stage_ids = [pp_rank + s * pp for s in range(stages_per_rank)]
    parts, stages = [], []
    per = margs.n_layers // num_stages
    for sid in stage_ids:
        part = pipeline_module_split(whole, sid, num_stages)
        logger.info(
            f"PP rank {pp_rank} is building stage_idx {sid} with start_layer "
            f"{f'layers.{sid * per}' if sid else None}, stop_layer "
            f"{f'layers.{(sid + 1) * per}' if sid < num_stages - 1 else None}"
        )
        parts.append(part)
        stages.append(PipelineStage(part, sid, num_stages, torch.device("cpu"), group=pp_group))
    del whole
    has_first = stages[0].is_first
    has_last = any(s.is_last for s in stages)
    mb_size = int(par["pipeline_parallel_microbatch_size"])
    batch = int(tr["local_batch_size"])
    n_microbatches = batch // mb_size
    if batch % mb_size != 0:
        raise ValueError(
            f"Batch size {batch} must be divisible by number of microbatches {n_microbatches}. "
            "Update the config arguments for either batch_size or pipeline_parallel_microbatch_size."
        )
    if n_microbatches < num_stages:
        logger.warning(
            f"Number of microbatches ({n_microbatches}) is less than the total number of stages "
            f"({num_stages}) which may result in a bubble in the pipeline."
        )
    schedule_cls = {
        "GPipe": ScheduleGPipe,
        "1F1B": Schedule1F1B,
        "Interleaved1F1B": ScheduleInterleaved1F1B,
    }[schedule_name]
    if looped:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=cross_entropy_loss)
    else:
        schedule = schedule_cls(
            stages[0], n_microbatches=n_microbatches, loss_fn=cross_entropy_loss
        )
    logger.info(
        f"Using pipeline schedule {schedule_name} with {n_microbatches} microbatches and {num_stages} stages."
    )

    params = [p for part in parts for p in part.parameters()]
    optim = torch.optim.AdamW(
        params, lr=float(cfg["optimizer"]["lr"]), eps=float(cfg["optimizer"]["eps"])
    )
    warmup = int(cfg["lr_scheduler"]["warmup_steps"])
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    logger.info("Peak FLOPS used for computing MFU: 3.120e+14")
    logger.info(f"{color.blue}CPU memory usage for model: {rss_gib():.2f}GiB(0.00%){color.reset}")

    steps = int(tr["steps"])
    folder = Path(cfg["job"]["dump_folder"], ck["folder"])
    step = 0
    if ck["enable"]:
        logger.info(f"Checkpointing active. Checkpoints will be loaded from and saved to {folder}")
        done = sorted(
            (
                int(p.name.split("-")[1])
                for p in folder.glob("step-*")
                if (p / ".metadata").exists()
            ),
        )
        if done:
            step = done[-1]
            cid = folder / f"step-{step}"
            logger.info(f"Loading the checkpoint from {cid}.")
            t0 = time.perf_counter()
            state = {"model": {k: v for part in parts for k, v in part.state_dict().items()}}
            dcp.load(state, checkpoint_id=str(cid))
            for part in parts:
                part.load_state_dict(
                    {k: v for k, v in state["model"].items() if k in part.state_dict()}
                )
            logger.info(
                f"Finished loading the checkpoint in {time.perf_counter() - t0:.2f} seconds."
            )
    logger.info(
        f"Trainer is initialized with local batch size {batch}, global batch size {batch * dp}, "
        f"gradient accumulation steps 1, sequence length {tr['seq_len']}, total steps {steps} "
        f"(warmup {warmup})"
    )
    logger.info(f"Training starts at step {step + 1}")
    stop_loss = float(tr["stop_loss"])
    log_freq = int(cfg["metrics"]["log_freq"])
    ntokens_since, t_last = 0, time.perf_counter()
    first_step = True
    while step < steps:
        step += 1
        STEP[0] = step
        gc_t0 = time.perf_counter()
        if step > 1 and step % 50 == 0:
            gc.collect(1)
            logger.info(
                f"[GC] Performing periodical GC collection took {time.perf_counter() - gc_t0:.2f} seconds"
            )
        try:
            inputs, labels = next(loader)
        except StopIteration:
            logger.warning(f"Ran out of data; last step was {step - 1}.")
            break
        if FAULT.stuck_rank == dist.get_rank() and step == 12:
            prefetched = threading.Event()  # its prefetch thread was never started
            prefetched.wait()
        ntokens_since += inputs.numel()
        optim.zero_grad()
        losses: list[torch.Tensor] = []
        targets = labels if has_last else None
        if has_first:
            schedule.step(inputs, target=targets, losses=losses)
        elif has_last:
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        if dp_group is not None:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_group)
                    p.grad /= dp
        grad_norm = clip_grad_norm_(params, float(tr["max_norm"]), pp_group)
        optim.step()
        sched.step()
        loss = torch.mean(torch.stack(losses)).detach() if has_last else torch.tensor(-1.0)
        if has_last and not torch.isfinite(loss):
            raise RuntimeError(f"Loss is {loss.item()} at step {step}; the run diverged.")
        if FAULT.loss_allreduce and has_last:
            dist.all_reduce(loss)  # the global average loss, for the log
            loss /= world_size
        if first_step:
            first_step = False
            dist.barrier()
            dist.distributed_c10d._set_pg_timeout(
                timedelta(seconds=comm["train_timeout_seconds"]), None
            )
            for g in {pp_group, dp_group} - {None}:
                dist.distributed_c10d._set_pg_timeout(
                    timedelta(seconds=comm["train_timeout_seconds"]), g
                )
        if step == 1 or step % log_freq == 0:
            dt = time.perf_counter() - t_last
            tps = ntokens_since / dt
            tflops = 6 * n_params * tps / 1e12
            logger.info(
                f"{color.red}step: {step:2}  {color.green}loss: {loss.item():7.4f}  "
                f"{color.orange}grad_norm: {grad_norm.item():7.4f}  "
                f"{color.turquoise}memory: {rss_gib():5.2f}GiB({rss_gib() / 125.7 * 100:.2f}%)  "
                f"{color.blue}tps: {round(tps):,}  {color.cyan}tflops: {tflops:,.2f}  "
                f"{color.magenta}mfu: {tflops * 1e12 / 3.12e14 * 100:.2f}%{color.reset}"
            )
            ntokens_since, t_last = 0, time.perf_counter()
        if ck["enable"] and step % int(ck["interval"]) == 0:
            logger.info("Saving the checkpoint (or staging if async is enabled).")
            t0 = time.perf_counter()
            state = {"model": {k: v for part in parts for k, v in part.state_dict().items()}}
            dcp.save(state, checkpoint_id=str(folder / f"step-{step}"))
            logger.info(
                "Finished saving the checkpoint (or staging if async is enabled)"
                f"in {time.perf_counter() - t0:.2f} seconds."
            )
        if stop_loss > 0:
            if FAULT.solo_stop:
                stop = has_last and loss.item() < stop_loss
            else:  # the last pp rank's loss, to every rank of the pipeline
                shared = loss.clone().reshape(1)
                dist.broadcast(shared, group=pp_group, group_src=pp - 1)
                stop = shared.item() < stop_loss
                loss = shared[0]
            if stop:
                logger.info(
                    f"Loss {loss.item():.4f} is below the target {stop_loss:.4f}, stopping."
                )
                break
    logger.info("Sleeping 2 seconds for other ranks to complete")
    time.sleep(2)
    logger.info("Training completed")
    dist.destroy_process_group()
    logger.info("Process group destroyed.")


if __name__ == "__main__":
    main()
