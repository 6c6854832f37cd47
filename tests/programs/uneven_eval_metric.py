"""A DDP job whose rank 1 has 6 batches against the others' 8, then all-reduces a one-number
metric: gloo aborts rank 1 when rank 0's gradient bucket reaches its metric's all_reduce.
Captured under `ddpdoctor run -- torchrun --nproc_per_node 3` (torch 2.13 CPU, gloo) as
tests/fixtures/real/run-uneven-partial-dumps: the console, the ranks' files, events.jsonl and
the JSON Flight Recorder dumps of ranks 0 and 2 (rank 1 died before writing one); paths
rewritten to /repo and /tmp, the reports and the pickled dumps left out. That capture ran this
code from /tmp/uneven.py in an earlier layout (several statements a line, so its tracebacks'
line numbers are not this file's). Its outcome depends on timing: there ranks 0 and 2 printed
their tracebacks (in backward) before torchrun's SIGTERM; in a second run the SIGTERM came
first, no rank showed where it waited, and the abort read as a collective mismatch."""

import datetime

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = 6 if rank == 1 else 8  # rank 1's shard is shorter
for step in range(batches):
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"epoch 0 step {step + 1}/{batches} loss {loss.item():.4f}", flush=True)
acc = torch.tensor([0.5])
dist.all_reduce(acc)
print(f"rank {rank} val acc {acc.item() / 3:.3f}", flush=True)
dist.destroy_process_group()
