"""A stand-in for the SageMaker training toolkit (sagemaker-training 5.x) and the PyTorch
container's entry point (sagemaker_pytorch_container.training) with MPI enabled, for the
hundredfifth-* fixtures: sagemaker is not installed here, so this plays them on one machine.
Run once per 'host' (algo-1, algo-2), each inside a mount and UTS namespace of its own whose
/opt/ml is that host's folder (tests/fixtures/real/capture_hundredfifth.sh sets them up). It
reads /opt/ml/input/config/{resourceconfig,hyperparameters,inputdataconfig}.json as the toolkit
does, logs what the toolkit logs ('%(asctime)s %(name)-12s %(levelname)-8s %(message)s' on
stderr), and then, as the leader host, waits for the workers' SSH daemons, prints the Training
Env, the SM_* variables and the mpirun command, runs mpirun with --tag-output and prints every
line of its output with the toolkit's tag rewrite ('[1,0]<stdout>:' becomes
'[1,mpirank:0,algo-1]<stdout>:', the host computed from the rank and the processes per host),
collecting the lines from the first one that names a Python or MPI error as the ErrorMessage of
its ExecuteUserScriptError; the PyTorch container logs a gloo::EnforceNotMet abort as a 'Known
exception' and lets the toolkit report SUCCESS. As a worker host it waits for mpirun's orted,
then for the leader's status file. Its own waits are shorter than the toolkit's (SLEEP s where
the toolkit sleeps 30 s). What it stands in for (an SSH daemon, the status file written over
ssh) goes through files in --net DIR; nothing of that is printed that the toolkit would not
print.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import re
import socket
import sys
import time

SLEEP = 5  # the toolkit: 30
ML = "/opt/ml"
CONFIG = f"{ML}/input/config"
CODE_DIR = f"{ML}/code"
STATUS = os.path.join(os.environ.get("TMPDIR", "/tmp"), "done")
KNOWN = "terminate called after throwing an instance of 'gloo::EnforceNotMet'"
# the exception names the toolkit watches the output for (Python's, a few of TensorFlow's
# that it always lists, and OpenMPI's launcher), then its own error class
ERROR_NAMES = [
    *(
        "BaseException Exception ArithmeticError AssertionError AttributeError "
        "BlockingIOError BrokenPipeError BufferError ChildProcessError ConnectionAbortedError "
        "ConnectionError ConnectionRefusedError ConnectionResetError EOFError EnvironmentError "
        "FileExistsError FileNotFoundError FloatingPointError IOError ImportError "
        "IndentationError IndexError InterruptedError IsADirectoryError KeyError LookupError "
        "MemoryError ModuleNotFoundError NameError NotADirectoryError NotImplementedError "
        "OSError OverflowError PermissionError ProcessLookupError RecursionError "
        "ReferenceError RuntimeError SyntaxError SystemError TabError TimeoutError TypeError "
        "UnboundLocalError UnicodeDecodeError UnicodeEncodeError UnicodeError "
        "UnicodeTranslateError ValueError ZeroDivisionError"
    ).split(),
    "Invalid requirement",
    "ResourceExhaustedError",
    "OutOfRangeError",
    "InvalidArgumentError",
    "mpirun.real",
    "ORTE",
    "ExecuteUserScriptError",
]

logger = logging.getLogger("sagemaker-training-toolkit")
container = logging.getLogger("sagemaker_pytorch_container.training")


class ExecuteUserScriptError(Exception):
    def __init__(self, cmd, return_code, output, info=None):
        super().__init__()
        self.cmd, self.return_code, self.output, self.info = cmd, return_code, output, info

    def __str__(self):
        extra = f'\nExtraInfo "{self.info}"' if self.info else ""
        return (
            f'{type(self).__name__}:\nExitCode {self.return_code}\nErrorMessage "{self.output}"'
            f'{extra}\nCommand "{self.cmd}"'
        ).strip()


def _read(name):
    with open(os.path.join(CONFIG, name)) as f:
        return json.load(f)


class Env:
    """What the toolkit's Environment reads and derives."""

    def __init__(self):
        # logged each time the toolkit builds its Environment (before its logging is set up
        # the records go nowhere)
        logger.info("No GPUs detected (normal if no gpus installed)")
        logger.info("No Neurons detected (normal if no neurons installed)")
        rc = _read("resourceconfig.json")
        raw = _read("hyperparameters.json")
        hps = {}
        for k, v in raw.items():
            try:
                hps[k] = json.loads(v)
            except (ValueError, TypeError):
                hps[k] = v
        reserved = {
            "sagemaker_program",
            "sagemaker_submit_directory",
            "sagemaker_region",
            "sagemaker_job_name",
            "sagemaker_container_log_level",
        }
        self.sagemaker_hps = {k: v for k, v in hps.items() if k.startswith("sagemaker_")}
        self.framework_params = {k: v for k, v in self.sagemaker_hps.items() if k not in reserved}
        self.hyperparameters = {k: v for k, v in hps.items() if not k.startswith("sagemaker_")}
        self.input_data_config = _read("inputdataconfig.json")
        self.resource_config = rc
        self.current_host = rc["current_host"]
        self.hosts = rc["hosts"]
        self.groups = rc.get("instance_groups", [])
        self.current_group = rc.get("current_group_name", "homogeneousCluster")
        self.current_type = rc.get("current_instance_type", "local")
        dist_groups = self.framework_params.get("sagemaker_distribution_instance_groups") or [
            g["instance_group_name"] for g in self.groups
        ]
        self.distribution_groups = dist_groups
        self.distribution_hosts = [
            h for g in self.groups if g["instance_group_name"] in dist_groups for h in g["hosts"]
        ] or self.hosts
        self.group_hosts = next(
            (g["hosts"] for g in self.groups if g["instance_group_name"] == self.current_group),
            self.hosts,
        )
        self.is_hetero = len(self.groups) > 1
        self.master_hostname = self.distribution_hosts[0]
        self.is_master = self.current_host == self.master_hostname
        self.network_interface_name = rc.get("network_interface_name", "eth0")
        self.user_entry_point = self.sagemaker_hps.get("sagemaker_program", "train.py")
        self.module_name = self.user_entry_point.removesuffix(".py")
        self.module_dir = self.sagemaker_hps.get("sagemaker_submit_directory", CODE_DIR)
        self.job_name = os.environ.get("TRAINING_JOB_NAME")
        self.num_cpus = multiprocessing.cpu_count()
        self.channels = {c: f"{ML}/input/data/{c}" for c in self.input_data_config}

    def cmd_args(self):
        args = []
        for key in sorted(self.hyperparameters):
            value = self.hyperparameters[key]
            args += ["--%s" % key, value if isinstance(value, str) else json.dumps(value)]
        return args

    def training_env(self):
        d = {
            "additional_framework_parameters": self.framework_params,
            "channel_input_dirs": self.channels,
            "current_host": self.current_host,
            "current_instance_group": self.current_group,
            "current_instance_group_hosts": self.group_hosts,
            "current_instance_type": self.current_type,
            "distribution_hosts": self.distribution_hosts,
            "distribution_instance_groups": self.distribution_groups,
            "framework_module": "sagemaker_pytorch_container.training:main",
            "hosts": self.hosts,
            "hyperparameters": self.hyperparameters,
            "input_config_dir": CONFIG,
            "input_data_config": self.input_data_config,
            "input_dir": f"{ML}/input",
            "instance_groups": [g["instance_group_name"] for g in self.groups],
            "instance_groups_dict": {g["instance_group_name"]: g for g in self.groups},
            "is_hetero": self.is_hetero,
            "is_master": self.is_master,
            "is_modelparallel_enabled": None,
            "is_smddpmprun_installed": False,
            "is_smddprun_installed": False,
            "job_name": self.job_name,
            "log_level": 20,
            "master_hostname": self.master_hostname,
            "model_dir": f"{ML}/model",
            "module_dir": self.module_dir,
            "module_name": self.module_name,
            "network_interface_name": self.network_interface_name,
            "num_cpus": self.num_cpus,
            "num_gpus": 0,
            "num_neurons": 0,
            "output_data_dir": f"{ML}/output/data",
            "output_dir": f"{ML}/output",
            "output_intermediate_dir": f"{ML}/output/intermediate",
            "resource_config": self.resource_config,
            "user_entry_point": self.user_entry_point,
        }
        return d

    def env_vars(self):
        def fmt(v):
            if v is None:
                return ""
            if isinstance(v, str):
                return v
            return json.dumps(v, sort_keys=True, separators=(",", ":"))

        te = self.training_env()
        env = {
            "hosts": self.hosts,
            "network_interface_name": self.network_interface_name,
            "hps": self.hyperparameters,
            "user_entry_point": self.user_entry_point,
            "framework_params": self.framework_params,
            "resource_config": self.resource_config,
            "input_data_config": self.input_data_config,
            "output_data_dir": te["output_data_dir"],
            "channels": sorted(self.channels),
            "current_host": self.current_host,
            "current_instance_type": self.current_type,
            "current_instance_group": self.current_group,
            "current_instance_group_hosts": self.group_hosts,
            "instance_groups": te["instance_groups"],
            "instance_groups_dict": te["instance_groups_dict"],
            "distribution_instance_groups": self.distribution_groups,
            "is_hetero": self.is_hetero,
            "module_name": self.module_name,
            "log_level": 20,
            "framework_module": te["framework_module"],
            "input_dir": te["input_dir"],
            "input_config_dir": CONFIG,
            "output_dir": te["output_dir"],
            "num_cpus": self.num_cpus,
            "num_gpus": 0,
            "num_neurons": 0,
            "model_dir": te["model_dir"],
            "module_dir": self.module_dir,
            "training_env": te,
            "user_args": self.cmd_args(),
            "output_intermediate_dir": te["output_intermediate_dir"],
        }
        for name, path in self.channels.items():
            env["channel_%s" % name] = path
        for key, value in self.hyperparameters.items():
            env["hp_%s" % key] = value
        return {"SM_%s" % k.upper(): fmt(v) for k, v in env.items()}


class Net:
    """The hosts' SSH daemons and the leader's status file, as files in one folder."""

    def __init__(self, folder):
        self.folder = folder

    def start_sshd(self, host):
        open(os.path.join(self.folder, f"sshd.{host}"), "w").close()

    def stop_sshd(self, host):
        try:
            os.remove(os.path.join(self.folder, f"sshd.{host}"))
        except FileNotFoundError:
            pass

    def can_connect(self, host):
        if os.path.exists(os.path.join(self.folder, f"sshd.{host}")):
            logger.info("Can connect to host %s", host)
            return True
        logger.info("Cannot connect to host %s", host)
        logger.info(
            "Connection failed with exception: \n %s.              Can be ignored for worker "
            "when master completes and exits.",
            f"[Errno None] Unable to connect to port 22 on {socket.gethostbyname(host)}",
        )
        return False

    def orted(self):
        """mpirun's daemon on this host (psutil's process_iter by name, for this run's
        hosts only: their processes carry the run's RUN_DIR)."""
        mine = f"RUN_DIR={os.environ.get('RUN_DIR', '')}".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "orted":
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mine not in f.read().split(b"\0"):
                        continue
                ticks = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
            except OSError:
                continue
            with open("/proc/uptime") as f:
                boot = time.time() - float(f.read().split()[0])
            started = boot + ticks / os.sysconf("SC_CLK_TCK")
            return int(pid), time.strftime("%H:%M:%S", time.localtime(started))
        return None


def _tag(line, per_host):
    for stream in ("stdout", "stderr"):
        if f"<{stream}>" in line:
            return re.sub(
                rf"\[(\d),(\d+)\]<{stream}>",
                lambda m: f"[{m[1]},mpirank:{m[2]},algo-{int(m[2]) // per_host + 1}]<{stream}>",
                line,
            )
    return line


async def _watch(stream, per_host):
    """Prints what mpirun writes, tags rewritten; returns the lines from the first one that
    names an error on (the toolkit's ErrorMessage)."""
    output = []
    start = False
    while True:
        chunk = await stream.read(64 * 1024)
        if not chunk:
            break
        for line in chunk.decode("utf-8", "replace").strip().split("\n"):
            print(_tag(line, per_host))
            bare = re.sub(r"\[(\d),(\d)\]<stderr>", "", line)
            bare = re.sub(r"\[(\d),(\d)\]<stdout>", "", bare)
            if start:
                if bare not in output:
                    output.append(bare.strip(" :\n") + "\n")
            elif any(name in bare for name in ERROR_NAMES):
                start = True
                output.append(bare.strip(" :\n") + "\n")
    return " ".join(output)


async def _run(cmd, per_host):
    proc = await asyncio.create_subprocess_shell(
        cmd,
        cwd=CODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    output = await asyncio.gather(_watch(proc.stdout, per_host), _watch(proc.stderr, per_host))
    logger.info("Waiting for the process to finish and give a return code.")
    rc = await proc.wait()
    logger.info(f"Done waiting for a return code. Received {rc} from exiting process.")
    return rc, output


def _master(env, net):
    per_host = int(env.framework_params.get("sagemaker_mpi_num_of_processes_per_host", 1))
    logger.info("Starting MPI run as worker node.")
    logger.info("Creating SSH daemon.")
    net.start_sshd(env.current_host)
    logger.info("Waiting for MPI workers to establish their SSH connections")
    for host in env.distribution_hosts:
        if host == env.master_hostname:
            continue
        while not net.can_connect(host):
            time.sleep(1)
        logger.info("Worker %s available for communication", host)
    hosts = env.distribution_hosts
    host_list = hosts if per_host == 1 else ["%s:%s" % (h, per_host) for h in hosts]
    num = per_host * len(hosts)
    logger.info(
        "Env Hosts: %s Hosts: %s process_per_hosts: %s num_processes: %s",
        hosts,
        host_list,
        per_host,
        num,
    )
    logger.info("Network interface name: %s" % env.network_interface_name)
    env_vars = env.env_vars()
    prefixes = (sys.prefix, sys.base_prefix)
    env_vars["PYTHONPATH"] = ":".join(
        [CODE_DIR] + [p for p in sys.path[1:] if p.startswith(prefixes)]
    )
    os.environ.update(env_vars)
    nic = env.network_interface_name
    cmd = [
        "mpirun", "--host", ",".join(host_list), "-np", str(num), "--allow-run-as-root",
        "--display-map", "--tag-output", "-mca", "btl_tcp_if_include", nic,
        "-mca", "oob_tcp_if_include", nic, "-mca", "plm_rsh_no_tree_spawn", "1",
        "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-mca", "btl_vader_single_copy_mechanism", "none",
        "-x", "NCCL_MIN_NRINGS=4", "-x", f"NCCL_SOCKET_IFNAME={nic}", "-x", "NCCL_DEBUG=INFO",
        "-x", "LD_LIBRARY_PATH", "-x", "PATH",
    ]  # fmt: skip
    for name in env_vars:
        cmd += ["-x", name]
    cmd += [sys.executable, env.user_entry_point] + env.cmd_args()
    logger.info(
        "Invoking user script\n\nTraining Env:\n\n%s\n\nEnvironment variables:\n\n%s\n\n"
        "Invoking script with the following command:\n\n%s\n\n",
        json.dumps(env.training_env(), indent=4),
        "\n".join("%s=%s" % kv for kv in env_vars.items()),
        " ".join(cmd),
    )
    rc, output = asyncio.run(_run(" ".join(cmd), per_host))
    if rc:
        stderr = " ".join(output)
        stderr = "\n".join(dict.fromkeys(stderr.split("\n"))).strip()
        info = "OutOfMemory: Process killed by SIGKILL (signal 9)" if rc == 137 else None
        raise ExecuteUserScriptError(" ".join(cmd), rc, stderr, info)
    logger.info("Begin writing status file from leader node to worker nodes (if any)")
    status = f"{STATUS}.{env.master_hostname}"
    for host in hosts:
        if host != env.master_hostname:
            logger.info(f"Start writing mpirun finished status to {host}")
            open(status, "w").close()
            logger.info(
                f"output from subprocess run CompletedProcess(args=['ssh', '{host}', 'touch', "
                f"'{status}'], returncode=0, stdout='', stderr='')"
            )
            logger.info("Finished writing status file")
    time.sleep(SLEEP)
    logger.info("Finished writing status file from leader node to worker nodes (if any)")


def _worker(env, net):
    logger.info("Starting MPI run as worker node.")
    logger.info("Waiting for MPI Master to create SSH daemon.")
    while not net.can_connect(env.master_hostname):
        time.sleep(1)
    logger.info("MPI Master online, creating SSH daemon.")
    logger.info("Writing environment variables to /etc/environment for the MPI process.")
    net.start_sshd(env.current_host)
    logger.info("Waiting for MPI process to finish.")
    found = None
    for _ in range(20 * 60):
        found = net.orted()
        if found:
            break
        time.sleep(1)
    if not found:
        return
    pid, started = found
    alive = f"psutil.Process(pid={pid}, name='orted', status='sleeping', started='{started}')"
    gone = f"psutil.Process(pid={pid}, name='orted', status='terminated', started='{started}')"
    logger.info("Process[es]: [%s]", alive)
    logger.info("Orted process found [%s]", alive)
    logger.info("Waiting for orted process [%s]", alive)
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(0.5)
    logger.info("Invoked on_terminate from psutil.wait_for_procs")
    logger.info("process {} terminated with exit code {}".format(gone, None))
    logger.info(f"Reporting status for ORTEd process. gone: [{gone}] alive: []")
    logger.info("Orted process exited")
    time.sleep(SLEEP)
    logger.info(f"Begin looking for status file on {env.current_host}")
    status = f"{STATUS}.{env.master_hostname}"
    found_status, waited = os.path.exists(status), 0
    while not found_status:
        time.sleep(SLEEP)
        waited += 1
        if waited % 4 == 0:
            logger.info("status file not found...")
            if not net.can_connect(env.master_hostname):
                break
        found_status = os.path.exists(status)
    if found_status:
        logger.info("MPI training job status file found. Exit gracefully")
    else:
        logger.info("Status file not found. Exiting...")
    logger.info("End looking for status file")
    logger.info("MPI process finished.")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", required=True)
    net = Net(parser.parse_args().net)
    Env()  # read before the framework is imported: its records are not shown
    logging.basicConfig(
        format="%(asctime)s %(name)-12s %(levelname)-8s %(message)s", level=logging.INFO
    )
    exit_code = 0
    env = None
    try:
        logger.info("Imported framework sagemaker_pytorch_container.training")
        env = Env()
        container.info("Block until all host DNS lookups succeed.")
        for host in env.hosts:
            socket.gethostbyname(host)
        os.environ["MASTER_ADDR"] = env.master_hostname
        os.environ.setdefault("MASTER_PORT", "7777")
        container.info("Invoking user training script.")
        try:
            env = Env()
            if env.is_master:
                _master(env, net)
            else:
                _worker(env, net)
        except ExecuteUserScriptError as err:
            message = str(err)
            if message.find(KNOWN) > -1:
                container.warning("Known exception: {}".format(message))
            else:
                raise
        logger.info("Reporting training SUCCESS")
        os.makedirs(f"{ML}/output", exist_ok=True)
        open(f"{ML}/output/success", "w").close()
    except ExecuteUserScriptError as err:
        failure = str(err)
        with open(f"{ML}/output/failure", "w") as f:
            f.write(failure)
        logger.error("Reporting training FAILURE")
        logger.error(failure)
        exit_code = 1
    finally:
        if env is not None:
            net.stop_sshd(env.current_host)
        if exit_code:
            logger.error(f"Encountered exit_code {exit_code}")
    sys.exit(exit_code)


if __name__ == "__main__":
    main()

# ruff: noqa: B023, RUF005, SIM105, SIM115, SIM905, UP031, UP032 (the toolkit's own idioms; at the
# end, as the file ran for the captures)
