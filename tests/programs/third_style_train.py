"""A third DDP job style for the generalisation fixtures (tests/fixtures/real/third-*): bare
print() lines with an `[R<rank>/<world>]` prefix plus JSON metric lines, a hand-written batching
loop, a 20 s collective timeout; one real fault per --mode. Captured by
tests/fixtures/real/capture_third.sh: keep its line numbers (re-capture after any edit)."""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="healthy")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--shards", default="/tmp/third-shards")
ARGS, _ = parser.parse_known_args()
if ARGS.mode == "local-rank":  # written for torch.distributed.launch, which passed --local_rank
    parser.add_argument("--local_rank", type=int, required=True)
ARGS = parser.parse_args()

import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

MODE = ARGS.mode
RANK = int(os.environ.get("RANK", "-1"))
WORLD = int(os.environ.get("WORLD_SIZE", "0"))
BATCH = 8
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[R{RANK}/{WORLD}] {msg}", flush=True)


def metric(**kv: object) -> None:
    print(json.dumps({"rank": RANK, "t": round(time.monotonic() - T0, 2), **kv}), flush=True)


class Net(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(16, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor, skip_mid: bool = False) -> torch.Tensor:
        h = F.relu(self.inp(x))
        if not skip_mid:
            h = F.relu(self.mid(h))
        return self.out(h)


class Noisy(torch.utils.data.Dataset):
    """Only for --mode worker-killed: the one mode that uses a DataLoader with workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if RANK == 1 and i >= 40:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies like one the OOM killer took
        x = torch.randn(16)
        return x, (x.sum() > 0).long()


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(n * BATCH, 16, generator=g)
    y = (x.sum(1) > 0).long()
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(n)]


def main() -> int:
    if MODE == "pg-before-init" and RANK == 0:
        say(f"world size {dist.get_world_size()}")  # before init_process_group
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    say(f"up: pid={os.getpid()} local_rank={os.environ['LOCAL_RANK']} timeout=20s")
    if MODE == "missing-file":
        with open(os.path.join(ARGS.shards, f"shard-{rank:02d}.bin"), "rb") as f:
            say(f"shard header {f.read(4).hex()}")
    if MODE == "healthy":
        try:
            with open("checkpoints/last.pt", "rb") as f:
                f.read(1)
        except FileNotFoundError as exc:
            say(f"no checkpoint to resume ({exc}), starting from scratch")
        warnings.warn("warmup_steps (50) is longer than one epoch (10 steps)", stacklevel=1)
    torch.manual_seed(0)
    model = Net(hidden=48 if MODE == "model-mismatch" and rank == 1 else 32)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=MODE == "healthy")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if MODE == "weights-only" and rank == 0:
        path = f"/tmp/third-ckpt-{os.getpid()}.pt"
        torch.save({"model": model.state_dict(), "args": ARGS}, path)
        say(f"resuming from {path}")
        torch.load(path)
    n = 7 if MODE == "uneven" and rank == 2 else 10
    data = batches(n)
    say(f"{n} batches of {BATCH} per epoch, {ARGS.epochs} epochs")
    if MODE == "worker-killed":
        loader = torch.utils.data.DataLoader(Noisy(80), batch_size=BATCH, num_workers=2)
    epochs = 30 if MODE == "sigterm" else ARGS.epochs
    step = 0
    best = float("inf")
    for epoch in range(epochs):
        total = 0.0
        source = loader if MODE == "worker-killed" else data
        for it, (x, y) in enumerate(source):
            if MODE == "value-error" and rank == 2 and epoch == 1 and it == 4:
                y = data[it][1][:-1]  # an off-by-one slice of the labels
            skip = MODE == "unused" and it % 3 == 2
            loss = F.cross_entropy(ddp(x, skip_mid=skip), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            total += loss.item()
            if step % 3 == 0:
                metric(epoch=epoch, it=it + 1, of=n, loss=round(loss.item(), 4))
            if MODE == "sigterm":
                time.sleep(0.2)
            if MODE == "leave" and rank == 1 and epoch == 1 and it == 3:
                say("loss below target on my shard, done")
                dist.destroy_process_group()
                return 0
            if MODE == "sigkill" and rank == 2 and epoch == 1 and it == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            if MODE == "segv" and rank == 1 and epoch == 1 and it == 2:
                ctypes.string_at(0)
        mean = torch.tensor([total / n])
        dist.all_reduce(mean)
        val = mean.item() / world
        local = total / n
        if rank == 0:
            metric(epoch=epoch, val=round(val, 4))
        if MODE == "rank0-collective" and rank == 0 and epoch == 1:
            say("new best, telling the other ranks")
            flag = torch.ones(1)
            dist.broadcast(flag, src=0)
        if MODE == "slow-rank" and rank == 1 and epoch == 1:
            say("evaluating on the full held-out set")
            time.sleep(40)
        if MODE == "early-stop-main" and rank == 0 and epoch == 1:
            say(f"early stop: local loss {local:.4f} did not improve")
            break
        if MODE == "early-stop-all":
            stop = torch.tensor([1.0 if epoch == 1 else 0.0])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                say(f"early stop agreed by all ranks at epoch {epoch} (best {best:.4f})")
                dist.barrier()  # leave together
                break
        best = min(best, val)
        dist.barrier()
    say(f"done: {step} steps in {time.monotonic() - T0:.1f}s")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
