"""A forty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/fortyseventh-*): a click-through-rate model in the way of the DLRM and
torchrec examples, in raw torch (no torchrec). Each rank owns some of the 26 embedding tables
(model parallel: table t lives on rank t % world); the dense bottom and top MLPs are data parallel
in DDP. Every step each rank sends the categorical ids of its batch to the tables' owners with
torch.distributed.all_to_all_single, the owners look them up and send the embeddings back the same
way (an autograd function runs the reverse exchange in backward), then the dot-product
interaction and the top MLP. The click log is Criteo-like (label, 13 dense, 26 hashed categorical
columns, tab separated), one shard file per rank, written at capture time (--make-data). The
table sizes come from a JSON config each rank reads. Rank 0 prints the examples' progress lines
("Epoch 0 [   8/  20] loss 0.6931 auroc 0.5012 it/s 35.2") and a tqdm bar for evaluation; every
rank logs warnings through logging with the rank added by a LoggerAdapter. gloo with a 15 s
collective timeout; every rank saves its part of a checkpoint each epoch; --patience stops early
on the all-gathered validation AUROC; --resume continues from a checkpoint folder. A fault in
the code is chosen by the RS47_KNOB environment variable (a short code the program never prints);
launched by tests/programs/fortyseventh_launch.sh; re-capture with
tests/fixtures/real/capture_fortyseventh.sh after any edit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import signal
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

KNOB = os.environ.get("RS47_KNOB", "")
N_DENSE = 13
N_CAT = 26
TIMEOUT = timedelta(seconds=15)


class ExchangeIds(torch.autograd.Function):
    """all_to_all_single with its reverse in backward (what torchrec's awaitables do)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int]):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


def exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
    if x.requires_grad:
        return ExchangeIds.apply(x, out_splits, in_splits)
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
    return out


class ShardedEmbeddings(nn.Module):
    """The tables this rank owns, and the two exchanges of a lookup."""

    def __init__(self, sizes: list[int], dim: int, rank: int, world: int) -> None:
        super().__init__()
        self.rank, self.world, self.dim = rank, world, dim
        self.owned = [[t for t in range(N_CAT) if t % world == r] for r in range(world)]
        self.tables = nn.ModuleDict(
            {f"t_cat_{t}": nn.Embedding(sizes[t], dim) for t in self.owned[rank]}
        )
        for emb in self.tables.values():
            nn.init.uniform_(emb.weight, -0.05, 0.05)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = ids.size(0)
        mine = len(self.owned[self.rank])
        send = torch.cat([ids[:, cols].reshape(-1) for cols in self.owned])
        in_splits = [b * len(cols) for cols in self.owned]
        got = exchange(send, [b * mine] * self.world, in_splits).view(self.world, b, mine)
        looked = torch.stack(
            [self.tables[f"t_cat_{t}"](got[:, :, k]) for k, t in enumerate(self.owned[self.rank])],
            dim=2,
        )  # (world, b, mine, dim)
        back = exchange(looked.reshape(-1, self.dim), in_splits, [b * mine] * self.world)
        parts = back.split(in_splits)
        order = torch.cat([torch.tensor(cols) for cols in self.owned])
        out = torch.cat(
            [p.view(b, len(c), self.dim) for p, c in zip(parts, self.owned, strict=True)], dim=1
        )
        return out[:, order.argsort()]


class DenseArch(nn.Module):
    """Bottom MLP, dot interaction and top MLP: the data-parallel part (DDP)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bottom = nn.Sequential(
            nn.Linear(N_DENSE, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU()
        )
        n = N_CAT + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 32), nn.ReLU(), nn.Linear(32, 1))
        self.tri = torch.triu_indices(n, n, offset=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        feats = torch.cat([d.unsqueeze(1), sparse], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.tri[0], self.tri[1]]
        return self.top(torch.cat([d, inter], dim=1)).squeeze(1)


def auroc(p: torch.Tensor, y: torch.Tensor) -> float:
    npos = float(y.sum())
    nneg = len(y) - npos
    if npos == 0 or nneg == 0:
        return 0.5
    ranks = torch.empty_like(p)
    ranks[p.argsort()] = torch.arange(1, len(p) + 1, dtype=p.dtype)
    return float((ranks[y == 1].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def read_shard(path: str, sizes: list[int], log: logging.LoggerAdapter):
    """label, 13 dense (may be empty), 26 hex categorical values -> tensors; ids hashed into the
    configured table sizes."""
    labels, dense, ids = [], [], []
    missing = 0
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            labels.append(float(cols[0]))
            row = []
            for v in cols[1 : 1 + N_DENSE]:
                if v == "":
                    missing += 1
                    row.append(0.0)
                else:
                    row.append(math.log1p(max(float(v), 0.0)) if v != "nan" else float(v))
            dense.append(row)
            ids.append(
                [int(h, 16) % sizes[t] if h else 0 for t, h in enumerate(cols[1 + N_DENSE :])]
            )
    if missing:
        log.warning(
            "%s: %d missing dense values in %d rows filled with 0",
            os.path.basename(path),
            missing,
            len(labels),
        )
    return torch.tensor(labels), torch.tensor(dense), torch.tensor(ids, dtype=torch.long)


def make_data(out: str, world: int, rows: int, val_rows: int, seed: int = 47) -> None:
    g = torch.Generator().manual_seed(seed)
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    os.makedirs(os.path.join(out, "config"), exist_ok=True)
    sizes = [int(s) for s in torch.randint(40, 900, (N_CAT,), generator=g)]
    cfg = {
        "embedding_dim": 8,
        "tables": [
            {"name": f"t_cat_{t}", "feature": f"cat_{t}", "num_embeddings": sizes[t]}
            for t in range(N_CAT)
        ],
    }
    with open(os.path.join(out, "config", "tables.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    w_cat = torch.randn(N_CAT, 50, generator=g)
    for split, n in (("train", rows), ("val", val_rows)):
        for r in range(world):
            with open(os.path.join(out, "data", f"{split}_part_{r}.tsv"), "w") as f:
                for _ in range(n):
                    dense = (torch.rand(N_DENSE, generator=g) ** 3 * 200).round()
                    raw = (torch.rand(N_CAT, generator=g) ** 2 * 50).long()
                    score = (
                        dense[:3].log1p().sum() / 6 - 1.2 + w_cat[torch.arange(N_CAT), raw].mean()
                    )
                    label = int(torch.rand(1, generator=g).item() < torch.sigmoid(score * 2).item())
                    dvals = [
                        "" if torch.rand(1, generator=g).item() < 0.03 else str(int(v))
                        for v in dense
                    ]
                    cats = [
                        f"{(int(v) * 2654435761 + t * 97) & 0xFFFFFFFF:08x}"
                        for t, v in enumerate(raw)
                    ]
                    f.write("\t".join([str(label), *dvals, *cats]) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--config", default="config/tables.json")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--print-every", type=int, default=8)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--resume", default="")
    p.add_argument("--tensorboard", action="store_true")
    p.add_argument("--make-data", type=int, default=0, help="rows per train shard; write and stop")
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    if args.make_data:
        make_data(".", args.world, args.make_data, args.make_data // 5)
        return

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    logging.basicConfig(
        format="%(asctime)s %(levelname)s rank%(rank)s %(name)s: %(message)s",
        level=logging.WARNING,
    )
    log = logging.LoggerAdapter(logging.getLogger("dlrm_main"), {"rank": rank})
    dist.init_process_group("gloo", timeout=TIMEOUT)
    world = dist.get_world_size()
    torch.manual_seed(1234)

    config = args.config
    if KNOB == "sv1" and rank == 1:  # this rank's copy of the config is last week's
        config = os.path.join(os.path.dirname(args.config), "tables.prev.json")
    with open(config) as f:
        cfg = json.load(f)
    sizes = [t["num_embeddings"] for t in cfg["tables"]]
    dim = cfg["embedding_dim"]
    if rank == 0:
        print(
            f"world_size {world}, {len(sizes)} embedding tables ({sum(sizes)} rows, dim {dim}), "
            f"batch size {args.batch_size} per rank"
        )
    if args.tensorboard and rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter("runs/dlrm")
        writer.add_text("config", json.dumps(vars(args)))

    y_tr, x_tr, c_tr = read_shard(os.path.join(args.data, f"train_part_{rank}.tsv"), sizes, log)
    y_va, x_va, c_va = read_shard(os.path.join(args.data, f"val_part_{rank}.tsv"), sizes, log)

    sparse = ShardedEmbeddings(sizes, dim, rank, world)
    dense = DDP(DenseArch(dim))
    opt_dense = torch.optim.Adagrad(dense.parameters(), lr=args.lr)
    opt_sparse = torch.optim.SGD(sparse.parameters(), lr=args.lr * 4)
    loss_fn = nn.BCEWithLogitsLoss()
    start_epoch = 0
    if args.resume:
        path = os.path.join(args.resume, f"rank_{rank}.pt")
        if KNOB == "cu":
            state = torch.load(path, map_location=f"cuda:{local_rank}")
        else:
            state = torch.load(path)
        dense.module.load_state_dict(state["dense"])
        sparse.load_state_dict(state["sparse"])
        start_epoch = state["epoch"] + 1
        if rank == 0:
            print(f"Resumed from {args.resume} at epoch {start_epoch}")

    bs = args.batch_size
    n_batches = len(y_tr) // bs
    best, stale = -math.inf, 0
    hoard: list[torch.Tensor] = []
    hot_ids: dict[str, torch.Tensor] = {}
    for epoch in range(start_epoch, args.epochs):
        if epoch == 1 and KNOB == "rb0" and rank == 0:  # rebuild the hashed vocabulary
            for part in range(1, 5):
                log.warning("rebuilding id frequency tables: part %d/4", part)
                time.sleep(10)
        if epoch == 1 and KNOB == "pk1" and rank == 1:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        dense.train()
        t0 = time.time()
        window_p: list[torch.Tensor] = []
        window_y: list[torch.Tensor] = []
        window_loss = 0.0
        for it in range(n_batches):
            sl = slice(it * bs, (it + 1) * bs)
            xd, xc, y = x_tr[sl], c_tr[sl], y_tr[sl]
            if KNOB == "hd1" and rank == 1:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if KNOB == "lg2" and rank == 2 and epoch == 0 and it == 9:
                ctypes.string_at(0)  # the native id hasher dereferences NULL
            if it % 12 == 11:  # the hottest ids of the tables this rank owns
                for t in sparse.owned[rank]:
                    hot_ids[f"t_cat_{t}"] = xc[:, t].bincount().argmax()
                if KNOB == "fk1" and rank == 1 and epoch == 0:
                    top = hot_ids["t_cat_0"]  # t_cat_0 lives on rank 0
                    log.warning("hottest id of t_cat_0: %d", int(top))
            logits = dense(xd, sparse(xc))
            loss = loss_fn(logits, y)
            if not torch.isfinite(loss):
                raise RuntimeError(f"loss is {loss.item()} at epoch {epoch} iteration {it}")
            opt_dense.zero_grad()
            opt_sparse.zero_grad()
            loss.backward()
            opt_dense.step()
            opt_sparse.step()
            window_loss += loss.item()
            window_p.append(logits.detach())
            window_y.append(y)
            if (it + 1) % args.print_every == 0:
                if KNOB == "ls0" and rank == 0:  # the global loss for the log line
                    total = torch.tensor([window_loss])
                    dist.all_reduce(total)
                    window_loss = total.item() / world
                if rank == 0:
                    ips = args.print_every / (time.time() - t0)
                    a = auroc(torch.cat(window_p), torch.cat(window_y))
                    print(
                        f"Epoch {epoch} [{it + 1:4d}/{n_batches:4d}] "
                        f"loss {window_loss / args.print_every:.4f} auroc {a:.4f} it/s {ips:.1f}"
                    )
                t0 = time.time()
                window_p, window_y, window_loss = [], [], 0.0

        dense.eval()
        preds = []
        with torch.no_grad():
            for vb in tqdm(range(len(y_va) // 64), desc="Evaluating", disable=rank != 0):
                sl = slice(vb * 64, (vb + 1) * 64)
                preds.append(torch.sigmoid(dense(x_va[sl], sparse(c_va[sl]))))
        p_all = torch.cat(preds)
        y_all = y_va[: len(p_all)]
        gp = [torch.empty_like(p_all) for _ in range(world)]
        gy = [torch.empty_like(y_all) for _ in range(world)]
        dist.all_gather(gp, p_all)
        dist.all_gather(gy, y_all)
        pv, yv = torch.cat(gp), torch.cat(gy)
        val_auroc = auroc(pv, yv)
        logloss = float(nn.functional.binary_cross_entropy(pv.clamp(1e-7, 1 - 1e-7), yv))
        if rank == 0:
            print(f"Epoch {epoch} validation auroc {val_auroc:.4f} logloss {logloss:.4f}")
        ckpt = os.path.join("checkpoints", f"epoch_{epoch}")
        os.makedirs(ckpt, exist_ok=True)
        torch.save(
            {
                "dense": dense.module.state_dict(),
                "sparse": sparse.state_dict(),
                "epoch": epoch,
                "tables": cfg["tables"],
            },
            os.path.join(ckpt, f"rank_{rank}.pt"),
        )
        if rank == 0:
            print(f"Saved checkpoint to {ckpt}")
        if args.patience and (KNOB != "es0" or rank == 0):
            if val_auroc > best + args.min_delta:
                best, stale = val_auroc, 0
            else:
                stale += 1
            if stale >= args.patience:
                if rank == 0:
                    print(f"Early stopping: validation auroc has not improved for {stale} epoch(s)")
                break
    if rank == 0:
        print(f"Training finished after epoch {epoch}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
