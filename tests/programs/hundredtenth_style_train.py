"""A hundred-tenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtenth-*): a graph neural network interatomic potential trained in the
way of the Open Catalyst Project's ocp / fairchem main.py (`python main.py --mode train
--config-yml configs/s2ef/200k/gemnet/gemnet-dT.yml --num-gpus 2 --distributed --cpu
--distributed-backend gloo`), re-created in plain torch without fairchem, torch_geometric, ase,
lmdb or submitit installed; linked into each run's folder as main.py.

What it re-creates: the flags of ocpmodels.common.flags; build_config with the YAML's `includes`;
fairchem's local mode (more than one --num-gpus and no --submit: "Running in local mode with N
ranks", num_workers forced to 0, then torch's own elastic_launch(LaunchConfig(min_nodes=1,
max_nodes=1, nproc_per_node=N, rdzv_backend="c10d", max_restarts=0), runner_wrapper)(config);
the rendezvous endpoint here is localhost:--distributed-port, fairchem leaves it to torch's
default port); the Runner and new_trainer_context (setup_logging, distutils.setup(config): the
SLURM_* variables with --submit, else the torchrun variables and init_method="env://", the
collective timeout in minutes from the config's `timeout`); the ForcesTrainer ("s2ef") of the
older ocpmodels: the trainer config dumped as YAML by rank 0, the timestamp broadcast from rank
0, the LMDB dataset of shard files data.NNNN.lmdb (a format of this program's own: a header with
the entry count and offsets, then pickled entries; tests/programs/hundredtenth_preprocess.py
writes them), the BalancedBatchSampler that all-gathers each batch's sizes from metadata.npz
and partitions them (or warns and partitions uniformly without it), a tiny GemNet-T-like model
(embedding, a periodic radius graph built on the fly with torch.cdist and max_neighbors, Gaussian
radial basis with a polynomial envelope, a padded neighbour aggregation per atom, three
interaction blocks with scale factors from scale_file, extensive energy, direct forces),
DDPLoss (an all-reduce of the sample count), the s2ef metrics, the per-step dict lines, the
validation all-reducing every metric ("Evaluating on val."), best_checkpoint.pt and the test
predictions written per rank and gathered by rank 0 ("Writing results to
./results/<timestamp>/s2ef_predictions.npz"), "Total time taken: ...". A user's early stop
(optim.early_stop_patience / early_stop_min_delta) and the WandB / Tensorboard loggers (the
backend imported when rank 0 makes its logger) are in the manner of the projects' forks.

A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredtenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import bisect
import copy
import ctypes
import datetime
import errno
import heapq
import itertools
import json
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler
from tqdm import tqdm

MAGIC = b"OCPLMDB1"
COMMIT = "a9c8bd5"
DENSE_LIMIT = 512  # atoms above which the neighbour list is built in chunks


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    hoard_rank: int = -1  # this rank's graph cache keeps every batch's edge tensors from epoch 1
    segv_rank: int = -1  # this rank's compiled neighbour search reads address 0 in epoch 1
    gnorm_master: bool = False  # rank 0 alone all-reduces the gradient norm it logs
    park_rank: int = -1  # this rank waits in epoch 1 for a prefetch thread never started


FAULTS = {
    "": Fault(),
    "m1": Fault(hoard_rank=1),
    "v0": Fault(segv_rank=0),
    "g0": Fault(gnorm_master=True),
    "w1": Fault(park_rank=1),
}


def fault() -> Fault:
    return FAULTS[os.environ.get("TQ_CASE", "")]


# --- ocpmodels.common.utils ------------------------------------------------------------------


class SeverityLevelBetween(logging.Filter):
    def __init__(self, min_level: int, max_level: int) -> None:
        super().__init__()
        self.min_level = min_level
        self.max_level = max_level

    def filter(self, record) -> bool:
        return self.min_level <= record.levelno < self.max_level


def setup_logging() -> None:
    root = logging.getLogger()
    if not root.hasHandlers():
        root.setLevel(logging.INFO)
        log_formatter = logging.Formatter(
            "%(asctime)s (%(levelname)s): %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
        )
        # Send INFO to stdout
        handler_out = logging.StreamHandler(sys.stdout)
        handler_out.addFilter(SeverityLevelBetween(logging.INFO, logging.WARNING))
        handler_out.setFormatter(log_formatter)
        root.addHandler(handler_out)
        # Send WARNING (and higher) to stderr
        handler_err = logging.StreamHandler(sys.stderr)
        handler_err.setLevel(logging.WARNING)
        handler_err.setFormatter(log_formatter)
        root.addHandler(handler_err)


def load_config(path: str) -> dict:
    with open(path) as f:
        config = yaml.safe_load(f)
    includes = config.pop("includes", [])
    merged: dict = {}
    for include in includes:
        merged = merge_dicts(merged, load_config(include))
    return merge_dicts(merged, config)


def merge_dicts(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_dicts(out[k], v)
        else:
            out[k] = v
    return out


def build_config(args: argparse.Namespace) -> dict:
    config = load_config(args.config_yml)
    config["mode"] = args.mode
    config["identifier"] = args.identifier
    config["timestamp_id"] = args.timestamp_id
    config["seed"] = args.seed
    config["is_debug"] = args.debug
    config["run_dir"] = args.run_dir
    config["print_every"] = args.print_every
    config["amp"] = args.amp
    config["checkpoint"] = args.checkpoint
    config["cpu"] = args.cpu
    config["submit"] = args.submit
    config["summit"] = args.summit
    config["distributed"] = args.distributed
    config["local_rank"] = args.local_rank
    config["distributed_port"] = args.distributed_port
    config["world_size"] = args.num_nodes * args.num_gpus
    config["distributed_backend"] = args.distributed_backend
    config["noddp"] = args.no_ddp
    return config


def save_checkpoint(state: dict, checkpoint_dir: str, checkpoint_file: str) -> str:
    filename = os.path.join(checkpoint_dir, checkpoint_file)
    torch.save(state, filename)
    return filename


# --- ocpmodels.common.distutils --------------------------------------------------------------


def setup(config: dict) -> None:
    timeout = timedelta(minutes=config.get("timeout", 30))
    if config["submit"]:
        node_list = os.environ.get("SLURM_STEP_NODELIST")
        if node_list is None:
            node_list = os.environ.get("SLURM_JOB_NODELIST")
        if node_list is not None:
            hostnames = subprocess.check_output(["scontrol", "show", "hostnames", node_list])
            config["init_method"] = "tcp://{host}:{port}".format(
                host=hostnames.split()[0].decode("utf-8"), port=config["distributed_port"]
            )
            nnodes = int(os.environ["SLURM_NNODES"])
            ntasks_per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
            if ntasks_per_node is not None:
                ntasks_per_node = int(ntasks_per_node)
            else:
                ntasks = int(os.environ["SLURM_NTASKS"])
                assert ntasks % nnodes == 0
                ntasks_per_node = int(ntasks / nnodes)
            if ntasks_per_node == 1:
                assert config["world_size"] % nnodes == 0
                gpus_per_node = config["world_size"] // nnodes
                node_id = int(os.environ["SLURM_NODEID"])
                config["rank"] = node_id * gpus_per_node
                config["local_rank"] = 0
            else:
                assert ntasks_per_node == config["world_size"] // nnodes
                config["rank"] = int(os.environ["SLURM_PROCID"])
                config["local_rank"] = int(os.environ["SLURM_LOCALID"])
            logging.info(f"Init: {config['init_method']}, {config['world_size']}, {config['rank']}")
            dist.init_process_group(
                backend=config["distributed_backend"],
                init_method=config["init_method"],
                world_size=config["world_size"],
                rank=config["rank"],
                timeout=timeout,
            )
    else:
        config["local_rank"] = int(os.environ.get("LOCAL_RANK", config["local_rank"]))
        dist.init_process_group(
            backend=config["distributed_backend"], init_method="env://", timeout=timeout
        )


def cleanup() -> None:
    dist.destroy_process_group()


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def is_master() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    if get_world_size() == 1:
        return
    dist.barrier()


def broadcast(tensor: torch.Tensor, src: int) -> None:
    if get_world_size() == 1:
        return
    dist.broadcast(tensor, src)


def all_reduce(data, average: bool = False, device=None):
    if get_world_size() == 1:
        return data
    tensor = data
    if not isinstance(data, torch.Tensor):
        tensor = torch.tensor(data)
    if device is not None:
        tensor = tensor.to(device)
    dist.all_reduce(tensor)
    if average:
        tensor /= get_world_size()
    if not isinstance(data, torch.Tensor):
        result = tensor.cpu().numpy() if tensor.numel() > 1 else tensor.item()
    else:
        result = tensor
    return result


def all_gather(data, device=None) -> list[torch.Tensor]:
    if get_world_size() == 1:
        return [data]
    tensor = data
    if device is not None:
        tensor = tensor.to(device)
    tensor_list = [tensor.new_zeros(tensor.shape) for _ in range(get_world_size())]
    dist.all_gather(tensor_list, tensor)
    return tensor_list


# --- ocpmodels.datasets ----------------------------------------------------------------------


class UnsupportedDatasetError(ValueError):
    pass


class AtomsData:
    """One structure (torch_geometric's Data in the original)."""

    def __init__(self, entry: dict) -> None:
        self.sid = entry["sid"]
        self.fid = entry["fid"]
        self.natoms = entry["natoms"]
        self.pos = torch.as_tensor(entry["pos"], dtype=torch.float32)
        self.atomic_numbers = torch.as_tensor(entry["atomic_numbers"], dtype=torch.long)
        self.cell = torch.as_tensor(entry["cell"], dtype=torch.float32)
        self.tags = torch.as_tensor(entry["tags"], dtype=torch.long)
        self.fixed = torch.as_tensor(entry["fixed"], dtype=torch.long)
        self.y = float(entry["y"])
        self.force = torch.as_tensor(entry["force"], dtype=torch.float32)


class Batch:
    def __init__(self, data_list: list[AtomsData]) -> None:
        self.pos = torch.cat([d.pos for d in data_list])
        self.atomic_numbers = torch.cat([d.atomic_numbers for d in data_list])
        self.natoms = torch.tensor([d.natoms for d in data_list])
        self.batch = torch.repeat_interleave(torch.arange(len(data_list)), self.natoms)
        self.cell = torch.stack([d.cell for d in data_list])
        self.tags = torch.cat([d.tags for d in data_list])
        self.fixed = torch.cat([d.fixed for d in data_list])
        self.y = torch.tensor([d.y for d in data_list])
        self.force = torch.cat([d.force for d in data_list])
        self.sid = [d.sid for d in data_list]
        self.fid = [d.fid for d in data_list]

    def to(self, device) -> Batch:
        return self


class OCPCollater:
    def __init__(self, otf_graph: bool = False) -> None:
        self.otf_graph = otf_graph

    def __call__(self, data_list: list[AtomsData]) -> Batch:
        return Batch(data_list)


class LmdbDataset(Dataset):
    """The S2EF shards in a folder (data.NNNN.lmdb), each opened read-only on first use."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.path = Path(config["src"])
        if not self.path.is_file():
            db_paths = sorted(self.path.glob("*.lmdb"))
            assert len(db_paths) > 0, f"No LMDBs found in '{self.path}'"
        else:
            db_paths = [self.path]
        if config.get("lmdb_per_rank", False):  # each rank reads only its own shard files
            db_paths = db_paths[get_rank() :: get_world_size()]
        self.paths = [self.path]
        self.db_paths = db_paths
        self._offsets = [self._read_header(p) for p in db_paths]
        self._keylen_cumulative = np.cumsum([len(o) for o in self._offsets]).tolist()
        self.num_samples = int(sum(len(o) for o in self._offsets))
        self._files: dict[int, object] = {}
        self._metadata_loaded = False
        self._metadata = None

    @staticmethod
    def _read_header(path: Path) -> list[int]:
        with open(path, "rb") as f:
            assert f.read(len(MAGIC)) == MAGIC, f"{path} is not an LMDB shard"
            (entries,) = struct.unpack("<Q", f.read(8))
            return list(struct.unpack(f"<{entries}Q", f.read(8 * entries)))

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> AtomsData:
        db_idx = bisect.bisect(self._keylen_cumulative, idx)
        el_idx = idx if db_idx == 0 else idx - self._keylen_cumulative[db_idx - 1]
        if db_idx not in self._files:
            self._files[db_idx] = open(self.db_paths[db_idx], "rb")  # noqa: SIM115
        f = self._files[db_idx]
        f.seek(self._offsets[db_idx][el_idx])
        return AtomsData(pickle.load(f))

    @property
    def metadata(self):
        if not self._metadata_loaded:
            self._metadata_loaded = True
            if self.config.get("metadata_path", None) is not None:
                self._metadata = np.load(self.config["metadata_path"], allow_pickle=True)
            else:
                metadata_file = self.path / "metadata.npz"
                if metadata_file.is_file():
                    self._metadata = np.load(metadata_file, allow_pickle=True)
                else:
                    logging.warning(f"Could not find dataset metadata.npz files in '{self.paths}'")
        return self._metadata

    def metadata_hasattr(self, attr: str) -> bool:
        return self.metadata is not None and attr in self.metadata

    def get_metadata(self, attr: str, idx):
        return [self.metadata[attr][i] for i in idx]

    def close_db(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}


# --- ocpmodels.common.data_parallel ----------------------------------------------------------


def _balanced_partition(sizes: np.ndarray, num_parts: int) -> list[list[int]]:
    """Greedily partition the given set by always inserting the largest element into the
    smallest partition."""
    sort_idx = np.argsort(-sizes, kind="stable")
    heap = [(int(sizes[idx]), [int(idx)]) for idx in sort_idx[:num_parts]]
    heapq.heapify(heap)
    for idx in sort_idx[num_parts:]:
        smallest_part = heapq.heappop(heap)
        new_size = smallest_part[0] + int(sizes[idx])
        heapq.heappush(heap, (new_size, smallest_part[1] + [int(idx)]))
    return [part[1] for part in heap]


class StatefulDistributedSampler(DistributedSampler):
    def __init__(self, dataset, batch_size: int, **kwargs) -> None:
        super().__init__(dataset=dataset, **kwargs)
        self.start_iter = 0
        self.batch_size = batch_size
        assert self.batch_size > 0, "batch_size not set for the sampler"
        logging.info(f"rank: {self.rank}: Sampler created...")

    def set_epoch_and_start_iteration(self, epoch: int, start_iter: int) -> None:
        self.set_epoch(epoch)
        self.start_iter = start_iter


class BalancedBatchSampler(BatchSampler):
    def __init__(
        self,
        dataset,
        *,
        batch_size: int,
        num_replicas: int,
        rank: int,
        device,
        seed: int,
        mode="atoms",
        shuffle: bool = True,
        on_error: str = "raise",
        drop_last: bool = False,
    ) -> None:
        self.disabled = False
        self.on_error = on_error
        if mode is False:
            logging.warning(f"Disabled BalancedBatchSampler because {mode=}.")
            self.disabled = True
        elif num_replicas == 1:
            logging.warning(f"Disabled BalancedBatchSampler because {num_replicas=}.")
            self.disabled = True
        if not dataset.metadata_hasattr("natoms"):
            error = UnsupportedDatasetError(
                "BalancedBatchSampler requires a dataset that has a metadata attributed with "
                "number of atoms."
            )
            if self.on_error == "raise":
                raise error
            logging.warning(
                f"Failed to get data sizes, falling back to uniform partitioning. {error}"
            )
            self.disabled = True
        sampler = StatefulDistributedSampler(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            drop_last=drop_last,
            batch_size=batch_size,
            seed=seed,
        )
        super().__init__(sampler, batch_size=batch_size, drop_last=drop_last)
        self.device = device
        logging.info(
            f"Created BalancedBatchSampler with sampler={type(sampler).__name__}, "
            f"{batch_size=}, {drop_last=}"
        )

    def set_epoch_and_start_iteration(self, epoch: int, start_iteration: int) -> None:
        self.sampler.set_epoch_and_start_iteration(epoch, start_iteration)

    def __iter__(self):
        if self.disabled or not initialized():
            yield from super().__iter__()
            return
        for batch_idx in super().__iter__():
            sizes = self.sampler.dataset.get_metadata("natoms", batch_idx)
            idx_sizes = torch.stack([torch.tensor(batch_idx), torch.tensor(sizes)])
            idx_sizes_all = torch.cat(all_gather(idx_sizes, device=self.device), dim=-1)
            idx_all, sizes_all = idx_sizes_all[0], idx_sizes_all[1]
            local_idx_balanced = _balanced_partition(sizes_all.numpy(), self.sampler.num_replicas)
            yield idx_all[local_idx_balanced[self.sampler.rank]].tolist()


class RankShardSampler(BatchSampler):
    """lmdb_per_rank: the rank's own shards, shuffled, no cross-rank balancing."""

    def __init__(self, dataset, batch_size: int, shuffle: bool, seed: int) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        super().__init__(range(len(dataset)), batch_size=batch_size, drop_last=False)
        logging.info(f"rank: {get_rank()}: Sampler created over {len(dataset)} local structures...")

    def set_epoch_and_start_iteration(self, epoch: int, start_iteration: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        for k in range(0, len(order), self.batch_size):
            yield order[k : k + self.batch_size]


# --- ocpmodels.models.gemnet (a tiny GemNet-T) -----------------------------------------------


class ScaleFactor(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.register_buffer("scale_factor", torch.tensor(1.0))
        self.fitted = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


def ensure_fitted(module: nn.Module, warn: bool = False) -> None:
    for name, child in module.named_modules():
        if not isinstance(child, ScaleFactor) or child.fitted:
            continue
        msg = (
            f"Scale factor {child.name} ({name}) is not fitted. Please make sure that you either "
            "(1) load a checkpoint with fitted scale factors, (2) explicitly load scale factors "
            "using the `model.scale_file` attribute, or (3) fit the scale factors using the "
            "`fit.py` script."
        )
        if warn:
            logging.warning(msg)
        else:
            raise ValueError(msg)


class PolynomialEnvelope(nn.Module):
    def __init__(self, exponent: int) -> None:
        super().__init__()
        self.p = exponent
        self.a = -(self.p + 1) * (self.p + 2) / 2
        self.b = self.p * (self.p + 2)
        self.c = -self.p * (self.p + 1) / 2

    def forward(self, d_scaled: torch.Tensor) -> torch.Tensor:
        env = 1 + self.a * d_scaled**self.p + self.b * d_scaled ** (self.p + 1)
        env = env + self.c * d_scaled ** (self.p + 2)
        return torch.where(d_scaled < 1, env, torch.zeros_like(d_scaled))


class InteractionBlockTripletsOnly(nn.Module):
    def __init__(self, emb_atom: int, emb_edge: int, emb_rbf: int, index: int) -> None:
        super().__init__()
        self.edge_mlp = nn.Sequential(nn.Linear(2 * emb_atom + emb_rbf, emb_edge), nn.SiLU())
        self.rbf_proj = nn.Linear(emb_rbf, emb_edge, bias=False)
        self.attn = nn.Linear(emb_edge, 1)
        self.atom_update = nn.Sequential(nn.Linear(emb_edge, emb_atom), nn.SiLU())
        self.scale_rbf = ScaleFactor(f"TripInteraction_{index}_had_rbf")
        self.scale_cbf = ScaleFactor(f"TripInteraction_{index}_sum_cbf")
        self.scale_atom = ScaleFactor(f"AtomUpdate_{index}_sum")

    def forward(self, h, rbf, env, idx_s, idx_t, slot, kmax):
        m = self.edge_mlp(torch.cat([h[idx_s], h[idx_t], rbf], dim=-1))
        m = self.scale_rbf(m * self.rbf_proj(rbf)) * env[:, None]
        # the neighbours of each atom padded to Kmax (the ragged triplet layout)
        dense = m.new_zeros(h.shape[0], kmax, m.shape[1])
        dense[idx_t, slot] = m
        mask = m.new_full((h.shape[0], kmax), -1e4)
        mask[idx_t, slot] = 0.0
        w = torch.softmax(self.attn(dense).squeeze(-1) + mask, dim=-1)
        agg = self.scale_cbf((w[..., None] * dense).sum(1))
        return h + self.scale_atom(self.atom_update(agg)), m


class GemNetT(nn.Module):
    def __init__(
        self,
        num_atoms,
        bond_feat_dim,
        num_targets,
        num_spherical: int = 7,
        num_radial: int = 16,
        num_blocks: int = 3,
        emb_size_atom: int = 32,
        emb_size_edge: int = 32,
        emb_size_trip: int = 16,
        emb_size_rbf: int = 16,
        emb_size_cbf: int = 16,
        emb_size_bil_trip: int = 16,
        num_before_skip: int = 1,
        num_after_skip: int = 2,
        num_concat: int = 1,
        num_atom: int = 3,
        regress_forces: bool = True,
        direct_forces: bool = True,
        cutoff: float = 6.0,
        max_neighbors: int = 50,
        rbf: dict | None = None,
        envelope: dict | None = None,
        cbf: dict | None = None,
        extensive: bool = True,
        otf_graph: bool = True,
        use_pbc: bool = True,
        output_init: str = "HeOrthogonal",
        activation: str = "swish",
        scale_file: str | None = None,
    ) -> None:
        super().__init__()
        self.cutoff = cutoff
        self.max_neighbors = max_neighbors
        self.use_pbc = use_pbc
        self.extensive = extensive
        self.atom_emb = nn.Embedding(100, emb_size_atom)
        self.register_buffer("centers", torch.linspace(0, cutoff, num_radial))
        self.rbf_lin = nn.Linear(num_radial, emb_size_rbf)
        self.envelope = PolynomialEnvelope((envelope or {}).get("exponent", 5))
        self.int_blocks = nn.ModuleList(
            InteractionBlockTripletsOnly(emb_size_atom, emb_size_edge, emb_size_rbf, i + 1)
            for i in range(num_blocks)
        )
        self.out_energy = nn.Sequential(
            nn.Linear(emb_size_atom, emb_size_atom), nn.SiLU(), nn.Linear(emb_size_atom, 1)
        )
        self.out_forces = nn.Sequential(
            nn.Linear(emb_size_edge, emb_size_edge), nn.SiLU(), nn.Linear(emb_size_edge, 1)
        )
        self.out_scale_sum = ScaleFactor("OutBlock_0_sum")
        self.out_scale_had = ScaleFactor("OutBlock_0_had")
        self.graph_cache: list[torch.Tensor] = []
        if scale_file is not None:
            with open(scale_file) as f:
                scales = json.load(f)
            for module in self.modules():
                if isinstance(module, ScaleFactor) and module.name in scales:
                    module.scale_factor.fill_(float(scales[module.name]))
                    module.fitted = True

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _neighbors(self, pos, cell, sid):
        """Edges (source, target, vector) of one structure within the cutoff, over the 27
        periodic images, the max_neighbors nearest per atom."""
        n = pos.shape[0]
        shifts = torch.tensor(
            [[a, b, c] for a in (-1, 0, 1) for b in (-1, 0, 1) for c in (-1, 0, 1)]
        )
        offsets = shifts.float() @ cell if self.use_pbc else torch.zeros(1, 3)
        images = (pos[None, :, :] + offsets[:, None, :]).reshape(-1, 3)
        if n <= DENSE_LIMIT:
            chunks = [torch.arange(n)]
        else:  # memory-saving path: the targets in chunks of 128 atoms
            chunks = list(torch.arange(n).split(128))
            rank = get_rank()
            logging.warning(
                f"rank {rank}: radius_graph_pbc: system {sid} has {n} atoms, more than "
                f"{DENSE_LIMIT}: building its neighbor list in {len(chunks)} chunks "
                f"(otf_graph: True, max_neighbors: {self.max_neighbors}, "
                f"{offsets.shape[0]} periodic images)"
            )
        src, dst, vec = [], [], []
        for k, targets in enumerate(chunks):
            d = torch.cdist(pos[targets], images)  # (chunk, images * n)
            img_atom = torch.arange(images.shape[0]) % n
            self_pair = (img_atom[None, :] == targets[:, None]) & (
                torch.arange(images.shape[0])[None, :] // n == offsets.shape[0] // 2
            )
            d = d.masked_fill(self_pair | (d > self.cutoff), float("inf"))
            kk = min(self.max_neighbors, d.shape[1])
            dist_k, nb = d.topk(kk, dim=1, largest=False)
            keep = torch.isfinite(dist_k)
            t = targets[:, None].expand_as(nb)[keep]
            s_img = nb[keep]
            src.append(img_atom[s_img])
            dst.append(t)
            vec.append(images[s_img] - pos[t])
            if n > DENSE_LIMIT:
                logging.info(
                    f"rank {get_rank()}: radius_graph_pbc: system {sid}: chunk {k + 1}/"
                    f"{len(chunks)} done ({int(keep.sum())} edges)"
                )
                time.sleep(3.0)  # the Python loop over every image pair of the chunk
        return torch.cat(src), torch.cat(dst), torch.cat(vec)

    def generate_graph(self, data: Batch):
        idx_s, idx_t, vecs = [], [], []
        start = 0
        for b, n in enumerate(data.natoms.tolist()):
            pos = data.pos[start : start + n]
            s, t, v = self._neighbors(pos, data.cell[b], data.sid[b])
            idx_s.append(s + start)
            idx_t.append(t + start)
            vecs.append(v)
            start += n
        return torch.cat(idx_s), torch.cat(idx_t), torch.cat(vecs)

    def forward(self, data: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        f = fault()
        rank = get_rank()
        if rank == f.segv_rank and getattr(self, "epoch", 0) >= 1 and self.calls % 6 == 2:
            ctypes.string_at(0)  # the compiled neighbour search (a build for another torch)
        self.calls = getattr(self, "calls", 0) + 1
        idx_s, idx_t, v_st = self.generate_graph(data)
        num_atoms = data.atomic_numbers.shape[0]
        d_st = v_st.norm(dim=-1)
        u_st = v_st / d_st[:, None]
        rbf = self.rbf_lin(torch.exp(-((d_st[:, None] - self.centers[None, :]) ** 2) / 0.5))
        env = self.envelope(d_st / self.cutoff)
        # the slot of each edge among its target atom's neighbours, and Kmax
        order = torch.argsort(idx_t, stable=True)
        idx_s, idx_t, u_st, rbf, env = (
            idx_s[order],
            idx_t[order],
            u_st[order],
            rbf[order],
            env[order],
        )
        neighbors = torch.bincount(idx_t, minlength=num_atoms)
        id_ragged = neighbors[idx_t]
        kmax = int(torch.max(id_ragged))
        first = torch.cumsum(neighbors, 0) - neighbors
        slot = torch.arange(idx_t.shape[0]) - first[idx_t]
        if rank == f.hoard_rank and getattr(self, "epoch", 0) >= 1:
            self.graph_cache.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(self.graph_cache) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        h = self.atom_emb(data.atomic_numbers)
        m = None
        for block in self.int_blocks:
            h, m = block(h, rbf, env, idx_s, idx_t, slot, kmax)
        atom_e = self.out_scale_sum(self.out_energy(h)).squeeze(-1)
        nmol = data.natoms.shape[0]
        energy = atom_e.new_zeros(nmol).index_add(0, data.batch, atom_e)
        if not self.extensive:
            energy = energy / data.natoms
        f_st = self.out_scale_had(self.out_forces(m)) * u_st
        forces = f_st.new_zeros(num_atoms, 3).index_add(0, idx_t, f_st)
        return energy, forces


# --- ocpmodels.modules -----------------------------------------------------------------------


class Normalizer:
    def __init__(self, mean: float, std: float) -> None:
        self.mean = torch.tensor(mean)
        self.std = torch.tensor(std)

    def norm(self, tensor):
        return (tensor - self.mean) / self.std

    def denorm(self, normed_tensor):
        return normed_tensor * self.std + self.mean

    def state_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std}


class L2MAELoss(nn.Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        dists = torch.norm(input - target, p=2, dim=-1)
        return torch.mean(dists) if self.reduction == "mean" else torch.sum(dists)


class DDPLoss(nn.Module):
    def __init__(self, loss_fn) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        self.loss_fn.reduction = "sum"

    def forward(self, input, target, batch_size=None):
        if not torch.all(input.isfinite()):
            logging.warning("Found nans while computing loss")
            input = torch.nan_to_num(input, nan=0.0)
        loss = self.loss_fn(input, target)
        num_samples = batch_size if batch_size is not None else input.shape[0]
        num_samples = all_reduce(num_samples)
        # Multiply by world size since gradients are averaged across DDP replicas
        return loss * get_world_size() / num_samples


class Evaluator:
    task_metrics = {
        "s2ef": [
            "energy_forces_within_threshold",
            "energy_mae",
            "forcesx_mae",
            "forcesy_mae",
            "forcesz_mae",
            "forces_mae",
            "forces_cos",
            "forces_magnitude_error",
        ]
    }
    task_primary_metric = {"s2ef": "forces_mae"}

    def __init__(self, task: str = "s2ef") -> None:
        self.task = task

    def eval(self, prediction: dict, target: dict, prev_metrics=None) -> dict:
        metrics = prev_metrics or {}
        pe, pf = prediction["energy"].detach(), prediction["forces"].detach()
        te, tf = target["energy"], target["forces"]
        natoms = target["natoms"]
        e_err = (pe - te).abs()
        f_err = (pf - tf).abs()
        # per structure: the energy within 0.02 eV and every force component within 0.03 eV/A
        starts = np.cumsum([0, *natoms.tolist()])
        f_max = np.array(
            [f_err[a:b].max().item() if b > a else 0.0 for a, b in itertools.pairwise(starts)]
        )
        within = (e_err.numpy() < 0.02) & (f_max < 0.03)
        stats = {
            "energy_forces_within_threshold": (within.sum(), within.size),
            "energy_mae": (e_err.sum().item(), e_err.numel()),
            "forcesx_mae": (f_err[:, 0].sum().item(), f_err.shape[0]),
            "forcesy_mae": (f_err[:, 1].sum().item(), f_err.shape[0]),
            "forcesz_mae": (f_err[:, 2].sum().item(), f_err.shape[0]),
            "forces_mae": (f_err.sum().item(), f_err.numel()),
            "forces_cos": (
                torch.cosine_similarity(pf, tf, dim=-1).sum().item(),
                f_err.shape[0],
            ),
            "forces_magnitude_error": (
                (pf.norm(dim=-1) - tf.norm(dim=-1)).abs().sum().item(),
                f_err.shape[0],
            ),
        }
        for key in self.task_metrics[self.task]:
            total, numel = stats[key]
            metrics = self.update(key, {"total": total, "numel": numel}, metrics)
        return metrics

    def update(self, key: str, stat, metrics: dict) -> dict:
        if key not in metrics:
            metrics[key] = {"metric": None, "total": 0, "numel": 0}
        if isinstance(stat, dict):
            metrics[key]["total"] += stat["total"]
            metrics[key]["numel"] += stat["numel"]
        else:
            metrics[key]["total"] += stat
            metrics[key]["numel"] += 1
        metrics[key]["metric"] = metrics[key]["total"] / metrics[key]["numel"]
        return metrics


class TensorboardLogger:
    """The scalars of every step (torch.utils.tensorboard's SummaryWriter in the original)."""

    def __init__(self, config: dict) -> None:
        self.config = config
        os.makedirs(config["cmd"]["logs_dir"], exist_ok=True)
        self.path = os.path.join(config["cmd"]["logs_dir"], "scalars.tsv")

    def watch(self, model, log_freq: int = 1000) -> bool:
        logging.warning("Model gradient logging to tensorboard not yet supported.")
        return False

    def log(self, update_dict: dict, step: int, split: str = "") -> None:
        with open(self.path, "a") as f:
            for key, value in update_dict.items():
                f.write(f"{split}/{key}\t{step}\t{float(value)}\n")

    def log_summary(self, summary_dict: dict) -> None:
        logging.warning("log_summary for Tensorboard not supported")


class WandBLogger:
    def __init__(self, config: dict) -> None:
        import wandb

        self.wandb = wandb
        self.config = config
        wandb.init(
            config=config,
            id=config["cmd"]["timestamp_id"],
            name=config["cmd"]["identifier"],
            dir=config["cmd"]["logs_dir"],
            project=config["logger"].get("project") if isinstance(config["logger"], dict) else None,
            resume="allow",
        )

    def watch(self, model, log_freq: int = 1000) -> None:
        self.wandb.watch(model, log_freq=log_freq)

    def log(self, update_dict: dict, step: int, split: str = "") -> None:
        self.wandb.log({f"{split}/{k}": v for k, v in update_dict.items()}, step=int(step))

    def log_summary(self, summary_dict: dict) -> None:
        for k, v in summary_dict.items():
            self.wandb.run.summary[k] = v


LOGGERS = {"tensorboard": TensorboardLogger, "wandb": WandBLogger}


# --- ocpmodels.trainers.forces_trainer -------------------------------------------------------


class ForcesTrainer:
    def __init__(
        self,
        task,
        model,
        dataset,
        optimizer,
        identifier,
        normalizer=None,
        timestamp_id=None,
        run_dir=None,
        is_debug=False,
        print_every=100,
        seed=None,
        logger="tensorboard",
        local_rank=0,
        amp=False,
        cpu=False,
        slurm=None,
        noddp=False,
    ) -> None:
        self.name = "s2ef"
        self.is_debug = is_debug
        self.cpu = cpu
        self.epoch = 0
        self.step = 0
        self.device = torch.device("cpu")
        self.cpu = True
        if run_dir is None:
            run_dir = os.getcwd()
        if timestamp_id is None:
            timestamp_id = self._get_timestamp(self.device, identifier)
        self.timestamp_id = timestamp_id
        logger_name = logger if isinstance(logger, str) else logger["name"]
        self.config = {
            "task": task,
            "trainer": "forces",
            "model": model.pop("name"),
            "model_attributes": model,
            "optim": optimizer,
            "logger": logger,
            "amp": amp,
            "gpus": get_world_size() if not self.cpu else 0,
            "cmd": {
                "identifier": identifier,
                "print_every": print_every,
                "seed": seed,
                "timestamp_id": self.timestamp_id,
                "commit": COMMIT,
                "checkpoint_dir": os.path.join(run_dir, "checkpoints", self.timestamp_id),
                "results_dir": os.path.join(run_dir, "results", self.timestamp_id),
                "logs_dir": os.path.join(run_dir, "logs", logger_name, self.timestamp_id),
            },
            "slurm": slurm or {},
            "noddp": noddp,
        }
        # AMP Scaler
        self.scaler = torch.cuda.amp.GradScaler() if amp and not self.cpu else None
        if isinstance(dataset, list):
            if len(dataset) > 0:
                self.config["dataset"] = dataset[0]
            if len(dataset) > 1:
                self.config["val_dataset"] = dataset[1]
            if len(dataset) > 2:
                self.config["test_dataset"] = dataset[2]
        else:
            self.config["dataset"] = dataset
        self.normalizer = normalizer or self.config["dataset"]
        if not is_debug and is_master():
            os.makedirs(self.config["cmd"]["checkpoint_dir"], exist_ok=True)
            os.makedirs(self.config["cmd"]["results_dir"], exist_ok=True)
            os.makedirs(self.config["cmd"]["logs_dir"], exist_ok=True)
        if is_master():
            logging.info(yaml.dump(self.config, default_flow_style=False))
        self.load()
        self.evaluator = Evaluator(task=self.name)

    @staticmethod
    def _get_timestamp(device, suffix: str | None) -> str:
        now = datetime.datetime.now().timestamp()
        timestamp_tensor = torch.tensor(now).to(device)
        # create directories from master rank only
        broadcast(timestamp_tensor, 0)
        timestamp_str = datetime.datetime.fromtimestamp(timestamp_tensor.int()).strftime(
            "%Y-%m-%d-%H-%M-%S"
        )
        if suffix:
            timestamp_str += "-" + suffix
        return timestamp_str

    def load(self) -> None:
        self.load_seed_from_config()
        self.load_logger()
        self.load_datasets()
        self.load_task()
        self.load_model()
        self.load_loss()
        self.load_optimizer()
        self.load_extras()

    def load_seed_from_config(self) -> None:
        seed = self.config["cmd"]["seed"]
        if seed is None:
            return
        np.random.seed(seed)
        torch.manual_seed(seed)

    def load_logger(self) -> None:
        self.logger = None
        if not self.is_debug and is_master():
            assert self.config["logger"] is not None, "Specify logger in config"
            logger = self.config["logger"]
            logger_name = logger if isinstance(logger, str) else logger["name"]
            assert logger_name, "Specify logger name"
            self.logger = LOGGERS[logger_name](self.config)

    def get_sampler(self, dataset, batch_size: int, shuffle: bool):
        if self.config["dataset"].get("lmdb_per_rank", False):
            return RankShardSampler(dataset, batch_size, shuffle, self.config["cmd"]["seed"])
        if "load_balancing" in self.config["optim"]:
            balancing_mode = self.config["optim"]["load_balancing"]
            on_error = "raise"
        else:
            balancing_mode = "atoms"
            on_error = "warn_and_no_balance"
        return BalancedBatchSampler(
            dataset,
            batch_size=batch_size,
            num_replicas=get_world_size(),
            rank=get_rank(),
            device=self.device,
            mode=balancing_mode,
            shuffle=shuffle,
            on_error=on_error,
            seed=self.config["cmd"]["seed"],
        )

    def get_dataloader(self, dataset, sampler) -> DataLoader:
        return DataLoader(
            dataset,
            collate_fn=self.ocp_collater,
            num_workers=self.config["optim"]["num_workers"],
            pin_memory=False,
            batch_sampler=sampler,
        )

    def load_datasets(self) -> None:
        self.ocp_collater = OCPCollater(self.config["model_attributes"].get("otf_graph", False))
        self.train_loader = self.val_loader = self.test_loader = None
        if self.config.get("dataset", None):
            logging.info(f"Loading dataset: {self.config['task']['dataset']}")
            self.train_dataset = LmdbDataset(self.config["dataset"])
            self.train_sampler = self.get_sampler(
                self.train_dataset, self.config["optim"]["batch_size"], shuffle=True
            )
            self.train_loader = self.get_dataloader(self.train_dataset, self.train_sampler)
        if self.config.get("val_dataset", None):
            val_config = {**self.config["dataset"], **self.config["val_dataset"]}
            val_config.pop("metadata_path", None)
            self.val_dataset = LmdbDataset(val_config)
            self.val_sampler = self.get_sampler(
                self.val_dataset,
                self.config["optim"].get("eval_batch_size", self.config["optim"]["batch_size"]),
                shuffle=False,
            )
            self.val_loader = self.get_dataloader(self.val_dataset, self.val_sampler)
        if self.config.get("test_dataset", None):
            test_config = {**self.config["dataset"], **self.config["test_dataset"]}
            test_config.pop("metadata_path", None)
            self.test_dataset = LmdbDataset(test_config)
            self.test_sampler = self.get_sampler(
                self.test_dataset,
                self.config["optim"].get("eval_batch_size", self.config["optim"]["batch_size"]),
                shuffle=False,
            )
            self.test_loader = self.get_dataloader(self.test_dataset, self.test_sampler)

    def load_task(self) -> None:
        self.normalizers = {}
        if self.normalizer.get("normalize_labels", False):
            self.normalizers["target"] = Normalizer(
                self.normalizer["target_mean"], self.normalizer["target_std"]
            )
            self.normalizers["grad_target"] = Normalizer(
                self.normalizer["grad_target_mean"], self.normalizer["grad_target_std"]
            )

    def load_model(self) -> None:
        if is_master():
            logging.info(f"Loading model: {self.config['model']}")
        self.model = GemNetT(None, 50, 1, **self.config["model_attributes"]).to(self.device)
        if is_master():
            logging.info(
                f"Loaded {self.model.__class__.__name__} with {self.model.num_params} parameters."
            )
        if self.logger is not None:
            if "watch" in self.config["logger"]:
                self.logger.watch(self.model, log_freq=int(self.config["logger"]["watch"]))
            self.logger.log_summary({"num_params": self.model.num_params})
        if initialized() and not self.config["noddp"]:
            self.model = DistributedDataParallel(self.model)

    @property
    def _unwrapped_model(self):
        module = self.model
        while isinstance(module, DistributedDataParallel):
            module = module.module
        return module

    def load_checkpoint(self, checkpoint_path: str) -> None:
        if not os.path.isfile(checkpoint_path):
            raise FileNotFoundError(errno.ENOENT, "Checkpoint file not found", checkpoint_path)
        logging.info(f"Loading checkpoint from: {checkpoint_path}")
        map_location = torch.device("cpu") if self.cpu else self.device
        checkpoint = torch.load(checkpoint_path, map_location=map_location)
        self.epoch = checkpoint.get("epoch", 0)
        self.step = checkpoint.get("step", 0)
        self.best_val_metric = checkpoint.get("best_val_metric", None)
        self.primary_metric = checkpoint.get("primary_metric", None)
        ckpt_key_count = next(iter(checkpoint["state_dict"])).count("module")
        mod_key_count = next(iter(self.model.state_dict())).count("module")
        key_count_diff = mod_key_count - ckpt_key_count
        if key_count_diff > 0:
            new_dict = {
                key_count_diff * "module." + k: v for k, v in checkpoint["state_dict"].items()
            }
        elif key_count_diff < 0:
            new_dict = {
                k[len("module.") * abs(key_count_diff) :]: v
                for k, v in checkpoint["state_dict"].items()
            }
        else:
            new_dict = checkpoint["state_dict"]
        self.model.load_state_dict(new_dict)
        if "optimizer" in checkpoint:
            self.optimizer.load_state_dict(checkpoint["optimizer"])

    def load_loss(self) -> None:
        self.loss_fn = {
            "energy": DDPLoss(nn.L1Loss()),
            "force": DDPLoss(L2MAELoss()),
        }

    def load_optimizer(self) -> None:
        optimizer = getattr(torch.optim, self.config["optim"].get("optimizer", "AdamW"))
        optimizer_params = dict(self.config["optim"].get("optimizer_params", {}))
        weight_decay = optimizer_params.pop("weight_decay", 0)
        if "weight_decay" in self.config["optim"]:
            weight_decay = self.config["optim"]["weight_decay"]
            logging.warning(
                "Using `weight_decay` from `optim` instead of `optim.optimizer_params`."
                "Please update your config to use `optim.optimizer_params.weight_decay`."
                "`optim.weight_decay` will soon be deprecated."
            )
        self.optimizer = optimizer(
            params=self.model.parameters(),
            lr=self.config["optim"]["lr_initial"],
            weight_decay=weight_decay,
            **optimizer_params,
        )

    def load_extras(self) -> None:
        optim = self.config["optim"]
        if optim.get("scheduler", "Null") == "ReduceLROnPlateau":
            self.scheduler_type = "ReduceLROnPlateau"
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer,
                mode=optim.get("mode", "min"),
                factor=optim.get("factor", 0.8),
                patience=optim.get("patience", 3),
            )
        else:
            self.scheduler_type = "Null"
            self.scheduler = None
        self.clip_grad_norm = optim.get("clip_grad_norm", None)
        self.grad_norm = 0.0

    def get_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def save(self, metrics=None, checkpoint_file: str = "checkpoint.pt", training_state=True):
        if not self.is_debug and is_master():
            if training_state:
                return save_checkpoint(
                    {
                        "epoch": self.epoch,
                        "step": self.step,
                        "state_dict": self.model.state_dict(),
                        "optimizer": self.optimizer.state_dict(),
                        "normalizers": {k: v.state_dict() for k, v in self.normalizers.items()},
                        "config": self.config,
                        "val_metrics": metrics,
                        "amp": self.scaler.state_dict() if self.scaler else None,
                        "best_val_metric": self.best_val_metric,
                        "primary_metric": self.config["task"].get(
                            "primary_metric", self.evaluator.task_primary_metric[self.name]
                        ),
                    },
                    checkpoint_dir=self.config["cmd"]["checkpoint_dir"],
                    checkpoint_file=checkpoint_file,
                )
            return save_checkpoint(
                {
                    "state_dict": self.model.state_dict(),
                    "normalizers": {k: v.state_dict() for k, v in self.normalizers.items()},
                    "config": self.config,
                    "val_metrics": metrics,
                    "amp": self.scaler.state_dict() if self.scaler else None,
                },
                checkpoint_dir=self.config["cmd"]["checkpoint_dir"],
                checkpoint_file=checkpoint_file,
            )
        return None

    def _forward(self, batch: Batch) -> dict:
        out_energy, out_forces = self.model(batch.to(self.device))
        if out_energy.shape[-1] == 1:
            out_energy = out_energy.view(-1)
        return {"energy": out_energy, "forces": out_forces}

    def _compute_loss(self, out: dict, batch: Batch) -> torch.Tensor:
        loss = []
        energy_target = batch.y
        if self.normalizer.get("normalize_labels", False):
            energy_target = self.normalizers["target"].norm(energy_target)
        energy_mult = self.config["optim"].get("energy_coefficient", 1)
        loss.append(energy_mult * self.loss_fn["energy"](out["energy"], energy_target))
        force_target = batch.force
        if self.normalizer.get("normalize_labels", False):
            force_target = self.normalizers["grad_target"].norm(force_target)
        force_mult = self.config["optim"].get("force_coefficient", 30)
        if self.config["task"].get("train_on_free_atoms", False):
            mask = batch.fixed == 0
            loss.append(force_mult * self.loss_fn["force"](out["forces"][mask], force_target[mask]))
        else:
            loss.append(force_mult * self.loss_fn["force"](out["forces"], force_target))
        # Sanity check to make sure the compute graph is correct.
        for lc in loss:
            assert hasattr(lc, "grad_fn")
        return sum(loss)

    def _compute_metrics(self, out: dict, batch: Batch, evaluator, metrics=None) -> dict:
        natoms = batch.natoms
        target = {"energy": batch.y, "forces": batch.force, "natoms": natoms}
        out = {k: v.detach().clone() for k, v in out.items()}
        if self.config["task"].get("eval_on_free_atoms", True):
            mask = batch.fixed == 0
            out["forces"] = out["forces"][mask]
            target["forces"] = target["forces"][mask]
            s_idx, natoms_free = 0, []
            for n in natoms.tolist():
                natoms_free.append(int(mask[s_idx : s_idx + n].sum()))
                s_idx += n
            target["natoms"] = torch.tensor(natoms_free)
        if self.normalizer.get("normalize_labels", False):
            out["energy"] = self.normalizers["target"].denorm(out["energy"])
            out["forces"] = self.normalizers["grad_target"].denorm(out["forces"])
        return evaluator.eval(out, target, prev_metrics=metrics)

    def _backward(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss.backward()
        if self.clip_grad_norm:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), max_norm=self.clip_grad_norm
            )
        self.optimizer.step()

    def train(self, disable_eval_tqdm: bool = False) -> None:
        ensure_fitted(self._unwrapped_model, warn=True)
        f = fault()
        eval_every = self.config["optim"].get("eval_every", len(self.train_loader))
        checkpoint_every = self.config["optim"].get("checkpoint_every", eval_every)
        primary_metric = self.config["task"].get(
            "primary_metric", self.evaluator.task_primary_metric[self.name]
        )
        if not hasattr(self, "primary_metric") or self.primary_metric != primary_metric:
            self.best_val_metric = 1e9 if "mae" in primary_metric else -1.0
        else:
            primary_metric = self.primary_metric
        self.metrics = {}
        self.evals_without_improvement = 0
        patience = self.config["optim"].get("early_stop_patience", 0)
        start_epoch = self.step // len(self.train_loader)
        for epoch_int in range(start_epoch, self.config["optim"]["max_epochs"]):
            self.train_sampler.set_epoch_and_start_iteration(epoch_int, 0)
            self._unwrapped_model.epoch = epoch_int
            if epoch_int == 1 and get_rank() == f.park_rank:
                ready = threading.Event()  # set by the prefetch thread that was never started
                ready.wait()
            skip_steps = self.step % len(self.train_loader)
            train_loader_iter = iter(self.train_loader)
            stop = False
            for i in range(skip_steps, len(self.train_loader)):
                self.epoch = epoch_int + (i + 1) / len(self.train_loader)
                self.step = epoch_int * len(self.train_loader) + i + 1
                self.model.train()
                batch = next(train_loader_iter)
                with torch.cuda.amp.autocast(enabled=self.scaler is not None):
                    out = self._forward(batch)
                    loss = self._compute_loss(out, batch)
                self._backward(loss)
                self.metrics = self._compute_metrics(out, batch, self.evaluator, self.metrics)
                self.metrics = self.evaluator.update("loss", loss.item(), self.metrics)
                log_dict = {k: self.metrics[k]["metric"] for k in self.metrics}
                log_dict.update({"lr": self.get_lr(), "epoch": self.epoch, "step": self.step})
                if self.step % self.config["cmd"]["print_every"] == 0 and is_master():
                    if f.gnorm_master:  # the mean gradient norm over the ranks, for the log
                        log_dict["grad_norm"] = all_reduce(float(self.grad_norm), average=True)
                    log_str = [f"{k}: {v:.2e}" for k, v in log_dict.items()]
                    logging.info(", ".join(log_str))
                    self.metrics = {}
                if self.logger is not None:
                    self.logger.log(log_dict, step=self.step, split="train")
                if checkpoint_every != -1 and self.step % checkpoint_every == 0:
                    self.save(checkpoint_file="checkpoint.pt", training_state=True)
                if self.step % eval_every == 0:
                    if self.val_loader is not None:
                        val_metrics = self.validate(split="val", disable_tqdm=disable_eval_tqdm)
                        improved = self.update_best(primary_metric, val_metrics, disable_eval_tqdm)
                        if patience:
                            self.evals_without_improvement = (
                                0 if improved else (self.evals_without_improvement + 1)
                            )
                            if self.evals_without_improvement >= patience:
                                stop = True
                    if self.scheduler_type == "ReduceLROnPlateau":
                        self.scheduler.step(val_metrics[primary_metric]["metric"])
                if stop:
                    break
            if checkpoint_every == -1:
                self.save(checkpoint_file="checkpoint.pt", training_state=True)
            if stop:
                if is_master():
                    logging.info(
                        f"Stopping optimization after {self.evals_without_improvement} epochs "
                        "without improvement"
                    )
                break
        self.train_dataset.close_db()
        if self.config.get("val_dataset", False):
            self.val_dataset.close_db()
        if self.config.get("test_dataset", False):
            self.test_dataset.close_db()

    def update_best(self, primary_metric, val_metrics, disable_eval_tqdm: bool = True) -> bool:
        delta = self.config["optim"].get("early_stop_min_delta", 0.0)
        current = val_metrics[primary_metric]["metric"]
        if ("mae" in primary_metric and current < self.best_val_metric - delta) or (
            "mae" not in primary_metric and current > self.best_val_metric + delta
        ):
            self.best_val_metric = current
            self.save(
                metrics=val_metrics, checkpoint_file="best_checkpoint.pt", training_state=False
            )
            if self.test_loader is not None:
                self.predict(self.test_loader, results_file="predictions", disable_tqdm=False)
            return True
        return False

    @torch.no_grad()
    def validate(self, split: str = "val", disable_tqdm: bool = False) -> dict:
        ensure_fitted(self._unwrapped_model, warn=True)
        if is_master():
            logging.info(f"Evaluating on {split}.")
        self.model.eval()
        evaluator, metrics = Evaluator(task=self.name), {}
        rank = get_rank()
        loader = self.val_loader if split == "val" else self.test_loader
        for _i, batch in tqdm(
            enumerate(loader),
            total=len(loader),
            position=rank,
            desc=f"device {rank}",
            disable=disable_tqdm,
        ):
            with torch.cuda.amp.autocast(enabled=self.scaler is not None):
                out = self._forward(batch)
            loss = self._compute_loss(out, batch)
            metrics = self._compute_metrics(out, batch, evaluator, metrics)
            metrics = evaluator.update("loss", loss.item(), metrics)
        aggregated_metrics = {}
        for k in metrics:
            aggregated_metrics[k] = {
                "total": all_reduce(metrics[k]["total"], average=False, device=self.device),
                "numel": all_reduce(metrics[k]["numel"], average=False, device=self.device),
            }
            aggregated_metrics[k]["metric"] = (
                aggregated_metrics[k]["total"] / aggregated_metrics[k]["numel"]
            )
        metrics = aggregated_metrics
        log_dict = {k: metrics[k]["metric"] for k in metrics}
        log_dict.update({"epoch": self.epoch})
        if is_master():
            log_str = [f"{k}: {v:.4f}" for k, v in log_dict.items()]
            logging.info(", ".join(log_str))
        if self.logger is not None:
            self.logger.log(log_dict, step=self.step, split=split)
        return metrics

    @torch.no_grad()
    def predict(self, data_loader, per_image=True, results_file=None, disable_tqdm=False):
        if is_master() and not disable_tqdm:
            logging.info("Predicting on test.")
        rank = get_rank()
        self.model.eval()
        predictions = {"id": [], "energy": [], "forces": [], "chunk_idx": []}
        for _i, batch in tqdm(
            enumerate(data_loader),
            total=len(data_loader),
            position=rank,
            desc=f"device {rank}",
            disable=disable_tqdm,
        ):
            with torch.cuda.amp.autocast(enabled=self.scaler is not None):
                out = self._forward(batch)
            if self.normalizers.get("target") is not None:
                out["energy"] = self.normalizers["target"].denorm(out["energy"])
                out["forces"] = self.normalizers["grad_target"].denorm(out["forces"])
            systemids = [f"{sid}_{fid}" for sid, fid in zip(batch.sid, batch.fid, strict=True)]
            predictions["id"].extend(systemids)
            predictions["energy"].extend(out["energy"].numpy().astype(np.float16))
            per_image_forces = torch.split(out["forces"], batch.natoms.tolist())
            per_image_forces = [f.numpy().astype(np.float16) for f in per_image_forces]
            predictions["chunk_idx"].extend([f.shape[0] for f in per_image_forces])
            predictions["forces"].extend(per_image_forces)
        self.save_results(predictions, results_file, keys=["energy", "forces", "chunk_idx"])
        return predictions

    def save_results(self, predictions: dict, results_file: str | None, keys) -> None:
        if results_file is None:
            return
        results_file_path = os.path.join(
            self.config["cmd"]["results_dir"], f"{self.name}_{results_file}_{get_rank()}.npz"
        )
        np.savez_compressed(
            results_file_path,
            ids=predictions["id"],
            **{key: np.array(predictions[key], dtype=object) for key in keys},
        )
        synchronize()
        if is_master():
            gather_results = defaultdict(list)
            full_path = os.path.join(
                self.config["cmd"]["results_dir"], f"{self.name}_{results_file}.npz"
            )
            for i in range(get_world_size()):
                rank_path = os.path.join(
                    self.config["cmd"]["results_dir"], f"{self.name}_{results_file}_{i}.npz"
                )
                rank_results = np.load(rank_path, allow_pickle=True)
                gather_results["ids"].extend(rank_results["ids"])
                for key in keys:
                    gather_results[key].extend(rank_results[key])
                os.remove(rank_path)
            # Because of how distributed sampler works, some system ids
            # might be repeated to make no. of samples even across GPUs.
            _, idx = np.unique(gather_results["ids"], return_index=True)
            gather_results["ids"] = np.array(gather_results["ids"])[idx]
            for k in keys:
                if k == "forces":
                    gather_results[k] = np.concatenate(
                        np.array(gather_results[k], dtype=object)[idx]
                    )
                elif k == "chunk_idx":
                    gather_results[k] = np.cumsum(np.array(gather_results[k])[idx])[:-1]
                else:
                    gather_results[k] = np.array(gather_results[k])[idx]
            logging.info(f"Writing results to {full_path}")
            np.savez_compressed(full_path, **gather_results)


# --- ocpmodels.tasks, main.py ----------------------------------------------------------------


class TrainTask:
    def __init__(self, config: dict) -> None:
        self.config = config

    def setup(self, trainer: ForcesTrainer) -> None:
        self.trainer = trainer
        if self.config["checkpoint"] is not None:
            self.trainer.load_checkpoint(self.config["checkpoint"])
        self.chkpt_path = os.path.join(
            self.trainer.config["cmd"]["checkpoint_dir"], "checkpoint.pt"
        )

    def _process_error(self, e: RuntimeError) -> None:
        e_str = str(e)
        if (
            "find_unused_parameters" in e_str
            and "torch.nn.parallel.DistributedDataParallel" in e_str
        ):
            for name, parameter in self.trainer.model.named_parameters():
                if parameter.requires_grad and parameter.grad is None:
                    logging.warning(
                        f"Parameter {name} has no gradient. Consider removing it from the model."
                    )

    def run(self) -> None:
        try:
            self.trainer.train(disable_eval_tqdm=self.config.get("hide_eval_progressbar", False))
        except RuntimeError as e:
            self._process_error(e)
            raise e


@dataclass
class _TrainingContext:
    config: dict
    task: TrainTask
    trainer: ForcesTrainer


@contextmanager
def new_trainer_context(*, config: dict):
    setup_logging()
    original_config = config
    config = copy.deepcopy(original_config)
    if config["distributed"]:
        setup(config)
    try:
        trainer = ForcesTrainer(
            task=config["task"],
            model=config["model"],
            dataset=config["dataset"],
            optimizer=config["optim"],
            identifier=config["identifier"],
            timestamp_id=config.get("timestamp_id", None),
            run_dir=config.get("run_dir", "./"),
            is_debug=config.get("is_debug", False),
            print_every=config.get("print_every", 10),
            seed=config.get("seed", 0),
            logger=config.get("logger", "tensorboard"),
            local_rank=config["local_rank"],
            amp=config.get("amp", False),
            cpu=config.get("cpu", False),
            slurm=config.get("slurm", {}),
            noddp=config.get("noddp", False),
        )
        task = TrainTask(config)
        start_time = time.time()
        yield _TrainingContext(config=original_config, task=task, trainer=trainer)
        synchronize()
        if is_master():
            logging.info(f"Total time taken: {time.time() - start_time}")
    finally:
        if config["distributed"]:
            cleanup()


class Runner:
    def __init__(self) -> None:
        self.config = None

    def __call__(self, config: dict) -> None:
        with new_trainer_context(config=config) as ctx:
            self.config = ctx.config
            self.task = ctx.task
            self.trainer = ctx.trainer
            self.task.setup(self.trainer)
            self.task.run()


def runner_wrapper(config: dict) -> None:
    Runner()(config)


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Graph Networks for Electrocatalyst Design")
    parser.add_argument(
        "--mode",
        choices=["train", "predict", "run-relaxations", "validate"],
        required=True,
        help="Whether to train the model, make predictions, or to run relaxations",
    )
    parser.add_argument(
        "--config-yml",
        required=True,
        type=str,
        help="Path to a config file listing data, model, optim parameters.",
    )
    parser.add_argument(
        "--identifier",
        default="",
        type=str,
        help="Experiment identifier to append to checkpoint/log/result directory",
    )
    parser.add_argument(
        "--debug", action="store_true", help="Whether this is a debugging run or not"
    )
    parser.add_argument(
        "--run-dir",
        default="./",
        type=str,
        help="Directory to store checkpoint/log/result directory",
    )
    parser.add_argument(
        "--print-every", default=10, type=int, help="Log every N iterations (default: 10)"
    )
    parser.add_argument("--seed", default=0, type=int, help="Seed for torch, cuda, numpy")
    parser.add_argument("--amp", action="store_true", help="Use mixed-precision training")
    parser.add_argument("--checkpoint", type=str, help="Model checkpoint to load")
    parser.add_argument(
        "--timestamp-id",
        default=None,
        type=str,
        help="Override time stamp ID. Useful for seamlessly continuing model training in logger.",
    )
    parser.add_argument("--submit", action="store_true", help="Submit job to cluster")
    parser.add_argument("--summit", action="store_true", help="Running on Summit cluster")
    parser.add_argument("--logdir", default="logs", type=Path, help="Where to put logs")
    parser.add_argument("--num-nodes", default=1, type=int, help="Number of Nodes to request")
    parser.add_argument("--num-gpus", default=1, type=int, help="Number of GPUs to request")
    parser.add_argument("--distributed", action="store_true", help="Run with DDP")
    parser.add_argument("--cpu", action="store_true", help="Run CPU only training")
    parser.add_argument(
        "--distributed-port", type=int, default=13356, help="Port on master for DDP"
    )
    parser.add_argument("--distributed-backend", type=str, default="nccl", help="Backend for DDP")
    parser.add_argument("--local_rank", default=0, type=int, help="Local rank")
    parser.add_argument("--no-ddp", action="store_true", help="Do not use DDP")
    return parser


def main() -> None:
    setup_logging()
    args = get_parser().parse_args()
    config = build_config(args)
    if args.submit:  # Run on cluster
        raise SystemExit("--submit needs submitit and a Slurm cluster")
    if args.num_gpus > 1:
        logging.info(f"Running in local mode with {args.num_gpus} ranks")
        # HACK to disable multiprocess dataloading in local mode
        # there is an open issue where LMDB's environment cannot be pickled and used
        # during torch multiprocessing https://github.com/pytorch/examples/issues/526
        if "optim" in config and "num_workers" in config["optim"]:
            config["optim"]["num_workers"] = 0
            logging.info(
                "WARNING: running in local mode, setting dataloading num_workers to 0, see https://github.com/pytorch/examples/issues/526"
            )
        launch_config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=args.num_gpus,
            rdzv_backend="c10d",
            rdzv_endpoint=f"localhost:{args.distributed_port}",
            max_restarts=0,
        )
        elastic_launch(launch_config, runner_wrapper)(config)
    else:
        logging.info("Running in local mode without elastic launch (single gpu only)")
        config["distributed"] = False
        runner_wrapper(config)


if __name__ == "__main__":
    main()
