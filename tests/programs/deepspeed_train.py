"""A tiny DeepSpeed training loop, for the `deepspeed` launcher on CPU (DeepSpeed's cpu
accelerator, gloo): `deepspeed --num_gpus N deepspeed_train.py MODE`. Written the way DeepSpeed
users write it: `deepspeed.initialize`, `engine.backward`, `engine.step`, the launcher's
`--local_rank` argument. MODE (argv[1]): ok: steps then exit 0; hang: rank 1 sleeps while the
others wait in a barrier; exit: rank 1 exits with CODE (argv[2]); wait: every rank sleeps (for
signal tests). argv[3] is a tag the tests use to find their processes.
"""

import argparse
import os
import time

import deepspeed
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="ok")
    parser.add_argument("arg", nargs="?", default="0")
    parser.add_argument("tag", nargs="?", default="")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 1,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    for step in range(5):
        x = torch.randn(8, 4)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.1)
    if args.mode == "hang":
        print(f"HANG_START {time.time():.3f}", flush=True)
        if rank == 1:
            time.sleep(3600)
        dist.barrier()
    elif args.mode == "exit":
        if rank == 1:
            os._exit(int(args.arg))
        time.sleep(0.5)
        dist.barrier()
    elif args.mode == "wait":
        print(f"WAITING rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(3600)
    dist.barrier()
    if rank == 0:
        print("training finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
