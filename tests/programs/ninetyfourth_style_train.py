"""A ninety-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyfourth-*): training from a streaming dataset in the way of MosaicML
streaming's StreamingDataset (and webdataset / LitData), re-implemented in plain torch. A
prepare step (`train.py --prepare`) writes the data set as MDS-like binary shards
(data/remote/<split>/shard.0000k.mds) plus an index.json listing every shard with its sample
count, size and sha1. At training time every rank 'downloads' (copies) the shards its samples
live in from the remote folder into the node's local cache (--data_local), one copy per shard under a
lock file in the cache dir (shard.0000k.mds.lock); the node's local leader registers the cache
in a shared-memory block named as streaming names it (/000000_locals), and the other local ranks
attach to it. Samples are partitioned over ranks in contiguous spans (or whole shards per rank,
webdataset's split_by_node, with --split-by shard) and shuffled per epoch with the shuffle
seed. A tiny text classifier (EmbeddingBag + Linear) under DDP; Composer-style logging: Python
logging on every rank ('%(asctime)s: rank0[pid][MainThread]: INFO: composer.trainer.trainer:
...', streaming's own warnings such as 'Because `predownload` was not specified, it will
default to 8*batch_size ...') and rank 0's console logger blocks ('[epoch=1][batch=8/19]:' and
tab-indented 'Train loss/train/total: 1.2345'), evaluation every epoch, a ThresholdStopper-like
--stop-at-accuracy, rank 0's checkpoint named by --save-filename. gloo on CPU, 15 s collective
timeout. Launched with `torchrun --nproc_per_node N --master_port PORT train.py --data_remote
data/remote --data_local CACHE ...` (llm-foundry's variable names: torchrun's own parser would
take a bare --local for an abbreviation of its --local-addr). A fault in the code is chosen by the TQ_CASE environment variable
(a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetyfourth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import struct
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

log = logging.getLogger("composer.trainer.trainer")
slog = logging.getLogger("streaming.base.dataset")
dlog = logging.getLogger("streaming.base.storage.download")
clog = logging.getLogger("composer.callbacks.checkpoint_saver")

VOCAB, SEQ, CLASSES = 64, 16, 4
MAGIC = b"MDS\x01"


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ---------------------------------------------------------------- writing (the MDSWriter part)
def write_split(root: Path, n: int, per_shard: int, seed: int) -> None:
    """n samples of SEQ token ids and a label, per_shard samples a shard, and index.json."""
    centres = torch.randint(0, VOCAB, (CLASSES, 6), generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(seed)
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for k, start in enumerate(range(0, n, per_shard)):
        count = min(per_shard, n - start)
        labels = torch.randint(0, CLASSES, (count,), generator=g)
        noise = torch.randint(0, VOCAB, (count, SEQ), generator=g)
        pick = centres[labels][:, torch.randint(0, 6, (SEQ,), generator=g)]
        keep = torch.rand(count, SEQ, generator=g) < 0.5
        tokens = torch.where(keep, pick, noise)
        body = b"".join(
            struct.pack("<B", int(y)) + struct.pack(f"<{SEQ}H", *map(int, t))
            for y, t in zip(labels, tokens, strict=True)
        )
        raw = MAGIC + struct.pack("<I", count) + body
        name = f"shard.{k:05d}.mds"
        (root / name).write_bytes(raw)
        shards.append(
            {
                "basename": name,
                "samples": count,
                "bytes": len(raw),
                "hashes": {"sha1": hashlib.sha1(raw).hexdigest()},
            }
        )
    index = {"version": 2, "format": "mds", "shards": shards}
    (root / "index.json").write_text(json.dumps(index, indent=1))


# ---------------------------------------------------------------- reading (the StreamingDataset)
class Locals:
    """The node's registry of local cache dirs in shared memory (streaming's /000000_locals)."""

    def __init__(self, local: str, local_rank: int) -> None:
        name = "000000_locals"
        data = local.encode()
        if local_rank == 0:
            self.shm = shared_memory.SharedMemory(name, create=True, size=len(data) + 4)
            self.shm.buf[:4] = struct.pack("<I", len(data))
            self.shm.buf[4 : 4 + len(data)] = data
        dist.barrier()
        if local_rank != 0:
            self.shm = shared_memory.SharedMemory(name)
            resource_tracker.unregister(self.shm._name, "shared_memory")  # the leader owns it
        self.owner = local_rank == 0

    def close(self) -> None:
        self.shm.close()
        if self.owner:
            self.shm.unlink()


class StreamingTextDataset(IterableDataset):
    def __init__(
        self,
        remote: str,
        local: str,
        split: str,
        batch_size: int,
        shuffle: bool,
        shuffle_seed: int,
        predownload: int | None,
        num_canonical_nodes: int | None,
        split_by: str,
        case: tuple[str, int],
    ) -> None:
        self.remote = Path(remote) / split
        self.local = Path(local) / split
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.shuffle, self.seed, self.epoch = shuffle, shuffle_seed, 0
        self.split_by, self.case = split_by, case
        if predownload is None:
            predownload = 8 * batch_size
            slog.warning(
                "Because `predownload` was not specified, it will default to 8*batch_size if "
                "batch_size is not None, otherwise 64. Prior to Streaming v0.7.0, `predownload` "
                "defaulted to max(batch_size, 256 * batch_size // num_canonical_nodes)."
            )
        if num_canonical_nodes is None:
            num_canonical_nodes = 1
            slog.warning(
                "Because `num_canonical_nodes` was not specified, and `shuffle_algo` is py1e, "
                "it will default to be equal to physical nodes. Prior to Streaming v0.7.0, "
                "`num_canonical_nodes` defaulted to 64 * physical nodes."
            )
        self.predownload, self.num_canonical_nodes = predownload, num_canonical_nodes
        self.local.mkdir(parents=True, exist_ok=True)
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:  # the local leader fetches the index
            shutil.copyfile(self.remote / "index.json", self.local / "index.json")
        dist.barrier()
        self.shards = json.loads((self.local / "index.json").read_text())["shards"]
        self.num_samples = sum(s["samples"] for s in self.shards)
        self.mine = self._partition()

    def _partition(self) -> list[tuple[int, int]]:
        """(shard, row) of every sample this rank reads in an epoch."""
        spans, start = [], 0
        for k, s in enumerate(self.shards):
            spans.append([(k, i) for i in range(s["samples"])])
            start += s["samples"]
        if self.split_by == "shard":  # webdataset's split_by_node: whole shards per rank
            return [x for span in spans[self.rank :: self.world] for x in span]
        flat = [x for span in spans for x in span]
        per = -(-len(flat) // self.world)
        mine = flat[self.rank * per : (self.rank + 1) * per]
        return mine + flat[: per - len(mine)]  # padded so every rank gets the same count

    def __len__(self) -> int:
        return len(self.mine)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _download(self, k: int) -> Path:
        """Copy shard k from the remote into the local cache, once, under its lock file."""
        shard = self.shards[k]
        dest = self.local / shard["basename"]
        lock = dest.with_name(dest.name + ".lock")
        while True:
            if dest.exists() and not lock.exists():
                break
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # another local rank is copying it
                time.sleep(0.1)
                continue
            try:
                if not dest.exists():
                    src = self.remote / shard["basename"]
                    tmp = dest.with_name(dest.name + ".tmp")
                    if self.case[0] == "s" and self.rank == self.case[1]:
                        size = src.stat().st_size
                        with open(src, "rb") as f_in, open(tmp, "wb") as f_out:
                            for part in range(1, 9):  # a throttled remote
                                f_out.write(f_in.read(-(-size // 8)))
                                dlog.info(
                                    "Downloading %s from %s: %d of %d bytes (%d/8), retrying "
                                    "slow read",
                                    shard["basename"],
                                    self.remote,
                                    min(size, part * -(-size // 8)),
                                    size,
                                    part,
                                )
                                time.sleep(4)
                    else:
                        shutil.copyfile(src, tmp)
                    os.rename(tmp, dest)
            finally:
                os.close(fd)
                os.unlink(lock)
            break
        raw = dest.read_bytes()
        if len(raw) != shard["bytes"] or hashlib.sha1(raw).hexdigest() != shard["hashes"]["sha1"]:
            raise ValueError(f"Checksum failure: {dest}")
        return dest

    def _decode(self, raw: bytes, row: int) -> tuple[torch.Tensor, int]:
        at = 8 + row * (1 + 2 * SEQ)
        if self.case[0] == "n" and self.rank == self.case[1] and self.epoch == 1 and row == 40:
            ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(raw[at : at + 4]), 4)
        label = raw[at]
        tokens = struct.unpack_from(f"<{SEQ}H", raw, at + 1)
        return torch.tensor(tokens), label

    def __iter__(self):
        order = list(self.mine)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        needed = sorted({k for k, _ in order})
        raws = {k: self._download(k).read_bytes() for k in needed}
        for k, row in order:
            yield self._decode(raws[k], row)


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.embed(tokens)))


def console(block: str) -> None:
    """Composer's ConsoleLogger: one block per log interval, rank 0 only."""
    sys.stdout.write(block + "\n")
    sys.stdout.flush()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="text classifier on a streaming MDS dataset")
    p.add_argument("--prepare", action="store_true", help="write the MDS shards and exit")
    p.add_argument("--num-samples", type=int, default=300)
    p.add_argument("--size-limit", type=int, default=64, help="samples per shard (--prepare)")
    p.add_argument("--data-seed", type=int, default=94)
    p.add_argument("--data_remote", dest="remote", default="data/remote")
    p.add_argument("--data_local", dest="local", default="/tmp/cache")
    p.add_argument("--split-by", choices=["sample", "shard"], default="sample")
    p.add_argument("--predownload", type=int, default=None)
    p.add_argument("--num-canonical-nodes", type=int, default=None)
    p.add_argument("--shuffle-seed", type=int, default=17)
    p.add_argument("--device-train-batch-size", type=int, default=8)
    p.add_argument("--max-duration", default="3ep")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-interval", type=int, default=8, help="batches")
    p.add_argument("--eval-interval", type=int, default=1, help="epochs (and checkpoints)")
    p.add_argument("--stop-at-accuracy", type=float, default=None, help="ThresholdStopper")
    p.add_argument("--save-folder", default="checkpoints")
    p.add_argument("--save-filename", default="ep{epoch}-ba{batch}-rank0.pt")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.prepare:
        write_split(Path(args.remote) / "train", args.num_samples, args.size_limit, args.data_seed)
        write_split(Path(args.remote) / "val", 64, 64, args.data_seed + 1)
        return

    case = fault()
    letter, who = case
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s: rank{rank}[%(process)d][%(threadName)s]: %(levelname)s: "
        "%(name)s: %(message)s",
    )
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    if rank == 0:
        log.info("Building train loader... (remote %s, local %s)", args.remote, args.local)
    locals_ = Locals(args.local, local_rank)
    common = dict(
        remote=args.remote,
        local=args.local,
        batch_size=args.device_train_batch_size,
        shuffle_seed=args.shuffle_seed,
        predownload=args.predownload,
        num_canonical_nodes=args.num_canonical_nodes,
        case=case,
    )
    train = StreamingTextDataset(split="train", shuffle=True, split_by=args.split_by, **common)
    val = StreamingTextDataset(split="val", shuffle=False, split_by="sample", **common)
    train_loader = DataLoader(train, batch_size=args.device_train_batch_size)
    val_loader = DataLoader(val, batch_size=16)
    log.info(
        "Train dataset: %d samples in %d shards, %d on this rank, %d batches per epoch",
        train.num_samples,
        len(train.shards),
        len(train),
        len(train_loader),
    )

    model = DDP(TextClassifier())
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        log.info("Initializing model... n_params=%d, world_size=%d, backend gloo", n_params, world)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epochs = int(args.max_duration.removesuffix("ep"))
    save_folder = Path(args.save_folder)
    save_folder.mkdir(parents=True, exist_ok=True)
    batches, samples = 0, 0
    hoard: list[torch.Tensor] = []
    log.info("Run name: stream-text-%d, starting training for %s", args.seed, args.max_duration)
    for epoch in range(epochs):
        train.set_epoch(epoch)
        model.train()
        for step, (tokens, labels) in enumerate(train_loader, start=1):
            if letter == "m" and rank == who and epoch == 1:
                hoard.append(torch.ones(16 << 20))  # decoded samples kept, no cache limit
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(tokens), labels)
            loss.backward()
            optimizer.step()
            batches += 1
            samples += len(labels)
            if step % args.log_interval == 0 and rank == 0:
                block = (
                    f"[epoch={epoch + 1}][batch={step}/{len(train_loader)}]:\n"
                    f"\t Train time/epoch: {epoch}\n"
                    f"\t Train time/batch: {batches}\n"
                    f"\t Train time/sample: {samples * world}\n"
                    f"\t Train loss/train/total: {loss.item():.4f}"
                )
                if letter == "c":  # SpeedMonitor-like throughput over every rank
                    seen = torch.tensor([float(samples)])
                    dist.all_reduce(seen)
                    block += f"\n\t Train throughput/samples_total: {int(seen.item())}"
                console(block)
        if (epoch + 1) % args.eval_interval:
            continue
        model.eval()
        stats = torch.zeros(3)
        with torch.no_grad():
            for tokens, labels in val_loader:
                logits = model(tokens)
                stats[0] += F.cross_entropy(logits, labels, reduction="sum")
                stats[1] += (logits.argmax(1) == labels).sum()
                stats[2] += len(labels)
        dist.all_reduce(stats)
        acc = (stats[1] / stats[2]).item()
        if rank == 0:
            console(
                f"[Eval batch={len(val_loader)}/{len(val_loader)}] Eval on eval data\n"
                f"[epoch={epoch + 1}][batch={len(train_loader)}/{len(train_loader)}]:\n"
                f"\t Eval metrics/eval/MulticlassAccuracy: {acc:.4f}\n"
                f"\t Eval metrics/eval/CrossEntropy: {(stats[0] / stats[2]).item():.4f}"
            )
            name = args.save_filename.format(epoch=epoch + 1, batch=batches)
            torch.save(
                {"state": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                save_folder / name,
            )
            clog.info("Saved checkpoint to %s", save_folder / name)
        if args.stop_at_accuracy is not None and acc >= args.stop_at_accuracy:
            log.info(
                "ThresholdStopper: metrics/eval/MulticlassAccuracy %.4f >= %.2f, stopping "
                "training at epoch %d",
                acc,
                args.stop_at_accuracy,
                epoch + 1,
            )
            break
    locals_.close()
    dist.barrier()
    dist.destroy_process_group()
    log.info("Training finished after %d batches", batches)


if __name__ == "__main__":
    main()
