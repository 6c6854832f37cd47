"""The training frameworks a job can be written with, as the knowledge base knows them: how a
log shows which one ran (its own traceback frames), and which one's advice wins when one is
built on another. Rules carry fix lines per framework (Rule.framework_fix); the engine picks
those of the frameworks found in the job. No matching of findings here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Framework:
    name: str
    """The key rules use in framework_fix (also the package name)."""
    label: str
    """How its users call it, in fix lines."""
    frames: str
    """A regex over the path of a traceback frame that only this framework's code has."""
    hides: tuple[str, ...] = ()
    """Frameworks it drives itself (the transformers Trainer builds its own Accelerator): their
    advice does not apply to its users."""

    @cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.frames)


FRAMEWORKS: tuple[Framework, ...] = (
    # the Trainer, not any transformers code: a model's modeling_*.py frames appear under
    # Accelerate or Lightning too
    Framework(
        "transformers",
        "transformers Trainer",
        r"/transformers/trainer(?:_\w+)?\.py",
        hides=("accelerate",),
    ),
    Framework("lightning", "Lightning", r"/(?:lightning/(?:pytorch|fabric)|pytorch_lightning)/"),
    Framework("accelerate", "Accelerate", r"/accelerate/(?:\w+/)*\w+\.py"),
)
BY_NAME: dict[str, Framework] = {f.name: f for f in FRAMEWORKS}

FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+')


def frameworks_in(lines: list[str]) -> list[str]:
    """The frameworks whose code appears in these traceback lines, less those another one
    found here drives itself; in the order of FRAMEWORKS."""
    found: set[str] = set()
    for line in lines:
        m = FRAME.search(line)
        if m is None:
            continue
        for fw in FRAMEWORKS:
            if fw.name not in found and fw.compiled.search(m["path"]):
                found.add(fw.name)
    hidden = {h for name in found for h in BY_NAME[name].hides}
    return [fw.name for fw in FRAMEWORKS if fw.name in found and fw.name not in hidden]


COLLECTIVE_IN_BRANCH_FIX: tuple[tuple[str, str], ...] = (
    (
        "accelerate",
        "Accelerate: call accelerator.gather_for_metrics(), reduce() and wait_for_everyone() "
        "on every process, outside `if accelerator.is_main_process:`; keep only printing and "
        "saving inside it.",
    ),
    (
        "lightning",
        "Lightning: call self.log(..., sync_dist=True) on every rank (or log from rank 0 alone "
        "with rank_zero_only=True and no sync_dist); keep self.all_gather() and "
        "trainer.strategy.barrier() out of `if self.trainer.is_global_zero:`.",
    ),
    (
        "transformers",
        "transformers Trainer: call trainer.evaluate() / trainer.predict() on every process "
        "(they gather across processes); print or save their result under "
        "`if trainer.is_world_process_zero():`.",
    ),
)
"""A collective in a rank-dependent branch, in each framework's terms (the textual mismatch
rule and the inferred one share it)."""
