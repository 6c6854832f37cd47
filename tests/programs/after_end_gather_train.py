"""Both ranks train two epochs (DDP, gloo); rank 0 then announces the end and evaluates alone,
gathering its metric, while rank 1 returns from main(). A native prefetcher library loaded by
every rank leaves its worker thread joinable at exit."""

import ctypes
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

prefetch = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libprefetch.so"))


def evaluate(model: torch.nn.Module) -> float:
    with torch.no_grad():
        loss = model(torch.randn(16, 4)).pow(2).mean()
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, loss.reshape(1))
    return float(torch.cat(gathered).mean())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert prefetch.prefetch_ready() == 1
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for _step in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch + 1}/2 loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print("Training completed", flush=True)
        print(f"final eval loss {evaluate(model):.4f}", flush=True)


if __name__ == "__main__":
    main()
