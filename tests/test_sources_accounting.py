"""Nothing silently missing: every input the user named and every entry a folder holds appears in
`sources` with a status and, when not read, the reason. Links to folders are followed once and
loops detected; unreadable folders, hidden entries and paths past PATH_MAX are listed as skipped.
Hidden entries inside a folder are skipped with the reason (a `.git` or editor backup folder is
not a log); named on the command line, a hidden file is read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analysis.diagnose import diagnose_inputs
from ddpdoctor.ingest.inputs import HIDDEN
from ddpdoctor.ingest.sources import expand_paths
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
TIMED = REAL / "timed-data-error" / "console.log"
HEALTHY = REAL / "healthy-plain" / "console.log"
PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096


def sources(*paths: str | Path) -> dict[str, Any]:
    """{path: source} of a diagnosis of `paths`, as the report lists them."""
    inputs, problems = expand_paths([str(p) for p in paths])
    report = diagnose_inputs(inputs, problems)
    return {s.path: s for s in report.sources}


def every_entry(top: Path) -> Iterator[str]:
    """Every path below `top`, links not followed: what a user sees with `find`."""
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            yield entry.path
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)


def accounted(path: str, listed: dict[str, Any]) -> bool:
    """A path is accounted for when it is listed, or lies inside a folder that is listed as
    skipped (its contents cannot be listed), or is a folder whose files are listed."""
    if path in listed:
        return True
    parts = Path(path).parents
    if any(str(p) in listed for p in parts):
        return True
    return os.path.isdir(path) and any(p.startswith(path + os.sep) for p in listed)


def test_a_link_to_a_folder_is_followed_once_and_a_loop_is_named(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "node0").mkdir(parents=True)
    shutil.copy(TIMED, logs / "node0" / "console.log")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(HEALTHY, outside / "rank1.log")
    os.symlink(outside, logs / "more")  # a link to a folder outside: followed
    os.symlink(logs / "node0", logs / "again")  # a second way to the same folder: read once
    os.symlink(logs, logs / "node0" / "up")  # back to an ancestor: a loop
    listed = sources(logs)
    assert listed[str(logs / "node0" / "console.log")].status == "read"
    assert listed[str(logs / "more" / "rank1.log")].status == "read"
    assert listed[str(logs / "again")].reason == f"same folder as {logs / 'node0'}, read once"
    assert listed[str(logs / "node0" / "up")].reason == f"symbolic link loop: back to {logs}"
    assert not [p for p in listed if "/again/" in p or "/up/" in p]  # nothing read twice
    for path in every_entry(logs):
        assert accounted(path, listed), path


def test_hidden_entries_are_listed_as_skipped_and_read_when_named(tmp_path: Path) -> None:
    shutil.copy(TIMED, tmp_path / "console.log")
    shutil.copy(HEALTHY, tmp_path / ".console.log.swp")
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    listed = sources(tmp_path)
    assert listed[str(tmp_path / ".console.log.swp")].reason == HIDDEN
    assert listed[str(tmp_path / ".git")].reason == HIDDEN
    assert not [p for p in listed if "/.git/" in p]  # the hidden folder is not entered
    named = sources(tmp_path / ".console.log.swp")
    assert named[str(tmp_path / ".console.log.swp")].status == "read"


def test_a_dangling_link_and_a_pipe_in_a_folder_are_listed(tmp_path: Path) -> None:
    shutil.copy(TIMED, tmp_path / "console.log")
    os.symlink(tmp_path / "gone.log", tmp_path / "rank1.log")
    os.mkfifo(tmp_path / "collector.fifo")
    listed = sources(tmp_path)
    assert listed[str(tmp_path / "rank1.log")].reason == "no such file"
    assert listed[str(tmp_path / "collector.fifo")].reason == "not a regular file"
    named = sources(tmp_path / "rank1.log")
    assert named[str(tmp_path / "rank1.log")].reason == (
        "cannot read: the symbolic link points to nothing"
    )


def _long_tree(top: Path) -> str:
    """Folders of 200-character names below `top` until the path passes PATH_MAX, made
    relative to open folders (the system refuses the long absolute path); the file at the
    bottom and the deepest folders lie beyond what any path can name."""
    fd = os.open(top, os.O_RDONLY)
    path = str(top)
    try:
        while len(path) < PATH_MAX + 400:
            name = "d" * 200
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            path += "/" + name
        log = os.open("console.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(log, TIMED.read_bytes())
        os.close(log)
    finally:
        os.close(fd)
    return path


def test_paths_past_path_max_are_listed_with_the_reason(tmp_path: Path) -> None:
    top = tmp_path / "logs"
    top.mkdir()
    shutil.copy(TIMED, top / "console.log")
    deepest = _long_tree(top)
    try:
        listed = sources(top)
        too_long = [s for p, s in listed.items() if s.status == "skipped"]
        assert len(too_long) == 1, listed
        assert too_long[0].reason == (
            "cannot read folder: path longer than the system allows (PATH_MAX)"
        )
        assert len(too_long[0].path) >= PATH_MAX - 200
        assert deepest.startswith(too_long[0].path)
        assert listed[str(top / "console.log")].status == "read"
        named = sources(deepest + "/console.log")
        assert next(iter(named.values())).reason == (
            "cannot read: path longer than the system allows (PATH_MAX)"
        )
    finally:
        shutil.rmtree(top / ("d" * 200))  # fd-relative removal copes with the long paths


def _diagnose_as_nobody(path: str) -> dict[str, Any]:
    """The real command run without root's power to read anything: the interpreter starts as
    root (it lives under /root), imports what it needs, then drops to nobody."""
    code = (
        "import os, sys\n"
        "import ddpdoctor.cli.main as cli, ddpdoctor.analysis.diagnose\n"
        "import ddpdoctor.report.render, ddpdoctor.report.to_json, ddpdoctor.report.view\n"
        "import ddpdoctor.report.problems, ddpdoctor.ingest.sources\n"
        # one diagnosis as root first: every module the command imports lazily is loaded
        "from click.testing import CliRunner\n"
        f"CliRunner().invoke(cli.cli, ['diagnose', '--format', 'json', {str(HEALTHY)!r}])\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        f"sys.argv = ['ddpdoctor', 'diagnose', '--format', 'json', {path!r}]\n"
        "cli.main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_an_unreadable_folder_is_listed_with_the_reason() -> None:
    top = Path(tempfile.mkdtemp(prefix="ddpdoctor-unreadable-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "node0").mkdir(mode=0o755)
        shutil.copy(TIMED, top / "node0" / "console.log")
        (top / "node0" / "console.log").chmod(0o644)
        secret = top / "node1"
        secret.mkdir()
        shutil.copy(HEALTHY, secret / "console.log")
        secret.chmod(0o000)
        if os.geteuid() == 0:
            report = _diagnose_as_nobody(str(top))
        else:
            proc = subprocess.run(
                [sys.executable, "-m", "ddpdoctor", "diagnose", "--format", "json", str(top)],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=False,
            )
            report = json.loads(proc.stdout)
        by_path = {s["path"]: s for s in report["sources"]}
        assert by_path[str(secret)]["status"] == "skipped"
        assert by_path[str(secret)]["reason"] == "cannot read folder: Permission denied"
        assert by_path[str(top / "node0" / "console.log")]["status"] == "read"
        assert report["verdict"]["kind"] == "data-error"
    finally:
        (top / "node1").chmod(0o755)
        shutil.rmtree(top)


@pytest.mark.parametrize("pattern", ["**/*.log", "node*/**", "**"])
def test_recursive_globs_follow_links_once_and_stop_at_loops(tmp_path: Path, pattern: str) -> None:
    (tmp_path / "node0" / "a").mkdir(parents=True)
    shutil.copy(TIMED, tmp_path / "node0" / "a" / "rank0.log")
    os.symlink(tmp_path / "node0", tmp_path / "node0" / "a" / "loop")
    listed = sources(f"{tmp_path}/{pattern}")
    assert listed[str(tmp_path / "node0" / "a" / "rank0.log")].status == "read"
    assert len([p for p in listed if p.endswith("rank0.log")]) == 1


def test_a_glob_over_a_folder_does_not_hide_the_rest_of_it(tmp_path: Path) -> None:
    """A recursive glob sees part of a tree; the same folder named next has all its files read."""
    (tmp_path / "node0").mkdir()
    shutil.copy(TIMED, tmp_path / "node0" / "console.log")
    (tmp_path / "node0" / "rank1.txt").write_text("step 1\n")
    os.symlink(tmp_path, tmp_path / "node0" / "up")
    inputs, problems = expand_paths([f"{tmp_path}/**/*.txt", str(tmp_path)])
    assert sorted(Path(i.path).name for i in inputs) == ["console.log", "rank1.txt"]
    assert [p.reason for p in problems] == [f"symbolic link loop: back to {tmp_path}"]
