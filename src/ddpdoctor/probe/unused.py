"""Naming the parameters that got no gradient in a backward pass: what DDP's "Expected to have
finished reduction in the prior iteration" is about, named before DDP fails (torch itself names
them only under TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL). Duck-typed: imports nothing of torch."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ddpdoctor.probe.ranks import this_rank

LINE_PREFIX = "ddpdoctor: parameters without gradient"
"""The start of the line `report_unused_parameters` prints; DDP107 reads the names from it."""

_reported: set[tuple[int, tuple[str, ...]]] = set()


def unused_parameters(module: Any) -> list[str]:
    """Names of trainable parameters whose `.grad` is None: call it after `loss.backward()` and
    before `optimizer.zero_grad()`. A DDP wrapper's `module.` prefix is left out, so the
    names are the ones of the user's model."""
    inner = getattr(module, "module", None)
    target = inner if inner is not None and hasattr(inner, "named_parameters") else module
    return [
        name
        for name, param in target.named_parameters()
        if getattr(param, "requires_grad", False) and getattr(param, "grad", None) is None
    ]


def report_unused_parameters(
    module: Any, *, step: int | None = None, file: TextIO | None = None
) -> list[str]:
    """Print, once per distinct set, the parameters of this rank that got no gradient, as
    `ddpdoctor: parameters without gradient on rank R (step S): a.weight, b.bias`. Returns them.

    Never raises into the training loop: a module it cannot read gives an empty list.
    """
    try:
        names = unused_parameters(module)
    except Exception:
        return []
    rank = this_rank()
    key = (rank, tuple(names))
    if names and key not in _reported:
        _reported.add(key)
        where = f" (step {step})" if step is not None else ""
        print(
            f"{LINE_PREFIX} on rank {rank}{where}: {', '.join(names)}",
            file=file or sys.stderr,
            flush=True,
        )
    return names
