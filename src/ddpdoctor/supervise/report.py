"""The end of a supervised run: call the post-mortem diagnosis on the run folder, add what only
the supervisor knows (exact exit codes, hangs and their stacks, output delivery), write
report.json/.txt.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ddpdoctor.analysis.facts import signal_name
from ddpdoctor.redaction import clean_value
from ddpdoctor.supervise.rundir import RunDir

if TYPE_CHECKING:
    from ddpdoctor.supervise.watchdog import Hang

SCHEMA = "ddpdoctor.report/v1"


def _diagnose(rundir: RunDir) -> tuple[dict[str, Any] | None, str, str | None]:
    """(report dict, rendered text, error) from the lead's post-mortem API when it exists."""
    try:
        from ddpdoctor.analysis.diagnose import diagnose_paths
        from ddpdoctor.report.render import render
        from ddpdoctor.report.to_json import report_to_dict
        from ddpdoctor.report.view import shown
    except ImportError as exc:
        return None, "", f"diagnosis unavailable: {exc}"
    try:
        report = shown(diagnose_paths([str(rundir.root)]), rundir.redact)
        return report_to_dict(report), render(report, "text", redact=rundir.redact), None
    except Exception as exc:
        return None, "", f"diagnosis failed: {type(exc).__name__}: {exc}"


def _fallback(code: int, hung: bool) -> dict[str, Any]:
    status = "hung" if hung else ("ok" if code == 0 else "failed")
    return {
        "schema": SCHEMA,
        "tool": {"name": "ddpdoctor", "version": _version()},
        "verdict": {
            "status": status,
            "kind": "hang" if hung else None,
            "category": None,
            "rule": None,
            "title": "",
            "confidence": 0.0,
            "culprit": {"ranks": [], "hosts": []},
            "summary": "",
            "fix": [],
            "evidence": [],
        },
        "findings": [],
        "job": {
            "world_size": None,
            "ranks_seen": [],
            "ranks_missing": [],
            "hosts": [],
            "exit": {"code": None, "signal": None, "per_rank": {}},
        },
        "sources": [],
    }


def _rank_exit(rank: str, entry: dict[str, Any]) -> str:
    signal = f" ({entry['signal']})" if entry.get("signal") else ""
    return f"{rank}: {entry.get('code')}{signal}"


def _version() -> str:
    try:
        from ddpdoctor import __version__

        return str(__version__)
    except ImportError:
        return "unknown"


def finish_report(
    rundir: RunDir,
    code: int,
    per_rank: dict[int, int],
    hangs: list[Hang],
    killed_for_hang: bool,
    output: dict[str, Any],
    progress: dict[str, Any],
    left_running: list[str] | None = None,
    grace_s: float = 5.0,
) -> tuple[dict[str, Any], str]:
    report, text, error = _diagnose(rundir)
    if report is None:
        report = _fallback(code, killed_for_hang)
    job = report.setdefault("job", {})
    exit_ = job.setdefault("exit", {})
    exit_["code"] = 128 - code if code < 0 else code
    exit_["signal"] = signal_name(code)
    # the diagnosis read the observed exits from events.jsonl already; this keeps them (and
    # the entries' shape) when the diagnosis could not run
    merged: dict[str, dict[str, Any]] = {
        str(k): dict(v) for k, v in (exit_.get("per_rank") or {}).items()
    }
    for rank, observed in per_rank.items():
        entry = merged.setdefault(str(rank), {"host": None, "local_rank": None, "pid": None})
        entry.update(code=observed, signal=signal_name(observed))
    exit_["per_rank"] = merged
    # Hangs, their stacks and the exact exit codes are in events.jsonl, which the diagnosis
    # reads: its verdict already covers them, and report.txt and report.json agree.
    report["supervisor"] = {
        "run_dir": str(rundir.root),
        "hangs": [
            {
                "detected_at": h.detected_at,
                "idle_s": round(h.idle_s, 3),
                "stalled": h.stalled,
                "collect_s": round(h.collect_s, 3),
                **h.diagnosis.as_dict(),
            }
            for h in hangs
        ],
        "killed_for_hang": killed_for_hang,
        "left_running": left_running or [],
        "output": output,
        "progress": progress,
        "diagnosis_error": error,
    }
    lines = [text.rstrip()] if text else []
    lines.append("")
    lines.append(
        f"ddpdoctor run: exit code {exit_['code']}"
        + (f" ({exit_['signal']})" if exit_["signal"] else "")
        + (", per rank " + ", ".join(_rank_exit(k, e) for k, e in merged.items()) if merged else "")
    )
    for h in hangs:
        lines.append(h.text)
    if killed_for_hang:
        lines.append("the job was ended by ddpdoctor (--on-hang kill)")
    if left_running:
        lines.append(_left_running_text(left_running, grace_s, output.get("drained", True)))
    for term in (output.get("terminal") or {}).values():
        if term.get("error"):
            lines.append(f"{term['error']}: {term['unsent']} bytes are in console.log only")
    if error:
        lines.append(error)
    lines.append(f"run folder: {rundir.root}")
    # the supervisor's own parts (hang stacks, errors, paths) are cleaned like the diagnosis
    report = clean_value(report, rundir.redact)
    full = rundir.scrub("\n".join(lines).lstrip("\n") + "\n")
    try:
        rundir.report_json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        rundir.report_txt.write_text(full, encoding="utf-8")
    except OSError:
        pass
    return report, full


def _left_running_text(left: list[str], grace_s: float, drained: bool) -> str:
    """Processes the job started that outlived it are ended with the run (no stray process
    keeps a GPU or a port): say which, and that their later output is lost where they still
    held the job's output open."""
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    one = len(left) == 1
    return (
        f"ddpdoctor run: {len(left)} process{'' if one else 'es'} of the job still ran after it "
        f"ended ({shown}); {'it is' if one else 'they are'} ended with the run (SIGTERM, "
        f"SIGKILL after {grace_s:g} s)"
        + (
            "; "
            + ("it" if one else "they")
            + " still held the job's output open, so what "
            + ("it" if one else "they")
            + " would print later is not captured"
            if not drained
            else ""
        )
    )
