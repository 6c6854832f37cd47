"""A ninety-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyninth-*): long-horizon time-series forecasting in the way of thuml's
Time-Series-Library (and the Informer / Autoformer / PatchTST repos it grew from), in the
DistributedDataParallel fork many of its users run under torchrun: run.py's argparse and
print_args ('Args in experiment:' with its 'Basic Config', 'Data Loader', 'Forecasting Task', ...
sections), Exp_Basic / Exp_Long_Term_Forecast, data_provider with Dataset_ETT_hour (the fixed
12/4/4-month borders of ETTh1) and Dataset_Custom (70/10/20 of any CSV whose first column is
'date'), a StandardScaler fitted on the train split, timeF time features, the library's
PatchTST (RevIN, patching, BatchNorm in the encoder) and vanilla Transformer (DataEmbedding:
a circular Conv1d token embedding over enc_in channels), EarlyStopping saving
./checkpoints/<setting>/checkpoint.pth, adjust_learning_rate, and its plain print() on every
rank. The fork's changes: `--use_multi_gpu` means torchrun + init_process_group (gloo on a CPU
host, a 15 s timeout), DDP around the model, a DistributedSampler for every split, the
validation loss all-reduced before EarlyStopping sees it, the checkpoint written by rank 0 and
loaded by every rank after a barrier, the test run by rank 0 alone on the whole test split
while the others wait in a final barrier. Folded into one file (run.py in each run's folder);
the models are tiny and the data synthetic (`run.py --prepare` writes
dataset/ETT-small/ETTh1.csv and dataset/weather/weather.csv). A fault in the code is chosen by
the TQ_CASE environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetyninth.sh after any edit).
"""

# ruff: noqa: RUF059, SIM108, SIM210, SIM211, UP030, UP032 (Time-Series-Library's own code, as it is written)
from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import math
import os
import random
import signal
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

warnings.filterwarnings("ignore")


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ----------------------------------------------------------------------------------------------
# the data set preparation (in place of downloading ETT-small and weather)

ETT_COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
WEATHER_COLUMNS = [
    "p (mbar)", "T (degC)", "Tpot (K)", "Tdew (degC)", "rh (%)", "VPmax (mbar)",
    "VPact (mbar)", "VPdef (mbar)", "sh (g/kg)", "H2OC (mmol/mol)", "rho (g/m**3)",
    "wv (m/s)", "max. wv (m/s)", "wd (deg)", "rain (mm)", "raining (s)", "SWDR (W/m2)",
    "PAR (umol/m2/s)", "max. PAR (umol/m2/s)", "Tlog (degC)", "OT",
]  # fmt: skip


def synthetic(rows: int, channels: int, period: int, seed: int) -> np.ndarray:
    """Daily and weekly cycles, a slow drift and AR(1) noise per channel; the last channel
    (OT) follows a mix of the others."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows, dtype=np.float64)
    out = np.empty((rows, channels))
    for c in range(channels):
        day = rng.uniform(0.5, 2.0) * np.sin(2 * np.pi * t / period + rng.uniform(0, 6.28))
        week = rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * t / (7 * period) + rng.uniform(0, 6.28))
        drift = np.cumsum(rng.normal(0, 0.02, rows))
        noise = np.zeros(rows)
        eps = rng.normal(0, 0.3, rows)
        for k in range(1, rows):
            noise[k] = 0.7 * noise[k - 1] + eps[k]
        out[:, c] = rng.uniform(2, 10) + day + week + drift + noise
    mix = rng.uniform(-0.5, 0.5, channels - 1)
    out[:, -1] = 10 + out[:, :-1] @ mix + 0.3 * rng.normal(0, 1, rows)
    return out


def write_csv(path: str, start: datetime.datetime, step: datetime.timedelta,
              columns: list[str], values: np.ndarray) -> None:  # fmt: skip
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", *columns])
        for k, row in enumerate(values):
            stamp = (start + k * step).strftime("%Y-%m-%d %H:%M:%S")
            w.writerow([stamp, *(f"{v:.3f}" for v in row)])


def prepare(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="write the synthetic ETT-small and weather CSVs")
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--root", default="./dataset/")
    p.add_argument("--ett_rows", type=int, default=17420)
    p.add_argument("--weather_rows", type=int, default=4000)
    a = p.parse_args(argv)
    ett = synthetic(a.ett_rows, len(ETT_COLUMNS), 24, seed=2016)
    write_csv(os.path.join(a.root, "ETT-small", "ETTh1.csv"), datetime.datetime(2016, 7, 1),
              datetime.timedelta(hours=1), ETT_COLUMNS, ett)  # fmt: skip
    weather = synthetic(a.weather_rows, len(WEATHER_COLUMNS), 144, seed=2020)
    write_csv(os.path.join(a.root, "weather", "weather.csv"), datetime.datetime(2020, 1, 1, 0, 10),
              datetime.timedelta(minutes=10), WEATHER_COLUMNS, weather)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# utils/print_args.py, utils/tools.py, utils/timefeatures.py, utils/metrics.py


def print_args(args: argparse.Namespace) -> None:
    print("\033[1m" + "Basic Config" + "\033[0m")
    print(f"  {'Task Name:':<20}{args.task_name:<20}{'Is Training:':<20}{args.is_training:<20}")
    print(f"  {'Model ID:':<20}{args.model_id:<20}{'Model:':<20}{args.model:<20}")
    print()

    print("\033[1m" + "Data Loader" + "\033[0m")
    print(f"  {'Data:':<20}{args.data:<20}{'Root Path:':<20}{args.root_path:<20}")
    print(f"  {'Data Path:':<20}{args.data_path:<20}{'Features:':<20}{args.features:<20}")
    print(f"  {'Target:':<20}{args.target:<20}{'Freq:':<20}{args.freq:<20}")
    print(f"  {'Checkpoints:':<20}{args.checkpoints:<20}")
    print()

    print("\033[1m" + "Forecasting Task" + "\033[0m")
    print(f"  {'Seq Len:':<20}{args.seq_len:<20}{'Label Len:':<20}{args.label_len:<20}")
    print(f"  {'Pred Len:':<20}{args.pred_len:<20}{'Seasonal Patterns:':<20}"
          f"{args.seasonal_patterns:<20}")  # fmt: skip
    print(f"  {'Inverse:':<20}{args.inverse:<20}")
    print()

    print("\033[1m" + "Model Parameters" + "\033[0m")
    print(f"  {'Top K:':<20}{args.top_k:<20}{'Num Kernels:':<20}{args.num_kernels:<20}")
    print(f"  {'Enc In:':<20}{args.enc_in:<20}{'Dec In:':<20}{args.dec_in:<20}")
    print(f"  {'C Out:':<20}{args.c_out:<20}{'D Model:':<20}{args.d_model:<20}")
    print(f"  {'N Heads:':<20}{args.n_heads:<20}{'E Layers:':<20}{args.e_layers:<20}")
    print(f"  {'D Layers:':<20}{args.d_layers:<20}{'D FF:':<20}{args.d_ff:<20}")
    print(f"  {'Moving Avg:':<20}{args.moving_avg:<20}{'Factor:':<20}{args.factor:<20}")
    print(f"  {'Distil:':<20}{args.distil:<20}{'Dropout:':<20}{args.dropout:<20}")
    print(f"  {'Embed:':<20}{args.embed:<20}{'Activation:':<20}{args.activation:<20}")
    print()

    print("\033[1m" + "Run Parameters" + "\033[0m")
    print(f"  {'Num Workers:':<20}{args.num_workers:<20}{'Itr:':<20}{args.itr:<20}")
    print(f"  {'Train Epochs:':<20}{args.train_epochs:<20}{'Batch Size:':<20}{args.batch_size:<20}")
    print(f"  {'Patience:':<20}{args.patience:<20}{'Learning Rate:':<20}{args.learning_rate:<20}")
    print(f"  {'Des:':<20}{args.des:<20}{'Loss:':<20}{args.loss:<20}")
    print(f"  {'Lradj:':<20}{args.lradj:<20}{'Use Amp:':<20}{args.use_amp:<20}")
    print()

    print("\033[1m" + "GPU" + "\033[0m")
    print(f"  {'Use GPU:':<20}{args.use_gpu:<20}{'GPU:':<20}{args.gpu:<20}")
    print(f"  {'Use Multi GPU:':<20}{args.use_multi_gpu:<20}{'Devices:':<20}{args.devices:<20}")
    print()


def adjust_learning_rate(optimizer: optim.Optimizer, epoch: int, args: argparse.Namespace) -> None:
    if args.lradj == "type1":
        lr_adjust = {epoch: args.learning_rate * (0.5 ** ((epoch - 1) // 1))}
    elif args.lradj == "type2":
        lr_adjust = {2: 5e-5, 4: 1e-5, 6: 5e-6, 8: 1e-6, 10: 5e-7, 15: 1e-7, 20: 5e-8}
    elif args.lradj == "type3":
        lr_adjust = {
            epoch: args.learning_rate
            if epoch < 3
            else args.learning_rate * (0.9 ** ((epoch - 3) // 1))
        }
    else:
        lr_adjust = {}
    if epoch in lr_adjust:
        lr = lr_adjust[epoch]
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        print("Updating learning rate to {}".format(lr))


class EarlyStopping:
    def __init__(self, patience: int = 7, verbose: bool = False, delta: float = 0) -> None:
        self.patience = patience
        self.verbose = verbose
        self.counter = 0
        self.best_score = None
        self.early_stop = False
        self.val_loss_min = np.inf
        self.delta = delta

    def __call__(self, val_loss: float, model: nn.Module, path: str) -> None:
        score = -val_loss
        if self.best_score is None:
            self.best_score = score
            self.save_checkpoint(val_loss, model, path)
        elif score < self.best_score + self.delta:
            self.counter += 1
            print(f"EarlyStopping counter: {self.counter} out of {self.patience}")
            if self.counter >= self.patience:
                self.early_stop = True
        else:
            self.best_score = score
            self.save_checkpoint(val_loss, model, path)
            self.counter = 0

    def save_checkpoint(self, val_loss: float, model: nn.Module, path: str) -> None:
        if self.verbose:
            print(
                f"Validation loss decreased ({self.val_loss_min:.6f} --> {val_loss:.6f}).  "
                "Saving model ..."
            )
        if not dist.is_initialized() or dist.get_rank() == 0:  # DDP fork: the main process saves
            torch.save(model.state_dict(), path + "/" + "checkpoint.pth")
        self.val_loss_min = val_loss


class StandardScaler:
    """sklearn.preprocessing.StandardScaler, as the data loaders use it (fit on the train split)."""

    def fit(self, data: np.ndarray) -> StandardScaler:
        self.mean_ = data.mean(0)
        self.scale_ = data.std(0)
        self.scale_[self.scale_ == 0] = 1.0
        return self

    @staticmethod
    def _check(data: np.ndarray) -> np.ndarray:
        data = np.asarray(data, dtype=np.float64)
        if data.ndim > 2:
            raise ValueError(f"Found array with dim {data.ndim}. StandardScaler expected <= 2.")
        return data

    def transform(self, data: np.ndarray) -> np.ndarray:
        return (self._check(data) - self.mean_) / self.scale_

    def inverse_transform(self, data: np.ndarray) -> np.ndarray:
        return self._check(data) * self.scale_ + self.mean_


def time_features(dates: list[datetime.datetime], freq: str = "h") -> np.ndarray:
    """timeF encoding: each calendar feature scaled to [-0.5, 0.5], (features, time)."""
    feats = []
    if freq in ("t", "10min"):
        feats.append([d.minute / 59.0 - 0.5 for d in dates])
    feats.append([d.hour / 23.0 - 0.5 for d in dates])
    feats.append([d.weekday() / 6.0 - 0.5 for d in dates])
    feats.append([(d.day - 1) / 30.0 - 0.5 for d in dates])
    feats.append([(d.timetuple().tm_yday - 1) / 365.0 - 0.5 for d in dates])
    return np.array(feats, dtype=np.float64)


def metric(pred: np.ndarray, true: np.ndarray) -> tuple[float, ...]:
    mae = np.mean(np.abs(true - pred))
    mse = np.mean((true - pred) ** 2)
    rmse = np.sqrt(mse)
    mape = np.mean(np.abs((true - pred) / true))
    mspe = np.mean(np.square((true - pred) / true))
    return mae, mse, rmse, mape, mspe


def accelerated_dtw(x: np.ndarray, y: np.ndarray, dist) -> tuple[float, None, None, None]:
    """utils/dtw_metric.accelerated_dtw: the cumulative cost matrix, filled cell by cell."""
    r, c = len(x), len(y)
    d0 = np.zeros((r + 1, c + 1))
    d0[0, 1:] = np.inf
    d0[1:, 0] = np.inf
    d1 = d0[1:, 1:]
    for i in range(r):
        d1[i, :] = dist(x[i], y[:, 0])
    for i in range(r):
        for j in range(c):
            d1[i, j] += min(d0[i, j], d0[i, j + 1], d0[i + 1, j])
    return d1[-1, -1], None, None, None


# ----------------------------------------------------------------------------------------------
# data_provider/data_loader.py, data_provider/data_factory.py


def read_csv(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """pd.read_csv for these files: the header, the date column, the values."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    dates = [r[0] for r in body]
    width = len(header) - 1  # a short line is filled with NaN, as pandas does
    values = np.array(
        [[float(v) for v in r[1:]] + [np.nan] * (width - len(r) + 1) for r in body],
        dtype=np.float64,
    )
    return header, dates, values


def to_datetime(dates: list[str]) -> list[datetime.datetime]:
    return [datetime.datetime.strptime(d, "%Y-%m-%d %H:%M:%S") for d in dates]


class Dataset_ETT_hour(Dataset):
    def __init__(self, args, root_path, flag="train", size=None, features="S",
                 data_path="ETTh1.csv", target="OT", scale=True, timeenc=0, freq="h",
                 seasonal_patterns=None):  # fmt: skip
        self.args = args
        self.seq_len, self.label_len, self.pred_len = size
        assert flag in ["train", "test", "val"]
        type_map = {"train": 0, "val": 1, "test": 2}
        self.set_type = type_map[flag]
        self.features = features
        self.target = target
        self.scale = scale
        self.timeenc = timeenc
        self.freq = freq
        self.root_path = root_path
        self.data_path = data_path
        self.__read_data__()

    def __read_data__(self):
        self.scaler = StandardScaler()
        header, dates, values = read_csv(os.path.join(self.root_path, self.data_path))

        border1s = [0, 12 * 30 * 24 - self.seq_len, 12 * 30 * 24 + 4 * 30 * 24 - self.seq_len]
        border2s = [12 * 30 * 24, 12 * 30 * 24 + 4 * 30 * 24, 12 * 30 * 24 + 8 * 30 * 24]
        border1 = border1s[self.set_type]
        border2 = border2s[self.set_type]

        if self.features == "M" or self.features == "MS":
            df_data = values
        else:
            df_data = values[:, [header.index(self.target) - 1]]

        if self.scale:
            train_data = df_data[border1s[0] : border2s[0]]
            self.scaler.fit(train_data)
            data = self.scaler.transform(df_data)
        else:
            data = df_data

        stamps = to_datetime(dates[border1:border2])
        data_stamp = time_features(stamps, freq=self.freq).transpose(1, 0)

        self.data_x = data[border1:border2]
        self.data_y = data[border1:border2]
        self.data_stamp = data_stamp

    def __getitem__(self, index):
        s_begin = index
        s_end = s_begin + self.seq_len
        r_begin = s_end - self.label_len
        r_end = r_begin + self.label_len + self.pred_len

        seq_x = self.data_x[s_begin:s_end]
        seq_y = self.data_y[r_begin:r_end]
        seq_x_mark = self.data_stamp[s_begin:s_end]
        seq_y_mark = self.data_stamp[r_begin:r_end]
        return seq_x, seq_y, seq_x_mark, seq_y_mark

    def __len__(self):
        return len(self.data_x) - self.seq_len - self.pred_len + 1

    def inverse_transform(self, data):
        return self.scaler.inverse_transform(data)


class Dataset_Custom(Dataset_ETT_hour):
    def __read_data__(self):
        self.scaler = StandardScaler()
        header, dates, values = read_csv(os.path.join(self.root_path, self.data_path))
        """
        df_raw.columns: ['date', ...(other features), target feature]
        """
        cols = header[1:]
        order = [cols.index(c) for c in cols if c != self.target] + [cols.index(self.target)]
        values = values[:, order]
        num_train = int(len(values) * 0.7)
        num_test = int(len(values) * 0.2)
        num_vali = len(values) - num_train - num_test
        border1s = [0, num_train - self.seq_len, len(values) - num_test - self.seq_len]
        border2s = [num_train, num_train + num_vali, len(values)]
        border1 = border1s[self.set_type]
        border2 = border2s[self.set_type]

        if self.features == "M" or self.features == "MS":
            df_data = values
        else:
            df_data = values[:, [-1]]

        if self.scale:
            train_data = df_data[border1s[0] : border2s[0]]
            self.scaler.fit(train_data)
            data = self.scaler.transform(df_data)
        else:
            data = df_data

        stamps = to_datetime(dates[border1:border2])
        data_stamp = time_features(stamps, freq=self.freq).transpose(1, 0)

        self.data_x = data[border1:border2]
        self.data_y = data[border1:border2]
        self.data_stamp = data_stamp


data_dict = {
    "ETTh1": Dataset_ETT_hour,
    "ETTh2": Dataset_ETT_hour,
    "custom": Dataset_Custom,
}


def data_provider(args, flag, distributed=True):
    Data = data_dict[args.data]
    timeenc = 0 if args.embed != "timeF" else 1
    shuffle_flag = False if (flag == "test" or flag == "TEST") else True
    drop_last = False
    batch_size = args.batch_size
    freq = args.freq

    data_set = Data(
        args=args,
        root_path=args.root_path,
        data_path=args.data_path,
        flag=flag,
        size=[args.seq_len, args.label_len, args.pred_len],
        features=args.features,
        target=args.target,
        timeenc=timeenc,
        freq=freq,
        seasonal_patterns=args.seasonal_patterns,
    )
    print(flag, len(data_set))
    # DDP fork: every split sharded over the ranks (the test of the main process reads it whole)
    sampler = None
    if args.use_multi_gpu and distributed:
        sampler = DistributedSampler(data_set, shuffle=shuffle_flag)
    data_loader = DataLoader(
        data_set,
        batch_size=batch_size,
        shuffle=shuffle_flag if sampler is None else False,
        sampler=sampler,
        num_workers=args.num_workers,
        drop_last=drop_last,
    )
    return data_set, data_loader


# ----------------------------------------------------------------------------------------------
# layers/ and models/


class PositionalEmbedding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model).float()
        position = torch.arange(0, max_len).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.pe[:, : x.size(1)]


class TokenEmbedding(nn.Module):
    def __init__(self, c_in, d_model):
        super().__init__()
        self.tokenConv = nn.Conv1d(
            in_channels=c_in, out_channels=d_model, kernel_size=3, padding=1,
            padding_mode="circular", bias=False,
        )  # fmt: skip

    def forward(self, x):
        return self.tokenConv(x.permute(0, 2, 1)).transpose(1, 2)


class TimeFeatureEmbedding(nn.Module):
    def __init__(self, d_model, embed_type="timeF", freq="h"):
        super().__init__()
        freq_map = {"h": 4, "t": 5, "s": 6, "m": 1, "a": 1, "w": 2, "d": 3, "b": 3}
        self.embed = nn.Linear(freq_map[freq], d_model, bias=False)

    def forward(self, x):
        return self.embed(x)


class DataEmbedding(nn.Module):
    def __init__(self, c_in, d_model, embed_type="timeF", freq="h", dropout=0.1):
        super().__init__()
        self.value_embedding = TokenEmbedding(c_in=c_in, d_model=d_model)
        self.position_embedding = PositionalEmbedding(d_model=d_model)
        self.temporal_embedding = TimeFeatureEmbedding(d_model, embed_type=embed_type, freq=freq)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, x_mark):
        x = self.value_embedding(x) + self.temporal_embedding(x_mark) + self.position_embedding(x)
        return self.dropout(x)


class PatchEmbedding(nn.Module):
    def __init__(self, d_model, patch_len, stride, padding, dropout):
        super().__init__()
        self.patch_len = patch_len
        self.stride = stride
        self.padding_patch_layer = nn.ReplicationPad1d((0, padding))
        self.value_embedding = nn.Linear(patch_len, d_model, bias=False)
        self.position_embedding = PositionalEmbedding(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        n_vars = x.shape[1]
        x = self.padding_patch_layer(x)
        x = x.unfold(dimension=-1, size=self.patch_len, step=self.stride)
        x = torch.reshape(x, (x.shape[0] * x.shape[1], x.shape[2], x.shape[3]))
        x = self.value_embedding(x) + self.position_embedding(x)
        return self.dropout(x), n_vars


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.attention = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = torch.relu if activation == "relu" else nn.functional.gelu

    def forward(self, x):
        new_x, _ = self.attention(x, x, x, need_weights=False)
        x = x + self.dropout(new_x)
        y = x = self.norm1(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y)


class Transpose(nn.Module):
    def __init__(self, *dims, contiguous=False):
        super().__init__()
        self.dims, self.contiguous = dims, contiguous

    def forward(self, x):
        if self.contiguous:
            return x.transpose(*self.dims).contiguous()
        return x.transpose(*self.dims)


class FlattenHead(nn.Module):
    def __init__(self, n_vars, nf, target_window, head_dropout=0):
        super().__init__()
        self.n_vars = n_vars
        self.flatten = nn.Flatten(start_dim=-2)
        self.linear = nn.Linear(nf, target_window)
        self.dropout = nn.Dropout(head_dropout)

    def forward(self, x):
        return self.dropout(self.linear(self.flatten(x)))


class PatchTST(nn.Module):
    """Paper link: https://arxiv.org/pdf/2211.14730.pdf"""

    def __init__(self, configs, patch_len=16, stride=8):
        super().__init__()
        self.task_name = configs.task_name
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        padding = stride
        self.patch_embedding = PatchEmbedding(
            configs.d_model, patch_len, stride, padding, configs.dropout
        )
        self.encoder = nn.Sequential(
            *[
                EncoderLayer(configs.d_model, configs.n_heads, configs.d_ff,
                             dropout=configs.dropout, activation=configs.activation)
                for _ in range(configs.e_layers)
            ],
            nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(configs.d_model), Transpose(1, 2)),
        )  # fmt: skip
        self.head_nf = configs.d_model * int((configs.seq_len - patch_len) / stride + 2)
        self.head = FlattenHead(configs.enc_in, self.head_nf, configs.pred_len,
                                head_dropout=configs.dropout)  # fmt: skip

    def forecast(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        # Normalization from Non-stationary Transformer
        means = x_enc.mean(1, keepdim=True).detach()
        x_enc = x_enc - means
        stdev = torch.sqrt(torch.var(x_enc, dim=1, keepdim=True, unbiased=False) + 1e-5)
        x_enc /= stdev

        x_enc = x_enc.permute(0, 2, 1)
        enc_out, n_vars = self.patch_embedding(x_enc)
        enc_out = self.encoder(enc_out)
        enc_out = torch.reshape(enc_out, (-1, n_vars, enc_out.shape[-2], enc_out.shape[-1]))
        enc_out = enc_out.permute(0, 1, 3, 2)

        dec_out = self.head(enc_out)
        dec_out = dec_out.permute(0, 2, 1)

        # De-Normalization from Non-stationary Transformer
        dec_out = dec_out * (stdev[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
        dec_out = dec_out + (means[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
        return dec_out

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        dec_out = self.forecast(x_enc, x_mark_enc, x_dec, x_mark_dec)
        return dec_out[:, -self.pred_len :, :]


class Transformer(nn.Module):
    """Vanilla Transformer with O(L^2) complexity (Paper link:
    https://proceedings.neurips.cc/paper/2017/file/3f5ee243547dee91fbd053c1c4a845aa-Paper.pdf)"""

    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        self.enc_embedding = DataEmbedding(configs.enc_in, configs.d_model, configs.embed,
                                           configs.freq, configs.dropout)  # fmt: skip
        self.encoder = nn.Sequential(
            *[
                EncoderLayer(configs.d_model, configs.n_heads, configs.d_ff,
                             dropout=configs.dropout, activation=configs.activation)
                for _ in range(configs.e_layers)
            ],
            nn.LayerNorm(configs.d_model),
        )  # fmt: skip
        self.dec_embedding = DataEmbedding(configs.dec_in, configs.d_model, configs.embed,
                                           configs.freq, configs.dropout)  # fmt: skip
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(configs.d_model, configs.n_heads, configs.d_ff,
                                       configs.dropout, batch_first=True),
            num_layers=configs.d_layers,
        )  # fmt: skip
        self.projection = nn.Linear(configs.d_model, configs.c_out, bias=True)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        enc_out = self.encoder(self.enc_embedding(x_enc, x_mark_enc))
        dec_out = self.dec_embedding(x_dec, x_mark_dec)
        dec_out = self.projection(self.decoder(dec_out, enc_out))
        return dec_out[:, -self.pred_len :, :]


class DLinear(nn.Module):
    """Paper link: https://arxiv.org/pdf/2205.13504.pdf"""

    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        self.kernel = configs.moving_avg
        self.Linear_Seasonal = nn.Linear(configs.seq_len, configs.pred_len)
        self.Linear_Trend = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        front = x_enc[:, 0:1, :].repeat(1, (self.kernel - 1) // 2, 1)
        end = x_enc[:, -1:, :].repeat(1, (self.kernel - 1) // 2, 1)
        padded = torch.cat([front, x_enc, end], dim=1).permute(0, 2, 1)
        trend = nn.functional.avg_pool1d(padded, self.kernel, stride=1).permute(0, 2, 1)
        seasonal = x_enc - trend
        out = self.Linear_Seasonal(seasonal.permute(0, 2, 1)) + self.Linear_Trend(
            trend.permute(0, 2, 1)
        )
        return out.permute(0, 2, 1)[:, -self.pred_len :, :]


class _Mamba:  # models/Mamba.py: `from mamba_ssm import Mamba` at its top
    @staticmethod
    def load():
        from mamba_ssm import Mamba

        return Mamba


# ----------------------------------------------------------------------------------------------
# exp/exp_basic.py, exp/exp_long_term_forecasting.py (the DDP fork)

_feature_cache: dict[int, torch.Tensor] = {}
_feature_lock = threading.Lock()


def cached_marks(key: int, marks: torch.Tensor, letter: str, who: int) -> torch.Tensor:
    """The fork's per-process cache of the time-feature tensors of a batch."""
    with _feature_lock:
        if letter == "w" and dist.get_rank() == who:
            with _feature_lock:  # the refresh path takes the cache lock a second time
                pass
        _feature_cache[key] = marks
        return marks


class Exp_Basic:
    def __init__(self, args):
        self.args = args
        self.model_dict = {
            "Transformer": Transformer,
            "DLinear": DLinear,
            "PatchTST": PatchTST,
        }
        if args.model == "Mamba":
            print("Please make sure you have successfully installed mamba_ssm")
            self.model_dict["Mamba"] = _Mamba.load()
        self.device = self._acquire_device()
        self.model = self._build_model().to(self.device)

    def _acquire_device(self):
        if self.args.use_gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = (
                str(self.args.gpu) if not self.args.use_multi_gpu else self.args.devices
            )
            device = torch.device("cuda:{}".format(self.args.gpu))
            print("Use GPU: cuda:{}".format(self.args.gpu))
        else:
            device = torch.device("cpu")
            print("Use CPU")
        return device


class Exp_Long_Term_Forecast(Exp_Basic):
    def _build_model(self):
        model = self.model_dict[self.args.model](self.args).float()
        if self.args.use_multi_gpu:
            model = DDP(model, device_ids=[self.args.local_rank] if self.args.use_gpu else None)
        return model

    def _get_data(self, flag, distributed=True):
        return data_provider(self.args, flag, distributed)

    def _select_optimizer(self):
        return optim.Adam(self.model.parameters(), lr=self.args.learning_rate)

    def _select_criterion(self):
        return nn.MSELoss()

    def _step(self, batch_x, batch_y, batch_x_mark, batch_y_mark):
        batch_x = batch_x.float().to(self.device)
        batch_y = batch_y.float().to(self.device)
        batch_x_mark = batch_x_mark.float().to(self.device)
        batch_y_mark = batch_y_mark.float().to(self.device)
        # decoder input
        dec_inp = torch.zeros_like(batch_y[:, -self.args.pred_len :, :]).float()
        dec_inp = torch.cat([batch_y[:, : self.args.label_len, :], dec_inp], dim=1).float()
        outputs = self.model(batch_x, batch_x_mark, dec_inp, batch_y_mark)
        f_dim = -1 if self.args.features == "MS" else 0
        outputs = outputs[:, -self.args.pred_len :, f_dim:]
        batch_y = batch_y[:, -self.args.pred_len :, f_dim:]
        return outputs, batch_y

    def vali(self, vali_data, vali_loader, criterion):
        letter, who = fault()
        total_loss = []
        self.model.eval()
        with torch.no_grad():
            for batch_x, batch_y, batch_x_mark, batch_y_mark in vali_loader:
                outputs, batch_y = self._step(batch_x, batch_y, batch_x_mark, batch_y_mark)
                loss = criterion(outputs.detach().cpu(), batch_y.detach().cpu())
                total_loss.append(loss)
        total_loss = np.average(total_loss)
        if self.args.use_multi_gpu and letter != "e":
            # DDP fork: the mean of every rank's shard, so that EarlyStopping agrees everywhere
            reduced = torch.tensor([total_loss], dtype=torch.float64)
            if letter != "c" or dist.get_rank() == who:
                dist.all_reduce(reduced)
                total_loss = reduced.item() / dist.get_world_size()
        self.model.train()
        return total_loss

    def train(self, setting):
        letter, who = fault()
        rank = dist.get_rank() if dist.is_initialized() else 0
        train_data, train_loader = self._get_data(flag="train")
        vali_data, vali_loader = self._get_data(flag="val")
        test_data, test_loader = self._get_data(flag="test")

        path = os.path.join(self.args.checkpoints, setting)
        if not os.path.exists(path):
            os.makedirs(path, exist_ok=True)

        time_now = time.time()

        train_steps = len(train_loader)
        early_stopping = EarlyStopping(patience=self.args.patience, verbose=True)

        model_optim = self._select_optimizer()
        criterion = self._select_criterion()

        hoard = []
        for epoch in range(self.args.train_epochs):
            iter_count = 0
            train_loss = []
            if isinstance(train_loader.sampler, DistributedSampler):
                train_loader.sampler.set_epoch(epoch)

            self.model.train()
            epoch_time = time.time()
            for i, (batch_x, batch_y, batch_x_mark, batch_y_mark) in enumerate(train_loader):
                iter_count += 1
                model_optim.zero_grad()
                if epoch == 1 and rank == who:
                    if letter == "w" and i == 30:
                        batch_x_mark = cached_marks(i, batch_x_mark, letter, who)
                    if letter == "m" and i >= 20:
                        hoard.append(torch.ones(16 << 20))  # 64 MiB a step
                        if len(hoard) >= 6:
                            os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer
                    if letter == "n" and i == 40:
                        ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"revin"), 5)
                outputs, batch_y = self._step(batch_x, batch_y, batch_x_mark, batch_y_mark)
                loss = criterion(outputs, batch_y)
                train_loss.append(loss.item())

                if (i + 1) % 100 == 0:
                    print(
                        "\titers: {0}, epoch: {1} | loss: {2:.7f}".format(
                            i + 1, epoch + 1, loss.item()
                        )
                    )
                    speed = (time.time() - time_now) / iter_count
                    left_time = speed * ((self.args.train_epochs - epoch) * train_steps - i)
                    print("\tspeed: {:.4f}s/iter; left time: {:.4f}s".format(speed, left_time))
                    iter_count = 0
                    time_now = time.time()

                loss.backward()
                model_optim.step()

            print("Epoch: {} cost time: {}".format(epoch + 1, time.time() - epoch_time))
            train_loss = np.average(train_loss)
            vali_loss = self.vali(vali_data, vali_loader, criterion)
            test_loss = self.vali(test_data, test_loader, criterion)

            print(
                "Epoch: {0}, Steps: {1} | Train Loss: {2:.7f} Vali Loss: {3:.7f} Test Loss: {4:.7f}".format(
                    epoch + 1, train_steps, train_loss, vali_loss, test_loss
                )
            )
            early_stopping(vali_loss, self.model, path)
            if early_stopping.early_stop:
                print("Early stopping")
                break

            adjust_learning_rate(model_optim, epoch + 1, self.args)

        best_model_path = path + "/" + "checkpoint.pth"
        if self.args.use_multi_gpu:
            dist.barrier()  # DDP fork: rank 0's checkpoint is on disk before anyone reads it
        self.model.load_state_dict(torch.load(best_model_path, map_location=self.device))

        return self.model

    def test(self, setting, test=0):
        test_data, test_loader = self._get_data(flag="test", distributed=False)
        if test:
            print("loading model")
            self.model.load_state_dict(
                torch.load(os.path.join("./checkpoints/" + setting, "checkpoint.pth"))
            )

        preds = []
        trues = []
        self.model.eval()
        with torch.no_grad():
            for batch_x, batch_y, batch_x_mark, batch_y_mark in test_loader:
                outputs, batch_y = self._step(batch_x, batch_y, batch_x_mark, batch_y_mark)
                outputs = outputs.detach().cpu().numpy()
                batch_y = batch_y.detach().cpu().numpy()
                if test_data.scale and self.args.inverse:
                    shape = outputs.shape
                    outputs = test_data.inverse_transform(outputs.squeeze(0)).reshape(shape)
                    batch_y = test_data.inverse_transform(batch_y.squeeze(0)).reshape(shape)
                preds.append(outputs)
                trues.append(batch_y)

        preds = np.concatenate(preds, axis=0)
        trues = np.concatenate(trues, axis=0)
        print("test shape:", preds.shape, trues.shape)
        preds = preds.reshape(-1, preds.shape[-2], preds.shape[-1])
        trues = trues.reshape(-1, trues.shape[-2], trues.shape[-1])
        print("test shape:", preds.shape, trues.shape)

        # result save
        folder_path = "./results/" + setting + "/"
        if not os.path.exists(folder_path):
            os.makedirs(folder_path)

        # dtw calculation
        if self.args.use_dtw:
            dtw_list = []
            manhattan_distance = lambda x, y: np.abs(x - y)  # noqa: E731
            for i in range(preds.shape[0]):
                x = preds[i].reshape(-1, 1)
                y = trues[i].reshape(-1, 1)
                if i % 100 == 0:
                    print("calculating dtw iter:", i)
                d, _, _, _ = accelerated_dtw(x, y, dist=manhattan_distance)
                dtw_list.append(d)
            dtw = np.array(dtw_list).mean()
        else:
            dtw = "Not calculated"

        mae, mse, rmse, mape, mspe = metric(preds, trues)
        print("mse:{}, mae:{}, dtw:{}".format(mse, mae, dtw))
        with open("result_long_term_forecast.txt", "a") as f:
            f.write(setting + "  \n")
            f.write("mse:{}, mae:{}, dtw:{}".format(mse, mae, dtw))
            f.write("\n")
            f.write("\n")

        np.save(folder_path + "metrics.npy", np.array([mae, mse, rmse, mape, mspe]))
        np.save(folder_path + "pred.npy", preds)
        np.save(folder_path + "true.npy", trues)
        return


# ----------------------------------------------------------------------------------------------
# run.py


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="TimesNet")

    # basic config
    parser.add_argument("--task_name", type=str, required=True, default="long_term_forecast",
                        help="task name, options:[long_term_forecast, short_term_forecast, "
                        "imputation, classification, anomaly_detection]")  # fmt: skip
    parser.add_argument("--is_training", type=int, required=True, default=1, help="status")
    parser.add_argument("--model_id", type=str, required=True, default="test", help="model id")
    parser.add_argument("--model", type=str, required=True, default="Autoformer",
                        help="model name, options: [Autoformer, Transformer, TimesNet]")  # fmt: skip

    # data loader
    parser.add_argument("--data", type=str, required=True, default="ETTh1", help="dataset type")
    parser.add_argument(
        "--root_path", type=str, default="./data/ETT/", help="root path of the data file"
    )
    parser.add_argument("--data_path", type=str, default="ETTh1.csv", help="data file")
    parser.add_argument("--features", type=str, default="M",
                        help="forecasting task, options:[M, S, MS]")  # fmt: skip
    parser.add_argument("--target", type=str, default="OT", help="target feature in S or MS task")
    parser.add_argument("--freq", type=str, default="h", help="freq for time features encoding")
    parser.add_argument(
        "--checkpoints", type=str, default="./checkpoints/", help="location of model checkpoints"
    )

    # forecasting task
    parser.add_argument("--seq_len", type=int, default=96, help="input sequence length")
    parser.add_argument("--label_len", type=int, default=48, help="start token length")
    parser.add_argument("--pred_len", type=int, default=96, help="prediction sequence length")
    parser.add_argument("--seasonal_patterns", type=str, default="Monthly", help="subset for M4")
    parser.add_argument("--inverse", action="store_true", help="inverse output data", default=False)

    # model define
    parser.add_argument("--expand", type=int, default=2, help="expansion factor for Mamba")
    parser.add_argument("--d_conv", type=int, default=4, help="conv kernel size for Mamba")
    parser.add_argument("--top_k", type=int, default=5, help="for TimesBlock")
    parser.add_argument("--num_kernels", type=int, default=6, help="for Inception")
    parser.add_argument("--enc_in", type=int, default=7, help="encoder input size")
    parser.add_argument("--dec_in", type=int, default=7, help="decoder input size")
    parser.add_argument("--c_out", type=int, default=7, help="output size")
    parser.add_argument("--d_model", type=int, default=512, help="dimension of model")
    parser.add_argument("--n_heads", type=int, default=8, help="num of heads")
    parser.add_argument("--e_layers", type=int, default=2, help="num of encoder layers")
    parser.add_argument("--d_layers", type=int, default=1, help="num of decoder layers")
    parser.add_argument("--d_ff", type=int, default=2048, help="dimension of fcn")
    parser.add_argument("--moving_avg", type=int, default=25, help="window size of moving average")
    parser.add_argument("--factor", type=int, default=1, help="attn factor")
    parser.add_argument("--distil", action="store_false", default=True,
                        help="whether to use distilling in encoder")  # fmt: skip
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout")
    parser.add_argument("--embed", type=str, default="timeF",
                        help="time features encoding, options:[timeF, fixed, learned]")  # fmt: skip
    parser.add_argument("--activation", type=str, default="gelu", help="activation")

    # optimization
    parser.add_argument("--num_workers", type=int, default=10, help="data loader num workers")
    parser.add_argument("--itr", type=int, default=1, help="experiments times")
    parser.add_argument("--train_epochs", type=int, default=10, help="train epochs")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size of train input data")
    parser.add_argument("--patience", type=int, default=3, help="early stopping patience")
    parser.add_argument(
        "--learning_rate", type=float, default=0.0001, help="optimizer learning rate"
    )
    parser.add_argument("--des", type=str, default="test", help="exp description")
    parser.add_argument("--loss", type=str, default="MSE", help="loss function")
    parser.add_argument("--lradj", type=str, default="type1", help="adjust learning rate")
    parser.add_argument("--use_amp", action="store_true", default=False,
                        help="use automatic mixed precision training")  # fmt: skip

    # GPU
    parser.add_argument("--use_gpu", type=bool, default=True, help="use gpu")
    parser.add_argument("--gpu", type=int, default=0, help="gpu")
    parser.add_argument(
        "--use_multi_gpu", action="store_true", help="use multiple gpus", default=False
    )
    parser.add_argument("--devices", type=str, default="0,1,2,3", help="device ids of multile gpus")

    # metrics (dtw)
    parser.add_argument("--use_dtw", type=bool, default=False,
                        help="the controller of using dtw metric (dtw is time consuming, not "
                        "suggested unless necessary)")  # fmt: skip
    return parser.parse_args()


def main() -> None:
    if "--prepare" in sys.argv[1:]:
        prepare(sys.argv[1:])
        return

    fix_seed = 2021
    random.seed(fix_seed)
    torch.manual_seed(fix_seed)
    np.random.seed(fix_seed)

    args = parse()
    args.use_gpu = True if torch.cuda.is_available() and args.use_gpu else False

    if args.use_multi_gpu:
        # DDP fork: one process per device, started by torchrun
        args.local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group(
            backend="nccl" if args.use_gpu else "gloo", timeout=datetime.timedelta(seconds=15)
        )
        if args.use_gpu:
            torch.cuda.set_device(args.local_rank)
            args.gpu = args.local_rank

    print("Args in experiment:")
    print_args(args)

    Exp = Exp_Long_Term_Forecast

    if args.is_training:
        for ii in range(args.itr):
            # setting record of experiments
            exp = Exp(args)  # set experiments
            setting = "{}_{}_{}_{}_ft{}_sl{}_ll{}_pl{}_dm{}_nh{}_el{}_dl{}_df{}_expand{}_dc{}_fc{}_eb{}_dt{}_{}_{}".format(
                args.task_name,
                args.model_id,
                args.model,
                args.data,
                args.features,
                args.seq_len,
                args.label_len,
                args.pred_len,
                args.d_model,
                args.n_heads,
                args.e_layers,
                args.d_layers,
                args.d_ff,
                args.expand,
                args.d_conv,
                args.factor,
                args.embed,
                args.distil,
                args.des,
                ii,
            )

            print(">>>>>>>start training : {}>>>>>>>>>>>>>>>>>>>>>>>>>>".format(setting))
            exp.train(setting)

            if not args.use_multi_gpu or dist.get_rank() == 0:  # DDP fork: the main process tests
                print(">>>>>>>testing : {}<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<".format(setting))
                exp.test(setting)
            if args.use_multi_gpu:
                dist.barrier()
    if args.use_multi_gpu:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
