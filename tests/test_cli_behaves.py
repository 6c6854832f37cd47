"""The CLI as a new user meets it (issue 15, section 4), each item through the real command:
output format from the extension, usage errors instead of internal errors, stdout for `-`,
selectors that must match, option ranges, explain in a pipe and on a 0-column terminal, explain
matching what diagnose matches, help with examples and exit codes, a run folder's own reports,
the run banner, check's progress, and every option documented."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.conftest import REPO, run_cli

REAL = REPO / "tests" / "fixtures" / "real"
TIMED = REAL / "timed-data-error" / "console.log"
RUN_FOLDER = REAL / "flight-recorder" / "run-hang" / "run"
PROGRAMS = REPO / "tests" / "programs"


def _in_pty(*args: str, timeout: float = 120) -> tuple[int, str]:
    """The real command with stdout on a pseudo-terminal that reports 0 rows and 0 columns
    (a fresh pty has no size: what some CI runners and `script` give a program)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the follower side closed: EIO on Linux
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    os.close(leader)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------- outputs
@pytest.mark.parametrize(
    ("name", "opening"),
    [("r.html", "<!DOCTYPE html>"), ("r.HTM", "<!DOCTYPE html>"), ("r.json", "{"), ("r.txt", "╭")],
)
def test_output_format_follows_the_extension(tmp_path: Path, name: str, opening: str) -> None:
    out = tmp_path / name
    proc = run_cli("diagnose", str(TIMED), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    text = out.read_text(encoding="utf-8")
    assert text.lstrip().startswith(opening), text[:80]
    if name.endswith(".json"):
        assert json.loads(text)["verdict"]["culprit"]["ranks"] == [1]


def test_explicit_format_wins_over_the_extension(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert run_cli("diagnose", str(TIMED), "--format", "json", "-o", str(out)).returncode == 1
    assert json.loads(out.read_text())["schema"] == "ddpdoctor.report/v1"


def test_output_into_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("diagnose", str(TIMED), "-o", str(tmp_path / "no" / "such" / "r.html"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "no").exists()


def test_output_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "r.txt").mkdir()  # a folder where the file should go
    proc = run_cli("diagnose", str(TIMED), "-o", str(tmp_path / "r.txt"))
    assert proc.returncode == 2
    assert "internal error" not in proc.stderr


def test_export_patterns_dash_writes_to_stdout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "rules", "--export-patterns", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "-").exists()
    lines = proc.stdout.splitlines()
    assert len(lines) > 50 and not any("(?P<" in line for line in lines)
    assert "wrote" not in proc.stdout


# ---------------------------------------------------------------------------------- options
def test_select_that_matches_nothing_is_an_error() -> None:
    proc = run_cli("rules", "--select", "XYZ")
    assert proc.returncode == 2
    assert "XYZ" in proc.stderr and proc.stdout == ""


def test_select_takes_comma_prefixes() -> None:
    proc = run_cli("rules", "--select", "ddp1,CUDA1")
    assert proc.returncode == 0
    codes = [line.split()[0] for line in proc.stdout.splitlines()]
    assert codes and all(c.startswith(("DDP1", "CUDA1")) for c in codes)
    assert any(c.startswith("DDP1") for c in codes) and any(c.startswith("CUDA1") for c in codes)
    assert run_cli("rules", "--select", "DDP1,XYZ").returncode == 2


@pytest.mark.parametrize(
    "args", [("-j", "-3"), ("--jobs", "0"), ("--width", "0"), ("--width", "-5")]
)
def test_nonsense_numbers_are_rejected(args: tuple[str, str]) -> None:
    proc = run_cli("diagnose", *args, str(TIMED))
    assert proc.returncode == 2
    assert "Invalid value" in proc.stderr and "Traceback" not in proc.stderr


def test_every_option_has_help() -> None:
    from ddpdoctor.cli.main import cli

    ctx = click.Context(cli)
    missing = [
        f"{name} {param.opts[0]}"
        for name in cli.list_commands(ctx)
        for command in [cli.get_command(ctx, name)]
        if command is not None
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    missing += [p.opts[0] for p in cli.params if isinstance(p, click.Option) and not p.help]
    assert missing == []
    assert set(cli.list_commands(ctx)) >= {"diagnose", "explain", "rules", "run", "check", "demo"}


@pytest.mark.parametrize("command", ["diagnose", "explain"])
def test_help_shows_examples_and_exit_codes(command: str) -> None:
    proc = run_cli(command, "--help")
    assert proc.returncode == 0
    assert "Examples:" in proc.stdout and "Exit codes:" in proc.stdout
    codes = re.findall(r"^\s+([0-3])\s+\S", proc.stdout, re.M)
    assert codes[:2] == ["0", "1" if command == "diagnose" else "2"]
    assert f"ddpdoctor {command} " in proc.stdout.split("Examples:")[1]


# ---------------------------------------------------------------------------------- explain
def test_explain_in_a_pipe_is_plain_text() -> None:
    proc = run_cli("explain", "DDP101")
    assert proc.returncode == 0
    out = proc.stdout
    assert "DDP101" in out and "find_unused_parameters=True" in out
    assert not re.search(r"^#+ |\*\*|^```|\x1b\[", out, re.M), out[:400]
    assert all(line == line.rstrip() for line in out.splitlines())


def test_explain_on_a_terminal_of_zero_columns_renders_at_80() -> None:
    code, out = _in_pty("explain", "DDP101")
    assert code == 0, out
    assert "DDP101" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    widths = [len(line) for line in plain.replace("\r", "").splitlines()]
    assert widths and max(widths) <= 80
    assert max(widths) >= 60  # laid out at 80 columns, not at some tiny fallback


@pytest.mark.parametrize(
    "text",
    [
        "unrecognized arguments: --local-rank=0",  # the fragment
        "train.py: error: unrecognized arguments: --local-rank=0",  # the whole line
        "[default0]:train.py: error: unrecognized arguments: --local_rank=0",  # prefixed
    ],
)
def test_explain_text_finds_the_rule_diagnose_matches(text: str, tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text(
        "usage: train.py [-h] [--epochs EPOCHS]\ntrain.py: error: unrecognized "
        "arguments: --local-rank=0\n"
    )
    diagnosed = json.loads(run_cli("diagnose", str(log), "--format", "json").stdout)
    rule = diagnosed["verdict"]["rule"]
    assert rule == "LCH105"
    proc = run_cli("explain", text)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().startswith(f"{rule}:") or f" {rule}: " in proc.stdout[:200]


def test_explain_a_prefixed_log_line_as_diagnose_reads_it(tmp_path: Path) -> None:
    """A real line of the labelled corpus with its torchrun prefix: same rule both ways."""
    line = next(raw for raw in TIMED.read_text().splitlines() if raw.startswith("RuntimeError:"))
    prefixed = f"[default0]:{line}"
    log = tmp_path / "console.log"
    log.write_text(prefixed + "\n")
    diagnosed = json.loads(run_cli("diagnose", str(log), "--format", "json").stdout)
    proc = run_cli("explain", prefixed)
    assert proc.returncode == 0
    assert proc.stdout.lstrip().startswith(diagnosed["verdict"]["rule"] + ":")


# ---------------------------------------------------------------------------------- run folders
def test_diagnose_run_folder_says_nothing_of_its_own_reports() -> None:
    assert (RUN_FOLDER / "report.json").is_file() and (RUN_FOLDER / "report.txt").is_file()
    proc = run_cli("diagnose", str(RUN_FOLDER))
    assert proc.returncode == 1
    assert "report.json" not in proc.stderr and "report.txt" not in proc.stderr
    assert "report.json" not in proc.stdout and "skipped" not in proc.stdout
    doc = json.loads(run_cli("diagnose", str(RUN_FOLDER), "--format", "json").stdout)
    skipped = {Path(s["path"]).name for s in doc["sources"] if s["status"] == "skipped"}
    assert skipped == {"report.json", "report.txt"}  # still listed in the JSON report


def test_a_report_given_elsewhere_is_still_reported(tmp_path: Path) -> None:
    copy = tmp_path / "report.json"
    copy.write_text((RUN_FOLDER / "report.json").read_text())
    proc = run_cli("diagnose", str(copy), str(TIMED))
    assert "report.json: a ddpdoctor report" in proc.stderr


def test_run_prints_a_banner_first(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    proc = run_cli(
        "run",
        "--run-dir",
        str(run_dir),
        "--hang-after",
        "7",
        "--quiet-report",
        "--",
        sys.executable,
        str(PROGRAMS / "run_plain.py"),
        "exit",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("ddpdoctor run: ")
    assert str(run_dir) in first and "7 s" in first and "Ctrl-C" in first
    default = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpdoctor",
            "run",
            "--quiet-report",
            "--",
            sys.executable,
            "-c",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # the default run folder goes under ./ddpdoctor-runs
    )
    banner = default.stderr.splitlines()[0]
    assert "ddpdoctor-runs" in banner and "max(60 s, 5x the step interval)" in banner


def test_check_says_what_it_is_doing() -> None:
    proc = run_cli("check", "--format", "json", timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["schema"] == "ddpdoctor.check/v1"  # stdout stays JSON
    assert "ddpdoctor check: collecting the facts of this node" in proc.stderr
    assert re.search(r"facts collected in \d+\.\d s", proc.stderr)


@pytest.mark.real
def test_check_announces_each_launch() -> None:
    proc = run_cli("check", "--nproc-per-node", "2", "--format", "json", timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "collective test: 2 rank(s), backend gloo" in proc.stderr
    status = json.loads(proc.stdout)["collective"]["status"]
    assert re.search(rf"  {status} after \d+\.\d s", proc.stderr)


# ---------------------------------------------------------------------------------- progress
def _stderr_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """The real command with stderr on a 120-column pseudo-terminal, stdout on a pipe."""
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=REPO,
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=300)
    os.close(leader)
    return proc.returncode, out.decode(), b"".join(chunks).decode("utf-8", "replace")


def test_diagnose_shows_progress_for_a_gigabyte_on_a_terminal(tmp_path: Path, corpus: Path) -> None:
    from benchmarks.generate import write_log

    big = tmp_path / "big.log"  # the benchmark's log: real corpus error lines in torchrun noise
    write_log(big, 1_050_000_000, seed=7, ranks=list(range(8)), world=8, errors=3)
    code, out, err = _stderr_on_a_terminal("diagnose", str(big), "--format", "json")
    assert code == 1 and json.loads(out)["schema"] == "ddpdoctor.report/v1"
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)
    assert "ddpdoctor: reading" in plain
    done = [float(x) for x in re.findall(r"(\d+\.\d)/1\.0 GB", plain)]
    assert done and max(done) > 0.0, plain[:500]  # the bar moved
    piped = run_cli("diagnose", str(big), "--format", "json")  # stderr not a terminal
    assert "reading" not in piped.stderr
    small_code, _, small_err = _stderr_on_a_terminal("diagnose", str(TIMED))
    assert small_code == 1 and "reading" not in small_err
