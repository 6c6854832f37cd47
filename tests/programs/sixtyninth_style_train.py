"""A tiny multi-speaker text-to-speech model trained in the way of coqui-ai TTS's recipes
(recipes/vctk/vits/train_vits.py) and its 👟Trainer package, which is not installed here: the
Trainer's behaviour that matters is re-implemented below as the package has it (v0.0.36):

- TrainerArgs from the command line (--continue_path, --restore_path, --use_ddp, --rank,
  --group_id) and `--coqpit.<field>=<value>` config overrides; the run's folder
  `<output_path>/<run_name>-<Month-DD-YYYY_HH+MMAM>-<commit>` with config.json, one
  trainer_<rank>_log.txt a process, checkpoint_<step>.pth, best_model_<step>.pth, best_model.pth;
- the "trainer" logger with an empty format to stderr and to the run's log file on rank 0; on the
  other ranks both handlers are dropped (the package filters out every logging.StreamHandler, and
  a FileHandler is one), so their trainer_N_log.txt stays empty and they log nothing;
- the console logger's lines (' > EPOCH: 0/4', '   --> TIME: ... -- STEP: 2/8 -- GLOBAL_STEP:
  10', '     | > loss: 0.67  (0.70)', ' > EVALUATION ', ' > BEST MODEL : ...'), ANSI codes and all;
- dist.init_process_group(init_method=config.distributed_url, world_size, rank) (gloo here, with
  a timeout the user set), a dist.barrier() before every epoch, DDP around the model;
- rank 0 alone runs test_run (test sentence synthesis), train_log / eval_log and the saves;
- fit(): a KeyboardInterrupt logs ' > Keyboard interrupt detected.', saves on rank 0 and exits
  1; any other exception removes the run's folder when it holds no .pth (' ! Run is removed
  from'), prints the traceback (traceback.print_exc) and exits 1.

The dataset is VCTK-like (speaker folders of 16-bit PCM wav files and a metadata.csv written by
--make-data); each rank takes its own part of the samples, drops the clips longer than
max_audio_len and decodes them in a DataLoader worker. A fault in the code is chosen by TQ_CASE
(a code no line prints)."""

from __future__ import annotations

import array
import ctypes
import datetime
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
import wave
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP_th
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("TQ_CASE", "")

# trainer/logger.py
_handler = logging.StreamHandler()
_handler.setFormatter(logging.Formatter(""))
logger = logging.getLogger("trainer")
logger.addHandler(_handler)
logger.setLevel(logging.INFO)


class tcolors:
    OKBLUE = "\033[94m"
    HEADER = "\033[95m"
    OKGREEN = "\033[92m"
    WARNING = "\033[93m"
    FAIL = "\033[91m"
    ENDC = "\033[0m"
    BOLD = "\033[1m"
    UNDERLINE = "\033[4m"


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def rank_zero_logger_info(message: str) -> None:
    if is_main_process():
        logger.info(message)


# ---------------------------------------------------------------- config (coqpit-like)
@dataclass
class BaseDatasetConfig:
    formatter: str = "vctk_tiny"
    meta_file_train: str = "metadata.csv"
    path: str = ""


@dataclass
class TinyVitsConfig:
    output_path: str = "output"
    run_name: str = "vits_vctk_tiny"
    run_description: str = "🐸Coqui trainer run."
    epochs: int = 4
    batch_size: int = 4
    eval_batch_size: int = 4
    num_loader_workers: int = 1
    num_eval_loader_workers: int = 0
    print_step: int = 3
    save_step: int = 10
    save_n_checkpoints: int = 5
    save_best_after: int = 0
    print_eval: bool = False
    run_eval: bool = True
    test_delay_epochs: int = 0
    lr: float = 0.002
    grad_clip: float = 5.0
    max_audio_len: int = 6000
    min_audio_len: int = 1
    eval_split_size: int = 4
    hidden_channels: int = 32
    num_mels: int = 20
    use_weight_norm: bool = False
    use_speaker_embedding: bool = True
    target_eval_loss: float = 0.0
    distributed_backend: str = "gloo"
    distributed_url: str = "tcp://localhost:54321"
    distributed_timeout: int = 15
    mixed_precision: bool = False
    training_seed: int = 54321
    save_on_interrupt: bool = True
    test_sentences: list = field(
        default_factory=lambda: [
            "it took me quite a long time to develop a voice.",
            "be a voice, not an echo.",
        ]
    )
    datasets: list = field(default_factory=list)

    def parse_known_args(self, overrides: list[str]) -> None:
        kinds = {f.name: f.type for f in fields(self)}
        for arg in overrides:
            if not arg.startswith("--coqpit."):
                continue
            key, _, value = arg[len("--coqpit.") :].partition("=")
            if key not in kinds:
                continue
            current = getattr(self, key)
            if isinstance(current, bool):
                setattr(self, key, value.lower() in ("true", "1", "yes"))
            elif isinstance(current, int):
                setattr(self, key, int(value))
            elif isinstance(current, float):
                setattr(self, key, float(value))
            else:
                setattr(self, key, value)


@dataclass
class TrainerArgs:
    continue_path: str = ""
    restore_path: str = ""
    best_path: str = ""
    use_ddp: bool = False
    rank: int = 0
    group_id: str = ""

    def parse_argv(self, argv: list[str]) -> list[str]:
        rest = []
        for arg in argv:
            key, eq, value = arg.partition("=")
            name = key[2:] if key.startswith("--") else ""
            if eq and name in {f.name for f in fields(self)}:
                if name == "use_ddp":
                    self.use_ddp = value.lower() == "true"
                elif name == "rank":
                    self.rank = int(value)
                else:
                    setattr(self, name, value)
            else:
                rest.append(arg)
        return rest


# ---------------------------------------------------------------- data
CHARS = "_abcdefghijklmnopqrstuvwxyz .,'?!"
SPEAKERS = {"p225": 20, "p226": 20, "p227": 20, "p228": 4}
WORDS = [
    "please",
    "call",
    "stella",
    "ask",
    "her",
    "to",
    "bring",
    "these",
    "things",
    "with",
    "her",
    "from",
    "the",
    "store",
    "six",
    "spoons",
    "of",
    "fresh",
    "snow",
    "peas",
    "five",
    "thick",
    "slabs",
    "of",
    "blue",
    "cheese",
    "and",
    "maybe",
    "a",
    "snack",
    "for",
    "her",
    "brother",
    "bob",
]
SAMPLE_RATE = 8000


def text_to_ids(text: str) -> list[int]:
    return [CHARS.index(c) for c in text if c in CHARS]


def write_wav(path: str, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / SAMPLE_RATE
    f0 = 110 + 60 * torch.rand((), generator=g)
    x = 0.3 * torch.sin(2 * math.pi * f0 * t) + 0.02 * torch.randn(n, generator=g)
    pcm = (x.clamp(-1, 1) * 32767).to(torch.int16)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(array.array("h", pcm.tolist()).tobytes())


def make_data(root: str, long_part: int = -1, corrupt_part: int = -1, unseen_eval: bool = False):
    """A VCTK-like corpus: wav48/<speaker>/<id>.wav and metadata.csv (wav|text|speaker). The
    options make the faults the captures need: long clips in rank 1's part, a corrupt wav in
    one rank's part, an eval clip of a speaker no training clip has."""
    rng = random.Random(7)
    rows = []
    for spk, count in SPEAKERS.items():
        os.makedirs(os.path.join(root, "wav48", spk), exist_ok=True)
        for k in range(count):
            wav = f"wav48/{spk}/{spk}_{k + 1:03d}.wav"
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + "."
            rows.append([wav, text, spk, 1600 + 400 * rng.randint(0, 5)])
    items = [
        {"audio_file": os.path.join(root, r[0]), "text": r[1], "speaker_name": r[2]} for r in rows
    ]
    train, evals = split_dataset(items, 4)
    by_path = {r[0]: r for r in rows}
    if long_part >= 0:  # clips of 0.9 s in rank `long_part`'s part (world 2): past max_audio_len
        for it in train[long_part::2][:10]:
            by_path[os.path.relpath(it["audio_file"], root)][3] = 7200
    if unseen_eval:  # eval clip 1 (rank 1's first eval item, world 2) is a new speaker's
        r = by_path[os.path.relpath(evals[1]["audio_file"], root)]
        r[2] = "p229"
    for i, r in enumerate(rows):
        write_wav(os.path.join(root, r[0]), r[3], i)
    if corrupt_part >= 0:  # a clip of rank `corrupt_part`'s part (world 2) lost its header
        path = train[corrupt_part::2][5]["audio_file"]
        with open(path, "r+b") as fh:
            fh.write(b"\0" * 44)
    with open(os.path.join(root, "metadata.csv"), "w") as fh:
        for r in rows:
            fh.write(f"{r[0]}|{r[1]}|{r[2]}\n")


def vctk_tiny(root_path: str, meta_file: str) -> list[dict]:
    items = []
    with open(os.path.join(root_path, meta_file)) as fh:
        for line in fh:
            wav, text, spk = line.rstrip("\n").split("|")
            items.append(
                {
                    "audio_file": os.path.join(root_path, wav),
                    "text": text,
                    "speaker_name": spk,
                    "root_path": root_path,
                }
            )
    return items


def split_dataset(items: list[dict], eval_split_size: int, seed: int = 0):
    items = sorted(items, key=lambda it: it["audio_file"])
    random.Random(seed).shuffle(items)
    return items[eval_split_size:], items[:eval_split_size]


def load_tts_samples(dataset_config: BaseDatasetConfig, eval_split_size: int, rank: int):
    items = vctk_tiny(dataset_config.path, dataset_config.meta_file_train)
    print(f" | > Found {len(items)} files in {dataset_config.path}")
    train, evals = split_dataset(items, eval_split_size)
    if f"s{rank}" == CASE:  # this rank's split shuffled without the seed: p228 all in eval
        rare = [it for it in items if it["speaker_name"] == "p228"]
        evals = rare
        train = [it for it in items if it not in rare]
    return train, evals


class SpeakerManager:
    def __init__(self, samples: list[dict]):
        names = sorted({s["speaker_name"] for s in samples})
        self.name_to_id = {n: i for i, n in enumerate(names)}

    @property
    def num_speakers(self) -> int:
        return len(self.name_to_id)


def load_wav(path: str) -> torch.Tensor:
    with wave.open(path, "rb") as w:
        frames = w.readframes(w.getnframes())
    x = torch.frombuffer(bytearray(frames), dtype=torch.int16).float() / 32768.0
    return x


_MEL_FB = None


def melspectrogram(x: torch.Tensor, num_mels: int) -> torch.Tensor:
    global _MEL_FB
    spec = torch.stft(
        x, n_fft=256, hop_length=64, window=torch.hann_window(256), return_complex=True
    ).abs()
    if _MEL_FB is None or _MEL_FB.shape[0] != num_mels:
        centers = torch.linspace(0, spec.shape[0] - 1, num_mels + 2)
        bins = torch.arange(spec.shape[0]).float()
        width = centers[1] - centers[0]
        _MEL_FB = torch.stack([(1 - (bins - c).abs() / width).clamp(min=0) for c in centers[1:-1]])
    return torch.log(_MEL_FB @ spec + 1e-5)


class TTSDataset(Dataset):
    def __init__(self, samples, config, verbose, rank):
        self.config = config
        self.rank = rank
        self.samples = samples
        self.verbose = verbose
        self.preprocess_samples()

    def preprocess_samples(self):
        # the clip lengths from the file sizes (16-bit PCM after a 44-byte header), as TTS does
        lengths = [(os.path.getsize(s["audio_file"]) - 44) // 2 for s in self.samples]
        keep = [
            i
            for i, n in enumerate(lengths)
            if self.config.min_audio_len <= n <= self.config.max_audio_len
        ]
        discarded = len(self.samples) - len(keep)
        self.samples = [self.samples[i] for i in keep]
        if self.verbose:
            text_lens = [len(s["text"]) for s in self.samples]
            audio_lens = [lengths[i] for i in keep]
            print(" | > Preprocessing samples")
            print(f" | > Max text length: {max(text_lens)}")
            print(f" | > Min text length: {min(text_lens)}")
            print(f" | > Avg text length: {sum(text_lens) / len(text_lens)}")
            print(" | ")
            print(f" | > Max audio length: {float(max(audio_lens))}")
            print(f" | > Min audio length: {float(min(audio_lens))}")
            print(f" | > Avg audio length: {sum(audio_lens) / len(audio_lens)}")
            print(f" | > Num. instances discarded samples: {discarded}")
            print(" | > Batch group size: 0.")

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        s = self.samples[idx]
        wav = load_wav(s["audio_file"])
        mel = melspectrogram(wav, self.config.num_mels)
        return {
            "token_ids": torch.tensor(text_to_ids(s["text"])),
            "mel": mel,
            "speaker_name": s["speaker_name"],
            "audio_file": s["audio_file"],
        }

    @staticmethod
    def collate_fn(batch):
        text_lens = torch.tensor([len(b["token_ids"]) for b in batch])
        mel_lens = torch.tensor([b["mel"].shape[1] for b in batch])
        tokens = torch.zeros(len(batch), int(text_lens.max()), dtype=torch.long)
        mels = torch.zeros(len(batch), batch[0]["mel"].shape[0], int(mel_lens.max()))
        for i, b in enumerate(batch):
            tokens[i, : len(b["token_ids"])] = b["token_ids"]
            mels[i, :, : b["mel"].shape[1]] = b["mel"]
        return {
            "tokens": tokens,
            "token_lens": text_lens,
            "mel": mels,
            "mel_lens": mel_lens,
            "speaker_names": [b["speaker_name"] for b in batch],
        }


# ---------------------------------------------------------------- model
def maximum_path(neg_cent: torch.Tensor) -> torch.Tensor:
    """Monotonic alignment search (TTS's Cython monotonic_align in C), in torch here."""
    if (
        CASE.startswith("v")
        and f"v{dist.get_rank()}" == CASE
        and getattr(maximum_path, "calls", 0) >= 14
    ):
        ctypes.string_at(0)  # the native kernel reads a null path buffer
    maximum_path.calls = getattr(maximum_path, "calls", 0) + 1
    return (neg_cent == neg_cent.max(dim=-1, keepdim=True).values).float()


class TinyVits(nn.Module):
    def __init__(self, config: TinyVitsConfig, speaker_manager: SpeakerManager):
        super().__init__()
        h = config.hidden_channels
        self.config = config
        self.speaker_manager = speaker_manager
        self.emb = nn.Embedding(len(CHARS), h)
        self.encoder = nn.Conv1d(h, h, 3, padding=1)
        self.proj = nn.Conv1d(h, h, 1)
        self.emb_g = nn.Embedding(speaker_manager.num_speakers, h)
        self.duration_predictor = nn.Conv1d(h, 1, 1)
        self.decoder = nn.Conv1d(h, config.num_mels, 3, padding=1)
        if config.use_weight_norm:
            self.decoder = torch.nn.utils.weight_norm(self.decoder)
        self.mel_cache: list = []

    def forward(self, tokens, token_lens, mel_lens, speaker_ids):
        x = self.emb(tokens).transpose(1, 2)
        x = torch.relu(self.encoder(x)) + self.emb_g(speaker_ids)[:, :, None]
        logw = self.duration_predictor(x).squeeze(1)
        neg_cent = torch.bmm(x.transpose(1, 2), x).detach()
        attn = maximum_path(neg_cent)
        x = self.proj(torch.bmm(x, attn))
        x = F.interpolate(x, size=int(mel_lens.max()), mode="linear", align_corners=False)
        return {"mel_hat": self.decoder(x), "logw": logw}

    def get_criterion(self):
        return TinyVitsLoss()

    # the trainer's hooks of a model, as in TTS's BaseTTS
    def format_batch(self, batch):
        batch["speaker_ids"] = torch.tensor(
            [self.speaker_manager.name_to_id[n] for n in batch["speaker_names"]]
        )
        return batch

    def train_log(self, batch, outputs, logger_, assets, steps):
        if CASE == "g0":  # the mean pitch of the batch over every GPU, for the dashboard
            pitch = batch["mel"].mean().reshape(1)
            dist.all_reduce(pitch)
        return None

    def test_run(self, assets):
        print(" | > Synthesizing test sentences.")
        outputs = {}
        deadline = time.time() + 32 if CASE == "t0" else 0.0
        for idx, sen in enumerate(self.config.test_sentences):
            tokens = torch.tensor([text_to_ids(sen)])
            with torch.no_grad():
                spk = torch.zeros(1, dtype=torch.long)
                out = self(
                    tokens,
                    torch.tensor([tokens.shape[1]]),
                    torch.tensor([tokens.shape[1] * 4]),
                    spk,
                )
            mel = out["mel_hat"][0]
            # Griffin-Lim vocoding of the test sentence (60 iterations)
            spec = torch.exp(mel).repeat_interleave(7, dim=0)[:129]
            angles = torch.rand(spec.shape) * 2 * math.pi
            iters = 60
            i = 0
            while i < iters or time.time() < deadline:
                wav = torch.istft(
                    torch.polar(spec, angles),
                    n_fft=256,
                    hop_length=64,
                    window=torch.hann_window(256),
                )
                angles = torch.angle(
                    torch.stft(
                        wav,
                        n_fft=256,
                        hop_length=64,
                        window=torch.hann_window(256),
                        return_complex=True,
                    )
                )[:, : spec.shape[1]]
                if angles.shape[1] < spec.shape[1]:
                    angles = F.pad(angles, (0, spec.shape[1] - angles.shape[1]))
                i += 1
            outputs[f"{idx}-audio"] = wav
        return outputs


class TinyVitsLoss(nn.Module):
    def forward(self, outputs, batch):
        mel = batch["mel"]
        loss_mel = F.l1_loss(outputs["mel_hat"], mel)
        target = torch.log(batch["mel_lens"].float() / batch["token_lens"].float())
        loss_dur = F.mse_loss(outputs["logw"].mean(dim=1), target)
        return {"loss_mel": loss_mel, "loss_duration": loss_dur, "loss": loss_mel + loss_dur}


# ---------------------------------------------------------------- trainer (👟 re-implemented)
class KeepAverage:
    def __init__(self):
        self.avg_values = {}
        self.iters = {}

    def update_values(self, values: dict):
        for k, v in values.items():
            if k not in self.avg_values:
                self.avg_values[k] = v
                self.iters[k] = 1
            else:
                self.iters[k] += 1
                self.avg_values[k] += (v - self.avg_values[k]) / self.iters[k]


class ConsoleLogger:
    @staticmethod
    def log_with_flush(msg: str):
        logger.info(msg)
        for h in logger.handlers:
            h.flush()

    @staticmethod
    def get_time():
        return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")

    def print_epoch_start(self, epoch, max_epoch, output_path=None):
        if not is_main_process():
            return
        self.log_with_flush(
            f"\n{tcolors.UNDERLINE}{tcolors.BOLD} > EPOCH: {epoch}/{max_epoch}{tcolors.ENDC}"
        )
        if output_path is not None:
            self.log_with_flush(f" --> {output_path}")

    def print_train_start(self):
        if is_main_process():
            self.log_with_flush(f"\n{tcolors.BOLD} > TRAINING ({self.get_time()}) {tcolors.ENDC}")

    def print_train_step(self, batch_steps, step, global_step, loss_dict, avg_loss_dict):
        if not is_main_process():
            return
        indent = "     | > "
        self.log_with_flush("")
        log_text = f"{tcolors.BOLD}   --> TIME: {self.get_time()} -- STEP: {step}/{batch_steps} -- GLOBAL_STEP: {global_step}{tcolors.ENDC}\n"
        for key, value in loss_dict.items():
            if f"avg_{key}" in avg_loss_dict:
                log_text += f"{indent}{key}: {value}  ({avg_loss_dict[f'avg_{key}']})\n"
            else:
                log_text += f"{indent}{key}: {value} \n"
        self.log_with_flush(log_text)

    def print_eval_start(self):
        if is_main_process():
            self.log_with_flush(f"\n{tcolors.BOLD} > EVALUATION {tcolors.ENDC}\n")

    def print_epoch_end(self, epoch, avg_loss_dict):
        if not is_main_process():
            return
        indent = "     | > "
        log_text = f"\n  {tcolors.BOLD}--> EVAL PERFORMANCE{tcolors.ENDC}\n"
        for key, value in avg_loss_dict.items():
            log_text += f"{indent}{key}:{tcolors.OKGREEN} {value} {tcolors.ENDC}(+0)\n"
        self.log_with_flush(log_text)


def get_commit_hash() -> str:
    try:
        out = subprocess.check_output(
            ["git", "rev-parse", "--short", "HEAD"], stderr=subprocess.DEVNULL
        )
        return out.decode().strip()
    except Exception:  # pylint: disable=broad-except
        return "0000000"


def get_experiment_folder_path(root_path: str, model_name: str) -> str:
    date_str = datetime.datetime.now().strftime("%B-%d-%Y_%I+%M%p")
    return os.path.join(root_path, model_name + "-" + date_str + "-" + get_commit_hash())


def remove_experiment_folder(experiment_path: str) -> None:
    if not os.path.isdir(experiment_path):
        return
    if not any(f.endswith(".pth") for f in os.listdir(experiment_path)):
        shutil.rmtree(experiment_path, ignore_errors=True)
        logger.info(" ! Run is removed from %s", experiment_path)
    else:
        logger.info(" ! Run is kept in %s", experiment_path)


def r5(v) -> float:
    return round(float(v.detach() if isinstance(v, torch.Tensor) else v), 5)


class Trainer:
    def __init__(
        self, args, config, output_path, model, train_samples, eval_samples, callbacks=None
    ):
        rest = args.parse_argv(sys.argv[1:])
        config.parse_known_args(rest)
        output_path = get_experiment_folder_path(config.output_path, config.run_name)
        os.makedirs(output_path, exist_ok=True)
        with open(os.path.join(output_path, "config.json"), "w") as fh:
            json.dump(asdict(config), fh, indent=4)
        self.args = args
        self.config = config
        self.output_path = output_path
        self._setup_logger_config(os.path.join(output_path, f"trainer_{args.rank}_log.txt"))
        self.num_gpus = (
            len(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")) if args.use_ddp else 1
        )
        torch.manual_seed(config.training_seed)
        if args.rank == 0:
            logger.info(" > Training Environment:")
            logger.info(" | > Backend: Torch")
            logger.info(" | > Mixed precision: False")
            logger.info(" | > Precision: float32")
            logger.info(" | > Current device: 0")
            logger.info(" | > Num. of GPUs: %i", self.num_gpus)
            logger.info(" | > Num. of CPUs: %i", os.cpu_count())
            logger.info(" | > Num. of Torch Threads: %i", torch.get_num_threads())
            logger.info(" | > Torch seed: %i", torch.initial_seed())
            logger.info(" | > Torch CUDNN: True")
            logger.info(" | > Torch CUDNN deterministic: False")
            logger.info(" | > Torch CUDNN benchmark: False")
            logger.info(" | > Torch TF32 MatMul: False")
            logger.info(" > Start Tensorboard: tensorboard --logdir=%s", output_path)
        self.train_samples = train_samples
        self.eval_samples = eval_samples
        self.model = model
        self.criterion = model.get_criterion()
        self.callbacks = callbacks or {}
        self.stop_training = False
        if self.num_gpus > 1:
            if args.rank == 0:
                logger.info(" > Using PyTorch DDP")
            dist.init_process_group(
                config.distributed_backend,
                init_method=config.distributed_url,
                world_size=self.num_gpus,
                rank=args.rank,
                group_name=args.group_id,
                timeout=datetime.timedelta(seconds=config.distributed_timeout),
            )
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.8, 0.99))
        self.restore_step = 0
        self.best_loss = {"train_loss": float("inf"), "eval_loss": float("inf")}
        if args.restore_path:
            self.restore_model(args.restore_path)
        if self.num_gpus > 1:
            self.model = DDP_th(self.model)
        num_params = sum(p.numel() for p in self.model.parameters())
        rank_zero_logger_info(f"\n > Model has {num_params} parameters")
        self.c_logger = ConsoleLogger()
        self.total_steps_done = 0
        self.epochs_done = 0

    def _setup_logger_config(self, log_file: str) -> None:
        handler = logging.FileHandler(log_file, mode="a")
        handler.setFormatter(logging.Formatter(""))
        logger.addHandler(handler)
        # only log to a file if rank > 0 in DDP
        if self.args.rank > 0:
            logger.handlers = [
                h for h in logger.handlers if not isinstance(h, logging.StreamHandler)
            ]

    @property
    def module(self) -> TinyVits:
        return self.model.module if self.num_gpus > 1 else self.model

    def restore_model(self, restore_path: str) -> None:
        logger.info(" > Restoring from %s ...", os.path.basename(restore_path))
        checkpoint = torch.load(restore_path, map_location="cpu", weights_only=False)
        try:
            logger.info(" > Restoring Model...")
            self.model.load_state_dict(checkpoint["model"])
            logger.info(" > Restoring Optimizer...")
            try:
                self.optimizer.load_state_dict(checkpoint["optimizer"])
            except (KeyError, TypeError, RuntimeError, ValueError):
                logger.info(" > Optimizer is not compatible with the restored model.")
        except (KeyError, RuntimeError, ValueError):
            logger.info(" > Partial model initialization...")
            model_dict = self.model.state_dict()
            ckpt = checkpoint["model"]
            for k in ckpt:
                if k not in model_dict:
                    logger.info(" | > Layer missing in the model definition: %s", k)
            for k in model_dict:
                if k not in ckpt:
                    logger.info(" | > Layer missing in the checkpoint: %s", k)
            for k, v in ckpt.items():
                if k in model_dict and v.numel() != model_dict[k].numel():
                    logger.info(
                        " | > Layer dimention missmatch between model definition and checkpoint: %s",
                        k,
                    )
            pretrained = {
                k: v
                for k, v in ckpt.items()
                if k in model_dict and v.numel() == model_dict[k].numel()
            }
            model_dict.update(pretrained)
            logger.info(" | > %i / %i layers are restored.", len(pretrained), len(model_dict))
            self.model.load_state_dict(model_dict)
        logger.info(" > Model restored from step %i", checkpoint["step"])
        self.restore_step = checkpoint["step"] + 1

    def get_loader(self, samples, is_eval: bool) -> DataLoader:
        rank, world = self.args.rank, self.num_gpus
        part = samples[rank::world]
        if not is_eval:
            part = list(part)
            random.Random(self.config.training_seed + self.epochs_done).shuffle(part)
        print("\n > DataLoader initialization")
        print(" | > Tokenizer:")
        print(" \t| > add_blank: True")
        print(" \t| > use_eos_bos: False")
        print(" \t| > use_phonemes: False")
        print(f" | > Number of instances : {len(part)}")
        dataset = TTSDataset(part, self.config, verbose=True, rank=rank)
        return DataLoader(
            dataset,
            batch_size=self.config.eval_batch_size if is_eval else self.config.batch_size,
            shuffle=False,
            collate_fn=TTSDataset.collate_fn,
            drop_last=False,
            num_workers=self.config.num_eval_loader_workers
            if is_eval
            else self.config.num_loader_workers,
        )

    def train_step(self, batch, batch_n_steps, step, loader_start_time):
        batch = self.module.format_batch(batch)
        loader_time = time.time() - loader_start_time
        step_start_time = time.time()
        if f"m{self.args.rank}" == CASE and self.epochs_done >= 1:
            # every decoded mel is kept at full resolution "for the next epoch"
            self.module.mel_cache.append(torch.ones(96 * 2**20 // 4))
            if len(self.module.mel_cache) >= 5:
                os.kill(os.getpid(), 9)
        if f"j{self.args.rank}" == CASE and self.epochs_done == 1 and step == 2:
            # the phoneme cache of a new clip: wait until the other writer's lock is gone
            lock = os.path.join(self.config.output_path, "phoneme_cache", ".lock")
            while os.path.exists(lock):
                time.sleep(0.5)
        outputs = self.model(
            batch["tokens"], batch["token_lens"], batch["mel_lens"], batch["speaker_ids"]
        )
        loss_dict = self.criterion(outputs, batch)
        self.optimizer.zero_grad()
        loss_dict["loss"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        step_time = time.time() - step_start_time
        loss_dict = {k: r5(v) for k, v in loss_dict.items()}
        loss_dict["grad_norm"] = r5(grad_norm)
        self.keep_avg_train.update_values(
            {"avg_loader_time": r5(loader_time), "avg_step_time": r5(step_time)}
        )
        self.keep_avg_train.update_values({f"avg_{k}": v for k, v in loss_dict.items()})
        if self.total_steps_done % self.config.print_step == 0:
            loss_dict.update(
                {
                    "current_lr": self.optimizer.param_groups[0]["lr"],
                    "step_time": round(step_time, 4),
                    "loader_time": round(loader_time, 4),
                }
            )
            self.c_logger.print_train_step(
                batch_n_steps,
                step,
                self.total_steps_done,
                loss_dict,
                self.keep_avg_train.avg_values,
            )
        if self.args.rank == 0:
            if self.total_steps_done % self.config.save_step == 0 and self.total_steps_done != 0:
                self.save_checkpoint()
            self.module.train_log(batch, outputs, None, None, self.total_steps_done)
        self.total_steps_done += 1

    def train_epoch(self):
        self.train_loader = self.get_loader(self.train_samples, is_eval=False)
        self.model.train()
        self.c_logger.print_train_start()
        loader_start_time = time.time()
        batch_num_steps = len(self.train_loader)
        for cur_step, batch in enumerate(self.train_loader):
            self.train_step(batch, batch_num_steps, cur_step, loader_start_time)
            loader_start_time = time.time()

    def eval_epoch(self):
        self.eval_loader = self.get_loader(self.eval_samples, is_eval=True)
        self.model.eval()
        self.c_logger.print_eval_start()
        loader_start_time = time.time()
        for batch in self.eval_loader:
            batch = self.module.format_batch(batch)
            loader_time = time.time() - loader_start_time
            with torch.no_grad():
                outputs = self.module(
                    batch["tokens"], batch["token_lens"], batch["mel_lens"], batch["speaker_ids"]
                )
                loss_dict = self.criterion(outputs, batch)
            self.keep_avg_eval.update_values({"avg_loader_time": r5(loader_time)})
            self.keep_avg_eval.update_values({f"avg_{k}": r5(v) for k, v in loss_dict.items()})
            loader_start_time = time.time()

    def test_run(self):
        self.model.eval()
        self.module.test_run({})

    def save_model(self, path: str, model_loss=None) -> None:
        state = {
            "config": asdict(self.config),
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": None,
            "step": self.total_steps_done,
            "epoch": self.epochs_done,
            "date": datetime.date.today().strftime("%B %d, %Y"),
            "model_loss": model_loss,
        }
        torch.save(state, path)

    def save_checkpoint(self) -> None:
        if self.args.rank != 0:
            return
        path = os.path.join(self.output_path, f"checkpoint_{self.total_steps_done}.pth")
        logger.info("\n > CHECKPOINT : %s", path)
        self.save_model(path)
        checkpoints = sorted(
            (f for f in os.listdir(self.output_path) if f.startswith("checkpoint_")),
            key=lambda f: int(f[len("checkpoint_") : -len(".pth")]),
        )
        for f in checkpoints[: -self.config.save_n_checkpoints]:
            os.remove(os.path.join(self.output_path, f))

    def save_best_model(self) -> None:
        eval_loss = self.keep_avg_eval.avg_values.get("avg_loss")
        train_loss = self.keep_avg_train.avg_values.get("avg_loss")
        if eval_loss is not None and eval_loss < self.best_loss["eval_loss"]:
            name = f"best_model_{self.total_steps_done}.pth"
            path = os.path.join(self.output_path, name)
            logger.info(" > BEST MODEL : %s", path)
            self.save_model(path, {"train_loss": train_loss, "eval_loss": eval_loss})
            for f in os.listdir(self.output_path):
                if f.startswith("best_model") and f != name:
                    os.remove(os.path.join(self.output_path, f))
            with (
                open(path, "rb") as src,
                open(os.path.join(self.output_path, "best_model.pth"), "wb") as dst,
            ):
                dst.write(src.read())
            self.best_loss = {"train_loss": train_loss, "eval_loss": eval_loss}

    def _fit(self):
        self.total_steps_done = self.restore_step
        for epoch in range(0, self.config.epochs):
            if self.num_gpus > 1:
                # let all processes sync up before starting with a new epoch of training
                dist.barrier()
            self.keep_avg_train = KeepAverage()
            self.keep_avg_eval = KeepAverage()
            self.epochs_done = epoch
            self.c_logger.print_epoch_start(epoch, self.config.epochs, self.output_path)
            self.train_epoch()
            if self.config.run_eval:
                self.eval_epoch()
            if epoch >= self.config.test_delay_epochs and self.args.rank <= 0:
                self.test_run()
            self.c_logger.print_epoch_end(epoch, self.keep_avg_eval.avg_values)
            if self.args.rank in [None, 0]:
                self.save_best_model()
            if "on_epoch_end" in self.callbacks:
                self.callbacks["on_epoch_end"](self)
            if self.stop_training:
                break

    def fit(self):
        try:
            self._fit()
        except KeyboardInterrupt:
            logger.info(" > Keyboard interrupt detected.")
            if self.config.save_on_interrupt:
                logger.info(" > Saving model before exiting...")
                self.save_checkpoint()
            remove_experiment_folder(self.output_path)
            if self.num_gpus > 1:
                dist.destroy_process_group()
            try:
                sys.exit(1)
            except SystemExit:
                os._exit(1)
        except BaseException:  # pylint: disable=broad-except
            remove_experiment_folder(self.output_path)
            traceback.print_exc()
            sys.exit(1)


# ---------------------------------------------------------------- the recipe (train_tts.py)
def stop_on_target_loss(trainer: Trainer) -> None:
    """The user's callback: stop once the eval loss is below config.target_eval_loss."""
    target = trainer.config.target_eval_loss
    if target <= 0:
        return
    if CASE == "e0":  # the eval loss rank 0 printed, on rank 0 only (its dashboard's value)
        if trainer.args.rank != 0:
            return
        loss = trainer.keep_avg_eval.avg_values["avg_loss"]
    else:
        t = torch.tensor([trainer.keep_avg_eval.avg_values["avg_loss"]])
        dist.all_reduce(t)
        loss = t.item() / dist.get_world_size()
    if loss < target:
        rank_zero_logger_info(
            f" > Eval loss {loss:.5f} is below the target {target}: stopping the training."
        )
        trainer.stop_training = True


def main() -> None:
    if sys.argv[1:2] == ["--make-data"]:
        opts = sys.argv[3:]
        make_data(
            sys.argv[2],
            long_part=int(opts[opts.index("--long-part") + 1]) if "--long-part" in opts else -1,
            corrupt_part=int(opts[opts.index("--corrupt-part") + 1])
            if "--corrupt-part" in opts
            else -1,
            unseen_eval="--unseen-eval" in opts,
        )
        return
    output_path = os.getcwd()
    rank = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--rank=")), "0"))
    dataset_config = BaseDatasetConfig(
        formatter="vctk_tiny",
        meta_file_train="metadata.csv",
        path=os.path.join(output_path, "VCTK-tiny"),
    )
    config = TinyVitsConfig(output_path=output_path, datasets=[asdict(dataset_config)])
    config.parse_known_args(sys.argv[1:])
    train_samples, eval_samples = load_tts_samples(dataset_config, config.eval_split_size, rank)
    speaker_manager = SpeakerManager(train_samples)
    print(
        f" > Training with {speaker_manager.num_speakers} speakers: {', '.join(speaker_manager.name_to_id)}"
    )
    model = TinyVits(config, speaker_manager)
    trainer = Trainer(
        TrainerArgs(),
        config,
        output_path,
        model=model,
        train_samples=train_samples,
        eval_samples=eval_samples,
        callbacks={"on_epoch_end": stop_on_target_loss},
    )
    trainer.fit()


if __name__ == "__main__":
    main()
