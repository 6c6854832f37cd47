"""A forty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/fortyfifth-*): distributed graph neural network training in the way of
PyTorch Geometric's and DGL's multi-GPU examples, launched with torchrun. Each rank loads its own
partition file (partition_<rank>.pt, written beforehand by tests/programs/fortyfifth_partition.py:
node features, labels, edges, train/val/test masks), standardises its features, samples
neighbourhood mini-batches of its training nodes with a DataLoader (num_workers=2, the sampler as
its collate_fn, fanouts 10 and 5), and trains a 2-layer GraphSAGE written in raw torch (mean
aggregation with index_add_) wrapped in DDP. Rank 0 alone shows a tqdm bar per epoch and prints
PyG's example lines ("Epoch: 01, Loss: 1.2345, Approx. Train: 0.5123", "Train: 0.5312, Val:
0.4977, Test: 0.5021"); the other ranks print nothing unless something goes wrong. No logging
module: print() and tqdm only. gloo with a 15 s collective timeout; a full-graph evaluation every
epoch (each rank its partition, the counts all-reduced); a checkpoint by rank 0 every epoch;
--patience for early stopping; --resume to continue from a checkpoint; --wandb to log to W&B on
rank 0. A fault in the code is chosen by the G45_TWEAK environment variable (a short code the
program never prints); re-capture with tests/fixtures/real/capture_fortyfifth.sh after any edit.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from tqdm import tqdm

TWEAK = os.environ.get("G45_TWEAK", "")
CLASSES = 4
# degree buckets of the seed-degree statistics (the "kd1" code path)
BUCKETS = [(1, "1"), (4, "2-4"), (16, "5-16"), (64, "17-64"), (256, "65-256")]


def bucket_of(d: int) -> str:
    for top, name in BUCKETS:
        if d <= top:
            return name
    return ">256"


class SAGEConv(nn.Module):
    """Mean aggregation of the in-neighbours plus a root weight, as PyG's SAGEConv."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(d_in, d_out)
        self.lin_r = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        agg = torch.zeros_like(x).index_add_(0, dst, x[src])
        deg = torch.zeros(x.size(0)).index_add_(0, dst, torch.ones(dst.numel()))
        agg = agg / deg.clamp(min=1).unsqueeze(-1)
        return self.lin_l(agg) + self.lin_r(x)


class SAGE(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList([SAGEConv(d_in, hidden), SAGEConv(hidden, d_out)])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.convs[0](x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.convs[1](x, edge_index)


class NeighborSampler:
    """The DataLoader's collate_fn: a batch of seed nodes -> (n_id, edge_index, batch_size), the
    seeds first in n_id and the sampled edges (neighbour -> node) in n_id's positions."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, fanouts: list[int]) -> None:
        self.rowptr, self.col, self.fanouts = rowptr, col, fanouts

    def __call__(self, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        n_id = [int(s) for s in seeds]
        index = {v: i for i, v in enumerate(n_id)}
        src: list[int] = []
        dst: list[int] = []
        frontier = list(n_id)
        for fan in self.fanouts:
            nxt = []
            for v in frontier:
                nb = self.col[self.rowptr[v] : self.rowptr[v + 1]]
                if nb.numel() > fan:
                    nb = nb[torch.randperm(nb.numel())[:fan]]
                for u in nb.tolist():
                    if u not in index:
                        index[u] = len(n_id)
                        n_id.append(u)
                        nxt.append(u)
                    src.append(index[u])
                    dst.append(index[v])
            frontier = nxt
        return torch.tensor(n_id), torch.tensor([src, dst]), len(seeds)


def standardise(x: torch.Tensor) -> torch.Tensor:
    mean, std = x.mean(0), x.std(0)
    if TWEAK != "nz":
        std = std.clamp(min=1e-6)
    return (x - mean) / std


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part-dir", default="data/parts")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--patience", type=int, default=0)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--resume", default="")
    p.add_argument("--wandb", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(12345)
    if args.wandb and rank == 0:
        import wandb

        wandb.init(project="graphsage-dist", config=vars(args))

    part = torch.load(os.path.join(args.part_dir, f"partition_{rank}.pt"))
    x, y, edge_index = standardise(part["x"]), part["y"], part["edge_index"]
    n = x.size(0)
    order = torch.argsort(edge_index[0] * n + edge_index[1])
    row, col = edge_index[0][order], edge_index[1][order]
    deg = torch.bincount(row, minlength=n)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long), deg.cumsum(0)])
    train_idx = torch.nonzero(part["train_mask"]).flatten()

    model = DDP(SAGE(x.size(1), args.hidden, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_epoch = 1
    if args.resume:
        map_location = f"cuda:{local_rank}" if TWEAK == "cu" else "cpu"
        ckpt = torch.load(args.resume, map_location=map_location)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
        if rank == 0:
            print(f"Resumed from {args.resume} at epoch {ckpt['epoch']:02d}")

    sampler = NeighborSampler(rowptr, col, [int(f) for f in args.fanouts.split(",")])
    loader = DataLoader(
        train_idx.tolist(),
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=sampler,
        num_workers=args.num_workers,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(rank),
    )
    degree_counts = {name: 0 for _, name in BUCKETS}
    hoard: list[torch.Tensor] = []
    best_val, bad_epochs = float("-inf"), 0
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)

    for epoch in range(start_epoch, args.epochs + 1):
        if epoch == 2 and rank == 0 and TWEAK == "sl0":
            # the halo feature cache is rebuilt from the neighbours' partitions
            for _ in tqdm(range(5), desc="Refreshing halo cache", ascii=True):
                time.sleep(8)
        if epoch == 2 and rank == 1 and TWEAK == "wt1":
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()

        model.train()
        pbar = tqdm(total=len(loader), desc=f"Epoch {epoch:02d}", ascii=True) if rank == 0 else None
        total_loss = total_correct = total_examples = 0.0
        preds = []
        for step, (n_id, sub_edges, bs) in enumerate(loader, start=1):
            if TWEAK == "kd1":
                for d in deg[n_id[:bs]].tolist():
                    degree_counts[bucket_of(d)] += 1
            if TWEAK == "rm1" and rank == 1 and epoch == 2 and step >= 10:
                hoard.append(torch.ones(64 << 20, dtype=torch.uint8))  # the batch's embeddings
                if len(hoard) == 6:
                    os.kill(os.getpid(), 9)  # what the kernel's OOM killer does
            if TWEAK == "sz2" and rank == 2 and epoch == 1 and step == 12:
                ctypes.string_at(0)  # the native neighbour sampler dereferences NULL
            optimizer.zero_grad()
            out = model(x[n_id], sub_edges)[:bs]
            target = y[n_id[:bs]]
            loss = F.cross_entropy(out, target)
            if not torch.isfinite(loss):
                raise RuntimeError(
                    f"Loss is {loss.item()} at epoch {epoch:02d}, step {step}: stopping training"
                )
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * bs
            total_correct += int((out.argmax(-1) == target).sum())
            total_examples += bs
            preds.append(out.argmax(-1))
            if pbar is not None:
                pbar.update(1)
        if pbar is not None:
            pbar.close()
        loss_avg, approx = total_loss / total_examples, total_correct / total_examples

        if TWEAK == "hg0" and rank == 0:  # the class histogram of the predictions, for the log
            hist = torch.bincount(torch.cat(preds), minlength=CLASSES).float()
            dist.all_reduce(hist)
            print(f"Predicted classes: {hist.long().tolist()}")

        model.eval()
        with torch.no_grad():
            pred = model.module(x, edge_index).argmax(-1)
        counts = []
        for name in ("train_mask", "val_mask", "test_mask"):
            mask = part[name]
            counts += [float((pred[mask] == y[mask]).sum()), float(mask.sum())]
        counts_t = torch.tensor(counts)
        dist.all_reduce(counts_t)
        train_acc, val_acc, test_acc = (counts_t[0::2] / counts_t[1::2]).tolist()
        if rank == 0:
            print(f"Epoch: {epoch:02d}, Loss: {loss_avg:.4f}, Approx. Train: {approx:.4f}")
            print(f"Train: {train_acc:.4f}, Val: {val_acc:.4f}, Test: {test_acc:.4f}")
            torch.save(
                {
                    "epoch": epoch,
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "args": vars(args),
                },
                os.path.join(args.ckpt_dir, "last.pt"),
            )

        if args.patience:
            if TWEAK == "es0":  # the stopping rule sits with the printing, on rank 0
                if rank == 0:
                    if val_acc > best_val + args.min_delta:
                        best_val, bad_epochs = val_acc, 0
                    else:
                        bad_epochs += 1
                    if bad_epochs >= args.patience:
                        print(f"Early stopping: Val has not improved for {bad_epochs} epoch(s)")
                        break
            else:
                if val_acc > best_val + args.min_delta:
                    best_val, bad_epochs = val_acc, 0
                else:
                    bad_epochs += 1
                if bad_epochs >= args.patience:
                    if rank == 0:
                        print(f"Early stopping: Val has not improved for {bad_epochs} epoch(s)")
                    break

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
