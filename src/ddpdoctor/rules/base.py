"""The shape of a rule: everything about one failure signature family in one value, so that
`explain`, the docs, the scanner and the tests all read the same place. No matching logic
beyond compiling a rule's own regexes."""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import KINDS, Category, Status, default_category
from ddpdoctor.rules.frameworks import BY_NAME as FRAMEWORKS


class RuleDefinitionError(ValueError):
    """A rule in the knowledge base is malformed (a bug in ddpdoctor, caught by the tests)."""


class Echo(StrEnum):
    """What a line printed because of a failure ELSEWHERE says about its own rank. A finding
    with an echo is never the root while something else explains it (see analysis/relations)."""

    WAITING = "waiting"
    """The rank was alive and waited in a collective that a peer never joined (timeouts)."""
    LOST_PEER = "lost-peer"
    """The rank lost its connection to a peer or to the store: the peer went away."""
    LAUNCHER = "launcher"
    """The launcher reacting to a failed worker (SIGTERM sent to the others, its summary)."""
    STOPPED = "stopped"
    """The process was stopped from outside (a signal, Ctrl-C): by the launcher after a peer
    failed, by `ddpdoctor run` after a hang, by a user or a scheduler."""


class Marker(StrEnum):
    """A line that is not a failure but tells the engine where the job stood."""

    STOP = "stop"
    """An announced early stop: intended when every rank announces it."""
    TEARDOWN = "teardown"
    """The program reached its end with the process group alive: later crashes are teardown."""
    STALLED = "stalled"
    """Stack dumps taken while the job made no progress."""
    WARNED = "warned"
    """A rank caught the scheduler's warning signal: a stop when every rank caught it (the
    scheduler signals every task of the step), else only context."""


MAX_FIX_LINE = 8192
"""Only a root line's first characters are searched again for the values its fix depends on."""

CAPTURES: dict[str, str] = {
    # who a line is about
    "rank": "the global rank the message is about (its subject), when the line names it",
    "local_rank": "the local rank of the worker the line is about (the global rank on one node)",
    "child_pid": "the pid of a process its launcher reports on, from the launcher's own process",
    "replica": "the machine (of one rank) a platform names as the one whose process ended "
    "(Vertex AI's 'The replica workerpool1-0 exited ...')",
    "pid": "the process id of the worker the line is about (resolved through the job's pids)",
    "culprit_rank": "the rank the message itself blames (e.g. the one with another model)",
    "culprit_ranks": "the ranks the message itself names as the ones that failed, a list "
    "('1, 3': torch.distributed.checkpoint's CheckpointException on every rank)",
    "missing": "ranks the message names as never having arrived (a monitored barrier)",
    "ready": "ranks the message names as having arrived while others had not (the ranks "
    "below the highest one named that it leaves out never arrived)",
    "world": "the world size a waiting message names",
    "joined": "how many ranks a waiting message says had arrived (when only the line's own "
    "rank had, every other rank of `world` never came)",
    "peer_local_rank": "the local rank of a peer that went away, on the line's host",
    "rank_a": "the first of two ranks the message names together",
    "rank_b": "the second of two ranks the message names together",
    "agreed_ranks": "how many ranks agreed to an early stop (one line for all of them)",
    "at_exit": "the message is printed only while a process tears itself down (a thread "
    "destroyed while still joinable): whatever that process did, it had done",
    # what a collective was doing
    "timeout_ms": "the collective timeout the rank waited for, in milliseconds",
    "ran_ms": "how long the timed-out collective ran, in milliseconds",
    "seq": "the collective's sequence number in its process group",
    "op": "the collective or transfer operation (ALLREDUCE, recv, ...)",
    "share": "the share of the GPU's kernel time a profiler row gives one operation (percent)",
    "group": "the index of the process group being created (new_group) the rank waited in",
    "numel": "the number of elements of the collective's input",
    "sent_bytes": "the bytes a peer sent to a collective that expected fewer (gloo's size "
    "check: the peer was in another, larger collective)",
    "expected_bytes": "the bytes the rank's own collective expected from that peer",
    # details quoted in the verdict
    "params": "parameter names (unused, marked twice)",
    "indices": "parameter indices",
    "index": "a parameter index",
    "count_a": "a count the message compares (first)",
    "count_b": "a count the message compares (second)",
    "size": "an allocation size",
    "path": "a file path",
    "module": "a Python module name",
    "extension": "a C++/CUDA extension compiled when the job started (torch.utils.cpp_extension)",
    "cxx_runtime": "the C++ runtime symbol version a binary needs (GLIBCXX_3.4.29, CXXABI_1.3.13)",
    "name": "an imported name",
    "var": "an environment variable name",
    "endpoint": "a host:port the rank tried to reach",
    "after": "how long the rank tried before giving up",
    "ifname": "a network interface name",
    "pci": "a PCI bus id",
    "arch": "a GPU's compute capability as CUDA names it (sm_86)",
    "busid": "a GPU bus id",
    "xid": "an NVIDIA Xid error number",
    "severity": "a severity word of the message",
    "signal": "a signal name",
    "signum": "a signal number",
    "sig": "a signal name",
    "reason": "why the scheduler ended the job",
    "job": "a scheduler's job id",
    "count": "a count the message states (devices, processes)",
    "device": "a device index or name",
    "own_device": "the index of the GPU the raising process allocated on, as it numbers them",
    "port": "a network port",
    "timeout_rank": "the rank a watchdog names as the first to time out",
    "code": "an exit code",
    "pids": "process ids",
    "step": "a training step",
    "exc": "a Python exception type",
    "what": "what a library reported",
    "global": "a global name in a pickle",
    "command": "a command the shell could not find",
    "option": "a command-line option the shell ran as a command",
    "prog": "the program whose argument parser rejected its command line",
}
"""The capture groups rules may use, with their meaning: a contract between the rules and the
engine (tests check that every named group of every rule is listed here)."""


@dataclass(frozen=True)
class Signature:
    """A regex over one log line. `literal` is a substring every match contains, used by the
    multi-pattern prefilter; derived from the regex when not given."""

    regex: str
    literal: str | None = None
    suggests: bool = False
    """True when the line only suggests the kind (SIGKILL suggests host OOM; the OOM killer's
    own message proves it): a verdict resting on such lines alone gets a lower confidence."""
    echo: Echo | None = None
    """Overrides the rule's echo for this signature (e.g. Ctrl-C's KeyboardInterrupt among the
    generic exceptions is what a stopped process prints, not a bug)."""
    store_host: bool = False
    """Only the process that hosts the rendezvous store prints it (the TCPStore server that
    cannot listen): rank 0, the master, when no line names its writer, unless its traceback
    shows that torchrun's agent hosted the store."""
    after_head: str | None = None
    """For a later line of a multi-line message: a literal of the message's first line. The
    line is read only when no line within `head_within` above it holds that literal: a paste
    cut below the message's first line keeps it alone, while under its first line it is the
    same message, already read (one hit per message, whichever way a log is split)."""
    head_within: int = 4

    @cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)

    @cached_property
    def required_literal(self) -> str:
        lit = self.literal or longest_literal(self.regex)
        if lit not in self.regex.replace("\\", "") and self.literal is None:
            raise RuleDefinitionError(f"cannot derive a literal from {self.regex!r}")
        return lit


_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")


def _group_names(regex: str) -> set[str]:
    """The names of a regex's groups, read from its text: every `(?P<name>` not escaped (an
    even count of backslashes before it). A superset of `re.compile(regex).groupindex` (one
    inside a character class counts too), without compiling the ~650 signatures at import
    (0.1 s of CPU a start; the scan compiles the few it confirms with, see `compiled`)."""
    names: set[str] = set()
    for m in _NAMED_GROUP.finditer(regex):
        start = m.start()
        escapes = start - len(regex[:start].rstrip("\\"))
        if escapes % 2 == 0:
            names.add(m.group(1))
    return names


@dataclass(frozen=True)
class Explanation:
    what: str
    why: str
    fix: str
    false_positives: str = ""


@dataclass(frozen=True)
class Rule:
    """One failure signature family.

    severity: `error` ends a job; `warning` is context unless nothing else is found; `info` is
    never a failure by itself.
    echo: this text is printed by ranks that are victims of a failure elsewhere (see Echo);
    such a finding is never the root while something else explains it.
    exit_path: this is how a rank dies once it has failed (an abort while its exception ends
    the process): after the same rank's own error it is that error's consequence.
    marker: the line marks where the job stood (see Marker) rather than a failure.
    explains: kinds this finding is the cause of when both appear in one job (parameters
    without gradient make DDP's buckets differ, which gloo reports as a collective mismatch).
    symptom_of: kinds of inferred causes that, when their own evidence holds, explain this
    finding (ranks with uneven batch counts end up issuing different collectives).
    peers_alive: (a wait) the transport reports a peer that went away as a lost connection at
    once, so a rank that only timed out waited on peers whose processes were still there.
    split_gpus_configure: inside a node, this failure between processes that each see only
    their own GPU (all on device 0: CUDA_VISIBLE_DEVICES set per process by Ray, a scheduler or
    one container per GPU) is a configuration fault, not the hardware's.
    alike_on_every_rank: every rank runs the failing code alike at start-up (the same
    checkpoint loaded the same way): where the launcher showed one rank's error and stopped the
    others before they showed an error, a wait or work of their own, those are named too.
    proves_infrastructure: the line itself is evidence of a hardware or fabric fault; a
    finding of an infrastructure kind without it is never blamed on infrastructure.
    status: the verdict's status when this rule is the root (default: `slow` for performance
    rules, `failed` otherwise).
    healthy_when_ok: a stop on purpose: as the root of a run in which nothing failed (status
    ok) it names no failure kind, the run was healthy (the taxonomy's early stop is one the
    platform saw as a failure only because of how the ranks exited).
    applies: a condition on the job for the rule to count at all (ZeRO-3 is slow only across
    nodes without InfiniBand); None means always.
    specificity: the prior: higher wins when several rules claim the same traceback, and
    between independent roots that no time orders.
    context_all / context_none: regexes that must (or must not) appear in the same writer's
    traceback around the matched line, for rules that refine another (OOM inside torch.load).
    capture_fix: (capture, value regex, step): a step shown first when a root line captured
    that value (SIGHUP's signal number: the terminal closed, not the scheduler).
    capture_category: (capture, value regex, category): the category when the root lines
    captured that value and no other under the same name (a DataLoader worker killed by
    SIGKILL: the host's memory, not the shared memory a bus error means).
    framework_fix: (framework, step) pairs: the fix in that framework's own terms, shown first
    when the job's tracebacks show it ran under that framework (rules/frameworks.py).
    """

    code: str
    kind: str
    title: str
    signatures: tuple[Signature, ...]
    explanation: Explanation
    fix: tuple[str, ...]
    category: Category | None = None
    severity: str = "error"
    echo: Echo | None = None
    exit_path: bool = False
    marker: Marker | None = None
    explains: tuple[str, ...] = ()
    symptom_of: tuple[str, ...] = ()
    peers_alive: bool = False
    split_gpus_configure: bool = False
    alike_on_every_rank: bool = False
    proves_infrastructure: bool = False
    status: Status | None = None
    healthy_when_ok: bool = False
    applies: Callable[[JobEvidence], bool] | None = None
    specificity: int = 50
    context_all: tuple[str, ...] = ()
    context_none: tuple[str, ...] = ()
    framework_fix: tuple[tuple[str, str], ...] = ()
    capture_fix: tuple[tuple[str, str, str], ...] = ()
    capture_category: tuple[tuple[str, str, Category], ...] = ()
    references: tuple[str, ...] = ()
    positive: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    sources: str = ""
    """Where upstream prints the messages the signatures match."""
    confirm: str = ""
    """Where to confirm the cause when only a `suggests` signature matched (the logs show the
    symptom, not the proof)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RuleDefinitionError(f"{self.code}: unknown kind {self.kind!r}")
        if self.severity not in ("error", "warning", "info"):
            raise RuleDefinitionError(f"{self.code}: bad severity {self.severity!r}")
        for kind in (*self.explains, *self.symptom_of):
            if kind not in KINDS:
                raise RuleDefinitionError(f"{self.code}: explains unknown kind {kind!r}")
        for name, _step in self.framework_fix:
            if name not in FRAMEWORKS:
                raise RuleDefinitionError(f"{self.code}: fix for unknown framework {name!r}")
        for name, _value, _step in self.capture_fix:
            if name not in CAPTURES:
                raise RuleDefinitionError(f"{self.code}: fix for undeclared capture {name!r}")
        for sig in self.signatures:
            unknown = _group_names(sig.regex) - set(CAPTURES)
            if unknown:
                raise RuleDefinitionError(f"{self.code}: undeclared captures {sorted(unknown)}")

    @property
    def cascade(self) -> bool:
        """Printed by victims of a failure elsewhere (any echo)."""
        return self.echo is not None or any(s.echo is not None for s in self.signatures)

    @property
    def default_category(self) -> Category:
        return self.category or default_category(self.kind)

    @property
    def verdict_status(self) -> Status:
        if self.status is not None:
            return self.status
        return Status.SLOW if self.default_category == Category.PERFORMANCE else Status.FAILED

    def fix_for(self, frameworks: list[str]) -> list[str]:
        """The fix steps in the terms of these frameworks (those the job ran under)."""
        return [step for name, step in self.framework_fix if name in frameworks]

    def captures_of(self, lines: list[str]) -> list[dict[str, str]]:
        """The values every signature captures on each of these lines: the one the scan
        matched first may not be the one that captures a value."""
        return [
            {k: v for k, v in m.groupdict().items() if v is not None}
            for line in lines
            for sig in self.signatures
            if (m := sig.compiled.search(line[:MAX_FIX_LINE]))
        ]

    def fix_for_captures(self, lines: list[str]) -> list[str]:
        """The steps a captured value of these lines calls for (a signal number that says who
        sent it), in the rule's order, each once."""
        if not self.capture_fix:
            return []
        captures = self.captures_of(lines)
        return [
            step
            for name, value, step in self.capture_fix
            if any(re.fullmatch(value, c.get(name, "")) for c in captures)
        ]

    def category_for_captures(self, lines: list[str]) -> Category | None:
        """The category the captured values of these lines call for: some line captured the
        value and none captured another for the same name (see capture_category); lines that
        capture nothing under that name (a consequence's wording) do not count."""
        if not self.capture_category:
            return None
        captures = self.captures_of(lines)
        for name, value, category in self.capture_category:
            seen = {c[name] for c in captures if name in c}
            if seen and all(re.fullmatch(value, v) for v in seen):
                return category
        return None

    def echo_of(self, signature: Signature | None) -> Echo | None:
        """The echo a hit of `signature` carries: the signature's own, else the rule's."""
        if signature is not None and signature.echo is not None:
            return signature.echo
        return self.echo

    def match(self, line: str) -> re.Match[str] | None:
        """The first signature that matches the line, or None."""
        for sig in self.signatures:
            m = sig.compiled.search(line)
            if m:
                return m
        return None

    @cached_property
    def store_host_patterns(self) -> tuple[re.Pattern[str], ...]:
        """The signatures only the rendezvous store's host prints (Signature.store_host)."""
        return tuple(s.compiled for s in self.signatures if s.store_host)

    @cached_property
    def context_all_compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.context_all)

    @cached_property
    def context_none_compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.context_none)

    def context_ok(self, context_text: str) -> bool:
        """True when the traceback around the hit satisfies the rule's context conditions."""
        if any(not p.search(context_text) for p in self.context_all_compiled):
            return False
        return not any(p.search(context_text) for p in self.context_none_compiled)


def longest_literal(regex: str) -> str:
    """The longest run of plain characters that every match of `regex` must contain."""
    best = ""

    def walk(items: sre_parse.SubPattern | list[tuple[object, object]]) -> None:
        nonlocal best
        run: list[str] = []

        def flush() -> None:
            nonlocal best, run
            text = "".join(run)
            if len(text) > len(best):
                best = text
            run = []

        for op, arg in items:
            if op is sre_constants.LITERAL:
                run.append(chr(arg))  # type: ignore[arg-type]
            elif op is sre_constants.SUBPATTERN:
                flush()
                walk(arg[-1])  # type: ignore[index]
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
                flush()
                lo, _hi, sub = arg  # type: ignore[misc]
                if lo >= 1:
                    walk(sub)
            elif op is sre_constants.AT:
                continue
            else:
                flush()
        flush()

    walk(sre_parse.parse(regex))
    return best
