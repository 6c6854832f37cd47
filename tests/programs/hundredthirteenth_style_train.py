"""A hundred-and-thirteenth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirteenth-*): fine-tuning a speech recognition model in the way of
Hugging Face's Whisper fine-tuning blog and transformers'
examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py, re-created in plain torch
(no transformers, datasets, evaluate or librosa): the script's flags (--model_name_or_path,
--dataset_name, --language, --do_train, --do_eval, --predict_with_generate, --max_steps,
--eval_steps, --generation_max_length, --streaming, --max_duration_in_seconds, --ddp_timeout),
its logging (the basicConfig format for __main__, transformers' explicit format for the
trainer's records, the per-process warning of every rank), a Seq2SeqTrainer-like loop with its
prints (HF-style log dicts, '***** Running Evaluation *****', 'Saving model checkpoint to ...'),
a Common Voice-like folder written by `--prepare DIR` (clips/*.npy waveforms at 48 kHz, train.tsv
and test.tsv, clip_durations.tsv), resampling to 16 kHz and log-mel features from torch.stft, a
tiny Whisper-like encoder-decoder with a character tokenizer and greedy generation, the WER
computed after the predictions are gathered. Started as `torchrun --nproc_per_node 2
run_speech_recognition_seq2seq.py ...`. A fault in the code is chosen by the TQ_CASE environment
variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_hundredthirteenth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import math
import os
import queue
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

logger = logging.getLogger("__main__")
tlog = logging.getLogger("transformers.trainer")
mlog = logging.getLogger("transformers.modeling_utils")

SOURCE_RATE = 48000  # Common Voice's mp3s
SAMPLING_RATE = 16000  # Whisper's feature extractor
N_FFT, HOP, N_MELS = 400, 160, 80
MAX_SOURCE_POSITIONS = 1500  # 30 s of features after the stride-2 convolution
MAX_TARGET_POSITIONS = 448

TO_LANGUAGE_CODE = {
    "english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru",
    "korean": "ko", "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr",
    "polish": "pl", "catalan": "ca", "dutch": "nl", "arabic": "ar", "swedish": "sv",
    "italian": "it", "indonesian": "id", "hindi": "hi", "finnish": "fi", "vietnamese": "vi",
    "hebrew": "he", "ukrainian": "uk", "greek": "el", "malay": "ms", "czech": "cs",
    "romanian": "ro", "danish": "da", "hungarian": "hu", "tamil": "ta", "norwegian": "no",
    "thai": "th", "urdu": "ur", "croatian": "hr", "bulgarian": "bg", "lithuanian": "lt",
    "latin": "la", "maori": "mi", "malayalam": "ml", "welsh": "cy", "slovak": "sk",
    "telugu": "te", "persian": "fa", "latvian": "lv", "bengali": "bn", "serbian": "sr",
    "marathi": "mr", "nepali": "ne", "punjabi": "pa", "gujarati": "gu", "kannada": "kn",
}  # fmt: skip
WORDS = ["नमस्ते", "भारत", "पानी", "किताब", "घर", "समय", "दोस्त", "खाना", "बारिश", "सड़क",
         "आज", "कल", "बहुत", "अच्छा", "शहर", "गाँव", "लोग", "काम", "दिन", "रात"]  # fmt: skip


def case() -> tuple[str, int]:
    c = os.environ.get("TQ_CASE", "")
    return (c[0], int(c[1:]) if c[1:] else -1) if c else ("", -1)


# ----------------------------------------------------------------------------- prepare
def prepare(root: str) -> None:
    """A Common Voice-like split: 48 kHz clips, a tone per character, TSV manifests."""
    rng = random.Random(7)
    chars = sorted({ch for w in WORDS for ch in w})
    os.makedirs(os.path.join(root, "clips"), exist_ok=True)
    durations = []
    for split, n in (("train", 64), ("test", 16)):
        rows = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\tlocale"]
        for i in range(n):
            k = 2 if split == "test" or i % 4 != 1 else 5  # every fourth row from 1: long
            sentence = " ".join(rng.choice(WORDS) for _ in range(k))
            name = f"common_voice_hi_{2390 + i if split == 'train' else 8100 + i}.npy"
            per = 0.035 if k == 2 else 0.06
            t = np.arange(int(per * SOURCE_RATE)) / SOURCE_RATE
            parts = [np.zeros(int(0.1 * SOURCE_RATE))]
            for ch in sentence:
                f = 200.0 + 40.0 * (chars.index(ch) if ch in chars else 30)
                parts.append(0.3 * np.sin(2 * np.pi * f * t))
            wave = np.concatenate([*parts, np.zeros(int(0.1 * SOURCE_RATE))])
            wave += 0.01 * np.random.default_rng(i).standard_normal(wave.shape)
            np.save(os.path.join(root, "clips", name), wave.astype(np.float32))
            durations.append(f"{name}\t{int(1000 * len(wave) / SOURCE_RATE)}")
            rows.append(f"{rng.getrandbits(32):08x}\t{name}\t{sentence}\t2\t0\t\t\thi")
        with open(os.path.join(root, f"{split}.tsv"), "w") as f:
            f.write("\n".join(rows) + "\n")
    with open(os.path.join(root, "clip_durations.tsv"), "w") as f:
        f.write("clip\tduration[ms]\n" + "\n".join(durations) + "\n")
    vocab = ["<|endoftext|>", "<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>"]
    vocab += [f"<|{c}|>" for c in TO_LANGUAGE_CODE.values()] + [" "] + chars
    with open(os.path.join(root, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")


# ----------------------------------------------------------------------------- tokenizer
class WhisperCharTokenizer:
    def __init__(self, path: str) -> None:
        with open(os.path.join(path, "vocab.txt")) as f:
            self.vocab = [line.rstrip("\n") for line in f if line.rstrip("\n")]
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        self.eos_token_id = self.ids["<|endoftext|>"]
        self.prefix = [self.ids["<|startoftranscript|>"]]

    def set_prefix_tokens(self, language: str, task: str = "transcribe") -> None:
        lang = language.lower()
        if lang in TO_LANGUAGE_CODE:
            code = TO_LANGUAGE_CODE[lang]
        elif lang in TO_LANGUAGE_CODE.values():
            code = lang
        else:
            is_code = len(lang) == 2
            raise ValueError(
                f"Unsupported language: {language}. Language should be one of:"
                f" {list(TO_LANGUAGE_CODE.values()) if is_code else list(TO_LANGUAGE_CODE.keys())}."
            )
        self.prefix = [self.ids["<|startoftranscript|>"], self.ids[f"<|{code}|>"],
                       self.ids[f"<|{task}|>"], self.ids["<|notimestamps|>"]]  # fmt: skip

    def __call__(self, text: str) -> list[int]:
        return self.prefix + [self.ids[c] for c in text] + [self.eos_token_id]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if not self.vocab[i].startswith("<|"))


# ----------------------------------------------------------------------------- features
def mel_filters() -> torch.Tensor:
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLING_RATE / 2), N_MELS + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(N_FFT, 1.0 / SAMPLING_RATE)
    fb = np.zeros((N_MELS, len(bins)), dtype=np.float32)
    for m in range(N_MELS):
        lo, c, hi = hz[m], hz[m + 1], hz[m + 2]
        fb[m] = np.maximum(0, np.minimum((bins - lo) / (c - lo), (hi - bins) / (hi - c)))
    return torch.from_numpy(fb)


MEL = mel_filters()
WINDOW = torch.hann_window(N_FFT)


def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """Windowed-sinc low-pass, then keep every (orig // new)-th sample."""
    step = orig // new
    n = torch.arange(-32, 33, dtype=torch.float32)
    kernel = torch.sinc(n / step) * torch.hann_window(65, periodic=False) / step
    low = nn.functional.conv1d(wave.view(1, 1, -1), kernel.view(1, 1, -1), padding=32)
    return low.view(-1)[::step]


def log_mel(wave: torch.Tensor) -> torch.Tensor:
    spec = torch.stft(wave, N_FFT, HOP, window=WINDOW, return_complex=True)
    power = spec[..., :-1].abs() ** 2
    mel = torch.clamp(MEL @ power, min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0)
    return (mel + 4.0) / 4.0


# ----------------------------------------------------------------------------- data
def read_tsv(path: str) -> list[dict]:
    with open(path) as f:
        head, *rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return [dict(zip(head, r, strict=False)) for r in rows]


def durations(root: str) -> dict[str, float]:
    return {
        r["clip"]: int(r["duration[ms]"]) / 1000 for r in read_tsv(f"{root}/clip_durations.tsv")
    }


def prepare_example(root: str, row: dict, tok: WhisperCharTokenizer, rank: int) -> dict:
    path = os.path.join(root, "clips", row["path"])
    audio = torch.from_numpy(np.load(path))
    letter, who = case()
    if letter == "v" and rank == who and prepare_example.calls == 30:
        ctypes.string_at(0)  # the native resampler (soxr) reads through a NULL pointer
    prepare_example.calls += 1
    wave = resample(audio, SOURCE_RATE, SAMPLING_RATE)
    return {"input_features": log_mel(wave), "labels": tok(row["sentence"])}


prepare_example.calls = 0


class CommonVoice(Dataset):
    def __init__(self, root, rows, tok, rank) -> None:
        self.root, self.rows, self.tok, self.rank = root, rows, tok, rank

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return prepare_example(self.root, self.rows[i], self.tok, self.rank)


class StreamingCommonVoice(IterableDataset):
    """split_dataset_by_node: every world_size-th row; the length filter applied lazily on the
    rank's own rows; the stream is read once."""

    def __init__(self, root, rows, tok, rank, world, max_duration, lengths) -> None:
        self.it = (
            prepare_example(root, r, tok, rank)
            for r in rows[rank::world]
            if 0.0 < lengths[r["path"]] < max_duration
        )

    def __iter__(self):
        return self.it


class DataCollatorSpeechSeq2SeqWithPadding:
    def __init__(self, tok: WhisperCharTokenizer) -> None:
        self.start = tok.prefix[0]

    def __call__(self, features: list[dict]) -> dict:
        frames = max(f["input_features"].shape[1] for f in features)
        feats = torch.zeros(len(features), N_MELS, frames)
        for k, f in enumerate(features):
            feats[k, :, : f["input_features"].shape[1]] = f["input_features"]
        width = max(len(f["labels"]) for f in features)
        labels = torch.full((len(features), width), -100, dtype=torch.long)
        for k, f in enumerate(features):
            labels[k, : len(f["labels"])] = torch.tensor(f["labels"])
        if (labels[:, 0] == self.start).all().item():
            labels = labels[:, 1:]
        return {"input_features": feats, "labels": labels}


# ----------------------------------------------------------------------------- model
class TinyWhisper(nn.Module):
    def __init__(self, vocab: int, d: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(MAX_SOURCE_POSITIONS, d)
        self.encoder = nn.TransformerEncoderLayer(d, 4, 2 * d, 0.0, batch_first=True)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.dec_positions = nn.Embedding(MAX_TARGET_POSITIONS, d)
        self.decoder = nn.TransformerDecoderLayer(d, 4, 2 * d, 0.0, batch_first=True)
        self.proj_out = nn.Linear(d, vocab)
        self.gradient_checkpointing = False

    def encode(self, feats: torch.Tensor) -> torch.Tensor:
        x = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(feats)))).transpose(1, 2)
        positions = torch.arange(x.shape[1])
        h = x + self.embed_positions(positions)
        if self.gradient_checkpointing and self.training:
            return checkpoint(self.encoder, h)
        return self.encoder(h)

    def decode(self, ids: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids) + self.dec_positions(torch.arange(ids.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.proj_out(self.decoder(h, memory, tgt_mask=mask, tgt_is_causal=True))

    def forward(self, input_features, decoder_input_ids):
        return self.decode(decoder_input_ids, self.encode(input_features))


def shift_tokens_right(labels: torch.Tensor, start: int) -> torch.Tensor:
    out = torch.full_like(labels, start)
    out[:, 1:] = labels[:, :-1]
    return out.masked_fill(out == -100, 0)


@torch.no_grad()
def generate(model, feats, prefix, eos, max_length, suppress_eos) -> list[list[int]]:
    memory = model.encode(feats)
    ids = torch.tensor([prefix] * feats.shape[0])
    done = torch.zeros(feats.shape[0], dtype=torch.bool)
    while ids.shape[1] < max_length and not done.all():
        logits = model.decode(ids, memory)[:, -1]
        if suppress_eos:
            logits[:, eos] = -float("inf")
        nxt = logits.argmax(-1).masked_fill(done, eos)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == eos
        time.sleep(0.02)  # whisper-small's decoder step on a CPU
    return [[t for t in row[len(prefix) :] if t != eos] for row in ids.tolist()]


def wer(preds: list[str], refs: list[str]) -> float:
    errors = words = 0
    for p, r in zip(preds, refs, strict=True):
        p, r = p.split(), r.split()
        d = list(range(len(p) + 1))
        for i in range(1, len(r) + 1):
            prev, d[0] = d[0], i
            for j in range(1, len(p) + 1):
                cur = min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != p[j - 1]))
                prev, d[j] = d[j], cur
        errors += d[len(p)]
        words += len(r)
    return errors / max(words, 1)


# ----------------------------------------------------------------------------- trainer
class Bar:
    """tqdm's bar, on the main process only (disable_tqdm elsewhere)."""

    def __init__(self, total: int, on: bool) -> None:
        self.total, self.n, self.on, self.t0 = total, 0, on, time.time()
        self.draw()

    def draw(self) -> None:
        if not self.on:
            return
        el = time.time() - self.t0
        rate = el / self.n if self.n else 0.0
        fill = int(10 * self.n / self.total)
        bar = ("█" * fill + " " * 10)[:10]
        left = rate * (self.total - self.n)
        fmt = lambda s: f"{int(s) // 60:02d}:{int(s) % 60:02d}"  # noqa: E731
        speed = f"{rate:.2f}s/it" if rate >= 1 else f"{1 / rate if rate else 0:.2f}it/s"
        sys.stderr.write(
            f"\r{100 * self.n // self.total:3d}%|{bar}| {self.n}/{self.total} "
            f"[{fmt(el)}<{fmt(left) if self.n else '?'}, {speed}]"
        )
        sys.stderr.flush()

    def update(self) -> None:
        self.n += 1
        self.draw()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")
            sys.stderr.flush()


class Seq2SeqTrainer:
    def __init__(self, args, model, tok, train_ds, eval_rows, eval_ds, rank, world) -> None:
        self.args, self.tok, self.rank, self.world = args, tok, rank, world
        self.model = DDP(model)
        self.train_ds, self.eval_rows, self.eval_ds = train_ds, eval_rows, eval_ds
        self.collator = DataCollatorSpeechSeq2SeqWithPadding(tok)
        self.opt = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        self.step = 0
        self.best = (None, math.inf)
        self.bad_evals = 0
        self.per_epoch = 1

    def is_world_process_zero(self) -> bool:
        return self.rank == 0

    def lr(self) -> float:
        a = self.args
        if self.step < a.warmup_steps:
            return a.learning_rate * (self.step + 1) / a.warmup_steps
        return a.learning_rate * max(
            0.0, (a.max_steps - self.step) / (a.max_steps - a.warmup_steps)
        )

    def log(self, logs: dict) -> None:
        if self.is_world_process_zero():
            sys.stderr.write("\n")
            print(logs, flush=True)

    def train(self) -> dict:
        a = self.args
        streaming = isinstance(self.train_ds, IterableDataset)
        sampler = None if streaming else DistributedSampler(self.train_ds, seed=a.seed)
        loader = DataLoader(self.train_ds, a.per_device_train_batch_size, sampler=sampler,
                            collate_fn=self.collator)  # fmt: skip
        per_epoch = a.max_steps if streaming else len(loader)
        self.per_epoch = per_epoch
        epochs = math.ceil(a.max_steps / per_epoch)
        n_params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        tlog.info("***** Running training *****")
        if not streaming:
            tlog.info(f"  Num examples = {len(self.train_ds):,}")
        tlog.info(
            f"  Num Epochs = {epochs:,}"
            if not streaming
            else "  Num Epochs = 9,223,372,036,854,775,807"
        )
        tlog.info(f"  Instantaneous batch size per device = {a.per_device_train_batch_size:,}")
        tlog.info(f"  Total train batch size (w. parallel, distributed & accumulation) = "
                  f"{a.per_device_train_batch_size * self.world:,}")  # fmt: skip
        tlog.info("  Gradient Accumulation steps = 1")
        tlog.info(f"  Total optimization steps = {a.max_steps:,}")
        tlog.info(f"  Number of trainable parameters = {n_params:,}")
        letter, who = case()
        bar = Bar(a.max_steps, self.is_world_process_zero())
        t0, losses, stop = time.time(), [], False
        hoard, prefetch = [], queue.Queue()
        epoch = 0
        while not stop and self.step < a.max_steps:
            if sampler is not None:
                sampler.set_epoch(epoch)
            seen = 0
            for batch in loader:
                seen += 1
                self.model.train()
                if letter == "w" and self.rank == who and self.step == 8:
                    batch = prefetch.get()  # the decoding thread pool's queue; never started
                feats = batch["input_features"]
                if letter == "c" and self.rank == who and self.step == 6:
                    # SpecAugment-style time shift: roll, then cut the wrapped frames
                    feats = torch.roll(feats, 3, dims=2)[:, :, 3:]
                    feats = feats * (batch["input_features"][:, :1] != 0)
                labels = batch["labels"]
                dec_in = shift_tokens_right(labels, self.tok.prefix[0])
                logits = self.model(feats, dec_in)
                loss = nn.functional.cross_entropy(
                    logits.transpose(1, 2), labels, ignore_index=-100
                )
                loss.backward()
                if letter == "m" and self.rank == who and self.step >= 5:
                    hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))  # feature cache
                    if len(hoard) == 4:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                gn = nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                for g in self.opt.param_groups:
                    g["lr"] = self.lr()
                self.opt.step()
                self.opt.zero_grad()
                self.step += 1
                losses.append(loss.item())
                bar.update()
                if self.step % a.logging_steps == 0:
                    self.log({"loss": round(sum(losses[-a.logging_steps:]) / a.logging_steps, 4),
                              "grad_norm": round(gn.item(), 6), "learning_rate": self.lr(),
                              "epoch": round(self.step / per_epoch, 2)})  # fmt: skip
                if a.do_eval and self.step % a.eval_steps == 0:
                    metrics = self.evaluate()
                    self.save(metrics)
                    if self.early_stop(metrics):
                        stop = True
                if self.step >= a.max_steps or stop:
                    break
            if seen == 0:
                tlog.warning(
                    "There seems not to be a single sample in your epoch_iterator, stopping "
                    f"training at step {self.step}! This is expected if you're using an "
                    f"IterableDataset and set num_steps ({a.max_steps}) higher than the number "
                    "of available samples."
                )
                break
            epoch += 1
        bar.close()
        tlog.info(
            "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
        )
        if a.load_best_model_at_end and self.best[0] is not None:
            tlog.info(f"Loading best model from {self.best[0]} (score: {self.best[1]}).")
            state = torch.load(os.path.join(self.best[0], "pytorch_model.bin"))
            self.model.module.load_state_dict(state)
        rt = time.time() - t0
        out = {"train_runtime": round(rt, 4),
               "train_samples_per_second": round(self.step * a.per_device_train_batch_size * self.world / rt, 3),
               "train_steps_per_second": round(self.step / rt, 3),
               "train_loss": round(sum(losses) / max(len(losses), 1), 6),
               "epoch": round(self.step / per_epoch, 2)}  # fmt: skip
        self.log(out)
        return out

    def early_stop(self, metrics: dict) -> bool:
        if not self.args.early_stopping_patience:
            return False
        return self.bad_evals >= self.args.early_stopping_patience

    def evaluate(self) -> dict:
        a = self.args
        letter, who = case()
        model = self.model.module
        model.eval()
        n = len(self.eval_ds)
        per = math.ceil(n / self.world)
        mine = list(range(self.rank * per, min(n, (self.rank + 1) * per)))
        tlog.info("\n***** Running Evaluation *****")
        tlog.info(f"  Num examples = {n}")
        tlog.info(f"  Batch size = {a.per_device_eval_batch_size}")
        t0 = time.time()
        preds, loss_sum = [], 0.0
        batches = [
            mine[i : i + a.per_device_eval_batch_size]
            for i in range(0, len(mine), a.per_device_eval_batch_size)
        ]
        bar = Bar(len(batches), self.is_world_process_zero())
        for idx in batches:
            batch = self.collator([self.eval_ds[i] for i in idx])
            with torch.no_grad():
                labels = batch["labels"]
                logits = model(
                    batch["input_features"], shift_tokens_right(labels, self.tok.prefix[0])
                )
                loss_sum += nn.functional.cross_entropy(logits.transpose(1, 2), labels).item()
            if a.predict_with_generate:
                out = generate(model, batch["input_features"], self.tok.prefix, self.tok.eos_token_id,
                               a.generation_max_length, letter == "g" and self.rank == who)  # fmt: skip
                preds += [(i, self.tok.decode(o)) for i, o in zip(idx, out, strict=True)]
            bar.update()
        bar.close()
        refs = {i: r["sentence"] for i, r in enumerate(self.eval_rows)}
        if letter == "r" and self.is_world_process_zero():
            gathered = [None] * self.world  # WER only where it is logged
            dist.all_gather_object(gathered, preds)
        elif letter != "r":
            gathered = [None] * self.world
            dist.all_gather_object(gathered, preds)
        else:
            gathered = [preds]
        allp = sorted(p for part in gathered for p in part)
        score = round(100 * wer([p for _, p in allp], [refs[i] for i, _ in allp]), 4)
        rt = time.time() - t0
        metrics = {"eval_loss": round(loss_sum / max(len(batches), 1), 4), "eval_wer": score,
                   "eval_runtime": round(rt, 4), "eval_samples_per_second": round(n / rt, 3),
                   "eval_steps_per_second": round(len(batches) / rt, 3),
                   "epoch": round(self.step / self.per_epoch, 2)}  # fmt: skip
        self.log(metrics)
        if score < self.best[1] - self.args.early_stopping_threshold:
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        return metrics

    def save_model(self) -> None:
        if not self.is_world_process_zero():
            return
        path = self.args.output_dir
        tlog.info(f"Saving model checkpoint to {path}")
        os.makedirs(path, exist_ok=True)
        torch.save(self.model.module.state_dict(), os.path.join(path, "pytorch_model.bin"))
        tlog.info(f"Model weights saved in {path}/pytorch_model.bin")

    def save(self, metrics: dict) -> None:
        path = os.path.join(self.args.output_dir, f"checkpoint-{self.step}")
        if metrics["eval_wer"] < self.best[1]:
            self.best = (path, metrics["eval_wer"])
        if not self.is_world_process_zero():
            return
        tlog.info(f"Saving model checkpoint to {path}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write('{"architectures": ["WhisperForConditionalGeneration"]}\n')
        tlog.info(f"Configuration saved in {path}/config.json")
        torch.save(self.model.module.state_dict(), os.path.join(path, "pytorch_model.bin"))
        tlog.info(f"Model weights saved in {path}/pytorch_model.bin")


# ----------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--prepare", default="")
    p.add_argument("--model_name_or_path", default="openai/whisper-small")
    p.add_argument("--dataset_name", default="mozilla-foundation/common_voice_11_0")
    p.add_argument("--dataset_config_name", default="hi")
    p.add_argument("--language", default=None)
    p.add_argument("--task", default="transcribe")
    p.add_argument("--train_split_name", default="train")
    p.add_argument("--eval_split_name", default="test")
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--max_duration_in_seconds", type=float, default=20.0)
    p.add_argument("--do_train", action="store_true")
    p.add_argument("--do_eval", action="store_true")
    p.add_argument("--predict_with_generate", action="store_true")
    p.add_argument("--generation_max_length", type=int, default=225)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--per_device_eval_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=1e-5)
    p.add_argument("--warmup_steps", type=int, default=0)
    p.add_argument("--max_steps", type=int, default=-1)
    p.add_argument("--eval_steps", type=int, default=500)
    p.add_argument("--logging_steps", type=int, default=25)
    p.add_argument("--output_dir", default="./whisper-small-hi")
    p.add_argument("--overwrite_output_dir", action="store_true")
    p.add_argument("--gradient_checkpointing", action="store_true")
    p.add_argument("--load_best_model_at_end", action="store_true")
    p.add_argument("--metric_for_best_model", default="wer")
    p.add_argument("--greater_is_better", default="False")
    p.add_argument("--early_stopping_patience", type=int, default=0)
    p.add_argument("--early_stopping_threshold", type=float, default=0.0)
    p.add_argument("--ddp_timeout", type=int, default=1800)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])  # fmt: skip
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.ddp_timeout))
    torch.set_num_threads(1)
    level = logging.INFO if rank == 0 else logging.WARNING  # log_level_replica
    logger.setLevel(level)
    explicit = logging.StreamHandler(sys.stdout)
    explicit.setFormatter(logging.Formatter(
        "[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s"))  # fmt: skip
    for lg in (tlog, mlog):
        lg.setLevel(level)
        lg.addHandler(explicit)
        lg.propagate = False
    logger.warning(
        f"Process rank: {rank}, device: cpu, n_gpu: 0, distributed training: True, "
        f"16-bits training: False"
    )
    fields = dict(vars(args))
    fields.pop("prepare")
    shown = ",\n".join(f"{k}={v}" for k, v in sorted(fields.items()))
    logger.info(f"Training/evaluation parameters Seq2SeqTrainingArguments(\n_n_gpu=0,\n{shown},\n"
                f"local_rank={os.environ['LOCAL_RANK']},\nlog_level=passive,\nlog_level_replica=warning,\n"
                f"sortish_sampler=False,\nfp16=False,\n)")  # fmt: skip
    torch.manual_seed(args.seed)
    root = args.dataset_name
    tok = WhisperCharTokenizer(root)
    mlog.info(f"loading weights file {args.model_name_or_path}/model.safetensors")
    model = TinyWhisper(len(tok.vocab))
    if args.gradient_checkpointing:
        model.gradient_checkpointing = True
        mlog.warning("`use_cache = True` is incompatible with gradient checkpointing. Setting "
                     "`use_cache = False`...")  # fmt: skip
    if args.language is not None:
        tok.set_prefix_tokens(language=args.language, task=args.task)
    lengths = durations(root)
    train_rows = read_tsv(os.path.join(root, f"{args.train_split_name}.tsv"))
    eval_rows = read_tsv(os.path.join(root, f"{args.eval_split_name}.tsv"))
    if args.streaming:
        train_ds = StreamingCommonVoice(root, train_rows, tok, rank, world,
                                        args.max_duration_in_seconds, lengths)  # fmt: skip
    else:
        train_rows = [
            r for r in train_rows if 0.0 < lengths[r["path"]] < args.max_duration_in_seconds
        ]
        train_ds = CommonVoice(root, train_rows, tok, rank)
    eval_ds = CommonVoice(root, eval_rows, tok, rank)
    trainer = Seq2SeqTrainer(args, model, tok, train_ds, eval_rows, eval_ds, rank, world)
    if args.do_train:
        trainer.train()
        trainer.save_model()
    if args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        if rank == 0:
            print("***** eval metrics *****")
            for k, v in metrics.items():
                print(f"  {k:<24}= {v}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
