"""Cross-rank consistency (CHK2xx): facts gathered from every rank, compared where they must
agree (software versions, NCCL environment, GPUs per node, GPU assignment, clocks). Pure
functions over fact dicts; no torch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ddpdoctor.preflight.checks import Check, CheckOptions, Issue, dig
from ddpdoctor.preflight.facts import Facts

# Env vars that are per-rank or per-node by design and may differ.
ENV_MAY_DIFFER = frozenset({"NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"})
ENV_MUST_MATCH_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")


def _check(code: str, title: str, severity: str, explanation: str, *fix: str) -> Check:
    return Check(code, title, severity, "cross-rank", explanation, tuple(fix))


TORCH_VERSION = _check(
    "CHK201",
    "torch version or CUDA build differs across ranks",
    "error",
    "Ranks with different torch builds disagree on collective implementations and pickled "
    "objects; mixed CUDA builds also pull different NCCL versions. Jobs hang or crash at the "
    "first collective.",
    "Install the same torch wheel (same +cuXYZ suffix) on every node, e.g. from one image",
)
NCCL_VERSION = _check(
    "CHK202",
    "NCCL version differs across ranks",
    "error",
    "NCCL's wire protocol is only guaranteed between identical versions; a mismatch hangs or "
    "fails in bootstrap ('NCCL version mismatch' or 'unhandled system error').",
    "Use the same torch/nvidia-nccl wheel everywhere; remove system libnccl from "
    "LD_LIBRARY_PATH/LD_PRELOAD on the odd nodes",
)
DRIVER_VERSION = _check(
    "CHK203",
    "NVIDIA driver differs across nodes",
    "warning",
    "Different drivers support different CUDA versions and NVLink/IB features; a node with an "
    "older driver is the usual suspect when only some nodes fail.",
    "Bring every node to the same driver version",
)
NCCL_ENV = _check(
    "CHK204",
    "NCCL/torch distributed environment differs across ranks",
    "error",
    "Variables such as NCCL_IB_DISABLE, NCCL_P2P_DISABLE, NCCL_PROTO, NCCL_ALGO or "
    "TORCH_NCCL_* change which transport or algorithm a rank uses; ranks that disagree "
    "cannot connect or wait for each other forever.",
    "Export the same NCCL_*/TORCH_NCCL_* settings on every node (set them in the launcher, "
    "not in per-node shell profiles)",
)
VISIBLE_GPUS = _check(
    "CHK205",
    "visible GPUs differ across nodes",
    "warning",
    "Nodes expose different numbers or models of GPUs; with one rank per GPU the job "
    "either indexes past the last GPU or runs at the speed of the slowest model.",
    "Use identical nodes, or set --nproc-per-node and CUDA_VISIBLE_DEVICES per node type",
)
DUPLICATE_GPU = _check(
    "CHK206",
    "two ranks use the same GPU",
    "error",
    "Several ranks on one node selected the same GPU (no torch.cuda.set_device(local_rank), "
    "or CUDA_VISIBLE_DEVICES hides the others). NCCL aborts with 'Duplicate GPU detected', "
    "or the ranks run out of memory.",
    "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group",
    "Do not set CUDA_VISIBLE_DEVICES to one GPU for every rank of a node",
)
CLOCK_SKEW = _check(
    "CHK207",
    "clocks differ across nodes",
    "warning",
    "Measured right after a barrier, the wall clocks of some nodes disagree. Logs then order "
    "events wrongly across nodes, which misleads any post-mortem (including ddpdoctor's).",
    "Run chrony or ntpd on every node",
)
PYTHON_VERSION = _check(
    "CHK208",
    "Python version differs across ranks",
    "warning",
    "Objects sent with all_gather_object/broadcast_object_list are pickled; different Python "
    "versions can fail to read each other's pickles and usually mean different environments.",
    "Use the same environment (image, venv) on every node",
)
CROSS_RANK_CHECKS: tuple[Check, ...] = (
    TORCH_VERSION,
    NCCL_VERSION,
    DRIVER_VERSION,
    NCCL_ENV,
    VISIBLE_GPUS,
    DUPLICATE_GPU,
    CLOCK_SKEW,
    PYTHON_VERSION,
)


def rank_of(facts: Facts, index: int) -> int:
    r = dig(facts, "rank.rank")
    return r if isinstance(r, int) else index


def format_ranks(ranks: list[int]) -> str:
    """[0,1,2,3,8] -> "0-3,8"."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def _groups(
    facts_list: list[Facts], key: Callable[[Facts], Any]
) -> dict[str, tuple[list[int], set[str]]]:
    groups: dict[str, tuple[list[int], set[str]]] = {}
    for i, f in enumerate(facts_list):
        value = key(f)
        if value is None:
            continue
        ranks, hosts = groups.setdefault(str(value), ([], set()))
        ranks.append(rank_of(f, i))
        if f.get("host"):
            hosts.add(str(f["host"]))
    return groups


def _differs(
    check: Check, what: str, facts_list: list[Facts], key: Callable[[Facts], Any]
) -> list[Issue]:
    groups = _groups(facts_list, key)
    if len(groups) < 2:
        return []
    # the minority groups are the odd ones out
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1][0]), kv[0]))
    parts = [
        f"{value} on rank {format_ranks(ranks)} ({', '.join(sorted(hosts))})"
        for value, (ranks, hosts) in ordered
    ]
    # with a tie for the majority nobody is the odd one out: every rank is named
    tie = len(ordered[0][1][0]) == len(ordered[1][1][0])
    odd = ordered if tie else ordered[1:]
    odd_ranks = sorted(r for _, (rs, _) in odd for r in rs)
    odd_hosts = sorted({h for _, (_, hs) in odd for h in hs})
    return [
        Issue(
            code=check.code,
            title=check.title,
            severity=check.severity,
            scope=check.scope,
            message=f"{what}: " + "; ".join(parts),
            explanation=check.explanation,
            fix=list(check.fix),
            ranks=odd_ranks,
            hosts=odd_hosts,
            evidence={"values": {v: {"ranks": rs, "hosts": sorted(hs)} for v, (rs, hs) in ordered}},
        )
    ]


def _must_match_env(f: Facts) -> dict[str, str]:
    env = f.get("env") or {}
    return {
        k: v
        for k, v in env.items()
        if k.startswith(ENV_MUST_MATCH_PREFIXES) and k not in ENV_MAY_DIFFER
    }


def _env_issues(facts_list: list[Facts]) -> list[Issue]:
    keys = sorted({k for f in facts_list for k in _must_match_env(f)})
    issues: list[Issue] = []
    for k in keys:

        def value(f: Facts, k: str = k) -> str:
            return _must_match_env(f).get(k, "<unset>")

        issues += _differs(NCCL_ENV, k, facts_list, value)
    return issues


def _per_host(facts_list: list[Facts]) -> list[Facts]:
    """One fact set per host (the lowest rank's), for node-level facts."""
    seen: dict[str, Facts] = {}
    for _i, f in sorted(enumerate(facts_list), key=lambda t: rank_of(t[1], t[0])):
        seen.setdefault(str(f.get("host")), f)
    return list(seen.values())


def _visible_gpus(f: Facts) -> str | None:
    count = dig(f, "torch.device_count")
    if not dig(f, "torch.cuda_available"):
        return None
    names = sorted({g.get("name", "?") for g in dig(f, "nvml.gpus") or []})
    return f"{count} GPU(s)" + (f" {'/'.join(names)}" if names else "")


def _duplicate_gpus(facts_list: list[Facts]) -> list[Issue]:
    users: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, f in enumerate(facts_list):
        dev = f.get("device")
        if not isinstance(dev, dict):
            continue
        ident = dev.get("uuid") or dev.get("pci_bus_id") or f"cuda:{dev.get('local_index')}"
        users[(str(f.get("host")), str(ident))].append(rank_of(f, i))
    issues = []
    for (host, ident), ranks in sorted(users.items()):
        if len(ranks) > 1:
            issues.append(
                Issue(
                    code=DUPLICATE_GPU.code,
                    title=DUPLICATE_GPU.title,
                    severity=DUPLICATE_GPU.severity,
                    scope=DUPLICATE_GPU.scope,
                    message=f"ranks {format_ranks(ranks)} on {host} all use GPU {ident}",
                    explanation=DUPLICATE_GPU.explanation,
                    fix=list(DUPLICATE_GPU.fix),
                    ranks=sorted(ranks),
                    hosts=[host],
                    evidence={"gpu": ident, "host": host},
                )
            )
    return issues


def _clock_skew(facts_list: list[Facts], max_s: float) -> list[Issue]:
    ref = None
    for i, f in enumerate(facts_list):
        if rank_of(f, i) == 0:
            ref = f
    if ref is None or not isinstance(ref.get("time_unix"), int | float):
        return []
    offsets: dict[str, float] = {}
    ranks: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(facts_list):
        t = f.get("time_unix")
        if not isinstance(t, int | float) or f.get("host") == ref.get("host"):
            continue
        host = str(f.get("host"))
        off = float(t) - float(ref["time_unix"])
        if abs(off) > abs(offsets.get(host, 0.0)):
            offsets[host] = off
        ranks[host].append(rank_of(f, i))
    bad = {h: o for h, o in offsets.items() if abs(o) > max_s}
    if not bad:
        return []
    text = "; ".join(f"{h} {o:+.1f} s" for h, o in sorted(bad.items()))
    return [
        Issue(
            code=CLOCK_SKEW.code,
            title=CLOCK_SKEW.title,
            severity=CLOCK_SKEW.severity,
            scope=CLOCK_SKEW.scope,
            message=f"clock offset from rank 0 ({ref.get('host')}) over {max_s:g} s: {text}",
            explanation=CLOCK_SKEW.explanation,
            fix=list(CLOCK_SKEW.fix),
            ranks=sorted(r for h in bad for r in ranks[h]),
            hosts=sorted(bad),
            evidence={"offsets_s": {h: round(o, 3) for h, o in sorted(bad.items())}},
        )
    ]


def compare_ranks(facts_list: list[Facts], options: CheckOptions) -> list[Issue]:
    """Every cross-rank finding for the fact sets gathered from one job's ranks."""
    if len(facts_list) < 2:
        return []
    hosts = _per_host(facts_list)
    issues: list[Issue] = []
    issues += _differs(
        TORCH_VERSION,
        "torch",
        facts_list,
        lambda f: (
            None
            if not dig(f, "torch.version")
            else f"{dig(f, 'torch.version')} (CUDA {dig(f, 'torch.cuda') or 'none'})"
        ),
    )
    issues += _differs(NCCL_VERSION, "NCCL", facts_list, lambda f: dig(f, "torch.nccl"))
    issues += _differs(DRIVER_VERSION, "driver", hosts, lambda f: dig(f, "nvml.driver"))
    issues += _env_issues(facts_list)
    issues += _differs(VISIBLE_GPUS, "visible GPUs", hosts, _visible_gpus)
    issues += _duplicate_gpus(facts_list)
    issues += _clock_skew(facts_list, options.clock_skew_max_s)
    issues += _differs(PYTHON_VERSION, "Python", facts_list, lambda f: dig(f, "python.version"))
    return issues
