"""Scoreboard of the diagnosis on the labelled real corpus, per split.

Cases: ../shared/corpus (the cases the rules were first built from: training) and
corpus/cases (re-enacted public reports). A case's split is fixed by its thread, before any
tuning: validation when sha256 of the thread key (github:owner/repo#N) is 0 mod 3, training
otherwise; a label may move a case to training ("split": "train", with "split_reason") when a
rule was added for it, and says so.

Metrics per split: kind, category, culprit (where labelled), culprit with the right kind, fix
mentioned (a label's fix_keywords found in the verdict's fix, summary or next steps) and false
infrastructure blame (category infrastructure where the label says otherwise), status (ok,
failed, hung, slow as labelled) and false OK (a failed, hung or slow job called OK: the worst
answer, the user stops looking).

    python corpus/scoreboard.py [--split train|validation] [--misses] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "corpus"
CASES = HERE / "cases"
VALIDATION_MOD = 3


def thread_key(url: str) -> str:
    """The thread a case comes from, as ../shared/tools/excluded keys it."""
    m = re.match(
        r"https?://(?:www\.)?github\.com/([^/]+)/([^/]+)/(?:issues|pull|discussions)/(\d+)",
        url.strip(),
        re.I,
    )
    if m:
        return f"github:{m.group(1).lower()}/{m.group(2).lower()}#{m.group(3)}"
    return url.strip().lower().split("#")[0].rstrip("/")


def split_of(label: dict[str, object], shared: bool) -> str:
    if shared or label.get("split") == "train":
        return "train"
    digest = hashlib.sha256(thread_key(str(label.get("source_url", ""))).encode()).hexdigest()
    return "validation" if int(digest, 16) % VALIDATION_MOD == 0 else "train"


@dataclass
class Case:
    path: Path
    label: dict[str, object]
    split: str

    @property
    def name(self) -> str:
        return self.path.name


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for base, shared in ((SHARED, True), (CASES, False)):
        if not base.is_dir():
            continue
        for path in sorted(base.iterdir()):
            label_file = path / "label.json"
            if label_file.is_file():
                label = json.loads(label_file.read_text(encoding="utf-8"))
                cases.append(Case(path, label, split_of(label, shared)))
    return cases


@dataclass
class Score:
    case: str
    split: str
    want: str | None
    got: str | None
    status: str
    kind_ok: bool
    category_ok: bool
    culprit_graded: bool
    culprit_ok: bool
    fix_graded: bool
    fix_ok: bool
    false_infra: bool
    status_graded: bool = False
    """The label says how the job ended (../shared/corpus labels do not)."""
    status_ok: bool = False
    false_ok: bool = False
    """The label says the job failed, hung or crawled; the verdict says OK."""
    ranks: list[int] = field(default_factory=list)
    want_ranks: list[int] | None = None


def score(case: Case) -> Score:
    from ddpdoctor.analysis.diagnose import diagnose_paths

    label = case.label
    report = diagnose_paths([str(case.path / "logs")])
    v = report.verdict
    want_kind = label.get("kind")
    accept = list(label.get("kind_accept") or ([want_kind] if want_kind else []))  # type: ignore[arg-type]
    healthy = want_kind is None
    kind_ok = (v.status == "ok" and v.kind is None) if healthy else v.kind in accept
    want_ranks = label.get("culprit_ranks")
    graded = isinstance(want_ranks, list)
    culprit_ok = graded and sorted(v.culprit.ranks) == sorted(want_ranks)  # type: ignore[arg-type]
    keywords = [str(k).lower() for k in label.get("fix_keywords") or []]  # type: ignore[union-attr]
    said = " ".join([*v.fix, v.summary, *v.next_steps]).lower()
    return Score(
        case=case.name,
        split=case.split,
        want=str(want_kind) if want_kind else None,
        got=v.kind,
        status=v.status,
        kind_ok=kind_ok,
        category_ok=v.category == label.get("category"),
        culprit_graded=graded,
        culprit_ok=culprit_ok,
        fix_graded=bool(keywords),
        fix_ok=any(k in said for k in keywords),
        false_infra=v.category == "infrastructure" and label.get("category") != "infrastructure",
        status_graded="status" in label,
        status_ok=v.status == label.get("status"),
        false_ok="status" in label and v.status == "ok" and label.get("status") != "ok",
        ranks=list(v.culprit.ranks),
        want_ranks=want_ranks if graded else None,  # type: ignore[arg-type]
    )


def totals(scores: list[Score]) -> dict[str, object]:
    graded = [s for s in scores if s.culprit_graded]
    fixes = [s for s in scores if s.fix_graded]
    return {
        "cases": len(scores),
        "kind": sum(s.kind_ok for s in scores),
        "category": sum(s.category_ok for s in scores),
        "culprit_graded": len(graded),
        "culprit": sum(s.culprit_ok for s in graded),
        "culprit_with_kind": sum(s.culprit_ok and s.kind_ok for s in graded),
        "fix_graded": len(fixes),
        "fix": sum(s.fix_ok for s in fixes),
        "false_infra": sum(s.false_infra for s in scores),
        "status_graded": sum(s.status_graded for s in scores),
        "status": sum(s.status_ok for s in scores),
        "false_ok": sum(s.false_ok for s in scores),
    }


def _pct(n: object, d: object) -> str:
    return f"{n}/{d} ({100 * int(n) / int(d):.0f}%)" if int(d) else f"{n}/{d}"  # type: ignore[call-overload]


def render(scores: list[Score], show_misses: bool) -> str:
    lines: list[str] = []
    for split in ("train", "validation"):
        part = [s for s in scores if s.split == split]
        if not part:
            continue
        t = totals(part)
        lines.append(
            f"{split:<10} cases {t['cases']}  kind {_pct(t['kind'], t['cases'])}  "
            f"category {_pct(t['category'], t['cases'])}  "
            f"culprit {_pct(t['culprit'], t['culprit_graded'])}  "
            f"culprit+kind {_pct(t['culprit_with_kind'], t['culprit_graded'])}  "
            f"fix {_pct(t['fix'], t['fix_graded'])}  false-infra {t['false_infra']}  "
            f"status {_pct(t['status'], t['status_graded'])}  false-OK {t['false_ok']}"
        )
        by_kind: dict[str, list[Score]] = {}
        for s in part:
            by_kind.setdefault(s.want or "(healthy)", []).append(s)
        lines.append(f"  {'kind':<32} {'ok':>7}")
        for kind, group in sorted(by_kind.items()):
            lines.append(f"  {kind:<32} {sum(s.kind_ok for s in group):>3}/{len(group):<3}")
        if show_misses:
            for s in part:
                if not s.kind_ok or (s.culprit_graded and not s.culprit_ok):
                    culprit = (
                        f" culprit {s.ranks} want {s.want_ranks}"
                        if s.culprit_graded and not s.culprit_ok
                        else ""
                    )
                    lines.append(
                        f"  MISS {s.case}: want {s.want} got {s.got} ({s.status}){culprit}"
                    )
    return "\n".join(lines)


def markdown(scores: list[Score]) -> str:
    """The scoreboard as a page: totals per split, per kind, and every miss."""
    out = [
        "# Corpus scoreboard",
        "",
        "Generated by `make scoreboard` (corpus/scoreboard.py); do not edit by hand.",
        "",
        "| split | cases | kind | category | culprit | culprit+kind | fix mentioned "
        "| false infra | status | false OK |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for split in ("train", "validation"):
        t = totals([s for s in scores if s.split == split])
        out.append(
            f"| {split} | {t['cases']} | {_pct(t['kind'], t['cases'])} | "
            f"{_pct(t['category'], t['cases'])} | {_pct(t['culprit'], t['culprit_graded'])} | "
            f"{_pct(t['culprit_with_kind'], t['culprit_graded'])} | "
            f"{_pct(t['fix'], t['fix_graded'])} | {t['false_infra']} | "
            f"{_pct(t['status'], t['status_graded'])} | {t['false_ok']} |"
        )
    kinds = sorted({s.want or "(healthy)" for s in scores})
    out += [
        "",
        "## Per kind (kind right / cases)",
        "",
        "| kind | train | validation |",
        "|---|---|---|",
    ]
    for kind in kinds:
        cells = []
        for split in ("train", "validation"):
            group = [s for s in scores if s.split == split and (s.want or "(healthy)") == kind]
            cells.append(f"{sum(s.kind_ok for s in group)}/{len(group)}" if group else "")
        out.append(f"| {kind} | {cells[0]} | {cells[1]} |")
    for split in ("train", "validation"):
        out += ["", f"## Misses ({split})", ""]
        for s in scores:
            if s.split == split and (not s.kind_ok or (s.culprit_graded and not s.culprit_ok)):
                culprit = (
                    f"; culprit {s.ranks}, labelled {s.want_ranks}"
                    if s.culprit_graded and not s.culprit_ok
                    else ""
                )
                out.append(f"- `{s.case}`: labelled {s.want}, got {s.got} ({s.status}){culprit}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=["train", "validation"], default=None)
    parser.add_argument("--misses", action="store_true", help="list every miss")
    parser.add_argument("--json", default=None, help="write every case's score to this file")
    parser.add_argument("--markdown", default=None, help="write the scoreboard page here")
    args = parser.parse_args(argv)
    cases = [c for c in load_cases() if args.split is None or c.split == args.split]
    scores = [score(c) for c in cases]
    print(render(scores, args.misses))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(s) for s in scores], indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(scores), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
