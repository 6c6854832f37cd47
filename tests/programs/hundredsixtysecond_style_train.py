# Databricks notebook source
"""A hundred-and-sixty-second training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtysecond-*): a Databricks notebook that trains a tabular
click-through-rate model with Databricks' TorchDistributor
(pyspark.ml.torch.distributor.TorchDistributor) in local mode, on the driver, re-created with
open-source pyspark 3.5 and plain torch: `TorchDistributor(num_processes=2, local_mode=True,
use_gpu=False).run(train_fn, CFG)` (the function form: the distributor cloudpickles train_fn
with its arguments, writes a wrapper train.py into a temporary folder and runs torchrun
--standalone through its torch_run_process_wrapper, streaming the console to the cell) or
`.run("<repo>/ctr_training.py", "--data-dir", ..., "--epochs", "3")` (the file form: this same
file, run by torchrun as a script with flags). The file is the notebook as Databricks exports it
(`# Databricks notebook source`, cells between `# COMMAND ----------`, `# MAGIC %md` text);
tests/programs/hundredsixtysecond_databricks/repl.py runs its cells one by one on a real
IPython shell as a Databricks driver's REPL does (`<command-N>` cell names, `spark` and
`dbutils.widgets` predefined, the notebook's folder as working folder and on the driver's
sys.path).

The model: an EmbeddingBag per hashed categorical column (six of them, 1000 buckets) and an MLP
over them and four dense columns, in DDP on gloo with a 15 s collective timeout; BCE loss,
Adam. The data: "parquet-like" .npy shards (a structured array a shard: label, dense, cat) that
an upstream job wrote to a mount, part-0000K.npy for training, val-00000.npy for validation and
a _manifest.json listing them; rank r trains on the manifest's parts r::world and validates on
every world-th validation row. Every rank prints the shards it read ('rank 1: read
part-00003.npy (2560 rows, 0.0s)'); rank 0 alone prints its progress ('Epoch 1 | step 40/80 |
loss 0.6921 | auc 0.5120', the AUC of the batches since the last line) and after each epoch's
validation (loss and an AUC from score histograms all-reduced over the ranks) an MLflow-style
metrics dict as JSON ('{"epoch": 1, "step": 80, "metrics": {"train_loss": ..., "val_loss": ...,
"val_auc": ...}}'); with a target AUC every rank stops once the all-reduced AUC reaches it. The
function returns the last metrics (the cell shows them as Out[N]).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredsixtysecond.sh after any edit).
`python ctr_training.py --generate DIR` writes the synthetic data set.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.nn as nn

CASE = os.environ.get("MT_CASE", "")


def fault(letter: str, rank: int | None = None) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or rank is None or int(which) == rank


# COMMAND ----------

# MAGIC %md
# MAGIC ## Parameters
# MAGIC The job passes them as widgets; run as a script (TorchDistributor's file form), as flags.

# COMMAND ----------

DEFAULTS = {
    "data_dir": "/dbfs/mnt/ctr/clicks",
    "epochs": 3,
    "batch_size": 64,
    "lr": 0.003,
    "log_every": 20,
    "target_auc": 0.0,
    "lr_decay": 0.0,
    "find_unused": False,
    "num_processes": 2,
    "launch": "function",
}
# a plain `python ctr_training.py ...` (torchrun's workers in the file form): no dbutils
SCRIPT = __name__ == "__main__" and globals().get("dbutils") is None


def _typed(name: str, value: str) -> object:
    default = DEFAULTS[name]
    if isinstance(default, bool):
        return value.lower() == "true"
    return type(default)(value)


if SCRIPT:
    parser = argparse.ArgumentParser(description="CTR model, DDP")
    for key, default in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    parser.add_argument("--generate", metavar="DIR", help="write the synthetic shards and exit")
    CFG = vars(parser.parse_args())
else:
    widgets = globals()["dbutils"].widgets
    for key, default in DEFAULTS.items():
        widgets.text(key, str(default).lower() if isinstance(default, bool) else str(default))
    CFG = {key: _typed(key, widgets.get(key)) for key in DEFAULTS}
    print(json.dumps(CFG, indent=2))


def script_flags(cfg: dict) -> list[str]:
    flags = []
    for key, default in DEFAULTS.items():
        if key == "launch":
            continue
        if isinstance(default, bool):
            flags += ["--" + key.replace("_", "-")] if cfg[key] else []
        else:
            flags += ["--" + key.replace("_", "-"), str(cfg[key])]
    return flags


# COMMAND ----------

# MAGIC %md
# MAGIC ## Data
# MAGIC The upstream job writes the day's clicks as shards with a `_manifest.json`.

# COMMAND ----------

SCHEMA = np.dtype([("label", "i1"), ("dense", "f4", (4,)), ("cat", "i8", (6,))])
N_BUCKETS = 1000


def write_shards(folder: str, parts: int = 4, rows: int = 2560, val_rows: int = 2048) -> None:
    """The synthetic clicks: a hidden logistic model over the dense columns and a weight per
    raw category id."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    w_dense = rng.normal(0, 0.8, 4)
    w_cat = rng.normal(0, 0.9, (6, 200))
    files = []
    for name, n in [
        *((f"part-{k:05d}.npy", rows) for k in range(parts)),
        ("val-00000.npy", val_rows),
    ]:
        a = np.zeros(n, SCHEMA)
        a["dense"] = rng.normal(0, 1, (n, 4))
        a["cat"] = rng.integers(0, 200, (n, 6)) * 7919 + 13
        ids = (a["cat"] - 13) // 7919
        logit = a["dense"] @ w_dense + w_cat[np.arange(6), ids].sum(1) - 0.5
        a["label"] = rng.random(n) < 1 / (1 + np.exp(-logit))
        np.save(os.path.join(folder, name), a)
        files.append({"path": name, "rows": n})
    with open(os.path.join(folder, "_manifest.json"), "w") as f:
        json.dump({"files": files}, f, indent=1)


if fault("m"):  # the hashing helper, moved into the repo's ctr_features.py
    from ctr_features import hash_ids  # type: ignore[import-not-found]
else:

    def hash_ids(raw: np.ndarray, buckets: int = N_BUCKETS) -> np.ndarray:
        return (raw * 2654435761 % (1 << 32)) % buckets


def read_shard(path: str, rank: int) -> dict[str, torch.Tensor]:
    t0 = time.time()
    if fault("s", rank):  # this rank's reads go through a throttled mount
        time.sleep(12)
    a = np.load(path)
    print(f"rank {rank}: read {os.path.basename(path)} ({len(a)} rows, {time.time() - t0:.1f}s)")
    sys.stdout.flush()
    return {
        "label": torch.from_numpy(a["label"].astype(np.float32)),
        "dense": torch.from_numpy(a["dense"].copy()),
        "cat": torch.from_numpy(hash_ids(a["cat"])),
    }


if SCRIPT and CFG["generate"]:
    write_shards(CFG["generate"])
    sys.exit(0)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Model

# COMMAND ----------


class CTRNet(nn.Module):
    def __init__(self, n_cat: int = 6, n_dense: int = 4, dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(N_BUCKETS, dim, mode="sum") for _ in range(n_cat))
        self.mlp = nn.Sequential(
            nn.Linear(n_cat * dim + n_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, cat: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        embs = [bag(cat[:, i : i + 1]) for i, bag in enumerate(self.bags)]
        out: torch.Tensor = self.mlp(torch.cat([*embs, dense], 1)).squeeze(1)
        return out


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return 0.5
    ranks = np.argsort(np.argsort(np.concatenate([pos, neg]))) + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def auc_from_histograms(h_pos: np.ndarray, h_neg: np.ndarray) -> float:
    """The AUC of scores binned into histograms (pairs within one bin count half)."""
    below = np.concatenate([[0.0], np.cumsum(h_neg)[:-1]])
    wins = float((h_pos * (below + h_neg / 2)).sum())
    total = float(h_pos.sum() * h_neg.sum())
    return wins / total if total else 0.5


LEAK: list[np.ndarray] = []

# COMMAND ----------

# MAGIC %md
# MAGIC ## Training function
# MAGIC Runs in every process TorchDistributor starts (imports inside, as the docs advise).

# COMMAND ----------


def train_fn(cfg: dict) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    with open(os.path.join(cfg["data_dir"], "_manifest.json")) as f:
        parts = [p["path"] for p in json.load(f)["files"] if p["path"].startswith("part-")]
    shards = [read_shard(os.path.join(cfg["data_dir"], p), rank) for p in parts[rank::world]]
    train = {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
    val_all = None  # read after the first epoch
    model = DDP(CTRNet(), find_unused_parameters=cfg["find_unused"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    sched = (
        torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg["lr_decay"])
        if cfg["lr_decay"]
        else None
    )
    loss_fn = nn.BCEWithLogitsLoss()
    bs = cfg["batch_size"]
    steps = len(train["label"]) // bs
    gen = torch.Generator().manual_seed(rank)
    metrics: dict = {}
    for epoch in range(1, cfg["epochs"] + 1):
        model.train()
        if sched is not None:
            sched.step()  # this epoch's learning rate
        order = torch.randperm(len(train["label"]), generator=gen)
        window_loss, window_scores, window_labels = 0.0, [], []
        epoch_loss = 0.0
        for step in range(1, steps + 1):
            idx = order[(step - 1) * bs : step * bs]
            cat, dense, y = train["cat"][idx], train["dense"][idx], train["label"][idx]
            if fault("k", rank) and epoch >= 2:  # a fork keeps every batch for hard negatives
                LEAK.append(np.ones(16 << 20, dtype=np.float32))
                if len(LEAK) >= 6:  # the driver's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), 9)
            if fault("z", rank) and epoch == 2 and step == 30:
                ctypes.string_at(0)  # the compiled feature crosser reads a freed buffer
            logits = model(cat, dense)
            loss = loss_fn(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            epoch_loss += loss.item()
            window_loss += loss.item()
            window_scores.append(logits.detach().numpy())
            window_labels.append(y.numpy())
            if rank == 0 and step % cfg["log_every"] == 0:
                print(
                    f"Epoch {epoch} | step {step}/{steps} | loss {window_loss / cfg['log_every']:.4f}"
                    f" | auc {auc(np.concatenate(window_scores), np.concatenate(window_labels)):.4f}",
                    flush=True,
                )
                window_loss, window_scores, window_labels = 0.0, [], []
        # validation: every world-th row of the validation shard, metrics all-reduced
        if val_all is None:
            val_all = read_shard(os.path.join(cfg["data_dir"], "val-00000.npy"), rank)
        val = {k: v[rank::world] for k, v in val_all.items()}
        model.eval()
        with torch.no_grad():
            scores = torch.sigmoid(model(val["cat"], val["dense"]))
            val_loss = nn.functional.binary_cross_entropy(scores, val["label"], reduction="sum")
        bins = torch.clamp((scores * 64).long(), max=63)
        h_pos = torch.bincount(bins[val["label"] > 0.5], minlength=64).double()
        h_neg = torch.bincount(bins[val["label"] <= 0.5], minlength=64).double()
        stats = torch.cat(
            [torch.tensor([float(val_loss), float(len(scores))], dtype=torch.float64), h_pos, h_neg]
        )
        dist.all_reduce(stats)
        if fault("v", rank) and rank == 0:  # a fork's exact AUC: rank 0 gathers every rank's scores
            gathered = [torch.zeros_like(scores) for _ in range(world)]
            dist.all_gather(gathered, scores)
        metrics = {
            "train_loss": round(epoch_loss / steps, 4),
            "val_loss": round(float(stats[0] / stats[1]), 4),
            "val_auc": round(auc_from_histograms(stats[2:66].numpy(), stats[66:].numpy()), 4),
        }
        if fault("e", rank) and epoch >= 2:  # a fork adds the calibration ratio
            metrics["calibration"] = np.float32(scores.mean() / val["label"].mean())
        if rank == 0:
            print(
                json.dumps({"epoch": epoch, "step": epoch * steps, "metrics": metrics}), flush=True
            )
        if fault("x", rank) and epoch == 1:  # a fork's guard: nothing new in this rank's parts
            sys.exit(0)
        if cfg["target_auc"] and metrics["val_auc"] >= cfg["target_auc"]:
            if rank == 0:
                print(
                    f"Early stopping at epoch {epoch}: val_auc {metrics['val_auc']:.4f} >= {cfg['target_auc']}",
                    flush=True,
                )
            break
    dist.destroy_process_group()
    return metrics


def train_and_log(cfg: dict) -> dict:
    """train_fn, then rank 0 appends the run's metrics to the team's runs table."""
    metrics = train_fn(cfg)
    if os.environ.get("RANK") == "0":
        spark.createDataFrame([metrics]).write.mode("append").saveAsTable("ctr.runs")  # noqa: F821
    return metrics


TRAIN = train_and_log if fault("p") else train_fn

# COMMAND ----------

if SCRIPT:  # started by torchrun through TorchDistributor.run(<this file>, flags...): train, end
    train_fn(CFG)
    sys.exit(0)

# COMMAND ----------

from pyspark.ml.torch.distributor import TorchDistributor  # noqa: E402

distributor = TorchDistributor(num_processes=CFG["num_processes"], local_mode=True, use_gpu=False)
if CFG["launch"] == "function":
    result = distributor.run(TRAIN, CFG)
else:  # the repo's training script: this notebook's code as a file
    result = distributor.run(CFG["launch"], *script_flags(CFG))
result  # noqa: B018
