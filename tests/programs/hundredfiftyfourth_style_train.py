"""A hundred-and-fifty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftyfourth-*): dense-retrieval training with texttron/tevatron, a
bi-encoder whose query and passage embeddings are all-gathered across ranks for in-batch
negatives, re-created in plain torch in one file without transformers, datasets, tokenizers or
grad_cache installed. Each run's folder links this file as tevatron/driver/train.py (tevatron
v1: `python -m torch.distributed.launch --nproc_per_node 2 -m tevatron.driver.train ...
--negatives_x_device`) and as tevatron/retriever/driver/train.py (v2: `torchrun
--nproc_per_node 2 -m tevatron.retriever.driver.train ...`); which of the two it runs as (its
module's name) picks the version's data path and loggers.

As there: HfArgumentParser over ModelArguments, DataArguments and TevatronTrainingArguments
(`--flag value` for every field, a bool flag alone means True, "Some specified arguments are
not used by the HfArgumentParser: [...]" for anything else, LOCAL_RANK read from the
environment); logging.basicConfig('%(asctime)s - %(levelname)s - %(name)s -   %(message)s',
INFO on local rank 0, WARN elsewhere), 'Process rank: 0, device: cpu, n_gpu: 0, distributed
training: True, 16-bits training: False' from every rank, then the arguments' dumps; the device
set-up initialises the process group (gloo, --ddp_timeout seconds, 15 in every run). v1
tokenises the train file on local rank 0 first ("Waiting for main process to perform the
mapping" on the others, a barrier, datasets' 'Running tokenizer on train dataset' bar, the
result cached for the other ranks); v2 reads the groups lazily and tokenises in its collator.
A tiny BERT-like encoder (bert-mini/: config.json, vocab.txt, pytorch_model.bin) built
from a model folder, cls pooling; DenseModel/EncoderModel all_gathers q_reps and p_reps and
takes a cross-entropy over all of them (the loss scaled by the world size, the training step
divided by it). A transformers-Trainer-like loop: DDP (find_unused_parameters=True, as the
Trainer sets for a model that is no PreTrainedModel), a DistributedSampler, the
'***** Running training *****' banner, a tqdm bar on each node's local rank 0, '{'loss':
1.2345, 'learning_rate': 5e-06, 'epoch': 0.25}' dicts written to stdout by rank 0 (the loss
all-gathered), 'Saving model checkpoint to model_msmarco/checkpoint-32', 'Deleting older
checkpoint', 'Training completed. Do not forget to share your model on huggingface.co/models
=)', the train metrics dict; GradCache (--grad_cache: representations in chunks without
gradients, the loss and its gradient on them, then the chunks again with gradients). The
process group is never destroyed (as under the Trainer). This fork adds: --split_by_rank (v1:
each process trains on its own split file of --train_dir, under a RandomSampler of its own, as
a shard per GPU), --early_stop_loss (a callback: the all-gathered logged loss under the
threshold stops every rank at the same step) and v1's --add_pooler in v2 (whose _save asserts
that every key of the state dict starts with 'encoder.').

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftyfourth.sh after any edit).
`python train.py --generate DIR` writes the synthetic data and model, `--make-model DIR HIDDEN`
a model folder, `--train-lines FILE N SEED` a train file, `--drawn RANK STEP N` the index of
the first group of rank RANK's batch STEP (1-based, first epoch) under the v2 sampler.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import random
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

CASE = os.environ.get("MT_CASE", "")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


SPEC = __spec__.name if __spec__ is not None else "tevatron.driver.train"
V2 = ".retriever." in SPEC
PKG = "tevatron.retriever" if V2 else "tevatron"
RANK = -1
LOCAL_RANK = -1

# ------------------------------------------------------------------ tqdm (as transformers and
# datasets use it: the bar on stderr, redrawn with a carriage return)
BLOCKS = " ▏▎▍▌▋▊▉█"


def _fmt_time(s: float) -> str:
    s = int(s)
    return (
        f"{s // 60:02d}:{s % 60:02d}"
        if s < 3600
        else f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    )


class Tqdm:
    def __init__(self, total: int | None, desc: str = "", unit: str = "it") -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n, self.t0, self.last_draw, self.width = 0, time.time(), 0.0, 0
        self.draw(force=True)

    def line(self) -> str:
        el = time.time() - self.t0
        rate = self.n / el if el > 0 and self.n else None
        rate_s = "?" if rate is None else f"{rate:5.2f}"
        prefix = f"{self.desc}: " if self.desc else ""
        if self.total is None:
            return f"{prefix}{self.n}{self.unit} [{_fmt_time(el)}, {rate_s}{self.unit}/s]"
        frac = self.n / self.total if self.total else 1.0
        full = int(frac * 10)
        part = int((frac * 10 - full) * 8)
        bar = "█" * full + (BLOCKS[part] if full < 10 else "")
        left = "?" if rate is None else _fmt_time((self.total - self.n) / rate)
        return (
            f"{prefix}{int(frac * 100):3d}%|{bar:<10}| {self.n}/{self.total} "
            f"[{_fmt_time(el)}<{left}, {rate_s}{self.unit}/s]"
        )

    def draw(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_draw < 0.1:
            return
        self.last_draw = now
        text = self.line()
        sys.stderr.write("\r" + text + " " * max(0, self.width - len(text)))
        sys.stderr.flush()
        self.width = len(text)

    def update(self, k: int = 1) -> None:
        self.n += k
        self.draw(force=self.total is not None and self.n >= self.total)

    def write(self, s: str) -> None:
        """tqdm.write: clear the bar (stderr), the message to stdout (not flushed), the bar."""
        sys.stderr.write("\r" + " " * self.width + "\r")
        sys.stdout.write(s + "\n")
        self.draw(force=True)

    def close(self) -> None:
        self.draw(force=True)
        sys.stderr.write("\n")
        sys.stderr.flush()


# ------------------------------------------------------------------ logging (transformers keeps
# its own handler, message only; tevatron's loggers go through basicConfig's)
hf_logger = logging.getLogger("transformers")
_hf_handler = logging.StreamHandler(sys.stderr)
hf_logger.addHandler(_hf_handler)
hf_logger.propagate = False
hf_logger.setLevel(logging.WARNING)
trainer_log = logging.getLogger("transformers.trainer")
modeling_log = logging.getLogger("transformers.modeling_utils")
tok_log = logging.getLogger("transformers.tokenization_utils_base")
logger = logging.getLogger("__main__")
tev_trainer_log = logging.getLogger(f"{PKG}.trainer")
tev_model_log = logging.getLogger(f"{PKG}.modeling.encoder")
tev_data_log = logging.getLogger(f"{PKG}.dataset" if V2 else "tevatron.datasets.dataset")


# ------------------------------------------------------------------ synthetic data and models
SYL = ["ba", "ko", "li", "mu", "ne", "ra", "si", "to", "vu", "ze", "qa", "do", "fe", "gi"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def words() -> list[str]:
    rng = random.Random(7)
    out = sorted({a + b + c for a in SYL for b in SYL for c in SYL})
    rng.shuffle(out)
    return sorted(out[:600])


def train_lines(n: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    vocab = words()
    groups = []
    for i in range(start, start + n):
        topic = rng.sample(vocab, 6)

        def passage(k: int, hot: list[str]) -> dict[str, str]:
            body = hot + rng.sample(vocab, 22)
            rng.shuffle(body)
            return {
                "docid": f"D{k}",
                "title": " ".join(rng.sample(vocab, 2)),
                "text": " ".join(body),
            }

        groups.append(
            {
                "query_id": f"Q{i}",
                "query": " ".join(rng.sample(topic, 4)),
                "positive_passages": [passage(i * 8, topic)],
                "negative_passages": [
                    passage(i * 8 + j, rng.sample(topic, 1)) for j in range(1, 8)
                ],
            }
        )
    return groups


def write_lines(path: str, groups: Iterable[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for g in groups:
            f.write(json.dumps(g) + "\n")


def make_model(folder: str, hidden: int) -> None:
    os.makedirs(folder, exist_ok=True)
    vocab = SPECIAL + words()
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    config = {
        "_name_or_path": "bert-mini",
        "architectures": ["BertForMaskedLM"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 64,
        "model_type": "bert",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "vocab_size": len(vocab),
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "WordPiece", "unk_token": "[UNK]"}}, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "model_max_length": 512}, f)
    torch.manual_seed(0)
    torch.save(
        BertModel(BertConfig(config)).state_dict(), os.path.join(folder, "pytorch_model.bin")
    )


def generate(folder: str) -> None:
    groups = train_lines(512, seed=0)
    write_lines(os.path.join(folder, "msmarco", "train.jsonl"), groups)
    write_lines(os.path.join(folder, "msmarco", "train", "split00.jsonl"), groups[:256])
    write_lines(os.path.join(folder, "msmarco", "train", "split01.jsonl"), groups[256:])
    make_model(os.path.join(folder, "bert-mini"), 32)


# ------------------------------------------------------------------ tokenizers
PARALLELISM_USED = [False]


def _after_fork_in_child() -> None:
    if PARALLELISM_USED[0] and "TOKENIZERS_PARALLELISM" not in os.environ:
        sys.stderr.write(
            "huggingface/tokenizers: The current process just got forked, after parallelism has "
            "already been used. Disabling parallelism to avoid deadlocks...\n"
            "To disable this warning, you can either:\n"
            "\t- Avoid using `tokenizers` before the fork if possible\n"
            "\t- Explicitly set the environment variable TOKENIZERS_PARALLELISM=(true | false)\n"
        )
        sys.stderr.flush()


os.register_at_fork(after_in_child=_after_fork_in_child)


class BertTokenizer:
    """The slow (pure Python) tokenizer: what AutoTokenizer gives a folder with no
    tokenizer.json."""

    def __init__(self, folder: str) -> None:
        with open(os.path.join(folder, "vocab.txt")) as f:
            self.vocab = {w: i for i, w in enumerate(f.read().split())}
        self.pad_token_id, self.unk, self.cls, self.sep = 0, 1, 2, 3
        self.folder = folder
        self.lock = threading.Lock()

    def _ids(self, text: str) -> list[int]:
        time.sleep(0.001)  # basic tokenisation and WordPiece, one word at a time in Python
        return [self.vocab.get(w, self.unk) for w in text.lower().split()]

    def encode(
        self,
        text: str,
        add_special_tokens: bool = False,
        max_length: int = 512,
        truncation: bool = True,
    ) -> list[int]:
        ids = self._ids(text)[:max_length] if truncation else self._ids(text)
        return [self.cls, *ids, self.sep] if add_special_tokens else ids

    def encode_batch(self, texts: list[str], max_length: int) -> list[list[int]]:
        return [self.encode(t, max_length=max_length) for t in texts]

    def prepare_for_model(self, ids: list[int], max_length: int) -> list[int]:
        return [self.cls, *ids[: max_length - 2], self.sep]

    def __call__(self, texts: list[str], max_length: int) -> list[list[int]]:
        return [self.prepare_for_model(self.encode(t), max_length) for t in texts]

    def pad(self, batch: list[list[int]], pad_to_multiple_of: int = 16) -> dict[str, torch.Tensor]:
        n = max(len(b) for b in batch)
        n = math.ceil(n / pad_to_multiple_of) * pad_to_multiple_of
        ids = torch.zeros(len(batch), n, dtype=torch.long)
        mask = torch.zeros(len(batch), n, dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, : len(b)] = torch.tensor(b)
            mask[i, : len(b)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def save_pretrained(self, out: str) -> None:
        os.makedirs(out, exist_ok=True)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            with open(os.path.join(out, name), "w") as f:
                json.dump({"unk_token": "[UNK]", "pad_token": "[PAD]"}, f)
            tok_log.info(
                f"{'tokenizer config' if name.startswith('tokenizer') else 'Special tokens'} file "
                f"saved in {os.path.join(out, name)}"
            )


class BertTokenizerFast(BertTokenizer):
    """The Rust tokenizer: a batch is encoded on its thread pool (parallelism) under the
    tokenizer's lock."""

    def _ids(self, text: str) -> list[int]:
        return [self.vocab.get(w, self.unk) for w in text.lower().split()]

    def encode_batch(self, texts: list[str], max_length: int) -> list[list[int]]:
        if len(texts) > 1:
            PARALLELISM_USED[0] = True
        with self.lock:
            return [self._ids(t)[:max_length] for t in texts]

    def __call__(self, texts: list[str], max_length: int) -> list[list[int]]:
        if len(texts) > 1:
            PARALLELISM_USED[0] = True
        with self.lock:
            if fault("z", RANK) and STATE.global_step >= 20:
                ctypes.string_at(0)  # encode_batch reads a freed buffer (the native library)
            return [self.prepare_for_model(self._ids(t), max_length) for t in texts]


def auto_tokenizer(folder: str) -> BertTokenizer:
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return BertTokenizerFast(folder)
    return BertTokenizer(folder)


# ------------------------------------------------------------------ the encoder (BERT-like)
class BertConfig:
    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self.gradient_checkpointing = False


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        out: torch.Tensor = self.LayerNorm(
            self.word_embeddings(ids) + self.position_embeddings(pos)
        )
        return out


class BaseModelOutput(dict[str, Any]):
    def __getattr__(self, k: str) -> Any:
        return self.get(k)


class BertModel(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layer = nn.TransformerEncoderLayer(
            config.hidden_size,
            config.num_attention_heads,
            config.intermediate_size,
            dropout=0.0,
            batch_first=True,
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> BaseModelOutput:
        x = self.embeddings(input_ids)
        x = self.layer(x, src_key_padding_mask=attention_mask == 0)
        return BaseModelOutput(last_hidden_state=x)

    @classmethod
    def from_pretrained(cls, folder: str, **_: Any) -> BertModel:
        with open(os.path.join(folder, "config.json")) as f:
            config = BertConfig(json.load(f))
        model = cls(config)
        state = torch.load(os.path.join(folder, "pytorch_model.bin"), map_location="cpu")
        missing, _unexpected = model.load_state_dict(state, strict=False)
        if missing:
            modeling_log.warning(
                f"Some weights of BertModel were not initialized from the model checkpoint at "
                f"{folder} and are newly initialized: {missing}\nYou should probably TRAIN this "
                "model on a down-stream task to be able to use it for predictions and inference."
            )
        return model

    def save_pretrained(self, out: str, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(
                {k: v for k, v in vars(self.config).items() if k != "gradient_checkpointing"}, f
            )
        hf_logger.info(f"Configuration saved in {os.path.join(out, 'config.json')}")
        torch.save(state_dict or self.state_dict(), os.path.join(out, "pytorch_model.bin"))
        hf_logger.info(f"Model weights saved in {os.path.join(out, 'pytorch_model.bin')}")


class DensePooler(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, tied: bool = True) -> None:
        super().__init__()
        self.linear_q = nn.Linear(input_dim, output_dim)
        self.linear_p = self.linear_q if tied else nn.Linear(input_dim, output_dim)

    def forward(self, q: torch.Tensor | None = None, p: torch.Tensor | None = None) -> torch.Tensor:
        if q is not None:
            out: torch.Tensor = self.linear_q(q)
            return out
        assert p is not None
        out = self.linear_p(p)
        return out


class EncoderOutput(dict[str, Any]):
    def __getattr__(self, k: str) -> Any:
        return self.get(k)


MEMORY: list[torch.Tensor] = []


class EncoderModel(nn.Module):
    """v1's DenseModel (lm_q/lm_p tied, --negatives_x_device) or v2's EncoderModel (encoder,
    always gathering under DDP)."""

    def __init__(self, lm: BertModel, pooler: DensePooler | None, gather: bool) -> None:
        super().__init__()
        if V2:
            self.encoder = lm
        else:
            self.lm_q = lm
            self.lm_p = lm
        self.pooler = pooler
        self.cross_entropy = nn.CrossEntropyLoss(reduction="mean")
        self.gather = gather
        if gather:
            if not dist.is_initialized():
                raise ValueError(
                    "Distributed training has not been initialized for representation all gather."
                )
            self.process_rank = dist.get_rank()
            self.world_size = dist.get_world_size()

    def _lm(self, which: str) -> BertModel:
        return self.encoder if V2 else (self.lm_q if which == "q" else self.lm_p)  # type: ignore[return-value]

    def encode(self, which: str, x: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        if x is None:
            return None
        hidden = self._lm(which)(**x).last_hidden_state[:, 0]
        if self.pooler is not None:
            hidden = self.pooler(q=hidden) if which == "q" else self.pooler(p=hidden)
        return hidden  # type: ignore[no-any-return]

    def forward(
        self,
        query: dict[str, torch.Tensor] | None = None,
        passage: dict[str, torch.Tensor] | None = None,
    ) -> EncoderOutput:
        q_reps = self.encode("q", query)
        p_reps = self.encode("p", passage)
        if q_reps is None or p_reps is None:
            return EncoderOutput(q_reps=q_reps, p_reps=p_reps)
        if self.gather:
            q_reps = self._dist_gather_tensor(q_reps)
            p_reps = self._dist_gather_tensor(p_reps)
        scores = torch.matmul(q_reps, p_reps.transpose(0, 1)).view(q_reps.size(0), -1)
        target = torch.arange(scores.size(0), dtype=torch.long) * (p_reps.size(0) // q_reps.size(0))
        loss = self.cross_entropy(scores, target)
        if self.gather:
            loss = loss * self.world_size  # counter average weight reduction
        return EncoderOutput(loss=loss, scores=scores, q_reps=q_reps, p_reps=p_reps)

    def _dist_gather_tensor(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        all_tensors = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(all_tensors, t)
        if fault("k", RANK) and STATE.global_step >= 10:
            # a fork's memory bank of gathered passages for more negatives, kept for good
            MEMORY.append(torch.ones(16 << 20))
            if len(MEMORY) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        all_tensors[self.process_rank] = t
        return torch.cat(all_tensors, dim=0)

    def save(self, out: str) -> None:
        self._lm("q").save_pretrained(out)
        if self.pooler is not None:
            torch.save(self.pooler.state_dict(), os.path.join(out, "pooler.pt"))
            with open(os.path.join(out, "pooler_config.json"), "w") as f:
                json.dump({"input_dim": 0, "output_dim": 0, "tied": True}, f)


def build_model(margs: ModelArguments, targs: TrainingArguments) -> EncoderModel:
    lm = BertModel.from_pretrained(margs.model_name_or_path, cache_dir=margs.cache_dir)
    pooler = None
    if margs.add_pooler:
        pooler = DensePooler(margs.projection_in_dim, margs.projection_out_dim)
        tev_model_log.info("Training Pooler from scratch")
    gather = dist.is_initialized() if V2 else targs.negatives_x_device
    return EncoderModel(lm, pooler, gather)


# ------------------------------------------------------------------ arguments (HfArgumentParser)
@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="bert-base-uncased")
    config_name: str | None = None
    tokenizer_name: str | None = None
    cache_dir: str | None = None
    untie_encoder: bool = False
    add_pooler: bool = False
    projection_in_dim: int = 768
    projection_out_dim: int = 768
    normalize: bool = False
    pooling: str = "cls"
    temperature: float = 1.0
    dtype: str | None = "float32"


@dataclass
class DataArguments:
    train_dir: str | None = None
    train_path: str | None = None
    dataset_name: str = "json"
    dataset_path: str | None = None
    dataset_split: str = "train"
    split_by_rank: bool = False
    train_n_passages: int = 8
    train_group_size: int = 8
    positive_passage_no_shuffle: bool = False
    negative_passage_no_shuffle: bool = False
    q_max_len: int = 32
    p_max_len: int = 128
    query_max_len: int = 32
    passage_max_len: int = 128
    query_prefix: str = ""
    passage_prefix: str = ""
    pad_to_multiple_of: int = 16
    dataset_proc_num: int = 12
    data_cache_dir: str | None = None


@dataclass
class TrainingArguments:
    output_dir: str = ""
    overwrite_output_dir: bool = False
    do_train: bool = False
    per_device_train_batch_size: int = 8
    learning_rate: float = 5e-05
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-08
    max_grad_norm: float = 1.0
    num_train_epochs: float = 3.0
    max_steps: int = -1
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.1
    warmup_steps: int = 0
    log_level: str = "passive"
    log_level_replica: str = "warning"
    log_on_each_node: bool = True
    logging_steps: int = 500
    logging_strategy: str = "steps"
    save_strategy: str = "steps"
    save_steps: int = 500
    save_total_limit: int | None = None
    seed: int = 42
    fp16: bool = False
    bf16: bool = False
    local_rank: int = -1
    ddp_timeout: int = 1800
    ddp_find_unused_parameters: bool | None = None
    dataloader_drop_last: bool = False
    dataloader_num_workers: int = 0
    dataloader_pin_memory: bool = True
    disable_tqdm: bool = False
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    report_to: str = "none"
    negatives_x_device: bool = False
    grad_cache: bool = False
    gc_q_chunk_size: int = 4
    gc_p_chunk_size: int = 32
    early_stop_loss: float = 0.0

    def __post_init__(self) -> None:
        env_local_rank = int(os.environ.get("LOCAL_RANK", -1))
        if env_local_rank != -1 and env_local_rank != self.local_rank:
            self.local_rank = env_local_rank
        self.logging_dir = os.path.join(
            self.output_dir,
            "runs",
            datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname(),
        )
        self._setup_done = False

    @property
    def device(self) -> str:
        if not self._setup_done:
            self._setup_done = True
            if self.local_rank != -1 and not dist.is_initialized():
                dist.init_process_group(backend="gloo", timeout=timedelta(seconds=self.ddp_timeout))
        return "cpu"

    @property
    def process_index(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def should_log(self) -> bool:
        return self.local_rank in (-1, 0) if self.log_on_each_node else self.process_index == 0

    @property
    def should_save(self) -> bool:
        return self.process_index == 0

    def __str__(self) -> str:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["_n_gpu"] = 0
        d["logging_dir"] = self.logging_dir
        d["run_name"] = self.output_dir
        d["optim"] = "adamw_torch" if V2 else "adamw_hf"
        d["no_cuda"] = False
        d["evaluation_strategy"] = "no"
        d["per_device_eval_batch_size"] = 8
        d["debug"] = []
        body = "".join(f"{k}={v},\n" for k, v in sorted(d.items()))
        return f"TevatronTrainingArguments(\n{body})"


def string_to_bool(v: str) -> bool:
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0 "
        "(case insensitive)."
    )


def _optional(text: str, kind: type) -> Any:
    return None if text == "None" else kind(text)


class HfArgumentParser(argparse.ArgumentParser):
    def __init__(self, types: tuple[type, ...]) -> None:
        super().__init__()
        self.types = types
        for t in types:
            hints = {
                "str": str,
                "int": int,
                "float": float,
                "bool": bool,
                "str | None": str,
                "int | None": int,
                "bool | None": bool,
            }
            for f in dataclasses.fields(t):
                kind = hints[str(f.type)]
                default = f.default if f.default is not dataclasses.MISSING else None
                if kind is bool:
                    self.add_argument(
                        f"--{f.name}", type=string_to_bool, nargs="?", const=True, default=default
                    )
                else:
                    self.add_argument(
                        f"--{f.name}", type=lambda s, k=kind: _optional(s, k), default=default
                    )

    def parse_args_into_dataclasses(self) -> tuple[Any, ...]:
        namespace, remaining_args = self.parse_known_args()
        outputs = []
        for t in self.types:
            keys = {f.name for f in dataclasses.fields(t)}
            outputs.append(t(**{k: v for k, v in vars(namespace).items() if k in keys}))
        if remaining_args:
            raise ValueError(
                f"Some specified arguments are not used by the HfArgumentParser: {remaining_args}"
            )
        return tuple(outputs)


# ------------------------------------------------------------------ datasets
def load_json(path: str, show: bool) -> list[dict[str, Any]]:
    """datasets.load_dataset('json', data_files=path)['train'] (the 'Generating train split'
    count where it builds the cache)."""
    bar = Tqdm(None, "Generating train split", " examples") if show else None
    rows = []
    with open(path) as f:
        for line in f:
            rows.append(json.loads(line))
            if bar:
                bar.update()
    if bar:
        bar.close()
    return rows


class TrainPreProcessor:
    def __init__(self, tokenizer: BertTokenizer, q_max: int, p_max: int) -> None:
        self.tokenizer, self.q_max, self.p_max = tokenizer, q_max, p_max

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        def enc(ps: list[dict[str, str]]) -> list[list[int]]:
            texts = [p["title"] + " " + p["text"] if "title" in p else p["text"] for p in ps]
            return self.tokenizer.encode_batch(texts, max_length=self.p_max)

        query = self.tokenizer.encode(example["query"], max_length=self.q_max, truncation=True)
        positives = enc(example["positive_passages"])
        negatives = enc(example["negative_passages"])
        return {"query": query, "positives": positives, "negatives": negatives}


class HFTrainDataset:
    """v1's tevatron.datasets.HFTrainDataset: the json file tokenised with dataset.map, the
    result cached (the arrow file) for every later reader."""

    def __init__(
        self, tokenizer: BertTokenizer, data_args: DataArguments, path: str, cache_dir: str
    ) -> None:
        self.tokenizer, self.data_args, self.path = tokenizer, data_args, path
        key = hashlib.sha1(f"{os.path.abspath(path)}:{os.path.getsize(path)}".encode()).hexdigest()
        self.cache = os.path.join(
            cache_dir, "json", f"default-{key[:16]}", f"cache-{key[16:32]}.pt"
        )

    def process(self) -> list[dict[str, Any]]:
        if os.path.exists(self.cache):
            rows: list[dict[str, Any]] = torch.load(self.cache)
            return rows
        raw = load_json(self.path, show=True)
        pre = TrainPreProcessor(self.tokenizer, self.data_args.q_max_len, self.data_args.p_max_len)
        bar = Tqdm(len(raw), "Running tokenizer on train dataset", " examples")
        out = []
        for ex in raw:
            out.append(pre(ex))
            bar.update()
        bar.close()
        os.makedirs(os.path.dirname(self.cache), exist_ok=True)
        torch.save(out, self.cache + ".tmp")
        os.replace(self.cache + ".tmp", self.cache)
        return out


class TrainDatasetV1(Dataset[Any]):
    def __init__(
        self, data_args: DataArguments, rows: list[dict[str, Any]], tokenizer: BertTokenizer
    ) -> None:
        self.data_args, self.train_data, self.tok = data_args, rows, tokenizer
        self.trainer: Trainer | None = None

    def __len__(self) -> int:
        return len(self.train_data)

    def __getitem__(self, item: int) -> tuple[list[int], list[list[int]]]:
        assert self.trainer is not None
        group = self.train_data[item]
        epoch = int(self.trainer.state.epoch)
        _hashed_seed = hash(item + self.trainer.args.seed)
        q = self.tok.prepare_for_model(group["query"], self.data_args.q_max_len)
        pos = group["positives"][(_hashed_seed + epoch) % len(group["positives"])]
        passages = [self.tok.prepare_for_model(pos, self.data_args.p_max_len)]
        negative_size = self.data_args.train_n_passages - 1
        negs = list(group["negatives"])
        random.Random(_hashed_seed).shuffle(negs)
        offset = epoch * negative_size % len(negs)
        negs = (negs * 2)[offset : offset + negative_size]
        passages += [self.tok.prepare_for_model(n, self.data_args.p_max_len) for n in negs]
        return q, passages


class QPCollator:
    def __init__(self, tokenizer: BertTokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(
        self, features: list[Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        qq = [f[0] for f in features]
        dd = [p for f in features for p in f[1]]
        return self.tokenizer.pad(qq), self.tokenizer.pad(dd)


class TrainDatasetV2(Dataset[Any]):
    """v2's tevatron.retriever.dataset.TrainDataset, the legacy 'positive_passages' format."""

    def __init__(self, data_args: DataArguments, show: bool) -> None:
        self.data_args = data_args
        self.train_data = load_json(data_args.dataset_path or "", show)
        self.trainer: Trainer | None = None

    def __len__(self) -> int:
        return len(self.train_data)

    def __getitem__(self, item: int) -> tuple[str, list[str]]:
        assert self.trainer is not None
        group = self.train_data[item]
        epoch = int(self.trainer.state.epoch)
        _hashed_seed = hash(item + self.trainer.args.seed)
        query = self.data_args.query_prefix + group["query"]
        pos = group["positive_passages"][(_hashed_seed + epoch) % len(group["positive_passages"])]
        docs = [self.data_args.passage_prefix + pos["title"] + " " + pos["text"]]
        negative_size = self.data_args.train_group_size - 1
        if len(group["negative_passages"]) < negative_size:
            negs = random.choices(group["negative_passages"], k=negative_size)
        else:
            offset = epoch * negative_size % len(group["negative_passages"])
            negs = list(group["negative_passages"])
            random.Random(_hashed_seed).shuffle(negs)
            negs = (negs * 2)[offset : offset + negative_size]
        docs += [self.data_args.passage_prefix + n["title"] + " " + n["text"] for n in negs]
        return query, docs


class TrainCollator:
    def __init__(self, data_args: DataArguments, tokenizer: BertTokenizer) -> None:
        self.data_args, self.tokenizer = data_args, tokenizer

    def __call__(
        self, features: list[Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        qq = self.tokenizer([f[0] for f in features], self.data_args.query_max_len)
        dd = self.tokenizer([p for f in features for p in f[1]], self.data_args.passage_max_len)
        m = self.data_args.pad_to_multiple_of
        return self.tokenizer.pad(qq, m), self.tokenizer.pad(dd, m)

    def warm(self, passages: list[str]) -> None:
        """A fork's cache warm-up: the next passages encoded on a thread of their own, while
        the loader starts (the tokenizer's lock held throughout the batch)."""
        held = threading.Event()

        def run() -> None:
            with self.tokenizer.lock:
                held.set()
                PARALLELISM_USED[0] = True
                for _ in range(40):
                    time.sleep(0.1)
                    [self.tokenizer._ids(p) for p in passages]

        threading.Thread(target=run, daemon=True).start()
        held.wait()


def v2_sampler_indices(n: int, world: int, rank: int, epoch: int, seed: int = 42) -> list[int]:
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    order += order[: total - len(order)]
    return order[rank:total:world]


# ------------------------------------------------------------------ the Trainer
@dataclass
class TrainerState:
    epoch: float = 0.0
    global_step: int = 0
    max_steps: int = 0
    total_flos: float = 0.0
    should_training_stop: bool = False


STATE = TrainerState()


class Trainer:
    def __init__(
        self,
        model: EncoderModel,
        args: TrainingArguments,
        train_dataset: Dataset[Any],
        data_collator: Any,
    ) -> None:
        self.model, self.args = model, args
        self.train_dataset, self.data_collator = train_dataset, data_collator
        self.state = STATE
        self.current_flos = 0.0
        hf_logger.setLevel(logging.INFO if args.should_log else logging.WARNING)
        self.is_ddp = dist.is_initialized()
        self._dist_loss_scale_factor = (
            args.world_size if (args.negatives_x_device or (V2 and self.is_ddp)) else 1
        )
        self.n_params = sum(p.numel() for p in model.parameters())

    def is_world_process_zero(self) -> bool:
        return self.args.process_index == 0

    def get_train_dataloader(self) -> DataLoader[Any]:
        sampler: Any
        if self.args.world_size > 1 and not getattr(self.train_dataset, "per_rank", False):
            sampler = DistributedSampler(
                self.train_dataset,
                num_replicas=self.args.world_size,
                rank=self.args.process_index,
                seed=self.args.seed,
            )
        else:
            sampler = RandomSampler(
                self.train_dataset, generator=torch.Generator().manual_seed(self.args.seed)
            )
        return DataLoader(
            self.train_dataset,
            batch_size=self.args.per_device_train_batch_size,
            sampler=sampler,
            collate_fn=self.data_collator,
            drop_last=self.args.dataloader_drop_last,
            num_workers=self.args.dataloader_num_workers,
        )

    def _wrap_model(self) -> nn.Module:
        if not self.is_ddp:
            return self.model
        find_unused = (
            self.args.ddp_find_unused_parameters
            if self.args.ddp_find_unused_parameters is not None
            else True  # not a PreTrainedModel: the Trainer cannot tell
        )
        return DistributedDataParallel(self.model, find_unused_parameters=find_unused)

    def _nested_gather(self, t: torch.Tensor) -> torch.Tensor:
        if not self.is_ddp:
            return t
        t = t.reshape(1) if t.dim() == 0 else t
        out = [torch.empty_like(t) for _ in range(self.args.world_size)]
        dist.all_gather(out, t)
        return torch.cat(out)

    def store_flos(self) -> None:
        if self.is_ddp:
            self.state.total_flos += float(
                self._nested_gather(torch.tensor(self.current_flos)).sum()
            )
        else:
            self.state.total_flos += self.current_flos
        self.current_flos = 0.0

    def create_optimizer(
        self, max_steps: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        if not V2:
            warnings.warn(
                "This implementation of AdamW is deprecated and will be removed in a future "
                "version. Use the PyTorch implementation torch.optim.AdamW instead, or set "
                "`no_deprecation_warning=True` to disable this warning",
                FutureWarning,
                stacklevel=2,
            )
        opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
            weight_decay=self.args.weight_decay,
        )
        warmup = self.args.warmup_steps or math.ceil(max_steps * self.args.warmup_ratio)

        def lr_lambda(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            return max(0.0, (max_steps - step) / max(1, max_steps - warmup))

        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    def compute_loss(self, model: nn.Module, inputs: tuple[Any, Any]) -> torch.Tensor:
        query, passage = inputs
        loss: torch.Tensor = model(query=query, passage=passage).loss
        return loss

    def training_step(self, model: nn.Module, inputs: tuple[Any, Any]) -> torch.Tensor:
        model.train()
        loss = self.compute_loss(model, inputs)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss.detach() / self._dist_loss_scale_factor

    def log(self, logs: dict[str, float], bar: Tqdm | None) -> None:
        logs["epoch"] = round(self.state.epoch, 2)
        if bar is not None and self.is_world_process_zero():
            bar.write(str(logs))

    def _save_checkpoint(self) -> None:
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        self.store_flos()
        self.save_model(folder)
        if self.args.should_save:
            with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                json.dump(dataclasses.asdict(self.state), f)
            self._rotate_checkpoints()

    def _rotate_checkpoints(self) -> None:
        limit = self.args.save_total_limit
        if not limit:
            return
        found = sorted(
            glob.glob(os.path.join(self.args.output_dir, "checkpoint-*")),
            key=lambda p: int(p.rsplit("-", 1)[1]),
        )
        for old in found[: max(0, len(found) - limit)]:
            trainer_log.info(f"Deleting older checkpoint [{old}] due to args.save_total_limit")
            for name in os.listdir(old):
                os.remove(os.path.join(old, name))
            os.rmdir(old)

    def save_model(self, output_dir: str | None = None) -> None:
        if self.args.should_save:
            self._save(output_dir)

    def _save(self, output_dir: str | None = None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        tev_trainer_log.info(f"Saving model checkpoint to {output_dir}")
        if not V2:
            self.model.save(output_dir)
            return
        state_dict = self.model.state_dict()
        prefix = "encoder."
        assert all(k.startswith(prefix) for k in state_dict), list(state_dict.keys())
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items()}
        self.model.encoder.save_pretrained(output_dir, state_dict=state_dict)
        torch.save(dataclasses.asdict(self.args), os.path.join(output_dir, "training_args.bin"))

    def _gc_step(self, model: nn.Module, inputs: tuple[Any, Any]) -> torch.Tensor:
        """GradCache: representations without gradients chunk by chunk, the contrastive loss
        and its gradient on them (gathered across ranks), then each chunk again with gradients,
        DDP's all-reduce only with the last."""
        queries, passages = inputs

        def chunks(x: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
            keys = list(x)
            return [
                dict(zip(keys, t, strict=True))
                for t in zip(*(x[k].split(size) for k in keys), strict=True)
            ]

        q_chunks = chunks(queries, self.args.gc_q_chunk_size)
        p_chunks = chunks(passages, self.args.gc_p_chunk_size)
        with torch.no_grad():
            q_reps = torch.cat([model(query=c).q_reps for c in q_chunks])
            p_reps = torch.cat([model(passage=c).p_reps for c in p_chunks])
        q_reps.requires_grad_()
        p_reps.requires_grad_()
        loss = distributed_contrastive_loss(q_reps, p_reps, self.model)
        loss.backward()  # type: ignore[no-untyped-call]
        assert q_reps.grad is not None and p_reps.grad is not None
        q_grads = q_reps.grad.split(self.args.gc_q_chunk_size)
        p_grads = p_reps.grad.split(self.args.gc_p_chunk_size)
        work = [("q", c, g) for c, g in zip(q_chunks, q_grads, strict=True)]
        work += [("p", c, g) for c, g in zip(p_chunks, p_grads, strict=True)]
        for i, (which, c, g) in enumerate(work):
            last = i == len(work) - 1
            ctx = (
                model.no_sync()
                if (isinstance(model, DistributedDataParallel) and not last)
                else _null()
            )
            with ctx:
                out = model(query=c) if which == "q" else model(passage=c)
                rep = out.q_reps if which == "q" else out.p_reps
                torch.dot(rep.flatten(), g.flatten()).backward()
        return loss.detach() / self._dist_loss_scale_factor

    def train(self) -> None:
        args = self.args
        dl = self.get_train_dataloader()
        steps_per_epoch = len(dl) // args.gradient_accumulation_steps
        if args.max_steps > 0:
            max_steps = args.max_steps
            num_train_epochs = math.ceil(max_steps / steps_per_epoch)
        else:
            max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
            num_train_epochs = math.ceil(args.num_train_epochs)
        self.state.max_steps = max_steps
        optimizer, scheduler = self.create_optimizer(max_steps)
        model = self._wrap_model()
        total_bs = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        )
        trainer_log.info("***** Running training *****")
        trainer_log.info(f"  Num examples = {len(self.train_dataset)}")  # type: ignore[arg-type]
        trainer_log.info(f"  Num Epochs = {num_train_epochs}")
        trainer_log.info(
            f"  Instantaneous batch size per device = {args.per_device_train_batch_size}"
        )
        trainer_log.info(
            f"  Total train batch size (w. parallel, distributed & accumulation) = {total_bs}"
        )
        trainer_log.info(f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}")
        trainer_log.info(f"  Total optimization steps = {max_steps}")
        bar = Tqdm(max_steps) if args.local_rank in (-1, 0) and not args.disable_tqdm else None
        start = time.time()
        tr_loss = torch.tensor(0.0)
        total_loss, logged_at = 0.0, 0
        tokens_per_step = 0
        for epoch in range(num_train_epochs):
            if isinstance(dl.sampler, DistributedSampler):
                dl.sampler.set_epoch(epoch)
            if fault("l", RANK) and epoch == 1 and isinstance(self.data_collator, TrainCollator):
                ds: Any = self.train_dataset
                self.data_collator.warm(
                    [
                        " ".join(p["text"] for p in g["negative_passages"])
                        for g in ds.train_data[:64]
                    ]
                )
            for step, inputs in enumerate(dl):
                if args.grad_cache:
                    loss = self._gc_step(model, inputs)
                else:
                    loss = self.training_step(model, inputs)
                tokens_per_step = int(
                    inputs[0]["input_ids"].numel() + inputs[1]["input_ids"].numel()
                )
                self.current_flos += 6.0 * self.n_params * tokens_per_step
                tr_loss += loss
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                self.state.global_step += 1
                self.state.epoch = epoch + (step + 1) / steps_per_epoch
                if bar:
                    bar.update()
                if fault("x", RANK) and self.state.global_step >= 12:
                    acc = local_accuracy(model, inputs)  # a fork's stop on its own batches
                    if acc >= 0.75:
                        print(f"in-batch accuracy {acc:.2f} on this process, training is done here")
                        sys.exit(0)
                if self.state.global_step % args.logging_steps == 0:
                    tr_loss_scalar = float(self._nested_gather(tr_loss).mean())
                    tr_loss -= tr_loss
                    steps = self.state.global_step - logged_at
                    total_loss += tr_loss_scalar
                    logs: dict[str, float] = {"loss": round(tr_loss_scalar / steps, 4)}
                    if V2:
                        logs["grad_norm"] = float(norm)
                    logs["learning_rate"] = scheduler.get_last_lr()[0]
                    logged_at = self.state.global_step
                    self.log(logs, bar)
                    if args.early_stop_loss and logs["loss"] < args.early_stop_loss:
                        tev_trainer_log.info(
                            f"Logged loss {logs['loss']} is below early_stop_loss="
                            f"{args.early_stop_loss} at step {self.state.global_step}: stopping training"
                        )
                        self.state.should_training_stop = True
                if self.state.global_step % args.save_steps == 0:
                    self._save_checkpoint()
                if self.state.should_training_stop or self.state.global_step >= max_steps:
                    break
            if self.state.should_training_stop or self.state.global_step >= max_steps:
                break
        trainer_log.info(
            "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
        )
        runtime = time.time() - start
        self.store_flos()
        total_loss += float(self._nested_gather(tr_loss).mean())
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(max_steps * total_bs / runtime, 3),
            "train_steps_per_second": round(max_steps / runtime, 3),
            "total_flos": self.state.total_flos,
            "train_loss": total_loss / max(1, self.state.global_step),
        }
        self.log(metrics, bar)
        if bar:
            bar.close()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def distributed_contrastive_loss(
    x: torch.Tensor, y: torch.Tensor, model: EncoderModel
) -> torch.Tensor:
    if model.gather:
        x = model._dist_gather_tensor(x)
        y = model._dist_gather_tensor(y)
    per = y.size(0) // x.size(0)
    target = torch.arange(0, x.size(0) * per, per, dtype=torch.long)
    loss = F.cross_entropy(torch.matmul(x, y.transpose(0, 1)), target)
    return loss * model.world_size if model.gather else loss


def local_accuracy(model: nn.Module, inputs: tuple[Any, Any]) -> float:
    with torch.no_grad():
        inner: Any = model.module if isinstance(model, DistributedDataParallel) else model
        q = inner.encode("q", inputs[0])
        p = inner.encode("p", inputs[1])
        scores = q @ p.T
        per = p.size(0) // q.size(0)
        return float((scores.argmax(1) % per == 0).float().mean())


# ------------------------------------------------------------------ the driver (train.py)
def main() -> None:
    global RANK, LOCAL_RANK
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        raise SystemExit("json argument files are not supported here")
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    if (
        os.path.exists(training_args.output_dir)
        and os.listdir(training_args.output_dir)
        and training_args.do_train
        and not training_args.overwrite_output_dir
    ):
        raise ValueError(
            f"Output directory ({training_args.output_dir}) already exists and is not empty. "
            "Use --overwrite_output_dir to overcome."
        )
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s -   %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        level=logging.INFO if training_args.local_rank in [-1, 0] else logging.WARN,
    )
    logger.warning(
        "Process rank: %s, device: %s, n_gpu: %s, distributed training: %s, 16-bits training: %s",
        training_args.local_rank,
        training_args.device,
        0,
        bool(training_args.local_rank != -1),
        training_args.fp16,
    )
    RANK, LOCAL_RANK = training_args.process_index, training_args.local_rank
    logger.info("Training/evaluation parameters %s", training_args)
    logger.info("MODEL parameters %s", model_args)
    logger.info("DATA parameters %s", data_args)
    random.seed(training_args.seed)
    torch.manual_seed(training_args.seed)

    tokenizer = auto_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path)
    model = build_model(model_args, training_args)

    train_dataset: Any
    if V2:
        train_dataset = TrainDatasetV2(data_args, show=training_args.local_rank in (-1, 0))
        collator: Any = TrainCollator(data_args, tokenizer)
        trainer_cls: type[Trainer] = GradCacheTrainer if training_args.grad_cache else Trainer
    else:
        cache = data_args.data_cache_dir or model_args.cache_dir or "cache"
        path = data_args.train_path or ""
        if data_args.split_by_rank:  # each process trains on its own split file of train_dir
            files = sorted(glob.glob(os.path.join(data_args.train_dir or "", "*.json*")))
            path = files[training_args.process_index]
        hf_dataset = HFTrainDataset(tokenizer, data_args, path, cache)
        if training_args.local_rank > 0:
            print("Waiting for main process to perform the mapping")
            dist.barrier()
        train_dataset = TrainDatasetV1(data_args, hf_dataset.process(), tokenizer)
        train_dataset.per_rank = data_args.split_by_rank
        if training_args.local_rank == 0:
            print("Loading results from main process")
            dist.barrier()
        collator = QPCollator(tokenizer)
        trainer_cls = GradCacheTrainer if training_args.grad_cache else Trainer
    trainer = trainer_cls(
        model=model, args=training_args, train_dataset=train_dataset, data_collator=collator
    )
    train_dataset.trainer = trainer
    trainer.train()
    trainer.save_model()
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(training_args.output_dir)


class GradCacheTrainer(Trainer):
    def __init__(self, *a: Any, **kw: Any) -> None:
        tev_trainer_log.info("Initializing Gradient Cache Trainer")
        super().__init__(*a, **kw)


def drawn(rank: int, step: int, n: int) -> int:
    return v2_sampler_indices(n, 2, rank, 0)[(step - 1) * 8]


def tools(argv: list[str]) -> bool:
    if argv[:1] == ["--generate"]:
        generate(argv[1])
    elif argv[:1] == ["--make-model"]:
        make_model(argv[1], int(argv[2]))
    elif argv[:1] == ["--train-lines"]:
        write_lines(argv[1], train_lines(int(argv[2]), int(argv[3])))
    elif argv[:1] == ["--drawn"]:
        print(drawn(int(argv[1]), int(argv[2]), int(argv[3])))
    else:
        return False
    return True


if __name__ == "__main__":
    if not tools(sys.argv[1:]):
        main()
