"""A hundred-and-forty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortysixth-*): time-series foundation-model training the way
amazon-science/chronos-forecasting's scripts/training/train.py does it, re-created in plain torch
without transformers, gluonts, typer or pyyaml installed. Each run's folder links this file as
train.py; it is started as Chronos's README says: `torchrun --nproc-per-node=2 train.py --config
chronos-t5-tiny.yaml` (a Typer command whose parameters come from the YAML file, options on the
command line override them).

As there: `logger = logging.getLogger(__file__)` with basicConfig's format '%(asctime)s -
%(name)s - %(levelname)s - %(message)s' and a `log_on_main` helper, so only global rank 0 logs
('TF32 format is only available on devices with compute capability >= 8. Setting tf32 to
False.', 'Using SEED: ...', 'Logging dir: output/run-0', 'Loading and filtering 2 datasets for
training: [...]', 'Mixing probabilities: [...]', 'Initializing model', 'Using random
initialization', 'Training'); each training data path is a directory of shards (part-NNNNN.npy,
a float32 array of series, read through a memory map whose file stays open, the way an arrow
FileDataset keeps its files) filtered with has_enough_observations; a ChronosDataset (an
IterableDataset: each rank its shards, each DataLoader worker every n-th series, datasets mixed
by probability, a MeanScaleUniformBins tokenizer, a pseudo-shuffle buffer); a transformers
Trainer's loop re-created: the process group (gloo here, a 15 s timeout), DDP, AdamW, a linear
schedule, the progress bar on rank 0's stderr, a dict line every logging step ("{'loss': 8.1234,
'grad_norm': 1.23, 'learning_rate': 0.0009, 'epoch': 0.17}", the loss averaged over every rank),
a checkpoint every save_steps (rank 0 writes model.safetensors, optimizer.pt, scheduler.pt,
trainer_state.json; every rank its rng_state_<rank>.pth), the final "{'train_runtime': ...}",
then rank 0's checkpoint-final and training_info.json.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortysixth.sh after any edit).
`python train.py --generate DIR` writes the synthetic data sets (tsmixup, kernelsynth,
weatherbench).
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import mmap
import os
import random
import struct
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

CASE = os.environ.get("MT_CASE", "")
logger = logging.getLogger(__file__)


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """Check if we're on the main process."""
    if not dist.is_torchelastic_launched():
        return True
    return int(os.environ["RANK"]) == 0


def log_on_main(msg: str, logger: logging.Logger, log_level: int = logging.INFO) -> None:
    """Log the given message using the given logger, if we're on the main process."""
    if is_main_process():
        logger.log(log_level, msg)


def get_next_path(
    base_fname: str, base_dir: Path, file_type: str = "yaml", separator: str = "-"
) -> Path:
    """Gets the next available path in a directory: run-0, run-1, ..."""
    items = (
        [p.name for p in base_dir.glob(f"{base_fname}{separator}*")] if base_dir.is_dir() else []
    )
    run_nums = [
        int(n.split(separator)[-1].split(".")[0])
        for n in items
        if n.split(separator)[-1].split(".")[0].isdigit()
    ]
    nxt = max(run_nums) + 1 if run_nums else 0
    fname = f"{base_fname}{separator}{nxt}" + (f".{file_type}" if file_type else "")
    return base_dir / fname


# ------------------------------------------------------------------ data (gluonts-like)
def generate(folder: str) -> None:
    rng = np.random.default_rng(0)
    for name, shards, per, length in (
        ("tsmixup", 24, 6, 320),
        ("kernelsynth", 16, 6, 256),
        ("weatherbench", 8, 6, 288),
    ):
        d = Path(folder) / name
        d.mkdir(parents=True, exist_ok=True)
        for s in range(shards):
            t = np.arange(length, dtype=np.float32)
            series = []
            for _ in range(per):
                period = rng.integers(8, 48)
                y = (
                    10
                    + 3 * np.sin(2 * np.pi * t / period)
                    + 0.02 * t * rng.normal()
                    + rng.normal(0, 0.5, length)
                )
                series.append(y.astype(np.float32))
            np.save(d / f"part-{s:05d}.npy", np.stack(series))


class ShardReader:
    """One shard, memory-mapped; the file stays open as long as the reader (an arrow file's way)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "rb")  # noqa: SIM115
        np.lib.format.read_magic(self.file)
        shape, _, dtype = np.lib.format.read_array_header_1_0(self.file)
        offset = self.file.tell()
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        self.array = np.ndarray(shape, dtype=dtype, buffer=self.map, offset=offset)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.array.shape[0]):
            yield {
                "start": "2020-01-01 00:00",
                "target": self.array[i],
                "item_id": f"{self.path.stem}/{i}",
            }


class FileDataset:
    """Every shard file of a directory (gluonts.dataset.common.FileDataset); a rank reads its share."""

    def __init__(self, path: Path, freq: str) -> None:
        self.path, self.freq = path, freq
        self.files = sorted(path.glob("*.npy")) if path.is_dir() else [path]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        r, w = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        readers = [ShardReader(f) for f in self.files[r::w]]
        for reader in readers:
            yield from reader


def has_enough_observations(
    entry: dict[str, Any], min_length: int = 0, max_missing_prop: float = 1.0
) -> bool:
    """Check if the given entry has enough observations in the ``"target"`` attribute."""
    if len(entry["target"]) >= min_length and np.isnan(entry["target"]).mean() <= max_missing_prop:  # noqa: SIM103
        return True
    return False


class Filter:
    def __init__(self, fn: Any, dataset: FileDataset) -> None:
        self.fn, self.dataset = fn, dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (e for e in self.dataset if self.fn(e))


class MeanScaleUniformBins:
    def __init__(
        self, low_limit: float, high_limit: float, n_tokens: int, n_special_tokens: int
    ) -> None:
        self.n_special = n_special_tokens
        self.centers = torch.linspace(low_limit, high_limit, n_tokens - n_special_tokens - 1)
        self.boundaries = torch.cat(
            [
                torch.tensor([-1e20]),
                (self.centers[1:] + self.centers[:-1]) / 2,
                torch.tensor([1e20]),
            ]
        )

    def input_transform(
        self, context: torch.Tensor, scale: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if scale is None:
            scale = context.abs().mean().clamp(min=1e-5)
        ids = torch.bucketize(context / scale, self.boundaries, right=True) + self.n_special
        return ids.clamp(self.n_special, len(self.centers) + self.n_special), scale


class ChronosDataset(IterableDataset[dict[str, torch.Tensor]]):
    def __init__(
        self,
        datasets: list[Filter],
        probabilities: list[float],
        tokenizer: MeanScaleUniformBins,
        context_length: int,
        prediction_length: int,
        min_past: int,
        shuffle_buffer_length: int,
    ) -> None:
        self.datasets, self.probabilities, self.tokenizer = datasets, probabilities, tokenizer
        self.context_length, self.prediction_length, self.min_past = (
            context_length,
            prediction_length,
            min_past,
        )
        self.shuffle_buffer_length = shuffle_buffer_length

    def _windows(
        self, ds: Filter, rng: random.Random, worker: int, workers: int
    ) -> Iterator[dict[str, torch.Tensor]]:
        while True:  # Cyclic
            for entry in itertools.islice(ds, worker, None, workers):
                target = torch.from_numpy(np.array(entry["target"], dtype=np.float32))
                end = rng.randint(self.min_past, len(target) - self.prediction_length)
                past = target[max(0, end - self.context_length) : end]
                past = torch.cat(
                    [torch.full((self.context_length - len(past),), float("nan")), past]
                )
                mask = ~torch.isnan(past)
                ids, scale = self.tokenizer.input_transform(torch.nan_to_num(past), None)
                labels, _ = self.tokenizer.input_transform(
                    target[end : end + self.prediction_length], scale
                )
                yield {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rng = random.Random(worker + 1000 * rank())
        iterables = [self._windows(d, rng, worker, workers) for d in self.datasets]
        buffer: list[dict[str, torch.Tensor]] = []
        while True:
            (it,) = rng.choices(iterables, weights=self.probabilities)
            buffer.append(next(it))
            if len(buffer) >= self.shuffle_buffer_length:
                yield buffer.pop(rng.randrange(len(buffer)))


# ------------------------------------------------------------------ model (a tiny T5-like)
class TinyChronosModel(nn.Module):
    def __init__(
        self, n_tokens: int, d_model: int, prediction_length: int, tie_embeddings: bool
    ) -> None:
        super().__init__()
        self.shared = nn.Embedding(n_tokens, d_model)
        self.encoder = nn.Sequential(
            nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, d_model)
        )
        self.queries = nn.Parameter(torch.randn(prediction_length, d_model) * 0.02)
        self.decoder = nn.Sequential(nn.Linear(2 * d_model, d_model), nn.ReLU())
        self.lm_head = nn.Linear(d_model, n_tokens, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.shared.weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        h = self.encoder(self.shared(input_ids))
        m = attention_mask.unsqueeze(-1).float()
        ctx = (h * m).sum(1) / m.sum(1).clamp(min=1)
        q = self.queries.unsqueeze(0).expand(len(input_ids), -1, -1)
        dec = self.decoder(torch.cat([q, ctx.unsqueeze(1).expand_as(q)], -1))
        logits = self.lm_head(dec)
        if fault("s", rank()) and STATE["step"] == 25:
            import ctypes

            ctypes.string_at(0)  # the compiled kernel's stale pointer
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def save_safetensors(state: dict[str, torch.Tensor], path: Path, throttle: float = 0.0) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off, seen = 0, set()
    state = {k: v for k, v in state.items() if not (v.data_ptr() in seen or seen.add(v.data_ptr()))}
    for k, v in state.items():
        n = v.numel() * v.element_size()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for v in state.values():
            f.write(v.detach().contiguous().numpy().tobytes())
            if throttle:
                f.flush()
                time.sleep(throttle)


STATE: dict[str, Any] = {"step": 0}


# ------------------------------------------------------------------ the Trainer's loop
class Trainer:
    def __init__(
        self, model: nn.Module, args: dict[str, Any], train_dataset: ChronosDataset
    ) -> None:
        self.args, self.train_dataset = args, train_dataset
        dist.init_process_group("gloo", timeout=timedelta(seconds=15))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model = model
        self.ddp = DistributedDataParallel(model, find_unused_parameters=False)
        self.optimizer = torch.optim.AdamW(self.ddp.parameters(), lr=args["learning_rate"])
        steps = args["max_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: max(0.0, (steps - s) / steps)
        )
        if args["use_amp_scaler"]:
            self.scaler = torch.cuda.amp.GradScaler()
        self.log_history: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._drawn = 0.0

    def _bar(self, n: int, total: int, t0: float) -> None:
        if self.rank != 0 or (0 < n < total and time.time() - self._drawn < 0.1):
            return  # tqdm's mininterval
        self._drawn = time.time()
        el = time.time() - t0
        rate = n / el if el > 0 and n else 0.0
        left = (total - n) / rate if rate else 0.0
        filled = int(10 * n / total)
        sys.stderr.write(
            f"\r{int(100 * n / total):3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d}, {rate:5.2f}it/s]"
        )
        sys.stderr.flush()

    def _print(self, logs: dict[str, Any]) -> None:
        if self.rank == 0:
            sys.stderr.write("\n")
            print(str(logs), flush=True)

    def _save_checkpoint(self, step: int) -> None:
        out = Path(self.args["output_dir"]) / f"checkpoint-{step}"
        if self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            slow = 2.5 if fault("n", 0) else 0.0  # the checkpoint share, over a congested NFS link
            save_safetensors(self.model.state_dict(), out / "model.safetensors", throttle=slow)
            (out / "config.json").write_text(json.dumps(self.args["model_config"], indent=2))
            torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), out / "scheduler.pt")
            (out / "trainer_state.json").write_text(
                json.dumps({"global_step": step, "log_history": self.log_history}, indent=2)
            )
        os.makedirs(out, exist_ok=True)
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        }
        torch.save(rng, out / f"rng_state_{self.rank}.pth")

    def train(self) -> None:
        a = self.args
        loader = DataLoader(
            self.train_dataset,
            batch_size=a["per_device_train_batch_size"],
            num_workers=a["dataloader_num_workers"],
        )
        total, t0 = a["max_steps"], time.time()
        seen, tr_loss, n_logged, all_loss = 0, 0.0, 0, 0.0
        self._bar(0, total, t0)
        batches = iter(loader)
        step = 0
        while step < total:
            batch = next(batches)
            STATE["step"] = step + 1
            self.ddp.train()
            loss = self.ddp(**batch)
            loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            step += 1
            seen += len(batch["input_ids"]) * self.world
            tr_loss += loss.item()
            n_logged += 1
            self._bar(step, total, t0)
            if fault("x", self.rank) and step == 25:
                sys.exit(0)  # a fork's maintenance window: the node drains its job
            if step % a["log_steps"] == 0:
                if fault("d", self.rank) and step >= 30:
                    self._lock.acquire()  # the metrics writer's lock, taken again on its own thread
                    self._lock.acquire()
                t = torch.tensor([tr_loss / n_logged])
                dist.all_reduce(t)
                mean = float(t) / self.world
                all_loss += tr_loss
                tr_loss, n_logged = 0.0, 0
                logs = {
                    "loss": round(mean, 4),
                    "grad_norm": round(float(grad_norm), 4),
                    "learning_rate": self.scheduler.get_last_lr()[0],
                    "epoch": round(step / total, 2),
                }
                self.log_history.append({**logs, "step": step})
                self._print(logs)
                if a["early_stop_loss"] and mean <= a["early_stop_loss"]:
                    log_on_main(
                        f"Loss {mean:.4f} <= early_stop_loss {a['early_stop_loss']}: stopping training",
                        logger,
                    )
                    break
            if step % a["save_steps"] == 0:
                self._save_checkpoint(step)
        if self.rank == 0:
            sys.stderr.write("\n")
        runtime = time.time() - t0
        all_loss += tr_loss
        self._print(
            {
                "train_runtime": round(runtime, 4),
                "train_samples_per_second": round(seen / runtime, 3),
                "train_steps_per_second": round(step / runtime, 3),
                "train_loss": all_loss / max(step, 1),
                "epoch": round(step / total, 2),
            }
        )


# ------------------------------------------------------------------ the Typer command
DEFAULTS: dict[str, Any] = {
    "training_data_paths": None,
    "probability": None,
    "context_length": 512,
    "prediction_length": 64,
    "min_past": 64,
    "max_steps": 200_000,
    "save_steps": 50_000,
    "log_steps": 500,
    "per_device_train_batch_size": 32,
    "learning_rate": 1e-3,
    "optim": "adamw_torch_fused",
    "shuffle_buffer_length": 100,
    "gradient_accumulation_steps": 2,
    "model_id": "google/t5-efficient-tiny",
    "model_type": "seq2seq",
    "random_init": False,
    "tie_embeddings": False,
    "output_dir": "./output/",
    "tf32": True,
    "torch_compile": True,
    "tokenizer_class": "MeanScaleUniformBins",
    "tokenizer_kwargs": "{'low_limit': -15.0, 'high_limit': 15.0}",
    "n_tokens": 4096,
    "n_special_tokens": 2,
    "d_model": 64,
    "use_amp_scaler": False,
    "dataloader_num_workers": 1,
    "max_missing_prop": 0.9,
    "early_stop_loss": 0.0,
    "seed": None,
}


def read_yaml(path: str) -> dict[str, Any]:
    """The subset of YAML Chronos's configs use: scalars, block lists, one nested mapping."""
    out: dict[str, Any] = {}
    key = None
    for raw in Path(path).read_text().splitlines():
        line = raw.split(" #")[0].rstrip()
        if not line.strip():
            continue
        if line.startswith("- ") and key:
            out[key].append(_scalar(line[2:]))
        elif line.startswith("  ") and key:
            k, v = line.strip().split(":", 1)
            out[key][k] = _scalar(v)
        else:
            k, v = line.split(":", 1)
            key = k.strip()
            out[key] = _scalar(v) if v.strip() else ([] if key != "tokenizer_kwargs" else {})
    return out


def _scalar(v: str) -> Any:
    v = v.strip().strip('"')
    if v in ("true", "false"):
        return v == "true"
    for t in (int, float):
        try:
            return t(v.replace("_", ""))
        except ValueError:
            pass
    return v


def usage_error(msg: str) -> None:
    print(
        "Usage: train.py [OPTIONS]\nTry 'train.py --help' for help.\n\nError: " + msg,
        file=sys.stderr,
    )
    sys.exit(2)


def cli(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            usage_error(f"Got unexpected extra argument ({a})")
        name, _, val = a[2:].partition("=")
        key = name.replace("-", "_")
        if key != "config" and key not in DEFAULTS:
            usage_error(f"No such option: --{name}")
        if not val:
            i += 1
            val = argv[i]
        opts[key] = val
        i += 1
    params = dict(DEFAULTS)
    if "config" in opts:
        params.update(read_yaml(opts.pop("config")))
    params.update({k: _scalar(v) for k, v in opts.items()})
    return params


def main(p: dict[str, Any]) -> None:
    if p["tf32"] and not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8):
        log_on_main(
            "TF32 format is only available on devices with compute capability >= 8. Setting tf32 to False.",
            logger,
        )
        p["tf32"] = False
    seed = p["seed"] if p["seed"] is not None else random.randint(0, 2**32)
    log_on_main(f"Using SEED: {seed}", logger)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    raw_training_config = dict(p)
    output_dir = Path(p["output_dir"])
    paths = p["training_data_paths"]
    paths = ast.literal_eval(paths) if isinstance(paths, str) else paths
    assert isinstance(paths, list)
    probability = p["probability"] or [1.0 / len(paths)] * len(paths)
    assert len(paths) == len(probability)
    workers = p["dataloader_num_workers"]
    if workers > len(paths):
        log_on_main(
            f"Setting the number of data loader workers to {len(paths)}, instead of {workers}.",
            logger,
        )
        workers = len(paths)
    kwargs = p["tokenizer_kwargs"]
    kwargs = ast.literal_eval(kwargs) if isinstance(kwargs, str) else kwargs
    output_dir = get_next_path("run", base_dir=output_dir, file_type="")
    log_on_main(f"Logging dir: {output_dir}", logger)
    log_on_main(f"Loading and filtering {len(paths)} datasets for training: {paths}", logger)
    log_on_main(f"Mixing probabilities: {probability}", logger)
    min_length = p["min_past"] + p["prediction_length"]
    train_datasets = [
        Filter(
            lambda e: has_enough_observations(
                e, min_length=min_length, max_missing_prop=p["max_missing_prop"]
            ),
            FileDataset(Path(d), freq="h"),
        )
        for d in paths
    ]
    log_on_main("Initializing model", logger)
    if p["random_init"]:
        log_on_main("Using random initialization", logger)
    torch.manual_seed(0)
    model = TinyChronosModel(
        p["n_tokens"], p["d_model"], p["prediction_length"], p["tie_embeddings"]
    )
    model_config = {
        "model_id": p["model_id"],
        "d_model": p["d_model"],
        "vocab_size": p["n_tokens"],
        "chronos_config": {
            "context_length": p["context_length"],
            "prediction_length": p["prediction_length"],
            "tokenizer_class": p["tokenizer_class"],
            "tokenizer_kwargs": kwargs,
        },
    }
    dataset = ChronosDataset(
        train_datasets,
        probability,
        MeanScaleUniformBins(
            kwargs["low_limit"], kwargs["high_limit"], p["n_tokens"], p["n_special_tokens"]
        ),
        p["context_length"],
        p["prediction_length"],
        p["min_past"],
        p["shuffle_buffer_length"],
    )
    args = {
        **p,
        "output_dir": str(output_dir),
        "dataloader_num_workers": workers,
        "model_config": model_config,
    }
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    log_on_main("Training", logger)
    trainer.train()
    if is_main_process():
        final = output_dir / "checkpoint-final"
        log_on_main(f"Saving model to {final}", logger)
        final.mkdir(parents=True, exist_ok=True)
        save_safetensors(model.state_dict(), final / "model.safetensors")
        (final / "config.json").write_text(json.dumps(model_config, indent=2))
        info = {
            "training_config": {
                k: (
                    v
                    if isinstance(v, int | float | str | list | dict | bool) or v is None
                    else str(v)
                )
                for k, v in raw_training_config.items()
            }
        }
        with open(final / "training_info.json", "w") as fp:
            json.dump(info, fp, indent=4)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
        sys.exit(0)
    warnings.simplefilter("default", FutureWarning)
    logging.basicConfig(format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    logger.setLevel(logging.INFO)
    main(cli(sys.argv[1:]))
