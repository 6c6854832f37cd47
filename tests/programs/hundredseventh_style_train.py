"""A hundred-and-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/hundredseventh-*): GRPO reinforcement-learning fine-tuning of a small language
model in the way of Hugging Face TRL's GRPOTrainer with a separate vLLM generation server, as
open-r1's grpo.py and TRL's docs run it: `CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model M` in one
terminal (tests/programs/hundredseventh_vllm_serve.py), `accelerate launch --num_processes 2
--config_file multi_gpu.yaml grpo.py --config recipes/grpo.yaml --use_vllm --vllm_mode server` in
another (tests/programs/hundredseventh_accelerate.py, which starts the ranks through torch
elastic). Neither trl, transformers, accelerate nor vllm is used: this file re-creates the pieces a
user's run goes through (TrlParser reading a recipe and the command line, the Trainer's logging
with open-r1's format and transformers' explicit format, TRL's VLLMClient over HTTP with its
weight-update group, GRPOTrainer's step: the main process gathers every rank's prompts, asks the
server for num_generations completions of each, broadcast_object_list hands every rank its slice,
rewards are computed per rank and gathered for group-relative advantages, the policy loss with a
KL term to a frozen reference, DDP's gradient all-reduce, the weights pushed to the server before
each step's generation; the log dicts and the tqdm bar of the main process). The weight-update
group is a gloo process group of its own (TCPStore on the group port, the server's worker as its
rank 0, the trainer's main process as its last rank) where TRL uses vLLM's StatelessProcessGroup
and PyNcclCommunicator. The model is a tiny decoder (a word-level vocabulary of sums) and the data
are synthetic prompt shards, one per process: both written by `python grpo.py --prepare DIR`
(a base model pre-trained on question streams, an SFT model trained from it on the answer format,
and a wider model). A fault in the code is chosen by the TQ_CASE environment variable (a short
code) and never printed; re-capture with tests/fixtures/real/capture_hundredseventh.sh after any
edit.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import ctypes
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import random
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    hoard_rank: int = -1  # keeps every step's full logits for a completions table
    segv_rank: int = -1  # the fast detokenizer's native path reads address 0
    solo_rank: int = -1  # this rank alone averages the length statistics it shows
    pool_rank: int = -1  # this rank's verification worker is killed (as the OOM killer does)


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "m1": Fault(hoard_rank=1),
    "s1": Fault(segv_rank=1),
    "g0": Fault(solo_rank=0),
    "p1": Fault(pool_rank=1),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]


# ------------------------------------------------------------------------ logging (open-r1)


class TransformersFormatter(logging.Formatter):
    """transformers' enable_explicit_format(): '[%(levelname)s|%(filename)s:%(lineno)s]
    %(asctime)s >> %(message)s', the file and line of the Trainer's own code."""

    def format(self, record: logging.LogRecord) -> str:
        where = getattr(record, "where", "trainer.py:0")
        stamp = self.formatTime(record, "%Y-%m-%d %H:%M:%S") + f",{int(record.msecs):03d}"
        return f"[{record.levelname}|{where}] {stamp} >> {record.getMessage()}"


hf_logger = logging.getLogger("transformers.trainer")
hf_logger.propagate = False


def hf_info(where: str, msg: str) -> None:
    hf_logger.info(msg, extra={"where": where})


def setup_logging(level: int) -> None:
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logging.getLogger().setLevel(level)
    logger.setLevel(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TransformersFormatter())
    hf_logger.addHandler(handler)
    hf_logger.setLevel(level)


# --------------------------------------------------------------------------- tokenizer, model

SPECIAL = ["<pad>", "<bos>", "<eos>"]
WORDS = ["What", "is", "+", "?", "<think>", "</think>", "<answer>", "</answer>"]
NUMBERS = [str(i) for i in range(28)]


class TinyTokenizer:
    """A word-level tokenizer (tokenizer.json: the vocabulary and the special tokens)."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab
        self.ids = {t: i for i, t in enumerate(vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    @classmethod
    def from_pretrained(cls, path: str) -> TinyTokenizer:
        with open(os.path.join(path, "tokenizer.json")) as f:
            return cls(json.load(f)["vocab"])

    def save_pretrained(self, path: str) -> None:
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            json.dump({"vocab": self.vocab, "special_tokens": SPECIAL}, f)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [self.ids[t] for t in text.split()]
        return [self.bos_token_id, *ids] if add_bos else ids

    def batch_decode(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        out = []
        for seq in seqs:
            words = [self.vocab[i] for i in seq]
            if skip_special_tokens:
                words = [w for w in words if w not in SPECIAL]
            out.append(" ".join(words))
        return out


def positions(t: int, d: int) -> torch.Tensor:
    pos = torch.arange(t, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(t, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv_proj = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv_proj(x).split(d, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, inner: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, heads)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = MLP(d, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyMathModel(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(
            DecoderLayer(c["hidden_size"], c["num_attention_heads"], c["intermediate_size"])
            for _ in range(c["num_hidden_layers"])
        )
        self.norm = RMSNorm(c["hidden_size"])


class TinyMathForCausalLM(nn.Module):
    """A decoder with tied input and output embeddings and sinusoidal positions."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.model = TinyMathModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        h = h + positions(input_ids.shape[1], h.shape[-1])
        for layer in self.model.layers:
            h = layer(h)
        return F.linear(self.model.norm(h), self.model.embed_tokens.weight)

    @classmethod
    def from_pretrained(cls, path: str) -> TinyMathForCausalLM:
        with open(os.path.join(path, "config.json")) as f:
            model = cls(json.load(f))
        model.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return model

    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(self.config, f, indent=2)
        save_file(
            {k: v.contiguous() for k, v in self.state_dict().items()},
            os.path.join(path, "model.safetensors"),
        )


def model_config(hidden: int) -> dict:
    return {
        "architectures": ["TinyMathForCausalLM"],
        "model_type": "tinymath",
        "vocab_size": len(SPECIAL) + len(WORDS) + len(NUMBERS),
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


# ------------------------------------------------------------------------- the prepare step


def question(a: int, b: int) -> str:
    return f"What is {a} + {b} ?"


def prepare(root: str) -> None:
    """Prompt shards for 2 and 3 processes, and the models: TinyMath-S-base pre-trained on
    streams of questions (no end of sequence), TinyMath-S trained from it on the answer format
    (about half of the answers right), TinyMath-M a wider base."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = random.Random(0)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    for world in (2, 3):
        rng.shuffle(pairs)
        folder = os.path.join(root, "data", "prompts")
        os.makedirs(folder, exist_ok=True)
        for k in range(world):
            with open(os.path.join(folder, f"train-{k:05d}-of-{world:05d}.jsonl"), "w") as f:
                for a, b in pairs[12 * k : 12 * (k + 1)]:
                    f.write(json.dumps({"prompt": question(a, b), "solution": str(a + b)}) + "\n")
    tok = TinyTokenizer(SPECIAL + WORDS + NUMBERS)

    def train(model: nn.Module, make: object, steps: int) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(steps):
            batch = torch.tensor([make() for _ in range(32)])
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()

    def stream() -> list[int]:
        ids = [tok.bos_token_id]
        while len(ids) < 25:
            ids += tok.encode(question(rng.randrange(10), rng.randrange(10)), add_bos=False)
        return ids[:25]

    def formatted() -> list[int]:
        a, b = rng.randrange(10), rng.randrange(10)
        c = a + b if rng.random() < 0.5 else rng.randrange(19)
        text = f"{question(a, b)} <think> {a} + {b} </think> <answer> {c} </answer>"
        return [*tok.encode(text), tok.eos_token_id]

    base = TinyMathForCausalLM(model_config(32))
    train(base, stream, 250)
    base.save_pretrained(os.path.join(root, "models", "TinyMath-S-base"))
    tok.save_pretrained(os.path.join(root, "models", "TinyMath-S-base"))
    train(base, formatted, 1500)
    base.save_pretrained(os.path.join(root, "models", "TinyMath-S"))
    tok.save_pretrained(os.path.join(root, "models", "TinyMath-S"))
    wide = TinyMathForCausalLM(model_config(48))
    train(wide, stream, 100)
    wide.save_pretrained(os.path.join(root, "models", "TinyMath-M"))
    tok.save_pretrained(os.path.join(root, "models", "TinyMath-M"))


# ------------------------------------------------------------------ arguments (TrlParser-like)


@dataclass
class ModelConfig:
    model_name_or_path: str = ""
    torch_dtype: str = "float32"
    attn_implementation: str = "sdpa"


@dataclass
class GRPOScriptArguments:
    dataset_name: str = ""
    reward_funcs: list = field(default_factory=lambda: ["accuracy", "format"])
    reward_target: float = 0.0


@dataclass
class GRPOConfig:
    output_dir: str = "trainer_output"
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.0
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_generations: int = 8
    max_prompt_length: int = 512
    max_completion_length: int = 256
    temperature: float = 1.0
    beta: float = 0.04
    epsilon: float = 0.2
    num_train_epochs: float = 1.0
    max_steps: int = -1
    logging_steps: int = 10
    log_level: str = "passive"
    log_completions: bool = False
    reward_weights: list | None = None
    scale_rewards: bool = True
    use_vllm: bool = False
    vllm_mode: str = "server"
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_group_port: int = 51216
    vllm_server_timeout: float = 240.0
    ddp_timeout: int = 1800
    seed: int = 42
    bf16: bool = False
    gradient_checkpointing: bool = False
    save_strategy: str = "no"
    report_to: list = field(default_factory=lambda: ["none"])


def parse_args(argv: list[str]) -> tuple[GRPOScriptArguments, GRPOConfig, ModelConfig]:
    """TrlParser: the recipe (--config) sets defaults, the command line overrides them."""
    classes = (GRPOScriptArguments, GRPOConfig, ModelConfig)
    parser = argparse.ArgumentParser(prog="grpo.py")
    parser.add_argument("--config", default=None)
    for cls in classes:
        for f in dataclasses.fields(cls):
            kind = f.type
            if kind == "bool":
                parser.add_argument(f"--{f.name}", nargs="?", const=True, default=None, type=_bool)
            elif kind in ("list", "list | None"):
                parser.add_argument(f"--{f.name}", nargs="+", default=None)
            else:
                types = {"int": int, "float": float, "str": str}
                parser.add_argument(f"--{f.name}", type=types.get(kind, str), default=None)
    ns = parser.parse_args(argv)
    values = {}
    if ns.config:
        with open(ns.config) as f:
            values.update(yaml.safe_load(f) or {})
    values.update({k: v for k, v in vars(ns).items() if v is not None and k != "config"})
    out = []
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        out.append(cls(**{k: v for k, v in values.items() if k in names}))
    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    extra = sorted(set(values) - known)
    if extra:
        raise ValueError(f"Some specified arguments are not used by the TrlParser: {extra}")
    return out[0], out[1], out[2]


def _bool(v: str) -> bool:
    return str(v).lower() in ("1", "true", "yes", "y")


# ------------------------------------------------------------- accelerate's state and helpers


@dataclass
class PartialState:
    process_index: int
    local_process_index: int
    num_processes: int

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def __repr__(self) -> str:
        return (
            "Distributed environment: MULTI_GPU  Backend: gloo\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            "Device: cpu\n\n"
            f"Mixed precision type: {os.environ.get('ACCELERATE_MIXED_PRECISION', 'no')}\n"
        )


def init_state(timeout: int) -> PartialState:
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    return PartialState(
        dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0)), dist.get_world_size()
    )


def wait_for_everyone() -> None:
    dist.barrier()


def gather_object(obj: list) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return [x for part in out for x in part]


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def gather(tensor: torch.Tensor) -> torch.Tensor:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor.contiguous())
    return torch.cat(out)


def reduce(tensor: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor / dist.get_world_size() if reduction == "mean" else tensor


# ------------------------------------------------------------------------ TRL's VLLMClient

client_logger = logging.getLogger("trl.extras.vllm_client")


class Response:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text

    def json(self) -> dict:
        return json.loads(self.text)


def http(method: str, url: str, payload: dict | None = None) -> Response:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req) as resp:
            return Response(resp.status, resp.read().decode())
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read().decode())


class StatelessProcessGroup:
    """vLLM's StatelessProcessGroup: rank 0 listens on the group port and hosts the store (the
    group keeps the listening socket); a gloo group on that store carries the tensors."""

    def __init__(self, rank: int, world_size: int, store, socket, pg) -> None:
        self.rank, self.world_size = rank, world_size
        self.store, self.socket, self.pg = store, socket, pg

    @staticmethod
    def create(host: str, port: int, rank: int, world_size: int, store_timeout: int = 300):
        listen_socket, listen_fd = None, None
        if rank == 0:
            listen_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listen_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listen_socket.bind((host, port))
            listen_socket.listen()
            listen_fd = listen_socket.fileno()
        store = dist.TCPStore(
            host_name=host,
            port=port,
            world_size=world_size,
            is_master=(rank == 0),
            timeout=timedelta(seconds=store_timeout),
            use_libuv=False,
            master_listen_fd=listen_fd,
        )
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore("client2server", store), rank, world_size, timedelta(seconds=60)
        )
        return StatelessProcessGroup(rank, world_size, store, listen_socket, pg)

    def __del__(self) -> None:
        self.pg = None  # the group, then the store's daemon, before the listening socket
        self.store = None

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.pg.broadcast(tensor, src).wait()

    def barrier(self) -> None:
        self.pg.barrier().wait()


class VLLMClient:
    def __init__(self, host: str, server_port: int, group_port: int, connection_timeout: float):
        self.host = host
        self.server_port = server_port
        self.base_url = f"http://{host}:{server_port}"
        self.group_port = group_port
        self.check_server(connection_timeout)

    def check_server(self, total_timeout: float = 0.0, retry_interval: float = 2.0) -> None:
        url = f"{self.base_url}/health/"
        start_time = time.time()
        while True:
            try:
                response = http("GET", url)
            except OSError as exc:
                elapsed_time = time.time() - start_time
                if elapsed_time >= total_timeout:
                    raise ConnectionError(
                        f"The vLLM server can't be reached at {self.host}:{self.server_port} "
                        f"after {total_timeout} seconds. Make sure the server is running by "
                        "running `trl vllm-serve`."
                    ) from exc
            else:
                if response.status_code == 200:
                    client_logger.info("Server is up!")
                    return None
            client_logger.info(f"Server is not up yet. Retrying in {retry_interval} seconds...")
            time.sleep(retry_interval)

    def generate(self, prompts: list[str], n: int, **sampling: object) -> dict:
        response = http(
            "POST", f"{self.base_url}/generate/", {"prompts": prompts, "n": n, **sampling}
        )
        if response.status_code == 200:
            return response.json()
        raise Exception(f"Request failed: {response.status_code}, {response.text}")

    def init_communicator(self, device: str = "cpu") -> None:
        response = http("GET", f"{self.base_url}/get_world_size/")
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")
        vllm_world_size = response.json()["world_size"]
        world_size = vllm_world_size + 1
        self.rank = vllm_world_size
        response = http(
            "POST",
            f"{self.base_url}/init_communicator/",
            {
                "host": "0.0.0.0",
                "port": self.group_port,
                "world_size": world_size,
                "client_device_uuid": f"{socket.gethostname()}-{device}",
            },
        )
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")
        time.sleep(0.1)
        self.communicator = StatelessProcessGroup.create(
            host=self.host, port=self.group_port, rank=self.rank, world_size=world_size
        )
        atexit.register(self.close_communicator)

    def update_named_param(self, name: str, weights: torch.Tensor) -> None:
        dtype, shape = str(weights.dtype), tuple(weights.shape)
        url = f"{self.base_url}/update_named_param/"
        response = http("POST", url, {"name": name, "dtype": dtype, "shape": shape})
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")
        self.communicator.broadcast(weights, src=self.rank)
        self.communicator.barrier()

    def reset_prefix_cache(self) -> None:
        response = http("POST", f"{self.base_url}/reset_prefix_cache/", {})
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")

    def close_communicator(self) -> None:
        try:
            response = http("POST", f"{self.base_url}/close_communicator/", {})
        except OSError:
            pass  # the server might be down already
        else:
            if response.status_code != 200:
                raise Exception(f"Request failed: {response.status_code}, {response.text}")


# ------------------------------------------------------------------------ the reward functions

VERIFY_POOL = None  # a worker process per rank checks the parsed answers


def _verify(pair: tuple[int, int]) -> float:
    global _VERIFIED
    _VERIFIED += 1
    if FAULT.pool_rank == int(os.environ.get("RANK", -1)) and _VERIFIED == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    answer, gold = pair
    return float(answer == gold)


_VERIFIED = 0


def _parse_answer(content: str) -> int | None:
    try:
        return int(content.split("<answer>")[-1].split("</answer>")[0])
    except ValueError:
        return None


def accuracy_reward(completions: list[str], solution: list[str], **kwargs: object) -> list[float]:
    """1.0 when the number between the answer tags is the solution (0.0 without a number)."""
    answers = [_parse_answer(c) for c in completions]
    pairs = [(-1 if a is None else a, int(s)) for a, s in zip(answers, solution, strict=True)]
    return VERIFY_POOL.map(_verify, pairs)


def format_reward(completions: list[str], **kwargs: object) -> list[float]:
    """1.0 when the completion is '<think> ... </think> <answer> ... </answer>'."""
    pattern = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
    return [1.0 if re.match(pattern, c, re.DOTALL) else 0.0 for c in completions]


def closeness_reward(completions: list[str], solution: list[str], **kwargs: object) -> list[float]:
    """Partial credit for answers near the solution: 1 - |answer - solution| / 18."""
    rewards = []
    for content, sol in zip(completions, solution, strict=True):
        answer = int(content.split("<answer>")[-1].split("</answer>")[0].strip())
        rewards.append(max(0.0, 1.0 - abs(answer - int(sol)) / 18))
    return rewards


REWARD_FUNCS = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "closeness": closeness_reward,
}


# -------------------------------------------------------------------------------- callbacks


@dataclass
class TrainerControl:
    should_training_stop: bool = False


class RewardTargetCallback:
    """Stops training once the logged reward (gathered from every process, so the same on
    each) reaches the target."""

    def __init__(self, target: float) -> None:
        self.target = target

    def on_log(self, state: dict, control: TrainerControl, logs: dict) -> None:
        if self.target and logs.get("reward", 0.0) >= self.target:
            logger.info(
                f"Reward {logs['reward']:.4f} reached reward_target {self.target} at step "
                f"{state['global_step']}: stopping training"
            )
            control.should_training_stop = True


# ------------------------------------------------------------------------------ GRPOTrainer


class GRPOTrainer:
    def __init__(
        self,
        model: TinyMathForCausalLM,
        reward_funcs: list,
        args: GRPOConfig,
        train_dataset: list[dict],
        processing_class: TinyTokenizer,
        state: PartialState,
        callbacks: list,
    ) -> None:
        self.args = args
        self.state = state
        self.tokenizer = processing_class
        self.reward_funcs = reward_funcs
        self.reward_weights = torch.tensor(args.reward_weights or [1.0] * len(reward_funcs))
        self.train_dataset = train_dataset
        self.callbacks = callbacks
        self.num_generations = args.num_generations
        num_processes = state.num_processes
        global_batch_size = args.per_device_train_batch_size * num_processes
        possible_values = [
            n_gen for n_gen in range(2, global_batch_size + 1) if global_batch_size % n_gen == 0
        ]
        if self.num_generations not in possible_values:
            raise ValueError(
                f"The global train batch size ({num_processes} x "
                f"{args.per_device_train_batch_size}) must be evenly divisible by the number of "
                f"generations per prompt ({self.num_generations}). Given the current train "
                "batch size, the valid values for the number of generations are: "
                f"{possible_values}."
            )
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = DistributedDataParallel(model)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        self.global_step = 0
        self._metrics: dict[str, list[float]] = {}
        self._total_loss = 0.0
        self._hoard: list[torch.Tensor] = []
        if args.use_vllm and args.vllm_mode == "server" and state.is_main_process:
            self.vllm_client = VLLMClient(
                args.vllm_server_host,
                args.vllm_server_port,
                args.vllm_group_port,
                connection_timeout=args.vllm_server_timeout,
            )
            self.vllm_client.init_communicator(device="cpu")
        self._last_loaded_step = -1
        wait_for_everyone()

    # the weights the server generates with
    def _move_model_to_vllm(self) -> None:
        if self.state.is_main_process:
            for name, param in self.model.module.named_parameters():
                self.vllm_client.update_named_param(name, param.data)
            self.vllm_client.reset_prefix_cache()

    def _sequence_logps(self, model: nn.Module, prompt: list[int], completion: list[int]):
        ids = torch.tensor([prompt + completion])
        logits = model(ids)[0, len(prompt) - 1 : -1]
        logps = torch.log_softmax(logits, dim=-1)
        if FAULT.hoard_rank == self.state.process_index and model is self.model:
            self._hoard.append(torch.ones(16, 1024, 1024, dtype=torch.uint8))
            if len(self._hoard) == 16:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        return logps.gather(1, torch.tensor(completion)[:, None])[:, 0], logps

    def training_step(self, rows: list[dict]) -> float:
        args, st = self.args, self.state
        g = self.num_generations
        prompts_text = [r["prompt"] for r in rows]
        solutions = [r["solution"] for r in rows]
        if self.global_step != self._last_loaded_step:
            self._move_model_to_vllm()
            self._last_loaded_step = self.global_step
        all_prompts_text = gather_object(prompts_text)
        if st.is_main_process:
            ordered_set_of_prompts = all_prompts_text[::g]
            output = self.vllm_client.generate(
                prompts=ordered_set_of_prompts,
                n=g,
                temperature=args.temperature,
                top_p=1.0,
                top_k=-1,
                min_p=0.0,
                max_tokens=args.max_completion_length,
            )
            payload = output["completion_ids"]
        else:
            payload = None
        obj = broadcast_object_list([payload], from_process=0)
        process_slice = slice(
            st.process_index * len(prompts_text), (st.process_index + 1) * len(prompts_text)
        )
        completion_ids = obj[0][process_slice]
        if FAULT.segv_rank == st.process_index and self.global_step == 3:
            ctypes.string_at(0)  # the fast detokenizer's native path dereferences NULL
        completions = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)

        rewards_per_func = torch.zeros(len(rows), len(self.reward_funcs))
        for i, func in enumerate(self.reward_funcs):
            rewards_per_func[:, i] = torch.tensor(
                func(completions=completions, solution=solutions), dtype=torch.float32
            )
        rewards_per_func = gather(rewards_per_func)
        rewards = (rewards_per_func * self.reward_weights[None, :]).sum(dim=1)
        grouped = rewards.view(-1, g)
        mean_grouped = grouped.mean(dim=1).repeat_interleave(g)
        std_grouped = grouped.std(dim=1).repeat_interleave(g)
        advantages = rewards - mean_grouped
        if args.scale_rewards:
            advantages = advantages / (std_grouped + 1e-4)
        advantages = advantages[process_slice]

        # the policy loss, token-level, with the KL to the frozen reference
        count, kl_sum, entropy_sum = 0, 0.0, 0.0
        losses = []
        for k, comp in enumerate(completion_ids):
            prompt = self.tokenizer.encode(prompts_text[k])
            logps, dist_logps = self._sequence_logps(self.model, prompt, comp)
            with torch.no_grad():
                ref_logps, _ = self._sequence_logps(self.ref_model, prompt, comp)
            per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            coef = torch.exp(logps - logps.detach())
            per_token_loss = -(coef * advantages[k]) + args.beta * per_token_kl
            losses.append(per_token_loss.sum())
            count += len(comp)
            kl_sum += per_token_kl.detach().sum().item()
            entropy_sum += -(dist_logps.exp() * dist_logps).sum(-1).detach().sum().item()
        loss = torch.stack(losses).sum() / max(count, 1)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()

        # the metrics every process logs (gathered, the same everywhere)
        lengths = torch.tensor([float(len(c)) for c in completion_ids])
        ended = torch.tensor([float(len(c) > 0 and c[-1] == 2) for c in completion_ids])
        prompt_tokens = sum(len(self.tokenizer.encode(p)) for p in prompts_text)
        agg = gather(torch.tensor([kl_sum, entropy_sum, float(count), float(prompt_tokens)]))
        agg = agg.view(-1, 4).sum(0)
        all_lengths, all_ended = gather(lengths), gather(ended)
        self._num_tokens = getattr(self, "_num_tokens", 0.0) + float(agg[2] + agg[3])
        m = self._metrics
        term = all_lengths[all_ended > 0]
        for key, value in (
            ("num_tokens", self._num_tokens),
            ("completions/mean_length", all_lengths.mean().item()),
            ("completions/min_length", all_lengths.min().item()),
            ("completions/max_length", all_lengths.max().item()),
            ("completions/clipped_ratio", 1.0 - all_ended.mean().item()),
            ("completions/mean_terminated_length", term.mean().item() if len(term) else 0.0),
        ):
            m.setdefault(key, []).append(value)
        for i, func in enumerate(self.reward_funcs):
            m.setdefault(f"rewards/{func.__name__}/mean", []).append(
                rewards_per_func[:, i].mean().item()
            )
            m.setdefault(f"rewards/{func.__name__}/std", []).append(
                rewards_per_func[:, i].std().item()
            )
        m.setdefault("reward", []).append(rewards.mean().item())
        m.setdefault("reward_std", []).append(std_grouped.mean().item())
        m.setdefault("frac_reward_zero_std", []).append(
            (grouped.std(dim=1) < 1e-6).float().mean().item()
        )
        m.setdefault("kl", []).append((agg[0] / agg[2]).item())
        m.setdefault("entropy", []).append((agg[1] / agg[2]).item())
        m.setdefault("clip_ratio/region_mean", []).append(0.0)
        self._grad_norm = grad_norm.item()
        if args.log_completions:
            self._last_completions = (prompts_text, completions, rewards[process_slice])
        return loss.item()

    def log(self, logs: dict, control: TrainerControl) -> None:
        logs = {**logs, "epoch": round(self.epoch, 2)}
        if self.state.is_main_process:
            self.bar.write(str(logs))
        for cb in self.callbacks:
            cb.on_log({"global_step": self.global_step}, control, logs)

    def _log_step(self, loss: float, control: TrainerControl) -> None:
        st = self.state
        logs: dict[str, float] = {"loss": round(loss, 4), "grad_norm": self._grad_norm}
        logs["learning_rate"] = self.scheduler.get_last_lr()[0]
        for key, values in self._metrics.items():
            logs[key] = sum(values) / len(values)
        self._metrics = {}
        if FAULT.solo_rank == st.process_index:
            # the length statistics shown in the bar, averaged over the processes
            keys = ["completions/mean_length", "completions/min_length", "completions/max_length"]
            shown = reduce(torch.tensor([logs[k] for k in keys] + [logs["kl"]]))
            self.bar.set_postfix(len=f"{shown[0]:.1f}", kl=f"{shown[3]:.4f}")
        self.log(logs, control)
        if self.args.log_completions and st.is_main_process:
            print_prompt_completions_sample(*self._last_completions, self.global_step)

    def store_flos(self) -> None:
        flos = torch.tensor([6.0 * 26752 * getattr(self, "_num_tokens", 0.0)])
        out = [torch.empty_like(flos) for _ in range(dist.get_world_size())]
        dist.all_gather(out, flos)
        self.total_flos = float(sum(out))

    def train(self) -> None:
        args, st = self.args, self.state
        g = self.num_generations
        per_step = args.per_device_train_batch_size // g
        steps_per_epoch = len(self.train_dataset) // per_step
        epochs = math.ceil(args.num_train_epochs)
        max_steps = args.max_steps if args.max_steps > 0 else steps_per_epoch * epochs
        if args.max_steps > 0:
            epochs = math.ceil(max_steps / steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: max(0.0, 1.0 - s / max_steps)
        )
        n_params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        hf_info("trainer.py:2414", "***** Running training *****")
        hf_info("trainer.py:2415", f"  Num examples = {len(self.train_dataset):,}")
        hf_info("trainer.py:2416", f"  Num Epochs = {epochs:,}")
        hf_info(
            "trainer.py:2417",
            f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}",
        )
        hf_info(
            "trainer.py:2420",
            "  Total train batch size (w. parallel, distributed & accumulation) = "
            f"{args.per_device_train_batch_size * st.num_processes:,}",
        )
        hf_info(
            "trainer.py:2421", f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}"
        )
        hf_info("trainer.py:2422", f"  Total optimization steps = {max_steps:,}")
        hf_info("trainer.py:2423", f"  Number of trainable parameters = {n_params:,}")
        self.bar = tqdm(total=max_steps, dynamic_ncols=True, disable=not st.is_main_process)
        control = TrainerControl()
        start = time.time()
        rng = random.Random(args.seed)
        losses = []
        for epoch in range(epochs):
            order = list(range(len(self.train_dataset)))
            rng.shuffle(order)
            for step in range(steps_per_epoch):
                picked = order[step * per_step : (step + 1) * per_step]
                rows = [self.train_dataset[i] for i in picked for _ in range(g)]
                loss = self.training_step(rows)
                losses.append(loss)
                self.global_step += 1
                self.epoch = epoch + (step + 1) / steps_per_epoch
                self.bar.update(1)
                if self.global_step % args.logging_steps == 0:
                    self._log_step(sum(losses[-args.logging_steps :]) / args.logging_steps, control)
                if control.should_training_stop or self.global_step >= max_steps:
                    break
            if control.should_training_stop or self.global_step >= max_steps:
                break
        hf_info(
            "trainer.py:2681",
            "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n",
        )
        self.store_flos()
        runtime = time.time() - start
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(
                self.global_step * args.per_device_train_batch_size * st.num_processes / runtime, 3
            ),
            "train_steps_per_second": round(self.global_step / runtime, 3),
            "train_loss": sum(losses) / max(len(losses), 1),
            "epoch": round(self.epoch, 2),
        }
        if st.is_main_process:
            self.bar.write(str(metrics))
        self.bar.close()

    def save_model(self, output_dir: str) -> None:
        if self.state.is_main_process:
            hf_info("trainer.py:3984", f"Saving model checkpoint to {output_dir}")
            self.model.module.save_pretrained(output_dir)
            self.tokenizer.save_pretrained(output_dir)
        wait_for_everyone()


def print_prompt_completions_sample(prompts, completions, rewards, step) -> None:
    """TRL's rich table of a step's prompts, completions and rewards."""
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold white", expand=True, title=f"Step {step}")
    table.add_column("Prompt", style="bright_yellow")
    table.add_column("Completion", style="bright_green")
    table.add_column("reward", style="bold cyan", justify="right")
    for p, c, r in zip(prompts, completions, rewards.tolist(), strict=True):
        table.add_row(p, c, f"{r:.2f}")
    Console(width=100, force_terminal=False).print(table)


# ------------------------------------------------------------------------------------- main


def load_prompt_shard(dataset_name: str, st: PartialState, tok: TinyTokenizer, max_len: int):
    path = os.path.join(
        dataset_name, f"train-{st.process_index:05d}-of-{st.num_processes:05d}.jsonl"
    )
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    keep = [r for r in rows if len(tok.encode(r["prompt"])) <= max_len]
    if len(keep) < len(rows):
        logger.warning(
            f"Filtered {len(rows) - len(keep)} of {len(rows)} prompts in {path} longer than "
            f"max_prompt_length={max_len} tokens"
        )
    logger.info(f"Loaded {len(keep)} prompts from {path}")
    return keep


def main(script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig):
    torch.manual_seed(training_args.seed)
    random.seed(training_args.seed)
    torch.set_num_threads(1)
    state = init_state(training_args.ddp_timeout)
    level = logging.INFO if state.is_main_process else logging.WARNING
    setup_logging(level)
    logger.warning(
        f"Process rank: {state.local_process_index}, device: cpu, n_gpu: 0"
        + f" distributed training: True, 16-bits training: {training_args.bf16}"
    )
    logger.info(f"{state}")
    logger.info(f"Model parameters {model_args}")
    logger.info(f"Script parameters {script_args}")
    logger.info(f"Training parameters {training_args}")

    global VERIFY_POOL
    VERIFY_POOL = multiprocessing.get_context("fork").Pool(processes=1)

    tokenizer = TinyTokenizer.from_pretrained(model_args.model_name_or_path)
    dataset = load_prompt_shard(
        script_args.dataset_name, state, tokenizer, training_args.max_prompt_length
    )
    logger.info("*** Initializing model kwargs ***")
    model = TinyMathForCausalLM.from_pretrained(model_args.model_name_or_path)
    reward_funcs = [REWARD_FUNCS[name] for name in script_args.reward_funcs]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        state=state,
        callbacks=[RewardTargetCallback(script_args.reward_target)],
    )
    logger.info("*** Train ***")
    trainer.train()
    logger.info("*** Save model ***")
    trainer.save_model(training_args.output_dir)
    logger.info(f"Model saved to {training_args.output_dir}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--prepare":
        prepare(sys.argv[2])
        sys.exit(0)
    main(*parse_args(sys.argv[1:]))
