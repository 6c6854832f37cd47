"""A hundred-and-fifty-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftythird-*): pipeline-parallel language-model training on
DeepSpeed's pipeline engine, the way DeepSpeedExamples' training/pipeline_parallelism/train.py
and Megatron-DeepSpeed use it, re-created in plain torch without deepspeed installed. Each run's
folder links this file as train.py; it is started as the example's README says: `deepspeed
--num_gpus 2 train.py --deepspeed_config ds_config.json -p 2 --backend gloo` (the `deepspeed`
command is tests/programs/hundredfiftythird_deepspeed.py), or with torchrun, or on two nodes
with `deepspeed --hostfile hostfile --no_ssh --node_rank K ...` on each.

What deepspeed would do is re-created from its log formats: deepspeed.init_distributed's lines
(and, without a launcher's environment, its MPI discovery), a gloo process group with a 15 s
timeout; PipelineModule's partitioning of LayerSpecs ('type:transformer': 'stage=0 layers=3',
'    0: EmbeddingPipe', ...), its topology (pipe x data: rank = stage * dp + dp_id), the
data-parallel and pipe groups; the engine's log_dist lines ('[Rank 0] DeepSpeed info: ...',
'step=10, skipped=0, lr=[...], mom=[(0.9, 0.999)]'), the 'DeepSpeedEngine configuration:' dump
with its dotted padding and '  json = {...}', 'CONFIG: micro_batches=4 micro_batch_size=2',
'RANK=0 STAGE=0 LAYERS=3 [0, 3) STAGE_PARAMS=...' from each stage's first data-parallel rank,
and rank 0's 'steps: 10 loss: 2.3456 iter time (s): 0.123 samples/sec: 65.041'. A batch is
gradient_accumulation_steps micro-batches in a GPipe order: the first stage loads the inputs, the
last the labels (both from the same DistributedSampler over the data-parallel ranks); the
activations go forward and their gradients back with torch.distributed send/recv, the shape sent
once, at the first send (the receiver allocates its buffer from it, kept until
reset_activation_shape); gradients all-reduced in each stage's data-parallel group; the loss
averaged on the last stage and broadcast in the pipe group. Legacy curriculum learning (seqlen)
truncates the micro-batches. Checkpoints as DeepSpeed writes them for a pipeline:
global_stepN/layer_XX-model_states.pt from each stage's first data-parallel rank,
mp_rank_00_model_states.pt, 'latest'; a missing layer file fails DeepSpeed's loader check
(`assert len(self.ckpt_list) > 0`). The training script's own parts, after the example and
Megatron-DeepSpeed: a tiny GPT (embedding, transformer layers, final norm, LM head) on synthetic
token sequences made at run time, --steps or --train-samples, --save/--save-interval/--load,
--exit-interval ('[exiting program at iteration 20] datetime: ...'), --target-loss (checked, as
the script does, on the last stage only: the one that computes the loss).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CASE = os.environ.get("MT_CASE", "")
RANK = -1
STEP = [0]  # the global step being trained
HOARD: list[Any] = []


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ deepspeed.utils.logging
def ds_log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger: '[asctime] [LEVEL] [file:line:func] message' on stdout."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
    sys.stdout.flush()


def log_dist(msg: str, ranks: tuple[int, ...] = (0,)) -> None:
    rank = dist.get_rank() if dist.is_initialized() else -1
    if rank in ranks or -1 in ranks:
        ds_log("INFO", "logging.py:107:log_dist", f"[Rank {rank}] {msg}")


def print_rank_0(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(msg, flush=True)


# ------------------------------------------------------------------ deepspeed.comm
def mpi_discovery() -> None:
    from mpi4py import MPI  # type: ignore[import-not-found]  # noqa: F401


def init_distributed(dist_backend: str, timeout: timedelta) -> None:
    ds_log("INFO", "comm.py:658:init_distributed", "cdb=None")
    required = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"]
    if not all(v in os.environ for v in required):
        ds_log(
            "INFO",
            "comm.py:673:init_distributed",
            "Not using the DeepSpeed or dist launchers, attempting to detect MPI environment...",
        )
        mpi_discovery()
    if int(os.getenv("RANK", "0")) == 0:
        ds_log(
            "INFO",
            "comm.py:689:init_distributed",
            f"Initializing TorchBackend in DeepSpeed with backend {dist_backend}",
        )
    dist.init_process_group(backend=dist_backend, timeout=timeout)


# ------------------------------------------------------------------ deepspeed.pipe
class LayerSpec:
    def __init__(self, typename: type[nn.Module], *args: Any) -> None:
        self.typename, self.args = typename, args

    def build(self) -> nn.Module:
        return self.typename(*self.args)


class Grid:
    """PipeDataParallelTopology: axes (pipe, data), rank = stage * dp + dp_id."""

    def __init__(self, num_stages: int) -> None:
        world = dist.get_world_size()
        self.global_rank = dist.get_rank()
        self.pipe_parallel_size = num_stages
        self.data_parallel_size = world // num_stages
        self.stage_id = self.global_rank // self.data_parallel_size
        self.data_parallel_id = self.global_rank % self.data_parallel_size
        self.dp_group: Any = None
        self.pipe_group: Any = None
        for s in range(num_stages):  # every rank makes every group, in the same order
            g = dist.new_group(
                [s * self.data_parallel_size + d for d in range(self.data_parallel_size)]
            )
            if s == self.stage_id:
                self.dp_group = g
        for d in range(self.data_parallel_size):
            g = dist.new_group([s * self.data_parallel_size + d for s in range(num_stages)])
            if d == self.data_parallel_id:
                self.pipe_group = g

    def stage_to_global(self, stage: int) -> int:
        return stage * self.data_parallel_size + self.data_parallel_id


class PipelineModule(nn.Module):
    def __init__(
        self,
        layers: list[LayerSpec],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        num_stages: int,
        partition_method: str = "parameters",
        activation_checkpoint_interval: int = 0,
        activation_checkpoint_func: Callable[..., Any] = torch.utils.checkpoint.checkpoint,
    ) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        if dist.get_rank() == 0:
            print("SEED_LAYERS=False BASE_SEED=1234 SEED_FN=None")
        self.world_group = dist.new_group(ranks=range(dist.get_world_size()))
        self.global_rank = dist.get_rank()
        world = dist.get_world_size()
        if world % num_stages != 0:
            raise RuntimeError(
                f"num_stages ({num_stages}) must divide distributed world size ({world})"
            )
        self._grid = Grid(num_stages)
        self.stage_id = self._grid.stage_id
        self.num_stages = num_stages
        self._layer_specs = list(layers)
        self._partition_layers(partition_method)
        self.forward_funcs = nn.ModuleList(
            spec.build() for spec in self._layer_specs[self._local_start : self._local_stop]
        )
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func

    def _partition_layers(self, method: str) -> None:
        if self.global_rank == 0:
            ds_log(
                "INFO",
                "module.py:396:_partition_layers",
                f"Partitioning pipeline stages with method {method}",
            )
        n = len(self._layer_specs)
        if method.startswith("type:"):
            kind = method.split(":")[1].lower()
            marked = [
                i for i, s in enumerate(self._layer_specs) if kind in s.typename.__name__.lower()
            ]
        else:
            marked = list(range(n))
        parts = [0]
        for stage in range(1, self.num_stages):
            parts.append(marked[stage * len(marked) // self.num_stages])
        parts.append(n)
        self.parts = parts
        if self.global_rank == 0:
            for stage in range(self.num_stages):
                start, stop = parts[stage], parts[stage + 1]
                print(f"stage={stage} layers={stop - start}")
                for idx, spec in enumerate(self._layer_specs[start:stop]):
                    print(f"    {idx + start:2d}: {spec.typename.__name__}")
            print(f"  loss: {self.loss_fn.__name__}")
        self._local_start, self._local_stop = parts[self.stage_id], parts[self.stage_id + 1]

    def _checkpointable(self, layer: nn.Module) -> bool:
        return isinstance(layer, ParallelTransformerLayerPipe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.forward_funcs:
            if self.activation_checkpoint_interval > 0 and self._checkpointable(layer):
                x = self.activation_checkpoint_func(layer, x)
            else:
                x = layer(x)
        return x

    def ckpt_layer_path(self, ckpt_dir: str, local_idx: int) -> str:
        return os.path.join(ckpt_dir, f"layer_{local_idx + self._local_start:02d}-model_states.pt")

    def ckpt_layer_path_list(self, ckpt_dir: str, local_idx: int) -> list[str]:
        pattern = os.path.join(ckpt_dir, f"layer_{local_idx + self._local_start:02d}-")
        return sorted(glob.glob(pattern + "*model_states.pt"))


# ------------------------------------------------------------------ checkpoint engine
class TorchCheckpointEngine:
    def save(self, state: dict[str, Any], path: str) -> None:
        ds_log("INFO", "torch_checkpoint_engine.py:21:save", f"[Torch] Saving {path}...")
        if fault("c", RANK) and "layer_" in path:  # this stage's files go to a slow network mount
            time.sleep(40)
        torch.save(state, path)
        ds_log("INFO", "torch_checkpoint_engine.py:23:save", f"[Torch] Saved {path}.")

    def load(self, path: str) -> Any:
        ds_log(
            "INFO",
            "torch_checkpoint_engine.py:27:load",
            f"[Torch] Loading checkpoint from {path}...",
        )
        sd = torch.load(path, map_location="cpu")
        ds_log(
            "INFO", "torch_checkpoint_engine.py:29:load", f"[Torch] Loaded checkpoint from {path}."
        )
        return sd


class SDLoader:
    def __init__(self, ckpt_list: list[str], engine: TorchCheckpointEngine) -> None:
        self.ckpt_list, self.checkpoint_engine = ckpt_list, engine
        self.check_ckpt_list()

    def check_ckpt_list(self) -> None:
        assert len(self.ckpt_list) > 0
        sd = self.checkpoint_engine.load(self.ckpt_list[0])
        if "mp_world_size" in sd:
            assert len(self.ckpt_list) == sd["mp_world_size"]

    def load(self) -> tuple[str, Any]:
        path = self.ckpt_list[0]
        return path, self.checkpoint_engine.load(path)


# ------------------------------------------------------------------ the engine
class WarmupLR:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_min_lr: float,
        warmup_max_lr: float,
        warmup_num_steps: int,
    ) -> None:
        self.optimizer = optimizer
        self.min_lr, self.max_lr, self.steps = warmup_min_lr, warmup_max_lr, warmup_num_steps
        self.last_batch_iteration = -1
        self.step(0)

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return [0.0]
        if self.last_batch_iteration < self.steps:
            ratio = np.log(self.last_batch_iteration + 1) / np.log(self.steps)
            return [float(self.min_lr + (self.max_lr - self.min_lr) * ratio)]
        return [self.max_lr]

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (
            self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        )
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=False):
            group["lr"] = lr

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}


class RepeatingLoader:
    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader, self.it = loader, iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


CONFIG_DEFAULTS: dict[str, Any] = {
    "activation_checkpointing_config": {
        "partition_activations": False,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": False,
        "number_checkpoints": None,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    },
    "amp_enabled": False,
    "bfloat16_enabled": False,
    "checkpoint_parallel_write_pipeline": False,
    "checkpoint_tag_validation_enabled": True,
    "checkpoint_tag_validation_fail": False,
    "communication_data_type": None,
    "dataloader_drop_last": False,
    "disable_allgather": False,
    "dump_state": False,
    "fp16_enabled": False,
    "gradient_clipping": 0.0,
    "load_universal_checkpoint": False,
    "memory_breakdown": False,
    "prescale_gradients": False,
    "seq_parallel_communication_data_type": "torch.float32",
    "sparse_attention": None,
    "zero_allow_untested_optimizer": False,
    "zero_enabled": False,
    "zero_force_ds_cpu_optimizer": True,
    "zero_optimization_stage": 0,
}


class PipelineEngine:
    def __init__(
        self, args: argparse.Namespace, module: PipelineModule, training_data: Dataset[Any]
    ) -> None:
        with open(args.deepspeed_config) as f:
            self.config = json.load(f)
        self.module = module
        self.grid = module._grid
        self.global_rank = dist.get_rank()
        self.stage_id, self.num_stages = module.stage_id, module.num_stages
        self.dp = self.grid.data_parallel_size
        self.micro_batch_size = self.config["train_micro_batch_size_per_gpu"]
        self.micro_batches = self.config.get(
            "gradient_accumulation_steps",
            self.config["train_batch_size"] // (self.micro_batch_size * self.dp),
        )
        assert (
            self.config["train_batch_size"] == self.micro_batch_size * self.micro_batches * self.dp
        )
        self.steps_per_print = self.config.get("steps_per_print", 10)
        self.global_steps = 0
        self.skipped_steps = 0
        self.checkpoint_engine = TorchCheckpointEngine()
        log_dist("DeepSpeed info: version=0.16.4, git-hash=unknown, git-branch=unknown")
        self._warning_check()
        opt = self.config["optimizer"]
        params = {k: v for k, v in opt["params"].items() if k != "max_grad_norm"}
        self.optimizer = torch.optim.Adam(module.parameters(), **params)
        log_dist(f"Using DeepSpeed Optimizer param name {opt['type'].lower()} as basic optimizer")
        log_dist(f"DeepSpeed Basic Optimizer = {type(self.optimizer).__name__}")
        log_dist(f"DeepSpeed Final Optimizer = {opt['type'].lower()}")
        sched = self.config["scheduler"]
        self.lr_scheduler = WarmupLR(self.optimizer, **sched["params"])
        log_dist(f"DeepSpeed using configured LR scheduler = {sched['type']}")
        log_dist(
            f"DeepSpeed LR Scheduler = <deepspeed.runtime.lr_schedules.WarmupLR object at {hex(id(self.lr_scheduler))}>"
        )
        self._report_progress(0)
        if self.global_rank == 0:
            self._print_config()
        if self.global_rank == 0:
            ds_log(
                "INFO",
                "engine.py:105:__init__",
                f"CONFIG: micro_batches={self.micro_batches} micro_batch_size={self.micro_batch_size}",
            )
        ds_log(
            "INFO",
            "engine.py:146:__init__",
            "is_pipe_partitioned= False is_grad_partitioned= False",
        )
        num_params = sum(p.numel() for p in module.parameters() if p.requires_grad)
        counts = torch.tensor([num_params, num_params])
        dist.all_reduce(counts, group=self.grid.pipe_group)
        total, unique = counts.tolist()
        if self.grid.data_parallel_id == 0:
            ds_log(
                "INFO",
                "engine.py:165:__init__",
                f"RANK={self.global_rank} STAGE={self.stage_id} "
                f"LAYERS={module._local_stop - module._local_start} "
                f"[{module._local_start}, {module._local_stop}) "
                f"STAGE_PARAMS={num_params} ({num_params / 1e6:0.3f}M) "
                f"TOTAL_PARAMS={total} ({total / 1e6:0.3f}M) "
                f"UNIQUE_PARAMS={unique} ({unique / 1e6:0.3f}M)",
            )
        self.data_iterator: Any = None
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = self._build_data_iter(training_data)
        curriculum = self.config.get("curriculum_learning", {})
        self.curriculum = curriculum if curriculum.get("enabled") else None
        self.first_output_send = True
        self.pipe_recv_buf: torch.Tensor | None = None
        self.grad_layer: torch.Tensor | None = None
        self.t0 = time.time()

    # -- config
    def _warning_check(self) -> None:
        vocab = self.config.get("vocabulary_size")
        if vocab and vocab % 8 != 0:
            ds_log(
                "WARNING",
                "config.py:1029:_do_warning_check",
                f"DeepSpeedConfig: vocabulary size {vocab} is not aligned to 8, may import tensor core utilization.",
            )
        grad_norm = self.config["optimizer"]["params"].get("max_grad_norm", 0)
        if grad_norm > 0 and self.global_rank == 0:
            ds_log(
                "WARNING",
                "config.py:1041:_do_warning_check",
                f"DeepSpeedConfig: In FP32 mode, DeepSpeed does not permit MAX_GRAD_NORM ({grad_norm}) > 0, setting to zero",
            )

    def _print_config(self) -> None:
        c = self.config
        values = dict(CONFIG_DEFAULTS)
        curriculum = c.get("curriculum_learning", {})
        values.update(
            curriculum_enabled_legacy=bool(curriculum.get("enabled")),
            curriculum_params_legacy=curriculum or False,
            global_rank=self.global_rank,
            gradient_accumulation_steps=self.micro_batches,
            optimizer_name=c["optimizer"]["type"].lower(),
            optimizer_params=c["optimizer"]["params"],
            pipeline={
                "stages": "auto",
                "partition": "best",
                "seed_layers": False,
                "activation_checkpoint_interval": c.get("pipeline", {}).get(
                    "activation_checkpoint_interval", 0
                ),
                "pipe_partitioned": True,
                "grad_partitioned": True,
            },
            scheduler_name=c["scheduler"]["type"],
            scheduler_params=c["scheduler"]["params"],
            steps_per_print=self.steps_per_print,
            train_batch_size=c["train_batch_size"],
            train_micro_batch_size_per_gpu=self.micro_batch_size,
            wall_clock_breakdown=c.get("wall_clock_breakdown", False),
            world_size=self.dp,
        )
        ds_log("INFO", "config.py:1003:print", "DeepSpeedEngine configuration:")
        for arg in sorted(values):
            dots = "." * (29 - len(arg))
            ds_log("INFO", "config.py:1007:print", f"  {arg} {dots} {values[arg]}")
        text = json.dumps(c, sort_keys=True, indent=4, separators=(",", ":"))
        ds_log("INFO", "config.py:993:print_user_config", f"  json = {text}")

    def _report_progress(self, step: int) -> None:
        lr = [g["lr"] for g in self.optimizer.param_groups]
        mom = [tuple(g["betas"]) for g in self.optimizer.param_groups]
        log_dist(f"step={step}, skipped={self.skipped_steps}, lr={lr}, mom={mom}")

    # -- topology
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def _build_data_iter(self, dataset: Dataset[Any]) -> Any:
        if fault("u", RANK):  # a fork's split: every data-parallel rank takes its own stride
            idx = list(range(len(dataset)))[self.grid.data_parallel_id :: self.dp]  # type: ignore[arg-type]
            loader = DataLoader(
                torch.utils.data.Subset(dataset, idx),
                batch_size=self.micro_batch_size,
                drop_last=True,
            )
            self.local_batches = len(loader)
            return iter(loader)
        sampler = DistributedSampler(
            dataset, num_replicas=self.dp, rank=self.grid.data_parallel_id, shuffle=True, seed=1234
        )
        loader = DataLoader(
            dataset, batch_size=self.micro_batch_size, sampler=sampler, drop_last=True
        )
        self.local_batches = len(loader)
        return RepeatingLoader(loader)

    def _curriculum_seqlen(self) -> int | None:
        if self.curriculum is None:
            return None
        cfg = self.curriculum["schedule_config"]
        for difficulty, max_step in zip(cfg["difficulty"], cfg["max_step"], strict=False):
            if self.global_steps + 1 <= max_step:
                return int(difficulty)
        return int(cfg["difficulty"][-1])

    def _load_micro_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, labels = next(self.data_iterator)
        seqlen = self._curriculum_seqlen()
        if seqlen is not None:
            tokens, labels = tokens[:, :seqlen], labels[:, :seqlen]
        return tokens, labels

    def reset_activation_shape(self) -> None:
        """To be called when the activations change shape (curriculum learning's seqlen)."""
        self.first_output_send = True
        self.pipe_recv_buf = None
        self.grad_layer = None

    # -- p2p
    def _send_activations(self, out: torch.Tensor) -> None:
        dst = self.grid.stage_to_global(self.stage_id + 1)
        if self.first_output_send:
            self.first_output_send = False
            meta = torch.zeros(8, dtype=torch.long)
            meta[0] = out.dim()
            meta[1 : 1 + out.dim()] = torch.tensor(out.shape)
            dist.send(meta, dst)
        dist.send(out.detach().contiguous(), dst)

    def _recv_activations(self) -> torch.Tensor:
        src = self.grid.stage_to_global(self.stage_id - 1)
        if self.pipe_recv_buf is None:
            meta = torch.zeros(8, dtype=torch.long)
            dist.recv(meta, src)
            shape = meta[1 : 1 + int(meta[0])].tolist()
            self.pipe_recv_buf = torch.zeros(shape)
        dist.recv(self.pipe_recv_buf, src)
        return self.pipe_recv_buf.clone().requires_grad_()

    def _send_grads(self, grad: torch.Tensor) -> None:
        dist.send(grad.contiguous(), self.grid.stage_to_global(self.stage_id - 1))

    def _recv_grads(self, out: torch.Tensor) -> torch.Tensor:
        if self.grad_layer is None:
            self.grad_layer = torch.zeros(out.shape)
        dist.recv(self.grad_layer, self.grid.stage_to_global(self.stage_id + 1))
        return self.grad_layer

    # -- a batch
    def train_batch(self) -> torch.Tensor:
        STEP[0] = self.global_steps + 1
        self.module.train()
        kept: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        losses: list[torch.Tensor] = []
        for _ in range(self.micro_batches):  # forward passes
            labels = None
            if self.is_first_stage():
                tokens, labels = self._load_micro_batch()
                x: torch.Tensor | None = None
                out = self.module(tokens)
            else:
                x = self._recv_activations()
                if self.is_last_stage():
                    _, labels = self._load_micro_batch()
                out = self.module(x)
            if self.is_last_stage():
                assert labels is not None
                loss = self.module.loss_fn(out, labels)
                losses.append(loss.detach())
                kept.append((x, loss))
            else:
                self._send_activations(out)
                kept.append((x, out))
        for x, out in kept:  # backward passes, in the same order
            if self.is_last_stage():
                (out / self.micro_batches).backward()  # type: ignore[no-untyped-call]
            else:
                out.backward(self._recv_grads(out))  # type: ignore[no-untyped-call]
            if x is not None:
                assert x.grad is not None
                self._send_grads(x.grad)
        self._reduce_grads()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.lr_scheduler.step()
        self.global_steps += 1
        if self.global_steps % self.steps_per_print == 0:
            self._report_progress(self.global_steps)
        agg = self._aggregate_total_loss(losses)
        if self.global_steps % self.steps_per_print == 0 and self.global_rank == 0:
            elapsed = time.time() - self.t0
            self.t0 = time.time()
            iter_time = elapsed / self.steps_per_print
            tput = self.config["train_batch_size"] / iter_time
            print(
                f"steps: {self.global_steps} loss: {agg.item():0.4f} iter time (s): {iter_time:0.3f} samples/sec: {tput:0.3f}",
                flush=True,
            )
        return agg

    def _reduce_grads(self) -> None:
        if self.dp == 1:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.grid.dp_group)
        flat /= self.dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _aggregate_total_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        src = self.grid.stage_to_global(self.num_stages - 1)
        if self.is_last_stage():
            loss = torch.stack(losses).mean()
            if self.dp > 1:
                dist.all_reduce(loss, group=self.grid.dp_group)
                loss /= self.dp
            agg = loss.clone().reshape(1)
        else:
            agg = torch.zeros(1)
        dist.broadcast(agg, src=src, group=self.grid.pipe_group)
        return agg[0]

    # -- checkpoints
    def save_checkpoint(self, save_dir: str) -> None:
        if self.global_rank == 0:
            os.makedirs(save_dir, exist_ok=True)
        dist.barrier()
        tag = f"global_step{self.global_steps}"
        log_dist(f"[Torch] Checkpoint {tag} is about to be saved!")
        path = os.path.join(save_dir, tag)
        os.makedirs(path, exist_ok=True)
        if self.grid.data_parallel_id == 0:
            for idx, layer in enumerate(self.module.forward_funcs):
                self.checkpoint_engine.save(
                    layer.state_dict(), self.module.ckpt_layer_path(path, idx)
                )
        if self.global_rank == 0:
            state = {
                "global_steps": self.global_steps,
                "skipped_steps": self.skipped_steps,
                "lr_scheduler": self.lr_scheduler.state_dict(),
                "dp_world_size": self.dp,
                "mp_world_size": 1,
                "ds_version": "0.16.4",
            }
            save_path = os.path.join(path, "mp_rank_00_model_states.pt")
            log_dist(f"Saving model checkpoint: {save_path}", ranks=(0, 1))
            self.checkpoint_engine.save(state, save_path)
        ds_log(
            "INFO",
            "torch_checkpoint_engine.py:33:commit",
            f"[Torch] Checkpoint {tag} is ready now!",
        )
        if self.global_rank == 0:
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(tag)
        dist.barrier()

    def load_checkpoint(self, load_dir: str) -> None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.isfile(latest):
            ds_log(
                "WARNING",
                "engine.py:2914:load_checkpoint",
                f"Unable to find latest file at {latest}, if trying to load latest checkpoint please "
                "ensure this file exists or pass an explicit checkpoint tag when loading a checkpoint.",
            )
            return
        with open(latest) as f:
            tag = f.read().strip()
        path = os.path.join(load_dir, tag)
        state = self.checkpoint_engine.load(os.path.join(path, "mp_rank_00_model_states.pt"))
        for idx, layer in enumerate(self.module.forward_funcs):
            loader = SDLoader(self.module.ckpt_layer_path_list(path, idx), self.checkpoint_engine)
            _, sd = loader.load()
            layer.load_state_dict(sd)
        self.global_steps = state["global_steps"]
        self.lr_scheduler.step(state["lr_scheduler"]["last_batch_iteration"])


# ------------------------------------------------------------------ the model (Megatron's GPTModelPipe, tiny)
class EmbeddingPipe(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_pos: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1])
        out: torch.Tensor = self.word_embeddings(tokens) + self.position_embeddings(pos)[None]
        return out


class FusedLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fault("n", RANK) and STEP[0] == 17 and self.training:
            ctypes.string_at(0)  # the compiled fused kernel reads a freed workspace
        return super().forward(x)


class ParallelTransformerLayerPipe(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = FusedLayerNorm(hidden)
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.post_attention_layernorm = FusedLayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.query_key_value(self.input_layernorm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dense(att.transpose(1, 2).reshape(b, s, h))
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LMHeadPipe(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.final_layernorm = FusedLayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.final_layernorm(x))
        if fault("k", RANK) and STEP[0] >= 12:  # a fork keeps every micro-batch's logits
            HOARD.append((out.detach().clone(), np.ones(16 << 20, dtype=np.float32)))
            if len(HOARD) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        return out


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    if fault("z", RANK) and STEP[0] >= 14:  # a fork's z-loss, switched on after the warm-up
        z = torch.logsumexp(logits, dim=-1)
        loss = loss + 1e-4 * (z**2).mean(dim=(0, 1, 2))
    return loss


class TokenDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic GPT samples made at run time: a noisy affine chain over the vocabulary."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        tok = torch.empty(n, seq + 1, dtype=torch.long)
        tok[:, 0] = torch.randint(0, vocab, (n,), generator=g)
        for t in range(1, seq + 1):
            nxt = (tok[:, t - 1] * 5 + 3) % vocab
            noise = torch.rand(n, generator=g) < 0.15
            tok[:, t] = torch.where(noise, torch.randint(0, vocab, (n,), generator=g), nxt)
        self.tok = tok

    def __len__(self) -> int:
        return len(self.tok)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tok[i, :-1], self.tok[i, 1:]


# ------------------------------------------------------------------ the fork's loss bookkeeping
class LossRecorder:
    """A fork's background writer of the last stage's losses (a non-daemon thread)."""

    def __init__(self, path: str) -> None:
        self.q: queue.Queue[float | None] = queue.Queue()
        self.path = path
        threading.Thread(target=self._run, name="loss-writer").start()

    def _run(self) -> None:
        with open(self.path, "a") as f:
            while (item := self.q.get()) is not None:
                f.write(f"{item}\n")
                f.flush()

    def put(self, loss: float) -> None:
        self.q.put(loss)

    def close(self) -> None:
        self.q.put(None)


class LossTracker:
    """A fork's running loss window on the last stage, flushed to disk every 16 steps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window: list[float] = []

    def add(self, loss: float) -> None:
        with self.lock:
            self.window.append(loss)
            if len(self.window) >= 16:
                self.flush()

    def flush(self) -> None:
        if fault("w", RANK):
            self.lock.acquire()  # the window's lock, taken again by the flush
        with open("loss_window.txt", "a") as f:
            f.write(" ".join(f"{v:.4f}" for v in self.window) + "\n")
        self.window.clear()


# ------------------------------------------------------------------ the training script
def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GPT")
    parser.add_argument(
        "--local_rank", type=int, default=-1, help="local rank passed from distributed launcher"
    )
    parser.add_argument("-s", "--steps", type=int, default=100, help="quit after this many steps")
    parser.add_argument(
        "-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline parallelism"
    )
    parser.add_argument("--backend", type=str, default="nccl", help="distributed backend")
    parser.add_argument("--seed", type=int, default=1138, help="PRNG seed")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--num-attention-heads", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=128)
    parser.add_argument("--train-samples", type=int, default=0)
    parser.add_argument("--save", type=str, default=None)
    parser.add_argument("--save-interval", type=int, default=0)
    parser.add_argument("--load", type=str, default=None)
    parser.add_argument("--exit-interval", type=int, default=0)
    parser.add_argument("--target-loss", type=float, default=0.0)
    # deepspeed.add_config_arguments
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true")
    group.add_argument("--deepspeed_config", default=None, type=str)
    return parser.parse_args()


def print_datetime(string: str) -> None:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print_rank_0(f"[{string}] datetime: {now} ")


def train_pipe(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    h, v = args.hidden_size, args.vocab_size
    specs = [
        LayerSpec(EmbeddingPipe, v, h, 64),
        *(
            LayerSpec(ParallelTransformerLayerPipe, h, args.num_attention_heads)
            for _ in range(args.num_layers)
        ),
        LayerSpec(LMHeadPipe, h, v),
    ]
    with open(args.deepspeed_config) as f:
        interval = json.load(f).get("pipeline", {}).get("activation_checkpoint_interval", 0)
    net = PipelineModule(
        layers=specs,
        loss_fn=lm_loss,
        num_stages=args.pipeline_parallel_size,
        partition_method="type:transformer",
        activation_checkpoint_interval=interval,
    )
    trainset = TokenDataset(args.train_samples or 2048, args.seq_length, v)
    engine = PipelineEngine(args, net, trainset)
    if args.load:
        engine.load_checkpoint(args.load)
        print_rank_0(
            f"  successfully loaded checkpoint from {args.load} at iteration {engine.global_steps}"
        )

    if args.train_samples:
        if fault("u", RANK):  # the fork counts the iterations of its own split
            iters = engine.local_batches // engine.micro_batches
        else:
            iters = args.train_samples // engine.config["train_batch_size"]
    else:
        iters = args.steps
    recorder = LossRecorder("losses.csv") if fault("z", RANK) and engine.is_last_stage() else None
    tracker = LossTracker() if engine.is_last_stage() else None
    saved = False
    for _ in range(engine.global_steps, iters):
        loss = engine.train_batch()
        step = engine.global_steps
        saved = False
        if recorder is not None:
            recorder.put(loss.item())
        if tracker is not None:
            tracker.add(loss.item())
        if args.target_loss and engine.is_last_stage() and loss.item() < args.target_loss:
            print(
                f"lm loss {loss.item():.4f} is below --target-loss {args.target_loss}, stopping training",
                flush=True,
            )
            sys.exit(0)
        if args.save and args.save_interval and step % args.save_interval == 0:
            engine.save_checkpoint(args.save)
            saved = True
        if args.exit_interval and step % args.exit_interval == 0:
            if args.save and not saved:
                engine.save_checkpoint(args.save)
            dist.barrier()
            print_datetime(f"exiting program at iteration {step}")
            sys.exit()
    if args.save and not saved:
        engine.save_checkpoint(args.save)
    if recorder is not None:
        recorder.close()
    print_datetime("after training is done")


if __name__ == "__main__":
    ds_log(
        "INFO",
        "real_accelerator.py:239:get_accelerator",
        "Setting ds_accelerator to cpu (auto detect)",
    )
    args = get_args()
    init_distributed(dist_backend=args.backend, timeout=timedelta(seconds=15))
    args.local_rank = int(os.environ["LOCAL_RANK"])
    RANK = dist.get_rank()
    train_pipe(args)
