"""The prepare step of the hundredthirtysecond style (tests/programs/hundredthirtysecond_style_train.py):
writes ./example_data the way Uni-Mol's pretraining data are laid out (dict.txt, train.lmdb,
valid.lmdb), each "lmdb" re-created as a folder of pickled shards (data-00000.pkl, ...) with an
index (index.pkl: shard names and sizes), because lmdb is not installed. Every molecule is a
dict {"atoms": [...], "coordinates": [conformer (n, 3) float32, ...], "smi": str} with hydrogens,
as RDKit's AddHs/EmbedMultipleConfs write them. Synthetic and small: no download.

    python write_lmdb.py ./example_data [--train-shards 4] [--shard-size 64]
        [--hydrogen-only SHARD:INDEX] [--nan-conformer SHARD:INDEX]
"""

from __future__ import annotations

import argparse
import os
import pickle

import numpy as np

DICT = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "C", "N", "O", "S", "H", "Cl", "F", "Br", "P", "I"]
HEAVY = ["C", "C", "C", "C", "N", "O", "O", "S", "Cl", "F"]


def molecule(rng: np.random.Generator) -> dict:
    heavy = list(rng.choice(HEAVY, size=int(rng.integers(5, 14))))
    atoms = heavy + ["H"] * int(rng.integers(2, len(heavy) + 3))
    base = rng.normal(scale=1.6, size=(len(atoms), 3)).astype(np.float32)
    confs = [base + rng.normal(scale=0.2, size=base.shape).astype(np.float32) for _ in range(2)]
    smi = "".join(a if len(a) == 1 else f"[{a}]" for a in heavy)
    return {"atoms": atoms, "coordinates": confs, "smi": smi}


def write_split(folder: str, shards: int, size: int, seed: int, edits: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    index = []
    for s in range(shards):
        mols = [molecule(rng) for _ in range(size)]
        for (shard, i), edit in edits.items():
            if shard == s:
                edit(mols[i])
        name = f"data-{s:05d}.pkl"
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(mols, f)
        index.append((name, len(mols)))
    with open(os.path.join(folder, "index.pkl"), "wb") as f:
        pickle.dump(index, f)


def hydrogen_only(mol: dict) -> None:
    """A hydrogen molecule (SMILES [H][H]): nothing is left once hydrogens are removed."""
    mol["atoms"] = ["H", "H"]
    mol["coordinates"] = [np.array([[0.0, 0.0, 0.0], [0.74, 0.0, 0.0]], np.float32)] * 2
    mol["smi"] = "[H][H]"


def nan_conformer(mol: dict) -> None:
    """A molecule whose conformer embedding failed and was written as NaN."""
    mol["coordinates"] = [np.full_like(c, np.nan) for c in mol["coordinates"]]


def where(text: str) -> tuple[int, int]:
    shard, index = text.split(":")
    return int(shard), int(index)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--train-shards", type=int, default=4)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--hydrogen-only", default="")
    p.add_argument("--nan-conformer", default="")
    args = p.parse_args()
    edits = {}
    if args.hydrogen_only:
        edits[where(args.hydrogen_only)] = hydrogen_only
    if args.nan_conformer:
        edits[where(args.nan_conformer)] = nan_conformer
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dict.txt"), "w") as f:
        f.write("".join(f"{t}\n" for t in DICT))
    write_split(os.path.join(args.out, "train.lmdb"), args.train_shards, args.shard_size, 1, edits)
    write_split(os.path.join(args.out, "valid.lmdb"), 2, 32, 2, {})
    print(f"wrote {args.train_shards} train shards of {args.shard_size} to {args.out}")


if __name__ == "__main__":
    main()
