"""A hundred-and-twenty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredtwentyfourth-*): face recognition trained in the way of
deepinsight/insightface's arcface_torch (recognition/arcface_torch/train_v2.py), re-created in
plain torch without insightface (or mxnet, or DALI) installed. Linked into each run's folder as
train_v2.py and started as its README starts it, `torchrun --nproc_per_node=N
--master_port=PORT train_v2.py configs/ms1mv3_r50_onegpu`.

What is re-created: get_config (configs/base.py updated by configs/<name>.py, both EasyDict
modules), init_logging (rank 0 only: 'Training: %(asctime)s-%(message)s' to the console and to
<output>/training.log), the config dump (': network                  r50'), get_dataloader
(MXFaceDataset over an MXNet-style train.rec/train.idx pair, an image folder otherwise, a
DistributedSampler, DataLoaderX's BackgroundGenerator prefetch thread; config.dali imports
nvidia.dali), a tiny IResNet ('r50' by name) under DDP(find_unused_parameters=True, static graph,
fp16_compress_hook), CombinedMarginLoss (ArcFace), PartialFC_V2 (each rank holds its shard of the
class centers; the embeddings and labels all_gather'ed across ranks every step; the softmax's
max and sum all_reduce'd in DistCrossEntropy), PolynomialLRWarmup, CallBackLogging ('Speed ...
samples/sec   Loss ...   LearningRate ...   Epoch: 0   Global Step: 20   Fp16 Grad Scale: ...
Required: 0 hours') and CallBackVerification on rank 0 (lfw, cfp_fp, agedb_30 .bin pairs, read
at the first verification by load_bin, which prints 'loading bin N'; '[lfw][20]XNorm: ...',
'[lfw][20]Accuracy-Flip: ...+-...', '[lfw][20]Accuracy-Highest: ...'), checkpoint_gpu_{rank}.pt
per rank each epoch (save_all_states) and rank 0's model.pt, config.resume.

The data are synthetic 'faces' (3 x 16 x 16, a prototype per identity and noise) written by
`python train_v2.py --prepare DIR`: DIR/train.rec + DIR/train.idx (records framed as MXRecordIO
frames them, an IRHeader and a zlib-compressed image each), and the three .bin verification
pair files. gloo on CPU, 15 s collective timeout. A fault in the code is chosen by the TQ_CASE
environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_hundredtwentyfourth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import numbers
import os
import pickle
import queue
import signal
import struct
import sys
import threading
import time
import zlib
from datetime import timedelta

import numpy as np
import torch
from torch import distributed
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.functional import linear, normalize
from torch.optim.lr_scheduler import _LRScheduler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

IMAGE_SIZE = (16, 16)


def fault():
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:]) if len(case) > 1 else -1


FAULT, FAULT_RANK = fault()

try:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
except KeyError:
    rank, local_rank, world_size = 0, 0, 1


# ---------------------------------------------------------------- utils/utils_config.py
def get_config(config_file):
    assert config_file.startswith("configs/"), "config file setting must start with configs/"
    temp_config_name = os.path.basename(config_file)
    temp_module_name = os.path.splitext(temp_config_name)[0]
    config = importlib.import_module("configs.base")
    cfg = config.config
    config = importlib.import_module(f"configs.{temp_module_name}")
    job_cfg = config.config
    cfg.update(job_cfg)
    if cfg.output is None:
        cfg.output = os.path.join("work_dirs", temp_module_name)
    return cfg


# ---------------------------------------------------------------- utils/utils_logging.py
class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val, self.avg, self.sum, self.count = 0, 0, 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def init_logging(rank, models_root):
    if rank == 0:
        log_root = logging.getLogger()
        log_root.setLevel(logging.INFO)
        formatter = logging.Formatter("Training: %(asctime)s-%(message)s")
        handler_file = logging.FileHandler(os.path.join(models_root, "training.log"))
        handler_stream = logging.StreamHandler(sys.stdout)
        handler_file.setFormatter(formatter)
        handler_stream.setFormatter(formatter)
        log_root.addHandler(handler_file)
        log_root.addHandler(handler_stream)
        log_root.info("rank_id: %d" % rank)  # noqa: UP031


# ---------------------------------------------------------------- a small mx.recordio
_MAGIC = 0xCED7230A
_IR_FORMAT = "IfQQ"
_IR_SIZE = struct.calcsize(_IR_FORMAT)


def pack(flag, label, idx, payload):
    if isinstance(label, numbers.Number):
        head = struct.pack(_IR_FORMAT, 0, float(label), idx, 0)
    else:
        label = np.asarray(label, dtype=np.float32)
        head = struct.pack(_IR_FORMAT, label.size, 0.0, idx, 0) + label.tobytes()
    return head + payload


def unpack(s):
    flag, label, idx, id2 = struct.unpack(_IR_FORMAT, s[:_IR_SIZE])
    s = s[_IR_SIZE:]
    if flag > 0:
        label = np.frombuffer(s, np.float32, flag)
        s = s[flag * 4 :]
    return (flag, label, idx, id2), s


class MXIndexedRecordIO:
    """Reads an indexed record file (opened again in every process that reads it)."""

    def __init__(self, idx_path, uri, flag):
        self.idx_path, self.uri = idx_path, uri
        self.idx = {}
        with open(idx_path) as f:
            for line in f:
                key, pos = line.split("\t")
                self.idx[int(key)] = int(pos)
        self.keys = sorted(self.idx)
        self.fh, self.pid = None, None

    def read_idx(self, key):
        if self.pid != os.getpid():
            self.fh, self.pid = open(self.uri, "rb"), os.getpid()  # noqa: SIM115
        self.fh.seek(self.idx[key])
        magic, lrec = struct.unpack("II", self.fh.read(8))
        assert magic == _MAGIC, f"Invalid RecordIO magic at record {key}"
        return self.fh.read(lrec & ((1 << 29) - 1))


def imdecode(buf):
    raw = zlib.decompress(buf)
    return np.frombuffer(raw, np.uint8).reshape(IMAGE_SIZE[0], IMAGE_SIZE[1], 3)


def imencode(img):
    return zlib.compress(np.ascontiguousarray(img, np.uint8).tobytes(), 6)


# ---------------------------------------------------------------- dataset.py
def to_tensor(sample, flip):
    img = torch.from_numpy(sample.copy()).permute(2, 0, 1).float().div_(255)
    if flip:
        img = img.flip(2)
    return img.sub_(0.5).div_(0.5)


class MXFaceDataset(Dataset):
    def __init__(self, root_dir, local_rank):
        super().__init__()
        self.root_dir = root_dir
        self.local_rank = local_rank
        path_imgrec = os.path.join(root_dir, "train.rec")
        path_imgidx = os.path.join(root_dir, "train.idx")
        self.imgrec = MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
        s = self.imgrec.read_idx(0)
        header, _ = unpack(s)
        if header[0] > 0:
            self.header0 = (int(header[1][0]), int(header[1][1]))
            self.imgidx = np.array(range(1, int(header[1][0])))
        else:
            self.imgidx = np.array(list(self.imgrec.keys))

    def labels(self):
        return [int(unpack(self.imgrec.read_idx(int(i)))[0][1]) for i in self.imgidx]

    def __getitem__(self, index):
        idx = self.imgidx[index]
        s = self.imgrec.read_idx(int(idx))
        header, img = unpack(s)
        label = header[1]
        if not isinstance(label, numbers.Number):
            label = label[0]
        label = torch.tensor(label, dtype=torch.long)
        sample = imdecode(img)
        return to_tensor(sample, flip=bool(torch.rand(1) < 0.5)), label

    def __len__(self):
        return len(self.imgidx)


class ImageFolder(Dataset):
    """root/<identity>/<n>.img files, each a compressed image as the .rec holds them."""

    def __init__(self, root):
        classes = sorted(os.listdir(root))
        self.samples = [
            (os.path.join(root, c, f), k) for k, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]  # fmt: skip

    def labels(self):
        return [k for _, k in self.samples]

    def __getitem__(self, index):
        path, label = self.samples[index]
        with open(path, "rb") as f:
            sample = imdecode(f.read())
        return to_tensor(sample, flip=bool(torch.rand(1) < 0.5)), torch.tensor(label)

    def __len__(self):
        return len(self.samples)


class IdentitySampler(Sampler):
    """Each rank reads only its own identities (every world_size-th one), shuffled per epoch."""

    def __init__(self, labels, num_replicas, rank, seed):
        self.indices = [i for i, y in enumerate(labels) if y % num_replicas == rank]
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.indices), generator=g).tolist()
        return iter([self.indices[i] for i in perm])

    def __len__(self):
        return len(self.indices)


class BackgroundGenerator(threading.Thread):
    def __init__(self, generator, local_rank, max_prefetch=6, start=True):
        super().__init__()
        self.queue = queue.Queue(max_prefetch)
        self.generator = generator
        self.local_rank = local_rank
        self.daemon = True
        if start:
            self.start()

    def run(self):
        for item in self.generator:
            self.queue.put(item)
        self.queue.put(None)

    def next(self):
        next_item = self.queue.get()
        if next_item is None:
            raise StopIteration
        return next_item

    def __next__(self):
        return self.next()

    def __iter__(self):
        return self


class DataLoaderX(DataLoader):
    def __init__(self, local_rank, **kwargs):
        super().__init__(**kwargs)
        self.local_rank = local_rank
        self.epoch = 0

    def __iter__(self):
        self.iter = super().__iter__()
        # the prefetch thread is started with the rank's stream; rank FAULT_RANK's never is
        start = not (FAULT == "q" and self.local_rank == FAULT_RANK and self.epoch == 1)
        self.iter = BackgroundGenerator(self.iter, self.local_rank, start=start)
        self.epoch += 1
        self.preload()
        return self

    def preload(self):
        self.batch = next(self.iter, None)

    def __next__(self):
        batch = self.batch
        if batch is None:
            raise StopIteration
        self.preload()
        return batch


def dali_data_iter(batch_size, rec_file, idx_file, num_threads, local_rank):
    import nvidia.dali.fn as fn  # noqa: F401
    from nvidia.dali.pipeline import Pipeline  # noqa: F401

    raise NotImplementedError


def get_dataloader(root_dir, local_rank, batch_size, dali=False, seed=2048, num_workers=2):
    rec = os.path.join(root_dir, "train.rec")
    idx = os.path.join(root_dir, "train.idx")
    if os.path.exists(rec) and os.path.exists(idx):
        train_set = MXFaceDataset(root_dir=root_dir, local_rank=local_rank)
    else:
        train_set = ImageFolder(root_dir)
    if dali:
        return dali_data_iter(batch_size, rec, idx, num_threads=2, local_rank=local_rank)
    rank, world_size = distributed.get_rank(), distributed.get_world_size()
    if FAULT == "u":
        train_sampler = IdentitySampler(train_set.labels(), world_size, rank, seed)
    else:
        train_sampler = DistributedSampler(
            train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
        )
    return DataLoaderX(
        local_rank=local_rank,
        dataset=train_set,
        batch_size=batch_size,
        sampler=train_sampler,
        num_workers=num_workers,
        pin_memory=False,
        drop_last=True,
    )


# ---------------------------------------------------------------- backbones/iresnet.py
class IBasicBlock(torch.nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.bn1 = torch.nn.BatchNorm2d(inplanes, eps=1e-05)
        self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes, eps=1e-05)
        self.prelu = torch.nn.PReLU(planes)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(planes, eps=1e-05)
        self.downsample = torch.nn.Sequential(
            torch.nn.Conv2d(inplanes, planes, 1, stride, bias=False),
            torch.nn.BatchNorm2d(planes, eps=1e-05),
        )

    def forward(self, x):
        out = self.bn1(x)
        out = self.conv1(out)
        out = self.bn2(out)
        out = self.prelu(out)
        out = self.conv2(out)
        out = self.bn3(out)
        return out + self.downsample(x)


class IResNet(torch.nn.Module):
    fc_scale = 4 * 4

    def __init__(self, dropout=0.0, num_features=512, fp16=False):
        super().__init__()
        self.fp16 = fp16
        self.conv1 = torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16, eps=1e-05)
        self.prelu = torch.nn.PReLU(16)
        self.layer1 = IBasicBlock(16, 24, 2)
        self.layer2 = IBasicBlock(24, 32, 2)
        self.bn2 = torch.nn.BatchNorm2d(32, eps=1e-05)
        self.dropout = torch.nn.Dropout(p=dropout, inplace=True)
        self.fc = torch.nn.Linear(32 * self.fc_scale, num_features)
        self.features = torch.nn.BatchNorm1d(num_features, eps=1e-05)
        torch.nn.init.constant_(self.features.weight, 1.0)
        self.features.weight.requires_grad = False

    def forward(self, x):
        with torch.cuda.amp.autocast(self.fp16):
            x = self.conv1(x)
            x = self.bn1(x)
            x = self.prelu(x)
            x = self.layer1(x)
            x = self.layer2(x)
            x = self.bn2(x)
            x = torch.flatten(x, 1)
            x = self.dropout(x)
        x = self.fc(x.float() if self.fp16 else x)
        x = self.features(x)
        return x


def get_model(name, **kwargs):
    if name in ("r18", "r34", "r50", "r100", "r200"):
        return IResNet(**kwargs)
    raise ValueError(f"unknown network {name}")


# ---------------------------------------------------------------- losses.py
class CombinedMarginLoss(torch.nn.Module):
    def __init__(self, s, m1, m2, m3, interclass_filtering_threshold=0):
        super().__init__()
        self.s, self.m1, self.m2, self.m3 = s, m1, m2, m3
        self.interclass_filtering_threshold = interclass_filtering_threshold

    def forward(self, logits, labels):
        index_positive = torch.where(labels != -1)[0]
        target_logit = logits[index_positive, labels[index_positive].view(-1)]
        self.calls = getattr(self, "calls", 0) + 1
        if FAULT == "n" and rank == FAULT_RANK and self.calls == 13:
            ctypes.string_at(0)  # the fused margin kernel reads the label table through NULL
        with torch.no_grad():
            target_logit.arccos_()
            logits.arccos_()
            final_target_logit = target_logit + self.m2
            logits[index_positive, labels[index_positive].view(-1)] = final_target_logit
            logits.cos_()
        return logits * self.s


# ---------------------------------------------------------------- partial_fc_v2.py
class AllGatherFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, *gather_list):
        gather_list = list(gather_list)
        distributed.all_gather(gather_list, tensor)
        return tuple(gather_list)

    @staticmethod
    def backward(ctx, *grads):
        grad_list = list(grads)
        rank = distributed.get_rank()
        grad_out = grad_list[rank]
        dist_ops = [
            distributed.reduce(grad_out, rank, distributed.ReduceOp.SUM, async_op=True)
            if i == rank
            else distributed.reduce(grad_list[i], i, distributed.ReduceOp.SUM, async_op=True)
            for i in range(distributed.get_world_size())
        ]
        for _op in dist_ops:
            _op.wait()
        grad_out *= len(grad_list)
        return (grad_out, *[None for _ in range(len(grad_list))])


AllGather = AllGatherFunc.apply


class DistCrossEntropyFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, label):
        batch_size = logits.size(0)
        max_logits, _ = torch.max(logits, dim=1, keepdim=True)
        distributed.all_reduce(max_logits, distributed.ReduceOp.MAX)
        logits.sub_(max_logits)
        logits.exp_()
        sum_logits_exp = torch.sum(logits, dim=1, keepdim=True)
        distributed.all_reduce(sum_logits_exp, distributed.ReduceOp.SUM)
        logits.div_(sum_logits_exp)
        index = torch.where(label != -1)[0]
        loss = torch.zeros(batch_size, 1, device=logits.device)
        loss[index] = logits[index].gather(1, label[index])
        distributed.all_reduce(loss, distributed.ReduceOp.SUM)
        ctx.save_for_backward(index, logits, label)
        return loss.clamp_min_(1e-30).log_().mean() * (-1)

    @staticmethod
    def backward(ctx, loss_gradient):
        (index, logits, label) = ctx.saved_tensors
        batch_size = logits.size(0)
        one_hot = torch.zeros(size=[index.size(0), logits.size(1)], device=logits.device)
        one_hot.scatter_(1, label[index], 1)
        logits[index] -= one_hot
        logits.div_(batch_size)
        return logits * loss_gradient.item(), None


class DistCrossEntropy(torch.nn.Module):
    def forward(self, logit_part, label_part):
        return DistCrossEntropyFunc.apply(logit_part, label_part)


class PartialFC_V2(torch.nn.Module):
    """Each rank holds num_classes // world_size class centers, the last rank the remainder too;
    the labels of the whole gathered batch are mapped onto the rank's shard."""

    _version = 2

    def __init__(self, margin_loss, embedding_size, num_classes, sample_rate=1.0, fp16=False):
        super().__init__()
        assert distributed.is_initialized(), "must initialize distributed before create this"
        self.rank = distributed.get_rank()
        self.world_size = distributed.get_world_size()
        self.dist_cross_entropy = DistCrossEntropy()
        self.embedding_size = embedding_size
        self.sample_rate = sample_rate
        self.fp16 = fp16
        self.num_base = num_classes // self.world_size
        self.class_start = self.num_base * self.rank
        self.num_local = self.num_base
        if self.rank == self.world_size - 1:
            self.num_local = num_classes - self.class_start
        self.num_sample = int(self.sample_rate * self.num_local)
        self.last_batch_size = 0
        self.weight = torch.nn.Parameter(torch.normal(0, 0.01, (self.num_local, embedding_size)))
        self.margin_softmax = margin_loss

    def sample(self, labels, index_positive):
        with torch.no_grad():
            positive = torch.unique(labels[index_positive], sorted=True)
            if self.num_sample - positive.size(0) >= 0:
                perm = torch.rand(size=[self.num_local])
                perm[positive] = 2.0
                index = torch.topk(perm, k=self.num_sample)[1]
                index = index.sort()[0]
            else:
                index = positive
            self.weight_index = index
            labels[index_positive] = torch.searchsorted(index, labels[index_positive])
        return self.weight[self.weight_index]

    def forward(self, local_embeddings, local_labels):
        local_labels.squeeze_()
        local_labels = local_labels.long()
        batch_size = local_embeddings.size(0)
        if self.last_batch_size == 0:
            self.last_batch_size = batch_size
        assert self.last_batch_size == batch_size, (
            f"last batch size do not equal current batch size: {self.last_batch_size} vs "
            f"{batch_size}"
        )
        _gather_embeddings = [
            torch.zeros((batch_size, self.embedding_size)) for _ in range(self.world_size)
        ]
        _gather_labels = [torch.zeros(batch_size).long() for _ in range(self.world_size)]
        _list_embeddings = AllGather(local_embeddings, *_gather_embeddings)
        distributed.all_gather(_gather_labels, local_labels)

        embeddings = torch.cat(_list_embeddings)
        labels = torch.cat(_gather_labels)

        labels = labels.view(-1, 1)
        owner = torch.div(labels, self.num_base, rounding_mode="floor")
        index_positive = owner.clamp(max=self.world_size - 1) == self.rank
        labels[~index_positive] = -1
        labels[index_positive] -= self.class_start

        if self.sample_rate < 1:  # noqa: SIM108
            weight = self.sample(labels, index_positive)
        else:
            weight = self.weight

        with torch.cuda.amp.autocast(self.fp16):
            norm_embeddings = normalize(embeddings)
            norm_weight_activated = normalize(weight)
            logits = linear(norm_embeddings, norm_weight_activated)
        if self.fp16:
            logits = logits.float()
        logits = logits.clamp(-1, 1)

        logits = self.margin_softmax(logits, labels)
        loss = self.dist_cross_entropy(logits, labels)
        return loss


# ---------------------------------------------------------------- lr_scheduler.py
class PolynomialLRWarmup(_LRScheduler):
    def __init__(self, optimizer, warmup_iters, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = total_iters
        self.power = power
        self.warmup_iters = warmup_iters
        super().__init__(optimizer, last_epoch=last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch > self.total_iters:
            return [group["lr"] for group in self.optimizer.param_groups]
        if self.last_epoch <= self.warmup_iters:
            return [base_lr * self.last_epoch / self.warmup_iters for base_lr in self.base_lrs]
        l = self.last_epoch  # noqa: E741
        w = self.warmup_iters
        t = self.total_iters
        decay_factor = ((1.0 - (l - w) / (t - w)) / (1.0 - (l - 1 - w) / (t - w))) ** self.power
        return [group["lr"] * decay_factor for group in self.optimizer.param_groups]


# ---------------------------------------------------------------- eval/verification.py
@torch.no_grad()
def load_bin(path, image_size):
    try:
        with open(path, "rb") as f:
            bins, issame_list = pickle.load(f)  # py2
    except UnicodeDecodeError:
        with open(path, "rb") as f:
            bins, issame_list = pickle.load(f, encoding="bytes")  # py3
    data_list = []
    for _flip in [0, 1]:
        data = torch.empty((len(issame_list) * 2, 3, image_size[0], image_size[1]))
        data_list.append(data)
    for idx in range(len(issame_list) * 2):
        _bin = bins[idx]
        img = imdecode(_bin)
        if FAULT == "s":
            time.sleep(0.003)  # decoding the full-size aligned faces of this copy of the bins
        img = torch.from_numpy(img.copy()).permute(2, 0, 1)
        for flip in [0, 1]:
            if flip == 1:
                img = torch.flip(img, dims=[2])
            data_list[flip][idx][:] = img
        if idx % 1000 == 0:
            print("loading bin", idx)
    print(data_list[0].shape)
    return data_list, issame_list


def calculate_accuracy(threshold, dist, actual_issame):
    predict_issame = np.less(dist, threshold)
    tp = np.sum(np.logical_and(predict_issame, actual_issame))
    tn = np.sum(np.logical_and(np.logical_not(predict_issame), np.logical_not(actual_issame)))
    return float(tp + tn) / dist.size


def calculate_roc(thresholds, embeddings1, embeddings2, actual_issame, nrof_folds=10):
    nrof_pairs = min(len(actual_issame), embeddings1.shape[0])
    accuracy = np.zeros(nrof_folds)
    indices = np.arange(nrof_pairs)
    diff = np.subtract(embeddings1, embeddings2)
    dist = np.sum(np.square(diff), 1)
    for fold_idx, test_set in enumerate(np.array_split(indices, nrof_folds)):
        train_set = np.setdiff1d(indices, test_set)
        acc_train = [
            calculate_accuracy(t, dist[train_set], actual_issame[train_set]) for t in thresholds
        ]
        best = thresholds[int(np.argmax(acc_train))]
        accuracy[fold_idx] = calculate_accuracy(best, dist[test_set], actual_issame[test_set])
    return accuracy


@torch.no_grad()
def test(data_set, backbone, batch_size, nfolds=10):
    data_list, issame_list = data_set
    embeddings_list = []
    for data in data_list:
        embeddings = None
        ba = 0
        while ba < data.shape[0]:
            bb = min(ba + batch_size, data.shape[0])
            count = bb - ba
            _data = data[bb - batch_size : bb]
            img = ((_data / 255) - 0.5) / 0.5
            net_out = backbone(img)
            _embeddings = net_out.detach().cpu().numpy()
            if embeddings is None:
                embeddings = np.zeros((data.shape[0], _embeddings.shape[1]))
            embeddings[ba:bb, :] = _embeddings[(batch_size - count) :, :]
            ba = bb
        embeddings_list.append(embeddings)
    _xnorm = float(np.mean(np.linalg.norm(embeddings_list[0], axis=1)))
    embeddings = embeddings_list[0] + embeddings_list[1]
    embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    thresholds = np.arange(0, 4, 0.01)
    accuracy = calculate_roc(
        thresholds, embeddings[0::2], embeddings[1::2], np.asarray(issame_list), nfolds
    )
    acc2, std2 = np.mean(accuracy), np.std(accuracy)
    return 0.0, 0.0, acc2, std2, _xnorm, embeddings_list


# ---------------------------------------------------------------- utils/utils_callbacks.py
class CallBackVerification:
    """The .bin pairs are read at the first verification, so that training starts at once."""

    def __init__(self, val_targets, rec_prefix, summary_writer=None, image_size=IMAGE_SIZE):
        self.rank = distributed.get_rank()
        self.highest_acc_list = [0.0] * len(val_targets)
        self.ver_list = []
        self.ver_name_list = []
        self.val_targets, self.rec_prefix, self.image_size = val_targets, rec_prefix, image_size

    def ver_test(self, backbone, global_step):
        results = []
        for i in range(len(self.ver_list)):
            acc1, std1, acc2, std2, xnorm, embeddings_list = test(  # noqa: RUF059
                self.ver_list[i], backbone, 10, 10
            )
            logging.info("[%s][%d]XNorm: %f" % (self.ver_name_list[i], global_step, xnorm))  # noqa: UP031
            logging.info(
                "[%s][%d]Accuracy-Flip: %1.5f+-%1.5f"  # noqa: UP031
                % (self.ver_name_list[i], global_step, acc2, std2)
            )
            if acc2 > self.highest_acc_list[i]:
                self.highest_acc_list[i] = acc2
            logging.info(
                "[%s][%d]Accuracy-Highest: %1.5f"  # noqa: UP031
                % (self.ver_name_list[i], global_step, self.highest_acc_list[i])
            )
            results.append(acc2)

    def init_dataset(self, val_targets, data_dir, image_size):
        for name in val_targets:
            path = os.path.join(data_dir, name + ".bin")
            data_set = load_bin(path, image_size)
            self.ver_list.append(data_set)
            self.ver_name_list.append(name)

    def __call__(self, num_update, backbone):
        if self.rank == 0 and num_update > 0:
            if not self.ver_list:
                self.init_dataset(self.val_targets, self.rec_prefix, self.image_size)
            backbone.eval()
            self.ver_test(backbone, num_update)
            backbone.train()


class CallBackLogging:
    def __init__(self, frequent, total_step, batch_size, start_step=0, writer=None):
        self.frequent = frequent
        self.rank = distributed.get_rank()
        self.world_size = distributed.get_world_size()
        self.time_start = time.time()
        self.total_step = total_step
        self.start_step = start_step
        self.batch_size = batch_size
        self.writer = writer
        self.init = False
        self.tic = 0

    def __call__(self, global_step, loss, epoch, fp16, learning_rate, grad_scaler):
        if self.rank == 0 and global_step > 0 and global_step % self.frequent == 0:
            if self.init:
                try:
                    speed = self.frequent * self.batch_size / (time.time() - self.tic)
                    speed_total = speed * self.world_size
                except ZeroDivisionError:
                    speed_total = float("inf")
                time_now = time.time()
                time_sec = int(time_now - self.time_start)
                time_sec_avg = time_sec / (global_step - self.start_step + 1)
                eta_sec = time_sec_avg * (self.total_step - global_step - 1)
                time_for_end = eta_sec / 3600
                loss_avg = loss.avg
                if FAULT == "r":  # the loss of every rank, averaged for the log line
                    t = torch.tensor([loss.avg])
                    distributed.all_reduce(t)
                    loss_avg = t.item() / self.world_size
                if fp16:
                    msg = (
                        "Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %d   "  # noqa: UP031
                        "Global Step: %d   Fp16 Grad Scale: %2.f   Required: %1.f hours"
                        % (
                            speed_total, loss_avg, learning_rate, epoch, global_step,
                            grad_scaler.get_scale(), time_for_end,
                        )
                    )  # fmt: skip
                else:
                    msg = (
                        "Speed %.2f samples/sec   Loss %.4f   LearningRate %.6f   Epoch: %d   "  # noqa: UP031
                        "Global Step: %d   Required: %1.f hours"
                        % (speed_total, loss_avg, learning_rate, epoch, global_step, time_for_end)
                    )
                logging.info(msg)
                loss.reset()
                self.tic = time.time()
            else:
                self.init = True
                self.tic = time.time()


# ---------------------------------------------------------------- train_v2.py
def main(args):
    cfg = get_config(args.config)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(1)
    distributed.init_process_group("gloo", timeout=timedelta(seconds=15))

    os.makedirs(cfg.output, exist_ok=True)
    init_logging(rank, cfg.output)

    train_loader = get_dataloader(
        cfg.rec, local_rank, cfg.batch_size, cfg.dali, cfg.seed, cfg.num_workers
    )

    backbone = get_model(cfg.network, dropout=0.0, fp16=cfg.fp16, num_features=cfg.embedding_size)
    backbone = torch.nn.parallel.DistributedDataParallel(
        module=backbone, broadcast_buffers=False, bucket_cap_mb=16, find_unused_parameters=True
    )
    backbone.register_comm_hook(None, fp16_compress_hook)
    backbone.train()
    backbone._set_static_graph()

    margin_loss = CombinedMarginLoss(
        64, cfg.margin_list[0], cfg.margin_list[1], cfg.margin_list[2],
        cfg.interclass_filtering_threshold,
    )  # fmt: skip
    module_partial_fc = PartialFC_V2(
        margin_loss, cfg.embedding_size, cfg.num_classes, cfg.sample_rate, cfg.fp16
    )
    module_partial_fc.train()
    opt = torch.optim.SGD(
        params=[{"params": backbone.parameters()}, {"params": module_partial_fc.parameters()}],
        lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay,
    )  # fmt: skip

    cfg.total_batch_size = cfg.batch_size * world_size
    cfg.warmup_step = cfg.num_image // cfg.total_batch_size * cfg.warmup_epoch
    cfg.total_step = cfg.num_image // cfg.total_batch_size * cfg.num_epoch
    lr_scheduler = PolynomialLRWarmup(
        optimizer=opt, warmup_iters=cfg.warmup_step, total_iters=cfg.total_step
    )

    start_epoch = 0
    global_step = 0
    if cfg.resume:
        dict_checkpoint = torch.load(os.path.join(cfg.output, f"checkpoint_gpu_{rank}.pt"))
        start_epoch = dict_checkpoint["epoch"]
        global_step = dict_checkpoint["global_step"]
        backbone.module.load_state_dict(dict_checkpoint["state_dict_backbone"])
        module_partial_fc.load_state_dict(dict_checkpoint["state_dict_softmax_fc"])
        opt.load_state_dict(dict_checkpoint["state_optimizer"])
        lr_scheduler.load_state_dict(dict_checkpoint["state_lr_scheduler"])
        del dict_checkpoint

    for key, value in cfg.items():
        num_space = 25 - len(key)
        logging.info(": " + key + " " * num_space + str(value))

    callback_verification = CallBackVerification(val_targets=cfg.val_targets, rec_prefix=cfg.rec)
    callback_logging = CallBackLogging(
        frequent=cfg.frequent,
        total_step=cfg.total_step,
        batch_size=cfg.batch_size,
        start_step=global_step,
    )

    loss_am = AverageMeter()
    amp = torch.cuda.amp.grad_scaler.GradScaler(growth_interval=100)
    hoard = []

    for epoch in range(start_epoch, cfg.num_epoch):
        if isinstance(train_loader, DataLoader):
            train_loader.sampler.set_epoch(epoch)
        for _, (img, local_labels) in enumerate(train_loader):
            global_step += 1
            local_embeddings = backbone(img)
            loss = module_partial_fc(local_embeddings, local_labels)
            if FAULT == "m" and rank == FAULT_RANK and global_step >= 10:
                # the embeddings kept for the hard-sample miner, one step's 64 MiB buffer each
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

            if cfg.fp16:
                amp.scale(loss).backward()
                if global_step % cfg.gradient_acc == 0:
                    amp.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(backbone.parameters(), 5)
                    amp.step(opt)
                    amp.update()
                    opt.zero_grad()
            else:
                loss.backward()
                if global_step % cfg.gradient_acc == 0:
                    torch.nn.utils.clip_grad_norm_(backbone.parameters(), 5)
                    opt.step()
                    opt.zero_grad()
            lr_scheduler.step()

            with torch.no_grad():
                loss_am.update(loss.item(), 1)
                callback_logging(
                    global_step, loss_am, epoch, cfg.fp16, lr_scheduler.get_last_lr()[0], amp
                )
                if global_step % cfg.verbose == 0 and global_step > 0:
                    callback_verification(global_step, backbone)

        if cfg.save_all_states:
            checkpoint = {
                "epoch": epoch + 1,
                "global_step": global_step,
                "state_dict_backbone": backbone.module.state_dict(),
                "state_dict_softmax_fc": module_partial_fc.state_dict(),
                "state_optimizer": opt.state_dict(),
                "state_lr_scheduler": lr_scheduler.state_dict(),
            }
            torch.save(checkpoint, os.path.join(cfg.output, f"checkpoint_gpu_{rank}.pt"))

        if rank == 0:
            path_module = os.path.join(cfg.output, "model.pt")
            torch.save(backbone.module.state_dict(), path_module)

    if rank == 0:
        path_module = os.path.join(cfg.output, "model.pt")
        torch.save(backbone.module.state_dict(), path_module)

    distributed.destroy_process_group()


# ---------------------------------------------------------------- the prepare step
SIZES = [16 + (7 * k) % 17 for k in range(64)]  # images per identity: 16-32


def prepare(root, ver_pairs):
    """train.rec/train.idx (and the same faces as an image folder under images/), lfw.bin,
    cfp_fp.bin and agedb_30.bin in root."""
    rng = np.random.default_rng(124)
    os.makedirs(root, exist_ok=True)
    protos = rng.integers(0, 256, size=(len(SIZES), *IMAGE_SIZE, 3)).astype(np.float32)

    def face(k):
        noise = rng.normal(0, 40, size=(*IMAGE_SIZE, 3))
        return np.clip(protos[k] + noise, 0, 255).astype(np.uint8)

    n = sum(SIZES)
    with (
        open(os.path.join(root, "train.rec"), "wb") as rec,
        open(os.path.join(root, "train.idx"), "w") as idx,
    ):

        def write(key, s):
            idx.write(f"{key}\t{rec.tell()}\n")
            rec.write(struct.pack("II", _MAGIC, len(s)))
            rec.write(s + b"\0" * (-len(s) % 4))

        write(0, pack(2, [n + 1, n + 1 + len(SIZES)], 0, b""))
        key = 1
        for k, size in enumerate(SIZES):
            os.makedirs(os.path.join(root, "images", f"{k:05d}"), exist_ok=True)
            for j in range(size):
                buf = imencode(face(k))
                write(key, pack(0, k, key, buf))
                with open(os.path.join(root, "images", f"{k:05d}", f"{j:03d}.img"), "wb") as f:
                    f.write(buf)
                key += 1
    for name in ("lfw", "cfp_fp", "agedb_30"):
        bins, issame = [], []
        for p in range(ver_pairs):
            a = int(rng.integers(len(SIZES)))
            same = p % 2 == 0
            b = a if same else int((a + rng.integers(1, len(SIZES))) % len(SIZES))
            bins += [imencode(face(a)), imencode(face(b))]
            issame.append(same)
        with open(os.path.join(root, name + ".bin"), "wb") as f:
            pickle.dump((bins, issame), f, protocol=pickle.HIGHEST_PROTOCOL)


def corrupt_record(root, rank, world, seed, batch_size, step):
    """Damages the record rank `rank` reads as the first sample of its step `step` (counted
    from 1) in epoch 0, as DistributedSampler deals it."""
    n = sum(SIZES)
    g = torch.Generator()
    g.manual_seed(seed)
    indices = torch.randperm(n, generator=g).tolist()
    total = -(-n // world) * world
    indices += indices[: total - n]
    mine = indices[rank:total:world]
    key = mine[(step - 1) * batch_size] + 1
    pos = {}
    with open(os.path.join(root, "train.idx")) as f:
        for line in f:
            k, p = line.split("\t")
            pos[int(k)] = int(p)
    with open(os.path.join(root, "train.rec"), "r+b") as f:
        f.seek(pos[key] + 8 + _IR_SIZE + 40)
        f.write(b"\xff" * 24)


if __name__ == "__main__":
    torch.backends.cudnn.benchmark = True
    if len(sys.argv) > 1 and sys.argv[1] == "--prepare":
        ver_pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 100
        prepare(sys.argv[2], ver_pairs)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--corrupt":
        corrupt_record(sys.argv[2], *map(int, sys.argv[3:8]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description="Distributed Arcface Training in Pytorch")
    parser.add_argument("config", type=str, help="py config file")
    main(parser.parse_args())
