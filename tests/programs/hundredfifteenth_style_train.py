"""A hundred-and-fifteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfifteenth-*): pretraining a language model in the way of AI2's OLMo
trainer (scripts/train.py of github.com/allenai/OLMo), re-created in plain torch in one file
without olmo installed. As there: `torchrun --nproc_per_node=2 scripts/train.py
configs/tiny/OLMo-20M.yaml --save_folder=runs/olmo-tiny --save_overwrite` with dotted overrides
(--optimizer.learning_rate=4e-4, --global_train_batch_size=16, --evaluators.1.enabled=true)
merged into a TrainConfig read from YAML; prepare_cli_environment()'s logging (a record format
with the host and the local rank in every record, time, host:local_rank, logger:line, level and
message separated by tabs; the non-zero local ranks pass WARNING and above only) and its
excepthook (an OLMoError prints as 'OLMoConfigurationError: ...' without a traceback, any other
exception is logged as 'Uncaught X: ...' at CRITICAL with the traceback); the configuration saved
to <save_folder>/config.yaml by rank 0 (OLMoConfigurationError when it exists and
--save_overwrite is not given); a memmap token dataset (data.paths: .npy files of uint16 token
ids, the number of tokens read from each header, each file memory-mapped when a chunk of it is
first asked for, fixed-length chunks of max_sequence_length); the global indices permuted and
saved by rank 0 (train_data/global_indices.npy), each rank taking every world_size-th; the global
batch split into device batches and micro-batches (device_train_microbatch_size) with gradient
accumulation; a tiny causal transformer wrapped as FSDP would shard it, re-created as DDP with
the AdamW state sharded over the ranks (each rank updates its slice of the flat parameters and
all-gathers them); OLMo's metric blocks ('[step=10/40]' then '    train/CrossEntropyLoss=...'
lines), 'Saving checkpoint...' / 'Checkpoint saved to runs/olmo-tiny/step10', the pre-train
checkpoint and its reload, an in-loop perplexity evaluator and a downstream evaluator, the
time_limit cancel ('Run canceled due to time limit reached'), 'Training complete'. Added the way
users add them: document lengths per row, an instance filter that drops repetitive instances, a
downstream evaluator run on rank 0 only, optimizer metrics gathered when they are logged.
`train.py prepare DIR` writes the synthetic token files. gloo on CPU, 15 s collective timeout. A
fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfifteenth.sh after any edit).
"""

# ruff: noqa: SIM108 (OLMo's own code, as it is written)

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("train")
trainer_log = logging.getLogger("olmo.train")
ckpt_log = logging.getLogger("olmo.checkpoint")
data_log = logging.getLogger("olmo.data.memmap_dataset")
eval_log = logging.getLogger("olmo.eval")


def fault():
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ---------------------------------------------------------------- olmo/exceptions.py
class OLMoError(Exception):
    """Base class for all custom OLMo exceptions."""


class OLMoConfigurationError(OLMoError):
    """An error with a configuration file."""


class OLMoCliError(OLMoError):
    """An error from incorrect CLI usage."""


# ---------------------------------------------------------------- olmo/util.py
def get_global_rank():
    return int(os.environ.get("RANK") or dist.get_rank())


def get_local_rank():
    return int(os.environ.get("LOCAL_RANK") or 0)


def get_world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier():
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


_log_extra_fields = {}


def setup_logging():
    _log_extra_fields["hostname"] = socket.gethostname()
    _log_extra_fields["local_rank"] = get_local_rank()
    old_factory = logging.getLogRecordFactory()

    def record_factory(*args, **kwargs):
        record = old_factory(*args, **kwargs)
        for k, v in _log_extra_fields.items():
            setattr(record, k, v)
        return record

    logging.setLogRecordFactory(record_factory)
    handler = logging.StreamHandler(sys.stdout)
    formatter = logging.Formatter(
        "%(asctime)s\t%(hostname)s:%(local_rank)s\t%(name)s:%(lineno)s\t%(levelname)s\t%(message)s"
    )
    formatter.default_time_format = "%Y-%m-%d %H:%M:%S"
    formatter.default_msec_format = "%s.%03d"
    handler.setFormatter(formatter)

    def rank0_filter(record):
        if record.levelno > logging.INFO:
            return 1
        if getattr(record, "local_rank", 0) == 0:
            return 1
        return 0

    handler.addFilter(rank0_filter)
    logging.basicConfig(handlers=[handler], level=logging.INFO)
    logging.captureWarnings(True)
    logging.getLogger("urllib3").setLevel(logging.ERROR)


def excepthook(exctype, value, traceback):
    """Used to patch `sys.excepthook` in order to log exceptions."""
    if issubclass(exctype, KeyboardInterrupt):
        sys.__excepthook__(exctype, value, traceback)
    elif issubclass(exctype, OLMoCliError):
        print(value, flush=True)
    elif issubclass(exctype, OLMoError):
        # rich.get_console().print(Text(f"{exctype.__name__}:", style="red"), value)
        print(f"{exctype.__name__}: {value}", flush=True)
    else:
        log.critical(
            "Uncaught %s: %s", exctype.__name__, value, exc_info=(exctype, value, traceback)
        )


def prepare_cli_environment():
    setup_logging()
    sys.excepthook = excepthook
    warnings.filterwarnings("ignore", message="TypedStorage is deprecated")


def clean_opt(arg):
    if "=" not in arg:
        arg = f"{arg}=True"
    name, val = arg.split("=", 1)
    name = name.strip("-").replace("-", "_")
    return f"{name}={val}"


def format_float(value):
    if value < 0.0001:
        return str(value)
    elif value > 1000:
        return f"{int(value):,d}"
    elif value > 100:
        return f"{value:.1f}"
    elif value > 10:
        return f"{value:.2f}"
    elif value > 1:
        return f"{value:.3f}"
    return f"{value:.4f}"


def peak_gpu_memory():
    return 0


# ---------------------------------------------------------------- olmo/config.py
class TrainConfig(dict):
    """The YAML file merged with dotted overrides (omegaconf's dotlist, in short)."""

    def __getattr__(self, name):
        try:
            v = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return TrainConfig(v) if isinstance(v, dict) and not isinstance(v, TrainConfig) else v

    def __setattr__(self, name, value):
        self[name] = value

    @classmethod
    def load(cls, path, overrides):
        with open(path) as f:
            raw = yaml.safe_load(f)
        for item in overrides:
            key, val = item.split("=", 1)
            node = raw
            parts = key.split(".")
            for p in parts[:-1]:
                if isinstance(node, list):
                    node = node[int(p)]
                else:
                    node = node.setdefault(p, {})
            if isinstance(node, list):
                node[int(parts[-1])] = yaml.safe_load(val)
            else:
                node[parts[-1]] = yaml.safe_load(val)
        return cls(raw)

    def save(self, path):
        with open(path, "w") as f:
            yaml.safe_dump(dict(self), f, sort_keys=False)

    def __str__(self):
        return "TrainConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.items()) + ")"


# ---------------------------------------------------------------- the prepare step
def prepare(root):
    """Synthetic tokenized shards as the dolma tokenizer writes them (uint16 ids, documents
    separated by eos_token_id 0): a few tens of thousands of tokens, documents of 2 to 60 tokens
    drawn from a skewed unigram distribution, some documents a short pattern repeated (boiler
    plate), one long document in part-2."""
    rng = np.random.default_rng(115)
    os.makedirs(os.path.join(root, "tokens"), exist_ok=True)
    probs = 1.0 / np.arange(1, 512) ** 1.1
    probs /= probs.sum()
    sizes = {
        "part-0-00000": 16000,
        "part-1-00000": 16000,
        "part-2-00000": 14000,
        "part-3-00000": 3000,
    }
    for name, n in sizes.items():
        toks = []
        total = 0
        while total < n:
            if name == "part-2-00000" and 6000 <= total < 6064:
                doc = rng.choice(np.arange(1, 512), size=420, p=probs)
            elif rng.random() < 0.03:
                pat = rng.integers(1, 512, size=3)
                doc = np.tile(pat, 17)[:50]
            else:
                doc = rng.choice(np.arange(1, 512), size=int(rng.integers(2, 16)), p=probs)
            toks.append(doc.astype(np.uint16))
            toks.append(np.zeros(1, dtype=np.uint16))
            total += len(doc) + 1
        np.save(os.path.join(root, "tokens", name + ".npy"), np.concatenate(toks))
    print(f"Wrote {len(sizes)} token files to {root}/tokens")


# ---------------------------------------------------------------- olmo/data/memmap_dataset.py
def _npy_header(path):
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(f)
        return f.tell(), shape[0], dtype


class MemMapDataset:
    def __init__(self, *paths, chunk_size=64, memmap_dtype=np.uint16):
        self._memmap_paths = paths
        self._chunk_size = chunk_size
        self._memmaps = {}
        self._offsets = []
        start = 0
        for path in paths:
            header, n_tokens, _ = _npy_header(path)
            n = n_tokens // chunk_size
            self._offsets.append((start, start + n, header, n_tokens))
            start += n
        self._len = start

    def __len__(self):
        return self._len

    def _memmap(self, i):
        path = self._memmap_paths[i]
        if path not in self._memmaps:
            _, _, header, n_tokens = self._offsets[i]
            self._memmaps[path] = np.memmap(
                path, dtype=np.uint16, mode="r", offset=header, shape=(n_tokens,)
            )
        return self._memmaps[path]

    def __getitem__(self, index):
        for i, (start, end, _, _) in enumerate(self._offsets):
            if start <= index < end:
                mm = self._memmap(i)
                k = (index - start) * self._chunk_size
                ids = torch.from_numpy(mm[k : k + self._chunk_size].astype(np.int64))
                return {"input_ids": ids, "index": index}
        raise IndexError(f"{index} is out of bounds for dataset of size {len(self)}")


def repetition_filter(ids, min_period, max_period, max_count):
    """True where the instance holds a pattern of period min..max repeated max_count times."""
    x = ids.tolist()
    for p in range(min_period, max_period + 1):
        run = 0
        for i in range(p, len(x)):
            run = run + 1 if x[i] == x[i - p] else 0
            if run >= max_count:
                return True
    return False


class IterableDataset:
    """olmo/data/iterable_dataset.py: global indices permuted and saved by rank 0, each rank
    takes every world_size-th; device batches of device_train_batch_size instances."""

    def __init__(self, dataset, cfg, work_dir):
        self.dataset = dataset
        self.cfg = cfg
        self.rank = get_global_rank()
        self.world_size = get_world_size()
        self.global_indices_file = Path(work_dir) / "global_indices.npy"
        if self.rank == 0:
            rng = np.random.Generator(np.random.PCG64(cfg.seed))
            indices = rng.permutation(len(dataset)).astype(np.uint32)
            total = len(indices) - len(indices) % cfg.global_train_batch_size
            self.global_indices_file.parent.mkdir(parents=True, exist_ok=True)
            np.save(self.global_indices_file, indices[:total])
        barrier()

    def __iter__(self):
        indices = np.load(self.global_indices_file, mmap_mode="r")
        indices = indices[self.rank :: self.world_size]
        filt = self.cfg.data.get("instance_filter")
        batch = []
        for idx in indices:
            item = self.dataset[int(idx)]
            if filt and repetition_filter(
                item["input_ids"],
                filt["repetition_min_period"],
                filt["repetition_max_period"],
                filt["repetition_max_count"],
            ):
                continue  # drop the instance (our change: OLMo masks it)
            batch.append(item["input_ids"])
            if len(batch) == self.cfg.device_train_batch_size:
                yield {"input_ids": torch.stack(batch)}
                batch = []


def build_train_dataloader(cfg, work_dir):
    paths = cfg.data.paths
    log.info(f"Loading data from {len(paths)} paths")
    dataset = MemMapDataset(*paths, chunk_size=cfg.model.max_sequence_length)
    data_log.info(f"{len(dataset):,d} instances of {cfg.model.max_sequence_length} tokens")
    return IterableDataset(dataset, cfg, work_dir)


# ---------------------------------------------------------------- olmo/model.py
class OLMoBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.attn_norm = nn.LayerNorm(d)
        self.att_proj = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = nn.LayerNorm(d)
        self.ff_proj = nn.Linear(d, 4 * d, bias=False)
        self.ff_out = nn.Linear(4 * d, d, bias=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.att_proj(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff_out(F.gelu(self.ff_proj(self.ff_norm(x))))


class OLMo(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_sequence_length, cfg.d_model)
        self.blocks = nn.ModuleList(
            [OLMoBlock(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers)]
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.ff_out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.ff_out(self.ln_f(x))

    def num_params(self, include_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if not include_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n


# ---------------------------------------------------------------- olmo/optim.py (sharded)
class ShardedAdamW:
    """AdamW whose state is sharded over the ranks as FSDP's flat parameters are: each rank
    updates its slice of the flat parameter vector and the slices are all-gathered."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.world, self.rank = get_world_size(), get_global_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = math.ceil(self.numel / self.world)
        self.exp_avg = torch.zeros(self.shard)
        self.exp_avg_sq = torch.zeros(self.shard)
        self.step_count = 0

    def _flat(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return F.pad(flat, (0, self.shard * self.world - self.numel))

    def clip_grads_and_collect_metrics(self, max_norm):
        grads = [p.grad for p in self.params]
        total = torch.norm(torch.stack([g.norm(2.0) for g in grads]), 2.0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef)
        return {"optim/total_grad_norm": float(total)}

    @torch.no_grad()
    def step(self):
        self.step_count += 1
        b1, b2 = self.betas
        lo, hi = self.rank * self.shard, (self.rank + 1) * self.shard
        p = self._flat([q.data for q in self.params])[lo:hi].clone()
        g = self._flat([q.grad for q in self.params])[lo:hi]
        p.mul_(1 - self.lr * self.wd)
        self.exp_avg.mul_(b1).add_(g, alpha=1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self.exp_avg_sq / (1 - b2**self.step_count)).sqrt_().add_(self.eps)
        p.addcdiv_(self.exp_avg, denom, value=-self.lr / (1 - b1**self.step_count))
        shards = [torch.empty(self.shard) for _ in range(self.world)]
        dist.all_gather(shards, p)
        flat = torch.cat(shards)[: self.numel]
        k = 0
        for q in self.params:
            q.data.copy_(flat[k : k + q.numel()].view_as(q))
            k += q.numel()

    def zero_grad(self):
        for q in self.params:
            q.grad = None

    def state_dict(self):
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.step_count}

    def load_state_dict(self, state):
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count = state["step"]


# ---------------------------------------------------------------- olmo/checkpoint.py
def save_sharded_checkpoint(trainer, folder):
    rank = get_global_rank()
    (folder / "model_and_optim").mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": trainer.model.module.state_dict(),
            "optim": trainer.optim.state_dict(),
            "world_size": get_world_size(),
        },
        folder / "model_and_optim" / f"rank{rank}.pt",
    )
    torch.save({"global_step": trainer.global_step}, folder / f"train_rank{rank}.pt")
    barrier()


def load_sharded_optim_state(trainer, folder):
    rank = get_global_rank()
    state = torch.load(folder / "model_and_optim" / f"rank{rank}.pt", weights_only=True)
    trainer.model.module.load_state_dict(state["model"])
    trainer.optim.load_state_dict(state["optim"])
    trainer.global_step = torch.load(folder / f"train_rank{rank}.pt")["global_step"]
    barrier()


# ---------------------------------------------------------------- olmo/train.py
class Trainer:
    def __init__(self, cfg, model, optim, train_loader, evaluators):
        self.cfg = cfg
        self.model = model
        self.optim = optim
        self.train_loader = train_loader
        self.evaluators = evaluators
        self.global_step = 0
        self.global_train_tokens_seen = 0
        self.max_steps = cfg.max_steps
        self._start_time = time.time()
        self._upload = threading.Event()

    def save_checkpoint(self, unsharded=False):
        name = f"step{self.global_step}" + ("-unsharded" if unsharded else "")
        folder = Path(self.cfg.save_folder) / name
        if unsharded:
            if get_global_rank() == 0:
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(self.model.module.state_dict(), folder / "model.pt")
                torch.save({"global_step": self.global_step}, folder / "train.pt")
            barrier()
        else:
            save_sharded_checkpoint(self, folder)
        return Path(self.cfg.save_folder) / name

    def restore_checkpoint(self, path):
        load_sharded_optim_state(self, Path(path))

    def log_metrics_to_console(self, prefix, metrics):
        trainer_log.info(
            f"{prefix}\n"
            + "\n".join([f"    {name}={format_float(value)}" for name, value in metrics.items()])
        )

    def doc_lens(self, input_ids):
        """Document lengths of every row, for the attention mask over document boundaries."""
        eos = self.cfg.model.eos_token_id
        lens = []
        for row in input_ids:
            eos_positions = (row == eos).nonzero()[:, 0]
            last = eos_positions[-1]
            prev = torch.cat([torch.tensor([-1]), eos_positions[:-1]])
            lens.append(torch.cat([eos_positions - prev, (len(row) - 1 - last).view(1)]))
        return lens

    def train_batch(self, batch):
        micro = self.cfg.device_train_microbatch_size
        ids = batch["input_ids"]
        if self.cfg.data.get("generate_doc_lengths"):
            self.doc_lens(ids)
        loss_total = torch.zeros(())
        chunks = ids.split(micro)
        for k, mb in enumerate(chunks):
            logits = self.model(mb[:, :-1]) if k == len(chunks) - 1 else None
            if logits is None:
                with self.model.no_sync():
                    logits = self.model(mb[:, :-1])
                    loss = F.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), mb[:, 1:].reshape(-1)
                    )
                    (loss / len(chunks)).backward()
            else:
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), mb[:, 1:].reshape(-1))
                (loss / len(chunks)).backward()
            loss_total += loss.detach() / len(chunks)
        return loss_total

    def eval(self):
        rank = get_global_rank()
        metrics = {}
        for ev in self.evaluators:
            if not ev.get("enabled", True):
                continue
            if ev.get("rank0_only") and rank != 0:
                continue
            eval_log.info(f"Running evaluation for '{ev['label']}'...")
            n = ev.get("subset_num_batches", 2)
            losses = []
            for k in range(n):
                if ev["type"] == "downstream":
                    time.sleep(ev.get("seconds_per_batch", 0.1))  # generation, one prompt at a time
                with torch.no_grad():
                    ids = torch.randint(
                        1,
                        self.cfg.model.vocab_size,
                        (2, 33),
                        generator=torch.Generator().manual_seed(k),
                    )
                    logits = self.model.module(ids[:, :-1])
                    losses.append(
                        F.cross_entropy(
                            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
                        )
                    )
                if ev["type"] == "downstream" or (k + 1) % 2 == 0:
                    eval_log.info(f"[eval_step={k + 1}/{n}]")
            loss = torch.stack(losses).mean()
            if not ev.get("rank0_only"):
                dist.all_reduce(loss)
                loss /= get_world_size()
            if ev["type"] == "downstream":
                metrics[f"eval/downstream/{ev['label']}_len_norm"] = 1.0 / (1.0 + float(loss))
            else:
                metrics[f"eval/{ev['label']}/CrossEntropyLoss"] = float(loss)
                metrics[f"eval/{ev['label']}/Perplexity"] = math.exp(float(loss))
        if metrics:
            self.log_metrics_to_console("Eval", metrics)

    def check_if_cancelled(self):
        should_cancel = False
        cancel_reason = None
        if get_global_rank() == 0:
            limit = self.cfg.get("time_limit")
            if limit is not None and time.time() - self._start_time >= limit:
                should_cancel = True
                cancel_reason = "time limit reached"
        flag = torch.tensor(float(should_cancel))
        dist.broadcast(flag, 0)
        if flag.item():
            if cancel_reason is None:
                trainer_log.warning("Run canceled")
            else:
                trainer_log.warning(f"Run canceled due to {cancel_reason}")
            return True
        return False

    def fit(self):
        cfg = self.cfg
        letter, who = fault()
        rank = get_global_rank()
        tokens_per_batch = cfg.global_train_batch_size * cfg.model.max_sequence_length
        hoard = []
        start = time.time()
        trainer_log.info(
            f"Pre-train system metrics\n    System/Peak GPU Memory (MB)={peak_gpu_memory()}"
        )
        stop = False
        for epoch in range(cfg.get("epochs", 1000)):
            for batch in self.train_loader:
                step = self.global_step + 1
                if letter == "m" and rank == who and step >= 9:
                    hoard.append(
                        torch.ones(16 * 1024 * 1024)
                    )  # the logits of every step, for the speed monitor
                    if len(hoard) >= 6:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if letter == "v" and rank == who and step == 13:
                    ctypes.string_at(
                        0x7EAD00000000, 8
                    )  # the fused rotary kernel reads a freed buffer
                if letter == "j" and rank == who and step == 12:
                    self._upload.wait()  # the remote upload thread was never started
                loss = self.train_batch(batch)
                metrics = self.optim.clip_grads_and_collect_metrics(cfg.max_grad_norm)
                interval = cfg.optimizer.get("metrics_log_interval")
                if interval and step % interval == 0 and rank == 0:
                    norm = torch.tensor([metrics["optim/total_grad_norm"]])
                    dist.all_reduce(norm)  # optimizer metrics reduced over the ranks when logged
                self.optim.step()
                self.optim.zero_grad()
                self.global_step = step
                self.global_train_tokens_seen += tokens_per_batch
                dist.reduce(loss, 0)
                if step % cfg.console_log_interval == 0:
                    elapsed = time.time() - start
                    self.log_metrics_to_console(
                        f"[step={step}/{self.max_steps}]",
                        {
                            "train/CrossEntropyLoss": float(loss) / get_world_size(),
                            "train/Perplexity": math.exp(float(loss) / get_world_size()),
                            "throughput/total_tokens": self.global_train_tokens_seen,
                            "throughput/device/tokens_per_second": tokens_per_batch
                            * step
                            / get_world_size()
                            / elapsed,
                            "throughput/device/batches_per_second": step / elapsed,
                            "System/Peak GPU Memory (MB)": peak_gpu_memory(),
                        },
                    )
                if step % cfg.save_interval == 0 and step < self.max_steps:
                    trainer_log.info("Saving checkpoint...")
                    path = self.save_checkpoint()
                    trainer_log.info(f"Checkpoint saved to {path}")
                if step % cfg.eval_interval == 0:
                    self.eval()
                if step % cfg.cancel_check_interval == 0 and self.check_if_cancelled():
                    stop = True
                if step >= self.max_steps or stop:
                    stop = True
                    break
            if stop:
                break
            trainer_log.info(f"Epoch {epoch + 1} complete")
            if cfg.get("epochs") is not None and epoch + 1 >= cfg.epochs:
                break
        trainer_log.info("Training loop complete")
        trainer_log.info("Saving final unsharded model checkpoint...")
        path = self.save_checkpoint(unsharded=True)
        trainer_log.info(f"Unsharded checkpoint saved to {path}")


# ---------------------------------------------------------------- scripts/train.py
def main(cfg):
    barrier()
    world = get_world_size()
    rank = get_global_rank()
    if cfg.global_train_batch_size % (world * cfg.device_train_microbatch_size) != 0:
        raise OLMoConfigurationError(
            f"global_train_batch_size ({cfg.global_train_batch_size}) must be divisible by "
            f"world size x device_train_microbatch_size ({world} x "
            f"{cfg.device_train_microbatch_size})"
        )
    cfg.device_train_batch_size = cfg.global_train_batch_size // world
    cfg.device_train_grad_accum = cfg.device_train_batch_size // cfg.device_train_microbatch_size
    max_duration = str(cfg.max_duration)

    if rank == 0:
        log.info("Configuration:")
        log.info(cfg)
        if cfg.get("load_path") is None or Path(cfg.load_path).parent != Path(cfg.save_folder):
            save_path = Path(cfg.save_folder) / "config.yaml"
            if save_path.is_file() and not cfg.get("save_overwrite"):
                raise OLMoConfigurationError(
                    f"{save_path} already exists, use --save_overwrite to overwrite"
                )
            log.info(f"Saving config to {save_path}")
            save_path.parent.mkdir(exist_ok=True, parents=True)
            cfg.save(save_path)
    barrier()

    torch.manual_seed(cfg.seed)
    train_loader = build_train_dataloader(cfg, Path(cfg.save_folder) / "train_data")
    if max_duration.endswith("ep"):
        cfg.epochs = int(max_duration[:-2])
        cfg.max_steps = cfg.epochs * (len(train_loader.dataset) // cfg.global_train_batch_size)
    else:
        cfg.max_steps = int(max_duration)
    barrier()

    log.info("Building model...")
    olmo_model = OLMo(TrainConfig(cfg.model))
    log.info(f"Total number of parameters: {olmo_model.num_params():,d}")
    log.info(
        f"Number of non-embedding parameters: {olmo_model.num_params(include_embedding=False):,d}"
    )
    log.info(f"Peak GPU Memory (MB) before FSDP: {int(peak_gpu_memory() or 0)}")
    log.info("Wrapping model with FDSP...")
    autocast = cfg.get("precision", "fp32") != "fp32"
    if autocast:
        ctx = torch.autocast("cuda", dtype=torch.bfloat16)
        ctx.__enter__()
    fsdp_model = DDP(olmo_model, device_ids=None)
    log.info(f"Peak GPU Memory (MB) after FSDP: {int(peak_gpu_memory() or 0)}")
    log.info("Model:")
    log.info(fsdp_model)
    opt = cfg.optimizer
    optim = ShardedAdamW(
        fsdp_model.parameters(),
        lr=float(opt.learning_rate),
        betas=tuple(opt.betas),
        eps=float(opt.eps),
        weight_decay=float(opt.weight_decay),
    )
    trainer = Trainer(cfg, fsdp_model, optim, train_loader, cfg.get("evaluators") or [])
    if cfg.get("load_path") is None:
        log.info("Saving pre-train checkpoint...")
        checkpoint_path = trainer.save_checkpoint()
        log.info(f"Checkpoint saved to {checkpoint_path}")
        log.info("Attempting to load pre-train checkpoint...")
        trainer.restore_checkpoint(checkpoint_path)
        log.info("Checkpoint successfully loaded")
    else:
        log.info(f"Loading checkpoint from {cfg.load_path}...")
        trainer.restore_checkpoint(cfg.load_path)
        log.info("Checkpoint successfully loaded")
    log.info("Starting training...")
    trainer.fit()
    log.info("Training complete")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "prepare":
        prepare(sys.argv[2])
        sys.exit(0)
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=15))
    prepare_cli_environment()
    log.info("CLI environment prepared")
    try:
        yaml_path, args_list = sys.argv[1], sys.argv[2:]
    except IndexError:
        raise OLMoCliError(f"Usage: {sys.argv[0]} [CONFIG_PATH] [OPTIONS]") from None
    cfg = TrainConfig.load(yaml_path, [clean_opt(s) for s in args_list])
    main(cfg)
    dist.destroy_process_group()
