"""A hundred-and-fourteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfourteenth-*): a sentence-embedding model trained in the way of
sentence-transformers v3 training scripts (train_st.py started as `torchrun --nproc_per_node=2
train_st.py`): SentenceTransformer(model_name) over a plain encoder ("No sentence-transformers
model found ... Creating a new one with mean pooling"), SentenceTransformerTrainingArguments with
batch_sampler=BatchSamplers.NO_DUPLICATES, eval_strategy/save_strategy 'steps', logging_steps,
save_total_limit, ddp_find_unused_parameters=False and dataloader_drop_last, a
MultipleNegativesRankingLoss(gather_across_devices=True) (an all_gather of every rank's
embeddings inside the loss), and a SequentialEvaluator of an EmbeddingSimilarityEvaluator
(sts-dev) and an InformationRetrievalEvaluator (ir-dev) run by the main process, with the
Trainer's prints ('***** Running training *****', the log dicts, 'Saving model checkpoint to
...') and sentence-transformers' own logging records.

Re-created in plain torch (neither sentence-transformers, transformers nor datasets is
installed): a tiny word-level tokenizer and a one-layer transformer encoder with mean pooling,
gloo on CPU, a 15 s collective timeout (ddp_timeout). `python train_st.py --prepare data` writes
the model folder (models/tiny-encoder) and synthetic data: data/train.jsonl ((anchor, positive)
pairs, read lazily, each rank taking its contiguous share), data/sts-train.jsonl and
data/sts-dev.jsonl ((sentence1, sentence2, score)) and data/ir-dev.json. A fault in the code is
chosen by the TQ_CASE environment variable (a short code) and never printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CASE = os.environ.get("TQ_CASE", "")
WORDS = [
    "river",
    "mountain",
    "city",
    "garden",
    "music",
    "coffee",
    "winter",
    "summer",
    "train",
    "bridge",
    "doctor",
    "teacher",
    "market",
    "ocean",
    "forest",
    "window",
    "planet",
    "engine",
    "camera",
    "kitchen",
    "letter",
    "island",
    "castle",
    "storm",
    "language",
    "history",
    "science",
    "football",
    "guitar",
    "bicycle",
    "computer",
    "village",
    "harbour",
    "desert",
    "jungle",
    "painter",
    "library",
    "museum",
    "festival",
    "medicine",
    "airport",
]
VERBS = ["is", "has", "shows", "needs", "builds", "opens", "covers", "finds", "keeps", "makes"]

st_log = logging.getLogger("sentence_transformers.SentenceTransformer")
es_log = logging.getLogger("sentence_transformers.evaluation.EmbeddingSimilarityEvaluator")
ir_log = logging.getLogger("sentence_transformers.evaluation.InformationRetrievalEvaluator")
tr_log = logging.getLogger("transformers.trainer")  # own handler, message only (as transformers)


# ---------------------------------------------------------------- prepare
def sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    words.insert(1, rng.choice(VERBS))
    return " ".join(words)


def prepare(root: str, pairs: int, faq: int) -> None:
    rng = random.Random(114)
    os.makedirs(os.path.join(root, "..", "models", "tiny-encoder"), exist_ok=True)
    model_dir = os.path.join(root, "..", "models", "tiny-encoder")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *VERBS]
    with open(os.path.join(model_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    config = {
        "architectures": ["BertModel"],
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "vocab_size": len(vocab),
        "model_type": "bert",
    }
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    torch.manual_seed(0)
    torch.save(Encoder(config).state_dict(), os.path.join(model_dir, "pytorch_model.bin"))
    os.makedirs(root, exist_ok=True)
    seen: set[str] = set()
    rows = []
    while len(rows) < pairs:
        anchor = sentence(rng, 4)
        if anchor in seen:
            continue
        seen.add(anchor)
        words = anchor.split()
        positive = " ".join([*words[:1], rng.choice(VERBS), *words[2:], rng.choice(WORDS)])
        rows.append({"anchor": anchor, "positive": positive})
    # one long passage (about 90 words) as an answer in the second half of the file
    long_at = pairs * 3 // 4
    rows[long_at]["positive"] = " ".join(sentence(rng, 8) for _ in range(10))
    if faq:  # a FAQ question with `faq` paraphrased answers, grouped at the end of the file
        question = rows[-1]["anchor"]
        for k in range(faq - 1):
            rows[-2 - k] = {"anchor": question, "positive": sentence(rng, 5)}
    with open(os.path.join(root, "train.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for name, n in (("sts-train", 256), ("sts-dev", 96)):
        with open(os.path.join(root, f"{name}.jsonl"), "w") as f:
            for _ in range(n):
                a = sentence(rng, 4)
                keep = rng.randint(0, 4)
                b = " ".join(a.split()[:keep] + [rng.choice(WORDS) for _ in range(4 - keep)])
                f.write(json.dumps({"sentence1": a, "sentence2": b, "score": keep / 4}) + "\n")
    queries = {f"q{k}": rows[k * 7]["anchor"] for k in range(40)}
    corpus = {f"d{k}": rows[k]["positive"] for k in range(0, 280)}
    relevant = {f"q{k}": [f"d{k * 7}"] for k in range(40)}
    with open(os.path.join(root, "ir-dev.json"), "w") as f:
        json.dump({"queries": queries, "corpus": corpus, "relevant_docs": relevant}, f)
    print(f"wrote {pairs} training pairs, sts-train, sts-dev and ir-dev to {root}")


# ---------------------------------------------------------------- model
class Tokenizer:
    def __init__(self, path: str, max_seq_length: int) -> None:
        with open(os.path.join(path, "vocab.txt")) as f:
            self.vocab = {w: k for k, w in enumerate(f.read().split())}
        self.max_seq_length = max_seq_length

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if CASE == "s1" and dist.get_rank() == 1 and Tokenizer.calls == 3:
            ctypes.string_at(0)  # the fast tokenizer's native batch encoder reads address 0
        Tokenizer.calls += 1
        ids = [
            [2, *[self.vocab.get(w, 1) for w in t.split()][: self.max_seq_length - 2], 3]
            for t in texts
        ]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([x + [0] * (width - len(x)) for x in ids])
        return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}

    calls = 0


class Encoder(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        h = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], h, padding_idx=0)
        self.position_embeddings = nn.Embedding(config["max_position_embeddings"], h)
        layer = nn.TransformerEncoderLayer(
            h,
            config["num_attention_heads"],
            config["intermediate_size"],
            dropout=0.1,
            batch_first=True,
            norm_first=True,
        )
        self.layer = nn.TransformerEncoder(layer, config["num_hidden_layers"])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.layer(x, src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).float()  # mean pooling
        return (x * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class SentenceTransformer(nn.Module):
    def __init__(self, name: str, max_seq_length: int | None) -> None:
        super().__init__()
        st_log.info("Use pytorch device_name: cpu")
        st_log.info(f"Load pretrained SentenceTransformer: {name}")
        if not os.path.exists(os.path.join(name, "modules.json")):
            st_log.warning(
                f"No sentence-transformers model found with name {name}. Creating a new one "
                "with mean pooling."
            )
        with open(os.path.join(name, "config.json")) as f:
            self.config = json.load(f)
        self.encoder = Encoder(self.config)
        self.encoder.load_state_dict(torch.load(os.path.join(name, "pytorch_model.bin")))
        self.tokenizer = Tokenizer(name, max_seq_length or 64)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 32) -> torch.Tensor:
        self.eval()
        out = [
            self(**self.tokenizer(texts[k : k + batch_size]))
            for k in range(0, len(texts), batch_size)
        ]
        self.train()
        return F.normalize(torch.cat(out), dim=-1)

    def save(self, path: str, widget_texts: list[str]) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save(self.encoder.state_dict(), os.path.join(path, "pytorch_model.bin"))
        with open(os.path.join(path, "modules.json"), "w") as f:
            json.dump(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "Transformer"},
                    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "Pooling"},
                ],
                f,
            )
        bar = Bar(1, "Computing widget examples", unit="example/s", leave=True)
        for _ in range(300):  # the model card's widget: similarity of a few training examples
            self.encode(widget_texts * 128, 256)
        bar.update()
        bar.close()
        with open(os.path.join(path, "config_sentence_transformers.json"), "w") as f:
            json.dump(
                {
                    "__version__": {"sentence_transformers": "3.4.1", "pytorch": "2.13.0"},
                    "prompts": {},
                    "default_prompt_name": None,
                    "similarity_fn_name": "cosine",
                },
                f,
                indent=2,
            )
        with open(os.path.join(path, "README.md"), "w") as f:
            f.write("---\ntags:\n- sentence-transformers\n- generated_from_trainer\n---\n")


# ---------------------------------------------------------------- progress bar (tqdm-like)
class Bar:
    def __init__(self, total: int, desc: str = "", unit: str = "it/s", leave: bool = True):
        self.total, self.desc, self.unit, self.n, self.t0 = total, desc, unit, 0, time.time()
        self.show = True
        self._draw()

    def _draw(self) -> None:
        pct = int(100 * self.n / max(self.total, 1))
        fill = int(10 * self.n / max(self.total, 1))
        el = time.time() - self.t0
        rate = self.n / el if el > 0 and self.n else 0.0
        left = (self.total - self.n) / rate if rate else 0
        if not self.n:
            rate_s = f"?{self.unit}"
        elif self.unit == "s/it":
            rate_s = f"{1 / rate:5.2f}s/it"
        else:
            rate_s = f"{rate:5.2f}{self.unit}"
        prefix = f"{self.desc}: " if self.desc else ""
        sys.stderr.write(
            f"\r{prefix}{pct:3d}%|{'█' * fill}{' ' * (10 - fill)}| {self.n}/{self.total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{int(left) // 60:02d}:{int(left) % 60:02d}"
            f", {rate_s}]"
        )
        sys.stderr.flush()

    def update(self) -> None:
        self.n += 1
        self._draw()

    def write(self, text: str) -> None:
        sys.stderr.write("\r" + " " * 70 + "\r")
        print(text, flush=True)
        self._draw()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


# ---------------------------------------------------------------- data
class LazyJsonl:
    """Rows of a JSON-lines file decoded when asked for (an index of line offsets)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets = []
        with open(path, "rb") as f:
            pos = 0
            for line in f:
                self.offsets.append(pos)
                pos += len(line)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            return json.loads(f.readline())


class NoDuplicatesBatchSampler:
    """BatchSamplers.NO_DUPLICATES over this process's rows: no two rows of a batch share a
    text; a row that would is left for a later batch (and dropped with a partial batch when
    drop_last)."""

    def __init__(
        self, data: LazyJsonl, rows: range, batch_size: int, drop_last: bool, seed: int
    ) -> None:
        self.data, self.rows, self.batch_size, self.drop_last = data, rows, batch_size, drop_last
        self.seed, self.epoch = seed, 0

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = [self.rows[k] for k in torch.randperm(len(self.rows), generator=g).tolist()]
        remaining = dict.fromkeys(order)
        while remaining:
            batch, values = [], set()
            for index in remaining:
                row_values = {v for k, v in self.data[index].items() if k not in ("label", "score")}
                if row_values & values:
                    continue
                batch.append(index)
                if len(batch) == self.batch_size:
                    yield batch
                    break
                values |= row_values
            else:
                if not self.drop_last:
                    yield batch
            for index in batch:
                del remaining[index]

    def __len__(self) -> int:
        n = len(self.rows) // self.batch_size
        return n if self.drop_last else math.ceil(len(self.rows) / self.batch_size)


# ---------------------------------------------------------------- loss, evaluators
class MultipleNegativesRankingLoss(nn.Module):
    def __init__(self, model: nn.Module, scale: float = 20.0, gather_across_devices: bool = True):
        super().__init__()
        self.model, self.scale, self.gather = model, scale, gather_across_devices

    def forward(self, anchor: dict, positive: dict) -> torch.Tensor:
        a = self.model(**anchor)
        p = self.model(**positive)
        offset = 0
        if self.gather:  # every rank's candidates are negatives for every anchor
            everyone = dist_fn.all_gather(p)
            offset = sum(x.shape[0] for x in everyone[: dist.get_rank()])
            p = torch.cat(everyone)
        scores = F.normalize(a, dim=-1) @ F.normalize(p, dim=-1).T * self.scale
        labels = torch.arange(a.shape[0]) + offset
        return F.cross_entropy(scores, labels)


def ranks_of(x: torch.Tensor) -> torch.Tensor:
    r = torch.empty_like(x)
    r[x.argsort()] = torch.arange(len(x), dtype=x.dtype)
    return r


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()).clamp(min=1e-12))


class EmbeddingSimilarityEvaluator:
    def __init__(self, s1: list[str], s2: list[str], scores: list[float], name: str) -> None:
        self.s1, self.s2, self.scores, self.name = s1, s2, torch.tensor(scores), name

    def __call__(self, model: SentenceTransformer, epoch: float, steps: int) -> dict:
        es_log.info(
            f"EmbeddingSimilarityEvaluator: Evaluating the model on the {self.name} dataset in "
            f"epoch {epoch:.2f} after {steps} steps:"
        )
        cos = (model.encode(self.s1) * model.encode(self.s2)).sum(-1)
        pr, sr = pearson(cos, self.scores), pearson(ranks_of(cos), ranks_of(self.scores))
        es_log.info(f"Cosine-Similarity :\tPearson: {pr:.4f}\tSpearman: {sr:.4f}")
        return {f"{self.name}_pearson_cosine": pr, f"{self.name}_spearman_cosine": sr}


class InformationRetrievalEvaluator:
    def __init__(
        self, queries: dict, corpus: dict, relevant: dict, name: str, corpus_chunk_size: int = 50000
    ) -> None:
        self.queries, self.corpus, self.relevant, self.name = queries, corpus, relevant, name
        self.chunk = corpus_chunk_size

    def __call__(self, model: SentenceTransformer, epoch: float, steps: int) -> dict:
        ir_log.info(
            f"Information Retrieval Evaluation of the model on the {self.name} dataset in epoch "
            f"{epoch:.2f} after {steps} steps:"
        )
        qids, dids = list(self.queries), list(self.corpus)
        q = model.encode([self.queries[k] for k in qids])
        chunks = range(0, len(dids), self.chunk)
        bar = Bar(len(chunks), "Corpus Chunks", unit="s/it") if len(chunks) > 1 else None
        top: list[tuple[torch.Tensor, torch.Tensor]] = []
        for start in chunks:
            d = model.encode([self.corpus[k] for k in dids[start : start + self.chunk]], 256)
            time.sleep(len(d) / 10000)  # stands for a real encoder's time (10,000 passages/s)
            s = q @ d.T
            v, i = s.topk(min(10, s.shape[1]), dim=1)
            top.append((v, i + start))
            if bar:
                bar.update()
        if bar:
            bar.close()
        v = torch.cat([t[0] for t in top], 1)
        i = torch.cat([t[1] for t in top], 1)
        best = i.gather(1, v.topk(min(10, v.shape[1]), dim=1).indices)
        acc1 = mrr = ndcg = 0.0
        for row, qid in enumerate(qids):
            hits = [dids[j] in self.relevant[qid] for j in best[row].tolist()]
            acc1 += hits[0]
            first = next((k for k, h in enumerate(hits) if h), None)
            if first is not None:
                mrr += 1 / (first + 1)
                ndcg += 1 / math.log2(first + 2)
        n = len(qids)
        ir_log.info(f"Queries: {n}")
        ir_log.info(f"Corpus: {len(dids)}\n")
        ir_log.info("Score-Function: cosine")
        ir_log.info(f"Accuracy@1: {100 * acc1 / n:.2f}%")
        ir_log.info(f"MRR@10: {mrr / n:.4f}")
        ir_log.info(f"NDCG@10: {ndcg / n:.4f}")
        return {
            f"{self.name}_cosine_accuracy@1": acc1 / n,
            f"{self.name}_cosine_mrr@10": mrr / n,
            f"{self.name}_cosine_ndcg@10": ndcg / n,
        }


# ---------------------------------------------------------------- trainer
class KeepLatestCheckpointCallback:
    """The user's own disk saver: keep only the newest checkpoint folder."""

    def on_save(self, output_dir: str, global_step: int) -> None:
        # never leave the folder without a complete checkpoint: wait for this step's weights
        weights = os.path.join(output_dir, f"checkpoint-{global_step}", "pytorch_model.bin")
        while not os.path.exists(weights):
            time.sleep(0.05)
        folders = sorted(f for f in os.listdir(output_dir) if f.startswith("checkpoint-"))
        for old in folders[:-1]:
            shutil.rmtree(os.path.join(output_dir, old), ignore_errors=True)


def fmt(x: float) -> float:
    return float(f"{x:.4g}")


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    main = rank == 0
    model = SentenceTransformer(args.model_name, args.max_seq_length)
    ddp = DDP(model, find_unused_parameters=False)
    data = LazyJsonl(args.train_file)
    lo, hi = rank * len(data) // world, (rank + 1) * len(data) // world
    sampler = NoDuplicatesBatchSampler(
        data, range(lo, hi), args.per_device_train_batch_size, args.dataloader_drop_last, seed=12
    )
    with open(args.sts_dev) as f:
        sts = [json.loads(line) for line in f]
    with open(args.ir_dev) as f:
        ir = json.load(f)
    corpus = dict(ir["corpus"])
    rng = random.Random(7)
    for k in range(len(corpus), args.ir_corpus_size if main else 0):  # distractor passages
        corpus[f"x{k}"] = sentence(rng, 6)
    evaluators = [
        EmbeddingSimilarityEvaluator(
            [r["sentence1"] for r in sts],
            [r["sentence2"] for r in sts],
            [r["score"] for r in sts],
            "sts-dev",
        ),
        InformationRetrievalEvaluator(
            ir["queries"],
            corpus,
            ir["relevant_docs"],
            "ir-dev",
            corpus_chunk_size=args.corpus_chunk_size,
        ),
    ]
    loss_fn = MultipleNegativesRankingLoss(ddp, gather_across_devices=True)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.learning_rate)
    steps_per_epoch = len(sampler)
    total = steps_per_epoch * args.num_train_epochs
    warmup = int(total * args.warmup_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
        ),
    )
    callbacks = [KeepLatestCheckpointCallback()] if CASE == "k" else []
    n_params = sum(p.numel() for p in model.parameters())
    if main:
        tr_log.info("***** Running training *****")
        tr_log.info(f"  Num examples = {len(data):,}")
        tr_log.info(f"  Num Epochs = {args.num_train_epochs:,}")
        tr_log.info(f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}")
        tr_log.info(
            "  Total train batch size (w. parallel, distributed & accumulation) = "
            f"{args.per_device_train_batch_size * world:,}"
        )
        tr_log.info("  Gradient Accumulation steps = 1")
        tr_log.info(f"  Total optimization steps = {total:,}")
        tr_log.info(f"  Number of trainable parameters = {n_params:,}")
    bar = Bar(total) if main else None
    step, best, best_ckpt, patience, t0, logged_loss, n_logged = (
        0,
        None,
        None,
        0,
        time.time(),
        0.0,
        0,
    )
    total_loss = 0.0
    flos_warned = False
    hoard: list[torch.Tensor] = []
    stop = False
    for epoch in range(args.num_train_epochs):
        sampler.epoch = epoch
        for batch in sampler:
            if CASE == "p1" and rank == 1 and step == 3:
                ready = threading.Event()  # set by a prefetch thread that was never started
                ready.wait()
            rows = [data[i] for i in batch]
            anchor = model.tokenizer([r["anchor"] for r in rows])
            positive = model.tokenizer([r["positive"] for r in rows])
            loss = loss_fn(anchor, positive)
            if CASE == "m1" and rank == 1 and step >= 3:  # every step's embeddings kept
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            optimizer.zero_grad()
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0))
            optimizer.step()
            sched.step()
            step += 1
            total_loss += loss.item()
            logged_loss += loss.item()
            n_logged += 1
            if bar:
                bar.update()
            if main and not flos_warned:
                flos_warned = True
                tr_log.warning(
                    "Could not estimate the number of tokens of the input, "
                    "floating-point operations will not be computed"
                )
            ep = round(step / steps_per_epoch, 4)
            if step % args.logging_steps == 0:
                mean = torch.tensor([logged_loss / n_logged])
                dist.all_reduce(mean)  # the Trainer's _nested_gather of the loss, every rank
                logged_loss, n_logged = 0.0, 0
                if bar:
                    bar.write(
                        str(
                            {
                                "loss": fmt(mean.item() / world),
                                "grad_norm": fmt(grad_norm),
                                "learning_rate": float(f"{sched.get_last_lr()[0]:.3g}"),
                                "epoch": ep,
                            }
                        )
                    )
                if CASE == "g0" and main:  # the user's logging callback: in-batch accuracy
                    acc = torch.tensor([1.0])
                    dist.all_reduce(acc)
            if step % args.eval_steps == 0:
                metrics = None
                if main:
                    t_eval = time.time()
                    metrics = {}
                    for ev in evaluators:
                        metrics.update(ev(model, ep, step))
                    metrics["sequential_score"] = metrics["ir-dev_cosine_ndcg@10"]
                    out = {f"eval_{k}": fmt(v) for k, v in metrics.items()}
                    runtime = time.time() - t_eval
                    out.update(
                        {
                            "eval_runtime": round(runtime, 4),
                            "eval_samples_per_second": 0.0,
                            "eval_steps_per_second": 0.0,
                            "epoch": ep,
                        }
                    )
                    bar.write(str(out))
                if args.metric_for_best_model:
                    box = [metrics]
                    dist.broadcast_object_list(box, src=0)
                    score = box[0][args.metric_for_best_model.removeprefix("eval_")]
                    if best is None or score > best + args.early_stopping_threshold:
                        best, best_ckpt, patience = score, f"{args.output_dir}/checkpoint-{step}", 0
                    else:
                        patience += 1
                        stop = patience >= args.early_stopping_patience
            if step % args.save_steps == 0:
                ckpt = os.path.join(args.output_dir, f"checkpoint-{step}")
                if main:
                    tr_log.info(f"Saving model checkpoint to {ckpt}")
                    model.save(ckpt, [rows[0]["anchor"], rows[0]["positive"]])
                    torch.save(optimizer.state_dict(), os.path.join(ckpt, "optimizer.pt"))
                    torch.save(sched.state_dict(), os.path.join(ckpt, "scheduler.pt"))
                    folders = sorted(
                        (f for f in os.listdir(args.output_dir) if f.startswith("checkpoint-")),
                        key=lambda f: int(f.split("-")[1]),
                    )
                    for old in folders[: -args.save_total_limit]:
                        if os.path.join(args.output_dir, old) == best_ckpt:
                            continue
                        tr_log.info(
                            f"Deleting older checkpoint [{args.output_dir}/{old}] due to "
                            "args.save_total_limit"
                        )
                        shutil.rmtree(os.path.join(args.output_dir, old))
                os.makedirs(ckpt, exist_ok=True)
                torch.save(
                    {"python": random.getstate(), "cpu": torch.get_rng_state()},
                    os.path.join(ckpt, f"rng_state_{rank}.pth"),
                )
                for cb in callbacks:
                    cb.on_save(args.output_dir, step)
            if stop:
                break
        if stop:
            break
    if bar:
        bar.close()
    if main:
        tr_log.info(
            "\n\nTraining completed. Do not forget to share your model on "
            "huggingface.co/models =)\n\n"
        )
    if args.load_best_model_at_end and best_ckpt:
        dist.barrier()
        if main:
            tr_log.info(f"Loading best model from {best_ckpt} (score: {best:.4f}).")
            state = torch.load(os.path.join(best_ckpt, "pytorch_model.bin"))
            model.encoder.load_state_dict(state)
    if main:
        runtime = time.time() - t0
        print(
            str(
                {
                    "train_runtime": round(runtime, 4),
                    "train_samples_per_second": round(
                        step * args.per_device_train_batch_size * world / runtime, 3
                    ),
                    "train_steps_per_second": round(step / runtime, 3),
                    "train_loss": fmt(total_loss / max(step, 1)),
                    "epoch": round(step / steps_per_epoch, 4),
                }
            )
        )
        final = os.path.join(args.output_dir, "final")
        model.save(final, ["river is a city", "a city is a river"])
        st_log.info(f"Save model to {final}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prepare", default=None, help="write the model folder and data here")
    p.add_argument("--pairs", type=int, default=640)
    p.add_argument("--faq_answers", type=int, default=0)
    p.add_argument("--model_name", default="models/tiny-encoder")
    p.add_argument("--train_file", default="data/train.jsonl")
    p.add_argument("--sts_dev", default="data/sts-dev.jsonl")
    p.add_argument("--ir_dev", default="data/ir-dev.json")
    p.add_argument("--ir_corpus_size", type=int, default=0)
    p.add_argument("--corpus_chunk_size", type=int, default=50000)
    p.add_argument("--output_dir", default="output/tiny-encoder-nli")
    p.add_argument("--max_seq_length", type=int, default=None)
    p.add_argument("--num_train_epochs", type=int, default=1)
    p.add_argument("--per_device_train_batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=2e-4)
    p.add_argument("--warmup_ratio", type=float, default=0.1)
    p.add_argument("--eval_steps", type=int, default=5)
    p.add_argument("--save_steps", type=int, default=5)
    p.add_argument("--save_total_limit", type=int, default=2)
    p.add_argument("--logging_steps", type=int, default=2)
    p.add_argument("--dataloader_drop_last", type=lambda s: s.lower() == "true", default=True)
    p.add_argument("--load_best_model_at_end", action="store_true")
    p.add_argument("--metric_for_best_model", default=None)
    p.add_argument("--early_stopping_patience", type=int, default=1)
    p.add_argument("--early_stopping_threshold", type=float, default=0.0)
    args = p.parse_args()
    if args.prepare:
        prepare(args.prepare, args.pairs, args.faq_answers)
        return
    logging.basicConfig(level=logging.INFO)
    handler = logging.StreamHandler()  # transformers' own handler: the message alone
    tr_log.addHandler(handler)
    tr_log.propagate = False
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    if dist.get_rank() != 0:
        tr_log.setLevel(logging.WARNING)  # log_level_replica
    torch.manual_seed(42)
    train(args)


if __name__ == "__main__":
    main()
