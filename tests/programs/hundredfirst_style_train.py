"""A hundred-and-first training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfirst-*): speech recognition training in the way of NVIDIA NeMo's
examples/asr/asr_ctc/speech_to_text_ctc_bpe.py (a Conformer-CTC model with a BPE tokenizer,
Hydra config, exp_manager, PyTorch Lightning's Trainer), re-implemented in plain torch in one
file without nemo, hydra, omegaconf or lightning. Linked into a run's folder as
speech_to_text_ctc.py, it is at once

* the data preparation a NeMo user runs first (`python speech_to_text_ctc.py prepare`): the
  Hydra config conf/conformer_ctc_bpe.yaml, synthetic utterances of a small command vocabulary
  (16 kHz WAV files, 0.8-1.2 s) with their JSON-lines manifests data/asr_demo/train_manifest.json
  and dev_manifest.json ('audio_filepath', 'duration', 'text'), the same training audio as tarred
  shards data/asr_demo/tarred/audio_0.tar and audio_1.tar (the second one a later recording
  session with longer utterances) with tarred_audio_manifest.json ('shard_id') and per-shard
  CMVN statistics, and the tokenizer tokenizers/tokenizer_spe_bpe_v40/ (tokenizer.model,
  vocab.txt) that process_asr_text_tokenizer.py would have written;
* the training script, started as NeMo's are: `python speech_to_text_ctc.py
  --config-path=conf --config-name=conformer_ctc_bpe key=value ... trainer.devices=N` (one
  process; Hydra-like overrides, `_OP_`/`_CL_` for braces). It logs the composed config
  ('Hydra config: ...'), builds a Lightning-like Trainer ('GPU available: False, used: False'),
  runs exp_manager (log_dir exp_dir/name/<datetime version>, or exp_dir/name with
  resume_if_exists; 'nemo_log_globalrank-R_localrank-L.txt' for every rank, and for global rank
  0 'nemo_error_log.txt', 'lightning_logs.txt', 'cmd-args.log'), builds the model
  (EncDecCTCModelBPE: tokenizer, mel preprocessor, SpecAugment, a tiny Conformer-like encoder, a
  1x1 conv decoder, CTC loss, a WER metric synced across ranks) and its data loaders, and calls
  trainer.fit. There, as Lightning's _SubprocessScriptLauncher does, the process (local rank 0)
  re-launches the same command line for every other local rank (subprocess.Popen with
  LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment, the Hydra
  overrides 'hydra.run.dir=. hydra.job.name=train_ddp_process_K hydra.output_subdir=null'
  appended), every child writing to the same console, and watches them with a
  'child-process-observer' thread (every 5 s: '[rank: K] Child process with PID N terminated
  with code C. Forcefully terminating all other processes to avoid zombies 🧟', then SIGKILL to
  all). Every rank then joins a gloo process group (env://, 15 s timeout), wraps the model in DDP
  and trains with Lightning's loops, TQDM bars ('Epoch 0:  40%|████      | 2/5 [...]') from
  global rank 0, validation each epoch, a NeMo ModelCheckpoint on val_wer (rank 0 saves
  '...--val_wer=0.9821-epoch=1.ckpt' and '-last.ckpt', the .nemo at the end), optional
  EarlyStopping, and Lightning's SIGTERM handler ('[rank: 0] Received SIGTERM: 15', passed on to
  the children). trainer.num_nodes > 1 starts no second node: it is run on each node with
  NODE_RANK set, as Lightning expects without a cluster manager.

A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfirst.sh after any edit).
"""

from __future__ import annotations

import ctypes
import datetime
import io
import json
import logging
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import typing as tp
import warnings
import wave
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


LETTER, WHO = fault()
SAMPLE_RATE = 16000

# --------------------------------------------------------------------------------------------
# the checkout: config, synthetic data, tokenizer
# --------------------------------------------------------------------------------------------

CONFIG = """\
# It contains the default values for training a Conformer-CTC ASR model with CTC loss and
# sub-word encoding (a tiny one, for a CPU box).
name: "Conformer-CTC-BPE"

model:
  sample_rate: 16000
  log_prediction: true # enables logging sample predictions in the output during training
  ctc_reduction: 'mean_volume'
  skip_nan_grad: false

  train_ds:
    manifest_filepath: ???
    sample_rate: ${model.sample_rate}
    batch_size: 4 # you may increase batch_size if your memory allows
    shuffle: true
    num_workers: 0
    pin_memory: true
    max_duration: 16.7 # it is set for LibriSpeech, you may need to update it for your dataset
    min_duration: 0.1
    # tarred datasets
    is_tarred: false
    tarred_audio_filepaths: null
    shuffle_n: 64
    shard_strategy: "scatter"

  validation_ds:
    manifest_filepath: ???
    sample_rate: ${model.sample_rate}
    batch_size: 4
    shuffle: false
    num_workers: 0
    pin_memory: true

  test_ds:
    manifest_filepath: null
    sample_rate: ${model.sample_rate}
    batch_size: 4
    shuffle: false
    num_workers: 0
    pin_memory: true

  # recommend to use SPE Unigram tokenizer with small vocab size as 128 or 256 when using 4x sub-sampling
  tokenizer:
    dir: ???  # path to directory which contains either tokenizer.model (bpe) or vocab.txt (wpe)
    type: bpe  # Can be either bpe (SentencePiece tokenizer) or wpe (WordPiece tokenizer)

  preprocessor:
    _target_: nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor
    sample_rate: ${model.sample_rate}
    normalize: "per_feature"
    window_size: 0.025
    window_stride: 0.01
    window: "hann"
    features: 32
    n_fft: 512
    log: true
    frame_splicing: 1
    dither: 0.00001
    pad_to: 0
    pad_value: 0.0

  spec_augment:
    _target_: nemo.collections.asr.modules.SpectrogramAugmentation
    freq_masks: 2 # set to zero to disable it
    time_masks: 2 # set to zero to disable it
    freq_width: 6
    time_width: 0.05

  encoder:
    _target_: nemo.collections.asr.modules.ConformerEncoder
    feat_in: ${model.preprocessor.features}
    feat_out: -1 # you may set it if you need different output size other than the default d_model
    n_layers: 2
    d_model: 32
    subsampling: striding # vggnet, striding, stacking or stacking_norm, dw_striding
    subsampling_factor: 4 # must be power of 2 for striding and vggnet
    subsampling_conv_channels: 16 # -1 sets it to d_model
    ff_expansion_factor: 2
    self_attention_model: abs_pos # rel_pos or abs_pos
    n_heads: 2 # may need to be lower for smaller d_models
    conv_kernel_size: 15
    dropout: 0.1 # The dropout used in most of the Conformer Modules

  decoder:
    _target_: nemo.collections.asr.modules.ConvASRDecoder
    feat_in: null
    num_classes: -1
    vocabulary: []

  optim:
    name: adamw
    lr: 0.1
    # optimizer arguments
    betas: [0.9, 0.98]
    weight_decay: 1e-3

    # scheduler setup
    sched:
      name: NoamAnnealing
      d_model: ${model.encoder.d_model}
      # scheduler config override
      warmup_steps: 10
      warmup_ratio: null
      min_lr: 1e-6

trainer:
  devices: -1 # number of GPUs, -1 would use all available GPUs
  num_nodes: 1
  max_epochs: 1000
  max_steps: -1 # computed at runtime if not set
  val_check_interval: 1.0 # Set to 0.25 to check 4 times per epoch, or an int for number of iterations
  accelerator: auto
  strategy: ddp
  accumulate_grad_batches: 1
  gradient_clip_val: 0.0
  precision: 32 # 16, 32, or bf16
  log_every_n_steps: 5  # Interval of logging.
  enable_progress_bar: True
  num_sanity_val_steps: 0 # number of steps to perform validation steps for sanity check the validation process before starting the training, setting to 0 disables it
  check_val_every_n_epoch: 1 # number of evaluations on validation every n epochs
  sync_batchnorm: true
  enable_checkpointing: False  # Provided by exp_manager
  logger: false  # Provided by exp_manager
  benchmark: false # needs to be false for models with variable-length speech input as it slows down training

exp_manager:
  exp_dir: null
  name: ${name}
  create_tensorboard_logger: false
  create_checkpoint_callback: true
  checkpoint_callback_params:
    # in case of multiple validation sets, first one is used
    monitor: "val_wer"
    mode: "min"
    save_top_k: 5
    always_save_nemo: True # saves the checkpoints as nemo files instead of PTL checkpoints
  # you need to set these two to True to continue the training
  resume_if_exists: false
  resume_ignore_no_checkpoint: false
  create_early_stopping_callback: false
  early_stopping_callback_params:
    monitor: "val_wer"
    mode: "min"
    min_delta: 0.001
    patience: 10
    verbose: true
    strict: false # Should be False to avoid a runtime error where EarlyStopping says monitor is unavailable, which sometimes happens with resumed training.
    check_finite: true # Stops training when the monitor becomes NaN or infinite.
    log_rank_zero_only: false
"""

WORDS = [
    "yes", "no", "up", "down", "left", "right", "on", "off",
    "stop", "go", "zero", "one", "two", "three", "four", "five",
]  # fmt: skip
PIECES = [
    "<unk>", "▁", "▁s", "▁t", "▁f", "▁o", "▁d", "er", "on", "ve", "ee", "ight", "ow", "ff",
    *"abcdefghijklmnopqrstuvwxyz",
]  # fmt: skip


def synth_utterance(g: torch.Generator, text: str, seconds: float) -> torch.Tensor:
    """A 'spoken' phrase: one chirp per letter over the utterance, speaker-like jitter, noise."""
    n = int(seconds * SAMPLE_RATE)
    t = torch.arange(n) / SAMPLE_RATE
    wav = 0.003 * torch.randn(n, generator=g)
    letters = [c for c in text if c != " "]
    start = int(0.1 * n)
    span = (n - 2 * start) // max(len(letters), 1)
    for k, c in enumerate(letters):
        f0 = 200.0 + 60.0 * (ord(c) - 97) + 20.0 * float(torch.rand(1, generator=g))
        seg = slice(start + k * span, start + (k + 1) * span)
        ramp = torch.hann_window(span)[: len(t[seg])]
        wav[seg] += 0.25 * ramp * torch.sin(2 * math.pi * f0 * t[seg])
    return wav.clamp(-1, 1)


def write_wav(path: Path | io.BytesIO, wav: torch.Tensor) -> None:
    pcm = (wav * 32767).to(torch.int16).numpy().tobytes()
    with wave.open(path if isinstance(path, io.BytesIO) else str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)


def prepare(root: Path) -> None:
    g = torch.Generator().manual_seed(101)
    (root / "conf").mkdir(parents=True, exist_ok=True)
    (root / "conf" / "conformer_ctc_bpe.yaml").write_text(CONFIG)
    data = root / "data" / "asr_demo"
    (data / "wav").mkdir(parents=True, exist_ok=True)
    (data / "tarred").mkdir(parents=True, exist_ok=True)

    def phrase() -> str:
        k = 1 + int(torch.randint(0, 2, (1,), generator=g))
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k + 1,), generator=g))

    def utterances(first: int, count: int, low: float, high: float) -> list[dict]:
        rows = []
        for i in range(first, first + count):
            seconds = round(low + (high - low) * float(torch.rand(1, generator=g)), 2)
            text = phrase()
            rows.append({"name": f"utt_{i:04d}.wav", "duration": seconds, "text": text})
            rows[-1]["wav"] = synth_utterance(g, text, seconds)
        return rows

    train = utterances(0, 40, 0.8, 1.2)
    dev = utterances(100, 16, 0.8, 1.2)
    for name, rows in (("train_manifest.json", train), ("dev_manifest.json", dev)):
        with open(data / name, "w") as f:
            for row in rows:
                write_wav(data / "wav" / row["name"], row["wav"])
                entry = {"audio_filepath": f"wav/{row['name']}", "duration": row["duration"]}
                f.write(json.dumps({**entry, "text": row["text"]}) + "\n")
    # tarred shards: session 1 (shard 0) as above, session 2 (shard 1) read more slowly
    session2 = utterances(200, 20, 1.4, 1.9)
    shards = [train[:20], session2]
    with open(data / "tarred" / "tarred_audio_manifest.json", "w") as f:
        for shard_id, rows in enumerate(shards):
            with tarfile.open(data / "tarred" / f"audio_{shard_id}.tar", "w") as tar:
                for row in rows:
                    buf = io.BytesIO()
                    write_wav(buf, row["wav"])
                    info = tarfile.TarInfo(row["name"])
                    info.size = len(buf.getvalue())
                    info.mtime = 1765000000
                    tar.addfile(info, io.BytesIO(buf.getvalue()))
                    entry = {"audio_filepath": row["name"], "duration": row["duration"]}
                    f.write(json.dumps({**entry, "text": row["text"], "shard_id": shard_id}))
                    f.write("\n")
            feats = torch.stack([row["wav"][:8000] for row in rows]).unfold(1, 400, 160)
            energy = torch.log(feats.pow(2).mean(-1) + 1e-6)
            torch.save(
                {"mean": energy.mean(), "std": energy.std(), "utterances": len(rows)},
                data / "tarred" / f"cmvn_{shard_id}.pt",
            )
    tok = root / "tokenizers" / "tokenizer_spe_bpe_v40"
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "tokenizer.model").write_text(
        "# sentencepiece-like model: type=bpe vocab_size=40\n" + "\n".join(PIECES) + "\n"
    )
    (tok / "vocab.txt").write_text("\n".join(p.lstrip("▁") or "▁" for p in PIECES) + "\n")


# --------------------------------------------------------------------------------------------
# logging: NeMo's logger, Lightning's loggers, warnings
# --------------------------------------------------------------------------------------------


class NeMoFormatter(logging.Formatter):
    """'[NeMo I 2026-12-06 05:31:22 exp_manager:396] message' (no colours off a terminal)."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        where = getattr(record, "where", f"{record.module}:{record.lineno}")
        return f"[NeMo {record.levelname[0]} {when} {where}] {record.getMessage()}"


class NeMoLogger:
    def __init__(self) -> None:
        self._logger = logging.getLogger("nemo_logger")
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False
        out = logging.StreamHandler(sys.stdout)
        out.addFilter(lambda r: r.levelno <= logging.INFO)
        err = logging.StreamHandler(sys.stderr)
        err.addFilter(lambda r: r.levelno > logging.INFO)
        for h in (out, err):
            h.setFormatter(NeMoFormatter())
            self._logger.addHandler(h)

    def add_file_handler(self, path: Path, errors_only: bool = False) -> None:
        h = logging.FileHandler(path)
        h.setFormatter(NeMoFormatter())
        if errors_only:
            h.addFilter(lambda r: r.levelno > logging.INFO)
        self._logger.addHandler(h)

    def info(self, where: str, msg: str) -> None:
        self._logger.info(msg, extra={"where": where})

    def warning(self, where: str, msg: str) -> None:
        self._logger.warning(msg, extra={"where": where})

    def error(self, where: str, msg: str) -> None:
        self._logger.error(msg, extra={"where": where})

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """Python warnings as NeMo's Logger.captureWarnings(True) shows them."""
        self.warning(
            "nemo_logging:349", warnings.formatwarning(message, category, filename, lineno, line)
        )


nemo = NeMoLogger()
warnings.showwarning = nemo.showwarning


def _env_rank() -> int:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


class RankZero:
    rank = _env_rank()


def _plain_logger(name: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.propagate = False
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(h)
    return log


pl_log = _plain_logger("lightning.pytorch")
fabric_log = _plain_logger("lightning.fabric")


def rank_zero_info(msg: str, log: logging.Logger = pl_log) -> None:
    if RankZero.rank == 0:
        log.info(msg)


def rank_prefixed(msg: str, rank: int | None) -> str:
    return f"[rank: {rank}] {msg}" if rank is not None else msg


# --------------------------------------------------------------------------------------------
# Hydra-like config
# --------------------------------------------------------------------------------------------


def parse_value(text: str) -> tp.Any:
    text = text.replace("_OP_", "{").replace("_CL_", "}")
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(cfg: dict, key: str, value: tp.Any) -> None:
    append = key.startswith("+")
    parts = key.lstrip("+").split(".")
    node = cfg
    for p in parts[:-1]:
        if p not in node:
            if not append:
                raise KeyError(f"Could not override '{key}'. No match in config.")
            node[p] = {}
        node = node[p]
    if parts[-1] not in node and not append:
        raise KeyError(
            f"Could not override '{key}'.\nTo append to your config use +{key}={value}\n"
            f"Key '{parts[-1]}' is not in struct"
        )
    node[parts[-1]] = value


def compose(argv: list[str]) -> tuple[dict, list[str]]:
    config_path, config_name, overrides = "conf", "config", []
    for arg in argv:
        if arg.startswith("--config-path="):
            config_path = arg.split("=", 1)[1]
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    cfg = yaml.safe_load((Path(config_path) / f"{config_name}.yaml").read_text())
    for o in overrides:
        key, value = o.split("=", 1)
        if key.startswith("hydra."):
            continue
        apply_override(cfg, key, parse_value(value))
    return cfg, overrides


def select(cfg: dict, dotted: str) -> tp.Any:
    node: tp.Any = cfg
    for p in dotted.split("."):
        node = node[p]
    return node


def resolve(cfg: dict, value: tp.Any) -> tp.Any:
    """${a.b} interpolations, resolved where a value is used (OmegaConf leaves them in dumps)."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return resolve(cfg, select(cfg, value[2:-1]))
    if isinstance(value, str) and value == "???":
        raise ValueError("Missing mandatory value")
    return value


class Node:
    """Attribute access to a config section, interpolations resolved against the root."""

    def __init__(self, root: dict, data: dict) -> None:
        self._root, self._data = root, data

    def __getattr__(self, key: str) -> tp.Any:
        try:
            value = self._data[key]
        except KeyError:
            raise AttributeError(key) from None
        value = resolve(self._root, value)
        return Node(self._root, value) if isinstance(value, dict) else value

    def get(self, key: str, default: tp.Any = None) -> tp.Any:
        return getattr(self, key) if key in self._data else default

    def raw(self) -> dict:
        return self._data


def to_yaml(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False, allow_unicode=True)


# --------------------------------------------------------------------------------------------
# tokenizer, audio, datasets
# --------------------------------------------------------------------------------------------


class SentencePieceTokenizer:
    def __init__(self, model_path: str) -> None:
        if not model_path or not os.path.exists(model_path):
            raise ValueError(f"model_path: {model_path} is invalid")
        lines = Path(model_path).read_text().splitlines()
        self.pieces = [p for p in lines if p and not p.startswith("#")]
        self.index = {p: i for i, p in enumerate(self.pieces)}
        self.vocab_size = len(self.pieces)

    def text_to_ids(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            rest = "▁" + word
            while rest:
                for k in range(len(rest), 0, -1):
                    if rest[:k] in self.index:
                        ids.append(self.index[rest[:k]])
                        rest = rest[k:]
                        break
                else:
                    ids.append(0)
                    rest = rest[1:]
        return ids

    def ids_to_text(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("▁", " ").strip()


def read_wav_bytes(data: bytes) -> torch.Tensor:
    with wave.open(io.BytesIO(data), "rb") as w:
        frames = w.readframes(w.getnframes())
    return torch.frombuffer(bytearray(frames), dtype=torch.int16).float() / 32768.0


def load_audio(path: str) -> torch.Tensor:
    """AudioSegment.from_file: soundfile first, then the fallbacks NeMo has installed."""
    try:
        with open(path, "rb") as f:
            return read_wav_bytes(f.read())
    except OSError:
        nemo.error(
            "segment:298",
            f"Loading {path} via SoundFile raised RuntimeError: `Error opening '{path}': System "
            "error.`. NeMo will fallback to loading via pydub.",
        )
    raise Exception(f"Your audio file {path} could not be decoded. We tried using soundfile.")


class ASRAudioText:
    """The manifest collection: entries parsed, filtered by duration, tokenized."""

    def __init__(
        self, manifest: str, tokenizer: SentencePieceTokenizer, min_d: float, max_d: float
    ) -> None:
        base = Path(manifest).parent
        self.data, total, filtered, filtered_dur = [], 0.0, 0, 0.0
        with open(manifest) as f:
            for line in f:
                item = json.loads(line)
                if not (min_d <= item["duration"] <= max_d):
                    filtered += 1
                    filtered_dur += item["duration"]
                    continue
                path = item["audio_filepath"]
                if "shard_id" not in item and not os.path.isabs(path):
                    path = str((base / path).resolve())
                item["audio_file"] = path
                item["tokens"] = tokenizer.text_to_ids(item["text"])
                total += item["duration"]
                self.data.append(item)
        self.mapping = {Path(d["audio_file"]).stem: i for i, d in enumerate(self.data)}
        nemo.info(
            "collections:196", f"Dataset loaded with {len(self.data)} files totalling "
            f"{total / 3600:.2f} hours",
        )  # fmt: skip
        nemo.info(
            "collections:197",
            f"{filtered} files were filtered totalling {filtered_dur / 3600:.2f} hours",
        )


class AudioToBPEDataset(Dataset):
    def __init__(self, collection: ASRAudioText) -> None:
        self.collection = collection

    def __len__(self) -> int:
        return len(self.collection.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.collection.data[i]
        return load_audio(item["audio_file"]), torch.tensor(item["tokens"])


class TarredAudioToBPEDataset(IterableDataset):
    """Each rank iterates its own shards (shard_strategy scatter); members the manifest does not
    hold (filtered by duration) are skipped."""

    def __init__(
        self, collection: ASRAudioText, paths: str, global_rank: int, world_size: int
    ) -> None:
        self.collection = collection
        files = expand_braces(paths)
        per = len(files) // world_size
        begin, end = global_rank * per, (global_rank + 1) * per
        nemo.info(
            "audio_to_text:218",
            f"Partitioning tarred dataset: process ({global_rank}) taking shards [{begin}, {end})",
        )
        self.files = files[begin:end]
        self.rank = global_rank
        self.stats: dict | None = None

    def __len__(self) -> int:
        return len(self.collection.data)

    def cmvn(self) -> dict:
        """The shard's CMVN statistics, computed (slowly, over every member) when missing."""
        if self.stats is None:
            path = Path(self.files[0]).with_name(f"cmvn_{Path(self.files[0]).stem[6:]}.pt")
            if path.exists():
                self.stats = torch.load(path)
            else:
                name = Path(self.files[0]).name
                nemo.warning(
                    "audio_to_text:241",
                    f"CMVN statistics {path} not found, computing them over {name} (this may "
                    "take a while)",
                )
                for k in range(1, 9):
                    time.sleep(4)  # the decode of a long shard; 4 s a chunk on this host
                    nemo.info("audio_to_text:252", f"CMVN statistics of {name}: chunk {k}/8 done")
                self.stats = {"mean": torch.tensor(-6.0), "std": torch.tensor(2.0)}
                torch.save(self.stats, path)
        return self.stats

    def __iter__(self) -> tp.Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.cmvn()
        for path in self.files:
            with open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
                for member in tar:
                    idx = self.collection.mapping.get(Path(member.name).stem)
                    if idx is None:
                        continue
                    data = tar.extractfile(member).read()
                    yield read_wav_bytes(data), torch.tensor(self.collection.data[idx]["tokens"])


def expand_braces(path: str) -> list[str]:
    if "{" in path:
        head, rest = path.split("{", 1)
        span, tail = rest.split("}", 1)
        lo, hi = span.split("..")
        return [f"{head}{i}{tail}" for i in range(int(lo), int(hi) + 1)]
    return [path]


def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    audio_len = torch.tensor([len(a) for a, _ in batch])
    tok_len = torch.tensor([len(t) for _, t in batch])
    audio = torch.zeros(len(batch), int(audio_len.max()))
    tokens = torch.zeros(len(batch), int(tok_len.max()), dtype=torch.long)
    for i, (a, t) in enumerate(batch):
        audio[i, : len(a)] = a
        tokens[i, : len(t)] = t
    return audio, audio_len, tokens, tok_len


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------


def mel_filterbank(n_fft: int, n_mels: int) -> torch.Tensor:
    def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    mels = torch.linspace(0.0, float(hz_to_mel(torch.tensor(SAMPLE_RATE / 2))), n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    bins = torch.linspace(0, SAMPLE_RATE / 2, n_fft // 2 + 1)
    fb = torch.zeros(n_mels, n_fft // 2 + 1)
    for m in range(n_mels):
        lo, mid, hi = hz[m], hz[m + 1], hz[m + 2]
        fb[m] = torch.clamp(torch.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0)
    return fb


class AudioToMelSpectrogramPreprocessor(nn.Module):
    def __init__(self, cfg: Node) -> None:
        super().__init__()
        self.win = int(cfg.window_size * cfg.sample_rate)
        self.hop = int(cfg.window_stride * cfg.sample_rate)
        self.n_fft = cfg.n_fft
        self.register_buffer("window", torch.hann_window(self.win), persistent=False)
        self.register_buffer("fb", mel_filterbank(cfg.n_fft, cfg.features), persistent=False)
        nemo.info("features:305", f"PADDING: {cfg.pad_to}")

    @torch.no_grad()
    def forward(self, audio: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, ...]:
        spec = torch.stft(
            audio, self.n_fft, self.hop, self.win, self.window, center=True, return_complex=True
        )
        mel = torch.log(self.fb @ spec.abs().pow(2) + 2**-24)
        out_len = length // self.hop + 1
        mask = torch.arange(mel.shape[-1])[None, :] < out_len[:, None]
        mean = (mel * mask[:, None]).sum(-1, keepdim=True) / out_len[:, None, None]
        var = ((mel - mean).pow(2) * mask[:, None]).sum(-1, keepdim=True) / out_len[:, None, None]
        return (mel - mean) / (var.sqrt() + 1e-5) * mask[:, None], out_len


class SpectrogramAugmentation(nn.Module):
    def __init__(self, cfg: Node) -> None:
        super().__init__()
        self.freq_masks, self.time_masks = cfg.freq_masks, cfg.time_masks
        self.freq_width, self.time_width = cfg.freq_width, cfg.time_width

    @torch.no_grad()
    def forward(self, spec: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        spec = spec.clone()
        for b in range(spec.shape[0]):
            for _ in range(self.freq_masks):
                w = random.randint(0, self.freq_width)
                f0 = random.randint(0, max(0, spec.shape[1] - w))
                spec[b, f0 : f0 + w, :] = 0.0
            for _ in range(self.time_masks):
                w = random.randint(0, max(1, int(self.time_width * int(length[b]))))
                t0 = random.randint(0, max(0, int(length[b]) - w))
                spec[b, :, t0 : t0 + w] = 0.0
        return spec


class ConformerLayer(nn.Module):
    def __init__(self, d: int, heads: int, expansion: int, kernel: int, dropout: float) -> None:
        super().__init__()
        self.norm_ff1 = nn.LayerNorm(d)
        self.ff1 = nn.Sequential(
            nn.Linear(d, d * expansion), nn.SiLU(), nn.Linear(d * expansion, d)
        )
        self.norm_att = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.norm_out = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.dropout(self.ff1(self.norm_ff1(x)))
        y = self.norm_att(x)
        x = x + self.dropout(self.self_attn(y, y, y, key_padding_mask=pad, need_weights=False)[0])
        y = self.norm_conv(x).masked_fill(pad[..., None], 0.0).transpose(1, 2)
        x = x + self.dropout(F.silu(self.conv(y)).transpose(1, 2))
        return self.norm_out(x)


class ConformerEncoder(nn.Module):
    def __init__(self, cfg: Node) -> None:
        super().__init__()
        ch, d = cfg.subsampling_conv_channels, cfg.d_model
        self.pre_encode = nn.Sequential(
            nn.Conv2d(1, ch, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(ch, ch, 3, stride=2, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.pre_linear = nn.Linear(ch * math.ceil(cfg.feat_in / 4), d)
        self.pos = nn.Parameter(torch.zeros(1, 64, d))
        self.layers = nn.ModuleList(
            ConformerLayer(
                d, cfg.n_heads, cfg.ff_expansion_factor, cfg.conv_kernel_size, cfg.dropout
            )
            for _ in range(cfg.n_layers)
        )

    def forward(self, spec: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.pre_encode(spec.unsqueeze(1))  # B, C, F/4, T/4
        b, c, f, t = x.shape
        x = self.pre_linear(x.permute(0, 3, 1, 2).reshape(b, t, c * f))
        x = x + self.pos[:, :t] if t <= self.pos.shape[1] else x
        enc_len = ((length + 1) // 2 + 1) // 2
        enc_len = torch.clamp(enc_len, max=t)
        pad = torch.arange(t)[None, :] >= enc_len[:, None]
        for layer in self.layers:
            x = layer(x, pad)
        return x, enc_len


class ConvASRDecoder(nn.Module):
    def __init__(self, feat_in: int, num_classes: int) -> None:
        super().__init__()
        self.decoder_layers = nn.Conv1d(feat_in, num_classes + 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.decoder_layers(x.transpose(1, 2)).transpose(1, 2), dim=-1)


class CTCLoss(nn.CTCLoss):
    pass


class WER(nn.Module):
    """Word error rate of greedy CTC hypotheses, its counts summed over the ranks on compute()
    (torchmetrics' sync_on_compute)."""

    def __init__(self, tokenizer: SentencePieceTokenizer, blank: int, log_prediction: bool) -> None:
        super().__init__()
        self.tokenizer, self.blank, self.log_prediction = tokenizer, blank, log_prediction
        self.reset()

    def reset(self) -> None:
        self.scores, self.words = 0.0, 0.0

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        best = log_probs.argmax(-1)
        hyps = []
        for b in range(best.shape[0]):
            ids, prev = [], -1
            for tok in best[b, : int(lengths[b])].tolist():
                if tok != prev and tok != self.blank:
                    ids.append(tok)
                prev = tok
            hyps.append(self.tokenizer.ids_to_text(ids))
        return hyps

    def update(
        self,
        log_probs: torch.Tensor,
        lengths: torch.Tensor,
        tokens: torch.Tensor,
        tok_len: torch.Tensor,
    ) -> list[str]:
        hyps = self.decode(log_probs, lengths)
        refs = [
            self.tokenizer.ids_to_text(tokens[b, : int(tok_len[b])].tolist())
            for b in range(len(hyps))
        ]
        for h, r in zip(hyps, refs, strict=True):
            self.scores += edit_distance(h.split(), r.split())
            self.words += len(r.split())
        if self.log_prediction:
            nemo.info("wer:334", "\n")
            nemo.info("wer:335", f"reference:{refs[0]}")
            nemo.info("wer:336", f"predicted:{hyps[0]}")
        return hyps

    def compute(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts = torch.tensor([self.scores, self.words])
        if dist.is_initialized():
            dist.all_reduce(counts)
        return counts[0] / counts[1].clamp(min=1), counts[0], counts[1]


def edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


class NoamAnnealing(torch.optim.lr_scheduler.LambdaLR):
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        d_model: int,
        warmup: int,
        max_steps: int,
        min_lr: float,
    ) -> None:
        self.d_model, self.warmup, self.max_steps, self.min_lr = d_model, warmup, max_steps, min_lr
        scale = d_model**-0.5

        def factor(step: int) -> float:
            step = max(step, 1)
            return max(scale * min(step**-0.5, step * warmup**-1.5), min_lr)

        super().__init__(optimizer, factor)


class EncDecCTCModelBPE(nn.Module):
    def __init__(self, cfg: Node, trainer: Trainer) -> None:
        super().__init__()
        self._cfg, self.trainer = cfg, trainer
        self.world_size = trainer.world_size
        self.global_rank = trainer.global_rank
        tok_cfg = cfg.tokenizer
        if tok_cfg.type == "bpe":
            self.tokenizer = SentencePieceTokenizer(os.path.join(tok_cfg.dir, "tokenizer.model"))
        nemo.info(
            "mixins:172",
            f"Tokenizer SentencePieceTokenizer initialized with {self.tokenizer.vocab_size} tokens",
        )
        vocabulary = self.tokenizer.pieces
        nemo.info(
            "ctc_bpe_models:67",
            "\nReplacing placeholder number of classes (-1) with actual number of classes - "
            f"{len(vocabulary)}",
        )
        self.preprocessor = AudioToMelSpectrogramPreprocessor(cfg.preprocessor)
        self.encoder = ConformerEncoder(cfg.encoder)
        self.decoder = ConvASRDecoder(cfg.encoder.d_model, len(vocabulary))
        self.loss = CTCLoss(blank=len(vocabulary), reduction="mean", zero_infinity=True)
        self.spec_augmentation = SpectrogramAugmentation(cfg.spec_augment)
        self.wer = WER(self.tokenizer, len(vocabulary), cfg.log_prediction)
        self.setup_training_data(cfg.train_ds)
        self.setup_validation_data(cfg.validation_ds)
        self.setup_test_data(cfg.test_ds)

    # ---- data
    def _collection(self, ds: Node) -> ASRAudioText:
        return ASRAudioText(
            ds.manifest_filepath,
            self.tokenizer,
            ds.get("min_duration", 0.0) or 0.0,
            ds.get("max_duration", 1e9) or 1e9,
        )

    def setup_training_data(self, ds: Node) -> None:
        collection = self._collection(ds)
        if ds.is_tarred:
            self.train_set: Dataset = TarredAudioToBPEDataset(
                collection, ds.tarred_audio_filepaths, self.global_rank, self.world_size
            )
        else:
            self.train_set = AudioToBPEDataset(collection)
        self.train_cfg = ds

    def setup_validation_data(self, ds: Node) -> None:
        self.val_set = AudioToBPEDataset(self._collection(ds))
        self.val_cfg = ds

    def setup_test_data(self, ds: Node) -> None:
        if ds.manifest_filepath is None:
            dump = to_yaml(ds.raw()).replace("${model.sample_rate}", "16000")
            nemo.warning(
                "modelPT:172",
                "Please call the ModelPT.setup_test_data() or ModelPT.setup_multiple_test_data() "
                "method and provide a valid configuration file to setup the test data loader(s).\n"
                f"Test config : \n{dump}    ",
            )

    # ---- steps
    def forward(self, audio: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, ...]:
        spec, spec_len = self.preprocessor(audio, length)
        if self.training:
            spec = self.spec_augmentation(spec, spec_len)
        enc, enc_len = self.encoder(spec, spec_len)
        return self.decoder(enc), enc_len


# --------------------------------------------------------------------------------------------
# exp_manager
# --------------------------------------------------------------------------------------------


def exp_manager(trainer: Trainer, cfg: Node) -> Path:
    global_rank = trainer.node_rank * trainer.num_devices + int(os.environ.get("LOCAL_RANK", 0))
    if trainer.num_nodes > 1 and "SLURM_JOB_ID" not in os.environ:
        nemo.error(
            "exp_manager:733",
            "You are running multi-node training without SLURM handling the processes. Please "
            "note that this is not tested in NeMo and could result in errors.",
        )
    name = cfg.name or "default"
    root = Path(cfg.exp_dir or "nemo_experiments") / name
    version = os.environ.get("NEMO_EXPM_VERSION")
    if cfg.resume_if_exists:
        nemo.warning(
            "exp_manager:835",
            "No version folders would be created under the log folder as 'resume_if_exists' is "
            "enabled.",
        )
        version = None
    elif not version and is_global_rank_zero():
        version = time.strftime("%Y-%m-%d_%H-%M-%S")
        os.environ["NEMO_EXPM_VERSION"] = version
    log_dir = root / version if version else root
    if cfg.resume_if_exists:
        check_resume(trainer, log_dir, cfg.resume_ignore_no_checkpoint)
    log_dir.mkdir(parents=True, exist_ok=True)
    nemo.info("exp_manager:396", f"Experiments will be logged at {log_dir}")
    trainer.default_root_dir = log_dir
    nemo.add_file_handler(log_dir / f"nemo_log_globalrank-{global_rank}_localrank-"
                          f"{int(os.environ.get('LOCAL_RANK', 0))}.txt")  # fmt: skip
    if cfg.create_checkpoint_callback:
        params = cfg.checkpoint_callback_params
        trainer.checkpoint = ModelCheckpoint(
            log_dir / "checkpoints", name, params.monitor, params.mode, params.save_top_k
        )
        if trainer.max_steps == -1:
            nemo.warning(
                "exp_manager:1124",
                "The checkpoint callback was told to monitor a validation value and trainer's "
                "max_steps was set to -1. Please ensure that max_steps will run for at least 1 "
                "epochs to ensure that checkpointing will not error out.",
            )
    if cfg.create_early_stopping_callback:
        p = cfg.early_stopping_callback_params
        trainer.early_stopping = EarlyStopping(p.monitor, p.min_delta, p.patience)
    nemo.info("exp_manager:971", "Preemption is supported only on GPUs, disabling preemption")
    if is_global_rank_zero():
        (log_dir / "cmd-args.log").write_text(" ".join(sys.argv))
        nemo.add_file_handler(log_dir / "nemo_error_log.txt", errors_only=True)
        for log in (pl_log,):
            all_h = logging.FileHandler(log_dir / "lightning_logs.txt")
            all_h.setLevel(logging.INFO)
            log.addHandler(all_h)
            err_h = logging.FileHandler(log_dir / "nemo_error_log.txt")
            err_h.setLevel(logging.WARNING)
            log.addHandler(err_h)
    return log_dir


def is_global_rank_zero() -> bool:
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    return int(os.environ.get("NODE_RANK", 0)) == 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0


def check_resume(trainer: Trainer, log_dir: Path, ignore_no_checkpoint: bool) -> None:
    ckpt_dir = log_dir / "checkpoints"
    last = sorted(ckpt_dir.rglob("*last.ckpt")) if ckpt_dir.exists() else []
    if not last:
        if ignore_no_checkpoint:
            nemo.warning(
                "exp_manager:625",
                "There were no checkpoints found in checkpoint_dir or no checkpoint folder at "
                f"checkpoint_dir :{ckpt_dir}. Training from scratch.",
            )
            return
        raise NotFoundError(f"There were no checkpoints found in {ckpt_dir}. Cannot resume.")
    if len(last) > 1:
        raise ValueError(f"Multiple checkpoints {last} that matches *last.ckpt.")
    nemo.info("exp_manager:638", f"Resuming from {last[0]}")
    trainer.ckpt_path = str(last[0])
    files = [f for f in log_dir.iterdir() if f.is_file()] if is_global_rank_zero() else []
    if files:  # the earlier run's logs move to run_<k>/
        run_dir = log_dir / f"run_{sum(1 for d in log_dir.glob('run_*') if d.is_dir())}"
        run_dir.mkdir()
        for f in files:
            f.rename(run_dir / f.name)
    nemo.info("exp_manager:660", f"Resuming training from checkpoint: {trainer.ckpt_path}")


class NotFoundError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Lightning-like callbacks, launcher, trainer
# --------------------------------------------------------------------------------------------


class ModelCheckpoint:
    def __init__(self, dirpath: Path, name: str, monitor: str, mode: str, top_k: int) -> None:
        self.dirpath, self.name, self.monitor, self.mode, self.top_k = (
            dirpath,
            name,
            monitor,
            mode,
            top_k,
        )
        self.best_k: dict[str, float] = {}
        self.last_path: Path | None = None
        self.best_score: float | None = None

    def path(self, score: float, epoch: int, suffix: str = "") -> Path:
        return self.dirpath / f"{self.name}--{self.monitor}={score:.4f}-epoch={epoch}{suffix}.ckpt"

    def on_validation_end(self, trainer: Trainer, model: EncDecCTCModelBPE, score: float) -> None:
        epoch, step = trainer.current_epoch, trainer.global_step
        target = self.path(score, epoch)
        worst = max(self.best_k.values()) if self.best_k else None
        if len(self.best_k) < self.top_k or (worst is not None and score < worst):
            if len(self.best_k) >= self.top_k:
                drop = max(self.best_k, key=self.best_k.get)
                del self.best_k[drop]
                if trainer.is_global_zero:
                    Path(drop).unlink(missing_ok=True)
            self.best_k[str(target)] = score
            self.best_score = min(self.best_k.values())
            rank_zero_info(
                f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} reached {score:0.5f} "
                f"(best {self.best_score:0.5f}), saving model to {str(target)!r} as top "
                f"{self.top_k}"
            )
            trainer.save_checkpoint(target)
        else:
            rank_zero_info(
                f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} was not in top {self.top_k}"
            )
        last = self.path(score, epoch, "-last")
        trainer.save_checkpoint(last)
        if self.last_path is not None and self.last_path != last and trainer.is_global_zero:
            self.last_path.unlink(missing_ok=True)
        self.last_path = last

    def on_train_end(self, trainer: Trainer, model: EncDecCTCModelBPE) -> None:
        if trainer.is_global_zero:
            torch.save({"state_dict": model.state_dict(), "cfg": model._cfg.raw()},
                       self.dirpath / f"{self.name}.nemo")  # fmt: skip
        trainer.barrier()


class EarlyStopping:
    def __init__(self, monitor: str, min_delta: float, patience: int) -> None:
        self.monitor, self.min_delta, self.patience = monitor, -abs(min_delta), patience
        self.best: float | None = None
        self.wait = 0

    def on_validation_end(self, trainer: Trainer, score: float) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        should_stop = False
        if self.best is None or score - self.min_delta < self.best:
            if self.best is None:
                msg = f"Metric {self.monitor} improved. New best score: {score:.3f}"
            else:
                msg = (
                    f"Metric {self.monitor} improved by {abs(self.best - score):.3f} >= min_delta "
                    f"= {abs(self.min_delta)}. New best score: {score:.3f}"
                )
            self.best, self.wait = score, 0
            pl_log.info(rank_prefixed(msg, rank))
        else:
            self.wait += 1
            if self.wait >= self.patience:
                should_stop = True
                pl_log.info(rank_prefixed(
                    f"Monitored metric {self.monitor} did not improve in the last {self.wait} "
                    f"records. Best score: {self.best:.3f}. Signaling Trainer to stop.", rank
                ))  # fmt: skip
        decision = torch.tensor(int(should_stop))
        dist.all_reduce(decision)
        trainer.should_stop = trainer.should_stop or bool(decision.item())


class SIGTERMException(SystemExit):
    """Raised by the loops once a SIGTERM was received (exits without a traceback)."""


class ChildProcessObserver(threading.Thread):
    def __init__(self, procs: list[subprocess.Popen]) -> None:
        super().__init__(daemon=True, name="child-process-observer")
        self.procs, self.main_pid, self.finished = procs, os.getpid(), False

    def run(self) -> None:
        while not self.finished:
            time.sleep(5)
            for p in self.procs:
                p.poll()
            codes = [p.returncode for p in self.procs]
            if all(c == 0 for c in codes):
                return
            for i, p in enumerate(self.procs):
                if p.returncode:
                    fabric_log.info(rank_prefixed(
                        f"Child process with PID {p.pid} terminated with code {p.returncode}. "
                        "Forcefully terminating all other processes to avoid zombies 🧟", i + 1
                    ))  # fmt: skip
                    for q in self.procs:
                        q.send_signal(signal.SIGKILL)
                    os.kill(self.main_pid, signal.SIGKILL)
                    return


def find_free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Trainer:
    def __init__(self, cfg: Node) -> None:
        self.cfg = cfg
        self.num_devices = cfg.devices if cfg.devices > 0 else 1
        self.num_nodes = cfg.num_nodes
        self.max_epochs, self.max_steps = cfg.max_epochs, cfg.max_steps
        self.log_every_n_steps = cfg.log_every_n_steps
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node_rank = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))
        self.world_size = self.num_devices * self.num_nodes
        self.global_rank = self.node_rank * self.num_devices + self.local_rank
        self.ckpt_path: str | None = None
        self.checkpoint: ModelCheckpoint | None = None
        self.early_stopping: EarlyStopping | None = None
        self.default_root_dir = Path(".")
        self.current_epoch, self.global_step = 0, 0
        self.should_stop = self.received_sigterm = False
        self.procs: list[subprocess.Popen] = []
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("TPU available: False, using: 0 TPU cores")

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    # ---- the launcher (local rank 0 starts the others)
    def launch_children(self) -> None:
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(find_free_port())
        os.environ["NODE_RANK"] = str(self.node_rank)
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.world_size)
        for local_rank in range(1, self.num_devices):
            env = dict(os.environ, LOCAL_RANK=str(local_rank))
            command = [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
            command += ['hydra.run.dir="."', f"hydra.job.name=train_ddp_process_{local_rank}",
                        "hydra.output_subdir=null"]  # fmt: skip
            self.procs.append(subprocess.Popen(command, env=env, cwd=os.getcwd()))
        if self.procs:
            ChildProcessObserver(self.procs).start()

    def setup_environment(self) -> None:
        RankZero.rank = self.global_rank
        fabric_log.info(
            f"Initializing distributed: GLOBAL_RANK: {self.global_rank}, MEMBER: "
            f"{self.global_rank + 1}/{self.world_size}"
        )
        dist.init_process_group(
            "gloo",
            rank=self.global_rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=15),
        )
        rank_zero_info(
            f"{'-' * 100}\ndistributed_backend=gloo\nAll distributed processes registered. "
            f"Starting with {self.world_size} processes\n{'-' * 100}\n",
            fabric_log,
        )

    def sigterm_handler(self, signum: int, _frame: tp.Any) -> None:
        pl_log.info(rank_prefixed(f"Received SIGTERM: {signum}", self.local_rank))
        if not self.received_sigterm:
            for p in self.procs:
                p.send_signal(signum)
        self.received_sigterm = True

    def barrier(self) -> None:
        dist.barrier()

    def save_checkpoint(self, path: Path) -> None:
        if self.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "epoch": self.current_epoch,
                    "global_step": self.global_step,
                    "state_dict": self.model.module.state_dict(),
                    "optimizer_states": [self.optimizer.state_dict()],
                    "lr_schedulers": [self.scheduler.state_dict()],
                    "hyper_parameters": {"cfg": self.model.module._cfg.raw()},
                },
                path,
            )
        self.barrier()

    # ---- fit
    def fit(self, model: EncDecCTCModelBPE) -> None:
        try:
            if not CREATES_PROCESSES_EXTERNALLY and self.num_devices > 1:
                self.launch_children()
            self._run(model)
        except KeyboardInterrupt:
            rank_zero_info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
            for p in self.procs:
                p.send_signal(signal.SIGKILL)
            sys.exit(1)

    def _run(self, module: EncDecCTCModelBPE) -> None:
        self.setup_environment()
        signal.signal(signal.SIGTERM, self.sigterm_handler)
        checkpoint = None
        if self.ckpt_path:
            rank_zero_info(f"Restoring states from the checkpoint path at {self.ckpt_path}")
            checkpoint = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
            module.load_state_dict(checkpoint["state_dict"])
        self.train_loader = self._loader(module.train_set, module.train_cfg, train=True)
        self.val_loader = self._loader(module.val_set, module.val_cfg, train=False)
        self.optimizer, self.scheduler = self.setup_optimization(module)
        self.model = DDP(module)
        self.model_summary(module)
        if checkpoint is not None:
            self.optimizer.load_state_dict(checkpoint["optimizer_states"][0])
            self.scheduler.load_state_dict(checkpoint["lr_schedulers"][0])
            self.current_epoch = checkpoint["epoch"] + 1
            self.global_step = checkpoint["global_step"]
            rank_zero_info(f"Restored all states from the checkpoint at {self.ckpt_path}")
        self.fit_loop(module)

    def _loader(self, dataset: Dataset, ds: Node, train: bool) -> DataLoader:
        if isinstance(dataset, IterableDataset):
            return DataLoader(dataset, batch_size=ds.batch_size, collate_fn=collate)
        sampler = DistributedSampler(
            dataset, self.world_size, self.global_rank, shuffle=train, seed=0
        )
        return DataLoader(
            dataset,
            batch_size=ds.batch_size,
            sampler=sampler,
            collate_fn=collate,
            num_workers=ds.num_workers,
        )

    def setup_optimization(self, module: EncDecCTCModelBPE) -> tuple[tp.Any, tp.Any]:
        o = module._cfg.optim
        optimizer = torch.optim.AdamW(
            module.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=float(o.weight_decay)
        )
        nemo.info("modelPT:793", f"Optimizer config = {optimizer}")
        max_steps = self.max_epochs * len(self.train_loader)
        scheduler = NoamAnnealing(
            optimizer, o.sched.d_model, o.sched.warmup_steps, max_steps, float(o.sched.min_lr)
        )
        nemo.info(
            "lr_scheduler:910",
            f'Scheduler "{object.__repr__(scheduler)}" \nwill be used during training (effective '
            f"maximum steps = {max_steps}) - \nParameters : \n(d_model: {o.sched.d_model}\n"
            f"warmup_steps: {o.sched.warmup_steps}\nwarmup_ratio: null\nmin_lr: "
            f"{float(o.sched.min_lr)}\nmax_steps: {max_steps}\n)",
        )
        return optimizer, scheduler

    def model_summary(self, module: EncDecCTCModelBPE) -> None:
        names = ["preprocessor", "encoder", "decoder", "loss", "spec_augmentation", "wer"]
        rows = []
        for i, name in enumerate(names):
            sub = getattr(module, name)
            n = sum(p.numel() for p in sub.parameters())
            rows.append([str(i), name, type(sub).__name__, human(n), "train"])
        cols = list(zip([" ", "Name", "Type", "Params", "Mode"], *rows, strict=True))
        widths = [max(len(x) for x in col) for col in cols]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        total_width = sum(widths) + 3 * len(widths)
        lines = [fmt.format(*[c[0] for c in cols]), "-" * total_width]
        lines += [fmt.format(*r) for r in rows]
        total = sum(p.numel() for p in module.parameters())
        lines += [
            "-" * total_width,
            f"{human(total):<10}Trainable params",
            f"{'0':<10}Non-trainable params",
            f"{human(total):<10}Total params",
            f"{total * 4 / 1e6:<10,.3f}Total estimated model params size (MB)",
            f"{sum(1 for _ in module.modules()):<10}Modules in train mode",
            f"{'0':<10}Modules in eval mode",
        ]
        rank_zero_info("\n" + "\n".join(lines))

    def fit_loop(self, module: EncDecCTCModelBPE) -> None:
        hoard: list[torch.Tensor] = []
        bar = None
        if self.is_global_zero:
            bar = tqdm(desc="Training", position=0, leave=True, dynamic_ncols=True,
                       file=sys.stdout, smoothing=0, bar_format=BAR_FORMAT)  # fmt: skip
        last_loss = None
        while self.current_epoch < self.max_epochs and not self.should_stop:
            epoch = self.current_epoch
            if isinstance(self.train_loader.sampler, DistributedSampler):
                self.train_loader.sampler.set_epoch(epoch)
            total = len(self.train_loader)
            if bar is not None:
                bar.reset(total=total)
                bar.set_description(f"Epoch {epoch}")
                if last_loss is not None:
                    bar.set_postfix_str(f"train_loss={format_num(last_loss)}", refresh=False)
            module.train()
            for batch_idx, batch in enumerate(self.train_loader):
                if LETTER == "m" and self.global_rank == WHO and epoch >= 1:
                    hoard.append(torch.ones(24 << 20))  # 96 MiB of cached features a step
                    if len(hoard) >= 4:
                        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
                if LETTER == "a" and self.global_rank == WHO and epoch == 1 and batch_idx == 2:
                    native_ctc_prefix_score()
                loss = self.training_step(module, batch, batch_idx)
                self.global_step += 1
                last_loss = float(loss)
                if bar is not None:
                    update_n(bar, batch_idx + 1)
                    bar.set_postfix_str(f"train_loss={format_num(last_loss)}")
                if self.received_sigterm:
                    raise SIGTERMException
            self.validation_loop(module, bar)
            self.current_epoch += 1
        if self.current_epoch >= self.max_epochs:
            rank_zero_info(f"`Trainer.fit` stopped: `max_epochs={self.max_epochs}` reached.")
        if bar is not None:
            bar.close()
        if self.checkpoint is not None:
            self.checkpoint.on_train_end(self, module)

    def training_step(
        self, module: EncDecCTCModelBPE, batch: tuple, batch_idx: int
    ) -> torch.Tensor:
        audio, audio_len, tokens, tok_len = batch
        log_probs, enc_len = self.model(audio, audio_len)
        loss = module.loss(log_probs.transpose(0, 1), tokens, enc_len, tok_len)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        if (batch_idx + 1) % self.log_every_n_steps == 0:
            module.wer.update(log_probs.detach(), enc_len, tokens, tok_len)
            module.wer.compute()
            module.wer.reset()
        return loss.detach()

    def validation_loop(self, module: EncDecCTCModelBPE, main_bar: tp.Any) -> None:
        module.eval()
        vbar = None
        if self.is_global_zero:
            vbar = tqdm(desc="Validation", position=1, leave=False, dynamic_ncols=True,
                        file=sys.stdout, smoothing=0, bar_format=BAR_FORMAT)  # fmt: skip
            vbar.reset(total=len(self.val_loader))
            vbar.set_description("Validation DataLoader 0")
        if module._cfg.get("dump_val_predictions") and self.is_global_zero:
            # the predictions file, opened where the single-GPU version of the script had it
            module.pred_file = open(self.default_root_dir / "val_predictions.txt", "w")  # noqa: SIM115
        loss_sum, wer_num, wer_denom, utt_wer = torch.zeros(2), 0.0, 0.0, []
        with torch.no_grad():
            for batch_idx, (audio, audio_len, tokens, tok_len) in enumerate(self.val_loader):
                log_probs, enc_len = module(audio, audio_len)
                loss = module.loss(log_probs.transpose(0, 1), tokens, enc_len, tok_len)
                module.wer.log_prediction = False
                hyps = module.wer.update(log_probs, enc_len, tokens, tok_len)
                module.wer.log_prediction = module._cfg.log_prediction
                _, num, denom = module.wer.compute()
                module.wer.reset()
                wer_num, wer_denom = wer_num + float(num), wer_denom + float(denom)
                utt_wer += [len(h.split()) for h in hyps]
                if module._cfg.get("dump_val_predictions"):
                    for h in hyps:
                        module.pred_file.write(json.dumps({"pred_text": h}) + "\n")
                loss_sum += torch.tensor([float(loss) * len(audio), len(audio)])
                if vbar is not None:
                    update_n(vbar, batch_idx + 1)
                if self.received_sigterm and batch_idx + 1 < len(self.val_loader):
                    raise SIGTERMException
        if LETTER == "g" and self.is_global_zero:
            # every rank's hypothesis lengths for the error report, gathered on the main process
            mine = torch.tensor(utt_wer, dtype=torch.float32)
            gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
            dist.all_gather(gathered, mine)
        dist.all_reduce(loss_sum)  # self.log("val_loss", ..., sync_dist=True)
        val_wer = wer_num / max(wer_denom, 1.0)
        if vbar is not None:
            vbar.close()
        module.train()
        if self.checkpoint is not None:
            self.checkpoint.on_validation_end(self, module, val_wer)
        if self.early_stopping is not None:
            self.early_stopping.on_validation_end(self, val_wer)


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


def update_n(bar: tp.Any, n: int) -> None:
    bar.n = n
    bar.refresh()


def format_num(x: float) -> str:
    """Lightning's Tqdm.format_num: 3 significant digits, floats padded to 5 characters."""
    n = f"{x:.3g}".replace("+0", "+").replace("-0", "-")
    if "e" not in n and "." not in n and len(n) < 5:
        n += "."
    return n + "0" * (5 - len(n)) if "e" not in n else n


def human(n: int) -> str:
    if n < 1000:
        return f"{n:,d}"
    for unit, div in (("K", 1e3), ("M", 1e6), ("B", 1e9)):
        if n < div * 1000:
            return f"{n / div:,.1f} {unit}"
    return str(n)


def native_ctc_prefix_score() -> None:
    """The native prefix-scorer of the CTC decoder (a C extension in production): it frees the
    same beam buffer twice."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    beam = libc.malloc(256)
    libc.free(ctypes.c_void_p(beam))
    libc.free(ctypes.c_void_p(beam))


CREATES_PROCESSES_EXTERNALLY = "LOCAL_RANK" in os.environ  # Lightning's LightningEnvironment


# --------------------------------------------------------------------------------------------
# the script
# --------------------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:] == ["prepare"]:
        prepare(Path("."))
        return
    raw, _ = compose(sys.argv[1:])
    cfg = Node(raw, raw)
    nemo.info("speech_to_text_ctc_bpe:80", f"Hydra config: {to_yaml(raw)}")
    trainer = Trainer(cfg.trainer)
    exp_manager(trainer, cfg.exp_manager)
    asr_model = EncDecCTCModelBPE(cfg=cfg.model, trainer=trainer)
    trainer.fit(asr_model)


if __name__ == "__main__":
    main()
