"""Facts about one node (or one rank): plain JSON-able dicts. Every collector returns None when
its fact does not apply here (no GPU, no torch, no IB); none of them raises. torch and pynvml are
imported lazily, so core ddpdoctor works without them. No judgement here: that is checks.py."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

Facts = dict[str, Any]

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "MASTER_", "OMP_", "UCX_", "FI_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "LD_PRELOAD")
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
IB_ROOT = Path("/sys/class/infiniband")


def _safe(fn: Callable[[], Any]) -> Any:
    """A fact that cannot be read is "not applicable" (None), never an error."""
    try:
        return fn()
    except Exception:
        return None


def collect_facts(
    *,
    with_torch: bool = True,
    workdir: str | os.PathLike[str] = ".",
    env: dict[str, str] | None = None,
    topo: bool = True,
) -> Facts:
    """Everything `check` knows about this process's node. `with_torch=False` skips the torch
    import (about 1.4 s); `workdir` is where the job writes (for free disk space)."""
    environ = dict(os.environ if env is None else env)
    now = time.time()
    facts: Facts = {
        "host": socket.gethostname(),
        "time_unix": now,
        "time": datetime.fromtimestamp(now, UTC).isoformat(),
        "rank": _safe(lambda: rank_facts(environ)),
        "os": _safe(os_facts),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "torch": _safe(torch_facts) if with_torch else None,
        "packages": _safe(package_facts),
        "nvml": _safe(nvml_facts),
        "visibility": {
            "CUDA_VISIBLE_DEVICES": environ.get("CUDA_VISIBLE_DEVICES"),
            "CUDA_DEVICE_ORDER": environ.get("CUDA_DEVICE_ORDER"),
        },
        "env": env_facts(environ),
        "shm": _safe(lambda: disk_facts("/dev/shm")),
        "ulimits": _safe(ulimit_facts),
        "cpu": _safe(cpu_facts),
        "memory": _safe(memory_facts),
        "disk": _safe(lambda: disk_facts(os.path.abspath(workdir))),
        "net": _safe(net_facts),
        "ib": _safe(ib_facts),
        "nvidia_topo": _safe(nvidia_topo) if topo else None,
        "device": None,
    }
    facts["socket_ifname"] = socket_ifname_facts(environ, facts["net"])
    return facts


def rank_facts(env: dict[str, str]) -> dict[str, int] | None:
    if "RANK" not in env:
        return None
    out: dict[str, int] = {}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        if env.get(key, "").isdigit():
            out[key.lower()] = int(env[key])
    return out


def os_facts() -> dict[str, Any]:
    distro = None
    with contextlib.suppress(OSError):
        distro = platform.freedesktop_os_release().get("PRETTY_NAME")
    return {
        "system": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "distro": distro,
    }


def torch_facts() -> dict[str, Any] | None:
    """torch's build and runtime versions; None when torch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # lazy: about 1.4 s, and absent on log-only installs

    out: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": None,
        "nccl": None,
        "cuda_available": False,
        "device_count": 0,
        "distributed": torch.distributed.is_available(),
        "gloo": False,
        "nccl_available": False,
    }
    if out["distributed"]:
        out["gloo"] = bool(_safe(torch.distributed.is_gloo_available))
        out["nccl_available"] = bool(_safe(torch.distributed.is_nccl_available))
    out["cudnn"] = _safe(torch.backends.cudnn.version)
    if torch.version.cuda is not None and out["nccl_available"]:
        nccl = _safe(torch.cuda.nccl.version)
        if isinstance(nccl, tuple):
            out["nccl"] = ".".join(str(x) for x in nccl)
    out["cuda_available"] = bool(_safe(torch.cuda.is_available))
    if out["cuda_available"]:
        out["device_count"] = int(torch.cuda.device_count())
    return out


_PKG_PATTERNS = {
    "nccl": re.compile(r"^nvidia-nccl-cu\d+$"),
    "cudnn": re.compile(r"^nvidia-cudnn-cu\d+$"),
    "cuda_runtime": re.compile(r"^nvidia-cuda-runtime-cu\d+$"),
}


def package_facts() -> dict[str, str | None]:
    """Versions of the pip wheels that ship NCCL/cuDNN/CUDA next to torch: a loaded library of
    another version means LD_LIBRARY_PATH or LD_PRELOAD picked a system copy."""
    out: dict[str, str | None] = {"torch": None, "nvidia-ml-py": None}
    out.update(dict.fromkeys(_PKG_PATTERNS))
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in out:
            out[name] = dist.version
        for key, pattern in _PKG_PATTERNS.items():
            if pattern.match(name):
                out[key] = dist.version
    return out


def nvml_facts() -> dict[str, Any] | None:
    """Driver and GPUs through nvidia-ml-py (pynvml); None when absent or without a driver."""
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    pynvml.nvmlInit()
    try:
        cuda_v = int(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                }
            )
        return {
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda_v // 1000}.{(cuda_v % 1000) // 10}",
            "gpus": gpus,
        }
    finally:
        pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def env_facts(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES or k.startswith("TORCHELASTIC_")
    }


def disk_facts(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    usage = shutil.disk_usage(path)
    return {"path": path, "total_bytes": usage.total, "free_bytes": usage.free}


def _limit(value: int) -> int | str:
    return "unlimited" if value == resource.RLIM_INFINITY else value


def ulimit_facts() -> dict[str, int | str]:
    """Soft and hard limits; memlock in bytes, "unlimited" as the string."""
    ms, mh = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    ns, nh = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "memlock_soft": _limit(ms),
        "memlock_hard": _limit(mh),
        "nofile_soft": _limit(ns),
        "nofile_hard": _limit(nh),
    }


def cpu_facts() -> dict[str, Any]:
    import psutil

    sockets: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("physical id"):
                sockets.add(line.split(":", 1)[1].strip())
    affinity = _safe(lambda: len(os.sched_getaffinity(0)))
    return {
        "physical_cpus": len(sockets) or None,
        "cores": psutil.cpu_count(logical=False),
        "logical_cpus": psutil.cpu_count(logical=True),
        "usable_cpus": affinity,
    }


def memory_facts() -> dict[str, int]:
    import psutil

    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


def net_facts() -> dict[str, Any]:
    import psutil

    stats = psutil.net_if_stats()
    addrs = psutil.net_if_addrs()
    ifaces = []
    for name in sorted(set(stats) | set(addrs)):
        st = stats.get(name)
        ips = [
            a.address for a in addrs.get(name, []) if a.family in (socket.AF_INET, socket.AF_INET6)
        ]
        ifaces.append(
            {
                "name": name,
                "up": bool(st.isup) if st else False,
                "loopback": "loopback" in (st.flags if st else "") or name == "lo",
                "addresses": ips,
                "mtu": st.mtu if st else None,
                "speed_mbps": (st.speed or None) if st else None,
            }
        )
    return {"interfaces": ifaces}


def ib_facts(root: Path = IB_ROOT) -> dict[str, Any] | None:
    """IB/RoCE HCAs from sysfs; None when the node has none."""
    if not root.is_dir():
        return None
    devices = []
    for dev in sorted(root.iterdir()):
        ports = []
        for port in sorted((dev / "ports").glob("*")):
            ports.append(
                {
                    "port": port.name,
                    "state": _read(port / "state"),
                    "rate": _read(port / "rate"),
                    "link_layer": _read(port / "link_layer"),
                }
            )
        devices.append({"name": dev.name, "ports": ports})
    return {"devices": devices} if devices else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def nvidia_topo() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    proc = subprocess.run(
        [exe, "topo", "-m"], capture_output=True, text=True, timeout=15, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


# --- socket interface names -------------------------------------------------------------------


def nccl_ifname_matches(spec: str, names: Iterable[str]) -> list[str]:
    """The interfaces NCCL would consider for NCCL_SOCKET_IFNAME=spec: a comma list of prefixes;
    a leading `^` excludes the listed ones; a leading `=` (after `^`) asks for exact names.
    (NCCL src/misc/utils.cc parseStringList / matchIfList.)"""
    names = list(names)
    s = spec.strip()
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    items = [p.strip() for p in s.split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in items)

    return [n for n in names if hit(n) != exclude]


def gloo_ifname_matches(spec: str, names: Iterable[str]) -> list[str]:
    """GLOO_SOCKET_IFNAME: a comma list of exact names, one gloo device each
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp). No prefixes, no exclusion."""
    wanted = [p.strip() for p in spec.split(",") if p.strip()]
    present = set(names)
    return [w for w in wanted if w in present]


def socket_ifname_facts(env: dict[str, str], net: dict[str, Any] | None) -> dict[str, Any]:
    """For each of NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME that is set: which interfaces it
    names, and which of those are up with an address."""
    out: dict[str, Any] = {}
    if net is None:
        return out
    ifaces = {i["name"]: i for i in net["interfaces"]}
    for var in SOCKET_IFNAME_VARS:
        spec = env.get(var)
        if spec is None:
            continue
        if var == "NCCL_SOCKET_IFNAME":
            matched = nccl_ifname_matches(spec, ifaces)
            missing: list[str] = []
        else:
            matched = gloo_ifname_matches(spec, ifaces)
            missing = [p.strip() for p in spec.split(",") if p.strip() and p.strip() not in ifaces]
        usable = [n for n in matched if ifaces[n]["up"] and ifaces[n]["addresses"]]
        out[var] = {"value": spec, "matches": matched, "usable": usable, "missing": missing}
    return out


def candidate_interfaces(facts: Facts, *, single_node: bool) -> list[str]:
    """Interfaces worth naming in NCCL/GLOO_SOCKET_IFNAME: up, with an address. On one node
    `lo` comes first (it always works there); across nodes loopback is useless."""
    net = facts.get("net") or {}
    out = [
        i["name"]
        for i in net.get("interfaces", [])
        if i["up"] and i["addresses"] and (single_node or not i["loopback"])
    ]
    return sorted(out, key=lambda n: (not (n == "lo" and single_node), n))
