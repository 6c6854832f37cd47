"""One `check` from start to end: local facts, node checks, the collective test (with the port
precheck), bisection when it fails, cross-rank comparison, and the `ddpdoctor.check/v1` result
dict. Also builds results from saved fact sets or a multi-node worker result. No rendering."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.preflight.bisect import Bisection, bisect
from ddpdoctor.preflight.checks import Check, CheckOptions, Issue, dig, run_node_checks
from ddpdoctor.preflight.collective import (
    Attempt,
    LaunchConfig,
    port_in_use,
    port_owner,
    run_attempt,
)
from ddpdoctor.preflight.consistency import compare_ranks
from ddpdoctor.preflight.facts import Facts, candidate_interfaces, collect_facts

SCHEMA = "ddpdoctor.check/v1"

PORT_IN_USE = Check(
    "CHK301",
    "MASTER_PORT is already in use",
    "error",
    "collective",
    "Rank 0's node hosts the rendezvous store on MASTER_ADDR:MASTER_PORT. When another process "
    "(often a previous job that did not exit) holds the port, torchrun fails with "
    "'The server socket has failed to listen on any local network address ... EADDRINUSE'.",
    (
        "Pick a free port (--master-port / MASTER_PORT), or use --standalone / rdzv port 0",
        "Or stop the process that holds it (see evidence: pid)",
    ),
)
TEST_FAILED = Check(
    "CHK302",
    "collective test failed",
    "error",
    "collective",
    "A short job (init, barrier, all_reduce, all_gather) failed on this node. The bisection "
    "below reruns it with one transport switched off at a time to find where the fault is.",
    (),
)
TEST_HUNG = Check(
    "CHK303",
    "collective test hung",
    "error",
    "collective",
    "The short job did not finish within its time limit. The stage each rank reached tells "
    "where: stuck in init means rendezvous/bootstrap (addresses, interfaces, firewall); stuck "
    "in a collective means a transport that connects but does not move data.",
    (),
)
WRONG_RESULT = Check(
    "CHK304",
    "collective returned wrong data",
    "error",
    "collective",
    "all_reduce or all_gather completed but produced wrong values: a broken transport (P2P "
    "through a faulty PCIe switch or NVLink) or faulty GPU memory.",
    (
        "Run the bisection variations by hand (NCCL_P2P_DISABLE=1 first) and check the GPUs' "
        "ECC counters (`nvidia-smi -q -d ECC`)",
    ),
)
COLLECTIVE_CHECKS = (PORT_IN_USE, TEST_FAILED, TEST_HUNG, WRONG_RESULT)


@dataclass
class CheckConfig:
    nproc_per_node: int | None = None
    backend: str = "auto"
    attempt_timeout_s: float = 60.0
    total_timeout_s: float = 300.0
    pg_timeout_s: float | None = None
    sizes: str = "1024,16384,262144,1048576"
    iters: int = 5
    bisect: bool = True
    bisect_all: bool = False
    master_addr: str | None = None
    master_port: int | None = None
    workdir: str = "."
    options: CheckOptions = field(default_factory=CheckOptions)


def run_check(
    cfg: CheckConfig,
    *,
    launch: Callable[[LaunchConfig, dict[str, str]], Attempt] = run_attempt,
    local_facts: Facts | None = None,
) -> dict[str, Any]:
    """The whole check; bounded by cfg.total_timeout_s (the facts take about 2 s)."""
    started = time.monotonic()
    deadline = started + cfg.total_timeout_s
    facts = local_facts if local_facts is not None else collect_facts(workdir=cfg.workdir)
    collective: dict[str, Any] | None = None
    bisection: Bisection | None = None
    rank_facts: list[Facts] = []
    issues: list[Issue] = []
    if cfg.nproc_per_node:
        collective, bisection, rank_facts, issues = _collective(cfg, facts, launch, deadline)
    node_facts = rank_facts or [facts]
    issues = run_node_checks(node_facts, _with_nproc(cfg)) + issues
    issues += compare_ranks(rank_facts, cfg.options)
    return build_result(
        facts, rank_facts, issues, collective, bisection, time.monotonic() - started
    )


def _with_nproc(cfg: CheckConfig) -> CheckOptions:
    if cfg.nproc_per_node and cfg.options.nproc_per_node is None:
        return replace(cfg.options, nproc_per_node=cfg.nproc_per_node)
    return cfg.options


def expected_backend(cfg: CheckConfig, facts: Facts) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    gpu = dig(facts, "torch.cuda_available") and dig(facts, "torch.nccl_available")
    return "nccl" if gpu else "gloo"


def _collective(
    cfg: CheckConfig,
    facts: Facts,
    launch: Callable[[LaunchConfig, dict[str, str]], Attempt],
    deadline: float,
) -> tuple[dict[str, Any], Bisection | None, list[Facts], list[Issue]]:
    nproc = int(cfg.nproc_per_node or 1)
    backend = expected_backend(cfg, facts)
    base = LaunchConfig(
        nproc_per_node=nproc,
        backend=cfg.backend,
        attempt_timeout_s=min(cfg.attempt_timeout_s, max(1.0, deadline - time.monotonic())),
        pg_timeout_s=cfg.pg_timeout_s or max(5.0, cfg.attempt_timeout_s / 2),
        sizes=cfg.sizes,
        iters=cfg.iters,
        master_addr=cfg.master_addr,
        master_port=cfg.master_port,
    )
    collective: dict[str, Any] = {
        "backend": backend,
        "nproc_per_node": nproc,
        "world_size": nproc,
        "status": "not-run",
        "duration_s": 0.0,
        "stages": [],
        "correctness": None,
        "bandwidth": [],
        "error": None,
        "rank_stages": {},
        "output_tail": [],
    }
    if cfg.master_port is not None and port_in_use(cfg.master_port, cfg.master_addr or ""):
        owner = port_owner(cfg.master_port)
        who = f" by pid {owner['pid']} ({owner['name']})" if owner and owner.get("pid") else ""
        addr = cfg.master_addr or "127.0.0.1"
        collective["error"] = f"port {cfg.master_port} is already in use{who}"
        issue = PORT_IN_USE.issue(
            f"MASTER_PORT {cfg.master_port} on {addr} is already in use{who}: torchrun's "
            "rendezvous store cannot listen there",
            {"port": cfg.master_port, "addr": addr, "owner": owner},
            facts,
        )
        return collective, None, [], [issue]

    baseline = launch(base, {})
    collective.update(
        status=baseline.status,
        duration_s=round(baseline.duration_s, 3),
        error=baseline.error,
        failed_stage=baseline.failed_stage,
        rank_stages={str(k): v for k, v in sorted(baseline.rank_stages.items())},
        output_tail=[] if baseline.ok else baseline.output_tail,
    )
    issues: list[Issue] = []
    rank_facts: list[Facts] = []
    if baseline.result is not None:
        res = baseline.result
        collective.update(
            backend=res.get("backend", backend),
            world_size=res.get("world_size", nproc),
            stages=res.get("stages", []),
            correctness=res.get("correctness"),
            bandwidth=res.get("bandwidth", []),
        )
        rank_facts = [f for f in res.get("ranks", []) if isinstance(f, dict)]
    if baseline.ok:
        return collective, None, rank_facts, issues

    if baseline.error and "EADDRINUSE" in baseline.error:
        # taken between our precheck and torchrun's bind: the same diagnosis
        port = cfg.master_port
        issue = PORT_IN_USE.issue(
            f"MASTER_PORT {port} is already in use: {baseline.error}",
            {"port": port, "addr": cfg.master_addr},
            facts,
        )
        return collective, None, rank_facts, [issue]
    wrong = baseline.error is not None and "wrong data" in baseline.error
    reached_init = any(s not in ("not-started", "starting") for s in baseline.rank_stages.values())
    bisection: Bisection | None = None
    if cfg.bisect and (reached_init or baseline.status == "hung"):

        def relaunch(env: dict[str, str], timeout_s: float) -> Attempt:
            return launch(replace(base, attempt_timeout_s=timeout_s), env)

        bisection = bisect(
            relaunch,
            backend,
            candidate_interfaces(facts, single_node=True),
            deadline,
            attempt_timeout_s=cfg.attempt_timeout_s,
            stop_at_first=not cfg.bisect_all,
        )
    elif cfg.bisect:
        bisection = Bisection(
            conclusion="The test failed before any rank reached init_process_group: not a "
            "transport problem. See the output below (environment, imports, launcher)."
        )
    check = WRONG_RESULT if wrong else TEST_HUNG if baseline.status == "hung" else TEST_FAILED
    stage = f" in {baseline.failed_stage}" if baseline.failed_stage else ""
    fix: list[str] = []
    if bisection is not None and bisection.fix is not None:
        fix = [f"Works with {bisection.fix.label}: {bisection.fix.meaning}", *bisection.fix.fix]
    elif bisection is not None:
        fix = [bisection.conclusion]
    issue = check.issue(
        f"{baseline.status}{stage} after {baseline.duration_s:.1f} s: {baseline.error}",
        {
            "rank_stages": collective["rank_stages"],
            "exit_code": baseline.exit_code,
            "backend": backend,
        },
        facts,
    )
    issue.fix = fix or list(check.fix)
    issues.append(issue)
    return collective, bisection, rank_facts, issues


def build_result(
    facts: Facts,
    rank_facts: list[Facts],
    issues: list[Issue],
    collective: dict[str, Any] | None,
    bisection: Bisection | None,
    duration_s: float,
) -> dict[str, Any]:
    errors = sum(1 for i in issues if i.severity == "error")
    warnings = sum(1 for i in issues if i.severity == "warning")
    status = "failed" if errors else "warnings" if warnings else "ok"
    return {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": __version__},
        "status": status,
        "summary": {"errors": errors, "warnings": warnings},
        "time": datetime.now(UTC).isoformat(),
        "duration_s": round(duration_s, 3),
        "facts": facts,
        "ranks": rank_facts,
        "issues": [i.to_json() for i in issues],
        "collective": collective,
        "bisection": None if bisection is None else bisection.to_json(),
    }


def result_from_facts(facts_list: list[Facts], options: CheckOptions) -> dict[str, Any]:
    """Checks over saved fact sets (one per rank or node), e.g. from other machines."""
    issues = run_node_checks(facts_list, options) + compare_ranks(facts_list, options)
    local = facts_list[0] if facts_list else {}
    ranks = facts_list if len(facts_list) > 1 else []
    return build_result(local, ranks, issues, None, None, 0.0)


def result_from_worker(worker: dict[str, Any], options: CheckOptions) -> dict[str, Any]:
    """A result written by rank 0 of a multi-node run of `ddpdoctor.preflight.worker`."""
    ranks = [f for f in worker.get("ranks", []) if isinstance(f, dict)]
    issues = run_node_checks(ranks, options) + compare_ranks(ranks, options)
    correctness = worker.get("correctness") or {}
    if correctness and not all(correctness.values()):
        issues.append(WRONG_RESULT.issue(f"correctness: {correctness}", correctness))
    collective = {
        "backend": worker.get("backend"),
        "nproc_per_node": None,
        "world_size": worker.get("world_size"),
        "status": "ok",
        "duration_s": round(sum(s.get("duration_s") or 0 for s in worker.get("stages", [])), 3),
        "stages": worker.get("stages", []),
        "correctness": correctness,
        "bandwidth": worker.get("bandwidth", []),
        "error": None,
        "rank_stages": {},
        "output_tail": [],
    }
    return build_result(ranks[0] if ranks else {}, ranks, issues, collective, None, 0.0)
