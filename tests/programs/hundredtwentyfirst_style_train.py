"""GPT-style language model pretraining in the way of EleutherAI/gpt-neox, re-created in plain
torch for the hundredtwentyfirst-* fixtures (gpt-neox, megatron and deepspeed are not installed).
Linked into each run's folder as train.py; `python ./deepy.py train.py -d configs 125M.yml
local_setup.yml` (tests/programs/hundredtwentyfirst_deepy.py) builds NeoXArgs from the YAML files
and starts the DeepSpeed launcher, which starts `train.py --local_rank=K --deepspeed_config
<base64> --megatron_config <base64>` per local rank.

What it keeps of gpt-neox: NeoXArgs from the base64 megatron_config, Megatron's print_rank_0
messages (tokenizer, padded vocab, torch distributed, random seeds, model build, mmap indexed
dataset, index maps built by rank 0 while the others wait in an all-reduce), a small DeepSpeed
engine (the batch assertion of DeepSpeedConfig, fp16 with a dynamic loss scaler and fp32 master
weights, the bucketed gradient all-reduce, log_dist records), the training_log line every
log_interval, evaluate_and_print_results, save_checkpoint, exit_interval. A GPT of 2 layers on
synthetic 'enwik8' documents (`python train.py --prepare data` writes the vocab, the merges and
the tokenized .bin/.idx). A fault in the code is chosen by $TQ_CASE, which nothing prints.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import datetime
import json
import math
import os
import signal
import struct
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CASE = os.environ.get("TQ_CASE", "")


def fault(code: str, rank: int) -> bool:
    return f"{code}{rank}" == CASE


def print_rank_0(*message: object) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*message, flush=True)


def log_dist(where: str, message: str, ranks: tuple[int, ...] = (0,)) -> None:
    """deepspeed.utils.logging.log_dist: '[date] [INFO] [logging.py:96:log_dist] [Rank 0] ...'."""
    rank = dist.get_rank() if dist.is_initialized() else -1
    if rank in ranks or -1 in ranks:
        ds_log("INFO", where, f"[Rank {rank}] {message}")


def ds_log(level: str, where: str, message: str) -> None:
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    print(f"[{stamp}] [{level}] [{where}] {message}", flush=True)


# ------------------------------------------------------------------------------------ tokenizer


class GPT2BPETokenizer:
    """megatron/tokenizer: the GPT-2 byte-level BPE from a vocab json and a merges file (the
    synthetic vocab here is one token per word, the merges file is read as GPT-2's is)."""

    def __init__(self, vocab_file: str, merge_file: str) -> None:
        with open(vocab_file, encoding="utf-8") as f:
            self.encoder: dict[str, int] = json.load(f)
        self.decoder = {v: k for k, v in self.encoder.items()}
        with open(merge_file, encoding="utf-8") as f:
            self.bpe_ranks = {
                tuple(line.split()): i for i, line in enumerate(f.read().split("\n")[1:-1])
            }
        self.eod_id = self.encoder["<|endoftext|>"]

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def tokenize(self, text: str) -> list[int]:
        return [self.encoder[w] for w in text.split()]

    def detokenize(self, token_ids: list[int]) -> str:
        return " ".join(self.decoder[t] for t in token_ids)


def build_tokenizer(args: dict) -> GPT2BPETokenizer:
    """neox_args.build_tokenizer(): before torch distributed, rank 0 announces it."""
    rank0 = args["rank"] == 0
    if rank0:
        print(f"> building {args['tokenizer_type']} tokenizer ...", flush=True)
    tokenizer = GPT2BPETokenizer(args["vocab_file"], args["merge_file"])
    after = tokenizer.vocab_size
    multiple = args["make_vocab_size_divisible_by"] * args["model_parallel_size"]
    while (after % multiple) != 0:
        after += 1
    if rank0:
        print(
            f" > padded vocab (size: {tokenizer.vocab_size}) with "
            f"{after - tokenizer.vocab_size} dummy tokens (new size: {after})",
            flush=True,
        )
    args["padded_vocab_size"] = after
    return tokenizer


# ------------------------------------------------------------------------------------- prepare

WORDS = (  # noqa: SIM905
    "the of and in to a is was for as by with on that from at his it an were are which be this "
    "has or first also new he its had their they one after two city but not been other have "
    "world time all more between who her team war during film she would school years into there "
    "national over three under united later about only most state up where several may known "
    "while born series used since season such both can many under american through some when "
    "then until early second university than including well year these four de called however "
    "against no back album part north same south music its each another played became both "
    "before each around following river john any district government town final league club "
    "won village use public county being released best british made high family would game "
    "work third near book member group county army built based german along five became held "
    "name french british church former line de great still station number often main system "
    "end control what him company local period small life found head took will did if out "
    "single way make old new end day then so we just our them last like has long six right set "
    "did even down area area own home off house order around power court side west east road "
    "river park history sea land wikipedia article category talk page revision text id title "
    "redirect namespace infobox reference cite web url access date isbn journal volume issue "
    "pages publisher language english population census km mi elevation coordinates latitude "
    "longitude climate temperature rainfall average record summer winter spring autumn"
).split()


def write_indexed(prefix: str, docs: list[list[int]]) -> None:
    """megatron/data/indexed_dataset.py MMapIndexedDatasetBuilder: .bin of uint16 tokens and
    .idx with the MMIDIDX header, sizes, pointers and the document index."""
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * 2)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.array(d, dtype=np.uint16).tobytes(order="C"))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes(order="C"))


def prepare(folder: str, documents: int) -> None:
    """prepare_data.py enwik8 + tools/preprocess_data.py: the vocab, the merges, and
    data/enwik8/enwik8_text_document.{bin,idx} (one document per article, <|endoftext|> appended)."""
    os.makedirs(os.path.join(folder, "enwik8"), exist_ok=True)
    words = list(dict.fromkeys(WORDS))
    vocab = {w: i for i, w in enumerate(words)}
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(folder, "gpt2-vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "gpt2-merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for a, b in zip(words[::2], words[1::2], strict=False):
            f.write(f"{a[:2]} {a[2:] or 'e'}\n{b[:1]} {b[1:] or 's'}\n")
    tok = GPT2BPETokenizer(
        os.path.join(folder, "gpt2-vocab.json"), os.path.join(folder, "gpt2-merges.txt")
    )
    rng = np.random.default_rng(1234)
    docs = []
    for _ in range(1000):  # the article generator is the same whatever is kept of it
        n = int(rng.integers(16, 96))
        text = " ".join(words[int(i)] for i in rng.zipf(1.3, n) % len(words))
        docs.append([*tok.tokenize(text), tok.eod_id])
    write_indexed(os.path.join(folder, "enwik8", "enwik8_text_document"), docs[:documents])
    print(f"Processed {documents} documents", flush=True)


# ------------------------------------------------------------------------------------- dataset


class MMapIndexedDataset:
    def __init__(self, path: str) -> None:
        print_rank_0(" > building dataset index ...")
        start = time.time()
        with open(path + ".idx", "rb") as f:
            assert f.read(9) == b"MMIDIDX\x00\x00", "Index file doesn't match expected format."
            (version,) = struct.unpack("<Q", f.read(8))
            assert version == 1
            (_code,) = struct.unpack("<B", f.read(1))
            (self._len,) = struct.unpack("<Q", f.read(8))
            (self._doc_count,) = struct.unpack("<Q", f.read(8))
            offset = f.tell()
        self._bin_buffer_mmap = np.memmap(path + ".idx", mode="r", order="C")
        buf = memoryview(self._bin_buffer_mmap)
        print_rank_0("    reading sizes...")
        self._sizes = np.frombuffer(buf, dtype=np.int32, count=self._len, offset=offset)
        print_rank_0("    reading pointers...")
        self._pointers = np.frombuffer(
            buf, dtype=np.int64, count=self._len, offset=offset + self._sizes.nbytes
        )
        print_rank_0("    reading document index...")
        self._doc_idx = np.frombuffer(
            buf,
            dtype=np.int64,
            count=self._doc_count,
            offset=offset + self._sizes.nbytes + self._pointers.nbytes,
        )
        print_rank_0("    creating numpy buffer of mmap...")
        self._data = np.memmap(path + ".bin", mode="r", order="C")
        print_rank_0("    creating memory view of numpy buffer...")
        self._bin_buffer = memoryview(self._data)
        print_rank_0(f" > finished creating indexed dataset in {time.time() - start:4f} seconds")
        print_rank_0(f"    number of documents: {self._sizes.shape[0]}")

    def __len__(self) -> int:
        return self._len

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        ptr, size = self._pointers[idx], self._sizes[idx]
        if length is None:
            length = size - offset
        ptr += offset * 2
        return np.frombuffer(self._bin_buffer, dtype=np.uint16, count=length, offset=ptr)


def _build_doc_idx(documents: np.ndarray, num_epochs: int, np_rng: np.random.RandomState):
    doc_idx = np.mgrid[0:num_epochs, 0 : len(documents)][1]
    doc_idx[:] = documents
    doc_idx = doc_idx.reshape(-1).astype(np.int32)
    np_rng.shuffle(doc_idx)
    return doc_idx


def _build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """megatron/data/gpt2_dataset.py's python _build_sample_idx (the compiled helper's twin)."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros([int(num_samples) + 1, 2], dtype=np.int32)
    sample_index = 0
    doc_idx_index = 0
    doc_offset = 0
    sample_idx[sample_index][0] = doc_idx_index
    sample_idx[sample_index][1] = doc_offset
    sample_index += 1
    while sample_index <= num_samples:
        remaining_seq_length = seq_length + 1
        while remaining_seq_length != 0:
            doc_id = doc_idx[doc_idx_index]
            doc_length = sizes[doc_id] - doc_offset
            remaining_seq_length -= doc_length
            if remaining_seq_length <= 0:
                doc_offset += remaining_seq_length + doc_length - 1
                remaining_seq_length = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index][0] = doc_idx_index
        sample_idx[sample_index][1] = doc_offset
        sample_index += 1
    return sample_idx


def _build_shuffle_idx(size: int, np_rng: np.random.RandomState) -> np.ndarray:
    shuffle_idx = np.arange(start=0, stop=size, step=1, dtype=np.int64)
    np_rng.shuffle(shuffle_idx)
    return shuffle_idx


def _build_index_mappings(name, data_prefix, documents, sizes, num_samples, seq_length, seed):
    tokens_per_epoch = int(np.sum(sizes[documents]))
    num_epochs = 0
    total_tokens = 0
    while True:
        num_epochs += 1
        total_tokens += tokens_per_epoch
        if ((total_tokens - 1) // seq_length) >= num_samples:
            break
    np_rng = np.random.RandomState(seed=seed)
    _filename = data_prefix + f"_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s"
    doc_idx_filename = _filename + "_doc_idx.npy"
    sample_idx_filename = _filename + "_sample_idx.npy"
    shuffle_idx_filename = _filename + "_shuffle_idx.npy"
    if dist.get_rank() == 0:  # noqa: SIM102
        if (
            (not os.path.isfile(doc_idx_filename))
            or (not os.path.isfile(sample_idx_filename))
            or (not os.path.isfile(shuffle_idx_filename))
        ):
            print_rank_0(
                " > WARNING: could not find index map files, building the indices on rank 0 ..."
            )
            start_time = time.time()
            doc_idx = _build_doc_idx(documents, num_epochs, np_rng)
            np.save(doc_idx_filename, doc_idx, allow_pickle=True)
            print_rank_0(
                " > elasped time to build and save doc-idx mapping (seconds): "
                f"{time.time() - start_time:4f}"
            )
            start_time = time.time()
            sample_idx = _build_sample_idx(
                sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch
            )  # fmt: skip (as captured: the fixtures cite these lines)
            np.save(sample_idx_filename, sample_idx, allow_pickle=True)
            print_rank_0(
                " > elasped time to build and save sample-idx mapping (seconds): "
                f"{time.time() - start_time:4f}"
            )
            start_time = time.time()
            num_samples_ = sample_idx.shape[0] - 1
            print_rank_0(
                f" > building shuffle index with split [0, {num_samples_}) and "
                f"[{num_samples_}, {num_samples_}) ..."
            )
            shuffle_idx = _build_shuffle_idx(num_samples_, np_rng)
            np.save(shuffle_idx_filename, shuffle_idx, allow_pickle=True)
            print_rank_0(
                " > elasped time to build and save shuffle-idx mapping (seconds): "
                f"{time.time() - start_time:4f}"
            )
    # This should be a barrier but nccl barrier assumes device_index=rank which is not the
    # case for model parallel case
    counts = torch.tensor([1], dtype=torch.long)
    dist.all_reduce(counts)
    assert counts[0].item() == dist.get_world_size()

    start_time = time.time()
    print_rank_0(f" > loading doc-idx mapping from {doc_idx_filename}")
    doc_idx = np.load(doc_idx_filename, allow_pickle=True, mmap_mode="r")
    print_rank_0(f" > loading sample-idx mapping from {sample_idx_filename}")
    sample_idx = np.load(sample_idx_filename, allow_pickle=True, mmap_mode="r")
    print_rank_0(f" > loading shuffle-idx mapping from {shuffle_idx_filename}")
    shuffle_idx = np.load(shuffle_idx_filename, allow_pickle=True, mmap_mode="r")
    print_rank_0(f"    loaded indexed file in {time.time() - start_time:3.3f} seconds")
    print_rank_0(f"    total number of samples: {sample_idx.shape[0]}")
    print_rank_0(f"    total number of epochs: {num_epochs}")
    return doc_idx, sample_idx, shuffle_idx


class GPT2Dataset(torch.utils.data.Dataset):
    def __init__(self, name, data_prefix, documents, indexed_dataset, num_samples, seq_length, seed):  # fmt: skip
        self.name = name
        self.indexed_dataset = indexed_dataset
        self.doc_idx, self.sample_idx, self.shuffle_idx = _build_index_mappings(
            name, data_prefix, documents, indexed_dataset.sizes, num_samples, seq_length, seed
        )
        self.shuffle_idx_len = self.shuffle_idx.shape[0] - 1
        self.sample_idx_len = self.sample_idx.shape[0] - 1

    def __len__(self) -> int:
        return min(self.shuffle_idx_len, self.sample_idx_len)

    def __getitem__(self, idx: int) -> dict:
        idx = self.shuffle_idx[idx]
        doc_index_f = self.sample_idx[idx][0]
        doc_index_l = self.sample_idx[idx + 1][0]
        offset_f = self.sample_idx[idx][1]
        offset_l = self.sample_idx[idx + 1][1]
        if doc_index_f == doc_index_l:
            sample = self.indexed_dataset.get(
                self.doc_idx[doc_index_f], offset=offset_f, length=offset_l - offset_f + 1
            )
        else:
            sample_list = [self.indexed_dataset.get(self.doc_idx[doc_index_f], offset=offset_f)]
            for i in range(doc_index_f + 1, doc_index_l):
                sample_list.append(self.indexed_dataset.get(self.doc_idx[i]))
            sample_list.append(
                self.indexed_dataset.get(self.doc_idx[doc_index_l], length=offset_l + 1)
            )
            sample = np.concatenate(sample_list)
        return {"text": torch.from_numpy(np.array(sample, dtype=np.int64))}


class DistributedBatchSampler(torch.utils.data.BatchSampler):
    """megatron/data/samplers.py: each rank takes its slice of every global batch."""

    def __init__(self, sampler, batch_size, drop_last, rank, world_size, start_iter=0):
        super().__init__(sampler, batch_size, drop_last)
        self.rank, self.world_size, self.start_iter = rank, world_size, start_iter

    def __iter__(self):
        batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield self._batch(batch)
                batch = []
        if len(batch) > 0 and not self.drop_last:
            yield self._batch(batch)

    def _batch(self, batch):
        start = self.rank * self.batch_size // self.world_size
        end = (self.rank + 1) * self.batch_size // self.world_size
        return batch[start:end]


def make_data_loader(dataset, args):
    world = dist.get_world_size()
    sampler = torch.utils.data.SequentialSampler(dataset)
    batch_sampler = DistributedBatchSampler(
        sampler,
        batch_size=args["train_micro_batch_size_per_gpu"] * world,
        drop_last=True,
        rank=dist.get_rank(),
        world_size=world,
    )
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=args["num_workers"], pin_memory=True
    )


def build_train_valid_test_data_iterators(args):
    print_rank_0("> building train, validation, and test datasets ...")
    gbs = args["train_batch_size"]
    eval_iters = (args["train_iters"] // args["eval_interval"] + 1) * args["eval_iters"]
    samples = [args["train_iters"] * gbs, eval_iters * gbs, args["eval_iters"] * gbs]
    prefix = args["data_path"]
    indexed = MMapIndexedDataset(prefix)
    total = indexed.sizes.shape[0]
    weights = [float(s) for s in args["split"].split(",")]
    bounds = [0]
    for w in weights:
        bounds.append(bounds[-1] + round(w / sum(weights) * total))
    bounds[-1] = total
    print_rank_0(" > dataset split:")
    datasets = []
    for k, name in enumerate(("train", "valid", "test")):
        print_rank_0(f"    {name}:")
        print_rank_0(
            f"     document indices in [{bounds[k]}, {bounds[k + 1]}) total of "
            f"{bounds[k + 1] - bounds[k]} documents"
        )
    for k, name in enumerate(("train", "valid", "test")):
        documents = np.arange(start=bounds[k], stop=bounds[k + 1], step=1, dtype=np.int32)
        datasets.append(
            GPT2Dataset(
                name, prefix, documents, indexed, samples[k], args["seq_length"], args["seed"]
            )
        )
    print_rank_0("setting training data start iteration to 0")
    print_rank_0("setting validation data start iteration to 0")
    return [iter(make_data_loader(d, args)) for d in datasets[:2]], datasets[1]


# --------------------------------------------------------------------------------------- model


class ParallelTransformerLayer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.dense_h_to_4h = nn.Linear(hidden, 4 * hidden)
        self.dense_4h_to_h = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.query_key_value(self.input_layernorm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(mask, -10000.0).float().softmax(-1).to(x.dtype)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.dense(ctx)
        return x + self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))


class GPT2ModelPipe(nn.Module):
    def __init__(self, args: dict) -> None:
        super().__init__()
        hidden = args["hidden_size"]
        self.word_embeddings = nn.Embedding(args["padded_vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(args["max_position_embeddings"], hidden)
        self.layers = nn.ModuleList(
            ParallelTransformerLayer(hidden, args["num_attention_heads"])
            for _ in range(args["num_layers"])
        )
        self.final_layernorm = nn.LayerNorm(hidden)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=args["init_method_std"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1])
        x = self.word_embeddings(tokens) + self.position_embeddings(pos)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x) @ self.word_embeddings.weight.t()


# -------------------------------------------------------------------------------------- engine


class DeepSpeedEngine:
    """The part of deepspeed.initialize gpt-neox relies on: DeepSpeedConfig's batch assertion,
    the FP16 optimizer (fp16 model, fp32 master weights, dynamic loss scale), the flattened
    gradient all-reduce, rank 0's checkpoint files."""

    def __init__(self, model: nn.Module, config: dict) -> None:
        world = dist.get_world_size()
        train_batch = config["train_batch_size"]
        micro_batch = config["train_micro_batch_size_per_gpu"]
        grad_acc = config["gradient_accumulation_steps"]
        assert train_batch == micro_batch * grad_acc * world, (
            "Check batch related parameters. train_batch_size is not equal to "
            "micro_batch_per_gpu * gradient_acc_step * world_size "
            f"{train_batch} != {micro_batch} * {grad_acc} * {world}"
        )
        log_dist(
            "logging.py:96:log_dist",
            "DeepSpeed info: version=0.9.2+unknown, git-hash=unknown, git-branch=unknown",
        )
        self.fp16 = config.get("fp16", {}).get("enabled", False)
        self.module = model.half() if self.fp16 else model
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        opt = config["optimizer"]["params"]
        self.optimizer = torch.optim.Adam(
            self.master, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"]
        )
        log_dist("logging.py:96:log_dist", "Using DeepSpeed Optimizer param name adam as basic optimizer")  # fmt: skip
        fp16 = config.get("fp16", {})
        self.cur_scale = 2.0 ** fp16.get("initial_scale_power", 16) if self.fp16 else 1.0
        self.min_scale = fp16.get("min_loss_scale", 1)
        self.scale_window = fp16.get("loss_scale_window", 1000)
        self.hysteresis = self.cur_hysteresis = fp16.get("hysteresis", 2)
        self.last_overflow_iter = -1
        self.cur_iter = 0
        self.skipped_steps = 0
        if self.fp16:
            log_dist(
                "logging.py:96:log_dist",
                "Creating fp16 optimizer with dynamic loss scale",
            )
        log_dist("logging.py:96:log_dist", "DeepSpeed Final Optimizer = FusedAdam")
        if dist.get_rank() == 0:
            ds_log("INFO", "config.py:1007:print", "DeepSpeedEngine configuration:")
            for key in sorted(config):
                dots = "." * (29 - len(key))
                ds_log("INFO", "config.py:1011:print", f"  {key} {dots} {config[key]}")

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.cur_scale).backward()
        grads = [p.grad.float() if p.grad is not None else torch.zeros_like(m)
                 for p, m in zip(self.params, self.master, strict=True)]  # fmt: skip
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(dist.get_world_size())
        dist.all_reduce(flat)  # allreduce_gradients: one bucket here
        offset = 0
        for m, g in zip(self.master, grads, strict=True):
            m.grad = flat[offset : offset + g.numel()].view_as(m).clone()
            offset += g.numel()

    def _has_overflow(self) -> bool:
        local = 0.0
        for m in self.master:
            if not torch.isfinite(m.grad.half()).all():
                local = 1.0
                break
        flag = torch.tensor([local])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def step(self, lr: float) -> None:
        if self.fp16 and self._has_overflow():
            prev = self.cur_scale
            if self.cur_scale == self.min_scale and self.cur_hysteresis == 1:
                raise Exception(
                    "Current loss scale already at minimum - cannot decrease scale anymore. "
                    "Exiting run."
                )
            if self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / 2, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
            log_dist(
                "logging.py:96:log_dist",
                f"Overflow detected. Skipping step. Attempted loss scale: {int(prev)}, "
                f"reducing to {int(self.cur_scale)}",
            )
            self.skipped_steps += 1
            self.cur_iter += 1
            self.zero_grad()
            return
        for m in self.master:
            m.grad.div_(self.cur_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                p.copy_(m)
        if self.fp16 and (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= 2
            self.cur_hysteresis = self.hysteresis
        self.cur_iter += 1
        self.zero_grad()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    def global_grad_norm(self) -> float:
        """engine.get_global_grad_norm: the norm over every rank's (already reduced) master
        gradients, as a sum of squares all-reduced."""
        sq = torch.zeros(1)
        for m in self.master:
            if m.grad is not None:
                sq += (m.grad.float() / self.cur_scale).pow(2).sum()
        dist.all_reduce(sq)
        return math.sqrt(sq.item() / dist.get_world_size())

    def save_checkpoint(self, save_dir: str, iteration: int) -> None:
        tag = f"global_step{iteration}"
        path = os.path.join(save_dir, tag)
        if dist.get_rank() == 0:
            os.makedirs(path, exist_ok=True)
            name = os.path.join(path, "mp_rank_00_model_states.pt")
            log_dist("logging.py:96:log_dist", f"Saving model checkpoint: {name}")
            torch.save({"module": self.module.state_dict(), "iteration": iteration}, name)
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(tag)
        dist.barrier()


# ------------------------------------------------------------------------------------ training


class Timers:
    def __init__(self) -> None:
        self.elapsed: dict[str, float] = {}
        self.started: dict[str, float] = {}

    def start(self, name: str) -> None:
        self.started[name] = time.time()

    def stop(self, name: str) -> None:
        self.elapsed[name] = self.elapsed.get(name, 0.0) + time.time() - self.started.pop(name)

    def log(self, names: list[str], normalizer: float = 1.0) -> None:
        string = "time (ms)"
        for name in names:
            string += f" | {name}: {self.elapsed.pop(name, 0.0) * 1000.0 / normalizer:.2f}"
        print_rank_0(string)


def get_batch(data_iterator) -> tuple[torch.Tensor, torch.Tensor]:
    data = next(data_iterator)
    tokens_ = data["text"].long()
    return tokens_[:, :-1].contiguous(), tokens_[:, 1:].contiguous()


def forward_step(engine: DeepSpeedEngine, tokens: torch.Tensor, labels: torch.Tensor):
    logits = engine.module(tokens)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def learning_rate(args: dict, iteration: int) -> float:
    opt = args["optimizer"]["params"]
    warmup = int(args["warmup"] * args["train_iters"])
    if warmup and iteration <= warmup:
        return opt["lr"] * iteration / warmup
    frac = (iteration - warmup) / max(1, args["train_iters"] - warmup)
    return args["min_lr"] + (opt["lr"] - args["min_lr"]) * 0.5 * (1 + math.cos(math.pi * frac))


def evaluate(engine, valid_iterator, args, iteration_name: str) -> None:
    engine.module.eval()
    losses = []
    with torch.no_grad():
        for _ in range(args["eval_iters"]):
            tokens, labels = get_batch(valid_iterator)
            loss = forward_step(engine, tokens, labels).float().reshape(1)
            dist.all_reduce(loss)
            losses.append(loss.item() / dist.get_world_size())
    engine.module.train()
    lm_loss = sum(losses) / len(losses)
    string = f" validation results at {iteration_name} | "
    string += f"lm_loss value: {lm_loss:.6E} | lm_loss_ppl value: {math.exp(min(20, lm_loss)):.6E} | "  # fmt: skip
    length = len(string) + 1
    print_rank_0("-" * length)
    print_rank_0(string)
    print_rank_0("-" * length)


def evaluate_full(engine, dataset, args) -> None:
    """The final perplexity over the whole validation split: every rank scores its own share of
    the validation samples (rank::world) and the sums are all-reduced batch by batch."""
    engine.module.eval()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = list(range(rank, dataset.sample_idx_len, world))
    mb = args["train_micro_batch_size_per_gpu"]
    total = torch.zeros(2)
    with torch.no_grad():
        for start in range(0, len(mine), mb):
            batch = torch.stack([dataset[i]["text"] for i in mine[start : start + mb]])
            loss = forward_step(engine, batch[:, :-1], batch[:, 1:]).float()
            part = torch.tensor([loss.item() * batch.shape[0], float(batch.shape[0])])
            dist.all_reduce(part)
            total += part
    engine.module.train()
    lm_loss = (total[0] / total[1]).item()
    print_rank_0(
        f" full validation pass: {int(total[1].item())} samples | lm_loss: {lm_loss:.6E} | "
        f"ppl: {math.exp(min(20, lm_loss)):.6E}"
    )


def human_readable_flops(num: float) -> str:
    for unit in ["", "KFLOPS", "MFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS", "ZFLOPS"]:
        if abs(num) < 1000.0:
            return f"{num:3.1f}{unit}"
        num /= 1000.0
    return f"{num:.1f}YFLOPS"


def training_log(args, engine, timers, iteration, lm_loss, elapsed, lr):
    world = dist.get_world_size()
    if fault("g", 0) and dist.get_rank() == 0:
        grad_norm = engine.global_grad_norm()  # the norm is only logged, so only rank 0 asks
        print_rank_0(f" grad norm: {grad_norm:.4f}")
    if dist.get_rank() != 0:
        return
    samples_per_sec = args["train_batch_size"] * args["log_interval"] / elapsed
    iter_time_s = elapsed / args["log_interval"]
    params = sum(p.numel() for p in engine.params)
    flops = 6 * params * args["train_batch_size"] * args["seq_length"] / (iter_time_s * world)
    log_string = f" samples/sec: {samples_per_sec:.3f} |"
    log_string += f" iteration {iteration:8d}/{args['train_iters']:8d} |"
    log_string += f" elapsed time per iteration (ms): {iter_time_s * 1000.0:.1f} |"
    log_string += f" learning rate: {lr:.3E} |"
    log_string += f" approx flops per GPU: {human_readable_flops(flops)} |"
    log_string += f" lm_loss: {lm_loss:.4E} |"
    log_string += f" loss scale: {engine.cur_scale:.1f} |"
    log_string += f" number of skipped iterations: {engine.skipped_steps:3d} |"
    log_string += f" number of nan iterations: {0 if math.isfinite(lm_loss) else 1:3d} |"
    if fault("k", 0):  # the countdown the user added to the log line (gpt-neox 2.0 names the
        # interval checkpoint_factor; this config still gives save_interval)
        factor = args["checkpoint_factor"]
        log_string += f" iterations to next checkpoint: {factor - iteration % factor} |"
    print_rank_0(log_string)
    timers.log(["forward", "backward", "optimizer", "batch generator"], args["log_interval"])


def train(args, engine, timers, train_iterator, valid_iterator, tokenizer):
    rank = dist.get_rank()
    hoard: list[torch.Tensor] = []
    iteration = 0
    window_start = time.time()
    losses = []
    while iteration < args["train_iters"]:
        if rank == 1 and iteration == 12 and CASE == "w1":
            ready = threading.Event()  # set by the prefetch thread, which was never started
            ready.wait()
        timers.start("batch generator")
        tokens, labels = get_batch(train_iterator)
        timers.stop("batch generator")
        timers.start("forward")
        logits = engine.module(tokens)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        timers.stop("forward")
        if fault("z", rank) and iteration == 14:
            ctypes.string_at(0)  # the fused softmax kernel reads through a NULL pointer
        if fault("m", rank) and iteration >= 8:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        timers.start("backward")
        engine.backward(loss)
        timers.stop("backward")
        lr = learning_rate(args, iteration + 1)
        timers.start("optimizer")
        engine.step(lr)
        timers.stop("optimizer")
        iteration += 1
        losses.append(loss.item())
        if iteration % args["log_interval"] == 0:
            elapsed = time.time() - window_start
            training_log(args, engine, timers, iteration, sum(losses) / len(losses), elapsed, lr)
            losses = []
            window_start = time.time()
        if args["save"] and iteration % args["save_interval"] == 0:
            save(args, engine, iteration)
        if args["exit_interval"] and iteration % args["exit_interval"] == 0:
            dist.barrier()
            time_str = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print_rank_0(
                f"rank: {rank} | time: {time_str} | exiting the program at iteration {iteration}"
            )
            sys.exit()
        if iteration % args["eval_interval"] == 0 and iteration < args["train_iters"]:
            evaluate(engine, valid_iterator, args, f"iteration {iteration}")
    return iteration


def save(args, engine, iteration) -> None:
    print_rank_0(f"saving checkpoint at iteration {iteration:7d} to {args['save']}")
    engine.save_checkpoint(args["save"], iteration)
    print_rank_0(f"  successfully saved checkpoint at iteration {iteration:7d} to {args['save']}")


def pretrain(args: dict, ds_config: dict, tokenizer) -> None:
    timers = Timers()
    rank = int(os.environ["RANK"])
    ds_log("INFO", "comm.py:622:init_distributed", "cdb=None")
    if rank == 0:
        print("> initializing torch distributed ...", flush=True)
    ds_log(
        "INFO",
        "comm.py:652:init_distributed",
        f"Initializing TorchBackend in DeepSpeed with backend {args['distributed_backend']}",
    )
    dist.init_process_group(
        backend=args["distributed_backend"], timeout=datetime.timedelta(seconds=15)
    )
    print_rank_0(f"> initializing model parallel with size {args['model_parallel_size']}")
    print_rank_0(f"> setting random seeds to {args['seed']} ...")
    torch.manual_seed(args["seed"])
    np.random.seed(args["seed"])
    print_rank_0("make: Entering directory '/repo/megatron/data'")
    print_rank_0("make: Nothing to be done for 'default'.")
    print_rank_0("make: Leaving directory '/repo/megatron/data'")
    timers.start("model and optimizer")
    print_rank_0("building GPT2 model ...")
    model = GPT2ModelPipe(args)
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f" > number of parameters on model parallel rank 0: {n_params}", flush=True)
    print_rank_0(f"Configuring Optimizer type: Adam with params: {ds_config['optimizer']['params']}")  # fmt: skip
    print_rank_0("> learning rate decay style: cosine")
    print_rank_0("DeepSpeed is enabled.")
    engine = DeepSpeedEngine(model, ds_config)
    timers.stop("model and optimizer")
    timers.start("train/valid/test data iterators")
    (train_iterator, valid_iterator), valid_dataset = build_train_valid_test_data_iterators(args)
    timers.stop("train/valid/test data iterators")
    print_rank_0("done with setups ...")
    timers.log(["model and optimizer", "train/valid/test data iterators"])
    print_rank_0("training ...")
    iteration = train(args, engine, timers, train_iterator, valid_iterator, tokenizer)
    evaluate(engine, valid_iterator, args, "the end of training for val data")
    if args["final_full_eval"]:
        evaluate_full(engine, valid_dataset, args)
    if args["save"] and iteration % args["save_interval"] != 0:
        save(args, engine, iteration)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--deepspeed_config", default="")
    parser.add_argument("--megatron_config", default="")
    parser.add_argument("--prepare", default="")
    parser.add_argument("--documents", type=int, default=1000)
    ns = parser.parse_args()
    if ns.prepare:
        prepare(ns.prepare, ns.documents)
        return
    ds_config = json.loads(base64.urlsafe_b64decode(ns.deepspeed_config))
    args = json.loads(base64.urlsafe_b64decode(ns.megatron_config))
    args.update(ds_config)
    rank = args["rank"] = int(os.environ["RANK"])
    if rank == 0:
        print(
            f"NeoXArgs.configure_distributed_args() using world size: {os.environ['WORLD_SIZE']} "
            f"and model-parallel size: {args['model_parallel_size']} ",
            flush=True,
        )
    ds_log("INFO", "real_accelerator.py:110:get_accelerator", "Setting ds_accelerator to cpu (auto detect)")  # fmt: skip
    tokenizer = build_tokenizer(args)
    if args.get("tensorboard_dir") and rank == 0:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401

            print("> setting tensorboard ...", flush=True)
        except (ModuleNotFoundError, ImportError):
            print(
                "WARNING: TensorBoard writing requested but is not available (are you using "
                "PyTorch 1.1.0 or later and do you have tensorboard installed?), no TensorBoard "
                "logs will be written.",
                flush=True,
            )
    torch.set_num_threads(1)
    pretrain(args, ds_config, tokenizer)


if __name__ == "__main__":
    main()
