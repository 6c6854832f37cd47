"""The data step of the forty-fifth training-program style (tests/fixtures/real/fortyfifth-*), in
the way of DGL's partition_graph.py and PyG's distributed examples: a synthetic node-
classification graph (four classes, homophilous edges, noisy class-dependent features, a few
bag-of-words columns, one hub node of high degree) is generated and split into one file per rank,
<out>/partition_<k>.pt, each holding its nodes' features, labels, the edges among them (local ids,
both directions) and train/val/test masks. With --balance-train (the default) every part gets the
same number of training nodes; --no-balance-train leaves them as the split falls.
"""

from __future__ import annotations

import argparse
import os

import torch

CLASSES = 4
FEATURES = 24
WORDS = 8  # bag-of-words columns at the end of the features
NODES_PER_PART = 1000
TRAIN_PER_PART = 640


def make_part(k: int, n: int, n_train: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    y = torch.randint(0, CLASSES, (n,), generator=g)
    centers = torch.randn(CLASSES, FEATURES - WORDS, generator=torch.Generator().manual_seed(7))
    dense = centers[y] + 6.0 * torch.randn(n, FEATURES - WORDS, generator=g)
    words = (torch.rand(n, WORDS, generator=g) < 0.15).float()
    if k == 1:
        words[:, WORDS - 1] = 0.0  # a word no document of this part contains
    x = torch.cat([dense, words], 1)
    # homophilous edges: each node links to 2 of its class and 2 at random, plus a ring
    src, dst = [], []
    by_class = [torch.nonzero(y == c).flatten() for c in range(CLASSES)]
    for v in range(n):
        same = by_class[int(y[v])]
        picks = same[torch.randint(0, len(same), (2,), generator=g)].tolist()
        picks += torch.randint(0, n, (2,), generator=g).tolist()
        picks.append((v + 1) % n)
        for u in picks:
            if u != v:
                src.append(v)
                dst.append(u)
    if k == 1:  # a hub: node 0 of this part is linked to 300 others
        for u in range(1, 301):
            src.append(0)
            dst.append(u)
    ei = torch.tensor([src + dst, dst + src])
    ei = torch.unique(ei, dim=1)
    perm = torch.randperm(n, generator=g)
    if k == 1:  # keep the hub among the training nodes
        perm = torch.cat([torch.tensor([0]), perm[perm != 0]])
    n_val = (n - n_train) // 2
    masks = {}
    for name, ids in (
        ("train_mask", perm[:n_train]),
        ("val_mask", perm[n_train : n_train + n_val]),
        ("test_mask", perm[n_train + n_val :]),
    ):
        m = torch.zeros(n, dtype=torch.bool)
        m[ids] = True
        masks[name] = m
    return {"x": x, "y": y, "edge_index": ei, **masks}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-parts", type=int, required=True)
    p.add_argument("--out", default="data/parts")
    p.add_argument("--balance-train", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=45)
    args = p.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    total = NODES_PER_PART * args.num_parts
    print(f"Generating graph: {total} nodes, {CLASSES} classes, {FEATURES} features")
    print(f"Partitioning into {args.num_parts} parts (balance_train={args.balance_train})")
    os.makedirs(args.out, exist_ok=True)
    for k in range(args.num_parts):
        n_train = TRAIN_PER_PART
        if not args.balance_train and k == 1:
            n_train = TRAIN_PER_PART * 7 // 10  # the split fell short on this part
        part = make_part(k, NODES_PER_PART, n_train, g)
        path = os.path.join(args.out, f"partition_{k}.pt")
        torch.save(part, path)
        print(
            f"Part {k}: {NODES_PER_PART} nodes, {part['edge_index'].size(1)} edges, "
            f"{int(part['train_mask'].sum())} train nodes -> {path}"
        )
    print(f"Saved {args.num_parts} partitions to {args.out}")


if __name__ == "__main__":
    main()
