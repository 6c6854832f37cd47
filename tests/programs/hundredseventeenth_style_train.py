"""A hundred-and-seventeenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredseventeenth-*): protein structure model training in the way of
aqlaboratory/openfold's train_openfold.py (an OpenFoldWrapper LightningModule, an
OpenFoldDataModule reading mmCIF files, precomputed alignments and template hits, PyTorch
Lightning's Trainer with the DDP strategy), re-created in plain torch without lightning,
deepspeed or openfold. Linked into each run's folder as train_openfold.py and started as
OpenFold's README starts it, ONE process from a terminal:

    python3 train_openfold.py mmcif_dir/ alignment_dir/ template_mmcif_dir/ output_dir/ \
        2021-10-10 --config_preset initial_training --seed 42 --gpus 2 --num_nodes 1 \
        --train_chain_data_cache_path chain_data_cache.json \
        --template_release_dates_cache_path mmcif_cache.json --precision bf16 \
        --checkpoint_every_epoch [--val_data_dir ... --val_alignment_dir ...]

That process is global rank 0: in trainer.fit it re-executes the same command line for local
ranks 1..N-1 with LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as
Lightning's _SubprocessScriptLauncher does (their output on the same terminal), joins a gloo
group (15 s timeout), runs the data module's setup on every rank, wraps the model in DDP and
trains. `python3 train_openfold.py prepare` writes what the user has before training: synthetic
chains (random sequences, random-walk CA coordinates) as mmCIF-like text files, their alignment
folders (uniref90_hits.a3m, bfd_uniclust_hits.a3m, pdb70_hits.hhr), template mmCIF files, the
chain data cache and the template release-date cache. A fault in the code is chosen by the
TQ_CASE environment variable (a short code) and never printed.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import logging
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

CASE = os.environ.get("TQ_CASE", "")
LETTER, WHO = (CASE[0], int(CASE[1:] or 0)) if CASE else ("", -1)

RESTYPES = "ARNDCQEGHILKMFPSTWYV"
AA3 = {
    "A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN", "E": "GLU",
    "G": "GLY", "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE",
    "P": "PRO", "S": "SER", "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL",
}  # fmt: skip
AA1 = {v: k for k, v in AA3.items()}

# ----------------------------------------------------------------------------------------------
# loggers: Lightning's (plain, stderr), OpenFold's (the root logger, Python's default format)
# ----------------------------------------------------------------------------------------------


def _env_rank() -> int | None:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return None


class RankZero:
    rank = _env_rank() or 0


def _plain_logger(name: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(logging.StreamHandler(sys.stderr))
    return log


pl_log = _plain_logger("lightning.pytorch")
fabric_log = _plain_logger("lightning.fabric")


def rank_zero_info(msg: str, log: logging.Logger = pl_log) -> None:
    if RankZero.rank == 0:
        log.info(msg)


def rank_zero_warn(msg: str, category: type[Warning] = UserWarning) -> None:
    if RankZero.rank == 0:
        warnings.warn(msg, category, stacklevel=2)


def rank_prefixed(msg: str, rank: int | None) -> str:
    return f"[rank: {rank}] {msg}" if rank is not None else msg


# ----------------------------------------------------------------------------------------------
# prepare: the user's data before training
# ----------------------------------------------------------------------------------------------

N_TRAIN, N_VAL, N_TEMPLATES = 18, 4, 24


def _pdb_id(rng: random.Random) -> str:
    return str(rng.randint(1, 9)) + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789")
                                            for _ in range(3))  # fmt: skip


def _walk(rng: random.Random, n: int) -> list[tuple[float, float, float]]:
    xyz, p = [], [0.0, 0.0, 0.0]
    for _ in range(n):
        theta, phi = rng.uniform(0, math.pi), rng.uniform(0, 2 * math.pi)
        p = [p[0] + 3.8 * math.sin(theta) * math.cos(phi),
             p[1] + 3.8 * math.sin(theta) * math.sin(phi), p[2] + 3.8 * math.cos(theta)]  # fmt: skip
        xyz.append(tuple(p))
    return xyz


def write_mmcif(path: Path, pdb: str, chain: str, seq: str, date: str, res: float, xyz) -> None:
    lines = [f"data_{pdb.upper()}", "#", f"_entry.id   {pdb.upper()}", "#",
             f"_pdbx_database_status.recvd_initial_deposition_date   {date}", "#",
             f"_refine.ls_d_res_high   {res:.2f}", "#", "_exptl.method   'X-RAY DIFFRACTION'",
             "#", "loop_", "_entity_poly.entity_id", "_entity_poly.pdbx_strand_id",
             "_entity_poly.pdbx_seq_one_letter_code", f"1 {chain} {seq}", "#", "loop_"]  # fmt: skip
    cols = ["group_PDB", "id", "label_atom_id", "label_comp_id", "auth_asym_id", "auth_seq_id",
            "Cartn_x", "Cartn_y", "Cartn_z", "occupancy", "B_iso_or_equiv"]  # fmt: skip
    lines += [f"_atom_site.{c}" for c in cols]
    for i, (aa, (x, y, z)) in enumerate(zip(seq, xyz, strict=True)):
        lines.append(f"ATOM {i + 1} CA {AA3[aa]} {chain} {i + 1} {x:.3f} {y:.3f} {z:.3f} 1.00 "
                     f"{20 + (i % 7) * 3:.2f}")  # fmt: skip
    lines.append("#")
    path.write_text("\n".join(lines) + "\n")


def write_a3m(path: Path, seq: str, rng: random.Random, depth: int, db: str) -> None:
    out = [">query", seq]
    for k in range(depth):
        hit = "".join(c if rng.random() < 0.7 else rng.choice(RESTYPES + "-") for c in seq)
        out += [f">{db}_{rng.randint(10000, 99999)}_{k}", hit]
    path.write_text("\n".join(out) + "\n")


def prepare(root: Path) -> None:
    rng = random.Random(7)
    for d in ("mmcif_dir", "alignment_dir", "template_mmcif_dir", "val_data_dir",
              "val_alignment_dir", "output_dir"):  # fmt: skip
        (root / d).mkdir(parents=True, exist_ok=True)
    templates, mmcif_cache = [], {}
    for _ in range(N_TEMPLATES):
        pdb = _pdb_id(rng)
        seq = "".join(rng.choice(RESTYPES) for _ in range(90))
        date = f"{rng.randint(1995, 2019)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        write_mmcif(root / "template_mmcif_dir" / f"{pdb}.cif", pdb, "A", seq, date, 2.0,
                    _walk(rng, len(seq)))  # fmt: skip
        mmcif_cache[pdb] = {"release_date": date, "chain_ids": ["A"], "seqs": [seq],
                            "no_chains": 1}  # fmt: skip
        templates.append(pdb)
    (root / "mmcif_cache.json").write_text(json.dumps(mmcif_cache, indent=4))
    cache = {}
    ids = sorted({_pdb_id(rng) for _ in range(N_TRAIN + N_VAL + 8)} - set(templates))
    for split, chains in (("train", ids[:N_TRAIN]), ("val", ids[N_TRAIN:N_TRAIN + N_VAL])):  # fmt: skip
        cif_dir = root / ("mmcif_dir" if split == "train" else "val_data_dir")
        aln_root = root / ("alignment_dir" if split == "train" else "val_alignment_dir")
        for k, pdb in enumerate(chains):
            n = 44 if (split == "train" and k == 5) else rng.randint(80, 96)
            seq = "".join(rng.choice(RESTYPES) for _ in range(n))
            late = split == "train" and k in (9, 14)
            date = "2022-03-16" if late else f"{rng.randint(1996, 2020)}-{rng.randint(1, 12):02d}-01"  # fmt: skip
            res = round(rng.uniform(1.4, 2.4), 2)
            if split == "train" and k in (3, 7):
                res = 2.9 + k / 20  # two lower-resolution structures, both at odd places
            write_mmcif(cif_dir / f"{pdb}.cif", pdb, "A", seq, date, res, _walk(rng, n))
            aln = aln_root / f"{pdb}_A"
            aln.mkdir(parents=True, exist_ok=True)
            write_a3m(aln / "uniref90_hits.a3m", seq, rng, 5, "UniRef90")
            write_a3m(aln / "bfd_uniclust_hits.a3m", seq, rng, 4, "UniRef30")
            hits = rng.sample(templates, 3)
            hhr = [f"Query         {pdb}_A", f"Match_columns {n}", "No_of_seqs    9 out of 12", "",
                   " No Hit                             Prob E-value P-value  Score    SS Cols"]  # fmt: skip
            for j, t in enumerate(hits):
                hhr.append(f"{j + 1:3d} {t}_A mol:protein length:90  {99.0 - j:5.1f} 1.2E-30 "
                           f"3.1E-35  210.4   0.0   {n - j}")  # fmt: skip
            (aln / "pdb70_hits.hhr").write_text("\n".join(hhr) + "\n")
            if split == "train":
                cache[f"{pdb}_A"] = {"release_date": date, "seq": seq, "resolution": res,
                                     "cluster_size": rng.randint(1, 9)}  # fmt: skip
    (root / "chain_data_cache.json").write_text(json.dumps(cache, indent=4))


# ----------------------------------------------------------------------------------------------
# openfold.data: mmCIF parsing, alignments, templates, the data module
# ----------------------------------------------------------------------------------------------


class PDBxConstructionError(Exception):
    """openfold/data/mmcif_parsing.py's error for an mmCIF file it cannot build a structure of."""


class PDBConstructionWarning(Warning):
    """Bio.PDB's warning for a structure it builds with a defect."""


def parse_mmcif(path: str) -> dict:
    file_id = Path(path).stem
    with open(path) as f:
        lines = f.read().splitlines()
    header, cols, atoms, seq = {}, [], [], ""
    for i, line in enumerate(lines):
        if line.startswith("_atom_site."):
            cols.append(line.split(".", 1)[1])
        elif line.startswith("ATOM"):
            values = line.split()
            if len(values) != len(cols):
                raise PDBxConstructionError(
                    f"{file_id}: _atom_site loop row at line {i + 1} has {len(values)} values "
                    f"for {len(cols)} columns"
                )
            atoms.append(dict(zip(cols, values, strict=True)))
        elif line.startswith("1 ") and not cols:
            seq = line.split()[2]
        elif line.startswith("_") and len(line.split()) == 2:
            key, value = line.split()
            header[key] = value
    if not atoms or "_refine.ls_d_res_high" not in header:
        raise PDBxConstructionError(f"{file_id}: no _atom_site records: empty or truncated file")
    resnums = [int(a["auth_seq_id"]) for a in atoms]
    for a, b in zip(resnums, resnums[1:], strict=False):  # noqa: RUF007
        if b != a + 1:
            warnings.warn(f"WARNING: Chain A is discontinuous at line {a + 40}.",
                          PDBConstructionWarning, stacklevel=2)  # fmt: skip
    xyz = torch.tensor([[float(a["Cartn_x"]), float(a["Cartn_y"]), float(a["Cartn_z"])]
                        for a in atoms])  # fmt: skip
    return {"file_id": file_id, "seq": seq, "ca": xyz, "date": header.get(
        "_pdbx_database_status.recvd_initial_deposition_date"),
        "resolution": float(header["_refine.ls_d_res_high"])}  # fmt: skip


def parse_a3m(path: Path) -> list[str]:
    seqs = []
    with open(path) as f:
        for line in f:
            if not line.startswith(">") and line.strip():
                seqs.append("".join(c for c in line.strip() if not c.islower()))
    return seqs


class TemplateHitFeaturizer:
    def __init__(self, mmcif_dir: str, max_template_date: str, max_hits: int,
                 release_dates_path: str) -> None:  # fmt: skip
        self.mmcif_dir, self.max_date, self.max_hits = mmcif_dir, max_template_date, max_hits
        with open(release_dates_path) as f:
            self.release_dates = {k: v["release_date"] for k, v in json.load(f).items()}

    def get_templates(self, query: str, hhr: Path) -> torch.Tensor:
        """CA coordinates of the first usable hit, aligned to the query (zeros where none)."""
        out = torch.zeros(len(query), 3)
        for line in hhr.read_text().splitlines()[5:]:
            code = line.split()[1].split("_")[0]
            date = self.release_dates.get(code)
            if date is None:
                logging.warning("Template structure not in release dates dict: %s", code)
                continue
            if date > self.max_date:
                continue
            t = parse_mmcif(os.path.join(self.mmcif_dir, f"{code}.cif"))
            n = min(len(query), len(t["ca"]))
            out[:n] = t["ca"][:n] - t["ca"][:n].mean(0)
            return out
        return out


def onehot(seq: str) -> torch.Tensor:
    idx = torch.tensor([RESTYPES.index(c) if c in RESTYPES else 20 for c in seq])
    return F.one_hot(idx, 21).float()


class OpenFoldSingleDataset(Dataset):
    def __init__(self, data_dir: str, alignment_dir: str, chains: list[str], cfg: dict,
                 templates: TemplateHitFeaturizer, train: bool) -> None:  # fmt: skip
        self.data_dir, self.alignment_dir, self.chains = data_dir, alignment_dir, chains
        self.cfg, self.templates, self.train = cfg, templates, train

    def __len__(self) -> int:
        return len(self.chains)

    def __getitem__(self, idx: int) -> dict:
        name = self.chains[idx]
        file_id, _chain = name.rsplit("_", 1)
        mmcif = parse_mmcif(os.path.join(self.data_dir, f"{file_id}.cif"))
        aln = Path(self.alignment_dir) / name
        msa = []
        for fname in ("uniref90_hits.a3m", "bfd_uniclust_hits.a3m"):
            msa += parse_a3m(aln / fname)
        template_ca = self.templates.get_templates(mmcif["seq"], aln / "pdb70_hits.hhr")
        seq = mmcif["seq"]
        feats = {
            "aatype": onehot(seq),
            "msa": torch.stack([onehot(s[: len(seq)].ljust(len(seq), "-")) for s in msa]),
            "template_ca": template_ca,
            "ca": mmcif["ca"] - mmcif["ca"].mean(0),
        }
        crop = self.cfg["crop_size"]
        n = len(seq)
        if n > crop:
            start = random.Random(idx * 7919 + int(time.time() // 3600)).randint(0, n - crop) \
                if self.train else 0  # fmt: skip
            feats = {k: v[:, start:start + crop] if k == "msa" else v[start:start + crop]
                     for k, v in feats.items()}  # fmt: skip
            n = crop
        mask = torch.ones(n)
        if self.cfg["pad_to_crop"] and n < crop:
            pad = crop - n
            feats = {k: F.pad(v, (0, 0, 0, pad)) for k, v in feats.items()}
            mask = F.pad(mask, (0, pad))
        feats["seq_mask"] = mask
        return feats


class OpenFoldBatchSampler(Sampler):
    """Each rank reads its own part of the filtered chain list (every world-th chain), drops the
    chains that fail deterministic_train_filter, and shuffles the rest every epoch."""

    def __init__(self, chains: list[str], cache: dict, cfg: dict, rank: int, world: int,
                 seed: int) -> None:  # fmt: skip
        self.mine = [i for i in range(rank, len(chains), world)
                     if cache[chains[i]]["resolution"] <= cfg["max_resolution"]]  # fmt: skip
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = list(self.mine)
        random.Random(self.seed + self.epoch).shuffle(order)
        return iter([i] for i in order)

    def __len__(self) -> int:
        return len(self.mine)


def collate(batch: list[dict]) -> dict:
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


class OpenFoldDataModule:
    def __init__(self, config: dict, args: argparse.Namespace) -> None:
        self.config, self.args = config, args

    def setup(self, rank: int, world: int) -> None:
        a, cfg = self.args, self.config
        with open(a.train_chain_data_cache_path) as f:
            cache = json.load(f)
        chains = []
        late = 0
        for name, entry in sorted(cache.items()):
            if entry["resolution"] is None or entry["release_date"] > a.max_template_date:
                late += 1
                continue
            if not os.path.isdir(os.path.join(a.alignment_dir, name)):
                logging.warning(f"{name} has no alignments, skipping")
                continue
            chains.append(name)
        self.cache = cache
        templates = TemplateHitFeaturizer(a.template_mmcif_dir, a.max_template_date,
                                          cfg["max_templates"],
                                          a.template_release_dates_cache_path)  # fmt: skip
        self.train_set = OpenFoldSingleDataset(a.train_data_dir, a.alignment_dir, chains,
                                               cfg, templates, train=True)  # fmt: skip
        self.train_sampler = OpenFoldBatchSampler(chains, cache, cfg, rank, world, a.seed)
        self.val_set = None
        if a.val_data_dir:
            val = sorted(p.name for p in Path(a.val_alignment_dir).iterdir())
            val_cfg = dict(cfg, crop_size=cfg["val_crop_size"], pad_to_crop=True)
            self.val_set = OpenFoldSingleDataset(a.val_data_dir, a.val_alignment_dir,
                                                 val[rank::world], val_cfg, templates, False)  # fmt: skip
        self.n_late = late

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_sampler=self.train_sampler, collate_fn=collate,
                          num_workers=self.config["num_workers"])  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=1, collate_fn=collate, num_workers=0)


# ----------------------------------------------------------------------------------------------
# openfold.model: a tiny Evoformer, a CA structure head, the loss, lDDT
# ----------------------------------------------------------------------------------------------


class EvoformerBlock(nn.Module):
    def __init__(self, c_m: int, c_z: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_m, self.norm_z = nn.LayerNorm(c_m), nn.LayerNorm(c_z)
        self.qkv = nn.Linear(c_m, 3 * c_m, bias=False)
        self.pair_bias = nn.Linear(c_z, heads, bias=False)
        self.out = nn.Linear(c_m, c_m)
        self.msa_transition = nn.Sequential(nn.LayerNorm(c_m), nn.Linear(c_m, 2 * c_m),
                                            nn.ReLU(), nn.Linear(2 * c_m, c_m))  # fmt: skip
        self.opm_a, self.opm_b = nn.Linear(c_m, 4), nn.Linear(c_m, 4)
        self.opm_out = nn.Linear(16, c_z)
        self.pair_transition = nn.Sequential(nn.LayerNorm(c_z), nn.Linear(c_z, 2 * c_z),
                                             nn.ReLU(), nn.Linear(2 * c_z, c_z))  # fmt: skip

    def forward(self, m: torch.Tensor, z: torch.Tensor, mask: torch.Tensor):
        b, s, n, c = m.shape
        q, k, v = self.qkv(self.norm_m(m)).view(b, s, n, 3, self.heads, -1).unbind(3)
        logits = torch.einsum("bsihd,bsjhd->bshij", q, k) / math.sqrt(q.shape[-1])
        logits = logits + self.pair_bias(self.norm_z(z)).permute(0, 3, 1, 2)[:, None]
        logits = logits.masked_fill(mask[:, None, None, None, :] == 0, -1e4)
        att = torch.einsum("bshij,bsjhd->bsihd", logits.softmax(-1), v).reshape(b, s, n, c)
        m = m + self.out(att)
        m = m + self.msa_transition(m)
        a, bb = self.opm_a(m), self.opm_b(m)
        opm = torch.einsum("bsic,bsjd->bijcd", a, bb).reshape(b, n, n, -1) / s
        z = z + self.opm_out(opm)
        return m, z + self.pair_transition(z)


class AlphaFold(nn.Module):
    def __init__(self, c_m: int = 16, c_z: int = 8, blocks: int = 2, bins: int = 16) -> None:
        super().__init__()
        self.msa_embed = nn.Linear(21, c_m)
        self.target_i, self.target_j = nn.Linear(21, c_z), nn.Linear(21, c_z)
        self.relpos = nn.Embedding(65, c_z)
        self.template_embed = nn.Linear(bins, c_z)
        self.blocks = nn.ModuleList(EvoformerBlock(c_m, c_z, 2) for _ in range(blocks))
        self.structure = nn.Sequential(nn.LayerNorm(c_m), nn.Linear(c_m, c_m), nn.ReLU(),
                                       nn.Linear(c_m, 3))  # fmt: skip
        self.distogram = nn.Linear(c_z, bins)
        self.bins = bins

    def forward(self, f: dict) -> dict:
        n = f["aatype"].shape[1]
        m = self.msa_embed(f["msa"]) + self.msa_embed(f["aatype"])[:, None]
        pos = torch.arange(n)
        rel = (pos[None] - pos[:, None]).clamp(-32, 32) + 32
        z = self.target_i(f["aatype"])[:, :, None] + self.target_j(f["aatype"])[:, None]
        z = z + self.relpos(rel)[None]
        tdist = torch.cdist(f["template_ca"], f["template_ca"])
        z = z + self.template_embed(distogram_onehot(tdist, self.bins))
        for block in self.blocks:
            m, z = block(m, z, f["seq_mask"])
        coords = torch.cumsum(self.structure(m[:, 0]), dim=1)
        return {"positions": coords, "distogram_logits": self.distogram(z + z.transpose(1, 2))}


def distogram_onehot(d: torch.Tensor, bins: int) -> torch.Tensor:
    edges = torch.linspace(2.3, 21.7, bins - 1)
    return F.one_hot(torch.bucketize(d, edges), bins).float()


class AlphaFoldLoss(nn.Module):
    def forward(self, out: dict, batch: dict) -> tuple[torch.Tensor, dict]:
        mask = batch["seq_mask"]
        pair = mask[:, :, None] * mask[:, None]
        true_d = torch.cdist(batch["ca"], batch["ca"])
        edges = torch.linspace(2.3, 21.7, out["distogram_logits"].shape[-1] - 1)
        ce = F.cross_entropy(out["distogram_logits"].float().permute(0, 3, 1, 2),
                             torch.bucketize(true_d, edges), reduction="none")  # fmt: skip
        distogram = (ce * pair).sum() / pair.sum()
        pred_d = torch.cdist(out["positions"].float(), out["positions"].float())
        fape = ((pred_d - true_d).abs().clamp(max=10.0) * pair).sum() / pair.sum()
        loss = distogram + fape * 4.0
        return loss, {"distogram": distogram.detach(), "fape": fape.detach()}


def lddt_ca(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-residue lDDT of the CA atoms (cutoff 15 A, thresholds 0.5, 1, 2 and 4 A)."""
    dt, dp = torch.cdist(true, true), torch.cdist(pred, pred)
    pair = (dt < 15.0).float() * mask[:, :, None] * mask[:, None]
    pair = pair * (1 - torch.eye(dt.shape[-1]))
    err = (dt - dp).abs()
    score = sum((err < t).float() for t in (0.5, 1.0, 2.0, 4.0)) / 4
    return ((score * pair).sum(-1) / (pair.sum(-1) + 1e-8))[0]


# ----------------------------------------------------------------------------------------------
# a Lightning-like Trainer: launcher, DDP, loops, callbacks, progress bar
# ----------------------------------------------------------------------------------------------


class SIGTERMException(SystemExit):
    """Raised by the loops once a SIGTERM was received (exits without a traceback)."""


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


def format_num(x: float) -> str:
    n = f"{x:.3g}".replace("+0", "+").replace("-0", "-")
    if "e" not in n and "." not in n and len(n) < 5:
        n += "."
    return n + "0" * (5 - len(n)) if "e" not in n else n


def human(n: int) -> str:
    if n < 1000:
        return f"{n:,d}"
    for unit, div in (("K", 1e3), ("M", 1e6), ("B", 1e9)):
        if n < div * 1000:
            return f"{n / div:,.1f} {unit}"
    return str(n)


def native_attention_core(q: torch.Tensor) -> None:
    """attn_core_inplace (a C++ extension in production): a stale pointer to the softmax buffer."""
    ctypes.string_at(ctypes.c_void_p(0x10), 16)


class Trainer:
    def __init__(self, args: argparse.Namespace, callbacks: list) -> None:
        self.args = args
        self.num_devices, self.num_nodes = args.gpus, args.num_nodes
        self.max_epochs = args.max_epochs
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node_rank = int(os.environ.get("NODE_RANK", 0))
        self.world_size = self.num_devices * self.num_nodes
        self.global_rank = self.node_rank * self.num_devices + self.local_rank
        self.callbacks = callbacks
        self.should_stop = self.received_sigterm = False
        self.current_epoch = self.global_step = 0
        self.procs: list[subprocess.Popen] = []
        self.autocast = args.precision in ("bf16", "bf16-mixed")
        if args.precision == "bf16":
            rank_zero_warn("`precision=bf16` is supported for historical reasons but its usage is "
                           "discouraged. Please set your precision to bf16-mixed instead!")  # fmt: skip
        if self.autocast:
            rank_zero_info("Using bfloat16 Automatic Mixed Precision (AMP)")
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("TPU available: False, using: 0 TPU cores")
        rank_zero_info("HPU available: False, using: 0 HPUs")

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def launch_children(self) -> None:
        """_SubprocessScriptLauncher: the same command line again for each other local rank."""
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if not os.environ.get("MASTER_PORT"):
            s = socket.socket()
            s.bind(("", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
            s.close()
        os.environ["NODE_RANK"] = str(self.node_rank)
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.world_size)
        for local_rank in range(1, self.num_devices):
            env = dict(os.environ, LOCAL_RANK=str(local_rank))
            command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
            self.procs.append(subprocess.Popen(command, env=env, cwd=os.getcwd()))

    def setup_environment(self) -> None:
        RankZero.rank = self.global_rank
        fabric_log.info(f"Initializing distributed: GLOBAL_RANK: {self.global_rank}, MEMBER: "
                        f"{self.global_rank + 1}/{self.world_size}")  # fmt: skip
        dist.init_process_group("gloo", rank=self.global_rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=15))  # fmt: skip
        rank_zero_info(f"{'-' * 100}\ndistributed_backend=gloo\nAll distributed processes "
                       f"registered. Starting with {self.world_size} processes\n{'-' * 100}\n",
                       fabric_log)  # fmt: skip

    def sigterm_handler(self, signum: int, _frame) -> None:
        pl_log.info(rank_prefixed(f"Received SIGTERM: {signum}", self.local_rank))
        if not self.received_sigterm:
            for p in self.procs:
                p.send_signal(signum)
        self.received_sigterm = True

    def fit(self, module: OpenFoldWrapper, datamodule: OpenFoldDataModule,
            ckpt_path: str | None = None) -> None:  # fmt: skip
        try:
            if "LOCAL_RANK" not in os.environ and self.world_size > 1:
                self.launch_children()
            self._run(module, datamodule, ckpt_path)
        except KeyboardInterrupt:
            rank_zero_info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
            for p in self.procs:
                p.send_signal(signal.SIGKILL)
            sys.exit(1)

    def _run(self, module, datamodule, ckpt_path) -> None:
        self.setup_environment()
        signal.signal(signal.SIGTERM, self.sigterm_handler)
        datamodule.setup(self.global_rank, self.world_size)
        self.module = module
        self.model = DDP(module)
        self.optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, eps=1e-5)
        self.log_dir = Path(self.args.output_dir) / "lightning_logs" / "version_0"
        if ckpt_path:
            rank_zero_info(f"Restoring states from the checkpoint path at {ckpt_path}")
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            module.load_state_dict(ckpt["state_dict"])
            self.optimizer.load_state_dict(ckpt["optimizer_states"][0])
            self.current_epoch, self.global_step = ckpt["epoch"] + 1, ckpt["global_step"]
            self.log_dir = Path(self.args.output_dir) / "lightning_logs" / "version_1"
            rank_zero_info(f"Restored all states from the checkpoint at {ckpt_path}")
        self.model_summary(module)
        self.train_loader = datamodule.train_dataloader()
        self.val_loader = datamodule.val_dataloader() if datamodule.val_set is not None else None
        if self.val_loader is not None and not ckpt_path:
            self.validation_loop("Sanity Checking", limit=2)
        self.fit_loop()

    def model_summary(self, module: nn.Module) -> None:
        rows = []
        for i, (name, sub) in enumerate(module.named_children()):
            rows.append([str(i), name, type(sub).__name__,
                         human(sum(p.numel() for p in sub.parameters())), "train"])  # fmt: skip
        cols = list(zip([" ", "Name", "Type", "Params", "Mode"], *rows, strict=True))
        widths = [max(len(x) for x in col) for col in cols]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        width = sum(widths) + 3 * len(widths)
        total = sum(p.numel() for p in module.parameters())
        lines = [fmt.format(*[c[0] for c in cols]), "-" * width, *(fmt.format(*r) for r in rows),
                 "-" * width, f"{human(total):<10}Trainable params", f"{'0':<10}Non-trainable params",
                 f"{human(total):<10}Total params",
                 f"{total * 4 / 1e6:<10,.3f}Total estimated model params size (MB)",
                 f"{sum(1 for _ in module.modules()):<10}Modules in train mode",
                 f"{'0':<10}Modules in eval mode"]  # fmt: skip
        rank_zero_info("\n" + "\n".join("  " + ln if not ln.startswith("-") and ln[0] != " " and
                                        not ln[0].isdigit() else ln for ln in lines))  # fmt: skip

    def sync_metric(self, value: torch.Tensor) -> torch.Tensor:
        """self.log(..., sync_dist=True): the metric summed over the ranks, then averaged."""
        value = value.detach().float().clone()
        dist.all_reduce(value)
        return value / self.world_size

    def fit_loop(self) -> None:
        bar = None
        if self.is_global_zero:
            bar = tqdm(desc="Training", position=0, leave=True, dynamic_ncols=True, file=sys.stdout,
                       smoothing=0, bar_format=BAR_FORMAT)  # fmt: skip
        hoard: list[torch.Tensor] = []
        postfix = {"v_num": "0" if "version_0" in str(self.log_dir) else "1"}
        while self.current_epoch < self.max_epochs and not self.should_stop:
            epoch = self.current_epoch
            self.train_loader.batch_sampler.set_epoch(epoch)
            if bar is not None:
                bar.reset(total=len(self.train_loader))
                bar.set_description(f"Epoch {epoch}")
            self.module.train()
            for batch_idx, batch in enumerate(self.train_loader):
                if LETTER == "m" and self.global_rank == WHO and epoch >= 1:
                    hoard.append(torch.ones(24 << 20))  # 96 MiB of recycled MSA features a step
                    if len(hoard) >= 4:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if LETTER == "v" and self.global_rank == WHO and epoch == 1 and batch_idx == 2:
                    native_attention_core(batch["msa"])
                loss, metrics = self.training_step(batch, batch_idx, epoch)  # noqa: RUF059
                self.global_step += 1
                postfix["train/loss"] = format_num(float(loss))
                if bar is not None:
                    bar.n = batch_idx + 1
                    bar.set_postfix(postfix, refresh=False)
                    bar.refresh()
                if self.received_sigterm:
                    raise SIGTERMException
            if self.val_loader is not None:
                score = self.validation_loop("Validation", bar=bar)
                postfix["val/lddt_ca"] = format_num(score)
                if bar is not None:
                    bar.set_postfix(postfix)
                for cb in self.callbacks:
                    cb.on_validation_end(self, score)
            self.save_checkpoint()
            self.current_epoch += 1
        if self.current_epoch >= self.max_epochs:
            rank_zero_info(f"`Trainer.fit` stopped: `max_epochs={self.max_epochs}` reached.")
        if bar is not None:
            bar.close()

    def training_step(self, batch: dict, batch_idx: int, epoch: int):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(batch)
        loss, parts = self.module.loss(out, batch)
        if LETTER == "c" and self.global_rank == WHO and epoch == 1 and batch_idx == 3:
            # the chi-angle term: the torsions of the crop against the full-length mask
            parts["chi"] = (out["positions"][..., :2] * batch["seq_mask"][:, :-1, None]).sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), 0.1)
        self.optimizer.step()
        with torch.no_grad():
            per_res = lddt_ca(out["positions"].float(), batch["ca"], batch["seq_mask"])
        self.sync_metric(per_res)  # train/lddt_ca, logged on every step
        return loss.detach(), parts

    def validation_loop(self, name: str, bar=None, limit: int | None = None) -> float:
        self.module.eval()
        total = len(self.val_loader) if limit is None else min(limit, len(self.val_loader))
        vbar = None
        if self.is_global_zero:
            vbar = tqdm(desc=name, position=1 if bar is not None else 0, leave=False,
                        dynamic_ncols=True, file=sys.stdout, smoothing=0,
                        bar_format=BAR_FORMAT, total=total)  # fmt: skip
            vbar.set_description(f"{name} DataLoader 0")
        sums = torch.zeros(2)
        preds = []
        with torch.no_grad():
            for i, batch in enumerate(self.val_loader):
                if i >= total:
                    break
                out = self.module(batch)
                lddt = lddt_ca(out["positions"].float(), batch["ca"], batch["seq_mask"])
                n = batch["seq_mask"].sum()
                sums += torch.stack([(lddt * batch["seq_mask"][0]).sum(), n])
                preds.append((out["positions"], batch))
                if vbar is not None:
                    vbar.n = i + 1
                    vbar.refresh()
        if LETTER == "s" and self.global_rank == WHO and name == "Validation" and \
                self.current_epoch == 1:  # fmt: skip
            full_lddt_all_atom(self.module, self.val_loader.dataset)
        sums = self.sync_metric(sums) * self.world_size
        if vbar is not None:
            vbar.close()
        self.module.train()
        return float(sums[0] / sums[1])

    def save_checkpoint(self) -> None:
        if not self.args.checkpoint_every_epoch:
            return
        path = self.log_dir / "checkpoints" / f"epoch={self.current_epoch}-step={self.global_step}.ckpt"  # fmt: skip
        if self.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"epoch": self.current_epoch, "global_step": self.global_step,
                        "state_dict": self.module.state_dict(),
                        "optimizer_states": [self.optimizer.state_dict()]}, path)  # fmt: skip
        dist.barrier()


def full_lddt_all_atom(module: nn.Module, dataset: Dataset) -> None:
    """The all-atom lDDT of every validation chain after superimposition, on the main process
    (a callback the user added; it re-featurizes each chain at full length)."""
    n = 8
    for k in range(1, n + 1):
        logging.warning(f"Computing all-atom LDDT with superimposition for the validation set: "
                        f"chain {k}/{n}")  # fmt: skip
        time.sleep(4)


class EarlyStoppingVerbose:
    """openfold/utils/callbacks.py: Lightning's EarlyStopping, printing only when it stops."""

    def __init__(self, monitor: str, min_delta: float, patience: int, mode: str = "max") -> None:
        self.monitor, self.min_delta, self.patience = monitor, min_delta, patience
        self.best, self.wait = -math.inf, 0

    def on_validation_end(self, trainer: Trainer, score: float) -> None:
        if score - self.min_delta > self.best:
            self.best, self.wait = score, 0
            should_stop = False
        else:
            self.wait += 1
            should_stop = self.wait >= self.patience
        decision = torch.tensor(int(should_stop))
        dist.all_reduce(decision)
        if should_stop:
            rank_zero_info(f"Monitored metric {self.monitor} did not improve in the last "
                           f"{self.wait} records. Best score: {self.best:.3f}. Signaling Trainer "
                           "to stop.\n")  # fmt: skip
        trainer.should_stop = trainer.should_stop or bool(decision.item())


class OpenFoldWrapper(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.model = AlphaFold()
        self.loss = AlphaFoldLoss()

    def forward(self, batch: dict) -> dict:
        return self.model(batch)


# ----------------------------------------------------------------------------------------------
# train_openfold.py
# ----------------------------------------------------------------------------------------------

PRESETS = {
    "initial_training": {"crop_size": 64, "val_crop_size": 96, "pad_to_crop": True,
                         "max_resolution": 9.0, "max_templates": 4, "num_workers": 1},
    "finetuning": {"crop_size": 80, "val_crop_size": 96, "pad_to_crop": True,
                   "max_resolution": 9.0, "max_templates": 4, "num_workers": 1},
}  # fmt: skip


def model_config(preset: str, experiment_config_json: str | None) -> dict:
    config = dict(PRESETS[preset])
    if experiment_config_json:
        with open(experiment_config_json) as f:
            for key, value in json.load(f).items():
                config[key.split(".")[-1]] = value
    return config


def seed_everything(seed: int) -> None:
    log = logging.getLogger("lightning.fabric.utilities.seed")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(logging.StreamHandler(sys.stderr))
    log.info(rank_prefixed(f"Seed set to {seed}", _env_rank()))
    random.seed(seed)
    torch.manual_seed(seed)


def main(args: argparse.Namespace) -> None:
    if args.seed is not None:
        seed_everything(args.seed)
    torch.set_num_threads(1)
    config = model_config(args.config_preset, args.experiment_config_json)
    model_module = OpenFoldWrapper(config)
    args.train_data_dir = args.mmcif_dir
    data_module = OpenFoldDataModule(config=config, args=args)
    callbacks = []
    if args.early_stopping:
        callbacks.append(EarlyStoppingVerbose("val/lddt_ca", args.min_delta, args.patience))
    trainer = Trainer(args, callbacks)
    ckpt_path = None if args.resume_model_weights_only else args.resume_from_ckpt
    trainer.fit(model_module, datamodule=data_module, ckpt_path=ckpt_path)


def bool_type(v: str) -> bool:
    return v.lower() in ("1", "true", "yes")


if __name__ == "__main__":
    if sys.argv[1:] == ["prepare"]:
        prepare(Path("."))
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("mmcif_dir", type=str, help="Directory containing training mmCIF files")
    parser.add_argument("alignment_dir", type=str,
                        help="Directory containing precomputed training alignments")  # fmt: skip
    parser.add_argument("template_mmcif_dir", type=str,
                        help="Directory containing mmCIF files to search for templates")  # fmt: skip
    parser.add_argument("output_dir", type=str,
                        help="Directory in which to output checkpoints, logs, etc.")  # fmt: skip
    parser.add_argument("max_template_date", type=str,
                        help="Cutoff for all templates. In training mode, templates are also "
                        "filtered by the release date of the target")  # fmt: skip
    parser.add_argument("--train_chain_data_cache_path", type=str, default=None)
    parser.add_argument("--template_release_dates_cache_path", type=str, default=None)
    parser.add_argument("--val_data_dir", type=str, default=None)
    parser.add_argument("--val_alignment_dir", type=str, default=None)
    parser.add_argument("--config_preset", type=str, default="initial_training")
    parser.add_argument("--experiment_config_json", type=str, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--num_nodes", type=int, default=1)
    parser.add_argument("--precision", type=str, default="32")
    parser.add_argument("--max_epochs", type=int, default=2)
    parser.add_argument("--checkpoint_every_epoch", action="store_true", default=False)
    parser.add_argument("--resume_from_ckpt", type=str, default=None)
    parser.add_argument("--resume_model_weights_only", type=bool_type, default=False)
    parser.add_argument("--early_stopping", type=bool_type, default=False)
    parser.add_argument("--min_delta", type=float, default=0)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--deepspeed_config_path", type=str, default=None)
    args = parser.parse_args()
    main(args)
