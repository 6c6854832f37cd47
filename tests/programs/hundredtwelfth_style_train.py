"""A hundred-and-twelfth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwelfth-*): supervised fine-tuning of a small causal language model
with a LoRA adapter in the way of axolotl (`accelerate launch -m axolotl.cli.train
examples/llama-3/lora-1b.yml`), re-created in plain torch (axolotl, transformers, peft, datasets,
accelerate and deepspeed are not installed; PyYAML and tqdm are). Linked into each run's folder as
axolotl/cli/train.py and started as a module through a re-created accelerate launch
(tests/programs/hundredtwelfth_accelerate.py). One YAML config (base_model, datasets with path and
type: alpaca, dataset_prepared_path, val_set_size, sequence_len, sample_packing,
multipack_real_batches, micro_batch_size, gradient_accumulation_steps, num_epochs, learning_rate,
adapter: lora, lora_r, lora_alpha, evals_per_epoch, saves_per_epoch, early_stopping_patience,
ddp_timeout, flash_attention, tokenizer_use_fast, output_dir). axolotl's log format on every process
('[2026-12-06 05:31:22,104] [INFO] [axolotl.load_tokenizer:294] [PID:4242] [RANK:1] EOS: 2 /
</s>'); the main process tokenises the datasets first while the others wait in a barrier
(zero_first) and then load the prepared dataset from last_run_prepared/<hash> (the hash covers
the datasets and the tokenizer); a multipack sampler (first-fit-decreasing bins of sequence_len
tokens, micro_batch_size bins a batch, batches dealt round-robin to the ranks, every rank's
length the smallest of all unless multipack_real_batches); an HF-Trainer-like loop on every rank
(DDP over the LoRA weights, the logged loss gathered from every rank, the evaluation's loss
gathered per batch) with the main process printing the log dicts, a tqdm bar, 'Saving model
checkpoint to ...' and the final dict. `--prepare DIR` writes the synthetic alpaca-style JSONL and
the tiny base model; `--preprocess` tokenises into last_run_prepared/ and stops (axolotl's
preprocess command). A fault in the code is chosen by the TQ_CASE environment variable and never
printed (re-capture with tests/fixtures/real/capture_hundredtwelfth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import logging
import math
import os
import queue
import random
import re
import signal
import sys
import time
import zlib
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

# TQ_CASE -> what goes wrong in the code: v1 rank 1's packing collator drops a pad token at step
# 5; s1 rank 1's fused cross-entropy kernel reads address 0 at step 4; h1 rank 1 keeps every
# evaluation batch's logits (SIGKILL, as the OOM killer would); p1 rank 1 waits at epoch 2 for a
# prefetch thread that was never started; r0 the tokens-seen gather only on the main process
CASE = os.environ.get("TQ_CASE", "")

VOCAB = 1024
BOS, EOS, PAD = 1, 2, 0
LOG_FORMAT = (
    "[%(asctime)s] [%(levelname)s] [%(name)s.%(funcName)s:%(lineno)d] [PID:%(process)d] "
    "[RANK:%(rank)d] %(message)s"
)
ALPACA = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)


class RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = int(os.environ.get("LOCAL_RANK", "0"))
        return True


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RankFilter())
    root = logging.getLogger("axolotl")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


LOG = logging.getLogger("axolotl")
LOG_CFG = logging.getLogger("axolotl.utils.config.models.input")
LOG_SFT = logging.getLogger("axolotl.utils.data.sft")
LOG_PACK = logging.getLogger("axolotl.utils.samplers.multipack")
LOG_TRAINER = logging.getLogger("axolotl.utils.trainer")
LOG_TRAIN = logging.getLogger("axolotl.train")


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@contextmanager
def zero_first(is_main: bool):
    """runs the wrapped context so that rank 0 runs the context first before other ranks"""
    if not is_main:
        barrier()
    yield
    if is_main:
        barrier()


# ----------------------------------------------------------------------------- the prepare step
TOPICS = ["photosynthesis", "the water cycle", "gravity", "volcanoes", "the moon", "tides"]
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Dakar", "Perth"]


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            rows.append(
                {"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a} + {b} = {a + b}."}
            )
        elif kind == 1:
            words = rng.sample(["red", "fox", "blue", "sky", "old", "tree", "cold", "river"], 4)
            rows.append(
                {
                    "instruction": "Reverse the order of the words.",
                    "input": " ".join(words),
                    "output": " ".join(reversed(words)),
                }
            )
        elif kind == 2:
            topic = rng.choice(TOPICS)
            length = rng.choice([1, 1, 1, 2]) if i % 40 != 2 else 24  # a few long passages
            text = " ".join(f"{topic} is a topic people study in school." for _ in range(length))
            rows.append(
                {
                    "instruction": f"Summarize the passage about {topic}.",
                    "input": text,
                    "output": f"The passage is about {topic}.",
                }
            )
        else:
            city = rng.choice(CITIES)
            rows.append(
                {
                    "instruction": f"Write one sentence about {city}.",
                    "input": "",
                    "output": f"{city} is a city with a long history and many visitors.",
                }
            )
    return rows


def prepare(folder: str, rows: int, name: str) -> None:
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    with open(os.path.join(folder, "data", name), "w") as f:
        for row in make_rows(rows, 7 if name == "alpaca_2k.jsonl" else 11):
            f.write(json.dumps(row) + "\n")
    model_dir = os.path.join(folder, "TinyLlama-mini")
    if not os.path.isdir(model_dir):
        os.makedirs(model_dir)
        config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 128, "max_position_embeddings": 512, "vocab_size": VOCAB}  # fmt: skip
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        torch.manual_seed(0)
        torch.save(TinyLlama(config).state_dict(), os.path.join(model_dir, "pytorch_model.bin"))


# ---------------------------------------------------------------------------------- tokenizer
class Tokenizer:
    """A word-level tokenizer hashed into a small vocabulary (the fast one); the slow Python
    tokenizer gives the same ids, row by row."""

    def __init__(self, use_fast: bool) -> None:
        self.use_fast = use_fast
        self.bos_token, self.eos_token, self.unk_token = "<s>", "</s>", "<unk>"
        self.pad_token = None

    def encode(self, text: str) -> list[int]:
        if not self.use_fast:
            time.sleep(0.006)  # the slow tokenizer's Python BPE merges
        words = re.findall(r"\w+|[^\w\s]|\n", text)
        return [3 + zlib.crc32(w.encode()) % (VOCAB - 3) for w in words]


def load_tokenizer(cfg: dict) -> Tokenizer:
    tokenizer = Tokenizer(cfg.get("tokenizer_use_fast", True))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    LOG.info(f"EOS: {EOS} / {tokenizer.eos_token}")
    LOG.info(f"BOS: {BOS} / {tokenizer.bos_token}")
    LOG.info(f"PAD: {EOS} / {tokenizer.pad_token}")
    LOG.info(f"UNK: {PAD} / {tokenizer.unk_token}")
    return tokenizer


# ------------------------------------------------------------------------------------ datasets
def tokenize_prompt(tokenizer: Tokenizer, row: dict) -> dict:
    template = ALPACA if row.get("input") else ALPACA_NO_INPUT
    prompt = tokenizer.encode(template.format(instruction=row["instruction"], input=row["input"]))
    response = tokenizer.encode(row["output"])
    input_ids = [BOS, *prompt, *response, EOS]
    labels = [-100] * (1 + len(prompt)) + [*response, EOS]  # train_on_inputs: false
    return {"input_ids": input_ids, "labels": labels}


def prepared_hash(cfg: dict) -> str:
    key = "|".join(f"{d['path']}:{d['type']}" for d in cfg["datasets"])
    key += "|" + cfg["base_model"] + "|fast=" + str(cfg.get("tokenizer_use_fast", True))
    return hashlib.md5(key.encode()).hexdigest()


def map_with_progress(rows: list[dict], fn, desc: str) -> list[dict]:
    out = []
    with tqdm(total=len(rows), desc=f"{desc} (num_proc=1)", unit=" examples", file=sys.stderr,
              mininterval=2.0) as bar:  # fmt: skip
        for row in rows:
            out.append(fn(row))
            bar.update(1)
    return out


def load_tokenized_prepared_datasets(tokenizer: Tokenizer, cfg: dict) -> list[dict]:
    prepared = os.path.join(cfg["dataset_prepared_path"], prepared_hash(cfg))
    if os.path.exists(os.path.join(prepared, "dataset.pt")):
        LOG_SFT.info(f"Loading prepared dataset from disk at {prepared}...")
        rows = torch.load(os.path.join(prepared, "dataset.pt"))
        LOG_SFT.info("Prepared dataset loaded from disk...")
        return rows
    LOG_SFT.info(
        f"Unable to find prepared dataset in {prepared}, Loading + tokenizing datasets..."
    )  # fmt: skip
    rows = []
    for d in cfg["datasets"]:
        with open(d["path"]) as f:
            raw = [json.loads(line) for line in f if line.strip()]
        LOG_SFT.info(f"Loading dataset: {d['path']} with base_type: {d['type']} and prompt_style: None")  # fmt: skip
        rows += map_with_progress(raw, lambda r: tokenize_prompt(tokenizer, r), "Tokenizing Prompts")  # fmt: skip
    max_len = cfg["sequence_len"]
    kept = [r for r in rows if len(r["input_ids"]) <= max_len]
    if len(kept) < len(rows):
        LOG_SFT.warning(f"Dropped {len(rows) - len(kept)} long samples from dataset")
    LOG_SFT.info(f"Saving merged prepared dataset to disk... {prepared}")
    os.makedirs(prepared, exist_ok=True)
    torch.save(kept, os.path.join(prepared, "dataset.pt"))
    return kept


def load_prepare_datasets(tokenizer: Tokenizer, cfg: dict) -> tuple[list[dict], list[dict]]:
    with zero_first(is_main_process()):
        rows = load_tokenized_prepared_datasets(tokenizer, cfg)
    n_eval = math.ceil(len(rows) * cfg["val_set_size"]) if cfg.get("val_set_size") else 0
    return rows[: len(rows) - n_eval], rows[len(rows) - n_eval :]


class PackedDataset(Dataset):
    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, pack: list[int]) -> list[dict]:
        return [self.rows[i] for i in pack]


class MultipackBatchSampler:
    """First-fit-decreasing bins of batch_max_len tokens, batch_size bins a batch, the batches
    dealt to the ranks round-robin and shuffled each epoch."""

    def __init__(self, lengths, batch_max_len, batch_size, rank, world, seed, real_batches,
                 shuffle=True):  # fmt: skip
        self.lengths = lengths
        self.batch_max_len = batch_max_len
        self.batch_size = batch_size
        self.rank, self.world = rank, world
        self.seed, self.epoch = seed, 0
        self.real_batches = real_batches
        self.shuffle = shuffle
        longest = max(lengths) if lengths else 0
        assert longest <= batch_max_len, (
            f"sample of {longest} tokens does not fit in a pack of {batch_max_len} tokens"
        )
        self.len_across_ranks = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _bins(self) -> list[list[int]]:
        order = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
        bins, room = [], []
        for i in order:
            for b in range(len(bins)):
                if room[b] >= self.lengths[i]:
                    bins[b].append(i)
                    room[b] -= self.lengths[i]
                    break
            else:
                bins.append([i])
                room.append(self.batch_max_len - self.lengths[i])
        return bins

    def _batches(self) -> list[list[list[int]]]:
        bins = self._bins()
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(bins)
        batches = [bins[k : k + self.batch_size] for k in range(0, len(bins), self.batch_size)]
        return batches[self.rank :: self.world]

    def efficiency(self) -> float:
        mine = self._batches()
        used = sum(self.lengths[i] for batch in mine for b in batch for i in b)
        return used / (len(mine) * self.batch_size * self.batch_max_len)

    def _len_est(self) -> int:
        efficiency = self.efficiency()
        tokens = sum(self.lengths[i] for batch in self._batches() for b in batch for i in b)
        LOG_PACK.info(
            f"packing_efficiency_estimate: {efficiency:.2f} total_num_tokens per device: {tokens}"
        )
        return len(self._batches())

    def __len__(self) -> int:
        if self.len_across_ranks is None:
            n = torch.tensor(self._len_est())
            if dist.is_initialized():
                dist.all_reduce(n, op=dist.ReduceOp.MIN)
            self.len_across_ranks = int(n)
        return self.len_across_ranks

    def __iter__(self):
        batches = self._batches()
        if not self.real_batches:
            batches = batches[: len(self)]
        yield from batches


class V2BatchSamplerDataCollatorForSeq2Seq:
    """Each bin's sequences laid end to end, padded to sequence_len; position_ids restart at 0 at
    every sequence (the packed attention keeps the sequences apart)."""

    def __init__(self, sequence_len: int) -> None:
        self.sequence_len = sequence_len
        self.calls = 0

    def __call__(self, batch: list[list[dict]]) -> dict[str, torch.Tensor]:
        self.calls += 1
        ids, labels, pos = [], [], []
        for pack in batch:
            for row in pack:
                ids += row["input_ids"]
                labels += row["labels"]
                pos += list(range(len(row["input_ids"])))
            pad = self.sequence_len * (len(ids) // self.sequence_len + 1) - len(ids)
            if len(ids) % self.sequence_len == 0:
                pad = 0
            if CASE == "v1" and os.environ.get("RANK") == "1" and self.calls == 5:
                pad -= 1  # the last pad token of the bin is dropped
            ids += [EOS] * pad
            labels += [-100] * pad
            pos += [0] * pad
        shape = (len(batch), self.sequence_len)
        return {
            "input_ids": torch.tensor(ids).view(shape),
            "labels": torch.tensor(labels).view(shape),
            "position_ids": torch.tensor(pos).view(shape),
        }


# ------------------------------------------------------------------------------------- model
class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int, alpha: int) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        dim, inter = config["hidden_size"], config["intermediate_size"]
        self.heads = config["num_attention_heads"]
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.v_proj, self.o_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.input_layernorm(x)

        def split(p: torch.Tensor) -> torch.Tensor:
            return p.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        dim = config["hidden_size"]
        self.embed_tokens = nn.Embedding(config["vocab_size"], dim)
        self.embed_positions = nn.Embedding(config["max_position_embeddings"], dim)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config) for _ in range(config["num_hidden_layers"])
        )
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, config["vocab_size"], bias=False)
        self.gradient_checkpointing = False

    def forward(self, input_ids, position_ids, labels):
        x = self.embed_tokens(input_ids) + self.embed_positions(position_ids)
        if self.gradient_checkpointing:
            x.requires_grad_(True)  # enable_input_require_grads
        seq = torch.cumsum(position_ids == 0, dim=1)
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        mask = ((seq[:, :, None] == seq[:, None, :]) & causal)[:, None]
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, mask)
            else:
                x = layer(x, mask)
        logits = self.lm_head(self.norm(x))
        if CASE == "s1" and os.environ.get("RANK") == "1" and self.training:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 4:
                ctypes.string_at(0)  # the fused cross-entropy kernel reads a null pointer
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        return loss, logits


def load_model(cfg: dict) -> TinyLlama:
    LOG.info("loading model")
    with open(os.path.join(cfg["base_model"], "config.json")) as f:
        config = json.load(f)
    if cfg.get("flash_attention"):
        # the llama monkeypatch for packed sequences: flash-attn's varlen kernel
        from flash_attn.flash_attn_interface import flash_attn_varlen_qkvpacked_func

        LlamaDecoderLayer.varlen_attention = staticmethod(flash_attn_varlen_qkvpacked_func)
    model = TinyLlama(config)
    model.load_state_dict(torch.load(os.path.join(cfg["base_model"], "pytorch_model.bin")))
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.get("adapter") == "lora":
        for layer in model.layers:
            for name in cfg.get("lora_target_modules", ["q_proj", "v_proj"]):
                setattr(layer, name, LoraLinear(getattr(layer, name), cfg["lora_r"], cfg["lora_alpha"]))  # fmt: skip
    model.gradient_checkpointing = bool(cfg.get("gradient_checkpointing"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(
        f"trainable params: {trainable:,} || all params: {total:,} || "
        f"trainable%: {100 * trainable / total:.4f}"
    )
    return model


# --------------------------------------------------------------------------------- the trainer
def calculate_total_num_steps(cfg: dict, sampler: MultipackBatchSampler) -> int:
    data_loader_len = len(sampler) // cfg["gradient_accumulation_steps"]
    LOG_TRAINER.info(f"data_loader_len: {data_loader_len}")
    total = data_loader_len * cfg["num_epochs"]
    LOG_TRAINER.info(f"total_num_steps: {total}")
    return total


class Trainer:
    def __init__(self, cfg, model, train_rows, eval_rows, rank, world) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.model = DDP(model) if world > 1 else model
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.train_sampler = MultipackBatchSampler(
            [len(r["input_ids"]) for r in train_rows], cfg["sequence_len"],
            cfg["micro_batch_size"], rank, world, cfg.get("seed", 42),
            bool(cfg.get("multipack_real_batches")),
        )  # fmt: skip
        self.total_steps = calculate_total_num_steps(cfg, self.train_sampler)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=float(cfg["learning_rate"]))
        warmup = cfg.get("warmup_steps", 0)
        total = max(1, self.total_steps)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.eval_loader = None
        self.hoard: list[tuple[torch.Tensor, torch.Tensor]] = []  # every evaluation's logits

    def _loader(self, rows, sampler) -> DataLoader:
        dataset = PackedDataset(rows)
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=V2BatchSamplerDataCollatorForSeq2Seq(self.cfg["sequence_len"]),
            num_workers=self.cfg.get("dataloader_num_workers", 0),
        )

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return t.reshape(1)
        out = [torch.zeros_like(t.reshape(1)) for _ in range(self.world)]
        dist.all_gather(out, t.reshape(1))
        return torch.cat(out)

    def evaluate(self, epoch: float) -> float:
        start = time.time()
        if self.eval_loader is None:
            sampler = MultipackBatchSampler(
                [len(r["input_ids"]) for r in self.eval_rows], self.cfg["sequence_len"],
                self.cfg["micro_batch_size"], self.rank, self.world, 0,
                bool(self.cfg.get("multipack_real_batches")), shuffle=False,
            )  # fmt: skip
            self.eval_loader = self._loader(self.eval_rows, sampler)
        self.model.eval()
        losses = []
        bar = tqdm(total=len(self.eval_loader), disable=self.rank != 0, file=sys.stderr)
        for batch in self.eval_loader:
            with torch.no_grad():
                loss, logits = self.model(**batch)
            if CASE == "h1" and self.rank == 1:
                self.hoard.append((torch.ones(64, 1024, 1024, dtype=torch.uint8), logits.clone()))
                if len(self.hoard) >= 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            losses.append(self.gather(loss.detach()))
            bar.update(1)
        bar.close()
        self.model.train()
        eval_loss = torch.cat(losses).mean().item()
        runtime = time.time() - start
        n = len(self.eval_rows)
        if self.rank == 0:
            print({"eval_loss": round(eval_loss, 4), "eval_runtime": round(runtime, 4),
                   "eval_samples_per_second": round(n / runtime, 3),
                   "eval_steps_per_second": round(len(self.eval_loader) / runtime, 3),
                   "epoch": round(epoch, 4)})  # fmt: skip
        return eval_loss

    def save(self, step: int) -> None:
        path = os.path.join(self.cfg["output_dir"], f"checkpoint-{step}")
        os.makedirs(path, exist_ok=True)
        if self.rank == 0:
            print(f"Saving model checkpoint to {path}", file=sys.stderr)
            model = self.model.module if isinstance(self.model, DDP) else self.model
            lora = {k: v for k, v in model.state_dict().items() if "lora_" in k}
            torch.save(lora, os.path.join(path, "adapter_model.bin"))
            torch.save(self.optimizer.state_dict(), os.path.join(path, "optimizer.pt"))
        torch.save(torch.get_rng_state(), os.path.join(path, f"rng_state_{self.rank}.pth"))

    def train(self) -> None:
        cfg = self.cfg
        loader = self._loader(self.train_rows, self.train_sampler)
        steps_per_epoch = len(self.train_sampler)
        eval_every = max(1, steps_per_epoch // cfg.get("evals_per_epoch", 1))
        save_every = max(1, steps_per_epoch // cfg.get("saves_per_epoch", 1))
        patience = cfg.get("early_stopping_patience")
        best, bad = float("inf"), 0
        start = time.time()
        step = 0
        running, total, tokens = 0.0, 0.0, torch.zeros(())
        bar = tqdm(total=self.total_steps, disable=self.rank != 0, file=sys.stderr)
        stop = False
        self.model.train()
        for epoch in range(cfg["num_epochs"]):
            self.train_sampler.set_epoch(epoch)
            if CASE == "p1" and self.rank == 1 and epoch == 1:
                prefetched: queue.Queue = queue.Queue()  # filled by a thread never started
                prefetched.get()
            for k, batch in enumerate(loader):
                loss, _ = self.model(**batch)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], 1.0
                )
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                step += 1
                bar.update(1)
                running += loss.item()
                total += loss.item()
                tokens += (batch["labels"] != -100).sum()
                if step % cfg.get("logging_steps", 1) == 0:
                    if CASE != "r0" or self.rank == 0:
                        self.num_tokens_seen = self.gather(tokens.float()).sum().item()
                    logged = self.gather(torch.tensor(running)).mean().item()
                    running = 0.0
                    if self.rank == 0:
                        bar.write(str({"loss": round(logged / cfg.get("logging_steps", 1), 4),
                                       "grad_norm": round(float(grad_norm), 4),
                                       "learning_rate": float(f"{self.scheduler.get_last_lr()[0]:.4g}"),
                                       "epoch": round(epoch + (k + 1) / steps_per_epoch, 4)}),
                                  file=sys.stdout)  # fmt: skip
                if cfg.get("val_set_size") and step % eval_every == 0:
                    eval_loss = self.evaluate(epoch + (k + 1) / steps_per_epoch)
                    if patience:
                        if eval_loss < best:
                            best, bad = eval_loss, 0
                        else:
                            bad += 1
                        stop = bad >= patience
                if step % save_every == 0:
                    self.save(step)
                if stop:
                    break
            if stop:
                break
        bar.close()
        runtime = time.time() - start
        if self.rank == 0:
            print({"train_runtime": round(runtime, 4),
                   "train_samples_per_second": round(len(self.train_rows) * cfg["num_epochs"] / runtime, 3),
                   "train_steps_per_second": round(step / runtime, 3),
                   "train_loss": round(total / max(1, step), 4),
                   "epoch": round(step / steps_per_epoch, 4)})  # fmt: skip


# ---------------------------------------------------------------------------------- the command
def load_cfg(path: str) -> dict:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg.setdefault("gradient_accumulation_steps", 1)
    cfg.setdefault("dataset_prepared_path", "last_run_prepared")
    if cfg.get("sample_packing") and cfg.get("sdp_attention") and cfg.get("bf16"):
        check_sample_packing_w_sdpa_bf16()
    return cfg


def check_sample_packing_w_sdpa_bf16() -> None:
    LOG_CFG.warning(
        "sample_packing & torch sdpa with bf16 is unsupported may results in 0.0 loss. "
        "This may work on H100s."
    )


def train(cfg: dict) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = load_tokenizer(cfg)
    train_rows, eval_rows = load_prepare_datasets(tokenizer, cfg)
    LOG_TRAIN.info("loading model and (optionally) peft_config...")
    model = load_model(cfg)
    trainer = Trainer(cfg, model, train_rows, eval_rows, rank, world)
    LOG_TRAIN.info("Starting trainer...")
    trainer.train()
    LOG_TRAIN.info(f"Training Completed!!! Saving pre-trained model to {cfg['output_dir']}")
    if rank == 0:
        unwrapped = trainer.model.module if isinstance(trainer.model, DDP) else trainer.model
        lora = {k: v for k, v in unwrapped.state_dict().items() if "lora_" in k}
        torch.save(lora, os.path.join(cfg["output_dir"], "adapter_model.bin"))


def do_cli(config: str, preprocess: bool) -> None:
    configure_logging()
    cfg = load_cfg(config)
    torch.manual_seed(cfg.get("seed", 42))
    torch.set_num_threads(1)
    if preprocess:
        load_tokenized_prepared_datasets(load_tokenizer(cfg), cfg)
        LOG.info(f"Success! Preprocessed data path: `dataset_prepared_path: {cfg['dataset_prepared_path']}`")  # fmt: skip
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(
            "gloo", timeout=timedelta(seconds=cfg.get("ddp_timeout", 1800))
        )  # fmt: skip
    os.makedirs(cfg["output_dir"], exist_ok=True)
    train(cfg)
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(prog="axolotl.cli.train")
    parser.add_argument("config", nargs="?")
    parser.add_argument("--preprocess", action="store_true")
    parser.add_argument("--prepare", default="", help="write the data and the base model, stop")
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--name", default="alpaca_2k.jsonl")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.rows, args.name)
        return
    do_cli(args.config, args.preprocess)


if __name__ == "__main__":
    main()
