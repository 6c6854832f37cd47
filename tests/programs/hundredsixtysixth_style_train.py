"""A hundred-and-sixty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtysixth-*): an ESPnet2 ASR fine-tuning recipe
(`python -m espnet2.bin.asr_train`, egs2/TEMPLATE/asr1's stage 11) re-created in plain torch
without espnet installed: a small CTC acoustic model (ESPnet's DefaultFrontend of STFT and
log-mel, GlobalMVN from the collected feature statistics, a TransformerEncoder with a conv2d
input layer, a CTC head over a character token list) whose encoder is initialised from a model
pretrained elsewhere (`--init_param exp/asr_pretrained/valid.loss.ave.pth:encoder:encoder`) and
fine-tuned on a small command vocabulary. Each node's recipe folder links this file as
asr_train.py; a user's script starts one torchrun agent per node with GNU parallel.

As in ESPnet2 (espnet2/tasks/abs_task.py, espnet2/train/trainer.py, espnet2/train/reporter.py):
the command line printed to stderr by every process first; `--config` YAML values as the
parser's defaults; RANK/WORLD_SIZE from the launcher's environment when
--multiprocessing_distributed false; logging.basicConfig with
'[{host}:{rank}/{world}] %(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s' on rank 0
at --log_level and at ERROR on every other rank (so only rank 0's INFO lines show, and any
rank's errors); the versions line, the model structure and 'Model summary:', the optimizer and
scheduler, 'Saving the configuration in ...', 'Loading pretrained params from ...', the
datasets, batch samplers and 'mini-batch sizes summary'; the sorted batches split
batch[rank::world]; a DataLoader with --num_workers 1; the iterator_stop all-reduce before every
step; the stats all-reduced by recursive_average; the reporter's
'1epoch:train:3-4batch: iter_time=..., loss_ctc=..., grad_norm=...' lines every --log_interval
steps, '1epoch results: [train] ..., [valid] loss_ctc=..., cer_ctc=..., time=..., total_count=..',
'The best model has been updated: valid.loss', 'The model files were removed: ...', 'The grad
norm is nan. Skipping updating the model.', '[Early stopping] valid.cer_ctc has not been improved
2 epochs continuously. The training was stopped at 3epoch', 'The training was finished at 3
epochs ', 'Averaging 2best models: criterion="valid.loss": ...'; no destroy_process_group at the
end. autocast and GradScaler come from torch.cuda.amp as ESPnet imports them (torch's
FutureWarning on every rank). This single file names each line's ESPnet module in
%(module)s by its logger (trainer, abs_task, reporter, ...). The lab's patch passes
`dist_timeout` from the config to init_process_group (ESPnet passes none).

`python asr_train.py prepare DIR` writes the recipe folder a node has before training (a
stand-in for stages 1-10): conf/train_asr_ctc_ft.yaml, dump/raw/{train_nodev,train_all,dev}/
(wav.scp, text, synthetic 16 kHz WAV files), exp/asr_stats_raw_en_char/{train,valid}/
(speech_shape, text_shape.char, feats_stats.npz), data/en_token_list/char/tokens.txt and the
pretrained model exp/asr_pretrained/{valid.loss.ave.pth,checkpoint.pth}.
`python asr_train.py utts-of RANK WORLD SHAPE_FILE` prints the utterances that rank reads.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a global rank)
and never printed (re-capture with tests/fixtures/real/capture_hundredsixtysixth.sh after any
edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import wave
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed
import torch.nn as nn
import yaml
from torch.distributed import ReduceOp
from torch.utils.data import DataLoader, Dataset

# espnet's requirement humanfriendly is installed in each node's tools/; autocast and
# GradScaler come from torch.cuda.amp as espnet2/train/trainer.py imports them
if sys.argv[1:2] not in (["prepare"], ["utts-of"]):
    import humanfriendly
    from torch.cuda.amp import GradScaler, autocast

CASE = os.environ.get("MT_CASE", "")
RANK = int(os.environ.get("RANK", "0"))
WORDS = ["YES", "NO", "UP", "DOWN", "LEFT", "RIGHT", "ON", "OFF", "STOP", "GO"]
FS = 16000
LEAK: list[torch.Tensor] = []

abs_task = logging.getLogger("abs_task")
asr_task = logging.getLogger("asr")
trainer_log = logging.getLogger("trainer")
reporter_log = logging.getLogger("reporter")
ave_log = logging.getLogger("average_nbest_models")
pre_log = logging.getLogger("load_pretrained_model")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


class ModuleName(logging.Filter):
    """ESPnet logs through the root logger from many modules; in this single file each
    component's logger carries the name of the ESPnet module it stands for."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root":
            record.module = record.name
        return True


def get_commandline_args() -> str:
    extra_chars = [" ", ";", "&", "(", ")", "|", "^", "<", ">", "?", "*", "[", "]", "$", "`"]
    extra_chars += ['"', "\\", "!", "{", "}"]
    argv = [
        arg.replace("'", "'\\''")
        if all(char not in arg for char in extra_chars)
        else "'" + arg.replace("'", "'\\''") + "'"
        for arg in sys.argv
    ]
    return sys.executable + " " + " ".join(argv)


# ------------------------------------------------------------------ data preparation (stages 1-10)
def synth(text: str, rng: random.Random, seconds: float | None = None) -> np.ndarray:
    """A tone per letter (100 ms each), silence around, some noise."""
    parts = [np.zeros(int(0.1 * FS))]
    for ch in text:
        n = int(0.1 * FS)
        f = 200.0 + 40.0 * (ord(ch) - 32)
        t = np.arange(n) / FS
        parts.append(0.3 * np.sin(2 * np.pi * f * t + rng.random()))
    parts.append(np.zeros(int(0.1 * FS)))
    x = np.concatenate(parts)
    if seconds is not None:
        x = x[: int(seconds * FS)]
    noise = np.array([rng.gauss(0, 0.01) for _ in range(len(x))])
    return np.clip(x + noise, -1, 1)


def write_wav(path: Path, x: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(FS)
        w.writeframes((x * 32767).astype(np.int16).tobytes())


def prepare(root: Path) -> None:
    rng = random.Random(7)
    sets: dict[str, list[tuple[str, str, np.ndarray]]] = {}
    for name, count, spk0 in (("train_nodev", 64, 1), ("dev", 16, 9)):
        rows = []
        for i in range(count):
            spk = spk0 + i % 4
            text = " ".join(rng.choice(WORDS) for _ in range(rng.choice((1, 1, 2))))
            rows.append((f"spk{spk:02d}-cmd-{i:04d}", text, synth(text, rng)))
        sets[name] = rows
    extra = []  # the newest session's utterances, one clip cut short by the segmenter
    for i in range(8):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.choice((1, 2))))
        extra.append((f"spk13-cmd-{i:04d}", text, synth(text, rng)))
    extra[3] = (extra[3][0], "RIGHT LEFT", synth("RIGHT LEFT", rng, seconds=0.1))
    sets["train_all"] = sets["train_nodev"] + extra
    for name, rows in sets.items():
        d = root / "dump" / "raw" / name
        (d / "data" / "format.1").mkdir(parents=True, exist_ok=True)
        with open(d / "wav.scp", "w") as scp, open(d / "text", "w") as txt:
            for uid, text, x in rows:
                rel = d / "data" / "format.1" / f"{uid}.wav"
                write_wav(rel, x)
                scp.write(f"{uid} {rel.relative_to(root)}\n")
                txt.write(f"{uid} {text}\n")
        stats = root / "exp" / "asr_stats_raw_en_char" / ("valid" if name == "dev" else name)
        if name == "train_nodev":
            stats = stats.parent / "train"
        stats.mkdir(parents=True, exist_ok=True)
        with open(stats / "speech_shape", "w") as f:
            for uid, _, x in rows:
                f.write(f"{uid} {len(x)}\n")
        with open(stats / "text_shape.char", "w") as f:
            for uid, text, _ in rows:
                f.write(f"{uid} {len(text)},31\n")
    tokens = ["<blank>", "<unk>", "<space>"] + [chr(c) for c in range(65, 91)] + ["<sos/eos>"]
    tok = root / "data" / "en_token_list" / "char"
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "tokens.txt").write_text("\n".join(tokens) + "\n")
    # feats_stats.npz as collect_stats leaves it: count, sum, sum_square of the log-mel
    frontend = DefaultFrontend(n_fft=256, hop_length=128, n_mels=20)
    count, s, ss = 0, torch.zeros(20), torch.zeros(20)
    for _, _, x in sets["train_nodev"]:
        feats, _ = frontend(torch.tensor(x, dtype=torch.float32)[None], torch.tensor([len(x)]))
        count += feats.size(1)
        s += feats[0].sum(0)
        ss += (feats[0] ** 2).sum(0)
    np.savez(
        root / "exp" / "asr_stats_raw_en_char" / "train" / "feats_stats.npz",
        count=np.array(count),
        sum=s.numpy(),
        sum_square=ss.numpy(),
    )
    # the model pretrained on other data: its averaged weights and its last checkpoint.pth
    torch.manual_seed(3)
    pre = root / "exp" / "asr_pretrained"
    pre.mkdir(parents=True, exist_ok=True)
    enc = TransformerEncoder(20, output_size=32, attention_heads=2, linear_units=64, num_blocks=2)
    state = {f"encoder.{k}": v for k, v in enc.state_dict().items()}
    torch.save(state, pre / "valid.loss.ave.pth")
    reporter = {
        "stats": {
            e: {
                "train": {"loss": 40.0 / e, "time": timedelta(seconds=61.2), "total_count": 1200},
                "valid": {"loss": 44.0 / e, "time": timedelta(seconds=5.1), "total_count": 80},
            }
            for e in (1, 2, 3)
        },
        "epoch": 3,
    }
    torch.save({"model": state, "reporter": reporter}, pre / "checkpoint.pth")
    conf = root / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "train_asr_ctc_ft.yaml").write_text(CONFIG)


CONFIG = """\
# fine-tuning of the an4 CTC encoder on the command set (char tokens)
batch_type: sorted
batch_size: 8
max_epoch: 3
patience: null
log_interval: 2
num_workers: 1
seed: 0
keep_nbest_models: 2
best_model_criterion:
-   - valid
    - loss
    - min
optim: adam
optim_conf:
    lr: 0.002
grad_clip: 5.0
frontend: default
frontend_conf:
    n_fft: 256
    hop_length: 128
    n_mels: 20
normalize: global_mvn
encoder: transformer
encoder_conf:
    output_size: 32
    attention_heads: 2
    linear_units: 64
    num_blocks: 2
    input_layer: conv2d
model_conf:
    ctc_weight: 1.0
ctc_conf:
    zero_infinity: true
# lab patch: init_process_group(timeout=...) in seconds (espnet passes none)
dist_timeout: 20
"""


# ------------------------------------------------------------------ espnet2.asr
class DefaultFrontend(nn.Module):
    """STFT power spectrum and a log-mel filterbank."""

    def __init__(self, fs: int = FS, n_fft: int = 256, hop_length: int = 128, n_mels: int = 20):
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        self.register_buffer("melmat", self.mel(fs, n_fft, n_mels), persistent=False)

    @staticmethod
    def mel(fs: int, n_fft: int, n_mels: int) -> torch.Tensor:
        def hz2mel(f: np.ndarray) -> np.ndarray:
            return 2595.0 * np.log10(1.0 + f / 700.0)

        pts = 700.0 * (10 ** (np.linspace(0, hz2mel(np.array(fs / 2)), n_mels + 2) / 2595.0) - 1)
        bins = np.fft.rfftfreq(n_fft, 1.0 / fs)
        m = np.zeros((n_fft // 2 + 1, n_mels), dtype=np.float32)
        for i in range(n_mels):
            lo, c, hi = pts[i], pts[i + 1], pts[i + 2]
            m[:, i] = np.maximum(0, np.minimum((bins - lo) / (c - lo), (hi - bins) / (hi - c)))
        return torch.from_numpy(m)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec = torch.stft(
            x,
            self.n_fft,
            self.hop_length,
            window=torch.hann_window(self.n_fft),
            center=True,
            return_complex=True,
        )
        power = spec.abs().pow(2).transpose(1, 2)
        feats = torch.log(torch.clamp(power @ self.melmat, min=1e-10))
        return feats, lengths // self.hop_length + 1


class GlobalMVN(nn.Module):
    def __init__(self, stats_file: str):
        super().__init__()
        self.stats_file = stats_file
        stats = np.load(stats_file)
        count = float(stats["count"])
        mean = stats["sum"] / count
        var = stats["sum_square"] / count - mean * mean
        self.register_buffer("mean", torch.from_numpy(mean).float())
        self.register_buffer("std", torch.from_numpy(np.sqrt(np.maximum(var, 1e-20))).float())

    def extra_repr(self) -> str:
        return f"stats_file={self.stats_file}, norm_means=True, norm_vars=True"

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x - self.mean) / self.std, lengths


class Conv2dSubsampling(nn.Module):
    def __init__(self, idim: int, odim: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, odim, 3, 2), nn.ReLU(), nn.Conv2d(odim, odim, 3, 2), nn.ReLU()
        )
        self.out = nn.Sequential(nn.Linear(odim * (((idim - 1) // 2 - 1) // 2), odim))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))
        b, c, t, f = x.size()
        x = self.out(x.transpose(1, 2).contiguous().view(b, t, c * f))
        return x, ((lengths - 1) // 2 - 1) // 2


class TransformerEncoder(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int = 256,
        attention_heads: int = 4,
        linear_units: int = 2048,
        num_blocks: int = 6,
        input_layer: str = "conv2d",
    ):
        super().__init__()
        self._output_size = output_size
        self.embed = Conv2dSubsampling(input_size, output_size)
        self.encoders = nn.ModuleList(
            nn.TransformerEncoderLayer(
                output_size, attention_heads, linear_units, 0.1, batch_first=True, norm_first=True
            )
            for _ in range(num_blocks)
        )
        self.after_norm = nn.LayerNorm(output_size)

    def forward(self, xs: torch.Tensor, ilens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xs, olens = self.embed(xs, ilens)
        mask = torch.arange(xs.size(1))[None, :] >= olens[:, None]
        for layer in self.encoders:
            xs = layer(xs, src_key_padding_mask=mask)
        return self.after_norm(xs), olens


class CTC(nn.Module):
    def __init__(self, odim: int, encoder_output_size: int, zero_infinity: bool = True):
        super().__init__()
        self.ctc_lo = nn.Linear(encoder_output_size, odim)
        self.ctc_loss = nn.CTCLoss(reduction="none", zero_infinity=zero_infinity)

    def forward(
        self, hs: torch.Tensor, hlens: torch.Tensor, ys: torch.Tensor, ylens: torch.Tensor
    ) -> torch.Tensor:
        logp = self.ctc_lo(hs).log_softmax(2).transpose(0, 1)
        loss = self.ctc_loss(logp, ys, hlens, ylens)
        return loss.sum() / hs.size(0)

    def argmax(self, hs: torch.Tensor) -> torch.Tensor:
        return self.ctc_lo(hs).argmax(dim=2)


class SpecAug(nn.Module):
    """A fork's time masking: one mask of a fixed 60 frames on every utterance."""

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        width = 60  # tuned on the 10 s utterances of the pretraining data
        for i, n in enumerate(lengths.tolist()):
            start = int(torch.randint(0, int(n) - width, (1,)))
            x[i, start : start + width] = 0.0
        return x


class ESPnetASRModel(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        token_list: list[str],
        frontend: DefaultFrontend,
        normalize: GlobalMVN,
        encoder: TransformerEncoder,
        ctc: CTC,
    ):
        super().__init__()
        self.blank_id, self.vocab_size = 0, vocab_size
        self.token_list = token_list
        self.frontend, self.normalize, self.encoder, self.ctc = frontend, normalize, encoder, ctc
        self.specaug = SpecAug()
        self.epoch = 0

    def forward(
        self,
        speech: torch.Tensor,
        speech_lengths: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None], torch.Tensor]:
        batch_size = speech.size(0)
        feats, feats_lengths = self.frontend(speech, speech_lengths)
        if self.training and fault("a", RANK) and self.epoch >= 2:
            feats = self.specaug(feats, feats_lengths)
        feats, feats_lengths = self.normalize(feats, feats_lengths)
        hs, hlens = self.encoder(feats, feats_lengths)
        ys = text[text != -1]
        loss_ctc = self.ctc(hs, hlens, ys, text_lengths)
        cer_ctc = None
        if not self.training:
            cer_ctc = self.cer(self.ctc.argmax(hs), hlens, text, text_lengths)
        stats: dict[str, torch.Tensor | None] = dict(
            loss_ctc=loss_ctc.detach()[None], cer_ctc=cer_ctc, loss=loss_ctc.detach()[None]
        )
        if self.training and fault("m", RANK) and self.epoch >= 2:
            # a fork's intermediate CTC, logged only where the batch has a long utterance
            stats["loss_interctc"] = loss_ctc.detach()[None] * 0.3
        weight = torch.tensor([batch_size], dtype=torch.float32)
        return loss_ctc, stats, weight

    def cer(
        self, ys_hat: torch.Tensor, hlens: torch.Tensor, ys: torch.Tensor, ylens: torch.Tensor
    ) -> torch.Tensor:
        errs, total = 0, 0
        for hyp, n, ref, m in zip(
            ys_hat.tolist(), hlens.tolist(), ys.tolist(), ylens.tolist(), strict=True
        ):
            seq, prev = [], -1
            for t in hyp[:n]:
                if t != prev and t != self.blank_id:
                    seq.append(t)
                prev = t
            space = self.token_list.index("<space>")
            seq = [t for t in seq if t != space]
            r = [t for t in ref[:m] if t != space]
            errs += edit_distance(seq, r)
            total += len(r)
        return torch.tensor([errs / max(total, 1)])


def edit_distance(a: list[int], b: list[int]) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


# ------------------------------------------------------------------ espnet2.train.dataset, samplers
def read_wav(path: str) -> np.ndarray:
    with wave.open(path, "rb") as w:
        frames = w.readframes(w.getnframes())
    return np.frombuffer(frames, dtype=np.int16).astype(np.float32) / 32768.0


class FeatsCache:
    """A fork's cache of decoded audio, written out to the node's scratch at each epoch's
    start by a background thread (its lock held while it writes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, np.ndarray] = {}

    def flush_async(self) -> None:
        held = threading.Event()

        def write() -> None:
            with self.lock:
                held.set()
                time.sleep(3.0)

        threading.Thread(target=write, name="feats-cache-flush", daemon=True).start()
        held.wait()


class CommonPreprocessor:
    def __init__(self, token_list: list[str]):
        self.token2id = {t: i for i, t in enumerate(token_list)}

    def __call__(self, uid: str, data: dict[str, Any]) -> dict[str, Any]:
        text = data["text"]
        tokens = ["<space>" if c == " " else c for c in text]
        data["text"] = np.array([self.token2id.get(t, 1) for t in tokens], dtype=np.int64)
        return data


class ESPnetDataset(Dataset[tuple[str, dict[str, np.ndarray]]]):
    def __init__(self, path_name_type_list: list[str], preprocess: CommonPreprocessor):
        self.preprocess = preprocess
        self.debug_info: dict[str, tuple[str, str]] = {}
        self.loaders: dict[str, dict[str, str]] = {}
        for spec in path_name_type_list:
            path, name, _type = spec.split(",")
            self.debug_info[name] = (path, _type)
            with open(path) as f:
                self.loaders[name] = dict(line.rstrip("\n").split(" ", 1) for line in f)
        self.cache: FeatsCache | None = FeatsCache() if fault("h", RANK) else None

    def __repr__(self) -> str:
        mes = self.__class__.__name__ + "("
        for name, (path, _type) in self.debug_info.items():
            mes += f'\n  {name}: {{"path": "{path}", "type": "{_type}"}}'
        mes += f"\n  preprocess: {self.preprocess})"
        return mes

    def __getitem__(self, uid: str) -> tuple[str, dict[str, np.ndarray]]:
        data: dict[str, Any] = {}
        for name, loader in self.loaders.items():
            value = loader[uid]
            if self.debug_info[name][1] == "sound":
                if self.cache is not None:
                    with self.cache.lock:
                        if uid not in self.cache.items:
                            self.cache.items[uid] = read_wav(value)
                        data[name] = self.cache.items[uid]
                else:
                    data[name] = read_wav(value)
            else:
                data[name] = value
        return uid, self.preprocess(uid, data)

    def __len__(self) -> int:
        return len(next(iter(self.loaders.values())))


def common_collate_fn(
    data: list[tuple[str, dict[str, np.ndarray]]],
) -> tuple[list[str], dict[str, torch.Tensor]]:
    uttids = [u for u, _ in data]
    out: dict[str, torch.Tensor] = {}
    for key, pad in (("speech", 0.0), ("text", -1)):
        arrays = [torch.from_numpy(d[key]) for _, d in data]
        out[key] = nn.utils.rnn.pad_sequence(arrays, batch_first=True, padding_value=pad)
        out[f"{key}_lengths"] = torch.tensor([len(a) for a in arrays], dtype=torch.long)
    return uttids, out


class SortedBatchSampler:
    def __init__(self, batch_size: int, shape_file: str, sort_in_batch: str, sort_batch: str):
        self.batch_size, self.shape_file = batch_size, shape_file
        self.sort_in_batch, self.sort_batch = sort_in_batch, sort_batch
        with open(shape_file) as f:
            utt2len = {k: int(v.split(",")[0]) for k, v in (ln.split() for ln in f)}
        keys = sorted(utt2len, key=lambda k: utt2len[k])
        self.batch_list = [
            tuple(reversed(keys[i : i + batch_size]))
            if sort_in_batch == "descending"
            else tuple(keys[i : i + batch_size])
            for i in range(0, len(keys), batch_size)
        ]
        if sort_batch == "descending":
            self.batch_list.reverse()

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(N-batch={len(self)}, batch_size={self.batch_size}, "
            f"shape_file={self.shape_file}, sort_in_batch={self.sort_in_batch}, "
            f"sort_batch={self.sort_batch})"
        )

    def __len__(self) -> int:
        return len(self.batch_list)

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return iter(self.batch_list)


class SequenceIterFactory:
    def __init__(
        self,
        dataset: ESPnetDataset,
        batches: list[tuple[str, ...]],
        seed: int,
        shuffle: bool,
        num_workers: int,
    ):
        self.dataset, self.batches, self.seed = dataset, batches, seed
        self.shuffle, self.num_workers = shuffle, num_workers

    def build_iter(self, epoch: int) -> DataLoader[Any]:
        batches = list(self.batches)
        if self.shuffle:
            np.random.RandomState(epoch + self.seed).shuffle(batches)  # type: ignore[arg-type]
        if self.dataset.cache is not None and epoch >= 2:
            self.dataset.cache.flush_async()
        return DataLoader(
            dataset=self.dataset,
            batch_sampler=batches,  # type: ignore[arg-type]
            num_workers=self.num_workers,
            collate_fn=common_collate_fn,
        )


def rank_batches(args: argparse.Namespace, mode: str, rank: int, world: int) -> Any:
    shape = args.train_shape_file[0] if mode == "train" else args.valid_shape_file[0]
    sampler = SortedBatchSampler(args.batch_size, shape, "descending", "ascending")
    batches = list(sampler)
    return sampler, batches, [b[rank::world] for b in batches]


# ------------------------------------------------------------------ espnet2.torch_utils
def recursive_sum(obj: Any, weight: torch.Tensor, distributed: bool) -> Any:
    if isinstance(obj, dict):
        return {k: recursive_sum(v, weight, distributed) for k, v in obj.items()}
    if obj is None:
        return None
    obj = (obj * weight.type(obj.dtype)).sum()
    if distributed:
        torch.distributed.all_reduce(obj, op=ReduceOp.SUM)
    return obj


def recursive_average(obj: Any, weight: torch.Tensor, distributed: bool) -> Any:
    obj = recursive_sum(obj, weight, distributed)
    weight = weight.sum()
    if distributed:
        torch.distributed.all_reduce(weight, op=ReduceOp.SUM)
    return {k: v / weight for k, v in obj.items()}, weight


def set_all_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.random.manual_seed(seed)


def model_summary(model: nn.Module) -> str:
    def count(n: int) -> str:
        labels = [" ", "K", "M", "B", "T"]
        digits = int(np.floor(np.log10(n)) + 1 if n > 0 else 1)
        groups = min(int(np.ceil(digits / 3)), len(labels))
        return f"{n * 10 ** (-3 * (groups - 1)):.2f} {labels[groups - 1]}"

    tot = sum(p.numel() for p in model.parameters())
    num = sum(p.numel() for p in model.parameters() if p.requires_grad)
    message = "Model structure:\n" + str(model)
    message += "\n\nModel summary:\n"
    message += f"    Class Name: {model.__class__.__name__}\n"
    message += f"    Total Number of model parameters: {count(tot)}\n"
    message += f"    Number of trainable parameters: {count(num)} ({num * 100.0 / tot:.1f}%)\n"
    message += f"    Size: {humanfriendly.format_size(num * 4)}\n"
    message += f"    Type: {next(iter(model.parameters())).dtype}"
    return message


def load_pretrained_model(init_param: str, model: nn.Module, ignore_init_mismatch: bool) -> None:
    sps = init_param.split(":", 4)
    path, src_key, dst_key = [*sps, None, None][:3]
    obj = model
    if dst_key:
        for k in dst_key.split("."):
            obj = getattr(obj, k)
    src_state = torch.load(path, map_location="cpu")
    if src_key:
        src_state = {
            k[len(src_key) + 1 :]: v for k, v in src_state.items() if k.startswith(src_key)
        }
    dst_state = obj.state_dict()
    if ignore_init_mismatch:
        for key in list(src_state):
            if key not in dst_state:
                pre_log.warning(
                    f"Filter out {key} from pretrained dict because of name not found in target dict"
                )
                src_state.pop(key)
    dst_state.update(src_state)
    obj.load_state_dict(dst_state)


# ------------------------------------------------------------------ espnet2.train.reporter
class SubReporter:
    def __init__(self, key: str, epoch: int, total_count: int):
        self.key, self.epoch, self.total_count = key, epoch, total_count
        self.count = 0
        self.stats: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.start_time = time.perf_counter()
        self._seen: set[str] = set()

    def next(self) -> None:
        self._seen = set()

    def register(self, stats: dict[str, Any], weight: Any = None) -> None:
        if not self._seen:
            self.total_count += 1
            self.count += 1
        for key2, v in stats.items():
            if v is None:
                v = float("nan")
            value = float(v.item() if isinstance(v, torch.Tensor) else v)
            w = 1.0 if weight is None else float(weight)
            if key2 not in self.stats:
                self.stats[key2].extend((float("nan"), 0.0) for _ in range(self.count - 1))
            self.stats[key2].append((value, w))
            self._seen.add(key2)

    @staticmethod
    def aggregate(values: list[tuple[float, float]]) -> float:
        num = sum(v * w for v, w in values if not math.isnan(v) and w > 0)
        den = sum(w for v, w in values if not math.isnan(v) and w > 0)
        if den == 0:
            return float("nan")
        return num / den

    @staticmethod
    def fmt(key2: str, v: float) -> str:
        if abs(v) > 1.0e3:
            return f"{key2}={v:.3e}"
        if abs(v) > 1.0e-3:
            return f"{key2}={v:.3f}"
        return f"{key2}={v:.3e}"

    def log_message(self, start: int | None = None) -> str:
        start = 0 if start is None else (self.count + start if start < 0 else start)
        if self.count == 0 or start == self.count:
            return ""
        message = f"{self.epoch}epoch:{self.key}:{start + 1}-{self.count}batch: "
        parts = [self.fmt(k, self.aggregate(v[start:])) for k, v in self.stats.items()]
        return message + ", ".join(parts)

    @contextmanager
    def measure_time(self, name: str) -> Iterator[float]:
        start = time.perf_counter()
        yield start
        self.register({name: time.perf_counter() - start})

    def measure_iter_time(self, iterable: Any, name: str) -> Iterator[Any]:
        iterator = iter(iterable)
        while True:
            try:
                start = time.perf_counter()
                retval = next(iterator)
                self.register({name: time.perf_counter() - start})
                yield retval
            except StopIteration:
                break


class Reporter:
    def __init__(self) -> None:
        self.epoch = 0
        self.stats: dict[int, dict[str, dict[str, Any]]] = {}

    @contextmanager
    def observe(self, key: str) -> Iterator[SubReporter]:
        prev = self.stats.get(self.epoch - 1, {}).get(key, {}).get("total_count", 0)
        sub = SubReporter(key, self.epoch, prev)
        yield sub
        d: dict[str, Any] = {k: sub.aggregate(v) for k, v in sub.stats.items()}
        d["time"] = datetime.timedelta(seconds=time.perf_counter() - sub.start_time)
        d["total_count"] = sub.total_count
        self.stats.setdefault(self.epoch, {})[key] = d

    def log_message(self) -> str:
        message = ""
        for key, d in self.stats[self.epoch].items():
            parts = []
            for key2, v in d.items():
                if isinstance(v, float):
                    parts.append(SubReporter.fmt(key2, v))
                elif isinstance(v, datetime.timedelta):
                    parts.append(f"{key2}={humanfriendly.format_timespan(v)}")
                else:
                    parts.append(f"{key2}={v}")
            message += (f"{self.epoch}epoch results: " if not message else ", ") + f"[{key}] "
            message += ", ".join(parts)
        return message

    def sort_epochs_and_values(self, key: str, key2: str, mode: str) -> list[tuple[int, float]]:
        values = [(e, self.stats[e][key][key2]) for e in self.stats]
        return sorted(values, key=lambda x: x[1] if mode == "min" else -x[1])

    def get_best_epoch(self, key: str, key2: str, mode: str) -> int:
        return self.sort_epochs_and_values(key, key2, mode)[0][0]

    def check_early_stopping(self, patience: int, key1: str, key2: str, mode: str) -> bool:
        best_epoch = self.get_best_epoch(key1, key2, mode)
        if self.epoch - best_epoch > patience:
            reporter_log.info(
                f"[Early stopping] {key1}.{key2} has not been "
                f"improved {self.epoch - best_epoch} epochs continuously. "
                f"The training was stopped at {self.epoch}epoch"
            )
            return True
        return False


def average_nbest_models(
    output_dir: Path, reporter: Reporter, criterion: list[list[str]], nbest: int, suffix: str = ""
) -> None:
    for ph, cr, mode in criterion:
        epoch_and_values = reporter.sort_epochs_and_values(ph, cr, mode)[:nbest]
        op = output_dir / f"{ph}.{cr}.ave_{len(epoch_and_values)}best.{suffix}pth"
        ave_log.info(f'Averaging {len(epoch_and_values)}best models: criterion="{ph}.{cr}": {op}')
        avg: dict[str, torch.Tensor] = {}
        for e, _ in epoch_and_values:
            if fault("s", RANK):  # the shared disk's NFS server stalls under the other jobs
                time.sleep(45)
            states = torch.load(output_dir / f"{e}epoch.pth", map_location="cpu")
            for k, v in states.items():
                avg[k] = avg[k] + v if k in avg else v.clone()
        for k in avg:
            if avg[k].is_floating_point():
                avg[k] /= len(epoch_and_values)
        torch.save(avg, op)
        sym = output_dir / f"{ph}.{cr}.ave.pth"
        if sym.is_symlink() or sym.exists():
            sym.unlink()
        sym.symlink_to(op.name)


# ------------------------------------------------------------------ espnet2.train.trainer
def train_one_epoch(
    model: nn.Module,
    iterator: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    reporter: SubReporter,
    args: argparse.Namespace,
    distributed: bool,
) -> bool:
    model.train()
    all_steps_are_invalid = True
    iterator_stop = torch.tensor(0)
    start_time = time.perf_counter()
    for iiter, (_utt_id, batch) in enumerate(reporter.measure_iter_time(iterator, "iter_time"), 1):
        if distributed:
            torch.distributed.all_reduce(iterator_stop, ReduceOp.SUM)
            if iterator_stop > 0:
                break
        if fault("k", RANK) and reporter.epoch >= 2:  # a fork keeps every batch's features
            LEAK.append(torch.ones(16 << 20))
            if len(LEAK) >= 5:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), signal.SIGKILL)
        if fault("z", RANK) and reporter.epoch >= 2 and iiter == 3:
            ctypes.string_at(0)  # the compiled CTC extension reads a freed workspace
        with autocast(scaler is not None):
            with reporter.measure_time("forward_time"):
                loss, stats, weight = model(**batch)
            stats = {k: v for k, v in stats.items() if v is not None}
            loss = (loss * weight.type(loss.dtype)).sum()
            stats, weight = recursive_average(stats, weight, distributed)
            loss /= weight
            if distributed:
                loss *= torch.distributed.get_world_size()
        reporter.register(stats, weight)
        with reporter.measure_time("backward_time"):
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        del loss
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.grad_clip)
        if not torch.isfinite(grad_norm):
            trainer_log.warning(f"The grad norm is {grad_norm}. Skipping updating the model.")
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
        else:
            reporter.register(
                {
                    "grad_norm": grad_norm,
                    "clip": 100.0 if grad_norm > args.grad_clip else 0.0,
                    "loss_scale": scaler.get_scale() if scaler else 1.0,
                }
            )
            all_steps_are_invalid = False
            with reporter.measure_time("optim_step_time"):
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
        optimizer.zero_grad()
        reporter.register(
            {
                **{f"optim0_lr{j}": pg["lr"] for j, pg in enumerate(optimizer.param_groups)},
                "train_time": time.perf_counter() - start_time,
            }
        )
        start_time = time.perf_counter()
        reporter.next()
        if iiter % args.log_interval == 0:
            trainer_log.info(reporter.log_message(-args.log_interval))
    else:
        if distributed:
            iterator_stop.fill_(1)
            torch.distributed.all_reduce(iterator_stop, ReduceOp.SUM)
    return all_steps_are_invalid


@torch.no_grad()
def validate_one_epoch(
    model: nn.Module, iterator: DataLoader[Any], reporter: SubReporter, distributed: bool
) -> None:
    model.eval()
    iterator_stop = torch.tensor(0)
    for _utt_id, batch in iterator:
        if distributed:
            torch.distributed.all_reduce(iterator_stop, ReduceOp.SUM)
            if iterator_stop > 0:
                break
        _, stats, weight = model(**batch)
        stats = {k: v for k, v in stats.items() if v is not None}
        stats, weight = recursive_average(stats, weight, distributed)
        reporter.register(stats, weight)
        reporter.next()
    else:
        if distributed:
            iterator_stop.fill_(1)
            torch.distributed.all_reduce(iterator_stop, ReduceOp.SUM)


def run_trainer(
    args: argparse.Namespace,
    model: ESPnetASRModel,
    optimizer: torch.optim.Optimizer,
    train_iter: SequenceIterFactory,
    valid_iter: SequenceIterFactory,
    distributed: bool,
    rank: int,
) -> None:
    output_dir = Path(args.output_dir)
    reporter = Reporter()
    scaler = GradScaler() if args.use_amp else None
    if args.resume and (output_dir / "checkpoint.pth").exists():
        states = torch.load(output_dir / "checkpoint.pth", map_location="cpu")
        model.load_state_dict(states["model"])
        optimizer.load_state_dict(states["optimizers"][0])
        reporter.stats, reporter.epoch = states["reporter"]["stats"], states["reporter"]["epoch"]
        trainer_log.info(f"The training was resumed using {output_dir / 'checkpoint.pth'}")
    start_epoch = reporter.epoch + 1
    if start_epoch == args.max_epoch + 1:
        trainer_log.warning(f"The training has already reached at max_epoch: {start_epoch}")
    dp_model: nn.Module = model
    if distributed:
        dp_model = torch.nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=args.unused_parameters, gradient_as_bucket_view=True
        )
    start_time = time.perf_counter()
    for iepoch in range(start_epoch, args.max_epoch + 1):
        if iepoch != start_epoch:
            trainer_log.info(
                "{}/{}epoch started. Estimated time to finish: {}".format(
                    iepoch,
                    args.max_epoch,
                    humanfriendly.format_timespan(
                        (time.perf_counter() - start_time)
                        / (iepoch - start_epoch)
                        * (args.max_epoch - iepoch + 1)
                    ),
                )
            )
        else:
            trainer_log.info(f"{iepoch}/{args.max_epoch}epoch started")
        set_all_random_seed(args.seed + iepoch)
        reporter.epoch = model.epoch = iepoch
        torch.cuda.empty_cache()
        with reporter.observe("train") as sub_reporter:
            all_steps_are_invalid = train_one_epoch(
                dp_model,
                train_iter.build_iter(iepoch),
                optimizer,
                scaler,
                sub_reporter,
                args,
                distributed,
            )
        torch.cuda.empty_cache()
        with reporter.observe("valid") as sub_reporter:
            validate_one_epoch(dp_model, valid_iter.build_iter(iepoch), sub_reporter, distributed)
        stop_here = False
        if rank == 0:
            trainer_log.info(reporter.log_message())
            model_state_dict = model.state_dict()
            torch.save(
                {
                    "model": model_state_dict,
                    "reporter": {"stats": reporter.stats, "epoch": reporter.epoch},
                    "optimizers": [optimizer.state_dict()],
                    "schedulers": [None],
                    "scaler": scaler.state_dict() if scaler is not None else None,
                },
                output_dir / "checkpoint.pth",
            )
            torch.save(model_state_dict, output_dir / f"{iepoch}epoch.pth")
            p = output_dir / "latest.pth"
            if p.is_symlink() or p.exists():
                p.unlink()
            p.symlink_to(f"{iepoch}epoch.pth")
            improved = []
            for ph, k, mode in args.best_model_criterion:
                if reporter.get_best_epoch(ph, k, mode) == iepoch:
                    p = output_dir / f"{ph}.{k}.best.pth"
                    if p.is_symlink() or p.exists():
                        p.unlink()
                    p.symlink_to(f"{iepoch}epoch.pth")
                    improved.append(f"{ph}.{k}")
            if not improved:
                trainer_log.info("There are no improvements in this epoch")
            else:
                trainer_log.info("The best model has been updated: " + ", ".join(improved))
            nbests = set().union(
                *[
                    {e for e, _ in reporter.sort_epochs_and_values(ph, k, m)[: args.keep_nbest]}
                    for ph, k, m in args.best_model_criterion
                ]
            )
            if args.nbest_averaging_interval > 0 and iepoch % args.nbest_averaging_interval == 0:
                average_nbest_models(
                    output_dir,
                    reporter,
                    args.best_model_criterion,
                    args.keep_nbest,
                    suffix=f"till{iepoch}epoch.",
                )
            removed = []
            for e in range(1, iepoch):
                p = output_dir / f"{e}epoch.pth"
                if p.exists() and e not in nbests:
                    p.unlink()
                    removed.append(str(p))
            if removed:
                trainer_log.info("The model files were removed: " + ", ".join(removed))
            if fault("u", RANK) and args.patience is not None:
                # a fork checks the early stopping where the epoch's results are reported
                stop_here = reporter.check_early_stopping(
                    args.patience, *args.early_stopping_criterion
                )
        if all_steps_are_invalid:
            trainer_log.warning(
                "The gradients at all steps are invalid in this epoch. "
                f"Something seems wrong. This training was stopped at {iepoch}epoch"
            )
            break
        if stop_here:
            break
        if (
            args.patience is not None
            and not fault("u", 0)
            and reporter.check_early_stopping(args.patience, *args.early_stopping_criterion)
        ):
            break
    else:
        trainer_log.info(f"The training was finished at {args.max_epoch} epochs ")
    if rank == 0:
        average_nbest_models(output_dir, reporter, args.best_model_criterion, args.keep_nbest)


# ------------------------------------------------------------------ espnet2.tasks (abs_task, asr)
def build_model(args: argparse.Namespace) -> ESPnetASRModel:
    with open(args.token_list) as f:
        token_list = [line.rstrip() for line in f]
    vocab_size = len(token_list)
    asr_task.info(f"Vocabulary size: {vocab_size}")
    frontend = DefaultFrontend(**args.frontend_conf)
    normalize = GlobalMVN(**args.normalize_conf)
    encoder = TransformerEncoder(args.frontend_conf["n_mels"], **args.encoder_conf)
    ctc = CTC(vocab_size, encoder._output_size, **args.ctc_conf)
    return ESPnetASRModel(vocab_size, token_list, frontend, normalize, encoder, ctc)


def build_iter_factory(
    args: argparse.Namespace, mode: str, distributed: bool
) -> SequenceIterFactory:
    with open(args.token_list) as f:
        token_list = [line.rstrip() for line in f]
    spec = args.train_data_path_and_name_and_type
    if mode == "valid":
        spec = args.valid_data_path_and_name_and_type
    dataset = ESPnetDataset(spec, CommonPreprocessor(token_list))
    world = torch.distributed.get_world_size() if distributed else 1
    rank = torch.distributed.get_rank() if distributed else 0
    sampler, batches, mine = rank_batches(args, mode, rank, world)
    bs_list = [len(b) for b in batches]
    abs_task.info(f"[{mode}] dataset:\n{dataset}")
    abs_task.info(f"[{mode}] Batch sampler: {sampler}")
    abs_task.info(
        f"[{mode}] mini-batch sizes summary: N-batch={len(bs_list)}, "
        f"mean={np.mean(bs_list):.1f}, min={np.min(bs_list)}, max={np.max(bs_list)}"
    )
    if distributed:
        for batch in batches:
            if len(batch) < world:
                raise RuntimeError(
                    f"The batch-size must be equal or more than world_size: {len(batch)} < {world}"
                )
    return SequenceIterFactory(dataset, mine, args.seed, mode == "train", args.num_workers)


def main_worker(args: argparse.Namespace) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1 and not args.multiprocessing_distributed
    rank = int(os.environ.get("RANK", "0")) if distributed else 0
    host = os.uname()[1].split(".")[0]
    if not distributed or rank == 0:
        _rank = "" if not distributed else f":{rank}/{world}"
        logging.basicConfig(
            level=args.log_level,
            format=f"[{host}{_rank}] %(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s",
        )
    else:
        # Suppress logging if RANK != 0
        logging.basicConfig(
            level="ERROR",
            format=f"[{host}:{rank}/{world}] %(asctime)s (%(module)s:%(lineno)d) %(levelname)s: "
            "%(message)s",
        )
    for handler in logging.getLogger().handlers:
        handler.addFilter(ModuleName())
    if distributed:
        torch.distributed.init_process_group(
            backend=args.dist_backend,
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            world_size=world,
            rank=rank,
            timeout=timedelta(seconds=args.dist_timeout) if args.dist_timeout else None,
        )
    set_all_random_seed(args.seed)
    model = build_model(args)
    optimizer = torch.optim.Adam(model.parameters(), **args.optim_conf)
    abs_task.info(
        f"pytorch.version={torch.__version__}, cuda.available={torch.cuda.is_available()}, "
        f"cudnn.version={torch.backends.cudnn.version()}, cudnn.benchmark=False, "
        "cudnn.deterministic=True"
    )
    abs_task.info(model_summary(model))
    abs_task.info(f"Optimizer:\n{optimizer}")
    abs_task.info("Scheduler: None")
    output_dir = Path(args.output_dir)
    if not distributed or rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        with (output_dir / "config.yaml").open("w", encoding="utf-8") as f:
            abs_task.info(f"Saving the configuration in {output_dir / 'config.yaml'}")
            yaml.safe_dump(
                {k: v for k, v in vars(args).items() if not k.startswith("_")},
                f,
                indent=4,
                sort_keys=False,
            )
    for p in args.init_param:
        abs_task.info(f"Loading pretrained params from {p}")
        load_pretrained_model(p, model, args.ignore_init_mismatch)
    train_iter = build_iter_factory(args, "train", distributed)
    valid_iter = build_iter_factory(args, "valid", distributed)
    run_trainer(args, model, optimizer, train_iter, valid_iter, distributed, rank)


def str2bool(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


def kv_dict(value: str) -> dict[str, Any]:
    """espnet2.utils.nested_dict_action: 'a=1,b=c' (or a YAML mapping) as a dict."""
    if "=" not in value:
        loaded: dict[str, Any] = yaml.safe_load(value)
        return loaded
    return {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in value.split(","))}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="base parser")
    p.add_argument("--config", help="Give config file in yaml format")
    p.add_argument("--log_level", type=lambda x: x.upper(), default="INFO")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--ngpu", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_workers", type=int, default=1)
    p.add_argument("--dist_backend", default="nccl")
    p.add_argument("--dist_timeout", type=int, default=None)
    p.add_argument("--multiprocessing_distributed", type=str2bool, default=False)
    p.add_argument("--unused_parameters", type=str2bool, default=False)
    p.add_argument("--use_preprocessor", type=str2bool, default=True)
    p.add_argument("--token_type", default="char")
    p.add_argument("--token_list", required=True)
    p.add_argument("--init_param", action="append", default=[])
    p.add_argument("--ignore_init_mismatch", type=str2bool, default=False)
    p.add_argument("--resume", type=str2bool, default=False)
    p.add_argument("--train_data_path_and_name_and_type", action="append", default=[])
    p.add_argument("--valid_data_path_and_name_and_type", action="append", default=[])
    p.add_argument("--train_shape_file", action="append", default=[])
    p.add_argument("--valid_shape_file", action="append", default=[])
    p.add_argument("--batch_type", default="folded")
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--max_epoch", type=int, default=40)
    p.add_argument("--patience", type=lambda x: None if x in ("none", "null") else int(x))
    p.add_argument("--early_stopping_criterion", nargs=3, default=["valid", "loss", "min"])
    p.add_argument("--best_model_criterion", type=json.loads, default=[["valid", "loss", "min"]])
    p.add_argument("--keep_nbest_models", dest="keep_nbest", type=int, default=10)
    p.add_argument("--nbest_averaging_interval", type=int, default=0)
    p.add_argument("--log_interval", type=int, default=None)
    p.add_argument("--grad_clip", type=float, default=5.0)
    p.add_argument("--use_amp", type=str2bool, default=False)
    p.add_argument("--optim", default="adadelta")
    p.add_argument("--optim_conf", type=kv_dict, default={})
    p.add_argument("--frontend", default="default")
    p.add_argument("--frontend_conf", type=kv_dict, default={})
    p.add_argument("--normalize", default=None)
    p.add_argument("--normalize_conf", type=kv_dict, default={})
    p.add_argument("--encoder", default="rnn")
    p.add_argument("--encoder_conf", type=kv_dict, default={})
    p.add_argument("--model_conf", type=kv_dict, default={})
    p.add_argument("--ctc_conf", type=kv_dict, default={})
    return p


def parse_args(cmd: list[str]) -> argparse.Namespace:
    """espnet2.utils.config_argparse: the --config YAML's values become the defaults."""
    parser = get_parser()
    pre, _ = parser.parse_known_args(cmd)
    if pre.config is not None:
        with open(pre.config) as f:
            conf = yaml.safe_load(f)
        if "keep_nbest_models" in conf:
            conf["keep_nbest"] = conf.pop("keep_nbest_models")
        parser.set_defaults(**conf)
    return parser.parse_args(cmd)


def main(cmd: list[str] | None = None) -> None:
    if sys.argv[1:2] == ["prepare"]:
        prepare(Path(sys.argv[2]))
        return
    if sys.argv[1:2] == ["utts-of"]:
        rank, world, shape = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        sampler = SortedBatchSampler(8, shape, "descending", "ascending")
        for b in sampler:
            print("\n".join(b[rank::world]))
        return
    print(get_commandline_args(), file=sys.stderr)
    args = parse_args(sys.argv[1:] if cmd is None else cmd)
    main_worker(args)


if __name__ == "__main__":
    main()
