"""Stacks of a live job: dump every rank (py-spy's JSON, else faulthandler on SIGUSR1 armed by our
sitecustomize), read both, group ranks by where they wait and name the odd ones out.
Never raises into the supervisor: failures become notes in the result.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddpdoctor.analysis.decision import assess_stall
from ddpdoctor.analysis.frames import LOCK_CALL, SLEEP_CALL
from ddpdoctor.model.evidence import COLLECTIVE_FUNCTIONS
from ddpdoctor.model.evidence import Activity as StallActivity
from ddpdoctor.redaction import clean_text
from ddpdoctor.rules.registry import HYPOTHESES
from ddpdoctor.supervise.child import ProcInfo

COLLECTIVES = COLLECTIVE_FUNCTIONS
LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python3", "<frozen", "/torch/")
# py-spy dump: `Thread 123 (idle): "MainThread"` then `    func (file.py:12)` frames.
PYSPY_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?')
PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
# faulthandler (Python/traceback.c): `Thread 0x... (most recent call first):`,
# `  File "x.py", line 12 in func`.
FH_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+) \(most recent call")
FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def site(self) -> str:
        return f"{Path(self.file).name}:{self.line}"

    @property
    def is_user(self) -> bool:
        return not any(m in self.file for m in LIBRARY_MARKERS)

    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()


@dataclass
class Thread:
    tid: str
    name: str
    state: str
    frames: list[Frame]
    """Innermost first."""


@dataclass
class RankStack:
    proc: ProcInfo
    method: str
    text: str
    threads: list[Thread] = field(default_factory=list)
    cpu: float | None = None
    """CPU use of the process during the dump window (1.0 = one core)."""
    error: str | None = None

    @property
    def main(self) -> Thread | None:
        for t in self.threads:
            if t.name == "MainThread" or t.tid == str(self.proc.pid):
                return t
        for t in self.threads:
            if t.frames and t.frames[-1].func == "<module>":
                return t
        return self.threads[0] if self.threads else None


@dataclass
class Activity:
    """Where one rank is: a category (collective, dataloader, lock, sleep, compute, idle, exited,
    unknown), the operation, and the user's line that led there."""

    category: str
    op: str
    site: str
    source: str = ""

    def describe(self) -> str:
        at = f" at {self.site}" if self.site else ""
        match self.category:
            case "collective":
                return f"wait in {self.op}{at}"
            case "dataloader":
                return f"is in the DataLoader ({self.op}){at}"
            case "lock":
                return f"waits on a lock ({self.op}){at}"
            case "sleep":
                return f"is sleeping{at}"
            case "compute":
                return f"is busy computing in {self.op}{at}"
            case "exited":
                return "has exited"
            case "idle":
                return f"is idle in {self.op}{at}"
        return f"has no stack ({self.op})" if self.op else "has no stack"


def parse_pyspy(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = PYSPY_THREAD.match(line)
        if m:
            threads.append(Thread(m["tid"], m["name"] or "", m["state"], []))
            continue
        f = PYSPY_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["func"], f["file"], int(f["line"])))
    return threads


def parse_pyspy_json(text: str) -> list[Thread]:
    """`py-spy dump --json`: a list of threads with `frames` (innermost first). Raises
    ValueError on anything else, so that the caller can fall back to the text form."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy --json did not print a list of threads")
    threads: list[Thread] = []
    for t in data:
        if not isinstance(t, dict):
            continue
        active, gil = bool(t.get("active")), bool(t.get("owns_gil"))
        state = ("active+gil" if gil else "active") if active else "idle"
        tid = t.get("os_thread_id") or t.get("thread_id") or ""
        frames = [
            Frame(str(f.get("name", "")), str(f.get("filename", "")), int(f.get("line") or 0))
            for f in t.get("frames") or []
            if isinstance(f, dict)
        ]
        threads.append(Thread(str(tid), str(t.get("thread_name") or ""), state, frames))
    # py-spy's text form lists the main thread first: dumps read the same either way
    threads.sort(key=lambda t: t.name != "MainThread")
    return threads


def pyspy_text(pid: int, threads: list[Thread]) -> str:
    """The threads in py-spy's own text form (what the HANG101 rule and people read in
    stacks/), headed by the process's command line as py-spy heads it."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        command = "?"
    lines = [f"Process {pid}: {command}", ""]
    for t in threads:
        lines.append(f'Thread {t.tid} ({t.state}): "{t.name}"')
        lines.extend(f"    {f.func} ({f.file}:{f.line})" for f in t.frames)
    return "\n".join(lines) + "\n"


def parse_faulthandler(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = FH_THREAD.match(line)
        if m:
            threads.append(Thread(m["tid"], "", "", []))
            continue
        f = FH_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["func"], f["file"], int(f["line"])))
    return threads


def classify(stack: RankStack) -> Activity:
    """Where the main thread of one rank is, from its frames, source lines and CPU use."""
    main = stack.main
    if main is None or not main.frames:
        return Activity("unknown", stack.error or "", "")
    user = next((f for f in main.frames if f.is_user), main.frames[0])
    site, source = user.site, user.source()
    busy = main.state.startswith("active") or (stack.cpu is not None and stack.cpu > 0.5)
    for f in main.frames:
        if "torch/distributed" in f.file and f.func in COLLECTIVES:
            return Activity("collective", f.func, site, source)
        if "torch/utils/data" in f.file:
            return Activity("dataloader", f.func, site, source)
        if f.func in ("_engine_run_backward", "backward") and "torch/" in f.file and not busy:
            return Activity("collective", "backward (gradient all-reduce)", site, source)
        if f.file.endswith(("threading.py", "queue.py")) and f.func in (
            "acquire",
            "wait",
            "get",
            "join",
            "_wait_for_tstate_lock",
        ):
            return Activity("lock", f"{Path(f.file).stem}.{f.func}", site, source)
        if f.is_user:
            break
    if SLEEP_CALL.search(source):
        return Activity("sleep", "sleep", site, source)
    if LOCK_CALL.search(source) and not busy:
        return Activity("lock", "acquire", site, source)
    if busy:
        return Activity("compute", main.frames[0].func, site, source)
    return Activity("idle", main.frames[0].func, site, source)


@dataclass
class HangDiagnosis:
    kind: str
    """collective-mismatch | missing-from-collective | stuck-collective | data-loading |
    deadlock | busy-compute | sleeping | unknown."""
    taxonomy_kind: str
    culprits: list[int]
    summary: str
    groups: list[tuple[list[str], str]]
    stacks: list[RankStack]
    notes: list[str] = field(default_factory=list)
    activities: dict[str, Activity] = field(default_factory=dict)
    """Where each rank (label) was: the facts the post-mortem engine reads back."""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "taxonomy_kind": self.taxonomy_kind,
            "culprit_ranks": self.culprits,
            "summary": self.summary,
            "groups": [{"who": who, "where": what} for who, what in self.groups],
            "methods": sorted({s.method for s in self.stacks}),
            "notes": self.notes,
            "activities": {
                label: {"category": a.category, "op": a.op, "site": a.site, "source": a.source}
                for label, a in self.activities.items()
            },
        }


def _who(labels: list[str]) -> str:
    ranks = [x.removeprefix("rank ") for x in labels if x.startswith("rank ")]
    others = [x for x in labels if not x.startswith("rank ")]
    parts = []
    if ranks:
        parts.append(("ranks " if len(ranks) > 1 else "rank ") + ",".join(ranks))
    parts.extend(others)
    return ", ".join(parts)


def _sort_key(label: str) -> tuple[int, str]:
    tail = label.removeprefix("rank ")
    return (int(tail), "") if tail.isdigit() else (1 << 30, label)


def diagnose_stacks(stacks: list[RankStack], missing: list[int] | None = None) -> HangDiagnosis:
    """Group ranks by activity (the live message) and let the diagnosis engine's hypotheses
    name the kind and the culprits from where every rank was: the same verdict the post-mortem
    `diagnose RUN_DIR` reaches, not a second one."""
    acts: dict[str, Activity] = {}
    for s in stacks:
        if s.proc.role in ("rank", "main"):
            acts[s.proc.label.replace(f"main pid {s.proc.pid}", f"pid {s.proc.pid}")] = classify(s)
    for r in missing or []:
        acts.setdefault(f"rank {r}", Activity("exited", "", ""))
    buckets: dict[tuple[str, str, str], list[str]] = {}
    for label in sorted(acts, key=_sort_key):
        a = acts[label]
        buckets.setdefault((a.category, a.op, a.site), []).append(label)
    ordered = sorted(buckets.items(), key=lambda kv: (-len(kv[1]), _sort_key(kv[1][0])))
    groups = [(labels, acts[labels[0]].describe()) for _, labels in ordered]
    summary = "; ".join(f"{_who(who)} {what}" for who, what in groups) or "no stacks collected"
    assessment = assess_stall(_rank_activities(acts), summary, HYPOTHESES)
    tax = assessment.rule.kind if assessment is not None else "hang"
    culprits = assessment.culprits if assessment is not None else []
    diag = HangDiagnosis(_pattern(buckets), tax, sorted(culprits), summary, groups, stacks)
    diag.activities = acts
    if assessment is not None:
        diag.notes.extend(assessment.fix)
    return diag


def _pattern(buckets: dict[tuple[str, str, str], list[str]]) -> str:
    """Where the ranks are, in one word: a description for the live message, not a verdict."""
    cats = {k[0] for k in buckets}
    in_coll = [k for k in buckets if k[0] == "collective"]
    if in_coll and len(in_coll) < len(buckets):
        return "missing-from-collective"
    if len(in_coll) > 1:
        return "collective-mismatch"
    if in_coll:
        return "stuck-collective"
    for category, name in (
        ("dataloader", "data-loading"),
        ("lock", "deadlock"),
        ("compute", "busy-compute"),
        ("sleep", "sleeping"),
    ):
        if category in cats:
            return name
    return "unknown"


def _rank_activities(acts: dict[str, Activity]) -> dict[int, StallActivity]:
    out: dict[int, StallActivity] = {}
    for label, a in acts.items():
        tail = label.removeprefix("rank ")
        if label.startswith("rank ") and tail.isdigit():
            out[int(tail)] = StallActivity(a.category, a.op, a.site, a.source)
    return out


# ------------------------------------------------------------------------- collection
def find_pyspy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def _pyspy(exe: str, pid: int, timeout_s: float) -> tuple[str, list[Thread], str | None]:
    """(dump text, threads, error): `py-spy dump --json` where py-spy has it (0.3.x and later),
    else its text form parsed."""
    for form in ("--json", None):
        args = [exe, "dump", "--full-filenames", "--pid", str(pid)] + ([form] if form else [])
        try:
            out = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return "", [], f"py-spy: {exc}"
        if out.returncode != 0:
            if form and "--json" in out.stderr:  # an old py-spy: "unexpected argument '--json'"
                continue
            # its first line says why; the Rust backtrace after it (`   0: anyhow::...`) would
            # read as Slurm-labelled task lines when `diagnose` reads the run folder
            why = next((x.strip() for x in out.stderr.splitlines() if x.strip()), "")
            return out.stdout, [], f"py-spy rc {out.returncode}: {why[:300]}"
        if form is None:
            return out.stdout, parse_pyspy(out.stdout), None
        try:
            threads = parse_pyspy_json(out.stdout)
        except ValueError as exc:
            return out.stdout, [], f"py-spy --json: {exc}"
        return pyspy_text(pid, threads), threads, None
    return "", [], "py-spy: no usable output"


def _faulthandler(
    proc: ProcInfo, stacks_dir: Path, armed_dir: Path | None
) -> tuple[str, str | None]:
    if armed_dir is None or not (armed_dir / str(proc.pid)).exists():
        return "", "faulthandler not armed in this process (no sitecustomize)"
    name = f"rank{proc.rank}" if proc.rank is not None else f"pid{proc.pid}"
    path = stacks_dir / f"{name}.txt"
    try:
        before = path.stat().st_size if path.exists() else 0
        os.kill(proc.pid, signal.SIGUSR1)
    except OSError as exc:
        return "", f"faulthandler: {exc}"
    deadline, size, stable = time.monotonic() + 3.0, before, 0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        new = path.stat().st_size if path.exists() else 0
        stable = stable + 1 if new == size and new > before else 0
        size = new
        if stable >= 2:
            break
    with path.open("rb") as fh:
        fh.seek(before)
        return fh.read().decode("utf-8", "replace"), None


def _is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (py-spy has nothing to read in srun)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return True  # cannot tell: let the dump try
    return "python" in exe or "pypy" in exe


def _cpu_times(pids: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def collect(
    procs: list[ProcInfo],
    stacks_dir: Path,
    method: str = "auto",
    armed_dir: Path | None = None,
    min_window_s: float = 0.3,
) -> list[RankStack]:
    """Dump every process in `procs` in parallel; write each rank's dump under `stacks_dir`."""
    exe = find_pyspy() if method in ("auto", "py-spy") else None
    pids = [p.pid for p in procs]
    t0, cpu0 = time.monotonic(), _cpu_times(pids)

    def one(proc: ProcInfo) -> RankStack:
        errors: list[str] = []
        if proc.role in ("agent", "main") and not _is_python(proc.pid):
            return RankStack(proc, "none", "", [], error="not a Python process (srun, a shell)")
        if exe is not None:
            text, threads, err = _pyspy(exe, proc.pid, 10.0)
            if err is None:
                return RankStack(proc, "py-spy", text, threads)
            errors.append(err)
        if method in ("auto", "faulthandler") and proc.role != "agent":
            text, err = _faulthandler(proc, stacks_dir, armed_dir)
            if err is None:
                return RankStack(proc, "faulthandler", text, parse_faulthandler(text))
            errors.append(err)
        return RankStack(proc, "none", "", [], error="; ".join(errors) or "no method")

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(procs)))) as pool:
        results = list(pool.map(one, procs))
    wait = min_window_s - (time.monotonic() - t0)
    if wait > 0:
        time.sleep(wait)
    dt, cpu1 = time.monotonic() - t0, _cpu_times(pids)
    for r in results:
        if r.proc.pid in cpu0 and r.proc.pid in cpu1:
            r.cpu = round((cpu1[r.proc.pid] - cpu0[r.proc.pid]) / dt, 3)
    return results


def write_dumps(
    stacks: list[RankStack],
    stacks_dir: Path,
    dump_no: int,
    when: str,
    redact: bool = True,
) -> None:
    """Append py-spy dumps to `stacks/<label>.txt` (faulthandler writes its own files). py-spy
    heads each dump with the process's command line (`--hub_token ...`): cleaned unless told."""
    for s in stacks:
        if s.method == "faulthandler":
            continue
        p = s.proc
        name = f"rank{p.rank}" if p.role == "rank" else f"{p.role}-{p.pid}"
        if p.role == "worker":
            name = f"rank{p.rank}-worker-{p.pid}"
        head = f"=== dump {dump_no} at {when} via {s.method} pid {p.pid} ({p.label})"
        if s.cpu is not None:
            head += f" cpu {s.cpu:.2f}"
        body = s.text if s.text else f"(no stack: {s.error})\n"
        text = clean_text(head + " ===\n" + body + "\n", redact)
        try:
            with (stacks_dir / f"{name}.txt").open("a", encoding="utf-8") as fh:
                fh.write(text)
        except OSError:
            continue


def render_hang(diag: HangDiagnosis, idle_s: float) -> str:
    """Plain text of one hang: summary, groups, then each rank's innermost user frames."""
    lines = [
        f"HANG: no progress for {idle_s:.0f} s ({diag.kind}; kind {diag.taxonomy_kind})",
        f"  {diag.summary}",
    ]
    if diag.culprits:
        lines.append("  odd one(s) out: rank " + ",".join(map(str, diag.culprits)))
    for s in diag.stacks:
        if s.proc.role not in ("rank", "main"):
            continue
        main = s.main
        top = " <- ".join(f"{f.func} ({f.site})" for f in (main.frames[:4] if main else []))
        lines.append(f"  {s.proc.label} [{s.method}, cpu {s.cpu}]: {top or s.error}")
    lines.extend(f"  note: {n}" for n in diag.notes)
    return "\n".join(lines)
