"""A hundredtwenty-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentythird-*): LLM pretraining in the way of Hugging Face nanotron
(`CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node=2 run_train.py --config-file
examples/config_tiny_llama.yaml`), re-created in plain torch without nanotron (copied into each
run's folder as run_train.py). Its YAML config (general.project/run/seed, parallelism dp/pp/tp,
model.model_config of a tiny llama, tokens.sequence_length/micro_batch_size/
batch_accumulation_per_replica/train_steps, checkpoints.checkpoint_interval/checkpoints_path/
resume_checkpoint_path, logging.iteration_step_info_interval, data_stages with a nanoset folder
or dummy data); a ParallelContext that initialises the default group from torchrun's env (gloo
with a 15 s timeout where nanotron has nccl) and builds the tp/pp/dp groups with dist.new_group
between barriers (nanotron's create_new_group); nanotron's logger, whose records carry the parallel
coordinates ('12/06/2026 18:00:00 [INFO|DP=0|PP=0|TP=0]: ...'), INFO from DP=0/TP=0 only
(log_rank(..., rank=0)), WARNING from every rank; a Nanoset over the tokenized folder the
prepare step (tools/preprocess_data.py) writes: NNN_<name>.ds files of uint16 tokens with their
.ds.metadata (the token count), memory-mapped, each DP rank reading the files k with
k % dp == dp_rank, its samples shuffled; nanotron's DataCollatorForCLM; the gradients of the
micro-batches accumulated and all-reduced by hand over the dp group as one flat bucket; grad
clipping, AdamW, a linear-warmup cosine schedule; the iteration lines; checkpoints at
checkpoints/<step>/ (model/, optimizer/, lr_scheduler/, random/, config.yaml,
checkpoint_metadata.json, latest.txt) and their resume. A fault in the code is chosen by the
TQ_CASE environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentythird.sh after any edit).
"""
# ruff: noqa: UP045, UP032, UP037, B007, RUF059, RUF100 (nanotron's own code, as it is written)

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import logging
import math
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from tqdm import tqdm


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    spike_rank: int = -1  # this rank's loss-spike report reads a key the batch does not have
    hoard_rank: int = -1  # this rank keeps every step's logits for its z-loss report
    segv_rank: int = -1  # this rank's fused rotary kernel reads address 0
    log_allreduce_rank0: bool = False  # the logged loss all-reduced inside the DP=0 branch
    slow_save_rank: int = -1  # this rank writes the model weights to a throttled mount
    group_order_rank: int = -1  # this rank builds its process groups in another order


FAULTS = {
    "": Fault(),
    "n1": Fault(spike_rank=1),
    "m1": Fault(hoard_rank=1),
    "v0": Fault(segv_rank=0),
    "g0": Fault(log_allreduce_rank0=True),
    "w0": Fault(slow_save_rank=0),
    "o1": Fault(group_order_rank=1),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

logger = logging.getLogger("nanotron")
PG_TIMEOUT = datetime.timedelta(seconds=15)  # nanotron: dist.default_pg_timeout


# ------------------------------------------------------------------------------- config
@dataclass
class GeneralArgs:
    project: str
    run: str
    seed: int = 42
    step: Optional[int] = None
    consumed_train_samples: Optional[int] = None
    ignore_sanity_checks: bool = True


@dataclass
class ParallelismArgs:
    dp: int
    pp: int
    tp: int
    pp_engine: str = "1f1b"
    tp_mode: str = "REDUCE_SCATTER"
    tp_linear_async_communication: bool = True


@dataclass
class LlamaConfig:
    bos_token_id: int = 1
    eos_token_id: int = 2
    hidden_act: str = "silu"
    hidden_size: int = 32
    initializer_range: float = 0.02
    intermediate_size: int = 64
    max_position_embeddings: int = 64
    num_attention_heads: int = 4
    num_hidden_layers: int = 2
    num_key_value_heads: int = 4
    rms_norm_eps: float = 1e-05
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    vocab_size: int = 256


@dataclass
class TokensArgs:
    sequence_length: int
    train_steps: int
    micro_batch_size: int
    batch_accumulation_per_replica: int
    val_check_interval: int = -1
    limit_val_batches: int = 0
    limit_test_batches: int = 0


@dataclass
class CheckpointsArgs:
    checkpoints_path: str
    checkpoint_interval: int
    save_initial_state: bool = False
    resume_checkpoint_path: Optional[str] = None
    checkpoints_path_is_shared_file_system: bool = False


@dataclass
class LoggingArgs:
    log_level: str = "info"
    log_level_replica: str = "info"
    iteration_step_info_interval: int = 1


@dataclass
class OptimizerArgs:
    learning_rate: float = 3e-3
    lr_warmup_steps: int = 2
    lr_decay_style: str = "cosine"
    min_decay_lr: float = 1e-5
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-08
    zero_stage: int = 0
    accumulate_grad_in_fp32: bool = True


@dataclass
class DataArgs:
    seed: int = 42
    num_loading_workers: int = 0
    dataset: Optional[dict] = None  # {"dataset_folder": ...} or None for dummy data


@dataclass
class DatasetStageArgs:
    name: str
    start_training_step: int
    data: DataArgs


@dataclass
class Config:
    general: GeneralArgs
    parallelism: ParallelismArgs
    model: LlamaConfig
    tokens: TokensArgs
    checkpoints: CheckpointsArgs
    logging: LoggingArgs
    optimizer: OptimizerArgs
    data_stages: list = field(default_factory=list)

    @property
    def global_batch_size(self) -> int:
        return (
            self.tokens.micro_batch_size
            * self.tokens.batch_accumulation_per_replica
            * self.parallelism.dp
        )


def get_config_from_file(path: str) -> Config:
    with open(path) as f:
        raw = yaml.safe_load(f)
    stages = [
        DatasetStageArgs(
            name=s["name"],
            start_training_step=s["start_training_step"],
            data=DataArgs(**s["data"]),
        )
        for s in raw.get("data_stages", [])
    ]
    return Config(
        general=GeneralArgs(**raw["general"]),
        parallelism=ParallelismArgs(**raw["parallelism"]),
        model=LlamaConfig(**raw["model"]["model_config"]),
        tokens=TokensArgs(**raw["tokens"]),
        checkpoints=CheckpointsArgs(**raw["checkpoints"]),
        logging=LoggingArgs(**raw.get("logging", {})),
        optimizer=OptimizerArgs(**raw.get("optimizer", {})),
        data_stages=stages,
    )


# ------------------------------------------------------------------------------- logging
def human_format(num: float, billions: bool = False, divide_by_1024: bool = False) -> str:
    if abs(num) < 1:
        return "{:.3g}".format(num)
    size = 1024 if divide_by_1024 else 1000
    num = float("{:.3g}".format(num))
    magnitude = 0
    while abs(num) >= size:
        magnitude += 1
        num /= size
    units = ["", "K", "M", "G", "T", "P"]
    return "{}{}".format("{:f}".format(num).rstrip("0").rstrip("."), units[magnitude])


def log_rank(msg: str, logger: logging.Logger, level: int, group=None, rank: Optional[int] = None):
    """nanotron.logging.log_rank: only `rank` of `group` logs (every rank when rank is None)."""
    if group is None:
        group = dist.GroupMember.WORLD
    if rank is not None and dist.get_rank(group) != rank:
        return
    logger.log(level, msg)


def set_ranks_logging_level(parallel_context: "ParallelContext", logging_config: LoggingArgs):
    """DP=0/TP=0 logs at log_level, every other rank at WARNING; the parallel coordinates in
    every record."""
    dp = dist.get_rank(parallel_context.dp_pg)
    pp = dist.get_rank(parallel_context.pp_pg)
    tp = dist.get_rank(parallel_context.tp_pg)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            fmt=f"%(asctime)s [%(levelname)s|DP={dp}|PP={pp}|TP={tp}]: %(message)s",
            datefmt="%m/%d/%Y %H:%M:%S",
        )
    )
    logger.handlers[:] = [handler]
    logger.propagate = False
    if dist.get_rank(parallel_context.world_pg) == 0:
        logger.setLevel(logging_config.log_level.upper())
    else:
        logger.setLevel(logging.WARNING)


# ------------------------------------------------------------------------------- parallel
class ParallelContext:
    def __init__(
        self, tensor_parallel_size: int, pipeline_parallel_size: int, data_parallel_size: int
    ):
        world_size = int(os.environ["WORLD_SIZE"])
        assert world_size == tensor_parallel_size * pipeline_parallel_size * data_parallel_size, (
            f"({world_size}) != tp ({tensor_parallel_size}) * pp ({pipeline_parallel_size}) * "
            f"dp ({data_parallel_size})"
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self.data_parallel_size = data_parallel_size
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", init_method="env://", timeout=PG_TIMEOUT)
        self.world_pg = dist.GroupMember.WORLD
        self._init_parallel_groups()

    def _init_parallel_groups(self):
        dist.barrier()
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        ranks = np.arange(0, world_size).reshape(
            (self.pipeline_parallel_size, self.data_parallel_size, self.tensor_parallel_size)
        )
        self.world_ranks_to_pg = {}
        builders = [
            (
                "tp",
                lambda: [
                    ranks[pp, dp, :] for pp in range(ranks.shape[0]) for dp in range(ranks.shape[1])
                ],
            ),
            (
                "dp",
                lambda: [
                    ranks[pp, :, tp] for pp in range(ranks.shape[0]) for tp in range(ranks.shape[2])
                ],
            ),
            (
                "pp",
                lambda: [
                    ranks[:, dp, tp] for dp in range(ranks.shape[1]) for tp in range(ranks.shape[2])
                ],
            ),
        ]
        if rank == FAULT.group_order_rank:
            # the groups' order from iterating a set of their names on this rank
            builders = [builders[1], builders[0], builders[2]]
        groups = {}
        for name, all_groups in builders:
            groups[name] = self.create_new_group(all_groups())
        self.tp_pg, self.dp_pg, self.pp_pg = groups["tp"], groups["dp"], groups["pp"]
        self.world_rank_matrix = ranks
        dist.barrier()

    def create_new_group(self, all_groups_ranks):
        dist.barrier()
        rank = int(os.environ["RANK"])
        new_group_containing_rank = None
        for group_ranks in all_groups_ranks:
            sorted_ranks = tuple(sorted(int(r) for r in group_ranks))
            if sorted_ranks not in self.world_ranks_to_pg:
                new_group = dist.new_group(ranks=list(sorted_ranks), timeout=PG_TIMEOUT)
                self.world_ranks_to_pg[sorted_ranks] = new_group
            else:
                new_group = self.world_ranks_to_pg[sorted_ranks]
            if rank in sorted_ranks:
                new_group_containing_rank = new_group
        dist.barrier()
        return new_group_containing_rank


@contextmanager
def main_rank_first(group):
    """rank 0 of `group` runs the block first (it builds the caches), the others after it."""
    is_main = dist.get_rank(group) == 0
    if is_main:
        yield
    dist.barrier(group)
    if not is_main:
        yield


# ------------------------------------------------------------------------------- model
class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(var + self.eps)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, end: int, theta: float):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.outer(torch.arange(end).float(), inv)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x):  # (b, h, s, d)
        if FAULT.segv_rank == dist.get_rank() and ITERATION[0] == 5:
            ctypes.string_at(0)  # the fused rotary kernel reads a NULL pointer on this rank
        s = x.shape[-2]
        x1, x2 = x[..., ::2], x[..., 1::2]
        cos, sin = self.cos[:s], self.sin[:s]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.rotary_embedding = RotaryEmbedding(
            self.head_dim, config.max_position_embeddings, config.rope_theta
        )

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv_proj(x).view(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.rotary_embedding(q), self.rotary_embedding(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForTraining(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.decoder = nn.ModuleList(
            [LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.final_layer_norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.token_embedding.weight
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=config.initializer_range)

    def forward(self, input_ids, input_mask, label_ids, label_mask):
        x = self.token_embedding(input_ids)
        for layer in self.decoder:
            x = layer(x)
        logits = self.lm_head(self.final_layer_norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1), label_ids.flatten(), reduction="none")
        loss = (loss * label_mask.flatten()).sum() / label_mask.sum()
        return {"loss": loss, "logits": logits}


# ------------------------------------------------------------------------------- data
class DatatroveFileDataset:
    """One tokenized file: uint16 tokens memory-mapped, its token count from .ds.metadata."""

    def __init__(self, file_path: str, seq_len: int, token_size: int = 2):
        self.file_path = file_path
        self.seq_len = seq_len
        with open(file_path + ".metadata") as f:
            meta = dict(line.strip().split("=", 1) for line in f if "=" in line)
        self.token_count = int(meta["token_count"])
        self.tokens = np.memmap(
            file_path, dtype=np.uint16 if token_size == 2 else np.uint32, mode="r"
        )
        self._len = (self.token_count - 1) // seq_len

    def __len__(self):
        return self._len

    def __getitem__(self, item):
        start = item * self.seq_len
        return {
            "input_ids": np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
        }


class Nanoset(torch.utils.data.Dataset):
    """The token files of a nanoset folder this DP rank reads (file k on rank k % dp), their
    samples shuffled with the data seed."""

    def __init__(
        self,
        dataset_folder: str,
        sequence_length: int,
        dp_rank: int,
        dp_size: int,
        random_seed: int,
    ):
        self.files = sorted(glob.glob(os.path.join(dataset_folder, "*.ds")))
        assert self.files, f"No .ds token files found in {dataset_folder}"
        self.total_tokens = 0
        for path in self.files:
            with open(path + ".metadata") as f:
                meta = dict(line.strip().split("=", 1) for line in f if "=" in line)
            self.total_tokens += int(meta["token_count"])
        self.total_samples = sum((self._count(p) - 1) // sequence_length for p in self.files)
        self.datasets = [
            DatatroveFileDataset(p, sequence_length)
            for k, p in enumerate(self.files)
            if k % dp_size == dp_rank
        ]
        self.dataset_index, self.dataset_sample_index = [], []
        for d, ds in enumerate(self.datasets):
            self.dataset_index += [d] * len(ds)
            self.dataset_sample_index += list(range(len(ds)))
        order = np.random.RandomState(random_seed).permutation(len(self.dataset_index))
        self.dataset_index = [self.dataset_index[i] for i in order]
        self.dataset_sample_index = [self.dataset_sample_index[i] for i in order]

    @staticmethod
    def _count(path):
        with open(path + ".metadata") as f:
            return int(dict(line.strip().split("=", 1) for line in f if "=" in line)["token_count"])

    def __len__(self):
        return len(self.dataset_index)

    def __getitem__(self, idx):
        return self.datasets[self.dataset_index[idx]][self.dataset_sample_index[idx]]


class DummyDataset(torch.utils.data.Dataset):
    def __init__(self, sequence_length: int, vocab_size: int, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n, sequence_length + 1), generator=g).numpy()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i]}


@dataclass
class DataCollatorForCLM:
    sequence_length: int

    def __call__(self, examples):
        input_ids = np.vstack([examples[i]["input_ids"] for i in range(len(examples))])  # (b, s)
        batch_size, expanded_input_length = input_ids.shape
        result = {
            "input_ids": torch.from_numpy(input_ids[:, :-1]),
            "input_mask": torch.ones(batch_size, self.sequence_length, dtype=torch.bool),
            "label_ids": torch.from_numpy(input_ids[:, 1:]),
            "label_mask": torch.ones(batch_size, self.sequence_length, dtype=torch.bool),
        }
        if result["input_ids"].shape[-1] != self.sequence_length:
            raise ValueError(
                f"`labels` are incorrectly preprocessed. `labels` length is "
                f"{result['input_ids'].shape[-1]}, but should be {self.sequence_length}."
            )
        return result


# ------------------------------------------------------------------------------- trainer
ITERATION = [0]


def lr_at(step: int, opt: OptimizerArgs, total: int) -> float:
    if step < opt.lr_warmup_steps:
        return opt.learning_rate * (step + 1) / opt.lr_warmup_steps
    progress = (step - opt.lr_warmup_steps) / max(1, total - opt.lr_warmup_steps)
    return opt.min_decay_lr + (opt.learning_rate - opt.min_decay_lr) * 0.5 * (
        1 + math.cos(math.pi * progress)
    )


class DistributedTrainer:
    def __init__(self, config_file: str):
        self.config = get_config_from_file(config_file)
        self.config_file = config_file
        p = self.config.parallelism
        self.parallel_context = ParallelContext(
            tensor_parallel_size=p.tp, pipeline_parallel_size=p.pp, data_parallel_size=p.dp
        )
        set_ranks_logging_level(self.parallel_context, self.config.logging)
        log_rank("Config:", logger=logger, level=logging.INFO, rank=0)
        log_rank(repr(self.config), logger=logger, level=logging.INFO, rank=0)
        log_rank("Model Config:", logger=logger, level=logging.INFO, rank=0)
        log_rank(repr(self.config.model), logger=logger, level=logging.INFO, rank=0)
        torch.manual_seed(self.config.general.seed)
        self.sequence_length = self.config.tokens.sequence_length
        self.micro_batch_size = self.config.tokens.micro_batch_size
        self.n_micro_batches_per_batch = self.config.tokens.batch_accumulation_per_replica
        self.global_batch_size = self.config.global_batch_size
        self.iteration_step = 0
        self.consumed_train_samples = 0

        log_rank("Building model..", logger=logger, level=logging.INFO, rank=0)
        log_rank(
            f"Initialize RoPE Theta = {self.config.model.rope_theta}",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        log_rank("Setting PP block ranks...", logger=logger, level=logging.INFO, rank=0)
        self.model = LlamaForTraining(self.config.model)
        n = sum(p.numel() for p in self.model.parameters())
        size = f"{n * 4 / 2**20:.2f}Mi"
        log_rank(
            f"Total number of parameters: {human_format(n)} ({size}B)",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        log_rank(
            f"Local number of parameters: {human_format(n)} ({size}B)",
            logger=logger,
            level=logging.INFO,
            group=self.parallel_context.dp_pg,
            rank=0,
        )
        log_rank(
            f"[After model building] Memory usage: {size}B. Peak allocated: {size}B Peak reserved: 0.00MiB",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        # every DP replica starts from DP=0's weights
        for p in self.model.parameters():
            dist.broadcast(p.data, src=0, group=self.parallel_context.dp_pg)
        log_rank(
            "Parametrizing model parameters using StandardParametrizator",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.config.optimizer.learning_rate,
            betas=(self.config.optimizer.adam_beta1, self.config.optimizer.adam_beta2),
            eps=self.config.optimizer.adam_eps,
            weight_decay=self.config.optimizer.weight_decay,
        )
        log_rank(
            "[Optimizer Building] Using LearningRateForSP as learning rate",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        resume = self.config.checkpoints.resume_checkpoint_path
        if resume:
            self.load_checkpoint(Path(resume))
        else:
            log_rank("No checkpoint path provided.", logger=logger, level=logging.INFO, rank=0)
        self.hoard = []

    # -- checkpoints
    def load_checkpoint(self, path: Path):
        log_rank(f"Loading checkpoint from {path}", logger=logger, level=logging.INFO, rank=0)
        with open(path / "checkpoint_metadata.json") as f:
            meta = json.load(f)
        ckp_dp, ckp_tp = meta["dp"], meta["tp"]
        assert ckp_tp == self.parallel_context.tensor_parallel_size, (
            f"Tensor parallel size mismatch: the checkpoint was saved with tp={ckp_tp}, the config "
            f"says tp={self.parallel_context.tensor_parallel_size}"
        )
        assert ckp_dp == self.parallel_context.data_parallel_size, (
            f"You are resuming with a different data parallel size (checkpoint: dp={ckp_dp}, "
            f"current: dp={self.parallel_context.data_parallel_size}): the optimizer states of "
            f"{path / 'optimizer'} cannot be resharded yet"
        )
        dp_rank = dist.get_rank(self.parallel_context.dp_pg)
        state = {
            name: torch.load(path / "model" / f"{name}.pt", weights_only=True)
            for name in tqdm(
                self.model.state_dict(), desc="Loading weights", disable=dist.get_rank() != 0
            )
        }
        self.model.load_state_dict(state)
        self.optimizer.load_state_dict(
            torch.load(
                path / "optimizer" / f"optimizer_pp-0-of-1_dp-{dp_rank}-of-{ckp_dp}_tp-0-of-1.pt",
                weights_only=True,
            )
        )
        self.iteration_step = meta["metas"]["last_train_step"]
        self.consumed_train_samples = meta["metas"]["consumed_train_samples"]
        log_rank(
            f"Resuming from iteration {self.iteration_step}, consumed_train_samples "
            f"{self.consumed_train_samples}",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )

    def save_checkpoint(self):
        root = Path(self.config.checkpoints.checkpoints_path) / str(self.iteration_step)
        log_rank(f"Saving checkpoint at {root}", logger=logger, level=logging.WARNING, rank=0)
        dist.barrier(self.parallel_context.world_pg)
        dp_rank = dist.get_rank(self.parallel_context.dp_pg)
        dp = self.parallel_context.data_parallel_size
        for sub in ("model", "optimizer", "lr_scheduler", "random"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        if dp_rank == 0:
            for name, tensor in tqdm(self.model.state_dict().items(), desc="Saving weights"):
                torch.save(tensor, root / "model" / f"{name}.pt")
                if dist.get_rank() == FAULT.slow_save_rank:
                    time.sleep(3)  # the checkpoints path is a throttled network mount here
        torch.save(
            self.optimizer.state_dict(),
            root / "optimizer" / f"optimizer_pp-0-of-1_dp-{dp_rank}-of-{dp}_tp-0-of-1.pt",
        )
        torch.save(
            torch.get_rng_state(), root / "random" / f"tp-0-of-1_dp-{dp_rank}-of-{dp}_pp-0-of-1.pt"
        )
        if dist.get_rank() == 0:
            torch.save(
                {"step": self.iteration_step},
                root / "lr_scheduler" / "lr_scheduler_pp-0-of-1_tp-0-of-1.pt",
            )
            log_rank(
                f"Saving config at {root / 'config.yaml'}",
                logger=logger,
                level=logging.INFO,
                rank=0,
            )
            with open(self.config_file) as src, open(root / "config.yaml", "w") as dst:
                dst.write(src.read())
            with open(root / "checkpoint_metadata.json", "w") as f:
                json.dump(
                    {
                        "dp": dp,
                        "metas": {
                            "consumed_train_samples": self.consumed_train_samples,
                            "last_train_step": self.iteration_step,
                        },
                        "tp": self.parallel_context.tensor_parallel_size,
                        "version": "1.4",
                    },
                    f,
                )
            with open(Path(self.config.checkpoints.checkpoints_path) / "latest.txt", "w") as f:
                f.write(str(self.iteration_step))
        dist.barrier(self.parallel_context.world_pg)

    # -- data
    def build_dataloader(self):
        stage = self.config.data_stages[0]
        dp_rank = dist.get_rank(self.parallel_context.dp_pg)
        dp = self.parallel_context.data_parallel_size
        log_rank(
            f"[Training Plan] Stage {stage.name} has {self.config.tokens.train_steps - self.iteration_step} "
            f"remaining training steps and has consumed {self.consumed_train_samples} samples",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        if stage.data.dataset is None:
            log_rank("Using dummy data generator", logger=logger, level=logging.INFO, rank=0)
            dataset = DummyDataset(
                self.sequence_length,
                self.config.model.vocab_size,
                self.config.tokens.train_steps * self.global_batch_size // dp,
                stage.data.seed + dp_rank,
            )
            total_samples = len(dataset) * dp
        else:
            folder = stage.data.dataset["dataset_folder"]
            with main_rank_first(self.parallel_context.world_pg):
                dataset = Nanoset(folder, self.sequence_length, dp_rank, dp, stage.data.seed)
            total_samples = dataset.total_samples
            log_rank(
                f"> Total number of samples: {total_samples}",
                logger=logger,
                level=logging.INFO,
                rank=0,
            )
            log_rank(
                f"> Total number of tokens: {human_format(dataset.total_tokens)} (for {len(dataset.files)} token files)",
                logger=logger,
                level=logging.INFO,
                rank=0,
            )
        total_tokens_dataset = total_samples * self.sequence_length
        num_tokens_needed_for_training = (
            (self.config.tokens.train_steps - self.iteration_step)
            * self.global_batch_size
            * self.sequence_length
        )
        assert num_tokens_needed_for_training <= total_tokens_dataset, (
            f"Dataset is too small for steps ({total_tokens_dataset} < {num_tokens_needed_for_training}), "
            f"Try train_steps<={total_samples // self.global_batch_size + self.iteration_step}"
        )
        skip = self.consumed_train_samples // dp
        sampler = list(range(skip, len(dataset)))
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.micro_batch_size,
            sampler=sampler,
            collate_fn=DataCollatorForCLM(self.sequence_length),
            num_workers=stage.data.num_loading_workers,
            drop_last=True,
        )

    # -- training
    def all_reduce_gradients(self):
        grads = [p.grad for p in self.model.parameters()]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.parallel_context.dp_pg)
        flat /= self.parallel_context.data_parallel_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def training_step(self, dataloader):
        self.model.train()
        losses = []
        for _ in range(self.n_micro_batches_per_batch):
            batch = next(dataloader)
            out = self.model(**batch)
            loss = out["loss"] / self.n_micro_batches_per_batch
            loss.backward()
            losses.append(out["loss"].detach())
            if dist.get_rank() == FAULT.hoard_rank and self.iteration_step >= 6:
                # the logits kept for the z-loss report at the next logging step
                self.hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(self.hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        self.all_reduce_gradients()
        grad_norm = nn.utils.clip_grad_norm_(
            self.model.parameters(), self.config.optimizer.clip_grad
        )
        lr = lr_at(self.iteration_step, self.config.optimizer, self.config.tokens.train_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        return torch.stack(losses).mean(), grad_norm, lr, batch

    def train(self):
        dataloader = self.build_dataloader()
        stage = self.config.data_stages[0]
        log_rank(
            "[Training Plan] There are 1 training stages ",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        log_rank(
            f"[Stage {stage.name}] start from step {self.iteration_step + 1} ",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        log_rank("", logger=logger, level=logging.INFO, rank=0)
        log_rank(
            f"[Start training] datetime: {datetime.datetime.now()} | mbs: {self.micro_batch_size} | "
            f"grad_accum: {self.n_micro_batches_per_batch} | global_batch_size: {self.global_batch_size} | "
            f"sequence_length: {self.sequence_length} | train_steps: {self.config.tokens.train_steps} | "
            f"start_iteration_step: {self.iteration_step} | consumed_train_samples: {self.consumed_train_samples}",
            logger=logger,
            level=logging.INFO,
            rank=0,
        )
        data_iter = iter(dataloader)
        dp_rank = dist.get_rank(self.parallel_context.dp_pg)
        ema = None
        while self.iteration_step < self.config.tokens.train_steps:
            ITERATION[0] = self.iteration_step + 1
            t0 = time.time()
            try:
                loss, grad_norm, lr, batch = self.training_step(data_iter)
            except StopIteration:
                log_rank(
                    f"[Stage {stage.name}] No more samples in this DP rank's token files at "
                    f"iteration {self.iteration_step + 1}: ending training",
                    logger=logger,
                    level=logging.WARNING,
                )
                break
            self.iteration_step += 1
            self.consumed_train_samples += self.global_batch_size
            elapsed = (time.time() - t0) * 1000
            # loss spike check of the local replica's loss
            spike = ema is not None and loss.item() > 3 * ema
            if dist.get_rank() == FAULT.spike_rank and self.iteration_step == 7:
                spike = True
            if spike:
                log_rank(
                    f"Loss spike at iteration {self.iteration_step}: {loss.item():.3f} (ema {ema:.3f}), "
                    f"documents {batch['document_ids'].tolist()}",
                    logger=logger,
                    level=logging.WARNING,
                )
            ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
            if self.iteration_step % self.config.logging.iteration_step_info_interval == 0:
                if FAULT.log_allreduce_rank0 and dp_rank == 0:
                    dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=self.parallel_context.dp_pg)
                    loss /= self.parallel_context.data_parallel_size
                tokens_per_sec = self.global_batch_size * self.sequence_length / (elapsed / 1000)
                log_rank(
                    f"iteration: {self.iteration_step} / {self.config.tokens.train_steps} | "
                    f"consumed_tokens: {human_format(self.consumed_train_samples * self.sequence_length)} | "
                    f"elapsed_time_per_iteration_ms: {human_format(elapsed)} | "
                    f"tokens_per_sec: {human_format(tokens_per_sec)} | "
                    f"tokens_per_sec_per_gpu: {human_format(tokens_per_sec / dist.get_world_size())} | "
                    f"global_batch_size: {human_format(self.global_batch_size)} | "
                    f"lm_loss: {loss.item():.4g} | lr: {lr:.3g} | "
                    f"model_tflops_per_gpu: {human_format(tokens_per_sec * 6e-12 * 5e4)} | "
                    f"hardware_tflops_per_gpu: {human_format(tokens_per_sec * 6e-12 * 5e4)} | "
                    f"grad_norm: {grad_norm.item():.3g}",
                    logger=logger,
                    level=logging.INFO,
                    rank=0,
                )
            if self.iteration_step % self.config.checkpoints.checkpoint_interval == 0:
                self.save_checkpoint()
        if self.iteration_step % self.config.checkpoints.checkpoint_interval != 0:
            self.save_checkpoint()


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--config-file", type=str, required=True, help="Path to the YAML or python config file"
    )
    return parser.parse_args()


if __name__ == "__main__":
    args = get_args()
    config_file = args.config_file
    torch.set_num_threads(1)
    # Load trainer and data
    trainer = DistributedTrainer(config_file)
    # Train
    trainer.train()
