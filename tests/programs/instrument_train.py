"""Raw DDP training with ddpdoctor.instrument, for the real tests. Modes (argv[1]):
stop: rank 1's local metric says stop at step 3; agree_to_stop makes both ranks stop there.
unused: rank 1 never uses the auxiliary head; report_unused_parameters names it, and DDP's
gradient buckets then differ between the ranks (gloo: a collective mismatch).
unused-ok: the same with find_unused_parameters=True: DDP reduces the skipped head too (its
gradient becomes the average of the ranks that used it), so the job works and nothing is named.
resume: rank 0 saves a checkpoint, every rank loads it back with load_checkpoint.
resume-missing: rank 1 resumes from a checkpoint that only rank 0's node has."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor import instrument


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.aux_head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        h = self.body(x)
        return h.sum() + (self.aux_head(h).sum() if use_aux else 0)


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    model = DistributedDataParallel(Net(), find_unused_parameters=mode == "unused-ok")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if mode.startswith("resume"):
        path = os.path.abspath("ckpt-rank0-node.pt" if rank == 0 or mode == "resume" else "x.pt")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "step": 5}, path)
        dist.barrier()
        state = instrument.load_checkpoint(path)
        model.module.load_state_dict(state["model"])
        device = state["model"]["body.weight"].device
        print(f"rank {rank} resumed at step {state['step']} on {device}", flush=True)
    for step in range(8):
        loss = model(torch.randn(4, 8), use_aux=(not mode.startswith("unused") or rank == 0))
        loss.backward()
        instrument.report_unused_parameters(model, step=step)
        optimizer.step()
        optimizer.zero_grad()
        instrument.heartbeat(step)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        wants_stop = mode == "stop" and rank == 1 and step == 3  # its local metric stalled
        if instrument.agree_to_stop(wants_stop, step=step):
            print(f"rank {rank} stops at step {step}", flush=True)
            break
    print(f"rank {rank}: training complete", flush=True)
    instrument.finish()


if __name__ == "__main__":
    main()
