"""The `determined` package inside a task container, re-created for the hundred-and-eighth style's
fixtures (tests/fixtures/real/hundredeighth-*) without determined installed: the simulated
cluster (tests/programs/hundredeighth_det.py) links this one file into the container's
pythonuserbase as determined/__init__.py and as each module the launch layers run with `python3
-m`: determined.exec.prep_container, determined.exec.launch, determined.launch.torch_distributed,
determined.exec.pid_server, determined.exec.pid_client, determined.launch.wrap_rank (run as
__main__, the module's name picks what runs).

What Determined 0.27 does is kept (harness/determined in its sources): LOG_FORMAT '%(levelname)s:
[%(process)s] %(name)s: %(message)s' on stdout (set_logger) for the launch layers; launch's 'New
trial runner in (container ID) on agent AGENT: {config}', 'Validating checkpoint storage ...',
'Launching: [...]' and its signal forwarding; torch_distributed's command line `python3 -m
determined.exec.pid_server --on-fail SIGTERM --on-exit WAIT /tmp/pid_server-ALLOC N -- python3 -m
torch.distributed.run --nnodes 1 --nproc_per_node N --node_rank 0 --max_restarts 0 --master_addr
localhost --master_port $C10D_PORT --module determined.exec.pid_client /tmp/pid_server-ALLOC --
python3 -m determined.launch.wrap_rank RANK -- SCRIPT...` (the real torchrun of torch 2.13 runs
here); the pid_server's watch of its clients (a client gone without its graceful 'q' is a dead
worker: 3 s grace, then SIGTERM to torchrun); wrap_rank's '[rank=N] ' on every line of the
worker's stdout and stderr and its `sys.exit(proc.wait())` (a worker killed by signal S exits
256 - S); the Core API the trial script uses: core.init(distributed=...), DistributedContext
.from_torch_distributed() with broadcast/allgather between the chief and the workers outside
torch (a socket of the chief's, as Determined's ZMQ server), searcher.operations() (the chief
asks the master, the workers get the length broadcast), train.report_training_metrics /
report_validation_metrics / report_early_exit, checkpoint.store_path (chief only, shared_fs
written in place, metadata.json, 'Reported checkpoint to master UUID') and restore_path,
preempt.should_preempt() (the chief's watcher thread polls the master, the answer broadcast to
the workers, acknowledged). The master's API is the simulation's folder for the allocation
($DETSIM_API, never printed).
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import logging
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
logger = logging.getLogger("determined.core")


class InvalidHP(Exception):
    pass


# ---------------------------------------------------------------- cluster info (det.get_cluster_info)
class TrialInfo:
    def __init__(self, d: dict) -> None:
        self.trial_id = d["trial_id"]
        self.experiment_id = d["experiment_id"]
        self._trial_run_id = d["trial_run_id"]
        self.hparams = d["hparams"]
        self._config = d["config"]
        self._steps_completed = d.get("steps_completed", 0)


class ClusterInfo:
    def __init__(self, d: dict) -> None:
        self.master_url = d["master_url"]
        self.cluster_id = d["cluster_id"]
        self.agent_id = d["agent_id"]
        self.slot_ids = d["slot_ids"]
        self.task_id = d["task_id"]
        self.allocation_id = d["allocation_id"]
        self.task_type = d["task_type"]
        self.container_addrs = d["container_addrs"]
        self.container_rank = d["container_rank"]
        self.latest_checkpoint = d.get("latest_checkpoint")
        self.trial = TrialInfo(d["trial"])


def get_cluster_info() -> ClusterInfo | None:
    path = "/run/determined/info/cluster_info.json"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return ClusterInfo(json.load(f))


def _api() -> pathlib.Path:
    return pathlib.Path(os.environ["DETSIM_API"])


def set_logger(debug_enabled: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug_enabled else logging.INFO)
    for hdlr in list(root.handlers):
        root.removeHandler(hdlr)
    handler = logging.StreamHandler(sys.stdout)
    handler.setLevel(logging.DEBUG if debug_enabled else logging.INFO)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)


@contextlib.contextmanager
def forward_signals(p: subprocess.Popen, *signums: int) -> Iterator[None]:
    """det.util.forward_signals: pass the given signals on to the child."""
    if not signums:
        signums = (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGUSR2,
            signal.SIGWINCH,
        )
    old = {}

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signum)

    for s in signums:
        old[s] = signal.signal(s, forward)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---------------------------------------------------------------- the Core API
class DistributedContext:
    """rank, size, local_rank, ...; broadcast/allgather/gather between the chief and the workers
    through the chief's socket (Determined uses a ZMQ server of the chief's), never torch."""

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: str | None = None,
    ) -> None:
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self._chief_ip = chief_ip or "127.0.0.1"
        self._conns: list[socket.socket] = []
        self._sock: socket.socket | None = None
        self._closed = False
        if size < 2:
            return
        path = f"/run/determined/ipc-{os.environ.get('DET_ALLOCATION_ID', 'local')}.sock"
        if rank == 0:
            srv = socket.socket(socket.AF_UNIX)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            srv.bind(path)
            srv.listen(size)
            srv.settimeout(120)
            conns = {}
            while len(conns) < size - 1:
                c, _ = srv.accept()
                c.settimeout(None)
                conns[int(self._recv_line(c))] = c
            self._conns = [conns[r] for r in sorted(conns)]
            srv.close()
        else:
            deadline = time.time() + 120
            while True:
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    s.close()
                    if time.time() > deadline:
                        raise RuntimeError("timed out connecting to the chief") from None
                    time.sleep(0.2)
            s.sendall(b"%d\n" % rank)
            self._sock = s

    @staticmethod
    def _recv_line(c: socket.socket) -> bytes:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = c.recv(1)
            if not chunk:  # the peer is gone: ZMQ's sockets say nothing and wait on
                threading.Event().wait()
            buf += chunk
        return buf[:-1]

    def _send(self, c: socket.socket, obj: Any) -> None:
        c.sendall(json.dumps(obj).encode() + b"\n")

    def _recv(self, c: socket.socket) -> Any:
        return json.loads(self._recv_line(c))

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        return cls(
            rank=int(os.environ["RANK"]),
            size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ["LOCAL_RANK"]),
            local_size=int(os.environ["LOCAL_WORLD_SIZE"]),
            cross_rank=int(os.environ["GROUP_RANK"]),
            cross_size=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
            chief_ip=chief_ip or os.environ.get("DET_CHIEF_IP"),
        )

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def broadcast(self, stuff: Any) -> Any:
        if self.size < 2:
            return stuff
        if self.rank == 0:
            for c in self._conns:
                self._send(c, stuff)
            return stuff
        assert self._sock is not None
        return self._recv(self._sock)

    def allgather(self, stuff: Any) -> list:
        if self.size < 2:
            return [stuff]
        if self.rank == 0:
            out = [stuff] + [self._recv(c) for c in self._conns]
            for c in self._conns:
                self._send(c, out)
            return out
        assert self._sock is not None
        self._send(self._sock, stuff)
        return self._recv(self._sock)

    def gather(self, stuff: Any) -> list | None:
        if self.size < 2:
            return [stuff]
        if self.rank == 0:
            return [stuff] + [self._recv(c) for c in self._conns]
        assert self._sock is not None
        self._send(self._sock, stuff)
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in [*self._conns, *([self._sock] if self._sock else [])]:
            c.close()


class Unit(enum.Enum):
    EPOCHS = "UNIT_EPOCHS"
    RECORDS = "UNIT_RECORDS"
    BATCHES = "UNIT_BATCHES"


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TrainContext:
    def __init__(self, dist: DistributedContext) -> None:
        self._dist = dist

    def _post(self, kind: str, body: dict) -> None:
        with open(_api() / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"kind": kind, **body}) + "\n")

    def report_training_metrics(
        self, steps_completed: int, metrics: dict, batch_metrics: list | None = None
    ) -> None:
        logger.info(
            f"report_training_metrics(steps_completed={steps_completed}, metrics={metrics})"
        )
        self._post("training", {"steps_completed": steps_completed, "metrics": metrics})

    def report_validation_metrics(self, steps_completed: int, metrics: dict) -> None:
        logger.info(
            f"report_validation_metrics(steps_completed={steps_completed}, metrics={metrics})"
        )
        self._post("validation", {"steps_completed": steps_completed, "metrics": metrics})

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        logger.info(f"report_early_exit({reason})")
        (_api() / "early_exit").write_text(reason.value)

    def set_status(self, status: str) -> None:
        logger.debug(f"set_status({status})")


class SearcherOperation:
    def __init__(self, length: int, is_chief: bool) -> None:
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("you must not call op.report_progress() after op.report_completed()")
        logger.debug(f"op.report_progress({length})")

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        logger.debug(f"op.report_completed({searcher_metric})")
        (_api() / "searcher_completed").write_text(json.dumps(searcher_metric))


class SearcherContext:
    def __init__(self, dist: DistributedContext, config: dict) -> None:
        self._dist = dist
        self._max_length = config["searcher"]["max_length"]

    def _get_searcher_op(self) -> SearcherOperation | None:
        if (_api() / "searcher_completed").exists() or (_api() / "early_exit").exists():
            return None
        length = self._max_length
        if isinstance(length, dict):
            length = next(iter(length.values()))
        return SearcherOperation(int(length), is_chief=True)

    def operations(self, auto_ack: bool = True) -> Iterator[SearcherOperation]:
        if self._dist.rank == 0:
            while True:
                op = self._get_searcher_op()
                _ = self._dist.broadcast(op and op.length)
                if op is None:
                    if auto_ack:
                        self.acknowledge_out_of_ops()
                    break
                yield op
                if not op._completed:
                    raise RuntimeError("you must call op.report_completed() on each operation")
        else:
            while True:
                op_length = self._dist.broadcast(None)
                if op_length is None:
                    break
                yield SearcherOperation(op_length, is_chief=False)

    def acknowledge_out_of_ops(self) -> None:
        logger.debug("acknowledge_out_of_ops()")
        (_api() / "ack").write_text("out_of_ops")

    def get_configured_units(self) -> Unit | None:
        if isinstance(self._max_length, dict):
            return Unit["".join(self._max_length).upper()]
        return None


class CheckpointContext:
    """shared_fs: the storage path written in place (store_path_is_direct_access)."""

    def __init__(self, dist: DistributedContext, config: dict) -> None:
        self._dist = dist
        storage = config["checkpoint_storage"]
        self._base_path = os.path.join(storage["host_path"], storage.get("storage_path", ""))

    @contextlib.contextmanager
    def store_path(
        self, metadata: dict | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        logger.debug(f"Getting path for storage (metadata={metadata})")
        if self._dist.rank != 0:
            raise RuntimeError(
                "cannot call CheckpointContext.store_path(shard=False) from non-chief worker "
                f"(rank={self._dist.rank})"
            )
        storage_id = str(uuid.uuid4())
        path = pathlib.Path(self._base_path, storage_id)
        path.mkdir(parents=True, exist_ok=True)
        yield path, storage_id
        with open(path / "metadata.json", "w") as f:
            json.dump(metadata or {}, f, indent=2)
        resources = {
            str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()
        }
        self._report_checkpoint(storage_id, resources, metadata)

    def _report_checkpoint(self, storage_id: str, resources: dict, metadata: dict | None) -> None:
        if not metadata or "steps_completed" not in metadata:
            raise ValueError(
                "metadata for reported checkpoints, in the current implementation, requires a "
                "'steps_completed' item, which has not been provided"
            )
        with open(_api() / "checkpoints.jsonl", "a") as f:
            f.write(
                json.dumps({"uuid": storage_id, "metadata": metadata, "resources": resources})
                + "\n"
            )
        logger.info(f"Reported checkpoint to master {storage_id}")

    @contextlib.contextmanager
    def restore_path(self, storage_id: str) -> Iterator[pathlib.Path]:
        storage_dir = os.path.join(self._base_path, storage_id)
        if not os.path.exists(storage_dir):
            raise RuntimeError(f"Did not find checkpoint {storage_id} in shared_fs storage")
        yield pathlib.Path(storage_dir)


class PreemptContext:
    """WorkersAskChief: the chief's watcher polls the master, should_preempt() broadcasts."""

    def __init__(self, dist: DistributedContext) -> None:
        self._dist = dist
        self._should_preempt = False
        self._quit = threading.Event()
        self._thread: threading.Thread | None = None

    def _watch(self) -> None:
        while not self._quit.wait(0.2):
            if (_api() / "preempt").exists():
                self._should_preempt = True
                return

    def start(self) -> None:
        if self._dist.rank == 0:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._quit.set()

    def should_preempt(self, auto_ack: bool = True) -> bool:
        if self._dist.rank == 0:
            out = self._dist.broadcast(self._should_preempt)
        else:
            out = self._dist.broadcast(None)
        if out and auto_ack and self._dist.rank == 0:
            self.acknowledge_preemption_signal()
        logger.debug(f"should_preempt() -> {out}")
        return bool(out)

    def acknowledge_preemption_signal(self) -> None:
        logger.debug("acknowledge_preemption_signal()")
        (_api() / "ack").write_text("preemption")


class Context:
    def __init__(self, distributed: DistributedContext, config: dict) -> None:
        self.distributed = distributed
        self.train = TrainContext(distributed)
        self.searcher = SearcherContext(distributed, config)
        self.checkpoint = CheckpointContext(distributed, config)
        self.preempt = PreemptContext(distributed)

    def __enter__(self) -> Context:
        self.preempt.start()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.preempt.close()
        self.distributed.close()
        if isinstance(exc_val, InvalidHP):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            logger.info("InvalidHP detected during Trial init, converting InvalidHP to exit(0)")
            sys.exit(0)


def _init(*, distributed: DistributedContext | None = None) -> Context:
    info = get_cluster_info()
    assert info is not None, "this sketch of the Core API runs on-cluster only"
    if distributed is None and len(info.slot_ids) > 1:
        raise ValueError("you must provide a valid DistributedContext for a multi-slot task")
    distributed = distributed or DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
    )
    return Context(distributed, info.trial._config)


core = types.SimpleNamespace(
    init=_init,
    DistributedContext=DistributedContext,
    Unit=Unit,
    EarlyExitReason=EarlyExitReason,
    Context=Context,
)


# ---------------------------------------------------------------- determined.exec.prep_container
def prep_container(argv: list[str]) -> int:
    set_logger(False)
    log = logging.getLogger("determined")
    if "--resources" in argv:
        log.info(
            f"Running task container on agent_id={os.environ['DET_AGENT_ID']}, "
            f"hostname={socket.gethostname()} with visible GPUs []"
        )
    return 0


# ---------------------------------------------------------------- determined.exec.launch
def validate_storage(config: dict) -> None:
    storage = config["checkpoint_storage"]
    base = os.path.join(storage["host_path"], storage.get("storage_path", ""))
    os.makedirs(base, exist_ok=True)
    probe = os.path.join(base, str(uuid.uuid4()))
    with open(probe, "w") as f:
        f.write("determined storage validation")
    os.remove(probe)


def launch(argv: list[str]) -> int:
    info = get_cluster_info()
    assert info is not None, "must be run on-cluster"
    assert info.task_type == "TRIAL", f'must be run with task_type="TRIAL", not "{info.task_type}"'
    config = info.trial._config
    set_logger(bool(config.get("debug", False)))
    log = logging.getLogger("determined")
    log.info(
        f"New trial runner in (container {os.environ['DET_CONTAINER_ID']}) on agent "
        f"{info.agent_id}: " + json.dumps(config, sort_keys=True)
    )
    try:
        log.info("Validating checkpoint storage ...")
        validate_storage(config)
    except Exception as e:
        log.error(f"Checkpoint storage validation failed: {e}")
        return 1
    entrypoint = config["entrypoint"]
    if isinstance(entrypoint, str):
        entrypoint = ["sh", "-c", entrypoint]
    log.info(f"Launching: {entrypoint}")
    p = subprocess.Popen(entrypoint)
    with forward_signals(p):
        return p.wait()


# ---------------------------------------------------------------- determined.launch.torch_distributed
def torch_distributed(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        override, script = argv[:split], argv[split + 1 :]
    else:
        override, script = [], argv
    if not script:
        print("error: empty script is not allowed", file=sys.stderr)
        return 1
    info = get_cluster_info()
    assert info is not None, "must be run on-cluster"
    os.environ["USE_TORCH_DISTRIBUTED"] = "True"
    chief_ip = info.container_addrs[0]
    os.environ["DET_CHIEF_IP"] = chief_ip
    port = int(os.getenv("C10D_PORT", "29400"))
    n = len(info.slot_ids)
    pid_addr = f"/tmp/pid_server-{info.allocation_id}"
    cmd = [
        "python3",
        "-m",
        "determined.exec.pid_server",
        "--on-fail",
        "SIGTERM",
        "--on-exit",
        "WAIT",
        pid_addr,
        str(n),
        "--",
    ]
    cmd += [
        "python3",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(len(info.container_addrs)),
        "--nproc_per_node",
        str(n),
        "--node_rank",
        str(info.container_rank),
        "--max_restarts",
        "0",
        "--master_addr",
        "localhost",
        "--master_port",
        str(port),
        "--module",
        *override,
    ]
    cmd += ["determined.exec.pid_client", pid_addr, "--"]
    cmd += ["python3", "-m", "determined.launch.wrap_rank", "RANK", "--"]
    cmd += script
    logging.getLogger("determined.launch.torch_distributed").debug(
        f"Torch distributed launching with: {cmd}"
    )
    p = subprocess.Popen(cmd)
    with forward_signals(p):
        return p.wait()


# ---------------------------------------------------------------- determined.exec.pid_server / client
class WorkerError(Exception):
    pass


def pid_server(argv: list[str]) -> int:
    import argparse

    import psutil

    parser = argparse.ArgumentParser()
    parser.add_argument("-x", "--on-fail", dest="on_fail", default="SIGTERM")
    parser.add_argument("-e", "--on-exit", dest="on_exit", default="WAIT")
    parser.add_argument("--grace-period", dest="grace_period", type=int, default=3)
    parser.add_argument("addr")
    parser.add_argument("num_workers", type=int)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    on_fail = None if args.on_fail.lower() == "wait" else signal.Signals[args.on_fail.upper()]

    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.addr)
    listener: socket.socket | None = socket.socket(socket.AF_UNIX)
    listener.bind(args.addr)
    listener.listen(args.num_workers)
    listener.setblocking(False)
    conns: dict[socket.socket, int | None] = {}
    pids: list[int] = []
    graceful: set[int] = set()

    p = subprocess.Popen(cmd)

    def poll_once() -> None:
        nonlocal listener
        import select

        socks = ([listener] if listener else []) + list(conns)
        readable, _, _ = select.select(socks, [], [], 1.0)
        for s in readable:
            if s is listener:
                c, _ = listener.accept()
                c.setblocking(True)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = c.recv(1)
                    if not chunk:
                        raise WorkerError("worker died before all workers connected")
                    data += chunk
                pid = int(data)
                conns[c] = pid
                pids.append(pid)
                if len(pids) == args.num_workers:
                    listener.close()
                    listener = None
                continue
            data = s.recv(4096)
            if data and b"q" in data:
                graceful.add(conns[s])
            if not data:
                if listener is not None:
                    raise WorkerError("worker died before all workers connected")
                s.close()
                del conns[s]
        for pid in pids:
            if pid in graceful:
                continue
            try:
                ok = psutil.Process(pid).status() not in (
                    psutil.STATUS_DEAD,
                    psutil.STATUS_STOPPED,
                    psutil.STATUS_ZOMBIE,
                )
            except psutil.NoSuchProcess:
                ok = False
            if not ok:
                raise WorkerError("Detected that worker process died.")

    with forward_signals(p):
        try:
            while listener is not None or len(graceful) < args.num_workers:
                poll_once()
                ret = p.poll()
                if ret is not None:
                    return ret or 77
        except WorkerError:
            if on_fail is not None:
                time.sleep(args.grace_period)
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(on_fail)
                try:
                    return p.wait(timeout=10) or 78
                except subprocess.TimeoutExpired:
                    logging.getLogger("determined").error(
                        f"killing worker which didn't exit after {on_fail.name}"
                    )
                    p.send_signal(signal.SIGKILL)
            return p.wait() or 79
        finally:
            for c in [*conns, *([listener] if listener else [])]:
                c.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.addr)
        return p.wait()


def pid_client(argv: list[str]) -> int:
    addr, cmd = argv[0], argv[1:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(addr)
    sock.send(b"%d\n" % os.getpid())
    p = subprocess.Popen(cmd)
    code = None
    try:
        with forward_signals(p):
            while True:
                try:
                    code = p.wait(timeout=60)
                    break
                except subprocess.TimeoutExpired:
                    sock.send(b"k")
    finally:
        if code == 0:
            with contextlib.suppress(Exception):
                sock.send(b"q")
        sock.close()
    return code


# ---------------------------------------------------------------- determined.launch.wrap_rank
_LINEEND = re.compile(rb"[\r\n]")


def _read_lines(fd: io.RawIOBase) -> Iterator[str]:
    limit = io.DEFAULT_BUFFER_SIZE - 1
    nread = 0
    chunks: list[bytes] = []

    def oneline() -> str:
        nonlocal nread, chunks
        out = b"".join(chunks).decode("utf8", errors="replace")
        chunks, nread = [], 0
        return out

    while True:
        buf = fd.read(limit - nread)
        if not buf:
            break
        while buf:
            m = _LINEEND.search(buf)
            if m is None:
                chunks.append(buf)
                nread += len(buf)
                break
            start, end = m.span()
            chunks.append(buf[:start])
            chunks.append(b"\n")
            yield oneline()
            buf = buf[end:]
        if nread >= limit:
            chunks.append(b"\n")
            yield oneline()
    if chunks:
        chunks.append(b"\n")
        yield oneline()


def wrap_rank(argv: list[str]) -> int:
    args = [a for a in argv if a != "--no-redirect-stdio"]
    rank_arg, script = args[0], args[1:]
    if script[:1] == ["--"]:
        script = script[1:]
    if set("0123456789") >= set(rank_arg):
        rank = int(rank_arg)
    else:
        for r in rank_arg.split(","):
            if r in os.environ:
                rank = int(os.environ[r])
                break
        else:
            print(
                f"rank environment variable is set to {rank_arg}, but it is not in os.environ",
                file=sys.stderr,
            )
            return 1
    proc = subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)

    def forward(src: Any, dst: Any) -> None:
        for line in _read_lines(src):
            os.write(dst.fileno(), f"[rank={rank}] {line}".encode())

    with forward_signals(proc):
        threads = [
            threading.Thread(target=forward, args=(proc.stdout, sys.stdout)),
            threading.Thread(target=forward, args=(proc.stderr, sys.stderr)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        proc.stdout.close()
        proc.stderr.close()
        return proc.wait()


MAINS = {
    "determined.exec.prep_container": prep_container,
    "determined.exec.launch": launch,
    "determined.launch.torch_distributed": torch_distributed,
    "determined.exec.pid_server": pid_server,
    "determined.exec.pid_client": pid_client,
    "determined.launch.wrap_rank": wrap_rank,
}

if __name__ == "__main__":
    name = __spec__.name if __spec__ is not None else ""
    if name not in MAINS:
        print(f"no such module entry point: {name}", file=sys.stderr)
        sys.exit(2)
    sys.exit(MAINS[name](sys.argv[1:]))
