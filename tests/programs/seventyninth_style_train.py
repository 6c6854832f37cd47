"""A seventy-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/seventyninth-*): a machine-learned interatomic potential trained in the way
of MACE's `mace_run_train` (and NequIP/Allegro), re-implemented in plain torch (no e3nn, no
torch_geometric): a small message-passing model with invariant (l=0) and vector (l=1) messages
on a Bessel radial basis with a polynomial cutoff, per-element readouts, E0s and a scale/shift
from a statistics pass; energies summed per configuration, forces from
torch.autograd.grad(create_graph=True) inside the model's forward, DDP over gloo, EMA of the
weights, a stage two (SWA) that changes the loss weights at --start_swa, patience on the
validation loss, checkpoints `checkpoints/<name>_run-<seed>_epoch-<N>[_swa].pt`, the final model
`<name>.model`. Started as MACE's docs start it on several processes: `torchrun
--nproc_per_node=N --master_port=PORT mace_run_train --config config.yaml` with `distributed:
true` and `launcher: torchrun` (the default launcher is slurm). The logger is MACE's: '%(asctime)s.
%(msecs)03d %(levelname)s: %(message)s' on stdout and logs/<tag>.log (tag <name>_run-<seed>), a
debug log beside it, every record filtered out on ranks other than 0.

The data are what `mace_prepare_data --num_process N` leaves behind, in numpy archives instead
of HDF5 (h5py is not installed): processed_data/train/train_<k>.npz and
processed_data/valid/valid_<k>.npz, one shard per process, each with its configurations' atomic
numbers, positions, REF_energy, REF_forces and the edge index of a neighbour list built at
`r_max`; a process reads its own shard (a shard being written holds a `.lock` beside it). The
configurations are small H/C/O clusters labelled by a toy Morse pair potential (`--make_data`
writes them, an extxyz file too). A fault in the code is chosen by $MLIP_Q (a short code) and never
printed; the others are in what a run is given (re-capture with
tests/fixtures/real/capture_seventyninth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import logging
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import SWALR, AveragedModel

__version__ = "0.3.10"

SYMBOLS = {1: "H", 6: "C", 8: "O", 9: "F"}
NUMBERS = {v: k for k, v in SYMBOLS.items()}
TRUE_E0 = {1: -13.663181292231226, 6: -1029.2809654211628, 8: -2042.0330099956639}
MORSE = {  # (D in eV, a in 1/A, r0 in A) of a pair, by the sorted pair of atomic numbers
    (1, 1): (0.18, 1.9, 1.4),
    (1, 6): (0.32, 1.8, 1.5),
    (1, 8): (0.36, 2.0, 1.4),
    (6, 6): (0.52, 1.6, 1.7),
    (6, 8): (0.58, 1.7, 1.6),
    (8, 8): (0.28, 1.9, 1.6),
}


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    noisy: bool = False  # a tensor copy-constructed from a tensor on every rank (a UserWarning)
    local_patience: int = -1  # this rank decides its patience on its own validation loss
    hoard_rank: int = -1  # this rank keeps its dense distance matrices until the OOM killer acts
    segv_rank: int = -1  # this rank's native neighbour-list fast path reads address 0
    solo_count: int = -1  # this rank alone all-reduces the configuration counts it logs


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "u": Fault(noisy=True),
    "l1": Fault(local_patience=1),
    "h1": Fault(hoard_rank=1),
    "n2": Fault(segv_rank=2),
    "c0": Fault(solo_count=0),
}


# --------------------------------------------------------------------------- data


def neighbour_list(positions: np.ndarray, r_max: float) -> np.ndarray:
    """Edges (sender, receiver) of every ordered pair closer than r_max (no cell)."""
    d = np.linalg.norm(positions[:, None, :] - positions[None, :, :], axis=-1)
    np.fill_diagonal(d, np.inf)
    sender, receiver = np.nonzero(d < r_max)
    return np.stack([sender, receiver]).astype(np.int64)


def morse(numbers: np.ndarray, positions: np.ndarray, r_max: float) -> tuple[float, np.ndarray]:
    """Energy (E0s plus Morse pairs, smoothly cut at r_max) and forces of one configuration."""
    pos = torch.tensor(positions, dtype=torch.float64, requires_grad=True)
    energy = torch.tensor(sum(TRUE_E0[int(z)] for z in numbers), dtype=torch.float64)
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            D, a, r0 = MORSE[tuple(sorted((int(numbers[i]), int(numbers[j]))))]
            r = torch.linalg.norm(pos[i] - pos[j])
            if r.item() < r_max:
                cut = 0.5 * (torch.cos(math.pi * r / r_max) + 1.0)
                energy = energy + cut * D * ((1 - torch.exp(-a * (r - r0))) ** 2 - 1)
    (grad,) = torch.autograd.grad(energy, pos)
    return float(energy.detach()), (-grad).numpy()


def random_cluster(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A small molecule-like cluster with at least one H, C and O atom."""
    n = int(rng.integers(6, 10))
    numbers = np.array([1, 6, 8, *rng.choice([1, 1, 6, 8], size=n - 3)], dtype=np.int64)
    positions: list[np.ndarray] = []
    while len(positions) < n:
        p = rng.normal(scale=1.3, size=3)
        if all(np.linalg.norm(p - q) > 1.0 for q in positions):
            positions.append(p)
    return numbers, np.array(positions)


def write_shard(path: str, configs: list[dict], r_max: float) -> None:
    """One preprocessed shard: per-atom arrays concatenated, per-configuration counts."""
    np.savez(
        path,
        numbers=np.concatenate([c["numbers"] for c in configs]),
        positions=np.concatenate([c["positions"] for c in configs]),
        forces=np.concatenate([c["forces"] for c in configs]),
        energy=np.array([c["energy"] for c in configs]),
        n_atoms=np.array([len(c["numbers"]) for c in configs]),
        edge_index=np.concatenate([c["edge_index"] for c in configs], axis=1),
        n_edges=np.array([c["edge_index"].shape[1] for c in configs]),
        config_type=np.array([c["config_type"] for c in configs]),
        r_max=np.array(r_max),
    )


def read_shard(path: str) -> list[dict]:
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    configs, a, e = [], 0, 0
    for k, (na, ne) in enumerate(zip(arrays["n_atoms"], arrays["n_edges"], strict=True)):
        configs.append(
            {
                "numbers": arrays["numbers"][a : a + na],
                "positions": arrays["positions"][a : a + na],
                "forces": arrays["forces"][a : a + na],
                "energy": float(arrays["energy"][k]),
                "edge_index": arrays["edge_index"][:, e : e + ne],
                "config_type": str(arrays["config_type"][k]),
            }
        )
        a, e = a + na, e + ne
    for c in configs:
        c["r_max"] = float(arrays["r_max"])
    return configs


def write_extxyz(path: str, configs: list[dict]) -> None:
    with open(path, "w") as f:
        for c in configs:
            f.write(f"{len(c['numbers'])}\n")
            f.write(
                "Properties=species:S:1:pos:R:3:REF_forces:R:3 "
                f'REF_energy={c["energy"]:.10f} config_type={c["config_type"]} pbc="F F F"\n'
            )
            for z, p, fr in zip(c["numbers"], c["positions"], c["forces"], strict=True):
                f.write(f"{SYMBOLS[int(z)]:2s} " + " ".join(f"{x:14.8f}" for x in (*p, *fr)) + "\n")


def make_data(folder: str, num_process: int, r_max: float, seed: int = 7) -> None:
    """What `mace_prepare_data --num_process N` leaves: train and valid shards, one a process."""
    rng = np.random.default_rng(seed)
    for split, per_shard in (("train", 48), ("valid", 12)):
        os.makedirs(os.path.join(folder, "processed_data", split), exist_ok=True)
        everything = []
        for k in range(num_process):
            configs = []
            for _ in range(per_shard):
                numbers, positions = random_cluster(rng)
                energy, forces = morse(numbers, positions, r_max)
                configs.append(
                    {
                        "numbers": numbers,
                        "positions": positions,
                        "forces": forces,
                        "energy": energy,
                        "edge_index": neighbour_list(positions, r_max),
                        "config_type": "Default",
                    }
                )
            write_shard(
                os.path.join(folder, "processed_data", split, f"{split}_{k}.npz"), configs, r_max
            )
            everything += configs
        write_extxyz(os.path.join(folder, f"{split}.xyz"), everything)


def collate(configs: list[dict], z_table: list[int]) -> dict[str, torch.Tensor]:
    """A batch: atoms of every configuration one after another, edges shifted to match."""
    offsets = np.cumsum([0] + [len(c["numbers"]) for c in configs])
    numbers = np.concatenate([c["numbers"] for c in configs])
    return {
        "node_attrs": torch.nn.functional.one_hot(
            torch.tensor([z_table.index(int(z)) for z in numbers]), len(z_table)
        ).to(torch.float64),
        "numbers": torch.tensor(numbers),
        "positions": torch.tensor(np.concatenate([c["positions"] for c in configs])),
        "forces": torch.tensor(np.concatenate([c["forces"] for c in configs])),
        "energy": torch.tensor([c["energy"] for c in configs]),
        "n_atoms": torch.tensor([len(c["numbers"]) for c in configs], dtype=torch.float64),
        "edge_index": torch.tensor(
            np.concatenate(
                [c["edge_index"] + o for c, o in zip(configs, offsets, strict=False)], axis=1
            )
        ),
        "batch": torch.repeat_interleave(
            torch.arange(len(configs)), torch.tensor([len(c["numbers"]) for c in configs])
        ),
    }


def batches(configs: list[dict], size: int, z_table: list[int], shuffle_seed: int | None):
    order = list(range(len(configs)))
    if shuffle_seed is not None:
        order = torch.randperm(
            len(configs), generator=torch.Generator().manual_seed(shuffle_seed)
        ).tolist()
    for i in range(0, len(order), size):
        yield collate([configs[k] for k in order[i : i + size]], z_table)


# --------------------------------------------------------------------------- model


class BesselBasis(nn.Module):
    def __init__(self, r_max: float, num_basis: int = 8) -> None:
        super().__init__()
        self.register_buffer(
            "weights", math.pi / r_max * torch.arange(1, num_basis + 1, dtype=torch.float64)
        )
        self.prefactor = math.sqrt(2.0 / r_max)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        return self.prefactor * torch.sin(self.weights * r) / r


class PolynomialCutoff(nn.Module):
    def __init__(self, r_max: float, p: int = 6) -> None:
        super().__init__()
        self.r_max, self.p = r_max, p

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        x, p = r / self.r_max, self.p
        env = (
            1.0
            - (p + 1.0) * (p + 2.0) / 2.0 * x**p
            + p * (p + 2.0) * x ** (p + 1)
            - p * (p + 1.0) / 2.0 * x ** (p + 2)
        )
        return env * (x < 1.0)


class Interaction(nn.Module):
    """Invariant and vector messages from neighbours; their invariants update the node."""

    def __init__(self, channels: int, num_basis: int, avg_num_neighbors: float) -> None:
        super().__init__()
        self.radial = nn.Sequential(
            nn.Linear(num_basis, 16), nn.SiLU(), nn.Linear(16, 2 * channels)
        )
        self.linear_up = nn.Linear(channels, channels, bias=False)
        self.linear_out = nn.Linear(2 * channels, channels, bias=False)
        self.avg_num_neighbors = avg_num_neighbors

    def forward(self, h, edge_feats, unit, sender, receiver):
        w0, w1 = self.radial(edge_feats).chunk(2, dim=-1)
        hj = self.linear_up(h)[sender]
        n, c = h.shape
        m0 = torch.zeros(n, c, dtype=h.dtype).index_add(0, receiver, w0 * hj)
        m1 = torch.zeros(n, c, 3, dtype=h.dtype).index_add(
            0, receiver, (w1 * hj)[:, :, None] * unit[:, None, :]
        )
        m0, m1 = m0 / self.avg_num_neighbors, m1 / self.avg_num_neighbors
        return h + self.linear_out(torch.cat([m0, (m1 * m1).sum(-1)], dim=-1))


class ScaleShiftMACE(nn.Module):
    def __init__(
        self,
        z_table,
        atomic_energies,
        r_max,
        channels,
        num_interactions,
        avg_num_neighbors,
        scale,
        shift,
    ):
        super().__init__()
        self.z_table = list(z_table)
        self.register_buffer("atomic_energies", torch.tensor(atomic_energies, dtype=torch.float64))
        self.node_embedding = nn.Linear(len(z_table), channels, bias=False)
        self.radial_embedding = BesselBasis(r_max)
        self.cutoff = PolynomialCutoff(r_max)
        self.interactions = nn.ModuleList(
            Interaction(channels, 8, avg_num_neighbors) for _ in range(num_interactions)
        )
        self.readouts = nn.ModuleDict({str(z): nn.Linear(channels, 1) for z in z_table})
        self.scale, self.shift = scale, shift

    def forward(
        self, data: dict[str, torch.Tensor], training: bool = False
    ) -> dict[str, torch.Tensor]:
        positions = data["positions"].clone().requires_grad_(True)
        sender, receiver = data["edge_index"]
        vectors = positions[receiver] - positions[sender]
        lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)
        edge_feats = self.radial_embedding(lengths) * self.cutoff(lengths)
        h = self.node_embedding(data["node_attrs"])
        for interaction in self.interactions:
            h = interaction(h, edge_feats, vectors / lengths, sender, receiver)
        site = torch.zeros(h.shape[0], dtype=h.dtype)
        for z in torch.unique(data["numbers"]).tolist():  # each element present has its readout
            mask = data["numbers"] == z
            readout = self.readouts[str(z)]
            site = site.index_put((mask,), (h[mask] * readout.weight[0]).sum(-1) + readout.bias[0])
        node_e0 = data["node_attrs"] @ self.atomic_energies
        node_energy = node_e0 + self.scale * site + self.shift
        n_graphs = int(data["batch"].max()) + 1
        energy = torch.zeros(n_graphs, dtype=h.dtype).index_add(0, data["batch"], node_energy)
        (grad,) = torch.autograd.grad(
            [energy.sum()], [positions], create_graph=training, retain_graph=training
        )
        return {"energy": energy, "forces": -grad}


class WeightedEnergyForcesLoss(nn.Module):
    def __init__(self, energy_weight: float, forces_weight: float) -> None:
        super().__init__()
        self.energy_weight, self.forces_weight = energy_weight, forces_weight

    def forward(self, ref, pred):
        e = torch.mean(torch.square((ref["energy"] - pred["energy"]) / ref["n_atoms"]))
        f = torch.mean(torch.square(ref["forces"] - pred["forces"]))
        return self.energy_weight * e + self.forces_weight * f

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(energy_weight={self.energy_weight:.3f}, "
            f"forces_weight={self.forces_weight:.3f})"
        )


class ExponentialMovingAverage:
    def __init__(self, parameters, decay: float) -> None:
        self.params = list(parameters)
        self.decay = decay
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        for s, p in zip(self.shadow, self.params, strict=True):
            s.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def swap(self) -> None:
        for s, p in zip(self.shadow, self.params, strict=True):
            tmp = p.detach().clone()
            p.data.copy_(s)
            s.copy_(tmp)


# --------------------------------------------------------------------------- the run


class DistributedEnvironment:
    """Rank, world size and master address from Slurm's environment (mace/tools/slurm_distributed)."""

    def __init__(self) -> None:
        hostname = os.environ["SLURM_JOB_NODELIST"].split(",")[0]
        os.environ["MASTER_ADDR"] = hostname
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "33333")
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        self.master_addr = os.environ["MASTER_ADDR"]
        self.master_port = os.environ["MASTER_PORT"]
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = int(os.environ["RANK"])

    def __repr__(self) -> str:
        return (
            f"DistributedEnvironment(master_addr={self.master_addr}, master_port={self.master_port}, "
            f"world_size={self.world_size}, local_rank={self.local_rank}, rank={self.rank})"
        )


def setup_logger(level: str, tag: str, directory: str, rank: int) -> None:
    logger = logging.getLogger()
    logger.setLevel(logging.DEBUG)
    formatter = logging.Formatter(
        "%(asctime)s.%(msecs)03d %(levelname)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
    )
    logger.addFilter(lambda _: rank == 0)
    ch = logging.StreamHandler(stream=sys.stdout)
    ch.setLevel(level)
    ch.setFormatter(formatter)
    logger.addHandler(ch)
    os.makedirs(directory, exist_ok=True)
    fh = logging.FileHandler(os.path.join(directory, f"{tag}.log"))
    fh.setLevel(level)
    fh.setFormatter(formatter)
    logger.addHandler(fh)
    dh = logging.FileHandler(os.path.join(directory, f"{tag}_debug.log"))
    dh.setLevel(logging.DEBUG)
    dh.setFormatter(formatter)
    logger.addHandler(dh)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mace_run_train")
    p.add_argument("--config", default=None)
    p.add_argument("--name", default="MACE_model")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--log_dir", default="logs")
    p.add_argument("--checkpoints_dir", default="checkpoints")
    p.add_argument("--results_dir", default="results")
    p.add_argument("--log_level", default="INFO")
    p.add_argument("--model", default="MACE")
    p.add_argument("--r_max", type=float, default=5.0)
    p.add_argument("--num_channels", type=int, default=16)
    p.add_argument("--max_L", type=int, default=1)
    p.add_argument("--num_interactions", type=int, default=2)
    p.add_argument("--train_file", default=None)
    p.add_argument("--valid_file", default=None)
    p.add_argument("--E0s", default=None)
    p.add_argument("--energy_key", default="REF_energy")
    p.add_argument("--forces_key", default="REF_forces")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--valid_batch_size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight_decay", type=float, default=5e-7)
    p.add_argument("--energy_weight", type=float, default=1.0)
    p.add_argument("--forces_weight", type=float, default=100.0)
    p.add_argument("--swa", action="store_true", default=False)
    p.add_argument("--start_swa", type=int, default=None)
    p.add_argument("--swa_lr", type=float, default=1e-3)
    p.add_argument("--swa_energy_weight", type=float, default=1000.0)
    p.add_argument("--swa_forces_weight", type=float, default=100.0)
    p.add_argument("--ema", action="store_true", default=False)
    p.add_argument("--ema_decay", type=float, default=0.99)
    p.add_argument("--max_num_epochs", type=int, default=8)
    p.add_argument("--patience", type=int, default=2048)
    p.add_argument("--eval_interval", type=int, default=1)
    p.add_argument("--clip_grad", type=float, default=10.0)
    p.add_argument("--error_table", default="PerAtomRMSE")
    p.add_argument("--default_dtype", default="float64")
    p.add_argument("--device", default="cpu")
    p.add_argument("--distributed", action="store_true", default=False)
    p.add_argument("--launcher", default="slurm", choices=["slurm", "torchrun"])
    p.add_argument("--timeout", type=float, default=15.0, help="process group timeout (s)")
    p.add_argument("--restart_latest", action="store_true", default=False)
    p.add_argument("--make_data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--num_process", type=int, default=2, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        with open(first.config) as f:
            parser.set_defaults(**{k: v for k, v in yaml.safe_load(f).items()})
    return parser.parse_args(argv)


def all_reduce(t: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        dist.all_reduce(t)
    return t


def hoard_and_die() -> None:
    """Dense distance matrices of a big bulk cell kept chunk after chunk, until the kernel's OOM
    killer ends the process (SIGKILL: no traceback)."""
    kept = []
    for _ in range(6):
        kept.append(np.ones((64, 1024, 1024 // 8), dtype=np.float64) * 1.5)
        time.sleep(0.4)
    os.kill(os.getpid(), signal.SIGKILL)


def native_neighbour_list() -> None:
    """The compiled neighbour-list fast path, handed a null cell pointer."""
    ctypes.string_at(0)


def statistics(
    train: list[dict], e0s: dict[int, float], r_max: float, rank: int, fault: Fault
) -> torch.Tensor:
    """This rank's sums for the statistics pass: configurations, neighbours, atoms, interaction
    energy per atom (sum and squares), force components and their squares."""
    if fault.hoard_rank == rank:
        hoard_and_die()
    sums = torch.zeros(7, dtype=torch.float64)
    for c in train:
        if c["r_max"] != r_max:
            raise RuntimeError(f"r_max mismatch {c['r_max']} != {r_max}")
        inter = c["energy"] - sum(e0s[int(z)] for z in c["numbers"])
        n = len(c["numbers"])
        sums += torch.tensor(
            [
                1.0,
                c["edge_index"].shape[1] / n,
                n,
                inter / n,
                (inter / n) ** 2,
                c["forces"].size,
                float(np.square(c["forces"]).sum()),
            ],
            dtype=torch.float64,
        )
    return sums


def recompute_neighbour_lists(configs: list[dict], r_max: float, path: str) -> None:
    """A shard preprocessed at another r_max: its neighbour lists are built again, chunk by chunk
    (slow on a large shard)."""
    logging.warning(
        f"Neighbour lists in {path} were built with r_max={configs[0]['r_max']:.2f}, "
        f"recomputing with r_max={r_max:.2f}"
    )
    chunks = 8
    for k in range(chunks):
        for c in configs[k::chunks]:
            c["edge_index"] = neighbour_list(c["positions"], r_max)
            c["r_max"] = r_max
        time.sleep(5.0)
        logging.info(f"Recomputed neighbour lists: chunk {k + 1}/{chunks}")


def wait_for_shard(path: str) -> None:
    """A shard still being written by mace_prepare_data holds a lock file beside it."""
    while os.path.exists(path + ".lock"):
        time.sleep(0.5)


def evaluate(model, data: list[dict], batch_size: int, z_table, loss_fn, distributed: bool):
    """Validation sums of this rank's shard, all-reduced: loss, squared errors and counts."""
    sums = torch.zeros(5, dtype=torch.float64)
    for batch in batches(data, batch_size, z_table, None):
        out = model(batch, training=False)
        n = batch["energy"].numel()
        sums += torch.tensor(
            [
                float(loss_fn(batch, out).detach()) * n,
                float(
                    torch.square(
                        (batch["energy"] - out["energy"].detach()) / batch["n_atoms"]
                    ).sum()
                ),
                n,
                float(torch.square(batch["forces"] - out["forces"].detach()).sum()),
                batch["forces"].numel(),
            ],
            dtype=torch.float64,
        )
    local = sums.numpy()[0] / sums.numpy()[2]
    s = all_reduce(sums, distributed).numpy()
    return s[0] / s[2], 1000 * np.sqrt(s[1] / s[2]), 1000 * np.sqrt(s[3] / s[4]), local


def valid_err_log(phrase: str, loss: float, rmse_e: float, rmse_f: float) -> None:
    logging.info(
        f"{phrase}: head: Default, loss={loss:8.8f}, RMSE_E_per_atom={rmse_e:8.2f} meV, "
        f"RMSE_F={rmse_f:8.2f} meV / A"
    )


def checkpoint_path(args, epoch: int, swa: bool) -> str:
    return os.path.join(
        args.checkpoints_dir, f"{args.name}_run-{args.seed}_epoch-{epoch}{'_swa' if swa else ''}.pt"
    )


def run(args: argparse.Namespace) -> None:
    fault = FAULTS[os.environ.get("MLIP_Q", "")]
    tag = f"{args.name}_run-{args.seed}"
    if args.distributed:
        if args.launcher == "torchrun":
            local_rank = int(os.environ["LOCAL_RANK"])
            rank = int(os.environ["RANK"])
            world_size = int(os.environ["WORLD_SIZE"])
        else:
            try:
                distr_env = DistributedEnvironment()
            except Exception as e:
                logging.error(f"Failed to initialize distributed environment: {e}")
                return
            world_size, local_rank, rank = (
                distr_env.world_size,
                distr_env.local_rank,
                distr_env.rank,
            )
            if rank == 0:
                print(distr_env)
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
    else:
        rank, local_rank, world_size = 0, 0, 1

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    setup_logger(args.log_level, tag, args.log_dir, rank)
    logging.info("===========VERIFYING SETTINGS===========")
    logging.info(f"MACE version: {__version__}")
    logging.debug(f"Configuration: {args}")
    logging.debug(f"Process {rank} of {world_size}, local rank {local_rank}")
    torch.set_default_dtype(getattr(torch, args.default_dtype))
    logging.info("Using CPU")
    if args.energy_key == "energy":
        logging.warning(
            "Since ASE version 3.23.0b1, using energy_key 'energy' is no longer safe when "
            "communicating between MACE and ASE. We recommend using a different key, rewriting "
            "'energy' to 'REF_energy'. You need to use --energy_key='REF_energy' to specify the "
            "chosen key name."
        )
    if args.distributed:
        logging.info(
            f"Distributed training with {world_size} processes (launcher: {args.launcher})"
        )

    logging.info("===========LOADING INPUT DATA===========")
    logging.info("Using heads: ['Default']")
    logging.info("=============    Processing head Default     ===========")
    train_path = os.path.join(args.train_file, f"train_{rank}.npz")
    wait_for_shard(train_path)
    train = read_shard(train_path)
    if train[0]["r_max"] != args.r_max:
        recompute_neighbour_lists(train, args.r_max, train_path)
    n_configs = len(train)
    n_forces = sum(c["forces"].size for c in train)
    if fault.solo_count == rank:
        counts = torch.tensor([n_configs, n_configs, n_forces], dtype=torch.float64)
        all_reduce(counts, args.distributed)
        logging.info(
            f"Training set [{int(counts[0])} configs, {int(counts[1])} energy, "
            f"{int(counts[2])} forces] loaded from '{args.train_file}'"
        )
    else:
        logging.info(
            f"Training set [{n_configs} configs, {n_configs} energy, {n_forces} forces] "
            f"loaded from '{train_path}'"
        )
    e0s = ast.literal_eval(args.E0s)
    z_table = sorted(e0s)
    logging.info(f"Atomic Numbers used: {z_table}")
    logging.info(f"Atomic Energies used (z: eV) for head Default: {e0s}")

    sums = statistics(train, e0s, args.r_max, rank, fault)
    if fault.segv_rank == rank:
        native_neighbour_list()
    all_reduce(sums, args.distributed)
    avg_num_neighbors = float(sums[1] / sums[0])
    mean = float(sums[3] / sums[0])
    std = math.sqrt(float(sums[6] / sums[5]))
    logging.info(f"Average number of neighbors: {avg_num_neighbors}")
    logging.info("Using reduction method: mean")
    logging.info(f"Scaling with rms_forces_scaling: mean={mean:.6f} eV, std={std:.6f} eV / A")
    logging.info("During training the following quantities will be reported: energy, forces")
    if fault.noisy:
        # copy-constructing the scale from a tensor (torch's UserWarning on every rank)
        std = float(torch.tensor(torch.tensor(std)))

    logging.info("===========MODEL DETAILS===========")
    logging.info("Building model")
    model = ScaleShiftMACE(
        z_table,
        [e0s[z] for z in z_table],
        args.r_max,
        args.num_channels,
        args.num_interactions,
        avg_num_neighbors,
        std,
        mean,
    )
    logging.info(
        f"Message passing with {args.num_channels} channels and max_L={args.max_L} "
        f"({args.num_channels}x0e+{args.num_channels}x1o)"
    )
    logging.info(f"{args.num_interactions} layers, each with correlation order: 2 (body order: 3)")
    logging.info("8 radial and 5 basis functions")
    logging.info(
        f"Radial cutoff: {args.r_max} A (total receptive field for each atom: "
        f"{args.r_max * args.num_interactions} A)"
    )
    logging.info(f"Total number of parameters: {sum(p.numel() for p in model.parameters())}")
    logging.info("")
    logging.info("===========OPTIMIZER INFORMATION===========")
    logging.info("Using ADAM as parameter optimizer")
    logging.info(f"Batch size: {args.batch_size}")
    if args.ema:
        logging.info(f"Using Exponential Moving Average with decay: {args.ema_decay}")
    steps = math.ceil(n_configs / args.batch_size)
    logging.info(f"Number of gradient updates: {steps * args.max_num_epochs}")
    logging.info(f"Learning rate: {args.lr}, weight decay: {args.weight_decay}")
    loss_fn = WeightedEnergyForcesLoss(args.energy_weight, args.forces_weight)
    logging.info(loss_fn)

    ddp = DDP(model) if args.distributed else model
    optimizer = torch.optim.Adam(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay, amsgrad=True
    )
    lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.8, patience=50)
    ema = ExponentialMovingAverage(model.parameters(), args.ema_decay) if args.ema else None
    swa_model = swa_scheduler = None
    if args.swa:
        logging.info(
            f"Using stochastic weight averaging (after {args.start_swa} epochs) with energy weight "
            f": {args.swa_energy_weight}, forces weight : {args.swa_forces_weight} and learning "
            f"rate : {args.swa_lr}"
        )
        swa_model = AveragedModel(model)
        swa_scheduler = SWALR(
            optimizer, swa_lr=args.swa_lr, anneal_epochs=1, anneal_strategy="linear"
        )

    start_epoch = 0
    lowest_loss = np.inf
    os.makedirs(args.checkpoints_dir, exist_ok=True)
    if args.restart_latest:
        found = sorted(
            (
                f
                for f in os.listdir(args.checkpoints_dir)
                if f.startswith(tag) and f.endswith(".pt")
            ),
            key=lambda f: int(f.split("_epoch-")[1].split("_")[0].split(".")[0]),
        )
        if found:
            state = torch.load(os.path.join(args.checkpoints_dir, found[-1]), map_location="cpu")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1
            lowest_loss = state["lowest_loss"]
            logging.info(f"Loading checkpoint: {os.path.join(args.checkpoints_dir, found[-1])}")
        else:
            logging.warning(f"Cannot find checkpoint with tag '{tag}' in '{args.checkpoints_dir}'")

    logging.info("===========TRAINING===========")
    logging.info("Started training, reporting errors on validation set")
    logging.info("Loss metrics on validation set")
    valid = None
    patience_counter = 0
    swa_start = True
    keep: str | None = None
    epoch = start_epoch
    while epoch < args.max_num_epochs:
        stage_two = args.swa and epoch >= args.start_swa
        if stage_two and swa_start:
            logging.info("Changing loss based on Stage Two Weights")
            lowest_loss = np.inf
            swa_start = False
            loss_fn = WeightedEnergyForcesLoss(args.swa_energy_weight, args.swa_forces_weight)
        ddp.train()
        for batch in batches(train, args.batch_size, z_table, args.seed * 1000 + epoch):
            optimizer.zero_grad(set_to_none=True)
            out = ddp(batch, training=True)
            loss_fn(batch, out).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.clip_grad)
            optimizer.step()
            if ema is not None:
                ema.update()
        if stage_two:
            swa_model.update_parameters(model)
            swa_scheduler.step()

        if epoch % args.eval_interval == 0:
            if valid is None:
                valid_path = os.path.join(args.valid_file, f"valid_{rank}.npz")
                wait_for_shard(valid_path)
                valid = read_shard(valid_path)
            if ema is not None:
                ema.swap()
            valid_loss, rmse_e, rmse_f, local_loss = evaluate(
                model, valid, args.valid_batch_size, z_table, loss_fn, args.distributed
            )
            valid_err_log(f"Epoch {epoch}", valid_loss, rmse_e, rmse_f)
            if not stage_two:
                lr_scheduler.step(valid_loss)
            decide = local_loss if fault.local_patience == rank else valid_loss
            if decide >= lowest_loss:
                patience_counter += 1
                if patience_counter >= args.patience:
                    if args.swa and epoch < args.start_swa:
                        logging.info(
                            f"Stopping optimization after {patience_counter} epochs without "
                            "improvement and starting Stage Two"
                        )
                        epoch = args.start_swa
                        if ema is not None:
                            ema.swap()
                        continue
                    logging.info(
                        f"Stopping optimization after {patience_counter} epochs without improvement"
                    )
                    if ema is not None:
                        ema.swap()
                    break
            else:
                lowest_loss = decide
                patience_counter = 0
                if rank == 0:
                    path = checkpoint_path(args, epoch, stage_two)
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "epoch": epoch,
                            "lowest_loss": lowest_loss,
                        },
                        path,
                    )
                    logging.debug(f"Saving checkpoint: {path}")
                    if keep is not None and keep != path and os.path.exists(keep):
                        os.remove(keep)
                    keep = path
            if ema is not None:
                ema.swap()
        epoch += 1

    logging.info("Training complete")
    if rank == 0:
        logging.info("===========RESULTS===========")
        logging.info("Computing metrics for training, validation, and test sets")
        if keep is not None:
            logging.info(f"Loading checkpoint: {keep}")
            state = torch.load(keep, weights_only=False)
            model.load_state_dict(state["model"])
            stage = "two" if keep.endswith("_swa.pt") else "one"
            logging.info(f"Loaded Stage {stage} model from epoch {state['epoch']} for evaluation")
        rows = []
        for name, data in (("train", train), ("valid", valid or train)):
            logging.info(f"Evaluating {name}_Default ...")
            _, rmse_e, rmse_f, _ = evaluate(
                model, data, args.valid_batch_size, z_table, loss_fn, False
            )
            forces = np.concatenate([c["forces"] for c in data])
            rel = 100 * rmse_f / (1000 * math.sqrt(float(np.square(forces).mean())))
            rows.append((f"{name}_Default", f"{rmse_e:.1f}", f"{rmse_f:.1f}", f"{rel:.2f}"))
        head = ("config_type", "RMSE E / meV / atom", "RMSE F / meV / A", "relative F RMSE %")
        widths = [max(len(r[k]) for r in [head, *rows]) + 2 for k in range(4)]
        sep = "+" + "+".join("-" * w for w in widths) + "+"
        table = [
            sep,
            "|" + "|".join(f" {h:<{w - 1}}" for h, w in zip(head, widths, strict=True)) + "|",
            sep,
        ]
        table += [
            "|" + "|".join(f" {v:<{w - 1}}" for v, w in zip(r, widths, strict=True)) + "|"
            for r in rows
        ]
        table.append(sep)
        logging.info("Error-table on TRAIN and VALID:\n" + "\n".join(table))
        model_path = f"{args.name}.model"
        logging.info(f"Saving model to {os.path.join(args.checkpoints_dir, tag + '.model')}")
        torch.save(model, os.path.join(args.checkpoints_dir, tag + ".model"))
        torch.save(model, model_path)
        logging.info("Done")
    if args.distributed:
        dist.destroy_process_group()


def main() -> None:
    args = parse_args(sys.argv[1:])
    if args.make_data:
        make_data(args.make_data, args.num_process, args.r_max)
        return
    warnings.filterwarnings("default", category=UserWarning)
    run(args)


if __name__ == "__main__":
    main()
