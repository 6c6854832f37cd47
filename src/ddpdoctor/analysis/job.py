"""The job as a whole: world size, which ranks and hosts left lines, per-rank exits from the
launcher's summary, and each writer's last words. Built from all scans after scanning."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from ddpdoctor.analysis.facts import (
    mesh_size,
    parse_hydra_exit,
    parse_mpi_exit,
    parse_summary_entry,
    signal_code,
    signal_name,
    signal_number_code,
)
from ddpdoctor.analysis.scanner import FactHit, SourceScan, StreamSummary
from ddpdoctor.ingest.attribution import WorkersEnd
from ddpdoctor.ingest.bounds import count_number, exit_code_number, pid_number, rank_number
from ddpdoctor.ingest.filenames import attempt_of, origin_from_path
from ddpdoctor.ingest.run_events import RunEvents, RunHang
from ddpdoctor.model.evidence import CutTrace, Restart
from ddpdoctor.model.findings import Evidence, JobInfo, RankExit
from ddpdoctor.model.records import Origin, Record

MAX_WORLD_SIZE = 1_000_000
"""A world size hint above this is not believed (and ranks missing are listed up to 100,000)."""


@dataclass(slots=True)
class JobView:
    """JobInfo for the report plus what causality needs and the report does not show."""

    info: JobInfo
    streams: list[StreamSummary] = field(default_factory=list)
    progress: list[FactHit] = field(default_factory=list)
    single_node: bool = True
    transports: set[str] = field(default_factory=set)
    ib_requested: bool = False
    """NCCL said the job named InfiniBand/RoCE devices to use (NCCL_IB_HCA)."""
    pg_wait_ranks: set[int] = field(default_factory=set)
    """Ranks whose address a process waited for, in vain, while the default group formed."""
    local_ifaces: list[Record] = field(default_factory=list)
    """NCCL's lines naming a loopback, virtual or link-local interface among those it uses."""
    hangs: list[RunHang] = field(default_factory=list)
    killed_for_hang: bool = False
    stopped: bool = False
    """`ddpdoctor run` killed the job or forwarded a stop signal to it."""
    completed_at: dict[str, int] = field(default_factory=dict)
    """First line per source where training announced its end."""
    completed_ranks: set[int] = field(default_factory=set)
    """Ranks whose own lines announced the end of training."""
    completions: list[tuple[int | None, Record]] = field(default_factory=list)
    """Every announcement of the end of training, with its rank when known."""
    stopped_unseen: list[int] = field(default_factory=list)
    """A missing rank the launcher most likely stopped alive (_stopped_unseen)."""
    launched_processes: int | None = None
    """How many processes a launcher said it starts (Accelerate's notebook_launcher 'Launching
    training on 3 CUDAs.'): the size of the launch, for what every process did alike."""
    function_workers: bool = False
    """The agent ran a Python function, not a program (its failure line says 'of fn:', as
    under accelerate's notebook_launcher or elastic_launch): its failure summary then lists
    only the first failure, not every worker that did not exit 0."""
    stopped_pids: frozenset[int] = frozenset()
    """The workers launchers said they stopped after a failure (their SIGTERM lines, by pid):
    alive then, whether a failure summary lists them or not."""
    loop_ends: list[tuple[int | None, Record]] = field(default_factory=list)
    """Ends of the training loop that a framework prints after an exception too (in a
    `finally:`): completions only where their writer had not failed before them."""
    data_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per unit ('batches', 'samples'), how many each rank said it has, once."""
    max_epochs: set[int] = field(default_factory=set)
    """The numbers of epochs the run was configured to train, as its start-up printed them."""
    train_steps: set[int] = field(default_factory=set)
    """The numbers of optimisation steps the run announced (Trainer's 'Total optimization
    steps', max_steps): a bar counting to one is the training loop's."""
    resume_points: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per unit ('step', 'epoch'), where each rank said it started or resumed training."""
    skipped_ranks: set[int] = field(default_factory=set)
    """Ranks that said they skip a step or a batch."""
    filtered_ranks: set[int] = field(default_factory=set)
    """Ranks that said they dropped part of their data."""
    filtered_unranked: bool = False
    """A line no rank could be given said that part of the data was dropped."""
    skipped_unranked: bool = False
    """A line no rank could be given said a step or a batch was skipped."""
    prompts: list[tuple[int | None, Record]] = field(default_factory=list)
    """Questions asked on the terminal, with the asking rank when known."""
    extension_waits: list[tuple[int | None, Record]] = field(default_factory=list)
    """torch's 'Using ... as PyTorch extensions root...' with no build or load of an extension
    after it in its output: a process waiting on the extensions' build lock."""
    announcements: dict[int, list[Record]] = field(default_factory=dict)
    """Each global rank's announcements of joining the group (facts rank_announced)."""
    gpu_processes: dict[int, set[int]] = field(default_factory=dict)
    """nvidia-smi's process table: the GPUs each pid holds memory on."""
    gpu_process_rows: dict[tuple[int, int], Record] = field(default_factory=dict)
    """The table's row of each (pid, GPU), for the evidence."""
    rank_map: dict[tuple[str, int], int] = field(default_factory=dict)
    exit_sources: dict[int, str] = field(default_factory=dict)
    """Where a launcher's summary reported each rank's exit: its node's console."""
    normal_seen: bool = False
    """A message of normal operation was read (facts.py "normal"): something healthy to read."""
    world_stated: bool = False
    """A line stated the world's size ('world_size=2', a launcher's count of processes), not
    only the highest rank seen."""
    spawn_reported: set[int] = field(default_factory=set)
    """The processes torch.multiprocessing.spawn reported ('-- Process N terminated with the
    following error:'): it reports the first process that ended with an error."""
    launcher_summaries: int = 0
    """torchrun failure summaries read (ChildFailedError's 'Root Cause' block): each lists
    every worker of its node that did not exit 0."""
    interpreter_exit_seen: bool = False
    """torch's atexit handlers logged at interpreter exit (facts.py "interpreter_exit"): a
    process shut down normally, neither killed nor hung."""
    leaked_at_shutdown: Record | None = None
    """The first of multiprocessing's resource tracker's 'There appear to be N leaked ...
    objects to clean up at shutdown' (facts.py "leaked_at_shutdown"): processes ended without
    releasing what they held, killed or stopped from outside."""
    cut_tracebacks: list[CutTrace] = field(default_factory=list)
    """Writers whose output ends inside a traceback (its exception line is not there): the
    last frame seen, else the header, with the writer's rank when known."""
    recovered_at: datetime | None = None
    """The launcher restarted failed workers (torchrun --max-restarts) and a later attempt
    announced the end of training, with no failure summary after: what failed before this
    time belongs to an attempt the job recovered from."""
    last_restart: Restart | None = None
    """The end of the last attempt torchelastic's agent restarted (its failed-worker line):
    what the workers printed before it belongs to an earlier attempt, not to how the job
    ended."""
    earlier_attempt_sources: frozenset[str] = frozenset()
    """Workers' files of torchrun --log-dir attempt folders older than the newest one."""
    reported_at: dict[str, int] = field(default_factory=dict)
    """Per source, the first line where a launcher reported a failed worker (its
    'failed (exitcode: N)', spawn's 'process N terminated with ...'): its workers had ended."""

    def resolve(self, origin: Origin) -> int | None:
        return resolve_rank(origin, self.single_node, self.rank_map)


ATTEMPT_GAP = timedelta(seconds=1)
"""An agent reports every failed worker of one attempt in the same pass of its monitor loop
(milliseconds apart); a restarted worker group needs seconds to start and fail again."""


BARE_END = re.compile(
    r"(?i)(?:(?:debug|info|warning|error|critical)\b:?\s{1,3})?"
    r"(?:[\[(][^\[\]()\n]{1,40}[\])]:?\s{1,3}){0,2}(?:all )?(?:done|finished|complete|completed)"
    r"[.!]{0,3}\s*$"
)
"""A writer's whole message saying it is done ("Done!", "[rank 1/3] finished.", "All done"),
after its own tags at most (a logging level, the caller's place, a rank: icefall's "INFO
[train.py:914] (1/2) Done!"), with no object: a step's or a phase's end names what ended
("epoch 3 done", "loading done")."""


PHASE_OPENED = re.compile(r"^\W{0,10}[A-Z]?[a-z]{2,20}ing\b|\.\.\.\s*$")
"""A line that opens a phase the next line may close: 'Saving checkpoint to ...',
'Processing...'."""


def _bare_ends(
    scans: list[SourceScan], single_node: bool, rank_map: dict[tuple[str, int], int]
) -> tuple[list[tuple[int | None, Record]], list[Record]]:
    """Writers whose last words are a bare 'done'. Ranks: their own word that they are done
    (an end of training when every rank of the world says it, as with 'rank N finished').
    Writers of no rank (the main process's logger, where only it logs: DiT's "Done!"), where
    the word follows their own training progress: the end of the training loop. (Not after
    a download's or a build's lines alone: torchvision's MNIST prints "Done!" after
    "Processing...", before any step; nor where the line before it opened a phase that the
    word closes: "Saving checkpoint to ..." then "Complete.")"""
    ranked: list[tuple[int | None, Record]] = []
    after_training: list[Record] = []
    for scan in scans:
        for stream in scan.streams.values():
            if not stream.last_line or not BARE_END.match(stream.last_text):
                continue
            record = Record(scan.info.path, stream.last_line, stream.last_text, stream.origin)
            rank = resolve_rank(stream.origin, single_node, rank_map)
            if rank is not None:
                ranked.append((rank, record))
            elif 0 < stream.last_progress_line < stream.last_line and not PHASE_OPENED.search(
                stream.prev_text
            ):
                after_training.append(record)
    return ranked, after_training


def _every_rank_finished(
    finished: list[tuple[int | None, Record]], ranks: set[int], world_hints: list[int]
) -> list[tuple[int, Record]]:
    """Ranks' own 'rank N finished' lines, when every rank of the world said it: one rank
    saying so may have left the others alone (an early stop of its own), all of them cannot."""
    said = {r for r, _ in finished if r is not None}
    world = max([*world_hints, *(r + 1 for r in ranks | said)], default=0)
    if world < 2 or said != set(range(world)):
        return []
    return [(r, record) for r, record in finished if r is not None]


def resolve_rank(
    origin: Origin, single_node: bool, rank_map: dict[tuple[str, int], int] | None = None
) -> int | None:
    """Global rank of a writer: its own, else what the job said about (host, local rank) or
    (host, pid), else on a single node the local rank."""
    if origin.rank is not None:
        return origin.rank
    if rank_map and origin.host:
        for key in (origin.local_rank, -origin.pid if origin.pid else None):
            if key is not None and (origin.host, key) in rank_map:
                return rank_map[(origin.host, key)]
    if rank_map and origin.pid and ("", -origin.pid) in rank_map:
        return rank_map[("", -origin.pid)]  # a worker the job named by its pid alone (Ray)
    if rank_map and origin.host and origin.local_rank is None:
        sole = rank_map.get((origin.host, SOLE_RANK))
        if sole is not None:
            return sole  # the one rank its host runs
    if single_node and origin.local_rank is not None:
        return origin.local_rank
    return None


HOST_RANKS = re.compile(r"'([^'\n]{1,255})': \[([\d, ]{0,10000})\]")
"""One node's entry of DeepSpeed's global_rank_mapping: its name, its ranks."""
SOLE_RANK = -(1 << 62)
"""rank_map's key of a host that runs one rank only: every line of that host is that rank's."""


def learn_rank_map(scans: list[SourceScan]) -> dict[tuple[str, int], int]:
    """(host, local rank) and (host, -pid) to global rank, from NCCL's comm lines and
    torchrun's failure summary, so that multi-node lines without a global rank get one, and a
    launcher line that names a worker by pid ("Sending process 4211 closing signal") too."""
    mapping: dict[tuple[str, int], int] = {}
    for scan in scans:
        for fact in scan.facts:
            host = fact.record.origin.host
            if fact.name == "nccl_comm" and host:
                rank = rank_number(fact.captures.get("rank"))
                dev = rank_number(fact.captures.get("dev"))
                if rank is None or dev is None:
                    continue
                mapping.setdefault((host, dev), rank)
                if fact.record.origin.pid:
                    mapping.setdefault((host, -fact.record.origin.pid), rank)
            elif fact.name == "ray_worker":
                rank = rank_number(fact.captures.get("rank"))
                pid = pid_number(fact.captures.get("pid"))
                if rank is None or not pid:
                    continue
                mapping.setdefault((fact.captures.get("ip", ""), -pid), rank)
                # a worker's own lines name its pid and, on the driver's node, no address
                mapping.setdefault(("", -pid), rank)
            elif fact.name == "rank_mapping":
                for node, ranks in HOST_RANKS.findall(fact.captures.get("map", "")):
                    globals_ = [rank_number(r.strip()) for r in ranks.split(",") if r.strip()]
                    for local, rank in enumerate(globals_):
                        if rank is not None:
                            mapping.setdefault((node, local), rank)
                    if len(globals_) == 1 and globals_[0] is not None:
                        mapping.setdefault((node, SOLE_RANK), globals_[0])
            elif fact.name == "summary_exit":
                r, exit_ = parse_summary_entry(fact.before, fact.record.text)
                # the summary's own host, and the node its lines came from (a node's file, an
                # srun task), which may name the same machine otherwise
                for node in {n for n in (exit_.host, host) if n}:
                    if r is not None and exit_.local_rank is not None:
                        mapping.setdefault((node, exit_.local_rank), r)
                    if r is not None and exit_.pid:
                        mapping.setdefault((node, -exit_.pid), r)
    _learn_replicas(scans, mapping)
    return mapping


def _learn_replicas(scans: list[SourceScan], mapping: dict[tuple[str, int], int]) -> None:
    """A replica a platform names as a machine of one rank (Vertex AI's 'The replica
    workerpool1-0 exited ...') is the one rank its own lines name, where they name one only."""
    replicas = {
        replica
        for scan in scans
        for fact in scan.facts
        if fact.name == "launcher_exit" and (replica := fact.captures.get("replica"))
    }
    if not replicas:
        return
    seen: dict[str, set[int]] = {}
    for scan in scans:
        for stream in scan.streams.values():
            host, rank = stream.origin.host, stream.origin.rank
            if host in replicas and rank is not None:
                seen.setdefault(host, set()).add(rank)
    for host, ranks in seen.items():
        if len(ranks) == 1:
            mapping.setdefault((host, SOLE_RANK), next(iter(ranks)))


def build_job(
    scans: list[SourceScan], hit_origins: list[Origin], run_events: list[RunEvents] | None = None
) -> JobView:
    hosts: set[str] = set()
    streams = [s for scan in scans for s in scan.streams.values()]
    origins = [s.origin for s in streams] + hit_origins
    for o in origins:
        if o.host:
            hosts.add(o.host)
    # one host named, but NCCL connected some ranks over the network: the others' nodes are
    # simply not in these logs
    # ... or srun named the nodes of the tasks that failed, more than one
    crosses_nodes = any(f.name == "net_channel" for scan in scans for f in scan.facts) or (
        len({f.captures["node"] for scan in scans for f in scan.facts if f.captures.get("node")})
        > 1
    )
    single_node = len(hosts) <= 1 and not crosses_nodes
    rank_map = learn_rank_map(scans)
    ranks: set[int] = set()
    for o in origins:
        r = resolve_rank(o, single_node, rank_map)
        if r is not None:
            ranks.add(r)
    ranks |= _silent_rank_files(scans, single_node, rank_map)

    world_hints: list[int] = []
    per_rank: dict[int, RankExit] = {}
    root_cause_rank: int | None = None
    progress: list[FactHit] = []
    transports: set[str] = set()
    ib_requested = False
    pg_wait_ranks: set[int] = set()
    local_ifaces: list[Record] = []
    exit_sources: dict[int, str] = {}
    completed_at: dict[str, int] = {}
    completed_ranks: set[int] = set()
    completions: list[tuple[int | None, Record]] = []
    loop_ends: list[tuple[int | None, Record]] = []
    sizes: dict[str, dict[int, set[int]]] = {}
    max_epochs: set[int] = set()
    train_steps: set[int] = set()
    starts: dict[str, dict[int, set[int]]] = {}
    skipped: set[int] = set()
    filtered: set[int] = set()
    filtered_unranked = False
    skipped_unranked = False
    prompts: list[tuple[int | None, Record]] = []
    extension_roots: list[tuple[int | None, Record]] = []
    extension_built: dict[str, int] = {}
    announcements: dict[int, list[Record]] = {}
    gpu_processes: dict[int, set[int]] = {}
    gpu_rows: dict[tuple[int, int], Record] = {}
    normal_seen = False
    interpreter_exit_seen = False
    leaked_at_shutdown: Record | None = None
    deduplicated = False
    failed_exits: list[FactHit] = []
    finished: list[tuple[int | None, Record]] = []
    spawn_reported: set[int] = set()
    summaries: list[Record] = []  # torchrun's 'Root Cause' lines
    # per launcher (a file, and the node in it where one file holds several: srun's tasks), the
    # pids it stopped after a failure and the workers it reported failed
    launched: dict[str, set[str]] = {}
    failed_locals: dict[str, set[str]] = {}
    launched_processes: int | None = None
    batch_exits: list[int] = []
    for scan in scans:
        expect_root = False
        for fact in scan.facts:
            if fact.name == "world_size":
                n = count_number(fact.captures.get("n"), MAX_WORLD_SIZE)
                if n:
                    world_hints.append(n)
            elif fact.name == "launched_processes":
                n = count_number(fact.captures.get("n"), MAX_WORLD_SIZE)
                if n:
                    launched_processes = max(launched_processes or 0, n)
            elif fact.name == "mesh_shape":
                n = mesh_size(fact.captures.get("dims", ""))
                if n:
                    world_hints.append(n)
            elif fact.name == "root_cause":
                expect_root = True
                summaries.append(fact.record)
            elif fact.name == "summary_exit":
                rank, exit_ = parse_summary_entry(fact.before, fact.record.text)
                if rank is not None:
                    exit_sources.setdefault(rank, fact.record.source)
                    known = per_rank.get(rank)
                    if known is None or known.host is None:  # richer than the "failed" line
                        per_rank[rank] = exit_
                    ranks.add(rank)
                    if exit_.host:
                        hosts.add(exit_.host)
                    if expect_root:
                        root_cause_rank, expect_root = rank, False
            elif fact.name == "mpi_exit":
                rank, exit_ = parse_mpi_exit(fact.before, fact.record.text)
                if rank is not None and exit_.code is not None and rank not in per_rank:
                    per_rank[rank] = exit_
                    ranks.add(rank)
            elif fact.name == "launcher_exit":
                failed_exits.append(fact)
                failed_locals.setdefault(_launcher_of(fact.record), set()).add(
                    fact.captures.get("local_rank") or fact.captures.get("rank") or ""
                )
                local = rank_number(fact.captures.get("local_rank"))
                if rank_number(fact.captures.get("last_local_rank")) == 0:
                    local = 0  # DeepSpeed's last spawned worker was its node's only one
                code = (
                    exit_code_number(fact.captures.get("code"))
                    or signal_code(fact.captures.get("signal"))
                    or signal_number_code(fact.captures.get("signum"))
                )
                named = rank_number(fact.captures.get("rank"))  # a global rank, where it says one
                # else its local rank on its node: the node's own on a single node, else what
                # the job said of that node's local ranks (DeepSpeed's global_rank_mapping)
                rank = named
                if rank is None and local is not None:
                    worker = Origin(host=fact.record.origin.host, local_rank=local)
                    rank = resolve_rank(worker, single_node, rank_map)
                if rank is None and (replica := fact.captures.get("replica")):
                    # a machine of one rank, named by the platform (Vertex AI's replicas)
                    rank = resolve_rank(Origin(host=replica), single_node, rank_map)
                if rank is not None and code is not None and rank not in per_rank:
                    per_rank[rank] = RankExit(code=code, signal=signal_name(code), local_rank=local)
            elif fact.name == "hydra_exit":
                rank, pid, node, exit_ = parse_hydra_exit(fact.before, fact.captures)
                if rank is None and pid is not None:
                    rank = resolve_rank(Origin(host=node, pid=pid), single_node, rank_map)
                if rank is not None and exit_.code is not None and rank not in per_rank:
                    per_rank[rank] = exit_
                    ranks.add(rank)
            elif fact.name == "batch_exit":
                batch_exits.append(_batch_exit_code(fact.captures))
            elif fact.name == "progress":
                progress.append(fact)
            elif fact.name == "gpu_process":
                pid = pid_number(fact.captures.get("pid"))
                gpu = count_number(fact.captures.get("gpu"), 100)
                if pid is not None and gpu is not None:
                    gpu_processes.setdefault(pid, set()).add(gpu)
                    gpu_rows.setdefault((pid, gpu), fact.record)
            elif fact.name == "rank_announced":
                announced = rank_number(fact.captures.get("rank"))
                if announced is not None:
                    announcements.setdefault(announced, []).append(fact.record)
                n = count_number(fact.captures.get("n"), MAX_WORLD_SIZE)
                if n:
                    world_hints.append(n)
            elif fact.name == "terminated_worker":
                launched.setdefault(_launcher_of(fact.record), set()).add(
                    fact.captures.get("pid", "")
                )
            elif fact.name == "raised_worker":
                failed_locals.setdefault(_launcher_of(fact.record), set()).add(
                    fact.captures.get("local_rank", "")
                )
            elif fact.name == "prompt":
                asker = resolve_rank(fact.record.origin, single_node, rank_map)
                prompts.append((asker, fact.record))
            elif fact.name == "extension_root":
                builder = resolve_rank(fact.record.origin, single_node, rank_map)
                extension_roots.append((builder, fact.record))
            elif fact.name == "extension_built":
                src = fact.record.source
                extension_built[src] = max(extension_built.get(src, 0), fact.record.line)
            elif fact.name == "data_filtered":
                filterer = resolve_rank(fact.record.origin, single_node, rank_map)
                if filterer is None:
                    filtered_unranked = True
                else:
                    filtered.add(filterer)
            elif fact.name == "skipped_step":
                skipper = resolve_rank(fact.record.origin, single_node, rank_map)
                if skipper is not None:
                    skipped.add(skipper)
                else:
                    skipped_unranked = True
            elif fact.name == "resume_point":
                starter = resolve_rank(fact.record.origin, single_node, rank_map)
                n = count_number(fact.captures.get("n"), 10**9)
                if starter is not None and n is not None:
                    unit = fact.captures.get("unit", "").lower().replace("iteration", "iter")
                    starts.setdefault(unit, {}).setdefault(starter, set()).add(n)
            elif fact.name == "max_epochs":
                epochs = count_number(fact.captures.get("n"), 10**6)
                if epochs:
                    max_epochs.add(epochs)
            elif fact.name == "train_steps":
                steps = count_number(fact.captures.get("n", "").replace(",", ""), 10**9)
                if steps:
                    train_steps.add(steps)
            elif fact.name == "data_size":
                named = rank_number(fact.captures.get("named_rank"))
                sized = (
                    named
                    if named is not None
                    else resolve_rank(fact.record.origin, single_node, rank_map)
                )
                n = count_number(fact.captures.get("n"), 10**9)
                if sized is not None and n is not None:
                    unit = fact.captures.get("unit", "")
                    sizes.setdefault(unit, {}).setdefault(sized, set()).add(n)
            elif fact.name == "loop_ended":
                loop_ends.append(
                    (resolve_rank(fact.record.origin, single_node, rank_map), fact.record)
                )
            elif fact.name == "completed":
                done = resolve_rank(fact.record.origin, single_node, rank_map)
                if done is not None:
                    completed_ranks.add(done)
                completions.append((done, fact.record))
                src = fact.record.source
                completed_at[src] = min(completed_at.get(src, fact.record.line), fact.record.line)
            elif fact.name == "spawn_reported":
                reported = rank_number(fact.captures.get("rank"))
                if reported is not None:
                    spawn_reported.add(reported)
            elif fact.name == "rank_finished":
                finished.append((rank_number(fact.captures.get("rank")), fact.record))
            elif fact.name in ("socket_transport", "ib_transport", "p2p_transport"):
                transports.add(fact.name.split("_")[0])
                normal_seen = True
            elif fact.name == "ib_requested":
                ib_requested = True
            elif fact.name == "local_socket_iface":
                local_ifaces.append(fact.record)
            elif fact.name == "pg_wait_rank":
                waited = rank_number(fact.captures.get("rank"))
                if waited is not None:
                    pg_wait_ranks.add(waited)
            elif fact.name in ("normal", "nccl_comm"):
                normal_seen = True
            elif fact.name == "interpreter_exit":
                interpreter_exit_seen = True
            elif fact.name == "leaked_at_shutdown" and leaked_at_shutdown is None:
                leaked_at_shutdown = fact.record
            elif fact.name == "deduplicated":
                deduplicated = True

    ranked_ends, main_logger_ends = _bare_ends(scans, single_node, rank_map)
    finished += ranked_ends
    for end in main_logger_ends:
        completions.append((None, end))
        completed_at[end.source] = min(completed_at.get(end.source, end.line), end.line)
    all_done: dict[str, int] = {}
    for rank, record in _every_rank_finished(finished, ranks, world_hints):
        completed_ranks.add(rank)
        completions.append((rank, record))
        # training ended when the last rank said so: what a rank printed before its own
        # word is no teardown
        all_done[record.source] = max(all_done.get(record.source, 0), record.line)
    for src, line in all_done.items():
        completed_at[src] = min(completed_at.get(src, line), line)
    recovered_at = _recovered_at(failed_exits, completions, summaries)
    last_restart = None if recovered_at is not None else _last_restart(failed_exits)
    if last_restart is not None:  # how each worker ended is how its last attempt ended
        _keep_last_attempt_exits(per_rank, failed_exits, last_restart, single_node)
    if recovered_at is not None:  # the exits of failed attempts are not how the job ended
        for fact in failed_exits:
            local = rank_number(fact.captures.get("local_rank"))
            if local is not None and single_node and per_rank.get(local) is not None:
                del per_rank[local]
        if single_node and summaries:  # nor are the ones an earlier attempt's summary listed
            for rank in [r for r, e in per_rank.items() if e.code not in (None, 0)]:
                del per_rank[rank]
    if last_restart is None and recovered_at is None:
        world_hints.extend(_launched_at_least(launched, failed_locals))
    hangs: list[RunHang] = []
    job_exit: int | None = None
    for events in run_events or []:
        for rank, code in events.per_rank_exit.items():  # observed by the supervisor: exact
            seen = per_rank.get(rank) or RankExit(code=None)  # the summary's host, pid stay
            per_rank[rank] = replace(seen, code=code, signal=signal_name(code))
            ranks.add(rank)
        hangs.extend(events.hangs)
        if events.exit_code is not None:
            job_exit = events.exit_code

    world = max(world_hints) if world_hints else None
    if ranks and (world is None or max(ranks) >= world):
        world = max(ranks) + 1  # ranks count from 0: the highest one seen bounds the size
    missing = (
        sorted(set(range(world)) - ranks)
        if world and world <= 100_000 and not deduplicated  # (Ray's: facts.py "deduplicated")
        else []
    )
    stopped_unseen = (
        _stopped_unseen(launched, failed_locals, ranks, missing)
        if single_node and last_restart is None and recovered_at is None
        else []
    )
    last_progress: dict[int, Evidence] = {}
    for scan in scans:
        for stream in scan.streams.values():
            rank = resolve_rank(stream.origin, single_node, rank_map)
            if rank is None or not stream.last_progress_text:
                continue
            shown = last_progress.get(rank)
            if shown is None or (
                shown.source == scan.info.path and shown.line < stream.last_progress_line
            ):
                last_progress[rank] = Evidence(
                    source=scan.info.path,
                    line=stream.last_progress_line,
                    rank=rank,
                    host=stream.origin.host,
                    time=None,
                    text=stream.last_progress_text[-300:],
                )
    cut_tracebacks = [
        CutTrace(
            Evidence(
                source=scan.info.path,
                line=stream.open_traceback_at,
                rank=resolve_rank(stream.origin, single_node, rank_map),
                host=stream.origin.host,
                time=stream.open_traceback_time,
                text=stream.open_traceback_text,
            ),
            native=stream.open_trace_native,
            tail=stream.open_traceback_tail,
        )
        for scan in scans
        for stream in scan.streams.values()
        # (one Python printed under 'Exception ignored in' and went on from ends nothing)
        if stream.open_traceback_line and not stream.open_trace_carried_on
    ]
    info = JobInfo(
        world_size=world,
        ranks_seen=sorted(ranks),
        ranks_missing=missing,
        hosts=sorted(hosts),
        per_rank=per_rank,
        launcher_root_cause_rank=root_cause_rank,
        last_progress=last_progress,
    )
    codes = [e.code for e in per_rank.values() if e.code is not None]
    if job_exit is not None:  # observed by `ddpdoctor run`: exact
        info.exit_code = job_exit
        info.exit_signal = signal_name(job_exit)
    elif codes:
        bad = [c for c in codes if c != 0]
        info.exit_code = bad[0] if bad else 0
        sig = next((e.signal for e in per_rank.values() if e.signal), None)
        info.exit_signal = sig
    elif batch_exits:  # the batch system's report of the whole job (a failure first)
        info.exit_code = max(batch_exits, key=lambda code: (code != 0, abs(code)))
        info.exit_signal = signal_name(info.exit_code)
    return JobView(
        info=info,
        streams=streams,
        progress=progress,
        single_node=single_node,
        transports=transports,
        ib_requested=ib_requested,
        pg_wait_ranks=pg_wait_ranks,
        local_ifaces=sorted(local_ifaces, key=lambda r: (r.source, r.line))[:4],
        hangs=hangs,
        killed_for_hang=any(e.killed_for_hang for e in run_events or []),
        stopped=any(e.stopped for e in run_events or []),
        rank_map=rank_map,
        completed_at=completed_at,
        exit_sources=exit_sources,
        completed_ranks=completed_ranks,
        completions=completions,
        stopped_unseen=stopped_unseen,
        launched_processes=launched_processes,
        function_workers=any(" of fn: " in f.record.text for f in failed_exits),
        stopped_pids=frozenset(int(p) for pids in launched.values() for p in pids if p.isdigit()),
        loop_ends=loop_ends,
        skipped_ranks=skipped,
        filtered_ranks=filtered,
        filtered_unranked=filtered_unranked,
        skipped_unranked=skipped_unranked,
        prompts=prompts,
        extension_waits=_extension_waits(extension_roots, extension_built, streams),
        announcements=announcements,
        gpu_processes=gpu_processes,
        gpu_process_rows=gpu_rows,
        resume_points=_said_once(starts),
        data_sizes=_said_once(sizes),
        max_epochs=max_epochs,
        train_steps=train_steps,
        cut_tracebacks=cut_tracebacks,
        normal_seen=normal_seen,
        world_stated=bool(world_hints),
        spawn_reported=spawn_reported,
        interpreter_exit_seen=interpreter_exit_seen,
        leaked_at_shutdown=leaked_at_shutdown,
        launcher_summaries=len(summaries),
        recovered_at=recovered_at,
        last_restart=last_restart,
        earlier_attempt_sources=_earlier_attempt_sources(scans),
        reported_at=_first_report(failed_exits),
    )


def _recovered_at(
    failed_exits: list[FactHit],
    completions: list[tuple[int | None, Record]],
    summaries: list[Record],
) -> datetime | None:
    """A restart the job recovered from: failed workers (the agent's exit lines, all timed),
    then the end of training, later by the clock or, for an end printed without a time (a
    bare print), below every one of those exit lines in the same file; and no failure summary
    after it (torchrun prints one when its restarts run out: a summary dated by the agent's
    exit lines right above it, earlier than a timed end, was an earlier launch's, one that a
    supervisor around torchrun restarted). The time returned bounds the failed attempts: the
    end's time, else the last failed exit's."""
    if not completions or not failed_exits:
        return None
    bad = [f for f in failed_exits if (exit_code_number(f.captures.get("code")) or 0) != 0]
    if not bad or any(f.record.time is None for f in bad):
        return None
    last_failure = max(f.record.time for f in bad if f.record.time is not None)
    ends = [r.time for _, r in completions if r.time is not None]
    if summaries and not (ends and all(_dated(s, bad) < max(ends) for s in summaries)):
        return None
    if ends and max(ends) > last_failure:
        return max(ends)
    untimed_after = any(
        end.time is None
        and all(f.record.source == end.source and f.record.line < end.line for f in bad)
        for _, end in completions
    )
    return last_failure + timedelta(microseconds=1) if untimed_after else None


def _dated(summary: Record, exits: list[FactHit]) -> datetime:
    """When a failure summary was printed: the time of the agent's last exit line above it in
    its file (the summary's own lines carry none); never, where there is none."""
    above = [
        f.record.time
        for f in exits
        if f.record.source == summary.source and f.record.line < summary.line and f.record.time
    ]
    return max(above) if above else datetime.max.replace(tzinfo=UTC)


def _said_once(by_unit: dict[str, dict[int, set[int]]]) -> dict[str, dict[int, int]]:
    """Per unit, each rank's one number; a unit where some rank said several is dropped (it
    counts something as it goes: not a size, not where it started)."""
    return {
        unit: {r: next(iter(ns)) for r, ns in by_rank.items()}
        for unit, by_rank in by_unit.items()
        if all(len(ns) == 1 for ns in by_rank.values())
    }


def _agent_exits(failed_exits: list[FactHit]) -> list[list[FactHit]]:
    """torchelastic's failed-worker lines ("failed (exitcode: 1) local_rank: 0") of a non-zero
    exit, all timed, per agent (its console, host and pid), in line order."""
    agents: dict[tuple[str, str | None, int | None], list[FactHit]] = {}
    for fact in failed_exits:
        record = fact.record
        if "failed (exitcode: " not in record.text or record.time is None:
            continue
        if (exit_code_number(fact.captures.get("code")) or 0) == 0:
            continue
        key = (record.source, record.origin.host, record.origin.pid)
        agents.setdefault(key, []).append(fact)
    return [sorted(exits, key=lambda f: f.record.line) for exits in agents.values()]


def workers_end(job: JobView) -> WorkersEnd:
    """How the workers ended, as attribution reads it (ingest/attribution WorkersEnd)."""
    killed = frozenset(
        rank
        for rank, exit_ in job.info.per_rank.items()
        if exit_.signal is not None and exit_.signal not in ("SIGTERM", "SIGINT")
    )
    aborted = frozenset(
        rank for rank, exit_ in job.info.per_rank.items() if exit_.signal == "SIGABRT"
    )
    return WorkersEnd(job.info.world_size, killed, job.reported_at, aborted)


def _first_report(failed_exits: list[FactHit]) -> dict[str, int]:
    first: dict[str, int] = {}
    for fact in failed_exits:
        record = fact.record
        first[record.source] = min(record.line, first.get(record.source, record.line))
    return first


def _extension_waits(
    roots: list[tuple[int | None, Record]],
    built: dict[str, int],
    streams: list[StreamSummary],
) -> list[tuple[int | None, Record]]:
    """The 'Using ... as PyTorch extensions root...' lines after which their writer made no
    progress and no extension was built or loaded in their source: a process waiting on the
    build folder's lock. (Not 'its last line': an unprefixed console's writer holds the
    launcher's lines too, which come after any rank's last words.)"""
    progressed = {f"{s.source}|{s.key}": s.last_progress_line for s in streams}  # stream_key
    return [
        (rank, record)
        for rank, record in roots
        if built.get(record.source, 0) < record.line
        and progressed.get(record.stream_key, 0) <= record.line
    ]


def _batch_exit_code(captures: dict[str, str]) -> int:
    """The job's exit code as its batch system reports it: none captured is LSF's 'Successfully
    completed.' (0); PBS adds 256 to the number of the signal that ended the job."""
    if (pbs := exit_code_number(captures.get("pbs_code"))) is not None:
        return -(pbs - 256) if pbs > 256 else pbs
    return exit_code_number(captures.get("code")) or 0


def _launcher_of(record: Record) -> str:
    """Which launcher said a line: its file's, and its node's where the line names one (one
    file holds every node's torchrun under srun's task labels)."""
    return f"{record.source}\0{record.origin.host or ''}"


def _launched_at_least(launched: dict[str, set[str]], failed: dict[str, set[str]]) -> list[int]:
    """How many workers a launcher ran at least: those it stopped after a failure (one line
    per pid) and those it reported failed, in the same file. A lower bound of the world size
    (one node's launcher knows only its own workers): with only rank 0 seen, a launcher that
    stopped one other process after rank 0's error ran two. Only where a failure was
    reported (a stop ordered from outside stops every worker, and none failed) and in a
    single attempt (a restarted group's stops repeat with new pids)."""
    return [
        len(pids) + len(failed[source])
        for source, pids in launched.items()
        if failed.get(source) and len(pids) + len(failed[source]) >= 2
    ]


def _stopped_unseen(
    launched: dict[str, set[str]], failed: dict[str, set[str]], seen: set[int], missing: list[int]
) -> list[int]:
    """The one rank that left no line but that a launcher most likely stopped alive: every
    rank seen is one the launcher reported failed (spawn's process 0, its only talker), and it
    stopped one other process while one rank is missing. A guess (a rank may have exited on
    its own before, unseen, while the stopped process was another): build_evidence takes it
    only where no announcement of an end or a stop is left without a rank."""
    for source, pids in launched.items():
        failed_here = {int(x) for x in failed.get(source, set()) if x.isdigit()}
        if len(missing) == 1 and failed_here and seen <= failed_here and len(pids) == 1:
            return missing
    return []


def _last_restart(failed_exits: list[FactHit]) -> Restart | None:
    """The last attempt an agent restarted: one agent reporting failed workers twice, seconds
    apart, ran two worker groups (an agent without restarts left reports one). Agents of other
    nodes report on their own schedule, so only one agent's own reports are compared."""
    ends: list[Record] = []
    for exits in _agent_exits(failed_exits):
        for before, after in pairwise(exits):
            assert before.record.time is not None and after.record.time is not None
            if after.record.time - before.record.time > ATTEMPT_GAP:
                ends.append(before.record)
    if not ends:
        return None
    last = max(ends, key=lambda r: (r.time, r.source, r.line))
    assert last.time is not None
    return Restart(last.source, last.line, last.time)


def _keep_last_attempt_exits(
    per_rank: dict[int, RankExit],
    failed_exits: list[FactHit],
    restart: Restart,
    single_node: bool,
) -> None:
    """Per local rank, the exit its agent reported after the last restart, not the first one
    reported (which an earlier attempt's failure set)."""
    if not single_node:
        return
    for fact in failed_exits:
        local = rank_number(fact.captures.get("local_rank"))
        if local is None or per_rank.get(local) is None or per_rank[local].host is not None:
            continue  # a summary's entry (with its host) is the last attempt's already
        if restart.precedes(fact.record):
            del per_rank[local]
    for fact in failed_exits:
        local = rank_number(fact.captures.get("local_rank"))
        code = exit_code_number(fact.captures.get("code"))
        if restart.precedes(fact.record) is False and local is not None and code is not None:
            per_rank.setdefault(
                local, RankExit(code=code, signal=signal_name(code), local_rank=local)
            )


def _earlier_attempt_sources(scans: list[SourceScan]) -> frozenset[str]:
    """Files of torchrun --log-dir attempt folders older than the newest of their run."""
    attempts: dict[str, list[tuple[int, str]]] = {}
    for scan in scans:
        found = attempt_of(scan.info.path)
        if found is not None:
            attempts.setdefault(found[0], []).append((found[1], scan.info.path))
    return frozenset(
        source for runs in attempts.values() for n, source in runs if n < max(m for m, _ in runs)
    )


def _silent_rank_files(
    scans: list[SourceScan], single_node: bool, rank_map: dict[tuple[str, int], int]
) -> set[int]:
    """Ranks whose own output file is there and empty (torchrun's --log-dir, OpenMPI's
    --output-filename, a per-rank redirect): the launcher started them and opened their
    file, and they wrote nothing. They were there, silent."""
    silent: set[int] = set()
    for scan in scans:
        if scan.info.status == "read" and scan.info.bytes == 0 and not scan.streams:
            rank = resolve_rank(origin_from_path(scan.info.path), single_node, rank_map)
            if rank is not None:
                silent.add(rank)
    return silent
