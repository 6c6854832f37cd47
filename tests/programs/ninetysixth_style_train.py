"""A ninety-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/ninetysixth-*): parameter-efficient fine-tuning (LoRA) of a tiny causal
language model in the way of tloen/alpaca-lora's finetune.py and Hugging Face PEFT, re-implemented
in plain torch (no transformers, no peft, no datasets; linked into each run's folder as
finetune.py). `torchrun --nproc_per_node N finetune.py --base_model ./tiny-llama --data_path
./alpaca_data.json --output_dir ./lora-out --micro_batch_size 2 --batch_size 8 --lora_r 8
--lora_target_modules '[q_proj,v_proj]'`: the script prints alpaca-lora's 'Training Alpaca-LoRA
model with params:' block on local rank 0, sets `ddp = world_size != 1` and
`gradient_accumulation_steps = gradient_accumulation_steps // world_size`, loads the base model
(a tiny LLaMA: RMSNorm, rotary attention with q/k/v/o_proj, a SwiGLU MLP) and its character
tokenizer from the base model folder (tokenizer.json, tokenizer_config.json), wraps the target
modules with LoRA adapters the way PEFT's get_peft_model does (every rank prints 'trainable
params: 4,096 || all params: 119,616 || trainable%: 3.4243'), reads the prompt template from
templates/<name>.json (alpaca-lora's Prompter), splits the JSON instruction data set into train
and val_set_size validation records (seed 42), tokenizes each record in the Dataset (cutoff_len,
add_eos_token, train_on_inputs) and pads every micro-batch with the tokenizer's pad token the way
DataCollatorForSeq2Seq does. The loop is a port of the HF Trainer's: DistributedSampler,
DistributedDataParallel (find_unused_parameters=False), no_sync between accumulation steps,
AdamW with linear warmup, per-step dict logging from rank 0 ("{'loss': 4.5151, 'learning_rate':
0.0003, 'epoch': 0.25}") written through a tqdm bar, an evaluation every eval_steps whose loss
is all-reduced ("{'eval_loss': ..., 'eval_runtime': ..., ...}"), save_steps writing
checkpoint-N/adapter_model.bin and adapter_config.json on rank 0, optional early stopping on
eval_loss, the final train metrics dict, lora-out/adapter_model.bin and every rank's "If there's
a warning about missing keys above, please disregard :)". gloo on CPU, 15 s collective timeout,
no destroy_process_group (the Trainer never calls it). `finetune.py --prepare` writes the base
model folder, the data set and the template. A fault in the code is chosen by the TQ_CASE
environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import os.path as osp
import queue
import random
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

SPECIALS = ["<unk>", "<s>", "</s>"]


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ---------------------------------------------------------------- the base model's folder


class CharTokenizer:
    """A character tokenizer read from tokenizer.json and tokenizer_config.json."""

    def __init__(self, folder: str) -> None:
        with open(osp.join(folder, "tokenizer.json")) as fp:
            self.vocab: dict[str, int] = json.load(fp)["model"]["vocab"]
        with open(osp.join(folder, "tokenizer_config.json")) as fp:
            config = json.load(fp)
        self.bos_token = config.get("bos_token")
        self.eos_token = config.get("eos_token")
        self.unk_token = config.get("unk_token")
        self.pad_token = config.get("pad_token")
        self.padding_side = config.get("padding_side", "right")
        self.model_max_length = config.get("model_max_length", 2048)

    @classmethod
    def from_pretrained(cls, folder: str) -> CharTokenizer:
        return cls(folder)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.vocab[token]

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    def __call__(
        self, text: str, truncation: bool = False, max_length: int | None = None, **_: object
    ) -> dict[str, list[int]]:
        unk = self.vocab[self.unk_token]
        ids = [self.vocab[self.bos_token]] + [self.vocab.get(c, unk) for c in text]
        if truncation and max_length is not None:
            ids = ids[:max_length]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


class LlamaConfig:
    def __init__(self, **kw: int | float | str) -> None:
        self.__dict__.update(kw)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dim, seq = q.shape[-1], q.shape[-2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = rotary(q, k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size)
        self.gradient_checkpointing = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = causal.view(1, 1, t, t) & attention_mask.bool().view(-1, 1, 1, t)
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, mask)
            else:
                x = layer(x, mask)
        return self.norm(x)


class CausalLMOutput:
    def __init__(self, loss: torch.Tensor | None, logits: torch.Tensor) -> None:
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, folder: str) -> LlamaForCausalLM:
        with open(osp.join(folder, "config.json")) as fp:
            model = cls(LlamaConfig(**json.load(fp)))
        model.load_state_dict(torch.load(osp.join(folder, "pytorch_model.bin")))
        return model

    def gradient_checkpointing_enable(self) -> None:
        self.model.gradient_checkpointing = True

    def enable_input_require_grads(self) -> None:
        def make_inputs_require_grads(module: nn.Module, inputs: object, output: torch.Tensor):
            output.requires_grad_(True)

        self.model.embed_tokens.register_forward_hook(make_inputs_require_grads)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        logits = self.lm_head(self.model(input_ids, attention_mask))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutput(loss, logits)


# ---------------------------------------------------------------- PEFT's LoRA, the parts used


class LoraConfig:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


class LoraLinear(nn.Linear):
    """nn.Linear with a low-rank update: W x + B A dropout(x) * alpha / r (PEFT's lora.Linear)."""

    def __init__(self, base: nn.Linear, r: int, lora_alpha: int, lora_dropout: float) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        self.weight = base.weight
        self.bias = base.bias
        self.lora_dropout = nn.ModuleDict({"default": nn.Dropout(lora_dropout)})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base.out_features, bias=False)})
        self.scaling = lora_alpha / r
        nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B["default"].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        a, b = self.lora_A["default"], self.lora_B["default"]
        return result + b(a(self.lora_dropout["default"](x))) * self.scaling


class LoraModel(nn.Module):
    def __init__(self, model: nn.Module, config: LoraConfig) -> None:
        super().__init__()
        self.model = model
        targets = list(config.target_modules)
        found = False
        for name, module in list(model.named_modules()):
            if not any(name.endswith(t) for t in targets) or not isinstance(module, nn.Linear):
                continue
            found = True
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, LoraLinear(module, config.r, config.lora_alpha,
                                              config.lora_dropout))  # fmt: skip
        if not found:
            raise ValueError(
                f"Target modules {set(targets)} not found in the base model. "
                f"Please check the target modules and try again."
            )
        for n, p in self.model.named_parameters():
            p.requires_grad = "lora_" in n


class PeftModelForCausalLM(nn.Module):
    def __init__(self, model: nn.Module, config: LoraConfig) -> None:
        super().__init__()
        self.peft_config = {"default": config}
        self.base_model = LoraModel(model, config)

    def forward(self, **kwargs: torch.Tensor) -> CausalLMOutput:
        return self.base_model.model(**kwargs)

    def print_trainable_parameters(self) -> None:
        trainable_params = sum(p.numel() for p in self.parameters() if p.requires_grad)
        all_param = sum(p.numel() for p in self.parameters())
        print(
            f"trainable params: {trainable_params:,} || all params: {all_param:,} || "
            f"trainable%: {100 * trainable_params / all_param:.4f}"
        )

    def save_pretrained(self, save_directory: str, letter: str = "") -> None:
        os.makedirs(save_directory, exist_ok=True)
        torch.save(get_peft_model_state_dict(self), osp.join(save_directory, "adapter_model.bin"))
        config = self.peft_config["default"].to_dict()
        if letter == "j":
            config["base_model_name_or_path"] = Path(config["base_model_name_or_path"])
        with open(osp.join(save_directory, "adapter_config.json"), "w") as fp:
            json.dump(config, fp, indent=2)


def get_peft_model(model: nn.Module, config: LoraConfig) -> PeftModelForCausalLM:
    return PeftModelForCausalLM(model, config)


def get_peft_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k.replace(".default", ""): v.detach().clone()
        for k, v in model.state_dict().items()
        if "lora_" in k
    }


def set_peft_model_state_dict(model: nn.Module, peft_model_state_dict: dict) -> object:
    state = {}
    for k, v in peft_model_state_dict.items():
        for part in ("lora_A", "lora_B"):
            k = k.replace(f".{part}.weight", f".{part}.default.weight")
        state[k] = v
    return model.load_state_dict(state, strict=False)


# ---------------------------------------------------------------- alpaca-lora's utils/prompter.py


class Prompter:
    __slots__ = ("_verbose", "template")

    def __init__(self, template_name: str = "", verbose: bool = False) -> None:
        self._verbose = verbose
        if not template_name:
            template_name = "alpaca"
        file_name = osp.join("templates", f"{template_name}.json")
        if not osp.exists(file_name):
            raise ValueError(f"Can't read {file_name}")
        with open(file_name) as fp:
            self.template = json.load(fp)
        if self._verbose:
            print(f"Using prompt template {template_name}: {self.template['description']}")

    def generate_prompt(
        self, instruction: str, input: str | None = None, label: str | None = None
    ) -> str:
        if input:
            res = self.template["prompt_input"].format(instruction=instruction, input=input)
        else:
            res = self.template["prompt_no_input"].format(instruction=instruction)
        if label:
            res = f"{res}{label}"
        if self._verbose:
            print(res)
        return res


# ---------------------------------------------------------------- data


class InstructionDataset(Dataset):
    """The records of the JSON data set, tokenized when a batch asks for them."""

    def __init__(self, records: list[dict], tokenize_fn) -> None:
        self.records = records
        self.tokenize_fn = tokenize_fn

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.tokenize_fn(self.records[i])


class DataCollatorForSeq2Seq:
    def __init__(self, tokenizer: CharTokenizer, pad_to_multiple_of: int = 8) -> None:
        self.tokenizer = tokenizer
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        if self.tokenizer.pad_token is None:
            raise ValueError(
                "Asking to pad but the tokenizer does not have a padding token. Please select a "
                "token to use as `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` "
                "or add a new pad token via `tokenizer.add_special_tokens({'pad_token': "
                "'[PAD]'})`."
            )
        longest = max(len(f["input_ids"]) for f in features)
        longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
        pads = {"input_ids": self.tokenizer.pad_token_id, "attention_mask": 0, "labels": -100}
        for f in features:
            for key, pad in pads.items():
                fill = [pad] * (longest - len(f[key]))
                if self.tokenizer.padding_side == "left":
                    batch[key].append(fill + f[key])
                else:
                    batch[key].append(f[key] + fill)
        return {k: torch.tensor(v) for k, v in batch.items()}


class LengthGroupedBatches:
    """group_by_length: the rank's records sorted by length and packed into micro-batches of at
    most micro_batch_size * cutoff_len tokens (padded), so that short prompts batch densely."""

    def __init__(self, dataset: InstructionDataset, sampler: DistributedSampler, budget: int):
        self.dataset, self.sampler, self.budget = dataset, sampler, budget

    def _batches(self) -> list[list[int]]:
        lengths = {i: len(self.dataset[i]["input_ids"]) for i in self.sampler}
        batches: list[list[int]] = []
        for i in sorted(lengths, key=lambda i: -lengths[i]):
            if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= self.budget:
                batches[-1].append(i)
            else:
                batches.append([i])
        random.Random(self.sampler.epoch).shuffle(batches)
        return batches

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


# ---------------------------------------------------------------- the trainer


def log(pbar: tqdm | None, logs: dict[str, float]) -> None:
    if pbar is not None:
        pbar.write(str(logs))


def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float, int]:
    start = time.time()
    model.eval()
    stats = torch.zeros(2)
    with torch.no_grad():
        for batch in loader:
            out = model(**batch)
            tokens = (batch["labels"][:, 1:] != -100).sum()
            stats += torch.stack([out.loss * tokens, tokens.float()])
    model.train()
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item(), time.time() - start, len(loader)


def str2bool(v: str) -> bool:
    return str(v).lower() in ("1", "true", "yes")


def str2list(v: str) -> list[str]:
    return [s.strip().strip("'\"") for s in v.strip("[]").split(",") if s.strip()]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Alpaca-LoRA fine-tuning (plain torch port)")
    p.add_argument("--prepare", action="store_true", help="write the base model, data, template")
    # model/data params
    p.add_argument("--base_model", default="")
    p.add_argument("--data_path", default="yahma/alpaca-cleaned")
    p.add_argument("--output_dir", default="./lora-alpaca")
    # training hyperparams
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--micro_batch_size", type=int, default=4)
    p.add_argument("--num_epochs", type=int, default=3)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--cutoff_len", type=int, default=256)
    p.add_argument("--val_set_size", type=int, default=2000)
    # lora hyperparams
    p.add_argument("--lora_r", type=int, default=8)
    p.add_argument("--lora_alpha", type=int, default=16)
    p.add_argument("--lora_dropout", type=float, default=0.05)
    p.add_argument("--lora_target_modules", type=str2list, default=["q_proj", "v_proj"])
    # llm hyperparams
    p.add_argument("--train_on_inputs", type=str2bool, nargs="?", const=True, default=True)
    p.add_argument("--add_eos_token", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--group_by_length", type=str2bool, nargs="?", const=True, default=False)
    # wandb params
    p.add_argument("--wandb_project", default="")
    p.add_argument("--wandb_run_name", default="")
    p.add_argument("--wandb_watch", default="")
    p.add_argument("--wandb_log_model", default="")
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--prompt_template_name", default="alpaca")
    # the Trainer's arguments alpaca-lora fixes in code, here flags
    p.add_argument("--warmup_steps", type=int, default=100)
    p.add_argument("--logging_steps", type=int, default=10)
    p.add_argument("--eval_steps", type=int, default=200)
    p.add_argument("--save_steps", type=int, default=200)
    p.add_argument("--early_stopping_patience", type=int, default=0)
    p.add_argument("--early_stopping_threshold", type=float, default=0.0)
    p.add_argument("--gradient_checkpointing", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ddp_timeout", type=int, default=1800)
    return p.parse_args()


def train(args: argparse.Namespace) -> None:
    letter, who = fault()
    base_model, data_path, output_dir = args.base_model, args.data_path, args.output_dir
    batch_size, micro_batch_size = args.batch_size, args.micro_batch_size
    cutoff_len, val_set_size = args.cutoff_len, args.val_set_size
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        print(
            f"Training Alpaca-LoRA model with params:\n"
            f"base_model: {base_model}\n"
            f"data_path: {data_path}\n"
            f"output_dir: {output_dir}\n"
            f"batch_size: {batch_size}\n"
            f"micro_batch_size: {micro_batch_size}\n"
            f"num_epochs: {args.num_epochs}\n"
            f"learning_rate: {args.learning_rate}\n"
            f"cutoff_len: {cutoff_len}\n"
            f"val_set_size: {val_set_size}\n"
            f"lora_r: {args.lora_r}\n"
            f"lora_alpha: {args.lora_alpha}\n"
            f"lora_dropout: {args.lora_dropout}\n"
            f"lora_target_modules: {args.lora_target_modules}\n"
            f"train_on_inputs: {args.train_on_inputs}\n"
            f"add_eos_token: {args.add_eos_token}\n"
            f"group_by_length: {args.group_by_length}\n"
            f"wandb_project: {args.wandb_project}\n"
            f"wandb_run_name: {args.wandb_run_name}\n"
            f"wandb_watch: {args.wandb_watch}\n"
            f"wandb_log_model: {args.wandb_log_model}\n"
            f"resume_from_checkpoint: {args.resume_from_checkpoint or False}\n"
            f"prompt template: {args.prompt_template_name}\n"
        )
    assert base_model, "Please specify a --base_model, e.g. --base_model='huggyllama/llama-7b'"
    gradient_accumulation_steps = batch_size // micro_batch_size

    prompter = Prompter(args.prompt_template_name)

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    ddp = world_size != 1
    if ddp:
        gradient_accumulation_steps = gradient_accumulation_steps // world_size
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.ddp_timeout))
    rank = dist.get_rank() if ddp else 0
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    model = LlamaForCausalLM.from_pretrained(base_model)
    tokenizer = CharTokenizer.from_pretrained(base_model)
    tokenizer.padding_side = "left"  # Allow batched inference

    def tokenize(prompt: str, add_eos_token: bool = True) -> dict[str, list[int]]:
        result = tokenizer(prompt, truncation=True, max_length=cutoff_len, padding=False)
        if (
            result["input_ids"][-1] != tokenizer.eos_token_id
            and len(result["input_ids"]) < cutoff_len
            and add_eos_token
        ):
            result["input_ids"].append(tokenizer.eos_token_id)
            result["attention_mask"].append(1)
        result["labels"] = result["input_ids"].copy()
        return result

    calls: list[int] = []  # records tokenized by this rank

    def generate_and_tokenize_prompt(data_point: dict) -> dict[str, list[int]]:
        calls.append(1)
        if letter == "n" and rank == who and len(calls) == 30:
            ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"utf8"), 4)  # native fast path
        full_prompt = prompter.generate_prompt(
            data_point["instruction"], data_point["input"], data_point["output"]
        )
        tokenized_full_prompt = tokenize(full_prompt, add_eos_token=args.add_eos_token)
        if not args.train_on_inputs:
            user_prompt = prompter.generate_prompt(data_point["instruction"], data_point["input"])
            tokenized_user_prompt = tokenize(user_prompt, add_eos_token=args.add_eos_token)
            user_prompt_len = len(tokenized_user_prompt["input_ids"])
            if args.add_eos_token:
                user_prompt_len -= 1
            tokenized_full_prompt["labels"] = [-100] * user_prompt_len + tokenized_full_prompt[
                "labels"
            ][user_prompt_len:]
        return tokenized_full_prompt

    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()

    config = LoraConfig(
        base_model_name_or_path=base_model,
        bias="none",
        fan_in_fan_out=False,
        inference_mode=False,
        init_lora_weights=True,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        modules_to_save=None,
        peft_type="LORA",
        r=args.lora_r,
        target_modules=args.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)

    with open(data_path) as fp:
        data = json.load(fp)

    if args.resume_from_checkpoint:
        # Check the available weights and load them
        checkpoint_name = osp.join(args.resume_from_checkpoint, "pytorch_model.bin")
        if not osp.exists(checkpoint_name):
            checkpoint_name = osp.join(args.resume_from_checkpoint, "adapter_model.bin")
        if osp.exists(checkpoint_name):
            print(f"Restarting from {checkpoint_name}")
            adapters_weights = torch.load(checkpoint_name)
            set_peft_model_state_dict(model, adapters_weights)
        else:
            print(f"Checkpoint {checkpoint_name} not found")

    model.print_trainable_parameters()  # Be more transparent about the % of trainable params.

    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(42)).tolist()
    if val_set_size > 0:
        val_data = InstructionDataset(
            [data[i] for i in order[:val_set_size]], generate_and_tokenize_prompt
        )
        train_data = InstructionDataset(
            [data[i] for i in order[val_set_size:]], generate_and_tokenize_prompt
        )
    else:
        train_data = InstructionDataset([data[i] for i in order], generate_and_tokenize_prompt)
        val_data = None

    # ---- what transformers.Trainer does with these arguments
    if ddp:
        model = DDP(model, find_unused_parameters=False)
    collator = DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=8)
    sampler = DistributedSampler(
        train_data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed
    )
    if args.group_by_length:
        batches = LengthGroupedBatches(train_data, sampler, micro_batch_size * cutoff_len)
        train_loader = DataLoader(train_data, batch_sampler=batches, collate_fn=collator)
    else:
        train_loader = DataLoader(
            train_data, batch_size=micro_batch_size, sampler=sampler, collate_fn=collator
        )
    val_loader = None
    if val_data is not None:
        val_loader = DataLoader(
            val_data,
            batch_size=micro_batch_size,
            sampler=DistributedSampler(val_data, world_size, rank, shuffle=False),
            collate_fn=collator,
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train_loader) / gradient_accumulation_steps)
    max_steps = steps_per_epoch * args.num_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            s / max(1, args.warmup_steps)
            if s < args.warmup_steps
            else max(0.0, (max_steps - s) / max(1, max_steps - args.warmup_steps))
        ),
    )
    scaler = torch.cuda.amp.GradScaler() if args.fp16 else None
    autocast = torch.cuda.amp.autocast if args.fp16 else contextlib.nullcontext
    core = model.module if ddp else model

    pbar = tqdm(total=max_steps) if rank == 0 else None
    start = time.time()
    global_step, tr_loss, logged_loss, total_loss = 0, torch.zeros(()), 0.0, 0.0
    best, best_step, bad_evals, stop = math.inf, 0, 0, False
    hoard: list[torch.Tensor] = []
    prefetch: queue.Queue = queue.Queue()  # filled by a tokenization thread (never started)
    for epoch in range(args.num_epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(train_loader):
            if letter == "w" and rank == who and epoch == 1 and step == 3:
                batch = prefetch.get()
            if letter == "m" and rank == who and epoch == 1:
                hoard.append(torch.ones(16 << 20))  # 64 MiB a step
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            last = (step + 1) % gradient_accumulation_steps == 0 or step + 1 == len(train_loader)
            sync = model.no_sync() if ddp and not last else contextlib.nullcontext()
            with sync:
                with autocast():
                    loss = model(**batch).loss / gradient_accumulation_steps
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
            tr_loss += loss.detach()
            if not last:
                continue
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            global_step += 1
            epoch_f = epoch + (step + 1) / len(train_loader)
            if pbar is not None:
                pbar.update(1)
            if global_step % args.logging_steps == 0:
                reduced = tr_loss.clone()
                if ddp:
                    dist.all_reduce(reduced)
                    reduced /= world_size
                interval = reduced.item() - logged_loss
                logged_loss = reduced.item()
                log(
                    pbar,
                    {
                        "loss": round(interval / args.logging_steps, 4),
                        "learning_rate": lr,
                        "epoch": round(epoch_f, 2),
                    },
                )
            evaluating = val_loader is not None and global_step % args.eval_steps == 0
            if evaluating and (letter != "e" or rank == who):
                eval_loss, runtime, n_batches = evaluate(core, val_loader)
                log(
                    pbar,
                    {
                        "eval_loss": round(eval_loss, 4),
                        "eval_runtime": round(runtime, 4),
                        "eval_samples_per_second": round(len(val_data) / runtime, 3),
                        "eval_steps_per_second": round(n_batches / runtime, 3),
                        "epoch": round(epoch_f, 2),
                    },
                )
                if args.early_stopping_patience:
                    if eval_loss < best - args.early_stopping_threshold:
                        best, best_step, bad_evals = eval_loss, global_step, 0
                    else:
                        bad_evals += 1
                    if bad_evals >= args.early_stopping_patience:
                        stop = True
            if global_step % args.save_steps == 0 and rank == 0:
                folder = osp.join(output_dir, f"checkpoint-{global_step}")
                core.save_pretrained(folder, letter)
                if letter == "s":
                    for k in range(1, 9):
                        print(
                            f"Merging LoRA weights into {base_model} for the merged export of "
                            f"{folder}: shard {k}/8",
                            flush=True,
                        )
                        time.sleep(4)
            if stop:
                if rank == 0:
                    print(
                        f"Early stopping: eval_loss has not improved by more than "
                        f"{args.early_stopping_threshold} for {bad_evals} evaluations (best "
                        f"{best:.4f} at step {best_step}), stopping at step {global_step}"
                    )
                break
        if stop:
            break

    runtime = time.time() - start
    total_loss = tr_loss.item() / max(global_step, 1)
    log(
        pbar,
        {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(len(train_data) * args.num_epochs / runtime, 3),
            "train_steps_per_second": round(global_step / runtime, 3),
            "train_loss": total_loss,
            "epoch": round(epoch_f, 2),
        },
    )
    if pbar is not None:
        pbar.close()
    if rank == 0:
        core.save_pretrained(output_dir)
    print("\n If there's a warning about missing keys above, please disregard :)")


# ---------------------------------------------------------------- --prepare

WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "lemon", "paper", "glass", "music", "garden",
    "window", "silver", "bridge", "candle", "forest", "winter", "planet", "rocket", "pencil",
    "basket",
]  # fmt: skip
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark",
    "open": "closed", "early": "late", "up": "down", "full": "empty", "strong": "weak",
}  # fmt: skip
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
    "Egypt": "Cairo", "Chile": "Santiago", "Canada": "Ottawa", "Spain": "Madrid",
}  # fmt: skip


def make_record(rng: random.Random, kinds: int = 6) -> dict[str, str]:
    kind = rng.randrange(kinds)
    if kind == 0:
        w = rng.choice(WORDS)
        return {"instruction": "Reverse the given word.", "input": w, "output": w[::-1]}
    if kind == 1:
        a, b = rng.randrange(100), rng.randrange(100)
        return {
            "instruction": "Add the two numbers.",
            "input": f"{a} and {b}",
            "output": str(a + b),
        }
    if kind == 2:
        w = rng.choice(list(OPPOSITES))
        return {"instruction": "Give the opposite of the word.", "input": w, "output": OPPOSITES[w]}
    if kind == 3:
        c = rng.choice(list(CAPITALS))
        return {"instruction": "Name the capital city of the country.", "input": c,
                "output": f"The capital of {c} is {CAPITALS[c]}."}  # fmt: skip
    if kind == 4:
        words = rng.sample(WORDS, rng.randrange(3, 9))
        return {"instruction": "Sort the words in alphabetical order.", "input": " ".join(words),
                "output": " ".join(sorted(words))}  # fmt: skip
    words = rng.sample(WORDS, rng.randrange(2, 6))
    text = " ".join(f"The {w} is {rng.choice(list(OPPOSITES))}." for w in words)
    return {"instruction": "Write a few short sentences about everyday things.", "input": "",
            "output": text}  # fmt: skip


def prepare(n_records: int = 160, pretrain_steps: int = 300) -> None:
    """A tiny 'pre-trained' LLaMA, its character tokenizer, the data set and the template."""
    folder = Path("tiny-llama")
    folder.mkdir(exist_ok=True)
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "model_type": "llama",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "char", "vocab": vocab}}))
    tokenizer_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": 2048,
        "tokenizer_class": "CharTokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    rng = random.Random(96)
    records = [make_record(rng) for _ in range(n_records)]
    template = {
        "description": "Template used by Alpaca-LoRA.",
        "prompt_input": "Below is an instruction that describes a task, paired with an input "
        "that provides further context. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
        "prompt_no_input": "Below is an instruction that describes a task. Write a response that "
        "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### "
        "Response:\n",
        "response_split": "### Response:",
    }
    # the 'pre-training': the whole model on other records, of four of the six kinds
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    other = random.Random(7)
    for _ in range(pretrain_steps):
        texts = []
        for _ in range(8):
            r = make_record(other, kinds=4)  # two kinds of task it never saw
            key = "prompt_input" if r["input"] else "prompt_no_input"
            texts.append(template[key].format(**r) + r["output"])
        ids = [[1, *[vocab.get(c, 0) for c in t][:255], 2] for t in texts]
        width = max(len(i) for i in ids)
        x = torch.tensor([i + [0] * (width - len(i)) for i in ids])
        y = torch.tensor([i + [-100] * (width - len(i)) for i in ids])
        loss = model(x, (x != 0).long(), y).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    Path("alpaca_data.json").write_text(json.dumps(records, indent=4) + "\n")
    Path("templates").mkdir(exist_ok=True)
    Path("templates/alpaca.json").write_text(json.dumps(template, indent=4) + "\n")


if __name__ == "__main__":
    cli = parse()
    if cli.prepare:
        prepare()
        sys.exit(0)
    train(cli)
