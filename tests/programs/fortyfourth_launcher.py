"""A stand-in for submitit (facebookincubator/submitit) on a one-node Slurm allocation, for the
forty-fourth training-program style (tests/fixtures/real/fortyfourth-*). There is no Slurm here:
`Executor.submit(fn)` does for the user what submitit's SlurmExecutor does. It takes the next job
id, pickles the call to <folder>/<job>_submitted.pkl, starts one task process per rank (this file
run with --task, as `srun python -u -m submitit.core._submit <folder>` runs it) with
SLURM_JOB_ID, SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NNODES, SLURM_NODEID and
SLURM_JOB_NODELIST set, and writes each task's stdout and stderr to <folder>/<job>_<task>_log.out
and _log.err. Each task logs submitit's own lines on its stderr ("submitit INFO (...) - Starting
with JobEnvironment(...)", "Loading pickle: ...", "Job completed successfully" or "submitit ERROR
(...) - Submitted job triggered an exception" before the traceback), bypasses SIGTERM as
submitit does, and saves its result pickle. What srun itself writes goes where submitit's sbatch
script sends it: the batch script's stderr, which is task 0's .err file ("srun: error: vm: task
1: Killed" when a task ends badly; slurmstepd's "*** STEP ... CANCELLED AT ... ***" when the job
is cancelled). `Job.wait()` stands for a user watching squeue: it returns when every task has
ended, however long the others take after one failed (no --kill-on-bad-exit). SIGTERM to the
submitting process cancels the job: the tasks get SIGTERM, then SIGKILL 5 s later.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KILL_WAIT_S = 5.0
_SIGNAL_NAMES = {
    signal.SIGKILL: "Killed",
    signal.SIGSEGV: "Segmentation fault",
    signal.SIGABRT: "Aborted",
    signal.SIGTERM: "Terminated",
    signal.SIGBUS: "Bus error",
}


def _logger() -> logging.Logger:
    log = logging.getLogger("submitit")
    if not log.handlers:
        handler = logging.StreamHandler()  # stderr, as submitit's
        handler.setFormatter(
            logging.Formatter("%(name)s %(levelname)s (%(asctime)s) - %(message)s")
        )
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class Job:
    def __init__(self, job_id: str, folder: Path, procs: list[subprocess.Popen[bytes]]) -> None:
        self.job_id = job_id
        self.folder = folder
        self._procs = procs
        self._reported: set[int] = set()

    def _srun(self, text: str) -> None:
        with open(self.folder / f"{self.job_id}_0_log.err", "a") as f:
            f.write(text + "\n")

    def _report_exits(self) -> None:
        host = socket.gethostname()
        for task, proc in enumerate(self._procs):
            if proc.returncode is None or task in self._reported:
                continue
            self._reported.add(task)
            if proc.returncode > 0:
                self._srun(
                    f"srun: error: {host}: task {task}: Exited with exit code {proc.returncode}"
                )
            elif proc.returncode < 0:
                name = _SIGNAL_NAMES.get(-proc.returncode, f"Signal {-proc.returncode}")
                self._srun(f"srun: error: {host}: task {task}: {name}")

    def _cancel(self) -> None:
        stamp = datetime.now(UTC).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        self._srun(
            f"slurmstepd: error: *** STEP {self.job_id}.0 ON {socket.gethostname()} "
            f"CANCELLED AT {stamp} ***"
        )
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self._procs):
            time.sleep(0.1)
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def wait(self) -> None:
        """Returns when every task has ended (a user watching squeue)."""

        def cancel(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, cancel)
        try:
            while any(p.poll() is None for p in self._procs):
                self._report_exits()
                time.sleep(0.1)
        except KeyboardInterrupt:
            self._cancel()
        self._report_exits()


class Executor:
    """submitit.AutoExecutor(folder=...) on Slurm: update_parameters, then submit."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.ntasks_per_node = 1
        self.nodes = 1

    def update_parameters(self, **kwargs: Any) -> None:
        self.ntasks_per_node = int(kwargs.get("tasks_per_node", self.ntasks_per_node))
        self.nodes = int(kwargs.get("nodes", self.nodes))

    def submit(self, fn: Any, *args: Any) -> Job:
        job_id = os.environ.get("STANDIN_NEXT_JOB_ID", "4242")
        folder = Path(self.folder.replace("%j", job_id)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{job_id}_submitted.pkl", "wb") as f:
            pickle.dump((fn, args), f)
        ntasks = self.ntasks_per_node * self.nodes
        module_dir = os.path.dirname(os.path.abspath(sys.modules[type(fn).__module__].__file__))
        procs = []
        for task in range(ntasks):
            env = {k: v for k, v in os.environ.items() if k != "STANDIN_NEXT_JOB_ID"}
            env.update(
                SLURM_JOB_ID=job_id,
                SLURM_JOBID=job_id,
                SLURM_PROCID=str(task),
                SLURM_LOCALID=str(task % self.ntasks_per_node),
                SLURM_NTASKS=str(ntasks),
                SLURM_NTASKS_PER_NODE=str(self.ntasks_per_node),
                SLURM_NNODES=str(self.nodes),
                SLURM_NODEID=str(task // self.ntasks_per_node),
                SLURM_JOB_NODELIST=socket.gethostname(),
                SUBMITIT_EXECUTOR="slurm",
                PYTHONPATH=os.pathsep.join(filter(None, [module_dir, env.get("PYTHONPATH")])),
            )
            out = open(folder / f"{job_id}_{task}_log.out", "wb")  # noqa: SIM115
            err = open(folder / f"{job_id}_{task}_log.err", "ab")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-u", os.path.abspath(__file__), "--task", str(folder)],
                    env=env,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
        return Job(job_id, folder, procs)


def _bypass(signum: int, frame: object) -> None:
    _logger().warning(f"Bypassing signal {signal.Signals(signum).name}")


def _task(folder: Path) -> None:
    """One task: what submitit.core._submit does on each Slurm task."""
    log = _logger()
    env = os.environ
    job_id, task = env["SLURM_JOB_ID"], int(env["SLURM_PROCID"])
    ntasks, per_node = int(env["SLURM_NTASKS"]), int(env["SLURM_NTASKS_PER_NODE"])
    log.info(
        f"Starting with JobEnvironment(job_id={job_id}, hostname={socket.gethostname()}, "
        f"local_rank={env['SLURM_LOCALID']}({per_node}), "
        f"node={env['SLURM_NODEID']}({env['SLURM_NNODES']}), global_rank={task}({ntasks}))"
    )
    signal.signal(signal.SIGTERM, _bypass)
    pickle_path = folder / f"{job_id}_submitted.pkl"
    log.info(f"Loading pickle: {pickle_path}")
    with open(pickle_path, "rb") as f:
        fn, args = pickle.load(f)
    result_path = folder / f"{job_id}_{task}_result.pkl"
    try:
        result = fn(*args)
    except Exception as error:
        log.error("Submitted job triggered an exception")
        with open(result_path, "wb") as f:
            pickle.dump(("error", traceback.format_exc()), f)
        raise error
    with open(result_path, "wb") as f:
        pickle.dump(("success", result), f)
    log.info("Job completed successfully")
    log.info("Exiting after successful completion")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--task":
        _task(Path(sys.argv[2]))
    else:
        sys.exit("usage: submitted through Executor.submit")
