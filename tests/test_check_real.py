"""`ddpdoctor check --nproc-per-node 2` for real: torchrun + gloo on this CPU machine. A healthy
run, a wrong GLOO_SOCKET_IFNAME that the bisection fixes, and a rendezvous port already taken.
About 35 s together on 2 cores; run one at a time (the machine is shared)."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from ddpdoctor.cli.check_cmd import check

pytestmark = [
    pytest.mark.real,
    pytest.mark.timeout(150),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]

DOC = Path(__file__).resolve().parent.parent / "docs" / "check-schema.md"
BOUNDS = ["--attempt-timeout", "60", "--timeout", "120", "--format", "json"]


def run_check(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(check, ["--nproc-per-node", "2", *BOUNDS, *args])
    data = json.loads(r.stdout)  # stderr says what check is doing
    m = re.search(r"```json\n(.*?)```", DOC.read_text().split("## JSON Schema", 1)[1], re.S)
    assert m
    jsonschema.validate(data, json.loads(m.group(1)))
    return r.exit_code, data


def test_healthy_two_rank_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    code, data = run_check("--sizes", "1024,65536")
    c = data["collective"]
    assert c["status"] == "ok", c
    assert code == 0 and data["status"] in ("ok", "warnings")
    assert c["backend"] == "gloo" and c["world_size"] == 2
    assert c["correctness"] == {"all_reduce": True, "all_gather": True}
    assert [s["name"] for s in c["stages"]] == [
        "init",
        "barrier",
        "all_reduce",
        "all_gather",
        "bandwidth",
        "gather_facts",
    ]
    assert {(b["op"], b["bytes"]) for b in c["bandwidth"]} == {
        ("all_reduce", 1024),
        ("all_reduce", 65536),
        ("all_gather", 1024),
        ("all_gather", 65536),
    }
    for b in c["bandwidth"]:
        assert b["algbw_gbps"] == pytest.approx(b["bytes"] / b["time_s"] / 1e9)
        factor = 1.0 if b["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n for n=2
        assert b["busbw_gbps"] == pytest.approx(b["algbw_gbps"] * factor)
    assert [f["rank"]["rank"] for f in data["ranks"]] == [0, 1]
    assert data["bisection"] is None
    assert not [i for i in data["issues"] if i["scope"] != "node"]


def test_wrong_gloo_socket_ifname_is_fixed_by_lo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nope0")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    code, data = run_check("--sizes", "1024")
    assert code == 1 and data["status"] == "failed"
    c = data["collective"]
    assert c["status"] == "failed" and c["failed_stage"] == "init"
    assert "Unable to find address for: nope0" in c["error"]
    issues = {i["code"]: i for i in data["issues"]}
    assert "CHK103" in issues and "GLOO_SOCKET_IFNAME=nope0" in issues["CHK103"]["message"]
    assert issues["CHK302"]["fix"][0].startswith("Works with GLOO_SOCKET_IFNAME=lo")
    b = data["bisection"]
    assert b["fix"]["env"] == {"GLOO_SOCKET_IFNAME": "lo"}
    assert [a["status"] for a in b["attempts"]] == ["ok"]
    assert not any(k.startswith("NCCL_") for a in b["attempts"] for k in a["env"])


def test_master_port_in_use_is_reported_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        code, data = run_check()
    assert code == 1
    (issue,) = [i for i in data["issues"] if i["scope"] == "collective"]
    assert issue["code"] == "CHK301"
    assert f"MASTER_PORT {port}" in issue["message"] and "already in use" in issue["message"]
    assert data["bisection"] is None
