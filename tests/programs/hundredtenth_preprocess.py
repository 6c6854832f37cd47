"""The data preparation of the hundred-tenth training-program style (tests/programs/
hundredtenth_style_train.py; linked into each run's folder as scripts/preprocess_ef.py): in the
way of the Open Catalyst Project's scripts/preprocess_ef.py and scripts/make_lmdb_sizes.py, it
writes S2EF structures (adsorbate-on-slab-like clusters, energies and forces of a Morse pair
potential, tags and fixed flags) into shard files data.NNNN.lmdb of an LMDB-like format of its
own (the magic b"OCPLMDB1", the entry count and each entry's offset in the header, then each
entry pickled), and, unless --no-metadata, the metadata.npz (natoms of every entry) that the
balanced batch sampler reads. --isolated-atoms N appends N single-atom reference structures (the
isolated-atom energies MACE-style data sets carry for the E0s); --bulk-atoms N adds one large
structure of N atoms to the first shard; --scale-file writes the fitted scale factors of the
model (scripts/fit_scaling.py's output). Nothing is downloaded."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import struct

import numpy as np
import torch

MAGIC = b"OCPLMDB1"
ELEMENTS = [1, 6, 7, 8]  # H C N O
SLAB = [29, 78]  # Cu Pt

SCALE_FACTORS = {
    "TripInteraction_1_had_rbf": 18.87,
    "TripInteraction_1_sum_cbf": 7.42,
    "AtomUpdate_1_sum": 0.52,
    "TripInteraction_2_had_rbf": 16.31,
    "TripInteraction_2_sum_cbf": 7.16,
    "AtomUpdate_2_sum": 0.44,
    "TripInteraction_3_had_rbf": 15.95,
    "TripInteraction_3_sum_cbf": 7.08,
    "AtomUpdate_3_sum": 0.41,
    "OutBlock_0_sum": 0.61,
    "OutBlock_0_had": 1.83,
    "OutBlock_1_sum": 0.47,
    "OutBlock_1_had": 2.01,
}


def morse(pos: torch.Tensor, d: float = 0.35, a: float = 1.6, r0: float = 1.45):
    """Energy (eV) and forces (eV/A) of a Morse pair potential."""
    pos = pos.clone().requires_grad_(True)
    n = pos.shape[0]
    if n == 1:
        return 0.0, np.zeros((1, 3), dtype=np.float32)
    r = torch.cdist(pos, pos)
    iu = torch.triu_indices(n, n, 1)
    rij = r[iu[0], iu[1]]
    energy = (d * (1 - torch.exp(-a * (rij - r0))) ** 2 - d).sum()
    (grad,) = torch.autograd.grad(energy, pos)
    return float(energy.detach()), (-grad).numpy().astype(np.float32)


def structure(rng: np.random.Generator, sid: int, natoms: int) -> dict:
    """A slab-like cluster: each new atom 1.1-1.7 A from one placed before it."""
    pos = [np.zeros(3)]
    while len(pos) < natoms:
        base = pos[rng.integers(len(pos))]
        v = rng.normal(size=3)
        cand = base + v / np.linalg.norm(v) * rng.uniform(1.1, 1.7)
        if min(np.linalg.norm(cand - p) for p in pos) > 1.0:
            pos.append(cand)
    pos_t = torch.tensor(np.array(pos), dtype=torch.float32)
    energy, forces = morse(pos_t)
    tags = np.where(
        np.arange(natoms) < natoms // 3, 0, np.where(np.arange(natoms) < natoms - 2, 1, 2)
    )
    numbers = np.where(tags == 2, rng.choice(ELEMENTS, natoms), rng.choice(SLAB, natoms))
    return {
        "sid": sid,
        "fid": int(rng.integers(0, 200)),
        "natoms": natoms,
        "pos": pos_t.numpy(),
        "atomic_numbers": numbers.astype(np.int64),
        "cell": np.diag([12.0, 12.0, 24.0]).astype(np.float32),
        "tags": tags.astype(np.int64),
        "fixed": (tags == 0).astype(np.int64),
        "y": energy,
        "force": forces,
    }


def bulk(rng: np.random.Generator, sid: int, natoms: int) -> dict:
    """A large bulk-like block: a jittered simple cubic lattice of spacing 1.5 A."""
    side = int(np.ceil(natoms ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)
    pos = (grid[:natoms] * 1.5 + rng.uniform(-0.1, 0.1, (natoms, 3))).astype(np.float32)
    energy, forces = morse(torch.tensor(pos))
    tags = np.where(np.arange(natoms) < natoms // 2, 0, 1)
    return {
        "sid": sid,
        "fid": 0,
        "natoms": natoms,
        "pos": pos,
        "atomic_numbers": rng.choice(SLAB, natoms).astype(np.int64),
        "cell": np.diag([side * 1.5] * 3).astype(np.float32),
        "tags": tags.astype(np.int64),
        "fixed": (tags == 0).astype(np.int64),
        "y": energy,
        "force": forces,
    }


def isolated_atom(sid: int, z: int) -> dict:
    return {
        "sid": sid,
        "fid": 0,
        "natoms": 1,
        "pos": np.full((1, 3), 10.0, dtype=np.float32),
        "atomic_numbers": np.array([z]),
        "cell": np.diag([20.0, 20.0, 20.0]).astype(np.float32),
        "tags": np.array([2]),
        "fixed": np.array([0]),
        "y": 0.0,
        "force": np.zeros((1, 3), dtype=np.float32),
    }


def write_shard(path: str, entries: list[dict]) -> None:
    blobs = [pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL) for e in entries]
    header = len(MAGIC) + 8 + 8 * len(blobs)
    offsets, pos = [], header
    for b in blobs:
        offsets.append(pos)
        pos += len(b)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", len(blobs)))
        f.write(struct.pack(f"<{len(blobs)}Q", *offsets))
        for b in blobs:
            f.write(b)


def main() -> None:
    p = argparse.ArgumentParser(description="Preprocess S2EF structures into LMDB shards")
    p.add_argument("--out-path", required=True)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--num-shards", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sid-offset", type=int, default=0)
    p.add_argument("--isolated-atoms", type=int, default=0)
    p.add_argument("--bulk-atoms", type=int, default=0)
    p.add_argument("--no-metadata", action="store_true")
    p.add_argument("--scale-file", default="")
    args = p.parse_args()
    if args.scale_file:
        os.makedirs(os.path.dirname(args.scale_file), exist_ok=True)
        with open(args.scale_file, "w") as f:
            json.dump({"comment": "fitted by scripts/fit_scaling.py", **SCALE_FACTORS}, f, indent=2)
        return
    rng = np.random.default_rng(args.seed)
    entries = [
        structure(rng, args.sid_offset + k, int(rng.integers(6, 15))) for k in range(args.size)
    ]
    for k in range(args.isolated_atoms):
        entries.append(isolated_atom(args.sid_offset + args.size + k, ELEMENTS[k % 4]))
    shards = [entries[k :: args.num_shards] for k in range(args.num_shards)]
    if args.isolated_atoms:  # the reference atoms stay at the end of the last shard
        plain = entries[: args.size]
        shards = [plain[k :: args.num_shards] for k in range(args.num_shards)]
        shards[-1] += entries[args.size :]
    if args.bulk_atoms:
        shards[0].insert(1, bulk(rng, args.sid_offset + 9000, args.bulk_atoms))
    os.makedirs(args.out_path, exist_ok=True)
    for k, shard in enumerate(shards):
        write_shard(os.path.join(args.out_path, f"data.{k:04d}.lmdb"), shard)
    if not args.no_metadata:
        natoms = np.array([e["natoms"] for shard in shards for e in shard])
        np.savez(os.path.join(args.out_path, "metadata.npz"), natoms=natoms)


if __name__ == "__main__":
    main()
