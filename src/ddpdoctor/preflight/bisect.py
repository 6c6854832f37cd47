"""Transport bisection: when the collective test fails or hangs, rerun it under environment
variations that each switch off one transport or pin the socket interface, and report the
smallest change that works and what it means (the decision table lives here). Launching is
injected (a callable), so the logic is testable without torch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.preflight.collective import Attempt

MIN_ATTEMPT_S = 5.0
"""An attempt with less time left than this is skipped: it could not even start torch."""


@dataclass(frozen=True)
class Variation:
    env: dict[str, str]
    meaning: str
    """What it means when this variation works and the baseline does not."""
    fix: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env.items())


P2P = Variation(
    {"NCCL_P2P_DISABLE": "1"},
    "GPU peer-to-peer (NVLink / PCIe P2P) is what fails on this node.",
    (
        "Inspect `nvidia-smi topo -m` and `nvidia-smi nvlink -s` for missing or degraded links",
        "Disable PCIe ACS in the BIOS and check the IOMMU (`iommu=pt` / off); in VMs, P2P "
        "often needs host support",
        "Until fixed, run with NCCL_P2P_DISABLE=1 (slower)",
    ),
)
SHM = Variation(
    {"NCCL_SHM_DISABLE": "1"},
    "NCCL's shared-memory transport fails: /dev/shm is too small or not shared between the "
    "ranks' containers.",
    (
        "Give the containers a large shared /dev/shm (`--ipc=host` or `--shm-size=16g`)",
        "Until fixed, run with NCCL_SHM_DISABLE=1",
    ),
)
IB = Variation(
    {"NCCL_IB_DISABLE": "1"},
    "The InfiniBand / RoCE path fails while sockets work.",
    (
        "Check the IB NICs: `ibstat` ports Active, link layer and rate as expected",
        "Set `ulimit -l unlimited` (memlock) for the job",
        "Pin the right devices with NCCL_IB_HCA and the bootstrap interface with "
        "NCCL_SOCKET_IFNAME; look for GID index problems on RoCE (NCCL_IB_GID_INDEX)",
    ),
)
P2P_AND_IB = Variation(
    {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"},
    "Only disabling both GPU peer-to-peer and InfiniBand works: both paths are broken, or "
    "NCCL's topology detection is (a VM or container hiding the PCI topology).",
    (
        "Follow the P2P steps (`nvidia-smi topo -m`, ACS, IOMMU) and the IB steps (ibstat, "
        "memlock, NCCL_IB_HCA)",
        "Run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH to see what NCCL detects",
    ),
)
NOTHING_MEANING = (
    "No transport change fixes it: the fault is not in the transport. Look at the code and at "
    "every rank's log (`ddpdoctor diagnose`), and at the rendezvous (MASTER_ADDR, firewalls)."
)


def ifname_variation(backend: str, name: str) -> Variation:
    if backend == "nccl":
        var, value = "NCCL_SOCKET_IFNAME", f"={name}"
    else:
        var, value = "GLOO_SOCKET_IFNAME", name
    return Variation(
        {var: value},
        f"The socket interface is the problem: the one selected now does not work, {name} does.",
        (f"Set {var}={value} on every node (use the interface peers can reach)",),
    )


def plan(backend: str, interfaces: list[str]) -> tuple[list[Variation], list[Variation]]:
    """(single-variable variations in the order tried, the combined fallback ones)."""
    singles: list[Variation] = []
    if backend == "nccl":
        singles += [P2P, SHM, IB]
    singles += [ifname_variation(backend, n) for n in interfaces]
    combined = [P2P_AND_IB] if backend == "nccl" else []
    return singles, combined


@dataclass
class Bisection:
    attempts: list[Attempt] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    fix: Variation | None = None
    conclusion: str = ""
    stopped_early: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "attempts": [a.to_json() for a in self.attempts],
            "skipped": self.skipped,
            "fix": None
            if self.fix is None
            else {"env": self.fix.env, "meaning": self.fix.meaning, "steps": list(self.fix.fix)},
            "conclusion": self.conclusion,
        }


def bisect(
    launch: Callable[[dict[str, str], float], Attempt],
    backend: str,
    interfaces: list[str],
    deadline: float,
    *,
    attempt_timeout_s: float,
    stop_at_first: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Bisection:
    """Try each variation until one works (or all of them when stop_at_first is False); the
    combined ones only when no single change works. `launch(env, timeout_s)` runs one test."""
    out = Bisection()
    singles, combined = plan(backend, interfaces)
    working: list[Variation] = []

    def attempt(v: Variation) -> None:
        left = deadline - clock()
        if left < MIN_ATTEMPT_S:
            out.skipped.append({"env": v.label, "reason": "time budget of the check spent"})
            return
        a = launch(v.env, min(attempt_timeout_s, left))
        out.attempts.append(a)
        if a.ok:
            working.append(v)

    for v in singles:
        if working and stop_at_first:
            break
        attempt(v)
    if not working:
        for v in combined:
            attempt(v)
    if working:
        out.fix = working[0]
        others = [w.label for w in working[1:]]
        extra = f" (also works: {', '.join(others)})" if others else ""
        out.conclusion = f"{working[0].label} makes the test pass{extra}. {working[0].meaning}"
    elif out.skipped:
        out.conclusion = (
            f"Inconclusive: none of the {len(out.attempts)} variation(s) tried works and "
            f"{len(out.skipped)} could not run within the time budget; raise --timeout."
        )
    else:
        out.conclusion = NOTHING_MEANING
    return out
