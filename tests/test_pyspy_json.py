"""`ddpdoctor run` reads py-spy's `dump --json` rather than parsing its text: on a real process,
the JSON gives the same threads, states and frames as py-spy's own text form, and the text
ddpdoctor writes to stacks/ from it reads back the same and still matches the stack-dump rule."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpdoctor.supervise.stacks import (
    Thread,
    _pyspy,
    find_pyspy,
    parse_pyspy,
    parse_pyspy_json,
    pyspy_text,
)

PROGRAM = """
import sys, threading, time
def wait_for_data():
    time.sleep(120)  # line 4
threading.Thread(target=wait_for_data, name="loader").start()
print("ready", flush=True)
time.sleep(120)  # line 7
"""


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    exe = find_pyspy()
    if exe is None:
        pytest.skip("py-spy is not installed (pip install '.[stacks]')")
    script = tmp_path / "sleeper.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    probe = subprocess.run(
        [exe, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        proc.kill()
        pytest.skip(f"py-spy cannot attach here (needs ptrace rights): {probe.stderr[:200]}")
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _shape(threads: list[Thread]) -> list[tuple[str, str, str, list[tuple[str, str, int]]]]:
    return [(t.tid, t.name, t.state, [(f.func, f.file, f.line) for f in t.frames]) for t in threads]


def test_json_dump_reads_as_py_spy_text_does(sleeper: subprocess.Popen[str]) -> None:
    exe = find_pyspy()
    assert exe is not None
    text, threads, error = _pyspy(exe, sleeper.pid, 30.0)
    assert error is None
    assert threads[0].name == "MainThread" and threads[0].tid == str(sleeper.pid)
    assert [(f.func, f.line) for f in threads[0].frames] == [("<module>", 7)]
    loader = next(t for t in threads if t.name == "loader")
    assert (loader.frames[0].func, loader.frames[0].line) == ("wait_for_data", 4)
    assert {t.state for t in threads} == {"idle"}

    own = subprocess.run(
        [exe, "dump", "--full-filenames", "--pid", str(sleeper.pid)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert sorted(_shape(parse_pyspy(own))) == sorted(_shape(threads))

    # what goes to stacks/: py-spy's text form, read back the same, headed by the command line
    assert text.startswith(f"Process {sleeper.pid}: {sys.executable}")
    assert _shape(parse_pyspy(text)) == _shape(threads)
    assert re.search(r'Thread \d+ \(idle\): "MainThread"', text)  # the HANG101 signature


def test_json_that_is_not_a_thread_list_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_pyspy_json('{"error": "not threads"}')
    with pytest.raises(ValueError):
        parse_pyspy_json("Thread 1 (idle): ")


def test_text_form_of_no_thread_is_just_the_header() -> None:
    text = pyspy_text(1, [])
    assert text.startswith("Process 1: ") and "Thread" not in text
