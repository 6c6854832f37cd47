"""Which rank each hit belongs to, decided once for the whole job: the writer's own rank, else
what the job said about its (host, local rank) or (host, pid), else what the line itself names
(a local rank on a single node, the rank it is about, a worker's pid). After this step records
are not changed again."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from ddpdoctor.ingest.tracebacks import RAY_TASK_HEAD, TRACEBACK_HEAD
from ddpdoctor.model.findings import Hit
from ddpdoctor.model.records import Origin

Resolver = Callable[[Origin], "int | None"]

MAX_RANK = 1_000_000
"""A rank number above this is not a rank (a mangled or hostile line)."""


def _number(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > 7:
        return None
    value = int(text)
    return value if value <= MAX_RANK else None


# torchelastic's failure summary (ChildFailedError): each entry names its rank, then quotes
# that rank's traceback from its error file (@record): "  rank      : 2 (local_rank: 2)"
SUMMARY_ENTRY_RANK = re.compile(r"^\s*rank\s*: (?P<rank>\d{1,7}) \(local_rank: \d{1,7}\)")
# loguru's logger.catch heads the traceback it prints with the process that raised it:
# "An error has been caught in function 'main', process 'SpawnProcess-2' (19478), thread ..."
# multiprocessing names a child "<Kind>Process-<n>" with n counting the parent's children
# from 1, and torch.multiprocessing.start_processes (mp.spawn) starts local rank i as the
# (i+1)-th: the header names the pid and, under mp.spawn, the local rank
LOGURU_CAUGHT = re.compile(
    r"An error has been caught in function '[^']{1,200}', process "
    r"'(?:(?:Spawn|Fork|Forkserver)Process-(?P<n>\d{1,7})|[^']{1,200})' \((?P<pid>\d{1,9})\)"
)


STORE_HOST_RANK = 0
"""init_process_group's env:// and tcp:// rendezvous start the TCPStore server in the process
of rank 0 (is_master = rank == 0)."""
AGENT_FRAME = re.compile(r"torch[/\\]distributed[/\\](?:run\.py|elastic[/\\]agent[/\\])")
"""A frame of torchrun's agent, which hosts the store itself for its workers."""


def _in_a_worker(hit: Hit) -> bool:
    """The hit's traceback shows it was raised in a training process: frames, none of them
    torchrun's agent's (a bare line says nothing of its process)."""
    frames = [r.text for r in hit.context if 'File "' in r.text]
    return bool(frames) and not any(AGENT_FRAME.search(f) for f in frames)


RANKED_HEAD = re.compile(
    r"(?i)\b(?:exception|error|fail\w*|raise[sd]?|crash\w*)\b[^\n]{0,160}?"
    r"\brank(?:[ _]?id)?\s?[:=#]?\s?(?P<rank>\d{1,7})\s*[:.]?\s*$"
)
"""The error line a program logs above a traceback it caught, naming the rank it ran on
(InternEvo's 'Raise exception from <host> with rank id: 1', 'Exception on rank 3:'): the
traceback under it is that rank's, whatever wrote the console."""


CHILD_RANK = re.compile(r"\[rank: (?P<rank>\d{1,7})\] Child process with PID \d")
"""Lightning's child-process observer names the child it reports by rank in its prefix."""


def rank_of(hit: Hit, resolve: Resolver, single_node: bool, sole_host: str | None) -> int | None:
    """The global rank a hit is about, or None when nothing says it."""
    child = _number(hit.captures.get("child_pid"))
    if child is not None:
        # a launcher living in a rank's process reports another process it started by its
        # pid (Lightning's observer: 'Child process with PID 13117 terminated with code -9'):
        # the line is about that process, not its writer; unknown where no line maps the pid
        host = hit.record.origin.host or (sole_host if single_node else None)
        found = resolve(Origin(host=host, pid=child))
        if found is None and (named := CHILD_RANK.match(hit.record.text)):
            # Lightning prefixes the observer's message with the child's own rank
            # (rank_prefixed_message(..., rank=i + 1) for its i-th child)
            found = _number(named.group("rank"))
        return found
    replica = hit.captures.get("replica")
    if replica:
        # a platform naming the replica (a machine of one rank) whose process ended: Vertex
        # AI's 'The replica workerpool1-0 exited with a non-zero status of 137'
        found = resolve(Origin(host=replica))
        if found is not None:
            return found
    rank = resolve(hit.record.origin)
    if rank is not None:
        return rank
    for record in reversed(hit.context):  # a traceback the launcher's summary quotes
        m = SUMMARY_ENTRY_RANK.match(record.text)
        if m:
            return _number(m.group("rank"))
        ray = RAY_TASK_HEAD.match(record.text)
        if ray:  # a worker's traceback the Ray driver re-raises (its head names the process)
            found = resolve(Origin(host=ray.group("ip"), pid=_number(ray.group("pid"))))
            if found is not None:
                return found
        ranked = RANKED_HEAD.search(record.text)
        if ranked:
            return _number(ranked.group("rank"))
        if record.text.startswith(TRACEBACK_HEAD):
            # a logging record's first line carries the writer's prefix, its other lines
            # (the traceback it logged) none (ParlAI's 'rank:  1 | 12:00:01 CRIT | Traceback')
            found = resolve(record.origin)
            if found is not None:
                return found
        caught = LOGURU_CAUGHT.search(record.text)
        if caught:
            found = _caught_rank(caught, hit, resolve, single_node, sole_host)
            if found is not None:
                return found
    captures = hit.captures
    local = _number(captures.get("local_rank"))
    if local is not None and single_node:
        return local
    if local is not None and hit.record.origin.host:
        # a node's launcher naming its worker by local rank: what the job said of that node's
        # local ranks (DeepSpeed's global_rank_mapping, NCCL's comm lines)
        found = resolve(Origin(host=hit.record.origin.host, local_rank=local))
        if found is not None:
            return found
    subject = _number(captures.get("rank"))
    if subject is not None:
        return subject
    if hit.store_host and _in_a_worker(hit):
        return STORE_HOST_RANK  # the store's server: the master rank's, not the agent's
    pid = _number(captures.get("pid"))
    if pid is not None:
        # "Sending process 23939 closing signal", "Killed process 23939": a worker named by
        # its pid, on the line's host (the only one, on a single node)
        host = hit.record.origin.host or (sole_host if single_node else None)
        return resolve(Origin(host=host, pid=pid))
    return None


def _caught_rank(
    caught: re.Match[str], hit: Hit, resolve: Resolver, single_node: bool, sole_host: str | None
) -> int | None:
    """The rank of the process a loguru header names: by its pid where the job maps pids,
    else by its place among mp.spawn's children (the local rank)."""
    host = hit.record.origin.host or (sole_host if single_node else None)
    found = resolve(Origin(host=host, pid=_number(caught.group("pid"))))
    if found is not None:
        return found
    n = _number(caught.group("n"))
    if n is None or n < 1:
        return None
    if single_node:
        return n - 1
    return resolve(Origin(host=host, local_rank=n - 1)) if host else None


def attribute(
    hits: list[Hit],
    resolve: Resolver,
    single_node: bool,
    hosts: list[str],
    ended: WorkersEnd | None = None,
) -> list[Hit]:
    """New hits whose records carry their global rank (never mutates the given ones)."""
    sole_host = hosts[0] if len(hosts) == 1 else None
    ranks = [rank_of(hit, resolve, single_node, sole_host) for hit in hits]
    lone = _lone_unprefixed_rank(hits, ranks, ended) if single_node and ended else None
    # (one rank of the whole job ended by SIGABRT: the terminate lines no prefix names are its,
    # on one node or several)
    aborted = ended.aborted if ended and len(ended.aborted) == 1 else frozenset()
    out: list[Hit] = []
    for hit, rank in zip(hits, ranks, strict=True):
        if rank is None and lone is not None and ended and _uncaught_in_a_worker(hit, ended):
            rank = lone
        if rank is None and aborted and CXX_TERMINATE.match(hit.record.text):
            # C++'s 'terminate called after throwing ...' and its 'what():' line, printed by
            # no prefix: std::terminate aborts, and one rank of this node ended by SIGABRT
            rank = next(iter(aborted))
        if rank == hit.record.origin.rank:
            out.append(hit)
            continue
        origin = replace(hit.record.origin, rank=rank)
        out.append(replace(hit, record=replace(hit.record, origin=origin)))
    return out


@dataclass(frozen=True)
class WorkersEnd:
    """What the job says of how its workers ended, for the one unprefixed traceback."""

    world: int | None
    killed: frozenset[int]
    """Ranks a signal ended that leaves no Python traceback (SIGKILL, SIGSEGV, SIGABRT: a
    launcher's SIGTERM lets the interpreter print one first)."""
    reported_at: dict[str, int]
    """Per source, the first line where a launcher reported a failed worker."""
    aborted: frozenset[int] = frozenset()
    """Ranks SIGABRT ended (exit code -6): what std::terminate does to a process."""


CXX_TERMINATE = re.compile(
    r"\s{0,4}(?:terminate called (?:after throwing|without an active)|what\(\): )"
)
"""What std::terminate prints before it aborts the process (SIGABRT, exit code -6)."""

MAX_WORLD_FOR_LONE_RANK = 64
"""The world's ranks are counted one by one to find the one without its own traceback."""


def _uncaught_in_a_worker(hit: Hit, ended: WorkersEnd) -> bool:
    """An exception a training process printed with its traceback: not one printed after a
    launcher reported its workers' end (a wrapper that ran torchrun, failing in turn)."""
    if hit.record.line > ended.reported_at.get(hit.record.source, 1 << 62):
        return False
    return any(r.text.startswith(TRACEBACK_HEAD) for r in hit.context) and _in_a_worker(hit)


OUTERMOST_FRAME = re.compile(
    r'^\s*File "[^"]*", line \d+, in (?:<module>|_run_module_as_main|_bootstrap|_wrap)$'
)
"""The first frame of a stack an excepthook prints: the script's top level, `python -m`'s
runner, a multiprocessing child's bootstrap, mp.spawn's wrapper."""


def _whole_stack(hit: Hit) -> bool:
    """The traceback starts at the process's outermost frame, as an uncaught exception's does
    (not at the function whose `except` logged it, as logger.exception's does)."""
    texts = [r.text for r in hit.context]
    heads = [i for i, t in enumerate(texts) if t.startswith(TRACEBACK_HEAD)]
    if not heads:
        return False
    first = next((t for t in texts[heads[-1] + 1 :] if 'File "' in t), "")
    return OUTERMOST_FRAME.match(first) is not None


def _lone_unprefixed_rank(
    hits: list[Hit], ranks: list[int | None], ended: WorkersEnd
) -> int | None:
    """The rank of the one worker traceback no prefix names, where every other rank of the
    world printed its own under torch's '[rankN]: ' (the excepthook init_process_group
    installs): the rank without its own is the one whose hook the program had replaced
    (SpeechBrain, loguru or rich on the main process) or that failed before the group was
    formed. Not where the unprefixed tracebacks differ (two writers); nor where two ranks or
    more printed none (a rank a signal ended without a traceback printed none); nor where the
    unprefixed one is only in another file than the prefixed ones (a rank's own log file
    repeats its traceback without the hook's prefix)."""
    world = ended.world
    if not world or world < 2 or world > MAX_WORLD_FOR_LONE_RANK:
        return None
    own: set[int] = set()
    unprefixed: set[str] = set()
    own_sources: set[str] = set()
    unprefixed_sources: set[str] = set()
    for hit, rank in zip(hits, ranks, strict=True):
        if not _uncaught_in_a_worker(hit, ended):
            continue
        if rank is None:
            if not _whole_stack(hit):
                return None  # logged where it was caught: its raiser may print it again
            unprefixed.add(hit.record.text)
            unprefixed_sources.add(hit.record.source)
        elif hit.record.origin.rank == rank and rank < world:
            own.add(rank)
            own_sources.add(hit.record.source)
    missing = set(range(world)) - own - ended.killed
    if len(unprefixed) != 1 or len(missing) != 1 or not own:
        return None
    if not unprefixed_sources & own_sources:
        return None  # only in another file (a rank's own log repeating its traceback): whose?
    return missing.pop()
