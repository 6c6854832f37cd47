"""Facts of `ddpdoctor check`: interface-name syntax of NCCL and gloo, sysfs IB parsing, and
that collecting facts here never fails and needs no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.preflight.facts import (
    candidate_interfaces,
    collect_facts,
    gloo_ifname_matches,
    ib_facts,
    nccl_ifname_matches,
    socket_ifname_facts,
)

NAMES = ["eth0", "eth1", "ib0", "lo", "docker0", "enp65s0f0"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("eth", ["eth0", "eth1"]),  # prefix match by default
        ("eth0", ["eth0"]),
        ("=eth", []),  # exact: no interface is called "eth"
        ("=eth1", ["eth1"]),
        ("^docker,lo", ["eth0", "eth1", "ib0", "enp65s0f0"]),  # exclusion of prefixes
        ("^=eth0", ["eth1", "ib0", "lo", "docker0", "enp65s0f0"]),  # exact exclusion
        ("ib,enp", ["ib0", "enp65s0f0"]),
        ("ens5", []),
    ],
)
def test_nccl_ifname_syntax(spec: str, expected: list[str]) -> None:
    assert nccl_ifname_matches(spec, NAMES) == expected


def test_gloo_ifname_is_exact_names_only() -> None:
    assert gloo_ifname_matches("eth", NAMES) == []
    assert gloo_ifname_matches("eth1,lo", NAMES) == ["eth1", "lo"]


def _net(*ifaces: tuple[str, bool, list[str]]) -> dict[str, object]:
    return {
        "interfaces": [
            {"name": n, "up": up, "loopback": n == "lo", "addresses": a, "mtu": 1500}
            for n, up, a in ifaces
        ]
    }


def test_socket_ifname_facts_reports_missing_and_unusable() -> None:
    net = _net(("eth0", True, ["10.0.0.1"]), ("eth1", False, []), ("lo", True, ["127.0.0.1"]))
    env = {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0,nope0"}
    out = socket_ifname_facts(env, net)
    assert out["NCCL_SOCKET_IFNAME"]["matches"] == ["eth0", "eth1"]
    assert out["NCCL_SOCKET_IFNAME"]["usable"] == ["eth0"]
    assert out["GLOO_SOCKET_IFNAME"]["missing"] == ["nope0"]
    assert socket_ifname_facts({}, net) == {}


def test_candidate_interfaces_put_lo_first_on_one_node_only() -> None:
    facts = {
        "net": _net(
            ("eth0", True, ["10.0.0.1"]),
            ("eth1", False, ["10.0.1.1"]),
            ("docker0", True, []),
            ("lo", True, ["127.0.0.1"]),
        )
    }
    assert candidate_interfaces(facts, single_node=True) == ["lo", "eth0"]
    assert candidate_interfaces(facts, single_node=False) == ["eth0"]


def test_ib_facts_from_sysfs_tree(tmp_path: Path) -> None:
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    out = ib_facts(tmp_path)
    assert out == {
        "devices": [
            {
                "name": "mlx5_0",
                "ports": [
                    {
                        "port": "1",
                        "state": "4: ACTIVE",
                        "rate": "200 Gb/sec (4X HDR)",
                        "link_layer": "InfiniBand",
                    }
                ],
            }
        ]
    }
    assert ib_facts(tmp_path / "absent") is None


def test_collect_facts_here_is_json_and_not_applicable_is_none(tmp_path: Path) -> None:
    facts = collect_facts(with_torch=False, workdir=tmp_path, env={"GLOO_SOCKET_IFNAME": "x9"})
    json.dumps(facts)
    assert facts["torch"] is None
    assert facts["disk"]["path"] == str(tmp_path)
    assert facts["cpu"]["logical_cpus"] >= 1
    assert facts["ulimits"]["nofile_soft"] == "unlimited" or facts["ulimits"]["nofile_soft"] > 0
    assert any(i["name"] == "lo" for i in facts["net"]["interfaces"])
    assert facts["socket_ifname"]["GLOO_SOCKET_IFNAME"]["matches"] == []
    assert facts["env"] == {"GLOO_SOCKET_IFNAME": "x9"}
    # no GPU stack on this machine: not applicable, not an error
    if facts["nvml"] is None:
        assert facts["nvidia_topo"] is None or isinstance(facts["nvidia_topo"], str)


def test_facts_without_torch_do_not_import_torch() -> None:
    code = (
        "import sys; from ddpdoctor.preflight.facts import collect_facts; "
        "from ddpdoctor.preflight import checks, consistency, bisect, session, render; "
        "collect_facts(with_torch=False); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
