"""Terminal rendering of a `ddpdoctor.check/v1` result with rich, fitting 100 columns. Reads
only the result dict (the JSON contract), so a saved result renders the same as a live one."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ddpdoctor.preflight.checks import dig, human_bytes

WIDTH = 100
_SEV_STYLE = {"error": "bold red", "warning": "yellow"}
_STATUS_STYLE = {"ok": "bold green", "warnings": "bold yellow", "failed": "bold red"}


def render(result: dict[str, Any], console: Console) -> None:
    for part in renderables(result):
        console.print(part)


def renderables(result: dict[str, Any]) -> list[RenderableType]:
    out: list[RenderableType] = [_header(result), _facts_table(result.get("facts") or {})]
    if result.get("ranks"):
        out.append(_ranks_table(result["ranks"]))
    out.append(_issues(result.get("issues") or []))
    if result.get("collective"):
        out.append(_collective(result["collective"]))
    if result.get("bisection"):
        out.append(_bisection(result["bisection"]))
    return out


def _header(result: dict[str, Any]) -> Text:
    status = str(result.get("status", "unknown"))
    s = result.get("summary") or {}
    text = Text("ddpdoctor check: ", style="bold")
    text.append(status.upper(), style=_STATUS_STYLE.get(status, "bold"))
    text.append(f"  {s.get('errors', 0)} error(s), {s.get('warnings', 0)} warning(s)")
    host = dig(result, "facts.host")
    if host:
        text.append(f"  host {host}")
    return text


def _na(v: Any) -> str:
    return "n/a" if v is None or v == "" else str(v)


def _fact_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    t = f.get("torch") or {}
    nvml = f.get("nvml") or {}
    gpus = nvml.get("gpus") or []
    gpu_text = "n/a"
    if gpus:
        names = sorted({g.get("name", "?") for g in gpus})
        gpu_text = f"{len(gpus)} x {', '.join(names)}"
    cpu = f.get("cpu") or {}
    ul = f.get("ulimits") or {}
    nets = [f"{i['name']}{'' if i['up'] else '(down)'}" for i in dig(f, "net.interfaces") or []]
    ib = [d["name"] for d in dig(f, "ib.devices") or []]
    env = f.get("env") or {}
    dist_env = [f"{k}={v}" for k, v in env.items() if k.startswith(("NCCL_", "GLOO_"))]

    def size(path: str) -> str:
        v = dig(f, path)
        return "n/a" if v is None else human_bytes(v)

    def limit(v: Any) -> str:
        return _na(v) if not isinstance(v, int) else human_bytes(v)

    return [
        ("os", f"{_na(dig(f, 'os.distro'))}, kernel {_na(dig(f, 'os.kernel'))}"),
        ("python", _na(dig(f, "python.version"))),
        (
            "torch",
            f"{_na(t.get('version'))}  CUDA {_na(t.get('cuda'))}  cuDNN {_na(t.get('cudnn'))}"
            f"  NCCL {_na(t.get('nccl'))}",
        ),
        ("driver", f"{_na(nvml.get('driver'))} (CUDA {_na(nvml.get('cuda_driver'))})"),
        ("gpus", gpu_text),
        (
            "visibility",
            f"CUDA_VISIBLE_DEVICES={_na(dig(f, 'visibility.CUDA_VISIBLE_DEVICES'))} "
            f"CUDA_DEVICE_ORDER={_na(dig(f, 'visibility.CUDA_DEVICE_ORDER'))}",
        ),
        ("/dev/shm", f"{size('shm.total_bytes')} ({size('shm.free_bytes')} free)"),
        (
            "ulimits",
            f"memlock {limit(ul.get('memlock_soft'))}  nofile {_na(ul.get('nofile_soft'))}",
        ),
        (
            "cpu",
            f"{_na(cpu.get('physical_cpus'))} socket(s), {_na(cpu.get('cores'))} cores, "
            f"{_na(cpu.get('logical_cpus'))} logical",
        ),
        ("memory", f"{size('memory.total_bytes')} ({size('memory.available_bytes')} available)"),
        ("disk", f"{size('disk.free_bytes')} free at {_na(dig(f, 'disk.path'))}"),
        ("interfaces", ", ".join(nets) or "n/a"),
        ("ib", ", ".join(ib) or "n/a"),
        ("nccl/gloo env", " ".join(dist_env) or "none"),
        ("nvidia topo", "see JSON" if f.get("nvidia_topo") else "n/a"),
    ]


def _facts_table(f: dict[str, Any]) -> Table:
    table = Table(title="Facts", title_justify="left", show_header=False)
    table.add_column("fact", style="bold", width=14, no_wrap=True)
    table.add_column("value", overflow="fold")
    for k, v in _fact_rows(f):
        table.add_row(k, Text(v))  # a value is the machine's words, not markup
    return table


def _ranks_table(ranks: list[dict[str, Any]]) -> Table:
    table = Table(title="Ranks", title_justify="left")
    for col in ("rank", "host", "torch", "NCCL", "device"):
        table.add_column(col, overflow="fold")
    for i, f in enumerate(ranks):
        dev = f.get("device") or {}
        table.add_row(
            *map(
                Text,
                (
                    _na(dig(f, "rank.rank") if dig(f, "rank.rank") is not None else i),
                    _na(f.get("host")),
                    _na(dig(f, "torch.version")),
                    _na(dig(f, "torch.nccl")),
                    _na(dev.get("uuid") or dev.get("local_index")) if dev else "cpu",
                ),
            )
        )
    return table


def _issues(issues: list[dict[str, Any]]) -> RenderableType:
    if not issues:
        return Text("Checks: all passed", style="green")
    parts: list[RenderableType] = [Text("Issues", style="bold")]
    for i in issues:
        line = Text()
        line.append(f"{i['severity'].upper():7} ", style=_SEV_STYLE.get(i["severity"], ""))
        line.append(f"{i['code']} {i['title']}", style="bold")
        parts.append(line)
        parts.append(Text(f"  {i['message']}"))
        for step in i.get("fix") or []:
            parts.append(Text(f"  fix: {step}", style="cyan"))
    return Group(*parts)


def _collective(c: dict[str, Any]) -> RenderableType:
    head = Text("Collective test: ", style="bold")
    status = str(c.get("status"))
    head.append(status, style="green" if status == "ok" else "red")
    head.append(
        f"  backend {_na(c.get('backend'))}, {_na(c.get('world_size'))} rank(s), "
        f"{c.get('duration_s', 0):.1f} s"
    )
    parts: list[RenderableType] = [head]
    if c.get("error"):
        parts.append(Text(f"  error: {c['error']}", style="red"))
    if c.get("rank_stages") and status != "ok":
        stages = ", ".join(f"rank {k}: {v}" for k, v in c["rank_stages"].items())
        parts.append(Text(f"  reached: {stages}"))
    if c.get("stages"):
        parts.append(
            Text(
                "  stages: "
                + ", ".join(
                    f"{s['name']} {s['status']} {1000 * (s.get('duration_s') or 0):.0f} ms"
                    for s in c["stages"]
                )
            )
        )
    if c.get("bandwidth"):
        table = Table()
        for col in ("op", "size", "time", "algbw GB/s", "busbw GB/s"):
            table.add_column(col, justify="right" if col != "op" else "left")
        for row in c["bandwidth"]:
            table.add_row(
                row["op"],
                human_bytes(row["bytes"]),
                f"{1e6 * row['time_s']:.0f} us",
                f"{row['algbw_gbps']:.3f}",
                f"{row['busbw_gbps']:.3f}",
            )
        parts.append(table)
    if c.get("output_tail") and status != "ok":
        parts.append(Text("  last output lines:", style="dim"))
        parts.extend(Text(f"    {line}", style="dim") for line in c["output_tail"][-8:])
    return Group(*parts)


def _bisection(b: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = [Text("Transport bisection", style="bold")]
    if b.get("attempts"):
        table = Table()
        table.add_column("environment change", overflow="fold")
        table.add_column("result", no_wrap=True)
        table.add_column("time", justify="right", no_wrap=True)
        table.add_column("error", overflow="fold")
        for a in b["attempts"]:
            env = " ".join(f"{k}={v}" for k, v in a["env"].items())
            table.add_row(
                Text(env),
                Text(a["status"], style="green" if a["status"] == "ok" else "red"),
                f"{a['duration_s']:.1f} s",
                # the error is gloo's or NCCL's words ('[/__w/.../pair.cc:553] ...'), not markup
                Text(_na(a.get("error"))[:200] if a["status"] != "ok" else ""),
            )
        parts.append(table)
    for s in b.get("skipped") or []:
        parts.append(Text(f"  skipped {s['env']}: {s['reason']}", style="dim"))
    parts.append(Text(f"  {b.get('conclusion', '')}", style="bold"))
    return Group(*parts)
