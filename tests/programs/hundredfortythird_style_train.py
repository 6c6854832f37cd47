"""A hundred-and-forty-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortythird-*): late-interaction dense retrieval trained the way
stanford-futuredata/ColBERT (v2) trains it, re-created in plain torch without ColBERT or
transformers installed. Each run's folder links this file as train_colbert.py, the user's script
of ColBERT's README: `with Run().context(RunConfig(nranks=2, experiment=...)):` then
`Trainer(triples=..., queries=..., collection=..., config=ColBERTConfig(bsize=..., lr=...,
maxsteps=...)).train()`.

As there: the Trainer hands train() to ColBERT's Launcher, which starts one
torch.multiprocessing Process per rank (the 'spawn' start method; children named Process-1,
Process-2, ...), sets MASTER_ADDR=localhost, MASTER_PORT, WORLD_SIZE and RANK itself, and then
waits for every rank's return value on a multiprocessing Queue: a rank that dies never puts one,
and the parent waits for good (ColBERT's own TODO says so). The one departure: the port, which
ColBERT draws at random from 12355-13354, is the run's own (--port). distributed.init joins a
process group (gloo here, a 15 s timeout; ColBERT's joins only with CUDA). In each rank:
config.help() (the config as a JSON dict, rank 0 only), 'Using config.bsize = 4 (per process)
and config.accumsteps = 1', LazyBatcher (triples as JSON lines, Examples.tolist: every rank takes
the same stride of the file, as ColBERT's does), load_queries' '[Dec 07, 05:00:00] #> Loading the
queries from ... ...' and '#> Got N queries. All QIDs are unique.', load_collection's '#> Loading
collection...' and '0M ', HF's 'Some weights of HF_ColBERT were not initialized from the model
checkpoint at bert-base-uncased ...', '#> Loading segmented_maxsim_cpp extension ...' (CPU), the
model (a tiny 'BERT': embeddings, one encoder layer, ColBERT's linear; MaxSim scores) in DDP with
find_unused_parameters=True, AdamW, MixedPrecisionManager (torch.cuda.amp, off on CPU but for
its warnings). Rank 0 prints print_progress's '#>>>    12.34 11.9 \t\t|\t\t 0.44' and
print_message(batch_idx, train_loss) '[Dec 07, 05:00:00] 0 1.386...' each step, '#> Done with all
triples!' and '#> Saving a checkpoint to .../checkpoints/colbert ..'; the parent '#> Starting...',
'#> Joined...'. print() without flush= is block-buffered (stdout is a file): what a killed
process had not flushed is lost. With `--launcher torchrun` the script skips the Launcher and
calls train() in each process torchrun started (RANK, WORLD_SIZE from its environment).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortythird.sh after any edit).
`python train_colbert.py --generate DIR` writes the synthetic MS MARCO-like data set;
`--v1-dnn PATH` writes a ColBERT v1 checkpoint (numpy scalars among its arguments).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import random
import signal
import string
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

with suppress(RuntimeError):
    mp.set_start_method("spawn", force=True)

CASE = os.environ.get("MT_CASE", "")
VOCAB = 2048
LEAK: list[np.ndarray] = []


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ colbert.utils.utils
def print_message(*s: Any, condition: bool = True, pad: bool = False) -> str:
    text = " ".join([str(x) for x in s])
    msg = "[{}] {}".format(datetime.datetime.now().strftime("%b %d, %H:%M:%S"), text)
    if condition:
        msg = msg if not pad else f"\n{msg}\n"
        print(msg, flush=True)
    return msg


def timestamp(daydir: bool = False) -> str:
    fmt = f"%Y-%m{'/' if daydir else '-'}%d{'/' if daydir else '_'}%H.%M.%S"
    return datetime.datetime.now().strftime(fmt)


def torch_load_dnn(path: str) -> Any:
    return torch.load(path, map_location="cpu")


# ------------------------------------------------------------------ colbert.infra.config
RUN_SETTINGS: dict[str, Any] = {
    "overwrite": False,
    "root": os.path.join(os.getcwd(), "experiments"),
    "experiment": "default",
    "index_root": None,
    "name": timestamp(daydir=True),
    "rank": 0,
    "nranks": 1,
    "amp": True,
    "gpus": 0,
    "avoid_fork_if_possible": False,
}
COLBERT_SETTINGS: dict[str, Any] = {
    "query_token_id": "[unused0]",
    "doc_token_id": "[unused1]",
    "query_token": "[Q]",
    "doc_token": "[D]",
    "ncells": None,
    "centroid_score_threshold": None,
    "ndocs": None,
    "load_index_with_mmap": False,
    "index_path": None,
    "index_bsize": 64,
    "nbits": 1,
    "kmeans_niters": 4,
    "resume": False,
    "pool_factor": 1,
    "clustering_mode": "hierarchical",
    "protected_tokens": 0,
    "similarity": "cosine",
    "bsize": 32,
    "accumsteps": 1,
    "lr": 3e-06,
    "maxsteps": 500000,
    "save_every": None,
    "warmup": None,
    "warmup_bert": None,
    "relu": False,
    "nway": 2,
    "use_ib_negatives": False,
    "reranker": False,
    "distillation_alpha": 1.0,
    "ignore_scores": False,
    "model_name": None,
    "stop_loss": None,  # a fork's: stop once the loss averaged over every rank is below it
    "query_maxlen": 32,
    "attend_to_mask_tokens": False,
    "interaction": "colbert",
    "dim": 128,
    "doc_maxlen": 220,
    "mask_punctuation": True,
    "checkpoint": None,
    "triples": None,
    "collection": None,
    "queries": None,
    "index_name": None,
    **RUN_SETTINGS,
}


class BaseConfig:
    FIELDS: dict[str, Any] = {}

    def __init__(self, **kw: Any) -> None:
        self.assigned: set[str] = set()
        for k, v in self.FIELDS.items():
            setattr(self, k, v)
        for k, v in kw.items():
            if k not in self.FIELDS:
                raise Exception(f"Unrecognized key `{k}` for {type(self)}")
            if v is not None:
                setattr(self, k, v)
                self.assigned.add(k)

    def __getattr__(self, name: str) -> Any:  # the settings, set in __init__
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)

    @classmethod
    def from_existing(cls, *sources: BaseConfig | None) -> Any:
        kw: dict[str, Any] = {}
        for source in sources:
            if source is None:
                continue
            kw.update({k: getattr(source, k) for k in source.assigned if k in cls.FIELDS})
        return cls(**kw)

    def configure(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)
            self.assigned.add(k)

    def export(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.FIELDS}

    def help(self) -> None:
        print(json.dumps(self.export(), indent=4))

    @property
    def path_(self) -> str:
        script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
        return os.path.join(self.root, self.experiment, script, self.name)


class RunConfig(BaseConfig):
    FIELDS = RUN_SETTINGS


class ColBERTConfig(BaseConfig):
    FIELDS = COLBERT_SETTINGS

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str) -> ColBERTConfig | None:
        if checkpoint_path.endswith(".dnn"):
            dnn = torch_load_dnn(checkpoint_path)
            config = cls(**{k: v for k, v in dnn.get("arguments", {}).items() if k in cls.FIELDS})
            config.configure(checkpoint=checkpoint_path)
            return config
        meta = os.path.join(checkpoint_path, "artifact.metadata")
        if os.path.exists(meta):
            with open(meta) as f:
                args = json.load(f)
            return cls(**{k: v for k, v in args.items() if k in cls.FIELDS})
        return None  # can happen if checkpoint_path is something like 'bert-base-uncased'


# ------------------------------------------------------------------ colbert.infra.run
class Run:
    _instance: Run | None = None
    stack: list[BaseConfig]

    def __new__(cls) -> Run:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance.stack = [RunConfig(**RUN_SETTINGS)]
        return cls._instance

    @property
    def config(self) -> BaseConfig:
        return self.stack[-1]

    @contextmanager
    def context(self, runconfig: BaseConfig, inherit_config: bool = True) -> Iterator[None]:
        if inherit_config:
            runconfig = RunConfig.from_existing(self.config, runconfig)
        self.stack.append(runconfig)
        try:
            yield
        finally:
            self.stack.pop()

    def print(self, *args: Any) -> None:
        print_message("[" + str(self.config.rank) + "]", "\t\t", *args)

    def print_main(self, *args: Any) -> None:
        if self.config.rank == 0:
            self.print(*args)


# ------------------------------------------------------------------ colbert.utils.distributed
ALREADY_INITIALIZED = False


def distributed_init(rank: int) -> tuple[int, bool]:
    global ALREADY_INITIALIZED
    nranks = max(1, "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]))
    is_distributed = (nranks > 1) or ("WORLD_SIZE" in os.environ)
    if ALREADY_INITIALIZED:
        return nranks, is_distributed
    ALREADY_INITIALIZED = True
    if is_distributed:
        print(f"nranks = {nranks} \t num_gpus = {torch.cuda.device_count()} \t device=cpu")
        dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=15))
    return nranks, is_distributed


# ------------------------------------------------------------------ colbert.evaluation.loaders
def load_queries(queries_path: str) -> OrderedDict[int, str]:
    queries: OrderedDict[int, str] = OrderedDict()
    print_message("#> Loading the queries from", queries_path, "...")
    with open(queries_path) as f:
        for line in f:
            qid_, query, *_ = line.strip().split("\t")
            qid = int(qid_)
            assert qid not in queries, ("Query QID", qid, "is repeated!")
            queries[qid] = query
    print_message("#> Got", len(queries), "queries. All QIDs are unique.\n")
    return queries


def load_collection(collection_path: str) -> list[str]:
    print_message("#> Loading collection...")
    collection = []
    with open(collection_path) as f:
        for line_idx, line in enumerate(f):
            if line_idx % (1000 * 1000) == 0:
                print(f"{line_idx // 1000 // 1000}M", end=" ", flush=True)
            pid, passage, *rest = line.strip("\n\r ").split("\t")
            assert pid == "id" or int(pid) == line_idx, f"pid={pid}, line_idx={line_idx}"
            if len(rest) >= 1:
                passage = rest[0] + " | " + passage
            collection.append(passage)
    print()
    return collection


# ------------------------------------------------------------------ colbert.data
class Examples:
    def __init__(self, path: str, nway: int) -> None:
        self.path, self.nway = path, nway
        with open(path) as f:
            self.data = [json.loads(line)[: nway + 1] for line in f]

    def tolist(self, rank: int, nranks: int) -> list[list[int]]:
        assert rank in range(nranks), (rank, nranks)
        if fault("u", rank):  # a fork's fix: each rank its own stride of the file
            return [self.data[idx] for idx in range(rank, len(self.data), nranks)]
        return [self.data[idx] for idx in range(0, len(self.data), nranks)]


# ------------------------------------------------------------------ colbert.modeling.tokenization
def _word_ids(text: str) -> list[int]:
    words = text.lower().translate(str.maketrans("", "", string.punctuation)).split()
    return [1000 + zlib.crc32(w.encode()) % (VOCAB - 1000) for w in words]


class QueryTokenizer:
    def __init__(self, config: ColBERTConfig) -> None:
        self.query_maxlen = config.query_maxlen
        self.Q_marker_token_id, self.cls_token_id, self.mask_token_id = 1, 101, 103

    def tensorize(self, batch_text: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(batch_text), self.query_maxlen), self.mask_token_id)
        for i, text in enumerate(batch_text):
            toks = [self.cls_token_id, self.Q_marker_token_id, *_word_ids(text)]
            toks = toks[: self.query_maxlen]
            ids[i, : len(toks)] = torch.tensor(toks)
        mask = torch.ones_like(ids)  # the [MASK] augmentation attends everywhere
        return ids, mask


class DocTokenizer:
    def __init__(self, config: ColBERTConfig, rank: int) -> None:
        self.doc_maxlen, self.rank = config.doc_maxlen, rank
        self.D_marker_token_id, self.cls_token_id, self.sep_token_id = 2, 101, 102
        self._cache: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def _evict(self) -> None:
        with self._lock:  # a fork's cache: eviction under the cache's own (non-reentrant) lock
            self._cache.clear()

    def tensorize(self, batch_text: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        rows = []
        with self._lock:
            for text in batch_text:
                if text not in self._cache:
                    toks = [self.cls_token_id, self.D_marker_token_id, *_word_ids(text)]
                    self._cache[text] = [*toks[: self.doc_maxlen - 1], self.sep_token_id]
                rows.append(self._cache[text])
            if fault("h", self.rank) and self.calls == 13:
                self._evict()  # the lock is already held: waits for itself
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask


def _split_into_batches(
    ids: torch.Tensor, mask: torch.Tensor, bsize: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(ids[o : o + bsize], mask[o : o + bsize]) for o in range(0, ids.size(0), bsize)]


def tensorize_triples(
    query_tokenizer: QueryTokenizer,
    doc_tokenizer: DocTokenizer,
    queries: list[str],
    passages: list[str],
    scores: list[float],
    bsize: int,
    nway: int,
) -> list[Any]:
    Q_ids, Q_mask = query_tokenizer.tensorize(queries)
    D_ids, D_mask = doc_tokenizer.tensorize(passages)
    query_batches = _split_into_batches(Q_ids, Q_mask, bsize)
    doc_batches = _split_into_batches(D_ids, D_mask, bsize * nway)
    return [(Q, D, []) for Q, D in zip(query_batches, doc_batches, strict=True)]


# ------------------------------------------------------------------ colbert.training.lazy_batcher
class LazyBatcher:
    def __init__(
        self,
        config: ColBERTConfig,
        triples: str,
        queries: str,
        collection: str,
        rank: int = 0,
        nranks: int = 1,
    ) -> None:
        self.bsize, self.accumsteps, self.nway = config.bsize, config.accumsteps, config.nway
        self.query_tokenizer = QueryTokenizer(config)
        self.doc_tokenizer = DocTokenizer(config, rank)
        self.position = 0
        self.triples = Examples(triples, nway=self.nway).tolist(rank, nranks)
        self.queries = load_queries(queries)
        self.collection = load_collection(collection)
        assert len(self.triples) > 0, "Received no triples on which to train."
        assert len(self.queries) > 0, "Received no queries on which to train."
        assert len(self.collection) > 0, "Received no collection on which to train."

    def __iter__(self) -> LazyBatcher:
        return self

    def __len__(self) -> int:
        return len(self.triples)

    def __next__(self) -> list[Any]:
        offset, endpos = self.position, min(self.position + self.bsize, len(self.triples))
        self.position = endpos
        if offset + self.bsize > len(self.triples):
            raise StopIteration
        all_queries: list[str] = []
        all_passages: list[str] = []
        for position in range(offset, endpos):
            query, *pids = self.triples[position]
            all_queries.append(self.queries[query])
            all_passages.extend(self.collection[pid] for pid in pids[: self.nway])
        return self.collate(all_queries, all_passages, [])

    def collate(self, queries: list[str], passages: list[str], scores: list[float]) -> list[Any]:
        assert len(queries) == self.bsize
        assert len(passages) == self.nway * self.bsize
        return tensorize_triples(
            self.query_tokenizer,
            self.doc_tokenizer,
            queries,
            passages,
            scores,
            self.bsize // self.accumsteps,
            self.nway,
        )


# ------------------------------------------------------------------ colbert.modeling
class TinyBert(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, hidden)
        self.position = nn.Embedding(256, hidden)
        self.layer = nn.TransformerEncoderLayer(hidden, 2, 128, dropout=0.0, batch_first=True)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.size(1)).unsqueeze(0)
        x = self.embeddings(ids) + self.position(pos)
        out: torch.Tensor = self.layer(x, src_key_padding_mask=mask == 0)
        return out


class ColBERT(nn.Module):
    def __init__(self, name: str, colbert_config: ColBERTConfig, rank: int) -> None:
        super().__init__()
        self.colbert_config = ColBERTConfig.from_existing(
            ColBERTConfig.load_from_checkpoint(name), colbert_config
        )
        self.rank = rank
        torch.manual_seed(12345)
        self.bert = TinyBert()
        self.linear = nn.Linear(64, self.colbert_config.dim, bias=False)
        if not os.path.isdir(name):  # HF_ColBERT.from_pretrained on a plain BERT checkpoint
            sys.stderr.write(
                f"Some weights of HF_ColBERT were not initialized from the model checkpoint at "
                f"{name} and are newly initialized: ['linear.weight']\nYou should probably TRAIN "
                "this model on a down-stream task to be able to use it for predictions and "
                "inference.\n"
            )
        print_message(
            "Loading segmented_maxsim_cpp extension (set COLBERT_LOAD_TORCH_EXTENSION_VERBOSE="
            "True for more info)..."
        )
        self.steps = 0

    def query(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        Q = self.linear(self.bert(ids, mask))
        return torch.nn.functional.normalize(Q, p=2, dim=2)

    def doc(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        D = self.linear(self.bert(ids, mask)) * mask.unsqueeze(2).float()
        return torch.nn.functional.normalize(D, p=2, dim=2), mask

    def forward(self, Q: Any, D: Any) -> torch.Tensor:
        self.steps += 1
        Qe = self.query(*Q)
        De, D_mask = self.doc(*D)
        Q_duplicated = Qe.repeat_interleave(self.colbert_config.nway, dim=0).contiguous()
        if fault("z", self.rank) and self.steps == 12:
            ctypes.string_at(0)  # segmented_maxsim_cpp reads past the packed lengths
        return colbert_score(Q_duplicated, De, D_mask)

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        if fault("s", self.rank):  # the experiments root is a network mount under load
            time.sleep(25)
        torch.save(self.state_dict(), os.path.join(path, "pytorch_model.bin"))
        with open(os.path.join(path, "artifact.metadata"), "w") as f:
            f.write(json.dumps(self.colbert_config.export(), indent=4) + "\n")


def colbert_score(Q: torch.Tensor, D_padded: torch.Tensor, D_mask: torch.Tensor) -> torch.Tensor:
    assert Q.dim() == 3, Q.size()
    assert D_padded.dim() == 3, D_padded.size()
    assert Q.size(0) in [1, D_padded.size(0)]
    scores = D_padded @ Q.to(dtype=D_padded.dtype).permute(0, 2, 1)
    D_padding = ~D_mask.view(scores.size(0), scores.size(1)).bool()
    scores = scores.masked_fill(D_padding.unsqueeze(2), -9999)
    return scores.max(1).values.sum(-1)


# ------------------------------------------------------------------ colbert.utils.amp
class MixedPrecisionManager:
    def __init__(self, activated: bool) -> None:
        self.activated = activated
        if self.activated:
            self.scaler = torch.cuda.amp.GradScaler()

    def context(self) -> Any:
        return torch.cuda.amp.autocast() if self.activated else nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        if self.activated:
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def step(self, colbert: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.activated:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(colbert.parameters(), 2.0, error_if_nonfinite=False)
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            torch.nn.utils.clip_grad_norm_(colbert.parameters(), 2.0)
            optimizer.step()
        optimizer.zero_grad()


# ------------------------------------------------------------------ colbert.training
def print_progress(scores: torch.Tensor, batch_idx: int, rank: int) -> None:
    positive_avg = round(scores[:, 0].mean().item(), 2)
    negative_avg = round(scores[:, 1].mean().item(), 2)
    if batch_idx == 10 and fault("m", rank):
        # a fork's progress line with the mean over all ranks (called on rank 0 only)
        both = torch.tensor([positive_avg, negative_avg])
        dist.all_reduce(both)
        positive_avg, negative_avg = (round(v / dist.get_world_size(), 2) for v in both.tolist())
    if batch_idx == 10 and fault("p", rank):
        # a fork's progress line with the hardest pair's margin (per row: the .min() forgotten)
        margin = scores[:, 0] - scores[:, 1]
        print("#>>>    hardest margin", round(margin.item(), 2))
    print("#>>>   ", positive_avg, negative_avg, "\t\t|\t\t", positive_avg - negative_avg)


def manage_checkpoints(
    config: ColBERTConfig,
    colbert: nn.Module,
    batch_idx: int,
    consumed_all_triples: bool = False,
) -> str | None:
    checkpoints_path = os.path.join(config.path_, "checkpoints")
    module: Any = colbert.module
    save = module.save
    os.makedirs(checkpoints_path, exist_ok=True)
    path_save = None
    if consumed_all_triples or (batch_idx % 2000 == 0):
        path_save = os.path.join(checkpoints_path, "colbert")
    if config.save_every and batch_idx % config.save_every == 0:  # a fork's use of save_every
        path_save = os.path.join(checkpoints_path, f"colbert-{batch_idx}")
    if path_save:
        print(f"#> Saving a checkpoint to {path_save} ..")
        save(path_save)
    return path_save


def train(config: ColBERTConfig, triples: str, queries: str, collection: str) -> str | None:
    config.checkpoint = config.checkpoint or "bert-base-uncased"
    rank = config.rank
    if config.rank < 1:
        config.help()
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)

    assert config.bsize % config.nranks == 0, (config.bsize, config.nranks)
    config.bsize = config.bsize // config.nranks
    print(
        "Using config.bsize =",
        config.bsize,
        "(per process) and config.accumsteps =",
        config.accumsteps,
    )
    reader = LazyBatcher(config, triples, queries, collection, max(config.rank, 0), config.nranks)
    colbert: nn.Module = ColBERT(name=config.checkpoint, colbert_config=config, rank=rank)
    colbert.train()
    colbert = torch.nn.parallel.DistributedDataParallel(colbert, find_unused_parameters=True)
    optimizer = torch.optim.AdamW(
        filter(lambda p: p.requires_grad, colbert.parameters()), lr=config.lr, eps=1e-8
    )
    optimizer.zero_grad()
    amp = MixedPrecisionManager(config.amp)
    labels = torch.zeros(config.bsize, dtype=torch.long)
    train_loss = None
    train_loss_mu = 0.999
    batch_idx = 0
    stop_loss = config.stop_loss

    for batch_idx, BatchSteps in zip(range(0, config.maxsteps), reader, strict=False):
        this_batch_loss = 0.0
        for batch in BatchSteps:
            with amp.context():
                queries_, passages, _target_scores = batch
                scores = colbert(queries_, passages).view(-1, config.nway)
                loss = nn.CrossEntropyLoss()(scores, labels[: scores.size(0)])
                loss = loss / config.accumsteps
            if config.rank < 1:
                print_progress(scores, batch_idx, rank)
            if fault("k", rank) and batch_idx >= 8:  # a fork keeps each batch's passages
                LEAK.append(np.ones(16 << 20, dtype=np.float32))
                if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            amp.backward(loss)
            this_batch_loss += loss.item()

        train_loss = this_batch_loss if train_loss is None else train_loss
        train_loss = train_loss_mu * train_loss + (1 - train_loss_mu) * this_batch_loss
        amp.step(colbert, optimizer)

        if config.rank < 1:
            print_message(batch_idx, train_loss)
            manage_checkpoints(config, colbert, batch_idx + 1)

        if fault("x", rank) and batch_idx == 15:
            Run().print("#> Loss flat for 10 batches on this process, stopping early.")
            sys.exit(0)
        if stop_loss:  # a fork's early stop on the loss averaged over every rank
            mean = torch.tensor([this_batch_loss])
            dist.all_reduce(mean)
            mean /= config.nranks
            if mean.item() < stop_loss:
                if config.rank < 1:
                    print_message(
                        f"#> Early stopping at batch {batch_idx}: mean loss "
                        f"{mean.item():.4f} < {stop_loss}"
                    )
                break

    if config.rank < 1:
        print_message("#> Done with all triples!")
        ckpt_path = manage_checkpoints(config, colbert, batch_idx + 1, consumed_all_triples=True)
        return ckpt_path
    return None


# ------------------------------------------------------------------ colbert.infra.launcher
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_new_process(
    callee: Any, port: str, return_value_queue: Any, config: ColBERTConfig, *args: Any
) -> None:
    set_seed(12345)
    rank, nranks = config.rank, config.nranks
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    os.environ["WORLD_SIZE"] = str(config.nranks)
    os.environ["RANK"] = str(config.rank)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    nranks_, _distributed = distributed_init(rank)
    assert nranks_ == nranks
    with Run().context(config, inherit_config=False):
        return_val = callee(config, *args)
    return_value_queue.put((rank, return_val))


class Launcher:
    def __init__(self, callee: Any, port: int) -> None:
        self.callee = callee
        self.run_config = RunConfig.from_existing(Run().config)
        self.nranks = self.run_config.nranks
        self.port = port

    def launch(self, custom_config: ColBERTConfig, *args: Any) -> Any:
        return_value_queue: Any = mp.Queue()
        port = str(self.port)
        all_procs = []
        for new_rank in range(0, self.nranks):
            new_config = ColBERTConfig.from_existing(
                custom_config, self.run_config, RunConfig(rank=new_rank)
            )
            args_ = (self.callee, port, return_value_queue, new_config, *args)
            all_procs.append(mp.Process(target=setup_new_process, args=args_))
        for proc in all_procs:
            print("#> Starting...")
            proc.start()
        return_values = sorted([return_value_queue.get() for _ in all_procs])
        values = [val for rank, val in return_values]
        for proc in all_procs:
            proc.join()
            print("#> Joined...")
        return values[0]


class Trainer:
    def __init__(
        self, triples: str, queries: str, collection: str, config: ColBERTConfig, port: int
    ) -> None:
        self.config = ColBERTConfig.from_existing(config, Run().config)
        self.triples, self.queries, self.collection = triples, queries, collection
        self.port = port

    def train(self, checkpoint: str = "bert-base-uncased") -> Any:
        self.config.configure(
            triples=self.triples, queries=self.queries, collection=self.collection
        )
        self.config.configure(checkpoint=checkpoint)
        launcher = Launcher(train, self.port)
        self._best_checkpoint_path = launcher.launch(
            self.config, self.triples, self.queries, self.collection
        )
        return self._best_checkpoint_path


# ------------------------------------------------------------------ helpers of the capture
TEXT = (
    "what is the how to does a of in for cause treatment symptoms define meaning cost average "
    "salary population weather capital river mountain temperature history protein vitamin "
    "diet exercise heart blood pressure tax income loan mortgage credit bank insurance car "
    "engine oil battery solar energy wind power water plant soil rain climate ocean fish bird"
)
WORDS = TEXT.split()


def generate(folder: str, nqueries: int = 120, npassages: int = 300, ntriples: int = 400) -> None:
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(0)
    topics = [rng.sample(WORDS, 4) for _ in range(nqueries)]
    with open(os.path.join(folder, "queries.train.tsv"), "w") as f:
        for qid, t in enumerate(topics):
            f.write(f"{qid}\t{' '.join(t[:3])}?\n")
    with open(os.path.join(folder, "collection.tsv"), "w") as f:
        for pid in range(npassages):
            t = topics[pid % nqueries]
            words = t + rng.sample(WORDS, 10)
            rng.shuffle(words)
            f.write(f"{pid}\t{' '.join(words).capitalize()}.\n")
    with open(os.path.join(folder, "triples.train.small.jsonl"), "w") as f:
        for _ in range(ntriples):
            qid = rng.randrange(nqueries)
            pos = qid + nqueries * rng.randrange(npassages // nqueries)
            neg = rng.randrange(npassages)
            while neg % nqueries == qid:
                neg = rng.randrange(npassages)
            f.write(json.dumps([qid, pos, neg]) + "\n")


def write_v1_dnn(path: str) -> None:
    """A ColBERT v1 checkpoint (colbert.utils.utils.save_checkpoint): its `arguments` kept the
    numpy values of the v1 argument parser's defaults."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    arguments = {"lr": np.float64(3e-06), "maxsteps": np.int64(400000), "bsize": 32, "dim": 128}
    checkpoint = {
        "epoch": 0,
        "batch": 400000,
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": {},
        "arguments": arguments,
    }
    torch.save(checkpoint, path)


# ------------------------------------------------------------------ the user's script
def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2])
        return
    if sys.argv[1:2] == ["--v1-dnn"]:
        write_v1_dnn(sys.argv[2])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--experiment", default="msmarco")
    parser.add_argument("--triples", default="data/triples.train.small.jsonl")
    parser.add_argument("--queries", default="data/queries.train.tsv")
    parser.add_argument("--collection", default="data/collection.tsv")
    parser.add_argument("--checkpoint", default="bert-base-uncased")
    parser.add_argument("--bsize", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-06)
    parser.add_argument("--maxsteps", type=int, default=40)
    parser.add_argument("--save_every", type=int)
    parser.add_argument("--stop_loss", type=float)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--port", type=int, default=12355)
    parser.add_argument("--launcher", choices=["colbert", "torchrun"], default="colbert")
    args = parser.parse_args()

    config = ColBERTConfig(
        bsize=args.bsize,
        lr=args.lr,
        maxsteps=args.maxsteps,
        save_every=args.save_every,
        stop_loss=args.stop_loss,
        query_maxlen=16,
        doc_maxlen=48,
        dim=32,
    )
    if args.launcher == "torchrun":
        # one process per rank already (torchrun): no Launcher, train() in this process
        rank, nranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        run = RunConfig(nranks=nranks, rank=rank, experiment=args.experiment, amp=args.amp)
        with Run().context(run):
            config = ColBERTConfig.from_existing(config, Run().config)
            config.configure(
                triples=args.triples,
                queries=args.queries,
                collection=args.collection,
                checkpoint=args.checkpoint,
            )
            set_seed(12345)
            distributed_init(rank)
            checkpoint_path = train(config, args.triples, args.queries, args.collection)
            dist.destroy_process_group()
        if rank == 0:
            print(f"Saved checkpoint to {checkpoint_path}...")
        return

    # amp is a RunConfig setting: one given to ColBERTConfig is overridden by Run()'s default
    with Run().context(RunConfig(nranks=args.nranks, experiment=args.experiment, amp=args.amp)):
        trainer = Trainer(
            triples=args.triples,
            queries=args.queries,
            collection=args.collection,
            config=config,
            port=args.port,
        )
        checkpoint_path = trainer.train(checkpoint=args.checkpoint)
        print(f"Saved checkpoint to {checkpoint_path}...")


if __name__ == "__main__":
    main()
