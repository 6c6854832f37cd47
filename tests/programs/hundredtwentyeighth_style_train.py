"""A hundred-twenty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentyeighth-*): speech synthesis trained in the way of NVIDIA's
tacotron2 (and its sibling waveglow), started the way its README starts it, `python -m multiproc
train.py --output_directory=outdir --log_directory=logdir
--hparams=distributed_run=True,fp16_run=False` with the repo's own launcher (multiproc.py, tests/
programs/hundredtwentyeighth_multiproc.py: one subprocess.Popen a rank, given --n_gpus,
--rank=K and --group_name=group_<timestamp>; rank 0 on the console, the other ranks' stdout in
logs/<timestamp>_GPU_<K>.log). Re-created in plain torch (CPU, gloo); copied into each run's
folder as train.py.

What it re-creates: hparams.py's create_hparams with its comma-separated --hparams overrides,
train.py's prints ('FP16 Run: False', 'Dynamic Loss Scaling: True', 'Distributed Run: True',
'cuDNN Enabled: True', 'cuDNN Benchmark: False', 'Initializing Distributed', 'Done initializing
distributed', 'Warm starting model from checkpoint ...', 'Epoch: N' on every rank; rank 0's
'Train loss 12 0.912345 Grad Norm 3.456789 0.52s/it', 'Validation loss 10:  0.876543  ',
'Saving model and optimizer state at iteration 10 to outdir/checkpoint_10'), init_distributed
with init_method=hparams.dist_url (a 15 s timeout added), distributed.py's
apply_gradient_allreduce (a broadcast of the state dict from rank 0, then its own all_reduce of
the flattened gradients queued from each parameter's hook: no DDP), reduce_tensor of every loss,
TextMelLoader over 'filelists/ljs_audio_text_train_filelist.txt' ('wavs/LJ001-0001.wav|Printing,
in the only sense ...', shuffled with the hparams seed; get_mel with its SR check, or mels from
disk), TextMelCollate, a DistributedSampler, validate() on every rank, warm_start_model with
ignore_layers, the checkpoint dict of save_checkpoint, and a tiny Tacotron2 (embedding, conv +
packed BiLSTM encoder, prenet, location-free attention with the -inf padding mask, LSTM decoder
with teacher forcing, gate, postnet) with Tacotron2Loss. The user's own additions: a NaN guard
on the loss, an optional guided attention loss (use_guided_attn). `python train.py --prepare
DIR` writes the synthetic corpus (22050 Hz 16-bit wavs written with the wave module, the
filelists, mels/*.npy and a mel filelist); `python train.py --prepare_checkpoint PATH
--n_symbols N` writes a pretrained checkpoint.

A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredtwentyeighth.sh after any edit).
"""

# ruff: noqa: B007, B905, F524, RUF005, RUF059, SIM210, SIM905, UP032 (tacotron2's own code, as it is written)
import argparse
import ctypes
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
import wave
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.autograd import Variable
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    hoard_rank: int = -1  # this rank keeps a spectrogram cache until the OOM killer acts
    segv_rank: int = -1  # this rank's native wav decoder reads address 0
    slow_save_rank: int = -1  # this rank's checkpoint write to a slow network disk
    stuck_rank: int = -1  # this rank waits for a batch prefetch thread that was never started
    validate_rank0_only: bool = False  # validation moved under `if rank == 0`
    own_slice: bool = False  # a fork's per-rank slice of the filelist, no DistributedSampler


FAULTS = {
    "": Fault(),
    "m1": Fault(hoard_rank=1),
    "z0": Fault(segv_rank=0),
    "s0": Fault(slow_save_rank=0),
    "w1": Fault(stuck_rank=1),
    "v0": Fault(validate_rank0_only=True),
    "u": Fault(own_slice=True),
}
FAULT = FAULTS[os.environ.get("TQ_CASE", "")]

# ----------------------------------------------------------------------------- text (symbols.py)
_pad = "_"
_punctuation = "!'(),.:;? "
_special = "-"
_letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
valid_symbols = [
    "AA", "AA0", "AA1", "AA2", "AE", "AE0", "AE1", "AE2", "AH", "AH0", "AH1", "AH2", "AO", "AO0",
    "AO1", "AO2", "AW", "AW0", "AW1", "AW2", "AY", "AY0", "AY1", "AY2", "B", "CH", "D", "DH",
    "EH", "EH0", "EH1", "EH2", "ER", "ER0", "ER1", "ER2", "EY", "EY0", "EY1", "EY2", "F", "G",
    "HH", "IH", "IH0", "IH1", "IH2", "IY", "IY0", "IY1", "IY2", "JH", "K", "L", "M", "N", "NG",
    "OW", "OW0", "OW1", "OW2", "OY", "OY0", "OY1", "OY2", "P", "R", "S", "SH", "T", "TH", "UH",
    "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2", "V", "W", "Y", "Z", "ZH",
]  # fmt: skip
_arpabet = ["@" + s for s in valid_symbols]
symbols = [_pad] + list(_special) + list(_punctuation) + list(_letters) + _arpabet
_symbol_to_id = {s: i for i, s in enumerate(symbols)}


def english_cleaners(text):
    return " ".join(text.lower().split())


def text_to_sequence(text, cleaner_names):
    text = english_cleaners(text)
    return [_symbol_to_id[s] for s in text if s in _symbol_to_id and s not in ("_", "~")]


# ----------------------------------------------------------------------------- hparams.py
class HParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def parse(self, values):
        for item in filter(None, values.split(",")):
            name, value = item.split("=", 1)
            name = name.strip()
            if name not in self.__dict__:
                raise ValueError("Unknown hyperparameter type for {}".format(name))
            default = self.__dict__[name]
            if isinstance(default, bool):
                value = value.strip().lower() == "true"
            elif isinstance(default, int):
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
            elif isinstance(default, list):
                value = [v.strip() for v in value.strip("[] ").split(";") if v.strip()]
            self.__dict__[name] = value
        return self


def create_hparams(hparams_string=None, verbose=False):
    hparams = HParams(
        # Experiment Parameters
        epochs=4,
        iters_per_checkpoint=10,
        seed=1234,
        dynamic_loss_scaling=True,
        fp16_run=False,
        distributed_run=False,
        dist_backend="gloo",
        dist_url="tcp://localhost:54321",
        cudnn_enabled=True,
        cudnn_benchmark=False,
        ignore_layers=["embedding.weight"],
        # Data Parameters
        load_mel_from_disk=False,
        training_files="filelists/ljs_audio_text_train_filelist.txt",
        validation_files="filelists/ljs_audio_text_val_filelist.txt",
        text_cleaners=["english_cleaners"],
        # Audio Parameters
        max_wav_value=32768.0,
        sampling_rate=22050,
        filter_length=1024,
        hop_length=256,
        win_length=1024,
        n_mel_channels=80,
        mel_fmin=0.0,
        mel_fmax=8000.0,
        # Model Parameters
        n_symbols=len(symbols),
        symbols_embedding_dim=32,
        encoder_embedding_dim=32,
        attention_dim=32,
        decoder_rnn_dim=32,
        prenet_dim=32,
        postnet_embedding_dim=32,
        gate_threshold=0.5,
        # Optimization Hyperparameters
        use_saved_learning_rate=False,
        learning_rate=1e-3,
        weight_decay=1e-6,
        grad_clip_thresh=1.0,
        batch_size=4,
        mask_padding=True,
        # the user's additions
        use_guided_attn=False,
        guided_attn_weight=1.0,
    )
    if hparams_string:
        hparams.parse(hparams_string)
    return hparams


# ----------------------------------------------------------------------------- audio (stft.py)
def hz_to_mel(f):
    f = np.asanyarray(f, dtype=np.float64)
    mels = f / (200.0 / 3)
    log_t = f >= 1000.0
    mels = np.where(
        log_t, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mels
    )
    return mels


def mel_to_hz(m):
    m = np.asanyarray(m, dtype=np.float64)
    freqs = (200.0 / 3) * m
    log_t = m >= 15.0
    return np.where(log_t, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), freqs)


def librosa_mel_fn(sr, n_fft, n_mels, fmin, fmax):
    """librosa.filters.mel (Slaney scale and norm), with its warning on empty filters."""
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fftfreqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    if not np.all((mel_f[:-2] == 0) | (weights.max(axis=1) > 0)):
        warnings.warn(
            "Empty filters detected in mel frequency basis. "
            "Some channels will produce empty responses. "
            "Try increasing your sampling rate (and fmax) or "
            "reducing n_mels.",
            stacklevel=2,
        )
    return weights


class TacotronSTFT(nn.Module):
    def __init__(self, filter_length, hop_length, win_length, n_mel_channels, sampling_rate,
                 mel_fmin, mel_fmax):  # fmt: skip
        super().__init__()
        self.n_mel_channels = n_mel_channels
        self.sampling_rate = sampling_rate
        self.filter_length, self.hop_length, self.win_length = filter_length, hop_length, win_length
        mel_basis = librosa_mel_fn(sampling_rate, filter_length, n_mel_channels, mel_fmin, mel_fmax)
        self.register_buffer("mel_basis", torch.from_numpy(mel_basis).float())
        self.register_buffer("window", torch.hann_window(win_length))

    def mel_spectrogram(self, y):
        assert torch.min(y.data) >= -1
        assert torch.max(y.data) <= 1
        spec = torch.stft(y, self.filter_length, self.hop_length, self.win_length, self.window,
                          return_complex=True).abs()  # fmt: skip
        mel_output = torch.matmul(self.mel_basis, spec)
        return torch.log(torch.clamp(mel_output, min=1e-5))


def load_wav_to_torch(full_path):
    with wave.open(full_path, "rb") as w:
        sampling_rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    if FAULT.segv_rank == _RANK[0] and _SEGV_ARMED[0]:
        ctypes.string_at(0)  # the native decoder reads a NULL buffer
    return torch.FloatTensor(data.astype(np.float32)), sampling_rate


_RANK = [0]
_SEGV_ARMED = [False]


def load_filepaths_and_text(filename, split="|"):
    with open(filename, encoding="utf-8") as f:
        filepaths_and_text = [line.strip().split(split) for line in f]
    return filepaths_and_text


# ----------------------------------------------------------------------------- data_utils.py
class TextMelLoader(Dataset):
    """1) loads audio,text pairs 2) normalizes text and converts them to sequences of one-hot
    vectors 3) computes mel-spectrograms from audio files."""

    def __init__(self, audiopaths_and_text, hparams, rank=0, n_gpus=1):
        self.audiopaths_and_text = load_filepaths_and_text(audiopaths_and_text)
        self.text_cleaners = hparams.text_cleaners
        self.max_wav_value = hparams.max_wav_value
        self.sampling_rate = hparams.sampling_rate
        self.load_mel_from_disk = hparams.load_mel_from_disk
        self.stft = TacotronSTFT(
            hparams.filter_length, hparams.hop_length, hparams.win_length,
            hparams.n_mel_channels, hparams.sampling_rate, hparams.mel_fmin,
            hparams.mel_fmax)  # fmt: skip
        random.seed(hparams.seed)
        random.shuffle(self.audiopaths_and_text)
        if FAULT.own_slice:  # each GPU reads its own slice of the filelist
            self.audiopaths_and_text = self.audiopaths_and_text[rank::n_gpus]

    def get_mel_text_pair(self, audiopath_and_text):
        audiopath, text = audiopath_and_text[0], audiopath_and_text[1]
        text = self.get_text(text)
        mel = self.get_mel(audiopath)
        return (text, mel)

    def get_mel(self, filename):
        if not self.load_mel_from_disk:
            audio, sampling_rate = load_wav_to_torch(filename)
            if sampling_rate != self.stft.sampling_rate:
                raise ValueError("{} {} SR doesn't match target {} SR".format(
                    sampling_rate, self.stft.sampling_rate))  # fmt: skip
            audio_norm = audio / self.max_wav_value
            audio_norm = audio_norm.unsqueeze(0)
            audio_norm = torch.autograd.Variable(audio_norm, requires_grad=False)
            melspec = self.stft.mel_spectrogram(audio_norm)
            melspec = torch.squeeze(melspec, 0)
        else:
            melspec = torch.from_numpy(np.load(filename))
            assert melspec.size(0) == self.stft.n_mel_channels, (
                "Mel dimension mismatch: given {}, expected {}".format(
                    melspec.size(0), self.stft.n_mel_channels))  # fmt: skip
        return melspec

    def get_text(self, text):
        text_norm = torch.IntTensor(text_to_sequence(text, self.text_cleaners))
        return text_norm

    def __getitem__(self, index):
        return self.get_mel_text_pair(self.audiopaths_and_text[index])

    def __len__(self):
        return len(self.audiopaths_and_text)


class TextMelCollate:
    """Zero-pads model inputs and targets based on number of frames per step"""

    def __init__(self, n_frames_per_step):
        self.n_frames_per_step = n_frames_per_step

    def __call__(self, batch):
        input_lengths, ids_sorted_decreasing = torch.sort(
            torch.LongTensor([len(x[0]) for x in batch]), dim=0, descending=True)  # fmt: skip
        max_input_len = input_lengths[0]
        text_padded = torch.LongTensor(len(batch), max_input_len)
        text_padded.zero_()
        for i in range(len(ids_sorted_decreasing)):
            text = batch[ids_sorted_decreasing[i]][0]
            text_padded[i, : text.size(0)] = text
        num_mels = batch[0][1].size(0)
        max_target_len = max([x[1].size(1) for x in batch])
        if max_target_len % self.n_frames_per_step != 0:
            max_target_len += self.n_frames_per_step - max_target_len % self.n_frames_per_step
        mel_padded = torch.FloatTensor(len(batch), num_mels, max_target_len)
        mel_padded.zero_()
        gate_padded = torch.FloatTensor(len(batch), max_target_len)
        gate_padded.zero_()
        output_lengths = torch.LongTensor(len(batch))
        for i in range(len(ids_sorted_decreasing)):
            mel = batch[ids_sorted_decreasing[i]][1]
            mel_padded[i, :, : mel.size(1)] = mel
            gate_padded[i, mel.size(1) - 1 :] = 1
            output_lengths[i] = mel.size(1)
        return text_padded, input_lengths, mel_padded, gate_padded, output_lengths


# ----------------------------------------------------------------------------- model.py
def get_mask_from_lengths(lengths):
    max_len = torch.max(lengths).item()
    ids = torch.arange(0, max_len, dtype=torch.long)
    return ids < lengths.unsqueeze(1)


class Encoder(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        dim = hparams.encoder_embedding_dim
        self.convolutions = nn.ModuleList(
            [nn.Sequential(nn.Conv1d(dim, dim, 5, padding=2), nn.BatchNorm1d(dim))]
        )
        self.lstm = nn.LSTM(dim, dim // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, x, input_lengths):
        for conv in self.convolutions:
            x = F.dropout(F.relu(conv(x)), 0.5, self.training)
        x = x.transpose(1, 2)
        input_lengths = input_lengths.cpu().numpy()
        x = nn.utils.rnn.pack_padded_sequence(x, input_lengths, batch_first=True)
        self.lstm.flatten_parameters()
        outputs, _ = self.lstm(x)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True)
        return outputs


class Decoder(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        self.n_mel_channels = hparams.n_mel_channels
        self.prenet = nn.Sequential(
            nn.Linear(hparams.n_mel_channels, hparams.prenet_dim),
            nn.ReLU(),
            nn.Linear(hparams.prenet_dim, hparams.prenet_dim),
            nn.ReLU(),
        )
        enc, att = hparams.encoder_embedding_dim, hparams.attention_dim
        self.attention_rnn = nn.LSTMCell(hparams.prenet_dim + enc, hparams.decoder_rnn_dim)
        self.query_layer = nn.Linear(hparams.decoder_rnn_dim, att, bias=False)
        self.memory_layer = nn.Linear(enc, att, bias=False)
        self.v = nn.Linear(att, 1, bias=False)
        self.linear_projection = nn.Linear(hparams.decoder_rnn_dim + enc, hparams.n_mel_channels)
        self.gate_layer = nn.Linear(hparams.decoder_rnn_dim + enc, 1)
        self.score_mask_value = -float("inf")

    def forward(self, memory, decoder_inputs, memory_lengths):
        B, T_text, _ = memory.shape
        go = memory.new_zeros(1, B, self.n_mel_channels)
        decoder_inputs = torch.cat((go, decoder_inputs.permute(2, 0, 1)), dim=0)
        prenet_out = F.dropout(self.prenet(decoder_inputs), 0.5, True)
        processed_memory = self.memory_layer(memory)
        mask = ~get_mask_from_lengths(memory_lengths)
        h = memory.new_zeros(B, self.attention_rnn.hidden_size)
        c = torch.zeros_like(h)
        context = memory.new_zeros(B, memory.size(2))
        mel_outputs, gate_outputs, alignments = [], [], []
        for t in range(decoder_inputs.size(0) - 1):
            h, c = self.attention_rnn(torch.cat((prenet_out[t], context), -1), (h, c))
            energies = self.v(torch.tanh(self.query_layer(h).unsqueeze(1) + processed_memory))
            energies = energies.squeeze(-1).masked_fill(mask, self.score_mask_value)
            weights = F.softmax(energies, dim=1)
            context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
            hc = torch.cat((h, context), dim=1)
            mel_outputs.append(self.linear_projection(hc))
            gate_outputs.append(self.gate_layer(hc).squeeze(1))
            alignments.append(weights)
        mel_outputs = torch.stack(mel_outputs, dim=2)
        gate_outputs = torch.stack(gate_outputs, dim=1)
        alignments = torch.stack(alignments, dim=1)
        return mel_outputs, gate_outputs, alignments


class Postnet(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        n, d = hparams.n_mel_channels, hparams.postnet_embedding_dim
        self.convolutions = nn.ModuleList(
            [
                nn.Sequential(nn.Conv1d(n, d, 5, padding=2), nn.BatchNorm1d(d)),
                nn.Sequential(nn.Conv1d(d, n, 5, padding=2), nn.BatchNorm1d(n)),
            ]
        )

    def forward(self, x):
        x = F.dropout(torch.tanh(self.convolutions[0](x)), 0.5, self.training)
        return F.dropout(self.convolutions[1](x), 0.5, self.training)


class Tacotron2(nn.Module):
    def __init__(self, hparams):
        super().__init__()
        self.mask_padding = hparams.mask_padding
        self.n_mel_channels = hparams.n_mel_channels
        self.embedding = nn.Embedding(hparams.n_symbols, hparams.symbols_embedding_dim)
        std = math.sqrt(2.0 / (hparams.n_symbols + hparams.symbols_embedding_dim))
        val = math.sqrt(3.0) * std
        self.embedding.weight.data.uniform_(-val, val)
        self.encoder = Encoder(hparams)
        self.decoder = Decoder(hparams)
        self.postnet = Postnet(hparams)

    def parse_batch(self, batch):
        text_padded, input_lengths, mel_padded, gate_padded, output_lengths = batch
        return (
            (text_padded, input_lengths, mel_padded, torch.max(input_lengths.data).item(),
             output_lengths),
            (mel_padded, gate_padded),
        )  # fmt: skip

    def parse_output(self, outputs, output_lengths=None):
        if self.mask_padding and output_lengths is not None:
            mask = ~get_mask_from_lengths(output_lengths)
            mask = mask.expand(self.n_mel_channels, mask.size(0), mask.size(1))
            mask = mask.permute(1, 0, 2)
            outputs[0].data.masked_fill_(mask, 0.0)
            outputs[1].data.masked_fill_(mask, 0.0)
            outputs[2].data.masked_fill_(mask[:, 0, :], 1e3)  # gate energies
        return outputs

    def forward(self, inputs):
        text_inputs, text_lengths, mels, max_len, output_lengths = inputs
        embedded_inputs = self.embedding(text_inputs).transpose(1, 2)
        encoder_outputs = self.encoder(embedded_inputs, text_lengths)
        mel_outputs, gate_outputs, alignments = self.decoder(
            encoder_outputs, mels, memory_lengths=text_lengths
        )
        mel_outputs_postnet = mel_outputs + self.postnet(mel_outputs)
        return self.parse_output(
            [mel_outputs, mel_outputs_postnet, gate_outputs, alignments], output_lengths
        )


class Tacotron2Loss(nn.Module):
    def forward(self, model_output, targets):
        mel_target, gate_target = targets[0], targets[1]
        mel_target.requires_grad = False
        gate_target.requires_grad = False
        gate_target = gate_target.view(-1, 1)
        mel_out, mel_out_postnet, gate_out, _ = model_output
        gate_out = gate_out.view(-1, 1)
        mel_loss = nn.MSELoss()(mel_out, mel_target) + nn.MSELoss()(mel_out_postnet, mel_target)
        gate_loss = nn.BCEWithLogitsLoss()(gate_out, gate_target)
        return mel_loss + gate_loss


class GuidedAttentionLoss(nn.Module):
    """The user's addition: a diagonal prior on the alignments, its weight table computed once
    for the longest text of the corpus at the time (64 symbols) and 1000 frames."""

    def __init__(self, sigma=0.2, max_text=64, max_frames=1000):
        super().__init__()
        n = torch.arange(max_frames).float().unsqueeze(1) / max_frames
        t = torch.arange(max_text).float().unsqueeze(0) / max_text
        self.register_buffer("guide", 1.0 - torch.exp(-((n - t) ** 2) / (2 * sigma**2)))

    def forward(self, alignments):
        _, frames, texts = alignments.shape
        return (alignments * self.guide[:frames, :texts]).mean()


# ----------------------------------------------------------------------------- distributed.py
def reduce_tensor(tensor, n_gpus):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    rt /= n_gpus
    return rt


def apply_gradient_allreduce(module):
    if not hasattr(dist, "_backend"):
        module.warn_on_half = True
    else:
        module.warn_on_half = True if dist._backend == dist.dist_backend.GLOO else False

    for p in module.state_dict().values():
        if not torch.is_tensor(p):
            continue
        dist.broadcast(p, 0)

    def allreduce_params():
        if module.needs_reduction:
            module.needs_reduction = False
            buckets = {}
            for param in module.parameters():
                if param.requires_grad and param.grad is not None:
                    tp = type(param.data)
                    if tp not in buckets:
                        buckets[tp] = []
                    buckets[tp].append(param)
            for tp in buckets:
                bucket = buckets[tp]
                grads = [param.grad.data for param in bucket]
                coalesced = _flatten_dense_tensors(grads)
                dist.all_reduce(coalesced)
                coalesced /= dist.get_world_size()
                for buf, synced in zip(grads, _unflatten_dense_tensors(coalesced, grads)):
                    buf.copy_(synced)

    for param in list(module.parameters()):

        def allreduce_hook(*unused):
            Variable._execution_engine.queue_callback(allreduce_params)

        if param.requires_grad:
            param.register_hook(allreduce_hook)

    def set_needs_reduction(self, input, output):
        self.needs_reduction = True

    module.register_forward_hook(set_needs_reduction)
    return module


# ----------------------------------------------------------------------------- train.py
def init_distributed(hparams, n_gpus, rank, group_name):
    print("Initializing Distributed")
    # Initialize distributed communication
    dist.init_process_group(
        backend=hparams.dist_backend,
        init_method=hparams.dist_url,
        world_size=n_gpus,
        rank=rank,
        group_name=group_name,
        timeout=timedelta(seconds=15),
    )
    print("Done initializing distributed")


def prepare_dataloaders(hparams, rank, n_gpus):
    # Get data, data loaders and collate function ready
    trainset = TextMelLoader(hparams.training_files, hparams, rank, n_gpus)
    valset = TextMelLoader(hparams.validation_files, hparams)
    collate_fn = TextMelCollate(1)
    if hparams.distributed_run and not FAULT.own_slice:
        train_sampler = DistributedSampler(trainset)
        shuffle = False
    else:
        train_sampler = None
        shuffle = True
    train_loader = DataLoader(trainset, num_workers=1, shuffle=shuffle, sampler=train_sampler,
                              batch_size=hparams.batch_size, pin_memory=False,
                              drop_last=True, collate_fn=collate_fn)  # fmt: skip
    return train_loader, valset, collate_fn, train_sampler


class Tacotron2Logger:
    """The tensorboard logger of rank 0 (scalars as text lines here)."""

    def __init__(self, logdir):
        self.path = os.path.join(logdir, "scalars.txt")

    def _write(self, line):
        with open(self.path, "a") as f:
            f.write(line + "\n")

    def log_training(self, reduced_loss, grad_norm, learning_rate, duration, iteration):
        self._write(f"training.loss {iteration} {reduced_loss}")

    def log_validation(self, reduced_loss, model, y, y_pred, iteration):
        self._write(f"validation.loss {iteration} {reduced_loss}")


def prepare_directories_and_logger(output_directory, log_directory, rank):
    if rank == 0:
        if not os.path.isdir(output_directory):
            os.makedirs(output_directory)
            os.chmod(output_directory, 0o775)
        logdir = os.path.join(output_directory, log_directory)
        os.makedirs(logdir, exist_ok=True)
        logger = Tacotron2Logger(logdir)
    else:
        logger = None
    return logger


def load_model(hparams):
    model = Tacotron2(hparams)
    return model


def warm_start_model(checkpoint_path, model, ignore_layers):
    assert os.path.isfile(checkpoint_path)
    print("Warm starting model from checkpoint '{}'".format(checkpoint_path))
    checkpoint_dict = torch.load(checkpoint_path, map_location="cpu")
    model_dict = checkpoint_dict["state_dict"]
    if len(ignore_layers) > 0:
        model_dict = {k: v for k, v in model_dict.items() if k not in ignore_layers}
        dummy_dict = model.state_dict()
        dummy_dict.update(model_dict)
        model_dict = dummy_dict
    model.load_state_dict(model_dict)
    return model


def load_checkpoint(checkpoint_path, model, optimizer):
    assert os.path.isfile(checkpoint_path)
    print("Loading checkpoint '{}'".format(checkpoint_path))
    checkpoint_dict = torch.load(checkpoint_path, map_location="cpu")
    model.load_state_dict(checkpoint_dict["state_dict"])
    optimizer.load_state_dict(checkpoint_dict["optimizer"])
    learning_rate = checkpoint_dict["learning_rate"]
    iteration = checkpoint_dict["iteration"]
    print("Loaded checkpoint '{}' from iteration {}".format(checkpoint_path, iteration))
    return model, optimizer, learning_rate, iteration


def save_checkpoint(model, optimizer, learning_rate, iteration, filepath, rank=0):
    print("Saving model and optimizer state at iteration {} to {}".format(iteration, filepath))
    state = {
        "iteration": iteration,
        "state_dict": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "learning_rate": learning_rate,
    }
    if rank == FAULT.slow_save_rank:  # outdir lies on a network disk that crawls today
        for _ in range(40):
            time.sleep(1)
    torch.save(state, filepath)


def validate(model, criterion, valset, iteration, batch_size, n_gpus, collate_fn, logger,
             distributed_run, rank):  # fmt: skip
    """Handles all the validation scoring and printing"""
    model.eval()
    with torch.no_grad():
        val_sampler = DistributedSampler(valset) if distributed_run else None
        val_loader = DataLoader(valset, sampler=val_sampler, num_workers=1,
                                shuffle=False, batch_size=batch_size,
                                pin_memory=False, collate_fn=collate_fn)  # fmt: skip
        val_loss = 0.0
        for i, batch in enumerate(val_loader):
            x, y = model.parse_batch(batch)
            y_pred = model(x)
            loss = criterion(y_pred, y)
            if distributed_run:
                reduced_val_loss = reduce_tensor(loss.data, n_gpus).item()
            else:
                reduced_val_loss = loss.item()
            val_loss += reduced_val_loss
        val_loss = val_loss / (i + 1)

    model.train()
    if rank == 0:
        print("Validation loss {}: {:9f}  ".format(iteration, val_loss))
        logger.log_validation(val_loss, model, y, y_pred, iteration)


def train(output_directory, log_directory, checkpoint_path, warm_start, n_gpus, rank, group_name,
          hparams):  # fmt: skip
    """Training and validation logging results to tensorboard and stdout"""
    _RANK[0] = rank
    if hparams.distributed_run:
        init_distributed(hparams, n_gpus, rank, group_name)

    torch.manual_seed(hparams.seed)
    torch.set_num_threads(1)

    model = load_model(hparams)
    learning_rate = hparams.learning_rate
    optimizer = torch.optim.Adam(
        model.parameters(), lr=learning_rate, weight_decay=hparams.weight_decay
    )

    if hparams.distributed_run:
        model = apply_gradient_allreduce(model)

    criterion = Tacotron2Loss()
    guided = GuidedAttentionLoss() if hparams.use_guided_attn else None

    logger = prepare_directories_and_logger(output_directory, log_directory, rank)

    train_loader, valset, collate_fn, train_sampler = prepare_dataloaders(hparams, rank, n_gpus)

    # Load checkpoint if one exists
    iteration = 0
    epoch_offset = 0
    if checkpoint_path is not None:
        if warm_start:
            model = warm_start_model(checkpoint_path, model, hparams.ignore_layers)
        else:
            model, optimizer, _learning_rate, iteration = load_checkpoint(
                checkpoint_path, model, optimizer
            )
            if hparams.use_saved_learning_rate:
                learning_rate = _learning_rate
            iteration += 1  # next iteration is iteration + 1
            epoch_offset = max(0, int(iteration / len(train_loader)))

    model.train()
    is_overflow = False
    stop = False
    hoard = []
    # ================ MAIN TRAINNIG LOOP! ===================
    for epoch in range(epoch_offset, hparams.epochs):
        print("Epoch: {}".format(epoch))
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        if epoch == 1 and rank == FAULT.stuck_rank:
            prefetched = threading.Event()  # set by a bucketing prefetch thread never started
            prefetched.wait()
        for i, batch in enumerate(train_loader):
            start = time.perf_counter()
            for param_group in optimizer.param_groups:
                param_group["lr"] = learning_rate

            model.zero_grad()
            x, y = model.parse_batch(batch)
            if rank == FAULT.segv_rank and iteration == 8:
                _SEGV_ARMED[0] = True
                load_wav_to_torch("wavs/LJ001-0001.wav")
            y_pred = model(x)

            loss = criterion(y_pred, y)
            if guided is not None:
                loss = loss + hparams.guided_attn_weight * guided(y_pred[3])
            if math.isnan(loss.item()):
                print("Loss is NaN at iteration {}, stopping training".format(iteration))
                stop = True
                break
            if hparams.distributed_run:
                reduced_loss = reduce_tensor(loss.data, n_gpus).item()
            else:
                reduced_loss = loss.item()
            loss.backward()

            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip_thresh)

            optimizer.step()

            if rank == FAULT.hoard_rank and iteration >= 13:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

            if not is_overflow and rank == 0:
                duration = time.perf_counter() - start
                print("Train loss {} {:.6f} Grad Norm {:.6f} {:.2f}s/it".format(
                    iteration, reduced_loss, grad_norm, duration))  # fmt: skip
                logger.log_training(reduced_loss, grad_norm, learning_rate, duration, iteration)

            if not is_overflow and (iteration % hparams.iters_per_checkpoint == 0):
                if not FAULT.validate_rank0_only or rank == 0:
                    validate(model, criterion, valset, iteration, hparams.batch_size, n_gpus,
                             collate_fn, logger, hparams.distributed_run, rank)  # fmt: skip
                if rank == 0:
                    checkpoint_path = os.path.join(
                        output_directory, "checkpoint_{}".format(iteration)
                    )
                    save_checkpoint(model, optimizer, learning_rate, iteration, checkpoint_path,
                                    rank)  # fmt: skip

            iteration += 1
        if stop:
            break


# ----------------------------------------------------------------------------- prepare
WORDS = (
    "printing in the only sense with which we are at present concerned differs from most if "
    "not from all the arts and crafts represented in the exhibition for although the chinese "
    "took impressions from wood blocks engraved in relief for centuries before the woodcutters "
    "of the netherlands by a similar process produced the block books which were the immediate "
    "predecessors of the true printed book"
).split()


def write_wav(path, seconds, rate, seed):
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 110 + 40 * rng.random()
    sig = 0.3 * np.sin(2 * np.pi * f0 * t * (1 + 0.2 * np.sin(2 * np.pi * 3 * t)))
    sig += 0.02 * rng.standard_normal(n)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((sig * 32767).astype(np.int16).tobytes())


def prepare(root, n_train=47, n_val=8):
    """LJSpeech-like wavs and filelists; line 31 of the training list is the corpus's longest
    sentence (about 75 symbols), the others at most 56."""
    rng = random.Random(7)
    os.makedirs(os.path.join(root, "wavs"), exist_ok=True)
    os.makedirs(os.path.join(root, "filelists"), exist_ok=True)
    os.makedirs(os.path.join(root, "mels"), exist_ok=True)
    hp = create_hparams()
    stft = TacotronSTFT(hp.filter_length, hp.hop_length, hp.win_length, hp.n_mel_channels,
                        hp.sampling_rate, hp.mel_fmin, hp.mel_fmax)  # fmt: skip
    lists = {"train": [], "val": []}
    for k in range(n_train + n_val):
        split = "train" if k < n_train else "val"
        words, target = [], 80 if k == 30 else rng.randint(20, 55)
        while len(" ".join(words)) < target - 12:
            words.append(rng.choice(WORDS))
        text = " ".join(words) + "."
        text = text[0].upper() + text[1:]
        name = "LJ001-{:04d}".format(k + 1)
        wav = "wavs/{}.wav".format(name)
        write_wav(os.path.join(root, wav), 0.15 + 0.3 * rng.random(), hp.sampling_rate, k)
        audio, _ = load_wav_to_torch(os.path.join(root, wav))
        mel = stft.mel_spectrogram((audio / hp.max_wav_value).unsqueeze(0)).squeeze(0)
        np.save(os.path.join(root, "mels", name + ".npy"), mel.numpy())
        lists[split].append((wav, "mels/{}.npy".format(name), text))
    for split, rows in lists.items():
        with open(
            os.path.join(root, "filelists", f"ljs_audio_text_{split}_filelist.txt"), "w"
        ) as f:
            f.writelines(f"{wav}|{text}\n" for wav, _, text in rows)
        with open(os.path.join(root, "filelists", f"ljs_mel_text_{split}_filelist.txt"), "w") as f:
            f.writelines(f"{mel}|{text}\n" for _, mel, text in rows)


def prepare_checkpoint(path, n_symbols):
    """A published pretrained checkpoint (save_checkpoint's dict) of a model with n_symbols."""
    hp = create_hparams()
    hp.n_symbols = n_symbols
    torch.manual_seed(0)
    model = Tacotron2(hp)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.learning_rate)
    state = {"iteration": 150000, "state_dict": model.state_dict(),
             "optimizer": optimizer.state_dict(), "learning_rate": hp.learning_rate}  # fmt: skip
    torch.save(state, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output_directory", type=str, help="directory to save checkpoints")
    parser.add_argument(
        "-l", "--log_directory", type=str, help="directory to save tensorboard logs"
    )
    parser.add_argument("-c", "--checkpoint_path", type=str, default=None, required=False,
                        help="checkpoint path")  # fmt: skip
    parser.add_argument("--warm_start", action="store_true",
                        help="load model weights only, ignore specified layers")  # fmt: skip
    parser.add_argument("--n_gpus", type=int, default=1, required=False, help="number of gpus")
    parser.add_argument("--rank", type=int, default=0, required=False, help="rank of current gpu")
    parser.add_argument("--group_name", type=str, default="group_name", required=False,
                        help="Distributed group name")  # fmt: skip
    parser.add_argument(
        "--hparams", type=str, required=False, help="comma separated name=value pairs"
    )
    parser.add_argument("--prepare", type=str, default="", help=argparse.SUPPRESS)
    parser.add_argument("--prepare_checkpoint", type=str, default="", help=argparse.SUPPRESS)
    parser.add_argument("--n_symbols", type=int, default=len(symbols), help=argparse.SUPPRESS)

    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        sys.exit(0)
    if args.prepare_checkpoint:
        prepare_checkpoint(args.prepare_checkpoint, args.n_symbols)
        sys.exit(0)
    hparams = create_hparams(args.hparams)

    torch.backends.cudnn.enabled = hparams.cudnn_enabled
    torch.backends.cudnn.benchmark = hparams.cudnn_benchmark

    print("FP16 Run:", hparams.fp16_run)
    print("Dynamic Loss Scaling:", hparams.dynamic_loss_scaling)
    print("Distributed Run:", hparams.distributed_run)
    print("cuDNN Enabled:", hparams.cudnn_enabled)
    print("cuDNN Benchmark:", hparams.cudnn_benchmark)

    train(args.output_directory, args.log_directory, args.checkpoint_path,
          args.warm_start, args.n_gpus, args.rank, args.group_name, hparams)  # fmt: skip
