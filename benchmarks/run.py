"""Scanning benchmark (not a test): `ddpdoctor diagnose --format json` against `rg -c -f` with the
same signatures (`ddpdoctor rules --export-patterns`), on the same generated data, in one run.
Prints MB/s (of uncompressed text), the ratio (rg time / ddpdoctor time: above 1 means faster
than rg), peak RSS of each and the verdict. Data lives under bench-data/ (reused when its
parameters match).

Usage: python benchmarks/run.py [--gib 1] [--files 1000] [--files-gib 1] [--gz-gib 0.25]
       [--modes single,ranks,gz] [--repeat 2] [--big]  (--big: a 10 GiB single file as well)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from generate import GIB, generate  # noqa: E402

DATA = ROOT / "bench-data"
TIME = "/usr/bin/time"


@dataclass
class Run:
    wall_s: float
    rss_mib: float | None
    stdout: str


def ddpdoctor_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("ddpdoctor")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ddpdoctor"]


def measured(cmd: list[str]) -> Run:
    """Wall time and peak RSS (largest process of the tree, via GNU time) of one command."""
    use_time = os.access(TIME, os.X_OK)
    full = [TIME, "-f", "@@maxrss %M", *cmd] if use_time else cmd
    t0 = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    rss = None
    m = re.search(r"@@maxrss (\d+)", proc.stderr)
    if m:
        rss = int(m.group(1)) / 1024
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return Run(wall, rss, proc.stdout)


def patterns_for_rg(out: Path) -> Path:
    """The exported signatures, as `ddpdoctor rules --export-patterns` writes them for rg."""
    exported = out / "patterns.txt"
    subprocess.run(
        [*ddpdoctor_cmd(), "rules", "--export-patterns", str(exported)],
        check=True,
        capture_output=True,
    )
    return exported


def dataset(mode: str, gib: float, files: int, seed: int) -> tuple[list[Path], int]:
    """Generate (or reuse) one data set; returns the paths and their total size in bytes."""
    name = {"single": f"single-{gib:g}g", "gz": f"gz-{gib:g}g", "ranks": f"ranks-{files}-{gib:g}g"}
    out = DATA / name[mode]
    stamp = out / ".params"
    params = json.dumps({"mode": mode, "gib": gib, "files": files, "seed": seed})
    if not (stamp.exists() and stamp.read_text() == params):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        generate(mode, out, gib, files, seed)
        stamp.write_text(params)
        print(f"generated {out.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    paths = [out / "train.log.gz"] if mode == "gz" else [out / "train.log"]
    if mode == "ranks":
        paths = [out]
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != ".params")
    return paths, size


def warm(paths: list[Path]) -> None:
    """Read everything once so that both tools see the page cache, not the disk."""
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            with open(f, "rb") as fh:
                while fh.read(8 << 20):
                    pass


def bench(mode: str, paths: list[Path], size: int, patterns: Path, repeat: int) -> None:
    rg = ["rg", "--no-unicode", "-c", "-f", str(patterns)] + (["-z"] if mode == "gz" else [])
    dd = [*ddpdoctor_cmd(), "diagnose", "--format", "json"]
    warm(paths)
    best: dict[str, Run] = {}
    for _ in range(repeat):  # interleaved, so that a busy neighbour hurts both alike
        for tool, cmd in (("rg", rg), ("ddpdoctor", dd)):
            run = measured(cmd + [str(p) for p in paths])
            if tool not in best or run.wall_s < best[tool].wall_s:
                best[tool] = run
    report = json.loads(best["ddpdoctor"].stdout)
    mb = sum(s["bytes"] for s in report["sources"]) / 1e6  # uncompressed, as scanned
    for tool, run in best.items():
        rss = f"{run.rss_mib:7.1f} MiB" if run.rss_mib is not None else "      ?"
        print(
            f"{mode:<7} {mb:9.0f} MB  {tool:<10} {run.wall_s:7.2f} s "
            f"{mb / run.wall_s:8.0f} MB/s {rss}"
        )
    ratio = best["rg"].wall_s / best["ddpdoctor"].wall_s
    v = report["verdict"]
    srcs = report["sources"]
    lines = sum(s["lines"] for s in srcs)
    print(
        f"{mode:<7} ratio rg/ddpdoctor = {ratio:.2f}  verdict: {v['status']} {v['kind']} "
        f"({v['rule']}) ranks {v['culprit']['ranks'][:8]}  findings {len(report['findings'])}  "
        f"sources {len(srcs)}  lines {lines}"
    )
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description="ddpdoctor diagnose vs rg on generated logs")
    ap.add_argument("--gib", type=float, default=1.0, help="size of the single file (GiB)")
    ap.add_argument("--files", type=int, default=1000, help="rank files in the ranks set")
    ap.add_argument("--files-gib", type=float, default=1.0, help="total size of the ranks set")
    ap.add_argument("--gz-gib", type=float, default=0.25, help="uncompressed size of the .gz")
    ap.add_argument("--modes", default="single,ranks,gz")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--big", action="store_true", help="also a 10 GiB single file")
    ap.add_argument("--clean", action="store_true", help="delete the generated data afterwards")
    args = ap.parse_args()
    if shutil.which("rg") is None:
        raise SystemExit("rg (ripgrep) is not installed")
    DATA.mkdir(exist_ok=True)
    patterns = patterns_for_rg(DATA)
    print(f"{'mode':<7} {'input':>12}  {'tool':<10} {'wall':>9} {'speed':>13} {'peak RSS':>11}")
    todo: list[tuple[str, float]] = []
    for mode in args.modes.split(","):
        gib = {"single": args.gib, "ranks": args.files_gib, "gz": args.gz_gib}[mode]
        todo.append((mode, gib))
    if args.big:
        todo.append(("single", 10.0))
    made: list[Path] = []
    for mode, gib in todo:
        paths, size = dataset(mode, gib, args.files, args.seed)
        made.extend(paths)
        bench(mode, paths, size, patterns, args.repeat if size < 4 * GIB else 1)
    if args.clean:
        for p in made:
            shutil.rmtree(p.parent if p.is_file() else p, ignore_errors=True)


if __name__ == "__main__":
    main()
