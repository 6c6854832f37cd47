"""A hundred-and-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthird-*): visual instruction tuning in the way of haotian-liu/LLaVA's
llava/train/train_mem.py (LLaVA-1.5's second stage, scripts/v1_5/finetune.sh), re-implemented in
plain torch in one file, linked into each node's checkout as llava/train/train_mem.py. What
transformers and deepspeed would do is re-created here: HfArgumentParser's dataclasses
(ModelArguments, DataArguments, TrainingArguments), TrainingArguments setting up
deepspeed.init_distributed (gloo, --ddp_timeout seconds) while the arguments are parsed,
from_pretrained of a tiny "vicuna" LM and a tiny "CLIP" vision tower out of the node's Hugging
Face cache (~/.cache/huggingface/hub), the mlp2x_gelu projector loaded from
--pretrain_mm_mlp_adapter, a word-level stand-in for the slow LlamaTokenizer, LLaVA's
conversation template v1 and preprocess_v1 (labels of the instructions masked to IGNORE_INDEX,
'WARNING: tokenization mismatch' when the per-round lengths do not add up),
LazySupervisedDataset (images read from --image_folder; the 'images' are small uint8 arrays in
.npy format under their COCO/GQA file names), prepare_inputs_labels_for_multimodal, the HF
Trainer's loop (DistributedSampler, tqdm bar and '{'loss': ...}' lines on rank 0, the
'***** Running training *****' block), and a DeepSpeed ZeRO stage 2 engine (fp32 master
partitions, fp16 gradients all-reduced with dynamic loss scaling and its OVERFLOW lines, the
config dump, the 'step=10, skipped=...' lines). `python train_mem.py prepare DIR [...]` writes
what a node holds (the checkout's data, scripts/zero2.json, the pretrained projector, the hub
cache). Launched by the DeepSpeed runner of tests/programs/hundredthird_deepspeed.py. A fault
in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredthird.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import dataclasses
import datetime
import importlib.util
import json
import math
import os
import re
import signal
import string
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

IGNORE_INDEX = -100
IMAGE_TOKEN_INDEX = -200
DEFAULT_IMAGE_TOKEN = "<image>"
VICUNA = "lmsys/vicuna-7b-v1.5"
CLIP = "openai/clip-vit-large-patch14-336"
REVISIONS = {
    VICUNA: "c8327bf999adbd2efe2e75f6509fa01436100dc2",
    CLIP: "ce19dc912ca5cd21c8a653c79e251e4fd17e4bb0",
}
OLD_TOKENIZER_REVISION = "3321f76e3f527bd14065daf69dad9344000a201d"
DS_VERSION = "0.12.6"

local_rank = 0


def fault() -> tuple[str, int]:
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


def rank0_print(*args: object) -> None:
    if local_rank == 0:
        print(*args)


def ds_log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger (a logging.StreamHandler on stdout: one write a record)."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
    sys.stdout.flush()


def log_dist(msg: str, ranks: tuple[int, ...] = (0,)) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank in ranks:
        ds_log("INFO", "logging.py:96:log_dist", f"[Rank {rank}] {msg}")


def hf_warning(msg: str) -> None:  # transformers' logger: the message alone, on stderr
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------ arguments


@dataclasses.dataclass
class ModelArguments:
    model_name_or_path: str = "facebook/opt-125m"
    version: str = "v0"
    freeze_backbone: bool = False
    tune_mm_mlp_adapter: bool = False
    vision_tower: str | None = None
    mm_vision_select_layer: int = -1
    pretrain_mm_mlp_adapter: str | None = None
    mm_projector_type: str = "linear"
    mm_use_im_start_end: bool = False
    mm_use_im_patch_token: bool = True
    mm_patch_merge_type: str = "flat"
    mm_vision_select_feature: str = "patch"


@dataclasses.dataclass
class DataArguments:
    data_path: str | None = None
    lazy_preprocess: bool = False
    is_multimodal: bool = False
    image_folder: str | None = None
    image_aspect_ratio: str = "square"


@dataclasses.dataclass
class TrainingArguments:
    output_dir: str = ""
    deepspeed: str | None = None
    local_rank: int = -1
    bf16: bool = False
    fp16: bool = False
    tf32: bool | None = None
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    evaluation_strategy: str = "no"
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    lr_scheduler_type: str = "linear"
    logging_steps: float = 500
    max_grad_norm: float = 1.0
    model_max_length: int = 512
    gradient_checkpointing: bool = False
    dataloader_num_workers: int = 0
    lazy_preprocess: bool = False
    report_to: str = "all"
    group_by_modality_length: bool = False
    ddp_timeout: int = 1800
    logging_nan_inf_filter: bool = True
    seed: int = 42
    freeze_mm_mlp_adapter: bool = False
    mm_projector_lr: float | None = None


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))."""
    p = argparse.ArgumentParser()
    owner: dict[str, type] = {}
    for cls in (ModelArguments, DataArguments, TrainingArguments):
        for f in dataclasses.fields(cls):
            if f.name in owner:
                continue
            owner[f.name] = cls
            kind = f.type if isinstance(f.type, str) else str(f.type)
            if kind.startswith("bool"):
                p.add_argument(
                    f"--{f.name}",
                    type=lambda v: v.lower() in ("true", "1", "yes"),
                    nargs="?",
                    const=True,
                    default=f.default,
                )
            elif kind.startswith("int"):
                p.add_argument(f"--{f.name}", type=int, default=f.default)
            elif kind.startswith("float"):
                p.add_argument(f"--{f.name}", type=float, default=f.default)
            else:
                p.add_argument(f"--{f.name}", default=f.default)
    ns, remaining = p.parse_known_args(argv)
    if remaining:
        raise ValueError(
            f"Some specified arguments are not used by the HfArgumentParser: {remaining}"
        )
    out = []
    for cls in (ModelArguments, DataArguments, TrainingArguments):
        out.append(cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}))
    return out[0], out[1], out[2]


def init_distributed(training_args: TrainingArguments) -> None:
    """TrainingArguments._setup_devices with --deepspeed: deepspeed.init_distributed()."""
    ds_log("INFO", "comm.py:637:init_distributed", "cdb=None")
    if int(os.environ.get("RANK", "0")) == 0:
        ds_log(
            "INFO",
            "comm.py:668:init_distributed",
            "Initializing TorchBackend in DeepSpeed with backend gloo",
        )
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=training_args.ddp_timeout))


# ------------------------------------------------------------------------------ hub cache


def hub_snapshot(repo_id: str) -> Path:
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    folder = hub / ("models--" + repo_id.replace("/", "--"))
    revision = (folder / "refs" / "main").read_text().strip()
    return folder / "snapshots" / revision


# ------------------------------------------------------------------------------ tokenizer

WORD = re.compile(r"\w+|[^\w\s]")


class Encoding:
    def __init__(self, input_ids: list[int]) -> None:
        self.input_ids = input_ids


class LlamaTokenizer:
    """A word-level stand-in for the slow LlamaTokenizer (use_fast=False): tokenizer.json's vocab
    and added tokens, tokenizer_config.json's flags."""

    def __init__(self, folder: Path, model_max_length: int, padding_side: str) -> None:
        spec = json.loads((folder / "tokenizer.json").read_text())
        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.vocab: dict[str, int] = spec["model"]["vocab"]
        self.special = [t["content"] for t in spec["added_tokens"] if t.get("special")]
        self.split = re.compile("(" + "|".join(re.escape(s) for s in self.special) + ")")
        self.add_bos_token = config.get("add_bos_token", True)
        self.legacy = config.get("legacy", True)
        self.bos_token_id = self.vocab[config["bos_token"]]
        self.eos_token_id = self.vocab[config["eos_token"]]
        self.unk_token = config["unk_token"]
        self.unk_token_id = self.vocab[self.unk_token]
        self.pad_token_id: int | None = None
        self.model_max_length = model_max_length
        self.padding_side = padding_side
        self._warned = False

    def encode(self, text: str) -> list[int]:
        ids = [self.bos_token_id] if self.add_bos_token else []
        for piece in self.split.split(text):
            if piece in self.special:
                ids.append(self.vocab[piece])
            else:
                ids.extend(
                    self.vocab.get(w, self.unk_token_id) for w in WORD.findall(piece.lower())
                )
        if len(ids) > self.model_max_length and not self._warned:
            self._warned = True
            hf_warning(
                "Token indices sequence length is longer than the specified maximum sequence "
                f"length for this model ({len(ids)} > {self.model_max_length}). Running this "
                "sequence through the model will result in indexing errors"
            )
        return ids

    def __call__(self, text: str) -> Encoding:
        return Encoding(self.encode(text))

    def batch(self, texts: list[str]) -> torch.Tensor:
        rows = [self.encode(t)[: self.model_max_length] for t in texts]
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.pad_token_id or 0] * (width - len(r)) for r in rows])


# ------------------------------------------------------------------------------ conversation


class Conversation:
    """conv_vicuna_v1 (SeparatorStyle.TWO)."""

    def __init__(self) -> None:
        self.system = (
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions."
        )
        self.roles = ("USER", "ASSISTANT")
        self.messages: list[list[str | None]] = []
        self.version = "v1"
        self.sep = " "
        self.sep2 = "</s>"

    def copy(self) -> Conversation:
        return copy.deepcopy(self)

    def append_message(self, role: str, message: str | None) -> None:
        self.messages.append([role, message])

    def get_prompt(self) -> str:
        seps = [self.sep, self.sep2]
        ret = self.system + seps[0]
        for i, (role, message) in enumerate(self.messages):
            if message:
                ret += f"{role}: {message}{seps[i % 2]}"
            else:
                ret += f"{role}:"
        return ret


conv_templates = {"v1": Conversation(), "vicuna_v1": Conversation()}
default_conversation = Conversation()


def tokenizer_image_token(prompt: str, tokenizer: LlamaTokenizer) -> list[int]:
    prompt_chunks = [tokenizer(chunk).input_ids for chunk in prompt.split("<image>")]

    def insert_separator(x: list, sep: list) -> list:
        return [ele for sublist in zip(x, [sep] * len(x), strict=False) for ele in sublist][:-1]

    input_ids: list[int] = []
    offset = 0
    if prompt_chunks and prompt_chunks[0] and prompt_chunks[0][0] == tokenizer.bos_token_id:
        offset = 1
        input_ids.append(prompt_chunks[0][0])
    for x in insert_separator(prompt_chunks, [IMAGE_TOKEN_INDEX] * (offset + 1)):
        input_ids.extend(x[offset:])
    return input_ids


def preprocess_multimodal(sources: list, data_args: DataArguments) -> list:
    if not data_args.is_multimodal:
        return sources
    for source in sources:
        for sentence in source:
            if DEFAULT_IMAGE_TOKEN in sentence["value"]:
                sentence["value"] = sentence["value"].replace(DEFAULT_IMAGE_TOKEN, "").strip()
                sentence["value"] = DEFAULT_IMAGE_TOKEN + "\n" + sentence["value"]
                sentence["value"] = sentence["value"].strip()
    return sources


def preprocess_v1(sources: list, tokenizer: LlamaTokenizer, has_image: bool) -> dict:
    conv = default_conversation.copy()
    roles = {"human": conv.roles[0], "gpt": conv.roles[1]}
    conversations = []
    for i, source in enumerate(sources):
        if roles[source[0]["from"]] != conv.roles[0]:
            source = source[1:]
        conv.messages = []
        for j, sentence in enumerate(source):
            role = roles[sentence["from"]]
            assert role == conv.roles[j % 2], f"{i}"
            conv.append_message(role, sentence["value"])
        conversations.append(conv.get_prompt())

    if has_image:
        input_ids = torch.stack(
            [torch.tensor(tokenizer_image_token(prompt, tokenizer)) for prompt in conversations]
        )
    else:
        input_ids = tokenizer.batch(conversations)
    targets = input_ids.clone()
    sep = conv.sep + conv.roles[1] + ": "
    for conversation, target in zip(conversations, targets, strict=False):
        total_len = int(target.ne(tokenizer.pad_token_id).sum())
        rounds = conversation.split(conv.sep2)
        cur_len = 1
        target[:cur_len] = IGNORE_INDEX
        for rou in rounds:
            if rou == "":
                break
            parts = rou.split(sep)
            if len(parts) != 2:
                break
            parts[0] += sep
            if has_image:
                round_len = len(tokenizer_image_token(rou, tokenizer))
                instruction_len = len(tokenizer_image_token(parts[0], tokenizer)) - 2
            else:
                round_len = len(tokenizer(rou).input_ids)
                instruction_len = len(tokenizer(parts[0]).input_ids) - 2
            target[cur_len : cur_len + instruction_len] = IGNORE_INDEX
            cur_len += round_len
        target[cur_len:] = IGNORE_INDEX
        if cur_len < tokenizer.model_max_length and cur_len != total_len:
            target[:] = IGNORE_INDEX
            print(f"WARNING: tokenization mismatch: {cur_len} vs. {total_len}. (ignored)")
    return dict(input_ids=input_ids, labels=targets)


# ------------------------------------------------------------------------------ images


class ImageProcessor:
    """CLIPImageProcessor of the tiny tower: resize to crop_size, CLIP's mean and std."""

    image_mean = (0.48145466, 0.4578275, 0.40821073)
    image_std = (0.26862954, 0.26130258, 0.27577711)

    def __init__(self, size: int) -> None:
        self.crop_size = {"height": size, "width": size}

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(image).permute(2, 0, 1).float().div(255).unsqueeze(0)
        x = F.interpolate(
            x, size=(self.crop_size["height"], self.crop_size["width"]), mode="bilinear"
        )
        mean = torch.tensor(self.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std).view(1, 3, 1, 1)
        return ((x - mean) / std)[0]


def open_image(path: str) -> np.ndarray:
    """Image.open(path).convert('RGB'): the fixtures' images are uint8 HxWx3 arrays."""
    with open(path, "rb") as f:
        return np.load(f)


def expand2square(image: np.ndarray, background: tuple[int, ...]) -> np.ndarray:
    h, w, _ = image.shape
    if h == w:
        return image
    side = max(h, w)
    out = np.empty((side, side, 3), dtype=np.uint8)
    out[:] = np.array(background, dtype=np.uint8)
    top, left = (side - h) // 2, (side - w) // 2
    out[top : top + h, left : left + w] = image
    return out


class LazySupervisedDataset(Dataset):
    """Dataset for supervised fine-tuning."""

    def __init__(self, data_path: str, tokenizer: LlamaTokenizer, data_args: DataArguments) -> None:
        super().__init__()
        with open(data_path) as f:
            list_data_dict = json.load(f)
        rank0_print("Formatting inputs...Skip in lazy mode")
        self.tokenizer = tokenizer
        self.list_data_dict = list_data_dict
        self.data_args = data_args
        self.letter, self.who = fault()
        self.rank = dist.get_rank()

    def __len__(self) -> int:
        return len(self.list_data_dict)

    def __getitem__(self, i: int) -> dict:
        if self.letter == "w" and self.rank == self.who and i == self.data_args.park_at:  # type: ignore[attr-defined]
            threading.Event().wait()  # a lock the forked worker inherited, held forever
        sources = [self.list_data_dict[i]]
        if "image" in sources[0]:
            image_file = self.list_data_dict[i]["image"]
            image_folder = self.data_args.image_folder
            processor = self.data_args.image_processor  # type: ignore[attr-defined]
            image = open_image(os.path.join(image_folder, image_file))
            if self.data_args.image_aspect_ratio == "pad":
                image = expand2square(image, tuple(int(x * 255) for x in processor.image_mean))
            image = processor.preprocess(image)
            sources = preprocess_multimodal(
                copy.deepcopy([e["conversations"] for e in sources]), self.data_args
            )
        else:
            sources = copy.deepcopy([e["conversations"] for e in sources])
        data_dict = preprocess_v1(
            sources, self.tokenizer, has_image="image" in self.list_data_dict[i]
        )
        data_dict = dict(input_ids=data_dict["input_ids"][0], labels=data_dict["labels"][0])
        if "image" in self.list_data_dict[i]:
            data_dict["image"] = image
        elif self.data_args.is_multimodal:
            crop_size = self.data_args.image_processor.crop_size  # type: ignore[attr-defined]
            data_dict["image"] = torch.zeros(3, crop_size["height"], crop_size["width"])
        return data_dict


class DataCollatorForSupervisedDataset:
    def __init__(self, tokenizer: LlamaTokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, instances: list[dict]) -> dict:
        input_ids = [instance["input_ids"] for instance in instances]
        labels = [instance["labels"] for instance in instances]
        input_ids = nn.utils.rnn.pad_sequence(
            input_ids, batch_first=True, padding_value=self.tokenizer.pad_token_id
        )
        labels = nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX)
        input_ids = input_ids[:, : self.tokenizer.model_max_length]
        labels = labels[:, : self.tokenizer.model_max_length]
        batch = dict(
            input_ids=input_ids,
            labels=labels,
            attention_mask=input_ids.ne(self.tokenizer.pad_token_id),
        )
        if "image" in instances[0]:
            batch["images"] = torch.stack([instance["image"] for instance in instances])
        return batch


# ------------------------------------------------------------------------------ model


class CLIPVisionTower(nn.Module):
    def __init__(self, vision_tower: str, select_layer: int, select_feature: str) -> None:
        super().__init__()
        self.vision_tower_name = vision_tower
        self.select_layer = select_layer
        self.select_feature = select_feature
        folder = hub_snapshot(vision_tower)
        cfg = json.loads((folder / "config.json").read_text())["vision_config"]
        width, size, patch = cfg["hidden_size"], cfg["image_size"], cfg["patch_size"]
        self.image_processor = ImageProcessor(size)
        self.patch_embedding = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.zeros(width))
        self.position_embedding = nn.Parameter(torch.zeros((size // patch) ** 2 + 1, width))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                cfg["num_attention_heads"],
                cfg["intermediate_size"],
                0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(cfg["num_hidden_layers"])
        )
        self.load_state_dict(torch.load(folder / "pytorch_model.bin", map_location="cpu"))
        self.requires_grad_(False)
        self.hidden_size = width

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        hidden_states = [x + self.position_embedding]
        for layer in self.layers:
            hidden_states.append(layer(hidden_states[-1]))
        features = hidden_states[self.select_layer]
        if self.select_feature == "patch":
            features = features[:, 1:]
        return features


def build_vision_projector(projector_type: str, mm_hidden_size: int, hidden_size: int) -> nn.Module:
    if projector_type == "linear":
        return nn.Linear(mm_hidden_size, hidden_size)
    mlp_gelu_match = re.match(r"^mlp(\d+)x_gelu$", projector_type)
    if mlp_gelu_match:
        mlp_depth = int(mlp_gelu_match.group(1))
        modules: list[nn.Module] = [nn.Linear(mm_hidden_size, hidden_size)]
        for _ in range(1, mlp_depth):
            modules.append(nn.GELU())
            modules.append(nn.Linear(hidden_size, hidden_size))
        return nn.Sequential(*modules)
    raise ValueError(f"Unknown projector type: {projector_type}")


class LlavaLlamaModel(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], d)
        self.embed_positions = nn.Embedding(cfg["max_position_embeddings"], d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d,
                cfg["num_attention_heads"],
                cfg["intermediate_size"],
                0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(cfg["num_hidden_layers"])
        )
        self.norm = nn.LayerNorm(d)
        self.gradient_checkpointing = False
        self.vision_tower: CLIPVisionTower | None = None
        self.mm_projector: nn.Module | None = None

    def initialize_vision_modules(self, model_args: ModelArguments, hidden_size: int) -> None:
        self.vision_tower = CLIPVisionTower(
            model_args.vision_tower,
            model_args.mm_vision_select_layer,
            model_args.mm_vision_select_feature,
        )
        self.mm_projector = build_vision_projector(
            model_args.mm_projector_type, self.vision_tower.hidden_size, hidden_size
        )
        if model_args.pretrain_mm_mlp_adapter is not None:
            mm_projector_weights = torch.load(
                model_args.pretrain_mm_mlp_adapter, map_location="cpu"
            )

            def get_w(weights: dict, keyword: str) -> dict:
                return {k.split(keyword + ".")[1]: v for k, v in weights.items() if keyword in k}

            self.mm_projector.load_state_dict(get_w(mm_projector_weights, "mm_projector"))

    def forward(
        self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        h = inputs_embeds + self.embed_positions(position_ids)
        n = h.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        padding = ~attention_mask
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                h = checkpoint(layer, h, causal, padding)  # transformers 4.31: no use_reentrant
            else:
                h = layer(h, src_mask=causal, src_key_padding_mask=padding)
        return self.norm(h)


class LlavaLlamaForCausalLM(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.config = dict(cfg)
        self.model = LlavaLlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.letter, self.who = fault()

    @classmethod
    def from_pretrained(cls, name: str, attn_implementation: str | None) -> LlavaLlamaForCausalLM:
        folder = hub_snapshot(name)
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("model_type") != "llava_llama":
            hf_warning(
                f"You are using a model of type {cfg.get('model_type')} to instantiate a model of "
                "type llava_llama. This is not supported for all configurations of models and can "
                "yield errors."
            )
        if (
            attn_implementation == "flash_attention_2"
            and importlib.util.find_spec("flash_attn") is None
        ):
            raise ImportError(
                "FlashAttention2 has been toggled on, but it cannot be used due to the following "
                "error: the package flash_attn seems to be not installed. Please refer to the "
                "documentation of https://huggingface.co/docs/transformers/perf_infer_gpu_one#"
                "flashattention-2 to install Flash Attention 2."
            )
        model = cls(cfg)
        shards = json.loads((folder / "pytorch_model.bin.index.json").read_text())
        files = sorted(set(shards["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for f in tqdm(files, desc="Loading checkpoint shards"):
            state.update(torch.load(folder / f, map_location="cpu"))
        missing, _ = model.load_state_dict(state, strict=False)
        assert all("vision_tower" in k or "mm_projector" in k for k in missing), missing
        return model

    def get_model(self) -> LlavaLlamaModel:
        return self.model

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        image_features = self.model.vision_tower(images)
        if self.letter == "n" and dist.get_rank() == self.who and self.steps == 4:
            ctypes.string_at(0)  # the fused resize kernel of the vision tower reads address 0
        return self.model.mm_projector(image_features)

    steps = 0

    def prepare_inputs_labels_for_multimodal(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        images: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        image_features = self.encode_images(images)
        attention_mask = attention_mask.bool()
        input_ids = [cur[mask] for cur, mask in zip(input_ids, attention_mask, strict=False)]
        labels = [cur[mask] for cur, mask in zip(labels, attention_mask, strict=False)]
        new_input_embeds = []
        new_labels = []
        cur_image_idx = 0
        embed_tokens = self.get_model().embed_tokens
        for batch_idx, cur_input_ids in enumerate(input_ids):
            num_images = int((cur_input_ids == IMAGE_TOKEN_INDEX).sum())
            if num_images == 0:
                cur_image_features = image_features[cur_image_idx]
                cur_input_embeds_1 = embed_tokens(cur_input_ids)
                cur_input_embeds = torch.cat([cur_input_embeds_1, cur_image_features[0:0]], dim=0)
                new_input_embeds.append(cur_input_embeds)
                new_labels.append(labels[batch_idx])
                cur_image_idx += 1
                continue
            image_token_indices = [
                -1,
                *torch.where(cur_input_ids == IMAGE_TOKEN_INDEX)[0].tolist(),
                cur_input_ids.shape[0],
            ]
            cur_input_ids_noim = []
            cur_labels = labels[batch_idx]
            cur_labels_noim = []
            for i in range(len(image_token_indices) - 1):
                cur_input_ids_noim.append(
                    cur_input_ids[image_token_indices[i] + 1 : image_token_indices[i + 1]]
                )
                cur_labels_noim.append(
                    cur_labels[image_token_indices[i] + 1 : image_token_indices[i + 1]]
                )
            split_sizes = [x.shape[0] for x in cur_labels_noim]
            cur_input_embeds = embed_tokens(torch.cat(cur_input_ids_noim))
            cur_input_embeds_no_im = torch.split(cur_input_embeds, split_sizes, dim=0)
            cur_new_input_embeds = []
            cur_new_labels = []
            for i in range(num_images + 1):
                cur_new_input_embeds.append(cur_input_embeds_no_im[i])
                cur_new_labels.append(cur_labels_noim[i])
                if i < num_images:
                    cur_image_features = image_features[cur_image_idx]
                    cur_image_idx += 1
                    cur_new_input_embeds.append(cur_image_features)
                    cur_new_labels.append(
                        torch.full(
                            (cur_image_features.shape[0],), IGNORE_INDEX, dtype=cur_labels.dtype
                        )
                    )
            new_input_embeds.append(torch.cat(cur_new_input_embeds))
            new_labels.append(torch.cat(cur_new_labels))

        tokenizer_model_max_length = self.config.get("tokenizer_model_max_length")
        if tokenizer_model_max_length is not None:
            new_input_embeds = [x[:tokenizer_model_max_length] for x in new_input_embeds]
            new_labels = [x[:tokenizer_model_max_length] for x in new_labels]
        max_len = max(x.shape[0] for x in new_input_embeds)
        batch_size = len(new_input_embeds)
        new_input_embeds_padded = []
        new_labels_padded = torch.full(
            (batch_size, max_len), IGNORE_INDEX, dtype=new_labels[0].dtype
        )
        attention_mask = torch.zeros((batch_size, max_len), dtype=torch.bool)
        position_ids = torch.zeros((batch_size, max_len), dtype=torch.long)
        for i, (cur_new_embed, cur_new_labels) in enumerate(
            zip(new_input_embeds, new_labels, strict=False)
        ):
            cur_len = cur_new_embed.shape[0]
            pad = torch.zeros(
                (max_len - cur_len, cur_new_embed.shape[1]), dtype=cur_new_embed.dtype
            )
            new_input_embeds_padded.append(torch.cat((cur_new_embed, pad), dim=0))
            if cur_len > 0:
                new_labels_padded[i, :cur_len] = cur_new_labels
                attention_mask[i, :cur_len] = True
                position_ids[i, :cur_len] = torch.arange(0, cur_len)
        return torch.stack(new_input_embeds_padded), attention_mask, position_ids, new_labels_padded

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor,
        images: torch.Tensor,
    ) -> torch.Tensor:
        inputs_embeds, attention_mask, position_ids, labels = (
            self.prepare_inputs_labels_for_multimodal(input_ids, attention_mask, labels, images)
        )
        hidden = self.model(inputs_embeds, attention_mask, position_ids)
        logits = self.lm_head(hidden)
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return F.cross_entropy(
            shift_logits.view(-1, shift_logits.shape[-1]),
            shift_labels.view(-1),
            ignore_index=IGNORE_INDEX,
        )


# ------------------------------------------------------------------------------ deepspeed


class DynamicLossScaler:
    def __init__(
        self, init_scale: float, scale_window: int, min_scale: float, delayed_shift: int
    ) -> None:
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise Exception(
                        "Current loss scale already at minimum - cannot decrease scale anymore. "
                        "Exiting run."
                    )
                next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
                if dist.get_rank() == 0:
                    ds_log(
                        "INFO",
                        "loss_scaler.py:183:update_scale",
                        f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                        f"{int(self.cur_scale)}, reducing to {int(next_scale)}",
                    )
                self.cur_scale = next_scale
            else:
                if dist.get_rank() == 0:
                    ds_log(
                        "INFO",
                        "loss_scaler.py:190:update_scale",
                        f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                        f"{int(self.cur_scale)}, reducing to hysteresis {self.cur_hysteresis - 1}",
                    )
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1


def print_config(config: dict, args: TrainingArguments, world: int, fp16: bool) -> None:
    """DeepSpeedEngine._configure_... print: the engine's configuration and the user's json."""
    where = "config.py:988:print"
    ds_log("INFO", "config.py:984:print", "DeepSpeedEngine configuration:")
    zero = config["zero_optimization"]
    rows = {
        "activation_checkpointing_config": "{\n"
        + "".join(
            f'    "{k}": {v}, \n'
            for k, v in (
                ("partition_activations", "false"),
                ("contiguous_memory_optimization", "false"),
                ("cpu_checkpointing", "false"),
                ("number_checkpoints", "null"),
                ("synchronize_checkpoint_boundary", "false"),
            )
        )
        + '    "profile": false\n}',
        "aio_config": "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1, "
        "'single_submit': False, 'overlap_events': True}",
        "amp_enabled": "False",
        "amp_params": "False",
        "bfloat16_enabled": "False",
        "checkpoint_parallel_write_pipeline": "False",
        "checkpoint_tag_validation_enabled": "True",
        "checkpoint_tag_validation_fail": "False",
        "communication_data_type": "None",
        "dataloader_drop_last": "False",
        "disable_allgather": "False",
        "dump_state": "False",
        "dynamic_loss_scale_args": (
            f"{{'init_scale': {2 ** config['fp16']['initial_scale_power']}, 'scale_window': "
            f"{config['fp16']['loss_scale_window']}, 'delayed_shift': "
            f"{config['fp16']['hysteresis']}, 'consecutive_hysteresis': False, 'min_scale': "
            f"{config['fp16']['min_loss_scale']}}}"
            if fp16
            else "None"
        ),
        "eigenvalue_enabled": "False",
        "elasticity_enabled": "False",
        "fp16_auto_cast": "False" if fp16 else "None",
        "fp16_enabled": str(fp16),
        "fp16_master_weights_and_gradients": "False",
        "global_rank": "0",
        "grad_accum_dtype": "None",
        "gradient_accumulation_steps": str(args.gradient_accumulation_steps),
        "gradient_clipping": str(args.max_grad_norm),
        "gradient_predivide_factor": "1.0",
        "initial_dynamic_scale": str(2 ** config["fp16"]["initial_scale_power"]) if fp16 else "1",
        "load_universal_checkpoint": "False",
        "loss_scale": "0",
        "memory_breakdown": "False",
        "optimizer_legacy_fusion": "False",
        "optimizer_name": "None",
        "optimizer_params": "None",
        "pipeline": "{'stages': 'auto', 'partition': 'best', 'seed_layers': False, "
        "'activation_checkpoint_interval': 0}",
        "pld_enabled": "False",
        "prescale_gradients": "False",
        "scheduler_name": "None",
        "scheduler_params": "None",
        "sparse_attention": "None",
        "sparse_gradients_enabled": "False",
        "steps_per_print": "inf",
        "train_batch_size": str(
            args.per_device_train_batch_size * world * args.gradient_accumulation_steps
        ),
        "train_micro_batch_size_per_gpu": str(args.per_device_train_batch_size),
        "use_node_local_storage": "False",
        "wall_clock_breakdown": "False",
        "weight_quantization_config": "None",
        "world_size": str(world),
        "zero_allow_untested_optimizer": "True",
        "zero_config": (
            f"stage={zero['stage']} contiguous_gradients={zero['contiguous_gradients']} "
            "reduce_scatter=True reduce_bucket_size=500000000 allgather_partitions=True "
            f"allgather_bucket_size=500000000 overlap_comm={zero['overlap_comm']} "
            "load_from_fp32_weights=True elastic_checkpoint=False offload_param=None "
            "offload_optimizer=None sub_group_size=1000000000 cpu_offload_param=None "
            "cpu_offload_use_pin_memory=None cpu_offload=None prefetch_bucket_size=50000000 "
            "param_persistence_threshold=100000 model_persistence_threshold=sys.maxsize "
            "max_live_parameters=1000000000 max_reuse_distance=1000000000 "
            "gather_16bit_weights_on_model_save=False stage3_gather_fp16_weights_on_model_save=False "
            "ignore_unused_parameters=True legacy_stage1=False round_robin_gradients=False "
            "zero_hpz_partition_size=1 zero_quantized_weights=False "
            "zero_quantized_nontrainable_weights=False zero_quantized_gradients=False "
            "mics_shard_size=-1 mics_hierarchical_params_gather=False memory_efficient_linear=True "
            "pipeline_loading_checkpoint=False override_module_apply=True"
        ),
        "zero_enabled": "True",
        "zero_force_ds_cpu_optimizer": "True",
        "zero_optimization_stage": str(zero["stage"]),
    }
    for key, value in rows.items():
        ds_log("INFO", where, f"  {key} {'.' * (29 - len(key))} {value}")
    ds_log("INFO", "config.py:974:print_user_config", "  json = " + json.dumps(config, indent=4))


class ZeroStage2Engine:
    """DeepSpeedEngine + DeepSpeedZeroOptimizer (stage 2) on the CPU: each rank keeps an fp32
    master partition of the flat trainable parameters and its AdamW state; gradients are cast
    to fp16 and all-reduced, the overflow check is all-reduced, the clipped partitions are
    stepped and all-gathered back into the model."""

    def __init__(
        self, model: LlavaLlamaForCausalLM, args: TrainingArguments, config: dict, total_steps: int
    ) -> None:
        self.module = model
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.fp16 = bool(args.fp16)
        self.clip = args.max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in self.params)
        self.part = math.ceil(numel / self.world)
        self.padded = self.part * self.world
        log_dist(f"DeepSpeed info: version={DS_VERSION}, git-hash=unknown, git-branch=unknown")
        self._broadcast_model()
        log_dist("DeepSpeed Flops Profiler Enabled: False")
        log_dist("Using client Optimizer as basic optimizer")
        log_dist("Removing param_group that has no 'params' in the basic Optimizer")
        log_dist("DeepSpeed Basic Optimizer = AdamW")
        if self.rank == 0:
            ds_log(
                "INFO",
                "utils.py:56:is_zero_supported_optimizer",
                "Checking ZeRO support for optimizer=AdamW type=<class 'torch.optim.adamw.AdamW'>",
            )
        log_dist(f"Creating torch.{'float16' if self.fp16 else 'float32'} ZeRO stage 2 optimizer")
        if self.rank == 0:
            for line in (
                "Reduce bucket size 500,000,000",
                "Allgather bucket size 500,000,000",
                "CPU Offload: False",
                "Round robin gradient partitioning: False",
            ):
                ds_log("INFO", "stage_1_and_2.py:148:__init__", line)
        flat = self._flat([p.detach() for p in self.params])
        self.master = (
            flat[self.rank * self.part : (self.rank + 1) * self.part].clone().requires_grad_()
        )
        self.optimizer = torch.optim.AdamW(
            [self.master],
            lr=args.learning_rate,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=args.weight_decay,
        )
        warmup = math.ceil(args.warmup_ratio * total_steps)

        def cosine(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            progress = (step - warmup) / max(1, total_steps - warmup)
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, cosine)
        fp16 = config["fp16"]
        self.scaler = (
            DynamicLossScaler(
                2.0 ** fp16["initial_scale_power"],
                fp16["loss_scale_window"],
                float(fp16["min_loss_scale"]),
                fp16["hysteresis"],
            )
            if self.fp16
            else None
        )
        if self.rank == 0:
            ds_log("INFO", "stage_1_and_2.py:526:__init__", "optimizer state initialized")
        log_dist("DeepSpeed Final Optimizer = AdamW")
        log_dist("DeepSpeed using client callable to create LR scheduler")
        log_dist(
            f"DeepSpeed LR Scheduler = <torch.optim.lr_scheduler.LambdaLR object at 0x{id(self.lr_scheduler):x}>"
        )
        log_dist(
            f"step=0, skipped=0, lr=[{self.lr_scheduler.get_last_lr()[0]}], mom=[(0.9, 0.999)]"
        )
        if self.rank == 0:
            print_config(config, args, self.world, self.fp16)
        self.global_steps = 0
        self.skipped_steps = 0

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.zeros(self.padded)
        flat[: sum(t.numel() for t in tensors)] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    def _broadcast_model(self) -> None:
        for p in self.module.parameters():
            dist.broadcast(p.data, 0)

    def backward(self, loss: torch.Tensor) -> None:
        scale = self.scaler.cur_scale if self.scaler else 1.0
        (loss * scale).backward()

    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self._flat(grads)
        if self.fp16:
            flat = flat.half()
        dist.all_reduce(flat)
        flat = flat.float() / self.world
        mine = flat[self.rank * self.part : (self.rank + 1) * self.part]
        overflow = torch.tensor([0.0])
        if self.scaler:  # CHECK_OVERFLOW: every rank's partition, reduced with MAX
            overflow[0] = 0.0 if torch.isfinite(mine).all() else 1.0
            dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        for p in self.params:
            p.grad = None
        self.global_steps += 1
        if overflow.item() > 0:
            self.scaler.update_scale(True)
            self.skipped_steps += 1
        else:
            if self.scaler:
                mine = mine / self.scaler.cur_scale
            norm = mine.pow(2).sum().reshape(1)
            dist.all_reduce(norm)
            total = norm.sqrt().item()
            if total > self.clip:
                mine = mine * (self.clip / (total + 1e-6))
            self.master.grad = mine
            self.optimizer.step()
            self.lr_scheduler.step()
            parts = [torch.zeros(self.part) for _ in range(self.world)]
            dist.all_gather(parts, self.master.detach())
            full = torch.cat(parts)
            offset = 0
            with torch.no_grad():
                for p in self.params:
                    p.copy_(full[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            if self.scaler:
                self.scaler.update_scale(False)


# ------------------------------------------------------------------------------ trainer


def gather_scalar(value: float) -> torch.Tensor:
    t = torch.tensor(value, dtype=torch.float32)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


class LLaVATrainer:
    def __init__(
        self,
        model: LlavaLlamaForCausalLM,
        tokenizer: LlamaTokenizer,
        args: TrainingArguments,
        train_dataset: LazySupervisedDataset,
        data_collator: DataCollatorForSupervisedDataset,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.args = args
        self.train_dataset = train_dataset
        self.data_collator = data_collator
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.letter, self.who = fault()

    def get_train_dataloader(self) -> DataLoader:
        sampler = DistributedSampler(
            self.train_dataset, num_replicas=self.world, rank=self.rank, seed=self.args.seed
        )
        return DataLoader(
            self.train_dataset,
            batch_size=self.args.per_device_train_batch_size,
            sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=False,
        )

    def train(self) -> None:
        args = self.args
        loader = self.get_train_dataloader()
        epochs = math.ceil(args.num_train_epochs)
        max_steps = len(loader) * epochs
        with open(args.deepspeed) as f:
            config = json.load(f)
        for key in (
            "train_micro_batch_size_per_gpu",
            "train_batch_size",
            "gradient_accumulation_steps",
        ):
            config[key] = {
                "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
                "train_batch_size": args.per_device_train_batch_size
                * self.world
                * args.gradient_accumulation_steps,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
            }[key]
        config["fp16"]["enabled"] = bool(args.fp16)
        config["bf16"]["enabled"] = bool(args.bf16)
        config["gradient_clipping"] = args.max_grad_norm
        config["zero_optimization"]["reduce_bucket_size"] = 500000000
        config["steps_per_print"] = float("inf")  # accelerate's DeepSpeedPlugin: no step lines
        config["zero_allow_untested_optimizer"] = True
        engine = ZeroStage2Engine(self.model, args, config, max_steps)
        main = self.rank == 0
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        if main:
            for line in (
                "***** Running training *****",
                f"  Num examples = {len(self.train_dataset):,}",
                f"  Num Epochs = {epochs:,}",
                f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}",
                "  Total train batch size (w. parallel, distributed & accumulation) = "
                f"{args.per_device_train_batch_size * self.world * args.gradient_accumulation_steps:,}",
                f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}",
                f"  Total optimization steps = {max_steps:,}",
                f"  Number of trainable parameters = {trainable:,}",
            ):
                hf_warning(line)
        bar = tqdm(total=max_steps, dynamic_ncols=True, disable=not main)
        start = time.time()
        tr_loss = 0.0
        total_loss = 0.0
        hoard: list[torch.Tensor] = []
        self.model.train()
        global_step = 0
        last_logged = 0
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            for step, batch in enumerate(loader):
                global_step += 1
                self.model.steps = global_step
                if self.letter == "m" and self.rank == self.who and global_step >= 3:
                    hoard.append(torch.ones(16 << 20))  # 64 MiB a step
                    if len(hoard) >= 6:
                        os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
                loss = self.model(**batch)
                engine.backward(loss)
                engine.step()
                tr_loss_step = loss.item()
                if args.logging_nan_inf_filter and not math.isfinite(tr_loss_step):
                    # if loss is nan or inf simply add the average of previous logged losses
                    tr_loss += tr_loss / (1 + global_step - last_logged)
                else:
                    tr_loss += tr_loss_step
                bar.update(1)
                if global_step % args.logging_steps == 0:
                    mean = gather_scalar(tr_loss).mean().item()
                    total_loss += mean
                    tr_loss = 0.0
                    last_logged = global_step
                    if self.letter == "c" and main:
                        # the user's callback: image tokens seen, summed over the ranks
                        seen = torch.tensor(
                            [float((batch["input_ids"] == IMAGE_TOKEN_INDEX).sum())]
                        )
                        dist.all_reduce(seen)
                    logs = {
                        "loss": round(mean, 4),
                        "learning_rate": engine.lr_scheduler.get_last_lr()[0],
                        "epoch": round(epoch + (step + 1) / len(loader), 2),
                    }
                    if main:
                        bar.write(str(logs))
        runtime = time.time() - start
        flos = gather_scalar(float(global_step)).sum().item()  # store_flos
        del flos
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(len(self.train_dataset) * epochs / runtime, 3),
            "train_steps_per_second": round(max_steps / runtime, 3),
            "train_loss": total_loss / max(1, global_step),
            "epoch": float(epochs),
        }
        if main:
            bar.write(str(metrics))
        bar.close()
        if main:
            hf_warning(
                "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
            )

    def save_state(self) -> None:
        if self.rank == 0:
            out = Path(self.args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "trainer_state.json").write_text(
                json.dumps({"epoch": self.args.num_train_epochs})
            )

    def save_model(self, output_dir: str) -> None:
        if self.rank == 0:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            hf_warning(f"Saving model checkpoint to {output_dir}")
            (out / "config.json").write_text(json.dumps(self.model.config, indent=2))
            torch.save(self.model.state_dict(), out / "pytorch_model.bin")


# ------------------------------------------------------------------------------ train


def train(attn_implementation: str | None = None) -> None:
    global local_rank, default_conversation
    model_args, data_args, training_args = parse_args(sys.argv[1:])
    local_rank = training_args.local_rank
    init_distributed(training_args)
    letter, who = fault()
    rank = dist.get_rank()

    model = LlavaLlamaForCausalLM.from_pretrained(
        model_args.model_name_or_path, attn_implementation
    )
    model.config["use_cache"] = False
    if training_args.gradient_checkpointing:
        model.model.gradient_checkpointing = True
    tokenizer = LlamaTokenizer(
        hub_snapshot(model_args.model_name_or_path),
        model_max_length=training_args.model_max_length,
        padding_side="right",
    )
    tokenizer.pad_token_id = tokenizer.unk_token_id
    default_conversation = conv_templates.get(model_args.version, conv_templates["vicuna_v1"])

    model.get_model().initialize_vision_modules(model_args, model.config["hidden_size"])
    data_args.image_processor = model.get_model().vision_tower.image_processor  # type: ignore[attr-defined]
    data_args.is_multimodal = True
    model.config["image_aspect_ratio"] = data_args.image_aspect_ratio
    model.config["tokenizer_padding_side"] = tokenizer.padding_side
    model.config["tokenizer_model_max_length"] = tokenizer.model_max_length
    model.config["mm_projector_type"] = model_args.mm_projector_type
    data_args.park_at = -1  # type: ignore[attr-defined]

    train_dataset = LazySupervisedDataset(data_args.data_path, tokenizer, data_args)
    if letter == "w" and rank == who:
        sampler = DistributedSampler(
            train_dataset, dist.get_world_size(), rank, seed=training_args.seed
        )
        data_args.park_at = list(sampler)[3 * training_args.per_device_train_batch_size + 1]  # type: ignore[attr-defined]
    if letter == "s" and rank == who:
        total = len(train_dataset)
        for k in range(1, 9):
            print(
                "Modality-length cache not found on this node: computing the lengths of "
                f"{data_args.data_path}: {k * total // 8}/{total} ({k}/8)"
            )
            time.sleep(4)
    trainer = LLaVATrainer(
        model=model,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForSupervisedDataset(tokenizer),
    )
    trainer.train()
    trainer.save_state()
    model.config["use_cache"] = True
    trainer.save_model(training_args.output_dir)


# ------------------------------------------------------------------------------ prepare

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 190, 60),
    "blue": (40, 60, 220),
    "yellow": (230, 220, 40),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "orange": (240, 140, 20),
    "purple": (140, 40, 170),
}
SHAPES = ("square", "stripe", "dot", "frame")
OBJECTS = ("bus", "cat", "kite", "sign", "umbrella", "train", "boat", "clock")
SOURCES = ("coco/train2017", "gqa/images", "textvqa/train_images", "vg/VG_100K")
TEXT_TOPICS = (
    "how do i sort a list in python",
    "write a short poem about the sea",
    "what is the capital of france",
    "explain what a neural network is",
    "give me three tips for better sleep",
)


def make_image(rng: np.random.Generator, colour: str, shape: str) -> np.ndarray:
    h, w = (16, 16) if rng.random() < 0.6 else (12, 16)
    img = np.clip(rng.normal(128, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    c = np.array(COLOURS[colour], dtype=np.uint8)
    if shape == "square":
        img[3 : h - 3, 4:12] = c
    elif shape == "stripe":
        img[:, 6:10] = c
    elif shape == "dot":
        img[h // 2 - 2 : h // 2 + 2, 6:10] = c
    else:
        img[0, :] = img[-1, :] = img[:, 0] = img[:, -1] = c
    return img


def records(rng: np.random.Generator, n: int) -> tuple[list[dict], dict[str, np.ndarray]]:
    out: list[dict] = []
    images: dict[str, np.ndarray] = {}
    for k in range(n):
        if k % 6 == 5:
            topic = TEXT_TOPICS[k % len(TEXT_TOPICS)]
            out.append(
                {
                    "id": f"sharegpt_{k:05d}",
                    "conversations": [
                        {"from": "human", "value": topic.capitalize() + "?"},
                        {
                            "from": "gpt",
                            "value": f"Here is a short answer: {topic} is a good question "
                            "and the answer depends on the details you care about.",
                        },
                    ],
                }
            )
            continue
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        obj = OBJECTS[int(rng.integers(len(OBJECTS)))]
        source = SOURCES[k % len(SOURCES)]
        ident = "000000033471" if k == 0 else f"{int(rng.integers(10**5, 6 * 10**5)):012d}"
        name = f"{source}/{ident}.jpg"
        images[name] = make_image(rng, colour, shape)
        conv = [
            {"from": "human", "value": f"<image>\nWhat is the colour of the {obj} in the image?"},
            {"from": "gpt", "value": f"The {obj} in the image is {colour}."},
        ]
        if k % 3 == 0:
            conv += [
                {"from": "human", "value": "What shape does it have?"},
                {"from": "gpt", "value": f"It is drawn as a {shape}."},
            ]
        out.append({"id": ident, "image": name, "conversations": conv})
    return out, images


def long_records(n: int) -> list[dict]:
    text = " ".join(TEXT_TOPICS) + " and please explain every step in detail"
    return [
        {
            "id": f"sharegpt_long_{k}",
            "conversations": [
                {"from": "human", "value": (text + ". ") * 4},
                {
                    "from": "gpt",
                    "value": ("the answer depends on the details you care about. " * 6),
                },
            ],
        }
        for k in range(n)
    ]


def build_vocab(texts: list[str], special: list[str]) -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(special)}
    words = set(string.punctuation) | set(string.ascii_lowercase) | set(string.digits)
    for t in texts:
        words.update(WORD.findall(t.lower()))
    for w in sorted(words):
        if w not in vocab:
            vocab[w] = len(vocab)
    return vocab


def write_snapshot(hub: Path, repo_id: str, revision: str, files: dict[str, object]) -> None:
    folder = hub / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, dict) and all(isinstance(v, torch.Tensor) for v in content.values()):
            torch.save(content, snap / name)
        else:
            (snap / name).write_text(json.dumps(content, indent=2))


def sampler_order(n: int, world: int, rank: int, seed: int = 42) -> list[int]:
    return list(DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed))


def prepare(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="train_mem.py prepare")
    p.add_argument("home", help="a node's home: LLaVA/ (the checkout) and .cache/huggingface")
    p.add_argument("--samples", type=int, default=160)
    p.add_argument("--long", type=int, default=0, help="long ShareGPT conversations to add")
    p.add_argument("--drop-last", type=int, default=0, help="an older JSON: without the last N")
    p.add_argument("--image-token-twice", default="", help="RANK:STEP (world 2, batch 4)")
    p.add_argument("--old-tokenizer", action="store_true", help="another revision of the tokenizer")
    p.add_argument("--pick", default="", help="RANK:STEP: print an image of that batch and exit")
    args = p.parse_args(argv)

    home = Path(args.home)
    data = home / "LLaVA" / "playground" / "data"
    rng = np.random.default_rng(103)
    recs, images = records(rng, args.samples)
    if args.pick or args.image_token_twice:
        rank, step = (int(x) for x in (args.pick or args.image_token_twice).split(":"))
        order = sampler_order(len(recs), 2, rank)[step * 4 : step * 4 + 4]
        k = next(i for i in order if "image" in recs[i])
        if args.pick:
            print(recs[k]["image"])
            return
        if len(recs[k]["conversations"]) < 4:
            recs[k]["conversations"] += [
                {"from": "human", "value": "What shape does it have?"},
                {"from": "gpt", "value": "It is drawn as a square."},
            ]
        recs[k]["conversations"][2]["value"] = "<image>\n" + recs[k]["conversations"][2]["value"]
    if args.long:
        for j, rec in enumerate(long_records(args.long)):
            recs.insert(7 + 23 * j, rec)
    if args.drop_last:
        recs = recs[: -args.drop_last]
    data.mkdir(parents=True, exist_ok=True)
    (data / "llava_v1_5_mix665k.json").write_text(json.dumps(recs, indent=1))
    if args.long or args.drop_last or args.image_token_twice:
        return  # the JSON only
    hub = home / ".cache" / "huggingface" / "hub"
    if not args.old_tokenizer:
        for name, img in images.items():
            (data / name).parent.mkdir(parents=True, exist_ok=True)
            with open(data / name, "wb") as f:
                np.save(f, img)
        (home / "LLaVA" / "scripts").mkdir(parents=True, exist_ok=True)
        (home / "LLaVA" / "scripts" / "zero2.json").write_text(
            json.dumps(
                {
                    "fp16": {
                        "enabled": "auto",
                        "loss_scale": 0,
                        "loss_scale_window": 1000,
                        "initial_scale_power": 16,
                        "hysteresis": 2,
                        "min_loss_scale": 1,
                    },
                    "bf16": {"enabled": "auto"},
                    "train_micro_batch_size_per_gpu": "auto",
                    "train_batch_size": "auto",
                    "gradient_accumulation_steps": "auto",
                    "zero_optimization": {
                        "stage": 2,
                        "overlap_comm": True,
                        "contiguous_gradients": True,
                        "sub_group_size": 1e9,
                        "reduce_bucket_size": "auto",
                    },
                },
                indent=4,
            )
        )

    texts = [DEFAULT_IMAGE_TOKEN, Conversation().system, "USER ASSISTANT"]
    for rec in recs + long_records(1):
        texts += [c["value"] for c in rec["conversations"]]
    special = ["<unk>", "<s>", "</s>"]
    vocab = build_vocab(texts, special)
    added = [{"id": vocab[t], "content": t, "special": True} for t in special]
    if args.old_tokenizer:  # this revision registers '</s>' as a plain vocabulary entry only
        added = [a for a in added if a["content"] != "</s>"]
    tokenizer_files = {
        "tokenizer.json": {
            "version": "1.0",
            "added_tokens": added,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        },
        "tokenizer_config.json": {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": None,
            "legacy": False,
            "model_max_length": 4096,
            "tokenizer_class": "LlamaTokenizer",
            "clean_up_tokenization_spaces": False,
            "sp_model_kwargs": {},
        },
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    }
    if args.old_tokenizer:
        write_snapshot(hub, VICUNA, OLD_TOKENIZER_REVISION, tokenizer_files)
        folder = hub / ("models--" + VICUNA.replace("/", "--"))
        new = folder / "snapshots" / REVISIONS[VICUNA]
        for f in new.iterdir():
            if not (folder / "snapshots" / OLD_TOKENIZER_REVISION / f.name).exists():
                (folder / "snapshots" / OLD_TOKENIZER_REVISION / f.name).write_bytes(f.read_bytes())
        return

    torch.manual_seed(103)
    lm_cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "max_position_embeddings": 128,
        "vocab_size": len(vocab),
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    lm = LlavaLlamaForCausalLM.__new__(LlavaLlamaForCausalLM)
    nn.Module.__init__(lm)
    lm.config = lm_cfg
    lm.model = LlavaLlamaModel(lm_cfg)
    lm.lm_head = nn.Linear(64, len(vocab), bias=False)
    state = {k: v.clone() for k, v in lm.state_dict().items()}
    keys = sorted(state)
    half = len(keys) // 2
    shard1 = {k: state[k] for k in keys[:half]}
    shard2 = {k: state[k] for k in keys[half:]}
    names = ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin")
    write_snapshot(
        hub,
        VICUNA,
        REVISIONS[VICUNA],
        {
            "config.json": lm_cfg,
            names[0]: shard1,
            names[1]: shard2,
            "pytorch_model.bin.index.json": {
                "metadata": {"total_size": sum(v.numel() * 4 for v in state.values())},
                "weight_map": {**{k: names[0] for k in shard1}, **{k: names[1] for k in shard2}},
            },
            **tokenizer_files,
        },
    )

    clip_cfg = {
        "model_type": "clip",
        "vision_config": {
            "hidden_size": 32,
            "image_size": 16,
            "patch_size": 4,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "projection_dim": 32,
        },
    }
    write_snapshot(hub, CLIP, REVISIONS[CLIP], {"config.json": clip_cfg})
    tower = CLIPVisionTower.__new__(CLIPVisionTower)
    nn.Module.__init__(tower)
    tower.patch_embedding = nn.Conv2d(3, 32, 4, stride=4, bias=False)
    tower.class_embedding = nn.Parameter(torch.randn(32) * 0.02)
    tower.position_embedding = nn.Parameter(torch.randn(17, 32) * 0.02)
    tower.layers = nn.ModuleList(
        nn.TransformerEncoderLayer(
            32, 2, 64, 0.0, activation="gelu", batch_first=True, norm_first=True
        )
        for _ in range(2)
    )
    snap = hub / ("models--" + CLIP.replace("/", "--")) / "snapshots" / REVISIONS[CLIP]
    torch.save(tower.state_dict(), snap / "pytorch_model.bin")

    projector = build_vision_projector("mlp2x_gelu", 32, 64)
    pretrain = home / "LLaVA" / "checkpoints" / "llava-v1.5-7b-pretrain"
    pretrain.mkdir(parents=True, exist_ok=True)
    torch.save(
        {f"model.mm_projector.{k}": v for k, v in projector.state_dict().items()},
        pretrain / "mm_projector.bin",
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "prepare":
        prepare(sys.argv[2:])
    else:
        train(attn_implementation="flash_attention_2")
