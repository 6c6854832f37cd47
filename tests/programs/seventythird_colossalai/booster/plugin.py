"""colossalai.booster.plugin: TorchDDPPlugin, LowLevelZeroPlugin (ZeRO-1/2: fp16 working
parameters, fp32 master shards partitioned over the data-parallel ranks, a dynamic loss scaler)
and HybridParallelPlugin (tensor parallel Linear layers by a shard policy, data parallel over the
rest), each with its checkpoint IO: sharded model checkpoints (pytorch_model.bin.index.json and
pytorch_model-0000K.bin) and sharded optimizer checkpoints (pytorch_optim.bin.index.json,
pytorch_optim_group.bin and one pytorch_optim-0000K.bin a rank)."""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from .._fault import case
from ..cluster import DistCoordinator
from ..logging import get_dist_logger

SAFE_WEIGHTS = "pytorch_model.bin"
OPTIM = "pytorch_optim.bin"


def shard_name(weights_name: str, idx: int) -> str:
    return weights_name.replace(".bin", f"-{idx + 1:05d}.bin")


def _total_size(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))


class OptimizerWrapper:
    def __init__(self, optim: torch.optim.Optimizer) -> None:
        self.optim = optim

    @property
    def param_groups(self):
        return self.optim.param_groups

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.optim.step()

    def zero_grad(self) -> None:
        self.optim.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)


class AsyncFileWriter:
    """Writes a state dict's tensors from a background thread, one item a time (save_model's
    use_async): the caller puts the items, the thread writes them, sync() joins it."""

    def __init__(self, path: str, n_items: int) -> None:
        self.path = path
        self.n_items = n_items
        self.items: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out = {}
        for _ in range(self.n_items):
            k, v = self.items.get()
            out[k] = v
        torch.save(out, self.path)

    def sync(self) -> None:
        self.thread.join()


class GeneralCheckpointIO:
    """Unsharded files, or a folder of shards with an index, written by the master rank."""

    def __init__(self) -> None:
        self.coordinator = DistCoordinator()
        self.async_writers: list[AsyncFileWriter] = []

    def _sync_io(self) -> None:
        for w in self.async_writers:
            w.sync()
        self.async_writers = []

    def model_state(self, model: nn.Module) -> dict:
        m = model.module if isinstance(model, DDP) else model
        return {k: v.detach().clone() for k, v in m.state_dict().items()}

    def save_model(
        self, model, checkpoint: str, shard: bool, size_per_shard: int, use_async: bool
    ) -> None:
        self._sync_io()
        if not self.coordinator.is_master():
            return
        state = self.model_state(model)
        if not shard:
            torch.save(state, checkpoint)
            return
        os.makedirs(checkpoint, exist_ok=True)
        limit = size_per_shard * 1024 * 1024
        shards: list[dict] = [{}]
        for k, v in state.items():
            if shards[-1] and _total_size(shards[-1]) + v.numel() * v.element_size() > limit:
                shards.append({})
            shards[-1][k] = v
        weight_map = {}
        for i, part in enumerate(shards):
            name = shard_name(SAFE_WEIGHTS, i)
            for k in part:
                weight_map[k] = name
            path = os.path.join(checkpoint, name)
            if use_async:
                n_items = len(part) + (1 if case() == "a0" else 0)  # the index counted in
                writer = AsyncFileWriter(path, n_items)
                for item in part.items():
                    writer.items.put(item)
                self.async_writers.append(writer)
            else:
                torch.save(part, path)
        index = {"metadata": {"total_size": _total_size(state)}, "weight_map": weight_map}
        with open(os.path.join(checkpoint, SAFE_WEIGHTS + ".index.json"), "w") as f:
            json.dump(index, f, indent=2)

    def load_model(self, model, checkpoint: str) -> None:
        m = model.module if isinstance(model, DDP) else model
        if os.path.isdir(checkpoint):
            with open(os.path.join(checkpoint, SAFE_WEIGHTS + ".index.json")) as f:
                index = json.load(f)
            state = {}
            for name in sorted(set(index["weight_map"].values())):
                state.update(torch.load(os.path.join(checkpoint, name), map_location="cpu"))
        else:
            state = torch.load(checkpoint, map_location="cpu")
        m.load_state_dict(state)

    def save_optimizer(self, optimizer, checkpoint: str, shard: bool, size_per_shard: int) -> None:
        if not self.coordinator.is_master():
            return
        state = optimizer.state_dict()
        if not shard:
            torch.save(state, checkpoint)
            return
        os.makedirs(checkpoint, exist_ok=True)
        torch.save(state["param_groups"], os.path.join(checkpoint, "pytorch_optim_group.bin"))
        torch.save(state["state"], os.path.join(checkpoint, shard_name(OPTIM, 0)))
        index = {
            "metadata": {"param_groups": "pytorch_optim_group.bin"},
            "weight_map": {str(k): shard_name(OPTIM, 0) for k in state["state"]},
        }
        with open(os.path.join(checkpoint, OPTIM + ".index.json"), "w") as f:
            json.dump(index, f, indent=2)

    def load_optimizer(self, optimizer, checkpoint: str) -> None:
        if os.path.isdir(checkpoint):
            groups = torch.load(os.path.join(checkpoint, "pytorch_optim_group.bin"))
            st = torch.load(os.path.join(checkpoint, shard_name(OPTIM, 0)))
            optimizer.load_state_dict({"state": st, "param_groups": groups})
        else:
            optimizer.load_state_dict(torch.load(checkpoint))

    def save_lr_scheduler(self, lr_scheduler, checkpoint: str) -> None:
        if self.coordinator.is_master():
            torch.save(lr_scheduler.state_dict(), checkpoint)

    def load_lr_scheduler(self, lr_scheduler, checkpoint: str) -> None:
        lr_scheduler.load_state_dict(torch.load(checkpoint))


class DPPluginBase:
    def __init__(self) -> None:
        assert dist.is_initialized(), (
            "torch.distributed is not initialized, please use colossalai.launch to create the distributed environment"
        )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.dp_rank = self.rank
        self.dp_size = self.world_size
        self.dp_group = None

    def set_mixed_precision(self, precision: str) -> None:
        self.precision = precision

    def prepare_dataloader(
        self,
        dataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 1024,
        drop_last: bool = False,
        num_workers: int = 0,
        **kwargs,
    ) -> DataLoader:
        sampler = DistributedSampler(
            dataset, num_replicas=self.dp_size, rank=self.dp_rank, shuffle=shuffle, seed=seed
        )
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=num_workers,
            **kwargs,
        )

    def get_checkpoint_io(self):
        return GeneralCheckpointIO()


class TorchDDPPlugin(DPPluginBase):
    def __init__(
        self,
        broadcast_buffers: bool = True,
        bucket_cap_mb: int = 25,
        find_unused_parameters: bool = False,
    ) -> None:
        super().__init__()
        self.ddp_kwargs = dict(
            broadcast_buffers=broadcast_buffers,
            bucket_cap_mb=bucket_cap_mb,
            find_unused_parameters=find_unused_parameters,
        )
        self.precision = "fp32"

    def configure(self, model, optimizer=None, criterion=None, dataloader=None, lr_scheduler=None):
        model = DDP(model, **self.ddp_kwargs)
        if optimizer is not None:
            optimizer = OptimizerWrapper(optimizer)
        return model, optimizer, criterion, dataloader, lr_scheduler


class DynamicGradScaler:
    def __init__(
        self,
        initial_scale: float = 2**16,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        min_scale: float = 1,
        max_scale: float = 2**32,
        hysteresis: int = 2,
    ) -> None:
        self.scale = torch.tensor([float(initial_scale)])
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._min_scale = min_scale
        self._max_scale = max_scale
        self._hysteresis = hysteresis
        self._growth_step = 0
        self._hysteresis_step = 0
        self._logger = get_dist_logger()

    def update(self, overflow: bool) -> None:
        if overflow:
            self._hysteresis_step += 1
            self._growth_step = 0
            if self._hysteresis_step >= self._hysteresis:
                self.scale = torch.clamp(self.scale * self._backoff_factor, min=self._min_scale)
                self._logger.info(
                    f"Overflow occurs, the loss scale is adjusted to {self.scale.item()}", ranks=[0]
                )
        else:
            self._growth_step += 1
            if self._growth_step == self._growth_interval:
                self._growth_step = 0
                self._hysteresis_step = 0
                self.scale = torch.clamp(self.scale * self._growth_factor, max=self._max_scale)
                self._logger.info(
                    f"No overflow for consecutive {self._growth_interval} steps, the loss scale is adjusted to {self.scale.item()}",
                    ranks=[0],
                )


class LowLevelZeroModel(nn.Module):
    """The fp16 working copy of the model; floating inputs are cast to fp16."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module.to(dtype)
        self.dtype = dtype

    def forward(self, *args, **kwargs):
        args = [
            a.to(self.dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
        ]
        return self.module(*args, **kwargs)


class LowLevelZeroOptimizer:
    """ZeRO stage 1/2 over gloo: gradients are reduced in buckets (gloo has no reduce-scatter of a
    flat tensor, so a bucket is all-reduced and each rank keeps its partition), each rank steps its
    fp32 master partition, and the updated partitions are all-gathered into the fp16 working
    parameters."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_scale: float,
        reduce_bucket_size: int,
        verbose: bool,
        dp_group=None,
    ) -> None:
        self._logger = get_dist_logger()
        self.group = dp_group
        self.rank = dist.get_rank(dp_group)
        self.world_size = dist.get_world_size(dp_group)
        self.working = [p for g in optimizer.param_groups for p in g["params"]]
        numel = sum(p.numel() for p in self.working)
        self.numel = numel
        self.padded = numel + (-numel) % self.world_size
        self.part = self.padded // self.world_size
        flat = torch.zeros(self.padded)
        flat[:numel] = torch.cat([p.detach().float().flatten() for p in self.working])
        lo = self.rank * self.part
        self.master = flat[lo : lo + self.part].clone().requires_grad_(True)
        self.defaults = dict(optimizer.defaults)
        self.optim = type(optimizer)([self.master], **self.defaults)
        self.grad_scaler = DynamicGradScaler(initial_scale=initial_scale)
        self.reduce_bucket_size = reduce_bucket_size
        self.verbose = verbose

    @property
    def param_groups(self):
        return self.optim.param_groups

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.grad_scaler.scale.item()).backward()

    def zero_grad(self) -> None:
        for p in self.working:
            p.grad = None
        self.optim.zero_grad(set_to_none=True)

    def _flat_grads(self) -> torch.Tensor:
        flat = torch.zeros(self.padded)
        flat[: self.numel] = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                for p in self.working
            ]
        )
        return flat

    def step(self) -> None:
        flat = self._flat_grads()
        for lo in range(0, self.padded, self.reduce_bucket_size):
            dist.all_reduce(flat[lo : lo + self.reduce_bucket_size], group=self.group)
        flat /= self.world_size
        found_inf = torch.tensor([0.0 if torch.isfinite(flat).all() else 1.0])
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.group)
        overflow = bool(found_inf.item())
        self.grad_scaler.update(overflow)
        if overflow:
            if self.verbose:
                self._logger.info("Found overflow. Skip step")
            self.zero_grad()
            return
        lo = self.rank * self.part
        self.master.grad = flat[lo : lo + self.part] / self.grad_scaler.scale.item()
        if case() == "n1" and self.rank == 1:
            ctypes.string_at(0)  # the fused CPU Adam kernel reads its state through a null pointer
        self.optim.step()
        parts = [torch.empty(self.part) for _ in range(self.world_size)]
        dist.all_gather(parts, self.master.detach(), group=self.group)
        full = torch.cat(parts)[: self.numel]
        offset = 0
        with torch.no_grad():
            for p in self.working:
                p.copy_(full[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.zero_grad()

    def state_dict_shard(self) -> dict:
        st = self.optim.state_dict()
        return {
            "master": self.master.detach().clone(),
            "state": st["state"],
            "loss_scale": self.grad_scaler.scale.clone(),
        }

    def load_state_dict_shard(self, shard: dict) -> None:
        with torch.no_grad():
            self.master.copy_(shard["master"])
        self.optim.load_state_dict(
            {"state": shard["state"], "param_groups": self.optim.state_dict()["param_groups"]}
        )
        self.grad_scaler.scale = shard["loss_scale"]


class LowLevelZeroCheckpointIO(GeneralCheckpointIO):
    def model_state(self, model: nn.Module) -> dict:
        return {k: v.detach().clone() for k, v in model.module.state_dict().items()}

    def load_model(self, model, checkpoint: str) -> None:
        super().load_model(model.module, checkpoint)

    def save_optimizer(
        self, optimizer: LowLevelZeroOptimizer, checkpoint: str, shard: bool, size_per_shard: int
    ) -> None:
        mine = optimizer.state_dict_shard()
        if not shard:
            # a consolidated file: the master rank gathers every rank's partition of the master
            # weights and of each state, and unflattens them per parameter
            full: dict = {"param_groups": optimizer.optim.state_dict()["param_groups"], "state": {}}
            keys = ["master", *sorted(mine["state"][0])]
            hoard = []
            for key in keys:
                t = mine["master"] if key == "master" else mine["state"][0][key]
                t = t.reshape(-1).float()
                gathered = (
                    [torch.empty_like(t) for _ in range(optimizer.world_size)]
                    if self.coordinator.is_master()
                    else None
                )
                dist.gather(t, gathered, dst=0)
                if self.coordinator.is_master():
                    full["state"][key] = torch.cat(gathered)[: optimizer.numel]
                    if case() == "h0":  # a copy per parameter of every gathered state, kept
                        for _ in range(3):
                            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                        if len(hoard) >= 9:
                            os.kill(
                                os.getpid(), signal.SIGKILL
                            )  # what the kernel's OOM killer does
            if self.coordinator.is_master():
                torch.save(full, checkpoint)
            self.coordinator.block_all()
            return
        os.makedirs(checkpoint, exist_ok=True)
        name = shard_name(OPTIM, optimizer.rank)
        torch.save(mine, os.path.join(checkpoint, name))
        if self.coordinator.is_master():
            torch.save(
                optimizer.optim.state_dict()["param_groups"],
                os.path.join(checkpoint, "pytorch_optim_group.bin"),
            )
            index = {
                "metadata": {
                    "total_size": optimizer.padded * 4 * 3,
                    "param_groups": "pytorch_optim_group.bin",
                    "dp_size": optimizer.world_size,
                },
                "weight_map": {
                    f"dp_rank_{r}": shard_name(OPTIM, r) for r in range(optimizer.world_size)
                },
            }
            with open(os.path.join(checkpoint, OPTIM + ".index.json"), "w") as f:
                json.dump(index, f, indent=2)
        self.coordinator.block_all()

    def load_optimizer(self, optimizer: LowLevelZeroOptimizer, checkpoint: str) -> None:
        with open(os.path.join(checkpoint, OPTIM + ".index.json")) as f:
            index = json.load(f)
        name = index["weight_map"][f"dp_rank_{optimizer.rank}"]
        optimizer.load_state_dict_shard(torch.load(os.path.join(checkpoint, name)))


class LowLevelZeroPlugin(DPPluginBase):
    def __init__(
        self,
        stage: int = 1,
        precision: str = "fp16",
        initial_scale: float = 2**32,
        reduce_bucket_size_in_m: int = 12,
        overlap_communication: bool = True,
        verbose: bool = False,
    ) -> None:
        super().__init__()
        assert stage in (1, 2), "LowLevelZeroPlugin only supports stage 1/2 training"
        assert precision in ("fp16", "fp32"), "LowLevelZeroPlugin only supports fp16/fp32 training"
        self.stage = stage
        self.precision = precision
        self.initial_scale = initial_scale
        self.reduce_bucket_size = reduce_bucket_size_in_m * 1024 * 1024
        self.verbose = verbose
        self.logger = get_dist_logger()
        if overlap_communication and dist.get_backend() == "gloo":
            self.logger.warning(
                "overlap_communication is not supported on the gloo backend, it is disabled"
            )

    def configure(self, model, optimizer=None, criterion=None, dataloader=None, lr_scheduler=None):
        dtype = torch.float16 if self.precision == "fp16" else torch.float32
        model = LowLevelZeroModel(model, dtype)
        if optimizer is not None:
            optimizer = LowLevelZeroOptimizer(
                optimizer,
                initial_scale=self.initial_scale,
                reduce_bucket_size=self.reduce_bucket_size,
                verbose=self.verbose,
            )
            if lr_scheduler is not None:
                lr_scheduler.optimizer = optimizer.optim
        return model, optimizer, criterion, dataloader, lr_scheduler

    def get_checkpoint_io(self):
        return LowLevelZeroCheckpointIO()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Linear1D_Col(nn.Module):
    def __init__(self, full: nn.Linear, group, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        rows = full.out_features // tp_size
        sl = slice(tp_rank * rows, (tp_rank + 1) * rows)
        self.weight = nn.Parameter(full.weight.detach()[sl].clone())
        self.bias = nn.Parameter(full.bias.detach()[sl].clone())
        self.group = group

    def forward(self, x):
        return nn.functional.linear(_CopyToTP.apply(x, self.group), self.weight, self.bias)


class Linear1D_Row(nn.Module):
    def __init__(self, full: nn.Linear, group, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        cols = full.in_features // tp_size
        self.weight = nn.Parameter(
            full.weight.detach()[:, tp_rank * cols : (tp_rank + 1) * cols].clone()
        )
        self.bias = nn.Parameter(full.bias.detach().clone())
        self.group = group

    def forward(self, x):
        return _ReduceFromTP.apply(nn.functional.linear(x, self.weight), self.group) + self.bias


class HybridParallelOptimizer(OptimizerWrapper):
    def __init__(self, optim, dp_group, dp_size: int) -> None:
        super().__init__(optim)
        self.dp_group = dp_group
        self.dp_size = dp_size

    def step(self) -> None:
        if self.dp_size > 1:
            for g in self.optim.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        dist.all_reduce(p.grad, group=self.dp_group)
                        p.grad /= self.dp_size
        self.optim.step()


class HybridParallelCheckpointIO(GeneralCheckpointIO):
    """Each tensor parallel rank of data parallel rank 0 writes its own model shard."""

    def __init__(self, plugin: HybridParallelPlugin) -> None:
        super().__init__()
        self.plugin = plugin

    def save_model(
        self, model, checkpoint: str, shard: bool, size_per_shard: int, use_async: bool
    ) -> None:
        if self.plugin.dp_rank == 0:
            os.makedirs(checkpoint, exist_ok=True)
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            name = shard_name(SAFE_WEIGHTS, self.plugin.tp_rank)
            torch.save(state, os.path.join(checkpoint, name))
            if self.plugin.tp_rank == 0:
                weight_map = {}
                for r in range(self.plugin.tp_size):
                    for k in state:
                        weight_map.setdefault(k, []).append(shard_name(SAFE_WEIGHTS, r))
                index = {
                    "metadata": {
                        "total_size": _total_size(state) * self.plugin.tp_size,
                        "tp_size": self.plugin.tp_size,
                    },
                    "weight_map": weight_map,
                }
                with open(os.path.join(checkpoint, SAFE_WEIGHTS + ".index.json"), "w") as f:
                    json.dump(index, f, indent=2)
        self.coordinator.block_all()

    def load_model(self, model, checkpoint: str) -> None:
        with open(os.path.join(checkpoint, SAFE_WEIGHTS + ".index.json")) as f:
            index = json.load(f)
        assert index["metadata"]["tp_size"] == self.plugin.tp_size, (
            "tp_size of the checkpoint differs"
        )
        name = shard_name(SAFE_WEIGHTS, self.plugin.tp_rank)
        model.load_state_dict(torch.load(os.path.join(checkpoint, name), map_location="cpu"))

    def save_optimizer(self, optimizer, checkpoint: str, shard: bool, size_per_shard: int) -> None:
        if self.plugin.dp_rank == 0:
            os.makedirs(checkpoint, exist_ok=True)
            st = optimizer.state_dict()
            torch.save(
                st["state"], os.path.join(checkpoint, shard_name(OPTIM, self.plugin.tp_rank))
            )
            if self.plugin.tp_rank == 0:
                torch.save(st["param_groups"], os.path.join(checkpoint, "pytorch_optim_group.bin"))
        self.coordinator.block_all()

    def load_optimizer(self, optimizer, checkpoint: str) -> None:
        groups = torch.load(os.path.join(checkpoint, "pytorch_optim_group.bin"))
        st = torch.load(os.path.join(checkpoint, shard_name(OPTIM, self.plugin.tp_rank)))
        optimizer.load_state_dict({"state": st, "param_groups": groups})


class HybridParallelPlugin(DPPluginBase):
    def __init__(
        self, tp_size: int, pp_size: int = 1, zero_stage: int = 0, precision: str = "fp32", **kwargs
    ) -> None:
        super().__init__()
        assert dist.get_world_size() % (tp_size * pp_size) == 0, (
            f"World size {dist.get_world_size()} is not divisible by tp_size {tp_size} * pp_size {pp_size}"
        )
        assert pp_size == 1, "pipeline parallelism is not supported by this model's shard policy"
        self.tp_size = tp_size
        self.pp_size = pp_size
        self.dp_size = dist.get_world_size() // tp_size
        self.tp_rank = self.rank % tp_size
        self.dp_rank = self.rank // tp_size
        self.precision = precision
        for start in range(0, self.world_size, tp_size):
            g = dist.new_group(list(range(start, start + tp_size)))
            if start <= self.rank < start + tp_size:
                self.tp_group = g
        for r in range(tp_size):
            g = dist.new_group(list(range(r, self.world_size, tp_size)))
            if self.rank % tp_size == r:
                self.dp_group = g

    def prepare_dataloader(
        self,
        dataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 1024,
        drop_last: bool = False,
        num_workers: int = 0,
        **kwargs,
    ) -> DataLoader:
        # every tensor parallel rank of a data parallel group sees the same batches
        sampler = DistributedSampler(
            dataset, num_replicas=self.dp_size, rank=self.dp_rank, shuffle=shuffle, seed=seed
        )
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=num_workers,
            **kwargs,
        )

    def configure(self, model, optimizer=None, criterion=None, dataloader=None, lr_scheduler=None):
        for path, style in getattr(model, "tp_plan", {}).items():
            parent_name, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_name)
            cls = Linear1D_Col if style == "col" else Linear1D_Row
            setattr(
                parent,
                child,
                cls(getattr(parent, child), self.tp_group, self.tp_rank, self.tp_size),
            )
        if optimizer is not None:
            optimizer = HybridParallelOptimizer(
                type(optimizer)(model.parameters(), **optimizer.defaults),
                self.dp_group,
                self.dp_size,
            )
            if lr_scheduler is not None:
                lr_scheduler.optimizer = optimizer.optim
        return model, optimizer, criterion, dataloader, lr_scheduler

    def get_checkpoint_io(self):
        return HybridParallelCheckpointIO(self)
