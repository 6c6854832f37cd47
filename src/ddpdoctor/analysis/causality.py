"""Root cause versus cascade across ranks: the heart of the product. Decides the role of every
finding, picks the root (or infers one from how ranks behaved), names the culprit ranks and
hosts, and does the timeout arithmetic. Never blames infrastructure without its evidence."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cmp_to_key

from ddpdoctor.analysis.facts import elapsed_seconds
from ddpdoctor.analysis.job import JobView
from ddpdoctor.model.findings import Evidence, Finding, Hit
from ddpdoctor.model.records import Origin
from ddpdoctor.model.taxonomy import Category, Role, Status
from ddpdoctor.rules import inferred
from ddpdoctor.rules.base import Rule

TIME_BUCKET_S = 30.0
TIMEOUT_RULES = {"TMO101", "TMO102", "TMO103"}
MONITORED_BARRIER_RULE = "TMO103"
PEER_RULES = {"NET101"}
EARLY_STOP_RULE = "EXIT101"
TEARDOWN_RULE = "EXIT102"
UNUSED_PARAMETERS_RULE = "DDP107"
"""ddpdoctor.instrument's line naming parameters without gradient on a rank."""
KILL_ECHO_KINDS = {"preempted", "python-exception", "native-crash"}
TEARDOWN_KINDS = {"native-crash", "nccl-timeout", "nccl-network"}
"""Only crashes and lost peers: an exception after training (final evaluation, upload) is a
real failure of that step, not teardown."""
HANG_DUMP_RULE = "HANG101"
ZERO3_RULE = "PERF101"
INFRA_EVIDENCE_RULES = {"NET102", "NET103", "CUDA104"}


@dataclass(slots=True)
class Analysis:
    findings: list[Finding]
    status: Status
    rule: Rule | None = None
    root: Finding | None = None
    culprit_ranks: list[int] = field(default_factory=list)
    culprit_hosts: list[str] = field(default_factory=list)
    confidence: float = 0.0
    category: str | None = None
    notes: list[str] = field(default_factory=list)
    extra_evidence: list[Evidence] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


def hit_rank(hit: Hit, job: JobView) -> int | None:
    rank = job.resolve(hit.record.origin)
    if rank is None and "local_rank" in hit.captures and job.single_node:
        rank = int(hit.captures["local_rank"])
    if rank is None and "rank" in hit.captures:
        rank = int(hit.captures["rank"])
    if rank is None and hit.captures.get("pid", "").isdigit():
        # "Sending process 23939 closing signal", "Killed process 23939": a worker named by
        # its pid, on the line's host (the only one, on a single node)
        host = hit.record.origin.host
        if host is None and job.single_node and len(job.info.hosts) == 1:
            host = job.info.hosts[0]
        rank = job.resolve(Origin(host=host, pid=int(hit.captures["pid"])))
    return rank


def annotate(findings: list[Finding], job: JobView) -> None:
    """Fill ranks and hosts of every finding."""
    for f in findings:
        for h in f.hits:
            if h.record.origin.rank is None:
                h.record.origin.rank = job.resolve(h.record.origin)
        ranks = {r for h in f.hits if (r := hit_rank(h, job)) is not None}
        hosts = {h.record.origin.host for h in f.hits if h.record.origin.host}
        f.ranks, f.hosts = sorted(ranks), sorted(hosts)


def _earlier_or_more_specific(a: Finding, b: Finding, rules: dict[str, Rule]) -> int:
    """Root order: clearly earlier first when both have times (timestamps are sparse, so a
    timed line is never preferred to an untimed one for that reason alone), else the more
    specific rule, else the earlier line."""
    if a.first_time and b.first_time:
        gap = (a.first_time - b.first_time).total_seconds()
        if abs(gap) > TIME_BUCKET_S:
            return -1 if gap < 0 else 1
    spec = rules[b.rule].specificity - rules[a.rule].specificity
    if spec:
        return spec
    return a.hits[0].order - b.hits[0].order


def decide(findings: list[Finding], job: JobView, rules: dict[str, Rule]) -> Analysis:
    annotate(findings, job)
    errors = [
        f for f in findings if rules[f.rule].severity == "error" and not rules[f.rule].cascade
    ]
    cascades = [f for f in findings if rules[f.rule].cascade]
    for f in findings:
        f.role = Role.CASCADE if rules[f.rule].cascade else Role.CONTEXT

    if job.killed_for_hang:
        # ddpdoctor run ended the job itself: the signals and tracebacks that follow are the
        # echo of that kill, not failures of the job
        for f in errors:
            if f.kind in KILL_ECHO_KINDS:
                f.role = Role.CASCADE
        errors = [f for f in errors if f.kind not in KILL_ECHO_KINDS]
    errors = _without_exit_path_crashes(findings, errors, rules)
    stop = _early_stop(findings, job, errors, cascades, rules)
    if stop is not None:
        return stop
    if errors:
        return _with_root(findings, errors, job, rules)
    if job.hangs:
        return _from_supervised_hang(findings, job)
    if not any(f.rule in TIMEOUT_RULES | PEER_RULES for f in cascades):
        dumped = _from_dumps(findings, rules)
        if dumped is not None:
            return dumped
    if cascades:
        return _from_cascades(findings, cascades, job, rules)
    return _quiet(findings, job, rules)


def _without_exit_path_crashes(
    findings: list[Finding], errors: list[Finding], rules: dict[str, Rule]
) -> list[Finding]:
    """A native crash of a rank that had already raised a Python error (a timeout, an
    exception) is how that rank died, not why: C++ threads torn down while the exception ends
    the process ("terminate called without an active exception", SIGABRT)."""
    raised = {
        r
        for f in findings
        if f.kind != "native-crash" and rules[f.rule].severity == "error"
        for r in f.ranks
    }
    kept: list[Finding] = []
    for f in errors:
        if f.kind == "native-crash" and f.ranks and set(f.ranks) <= raised:
            f.role = Role.CASCADE
        else:
            kept.append(f)
    return kept


def _with_root(
    findings: list[Finding], errors: list[Finding], job: JobView, rules: dict[str, Rule]
) -> Analysis:
    errors.sort(key=cmp_to_key(lambda a, b: _earlier_or_more_specific(a, b, rules)))
    root = errors[0]
    if _after_completion(root, job) and root.kind in TEARDOWN_KINDS:
        return _teardown_crash(
            findings,
            [root],
            job,
            "training had announced its end before this happened: the work was done.",
        )
    teardown = next((f for f in findings if f.rule == TEARDOWN_RULE), None)
    if root.kind == "native-crash" and teardown is not None:
        # the work was done; the crash happened while the process was being torn down
        root.role = Role.CASCADE
        root = teardown
    unused = next((f for f in findings if f.rule == UNUSED_PARAMETERS_RULE and f.ranks), None)
    if root.kind == "collective-mismatch" and unused is not None:
        # parameters without gradient on some ranks make DDP's gradient buckets differ
        # between ranks: the mismatch the transport saw is the consequence
        root.role = Role.CASCADE
        root = unused
    root.role = Role.ROOT
    rule = rules[root.rule]
    culprits = _culprit_ranks(root, job) or _only_rank_not_waiting(root, findings, job)
    for f in errors[1:]:
        if f.kind == root.kind:
            f.role = Role.ROOT
            culprits |= set(f.ranks)
        elif f.ranks and culprits and not (set(f.ranks) & culprits):
            f.role = Role.CASCADE
        else:
            f.role = Role.CONTEXT
    analysis = Analysis(
        findings=findings,
        status=Status.FAILED,
        rule=rule,
        root=root,
        culprit_ranks=sorted(culprits),
        culprit_hosts=root.hosts or _host_of_dead_peer(findings),
        confidence=0.6 if rule.specificity <= 5 or all(h.suggests for h in root.hits) else 0.9,
    )
    if all(h.suggests for h in root.hits):
        analysis.notes.append(
            "The logs show the symptom, not the proof: confirm "
            + (rule.confirm or "on the node where the culprit ran")
            + "."
        )
    if (
        rule.kind in ("nccl-network", "nccl-p2p", "gpu-hardware")
        and rule.code not in INFRA_EVIDENCE_RULES
    ):
        analysis.category = str(Category.UNKNOWN) if rule.cascade else None
    _timeout_arithmetic(analysis, root, findings, job)
    return analysis


def _after_completion(root: Finding, job: JobView) -> bool:
    """Every hit of the root comes after training announced its end in the same source."""
    return bool(root.hits) and all(
        h.record.source in job.completed_at and h.record.line > job.completed_at[h.record.source]
        for h in root.hits
    )


def _host_of_dead_peer(findings: list[Finding]) -> list[str]:
    """NCCL service threads print "Connection closed by localRank N" on the host where local
    rank N died: when they all come from one host, that host held the culprit."""
    hosts = {
        h.record.origin.host
        for f in findings
        if f.rule in PEER_RULES
        for h in f.hits
        if "peer_local_rank" in h.captures and h.record.origin.host
    }
    return sorted(h for h in hosts if h) if len(hosts) == 1 else []


def _only_rank_not_waiting(root: Finding, findings: list[Finding], job: JobView) -> set[int]:
    """A root error printed without a rank (a caught-and-logged traceback): if every other
    rank seen on its host (or in the job) reported a timeout or a closed connection, the one
    left is the rank that failed."""
    victims = {r for f in findings if f.rule in TIMEOUT_RULES | PEER_RULES for r in f.ranks}
    if not victims:
        return set()
    hosts = set(root.hosts)
    candidates = {
        r
        for s in job.streams
        if (r := job.resolve(s.origin)) is not None
        and (not hosts or s.origin.host in hosts)
        and r not in victims
    }
    return candidates if len(candidates) == 1 else set()


def _culprit_ranks(root: Finding, job: JobView) -> set[int]:
    named = {int(h.captures["culprit_rank"]) for h in root.hits if "culprit_rank" in h.captures}
    if named:
        return named
    if root.ranks:
        return set(root.ranks)
    failing = [
        r
        for r, e in job.info.per_rank.items()
        if e.code not in (None, 0) and e.signal not in ("SIGTERM",)
    ]
    return set(failing) if len(failing) == 1 else set()


def _timeout_arithmetic(
    analysis: Analysis, root: Finding, findings: list[Finding], job: JobView
) -> None:
    """A watchdog line says how long it waited; a root failure about that long before it is
    the proof that the timeout is its echo."""
    if root.first_time is None:
        return
    for f in findings:
        if f.rule not in TIMEOUT_RULES:
            continue
        for hit in f.hits:
            ms = hit.captures.get("timeout_ms", "")
            if not ms.isdigit() or hit.record.time is None:
                continue
            waited = timedelta(milliseconds=int(ms))
            since = hit.record.time - waited
            gap = (since - root.first_time).total_seconds()
            if -5.0 <= gap <= max(60.0, waited.total_seconds() * 0.25):
                who = f"rank {hit_rank(hit, job)}" if hit_rank(hit, job) is not None else "a rank"
                text = (
                    f"Timeout arithmetic: {who} timed out at {_hms(hit.record.time)} after "
                    f"{waited.total_seconds():g} s, so it had waited since {_hms(since)}; the root "
                    f"failure was at {_hms(root.first_time)}, {abs(gap):.2f} s "
                    f"{'before' if gap >= 0 else 'after'} that: the timeout is its consequence."
                )
                analysis.notes.append(text)
                analysis.extra_evidence.append(Evidence.of(hit.record, text))
                return


def _hms(t: datetime) -> str:
    return t.strftime("%H:%M:%S.%f")[:-3]


def _early_stop(
    findings: list[Finding],
    job: JobView,
    errors: list[Finding],
    cascades: list[Finding],
    rules: dict[str, Rule],
) -> Analysis | None:
    """An announced early stop: on every rank it is intended (only the exit path may look
    like a failure); on some ranks only, the others were left waiting (uncoordinated exit)."""
    stop = next((f for f in findings if f.rule == EARLY_STOP_RULE), None)
    if stop is None:
        return None
    announcers = set(stop.ranks)
    ranks = set(job.info.ranks_seen)
    every_rank = (
        (announcers and announcers >= ranks)
        or (not announcers and _announcements(stop, rules[stop.rule]) >= max(1, len(ranks)))
        or _agreed_by_all(stop, ranks)
    )
    real = [f for f in errors if f.kind != "python-exception"]
    if real and every_rank and all(f.kind in TEARDOWN_KINDS and _after(f, stop) for f in real):
        stop.role = Role.CONTEXT
        return _teardown_crash(
            findings,
            real,
            job,
            "every rank had stopped training early on purpose before this crash: the work was "
            "done, the crash came on the way out.",
        )
    if real:
        return None  # a real error elsewhere explains the job's end better than a stop notice
    if announcers and ranks and announcers < ranks and cascades:
        stop.role = Role.ROOT
        return Analysis(
            findings=findings,
            status=Status.FAILED,
            rule=inferred.UNCOORDINATED_EXIT,
            root=stop,
            culprit_ranks=sorted(announcers),
            culprit_hosts=stop.hosts,
            confidence=0.75,
            notes=[
                f"rank(s) {_list(announcers)} stopped early on their own; "
                f"rank(s) {_list(ranks - announcers)} kept going and failed waiting for them."
            ],
        )
    if not every_rank:
        return None
    stop.role = Role.ROOT
    for f in errors:
        f.role = Role.CONTEXT
    exited_badly = any(e.code not in (None, 0) for e in job.info.per_rank.values())
    failed = bool(errors) or exited_badly
    return Analysis(
        findings=findings,
        status=Status.FAILED if failed else Status.OK,
        rule=inferred.EARLY_STOP_ALL,
        root=stop,
        confidence=0.7,
        notes=[
            "every rank announced the early stop; only the exit path looks like a failure."
            if failed
            else "every rank announced the early stop and nothing failed."
        ],
    )


def _agreed_by_all(stop: Finding, ranks: set[int]) -> bool:
    """A stop agreed by every rank (ddpdoctor.instrument.agree_to_stop) is announced once, for
    all of them."""
    agreed = [int(h.captures["agreed_ranks"]) for h in stop.hits if "agreed_ranks" in h.captures]
    return bool(agreed) and max(agreed) >= len(ranks)


def _after(crash: Finding, stop: Finding) -> bool:
    """Every line of the crash comes after the stop's first announcement in the same file."""
    first: dict[str, int] = {}
    for h in stop.hits:
        first.setdefault(h.record.source, h.record.line)
    return bool(crash.hits) and all(
        h.record.source in first and h.record.line > first[h.record.source] for h in crash.hits
    )


def _teardown_crash(
    findings: list[Finding], crashes: list[Finding], job: JobView, why: str
) -> Analysis:
    """The work was done (training announced its end, or every rank stopped on purpose) when
    these crashes came: library teardown on the way out, not a failure of training."""
    culprits: set[int] = set()
    for f in crashes:
        f.role = Role.ROOT
        culprits |= _culprit_ranks(f, job)
    return Analysis(
        findings=findings,
        status=Status.FAILED,
        rule=inferred.TEARDOWN_CRASH,
        root=crashes[0],
        culprit_ranks=sorted(culprits),
        culprit_hosts=crashes[0].hosts,
        confidence=0.7,
        notes=[why],
    )


def _announcements(stop: Finding, rule: Rule) -> int:
    """How many announcements the stop's lines hold. Ranks that write to one console at the
    same moment glue their lines together ("...2 epochsEarly stopping at epoch 5..."), so one
    line can carry the same announcement several times; the repeat is counted, not the line."""
    total = 0
    for hit in stop.hits:
        text = hit.record.text.casefold()
        found = (sig.compiled.search(hit.record.text) for sig in rule.signatures)
        said = next((m.group(0).casefold() for m in found if m is not None), "")
        total += max(1, text.count(said)) if said else 1
    return total


def _from_cascades(
    findings: list[Finding], cascades: list[Finding], job: JobView, rules: dict[str, Rule]
) -> Analysis:
    """No primary error anywhere: infer the cause from who waited, who was busy, who vanished."""
    waiting = {r for f in cascades if f.rule in TIMEOUT_RULES | PEER_RULES for r in f.ranks}
    error_ranks = {r for f in findings if rules[f.rule].severity != "info" for r in f.ranks}
    alive_quiet = {
        r
        for s in job.streams
        if (r := job.resolve(s.origin)) is not None and r not in error_ranks and not s.error_lines
    }
    # a rank that printed nothing but that the launcher had to terminate was alive and quiet too
    alive_quiet |= {r for r in job.info.per_rank if r not in error_ranks and _still_working(r, job)}
    named = _named_absent(cascades)
    missing = set(job.info.ranks_missing)
    timeout_ms = _timeout_ms(cascades)
    busy_note = _busy_progress(job, timeout_ms)
    analysis = Analysis(findings=findings, status=Status.FAILED)

    echoes = [f for f in cascades if f.rule in TIMEOUT_RULES | PEER_RULES]
    if echoes and all(_after_completion(f, job) for f in echoes):
        top = echoes[0]
        top.role = Role.ROOT
        analysis.rule, analysis.root = inferred.TEARDOWN_CRASH, top
        analysis.confidence = 0.6
        analysis.notes.append(
            "training had announced its end before these timeouts or closed connections: "
            "ranks left at different times without destroy_process_group()."
        )
        return analysis
    busy = {r for r in alive_quiet if _still_working(r, job)}
    uneven = _uneven_totals(job)
    if busy_note is not None and (alive_quiet | missing):
        culprit = alive_quiet if alive_quiet else missing
        analysis.rule, analysis.culprit_ranks = inferred.SLOW_RANK, sorted(culprit)
        analysis.confidence = 0.7
        analysis.notes.append(busy_note[0])
        analysis.extra_evidence.append(busy_note[1])
    elif waiting and (phase := _busy_phase(job, alive_quiet | missing)) is not None:
        analysis.rule, analysis.culprit_ranks = inferred.SLOW_RANK, sorted(phase[0])
        analysis.confidence = 0.55
        analysis.notes.append(phase[1])
    elif busy and waiting:
        culprit = (busy & named) or busy
        analysis.rule, analysis.culprit_ranks = inferred.SLOW_RANK, sorted(culprit)
        analysis.confidence = 0.7 if busy & named else 0.6
        analysis.notes.append(
            f"rank(s) {_list(culprit)} printed no error and were still running (the launcher had "
            f"to terminate them) while rank(s) {_list(waiting)} timed out waiting for them"
            + (
                ", and the monitored barrier names them as the ranks that never arrived."
                if busy & named
                else "."
            )
        )
    elif uneven is not None and waiting:
        analysis.rule, analysis.culprit_ranks = inferred.UNEVEN, sorted(uneven[0])
        analysis.confidence = 0.6
        analysis.notes.append(uneven[1])
    elif alive_quiet and waiting:
        if len(waiting) < len(alive_quiet):
            analysis.rule, analysis.culprit_ranks = inferred.COLLECTIVE_ASYMMETRY, sorted(waiting)
            analysis.confidence = 0.5
            analysis.notes.append(
                f"only rank(s) {_list(waiting)} timed out; rank(s) {_list(alive_quiet)} went on "
                "without error, so the waiting ranks were in a collective nobody else joined."
            )
        else:
            analysis.rule, analysis.culprit_ranks = inferred.UNCOORDINATED_EXIT, sorted(alive_quiet)
            analysis.confidence = 0.6
            analysis.notes.append(
                f"rank(s) {_list(alive_quiet)} stopped printing without any error while rank(s) "
                f"{_list(waiting)} reported closed connections or timeouts: they left (or were "
                "killed) first. This is not a network fault."
            )
    elif missing and (startup := _startup_barrier(cascades)) is not None:
        analysis.rule, analysis.culprit_ranks = inferred.SLOW_RANK, sorted(missing)
        analysis.confidence = 0.5
        analysis.notes.append(
            f"the ranks timed out in collective #{startup} of a 1-element barrier, at the very "
            f"start of the job, and rank(s) {_list(missing)} never joined: the classic picture "
            "of one rank doing start-up work alone (downloading, tokenising, preprocessing under "
            "main_process_first) for longer than the timeout."
        )
        analysis.next_steps.append(f"Check what rank(s) {_list(missing)} printed at start-up.")
    elif missing and not any(f.rule in TIMEOUT_RULES for f in cascades):
        # closed connections, no timeout: a peer went away; which one is not in these logs
        top = next(f for f in cascades if f.rule in PEER_RULES) if waiting else cascades[0]
        top.role = Role.ROOT
        analysis.rule, analysis.root = rules[top.rule], top
        analysis.confidence = 0.3
        analysis.category = str(Category.UNKNOWN) if analysis.rule.kind.startswith("nccl") else None
        analysis.notes.append(
            f"a peer closed the connection; rank(s) {_list(missing)} left no lines, so the "
            "peer that died first is most likely among them (or the network failed: only the "
            "other ranks' logs or a transport check can tell)."
        )
        analysis.next_steps.append(f"Collect the logs of rank(s) {_list(missing)}.")
    elif missing:
        analysis.rule, analysis.culprit_ranks = inferred.MISSING_RANKS, sorted(missing)
        analysis.confidence = 0.35
        analysis.notes.append(
            f"rank(s) {_list(missing)} left no lines at all: the root cause is most likely in "
            "their logs, which were not given."
        )
        analysis.next_steps.append(f"Collect the logs of rank(s) {_list(missing)}.")
    else:
        failing = {
            r: e
            for r, e in job.info.per_rank.items()
            if e.code not in (None, 0) and e.signal != "SIGTERM"
        }
        if failing and not waiting:
            analysis.rule = inferred.WORKER_EXIT
            analysis.culprit_ranks = sorted(failing)
            analysis.confidence = 0.5
        else:
            # a rank that times out aborts and closes its connections: the peers' "closed by
            # peer" is the echo of that timeout, whichever of the two was printed first
            timed_out = any(f.rule in TIMEOUT_RULES for f in cascades)
            cascades.sort(
                key=lambda f: (
                    timed_out and f.rule in PEER_RULES,
                    -rules[f.rule].specificity,
                    f.hits[0].order,
                )
            )
            top = cascades[0]
            analysis.rule = rules[top.rule]
            analysis.root = top
            top.role = Role.ROOT
            analysis.confidence = 0.3
            analysis.category = (
                str(Category.UNKNOWN)
                if analysis.rule.kind in ("nccl-network", "nccl-p2p")
                else None
            )
            analysis.notes.append(
                "only secondary errors are visible (timeouts or closed connections): the "
                "failure that caused them is not in these logs, or every rank was present and "
                "the transport itself failed."
            )
            analysis.next_steps.extend(
                (
                    "Diagnose the logs of ALL ranks and nodes together.",
                    "If every rank was alive and waiting: run `ddpdoctor check` (transport "
                    "bisection: NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1, NCCL_SOCKET_IFNAME).",
                    "Re-run with NCCL_DEBUG=INFO and under `ddpdoctor run` to catch stacks.",
                )
            )
    return analysis


STARTUP_SEQ = 5


def _startup_barrier(cascades: list[Finding]) -> int | None:
    """SeqNum of a watchdog timeout in a barrier-like collective (1 element, or BARRIER) among
    the first few collectives of the job, if there is one."""
    for f in cascades:
        for h in f.hits:
            seq = h.captures.get("seq", "")
            barrier_like = h.captures.get("numel") == "1" or h.captures.get("op") == "BARRIER"
            if seq.isdigit() and int(seq) <= STARTUP_SEQ and barrier_like:
                return int(seq)
    return None


BUSY_PHASE = re.compile(
    r"(?i)sav(?:e|ing) (?:the )?(?:model|checkpoint|state)|evaluat|validat|tokeniz|preprocess"
    r"|download|loading (?:the )?(?:dataset|data|checkpoint|model)|building (?:the )?index"
    r"|consolidat|gather(?:ing)? (?:the )?(?:full )?state|running (?:on|the) (?:dataset|eval)"
)


def _busy_phase(job: JobView, candidates: set[int]) -> tuple[set[int], str] | None:
    """A rank that never joined, whose last words announce a long one-rank phase (saving a
    checkpoint, evaluation, preprocessing): it was busy, not gone."""
    for s in job.streams:
        rank = job.resolve(s.origin)
        if rank not in candidates or s.error_lines or not BUSY_PHASE.search(s.last_text):
            continue
        return {rank}, (
            f"rank {rank}'s last line says it had started a long phase on its own "
            f'("{s.last_text[:80]}") while the others waited in a collective.'
        )
    return None


def _named_absent(cascades: list[Finding]) -> set[int]:
    """Ranks that a monitored barrier names as not arriving ("Rank 1 failed to pass
    monitoredBarrier"): the log's own word on who kept the others waiting."""
    named: set[int] = set()
    for f in cascades:
        if f.rule == MONITORED_BARRIER_RULE:
            for hit in f.hits:
                named.update(int(n) for n in re.findall(r"\d+", hit.captures.get("missing", "")))
    return named


def _still_working(rank: int, job: JobView) -> bool:
    """The launcher had to SIGTERM this rank: it was alive and busy when the others failed."""
    exit_ = job.info.per_rank.get(rank)
    return exit_ is not None and exit_.signal == "SIGTERM"


def _uneven_totals(job: JobView) -> tuple[set[int], str] | None:
    """Ranks counting to different totals ("step 5/8" vs "step 5/6") got uneven inputs; the
    ones with the fewest batches leave the loop first."""
    totals: dict[int, int] = {}
    for s in job.streams:
        rank = job.resolve(s.origin)
        if rank is not None and s.progress_total is not None:
            totals[rank] = s.progress_total
    if len(set(totals.values())) < 2:
        return None
    fewest = min(totals.values())
    short = {r for r, t in totals.items() if t == fewest}
    detail = ", ".join(f"rank {r}: {t}" for r, t in sorted(totals.items()))
    return short, (
        f"the ranks iterate over different numbers of batches ({detail}): rank(s) "
        f"{_list(short)} ran out of data first and left the loop while the others waited."
    )


def _from_supervised_hang(findings: list[Finding], job: JobView) -> Analysis:
    """`ddpdoctor run` caught the job stalled and grouped the stacks of every rank."""
    hang = job.hangs[-1]
    rule = inferred.HANG_BY_KIND.get(hang.taxonomy_kind or "", inferred.HANG)
    groups = "; ".join(f"{_who(g.get('who'))} {g.get('where')}" for g in hang.groups[:6])
    analysis = Analysis(
        findings=findings,
        status=Status.HUNG,
        rule=rule,
        culprit_ranks=sorted(hang.culprit_ranks),
        confidence=0.8 if hang.culprit_ranks else 0.5,
        notes=[f"ddpdoctor run caught the hang ({hang.kind}): {hang.summary}"],
    )
    analysis.extra_evidence.append(
        Evidence(
            source=hang.source.rsplit(":", 1)[0],
            line=int(hang.source.rsplit(":", 1)[1]),
            rank=None,
            host=None,
            time=datetime.fromisoformat(hang.time) if hang.time else None,
            text=f"stacks: {groups}" if groups else hang.summary,
        )
    )
    return analysis


def _who(who: object) -> str:
    return ", ".join(map(str, who)) if isinstance(who, list) else str(who)


def _timeout_ms(cascades: list[Finding]) -> float | None:
    for f in cascades:
        for h in f.hits:
            ms = h.captures.get("timeout_ms", "")
            if ms.isdigit():
                return float(ms)
    return None


def _busy_progress(job: JobView, timeout_ms: float | None) -> tuple[str, Evidence] | None:
    """A progress bar that kept moving for about the collective timeout proves a busy rank."""
    best = None
    for fact in job.progress:
        elapsed = elapsed_seconds(fact.captures.get("elapsed", ""))
        if elapsed is None:
            continue
        if best is None or elapsed > best[0]:
            best = (elapsed, fact)
    if best is None or best[0] < 30:
        return None
    elapsed, fact = best
    if timeout_ms is not None and elapsed < 0.5 * timeout_ms / 1000:
        return None
    text = (
        f"a rank was busy: its progress bar ran for {elapsed:g} s"
        + (f", about the collective timeout of {timeout_ms / 1000:g} s" if timeout_ms else "")
        + ", while the other ranks waited."
    )
    return text, Evidence.of(fact.record, f"{fact.record.text[-160:]}")


def _from_dumps(findings: list[Finding], rules: dict[str, Rule]) -> Analysis | None:
    """Stack dumps and no error: somebody dumped the stacks of a job that hung."""
    dumps = next((f for f in findings if f.rule == HANG_DUMP_RULE), None)
    if dumps is not None:
        dumps.role = Role.ROOT
        return Analysis(
            findings=findings,
            status=Status.HUNG,
            rule=rules[HANG_DUMP_RULE],
            root=dumps,
            confidence=0.5,
            next_steps=["Compare the dumped stacks rank by rank: the odd one out is the cause."],
        )
    return None


def _quiet(findings: list[Finding], job: JobView, rules: dict[str, Rule]) -> Analysis:
    """No error and no cascade: a healthy run, a performance warning, or a silent stall."""
    warnings = [f for f in findings if rules[f.rule].severity == "warning"]
    perf = [f for f in warnings if rules[f.rule].default_category == Category.PERFORMANCE]
    zero3 = next((f for f in findings if f.rule == ZERO3_RULE), None)
    if zero3 is not None and not job.single_node and "ib" not in job.transports:
        perf.insert(0, zero3)
    if perf:
        perf[0].role = Role.ROOT
        return Analysis(
            findings=findings,
            status=Status.SLOW,
            rule=rules[perf[0].rule],
            root=perf[0],
            culprit_ranks=perf[0].ranks,
            confidence=0.5,
        )
    failing = {r: e for r, e in job.info.per_rank.items() if e.code not in (None, 0)}
    if failing:
        return Analysis(
            findings=findings,
            status=Status.FAILED,
            rule=inferred.WORKER_EXIT,
            culprit_ranks=sorted(failing),
            confidence=0.5,
        )
    if job.info.exit_code not in (None, 0):
        return Analysis(
            findings=findings,
            status=Status.UNKNOWN,
            confidence=0.2,
            notes=[
                f"The job exited with code {job.info.exit_code}, but its output names no cause."
            ],
            next_steps=[
                "Re-run with PYTHONFAULTHANDLER=1 and torchrun --tee 3 so every rank's output is "
                "kept; check dmesg for killed processes.",
            ],
        )
    if _stalled_at_startup(job):
        return Analysis(
            findings=findings,
            status=Status.HUNG,
            rule=inferred.STARTUP_HANG if job.single_node else inferred.HANG,
            category=str(Category.UNKNOWN),
            confidence=0.3,
            notes=[
                "the output stops during distributed start-up: no error, no training step, "
                "no exit. On one node, broken GPU peer-to-peer is the classic cause."
            ],
            next_steps=[
                "Re-run with NCCL_DEBUG=INFO NCCL_P2P_DISABLE=1; or run `ddpdoctor check "
                "--nproc-per-node N` on the node.",
            ],
        )
    return Analysis(findings=findings, status=Status.OK, confidence=0.5)


def _stalled_at_startup(job: JobView) -> bool:
    streams = [s for s in job.streams if s.lines_seen]
    if not streams:
        return False
    last = max(streams, key=lambda s: s.last_line)
    init = last.last_init_line
    # no training step since the (last) start-up, and the output ends right after it
    progressed = any(s.last_progress_line > init for s in streams)
    return init > 0 and not progressed and last.last_line - init <= 3


def _list(ranks: set[int] | list[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))
