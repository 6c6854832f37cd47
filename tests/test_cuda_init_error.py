"""CUDA's initialization error: in a forked DataLoader worker (CUDA107), alone with nothing
that says where (CUDA113, suggested: most often the same fork), and in the main process's
own traceback (neither: a driver or installation problem). Contexts from the census, which
took them from real runs, and corpus case 762 (a report quoting the line alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths

ROOT = Path(__file__).resolve().parent.parent


def _census(entry_id: str) -> list[str]:
    for line in (ROOT / "census" / "messages.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["id"] == entry_id:
            return [*entry.get("context", []), entry["example"]]
    raise KeyError(entry_id)


@pytest.mark.parametrize(
    ("lines", "kind", "rule"),
    [
        (_census("cuda-err-init-worker"), "dataloader-cuda-fork", "CUDA107"),
        (["RuntimeError: CUDA error: initialization error"], "dataloader-cuda-fork", "CUDA113"),
    ],
)
def test_the_initialization_error_where_a_fork_is_possible(
    tmp_path: Path, lines: list[str], kind: str, rule: str
) -> None:
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    v = diagnose_paths([str(tmp_path)]).verdict
    assert (v.kind, v.rule) == (kind, rule)


def test_the_main_process_own_initialization_error_is_not_a_fork(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("\n".join(_census("cuda-err-init-main")) + "\n")
    v = diagnose_paths([str(tmp_path)]).verdict
    assert v.kind != "dataloader-cuda-fork"


def test_a_report_quoting_the_line_alone_gets_the_fork_as_a_guess() -> None:
    (case,) = (ROOT / "corpus" / "cases").glob("762-*")
    v = diagnose_paths([str(case / "logs")]).verdict
    assert (v.kind, v.rule) == ("dataloader-cuda-fork", "CUDA113")
    assert v.confidence < 0.9
