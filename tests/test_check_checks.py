"""Checks of `ddpdoctor check` over fact sets from other machines (GPU nodes, as JSON
fixtures), cross-rank consistency, the bisection logic with a fake launcher, the bandwidth
arithmetic, the CLI contract (exit codes, JSON schema of docs/check-schema.md)."""

from __future__ import annotations

import copy
import json
import re
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from ddpdoctor.cli.check_cmd import check
from ddpdoctor.preflight.bisect import bisect
from ddpdoctor.preflight.checks import NODE_CHECKS, CheckOptions, cudnn_version, run_node_checks
from ddpdoctor.preflight.collective import Attempt, LaunchConfig, busbw_factor
from ddpdoctor.preflight.consistency import CROSS_RANK_CHECKS, compare_ranks, format_ranks
from ddpdoctor.preflight.session import COLLECTIVE_CHECKS, CheckConfig, run_check

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "check"
DOC = ROOT / "docs" / "check-schema.md"


def load(name: str) -> Any:
    return json.loads((FIX / name).read_text())


def schema() -> dict[str, Any]:
    m = re.search(r"## JSON Schema.*?```json\n(.*?)```", DOC.read_text(), re.S)
    assert m, "docs/check-schema.md lost its JSON Schema block"
    return dict(json.loads(m.group(1)))


def codes(issues: list[Any]) -> set[str]:
    return {i.code for i in issues}


# --- node checks on fixtures from GPU machines ---------------------------------------------------


def test_a100_container_shm_memlock_and_device_order() -> None:
    issues = run_node_checks([load("a100_container.json")], CheckOptions())
    assert codes(issues) == {"CHK101", "CHK102", "CHK105"}
    by = {i.code: i for i in issues}
    assert "64 MiB" in by["CHK101"].message
    assert "64 KiB" in by["CHK102"].message and "mlx5_0" in by["CHK102"].message
    assert by["CHK101"].severity == "error" and by["CHK105"].severity == "warning"
    assert by["CHK102"].hosts == ["gpu-a7"]


def test_shm_check_silenced_without_dataloader_workers() -> None:
    issues = run_node_checks([load("a100_container.json")], CheckOptions(num_workers=0))
    assert "CHK101" not in codes(issues)
    issues = run_node_checks([load("a100_container.json")], CheckOptions(num_workers=8))
    assert any("8 DataLoader workers" in i.message for i in issues if i.code == "CHK101")


def test_healthy_h100_near_misses_fire_nothing() -> None:
    # CVD by UUID without CUDA_DEVICE_ORDER, memlock unlimited with IB, `^docker,lo` ifname
    assert run_node_checks([load("h100_healthy.json")], CheckOptions()) == []


def test_old_driver_preloaded_nccl_and_missing_interface() -> None:
    issues = run_node_checks([load("old_driver_node.json")], CheckOptions())
    assert codes(issues) == {"CHK103", "CHK107", "CHK108"}
    by = {i.code: i for i in issues}
    assert "=ens5" in by["CHK103"].message
    assert "major version behind" in by["CHK107"].message
    assert by["CHK108"].evidence["LD_PRELOAD"].endswith("libnccl.so.2")


def test_minor_cuda_newer_than_driver_is_named_as_minor_compat() -> None:
    f = load("h100_healthy.json")
    f["torch"]["cuda"] = "12.8"
    f["nvml"]["cuda_driver"] = "12.2"
    (issue,) = run_node_checks([f], CheckOptions())
    assert issue.code == "CHK107" and "minor-version compatibility" in issue.message


def test_cvd_past_last_gpu_and_too_few_gpus_for_ranks() -> None:
    f = load("h100_healthy.json")
    f["visibility"]["CUDA_VISIBLE_DEVICES"] = "6,7,8"
    f["visibility"]["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    f["torch"]["device_count"] = 2
    issues = run_node_checks([f], CheckOptions(nproc_per_node=4))
    assert codes(issues) == {"CHK106", "CHK111"}


def test_gpus_with_cpu_torch_and_interface_down_and_cudnn_mismatch() -> None:
    f = load("h100_healthy.json")
    f["torch"].update(cuda=None, cuda_available=False, device_count=0, nccl=None)
    f["socket_ifname"] = {
        "GLOO_SOCKET_IFNAME": {"value": "docker0", "matches": ["docker0"], "usable": []}
    }
    f["torch"]["cudnn"] = 8902
    assert cudnn_version(8902) == "8.9.2" and cudnn_version(90100) == "9.1.0"
    assert codes(run_node_checks([f], CheckOptions())) == {"CHK104", "CHK109", "CHK110"}


def test_same_node_issue_on_many_ranks_is_one_issue() -> None:
    ranks = []
    for r in range(4):
        f = copy.deepcopy(load("a100_container.json"))
        f["rank"] = {"rank": r, "local_rank": r}
        ranks.append(f)
    issues = run_node_checks(ranks, CheckOptions())
    assert [i.code for i in issues] == ["CHK101", "CHK102", "CHK105"]
    assert all(i.ranks == [0, 1, 2, 3] for i in issues)


# --- cross-rank ----------------------------------------------------------------------------------


def test_ranks_mismatch_nccl_env_duplicate_gpu_clock() -> None:
    issues = compare_ranks(load("ranks_mismatch.json"), CheckOptions())
    assert codes(issues) == {"CHK202", "CHK204", "CHK206", "CHK207"}
    by = {i.code: i for i in issues}
    assert "2.18.3 on rank 2-3 (node-b)" in by["CHK202"].message
    assert "2.21.5 on rank 0-1 (node-a)" in by["CHK202"].message
    assert by["CHK202"].ranks == [0, 1, 2, 3]  # 2 against 2: no majority, everyone is named
    assert by["CHK204"].message.startswith("NCCL_IB_DISABLE:")
    assert by["CHK206"].ranks == [0, 1] and by["CHK206"].hosts == ["node-a"]
    assert by["CHK207"].hosts == ["node-b"] and "+7.2 s" in by["CHK207"].message


def test_minority_is_the_odd_one_out() -> None:
    ranks = load("ranks_consistent.json")
    ranks[3]["torch"]["version"] = "2.4.0+cu121"
    ranks[3]["python"]["version"] = "3.10.14"
    issues = compare_ranks(ranks, CheckOptions())
    assert codes(issues) == {"CHK201", "CHK208"}
    assert all(i.ranks == [3] and i.hosts == ["node-b"] for i in issues)


def test_driver_and_visible_gpus_compared_per_node() -> None:
    ranks = load("ranks_consistent.json")
    for f in ranks[2:]:
        f["nvml"]["driver"] = "535.161.08"
        f["torch"]["device_count"] = 1
    issues = compare_ranks(ranks, CheckOptions())
    assert codes(issues) == {"CHK203", "CHK205"}
    assert all(i.hosts == ["node-a", "node-b"] for i in issues)  # one node each: a tie


def test_consistent_ranks_fire_nothing() -> None:
    # NCCL_DEBUG_FILE differs per host by design; devices distinct; clocks within 0.15 s
    assert compare_ranks(load("ranks_consistent.json"), CheckOptions()) == []
    assert compare_ranks(load("ranks_consistent.json")[:1], CheckOptions()) == []


def test_format_ranks() -> None:
    assert format_ranks([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"


# --- bandwidth and bisection ---------------------------------------------------------------------


def test_busbw_factors_match_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert busbw_factor("all_reduce", 2) == pytest.approx(1.0)
    assert busbw_factor("all_gather", 1) == 0.0


class FakeLauncher:
    """Succeeds only when the attempt's env contains `works` (a subset of it)."""

    def __init__(self, works: dict[str, str] | None, hang: bool = False) -> None:
        self.works = works
        self.hang = hang
        self.seen: list[dict[str, str]] = []

    def __call__(self, env: dict[str, str], timeout_s: float) -> Attempt:
        self.seen.append(env)
        ok = self.works is not None and self.works.items() <= env.items()
        status = "ok" if ok else "hung" if self.hang else "failed"
        return Attempt(env, status, 1.0, error=None if ok else "boom")


def test_bisect_nccl_p2p_fix_is_found_first_and_stops() -> None:
    fake = FakeLauncher({"NCCL_P2P_DISABLE": "1"})
    b = bisect(fake, "nccl", ["lo", "eth0"], 1e12, attempt_timeout_s=60)
    assert fake.seen == [{"NCCL_P2P_DISABLE": "1"}]
    assert b.fix is not None and "peer-to-peer" in b.fix.meaning
    assert any("nvidia-smi topo -m" in s for s in b.fix.fix)


def test_bisect_nccl_ib_and_ifname_and_combined() -> None:
    fake = FakeLauncher({"NCCL_IB_DISABLE": "1"})
    b = bisect(fake, "nccl", ["eth0"], 1e12, attempt_timeout_s=60)
    assert [list(e) for e in fake.seen] == [
        ["NCCL_P2P_DISABLE"],
        ["NCCL_SHM_DISABLE"],
        ["NCCL_IB_DISABLE"],
    ]
    assert b.fix is not None and "memlock" in " ".join(b.fix.fix)

    fake = FakeLauncher({"NCCL_SOCKET_IFNAME": "=eth0"})
    b = bisect(fake, "nccl", ["eth0"], 1e12, attempt_timeout_s=60)
    assert b.fix is not None and b.fix.env == {"NCCL_SOCKET_IFNAME": "=eth0"}

    fake = FakeLauncher({"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}, hang=True)
    b = bisect(fake, "nccl", ["eth0"], 1e12, attempt_timeout_s=60)
    assert b.fix is not None and set(b.fix.env) == {"NCCL_IB_DISABLE", "NCCL_P2P_DISABLE"}
    assert len(fake.seen) == 5


def test_bisect_gloo_skips_nccl_variations_and_reports_nothing_helps() -> None:
    fake = FakeLauncher(None)
    b = bisect(fake, "gloo", ["lo", "eth0"], 1e12, attempt_timeout_s=60)
    assert fake.seen == [{"GLOO_SOCKET_IFNAME": "lo"}, {"GLOO_SOCKET_IFNAME": "eth0"}]
    assert b.fix is None and "not in the transport" in b.conclusion


def test_bisect_respects_the_deadline() -> None:
    now = [0.0]

    def launch(env: dict[str, str], timeout_s: float) -> Attempt:
        assert timeout_s <= 30
        now[0] += timeout_s
        return Attempt(env, "hung", timeout_s)

    b = bisect(launch, "nccl", ["eth0"], 50.0, attempt_timeout_s=30, clock=lambda: now[0])
    assert len(b.attempts) == 2  # 30 s, then the 20 s left
    assert len(b.skipped) == 3 and b.fix is None
    assert b.conclusion.startswith("Inconclusive") and "--timeout" in b.conclusion


# --- session with a fake launcher ----------------------------------------------------------------


def _facts() -> dict[str, Any]:
    f = load("h100_healthy.json")
    f["torch"]["cuda_available"] = False  # gloo
    return f


def test_session_hang_runs_bisection_and_exit_status() -> None:
    calls: list[dict[str, str]] = []

    def launch(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
        calls.append(env)
        if env.get("GLOO_SOCKET_IFNAME") == "eth0":
            return Attempt(env, "ok", 2.0, exit_code=0)
        return Attempt(
            env,
            "hung",
            cfg.attempt_timeout_s,
            error="stuck",
            failed_stage="init",
            rank_stages={0: "init:running", 1: "init:running"},
        )

    cfg = CheckConfig(nproc_per_node=2, attempt_timeout_s=10, total_timeout_s=100)
    result = run_check(cfg, launch=launch, local_facts=_facts())
    jsonschema.validate(result, schema())
    assert calls == [{}, {"GLOO_SOCKET_IFNAME": "lo"}, {"GLOO_SOCKET_IFNAME": "eth0"}]
    assert result["status"] == "failed"
    (issue,) = [i for i in result["issues"] if i["scope"] == "collective"]
    assert issue["code"] == "CHK303" and "init" in issue["message"]
    assert issue["fix"][0].startswith("Works with GLOO_SOCKET_IFNAME=eth0")
    assert result["bisection"]["fix"]["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}


def test_session_failure_before_init_is_not_bisected() -> None:
    def launch(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
        return Attempt(
            env,
            "failed",
            1.0,
            exit_code=1,
            error="No module named torch",
            rank_stages={0: "not-started", 1: "not-started"},
        )

    result = run_check(CheckConfig(nproc_per_node=2), launch=launch, local_facts=_facts())
    assert result["bisection"]["attempts"] == []
    assert "not a transport problem" in result["bisection"]["conclusion"]


def test_session_port_in_use_never_launches() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]

        def launch(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
            raise AssertionError("must not launch on a taken port")

        cfg = CheckConfig(nproc_per_node=2, master_port=port)
        result = run_check(cfg, launch=launch, local_facts=_facts())
    jsonschema.validate(result, schema())
    (issue,) = [i for i in result["issues"] if i["scope"] == "collective"]
    assert issue["code"] == "CHK301" and f"MASTER_PORT {port}" in issue["message"]
    assert result["collective"]["status"] == "not-run"


def test_session_port_taken_after_precheck_is_still_chk301() -> None:
    def launch(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
        return Attempt(
            env,
            "failed",
            1.0,
            exit_code=1,
            error="torch.distributed.DistNetworkError: The server socket has failed to listen "
            "on any local network address. port: 29500, useIpv6: false, code: -98, "
            "name: EADDRINUSE, message: address already in use",
            rank_stages={0: "not-started", 1: "not-started"},
        )

    result = run_check(CheckConfig(nproc_per_node=2), launch=launch, local_facts=_facts())
    assert [i["code"] for i in result["issues"] if i["scope"] == "collective"] == ["CHK301"]
    assert result["bisection"] is None


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_facts_json_validates_and_exit_codes() -> None:
    runner = CliRunner()
    r = runner.invoke(check, ["--facts", str(FIX / "a100_container.json"), "--format", "json"])
    assert r.exit_code == 1, r.output
    data = json.loads(r.output)
    jsonschema.validate(data, schema())
    assert data["status"] == "failed" and data["summary"] == {"errors": 2, "warnings": 1}

    r = runner.invoke(check, ["--facts", str(FIX / "h100_healthy.json"), "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.output)["status"] == "ok"

    r = runner.invoke(check, ["--facts", str(FIX / "ranks_mismatch.json"), "--format", "json"])
    assert r.exit_code == 1
    data = json.loads(r.output)
    jsonschema.validate(data, schema())
    assert len(data["ranks"]) == 4


def test_cli_warnings_pass_unless_strict(tmp_path: Path) -> None:
    f = load("h100_healthy.json")
    f["ulimits"]["nofile_soft"] = 1024
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(f))
    runner = CliRunner()
    assert runner.invoke(check, ["--facts", str(p)]).exit_code == 0
    assert runner.invoke(check, ["--facts", str(p), "--strict"]).exit_code == 1


def test_cli_text_fits_100_columns(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    r = CliRunner().invoke(
        check, ["--facts", str(FIX / "ranks_mismatch.json"), "--output", str(out)]
    )
    assert r.exit_code == 1
    text = out.read_text()
    assert "CHK202" in text and "NCCL version differs" in text and "FAILED" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize(
    "args",
    [
        ["--nproc-per-node", "0"],
        ["--facts", "/nonexistent/facts.json"],
        ["--facts", "x.json", "--result", "y.json"],
        ["--sizes", "1,a"],
        ["--format", "yaml"],
    ],
)
def test_cli_usage_errors_exit_2(args: list[str]) -> None:
    assert CliRunner().invoke(check, args).exit_code == 2


def test_cli_worker_result(tmp_path: Path) -> None:
    worker = {
        "schema": "ddpdoctor.check-worker/v1",
        "backend": "nccl",
        "world_size": 4,
        "stages": [{"name": "init", "status": "ok", "duration_s": 1.0}],
        "correctness": {"all_reduce": True, "all_gather": True},
        "bandwidth": [
            {
                "op": "all_reduce",
                "bytes": 1 << 20,
                "time_s": 1e-4,
                "algbw_gbps": 10.49,
                "busbw_gbps": 15.73,
            }
        ],
        "ranks": load("ranks_mismatch.json"),
    }
    p = tmp_path / "w.json"
    p.write_text(json.dumps(worker))
    r = CliRunner().invoke(check, ["--result", str(p), "--format", "json"])
    assert r.exit_code == 1
    data = json.loads(r.output)
    jsonschema.validate(data, schema())
    assert {"CHK202", "CHK206"} <= {i["code"] for i in data["issues"]}


def test_every_check_code_is_documented_once() -> None:
    doc = DOC.read_text()
    all_codes = [c.code for c in (*NODE_CHECKS, *CROSS_RANK_CHECKS, *COLLECTIVE_CHECKS)]
    assert len(all_codes) == len(set(all_codes))
    for code in all_codes:
        assert f"| {code} |" in doc, code


def test_a_transport_error_in_brackets_is_shown_as_it_was_printed() -> None:
    """gloo's errors start with the source file in brackets ('[/__w/.../pair.cc:553]', as
    tests/fixtures/real prints them): rich read that as a closing markup tag and the text report
    of `ddpdoctor check` raised MarkupError instead of showing the bisection."""
    from rich.console import Console

    from ddpdoctor.preflight.render import render

    error = (
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:30948"
    )

    def launch(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
        if env.get("GLOO_SOCKET_IFNAME") == "eth0":
            return Attempt(env, "ok", 2.0, exit_code=0)
        return Attempt(env, "hung", cfg.attempt_timeout_s, error=error, failed_stage="init")

    cfg = CheckConfig(nproc_per_node=2, attempt_timeout_s=10, total_timeout_s=100)
    result = run_check(cfg, launch=launch, local_facts=_facts())
    console = Console(width=200, record=True)
    render(result, console)
    shown = console.export_text()
    assert "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]" in shown
