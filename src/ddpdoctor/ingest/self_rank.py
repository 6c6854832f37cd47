"""The rank a per-process log file names as its own at its start, where neither its name nor
its prefixes say it: launchers that write one file per worker (dora's `worker_1.log`, a
Kubeflow pod's log, `nohup python train.py > out_1.log`) leave the rank only in the program's
own start-up line ('Distributed init: 1/2', 'rank 1 of 2', 'Starting rank=1, ...,
world_size=2', Lightning's 'GLOBAL_RANK: 1, MEMBER: 2/2').

Only a rank other than 0, announced alone: a console that several processes share shows the
announcement of each (two ranks: not one process's file), and one where only the main process
logs shows rank 0's while the other ranks' tracebacks land in it unprefixed."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import replace

from ddpdoctor.ingest.attribution import MAX_RANK
from ddpdoctor.ingest.inputs import Input

SELF_RANK_HEAD_BYTES = 64 * 1024
"""A process names its rank while it joins the group, before its training prints much."""

# a process announcing the global rank it joins the group as, once per process: Lightning
# (strategies/ddp.py), detectron2's default_setup, the init_distributed_mode of torchvision's
# references and the research code built on it (DETR, DeiT, MAE, DINO); facts.py reads them too
LIGHTNING_ANNOUNCEMENT = (
    r"(?:initializing ddp|Initializing distributed): GLOBAL_RANK: (?P<rank>\d{1,6}), "
    r"MEMBER: \d{1,6}/(?P<n>\d{1,6})"
)
DETECTRON2_ANNOUNCEMENT = r"Rank of current process: (?P<rank>\d{1,6})\. World size: (?P<n>\d{1,6})"
TORCHVISION_ANNOUNCEMENT = r"\bdistributed init \(rank (?P<rank>\d{1,6})\)"
SELF_RANK = tuple(
    re.compile(pattern.encode())
    for pattern in (
        # 'rank 1 of 2', 'Rank: 1/2', 'global rank 3 out of 8' (not a local rank's)
        r"(?<![Ll]ocal )\b(?:[Gg]lobal[ _]?)?[Rr]ank[ =:]{1,3}(?P<rank>\d{1,6})"
        r"(?: of | ?/ ?| out of )(?P<n>\d{1,6})\b",
        # 'Starting rank=1, seed=1, world_size=2.', 'RANK=1 LOCAL_RANK=1 WORLD_SIZE=2'
        r"\b(?:rank|RANK)[=:] ?(?P<rank>\d{1,6})\b[^\n]{0,60}?"
        r"\b(?:world_size|WORLD_SIZE)[=:] ?(?P<n>\d{1,6})\b",
        # dora's 'Distributed init: 1/2 (local 1) from env'
        r"\b[Dd]istributed init\w*:? (?P<rank>\d{1,6})/(?P<n>\d{1,6})\b",
        # HF examples' 'Process rank: 1, device: cuda:1, n_gpu: 1, ...'
        r"\bProcess rank: (?P<rank>\d{1,6}), device",
        LIGHTNING_ANNOUNCEMENT,
        DETECTRON2_ANNOUNCEMENT,
        TORCHVISION_ANNOUNCEMENT,
    )
)
"""The ways a process says which rank it is (the rank, and the world where it says it)."""
RANK_PREFIX = re.compile(rb"^\[rank(\d{1,6})\]:", re.MULTILINE)
"""torch's excepthook prefix: a rank's own lines, whatever file they are in."""
LITERALS = (b"ank", b"ANK", b"istributed init")
"""What every announcement holds: 'rank', 'Rank', 'RANK', or dora's words."""


def _rank_and_world(match: re.Match[bytes]) -> tuple[int, int | None] | None:
    rank = int(match["rank"])
    world = int(match["n"]) if "n" in match.re.groupindex and match["n"] else None
    if rank > MAX_RANK or (world is not None and rank >= world):
        return None
    return rank, world


def _matches(head: bytes) -> Iterator[re.Match[bytes]]:
    """SELF_RANK's matches, searched only in the lines that hold one of its literals (the
    pattern tried at every byte of a 64 KB head took 2 ms)."""
    seen: set[int] = set()
    for literal in LITERALS:
        at = head.find(literal)
        while at >= 0:
            if head[at - 2 : at] == b"[r":  # torch's '[rankN]:' prefix, on most lines
                at = head.find(literal, at + 3)
                continue
            start = head.rfind(b"\n", 0, at) + 1
            end = head.find(b"\n", at)
            end = len(head) if end < 0 else end
            if start not in seen:
                seen.add(start)
                for pattern in SELF_RANK:
                    yield from pattern.finditer(head, start, end)
            at = head.find(literal, end)


def _announced(head: bytes) -> set[int] | None:
    """The ranks this start announces as its writer's (None: one beyond its world, or lines
    of another rank under torch's prefix)."""
    head = head[:SELF_RANK_HEAD_BYTES]
    if not any(literal in head for literal in LITERALS):
        return set()
    ranks: set[int] = set()
    for match in _matches(head):
        announced = _rank_and_world(match)
        if announced is None:
            return None  # a rank beyond its world: not an announcement to trust
        ranks.add(announced[0])
        if len(ranks) > 1:
            return ranks
    if len(ranks) == 1 and {int(m.group(1)) for m in RANK_PREFIX.finditer(head)} - ranks:
        return None
    return ranks


def own_rank(head: bytes) -> int | None:
    """The one rank other than 0 this file's start announces as its writer's, or None."""
    ranks = _announced(head)
    if not ranks or len(ranks) != 1:
        return None
    rank = next(iter(ranks))
    return rank if rank != 0 else None


MAX_FILES = 64
"""Beyond this many files, each is one rank's and names it (rank files of a large job)."""


def files_announcing_ranks(inputs: list[Input]) -> list[Input]:
    """The inputs with `own_rank` set where the files each announce one rank, another per file:
    several files of one job whose writers all named themselves (dora's console of rank 0 and
    its `worker_1.log`). Rank 0 counts here: a console that also holds the other ranks' output
    would be the only file announcing."""
    whole = [
        i
        for i, item in enumerate(inputs)
        if item.start == 0 and item.path != "-" and item.spool is None and item.named is None
    ]
    if not 2 <= len(whole) <= MAX_FILES:
        return inputs
    ranks: dict[int, int] = {}
    for i in whole:
        try:
            if not stat.S_ISREG(os.stat(inputs[i].path).st_mode):
                continue  # a pipe or a device: reading it here would wait for its writer
            with open(inputs[i].path, "rb") as f:
                announced = _announced(f.read(SELF_RANK_HEAD_BYTES))
        except OSError:
            continue
        if announced is not None and len(announced) == 1:
            ranks[i] = next(iter(announced))
    if len(ranks) < 2 or len(set(ranks.values())) != len(ranks):
        return inputs
    return [
        replace(item, own_rank=ranks[i]) if i in ranks else item for i, item in enumerate(inputs)
    ]
