"""From the causal graph to one decision: the root (a line that nothing explains, else the best
inferred cause, else an intended end), its culprit ranks and hosts, every finding's role, and a
confidence computed from the evidence for and against. Names no rule code and no kind."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ddpdoctor.analysis.behaviour import build_evidence
from ddpdoctor.analysis.causal_graph import CausalGraph
from ddpdoctor.analysis.events import Event, Node, split
from ddpdoctor.analysis.frames import in_backward, in_checkpoint_load, user_frame
from ddpdoctor.analysis.job import JobView
from ddpdoctor.analysis.relations import (
    RELATIONS,
    Context,
    announcements,
    attempt_parts,
    attribute_by_elimination,
    failing,
    split_at_restart,
    work_done_note,
)
from ddpdoctor.model.evidence import Activity, JobEvidence, RankView, Stall
from ddpdoctor.model.findings import Evidence, Finding
from ddpdoctor.model.taxonomy import Category, Role, Status
from ddpdoctor.rules.base import Echo, Marker, Rule
from ddpdoctor.rules.hypotheses.base import (
    MAIN_PROCESS,
    Assessment,
    Hypothesis,
    ranks_text,
    world_covering,
)

TIME_BUCKET_S = 30.0
"""Two roots logged within this time of each other are not ordered by their times."""
MIN_SCORE = 0.3


@dataclass
class Decision:
    """What the verdict says, and why."""

    status: Status
    rule: Rule | None = None
    roots: list[Event] = field(default_factory=list)
    """The root's own lines (empty when the root is inferred)."""
    others: list[Event] = field(default_factory=list)
    """Independent roots of another kind (two failures nothing relates)."""
    culprit_ranks: list[int] = field(default_factory=list)
    culprit_hosts: list[str] = field(default_factory=list)
    confidence: float = 0.0
    basis: list[str] = field(default_factory=list)
    """What the confidence rests on, for and against."""
    category: str | None = None
    notes: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    """Steps specific to this job, before the rule's own."""
    evidence: list[Evidence] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    inferred: Finding | None = None
    """The finding standing for an inferred root, so the findings list shows the root."""
    title: str | None = None
    """The title of a verdict that names no kind (what the inference says is missing), or of
    one whose kind is only a guess (it then stands for the rule's title)."""


def decide(
    findings: list[Finding],
    job: JobView,
    rules: dict[str, Rule],
    hypotheses: tuple[Hypothesis, ...],
    intended: dict[str, Rule],
) -> Decision:
    """The whole causal step: events, relations, roots, roles, decision."""
    events = split_at_restart(split(findings, rules), job.last_restart, job.earlier_attempt_sources)
    evidence = build_evidence(job, events)
    if attribute_by_elimination(events, evidence):
        evidence = build_evidence(job, events)
    events = [e for e in events if e.rule.applies is None or e.rule.applies(evidence)]
    graph = CausalGraph(events, apart=attempt_parts(evidence))
    ctx = Context(evidence=evidence, completed_at=_work_done_at(evidence), intended=intended)
    for relation in RELATIONS:
        relation(graph, ctx)
    _relate_symptoms(graph, evidence, hypotheses)
    decision = _choose(graph, evidence, job, hypotheses, ctx)
    if decision.status == Status.OK and evidence.leaked_at_shutdown is not None:
        decision = _not_a_clean_end(decision, evidence.leaked_at_shutdown)
    if decision.status == Status.OK:
        decision.next_steps.extend(_advice_on_warnings(graph))
    _weigh_flight_recorder(decision, evidence)
    if evidence.last_restart is not None or evidence.earlier_attempt_sources:
        decision.notes.append(
            "The launcher restarted the workers after a failure (torchrun --max-restarts); "
            "the verdict is how the last attempt ended. What the earlier attempts printed "
            "is not taken as the job's end (their processes are gone), though the same cause "
            "may have ended them too."
        )
    _assign_roles(findings, graph, decision)
    return decision


def _work_done_at(evidence: JobEvidence) -> dict[str, int]:
    """Per source, the first line after which the job's work was done: training announced its
    end there, or every writer that counts epochs stood at its total on that line, its steps
    done (ended_at_epoch_total: not a count from 0 read as ending one short of its total, which
    some programs' '1/2' of three epochs is not): what crashes after it are the teardown's
    (relate_completion)."""
    done = dict(evidence.completed_at)
    if evidence.ended_at_epoch_total:
        for source, line in evidence.last_epoch_lines:
            done[source] = min(done.get(source, line), line)
    return done


def _not_a_clean_end(healthy: Decision, leaked: Evidence) -> Decision:
    """Nothing failed in what was read, but multiprocessing's resource tracker found objects
    its processes had not released at shutdown: some process ended without its own exit
    (killed, stopped from outside, or stuck until it was), so the run is not known to have
    ended well. Unknown, not OK; what was read stays in the notes."""
    said = leaked.text[max(0, leaked.text.find("There appear")) :].strip()[:120]
    return Decision(
        status=Status.UNKNOWN,
        confidence=0.3,
        notes=[
            "No error was read, but at shutdown Python's multiprocessing resource tracker "
            f'found what processes had not released ("{said}"): a '
            "process that held them ended without its own exit (killed, stopped from outside, "
            "or stuck in its teardown until it was). The run is not known to have ended well.",
            *healthy.notes,
        ],
        basis=["- leaked objects at shutdown: some process did not end cleanly"],
        evidence=[leaked, *healthy.evidence],
        next_steps=[
            "Find out how the job's processes ended (the launcher's or the scheduler's record "
            "of their exit codes and signals: a time limit, an OOM kill, a Ctrl-C), and "
            "collect every rank's complete output.",
            *healthy.next_steps,
        ],
    )


def _weigh_flight_recorder(decision: Decision, evidence: JobEvidence) -> None:
    """The recorder tells where, the logs tell why: its first divergence is quoted with every
    verdict, and raises the confidence when it names the same ranks (lowers it otherwise)."""
    flight = evidence.flight
    first = flight.first if flight is not None else None
    if first is None or decision.rule is None:
        return
    said = " ".join(decision.notes)
    if first.summary and first.summary not in said:
        decision.notes.append(f"The Flight Recorder dumps show: {first.summary}")
    named, culprits = set(first.ranks), set(decision.culprit_ranks)
    if named and culprits and named <= culprits:
        decision.confidence = min(0.99, decision.confidence + 0.05)
        decision.basis.append("+ the Flight Recorder dumps name the same rank(s)")
    elif named and culprits and not named & culprits and not first.ambiguous:
        decision.confidence = max(0.05, decision.confidence - 0.1)
        decision.basis.append(
            f"- the Flight Recorder dumps point at rank(s) {_list(named)} instead"
        )


def _relate_symptoms(
    graph: CausalGraph, evidence: JobEvidence, hypotheses: tuple[Hypothesis, ...]
) -> None:
    """A finding that declares itself the symptom of an inferred cause is explained by that
    cause when the cause's own evidence holds (uneven batch counts behind a mismatch)."""
    for hypothesis in hypotheses:
        kind = hypothesis.rule.kind
        symptoms = [e for e in graph.events if kind in e.rule.symptom_of]
        if not symptoms:
            continue
        assessment = hypothesis.assess(evidence)
        if assessment is None or assessment.score < MIN_SCORE:
            continue
        node = graph.add_node(Node(hypothesis.rule.code, hypothesis.rule, assessment.culprits))
        for event in symptoms:
            graph.add(node, event, "symptom", assessment.support[0] if assessment.support else "")


# --------------------------------------------------------------------------- choosing a root
def _choose(
    graph: CausalGraph,
    evidence: JobEvidence,
    job: JobView,
    hypotheses: tuple[Hypothesis, ...],
    ctx: Context,
) -> Decision:
    unexplained = graph.unexplained([e for e in graph.events if _accuses(graph, e)])
    if unexplained:
        return _from_lines(graph, unexplained, evidence, job)
    intended = _intended_end(graph, ctx)
    if intended is not None:
        return intended
    dumps = [e for e in graph.events if e.marker == Marker.STALLED]
    if dumps and evidence.stall is None and not evidence.echoes & {"waiting", "lost-peer"}:
        return _from_dumps(dumps)
    inferred = _best_hypothesis(evidence, hypotheses)
    if inferred is not None and inferred.explains_echoes:
        return _from_hypothesis(graph, inferred)
    echoes = [e for e in graph.events if failing(e) and not graph.explained(e)]
    if echoes:
        return _from_echoes(graph, echoes, evidence, ctx)
    slow = _slow(graph)
    if slow is not None:
        return slow
    if inferred is not None:  # a log that stops at start-up or mid-training, and nothing else
        return _from_hypothesis(graph, inferred)
    # failures that only explain each other (a cycle of two relations: a watchdog's abort
    # read as the echo of its own timeout, the timeout as the echo of that abort) are still
    # failures: never "OK" or "nothing recognised" for them
    cycle = graph.ungrounded([e for e in graph.events if _accuses(graph, e)])
    if cycle:
        return _from_lines(graph, cycle, evidence, job)
    return _quiet(evidence, job, ctx)


def _accuses(graph: CausalGraph, event: Event) -> bool:
    """A line that can be a root: a primary failure, or a line that explains one (a warning
    naming the parameters behind a mismatch, a teardown marker behind a crash)."""
    if event.primary:
        return True
    if event.echo is not None:
        return False  # an echo explaining its own rank's abort is still an echo
    return any(isinstance(e.effect, Event) and e.effect.primary for e in graph.effects_of(event))


def _prior(event: Event) -> tuple[int, int, int, str]:
    """Order between roots no time separates: the more specific rule, a proven line before a
    suggestive one, the lower rank, the rule code. Never the order of the files."""
    suggests = all(h.suggests for h in event.hits)
    rank = event.rank if event.rank is not None else 1 << 30
    return (-event.rule.specificity, int(suggests), rank, event.rule.code)


def _order_roots(roots: list[Event]) -> list[Event]:
    timed = [e.time for e in roots if e.time is not None]
    if timed and len(timed) == len(roots):
        first = min(timed)
        close = [
            e
            for e in roots
            if e.time is not None and (e.time - first).total_seconds() <= TIME_BUCKET_S
        ]
        rest = [e for e in roots if e not in close]
        return sorted(close, key=_prior) + sorted(rest, key=lambda e: (e.time, _prior(e)))
    return sorted(roots, key=_prior)


def _from_lines(
    graph: CausalGraph, unexplained: list[Event], evidence: JobEvidence, job: JobView
) -> Decision:
    ordered = _order_roots(unexplained)
    main = ordered[0]
    rule = main.rule
    roots = [e for e in ordered if e.rule.kind == rule.kind]
    others = [e for e in ordered if e.rule.kind != rule.kind]
    decision = Decision(status=rule.verdict_status, rule=rule, roots=roots, others=others)
    culprits = _culprits(roots, evidence, graph)
    if not culprits and (culprits := _by_its_device(roots, evidence)):
        decision.basis.append(
            "- the rank is the index of the GPU its error names (a process per GPU, each on "
            "cuda:local_rank): no line names the rank itself"
        )
    alike = _stopped_on_the_same_path(roots, culprits, evidence)
    if alike:
        decision.notes.append(
            f"The launcher showed {ranks_text(culprits)}'s error and stopped "
            f"{ranks_text(alike)} before {'it' if len(alike) == 1 else 'they'} showed an error, "
            f"a wait or work of {'its' if len(alike) == 1 else 'their'} own: every rank runs "
            "this at start-up alike, so they are "
            f"named too (where only {ranks_text(culprits)} runs it, the others only waited for "
            "it)."
        )
        culprits = culprits | alike
    sender = _sender_of_a_side_collective(roots, culprits, evidence)
    if sender is not None:
        (receiver,) = culprits
        decision.notes.append(
            f"The transport aborted rank {receiver}, which received a larger message than its "
            f"own collective expected: rank {sender}, its only peer, was in another collective. "
            "Both were small (side collectives: a metric, statistics, a flag, not a gradient "
            f"sync), so the sizes do not say which rank was out of place; rank {sender}, the "
            "main process, is named, as rank-dependent branches (`if rank == 0`) single it out."
        )
        culprits = {sender}
    decision.culprit_ranks = sorted(culprits)
    # (a platform's line about a replica is about that machine, not the platform's own log)
    hosts = {
        host
        for e in roots
        for h in e.hits
        if (host := h.captures.get("replica") or h.record.origin.host)
    }
    decision.culprit_hosts = sorted(hosts) or _host_of_dead_peer(graph)
    _confidence_of_lines(decision, graph)
    if sender is not None:
        decision.confidence = round(decision.confidence - SENDER_GUESS, 2)
        decision.basis.append("- which of the two ranks was out of place is a prior")
    if all(h.suggests for e in roots for h in e.hits):
        decision.notes.append(
            "The logs show the symptom, not the proof: confirm "
            + (rule.confirm or "on the node where the culprit ran")
            + "."
        )
    if rule.default_category == Category.INFRASTRUCTURE and not rule.proves_infrastructure:
        decision.category = str(Category.UNKNOWN)
    captured = rule.category_for_captures([h.record.text for e in roots for h in e.hits])
    if captured is not None:
        decision.category = str(captured)
    if rule.split_gpus_configure and evidence.one_device_per_process:
        decision.category = str(Category.CONFIGURATION)
        decision.notes.append(
            "Every process on the node names device 0 in its NCCL lines: each sees only its own "
            "GPU (CUDA_VISIBLE_DEVICES set per process, as Ray, a scheduler or one container "
            "per GPU do), and GPU peer-to-peer between processes that cannot see each other's "
            "device fails. Let every process see all the node's GPUs, or set NCCL_P2P_DISABLE=1."
        )
    for edge in graph.edges:
        if edge.proof and edge.cause in roots:
            decision.notes.append(edge.why)
            effect = edge.effect
            if isinstance(effect, Event):
                decision.evidence.append(Evidence.of(effect.hits[0].record, edge.why))
            break
    if others:
        names = "; ".join(sorted({f"{o.rule.title} ({_who(o)})" for o in others})[:3])
        decision.notes.append(
            f"An independent failure nothing here relates to it: {names}. Fix both."
        )
    return decision


def _who(event: Event) -> str:
    return f"rank {event.rank}" if event.rank is not None else "an unknown rank"


def _named_as_failed(roots: list[Event], graph: CausalGraph) -> set[int]:
    """The ranks a line of the root, or of what it directly explains, names as the ones that
    failed (a checkpoint's exception re-raised on every rank lists them)."""
    events = [*roots, *(e.effect for r in roots for e in graph.effects_of(r))]
    named: set[int] = set()
    for event in events:
        for hit in getattr(event, "hits", ()):
            listed = hit.captures.get("culprit_ranks", "")
            named.update(int(n) for n in listed.split(", ") if n.isdigit() and len(n) <= 7)
    return named


def _culprits(roots: list[Event], evidence: JobEvidence, graph: CausalGraph) -> set[int]:
    named = _named_as_failed(roots, graph)
    if named:
        return named
    odd = _odd_group(roots)
    if odd:
        return odd
    blamed = [
        int(n)
        for e in roots
        for h in e.hits
        if (n := h.captures.get("culprit_rank", "")).isdigit() and len(n) <= 7
    ]
    if blamed:
        # each rank's message blames another; the rank most of them blame is the odd one out
        counts = {r: blamed.count(r) for r in set(blamed)}
        top = max(counts.values())
        leaders = {r for r, c in counts.items() if c == top}
        return leaders if len(leaders) == 1 and top > 1 else set(counts)
    ranks = {e.rank for e in roots if e.rank is not None}
    if len(ranks) > 1:
        return _off_the_common_path(roots) or ranks
    if ranks:
        return ranks
    # the same root printed once by each worker says more than the launcher's one failed exit
    # (the first it saw: it stopped the others, which were already on their way out)
    every = _each_failed_worker(roots, evidence)
    if every:
        return every
    if len(evidence.failing_exits) == 1:
        return set(evidence.failing_exits)
    return _only_rank_not_waiting(roots, evidence)


def _by_its_device(roots: list[Event], evidence: JobEvidence) -> set[int]:
    """Where nothing else names a culprit: the rank of a line no writer names, from the GPU it
    names ('CUDA out of memory ... (GPU
    1; ...)'): on one node where each process uses cuda:local_rank (torchrun, mp.spawn,
    fairseq's own spawn), GPU N is the process of local rank N, so rank N. Not GPU 0 (rank 0's,
    or that of a process that sees only its own device), not where processes were seen seeing
    one device each, nor across nodes or on a line that names its node (a local rank is not a
    global one)."""
    if not evidence.single_node or evidence.one_device_per_process:
        return set()
    hits = [h for e in roots for h in e.hits]
    if any(h.record.origin.host for h in hits):
        return set()  # a line that names its node: one of several, maybe
    devices = {h.captures.get("own_device", "") for h in hits}
    if len(devices) != 1:
        return set()
    (device,) = devices
    return {int(device)} if device.isdigit() and 0 < int(device) < 64 else set()


SIDE_RATIO = 16
"""A receiver that expected a few bytes (a flag, a metric) and got a message this many times
larger was in a side collective while its peer synced gradients: it is the rank that left the
common path. Below it, both sides were in small collectives and the sizes say nothing."""
SENDER_GUESS = 0.15
"""What naming the sender by the main-process prior costs in confidence."""


def _sender_of_a_side_collective(
    roots: list[Event], culprits: set[int], evidence: JobEvidence
) -> int | None:
    """In a world of two, the main process when the transport aborted the other rank on a
    message of about the size it expected (sent_bytes and expected_bytes within SIDE_RATIO):
    the aborted rank is only the one whose collective was the smaller, and of two ranks in
    different small collectives the main process is the one a rank-dependent branch sends
    into an extra one (a metric, a statistics sync, a log on rank 0 only)."""
    world = max(evidence.world_size or 0, evidence.launched_processes or 0)
    if world != 2 or len(culprits) != 1 or MAIN_PROCESS in culprits:
        return None
    sizes = [
        (sent, expected)
        for e in roots
        for h in e.hits
        if (sent := _bytes(h.captures.get("sent_bytes"))) is not None
        and (expected := _bytes(h.captures.get("expected_bytes"))) is not None
    ]
    if not sizes or any(sent >= SIDE_RATIO * max(expected, 1) for sent, expected in sizes):
        return None
    return MAIN_PROCESS


def _bytes(text: str | None) -> int | None:
    """A captured byte count, bounded: a line's digits are not trusted to be small."""
    return int(text) if text and text.isdigit() and len(text) <= 15 else None


MAX_ALIKE_RANKS = 64
"""The largest launch whose other ranks are named for a failure they would have met alike (see
_stopped_on_the_same_path); in a bigger one, only the ranks the log shows are named."""


def _stopped_on_the_same_path(
    roots: list[Event], culprits: set[int], evidence: JobEvidence
) -> set[int]:
    """The other ranks of the job, when the root's rule is met alike by every rank at start-up
    (Rule.alike_on_every_rank: a resume loading the same checkpoint the same way) or the root
    was raised inside torch.load under the program's checkpoint loading, one rank's
    error is all the launcher showed (mp.spawn prints the first process's and stops the rest),
    no training step was printed, and none of the others failed otherwise, waited, announced
    work of its own or finished: they were on the same path when they were stopped. (A line
    it printed before, 'resuming from ckpt.pt', says nothing of how far it got.)"""
    world = max(evidence.world_size or 0, evidence.launched_processes or 0) or None
    if (
        len(culprits) != 1
        or not all(
            e.rule.alike_on_every_rank or any(in_checkpoint_load(h) for h in e.hits) for e in roots
        )
        or world is None
        or not 2 <= world <= MAX_ALIKE_RANKS
        or evidence.started_training
    ):
        return set()
    others = set(range(world)) - culprits
    for rank in others:
        view = evidence.ranks.get(rank)
        if view is None:
            continue
        if (
            view.failed
            or view.wait_sites
            or view.echoes - {"stopped", "launcher"}
            or view.busy_phase
            or view.completed
        ):
            return set()
    return others


def _odd_group(roots: list[Event]) -> set[int]:
    """Messages where each rank states its own count (DDP's 'Rank 2 has 29 params, while
    rank 0 has inconsistent 20'): the ranks group by what they have, and the smaller group is
    the odd one; of two equal groups, the one without rank 0 (DDP builds on rank 0's model,
    and it is the one launched as the reference)."""
    own: dict[int, str] = {}
    for e in roots:
        for h in e.hits:
            said, count = h.captures.get("rank_a", ""), h.captures.get("count_a", "")
            if said.isdigit() and len(said) <= 7 and count:
                own[int(said)] = count
    groups: dict[str, set[int]] = {}
    for rank, count in own.items():
        groups.setdefault(count, set()).add(rank)
    if len(groups) != 2:
        return set()
    a, b = sorted(groups.values(), key=lambda g: (len(g), 0 in g))
    return a if len(a) < len(b) or 0 not in a else set()


def _each_failed_worker(roots: list[Event], evidence: JobEvidence) -> set[int]:
    """A root printed without a rank once by each worker the launcher saw fail (two workers
    exit 1, two identical tracebacks before any process group): every one of them failed on
    its own, none waited for another, so all are named."""
    lines = _separate_reports(roots)
    hosts = {h.record.origin.host for e in roots for h in e.hits}
    sources = {h.record.source for e in roots for h in e.hits}
    failed = {
        r
        for r in evidence.failing_exits
        if (view := evidence.ranks.get(r)) is not None
        and not view.echoes - {"stopped", "launcher"}  # its own failure, not a lost peer's
        # on the root's host: by name, or by the output both were read from (a node's
        # console named for the node, whose launcher calls its host 'localhost')
        and (None in hosts or view.host in hosts or bool(_files_of(view) & sources))
    }
    if len(lines) == len(failed) and (len(failed) >= 2 or None not in hosts):
        # (one report on a named host where one worker failed of itself: that worker's)
        return failed
    # ... or once by each rank of a one-node world that the launcher did not list one by one
    # (DeepSpeed's names one command), where no rank waited for or lost another
    if (
        len(lines) >= 2
        and evidence.single_node
        and evidence.world_size == len(lines)
        and not any(v.present for v in evidence.ranks.values())
        and not evidence.echoes & {"waiting", "lost-peer"}
    ):
        return set(range(len(lines)))
    return _each_worker_of_the_host(lines, evidence)


def _separate_reports(roots: list[Event]) -> set[tuple[str, int]]:
    """The lines of the roots' hits that each stand for a report: not a traceback's own code
    line ('    raise BadZipFile(...)', indented) where the report's exception line is a hit as
    well: one worker's traceback is one report, however many of its lines a rule matched."""
    lines = {(h.record.source, h.record.line, h.record.text) for e in roots for h in e.hits}
    flush = {(s, n) for s, n, text in lines if not text[:1].isspace()}
    return flush or {(s, n) for s, n, _ in lines}


def _each_worker_of_the_host(lines: set[tuple[str, int]], evidence: JobEvidence) -> set[int]:
    """The same root printed without a rank once by every worker of one node (two identical
    ImportErrors in a node's console, before any process group), that node's workers known
    from its launcher's lines in the same file: each of them failed on its own, even the one
    the launcher stopped while it was exiting."""
    sources = {source for source, _line in lines}
    if len(sources) != 1 or len(lines) < 2:
        return set()
    on_node = {r for r, v in evidence.ranks.items() if _files_of(v) and _files_of(v) <= sources}
    workers = {r for r in on_node if evidence.ranks[r].present and not _waited(evidence.ranks[r])}
    if len(workers) != len(lines) or workers != on_node:
        return set()
    return workers


def _files_of(view: RankView) -> set[str]:
    """The node console its launcher reported its exit in, else the files of its own lines."""
    return {view.exit_source} if view.exit_source else view.sources


def _waited(view: RankView) -> bool:
    """It reported another rank's failure (a timeout, a lost peer), not only its own end."""
    return bool(view.echoes - {"stopped", "launcher"})


def _off_the_common_path(roots: list[Event]) -> set[int]:
    """Several ranks raised the same error from both sides of one collective (a mismatch each
    of them reports): those raising inside the backward pass, which every rank runs each step,
    were following the program; the ranks raising elsewhere (a broadcast in a main-only
    save) left it. Nothing when all (or none) were in the backward pass, or for roots of
    different rules (independent failures, each its own culprit)."""
    if len({e.rule.code for e in roots}) != 1:
        return set()
    where: dict[int, bool] = {}
    for e in roots:
        if e.rank is not None:
            where[e.rank] = where.get(e.rank, False) or any(in_backward(h) for h in e.hits)
    off = {r for r, inside in where.items() if not inside}
    return off if off and len(off) < len(where) else set()


def _only_rank_not_waiting(roots: list[Event], evidence: JobEvidence) -> set[int]:
    """A root printed without a rank (a caught-and-logged traceback): if every other rank seen
    on its host (or in the job) waited or lost its peer, the one left is the rank that failed."""
    waiting = evidence.waiting
    if not waiting:
        return set()
    hosts = {h.record.origin.host for e in roots for h in e.hits if h.record.origin.host}
    candidates = {
        r
        for r, v in evidence.ranks.items()
        if v.present and r not in waiting and (not hosts or v.host in hosts)
    }
    return candidates if len(candidates) == 1 else set()


def _host_of_dead_peer(graph: CausalGraph) -> list[str]:
    """NCCL service threads print "Connection closed by localRank N" on the host where local
    rank N died: when they all come from one host, that host held the culprit."""
    hosts = {
        h.record.origin.host
        for e in graph.events
        if e.echo == Echo.LOST_PEER
        for h in e.hits
        if "peer_local_rank" in h.captures and h.record.origin.host
    }
    return sorted(h for h in hosts if h) if len(hosts) == 1 else []


def _confidence_of_lines(decision: Decision, graph: CausalGraph) -> None:
    """Start from how much the root's own lines prove, then weigh what the job adds."""
    roots, rule = decision.roots, decision.rule
    if rule is None:
        return
    if rule.specificity <= 5:
        score, why = 0.6, "a generic error: no rule knows this failure more precisely"
    elif all(h.suggests for e in roots for h in e.hits):
        score, why = 0.6, "the lines suggest this cause without proving it"
    else:
        score, why = 0.9, "the root's own lines name this failure"
    basis = [f"+ {why}"]
    explained = [e for e in graph.edges if e.cause in roots and isinstance(e.effect, Event)]
    if any(e.proof for e in explained):
        score += 0.05
        basis.append("+ timeout arithmetic proves the other ranks' timeouts are its echo")
    if explained:
        basis.append(f"+ it explains {len(explained)} other line group(s) across the job")
    if decision.others:
        score -= 0.15
        basis.append("- another failure of a different kind is not explained by it")
    decision.confidence = max(0.05, min(0.99, score))
    decision.basis = basis + decision.basis  # (what choosing the culprit rested on stays)


INTENDED_ENDS = ("agreed stop", "completion")
"""The nodes of an intended end, in the order they are weighed."""


def _cut_trace_after(stops: list[Event], evidence: JobEvidence) -> bool:
    """A writer's output ends inside a traceback below the stop in the same output (Sana's
    'Early stop current iteration', then '[rank1]: Traceback ...' cut before its exception):
    a process raised on its way out of the stop, which the platform sees as a failure even
    when the exception's line is not in the logs."""
    below = {(h.record.source, h.record.line) for stop in stops for h in stop.hits}
    return any(
        cut.where.source == source and cut.where.line > line
        for cut in evidence.cut_tracebacks
        for source, line in below
    )


def _intended_end(graph: CausalGraph, ctx: Context) -> Decision | None:
    """Every rank stopped on purpose, or training had announced its end: what followed is
    the exit path. An agreed stop first: a stop the program then calls the end of training
    ('early stopping', then 'Training finished') is still an early stop, and a crash on the
    way out of it is how the ranks exited (the taxonomy's early stop), not a teardown crash
    of a completed run."""
    ends = [n for n in graph.nodes if n.rule is not None and n.name in INTENDED_ENDS]
    for node in sorted(ends, key=lambda n: INTENDED_ENDS.index(n.name)):
        assert node.rule is not None
        effects = [
            e.effect
            for end in (ends if node.name == "agreed stop" else [node])
            for e in graph.effects_of(end)
            if isinstance(e.effect, Event)
        ]
        left = [
            e for e in graph.events if failing(e) and not graph.explained(e) and e not in effects
        ]
        if left:
            continue  # something failed before the end: not an intended end
        crashes = [e for e in effects if e.crash_like or (e.primary and not e.generic)]
        teardown = ctx.intended.get("teardown")
        stops = [e for e in graph.events if e.marker in (Marker.STOP, Marker.WARNED)]
        # an early stop every rank agreed on, and the processes still there when a stop came
        # from outside: they had not exited after it, as after an announced end
        stuck_after_stop = (
            node.name == "agreed stop"
            and teardown is not None
            and not crashes
            and _stopped_after_end(effects)
            and _stop_rule(stops, node.rule) is node.rule
        )
        if node.name == "completion" or stuck_after_stop:
            rule = teardown if teardown is not None else node.rule
            decision = Decision(status=rule.verdict_status, rule=rule, roots=crashes)
            decision.culprit_ranks = sorted(
                {e.rank for e in crashes if e.rank is not None and not e.echo}
            )
            decision.culprit_hosts = sorted(
                {h.record.origin.host for e in crashes[:1] for h in e.hits if h.record.origin.host}
            )
            decision.confidence = 0.7 if decision.culprit_ranks else 0.6
            decision.notes.append(
                "every rank had stopped training early on purpose: the work was done."
                if node.name == "agreed stop"
                else work_done_note(ctx.evidence)
            )
            decision.basis = ["+ the failure came after the job's work was done"]
            if _stopped_after_end(effects):
                decision.status = Status.HUNG
                decision.notes.append(
                    "nothing crashed after it: the processes were still there when a stop "
                    "signal came from outside, so they had not exited on their own (a thread, "
                    "a DataLoader worker or a logger that never finished, a destroy or barrier "
                    "some rank never reached)."
                )
                decision.basis.append("+ after the end only a stop from outside, no crash")
            return decision
        failed = (
            bool(effects)
            or bool(ctx.evidence.failing_exits)
            or (ctx.evidence.job_exit_code not in (None, 0))
            or _cut_trace_after(stops, ctx.evidence)
        )
        diverged = ctx.intended.get("diverged")
        if diverged is not None and stops and all(_non_finite(e) for e in stops):
            found = _diverged(diverged, stops, ctx)
            if found is not None:
                return found
        decision = Decision(
            status=Status.FAILED if failed else Status.OK,
            rule=_stop_rule(stops, node.rule),
            roots=stops,
        )
        decision.confidence = 0.7
        what = "the early stop" if decision.rule is node.rule else "its stop"
        decision.notes.append(
            f"every rank announced {what}; only the exit path looks like a failure."
            if failed
            else f"every rank announced {what} and nothing failed."
        )
        if crashes:  # the taxonomy's early stop: a failure only in how the ranks exited
            decision.notes.append(
                f"On the way out: {_crash_text(crashes)}. Training's work was done; end every "
                "rank the same way (destroy_process_group(), then exit 0) so the platform sees "
                "no failure."
            )
        decision.basis = ["+ every rank announced the stop"]
        return decision
    return None


NON_FINITE = re.compile(r"(?i)\b(?:nan|inf|infinity|non-?finite|not finite)\b")
"""A stop's words naming a value that is no longer finite ('Loss is nan, stopping training')."""


def _non_finite(stop: Event) -> bool:
    return all(NON_FINITE.search(h.record.text) for h in stop.hits)


def _diverged(rule: Rule, stops: list[Event], ctx: Context) -> Decision | None:
    """Every rank stopped on a loss that was no longer finite: the program's answer to a
    failure of training, not a planned end. Only where the announcements are every present
    rank's (ranked, or one unranked announcement per rank), each then named: a stop on a NaN
    of one rank's own, which the others did not share, is that rank leaving alone; so is a
    stop after which some rank lost or waited for another."""
    if ctx.evidence.echoes & {"waiting", "lost-peer"}:
        return None
    ranks = {e.rank for e in stops if e.rank is not None}
    present = {r for r, v in ctx.evidence.ranks.items() if v.present}
    if not (
        ranks >= present or (not ranks and sum(announcements(e) for e in stops) >= len(present))
    ):
        return None
    decision = Decision(status=Status.FAILED, rule=rule, roots=stops)
    decision.culprit_ranks = sorted(present or ranks)
    decision.confidence = 0.7
    decision.notes.append(
        "every rank stopped because its loss was no longer finite: the run diverged, and the "
        "stop was the program's answer to it."
    )
    decision.basis = ["+ every rank announced a stop on a loss that was NaN or infinite"]
    return decision


def _stop_rule(stops: list[Event], agreed: Rule) -> Rule:
    """The verdict of an agreed stop: the announcements' own rule where all of them are one
    rule of another kind (every rank caught the scheduler's warning signal: preempted, not an
    early stop), else the agreed early stop's."""
    rules = {e.rule.code: e.rule for e in stops}
    if len(rules) == 1:
        (own,) = rules.values()
        if own.kind != agreed.kind:
            return own
    return agreed


def _crash_text(crashes: list[Event]) -> str:
    """Who crashed after the stop, and how ('rank 1: Process aborted in teardown')."""
    ranks = sorted({e.rank for e in crashes if e.rank is not None and not e.echo})
    who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) if ranks else ""
    titles = list(dict.fromkeys(e.rule.title for e in crashes))[:2]
    return (who + ": " if who else "") + "; ".join(titles)


MAX_ADVICE = 3
"""Warnings of a healthy run whose advice is given (one each, the first distinct rules)."""


def _advice_on_warnings(graph: CausalGraph) -> list[str]:
    """A healthy run's warnings cost nothing to fix and are what its user came to ask about
    ('find_unused_parameters=True found nothing unused', 'destroy_process_group() was not
    called'): each one's first step, said as advice, not as a cause."""
    steps: list[str] = []
    seen: set[str] = set()
    for event in graph.events:
        rule = event.rule
        if rule.severity == "error" or event.echo is not None or rule.code in seen:
            continue
        if not rule.fix or rule.marker not in (None, Marker.TEARDOWN):
            continue
        seen.add(rule.code)
        steps.append(f"Not a failure, but worth fixing ({rule.title}): {rule.fix[0]}")
        if len(steps) == MAX_ADVICE:
            break
    return steps


def _stopped_after_end(effects: list[Event]) -> bool:
    """After training's end only stop signals from outside reached the job (the launcher's
    "Received 15 death signal", and its own SIGTERM to the workers that follows): nothing
    crashed, the processes were still running when the stop came."""
    return any(e.echo == Echo.STOPPED for e in effects) and all(
        e.echo in (Echo.STOPPED, Echo.LAUNCHER) for e in effects
    )


def _best_hypothesis(
    evidence: JobEvidence, hypotheses: tuple[Hypothesis, ...]
) -> Assessment | None:
    scored: list[tuple[float, int, Assessment]] = []
    for hypothesis in hypotheses:
        assessment = hypothesis.assess(evidence)
        if assessment is not None and assessment.score >= MIN_SCORE:
            assessment.score -= 0.05 * len(assessment.against)
            scored.append((assessment.score, hypothesis.precedence, assessment))
    if not scored:
        return None
    scored.sort(key=lambda t: (-t[0], t[1]))
    return scored[0][2]


def _from_hypothesis(graph: CausalGraph, assessment: Assessment) -> Decision:
    rule = assessment.rule
    node = graph.add_node(Node(rule.code, rule, ranks=assessment.culprits))
    if assessment.explains_echoes:
        for event in graph.events:
            if event.echo is not None and not graph.explained(event):
                graph.add(node, event, "inferred", rule.title)
    # an inferred cause whose own verdict is "unknown" (a log that simply ends) still names the
    # likelier reading at the confidence of a guess; its status says nothing was established
    decision = Decision(status=assessment.status, rule=rule)
    decision.culprit_ranks = sorted(assessment.culprits)
    decision.confidence = round(assessment.score, 2)
    decision.category = assessment.category
    decision.notes = list(assessment.support)
    decision.fix = list(assessment.fix)
    decision.evidence = list(assessment.evidence)
    decision.next_steps = list(assessment.next_steps)
    decision.basis = [
        "+ inferred from how the ranks behaved (the evidence above); no line names this cause",
        *(f"- {a}" for a in assessment.against),
    ]
    decision.inferred = Finding(
        rule=rule.code,
        kind=rule.kind,
        category=assessment.category or str(rule.default_category),
        role=str(Role.ROOT),
        title=rule.title,
        ranks=decision.culprit_ranks,
        count=1,
        evidence=list(assessment.evidence),
        note=" ".join(assessment.support),
    )
    return decision


def _from_echoes(
    graph: CausalGraph, echoes: list[Event], evidence: JobEvidence, ctx: Context
) -> Decision:
    """Only echoes, and nothing infers their cause: the most telling one stands as the root.
    A rank that times out aborts and closes its connections, so a peer's closed connection is
    the echo of that timeout, whichever was printed first."""
    timed_out = any(e.echo == Echo.WAITING for e in echoes)
    order = {Echo.WAITING: 0, Echo.LOST_PEER: 1, Echo.STOPPED: 2, Echo.LAUNCHER: 3}
    echoes = sorted(
        echoes,
        key=lambda e: (
            order.get(e.echo, 4) if timed_out and e.echo is not None else 0,
            -e.rule.specificity,
            e.rank if e.rank is not None else 1 << 30,
            e.rule.code,
        ),
    )
    main = echoes[0]
    rule = main.rule
    roots = [e for e in echoes if e.rule is rule]
    decision = Decision(status=rule.verdict_status, rule=rule, roots=roots)
    decision.confidence = 0.3
    if rule.default_category == Category.INFRASTRUCTURE and not rule.proves_infrastructure:
        decision.category = str(Category.UNKNOWN)
    decision.basis = ["- only secondary errors are visible; their cause is not in these logs"]
    if main.echo == Echo.STOPPED:
        stalled = _stalled_before_stop(echoes, evidence)
        hung = ctx.intended.get("stalled-then-stopped")
        if stalled is not None and hung is not None:
            silence, pace = stalled
            decision = Decision(
                status=hung.verdict_status,
                rule=hung,
                roots=[e for e in echoes if e.echo == Echo.STOPPED],
                confidence=0.55,
            )
            decision.basis = [
                f"+ no progress for {silence:.0f} s before the stop, against a progress line "
                f"every {pace:.3g} s before it"
            ]
            decision.notes.append(
                f"the job printed progress every {pace:.3g} s, then nothing for {silence:.0f} s "
                "and no error until it was stopped from outside: it was stuck when the stop "
                "came, and the stop is not the cause."
            )
            return decision
        by_hand = _by_hand(echoes)
        # a person does stop a job that is still making progress (it is no longer wanted, or
        # the interrupt came from its parent's death): there the stop says nothing of a hang
        progressing = by_hand and evidence.progressing_at(_stop_time(echoes))
        stopped = ctx.intended.get("interrupted" if by_hand and not progressing else "stopped")
        # a rule of stops alone (every line of it a stop: the terminal's hang-up) says who
        # stopped the job better than the generic stop; a line read as a stop by a rule of
        # another kind does not
        own_stop = (
            not by_hand
            and bool(rule.signatures)
            and all(rule.echo_of(s) == Echo.STOPPED for s in rule.signatures)
        )
        if rule.default_category != Category.INTENDED_EXIT and not own_stop and stopped is not None:
            decision.rule, decision.status = stopped, stopped.verdict_status
        decision.confidence = 0.6
        decision.basis = ["+ the job was stopped from outside and nothing failed before"]
        # the stop reached these ranks, and the others lost them afterwards (relations.
        # relate_stopped_rank): they are where the job broke, not every rank at once
        reached = {
            e.rank
            for e in decision.roots
            if e.rank is not None
            and any(edge.relation == "stopped rank" for edge in graph.effects_of(e))
        }
        if reached:
            decision.culprit_ranks = sorted(reached)
        if progressing and evidence.step_s is not None:
            decision.confidence = 0.5
            decision.basis.append(
                "- SIGINT, but the job printed progress (every "
                f"{evidence.step_s:.3g} s) up to the interrupt: it was not stuck"
            )
        if by_hand and not progressing and decision.rule is stopped:
            # why the person stopped it is a guess: the usual reason, not a proof
            decision.confidence = 0.4
            decision.basis.append("- stopped by hand (SIGINT): that it was stuck is inferred")
            where = _interrupted_at(graph.events)
            if where:
                decision.notes.append(
                    f"the interrupt's tracebacks show where it found {where} (a rank waiting "
                    "somewhere the others are not is the first suspect)."
                )
        return decision
    named = {r for r, v in evidence.ranks.items() if v.named_absent}
    world = world_covering(evidence, named)
    if main.echo == Echo.WAITING and named and not (world and world <= named):
        # the waiting side's own report (a stall inspector, a monitored barrier) names who
        # never came: that is where to look, whatever kept them
        decision.culprit_ranks = sorted(named)
        decision.notes.append(
            f"the waiting side's own report names rank(s) {_list(named)} as never having "
            "arrived: they are where to look (stuck, slow, gone, or on another code path); why "
            "they did not come is not in these logs."
        )
        decision.next_steps.append(
            f"Read what rank(s) {_list(named)} were doing: their own logs, or their stacks "
            "while it waits (py-spy dump --pid PID)."
        )
        return decision
    missing = evidence.missing
    if missing:
        decision.notes.append(
            f"a peer closed the connection; rank(s) {_list(missing)} left no lines, so the "
            "peer that died first is most likely among them (or the network failed: only the "
            "other ranks' logs or a transport check can tell)."
        )
        decision.next_steps.append(f"Collect the logs of rank(s) {_list(missing)}.")
        return decision
    decision.notes.append(
        "only secondary errors are visible (timeouts or closed connections): the failure that "
        "caused them is not in these logs, or every rank was present and the transport itself "
        "failed."
    )
    decision.next_steps.extend(
        (
            "Diagnose the logs of ALL ranks and nodes together.",
            "If every rank was alive and waiting: run `ddpdoctor check` (transport bisection: "
            "NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1, NCCL_SOCKET_IFNAME).",
            "Re-run with NCCL_DEBUG=INFO and under `ddpdoctor run` to catch stacks.",
        )
    )
    return decision


def _stop_time(echoes: list[Event]) -> datetime | None:
    """When the first stop was printed, by the clock (None: no stop line has a time)."""
    times = [
        h.record.time
        for e in echoes
        if e.echo == Echo.STOPPED
        for h in e.hits
        if h.record.time is not None
    ]
    return min(times) if times else None


def _stalled_before_stop(echoes: list[Event], evidence: JobEvidence) -> tuple[float, float] | None:
    """(silence, pace) in seconds when the stop came long after the last progress line, by the
    clock: a job that had been reporting progress at a steady pace and then went quiet."""
    stop = _stop_time(echoes)
    if not evidence.stalled_before(stop):
        return None
    assert stop is not None and evidence.last_progress_at is not None
    assert evidence.step_s is not None
    return (stop - evidence.last_progress_at).total_seconds(), evidence.step_s


def _by_hand(echoes: list[Event]) -> bool:
    """Every stop seen is SIGINT (Ctrl-C: the launcher's death signal 2, a KeyboardInterrupt),
    a person's, not a scheduler's SIGTERM or a time limit."""
    stops = [e for e in echoes if e.echo == Echo.STOPPED]
    return bool(stops) and all(all(_sigint(h.captures) for h in e.hits) for e in stops)


def _sigint(captures: dict[str, str]) -> bool:
    return (
        captures.get("signum") == "2"
        or captures.get("sig") == "SIGINT"
        or captures.get("exc") == "KeyboardInterrupt"
    )


def _interrupted_at(events: list[Event]) -> str:
    """Each rank's own code line where its KeyboardInterrupt was raised."""
    places: dict[int, str] = {}
    for event in events:
        if event.echo != Echo.STOPPED or event.rank is None or event.rank in places:
            continue
        hits = [h for h in event.hits if h.captures.get("exc") == "KeyboardInterrupt"]
        frame = user_frame(hits) if hits else None
        if frame:
            places[event.rank] = frame
    return "; ".join(f"rank {r} in {places[r]}" for r in sorted(places)[:16])


def _list(ranks: set[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def _from_dumps(dumps: list[Event]) -> Decision:
    """Stack dumps and no timeout: somebody dumped the stacks of a job that hung (and what
    stopped it afterwards is not a failure of its own)."""
    rule = dumps[0].rule
    decision = Decision(status=rule.verdict_status, rule=rule, roots=dumps)
    decision.confidence = 0.5
    decision.basis = ["+ stack dumps of a job that made no progress, and no error before them"]
    decision.next_steps.append(
        "Compare the dumped stacks rank by rank: the odd one out is the cause."
    )
    return decision


def _slow(graph: CausalGraph) -> Decision | None:
    """A performance finding and nothing that failed: the job ran, slowly."""
    slow = [
        e
        for e in graph.events
        if e.rule.verdict_status == Status.SLOW and (e.rule.severity != "info" or e.rule.applies)
    ]
    if slow:
        main = sorted(slow, key=lambda e: (e.rule.applies is None, _prior(e)))[0]
        roots = [e for e in slow if e.rule is main.rule]
        decision = Decision(status=Status.SLOW, rule=main.rule, roots=roots)
        decision.culprit_ranks = sorted({e.rank for e in roots if e.rank is not None})
        decision.confidence = 0.5
        return decision
    return None


def _quiet(evidence: JobEvidence, job: JobView, ctx: Context) -> Decision:
    """Nothing failed and nothing is inferred: an exit code nobody explains, a run that ended
    or went on well, or logs in which nothing at all was recognised: not "OK", there was
    nothing healthy to read."""
    if evidence.job_exit_code not in (None, 0) and evidence.stopped_by_run:
        return Decision(
            status=Status.UNKNOWN,
            confidence=0.5,
            notes=[
                "The job was stopped by a signal `ddpdoctor run` passed on (Ctrl-C or a "
                "SIGTERM to it) before it ended, and nothing failed before the stop; run saw "
                "no stall either."
            ],
            basis=["+ stopped through ddpdoctor run, no error and no stall before"],
        )
    if evidence.job_exit_code not in (None, 0):
        return Decision(
            status=Status.UNKNOWN,
            confidence=0.2,
            notes=[
                f"The job exited with code {evidence.job_exit_code}, but its output names no cause."
            ],
            next_steps=[
                "Re-run with PYTHONFAULTHANDLER=1 and torchrun --tee 3 so every rank's output "
                "is kept; check dmesg for killed processes.",
            ],
        )
    exits_seen = evidence.job_exit_code is not None or any(
        v.exit_code is not None for v in evidence.ranks.values()
    )
    exits_seen = exits_seen or evidence.reached_exit  # its process got to its way out
    if evidence.completed_at and not (
        evidence.started_training or exits_seen or evidence.world_stated
    ):
        # a log that holds the end of training and nothing of the run before it is a fragment
        # (pasted because of what came after it): it cannot vouch for the run. One that states
        # the world it ran in (a config dump's world_size, the launcher's count) holds the
        # run's start-up, not only its end (the ranks a fragment shows say no such thing)
        # what brings such a fragment to a diagnosis is a job that did not go away: the one
        # failure it leaves room for is in teardown, named as a guess (the status stays unknown)
        return Decision(
            status=Status.UNKNOWN,
            rule=ctx.intended.get("teardown"),
            confidence=0.3,
            title="Only the end of training was read",
            notes=[
                "Only the end of training was read: no training progress before it and no exit "
                "after it. The run may have ended cleanly, or hung in teardown after that line "
                "(the failure named here, if the processes did not go away)."
            ],
            basis=["- only an end of training: no progress before it, no exit after it"],
            evidence=[Evidence.of(record) for _, record in job.completions[:2]],
            next_steps=[TEARDOWN_CHECK],
        )
    if evidence.ended or evidence.started_training:
        decision = Decision(status=Status.OK, confidence=0.5)
        if evidence.restart_ended_at is not None:
            decision.notes.append(
                "workers failed in an earlier attempt and were restarted (torchrun "
                "--max-restarts, or a supervisor around the launcher); a later attempt "
                "announced the end of training with "
                "no failure after: the job recovered. What failed before is listed as context: "
                "it may fail again."
            )
            decision.basis = ["+ a restarted attempt completed; no failure summary after it"]
        elif evidence.survived:
            decision.notes.append(
                f"{evidence.survived} lost-peer or timeout line(s) came before training "
                "announced its end: the job went on from them (a retried connection, a peer "
                "that came back), so they ended nothing."
            )
        reading = None if evidence.ended else _end_without_a_line(evidence)
        if evidence.stopped_short is not None:
            decision.rule = ctx.intended.get("stopped-short")
            decision.notes.append(
                "training announced its end while its step counter stood at "
                f'"{evidence.stopped_short.text.strip()[-80:]}": the loop stopped long before '
                "its total, on purpose (nothing failed): an early stop that said nothing."
            )
            decision.basis = ["+ the end came at half the counted steps or less, no failure"]
            decision.evidence = [evidence.stopped_short]
        if reading is not None:
            decision.confidence, note, basis = reading
            decision.notes.append(note)
            decision.basis = [basis]
        if evidence.completed_at and not exits_seen:
            # a process that hangs after its last words prints nothing more: the log alone
            # cannot tell a clean end from a hang in teardown
            decision.next_steps.append(TEARDOWN_CHECK)
        return decision
    collect = (
        "If the job failed, collect every rank's complete output (torchrun --tee 3 or "
        "--log-dir DIR) and the launcher's, and diagnose them together."
    )
    if evidence.normal_seen:
        return Decision(
            status=Status.OK,
            confidence=0.35,
            notes=[
                "What these logs hold are messages of normal operation (start-up, notes that "
                "stop no job); nothing says how the job went on after them."
            ],
            basis=["- messages of normal operation only: no progress, end or exit code"],
            next_steps=[collect],
        )
    if evidence.ignored_exceptions:
        return Decision(
            status=Status.OK,
            confidence=0.3,
            notes=[
                "What these logs hold are exceptions Python printed and ignored ('Exception "
                "ignored in: ...': raised in a __del__ or a finalizer, where nothing can catch "
                "them): Python prints them and carries on, so they end no process. Nothing "
                "says how the job went on after them."
            ],
            basis=["- ignored exceptions only: no progress, end or exit code"],
            next_steps=[collect],
        )
    if evidence.warnings:
        return Decision(
            status=Status.UNKNOWN,
            confidence=0.3,
            notes=[
                "Only warnings were read ("
                + "; ".join(evidence.warnings[:4])
                + "): they end no job by themselves, and nothing says how the job went on "
                "after them: no error, no training progress, no end of training, no exit code."
            ],
            basis=["- warnings only: no error, progress, end of training or exit code"],
            next_steps=[collect],
        )
    return Decision(
        status=Status.UNKNOWN,
        confidence=0.3,
        notes=[
            "Nothing in these logs was recognised: no error, no message of normal operation, "
            "no training progress, no end of training, no exit code. That is not a healthy "
            "run, only nothing to judge; if the job failed, its error is not in what was read."
        ],
        basis=["- nothing recognised: no error, progress, end of training or exit code"],
        next_steps=[collect],
    )


END_READINGS: tuple[tuple[Callable[[JobEvidence], bool], float, str, str], ...] = (
    (
        lambda e: e.ended_on_full_bar,
        0.5,
        "the run's progress bar reached its total and nothing failed after it; the program "
        "printed no end-of-training line of its own.",
        "+ the run's bar at its total, no failure after it",
    ),
    (
        lambda e: e.exited_cleanly,
        0.45,
        "the processes ran torch's exit-time handlers (interpreter shutdown: they were neither "
        "killed nor hung) and no error was logged; the program printed no end line of its own.",
        "+ a normal interpreter shutdown, no error",
    ),
    (
        lambda e: e.ended_after_full_bar,
        0.4,
        "the progress bar or step counter printed last reached its total and what the run "
        "printed after it holds no error (results, a save); the program printed no end line of "
        "its own, and a job that hung after that line would read the same.",
        "+ the last progress line at its total, no error after it",
    ),
    (
        lambda e: e.ended_on_planned_step,
        0.45,
        "every writer's last line is the last step the run's configuration planned (or the "
        "validation of its last configured epoch), and no error was logged; the program "
        "printed no end line of its own, and a job that hung after it would read the same.",
        "+ the last configured step or epoch reached, no error",
    ),
    (
        lambda e: e.ended_on_last_epoch,
        0.5,
        "every epoch counter reached its last epoch, with that epoch's steps done, and nothing "
        "failed after it; the program printed no end-of-training line of its own.",
        "+ the last epoch of the counters completed, no failure after it",
    ),
)
"""How a run that printed no end of its own still shows that it ended, strongest first: the
evidence that shows it, the OK's confidence, its note, its basis."""


def _end_without_a_line(evidence: JobEvidence) -> tuple[float, str, str] | None:
    """The first reading of END_READINGS the evidence shows."""
    for shows, confidence, note, basis in END_READINGS:
        if shows(evidence):
            return confidence, note, basis
    return None


TEARDOWN_CHECK = (
    "Training announced its end and the logs show no exit after it. If the processes did not "
    "exit (the job still shows as running), they hung in teardown: `py-spy dump --pid <pid>` "
    "on a lingering rank shows where (destroy_process_group, DataLoader workers, a logger's "
    "upload, an atexit handler)."
)


def assess_stall(
    activities: dict[int, Activity], summary: str, hypotheses: tuple[Hypothesis, ...]
) -> Assessment | None:
    """The hypotheses' verdict on a live stall from where every rank was (for `ddpdoctor run`'s
    message at the moment it catches the hang, before any log is diagnosed)."""
    evidence = JobEvidence(
        ranks={r: RankView(rank=r, present=True) for r in activities},
        stall=Stall(activities=activities, time=None, source="", line=0, summary=summary),
    )
    return _best_hypothesis(evidence, hypotheses)


# --------------------------------------------------------------------------------- roles
def _assign_roles(findings: list[Finding], graph: CausalGraph, decision: Decision) -> None:
    """Root for the root's lines and independent roots; cascade for what they explain
    (directly or through an inferred cause); context for the rest."""
    roots: list[Event | Node] = [*decision.roots, *decision.others]
    roots += [n for n in graph.nodes if decision.rule is not None and n.rule is decision.rule]
    if decision.inferred is not None:
        roots += [n for n in graph.nodes if n.name == decision.inferred.rule]
    explained = graph.reachable_from(roots)
    rank_of_role = {Role.ROOT: 0, Role.CASCADE: 1, Role.CONTEXT: 2}
    role: dict[int, Role] = {}
    for event in graph.events:
        if event in decision.roots or event in decision.others:
            mine = Role.ROOT
        elif (id(event) in explained and (failing(event) or event.rule.exit_path)) or (
            event.echo is not None and (id(event) in explained or decision.rule is not None)
        ):
            mine = Role.CASCADE
        else:
            mine = Role.CONTEXT
        key = id(event.finding)
        if key not in role or rank_of_role[mine] < rank_of_role[role[key]]:
            role[key] = mine
    for finding in findings:
        finding.role = str(role.get(id(finding), Role.CONTEXT))
