"""The table of scenarios: which program injects which failure, how it is launched, and the
diagnosis a correct analysis must give. Data only: running lives in runner.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Launcher = Literal["torchrun", "launch", "python"]
"""torchrun: `torchrun --standalone`; launch: the deprecated `python -m torch.distributed.launch`;
python: the program started with plain python, as users do by mistake."""

PROGRAMS_DIR = Path(__file__).parent / "programs"
CAPTURED_DIR = Path(__file__).parent / "captured"
DEFAULT_SCENARIO = "data-error"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One injected failure and the verdict expected for it."""

    name: str
    title: str
    program: str
    """File name under programs/ (for entrypoint-not-found, a file that does not exist)."""
    expected_kind: str
    expected_category: str
    expected_culprits: tuple[int, ...]
    """Global ranks the verdict must blame; () when no rank is to blame (launcher errors)."""
    cascade_ranks: tuple[int, ...] = ()
    """Ranks whose errors are consequences of the root: none of their findings may be the root,
    and at least one of them must be reported with role `cascade`."""
    nproc: int = 2
    launcher: Launcher = "torchrun"
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    tee: bool = False
    """Run torchrun with `--tee 3 --log-dir`: console lines get `[default0]:` prefixes and each
    rank's stdout/stderr is also kept as a file."""
    occupy_master_port: bool = False
    """Bind the master port before launching, so the rendezvous store cannot listen on it."""
    timeout_s: float = 60.0
    """Outer wall-clock limit; the scenario is killed (process group) past it."""
    notes: str = ""

    @property
    def program_path(self) -> Path:
        return PROGRAMS_DIR / self.program

    @property
    def captured_dir(self) -> Path:
        return CAPTURED_DIR / self.name


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="data-error",
        title="rank 1 cannot open its data shard; rank 0 times out in all_reduce",
        program="data_error.py",
        expected_kind="data-error",
        expected_category="user-code",
        expected_culprits=(1,),
        cascade_ranks=(0,),
        notes="torchrun names rank 0 as the root cause: it failed first, by timing out.",
    ),
)

BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}


def get(name: str) -> Scenario:
    """The scenario called `name`; KeyError lists the known names."""
    try:
        return BY_NAME[name]
    except KeyError:
        known = ", ".join(sorted(BY_NAME))
        raise KeyError(f"unknown scenario {name!r}; known: {known}") from None
