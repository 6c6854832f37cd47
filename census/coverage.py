"""The census of upstream messages (census/messages.jsonl): loading it, checking each entry
against the knowledge base the way the scanner confirms a line, and writing the coverage page
(docs/census.md). It reads the rules and never changes them.

Run `python census/coverage.py` (or `make census`) to rewrite the page; `--check` only says
whether the page is current."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.ingest.prefixes import parse_line
from ddpdoctor.model.taxonomy import KINDS
from ddpdoctor.rules.base import Rule
from ddpdoctor.rules.registry import all_rules

REPO = Path(__file__).resolve().parents[1]
CENSUS = REPO / "census" / "messages.jsonl"
PAGE = REPO / "docs" / "census.md"

REQUIRED = ("id", "pattern", "example", "source", "versions", "kind", "rule", "notes")
OPTIONAL = ("context", "gap")
NON_FAILURE = ("benign", "context")
ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# one package and the versions it was read in: "torch>=2.5,<=2.13", "nccl==2.30.7";
# several joined by "; " when a message carries another package's text
ONE_VERSION = r"[a-z][a-z0-9_.-]*(?:==[\w.+-]+|>=[\w.+-]+(?:,<=[\w.+-]+)?|<=[\w.+-]+)"
VERSIONS = re.compile(rf"{ONE_VERSION}(?:; {ONE_VERSION})*")
# placeholders as the sources write them: {name}, {}, ${name} (Python, fmt, Template) and %s,
# %(name)s, %.1f, %lu, %0*lx (printf, logging), %m and %ps/%pGg (Slurm, the kernel), %R
# (CPython), %v and %q (Go); `{{`, `}}` and `%%` stand for themselves
PLACEHOLDER = re.compile(
    r"\{\{|\}\}|%%|\$?\{[^{}]*\}|%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|z|j|t|L)?(?:p[A-Za-z]*|[diouxXeEfgGcrsamRvq])"
)
LITERAL = {"{{": "{", "}}": "}", "%%": "%"}


class CensusError(ValueError):
    """The census file cannot be read as census entries."""


@dataclass(frozen=True)
class Message:
    """One upstream message: its format, one line as the software prints it, and what it
    means to ddpdoctor (a taxonomy kind and the rule that must recognise it, or benign/context).
    `context` holds the lines the same writer prints just before the example (a traceback)
    for rules that look at them; `gap` marks a known miss (a strict xfail) and says why."""

    id: str
    pattern: str
    example: str
    source: str
    versions: str
    kind: str
    rule: str | None
    notes: str
    context: tuple[str, ...] = ()
    gap: str | None = None
    line: int = 0

    @property
    def package(self) -> str:
        return self.source.split(" ", 1)[0]

    @property
    def area(self) -> str:
        """The package, and for torch the part of it that prints the message."""
        if self.package != "torch":
            return self.package
        path = self.source.split("; ")[0].split(" ")[-1]
        for prefix, name in TORCH_AREAS:
            if path.startswith(prefix):
                return f"torch ({name})"
        return "torch (other)"


TORCH_AREAS = (
    ("torch/distributed/elastic", "elastic agent, launcher"),
    ("torch/distributed/run.py", "elastic agent, launcher"),
    ("torch/distributed/launch", "elastic agent, launcher"),
    ("torch/distributed/fsdp", "FSDP"),
    ("torch/distributed/tensor", "DTensor"),
    ("torch/distributed/device_mesh", "DTensor"),
    ("torch/distributed/checkpoint", "distributed checkpoint"),
    ("torch/csrc/distributed/c10d/reducer", "DDP reducer"),
    ("torch/csrc/distributed/c10d/comm", "DDP reducer"),
    ("torch/nn/parallel", "DDP reducer"),
    ("torch/csrc/distributed/c10d/ProcessGroupNCCL", "ProcessGroupNCCL"),
    ("torch/csrc/distributed/c10d/NCCLUtils", "ProcessGroupNCCL"),
    ("torch/csrc/distributed/c10d/ProcessGroupGloo", "ProcessGroupGloo"),
    ("torch/lib/c10d/ProcessGroupNCCL", "ProcessGroupNCCL"),
    ("torch/lib/c10d/Utils", "TCPStore, sockets"),
    ("torch/csrc/distributed/c10d/TCPStore", "TCPStore, sockets"),
    ("torch/csrc/distributed/c10d/socket", "TCPStore, sockets"),
    ("torch/csrc/distributed/c10d", "c10d"),
    ("torch/distributed", "c10d"),
    ("third_party/gloo", "ProcessGroupGloo"),
    ("torch/utils/data", "torch.utils.data"),
    ("torch/csrc/DataLoader.cpp", "torch.utils.data"),
    ("torch/_utils.py", "torch.utils.data"),
    ("aten/src/ATen/MapAllocator.cpp", "torch.utils.data"),
    ("torch/multiprocessing", "torch.multiprocessing"),
    ("torch/cuda", "torch.cuda, caching allocator"),
    ("c10/cuda", "torch.cuda, caching allocator"),
    ("aten/src/ATen/native/cuda", "torch.cuda, caching allocator"),
    ("torch/serialization.py", "torch.load/save"),
    ("torch/_weights_only_unpickler.py", "torch.load/save"),
    ("caffe2/serialize", "torch.load/save"),
    ("torch/nn/modules/module.py", "torch.load/save"),
)


def load(path: Path = CENSUS) -> list[Message]:
    """Every entry of the census, in file order; a malformed line is a CensusError naming it."""
    out: list[Message] = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise CensusError(f"{path.name}:{number}: not JSON ({e.msg})") from None
        if not isinstance(raw, dict):
            raise CensusError(f"{path.name}:{number}: an entry is a JSON object")
        missing = [f for f in REQUIRED if f not in raw]
        unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
        if missing or unknown:
            raise CensusError(f"{path.name}:{number}: missing {missing}, unknown {unknown}")
        context = raw.get("context", [])
        if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
            raise CensusError(f"{path.name}:{number}: context is a list of lines")
        strings = [raw[f] for f in REQUIRED if f != "rule"] + [raw.get("gap") or ""]
        if not all(isinstance(s, str) for s in strings) or not (
            raw["rule"] is None or isinstance(raw["rule"], str)
        ):
            raise CensusError(f"{path.name}:{number}: fields are strings (rule may be null)")
        out.append(
            Message(
                id=raw["id"],
                pattern=raw["pattern"],
                example=raw["example"],
                source=raw["source"],
                versions=raw["versions"],
                kind=raw["kind"],
                rule=raw["rule"],
                notes=raw["notes"],
                context=tuple(context),
                gap=raw.get("gap"),
                line=number,
            )
        )
    return out


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """The pattern as a regex: its literal text in order, any text for each placeholder."""
    parts: list[str] = []
    pos = 0
    for m in PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[pos : m.start()]))
        token = m.group(0)
        parts.append(re.escape(LITERAL[token]) if token in LITERAL else ".*?")
        pos = m.end()
    parts.append(re.escape(pattern[pos:]))
    return re.compile("".join(parts))


def problems(msg: Message, rules: dict[str, Rule]) -> list[str]:
    """What is wrong with one entry as data (not whether the rules recognise it)."""
    out: list[str] = []
    if not ID.fullmatch(msg.id):
        out.append(f"id {msg.id!r} is not kebab-case")
    for name in ("pattern", "example", "source", "notes"):
        value = getattr(msg, name)
        if not value.strip() or "\n" in value:
            out.append(f"{name} is empty or spans lines")
    if len(msg.source.split(" ")) < 3:
        out.append("source names the package, its version and the file")
    if not VERSIONS.fullmatch(msg.versions):
        out.append(f"versions {msg.versions!r} is not like 'torch>=2.5,<=2.13'")
    if msg.kind not in KINDS and msg.kind not in NON_FAILURE:
        out.append(f"kind {msg.kind!r} is neither a taxonomy kind nor benign/context")
    rule = rules.get(msg.rule) if msg.rule else None
    if msg.rule and rule is None:
        out.append(f"rule {msg.rule} does not exist")
    if msg.kind == "benign" and msg.rule:
        out.append("a benign message names no rule")
    if rule is not None and msg.kind in KINDS and rule.kind != msg.kind:
        out.append(f"rule {rule.code} is of kind {rule.kind}, not {msg.kind}")
    if rule is not None and msg.kind == "context" and rule.severity == "error":
        out.append(f"a context message names an error rule ({rule.code})")
    if msg.kind in KINDS and msg.rule is None and not msg.gap:
        out.append("a failure message without a rule must say why (gap)")
    if msg.gap is not None and not msg.gap.strip():
        out.append("gap is empty")
    if not pattern_regex(msg.pattern).search(msg.example):
        out.append("the example does not follow the pattern")
    return out


def claimants(msg: Message, rules: tuple[Rule, ...] | None = None) -> list[Rule]:
    """Rules whose signatures confirm the example as the scanner does: on the line without its
    prefixes (or, failing that, the raw line), with the context conditions checked on the
    writer's lines before it."""
    parsed = parse_line(msg.example)
    context_text = "\n".join(parse_line(c).text for c in msg.context)
    context_text += "\n" + parsed.text
    out = []
    for rule in rules if rules is not None else all_rules():
        if not rule.signatures:
            continue
        if not (rule.match(parsed.text) or rule.match(msg.example)):
            continue
        if rule.context_ok(context_text):
            out.append(rule)
    return out


def winners(msg: Message) -> list[Rule]:
    """The rules a diagnosis keeps for this line: the most specific of its claimants."""
    found = claimants(msg)
    if not found:
        return []
    top = max(r.specificity for r in found)
    return [r for r in found if r.specificity == top]


def verdict(msg: Message) -> tuple[bool, str]:
    """(as expected, what happened) for one entry."""
    won = winners(msg)
    codes = ", ".join(r.code for r in won) or "no rule"
    if msg.kind in KINDS:
        if msg.rule is not None:
            ok = any(r.code == msg.rule for r in won) and all(r.kind == msg.kind for r in won)
        else:
            ok = bool(won) and all(r.kind == msg.kind for r in won)
        return ok, codes
    found = claimants(msg)
    # the diagnosis keeps one rule per line, the most specific (analysis/grouping.py): an
    # error rule that also matches but loses the line to a warning or info rule reads nothing
    errors = [r for r in won if r.severity == "error"]
    if errors:
        return False, "error rule " + ", ".join(r.code for r in errors)
    if msg.rule is not None:
        return any(r.code == msg.rule for r in won), codes
    if msg.kind == "context" and found:
        # context that no rule should read: a warning or info rule claiming it is a misreading
        return False, "rule " + ", ".join(r.code for r in found)
    return True, codes


# --- the coverage page -----------------------------------------------------------------


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def coverage_markdown(messages: list[Message]) -> str:
    """docs/census.md: counts per source and per kind, then every message a rule does not
    (yet) recognise."""
    results = {m.id: verdict(m) for m in messages}
    failure = [m for m in messages if m.kind in KINDS]
    mapped = [m for m in failure if results[m.id][0]]
    lines = [
        "# Census of upstream messages",
        "",
        "Generated by `make census` from `census/messages.jsonl`; do not edit by hand.",
        "",
        "Each entry is one message format printed around distributed training failures by "
        "the packages below, read in their sources (Python code, strings of compiled "
        "libraries, source repositories), with one example line in the software's format. "
        "A message of a failure kind is *mapped* when the rule named for it is the one a "
        "diagnosis keeps for the example line (its signatures match, context conditions hold, "
        "no more specific rule of another kind claims it). `benign` and `context` messages "
        "must not be claimed by any rule of severity `error`.",
        "",
        f"- messages: {len(messages)}",
        f"- of a failure kind: {len(failure)}, mapped: {len(mapped)}, "
        f"known gaps: {sum(1 for m in failure if m.gap)}",
        f"- context: {sum(1 for m in messages if m.kind == 'context')}, "
        f"benign: {sum(1 for m in messages if m.kind == 'benign')}",
        f"- rules named: {len({m.rule for m in messages if m.rule})}",
        "",
        "## Per source",
        "",
    ]
    by_area: dict[str, list[Message]] = defaultdict(list)
    for m in messages:
        by_area[m.area].append(m)
    rows = []
    for area in sorted(by_area):
        group = by_area[area]
        fail = [m for m in group if m.kind in KINDS]
        rows.append(
            [
                area,
                str(len(group)),
                str(len(fail)),
                str(sum(1 for m in fail if results[m.id][0])),
                str(sum(1 for m in group if m.kind == "context")),
                str(sum(1 for m in group if m.kind == "benign")),
                str(sum(1 for m in fail if not results[m.id][0])),
            ]
        )
    lines += _table(
        rows, ["source", "messages", "failure kind", "mapped", "context", "benign", "unmapped"]
    )
    lines += ["", "## Per kind", ""]
    by_kind = Counter(m.kind for m in messages)
    rows = []
    for kind in sorted(by_kind, key=lambda k: (k in NON_FAILURE, k)):
        group = [m for m in messages if m.kind == kind]
        ok = sum(1 for m in group if results[m.id][0])
        codes = sorted({m.rule for m in group if m.rule})
        rows.append([kind, str(len(group)), str(ok), ", ".join(codes)])
    lines += _table(rows, ["kind", "messages", "as expected", "rules"])
    silent = sorted(KINDS - set(by_kind))
    lines += [
        "",
        "Kinds with no message of their own (inferred from how ranks behaved): "
        + (", ".join(silent) if silent else "none")
        + ".",
        "",
        "## Unmapped",
        "",
    ]
    missed = [m for m in messages if not results[m.id][0]]
    if not missed:
        lines.append("None: every message is recognised as listed.")
    else:
        rows = [
            [
                f"`{m.id}`",
                m.kind,
                m.rule or "-",
                _cell(results[m.id][1]),
                _cell(m.gap or "not a known gap"),
                _cell(m.example[:120]),
            ]
            for m in missed
        ]
        lines += _table(rows, ["id", "kind", "rule", "matched by", "why", "example"])
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    messages = load()
    page = coverage_markdown(messages)
    if "--check" in argv:
        current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
        if current != page:
            print(f"{PAGE.relative_to(REPO)} is stale: run `make census`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)} ({len(messages)} messages)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
