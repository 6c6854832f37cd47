"""Launcher and process-exit evidence: torchrun/torchelastic worker exits and signals, the
launcher's own errors (arguments, environment, entrypoint, rendezvous), Slurm terminations.
Per-rank exit codes themselves are job facts (analysis/facts.py); these rules give them a kind."""

from __future__ import annotations

from ddpdoctor.model.taxonomy import Category
from ddpdoctor.rules.base import Echo, Explanation, Marker, Rule, Signature
from ddpdoctor.rules.localized import CRASHED, KILLED, shell_signatures

CHILD_PROCESS_CODE = r"Child process with PID (?P<child_pid>\d{1,10}) terminated with code "
"""Lightning's launcher (fabric/strategies/launchers/subprocess_script.py _ChildProcessObserver)
on one of the processes it started ending, before it terminates the others: 'Child process
with PID 13117 terminated with code 1. Forcefully terminating all other processes to avoid
zombies'. The PID only, no rank; the code is the signal's negative for a process it killed."""

RANK_DIED_FROM_SIGNAL = r"\b[Rr]ank (?P<rank>\d{1,7}) died from signal "
"""HPE Cray PALS' mpiexec (ALCF Polaris, Aurora) on a rank a signal ended: 'x3005c0s31b0n0.hsn
.cm.polaris.alcf.anl.gov: rank 3 died from signal 11 and dumped core' (an exit code is 'rank 3
exited with code 1': RANK_EXITED_WITH_CODE). Read by LCH101, LCH104 and LCH102 for their signals
and by the job's per-rank exits (analysis/facts.py)."""

VERTEX_REPLICA_EXIT = r"The replica (?P<replica>[\w.-]{1,63}) exited with a non-zero status of "
"""Vertex AI's service on a replica whose process ended with an error: 'The replica
workerpool1-0 exited with a non-zero status of 137. To find out more ...' (a replica is one
machine: its rank is that machine's). 128+N is signal N."""

RANK_EXITED_WITH_CODE = (
    r"\b[Rr]ank (?P<rank>\d{1,5})(?: \((?:PID|pid)[ :=]?\d{1,10}\))? "
    r"(?:exited|died|terminated|failed|crashed) with (?:exit )?code "
)
"""A launcher written in Python naming the global rank of a process that ended, its exit code
next: MosaicML Composer's ('Global rank 1 (PID 6275) exited with code -9', 'Rank 1 crashed with
exit code -9.'), homegrown ones ('[launcher] rank 2 exited with code -11'). Read by LCH101 and
LCH104 for their signals and by the job's per-rank exits (analysis/facts.py)."""

HOST_OOM_KILL = Rule(
    code="LCH101",
    kind="host-oom",
    confirm="that the OOM killer sent the SIGKILL: `dmesg` on the node, or the scheduler's "
    "records (sacct, kubectl describe pod)",
    title="A worker was killed by SIGKILL (host out of memory)",
    sources="torchelastic multiprocessing/api.py and errors/__init__.py, DeepSpeed launch.py, "
    "kernel OOM killer, Slurm",
    specificity=60,
    signatures=(
        # NCCL's own host allocation (census nccl-warn-malloc)
        Signature(r"NCCL WARN Failed to malloc \d{1,15} bytes", "Failed to malloc"),
        # Python could not get host memory (an address-space or cgroup limit, no OOM killer)
        Signature(r"^\**MemoryError\b", "MemoryError"),
        # numpy's MemoryError subclass (numpy/_core/_exceptions.py _ArrayMemoryError, numpy
        # >= 1.17): an array the host could not hold
        Signature(
            r"_ArrayMemoryError: Unable to allocate [\d.]{1,12} [KMGTPE]?i?B for an array",
            "_ArrayMemoryError: Unable to allocate",
        ),
        # ENOMEM from fork, mmap or a pinned allocation (a DataLoader forking its workers, the
        # kernel's overcommit limit): the host had no memory to give
        Signature(r"\[Errno 12\] Cannot allocate memory", "Cannot allocate memory"),
        # C++ allocation failure reported by an extension or the runtime
        Signature(r"std::bad_alloc", "std::bad_alloc", suggests=True),
        # 137 = 128 + SIGKILL, as shells, IDEs and container runtimes report it
        Signature(r"exit(?:ed)? (?:with )?(?:code|status)[ :=]*137\b", " 137", suggests=True),
        # Python's Popen returncode of a child killed by SIGKILL, as launchers written in
        # Python print it ("[launcher] rank 2 exited with code -9"), and CPython's
        # CalledProcessError for it (the legacy launcher, accelerate, deepspeed)
        Signature(
            RANK_EXITED_WITH_CODE + r"-9\b",
            " code -9",
            suggests=True,
        ),
        Signature(r"exit(?:ed)? with (?:exit )?code -9\b", " code -9", suggests=True),
        Signature(r"died with <Signals\.SIGKILL: 9>", "died with <Signals.SIGKILL", suggests=True),
        Signature(r"signal 9[:( ]+(?:SIGKILL|Killed)", "signal 9", suggests=True),
        # a bare "Killed" printed by the shell when the kernel killed the process
        Signature(r"^Killed\s*$", "Killed", suggests=True),
        # host RAM exhausted without a kill: the CPU allocator says so
        Signature(
            r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)",
            "DefaultCPUAllocator",
        ),
        Signature(
            r"failed \(exitcode: -9\) local_rank: (?P<local_rank>\d+)",
            "failed (exitcode: -9)",
            suggests=True,
        ),
        Signature(r"^\s*exitcode\s*: -9\b", "exitcode", suggests=True),
        # 247 = 256 - 9: a wrapper between the agent and the script that exits with its
        # child's negative return code (Determined's launch layer, `sys.exit(proc.wait())`)
        Signature(
            r"failed \(exitcode: 247\) local_rank: (?P<local_rank>\d+)",
            "failed (exitcode: 247)",
            suggests=True,
        ),
        Signature(r"^\s*exitcode\s*: 247\b", "exitcode", suggests=True),
        Signature(
            r"ProcessFailure\(local_rank=(?P<local_rank>\d+), pid=(?P<pid>\d+), exitcode=-9\b",
            "ProcessFailure(local_rank=",
            suggests=True,
        ),
        Signature(
            r"Signal 9 \(SIGKILL\) received by PID (?P<pid>\d+)",
            "Signal 9 (SIGKILL)",
            suggests=True,
        ),
        # DeepSpeed's launcher (launch.py sigkill_handler): the worker's command line, with its
        # --local_rank, then its end
        Signature(
            r"(?:'--local_rank=(?P<local_rank>\d{1,5})'(?:[^\]\n']|'(?!--local_rank=)){0,4000}\] )?"
            r"exits with return code = -9",
            "exits with return code = -9",
            suggests=True,
        ),
        Signature(CHILD_PROCESS_CODE + r"-9\b", "terminated with code -9", suggests=True),
        Signature(r"Out of memory: Kill(?:ed)? process (?P<pid>\d+)", "Out of memory: Kill"),
        Signature(r"Memory cgroup out of memory"),
        # Hugging Face datasets utils/py_utils.py iflatmap_unordered: a worker of
        # Dataset.map(num_proc=N) vanished, every rank running its own N-process pool on one
        # host; most often the OOM killer, only suggested (census datasets-map-subprocess-died)
        Signature(
            r"One of the subprocesses has abruptly died during map operation",
            "abruptly died during map operation",
            suggests=True,
        ),
        # Kubernetes pod status and shells reporting a child killed by the OOM killer
        Signature(r"\bOOMKilled\b", "OOMKilled"),
        Signature(r"line \d+: +\d+ Killed +\S*python", " Killed ", suggests=True),
        # slurmstepd: "Detected 1 oom_kill event in StepId=1234.0"
        Signature(r"oom_kill events?", "oom_kill event"),
        # the same in Slurm <= 21.08 (plugins/task/cgroup/task_cgroup_memory.c)
        Signature(r"oom-kill event\(s\)", "oom-kill event(s)"),
        # Slurm's own memory enforcement: the accounting poller's kill (interfaces/
        # jobacct_gather.c, Slurm >= 20.11) and older task/cgroup's note at the step's end
        # (Slurm <= 17.11) (census slurm-step-mem-limit-killed, slurm-exceeded-step-memory-old)
        Signature(
            r"exceeded (?:virtual )?memory limit \(\d{1,20} > \d{1,20}\), being killed",
            "memory limit (",
        ),
        Signature(
            r"Exceeded (?:step|job) memory limit at some point", "memory limit at some point"
        ),
        # srun/launch.c: srun's summary of tasks the OOM killer (SIG_OOM) or SIGKILL ended
        Signature(r": task (?P<rank>\d+): Out Of Memory", ": Out Of Memory"),
        Signature(r": tasks? [\d,\-\[\]]+: Out Of Memory", ": Out Of Memory"),
        # OpenMPI (orte/errmgr): "mpirun noticed that process rank 1 with PID 48213 on node
        # gpu-ws01 exited on signal 9 (Killed)."
        Signature(
            r"mpirun noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node "
            r"\S+ exited on signal 9\b",
            "mpirun noticed that process rank",
            suggests=True,
        ),
        Signature(RANK_DIED_FROM_SIGNAL + r"9\b", "died from signal", suggests=True),
        # the Hydra box (MPICH, Intel MPI) on a process SIGKILL ended ('=   KILLED BY SIGNAL:
        # 9 (Killed)'); its first box is the first process to end, the others it killed after
        Signature(r"^=\s{1,8}KILLED BY SIGNAL: 9\b", "KILLED BY SIGNAL: 9", suggests=True),
        Signature(
            VERTEX_REPLICA_EXIT + r"137\b", "exited with a non-zero status of", suggests=True
        ),
        # the batch systems' own kills on their memory limits: PBS's pbs_mom ('=>> PBS: job
        # killed: mem 8388608kb exceeded limit 4194304kb', also vmem) and LSF's termination
        # reason in its job report
        Signature(r"PBS: job killed: v?mem \d{1,20}\w{0,3} exceeded limit", "PBS: job killed: "),
        Signature(
            r"TERM_MEMLIMIT: job killed after reaching LSF memory usage limit", "TERM_MEMLIMIT"
        ),
        # srun names the one task SIGKILL ended (task N is rank N: see LCH104's srun line), or
        # several at once ("tasks 0-3: Killed")
        Signature(
            r"srun: error: \S+: task (?P<rank>\d{1,7}): Killed\s*$", ": Killed", suggests=True
        ),
        Signature(r"srun: error: \S+: tasks [\d,\-\[\]]+: Killed\s*$", ": Killed", suggests=True),
        # the shell's "Killed" in the user's language (rules/localized.py)
        *shell_signatures(KILLED, suggests=True),
        # torch/multiprocessing/spawn.py (mp.spawn, Lightning ddp_spawn)
        Signature(
            r"process (?P<local_rank>\d+) terminated with signal SIGKILL",
            "terminated with signal SIGKILL",
            suggests=True,
        ),
        # mm/oom_kill.c dump_header: the first line of the kernel's OOM report
        Signature(r"invoked oom-killer: ", "invoked oom-killer"),
        # ... and its summary of the kill (dump_oom_summary, Linux >= 4.19): the victim's name
        # and pid, from the global OOM killer or a cgroup's (CONSTRAINT_MEMCG: a container's
        # or a Slurm job's memory limit)
        Signature(
            r"oom-kill:constraint=CONSTRAINT_\w{1,20},.{0,600}?\btask=[^,\n]{1,64},pid=(?P<pid>\d{1,9})",
            "oom-kill:constraint=",
        ),
        # ... the reaper freeing the victim's memory, and older kernels' memory cgroup kill
        # (mm/oom_kill.c; mm/memcontrol.c, Linux <= 4.19: census kernel-oom-reaper,
        # kernel-memcg-task-killed-old)
        Signature(r"oom_reaper: reaped process (?P<pid>\d{1,9}) \(", "oom_reaper: reaped process"),
        Signature(
            r"Task in \S{1,300} killed as a result of limit of ", "killed as a result of limit of"
        ),
        # Kubernetes pkg/kubelet/oom/oom_watcher_linux.go: the node's OOM killer, as the
        # kubelet's SystemOOM event (census k8s-system-oom)
        Signature(r"System OOM encountered, victim process: ", "System OOM encountered"),
        # Kubernetes pkg/kubelet/eviction/helpers.go: pod evicted under node memory pressure
        Signature(r"The node was low on resource: memory", "The node was low on resource: memory"),
        # Ray's memory monitor (raylet node_manager.cc, ray.exceptions.OutOfMemoryError): the
        # node's RAM passed the threshold and Ray killed its newest worker; "Task was" up to Ray
        # 2.54, "N worker(s) were" from 2.55
        Signature(
            r"(?:Task was|worker\(s\) were) killed due to the node running low on memory",
            "killed due to the node running low on memory",
        ),
        # the same report's last sentence, all that is left where Ray's job output is cut to
        # its last 20,000 characters
        Signature(
            r"how to address the out of memory issue: https://docs\.ray\.io/\S{0,60}"
            r"ray-oom-prevention",
            "how to address the out of memory issue",
        ),
        # the raylet's own summary of those kills (node_manager.cc)
        Signature(
            r"\b[1-9]\d{0,6} Workers \(tasks / actors\) killed due to memory pressure \(OOM\)",
            "killed due to memory pressure (OOM)",
        ),
    ),
    explanation=Explanation(
        what="A rank process died from SIGKILL with no Python traceback.",
        why="Nearly always the kernel or cgroup OOM killer: host RAM ran out (data loaded per "
        "rank, DataLoader workers, a state dict gathered on CPU at checkpoint time). An admin "
        "kill or a scheduler limit also sends SIGKILL.",
        fix="Check `dmesg -T | grep -i 'killed process'` (or the scheduler's oom_kill events); "
        "lower host memory per rank: fewer DataLoader workers, memory-mapped datasets, "
        "sharded checkpoint saving, more host RAM.",
        false_positives="An explicit `kill -9` or a scheduler's hard kill looks the same; "
        "dmesg tells them apart.",
    ),
    fix=(
        "Confirm on the node: dmesg -T | grep -iE 'killed process|out of memory'.",
        "Reduce host memory per rank: fewer DataLoader workers (num_workers), memory-mapped "
        "datasets, save checkpoints sharded or from CPU offload in pieces.",
        "Ask the scheduler for more memory (Slurm --mem) or use fewer ranks per node.",
    ),
    positive=(
        "RuntimeError: One of the subprocesses has abruptly died during map operation.To debug the error, disable multiprocessing.",
        "=   KILLED BY SIGNAL: 9 (Killed)",
        # HPE Cray PALS mpiexec; PBS and LSF memory limits (tests/fixtures/real/hundredfiftyfifth-*,
        # hundredfiftysixth-*)
        "x3005c0s19b1n0.hsn.cm.polaris.alcf.anl.gov: rank 3 died from signal 9",
        "=>> PBS: job killed: mem 8388608kb exceeded limit 4194304kb",
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
        "slurmstepd: error: StepId=4242.0 exceeded memory limit (53687091200 > "
        "51539607552), being killed",
        "slurmstepd: error: Exceeded step memory limit at some point.",
        "[1183012.224871] oom_reaper: reaped process 812917 (python), now "
        "anon-rss:0kB, file-rss:0kB, shmem-rss:8kB",
        "[2101.225541] Task in /slurm/uid_1000/job_4242/step_0 killed as a result of "
        "limit of /slurm/uid_1000/job_4242",
        "  Warning  SystemOOM  3m57s  kubelet  System OOM encountered, victim "
        "process: python, pid: 3103923",
        # set 108 (Determined's launch layer between torchrun and the script)
        "  exitcode  : 247 (pid: 15)",
        "{1: ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file='<N/A>', "
        "error_file_data={'message': '<NONE>'}, message='Signal 9 (SIGKILL) received by PID 4242', "
        "timestamp=1716283540)}",
        "[Fri Dec  5 10:00:00 2026] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        "cpuset=slurm,mems_allowed=0-1,oom_memcg=/slurm/uid_0/job_123,task_memcg=/slurm/uid_0/"
        "job_123/step_0,task=python,pid=1234,uid=0",
        "gpu-n7:2291:2384 [3] include/alloc.h:47 NCCL WARN Failed to malloc 1073741824 bytes",
        # numpy 2.4 on this machine (tests/test_host_memory_errors.py runs it)
        "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 7.28 TiB for an array "
        "with shape (1000000, 1000000) and data type float64",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 "
        "(pid: 812917) of binary: /usr/bin/python",
        "traceback : Signal 9 (SIGKILL) received by PID 4242",
        "[launcher] rank 2 exited with code -9",
        # srun's summary of a task SIGKILL ended (task N is rank N), and of several
        "srun: error: vm: task 1: Killed",
        "srun: error: gpu-node-3: tasks 0-3: Killed",
        # MosaicML Composer's launcher (composer/cli/launcher.py)
        "Global rank 1 (PID 6275) exited with code -9",
        "Rank 1 crashed with exit code -9.",
        "OSError: [Errno 12] Cannot allocate memory",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "1 worker(s) were killed due to the node running low on memory.",
        "(raylet) Refer to the documentation on how to address the out of memory issue: "
        "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html. Consider "
        "provisioning more memory on this node or reducing task parallelism by requesting more "
        "CPUs per task.",
        # bash in a zh_CN locale, after a progress bar without its newline (corpus case 980),
        # and a script's job message in Korean and in German
        "[>>>>>>>>>>          ] 1022/5000, 1.5 task/s, elapsed: 681s, ETA:  2652s已杀死",
        "./train.sh: 줄 3: 48213 죽었음                 python train.py",
        "Getötet",
    ),
    negative=(
        "[1183012.110512] memory: usage 52428800kB, limit 52428800kB, failcnt 8921",
        "rank 0: 已杀死的进程数 3",
        "Morto di sonno, riprendo domani",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
        "(pid: 6067)",
        "Worker exit type: INTENDED_USER_EXIT Worker exit detail: Worker exits by an user request.",
        "  exitcode  : 2470 (pid: 15)",
    ),
)

RAY_WORKER_LOST = Rule(
    code="LCH116",
    kind="host-oom",
    confirm="that the OOM killer ended it: `dmesg -T | grep -i 'killed process'` on the "
    "worker's node, or `ray logs raylet.out` there",
    title="Ray lost a worker process with no reason recorded (most often the OOM killer)",
    sources="ray src/ray/core_worker and raylet (worker death notice), python/ray/exceptions.py "
    "(ActorDiedError)",
    # how a worker died as Ray saw it: after (or beside) the worker's own failure, a segfault
    # (Ray's third guess) or an error, it is that failure's exit path, not a second cause
    exit_path=True,
    specificity=30,
    signatures=(
        Signature(
            r"(?:Worker PID: (?P<pid>\d+) )?Worker exit type: SYSTEM_ERROR Worker exit detail: "
            r"Worker unexpectedly exits with a connection error code \d+\. End of file\. There "
            r"are some potential root causes\. \(1\) The process is killed by SIGKILL by OOM "
            r"killer",
            "Worker exit type: SYSTEM_ERROR",
            suggests=True,
        ),
    ),
    explanation=Explanation(
        what="Ray's raylet (or an ActorDiedError) reports that a worker process died without "
        "telling why; Ray's own first guess is the kernel's OOM killer.",
        why="A worker killed by SIGKILL (the OOM killer, most often: data or a model loaded "
        "per worker), stopped by `ray stop --force`, or crashed in native code (SIGSEGV).",
        fix="Look for the worker's own last lines (a segfault, a fatal error) and the node's "
        "`dmesg` for the OOM killer; give the workers more memory or load less per worker.",
        false_positives="A worker that crashed in native code: its own 'Fatal Python error' "
        "or segfault lines, when printed, are the cause.",
    ),
    fix=(
        "Check the node for the OOM killer: dmesg -T | grep -iE 'killed process|out of "
        "memory'; `ray logs` of the dead worker show its last lines.",
        "Lower the memory per worker (fewer or smaller data loader workers, sharded loading) "
        "or ask for more memory per worker (ScalingConfig resources_per_worker).",
    ),
    positive=(
        "(raylet) A worker died or was killed while executing a task by an unexpected system "
        "error. To troubleshoot the problem, check the logs for the dead worker. Worker PID: "
        "14872 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits "
        "with a connection error code 2. End of file. There are some potential root causes. "
        "(1) The process is killed by SIGKILL by OOM killer due to high memory usage.",
    ),
    negative=(
        "Worker exit type: INTENDED_USER_EXIT Worker exit detail: Worker exits by an user request.",
    ),
)

LAUNCHER_SIGTERM = Rule(
    code="LCH102",
    kind="python-exception",
    title="Launcher terminated the other workers after a failure",
    sources="torchelastic multiprocessing/api.py _close",
    severity="info",
    echo=Echo.LAUNCHER,
    specificity=5,
    signatures=(
        Signature(r"Sending process (?P<pid>\d+) closing signal SIG(?P<sig>\w+)", "closing signal"),
        # torch.multiprocessing.spawn's ProcessContext.join, once one process failed: each
        # process still alive after the grace period (spawn.py)
        Signature(
            r"Terminating process (?P<pid>\d+) via signal SIG(?P<sig>TERM)\b",
            "Terminating process ",
        ),
        Signature(r"exitcode\s*: -15\b", "exitcode"),
        Signature(r"Signal 15 \(SIGTERM\) received by PID", "Signal 15 (SIGTERM)"),
        # srun on the tasks it terminated once one failed (--kill-on-bad-exit) or the step was
        # cancelled: 'srun: error: node-1: task 3: Terminated', 'tasks 0-7: Terminated'
        Signature(r"srun: error: \S+: task (?P<rank>\d{1,5}): Terminated\s*$", ": Terminated"),
        # PALS' mpiexec on the ranks it (or the batch system) stopped with SIGTERM
        Signature(RANK_DIED_FROM_SIGNAL + r"15\b", "died from signal"),
        Signature(r"srun: error: \S+: tasks [\d,\-\[\]]+: Terminated\s*$", ": Terminated"),
        # the same _close, escalating when a worker ignored the signal for its grace period;
        # the signals are IntEnums printed with %s: by name under Python 3.10 and older
        # ("via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL"), by number from 3.11
        # ("via 15, forcefully exiting via 9")
        Signature(
            r"Unable to shutdown process (?P<pid>\d+) via (?:Signals\.SIG[A-Z0-9]{1,8}|\d{1,2})"
            r", forcefully exiting",
            "Unable to shutdown process",
        ),
        # MosaicML Composer's launcher (composer/cli/launcher.py _cleanup_processes), after a
        # rank crashed: the others, and those that outlived the grace period
        Signature(
            r"Killing global rank (?P<rank>\d{1,5}) \(PID (?P<pid>\d+)\) with SIGTERM",
            "Killing global rank ",
        ),
        Signature(
            r"Failed to kill global rank (?P<rank>\d{1,5}) \(PID (?P<pid>\d+)\) with SIGTERM; "
            r"terminating with SIGKILL",
            "Failed to kill global rank ",
        ),
        # DeepSpeed's launcher (launcher/launch.py sigkill_handler), once a worker exited
        # non-zero (its "exits with return code = N" follows) or the launcher got SIGINT/SIGTERM
        # ("Main process received SIGTERM, exiting" follows): every worker, the dead one too
        Signature(
            r"\[launch\.py:\d{1,5}:sigkill_handler\] Killing subprocess (?P<pid>\d+)",
            "Killing subprocess ",
        ),
    ),
    explanation=Explanation(
        what="torchrun stopped the surviving workers because one worker failed.",
        why="A consequence, never a cause: look at the worker that failed first.",
        fix="Find the first failing worker (ddpdoctor does this).",
        false_positives="None.",
    ),
    fix=("Look at the rank that failed before the launcher sent SIGTERM.",),
    positive=(
        "x3106c0s25b1n0.hsn.cm.polaris.alcf.anl.gov: rank 0 died from signal 15",
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 812914 closing "
        "signal SIGTERM",
        "srun: error: node-1: tasks 0-7: Terminated",
        "torch.distributed.elastic.multiprocessing.api: [WARNING] Unable to shutdown process "
        "552917 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL",
        "W1204 07:30:12.118000 4242 torch/distributed/elastic/multiprocessing/api.py:1048] "
        "Unable to shutdown process 4250 via 15, forcefully exiting via 9",
        "W1204 14:23:02.334000 3464 torch/multiprocessing/spawn.py:165] Terminating process "
        "3472 via signal SIGTERM",
        "Killing global rank 0 (PID 6270) with SIGTERM",
        "Failed to kill global rank 2 (PID 6281) with SIGTERM; terminating with SIGKILL instead",
        "[2023-10-02 16:21:37,893] [INFO] [launch.py:428:sigkill_handler] Killing subprocess 30418",
    ),
    negative=(
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15",
    ),
)

ERROR_HANDLER_RERAISE = Rule(
    code="LCH122",
    kind="python-exception",
    title="A training launcher's parent re-raised a worker's error (an ErrorHandler's banner)",
    sources="OpenNMT-py onmt/utils/distributed.py and fairseq (before 0.10) ErrorHandler."
    "signal_handler, the same pattern in the research code built on them; torch 1.x "
    "multiprocessing/spawn.py join ('raise Exception(msg)' over '-- Process N terminated')",
    severity="info",
    echo=Echo.LAUNCHER,
    specificity=6,
    signatures=(
        # the parent's own exception, its message empty up to the banner's newlines
        Signature(r"^Exception: ?$", "Exception:"),
        # the banner that separates the parent's traceback from the worker's below it
        Signature(r"-- Tracebacks above this line can probably", "Tracebacks above this line"),
    ),
    # raised from the handler or from torch 1.x mp.spawn's join (their frame above), or the
    # banner itself; not any program's own `raise Exception(msg)`
    context_all=(
        r"in (?:signal_handler|exception_catcher)\b"
        r"|multiprocessing/spawn\.py\", line \d+, in join\b"
        r"|Tracebacks above this line can probably",
    ),
    explanation=Explanation(
        what="The launcher's parent process got a worker's traceback through its error queue, "
        "stopped the other workers (SIGINT) and raised an Exception whose message is a banner "
        "('-- Tracebacks above this line can probably be ignored --') and the worker's "
        "traceback.",
        why="A consequence of the worker's failure, printed below the banner; the parent's "
        "own traceback (waiting on a process, then the signal handler) says nothing of it, and "
        "the other workers' KeyboardInterrupts are the handler's SIGINT.",
        fix="Read the worker's traceback below the banner; ddpdoctor reads it as the root.",
        false_positives="None.",
    ),
    fix=("Read the worker's traceback under the banner, not the parent's Exception above it.",),
    positive=(
        "Exception: ",
        "-- Tracebacks above this line can probably be ignored --",
    ),
    negative=("Exception: CUDA out of memory",),
)

CHILD_FAILED = Rule(
    code="LCH103",
    kind="python-exception",
    title="The launcher reports that a worker failed (ChildFailedError, mp.spawn)",
    sources="torchelastic multiprocessing/errors/__init__.py ChildFailedError, "
    "torch/multiprocessing/spawn.py ProcessRaisedException / ProcessExitedException",
    severity="info",
    echo=Echo.LAUNCHER,
    specificity=5,
    signatures=(
        Signature(r"ChildFailedError"),
        Signature(
            r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local_rank>\d+)",
            "failed (exitcode: ",
        ),
        # mp.spawn's parent re-raising the first failed child's error (its traceback follows)
        Signature(r"ProcessRaisedException"),
        # Spark's TorchDistributor (pyspark/ml/torch/distributor.py) on the driver once the
        # torchrun it ran failed: the function form's 'TorchDistributor failed during
        # training.View stdout logs ...' (no space: pyspark's), the command's 'Command [...]
        # failed with return code 1'
        Signature(r"TorchDistributor failed during training\.", "TorchDistributor failed during"),
        Signature(
            r"RuntimeError: Command \[[^\n]{1,2000}\] failed with return code -?\d{1,3}\b",
            "failed with return code",
        ),
        # a CLI that runs the launcher as a child (LLaMA-Factory's and ms-swift's torchrun
        # under FORCE_TORCHRUN, ultralytics' DDP command) and raises when it fails: CPython's
        # subprocess.run(check=True), "Command '[...]' returned non-zero exit status 1."
        # (the launcher is the command's first word, or Python's -m module: read from the
        # head only, so that the line's length never multiplies the work)
        Signature(
            r"CalledProcessError: Command '\['(?:[^',\]]{0,300}/)?(?:torchrun|deepspeed|accelerate)'"
            r"|CalledProcessError: Command '\['[^',\]]{0,300}', '-m', "
            r"'torch\.distributed\.(?:run|launch)'",
            "CalledProcessError: Command '['",
        ),
        Signature(
            r"process (?P<local_rank>\d{1,7}) terminated with exit code (?P<code>\d+)",
            "terminated with exit code",
        ),
        Signature(
            CHILD_PROCESS_CODE + r"(?P<code>-?\d{1,3})\. Forcefully terminating",
            "Forcefully terminating all other processes",
        ),
        Signature(VERTEX_REPLICA_EXIT + r"(?P<code>\d{1,3})\b", "exited with a non-zero status of"),
        # Open MPI's mpirun on a rank that ended without finalizing while the others ran
        # (help-orterun.txt proc-exit-no-sync): 'mpirun has exited due to process rank 1 with
        # PID 0 on\nnode gpu-01 exiting improperly.'
        Signature(
            r"has exited due to process rank (?P<rank>\d{1,7}) with PID \d{1,10} on",
            "has exited due to process rank",
        ),
        # pdsh (DeepSpeed's multi-node runner) on a node whose remote command failed: the
        # node's launcher exit code through ssh (not 255, ssh's own failure: LCH123)
        Signature(
            r"pdsh@[\w.-]{1,200}: [\w.-]{1,200}: ssh exited with exit code (?!255\b)(?P<code>\d{1,3})",
            "ssh exited with exit code",
        ),
    ),
    explanation=Explanation(
        what="The launcher's summary of failed workers.",
        why="A consequence of a worker's failure; its 'Root Cause (first observed failure)' is "
        "often a victim (a rank killed by SIGTERM, or the survivor of a rank that exited 0).",
        fix="Read the failing workers' own output; ddpdoctor compares all ranks.",
        false_positives="None.",
    ),
    fix=("Read the output of the worker that failed first, not the launcher's summary.",),
    positive=(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "torch.multiprocessing.spawn.ProcessRaisedException: ",
        "mpirun has exited due to process rank 1 with PID 0 on",
        "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1",
        "subprocess.CalledProcessError: Command '['torchrun', '--nnodes', '1', '--nproc_per_node', "
        "'3', 'train.py', 'config.yaml']' returned non-zero exit status 1.",
        # tests/fixtures/real/hundredsixtysecond-lone-quit (pyspark 3.5's TorchDistributor)
        "RuntimeError: TorchDistributor failed during training.View stdout logs for detailed "
        "error message.",
        "RuntimeError: Command ['/usr/bin/python', '-m', 'torch.distributed.run', "
        "'--standalone', '--nnodes=1', '--nproc_per_node=2', 'train.py'] failed with return "
        "code 1. The last 100 lines of the task output are included below: ",
    ),
    negative=(
        "Sending process 1 closing signal SIGTERM",
        # a command that is no launcher: the program's own subprocess failed
        "subprocess.CalledProcessError: Command '['git', 'rev-parse', 'HEAD']' returned non-zero "
        "exit status 128.",
    ),
)

NATIVE_CRASH = Rule(
    code="LCH104",
    kind="native-crash",
    title="A rank died from a signal without a Python traceback",
    sources="torchelastic errors/__init__.py, Python faulthandler, libc",
    exit_path=True,
    specificity=40,
    signatures=(
        # OpenMPI: a rank that died of SIGSEGV/SIGABRT/SIGBUS/SIGILL/SIGFPE
        Signature(
            r"mpirun noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node "
            r"\S+ exited on signal (?P<signum>11|6|7|4|8)\b",
            "mpirun noticed that process rank",
        ),
        Signature(RANK_DIED_FROM_SIGNAL + r"(?P<signum>11|6|7|4|8)\b", "died from signal"),
        # MPICH's / Intel MPI's Hydra box on the process a signal ended ('=   KILLED BY
        # SIGNAL: 11 (Segmentation fault)'; the process it names, on the line above, is the
        # job's per-rank exit: analysis/facts.py hydra_exit)
        Signature(r"^=\s{1,8}KILLED BY SIGNAL: (?P<signum>11|6|7|4|8)\b", "KILLED BY SIGNAL: "),
        Signature(
            VERTEX_REPLICA_EXIT + r"(?P<code>139|134|135|132|136)\b",
            "exited with a non-zero status of",
        ),
        Signature(r"\(core dumped\)", "core dumped"),
        Signature(r"Illegal instruction"),
        # torchelastic's ProcessFailure as an agent built on it logs its failures (DLRover's
        # "The worker fails with {0: ProcessFailure(local_rank=0, pid=61, exitcode=-7, ...)}"):
        # the dict's key and the field are the local rank the signal ended
        Signature(
            r"ProcessFailure\(local_rank=(?P<local_rank>\d+), pid=(?P<pid>\d+), "
            r"exitcode=-(?P<signum>11|6|7|4|8)\b",
            "ProcessFailure(local_rank=",
        ),
        Signature(
            r"Signal (?P<signum>11|6|7|4|8) \((?P<sig>SIG\w+)\) received by PID", "received by PID"
        ),
        Signature(r"^\s*exitcode\s*: -(?P<signum>11|6|7|4|8)\b", "exitcode"),
        Signature(
            r"failed \(exitcode: -(?P<signum>11|6|7|4|8)\) local_rank: (?P<local_rank>\d+)",
            "failed (exitcode: -",
        ),
        # the same signals as 256 - N, from a wrapper that exits with its child's negative
        # return code (Determined's launch layer): 245 SIGSEGV, 250 SIGABRT, 249 SIGBUS
        Signature(r"^\s*exitcode\s*: (?:245|250|249)\b", "exitcode"),
        Signature(
            r"failed \(exitcode: (?:245|250|249)\) local_rank: (?P<local_rank>\d+)",
            "failed (exitcode: ",
        ),
        Signature(r"Segmentation fault"),
        # the shell's name of the signal in the user's language (rules/localized.py)
        *shell_signatures(CRASHED, suggests=False),
        Signature(r"Fatal Python error: (?P<what>\w+)", "Fatal Python error"),
        Signature(r"terminate called after throwing an instance of"),
        Signature(r"exits with return code = -(?:11|6|7)", "exits with return code = -"),
        # Lightning's launcher on a child a signal ended (CHILD_PROCESS_CODE)
        Signature(CHILD_PROCESS_CODE + r"-(?P<signum>11|6|7|4|8)\b", "terminated with code -"),
        # an IDE's run console (PyCharm): 'Process finished with exit code 139 (interrupted by
        # signal 11: SIGSEGV)'
        Signature(
            r"interrupted by signal (?P<signum>11|6|7|4|8): (?P<sig>SIG[A-Z]{2,6})",
            "interrupted by signal",
        ),
        # Python's Popen returncode of a child killed by a signal (a launcher written in
        # Python: "[launcher] rank 3 exited with code -11"), and CPython's CalledProcessError
        # for it ("Command '[...]' died with <Signals.SIGSEGV: 11>.")
        Signature(
            RANK_EXITED_WITH_CODE + r"-(?P<signum>11|6|7|4|8)\b",
            " code -",
        ),
        Signature(
            r"died with <Signals\.(?P<sig>SIG(?:SEGV|ABRT|BUS|FPE|ILL)): (?P<signum>\d+)>",
            "died with <Signals.SIG",
        ),
        # torch.distributed.launch (legacy) raises it for a worker, whose command line names
        # its local rank: the one a signal ended ("Command '[..., '--local_rank=0', ...]' died
        # with <Signals.SIGSEGV: 11>")
        Signature(
            r"'--local_rank=(?P<local_rank>\d{1,5})'[^\n]{0,400}?\]' died with "
            r"<Signals\.SIG(?:SEGV|ABRT|BUS|FPE|ILL): \d+>",
            "died with <Signals.SIG",
        ),
        # torch/csrc/DataLoader.cpp: a worker's SIGFPE handler (a native library in the data
        # path, not shared memory)
        Signature(r"Unexpected floating-point exception encountered in worker"),
        # libstdc++ vterminate.cc when threads are destroyed joinable at exit (a process
        # group's gloo/NCCL threads left to interpreter exit): teardown, whatever came before
        Signature(
            r"terminate called (?P<at_exit>without) an active exception",
            "terminate called without an active exception",
        ),
        # srun/launch.c (strsignal of a task), torch/multiprocessing/spawn.py, and the
        # kernel's own record of a SIGSEGV (arch/x86/mm/fault.c show_signal_msg)
        Signature(r": tasks? [\d,\-\[\]]+: Bus error", ": Bus error"),
        # srun names the one task a signal ended: srun starts each rank as its own task
        # (SLURM_PROCID), so task N is rank N (torchrun under srun reports its workers' signals
        # itself, and srun sees the agent exit 1)
        Signature(
            r"srun: error: \S+: task (?P<rank>\d{1,7}): (?:Segmentation fault|Bus error|Aborted"
            r"|Floating point exception|Illegal instruction)",
            "srun: error: ",
        ),
        Signature(
            r"process (?P<local_rank>\d+) terminated with signal SIG(?:SEGV|ABRT|BUS|FPE|ILL)",
            "terminated with signal SIG",
        ),
        Signature(r"\[\d+\]: segfault at [0-9a-f]+ ip ", ": segfault at "),
        # UCX's error handler (OpenMPI, HPC containers, some NCCL plugins), before its own
        # backtrace: "[host:2874:0:2931] Caught signal 7 (Bus error: nonexistent physical
        # address)"
        Signature(
            r"\] Caught signal (?P<signum>11|6|7|4|8) \((?P<what>[^)\n]{1,80})\)",
            "] Caught signal ",
        ),
        # glibc's heap checks (malloc.c malloc_printerr) and the stack protector: the message,
        # then abort() (SIGABRT): native code wrote past its memory, or freed it twice
        *(
            Signature(r"^\s*(?P<what>" + head + r"[^\n]{0,60})$", literal)
            for head, literal in (
                (r"double free or corruption \(", "double free or corruption ("),
                (
                    r"(?:free|malloc|realloc|munmap_chunk|malloc_consolidate|"
                    r"tcache_thread_shutdown)\(\): (?:invalid|corrupted|unaligned|double free|"
                    r"too many chunks|memory corruption|mismatching|(?:small|large)bin|unsorted)",
                    "(): ",
                ),
                (r"corrupted (?:size vs\. prev_size|double-linked list)", "corrupted "),
            )
        ),
        Signature(r"\*\*\* stack smashing detected \*\*\*", "stack smashing detected"),
    ),
    explanation=Explanation(
        what="A rank died from SIGSEGV/SIGABRT/SIGBUS in native code.",
        why="A crash in a C/C++/CUDA extension, an ABI mismatch between compiled packages, "
        "an abort from a library check (gloo/NCCL enforce), or a bus error from /dev/shm.",
        fix="Re-run with `python -X faulthandler` or `ddpdoctor run` to get the Python stack at "
        "the crash; check extension versions against torch; look for an abort message above.",
        false_positives="An abort that follows a clear error message is that error's consequence.",
    ),
    fix=(
        "Re-run with PYTHONFAULTHANDLER=1 (or under `ddpdoctor run`) to get the stack of the crash.",
        "Rebuild compiled extensions against the installed torch; check for two CUDA/NCCL copies.",
    ),
    # a bus error is a mapped file that could not be backed: in a container, most often its
    # /dev/shm (corpus cases 976 and 1266: NCCL's buffers, an in-memory checkpoint)
    capture_fix=tuple(
        (
            name,
            value,
            "A SIGBUS (signal 7) in a container is most often its /dev/shm running full (NCCL's "
            "shared-memory buffers, DataLoader batches, in-memory checkpoints): check `df -h "
            "/dev/shm` and give the container shared memory (docker --shm-size=16g or "
            "--ipc=host; Kubernetes: an emptyDir {medium: Memory} on /dev/shm).",
        )
        for name, value in (("signum", "7"), ("sig", "SIGBUS"))
    ),
    positive=(
        "=   KILLED BY SIGNAL: 11 (Segmentation fault)",
        "x3005c0s31b0n0.hsn.cm.polaris.alcf.anl.gov: rank 3 died from signal 11 and dumped core",
        # set 108 (Determined's launch layer between torchrun and the script)
        "  exitcode  : 245 (pid: 16)",
        # corpus case 1266 (DLRover on Kubernetes, a torchelastic-based agent)
        "The worker fails with {0: ProcessFailure(local_rank=0, pid=61, exitcode=-7, error_file='<N/A>', "
        "error_file_data={'message': '<NONE>'}, message='Signal 7 (SIGBUS) received by PID 61', "
        "timestamp=1716283540)}",
        # bash in zh_CN (corpus case 222) and fr locales
        "已放弃 (核心已转储)",
        "run.sh: ligne 3 : 48213 Erreur de segmentation (core dumped) python train.py",
        "traceback : Signal 11 (SIGSEGV) received by PID 4242",
        "Fatal Python error: Segmentation fault",
        "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py']' died "
        "with <Signals.SIGSEGV: 11>.",
        "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', "
        "'--local_rank=2', '--config', 'c.yaml']' died with <Signals.SIGSEGV: 11>.",
        "[node3:2874 :0:2931] Caught signal 7 (Bus error: nonexistent physical address)",
        # glibc 2.36's messages (strings of libc.so.6)
        "double free or corruption (!prev)",
        "malloc_consolidate(): unaligned fastbin chunk detected",
        "free(): invalid pointer",
        "corrupted size vs. prev_size",
        "*** stack smashing detected ***: terminated",
        "Global rank 2 (PID 6377) exited with code -11",
    ),
    negative=(
        "训练段错误率 0.3",
        "free(): released the cached blocks of 3 streams",
        "def free(): return None",
        "Abgebrochen wurde nichts, weiter mit Schritt 4",
        "traceback : Signal 9 (SIGKILL) received by PID 4242",
        "[launcher] rank 2 exited with code -9",
        "Global rank 1 (PID 6275) exited with code 1",
    ),
)

LOCAL_RANK_ARGUMENT = Rule(
    code="LCH105",
    kind="local-rank-argument",
    title="Script and launcher disagree about the --local_rank/--local-rank argument",
    sources="argparse, torch/distributed/launch.py, torchrun",
    specificity=90,
    signatures=(
        Signature(
            # a bounded gap: `.*?` from every repeat of the literal was quadratic (>300 s on a
            # 1 MB line); torch's launcher passes --local-rank first, right after the script
            r"error: unrecognized arguments: .{0,400}?--local[-_]rank(?:=(?P<local_rank>\d+))?",
            "error: unrecognized arguments: ",
        ),
        # argparse.py: a script that requires --local_rank, started by torchrun (which passes
        # LOCAL_RANK in the environment and no argument)
        Signature(  # a bounded gap, as above: `.*?` was quadratic on a repeated literal
            r"error: the following arguments are required: .{0,400}?--local[-_]rank",
            "the following arguments are required: ",
        ),
        # a script's own argument parser (a --key=value configurator, a config system) that
        # rejects the --local-rank the legacy launcher passes: "Unknown config key: local-rank"
        Signature(
            r"(?:[Uu]nknown|[Uu]nrecognized|[Uu]nexpected)\b[^\n]{0,80}?\blocal[-_]rank\b",
            "local",
        ),
        # transformers' HfArgumentParser.parse_args_into_dataclasses (hf_argparser.py)
        Signature(
            r"Some specified arguments are not used by the HfArgumentParser: .{0,400}?"
            r"--local[-_]rank(?:=(?P<local_rank>\d+))?",
            "not used by the HfArgumentParser",
        ),
        # python-fire (core.py), click (exceptions.py NoSuchOption)
        # (the value the launcher passed, where the message quotes it, names the worker: each
        # one gets its own local rank)
        Signature(
            r"Could not consume arg: --local[-_]rank(?:=(?P<local_rank>\d+))?",
            "Could not consume arg: ",
        ),
        Signature(r"[Nn]o such option: --local[-_]rank", "o such option: "),
    ),
    explanation=Explanation(
        what="argparse (or the script's own argument parser) rejected the --local-rank (or "
        "--local_rank) argument, or required it and did not get it.",
        why="torch.distributed.launch passes --local-rank=N (hyphen since torch 2.0) while the "
        "script declares only --local_rank, or the script declares none; torchrun passes no "
        "argument at all and sets LOCAL_RANK in the environment instead, so a script that "
        "requires --local_rank fails under torchrun.",
        fix="Launch with torchrun and read int(os.environ['LOCAL_RANK']); or declare both "
        "spellings: parser.add_argument('--local-rank', '--local_rank', type=int, default=0).",
        false_positives="None.",
    ),
    fix=(
        "Use torchrun and local_rank = int(os.environ['LOCAL_RANK']).",
        "Or: parser.add_argument('--local-rank', '--local_rank', dest='local_rank', type=int, "
        "default=0).",
    ),
    positive=(
        "train.py: error: unrecognized arguments: --local-rank=4",
        "train.py: error: the following arguments are required: --local_rank",
        "ValueError: Unknown config key: local-rank",
        "ValueError: Some specified arguments are not used by the HfArgumentParser: "
        "['--local-rank=0']",
        "ERROR: Could not consume arg: --local_rank=0",
        "Error: No such option: --local-rank",
    ),
    negative=(
        "train.py: error: unrecognized arguments: --lr=0.1",
        "ValueError: Some specified arguments are not used by the HfArgumentParser: ['--lr=1']",
        "  rank      : 1 (local_rank: 1)",
        "train.py: error: the following arguments are required: --data_dir",
    ),
)

_LAUNCHER_VAR_FAMILIES = (
    (
        r"(?:LOCAL_|GROUP_|NODE_|OMPI_COMM_WORLD_(?:LOCAL_)?|MV2_COMM_WORLD_(?:LOCAL_)?|PMIX?_)?RANK",
        "RANK'",
    ),
    (
        r"(?:(?:LOCAL_)?WORLD_|OMPI_COMM_WORLD_(?:LOCAL_)?|MV2_COMM_WORLD_(?:LOCAL_)?|PMIX?_)SIZE",
        "SIZE'",
    ),
    (r"MASTER_(?:ADDR|PORT)", ": 'MASTER_"),
    (r"SLURM_(?:PROCID|LOCALID|NTASKS|NODEID|NNODES|JOB_NODELIST|STEP_NODELIST)", ": 'SLURM_"),
)
"""The variables a launcher sets for each rank (torchrun, mpirun, srun, PMI, MVAPICH), by the
ending each family shares (a literal for the prefilter)."""
_LAUNCHER_VARS = "|".join(family for family, _ in _LAUNCHER_VAR_FAMILIES)

LAUNCHER_ENV_MISSING = Rule(
    code="LCH106",
    kind="launcher-env-missing",
    title="Distributed environment variables are missing (not started by a launcher)",
    sources="torch/distributed/rendezvous.py _env_rendezvous_handler, user code",
    specificity=85,
    signatures=(
        # torch.distributed's get_node_local_rank without torchrun's env (census
        # c10d-local-rank-missing); Accelerate's multi-node launch without MASTER_ADDR; the HF
        # Trainer asked for FSDP in a process that no launcher started
        Signature(r"LOCAL_RANK is not in the environment", "LOCAL_RANK is not in the environment"),
        # DeepSpeed runtime/engine.py _do_args_sanity_check: deepspeed.initialize in a process
        # no launcher started (census ds-requires-local-rank)
        Signature(
            r"DeepSpeed requires the LOCAL_RANK environment variable",
            "DeepSpeed requires the LOCAL_RANK environment variable",
        ),
        Signature(
            r"Tried to launch on distributed with multinode, but `MASTER_ADDR` env was not set",
            "`MASTER_ADDR` env was not set",
        ),
        Signature(r"Using fsdp only works in distributed training", "Using fsdp only works"),
        # Flair's ModelTrainer asked for several GPUs in a process its launcher did not start
        # (flair/trainers/trainer.py: no process group)
        Signature(
            r"multi_gpu=True can only used inside flair\.distributed_utils\.launch_distributed",
            "can only used inside flair.distributed_utils",
        ),
        Signature(
            r"environment variable (?P<var>RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) "
            r"expected, but not set",
            "expected, but not set",
        ),
        # torchrun's own, and what mpirun, srun and MPI's process managers set instead
        Signature(r"KeyError: '(?P<var>" + _LAUNCHER_VARS + ")'", "KeyError: '"),
        # the same KeyError caught and logged as its message, which is the quoted name alone:
        # MACE's "ERROR:root:Failed to initialize distributed environment: 'SLURM_JOB_NODELIST'"
        # (logging.error(f"...: {e}")), the name the line's last word (one signature per
        # family, each with a literal of its own)
        *(
            Signature(r"[^\s:]: '(?P<var>" + family + r")'\s*$", literal)
            for family, literal in _LAUNCHER_VAR_FAMILIES
        ),
        Signature(
            r"Error initializing torch\.distributed using env:// rendezvous",
            "Error initializing torch.distributed",
        ),
        # tcp:// and file:// init methods without the rank or world size the launcher would
        # have set (census rdzv-tcp-rank-missing, rdzv-tcp-world-size-missing,
        # rdzv-file-rank-missing)
        Signature(
            r"Error initializing torch\.distributed using (?:tcp|file)://\S{0,40} rendezvous: "
            r"(?:rank|world size) parameter missing",
            "parameter missing",
        ),
    ),
    explanation=Explanation(
        what="The script expected RANK/WORLD_SIZE/MASTER_ADDR/LOCAL_RANK in the environment.",
        why="It was started with plain `python` instead of torchrun/srun/deepspeed, or a "
        "launcher that does not export those variables.",
        fix="Start it with torchrun (torchrun --nproc-per-node=N train.py), or map the "
        "scheduler's variables (SLURM_PROCID -> RANK, ...).",
        false_positives="None.",
    ),
    fix=(
        "Launch with: torchrun --nproc-per-node=N train.py (it sets RANK, LOCAL_RANK, WORLD_SIZE, "
        "MASTER_ADDR, MASTER_PORT).",
        "Under Slurm without torchrun: export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID "
        "WORLD_SIZE=$SLURM_NTASKS and MASTER_ADDR/MASTER_PORT.",
        "A script that reads another launcher's variables (OMPI_COMM_WORLD_RANK: mpirun; "
        "SLURM_PROCID: srun) needs that launcher, or a change to read RANK/LOCAL_RANK/"
        "WORLD_SIZE, which torchrun sets.",
    ),
    positive=(
        "AssertionError: DeepSpeed requires the LOCAL_RANK environment variable, it "
        "is set by the deepspeed launcher, deepspeed.init_distributed, or the torch's "
        "launcher. If using a different launcher please ensure LOCAL_RANK is set "
        "prior to initializing deepspeed.",
        "RuntimeError: LOCAL_RANK is not in the environment. Consider passing fallback_rank to "
        "allow `get_node_local_rank` to work",
        "ValueError: Tried to launch on distributed with multinode, but `MASTER_ADDR` env was not "
        "set, please try exporting rank 0's hostname as `MASTER_ADDR`",
        "ValueError: Using fsdp only works in distributed training.",
        "RuntimeError: multi_gpu=True can only used inside "
        "flair.distributed_utils.launch_distributed()",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
        "variable RANK expected, but not set",
        "KeyError: 'LOCAL_RANK'",
        "KeyError: 'OMPI_COMM_WORLD_RANK'",
        "KeyError: 'SLURM_PROCID'",
        # tests/fixtures/real/seventyninth-slurm-ghost (a KeyError logged as its message)
        "ERROR:root:Failed to initialize distributed environment: 'SLURM_JOB_NODELIST'",
    ),
    negative=(
        "KeyError: 'model_state'",
        "KeyError: 'SLURM_CONF_RANKS'",
        # a variable named in a sentence, not a KeyError's message at the line's end
        "INFO: reading 'RANK' and 'WORLD_SIZE' from the environment",
        "env: 'RANK' set to 0 by torchrun",
    ),
)

LAUNCHER_VAR_READ = (
    r"""(?:environ\.get|getenv)\(\s{0,4}['"](?P<var>""" + _LAUNCHER_VARS + r""")['"]\s{0,4}\)"""
)
"""A code line that reads a launcher's variable with a default of None ('int(os.environ.get(
"RANK"))', 'os.getenv("MASTER_ADDR")')."""

LAUNCHER_VAR_NONE = Rule(
    code="LCH126",
    kind="launcher-env-missing",
    title="A launcher's variable read as None (the script was not started by that launcher)",
    sources="user code: os.environ.get / os.getenv of RANK, LOCAL_RANK, WORLD_SIZE, "
    "MASTER_ADDR, SLURM_PROCID, OMPI_COMM_WORLD_RANK ...",
    specificity=15,  # below any rule that names the failure itself: in a chain (an
    # env:// attempt caught, then srun's variables tried) the later error is the cause
    signatures=(
        # int(None), a str expected and None given, None's attribute: the value was not there
        Signature(
            r"^\**(?P<exc>TypeError|ValueError|AttributeError): [^\n]{0,300}\bNoneType\b",
            "NoneType",
        ),
    ),
    # the traceback's code line read that variable with os.environ.get / os.getenv
    context_all=(LAUNCHER_VAR_READ,),
    explanation=Explanation(
        what="The code read a launcher's variable (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, "
        "SLURM_PROCID, OMPI_COMM_WORLD_RANK ...) with os.environ.get or os.getenv, got None "
        "and failed on it (int(None), a string expected).",
        why="The variable is set by a launcher (torchrun, srun, mpirun) for each process it "
        "starts; the script was run without it (plain `python`, an sbatch script without "
        "srun), or under another launcher that sets other names.",
        fix="Start the script with the launcher whose variables it reads, or read the ones "
        "the launcher in use sets.",
        false_positives="A variable the program sets itself later, read too early.",
    ),
    fix=(
        "Launch with the launcher the code expects: torchrun for RANK/LOCAL_RANK/WORLD_SIZE, "
        "srun inside the sbatch script for SLURM_PROCID/SLURM_LOCALID, mpirun for "
        "OMPI_COMM_WORLD_*.",
        "Or give os.environ.get a default only where a single process is meant (it hides a "
        "missing launcher otherwise).",
    ),
    positive=(
        # tests/fixtures/real/hundredfortyninth-bare-batch (int(os.environ.get("RANK")))
        "TypeError: int() argument must be a string, a bytes-like object or a real number, not "
        "'NoneType'",
    ),
    negative=(
        "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
        "AttributeError: 'NoneTypeHandler' object has no attribute 'x'",
    ),
)

DEEPSPEED_NO_LAUNCHER = Rule(
    code="LCH115",
    kind="launcher-env-missing",
    title="DeepSpeed found no launcher and fell back to MPI discovery, which failed",
    sources="deepspeed/comm/comm.py init_distributed and mpi_discovery",
    specificity=70,
    signatures=(Signature(r"No module named '?mpi4py'?", "No module named"),),
    # only the import made by DeepSpeed's MPI discovery: its frame is in the traceback
    context_all=(r"mpi_discovery",),
    explanation=Explanation(
        what="deepspeed.init_distributed found none of the variables a launcher sets (RANK, "
        "WORLD_SIZE, MASTER_ADDR), said 'Not using the DeepSpeed or dist launchers, attempting "
        "to detect MPI environment', and importing mpi4py for that failed.",
        why="The script was started with plain `python` instead of the `deepspeed` launcher "
        "(or torchrun); the missing mpi4py is only where that shows.",
        fix="Start it with `deepspeed train.py ...` or `torchrun --nproc-per-node N train.py`; "
        "install mpi4py only if you really launch with mpirun.",
        false_positives="A job really launched with mpirun on a machine without mpi4py: then "
        "installing mpi4py is the fix.",
    ),
    fix=(
        "Launch with the DeepSpeed launcher (`deepspeed --num_gpus N train.py ...`) or torchrun, "
        "which set RANK, WORLD_SIZE and MASTER_ADDR for every process.",
    ),
    positive=("ModuleNotFoundError: No module named 'mpi4py'",),
    negative=("ModuleNotFoundError: No module named 'flash_attn'",),
)

LAUNCHERS_NESTED = Rule(
    code="LCH127",
    kind="launcher-env-missing",
    title="Two launchers' variables disagree about the local rank (mpirun around another)",
    sources="deepspeed/runtime/engine.py DeepSpeedEngine._do_args_sanity_check (0.3-0.19)",
    specificity=85,
    signatures=(
        Signature(
            r"LOCAL_RANK \(\d{1,7}\) != OMPI_COMM_WORLD_LOCAL_RANK \(\d{1,7}\)",
            "!= OMPI_COMM_WORLD_LOCAL_RANK",
        ),
    ),
    explanation=Explanation(
        what="DeepSpeed found both a LOCAL_RANK and Open MPI's OMPI_COMM_WORLD_LOCAL_RANK in "
        "the process's environment, with different values, and stopped: it cannot tell which "
        "device the process is for.",
        why="Two launchers at once: mpirun started processes that run torchrun or the deepspeed "
        "launcher again (or a LOCAL_RANK exported by hand or inherited from a job script), so "
        "each launcher numbered the processes its own way.",
        fix="Use one launcher: either mpirun (DeepSpeed reads the OMPI_* variables; "
        "`deepspeed --launcher openmpi`, or plain `mpirun ... python train.py`) or torchrun / "
        "deepspeed alone; never export LOCAL_RANK in the job script.",
        false_positives="None: the assertion is this exact check.",
    ),
    fix=(
        "Launch the script with one launcher only: remove the inner torchrun/deepspeed from the "
        "command mpirun runs (or drop mpirun), and do not export LOCAL_RANK yourself.",
    ),
    positive=(
        "AssertionError: LOCAL_RANK (0) != OMPI_COMM_WORLD_LOCAL_RANK (3), not sure how to "
        "proceed as we're seeing conflicting local rank info.",
    ),
    negative=("LOCAL_RANK is not in the environment",),
)

ENTRYPOINT_NOT_FOUND = Rule(
    code="LCH107",
    kind="entrypoint-not-found",
    title="The launcher was given a script or module that does not exist",
    sources="CPython main (can't open file), runpy",
    specificity=90,
    signatures=(
        Signature(
            r"can't open file '(?P<path>[^']+)': \[Errno 2\] No such file or directory",
            "can't open file",
        ),
        Signature(
            r"(?:python[\d.]*|bin/\w+): No module named (?P<module>[\w.]+)\s*$",
            ": No module named ",
        ),
        # (not where the interpreter lacks the launcher's own package, `python -m
        # torch.distributed.run` under a python without torch: ENV101's missing module)
        Signature(
            r"Error while finding module specification for '(?P<module>[^']+)'"
            r"(?! \(ModuleNotFoundError: No module named '(?:torch|deepspeed|accelerate)'\))",
            "Error while finding module specification",
        ),
        # slurmstepd exec_wait.c: srun's command is not on PATH on the node
        Signature(r"execve\(\): (?P<path>\S+): No such file or directory", "execve(): "),
    ),
    explanation=Explanation(
        what="Python could not find the training script or module given to the launcher.",
        why="A wrong path relative to the working directory of each node, a typo, or a module "
        "name given without -m (or with -m for a file).",
        fix="Use an absolute path that exists on every node, or `-m package.module` from the "
        "right working directory.",
        false_positives="None.",
    ),
    fix=(
        "Check the path exists on every node: ls -l PATH; pass an absolute path to torchrun.",
        "For modules use `torchrun ... -m package.module` and run from the project root.",
    ),
    positive=(
        "/usr/bin/python3: can't open file '/work/tarin.py': [Errno 2] No such file or directory",
    ),
    negative=(
        "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.json'",
        # the interpreter lacks the launcher's package (set 165 bare-python): ENV101's
        "/usr/bin/python3: Error while finding module specification for "
        "'torch.distributed.run' (ModuleNotFoundError: No module named 'torch')",
    ),
)

LAUNCHERS = (
    r"(?P<command>torchrun|deepspeed|accelerate|horovodrun|mpirun|mpiexec|srun|python[\d.]{0,8})"
)
"""The commands a distributed job is started with (a shell that cannot find one never started
the job)."""
NOT_FOUND = r"(?:command not found|not found)"
"""How bash and dash (/bin/sh) say a command is not on PATH (bash in a Chinese locale: 未找到命令)."""

LAUNCHER_NOT_FOUND = Rule(
    code="LCH113",
    kind="entrypoint-not-found",
    title="The shell could not find the launcher (command not found)",
    sources="bash and dash command lookup (execute_cmd.c / exec.c), zsh",
    specificity=85,
    signatures=(
        Signature(rf"(?<![\w./-]){LAUNCHERS}: {NOT_FOUND}\s*$", "not found"),
        Signature(rf"(?<![\w./-]){LAUNCHERS}: 未找到命令", "未找到命令"),
        Signature(rf"command not found: {LAUNCHERS}\b", "command not found: "),
        # the same said by the launcher that needed it: DeepSpeed launcher/runner.py (pdsh, the
        # default multi-node backend, or --launcher's tool) and Accelerate utils/launch.py
        # (--mpirun) (census ds-launcher-not-installed, accelerate-mpirun-not-found)
        Signature(r"launcher '\w{1,20}' not installed", "' not installed"),
        Signature(r"mpirun or mpiexec were not found", "mpirun or mpiexec were not found"),
    ),
    explanation=Explanation(
        what="The shell that ran the launch command (a script, a framework's CLI shelling out "
        "to torchrun) did not find the launcher on its PATH; no rank started.",
        why="The environment the launcher is installed in was not active in that shell (a "
        "script run by another shell, a conda environment not activated, sudo resetting PATH), "
        "or the launcher was never installed there.",
        fix="Activate the environment in the shell that launches (conda activate ENV / source "
        "venv/bin/activate), or install the launcher there; call it by its full path or as "
        "`python -m torch.distributed.run` / `python -m deepspeed.launcher.runner`.",
        false_positives="A launcher missing on a machine that was not meant to run the job.",
    ),
    fix=(
        "Make the launcher visible on PATH in the launching shell: activate its environment "
        "(conda activate ENV), install it there (pip install deepspeed / torch), or call it "
        "by its full path; sudo resets PATH, so run without sudo or with the full path.",
        "Or start it through the interpreter you trust: `python -m torch.distributed.run ...` "
        "(torchrun) or `python -m deepspeed.launcher.runner ...`.",
    ),
    positive=(
        "RuntimeError: launcher 'pdsh' not installed.",
        "OSError: mpirun or mpiexec were not found. Ensure that Intel MPI, Open MPI, "
        "or MVAPICH are installed.",
        "run_1.3b.sh: line 18: deepspeed: command not found",
        "/bin/sh: 1: torchrun: not found",
        "zsh: command not found: accelerate",
    ),
    negative=(
        "train.sh: line 4: nvidia-smi: command not found",
        "/bin/sh: 1: mytorchrun: not found",
    ),
)

LAUNCH_LINE_CUT = Rule(
    code="LCH114",
    kind="entrypoint-not-found",
    title="The launch command ended early: the shell ran one of its options as a command",
    sources="bash and dash command lookup, on a multi-line launch command",
    specificity=85,
    signatures=(
        Signature(
            rf"(?<![\w-])(?P<option>--?[A-Za-z][\w-]{{0,63}}(?:=[^\s:]{{0,64}})?): {NOT_FOUND}\s*$",
            "not found",
        ),
        Signature(
            r"(?<![\w-])(?P<option>--?[A-Za-z][\w-]{0,63}(?:=[^\s:]{0,64})?): 未找到命令",
            "未找到命令",
        ),
        Signature(
            r"command not found: (?P<option>--?[A-Za-z][\w-]{0,63}(?:=[^\s:]{0,64})?)",
            "command not found: ",
        ),
    ),
    explanation=Explanation(
        what="The shell tried to run an option (--something) as a command: the launch command "
        "written over several lines ended on the line before it.",
        why="A line continuation that does not continue: a backslash followed by a space (or a "
        "comment), or a missing backslash. The launcher ran without the rest of its arguments "
        "(often without the training script), then the shell ran the rest as a new command.",
        fix="End every line of the launch command with a backslash and nothing after it; "
        "remove trailing spaces after the backslash.",
        false_positives="None known.",
    ),
    fix=(
        "Look at the line before that option in the launch script: it must end with a "
        "backslash and nothing after it (no trailing space, no comment), or the line "
        "continuation stops there.",
    ),
    positive=(
        "train.sh: line 7: --deepspeed_multinode_launcher: command not found",
        "--nproc_per_node=8: 未找到命令",
    ),
    negative=("error: unrecognized arguments: --local_rank=0",),
)

RENDEZVOUS_FAILURE = Rule(
    code="LCH108",
    kind="rendezvous-failure",
    title="Ranks could not meet at the rendezvous (TCPStore / c10d)",
    sources="torch/csrc/distributed/c10d/socket.cpp, TCPStore.cpp, elastic/rendezvous",
    specificity=75,
    signatures=(
        # NCCL's bootstrap root seeing a rank check in twice: two processes took the same rank
        # (census nccl-warn-bootstrap-checked-in)
        Signature(
            r"Bootstrap Root : rank \d{1,7} of \d{1,7} ranks has already checked in",
            "has already checked in",
        ),
        # ... or processes that disagree on the communicator's size: two jobs (two launches)
        # on one NCCL_COMM_ID or store (bootstrap.cc, NCCL >= 2.23: census
        # nccl-warn-bootstrap-root-mismatch)
        Signature(r"Bootstrap Root : mismatch in info from procs", "mismatch in info from procs"),
        # NCCL_COMM_ID that NCCL cannot read as host:port (bootstrap.cc, misc/socket.cc: census
        # nccl-warn-invalid-comm-id, nccl-warn-net-no-valid-pair)
        Signature(r"Invalid NCCL_COMM_ID, please use format", "Invalid NCCL_COMM_ID"),
        Signature(
            r"Net : No valid <IPv4_or_hostname>:<port> pair found",
            "No valid <IPv4_or_hostname>:<port> pair found",
        ),
        # torchelastic's etcd rendezvous: its store's wait for keys, and a handler in a state it
        # cannot go on from (census rdzv-etcd-store-timeout, rdzv-etcd-worker-must-die)
        Signature(r"Timeout while waiting for keys in EtcdStore", "waiting for keys in EtcdStore"),
        Signature(
            r"Unexpected state of EtcdRendezvousHandler, worker needs to die",
            "Unexpected state of EtcdRendezvousHandler",
        ),
        # the endpoint parser (rendezvous/utils.py) and the static rendezvous without a node
        # rank: an --rdzv-endpoint or --node-rank the nodes cannot meet with
        Signature(
            r"The (?:port number|hostname) of the rendezvous endpoint '[^']{0,300}' must be",
            "of the rendezvous endpoint",
        ),
        Signature(
            r"rank is absent in RendezvousParameters", "rank is absent in RendezvousParameters"
        ),
        # DeepSpeed's runner cannot tell the master's address itself (census
        # ds-master-addr-detect)
        Signature(
            r"Unable to detect suitable master address via 'hostname -I'",
            "Unable to detect suitable master address",
        ),
        # init_process_group (distributed_c10d.py _store_based_barrier): not every rank
        # arrived. Torch prints "store based"; the one paste of it in corpus case 1658's thread
        # reads "store-based", so both are read. It is the wait of the rank that says it; when
        # that rank alone had joined ('worker_count=1', torch 2.x 'num_workers_joined=1'), every
        # other rank never came
        Signature(
            r"Timed out initializing process group in store[ -]based barrier"
            r"(?: on rank:? (?P<rank>\d{1,7}), for key: \S{1,200} \(world_size=(?P<world>\d{1,7}), "
            r"(?:worker_count|num_workers_joined)=(?P<joined>\d{1,7}))?",
            "based barrier",
            echo=Echo.WAITING,
        ),
        # a MASTER_ADDR / rendezvous host name that does not resolve
        Signature(r"Name or service not known"),
        Signature(r"Temporary failure in name resolution"),
        Signature(
            r"The client socket has timed out after (?P<after>\w+) while trying to connect to (?P<endpoint>\S+)",
            "The client socket has timed out",
        ),
        Signature(r"The server socket has failed to (?:listen|bind)"),
        # dynamic_rendezvous.py, an agent at its own shutdown: the store it would close (hosted
        # by another node's agent) is gone already, that node ended first
        Signature(
            r"has failed to shutdown the rendezvous '[^']{0,200}' due to an error of type",
            "has failed to shutdown the rendezvous",
            echo=Echo.LOST_PEER,
        ),
        # ... and its keep-alive thread, which runs only once the rendezvous has formed: the
        # store went away mid-job, its host (the first node's agent) ended first (census
        # elastic-rdzv-heartbeat-failed)
        Signature(
            r"has failed to send a keep-alive heartbeat to the rendezvous '[^']{0,200}' due to "
            r"an error of type",
            "has failed to send a keep-alive heartbeat",
            echo=Echo.LOST_PEER,
        ),
        Signature(r"RendezvousConnectionError"),
        Signature(r"RendezvousTimeoutError"),
        # the rendezvous was closed: by an agent that gave up (its workers failed and its
        # restarts ran out: elastic/agent/server/api.py closes it on the way out), or left over
        # from an earlier job of the same id. Where a failure of another node's workers is in
        # the logs, the closing is its echo (an etcd or c10d rendezvous alike)
        Signature(r"RendezvousClosedError", echo=Echo.LOST_PEER),
        # a store connection that was up and that the other end closed ("got 0 bytes", a reset,
        # a broken pipe): the store's host (rank 0, another node's agent) went away first
        Signature(
            r"(?<!::)DistNetworkError: (?:Failed to (?:recv|send), got 0 bytes|[^\n]{0,200}?"
            r"(?:[Cc]onnection (?:was )?reset by peer|Broken pipe))",
            "DistNetworkError: ",
            echo=Echo.LOST_PEER,
        ),
        Signature(r"(?P<what>EADDRINUSE|[Aa]ddress already in use)", "ddress already in use"),
        # the TCPStore server that cannot listen (socket.cpp): printed by the store's host only
        Signature(
            r"The server socket has failed to listen on any local network address",
            "The server socket has failed to listen",
            store_host=True,
        ),
        # the exception, not its constructor's frame in a C++ backtrace ("c10::DistNetworkError::")
        Signature(
            r"(?<!::)DistNetworkError(?!::|: Failed to (?:recv|send), got 0 bytes"
            r"|: [^\n]{0,200}?(?:[Cc]onnection (?:was )?reset by peer|Broken pipe))",
            "DistNetworkError",
        ),
        # torch/distributed/elastic/rendezvous (c10d/etcd backends): two jobs on one --rdzv-id
        # or a stale store; static_tcp_rendezvous.py / launcher/api.py: a malformed endpoint
        Signature(r"RendezvousStateError"),
        # c10d_rendezvous_backend.py, store_type=file: the store's file could not be made (a
        # path not shared or not writable on every node: census elastic-file-store-creation-failed)
        Signature(
            r"The file creation for C10d store has failed", "The file creation for C10d store"
        ),
        Signature(r"[Pp]ort is (?:absent|missing) in endpoint", "in endpoint"),
        # torch/distributed/rendezvous.py: tcp:// and file:// init_method errors
        Signature(
            r"Error initializing torch\.distributed using (?:tcp|file):// rendezvous",
            "Error initializing torch.distributed using ",
        ),
        # torch <= 1.7 torch/lib/c10d/Utils.cpp tcputil::connect / accept (TCPStore, env://):
        # "connect() timed out." on the clients, the accept timeout on the master
        Signature(r"connect\(\) timed out", "connect() timed out"),
        Signature(r"waiting for processes to connect has timed out"),
        # TCPStoreBackend.cpp: the store server's thread died; every rank loses the store
        Signature(r"TCPStoreMasterDaemon::run\(\) failed", "TCPStoreMasterDaemon::run() failed"),
        # DeepSpeed launcher/runner.py: the hostfile's first node does not answer ssh; its
        # check is `ssh -o PasswordAuthentication=no HOST hostname` (a list since 0.14)
        Signature(r"was not reachable via ssh"),
        Signature(
            r"Command '\[?'?ssh'?,? '?-o'?,? '?PasswordAuthentication=no\b.{0,200}?' returned "
            r"non-zero exit status (?P<code>\d+)",
            "PasswordAuthentication=no",
        ),
        # accelerate utils/launch.py checks MASTER_PORT before starting torchrun
        Signature(
            r"Tried to launch distributed communication on port `(?P<port>\d+)`, but "
            r"(?P<what>another process is utilizing it)",
            "but another process is utilizing it",
        ),
        # TCPStore's server (rank 0, or the agent) waiting for the clients to connect: the rank
        # that says it waited for the ranks that did not come ("3/4 clients joined")
        Signature(
            r"Timed out after \d+ seconds waiting for clients",
            "waiting for clients",
            echo=Echo.WAITING,
        ),
        # NCCL init.cc: a process asked for a rank outside the communicator ("2/2"): the ranks
        # disagree about the world size (--nnodes, WORLD_SIZE, a framework's own count)
        Signature(r"Invalid rank requested : \d+/\d+", "Invalid rank requested"),
    ),
    explanation=Explanation(
        what="The ranks could not reach the rendezvous store (MASTER_ADDR:MASTER_PORT or "
        "--rdzv-endpoint) or it could not start.",
        why="A wrong or unreachable MASTER_ADDR/endpoint, a port already in use (a stale job), "
        "a firewall, nodes started too far apart, or a different --nnodes on each node.",
        fix="Use the master node's reachable address and a free port on every node; kill stale "
        "jobs on that port; start all nodes within the rendezvous timeout.",
        false_positives="None.",
    ),
    fix=(
        "Check MASTER_ADDR/--rdzv-endpoint is the master's address reachable from every node "
        "(nc -zv ADDR PORT) and the port is free (ss -ltnp | grep PORT).",
        "Use the same --nnodes/--nproc-per-node/--rdzv-id on every node; start them together.",
    ),
    # a port in use: another process holds the store's port (a previous run still alive, a
    # second job on the node with the default 29500)
    capture_fix=(
        (
            "what",
            r"EADDRINUSE|[Aa]ddress already in use|another process is utilizing it",
            "The store's port is already taken (a previous run still alive, or a second job on "
            "this node with the default 29500): find the holder with `ss -ltnp | grep PORT` and "
            "stop it, or give each job its own port (torchrun --master_port / --rdzv-endpoint "
            "HOST:PORT, MASTER_PORT).",
        ),
    ),
    positive=(
        "torch.distributed.elastic.rendezvous.api.RendezvousError: The file creation "
        "for C10d store has failed. See inner exception for details.",
        "gpu-a7:31415:31502 [3] bootstrap.cc:114 NCCL WARN Invalid NCCL_COMM_ID, "
        "please use format: <ipv4>:<port> or [<ipv6>]:<port> or <hostname>:<port>",
        "gpu-a7:31415:31502 [3] bootstrap.cc:335 NCCL WARN Bootstrap Root : mismatch "
        "in info from procs, nranks 16 vs 8, nroots 1 vs 1, iroot 0 vs 0, offset 0 vs "
        "0",
        "gpu-n7:2291:2384 [3] bootstrap.cc:145 NCCL WARN Bootstrap Root : rank 1 of 8 ranks has "
        "already checked in",
        "LookupError: Timeout while waiting for keys in EtcdStore",
        "ValueError: The port number of the rendezvous endpoint 'gpu-node-0:$MASTER_PORT' must be "
        "an integer between 0 and 65536.",
        "ValueError: rank is absent in RendezvousParameters.Try add --node-rank to the cmd request",
        "[ERROR] [runner.py:506:main] Unable to detect suitable master address via 'hostname -I', "
        "please manually specify one via --master_addr",
        "[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to "
        "connect to 10.20.0.1:1234",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: "
        "address already in use",
        "RuntimeError: connect() timed out.",
    ),
    negative=("Connection closed by peer [127.0.0.1]:29500",),
)

SLURM_TERMINATED = Rule(
    code="LCH109",
    kind="preempted",
    title="The scheduler ended the job (time limit, preemption, cancel)",
    sources="slurmstepd, torchelastic SignalException",
    specificity=20,
    signatures=(
        # the torchelastic agent itself received SIGTERM (from the scheduler or a user)
        # a stop from outside: the scheduler's, a user's, or `ddpdoctor run`'s after a hang
        Signature(
            # (SIGHUP, 1, is the terminal's: LCH120). The signal is an IntEnum, which Python
            # 3.10 and older print by name ("Received Signals.SIGTERM death signal")
            r"Received (?:(?P<signum>15|10|12)|(?P<sig>Signals\.SIG(?:TERM|USR1|USR2))) "
            r"death signal, shutting down workers",
            " death signal",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO (?P<reason>TIME LIMIT|PREEMPTION) \*\*\*",
            "CANCELLED AT",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"SignalException: Process \d+ got signal: "
            r"(?:(?P<signum>15|10|12)\b|(?P<sig>Signals\.SIG(?:TERM|USR1|USR2))\b)",
            "SignalException",
            echo=Echo.STOPPED,
        ),
        # the exception's name alone (a paste that kept its last line without the message):
        # torchrun's agent got a signal from outside, which one is not said
        Signature(
            r"^\**(?:torch\.distributed\.elastic\.multiprocessing\.api\.)?SignalException\s*$",
            "SignalException",
            echo=Echo.STOPPED,
        ),
        Signature(r"DUE TO (?P<reason>TIME LIMIT|PREEMPTION)", "DUE TO ", echo=Echo.STOPPED),
        # PBS's pbs_mom at the walltime limit ('=>> PBS: job killed: walltime 3611 exceeded
        # limit 3600'), LSF's job report's termination reasons (TERM_RUNLIMIT: 'job killed after
        # reaching LSF run time limit.', TERM_PREEMPT, TERM_DEADLINE): the batch system's words
        # for the whole job
        Signature(
            r"PBS: job killed: (?P<reason>walltime) \d{1,12} exceeded limit \d{1,12}",
            "PBS: job killed: ",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"\b(?P<reason>TERM_(?:RUNLIMIT|PREEMPT|DEADLINE)): job killed after",
            ": job killed after",
            echo=Echo.STOPPED,
        ),
        # Grid Engine (Son of Grid Engine 8.1.9): qdel's answer to the user ('root has registered
        # the job 36 for deletion'), and qacct's record of a job the qmaster ended at one of its
        # limits ('failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit': which one,
        # its 'maxvmem' against the h_vmem of its 'category' says)
        Signature(
            r"\bhas registered the job \d{1,12}(?:\.\d{1,9})? for deletion",
            "for deletion",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"^failed\s{1,20}37\s{0,4}: (?P<reason>qmaster enforced h_rt, h_cpu,? or h_vmem "
            r"limit)",
            "qmaster enforced h_rt",
            echo=Echo.STOPPED,
        ),
        # MPICH's / Intel MPI's Hydra at its own time limit (MPIEXEC_TIMEOUT; src/pm/hydra's
        # pmiserv_pmci.c: 'APPLICATION TIMED OUT, TIMEOUT = 40s'), then it kills every process
        # with SIGKILL ('KILLED BY SIGNAL: 9' in its boxes): the launcher's kills
        Signature(
            r"(?P<reason>APPLICATION TIMED OUT), TIMEOUT = \d{1,9}s",
            "APPLICATION TIMED OUT, TIMEOUT = ",
            echo=Echo.STOPPED,
        ),
        # a rank's own handler saying the stop reached it: Lightning's signal_connector.py
        # ("[rank: 1] Received SIGTERM: 15"), scripts' handlers ("SIGTERM received: pod is
        # terminating"): stopped from outside (by its launcher after a peer failed, by the
        # scheduler or the kubelet)
        Signature(
            # (not Ray's "the actor's node was terminated expectedly: received SIGTERM")
            r"\b(?:(?<!expectedly: )[Rr]eceived SIGTERM|SIGTERM received)\b",
            "SIGTERM",
            echo=Echo.STOPPED,
        ),
        # DeepSpeed launcher/launch.py sigkill_handler: the launcher itself got SIGINT/SIGTERM
        # (a failing rank makes it print "exits with return code" instead; SIGINT is a person)
        Signature(
            r"Main process received (?P<sig>SIGTERM), exiting",
            "Main process received",
            echo=Echo.STOPPED,
        ),
        # Lightning trainer/connectors/signal_connector.py: Slurm's warning signal before
        # preemption or the time limit (--signal=USR1@90), then the requeue
        # ... and the SystemExit its fit loop raises once SIGTERM arrived (pytorch/loops/
        # fit_loop.py, utilities/exceptions.py: census lightning-sigterm-exception)
        Signature(
            r"^\**(?:(?:lightning\.pytorch|pytorch_lightning)\.utilities\.exceptions\.)?"
            r"SIGTERMException\b",
            "SIGTERMException",
            echo=Echo.STOPPED,
        ),
        Signature(r"Handling auto-requeue signal: (?P<signum>\d+)", "Handling auto-requeue signal"),
        Signature(r"requeing job (?P<job>\d+)", "requeing job "),
        # Kubernetes pkg/kubelet/nodeshutdown: the kubelet's graceful node shutdown (a spot
        # reclaim, a drain) ended the pod (census k8s-node-shutdown-terminated)
        Signature(
            r"Pod was terminated in response to imminent node shutdown",
            "in response to imminent node shutdown",
            echo=Echo.STOPPED,
        ),
        Signature(r"Requeued SLURM job: (?P<job>\d+)", "Requeued SLURM job"),
        Signature(r"Requeuing SLURM job (?P<job>\d+) failed", "Requeuing SLURM job"),
        # submitit core/job_environment.py and slurm/slurm.py: the same signal, caught by
        # submitit, which checkpoints and requeues
        Signature(
            r"Caught signal (?P<sig>SIG\w+) on \S+: this job is (?P<reason>preempted|timed-out)",
            ": this job is ",
        ),
        Signature(r"Requeued job (?P<job>\d+) \(\d+ remaining timeouts\)", "remaining timeouts"),
        Signature(r"Exiting gracefully after preemption/timeout"),
        # slurmstepd req.c: the job was requeued (preemption mode REQUEUE, scontrol requeue)
        Signature(r"CANCELLED AT \S+ DUE TO JOB REQUEUE", "DUE TO JOB REQUEUE"),
        # scancel (a user or an operator): slurmstepd names no reason
        Signature(
            r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ \*\*\*",
            "CANCELLED AT",
            echo=Echo.STOPPED,
        ),
        # slurmstepd's cancel line cut right after the host (a paste, a log copied while it was
        # written): "*** JOB|STEP <id> ON" starts only its CANCELLED AT messages (req.c)
        Signature(
            r"error: \*\*\* (?:JOB|STEP) \d+(?:\.\w+)? ON(?: \S+)?\s*$",
            "*** ",
            echo=Echo.STOPPED,
        ),
        # Determined's agent: a trial's container ended by SIGTERM from outside (a docker stop,
        # an agent drained): 143, or 241 from its launch layer's sys.exit(-15)
        Signature(
            r"container failed with non-zero exit code: (?:143|241)\b",
            "container failed with non-zero exit code",
            echo=Echo.STOPPED,
        ),
        # bash's job control when the job it started died of SIGTERM (strsignal: "Terminated"):
        # alone on its line at a prompt, or a script's "run.sh: line 12:  4242 Terminated
        # python train.py"; the shell reports its own child only, so the signal came from
        # outside the job (a time limit's `timeout`, a scheduler, a kill), not from a launcher
        # stopping its workers
        Signature(r"^Terminated\s*$", "Terminated", echo=Echo.STOPPED),
        Signature(r": line \d{1,6}: +\d{1,9} Terminated(?: |$)", " Terminated", echo=Echo.STOPPED),
        # Kubernetes scheduler (DisruptionTarget condition of a preempted pod)
        Signature(r": preempting to accommodate a higher priority", "preempting to accommodate"),
        # Ray GCS (gcs_actor_manager.cc): an actor lost with its node, drained for preemption
        Signature(r"the actor's node was preempted: ", "the actor's node was preempted"),
        # Ray's autoscaler (autoscaler/v2): the platform is taking the node away (not "idle",
        # a scale-down of a node with nothing on it)
        Signature(
            r"will be terminated soon \(reason: (?P<reason>kubernetes-pod-termination|"
            r"[\w-]*(?:preempt|spot|interrupt)[\w-]*)\)",
            "will be terminated soon (reason: ",
        ),
    ),
    explanation=Explanation(
        what="The scheduler stopped the job: time limit, preemption or cancellation.",
        why="The job ran longer than its allocation or was preempted by higher-priority work; "
        "torchrun received SIGTERM and passed it on.",
        fix="Checkpoint regularly and resume (requeue), or ask for a longer time limit.",
        false_positives="A SIGTERM sent by a user looks the same in torchrun's output.",
    ),
    capture_fix=(
        (
            "reason",
            r"qmaster enforced .{1,60}",
            "Grid Engine ended the job at one of its limits: compare the qacct record's maxvmem "
            "with the h_vmem of its category line (memory: lower what each rank holds, or ask "
            "for more h_vmem per slot) and its ru_wallclock with h_rt (run time: ask for more, or "
            "save checkpoints and resume; qsub -notify sends SIGUSR2 first).",
        ),
    ),
    fix=(
        "Save checkpoints periodically and resume on restart (Slurm --requeue / --signal=USR1@120).",
        "Ask for a longer time limit (--time) if the job simply needs it.",
    ),
    positive=(
        "=>> PBS: job killed: walltime 3611 exceeded limit 3600",
        "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
        "  Message:          Pod was terminated in response to imminent node shutdown.",
        "lightning.pytorch.utilities.exceptions.SIGTERMException",
        "slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***",
        "torch.distributed.elastic.multiprocessing.api.SignalException",
        "Handling auto-requeue signal: 10",
        "submitit WARNING (2026-11-30 10:00:00,000) - Caught signal SIGUSR2 on node042: this job "
        "is preempted.",
        "[2026-05-07T14:10:47.011] error: *** STEP 2210587.1 ON",
        "\tthe actor's node was preempted: spot instance reclaimed",
        # set 108 (Determined)
        "ERROR: crashed: resources failed with non-zero exit code: container failed with non-zero "
        "exit code: 241 (exit code 241)",
        "(autoscaler +51m03s) Instance k-7c30d9e4b0001 (node IP: 10.4.117.52) will be "
        "terminated soon (reason: kubernetes-pod-termination).",
        # torch under Python 3.10 and older names the signal (an IntEnum printed with %s)
        "W0611 02:41:53.118402 140213958416192 torch/distributed/elastic/agent/server/api.py:"
        "741] Received Signals.SIGTERM death signal, shutting down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3155 got "
        "signal: Signals.SIGTERM",
        # set 130 (ParlAI under `timeout`), and a script's report of the same
        "Terminated",
        "./train.sh: line 12:  4242 Terminated              python train.py --epochs 3",
        "[mpiexec@node01] APPLICATION TIMED OUT, TIMEOUT = 40s",
        # set 161 (Son of Grid Engine 8.1.9)
        "root has registered the job 36 for deletion",
        "failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit",
    ),
    negative=(
        "  Message:          Pod was rejected as the node is shutting down.",
        "    raise SIGTERMException",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0",
        "ERROR: crashed: resources failed with non-zero exit code: container failed with non-zero "
        "exit code: 1 (exit code 1)",
        "W0611 02:41:53.118402 140213958416192 torch/distributed/elastic/agent/server/api.py:"
        "741] Received Signals.SIGHUP death signal, shutting down workers",
        "W0611 02:41:53.118402 140213958416192 torch/distributed/elastic/agent/server/api.py:"
        "741] Received Signals.SIGINT death signal, shutting down workers",
        "\tthe actor's node was terminated expectedly: received SIGTERM",
        "(autoscaler +9m02s) Instance k-2f94ae1c60000 (node IP: 10.4.23.209) will be "
        "terminated soon (reason: idle).",
        "slurmstepd: error: *** JOB 1234 STEPD TERMINATED ON node01 AT 2024-01-01T00:00:00 DUE "
        "TO JOB NOT ENDING WITH SIGNALS ***",
        "RuntimeError: DataLoader worker (pid 29417) is killed by signal: Terminated. ",
        "Process terminated",
    ),
)

TERMINAL_HANGUP = Rule(
    code="LCH120",
    kind="preempted",
    category=Category.CONFIGURATION,
    title="The terminal or ssh session that started the job closed (SIGHUP)",
    sources="torchelastic agent/server/api.py and multiprocessing/api.py (SignalException)",
    specificity=20,
    signatures=(
        # signal 1; Python 3.10 and older print the IntEnum by name
        Signature(
            r"Received (?:(?P<signum>1)|(?P<sig>Signals\.SIGHUP)) death signal, shutting down "
            r"workers",
            " death signal",
            echo=Echo.STOPPED,
        ),
        Signature(
            r"SignalException: Process \d+ got signal: (?:(?P<signum>1)|(?P<sig>Signals\.SIGHUP))\b",
            "SignalException",
            echo=Echo.STOPPED,
        ),
    ),
    explanation=Explanation(
        what="torchrun received SIGHUP and stopped every worker.",
        why="SIGHUP is what a terminal sends the processes it started when it closes: the ssh "
        "session dropped or was closed, or the shell exited. torchrun installs its own handler "
        "for it (over nohup's), so a job started with `nohup ... &` from that terminal is "
        "stopped too, as a scheduler's SIGTERM would stop it.",
        fix="Start the job detached from the terminal: inside tmux or screen, or with `setsid "
        "torchrun ... > train.log 2>&1 < /dev/null &`; recent torch leaves SIGHUP alone with "
        "TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGQUIT.",
        false_positives="A SIGHUP sent on purpose (`kill -HUP`) looks the same.",
    ),
    fix=(
        "Run it inside tmux or screen, or fully detached: `setsid torchrun ... > train.log 2>&1 "
        "< /dev/null &` (nohup alone is not enough: torchrun installs its own SIGHUP handler "
        "over nohup's).",
        "With recent torch, TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGQUIT leaves SIGHUP "
        "to its default (or to nohup).",
        "Resume from the last checkpoint: the training itself did not fail.",
    ),
    positive=(
        "W0611 02:41:53.118402 140213958416192 torch/distributed/elastic/agent/server/api.py:"
        "741] Received Signals.SIGHUP death signal, shutting down workers",
        "WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting "
        "down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 21771 got "
        "signal: 1",
    ),
    negative=(
        "W1130 13:00:00.100000 4242 torch/distributed/elastic/agent/server/api.py:753] Received "
        "15 death signal, shutting down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got "
        "signal: 15",
        "Sending process 731204 closing signal SIGHUP",
    ),
)

WARNING_SIGNAL_HANDLED = Rule(
    code="LCH118",
    kind="preempted",
    title="The ranks were warned of a preemption or the time limit and stopped on purpose",
    sources="training programs' signal handlers (Slurm sbatch --signal=USR1@N, LSF, SGE); "
    "Determined's master (a preemption its trials check for with should_preempt())",
    severity="info",
    marker=Marker.WARNED,
    specificity=10,
    signatures=(
        # a program's own handler of the signal a scheduler sends before the time limit or a
        # preemption (sbatch --signal=[B:]USR1@120; SIGUSR2 for submitit and LSF): "caught
        # SIGUSR1 at epoch 8", "Received SIGUSR2, saving a checkpoint", "got signal USR1".
        # Not Lightning's "Handling auto-requeue signal" (LCH109: it requeues the job itself),
        # nor a handler being installed ("registering handler for SIGUSR1")
        *(
            Signature(
                r"(?i:\b(?:caught|received|got|trapped|handling))\s+(?:the\s+)?(?:signal\s+)?"
                rf"(?P<sig>(?:SIG)?{name})\b(?![_=(])",
                name,
            )
            for name in ("USR1", "USR2")
        ),
        # habitat-lab's DD-PPO (habitat_baselines/rl/ddppo/ddp_utils.py): its handler of the
        # requeue signal (SIGUSR1 under Slurm) prints this on each process, and rank 0 then
        # logs the job it hands back to the scheduler ('scontrol requeue')
        Signature(r"^Got signal to requeue\s*$", "Got signal to requeue"),
        Signature(r"^Requeueing job \d{1,12}\s*$", "Requeueing job "),
        # Determined's master once a trial it preempted (a pause, a higher-priority job) had
        # checkpointed and every process of it had exited
        # (its reason is the scheduler's, for the whole job)
        Signature(
            r"\ballocation (?P<reason>preempted) after all resources exited\b",
            "allocation preempted",
        ),
    ),
    explanation=Explanation(
        what="Every rank's handler of the scheduler's warning signal (SIGUSR1/SIGUSR2) stopped "
        "training, or the platform preempted the job and its processes exited on their own "
        "(Determined: 'allocation preempted after all resources exited'): the time limit or a "
        "preemption was near.",
        why="A batch job asked the scheduler for a signal before its end (Slurm's "
        "--signal=USR1@120); the program saved its state and left, so the job can be requeued "
        "and resumed. When every rank stops together and exits 0, nothing failed.",
        fix="Nothing, if the job is requeued and resumes from the checkpoint; if a rank stops "
        "alone, agree on the stop across ranks (all-reduce the flag) before leaving the loop.",
        false_positives="A program that sends itself SIGUSR1 for another purpose (a stack dump, "
        "a log rotation) and carries on.",
    ),
    fix=(
        "Resume from the checkpoint saved on the signal (requeue the job: sbatch --requeue, or "
        "`scontrol requeue $SLURM_JOB_ID` in the handler).",
        "Give the handler time: --signal=USR1@SECONDS larger than one step plus a checkpoint.",
    ),
    positive=(
        "[rank 0] caught SIGUSR1 at epoch 8 it 22",
        "Received SIGUSR2: saving checkpoint before the time limit",
        "got signal USR1, stopping after this step",
        # habitat-lab DD-PPO's requeue handler and its requeue of the Slurm job (set 145)
        "Got signal to requeue",
        "Requeueing job 4699",
        # set 108 (Determined, a trial paused by its user)
        "[2026-12-06T11:52:46.965049Z]          || INFO: Trial 16 (Experiment 11) was terminated: "
        "allocation preempted after all resources exited: resources exited successfully with a "
        "zero exit code",
    ),
    negative=(
        "Handling auto-requeue signal: 10",
        "registering a handler for SIGUSR1",
        "signal.signal(signal.SIGUSR1, handler)",
        "caught SIGUSR1_flag=0",
        # a job queue's retry of its own task, no scheduler's requeue
        "Requeueing job 12 (retry 2/3)",
    ),
)

INTERRUPTED = Rule(
    code="LCH112",
    kind="hang",
    title="The launcher was interrupted (SIGINT: Ctrl-C)",
    sources="torchelastic agent/server/api.py and multiprocessing/api.py, DeepSpeed launch.py",
    severity="info",
    echo=Echo.STOPPED,
    specificity=15,
    signatures=(
        # the torchrun agent got SIGINT (2): a person at its terminal (census: benign)
        Signature(
            r"Received (?:(?P<signum>2)|Signals\.(?P<sig>SIGINT)) death signal, shutting down workers",
            " death signal",
        ),
        Signature(
            r"SignalException: Process \d+ got signal: (?:(?P<signum>2)|Signals\.(?P<sig>SIGINT))\b",
            "SignalException",
        ),
        # DeepSpeed launcher/launch.py sigkill_handler
        Signature(r"Main process received (?P<sig>SIGINT), exiting", "Main process received"),
        # srun (src/srun/srun_job.c _handle_intr) and pdsh, DeepSpeed's multi-node runner
        # (src/pdsh/dsh.c int_handler), on the SIGINT they got: the first one lists the tasks
        # or hosts still running, a second within a second aborts them
        Signature(
            r"(?:\bsrun|\bpdsh@[\w.-]{1,200}): interrupt \(one more within \d{1,3} sec to abort\)",
            "interrupt (one more within",
        ),
        Signature(
            r"\bpdsh@[\w.-]{1,200}: (?:batch mode )?interrupt, aborting\.", "interrupt, aborting."
        ),
        # Ray Tune (tune/tune.py), which Ray Train runs under: the driver got SIGINT, stopped
        # the trial and returned as if the run had ended
        Signature(
            r"Stop signal received \(e\.g\. via (?P<sig>SIGINT)/Ctrl\+C\), ending Ray Tune run",
            "Stop signal received (e.g. via SIGINT/Ctrl+C)",
        ),
    ),
    explanation=Explanation(
        what="The launcher received SIGINT and passed it on to the workers.",
        why="SIGINT is Ctrl-C in the terminal that started the job: a person stopped it "
        "(schedulers send SIGTERM). Not a failure itself: what came before it says why.",
        fix="If the job was stuck when it was stopped, find where the ranks waited (the "
        "verdict says what the logs show).",
        false_positives="A job stopped on purpose although it was fine.",
    ),
    fix=("If it was stuck: run it under `ddpdoctor run` to catch the stall and the stacks.",),
    positive=(
        "WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting "
        "down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 2",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: "
        "Signals.SIGINT",
        "2026-12-02 09:48:12,846\tWARNING tune.py:219 -- Stop signal received (e.g. via "
        "SIGINT/Ctrl+C), ending Ray Tune run. This will try to checkpoint the experiment state "
        "one last time.",
        "srun: interrupt (one more within 1 sec to abort)",
        "pdsh@node1: interrupt (one more within 1 sec to abort)",
        "pdsh@node1: interrupt, aborting.",
    ),
    negative=(
        "W1130 13:00:00.100000 4242 torch/distributed/elastic/agent/server/api.py:753] Received "
        "15 death signal, shutting down workers",
    ),
)

STORE_WENT_AWAY = Rule(
    code="LCH119",
    kind="rendezvous-failure",
    title="A background thread lost the c10d store (its host exited)",
    sources="torch/csrc/distributed/c10d/TCPStore.cpp (a warning before the error is rethrown: "
    "'{} failed on {}: {}'), ProcessGroupNCCL.cpp's heartbeat monitor ('should dump' flag up to "
    "torch 2.9, 'the signal ...' in 2.14)",
    severity="warning",
    specificity=70,
    signatures=(
        # the NCCL heartbeat monitor polls the store every few seconds; the store lives in rank
        # 0's process or in the first node's torchrun agent, and once that exited this thread
        # says so and carries on
        Signature(
            r'Failed to check the (?:"should dump" flag|signal \S{1,60}) on TCPStore',
            "Failed to check the ",
        ),
        # TCPStore's client logs the failed call as a warning, then raises it to its caller:
        # the caller's own error (DistNetworkError, DistStoreError) says what it ended
        Signature(
            r"\[c10d\] (?:recvValue|recvValueWithTimeout|recvVector|sendBytes|recvBytes) failed on "
            r"SocketImpl\(",
            " failed on SocketImpl(",
        ),
    ),
    explanation=Explanation(
        what="A warning that a call to the c10d store (TCPStore) failed because its server "
        "closed the connection: the NCCL heartbeat monitor's poll, or any store call just "
        "before its caller raises.",
        why="The store is served by rank 0's process or by the first node's torchrun agent. "
        "When that process exits (it finished first, or failed), every other process's next "
        "store call fails. At the end of a run this is teardown noise: rank 0 finished and "
        "exited while the others were still shutting down.",
        fix="At the end of training call dist.barrier() and destroy_process_group() on every "
        "rank, so no rank exits while the others still poll the store; if the job failed, the "
        "cause is in the output of the process that hosted the store.",
        false_positives="None as a cause: it only says that the store's host went away; the "
        "caller's own error, or the host's log, says why.",
    ),
    fix=(
        "If the run had finished: end every rank with dist.barrier(); "
        "dist.destroy_process_group() so rank 0 does not exit first.",
        "Otherwise read the log of the process that hosted the store (rank 0, or the first "
        "node's torchrun agent): it ended first.",
    ),
    positive=(
        "[rank7]:[W624 12:52:07.296197118 ProcessGroupNCCL.cpp:1659] [PG ID 0 PG GUID 0 Rank 7] "
        'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut '
        "down too early), with error: Broken pipe",
        "[W1202 15:30:42.569794734 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=3, "
        "addr=[::ffff:127.0.0.1]:49818, remote=[::ffff:127.0.0.1]:30437): Broken pipe",
    ),
    negative=(
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
        "closed. Did the remote server shutdown or crash?",
    ),
)

AGENT_LOST_STORE = Rule(
    code="LCH121",
    kind="rendezvous-failure",
    title="A node's torchrun lost the rendezvous store while its workers ran (its host ended)",
    sources="torch/distributed/elastic/agent/server/api.py _invoke_run (num_nodes_waiting), "
    "rendezvous/c10d_rendezvous_backend.py _call_store",
    echo=Echo.LOST_PEER,
    specificity=85,
    signatures=(Signature(r"RendezvousConnectionError"),),
    # the agent's monitoring loop, after the rendezvous had formed: it polls the store for
    # nodes waiting to join, and the store's host (the first node's agent) had exited
    context_all=(r"num_nodes_waiting|in _invoke_run\b",),
    explanation=Explanation(
        what="A node's torchrun agent, watching its running workers, could not reach the c10d "
        "rendezvous store: RendezvousConnectionError raised under its monitoring loop "
        "(num_nodes_waiting), not while the nodes were meeting.",
        why="The store lives in the agent of the node that hosts the rendezvous endpoint. Once "
        "that agent exits (its workers failed, or it was stopped), every other node's agent "
        "loses the store at its next poll: a consequence of the first node's end.",
        fix="Read the first node's output: what ended its workers is the cause.",
        false_positives="None as a cause: a rendezvous that never formed fails while joining "
        "(next_rendezvous), read as LCH108.",
    ),
    fix=("Look at the node that hosted the rendezvous store: its workers ended first.",),
    positive=(
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to "
        "the C10d store has failed. See inner exception for details.",
    ),
    negative=("RendezvousTimeoutError",),
)

RENDEZVOUS_RETRY = Rule(
    code="LCH110",
    kind="rendezvous-failure",
    title="A rank retried connecting to the rendezvous store",
    sources="torch/csrc/distributed/c10d/socket.cpp (a warning; torch retries until its timeout)",
    severity="warning",
    specificity=30,
    signatures=(
        Signature(
            r"The client socket has failed to connect to (?P<endpoint>\S+)",
            "The client socket has failed to connect to",
        ),
        # the same retry when nothing listens at the address (socket.cpp, torch 2.x)
        Signature(
            r"No socket on (?P<endpoint>\([^()\s]{1,255}, \d{1,5}\)) is listening yet, will retry",
            "is listening yet, will retry",
        ),
    ),
    explanation=Explanation(
        what="A rank could not connect to MASTER_ADDR:MASTER_PORT yet and will retry.",
        why="Usually harmless: the master had not started listening yet. It only matters when "
        "the rendezvous then times out (LCH108).",
        fix="Nothing, unless the job then fails at rendezvous: then check the address and port.",
        false_positives="Printed by healthy jobs whose ranks start before the master.",
    ),
    fix=("Only if the rendezvous then fails: check MASTER_ADDR/MASTER_PORT from every node.",),
    positive=(
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 "
        "(errno: 99 - Cannot assign requested address).",
        "[default7]:[I715 09:13:52.847216530 socket.cpp:872] [c10d] No socket on (localhost, 0) "
        "is listening yet, will retry.",
    ),
    negative=("[c10d] The client socket has connected to [::ffff:127.0.0.1]:34957 on SocketImpl",),
)

STORE_ERROR = Rule(
    code="LCH111",
    kind="rendezvous-failure",
    title="The c10d store (TCPStore) failed or timed out",
    sources="torch/csrc/distributed/c10d/TCPStore.cpp (DistStoreError)",
    echo=Echo.LOST_PEER,
    specificity=20,
    signatures=(
        # a request that waited for a key nobody set in time (torch < 2's RuntimeError, later
        # DistStoreError): a wait, like a collective's timeout, for a rank that was late (busy
        # alone before its set: preprocessing on rank 0) or gone
        Signature(
            r"(?:DistStoreError|RuntimeError): Socket Timeout\s*$",
            "Socket Timeout",
            echo=Echo.WAITING,
        ),
        Signature(r"DistStoreError"),
    ),
    explanation=Explanation(
        what="A rank's request to the c10d key-value store failed or timed out.",
        why="The store lives in the master's agent (or rank 0): when that process died or is "
        "stuck, every other rank gets this error; otherwise the store is unreachable.",
        fix="Look at the master node / rank 0 first; if it was healthy, check MASTER_ADDR and "
        "MASTER_PORT reachability from every node.",
        false_positives="Usually an echo of rank 0 or the master agent failing.",
    ),
    fix=(
        "Read rank 0's and the master node's log first.",
        "Check that MASTER_ADDR:MASTER_PORT is reachable from every node (nc -zv ADDR PORT).",
    ),
    positive=(
        "torch.distributed.DistStoreError: Socket Timeout",
        # corpus case 1235 (torch 1.x: Megatron's other ranks waiting for rank 0's index map)
        "RuntimeError: Socket Timeout",
    ),
    negative=("torch.distributed.DistNetworkError: The server socket has failed to listen",),
)

FILE_STORE_WAIT = Rule(
    code="LCH125",
    kind="rendezvous-failure",
    title="A rank waited at init for peers that never registered in the file store",
    sources="torch/csrc/distributed/c10d/FileStore.cpp (wait), raised through "
    "ProcessGroupGloo's constructor in init_process_group",
    specificity=30,  # above the RuntimeError it is raised as
    context_all=(r"init_process_group|ProcessGroupGloo|_new_process_group_helper|FileStore",),
    signatures=(Signature(r"^RuntimeError: Wait timeout\s*$", "Wait timeout"),),
    explanation=Explanation(
        what="init_process_group with a file:// init method (a FileStore) waited for the other "
        "ranks to write their keys into the shared file, and they never did within the "
        "timeout: the process group was never formed.",
        why="The other ranks never started, started later than the timeout, or use another "
        "file: the path is not on a file system every node shares (a local /tmp, a network "
        "share that does not support locks or is cached per node), or an old file from an "
        "earlier run was left behind.",
        fix="Start every rank with the same init_method path on a file system all nodes share "
        "(with working file locks), delete the file before each run, or use env:// or tcp://.",
        false_positives="A rank that waits here while another one failed earlier: read that "
        "rank's own output first.",
    ),
    fix=(
        "Delete the store file before each run and point every rank at the same path on a "
        "shared file system with working locks (not a local /tmp, not an SMB share without "
        "locking).",
        "Or rendezvous over TCP instead: init_method='env://' with MASTER_ADDR/MASTER_PORT.",
    ),
    positive=("RuntimeError: Wait timeout",),
    negative=(
        "torch.distributed.DistStoreError: wait timeout after 15000ms, keys: /default_pg/0//cpu",
        "RuntimeError: Timed out waiting 15000ms for recv operation to complete",
    ),
)

STORE_WITHOUT_LIBUV = Rule(
    code="LCH124",
    kind="rendezvous-failure",
    title="TCPStore asked for its libuv backend, which this PyTorch build lacks",
    sources="torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp (torch 2.4-2.13; 2.4 wrote "
    "'was build without')",
    category=Category.ENVIRONMENT,
    specificity=70,  # above the DistStoreError / RuntimeError the message is raised as
    signatures=(
        Signature(
            r"use_libuv was requested but PyTorch was buil[dt] without libuv support",
            "use_libuv was requested",
        ),
    ),
    explanation=Explanation(
        what="The c10d store could not be created: the store was asked for its libuv backend "
        "(the default since torch 2.4) and this PyTorch was built without libuv, as the "
        "Windows and some source builds are. No rank got past start-up.",
        why="torch 2.4 made libuv the TCPStore default; builds without it (Windows wheels of "
        "2.4, custom builds) refuse unless the store is told not to use it.",
        fix="Set USE_LIBUV=0 in the environment of every rank (or add use_libuv=0 to the "
        "init_method URL), or use a PyTorch whose build or default matches (2.4.1+ on Windows "
        "defaults to the old backend).",
        false_positives="None: raised only when the store could not be created.",
    ),
    fix=(
        "Set USE_LIBUV=0 in the environment of every rank (or use_libuv=0 in the "
        "init_method URL, e.g. tcp://host:port?use_libuv=0).",
        "Or upgrade PyTorch (2.4.1+ on Windows no longer asks for libuv by default).",
    ),
    positive=(
        "torch.distributed.DistStoreError: use_libuv was requested but PyTorch was built without "
        "libuv support, run with USE_LIBUV=0 to disable it.",
    ),
    negative=("torch.distributed.DistStoreError: Socket Timeout",),
)

SLURM_STEP_REFUSED = Rule(
    code="LCH117",
    kind="rendezvous-failure",
    title="srun could not create the job step: the ranks never started",
    sources="Slurm src/srun/step_ctx.c, src/api/step_launch.c (16.05-26.05)",
    specificity=75,
    signatures=(
        Signature(
            r"srun: error: Unable to create step for job (?P<job>\d+): (?P<reason>[^\n]{1,200})",
            "Unable to create step for job",
        ),
        # ... or created it but could not start its tasks on a node (api/step_launch.c, Slurm
        # >= 20.11: census slurm-task-launch-failed): that node's ranks never started
        Signature(
            r"Task launch for StepId=(?P<job>\d+)\.\w+ failed on node \S+: (?P<reason>[^\n]{1,200})",
            "Task launch for StepId=",
        ),
    ),
    explanation=Explanation(
        what="srun asked the allocation for a job step it cannot hold (more tasks, CPUs, GPUs "
        "or memory than the job was given, or nodes it does not have): no rank started.",
        why="The srun line and the #SBATCH lines disagree: --ntasks-per-node, --cpus-per-task "
        "or --gpus-per-task times the tasks exceed the allocation, or a step still holds the "
        "resources.",
        fix="Make the srun request fit the allocation (same --ntasks, --cpus-per-task and "
        "--gpus as #SBATCH, or fewer), or free the resources another step holds.",
        false_positives="None: srun prints it only when it could not create the step.",
    ),
    fix=(
        "Compare the srun options with the allocation (`scontrol show job $SLURM_JOB_ID`): "
        "tasks x --cpus-per-task and the GPUs per task must fit what #SBATCH asked for.",
    ),
    positive=(
        "srun: error: Task launch for StepId=4242.0 failed on node gpu-n12: Invalid job credential",
        "srun: error: Unable to create step for job 4242: More processors requested than permitted",
    ),
    negative=("srun: Job 4242 step creation temporarily disabled, retrying",),
)

REMOTE_START_FAILED = Rule(
    code="LCH123",
    kind="rendezvous-failure",
    title="The launcher could not start the job on another node (ssh, pdsh, mpirun's daemons)",
    sources="OpenSSH ssh (connect, resolve, host key, authentication), pdsh's ssh module "
    "(exit code 255), Open MPI orte/mca/plm help-plm-base.txt (daemons not started)",
    category=Category.CONFIGURATION,
    specificity=80,  # above LCH108, which reads any "Name or service not known"
    signatures=(
        Signature(
            r"ssh: connect to host (?P<endpoint>[\w.:-]{1,200}) port \d{1,5}: (?P<reason>Connection "
            r"refused|No route to host|Connection timed out|Network is unreachable)",
            "ssh: connect to host",
        ),
        Signature(
            r"ssh: Could not resolve hostname (?P<endpoint>[\w.:-]{1,200})",
            "ssh: Could not resolve hostname",
        ),
        Signature(r"^(?:[\w.-]{1,200}: )?Host key verification failed\.", "Host key verification"),
        Signature(r"Permission denied \(publickey[\w,-]{0,80}\)", "Permission denied (publickey"),
        # pdsh's report on a node whose ssh itself failed (255 is ssh's own error, not the
        # remote command's exit code)
        Signature(r"ssh exited with exit code 255\b", "ssh exited with exit code 255"),
        # Open MPI could not start its daemon (orted) on a node: ssh, PATH or LD_LIBRARY_PATH
        Signature(
            r"ORTE was unable to reliably start one or more daemons",
            "ORTE was unable to reliably start",
        ),
        Signature(r"(?:bash|sh): orted: command not found", "orted: command not found"),
    ),
    explanation=Explanation(
        what="A multi-node launcher (DeepSpeed's pdsh runner, mpirun, a launch script) logs in "
        "to the other nodes over ssh to start the ranks there, and could not: the connection, "
        "the host name, the host key or the login failed, or mpirun's daemon did not start.",
        why="The nodes' ranks never started, so the job cannot form: wrong names in the "
        "hostfile, passwordless ssh not set up between the nodes (or not for this user, or "
        "not in the container), sshd on another port, a firewall, or the remote PATH / "
        "LD_LIBRARY_PATH without the MPI installation.",
        fix="Make `ssh <node> hostname` work from the launching node without a password for "
        "every node of the hostfile (keys in ~/.ssh/authorized_keys, known_hosts filled, the "
        "right port: DeepSpeed's --ssh_port); for mpirun, the same MPI at the same path on "
        "every node (or --prefix).",
        false_positives="An ssh error of another program the job runs (a git clone, a data "
        "sync) reads the same.",
    ),
    fix=(
        "From the launching node run `ssh <node> hostname` for every node in the hostfile: it "
        "must answer without a password or a prompt (copy the key with ssh-copy-id, accept the "
        "host key once, use the port sshd listens on: deepspeed --ssh_port).",
        "For mpirun: install the same MPI at the same path on every node, or pass --prefix; "
        "check that a non-interactive shell on the node has it on PATH and LD_LIBRARY_PATH.",
    ),
    positive=(
        "worker-1: ssh: connect to host worker-1 port 22: Connection refused",
        "ssh: Could not resolve hostname node-7: Name or service not known",
        "pdsh@head0: worker-b: ssh exited with exit code 255",
        "ORTE was unable to reliably start one or more daemons.",
        "bash: orted: command not found",
    ),
    negative=(
        "pdsh@head0: worker-b: ssh exited with exit code 1",
        "Connection to 10.0.0.5 closed.",
    ),
)

RULES = (
    INTERRUPTED,
    STORE_WENT_AWAY,
    AGENT_LOST_STORE,
    SLURM_STEP_REFUSED,
    STORE_ERROR,
    FILE_STORE_WAIT,
    STORE_WITHOUT_LIBUV,
    RENDEZVOUS_RETRY,
    HOST_OOM_KILL,
    RAY_WORKER_LOST,
    LAUNCHER_SIGTERM,
    CHILD_FAILED,
    ERROR_HANDLER_RERAISE,
    NATIVE_CRASH,
    LOCAL_RANK_ARGUMENT,
    LAUNCHER_ENV_MISSING,
    LAUNCHER_VAR_NONE,
    DEEPSPEED_NO_LAUNCHER,
    LAUNCHERS_NESTED,
    ENTRYPOINT_NOT_FOUND,
    LAUNCHER_NOT_FOUND,
    LAUNCH_LINE_CUT,
    RENDEZVOUS_FAILURE,
    REMOTE_START_FAILED,
    SLURM_TERMINATED,
    TERMINAL_HANGUP,
    WARNING_SIGNAL_HANDLED,
)
