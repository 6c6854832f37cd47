"""A seventy-first training-program style for the generalisation fixtures
(tests/fixtures/real/seventyfirst-*): neural machine translation trained in the way of
OpenNMT-py's onmt_train (re-implemented here in plain torch; OpenNMT is not installed). A tiny
Transformer encoder-decoder learns to reverse synthetic token sentences (corpus_1.src ->
corpus_1.tgt). The run is one command, `python onmt_train.py -config cfg.yaml` (the capture links
this file as onmt_train.py), with OpenNMT's YAML keys (save_data, src_vocab, tgt_vocab, data:
corpus_1 / valid with path_src / path_tgt, world_size, gpu_ranks, train_steps, valid_steps,
save_checkpoint_steps, batch_size, accum_count, early_stopping, keep_checkpoint, save_model,
master_ip, master_port, timeout, queue_size, report_every). Its own launcher, as onmt/bin/train.py
of OpenNMT-py 2.x: one process per gpu_rank started with torch.multiprocessing's spawn context, a
batch producer process that reads the corpus and feeds each process's queue (a semaphore bounds
the batches in flight), OpenNMT's ErrorHandler (a thread in the parent receives a child's
traceback through an error queue, SIGINTs every child and raises it under "-- Tracebacks above
this line can probably be ignored --"); each process joins with init_process_group('gloo',
init_method='tcp://IP:PORT', timeout=opt.timeout). Gradients are all-reduced by hand in one
flat buffer (OpenNMT's all_reduce_and_rescale_tensors, no DDP); the report statistics are
all-reduced on report steps (Statistics.all_gather_stats). Each process validates on its
stride of the validation corpus and decides early stopping from its own validation. Logging
as OpenNMT's init_logger: '[%(asctime)s %(levelname)s] %(message)s' on every process (no rank
in it); the first process logs the step reports, validation and checkpoints.

A fault in the code is chosen by the NMTQ environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_seventyfirst.sh after any edit).
"""

# ruff: noqa: UP031 (OpenNMT-py logs with % formatting)
from __future__ import annotations

import argparse
import ctypes
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import timedelta
from itertools import cycle
from types import SimpleNamespace

import torch
import torch.distributed as dist
import yaml
from torch import nn

logger = logging.getLogger()

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
UNK, PAD, BOS, EOS = 0, 1, 2, 3

DEFAULTS = {
    "world_size": 1,
    "gpu_ranks": [],
    "master_ip": "localhost",
    "master_port": 10000,
    "timeout": 60,
    "queue_size": 40,
    "seed": 1234,
    "train_steps": 100,
    "valid_steps": 50,
    "save_checkpoint_steps": 50,
    "keep_checkpoint": -1,
    "batch_size": 16,
    "accum_count": [1],
    "early_stopping": 0,
    "report_every": 10,
    "learning_rate": 0.003,
    "hidden_size": 32,
    "layers": 1,
    "heads": 2,
    "transformer_ff": 64,
    "pre_norm": False,
    "save_model": "run/model",
    "train_from": "",
}


def init_logger() -> logging.Logger:
    log_format = logging.Formatter("[%(asctime)s %(levelname)s] %(message)s")
    logger.setLevel(logging.INFO)
    console_handler = logging.StreamHandler()
    console_handler.setFormatter(log_format)
    logger.handlers = [console_handler]
    return logger


def fault() -> tuple[str, int]:
    """The hidden fault: (what, on which gpu rank)."""
    code = os.environ.get("NMTQ", "")
    if len(code) == 2 and code[1].isdigit():
        return code[0], int(code[1])
    return "", -1


# ----------------------------------------------------------------------------- data


def make_data(folder: str) -> None:
    """Synthetic parallel corpus: the target is the source reversed."""
    rng = random.Random(7)
    os.makedirs(folder, exist_ok=True)
    words = [f"w{i}" for i in range(60)]

    def sentence() -> list[str]:
        return [rng.choice(words) for _ in range(rng.randint(5, 10))]

    def write(name: str, n: int, noise_every: int = 0, noise_offset: int = 0) -> None:
        with open(f"{folder}/{name}.src", "w") as s, open(f"{folder}/{name}.tgt", "w") as t:
            for i in range(n):
                src = sentence()
                noisy = noise_every and i % noise_every == noise_offset
                tgt = sentence() if noisy else src[::-1]
                s.write(" ".join(src) + "\n")
                t.write(" ".join(tgt) + "\n")

    write("corpus_1", 3000)
    write("valid", 128)
    write("valid_noisy", 128, noise_every=1)  # another domain: nothing to learn from
    write("valid_mixed", 128, noise_every=2, noise_offset=1)  # every other line out of domain
    counts: Counter[str] = Counter()
    with open(f"{folder}/corpus_1.src") as f:
        for line in f:
            counts.update(line.split())
    for side in ("src", "tgt"):
        with open(f"{folder}/vocab.{side}", "w") as f:
            for w, c in counts.most_common():
                f.write(f"{w}\t{c}\n")


def load_vocab(path: str) -> dict[str, int]:
    itos = list(SPECIALS)
    with open(path, encoding="utf-8") as f:
        for line in f:
            itos.append(line.split("\t")[0])
    return {w: i for i, w in enumerate(itos)}


def count_vocab(path: str, n_sample: int) -> dict[str, int]:
    """A vocabulary counted from the first n_sample lines of a corpus (onmt_build_vocab's way)."""
    counts: Counter[str] = Counter()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n_sample:
                break
            counts.update(line.split())
    itos = list(SPECIALS) + [w for w, _ in counts.most_common()]
    return {w: i for i, w in enumerate(itos)}


def read_pairs(path_src: str, path_tgt: str):
    with open(path_src, encoding="utf-8") as s, open(path_tgt, encoding="utf-8") as t:
        for src, tgt in zip(s, t, strict=False):
            yield src.split(), tgt.split()


def numericalize(pairs, src_vocab, tgt_vocab) -> dict[str, torch.Tensor]:
    ns = max(len(s) for s, _ in pairs)
    nt = max(len(t) for _, t in pairs) + 2
    src = torch.full((len(pairs), ns), PAD, dtype=torch.long)
    tgt = torch.full((len(pairs), nt), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = torch.tensor([src_vocab.get(w, UNK) for w in s])
        ids = [BOS] + [tgt_vocab.get(w, UNK) for w in t] + [EOS]
        tgt[i, : len(ids)] = torch.tensor(ids)
    return {"src": src, "tgt": tgt}


def batch_producer(opt, queues, semaphore) -> None:
    """Reads corpus_1 over and over and feeds every process's queue in turn."""
    init_logger()
    random.seed(opt.seed)
    src_vocab = load_vocab(opt.src_vocab)
    tgt_vocab = load_vocab(opt.tgt_vocab)
    corpus = opt.data["corpus_1"]

    def batches():
        while True:
            logger.info("Weighted corpora loaded so far:\n\t\t\t* corpus_1: 1")
            pairs = []
            for pair in read_pairs(corpus["path_src"], corpus["path_tgt"]):
                pairs.append(pair)
                if len(pairs) == opt.batch_size:
                    yield numericalize(pairs, src_vocab, tgt_vocab)
                    pairs = []

    generator_to_serve = batches()

    def next_batch():
        new_batch = next(generator_to_serve)
        semaphore.acquire()
        return new_batch

    b = next_batch()
    for _device_id, q in cycle(enumerate(queues)):
        q.put(b)
        b = next_batch()


# ----------------------------------------------------------------------------- model


class NMTModel(nn.Module):
    def __init__(self, opt, n_src: int, n_tgt: int) -> None:
        super().__init__()
        h = opt.hidden_size
        self.src_emb = nn.Embedding(n_src, h, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(n_tgt, h, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(64, h) * 0.02)
        self.transformer = nn.Transformer(
            d_model=h,
            nhead=opt.heads,
            num_encoder_layers=opt.layers,
            num_decoder_layers=opt.layers,
            dim_feedforward=opt.transformer_ff,
            dropout=0.0,
            batch_first=True,
            norm_first=bool(opt.pre_norm),
        )
        self.generator = nn.Linear(h, n_tgt)
        self.joint = False
        self.float_mask = fault()[0] == "u"  # the causal mask as a float -inf mask
        if not self.float_mask:
            self.transformer.encoder.use_nested_tensor = False

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        s = self.src_emb(src) + self.pos[: src.size(1)]
        t = self.tgt_emb(tgt_in) + self.pos[: tgt_in.size(1)]
        if self.float_mask:
            mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1))
        else:
            n = tgt_in.size(1)
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        out = self.transformer(
            s,
            t,
            tgt_mask=mask,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src == PAD,
        )
        if self.joint:  # copy attention: the decoder states joined with the source context
            out = torch.cat([out, s], dim=-1)[..., : out.size(-1)]
        return self.generator(out)


class Statistics:
    def __init__(self, loss=0.0, n_words=0, n_correct=0, n_sents=0, n_src_words=0, n_batchs=0):
        self.loss = loss
        self.n_words = n_words
        self.n_correct = n_correct
        self.n_sents = n_sents
        self.n_src_words = n_src_words
        self.n_batchs = n_batchs
        self.start_time = time.time()

    def update(self, other: Statistics) -> None:
        self.loss += other.loss
        self.n_words += other.n_words
        self.n_correct += other.n_correct
        self.n_sents += other.n_sents
        self.n_src_words += other.n_src_words
        self.n_batchs += other.n_batchs

    def all_gather_stats(self) -> None:
        t = torch.tensor(
            [
                self.loss,
                self.n_words,
                self.n_correct,
                self.n_sents,
                self.n_src_words,
                self.n_batchs,
            ],
            dtype=torch.float64,
        )
        dist.all_reduce(t)
        (self.loss, self.n_words, self.n_correct, self.n_sents, self.n_src_words, self.n_batchs) = (
            t.tolist()
        )

    def xent(self) -> float:
        return self.loss / max(self.n_words, 1)

    def ppl(self) -> float:
        return math.exp(min(self.xent(), 100))

    def accuracy(self) -> float:
        return 100 * self.n_correct / max(self.n_words, 1)

    def output(self, step, num_steps, learning_rate, start) -> None:
        t = time.time() - self.start_time
        logger.info(
            (
                "Step %s; acc: %5.2f; ppl: %6.2f; xent: %4.2f; lr: %7.5f; sents: %7.0f; "
                "bsz: %4.0f/%4.0f/%2.0f; %3.0f/%3.0f tok/s; %6.0f sec;"
            )
            % (
                "%2d/%5d" % (step, num_steps),
                self.accuracy(),
                self.ppl(),
                self.xent(),
                learning_rate,
                self.n_sents,
                self.n_src_words / max(self.n_batchs, 1),
                self.n_words / max(self.n_batchs, 1),
                self.n_sents / max(self.n_batchs, 1),
                self.n_src_words / (t + 1e-5),
                self.n_words / (t + 1e-5),
                time.time() - start,
            )
        )


def compute(model, batch) -> tuple[torch.Tensor, Statistics]:
    src, tgt = batch["src"], batch["tgt"]
    logits = model(src, tgt[:, :-1])
    gold = tgt[:, 1:]
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), gold.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    keep = gold != PAD
    correct = ((logits.argmax(-1) == gold) & keep).sum().item()
    stats = Statistics(
        loss.item(), keep.sum().item(), correct, src.size(0), (src != PAD).sum().item(), 1
    )
    return loss, stats


def all_reduce_and_rescale_tensors(tensors, rescale_denom: float) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat.div_(rescale_denom)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class EarlyStopping:
    def __init__(self, tolerance: int) -> None:
        self.tolerance = tolerance
        self.current_tolerance = tolerance
        self.best = float("inf")
        self.stopped = False

    def __call__(self, valid_stats: Statistics, step: int) -> None:
        ppl = valid_stats.ppl()
        if ppl < self.best:
            logger.info("Model is improving ppl: %g --> %g." % (self.best, ppl))
            self.best = ppl
            self.current_tolerance = self.tolerance
        else:
            self.current_tolerance -= 1
            logger.info("Stalled patience: %d/%d" % (self.current_tolerance, self.tolerance))
            if self.current_tolerance == 0:
                logger.info("Training finished after not improving.")
                self.stopped = True


def validate(model, opt, rank, src_vocab, tgt_vocab) -> Statistics:
    valid = opt.data["valid"]
    pairs = list(read_pairs(valid["path_src"], valid["path_tgt"]))[rank :: opt.world_size]
    stats = Statistics()
    model.eval()
    with torch.no_grad():
        for i in range(0, len(pairs), opt.batch_size):
            _, s = compute(model, numericalize(pairs[i : i + opt.batch_size], src_vocab, tgt_vocab))
            stats.update(s)
    model.train()
    return stats


# ----------------------------------------------------------------------------- processes


def multi_init(opt, device_id: int) -> int:
    dist_init_method = f"tcp://{opt.master_ip}:{opt.master_port}"
    dist.init_process_group(
        backend="gloo",
        init_method=dist_init_method,
        world_size=opt.world_size,
        rank=opt.gpu_ranks[device_id],
        timeout=timedelta(seconds=opt.timeout),
    )
    return dist.get_rank()


def consumer(process_fn, opt, device_id, error_queue, batch_queue, semaphore) -> None:
    """Run `process_fn` on `device_id` with data from `batch_queue`."""
    init_logger()
    try:
        gpu_rank = multi_init(opt, device_id)
        if gpu_rank != opt.gpu_ranks[device_id]:
            raise AssertionError("An error occurred in Distributed initialization")
        process_fn(opt, device_id, batch_queue, semaphore)
    except KeyboardInterrupt:
        pass  # killed by parent, do nothing
    except Exception:
        # propagate exception to parent process, keeping original traceback
        error_queue.put((opt.gpu_ranks[device_id], traceback.format_exc()))


def train_process(opt, device_id, batch_queue, semaphore) -> None:
    rank = opt.gpu_ranks[device_id]
    what, who = fault()
    mine = who == rank
    torch.manual_seed(opt.seed)
    torch.set_num_threads(1)
    if what == "b" and mine:  # this process counts its vocabulary from a sample of its own
        src_vocab = count_vocab(opt.data["corpus_1"]["path_src"], 10)
    else:
        src_vocab = load_vocab(opt.src_vocab)
    tgt_vocab = load_vocab(opt.tgt_vocab)
    model = NMTModel(opt, len(src_vocab), len(tgt_vocab))
    if opt.train_from:
        logger.info("Loading checkpoint from %s" % opt.train_from)
        checkpoint = torch.load(opt.train_from, map_location="cpu", weights_only=False)
        model.load_state_dict(checkpoint["model"])
    optim = torch.optim.Adam(model.parameters(), lr=opt.learning_rate)
    if rank == 0:
        enc = sum(p.numel() for n, p in model.named_parameters() if "encoder" in n or "src" in n)
        total = sum(p.numel() for p in model.parameters())
        logger.info("encoder: %d" % enc)
        logger.info("decoder: %d" % (total - enc))
        logger.info("* number of parameters: %d" % total)
        logger.info("Starting training on GPU: %s" % opt.gpu_ranks)
        logger.info("Start training loop and validate every %d steps..." % opt.valid_steps)

    def batches():
        while True:
            batch = batch_queue.get()
            semaphore.release()
            yield batch

    accum = opt.accum_count[0] if isinstance(opt.accum_count, list) else opt.accum_count
    early = EarlyStopping(opt.early_stopping) if opt.early_stopping > 0 else None
    report = Statistics()
    start = time.time()
    hoard = []
    stream = batches()
    saved: list[str] = []
    for step in range(1, opt.train_steps + 1):
        if what == "j" and mine and step == 12:
            model.joint = True
        if what == "v" and mine and step == 9:
            ctypes.string_at(0)  # the native fast path reads a null pointer
        if what == "w" and mine and step == 12:
            threading.Event().wait()  # set by a prefetch thread that was never started
        if what == "s" and mine and step == 12:
            for k in range(1, 9):
                logger.info("Rebuilding the length buckets of corpus_1 (%d/8)..." % k)
                time.sleep(5)
        if what == "m" and mine and step >= 6:
            hoard.append(torch.ones(48 * 2**18))  # 48 MiB a step, never freed
            if step == 11:
                os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
        optim.zero_grad()
        for _ in range(accum):
            loss, stats = compute(model, next(stream))
            (loss / max(stats.n_words, 1)).backward()
            report.update(stats)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        all_reduce_and_rescale_tensors(grads, float(opt.world_size))
        optim.step()
        if step % opt.report_every == 0:
            if what != "g" or mine:
                report.all_gather_stats()
            if rank == 0:
                report.output(step, opt.train_steps, opt.learning_rate, start)
            report = Statistics()
        if opt.valid_steps and step % opt.valid_steps == 0:
            valid_stats = validate(model, opt, rank, src_vocab, tgt_vocab)
            if rank == 0:
                logger.info("Validation perplexity: %g" % valid_stats.ppl())
                logger.info("Validation accuracy: %g" % valid_stats.accuracy())
            if early is not None:
                early(valid_stats, step)
        if rank == 0 and step % opt.save_checkpoint_steps == 0:
            path = "%s_step_%d.pt" % (opt.save_model, step)
            logger.info("Saving checkpoint %s" % path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            torch.save({"model": model.state_dict(), "step": step}, path)
            saved.append(path)
            if opt.keep_checkpoint > 0 and len(saved) > opt.keep_checkpoint:
                os.remove(saved.pop(0))
        if early is not None and early.stopped:
            break


class ErrorHandler:
    """A class that listens for exceptions in children processes and propagates
    the tracebacks to the parent process."""

    def __init__(self, error_queue) -> None:
        self.error_queue = error_queue
        self.children_pids: list[int] = []
        self.error_thread = threading.Thread(target=self.error_listener, daemon=True)
        self.error_thread.start()
        signal.signal(signal.SIGUSR1, self.signal_handler)

    def add_child(self, pid: int) -> None:
        self.children_pids.append(pid)

    def error_listener(self) -> None:
        (rank, original_trace) = self.error_queue.get()
        self.error_queue.put((rank, original_trace))
        os.kill(os.getpid(), signal.SIGUSR1)

    def signal_handler(self, signalnum, stackframe) -> None:
        for pid in self.children_pids:
            os.kill(pid, signal.SIGINT)  # kill children processes
        (_rank, original_trace) = self.error_queue.get()
        msg = """\n\n-- Tracebacks above this line can probably
                 be ignored --\n\n"""
        msg += original_trace
        raise Exception(msg)


def parse_opt(argv: list[str]) -> SimpleNamespace:
    parser = argparse.ArgumentParser(description="train.py")
    parser.add_argument("-config", "--config", required=True)
    parser.add_argument("-train_from", "--train_from", default=None)
    args = parser.parse_args(argv)
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    opt = dict(DEFAULTS)
    opt.update(cfg)
    if args.train_from is not None:
        opt["train_from"] = args.train_from
    return SimpleNamespace(**opt)


def train(opt) -> None:
    for name, corpus in opt.data.items():
        if name == "valid":
            continue
        if "transforms" not in corpus:
            logger.warning(f"Missing transforms field for {name} data, set to default: [].")
        if "weight" not in corpus:
            logger.warning(f"Corpus {name}'s weight should be given. We default it to 1 for you.")
    logger.info("Parsed %d corpora from -data." % len(opt.data))
    logger.info("Loading vocab from text file...")
    src = load_vocab(opt.src_vocab)
    tgt = load_vocab(opt.tgt_vocab)
    logger.info("Building fields with vocab in counts...")
    logger.info(" * src vocab size: %d." % len(src))
    logger.info(" * tgt vocab size: %d." % len(tgt))
    nb_gpu = len(opt.gpu_ranks)
    mp = torch.multiprocessing.get_context("spawn")
    semaphore = mp.Semaphore(opt.world_size * opt.queue_size)
    # Create a thread to listen for errors in the child processes.
    error_queue = mp.SimpleQueue()
    error_handler = ErrorHandler(error_queue)
    # Train with multiprocessing.
    procs = []
    queues = []
    for device_id in range(nb_gpu):
        q = mp.Queue(opt.queue_size)
        queues += [q]
        procs.append(
            mp.Process(
                target=consumer,
                args=(train_process, opt, device_id, error_queue, q, semaphore),
                daemon=True,
            )
        )
        procs[device_id].start()
        logger.info(" Starting process pid: %d  " % procs[device_id].pid)
        error_handler.add_child(procs[device_id].pid)
    producer = mp.Process(target=batch_producer, args=(opt, queues, semaphore), daemon=True)
    producer.start()
    error_handler.add_child(producer.pid)
    for p in procs:
        p.join()
    producer.terminate()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "-make_data":
        make_data(sys.argv[2])
        return
    init_logger()
    train(parse_opt(sys.argv[1:]))


if __name__ == "__main__":
    main()
