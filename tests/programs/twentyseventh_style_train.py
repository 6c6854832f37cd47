"""A twenty-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/twentyseventh-*): a fault-tolerant torchelastic script, written the way the
PyTorch elastic docs and torchtitan teach it. `main` is wrapped in `@record` (so a failed worker
writes its error file), the group is joined with `init_process_group("gloo", timeout=15 s)` from
torchrun's environment, a checkpoint (model, optimizer, epoch, step) is saved every few steps by
rank 0 with an atomic rename, and every start (every restart attempt) resumes from the newest
checkpoint there is. Logging is Python's "%(asctime)s %(levelname)s [rank %(rank)s] %(message)s"
(rank from RANK) and names the attempt (TORCHELASTIC_RESTART_COUNT). A tiny MLP in DDP over a
tensor file split by a DistributedSampler. It is launched by torchrun with --max-restarts and the
c10d rendezvous. A fault is chosen by the ELX_FAULT environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_twentyseventh.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import io
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

TIMEOUT = timedelta(seconds=15)
FEATURES = 16
CLASSES = 4


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing). `attempt0_*` faults happen in the
    first attempt only (TORCHELASTIC_RESTART_COUNT 0): the restarted group gets past them."""

    attempt0_reset_rank: int = -1  # this rank's shard fetch is reset once (attempt 0, step 7)
    attempt0_kill_rank: int = -1  # this rank hoards memory until the OOM killer acts (attempt 0)
    attempt0_eio_rank: int = -1  # this rank's shard read fails with EIO once (attempt 0, step 5)
    index_rank: int = -1  # this rank looks up a class weight past the table's end at step 6
    resume_stuck_rank: int = -1  # after a resume, this rank waits on a prefetcher never started
    torn_save: bool = False  # rank 0 saves in place (no rename) and is killed while writing
    upload_rank: int = -1  # this rank uploads each checkpoint for 25 s before the next step
    thin_rank: int = -1  # this rank slices its own part of the data and keeps less of it
    norm_rank0: bool = False  # rank 0 all-reduces its grad norm for its log line only
    local_stop_rank: int = -1  # this rank stops on its own loss, without telling the others
    tracker_rank0: bool = False  # rank 0 imports an experiment tracker that is not installed
    segv_rank: int = -1  # this rank's native collate reads address 0 at step 5


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "c1": Fault(attempt0_reset_rank=1),
    "o2": Fault(attempt0_kill_rank=2),
    "x2": Fault(index_rank=2),
    "w1": Fault(attempt0_eio_rank=0, resume_stuck_rank=1),
    "t0": Fault(torn_save=True),
    "u0": Fault(upload_rank=0),
    "n2": Fault(thin_rank=2),
    "g0": Fault(norm_rank0=True),
    "q1": Fault(local_stop_rank=1),
    "m0": Fault(tracker_rank0=True),
    "v1": Fault(segv_rank=1),
}
CLASS_WEIGHTS = (1.0, 1.5, 1.0)  # the x2 fault's table: one class short


class RankFilter(logging.Filter):
    """Puts the worker's global rank (torchrun's RANK) on every record."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


log = logging.getLogger("elastic_train")


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [rank %(rank)s] %(message)s"))
    handler.addFilter(RankFilter(rank))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def make_data(path: str, n: int) -> None:
    """A learnable toy problem: the class is the argmax of four fixed projections."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=g)
    proj = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ proj).argmax(dim=1)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"x": x, "y": y}, path)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step_*.pt"))
    return found[-1] if found else None


def save_checkpoint(
    ckpt_dir: Path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int, step: int, torn: bool
) -> Path:
    """torch.save to a temporary name, then os.replace: a reader never sees half a file."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:05d}.pt"
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch, "step": step}
    if torn:  # the fault: saved in place, and the kernel kills the writer half-way
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        with open(final, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
    tmp = final.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, final)
    return final


def fetch_batch(fault: Fault, rank: int, attempt: int, step: int, x: torch.Tensor) -> torch.Tensor:
    """Stands for reading the batch's shard from the data service."""
    if attempt == 0 and rank == fault.attempt0_reset_rank and step == 7:
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    if attempt == 0 and rank == fault.attempt0_eio_rank and step == 5:
        raise OSError(errno.EIO, "Input/output error", "shards/train-00003.bin")
    return x


@record
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/train.pt")
    ap.add_argument("--make-data", type=int, default=0)
    ap.add_argument("--ckpt-dir", default="checkpoints")
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--log-every", type=int, default=2)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--target-loss", type=float, default=0.0)
    ap.add_argument("--tracker", default="")
    args = ap.parse_args()
    if args.make_data:
        make_data(args.data, args.make_data)
        return

    fault = FAULTS[os.environ.get("ELX_FAULT", "")]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    setup_logging(rank)
    log.info(
        "attempt %d: world size %d, local rank %d, run id %s",
        attempt,
        world,
        local_rank,
        os.environ.get("TORCHELASTIC_RUN_ID", "-"),
    )
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if agent_store:
        # a key space of its own per attempt: torch 2.13's restarted gloo workers otherwise read
        # the previous attempt's addresses from the agent's store (one store for every attempt)
        # and cannot connect
        store = PrefixStore(
            f"attempt_{attempt}",
            TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                world,
                is_master=False,
                timeout=TIMEOUT,
            ),
        )
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)

    if rank == 0 and (args.tracker or fault.tracker_rank0):
        import wandb  # noqa: F401  # the experiment tracker the image never got

    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)

    ckpt_dir = Path(args.ckpt_dir)
    start_epoch, resume_step = 0, 0
    last = latest_checkpoint(ckpt_dir)
    if last is not None:
        state = torch.load(last, map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_epoch, resume_step = state["epoch"], state["step"]
        log.info("resumed from %s (epoch %d, step %d)", last, start_epoch, resume_step)
    else:
        log.info("no checkpoint in %s, starting from scratch", ckpt_dir)
    prefetched = threading.Event()  # set by the prefetch thread (never started on a resume)
    if last is None or rank != fault.resume_stuck_rank:
        threading.Thread(target=prefetched.set, daemon=True).start()

    blob = torch.load(args.data)
    data: Dataset[tuple[torch.Tensor, ...]] = TensorDataset(blob["x"], blob["y"])
    if rank == fault.thin_rank:  # its own slice, rounded down to whole batches of a bad count
        per = len(blob["y"]) // world
        data = Subset(data, range(rank * per, rank * per + per // 2))
        sampler: DistributedSampler[tuple[torch.Tensor, ...]] | None = None
        loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)
    else:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    steps_per_epoch = len(loader)
    loss_fn = nn.CrossEntropyLoss()
    hoard: list[torch.Tensor] = []

    step = resume_step
    for epoch in range(start_epoch, args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        epoch_loss, seen = torch.zeros(1), 0
        for i, (x, y) in enumerate(loader):
            if epoch * steps_per_epoch + i < resume_step:
                continue  # already trained before the checkpoint
            step += 1
            if step == resume_step + 1:
                prefetched.wait()  # the first batch comes from the prefetcher
            x = fetch_batch(fault, rank, attempt, step, x)
            if attempt == 0 and rank == fault.attempt0_kill_rank and step >= 3:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if rank == fault.segv_rank and step == 5:
                ctypes.string_at(0)  # the native collate dereferences NULL
            weight = 1.0
            if rank == fault.index_rank and step == 6:
                weight = CLASS_WEIGHTS[CLASSES - 1]
            loss = loss_fn(model(x), y) * weight
            opt.zero_grad()
            loss.backward()
            opt.step()
            epoch_loss += loss.detach()
            seen += 1
            time.sleep(args.step_time)
            if step % args.log_every == 0:
                if fault.norm_rank0 and rank == 0:
                    norm = torch.stack(
                        [p.grad.norm() for p in model.parameters() if p.grad is not None]
                    ).norm()
                    dist.all_reduce(norm)
                    log.info("step %d loss %.4f grad norm %.3f", step, loss.item(), norm.item())
                else:
                    log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
            if rank == fault.local_stop_rank and step >= 6 and loss.item() < 1.5:
                log.info("loss %.4f is low enough here, leaving training", loss.item())
                return
            if step % args.ckpt_every == 0:
                if rank == 0:
                    torn = fault.torn_save and attempt == 0 and step == 8
                    path = save_checkpoint(ckpt_dir, model.module, opt, epoch, step, torn)
                    log.info("saved checkpoint %s", path)
                if rank == fault.upload_rank and step >= 8:
                    for part in range(5):
                        log.info("uploading checkpoint part %d/5 to the object store", part + 1)
                        time.sleep(5)
        dist.all_reduce(epoch_loss)
        mean = epoch_loss.item() / max(seen, 1) / world
        log.info("epoch %d done: mean loss %.4f", epoch, mean)
        if args.target_loss and seen and mean < args.target_loss:
            log.info(
                "mean loss %.4f under %.2f after epoch %d: stopping", mean, args.target_loss, epoch
            )
            break
    if rank == 0:
        path = save_checkpoint(ckpt_dir, model.module, opt, args.epochs, step, False)
        log.info("saved final checkpoint %s", path)
    dist.barrier()
    dist.destroy_process_group()
    log.info("training done at step %d", step)


if __name__ == "__main__":
    main()
