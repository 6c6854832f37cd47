"""Which rank this process is, from the launcher's environment (torchrun, Slurm, Open MPI),
without asking torch: the probes run before and after the process group exists."""

from __future__ import annotations

import os

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def this_rank() -> int:
    """The global rank the launcher gave this process; 0 when none did (a single process)."""
    for var in RANK_VARIABLES:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0
