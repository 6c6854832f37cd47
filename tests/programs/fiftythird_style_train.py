"""A fifty-third training-program style for the generalisation fixtures
(tests/fixtures/real/fiftythird-*): an ASR recipe's training script in the way of WeNet's
wenet/bin/train.py, started by a recipe's run.sh (tests/programs/fiftythird_run.sh: torchrun
--nnodes=1 --nproc_per_node=N --rdzv_backend=c10d --rdzv_endpoint=localhost:PORT). A YAML config
(--config), a raw data.list of {"key", "wav", "txt"} lines that an IterableDataset partitions by
rank (list[rank::world_size], as WeNet's DistributedSampler does) and turns into log-mel-like
features from the wav files, a tiny conformer-like encoder with CTC and a decoder head in DDP,
logging.basicConfig(level=DEBUG) in every rank (no rank prefix but what a line says itself),
WeNet's per-batch "TRAIN | steps/sec ...| Batch E/B loss ..." DEBUG lines, and WeNet's
uneven-input handling: a gloo group_join made per epoch and, before every batch but the first, a
monitored_barrier on it whose failure is logged as "Detected uneven workload distribution" and
ends the rank's epoch (CosyVoice's and WeNet's *_join). Then a barrier, CV with an all_reduce of
the loss, and rank 0's epoch_N.pt with its epoch_N.yaml. Collective timeout 15 s, group_join 5 s.
A fault is chosen by the WN_EXP_TAG environment variable (a short code) and never printed
(re-capture with tests/fixtures/real/capture_fiftythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import json
import logging
import math
import os
import re
import signal
import threading
import time
import wave
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset


@dataclass(frozen=True)
class Trial:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank logs a loss its batch's dict lacks (epoch 0, batch 5)
    hoard_rank: int = -1  # this rank keeps 64 MiB a batch until the OOM killer acts
    segv_rank: int = -1  # this rank's native feature extractor reads address 0 (batch 3)
    slow_rank: int = -1  # this rank rebuilds a speed-perturb cache for 40 s (epoch 1, batch 4)
    stuck_rank: int = -1  # this rank waits for a prefetch thread that never signals (same place)
    norm_rank0: bool = False  # rank 0 all-reduces grad norms for its tensorboard-like writer
    stop_rank0: bool = False  # the patience check runs in rank 0's checkpoint block only
    nan_rank: int = -1  # this rank's CMVN divides by a zero std (epoch 1, batch 3)
    cuda_map: bool = False  # load_checkpoint maps the checkpoint to f"cuda:{local_rank}"


TRIALS: dict[str, Trial] = {
    "": Trial(),
    "zq1": Trial(key_rank=1),
    "zm1": Trial(hoard_rank=1),
    "zv2": Trial(segv_rank=2),
    "zw2": Trial(slow_rank=2),
    "zj1": Trial(stuck_rank=1),
    "zg0": Trial(norm_rank0=True),
    "ze0": Trial(stop_rank0=True),
    "zn1": Trial(nan_rank=1),
    "zc": Trial(cuda_map=True),
}
CHARS = "abcdefghijklmnopqrstuvwxyz '"
SAMPLE_RATE = 8000


def char_id(c: str) -> int:
    return CHARS.index(c) + 1  # 0 is <blank>


def compute_fbank(path: str, conf: dict) -> torch.Tensor:
    """Log mel-like filterbank energies: 25 ms frames every 10 ms, power spectrum pooled."""
    with wave.open(path, "rb") as w:
        pcm = w.readframes(w.getnframes())
    x = torch.frombuffer(bytearray(pcm), dtype=torch.int16).float() / 32768.0
    flen = conf["frame_length"] * SAMPLE_RATE // 1000
    fshift = conf["frame_shift"] * SAMPLE_RATE // 1000
    frames = x.unfold(0, flen, fshift) * torch.hann_window(flen)
    power = torch.fft.rfft(frames, n=256).abs() ** 2
    bins = conf["num_mel_bins"]
    pooled = power[:, : (power.shape[1] // bins) * bins].reshape(len(frames), bins, -1).mean(-1)
    return (pooled + 1e-6).log()


class AsrDataset(IterableDataset):
    """WeNet's raw pipeline: list -> partition by rank -> parse wav -> fbank -> static batch."""

    def __init__(self, data_list: str, conf: dict) -> None:
        with open(data_list) as f:
            self.lines = f.read().splitlines()
        self.conf = conf
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        bs = self.conf["batch_conf"]["batch_size"]
        buf: list[dict] = []
        for line in self.lines[rank::world]:
            obj = json.loads(line)
            feat = compute_fbank(obj["wav"], self.conf["fbank_conf"])
            label = torch.tensor([char_id(c) for c in obj["txt"]])
            buf.append({"key": obj["key"], "feat": feat, "label": label})
            if len(buf) == bs:
                yield padding(buf)
                buf = []
        if buf:
            yield padding(buf)


def padding(samples: list[dict]) -> dict:
    feats = nn.utils.rnn.pad_sequence([s["feat"] for s in samples], batch_first=True)
    labels = nn.utils.rnn.pad_sequence([s["label"] for s in samples], True, padding_value=-1)
    return {
        "keys": [s["key"] for s in samples],
        "feats": feats,
        "feats_lengths": torch.tensor([len(s["feat"]) for s in samples]),
        "target": labels,
        "target_lengths": torch.tensor([len(s["label"]) for s in samples]),
    }


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, units: int, kernel: int) -> None:
        super().__init__()
        self.ff1 = nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, units), nn.SiLU(), nn.Linear(units, d)
        )
        self.norm_mha = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm_conv = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.conv_norm = nn.LayerNorm(d)  # cnn_module_norm: layer_norm
        self.pw2 = nn.Conv1d(d, d, 1)
        self.ff2 = nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, units), nn.SiLU(), nn.Linear(units, d)
        )
        self.norm_final = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.norm_mha(x)
        x = x + self.mha(h, h, h, key_padding_mask=pad, need_weights=False)[0]
        h = self.norm_conv(x).transpose(1, 2)
        h = F.glu(self.pw1(h), dim=1)
        h = F.silu(self.conv_norm(self.dw(h).transpose(1, 2))).transpose(1, 2)
        x = x + self.pw2(h).transpose(1, 2)
        x = x + 0.5 * self.ff2(x)
        return self.norm_final(x)


class ASRModel(nn.Module):
    """CTC plus a decoder head reading the pooled encoder per target position."""

    def __init__(self, input_dim: int, vocab_size: int, conf: dict) -> None:
        super().__init__()
        enc = conf["encoder_conf"]
        d = enc["output_size"]
        self.ctc_weight = conf["model_conf"]["ctc_weight"]
        self.embed = nn.Conv1d(input_dim, d, 3, stride=2, padding=1)  # conv1d2 subsampling
        self.encoders = nn.ModuleList(
            ConformerBlock(d, enc["attention_heads"], enc["linear_units"], enc["cnn_module_kernel"])
            for _ in range(enc["num_blocks"])
        )
        self.ctc = nn.Linear(d, vocab_size)
        self.pos = nn.Embedding(64, d)
        self.decoder = nn.Linear(d, vocab_size)

    def forward(self, batch: dict) -> dict:
        x = self.embed(batch["feats"].transpose(1, 2)).transpose(1, 2)
        lens = (batch["feats_lengths"] + 1) // 2
        pad = torch.arange(x.shape[1])[None, :] >= lens[:, None]
        for layer in self.encoders:
            x = layer(x, pad)
        target, tlens = batch["target"], batch["target_lengths"]
        logp = self.ctc(x).log_softmax(-1).transpose(0, 1)
        loss_ctc = F.ctc_loss(
            logp, target.clamp(min=0), lens, tlens, reduction="sum", zero_infinity=True
        ) / len(tlens)
        pooled = (x * (~pad)[..., None]).sum(1) / lens[:, None]
        dec = self.decoder(pooled[:, None, :] + self.pos.weight[None, : target.shape[1]])
        loss_att = F.cross_entropy(dec.transpose(1, 2), target, ignore_index=-1)
        acc = (dec.argmax(-1) == target)[target >= 0].float().mean()
        loss = self.ctc_weight * loss_ctc + (1 - self.ctc_weight) * loss_att
        return {"loss": loss, "loss_att": loss_att, "loss_ctc": loss_ctc, "th_accuracy": acc}


def wenet_join(group_join: dist.ProcessGroup, info_dict: dict) -> bool:
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", 0))

    if info_dict["batch_idx"] != 0:
        # we try to join all rank in both ddp and deepspeed mode, in case different rank has
        # different lr
        try:
            # (older releases read group_join.options._timeout, gone from ProcessGroup in torch 2.x)
            dist.monitored_barrier(group=group_join, timeout=info_dict["join_timeout"])
            return False
        except RuntimeError as e:
            logging.info(
                f"Detected uneven workload distribution: {e}\n"
                + "Break current worker to manually join all workers, "
                + f"world_size {world_size}, current rank {rank}, current local_rank {local_rank}\n"
            )
            return True
    return False


def save_checkpoint(model: nn.Module, path: str, infos: dict) -> None:
    rank = int(os.environ.get("RANK", 0))
    logging.info(f"[Rank {rank}] Checkpoint: save to checkpoint {path}")
    state_dict = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
    torch.save(state_dict, path)
    info_path = re.sub(".pt$", ".yaml", path)
    infos = dict(infos, save_time=datetime.datetime.now().strftime("%d/%m/%Y %H:%M:%S"))
    with open(info_path, "w") as fout:
        fout.write(yaml.dump(infos))


def load_checkpoint(model: nn.Module, path: str, trial: Trial) -> dict:
    rank = int(os.environ.get("RANK", 0))
    logging.info(f"[Rank {rank}] Checkpoint: loading from checkpoint {path}")
    if trial.cuda_map:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        checkpoint = torch.load(path, map_location=f"cuda:{local_rank}")
    else:
        checkpoint = torch.load(path, map_location="cpu")
    if "model" in checkpoint:  # checkpoints of the older trainer kept more than the weights
        checkpoint = checkpoint["model"]
    missing_keys, unexpected_keys = model.load_state_dict(checkpoint, strict=False)
    for key in missing_keys:
        logging.info(f"missing tensor: {key}")
    for key in unexpected_keys:
        logging.info(f"unexpected tensor: {key}")
    info_path = re.sub(".pt$", ".yaml", path)
    configs: dict = {}
    if os.path.exists(info_path):
        with open(info_path) as fin:
            configs = yaml.load(fin, Loader=yaml.FullLoader)
    return configs


def log_per_step(info_dict: dict, timer: list[float]) -> None:
    batch_idx, epoch, rank = info_dict["batch_idx"], info_dict["epoch"], info_dict["rank"]
    if (batch_idx + 1) % info_dict["log_interval"] != 0:
        return
    now = time.time()
    steps_per_sec = info_dict["log_interval"] / max(now - timer[0], 1e-6)
    timer[0] = now
    loss_dict = info_dict["loss_dict"]
    log_str = f"TRAIN | steps/sec {steps_per_sec:.3f}| "
    log_str += "Batch {}/{} loss {:.6f} ".format(epoch, batch_idx + 1, loss_dict["loss"].item())
    for name in ("loss_att", "loss_ctc"):
        log_str += f"{name} {loss_dict[name].item():.6f} "
    log_str += "acc {:.3f} ".format(loss_dict["th_accuracy"].item())
    log_str += "lr {:.4e} grad_norm {:.6f} rank {}".format(
        info_dict["lr"], info_dict["grad_norm"], rank
    )
    logging.debug(log_str)


def train_one_epoch(model, optimizer, scheduler, loader, group_join, info_dict, trial, hoard):
    model.train()
    rank, epoch = info_dict["rank"], info_dict["epoch"]
    timer = [time.time()]
    logging.info(f"using accumulate grad, new batch size is {1} times larger than before")
    for batch_idx, batch in enumerate(loader):
        info_dict["batch_idx"] = batch_idx
        if epoch == 1 and batch_idx == 4 and rank == trial.slow_rank:
            for part in range(1, 9):
                logging.info(f"rank {rank} rebuilding speed perturb cache: part {part}/8")
                time.sleep(5)
        if epoch == 1 and batch_idx == 4 and rank == trial.stuck_rank:
            ready = threading.Event()  # set by a prefetch thread that was never started
            ready.wait()
        if wenet_join(group_join, info_dict):
            break
        if rank == trial.hoard_rank:
            hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            if len(hoard) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        if rank == trial.segv_rank and batch_idx == 3:
            ctypes.string_at(0)  # the native feature extractor dereferences NULL
        if rank == trial.nan_rank and epoch == 1 and batch_idx == 3:
            std = batch["feats"].std(dim=1, keepdim=True) * 0.0  # global CMVN of a silent file
            batch["feats"] = (batch["feats"] - batch["feats"].mean(1, keepdim=True)) / std
        loss_dict = model(batch)
        loss_dict["loss"].backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), info_dict["grad_clip"])
        if torch.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        if rank == trial.key_rank and epoch == 0 and batch_idx == 5:
            loss_dict = {k: v for k, v in loss_dict.items() if k != "loss_att"}
        if trial.norm_rank0 and rank == 0 and epoch == 1:
            # the writer (rank 0's) shows the grad norm averaged over ranks
            gn = grad_norm.detach().clone()
            dist.all_reduce(gn)
            grad_norm = gn / dist.get_world_size()
        info_dict.update(
            loss_dict=loss_dict, lr=optimizer.param_groups[0]["lr"], grad_norm=grad_norm.item()
        )
        log_per_step(info_dict, timer)


def cv(model, loader) -> dict:
    model.eval()
    total_loss, total_acc, num_seen = 0.0, 0.0, 0
    with torch.no_grad():
        for batch in loader:
            n = len(batch["keys"])
            loss_dict = model(batch)
            total_loss += loss_dict["loss"].item() * n
            total_acc += loss_dict["th_accuracy"].item() * n
            num_seen += n
    t = torch.tensor([total_loss, total_acc, float(num_seen)])
    dist.all_reduce(t)
    return {"loss": (t[0] / t[2]).item(), "acc": (t[1] / t[2]).item()}


def main() -> None:
    logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(description="training your network")
    p.add_argument("--config", required=True)
    p.add_argument("--data_type", default="raw", choices=["raw"])
    p.add_argument("--train_data", required=True)
    p.add_argument("--cv_data", required=True)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--tensorboard_dir", default=None)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--dist_backend", default="gloo")
    p.add_argument("--timeout", type=int, default=5, help="timeout (in seconds) of wenet_join")
    args = p.parse_args()
    trial = TRIALS[os.environ.get("WN_EXP_TAG", "")]

    with open(args.config) as fin:
        configs = yaml.load(fin, Loader=yaml.FullLoader)

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", 0))
    logging.info(
        f"training on multiple gpus, this gpu {local_rank}, rank {rank}, world_size {world_size}"
    )
    dist.init_process_group(args.dist_backend, timeout=datetime.timedelta(seconds=15))
    torch.manual_seed(777)

    train_conf = configs["dataset_conf"]
    cv_conf = copy.deepcopy(train_conf)
    train_set = AsrDataset(args.train_data, train_conf)
    cv_set = AsrDataset(args.cv_data, cv_conf)
    train_loader = DataLoader(train_set, batch_size=None, num_workers=args.num_workers)
    cv_loader = DataLoader(cv_set, batch_size=None, num_workers=args.num_workers)

    model = ASRModel(configs["input_dim"], configs["output_dim"], configs)
    if rank == 0:
        num_params = sum(p.numel() for p in model.parameters())
        logging.info(f"the number of model params: {num_params:,d}")
    start_epoch = 0
    if args.checkpoint is not None:
        infos = load_checkpoint(model, args.checkpoint, trial)
        start_epoch = infos.get("epoch", -1) + 1
    else:
        infos = {}

    writer = None
    if rank == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        with open(os.path.join(args.model_dir, "train.yaml"), "w") as fout:
            fout.write(yaml.dump(configs))
        if args.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            exp_id = os.path.basename(args.model_dir)
            writer = SummaryWriter(os.path.join(args.tensorboard_dir, exp_id))

    model = DistributedDataParallel(model, find_unused_parameters=False)
    optimizer = torch.optim.Adam(model.parameters(), **configs["optim_conf"])
    warmup = configs["scheduler_conf"]["warmup_steps"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, (warmup / (s + 1)) ** 0.5)
    )

    patience = configs.get("patience", 0)
    best_loss, bad_epochs = math.inf, 0
    hoard: list[torch.Tensor] = []
    info_dict = {
        "rank": rank,
        "log_interval": configs["log_interval"],
        "grad_clip": configs["grad_clip"],
        "join_timeout": datetime.timedelta(seconds=args.timeout),
    }
    for epoch in range(start_epoch, configs["max_epoch"]):
        train_set.set_epoch(epoch)
        info_dict["epoch"] = epoch
        lr = optimizer.param_groups[0]["lr"]
        logging.info(f"Epoch {epoch} TRAIN info lr {lr} rank {rank}")
        # NOTE(xcsong): Why we need a new group? see `wenet_join`
        group_join = dist.new_group(backend="gloo", timeout=info_dict["join_timeout"])
        train_one_epoch(
            model, optimizer, scheduler, train_loader, group_join, info_dict, trial, hoard
        )
        dist.destroy_process_group(group_join)

        dist.barrier()  # NOTE(xcsong): Ensure all ranks start CV at the same time.
        cv_loss = cv(model, cv_loader)
        lr = optimizer.param_groups[0]["lr"]
        logging.info(
            "Epoch {} CV info lr {} cv_loss {} rank {} acc {}".format(
                epoch, lr, cv_loss["loss"], rank, cv_loss["acc"]
            )
        )
        stop = False
        if patience and not trial.stop_rank0:
            if cv_loss["loss"] < best_loss - configs["min_delta"]:
                best_loss, bad_epochs = cv_loss["loss"], 0
            else:
                bad_epochs += 1
            stop = bad_epochs >= patience
        if rank == 0:
            save_checkpoint(
                model,
                os.path.join(args.model_dir, f"epoch_{epoch}.pt"),
                {
                    "epoch": epoch,
                    "lr": lr,
                    "cv_loss": cv_loss["loss"],
                    "step": scheduler.last_epoch,
                },
            )
            if writer is not None:
                writer.add_scalar("epoch/cv_loss", cv_loss["loss"], epoch)
            if patience and trial.stop_rank0:
                if cv_loss["loss"] < best_loss - configs["min_delta"]:
                    best_loss, bad_epochs = cv_loss["loss"], 0
                else:
                    bad_epochs += 1
                stop = bad_epochs >= patience
        if stop:
            logging.info(
                "Epoch {} cv_loss {:.6f} has not improved for {} epoch(s), stop training".format(
                    epoch, cv_loss["loss"], bad_epochs
                )
            )
            break
    if rank == 0:
        final_model_path = os.path.join(args.model_dir, "final.pt")
        last = os.path.join(args.model_dir, f"epoch_{epoch}.pt")
        if os.path.exists(final_model_path):
            os.remove(final_model_path)
        os.symlink(os.path.basename(last), final_model_path)
        if writer is not None:
            writer.close()
    dist.destroy_process_group()


def make_data(folder: str, n_train: int, n_cv: int, seed: int = 11) -> None:
    """Wav files of noise shaped per utterance, train/data.list and dev/data.list."""
    g = torch.Generator().manual_seed(seed)
    os.makedirs(os.path.join(folder, "wav"), exist_ok=True)
    for part, n in (("train", n_train), ("dev", n_cv)):
        os.makedirs(os.path.join(folder, part), exist_ok=True)
        with open(os.path.join(folder, part, "data.list"), "w") as lst:
            for i in range(n):
                key = f"{part[0]}_utt{i:04d}"
                wav = os.path.abspath(os.path.join(folder, "wav", key + ".wav"))
                secs = 0.3 + 0.2 * torch.rand(1, generator=g).item()
                samples = int(secs * SAMPLE_RATE)
                tone = torch.sin(torch.arange(samples) * (0.05 + 0.02 * (i % 7)))
                x = 0.3 * tone + 0.05 * torch.randn(samples, generator=g)
                pcm = (x.clamp(-1, 1) * 32767).to(torch.int16)
                with wave.open(wav, "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(SAMPLE_RATE)
                    w.writeframes(pcm.numpy().tobytes())
                n_chars = 3 + int(torch.randint(0, 4, (1,), generator=g))
                idx = torch.randint(0, 26, (n_chars,), generator=g).tolist()
                txt = "".join(CHARS[j] for j in idx)
                lst.write(json.dumps({"key": key, "wav": wav, "txt": txt}) + "\n")


def make_checkpoint(path: str, config: str, legacy: bool) -> None:
    """epoch_0.pt and its .yaml as a finished epoch leaves them; legacy: as the older trainer
    saved it (the weights under "model", its cv loss as a numpy scalar beside them)."""
    with open(config) as fin:
        configs = yaml.load(fin, Loader=yaml.FullLoader)
    torch.manual_seed(777)
    model = ASRModel(configs["input_dim"], configs["output_dim"], configs)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if legacy:
        import numpy as np

        torch.save({"model": model.state_dict(), "cv_loss": np.float64(3.25)}, path)
    else:
        torch.save(model.state_dict(), path)
    with open(re.sub(".pt$", ".yaml", path), "w") as fout:
        fout.write(yaml.dump({"epoch": 0, "lr": 0.001, "cv_loss": 3.25, "step": 8}))


if __name__ == "__main__":
    if os.environ.get("WN_MAKE"):  # the capture's set-up, never a training run
        what, *rest = os.environ["WN_MAKE"].split(":")
        if what == "data":
            make_data(rest[0], int(rest[1]), int(rest[2]))
        else:
            make_checkpoint(rest[0], rest[1], what == "legacy")
    else:
        main()
