"""A hundred-and-twenty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentyfifth-*): robot-learning policy training in the way of
huggingface/lerobot's lerobot/scripts/train.py (`accelerate launch --multi_gpu --num_processes=2
lerobot/scripts/train.py --policy.type=act --dataset.repo_id=lerobot/aloha_sim_insertion_human
--env.type=aloha --batch_size=8 --steps=100 --log_freq=10 --save_freq=50 --eval_freq=50
--output_dir=outputs/train/act_aloha`), re-created in plain torch (lerobot, accelerate, draccus,
gymnasium and MuJoCo are not used; numpy and tqdm are). Linked into each run's folder as
lerobot/scripts/train.py and started through a re-created accelerate launch
(tests/programs/hundredtwentyfifth_accelerate.py).

What it keeps of lerobot: draccus-style dotted flags into nested config dataclasses
(TrainPipelineConfig with dataset, env, policy, eval; ACTConfig's own __post_init__ checks), the
config dict pretty-printed at the start, lerobot's init_logging format ('INFO 2026-12-06 18:00:00
ts/train.py:111 message'; non-main processes log WARNING and above only), the 'Creating dataset'
... 'Start offline training on a fixed dataset' records, MetricsTracker's step line ('step:10
smpl:160 ep:3 epch:0.07 loss:5.123 grdn:120.456 lr:1.0e-05 updt_s:0.400 data_s:0.010'), the
checkpoints/<step>/pretrained_model layout with checkpoints/last, the main process's
eval_policy rollouts in a simulated env with tqdm bars, and a LeRobotDataset v2.1 layout
(meta/info.json with codebase_version and fps, meta/episodes.jsonl, meta/stats.json, per-episode
data files loaded at start, per-episode frame arrays read lazily in __getitem__, the
delta_timestamps of the action chunk checked against the episode's timestamps with tolerance_s).
The policy is a tiny ACT (a conv backbone, a VAE encoder over the action chunk, a transformer
encoder-decoder predicting chunk_size actions) under DDP, gloo on CPU, a 15 s process-group
timeout. A validation loss over held-out episodes (--dataset.val_episodes, split across the ranks
by episode) is the user's addition. `--prepare DIR` writes the synthetic dataset. A fault in the
code is chosen by the TQ_CASE environment variable and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentyfifth.sh after any edit).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import math
import os
import queue
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from pprint import pformat

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm import tqdm, trange

# TQ_CASE -> what goes wrong in the code: a1 rank 1 skips the current action in its loss at step
# 23; k1 rank 1's decoded-frame cache grows 64 MiB a step from step 30 (SIGKILL, as the OOM
# killer would); s1 rank 1's frame decoder fast path reads address 0 at step 37; q1 rank 1 waits
# at step 40 for the frame prefetch thread that was never started; r0 the main process alone
# averages the grad norm it logs over the ranks
CASE = os.environ.get("TQ_CASE", "")

CODEBASE_VERSION = "v2.1"
STATE_DIM = 14
IMAGE_SIZE = 32
IMAGE_KEY = "observation.images.top"

V2_MESSAGE = """
The dataset you requested ({repo_id}) is in {version} format.

We introduced a new format since v2.0 which is not backward compatible with v1.x.
Please, use our conversion script. Modify the following command with your own task description:
```
python lerobot/common/datasets/v2/convert_dataset_v1_to_v2.py \\
    --repo-id {repo_id} \\
    --single-task "TASK DESCRIPTION."  # <---- /!\\ Replace TASK DESCRIPTION /!\\
```

A few examples to replace TASK DESCRIPTION: "Pick up the blue cube and place it into the bin.",
"Insert the peg into the socket.", "Slide open the ziploc bag.", "Take the elevator to the 1st
floor.", "Open the top cabinet, store the pot inside it then close the cabinet.", "Push the
T-shaped block onto the T-shaped target.", "Grab the spray paint on the shelf and place it in the
bin on top of the robot dog.", "Fold the sweatshirt.", ...

If you encounter a problem, contact LeRobot maintainers on [Discord](https://discord.com/invite/s3KuuzsPFb)
or open an [issue on GitHub](https://github.com/huggingface/lerobot/issues/new/choose).
"""

V21_MESSAGE = """
The dataset you requested ({repo_id}) is in {version} format.
While current version of LeRobot is backward-compatible with it, the version of your dataset still uses global
stats instead of per-episode stats. Update your dataset stats to the new format using this command:
```
python lerobot/common/datasets/v21/convert_dataset_v20_to_v21.py --repo-id={repo_id}
```

If you encounter a problem, contact LeRobot maintainers on [Discord](https://discord.com/invite/s3KuuzsPFb)
or open an [issue on GitHub](https://github.com/huggingface/lerobot/issues/new/choose).
"""


class CompatibilityError(Exception):
    pass


class BackwardCompatibilityError(CompatibilityError):
    def __init__(self, repo_id: str, version: str) -> None:
        super().__init__(V2_MESSAGE.format(repo_id=repo_id, version=version))


# ---------------------------------------------------------------- configs (draccus-like)


@dataclass
class DatasetConfig:
    repo_id: str = ""
    root: str | None = None
    episodes: list[int] | None = None
    val_episodes: list[int] | None = None
    video_backend: str = "pyav"
    use_imagenet_stats: bool = True


@dataclass
class AlohaEnv:
    type: str = "aloha"
    task: str = "AlohaInsertion-v0"
    fps: int = 50
    episode_length: int = 400
    obs_type: str = "pixels_agents_pos"
    render_mode: str = "rgb_array"


@dataclass
class ACTConfig:
    type: str = "act"
    n_obs_steps: int = 1
    chunk_size: int = 100
    n_action_steps: int = 100
    normalization_mapping: dict = field(
        default_factory=lambda: {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    vision_backbone: str = "resnet18"
    pretrained_backbone_weights: str | None = None
    replace_final_stride_with_dilation: int = False
    pre_norm: bool = False
    dim_model: int = 32
    n_heads: int = 4
    dim_feedforward: int = 64
    feedforward_activation: str = "relu"
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    use_vae: bool = True
    latent_dim: int = 8
    n_vae_encoder_layers: int = 1
    temporal_ensemble_coeff: float | None = None
    dropout: float = 0.1
    kl_weight: float = 10.0
    optimizer_lr: float = 1e-5
    optimizer_weight_decay: float = 1e-4
    optimizer_lr_backbone: float = 1e-5
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.vision_backbone.startswith("resnet"):
            raise ValueError(
                f"`vision_backbone` must be one of the ResNet variants. Got {self.vision_backbone}."
            )
        if self.temporal_ensemble_coeff is not None and self.n_action_steps > 1:
            raise NotImplementedError(
                "`n_action_steps` must be 1 when using temporal ensembling. This is "
                "because the policy needs to be queried every step to compute the ensembled action."
            )
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"The chunk size is the upper bound for the number of action steps per model invocation. Got "
                f"{self.n_action_steps} for `n_action_steps` and {self.chunk_size} for `chunk_size`."
            )
        if self.n_obs_steps != 1:
            raise ValueError(
                f"Multiple observation steps not handled yet. Got `nobs_steps={self.n_obs_steps}`"
            )


@dataclass
class EvalConfig:
    n_episodes: int = 50
    batch_size: int = 50
    use_async_envs: bool = False


@dataclass
class WandBConfig:
    enable: bool = False
    project: str = "lerobot"
    mode: str | None = None


@dataclass
class TrainPipelineConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    env: AlohaEnv | None = None
    policy: ACTConfig | None = None
    output_dir: str | None = None
    job_name: str | None = None
    resume: bool = False
    seed: int | None = 1000
    num_workers: int = 2
    batch_size: int = 8
    steps: int = 100_000
    eval_freq: int = 20_000
    log_freq: int = 200
    save_checkpoint: bool = True
    save_freq: int = 20_000
    val_freq: int = 0
    use_policy_training_preset: bool = True
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandBConfig = field(default_factory=WandBConfig)

    def validate(self) -> None:
        if self.policy is None:
            raise ValueError(
                "Policy is not configured. Please specify a pretrained policy with `--policy.path`."
            )
        if not self.job_name:
            self.job_name = f"{self.env.type}_{self.policy.type}" if self.env else self.policy.type
        if not self.resume and self.output_dir and Path(self.output_dir).is_dir():
            raise FileExistsError(
                f"Output directory {self.output_dir} already exists and resume is {self.resume}. "
                f"Please change your output directory so that {self.output_dir} is not overwritten."
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CHOICES = {"policy": {"act": ACTConfig}, "env": {"aloha": AlohaEnv}}


def _convert(text: str, kind: str) -> object:
    if "bool" in kind and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text in ("null", "None") and "None" in kind:
        return None
    if kind.startswith("list") or (kind.startswith("dict") and text.startswith("{")):
        return json.loads(text)
    for name, cast in (("int", int), ("float", float)):
        if kind.startswith(name) or f"{name} |" in kind:
            return cast(text)
    return text


def parse_config(argv: list[str]) -> TrainPipelineConfig:
    """--a.b=value flags into the nested dataclasses; a choice (policy.type, env.type) first."""
    pairs = []
    for arg in argv:
        key, _, value = arg.removeprefix("--").partition("=")
        pairs.append((key.split("."), value))
    subs: dict[str, dict[str, object]] = {"policy": {}, "env": {}}
    top: dict[str, object] = {}
    nested: dict[str, dict[str, object]] = {"dataset": {}, "eval": {}, "wandb": {}}
    kinds = {f.name: str(f.type) for f in dataclasses.fields(TrainPipelineConfig)}
    for path, value in pairs:
        if path[0] in subs:
            subs[path[0]][path[1]] = value
        elif path[0] in nested:
            cls = {"dataset": DatasetConfig, "eval": EvalConfig, "wandb": WandBConfig}[path[0]]
            ftype = {f.name: str(f.type) for f in dataclasses.fields(cls)}[path[1]]
            nested[path[0]][path[1]] = _convert(value, ftype)
        else:
            top[path[0]] = _convert(value, kinds[path[0]])
    built: dict[str, object] = dict(top)
    for name, cls in (("dataset", DatasetConfig), ("eval", EvalConfig), ("wandb", WandBConfig)):
        built[name] = cls(**nested[name])
    for name, given in subs.items():
        if not given:
            continue
        cls = CHOICES[name][str(given.pop("type"))]
        ftype = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        built[name] = cls(**{k: _convert(str(v), ftype[k]) for k, v in given.items()})
    return TrainPipelineConfig(**built)


# ---------------------------------------------------------------- logging and metrics


def init_logging(is_main_process: bool, process_index: int) -> None:
    def custom_format(record: logging.LogRecord) -> str:
        dt = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        fnameline = f"{record.pathname}:{record.lineno}"
        return f"{record.levelname} {dt} {fnameline[-15:]:>15} {record.getMessage()}"

    logging.basicConfig(level=logging.INFO)
    for handler in logging.root.handlers[:]:
        logging.root.removeHandler(handler)
    formatter = logging.Formatter()
    formatter.format = custom_format
    console_handler = logging.StreamHandler()
    console_handler.setFormatter(formatter)
    logging.getLogger().addHandler(console_handler)
    if not is_main_process:
        logging.info(f"Setting logging level on non-main process {process_index} to WARNING.")
        logging.getLogger().setLevel(logging.WARNING)


def format_big_number(num: float, precision: int = 0) -> str:
    suffixes = ["", "K", "M", "B", "T", "Q"]
    divisor = 1000.0
    for suffix in suffixes:
        if abs(num) < divisor:
            return f"{num:.{precision}f}{suffix}"
        num /= divisor
    return str(num)


class AverageMeter:
    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        return ("{name}:{avg" + self.fmt + "}").format(**self.__dict__)


class MetricsTracker:
    """lerobot's step line: samples, episodes and epochs seen by all processes together."""

    def __init__(
        self,
        batch_size: int,
        num_frames: int,
        num_episodes: int,
        metrics: dict,
        initial_step: int = 0,
    ) -> None:
        self.__dict__["_batch_size"] = batch_size
        self.__dict__["_num_frames"] = num_frames
        self.__dict__["_avg_samples_per_ep"] = num_frames / num_episodes
        self.__dict__["metrics"] = metrics
        self.__dict__["steps"] = initial_step
        self.__dict__["samples"] = initial_step * batch_size
        self.__dict__["episodes"] = self.samples / self._avg_samples_per_ep
        self.__dict__["epochs"] = self.samples / self._num_frames

    def __getattr__(self, name: str) -> object:
        return self.__dict__["metrics"][name]

    def __setattr__(self, name: str, value: float) -> None:
        if name in self.__dict__:
            super().__setattr__(name, value)
        else:
            self.metrics[name].update(value)

    def step(self) -> None:
        self.__dict__["steps"] += 1
        self.__dict__["samples"] += self._batch_size
        self.__dict__["episodes"] = self.samples / self._avg_samples_per_ep
        self.__dict__["epochs"] = self.samples / self._num_frames

    def __str__(self) -> str:
        display = [
            f"step:{format_big_number(self.steps)}",
            f"smpl:{format_big_number(self.samples)}",
            f"ep:{format_big_number(self.episodes)}",
            f"epch:{self.epochs:.2f}",
            *[str(m) for m in self.metrics.values()],
        ]
        return " ".join(display)

    def reset_averages(self) -> None:
        for m in self.metrics.values():
            m.reset()


# ---------------------------------------------------------------- the accelerator (accelerate-like)


class Accelerator:
    """What lerobot's train.py uses of accelerate's Accelerator, on gloo: the process group from
    the launcher's environment (InitProcessGroupKwargs(timeout=15 s)), DDP, wait_for_everyone."""

    def __init__(self, timeout_s: float = 15.0) -> None:
        self.num_processes = int(os.environ.get("WORLD_SIZE", "1"))
        self.process_index = int(os.environ.get("RANK", "0"))
        self.local_process_index = int(os.environ.get("LOCAL_RANK", "0"))
        self.is_main_process = self.process_index == 0
        if self.num_processes > 1:
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        self.device = torch.device("cpu")

    def prepare_model(self, model: nn.Module) -> nn.Module:
        if self.num_processes > 1:
            return DDP(model)
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DDP) else model

    def reduce(self, tensor: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        tensor = tensor.clone()
        if self.num_processes > 1:
            dist.all_reduce(tensor)
            if reduction == "mean":
                tensor /= self.num_processes
        return tensor

    def wait_for_everyone(self) -> None:
        if self.num_processes > 1:
            dist.barrier()

    def end_training(self) -> None:
        if self.num_processes > 1:
            dist.destroy_process_group()


# ---------------------------------------------------------------- the dataset (LeRobotDataset v2.1)


def lerobot_home() -> Path:
    return Path(os.environ.get("HF_LEROBOT_HOME", Path.home() / ".cache/huggingface/lerobot"))


def check_delta_timestamps(
    delta_timestamps: dict[str, list[float]],
    fps: int,
    tolerance_s: float,
    raise_value_error: bool = True,
) -> bool:
    outside_tolerance = {}
    for key, delta_ts in delta_timestamps.items():
        within_tolerance = [abs(ts * fps - round(ts * fps)) / fps <= tolerance_s for ts in delta_ts]
        if not all(within_tolerance):
            outside_tolerance[key] = [
                round(ts, 4)
                for ts, is_within in zip(delta_ts, within_tolerance, strict=True)
                if not is_within
            ]
    if len(outside_tolerance) > 0:
        if raise_value_error:
            raise ValueError(
                f"""
                The following delta_timestamps are found outside of tolerance range.
                Please make sure they are multiples of 1/{fps} +/- tolerance and adjust
                their values accordingly.
                \n{pformat(outside_tolerance)}
                """
            )
        return False
    return True


class LeRobotDatasetMetadata:
    def __init__(self, repo_id: str, root: str | None = None) -> None:
        self.repo_id = repo_id
        self.root = Path(root) if root else lerobot_home() / repo_id
        self.info = json.loads((self.root / "meta/info.json").read_text())
        version = self.info["codebase_version"]
        v_check, v_current = version.lstrip("v").split("."), CODEBASE_VERSION.lstrip("v").split(".")
        if int(v_check[0]) < int(v_current[0]):
            raise BackwardCompatibilityError(repo_id, version)
        if int(v_check[1]) < int(v_current[1]):
            logging.warning(V21_MESSAGE.format(repo_id=repo_id, version=version))
        with open(self.root / "meta/episodes.jsonl") as f:
            self.episodes = {e["episode_index"]: e for e in map(json.loads, f)}
        self.stats = {
            k: {s: torch.tensor(v) for s, v in d.items()}
            for k, d in json.loads((self.root / "meta/stats.json").read_text()).items()
        }

    @property
    def fps(self) -> int:
        return self.info["fps"]

    def get_data_file_path(self, ep_index: int) -> Path:
        return self.root / self.info["data_path"].format(episode_chunk=0, episode_index=ep_index)

    def get_video_file_path(self, ep_index: int, key: str) -> Path:
        return self.root / self.info["video_path"].format(
            episode_chunk=0, video_key=key, episode_index=ep_index
        )


class LeRobotDataset(Dataset):
    def __init__(
        self,
        repo_id: str,
        root: str | None = None,
        episodes: list[int] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        tolerance_s: float = 1e-4,
    ) -> None:
        self.repo_id = repo_id
        self.meta = LeRobotDatasetMetadata(repo_id, root)
        self.episodes = episodes if episodes is not None else sorted(self.meta.episodes)
        self.tolerance_s = tolerance_s
        self.delta_timestamps = delta_timestamps or {}
        check_delta_timestamps(self.delta_timestamps, self.meta.fps, tolerance_s)
        self.delta_indices = {
            k: [round(d * self.meta.fps) for d in v] for k, v in self.delta_timestamps.items()
        }
        # the per-episode data files (parquet in lerobot), all loaded at the start
        self.data = {ep: dict(np.load(self.meta.get_data_file_path(ep))) for ep in self.episodes}
        self.items = [(ep, i) for ep in self.episodes for i in range(len(self.data[ep]["index"]))]

    @property
    def num_frames(self) -> int:
        return len(self.items)

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def fps(self) -> int:
        return self.meta.fps

    def __len__(self) -> int:
        return len(self.items)

    def _query(self, ep: int, frame: int) -> dict[str, torch.Tensor]:
        rows = self.data[ep]
        n = len(rows["index"])
        out: dict[str, torch.Tensor] = {}
        for key, deltas in self.delta_indices.items():
            idx = [max(0, min(n - 1, frame + d)) for d in deltas]
            # the timestamps found must lie at the requested deltas (the episode's own clock)
            found = [float(rows["timestamp"][i] - rows["timestamp"][frame]) for i in idx]
            pad = [frame + d >= n for d in deltas]
            wanted = [d for d, p in zip(found, pad, strict=True) if not p]
            drift = [abs(w - d / self.fps) for w, d in zip(wanted, deltas, strict=False)]
            if drift and max(drift) > self.tolerance_s:
                try:
                    check_delta_timestamps({key: wanted}, self.fps, self.tolerance_s)
                except ValueError as e:
                    stamps = [round(float(t), 4) for t in rows["timestamp"][:6]]
                    e.add_note(f"episode_index={ep} timestamps={stamps} ... (fps={self.fps})")
                    raise
            out[key] = torch.from_numpy(rows[key][idx])
            out[f"{key}_is_pad"] = torch.tensor(pad)
        return out

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ep, frame = self.items[i]
        rows = self.data[ep]
        item = {
            "observation.state": torch.from_numpy(rows["observation.state"][frame]),
            "timestamp": torch.tensor(rows["timestamp"][frame]),
            "episode_index": torch.tensor(ep),
            "index": torch.tensor(rows["index"][frame]),
        }
        item.update(self._query(ep, frame))
        # the episode's video, decoded when an item is asked for (frame arrays here)
        frames = np.load(self.meta.get_video_file_path(ep, IMAGE_KEY), mmap_mode="r")
        item[IMAGE_KEY] = torch.from_numpy(np.array(frames[frame])).float() / 255.0
        return item


def make_dataset(cfg: TrainPipelineConfig, episodes: list[int] | None = None) -> LeRobotDataset:
    ds_meta = LeRobotDatasetMetadata(cfg.dataset.repo_id, cfg.dataset.root)
    delta_timestamps = {"action": [i / ds_meta.fps for i in range(cfg.policy.chunk_size)]}
    if episodes is None:
        meta_eps = sorted(ds_meta.episodes)
        held = set(cfg.dataset.val_episodes or [])
        episodes = cfg.dataset.episodes or [e for e in meta_eps if e not in held]
    return LeRobotDataset(cfg.dataset.repo_id, cfg.dataset.root, episodes, delta_timestamps)


def cycle(iterable):
    iterator = iter(iterable)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            iterator = iter(iterable)


# ---------------------------------------------------------------- the policy (ACT)


class ACT(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.config = config
        d = config.dim_model
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, d, 3, stride=2, padding=1),
        )
        self.vae_encoder_cls_embed = nn.Embedding(1, d)
        self.vae_encoder_robot_state_input_proj = nn.Linear(STATE_DIM, d)
        self.vae_encoder_action_input_proj = nn.Linear(STATE_DIM, d)
        self.vae_encoder_pos = nn.Parameter(torch.randn(1, 2 + config.chunk_size, d) * 0.02)

        def layer() -> nn.TransformerEncoderLayer:
            return nn.TransformerEncoderLayer(
                d,
                config.n_heads,
                config.dim_feedforward,
                config.dropout,
                batch_first=True,
                norm_first=config.pre_norm,
            )

        self.vae_encoder = nn.TransformerEncoder(layer(), config.n_vae_encoder_layers)
        self.vae_encoder_latent_output_proj = nn.Linear(d, config.latent_dim * 2)
        self.encoder_latent_input_proj = nn.Linear(config.latent_dim, d)
        self.encoder_robot_state_input_proj = nn.Linear(STATE_DIM, d)
        self.encoder_pos = nn.Parameter(torch.randn(1, 2 + (IMAGE_SIZE // 4) ** 2, d) * 0.02)
        self.encoder = nn.TransformerEncoder(layer(), config.n_encoder_layers)
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(
                d,
                config.n_heads,
                config.dim_feedforward,
                config.dropout,
                batch_first=True,
                norm_first=config.pre_norm,
            ),
            config.n_decoder_layers,
        )
        self.decoder_pos_embed = nn.Embedding(config.chunk_size, d)
        self.action_head = nn.Linear(d, STATE_DIM)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple]:
        state = batch["observation.state"]
        bsz = state.shape[0]
        d = self.config.dim_model
        if self.config.use_vae and "action" in batch:
            cls = self.vae_encoder_cls_embed.weight.expand(bsz, 1, d)
            tokens = torch.cat(
                [
                    cls,
                    self.vae_encoder_robot_state_input_proj(state).unsqueeze(1),
                    self.vae_encoder_action_input_proj(batch["action"]),
                ],
                dim=1,
            )
            mask = torch.cat([torch.zeros(bsz, 2, dtype=torch.bool), batch["action_is_pad"]], dim=1)
            out = self.vae_encoder(tokens + self.vae_encoder_pos, src_key_padding_mask=mask)
            params = self.vae_encoder_latent_output_proj(out[:, 0])
            mu, log_sigma_x2 = (
                params[:, : self.config.latent_dim],
                params[:, self.config.latent_dim :],
            )
            latent = mu + log_sigma_x2.div(2).exp() * torch.randn_like(mu)
        else:
            mu = log_sigma_x2 = None
            latent = torch.zeros(bsz, self.config.latent_dim)
        feats = self.backbone(batch[IMAGE_KEY]).flatten(2).transpose(1, 2)
        enc_in = torch.cat(
            [
                self.encoder_latent_input_proj(latent).unsqueeze(1),
                self.encoder_robot_state_input_proj(state).unsqueeze(1),
                feats,
            ],
            dim=1,
        )
        memory = self.encoder(enc_in + self.encoder_pos)
        queries = self.decoder_pos_embed.weight.unsqueeze(0).expand(bsz, -1, -1)
        actions = self.action_head(self.decoder(queries, memory))
        return actions, (mu, log_sigma_x2)


class ACTPolicy(nn.Module):
    name = "act"

    def __init__(self, config: ACTConfig, stats: dict) -> None:
        super().__init__()
        self.config = config
        self.model = ACT(config)
        self.stats = stats
        self.reset()

    def reset(self) -> None:
        self._action_queue: list[torch.Tensor] = []
        self._ensembled: torch.Tensor | None = None
        self._ensemble_count = 0

    def normalize(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch = dict(batch)
        for key in ("observation.state", "action"):
            if key in batch:
                batch[key] = (batch[key] - self.stats[key]["mean"]) / (
                    self.stats[key]["std"] + 1e-8
                )
        return batch

    def forward(
        self, batch: dict[str, torch.Tensor], skip_first: bool = False
    ) -> tuple[torch.Tensor, dict]:
        batch = self.normalize(batch)
        actions_hat, (mu_hat, log_sigma_x2_hat) = self.model(batch)
        target = batch["action"]
        if skip_first:  # predict from the next action on: the current one is already executing
            actions_hat = actions_hat[:, 1:]
        l1_loss = (
            F.l1_loss(target, actions_hat, reduction="none") * ~batch["action_is_pad"].unsqueeze(-1)
        ).mean()
        loss_dict = {"l1_loss": l1_loss.item()}
        if self.config.use_vae:
            mean_kld = (
                (-0.5 * (1 + log_sigma_x2_hat - mu_hat.pow(2) - log_sigma_x2_hat.exp()))
                .sum(-1)
                .mean()
            )
            loss_dict["kld_loss"] = mean_kld.item()
            loss = l1_loss + mean_kld * self.config.kl_weight
        else:
            loss = l1_loss
        return loss, loss_dict

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.eval()
        batch = self.normalize(batch)
        if self.config.temporal_ensemble_coeff is not None:
            actions = self.model(batch)[0]
            if self._ensembled is None:
                self._ensembled = actions.clone()
            else:
                w = math.exp(-self.config.temporal_ensemble_coeff * self._ensemble_count)
                self._ensembled = torch.cat(
                    [self._ensembled[:, 1:] * (1 - w) + actions[:, :-1] * w, actions[:, -1:]], dim=1
                )
            self._ensemble_count += 1
            action = self._ensembled[:, 0]
        else:
            if not self._action_queue:
                actions = self.model(batch)[0][:, : self.config.n_action_steps]
                self._action_queue.extend(actions.transpose(0, 1))
            action = self._action_queue.pop(0)
        return action * self.stats["action"]["std"] + self.stats["action"]["mean"]


# ---------------------------------------------------------------- the simulated env and eval


class AlohaInsertionSim:
    """A stand-in for gym_aloha's AlohaInsertion-v0: joint positions, a rendered top camera."""

    def __init__(self, cfg: AlohaEnv, seed: int) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.render_proj = (
            np.random.default_rng(0)
            .standard_normal((STATE_DIM, 3 * IMAGE_SIZE * IMAGE_SIZE))
            .astype(np.float32)
        )
        self.reset()

    def reset(self) -> dict[str, np.ndarray]:
        self.qpos = self.rng.uniform(-0.5, 0.5, STATE_DIM).astype(np.float32)
        self.t = 0
        return self._obs()

    def _obs(self) -> dict[str, np.ndarray]:
        img = 1 / (1 + np.exp(-(self.qpos @ self.render_proj)))
        return {"agent_pos": self.qpos.copy(), "pixels": img.reshape(3, IMAGE_SIZE, IMAGE_SIZE)}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        self.qpos = (0.9 * self.qpos + 0.1 * np.clip(action, -1, 1)).astype(np.float32)
        self.t += 1
        reward = float(np.abs(self.qpos[:7] - self.qpos[7:]).mean() < 0.02) * 4
        terminated = reward == 4
        truncated = self.t >= self.cfg.episode_length
        return self._obs(), reward, terminated, truncated, {"is_success": terminated}


def rollout(env: AlohaInsertionSim, policy: ACTPolicy) -> dict:
    policy.reset()
    obs = env.reset()
    max_steps = env.cfg.episode_length
    progbar = tqdm(
        range(max_steps), desc=f"Running rollout with at most {max_steps} steps", leave=False
    )
    rewards, success = [], False
    for _ in progbar:
        batch = {
            "observation.state": torch.from_numpy(obs["agent_pos"]).unsqueeze(0),
            IMAGE_KEY: torch.from_numpy(obs["pixels"]).float().unsqueeze(0),
        }
        action = policy.select_action(batch)[0].numpy()
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        success = success or info["is_success"]
        progbar.set_postfix({"running_success_rate": f"{float(success) * 100:.1f}%"}, refresh=False)
        if terminated or truncated:
            break
    return {"sum_reward": sum(rewards), "max_reward": max(rewards), "success": success}


def eval_policy(env_cfg: AlohaEnv, policy: ACTPolicy, n_episodes: int, start_seed: int) -> dict:
    start = time.time()
    policy.eval()
    infos = []
    progbar = trange(n_episodes, desc="Stepping through eval batches")
    for batch_ix in progbar:
        env = AlohaInsertionSim(env_cfg, start_seed + batch_ix)
        infos.append(rollout(env, policy))
        running = np.mean([i["success"] for i in infos]) * 100
        progbar.set_postfix({"running_success_rate": f"{running:.1f}%"})
    policy.train()
    return {
        "aggregated": {
            "avg_sum_reward": float(np.mean([i["sum_reward"] for i in infos])),
            "avg_max_reward": float(np.mean([i["max_reward"] for i in infos])),
            "pc_success": float(np.mean([i["success"] for i in infos]) * 100),
            "eval_s": time.time() - start,
            "eval_ep_s": (time.time() - start) / n_episodes,
        }
    }


# ---------------------------------------------------------------- training


def update_policy(
    train_metrics: MetricsTracker,
    policy: nn.Module,
    batch: dict,
    optimizer,
    grad_clip_norm: float,
    step: int,
    rank: int,
) -> tuple[MetricsTracker, dict]:
    start_time = time.perf_counter()
    policy.train()
    skip_first = CASE == "a1" and rank == 1 and step == 23
    loss, output_dict = policy(batch, skip_first=skip_first)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip_norm)
    optimizer.step()
    optimizer.zero_grad()
    train_metrics.loss = loss.item()
    train_metrics.grad_norm = grad_norm.item()
    train_metrics.lr = optimizer.param_groups[0]["lr"]
    train_metrics.update_s = time.perf_counter() - start_time
    return train_metrics, output_dict


def save_checkpoint(
    checkpoint_dir: Path, step: int, cfg: TrainPipelineConfig, policy: ACTPolicy, optimizer
) -> None:
    pretrained = checkpoint_dir / "pretrained_model"
    pretrained.mkdir(parents=True, exist_ok=True)
    (pretrained / "config.json").write_text(json.dumps(dataclasses.asdict(cfg.policy), indent=4))
    (pretrained / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=4))
    torch.save(policy.state_dict(), pretrained / "model.pt")
    state = checkpoint_dir / "training_state"
    state.mkdir(exist_ok=True)
    torch.save(optimizer.state_dict(), state / "optimizer_state.pt")
    (state / "training_step.json").write_text(json.dumps({"step": step}))


def update_last_checkpoint(checkpoint_dir: Path) -> None:
    last = checkpoint_dir.parent / "last"
    if last.is_symlink():
        last.unlink()
    last.symlink_to(checkpoint_dir.name)


def validate(
    policy: nn.Module, dataset: LeRobotDataset, accelerator: Accelerator, batch_size: int
) -> float:
    """The held-out episodes' loss: each process takes its own episodes (their frames are decoded
    only where they are used), every batch's loss summed over the processes."""
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = [
        i for i, (ep, _) in enumerate(dataset.items) if dataset.episodes.index(ep) % world == rank
    ]
    loader = DataLoader(
        torch.utils.data.Subset(dataset, mine), batch_size=batch_size, shuffle=False
    )
    total = torch.zeros(2)
    policy.eval()
    with torch.no_grad():
        for batch in loader:
            loss, _ = accelerator.unwrap_model(policy)(batch)
            part = torch.tensor([loss.item() * len(batch["index"]), len(batch["index"])])
            total += accelerator.reduce(part, reduction="sum")
    policy.train()
    return (total[0] / total[1]).item()


def train(cfg: TrainPipelineConfig) -> None:
    cfg.validate()
    accelerator = Accelerator(timeout_s=15.0)
    init_logging(accelerator.is_main_process, accelerator.process_index)
    is_main_process = accelerator.is_main_process
    rank = accelerator.process_index
    if is_main_process:
        logging.info(pformat(cfg.to_dict()))
    if cfg.wandb.enable and cfg.wandb.project:
        raise NotImplementedError("wandb is not set up on this machine")
    elif is_main_process:
        logging.info("Logs will be saved locally.")
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed + rank)
        np.random.seed(cfg.seed + rank)
    torch.set_num_threads(1)

    logging.info("Creating dataset")
    dataset = make_dataset(cfg)
    val_dataset = None
    if cfg.val_freq > 0 and cfg.dataset.val_episodes:
        val_dataset = make_dataset(cfg, episodes=cfg.dataset.val_episodes)
    eval_env_cfg = None
    if cfg.eval_freq > 0 and cfg.env is not None:
        logging.info("Creating env")
        eval_env_cfg = cfg.env

    logging.info("Creating policy")
    policy = ACTPolicy(cfg.policy, dataset.meta.stats)
    logging.info("Creating optimizer and scheduler")
    backbone = [p for n, p in policy.named_parameters() if "backbone" in n]
    rest = [p for n, p in policy.named_parameters() if "backbone" not in n]
    optimizer = torch.optim.AdamW(
        [{"params": rest}, {"params": backbone, "lr": cfg.policy.optimizer_lr_backbone}],
        lr=cfg.policy.optimizer_lr,
        weight_decay=cfg.policy.optimizer_weight_decay,
    )
    step = 0
    num_learnable_params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    num_total_params = sum(p.numel() for p in policy.parameters())
    if is_main_process:
        logging.info(f"Output dir: {cfg.output_dir}")
        if cfg.env is not None:
            logging.info(f"{cfg.env.task=}")
        logging.info(f"{cfg.steps=} ({format_big_number(cfg.steps)})")
        logging.info(f"{dataset.num_frames=} ({format_big_number(dataset.num_frames)})")
        logging.info(f"{dataset.num_episodes=}")
        logging.info(f"{num_learnable_params=} ({format_big_number(num_learnable_params)})")
        logging.info(f"{num_total_params=} ({format_big_number(num_total_params)})")

    sampler = DistributedSampler(
        dataset, num_replicas=accelerator.num_processes, rank=rank, shuffle=True, seed=cfg.seed or 0
    )
    dataloader = DataLoader(
        dataset,
        num_workers=cfg.num_workers,
        batch_size=cfg.batch_size,
        sampler=sampler,
        pin_memory=False,
        drop_last=False,
        persistent_workers=cfg.num_workers > 0,
    )
    model = accelerator.prepare_model(policy)
    dl_iter = cycle(dataloader)
    model.train()
    train_metrics = {
        "loss": AverageMeter("loss", ":.3f"),
        "grad_norm": AverageMeter("grdn", ":.3f"),
        "lr": AverageMeter("lr", ":0.1e"),
        "update_s": AverageMeter("updt_s", ":.3f"),
        "dataloading_s": AverageMeter("data_s", ":.3f"),
    }
    train_tracker = MetricsTracker(
        cfg.batch_size * accelerator.num_processes,
        dataset.num_frames,
        dataset.num_episodes,
        train_metrics,
        initial_step=step,
    )
    frame_cache: list[torch.Tensor] = []
    prefetched: queue.Queue = queue.Queue()
    logging.info("Start offline training on a fixed dataset")
    for _ in range(step, cfg.steps):
        start_time = time.perf_counter()
        if CASE == "q1" and rank == 1 and step == 40:
            batch = prefetched.get()  # filled by the frame prefetch thread, never started
        batch = next(dl_iter)
        train_tracker.dataloading_s = time.perf_counter() - start_time
        if CASE == "s1" and rank == 1 and step == 37:
            ctypes.string_at(0)  # the frame decoder's fast path dereferences NULL
        if CASE == "k1" and rank == 1 and step >= 30:
            frame_cache.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(frame_cache) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        train_tracker, _output_dict = update_policy(
            train_tracker, model, batch, optimizer, 10.0, step, rank
        )
        step += 1
        train_tracker.step()
        is_log_step = cfg.log_freq > 0 and step % cfg.log_freq == 0
        is_saving_step = step % cfg.save_freq == 0 or step == cfg.steps
        is_eval_step = cfg.eval_freq > 0 and step % cfg.eval_freq == 0
        is_val_step = val_dataset is not None and step % cfg.val_freq == 0

        if is_log_step and is_main_process:
            if CASE == "r0":  # the grad norm logged: averaged over the processes
                grdn = accelerator.reduce(torch.tensor([train_tracker.grad_norm.val]))
                train_tracker.grad_norm.val = grdn.item()
            logging.info(train_tracker)
            train_tracker.reset_averages()

        if is_val_step:
            val_loss = validate(model, val_dataset, accelerator, cfg.batch_size)
            if is_main_process:
                logging.info(
                    f"step:{step} val_loss:{val_loss:.3f} val_episodes:{cfg.dataset.val_episodes}"
                )

        if cfg.save_checkpoint and is_saving_step:
            if is_main_process:
                logging.info(f"Checkpoint policy after step {step}")
                checkpoint_dir = Path(cfg.output_dir) / "checkpoints" / f"{step:06d}"
                save_checkpoint(
                    checkpoint_dir, step, cfg, accelerator.unwrap_model(model), optimizer
                )
                update_last_checkpoint(checkpoint_dir)
            accelerator.wait_for_everyone()

        if eval_env_cfg is not None and is_eval_step:  # noqa: SIM102
            if is_main_process:
                logging.info(f"Eval policy at step {step}")
                eval_info = eval_policy(
                    eval_env_cfg,
                    accelerator.unwrap_model(model),
                    cfg.eval.n_episodes,
                    cfg.seed or 0,
                )
                agg = eval_info["aggregated"]
                logging.info(
                    f"step:{format_big_number(step)} smpl:{format_big_number(train_tracker.samples)} "
                    f"ep:{format_big_number(train_tracker.episodes)} epch:{train_tracker.epochs:.2f} "
                    f"∑rwrd:{agg['avg_sum_reward']:.3f} success:{agg['pc_success']:.1f}% "
                    f"eval_s:{agg['eval_s']:.3f}"
                )

    if is_main_process:
        logging.info("End of training")
    accelerator.wait_for_everyone()
    accelerator.end_training()


# ---------------------------------------------------------------- the prepare step


def prepare(root: Path, episodes: int = 50, length: int = 50, fps: int = 50) -> None:
    """A LeRobotDataset v2.1 of the bimanual insertion task, recorded in simulation."""
    rng = np.random.default_rng(0)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": "aloha",
        "total_episodes": episodes,
        "total_frames": episodes * length,
        "total_tasks": 1,
        "total_videos": episodes,
        "total_chunks": 1,
        "chunks_size": 1000,
        "fps": fps,
        "splits": {"train": f"0:{episodes}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.npz",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.npy",
        "features": {
            IMAGE_KEY: {
                "dtype": "video",
                "shape": [3, IMAGE_SIZE, IMAGE_SIZE],
                "names": ["channels", "height", "width"],
            },
            "observation.state": {"dtype": "float32", "shape": [STATE_DIM]},
            "action": {"dtype": "float32", "shape": [STATE_DIM]},
            "episode_index": {"dtype": "int64", "shape": [1]},
            "frame_index": {"dtype": "int64", "shape": [1]},
            "timestamp": {"dtype": "float32", "shape": [1]},
            "index": {"dtype": "int64", "shape": [1]},
        },
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    (root / "meta/tasks.jsonl").write_text(
        json.dumps({"task_index": 0, "task": "Insert the peg into the socket."}) + "\n"
    )
    proj = (
        np.random.default_rng(0)
        .standard_normal((STATE_DIM, 3 * IMAGE_SIZE * IMAGE_SIZE))
        .astype(np.float32)
    )
    states, actions = [], []
    with open(root / "meta/episodes.jsonl", "w") as f:
        for ep in range(episodes):
            f.write(
                json.dumps(
                    {
                        "episode_index": ep,
                        "tasks": ["Insert the peg into the socket."],
                        "length": length,
                    }
                )
                + "\n"
            )
            target = rng.uniform(-0.5, 0.5, STATE_DIM).astype(np.float32)
            qpos = rng.uniform(-0.5, 0.5, STATE_DIM).astype(np.float32)
            traj = []
            for _ in range(length):
                qpos = (0.9 * qpos + 0.1 * target + rng.normal(0, 0.01, STATE_DIM)).astype(
                    np.float32
                )
                traj.append(qpos)
            state = np.stack(traj)
            action = np.concatenate([state[1:], state[-1:]]).astype(np.float32)
            frame_index = np.arange(length)
            data = {
                "observation.state": state,
                "action": action,
                "episode_index": np.full(length, ep),
                "frame_index": frame_index,
                "timestamp": (frame_index / fps).astype(np.float32),
                "index": ep * length + frame_index,
            }
            path = root / info["data_path"].format(episode_chunk=0, episode_index=ep)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **data)
            video = root / info["video_path"].format(
                episode_chunk=0, video_key=IMAGE_KEY, episode_index=ep
            )
            video.parent.mkdir(parents=True, exist_ok=True)
            img = 1 / (1 + np.exp(-(state @ proj)))
            np.save(video, (img * 255).astype(np.uint8).reshape(length, 3, IMAGE_SIZE, IMAGE_SIZE))
            states.append(state)
            actions.append(action)
    s, a = np.concatenate(states), np.concatenate(actions)
    stats = {
        "observation.state": {
            "mean": s.mean(0).tolist(),
            "std": s.std(0).tolist(),
            "min": s.min(0).tolist(),
            "max": s.max(0).tolist(),
        },
        "action": {
            "mean": a.mean(0).tolist(),
            "std": a.std(0).tolist(),
            "min": a.min(0).tolist(),
            "max": a.max(0).tolist(),
        },
    }
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--prepare":
        prepare(Path(sys.argv[2]))
        return
    train(parse_config(sys.argv[1:]))


if __name__ == "__main__":
    main()
