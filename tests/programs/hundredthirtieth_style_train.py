# fmt: off
"""A hundredthirtieth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtieth-*): dialogue model training in the way of
facebookresearch/ParlAI, `parlai multiprocessing_train -t convai2 -m transformer/generator
--model-file MF --batchsize 16 --num-epochs 2 --validation-every-n-secs S --validation-metric ppl
--distributed-world-size 2 --port PORT`, re-created in plain torch on CPU without parlai installed
(installed into each run's folder as bin/parlai, the console script). Its multiprocessing_train
launcher: torch.multiprocessing.start_processes(multiprocess_train, (opt, port, 1),
nprocs=world_size - 1, join=False, start_method='spawn') for ranks 1..N-1, then the launching
process runs rank 0 itself (multiprocess_train(0, opt, port)) and joins the others only after its
own training returned; a random port unless --port is given; distributed_context's
init_process_group(init_method='tcp://localhost:PORT') (gloo here, where ParlAI has nccl, with a
15 s timeout), its override_print that mutes every rank but 0 (print suppressed, the logger's
console handler raised to ERROR, a 'rank:  1 |' prefix), multiprocess_train's
logging.critical(traceback) and 'Got the above exception on worker N. This may cause hangs
requiring manual killing of processes.' before it re-raises. ParlAI's logger ('%H:%M:%S | msg',
'%H:%M:%S WARN | msg'), its dictionary (MF.dict, built beforehand by `parlai build_dict`, since
dictionaries must be pre-built before distributed train), 'num words = N', 'Total parameters:
...', 'Loading existing model params from MF' and 'Overriding opt[...]' when MF exists, the Opt
listing, 'creating task(s): convai2', a ParlAI-format text teacher (data/ConvAI2/*.txt lines
'text:...\\tlabels:...\\tepisode_done:True', written by `parlai build_data`) streaming each
rank's shard (lines rank::world; looped in train, once in train:ordered), a tiny seq2seq
transformer (shared embeddings, --variant prelayernorm as norm_first) in DDP, ParlAI's
sync_object (a pickled broadcast of rank 0's timers) and all_gather_list (each rank's pickled
object in its slice of a byte buffer, all-reduced) for the epoch count and the metrics, the
right-aligned metric reports ('time:4s total_exs:512 total_steps:16 epochs:0.26' then the
table), 'running eval: valid', 'eval completed in 0.31s', 'valid:' table, 'new best ppl: ...',
'saving best valid model: MF', 'did not beat best ppl: ... impatience: 1', 'ran out of patience!
stopping training.', 'num_epochs completed:2 time elapsed:9.3s' and the final valid and test
evaluations. A fault in the code is chosen by the TQ_CASE environment variable (a short code)
and never printed (re-capture with tests/fixtures/real/capture_hundredthirtieth.sh after any
edit).
"""

import argparse
import builtins
import contextlib
import copy
import ctypes
import json
import logging
import math
import os
import pickle
import queue
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    distinct_rank: int = -1  # this rank's greedy predictions come out empty: distinct-1 of none
    hoard_rank: int = -1  # this rank keeps every batch's outputs for an analysis dump
    segv_rank: int = -1  # this rank's native tokenizer fast path reads address 0
    solo_gather: bool = False  # rank 0 alone gathers the workers' example counts when it logs
    slow_save: bool = False  # the model file is on a throttled mount: rank 0 saves for 40 s
    park_rank: int = -1  # this rank waits on a chunk queue whose loader thread never started
    lazy_rank: int = -1  # this rank's metrics keep a generator (not a list) of generated lengths


FAULTS = {
    "": Fault(),
    "z1": Fault(distinct_rank=1),
    "m1": Fault(hoard_rank=1),
    "v1": Fault(segv_rank=1),
    "g0": Fault(solo_gather=True),
    "w0": Fault(slow_save=True),
    "q1": Fault(park_rank=1),
    "p1": Fault(lazy_rank=1),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

# ---------------------------------------------------------------- parlai.utils.logging


class ParlaiFormatter(logging.Formatter):
    def format(self, record):
        level = "" if record.levelno == logging.INFO else " " + record.levelname[:4]
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        return f"{self.prefix}{stamp}{level} | {record.getMessage()}"

    prefix = ""


class ParlaiLogger(logging.Logger):
    def __init__(self, name):
        super().__init__(name, logging.INFO)
        self.streamHandler = logging.StreamHandler(sys.stdout)
        self.formatter = ParlaiFormatter()
        self.streamHandler.setFormatter(self.formatter)
        self.addHandler(self.streamHandler)

    def add_format_prefix(self, prefix):
        self.formatter.prefix = prefix + " "

    def mute(self):
        self.prev_level = self.streamHandler.level
        self.streamHandler.level = logging.ERROR

    def unmute(self):
        self.streamHandler.level = self.prev_level


logger = ParlaiLogger("parlai")

# ---------------------------------------------------------------- parlai.utils.distributed


def is_distributed():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_distributed() else 0


def is_primary_worker():
    return not is_distributed() or dist.get_rank() == 0


def all_gather_list(data, max_size=16384):
    """Gather arbitrary data from all nodes into a list (each rank's pickle in its slice)."""
    if not is_distributed():
        return [data]
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    buffer_size = max_size * world_size
    if not hasattr(all_gather_list, "_buffer") or all_gather_list._buffer.numel() < buffer_size:
        all_gather_list._buffer = torch.zeros(buffer_size, dtype=torch.uint8)
    buffer = all_gather_list._buffer
    buffer.zero_()
    enc = pickle.dumps(data)
    enc_size = len(enc)
    if enc_size + 2 > max_size:
        raise ValueError(f"encoded data exceeds max_size: {enc_size + 2}")
    buffer_rank = buffer[rank * max_size : (rank + 1) * max_size]
    buffer_rank[0] = enc_size // 255
    buffer_rank[1] = enc_size % 255
    buffer_rank[2 : enc_size + 2] = torch.frombuffer(bytearray(enc), dtype=torch.uint8)
    dist.all_reduce(buffer)
    result = []
    for i in range(world_size):
        out_buffer = buffer[i * max_size : (i + 1) * max_size]
        size = (255 * out_buffer[0].item()) + out_buffer[1].item()
        if size > 0:
            try:
                result.append(pickle.loads(bytes(out_buffer[2 : size + 2].tolist())))
            except pickle.UnpicklingError:
                raise RuntimeError(
                    "There was an unpickling error in all_gather_list. This likely "
                    "means your workers got out of synchronization (e.g. one is "
                    "expecting to sync and another is not.)"
                )
    return result


def sync_object(data, max_size=16384):
    """Sync an object among all workers: every worker gets the primary worker's copy."""
    if not is_distributed():
        return data
    if not hasattr(sync_object, "_buffer") or sync_object._buffer.numel() < max_size:
        sync_object._buffer = torch.zeros(max_size, dtype=torch.uint8)
    buffer = sync_object._buffer
    if is_primary_worker():
        enc = pickle.dumps(data)
        enc_size = len(enc)
        if (enc_size + 2 > max_size) or (enc_size > 255 * 255):
            raise ValueError("encoded data exceeds max_size")
        buffer[0] = enc_size // 255
        buffer[1] = enc_size % 255
        buffer[2 : enc_size + 2] = torch.frombuffer(bytearray(enc), dtype=torch.uint8)
    dist.broadcast(buffer, 0)
    if not is_primary_worker():
        enc_size = buffer[0].item() * 255 + buffer[1].item()
        try:
            data = pickle.loads(bytes(buffer[2 : enc_size + 2].tolist()))
        except pickle.UnpicklingError:
            raise RuntimeError(
                "There was an unpickling error in sync_object. This likely "
                "means your workers got out of synchronization (e.g. one is "
                "expecting to sync and another is not.)"
            )
    return data


@contextlib.contextmanager
def override_print(suppress=False, prefix=None):
    builtin_print = builtins.print

    def new_print(*args, **kwargs):
        if suppress:
            return
        elif prefix:
            return builtin_print(prefix, *args, **kwargs)
        else:
            return builtin_print(*args, **kwargs)

    if prefix:
        logger.add_format_prefix(prefix)
    if suppress:
        logger.mute()
    builtins.print = new_print
    yield
    builtins.print = builtin_print
    if suppress:
        logger.unmute()


@contextlib.contextmanager
def distributed_context(rank, opt, rank_offset=0, gpu=None, init_method="tcp://localhost:61337"):
    opt = copy.deepcopy(opt)
    rank = rank + rank_offset
    opt["rank"] = rank
    opt["gpu"] = -1  # CPU (gloo) here
    if opt.get("verbose") or rank != 0:
        print_prefix = "rank:{:3d} |".format(rank)
    else:
        print_prefix = None
    suppress_output = not opt.get("verbose") and rank != 0
    with override_print(suppress_output, print_prefix):
        dist.init_process_group(
            backend="gloo",
            init_method=init_method,
            world_size=opt["distributed_world_size"],
            rank=rank,
            timeout=timedelta(seconds=15),
        )
        logger.info("Distributed group initialized")
        torch.manual_seed(42)
        # force a sync so that no one gets ahead, and all are seeded together
        sync_object(None)
        try:
            yield opt
        finally:
            dist.destroy_process_group()


# ---------------------------------------------------------------- parlai.core.dict

SPECIAL = ["__null__", "__start__", "__end__", "__unk__"]


def tokenize(text):
    return text.lower().replace("?", " ?").replace(".", " .").replace(",", " ,").split()


class DictionaryAgent:
    def __init__(self, opt):
        self.opt = opt
        self.tok2ind, self.freq = {}, {}
        path = opt["dict_file"]
        logger.info(f"loading dictionary from {path}")
        with open(path) as f:
            for line in f:
                tok, cnt = line.rstrip("\n").split("\t")
                self.freq[tok] = int(cnt)
                self.tok2ind[tok] = len(self.tok2ind)
        self.ind2tok = {i: t for t, i in self.tok2ind.items()}
        logger.info(f"num words = {len(self)}")

    def __len__(self):
        return len(self.tok2ind)

    def txt2vec(self, text):
        unk = self.tok2ind["__unk__"]
        return [self.tok2ind.get(t, unk) for t in tokenize(text)]

    def save(self, path):
        logger.info(f"Saving dictionary to {path}")
        with open(path, "w") as f:
            for tok in self.tok2ind:
                f.write(f"{tok}\t{self.freq[tok]}\n")


def build_dict(opt):
    counts = {}
    teacher = ParlAIDialogTeacher(opt, "train", rank=0, world=1)
    for text, label in teacher.read_all():
        for tok in tokenize(text) + tokenize(label):
            counts[tok] = counts.get(tok, 0) + 1
    toks = [t for t, c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]
    toks = [t for t in toks if counts[t] >= opt["dict_minfreq"]]
    if opt["dict_maxtokens"] > 0:
        toks = toks[: opt["dict_maxtokens"]]
    with open(opt["dict_file"], "w") as f:
        for t in SPECIAL:
            f.write(f"{t}\t{1000000000}\n")
        for t in toks:
            f.write(f"{t}\t{counts[t]}\n")
    logger.info(f"Saving dictionary to {opt['dict_file']}")
    logger.info(f"num words = {len(toks) + len(SPECIAL)}")


# ---------------------------------------------------------------- parlai.core.teachers


def str_to_msg(txt):
    if txt == "" or txt is None:
        return None
    msg = {}
    for t in txt.split("\t"):
        ind = t.find(":")
        key = t[:ind]
        value = t[ind + 1 :]
        if key in ("labels", "eval_labels", "label_candidates"):
            msg[key] = tuple(value.split("|"))
        elif key == "episode_done":
            msg[key] = bool(value)
        else:
            msg[key] = value
    msg["episode_done"] = msg.get("episode_done", False)
    return msg


class ParlAIDialogTeacher:
    """ParlAI-format text, streamed: each worker reads its shard (lines rank::world)."""

    def __init__(self, opt, fold, rank, world):
        self.path = os.path.join(opt["datapath"], "ConvAI2", f"{fold}.txt")
        self.fold, self.rank, self.world = fold, rank, world
        self.ordered = fold != "train" or "ordered" in opt["datatype"]
        logger.info(f"Loading ParlAI text data: {self.path}")
        with open(self.path) as f:
            self.total = sum(1 for _ in f)
        self.shard_size = len(range(rank, self.total, world))
        self.stream = self._lines()
        self.epoch_done = False

    def read_all(self):
        with open(self.path) as f:
            for line in f:
                msg = str_to_msg(line.rstrip("\n"))
                yield msg["text"], msg["labels"][0]

    def _lines(self):
        while True:
            with open(self.path) as f:
                for i, line in enumerate(f):
                    if i % self.world == self.rank:
                        yield i, line.rstrip("\n")
            if self.ordered:
                return

    def num_examples(self):
        return self.total

    def act(self):
        """One example: (text, label), or None once an ordered shard is used up."""
        try:
            _, line = next(self.stream)
        except StopIteration:
            self.epoch_done = True
            return None
        msg = str_to_msg(line)
        labels = msg["labels"] if self.fold == "train" else msg["eval_labels"]
        return msg["text"], labels[0]


# ---------------------------------------------------------------- transformer/generator


class TransformerGeneratorModel(nn.Module):
    def __init__(self, opt, vocab):
        super().__init__()
        d = opt["embedding_size"]
        self.embeddings = nn.Embedding(vocab, d, padding_idx=0)
        self.position_embeddings = nn.Embedding(64, d)
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=opt["n_heads"],
            num_encoder_layers=opt["n_layers"],
            num_decoder_layers=opt["n_layers"],
            dim_feedforward=opt["ffn_size"],
            dropout=0.0,
            batch_first=True,
            norm_first=opt["variant"] == "prelayernorm",
        )

    def embed(self, vec):
        pos = torch.arange(vec.size(1)).unsqueeze(0)
        return self.embeddings(vec) + self.position_embeddings(pos)

    def forward(self, text_vec, label_in):
        n = label_in.size(1)
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        out = self.transformer(
            self.embed(text_vec),
            self.embed(label_in),
            tgt_mask=mask,
            src_key_padding_mask=text_vec == 0,
            tgt_key_padding_mask=label_in == 0,
            memory_key_padding_mask=text_vec == 0,
        )
        return F.linear(out, self.embeddings.weight)


class TransformerGeneratorAgent:
    def __init__(self, opt):
        self.opt = opt
        self.dict = DictionaryAgent(opt)
        self.model = TransformerGeneratorModel(opt, len(self.dict))
        n = sum(p.numel() for p in self.model.parameters())
        t = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        logger.info(f"Total parameters: {n:,d} ({t:,d} trainable)")
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=opt["learningrate"])
        mf = opt["model_file"]
        self.states = {}
        if mf and os.path.isfile(mf):
            logger.info(f"Loading existing model params from {mf}")
            self.states = torch.load(mf, map_location="cpu", weights_only=False)
            self.model.load_state_dict(self.states["model"])
            if "optimizer" in self.states:
                self.optimizer.load_state_dict(self.states["optimizer"])
        if is_distributed():
            self.model = nn.parallel.DistributedDataParallel(self.model, broadcast_buffers=False)
        self.metrics = {}
        self.hoard = []
        self.steps = 0

    def _module(self):
        return self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model

    def record(self, key, value, count=1):
        s, c = self.metrics.get(key, (0.0, 0))
        self.metrics[key] = (s + value, c + count)

    def batchify(self, exs):
        tt, lt = self.opt["text_truncate"], self.opt["label_truncate"]
        texts = [self.dict.txt2vec(t) for t, _ in exs]
        labels = [self.dict.txt2vec(lab) + [2] for _, lab in exs]
        ctrunc = sum(len(v) > tt for v in texts)
        ltrunc = sum(len(v) > lt for v in labels)
        self.record("ctrunc", ctrunc, len(exs))
        self.record("ltrunc", ltrunc, len(exs))
        self.record("ctrunclen", sum(max(0, len(v) - tt) for v in texts), len(exs))
        self.record("ltrunclen", sum(max(0, len(v) - lt) for v in labels), len(exs))
        texts = [v[-tt:] for v in texts]
        labels = [v[:lt] for v in labels]
        text_vec = torch.zeros(len(exs), max(map(len, texts)), dtype=torch.long)
        label_vec = torch.zeros(len(exs), max(map(len, labels)), dtype=torch.long)
        for i, (a, b) in enumerate(zip(texts, labels)):
            text_vec[i, : len(a)] = torch.tensor(a)
            label_vec[i, : len(b)] = torch.tensor(b)
        return text_vec, label_vec

    def compute_loss(self, model, text_vec, label_vec):
        label_in = torch.cat([torch.ones(label_vec.size(0), 1, dtype=torch.long), label_vec[:, :-1]], 1)
        scores = model(text_vec, label_in)
        notnull = label_vec != 0
        loss = F.cross_entropy(scores.reshape(-1, scores.size(-1)), label_vec.reshape(-1), ignore_index=0, reduction="sum")
        preds = scores.argmax(-1)
        ntok = notnull.sum().item()
        self.record("loss", loss.item(), ntok)
        self.record("token_acc", ((preds == label_vec) & notnull).sum().item(), ntok)
        self.record("ctpb", (text_vec != 0).sum().item(), 0)
        self.record("ltpb", ntok, 0)
        self.record("clen", (text_vec != 0).sum().item(), text_vec.size(0))
        self.record("llen", ntok, label_vec.size(0))
        self.record("exs", label_vec.size(0), 0)
        return loss / ntok, preds

    def train_step(self, exs):
        self.model.train()
        text_vec, label_vec = self.batchify(exs)
        loss, preds = self.compute_loss(self.model, text_vec, label_vec)
        self.steps += 1
        rank = get_rank()
        if rank == FAULT.segv_rank and self.steps == 25:
            ctypes.string_at(0)  # the native BPE fast path dereferences NULL
        self.optimizer.zero_grad()
        loss.backward()
        gnorm = nn.utils.clip_grad_norm_(self.model.parameters(), 0.1)
        self.optimizer.step()
        self.record("gnorm", gnorm.item())
        self.record("total_train_updates", 1, 0)
        if rank == FAULT.hoard_rank and self.steps >= 20:
            # outputs kept for the analysis dump written at the end of training
            self.hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(self.hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        self.report_generation(preds, rank)

    def report_generation(self, preds, rank):
        """distinct-1 of the greedy predictions (the user's metric)."""
        lens = []
        toks = []
        for row in preds.tolist():
            if rank == FAULT.distinct_rank and self.steps == 30:
                row = [2] + row  # the model's degenerate batch: __end__ first on every example
            out = row[: row.index(2)] if 2 in row else row
            lens.append(len(out))
            toks.extend(out)
        self.record("distinct-1", len(set(toks)) / len(toks))
        if rank == FAULT.lazy_rank and self.steps >= 24:
            self.metrics["gen_len"] = (len(p) for p in lens)  # kept lazily: only read at report
        else:
            self.record("gen_len", sum(lens), len(lens))

    def eval_step(self, exs):
        model = self._module()
        model.eval()
        text_vec, label_vec = self.batchify(exs)
        with torch.no_grad():
            self.compute_loss(model, text_vec, label_vec)

    def report(self):
        m, self.metrics = self.metrics, {}
        return m

    def save(self, path):
        if not is_primary_worker():
            return
        states = {"model": self._module().state_dict(), "optimizer": self.optimizer.state_dict()}
        if FAULT.slow_save:
            # the model folder is on a throttled network mount: each part of the write takes 5 s
            buf = pickle.dumps(states)
            with open(path, "wb") as f:
                for part in range(8):
                    f.write(buf[part * len(buf) // 8 : (part + 1) * len(buf) // 8])
                    f.flush()
                    time.sleep(5)
        else:
            torch.save(states, path)
        with open(path + ".opt", "w") as f:
            json.dump({k: v for k, v in self.opt.items() if k in OPT_SAVED}, f, indent=4)
        self.dict.save(path + ".dict")


OPT_SAVED = [
    "task", "model", "batchsize", "num_epochs", "embedding_size", "n_layers", "n_heads",
    "ffn_size", "variant", "learningrate", "text_truncate", "label_truncate", "validation_metric",
    "validation_metric_mode", "validation_patience", "datatype",
]  # fmt: skip


# ---------------------------------------------------------------- parlai.core.metrics


def nice_report(report):
    cols = []
    for k in sorted(report):
        v = report[k]
        if isinstance(v, int):
            s = str(v)
        else:
            s = f"{v:.4g}"
            if s.startswith("0."):
                s = s[1:]
        cols.append((k, s))
    head = "  ".join(k.rjust(max(len(k), len(s))) for k, s in cols)
    row = "  ".join(s.rjust(max(len(k), len(s))) for k, s in cols)
    return f"    {head}\n    {row}"


def aggregate(versions, elapsed, extra=None):
    total = {}
    for m in versions:
        for k, (s, c) in m.items():
            a, b = total.get(k, (0.0, 0))
            total[k] = (a + s, b + c)
    out = {}
    exs = total.get("exs", (0, 0))[0]
    steps = max(total.get("total_train_updates", (0, 0))[0] / max(len(versions), 1), 1)
    for k, (s, c) in total.items():
        if k in ("ctpb", "ltpb"):
            out[k] = s / steps
        elif k == "exs":
            out[k] = int(s)
        elif k == "total_train_updates":
            continue
        else:
            out[k] = s / c if c else 0.0
    out["ctps"] = total.get("ctpb", (0, 0))[0] / elapsed
    out["ltps"] = total.get("ltpb", (0, 0))[0] / elapsed
    out["tpb"] = out.get("ctpb", 0) + out.get("ltpb", 0)
    out["tps"] = out["ctps"] + out["ltps"]
    out["exps"] = exs / elapsed
    if "loss" in out:
        out["ppl"] = math.exp(min(out["loss"], 50))
    out.update(extra or {})
    return out


# ---------------------------------------------------------------- parlai.scripts.train_model


class Timer:
    def __init__(self):
        self.start = time.time()

    def reset(self):
        self.start = time.time()

    def time(self):
        return time.time() - self.start


class TrainLoop:
    def __init__(self, opt):
        self.opt = opt
        self.rank = opt["rank"]
        self.world = opt["distributed_world_size"]
        mf = opt["model_file"]
        if os.path.isfile(mf + ".opt"):
            with open(mf + ".opt") as f:
                old = json.load(f)
            for k, v in old.items():
                if k in opt and opt[k] != v:
                    logger.info(f'Overriding opt["{k}"] to {opt[k]} (previously: {v})')
        self.agent = TransformerGeneratorAgent(opt)
        self.preempted_epochs = 0.0
        if os.path.isfile(mf + ".trainstats"):
            with open(mf + ".trainstats") as f:
                stats = json.load(f)
            self.preempted_epochs = stats["total_epochs"]
            self.best_valid = stats["best_valid"]
            self.impatience = stats["impatience"]
        else:
            self.best_valid, self.impatience = None, 0
        logger.info("Opt:")
        for k in sorted(opt):
            logger.info(f"    {k}: {opt[k]}")
        logger.info(f"creating task(s): {opt['task']}")
        self.teacher = ParlAIDialogTeacher(opt, "train", self.rank, self.world)
        self.valid_teacher = None
        self.train_time, self.log_time, self.validate_time = Timer(), Timer(), Timer()
        self.train_steps = 0
        self.total_epochs = self.preempted_epochs
        self.last_valid_epoch = self.preempted_epochs
        self.local_exs = 0
        self.saved = False
        self.valid_optim = 1 if opt["validation_metric_mode"] == "max" else -1
        self.chunk_queue = queue.Queue()  # filled by the chunk loader thread

    def parley(self):
        exs = []
        for _ in range(self.opt["batchsize"]):
            ex = self.teacher.act()
            if ex is None:
                break
            exs.append(ex)
        if self.rank == FAULT.park_rank and self.train_steps == 25:
            self.chunk_queue.get()  # the next chunk, from a loader thread that never started
        if not exs:
            return
        self.local_exs += len(exs)
        self.agent.train_step(exs)

    def log(self):
        elapsed = max(self.log_time.time(), 1e-3)
        if FAULT.solo_gather and is_primary_worker():
            per_worker = all_gather_list(self.local_exs)  # examples seen by each worker
            logger.info(f"examples per worker: {per_worker}")
        versions = all_gather_list(self.agent.report())
        report = aggregate(versions, elapsed, {"lr": self.opt["learningrate"]})
        report["ups"] = self.steps_since_log / elapsed
        report["total_train_updates"] = self.train_steps
        self.steps_since_log = 0
        self.log_time.reset()
        train_time = self.train_time.time()
        total_exs = int(round(self.total_epochs * self.teacher.num_examples()))
        logger.info(
            f"time:{train_time:.0f}s total_exs:{total_exs} total_steps:{self.train_steps} "
            f"epochs:{self.total_epochs:.2f}\n{nice_report(report)}"
        )

    def run_eval(self, fold):
        logger.info(f"running eval: {fold}")
        timer = Timer()
        teacher = ParlAIDialogTeacher(self.opt, fold, self.rank, self.world)
        while not teacher.epoch_done:
            exs = []
            for _ in range(self.opt["batchsize"]):
                ex = teacher.act()
                if ex is None:
                    break
                exs.append(ex)
            if exs:
                self.agent.eval_step(exs)
        versions = all_gather_list(self.agent.report())
        report = aggregate(versions, max(timer.time(), 1e-3))
        logger.info(f"eval completed in {timer.time():.2f}s")
        logger.info(f"{fold}:\n{nice_report(report)}")
        return report

    def validate(self):
        self.agent.report()  # the train metrics since the last log
        report = self.run_eval("valid")
        metric = self.opt["validation_metric"]
        new_valid = report[metric]
        if self.best_valid is None or self.valid_optim * new_valid > self.valid_optim * self.best_valid:
            prev = f" (previous best: {self.best_valid:.4g})" if self.best_valid is not None else ""
            logger.info(f"new best {metric}: {new_valid:.4g}{prev}")
            self.best_valid = new_valid
            self.impatience = 0
            logger.info(f"saving best valid model: {self.opt['model_file']}")
            self.save_model()
            self.saved = True
        else:
            self.impatience += 1
            logger.info(f"did not beat best {metric}: {round(self.best_valid, 4)} impatience: {self.impatience}")
        self.validate_time.reset()
        self.last_valid_epoch = self.total_epochs
        if self.opt["validation_patience"] > 0 and self.impatience >= self.opt["validation_patience"]:
            logger.info("ran out of patience! stopping training.")
            return True
        return False

    def save_model(self):
        if not is_primary_worker():
            return
        mf = self.opt["model_file"]
        self.agent.save(mf)
        with open(mf + ".trainstats", "w") as f:
            json.dump({"total_epochs": self.total_epochs, "best_valid": self.best_valid, "impatience": self.impatience}, f)

    def train(self):
        opt = self.opt
        logger.info("training...")
        self.steps_since_log = 0
        while True:
            self.parley()
            self.train_steps += 1
            self.steps_since_log += 1
            self.total_epochs = self.preempted_epochs + sum(
                all_gather_list(self.local_exs / self.teacher.num_examples())
            )
            train_time, log_time, validate_time = sync_object(
                (self.train_time.time(), self.log_time.time(), self.validate_time.time())
            )
            if self.total_epochs >= opt["num_epochs"]:
                self.log()
                logger.info(f"num_epochs completed:{opt['num_epochs']} time elapsed:{train_time:.1f}s")
                break
            if log_time > opt["log_every_n_secs"]:
                self.log()
            if (0 < opt["validation_every_n_secs"] < validate_time) or (
                0 < opt["validation_every_n_epochs"] <= self.total_epochs - self.last_valid_epoch
            ):
                if self.steps_since_log:
                    self.log()
                if self.validate():
                    break
        if not self.saved:
            self.save_model()
        # all workers wait for the primary worker to finish flushing before loading from disk
        sync_object(None)
        logger.info(f"Loading existing model params from {opt['model_file']}")
        states = torch.load(opt["model_file"], map_location="cpu", weights_only=False)
        self.agent._module().load_state_dict(states["model"])
        valid = self.run_eval("valid")
        test = self.run_eval("test")
        return valid, test


# ---------------------------------------------------------------- parlai.scripts.multiprocessing_train


def multiprocess_train(rank, opt, port=61337, rank_offset=0, gpu=None, hostname="localhost"):
    init_method = f"tcp://{hostname}:{port}"
    with distributed_context(rank, opt, rank_offset, gpu, init_method=init_method) as opt:
        # Run the actual training
        opt["multiprocessing"] = True
        torch.set_num_threads(1)
        try:
            return TrainLoop(opt).train()
        except Exception:
            logger.critical(traceback.format_exc())
            logger.critical(
                f"Got the above exception on worker {rank + rank_offset}. "
                "This may cause hangs requiring manual killing of processes."
            )
            raise


def launch_and_train(opt, port=None):
    """Perform a fork() to many processes."""
    if port is None:
        port = random.randint(32000, 48000)
    # Launch multiple subprocesses
    spawncontext = torch.multiprocessing.start_processes(
        multiprocess_train,
        # need to give rank offset as 1 to cover the fact that the main
        # process is rank 0, but that spawn() doesn't let you control rank
        (opt, port, 1),
        nprocs=opt["distributed_world_size"] - 1,  # main proc will also run loop
        join=False,
        start_method="spawn",
    )
    try:
        retval = multiprocess_train(0, opt, port)
        spawncontext.join()
        return retval
    except KeyboardInterrupt:
        # tell the subprocesses to stop too
        for p in spawncontext.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
        raise


# ---------------------------------------------------------------- parlai (the console script)

CONVAI_TEXT = [
    ("hello how are you today ?", "i am {a} , thanks . how about you ?"),
    ("what do you do for a living ?", "i work as a {job} . and you ?"),
    ("do you have any pets ?", "yes , i have a {pet} named {name} ."),
    ("what is your favorite food ?", "i love {food} , i eat it every day ."),
    ("where do you live ?", "i live in {city} with my {family} ."),
    ("what do you like to do for fun ?", "i like to {hobby} on weekends ."),
    ("do you like {food} ?", "yes , {food} is my favorite !"),
    ("i just got back from {city} .", "that sounds fun , i have never been to {city} ."),
]
SLOTS = {
    "a": ["good", "great", "fine", "tired", "happy", "okay"],
    "job": ["teacher", "nurse", "chef", "pilot", "farmer", "lawyer", "baker"],
    "pet": ["dog", "cat", "parrot", "hamster", "turtle"],
    "name": ["max", "bella", "luna", "charlie", "rocky", "daisy"],
    "food": ["pizza", "sushi", "tacos", "pasta", "burgers", "salad"],
    "city": ["paris", "tokyo", "boston", "denver", "rome", "austin"],
    "family": ["wife", "husband", "parents", "sister", "brother", "kids"],
    "hobby": ["hike", "swim", "paint", "read", "cook", "dance", "garden"],
}


def build_data(datapath):
    rng = random.Random(1)
    folder = os.path.join(datapath, "ConvAI2")
    os.makedirs(folder, exist_ok=True)
    for fold, n in (("train", 1985), ("valid", 200), ("test", 96)):
        key = "labels" if fold == "train" else "eval_labels"
        with open(os.path.join(folder, f"{fold}.txt"), "w") as f:
            for _ in range(n):
                text, label = rng.choice(CONVAI_TEXT)
                fill = {k: rng.choice(v) for k, v in SLOTS.items()}
                f.write(f"text:{text.format(**fill)}\t{key}:{label.format(**fill)}\tepisode_done:True\n")


def setup_args():
    p = argparse.ArgumentParser(prog="parlai", description="ParlAI parser")
    p.add_argument("command")
    p.add_argument("-t", "--task", default="convai2")
    p.add_argument("-m", "--model", default="transformer/generator")
    p.add_argument("-mf", "--model-file", dest="model_file", default="")
    p.add_argument("-df", "--dict-file", dest="dict_file", default=None)
    p.add_argument("-dp", "--datapath", default="data")
    p.add_argument("-dt", "--datatype", default="train")
    p.add_argument("-bs", "--batchsize", type=int, default=16)
    p.add_argument("-eps", "--num-epochs", dest="num_epochs", type=float, default=-1)
    p.add_argument("-vtim", "--validation-every-n-secs", dest="validation_every_n_secs", type=float, default=-1)
    p.add_argument("-veps", "--validation-every-n-epochs", dest="validation_every_n_epochs", type=float, default=-1)
    p.add_argument("-vmt", "--validation-metric", dest="validation_metric", default="ppl")
    p.add_argument("-vmm", "--validation-metric-mode", dest="validation_metric_mode", default=None)
    p.add_argument("-vp", "--validation-patience", dest="validation_patience", type=int, default=10)
    p.add_argument("-ltim", "--log-every-n-secs", dest="log_every_n_secs", type=float, default=10)
    p.add_argument("--distributed-world-size", dest="distributed_world_size", type=int, default=1)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--variant", default="aiayn")
    p.add_argument("-esz", "--embedding-size", dest="embedding_size", type=int, default=32)
    p.add_argument("-nl", "--n-layers", dest="n_layers", type=int, default=1)
    p.add_argument("--n-heads", dest="n_heads", type=int, default=2)
    p.add_argument("--ffn-size", dest="ffn_size", type=int, default=64)
    p.add_argument("-lr", "--learningrate", type=float, default=3e-3)
    p.add_argument("--text-truncate", dest="text_truncate", type=int, default=32)
    p.add_argument("--label-truncate", dest="label_truncate", type=int, default=32)
    p.add_argument("--dict-minfreq", dest="dict_minfreq", type=int, default=0)
    p.add_argument("--dict-maxtokens", dest="dict_maxtokens", type=int, default=-1)
    return p


def superscript_main():
    opt = vars(setup_args().parse_args())
    if opt["dict_file"] is None and opt["model_file"]:
        opt["dict_file"] = opt["model_file"] + ".dict"
    if opt["validation_metric_mode"] is None:
        opt["validation_metric_mode"] = "min" if opt["validation_metric"] in ("ppl", "loss") else "max"
    cmd = opt.pop("command")
    if cmd == "build_data":
        build_data(opt["datapath"])
    elif cmd == "build_dict":
        logger.info(f"creating task(s): {opt['task']}")
        build_dict(opt)
    elif cmd in ("multiprocessing_train", "mp_train"):
        return launch_and_train(opt, opt["port"])
    else:
        raise SystemExit(f"parlai: unknown command {cmd}")


if __name__ == "__main__":
    superscript_main()
# ruff: noqa: B904, SIM108, UP032, RUF005, B905, RUF046 (ParlAI's own code, as it is written; this line and line 1 are outside what bin/parlai runs at the captured line numbers)
