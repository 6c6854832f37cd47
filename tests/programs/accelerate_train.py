"""A tiny training loop written the way HF Accelerate users write it, for `accelerate launch
--multi_gpu --num_processes N` on CPU (`Accelerator(cpu=True)`: gloo through torch elastic).
MODE (argv[1]): ok: steps then exit 0; hang: rank 1 sleeps while the others wait in
`wait_for_everyone()`; exit: rank 1 exits with CODE (argv[2]); wait: every rank sleeps (for
signal tests). argv[3] is a tag the tests use to find their processes.
"""

import os
import sys
import time

import torch
from accelerate import Accelerator


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    arg = sys.argv[2] if len(sys.argv) > 2 else "0"
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.print(f"world {accelerator.num_processes} on {accelerator.device}")
    for step in range(5):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        mean = accelerator.reduce(loss.detach(), reduction="mean")
        print(f"rank {rank} step {step} loss {mean.item():.4f}", flush=True)
        time.sleep(0.1)
    if mode == "hang":
        print(f"HANG_START {time.time():.3f}", flush=True)
        if rank == 1:
            time.sleep(3600)
        accelerator.wait_for_everyone()
    elif mode == "exit":
        if rank == 1:
            os._exit(int(arg))
        time.sleep(0.5)
        accelerator.wait_for_everyone()
    elif mode == "wait":
        print(f"WAITING rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(3600)
    accelerator.end_training()
    accelerator.print("training finished")


if __name__ == "__main__":
    main()
