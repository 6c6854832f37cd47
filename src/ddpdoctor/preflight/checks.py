"""Checks over one node's facts, in the shape of rules: a stable code (CHK1xx node, CHK2xx across
ranks, CHK3xx collective test), title, explanation, fix, and a detector that returns findings as
values. Codes are never reused. Knows nothing about torchrun or rendering."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.preflight.facts import Facts

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class CheckOptions:
    num_workers: int | None = None
    """DataLoader workers per rank the job uses; None means unknown (assume some)."""
    nproc_per_node: int | None = None
    shm_min_bytes: int = 1 * GiB
    disk_min_bytes: int = 1 * GiB
    nofile_min: int = 4096
    clock_skew_max_s: float = 2.0


@dataclass
class Issue:
    code: str
    title: str
    severity: str  # error | warning
    scope: str  # node | cross-rank | collective
    message: str
    explanation: str
    fix: list[str]
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "title": self.title,
            "severity": self.severity,
            "scope": self.scope,
            "message": self.message,
            "explanation": self.explanation,
            "fix": list(self.fix),
            "ranks": sorted(self.ranks),
            "hosts": sorted(self.hosts),
            "evidence": self.evidence,
        }


Found = tuple[str, dict[str, Any]]
"""A detector's hit: the specific message and the facts that prove it."""
Detector = Callable[[Facts, CheckOptions], list[Found]]


@dataclass(frozen=True)
class Check:
    code: str
    title: str
    severity: str
    scope: str
    explanation: str
    fix: tuple[str, ...]
    detect: Detector | None = None

    def issue(self, message: str, evidence: dict[str, Any], facts: Facts | None = None) -> Issue:
        rank = ((facts or {}).get("rank") or {}).get("rank")
        host = (facts or {}).get("host")
        return Issue(
            code=self.code,
            title=self.title,
            severity=self.severity,
            scope=self.scope,
            message=message,
            explanation=self.explanation,
            fix=list(self.fix),
            ranks=[rank] if isinstance(rank, int) else [],
            hosts=[host] if host else [],
            evidence=evidence,
        )


def dig(facts: Facts, path: str) -> Any:
    """facts["a"]["b"] for "a.b", None where any step is missing (not applicable)."""
    cur: Any = facts
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def human_bytes(n: int | float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{int(n)} B"


def version_tuple(v: str | None, parts: int = 2) -> tuple[int, ...] | None:
    if not v:
        return None
    nums: list[int] = []
    for piece in str(v).split("+")[0].split(".")[:parts]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        nums.append(int(digits))
    return tuple(nums)


def cudnn_version(v: Any) -> str | None:
    """torch.backends.cudnn.version(): 90100 -> "9.1.0" (cuDNN 9), 8902 -> "8.9.2" (cuDNN 8)."""
    if not isinstance(v, int) or v <= 0:
        return None
    if v >= 90000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"


# --- detectors ---------------------------------------------------------------------------------


def _small_shm(f: Facts, o: CheckOptions) -> list[Found]:
    total = dig(f, "shm.total_bytes")
    if total is None or o.num_workers == 0 or total >= o.shm_min_bytes:
        return []
    workers = "" if o.num_workers is None else f" with {o.num_workers} DataLoader workers per rank"
    return [
        (
            f"/dev/shm is {human_bytes(total)} (under {human_bytes(o.shm_min_bytes)}){workers}",
            {"shm_total_bytes": total, "num_workers": o.num_workers},
        )
    ]


def _memlock_ib(f: Facts, o: CheckOptions) -> list[Found]:
    devices = dig(f, "ib.devices")
    soft = dig(f, "ulimits.memlock_soft")
    if not devices or soft is None or soft == "unlimited":
        return []
    names = ", ".join(d["name"] for d in devices)
    return [
        (
            f"memlock limit is {human_bytes(soft)} while IB devices are present ({names})",
            {"memlock_soft": soft, "ib_devices": [d["name"] for d in devices]},
        )
    ]


def _ifname_missing(f: Facts, o: CheckOptions) -> list[Found]:
    out: list[Found] = []
    names = [i["name"] for i in dig(f, "net.interfaces") or []]
    for var, info in sorted((f.get("socket_ifname") or {}).items()):
        if not info["matches"]:
            out.append(
                (
                    f"{var}={info['value']} matches no interface here (have: {', '.join(names)})",
                    {"var": var, "value": info["value"], "interfaces": names},
                )
            )
        elif info.get("missing"):
            out.append(
                (
                    f"{var}={info['value']} names {', '.join(info['missing'])}, which does not "
                    f"exist here (have: {', '.join(names)})",
                    {"var": var, "value": info["value"], "missing": info["missing"]},
                )
            )
    return out


def _ifname_unusable(f: Facts, o: CheckOptions) -> list[Found]:
    out: list[Found] = []
    for var, info in sorted((f.get("socket_ifname") or {}).items()):
        bad = [n for n in info["matches"] if n not in info["usable"]]
        if info["matches"] and bad:
            out.append(
                (
                    f"{var}={info['value']} selects {', '.join(bad)}, down or without an address",
                    {"var": var, "value": info["value"], "unusable": bad},
                )
            )
    return out


def _cvd_order(f: Facts, o: CheckOptions) -> list[Found]:
    cvd = dig(f, "visibility.CUDA_VISIBLE_DEVICES")
    order = dig(f, "visibility.CUDA_DEVICE_ORDER")
    if not cvd or order == "PCI_BUS_ID":
        return []
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if not entries or not all(e.lstrip("-").isdigit() for e in entries):
        return []  # UUIDs or MIG names do not depend on the enumeration order
    gpus = dig(f, "nvml.gpus")
    if isinstance(gpus, list) and len(gpus) <= 1:
        return []
    return [
        (
            f"CUDA_VISIBLE_DEVICES={cvd} uses indices but CUDA_DEVICE_ORDER is "
            f"{order or 'unset (FASTEST_FIRST)'}",
            {"CUDA_VISIBLE_DEVICES": cvd, "CUDA_DEVICE_ORDER": order},
        )
    ]


def _cvd_missing(f: Facts, o: CheckOptions) -> list[Found]:
    cvd = dig(f, "visibility.CUDA_VISIBLE_DEVICES")
    gpus = dig(f, "nvml.gpus")
    if not cvd or not isinstance(gpus, list) or not gpus:
        return []
    uuids = {g.get("uuid") for g in gpus}
    bad = []
    for e in (x.strip() for x in cvd.split(",") if x.strip()):
        if e.isdigit():
            if int(e) >= len(gpus):
                bad.append(e)
        elif e.startswith("GPU-") and not any(u and u.startswith(e) for u in uuids):
            bad.append(e)
    if not bad:
        return []
    return [
        (
            f"CUDA_VISIBLE_DEVICES={cvd} names {', '.join(bad)}, not among the "
            f"{len(gpus)} GPUs of this node",
            {"CUDA_VISIBLE_DEVICES": cvd, "gpu_count": len(gpus), "unknown": bad},
        )
    ]


def _cuda_driver(f: Facts, o: CheckOptions) -> list[Found]:
    built = version_tuple(dig(f, "torch.cuda"))
    driver = version_tuple(dig(f, "nvml.cuda_driver"))
    if built is None or driver is None or built <= driver:
        return []
    same_major = built[0] == driver[0]
    how = (
        "runs only through minor-version compatibility (PTX JIT and newer features fail)"
        if same_major
        else "cannot run: the driver is a major version behind"
    )
    return [
        (
            f"torch is built for CUDA {dig(f, 'torch.cuda')} but driver "
            f"{dig(f, 'nvml.driver')} supports up to CUDA {dig(f, 'nvml.cuda_driver')}: {how}",
            {
                "torch_cuda": dig(f, "torch.cuda"),
                "driver": dig(f, "nvml.driver"),
                "driver_cuda": dig(f, "nvml.cuda_driver"),
                "same_major": same_major,
            },
        )
    ]


def _nccl_wheel(f: Facts, o: CheckOptions) -> list[Found]:
    loaded = dig(f, "torch.nccl")
    wheel = dig(f, "packages.nccl")
    if not loaded or not wheel or version_tuple(loaded, 3) == version_tuple(wheel, 3):
        return []
    return [
        (
            f"torch loaded NCCL {loaded} but the installed nvidia-nccl wheel is {wheel}",
            {"loaded": loaded, "wheel": wheel, "LD_PRELOAD": dig(f, "env.LD_PRELOAD")},
        )
    ]


def _cudnn_wheel(f: Facts, o: CheckOptions) -> list[Found]:
    loaded = cudnn_version(dig(f, "torch.cudnn"))
    wheel = dig(f, "packages.cudnn")
    if not loaded or not wheel or version_tuple(loaded) == version_tuple(wheel):
        return []
    return [
        (
            f"torch loaded cuDNN {loaded} but the installed nvidia-cudnn wheel is {wheel}",
            {"loaded": loaded, "wheel": wheel},
        )
    ]


def _gpus_unusable(f: Facts, o: CheckOptions) -> list[Found]:
    gpus = dig(f, "nvml.gpus")
    t = f.get("torch")
    if not gpus or not isinstance(t, dict) or t.get("cuda_available"):
        return []
    why = (
        "torch is a CPU-only build"
        if not t.get("cuda")
        else "torch has CUDA but torch.cuda.is_available() is False"
    )
    return [
        (
            f"{len(gpus)} GPU(s) on this node but {why}",
            {"gpus": len(gpus), "torch": t.get("version"), "torch_cuda": t.get("cuda")},
        )
    ]


def _too_few_gpus(f: Facts, o: CheckOptions) -> list[Found]:
    per_node = dig(f, "rank.local_world_size") or o.nproc_per_node
    visible = dig(f, "torch.device_count")
    if not per_node or not dig(f, "torch.cuda_available") or visible is None:
        return []
    if visible >= per_node:
        return []
    return [
        (
            f"{per_node} ranks per node but only {visible} GPU(s) visible: ranks would share "
            "or index past the last GPU",
            {"ranks_per_node": per_node, "visible_gpus": visible},
        )
    ]


def _nofile(f: Facts, o: CheckOptions) -> list[Found]:
    soft = dig(f, "ulimits.nofile_soft")
    if not isinstance(soft, int) or soft >= o.nofile_min:
        return []
    return [(f"open files limit (nofile) is {soft}", {"nofile_soft": soft})]


def _disk(f: Facts, o: CheckOptions) -> list[Found]:
    free = dig(f, "disk.free_bytes")
    if free is None or free >= o.disk_min_bytes:
        return []
    return [
        (
            f"{human_bytes(free)} free at {dig(f, 'disk.path')}, where the job writes",
            {"path": dig(f, "disk.path"), "free_bytes": free},
        )
    ]


NODE_CHECKS: tuple[Check, ...] = (
    Check(
        "CHK101",
        "/dev/shm too small for DataLoader workers",
        "error",
        "node",
        "DataLoader workers hand every batch to the main process through shared memory in "
        "/dev/shm. Containers default to 64 MiB, which ends in `Bus error`, `DataLoader worker "
        "... is killed` or `No space left on device (28)` as soon as batches are large.",
        (
            "Give the container more shared memory: `docker run --shm-size=16g` or "
            "`--ipc=host`; on Kubernetes mount an `emptyDir: {medium: Memory}` at /dev/shm",
            "Or run with `num_workers=0` (slower input pipeline)",
        ),
        _small_shm,
    ),
    Check(
        "CHK102",
        "memlock limit too low for InfiniBand",
        "error",
        "node",
        "RDMA registers (pins) memory; NCCL's IB transport needs an unlimited locked-memory "
        "limit. With a small one NCCL fails in ibv_reg_mr / 'Cannot allocate memory', or falls "
        "back to sockets and runs many times slower.",
        (
            "Raise it: `ulimit -l unlimited` in the job, `LimitMEMLOCK=infinity` for systemd, "
            "`--ulimit memlock=-1` for docker, `PropagateResourceLimitsExcept=MEMLOCK` for Slurm",
        ),
        _memlock_ib,
    ),
    Check(
        "CHK103",
        "socket interface does not exist",
        "error",
        "node",
        "NCCL_SOCKET_IFNAME (prefixes, `^` to exclude, `=` for exact names) and "
        "GLOO_SOCKET_IFNAME (exact names) must name interfaces of this node. NCCL then fails "
        "with 'no socket interface found' or 'neither AF_INET...', gloo with 'Unable to find "
        "address for: <if>'.",
        (
            "Set the variable to an interface that exists on every node (`ip -br addr`), or "
            "unset it; the bisection below shows which one works",
        ),
        _ifname_missing,
    ),
    Check(
        "CHK104",
        "socket interface is down or has no address",
        "error",
        "node",
        "The interface named by NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME exists but cannot carry "
        "traffic: it is down or has no IP address, so bootstrap connections fail or hang.",
        ("Name an interface that is up and has the address other nodes reach",),
        _ifname_unusable,
    ),
    Check(
        "CHK105",
        "CUDA_VISIBLE_DEVICES without CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "warning",
        "node",
        "CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, while "
        "nvidia-smi, NVML and schedulers number them by PCI bus id. On mixed or reordered "
        "nodes the index in CUDA_VISIBLE_DEVICES then selects another GPU than intended, and "
        "two jobs can land on the same GPU.",
        (
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID wherever CUDA_VISIBLE_DEVICES is set",
            "Or list GPUs by UUID (`nvidia-smi -L`) in CUDA_VISIBLE_DEVICES",
        ),
        _cvd_order,
    ),
    Check(
        "CHK106",
        "CUDA_VISIBLE_DEVICES names GPUs that do not exist",
        "error",
        "node",
        "An entry past the last GPU (or an unknown UUID) makes CUDA hide every GPU after it, "
        "so ranks see fewer devices than they expect: 'invalid device ordinal'.",
        ("Fix CUDA_VISIBLE_DEVICES to the GPUs of this node (`nvidia-smi -L`)",),
        _cvd_missing,
    ),
    Check(
        "CHK107",
        "torch's CUDA is newer than the driver",
        "error",
        "node",
        "Every CUDA runtime needs a driver at least as new. Within a major version minor-"
        "version compatibility lets most kernels run, but PTX JIT and new features fail; "
        "across major versions nothing runs ('CUDA driver version is insufficient').",
        (
            "Upgrade the NVIDIA driver, or install the torch wheel built for the driver's CUDA "
            "(e.g. `--index-url https://download.pytorch.org/whl/cu121`)",
        ),
        _cuda_driver,
    ),
    Check(
        "CHK108",
        "loaded NCCL differs from the installed NCCL wheel",
        "warning",
        "node",
        "torch loads libnccl from the nvidia-nccl wheel unless LD_LIBRARY_PATH or LD_PRELOAD "
        "points at another copy. A different NCCL than the one torch was tested with is a "
        "classic source of hangs and version skew across nodes.",
        (
            "Remove the system NCCL from LD_LIBRARY_PATH/LD_PRELOAD, or pin the same version "
            "everywhere",
        ),
        _nccl_wheel,
    ),
    Check(
        "CHK109",
        "loaded cuDNN differs from the installed cuDNN wheel",
        "warning",
        "node",
        "A system cuDNN found first on the library path shadows the one torch was built with; "
        "mismatches give 'cuDNN version incompatibility' or CUDNN_STATUS_* errors.",
        ("Remove the system cuDNN from LD_LIBRARY_PATH, or reinstall torch",),
        _cudnn_wheel,
    ),
    Check(
        "CHK110",
        "GPUs present but torch cannot use CUDA",
        "error",
        "node",
        "NVML sees GPUs, but torch reports no CUDA: a CPU-only wheel, a driver/runtime "
        "mismatch, or CUDA_VISIBLE_DEVICES hiding every GPU. The job would fall back to gloo "
        "on CPU or fail in torch.cuda.set_device.",
        (
            "Install a CUDA build of torch, and check `python -c 'import torch; "
            "print(torch.cuda.is_available())'`",
        ),
        _gpus_unusable,
    ),
    Check(
        "CHK111",
        "fewer visible GPUs than ranks per node",
        "error",
        "node",
        "With one rank per GPU, LOCAL_RANK must index a visible GPU. With fewer GPUs, "
        "torch.cuda.set_device(local_rank) fails ('invalid device ordinal') or ranks share "
        "a GPU, which NCCL rejects ('Duplicate GPU detected').",
        ("Launch with --nproc-per-node equal to the number of visible GPUs",),
        _too_few_gpus,
    ),
    Check(
        "CHK112",
        "open files limit is low",
        "warning",
        "node",
        "Each rank opens sockets to its peers and DataLoader workers share tensors through "
        "file descriptors; a low nofile limit ends in 'Too many open files'.",
        ("Raise it: `ulimit -n 65536` (or more) in the job's environment",),
        _nofile,
    ),
    Check(
        "CHK113",
        "little free disk where the job writes",
        "warning",
        "node",
        "Checkpoints and logs fail when the disk fills ('No space left on device'), often in "
        "one rank only, which then hangs the others.",
        ("Free space or point checkpoints at a larger volume",),
        _disk,
    ),
)


def run_node_checks(facts_list: Iterable[Facts], options: CheckOptions) -> list[Issue]:
    """Every node check over every fact set; the same finding on several ranks is one issue."""
    merged: dict[tuple[str, str], Issue] = {}
    for facts in facts_list:
        for check in NODE_CHECKS:
            if check.detect is None:
                continue
            for message, evidence in check.detect(facts, options):
                issue = check.issue(message, evidence, facts)
                key = (check.code, message)
                if key in merged:
                    prev = merged[key]
                    prev.ranks = sorted(set(prev.ranks) | set(issue.ranks))
                    prev.hosts = sorted(set(prev.hosts) | set(issue.hosts))
                else:
                    merged[key] = issue
    return sorted(merged.values(), key=lambda i: (i.code, i.message))
