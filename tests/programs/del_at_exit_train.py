"""A DDP run (gloo, CPU) that can die in teardown: three epochs of five steps, 'rank R epoch
E/3 loss L' after each, destroy_process_group(), then a module global whose __del__ raises at
interpreter exit. Under torchrun with torch 2.13 rank 0 once aborted after its last epoch line
('terminate called without an active exception', SIGABRT; a race of the interpreter's
teardown: 1 of the 6 runs tried here, the other 5 exited 0 and read OK): the work was done, the
exit crashed. That run is tests/fixtures/real/teardown-abort-after-last-epoch, captured with
`ddpdoctor run --run-dir D -- torchrun --nproc-per-node 2 train.py`, paths rewritten to /repo
and /tmp/run."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

keep: object = None


class Cache:
    def __del__(self) -> None:  # a finalizer that fails at exit, as many libraries' do
        raise RuntimeError("cache file already removed")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for _step in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch + 1}/3 loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    global keep
    keep = Cache()


if __name__ == "__main__":
    main()
