"""Fuzzing `diagnose` with mutated real logs, run folders, error files and special files: zero
internal errors (no exception escapes, no exit 3) and, for --format json, valid UTF-8 JSON in the
report contract on stdout. `make test` runs a few hundred derandomized examples; `make fuzz`
(DDPDOCTOR_FUZZ=full) thousands with fresh randomness."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.cli.main import cli
from tests.fuzzing import (
    ERROR_FILES,
    FLIGHT_CAPTURES,
    RUN_FOLDERS,
    SPECIAL,
    add_special,
    encoded,
    mutated,
    mutated_json_lines,
    real_text,
)

FULL = os.environ.get("DDPDOCTOR_FUZZ") == "full"
# `make test` runs a small deterministic tier (it must stay under 15 minutes); `make fuzz`, which
# CI (.ci/run) runs too, the thousands
SETTINGS = settings(
    max_examples=3000 if FULL else 40,
    deadline=None,
    derandomize=not FULL,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SMALL = settings(SETTINGS, max_examples=1000 if FULL else 15)


def diagnose(*args: str) -> Any:
    """The `diagnose` command in process; fails on anything but a clean exit 0, 1 or 2 with a
    valid report (or, for 2, a reason on stderr)."""
    result = CliRunner().invoke(
        cli, ["diagnose", "--format", "json", "--pipe-wait", "0.2", "-j", "1", *args]
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        assert "ddpdoctor:" in result.stderr
        return None
    report = json.loads(result.stdout_bytes.decode("utf-8"))
    assert report["schema"] == "ddpdoctor.report/v1"
    assert report["verdict"]["status"] in ("failed", "hung", "slow", "ok", "unknown")
    for source in report["sources"]:
        assert source["status"] in ("read", "partial", "skipped")
        assert source["status"] == "read" or source["reason"]
    return report


@SETTINGS
@given(data=st.data())
def test_mutated_real_logs(data: st.DataObject) -> None:
    text = data.draw(real_text())
    name, raw = data.draw(encoded(data.draw(mutated(text))))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(raw)
        diagnose(str(path))


@SMALL
@given(data=st.data(), special=st.lists(st.sampled_from(SPECIAL), max_size=3, unique=True))
def test_mutated_run_folders(data: st.DataObject, special: list[str]) -> None:
    seed = data.draw(st.sampled_from(RUN_FOLDERS))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(seed, run)
        events = run / "events.jsonl"
        events.write_bytes(data.draw(mutated_json_lines(events.read_text())))
        logs = sorted(p for p in run.rglob("*.log") if p.is_file())
        if logs and data.draw(st.booleans()):
            victim = data.draw(st.sampled_from(logs))
            victim.write_bytes(data.draw(mutated(victim.read_bytes())))
        stacks = sorted((run / "stacks").glob("*")) if (run / "stacks").is_dir() else []
        if stacks and data.draw(st.booleans()):
            data.draw(st.sampled_from(stacks)).unlink()
        for kind in special:
            add_special(run, kind)
        diagnose(str(run))


@SMALL
@given(data=st.data())
def test_mutated_error_files(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(ERROR_FILES, run)
        for error_file in sorted(run.rglob("error.json")):
            if data.draw(st.booleans()):
                line = json.dumps(json.loads(error_file.read_text()))
                error_file.write_bytes(data.draw(mutated_json_lines(line)))
        diagnose(str(run))


@SMALL
@given(data=st.data(), special=st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=4))
def test_special_files_named_and_in_folders(data: st.DataObject, special: list[str]) -> None:
    """FIFOs without a writer, dangling links, link loops, binary, empty and unreadable
    entries, named on the command line or met in a folder, next to a real log."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "console.log").write_bytes(data.draw(real_text()))
        for kind in dict.fromkeys(special):
            add_special(folder, kind)
        named = [str(p) for p in sorted(folder.iterdir())]
        chosen = data.draw(st.lists(st.sampled_from(named), min_size=1, max_size=3))
        diagnose(*chosen)
        diagnose(str(folder))


@SMALL
@given(data=st.data())
def test_mutated_flight_recorder_dumps(data: st.DataObject) -> None:
    """Real dumps with their log: JSON forms with values of any type, pickles with bytes
    changed (the reader refuses any pickle that names a class; this checks it never raises)."""
    seed = data.draw(st.sampled_from(FLIGHT_CAPTURES))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(seed, run)
        for dump in sorted((run / "dumps").iterdir()):
            if not data.draw(st.booleans()):
                continue
            if dump.suffix == ".pkl":
                dump.write_bytes(data.draw(mutated(dump.read_bytes())))
            else:
                line = json.dumps(json.loads(dump.read_text()))
                dump.write_bytes(data.draw(mutated_json_lines(line)))
        diagnose(str(run))
