"""Shared scaffolding of the real-run sets of programs the rules were not built from
(tests/test_{third,spawn,fourth,fifth,sixth}_style_runs.py): each mode's fixture folder,
its cached diagnosis, the strict xfails of known misses, and the checks every set makes of its
fixtures. File order is checked for every real fixture by tests/test_order_invariance.py."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.model.findings import Report
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"

Expected = tuple[str, str | None, list[int]]
"""(status, kind, culprit ranks) a mode's run must be diagnosed with."""


@dataclass(frozen=True)
class RunSet:
    prefix: str
    """Fixture folders are tests/fixtures/real/<prefix><mode>."""
    expected: dict[str, Expected]
    misses: dict[str, str] = field(default_factory=dict)
    """mode -> what ddpdoctor says instead today (a strict xfail: fixing it fails the test)."""
    label_nowhere: bool = False
    """The mode's name appears in no fixture file in any form (sets whose mode names are no
    words torch itself prints)."""

    def folder(self, mode: str) -> Path:
        return REAL / f"{self.prefix}{mode}"

    def files(self, mode: str) -> list[Path]:
        return sorted(p for p in self.folder(mode).rglob("*") if p.is_file())

    def report(self, mode: str) -> Report:
        return _diagnosed(str(self.folder(mode)))

    def params(self) -> list[object]:
        return [
            pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=self.misses[m]))
            if m in self.misses
            else m
            for m in self.expected
        ]

    def check_verdict(self, mode: str) -> None:
        verdict = self.report(mode).verdict
        got = (verdict.status, verdict.kind, verdict.culprit.ranks)
        assert got == self.expected[mode], (verdict.rule, verdict.summary)

    def check_fixture(self, mode: str) -> None:
        """Small, paths rewritten, and the program's --mode never in its output: the diagnosis
        must read the failure, not the test's label (torch's own texts may use the words)."""
        files = self.files(mode)
        assert files
        assert sum(f.stat().st_size for f in files) < 200_000
        label = mode.removeprefix("legacy-")
        for f in files:
            text = f.read_text(errors="replace")
            assert "/work/" not in text, f
            assert f"--mode {label}" not in text and f"mode={label}" not in text, f
            assert not self.label_nowhere or mode not in text, f

    def names(self, mode: str) -> list[str]:
        """The fixture's files, as paths relative to its folder (a job folder's user_logs/ and
        system_logs/ files, not one console)."""
        return [f.relative_to(self.folder(mode)).as_posix() for f in self.files(mode)]

    def text(self, mode: str, name: str) -> str:
        """One file of the fixture, by its path relative to the folder."""
        return (self.folder(mode) / name).read_text(errors="replace")

    def console(self, mode: str) -> str:
        return (self.folder(mode) / "console.log").read_text(errors="replace")

    def agent_exits(self, mode: str) -> list[tuple[str, str]]:
        """(exit code, local rank) of each failed worker the torchrun agent reported."""
        return re.findall(r"\] failed \(exitcode: (-?\d+)\) local_rank: (\d+)", self.console(mode))

    def check_console_or_two_nodes(self, mode: str, two_nodes: set[str]) -> None:
        """check_fixture, then one console.log (the launch label never in it) or, for a mode
        on two simulated nodes, check_two_agents."""
        self.check_fixture(mode)
        if mode in two_nodes:
            self.check_two_agents(mode)
            return
        names = [f.relative_to(self.folder(mode)).as_posix() for f in self.files(mode)]
        assert names == ["console.log"], names
        assert "MT_CASE" not in self.console(mode)

    def check_two_agents(self, mode: str) -> None:
        """Two agents as two nodes: each node's console is its own file, and node 1's
        processes are ranks 2 and 3."""
        names = sorted(f.name for f in self.files(mode))
        assert names == ["node0.log", "node1.log"], names
        node1 = (self.folder(mode) / "node1.log").read_text(errors="replace")
        assert re.search(r"rank\s*: [23] \(local_rank: [01]\)", node1), node1[-2000:]


@functools.cache
def _diagnosed(folder: str) -> Report:
    return diagnose_paths([folder])
