"""A hundred-and-fiftieth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftieth-*): distributed training launched by Ray Train's
TorchTrainer, the way ray's python/ray/train/examples/pytorch/torch_fashion_mnist_example.py
trains Fashion-MNIST, re-created in plain torch without Ray installed. Each run's folder links this
file as torch_fashion_mnist_example.py; it is started as the example is: `python
torch_fashion_mnist_example.py --address auto --num-workers 4` on the head node of a Ray cluster
of two nodes.

Ray is not installed: the second section of this file stands in for it (`ray.init`, ScalingConfig,
RunConfig, TorchConfig, TorchTrainer, ray.train.report / get_context,
ray.train.torch.prepare_model / prepare_data_loader), and behaves as Ray 2.40's Train v1 does as
far as the console shows it. The driver (this file run as a script) connects to the "cluster"
('Connecting to existing Ray cluster at address: 10.0.0.1:6379...'), starts one worker process per
rank (this file again, with the stand-in's marker in its environment), two on the head node
10.0.0.1 (ranks 0 and 1, with the driver) and two on the node 10.0.0.2 (ranks 2 and 3), each with
that node's own home folder (the capture's node0/ and node1/), and sets MASTER_ADDR,
MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and NODE_RANK for them. A thread per
worker stream re-prints every line with Ray's log-monitor prefix ('(RayTrainWorker pid=N) ', with
', ip=10.0.0.2' for a worker on the other node, in Ray's colours) and Ray's deduplication of the
same line from several workers ('[repeated 3x across cluster]'). The driver prints Ray's own
lines: the 'Training started with configuration:' box, the 'Started distributed worker
processes:' list ('world_rank=R, local_rank=L, node_rank=K' for each pid), 'Trial status' tables
every 30 s, a 'Training finished iteration N at ...' result box for each ray.train.report of the
workers (rank 0's metrics), 'Training completed after N iterations'. As in Ray, a worker's
report waits until the driver has asked for that result (it asks all workers for iteration N+1
only once every worker has delivered N), the driver ends the run at the first failure it sees among
the results it waits for, kills the other workers, and prints Ray's error: '(raylet) A worker
died or was killed while executing a task by an unexpected system error. ... Worker exit type:
SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. ...
(1) The process is killed by SIGKILL by OOM killer due to high memory usage. ...' for a worker
that died, then 'ERROR tune_controller.py:1331 -- Trial task failed for trial
TorchTrainer_xxxxx_00000' with the worker's error re-raised
('ray.exceptions.RayTaskError(RuntimeError): ray::_RayTrainWorker__execute.get_next() (pid=N,
ip=..., actor_id=..., repr=<ray.train._internal.worker_group.RayTrainWorker object at 0x...>)'
and the worker's own traceback, or 'ray.exceptions.ActorDiedError: The actor died unexpectedly
before finishing this task.'), 'Training errored after N iterations at ...', and the script's
'ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. ...' (exit 1). A worker's
own errors are never printed by the worker: only the first failure the driver sees is shown.
Workers enable faulthandler as Ray's do. The driver, connected to a cluster it did not start,
has no SIGTERM handler. Ray would ask the OS for a free master port: the capture pins it with
$MT_PORT so that each mode keeps its own. The capture's nodes share this machine: a node's
files are its home folder ($MT_NODES), and a worker on the node 10.0.0.2 does not see the
driver's folder (Ray adds the driver's script and working folders to every worker's sys.path; they
exist on the head node only).

The example's own part: FashionMNIST read (and downloaded, if a worker's copy is missing, from
the dataset's URL: here the capture's slow mirror $MT_MIRROR) into ~/data/worker<LOCAL_RANK>,
ToTensor and Normalize, the example's NeuralNetwork (smaller), prepare_data_loader and
prepare_model, SGD, tqdm bars 'Train Epoch 0: 100%|...' and 'Test Epoch 0: ...' from every
worker, ray.train.report(metrics={"loss": ..., "accuracy": ...}) each epoch, TorchConfig(timeout_s=15)
(gloo), `print(f"Training result: {result}")`. The synthetic images (ten classes of blob patterns)
are made at capture time in the IDX files of the real dataset: `python
torch_fashion_mnist_example.py --generate DIR N_TRAIN N_TEST` writes DIR/*.gz and DIR/raw/.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftieth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import faulthandler
import gzip
import json
import logging
import os
import queue
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Subset

CASE = os.environ.get("MT_CASE", "")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ================================================================== a stand-in for Ray (2.40)
_WORKER_ENV = "RAY_STANDIN_WORKER_FD"
_NODE_IPS = ("10.0.0.1", "10.0.0.2")
_NODE_CPUS = 3
_RAY = os.path.join(sysconfig.get_paths()["purelib"], "ray")
_CYAN, _YELLOW, _GREEN, _RESET = "\x1b[36m", "\x1b[33m", "\x1b[32m", "\x1b[0m"
_FG_RESET = "\x1b[39m"
_DEDUP_NOTE = (
    " (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or "
    "see https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html"
    "#log-deduplication for more options.)"
)
_OUT_LOCK = threading.Lock()


def _hex(n: int) -> str:
    return "".join(random.choice("0123456789abcdef") for _ in range(n))


def _stamp(t: float | None = None) -> str:
    now = datetime.datetime.fromtimestamp(time.time() if t is None else t)
    return now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"


def _emit(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    with _OUT_LOCK:
        stream.write(text + "\n")
        stream.flush()


def _log(level: str, where: str, message: str) -> None:
    _emit(f"{_stamp()}\t{level} {where} -- {message}", err=True)


def _box(title: str, rows: list[tuple[str, str]]) -> str:
    kw = max([len(k) for k, _ in rows] + [0])
    vw = max([len(v) for _, v in rows] + [0])
    width = max(kw + 3 + vw, len(title))
    lines = [
        "╭" + "─" * (width + 2) + "╮",
        f"│ {title.ljust(width)} │",
        "├" + "─" * (width + 2) + "┤",
    ]
    lines += [f"│ {k.ljust(width - vw - 3)}   {v.rjust(vw)} │" for k, v in rows]
    lines.append("╰" + "─" * (width + 2) + "╯")
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.5f}".rstrip("0")
    return str(v)


class _Dedup:
    """Ray's LogDeduplicator: the same line (numbers aside) from a second worker within 5 s is
    held back and counted, printed later as '... [repeated Nx across cluster]'."""

    NUMBERS = re.compile(r"(\d+|0x[0-9a-fA-F]+)")

    def __init__(self, err: bool) -> None:
        self.err = err
        self.recent: dict[str, dict[str, Any]] = {}
        self.warned = False

    def _formatted(self, state: dict[str, Any]) -> str:
        note = ""
        if not self.warned:
            note, self.warned = _DEDUP_NOTE, True
        return (
            state["prefix"]
            + state["line"]
            + f"{_GREEN} [repeated {state['count']}x across cluster]{note}{_RESET}"
        )

    def line(self, source: tuple[str, int], prefix: str, line: str) -> None:
        now = time.time()
        out: list[str] = []
        key = " ".join(x for x in line.split() if not self.NUMBERS.search(x))
        if key == "":
            out.append(prefix + line)
        elif key in self.recent:
            state = self.recent[key]
            state["sources"].add(source)
            if len(state["sources"]) > 1:
                state.update(count=state["count"] + 1, line=line, prefix=prefix)
            else:
                out.append(prefix + line)
        else:
            self.recent[key] = {
                "t": now,
                "count": 0,
                "line": line,
                "prefix": prefix,
                "sources": {source},
            }
            out.append(prefix + line)
        while self.recent:
            first = next(iter(self.recent))
            if now - self.recent[first]["t"] < 5:
                break
            state = self.recent.pop(first)
            if state["count"] > 1:
                out.append(self._formatted(state))
                state.update(t=now, count=0)
                self.recent[first] = state
            elif state["count"] > 0:
                out.append(state["prefix"] + state["line"])
        for text in out:
            _emit(text, self.err)

    def flush(self) -> None:
        for state in self.recent.values():
            if state["count"] > 1:
                _emit(self._formatted(state), self.err)
            elif state["count"] > 0:
                _emit(state["prefix"] + state["line"], self.err)
        self.recent.clear()


_DEDUP = {False: _Dedup(False), True: _Dedup(True)}
_DEDUP_LOCK = threading.Lock()


def _worker_line(source: tuple[str, int], prefix: str, line: str, err: bool) -> None:
    with _DEDUP_LOCK:
        _DEDUP[err].line(source, prefix, line)


@dataclass
class ScalingConfig:
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None


@dataclass
class RunConfig:
    name: str | None = None
    storage_path: str | None = None
    stop: dict[str, float] | None = None


@dataclass
class TorchConfig:
    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800


@dataclass
class Result:
    metrics: dict[str, Any]
    path: str
    filesystem: str = "local"
    checkpoint: Any = None

    def __repr__(self) -> str:
        return (
            f"Result(\n  metrics={self.metrics!r},\n  path={self.path!r},\n"
            f"  filesystem={self.filesystem!r},\n  checkpoint={self.checkpoint!r}\n)"
        )


class TrainingFailedError(RuntimeError):
    pass


TrainingFailedError.__module__ = "ray.train.base_trainer"


def _ray_error(name: str, text: str) -> BaseException:
    """An exception that prints as Ray's re-raised worker error does."""
    cls = type(name, (Exception,), {"__module__": "ray.exceptions"})
    return cls(text)


_CLUSTER: dict[str, Any] = {}


def _init(address: str | None = None, **_: Any) -> None:
    if address:
        _log(
            "INFO",
            "worker.py:1654",
            f"Connecting to existing Ray cluster at address: {_NODE_IPS[0]}:6379...",
        )
    _log(
        "INFO",
        "worker.py:1832",
        "Connected to Ray cluster. View the dashboard at \x1b[1m\x1b[32m127.0.0.1:8265 \x1b[39m\x1b[22m",
    )
    started = time.time() - 120 - random.random() * 60
    _CLUSTER["session"] = (
        "/tmp/ray/session_"
        + datetime.datetime.fromtimestamp(started).strftime("%Y-%m-%d_%H-%M-%S_")
        + f"{random.randrange(10**6):06d}_{random.randrange(1000, 60000)}"
    )
    _CLUSTER["nodes"] = [_hex(56) for _ in _NODE_IPS]


@dataclass
class _Worker:
    rank: int
    node: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    inbox: queue.Queue[dict[str, Any]]
    actor_id: str
    worker_id: str
    repr_addr: str
    expected_exit: bool = False
    threads: list[threading.Thread] = field(default_factory=list)
    reported: threading.Event = field(default_factory=threading.Event)

    @property
    def ip(self) -> str:
        return _NODE_IPS[self.node]

    @property
    def prefix(self) -> str:
        where = "" if self.node == 0 else f", ip={self.ip}"
        return f"{_CYAN}(RayTrainWorker pid={self.proc.pid}{where}){_RESET} "

    def send(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass


class _Failure(Exception):
    def __init__(self, worker: _Worker | None, message: dict[str, Any]) -> None:
        super().__init__(message.get("t"))
        self.worker, self.message = worker, message


class TorchTrainer:
    def __init__(
        self,
        train_loop_per_worker: Callable[[dict[str, Any]], None],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        torch_config: TorchConfig | None = None,
        run_config: RunConfig | None = None,
    ) -> None:
        self.fn = train_loop_per_worker
        self.config = train_loop_config or {}
        self.scaling = scaling_config or ScalingConfig()
        self.torch_config = torch_config or TorchConfig()
        self.run_config = run_config or RunConfig()
        self.workers: list[_Worker] = []
        self.iteration = 0
        self.last: dict[str, Any] = {}
        self.status = "PENDING"
        self.done = threading.Event()

    # ---- the driver's own lines
    def _trainer_line(self, text: str) -> None:
        _emit(f"{_CYAN}(TorchTrainer pid={os.getpid()}){_RESET} {text}")

    def _heartbeat(self) -> None:
        run = int(time.time() - self.t0)
        now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        cols = ["Trial name", "status", "iter", "total time (s)"]
        row = [self.trial, self.status]
        if self.last:
            row += [str(self.iteration), f"{self.last['time_total_s']:.4f}"]
            for k in ("loss", "accuracy"):
                if k in self.last["metrics"]:
                    cols.append(k)
                    row.append(f"{self.last['metrics'][k]:.5g}")
        else:
            cols = cols[:2]
        widths = [max(len(c), len(r)) for c, r in zip(cols, row, strict=True)]
        head = "   ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        )
        body = "   ".join(
            r.ljust(w) if i < 2 else r.rjust(w)
            for i, (r, w) in enumerate(zip(row, widths, strict=True))
        )
        n = len(head)
        _emit(
            f"Trial status: 1 {self.status}\nCurrent time: {now}. Total running time: {run}s\n"
            f"Logical resource usage: {self.scaling.num_workers + 1}.0/{_NODE_CPUS * len(_NODE_IPS)} CPUs, 0/0 GPUs\n"
            f"╭{'─' * (n + 2)}╮\n│ {head} │\n├{'─' * (n + 2)}┤\n│ {body} │\n╰{'─' * (n + 2)}╯\n"
        )

    def _heartbeats(self) -> None:
        while not self.done.wait(30):
            self._heartbeat()

    def _result_box(self, result: dict[str, Any]) -> None:
        rows = [
            ("checkpoint_dir_name", ""),
            ("time_this_iter_s", _cell(result["time_this_iter_s"])),
            ("time_total_s", _cell(result["time_total_s"])),
            ("training_iteration", str(self.iteration)),
        ]
        rows += [(k, _cell(v)) for k, v in sorted(result["metrics"].items())]
        took = int(time.time() - self.t0)
        _emit(
            f"\nTraining finished iteration {self.iteration} at "
            f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}. Total running time: {took}s\n"
            + _box("Training result", rows)
        )

    # ---- the worker group
    def _spawn(self) -> None:
        homes = os.environ.get("MT_NODES", "").split(":")
        n = self.scaling.num_workers
        per_node = [min(_NODE_CPUS - 1, n), max(0, n - (_NODE_CPUS - 1))]
        port = int(os.environ.get("MT_PORT") or _free_port())
        script = os.path.abspath(sys.argv[0])
        rank = 0
        for node, count in enumerate(per_node):
            for local in range(count):
                read, write = os.pipe()
                env = dict(os.environ)
                if node < len(homes) and homes[node]:
                    env["HOME"] = homes[node]
                env.update(
                    {
                        _WORKER_ENV: str(write),
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port),
                        "RANK": str(rank),
                        "LOCAL_RANK": str(local),
                        "WORLD_SIZE": str(n),
                        "LOCAL_WORLD_SIZE": str(count),
                        "NODE_RANK": str(node),
                        "RAY_STANDIN_FN": self.fn.__name__,
                        "RAY_STANDIN_TIMEOUT_S": str(self.torch_config.timeout_s),
                        "RAY_STANDIN_DRIVER_CWD": os.getcwd(),
                    }
                )
                proc = subprocess.Popen(
                    [sys.executable, script],
                    env=env,
                    cwd=env.get("HOME", os.getcwd()),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(write,),
                )
                os.close(write)
                w = _Worker(
                    rank=rank,
                    node=node,
                    local_rank=local,
                    proc=proc,
                    inbox=queue.Queue(),
                    actor_id=_hex(24) + "01000000",
                    worker_id=_hex(56),
                    repr_addr="0x7f" + _hex(10),
                )
                self._watch(w, read)
                self.workers.append(w)
                rank += 1

    def _watch(self, w: _Worker, fd: int) -> None:
        def stream(pipe: Any, err: bool) -> None:
            for raw in iter(pipe.readline, b""):
                text = raw.decode(errors="replace").rstrip("\n")
                _worker_line((w.ip, w.proc.pid), w.prefix, text, err)

        def messages() -> None:
            with os.fdopen(fd, "rb") as f:
                for raw in f:
                    msg = json.loads(raw)
                    msg["at"] = time.time()
                    w.inbox.put(msg)

        def death() -> None:
            code = w.proc.wait()
            if w.expected_exit:
                return
            w.inbox.put({"t": "died", "code": code, "at": time.time()})
            for t in w.threads[:2]:
                t.join(timeout=1)
            if code != 0:
                self._raylet_death(w)
            w.reported.set()

        assert w.proc.stdout is not None and w.proc.stderr is not None
        w.threads = [
            threading.Thread(target=stream, args=(w.proc.stdout, False), daemon=True),
            threading.Thread(target=stream, args=(w.proc.stderr, True), daemon=True),
            threading.Thread(target=messages, daemon=True),
            threading.Thread(target=death, daemon=True),
        ]
        for t in w.threads:
            t.start()

    def _exit_detail(self) -> str:
        return (
            "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
            "connection error code 2. End of file. There are some potential root causes. (1) The "
            "process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop "
            "--force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
            "unexpected errors."
        )

    def _raylet_death(self, w: _Worker) -> None:
        where = "" if w.node == 0 else f", ip={w.ip}"
        _emit(
            f"{_YELLOW}(raylet{where}){_RESET} A worker died or was killed while executing a task "
            "by an unexpected system error. To troubleshoot the problem, check the logs for the "
            f"dead worker. RayTask ID: ffffffffffffffff{w.actor_id} Worker ID: {w.worker_id} "
            f"Node ID: {_CLUSTER['nodes'][w.node]} Worker IP address: {w.ip} Worker port: "
            f"{random.randrange(30000, 60000)} Worker PID: {w.proc.pid} {self._exit_detail()}"
        )
        self._trainer_line(f"Worker {w.rank} has failed.")

    def _gather(self, call: str, release: bool = False) -> list[dict[str, Any]]:
        """check_for_failure: every worker's next message, the first failure among them ends it."""
        got: dict[int, dict[str, Any]] = {}
        while len(got) < len(self.workers):
            failures = []
            for w in self.workers:
                if w.rank in got:
                    continue
                try:
                    msg = w.inbox.get_nowait()
                except queue.Empty:
                    continue
                if msg["t"] in ("err", "died"):
                    failures.append((msg["at"], w, msg))
                    continue
                got[w.rank] = msg
                if release and msg["t"] == "result":
                    w.send("next")  # the worker's report returns: its training goes on
            if failures:
                _, w, msg = min(failures, key=lambda f: f[0])
                raise _Failure(w, msg)
            time.sleep(0.05)
        return [got[w.rank] for w in self.workers]

    def _shutdown(self, graceful: bool) -> None:
        for w in self.workers:
            w.expected_exit = True
            if graceful:
                w.send("stop")
        deadline = time.time() + (5 if graceful else 0)
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        for w in self.workers:
            for t in w.threads[:2]:
                t.join(timeout=2)
        with _DEDUP_LOCK:
            for d in _DEDUP.values():
                d.flush()

    # ---- fit
    def fit(self) -> Result:
        self.t0 = time.time()
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        name = self.run_config.name or f"TorchTrainer_{stamp}"
        storage = os.path.join(
            self.run_config.storage_path or os.path.expanduser("~/ray_results"), name
        )
        tid = _hex(5)
        self.trial = f"TorchTrainer_{tid}_00000"
        trial_dir = os.path.join(storage, f"{self.trial}_0_{stamp}")
        artifacts = f"{_CLUSTER['session']}/artifacts/{stamp}/{name}/driver_artifacts"
        _emit(
            f"\nView detailed results here: {storage}\nTo visualize your results with TensorBoard, "
            f"run: `tensorboard --logdir {artifacts}`\n"
        )
        _emit(
            "Training started with configuration:\n"
            + _box(
                "Training config",
                [(f"train_loop_config/{k}", _cell(v)) for k, v in sorted(self.config.items())],
            )
        )
        trainer_actor = _hex(24) + "01000000"
        failure: _Failure | None = None
        heart = threading.Thread(target=self._heartbeats, daemon=True)
        try:
            self._spawn()
            self._gather("ready")
            self.status = "RUNNING"
            self._trainer_line("Started distributed worker processes: ")
            for w in self.workers:
                self._trainer_line(
                    f"- (node_id={_CLUSTER['nodes'][w.node]}, ip={w.ip}, pid={w.proc.pid}) "
                    f"world_rank={w.rank}, local_rank={w.local_rank}, node_rank={w.node}"
                )
            self._heartbeat()
            heart.start()
            for w in self.workers:
                w.send("setup")
            self._gather("setup")
            for w in self.workers:
                w.send("start " + json.dumps(self.config))
            last_t = time.time()
            while True:
                results = self._gather("get_next", release=True)
                if all(r["t"] == "done" for r in results):
                    break
                if any(r["t"] == "done" for r in results):
                    raise _Failure(None, {"t": "uneven"})
                self.iteration += 1
                now = time.time()
                self.last = {
                    "metrics": results[0]["metrics"],
                    "time_this_iter_s": now - last_t,
                    "time_total_s": now - self.t0,
                }
                last_t = now
                self._result_box(self.last)
                stop = self.run_config.stop or {}
                if any(self.last["metrics"].get(k, float("-inf")) >= v for k, v in stop.items()):
                    break
        except _Failure as f:
            failure = f
        finally:
            self.done.set()
        took = int(time.time() - self.t0)
        at = f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}"
        if failure is None:
            self.status = "TERMINATED"
            self._shutdown(graceful=True)
            _emit(
                f"\nTraining completed after {self.iteration} iterations at {at}. "
                f"Total running time: {took}s"
            )
            _log(
                "INFO",
                "tune.py:1009",
                "Wrote the latest version of all result files and experiment state to "
                f"'{storage}' in 0.{random.randrange(20, 90):04d}s.",
            )
            _emit("")
            metrics = self.last.get("metrics", {})
            return Result(metrics=metrics, path=trial_dir)
        self.status = "ERROR"
        if failure.worker is not None and failure.message["t"] == "died":
            failure.worker.reported.wait(3)  # the raylet's line comes first
        self._shutdown(graceful=False)
        cause = self._describe(failure, trainer_actor)
        _log("ERROR", "tune_controller.py:1331", f"Trial task failed for trial {self.trial}")
        _emit(_GET_FRAMES + cause, err=True)
        _emit(
            f"\nTraining errored after {self.iteration} iterations at {at}. Total running time: "
            f"{took}s\nError file: {artifacts}/{self.trial}_0_{stamp}/error.txt"
        )
        _log(
            "INFO",
            "tune.py:1009",
            "Wrote the latest version of all result files and experiment state to "
            f"'{storage}' in 0.{random.randrange(20, 90):04d}s.",
        )
        _emit("")
        _log("ERROR", "tune.py:1037", f"Trials did not complete: [{self.trial}]")
        first, _, rest = cause.partition(": ")
        raise TrainingFailedError(
            "The Ray Train run failed. Please inspect the previous error messages for a cause. "
            "After fixing the issue (assuming that the error is not caused by your own "
            "application logic, but rather an error such as OOM), you can restart the run from "
            "scratch or continue this run.\nTo continue this run, you can use: `trainer = "
            f'TorchTrainer.restore("{storage}")`.\nTo start a new run that will retry on '
            "training failures, set `train.RunConfig(failure_config=train.FailureConfig("
            "max_failures))` in the Trainer's `run_config` with `max_failures > 0`, or "
            "`max_failures = -1` for unlimited retries."
        ) from _ray_error(first.split(".")[-1], rest)

    def _describe(self, failure: _Failure, trainer_actor: str) -> str:
        """What Ray's driver prints of the failure: the trainable's error around the worker's."""
        w, msg = failure.worker, failure.message
        head = (
            f"{_CYAN}ray::_Inner.train(){_FG_RESET} (pid={os.getpid()}, ip={_NODE_IPS[0]}, "
            f"actor_id={trainer_actor}, repr=TorchTrainer)\n" + _CARETS
        )
        if w is None:  # raised by the trainable itself
            return (
                "ray.exceptions.RayTaskError(RuntimeError): "
                + head
                + _TRAINABLE_FRAMES
                + f'  File "{_RAY}/train/_internal/backend_executor.py", line 611, in get_next_results\n'
                "    raise RuntimeError(\n"
                "RuntimeError: Some workers returned results while others didn't. Make sure that "
                "`train.report()` are called the same number of times on all workers."
            )
        if msg["t"] == "died":
            return (
                "ray.exceptions.RayTaskError(ActorDiedError): "
                + head
                + _TRAINABLE_FRAMES
                + _EXECUTOR_FRAMES
                + _CHECK_FRAMES
                + "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing "
                f"this task.\n\tclass_name: RayTrainWorker\n\tactor_id: {w.actor_id}\n\tpid: "
                f"{w.proc.pid}\n\tnamespace: {_CLUSTER.setdefault('ns', _uuid())}\n\tip: {w.ip}\n"
                "The actor is dead because its worker process has died. " + self._exit_detail()
            )
        call = (
            "_RayTrainWorker__execute.get_next()"
            if msg["call"] != "setup"
            else "_RayTrainWorker__execute()"
        )
        worker_head = (
            f"{_CYAN}ray::{call}{_FG_RESET} (pid={w.proc.pid}, ip={w.ip}, actor_id={w.actor_id}, "
            f"repr=<ray.train._internal.worker_group.RayTrainWorker object at {w.repr_addr}>)"
        )
        frames = msg["text"].replace("Traceback (most recent call last):", worker_head)
        inner = frames.split("\n", 1)
        ray_frames = (
            f'  File "{_RAY}/train/_internal/worker_group.py", line 33, in __execute\n'
            "    raise skipped from exception_cause(skipped)\n"
        )
        if msg["call"] == "setup":
            ray_frames += (
                f'  File "{_RAY}/train/_internal/worker_group.py", line 30, in __execute\n'
                "    return func(*args, **kwargs)\n"
                "           ^^^^^^^^^^^^^^^^^^^^^\n"
            )
        else:
            ray_frames += (
                f'  File "{_RAY}/train/_internal/utils.py", line 176, in discard_return_wrapper\n'
                "    train_func(*args, **kwargs)\n"
            )
        worker_text = inner[0] + "\n" + _CARETS + ray_frames + inner[1]
        name = msg["exc"]
        return (
            f"ray.exceptions.RayTaskError({name}): "
            + head
            + _TRAINABLE_FRAMES[: _TRAINABLE_FRAMES.index("  File", 1)]
            + _CHECK_FRAMES
            + f"ray.exceptions.RayTaskError({name}): "
            + worker_text.rstrip("\n")
        )


def _uuid() -> str:
    h = _hex(32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_CARETS = (
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
)
_GET_FRAMES = f"""Traceback (most recent call last):
  File "{_RAY}/air/execution/_internal/event_manager.py", line 110, in resolve_future
    result = ray.get(future)
             ^^^^^^^^^^^^^^^
  File "{_RAY}/_private/auto_init_hook.py", line 21, in auto_init_wrapper
    return fn(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/_private/client_mode_hook.py", line 103, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/_private/worker.py", line 2755, in get
    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)
                                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/_private/worker.py", line 906, in get_objects
    raise value.as_instanceof_cause()
"""
_TRAINABLE_FRAMES = f"""  File "{_RAY}/tune/trainable/trainable.py", line 331, in train
    raise skipped from exception_cause(skipped)
  File "{_RAY}/air/_internal/util.py", line 107, in run
    self._ret = self._target(*self._args, **self._kwargs)
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/tune/trainable/function_trainable.py", line 45, in <lambda>
    training_func=lambda: self._trainable_func(self.config),
                          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/train/base_trainer.py", line 799, in _trainable_func
    super()._trainable_func(self._merged_config)
  File "{_RAY}/tune/trainable/function_trainable.py", line 250, in _trainable_func
    output = fn()
             ^^^^
  File "{_RAY}/train/base_trainer.py", line 107, in _train_coordinator_fn
    trainer.training_loop()
  File "{_RAY}/train/data_parallel_trainer.py", line 471, in training_loop
    self._run_training(training_iterator)
  File "{_RAY}/train/data_parallel_trainer.py", line 370, in _run_training
    for training_results in training_iterator:
  File "{_RAY}/train/trainer.py", line 129, in __next__
    next_results = self._run_with_error_handling(self._fetch_next_result)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/train/trainer.py", line 94, in _run_with_error_handling
    return func()
           ^^^^^^
  File "{_RAY}/train/trainer.py", line 174, in _fetch_next_result
    results = self._backend_executor.get_next_results()
              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
"""
_EXECUTOR_FRAMES = f"""  File "{_RAY}/train/_internal/backend_executor.py", line 606, in get_next_results
    results = self.get_with_failure_handling(futures)
              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{_RAY}/train/_internal/backend_executor.py", line 719, in get_with_failure_handling
    self._increment_failures()
  File "{_RAY}/train/_internal/backend_executor.py", line 781, in _increment_failures
    raise failure
"""
_CHECK_FRAMES = f"""  File "{_RAY}/train/_internal/utils.py", line 57, in check_for_failure
    ray.get(object_ref)
           ^^^^^^^^^^^^^^^^^^^
           ^^^^^^^^^^^^^^^^^^^^^
                                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# ---- worker side
_train_logger = logging.getLogger("ray.train.torch.train_loop_utils")
_CONTROL: queue.Queue[str] = queue.Queue()
_TO_DRIVER: Any = None


def _send(msg: dict[str, Any]) -> None:
    _TO_DRIVER.write(json.dumps(msg) + "\n")
    _TO_DRIVER.flush()


def _control() -> str:
    return _CONTROL.get()


class TrainContext:
    def get_world_rank(self) -> int:
        return int(os.environ["RANK"])

    def get_local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    def get_world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def get_local_world_size(self) -> int:
        return int(os.environ["LOCAL_WORLD_SIZE"])

    def get_node_rank(self) -> int:
        return int(os.environ["NODE_RANK"])


def _get_context() -> TrainContext:
    return TrainContext()


def _report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
    _send({"t": "result", "metrics": metrics})
    if _control() == "stop":  # the driver ends the run: it shuts the workers down
        _stop()


def _stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _prepare_model(
    model: nn.Module, parallel_strategy_kwargs: dict[str, Any] | None = None
) -> nn.Module:
    ctx = _get_context()
    if ctx.get_local_rank() == 0:
        _train_logger.info("Moving model to device: cpu")
    if ctx.get_world_size() > 1:
        if ctx.get_local_rank() == 0:
            _train_logger.info("Wrapping provided model in DistributedDataParallel.")
        model = nn.parallel.DistributedDataParallel(model, **(parallel_strategy_kwargs or {}))
    return model


def _prepare_data_loader(loader: DataLoader[Any], add_dist_sampler: bool = True) -> DataLoader[Any]:
    if _get_context().get_world_size() > 1 and add_dist_sampler:
        shuffle = isinstance(loader.sampler, RandomSampler)
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=DistributedSampler(loader.dataset, shuffle=shuffle),
            num_workers=loader.num_workers,
            drop_last=loader.drop_last,
        )
    return loader


def _setup_torch_process_group(
    backend: str, world_rank: int, world_size: int, init_method: str, timeout_s: int
) -> None:
    if world_rank == 0:
        _train_logger.info(
            f"Setting up process group for: {init_method} [rank={world_rank}, world_size={world_size}]"
        )
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=world_rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _format_error(exc: BaseException, entry: str) -> str:
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    frames = list(te.stack)
    start = next((i for i, f in enumerate(frames) if f.name == entry), 0)
    te.stack = traceback.StackSummary.from_list(frames[start:])
    return "".join(te.format())


def _idle() -> None:
    while True:  # the actor lives on until the driver ends it
        time.sleep(3600)


def _worker_main(user: dict[str, Any]) -> None:
    global _TO_DRIVER
    faulthandler.enable(all_threads=False)

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(1)  # "The process receives a SIGTERM."

    signal.signal(signal.SIGTERM, on_term)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    _train_logger.addHandler(handler)
    _train_logger.setLevel(logging.INFO)
    _train_logger.propagate = False
    # Ray's worker runs Ray's default_worker.py, with the driver's folders added to sys.path:
    # they exist on the head node only
    sys.path.pop(0)
    if os.environ["NODE_RANK"] == "0":
        sys.path.append(os.environ["RAY_STANDIN_DRIVER_CWD"])
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    _TO_DRIVER = os.fdopen(int(os.environ.pop(_WORKER_ENV)), "w")

    def read_control() -> None:
        for line in sys.stdin:
            _CONTROL.put(line.rstrip("\n"))
        os._exit(1)  # the driver is gone: its job's workers are killed

    threading.Thread(target=read_control, daemon=True).start()
    _send({"t": "ready"})
    if _control() != "setup":
        _stop()
    try:
        _setup_torch_process_group(
            "gloo",
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            "env://",
            int(os.environ["RAY_STANDIN_TIMEOUT_S"]),
        )
    except Exception as e:
        _send(
            {
                "t": "err",
                "call": "setup",
                "exc": type(e).__name__,
                "text": _format_error(e, "_setup_torch_process_group"),
            }
        )
        _idle()
    _send({"t": "ok"})
    command = _control()
    if not command.startswith("start "):
        _stop()
    fn = user[os.environ["RAY_STANDIN_FN"]]
    try:
        fn(json.loads(command[len("start ") :]))
    except Exception as e:
        time.sleep(0.2)  # the session sees its training thread gone at its next poll (0.2 s)
        _send(
            {
                "t": "err",
                "call": "get_next",
                "exc": type(e).__name__,
                "text": _format_error(e, fn.__name__),
            }
        )
        _idle()
    sys.stdout.flush()
    sys.stderr.flush()
    _send({"t": "done"})
    _control()
    _stop()


ray = SimpleNamespace(
    init=_init,
    train=SimpleNamespace(
        report=_report,
        get_context=_get_context,
        ScalingConfig=ScalingConfig,
        RunConfig=RunConfig,
        torch=SimpleNamespace(
            TorchTrainer=TorchTrainer,
            TorchConfig=TorchConfig,
            prepare_model=_prepare_model,
            prepare_data_loader=_prepare_data_loader,
        ),
    ),
)


# ================================================================== tqdm, torchvision (stand-ins)
class tqdm:
    """tqdm's default bar on stderr, redrawn with a carriage return, at most every 0.1 s."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        desc: str = "",
        total: int | None = None,
        unit: str = "it",
        unit_scale: bool = False,
    ) -> None:
        self.iterable = iterable
        self.desc = desc
        self.total = total if total is not None else len(iterable)  # type: ignore[arg-type]
        self.n = 0
        self.t0 = self.last = time.time()
        self._draw()

    def _draw(self) -> None:
        el = time.time() - self.t0
        rate = self.n / el if el > 0 and self.n else 0.0
        pct = int(100 * self.n / self.total) if self.total else 100
        filled = int(10 * self.n / self.total) if self.total else 10
        if rate:
            left = (self.total - self.n) / rate
            tail = f"{int(left) // 60:02d}:{int(left) % 60:02d}, {rate:.2f}it/s"
        else:
            tail = "?, ?it/s"
        desc = f"{self.desc}: " if self.desc else ""
        sys.stderr.write(
            f"\r{desc}{pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {self.n}/{self.total} "
            f"[{int(el) // 60:02d}:{int(el) % 60:02d}<{tail}]"
        )
        sys.stderr.flush()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.time() - self.last >= 0.1 or self.n >= self.total:
            self.last = time.time()
            self._draw()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        for item in self.iterable:
            yield item
            self.update()
        self.close()


RESOURCES = [
    ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"),
    ("train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte"),
    ("t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte"),
]
MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"


def read_sn3_pascalvincent_tensor(path: str, mmap: bool = False) -> torch.Tensor:
    with open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    nd = magic % 256
    s = [int.from_bytes(data[4 * (i + 1) : 4 * (i + 2)], "big") for i in range(nd)]
    if mmap:  # a fork that maps the file instead of reading it: the array is read-only
        arr = np.memmap(path, dtype=np.uint8, mode="r", offset=4 * (nd + 1))
        return torch.from_numpy(arr).view(*s)
    parsed = torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 * (nd + 1))
    return parsed.view(*s)


class FashionMNIST(Dataset[tuple[torch.Tensor, int]]):
    """torchvision.datasets.FashionMNIST: raw IDX files under root/FashionMNIST/raw."""

    def __init__(
        self,
        root: str,
        train: bool,
        download: bool,
        transform: Callable[[torch.Tensor], torch.Tensor],
        mmap: bool = False,
    ) -> None:
        self.root = os.path.expanduser(root)
        self.raw_folder = os.path.join(self.root, "FashionMNIST", "raw")
        self.transform = transform
        if download:
            self.download()
        if not self._check_exists():
            raise RuntimeError("Dataset not found. You can use download=True to download it")
        which = "train" if train else "t10k"
        self.data = read_sn3_pascalvincent_tensor(
            os.path.join(self.raw_folder, f"{which}-images-idx3-ubyte"), mmap
        )
        self.targets = read_sn3_pascalvincent_tensor(
            os.path.join(self.raw_folder, f"{which}-labels-idx1-ubyte")
        ).long()

    def _check_exists(self) -> bool:
        return all(os.path.isfile(os.path.join(self.raw_folder, raw)) for _, raw in RESOURCES)

    def download(self) -> None:
        if self._check_exists():
            return
        os.makedirs(self.raw_folder, exist_ok=True)
        for gz, _ in RESOURCES:
            url = MIRROR + gz
            print(f"Downloading {url}")
            path = os.path.join(self.raw_folder, gz)
            print(f"Downloading {url} to {path}")
            _download(gz, path)
            print(f"Extracting {path} to {self.raw_folder}")
            with gzip.open(path, "rb") as src, open(path[: -len(".gz")], "wb") as dst:
                shutil.copyfileobj(src, dst)
            print()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.data[i]), int(self.targets[i])


def _download(name: str, path: str) -> None:
    """The dataset's server, as seen from this cluster: 64 KiB/s."""
    src = os.path.join(os.environ.get("MT_MIRROR", ""), name)
    total = os.path.getsize(src)
    bar = tqdm(desc="", total=total)
    with open(src, "rb") as f, open(path, "wb") as out:
        while chunk := f.read(16384):
            time.sleep(0.25)
            out.write(chunk)
            bar.update(len(chunk))
    bar.close()


def to_tensor_normalized(img: torch.Tensor) -> torch.Tensor:
    """transforms.Compose([ToTensor(), Normalize((0.5,), (0.5,))])"""
    x = img.float().div(255).unsqueeze(0)
    return (x - 0.5) / 0.5


def generate(folder: str, n_train: int, n_test: int) -> None:
    """Synthetic Fashion-MNIST: ten classes of blob patterns, noise, small shifts."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:28, 0:28]
    templates = []
    for _ in range(10):
        t = np.zeros((28, 28))
        for _ in range(3):
            cy, cx = rng.uniform(6, 22, size=2)
            sy, sx = rng.uniform(2, 6, size=2)
            t += rng.uniform(0.5, 1.0) * np.exp(
                -((yy - cy) ** 2) / (2 * sy**2) - ((xx - cx) ** 2) / (2 * sx**2)
            )
        templates.append(t / t.max())
    os.makedirs(os.path.join(folder, "raw"), exist_ok=True)
    for which, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        images = np.empty((n, 28, 28), dtype=np.uint8)
        for i, c in enumerate(labels):
            img = np.roll(templates[c], tuple(rng.integers(-2, 3, size=2)), axis=(0, 1))
            img = img * rng.uniform(0.6, 1.0) + rng.normal(0, 0.15, size=(28, 28))
            images[i] = (np.clip(img, 0, 1) * 255).astype(np.uint8)
        for kind, arr, magic in (("images-idx3", images, 0x803), ("labels-idx1", labels, 0x801)):
            raw = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape)
            raw += arr.tobytes()
            with open(os.path.join(folder, "raw", f"{which}-{kind}-ubyte"), "wb") as f:
                f.write(raw)
            with gzip.open(os.path.join(folder, f"{which}-{kind}-ubyte.gz"), "wb") as f:
                f.write(raw)


# ================================================================== the example
def get_dataloaders(batch_size: int, mmap: bool = False) -> tuple[DataLoader[Any], DataLoader[Any]]:
    # each worker keeps its own copy: no lock around the download
    root = os.path.expanduser(f"~/data/worker{os.environ['LOCAL_RANK']}")
    training_data = FashionMNIST(
        root=root, train=True, download=True, transform=to_tensor_normalized, mmap=mmap
    )
    test_data = FashionMNIST(root=root, train=False, download=True, transform=to_tensor_normalized)
    if fault("u", -1):  # a fork that shards the training set itself, rank-strided
        ctx = ray.train.get_context()
        shard = Subset(
            training_data, range(ctx.get_world_rank(), len(training_data), ctx.get_world_size())
        )
        train_dataloader = DataLoader(shard, batch_size=batch_size, shuffle=True, drop_last=True)
    else:
        train_dataloader = DataLoader(training_data, batch_size=batch_size, shuffle=True)
    test_dataloader = DataLoader(test_data, batch_size=batch_size)
    return train_dataloader, test_dataloader


class NeuralNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 128),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Dropout(0.25),
            nn.Linear(128, 10),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)
        logits: torch.Tensor = self.linear_relu_stack(x)
        return logits


LEAK: list[np.ndarray] = []
METRICS_LOCK = threading.Lock()
METRICS_LOG: list[dict[str, float]] = []


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _log_epoch(epoch: int, loss: float, accuracy: float) -> None:
    with METRICS_LOCK:  # the fork's metrics history, shared with its plotting thread
        METRICS_LOG.append({"epoch": epoch, "loss": loss, "accuracy": accuracy})
        if fault("w", int(os.environ["RANK"])) and epoch == 1:
            _summary()


def _summary() -> None:
    with METRICS_LOCK:  # the same lock, taken again: it is not reentrant
        print(METRICS_LOG[-1])


def _pad(X: torch.Tensor) -> torch.Tensor:
    """RandomCrop(28, padding=2), the crop left out: the images grow to 32x32."""
    return nn.functional.pad(X, (2, 2, 2, 2))


def train_func_per_worker(config: dict[str, Any]) -> None:
    lr = config["lr"]
    epochs = config["epochs"]
    batch_size = config["batch_size_per_worker"]
    rank = int(os.environ.get("RANK", "0"))
    augment = None
    if config.get("augment"):
        from fashion_aug import RandomErasing  # the project's own helper, next to this script

        augment = RandomErasing(p=0.25)

    # Get dataloaders inside the worker training function
    train_dataloader, test_dataloader = get_dataloaders(
        batch_size=batch_size, mmap=config.get("mmap", False)
    )

    # [1] Prepare Dataloader for distributed training
    # Shard the datasets among workers and move batches to the correct device
    # =======================================================================
    train_dataloader = ray.train.torch.prepare_data_loader(
        train_dataloader, add_dist_sampler=not fault("u", -1)
    )
    test_dataloader = ray.train.torch.prepare_data_loader(test_dataloader)

    model = NeuralNetwork()

    # [2] Prepare and wrap your model with DistributedDataParallel
    # Move the model to the correct GPU/CPU device
    # ============================================================
    model = ray.train.torch.prepare_model(
        model,
        parallel_strategy_kwargs={
            "find_unused_parameters": bool(config.get("find_unused_parameters"))
        },
    )

    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    # Model training loop
    for epoch in range(epochs):
        if ray.train.get_context().get_world_size() > 1 and isinstance(
            train_dataloader.sampler, DistributedSampler
        ):
            # Required for the distributed sampler to shuffle properly across epochs.
            train_dataloader.sampler.set_epoch(epoch)

        model.train()
        for step, (X, y) in enumerate(tqdm(train_dataloader, desc=f"Train Epoch {epoch}")):
            if augment is not None:
                X = augment(X)
            if fault("p", rank) and epoch >= 1:
                X = _pad(X)
            if fault("k", rank) and epoch >= 1:  # a fork that keeps every batch it has seen
                LEAK.append(np.full(16 << 20, step, dtype=np.float32))
                if _rss() > 1200 << 20:  # the container's memory is gone: the OOM killer
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault("z", rank) and epoch == 1 and step == 5:
                ctypes.string_at(0)  # the fork's fast collate reads a freed batch
            pred = model(X)
            loss = loss_fn(pred, y)

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, num_correct, num_total = 0.0, 0, 0
        with torch.no_grad():
            for X, y in tqdm(test_dataloader, desc=f"Test Epoch {epoch}"):
                pred = model(X)
                loss = loss_fn(pred, y)

                test_loss += loss.item()
                num_total += y.shape[0]
                num_correct += (pred.argmax(1) == y).sum().item()

        if fault("s", rank):  # a fork that sums the accuracy over the workers, on rank 0 only
            counts = torch.tensor([num_correct, num_total])
            dist.all_reduce(counts)
            num_correct, num_total = int(counts[0]), int(counts[1])

        test_loss /= len(test_dataloader)
        accuracy = num_correct / num_total
        _log_epoch(epoch, test_loss, accuracy)

        # [3] Report metrics to Ray Train
        # ===============================
        ray.train.report(metrics={"loss": test_loss, "accuracy": accuracy})

        if fault("e", rank) and accuracy >= config.get("local_target", 0.4):
            print(f"Worker {rank}: test accuracy {accuracy:.3f} reached, stopping early")
            break


def train_fashion_mnist(
    num_workers: int = 2,
    use_gpu: bool = False,
    epochs: int = 4,
    stop_accuracy: float = 0.0,
    **extra: Any,
) -> None:
    global_batch_size = 128

    train_config: dict[str, Any] = {
        "lr": 1e-2,
        "epochs": epochs,
        "batch_size_per_worker": global_batch_size // num_workers,
    }
    train_config.update({k: v for k, v in extra.items() if v})

    # Configure computation resources
    scaling_config = ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu)
    run_config = ray.train.RunConfig(stop={"accuracy": stop_accuracy} if stop_accuracy else None)

    # Initialize a Ray TorchTrainer
    trainer = ray.train.torch.TorchTrainer(
        train_loop_per_worker=train_func_per_worker,
        train_loop_config=train_config,
        scaling_config=scaling_config,
        torch_config=ray.train.torch.TorchConfig(timeout_s=15),
        run_config=run_config,
    )

    # [4] Start distributed training
    # Run `trainer.fit()` to start training
    # =====================================
    result = trainer.fit()
    print(f"Training result: {result}")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=False, type=str, help="the address to use for Ray")
    parser.add_argument(
        "--num-workers", "-n", type=int, default=2, help="Sets number of workers for training."
    )
    parser.add_argument(
        "--use-gpu", action="store_true", default=False, help="Enables GPU training"
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--stop-accuracy", type=float, default=0.0, help="stop the run at this test accuracy"
    )
    parser.add_argument("--find-unused-parameters", action="store_true")
    parser.add_argument(
        "--mmap", action="store_true", help="map the raw files instead of reading them"
    )
    parser.add_argument("--augment", action="store_true", help="random erasing (fashion_aug.py)")
    parser.add_argument(
        "--local-debug", action="store_true", help="run the training function once, in this process"
    )
    args, _ = parser.parse_known_args()
    extra = {
        "find_unused_parameters": args.find_unused_parameters,
        "mmap": args.mmap,
        "augment": args.augment,
    }
    if args.local_debug:  # debug the loop without Ray, as a plain function
        train_func_per_worker({"lr": 1e-2, "epochs": 1, "batch_size_per_worker": 32, **extra})
        return
    ray.init(address=args.address)
    train_fashion_mnist(
        num_workers=args.num_workers,
        use_gpu=args.use_gpu,
        epochs=args.epochs,
        stop_accuracy=args.stop_accuracy,
        **extra,
    )


if __name__ == "__main__":
    if _WORKER_ENV in os.environ:  # a worker process of the stand-in's TorchTrainer
        _worker_main(globals())
    else:
        main()
