"""A forty-second training-program style (tests/fixtures/real/fortysecond-*): a script built on a
small Trainer in the way of MosaicML Composer / llm-foundry (written here in plain PyTorch),
started by its own launcher (tests/programs/fortysecond_launcher.py, as `composer -n N train.py
cfg.yaml key=value ...`) or by torch.distributed.launch. llm-foundry's habits: the config YAML
with command-line overrides, printed as YAML by rank 0 at start; Python logging on every rank in
llm-foundry's format ('2026-12-04 07:00:00,123: rank1[4242][MainThread]: INFO: __main__:
Building trainer...'); Composer's ConsoleLogger ('[epoch=1][batch=4/24]: Train time/batch: 4,
Train loss/train/total: 1.3412, Train metrics/train/Accuracy: 0.3125', '[Eval batch=1/2] Eval on
eval data', 'Eval metrics/eval/Accuracy: 0.4100'); its hyperparameter block; a checkpoint saver
('Saving checkpoint to ./ckpt/ep1-ba8-rank0.pt', rank 0 only); callbacks (EarlyStopper on the
all-reduced eval metric, a ThresholdStopper, a Hugging Face checkpointer, llm-foundry's
NaNMonitor); device_train_microbatch_size microbatches under no_sync; a sampler that gives each
rank whole shards of a synthetic dataset written at capture time (data/train/index.json and
shard.NNNNN.jsonl; --make-data). gloo with a 15 s collective timeout. A fault in the code is
chosen by $T42_PLAN (an opaque code the program never prints); the others are in what a run is
given (its data, its config, its port).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP

PLAN = os.environ.get("T42_PLAN", "")
FEATURES = 16
CLASSES = 4
SHARD_SAMPLES = 32
LOSS_WEIGHTS = {"web": 1.0, "books": 1.0, "wiki": 1.2}

log = logging.getLogger(__name__)


@dataclass
class Timestamp:
    """Where training is, as Composer's Timestamp (pickled into every checkpoint)."""

    epoch: int = 0
    batch: int = 0
    sample: int = 0


# --- data ---------------------------------------------------------------------------------------


def make_data(root: Path, shards: int, seed: int = 5) -> None:
    g = torch.Generator().manual_seed(seed)
    sources = list(LOSS_WEIGHTS)
    for split, n in (("train", shards), ("val", 1)):
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        names = []
        for s in range(n):
            x = torch.randn(SHARD_SAMPLES if split == "train" else 48, FEATURES, generator=g)
            y = x[:, :CLASSES].argmax(1).tolist()
            name = f"shard.{s:05d}.jsonl"
            with open(folder / name, "w") as f:
                for i, (row, label) in enumerate(zip(x.tolist(), y, strict=True)):
                    rec = {"x": [round(v, 4) for v in row], "y": label, "source": sources[i % 3]}
                    f.write(json.dumps(rec) + "\n")
            names.append(name)
        (folder / "index.json").write_text(json.dumps({"version": 2, "shards": names}) + "\n")


class ShardedDataset:
    """Each rank reads whole shards (shard i goes to rank i % world), one after the other, as a
    streaming dataset does; a shard is opened only when the iteration reaches it."""

    def __init__(self, folder: Path, rank: int, world: int, batch_size: int) -> None:
        self.folder = folder
        index = json.loads((folder / "index.json").read_text())
        self.shards = index["shards"][rank::world]
        self.batch_size = batch_size

    def __len__(self) -> int:
        return math.floor(len(self.shards) * SHARD_SAMPLES / self.batch_size)

    def __iter__(self):
        for name in self.shards:
            with open(self.folder / name) as f:
                recs = [json.loads(line) for line in f]
            for i in range(0, len(recs) - self.batch_size + 1, self.batch_size):
                part = recs[i : i + self.batch_size]
                yield {
                    "x": torch.tensor([r["x"] for r in part], dtype=torch.float32),
                    "y": torch.tensor([r["y"] for r in part]),
                    "source": [r["source"] for r in part],
                }


def eval_batches(folder: Path, rank: int, world: int, batch_size: int) -> list[dict]:
    """The validation shard split as DistributedSampler splits it (rank::world)."""
    with open(folder / "shard.00000.jsonl") as f:
        recs = [json.loads(line) for line in f][rank::world]
    return [
        {
            "x": torch.tensor([r["x"] for r in recs[i : i + batch_size]], dtype=torch.float32),
            "y": torch.tensor([r["y"] for r in recs[i : i + batch_size]]),
        }
        for i in range(0, len(recs), batch_size)
    ]


def local_rank_zero_download_and_wait(marker: Path, prepare) -> None:
    """Composer's dist.local_rank_zero_download_and_wait: local rank 0 prepares, the others poll
    for the file it leaves (no collective, no timeout)."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        prepare()
        marker.write_text("ok\n")
    else:
        while not marker.exists():
            time.sleep(0.1)


# --- callbacks ----------------------------------------------------------------------------------


class Callback:
    def epoch_end(self, trainer: Trainer) -> None:
        pass


class EarlyStopper(Callback):
    def __init__(self, monitor: str, patience: int, min_delta: float) -> None:
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.best: float | None = None
        self.bad = 0

    def epoch_end(self, trainer: Trainer) -> None:
        value = trainer.eval_metrics[self.monitor]
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.bad = (value if self.best is None else max(value, self.best)), 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            logging.getLogger("trainer.callbacks.early_stopper").info(
                f"{self.monitor} has not improved for {self.bad} evaluation(s); "
                f"stopping training at {trainer.ts_name()}"
            )
            trainer.stop_training()


class ThresholdStopper(Callback):
    def __init__(self, monitor: str, threshold: float) -> None:
        self.monitor, self.threshold = monitor, threshold

    def epoch_end(self, trainer: Trainer) -> None:
        value = trainer.train_metrics[self.monitor]
        if value >= self.threshold:
            logging.getLogger("trainer.callbacks.threshold_stopper").info(
                f"{self.monitor} reached {value:.4f} (threshold {self.threshold}); "
                f"stopping training at {trainer.ts_name()}"
            )
            trainer.stop_training()


class HuggingFaceCheckpointer(Callback):
    """Writes the model in Hugging Face's format on rank 0 at every epoch's end."""

    def __init__(self, save_folder: str, slow: bool) -> None:
        self.save_folder, self.slow = save_folder, slow

    def epoch_end(self, trainer: Trainer) -> None:
        if trainer.rank != 0:
            return
        hf_log = logging.getLogger("trainer.callbacks.hf_checkpointer")
        folder = Path(self.save_folder) / f"ba{trainer.ts.batch}"
        hf_log.info(f"Saving Hugging Face checkpoint in HF format to {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        parts = 5 if self.slow else 1
        for part in range(1, parts + 1):
            if self.slow:  # the conversion gathers and re-serialises every tensor
                time.sleep(5.0)
            hf_log.info(f"Writing model-0000{part}-of-0000{parts}.safetensors")
        torch.save(trainer.model.module.state_dict(), folder / "pytorch_model.bin")


class NaNMonitor(Callback):
    """llm-foundry's NaNMonitor: checked after every batch."""

    def after_loss(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss).all():
            raise RuntimeError("Train loss contains a NaN.")


class SampleGenerator(Callback):
    """Logs a table of predictions to the experiment tracker (built on rank 0 only)."""

    def __init__(self) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError as e:
            raise MissingConditionalImportError("wandb", "wandb") from e


class MissingConditionalImportError(ImportError):
    def __init__(self, extra_deps_group: str, conda_package: str) -> None:
        super().__init__(
            f"Trainer was installed without {extra_deps_group} support. To use "
            f"{extra_deps_group} related packages, run `pip install '{conda_package}'`."
        )


# --- trainer ------------------------------------------------------------------------------------


class Trainer:
    def __init__(self, cfg: dict, rank: int, world: int) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.ts = Timestamp()
        self._stop = False
        torch.manual_seed(cfg["seed"])
        net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)
        )
        self.model = DDP(net)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=cfg["optimizer"]["lr"], momentum=0.9
        )
        self.device_batch = cfg["global_train_batch_size"] // world
        self.microbatch = cfg["device_train_microbatch_size"]
        data = Path(cfg["train_loader"]["dataset"]["local"])
        self.train_data = ShardedDataset(data / "train", rank, world, self.device_batch)
        self.eval_data = eval_batches(data / "val", rank, world, cfg["device_eval_batch_size"])
        self.epochs = int(str(cfg["max_duration"]).removesuffix("ep"))
        self.callbacks: list[Callback] = []
        self.train_metrics: dict[str, float] = {}
        self.eval_metrics: dict[str, float] = {}
        self.hoard: list[torch.Tensor] = []
        if cfg.get("load_path"):
            log.info(f"Loading checkpoint from {cfg['load_path']}")
            state = torch.load(cfg["load_path"])  # weights_only defaults to True (torch >= 2.6)
            self.model.module.load_state_dict(state["state"]["model"])
            self.ts = state["state"]["timestamp"]

    def ts_name(self) -> str:
        return f"ep{self.ts.epoch}-ba{self.ts.batch}"

    def stop_training(self) -> None:
        self._stop = True

    def console(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def log_hparams(self) -> None:
        if self.rank != 0:
            return
        self.console(
            "******************************\nConfig:\n"
            "node_name: unknown because NODENAME environment variable not set\n"
            f"num_gpus_per_node: {self.world}\nnum_nodes: 1\nrank_zero_seed: {self.cfg['seed']}\n"
            "******************************"
        )

    def fit(self) -> None:
        self.log_hparams()
        total = len(self.train_data) * self.epochs
        interval = int(str(self.cfg["console_log_interval"]).removesuffix("ba"))
        nan_monitor = next((c for c in self.callbacks if isinstance(c, NaNMonitor)), None)
        while self.ts.epoch < self.epochs and not self._stop:
            epoch = self.ts.epoch + 1
            if epoch == 2 and PLAN == "q2" and self.rank == 1:
                ready = threading.Event()  # set by a prefetch thread that was never started
                ready.wait()
            if epoch == 2 and PLAN == "m5":
                marker = Path(self.cfg["train_loader"]["dataset"]["local"]) / ".epoch2.done"

                def prepare() -> None:
                    log.info("Downloading shards for epoch 2 from remote to local cache")
                    threading.Event().wait()  # the remote read never returns

                local_rank_zero_download_and_wait(marker, prepare)
            correct = seen = 0
            for i, batch in enumerate(self.train_data, start=1):
                self.model.train()
                self.optimizer.zero_grad()
                x, y = batch["x"], batch["y"]
                sources = batch["source"]
                if PLAN == "k7" and self.rank == 1 and epoch == 1 and i == 6:
                    sources = [*sources[:-1], "code"]  # a source the weights never listed
                w = torch.tensor([LOSS_WEIGHTS[s] for s in sources])
                n_micro = max(1, x.shape[0] // self.microbatch)
                total_loss = torch.zeros(())
                for m in range(n_micro):
                    sl = slice(m * self.microbatch, (m + 1) * self.microbatch)
                    ctx = self.model.no_sync() if m < n_micro - 1 else contextlib.nullcontext()
                    with ctx:
                        logits = self.model(x[sl])
                        loss = (F.cross_entropy(logits, y[sl], reduction="none") * w[sl]).mean()
                        (loss / n_micro).backward()
                    total_loss += loss.detach() / n_micro
                    correct += int((logits.argmax(1) == y[sl]).sum())
                    seen += int(y[sl].numel())
                if nan_monitor is not None:
                    nan_monitor.after_loss(total_loss)
                self.optimizer.step()
                self.ts.batch += 1
                self.ts.sample += x.shape[0] * self.world
                if PLAN == "h3" and self.rank == 1 and epoch == 2:
                    self.hoard.append(torch.ones(48, 1024, 1024, dtype=torch.uint8))
                    if len(self.hoard) == 5:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if PLAN == "s9" and self.rank == 2 and epoch == 1 and i == 5:
                    ctypes.string_at(0)  # the native tokenizer reads address 0
                if self.ts.batch % interval == 0:
                    self.console(
                        f"[epoch={epoch}][batch={self.ts.batch}/{total}]: "
                        f"Train time/batch: {self.ts.batch}, "
                        f"Train loss/train/total: {float(total_loss):.4f}, "
                        f"Train metrics/train/Accuracy: {correct / max(seen, 1):.4f}"
                    )
            self.ts.epoch = epoch
            self.train_metrics = {"metrics/train/Accuracy": correct / max(seen, 1)}
            self.evaluate()
            self.save_checkpoint()
            for cb in self.callbacks:
                cb.epoch_end(self)

    def evaluate(self) -> None:
        self.model.eval()
        stats = torch.zeros(2)
        n = len(self.eval_data)
        with torch.no_grad():
            for j, batch in enumerate(self.eval_data, start=1):
                pred = self.model(batch["x"]).argmax(1)
                stats += torch.tensor([float((pred == batch["y"]).sum()), float(pred.numel())])
                self.console(f"[Eval batch={j}/{n}] Eval on eval data")
        dist.all_reduce(stats)  # the metric's state synced across ranks, as torchmetrics does
        acc = float(stats[0] / stats[1])
        self.eval_metrics = {"metrics/eval/Accuracy": acc}
        if PLAN == "c4" and self.rank == 0:  # samples seen, for the log line rank 0 writes
            seen = torch.tensor([float(stats[1])])
            dist.all_reduce(seen)
        self.console(f"Eval metrics/eval/Accuracy: {acc:.4f}")

    def save_checkpoint(self) -> None:
        if self.rank != 0:
            return
        folder = Path(self.cfg["save_folder"])
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{self.ts_name()}-rank0.pt"
        logging.getLogger("trainer.callbacks.checkpoint_saver").info(
            f"Saving checkpoint to {self.cfg['save_folder']}/{name}"
        )
        state = {"model": self.model.module.state_dict(), "timestamp": self.ts}
        torch.save({"state": state, "rng": torch.get_rng_state()}, folder / name)
        latest = folder / "latest-rank0.pt"
        latest.unlink(missing_ok=True)
        latest.symlink_to(name)


# --- main ---------------------------------------------------------------------------------------


def load_config(path: str, overrides: list[str]) -> dict:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    for item in overrides:
        key, _, value = item.partition("=")
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(description="Trains a toy classifier.")
    parser.add_argument("yaml_path")
    parser.add_argument("args_list", nargs="*", help="overrides: key=value")
    parser.add_argument("--make-data", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_data:
        make_data(Path(args.yaml_path), args.make_data)
        return 0
    cfg = load_config(args.yaml_path, args.args_list)

    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.get("dist_timeout", 15)))
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(
        format=f"%(asctime)s: rank{rank}[%(process)d][%(threadName)s]: %(levelname)s: "
        "%(name)s: %(message)s",
        level=logging.INFO,
    )
    if rank == 0:
        print(yaml.safe_dump(cfg, sort_keys=False), end="", flush=True)
    log.info("Building train loader...")
    log.info("Building eval loader...")
    log.info("Building trainer...")
    trainer = Trainer(cfg, rank, world)
    for name, opts in (cfg.get("callbacks") or {}).items():
        if name == "early_stopper":
            trainer.callbacks.append(EarlyStopper(**opts))
        elif name == "threshold_stopper" and (PLAN != "e6" or rank == 0):
            trainer.callbacks.append(ThresholdStopper(**opts))
        elif name == "hf_checkpointer":
            trainer.callbacks.append(HuggingFaceCheckpointer(opts["save_folder"], PLAN == "w8"))
        elif name == "nan_monitor":
            trainer.callbacks.append(NaNMonitor())
        elif name == "generate_samples" and rank == 0:
            trainer.callbacks.append(SampleGenerator())
    log.info("Starting training...")
    trainer.fit()
    log.info("Done.")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
