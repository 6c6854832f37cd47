"""Scoreboard on the real corpus (../shared/corpus): kind, category and culprit ranks against
the labels. Prints the table; the thresholds may never fall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from tests.conftest import corpus_cases

KIND_MIN = 0.90
CULPRIT_MIN = 0.90
# Measured on 2026-11-30: 28/29 kinds. Raise it when the tool improves; never lower it.
KIND_FLOOR = 28


def score(case: Path) -> dict[str, object]:
    label = json.loads((case / "label.json").read_text())
    report = diagnose_paths([str(case / "logs")])
    v = report.verdict
    accept = label.get("kind_accept") or [label["kind"]]
    want_ranks = label.get("culprit_ranks")
    return {
        "case": case.name,
        "want": label["kind"],
        "got": v.kind,
        "kind_ok": v.kind in accept,
        "category_ok": v.category == label["category"],
        "culprit_graded": want_ranks is not None,
        "culprit_ok": want_ranks is None or sorted(v.culprit.ranks) == sorted(want_ranks),
        "ranks": v.culprit.ranks,
        "want_ranks": want_ranks,
    }


def test_corpus_scoreboard(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [score(c) for c in corpus_cases()]
    kind_ok = sum(bool(r["kind_ok"]) for r in rows)
    cat_ok = sum(bool(r["category_ok"]) for r in rows)
    graded = [r for r in rows if r["culprit_graded"]]
    culprit_ok = sum(bool(r["culprit_ok"]) for r in graded)
    with capsys.disabled():
        print(f"\n{'case':<62} {'kind':<5} {'cat':<4} {'culprit':<8} got")
        for r in rows:
            print(
                f"{r['case']:<62} {'ok' if r['kind_ok'] else 'MISS':<5} "
                f"{'ok' if r['category_ok'] else '-':<4} "
                f"{('ok' if r['culprit_ok'] else 'MISS') if r['culprit_graded'] else '':<8} "
                f"{r['got']} {r['ranks']}"
            )
        print(
            f"kind {kind_ok}/{len(rows)}  category {cat_ok}/{len(rows)}  "
            f"culprit {culprit_ok}/{len(graded)}"
        )
    assert kind_ok >= KIND_FLOOR
    assert kind_ok / len(rows) >= KIND_MIN
    assert culprit_ok / len(graded) >= CULPRIT_MIN
