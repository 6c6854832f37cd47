"""docker compose v2 (2.32) for tests/fixtures/real/capture_hundredsixtyeighth.sh, without docker:
`up --abort-on-container-exit` and `logs --no-color SERVICE` of a compose file whose services
are the nodes of one torchrun job on this machine (`network_mode: host`). A container is the
service's command run as PID 1 of its own PID, mount and UTS namespaces (util-linux `unshare`):
the image's folder bound at its working_dir (a copy per container: its writable layer), the
service's volumes and tmpfs mounted, /tmp its own, the hostname its short id (the host's with
network_mode: host, as docker does); so when PID 1
exits the kernel kills what is left in it, and a signal from outside reaches PID 1 only where it
has a handler (torchrun has one for SIGTERM), as in a container.

What compose prints is what compose/v2.32.4 prints when its output is no terminal (cmd/formatter/
logs.go, pkg/compose/printer.go, up.go, attach.go, pkg/progress/plain.go): the plain progress
lines on stderr (' Container ppo-multigpu-node0-1  Creating' / 'Created'; Println of '', the
event's id, its empty text and its status), 'Attaching to node0-1, node1-1' on stdout, each
container line with its name padded to the longest name plus one and ' | ' ('node0-1  | ...'),
a container's stdout to stdout and its stderr to stderr, '\\r\\x1b[K' + 'node1-1 exited with
code 1' (goterm.RESET_LINE, written even without colour), then with --abort-on-container-exit
'Aborting on container exit...' and the stop of every container in reverse dependency order
(' Container ...  Stopping' / 'Stopped'; SIGTERM to PID 1, SIGKILL after stop_grace_period,
10 s); once it aborts no container line and no exit is printed any more. On SIGINT: 'Gracefully
stopping... (press Ctrl+C again to force)' and the same stop (a second SIGINT kills). A named
volume whose driver_opts say tmpfs is one tmpfs both containers mount. Each container's lines
are kept as docker's json-file driver keeps them, for `logs`. Nothing here is the program's:
the fault switch is only passed through to the containers' environment.

The images are folders under $DOCKER_EMU_ROOT/images/<name>/<tag>/ (rootfs/: the working
directory's files; config.json: Env), the containers under $DOCKER_EMU_ROOT/containers/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

RESET_LINE = "\r\x1b[K"  # github.com/buger/goterm: RESET_LINE = "\r\033[K"
ROOT = Path(os.environ.get("DOCKER_EMU_ROOT", Path.home() / ".docker-emu"))
# environment the capture passes to every container (the fault switch, its own mark on every
# process of a run), never shown
PASS = os.environ.get("DOCKER_EMU_PASS", "").split()


def out(text: str) -> None:
    os.write(1, text.encode())


def err(text: str) -> None:
    os.write(2, text.encode())


def event(ident: str, status: str) -> None:
    """pkg/progress/plain.go: fmt.Fprintln(p.out, prefix, e.ID, e.Text, e.StatusText)."""
    err(f" {ident}  {status}\n")


@dataclass
class Container:
    service: str
    project: str
    config: dict[str, Any]
    ident: str = field(default_factory=lambda: secrets.token_hex(32))
    proc: subprocess.Popen[bytes] | None = None
    pid1: int = 0
    exit_code: int | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:  # getCanonicalContainerName
        return f"{self.project}-{self.service}-1"

    @property
    def short(self) -> str:  # getContainerNameWithoutProject
        return f"{self.service}-1"

    @property
    def folder(self) -> Path:
        return ROOT / "containers" / self.ident


def load(path: Path) -> dict[str, Any]:
    with open(path) as f:
        project: dict[str, Any] = yaml.safe_load(f)
    if "version" in project:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        msg = (
            f"{path}: the attribute `version` is obsolete, it will be ignored, please remove it "
            "to avoid potential confusion"
        )
        err(f'time="{stamp}" level=warning msg="{msg}"\n')
    return project


def project_name(path: Path, project: dict[str, Any], given: str | None) -> str:
    name = given or os.environ.get("COMPOSE_PROJECT_NAME") or project.get("name")
    name = name or path.resolve().parent.name
    return re.sub(r"[^a-z0-9_-]", "", name.lower())


def dependency_order(services: dict[str, Any]) -> list[str]:
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        for dep in services[name].get("depends_on", []):
            visit(dep)
        done.append(name)

    for name in services:
        visit(name)
    return done


def seconds(value: str | None, default: float = 10.0) -> float:
    if not value:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", str(value))
    if not m:
        return default
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    return float(m.group(1)) * scale


class Compose:
    def __init__(self, path: Path, project: dict[str, Any], name: str):
        self.path = path
        self.base = path.resolve().parent
        self.project = project
        self.name = name
        self.services: dict[str, Any] = project["services"]
        self.order = dependency_order(self.services)
        self.containers = {s: Container(s, name, self.services[s]) for s in self.order}
        self.events: queue.Queue[tuple[str, Container, str, str]] = queue.Queue()
        self.aborting = False
        self.interrupts = 0
        self.stopper: threading.Thread | None = None

    # ---------------------------------------------------------------------------- volumes
    def volume_dir(self, volume: str) -> Path:
        name = f"{self.name}_{volume}"
        data = ROOT / "volumes" / name / "_data"
        if data.is_dir():
            return data
        event(f"Volume {json.dumps(name)}", "Creating")
        data.mkdir(parents=True)
        opts = (self.project.get("volumes") or {}).get(volume) or {}
        driver_opts = opts.get("driver_opts") or {}
        if driver_opts.get("type") == "tmpfs":
            mount = ["mount", "-t", "tmpfs"]
            if driver_opts.get("o"):
                mount += ["-o", str(driver_opts["o"])]
            subprocess.run([*mount, str(driver_opts.get("device", "tmpfs")), str(data)], check=True)
        event(f"Volume {json.dumps(name)}", "Created")
        return data

    # -------------------------------------------------------------------------- containers
    def create(self, c: Container) -> None:
        event(f"Container {c.name}", "Creating")
        image, _, tag = str(c.config["image"]).partition(":")
        image_dir = ROOT / "images" / image / (tag or "latest")
        c.folder.mkdir(parents=True)
        meta = {"project": c.project, "service": c.service, "name": c.name}
        (c.folder / "meta.json").write_text(json.dumps(meta))
        shutil.copytree(image_dir / "rootfs", c.folder / "layer", symlinks=True)
        with open(image_dir / "config.json") as f:
            image_config = json.load(f)
        env = dict(e.split("=", 1) for e in image_config.get("Env", []))
        # with network_mode: host a container keeps the host's hostname (and its /etc/hosts)
        host_network = c.config.get("network_mode") == "host"
        env["HOSTNAME"] = socket.gethostname() if host_network else c.ident[:12]
        env.setdefault("HOME", "/root")
        environment = c.config.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(e.split("=", 1) for e in environment)
        env.update({k: str(v) for k, v in environment.items()})
        for name in PASS:
            if name in os.environ:
                env[name] = os.environ[name]
        workdir = c.config.get("working_dir") or image_config.get("WorkingDir", "/")
        lines = ["set -e", "mount -t tmpfs -o mode=0755 tmpfs /srv"]
        lines += [f"mkdir -p {workdir}", f"mount --bind {c.folder / 'layer'} {workdir}"]
        for spec in c.config.get("volumes") or []:
            source, target, *mode = str(spec).split(":")
            if source.startswith((".", "/")):
                host = (self.base / source).resolve()
                host.mkdir(parents=True, exist_ok=True)
            else:
                host = self.volume_dir(source)
            lines += [f"mkdir -p {target}", f"mount --bind {host} {target}"]
            if mode == ["ro"]:
                lines.append(f"mount -o remount,bind,ro {target}")
        for spec in c.config.get("tmpfs") or []:
            target, _, opts = str(spec).partition(":")
            lines += [
                f"mkdir -p {target}",
                f"mount -t tmpfs -o {opts or 'mode=1777'} tmpfs {target}",
            ]
        lines.append("mount -t tmpfs -o mode=1777 tmpfs /tmp")
        if not host_network:
            lines.append(f"hostname {c.ident[:12]}")
        lines += [f"cd {workdir}", 'exec "$@"']
        (c.folder / "init.sh").write_text("\n".join(lines) + "\n")
        c.env = env
        event(f"Container {c.name}", "Created")

    def start(self, c: Container) -> None:
        command = c.config["command"]
        if isinstance(command, str):
            command = shlex.split(command)
        c.proc = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "sh",
                str(c.folder / "init.sh"),
                *[str(a) for a in command],
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=c.env,
            start_new_session=True,
        )
        for _ in range(100):  # unshare forks PID 1 of the new namespace
            children = Path(f"/proc/{c.proc.pid}/task/{c.proc.pid}/children")
            try:
                found = children.read_text().split()
            except OSError:
                found = []
            if found:
                c.pid1 = int(found[0])
                break
            time.sleep(0.01)
        log = open(c.folder / "log.jsonl", "a")  # noqa: SIM115 (closed by the last reader)
        streams = [("stdout", c.proc.stdout), ("stderr", c.proc.stderr)]
        readers = [
            threading.Thread(target=self.read, args=(c, name, pipe, log), daemon=True)
            for name, pipe in streams
        ]
        for r in readers:
            r.start()
        threading.Thread(target=self.reap, args=(c, readers, log), daemon=True).start()

    def read(self, c: Container, stream: str, pipe: Any, log: Any) -> None:
        """utils.GetWriter: the stream split on '\\n', a last partial line at its end."""
        buffer = b""
        while chunk := os.read(pipe.fileno(), 65536):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self.line(c, stream, line.decode(errors="replace"), log, ended=True)
        if buffer:
            self.line(c, stream, buffer.decode(errors="replace"), log, ended=False)

    def line(self, c: Container, stream: str, text: str, log: Any, ended: bool) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        log.write(
            json.dumps({"log": text + ("\n" if ended else ""), "stream": stream, "time": stamp})
        )
        log.write("\n")
        log.flush()
        self.events.put(("log", c, stream, text))

    def reap(self, c: Container, readers: list[threading.Thread], log: Any) -> None:
        assert c.proc is not None
        code = c.proc.wait()
        for r in readers:
            r.join()
        log.close()
        c.exit_code = 128 - code if code < 0 else code
        c.exited.set()
        self.events.put(("exit", c, "", ""))

    def stop_one(self, c: Container) -> None:
        event(f"Container {c.name}", "Stopping")
        if not c.exited.is_set():
            grace = seconds(c.config.get("stop_grace_period"))
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid1, signal.SIGTERM)
            if not c.exited.wait(grace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid1, signal.SIGKILL)
                c.exited.wait()
        event(f"Container {c.name}", "Stopped")

    def stop(self) -> None:
        for service in reversed(self.order):  # InReverseDependencyOrder
            self.stop_one(self.containers[service])

    def kill(self) -> None:
        for c in self.containers.values():
            if not c.exited.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid1, signal.SIGKILL)

    # ------------------------------------------------------------------------------- up
    def up(self, abort_on_exit: bool) -> int:
        for volume in self.project.get("volumes") or {}:  # ensureProjectVolumes, first
            self.volume_dir(volume)
        for service in self.order:
            self.create(self.containers[service])
        names = sorted(c.short for c in self.containers.values())
        width = max(len(n) for n in names) + 1  # logConsumer.computeWidth
        out(f"Attaching to {', '.join(names)}\n")
        signal.signal(signal.SIGINT, self.interrupt)
        signal.signal(signal.SIGTERM, self.interrupt)
        for service in self.order:
            self.start(self.containers[service])
        running = set(self.containers)
        exit_code, exit_from = 0, ""
        while running:
            try:
                kind, c, stream, text = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "log":
                if not self.aborting:
                    line = f"{c.short:<{width}} | {text}\n"
                    (out if stream == "stdout" else err)(line)
                continue
            running.discard(c.service)
            if not self.aborting:
                out(f"{RESET_LINE}{c.short} exited with code {c.exit_code}\n")
            if abort_on_exit and not self.aborting:
                self.aborting = True
                exit_from = exit_from or c.service
                err("Aborting on container exit...\n")
                self.stop()
            if c.service == exit_from:
                exit_code = c.exit_code or 0
        if self.stopper is not None:
            self.stopper.join()
            return 130
        return exit_code

    def interrupt(self, signum: int, frame: Any) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.aborting = True  # printer.Cancel()
            err("Gracefully stopping... (press Ctrl+C again to force)\n")
            self.stopper = threading.Thread(target=self.stop, daemon=True)
            self.stopper.start()
        else:
            self.kill()

    # ------------------------------------------------------------------------------ logs
    def logs(self, services: list[str]) -> int:
        wanted = services or self.order
        found = []
        for folder in sorted((ROOT / "containers").iterdir()):
            meta = json.loads((folder / "meta.json").read_text())
            if meta["project"] == self.name and meta["service"] in wanted:
                found.append((meta["service"], folder))
        width = max(len(f"{s}-1") for s, _ in found) + 1
        for service, folder in found:
            with open(folder / "log.jsonl") as f:
                for row in f:
                    entry = json.loads(row)
                    text = entry["log"][:-1] if entry["log"].endswith("\n") else entry["log"]
                    line = f"{service + '-1':<{width}} | {text}\n"
                    (out if entry["stream"] == "stdout" else err)(line)
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="docker compose")
    parser.add_argument("-f", "--file", default="docker-compose.yml")
    parser.add_argument("-p", "--project-name")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--abort-on-container-exit", action="store_true")
    logs = sub.add_parser("logs")
    logs.add_argument("--no-color", action="store_true")
    logs.add_argument("services", nargs="*")
    args = parser.parse_args()
    path = Path(args.file).absolute()
    project = load(path)
    compose = Compose(path, project, project_name(path, project, args.project_name))
    if args.command == "logs":
        return compose.logs(args.services)
    return compose.up(args.abort_on_container_exit)


if __name__ == "__main__":
    sys.exit(main())
