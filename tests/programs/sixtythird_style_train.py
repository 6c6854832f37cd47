"""A sixty-third training-program style for the generalisation fixtures (tests/fixtures/real/
sixtythird-*): a tiny GPT pre-trained from scratch the way Lightning-AI/litgpt's `litgpt
pretrain` does it, on Lightning Fabric. `python sixtythird_style_train.py pretrain --config
tiny.yaml --devices N [--train.max_tokens ...] [--resume auto]`, as `litgpt pretrain` is run on
one machine: `fabric.launch()` is the launcher (Fabric's subprocess launcher: rank 0 is this
process, ranks 1.. its children re-running the same command line). `L.Fabric(accelerator="cpu",
devices=N, num_nodes=M, strategy=DDPStrategy(process_group_backend="gloo", timeout=15 s),
loggers=CSVLogger)`; the config dump (pprint of the hyperparameters) and every progress line by
`fabric.print` on rank 0 only: "Measured TFLOPs", litgpt's iteration lines ("Epoch 1 | iter 8
step 4 | loss train: 4.512, val: n/a | iter time: 40.12 ms (step) remaining time: 0:00:05"),
validation every `eval.interval` steps ("Validating ...", "iter 16: val loss 3.8123, val time:
...") and `fabric.save` of the state to out/pretrain/step-00000010/lit_model.pth, resumable with
`--resume auto` (the latest step-* folder) or a path. The data is a litdata-like optimized
dataset on disk (index.json and chunk-0-K.bin files of uint16 tokens), streamed: each rank
reads every world-th chunk, one window of block_size + 1 tokens at a time, cycled.

One real fault per value of the TQ_CASE environment variable (short codes, never printed);
the others are in what a run is given (its config, its out folder, its data folder).
Re-capture with tests/fixtures/real/capture_sixtythird.sh after any edit.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import pprint
import signal
import subprocess
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.fabric.loggers import CSVLogger
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.utilities.throughput import ThroughputMonitor, measure_flops
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

CASE = os.environ.get("TQ_CASE", "")
PROCESS_START = time.perf_counter()


def case_rank(code: str) -> int:
    """The rank a fault code names ('m1' -> 1), -1 when the code is another fault's."""
    if CASE[:1] == code and CASE[1:].isdigit():
        return int(CASE[1:])
    return -1


# ----------------------------------------------------------------------------- config
@dataclass
class Config:
    name: str = "tiny-gpt"
    block_size: int = 64
    vocab_size: int = 96
    padded_vocab_size: int = 128
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


@dataclass
class TrainArgs:
    save_interval: int = 10
    log_interval: int = 1
    global_batch_size: int = 16
    micro_batch_size: int = 4
    max_tokens: int = 10240
    max_norm: float = 1.0
    lr_warmup_steps: int = 4
    min_lr: float = 4e-4
    stop_val_loss: float = 0.0  # a user addition: stop when validation gets under this
    max_seconds: float = 0.0  # a user addition: the job's time budget, from the process start


@dataclass
class EvalArgs:
    interval: int = 8
    max_iters: int = 4
    initial_validation: bool = False
    final_validation: bool = True


@dataclass
class Hparams:
    model_name: str = "tiny-gpt"
    model_config: dict[str, Any] = field(default_factory=lambda: asdict(Config()))
    out_dir: str = "out/pretrain"
    precision: str = "32-true"
    resume: str = "False"
    data: dict[str, Any] = field(
        default_factory=lambda: {"data_path": "data/tiny", "num_workers": 0}
    )
    train: dict[str, Any] = field(default_factory=lambda: asdict(TrainArgs()))
    eval: dict[str, Any] = field(default_factory=lambda: asdict(EvalArgs()))
    optimizer: dict[str, Any] = field(
        default_factory=lambda: {"class_path": "torch.optim.AdamW", "init_args": {"lr": 4e-3}}
    )
    devices: int = 2
    num_nodes: int = 1
    tokenizer_dir: str | None = None
    logger_name: str = "csv"
    seed: int = 1337


def parse(argv: list[str]) -> Hparams:
    """`pretrain [MODEL] --config FILE --devices N --train.max_tokens T ...` as litgpt takes it."""
    if not argv or argv[0] != "pretrain":
        sys.exit("usage: sixtythird_style_train.py pretrain [--config FILE] [--key value ...]")
    argv = argv[1:]
    h = Hparams()
    if argv and not argv[0].startswith("--"):
        h.model_name = argv.pop(0)
    opts: dict[str, str] = {}
    while argv:
        key = argv.pop(0).removeprefix("--")
        if "=" in key:
            key, value = key.split("=", 1)
        else:
            value = argv.pop(0)
        opts[key] = value
    if "config" in opts:
        for key, value in yaml.safe_load(Path(opts.pop("config")).read_text()).items():
            if isinstance(value, dict):
                getattr(h, key).update(value)
            else:
                setattr(h, key, value)
    for key, value in opts.items():
        head, _, tail = key.partition(".")
        old = getattr(h, head)
        if tail:
            old[tail] = (
                type(old[tail])(yaml.safe_load(value)) if old.get(tail) is not None else value
            )
        else:
            setattr(h, head, type(old)(yaml.safe_load(value)) if old is not None else value)
    return h


# ----------------------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.norm_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.max_seq_length = config.block_size
        self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        out: torch.Tensor = self.lm_head(self.ln_f(x))
        return out


def fused_rmsnorm_(x: torch.Tensor) -> None:
    """The fused norm kernel a user compiled for speed (here: it reads address 0)."""
    ctypes.string_at(0)


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------- data
def make_data(root: Path, chunks: int = 6, chunk_tokens: int = 8192) -> None:
    """A litdata-like optimized dataset: index.json and chunk-0-K.bin of uint16 tokens, a
    train and a val split of a seeded synthetic token stream (repeated phrases with noise)."""
    gen = torch.Generator().manual_seed(0)
    phrases = [torch.randint(3, 96, (int(n),), generator=gen) for n in torch.randint(5, 17, (40,))]
    for split, n in (("train", chunks), ("val", 3)):
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        entries = []
        for k in range(n):
            toks: list[int] = []
            while len(toks) < chunk_tokens:
                toks += phrases[int(torch.randint(0, len(phrases), (1,), generator=gen))].tolist()
                toks.append(1)
            name = f"chunk-0-{k}.bin"
            (d / name).write_bytes(array("h", toks[:chunk_tokens]).tobytes())
            entries.append(
                {"filename": name, "chunk_size": chunk_tokens, "chunk_bytes": 2 * chunk_tokens}
            )
        (d / "index.json").write_text(
            json.dumps({"chunks": entries, "config": {"data_format": ["no_header_tensor:16"]}})
        )


class StreamingDataset(IterableDataset[torch.Tensor]):
    """Streams windows of block_size + 1 tokens from the chunks of an optimized dataset: each
    rank reads every world-th chunk (as litdata assigns chunks to ranks), lazily, one chunk file
    after the other."""

    def __init__(self, input_dir: Path, block_size: int, rank: int, world: int) -> None:
        self.input_dir = input_dir
        self.block_size = block_size
        self.rank = rank
        self.world = world
        index = json.loads((input_dir / "index.json").read_text())
        self.chunks = [c["filename"] for c in index["chunks"]][rank::world]
        self.fetched: set[str] = set()

    def _read_chunk(self, name: str) -> torch.Tensor:
        path = self.input_dir / name
        if case_rank("s") == self.rank and name not in self.fetched and name.endswith("-3.bin"):
            # the chunk is not in the local cache yet: it comes from the slow object store
            for k in range(1, 9):
                time.sleep(5)
                print(
                    f"[rank {self.rank}] Waiting for {name} to be downloaded from the remote "
                    f"storage ({5 * k}s) ...",
                    flush=True,
                )
        self.fetched.add(name)
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.int16).long()
        if (
            case_rank("v") == self.rank
            and self.input_dir.name == "train"
            and name.endswith("-3.bin")
        ):
            # this chunk was re-tokenized with the new tokenizer (its added tokens from 200 up)
            data = data + 200 * (data == 1)
        return data

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        chunks = self.chunks
        if info is not None:
            chunks = chunks[info.id :: info.num_workers]
        n = self.block_size + 1
        served = 0
        for name in chunks:
            data = self._read_chunk(name)
            for i in range(0, len(data) - n + 1, n):
                served += 1
                if info is not None and case_rank("k") == self.rank and served == 60:
                    # the worker's read-ahead buffers outgrow the container: the OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
                yield data[i : i + n]


class CycleIterator:
    """litgpt's CycleIterator: restarts the loader at its end and counts the epochs."""

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable
        self.epoch = 0
        self._iterator: Any = None

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.iterable)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.iterable)
            self.epoch += 1
            return next(self._iterator)

    def __iter__(self) -> CycleIterator:
        return self


# ----------------------------------------------------------------------------- training
def get_lr(lr: float, it: int, warmup: int, max_iters: int, min_lr: float) -> float:
    if it < warmup:
        return lr * it / warmup
    ratio = (it - warmup) / max(1, max_iters - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, ratio))) * (lr - min_lr)


@torch.no_grad()
def validate(
    fabric: L.Fabric, model: nn.Module, loader: DataLoader, max_iters: int, verbose: bool = True
) -> torch.Tensor:
    fabric.barrier()
    if verbose:
        fabric.print("Validating ...")
    model.eval()
    losses = []
    for k, batch in enumerate(loader):
        if k >= max_iters:
            break
        input_ids = batch[:, 0 : model.max_seq_length].contiguous().long()
        targets = batch[:, 1 : model.max_seq_length + 1].contiguous().long()
        losses.append(chunked_cross_entropy(model(input_ids), targets))
    val_loss = torch.stack(losses).mean()
    model.train()
    fabric.barrier()
    return val_loss


def save_hyperparameters(fabric: L.Fabric, h: Hparams, folder: Path) -> None:
    if case_rank("p") == fabric.global_rank:
        # the user's hook records the code version with the checkpoint: a `git describe` run
        # through the site's credential helper, which waits for a password nobody types
        subprocess.run(
            [sys.executable, "-c", "import time; time.sleep(3600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            check=False,
        )
    if fabric.global_rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hyperparameters.yaml").write_text(yaml.safe_dump(asdict(h)))
        (folder / "model_config.yaml").write_text(yaml.safe_dump(h.model_config))


def save_checkpoint(
    fabric: L.Fabric, state: dict[str, Any], h: Hparams, checkpoint_file: Path
) -> None:
    save_hyperparameters(fabric, h, checkpoint_file.parent)
    fabric.print(f"Saving checkpoint to {str(checkpoint_file)!r}")
    if CASE == "z":
        # "only the main process writes files": but fabric.save is a collective (its barrier)
        if fabric.global_rank == 0:
            fabric.save(checkpoint_file, state)
    else:
        fabric.save(checkpoint_file, state)


def find_resume_path(resume: str, out_dir: Path) -> Path | None:
    if resume in ("False", "false", ""):
        return None
    if resume not in ("auto", "True", "true"):
        return Path(resume)
    return max(
        out_dir.rglob("step-*/*.pth"), key=lambda p: int(p.parent.name.split("-")[1]), default=None
    )


def fit(
    fabric: L.Fabric,
    h: Hparams,
    state: dict[str, Any],
    train_loader: DataLoader,
    val_loader: DataLoader,
    config: Config,
) -> bool:
    model = state["model"]
    optimizer = state["optimizer"]
    train = TrainArgs(**h.train)
    ev = EvalArgs(**h.eval)
    rank = fabric.global_rank
    if ev.initial_validation:
        val_loss: Any = f"{validate(fabric, model, val_loader, ev.max_iters):.3f}"
    else:
        fabric.print("Verifying settings ...")
        validate(fabric, model, val_loader, max_iters=2, verbose=False)  # sanity check
        val_loss = "n/a"

    throughput = ThroughputMonitor(fabric, window_size=5)
    with torch.device("meta"):
        meta_model = GPT(config)
        x = torch.randint(0, 1, (train.micro_batch_size, meta_model.max_seq_length))
        measured_flops = measure_flops(
            meta_model, lambda: meta_model(x), lambda y: chunked_cross_entropy(y, x)
        )
        fabric.print(f"Measured TFLOPs: {measured_flops * fabric.world_size / 1e12:.2f}")

    accum = train.global_batch_size // (fabric.world_size * train.micro_batch_size)
    max_tokens_per_device = train.max_tokens // fabric.world_size
    tokens_per_iter = train.micro_batch_size * model.max_seq_length
    max_iters = max_tokens_per_device // tokens_per_iter
    log_iter_interval = train.log_interval * accum
    initial_iter = state["iter_num"]
    lr0 = h.optimizer["init_args"]["lr"]
    single_pass = CASE == "u"  # the user's loop: one pass over the stream, no CycleIterator
    train_iterator: Any = iter(train_loader) if single_pass else CycleIterator(train_loader)
    losses: list[float] = []
    hoard: list[torch.Tensor] = []
    fabric.barrier()
    total_t0 = time.perf_counter()

    for train_data in train_iterator:
        if state["iter_num"] >= max_iters:
            break
        lr = get_lr(lr0, state["iter_num"], train.lr_warmup_steps * accum, max_iters, train.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        state["iter_num"] += 1
        iter_t0 = time.perf_counter()
        input_ids = train_data[:, 0 : model.max_seq_length].contiguous().long()
        targets = train_data[:, 1 : model.max_seq_length + 1].contiguous().long()

        if case_rank("m") == rank:
            # the packed-sequence cache keeps every batch's activations for the next epoch
            hoard.append(torch.ones(24 * 1024 * 1024 // 4 * 4, dtype=torch.float32))
            if len(hoard) >= 10:
                os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
        if case_rank("n") == rank and state["iter_num"] == 7:
            fused_rmsnorm_(input_ids.float())

        is_accumulating = state["iter_num"] % accum != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            logits = model(input_ids)
            loss = chunked_cross_entropy(logits, targets)
            fabric.backward(loss / accum)
        losses.append(loss.item())
        if not is_accumulating:
            fabric.clip_gradients(model, optimizer, max_norm=train.max_norm)
            optimizer.step()
            optimizer.zero_grad()
            state["step_count"] += 1

        if (
            not is_accumulating
            and train.max_seconds
            and time.perf_counter() - PROCESS_START > train.max_seconds
        ):
            print(
                f"Reached the time budget of {train.max_seconds:.0f} s at iter {state['iter_num']}: stopping.",
                flush=True,
            )
            return False

        if state["iter_num"] % log_iter_interval == 0:
            train_loss = sum(losses[-accum:]) / len(losses[-accum:])
            t1 = time.perf_counter()
            throughput.update(
                time=t1 - total_t0,
                flops=measured_flops * log_iter_interval,
                batches=state["iter_num"],
                samples=state["iter_num"] * train.micro_batch_size,
                lengths=state["iter_num"] * train.micro_batch_size * model.max_seq_length,
            )
            remaining = (
                (t1 - total_t0)
                / (state["iter_num"] - initial_iter)
                * (max_iters - state["iter_num"])
            )
            epoch = 0 if single_pass else train_iterator.epoch
            if isinstance(val_loss, float):
                val_loss = f"{val_loss:.3f}"
            fabric.print(
                f"Epoch {epoch + 1} | iter {state['iter_num']} step {state['step_count']} |"
                f" loss train: {train_loss:.3f},"
                f" val: {val_loss} |"
                f" iter time: {(t1 - iter_t0) * 1000:.2f} ms"
                f"{' (step)' if not is_accumulating else ''}"
                f" remaining time: {timedelta(seconds=int(remaining))!s}"
            )
            metrics = {"loss": train_loss, "iter": state["iter_num"], "step": state["step_count"]}
            metrics.update(throughput.compute())
            fabric.log_dict(metrics, step=state["iter_num"] - 1)

        if not is_accumulating and state["step_count"] % ev.interval == 0:
            t0 = time.perf_counter()
            val = validate(fabric, model, val_loader, max_iters=ev.max_iters)
            if CASE == "a":  # the stop is voted: the mean validation loss of all ranks
                val = fabric.all_reduce(val, reduce_op="mean")
            val_loss = val.item()
            td = time.perf_counter() - t0
            fabric.print(
                f"iter {state['iter_num']}: val loss {val_loss:.4f}, val time: {td * 1000:.2f} ms"
            )
            fabric.log_dict(
                {"val_loss": val_loss, "val_ppl": math.exp(val_loss)}, step=state["iter_num"] - 1
            )
            fabric.barrier()
            if train.stop_val_loss and val_loss < train.stop_val_loss:
                print(
                    f"Validation loss {val_loss:.4f} is below {train.stop_val_loss}: "
                    f"stopping at iter {state['iter_num']}.",
                    flush=True,
                )
                return False

        if (
            train.save_interval
            and not is_accumulating
            and state["step_count"] % train.save_interval == 0
        ):
            save_checkpoint(
                fabric,
                state,
                h,
                Path(h.out_dir) / f"step-{state['step_count']:08d}" / "lit_model.pth",
            )
    return True


def main(fabric: L.Fabric, h: Hparams) -> None:
    config = Config(**h.model_config)
    out_dir = Path(h.out_dir)
    if fabric.global_rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    fabric.seed_everything(h.seed)
    t0 = time.perf_counter()
    with fabric.init_module(empty_init=False):
        model = GPT(config)
    fabric.print(f"Time to instantiate model: {time.perf_counter() - t0:.02f} seconds.")
    fabric.print(f"Total parameters: {num_parameters(model):,}")
    model = fabric.setup(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=h.optimizer["init_args"]["lr"], weight_decay=0.1
    )
    optimizer = fabric.setup_optimizers(optimizer)

    data_path = Path(h.data["data_path"])
    workers = int(h.data.get("num_workers", 0))
    rank, world = fabric.global_rank, fabric.world_size
    train_set = StreamingDataset(data_path / "train", config.block_size, rank, world)
    val_set = StreamingDataset(data_path / "val", config.block_size, rank, world)
    train_loader = DataLoader(
        train_set, batch_size=TrainArgs(**h.train).micro_batch_size, num_workers=workers
    )
    val_loader = DataLoader(val_set, batch_size=TrainArgs(**h.train).micro_batch_size)
    train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)

    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0}
    resume = find_resume_path(h.resume, out_dir)
    if resume:
        fabric.print(f"Resuming training from {resume}")
        fabric.load(resume, state)

    train_time = time.perf_counter()
    finished = fit(fabric, h, state, train_loader, val_loader, config)
    if finished and EvalArgs(**h.eval).final_validation:
        val_loss = validate(fabric, model, val_loader, max_iters=EvalArgs(**h.eval).max_iters)
        fabric.print(
            f"Final evaluation | val loss: {val_loss.item():.3f} | val ppl: {math.exp(val_loss):.3f}"
        )
    if finished:
        save_checkpoint(fabric, state, h, out_dir / "final" / "lit_model.pth")

    total_tokens = (
        state["iter_num"] * TrainArgs(**h.train).micro_batch_size * model.max_seq_length * world
    )
    elapsed = time.perf_counter() - train_time
    separator = "-" * 40
    fabric.print(separator)
    fabric.print("| Performance")
    fabric.print(f"| - Total tokens  : {total_tokens:,}")
    fabric.print(f"| - Training Time : {elapsed:.2f} s")
    fabric.print(f"| - Tok/sec       : {total_tokens / elapsed:.2f} tok/s")
    fabric.print("| " + "-" * 40)
    fabric.print(separator)


def setup(h: Hparams) -> None:
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=15))
    logger = CSVLogger(root_dir=Path(h.out_dir) / "logs", name="csv")
    fabric = L.Fabric(
        accelerator="cpu",
        devices=h.devices,
        num_nodes=h.num_nodes,
        strategy=strategy,
        precision=h.precision,  # type: ignore[arg-type]
        loggers=[logger],
    )
    fabric.launch()
    fabric.print(pprint.pformat(asdict(h)))
    main(fabric, h)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-data"]:
        make_data(Path(sys.argv[2]), chunks=int(sys.argv[3]) if sys.argv[3:] else 6)
        sys.exit(0)
    torch.set_num_threads(1)
    setup(parse(sys.argv[1:]))
