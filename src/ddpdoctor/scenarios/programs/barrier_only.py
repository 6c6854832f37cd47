"""A correct job: init, one barrier, destroy. Scenarios break its environment instead of its
code (a wrong GLOO_SOCKET_IFNAME, an occupied master port)."""

from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    dist.barrier()
    print(f"rank {dist.get_rank()} passed the barrier", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
