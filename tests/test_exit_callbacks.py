"""Work handed to a thread pool from an exit callback fails once the interpreter shuts down
('cannot schedule new futures after interpreter shutdown', EXIT103). Python prints that
traceback under 'Exception ignored in atexit callback' and keeps the exit status: it is no
failure of its own, and it does not explain the exception that ended the program before it.
Both programs run for real; the verdicts read what they printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddpdoctor.analysis.diagnose import diagnose_paths

PROGRAM = """
import atexit, concurrent.futures, sys
pool = concurrent.futures.ThreadPoolExecutor(1)

@atexit.register
def flush_metrics():
    pool.submit(print, "metrics flushed")

print("step 10/10 loss 0.1031", flush=True)
if sys.argv[1] == "raise":
    raise ValueError("label 7 out of range for 5 classes")
print("training done", flush=True)
"""


def _run(tmp_path: Path, how: str) -> tuple[int, Path]:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    proc = subprocess.run(
        [sys.executable, str(script), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    log = tmp_path / f"{how}.log"
    log.write_text(proc.stdout)
    assert "cannot schedule new futures after interpreter shutdown" in proc.stdout
    return proc.returncode, log


def test_the_exception_that_ended_the_program_stays_the_root(tmp_path: Path) -> None:
    code, log = _run(tmp_path, "raise")
    assert code == 1
    report = diagnose_paths([str(log)])
    assert (report.verdict.kind, report.verdict.rule) == ("python-exception", "PY101")
    roles = {f.rule: f.role for f in report.findings}
    assert roles.get("EXIT103") != "root"


def test_an_exit_callback_that_failed_alone_is_no_failure(tmp_path: Path) -> None:
    code, log = _run(tmp_path, "finish")
    assert code == 0
    report = diagnose_paths([str(log)])
    assert report.verdict.status == "ok"
    assert any(f.rule == "EXIT103" for f in report.findings)
