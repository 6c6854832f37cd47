"""The Azure ML execution wrapper of one node, as a PyTorch command job's node runs its user
processes (`distribution: type: pytorch, process_count_per_instance: N`), re-created in plain
Python for tests/fixtures/real/hundredfiftyfirst-* (Azure ML is not installed).

It starts the job's command once per process of its node, itself (no torchrun), each through a
bash script of the job's command, with MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, NODE_RANK and AZUREML_* set; each process writes only to its own file of the
job folder, user_logs/std_log_process_<global rank>.txt (nothing is teed anywhere); a job
without a distribution runs one process into user_logs/std_log.txt without those variables. Its
own lines go to system_logs/lifecycler/execution-wrapper.log (lifecycler.log beside it), in a
node's own folder under system_logs/lifecycler/ when the job has several nodes. When a process
exits non-zero the wrapper terminates its node's other processes (SIGTERM, SIGKILL after 10 s),
and ends with 'Execution failed. User process 'python' exited with status code N. Please check
log file ...', with the process's last Python traceback when it has one; SIGTERM to the wrapper
(the job's cancellation) is passed to every process.

    python hundredfiftyfirst_execution_wrapper.py --job-dir DIR --workdir DIR --nodes N
        --node-rank K --procs P --master-addr A --master-port PORT [--node-id ID]
        [--distribution pytorch|none] -- COMMAND...
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shlex
import signal
import subprocess
import sys
import time

LOG: list[object] = []


def stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def log(level: str, text: str, name: str = "execution-wrapper") -> None:
    f = LOG[0]
    f.write(f"{stamp()} {level} {name} {text}\n")  # type: ignore[attr-defined]
    f.flush()  # type: ignore[attr-defined]


def last_traceback(path: str) -> str:
    """The last Python traceback of a process's file: from its 'Traceback' line through the
    exception's line, each line of it under the same prefix."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().replace("\r", "\n").split("\n")
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if not starts:
        return ""
    first = starts[-1]
    prefix = lines[first].split("Traceback (most recent call last):")[0]
    block = [lines[first]]
    for line in lines[first + 1 :]:
        if not line.startswith(prefix):
            break
        block.append(line)
        body = line[len(prefix) :]
        if body and not body.startswith(" "):
            break  # the exception's own line
    return "\n".join(block)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--job-dir", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=6105)
    p.add_argument("--node-id", default="")
    p.add_argument("--distribution", default="pytorch", choices=["pytorch", "none"])
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    run_id = os.environ.get("AZUREML_RUN_ID", "")

    sysdir = os.path.join(args.job_dir, "system_logs", "lifecycler")
    if args.nodes > 1:
        sysdir = os.path.join(sysdir, args.node_id)
    os.makedirs(sysdir, exist_ok=True)
    userdir = os.path.join(args.job_dir, "user_logs")
    os.makedirs(userdir, exist_ok=True)
    with open(os.path.join(sysdir, "lifecycler.log"), "a") as lc:
        lc.write(f"{stamp()} INFO lifecycler Starting lifecycler for job {run_id}\n")
        lc.write(f"{stamp()} INFO lifecycler Node {args.node_id} is ready, starting capabilities\n")
        lc.write(f"{stamp()} INFO lifecycler Starting execution-wrapper\n")
    LOG.append(open(os.path.join(sysdir, "execution-wrapper.log"), "a"))  # noqa: SIM115

    distributed = args.distribution == "pytorch"
    world = args.nodes * args.procs if distributed else 1
    local = args.procs if distributed else 1
    log("INFO", f"Starting execution wrapper for job {run_id}")
    log(
        "INFO",
        f'node_id: "{args.node_id}", vm_size: Some("STANDARD_D4S_V3"), node_rank: {args.node_rank}',
    )
    if distributed:
        log(
            "INFO",
            f"Distribution: PyTorch {{ process_count_per_instance: {args.procs} }}, "
            f"instance_count: {args.nodes}, world size {world}",
        )
        log("INFO", f"Master address {args.master_addr}, master port {args.master_port}")
    else:
        log("INFO", "Distribution: None, running a single user process")
    script = os.path.join(args.workdir, "azureml-setup", "run_user_command.sh")
    os.makedirs(os.path.dirname(script), exist_ok=True)
    with open(script, "w") as f:
        f.write("#!/bin/bash\n# the job's command\n" + shlex.join(command) + "\n")
    log("INFO", f"User command: {shlex.join(command)}")

    procs: dict[int, subprocess.Popen[bytes]] = {}
    files: dict[int, str] = {}
    for lr in range(local):
        rank = args.node_rank * args.procs + lr
        env = dict(os.environ)
        env["AZUREML_CR_NODE_ID"] = args.node_id
        env["AZUREML_PROCESS_NAME"] = f"rank_{rank}" if distributed else "main"
        if distributed:
            env.update(
                MASTER_ADDR=args.master_addr,
                MASTER_PORT=str(args.master_port),
                RANK=str(rank),
                LOCAL_RANK=str(lr),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(local),
                NODE_RANK=str(args.node_rank),
                AZUREML_NODE_COUNT=str(args.nodes),
            )
            name = f"std_log_process_{rank}.txt"
        else:
            name = "std_log.txt"
        files[rank] = os.path.join(userdir, name)
        out = open(files[rank], "ab")  # noqa: SIM115
        procs[rank] = subprocess.Popen(
            ["bash", script],
            cwd=args.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        out.close()
        log(
            "INFO",
            f"Started user process {rank} (pid {procs[rank].pid}), log file user_logs/{name}",
        )

    cancelled: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        cancelled.append(signum)

    signal.signal(signal.SIGTERM, on_term)

    def stop(ranks: list[int], why: str) -> None:
        log("INFO", f"{why}: terminating user processes {ranks}")
        for r in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[r].pid, signal.SIGTERM)
        end = time.time() + 10
        while time.time() < end and any(procs[r].poll() is None for r in ranks):
            time.sleep(0.2)
        for r in ranks:
            if procs[r].poll() is None:
                log("WARN", f"User process {r} did not exit in 10s, sending SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(procs[r].pid, signal.SIGKILL)

    def code(r: int) -> int:
        rc = procs[r].wait()
        return rc if rc >= 0 else 128 - rc

    reported: set[int] = set()
    failed: int | None = None
    while len(reported) < len(procs):
        if cancelled and failed is None:
            log("WARN", "Received SIGTERM: the job is being cancelled")
            stop([r for r in procs if r not in reported], "Job cancellation")
            failed = -1
        for r, pr in procs.items():
            if r in reported or pr.poll() is None:
                continue
            reported.add(r)
            log("INFO", f"User process {r} (pid {pr.pid}) finished")
            log("INFO", f"Process exited with code {code(r)}")
            if code(r) != 0 and failed is None:
                failed = r
                rest = [q for q in procs if q not in reported]
                if rest:
                    stop(rest, f"User process {r} failed")
        time.sleep(0.2)

    if failed is None:
        log("INFO", "All user processes exited with code 0")
        log("INFO", "Execution succeeded")
        rc = 0
    else:
        first = failed if failed >= 0 else min(procs)
        rc = code(first)
        name = os.path.basename(files[first])
        error = last_traceback(files[first])
        text = (
            f"Execution failed. User process 'python' exited with status code {rc}. "
            f"Please check log file 'user_logs/{name}' for error details."
        )
        if failed < 0:
            text = f"Execution was cancelled (SIGTERM). User process 'python' exited with status code {rc}."
        if error:
            text += f" Error: {error}"
        log("ERROR", text)
    with open(os.path.join(sysdir, "lifecycler.log"), "a") as lc:
        lc.write(f"{stamp()} INFO lifecycler execution-wrapper exited with code {rc}\n")
        lc.write(f"{stamp()} INFO lifecycler Uploading logs and outputs\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
