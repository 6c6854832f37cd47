"""Loading a checkpoint on every rank without the classic failures of a resume: tensors saved
from cuda:0 land on cuda:0 in every rank (`torch.load` without `map_location`), so GPU 0 runs
out of memory; a checkpoint missing on one node fails as an anonymous FileNotFoundError; a
weights-only refusal (torch >= 2.6) does not say what to do. torch imported lazily."""

from __future__ import annotations

import os
import socket
from typing import Any

from ddpdoctor.probe.ranks import this_rank


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded on this rank; the message names the rank, the host, the
    path and what to do."""


def rank_device() -> str:
    """Where this rank's tensors belong: `cuda:LOCAL_RANK` when CUDA is usable (the device
    torchrun and Slurm give the rank), else `cpu`. LOCAL_RANK is taken modulo the visible
    devices: a rank that sees one GPU (CUDA_VISIBLE_DEVICES per rank) uses cuda:0."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    local = os.environ.get("LOCAL_RANK", "")
    index = int(local) if local.isdigit() else torch.cuda.current_device()
    return f"cuda:{index % max(1, torch.cuda.device_count())}"


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    map_location: Any = None,
    weights_only: bool = True,
    **load_kwargs: Any,
) -> Any:
    """`torch.load` onto this rank's own device (unless `map_location` says otherwise), weights
    only by default. Failures are raised as CheckpointError naming rank, host and path."""
    import torch

    where = f"rank {this_rank()} on {socket.gethostname()}"
    target = map_location if map_location is not None else rank_device()
    try:
        return torch.load(path, map_location=target, weights_only=weights_only, **load_kwargs)
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{where} cannot find checkpoint {os.fspath(path)!r}: it must exist on every node "
            "(a shared filesystem, or copy it to each node before resuming)"
        ) from exc
    except Exception as exc:
        if weights_only and "weights_only" in str(exc).lower().replace(" ", "_"):
            raise CheckpointError(
                f"{where}: checkpoint {os.fspath(path)!r} holds objects a weights-only load "
                "refuses (torch >= 2.6). If you trust the file, pass weights_only=False; or "
                "allow the named classes with torch.serialization.add_safe_globals([...])"
            ) from exc
        raise
