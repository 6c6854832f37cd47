"""A sixteenth training-program style: a DDP job as it is containerised for Kubernetes
(a Kubeflow PyTorchJob, a StatefulSet, a JobSet with torchrun in each pod), re-created on one
machine by tests/fixtures/real/capture_sixteenth.sh. Everything a pod is given comes from its
environment: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (or torchrun's, or the StatefulSet ordinal
in HOSTNAME), the mounted config (TRAIN_CONFIG stands for /etc/config/train.json, a ConfigMap),
the checkpoint volume (CKPT_DIR, a PVC), a metrics sidecar (METRICS_URL) and LOG_FORMAT.
Every log line names the pod (HOSTNAME). FAULT selects the one failure that lives in the code
rather than in what a pod is given; it is never printed.

Not used to build any rule: the diagnosis must generalise to it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

POD = os.environ.get("HOSTNAME", socket.gethostname())


class _JsonFormatter(logging.Formatter):
    """One JSON object a line, as log shippers (fluent-bit, Loki) want it from a pod."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "pod": POD,
            "rank": getattr(record, "rank", None),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class _RankFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.rank: int | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        record.pod = POD
        return True


RANK_FILTER = _RankFilter()
log = logging.getLogger("trainer")


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    if os.environ.get("LOG_FORMAT", "json") == "json":
        handler.setFormatter(_JsonFormatter())
    else:  # local time of the container (its TZ), as logging's default asctime is
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(pod)s [rank=%(rank)s] %(message)s")
        )
    handler.addFilter(RANK_FILTER)
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def wait_for_master(attempts: int) -> None:
    """What an init container or entry script does: wait until the master service answers."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    for attempt in range(1, attempts + 1):
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                log.info("master %s:%d is reachable", addr, port)
                return
        except OSError as exc:
            log.info(
                "waiting for master %s:%d (attempt %d/%d): %s", addr, port, attempt, attempts, exc
            )
            time.sleep(0.5)
    log.warning(
        "master %s:%d not reachable after %d attempts, starting anyway", addr, port, attempts
    )


def load_config() -> dict[str, Any]:
    path = Path(os.environ.get("TRAIN_CONFIG", "/etc/config/train.json"))
    cfg: dict[str, Any] = json.loads(path.read_text())
    log.info("config %s: %s", path, json.dumps(cfg, sort_keys=True))
    return cfg


class Heartbeat(threading.Thread):
    """A liveness line every few seconds, from its own thread (what an exec probe tails)."""

    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.step = 0

    def run(self) -> None:
        while True:
            time.sleep(self.every_s)
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            log.info("heartbeat step=%d rss_mb=%d", self.step, rss_mb)


def push_metrics(url: str, timeout_s: float | None, step: int, loss: float) -> None:
    body = json.dumps({"pod": POD, "step": step, "loss": loss}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except (urllib.error.URLError, OSError) as exc:
        log.warning("metrics push to %s failed: %s", url, exc)


STOP = threading.Event()


def on_sigterm(signum: int, frame: object) -> None:
    log.warning("SIGTERM received: pod is terminating, checkpointing before exit")
    STOP.set()


def train(cfg: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    rank = int(os.environ["RANK"]) if "RANK" in os.environ else int(POD.rsplit("-", 1)[1])
    world = int(os.environ["WORLD_SIZE"])
    RANK_FILTER.rank = rank
    lr = cfg["lr"]
    steps = int(cfg["steps"])
    batch = int(cfg["batch_size"])
    shape = [int(s) for s in cfg.get("sample_shape", [64])]
    if rank != 0 and "TORCHELASTIC_RUN_ID" not in os.environ:
        wait_for_master(int(cfg.get("master_wait_attempts", 30)))
    log.info(
        "joining process group: world_size=%d master=%s:%s",
        world,
        os.environ["MASTER_ADDR"],
        os.environ["MASTER_PORT"],
    )
    dist.init_process_group(
        "gloo",
        init_method="env://",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=int(cfg.get("dist_timeout_s", 15))),
    )
    log.info("process group ready: rank %d of %d", rank, world)

    class Synthetic(Dataset[tuple[Any, Any]]):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            g = torch.Generator().manual_seed(i)
            return torch.randn(shape, generator=g), torch.tensor(i % 10)

    features = shape[0]
    model = nn.Sequential(nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 10))
    ddp = DistributedDataParallel(model, find_unused_parameters=bool(cfg.get("find_unused")))
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    ckpt_dir = Path(os.environ["CKPT_DIR"])
    saver = rank == 0 or not cfg.get("ckpt_shared", True)
    latest = ckpt_dir / "latest.pt"
    start = 0
    if latest.exists():
        state = torch.load(latest, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        log.info("resuming from %s at step %d", latest, start)
    else:
        log.info("no checkpoint in %s, starting from step 0", ckpt_dir)

    def save(step: int) -> None:
        if not saver:
            return
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        tmp = ckpt_dir / "latest.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, latest)
        log.info("checkpoint saved to %s (step %d)", latest, step)

    sampler = DistributedSampler(Synthetic(), num_replicas=world, rank=rank, seed=7)
    loader = DataLoader(
        Synthetic(),
        batch_size=batch,
        sampler=sampler,
        num_workers=int(cfg.get("loader_workers", 0)),
    )
    heartbeat = Heartbeat(float(cfg.get("heartbeat_s", 2)))
    heartbeat.step = start
    heartbeat.start()
    metrics_url = os.environ.get("METRICS_URL", "http://127.0.0.1:9091/metrics")
    push_timeout = cfg.get("metrics_timeout_s")
    hoard: list[Any] = []
    step, epoch, t0 = start, 0, time.monotonic()
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if x.dim() > 2:  # image-like samples: pooled to their channels
                x = x.mean(dim=tuple(range(2, x.dim())))
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            heartbeat.step = step
            if os.environ.get("FAULT") == "hoard":  # a per-step cache that is never trimmed
                hoard.append(torch.ones(4 << 20))
            if step % int(cfg.get("log_every", 2)) == 0:
                log.info("step %d/%d loss=%.4f lr=%g", step, steps, loss.item(), lr)
            if step % int(cfg.get("push_every", 5)) == 0:
                push_metrics(metrics_url, push_timeout, step, loss.item())
            if step % int(cfg.get("ckpt_every", 10)) == 0:
                save(step)
            if STOP.is_set():
                save(step)
                log.warning("stopped at step %d on SIGTERM, exiting 143", step)
                return 143
            time.sleep(float(cfg.get("step_sleep_s", 0.1)))
            if step >= steps:
                break
        epoch += 1
    save(step)
    log.info("training finished: %d steps in %.1f s", step - start, time.monotonic() - t0)
    dist.destroy_process_group()
    return 0


class _Sink(BaseHTTPRequestHandler):
    delay_s = 0.0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(self.delay_s)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_sink(port: int, delay_s: float) -> None:
    """A metrics sidecar that answers each push after delay_s (a stalled push gateway)."""
    _Sink.delay_s = delay_s
    HTTPServer(("127.0.0.1", port), _Sink).serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--wait-master",
        type=int,
        metavar="ATTEMPTS",
        help="only wait for the master service (a pod's entry script)",
    )
    parser.add_argument("--metrics-sink", nargs=2, metavar=("PORT", "DELAY_S"))
    args = parser.parse_args()
    if args.metrics_sink:
        serve_sink(int(args.metrics_sink[0]), float(args.metrics_sink[1]))
        return 0
    setup_logging()
    if args.wait_master is not None:
        wait_for_master(args.wait_master)
        return 0
    signal.signal(signal.SIGTERM, on_sigterm)
    log.info("pod %s starting (pid %d)", POD, os.getpid())
    try:
        cfg = load_config()
        return train(cfg)
    except Exception:
        log.exception("training failed")
        raise


if __name__ == "__main__":
    sys.exit(main())
