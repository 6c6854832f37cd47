"""Real jobs under a real single-node Slurm (started by .ci/slurm-up): `srun --label` with several
tasks, a time limit, `scancel`, a task killed by SIGKILL, a hang, signals and exit codes; each
diagnosed from the `sbatch` output file and under `ddpdoctor run -- srun ...`.

Where Slurm is not up, every test here is skipped with the reason (.ci/slurm-up's status line).
Two jobs of a case run side by side (`--overcommit`: one CPU each on the 2-CPU node).
Verdicts that are wrong today are strict xfails naming the log; the logs are kept as fixtures
under tests/fixtures/real/slurm-*.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import diagnose_json

HERE = Path(__file__).parent
PROGRAM = HERE / "programs" / "slurm_train.py"
RUN = [sys.executable, "-c", "from ddpdoctor.cli.run_cmd import run; run()"]
SLURM_DIR = Path(os.environ.get("DDPDOCTOR_SLURM_DIR", "/tmp/ddpdoctor-slurm"))
JOB_PREFIX = "ddpdoctor-test-"

pytestmark = [pytest.mark.slurm, pytest.mark.real]


# ------------------------------------------------------------------------------ the cluster
def slurm_state() -> tuple[dict[str, str] | None, str]:
    """(environment for Slurm commands, "") when the test cluster answers, else (None, why)."""
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        return None, "srun/sbatch are not installed (.ci/slurm-up installs slurm-wlm)"
    conf = Path(os.environ.get("SLURM_CONF") or SLURM_DIR / "slurm.conf")
    status_file = SLURM_DIR / "status"
    status = status_file.read_text().strip() if status_file.is_file() else ""
    if status and status != "up" and "SLURM_CONF" not in os.environ:
        return None, f".ci/slurm-up could not start Slurm: {status}"
    if not conf.is_file():
        return None, f"no Slurm configuration at {conf}: run .ci/slurm-up first (CI does)"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=15,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"sinfo did not answer: {exc}"
    state = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    if out.returncode != 0 or state not in ("idle", "mixed", "allocated"):
        return None, f"the Slurm node is not usable ({state or out.stderr.strip()[:200]})"
    return env, ""


_names_started: list[str] = []


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    env, why = slurm_state()
    if env is None:
        pytest.skip(f"Slurm is not available: {why}")
    yield env
    if _names_started:  # whatever a failed test left queued or running
        subprocess.run(
            ["scancel", "--full", "--signal=KILL", "--name", ",".join(_names_started)],
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_name(case: str) -> str:
    name = f"{JOB_PREFIX}{case}-{uuid.uuid4().hex[:6]}"
    _names_started.append(name)
    return name


def task_env(slurm: dict[str, str], pg_timeout_s: float = 60) -> dict[str, str]:
    return {
        **slurm,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PG_TIMEOUT_S": str(pg_timeout_s),
    }


def program(mode: str, tag: str, arg: str = "0") -> list[str]:
    """The task command; `tag` (unused by the job) lets a test find its own processes."""
    return [sys.executable, str(PROGRAM), mode, arg, tag]


def leftovers(tag: str) -> list[int]:
    """PIDs of live processes whose command line holds `tag`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in cmd and state != "Z":
            pids.append(int(proc.name))
    return pids


def wait_gone(tag: str, timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@dataclass
class SlurmJob:
    """What scontrol says about a finished job (MinJobAge keeps it for 10 minutes)."""

    job_id: int
    state: str
    exit_code: str
    reason: str


def show_job(slurm: dict[str, str], job: str | int) -> SlurmJob | None:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", str(job)],
        capture_output=True,
        text=True,
        env=slurm,
        timeout=15,
        check=False,
    )
    fields = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
    if "JobState" not in fields:
        return None
    return SlurmJob(int(fields["JobId"]), fields["JobState"], fields["ExitCode"], fields["Reason"])


def job_named(slurm: dict[str, str], name: str) -> int | None:
    """The id of the job called `name`, running or finished (scontrol keeps finished ones)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job"],
        capture_output=True,
        text=True,
        env=slurm,
        timeout=15,
        check=False,
    )
    for line in out.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("JobName") == name:
            return int(fields["JobId"])
    return None


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")


def wait_job(slurm: dict[str, str], job_id: int, timeout_s: float) -> SlurmJob:
    deadline = time.monotonic() + timeout_s
    while True:
        job = show_job(slurm, job_id)
        if job is not None and job.state in FINAL:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} did not end in {timeout_s} s: {job}")
        time.sleep(0.5)


def sbatch(
    slurm: dict[str, str], env: dict[str, str], name: str, out: Path, cmd: list[str], *opts: str
) -> int:
    """Submit `srun --label CMD` as a batch script; returns the job id."""
    script = out.with_suffix(".sh")
    script.write_text("#!/bin/bash\nsrun --label " + " ".join(cmd) + "\n")
    res = subprocess.run(
        ["sbatch", "--parsable", "-J", name, "-o", str(out), *opts, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def start_run(
    run_dir: Path, env: dict[str, str], srun_opts: list[str], cmd: list[str], *opts: str
) -> subprocess.Popen[str]:
    """`ddpdoctor run [opts] -- srun SRUN_OPTS CMD` in the background (console into run_dir)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*RUN, "--run-dir", str(run_dir), "--quiet-report", *opts, "--", "srun", *srun_opts, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(
            f"ddpdoctor run did not end in {timeout_s} s:\n{out[-3000:]}"
        ) from None
    return proc.returncode, out


def wait_for(path: Path, pattern: str, count: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if len(re.findall(pattern, text)) >= count:
            return text
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} x{count} not in {path} after {timeout_s} s:\n{text[-2000:]}")


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def verdict_of(report: dict[str, Any]) -> tuple[str, str, list[int]]:
    v = report["verdict"]
    return v["kind"], v["category"], v["culprit"]["ranks"]


def run_report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())  # type: ignore[no-any-return]


@dataclass
class Case:
    """One failure run twice at once: a plain batch job and `ddpdoctor run -- srun`."""

    batch_out: Path
    batch_job: SlurmJob
    run_dir: Path
    run_rc: int
    run_job: SlurmJob
    run_stdout: str
    left: list[int]

    @property
    def batch_report(self) -> dict[str, Any]:
        return diagnose_json(self.batch_out)

    @property
    def report(self) -> dict[str, Any]:
        return run_report(self.run_dir)


def run_case(
    slurm: dict[str, str],
    tmp: Path,
    case: str,
    mode: str,
    srun_opts: tuple[str, ...] = (),
    stop: str | None = None,
    timeout_s: float = 120,
) -> Case:
    """Start the batch job and the supervised srun side by side; `stop="scancel"` cancels both
    once each printed 3 steps; wait for both to end."""
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    cmd = program(mode, tag)
    batch_name, run_name = job_name(case), job_name(case + "-run")
    out = tmp / f"{case}.out"
    batch_id = sbatch(slurm, task_env(slurm), batch_name, out, cmd, "-n", "2", "-O", *srun_opts)
    run_dir = tmp / f"{case}-run"
    opts = ["-n", "2", "-O", "--label", "-J", run_name, *srun_opts]
    proc = start_run(run_dir, task_env(slurm), opts, cmd)
    if stop == "scancel":
        wait_for(out, r"\d: step 3 ", 2, 90)
        wait_for(run_dir / "console.log", r"\d: step 3 ", 2, 90)
        run_id = job_named(slurm, run_name)
        assert run_id is not None
        for job in (batch_id, run_id):
            subprocess.run(["scancel", str(job)], env=slurm, timeout=15, check=True)
    rc, stdout = finish(proc, timeout_s)
    run_id = job_named(slurm, run_name)
    assert run_id is not None, stdout[-2000:]
    return Case(
        batch_out=out,
        batch_job=wait_job(slurm, batch_id, timeout_s),
        run_dir=run_dir,
        run_rc=rc,
        run_job=wait_job(slurm, run_id, 30),
        run_stdout=stdout,
        left=wait_gone(tag),
    )


def no_phantom_ranks(report: dict[str, Any], world: int) -> None:
    job = report["job"]
    assert job["world_size"] == world, job
    assert job["ranks_seen"] == list(range(world)), job


# ------------------------------------------------------------------------------ healthy
def test_srun_label_three_tasks_healthy(slurm: dict[str, str], tmp_path: Path) -> None:
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "ok.out"
    batch = sbatch(slurm, task_env(slurm), job_name("ok"), out, program("ok", tag), "-n3", "-O")
    run_dir = tmp_path / "ok-run"
    # --label-ranks asks srun for its task labels
    proc = start_run(
        run_dir,
        task_env(slurm),
        ["-n", "3", "-O", "-J", job_name("ok-run")],
        program("ok", tag),
        "--label-ranks",
    )
    rc, stdout = finish(proc, 120)
    job = wait_job(slurm, batch, 120)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job
    text = out.read_text()
    for task in range(3):
        assert (
            f"{task}: rank {task}/3 pid" in text
            and f"{task}: rank {task}: training finished" in text
        )
    report = diagnose_json(out)
    assert report["verdict"]["status"] == "ok", report["verdict"]
    no_phantom_ranks(report, 3)

    assert rc == 0, stdout[-3000:]
    start = events(run_dir)[0]
    assert start["argv"][:2] == ["srun", "--label"]
    assert "2: rank 2/3 pid" in (run_dir / "console.log").read_text()
    report = run_report(run_dir)
    assert report["verdict"]["status"] == "ok", report["verdict"]
    no_phantom_ranks(report, 3)
    assert {e["code"] for e in report["job"]["exit"]["per_rank"].values()} <= {0}
    assert wait_gone(tag) == []


# ------------------------------------------------------------------------------ time limit
@pytest.fixture(scope="module")
def time_limit(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Case:
    # --time is in whole minutes; slurmctld checks limits every 30 s: 60-90 s
    tmp = tmp_path_factory.mktemp("time-limit")
    return run_case(slurm, tmp, "timelimit", "forever", ("--time=1",), timeout_s=240)


def test_time_limit_cancels_the_step(time_limit: Case) -> None:
    c = time_limit
    assert c.batch_job.state == "TIMEOUT" and c.run_job.state == "TIMEOUT"
    text = c.batch_out.read_text()
    assert re.search(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*", text)
    console = (c.run_dir / "console.log").read_text()
    assert re.search(
        r"\*\*\* STEP \d+\.0 ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*", console
    )
    assert "srun: error: " in console and "tasks 0-1: Terminated" in console
    # srun's own code (its tasks died of SIGTERM), mirrored by ddpdoctor run
    assert c.run_rc == 128 + signal.SIGTERM
    assert events(c.run_dir)[-1]["shell_code"] == c.run_rc
    assert c.left == []


@pytest.mark.parametrize("where", ["sbatch output", "ddpdoctor run"])
def test_time_limit_diagnosed(time_limit: Case, where: str) -> None:
    report = time_limit.batch_report if where == "sbatch output" else time_limit.report
    kind, category, _ = verdict_of(report)
    assert (kind, category) == ("preempted", "intended-exit"), report["verdict"]
    no_phantom_ranks(report, 2)


@pytest.mark.parametrize("where", ["sbatch output", "ddpdoctor run"])
def test_time_limit_blames_no_rank(time_limit: Case, where: str) -> None:
    report = time_limit.batch_report if where == "sbatch output" else time_limit.report
    assert verdict_of(report)[2] == []


# ------------------------------------------------------------------------------ scancel
@pytest.fixture(scope="module")
def cancelled(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Case:
    tmp = tmp_path_factory.mktemp("scancel")
    return run_case(slurm, tmp, "scancel", "forever", stop="scancel")


def test_scancel_ends_every_task(cancelled: Case) -> None:
    c = cancelled
    assert c.batch_job.state == "CANCELLED" and c.run_job.state == "CANCELLED"
    text = c.batch_out.read_text()
    assert re.search(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ \*\*\*", text)
    assert "DUE TO" not in text
    console = (c.run_dir / "console.log").read_text()
    assert re.search(r"\*\*\* STEP \d+\.0 ON \S+ CANCELLED AT \S+ \*\*\*", console)
    assert c.run_rc == 128 + signal.SIGTERM
    assert c.left == []


@pytest.mark.parametrize("where", ["sbatch output", "ddpdoctor run"])
def test_scancel_diagnosed(cancelled: Case, where: str) -> None:
    report = cancelled.batch_report if where == "sbatch output" else cancelled.report
    assert verdict_of(report)[:2] == ("preempted", "intended-exit")


# ------------------------------------------------------------------------------ SIGKILL
@pytest.fixture(scope="module")
def killed(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Case:
    tmp = tmp_path_factory.mktemp("sigkill")
    return run_case(slurm, tmp, "sigkill", "sigkill")


def test_sigkilled_task(killed: Case) -> None:
    c = killed
    assert c.batch_job.state == "FAILED" and c.run_job.state == "FAILED"
    for text in (c.batch_out.read_text(), (c.run_dir / "console.log").read_text()):
        assert re.search(r"srun: error: \S+: task 1: Killed", text)
        assert "Force Terminated StepId=" in text
    assert c.run_rc == 128 + signal.SIGKILL  # srun's code for a task killed by SIGKILL
    per_rank = c.report["job"]["exit"]["per_rank"]
    assert per_rank.get("1", {"code": -9})["code"] == -9, per_rank  # when observed, exact
    assert c.left == []


@pytest.mark.parametrize("where", ["sbatch output", "ddpdoctor run"])
def test_sigkilled_task_is_the_culprit(killed: Case, where: str) -> None:
    report = killed.batch_report if where == "sbatch output" else killed.report
    assert verdict_of(report)[2] == [1], report["verdict"]
    roles = {f["role"]: f["ranks"] for f in report["findings"]}
    assert roles.get("cascade") == [0], report["findings"]
    no_phantom_ranks(report, 2)


@pytest.mark.parametrize("where", ["sbatch output", "ddpdoctor run"])
def test_sigkilled_task_kind(killed: Case, where: str) -> None:
    report = killed.batch_report if where == "sbatch output" else killed.report
    assert verdict_of(report) == ("host-oom", "resource", [1])


# ------------------------------------------------------------------------------ run inside sbatch
def test_hang_under_run_inside_sbatch(slurm: dict[str, str], tmp_path: Path) -> None:
    """The usual form: the batch script runs `ddpdoctor run -- srun`; the script itself has
    SLURM_PROCID=0 (no step id) and must not be taken for rank 0."""
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "hang-run"
    out = tmp_path / "hang.out"
    run = " ".join([*RUN[:2], repr(RUN[2])])
    script = tmp_path / "hang.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"{run} --run-dir {run_dir} --hang-after 5 --on-hang kill --quiet-report -- "
        f"srun --label {' '.join(program('hang', tag))}\n"
        'echo "ddpdoctor-rc=$?"\n'
    )
    res = subprocess.run(
        ["sbatch", "--parsable", "-W", "-J", job_name("hang"), "-n", "2", "-o", str(out), script],
        capture_output=True,
        text=True,
        env=task_env(slurm),
        timeout=180,
        check=False,
    )
    assert res.returncode == 0, res.stderr + out.read_text()[-3000:]
    text = out.read_text()
    assert f"ddpdoctor-rc={128 + signal.SIGTERM}" in text, text[-3000:]
    stacks = next(e for e in events(run_dir) if e["event"] == "stacks")
    diag = stacks["diagnosis"]
    assert diag["culprit_ranks"] == [1], diag
    assert "rank 0 wait in barrier at slurm_train.py" in diag["summary"]
    assert "rank 1 is sleeping at slurm_train.py" in diag["summary"]
    ranks = sorted(p["rank"] for p in stacks["processes"] if p["role"] == "rank")
    assert ranks == [0, 1], stacks["processes"]
    assert all(p["rank"] is None for p in stacks["processes"] if p["role"] != "rank")
    for r in (0, 1):
        assert "slurm_train.py" in (run_dir / "stacks" / f"rank{r}.txt").read_text()
    report = run_report(run_dir)
    assert report["verdict"]["status"] == "hung"
    assert report["verdict"]["culprit"]["ranks"] == [1]
    no_phantom_ranks(report, 2)
    assert wait_gone(tag) == []


# ------------------------------------------------------------------------------ exits and signals
def test_task_exit_code(slurm: dict[str, str], tmp_path: Path) -> None:
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "r"
    proc = start_run(
        run_dir,
        task_env(slurm),
        ["-n", "2", "--label", "-J", job_name("exit")],
        [*program("exit", tag, "3")],
    )
    rc, stdout = finish(proc, 120)
    assert rc == 3, stdout[-3000:]  # srun exits with its tasks' highest code
    assert re.search(r"srun: error: \S+: task 1: Exited with exit code 3", stdout)
    per_rank = run_report(run_dir)["job"]["exit"]["per_rank"]
    assert per_rank.get("1", {"code": 3})["code"] == 3, per_rank
    assert run_report(run_dir)["verdict"]["culprit"]["ranks"] == [1]
    assert wait_gone(tag) == []


def _start_waiting(
    slurm: dict[str, str], run_dir: Path, tag: str, name: str
) -> subprocess.Popen[str]:
    proc = start_run(
        run_dir, task_env(slurm), ["-n", "2", "--label", "-J", name], program("wait", tag)
    )
    wait_for(run_dir / "console.log", r"WAITING rank \d pid", 2, 90)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_reaches_every_task(slurm: dict[str, str], tmp_path: Path, sig: int) -> None:
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    name = job_name("signal")
    proc = _start_waiting(slurm, tmp_path / "r", tag, name)
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc, stdout = finish(proc, 60)
    took = time.monotonic() - t0
    evs = events(tmp_path / "r")
    assert any(e["event"] == "signal_forwarded" for e in evs)
    assert evs[-1]["event"] == "exit" and evs[-1]["shell_code"] == rc
    # srun's code: SIGTERM kills the tasks (143); SIGINT raises KeyboardInterrupt in them
    # (130 when Python dies of it, 1 when an excepthook printed it first)
    assert rc in ((143,) if sig == signal.SIGTERM else (1, 130)), stdout[-2000:]
    assert wait_gone(tag) == []
    job_id = job_named(slurm, name)
    assert job_id is not None and wait_job(slurm, job_id, 30).state in ("CANCELLED", "FAILED")
    assert took < 30


def test_sigkill_of_ddpdoctor_leaves_no_task(slurm: dict[str, str], tmp_path: Path) -> None:
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    name = job_name("orphans")
    proc = _start_waiting(slurm, tmp_path / "r", tag, name)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_gone(tag) == []
    job_id = job_named(slurm, name)
    assert job_id is not None and wait_job(slurm, job_id, 30).state in ("CANCELLED", "FAILED")


def test_torchrun_inside_srun_maps_ranks(slurm: dict[str, str], tmp_path: Path) -> None:
    """srun starts one torchrun per node (SLURM_PROCID=node); torchrun's workers carry RANK.
    The agent is no rank, though its environment says SLURM_PROCID=0."""
    tag = f"slurmtest-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "r"
    torchrun = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node=2",
        str(HERE / "programs" / "run_train.py"),
        "hang",
        tag,
    ]
    proc = start_run(
        run_dir,
        task_env(slurm),
        ["-n", "1", "-c", "2", "-J", job_name("torchrun")],
        torchrun,
        "--hang-after",
        "5",
        "--on-hang",
        "kill",
    )
    rc, out = finish(proc, 150)
    stacks = next((e for e in events(run_dir) if e["event"] == "stacks"), None)
    assert stacks is not None, out[-3000:]
    procs = stacks["processes"]
    assert sorted(p["rank"] for p in procs if p["role"] == "rank") == [0, 1], procs
    # srun (it forks a second process of its own) and torchrun, no rank among them
    agents = [p for p in procs if p["role"] == "agent"]
    assert len(agents) == 3 and all(p["rank"] is None for p in agents), procs
    assert stacks["diagnosis"]["culprit_ranks"] == [1], stacks["diagnosis"]
    report = run_report(run_dir)
    assert report["verdict"]["culprit"]["ranks"] == [1]
    no_phantom_ranks(report, 2)
    assert rc != 0 and wait_gone(tag) == []
