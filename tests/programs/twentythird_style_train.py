"""A twenty-third training-program style for the generalisation fixtures
(tests/fixtures/real/twentythird-*): a research repo's own launcher and train script in one file.
`launch` starts one `subprocess.Popen` per rank (stdout and stderr into `<logdir>/rank<N>.log`),
polls them, prints `[launcher] ...` lines and kills the rest when one fails (`--wait-all`: the
naive version that waits for every rank); `--nnodes`/`--node-rank` offset the ranks of a second
'node'. `train` joins a gloo group through `tcp://127.0.0.1:PORT` (15 s timeout), logs with
`%(asctime)s [%(levelname)s] %(message)s` (no rank in the format: the rank is only in the file
name), trains a tiny MLP under raw DDP with a DistributedSampler, evaluates each epoch, saves a
checkpoint on rank 0 and loads it on every rank with --resume. A fault is chosen by the
EXP_FAULT environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_twentythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

log = logging.getLogger("train")


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code, the data or the run (the defaults: nothing)."""

    loud: bool = False  # the warnings such a script prints on its way
    hoard_rank: int = -1  # this rank caches every batch until the OOM killer acts
    segv_rank: int = -1  # this rank's native feature extractor reads address 0
    json_meta_rank0: bool = False  # rank 0 writes checkpoint metadata with a tensor in it
    local_stop_rank: int = -1  # this rank stops on its own validation loss and exits 0
    barrier_on_zero: bool = False  # rank 0 waits for "everyone" inside `if rank == 0`
    filter_rank: int = -1  # this rank's shard has mostly over-long samples, filtered per rank
    slow_cache_rank: int = -1  # this rank builds a feature cache for 25 s in epoch 2
    lock_rank: int = -1  # this rank takes the feature-cache file lock (held by a stale job)
    label_range_rank: int = -1  # this rank's shard holds a label past the number of classes


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "w": Fault(loud=True),
    "h2": Fault(hoard_rank=2),
    "s3": Fault(segv_rank=3),
    "j0": Fault(json_meta_rank0=True),
    "e3": Fault(local_stop_rank=3),
    "b0": Fault(barrier_on_zero=True),
    "f1": Fault(filter_rank=1),
    "p2": Fault(slow_cache_rank=2),
    "l1": Fault(lock_rank=1),
    "r2": Fault(label_range_rank=2),
}

CLASSES = ["walk", "run", "sit", "stand"]
FEATURES = 16
SAMPLES = 256


# ---------------------------------------------------------------- launcher
def launch(argv: list[str]) -> int:
    """Start the ranks of this node, watch them, stop the rest when one fails."""
    p = argparse.ArgumentParser(prog="launch")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--world-size", type=int, default=0, help="default: nproc * nnodes")
    p.add_argument("--logdir", default="logs")
    p.add_argument("--wait-all", action="store_true", help="never kill: wait for every rank")
    args, rest = p.parse_known_args(argv)
    world = args.world_size or args.nproc * args.nnodes
    os.makedirs(args.logdir, exist_ok=True)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for local in range(args.nproc):
        rank = args.node_rank * args.nproc + local
        out = open(f"{args.logdir}/rank{rank}.log", "w")  # noqa: SIM115 - the child's file
        procs[rank] = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "train",
                "--rank",
                str(rank),
                "--world-size",
                str(world),
                "--master-port",
                str(args.master_port),
                *rest,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        print(f"[launcher] started rank {rank} (pid {procs[rank].pid})", flush=True)
    codes: dict[int, int] = {}
    killing = False
    while len(codes) < len(procs):
        time.sleep(0.2)
        for rank, proc in procs.items():
            rc = proc.poll()
            if rc is None or rank in codes:
                continue
            codes[rank] = rc
            if rc == 0:
                print(f"[launcher] rank {rank} finished", flush=True)
                continue
            print(f"[launcher] rank {rank} exited with code {rc}", flush=True)
            if not args.wait_all and not killing:
                killing = True
                print("[launcher] killing remaining ranks", flush=True)
                for other in procs.values():
                    if other.poll() is None:
                        other.terminate()
    failed = sorted(r for r, c in codes.items() if c != 0)
    if failed:
        print(f"[launcher] {len(failed)} of {len(procs)} ranks failed", flush=True)
        return 1
    print("[launcher] all ranks finished", flush=True)
    return 0


# ---------------------------------------------------------------- training
def train(argv: list[str]) -> int:
    """One rank: join the group, train, evaluate, checkpoint."""
    p = argparse.ArgumentParser(prog="train")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="data")
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--resume", default="")
    p.add_argument("--tracker", default="none", choices=["none", "tensorboard"])
    p.add_argument("--stop-below", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args(argv)
    fault = FAULTS[os.environ.get("EXP_FAULT", "")]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s", stream=sys.stdout
    )
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    rank, world = args.rank, args.world_size
    torch.manual_seed(0)
    log.info("args: %s", {k: v for k, v in vars(args).items() if k not in ("data",)})

    # the shard index each rank reads before joining (written by the data-prep job)
    index = json.loads((Path(args.data) / f"shard-{rank}.json").read_text())
    log.info("shard index: %d files, %d classes", len(index["files"]), len(index["classes"]))
    if args.tracker == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        SummaryWriter(log_dir="runs")

    log.info("initialising process group (rank %d, world size %d)", rank, world)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=15),
    )
    log.info("process group ready")
    if fault.lock_rank == rank:
        with open(Path(args.data) / "feature-cache.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # held by a job that should have ended
            log.info("feature cache ready")

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    y = (x[:, :4].argmax(dim=1)).long()
    lengths = torch.randint(8, 64, (SAMPLES,), generator=gen)
    train_set = TensorDataset(x, y, torch.arange(SAMPLES))
    eval_set = TensorDataset(x[:64], y[:64], torch.arange(64))

    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, len(CLASSES)))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    start_epoch = 0
    if args.resume:
        state = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_epoch = state["epoch"] + 1
        log.info("resumed from %s (epoch %d)", args.resume, state["epoch"])
    if fault.loud:
        sched.step()  # before the first optimizer.step(): torch warns about the order
    # class weights from this rank's shard histogram (the names the data-prep job wrote)
    label_of = {c: i for i, c in enumerate(CLASSES)}
    counts = torch.ones(len(CLASSES))
    for name in index["classes"]:
        counts[label_of[name]] += 1
    loss_fn = nn.CrossEntropyLoss(weight=counts.sum() / counts / len(CLASSES))
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(
        train_set, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers
    )
    hoard: list[torch.Tensor] = []
    ckpt_dir = Path(args.ckpt_dir)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        if fault.slow_cache_rank == rank and epoch == 1:
            for part in range(5):
                time.sleep(5)  # tokenising and hashing the next epoch's features
                log.info("building feature cache: part %d/5", part + 1)
        if fault.filter_rank >= 0:
            # drop recordings over the length limit (rank 1's shard: mostly long ones)
            limit = 20 if rank == fault.filter_rank else 64
            shard = list(sampler)
            kept = [i for i in shard if int(lengths[i]) <= limit]
            log.info("length filter kept %d of %d samples", len(kept), len(shard))
            batches = list(DataLoader(train_set, batch_size=args.batch_size, sampler=kept))
        else:
            batches = list(loader)
        total = len(batches)
        for step, (bx, by, _idx) in enumerate(batches):
            if fault.label_range_rank == rank and step == 5:
                by = by.clone()
                by[0] = len(CLASSES) + 3  # a label from the 8-class version of the data
            if fault.hoard_rank == rank:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if step == 3:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if fault.segv_rank == rank and epoch == 1 and step == 2:
                ctypes.string_at(0)  # the native feature extractor dereferences NULL
            out = ddp(bx)
            loss = loss_fn(out, by)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 8 == 0 or step == total - 1:
                log.info("epoch %d step %d/%d loss %.4f", epoch, step + 1, total, loss.item())
        sched.step()

        ddp.eval()
        sums = torch.zeros(3)
        with torch.no_grad():
            eval_sampler = DistributedSampler(eval_set, num_replicas=world, rank=rank)
            for bx, by, _ in DataLoader(eval_set, batch_size=16, sampler=eval_sampler):
                out = ddp(bx)
                if fault.loud:
                    sums = torch.tensor(sums)  # torch warns: copy-construct from a tensor
                sums += torch.tensor(
                    [loss_fn(out, by).item() * len(by), (out.argmax(1) == by).sum().item(), len(by)]
                )
        local_loss = float(sums[0] / sums[2])
        if fault.local_stop_rank == rank and local_loss < args.stop_below:
            log.info("validation loss %.4f below %.2f: early stopping", local_loss, args.stop_below)
            return 0
        dist.all_reduce(sums)
        log.info(
            "epoch %d eval loss %.4f acc %.3f",
            epoch,
            float(sums[0] / sums[2]),
            float(sums[1] / sums[2]),
        )
        if rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch},
                ckpt_dir / "last.pt",
            )
            meta = {"epoch": epoch, "loss": float(sums[0] / sums[2])}
            if fault.json_meta_rank0:
                meta["loss"] = sums[0] / sums[2]  # a tensor, not a float
            (ckpt_dir / "last.json").write_text(json.dumps(meta))
            log.info("saved checkpoint to %s", ckpt_dir / "last.pt")
            if fault.barrier_on_zero:
                dist.barrier()  # "wait until every rank has seen the checkpoint"
        dist.barrier()
    log.info("training complete")
    dist.destroy_process_group()
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "launch":
        return launch(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        return train(sys.argv[2:])
    return train(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
