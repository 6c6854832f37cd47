"""`ddpdoctor run` writes no secret: the command line (--hub_token) and the environment
(WANDB_API_KEY) of a real 2-rank gloo job reach events.jsonl, the stack dumps and the reports
masked, while console.log and ranks/*.log keep exactly what the job printed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.test_run_supervise import PROGRAMS, RUN, TORCHRUN, events, plain

HUB_TOKEN = "hf_0gCa05RFRunzqw7wZyVGOeUvfJIssDj4PT"
WANDB_KEY = "8a06e8b26034a7e6592d4308d157faabaf8fa81f"
SECRETS = (HUB_TOKEN[3:], WANDB_KEY)
JOB_LOGS = ("console.log", "ranks")  # what the job printed: kept as it is


def run(run_dir: Path, *opts: str, cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(
        [*RUN, "--run-dir", str(run_dir), *opts, "--", *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": HUB_TOKEN},
    )
    return proc.stderr


def written_by_ddpdoctor(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): p.read_text(errors="replace")
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.relative_to(run_dir).parts[0] not in JOB_LOGS
    }


@pytest.mark.real
def test_run_masks_command_line_and_env_but_keeps_the_job_logs(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        str(PROGRAMS / "secret_job.py"),
        "--hub_token",
        HUB_TOKEN,
    ]
    run(run_dir, "--hang-after", "3", "--label-ranks", cmd=cmd, timeout=120)

    console = (run_dir / "console.log").read_text()
    assert all(s in console for s in SECRETS)  # the job's own log keeps what it printed
    assert all(s in (run_dir / "ranks" / "rank1.log").read_text() for s in SECRETS)

    files = written_by_ddpdoctor(run_dir)
    assert {"events.jsonl", "report.json", "report.txt"} <= set(files)
    leaks = {name: s for name, text in files.items() for s in SECRETS if s in text}
    assert leaks == {}

    start = next(e for e in events(run_dir) if e["event"] == "start")
    argv = start["argv"]
    assert isinstance(argv, list) and argv[argv.index("--hub_token") + 1] == "****"
    # the failure was quoted, masked: the evidence did reach the report
    assert "https://trainer:****@huggingface.co" in files["report.json"]
    assert "WANDB_API_KEY=****" in files["report.json"]
    assert "https://trainer:****@huggingface.co" in files["report.txt"]

    stacks = next(e for e in events(run_dir) if e["event"] == "stacks")
    assert isinstance(stacks["diagnosis"], dict)
    if "py-spy" in stacks["diagnosis"]["methods"]:  # py-spy heads its dump with the argv
        dumps = [t for n, t in files.items() if n.startswith("stacks/rank")]
        assert any("--hub_token ****" in t for t in dumps), list(files)


def test_run_no_redact_keeps_secrets_in_what_it_writes(tmp_path: Path) -> None:
    """A torch-free child that hangs on a lock: events, py-spy dumps and reports, with and
    without --no-redact."""
    cmd = [*plain("lock"), "--hub_token", HUB_TOKEN]
    opts = ("--hang-after", "1", "--startup-grace", "0", "--on-hang", "kill", "--grace", "1")
    run(tmp_path / "masked", *opts, cmd=cmd, timeout=60)
    run(tmp_path / "raw", *opts, "--no-redact", cmd=cmd, timeout=60)

    masked = written_by_ddpdoctor(tmp_path / "masked")
    raw = written_by_ddpdoctor(tmp_path / "raw")
    assert HUB_TOKEN in raw["events.jsonl"]
    assert not [n for n, t in masked.items() if HUB_TOKEN[3:] in t]
    assert json.loads(masked["events.jsonl"].splitlines()[0])["argv"][-1] == "****"
    pyspy = "py-spy" in json.dumps([e for e in events(tmp_path / "raw") if e["event"] == "stacks"])
    if pyspy:
        assert any(HUB_TOKEN in t for n, t in raw.items() if n.startswith("stacks/"))
        assert any("--hub_token ****" in t for n, t in masked.items() if n.startswith("stacks/"))
