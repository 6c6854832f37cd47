"""colossalai.cluster: DistCoordinator."""

from __future__ import annotations

import functools

import torch.distributed as dist


class DistCoordinator:
    def __init__(self) -> None:
        assert dist.is_initialized(), (
            "Distributed is not initialized. Please call `colossalai.launch` first."
        )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def is_master(self) -> bool:
        return self.rank == 0

    def is_last_process(self) -> bool:
        return self.rank == self.world_size - 1

    def print_on_master(self, msg: str) -> None:
        if self.is_master():
            print(msg, flush=True)

    def block_all(self) -> None:
        dist.barrier()

    def on_master_only(self):
        """A decorator: the function runs on the master rank only."""

        def decorator(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if self.is_master():
                    return func(*args, **kwargs)
                return None

            return wrapper

        return decorator
