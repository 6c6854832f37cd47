"""The IBM LSF batch job and jsrun of an OLCF Summit allocation, simulated on one machine for the
hundredfiftysixth-* fixtures (tests/fixtures/real/capture_hundredfiftysixth.sh):

- `bsub SCRIPT` runs a batch script the way LSF runs it once the job is dispatched: on the batch
  (launch) node, with LSF's environment (LSB_JOBID, LSB_JOBNAME, LSB_HOSTS, LSB_MCPU_HOSTS,
  LSB_DJOB_HOSTFILE, LS_SUBCWD, ...; the batch node batch3 first, then two compute hosts of 42
  slots each, h41n03 and h41n04), stdout and stderr of the whole job into the one output file
  of `#BSUB -o` (train.%J: everything every process writes, interleaved, unprefixed), the run
  time limit of `#BSUB -W` ([hours:]minutes) enforced as LSF does (SIGINT, SIGTERM and
  SIGKILL to every process of the job, 10 s apart), and LSF's job report appended to the output
  file at the end ('Sender: LSF System <lsfadmin@batch3>', 'Subject: Job N: <train> in cluster
  <summit> Exited', the script, 'TERM_RUNLIMIT: ...', 'Exited with exit code 1.' or
  'Successfully completed.', 'Resource usage summary:'); the report's status is the job's exit.
- `jsrun -n N -a A -c C -g G -r R COMMAND...` (called by the script) starts N*A tasks, R
  resource sets a compute host, each with jsrun's PMIx environment (OMPI_COMM_WORLD_RANK, _SIZE,
  _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK, PMIX_RANK, JSM_NAMESPACE_*), each on its simulated host:
  in a mount and UTS namespace of its own whose host name is the host's and whose /mnt is that
  host's own folder ($SIM_NODE_ROOT/<host>/mnt: the node-local NVMe /mnt/bb/$USER). When a task
  fails, jsrun says which rank it noticed first ('ERROR:  One or more process (first noticed
  rank 3) exited with status 1' or '... terminated with signal 9'), kills the others (SIGTERM,
  SIGKILL 5 s later) and exits with that status.

The capture script runs `bsub` in a mount namespace whose /etc/hosts names the simulated hosts.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import resource
import signal
import subprocess
import sys
import time

BATCH_HOST = "batch3"
COMPUTE = [("h41n03", 42), ("h41n04", 42)]
USER = "jdoe"
SIGNAMES = {2: "Interrupt", 6: "Aborted", 9: "Killed", 11: "Segmentation fault", 15: "Terminated"}


def stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%a %b %e %H:%M:%S %Y")


# ------------------------------------------------------------------ jsrun
def jsrun(argv: list[str]) -> int:
    opts = {"n": 1, "a": 1, "c": 1, "g": 0, "r": 0}
    longs = {
        "--nrs": "n",
        "--tasks_per_rs": "a",
        "--cpu_per_rs": "c",
        "--gpu_per_rs": "g",
        "--rs_per_host": "r",
    }
    while argv and argv[0].startswith("-"):
        opt = argv.pop(0)
        key, _, val = opt.partition("=")
        if key in longs:
            opts[longs[key]] = int(val or argv.pop(0))
        elif re.fullmatch(r"-[nacgr]\d*", opt):
            opts[opt[1]] = int(opt[2:] or argv.pop(0))
        elif key in ("-b", "--bind", "-l", "--latency_priority", "-d", "--smpiargs") and not val:
            argv.pop(0)
    per_host = opts["r"] or max(1, 42 // max(opts["c"], 1))
    tasks = []
    for rs in range(opts["n"]):
        host = COMPUTE[rs // per_host][0]
        for t in range(opts["a"]):
            tasks.append(
                (rs * opts["a"] + t, host, rs // per_host, (rs % per_host) * opts["a"] + t)
            )
    size = len(tasks)
    local_size = min(size, per_host * opts["a"])
    root = os.environ["SIM_NODE_ROOT"]
    procs: list[subprocess.Popen[bytes]] = []
    for rank, host, node, local in tasks:
        env = dict(
            os.environ,
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE=str(size),
            OMPI_COMM_WORLD_LOCAL_RANK=str(local),
            OMPI_COMM_WORLD_LOCAL_SIZE=str(local_size),
            OMPI_COMM_WORLD_NODE_RANK=str(node),
            PMIX_RANK=str(rank),
            PMIX_NAMESPACE=f"{os.environ.get('LSB_JOBID', '0')}.1",
            JSM_NAMESPACE_RANK=str(rank),
            JSM_NAMESPACE_SIZE=str(size),
            JSM_NAMESPACE_LOCAL_RANK=str(local),
            JSM_NAMESPACE_LOCAL_SIZE=str(local_size),
        )
        if opts["g"]:
            env["CUDA_VISIBLE_DEVICES"] = str(local)
        hostdir = os.path.join(root, host, "mnt")
        cmd = [
            "unshare",
            "--mount",
            "--uts",
            "sh",
            "-c",
            'hostname "$1" && mount --bind "$2" /mnt && shift 2 && exec "$@"',
            "sh",
            host,
            hostdir,
            *argv,
        ]
        procs.append(subprocess.Popen(cmd, env=env))

    stop = [0]

    def on_signal(signum: int, _frame: object) -> None:  # LSF signals the whole job
        stop[0] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    first: tuple[int, int] | None = None
    while first is None and not stop[0]:
        codes = [p.poll() for p in procs]  # every task's, each round
        failed = [(rank, rc) for (rank, *_), rc in zip(tasks, codes, strict=True) if rc]
        if failed:
            first = failed[0]
        elif all(rc is not None for rc in codes):
            break
        else:
            time.sleep(0.05)
    if stop[0]:  # the tasks got the signal too: wait for them
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)
        return 128 + stop[0]
    if first is None:
        return 0
    rank, rc = first
    what = f"exited with status {rc}" if rc > 0 else f"terminated with signal {-rc}"
    print(
        f"ERROR:  One or more process (first noticed rank {rank}) {what}",
        file=sys.stderr,
        flush=True,
    )
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + 5
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    return rc if rc > 0 else 128 - rc


# ------------------------------------------------------------------ the LSF job
def bsub_options(script: str) -> dict[str, str]:
    opts = {"-J": "NONAME", "-q": "batch", "-W": "0:10", "-P": "", "-o": "", "-nnodes": "1"}
    for line in script.splitlines():
        m = re.match(r"#BSUB\s+(-\w+)\s+(.*?)\s*$", line)
        if m:
            opts[m.group(1)] = m.group(2).strip('"')
    return opts


def sample(pgid: int, peak: dict[str, int]) -> None:
    """The job's processes now (those of its process group): memory, processes and threads."""
    rss = procs = threads = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * page
            procs += 1
            threads += int(fields[17])
        except (OSError, IndexError, ValueError):
            continue
    peak["mem"] = max(peak["mem"], rss)
    peak["procs"] = max(peak["procs"], procs)
    peak["threads"] = max(peak["threads"], threads)
    peak["sum"] += rss
    peak["n"] += 1


def bsub(job_id: int, path: str) -> int:
    with open(path) as f:
        script = f.read()
    opts = bsub_options(script)
    name = opts["-J"]
    out_path = opts["-o"].replace("%J", str(job_id)) or f"{name}.{job_id}"
    cwd = os.getcwd()
    h, _, m = opts["-W"].rpartition(":")  # [hours:]minutes
    limit = (int(h or 0) * 60 + int(m)) * 60
    slots = sum(n for _h, n in COMPUTE)
    hostfile = os.path.join(os.environ.get("TMPDIR", "/tmp"), f".lsbatch/{job_id}.hostfile")
    os.makedirs(os.path.dirname(hostfile), exist_ok=True)
    hosts = [BATCH_HOST] + [h for h, n in COMPUTE for _ in range(n)]
    with open(hostfile, "w") as f:
        f.write("\n".join(hosts) + "\n")
    env = dict(
        os.environ,
        LSB_JOBID=str(job_id),
        LSB_BATCH_JID=str(job_id),
        LSB_JOBNAME=name,
        LSB_QUEUE=opts["-q"],
        LSB_PROJECT_NAME=opts["-P"],
        LSB_HOSTS=" ".join(hosts),
        LSB_MCPU_HOSTS=" ".join([BATCH_HOST, "1"] + [f"{h} {n}" for h, n in COMPUTE]),
        LSB_DJOB_HOSTFILE=hostfile,
        LSB_DJOB_NUMPROC=str(slots + 1),
        LSB_MAX_NUM_PROCESSORS=str(slots + 1),
        LSB_OUTPUTFILE=os.path.join(cwd, out_path),
        LSB_SUB_HOST="login1",
        LSB_EXEC_CLUSTER="summit",
        LS_SUBCWD=cwd,
        LSFUSER=USER,
        USER=USER,
        LOGNAME=USER,
    )
    submitted = time.time() - 3
    started = time.time()
    out = open(out_path, "ab")  # noqa: SIM115
    job = subprocess.Popen(
        ["/bin/bash", path],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        env=env,
        process_group=0,
    )

    def on_term(_signum: int, _frame: object) -> None:  # the capture's own time limit
        os.killpg(job.pid, signal.SIGKILL)
        sys.exit(1)

    signal.signal(signal.SIGTERM, on_term)
    peak = {"mem": 0, "procs": 0, "threads": 0, "sum": 0, "n": 0}
    reason, signals = "", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    next_signal = started + limit
    while job.poll() is None:
        sample(job.pid, peak)
        now = time.time()
        if signals and now > next_signal:  # SIGINT, SIGTERM, SIGKILL, 10 s apart
            reason = "TERM_RUNLIMIT: job killed after reaching LSF run time limit."
            next_signal = now + 10
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signals.pop(0))
        time.sleep(0.25)
    ended = time.time()
    rc = job.returncode
    with contextlib.suppress(ProcessLookupError):  # what the job left behind once it ended
        os.killpg(job.pid, signal.SIGKILL)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    status = "Done" if rc == 0 else "Exited"
    bar = "-" * 60
    pad = " " * 28
    mb = peak["mem"] >> 20
    avg = peak["sum"] / max(peak["n"], 1) / (1 << 20)
    lines = [
        "",
        bar,
        f"Sender: LSF System <lsfadmin@{BATCH_HOST}>",
        f"Subject: Job {job_id}: <{name}> in cluster <summit> {status}",
        "",
        f"Job <{name}> was submitted from host <login1> by user <{USER}> in cluster <summit> at"
        f" {stamp(submitted)}",
        f"Job was executed on host(s) <1*{BATCH_HOST}>, in queue <{opts['-q']}>, as user"
        f" <{USER}> in cluster <summit> at {stamp(started)}",
        *(f"{pad}<{n}*{h}>" for h, n in COMPUTE),
        f"</ccs/home/{USER}> was used as the home directory.",
        f"<{cwd}> was used as the working directory.",
        f"Started at {stamp(started)}",
        f"Terminated at {stamp(ended)}",
        f"Results reported at {stamp(ended)}",
        "",
        "Your job looked like:",
        "",
        bar,
        "# LSBATCH: User input",
        script.rstrip("\n"),
        bar,
        "",
    ]
    if reason:
        lines.append(reason)
    if rc == 0:
        lines.append("Successfully completed.")
    elif rc > 0:
        lines.append(f"Exited with exit code {rc}.")
    else:
        lines.append(f"Exited with signal termination: {SIGNAMES.get(-rc, str(-rc))}.")
    lines += [
        "",
        "Resource usage summary:",
        "",
        *(
            f"    {label + ' :':<45}{value}"
            for label, value in (
                ("CPU time", f"{usage.ru_utime + usage.ru_stime:.2f} sec."),
                ("Max Memory", f"{mb} MB"),
                ("Average Memory", f"{avg:.2f} MB"),
                ("Total Requested Memory", "-"),
                ("Delta Memory", "-"),
                ("Max Swap", "-"),
                ("Max Processes", str(peak["procs"])),
                ("Max Threads", str(peak["threads"])),
                ("Run time", f"{int(ended - started)} sec."),
                ("Turnaround time", f"{int(ended - submitted)} sec."),
            )
        ),
        "",
        "The output (if any) is above this job summary.",
        "",
    ]
    out.write("\n".join(lines).encode())
    out.close()
    return 0 if rc == 0 else 1


def main() -> None:
    if sys.argv[1] == "jsrun":
        sys.exit(jsrun(sys.argv[2:]))
    if sys.argv[1] == "bsub":
        sys.exit(bsub(int(sys.argv[2]), sys.argv[3]))
    sys.exit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
    main()
