"""A stand-in for Google Cloud Vertex AI's custom training service, for the hundred-and-fifty-
seventh training-program style (tests/fixtures/real/hundredfiftyseventh-*): one custom job of
two worker pools, 'workerpool0' (the chief, one replica) and 'workerpool1' (the other workers),
each replica a VM of its own running the job's container command once (no torchrun).

There is no Vertex here. Each replica's VM is a network, UTS and mount namespace of its own
(run this as root inside `unshare --net --mount --propagation private`: the job's own private
network): its hostname ('cmle-training-workerpool1-<hash>-0'), an address on the job's network
(10.128.0.N on a bridge, every VM one veth), an /etc/hosts naming every replica, and the job's
Cloud Storage bucket folder mounted at /gcs (Cloud Storage FUSE, as the platform mounts it).
Each replica gets the platform's variables: CLUSTER_SPEC (JSON with "cluster", "environment",
"task": {"type": "workerpool1", "index": 0} and "job"), CLOUD_ML_JOB_ID, AIP_MODEL_DIR,
AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR (gs:// URIs under the job's base output
directory) and, for a job of more than one replica (PyTorch distributed training),
MASTER_ADDR (the chief's hostname), MASTER_PORT (3333), WORLD_SIZE (replicas) and RANK (the
replica's global index: the chief 0, workerpool1's replica i is i + 1).

Every line a replica writes becomes a Cloud Logging record, stdout severity INFO and stderr
ERROR ({"insertId": ..., "jsonPayload": {"attrs": {"tag": "workerpool1-0"}, "levelname":
"ERROR", "message": "..."}, "resource": {"type": "ml_job", "labels": {"job_id": ..., "task_name":
"workerpool1-0", "project_id": ...}}, "timestamp": ..., "severity": "ERROR", "labels": {...},
"logName": "projects/<project>/logs/workerpool1-0", "receiveTimestamp": ...}); the service's own
records are textPayload records of task 'service' ('Job is preparing.', 'Waiting for job to be
provisioned.', 'Waiting for training program to start.', 'Job is running.', 'The replica
workerpool1-0 exited with a non-zero status of 1. To find out more about why your job exited
please check the logs: https://console.cloud.google.com/logs/viewer?...', 'Finished tearing down
training program.', 'Job failed.' or 'Job completed successfully.'). A replica's exit status is
its container's: the process's code, 128 + N for a signal N. When a replica exits non-zero the
job fails: every other replica gets SIGTERM (SIGKILL 10 s later). Past --max-running-time the
job is cancelled ('Job was cancelled because it exceeded the maximum running time.') the same
way. The records of all replicas are written, in the order of their time, to --export as JSON
lines (the user's export from Cloud Logging) and to --stream as `gcloud ai custom-jobs
stream-logs` prints them ('INFO<TAB>2026-12-07 10:00:00 +0000<TAB>workerpool1-0<TAB>...').

    python hundredfiftyseventh_vertex.py --project P --job-id ID --bucket-dir DIR
        --base-output-dir gs://B/PATH --code-dir DIR --workers N [--max-running-time S]
        --export FILE --stream FILE -- COMMAND...
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

MASTER_PORT = 3333
CLUSTER_PORT = 2222

VM_NAMESPACES = ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "--"]
# a VM's start: wait for the job's network, then name itself, mount the bucket, run the command
VM_INIT = r"""
read -r ip
ip link set lo up && ip addr add "$ip/24" dev eth0 && ip link set eth0 up
hostname "$VM_HOSTNAME"
mount --bind "$VM_HOSTS" /etc/hosts && mount --bind "$VM_BUCKETS" /gcs
cd "$VM_CODE" && exec "$@" < /dev/null
"""


def stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Logging:
    """The job's Cloud Logging: every record, as the export and the stream show it."""

    def __init__(self, project: str, job: str, export: str, stream: str) -> None:
        self.project, self.job = project, job
        self.lock = threading.Lock()
        self.seq = 0
        self.export: IO[str] = open(export, "w")  # noqa: SIM115
        self.stream: IO[str] = open(stream, "w")  # noqa: SIM115

    def _write(self, record: dict[str, Any], t: float, severity: str, task: str, text: str) -> None:
        self.export.write(json.dumps(record) + "\n")
        self.export.flush()
        when = datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        self.stream.write(f"{severity}\t{when} +0000\t{task}\t{text}\n")
        self.stream.flush()

    def _ids(self, t: float) -> tuple[str, str]:
        self.seq += 1
        insert = hashlib.sha256(f"{self.job}/{self.seq}".encode()).hexdigest()[:14]
        # the time the record reached Cloud Logging: a fraction of a second later
        received = t + 0.05 + (self.seq % 7) * 0.04
        return insert, stamp(received)[:-1] + "123Z"

    def user(self, task: str, host: str, severity: str, text: str) -> None:
        with self.lock:
            t = time.time()
            insert, received = self._ids(t)
            record = {
                "insertId": insert,
                "jsonPayload": {"attrs": {"tag": task}, "levelname": severity, "message": text},
                "resource": {
                    "type": "ml_job",
                    "labels": {"job_id": self.job, "task_name": task, "project_id": self.project},
                },
                "timestamp": stamp(t),
                "severity": severity,
                "labels": {
                    "compute.googleapis.com/resource_name": host,
                    "ml.googleapis.com/job_id/log_area": "user",
                },
                "logName": f"projects/{self.project}/logs/{task}",
                "receiveTimestamp": received,
            }
            self._write(record, t, severity, task, text)

    def service(self, text: str, severity: str = "INFO") -> None:
        with self.lock:
            t = time.time()
            insert, received = self._ids(t)
            record = {
                "insertId": insert,
                "textPayload": text,
                "resource": {
                    "type": "ml_job",
                    "labels": {
                        "job_id": self.job,
                        "task_name": "service",
                        "project_id": self.project,
                    },
                },
                "timestamp": stamp(t),
                "severity": severity,
                "logName": f"projects/{self.project}/logs/ml.googleapis.com%2F{self.job}",
                "receiveTimestamp": received,
            }
            self._write(record, t, severity, "service", text)


class Replica:
    def __init__(self, pool: str, index: int, rank: int, host: str, ip: str) -> None:
        self.pool, self.index, self.rank, self.host, self.ip = pool, index, rank, host, ip
        self.task = f"{pool}-{index}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.readers: list[threading.Thread] = []

    def status(self) -> int | None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return None
        return rc if rc >= 0 else 128 - rc


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True)


def pump(stream: IO[bytes], log: Logging, rep: Replica, severity: str) -> None:
    for raw in iter(stream.readline, b""):
        text = raw.decode("utf-8", errors="replace").rstrip("\n")
        if text.strip():
            log.user(rep.task, rep.host, severity, text)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--project", required=True)
    p.add_argument("--region", default="us-central1")
    p.add_argument("--job-id", required=True)
    p.add_argument("--bucket-dir", required=True, help="mounted at /gcs on every replica")
    p.add_argument("--base-output-dir", required=True, help="gs://BUCKET/PATH")
    p.add_argument("--code-dir", required=True, help="the container's working folder")
    p.add_argument("--workers", type=int, default=1, help="workerpool1's replica count")
    p.add_argument("--max-running-time", type=float, default=0.0)
    p.add_argument("--export", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    log = Logging(args.project, args.job_id, args.export, args.stream)
    url = (
        f"https://console.cloud.google.com/logs/viewer?project={args.project}&resource=ml_job"
        f"%2Fjob_id%2F{args.job_id}&advancedFilter=resource.type%3D%22ml_job%22%0Aresource."
        f"labels.job_id%3D%22{args.job_id}%22"
    )

    log.service("Job is preparing.")
    suffix = hashlib.sha256(args.job_id.encode()).hexdigest()[:10]
    replicas = [Replica("workerpool0", 0, 0, f"cmle-training-workerpool0-{suffix}-0", "10.128.0.2")]
    for i in range(args.workers):
        host = f"cmle-training-workerpool1-{suffix}-{i}"
        replicas.append(Replica("workerpool1", i, i + 1, host, f"10.128.0.{i + 3}"))
    world = len(replicas)
    hosts = os.path.join(os.path.dirname(os.path.abspath(args.export)), ".vertex-hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for rep in replicas:
            names = f"{rep.host}.us-central1-a.c.{args.project}.internal {rep.host}"
            # the metadata server's DNS answers reverse look-ups, of IPv4-mapped addresses too
            f.write(f"{rep.ip} {names}\n::ffff:{rep.ip} {names}\n")
    cluster: dict[str, list[str]] = {}
    for rep in replicas:
        cluster.setdefault(rep.pool, []).append(f"{rep.host}:{CLUSTER_PORT}")
    job_spec = {
        "worker_pool_specs": [
            {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1},
            {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": args.workers},
        ][: 2 if args.workers else 1],
        "base_output_directory": {"output_uri_prefix": args.base_output_dir},
    }
    base = args.base_output_dir.rstrip("/")

    # the job's network: a bridge, every VM one veth on it
    run(["ip", "link", "add", "name", "vpc0", "type", "bridge"])
    run(["ip", "link", "set", "vpc0", "up"])
    log.service("Waiting for job to be provisioned.")
    for k, rep in enumerate(replicas):
        time.sleep(0.4 + 0.3 * (k % 2))  # VMs come up one after another
        env = dict(os.environ)
        env.update(
            VM_HOSTNAME=rep.host,
            VM_HOSTS=hosts,
            VM_BUCKETS=args.bucket_dir,
            VM_CODE=args.code_dir,
            CLOUD_ML_JOB_ID=args.job_id,
            CLOUD_ML_PROJECT_ID=args.project,
            AIP_MODEL_DIR=f"{base}/model/",
            AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
            AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/",
            CLUSTER_SPEC=json.dumps(
                {
                    "cluster": cluster,
                    "environment": "cloud",
                    "task": {"type": rep.pool, "index": rep.index},
                    "job": json.dumps(job_spec),
                }
            ),
        )
        if world > 1:
            env.update(
                MASTER_ADDR=replicas[0].host,
                MASTER_PORT=str(MASTER_PORT),
                WORLD_SIZE=str(world),
                RANK=str(rep.rank),
            )
        rep.proc = subprocess.Popen(
            [*VM_NAMESPACES, "sh", "-c", VM_INIT, "vm", *command],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        own = os.readlink("/proc/self/ns/net")
        while os.readlink(f"/proc/{rep.proc.pid}/ns/net") == own:  # until the VM has its own
            time.sleep(0.02)
        veth = f"vm{k}"
        peer = ["peer", "name", "eth0", "netns", str(rep.proc.pid)]
        run(["ip", "link", "add", "name", veth, "type", "veth", *peer])
        run(["ip", "link", "set", veth, "master", "vpc0"])
        run(["ip", "link", "set", veth, "up"])
        assert rep.proc.stdin is not None and rep.proc.stdout and rep.proc.stderr
        for stream, severity in ((rep.proc.stdout, "INFO"), (rep.proc.stderr, "ERROR")):
            t = threading.Thread(target=pump, args=(stream, log, rep, severity), daemon=True)
            t.start()
            rep.readers.append(t)
        rep.proc.stdin.write(f"{rep.ip}\n".encode())
        rep.proc.stdin.close()
        if k == 0:
            log.service("Waiting for training program to start.")
    log.service("Job is running.")
    started = time.time()

    cancelled: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: cancelled.append(signum))

    def teardown(live: list[Replica]) -> None:
        for rep in live:
            assert rep.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rep.proc.pid, signal.SIGTERM)
        end = time.time() + 10
        while time.time() < end and any(r.status() is None for r in live):
            time.sleep(0.2)
        for rep in live:
            assert rep.proc is not None
            if rep.status() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rep.proc.pid, signal.SIGKILL)
                rep.proc.wait()

    failed = False
    done: set[str] = set()
    while len(done) < len(replicas):
        time.sleep(0.2)
        over = args.max_running_time and time.time() - started > args.max_running_time
        if over or cancelled:
            if over:
                log.service(
                    "Job was cancelled because it exceeded the maximum running time.", "ERROR"
                )
            else:
                log.service("Job is being cancelled.")
            failed = True
            teardown([r for r in replicas if r.task not in done])
            break
        bad = []
        for rep in replicas:
            code = rep.status()
            if rep.task in done or code is None:
                continue
            done.add(rep.task)
            if code != 0:
                bad.append((rep, code))
        for rep, code in bad:
            for t in rep.readers:
                t.join(timeout=2)
            log.service(
                f"The replica {rep.task} exited with a non-zero status of {code}. To find out "
                f"more about why your job exited please check the logs: {url}",
                "ERROR",
            )
        if bad:
            failed = True
            teardown([r for r in replicas if r.task not in done])
            break
    for rep in replicas:
        for t in rep.readers:
            t.join(timeout=2)
    log.service("Finished tearing down training program.")
    if failed:
        log.service("Job failed.", "ERROR")
        return 1
    log.service("Job completed successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
