"""A hundred-and-thirty-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtyninth-*): instruction fine-tuning with fairseq2's recipes
(0.4), re-created in plain torch in one module without fairseq2, fairseq2n or rich installed.
Each node's folder has a site/ on PYTHONPATH holding a fairseq2 package whose recipes module is
this file, a fairseq2n module (the native extension: its data-pipeline helpers) and a `fairseq2`
console script in bin/ (as pip installs it). Started as fairseq2's docs start a recipe on a
cluster without Slurm: one torchrun agent per node, `torchrun --nnodes=2 --node-rank=K
--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:PORT --rdzv-id=sft --no-python
fairseq2 lm instruction_finetune OUTPUT_DIR --config dataset=/shared/sft_data ...`.

As there: setup_basic_logging puts a RichHandler ('%(name)s - %(message)s') on the console of
rank 0 only (stderr, 80 columns when not a terminal: the time column, blank when the second did
not change, the level padded to 8, the message wrapped at column 29, every line padded to 80),
and the others log nowhere until the environment bootstrapper has made the sweep directory
OUTPUT_DIR/ps_<preset>.ws_<world size>.<hash> and DistributedLoggingInitializer added a
FileHandler per rank, logs/rank_{rank}.log ('[Rank 2] 2024-12-01 10:00:00,123 INFO
fairseq2.recipes - ...'). Python warnings and torch's own stderr lines reach the agent's console
raw from every rank (no prefix: no --tee). The root gang ('Setting up the root gang...', 'Root
gang set up.', gloo here with a 15 s timeout), the data parallel gang, rank 0 loading the model
and DDP broadcasting it, the instruction dataset read from JSONL files, one file a rank where
there are as many files as ranks, bucketed into batches, with the batches synchronised across
ranks (sync_batches: every step an all_reduce says whether any rank ran out, so that all end the
data epoch together), 'Step 10 Train Metrics - Loss: 1.23 | ... | Elapsed Time: 2s | Wall Time:
3s | Learning Rate: ...' published by rank 0 after an all_reduce of the metric bag, checkpoints
written per rank shard into checkpoints/step_N.tmp (rank_{rank}.pt, then model.pt on rank 0) and
renamed to step_N once every rank is done, restored at start from the last one
(torch.load(weights_only=True)), SIGTERM/SIGUSR1 handled by asking the trainer to stop at the
next step. An uncaught exception ends in exception_logger: 'Command has failed. See the logged
stack trace for details.' logged with the stack trace (on rank 0's console; elsewhere only in
its log file), exit 1.

A fault in the code is chosen by the F2_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredthirtyninth.sh after any edit).
`python recipes.py --prepare DIR` writes the synthetic instruction data (four JSONL files).
"""

# ruff: noqa: RUF005, SIM105, SIM905 (fairseq2-style code, as written there)

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import fairseq2n
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("F2_CASE", "")
RANK = int(os.environ.get("RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
__version__ = "0.4.5"
START = time.time()

log = logging.getLogger("fairseq2.recipes")


def fault(letter: str) -> bool:
    """The case's letter, and its rank where it names one."""
    if not CASE.startswith(letter):
        return False
    rank = CASE[len(letter) :]
    return rank == "" or int(rank) == RANK


# ---------------------------------------------------------------- rich.logging.RichHandler
class RichHandler(logging.Handler):
    """What rich's RichHandler(show_path=False) prints into a file or pipe: 80 columns."""

    WIDTH = 80

    def __init__(self) -> None:
        super().__init__()
        self._last_time = ""

    def _wrap(self, line: str, width: int) -> list[str]:
        out: list[str] = []
        while len(line) > width:
            cut = line.rfind(" ", 0, width + 1)
            if cut <= len(line) - len(line.lstrip()):
                out.append(line[:width])  # overflow="fold"
                line = line[width:]
            else:
                out.append(line[: cut + 1])
                line = line[cut + 1 :]
        out.append(line)
        return out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            stamp = time.strftime("[%x %X]", time.localtime(record.created))
            shown = stamp if stamp != self._last_time else " " * len(stamp)
            self._last_time = stamp
            width = self.WIDTH - len(stamp) - 1 - 8 - 1
            rows: list[str] = []
            for raw in message.split("\n"):
                rows.extend(self._wrap(raw.rstrip(), width))
            out = []
            for k, row in enumerate(rows):
                head = f"{shown} {record.levelname:<8} " if k == 0 else " " * (len(stamp) + 10)
                out.append((head + row).ljust(self.WIDTH))
            sys.stderr.write("\n".join(out) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


# ---------------------------------------------------------------- fairseq2/recipes/logging.py
def setup_basic_logging() -> None:
    handlers: list[logging.Handler] = []
    if RANK == 0:
        handler = RichHandler()
        handler.setFormatter(logging.Formatter("%(name)s - %(message)s"))
        handlers.append(handler)
    else:
        handlers.append(logging.NullHandler())
    logging.basicConfig(
        level=logging.INFO, handlers=handlers, datefmt="%Y-%m-%d %H:%M:%S", force=True
    )


def setup_file_logging(log_file: Path) -> None:
    log_file = log_file.with_name(log_file.name.format(rank=RANK))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file)
    handler.setFormatter(
        logging.Formatter(f"[Rank {RANK}] %(asctime)s %(levelname)s %(name)s - %(message)s")
    )
    logging.getLogger().addHandler(handler)


# ---------------------------------------------------------------- fairseq2/gang.py
class Gang:
    def __init__(self, pg: Any, rank: int, size: int) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size

    def barrier(self) -> None:
        dist.barrier(group=self.pg)

    def all_reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, group=self.pg)

    def close(self) -> None:
        dist.destroy_process_group()


def setup_root_gang(timeout: timedelta) -> Gang:
    log.info("Setting up the root gang...")
    dist.init_process_group("gloo", timeout=timeout)
    log.info("Root gang set up.")
    return Gang(dist.group.WORLD, dist.get_rank(), dist.get_world_size())


# ---------------------------------------------------------------- the model (a tiny llama)
class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.self_attn_layer_norm = RMSNorm(d)
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ffn_layer_norm = RMSNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = x + self.ffn(self.ffn_layer_norm(x))
        return out


class TransformerDecoderModel(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads) for _ in range(layers))
        self.layer_norm = RMSNorm(d)
        self.final_proj = nn.Linear(d, vocab, bias=False)

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        n = seqs.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), 1)
        x = self.embed(seqs)
        for layer in self.layers:
            x = layer(x, mask)
        logits: torch.Tensor = self.final_proj(self.layer_norm(x))
        return logits


# ---------------------------------------------------------------- fairseq2/datasets/instruction.py
PAD = 0


def tokenize(text: str) -> list[int]:
    return [2 + (b % 126) for b in text.encode()]


class DataReadError(RuntimeError):
    pass


class InstructionReader:
    """GenericInstructionDataset.create_reader: JSONL files, one a rank when there are as many
    files as ranks, examples bucketed into batches, prefetched by a background thread."""

    def __init__(self, path: Path, gang: Gang, cfg: dict[str, Any]) -> None:
        files = sorted(path.glob("**/*.jsonl"))
        if len(files) >= gang.size:
            self.files = files[gang.rank :: gang.size]
        else:
            self.files = files
        self.gang = gang
        self.batch_size = int(cfg["batch_size"])
        self.max_seq_len = int(cfg["max_seq_len"])
        self.sync = bool(cfg["sync_batches"])
        self.collate_legacy = bool(cfg.get("legacy_collate", False))
        self.epoch_batches = 0
        self.q: queue.Queue[Any] = queue.Queue(maxsize=int(cfg["num_prefetch"]))
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._produce, daemon=True)
        self.thread.start()

    def _examples(self) -> Any:
        for f in self.files:
            with open(f) as fh:
                for line in fh:
                    yield json.loads(line)

    def _collate(self, exs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows, masks = [], []
        for ex in exs:
            src, tgt = tokenize(ex["src"]), tokenize(ex["tgt"]) + [1]
            seq = (src + tgt)[: self.max_seq_len]
            m = [0] * len(src) + [1] * len(tgt)
            if not fault("k"):  # the fork's collater trims the sequence but not its mask
                m = m[: self.max_seq_len]
            rows.append(seq)
            masks.append(m)
        n = max(len(r) for r in rows)
        seqs = torch.tensor([r + [PAD] * (n - len(r)) for r in rows])
        if self.collate_legacy:
            seqs = torch.tensor(seqs)  # the legacy collater copies its input once more
        width = max(len(m) for m in masks)
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        return {"seqs": seqs, "target_mask": mask}

    def _produce(self) -> None:
        try:
            self._fill()
        except Exception as ex:  # the pipeline hands its error to the reading thread
            self.q.put(ex)

    def _fill(self) -> None:
        batch: list[dict[str, Any]] = []
        count = 0
        for ex in self._examples():
            batch.append(ex)
            if len(batch) == self.batch_size:
                count += 1
                if fault("h") and count == 7:
                    self.lock.acquire()  # the bucketer's lock, still held by the forked reader
                    self.lock.acquire()
                self.q.put(self._collate(batch))
                batch = []
        if batch:
            self.q.put(self._collate(batch))
        self.q.put(None)

    def next(self) -> dict[str, torch.Tensor] | None:
        b = self.q.get()
        if isinstance(b, Exception):
            raise DataReadError(
                f"The data pipeline has failed to read the next batch from {self.files}. "
                "See the nested exception for details."
            ) from b
        if self.sync:
            # DataPipelineReader(sync_batches=True): every rank ends the data epoch when the
            # first one runs out
            t = torch.tensor([0 if b is not None else 1])
            self.gang.all_reduce(t)
            if int(t) > 0:
                return None
        batch: dict[str, torch.Tensor] | None = b
        return batch

    def close(self) -> None:
        while self.thread.is_alive():
            try:
                self.q.get(timeout=0.1)
            except queue.Empty:
                pass


# ---------------------------------------------------------------- fairseq2/checkpoint/manager.py
class FileCheckpointManager:
    def __init__(self, root: Path, gang: Gang) -> None:
        self.root = root
        self.gang = gang

    def last_step(self) -> int | None:
        steps = [int(p.name[5:]) for p in self.root.glob("step_*") if p.name[5:].isdigit()]
        return max(steps) if steps else None

    def save(self, step: int, model: nn.Module, trainer_state: dict[str, Any]) -> None:
        tmp = self.root / f"step_{step}.tmp"
        if self.gang.rank == 0:
            tmp.mkdir(parents=True, exist_ok=True)
        self.gang.barrier()
        data = trainer_state
        if fault("s") and step == 10:
            # the shard goes to a share whose quota is nearly spent: 1 KB/s bursts
            path = tmp / f"rank_{self.gang.rank}.pt"
            with open(path, "wb") as fh:
                for _ in range(30):
                    fh.write(b"\0" * 1024)
                    fh.flush()
                    time.sleep(1)
        torch.save(data, tmp / f"rank_{self.gang.rank}.pt")
        self.gang.barrier()
        if self.gang.rank == 0:
            torch.save({"model": model.state_dict()}, tmp / "model.pt")
            torch.save({"step": step, "world_size": self.gang.size}, tmp / "metadata.pt")
            tmp.rename(self.root / f"step_{step}")
        self.gang.barrier()

    def keep_last_n(self, n: int) -> None:
        if self.gang.rank != 0:
            return
        steps = sorted(int(p.name[5:]) for p in self.root.glob("step_*") if p.name[5:].isdigit())
        for s in steps[:-n]:
            shutil.rmtree(self.root / f"step_{s}")

    def load(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self.root / f"step_{step}"
        state = torch.load(d / f"rank_{self.gang.rank}.pt", weights_only=True)
        model = torch.load(d / "model.pt", weights_only=True)
        return model, state


# ---------------------------------------------------------------- fairseq2/recipes/trainer.py
def fmt_duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m:{s % 60:02d}s"


def fmt_count(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{int(n)}"


class Trainer:
    def __init__(self, cfg: dict[str, Any], out: Path, gang: Gang) -> None:
        self.cfg = cfg
        self.gang = gang
        self.stop_requested = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self.ckpt = FileCheckpointManager(out / "checkpoints", gang)

        log.info("Loading '%s' model on data parallel rank 0 (i.e. on world rank 0).", cfg["model"])
        torch.manual_seed(int(cfg["seed"]))
        model = TransformerDecoderModel()
        if gang.rank == 0:
            log.info("Model loaded on data parallel rank 0.")
        log.info("Wrapping the model with DDP and broadcasting to all processes.")
        self.model = DDP(model)
        log.info("Model wrapped with DDP and broadcasted.")
        n = sum(p.numel() for p in model.parameters())
        log.info(
            "Model - Parameters: %s | Trainable Parameters: %s | Buffers: 0 | Size: %d bytes",
            f"{n:,}",
            f"{n:,}",
            n * 4,
        )
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=float(cfg["lr"]), betas=(0.9, 0.95), weight_decay=0.1
        )
        self.step = 0
        last = self.ckpt.last_step()
        if last is not None:
            log.info("Restoring training from the last checkpoint at step %d.", last)
            model_state, state = self.ckpt.load(last)
            model.load_state_dict(model_state["model"])
            self.step = int(state["step"])
            gang.barrier()
            log.info("Training restored. Resuming from step %d.", self.step)
        log.info("Preparing the dataset reader.")
        self.reader = InstructionReader(Path(cfg["dataset"]), gang, cfg)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def run(self) -> None:
        cfg = self.cfg
        max_steps = int(cfg["max_num_steps"])
        max_epochs = cfg.get("max_num_data_epochs")
        every_metrics = int(cfg["publish_metrics_every_n_steps"])
        every_ckpt = int(cfg["checkpoint_every_n_steps"])
        log.info("Running training on %d device(s).", self.gang.size)
        t0 = time.time()
        bag = torch.zeros(3)  # loss sum, target tokens, elements
        hoard = []
        data_epoch = 1
        while self.step < max_steps:
            flag = torch.tensor([1 if self.stop_requested else 0])
            self.gang.all_reduce(flag)  # a stop request on any rank stops every rank
            if int(flag) > 0:
                log.info("Stopping training at step %d as requested.", self.step)
                break
            batch = self.reader.next()
            if batch is None:
                log.info("End of epoch %d reached at step %d.", data_epoch, self.step)
                if max_epochs is not None and data_epoch >= int(max_epochs):
                    log.info("Maximum number of data epochs reached.")
                    break
                data_epoch += 1
                self.reader.close()
                self.reader = InstructionReader(Path(cfg["dataset"]), self.gang, cfg)
                continue
            self.step += 1
            seqs, mask = batch["seqs"], batch["target_mask"]
            logits = self.model(seqs[:, :-1])
            nll = F.cross_entropy(
                logits.transpose(1, 2), seqs[:, 1:], reduction="none", ignore_index=PAD
            )
            nll = nll * mask[:, 1:]
            loss = nll.sum() / max(int(mask[:, 1:].sum()), 1)
            if fault("z") and self.step == 8:
                ctypes.string_at(0)  # fairseq2n's fused cross-entropy reads a freed buffer
            if fault("m") and self.step >= 6:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # a leaking cache
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            self.opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 100.0)
            self.opt.step()
            bag += torch.tensor([float(loss.detach()), float(mask.sum()), float(seqs.numel())])
            if self.step % every_metrics == 0:
                if fault("c") and self.gang.rank == 0:
                    # the fork's token counter, summed where it is logged: on rank 0 only
                    tokens = torch.tensor([float(mask.sum())])
                    self.gang.all_reduce(tokens)
                self.gang.all_reduce(bag)
                if self.gang.rank == 0:
                    log.info(
                        "Step %d Train Metrics - Loss: %.3f | Number of Target Tokens: %s | "
                        "Number of Elements: %s | Gradient Norm: %.2f | Elapsed Time: %s | "
                        "Wall Time: %s | Learning Rate: %.3e",
                        self.step,
                        float(bag[0]) / (every_metrics * self.gang.size),
                        fmt_count(float(bag[1])),
                        fmt_count(float(bag[2])),
                        float(gnorm),
                        fmt_duration(time.time() - t0),
                        fmt_duration(time.time() - START),
                        float(cfg["lr"]),
                    )
                bag.zero_()
            if self.step % every_ckpt == 0:
                log.info("Saving checkpoint after step %d.", self.step)
                self.ckpt.save(self.step, self.model.module, {"step": self.step})
                self.ckpt.keep_last_n(int(cfg["keep_last_n_checkpoints"]))
                log.info("Checkpoint saved.")
        if self.step % every_ckpt != 0:
            log.info("Saving checkpoint after step %d.", self.step)
            self.ckpt.save(self.step, self.model.module, {"step": self.step})
            self.ckpt.keep_last_n(int(cfg["keep_last_n_checkpoints"]))
            log.info("Checkpoint saved.")
        log.info("Finished training after %d step(s).", self.step)


# ---------------------------------------------------------------- fairseq2/recipes/lm/instruction_finetune
PRESETS: dict[str, dict[str, Any]] = {
    "llama3_1_instruct": {
        "model": "llama3_1_8b_instruct",
        "dataset": "foundation_sft",
        "max_seq_len": 64,
        "batch_size": 4,
        "num_prefetch": 4,
        "sync_batches": True,
        "legacy_collate": False,
        "lr": 5.5e-06,
        "max_num_steps": 5000,
        "max_num_data_epochs": None,
        "checkpoint_every_n_steps": 1000,
        "keep_last_n_checkpoints": 1,
        "publish_metrics_every_n_steps": 10,
        "seed": 2,
        "gang_timeout": 15,
    }
}


def parse_value(v: str) -> Any:
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    if v in ("true", "false"):
        return v == "true"
    if v in ("null", "none"):
        return None
    return v


def instruction_finetune(args: argparse.Namespace) -> None:
    cfg = dict(PRESETS[args.preset])
    for item in args.config or []:
        k, v = item.split("=", 1)
        k = k.removeprefix("dataset.").removeprefix("trainer.")
        if k not in cfg:
            raise KeyError(k)
        cfg[k] = parse_value(v)
    tag = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:8]
    out = Path(args.output_dir)
    if not args.no_sweep_dir:
        out = out / f"ps_{args.preset}.ws_{WORLD_SIZE}.{tag}"
    setup_file_logging(out / "logs" / "rank_{rank}.log")
    log.info("The output directory is %s.", out)
    log.info("fairseq2n %s, torch %s.", fairseq2n.__version__, torch.__version__)
    if RANK == 0:
        (out / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
        log.info("Config:\n%s", "\n".join(f"  {k}: {v}" for k, v in cfg.items()))
    gang = setup_root_gang(timedelta(seconds=int(cfg["gang_timeout"])))
    log.info("Setting up the data parallel gang...")
    log.info("Data parallel gang set up.")
    log.info("Running on %d process(es).", gang.size)
    if cfg.get("legacy_collate"):
        log.warning(
            "`legacy_collate` is deprecated and will be removed in fairseq2 0.5. Use the "
            "default collater instead."
        )
        warnings.warn(
            "`dtype` is float16 but the device is CPU; falling back to float32.",
            UserWarning,
            stacklevel=1,
        )
    trainer = Trainer(cfg, out, gang)
    trainer.run()
    gang.close()


def exception_logger_main() -> int:
    parser = argparse.ArgumentParser("fairseq2", description="command line interface of fairseq2")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers()
    lm = sub.add_parser("lm").add_subparsers()
    ift = lm.add_parser("instruction_finetune", help="instruction-finetune a language model")
    ift.add_argument("--preset", default="llama3_1_instruct")
    ift.add_argument("--config", action="append", nargs="*", default=[])
    ift.add_argument("--no-sweep-dir", action="store_true")
    ift.add_argument("output_dir", type=Path)
    ift.set_defaults(command=instruction_finetune)
    args = parser.parse_args()
    args.config = [x for group in args.config for x in group]
    try:
        setup_basic_logging()
        args.command(args)
    except Exception:
        log.exception("Command has failed. See the logged stack trace for details.")
        return 1
    return 0


def main() -> None:
    sys.exit(exception_logger_main())


# ---------------------------------------------------------------- the synthetic data
WORDS = (
    "explain translate summarize list describe compare write name give rewrite the a of "
    "model data token river mountain city planet music colour number story poem reason"
).split()


def prepare(root: str) -> None:
    import random

    rng = random.Random(0)
    d = Path(root) / "sft_data"
    d.mkdir(parents=True, exist_ok=True)
    for part in range(4):
        with open(d / f"train_part{part}.jsonl", "w") as fh:
            for k in range(100):
                src = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
                tgt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
                fh.write(json.dumps({"id": f"p{part}-{k}", "src": src, "tgt": tgt}) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
        sys.exit(0)
    main()
