"""A hundred-and-sixty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyfifth-*): a click-through-rate recommender trained the way
facebookresearch/dlrm's dlrm_s_pytorch.py trains DLRM on the Criteo Kaggle days, re-created in
plain torch in one file (the repository's extend_distributed.py and dlrm_data_pytorch.py folded
in, no onnx, sklearn or tensorboard), run as a long-lived service under supervisord: a
[program:train] section whose command is `torchrun --nnodes=1 --nproc_per_node=3
--master_addr=127.0.0.1 --master_port=PORT dlrm_s_pytorch.py ...`, with autorestart, so that a
restarted job resumes from the model it saved at its last test (`--load-model`).

As in dlrm: extend_distributed replaces builtins.print so that only rank 0 prints ('Running on 3
ranks using gloo backend', 'Using CPU...', 'Reading pre-processed data=...', 'Sparse features=
26, Dense features= 13', 'time/loss/accuracy (if enabled):', 'Finished training it 18/54 of
epoch 0, 31.79 ms/it, loss 0.782870', 'Testing at - 54/54 of epoch 0,', ' accuracy 64.757 %,
best 64.757 %', 'Saving model to model/dlrm_kaggle.pt', 'Loading saved model ...', 'Saved at:
epoch = 0/3, batch = 54/54, ntbatch = 6'), while `print_all` prints on every rank ('world size:
3, current rank: 1, local rank: 1'); the top-level imports print 'Unable to import onnx.  No
module named 'onnx'' on every rank before the override knows its rank; --mlperf-logging prints
the metrics line 'recall 0.4512, precision 0.6012, f1 0.5155, ap 0.5801, auc 0.7012, best auc
0.7012, accuracy 70.313 %, best accuracy 70.313 %' and ':::MLLOG {...}' events, and 'MLPerf
testing auc threshold 0.65 reached, stop training'. The embedding tables are model parallel
(table k lives on rank k % world), the bottom and top MLPs data parallel in DDP; each step sends
the sparse ids to the tables' owners and the pooled embeddings back with all_to_all_single (the
way dlrm's distributed_forward and torchrec's input/output dists do). A user's fork: each rank
reads its own training days (days[rank::world], --memory-map loading a day file at a time and
printing dlrm's commented-out 'Loading file:  data/train_day_3_reordered.npz' on every rank),
the process group's timeout from --dist-timeout, the model saved per rank, and a resumed run that
really skips the epochs it has done. `python dlrm_s_pytorch.py --prepare DIR` writes the
synthetic Criteo-like days (train_day_N_reordered.npz, train_day_count.npz,
train_fea_count.npz). Each batch's read from the day file takes READ_S (the cluster's network
disk), so that an epoch lasts a few seconds.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank)
and never printed (re-capture with tests/fixtures/real/capture_hundredsixtyfifth.sh after any
edit).
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import json
import os
import queue
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("MT_CASE", "")
READ_S = 0.15
DAYS = 10  # days 0-8 train, day 9 test (as dlrm's kaggle split: the last day is the test day)
STEPS = 0  # training steps this process has run (a restarted job counts from 0 again)
DENSE, SPARSE = 13, 26
LEAK: list[torch.Tensor] = []


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ extend_distributed.py
my_rank = -1
my_size = -1
my_local_rank = -1
alltoall_supported = False


def env2int(env_list: list[str], default: int = -1) -> int:
    for e in env_list:
        val = int(os.environ.get(e, -1))
        if val >= 0:
            return val
    return default


def init_distributed(local_rank: int, backend: str, timeout_s: float) -> None:
    global my_rank, my_size, my_local_rank, alltoall_supported
    rank = env2int(["PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "RANK"], 0)
    size = env2int(["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE"], 1)
    if size > 1:
        my_local_rank = local_rank if local_rank != -1 else env2int(["LOCAL_RANK"], 0)
        dist.init_process_group(
            backend or "gloo", rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
        )
        my_rank = dist.get_rank()
        my_size = dist.get_world_size()
        if my_rank == 0:
            print(f"Running on {my_size} ranks using {backend or 'gloo'} backend")
        try:
            t = torch.zeros([4 * my_size])
            dist.all_to_all_single(t, t.clone())
            alltoall_supported = True
        except RuntimeError as err:
            print(f"fail to enable all_to_all_single primitive: {err}")
    else:
        my_rank, my_size, my_local_rank = 0, 1, 0
    print_all(f"world size: {my_size}, current rank: {my_rank}, local rank: {my_local_rank}")


orig_print = builtins.print


def rank0_print(*args: Any, **kwargs: Any) -> None:
    if my_rank <= 0 or kwargs.pop("print_all", False):
        orig_print(*args, **kwargs)


builtins.print = rank0_print


def print_all(*args: Any, **kwargs: Any) -> None:
    orig_print(*args, **kwargs)


def barrier() -> None:
    if my_size > 1:
        dist.barrier()


class All2AllPooled(torch.autograd.Function):
    """The pooled embeddings of this rank's tables for every rank's samples, sent to the rank
    that owns the samples (dlrm's All2All_Req / torchrec's output dist); the gradients go back
    the same way."""

    @staticmethod
    def forward(ctx: Any, pooled: torch.Tensor, tables: list[int], batch: int) -> torch.Tensor:
        ctx.tables, ctx.batch = tables, batch
        n_me = tables[my_rank]
        send = pooled.contiguous().view(-1)  # (world * batch, n_me, d): blocks by rank
        dim = pooled.size(-1)
        out = torch.empty(sum(n * batch * dim for n in tables))
        dist.all_to_all_single(
            out,
            send,
            output_split_sizes=[n * batch * dim for n in tables],
            input_split_sizes=[n_me * batch * dim] * my_size,
        )
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        tables, batch, dim = ctx.tables, ctx.batch, ctx.dim
        n_me = tables[my_rank]
        back = torch.empty(my_size * batch * n_me * dim)
        dist.all_to_all_single(
            back,
            grad.contiguous(),
            output_split_sizes=[n_me * batch * dim] * my_size,
            input_split_sizes=[n * batch * dim for n in tables],
        )
        return back.view(my_size * batch, n_me, dim), None, None


# ------------------------------------------------------------------ dlrm_data_pytorch.py
def prepare(folder: str, per_day: int = 576) -> None:
    """Synthetic Criteo-like days as dlrm's getCriteoAdData leaves them with --memory-map: 13
    dense counts, 26 categorical ids, a click label that depends on both."""
    rng = np.random.default_rng(7)
    os.makedirs(folder, exist_ok=True)
    counts = rng.integers(8, 96, size=SPARSE)
    weight = [rng.normal(0, 1.2, size=int(c)) for c in counts]
    dense_w = rng.normal(0, 0.6, size=DENSE)
    for day in range(DAYS):
        x_int = rng.poisson(3.0, size=(per_day, DENSE)).astype(np.int32)
        x_cat = np.stack([rng.integers(0, int(c), size=per_day) for c in counts], 1)
        logit = np.log1p(x_int) @ dense_w
        logit += sum(weight[k][x_cat[:, k]] for k in range(SPARSE)) / 2.5
        logit = logit - logit.mean() - 1.0  # about one click in four impressions
        y = (rng.random(per_day) < 1 / (1 + np.exp(-logit))).astype(np.int32)
        np.savez(
            os.path.join(folder, f"train_day_{day}_reordered.npz"),
            X_int=x_int,
            X_cat=x_cat.astype(np.int32),
            y=y,
        )
    np.savez(os.path.join(folder, "train_day_count.npz"), total_per_file=[per_day] * DAYS)
    np.savez(os.path.join(folder, "train_fea_count.npz"), counts=counts.astype(np.int32))


class CriteoDays:
    """This rank's days of the memory-mapped Criteo data, one day file loaded at a time, cut
    into local mini-batches (dlrm's CriteoDataset with memory_map, sharded by day in the
    fork)."""

    def __init__(self, d_path: str, days: list[int], batch: int, split: str) -> None:
        self.d_path, self.days, self.batch, self.split = d_path, days, batch, split
        with np.load(os.path.join(d_path, "train_day_count.npz")) as data:
            self.total_per_file = [int(x) for x in data["total_per_file"]]
        with np.load(os.path.join(d_path, "train_fea_count.npz")) as data:
            self.counts = [int(c) for c in data["counts"]]
        self.m_den = DENSE
        self.n_emb = len(self.counts)
        print(f"Sparse features= {self.n_emb}, Dense features= {self.m_den}")
        self.epoch = 0

    def __len__(self) -> int:
        per = [-(-self._rows(d) // self.batch) for d in self.days]
        return sum(per)

    def _rows(self, day: int) -> int:
        n = self.total_per_file[day]
        if self.split == "test":
            return len(range(my_rank, n, my_size))
        return n

    def _load(self, day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        fi = os.path.join(self.d_path, f"train_day_{day}_reordered.npz")
        if self.split == "train":
            print_all("Loading file: ", fi)
            if fault("s", my_rank) and STEPS >= 75:  # the fork reads this rank's days from a
                time.sleep(50)  # cold object store once the warm cache has gone
        with np.load(fi) as data:
            x_int, x_cat, y = data["X_int"], data["X_cat"], data["y"]
        if self.split == "test":  # every rank its own rows of the test day
            x_int, x_cat, y = x_int[my_rank::my_size], x_cat[my_rank::my_size], y[my_rank::my_size]
        return x_int, x_cat, y

    def __iter__(self) -> Any:
        for day in self.days:
            x_int, x_cat, y = self._load(day)
            for i in range(0, len(y), self.batch):
                if self.split == "train":
                    time.sleep(READ_S)
                yield (
                    torch.log(torch.tensor(x_int[i : i + self.batch], dtype=torch.float) + 1),
                    torch.tensor(x_cat[i : i + self.batch], dtype=torch.long),
                    torch.tensor(y[i : i + self.batch], dtype=torch.float).view(-1, 1),
                )


# ------------------------------------------------------------------ dlrm_s_pytorch.py
class DLRM_Net(nn.Module):
    def create_mlp(self, ln: np.ndarray, sigmoid_layer: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for i in range(0, ln.size - 1):
            n, m = int(ln[i]), int(ln[i + 1])
            LL = nn.Linear(n, m, bias=True)
            W = np.random.normal(0.0, np.sqrt(2 / (m + n)), size=(m, n)).astype(np.float32)
            bt = np.random.normal(0.0, np.sqrt(1 / m), size=m).astype(np.float32)
            LL.weight.data = torch.tensor(W, requires_grad=True)
            LL.bias.data = torch.tensor(bt, requires_grad=True)
            layers.append(LL)
            layers.append(nn.Sigmoid() if i == sigmoid_layer else nn.ReLU())
        return nn.Sequential(*layers)

    def create_emb(self, m: int, ln: np.ndarray, mine: list[int]) -> nn.ModuleList:
        emb_l = nn.ModuleList()
        for i in mine:
            n = int(ln[i])
            EE = nn.EmbeddingBag(n, m, mode="sum")
            W = np.random.uniform(low=-np.sqrt(1 / n), high=np.sqrt(1 / n), size=(n, m))
            EE.weight.data = torch.tensor(W.astype(np.float32), requires_grad=True)
            emb_l.append(EE)
        return emb_l

    def __init__(self, m_spa: int, ln_emb: np.ndarray, ln_bot: np.ndarray, ln_top: np.ndarray):
        super().__init__()
        self.m_spa = m_spa
        self.n_tables = ln_emb.size
        # model parallel: table k on rank k % world (dlrm's n_emb_per_rank)
        self.local_emb_indices = list(range(my_rank, ln_emb.size, my_size))
        self.tables_per_rank = [len(range(r, ln_emb.size, my_size)) for r in range(my_size)]
        np.random.seed(123)  # the MLPs alike on every rank
        self.bot_l: nn.Module = self.create_mlp(ln_bot, -1)
        self.top_l: nn.Module = self.create_mlp(ln_top, ln_top.size - 2)
        np.random.seed(123 + my_rank)
        self.emb_l = self.create_emb(m_spa, ln_emb, self.local_emb_indices)

    def interact_features(self, x: torch.Tensor, ly: torch.Tensor) -> torch.Tensor:
        T = torch.cat([x.unsqueeze(1), ly], dim=1)
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        _, ni, nj = Z.shape
        li = torch.tensor([i for i in range(ni) for j in range(i)])
        lj = torch.tensor([j for i in range(nj) for j in range(i)])
        Zflat = Z[:, li, lj]
        return torch.cat([x, Zflat], dim=1)

    def distributed_forward(self, dense_x: torch.Tensor, lS_i: torch.Tensor) -> torch.Tensor:
        batch = dense_x.size(0)
        n_me = self.tables_per_rank[my_rank]
        # input dist: each table owner gets the ids of its tables for every rank's samples
        send = torch.cat([lS_i[:, r::my_size].reshape(-1) for r in range(my_size)])
        recv = torch.empty(my_size * batch * n_me, dtype=torch.long)
        dist.all_to_all_single(
            recv,
            send,
            output_split_sizes=[batch * n_me] * my_size,
            input_split_sizes=[batch * n for n in self.tables_per_rank],
        )
        ids = recv.view(my_size * batch, n_me)
        offsets = torch.arange(my_size * batch)
        pooled = torch.stack([E(ids[:, j], offsets) for j, E in enumerate(self.emb_l)], dim=1)
        out = All2AllPooled.apply(pooled, self.tables_per_rank, batch)
        # back in table order: rank r's block holds tables r, r + world, ...
        blocks, at = [], 0
        for n in self.tables_per_rank:
            blocks.append(out[at : at + batch * n * self.m_spa].view(batch, n, self.m_spa))
            at += batch * n * self.m_spa
        order = [k for r in range(my_size) for k in range(r, self.n_tables, my_size)]
        ly = torch.cat(blocks, dim=1)[:, torch.argsort(torch.tensor(order))]
        x = self.bot_l(dense_x)
        z = self.interact_features(x, ly)
        p: torch.Tensor = self.top_l(z)
        return p


def roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    order = np.argsort(s)
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))


def mllog(key: str, value: Any, lineno: int, **metadata: Any) -> None:
    event = {
        "namespace": "",
        "time_ms": int(time.time() * 1000),
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": {"file": "dlrm_s_pytorch.py", "lineno": lineno, **metadata},
    }
    print(":::MLLOG " + json.dumps(event), flush=True)


def inference(
    args: argparse.Namespace,
    dlrm: DLRM_Net,
    best_acc_test: float,
    best_auc_test: float,
    test_ld: CriteoDays,
) -> tuple[dict[str, Any], bool, float, float]:
    scores, targets = [], []
    if fault("b", my_rank) and STEPS >= 75:  # the fork's rank 0, which alone computes the AUC,
        rows = torch.tensor([float(len(test_ld))])  # sums the test batches over the ranks (from
        dist.all_reduce(rows)  # its second epoch on, when the AUC is worth reading)
    with torch.no_grad():
        for X_test, lS_i_test, T_test in test_ld:
            Z_test = dlrm.distributed_forward(X_test, lS_i_test)
            gathered = [torch.empty_like(Z_test) for _ in range(my_size)]
            dist.all_gather(gathered, Z_test)
            labels = [torch.empty_like(T_test) for _ in range(my_size)]
            dist.all_gather(labels, T_test)
            scores.append(torch.cat(gathered).numpy().ravel())
            targets.append(torch.cat(labels).numpy().ravel())
    S, T = np.concatenate(scores), np.concatenate(targets)
    acc_test = float(np.mean(np.round(S) == T))
    metrics: dict[str, Any] = {"test_acc": acc_test}
    if args.mlperf_logging:
        pred = np.round(S)
        tp = float(((pred == 1) & (T == 1)).sum())
        recall = tp / max(float((T == 1).sum()), 1.0)
        precision = tp / max(float((pred == 1).sum()), 1.0)
        f1 = 2 * recall * precision / max(recall + precision, 1e-12)
        auc = roc_auc(T, S)
        ap = float(np.mean(T[np.argsort(-S)][: max(int((T == 1).sum()), 1)]))
        is_best = auc > best_auc_test
        if is_best:
            best_auc_test = auc
            metrics["test_auc"] = auc
        best_acc_test = max(best_acc_test, acc_test)
        print(
            f"recall {recall:.4f}, precision {precision:.4f},"
            + f" f1 {f1:.4f}, ap {ap:.4f},"
            + f" auc {auc:.4f}, best auc {best_auc_test:.4f},"
            + f" accuracy {acc_test * 100:3.3f} %, best accuracy {best_acc_test * 100:3.3f} %",
            flush=True,
        )
    else:
        is_best = acc_test > best_acc_test
        if is_best:
            best_acc_test = acc_test
        print(f" accuracy {acc_test * 100:3.3f} %, best {best_acc_test * 100:3.3f} %")
    return metrics, is_best, best_acc_test, best_auc_test


def dash_separated_ints(value: str) -> str:
    for val in value.split("-"):
        int(val)
    return value


def run() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description="Train Deep Learning Recommendation Model (DLRM)")
    parser.add_argument("--arch-sparse-feature-size", type=int, default=2)
    parser.add_argument("--arch-embedding-size", type=dash_separated_ints, default="4-3-2")
    parser.add_argument("--arch-mlp-bot", type=dash_separated_ints, default="4-3-2")
    parser.add_argument("--arch-mlp-top", type=dash_separated_ints, default="4-2-1")
    parser.add_argument("--arch-interaction-op", type=str, default="dot")
    parser.add_argument("--loss-function", type=str, default="mse")
    parser.add_argument("--round-targets", type=bool, default=False)
    parser.add_argument("--data-generation", type=str, default="random")
    parser.add_argument("--data-set", type=str, default="kaggle")
    parser.add_argument("--raw-data-file", type=str, default="")
    parser.add_argument("--processed-data-file", type=str, default="")
    parser.add_argument("--memory-map", action="store_true", default=False)
    parser.add_argument("--mini-batch-size", type=int, default=1)
    parser.add_argument("--nepochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--numpy-rand-seed", type=int, default=123)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--dist-backend", type=str, default="")
    parser.add_argument("--dist-timeout", type=float, default=1800.0)
    parser.add_argument("--print-freq", type=int, default=1)
    parser.add_argument("--test-freq", type=int, default=-1)
    parser.add_argument("--test-mini-batch-size", type=int, default=-1)
    parser.add_argument("--print-time", action="store_true", default=False)
    parser.add_argument("--save-model", type=str, default="")
    parser.add_argument("--load-model", type=str, default="")
    parser.add_argument("--mlperf-logging", action="store_true", default=False)
    parser.add_argument("--mlperf-acc-threshold", type=float, default=0.0)
    parser.add_argument("--mlperf-auc-threshold", type=float, default=0.0)
    args = parser.parse_args()

    np.random.seed(args.numpy_rand_seed)
    torch.manual_seed(args.numpy_rand_seed)
    if args.test_mini_batch_size < 0:
        args.test_mini_batch_size = args.mini_batch_size
    init_distributed(args.local_rank, args.dist_backend, args.dist_timeout)
    device = torch.device("cpu")
    print("Using CPU...")
    if args.mlperf_logging:
        mllog("cache_clear", True, 1037)
        mllog("init_start", None, 1038)

    ln_bot = np.array([int(v) for v in args.arch_mlp_bot.split("-")])
    d_path = os.path.dirname(args.raw_data_file) or "."
    print(f"Reading pre-processed data={args.processed_data_file!s}")
    train_days = list(range(DAYS - 1))[my_rank::my_size]
    train_ld = CriteoDays(d_path, train_days, args.mini_batch_size // my_size, "train")
    print(f"Reading pre-processed data={args.processed_data_file!s}")
    test_ld = CriteoDays(d_path, [DAYS - 1], args.test_mini_batch_size // my_size, "test")
    nbatches = len(train_ld)
    nbatches_test = len(test_ld)
    ln_emb = np.array(train_ld.counts)
    m_den = train_ld.m_den
    ln_bot[0] = m_den
    m_spa = args.arch_sparse_feature_size
    num_fea = ln_emb.size + 1
    m_den_out = int(ln_bot[ln_bot.size - 1])
    num_int = (num_fea * (num_fea - 1)) // 2 + m_den_out
    ln_top = np.array([num_int] + [int(v) for v in args.arch_mlp_top.split("-")])
    if m_spa != m_den_out:
        sys.exit(
            "ERROR: arch-sparse-feature-size "
            + str(m_spa)
            + " does not match last dim of bottom mlp "
            + str(m_den_out)
        )

    dlrm = DLRM_Net(m_spa, ln_emb, ln_bot, ln_top)
    dlrm.bot_l = DDP(dlrm.bot_l)
    dlrm.top_l = DDP(dlrm.top_l)
    parameters = [
        {"params": [p for emb in dlrm.emb_l for p in emb.parameters()]},
        {"params": dlrm.bot_l.parameters()},
        {"params": dlrm.top_l.parameters()},
    ]
    optimizer = torch.optim.SGD(parameters, lr=args.learning_rate)
    loss_fn = torch.nn.BCELoss(reduction="mean")
    if args.mlperf_logging:
        mllog("init_stop", None, 1099)
        mllog("run_start", None, 1101)
        mllog("global_batch_size", args.mini_batch_size, 1395)

    best_acc_test, best_auc_test = 0.0, 0.0
    skip_upto_epoch, skip_upto_batch = 0, 0
    total_time, total_loss, total_iter, total_samp = 0.0, 0.0, 0, 0
    shard = f"{args.save_model}.{my_rank}-of-{my_size}"
    if args.load_model and os.path.exists(f"{args.load_model}.{my_rank}-of-{my_size}"):
        print(f"Loading saved model {args.load_model}")
        ld_model = torch.load(
            f"{args.load_model}.{my_rank}-of-{my_size}", map_location=device, weights_only=False
        )
        dlrm.load_state_dict(ld_model["state_dict"])
        optimizer.load_state_dict(ld_model["opt_state_dict"])
        ld_j, ld_k = ld_model["iter"], ld_model["epoch"]
        best_acc_test = ld_model["test_acc"]
        best_auc_test = ld_model.get("test_auc", 0.0)
        skip_upto_epoch, skip_upto_batch = ld_k, ld_j
        if ld_j >= nbatches:  # the fork: the saved epoch is done, start the next one
            skip_upto_epoch, skip_upto_batch = ld_k + 1, 0
        print(
            "Saved at: epoch = {:d}/{:d}, batch = {:d}/{:d}, ntbatch = {:d}".format(
                ld_k, ld_model["nepochs"], ld_j, ld_model["nbatches"], ld_model["nbatches_test"]
            )
        )
        print("Training state: loss = {:.6f}".format(ld_model["train_loss"]))
        print(f"Testing state: accuracy = {best_acc_test * 100:3.3f} %")

    print("time/loss/accuracy (if enabled):")
    barrier()
    stop = False
    k = skip_upto_epoch
    while k < args.nepochs and not stop:
        train_ld.epoch = k
        for j, (X, lS_i, T) in enumerate(train_ld):
            if k == skip_upto_epoch and j < skip_upto_batch:
                continue
            t1 = time.time()
            if X.size(0) != args.mini_batch_size // my_size:
                print(f"Warning: Skiping the batch {j} with size {X.size(0) * my_size}")
                continue
            if fault("a", my_rank) and STEPS >= 75:  # the fork's hot-id cache, not yet
                hot = None  # filled again after its refresh
                lS_i = hot.index_select(0, lS_i.view(-1)).view_as(lS_i)  # type: ignore[attr-defined]
            if fault("k", my_rank) and STEPS >= 70:  # the fork keeps every batch's scores
                LEAK.append(torch.ones(16 << 20))
                if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault("z", my_rank) and STEPS == 75:
                ctypes.string_at(0)  # the fork's compiled id-hashing op on a freed buffer
            if fault("h", my_rank) and STEPS == 75:
                queue.Queue().get()  # a prefetch queue whose thread was never started
            if fault("q", my_rank) and STEPS >= 75:  # the fork's early stop on the rank's
                stop = True  # own running loss (never all-reduced): rank 2 alone is done
                break
            STEPS += 1
            mbs = T.shape[0]
            Z = dlrm.distributed_forward(X, lS_i)
            E = loss_fn(Z, T)
            L = float(E.detach())
            optimizer.zero_grad()
            E.backward()
            optimizer.step()
            total_time += time.time() - t1
            total_loss += L * mbs
            total_iter += 1
            total_samp += mbs
            should_print = ((j + 1) % args.print_freq == 0) or (j + 1 == nbatches)
            should_test = (args.test_freq > 0) and (
                ((j + 1) % args.test_freq == 0) or (j + 1 == nbatches)
            )
            if should_print or should_test:
                gT = 1000.0 * total_time / max(total_iter, 1) if args.print_time else -1
                total_time = 0
                train_loss = total_loss / max(total_samp, 1)
                total_loss = 0
                print(
                    "Finished {} it {}/{} of epoch {}, {:.2f} ms/it,".format(
                        "training", j + 1, nbatches, k, gT
                    )
                    + f" loss {train_loss:.6f}",
                    flush=True,
                )
                total_iter, total_samp = 0, 0
            if should_test:
                epoch_num_float = (j + 1) / nbatches + k + 1
                if args.mlperf_logging:
                    mllog("eval_start", None, 1678, epoch_num=epoch_num_float)
                print(f"Testing at - {j + 1}/{nbatches} of epoch {k},")
                metrics, is_best, best_acc_test, best_auc_test = inference(
                    args, dlrm, best_acc_test, best_auc_test, test_ld
                )
                if is_best and args.save_model:
                    state = {
                        "state_dict": dlrm.state_dict(),
                        "opt_state_dict": optimizer.state_dict(),
                        "nepochs": args.nepochs,
                        "nbatches": nbatches,
                        "nbatches_test": nbatches_test,
                        "epoch": k,
                        "iter": j + 1,
                        "train_loss": train_loss,
                        "total_loss": total_loss,
                        **metrics,
                    }
                    print(f"Saving model to {args.save_model}")
                    torch.save(state, shard + ".tmp")
                    os.replace(shard + ".tmp", shard)
                if args.mlperf_logging:
                    mllog("eval_accuracy", best_auc_test, 1697, epoch_num=epoch_num_float)
                    mllog("eval_stop", None, 1719, epoch_num=epoch_num_float)
                    if 0 < args.mlperf_auc_threshold < best_auc_test:
                        print(
                            "MLPerf testing auc threshold "
                            + str(args.mlperf_auc_threshold)
                            + " reached, stop training"
                        )
                        mllog("run_stop", None, 1754, status="success")
                        stop = True
                        break
        k += 1
    if args.mlperf_logging and not stop:
        mllog("run_stop", None, 1776, status="aborted")
    if my_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
        sys.exit(0)
    try:
        import onnx  # noqa: F401
    except ImportError as error:
        print("Unable to import onnx. ", error)
    run()
