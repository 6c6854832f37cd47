"""colossalai.initialize: launch / launch_from_torch (the CPU accelerator's backend is gloo)."""
# ruff: noqa: B028, B904 (as upstream: the warning and the re-raise show their source lines)

from __future__ import annotations

import os
import random
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from .logging import get_dist_logger


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def launch(
    rank: int,
    world_size: int,
    host: str,
    port: int,
    backend: str = "gloo",
    local_rank: int | None = None,
    seed: int = 1024,
    verbose: bool = True,
    timeout: timedelta | None = None,
) -> None:
    init_method = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(
        rank=rank, world_size=world_size, backend=backend, init_method=init_method, **kwargs
    )
    set_seed(seed)
    if verbose:
        logger = get_dist_logger()
        logger.info(
            f"Distributed environment is initialized, world size: {dist.get_world_size()}",
            ranks=[0],
        )


def launch_from_torch(
    config: dict | None = None,
    backend: str = "gloo",
    seed: int = 1024,
    verbose: bool = True,
    timeout: timedelta | None = None,
) -> None:
    if config is not None:
        warnings.warn("`config` is deprecated and will be removed soon.")
    try:
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        host = os.environ["MASTER_ADDR"]
        port = int(os.environ["MASTER_PORT"])
    except KeyError as e:
        raise RuntimeError(
            f"Could not find {e} in the torch environment, visit https://www.colossalai.org/ for more information on launching with torch"
        )
    launch(
        local_rank=local_rank,
        rank=rank,
        world_size=world_size,
        host=host,
        port=port,
        backend=backend,
        seed=seed,
        verbose=verbose,
        timeout=timeout,
    )
