"""Scanning benchmark (not a test): `ddpdoctor diagnose --format json` against `rg -c -f` with the
same signatures (`ddpdoctor rules --export-patterns`), on the same generated data, in one run,
interleaved (so that a busy neighbour on a shared machine hurts both alike), best of --repeat.

Tables printed:
- density: one log per candidate density (generate.py `dense`: 0.1% to 20% of lines handed to
  Python, as big jobs print them) plus the sparse log kept from before (`single`);
- ranks: 10,000 rank files at 20% (one writer each), and 1,000 sparse files of 1 MB;
- stdin: the 20% log piped in (`cat | ddpdoctor diagnose -`, `cat | rg`);
- gz: a sparse .gz;
- scale: ms per MB of the 20% log at 64 MiB, 256 MiB, 1 GiB (and 10 GiB with --big).

Columns: candidate share (lines a non-sampled pattern's prefilter hands to Python, counted with
ddpdoctor's own engine), the share of lines rg prints as matching (tqdm bars included), MB/s of
each tool (uncompressed text over whole-command wall time), the ratio rg time / ddpdoctor time
(above 1: faster than rg), ddpdoctor's CPU seconds (all processes), its peak RSS (the largest
process, as GNU time reports it; `tree` is the peak of the PSS summed over all its processes,
sampled every 20 ms: what they hold together, pages forked workers share counted once) and the
verdict. Without rg
the ratio is skipped and said so. Data lives under bench-data/ (reused when its parameters
match; --clean deletes it after).

Usage: python benchmarks/run.py [--tables density,ranks,stdin,gz,scale] [--gib 1] [--repeat 3]
       [--densities 0.001,0.01,0.05,0.1,0.2] [--files 10000] [--big] [--clean]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from generate import DENSITIES, generate  # noqa: E402

DATA = ROOT / "bench-data"
TIME = "/usr/bin/time"
MIB = 1024 * 1024


@dataclass
class Run:
    wall_s: float
    cpu_s: float | None
    rss_mib: float | None
    tree_mib: float | None
    stdout: str


def ddpdoctor_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("ddpdoctor")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ddpdoctor"]


def _tree_rss(proc: psutil.Process, peak: list[float], done: threading.Event) -> None:
    """The largest sum of PSS over the process and its descendants, sampled: the memory they
    hold together, pages that forked workers share with the parent counted once."""
    while not done.wait(0.02):
        try:
            procs = [proc, *proc.children(recursive=True)]
            total = 0
            for p in procs:
                with suppress(psutil.Error):  # exited between listing and reading
                    total += p.memory_full_info().pss
        except psutil.Error:
            continue
        peak[0] = max(peak[0], total / MIB)


def measured(cmd: list[str] | str) -> Run:
    """Wall time, CPU and peak RSS of one command (a list, or a shell line for pipes)."""
    shell = isinstance(cmd, str)
    argv = ["bash", "-c", cmd] if shell else list(cmd)
    use_time = os.access(TIME, os.X_OK)
    full = [TIME, "-f", "@@ %M %U %S", *argv] if use_time else argv
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled bytecode is reused
    peak = [0.0]
    done = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    sampler = threading.Thread(target=_tree_rss, args=(psutil.Process(proc.pid), peak, done))
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    rss = cpu = None
    m = re.search(r"@@ (\d+) ([\d.]+) ([\d.]+)", err)
    if m:
        rss, cpu = int(m.group(1)) / 1024, float(m.group(2)) + float(m.group(3))
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {err[-2000:]}")
    return Run(wall, cpu, rss, peak[0] or None, out)


def patterns_for_rg(out: Path) -> Path:
    """The exported signatures, as `ddpdoctor rules --export-patterns` writes them for rg."""
    exported = out / "patterns.txt"
    subprocess.run(
        [*ddpdoctor_cmd(), "rules", "--export-patterns", str(exported)],
        check=True,
        capture_output=True,
    )
    return exported


def dataset(
    mode: str, gib: float, files: int, seed: int, density: float = 0.0
) -> tuple[list[Path], dict[str, float]]:
    """Generate (or reuse) one data set; its paths and facts (bytes, lines, candidate share)."""
    name = {
        "single": f"single-{gib:g}g",
        "gz": f"gz-{gib:g}g",
        "ranks": f"ranks-{files}-{gib:g}g",
        "dense": f"dense-{density:g}-{gib:g}g",
        "dense-ranks": f"dense-ranks-{density:g}-{files}-{gib:g}g",
    }[mode]
    out = DATA / name
    stamp = DATA / f"{name}.params"
    params = {"mode": mode, "gib": gib, "files": files, "seed": seed, "density": density}
    known = json.loads(stamp.read_text()) if stamp.exists() else {}
    if known.get("params") != params:
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        generate(mode, out, gib, files, seed, density)
        known = {"params": params, "facts": candidate_share(out)}
        stamp.write_text(json.dumps(known))
        print(f"  (generated {out.name} in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    paths = [out / "train.log.gz"] if mode == "gz" else [out / "train.log"]
    if mode in ("ranks", "dense-ranks"):
        paths = [out]
    return paths, known["facts"]


def candidate_share(out: Path) -> dict[str, float]:
    """Lines, bytes and lines a non-sampled pattern's prefilter hands to Python, counted with
    ddpdoctor's own engine (in this process: the benchmark runs in the project's venv)."""
    from ddpdoctor.analysis.engine import HyperscanMatcher, _group_by_line
    from ddpdoctor.analysis.parallel import _scanner
    from ddpdoctor.ingest.sources import ChunkStream, Input, expand_paths

    matcher = _scanner("auto").matcher
    lines = candidates = size = 0
    inputs, _ = expand_paths([str(out)])
    for item in inputs:
        if item.path.endswith(".params"):
            continue
        stream = ChunkStream(Input(item.path, item.display))
        for chunk in stream:
            lines += chunk.count(b"\n")
            if isinstance(matcher, HyperscanMatcher):
                located = matcher._locate(chunk, matcher._ids)
                candidates += len(_group_by_line(chunk, located))
        size += stream.info.bytes
    return {"lines": lines, "bytes": size, "candidates": candidates}


def warm(paths: list[Path]) -> None:
    """Read everything once so that both tools see the page cache, not the disk."""
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            with open(f, "rb") as fh:
                while fh.read(8 << 20):
                    pass


def _rg_count(stdout: str) -> int:
    total = 0
    for line in stdout.splitlines():
        head, _, tail = line.rpartition(":")
        total += int(tail if head else line)
    return total


HEADER = (
    f"{'case':<22} {'MB':>7} {'cand %':>7} {'rg %':>6} {'rg MB/s':>8} {'dd MB/s':>8} "
    f"{'ratio':>6} {'dd CPU s':>8} {'dd RSS':>8} {'tree':>7}  verdict"
)


def bench(
    label: str,
    paths: list[Path],
    facts: dict[str, float],
    patterns: Path | None,
    repeat: int,
    stdin: bool = False,
    gz: bool = False,
) -> tuple[Run, Run | None, float]:
    """One row: both tools, interleaved, best wall time of `repeat`."""
    names = " ".join(shlex.quote(str(p)) for p in paths)
    dd_list = [*ddpdoctor_cmd(), "diagnose", "--format", "json"]
    dd: list[str] | str = f"cat {names} | {shlex.join(dd_list)} -" if stdin else dd_list
    rg: list[str] | str | None = None
    if patterns is not None:
        rg_list = ["rg", "--no-unicode", "-c", "-f", str(patterns), *(["-z"] if gz else [])]
        rg = f"cat {names} | {shlex.join(rg_list)}" if stdin else rg_list
    warm(paths)
    best: dict[str, Run] = {}
    for _ in range(repeat):
        for tool, cmd in (("rg", rg), ("dd", dd)):
            if cmd is None:
                continue
            run = measured(cmd if isinstance(cmd, str) else cmd + [str(p) for p in paths])
            if tool not in best or run.wall_s < best[tool].wall_s:
                best[tool] = run
    report = json.loads(best["dd"].stdout)
    mb = sum(s["bytes"] for s in report["sources"]) / 1e6 if not stdin else facts["bytes"] / 1e6
    lines = max(1.0, facts["lines"])
    cand = 100 * facts["candidates"] / lines
    v = report["verdict"]
    verdict = f"{v['status']} {v['kind']} ({v['rule']}), {len(report['findings'])} findings"
    ddr = best["dd"]
    rgr = best.get("rg")
    rg_share = f"{100 * _rg_count(rgr.stdout) / lines:6.2f}" if rgr else "     -"
    rg_speed = f"{mb / rgr.wall_s:8.0f}" if rgr else "       -"
    ratio = f"{rgr.wall_s / ddr.wall_s:6.2f}" if rgr else "     -"
    cpu = f"{ddr.cpu_s:8.2f}" if ddr.cpu_s is not None else "       ?"
    rss = f"{ddr.rss_mib:5.0f} MiB" if ddr.rss_mib is not None else "       ?"
    tree = f"{ddr.tree_mib:7.0f}" if ddr.tree_mib is not None else "      ?"
    print(
        f"{label:<22} {mb:7.0f} {cand:7.3f} {rg_share} {rg_speed} {mb / ddr.wall_s:8.0f} "
        f"{ratio} {cpu} {rss} {tree}  {verdict}",
        flush=True,
    )
    return ddr, rgr, mb


def main() -> None:
    ap = argparse.ArgumentParser(description="ddpdoctor diagnose vs rg on generated logs")
    ap.add_argument("--tables", default="density,ranks,stdin,gz,scale")
    ap.add_argument("--gib", type=float, default=1.0, help="size of each single log (GiB)")
    ap.add_argument("--densities", default=",".join(f"{d:g}" for d in DENSITIES))
    ap.add_argument("--files", type=int, default=10_000, help="rank files of the dense set")
    ap.add_argument("--files-gib", type=float, default=0.25, help="total size of that set")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--big", action="store_true", help="scale: a 10 GiB log as well")
    ap.add_argument("--clean", action="store_true", help="delete the generated data afterwards")
    args = ap.parse_args()
    tables = args.tables.split(",")
    DATA.mkdir(exist_ok=True)
    patterns: Path | None = patterns_for_rg(DATA)
    if shutil.which("rg") is None:
        print("rg (ripgrep) is not installed: its columns and the ratio are skipped")
        patterns = None
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; best of {args.repeat}")
    made: list[Path] = []
    if "density" in tables:
        print(f"\n== candidate density ({args.gib:g} GiB logs)\n{HEADER}")
        paths, facts = dataset("single", args.gib, 0, args.seed)
        made += paths
        bench("sparse (single)", paths, facts, patterns, args.repeat)
        for d in (float(x) for x in args.densities.split(",")):
            paths, facts = dataset("dense", args.gib, 0, args.seed, d)
            made += paths
            bench(f"dense {100 * d:g}%", paths, facts, patterns, args.repeat)
    if "ranks" in tables:
        print(f"\n== rank files\n{HEADER}")
        paths, facts = dataset("dense-ranks", args.files_gib, args.files, args.seed, 0.2)
        made += paths
        bench(f"{args.files} files 20%", paths, facts, patterns, args.repeat)
        paths, facts = dataset("ranks", 1.0, 1000, args.seed)
        made += paths
        bench("1000 files sparse", paths, facts, patterns, args.repeat)
    if "stdin" in tables:
        print(f"\n== stdin\n{HEADER}")
        paths, facts = dataset("dense", args.gib, 0, args.seed, 0.2)
        made += paths
        bench("stdin 20%", paths, facts, patterns, args.repeat, stdin=True)
    if "gz" in tables:
        print(f"\n== gzip\n{HEADER}")
        paths, facts = dataset("gz", 0.25, 0, args.seed)
        made += paths
        bench("gz sparse", paths, facts, patterns, args.repeat, gz=True)
    if "scale" in tables:
        print(f"\n== size (20% candidates): cost per MB\n{HEADER}")
        sizes = [0.0625, 0.25, 1.0] + ([10.0] if args.big else [])
        for gib in sizes:
            paths, facts = dataset("dense", gib, 0, args.seed, 0.2)
            made += paths
            ddr, _, mb = bench(
                f"{gib * 1024:g} MiB", paths, facts, patterns, args.repeat if gib < 4 else 1
            )
            cpu = f", {1000 * ddr.cpu_s / mb:.2f} ms CPU per MB" if ddr.cpu_s else ""
            print(f"{'':<22} {1000 * ddr.wall_s / mb:.2f} ms wall per MB{cpu}")
    if args.clean:
        for p in made:
            shutil.rmtree(p.parent if p.is_file() else p, ignore_errors=True)


if __name__ == "__main__":
    main()
