"""The data side of the hundredtwentysecond training-program style (tests/fixtures/real/
hundredtwentysecond-*), copied into each run's folder as pruned_transducer_stateless7/
asr_datamodule.py next to train.py (as icefall's recipes keep a symlink to
tdnn_lstm_ctc/asr_datamodule.py): LibriSpeechAsrDataModule re-created in plain torch and numpy,
without lhotse. A cut manifest is a jsonl.gz of lhotse-like MonoCut records whose features are
numpy files (storage_type numpy_files); CutSet.filter is lazy (its predicate runs again on
every pass, as lhotse's LazyFilter does); DynamicBucketingSampler buckets the cuts by duration,
packs batches up to max_duration, shuffles them with seed + epoch and deals them round-robin to
the ranks of the process group (drop_last drops the last incomplete round);
K2SpeechRecognitionDataset loads and pads the features of a batch of cuts in the DataLoader's
worker (batch_size=None: the sampler yields the batches). Nothing here reads TQ_CASE.
"""
# ruff: noqa: UP006, UP035, UP011, UP045, RUF005 (icefall's own typing, as it is written)

import argparse
import gzip
import json
import logging
import random
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

LOG_EPSILON = -23.0259  # lhotse pads features with log(1e-10)


def str2bool(v):
    """Used in argparse.ArgumentParser.add_argument to indicate that a type is a bool type and
    user can enter yes, true, y, 1 to represent True, no, false, n, 0 to represent False."""
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    elif v.lower() in ("no", "false", "f", "n", "0"):
        return False
    else:
        raise argparse.ArgumentTypeError("Boolean value expected.")


class Cut(dict):
    """A MonoCut record of the manifest, its fields as attributes."""

    @property
    def id(self) -> str:
        return self["id"]

    @property
    def duration(self) -> float:
        return self["duration"]

    @property
    def num_frames(self) -> int:
        return self["features"]["num_frames"]

    @property
    def supervisions(self) -> List[Any]:
        return [argparse.Namespace(**s) for s in self["supervisions"]]

    def load_features(self) -> np.ndarray:
        f = self["features"]
        return np.load(Path(f["storage_path"]) / f["storage_key"])


class CutSet:
    """A lazily read manifest: every pass opens the file again and applies the filters."""

    def __init__(self, path: Path, filters: Optional[List[Callable]] = None) -> None:
        self.path = path
        self.filters = filters or []

    def filter(self, predicate: Callable[[Cut], bool]) -> "CutSet":
        return CutSet(self.path, self.filters + [predicate])

    def __iter__(self):
        with gzip.open(self.path, "rt") as f:
            for line in f:
                cut = Cut(json.loads(line))
                if all(p(cut) for p in self.filters):
                    yield cut

    def __add__(self, other: "CutSet") -> "CutSetChain":
        return CutSetChain([self, other])


class CutSetChain(CutSet):
    def __init__(self, parts: List[CutSet]) -> None:
        self.parts = parts
        self.filters = []

    def filter(self, predicate):
        return CutSetChain([p.filter(predicate) for p in self.parts])

    def __iter__(self):
        for p in self.parts:
            yield from p


def load_manifest_lazy(path: Path) -> CutSet:
    return CutSet(Path(path))


class DynamicBucketingSampler(Sampler):
    """Batches of cuts of similar duration, up to max_duration seconds each, dealt to the ranks
    round-robin (world_size and rank from the process group, as lhotse reads them)."""

    def __init__(
        self,
        cuts: CutSet,
        max_duration: float,
        shuffle: bool = False,
        num_buckets: int = 10,
        drop_last: bool = False,
        seed: int = 0,
        world_size: Optional[int] = None,
        rank: Optional[int] = None,
    ) -> None:
        self.cuts = cuts
        self.max_duration = max_duration
        self.shuffle = shuffle
        self.num_buckets = num_buckets
        self.drop_last = drop_last
        self.seed = seed
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = world_size
        self.rank = rank
        self.epoch = 0
        self.diagnostics = {"num_kept_batches": 0}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> Dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "max_duration": self.max_duration,
            "drop_last": self.drop_last,
            "world_size": self.world_size,
            "rank": self.rank,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.epoch = state["epoch"]

    def _all_batches(self) -> List[List[Cut]]:
        cuts = list(self.cuts)
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(cuts)
        durations = sorted(c.duration for c in cuts)
        edges = [
            durations[len(durations) * k // self.num_buckets] for k in range(1, self.num_buckets)
        ]
        buckets: List[List[Cut]] = [[] for _ in range(self.num_buckets)]
        for c in cuts:
            buckets[sum(c.duration >= e for e in edges)].append(c)
        batches = []
        for bucket in buckets:
            cur, total = [], 0.0
            for c in bucket:
                if cur and total + c.duration > self.max_duration:
                    batches.append(cur)
                    cur, total = [], 0.0
                cur.append(c)
                total += c.duration
            if cur:
                batches.append(cur)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self):
        batches = self._all_batches()
        if self.drop_last:
            batches = batches[: len(batches) - len(batches) % self.world_size]
        mine = batches[self.rank :: self.world_size]
        self.diagnostics["num_kept_batches"] += len(mine)
        return iter(mine)


def find_pessimistic_batches(sampler: DynamicBucketingSampler):
    """The batches of this rank's first epoch most likely to run out of memory."""
    batches = list(sampler)
    crit = {
        "single_longest_cut": lambda b: max(c.duration for c in b),
        "single_largest_batch": lambda b: sum(c.duration for c in b),
    }
    top = {name: max(batches, key=f) for name, f in crit.items()}
    values = {name: crit[name](top[name]) for name in crit}
    return top, values


class SpecAugment:
    def __init__(self, time_warp_factor: int = 80, num_frame_masks: int = 2, frames_mask_size=10,
                 features_mask_size=4, num_feature_masks=2) -> None:  # fmt: skip
        self.time_warp_factor = time_warp_factor
        self.num_frame_masks = num_frame_masks
        self.frames_mask_size = frames_mask_size
        self.features_mask_size = features_mask_size
        self.num_feature_masks = num_feature_masks

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        features = features.clone()
        for seq in features:
            mean = seq.mean()
            for _ in range(self.num_feature_masks):
                f0 = random.randrange(max(1, seq.size(1) - self.features_mask_size))
                seq[:, f0 : f0 + random.randint(0, self.features_mask_size)] = mean
            for _ in range(self.num_frame_masks):
                t0 = random.randrange(max(1, seq.size(0) - self.frames_mask_size))
                seq[t0 : t0 + random.randint(0, self.frames_mask_size)] = mean
        return features


class K2SpeechRecognitionDataset(Dataset):
    """A batch of cuts (from the sampler) -> padded features and the supervisions."""

    def __init__(self, input_transforms=None, return_cuts: bool = False) -> None:
        self.input_transforms = input_transforms or []
        self.return_cuts = return_cuts

    def __getitem__(self, cuts: List[Cut]) -> Dict[str, Any]:
        cuts = sorted(cuts, key=lambda c: c.duration, reverse=True)
        feats = [torch.from_numpy(c.load_features()) for c in cuts]
        lens = [f.size(0) for f in feats]
        inputs = torch.full((len(feats), max(lens), feats[0].size(1)), LOG_EPSILON)
        for k, f in enumerate(feats):
            inputs[k, : f.size(0)] = f
        for tfnm in self.input_transforms:
            inputs = tfnm(inputs)
        batch = {
            "inputs": inputs,
            "supervisions": {
                "sequence_idx": torch.arange(len(cuts)),
                "text": [c["supervisions"][0]["text"] for c in cuts],
                "start_frame": torch.zeros(len(cuts), dtype=torch.int32),
                "num_frames": torch.tensor(lens, dtype=torch.int32),
            },
        }
        if self.return_cuts:
            batch["supervisions"]["cut"] = cuts
        return batch


class _SeedWorkers:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, worker_id: int) -> None:
        random.seed(self.seed + worker_id)
        torch.manual_seed(self.seed + worker_id)
        np.random.seed(self.seed + worker_id)


class LibriSpeechAsrDataModule:
    """DataModule for k2 ASR experiments. It assumes there is always one train and valid
    dataloader, but there can be multiple test dataloaders (e.g. LibriSpeech test-clean and
    test-other)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(
            title="ASR data related options",
            description="These options are used for the preparation of PyTorch DataLoaders "
            "from Lhotse CutSet's -- they control the effective batch sizes, sampling "
            "strategies, applied data augmentations, etc.",
        )
        group.add_argument(
            "--full-libri",
            type=str2bool,
            default=True,
            help="When enabled, use 960h LibriSpeech. Otherwise, use 100h subset.",
        )
        group.add_argument(
            "--manifest-dir",
            type=Path,
            default=Path("data/fbank"),
            help="Path to directory with train/valid/test cuts.",
        )
        group.add_argument(
            "--max-duration",
            type=int,
            default=200,
            help="Maximum pooled recordings duration (seconds) in a single batch. You can "
            "reduce it if it causes CUDA OOM.",
        )
        group.add_argument(
            "--bucketing-sampler",
            type=str2bool,
            default=True,
            help="When enabled, the batches will come from buckets of similar duration "
            "(saves padding frames).",
        )
        group.add_argument(
            "--num-buckets",
            type=int,
            default=4,
            help="The number of buckets for the DynamicBucketingSampler"
            "(you might want to increase it for larger datasets).",
        )
        group.add_argument(
            "--shuffle",
            type=str2bool,
            default=True,
            help="When enabled (=default), the examples will be shuffled for each epoch.",
        )
        group.add_argument(
            "--drop-last",
            type=str2bool,
            default=True,
            help="Whether to drop last batch. Used by sampler.",
        )
        group.add_argument(
            "--return-cuts",
            type=str2bool,
            default=True,
            help="When enabled, each batch will have the field: batch['supervisions']['cut'] "
            "with the cuts that were used to construct it.",
        )
        group.add_argument(
            "--num-workers",
            type=int,
            default=2,
            help="The number of training dataloader workers that collect the batches.",
        )
        group.add_argument(
            "--enable-spec-aug",
            type=str2bool,
            default=True,
            help="When enabled, use SpecAugment for training dataset.",
        )
        group.add_argument(
            "--spec-aug-time-warp-factor",
            type=int,
            default=80,
            help="Used only when --enable-spec-aug is True. It specifies the factor for time "
            "warping in SpecAugment. Larger values mean more warping. A value less than 1 "
            "means to disable time warp.",
        )
        group.add_argument(
            "--enable-musan",
            type=str2bool,
            default=False,
            help="When enabled, select noise from MUSAN and mix it with training dataset. "
            "(this CPU port has no MUSAN cuts: off by default)",
        )

    def train_dataloaders(
        self, cuts_train: CutSet, sampler_state_dict: Optional[Dict[str, Any]] = None
    ) -> DataLoader:
        if self.args.enable_musan:
            logging.info("Enable MUSAN")
            logging.info("About to get Musan cuts")
            load_manifest_lazy(self.args.manifest_dir / "musan_cuts.jsonl.gz")
        else:
            logging.info("Disable MUSAN")

        input_transforms = []
        if self.args.enable_spec_aug:
            logging.info("Enable SpecAugment")
            logging.info(f"Time warp factor: {self.args.spec_aug_time_warp_factor}")
            num_frame_masks = 2
            logging.info(f"Num frame mask: {num_frame_masks}")
            input_transforms.append(
                SpecAugment(
                    time_warp_factor=self.args.spec_aug_time_warp_factor,
                    num_frame_masks=num_frame_masks,
                )
            )
        else:
            logging.info("Disable SpecAugment")

        logging.info("About to create train dataset")
        train = K2SpeechRecognitionDataset(
            input_transforms=input_transforms, return_cuts=self.args.return_cuts
        )

        if self.args.bucketing_sampler:
            logging.info("Using DynamicBucketingSampler.")
            train_sampler = DynamicBucketingSampler(
                cuts_train,
                max_duration=self.args.max_duration,
                shuffle=self.args.shuffle,
                num_buckets=self.args.num_buckets,
                drop_last=self.args.drop_last,
            )
        else:
            logging.info("Using SimpleCutSampler.")
            train_sampler = DynamicBucketingSampler(
                cuts_train, max_duration=self.args.max_duration, shuffle=self.args.shuffle,
                num_buckets=1, drop_last=self.args.drop_last,
            )  # fmt: skip
        logging.info("About to create train dataloader")

        if sampler_state_dict is not None:
            logging.info("Loading sampler state dict")
            train_sampler.load_state_dict(sampler_state_dict)

        # 'seed' is derived from the current random state, which will have previously been
        # set in the main process.
        seed = torch.randint(0, 100000, ()).item()
        worker_init_fn = _SeedWorkers(seed)

        train_dl = DataLoader(
            train,
            sampler=train_sampler,
            batch_size=None,
            num_workers=self.args.num_workers,
            persistent_workers=False,
            worker_init_fn=worker_init_fn,
        )
        return train_dl

    def valid_dataloaders(self, cuts_valid: CutSet) -> DataLoader:
        logging.info("About to create dev dataset")
        validate = K2SpeechRecognitionDataset(return_cuts=self.args.return_cuts)
        valid_sampler = DynamicBucketingSampler(
            cuts_valid, max_duration=self.args.max_duration, shuffle=False
        )
        logging.info("About to create dev dataloader")
        valid_dl = DataLoader(
            validate,
            sampler=valid_sampler,
            batch_size=None,
            num_workers=2,
            persistent_workers=False,
        )
        return valid_dl

    @lru_cache()  # noqa: B019
    def train_clean_100_cuts(self) -> CutSet:
        logging.info("About to get train-clean-100 cuts")
        return load_manifest_lazy(self.args.manifest_dir / "librispeech_cuts_train-clean-100.jsonl.gz")  # fmt: skip

    @lru_cache()  # noqa: B019
    def train_clean_360_cuts(self) -> CutSet:
        logging.info("About to get train-clean-360 cuts")
        return load_manifest_lazy(self.args.manifest_dir / "librispeech_cuts_train-clean-360.jsonl.gz")  # fmt: skip

    @lru_cache()  # noqa: B019
    def dev_clean_cuts(self) -> CutSet:
        logging.info("About to get dev-clean cuts")
        return load_manifest_lazy(self.args.manifest_dir / "librispeech_cuts_dev-clean.jsonl.gz")  # fmt: skip

    @lru_cache()  # noqa: B019
    def dev_other_cuts(self) -> CutSet:
        logging.info("About to get dev-other cuts")
        return load_manifest_lazy(self.args.manifest_dir / "librispeech_cuts_dev-other.jsonl.gz")  # fmt: skip
